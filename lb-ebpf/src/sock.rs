//! Socket-level balancing of the network namespace's own processes: the node itself (and
//! whatever shares its namespace) reaching a VIP or a published port, `127.0.0.1` included.
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
use lb_common::{FlowKey, HOOK_SOCK, IPPROTO_TCP, IPPROTO_UDP, Reason, SockRev, SockRevKey, hash};

use crate::{
    lb,
    maps::{CONFIG, SOCK, SOCK_REV},
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
fn read(ctx: &SockAddrContext) -> (u32, u16, u8) {
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

#[inline(always)]
fn write(ctx: &SockAddrContext, addr: u32, port: u16) {
    let sa = ctx.sock_addr;
    // SAFETY: as in `read`; both fields are writable in every hook these programs run at.
    unsafe {
        write_volatile(addr_of_mut!((*sa).user_ip4), addr);
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(port));
    }
}

/// connect (TCP, UDP) and sendmsg (unconnected UDP): a VIP, or a published port on one of
/// the node's addresses or its `host_ip`, becomes the backend the socket's hash gives; the
/// service's address is remembered for the answers. A service with no backend is left to
/// the stack, as at ingress (a VIP's alias refuses the connection).
#[inline(always)]
pub fn forward(ctx: &SockAddrContext) -> i32 {
    if !ours(ctx) {
        return ALLOW;
    }
    let (daddr, dport, proto) = read(ctx);
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return ALLOW;
    }
    let key = FlowKey {
        daddr,
        dport,
        proto,
        ..Default::default()
    };
    let Some(svc) = lb::service_for(&key) else {
        return ALLOW;
    };
    let Some(cfg) = CONFIG.get(0) else {
        return ALLOW;
    };
    // SAFETY: the helper reads the socket's cookie from the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let h = hash::sock_hash(cookie, daddr, dport, proto, cfg.hash_key);
    let Some(backend) = lb::backend_for(h, &svc) else {
        stats::reason(HOOK_SOCK, Reason::NoBackend);
        return ALLOW;
    };
    let port = if backend.port != 0 {
        backend.port
    } else {
        dport
    };
    let rk = SockRevKey {
        cookie,
        addr: backend.addr,
        port,
        _pad: 0,
    };
    let rev = SockRev {
        addr: daddr,
        port: dport,
        _pad: 0,
    };
    // Remembered before the socket is sent on, so no answer can arrive unexplained. A full
    // map evicts its oldest socket instead of failing.
    let _ = SOCK_REV.insert(&rk, &rev, 0);
    write(ctx, backend.addr, port);
    stats::reason(HOOK_SOCK, Reason::SockTranslated);
    ALLOW
}

/// recvmsg (UDP) and getpeername: an answer from (or a peer that is) the backend a socket
/// was sent to shows the service's address and port instead.
#[inline(always)]
pub fn reverse(ctx: &SockAddrContext) -> i32 {
    if !ours(ctx) {
        return ALLOW;
    }
    let (addr, port, _) = read(ctx);
    let key = SockRevKey {
        // SAFETY: as in `forward`.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr,
        port,
        _pad: 0,
    };
    // SAFETY: plain data copied out.
    if let Some(rev) = unsafe { SOCK_REV.get(&key) }.copied() {
        write(ctx, rev.addr, rev.port);
        stats::reason(HOOK_SOCK, Reason::SockReversed);
    }
    ALLOW
}
