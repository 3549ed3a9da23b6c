//! The node's kernel state over rtnetlink, one file per concern: addresses and lb's VIP
//! aliases (`addr.rs`), links (`link.rs`), bridge ports' hairpin mode (`hairpin.rs`), tc
//! filters (`tc.rs`), neighbours (`neigh.rs`) and bridge forwarding entries (`fdb.rs`).
//!
//! Contract: [`Netlink`] talks to the namespace of the thread that created it, so it is only
//! made inside [`super::in_netns`] (or the watcher's own thread). The methods block; they own
//! a private current-thread runtime, so they are safe to call from a thread that is not a
//! tokio worker.
use std::ffi::CString;

use anyhow::{Context as _, Result, bail};

mod addr;
mod fdb;
mod hairpin;
mod link;
mod neigh;
mod tc;

pub use addr::{
    ALIAS_PROTO, NodeAddr, address_dumps, host_prefix, network_of, node_addrs, on_interface,
};
pub use fdb::FdbEntry;
pub use link::{Link, LinkKind};
pub use neigh::Neighbour;
pub use tc::BpfFilter;

/// A blocking rtnetlink client for the current thread's network namespace.
pub struct Netlink {
    rt: tokio::runtime::Runtime,
    handle: rtnetlink::Handle,
}

/// A netlink NACK's errno (the kernel sends it negated), if the error is one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

fn mac(bytes: &[u8]) -> Option<[u8; 6]> {
    bytes.try_into().ok()
}

impl Netlink {
    pub fn new() -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .context("starting a netlink runtime")?;
        // The connection's socket is opened here, in the caller's (namespace's) thread.
        let handle = rt.block_on(async {
            let (conn, handle, _) =
                rtnetlink::new_connection().context("opening a rtnetlink socket")?;
            tokio::spawn(conn);
            anyhow::Ok(handle)
        })?;
        Ok(Self { rt, handle })
    }

    /// The index of interface `ifname`, with an error naming it when it does not exist.
    pub fn ifindex(&self, ifname: &str) -> Result<u32> {
        let c = CString::new(ifname).with_context(|| format!("interface name {ifname:?}"))?;
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            bail!("interface {ifname} does not exist");
        }
        Ok(index)
    }

    /// The interfaces of a network (`interfaces`, in its order) that exist here, with their
    /// indexes. The first must exist: it carries the VIP aliases, and its absence is an error
    /// naming it. A later one that does not exist yet is left out; it is served from when it
    /// appears (the bridge a CNI plugin creates with its first pod), since the daemon applies
    /// the network again on the node's link events. The one place that rule lives.
    pub fn present<'a>(&self, interfaces: &'a [String]) -> Result<Vec<(&'a str, u32)>> {
        let mut out = Vec::new();
        for (i, name) in interfaces.iter().enumerate() {
            match self.ifindex(name) {
                Ok(index) => out.push((name.as_str(), index)),
                Err(_) if i > 0 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The name of interface `index`, or `if<index>` when it has none any more (for messages).
    pub fn ifname(&self, index: u32) -> String {
        let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname writes at most.
        let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
        if p.is_null() {
            return format!("if{index}");
        }
        // SAFETY: on success `buf` holds a NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
}
