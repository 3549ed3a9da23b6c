//! The fast path: a translated packet whose next hop is a local endpoint (`lb_endpoints`: a
//! neighbour on one of the network's interfaces, found by the controller) leaves without the
//! node's stack. Into a veth's peer namespace (`bpf_redirect_peer`), it skips the node's
//! routing, bridge and netfilter hooks and the veth's backlog queue; out of another device
//! (`bpf_redirect`), routing and netfilter. A destination that is no local endpoint (a client
//! behind a router) is looked up in the kernel's FIB (`bpf_fib_lookup`, which also resolves
//! its next hop's MAC and checks the MTU): sent out of the device it names when the next hop
//! is resolved, left to the stack (which resolves it) when not.
//!
//! Both families take it, each by its own switch (`Config::fast_path`: the controller reads
//! each family's forward hooks, so an `ip6` table's rule stops IPv6's alone) and its own
//! endpoints (`lb_endpoints`, `lb_endpoints6`, from the neighbour table: ARP's and neighbour
//! discovery's). The fast path does for the packet what forwarding would have and nothing
//! else: the TTL (IPv6: hop limit) goes down by one (IPv4's header checksum follows) and the
//! Ethernet header is the hop's (the neighbour's MAC, the node interface's own). What the stack does differently is left to
//! the stack, by not redirecting: a TTL about to run out (ICMP time exceeded), a packet too
//! big for the hop (fragmentation, "fragmentation needed" or ICMPv6 Packet Too Big), a flow the network masquerades
//! (`always`, or `auto` for hairpin: SNAT happens on the way out of the stack), a reply to a
//! client behind a bridge (bridged, never routed). Filtering is the controller's side of the
//! contract: it sets `Config::fast_path` (and fills `lb_endpoints`) only while no
//! forward-hook rule of the namespace could apply to these packets (or the network forces the
//! fast path), or with the family's vetted bit (`FAST_PATH_VETTED_*`): then a direction of a
//! flow is redirected only while netfilter's judgment of it stands (`lb_common::flow`,
//! "Judgment"), which TC egress records ([`vet_reply`], [`vet_client`]) as the direction's packets
//! leave the node past the forward and postrouting hooks. With it off, a packet costs one
//! comparison here and no map lookup.
use core::mem::size_of;

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_SHOT, bpf_fib_lookup as FibParams},
    helpers::{bpf_fib_lookup, bpf_redirect, bpf_redirect_peer},
};
use lb_common::{
    Config, CtRequestOf, ENDPOINT_BRIDGED, ENDPOINT_PEER, Endpoint, FLOW_EGRESS, FLOW_REPLY,
    FlowKeyOf, FlowOf, IPPROTO_TCP, MASQ_ALWAYS,
    csum::{IP_CSUM, Rewrite, Width},
    flow::{self, is_partner, partner_key, reversed},
};

use crate::{
    conntrack,
    family::Inet,
    maps::{CT_REQUESTS, VETTED_SINCE},
    parse::{L3_OFF, Skb, ptr_at, read},
    room::{Hop, Room},
};

const ETH_HLEN: u32 = L3_OFF as u32;

/// Which way a translated packet goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Towards {
    /// A client's packet, destination rewritten to its backend.
    Backend,
    /// A backend's reply, source rewritten to the service.
    Client,
}

/// The destination address of the packet as it stands (after its rewrite).
#[inline(always)]
pub fn daddr<A: Inet>(ctx: &Skb) -> Option<A> {
    read(ctx, L3_OFF + A::DADDR)
}

/// The endpoint a packet for `hop.daddr` going `towards` may be handed to, if the fast path
/// may take it (see the module's rules); `None` leaves it to the stack: a map's endpoint, or
/// one a FIB lookup made in `hop`. `judged`: the stamp of the packet's direction (its entry's
/// `vetted`), which the vetted fast path asks to stand.
#[inline(always)]
pub fn target<'a, A: Inet>(
    ctx: &Skb,
    towards: Towards,
    cfg: &Config,
    judged: u32,
    hop: &'a mut Hop<A>,
) -> Option<&'a Endpoint> {
    if cfg.fast_path & A::FAST_PATH == 0 {
        return None;
    }
    if cfg.fast_path & A::VETTED != 0 {
        let since = *VETTED_SINCE.get(0)?;
        if !flow::vetted(judged, flow::stamp(conntrack::now()), since) {
            return None;
        }
    }
    // SAFETY: the skb is the program's valid context.
    let (ifindex, len, gso) = unsafe {
        let skb = ctx.0.skb.skb;
        ((*skb).ifindex, (*skb).len, (*skb).gso_size)
    };
    // SAFETY: read in place: the controller writes an endpoint whole, never in place.
    let ep: &Endpoint = match unsafe { A::endpoints().get(&hop.daddr) } {
        Some(ep) => ep,
        None => {
            next_hop::<A>(ctx, &hop.daddr, ifindex, len, gso, &mut hop.fib)?;
            let fib = &hop.fib;
            hop.ep = Endpoint {
                ifindex: fib.ifindex,
                l3_ifindex: fib.ifindex,
                // Checked by the lookup.
                mtu: u32::MAX - ETH_HLEN,
                dmac: fib.dmac,
                smac: fib.smac,
                flags: 0,
            };
            &hop.ep
        }
    };
    match towards {
        // The L3 interface the packet came in on is the one it would leave by: hairpin,
        // which `auto` masquerades.
        Towards::Backend if cfg.masquerade == MASQ_ALWAYS || ep.l3_ifindex == ifindex => {
            return None;
        }
        Towards::Client if ep.flags & ENDPOINT_BRIDGED != 0 => return None,
        _ => {}
    }
    // A GSO packet is segmented for the hop's MTU by whoever receives it; at TC ingress the
    // length includes the Ethernet header.
    if gso == 0 && len > ep.mtu + ETH_HLEN {
        return None;
    }
    let hops: u8 = read(ctx, L3_OFF + A::HOPS)?;
    if hops <= 1 {
        return None;
    }
    Some(ep)
}

/// The next hop the kernel's FIB gives `daddr` (with the packet's source, as policy routing
/// may need it), left in `params` (the device it names, its MACs); `None` where the lookup does not
/// succeed outright (no route, unresolved neighbour, a packet too big for the route's MTU, a
/// route the stack must handle), which leaves the packet to the stack.
#[inline(always)]
fn next_hop<A: Inet>(
    ctx: &Skb,
    daddr: &A,
    ifindex: u32,
    len: u32,
    gso: u32,
    params: &mut FibParams,
) -> Option<()> {
    let saddr: A = read(ctx, L3_OFF + A::SADDR)?;
    let proto: u8 = read(ctx, L3_OFF + A::PROTO)?;
    // SAFETY: an all-zero lookup is a valid one to fill in.
    *params = unsafe { core::mem::zeroed() };
    params.family = A::AF;
    params.l4_protocol = proto;
    params.ifindex = ifindex;
    // The MTU is checked against the IP length (host order, unlike the addresses; for IPv6
    // the kernel checks it as the whole packet's too), except for a GSO packet, which is
    // segmented for the route's MTU by whoever receives it.
    if gso == 0 {
        params.__bindgen_anon_1.tot_len = len.saturating_sub(ETH_HLEN) as u16;
    }
    A::fib_addrs(params, saddr, *daddr);
    // SAFETY: the params live in the run's slot for the call; ctx is the program's.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.0.skb.skb.cast(),
            params,
            size_of::<FibParams>() as i32,
            0,
        )
    };
    (rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS)).then_some(())
}

/// Forwards the packet to `ep` as routing would: hop count down by one, the hop's MACs, out.
/// A failed write drops the packet (it must not leave half-forwarded).
#[inline(always)]
pub fn send<A: Inet>(ctx: &Skb, ep: &Endpoint) -> i32 {
    if forward::<A>(ctx, ep).is_none() {
        return TC_ACT_SHOT as i32;
    }
    // SAFETY: helpers that only record the target on the skb's per-CPU redirect state.
    unsafe {
        if ep.flags & ENDPOINT_PEER != 0 {
            bpf_redirect_peer(ep.ifindex, 0) as i32
        } else {
            bpf_redirect(ep.ifindex, 0) as i32
        }
    }
}

#[inline(always)]
fn forward<A: Inet>(ctx: &Skb, ep: &Endpoint) -> Option<()> {
    // Written as the 16-bit word it shares (what IPv4's checksum update takes): IPv4's TTL is
    // its word's first byte (before the protocol), in network order the high one; IPv6's hop
    // limit the second (after the next header), the low one. `target` saw it above 1.
    let hops_word = L3_OFF + (A::HOPS & !1);
    let old: u16 = ctx.load16(hops_word)?;
    let new = if A::HOPS & 1 == 0 {
        (u16::from_be(old) - 0x0100).to_be()
    } else {
        (u16::from_be(old) - 1).to_be()
    };
    // IPv6 has no header checksum; IPv4's follows the TTL.
    if A::V4 {
        ctx.ip_csum(L3_OFF + IP_CSUM, u32::from(old), u32::from(new), Width::W16)?;
    }
    ctx.store16(hops_word, new, false)?;
    // In place, as the other header fields (`csum`): no checksum covers the link header.
    let macs = ptr_at::<[[u8; 6]; 2]>(ctx, 0)?;
    // SAFETY: ptr_at bounds-checked the 12 bytes.
    unsafe { macs.write_unaligned([ep.dmac, ep.smac]) };
    Some(())
}

/// Records netfilter's judgment of a backend's reply: `e`, the live entry TC egress found for
/// `key`, is a flow's R. A TCP flow's direction is judged only once the node's conntrack
/// entry is liberal ([`liberal`]).
///
/// # Safety
/// `e` points into the flow map (`conntrack::find`).
#[inline(always)]
pub unsafe fn vet_reply<A: Inet>(
    key: &FlowKeyOf<A>,
    e: *mut FlowOf<A>,
    now: u64,
    room: &mut Room<A>,
) {
    // SAFETY: as the caller promises.
    if unsafe { stamped(e, now) } {
        return;
    }
    if key.proto == IPPROTO_TCP {
        // SAFETY: as the caller promises.
        room.other_key = partner_key(unsafe { &*e }, key.proto);
        room.key = reversed(key);
        // SAFETY: as the caller promises.
        let born = unsafe { (*e).born };
        if !liberal(&room.other_key, &room.key, born, now) {
            return;
        }
    }
    // SAFETY: as the caller promises.
    unsafe { stamp(e, now) };
}

/// Records the judgment of a flow's client direction: `key`, a packet TC egress found no
/// entry for, is the client's packet leaving towards its backend when its reversal is the
/// key of a flow's reply entry R (not masqueraded: that pair's packets never take the fast
/// path); its F, R's partner, gets the stamp (for TCP, once [`liberal`]).
#[inline(always)]
pub fn vet_client<A: Inet>(key: &FlowKeyOf<A>, now: u64, room: &mut Room<A>) {
    room.other_key = reversed(key);
    let flows = A::flows();
    // SAFETY: map values read in place; `stamp` writes one field.
    unsafe {
        let Some(r) = flows.get_ptr(&room.other_key) else {
            return;
        };
        if (*r).flags != FLOW_EGRESS | FLOW_REPLY {
            return;
        }
        room.key = partner_key(&*r, key.proto);
        let Some(f) = flows.get_ptr_mut(&room.key) else {
            return;
        };
        if !is_partner(&*f, &room.other_key)
            || stamped(f, now)
            || key.proto == IPPROTO_TCP && !liberal(&room.key, key, (*f).born, now)
        {
            return;
        }
        stamp(f, now);
    }
}

/// Whether `*e` holds the judgment stamp of `now` already: then neither the liberal lookup
/// nor the write is done again, so a direction that keeps taking the stack (a bridged
/// client's replies) costs its entry one write and one lookup per stamp unit, not per packet.
///
/// # Safety
/// `e` points into the flow map.
#[inline(always)]
unsafe fn stamped<A>(e: *const FlowOf<A>, now: u64) -> bool {
    // SAFETY: as the caller promises.
    unsafe { (*e).vetted == flow::stamp(now) }
}

/// Writes the judgment stamp of `now` into `*e` (see [`stamped`]).
///
/// # Safety
/// `e` points into the flow map.
#[inline(always)]
unsafe fn stamp<A>(e: *mut FlowOf<A>, now: u64) {
    // SAFETY: as the caller promises; a race with another CPU's stamp is benign (either is a
    // judgment of this moment).
    unsafe { (*e).vetted = flow::stamp(now) };
}

/// Whether the TCP flow whose F key is `key` (born at stamp `born`) has a liberal entry in
/// the node's conntrack (`lb_common::CtRequestOf`); if not, asks the controller for one, for
/// the conntrack entry of original tuple `orig`, once the flow is old enough
/// (`flow::old_enough`).
#[inline(always)]
fn liberal<A: Inet>(key: &FlowKeyOf<A>, orig: &FlowKeyOf<A>, born: u16, now: u64) -> bool {
    if A::liberal().get_ptr(key).is_some() {
        return true;
    }
    if !flow::old_enough(born, flow::stamp(now)) {
        return false;
    }
    if let Some(mut r) = CT_REQUESTS.reserve_untyped::<CtRequestOf<A>>(0) {
        let p = r.as_mut_ptr();
        // SAFETY: the ring's reserved record, written whole before it is submitted.
        unsafe {
            (*p).key = *key;
            (*p).orig = *orig;
        }
        r.submit(0);
    }
    false
}
