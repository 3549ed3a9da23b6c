//! ICMP errors about tracked flows (e.g. "fragmentation needed", which PMTU discovery depends
//! on), translated like a packet of the opposite direction of the flow they quote.
//!
//! The quoted packet went one way, so the error travels the other: at this hook, the entry
//! that translates the error is keyed by the quoted tuple reversed. That entry rewrites the
//! error's own direction to its tuple; the quoted packet becomes that tuple reversed (its
//! addresses, ports, quoted IP checksum and, over all of them, the ICMP checksum), and the
//! outer addresses that are the quoted ones follow. The quoted L4 checksum is left alone: the
//! quote may be truncated, and no receiver checks it.
use lb_common::{
    FLOW_EGRESS, Reason,
    csum::{IP_DADDR, IP_SADDR, Width, set_addr},
    flow::{reversed, rewritten},
};

use crate::{
    conntrack::{self, Found},
    nat::{Ctx, Verdict},
    parse::{IcmpError, L3_OFF},
};

/// Offset of the ICMP checksum in its header.
const ICMP_CSUM: usize = 2;

#[inline(always)]
pub fn translate<C: Ctx>(ctx: &C, hook: u32, e: &IcmpError, egress: bool) -> Verdict {
    let now = conntrack::now();
    let entry = match conntrack::find(&reversed(&e.inner), now, hook) {
        // SAFETY: map value copied out.
        Found::Live(t) => unsafe { *t },
        Found::Absent => return Verdict::Pass(Reason::NotService),
    };
    if (entry.flags & FLOW_EGRESS != 0) != egress {
        return Verdict::Pass(Reason::NotService);
    }
    let q = &e.inner;
    let to = reversed(&rewritten(&entry, q.proto));
    if quoted(
        ctx,
        e,
        e.inner_l3_off + IP_SADDR,
        0,
        q.saddr,
        to.saddr,
        q.sport,
        to.sport,
    )
    .and_then(|_| {
        quoted(
            ctx,
            e,
            e.inner_l3_off + IP_DADDR,
            2,
            q.daddr,
            to.daddr,
            q.dport,
            to.dport,
        )
    })
    .and_then(|_| outer(ctx, e, q.daddr, to.daddr, q.saddr, to.saddr))
    .is_none()
    {
        return Verdict::Drop(Reason::Malformed);
    }
    Verdict::Translated
}

/// Rewrites one side (address at `addr_off`, port at quoted L4 + `port`) of the quoted packet.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn quoted<C: Ctx>(
    ctx: &C,
    e: &IcmpError,
    addr_off: usize,
    port: usize,
    old_addr: u32,
    new_addr: u32,
    old_port: u16,
    new_port: u16,
) -> Option<()> {
    let icmp_csum = e.outer.l4_off + ICMP_CSUM;
    if old_addr != new_addr {
        let inner_csum = e.inner_l3_off + 10;
        let before = ctx.load16(inner_csum)?;
        ctx.ip_csum(inner_csum, old_addr, new_addr, Width::W32)?;
        let after = ctx.load16(inner_csum)?;
        ctx.plain_csum(icmp_csum, old_addr, new_addr, Width::W32)?;
        ctx.plain_csum(icmp_csum, before.into(), after.into(), Width::W16)?;
        ctx.store32(addr_off, new_addr, false)?;
    }
    if old_port != new_port {
        ctx.plain_csum(icmp_csum, old_port.into(), new_port.into(), Width::W16)?;
        ctx.store16(e.inner_l4_off + port, new_port, false)?;
    }
    Some(())
}

/// The error's own addresses that are the quoted packet's: an error from the quoted
/// destination (the backend, or the client) takes its new address as source, and the quoted
/// source, to which the error goes, its new address as destination.
#[inline(always)]
fn outer<C: Ctx>(
    ctx: &C,
    e: &IcmpError,
    quoted_dst: u32,
    new_dst: u32,
    quoted_src: u32,
    new_src: u32,
) -> Option<()> {
    let k = &e.outer.key;
    let l4 = e.outer.l4;
    if k.saddr == quoted_dst {
        set_addr(ctx, L3_OFF, l4, L3_OFF + IP_SADDR, k.saddr, new_dst)?;
    }
    if k.daddr == quoted_src {
        set_addr(ctx, L3_OFF, l4, L3_OFF + IP_DADDR, k.daddr, new_src)?;
    }
    Some(())
}
