//! The DSR path under BPF_PROG_TEST_RUN, on lb_xdp and lb_tc_ingress: one packet in, the
//! verdict, the bytes out and the session entry it left, against maps filled by the same
//! `sync` that `lb load` uses for a `mode: dsr` network (the fixture's network, turned dsr).
//! `lb_dsr_backends` — the controller's MAC resolution, not this part — is written by the
//! tests directly, as the controller would from the neighbour table. Root only.
//!
//! IPv6 VIPs take the same path with the IPv6 maps (`lb_dsr_sessions6`, `lb_dsr_backends6`):
//! the `*_ipv6` cases run the fixture's dual-stack network (`web` with `VIP6` and `WEB6`)
//! through the programs' IPv6 twins, with the same frame checks.
//!
//! A test run's packet comes in on loopback (ifindex 1: an XDP run's `ingress_ifindex`, a TC
//! run's device), so a backend resolved on ifindex 1 is "on the device the frame came in on"
//! (XDP_TX), any other ifindex another device (XDP_REDIRECT). A test run only reports a
//! redirect; nothing is sent.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::{
    Addr, DsrSession, DsrSession6, Endpoint, FlowKey, FlowKey6, FlowKeyOf, Reason, SERVICE_DSR,
    flow::NS_PER_SEC,
    hash::{bucket, flow_hash},
    slot_for_bucket,
};
use lb_tests::{
    fixture::{
        CLIENT, EMPTY_BACKEND, EMPTY_VIP, Fixture, NODE, Prog, TC_ACT_OK, TC_ACT_SHOT, VIP, VIP6,
        WEB, WEB6, XDP_DROP, XDP_PASS, dual_stack_network, expect_untouched, key, key6, network,
        reason_count,
    },
    packet::{
        Ext, Ipv4Packet, Ipv6Packet, TCP_ACK, TCP_PSH, TCP_RST, arp_request, icmp_message, ip_of,
        pseudo_seed,
    },
    require_root,
};
use lb_user::{
    core::{
        compose::compose,
        elements::{Interval, REAL_SERVER, dsr_elements},
        model::{Masquerade, Mode, Network},
    },
    dataplane::ebpf::{MapAddr, ServiceKey, be4, be6, gc::monotonic_ns},
};

const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;
const TC_ACT_REDIRECT: u32 = 7;
/// The device a test run's packet comes in on (loopback).
const RUN_IFINDEX: u32 = 1;
/// A device other than the ingress one (a test run never sends, so it need not exist).
const OTHER_IFINDEX: u32 = 4242;
/// The sending device's own MAC, as `lb_dsr_backends` gives it.
const DEV_MAC: [u8; 6] = [0x02, 0xdd, 0, 0, 0, 0x01];
/// The network's session timeout (seconds).
const TIMEOUT: u32 = 30;
/// A fixed flow hash key, so that each run picks the same backends (the spread over every
/// backend that a case asserts holds for this key, as for most).
const HASH_KEY: u32 = 0x0d5e_2024;
/// The programs the DSR path runs in.
const INGRESS: [Prog; 2] = [Prog::Xdp, Prog::TcIngress];
/// The IPv6 client of the `*_ipv6` cases.
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2);

/// A backend's MAC in these tests: the low four bytes of its address.
fn mac_of(ip: impl Into<IpAddr>) -> [u8; 6] {
    let low = match ip.into() {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => v6.octets()[12..].try_into().unwrap(),
    };
    let [a, b, c, d] = low;
    [0x02, 0xbb, a, b, c, d]
}

fn backend_by_mac(mac: &[u8]) -> Ipv4Addr {
    (WEB.iter().chain([&EMPTY_BACKEND]))
        .copied()
        .find(|ip| mac_of(*ip) == mac)
        .unwrap_or_else(|| panic!("destination MAC {mac:02x?} is no backend's"))
}

fn backend6_by_mac(mac: &[u8]) -> Ipv6Addr {
    (WEB6.iter().copied())
        .find(|ip| mac_of(*ip) == mac)
        .unwrap_or_else(|| panic!("destination MAC {mac:02x?} is no IPv6 backend's"))
}

/// The fixture's network (`web`: VIP with 3 backends and published ports, `empty`: a VIP
/// whose one backend is disabled, `db`), `mode: dsr`.
fn dsr_network() -> Network {
    let mut net = network(Masquerade::Never);
    net.mode = Mode::Dsr;
    net.timeouts.dsr = Some(TIMEOUT);
    net
}

/// Writes `ip`'s `lb_dsr_backends` (`lb_dsr_backends6`) entry: reached out of `ifindex`.
fn resolve(f: &mut Fixture, ip: impl Into<IpAddr>, ifindex: u32) {
    let ip = ip.into();
    let ep = Endpoint {
        ifindex,
        l3_ifindex: ifindex,
        mtu: 1500,
        dmac: mac_of(ip),
        smac: DEV_MAC,
        flags: 0,
    };
    match ip {
        IpAddr::V4(v4) => f.dp.dsr_backends_mut().insert(be4(v4), ep, 0),
        IpAddr::V6(v6) => f.dp.dsr_backends6_mut().insert(be6(v6), ep, 0),
    }
    .expect("writing the DSR backend map");
}

/// A dsr fixture with every backend resolved on the ingress device.
fn fixture() -> Option<Fixture> {
    let name = std::thread::current()
        .name()
        .unwrap_or("dsr_prog")
        .to_owned();
    if !require_root(&name) {
        return None;
    }
    let mut f = Fixture::with_network(dsr_network(), Some(HASH_KEY));
    for ip in WEB.into_iter().chain([EMPTY_BACKEND]) {
        resolve(&mut f, ip, RUN_IFINDEX);
    }
    Some(f)
}

/// [`fixture`] of the dual-stack network: `web`'s IPv6 VIP and backends, resolved likewise.
fn fixture6() -> Option<Fixture> {
    let name = std::thread::current()
        .name()
        .unwrap_or("dsr_prog")
        .to_owned();
    if !require_root(&name) {
        return None;
    }
    let mut net = dual_stack_network(Masquerade::Never);
    net.mode = Mode::Dsr;
    net.timeouts.dsr = Some(TIMEOUT);
    let mut f = Fixture::with_network(net, Some(HASH_KEY));
    for ip in WEB6 {
        resolve(&mut f, ip, RUN_IFINDEX);
    }
    Some(f)
}

fn session6(f: &Fixture, k: &FlowKey6) -> Option<DsrSession6> {
    (f.dp.dsr_sessions6().into_iter())
        .find(|(sk, _)| sk == k)
        .map(|(_, s)| s)
}

fn session(f: &Fixture, k: &FlowKey) -> Option<DsrSession> {
    (f.dp.dsr_sessions().into_iter())
        .find(|(sk, _)| sk == k)
        .map(|(_, s)| s)
}

fn put_session(f: &mut Fixture, k: &FlowKey, s: DsrSession) {
    f.dp.dsr_sessions_mut()
        .insert(k, s, 0)
        .expect("writing lb_dsr_sessions");
}

/// The backend the flow hash gives `p` in its VIP's set, under the network's hash key: the
/// composed set's member at `slot_for_bucket`, which must be the one the rendered
/// `real-server` element of that bucket names (what `lb elements` prints).
fn hashed_backend(f: &Fixture, p: &Ipv4Packet) -> Ipv4Addr {
    let IpAddr::V4(b) = hashed_of(f, p.daddr.into(), &key(p)) else {
        panic!("an IPv4 VIP's set holds IPv4 backends")
    };
    b
}

fn hashed_backend6(f: &Fixture, p: &Ipv6Packet) -> Ipv6Addr {
    let IpAddr::V6(b) = hashed_of(f, p.daddr.into(), &key6(p)) else {
        panic!("an IPv6 VIP's set holds IPv6 backends")
    };
    b
}

/// [`hashed_backend`] of tuple `k` to `vip`, of either family.
fn hashed_of<A: Addr>(f: &Fixture, vip: IpAddr, k: &FlowKeyOf<A>) -> IpAddr {
    let hash_key = f.dp.config().unwrap().hash_key;
    let b = bucket(flow_hash(k, hash_key));
    let composed = compose(&f.net);
    let set = &composed.vips[&vip];
    let slot = slot_for_bucket(b, set.len() as u32).expect("a set with backends");
    let by_slot = set[slot as usize];
    let prefix = format!("{vip} . ");
    let by_element = (dsr_elements(&composed).into_iter())
        .filter(|e| e.map == REAL_SERVER)
        .find_map(|e| {
            let interval: Interval = e.key.strip_prefix(&prefix)?.parse().unwrap();
            interval
                .contains(b)
                .then(|| e.value.parse::<IpAddr>().unwrap())
        })
        .unwrap_or_else(|| panic!("no real-server element of {vip} holds bucket {b}"));
    assert_eq!(
        by_slot, by_element,
        "slot {slot} and the rendered element agree"
    );
    by_slot
}

/// The counter id `sync` gave backend `ip` in VIP `vip`'s set.
fn counter_of(f: &Fixture, vip: Ipv4Addr, ip: Ipv4Addr) -> u32 {
    let held = f.dp.current_services().unwrap();
    let (_, set) = &held[&ServiceKey::Vip(MapAddr::V4(be4(vip)))];
    (set.iter().find(|b| b.addr == MapAddr::V4(be4(ip))))
        .unwrap_or_else(|| panic!("{ip} is in {vip}'s set"))
        .counter
}

/// The verdict of a frame sent by DSR out of `ifindex` on `prog`.
fn sent(prog: Prog, ifindex: u32) -> u32 {
    match prog {
        Prog::Xdp if ifindex == RUN_IFINDEX => XDP_TX,
        Prog::Xdp => XDP_REDIRECT,
        _ => TC_ACT_REDIRECT,
    }
}

/// Runs `p` through `prog` and asserts it was sent by DSR out of `ifindex`: the backend's MAC
/// as destination, the device's as source, every byte from the EtherType on as it came in,
/// and no flow entry. Returns the backend.
fn expect_dsr(f: &mut Fixture, prog: Prog, p: &Ipv4Packet, ifindex: u32) -> Ipv4Addr {
    expect_dsr_frame(f, prog, &p.build(), ifindex)
}

fn expect_dsr_frame(f: &mut Fixture, prog: Prog, input: &[u8], ifindex: u32) -> Ipv4Addr {
    backend_by_mac(&expect_dsr_mac(f, prog, input, ifindex))
}

/// [`expect_dsr`] of an IPv6 packet (its program is the hook's IPv6 twin, by tail call).
fn expect_dsr6(f: &mut Fixture, prog: Prog, input: &[u8], ifindex: u32) -> Ipv6Addr {
    backend6_by_mac(&expect_dsr_mac(f, prog, input, ifindex))
}

/// The checks of [`expect_dsr`] on a frame of either family; returns its destination MAC.
fn expect_dsr_mac(f: &mut Fixture, prog: Prog, input: &[u8], ifindex: u32) -> [u8; 6] {
    let run = f.test_run(prog, input, None).expect("test run");
    assert_eq!(run.verdict, sent(prog, ifindex), "{prog:?}: verdict");
    assert_eq!(run.out.len(), input.len(), "{prog:?}: same length");
    assert_eq!(
        run.out[6..12],
        DEV_MAC,
        "{prog:?}: source MAC is the device's"
    );
    assert_eq!(
        run.out[12..],
        input[12..],
        "{prog:?}: EtherType, L3 and L4 bytes identical"
    );
    assert_eq!(run.meta, None, "{prog:?}: no handoff to TC");
    assert!(
        f.dp.flow_entries().is_empty() && f.dp.flow_entries6().is_empty(),
        "{prog:?}: DSR writes no flow entry"
    );
    run.out[..6].try_into().unwrap()
}

/// Runs `input` through `prog`, which must drop it, untouched.
fn expect_drop(f: &mut Fixture, prog: Prog, input: &[u8]) {
    let run = f.test_run(prog, input, None).expect("test run");
    let drop = if prog == Prog::Xdp {
        XDP_DROP
    } else {
        TC_ACT_SHOT
    };
    assert_eq!(run.verdict, drop, "{prog:?}: dropped");
    assert_eq!(run.out, input, "{prog:?}: untouched");
}

fn count(f: &Fixture, prog: Prog, reason: Reason) -> u64 {
    reason_count(f, prog.hook(), reason)
}

/// A new session: the backend is the one the flow hash picks over the `real-server`
/// partition, the frame goes to its MAC from the device's (XDP_TX / TC redirect), L3 and L4
/// untouched, and the session entry records backend, device, MACs, counter and time. Over
/// many client ports every backend is used, each as the hash says.
#[test]
fn a_new_session_goes_to_the_hashed_backend_by_mac_with_l3_l4_untouched() {
    let Some(mut f) = fixture() else { return };
    let (svc, _) = f.dp.current_services().unwrap()[&ServiceKey::Vip(MapAddr::V4(be4(VIP)))];
    assert_eq!(
        (svc.flags & SERVICE_DSR, svc.session_timeout),
        (SERVICE_DSR, TIMEOUT),
        "sync marked the VIP dsr"
    );
    for (i, prog) in INGRESS.into_iter().enumerate() {
        let before = count(&f, prog, Reason::DsrNew);
        let mut used = std::collections::BTreeSet::new();
        for (j, sport) in (40000 + 100 * i as u16..).take(30).enumerate() {
            let p = match j % 3 {
                0 => Ipv4Packet::tcp(CLIENT, sport, VIP, 443),
                1 => Ipv4Packet::udp(CLIENT, sport, VIP, 53),
                _ => Ipv4Packet::sctp(CLIENT, sport, VIP, 9000),
            };
            let t0 = monotonic_ns();
            let backend = expect_dsr(&mut f, prog, &p, RUN_IFINDEX);
            assert_eq!(
                backend,
                hashed_backend(&f, &p),
                "{prog:?}: the hashed backend"
            );
            let s = session(&f, &key(&p)).expect("a session entry");
            assert_eq!(
                s,
                DsrSession {
                    backend: be4(backend),
                    ifindex: RUN_IFINDEX,
                    dmac: mac_of(backend),
                    smac: DEV_MAC,
                    counter: counter_of(&f, VIP, backend),
                    _pad: [],
                    seen_ns: s.seen_ns,
                },
                "{prog:?}: the session of {p:?}"
            );
            assert!(
                (t0..=monotonic_ns()).contains(&s.seen_ns),
                "{prog:?}: seen now"
            );
            used.insert(backend);
        }
        assert_eq!(
            used.len(),
            WEB.len(),
            "{prog:?}: 30 clients use every backend"
        );
        assert_eq!(count(&f, prog, Reason::DsrNew), before + 30, "{prog:?}");
    }
}

/// A live session keeps its backend after the set changed so that the hash no longer gives
/// it (its backend disabled: draining, as moby's sessions do); new sessions avoid it. The
/// session's packets count to the backend's counter and the VIP's total.
#[test]
fn a_live_session_keeps_its_backend_after_the_set_changes() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40400, VIP, 443);
    let first = expect_dsr(&mut f, Prog::TcIngress, &syn, RUN_IFINDEX);
    let counter = counter_of(&f, VIP, first);
    for b in &mut f.net.services[0].backends {
        b.disabled = b.ip == first;
    }
    f.sync();
    assert_ne!(
        hashed_backend(&f, &syn),
        first,
        "the hash now gives another"
    );
    let ack = Ipv4Packet {
        tcp_flags: TCP_ACK | TCP_PSH,
        payload: b"GET / HTTP/1.1".to_vec(),
        ..syn.clone()
    };
    for prog in INGRESS {
        let before = count(&f, prog, Reason::DsrSession);
        assert_eq!(
            expect_dsr(&mut f, prog, &ack, RUN_IFINDEX),
            first,
            "{prog:?}: the session's backend"
        );
        assert_eq!(count(&f, prog, Reason::DsrSession), before + 1, "{prog:?}");
    }
    let ip_len = |p: &Ipv4Packet| (p.build().len() - 14) as u64;
    let c = f.dp.counter(counter).unwrap();
    assert_eq!(
        (c.packets, c.bytes),
        (3, ip_len(&syn) + 2 * ip_len(&ack)),
        "counted to the backend"
    );
    for sport in 41000..41030 {
        let p = Ipv4Packet::tcp(CLIENT, sport, VIP, 443);
        let b = expect_dsr(&mut f, Prog::TcIngress, &p, RUN_IFINDEX);
        assert_ne!(b, first, "a new session must not go to a disabled backend");
    }
    let counted = f.dp.counters().unwrap();
    let total =
        f.dp.service_total(&ServiceKey::Vip(MapAddr::V4(be4(VIP))), &counted)
            .unwrap();
    assert_eq!(total.packets, 33, "the VIP's total: its backends' sum");
}

/// A TCP RST of a session is sent to the session's backend and ends the session; a RST
/// without a session is sent where the hash says and opens none.
#[test]
fn a_rst_is_sent_on_and_ends_its_session() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::Xdp, 40500), (Prog::TcIngress, 40501)] {
        let syn = Ipv4Packet::tcp(CLIENT, sport, VIP, 443);
        let backend = expect_dsr(&mut f, prog, &syn, RUN_IFINDEX);
        // A session that is not the hash's, so that "the same way" is the session's.
        let other = *WEB.iter().find(|b| **b != backend).unwrap();
        let mut s = session(&f, &key(&syn)).unwrap();
        s.backend = be4(other);
        s.dmac = mac_of(other);
        put_session(&mut f, &key(&syn), s);
        let rst = Ipv4Packet {
            tcp_flags: TCP_RST | TCP_ACK,
            ..syn.clone()
        };
        let before = count(&f, prog, Reason::DsrReset);
        assert_eq!(
            expect_dsr(&mut f, prog, &rst, RUN_IFINDEX),
            other,
            "{prog:?}: the RST goes by the session"
        );
        assert_eq!(session(&f, &key(&syn)), None, "{prog:?}: the session ended");
        assert_eq!(count(&f, prog, Reason::DsrReset), before + 1, "{prog:?}");

        let before = count(&f, prog, Reason::DsrNew);
        assert_eq!(
            expect_dsr(&mut f, prog, &rst, RUN_IFINDEX),
            hashed_backend(&f, &rst),
            "{prog:?}: a RST without a session goes by the hash"
        );
        assert_eq!(session(&f, &key(&rst)), None, "{prog:?}: and opens none");
        assert_eq!(count(&f, prog, Reason::DsrNew), before + 1, "{prog:?}");
    }
}

/// A session idle past the VIP's timeout counts as absent: the packet picks by the hash
/// again and the entry is rewritten. A live session's time is brought up to date.
#[test]
fn an_expired_session_is_picked_again() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::Xdp, 40600), (Prog::TcIngress, 40601)] {
        let p = Ipv4Packet::udp(CLIENT, sport, VIP, 53);
        let hashed = hashed_backend(&f, &p);
        let other = *WEB.iter().find(|b| **b != hashed).unwrap();
        let counter = counter_of(&f, VIP, other);
        let stale = |seen_ns| DsrSession {
            backend: be4(other),
            ifindex: RUN_IFINDEX,
            dmac: mac_of(other),
            smac: DEV_MAC,
            counter,
            _pad: [],
            seen_ns,
        };
        let timeout_ns = u64::from(TIMEOUT) * NS_PER_SEC;
        // Idle 5 s: live; its time is rewritten.
        put_session(&mut f, &key(&p), stale(monotonic_ns() - 5 * NS_PER_SEC));
        let t0 = monotonic_ns();
        assert_eq!(
            expect_dsr(&mut f, prog, &p, RUN_IFINDEX),
            other,
            "{prog:?}: live"
        );
        let s = session(&f, &key(&p)).unwrap();
        assert!(s.seen_ns >= t0, "{prog:?}: the session's time refreshed");

        put_session(
            &mut f,
            &key(&p),
            stale(monotonic_ns() - timeout_ns - NS_PER_SEC),
        );
        let (new, expired) = (
            count(&f, prog, Reason::DsrNew),
            count(&f, prog, Reason::EntryExpired),
        );
        let t0 = monotonic_ns();
        assert_eq!(
            expect_dsr(&mut f, prog, &p, RUN_IFINDEX),
            hashed,
            "{prog:?}: an expired session is picked again"
        );
        let s = session(&f, &key(&p)).unwrap();
        assert_eq!(
            (s.backend, s.dmac),
            (be4(hashed), mac_of(hashed)),
            "{prog:?}: rewritten"
        );
        assert!(s.seen_ns >= t0, "{prog:?}: live again");
        assert_eq!(count(&f, prog, Reason::DsrNew), new + 1, "{prog:?}");
        assert_eq!(
            count(&f, prog, Reason::EntryExpired),
            expired + 1,
            "{prog:?}"
        );
    }
}

/// What is not a DSR VIP's TCP/UDP/SCTP is not touched by the DSR path: ARP, a ping to the
/// VIP (the balancer's VIP alias answers it), addresses that are no VIP; a dsr network's
/// published port is NAT, as in moby. None of it opens a session.
#[test]
fn arp_icmp_non_vip_and_published_ports_are_not_dsr() {
    let Some(mut f) = fixture() else { return };
    let inputs = [
        arp_request(CLIENT, VIP),
        icmp_message(CLIENT, VIP, 8, 0, 0x0001_0001, b"ping"),
        Ipv4Packet::tcp(CLIENT, 40700, Ipv4Addr::new(10, 99, 0, 99), 443).build(),
        Ipv4Packet::udp(CLIENT, 40700, NODE, 9999).build(),
    ];
    for prog in INGRESS {
        for input in &inputs {
            expect_untouched(&mut f, prog, input);
        }
    }
    for (prog, sport) in [(Prog::Xdp, 40701), (Prog::TcIngress, 40702)] {
        let p = Ipv4Packet::tcp(CLIENT, sport, NODE, 8080);
        let (verdict, out) = f.run(prog, &p.build());
        let want = if prog == Prog::Xdp {
            XDP_PASS
        } else {
            TC_ACT_OK
        };
        assert_eq!(verdict, want, "{prog:?}: translated, on to the stack");
        let ip = ip_of(&out);
        let daddr = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        assert!(WEB.contains(&daddr), "{prog:?}: DNATed to a backend");
        assert_eq!(out[..12], p.build()[..12], "{prog:?}: MACs are the stack's");
        assert!(f.flow(&key(&p)).is_some(), "{prog:?}: a NAT flow");
    }
    assert!(f.dp.dsr_sessions().is_empty(), "no session opened");
}

/// A NAT network's VIP is translated as before, even with DSR backends resolved: no session,
/// a flow entry, the stack's verdict.
#[test]
fn a_nat_network_vip_is_translated_as_before() {
    let Some(mut f) = fixture() else { return };
    let mut f2 = Fixture::new(Masquerade::Never);
    resolve(&mut f2, WEB[0], RUN_IFINDEX);
    let (svc, _) = f2.dp.current_services().unwrap()[&ServiceKey::Vip(MapAddr::V4(be4(VIP)))];
    assert_eq!(svc.flags & SERVICE_DSR, 0, "a NAT VIP");
    for (prog, sport) in [(Prog::Xdp, 40800), (Prog::TcIngress, 40801)] {
        let p = Ipv4Packet::tcp(CLIENT, sport, VIP, 443);
        let (verdict, out) = f2.run(prog, &p.build());
        let want = if prog == Prog::Xdp {
            XDP_PASS
        } else {
            TC_ACT_OK
        };
        assert_eq!(verdict, want, "{prog:?}");
        let ip = ip_of(&out);
        let daddr = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        assert!(WEB.contains(&daddr), "{prog:?}: DNATed");
        assert!(f2.flow(&key(&p)).is_some(), "{prog:?}: a flow entry");
        assert_eq!(
            count(&f2, prog, Reason::FlowNew),
            1,
            "{prog:?}: counted a new flow"
        );
        // The same packet on the dsr network: DSR.
        expect_dsr(&mut f, prog, &p, RUN_IFINDEX);
    }
    assert!(
        f2.dp.dsr_sessions().is_empty(),
        "no session on a NAT network"
    );
}

/// A DSR VIP with no backend drops what no session carries (moby's `counter drop`) and opens
/// nothing; a live session of it (opened before its backend was disabled) still carries.
#[test]
fn a_vip_without_backends_drops_what_no_session_carries() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::Xdp, 40900), (Prog::TcIngress, 40901)] {
        let p = Ipv4Packet::tcp(CLIENT, sport, EMPTY_VIP, 80);
        let before = count(&f, prog, Reason::DsrNoBackend);
        expect_drop(&mut f, prog, &p.build());
        assert_eq!(
            count(&f, prog, Reason::DsrNoBackend),
            before + 1,
            "{prog:?}"
        );
        assert_eq!(session(&f, &key(&p)), None, "{prog:?}: no session");

        let s = DsrSession {
            backend: be4(EMPTY_BACKEND),
            ifindex: RUN_IFINDEX,
            dmac: mac_of(EMPTY_BACKEND),
            smac: DEV_MAC,
            counter: 0,
            _pad: [],
            seen_ns: monotonic_ns(),
        };
        put_session(&mut f, &key(&p), s);
        assert_eq!(
            expect_dsr(&mut f, prog, &p, RUN_IFINDEX),
            EMPTY_BACKEND,
            "{prog:?}: the session carries"
        );
    }
}

/// A chosen backend whose MAC the controller has not resolved gets no session: dropped and
/// counted; once resolved, the same packet opens one.
#[test]
fn a_backend_without_a_resolved_mac_gets_no_session() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::Xdp, 41100), (Prog::TcIngress, 41101)] {
        let p = Ipv4Packet::udp(CLIENT, sport, VIP, 53);
        let hashed = hashed_backend(&f, &p);
        f.dp.dsr_backends_mut().remove(&be4(hashed)).unwrap();
        let before = count(&f, prog, Reason::DsrUnresolved);
        expect_drop(&mut f, prog, &p.build());
        assert_eq!(
            count(&f, prog, Reason::DsrUnresolved),
            before + 1,
            "{prog:?}"
        );
        assert_eq!(session(&f, &key(&p)), None, "{prog:?}: no session");
        resolve(&mut f, hashed, RUN_IFINDEX);
        assert_eq!(
            expect_dsr(&mut f, prog, &p, RUN_IFINDEX),
            hashed,
            "{prog:?}"
        );
    }
}

/// A backend on another device than the frame came in on: XDP redirects (XDP_REDIRECT)
/// instead of XDP_TX, TC redirects as always; the session keeps that device.
#[test]
fn a_backend_on_another_device_is_redirected_to() {
    let Some(mut f) = fixture() else { return };
    for ip in WEB {
        resolve(&mut f, ip, OTHER_IFINDEX);
    }
    for (prog, sport) in [(Prog::Xdp, 41200), (Prog::TcIngress, 41201)] {
        let p = Ipv4Packet::tcp(CLIENT, sport, VIP, 443);
        expect_dsr(&mut f, prog, &p, OTHER_IFINDEX);
        let s = session(&f, &key(&p)).unwrap();
        assert_eq!(s.ifindex, OTHER_IFINDEX, "{prog:?}");
        // The session's packets leave by the session's device too.
        expect_dsr(&mut f, prog, &p, OTHER_IFINDEX);
    }
}

/// A fragmented datagram: the first fragment opens the session; the later ones (no ports)
/// follow it to the same backend, byte-identical past the MACs. A later fragment of a
/// datagram whose first was never seen passes untouched.
#[test]
fn later_fragments_follow_their_datagrams_session() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::Xdp, 41300), (Prog::TcIngress, 41301)] {
        let mut first = Ipv4Packet::udp(CLIENT, sport, VIP, 53);
        first.frag = 0x2000;
        first.id = sport;
        let backend = expect_dsr(&mut f, prog, &first, RUN_IFINDEX);
        let data = [0xab; 24];
        let before = count(&f, prog, Reason::DsrSession);
        for (offset8, more) in [(2, true), (5, false)] {
            let later = first.later_fragment(offset8, more, &data);
            assert_eq!(
                expect_dsr_frame(&mut f, prog, &later, RUN_IFINDEX),
                backend,
                "{prog:?}: where its first went"
            );
        }
        assert_eq!(count(&f, prog, Reason::DsrSession), before + 2, "{prog:?}");
        let stray = Ipv4Packet {
            id: sport + 1000,
            ..first.clone()
        }
        .later_fragment(2, true, &data);
        expect_untouched(&mut f, prog, &stray);
    }
}

/// XDP leaves a TCP packet whose checksum may be a CHECKSUM_PARTIAL seed to TC (XDP_TX would
/// send the seed as the sum); TC sends it by DSR.
#[test]
fn xdp_leaves_a_possible_checksum_partial_seed_to_tc() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 41400, VIP, 443);
    let mut input = p.build();
    let seed = pseudo_seed(ip_of(&input));
    input[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&seed.to_be_bytes());
    expect_untouched(&mut f, Prog::Xdp, &input);
    assert!(f.dp.dsr_sessions().is_empty(), "XDP opened nothing");
    expect_dsr_frame(&mut f, Prog::TcIngress, &input, RUN_IFINDEX);
    assert!(session(&f, &key(&p)).is_some(), "TC opened the session");
}

/// An IPv6 DSR VIP: a new session goes to the hashed backend by MAC with every byte from the
/// EtherType on unchanged (TCP, UDP and SCTP), the session entry in `lb_dsr_sessions6` holds
/// backend, device, MACs, counter and time, and the session's later packets follow it after
/// the set changed. The IPv6 twin of the first two IPv4 cases.
#[test]
fn an_ipv6_vip_opens_and_follows_sessions_by_mac_with_l3_l4_untouched() {
    let Some(mut f) = fixture6() else { return };
    let (svc, _) = f.dp.current_services().unwrap()[&ServiceKey::Vip(MapAddr::V6(be6(VIP6)))];
    assert_eq!(
        (svc.flags & SERVICE_DSR, svc.session_timeout),
        (SERVICE_DSR, TIMEOUT),
        "sync marked the IPv6 VIP dsr"
    );
    let held = f.dp.current_services().unwrap();
    let (_, set) = &held[&ServiceKey::Vip(MapAddr::V6(be6(VIP6)))];
    let counter_of6 = |ip: Ipv6Addr| {
        (set.iter().find(|b| b.addr == MapAddr::V6(be6(ip))))
            .unwrap_or_else(|| panic!("{ip} is in the IPv6 VIP's set"))
            .counter
    };
    for (i, prog) in INGRESS.into_iter().enumerate() {
        let before = count(&f, prog, Reason::DsrNew);
        let mut used = std::collections::BTreeSet::new();
        for (j, sport) in (42000 + 100 * i as u16..).take(30).enumerate() {
            let p = match j % 3 {
                0 => Ipv6Packet::tcp(CLIENT6, sport, VIP6, 443),
                1 => Ipv6Packet::udp(CLIENT6, sport, VIP6, 53),
                _ => Ipv6Packet::sctp(CLIENT6, sport, VIP6, 9000),
            };
            let t0 = monotonic_ns();
            let backend = expect_dsr6(&mut f, prog, &p.build(), RUN_IFINDEX);
            assert_eq!(
                backend,
                hashed_backend6(&f, &p),
                "{prog:?}: the hashed backend"
            );
            let s = session6(&f, &key6(&p)).expect("a session entry in lb_dsr_sessions6");
            assert_eq!(
                s,
                DsrSession6 {
                    backend: be6(backend),
                    ifindex: RUN_IFINDEX,
                    dmac: mac_of(backend),
                    smac: DEV_MAC,
                    counter: counter_of6(backend),
                    _pad: [0; 4],
                    seen_ns: s.seen_ns,
                },
                "{prog:?}: the session of {p:?}"
            );
            assert!(
                (t0..=monotonic_ns()).contains(&s.seen_ns),
                "{prog:?}: seen now"
            );
            used.insert(backend);
        }
        assert_eq!(
            used.len(),
            WEB6.len(),
            "{prog:?}: 30 clients use every backend"
        );
        assert_eq!(count(&f, prog, Reason::DsrNew), before + 30, "{prog:?}");
    }
    assert!(f.dp.dsr_sessions().is_empty(), "nothing in IPv4's table");

    let syn = Ipv6Packet::tcp(CLIENT6, 42400, VIP6, 443);
    let first = expect_dsr6(&mut f, Prog::TcIngress, &syn.build(), RUN_IFINDEX);
    for b in &mut f.net.services[0].backends {
        b.disabled = b.ip == IpAddr::V6(first);
    }
    f.sync();
    assert_ne!(
        hashed_backend6(&f, &syn),
        first,
        "the hash now gives another"
    );
    let ack = Ipv6Packet {
        tcp_flags: TCP_ACK | TCP_PSH,
        payload: b"GET / HTTP/1.1".to_vec(),
        ..syn.clone()
    };
    for prog in INGRESS {
        let before = count(&f, prog, Reason::DsrSession);
        assert_eq!(
            expect_dsr6(&mut f, prog, &ack.build(), RUN_IFINDEX),
            first,
            "{prog:?}: the session's backend"
        );
        assert_eq!(count(&f, prog, Reason::DsrSession), before + 1, "{prog:?}");
    }
}

/// An IPv6 session's TCP RST goes by the session and ends it; with no backend the VIP drops
/// what no session carries; an unresolved backend gets no session until resolved.
#[test]
fn ipv6_rst_no_backend_and_unresolved_as_ipv4() {
    let Some(mut f) = fixture6() else { return };
    for (prog, sport) in [(Prog::Xdp, 42500), (Prog::TcIngress, 42501)] {
        let syn = Ipv6Packet::tcp(CLIENT6, sport, VIP6, 443);
        let backend = expect_dsr6(&mut f, prog, &syn.build(), RUN_IFINDEX);
        let other = *WEB6.iter().find(|b| **b != backend).unwrap();
        let mut s = session6(&f, &key6(&syn)).unwrap();
        s.backend = be6(other);
        s.dmac = mac_of(other);
        f.dp.dsr_sessions6_mut().insert(key6(&syn), s, 0).unwrap();
        let rst = Ipv6Packet {
            tcp_flags: TCP_RST | TCP_ACK,
            ..syn.clone()
        };
        let before = count(&f, prog, Reason::DsrReset);
        assert_eq!(
            expect_dsr6(&mut f, prog, &rst.build(), RUN_IFINDEX),
            other,
            "{prog:?}: the RST goes by the session"
        );
        assert_eq!(
            session6(&f, &key6(&syn)),
            None,
            "{prog:?}: the session ended"
        );
        assert_eq!(count(&f, prog, Reason::DsrReset), before + 1, "{prog:?}");
    }

    for (prog, sport) in [(Prog::Xdp, 42600), (Prog::TcIngress, 42601)] {
        let p = Ipv6Packet::udp(CLIENT6, sport, VIP6, 53);
        let hashed = hashed_backend6(&f, &p);
        f.dp.dsr_backends6_mut().remove(&be6(hashed)).unwrap();
        let before = count(&f, prog, Reason::DsrUnresolved);
        expect_drop(&mut f, prog, &p.build());
        assert_eq!(
            count(&f, prog, Reason::DsrUnresolved),
            before + 1,
            "{prog:?}"
        );
        assert_eq!(session6(&f, &key6(&p)), None, "{prog:?}: no session");
        resolve(&mut f, hashed, RUN_IFINDEX);
        assert_eq!(
            expect_dsr6(&mut f, prog, &p.build(), RUN_IFINDEX),
            hashed,
            "{prog:?}"
        );
    }

    for b in &mut f.net.services[0].backends {
        b.disabled = b.ip.is_ipv6();
    }
    f.sync();
    for (prog, sport) in [(Prog::Xdp, 42700), (Prog::TcIngress, 42701)] {
        let p = Ipv6Packet::tcp(CLIENT6, sport, VIP6, 80);
        let before = count(&f, prog, Reason::DsrNoBackend);
        expect_drop(&mut f, prog, &p.build());
        assert_eq!(
            count(&f, prog, Reason::DsrNoBackend),
            before + 1,
            "{prog:?}"
        );
        assert_eq!(session6(&f, &key6(&p)), None, "{prog:?}: no session");
    }
}

/// An IPv6 fragmented datagram: the first fragment (fragment header, ports) opens the
/// session and the later ones follow it, byte-identical past the MACs; a later fragment of
/// an unseen datagram passes untouched. Neighbour discovery and echo for the VIP pass
/// untouched (the balancer's VIP address answers them) and open nothing.
#[test]
fn ipv6_fragments_follow_their_session_and_icmpv6_passes() {
    let Some(mut f) = fixture6() else { return };
    for (prog, sport) in [(Prog::Xdp, 42800), (Prog::TcIngress, 42801)] {
        let id = u32::from(sport);
        let first = Ipv6Packet {
            exts: vec![Ext::Fragment {
                offset8: 0,
                more: true,
                id,
            }],
            ..Ipv6Packet::udp(CLIENT6, sport, VIP6, 53)
        };
        let backend = expect_dsr6(&mut f, prog, &first.build(), RUN_IFINDEX);
        let later = |id, offset8, more| Ipv6Packet {
            exts: vec![Ext::Fragment { offset8, more, id }],
            raw: Some(vec![0xab; 24]),
            ..first.clone()
        };
        let before = count(&f, prog, Reason::DsrSession);
        for (offset8, more) in [(2, true), (5, false)] {
            assert_eq!(
                expect_dsr6(&mut f, prog, &later(id, offset8, more).build(), RUN_IFINDEX),
                backend,
                "{prog:?}: where its first went"
            );
        }
        assert_eq!(count(&f, prog, Reason::DsrSession), before + 2, "{prog:?}");
        expect_untouched(&mut f, prog, &later(id + 1000, 2, true).build());
    }
    let solicited = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x10);
    for prog in INGRESS {
        for (daddr, t) in [(solicited, 135), (VIP6, 135), (VIP6, 128)] {
            let mut m = Ipv6Packet::icmp6(CLIENT6, daddr, (t, 0, 0), &VIP6.octets());
            m.hop_limit = 255;
            expect_untouched(&mut f, prog, &m.build());
        }
    }
    let opened = f.dp.dsr_sessions6().len();
    assert_eq!(opened, 2, "the two first fragments' and nothing else");
}
