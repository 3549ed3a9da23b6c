//! The vetted fast path's TCP flows in the node's conntrack: a worker per network answers TC
//! egress's requests (`lb_ct_requests`, `lb_common::CtRequestOf`) by making the conntrack
//! entry of each such flow liberal — window tracking off for it, as the kernel's flowtable
//! does for the connections it offloads — and then recording the flow in `lb_liberal` (or
//! `lb_liberal6`), after which the programs judge its directions and let it bypass the stack.
//! Without it conntrack would see one packet of a fast direction every 2 s, far past the
//! windows it tracked, call it invalid, and a node that drops invalid packets (kube-proxy's
//! `KUBE-FORWARD`) would drop it.
//!
//! Contracts:
//! - A flow is recorded only after its entry is liberal, or when the namespace's conntrack
//!   has no entry for it (no conntrack there: nothing tracks windows). Any other answer
//!   leaves it out, so its packets keep taking the stack (logged once per kind of error).
//! - The worker only adds to `lb_liberal`; the programs only read it. An LRU: a flow evicted
//!   asks again, and making an entry liberal twice is harmless.
//! - The daemon runs one worker per network it applied, in the network's namespace (whose
//!   conntrack the entry is in), and ends it with the network. `lb load` runs none: there,
//!   TCP flows of a vetted network keep taking the stack.
use std::{
    collections::BTreeSet,
    net::IpAddr,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{HashMap, Map, MapData, RingBuf};
use lb_common::{Addr6, CtRequest, CtRequest6, CtRequestOf, FlowKeyOf};
use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::MapIp;
use crate::node::{join_netns, netns_path};

/// How often a worker looks at its stop flag while no request comes.
const POLL: Duration = Duration::from_millis(200);

/// ctnetlink (`NFNL_SUBSYS_CTNETLINK`) and its message updating an entry
/// (`IPCTNL_MSG_CT_NEW` without `NLM_F_CREATE`).
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 1 << 15;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_PROTOINFO: u16 = 4;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;
/// `IP_CT_TCP_FLAG_BE_LIBERAL`: window tracking off for that direction.
const IP_CT_TCP_FLAG_BE_LIBERAL: u8 = 0x08;

/// A network's worker; dropping it ends the thread.
pub struct Worker {
    netns: Option<String>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// The namespace the worker serves.
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the worker of the network pinned in `dir`, whose namespace is `netns` (the
/// daemon's own with `None`).
pub fn spawn(network: &str, dir: &Path, netns: Option<&str>) -> Result<Worker> {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, dir, ns, name) = (
        stop.clone(),
        dir.to_path_buf(),
        netns.map(str::to_owned),
        network.to_owned(),
    );
    let thread = std::thread::Builder::new()
        .name("lb-liberal".into())
        .spawn(move || {
            if let Err(e) = serve(&dir, ns.as_deref(), &flag) {
                tracing::warn!(network = %name, "the vetted fast path's TCP flows keep taking the stack: {e:#}");
            }
        })
        .context("starting the conntrack worker")?;
    Ok(Worker {
        netns: netns.map(str::to_owned),
        stop,
        thread: Some(thread),
    })
}

fn serve(dir: &Path, netns: Option<&str>, stop: &AtomicBool) -> Result<()> {
    if let Some(ns) = netns {
        join_netns(&netns_path(ns))?;
    }
    let pin = |name: &str| -> Result<MapData> {
        let path: PathBuf = dir.join(name);
        MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))
    };
    let mut ring = RingBuf::try_from(Map::RingBuf(pin("lb_ct_requests")?))?;
    let mut liberal: HashMap<_, FlowKeyOf<u32>, u32> =
        HashMap::try_from(Map::LruHashMap(pin("lb_liberal")?))?;
    let mut liberal6: HashMap<_, FlowKeyOf<Addr6>, u32> =
        HashMap::try_from(Map::LruHashMap(pin("lb_liberal6")?))?;
    let mut ct = Ctnetlink::open()?;
    let fd = ring.as_raw_fd();
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own, for the call.
        unsafe { libc::poll(&mut pfd, 1, POLL.as_millis() as i32) };
        while let Some(item) = ring.next() {
            match item.len() {
                n if n == size_of::<CtRequest>() => {
                    let r: CtRequest = bytemuck::pod_read_unaligned(&item);
                    ct.answer(&r, &mut liberal);
                }
                n if n == size_of::<CtRequest6>() => {
                    let r: CtRequest6 = bytemuck::pod_read_unaligned(&item);
                    ct.answer(&r, &mut liberal6);
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A ctnetlink socket of the calling thread's namespace, and the errors already logged.
struct Ctnetlink {
    socket: Socket,
    seq: u32,
    logged: BTreeSet<i32>,
}

impl Ctnetlink {
    fn open() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER).context("opening a netfilter socket")?;
        socket.bind_auto().context("binding the netfilter socket")?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .context("connecting the netfilter socket")?;
        Ok(Ctnetlink {
            socket,
            seq: 0,
            logged: BTreeSet::new(),
        })
    }

    /// Makes the entry of request `r` liberal and records its flow in `liberal`; a flow
    /// recorded already (a burst of requests for it) is not asked again.
    fn answer<A: MapIp>(
        &mut self,
        r: &CtRequestOf<A>,
        liberal: &mut HashMap<MapData, FlowKeyOf<A>, u32>,
    ) where
        FlowKeyOf<A>: aya::Pod,
    {
        if liberal.get(&r.key, 0).is_ok() {
            return;
        }
        let errno = match self.update(&r.orig) {
            Ok(errno) => errno,
            Err(e) => {
                tracing::warn!("making a conntrack entry liberal: {e:#}");
                return;
            }
        };
        // No entry: no conntrack in the namespace (or it has forgotten the flow, whose next
        // packet on the stack creates one: loose pickup, liberal or not, then sees it as
        // established).
        if errno == 0 || errno == libc::ENOENT {
            if let Err(e) = liberal.insert(r.key, 1, 0) {
                tracing::warn!("writing lb_liberal: {e}");
            }
        } else if self.logged.insert(errno) {
            tracing::warn!(
                "the node's conntrack refused to make an entry liberal ({}): such TCP flows keep taking the stack",
                std::io::Error::from_raw_os_error(errno)
            );
        }
    }

    /// Sends the update for the entry of original tuple `orig`; the kernel's answer (an
    /// errno, 0 for success).
    fn update<A: MapIp>(&mut self, orig: &FlowKeyOf<A>) -> Result<i32> {
        self.seq = self.seq.wrapping_add(1);
        let msg = liberal_message::<A>(orig, self.seq);
        self.socket.send(&msg, 0).context("sending to ctnetlink")?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = self
                .socket
                .recv(&mut &mut buf[..], 0)
                .context("reading ctnetlink")?;
            let mut off = 0;
            while off + 16 <= n {
                let len = u32::from_ne_bytes(buf[off..off + 4].try_into()?) as usize;
                let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into()?);
                let seq = u32::from_ne_bytes(buf[off + 8..off + 12].try_into()?);
                if len < 16 {
                    bail!("malformed netlink answer");
                }
                if kind == NLMSG_ERROR && seq == self.seq && off + 20 <= n {
                    let err = i32::from_ne_bytes(buf[off + 16..off + 20].try_into()?);
                    return Ok(-err);
                }
                off += len.next_multiple_of(4);
            }
        }
    }
}

/// The ctnetlink message setting `IP_CT_TCP_FLAG_BE_LIBERAL` on both directions of the
/// entry whose original tuple is `orig` (TCP), leaving everything else of it as it is.
fn liberal_message<A: MapIp>(orig: &FlowKeyOf<A>, seq: u32) -> Vec<u8> {
    let octets = |a: IpAddr| match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let v6 = orig.saddr.ip().is_ipv6();
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
    let (src, dst) = (octets(orig.saddr.ip()), octets(orig.daddr.ip()));
    let ip = nested(
        CTA_TUPLE_IP,
        &[
            attr(if v6 { CTA_IP_V6_SRC } else { CTA_IP_V4_SRC }, &src),
            attr(if v6 { CTA_IP_V6_DST } else { CTA_IP_V4_DST }, &dst),
        ]
        .concat(),
    );
    let proto = nested(
        CTA_TUPLE_PROTO,
        &[
            attr(CTA_PROTO_NUM, &[orig.proto]),
            // The key holds ports in network order already.
            attr(CTA_PROTO_SRC_PORT, &orig.sport.to_ne_bytes()),
            attr(CTA_PROTO_DST_PORT, &orig.dport.to_ne_bytes()),
        ]
        .concat(),
    );
    let flags = [IP_CT_TCP_FLAG_BE_LIBERAL, IP_CT_TCP_FLAG_BE_LIBERAL];
    let info = nested(
        CTA_PROTOINFO,
        &nested(
            CTA_PROTOINFO_TCP,
            &[
                attr(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, &flags),
                attr(CTA_PROTOINFO_TCP_FLAGS_REPLY, &flags),
            ]
            .concat(),
        ),
    );
    let body = [
        // nfgenmsg: family, version 0, resource id 0.
        vec![family, 0, 0, 0],
        nested(CTA_TUPLE_ORIG, &[ip, proto].concat()),
        info,
    ]
    .concat();
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW).to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// A netlink attribute, padded to 4 bytes.
fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
    let len = 4 + data.len();
    let mut a = Vec::with_capacity(len.next_multiple_of(4));
    a.extend_from_slice(&(len as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(data);
    a.resize(len.next_multiple_of(4), 0);
    a
}

fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
    attr(kind | NLA_F_NESTED, inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_entry_and_sets_both_liberal_flags() {
        let orig = FlowKeyOf::<u32> {
            saddr: u32::from_ne_bytes([10, 10, 0, 2]),
            daddr: u32::from_ne_bytes([10, 20, 0, 10]),
            sport: 40000u16.to_be(),
            dport: 8080u16.to_be(),
            proto: 6,
            _pad: [0; 3],
        };
        let m = liberal_message(&orig, 7);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 1 << 8);
        assert_eq!(m[16], libc::AF_INET as u8);
        let hex: String = m.iter().map(|b| format!("{b:02x}")).collect();
        // The addresses and ports as the wire has them, and the flags byte with its mask.
        for part in ["0a0a0002", "0a14000a", "9c40", "1f90", "0808"] {
            assert!(hex.contains(part), "{part} in {hex}");
        }
        assert_eq!(m.len() % 4, 0);
    }
}
