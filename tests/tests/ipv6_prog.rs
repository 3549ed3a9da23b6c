//! The programs' IPv6 parser under BPF_PROG_TEST_RUN, on all three packet programs: every
//! extension header kind walked to the L4 header, the chains it does not walk refused by
//! name, truncation at every byte of every header, ICMPv6 errors told from informational
//! messages (neighbour discovery among them), fragments. Each run's outcome is read from
//! `lb_reasons` (exactly one outcome per run), and every frame must come out byte-identical
//! with no table written: the fixture's network has no IPv6 service, so the IPv6 programs
//! (which each hook's program tail-calls) parse and pass. Root only, but for the checksum cases, which check the builder's
//! from-scratch pseudo-header sum against lb-common's.
use std::net::Ipv6Addr;

use lb_common::Reason;
use lb_tests::{
    fixture::{Fixture, Prog, refused_by_test_run, run_counted},
    packet::{Ext, Ipv6Packet, l4_checksum6, verify6},
    require_root,
};
use lb_user::core::model::Masquerade;

const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2);
const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);

fn fixture() -> Option<Fixture> {
    if !require_root("ipv6_prog") {
        return None;
    }
    Some(Fixture::new(Masquerade::Auto))
}

/// Runs `frame` through `prog` and returns the one outcome it counted, after checking that
/// the frame came out byte-identical and that no flow or fragment entry was written. `None`
/// when the kernel refused the frame for its length.
fn outcome(f: &mut Fixture, prog: Prog, frame: &[u8]) -> Option<Reason> {
    let tables = f.tables();
    let (run, counted) = run_counted(f, prog, frame);
    let (_, out) = run?;
    assert_eq!(out, frame, "{prog:?} must pass IPv6 byte-identical");
    assert_eq!(
        f.tables(),
        tables,
        "{prog:?} wrote a table for an IPv6 packet"
    );
    assert_eq!(
        counted.len(),
        1,
        "{prog:?}: one outcome per run, got {counted:?}"
    );
    Some(counted[0])
}

fn expect(f: &mut Fixture, frame: &[u8], want: Reason, what: &str) {
    for prog in Prog::ALL {
        match outcome(f, prog, frame) {
            Some(r) => assert_eq!(r, want, "{prog:?}: {what}"),
            None => panic!("{prog:?} refused {what}"),
        }
    }
}

fn with_exts(mut p: Ipv6Packet, exts: &[Ext]) -> Ipv6Packet {
    p.exts = exts.to_vec();
    p
}

const FIRST: Ext = Ext::Fragment {
    offset8: 0,
    more: true,
    id: 0x0102_0304,
};
const LATER: Ext = Ext::Fragment {
    offset8: 2,
    more: false,
    id: 0x0102_0304,
};

#[test]
fn every_extension_header_kind_is_walked_to_the_l4_header() {
    let Some(mut f) = fixture() else { return };
    let chains: [&[Ext]; 10] = [
        &[],
        &[Ext::HopByHop(0)],
        &[Ext::HopByHop(3)],
        &[Ext::Routing(2)],
        &[Ext::DestOpts(0)],
        &[Ext::Ah(1)],
        &[Ext::Ah(5)],
        &[FIRST],
        // An atomic fragment (offset 0, no more): the whole datagram.
        &[Ext::Fragment {
            offset8: 0,
            more: false,
            id: 9,
        }],
        // As many as the programs walk, every kind.
        &[Ext::HopByHop(0), Ext::Routing(1), Ext::Ah(1), FIRST],
    ];
    for chain in chains {
        for p in [
            Ipv6Packet::tcp(CLIENT6, 40000, NODE6, 8080),
            Ipv6Packet::udp(CLIENT6, 40001, NODE6, 5353),
            Ipv6Packet::sctp(CLIENT6, 40002, NODE6, 9000),
        ] {
            let p = with_exts(p, chain);
            let frame = p.build();
            verify6(&frame).unwrap();
            // Parsed to its ports: a flow for which no service is.
            expect(
                &mut f,
                &frame,
                Reason::NotService,
                &format!("proto {} behind {chain:?}", p.proto),
            );
        }
    }
}

#[test]
fn chains_the_programs_do_not_walk_are_counted_by_name() {
    let Some(mut f) = fixture() else { return };
    let tcp = || Ipv6Packet::tcp(CLIENT6, 40000, NODE6, 8080);
    let too_long = [
        Ext::HopByHop(0),
        Ext::DestOpts(0),
        Ext::Routing(0),
        Ext::DestOpts(0),
        Ext::Ah(1),
    ];
    expect(
        &mut f,
        &with_exts(tcp(), &too_long).build(),
        Reason::Ipv6Extension,
        "five extension headers",
    );
    for next_header in [135, 139, 140, 253, 254] {
        let p = with_exts(
            tcp(),
            &[Ext::Other {
                next_header,
                units: 0,
            }],
        );
        expect(
            &mut f,
            &p.build(),
            Reason::Ipv6Extension,
            &format!("extension header {next_header}"),
        );
        // Behind walked ones too.
        let p = with_exts(
            tcp(),
            &[
                Ext::HopByHop(0),
                Ext::Other {
                    next_header,
                    units: 1,
                },
            ],
        );
        expect(
            &mut f,
            &p.build(),
            Reason::Ipv6Extension,
            &format!("hop-by-hop, then {next_header}"),
        );
    }
    // A whole chain, but one whose upper-layer header lies past the bytes the programs parse.
    let deep = with_exts(tcp(), &[Ext::HopByHop(30)]);
    expect(
        &mut f,
        &deep.build(),
        Reason::Ipv6Extension,
        "a 248-byte hop-by-hop header",
    );
    // ESP (its payload is encrypted) and "no next header" carry nothing to translate.
    for proto in [50, 59] {
        let p = Ipv6Packet {
            proto,
            payload: vec![0x5a; 32],
            ..tcp()
        };
        expect(
            &mut f,
            &with_exts(p, &[Ext::DestOpts(0)]).build(),
            Reason::NotL4,
            &format!("next header {proto}"),
        );
    }
}

/// Every prefix of a frame whose payload length claims the whole: a header cut at any byte,
/// extension or L4, is malformed; and the same prefixes with the payload length saying what
/// arrived (the chain itself then claims more than the datagram holds).
#[test]
fn truncation_at_every_byte_of_every_header_is_malformed() {
    let Some(mut f) = fixture() else { return };
    for chain in [
        &[Ext::HopByHop(1), Ext::Routing(1), Ext::Ah(2), FIRST][..],
        &[Ext::DestOpts(0)][..],
        &[][..],
    ] {
        for base in [
            Ipv6Packet::tcp(CLIENT6, 40000, NODE6, 8080),
            Ipv6Packet::icmp6(CLIENT6, NODE6, (2, 0, 1280), &quote(&tcp_to_vip())),
        ] {
            let p = with_exts(
                Ipv6Packet {
                    payload: if base.proto == 6 {
                        Vec::new()
                    } else {
                        base.payload.clone()
                    },
                    ..base
                },
                chain,
            );
            let frame = p.build();
            // The shortest ICMPv6 error that still parses quotes the ports: the IPv6 header
            // and 4 bytes of L4.
            let whole_from = if p.proto == 6 {
                frame.len()
            } else {
                p.l4_offset() + 8 + 40 + 4
            };
            for cut in 14..whole_from {
                let short = &frame[..cut];
                let mut consistent = short.to_vec();
                if cut >= 54 {
                    consistent[18..20].copy_from_slice(&((cut - 54) as u16).to_be_bytes());
                }
                for (frame, how) in [(short, "claims more"), (&consistent[..], "consistent")] {
                    for prog in Prog::ALL {
                        let what =
                            format!("{prog:?}: {chain:?} proto {} cut at {cut} ({how})", p.proto);
                        match outcome(&mut f, prog, frame) {
                            Some(r) => assert_eq!(r, Reason::Malformed, "{what}"),
                            None => assert!(refused_by_test_run(prog, frame), "{what}"),
                        }
                    }
                }
            }
        }
    }
}

fn tcp_to_vip() -> Ipv6Packet {
    Ipv6Packet::tcp(NODE6, 80, CLIENT6, 40000)
}

/// What an ICMPv6 error quotes of `p`: as much of it as fits the minimum MTU, here all of it.
fn quote(p: &Ipv6Packet) -> Vec<u8> {
    p.build()[14..].to_vec()
}

#[test]
fn icmpv6_errors_are_told_from_informational_messages() {
    let Some(mut f) = fixture() else { return };
    // Echo, neighbour and router discovery, MLD: never a flow's, never translated.
    for (t, what) in [
        (128, "echo request"),
        (129, "echo reply"),
        (133, "router solicitation"),
        (134, "router advertisement"),
        (135, "neighbour solicitation"),
        (136, "neighbour advertisement"),
        (143, "MLDv2 report"),
    ] {
        let m = Ipv6Packet::icmp6(CLIENT6, NODE6, (t, 0, 0), &[0xaa; 24]);
        let frame = m.build();
        verify6(&frame).unwrap();
        expect(&mut f, &frame, Reason::NotL4, what);
    }
    // Errors quoting a TCP, UDP or SCTP packet, behind extension headers or not, are parsed
    // to the quoted ports (no flow of ours here).
    for t in 1..=4 {
        for quoted in [
            tcp_to_vip(),
            Ipv6Packet::udp(NODE6, 53, CLIENT6, 40000),
            with_exts(tcp_to_vip(), &[Ext::DestOpts(0), FIRST]),
        ] {
            let e = Ipv6Packet::icmp6(NODE6, CLIENT6, (t, 0, 1280), &quote(&quoted));
            let frame = e.build();
            verify6(&frame).unwrap();
            expect(
                &mut f,
                &with_exts(e.clone(), &[Ext::HopByHop(0)]).build(),
                Reason::NotService,
                &format!("ICMPv6 type {t} behind hop-by-hop"),
            );
            expect(
                &mut f,
                &frame,
                Reason::NotService,
                &format!("ICMPv6 type {t}"),
            );
        }
    }
    // An error quoting what no flow is: an echo, or a later fragment (no ports).
    for quoted in [
        Ipv6Packet::icmp6(NODE6, CLIENT6, (128, 0, 0), &[1; 8]),
        Ipv6Packet {
            raw: Some(vec![7; 16]),
            ..with_exts(tcp_to_vip(), &[LATER])
        },
    ] {
        let e = Ipv6Packet::icmp6(NODE6, CLIENT6, (1, 4, 0), &quote(&quoted));
        expect(
            &mut f,
            &e.build(),
            Reason::NotL4,
            "an error quoting no flow",
        );
    }
}

#[test]
fn fragments_carry_their_flow_in_the_first_only() {
    let Some(mut f) = fixture() else { return };
    for p in [
        Ipv6Packet::udp(CLIENT6, 40000, NODE6, 5353),
        Ipv6Packet::tcp(CLIENT6, 40000, NODE6, 8080),
    ] {
        expect(
            &mut f,
            &with_exts(p.clone(), &[FIRST]).build(),
            Reason::NotService,
            "a first fragment",
        );
        // A later fragment's data is not headers (these zeros would read as a hop-by-hop one).
        let later = Ipv6Packet {
            raw: Some(vec![0; 64]),
            ..with_exts(p, &[Ext::HopByHop(0), LATER])
        };
        // Its datagram's first fragment was translated by no flow: nothing to follow.
        expect(
            &mut f,
            &later.build(),
            Reason::FragUnknown,
            "a later fragment",
        );
    }
    // The fragmentable part may begin with destination options, which a later fragment's
    // header then names: its data (zeros, which would read as more headers) is not walked.
    let later_opts = Ipv6Packet {
        proto: 60,
        raw: Some(vec![0; 64]),
        ..with_exts(Ipv6Packet::udp(CLIENT6, 40000, NODE6, 5353), &[LATER])
    };
    expect(
        &mut f,
        &later_opts.build(),
        Reason::NotL4,
        "a later fragment of options and data",
    );
    let later_icmp = Ipv6Packet {
        raw: Some(vec![0; 64]),
        ..with_exts(Ipv6Packet::icmp6(CLIENT6, NODE6, (2, 0, 0), &[]), &[LATER])
    };
    expect(
        &mut f,
        &later_icmp.build(),
        Reason::NotL4,
        "a later fragment of an ICMPv6 message",
    );
}

/// lb-common's IPv6 pseudo-header seed (what the programs compare a checksum with) against
/// the builder's from-scratch sum: the seed completes to the checksum over the segment alone.
#[test]
fn pseudo_header_seed_matches_an_independent_sum() {
    let addrs = [
        CLIENT6,
        NODE6,
        Ipv6Addr::new(
            0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xfffe,
        ),
        Ipv6Addr::UNSPECIFIED,
        Ipv6Addr::new(
            0x2001, 0xdb8, 0x1234, 0x5678, 0x9abc, 0xdef0, 0x1357, 0x2468,
        ),
    ];
    for s in addrs {
        for d in addrs {
            for (proto, len) in [(6u8, 20usize), (17, 8), (17, 1500), (58, 48), (6, 65535)] {
                let seg = vec![0u8; len];
                let words = |a: Ipv6Addr| {
                    let o = a.octets();
                    std::array::from_fn(|i| {
                        u32::from_ne_bytes(o[4 * i..4 * i + 4].try_into().unwrap())
                    })
                };
                let seed = lb_common::csum::pseudo_seed6(&words(s), &words(d), proto, len as u32);
                // A zero segment sums to 0, so its checksum is the inverted pseudo-header sum
                // (UDP's 0 sent as 0xffff).
                let mut want = !u16::from_be(seed);
                if proto == 17 && want == 0 {
                    want = 0xffff;
                }
                assert_eq!(
                    l4_checksum6(s, d, proto, &seg),
                    want,
                    "{s} -> {d} proto {proto} len {len}"
                );
            }
        }
    }
}

#[test]
fn the_checker_finds_a_wrong_byte_and_a_zero_udp_checksum() {
    let p = with_exts(Ipv6Packet::udp(CLIENT6, 1, NODE6, 2), &[Ext::HopByHop(0)]);
    let good = p.build();
    verify6(&good).unwrap();
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert!(verify6(&bad).is_err());
    let zero = Ipv6Packet {
        l4_csum: Some(0),
        ..p
    }
    .build();
    assert!(
        verify6(&zero).is_err(),
        "UDP's 0 is not 'no checksum' on IPv6"
    );
}
