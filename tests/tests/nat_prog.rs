//! The NAT programs under BPF_PROG_TEST_RUN: one packet in, the verdict, the bytes out and the
//! map entries it left, against maps filled by the same `sync` that `lb load` uses (the
//! fixture is `lb_tests::fixture`). Every rewritten packet's checksums are recomputed from
//! scratch by `lb_tests::packet::verify` (an implementation independent of the programs'
//! incremental updates). Root only.
//!
//! A TC run's skb is on loopback (ifindex 1) unless the case sets `ingress_ifindex`: a hairpin
//! is "leaves by the interface it came in on", i.e. ifindex == ingress_ifindex == 1.
use std::{collections::BTreeSet, net::Ipv4Addr};

use lb_common::{
    FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, Flow, FlowKey, MASQ_PORT_MAX, MASQ_PORT_MIN, Reason,
    Timeouts,
};
use lb_tests::{
    fixture::{
        CLIENT, CLIENT2, DB, DB_VIP, EMPTY_VIP, Fixture, HOST_IP, LOOPBACK_PORT, NODE, NOT_LOCAL,
        Prog, TC_ACT_OK, VIP, WEB, expect_untouched, key, reason_count, service,
    },
    packet::{
        Ipv4Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, arp_request, icmp_error, ip_of,
        ipv6_tcp_syn, pseudo_seed, verify,
    },
    require_root,
};
use lb_user::{
    core::model::Masquerade,
    dataplane::ebpf::{MapAddr, ServiceKey, be4, gc::monotonic_ns},
};

/// Destination address and port of an output frame (IPv4 without options unless `l4_off`).
fn dst(frame: &[u8]) -> (Ipv4Addr, u16) {
    let ip = ip_of(frame);
    let l4 = usize::from(ip[0] & 0x0f) * 4;
    (
        Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        u16::from_be_bytes([ip[l4 + 2], ip[l4 + 3]]),
    )
}

fn src(frame: &[u8]) -> (Ipv4Addr, u16) {
    let ip = ip_of(frame);
    let l4 = usize::from(ip[0] & 0x0f) * 4;
    (
        Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        u16::from_be_bytes([ip[l4], ip[l4 + 1]]),
    )
}

/// `expected` with its destination replaced by what the output says, checksums recomputed:
/// the output must equal this exactly, so nothing but the destination (and its checksums)
/// changed.
fn with_dst(p: &Ipv4Packet, daddr: Ipv4Addr, dport: u16) -> Vec<u8> {
    Ipv4Packet {
        daddr,
        dport,
        ..p.clone()
    }
    .build()
}

fn with_src(p: &Ipv4Packet, saddr: Ipv4Addr, sport: u16) -> Vec<u8> {
    Ipv4Packet {
        saddr,
        sport,
        ..p.clone()
    }
    .build()
}

/// Sends `p` through `prog` and asserts it came out DNATed to one of `backends`:port with
/// nothing else changed and valid checksums. Returns the backend.
fn expect_dnat(
    f: &mut Fixture,
    prog: Prog,
    p: &Ipv4Packet,
    backends: &[Ipv4Addr],
    port: u16,
) -> Ipv4Addr {
    let (_, out) = f.run(prog, &p.build());
    let (backend, dport) = dst(&out);
    assert!(
        backends.contains(&backend),
        "{prog:?}: {backend} is not a backend of {}",
        p.daddr
    );
    assert_eq!(dport, port, "{prog:?}: destination port");
    verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
    assert_eq!(
        out,
        with_dst(p, backend, port),
        "{prog:?}: only the destination changes"
    );
    backend
}

fn fixture() -> Option<Fixture> {
    let name = std::thread::current()
        .name()
        .unwrap_or("nat_prog")
        .to_owned();
    require_root(&name).then(|| Fixture::new(Masquerade::Never))
}

#[test]
fn tcp_syn_to_vip_is_dnated_and_both_directions_tracked() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40000, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let fwd = f.flow(&key(&syn)).expect("forward entry");
    assert_eq!(
        (fwd.daddr, fwd.dport, fwd.flags),
        (be4(backend), 443u16.to_be(), 0)
    );
    let reply = f
        .flow(&key(&with_dst_packet(&syn, backend, 443).reply()))
        .expect("reply entry");
    assert_eq!((reply.saddr, reply.sport), (be4(VIP), 443u16.to_be()));
    assert_eq!(reply.flags, FLOW_EGRESS | FLOW_REPLY);
    assert_eq!(f.dp.flow_entries().len(), 2, "one flow, two entries");
}

fn with_options(mut p: Ipv4Packet, len: usize) -> Vec<u8> {
    // NOPs, then end of options.
    p.options = vec![1; len];
    p.options[len - 1] = 0;
    p.build()
}

fn with_dst_packet(p: &Ipv4Packet, daddr: Ipv4Addr, dport: u16) -> Ipv4Packet {
    Ipv4Packet {
        daddr,
        dport,
        ..p.clone()
    }
}

#[test]
fn xdp_dnats_a_vip_syn_like_tc() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40001, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::Xdp, &syn, &WEB, 443);
    assert_eq!(f.flow(&key(&syn)).unwrap().daddr, be4(backend));
}

#[test]
fn udp_to_vip_is_dnated() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::udp(CLIENT, 40002, VIP, 53);
    expect_dnat(&mut f, Prog::TcIngress, &p, &WEB, 53);
    expect_dnat(
        &mut f,
        Prog::Xdp,
        &Ipv4Packet::udp(CLIENT, 40003, VIP, 53),
        &WEB,
        53,
    );
}

/// SCTP to a VIP keeps its ports, so its CRC32c (which covers neither addresses nor a
/// pseudo-header) is carried untouched; to a published port with another target, the CRC32c
/// is fixed for the new ports (checked by the test's own table-driven CRC32c), and the reply's
/// restores them with a valid CRC again. A CRC left to the device (0) stays 0.
#[test]
fn sctp_keeps_a_valid_crc32c_through_every_rewrite() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40004), (Prog::Xdp, 40005)] {
        let p = Ipv4Packet::sctp(CLIENT, sport, VIP, 9000);
        let backend = expect_dnat(&mut f, prog, &p, &WEB, 9000);
        let (_, out) = f.run(prog, &p.build());
        assert_eq!(
            out[14 + 20 + 8..14 + 20 + 12],
            p.build()[14 + 20 + 8..14 + 20 + 12],
            "{prog:?}: same ports, same CRC"
        );
        assert_eq!(dst(&out).0, backend, "{prog:?}: the flow keeps its backend");

        let p = Ipv4Packet::sctp(CLIENT, sport, NODE, 9100);
        let backend = expect_dnat(&mut f, prog, &p, &WEB, 9200);
        let reply = with_dst_packet(&p, backend, 9200).reply();
        let (_, back) = f.run(Prog::TcEgress, &reply.build());
        verify(&back).unwrap_or_else(|e| panic!("{prog:?} reply: {e}"));
        assert_eq!(
            back,
            with_src(&reply, NODE, 9100),
            "{prog:?}: reply restored"
        );

        let mut offloaded = Ipv4Packet::sctp(CLIENT, sport + 100, NODE, 9100);
        offloaded.l4_csum = Some(0);
        let (_, out) = f.run(prog, &offloaded.build());
        assert_eq!(dst(&out).1, 9200, "{prog:?}: rewritten");
        assert_eq!(
            out[14 + 20 + 8..14 + 20 + 12],
            [0; 4],
            "{prog:?}: 0 stays 0"
        );
    }
}

#[test]
fn published_port_rewrites_the_target_port() {
    let Some(mut f) = fixture() else { return };
    for prog in [Prog::TcIngress, Prog::Xdp] {
        let tcp = Ipv4Packet::tcp(CLIENT, 40010 + prog as u16, NODE, 8080);
        expect_dnat(&mut f, prog, &tcp, &WEB, 80);
        let udp = Ipv4Packet::udp(CLIENT, 40010 + prog as u16, NODE, 5353);
        expect_dnat(&mut f, prog, &udp, &WEB, 53);
    }
}

#[test]
fn published_port_to_a_non_local_address_is_untouched() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 40020, NOT_LOCAL, 8080).build();
    expect_untouched(&mut f, Prog::TcIngress, &p);
    expect_untouched(&mut f, Prog::Xdp, &p);
    assert!(f.dp.flow_entries().is_empty(), "nothing tracked");
}

#[test]
fn host_ip_port_matches_only_its_host_ip() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 40030, HOST_IP, 7070);
    expect_dnat(&mut f, Prog::TcIngress, &p, &[DB], 5432);
    expect_untouched(
        &mut f,
        Prog::TcIngress,
        &Ipv4Packet::tcp(CLIENT, 40031, NODE, 7070).build(),
    );
}

#[test]
fn tracked_flow_keeps_its_backend_after_the_set_changes() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40040, VIP, 443);
    let first = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    for b in &mut f.net.services[0].backends {
        b.disabled = b.ip == first;
    }
    f.sync();
    let mut ack = syn.clone();
    ack.payload = b"GET /".to_vec();
    for prog in [Prog::TcIngress, Prog::Xdp] {
        assert_eq!(
            expect_dnat(&mut f, prog, &ack, &WEB, 443),
            first,
            "{prog:?}: drained, not moved"
        );
    }
    for sport in 41000..41030 {
        let b = expect_dnat(
            &mut f,
            Prog::TcIngress,
            &Ipv4Packet::tcp(CLIENT, sport, VIP, 443),
            &WEB,
            443,
        );
        assert_ne!(b, first, "a new flow must not go to a disabled backend");
    }
}

/// A removed backend's UDP flows are flushed (a UDP client would otherwise stay pinned to a
/// dead backend); its TCP flows stay, to finish or be reset by the backend itself.
#[test]
fn removed_backend_loses_its_udp_flows_and_keeps_its_tcp_ones() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40050, VIP, 443);
    let first = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let udp = (41000..41200)
        .map(|sport| Ipv4Packet::udp(CLIENT, sport, VIP, 53))
        .find(|p| expect_dnat(&mut f, Prog::TcIngress, p, &WEB, 53) == first)
        .expect("one of 200 UDP flows lands on the same backend");
    f.net.services[0].backends.retain(|b| b.ip != first);
    f.sync();
    assert!(f.flow(&key(&udp)).is_none(), "UDP flushed with its backend");
    assert_ne!(expect_dnat(&mut f, Prog::TcIngress, &udp, &WEB, 53), first);
    assert_eq!(
        f.flow(&key(&syn)).map(|t| t.daddr),
        Some(be4(first)),
        "TCP kept"
    );
    assert_eq!(expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443), first);
}

#[test]
fn reply_is_reverse_nated_on_egress() {
    let Some(mut f) = fixture() else { return };
    for (daddr, dport, target) in [(VIP, 443, 443), (NODE, 8080, 80)] {
        let syn = Ipv4Packet::tcp(CLIENT, 40060, daddr, dport);
        let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, target);
        let reply = with_dst_packet(&syn, backend, target).reply();
        let (_, out) = f.run(Prog::TcEgress, &reply.build());
        verify(&out).unwrap();
        assert_eq!(
            out,
            with_src(&reply, daddr, dport),
            "the client sees the address it spoke to"
        );
    }
}

#[test]
fn udp_zero_checksum_stays_zero() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40070), (Prog::Xdp, 40071)] {
        let mut p = Ipv4Packet::udp(CLIENT, sport, VIP, 53);
        p.l4_csum = Some(0);
        let (_, out) = f.run(prog, &p.build());
        let (backend, _) = dst(&out);
        assert!(WEB.contains(&backend), "{prog:?}");
        assert_eq!(
            &out[14 + 20 + 6..14 + 20 + 8],
            [0, 0],
            "{prog:?}: 0 means no checksum"
        );
        verify(&out).unwrap();
        let reply = with_dst_packet(&p, backend, 53).reply();
        let (_, back) = f.run(Prog::TcEgress, &reply.build());
        assert_eq!(&back[14 + 20 + 6..14 + 20 + 8], [0, 0]);
        assert_eq!(src(&back), (VIP, 53));
    }
}

#[test]
fn vip_without_backends_passes_to_the_stack() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 40080, EMPTY_VIP, 80).build();
    expect_untouched(&mut f, Prog::TcIngress, &p);
    expect_untouched(&mut f, Prog::Xdp, &p);
    assert!(f.dp.flow_entries().is_empty());
}

#[test]
fn non_service_traffic_passes_byte_identical() {
    let Some(mut f) = fixture() else { return };
    let inputs = [
        Ipv4Packet::tcp(CLIENT, 40090, Ipv4Addr::new(10, 99, 0, 99), 443).build(),
        Ipv4Packet::udp(CLIENT, 40090, NODE, 9999).build(),
        Ipv4Packet::tcp(WEB[0], 80, CLIENT, 40090).build(),
    ];
    for input in &inputs {
        for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
            expect_untouched(&mut f, prog, input);
        }
    }
    assert!(f.dp.flow_entries().is_empty());
}

#[test]
fn arp_passes_byte_identical() {
    let Some(mut f) = fixture() else { return };
    let arp = arp_request(CLIENT, VIP);
    for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
        expect_untouched(&mut f, prog, &arp);
    }
}

#[test]
fn ipv6_passes_byte_identical() {
    let Some(mut f) = fixture() else { return };
    let v6 = ipv6_tcp_syn(443);
    for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
        expect_untouched(&mut f, prog, &v6);
    }
}

#[test]
fn ip_options_are_skipped_to_find_l4() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40100), (Prog::Xdp, 40101)] {
        let mut p = Ipv4Packet::tcp(CLIENT, sport, NODE, 8080);
        // NOP, NOP, NOP, end of options: IHL 6.
        p.options = vec![1, 1, 1, 0];
        let (_, out) = f.run(prog, &p.build());
        let (backend, dport) = dst(&out);
        assert!(WEB.contains(&backend), "{prog:?}");
        assert_eq!(
            dport, 80,
            "{prog:?}: the port behind the options was rewritten"
        );
        verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        assert_eq!(out, with_dst(&p, backend, 80));
    }
}

/// A fragmented datagram to a published port: the first fragment (the one with the UDP
/// header) is DNATed and records the datagram; the later ones, which have no ports, follow it to
/// the same backend with only their addresses changed. A later fragment of a datagram whose
/// first was never seen passes as it is.
#[test]
fn fragments_of_a_translated_datagram_are_followed() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40110), (Prog::Xdp, 40111)] {
        let mut first = Ipv4Packet::udp(CLIENT, sport, NODE, 5353);
        first.frag = 0x2000;
        first.id = sport;
        let backend = expect_dnat(&mut f, prog, &first, &WEB, 53);
        let data = [0xab; 24];
        for (offset8, more) in [(2, true), (5, false)] {
            let later = first.later_fragment(offset8, more, &data);
            let (_, out) = f.run(prog, &later);
            verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
            let moved = Ipv4Packet {
                daddr: backend,
                ..first.clone()
            };
            assert_eq!(
                out,
                moved.later_fragment(offset8, more, &data),
                "{prog:?}: a later fragment goes where its first went, payload untouched"
            );
        }
        let stray = Ipv4Packet {
            id: sport + 1000,
            ..first.clone()
        }
        .later_fragment(2, true, &data);
        expect_untouched(&mut f, prog, &stray);
    }
}

/// Every cut inside the headers of a packet the programs would translate passes as it is and
/// is not tracked; each uncut packet is translated (so the case can fail). The kernel refuses
/// XDP test runs shorter than an Ethernet header, and skb ones of no more than one.
#[test]
fn truncated_headers_at_every_offset_pass_untouched() {
    let Some(mut f) = fixture() else { return };
    // A tracked flow, so that an ICMP error about it would be translated if it were whole.
    let syn = Ipv4Packet::tcp(CLIENT, 40125, VIP, 443);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let tracked = f.dp.flow_entries().len();
    let router = Ipv4Addr::new(10, 10, 0, 254);
    let cases: [(Vec<u8>, usize); 5] = [
        // Through the TCP checksum, the UDP header, the SCTP ports: what the programs read.
        (
            Ipv4Packet::tcp(CLIENT, 40120, VIP, 443).build(),
            14 + 20 + 18,
        ),
        (Ipv4Packet::udp(CLIENT, 40120, VIP, 53).build(), 14 + 20 + 8),
        (
            Ipv4Packet::sctp(CLIENT, 40120, VIP, 9000).build(),
            14 + 20 + 4,
        ),
        // Through the quoted ports of an ICMP error.
        (
            icmp_error(router, VIP, 3, 4, 1400, ip_of(&syn.reply().build())),
            14 + 20 + 8 + 20 + 4,
        ),
        // A header with 40 bytes of options: cuts inside them (past the fixed header, so
        // TC runs too) up to the ports behind them.
        (
            with_options(Ipv4Packet::tcp(CLIENT, 40121, VIP, 443), 40),
            14 + 60 + 18,
        ),
    ];
    let (mut runs, mut refused) = (0, 0);
    for (full, headers) in &cases {
        for cut in 14..*headers {
            for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
                match f.try_run(prog, &full[..cut], None) {
                    Ok((_, out)) => {
                        assert_eq!(out, &full[..cut], "{prog:?} cut at {cut}");
                        runs += 1;
                    }
                    // An skb test run of an IPv4 frame needs its whole fixed IP header; XDP
                    // runs (the same parse code) cover those cuts.
                    Err(_) if prog != Prog::Xdp && cut < 14 + 20 => refused += 1,
                    Err(e) => panic!("{prog:?} cut at {cut}: {e:?}"),
                }
            }
        }
        assert_eq!(
            f.dp.flow_entries().len(),
            tracked,
            "a cut packet is never tracked"
        );
    }
    for (full, _) in &cases {
        let (_, out) = f.run(Prog::TcIngress, full);
        assert_ne!(&out, full, "the whole packet is translated");
    }
    println!("{runs} truncated runs passed untouched ({refused} refused by the kernel)");
}

/// XDP cannot tell a CHECKSUM_PARTIAL seed from a full checksum that happens to equal it, and
/// the two need different updates: such a packet is left to the TC program beside XDP,
/// untouched and untracked, and TC (which the kernel's helpers tell) translates it.
#[test]
fn xdp_leaves_a_possible_checksum_partial_seed_to_tc() {
    let Some(mut f) = fixture() else { return };
    // What a local sender with offload puts in the TCP checksum field (veth hands XDP the
    // packet like that): the pseudo-header sum for the device to complete.
    let p = Ipv4Packet::tcp(CLIENT, 40130, VIP, 443);
    let mut input = p.build();
    let seed = pseudo_seed(ip_of(&input));
    input[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&seed.to_be_bytes());
    expect_untouched(&mut f, Prog::Xdp, &input);
    assert!(
        f.dp.flow_entries().is_empty(),
        "XDP tracks nothing it leaves"
    );
    let (verdict, out) = f.run(Prog::TcIngress, &input);
    assert_eq!(verdict, TC_ACT_OK);
    assert!(WEB.contains(&dst(&out).0), "TC translates it");
}

#[test]
fn two_clients_with_one_source_port_get_distinct_masquerade_ports() {
    if !require_root("two_clients_with_one_source_port_get_distinct_masquerade_ports") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Always);
    // One backend, so both flows meet on the same (backend, port) tuple.
    f.net.services[0].backends.truncate(1);
    f.sync();
    let mut ports = BTreeSet::new();
    for client in [CLIENT, CLIENT2] {
        let syn = Ipv4Packet::tcp(client, 40140, VIP, 443);
        expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB[..1], 443);
        let (_, out) = f.run(Prog::TcEgress, &with_dst(&syn, WEB[0], 443));
        let (saddr, sport) = src(&out);
        assert_eq!(saddr, NODE, "masqueraded to the interface's address");
        assert!((MASQ_PORT_MIN..=MASQ_PORT_MAX).contains(&sport), "{sport}");
        verify(&out).unwrap();
        ports.insert(sport);
    }
    assert_eq!(ports.len(), 2, "two flows, two ports: {ports:?}");
}

/// Masquerade `always`, the whole round trip: client → VIP (ingress DNAT) → backend, leaving
/// from the node (egress SNAT); the backend's reply to the node (ingress: back to the client)
/// → client, from the VIP (egress).
#[test]
fn masquerade_always_round_trip() {
    if !require_root("masquerade_always_round_trip") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Always);
    let syn = Ipv4Packet::tcp(CLIENT, 40150, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let to_backend = with_dst_packet(&syn, backend, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &to_backend.build(), Some(7));
    let (saddr, masq_port) = src(&out);
    assert_eq!(saddr, NODE);
    verify(&out).unwrap();
    assert_eq!(out, with_src(&to_backend, NODE, masq_port));
    let snat = f.flow(&key(&to_backend)).expect("masquerade entry");
    assert_eq!(snat.flags, FLOW_EGRESS | FLOW_MASQ);

    let reply = Ipv4Packet {
        saddr: backend,
        sport: 443,
        daddr: NODE,
        dport: masq_port,
        ..syn.reply()
    };
    let (_, back) = f.run(Prog::TcIngress, &reply.build());
    verify(&back).unwrap();
    assert_eq!(dst(&back), (CLIENT, 40150), "the reply finds its client");
    let claim = f.flow(&key(&reply)).expect("claim entry");
    assert_eq!(claim.flags, FLOW_MASQ | FLOW_REPLY);
    let (_, last) = f.run(Prog::TcEgress, &back);
    verify(&last).unwrap();
    assert_eq!(
        last,
        with_src(&syn.reply(), VIP, 443),
        "the client sees the VIP answer"
    );
}

/// Masquerade `auto`: SNAT only for a flow leaving by the interface it came in on.
#[test]
fn hairpin_is_masqueraded_only_when_it_leaves_by_its_ingress_interface() {
    if !require_root("hairpin_is_masqueraded_only_when_it_leaves_by_its_ingress_interface") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Auto);
    // A backend reaching its own VIP, on the interface it came in on: masqueraded.
    let hairpin = Ipv4Packet::tcp(WEB[0], 40160, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &hairpin, &WEB, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &with_dst(&hairpin, backend, 443), Some(1));
    assert_eq!(src(&out).0, NODE, "hairpin is masqueraded");
    verify(&out).unwrap();
    // A client on another interface: the backend sees the client.
    let syn = Ipv4Packet::tcp(CLIENT, 40161, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let to_backend = with_dst(&syn, backend, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &to_backend, Some(7));
    assert_eq!(
        out, to_backend,
        "not a hairpin: the client's address is kept"
    );
}

#[test]
fn masquerade_never_keeps_the_client_even_on_a_hairpin() {
    let Some(mut f) = fixture() else { return };
    let hairpin = Ipv4Packet::tcp(WEB[0], 40170, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &hairpin, &WEB, 443);
    let to_backend = with_dst(&hairpin, backend, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &to_backend, Some(1));
    assert_eq!(out, to_backend);
}

/// A router between the node and a client tells the backend (via the VIP it answered from)
/// that its reply was too big: the error reaches the backend about the backend's own tuple.
#[test]
fn icmp_frag_needed_toward_a_backend_is_translated_on_ingress() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40180, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    // The reply as the client side saw it (from the VIP), quoted by a router.
    let reply_seen = syn.reply().build();
    let router = Ipv4Addr::new(10, 10, 0, 254);
    for prog in [Prog::TcIngress, Prog::Xdp] {
        let err = icmp_error(router, VIP, 3, 4, 1400, ip_of(&reply_seen));
        let (_, out) = f.run(prog, &err);
        verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        let want = icmp_error(
            router,
            backend,
            3,
            4,
            1400,
            ip_of(&with_src(&syn.reply(), backend, 443)),
        );
        assert_eq!(
            out, want,
            "{prog:?}: outer destination and quoted source are the backend's"
        );
    }
}

/// A router between the node and the backends tells the client that its packet was too big:
/// on egress the quoted destination (and the outer source, when the backend itself sent it)
/// become the VIP's.
#[test]
fn icmp_frag_needed_toward_a_client_is_translated_on_egress() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40190, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let forwarded = with_dst(&syn, backend, 443);
    let err = icmp_error(backend, CLIENT, 3, 4, 1400, ip_of(&forwarded));
    let (_, out) = f.run(Prog::TcEgress, &err);
    verify(&out).unwrap();
    assert_eq!(
        out,
        icmp_error(VIP, CLIENT, 3, 4, 1400, ip_of(&syn.build()))
    );
}

#[test]
fn counters_count_packets_and_bytes_per_backend_and_service() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40200, VIP, 443);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let t = f.flow(&key(&syn)).unwrap();
    for _ in 0..4 {
        f.run(Prog::TcIngress, &syn.build());
    }
    let ip_len = (syn.build().len() - 14) as u64;
    let backend = f.dp.counter(t.counter).unwrap();
    let svc = service_total(&mut f, VIP);
    assert_eq!((backend.packets, backend.bytes), (5, 5 * ip_len));
    assert_eq!((svc.packets, svc.bytes), (5, 5 * ip_len));
    assert_eq!(
        f.dp.counter_ids().unwrap(),
        BTreeSet::from([t.counter]),
        "one counter per packet: the backend's"
    );
}

/// A VIP's packets and bytes as the controller totals them (its backends' counters).
fn service_total(f: &mut Fixture, vip: Ipv4Addr) -> lb_common::Counters {
    let counted = f.dp.counters().unwrap();
    f.dp.service_total(&ServiceKey::Vip(MapAddr::of(vip.into())), &counted)
        .unwrap()
}

/// A service's total keeps what its backends counted after they leave it: the counter of a
/// backend gone from the set is folded into the service when it is deleted, so the total
/// never goes down while the daemon runs (Prometheus would take a drop for a reset).
#[test]
fn a_service_total_keeps_the_packets_of_backends_that_left() {
    let Some(mut f) = fixture() else { return };
    let mut sent = 0;
    for port in 40600..40630 {
        let syn = Ipv4Packet::tcp(CLIENT, port, VIP, 443);
        expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
        sent += 1;
    }
    assert_eq!(service_total(&mut f, VIP).packets, sent);
    let first = f.net.services[0].backends[0].ip;
    let used = f.dp.counter_ids().unwrap().len();
    assert!(used >= 2, "the flows spread over the backends: {used}");
    f.net.services[0].backends.retain(|b| b.ip != first);
    f.sync();
    assert_eq!(
        service_total(&mut f, VIP).packets,
        sent,
        "retired, not deleted yet"
    );
    f.sync();
    assert_eq!(service_total(&mut f, VIP).packets, sent, "deleted, folded");
    let syn = Ipv4Packet::tcp(CLIENT, 40699, VIP, 443);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB[1..], 443);
    assert_eq!(service_total(&mut f, VIP).packets, sent + 1);
}

#[test]
fn egress_leaves_untracked_packets_alone() {
    let Some(mut f) = fixture() else { return };
    // A backend answering a client that never came through lb (no entry): untouched.
    let p = Ipv4Packet::tcp(WEB[1], 443, CLIENT, 40210).build();
    expect_untouched(&mut f, Prog::TcEgress, &p);
}

fn tcp(sport: u16, daddr: Ipv4Addr, dport: u16, flags: u8) -> Ipv4Packet {
    Ipv4Packet {
        tcp_flags: flags,
        ..Ipv4Packet::tcp(CLIENT, sport, daddr, dport)
    }
}

/// Seconds from now until `e` expires (CLOCK_MONOTONIC, the programs' clock).
fn secs_left(e: &Flow) -> i64 {
    (e.expires_ns as i64 - monotonic_ns() as i64) / 1_000_000_000
}

/// A packet that is for a service but can only belong to a connection lb does not know (the
/// node's own, or one that is over) never opens a flow: SYN-ACK, FIN, RST.
#[test]
fn syn_ack_fin_and_rst_without_a_flow_pass_and_open_nothing() {
    let Some(mut f) = fixture() else { return };
    for (prog, hook) in [(Prog::TcIngress, "tc_ingress"), (Prog::Xdp, "xdp")] {
        for (i, flags) in [
            TCP_SYN | TCP_ACK,
            TCP_FIN | TCP_ACK,
            TCP_RST,
            TCP_RST | TCP_ACK,
            TCP_SYN | TCP_FIN,
        ]
        .into_iter()
        .enumerate()
        {
            let before = reason_count(&f, hook, Reason::NoFlowOpener);
            expect_untouched(
                &mut f,
                prog,
                &tcp(40300 + i as u16, VIP, 443, flags).build(),
            );
            assert_eq!(
                reason_count(&f, hook, Reason::NoFlowOpener),
                before + 1,
                "{prog:?} flags {flags:#04x}: counted as no flow opener"
            );
        }
    }
    assert!(f.dp.flow_entries().is_empty(), "nothing tracked");
}

/// A mid-connection ACK whose entries are gone (evicted, flushed) re-creates the flow on the
/// backend the flow hash gives — the one its SYN got — marked re-created with the short
/// `tcp_unreplied` timeout until the backend answers, which makes it established.
#[test]
fn a_mid_flow_ack_without_entries_is_recreated_on_the_same_backend() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40320), (Prog::Xdp, 40321)] {
        let syn = tcp(sport, VIP, 443, TCP_SYN);
        let first = expect_dnat(&mut f, prog, &syn, &WEB, 443);
        for (k, _) in f.dp.flow_entries() {
            f.dp.flows_mut().remove(&k).unwrap();
        }
        let ack = tcp(sport, VIP, 443, TCP_ACK | TCP_PSH);
        assert_eq!(
            expect_dnat(&mut f, prog, &ack, &WEB, 443),
            first,
            "{prog:?}: the hash gives the same backend"
        );
        let fwd = f.flow(&key(&ack)).expect("re-created forward entry");
        assert_eq!(fwd.recreated, 1, "{prog:?}");
        let t = Timeouts::DEFAULT;
        assert!(
            (0..=i64::from(t.tcp_unreplied)).contains(&secs_left(&fwd)),
            "{prog:?}: the short timeout until the backend answers: {fwd:?}"
        );
        let hook = if prog == Prog::Xdp {
            "xdp"
        } else {
            "tc_ingress"
        };
        assert!(
            reason_count(&f, hook, Reason::FlowRecreated) >= 1,
            "{prog:?}"
        );
        let reply = Ipv4Packet {
            tcp_flags: TCP_ACK,
            ..with_dst_packet(&ack, first, 443).reply()
        };
        let (_, out) = f.run(Prog::TcEgress, &reply.build());
        assert_eq!(
            src(&out),
            (VIP, 443),
            "{prog:?}: the reply is reverse-NATed"
        );
        let fwd = f.flow(&key(&ack)).unwrap();
        assert_eq!((fwd.replied, fwd.recreated), (1, 0), "{prog:?}: answered");
        assert!(
            secs_left(&fwd) > i64::from(t.tcp_syn),
            "{prog:?}: established timeout now: {fwd:?}"
        );
        for (k, _) in f.dp.flow_entries() {
            f.dp.flows_mut().remove(&k).unwrap();
        }
    }
}

/// Each TCP state transition, on both entries of the flow: a SYN opens it (`tcp_syn`), the
/// backend's answer establishes it, a FIN from each side closes it (`tcp_time_wait` once both
/// have), and a new SYN on the closed tuple is a new connection, selected afresh.
#[test]
fn tcp_states_follow_the_connection_and_a_syn_reopens_a_closed_tuple() {
    let Some(mut f) = fixture() else { return };
    let t = Timeouts::DEFAULT;
    let syn = tcp(40330, VIP, 443, TCP_SYN);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let to_client = |flags| Ipv4Packet {
        tcp_flags: flags,
        ..with_dst_packet(&syn, backend, 443).reply()
    };
    let rkey = key(&to_client(TCP_ACK));
    let both = |f: &Fixture| (f.flow(&key(&syn)).unwrap(), f.flow(&rkey).unwrap());
    let (fwd, rep) = both(&f);
    assert_eq!((fwd.replied, rep.replied), (0, 0));
    assert!(
        (1..=i64::from(t.tcp_syn)).contains(&secs_left(&fwd)),
        "opening: {fwd:?}"
    );

    f.run(Prog::TcEgress, &to_client(TCP_SYN | TCP_ACK).build());
    let (fwd, rep) = both(&f);
    assert_eq!(
        (fwd.replied, rep.replied),
        (1, 1),
        "SYN-ACK establishes both"
    );
    assert!(
        secs_left(&fwd) > i64::from(t.tcp_syn),
        "established: {fwd:?}"
    );
    assert_eq!(fwd.expires_ns, rep.expires_ns, "one expiry for the flow");

    expect_dnat(
        &mut f,
        Prog::TcIngress,
        &tcp(40330, VIP, 443, TCP_FIN | TCP_ACK),
        &WEB,
        443,
    );
    let (fwd, rep) = both(&f);
    assert_eq!(
        (fwd.closing_orig, rep.closing_orig),
        (1, 1),
        "client FIN on both"
    );
    assert_eq!(fwd.closing_reply, 0);
    assert!(
        secs_left(&fwd) > i64::from(t.tcp_time_wait),
        "half-closed keeps the established timeout: {fwd:?}"
    );

    f.run(Prog::TcEgress, &to_client(TCP_FIN | TCP_ACK).build());
    let (fwd, rep) = both(&f);
    assert_eq!(
        (fwd.closing_reply, rep.closing_reply),
        (1, 1),
        "backend FIN on both"
    );
    assert!(
        (i64::from(t.tcp_closing) + 1..=i64::from(t.tcp_time_wait)).contains(&secs_left(&fwd)),
        "closed both ways: tcp_time_wait, longer than a reset's tcp_closing: {fwd:?}"
    );
    assert_eq!((fwd.reset, rep.reset), (0, 0));

    let before = reason_count(&f, "tc_ingress", Reason::FlowReopened);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    assert_eq!(
        reason_count(&f, "tc_ingress", Reason::FlowReopened),
        before + 1
    );
    let fwd = f.flow(&key(&syn)).unwrap();
    assert_eq!(
        (fwd.replied, fwd.closing_orig, fwd.closing_reply),
        (0, 0, 0),
        "a fresh connection: {fwd:?}"
    );
}

/// A RST from either side ends the flow for both directions.
#[test]
fn a_rst_from_either_side_closes_the_flow() {
    let Some(mut f) = fixture() else { return };
    let t = Timeouts::DEFAULT;
    for (sport, from_backend) in [(40340, false), (40341, true)] {
        let syn = tcp(sport, VIP, 443, TCP_SYN);
        let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
        if from_backend {
            let rst = Ipv4Packet {
                tcp_flags: TCP_RST | TCP_ACK,
                ..with_dst_packet(&syn, backend, 443).reply()
            };
            f.run(Prog::TcEgress, &rst.build());
        } else {
            expect_dnat(
                &mut f,
                Prog::TcIngress,
                &tcp(sport, VIP, 443, TCP_RST),
                &WEB,
                443,
            );
        }
        let fwd = f.flow(&key(&syn)).unwrap();
        assert_eq!(
            (fwd.closing_orig, fwd.closing_reply, fwd.reset),
            (1, 1, 1),
            "{fwd:?}"
        );
        assert!((0..=i64::from(t.tcp_closing)).contains(&secs_left(&fwd)));
    }
}

/// An entry past its expiry counts as absent to the programs themselves (no collector needed):
/// a forward entry is created afresh, and a reply whose entry expired passes untouched.
#[test]
fn an_expired_entry_is_treated_as_absent() {
    let Some(mut f) = fixture() else { return };
    let syn = tcp(40350, VIP, 443, TCP_SYN);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let reply = Ipv4Packet {
        tcp_flags: TCP_ACK,
        ..with_dst_packet(&syn, backend, 443).reply()
    };
    let expire = |f: &mut Fixture, k: FlowKey| {
        let mut e = f.flow(&k).unwrap();
        e.expires_ns = 1;
        f.dp.flows_mut().insert(k, e, 0).unwrap();
    };
    expire(&mut f, key(&reply));
    expect_untouched(&mut f, Prog::TcEgress, &reply.build());
    assert!(reason_count(&f, "tc_egress", Reason::EntryExpired) >= 1);

    expire(&mut f, key(&syn));
    let before = reason_count(&f, "tc_ingress", Reason::FlowNew);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    assert_eq!(
        reason_count(&f, "tc_ingress", Reason::FlowNew),
        before + 1,
        "a new flow, not the expired one"
    );
    let fwd = f.flow(&key(&syn)).unwrap();
    assert!(secs_left(&fwd) > 0, "live again: {fwd:?}");
}

/// A packet of a connection the node itself holds — here the test process's own sockets on
/// loopback, where `db` publishes LOOPBACK_PORT — is never translated, even though its
/// destination is a published port: published ports lie where nodes pick local ports. A
/// listening or unconnected socket on the port does not count (lb will hold published ports
/// that way).
#[test]
fn the_nodes_own_connections_are_never_translated() {
    use std::net::{TcpListener, UdpSocket};
    let Some(mut f) = fixture() else { return };
    let lo = Ipv4Addr::LOCALHOST;
    let listener = TcpListener::bind((lo, 0)).unwrap();
    let peer = listener.local_addr().unwrap().port();
    let socket = socket2_bound_tcp(lo, LOOPBACK_PORT);
    socket.connect((lo, peer)).unwrap();
    let (_accepted, _) = listener.accept().unwrap();
    let mut from_peer = Ipv4Packet::tcp(lo, peer, lo, LOOPBACK_PORT);
    from_peer.tcp_flags = TCP_ACK | TCP_PSH;
    for prog in [Prog::TcIngress, Prog::Xdp] {
        expect_untouched(&mut f, prog, &from_peer.build());
    }
    assert!(reason_count(&f, "tc_ingress", Reason::NodeSocket) >= 1);

    let udp = UdpSocket::bind((lo, LOOPBACK_PORT)).unwrap();
    let mut to_held = Ipv4Packet::udp(lo, 40360, lo, LOOPBACK_PORT);
    expect_dnat(&mut f, Prog::TcIngress, &to_held, &[DB], 5432);
    udp.connect((lo, 40361)).unwrap();
    to_held.sport = 40361;
    expect_untouched(&mut f, Prog::TcIngress, &to_held.build());
    assert!(f.flow(&key(&from_peer)).is_none() && f.flow(&key(&to_held)).is_none());
}

/// A TCP socket bound to `addr:port` (reusing it), not yet connected.
fn socket2_bound_tcp(addr: Ipv4Addr, port: u16) -> BoundTcp {
    use std::os::fd::FromRawFd as _;
    // SAFETY: plain socket calls on an fd this function owns until it is wrapped.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        );
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(addr.octets()),
            },
            sin_zero: [0; 8],
        };
        let rc = libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(
            rc,
            0,
            "bind {addr}:{port}: {}",
            std::io::Error::last_os_error()
        );
        BoundTcp(std::fs::File::from_raw_fd(fd))
    }
}

struct BoundTcp(std::fs::File);

impl BoundTcp {
    fn connect(&self, to: (Ipv4Addr, u16)) -> std::io::Result<()> {
        use std::os::fd::AsRawFd as _;
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: to.1.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(to.0.octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: connect on the fd self owns, with a valid sockaddr_in.
        let rc = unsafe {
            libc::connect(
                self.0.as_raw_fd(),
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// Two services that meet on one backend port (a VIP and a published port targeting the same
/// port) with the same client port: the second flow's reply tuple is taken, so its client
/// port is changed (as the kernel's NAT does), and each reply reaches the service its client
/// spoke to.
#[test]
fn two_flows_never_share_a_reply_tuple() {
    let Some(mut f) = fixture() else { return };
    f.net.services[0].backends.truncate(1);
    f.sync();
    let to_vip = tcp(40370, VIP, 80, TCP_SYN);
    expect_dnat(&mut f, Prog::TcIngress, &to_vip, &WEB[..1], 80);
    let to_port = tcp(40370, NODE, 8080, TCP_SYN);
    let (_, out) = f.run(Prog::TcIngress, &to_port.build());
    verify(&out).unwrap();
    let (moved_to, moved_port) = src(&out);
    assert_eq!(moved_to, CLIENT);
    assert_ne!(
        moved_port, 40370,
        "the clashing flow gets another source port"
    );
    assert!(
        (MASQ_PORT_MIN..=MASQ_PORT_MAX).contains(&moved_port),
        "from the NAT range: {moved_port}"
    );
    assert_eq!(dst(&out), (WEB[0], 80));
    assert_eq!(reason_count(&f, "tc_ingress", Reason::PortClash), 1);
    for (sport, service) in [(40370, (VIP, 80)), (moved_port, (NODE, 8080))] {
        let reply = Ipv4Packet::tcp(WEB[0], 80, CLIENT, sport);
        let (_, back) = f.run(Prog::TcEgress, &reply.build());
        verify(&back).unwrap();
        assert_eq!(src(&back), service, "reply to client port {sport}");
        assert_eq!(
            dst(&back),
            (CLIENT, 40370),
            "the client's own port is restored"
        );
    }
}

/// Closes the TCP flow of `syn` (answered by `backend`:`port`) by FINs both ways, client first.
fn close_by_fins(f: &mut Fixture, syn: &Ipv4Packet, backend: Ipv4Addr, port: u16) {
    let fin = Ipv4Packet {
        tcp_flags: TCP_FIN | TCP_ACK,
        ..syn.clone()
    };
    let answer = |flags| Ipv4Packet {
        tcp_flags: flags,
        ..with_dst_packet(syn, backend, port).reply()
    };
    f.run(Prog::TcEgress, &answer(TCP_SYN | TCP_ACK).build());
    f.run(Prog::TcIngress, &fin.build());
    f.run(Prog::TcEgress, &answer(TCP_FIN | TCP_ACK).build());
    let closed = f.flow(&key(syn)).unwrap();
    assert_eq!((closed.closing_orig, closed.closing_reply), (1, 1));
}

/// A connection closed by FINs keeps its reply tuple claimed (`tcp_time_wait`: its backend may
/// hold the 4-tuple in TIME_WAIT, where only the same client's next connection to the same
/// service is taken): the same client port sent to another service that meets the same
/// backend port gets another source port, while the same client port to the same service
/// takes its tuple back (a reopen), `tcp_closing` (a reset connection's time) after the close.
/// Broken on purpose (closed flows on `tcp_closing` again): the clashing flow keeps the
/// client's port.
#[test]
fn a_closed_flows_reply_tuple_stays_claimed_for_its_time_wait() {
    let Some(mut f) = fixture() else { return };
    f.net.services[0].backends.truncate(1);
    f.sync();
    let to_vip = tcp(40390, VIP, 80, TCP_SYN);
    expect_dnat(&mut f, Prog::TcIngress, &to_vip, &WEB[..1], 80);
    close_by_fins(&mut f, &to_vip, WEB[0], 80);
    // As if a reset connection's whole `tcp_closing` had passed since.
    let aged = (Timeouts::DEFAULT.tcp_closing as u64 + 1) * 1_000_000_000;
    for (k, mut e) in f.dp.flow_entries() {
        e.expires_ns -= aged;
        f.dp.flows_mut().insert(k, e, 0).unwrap();
    }
    let clashes = reason_count(&f, "tc_ingress", Reason::PortClash);

    let to_port = tcp(40390, NODE, 8080, TCP_SYN);
    let (_, out) = f.run(Prog::TcIngress, &to_port.build());
    verify(&out).unwrap();
    assert_eq!(dst(&out), (WEB[0], 80));
    assert_ne!(
        src(&out).1,
        40390,
        "another service's connection does not meet the closed one's TIME_WAIT"
    );
    assert_eq!(
        reason_count(&f, "tc_ingress", Reason::PortClash),
        clashes + 1
    );

    let (_, out) = f.run(Prog::TcIngress, &to_vip.build());
    verify(&out).unwrap();
    assert_eq!(dst(&out), (WEB[0], 80));
    assert_eq!(
        src(&out),
        (CLIENT, 40390),
        "the same client and service reopen their own tuple"
    );
}

/// A SYN whose hash-derived clash ports are all taken tries random ones: every port the flow
/// hash gives it is held (by connections of another service from those client ports), and
/// it is still translated — to a port the hash did not give — instead of being dropped,
/// which its retransmission would be again, port for port. (Broken on purpose, without the
/// random probes: dropped as `nat_failed`.)
#[test]
fn a_syn_whose_hash_derived_ports_are_taken_tries_random_ones() {
    let Some(mut f) = fixture() else { return };
    f.net.services[0].backends.truncate(1);
    f.sync();
    let to_port = tcp(40400, NODE, 8080, TCP_SYN);
    // The ports the hash gives the flow, learned by letting it take each in turn: its own
    // port, then each clash port, held by a VIP connection from that port.
    let mut held = vec![40400];
    for _ in 0..=lb_common::hash::CLASH_PROBES {
        let last = *held.last().unwrap();
        expect_dnat(
            &mut f,
            Prog::TcIngress,
            &tcp(last, VIP, 80, TCP_SYN),
            &WEB[..1],
            80,
        );
        let snapshot = f.tables();
        let (_, out) = f.run(Prog::TcIngress, &to_port.build());
        verify(&out).unwrap();
        let port = src(&out).1;
        f.restore(&snapshot);
        if held.len() == 1 + lb_common::hash::CLASH_PROBES as usize {
            assert!(
                !held.contains(&port),
                "a random port, not one of the hash's {held:?}: {port}"
            );
            assert_eq!(dst(&out), (WEB[0], 80));
            assert_eq!(reason_count(&f, "tc_ingress", Reason::NatFailed), 0);
            return;
        }
        held.push(port);
    }
    unreachable!("returns once every hash-derived port is held");
}

/// A masqueraded flow is counted once per packet (by its load-balancing pair), though each of
/// its packets passes two of its entries.
#[test]
fn a_masqueraded_packet_is_counted_once() {
    if !require_root("a_masqueraded_packet_is_counted_once") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Always);
    let syn = tcp(40380, VIP, 443, TCP_SYN);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    f.run_ctx(Prog::TcEgress, &with_dst(&syn, backend, 443), Some(7));
    let fwd = f.flow(&key(&syn)).unwrap();
    assert_eq!(f.dp.counter(fwd.counter).unwrap().packets, 1);
    assert_eq!(service_total(&mut f, VIP).packets, 1);
}

/// A service switched to a new backend set keeps its old set's slots for one more sync: a
/// program run that read the service entry just before the switch still finds the slot it
/// was about to read. The next sync deletes them.
#[test]
fn an_old_backend_set_is_deleted_one_sync_after_the_switch() {
    let Some(mut f) = fixture() else { return };
    let live = |f: &Fixture| -> BTreeSet<u32> {
        let current = f.dp.current_services().unwrap();
        // An empty set has no slots to find.
        (current.values())
            .filter(|(s, _)| s.count > 0)
            .map(|(s, _)| s.set_id)
            .collect()
    };
    let before = f.dp.backend_set_ids().unwrap();
    assert_eq!(before, live(&f), "only live sets at first");
    f.net.services[0].backends[0].disabled = true;
    f.sync();
    let after_switch = f.dp.backend_set_ids().unwrap();
    let retired: Vec<u32> = after_switch.difference(&live(&f)).copied().collect();
    assert!(
        !retired.is_empty(),
        "the sets web switched away from are still there: {after_switch:?}"
    );
    f.sync();
    assert_eq!(
        f.dp.backend_set_ids().unwrap(),
        live(&f),
        "deleted by the next sync"
    );
}

/// The counter ids named by what the maps hold, after checking that the sync's mirror of them
/// is exactly what a fresh read of the maps finds.
fn named_counters(f: &mut Fixture) -> BTreeSet<u32> {
    let held = f.dp.held().unwrap().clone();
    assert_eq!(
        held,
        f.dp.current_services().unwrap(),
        "the mirror is the maps"
    );
    (held.values())
        .flat_map(|(_, set)| set.iter().map(|b| b.counter))
        .collect()
}

/// A sync writes from its mirror of the maps, never reading them: across a backend replaced,
/// a service removed and one added the mirror stays what the maps hold. A counter exists only
/// once its service or backend carried a packet, goes one sync after its owner, and its id is
/// handed out again only once a walk of the flow table finds no entry naming it, starting at
/// zero. Only backends have counters (a service is their sum).
#[test]
fn the_mirror_is_the_maps_and_counters_exist_only_for_what_exists() {
    let Some(mut f) = fixture() else { return };
    named_counters(&mut f);
    assert!(
        f.dp.counter_ids().unwrap().is_empty(),
        "no counter before a packet"
    );
    let syn = tcp(40500, DB_VIP, 5432, TCP_SYN);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &[DB], 5432);
    let fwd = f.flow(&key(&syn)).unwrap();
    let db_counters = BTreeSet::from([fwd.counter]);
    assert_eq!(
        f.dp.counter_ids().unwrap(),
        db_counters,
        "created by the first packet"
    );
    assert!(named_counters(&mut f).is_superset(&db_counters));
    // Every web backend counts packets too, so that whichever freed id is handed out again
    // had counted some.
    for port in 40510..40540 {
        expect_dnat(
            &mut f,
            Prog::TcIngress,
            &tcp(port, VIP, 443, TCP_SYN),
            &WEB,
            443,
        );
    }
    let counted = f.dp.counter_ids().unwrap();
    assert_eq!(
        counted.len(),
        1 + WEB.len(),
        "db's and web's backends: {counted:?}"
    );

    f.net.services.retain(|s| s.id != "db");
    f.net.services[0].backends[0].ip = Ipv4Addr::new(10, 20, 0, 99).into();
    f.sync();
    let now = named_counters(&mut f);
    assert!(now.is_disjoint(&db_counters), "db's counters are given up");
    let freed: BTreeSet<u32> = counted.difference(&now).copied().collect();
    assert_eq!(freed.len(), 2, "db's backend and web's replaced one");
    assert_eq!(f.dp.counter_ids().unwrap(), counted, "kept one more sync");
    f.sync();
    named_counters(&mut f);
    assert_eq!(
        f.dp.counter_ids().unwrap(),
        counted.intersection(&now).copied().collect(),
        "then deleted"
    );

    // Freed ids are not handed out while a flow may name them: not without a walk of the
    // flow table, nor after one that finds them named (db's flow, web's replaced backend's).
    f.net.services.push(service("new", DB_VIP, &[DB], vec![]));
    f.sync();
    assert!(
        named_counters(&mut f).is_disjoint(&freed),
        "no walk yet: nothing freed is handed out"
    );
    let walk = |ids: BTreeSet<u32>| lb_user::dataplane::ebpf::gc::Referenced {
        since: std::time::Instant::now(),
        ids,
    };
    f.net.services.retain(|s| s.id != "new");
    f.sync_walked(Some(&walk(freed.clone())));
    f.net.services.push(service("new", DB_VIP, &[DB], vec![]));
    f.sync_walked(Some(&walk(freed.clone())));
    assert!(
        named_counters(&mut f).is_disjoint(&freed),
        "a walk that finds them named keeps them out"
    );
    // A walk that finds none naming them: handed out again (the lowest free ids), at zero,
    // whatever a draining flow counted to them meanwhile.
    f.net.services.retain(|s| s.id != "new");
    f.sync_walked(Some(&walk(BTreeSet::new())));
    f.net.services.push(service("new", DB_VIP, &[DB], vec![]));
    f.sync_walked(Some(&walk(BTreeSet::new())));
    let reused: Vec<u32> = named_counters(&mut f)
        .intersection(&freed)
        .copied()
        .collect();
    assert!(!reused.is_empty(), "freed ids are handed out again");
    for c in reused {
        assert_eq!(
            f.dp.counter(c).unwrap().packets,
            0,
            "counter {c} starts at zero"
        );
    }
    let syn = tcp(40501, DB_VIP, 5432, TCP_SYN);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &[DB], 5432);
    let fwd = f.flow(&key(&syn)).unwrap();
    assert_eq!(
        f.dp.counter(fwd.counter).unwrap().packets,
        1,
        "counts from one"
    );
}
