//! Socket-level balancing of the network namespace's own processes: the node itself (and
//! whatever shares its namespace) reaching a VIP or a published port, `127.0.0.1` and `[::1]`
//! included, over IPv4 and IPv6 (an IPv6 socket reaching IPv4 by a v4-mapped address is
//! balanced as an IPv4 one: the kernel runs the IPv6 hooks for it).
//! Their packets never arrive by the network's interfaces, so the TC and XDP programs never
//! see them addressed to the service; instead the socket is sent to a backend where it is
//! addressed (connect, and each send of an unconnected UDP socket), as Cilium's socket LB
//! does, and what the socket is told about its peer is the service again (each receive of a
//! UDP socket, `getpeername`). No packet is translated and no flow is tracked: the backend
//! sees the node's own address, as the kernel's NAT at output shows it after masquerade.
//!
//! Contracts:
//! - The programs hang on a cgroup (the cgroup2 root), which reaches every process in every
//!   namespace: only sockets of the namespace recorded in `lb_sock` are touched; every other
//!   socket, and every socket while the record is unwritten, is left exactly as it came.
//! - They never refuse: every return is "allow" (a sock_addr program returning 0 would fail
//!   the process's call with EPERM).
//! - The backend is chosen by the socket's cookie and the service ([`hash::sock_hash`]) over
//!   the same buckets as a flow's, so one socket sticks to one backend per service while the
//!   set is unchanged, and `lb elements`' partition holds for sockets too.
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use lb_common::{
    Addr6, FlowKeyOf, HOOK_SOCK, IPPROTO_TCP, IPPROTO_UDP, Reason, SockRev, SockRev6, SockRevKey,
    SockRevKey6, hash,
};

use crate::{
    family::Inet,
    lb,
    maps::{CONFIG, SOCK, SOCK_REV, SOCK_REV6},
    stats,
};

/// A sock_addr program's only verdict here: let the call proceed.
pub const ALLOW: i32 = 1;

/// Whether `ctx`'s socket belongs to the network's namespace.
#[inline(always)]
fn ours(ctx: &SockAddrContext) -> bool {
    let Some(cfg) = SOCK.get(0) else {
        return false;
    };
    // SAFETY: the helper reads the socket's namespace from the program's own context.
    cfg.netns_cookie != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == cfg.netns_cookie
}

/// The address and port a connect or send is for (or a receive is from, or the peer is),
/// and the socket's protocol. The context's fields are read whole, as the verifier allows
/// (the port is in network order in the low half of its word).
#[inline(always)]
fn read4(ctx: &SockAddrContext) -> (u32, u16, u8) {
    let sa = ctx.sock_addr;
    // SAFETY: sa is the program's context; each field is read at its full width.
    unsafe {
        (
            read_volatile(addr_of!((*sa).user_ip4)),
            read_volatile(addr_of!((*sa).user_port)) as u16,
            read_volatile(addr_of!((*sa).protocol)) as u8,
        )
    }
}

/// [`read4`] of an IPv6 socket's address (a word at a time, as the verifier allows).
#[inline(always)]
fn read6(ctx: &SockAddrContext) -> (Addr6, u16, u8) {
    let sa = ctx.sock_addr;
    let mut addr = [0u32; 4];
    // SAFETY: as in `read4`.
    unsafe {
        for (i, w) in addr.iter_mut().enumerate() {
            *w = read_volatile(addr_of!((*sa).user_ip6[i]));
        }
        (
            addr,
            read_volatile(addr_of!((*sa).user_port)) as u16,
            read_volatile(addr_of!((*sa).protocol)) as u8,
        )
    }
}

#[inline(always)]
fn write4(ctx: &SockAddrContext, addr: u32, port: u16) {
    let sa = ctx.sock_addr;
    // SAFETY: as in `read4`; both fields are writable in every hook these programs run at.
    unsafe {
        write_volatile(addr_of_mut!((*sa).user_ip4), addr);
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(port));
    }
}

#[inline(always)]
fn write6(ctx: &SockAddrContext, addr: &Addr6, port: u16) {
    let sa = ctx.sock_addr;
    // SAFETY: as in `write4`.
    unsafe {
        for (i, w) in addr.iter().enumerate() {
            write_volatile(addr_of_mut!((*sa).user_ip6[i]), *w);
        }
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(port));
    }
}

/// Word 2 of a v4-mapped IPv6 address (`::ffff:a.b.c.d`), as it stands in memory.
const MAPPED: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The IPv4 address an IPv6 socket reaches by a v4-mapped address, which the kernel sends
/// over IPv4 (a dual-stack socket's way to IPv4): balanced as an IPv4 socket's is.
#[inline(always)]
fn mapped(addr: &Addr6) -> Option<u32> {
    (addr[0] == 0 && addr[1] == 0 && addr[2] == MAPPED).then_some(addr[3])
}

/// What the socket programs keep of each family: where a socket was sent instead of the
/// service, to show the service again in its answers.
trait SockRevMap: Inet {
    fn remember(cookie: u64, backend: Self, port: u16, service: Self, service_port: u16);
    fn recall(cookie: u64, addr: Self, port: u16) -> Option<(Self, u16)>;
}

impl SockRevMap for u32 {
    #[inline(always)]
    fn remember(cookie: u64, backend: u32, port: u16, service: u32, service_port: u16) {
        let key = SockRevKey {
            cookie,
            addr: backend,
            port,
            _pad: 0,
        };
        let rev = SockRev {
            addr: service,
            port: service_port,
            _pad: 0,
        };
        // A full map evicts its oldest socket instead of failing.
        let _ = SOCK_REV.insert(&key, &rev, 0);
    }
    #[inline(always)]
    fn recall(cookie: u64, addr: u32, port: u16) -> Option<(u32, u16)> {
        let key = SockRevKey {
            cookie,
            addr,
            port,
            _pad: 0,
        };
        // SAFETY: plain data copied out.
        unsafe { SOCK_REV.get(&key) }.map(|r| (r.addr, r.port))
    }
}

impl SockRevMap for Addr6 {
    #[inline(always)]
    fn remember(cookie: u64, backend: Addr6, port: u16, service: Addr6, service_port: u16) {
        let key = SockRevKey6 {
            cookie,
            addr: backend,
            port,
            ..Default::default()
        };
        let rev = SockRev6 {
            addr: service,
            port: service_port,
            _pad: 0,
        };
        let _ = SOCK_REV6.insert(&key, &rev, 0);
    }
    #[inline(always)]
    fn recall(cookie: u64, addr: Addr6, port: u16) -> Option<(Addr6, u16)> {
        let key = SockRevKey6 {
            cookie,
            addr,
            port,
            ..Default::default()
        };
        // SAFETY: plain data copied out.
        unsafe { SOCK_REV6.get(&key) }.map(|r| (r.addr, r.port))
    }
}

/// connect (TCP, UDP) and sendmsg (unconnected UDP) of an IPv4 socket.
#[inline(always)]
pub fn forward4(ctx: &SockAddrContext) -> i32 {
    if ours(ctx) {
        let (addr, port, proto) = read4(ctx);
        forward(ctx, addr, port, proto, |a, p| write4(ctx, a, p));
    }
    ALLOW
}

/// connect and sendmsg of an IPv6 socket: to an IPv6 service, or by a v4-mapped address to
/// an IPv4 one (the backend's address given v4-mapped too).
#[inline(always)]
pub fn forward6(ctx: &SockAddrContext) -> i32 {
    if ours(ctx) {
        let (addr, port, proto) = read6(ctx);
        match mapped(&addr) {
            Some(v4) => forward(ctx, v4, port, proto, |a, p| {
                write6(ctx, &[0, 0, MAPPED, a], p)
            }),
            None => forward(ctx, addr, port, proto, |a, p| write6(ctx, &a, p)),
        }
    }
    ALLOW
}

/// recvmsg (UDP) and getpeername of an IPv4 socket.
#[inline(always)]
pub fn reverse4(ctx: &SockAddrContext) -> i32 {
    if ours(ctx) {
        let (addr, port, _) = read4(ctx);
        reverse(ctx, addr, port, |a, p| write4(ctx, a, p));
    }
    ALLOW
}

/// recvmsg and getpeername of an IPv6 socket (a v4-mapped peer is an IPv4 socket's).
#[inline(always)]
pub fn reverse6(ctx: &SockAddrContext) -> i32 {
    if ours(ctx) {
        let (addr, port, _) = read6(ctx);
        match mapped(&addr) {
            Some(v4) => reverse(ctx, v4, port, |a, p| write6(ctx, &[0, 0, MAPPED, a], p)),
            None => reverse(ctx, addr, port, |a, p| write6(ctx, &a, p)),
        }
    }
    ALLOW
}

/// A connect or send to `daddr:dport`: a VIP, or a published port on one of the node's
/// addresses or its `host_ip`, becomes the backend the socket's hash gives (`write` gives it
/// to the socket in its own family's form); the service's address is remembered for the
/// answers. A service with no backend is left to the stack, as at ingress (a VIP's alias
/// refuses the connection). A connect to `0.0.0.0` or `[::]`, which the kernel takes for the
/// node itself, finds the ports published on every node address, as the node would answer
/// it (a packet to it never does: `nat`).
#[inline(always)]
fn forward<A: SockRevMap>(
    ctx: &SockAddrContext,
    daddr: A,
    dport: u16,
    proto: u8,
    write: impl FnOnce(A, u16),
) {
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP || lb::no_service_at(&daddr) {
        return;
    }
    let key = FlowKeyOf {
        daddr,
        dport,
        proto,
        ..Default::default()
    };
    let Some(svc) = lb::service_for(&key) else {
        return;
    };
    let Some(cfg) = CONFIG.get(0) else {
        return;
    };
    // SAFETY: the helper reads the socket's cookie from the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let h = hash::sock_hash(cookie, daddr.hash_word(), dport, proto, cfg.hash_key);
    let Some(backend) = lb::backend_for::<A>(h, &svc) else {
        stats::reason(HOOK_SOCK, Reason::NoBackend);
        return;
    };
    let port = if backend.port != 0 {
        backend.port
    } else {
        dport
    };
    // Remembered before the socket is sent on, so no answer can arrive unexplained.
    A::remember(cookie, backend.addr, port, daddr, dport);
    write(backend.addr, port);
    stats::reason(HOOK_SOCK, Reason::SockTranslated);
}

/// An answer from (or a peer that is) `addr:port`, the backend a socket was sent to, shows
/// the service's address and port instead.
#[inline(always)]
fn reverse<A: SockRevMap>(ctx: &SockAddrContext, addr: A, port: u16, write: impl FnOnce(A, u16)) {
    // SAFETY: as in `forward`.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some((addr, port)) = A::recall(cookie, addr, port) {
        write(addr, port);
        stats::reason(HOOK_SOCK, Reason::SockReversed);
    }
}
