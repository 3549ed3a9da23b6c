//! The flow lifecycle: which packets open a flow, how a flow's state follows its packets, when
//! its entries expire, and how its entries find each other. Pure rules, run by the programs
//! per packet and by the controller's garbage collector, and unit-tested here.
//!
//! # Entries
//! A load-balanced flow has two entries in `lb_flows`, one per direction, each keyed by the
//! tuple the packet carries at the hook that translates it:
//! - F, ingress, original direction: `client:c → service:p` becomes `client:c' → backend:q`;
//! - R, egress, reply direction: `backend:q → client:c'` becomes `service:p → client:c`.
//!
//! A masqueraded flow has two more, the source-NAT pair:
//! - S, egress, original direction: `client:c' → backend:q` becomes `node:m → backend:q`;
//! - C, ingress, reply direction: `backend:q → node:m` becomes `backend:q → client:c'`.
//!
//! Every entry's partner (F↔R, S↔C) is keyed by the entry's own rewritten tuple reversed, so
//! either entry finds the other with no extra field, and a missing partner can be rebuilt from
//! the entry ([`partner`]). R's key is the flow's reply tuple at the backend; C's is the
//! masquerade claim: inserting one only where absent (or expired, or already this flow's) is
//! what keeps two flows from ever sharing a reply tuple (`c' ≠ c` when another flow holds
//! `backend:q → client:c`, as the kernel's NAT changes a clashing source port).
//!
//! # State
//! Each entry carries the whole flow's state (replied, FIN/RST seen per side, re-created)
//! rather than pointing at one record, so that a packet costs one lookup. Both entries of a pair
//! see every packet of the flow (F and S the client's, R and C the backend's), and a state
//! change is written to the entry and its partner at once. The fields are single bytes, each
//! written only when it changes and only ever set within one flow (but `recreated`, which the
//! backend's answer clears together with setting `replied`), so two CPUs updating one entry can
//! only add to each other's changes, never undo them; the expiry they write may then briefly
//! reflect the state one of them saw, which the next packet or the partner's write corrects.
//!
//! # Expiry
//! An entry past its expiry counts as absent everywhere (the programs never act on it, so even
//! `lb load` without a daemon expires flows); the daemon's collector deletes expired entries of
//! both directions off the hot path. An active flow's expiry is rewritten at most once per
//! [`REFRESH_NS`] (a write per packet would bounce the entry's cache line between CPUs), each
//! time for the entry and its partner, so a flow with traffic in one direction only keeps both
//! directions alive, and a partner lost to LRU eviction is put back within a second.
//!
//! # Judgment (the vetted fast path)
//! Where the node's forward hooks hold rules, a direction of a flow may bypass the stack
//! only while netfilter's judgment of it stands, as with an nftables flowtable: F's `vetted`
//! (the client's direction) and R's (the backend's) record when a packet of that direction
//! was last seen at TC egress of the interface it leaves by, which a packet reaches only past
//! the forward and postrouting hooks, with its conntrack entry created or refreshed. A
//! judgment stands for [`REJUDGE_NS`] and only if made after the controller's last rule change
//! (`lb_vetted_since`); then the direction's next packet takes the stack again: rules that
//! changed see it (a drop stops the flow: nothing stamps it again), the node's conntrack
//! entry stays fresh, and the packet that passes renews the judgment.
use crate::{Addr, FLOW_EGRESS, FLOW_REPLY, FlowKeyOf, FlowOf, IPPROTO_TCP, Timeouts};

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// An entry's expiry is rewritten when it would move by more than this.
pub const REFRESH_NS: u64 = 1_000_000_000;
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// How long a direction's judgment stands ([`vetted`]): one packet of a fast direction takes
/// the stack this often. Short against the node's conntrack timeouts (the shortest the kernel
/// keeps a flow with traffic both ways is UDP's 120 s; 30 s one way), long enough that the
/// stack's share of a busy flow's packets is negligible.
pub const REJUDGE_NS: u64 = 2_000_000_000;
/// A stamp's unit: `bpf_ktime_get_ns` shifted right by this (about a millisecond), so that a
/// stamp fits `FlowOf::vetted` and wraps only after some 50 days.
pub const STAMP_SHIFT: u32 = 20;
const REJUDGE_UNITS: u32 = (REJUDGE_NS >> STAMP_SHIFT) as u32;

/// The stamp of the monotonic time `now_ns` (never 0, which says "never judged").
#[inline(always)]
pub fn stamp(now_ns: u64) -> u32 {
    let s = (now_ns >> STAMP_SHIFT) as u32;
    if s == 0 { 1 } else { s }
}

/// Whether a direction judged at `judged` (its entry's `vetted`) may bypass the stack at
/// stamp `now`, the controller's last rule change being at stamp `since`: judged, less than
/// [`REJUDGE_NS`] ago, and after that change (strictly: a judgment in the same unit may
/// predate it). Compared as wrapping differences, so the stamp's wrap does not matter.
#[inline(always)]
pub fn vetted(judged: u32, now: u32, since: u32) -> bool {
    judged != 0
        && now.wrapping_sub(judged) < REJUDGE_UNITS
        && (judged.wrapping_sub(since) as i32) > 0
}

/// Whether a packet with `tcp_flags` (0 for other protocols) may take the vetted fast path,
/// and stamp its direction judged when TC egress sees it: never a TCP SYN, FIN or RST, which
/// the node's conntrack must see, so that its entry is established before the connection
/// becomes fast (its ACK ending the handshake takes the stack) and learns the connection's
/// end (else it would keep an established entry for days). The kernel's flowtable likewise
/// offloads established connections only and sends FIN and RST to the slow path.
#[inline(always)]
pub fn judgeable(tcp_flags: u8) -> bool {
    tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST) == 0
}

/// The judgment stamp a packet with `tcp_flags` of a direction whose entry holds `vetted`
/// asks the vetted fast path to stand by: the entry's, or none (0) for a packet conntrack
/// must see ([`judgeable`]).
#[inline(always)]
pub fn judgment(vetted: u32, tcp_flags: u8) -> u32 {
    if judgeable(tcp_flags) { vetted } else { 0 }
}

/// How old a TCP flow must be, in stamp units (about 100 ms), before it asks the controller
/// for a liberal conntrack entry (`CtRequestOf`) and so may take the vetted fast path: a
/// short connection (a request and its answer) would gain nothing from the fast path and
/// would cost the controller a round trip to the kernel's conntrack per connection.
pub const LIBERAL_AFTER: u16 = 100;

/// Whether a flow born at stamp `born` (`FlowOf::born`) is [`LIBERAL_AFTER`] old at stamp
/// `now` (a wrapping difference: a flow some 65 s older than that looks young again for
/// 100 ms, which only delays its request).
#[inline(always)]
pub fn old_enough(born: u16, now: u32) -> bool {
    (now as u16).wrapping_sub(born) >= LIBERAL_AFTER
}

/// How a packet without a live entry may open a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opener {
    /// A TCP SYN (without ACK, FIN or RST).
    Syn,
    /// A TCP packet of an established connection (ACK, no SYN/FIN/RST) whose entries are gone:
    /// re-created on the backend the flow hash gives, with the short `tcp_unreplied` timeout
    /// until the backend answers, so spoofed ACKs cannot fill the table.
    MidFlow,
    /// A UDP or SCTP packet.
    Datagram,
}

/// What a packet with no live entry may do: open a flow, or pass (`None`). A SYN-ACK, a FIN
/// or a RST never opens one: it belongs to a connection lb did not translate (the node's own,
/// say) or to one that is over.
#[inline(always)]
pub fn opener(proto: u8, tcp_flags: u8) -> Option<Opener> {
    if proto != IPPROTO_TCP {
        return Some(Opener::Datagram);
    }
    if tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        return None;
    }
    match (tcp_flags & TCP_SYN != 0, tcp_flags & TCP_ACK != 0) {
        (true, false) => Some(Opener::Syn),
        (false, true) => Some(Opener::MidFlow),
        _ => None,
    }
}

/// Whether `e` is past its expiry at `now`.
#[inline(always)]
pub fn expired<A>(e: &FlowOf<A>, now: u64) -> bool {
    now > e.expires_ns
}

/// Whether a client's SYN on a live original-direction entry starts a new connection on that
/// tuple: the previous one is closing (a FIN or RST was seen), so the SYN is a new connection
/// reusing the port, selected afresh (the kernel does the same for a SYN in TIME_WAIT).
#[inline(always)]
pub fn reopens<A>(e: &FlowOf<A>, proto: u8, tcp_flags: u8) -> bool {
    proto == IPPROTO_TCP
        && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
        && (e.closing_orig | e.closing_reply) != 0
}

/// Folds one packet of `e`'s direction into the state `e` carries; returns whether anything
/// changed (then `e` and its partner are written).
#[inline(always)]
pub fn observe<A>(e: &mut FlowOf<A>, proto: u8, tcp_flags: u8) -> bool {
    let mut changed = false;
    let reply = e.flags & FLOW_REPLY != 0;
    if reply && e.replied == 0 {
        e.replied = 1;
        e.recreated = 0;
        changed = true;
    }
    if proto == IPPROTO_TCP {
        let rst = tcp_flags & TCP_RST != 0;
        let fin = tcp_flags & TCP_FIN != 0;
        if rst && e.reset == 0 {
            e.reset = 1;
            changed = true;
        }
        if (rst || (fin && !reply)) && e.closing_orig == 0 {
            e.closing_orig = 1;
            changed = true;
        }
        if (rst || (fin && reply)) && e.closing_reply == 0 {
            e.closing_reply = 1;
            changed = true;
        }
    }
    changed
}

/// Copies the state bytes of `from` into `to` (an entry and its partner agree on the flow).
#[inline(always)]
pub fn copy_state<A>(to: &mut FlowOf<A>, from: &FlowOf<A>) {
    to.replied = from.replied;
    to.closing_orig = from.closing_orig;
    to.closing_reply = from.closing_reply;
    to.recreated = from.recreated;
    to.reset = from.reset;
}

/// The timeout that applies to a flow in `e`'s state: TCP reset → `tcp_closing`; closed by
/// FINs both ways → `tcp_time_wait`; answered → `tcp_established`; re-created and not
/// answered yet → `tcp_unreplied`; a SYN not answered yet → `tcp_syn`; UDP and SCTP → `udp`.
/// A half-closed connection (one FIN) keeps `tcp_established`: one side may still send for
/// long.
///
/// Why a closed connection outlives a reset one, as in the kernel's conntrack (TIME_WAIT
/// 120 s, CLOSE 10 s): the side that closed first keeps the connection's 4-tuple in TIME_WAIT
/// (60 s on Linux, not tunable), and a backend in TIME_WAIT takes a SYN on that tuple only as
/// the same client's next connection, whose TCP timestamps (drawn per client address and
/// destination address) are newer; a SYN of another connection that lb sent there — the same
/// client port reused towards another service, or towards this one after its backend set
/// changed — is answered with the old connection's ACK, and the client waits a second to
/// send its SYN again. While the entries live, the reply tuple stays claimed (see `claim` in
/// the programs), so such a connection gets another source port instead. A reset connection
/// leaves no TIME_WAIT.
#[inline(always)]
pub fn timeout_secs<A>(e: &FlowOf<A>, proto: u8, t: &Timeouts) -> u32 {
    if proto != IPPROTO_TCP {
        t.udp
    } else if e.reset != 0 {
        t.tcp_closing
    } else if e.closing_orig != 0 && e.closing_reply != 0 {
        t.tcp_time_wait
    } else if e.replied != 0 {
        t.tcp_established
    } else if e.recreated != 0 {
        t.tcp_unreplied
    } else {
        t.tcp_syn
    }
}

/// The expiry to write for a packet at `now` on an entry in `e`'s state, if it must be
/// written: always after a state change (a closing flow's expiry moves *down*), otherwise
/// only when it would move up by more than [`REFRESH_NS`].
#[inline(always)]
pub fn next_expiry<A>(e: &FlowOf<A>, now: u64, timeout_secs: u32, changed: bool) -> Option<u64> {
    let at = now + u64::from(timeout_secs) * NS_PER_SEC;
    (changed || at > e.expires_ns + REFRESH_NS).then_some(at)
}

/// `key` with its addresses and ports swapped: the tuple of the other direction.
#[inline(always)]
pub fn reversed<A: Addr>(key: &FlowKeyOf<A>) -> FlowKeyOf<A> {
    FlowKeyOf {
        saddr: key.daddr,
        daddr: key.saddr,
        sport: key.dport,
        dport: key.sport,
        proto: key.proto,
        _pad: [0; 3],
    }
}

/// The tuple a packet of entry `e` leaves with.
#[inline(always)]
pub fn rewritten<A: Addr>(e: &FlowOf<A>, proto: u8) -> FlowKeyOf<A> {
    FlowKeyOf {
        saddr: e.saddr,
        daddr: e.daddr,
        sport: e.sport,
        dport: e.dport,
        proto,
        _pad: [0; 3],
    }
}

/// The key of `e`'s partner (see the module doc): `e`'s rewritten tuple reversed, built in
/// place (no intermediate tuple: an IPv6 one is 40 bytes of a program's stack).
#[inline(always)]
pub fn partner_key<A: Addr>(e: &FlowOf<A>, proto: u8) -> FlowKeyOf<A> {
    FlowKeyOf {
        saddr: e.daddr,
        daddr: e.saddr,
        sport: e.dport,
        dport: e.sport,
        proto,
        _pad: [0; 3],
    }
}

/// Whether `p` (found under `e`'s partner key) is `e`'s partner, rather than an entry of
/// another flow that reused the tuple: it rewrites to `e`'s key reversed.
#[inline(always)]
pub fn is_partner<A: Addr>(p: &FlowOf<A>, key: &FlowKeyOf<A>) -> bool {
    p.saddr == key.daddr && p.daddr == key.saddr && p.sport == key.dport && p.dport == key.sport
}

/// The partner entry of `e` (keyed by `key`), rebuilt from `e` alone: the other hook, the
/// other direction, the same pair, state, hash, counters and expiry.
#[inline(always)]
pub fn partner<A: Addr>(key: &FlowKeyOf<A>, e: &FlowOf<A>) -> (FlowKeyOf<A>, FlowOf<A>) {
    let p = FlowOf {
        saddr: key.daddr,
        daddr: key.saddr,
        sport: key.dport,
        dport: key.sport,
        flags: e.flags ^ (FLOW_EGRESS | FLOW_REPLY),
        vetted: 0,
        ..*e
    };
    (partner_key(e, key.proto), p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FLOW_MASQ, Flow, IPPROTO_UDP};

    const T: Timeouts = Timeouts::DEFAULT;

    fn f(flags: u8) -> Flow {
        Flow {
            saddr: 1,
            daddr: 2,
            sport: 3,
            dport: 4,
            flags,
            ..Default::default()
        }
    }

    #[test]
    fn a_flow_asks_for_a_liberal_entry_once_it_is_old_enough() {
        let born = stamp(5_000_000_000) as u16;
        let at = |ms: u64| stamp(5_000_000_000 + ms * 1_000_000);
        assert!(!old_enough(born, at(0)));
        assert!(!old_enough(born, at(90)));
        assert!(old_enough(born, at(120)));
        assert!(old_enough(born, at(30_000)));
        // Across the 16-bit wrap.
        assert!(old_enough(u16::MAX - 10, 200));
        assert!(!old_enough(u16::MAX - 10, 20));
    }

    #[test]
    fn a_judgment_stands_for_a_while_and_only_after_the_last_rule_change() {
        let at = |ms: u64| stamp(ms * 1_000_000 + 7_000_000_000);
        let j = at(0);
        assert!(vetted(j, at(0), 0));
        assert!(vetted(j, at(1900), at(0) - 1), "within the period");
        assert!(!vetted(j, at(2200), 0), "past it: judged again");
        assert!(!vetted(0, at(0), 0), "never judged");
        assert!(
            !vetted(j, at(1), j),
            "a rule change in the same unit voids it"
        );
        assert!(!vetted(j, at(1), at(1)), "a rule change after it voids it");
        assert!(vetted(at(5), at(6), at(1)), "judged again after the change");
        // Across the stamp's wrap.
        let (before, after) = (u32::MAX - 10, 5u32);
        assert!(vetted(before, after, before - 100));
        assert!(!vetted(before, after, before + 1));
        assert_eq!(stamp(0), 1, "0 means never");
    }

    #[test]
    fn only_syn_mid_flow_acks_and_datagrams_open_flows() {
        let tcp = |fl| opener(IPPROTO_TCP, fl);
        assert_eq!(tcp(TCP_SYN), Some(Opener::Syn));
        assert_eq!(tcp(TCP_ACK), Some(Opener::MidFlow));
        assert_eq!(tcp(TCP_ACK | 0x08), Some(Opener::MidFlow), "PSH|ACK data");
        assert_eq!(tcp(TCP_SYN | TCP_ACK), None, "SYN-ACK");
        assert_eq!(tcp(TCP_FIN | TCP_ACK), None, "FIN");
        assert_eq!(tcp(TCP_RST), None, "RST");
        assert_eq!(tcp(TCP_RST | TCP_ACK), None);
        assert_eq!(tcp(TCP_SYN | TCP_FIN), None, "SYN-FIN is no opener");
        assert_eq!(tcp(0), None, "a bare segment");
        assert_eq!(opener(IPPROTO_UDP, 0), Some(Opener::Datagram));
        assert_eq!(opener(132, 0xff), Some(Opener::Datagram));
    }

    #[test]
    fn tcp_walks_syn_established_closing() {
        let mut fwd = f(0);
        let mut rep = f(FLOW_EGRESS | FLOW_REPLY);
        assert_eq!(timeout_secs(&fwd, IPPROTO_TCP, &T), T.tcp_syn);
        assert!(
            !observe(&mut fwd, IPPROTO_TCP, TCP_SYN),
            "a SYN changes nothing"
        );
        assert!(
            observe(&mut rep, IPPROTO_TCP, TCP_SYN | TCP_ACK),
            "answered"
        );
        copy_state(&mut fwd, &rep);
        assert_eq!(timeout_secs(&fwd, IPPROTO_TCP, &T), T.tcp_established);
        assert!(!observe(&mut fwd, IPPROTO_TCP, TCP_ACK));
        assert!(
            observe(&mut fwd, IPPROTO_TCP, TCP_FIN | TCP_ACK),
            "client FIN"
        );
        copy_state(&mut rep, &fwd);
        assert_eq!(
            timeout_secs(&fwd, IPPROTO_TCP, &T),
            T.tcp_established,
            "half-closed keeps established"
        );
        assert!(
            observe(&mut rep, IPPROTO_TCP, TCP_FIN | TCP_ACK),
            "backend FIN"
        );
        assert_eq!(timeout_secs(&rep, IPPROTO_TCP, &T), T.tcp_time_wait);
        assert!(
            reopens(&fwd, IPPROTO_TCP, TCP_SYN),
            "a SYN on a closing tuple"
        );
        assert!(!reopens(&fwd, IPPROTO_TCP, TCP_SYN | TCP_ACK));
        assert!(!reopens(&f(0), IPPROTO_TCP, TCP_SYN), "SYN retransmit");
    }

    #[test]
    fn rst_from_either_side_closes_both() {
        for flags in [0, FLOW_EGRESS | FLOW_REPLY] {
            let mut e = f(flags);
            assert!(observe(&mut e, IPPROTO_TCP, TCP_RST));
            assert_eq!((e.closing_orig, e.closing_reply, e.reset), (1, 1, 1));
            assert_eq!(timeout_secs(&e, IPPROTO_TCP, &T), T.tcp_closing);
            assert!(!observe(&mut e, IPPROTO_TCP, TCP_RST), "nothing new");
        }
    }

    #[test]
    fn a_rst_after_the_fins_ends_the_time_wait() {
        let mut e = f(0);
        observe(&mut e, IPPROTO_TCP, TCP_FIN | TCP_ACK);
        let mut rep = f(FLOW_EGRESS | FLOW_REPLY);
        copy_state(&mut rep, &e);
        observe(&mut rep, IPPROTO_TCP, TCP_FIN | TCP_ACK);
        assert_eq!(timeout_secs(&rep, IPPROTO_TCP, &T), T.tcp_time_wait);
        const { assert!(T.tcp_time_wait > T.tcp_closing) };
        assert!(observe(&mut rep, IPPROTO_TCP, TCP_RST), "reset");
        copy_state(&mut e, &rep);
        assert_eq!(timeout_secs(&e, IPPROTO_TCP, &T), T.tcp_closing);
    }

    #[test]
    fn recreated_flows_wait_briefly_for_the_backend() {
        let mut e = f(FLOW_EGRESS | FLOW_REPLY);
        e.recreated = 1;
        assert_eq!(timeout_secs(&e, IPPROTO_TCP, &T), T.tcp_unreplied);
        observe(&mut e, IPPROTO_TCP, TCP_ACK);
        assert_eq!(e.recreated, 0);
        assert_eq!(timeout_secs(&e, IPPROTO_TCP, &T), T.tcp_established);
    }

    #[test]
    fn datagrams_have_one_timeout() {
        let mut e = f(0);
        assert_eq!(timeout_secs(&e, IPPROTO_UDP, &T), T.udp);
        e.flags = FLOW_EGRESS | FLOW_REPLY;
        assert!(observe(&mut e, IPPROTO_UDP, 0xff));
        assert_eq!(e.closing_orig, 0, "no TCP flags outside TCP");
        assert_eq!(timeout_secs(&e, IPPROTO_UDP, &T), T.udp);
    }

    #[test]
    fn expiry_moves_once_a_second_or_on_change() {
        let mut e = f(0);
        e.expires_ns = 100 * NS_PER_SEC;
        let now = 100 * NS_PER_SEC - 60 * NS_PER_SEC;
        assert_eq!(next_expiry(&e, now, 60, false), None, "same second");
        let later = now + 2 * NS_PER_SEC;
        assert_eq!(
            next_expiry(&e, later, 60, false),
            Some(later + 60 * NS_PER_SEC)
        );
        assert_eq!(
            next_expiry(&e, now, 10, true),
            Some(now + 10 * NS_PER_SEC),
            "shortened"
        );
        assert!(!expired(&e, 100 * NS_PER_SEC));
        assert!(expired(&e, 100 * NS_PER_SEC + 1));
    }

    #[test]
    fn partners_find_and_rebuild_each_other() {
        partners([10u32, 99, 20]);
        let v6 = |last: u32| [0xfd00_0000u32.to_be(), 0, 0, last.to_be()];
        partners([v6(0x10), v6(0x99), v6(0x20)]);
    }

    /// The partner rules over addresses `[client, service, backend]` of one family.
    fn partners<A: Addr>([client, service, backend]: [A; 3]) {
        let key = FlowKeyOf {
            saddr: client,
            daddr: service,
            sport: 1000,
            dport: 80,
            proto: IPPROTO_TCP,
            _pad: [0; 3],
        };
        let fwd = FlowOf {
            saddr: client,
            daddr: backend,
            sport: 1000,
            dport: 8080,
            hash: 7,
            expires_ns: 5,
            replied: 1,
            ..Default::default()
        };
        let (rk, rep) = partner(&key, &fwd);
        assert_eq!(
            (rk.saddr, rk.daddr, rk.sport, rk.dport),
            (backend, client, 8080, 1000)
        );
        assert_eq!(rep.flags, FLOW_EGRESS | FLOW_REPLY);
        assert_eq!(
            (rep.saddr, rep.daddr, rep.sport, rep.dport),
            (service, client, 80, 1000)
        );
        assert_eq!((rep.hash, rep.expires_ns, rep.replied), (7, 5, 1));
        assert!(is_partner(&rep, &key));
        assert!(is_partner(&fwd, &rk));
        let (back, again) = partner(&rk, &rep);
        assert_eq!(back, key);
        assert_eq!(again, fwd);
        let masq = FlowOf {
            flags: FLOW_EGRESS | FLOW_MASQ,
            ..fwd
        };
        assert_eq!(partner(&key, &masq).1.flags, FLOW_MASQ | FLOW_REPLY);
        let mut other = rep;
        other.dport = 999;
        assert!(
            !is_partner(&other, &key),
            "another flow's entry under the key"
        );
        other = rep;
        other.saddr = backend;
        assert!(!is_partner(&other, &key), "another address under the key");
    }
}
