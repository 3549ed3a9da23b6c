//! Whether a namespace's sockets listen, accept or are connected (its `/proc/net` tables,
//! and a connect), and waiting for a port to accept.
use std::fs;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use super::POLL;
use crate::netns::Netns;

/// Whether a TCP connection from `ns` to `addr:port` (either family) is accepted (within
/// 200 ms).
pub fn tcp_accepts(ns: &Netns, addr: impl Into<IpAddr>, port: u16) -> Result<bool> {
    let peer = SocketAddr::new(addr.into(), port);
    Ok(ns
        .run(|| TcpStream::connect_timeout(&peer, Duration::from_millis(200)))?
        .is_ok())
}

/// Waits until a TCP connection from `ns` to `addr:port` (either family) is accepted; an
/// error after `timeout`.
pub fn wait_tcp_port(
    ns: &Netns,
    addr: impl Into<IpAddr>,
    port: u16,
    timeout: Duration,
) -> Result<()> {
    let peer = SocketAddr::new(addr.into(), port);
    let deadline = Instant::now() + timeout;
    while !tcp_accepts(ns, peer.ip(), port)? {
        ensure!(
            Instant::now() < deadline,
            "nothing accepts tcp {peer} in {} after {timeout:?}",
            ns.name()
        );
        thread::sleep(POLL);
    }
    Ok(())
}

/// Whether some socket in `ns` listens on TCP `port` (any address of either family), read
/// from the namespace's `/proc/net/tcp` and `tcp6` rather than by connecting: a server that
/// counts connections (iperf) sees no probe.
pub fn tcp_listening(ns: &Netns, port: u16) -> Result<bool> {
    let table = proc_net(ns, "tcp")? + &proc_net(ns, "tcp6")?;
    // `sl local_address rem_address st ...`: `0100007F:1F90 00000000:0000 0A`, 0A = LISTEN
    // (tcp6: the same with 32 hex digits of address). Each table's header line has no
    // state `0A`.
    Ok(table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let local_port = fields
            .next()
            .and_then(|local| local.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        let state = fields.nth(1);
        local_port == Some(port) && state == Some("0A")
    }))
}

/// Whether some TCP connection in `ns` whose remote end has port `remote_port` is established,
/// from the namespace's `/proc/net/tcp`: a server's side of a client's connection, until a RST
/// (or the server's own close) ends it.
pub fn tcp_established(ns: &Netns, remote_port: u16) -> Result<bool> {
    // IPv4's and IPv6's tables, whose lines have the same fields (a kernel without IPv6 has
    // no tcp6, and no IPv6 connection).
    let table = proc_net(ns, "tcp")? + &proc_net(ns, "tcp6").unwrap_or_default();
    // `sl local_address rem_address st ...`, 01 = ESTABLISHED.
    Ok(table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace().skip(2);
        let remote = fields
            .next()
            .and_then(|remote| remote.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        remote == Some(remote_port) && fields.next() == Some("01")
    }))
}

/// Whether some UDP socket in `ns` is bound to `port` (any address), from the namespace's
/// `/proc/net/udp`.
pub fn udp_bound(ns: &Netns, port: u16) -> Result<bool> {
    let table = proc_net(ns, "udp")?;
    Ok(table.lines().skip(1).any(|line| {
        let local_port = (line.split_whitespace().nth(1))
            .and_then(|local| local.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        local_port == Some(port)
    }))
}

/// `/proc/net/<file>` of `ns`. Read through `/proc/thread-self`: `/proc/net` is
/// `/proc/self/net`, the namespace of the process's main thread, not of the thread that
/// entered `ns`.
pub(super) fn proc_net(ns: &Netns, file: &str) -> Result<String> {
    let path = Path::new("/proc/thread-self/net").join(file);
    ns.run(|| fs::read_to_string(&path))?
        .with_context(|| format!("reading /proc/net/{file} in {}", ns.name()))
}
