//! Entry points of the `lb` dataplane; the journey of a packet is in [`nat`]. Each entry point
//! is one line around a function returning `Option`: `None` means "not ours, or not
//! translatable" and the packet goes on to the stack untouched. The balancer never drops
//! traffic it does not understand.
#![no_std]
#![no_main]

mod conntrack;
mod csum;
mod maps;
mod nat;
mod parse;
mod stats;

use aya_ebpf::{
    bindings::{TC_ACT_OK, xdp_action},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

/// Ingress fast path (`attach xdp`): DNAT of new and tracked flows before an skb exists.
#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    let _ = nat::ingress(&ctx);
    xdp_action::XDP_PASS
}

/// Ingress (`attach tc`): the same path as [`lb_xdp`], on the skb.
#[classifier]
pub fn lb_tc_ingress(ctx: TcContext) -> i32 {
    let _ = nat::ingress(&ctx);
    TC_ACT_OK
}

/// Egress, always attached: reverse NAT of replies and masquerade.
#[classifier]
pub fn lb_tc_egress(ctx: TcContext) -> i32 {
    let _ = nat::egress(&ctx);
    TC_ACT_OK
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
