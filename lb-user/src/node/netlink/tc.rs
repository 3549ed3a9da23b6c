//! The bpf classifiers on an interface's clsact hooks, as the kernel lists them.
use anyhow::Result;
use futures_util::TryStreamExt as _;

use super::{Netlink, errno};

/// A bpf classifier on a clsact hook, as the kernel lists it.
#[derive(Clone, Debug)]
pub struct BpfFilter {
    pub priority: u16,
    pub handle: u32,
    /// The name it was attached with (lb's: the program's name).
    pub name: String,
    /// The loaded program it runs.
    pub prog_id: u32,
}

impl Netlink {
    /// The bpf filters on `index`'s clsact egress (or ingress) hook; none without clsact.
    pub fn bpf_filters(&self, index: u32, egress: bool) -> Result<Vec<BpfFilter>> {
        use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};
        let msgs: Vec<_> = self.rt.block_on(async {
            let req = self.handle.traffic_filter(index as i32).get();
            let req = if egress { req.egress() } else { req.ingress() };
            let mut out = Vec::new();
            let mut stream = std::pin::pin!(req.execute());
            loop {
                match stream.try_next().await {
                    Ok(Some(m)) => out.push(m),
                    Ok(None) => return Ok(out),
                    // No clsact qdisc: no filters.
                    Err(e) if errno(&e) == Some(libc::EINVAL) => return Ok(out),
                    Err(e) => return Err(anyhow::Error::new(e).context("listing tc filters")),
                }
            }
        })?;
        let mut out = Vec::new();
        for m in msgs {
            let (mut name, mut prog_id) = (None, None);
            for attr in &m.attributes {
                let TcAttribute::Options(opts) = attr else {
                    continue;
                };
                for o in opts {
                    match o {
                        TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => name = Some(n.clone()),
                        TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => prog_id = Some(*id),
                        _ => {}
                    }
                }
            }
            // A filter chain's head (handle 0) carries no program.
            if let (Some(name), Some(prog_id)) = (name, prog_id) {
                out.push(BpfFilter {
                    priority: (m.header.info >> 16) as u16,
                    handle: u32::from(m.header.handle),
                    name,
                    prog_id,
                });
            }
        }
        Ok(out)
    }
}
