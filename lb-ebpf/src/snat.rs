//! Masquerade: a load-balanced flow on its way to its backend leaves with the node's address and
//! a claimed source port, when the network asks for it — `always`, or `auto` for hairpin (the
//! packet leaves by the interface it came in on: a backend reaching its own service would
//! otherwise get the reply straight from the backend, from an address it never spoke to).
//!
//! The claim is the C entry (`backend:q → node:m`, see `lb_common::flow`): inserted only where
//! no live flow holds it, so two flows never share a masquerade tuple. The port is derived from
//! the client's own port (`lb_common::hash::masq_start`), so a flow re-created after losing its
//! entries gets its old port back while it is free and the backend keeps seeing the same
//! 4-tuple; the search skips published ports (a claim there would capture new connections to
//! the service) and ports any socket of the node holds towards the backend. The range ([`lb_common::Config`]) leaves out the node's
//! ephemeral range, where its own connections pick ports after lb has claimed them.
use lb_common::{
    Config, FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, FlowKeyOf, MASQ_AUTO, MASQ_NEVER, Reason,
    flow::{self, reversed},
    hash::{self, PORT_PROBES, PortRange},
};

use crate::{
    conntrack::{self, Found},
    family::Inet,
    lb::{self, Sockets},
    parse::{Frag, Packet, Skb},
    room::Room,
    stats,
    verdict::Verdict,
};

/// Whether the network masquerades a packet leaving by the interface `ctx` leaves by: always,
/// or (`auto`) when it leaves by the one it came in on.
#[inline(always)]
pub fn may_apply(ctx: &Skb, cfg: &Config) -> bool {
    // SAFETY: the skb pointer is valid for the program run.
    let (ifindex, ingress_ifindex) =
        unsafe { ((*ctx.0.skb.skb).ifindex, (*ctx.0.skb.skb).ingress_ifindex) };
    match cfg.masquerade {
        MASQ_NEVER => false,
        MASQ_AUTO => ifindex == ingress_ifindex,
        _ => true,
    }
}

/// Masquerades `p` (no live S entry) if it is the original direction of a load-balanced flow
/// and the network asks for it; leaves the S entry to rewrite it by in `room.entry`. A flow whose port search
/// fails is dropped, as the kernel's NAT drops what it cannot map: passed unmasqueraded, the
/// backend would answer the client directly and the connection would fail anyway.
#[inline(always)]
pub fn masquerade<A: Inet>(
    ctx: &Skb,
    hook: u32,
    p: &Packet<FlowKeyOf<A>>,
    cfg: &Config,
    now: u64,
    room: &mut Room<A>,
) -> Result<(), Verdict> {
    let not_ours = Err(Verdict::Pass(Reason::NotService));
    if !may_apply(ctx, cfg) {
        return not_ours;
    }
    // SAFETY: the skb pointer is valid for the program run.
    let ifindex = unsafe { (*ctx.0.skb.skb).ifindex };
    if let Frag::Later(_) = p.frag {
        return not_ours;
    }
    // The flow's reply entry (R) is keyed by this packet's tuple reversed.
    room.key = reversed(&p.key);
    let Found::Live(rep) = conntrack::find(&room.key, now, hook) else {
        return not_ours;
    };
    // SAFETY: a map value, read in place.
    if unsafe { (*rep).flags } != FLOW_EGRESS | FLOW_REPLY {
        return not_ours;
    }
    // An answered flow keeps the translation it started with, as the kernel's NAT binds a
    // connection at its first packet: masquerade switched on mid-flow (`lb network set
    // --masquerade always`) applies to new flows; moving an answered one to a new source
    // would have its backend reset it.
    // SAFETY: as above.
    if unsafe { (*rep).replied } != 0 {
        return not_ours;
    }
    // SAFETY: plain data copied out.
    let Some(iface) = (unsafe { A::ifaces().get(&ifindex) }).copied() else {
        return not_ours;
    };
    let range = PortRange {
        min: cfg.masq_port_min,
        max: cfg.masq_port_max,
        hole_min: cfg.masq_hole_min,
        hole_max: cfg.masq_hole_max,
    };
    // The claim rewrites the backend's reply back to this packet's source; the rest (state,
    // hash, counter, expiry) is the reply entry's. Copied whole and then changed, so the
    // entry is not taken apart field by field.
    let claim = &mut room.next;
    // SAFETY: a map value, copied out.
    unsafe { conntrack::copy_entry(rep, claim) };
    claim.saddr = p.key.daddr;
    claim.daddr = p.key.saddr;
    claim.sport = p.key.dport;
    claim.dport = p.key.sport;
    claim.flags = FLOW_MASQ | FLOW_REPLY;
    let (base, index) = hash::masq_start(&p.key, cfg.hash_key);
    for attempt in 0..PORT_PROBES {
        let Some(port) = range.probe(base, index + attempt) else {
            break;
        };
        let port = port.to_be();
        if lb::is_published(iface.addr, port, p.key.proto) {
            continue;
        }
        room.key = FlowKeyOf {
            saddr: p.key.daddr,
            daddr: iface.addr,
            sport: p.key.dport,
            dport: port,
            proto: p.key.proto,
            _pad: [0; 3],
        };
        if lb::node_socket(ctx, &room.key, Sockets::Any) {
            continue;
        }
        if conntrack::claim(&room.key, &room.next, &p.key, now) {
            (room.other_key, room.entry) = flow::partner(&room.key, &room.next);
            if !conntrack::put(&room.other_key, &room.entry) {
                break;
            }
            stats::reason(hook, Reason::MasqNew);
            return Ok(());
        }
    }
    Err(Verdict::Drop(Reason::MasqFailed))
}
