//! The NAT packet paths (DESIGN.md "Packet paths", NAT mode).
//!
//! Ingress (TC ingress, or XDP when attached so) rewrites destinations: a new flow to a service
//! gets a backend, a tracked flow follows its entry, a reply to a masqueraded flow gets its
//! client back. Egress (TC) rewrites sources: replies get the service address back, and a flow
//! that must be masqueraded gets the node's address and a claimed port. Rewriting sources only
//! on egress is forced: a packet whose source is one of the node's own addresses is dropped as
//! martian when it is routed on input.
use aya_ebpf::{helpers::bpf_get_prandom_u32, programs::TcContext};
use lb_common::{
    BUCKETS, BackendKey, FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, FlowKey, MASQ_AUTO, MASQ_NEVER,
    PortKey, Service, Translation, VipKey, slot_for_bucket,
};

use crate::{
    conntrack,
    csum::{Csum, Rewrite},
    maps::{BACKENDS, CONFIG, IFACES, LOCAL_ADDRS, PORTS, VIPS},
    parse::{self, DADDR_OFF, IP_CSUM_OFF, IcmpError, Packet, Parsed, SADDR_OFF},
    stats,
};

pub fn ingress<C: Rewrite>(ctx: &C) -> Option<()> {
    match parse::packet(ctx)? {
        Parsed::Flow(p) => {
            let t = match conntrack::lookup(&p.key) {
                Some(t) if t.flags & FLOW_EGRESS == 0 => t,
                Some(_) => return None,
                None => new_flow(&p)?,
            };
            stats::account(&t, p.len);
            rewrite_dst(ctx, &p, t.daddr, t.dport)
        }
        Parsed::IcmpError(e) => icmp_error(ctx, &e, false),
    }
}

pub fn egress(ctx: &TcContext) -> Option<()> {
    match parse::packet(ctx)? {
        Parsed::Flow(p) => {
            let t = match conntrack::lookup(&p.key) {
                Some(t) if t.flags & FLOW_EGRESS != 0 => t,
                Some(_) => return None,
                None => masquerade(ctx, &p)?,
            };
            stats::account(&t, p.len);
            rewrite_src(ctx, &p, t.saddr, t.sport)
        }
        Parsed::IcmpError(e) => icmp_error(ctx, &e, true),
    }
}

/// The service a new flow's first packet is for: a VIP (any port), a published port on its
/// `host_ip`, or a published port on any of the node's own addresses.
#[inline(always)]
fn service_for(key: &FlowKey) -> Option<Service> {
    // SAFETY (all three): map values are plain data copied out at once.
    if let Some(s) = unsafe { VIPS.get(&VipKey { addr: key.daddr }) } {
        return Some(*s);
    }
    let mut port = PortKey {
        addr: key.daddr,
        port: key.dport,
        proto: key.proto,
        _pad: 0,
    };
    if let Some(s) = unsafe { PORTS.get(&port) } {
        return Some(*s);
    }
    unsafe { LOCAL_ADDRS.get(&key.daddr) }?;
    port.addr = 0;
    unsafe { PORTS.get(&port) }.copied()
}

/// Picks a backend for a new flow (one random bucket, `slot_for_bucket` from lb-common: the
/// same function the controller's element rendering is checked against) and tracks the flow.
/// A service with no backends returns `None`: the packet goes to the stack, where the VIP
/// alias answers (TCP RST), as moby does.
#[inline(always)]
fn new_flow(p: &Packet) -> Option<Translation> {
    let svc = service_for(&p.key)?;
    // SAFETY: helper without preconditions.
    let bucket = unsafe { bpf_get_prandom_u32() } % BUCKETS;
    let slot = slot_for_bucket(bucket, svc.count)?;
    // SAFETY: plain data copied out.
    let backend = *unsafe {
        BACKENDS.get(&BackendKey {
            set_id: svc.set_id,
            slot,
        })
    }?;
    let dport = if backend.port != 0 {
        backend.port
    } else {
        p.key.dport
    };
    let now = conntrack::now();
    let forward = Translation {
        saddr: p.key.saddr,
        daddr: backend.addr,
        sport: p.key.sport,
        dport,
        flags: 0,
        counter: backend.counter,
        service_counter: svc.counter,
        last_seen_ns: now,
    };
    let reply_key = FlowKey {
        saddr: backend.addr,
        daddr: p.key.saddr,
        sport: dport,
        dport: p.key.sport,
        proto: p.key.proto,
        _pad: [0; 3],
    };
    let reply = Translation {
        saddr: p.key.daddr,
        daddr: p.key.saddr,
        sport: p.key.dport,
        dport: p.key.sport,
        flags: FLOW_EGRESS | FLOW_REPLY,
        ..forward
    };
    conntrack::track(&p.key, &forward, &reply_key, &reply)
}

/// Masquerade for a load-balanced flow on its way to its backend, when the network asks for
/// it: `always`, or `auto` and the packet leaves by the interface it came in on (hairpin: a
/// backend reaching its own service would otherwise get the reply straight from the backend,
/// from an address it never spoke to). The flow is recognised by its reply entry.
#[inline(always)]
fn masquerade(ctx: &TcContext, p: &Packet) -> Option<Translation> {
    let cfg = CONFIG.get(0)?;
    // SAFETY: the skb pointer is valid for the program run.
    let (ifindex, ingress_ifindex) =
        unsafe { ((*ctx.skb.skb).ifindex, (*ctx.skb.skb).ingress_ifindex) };
    match cfg.masquerade {
        MASQ_NEVER => return None,
        MASQ_AUTO if ifindex != ingress_ifindex => return None,
        _ => {}
    }
    let reply = conntrack::lookup(&conntrack::reversed(&p.key))?;
    if reply.flags & (FLOW_EGRESS | FLOW_REPLY) != FLOW_EGRESS | FLOW_REPLY
        || reply.flags & FLOW_MASQ != 0
    {
        return None;
    }
    // SAFETY: plain data copied out.
    let iface = *unsafe { IFACES.get(&ifindex) }?;
    let base = FlowKey {
        saddr: p.key.daddr,
        daddr: iface.addr,
        sport: p.key.dport,
        dport: 0,
        proto: p.key.proto,
        _pad: [0; 3],
    };
    let claim = Translation {
        saddr: p.key.daddr,
        daddr: p.key.saddr,
        sport: p.key.dport,
        dport: p.key.sport,
        flags: FLOW_MASQ | FLOW_REPLY,
        ..reply
    };
    let port = conntrack::claim_masq_port(&base, &claim)?;
    let snat = Translation {
        saddr: iface.addr,
        daddr: p.key.daddr,
        sport: port,
        dport: p.key.dport,
        flags: FLOW_EGRESS | FLOW_MASQ,
        ..reply
    };
    if !conntrack::insert_new(&p.key, &snat) {
        // Another CPU masqueraded this flow first: release our port, take its translation.
        conntrack::forget(&FlowKey {
            dport: port,
            ..base
        });
        return conntrack::lookup(&p.key);
    }
    Some(snat)
}

/// Rewrites an IPv4 address of the packet's own header (IP checksum, and the L4 checksum whose
/// pseudo-header holds it).
#[inline(always)]
fn set_addr<C: Rewrite>(ctx: &C, p: &Packet, off: usize, old: u32, new: u32) -> Option<()> {
    if old == new {
        return Some(());
    }
    ctx.csum32(IP_CSUM_OFF, old, new, Csum::Ip)?;
    if let Some(c) = p.l4_csum {
        ctx.csum32(
            c.off,
            old,
            new,
            Csum::L4 {
                udp: c.udp,
                pseudo: true,
                partial: c.partial,
            },
        )?;
    }
    ctx.store32(off, new)
}

#[inline(always)]
fn set_port<C: Rewrite>(ctx: &C, p: &Packet, off: usize, old: u16, new: u16) -> Option<()> {
    if old == new {
        return Some(());
    }
    if let Some(c) = p.l4_csum {
        ctx.csum16(
            c.off,
            old,
            new,
            Csum::L4 {
                udp: c.udp,
                pseudo: false,
                partial: c.partial,
            },
        )?;
    }
    ctx.store16(off, new)
}

#[inline(always)]
fn rewrite_dst<C: Rewrite>(ctx: &C, p: &Packet, daddr: u32, dport: u16) -> Option<()> {
    set_addr(ctx, p, DADDR_OFF, p.key.daddr, daddr)?;
    set_port(ctx, p, p.l4_off + 2, p.key.dport, dport)
}

#[inline(always)]
fn rewrite_src<C: Rewrite>(ctx: &C, p: &Packet, saddr: u32, sport: u16) -> Option<()> {
    set_addr(ctx, p, SADDR_OFF, p.key.saddr, saddr)?;
    set_port(ctx, p, p.l4_off, p.key.sport, sport)
}

/// An ICMP error about a tracked flow (e.g. "fragmentation needed", which PMTU discovery
/// depends on) is translated like a packet of the opposite direction of the flow it quotes:
/// the quoted packet went one way, so the error's own tuple is found under the quoted tuple
/// reversed. On ingress the quoted source (and the outer destination, if it is the same
/// address) is rewritten; on egress the quoted destination (and the outer source). The
/// quoted L4 checksum is left alone: the quote may be truncated, and no receiver checks it.
#[inline(always)]
fn icmp_error<C: Rewrite>(ctx: &C, e: &IcmpError, egress: bool) -> Option<()> {
    let t = conntrack::lookup(&conntrack::reversed(&e.inner))?;
    if (t.flags & FLOW_EGRESS != 0) != egress {
        return None;
    }
    let icmp_csum = e.outer.l4_off + 2;
    let inner_csum = e.inner_l3_off + 10;
    let inner_l4 = e.inner_l4_off;
    // (quoted address offset, its old value, new value, quoted port offset, old, new, outer
    // address offset) for the side being rewritten.
    let (addr_off, old_addr, new_addr, port_off, old_port, new_port, outer_off, outer_old) =
        if egress {
            (
                e.inner_l3_off + 16,
                e.inner.daddr,
                t.saddr,
                inner_l4 + 2,
                e.inner.dport,
                t.sport,
                SADDR_OFF,
                e.outer.key.saddr,
            )
        } else {
            (
                e.inner_l3_off + 12,
                e.inner.saddr,
                t.daddr,
                inner_l4,
                e.inner.sport,
                t.dport,
                DADDR_OFF,
                e.outer.key.daddr,
            )
        };
    if old_addr != new_addr {
        let before: u16 = parse::read(ctx, inner_csum)?;
        ctx.csum32(inner_csum, old_addr, new_addr, Csum::Ip)?;
        let after: u16 = parse::read(ctx, inner_csum)?;
        ctx.csum32(icmp_csum, old_addr, new_addr, Csum::Plain)?;
        ctx.csum16(icmp_csum, before, after, Csum::Plain)?;
        ctx.store32(addr_off, new_addr)?;
    }
    if old_port != new_port {
        ctx.csum16(icmp_csum, old_port, new_port, Csum::Plain)?;
        ctx.store16(port_off, new_port)?;
    }
    if outer_old == old_addr {
        set_addr(ctx, &e.outer, outer_off, old_addr, new_addr)?;
    }
    Some(())
}
