//! The IPv6 NAT paths under BPF_PROG_TEST_RUN: each hook's program tail-calls its IPv6 twin
//! (`lb_xdp6`, `lb_tc_ingress6`, `lb_tc_egress6`), which DNATs a packet to the IPv6 VIP or a
//! published port on the node's IPv6 address to an IPv6 backend, tracks it in `lb_flows6`,
//! and gives the reply the service's address back on TC egress. The fixture's network is
//! `dual_stack_network`: `web` has an IPv4 and an IPv6 VIP, three backends of each family,
//! and its ports on every node address of both. Every rewritten frame is compared with the
//! builder's from-scratch rebuild and its L4 checksum recomputed by `verify6`, independently
//! of the programs' incremental updates. Root only.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use lb_common::{FLOW_EGRESS, FLOW_REPLY, Flow6, FlowKey6, Reason};
use lb_tests::{
    fixture::{
        Fixture, NODE, NODE6, Prog, TC_ACT_OK, VIP, VIP6, WEB, WEB6, XDP_PASS, dual_stack_network,
        key6, run_counted,
    },
    packet::{Ext, Ipv4Packet, Ipv6Packet, ip_of, verify, verify6},
    require_root,
};
use lb_user::{core::model::Masquerade, dataplane::ebpf::be6};

const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2);

/// The ingress programs: XDP rewrites what it can prove full-checksummed, TC ingress the rest.
const INGRESS: [Prog; 2] = [Prog::TcIngress, Prog::Xdp];

/// Where each test reaches `web` over IPv6: `(address, published port, port the backend
/// gets)`. A VIP answers on every port and keeps it; the published ports have targets.
const TCP_TARGETS: [(Ipv6Addr, u16, u16); 2] = [(VIP6, 443, 443), (NODE6, 8080, 80)];
const UDP_TARGETS: [(Ipv6Addr, u16, u16); 2] = [(VIP6, 53, 53), (NODE6, 5353, 53)];

fn fixture() -> Option<Fixture> {
    let name = std::thread::current()
        .name()
        .unwrap_or("nat6_prog")
        .to_owned();
    require_root(&name).then(|| Fixture::with_network(dual_stack_network(Masquerade::Never), None))
}

fn addr6(b: &[u8]) -> Ipv6Addr {
    Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap())
}

/// Source and destination (address, port) of an IPv6 frame whose L4 header is at `l4`.
fn tuple6(frame: &[u8], l4: usize) -> ((Ipv6Addr, u16), (Ipv6Addr, u16)) {
    let ip = ip_of(frame);
    let port = |at: usize| u16::from_be_bytes([frame[at], frame[at + 1]]);
    (
        (addr6(&ip[8..24]), port(l4)),
        (addr6(&ip[24..40]), port(l4 + 2)),
    )
}

/// The frame's UDP checksum field (UDP at `l4`).
fn udp_check(frame: &[u8], l4: usize) -> u16 {
    u16::from_be_bytes([frame[l4 + 6], frame[l4 + 7]])
}

/// A flow key as the programs build it from `p` (addresses and ports in network order).
fn flow6(f: &Fixture, k: &FlowKey6) -> Option<Flow6> {
    (f.dp.flow_entries6().into_iter())
        .find(|(e, _)| e == k)
        .map(|(_, v)| v)
}

/// Runs `frame` through `prog`, which must translate it: XDP passes it with its handoff to
/// TC in the metadata, TC says OK (the IPv6 twin's own verdict, returned through the tail
/// call). The frame keeps its length: nothing is inserted or taken out.
fn translated(f: &mut Fixture, prog: Prog, frame: &[u8]) -> Vec<u8> {
    let run = f
        .test_run(prog, frame, None)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN of {prog:?}: {e:?}"));
    if prog == Prog::Xdp {
        assert_eq!(run.verdict, XDP_PASS, "{prog:?}: verdict");
        assert_eq!(
            run.meta,
            Some(f.handoff()),
            "{prog:?}: translated, handed to TC"
        );
    } else {
        assert_eq!(run.verdict, TC_ACT_OK, "{prog:?}: verdict");
    }
    assert_eq!(run.out.len(), frame.len(), "{prog:?}: frame length");
    run.out
}

/// Sends `p` through `prog` and asserts it came out DNATed to one of `web`'s IPv6 backends
/// with destination port `port`, nothing else changed and a valid L4 checksum. Returns the
/// backend.
fn expect_dnat6(f: &mut Fixture, prog: Prog, p: &Ipv6Packet, port: u16) -> Ipv6Addr {
    let out = translated(f, prog, &p.build());
    let (_, (backend, dport)) = tuple6(&out, p.l4_offset());
    // A flow is balanced over backends of its own family: no IPv4 backend, in any form.
    assert!(
        WEB6.contains(&backend),
        "{prog:?}: {backend} is not an IPv6 backend of {} (IPv4 ones: {WEB:?})",
        p.daddr
    );
    assert_eq!(dport, port, "{prog:?}: destination port");
    verify6(&out).unwrap_or_else(|e| panic!("{prog:?} to {}: {e}", p.daddr));
    assert_eq!(
        out,
        Ipv6Packet {
            daddr: backend,
            dport: port,
            ..p.clone()
        }
        .build(),
        "{prog:?}: only the destination (and the L4 checksum) changes"
    );
    backend
}

/// Asserts that `p`, DNATed to `backend:port`, left its two entries in `lb_flows6`: the
/// client's direction (ingress) and the backend's reply (egress, back to `p`'s destination).
fn expect_flow6(f: &Fixture, p: &Ipv6Packet, backend: Ipv6Addr, port: u16) {
    let fwd = flow6(f, &key6(p)).expect("forward entry in lb_flows6");
    assert_eq!(
        (fwd.saddr, fwd.daddr, fwd.sport, fwd.dport, fwd.flags),
        (be6(p.saddr), be6(backend), p.sport.to_be(), port.to_be(), 0),
        "forward entry"
    );
    let reply = Ipv6Packet {
        daddr: backend,
        dport: port,
        ..p.clone()
    }
    .reply();
    let rev = flow6(f, &key6(&reply)).expect("reply entry in lb_flows6");
    assert_eq!(
        (rev.saddr, rev.daddr, rev.sport, rev.dport, rev.flags),
        (
            be6(p.daddr),
            be6(p.saddr),
            p.dport.to_be(),
            p.sport.to_be(),
            FLOW_EGRESS | FLOW_REPLY
        ),
        "reply entry"
    );
}

/// A new flow's first packet from `CLIENT6` to each of `web`'s IPv6 targets, TCP and UDP,
/// through each ingress program, each from its own source port (from `sport` + 1 on), with
/// the port its backend gets.
fn first_packets(sport: u16) -> Vec<(Prog, Ipv6Packet, u16)> {
    let mut out = Vec::new();
    for prog in INGRESS {
        for (targets, tcp) in [(TCP_TARGETS, true), (UDP_TARGETS, false)] {
            for (daddr, dport, target) in targets {
                let sport = sport + 1 + out.len() as u16;
                let p = if tcp {
                    Ipv6Packet::tcp(CLIENT6, sport, daddr, dport)
                } else {
                    Ipv6Packet::udp(CLIENT6, sport, daddr, dport)
                };
                out.push((prog, p, target));
            }
        }
    }
    out
}

/// Runs a backend's `reply` through TC egress, which must give it `service`'s address and port
/// as its source and change nothing else but the L4 checksum (checked from scratch).
fn expect_reversed6(
    f: &mut Fixture,
    reply: &Ipv6Packet,
    service: (Ipv6Addr, u16),
    what: &str,
) -> Vec<u8> {
    let back = translated(f, Prog::TcEgress, &reply.build());
    verify6(&back).unwrap_or_else(|e| panic!("{what}: reply from {}: {e}", reply.saddr));
    let restored = Ipv6Packet {
        saddr: service.0,
        sport: service.1,
        ..reply.clone()
    };
    assert_eq!(
        back,
        restored.build(),
        "{what}: only the source (and the L4 checksum) changes"
    );
    back
}

fn with_exts(mut p: Ipv6Packet, exts: &[Ext]) -> Ipv6Packet {
    p.exts = exts.to_vec();
    p
}

#[test]
fn tcp_syn_and_udp_to_the_ipv6_vip_and_port_go_to_an_ipv6_backend() {
    let Some(mut f) = fixture() else { return };
    let mut flows = 0;
    for (prog, p, target) in first_packets(40000) {
        let backend = expect_dnat6(&mut f, prog, &p, target);
        expect_flow6(&f, &p, backend, target);
        flows += 1;
    }
    assert_eq!(
        f.dp.flow_entries6().len(),
        2 * flows,
        "one flow, two entries"
    );
    assert!(
        f.dp.flow_entries().is_empty(),
        "an IPv6 flow is tracked in lb_flows6 only"
    );
}

/// The same service's IPv4 side keeps its own backends: the IPv6 backends joined its set
/// for IPv6 keys only.
#[test]
fn the_ipv4_side_of_the_dual_stack_service_keeps_its_ipv4_backends() {
    let Some(mut f) = fixture() else { return };
    let client = Ipv4Addr::new(10, 10, 0, 2);
    for prog in INGRESS {
        for (daddr, dport, target) in [(VIP, 443, 443), (NODE, 8080, 80)] {
            for sport in 41000..41030 {
                let p = Ipv4Packet::tcp(client, sport + 100 * prog as u16, daddr, dport);
                let (_, out) = f.run(prog, &p.build());
                let ip = ip_of(&out);
                let backend = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
                assert!(WEB.contains(&backend), "{prog:?}: {backend} for {daddr}");
                assert_eq!(u16::from_be_bytes([ip[22], ip[23]]), target);
                verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
            }
        }
    }
    assert!(f.dp.flow_entries6().is_empty(), "no IPv6 flow from IPv4");
}

#[test]
fn replies_from_the_ipv6_backend_get_the_service_address_back_on_egress() {
    let Some(mut f) = fixture() else { return };
    for (prog, p, target) in first_packets(42000) {
        let (daddr, dport, sport) = (p.daddr, p.dport, p.sport);
        let backend = expect_dnat6(&mut f, prog, &p, target);
        let reply = Ipv6Packet {
            daddr: backend,
            dport: target,
            payload: b"a reply".to_vec(),
            ..p.clone()
        }
        .reply();
        let back = expect_reversed6(&mut f, &reply, (daddr, dport), &format!("{prog:?}"));
        assert_eq!(
            tuple6(&back, reply.l4_offset()),
            ((daddr, dport), (CLIENT6, sport)),
            "{prog:?}: the client sees the address and port it spoke to"
        );
    }
}

/// On IPv6 a UDP checksum of 0 is not "none" (RFC 8200 8.1: the receiver discards the
/// datagram), so IPv4's rule (0 stays 0, which the kernel's NAT applies to both families)
/// does not carry over: a datagram translated with 0 left in it is one no endpoint takes. The
/// programs compute one. Both directions (a client's datagram on ingress, a backend's reply
/// of a tracked flow on egress), with payloads of an odd size, of more than one 512-byte
/// chunk of the programs' sum and of an odd size past it; what leaves carries the checksum
/// `verify6` computes from scratch, nonzero. A first fragment with checksum 0 cannot be given
/// one (the sum covers the whole datagram): it is left untouched, counted
/// `udp6_no_checksum`, and opens no flow.
#[test]
fn udp_with_checksum_0_leaves_translated_with_a_computed_checksum() {
    let Some(mut f) = fixture() else { return };
    let mut sport = 43000;
    for prog in INGRESS {
        for (daddr, dport, target) in UDP_TARGETS {
            for size in [5, 600, 1031] {
                let payload: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
                sport += 1;
                let p = Ipv6Packet {
                    l4_csum: Some(0),
                    payload: payload.clone(),
                    ..Ipv6Packet::udp(CLIENT6, sport, daddr, dport)
                };
                let l4 = p.l4_offset();
                let out = translated(&mut f, prog, &p.build());
                let ((_, _), (backend, port)) = tuple6(&out, l4);
                let what = format!("{prog:?} to [{daddr}]:{dport}, {size} bytes");
                assert!(
                    WEB6.contains(&backend) && port == target,
                    "{what}: {backend}"
                );
                assert_ne!(udp_check(&out, l4), 0, "{what}: checksum left 0");
                verify6(&out).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    out,
                    Ipv6Packet {
                        daddr: backend,
                        dport: target,
                        payload: payload.clone(),
                        ..Ipv6Packet::udp(CLIENT6, sport, daddr, dport)
                    }
                    .build(),
                    "{what}: the datagram as its sender should have checksummed it, translated"
                );

                let reply = Ipv6Packet {
                    daddr: backend,
                    dport: target,
                    ..p.clone()
                }
                .reply();
                let run = f.test_run(Prog::TcEgress, &reply.build(), None).unwrap();
                let what = format!("reply of {what}");
                assert_eq!(run.verdict, TC_ACT_OK, "{what}");
                assert_eq!(tuple6(&run.out, l4).0, (daddr, dport), "{what}");
                assert_ne!(udp_check(&run.out, l4), 0, "{what}: checksum left 0");
                verify6(&run.out).unwrap_or_else(|e| panic!("{what}: {e}"));
            }

            sport += 1;
            let first = Ipv6Packet {
                l4_csum: Some(0),
                exts: vec![Ext::Fragment {
                    offset8: 0,
                    more: true,
                    id: u32::from(sport),
                }],
                ..Ipv6Packet::udp(CLIENT6, sport, daddr, dport)
            };
            let input = first.build();
            let (run, counted) = run_counted(&mut f, prog, &input);
            let what = format!("{prog:?}, first fragment to [{daddr}]:{dport} with checksum 0");
            assert_eq!(run.map(|r| r.1), Some(input), "{what}: untouched");
            assert_eq!(counted, [Reason::Udp6NoChecksum], "{what}: counted");
            assert!(flow6(&f, &key6(&first)).is_none(), "{what}: opened a flow");
        }
    }
}

#[test]
fn syns_from_many_client_ports_spread_over_every_ipv6_backend() {
    let Some(mut f) = fixture() else { return };
    const SYNS: u16 = 300;
    let mut base = 20000;
    for prog in INGRESS {
        for (daddr, dport, target) in TCP_TARGETS {
            let mut got: BTreeMap<Ipv6Addr, u16> = BTreeMap::new();
            for sport in base..base + SYNS {
                let p = Ipv6Packet::tcp(CLIENT6, sport, daddr, dport);
                *got.entry(expect_dnat6(&mut f, prog, &p, target))
                    .or_default() += 1;
            }
            base += SYNS;
            // A third each on average; a sixth is six standard deviations below it, for any
            // hash key.
            for b in WEB6 {
                let n = got.get(&b).copied().unwrap_or(0);
                assert!(
                    n >= SYNS / 6,
                    "{prog:?} to {daddr}: {b} got {n} of {SYNS} flows: {got:?}"
                );
            }
        }
    }
    assert_eq!(f.dp.flow_entries6().len(), 2 * 4 * usize::from(SYNS));
}

/// Extension headers between the IPv6 header and TCP/UDP are walked, kept byte for byte, and
/// the L4 checksum (whose pseudo-header names the upper-layer protocol, not the first
/// extension header) still verifies, in both directions.
#[test]
fn packets_behind_extension_headers_are_translated_with_a_valid_checksum() {
    let Some(mut f) = fixture() else { return };
    let chains: [&[Ext]; 4] = [
        &[Ext::HopByHop(0)],
        &[Ext::DestOpts(0)],
        &[Ext::HopByHop(0), Ext::DestOpts(2)],
        &[Ext::HopByHop(1), Ext::Routing(1), Ext::DestOpts(0)],
    ];
    for (i, chain) in chains.into_iter().enumerate() {
        for (prog, base, target) in first_packets(44000 + 100 * i as u16) {
            let p = with_exts(base, chain);
            let backend = expect_dnat6(&mut f, prog, &p, target);
            expect_flow6(&f, &p, backend, target);
            let reply = Ipv6Packet {
                daddr: backend,
                dport: target,
                ..p.clone()
            }
            .reply();
            expect_reversed6(
                &mut f,
                &reply,
                (p.daddr, p.dport),
                &format!("{prog:?} {chain:?}"),
            );
        }
    }
}

/// Every rewrite keeps `skb->csum` true on a CHECKSUM_COMPLETE skb (what a NIC with receive
/// checksums delivers): the kernel sums the packet before the run and checks the sum after
/// it (`Fixture::test_run_complete`). The trap the kernel's helper sets for IPv6: with
/// `BPF_F_PSEUDO_HDR`, `bpf_l4_csum_replace` folds the L4 checksum's change into `skb->csum`
/// as if an IPv4 header checksum had cancelled the address's change; IPv6 has none, so the
/// programs store IPv6 addresses with `BPF_F_RECOMPUTE_CSUM` (the other half), which the
/// helper's `BPF_F_IPV6` (6.16+) would make unnecessary. Both families, both directions, TCP
/// and UDP, a published port's port change, extension headers, and a UDP checksum of 0
/// given one (its store is the one no helper accounts for).
#[test]
fn checksum_complete_skbs_keep_a_true_skb_csum_through_every_rewrite() {
    let Some(mut f) = fixture() else { return };
    let mut cases: Vec<(String, Ipv6Packet)> = Vec::new();
    for (prog, p, _) in first_packets(45000) {
        if prog == Prog::TcIngress {
            let proto = if p.proto == 6 { "TCP" } else { "UDP" };
            cases.push((format!("{proto} to [{}]:{}", p.daddr, p.dport), p.clone()));
            cases.push(("hop-by-hop".into(), with_exts(p, &[Ext::HopByHop(1)])));
        }
    }
    for (i, size) in [5usize, 1031].into_iter().enumerate() {
        let (daddr, dport, _) = UDP_TARGETS[i];
        let p = Ipv6Packet {
            l4_csum: Some(0),
            payload: vec![0x5a; size],
            ..Ipv6Packet::udp(CLIENT6, 45100 + i as u16, daddr, dport)
        };
        cases.push((format!("UDP checksum 0, {size} bytes"), p));
    }
    for (what, p) in cases {
        let out = complete(&mut f, Prog::TcIngress, &p.build(), verify6, &what);
        let (_, (backend, port)) = tuple6(&out, p.l4_offset());
        assert!(WEB6.contains(&backend), "TcIngress, {what}: not translated");
        let reply = Ipv6Packet {
            daddr: backend,
            dport: port,
            l4_csum: None,
            ..p.clone()
        }
        .reply();
        let out = complete(&mut f, Prog::TcEgress, &reply.build(), verify6, &what);
        assert_eq!(
            tuple6(&out, p.l4_offset()).0,
            (p.daddr, p.dport),
            "TcEgress, reply of {what}: not translated"
        );
    }

    let client = Ipv4Addr::new(10, 10, 0, 2);
    for (i, (daddr, tcp_port, udp_port)) in
        [(VIP, 443, 53), (NODE, 8080, 5353)].into_iter().enumerate()
    {
        for tcp in [true, false] {
            let sport = 45200 + 2 * i as u16 + u16::from(tcp);
            let dport = if tcp { tcp_port } else { udp_port };
            let p = if tcp {
                Ipv4Packet::tcp(client, sport, daddr, dport)
            } else {
                Ipv4Packet::udp(client, sport, daddr, dport)
            };
            let what = format!(
                "IPv4 {} to {daddr}:{dport}",
                if tcp { "TCP" } else { "UDP" }
            );
            let out = complete(&mut f, Prog::TcIngress, &p.build(), verify, &what);
            let ip = ip_of(&out);
            let backend = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            assert!(WEB.contains(&backend), "TcIngress, {what}: not translated");
            let port = u16::from_be_bytes([ip[22], ip[23]]);
            let reply = Ipv4Packet {
                daddr: backend,
                dport: port,
                ..p.clone()
            }
            .reply();
            let out = complete(&mut f, Prog::TcEgress, &reply.build(), verify, &what);
            assert_eq!(
                ip_of(&out)[12..16],
                daddr.octets(),
                "TcEgress, reply of {what}: not translated"
            );
        }
    }
}

/// Runs `frame` through `prog` as a CHECKSUM_COMPLETE skb, which it must pass translated
/// (`TC_ACT_OK`) with `skb->csum` true and every checksum `verify` checks right.
fn complete(
    f: &mut Fixture,
    prog: Prog,
    frame: &[u8],
    verify: fn(&[u8]) -> Result<(), String>,
    what: &str,
) -> Vec<u8> {
    let run = (f.test_run_complete(prog, frame))
        .unwrap_or_else(|e| panic!("{prog:?}, {what}: {e} (EBADMSG: skb->csum went wrong)"));
    assert_eq!(run.verdict, TC_ACT_OK, "{prog:?}, {what}");
    verify(&run.out).unwrap_or_else(|e| panic!("{prog:?}, {what}: {e}"));
    run.out
}

/// ICMPv6 Packet Too Big (type 2), MTU 1400, from `from` to `to`, quoting `quoted` (a frame).
fn too_big(from: Ipv6Addr, to: Ipv6Addr, quoted: &[u8]) -> Vec<u8> {
    Ipv6Packet::icmp6(from, to, (2, 0, 1400), ip_of(quoted)).build()
}

/// `translated`, as an error quoting it shows it: the programs leave a quote's L4 checksum as
/// `original` had it (no receiver checks it; the quote may be cut short).
fn as_quoted(translated: &Ipv6Packet, original: &Ipv6Packet) -> Vec<u8> {
    let frame = original.build();
    let at = original.l4_offset() + 16;
    Ipv6Packet {
        l4_csum: Some(u16::from_be_bytes([frame[at], frame[at + 1]])),
        ..translated.clone()
    }
    .build()
}

/// A router between the node and a client tells the backend (via the VIP it answered from)
/// that its reply was too big: on ingress the error reaches the backend about the backend's
/// own tuple (outer destination, quoted source and port), its ICMPv6 checksum (which covers
/// the outer addresses by the pseudo-header and the quote) right. A published port's too.
#[test]
fn icmpv6_packet_too_big_toward_a_backend_is_translated_on_ingress() {
    let Some(mut f) = fixture() else { return };
    let router = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 0xfe);
    for (i, (daddr, dport, target)) in TCP_TARGETS.into_iter().enumerate() {
        let syn = Ipv6Packet::tcp(CLIENT6, 46000 + i as u16, daddr, dport);
        let backend = expect_dnat6(&mut f, Prog::TcIngress, &syn, target);
        let reply_seen = syn.reply().build();
        let from_backend = Ipv6Packet {
            saddr: backend,
            sport: target,
            ..syn.reply()
        };
        for prog in INGRESS {
            let out = translated(&mut f, prog, &too_big(router, daddr, &reply_seen));
            verify6(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
            assert_eq!(
                out,
                too_big(router, backend, &as_quoted(&from_backend, &syn.reply())),
                "{prog:?} to [{daddr}]:{dport}: outer destination and quoted source are the \
                 backend's"
            );
        }
    }
}

/// A router between the node and the backends tells the client that its packet was too big
/// (or the backend itself says so): on egress the quoted destination and port become the
/// service's, and so does the outer source when it is the backend's. The acceptance case:
/// the client gets the error with the address it spoke to as the quoted destination.
#[test]
fn icmpv6_packet_too_big_toward_a_client_is_translated_on_egress() {
    let Some(mut f) = fixture() else { return };
    let router = Ipv6Addr::new(0xfd20, 0, 0, 0, 0, 0, 0, 0xfe);
    for (i, (daddr, dport, target)) in TCP_TARGETS.into_iter().enumerate() {
        let syn = Ipv6Packet::tcp(CLIENT6, 46100 + i as u16, daddr, dport);
        let backend = expect_dnat6(&mut f, Prog::TcIngress, &syn, target);
        let forwarded = Ipv6Packet {
            daddr: backend,
            dport: target,
            ..syn.clone()
        };
        for (from, from_seen) in [(backend, daddr), (router, router)] {
            let err = too_big(from, CLIENT6, &forwarded.build());
            let out = translated(&mut f, Prog::TcEgress, &err);
            verify6(&out).unwrap_or_else(|e| panic!("from {from}: {e}"));
            assert_eq!(
                out,
                too_big(from_seen, CLIENT6, &as_quoted(&syn, &forwarded)),
                "from {from} about [{daddr}]:{dport}"
            );
        }
    }
}

/// An ICMPv6 error quoting no tracked flow, or a flow of the other direction at this hook,
/// passes byte-identical.
#[test]
fn icmpv6_errors_about_no_flow_of_the_hook_pass_untouched() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv6Packet::tcp(CLIENT6, 46200, VIP6, 443);
    let backend = expect_dnat6(&mut f, Prog::TcIngress, &syn, 443);
    let stranger = Ipv6Packet::tcp(CLIENT6, 46201, VIP6, 443).reply().build();
    let forwarded = Ipv6Packet {
        daddr: backend,
        ..syn.clone()
    }
    .build();
    for (prog, err) in [
        (Prog::TcIngress, too_big(CLIENT6, VIP6, &stranger)),
        (Prog::Xdp, too_big(CLIENT6, VIP6, &stranger)),
        // About the forward direction, seen on ingress: an error travels against its flow.
        (Prog::TcIngress, too_big(backend, CLIENT6, &forwarded)),
        (Prog::TcEgress, too_big(CLIENT6, VIP6, &syn.reply().build())),
    ] {
        let (run, counted) = run_counted(&mut f, prog, &err);
        assert_eq!(run.map(|r| r.1), Some(err), "{prog:?}: untouched");
        assert_eq!(counted, [Reason::NotService], "{prog:?}");
    }
}

/// A packet to the unspecified address never finds the ports published on every node
/// address, which are keyed by it (the kernel drops such a packet as martian): it passes
/// untouched and opens no flow, on both families. (The IPv6 fuzz tier found both
/// translated.)
#[test]
fn packets_to_the_unspecified_address_find_no_published_port() {
    let Some(mut f) = fixture() else { return };
    let client = Ipv4Addr::new(10, 10, 0, 2);
    let any6 = Ipv6Addr::UNSPECIFIED;
    let any4 = Ipv4Addr::UNSPECIFIED;
    for prog in INGRESS {
        for input in [
            Ipv6Packet::tcp(CLIENT6, 47000, any6, 8080).build(),
            Ipv6Packet::udp(CLIENT6, 47001, any6, 5353).build(),
            Ipv4Packet::tcp(client, 47002, any4, 8080).build(),
            Ipv4Packet::udp(client, 47003, any4, 5353).build(),
        ] {
            let (run, counted) = run_counted(&mut f, prog, &input);
            assert_eq!(run.map(|r| r.1), Some(input), "{prog:?}: untouched");
            assert_eq!(counted, [Reason::NotService], "{prog:?}");
        }
    }
    assert!(f.dp.flow_entries().is_empty() && f.dp.flow_entries6().is_empty());
}
