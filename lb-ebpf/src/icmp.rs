//! ICMP and ICMPv6 errors about tracked flows (e.g. "fragmentation needed" and "packet too
//! big", which path MTU discovery depends on), translated like a packet of the opposite
//! direction of the flow they quote.
//!
//! The quoted packet went one way, so the error travels the other: at this hook, the entry
//! that translates the error is keyed by the quoted tuple reversed. That entry rewrites the
//! error's own direction to its tuple; the quoted packet becomes that tuple reversed (its
//! addresses, ports, IPv4's quoted header checksum and, over all of them, the ICMP checksum),
//! and the outer addresses that are the quoted ones follow (which ICMPv6's checksum covers
//! too, by its pseudo-header). The quoted L4 checksum is left alone: the quote may be
//! truncated, and no receiver checks it.
use lb_common::{
    FLOW_EGRESS, FlowKeyOf, Reason,
    csum::{IP_CSUM, Width, set_addr},
    flow::{reversed, rewritten},
};

use crate::{
    conntrack::{self, Found},
    family::Inet,
    parse::{IcmpError, L3_OFF},
    room::Room,
    verdict::{Ctx, Verdict},
};

/// Offset of the checksum in an ICMP or ICMPv6 header.
const ICMP_CSUM: usize = 2;

/// Translates the error `e` at `hook` by the entry of the flow it quotes, in `room` (its
/// `key`: the entry's key; `entry`; `other_key`: the tuple the quote becomes).
#[inline(always)]
pub fn translate<C: Ctx, A: Inet>(
    ctx: &C,
    hook: u32,
    e: &IcmpError<FlowKeyOf<A>>,
    egress: bool,
    room: &mut Room<A>,
) -> Verdict {
    let now = conntrack::now();
    room.key = reversed(&e.inner);
    let Found::Live(t) = conntrack::find(&room.key, now, hook) else {
        return Verdict::Pass(Reason::NotService);
    };
    // SAFETY: map value copied out.
    unsafe { conntrack::copy_entry(t, &mut room.entry) };
    if (room.entry.flags & FLOW_EGRESS != 0) != egress {
        return Verdict::Pass(Reason::NotService);
    }
    let q = &e.inner;
    room.other_key = reversed(&rewritten(&room.entry, q.proto));
    let to = &room.other_key;
    let (src, dst) = (e.inner_l3_off + A::SADDR, e.inner_l3_off + A::DADDR);
    if quoted(ctx, e, src, 0, (&q.saddr, &to.saddr), (q.sport, to.sport))
        .and_then(|_| quoted(ctx, e, dst, 2, (&q.daddr, &to.daddr), (q.dport, to.dport)))
        .and_then(|_| outer(ctx, e, (&q.daddr, &to.daddr), (&q.saddr, &to.saddr)))
        .is_none()
    {
        return Verdict::Drop(Reason::Malformed);
    }
    Verdict::Translated
}

/// Rewrites one side (address at `addr_off`, port at quoted L4 + `port`) of the quoted packet
/// from `addr.0`, `ports.0` to `addr.1`, `ports.1`.
#[inline(always)]
fn quoted<C: Ctx, A: Inet>(
    ctx: &C,
    e: &IcmpError<FlowKeyOf<A>>,
    addr_off: usize,
    port: usize,
    addr: (&A, &A),
    ports: (u16, u16),
) -> Option<()> {
    let icmp_csum = e.outer.l4_off + ICMP_CSUM;
    for i in 0..A::WORDS {
        let (old, new) = (addr.0.word(i), addr.1.word(i));
        if old == new {
            continue;
        }
        if A::V4 {
            let inner_csum = e.inner_l3_off + IP_CSUM;
            let before = ctx.load16(inner_csum)?;
            ctx.ip_csum(inner_csum, old, new, Width::W32)?;
            let after = ctx.load16(inner_csum)?;
            ctx.plain_csum(icmp_csum, before.into(), after.into(), Width::W16)?;
        }
        ctx.plain_csum(icmp_csum, old, new, Width::W32)?;
        ctx.store32(addr_off + 4 * i, new, false)?;
    }
    if ports.0 != ports.1 {
        ctx.plain_csum(icmp_csum, ports.0.into(), ports.1.into(), Width::W16)?;
        ctx.store16(e.inner_l4_off + port, ports.1, false)?;
    }
    Some(())
}

/// The error's own addresses that are the quoted packet's: an error from the quoted
/// destination (the backend, or the client) takes its new address as source, and the quoted
/// source, to which the error goes, its new address as destination.
#[inline(always)]
fn outer<C: Ctx, A: Inet>(
    ctx: &C,
    e: &IcmpError<FlowKeyOf<A>>,
    quoted_dst: (&A, &A),
    quoted_src: (&A, &A),
) -> Option<()> {
    let k = &e.outer.key;
    let l4 = e.outer.l4;
    if k.saddr == *quoted_dst.0 {
        set_addr(ctx, L3_OFF, l4, L3_OFF + A::SADDR, k.saddr, *quoted_dst.1)?;
    }
    if k.daddr == *quoted_src.0 {
        set_addr(ctx, L3_OFF, l4, L3_OFF + A::DADDR, k.daddr, *quoted_src.1)?;
    }
    Some(())
}
