//! The NAT packet paths (DESIGN.md "Packet paths", NAT mode) and the rewrite of a packet by a
//! flow entry. A DSR VIP's packets leave the ingress path for `dsr` where their service is
//! found.
//!
//! Ingress (XDP, TC ingress) rewrites destinations: a new flow to a service gets a backend
//! (`lb`), a tracked flow follows its entry, a reply to a masqueraded flow gets its client
//! back. Egress (TC) rewrites sources: replies get the service address back, and a flow that
//! must be masqueraded gets the node's address and a claimed port (`snat`). Rewriting sources
//! only on egress is forced: a packet whose source is one of the node's own addresses is
//! dropped as martian when it is routed on input.
use aya_ebpf::helpers::bpf_xdp_adjust_meta;
use lb_common::{
    Config, FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, FlowKeyOf, FlowOf, HOOK_TC_INGRESS, HOOK_XDP,
    Reason, SERVICE_DSR,
    csum::{L4Sum, set_addr, set_ports},
    flow,
};

use crate::{
    conntrack::{self, Found},
    csum::{self, SumChunk},
    dsr,
    family::Inet,
    frag, icmp, lb,
    maps::CONFIG,
    parse::{Frag, Frame, L3_OFF, Packet, Parsed, Skb, Xdp},
    redirect::{self, Towards},
    room::{Room, Slot},
    snat, stats,
    verdict::{Ctx, Verdict},
};

#[inline(always)]
fn config() -> Option<&'static Config> {
    CONFIG.get(0)
}

/// Whether XDP may rewrite `p` itself. XDP cannot see whether the L4 checksum is a full one or
/// a CHECKSUM_PARTIAL seed (a local sender with offload on a veth), and the two need different
/// updates. A partial checksum always equals the seed, so a field that differs from it is full
/// and XDP rewrites the packet; one that equals it is left to the TC program attached beside
/// XDP, which the kernel's helpers let see the truth. Fragments are never partial (the stack
/// computes checksums before it fragments). SCTP and ICMP carry no inet L4 sum to get wrong.
#[inline(always)]
pub fn xdp_can_rewrite<K>(p: &Packet<K>) -> bool {
    match p.l4 {
        L4Sum::Tcp(_) | L4Sum::Udp(_) => p.frag != Frag::Whole || p.check != p.seed,
        L4Sum::Sctp { .. } | L4Sum::Icmp6(_) | L4Sum::None => true,
    }
}

/// What every path run starts from: the network's config, and the hook's slot with the frame
/// parsed into it as one of family `A`; otherwise the verdict the run ends with (not ours, or
/// refused by the parser with its reason).
#[inline(always)]
fn parsed<C: Frame, A: Inet>(
    ctx: &C,
    hook: u32,
) -> Result<(&'static Config, &'static mut Slot<A>), Verdict> {
    let cfg = config().ok_or(Verdict::Pass(Reason::NotService))?;
    Ok((cfg, parse_into::<C, A>(ctx, hook)?))
}

/// The hook's slot with the frame parsed into it ([`parsed`] without the config).
#[inline(always)]
fn parse_into<C: Frame, A: Inet>(ctx: &C, hook: u32) -> Result<&'static mut Slot<A>, Verdict> {
    let slot = A::slot(hook).ok_or(Verdict::Pass(Reason::NotService))?;
    A::parse(ctx, &mut slot.parsed).map_err(Verdict::Pass)?;
    Ok(slot)
}

/// The ingress path of a frame of family `A` (`main` tells the family and runs each
/// family's path in a program of its own).
#[inline(always)]
pub fn ingress<C: Ctx, A: Inet>(ctx: &C, hook: u32, xdp: bool) -> Verdict {
    let (cfg, slot) = match parsed::<_, A>(ctx, hook) {
        Ok(run) => run,
        Err(v) => return v,
    };
    match &mut slot.parsed {
        Parsed::Flow(p) => ingress_flow(ctx, hook, xdp, p, cfg, &mut slot.room),
        Parsed::IcmpError(e) => icmp::translate(ctx, hook, e, false, &mut slot.room),
    }
}

#[inline(always)]
fn ingress_flow<C: Ctx, A: Inet>(
    ctx: &C,
    hook: u32,
    xdp: bool,
    p: &mut Packet<FlowKeyOf<A>>,
    cfg: &Config,
    room: &mut Room<A>,
) -> Verdict {
    if xdp && !xdp_can_rewrite(p) {
        return Verdict::Pass(Reason::XdpDeferred);
    }
    // A later fragment whose first was never seen still counts as such, wherever it goes.
    if !frag::follow(p) {
        return Verdict::Pass(Reason::FragUnknown);
    }
    if lb::no_service_at(&p.key.daddr) {
        return Verdict::Pass(Reason::NotService);
    }
    match ingress_entry(ctx, hook, p, cfg, room) {
        Ok(()) => apply(ctx, p, &room.entry, &mut room.chunk),
        Err(v) => v,
    }
}

/// The entry an ingress packet is rewritten by, left in `room.entry`: its live entry, or a
/// new flow's; otherwise the run's verdict (not ours, dropped, or sent on by DSR).
///
/// A DSR VIP's packet is taken where a packet without a live flow finds its service, since
/// DSR packets never have flow entries: a NAT network's packets pay no lookup for DSR (one
/// test of the service's flags, on a flow's first packet only).
#[inline(always)]
fn ingress_entry<C: Ctx, A: Inet>(
    ctx: &C,
    hook: u32,
    p: &Packet<FlowKeyOf<A>>,
    cfg: &Config,
    room: &mut Room<A>,
) -> Result<(), Verdict> {
    let now = conntrack::now();
    let mut reopen = false;
    if let Found::Live(e) = conntrack::find(&p.key, now, hook) {
        let entry = &mut room.entry;
        // SAFETY: map value copied out (updates go through `e`).
        unsafe { conntrack::copy_entry(e, entry) };
        if entry.flags & FLOW_EGRESS != 0 {
            return Err(Verdict::Pass(Reason::NotService));
        }
        if entry.flags & FLOW_REPLY == 0 && flow::reopens(entry, p.key.proto, p.tcp_flags) {
            reopen = true;
        } else {
            conntrack::update(hook, &p.key, e, p.tcp_flags, cfg, now, room);
            return Ok(());
        }
    }
    // No packet is for the unspecified address (the kernel drops one as martian), though the
    // ports published on every node address are keyed by it: it must not find them.
    let svc = if p.key.daddr.is_zero() {
        None
    } else {
        lb::service_for(&p.key)
    };
    if let Some(svc) = &svc
        && svc.flags & SERVICE_DSR != 0
    {
        return Err(dsr::send(ctx, hook, p, svc, cfg, now, &mut room.dsr));
    }
    if let Frag::Later(_) = p.frag {
        return Err(Verdict::Pass(Reason::FragUnknown));
    }
    let svc = svc.ok_or(Verdict::Pass(Reason::NotService))?;
    lb::new_flow(ctx, hook, p, &svc, cfg, now, reopen, room).map_err(|r| match r {
        Reason::NatFailed => Verdict::Drop(r),
        r => Verdict::Pass(r),
    })
}

/// The egress path of a frame of family `A` (see [`ingress`]).
#[inline(always)]
pub fn egress<A: Inet>(ctx: &Skb, hook: u32) -> Verdict {
    let (cfg, slot) = match parsed::<_, A>(ctx, hook) {
        Ok(run) => run,
        Err(v) => return v,
    };
    match &mut slot.parsed {
        Parsed::Flow(p) => egress_flow(ctx, hook, p, cfg, &mut slot.room),
        Parsed::IcmpError(e) => icmp::translate(ctx, hook, e, true, &mut slot.room),
    }
}

#[inline(always)]
fn egress_flow<A: Inet>(
    ctx: &Skb,
    hook: u32,
    p: &mut Packet<FlowKeyOf<A>>,
    cfg: &Config,
    room: &mut Room<A>,
) -> Verdict {
    if !frag::follow(p) {
        return Verdict::Pass(Reason::FragUnknown);
    }
    if nothing_leaving(ctx, p, cfg) {
        return Verdict::Pass(Reason::NotService);
    }
    match egress_entry(ctx, hook, p, cfg, room) {
        Ok(()) => apply(ctx, p, &room.entry, &mut room.chunk),
        Err(v) => v,
    }
}

/// Whether lb has nothing to do with `p` leaving the node (`lb_common::filter`): every entry
/// egress finds is keyed from a backend (a reply) or to one (a masqueraded flow), and only
/// a packet to a backend is masqueraded or vetted, so a packet neither from nor to a backend,
/// or to one where neither can apply, is spared the flow lookups.
#[inline(always)]
fn nothing_leaving<A: Inet>(ctx: &Skb, p: &Packet<FlowKeyOf<A>>, cfg: &Config) -> bool {
    let Some(f) = lb::filter() else {
        return false;
    };
    f.no_backend(&p.key.saddr)
        && (f.no_backend(&p.key.daddr)
            || cfg.fast_path & A::VETTED == 0 && !snat::may_apply(ctx, cfg))
}

/// The entry an egress packet is rewritten by, left in `room.entry`: its live entry, or a
/// new masquerade's.
#[inline(always)]
fn egress_entry<A: Inet>(
    ctx: &Skb,
    hook: u32,
    p: &Packet<FlowKeyOf<A>>,
    cfg: &Config,
    room: &mut Room<A>,
) -> Result<(), Verdict> {
    let now = conntrack::now();
    if let Found::Live(e) = conntrack::find(&p.key, now, hook) {
        let entry = &mut room.entry;
        // SAFETY: map value copied out (updates go through `e`).
        unsafe { conntrack::copy_entry(e, entry) };
        if entry.flags & FLOW_EGRESS == 0 {
            return Err(Verdict::Pass(Reason::NotService));
        }
        // A SYN on a closing masquerade entry is a new connection on a reused tuple: F was
        // re-created on ingress; the claim is made again (and is found to be its own).
        let reopen =
            entry.flags & FLOW_REPLY == 0 && flow::reopens(entry, p.key.proto, p.tcp_flags);
        if !reopen {
            // A backend's reply leaving the node: past the forward hooks, judged.
            if entry.flags == FLOW_EGRESS | FLOW_REPLY
                && cfg.fast_path & A::VETTED != 0
                && flow::judgeable(p.tcp_flags)
            {
                // SAFETY: `e` points into the map (`find`).
                unsafe { redirect::vet_reply(&p.key, e, now, room) };
            }
            conntrack::update(hook, &p.key, e, p.tcp_flags, cfg, now, room);
            return Ok(());
        }
    } else if cfg.fast_path & A::VETTED != 0 && flow::judgeable(p.tcp_flags) {
        redirect::vet_client(&p.key, now, room);
    }
    snat::masquerade(ctx, hook, p, cfg, now, room)
}

/// The fast path for a packet of family `A` TC ingress (or XDP before it) translated towards
/// a backend: the TC action that hands it over, or `None` to give it to the stack. `by_xdp`:
/// the judgment stamp of a packet XDP translated (`translated_by_xdp`); otherwise that of
/// the entry this TC run rewrote it by.
#[inline(always)]
pub fn forward<A: Inet>(ctx: &Skb, by_xdp: Option<u32>) -> Option<i32> {
    let cfg = config()?;
    let slot = A::slot(HOOK_TC_INGRESS)?;
    let judged = by_xdp.unwrap_or_else(|| judged(slot));
    let room = &mut slot.room;
    room.hop.daddr = redirect::daddr::<A>(ctx)?;
    let ep = redirect::target(ctx, Towards::Backend, cfg, judged, &mut room.hop)?;
    Some(redirect::send::<A>(ctx, ep))
}

/// The reply fast path for a frame of family `A`, at TC ingress of the node's end of a local
/// backend's veth: a reply whose client the fast path can reach is translated here (what TC
/// egress would have done where it leaves the node) and handed to the client. Everything
/// else passes untouched, checked before anything is written, and is translated on its way
/// out as without the fast path: fragments, ICMP errors, masqueraded flows, unreachable
/// clients.
#[inline(always)]
pub fn reply<A: Inet>(ctx: &Skb, hook: u32) -> Verdict {
    let Some(cfg) = config() else {
        return Verdict::Pass(Reason::NotService);
    };
    // Before the parse: with the family's fast path off, a reply costs one comparison.
    if cfg.fast_path & A::FAST_PATH == 0 {
        return Verdict::Pass(Reason::NotRedirected);
    }
    let slot = match parse_into::<_, A>(ctx, hook) {
        Ok(slot) => slot,
        Err(v) => return v,
    };
    match &mut slot.parsed {
        Parsed::Flow(p) if p.frag == Frag::Whole => reply_flow(ctx, hook, p, cfg, &mut slot.room),
        _ => Verdict::Pass(Reason::NotRedirected),
    }
}

#[inline(always)]
fn reply_flow<A: Inet>(
    ctx: &Skb,
    hook: u32,
    p: &mut Packet<FlowKeyOf<A>>,
    cfg: &Config,
    room: &mut Room<A>,
) -> Verdict {
    let now = conntrack::now();
    let Found::Live(e) = conntrack::find(&p.key, now, hook) else {
        return Verdict::Pass(Reason::NotService);
    };
    // SAFETY: map value copied out (updates go through `e`); `update` leaves `room.entry`.
    unsafe { conntrack::copy_entry(e, &mut room.entry) };
    if room.entry.flags != FLOW_EGRESS | FLOW_REPLY {
        return Verdict::Pass(Reason::NotService);
    }
    room.hop.daddr = room.entry.daddr;
    // A copy: the room is written below (the reply program's frame has room for it).
    let judged = flow::judgment(room.entry.vetted, p.tcp_flags);
    let Some(&ep) = redirect::target(ctx, Towards::Client, cfg, judged, &mut room.hop) else {
        return Verdict::Pass(Reason::NotRedirected);
    };
    conntrack::update(hook, &p.key, e, p.tcp_flags, cfg, now, room);
    match apply(ctx, p, &room.entry, &mut room.chunk) {
        Verdict::Translated => Verdict::Redirect(redirect::send::<A>(ctx, &ep)),
        v => v,
    }
}

/// Rewrites `p` to the tuple entry `e` gives, counts it, and records a first fragment.
#[inline(always)]
fn apply<C: Ctx, A: Inet>(
    ctx: &C,
    p: &Packet<FlowKeyOf<A>>,
    e: &FlowOf<A>,
    chunk: &mut SumChunk,
) -> Verdict {
    let ports_change = p.key.sport != e.sport || p.key.dport != e.dport;
    if p.frag != Frag::Whole && ports_change && matches!(p.l4, L4Sum::Sctp { .. }) {
        return Verdict::Pass(Reason::SctpFragment);
    }
    let unchecked = !A::V4 && matches!(p.l4, L4Sum::Udp(_)) && p.check == 0;
    if unchecked && csum::fill_udp6(ctx, p, chunk).is_none() || rewrite(ctx, p, e).is_none() {
        // Only an offset the parser checked can fail here; a half-rewritten packet must not
        // leave.
        return Verdict::Drop(Reason::Malformed);
    }
    frag::record(p);
    // A flow is counted once per packet, by its own pair (F or R), not again by the
    // masquerade pair the same packet also passes.
    if e.flags & FLOW_MASQ == 0 {
        stats::account(e.counter, p.len);
    }
    Verdict::Translated
}

#[inline(always)]
fn rewrite<C: Ctx, A: Inet>(ctx: &C, p: &Packet<FlowKeyOf<A>>, e: &FlowOf<A>) -> Option<()> {
    let k = &p.key;
    set_addr(ctx, L3_OFF, p.l4, L3_OFF + A::SADDR, k.saddr, e.saddr)?;
    set_addr(ctx, L3_OFF, p.l4, L3_OFF + A::DADDR, k.daddr, e.daddr)?;
    set_ports(ctx, p.l4_off, p.l4, (k.sport, k.dport), (e.sport, e.dport))
}

/// The value XDP leaves in a translated packet's metadata for the TC ingress program beside
/// it, which then passes the packet on without parsing it again, followed by the judgment
/// stamp of the entry it was rewritten by (for `forward`). Mixed with the network's hash key
/// so that another network's TC program, should the metadata survive into it, does not take
/// it for its own.
const HANDOFF: u32 = 0x6c62_7864;

/// Marks a packet XDP translated, by the entry in its run's room (best effort: without
/// headroom for metadata, TC parses the packet again and finds it is not for a service,
/// which is also right).
#[inline(always)]
pub fn xdp_handoff<A: Inet>(ctx: &Xdp) {
    let Some(cfg) = config() else { return };
    let Some(slot) = A::slot(HOOK_XDP) else {
        return;
    };
    // SAFETY: the helper checks the headroom itself.
    if unsafe { bpf_xdp_adjust_meta(ctx.0.ctx, -8) } != 0 {
        return;
    }
    let meta = ctx.0.metadata();
    if meta + 8 <= ctx.0.metadata_end() {
        // SAFETY: bounds-checked against the start of the packet data.
        unsafe { (meta as *mut [u32; 2]).write_unaligned([HANDOFF ^ cfg.hash_key, judged(slot)]) };
    }
}

/// The judgment stamp (`FlowOf::vetted`) the packet a run just rewrote in `slot` asks the
/// vetted fast path to stand by: its entry's, or none for a packet conntrack must see
/// (`flow::judgeable`).
#[inline(always)]
fn judged<A: Inet>(slot: &Slot<A>) -> u32 {
    match &slot.parsed {
        Parsed::Flow(p) => flow::judgment(slot.room.entry.vetted, p.tcp_flags),
        Parsed::IcmpError(_) => 0,
    }
}

/// The judgment stamp of the skb's entry, if the XDP program of this network already
/// translated it.
#[inline(always)]
pub fn translated_by_xdp(ctx: &Skb) -> Option<u32> {
    let cfg = config()?;
    // SAFETY: the skb is the program's valid context; reads are bounds-checked.
    unsafe {
        let meta = core::ptr::read_volatile(&(*ctx.0.skb.skb).data_meta) as usize;
        let data = core::ptr::read_volatile(&(*ctx.0.skb.skb).data) as usize;
        if meta + 8 > data {
            return None;
        }
        let [mark, judged] = (meta as *const [u32; 2]).read_unaligned();
        (mark == HANDOFF ^ cfg.hash_key).then_some(judged)
    }
}

/// Counts a run's outcome and returns it.
#[inline(always)]
pub fn finish(hook: u32, v: Verdict) -> Verdict {
    stats::reason(hook, v.reason());
    v
}
