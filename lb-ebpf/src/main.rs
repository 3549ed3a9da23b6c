//! Entry points of the `lb` dataplane; the journey of a packet is in [`nat`], that of the
//! node's own sockets in [`sock`]. Each entry point runs one path, counts its outcome
//! (`lb_reasons`) and turns it into the hook's verdict. What is not ours passes untouched
//! (`TC_ACT_UNSPEC` lets other TC programs run after us). A path drops only what it cannot
//! deliver right (`Verdict::Drop` and its reason): a flow the kernel's NAT would drop too (no
//! unique tuple, no free masquerade port), a DSR VIP's frame with no backend or no resolved
//! backend MAC, and a frame found malformed halfway through its rewrite (never sent on half
//! translated). No socket call is refused.
#![no_std]
#![no_main]

mod conntrack;
mod csum;
mod dsr;
mod family;
mod frag;
mod icmp;
mod lb;
mod maps;
mod nat;
mod parse;
mod redirect;
mod room;
mod snat;
mod sock;
mod stats;
mod verdict;

use aya_ebpf::{
    EbpfContext,
    bindings::{TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC, xdp_action},
    btf_maps::ProgramArray,
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
};
use family::Inet;
use lb_common::{Addr6, HOOK_TC_EGRESS, HOOK_TC_INGRESS, HOOK_TC_REPLY, HOOK_XDP, Reason};
use parse::Family;
use verdict::Verdict;

/// Ingress fast path (`attach xdp`): DNAT of what it can prove it rewrites right, and DSR
/// (sent back out, or to the device the backend is on), before an skb exists. Frags-aware,
/// so a multi-buffer frame (a GRO'd or jumbo one) reaches it instead of being dropped. The
/// TC ingress program is attached beside it for the rest. Each hook's program serves IPv4
/// and tail-calls its IPv6 twin (`lb_xdp6`, ...) for an IPv6 frame (`maps::JUMP6_XDP`, `maps::JUMP6_TC`).
#[xdp(frags)]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let ctx = parse::Xdp(ctx);
    match parse::family(&ctx) {
        Ok(Family::V4) => xdp::<u32>(&ctx),
        Ok(Family::V6) => {
            jump6(&maps::JUMP6_XDP, &ctx.0, HOOK_XDP);
            xdp_action::XDP_PASS
        }
        Err(r) => {
            stats::reason(HOOK_XDP, r);
            xdp_action::XDP_PASS
        }
    }
}

/// `lb_xdp` for an IPv6 frame.
#[xdp(frags)]
pub fn lb_xdp6(ctx: XdpContext) -> u32 {
    xdp::<Addr6>(&parse::Xdp(ctx))
}

#[inline(always)]
fn xdp<A: Inet>(ctx: &parse::Xdp) -> u32 {
    match nat::finish(HOOK_XDP, nat::ingress::<_, A>(ctx, HOOK_XDP, true)) {
        Verdict::Translated => {
            nat::xdp_handoff::<A>(ctx);
            xdp_action::XDP_PASS
        }
        Verdict::Pass(_) | Verdict::Redirect(_) => xdp_action::XDP_PASS,
        Verdict::Drop(_) => xdp_action::XDP_DROP,
        Verdict::Dsr { ifindex, .. } => dsr::xdp_action(ctx, ifindex),
    }
}

/// Ingress on the skb (`attach tc`, and beside XDP for what XDP leaves). A translated
/// packet, here or by XDP, takes the fast path where it may (`redirect`): the helper that
/// delivers into a veth's peer exists at TC ingress only. A DSR frame is redirected to its
/// device's egress.
#[classifier]
pub fn lb_tc_ingress(ctx: TcContext) -> i32 {
    let ctx = parse::Skb(ctx);
    match parse::family(&ctx) {
        Ok(Family::V4) => tc_ingress::<u32>(&ctx),
        Ok(Family::V6) => {
            jump6(&maps::JUMP6_TC, &ctx.0, HOOK_TC_INGRESS);
            TC_ACT_UNSPEC
        }
        Err(r) => tc(nat::finish(HOOK_TC_INGRESS, Verdict::Pass(r))),
    }
}

/// `lb_tc_ingress` for an IPv6 frame.
#[classifier]
pub fn lb_tc_ingress6(ctx: TcContext) -> i32 {
    tc_ingress::<Addr6>(&parse::Skb(ctx))
}

#[inline(always)]
fn tc_ingress<A: Inet>(ctx: &parse::Skb) -> i32 {
    if let Some(judged) = nat::translated_by_xdp(ctx) {
        // Counted by XDP already; only the hand-over is this run's.
        return match nat::forward::<A>(ctx, Some(judged)) {
            Some(action) => {
                stats::reason(HOOK_TC_INGRESS, Reason::Redirected);
                action
            }
            None => TC_ACT_UNSPEC,
        };
    }
    let v = match nat::ingress::<_, A>(ctx, HOOK_TC_INGRESS, false) {
        Verdict::Translated => {
            nat::forward::<A>(ctx, None).map_or(Verdict::Translated, Verdict::Redirect)
        }
        v => v,
    };
    tc(nat::finish(HOOK_TC_INGRESS, v))
}

/// Ingress of the node's end of a local backend's veth, attached while the network's fast
/// path is on: replies go straight back to their clients.
#[classifier]
pub fn lb_tc_reply(ctx: TcContext) -> i32 {
    let ctx = parse::Skb(ctx);
    let v = match parse::family(&ctx) {
        Ok(Family::V4) => nat::reply::<u32>(&ctx, HOOK_TC_REPLY),
        Ok(Family::V6) => {
            jump6(&maps::JUMP6_TC, &ctx.0, HOOK_TC_REPLY);
            return TC_ACT_UNSPEC;
        }
        Err(r) => Verdict::Pass(r),
    };
    tc(nat::finish(HOOK_TC_REPLY, v))
}

/// `lb_tc_reply` for an IPv6 frame.
#[classifier]
pub fn lb_tc_reply6(ctx: TcContext) -> i32 {
    let ctx = parse::Skb(ctx);
    tc(nat::finish(
        HOOK_TC_REPLY,
        nat::reply::<Addr6>(&ctx, HOOK_TC_REPLY),
    ))
}

/// Egress, always attached: reverse NAT of replies and masquerade.
#[classifier]
pub fn lb_tc_egress(ctx: TcContext) -> i32 {
    let ctx = parse::Skb(ctx);
    let v = match parse::family(&ctx) {
        Ok(Family::V4) => nat::egress::<u32>(&ctx, HOOK_TC_EGRESS),
        Ok(Family::V6) => {
            jump6(&maps::JUMP6_TC, &ctx.0, HOOK_TC_EGRESS);
            return TC_ACT_UNSPEC;
        }
        Err(r) => Verdict::Pass(r),
    };
    tc(nat::finish(HOOK_TC_EGRESS, v))
}

/// `lb_tc_egress` for an IPv6 frame.
#[classifier]
pub fn lb_tc_egress6(ctx: TcContext) -> i32 {
    let ctx = parse::Skb(ctx);
    tc(nat::finish(
        HOOK_TC_EGRESS,
        nat::egress::<Addr6>(&ctx, HOOK_TC_EGRESS),
    ))
}

/// Runs the IPv6 program of `hook` (slot `hook` of `jump`, `maps::JUMP6_*`): returns only when
/// the slot is empty (the controller fills every slot before it attaches anything), and then
/// counts the frame as passed.
#[inline(always)]
fn jump6<C: EbpfContext, const N: usize>(jump: &ProgramArray<N>, ctx: &C, hook: u32) {
    // SAFETY: a tail call either never returns or leaves this run as it was.
    unsafe { jump.tail_call(ctx, hook) };
    stats::reason(hook, Reason::NotService);
}

/// connect() of the network namespace's TCP and UDP sockets (socket-level balancing, on the
/// cgroup2 root).
#[cgroup_sock_addr(connect4)]
pub fn lb_connect4(ctx: SockAddrContext) -> i32 {
    sock::forward4(&ctx)
}

/// sendmsg() of its unconnected UDP sockets.
#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::forward4(&ctx)
}

/// recvmsg() of its UDP sockets: the answer's source.
#[cgroup_sock_addr(recvmsg4)]
pub fn lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse4(&ctx)
}

/// getpeername() of its sockets.
#[cgroup_sock_addr(getpeername4)]
pub fn lb_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse4(&ctx)
}

/// The four for IPv6 sockets.
#[cgroup_sock_addr(connect6)]
pub fn lb_connect6(ctx: SockAddrContext) -> i32 {
    sock::forward6(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn lb_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::forward6(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn lb_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::reverse6(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn lb_getpeername6(ctx: SockAddrContext) -> i32 {
    sock::reverse6(&ctx)
}

#[inline(always)]
fn tc(v: Verdict) -> i32 {
    match v {
        Verdict::Translated => TC_ACT_OK,
        Verdict::Redirect(action) => action,
        Verdict::Pass(_) => TC_ACT_UNSPEC,
        Verdict::Drop(_) => TC_ACT_SHOT as i32,
        // Produced at ingress only (`dsr`).
        Verdict::Dsr { ifindex, .. } => dsr::tc_action(ifindex),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // No path the verifier accepts can reach a panic (there is no unwinding in BPF); telling
    // the compiler so keeps the unreachable code out of the object.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
