//! Following the node: one thread per namespace the desired state uses, subscribed to its
//! rtnetlink address, link and neighbour events and to its nftables changes, tells the actor
//! which namespace changed and how. On address and link events the actor applies that
//! namespace's networks again; on neighbour and ruleset changes it refreshes only their fast
//! path (endpoints; whether forward-hook rules forbid it) and a `dsr` network's backend MACs.
//! So an address of either family added to the node later is served
//! (published ports answer on it), one removed is dropped, and an interface deleted and
//! recreated gets its programs and aliases back — within a second, as nftables' `fib daddr
//! type local` and `iifname` follow such changes at once.
//!
//! Contracts:
//! - The watcher only reports; the actor stays the one writer. Events are coalesced for
//!   `SETTLE` so that a burst (an interface coming up with its addresses) costs one apply.
//! - lb's own alias changes (IFA_PROTO [`ALIAS_PROTO`]) are not reported: an apply that adds
//!   aliases must not trigger another apply.
//! - A namespace is followed while it is the one its path names: the thread's socket keeps a
//!   deleted namespace alive, so the thread compares the path's inode with its own namespace
//!   every `POLL`, reports a change when they differ (the networks there then fail with
//!   "opening network namespace …" until it returns) and ends; [`Watcher::sync`] starts a
//!   new thread once the path names a namespace again.
use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::AsRawFd as _,
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use rtnetlink::{
    constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK, RTMGRP_NEIGH},
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{RouteNetlinkMessage, address::AddressAttribute},
    sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE},
};

use crate::node::{
    ALIAS_PROTO,
    filter::{self, NftEvents},
    join_netns, netns_path,
};

/// How long events are coalesced before one report.
const SETTLE: Duration = Duration::from_millis(100);
/// How often a thread checks that its namespace is still the one its path names.
const POLL: Duration = Duration::from_millis(500);

/// A namespace as the state names it: `None` is the daemon's own.
pub type NetnsKey = Option<String>;

/// What changed in a namespace since the last report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Addresses or links (or the namespace itself): the networks there are applied again.
    pub node: bool,
    /// Neighbours or bridge forwarding entries: only the fast path's endpoints and the DSR
    /// backends' MACs can be stale.
    pub neighbours: bool,
    /// The nftables ruleset (other than lb's own tables): whether the fast path may run.
    pub firewall: bool,
}

impl Changes {
    pub const NODE: Changes = Changes {
        node: true,
        neighbours: false,
        firewall: false,
    };

    fn any(&self) -> bool {
        self.node || self.neighbours || self.firewall
    }

    fn merge(&mut self, other: Changes) {
        self.node |= other.node;
        self.neighbours |= other.neighbours;
        self.firewall |= other.firewall;
    }
}

/// Tells the actor what changed in a namespace; false once the actor is gone.
pub type Report = Arc<dyn Fn(NetnsKey, Changes) -> bool + Send + Sync>;

/// The watcher threads, one per namespace key.
#[derive(Default)]
pub struct Watcher {
    threads: BTreeMap<NetnsKey, Arc<AtomicBool>>,
}

impl Watcher {
    /// Follows exactly the namespaces of `wanted`: starts a thread for each one that has none
    /// (or whose thread ended), and stops the others. A namespace that does not exist yet is
    /// tried again at the next call.
    pub fn sync(&mut self, wanted: &BTreeSet<NetnsKey>, report: &Report) {
        self.threads.retain(|ns, alive| {
            let keep = wanted.contains(ns) && alive.load(Ordering::Relaxed);
            if !keep {
                alive.store(false, Ordering::Relaxed);
            }
            keep
        });
        for ns in wanted {
            if self.threads.contains_key(ns) {
                continue;
            }
            match spawn(ns.clone(), report.clone()) {
                Ok(alive) => {
                    self.threads.insert(ns.clone(), alive);
                }
                Err(e) => {
                    tracing::debug!(netns = ?ns, error = %format!("{e:#}"), "not following a namespace yet")
                }
            }
        }
    }
}

impl Drop for Watcher {
    /// Each thread ends within `POLL`.
    fn drop(&mut self) {
        for alive in self.threads.values() {
            alive.store(false, Ordering::Relaxed);
        }
    }
}

/// The inode of the namespace `ns` names (the daemon's own for `None`).
fn netns_inode(ns: &NetnsKey) -> Result<u64> {
    let path = ns
        .as_deref()
        .map_or_else(|| PathBuf::from("/proc/self/ns/net"), netns_path);
    Ok(std::fs::metadata(&path)
        .with_context(|| format!("{}", path.display()))?
        .ino())
}

fn spawn(ns: NetnsKey, report: Report) -> Result<Arc<AtomicBool>> {
    let alive = Arc::new(AtomicBool::new(true));
    let (ready_tx, ready_rx) = mpsc::channel();
    let flag = alive.clone();
    std::thread::Builder::new()
        .name("lb-watch".into())
        .spawn(move || {
            let socket = subscribe(&ns);
            let joined = socket.as_ref().ok().map(|(_, _, ino)| *ino);
            let _ = ready_tx.send(socket.as_ref().map(drop).map_err(|e| format!("{e:#}")));
            if let Ok((socket, nft, _)) = socket {
                follow(&ns, &socket, nft, joined, &flag, &report);
            }
            flag.store(false, Ordering::Relaxed);
        })
        .context("spawning a watcher thread")?;
    ready_rx
        .recv()
        .context("the watcher thread ended")?
        .map_err(anyhow::Error::msg)?;
    Ok(alive)
}

/// Joins `ns` on this thread for good (the thread is the watcher's own) and opens a socket
/// subscribed to its address, link and neighbour events, and one to its nftables changes;
/// returns them with the namespace's inode.
fn subscribe(ns: &NetnsKey) -> Result<(Socket, Option<NftEvents>, u64)> {
    if let Some(name) = ns {
        join_netns(&netns_path(name))?;
    }
    let ino = std::fs::metadata("/proc/thread-self/ns/net")
        .context("reading this thread's namespace")?
        .ino();
    let mut socket = Socket::new(NETLINK_ROUTE).context("opening a rtnetlink socket")?;
    socket
        .bind(&SocketAddr::new(
            0,
            RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_NEIGH,
        ))
        .context("subscribing to address, link and neighbour events")?;
    let tv = libc::timeval {
        tv_sec: 0,
        // Wakes up at least every SETTLE, so a coalesced report leaves on time.
        tv_usec: SETTLE.as_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt with a valid timeval on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("setting the receive timeout");
    }
    // Without nf_tables in the kernel there is no ruleset to follow (and none to skip).
    let nft = filter::nft_events()
        .inspect_err(|e| tracing::debug!(netns = ?ns, error = %format!("{e:#}"), "not following nftables changes"))
        .ok();
    Ok((socket, nft, ino))
}

fn follow(
    ns: &NetnsKey,
    socket: &Socket,
    mut nft: Option<NftEvents>,
    joined: Option<u64>,
    alive: &AtomicBool,
    report: &Report,
) {
    let mut buf = vec![0u8; 1 << 16];
    let mut since: Option<Instant> = None;
    let mut pending = Changes::default();
    let mut last_check = Instant::now();
    while alive.load(Ordering::Relaxed) {
        let mut seen = match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => relevant(&buf[..n]),
            // An overrun (ENOBUFS: events were lost, so something changed) means "look
            // again"; the receive timeout means nothing.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Changes::NODE,
            Err(_) => Changes::default(),
        };
        // Drained at least every SETTLE (the receive timeout): a ruleset change is seen as
        // promptly as a link event.
        if let Some(nft) = nft.as_mut() {
            seen.firewall |= nft.drain().unwrap_or(true);
        }
        if seen.any() {
            since.get_or_insert_with(Instant::now);
            pending.merge(seen);
        }
        if last_check.elapsed() >= POLL {
            last_check = Instant::now();
            if netns_inode(ns).ok() != joined {
                tracing::warn!(netns = ?ns, "the network namespace is gone or was replaced");
                report(ns.clone(), Changes::NODE);
                return;
            }
        }
        if since.is_some_and(|t| t.elapsed() >= SETTLE) {
            since = None;
            if !report(ns.clone(), std::mem::take(&mut pending)) {
                return;
            }
        }
    }
}

/// What a batch of rtnetlink messages changed that lb must act on: any link event, any
/// address event that is not about one of lb's own aliases, and neighbour and bridge
/// forwarding events (the fast path's endpoints, the DSR backends' MACs).
fn relevant(mut bytes: &[u8]) -> Changes {
    let mut seen = Changes::default();
    while bytes.len() >= 16 {
        let len = u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > bytes.len() {
            return Changes::NODE;
        }
        let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[..len]) else {
            // Not one we can read: look again rather than miss a change.
            return Changes::NODE;
        };
        match msg.payload {
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewAddress(a) | RouteNetlinkMessage::DelAddress(a),
            ) => {
                seen.node |= !a.attributes.iter().any(
                    |x| matches!(x, AddressAttribute::Protocol(p) if u8::from(*p) == ALIAS_PROTO),
                )
            }
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewNeighbour(_) | RouteNetlinkMessage::DelNeighbour(_),
            ) => seen.neighbours = true,
            NetlinkPayload::InnerMessage(_) => seen.node = true,
            _ => {}
        }
        bytes = &bytes[len.next_multiple_of(4).min(bytes.len())..];
    }
    seen
}
