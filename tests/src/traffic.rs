//! Real TCP and UDP traffic inside test namespaces, std only.
//!
//! Sockets are created inside a namespace through [`Netns::run`] and keep that namespace for
//! life, so the serving and asking threads themselves need not be in it. The wire protocol is
//! one line per request, answered by one [`Reply`] line `"<backend> <peer_ip>:<peer_port>\n"`:
//! which backend answered, and which client address it saw (the real client, or the node when
//! lb masquerades). A backend answers from the address it was asked at — for TCP the
//! connection's own, for UDP the datagram's destination (`IP_PKTINFO`) — so one that owns a VIP
//! answers a direct-server-return client from the VIP, as a real server bound to any does.
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream,
    UdpSocket,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};

use crate::netns::{Netns, Topology};

/// The default for every client timeout: long enough for a first packet's ARP on a loaded
/// 2-CPU VM, short enough that a broken dataplane fails a test instead of hanging it.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// What clients send; backends ignore the content and answer each line (or datagram).
const REQUEST: &[u8] = b"hello\n";

/// One backend answer: who answered and the client address it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub backend: String,
    pub peer: SocketAddrV4,
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.backend, self.peer)
    }
}

impl FromStr for Reply {
    type Err = anyhow::Error;

    fn from_str(line: &str) -> Result<Reply> {
        let (backend, peer) = line
            .trim_end()
            .split_once(' ')
            .with_context(|| format!("not a backend reply: {line:?}"))?;
        Ok(Reply {
            backend: backend.to_owned(),
            peer: peer
                .parse()
                .with_context(|| format!("bad peer in backend reply {line:?}"))?,
        })
    }
}

/// A TCP + UDP answering server in a backend namespace, listening on 0.0.0.0. Dropping it stops
/// every thread it started and closes every socket, so the namespace can go away.
pub struct Backend {
    name: String,
    listener: Arc<TcpListener>,
    udp: Arc<UdpSocket>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// What the accept thread and `Drop` agree on. A connection is registered under the lock only
/// while `stopping` is false, and `Drop` sets `stopping` before it takes the lock to shut the
/// registered ones down: no connection escapes the shutdown.
#[derive(Default)]
struct Shared {
    stopping: AtomicBool,
    conns: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Starts a backend called `name` in `ns`, answering TCP on `tcp_port` (many lines per
/// connection: a long-lived connection keeps getting answers) and UDP on `udp_port` (one answer
/// per datagram, sent from the address the datagram was sent to), on every address of `ns`.
pub fn spawn_backend(ns: &Netns, name: &str, tcp_port: u16, udp_port: u16) -> Result<Backend> {
    let any = Ipv4Addr::UNSPECIFIED;
    let (listener, udp) = ns
        .run(|| {
            let udp = UdpSocket::bind((any, udp_port))?;
            set_int_option(&udp, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
            io::Result::Ok((TcpListener::bind((any, tcp_port))?, udp))
        })?
        .with_context(|| {
            format!(
                "backend {name}: bind tcp/{tcp_port}, udp/{udp_port} in {}",
                ns.name()
            )
        })?;
    serve(name, listener, udp)
}

/// Answers on `listener` and `udp` as backend `name` until dropped.
fn serve(name: &str, listener: TcpListener, udp: UdpSocket) -> Result<Backend> {
    let (listener, udp) = (Arc::new(listener), Arc::new(udp));
    let shared = Arc::new(Shared::default());
    let mut backend = Backend {
        name: name.to_owned(),
        listener: listener.clone(),
        udp: udp.clone(),
        shared: shared.clone(),
        threads: Vec::new(),
    };
    // Pushed one by one so that a failed second spawn still stops the first thread on drop.
    let accept = {
        let (name, shared) = (backend.name.clone(), shared.clone());
        spawn(format!("{name}-tcp"), move || {
            accept_loop(&name, &listener, &shared)
        })?
    };
    backend.threads.push(accept);
    let answer = {
        let name = backend.name.clone();
        spawn(format!("{name}-udp"), move || {
            udp_loop(&name, &udp, &shared)
        })?
    };
    backend.threads.push(answer);
    Ok(backend)
}

/// [`spawn_backend`] on IPv6 beside it (the namespace has IPv6 on; `bindv6only` is set so
/// that `[::]` leaves IPv4's ports to the IPv4 server): TCP on `[::]:port`, UDP on
/// `[udp_at]:port`, the one address its datagrams are answered from (a direct-server-return
/// backend's VIP: an IPv6 socket on `[::]` would answer from the address the route picks).
pub fn spawn_backend6(ns: &Netns, name: &str, port: u16, udp_at: Ipv6Addr) -> Result<Backend> {
    ns.sysctl("net.ipv6.bindv6only", "1")?;
    let (listener, udp) = ns
        .run(|| {
            let udp = UdpSocket::bind((udp_at, port))?;
            io::Result::Ok((TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))?, udp))
        })?
        .with_context(|| format!("backend {name}: bind tcp/[::]:{port}, udp/[{udp_at}]:{port}"))?;
    serve(name, listener, udp)
}

/// One backend per namespace of `topo.backends`, named `b0`, `b1`, ...
pub fn spawn_backends(topo: &Topology, tcp_port: u16, udp_port: u16) -> Result<Vec<Backend>> {
    topo.backends
        .iter()
        .enumerate()
        .map(|(i, ns)| spawn_backend(ns, &format!("b{i}"), tcp_port, udp_port))
        .collect()
}

impl Backend {
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .with_context(|| format!("spawn thread {name}"))
}

/// The answer line to `peer`: a [`Reply`] (an IPv6 peer as `[addr]:port`, which
/// [`parse_answer`] reads).
fn reply_line(name: &str, peer: SocketAddr) -> Option<String> {
    Some(format!("{name} {peer}\n"))
}

/// A backend's answer line of either family: (backend, the client address it saw).
pub fn parse_answer(line: &str) -> Result<(String, SocketAddr)> {
    let (backend, peer) = line
        .trim_end()
        .split_once(' ')
        .with_context(|| format!("not a backend reply: {line:?}"))?;
    let peer = peer
        .parse()
        .with_context(|| format!("bad peer in backend reply {line:?}"))?;
    Ok((backend.to_owned(), peer))
}

fn accept_loop(name: &str, listener: &TcpListener, shared: &Shared) {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                ) && !shared.stopping() =>
            {
                continue;
            }
            Err(e) => {
                if !shared.stopping() {
                    eprintln!("lb-tests: backend {name}: accept: {e}");
                }
                return;
            }
        };
        let mut conns = shared.conns.lock().unwrap();
        if shared.stopping() {
            return;
        }
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        let conn_name = name.to_owned();
        match spawn(format!("{name}-conn"), move || {
            serve_tcp(&conn_name, stream)
        }) {
            Ok(thread) => {
                conns.retain(|(_, t)| !t.is_finished());
                conns.push((handle, thread));
            }
            Err(e) => eprintln!("lb-tests: backend {name}: {e:#}"),
        }
    }
}

fn serve_tcp(name: &str, stream: TcpStream) {
    let Some(answer) = stream.peer_addr().ok().and_then(|p| reply_line(name, p)) else {
        return;
    };
    let mut lines = BufReader::new(&stream);
    let mut line = String::new();
    // Ends at EOF, on any error, and when `Drop` shuts the socket down (read returns 0).
    while matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
        if line.starts_with("GET ") {
            return serve_http(lines, &answer);
        }
        if (&stream).write_all(answer.as_bytes()).is_err() {
            return;
        }
        line.clear();
    }
}

/// An HTTP/1.0 GET (what a browser or curl sends, and the demo): the same answer line as the
/// body of one response, then the connection closes.
fn serve_http(mut lines: BufReader<&TcpStream>, answer: &str) {
    let mut header = String::new();
    while matches!(lines.read_line(&mut header), Ok(n) if n > 0) && header.trim_end() != "" {
        header.clear();
    }
    let response = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let mut stream: &TcpStream = lines.get_ref();
    let _ = stream.write_all(response.as_bytes());
    // The accept loop holds a clone of this socket (to stop it on drop), so returning alone
    // would not close it: the client reads until EOF.
    let _ = stream.shutdown(Shutdown::Both);
}

fn udp_loop(name: &str, udp: &UdpSocket, shared: &Shared) {
    let mut buf = [0u8; 2048];
    // An IPv6 backend's socket is bound to the one address it answers at
    // ([`spawn_backend6`]): its answers leave from it without a control message.
    if udp.local_addr().is_ok_and(|a| a.is_ipv6()) {
        while !shared.stopping() {
            if let Ok((n, peer)) = udp.recv_from(&mut buf)
                && n > 0
                && let Some(answer) = reply_line(name, peer)
                && !shared.stopping()
            {
                let _ = udp.send_to(answer.as_bytes(), peer);
            }
        }
        return;
    }
    while !shared.stopping() {
        if let Ok(Some((peer, local))) = recv_with_local(udp, &mut buf)
            && let Some(answer) = reply_line(name, peer.into())
            && !shared.stopping()
        {
            let _ = send_from(udp, answer.as_bytes(), peer, local);
        }
    }
}

/// `setsockopt(level, option, value)` of an `int` option.
fn set_int_option(
    sock: &impl AsRawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the fd is open while `sock` lives; the value is a live int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            option,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Room for one `IP_PKTINFO` control message, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct PktinfoControl([u8; 64]);

/// Receives one datagram on `udp` (`IP_PKTINFO` on) into `buf`: its sender and the local
/// address to answer from (`ipi_spec_dst`: the destination, for a unicast datagram). `None`
/// when the socket was shut down (no sender).
fn recv_with_local(
    udp: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<Option<(SocketAddrV4, Option<Ipv4Addr>)>> {
    let mut from = sockaddr_in(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = PktinfoControl([0; 64]);
    // SAFETY: msghdr is plain data; every pointer set below outlives the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut from).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: `msg` describes live buffers of the sizes it states.
    if unsafe { libc::recvmsg(udp.as_raw_fd(), &mut msg, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg.msg_namelen == 0 {
        return Ok(None);
    }
    let mut local = None;
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with well-formed cmsgs;
    // CMSG_FIRSTHDR/NXTHDR stay within them and CMSG_DATA of an IP_PKTINFO one holds an
    // in_pktinfo (read unaligned: the buffer's alignment is ours, not in_pktinfo's).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::IPPROTO_IP && (*cmsg).cmsg_type == libc::IP_PKTINFO {
                let info: libc::in_pktinfo = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                local = Some(Ipv4Addr::from(u32::from_be(info.ipi_spec_dst.s_addr)));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let peer = SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr)),
        u16::from_be(from.sin_port),
    );
    Ok(Some((peer, local)))
}

/// Sends `data` on `udp` to `peer`, from the local address `local` when given (an
/// `IP_PKTINFO` control message), else from the one the route picks.
fn send_from(
    udp: &UdpSocket,
    data: &[u8],
    peer: SocketAddrV4,
    local: Option<Ipv4Addr>,
) -> io::Result<()> {
    let to = sockaddr_in(peer);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    let mut control = PktinfoControl([0; 64]);
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw const to).cast_mut().cast();
    msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if let Some(local) = local {
        let info = libc::in_pktinfo {
            ipi_ifindex: 0,
            ipi_spec_dst: libc::in_addr {
                s_addr: u32::from(local).to_be(),
            },
            ipi_addr: libc::in_addr { s_addr: 0 },
        };
        // SAFETY: CMSG_SPACE of an in_pktinfo (32) fits the 64-byte buffer, so
        // CMSG_FIRSTHDR is non-null and its data has room for the value written.
        unsafe {
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen =
                libc::CMSG_SPACE(size_of::<libc::in_pktinfo>() as libc::c_uint) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::IPPROTO_IP;
            (*cmsg).cmsg_type = libc::IP_PKTINFO;
            (*cmsg).cmsg_len =
                libc::CMSG_LEN(size_of::<libc::in_pktinfo>() as libc::c_uint) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast(), info);
        }
    }
    // SAFETY: `msg` describes live buffers of the sizes it states.
    if unsafe { libc::sendmsg(udp.as_raw_fd(), &msg, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Linux wakes a thread blocked in accept(2) or recvfrom(2) when the socket is shut
        // down (accept fails with EINVAL, recvfrom returns 0), even for a listening or an
        // unconnected UDP socket, where shutdown itself reports ENOTCONN; so the threads end
        // at once, without polling.
        for fd in [self.listener.as_raw_fd(), self.udp.as_raw_fd()] {
            // SAFETY: both fds stay open while `self` holds the sockets.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        let conns = std::mem::take(&mut *self.shared.conns.lock().unwrap());
        for (stream, _) in &conns {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let conn_threads = conns.into_iter().map(|(_, thread)| thread);
        for thread in self.threads.drain(..).chain(conn_threads) {
            let _ = thread.join();
        }
    }
}

/// Adds what a timed-out or failed exchange needs to be diagnosed from the test log.
fn exchange_error(
    e: io::Error,
    what: &str,
    peer: impl Into<SocketAddr>,
    timeout: Duration,
) -> anyhow::Error {
    let peer = peer.into();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            anyhow!("{what} {peer}: no answer within {timeout:?}")
        }
        _ => anyhow!(e).context(format!("{what} {peer}")),
    }
}

/// A TCP connection from `ns` to `peer` whose connect, sends and reads each time out after
/// `timeout`; `what` names it in errors (`tcp`, `http`).
fn connect_tcp(
    ns: &Netns,
    peer: impl Into<SocketAddr>,
    timeout: Duration,
    what: &str,
) -> Result<TcpStream> {
    let peer = peer.into();
    let stream = ns
        .run(|| TcpStream::connect_timeout(&peer, timeout))?
        .map_err(|e| {
            exchange_error(
                e,
                &format!("{what} connect from {} to", ns.name()),
                peer,
                timeout,
            )
        })?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// A TCP connection made from inside a namespace, asked many times: the flow (and so the
/// backend lb picked for it) stays the same for its whole life.
pub struct TcpSession {
    lines: BufReader<TcpStream>,
    peer: SocketAddr,
    timeout: Duration,
}

impl TcpSession {
    /// Connects from `ns` to `addr:port`; connect, every send and every read time out after
    /// `timeout`.
    pub fn connect(
        ns: &Netns,
        addr: impl Into<IpAddr>,
        port: u16,
        timeout: Duration,
    ) -> Result<TcpSession> {
        let peer = SocketAddr::new(addr.into(), port);
        let stream = connect_tcp(ns, peer, timeout, "tcp")?;
        Ok(TcpSession {
            lines: BufReader::new(stream),
            peer,
            timeout,
        })
    }

    /// Connects from `ns` to `addr:port` from the chosen local port `local_port` (on any
    /// address), as a node process that binds before it connects does: the source port is
    /// the test's choice, not the kernel's ephemeral pick. Connect, every send and every read
    /// time out after `timeout`.
    pub fn connect_from(
        ns: &Netns,
        local_port: u16,
        addr: Ipv4Addr,
        port: u16,
        timeout: Duration,
    ) -> Result<TcpSession> {
        let peer = SocketAddrV4::new(addr, port);
        let stream = ns
            .run(|| bound_connect(local_port, peer, timeout))?
            .map_err(|e| {
                exchange_error(
                    e,
                    &format!("tcp connect from {} port {local_port} to", ns.name()),
                    peer,
                    timeout,
                )
            })?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(TcpSession {
            lines: BufReader::new(stream),
            peer: peer.into(),
            timeout,
        })
    }

    /// Sends one request line and returns the answer line, without its newline.
    pub fn ask(&mut self) -> Result<String> {
        let (peer, timeout) = (self.peer, self.timeout);
        self.lines
            .get_ref()
            .write_all(REQUEST)
            .map_err(|e| exchange_error(e, "tcp send to", peer, timeout))?;
        let mut line = String::new();
        let n = self
            .lines
            .read_line(&mut line)
            .map_err(|e| exchange_error(e, "tcp answer from", peer, timeout))?;
        ensure!(n > 0, "tcp answer from {peer}: connection closed");
        Ok(line.trim_end_matches('\n').to_owned())
    }

    /// The client's own address of this connection.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.lines.get_ref().local_addr()?)
    }

    /// Aborts the connection: closed with `SO_LINGER` 0, the kernel sends a RST instead of a
    /// FIN, as a client that gives up on a connection does.
    pub fn reset(self) -> Result<()> {
        let stream = self.lines.into_inner();
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: the fd is open while `stream` lives; the value is a live linger.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("SO_LINGER 0 on the connection to {}", self.peer));
        }
        drop(stream);
        Ok(())
    }
}

/// `sockaddr_in` of `addr`, for the calls std does not wrap.
fn sockaddr_in(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// A TCP socket bound to `0.0.0.0:local_port`, then connected to `peer` (std connects only
/// from an ephemeral port). The connect gives up after `timeout`: Linux bounds a blocking
/// connect by the socket's send timeout.
fn bound_connect(local_port: u16, peer: SocketAddrV4, timeout: Duration) -> io::Result<TcpStream> {
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    };
    // SAFETY: socket(2) with constant arguments.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a fresh socket no one else owns; the OwnedFd closes it on every path.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let send_timeout = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros().into(),
    };
    let (local, peer) = (
        sockaddr_in(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, local_port)),
        sockaddr_in(peer),
    );
    let addr_len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: each call gets our socket and a pointer to a live value of the size it is told.
    let connected = unsafe {
        check(libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&raw const send_timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        ))?;
        check(libc::bind(
            sock.as_raw_fd(),
            (&raw const local).cast(),
            addr_len,
        ))?;
        check(libc::connect(
            sock.as_raw_fd(),
            (&raw const peer).cast(),
            addr_len,
        ))
    };
    match connected {
        // A connect cut short by the send timeout reports EINPROGRESS.
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
            Err(io::ErrorKind::TimedOut.into())
        }
        Err(e) => Err(e),
        Ok(_) => Ok(TcpStream::from(sock)),
    }
}

/// A UDP socket bound in a namespace (one source port for its whole life), asking one peer.
pub struct UdpSession {
    sock: UdpSocket,
    peer: SocketAddr,
    timeout: Duration,
}

impl UdpSession {
    /// Binds an ephemeral port on 0.0.0.0 (`[::]` for an IPv6 `addr`) in `ns` for talking to
    /// `addr:port`.
    pub fn connect(
        ns: &Netns,
        addr: impl Into<IpAddr>,
        port: u16,
        timeout: Duration,
    ) -> Result<UdpSession> {
        let addr = addr.into();
        let any = match addr {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let sock = ns
            .run(|| UdpSocket::bind((any, 0)))?
            .with_context(|| format!("udp bind in {}", ns.name()))?;
        sock.set_read_timeout(Some(timeout))?;
        Ok(UdpSession {
            sock,
            peer: SocketAddr::new(addr, port),
            timeout,
        })
    }

    /// Like [`UdpSession::connect`], and the socket is connected to `addr:port`, as a client
    /// library's is: the kernel takes answers from that source only, so an answer from any
    /// other address (a direct-server-return backend answering from its own address instead
    /// of the VIP) is never seen and the ask times out.
    pub fn connected(
        ns: &Netns,
        addr: impl Into<IpAddr>,
        port: u16,
        timeout: Duration,
    ) -> Result<UdpSession> {
        let session = UdpSession::connect(ns, addr, port, timeout)?;
        session
            .sock
            .connect(session.peer)
            .with_context(|| format!("udp connect to {} in {}", session.peer, ns.name()))?;
        Ok(session)
    }

    /// Sends one datagram and returns the answer, without its newline. No retry: a lost first
    /// datagram is a dataplane bug to see, not to hide. The socket is unconnected, so that an
    /// answer from the wrong source (a missing reverse translation) is reported as such instead
    /// of being filtered by the kernel into a timeout.
    pub fn ask(&mut self) -> Result<String> {
        let (peer, timeout) = (self.peer, self.timeout);
        self.sock
            .send_to(REQUEST, peer)
            .map_err(|e| exchange_error(e, "udp send to", peer, timeout))?;
        let mut buf = [0u8; 2048];
        let (n, from) = self
            .sock
            .recv_from(&mut buf)
            .map_err(|e| exchange_error(e, "udp answer from", peer, timeout))?;
        ensure!(
            from == peer,
            "udp answer for {peer} came from {from}: {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        let answer = std::str::from_utf8(&buf[..n])
            .with_context(|| format!("udp answer from {peer} is not UTF-8"))?;
        Ok(answer.trim_end_matches('\n').to_owned())
    }

    /// The client's own address (0.0.0.0 and the bound port).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.sock.local_addr()?)
    }
}

/// One request on a fresh TCP connection from `ns` to `addr:port`: the answer line.
pub fn tcp_request(
    ns: &Netns,
    addr: impl Into<IpAddr>,
    port: u16,
    timeout: Duration,
) -> Result<String> {
    TcpSession::connect(ns, addr, port, timeout)?.ask()
}

/// χ² of `counts` against the uniform distribution over `bins` bins (a bin no count names
/// counts 0).
pub fn chi_square(counts: &BTreeMap<String, usize>, bins: usize) -> f64 {
    let total: usize = counts.values().sum();
    let expected = total as f64 / bins as f64;
    let missing = bins.saturating_sub(counts.len()) as f64 * expected;
    counts
        .values()
        .map(|&o| (o as f64 - expected).powi(2) / expected)
        .sum::<f64>()
        + missing
}

/// The χ² bound above which 4 bins (3 degrees of freedom) reject uniformity at p = 1e-6. Cases
/// run on three dataplanes in every CI run, so p = 0.001 failed a sound run about once in 300
/// (it did: χ² = 17.34); a real defect is far beyond either bound — one of 4 backends given
/// half its share of 4000 alone makes χ² ≈ 250.
pub const CHI2_4_BINS_P1E6: f64 = 30.66;

/// Asserts that `counts` (answers per backend) name all 4 backends and fit a uniform
/// distribution ([`CHI2_4_BINS_P1E6`]); `what` names the sample in the failure.
pub fn assert_uniform_over_4(counts: &BTreeMap<String, usize>, what: &str) {
    let chi2 = chi_square(counts, 4);
    println!("{what}: {counts:?} chi2 = {chi2:.2}");
    assert_eq!(counts.len(), 4, "{what}: every backend answers: {counts:?}");
    assert!(
        chi2 < CHI2_4_BINS_P1E6,
        "{what}: χ² = {chi2:.2} rejects uniformity at p = 1e-6: {counts:?}"
    );
}

/// One datagram from a fresh UDP port in `ns` to `addr:port`: the answer line.
pub fn udp_request(ns: &Netns, addr: Ipv4Addr, port: u16, timeout: Duration) -> Result<String> {
    UdpSession::connect(ns, addr, port, timeout)?.ask()
}

/// `GET /` over HTTP/1.0 on a fresh connection from `ns` to `addr:port`: the body, without its
/// newline, after checking the status line.
pub fn http_get(ns: &Netns, addr: Ipv4Addr, port: u16, timeout: Duration) -> Result<String> {
    http_get_at(ns, SocketAddrV4::new(addr, port).into(), timeout)
}

/// [`http_get`] of `peer`, of either family.
pub fn http_get_at(ns: &Netns, peer: SocketAddr, timeout: Duration) -> Result<String> {
    http_get_from(ns, peer, timeout).map(|(body, _)| body)
}

/// [`http_get_at`], with the connection's own address (its port names its flow; HTTP/1.0
/// closes it both ways, FINs sent by the server and the client).
pub fn http_get_from(
    ns: &Netns,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<(String, SocketAddr)> {
    use std::io::Read as _;
    let mut stream = connect_tcp(ns, peer, timeout, "http")?;
    let local = stream.local_addr()?;
    write!(stream, "GET / HTTP/1.0\r\nHost: {peer}\r\n\r\n")
        .map_err(|e| exchange_error(e, "http send to", peer, timeout))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| exchange_error(e, "http answer from", peer, timeout))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("http answer from {peer} has no header end: {response:?}"))?;
    // An HTTP/1.1 server (nginx) answers a 1.0 request with a 1.1 status line.
    ensure!(
        ["HTTP/1.0 200 ", "HTTP/1.1 200 "]
            .iter()
            .any(|status| head.starts_with(status)),
        "http answer from {peer}: {:?}",
        head.lines().next().unwrap_or_default()
    );
    Ok((body.trim_end_matches('\n').to_owned(), local))
}

/// A TCP server on `port` of both families in a namespace (`0.0.0.0` and `[::]`, IPv6-only:
/// the namespace's `bindv6only` is set), answering every line of a connection with
/// `NAME PEER` (the client address it sees), so a long-lived connection keeps its backend in
/// view. Stops its threads and closes its connections on drop.
pub struct DualServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    conns: Answering,
}

/// A [`DualServer`]'s open connections, each with the thread answering it (for shutdown).
type Answering = Arc<Mutex<Vec<(TcpStream, JoinHandle<()>)>>>;

impl DualServer {
    pub fn start(ns: &Netns, name: &str, port: u16) -> DualServer {
        ns.sysctl("net.ipv6.bindv6only", "1").unwrap();
        let listeners = ns
            .run(|| {
                [format!("0.0.0.0:{port}"), format!("[::]:{port}")].map(|a| {
                    let l = TcpListener::bind(&a).unwrap_or_else(|e| panic!("bind {a}: {e}"));
                    l.set_nonblocking(true).unwrap();
                    l
                })
            })
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Answering = Arc::default();
        let threads = (listeners.into_iter())
            .map(|l| {
                let (stop, name, conns) = (stop.clone(), name.to_owned(), conns.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        match l.accept() {
                            Ok((s, peer)) => {
                                let (name, shut) = (name.clone(), s.try_clone().unwrap());
                                let t = std::thread::spawn(move || answer_lines(s, &name, peer));
                                conns.lock().unwrap().push((shut, t));
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(2))
                            }
                            Err(e) => panic!("{name}: accept: {e}"),
                        }
                    }
                })
            })
            .collect();
        DualServer {
            stop,
            threads,
            conns,
        }
    }
}

fn answer_lines(s: TcpStream, name: &str, peer: SocketAddr) {
    s.set_nonblocking(false).unwrap();
    let mut lines = BufReader::new(&s);
    let mut line = String::new();
    while matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
        if (&s)
            .write_all(format!("{name} {peer}\n").as_bytes())
            .is_err()
        {
            return;
        }
        line.clear();
    }
}

impl Drop for DualServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for (s, t) in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
            let _ = t.join();
        }
    }
}

/// A TCP connection from a namespace to `to`, asked many times (see [`DualServer`]).
pub struct DualSession {
    lines: BufReader<TcpStream>,
    to: SocketAddr,
}

impl DualSession {
    pub fn connect(ns: &Netns, to: SocketAddr) -> DualSession {
        let s = ns
            .run(|| TcpStream::connect_timeout(&to, TIMEOUT))
            .unwrap()
            .unwrap_or_else(|e| panic!("{to}: {e}"));
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        DualSession {
            lines: BufReader::new(s),
            to,
        }
    }

    /// The connection's own address (its source port names its flow).
    pub fn local_addr(&self) -> SocketAddr {
        self.lines.get_ref().local_addr().unwrap()
    }

    /// One request line: (backend name, the client address the backend saw).
    pub fn ask(&mut self) -> (String, SocketAddr) {
        let to = self.to;
        (self.lines.get_ref().write_all(b"hello\n")).unwrap_or_else(|e| panic!("{to}: {e}"));
        let mut line = String::new();
        (self.lines.read_line(&mut line)).unwrap_or_else(|e| panic!("{to}: {e}"));
        let (name, peer) = (line.trim_end().split_once(' '))
            .unwrap_or_else(|| panic!("{to}: not an answer: {line:?}"));
        (name.to_owned(), peer.parse().unwrap())
    }
}

/// One request on a new connection from `ns` to `to`: (backend name, the client address the
/// backend saw).
pub fn tcp_ask(ns: &Netns, to: SocketAddr) -> (String, SocketAddr) {
    DualSession::connect(ns, to).ask()
}

/// A UDP server on `[::]:port` in each backend of `topo`, answering every datagram with
/// `b<i> LEN` (the length that arrived: a datagram sent in fragments arrives whole or not at
/// all). The sockets keep their namespaces; the threads end with the test binary.
pub fn udp6_servers(topo: &Topology, port: u16) {
    for (i, ns) in topo.backends.iter().enumerate() {
        let s = ns.run(|| UdpSocket::bind(("::", port))).unwrap().unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, peer)) = s.recv_from(&mut buf) {
                let _ = s.send_to(format!("b{i} {n}").as_bytes(), peer);
            }
        });
    }
}

/// A UDP socket of `ns` connected to `to` (IPv6), answers awaited for 2 s.
pub fn udp6_client(ns: &Netns, to: SocketAddr) -> UdpSocket {
    let s = ns.run(|| UdpSocket::bind(("::", 0))).unwrap().unwrap();
    s.connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

/// `len` bytes to `s`'s peer, and its answer, or the error the socket reports instead
/// (`WouldBlock`: none within the timeout).
pub fn udp6_ask(s: &UdpSocket, len: usize) -> io::Result<String> {
    s.send(&vec![0x5a; len])?;
    let mut buf = [0u8; 256];
    let n = s.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Every kind of request from the client of `topo` goes unanswered (a forward rule drops it):
/// TCP to `vip:port` and UDP to `vip:port + 1`, TCP to the node's `published` and UDP to
/// `published + 1`; `by` names the dataplane in the failure.
pub fn all_dropped(topo: &Topology, vip: Ipv4Addr, port: u16, published: u16, by: &str) {
    let short = Duration::from_millis(700);
    for (what, r) in [
        ("tcp VIP", tcp_request(&topo.client, vip, port, short)),
        ("udp VIP", udp_request(&topo.client, vip, port + 1, short)),
        (
            "tcp published",
            tcp_request(&topo.client, topo.node_ip, published, short),
        ),
        (
            "udp published",
            udp_request(&topo.client, topo.node_ip, published + 1, short),
        ),
    ] {
        assert!(
            r.is_err(),
            "{by}: {what}: the forward rule drops the client, got {r:?}"
        );
    }
}
