//! Entry points of the `lb` dataplane. Each is one line that calls a `try_` function returning
//! `Result`, so what a program does on an unexpected error is decided here and nowhere else:
//! pass the packet to the stack, never drop traffic the balancer does not understand.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{TC_ACT_OK, xdp_action},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

#[xdp]
pub fn lb_xdp(ctx: XdpContext) -> u32 {
    try_lb_xdp(&ctx).unwrap_or(xdp_action::XDP_PASS)
}

#[classifier]
pub fn lb_tc_ingress(ctx: TcContext) -> i32 {
    try_lb_tc(&ctx).unwrap_or(TC_ACT_OK)
}

#[classifier]
pub fn lb_tc_egress(ctx: TcContext) -> i32 {
    try_lb_tc(&ctx).unwrap_or(TC_ACT_OK)
}

// The foundation passes every packet; the NAT dataplane fills these in.
fn try_lb_xdp(_ctx: &XdpContext) -> Result<u32, ()> {
    Ok(xdp_action::XDP_PASS)
}

fn try_lb_tc(_ctx: &TcContext) -> Result<i32, ()> {
    Ok(TC_ACT_OK)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach here; there is no unwinding in BPF.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
