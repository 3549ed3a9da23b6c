//! Holding published ports: while a port is published, the daemon keeps a socket bound to it
//! (its `host_ip`, or every address) in the network's namespace, as kubelet's
//! `openLocalPort` and Docker's proxy do, so that no process of the node takes a port that
//! clients are sent to.
//!
//! Contracts:
//! - TCP sockets are bound, never listening: a connection the dataplane does not translate
//!   (a port whose backends are all gone passes to the stack) is refused by the node, as
//!   without lb, instead of being accepted by a socket that never answers. A bound socket
//!   still takes the port from every other bind (no `SO_REUSEADDR`). UDP sockets are bound
//!   with the smallest receive buffer. SCTP is not held (kubelet does not either).
//! - Sockets are opened in the network's namespace (a socket keeps the namespace it was
//!   made in) and owned by the daemon: they go with the port, the network or the process. A
//!   restarted daemon holds them again when it applies the network.
//! - A port a local process already holds is refused before the change is saved
//!   ([`check_free`]); one taken between that check and the apply (or while the daemon was
//!   down) is reported by `lb status` until it is free and held.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Result, bail};

use crate::{
    core::model::{Family, HoldPorts, Network, PortKey, Proto},
    node::in_netns,
};

/// The ports `network` holds: every published port but SCTP's, while it holds ports.
pub fn wanted(network: &Network) -> BTreeSet<PortKey> {
    if network.hold_ports == HoldPorts::Off {
        return BTreeSet::new();
    }
    (network.services.iter())
        .flat_map(|s| s.port_keys().map(|(k, _)| k))
        .filter(|k| k.proto != Proto::Sctp)
        .collect()
}

/// Whether `network` holds published port `key` (see [`wanted`]).
pub fn holds(network: &Network, key: &PortKey) -> bool {
    network.hold_ports == HoldPorts::On && key.proto != Proto::Sctp
}

/// A socket bound to `key`'s address and port (see the module's contracts), or the bind's
/// error. In the calling thread's namespace. A key of every IPv6 address binds `[::]` with
/// `IPV6_V6ONLY`, so that it holds the IPv6 port alone and the IPv4 key holds its own.
fn bind(key: &PortKey) -> std::io::Result<OwnedFd> {
    let ip = key.host_ip.unwrap_or(match key.family {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    });
    let (kind, proto) = match key.proto {
        Proto::Tcp => (libc::SOCK_STREAM, libc::IPPROTO_TCP),
        _ => (libc::SOCK_DGRAM, libc::IPPROTO_UDP),
    };
    let domain = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: a plain socket call; the fd is owned at once.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let set = |level, name, value: libc::c_int| {
        // SAFETY: setsockopt with a c_int option value of the size given.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if key.proto != Proto::Tcp {
        // Failure only leaves the default buffer.
        set(libc::SOL_SOCKET, libc::SO_RCVBUF, 1);
    }
    let rc = match ip {
        IpAddr::V4(v4) => {
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: key.port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: bind with a sockaddr_in of the size given.
            unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in).cast(),
                    size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        IpAddr::V6(v6) => {
            if set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let sa = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: key.port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: bind with a sockaddr_in6 of the size given.
            unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in6).cast(),
                    size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

fn where_(network: &Network) -> String {
    network.netns.as_ref().map_or_else(
        || "the daemon's netns".to_owned(),
        |ns| format!("netns {ns}"),
    )
}

/// Refuses `network` when a port it would hold anew (`new`: those a change adds that the
/// daemon does not hold for it now) is taken in its namespace: a published port must be
/// free, as kubelet and Docker require. Checked by binding it and letting it go again.
pub fn check_free<'a>(network: &Network, new: impl Iterator<Item = &'a PortKey>) -> Result<()> {
    let new: Vec<PortKey> = new.copied().collect();
    if new.is_empty() {
        return Ok(());
    }
    let (name, place) = (network.name.clone(), where_(network));
    in_netns(network.netns.as_deref(), move || {
        for key in &new {
            match bind(key) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => bail!(
                    "network {name}: {key} is in use in {place}: a local process holds {} port {}{}; a published port must be free (as kubelet and Docker require): stop that process or publish another port (or --hold-ports off to publish it anyway)",
                    key.proto,
                    key.port,
                    key.host_ip
                        .map(|ip| format!(" on {ip} or on every address"))
                        .unwrap_or_default(),
                ),
                // Another failure (an address not yet on the node) is the apply's to report.
                Err(_) => {}
            }
        }
        Ok(())
    })
}

/// File descriptors the daemon keeps for what is not a held port.
const RESERVED_FDS: usize = 2048;

/// The process's limit of open files (its soft limit).
fn fd_limit() -> usize {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 1024;
    }
    usize::try_from(l.rlim_cur).unwrap_or(usize::MAX)
}

/// Raises the process's soft limit of open files to its hard limit (as Go's runtime and
/// systemd's services do): every held port, map, link and connection is a descriptor, and
/// the soft limit is often the old 1,024. Returns the limit now.
pub fn raise_fd_limit() -> usize {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
    fd_limit()
}

/// The sockets the daemon holds, per network.
#[derive(Default)]
pub struct Holder {
    held: BTreeMap<String, BTreeMap<PortKey, OwnedFd>>,
    /// Ports of a network that could not be held at its last sync, with why.
    failed: BTreeMap<String, BTreeMap<PortKey, String>>,
}

impl Holder {
    /// Holds exactly the ports `network` wants (see [`wanted`]): binds the new ones in its
    /// namespace and closes those no longer published. A port that cannot be bound is
    /// recorded for `lb status` and tried again at the next sync.
    pub fn sync(&mut self, network: &Network) -> Result<()> {
        let want = wanted(network);
        let held = self.held.entry(network.name.clone()).or_default();
        held.retain(|k, _| want.contains(k));
        let new: Vec<PortKey> = (want.iter())
            .filter(|k| !held.contains_key(k))
            .copied()
            .collect();
        // Every socket is a file descriptor: the daemon keeps RESERVED_FDS of its limit for
        // everything else (maps, links, namespaces, connections), so a node publishing more
        // ports than that leaves holds some of them, not starve the dataplane.
        let total: usize = self.held.values().map(BTreeMap::len).sum();
        let room = fd_limit()
            .saturating_sub(RESERVED_FDS)
            .saturating_sub(total);
        let held = self.held.entry(network.name.clone()).or_default();
        let failed = self.failed.entry(network.name.clone()).or_default();
        failed.clear();
        if new.is_empty() {
            return Ok(());
        }
        let (new, over) = new.split_at(new.len().min(room));
        for key in over {
            failed.insert(
                *key,
                format!(
                    "out of file descriptors: the daemon holds {total} published ports and keeps {RESERVED_FDS} of its limit of {} for the rest (raise LimitNOFILE, or --hold-ports off)",
                    fd_limit()
                ),
            );
        }
        let new = new.to_vec();
        let bound = in_netns(network.netns.as_deref(), move || {
            Ok(new.into_iter().map(|k| (k, bind(&k))).collect::<Vec<_>>())
        })?;
        for (key, r) in bound {
            match r {
                Ok(fd) => {
                    held.insert(key, fd);
                }
                Err(e) => {
                    tracing::warn!(network = %network.name, port = %key, error = %e, "a published port cannot be held");
                    failed.insert(key, e.to_string());
                }
            }
        }
        Ok(())
    }

    /// Lets every port of network `name` go.
    pub fn release(&mut self, name: &str) {
        self.held.remove(name);
        self.failed.remove(name);
    }

    /// Whether a port of network `name` could not be held at its last sync.
    pub fn has_failed(&self, name: &str) -> bool {
        self.failed.get(name).is_some_and(|f| !f.is_empty())
    }

    /// The ports of network `name` the daemon holds.
    pub fn held(&self, name: &str) -> BTreeSet<PortKey> {
        (self.held.get(name).into_iter())
            .flat_map(|h| h.keys().copied())
            .collect()
    }

    /// `lb status`'s lines for network `name`: the published ports it could not hold.
    pub fn warnings(&self, name: &str) -> Vec<String> {
        // One line per reason: tens of thousands of ports can fail for one.
        let mut by_reason: BTreeMap<&str, Vec<&PortKey>> = BTreeMap::new();
        for (k, why) in self.failed.get(name).into_iter().flatten() {
            by_reason.entry(why).or_default().push(k);
        }
        (by_reason.into_iter())
            .map(|(why, keys)| {
                let shown: Vec<String> = keys.iter().take(3).map(|k| k.to_string()).collect();
                let more = match keys.len().saturating_sub(3) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                let what = if keys.len() == 1 { "port" } else { "ports" };
                format!(
                    "published {what} {}{more} not held ({why}): another process of the node may take them; retried every few seconds",
                    shown.join(", ")
                )
            })
            .collect()
    }
}
