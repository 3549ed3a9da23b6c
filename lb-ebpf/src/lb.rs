//! Service lookup and backend choice: which service a packet without a flow is for, whether it
//! may open a flow, which backend the flow hash gives it, and the flow's two entries.
use aya_ebpf::{
    bindings::{BPF_F_CURRENT_NETNS, BPF_TCP_LISTEN, bpf_sock, bpf_sock_tuple},
    helpers::{bpf_get_prandom_u32, bpf_sk_lookup_tcp, bpf_sk_lookup_udp, bpf_sk_release},
};
use lb_common::{
    Addr, BackendKey, BackendOf, Config, FlowKeyOf, FlowOf, IPPROTO_TCP, IPPROTO_UDP,
    MASQ_PORT_MAX, MASQ_PORT_MIN, PortKeyOf, Reason, Service, VipKeyOf,
    filter::AddrFilter,
    flow,
    flow::{NS_PER_SEC, Opener},
    hash::{self, CLASH_PROBES, PortRange, RANDOM_CLASH_PROBES},
    slot_for_bucket,
};

use crate::{
    conntrack,
    family::Inet,
    maps::ADDR_FILTER,
    parse::{Frame, Packet},
    room::Room,
    stats,
};

/// The address filter (`lb_common::filter`): `None` makes no promise.
#[inline(always)]
pub fn filter() -> Option<&'static AddrFilter> {
    ADDR_FILTER.get(0)
}

/// Whether nothing lb translates at ingress or at a socket is sent to `daddr`: such a packet
/// or send has no flow entry and no service to find, and is spared both lookups.
#[inline(always)]
pub fn no_service_at<A: Addr>(daddr: &A) -> bool {
    filter().is_some_and(|f| f.no_dst(daddr))
}

/// The service a flow's first packet is for: a VIP (any port), a published port on its
/// `host_ip`, or a published port on any of the node's own addresses.
#[inline(always)]
pub fn service_for<A: Inet>(key: &FlowKeyOf<A>) -> Option<Service> {
    // SAFETY (all three): map values are plain data copied out at once.
    if let Some(s) = unsafe { A::vips().get(&VipKeyOf { addr: key.daddr }) } {
        return Some(*s);
    }
    let mut port = PortKeyOf {
        addr: key.daddr,
        port: key.dport,
        proto: key.proto,
        _pad: 0,
    };
    if let Some(s) = unsafe { A::ports().get(&port) } {
        return Some(*s);
    }
    unsafe { A::local_addrs().get(&key.daddr) }?;
    port.addr = A::default();
    unsafe { A::ports().get(&port) }.copied()
}

/// Whether `addr:port` is a published port of this network (on any address, or on `addr`):
/// a masquerade port there would capture new connections to the service.
#[inline(always)]
pub fn is_published<A: Inet>(addr: A, port: u16, proto: u8) -> bool {
    let mut k = PortKeyOf {
        addr,
        port,
        proto,
        _pad: 0,
    };
    // SAFETY: presence checks only.
    if unsafe { A::ports().get(&k) }.is_some() {
        return true;
    }
    k.addr = A::default();
    unsafe { A::ports().get(&k) }.is_some()
}

/// Which sockets of the node a lookup is about.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sockets {
    /// A connection of the node's own: an established (or connecting) TCP socket, or a
    /// connected UDP socket, with exactly this 4-tuple. Listening sockets and unconnected
    /// UDP sockets (lb's own held ports among them) are not one.
    Connected,
    /// Any socket that would receive the packet, listeners and bound UDP sockets included.
    Any,
}

/// Whether a socket of the node (in the network's namespace: the one the packet's device is
/// in) would take a packet with tuple `key`, per `which`. SCTP has no lookup helper: never.
#[inline(always)]
pub fn node_socket<A: Inet>(f: &impl Frame, key: &FlowKeyOf<A>, which: Sockets) -> bool {
    // SAFETY: an all-zero tuple is a valid bpf_sock_tuple.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let size = A::sock_tuple(key, &mut tuple);
    let netns = BPF_F_CURRENT_NETNS as u64;
    // SAFETY: ctx is the program's context and the tuple lives on the stack for the call; a
    // returned socket is released on every path below.
    let sk: *mut bpf_sock = unsafe {
        match key.proto {
            IPPROTO_TCP => bpf_sk_lookup_tcp(f.raw(), &mut tuple, size, netns, 0),
            IPPROTO_UDP => bpf_sk_lookup_udp(f.raw(), &mut tuple, size, netns, 0),
            _ => return false,
        }
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a non-null socket from the lookup, readable until released.
    let taken = match which {
        Sockets::Any => true,
        Sockets::Connected => unsafe {
            if key.proto == IPPROTO_TCP {
                (*sk).state != BPF_TCP_LISTEN
            } else {
                (*sk).dst_port != 0
            }
        },
    };
    // SAFETY: releases the reference the lookup took.
    unsafe { bpf_sk_release(sk.cast()) };
    taken
}

/// Ports a client's source port may be changed to when its reply tuple is taken: the
/// kernel's NAT range (the address stays the client's, so the node's own ports do not
/// matter).
const CLASH_PORTS: PortRange = PortRange {
    min: MASQ_PORT_MIN,
    max: MASQ_PORT_MAX,
    hole_min: 1,
    hole_max: 0,
};

/// The backend the flow hash gives a packet of tuple `key` in `svc`'s set, with the hash:
/// the one choice of both modes (a NAT flow's, a DSR session's), so that `lb elements`'
/// partition is what either sends. `None` for an empty set (or a slot the controller is
/// rewriting, which a sync never leaves behind).
#[inline(always)]
pub fn pick<A: Inet>(
    key: &FlowKeyOf<A>,
    svc: &Service,
    cfg: &Config,
) -> Option<(u32, BackendOf<A>)> {
    let hash = hash::flow_hash(key, cfg.hash_key);
    Some((hash, backend_for(hash, svc)?))
}

/// The backend of `svc`'s set whose bucket `hash` falls in: the flow hash's ([`pick`]) or a
/// socket's (`sock`).
#[inline(always)]
pub fn backend_for<A: Inet>(hash: u32, svc: &Service) -> Option<BackendOf<A>> {
    let slot = slot_for_bucket(hash::bucket(hash), svc.count)?;
    // SAFETY: plain data copied out.
    unsafe {
        A::backends().get(&BackendKey {
            set_id: svc.set_id,
            slot,
        })
    }
    .copied()
}

/// Opens a flow for `p`, which has no live entry (`reopen`: its tuple's previous connection
/// is closing), to its service `svc` (`service_for`): checks that the packet may open a flow
/// and is not the node's own, picks the backend by the flow hash, claims a reply tuple no
/// other flow holds and writes both entries. Leaves the original-direction entry (F) in
/// `room.entry`; otherwise says why the packet passes (or, when no reply tuple is free, is dropped: `Err(NatFailed)`).
#[inline(always)]
pub fn new_flow<A: Inet>(
    f: &impl Frame,
    hook: u32,
    p: &Packet<FlowKeyOf<A>>,
    svc: &Service,
    cfg: &Config,
    now: u64,
    reopen: bool,
    room: &mut Room<A>,
) -> Result<(), Reason> {
    let opener = flow::opener(p.key.proto, p.tcp_flags).ok_or(Reason::NoFlowOpener)?;
    if svc.count == 0 {
        return Err(Reason::NoBackend);
    }
    // A SYN cannot belong to a connection of the node's; anything else to one of the node's
    // addresses might: published ports lie where the node picks its own local ports.
    if opener != Opener::Syn && node_socket(f, &p.key, Sockets::Connected) {
        return Err(Reason::NodeSocket);
    }
    let (hash, backend) = pick(&p.key, svc, cfg).ok_or(Reason::NoBackend)?;
    let dport = if backend.port != 0 {
        backend.port
    } else {
        p.key.dport
    };
    room.entry = FlowOf {
        saddr: p.key.saddr,
        daddr: backend.addr,
        sport: p.key.sport,
        dport,
        recreated: (opener == Opener::MidFlow) as u8,
        born: flow::stamp(now) as u16,
        hash,
        counter: backend.counter,
        ..Default::default()
    };
    let fwd = &mut room.entry;
    fwd.expires_ns =
        now + u64::from(flow::timeout_secs(fwd, p.key.proto, &cfg.timeouts)) * NS_PER_SEC;
    // The client's own port first (what the backend would see without lb); another only when
    // another flow (live, or closed within tcp_time_wait) already has this backend:port and
    // client:port: first those the flow hash gives, then, for a flow's first packet, random
    // ones (a mid-flow packet re-creating its flow needs the port it had, which only the
    // hash gives back).
    let mut claimed = false;
    let probes = match opener {
        Opener::MidFlow => CLASH_PROBES,
        Opener::Syn | Opener::Datagram => CLASH_PROBES + RANDOM_CLASH_PROBES,
    };
    for attempt in 0..=probes {
        if attempt > CLASH_PROBES {
            // SAFETY: helper without preconditions.
            let random = unsafe { bpf_get_prandom_u32() };
            fwd.sport = CLASH_PORTS
                .probe(random, 0)
                .ok_or(Reason::NatFailed)?
                .to_be();
        } else if attempt > 0 {
            fwd.sport = CLASH_PORTS
                .probe(hash, attempt - 1)
                .ok_or(Reason::NatFailed)?
                .to_be();
        }
        (room.key, room.other) = flow::partner(&p.key, fwd);
        if conntrack::claim(&room.key, &room.other, &p.key, now) {
            claimed = true;
            break;
        }
    }
    if !claimed {
        return Err(Reason::NatFailed);
    }
    if fwd.sport != p.key.sport {
        stats::reason(hook, Reason::PortClash);
    }
    if !conntrack::put(&p.key, &room.entry) {
        return Err(Reason::NatFailed);
    }
    stats::reason(
        hook,
        match (reopen, opener) {
            (true, _) => Reason::FlowReopened,
            (false, Opener::MidFlow) => Reason::FlowRecreated,
            _ => Reason::FlowNew,
        },
    );
    Ok(())
}
