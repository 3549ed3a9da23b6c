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
    Config, FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, Flow, FlowKey, MASQ_AUTO, MASQ_NEVER, Reason,
    flow::{self, reversed},
    hash::{self, PORT_PROBES, PortRange},
};

use crate::{
    conntrack::{self, Found},
    lb::{self, Sockets},
    maps::IFACES,
    nat::Verdict,
    parse::{Frag, Packet, Skb},
    stats,
};

/// Masquerades `p` (no live S entry) if it is the original direction of a load-balanced flow
/// and the network asks for it; returns the S entry to rewrite it by. A flow whose port search
/// fails is dropped, as the kernel's NAT drops what it cannot map: passed unmasqueraded, the
/// backend would answer the client directly and the connection would fail anyway.
#[inline(always)]
pub fn masquerade(
    ctx: &Skb,
    hook: u32,
    p: &Packet,
    cfg: &Config,
    now: u64,
) -> Result<Flow, Verdict> {
    let not_ours = Err(Verdict::Pass(Reason::NotService));
    // SAFETY: the skb pointer is valid for the program run.
    let (ifindex, ingress_ifindex) =
        unsafe { ((*ctx.0.skb.skb).ifindex, (*ctx.0.skb.skb).ingress_ifindex) };
    match cfg.masquerade {
        MASQ_NEVER => return not_ours,
        MASQ_AUTO if ifindex != ingress_ifindex => return not_ours,
        _ => {}
    }
    if let Frag::Later(_) = p.frag {
        return not_ours;
    }
    // The flow's reply entry (R) is keyed by this packet's tuple reversed.
    let rk = reversed(&p.key);
    let rep = match conntrack::find(&rk, now, hook) {
        // SAFETY: map value copied out.
        Found::Live(r) => unsafe { *r },
        Found::Absent => return not_ours,
    };
    if rep.flags != FLOW_EGRESS | FLOW_REPLY {
        return not_ours;
    }
    // SAFETY: plain data copied out.
    let Some(iface) = (unsafe { IFACES.get(&ifindex) }).copied() else {
        return not_ours;
    };
    let range = PortRange {
        min: cfg.masq_port_min,
        max: cfg.masq_port_max,
        hole_min: cfg.masq_hole_min,
        hole_max: cfg.masq_hole_max,
    };
    let mut claim = Flow {
        // The claim rewrites the backend's reply back to this packet's source.
        saddr: p.key.daddr,
        daddr: p.key.saddr,
        sport: p.key.dport,
        dport: p.key.sport,
        flags: FLOW_MASQ | FLOW_REPLY,
        ..rep
    };
    let (base, index) = hash::masq_start(&p.key, cfg.hash_key);
    for attempt in 0..PORT_PROBES {
        let Some(port) = range.probe(base, index + attempt) else {
            break;
        };
        let port = port.to_be();
        if lb::is_published(iface.addr, port, p.key.proto) {
            continue;
        }
        let ck = FlowKey {
            saddr: p.key.daddr,
            daddr: iface.addr,
            sport: p.key.dport,
            dport: port,
            proto: p.key.proto,
            _pad: [0; 3],
        };
        if lb::node_socket(ctx, &ck, Sockets::Any) {
            continue;
        }
        claim.expires_ns = rep.expires_ns;
        if conntrack::claim(&ck, &claim, &p.key, now) {
            let (sk, snat) = flow::partner(&ck, &claim);
            if !conntrack::put(&sk, &snat) {
                break;
            }
            stats::reason(hook, Reason::MasqNew);
            return Ok(snat);
        }
    }
    Err(Verdict::Drop(Reason::MasqFailed))
}
