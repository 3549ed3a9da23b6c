//! DSR mode (DESIGN.md "DSR mode"; moby's `docker-lb-dsr` netdev table): a packet to a VIP of
//! a `dsr` network (`SERVICE_DSR`) is sent to its backend at layer 2 — the backend's MAC as
//! destination, the sending device's own as source — and nothing else of it changes: no TTL,
//! no checksum, no flow entry. The backend owns the VIP itself and answers the client
//! directly, so the balancer sees one direction only.
//!
//! Both families run this one path (`Packet<FlowKeyOf<A>>`): an IPv6 VIP's packets use the
//! IPv6 twins of the two maps (`lb_dsr_sessions6`, `lb_dsr_backends6`, `FamilyMaps`), and
//! everything else is the same, since only the Ethernet header is rewritten.
//!
//! Which backend: the session of the packet's tuple as it arrives (`lb_dsr_sessions`, keyed
//! by the same `FlowKey` the parser builds: client address and port, VIP and port, protocol)
//! while it is live (`lb_common::dsr`, the VIP's `session_timeout`); otherwise the flow hash
//! over the VIP's set, exactly as a NAT flow picks (`lb::pick`: the `real-server` partition
//! `lb elements` prints), with the frame header the controller resolved for that backend
//! (`lb_dsr_backends`), which the new session then keeps. Any packet opens a session, as in
//! moby (a mid-connection ACK after the balancer forgot its session lands where the hash
//! says, which is the backend it had while the set is unchanged), except a TCP RST: a RST
//! ends its session at once after being sent on (moby's intent with `timeout 0s`), and one
//! without a session is sent by the hash and opens nothing. A VIP with no backend drops what
//! no session carries (moby's `counter drop`); so does a chosen backend whose MAC is not
//! resolved yet (the controller keeps such backends out of new sessions meanwhile).
//!
//! Where it hooks: the NAT ingress path already finds the service of a packet that has no
//! live flow (`nat::ingress_entry`), and DSR packets never have flow entries, so the service
//! entry's flags decide there. A NAT network's packets pay nothing for DSR: no map lookup,
//! one flag test on a flow's first packet. A DSR packet pays the flow table's miss before
//! its session lookup. (A flow entry of the tuple from before its network turned `dsr` keeps
//! serving that connection by NAT until it ends.)
//!
//! Fragments: a first fragment carries the ports and is sent like a whole packet, recording
//! its datagram's ports (`frag`); a later fragment, whose ports the parser filled in from
//! that record, follows its datagram's live session and never opens one. A later fragment
//! without a record (it overtook its first) or without a live session passes to the stack
//! untouched (`FragUnknown`), as on the NAT path.
//!
//! What never comes here, and so passes as before: ARP and what is neither IPv4 nor IPv6,
//! ICMP and ICMPv6 (a ping to the VIP is answered by the balancer's own VIP address; neighbour
//! discovery for the VIP is answered by the balancer too, which is what draws the clients'
//! frames to it), addresses that are no VIP, NAT VIPs and a `dsr` network's published ports. At XDP, a TCP/UDP packet whose checksum may be a
//! CHECKSUM_PARTIAL seed is left to TC (`nat::xdp_can_rewrite`): XDP_TX would send the seed
//! as if it were the sum, while the skb keeps the offload state wherever it is sent.
//!
//! How the frame leaves: the session's device, out of which XDP sends it (`XDP_TX` when that
//! is the device it came in on, `bpf_redirect` otherwise) and TC ingress redirects it to that
//! device's egress.
use aya_ebpf::{
    bindings::{BPF_ANY, xdp_action},
    helpers::bpf_redirect,
};
use lb_common::{
    Config, DsrSessionOf, FlowKeyOf, IPPROTO_TCP, Reason, Service,
    dsr::{live, refresh_due},
    flow::TCP_RST,
};

use crate::{
    family::Inet,
    frag, lb,
    parse::{Frag, Packet, Xdp, ptr_at},
    stats,
    verdict::{Ctx, Verdict},
};

/// Sends `p`, a packet without a live flow to DSR VIP `svc`, by its session or a new one
/// (see the module): the verdict, whose reason is the run's outcome. `session`: room for the
/// session (the run's slot, `room::Room`: an IPv6 one on the stack left the IPv6 TC
/// ingress program's frame over its 512 bytes, with the fast path's).
#[inline(always)]
pub fn send<C: Ctx, A: Inet>(
    ctx: &C,
    hook: u32,
    p: &Packet<FlowKeyOf<A>>,
    svc: &Service,
    cfg: &Config,
    now: u64,
    session: &mut DsrSessionOf<A>,
) -> Verdict {
    let rst = p.key.proto == IPPROTO_TCP && p.tcp_flags & TCP_RST != 0;
    if let Some(s) = A::dsr_sessions().get_ptr_mut(&p.key) {
        // SAFETY: the map owns the value; it is copied out, and only `seen_ns` is written
        // back (two CPUs writing it race to nearly the same time, either is right).
        *session = unsafe { *s };
        if live(session, svc.session_timeout, now) {
            if rst {
                let v = out(ctx, p, session, Reason::DsrReset);
                // After the frame is written: a RST the write failed on ends nothing.
                if let Verdict::Dsr { .. } = v {
                    let _ = A::dsr_sessions().remove(&p.key);
                }
                return v;
            }
            if refresh_due(session, svc.session_timeout, now) {
                // SAFETY: as above.
                unsafe { (*s).seen_ns = now };
            }
            return out(ctx, p, session, Reason::DsrSession);
        }
        stats::reason(hook, Reason::EntryExpired);
    }
    if let Frag::Later(_) = p.frag {
        return Verdict::Pass(Reason::FragUnknown);
    }
    let Some((_, backend)) = lb::pick(&p.key, svc, cfg) else {
        return Verdict::Drop(Reason::DsrNoBackend);
    };
    // SAFETY: read in place into the session (a copy on the stack cost the IPv6 program's
    // frame room it has not got); the controller rewrites an entry whole, never in place.
    let Some(ep) = (unsafe { A::dsr_backends().get(&backend.addr) }) else {
        return Verdict::Drop(Reason::DsrUnresolved);
    };
    *session = DsrSessionOf {
        backend: backend.addr,
        ifindex: ep.ifindex,
        dmac: ep.dmac,
        smac: ep.smac,
        counter: backend.counter,
        _pad: Default::default(),
        seen_ns: now,
    };
    let v = out(ctx, p, session, Reason::DsrNew);
    if !rst && matches!(v, Verdict::Dsr { .. }) {
        // Another CPU opening the same session meanwhile picked the same backend (same
        // tuple, same set): whichever write lands, the session is the same. A full table
        // evicts its least recently used session, which then picks by the hash again.
        let _ = A::dsr_sessions().insert(&p.key, session, BPF_ANY as u64);
    }
    v
}

/// Readdresses the frame to `s`'s backend and counts it; the verdict that sends it out of
/// `s`'s device with `reason`.
#[inline(always)]
fn out<C: Ctx, A: Inet>(
    ctx: &C,
    p: &Packet<FlowKeyOf<A>>,
    s: &DsrSessionOf<A>,
    reason: Reason,
) -> Verdict {
    // The parser read the Ethernet header, so this only fails on a frame that shrank since.
    let Some(macs) = ptr_at::<[[u8; 6]; 2]>(ctx, 0) else {
        return Verdict::Pass(Reason::Malformed);
    };
    // SAFETY: ptr_at bounds-checked the 12 bytes; no checksum covers the link header.
    unsafe { macs.write_unaligned([s.dmac, s.smac]) };
    frag::record(p);
    stats::account(s.counter, p.len);
    Verdict::Dsr {
        reason,
        ifindex: s.ifindex,
    }
}

/// The XDP action that sends a DSR frame out of `ifindex`: back out of the device it came in
/// on (`XDP_TX`), or redirected to another.
#[inline(always)]
pub fn xdp_action(ctx: &Xdp, ifindex: u32) -> u32 {
    // SAFETY: the context is valid for the whole run.
    if ifindex == unsafe { (*ctx.0.ctx).ingress_ifindex } {
        return xdp_action::XDP_TX;
    }
    // SAFETY: records the target in this CPU's redirect state; flags 0 are always valid.
    unsafe { bpf_redirect(ifindex, 0) as u32 }
}

/// The TC ingress action that sends a DSR frame out of `ifindex` (its egress).
#[inline(always)]
pub fn tc_action(ifindex: u32) -> i32 {
    // SAFETY: as above.
    unsafe { bpf_redirect(ifindex, 0) as i32 }
}
