//! The fuzz tier for IPv6: generated and mutated IPv6 frames, each run through all three
//! programs (XDP, TC ingress, TC egress) under BPF_PROG_TEST_RUN, in two tests.
//!
//! `ipv6_frames_pass_every_program_byte_identical` runs frames of every kind (extension header
//! chains of every kind and length, fragments, TCP/UDP/SCTP, ICMPv6 errors quoting such
//! packets and informational messages, other protocols; then truncated, lying about their
//! lengths, flipped) against the fixture's network, which has no IPv6 service, so what must
//! hold for every frame:
//!
//! 1. It leaves byte-identical with a passing verdict, or the kernel refuses it for its length.
//! 2. Each run counts exactly one outcome, and only one an IPv6 packet may have (`not_service`,
//!    `frag_unknown`, `not_l4`, `ipv6_extension`, `udp6_no_checksum`, `malformed`), checked
//!    per round of packets.
//! 3. No flow or fragment entry is written.
//!
//! `ipv6_frames_for_a_service_translate_only_addresses_ports_and_checksums` runs packets aimed
//! at an IPv6 service against `dual_stack_network` (masquerade `always`), whose `web` has the
//! IPv6 VIP `VIP6`, the IPv6 backends `WEB6` and its ports published on `NODE6`: TCP (any
//! flags), UDP (checksum 0 too) and SCTP to the VIP, the published ports and near misses,
//! behind extension header chains, first and later fragments, resends, backends' replies and
//! forwarded packets of the flows the programs opened, ICMPv6 errors quoting those flows;
//! beside them packets between addresses no service uses and the first test's frames; then
//! the same mutations. Packets come in two classes, as in the IPv4 tier: valid checksums
//! (structural lies included, their checksums fixed up to match) and garbage. What must hold:
//!
//! 1. Each run counts exactly one outcome, the one its verdict implies: `translated`, a drop
//!    reason, or for a pass one an IPv6 packet may have (for a frame that cannot be for a
//!    service, one of the first test's, checked per round); a passed frame leaves
//!    byte-identical.
//! 2. A translated frame keeps its length and changes only addresses, ports (a quoted packet's
//!    too) and checksum fields (`lb_tests::fuzz::rewritable6`). It leaves as the entry of its
//!    flow in `lb_flows6` says (a later fragment's found by its datagram's record in
//!    `lb_frags6`, an ICMPv6 error's by the flow it quotes): a packet to the service towards an
//!    IPv6 backend of `web`, a backend's reply from the service's address. Every checksum that
//!    held still holds, recomputed from scratch (`lb_tests::fuzz::checksums6`), and a UDP
//!    checksum of 0, which IPv6 does not allow, has become a computed one. A UDP first
//!    fragment with checksum 0 (whose sum would cover the whole datagram) is never translated.
//! 3. A frame that cannot be for a service — one that mentions none of `web`'s IPv6 service,
//!    node and backend addresses — leaves byte-identical and writes no flow or fragment entry.
//! 4. No IPv6 packet writes an IPv4 flow or fragment entry.
//!
//! The second test runs on the runner the IPv4 tier runs on (`lb_tests::fuzz::Fuzz`: the
//! rounds, the checks of each run's verdict, outcome counter, bytes and checksums); this file
//! brings the IPv6 tier (`Tier`): its network, its generator, what a pass may count, the
//! roles its entries give (the check of a translation against its entry is the runner's, as
//! for the IPv4 tier).
//!
//! A run of at least `COVERAGE_FROM` packets must have reached every outcome it is for on
//! every program (and, in the second test, translations of every kind of packet, every kind
//! of checksum kept), so that the generator cannot drift into testing one path only.
//! `LB_FUZZ_SEED` repeats a run and `LB_FUZZ_PACKETS` sets how many packets each test runs
//! (100,000 by default), as for the IPv4 tier. Root only.
use std::{collections::BTreeMap, net::Ipv6Addr};

use lb_common::{Addr6, IPPROTO_SCTP as SCTP, IPPROTO_TCP as TCP, IPPROTO_UDP as UDP, Reason};
use lb_tests::{
    fixture::{
        Fixture, NODE6, Prog, TC_ACT_UNSPEC, Tables, VIP6, WEB6, XDP_PASS, dual_stack_network,
        refused_by_test_run,
    },
    fuzz::{
        COVERAGE_FROM, Case, Cases, Class, Frag, Fuzz, Generator, Kind, Memory, ROUND, Rng, Seen,
        Targets, Tier, Tuple, UDP6_ZERO, checksums6, fix_checksums6, foreign_change6, hex, ipv6,
        l4_csum_at6, lengths_hold6, mentions6, packets_from_env, pseudo_seed6, quote_len,
        round_counted, run_tier, seed_from_env, tcp_flags,
    },
    packet::{Ext, Ipv6Packet},
    require_root,
};
use lb_user::core::model::Masquerade;

/// What an IPv6 frame may end as while it is not for a service (`frag_unknown`: a later
/// fragment of a datagram no flow translated; `xdp_deferred`: XDP leaves a checksum it
/// cannot tell full from partial to TC before it looks anything up; `udp6_no_checksum`: a
/// UDP fragment or a datagram whose length fields disagree, with checksum 0).
const IPV6_OUTCOMES: [Reason; 7] = [
    Reason::NotService,
    Reason::Udp6NoChecksum,
    Reason::FragUnknown,
    Reason::XdpDeferred,
    Reason::NotL4,
    Reason::Ipv6Extension,
    Reason::Malformed,
];

/// What else a passed IPv6 frame may have counted where an IPv6 service exists: the outcomes
/// of a packet for a service that opens no flow.
const SERVICE_PASSES: [Reason; 4] = [
    Reason::NoFlowOpener,
    Reason::NodeSocket,
    Reason::NoBackend,
    Reason::SctpFragment,
];

const ADDRS: [Ipv6Addr; 6] = [
    Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x10),
    Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::UNSPECIFIED,
];

/// A mutation of an IPv6 frame. The structural ones change what the headers claim; a
/// valid-checksum case then has its checksums fixed up to match (so only the lie itself is
/// wrong). `Flip` and `Checksum` are garbage by nature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mut6 {
    /// Cut at any length from the Ethernet header's end.
    Truncate,
    /// Payload length set to anything.
    Length,
    /// 1..=4 bytes of the first 160 set to anything.
    Flip,
    /// The IPv6 header's or the first extension header's next header set to another.
    Next,
    /// The version nibble's byte set to anything.
    Version,
    /// Bytes after the datagram (Ethernet padding, as far as IPv6 is concerned).
    Trailer,
    /// A UDP length field set to a lie.
    UdpLength,
    /// The L4 checksum field set to 0, 0xffff, anything or the CHECKSUM_PARTIAL seed.
    Checksum,
}

impl Mut6 {
    /// The no-service test's, in the order it draws them.
    const FIRST: [Mut6; 6] = [
        Mut6::Truncate,
        Mut6::Length,
        Mut6::Flip,
        Mut6::Next,
        Mut6::Version,
        Mut6::Trailer,
    ];
    const STRUCTURAL: [Mut6; 6] = [
        Mut6::Truncate,
        Mut6::Length,
        Mut6::Next,
        Mut6::Version,
        Mut6::Trailer,
        Mut6::UdpLength,
    ];
    const GARBAGE: [Mut6; 2] = [Mut6::Flip, Mut6::Checksum];

    /// Applies the mutation to `frame`, built with extension headers if `exts`; one that does
    /// not fit the frame leaves it as it is.
    fn apply(self, rng: &mut Rng, frame: &mut Vec<u8>, exts: bool) {
        let len = frame.len();
        match self {
            Mut6::Truncate => frame.truncate(rng.range(14, len + 1)),
            Mut6::Length if len >= 20 => {
                let v = rng.u16() >> rng.below(16);
                frame[18..20].copy_from_slice(&v.to_be_bytes());
            }
            Mut6::Flip if len > 15 => {
                for _ in 0..rng.range(1, 5) {
                    let at = rng.range(14, len.min(160));
                    frame[at] = rng.u8();
                }
            }
            Mut6::Next if len > 20 => {
                let at = if rng.percent(50) || !exts { 20 } else { 54 };
                if at < len {
                    frame[at] = rng.pick(&[0, 43, 44, 51, 60, 6, 17, 58, 135]);
                }
            }
            Mut6::Version if len > 14 => frame[14] = rng.u8(),
            Mut6::Trailer => {
                let n = rng.range(1, 30);
                frame.extend(rng.bytes(n));
            }
            Mut6::UdpLength => {
                let Some(l) = ipv6(frame).filter(|l| {
                    l.proto == UDP && !matches!(l.frag, Frag::Later(_)) && l.l4 + 6 <= len
                }) else {
                    return;
                };
                let here = len - l.l4;
                let lie = match rng.below(4) {
                    0 => rng.u16().into(),
                    1 => rng.below(8),
                    2 => here + rng.range(1, 17),
                    _ => here.saturating_sub(rng.range(1, 17)),
                };
                frame[l.l4 + 4..l.l4 + 6].copy_from_slice(&(lie as u16).to_be_bytes());
            }
            Mut6::Checksum => {
                let Some(at) = l4_csum_at6(frame) else { return };
                let value: u32 = match rng.below(4) {
                    0 => 0,
                    1 => u32::MAX,
                    2 if at.len() == 2 => pseudo_seed6(frame).map_or(0, u32::from),
                    _ => rng.u32(),
                };
                let width = at.len();
                frame[at].copy_from_slice(&value.to_be_bytes()[4 - width..]);
            }
            _ => {}
        }
    }
}

/// The no-service test's generator.
struct Gen {
    rng: Rng,
}

impl Gen {
    fn addr(&mut self) -> Ipv6Addr {
        if self.rng.percent(10) {
            Ipv6Addr::from(self.rng.u32() as u128 | (u128::from(self.rng.u32()) << 96))
        } else {
            self.rng.pick(&ADDRS)
        }
    }

    fn ext(&mut self) -> Ext {
        let units = self.rng.below(4) as u8;
        match self.rng.below(8) {
            0 | 1 => Ext::HopByHop(units),
            2 => Ext::Routing(units),
            3 => Ext::DestOpts(units),
            4 => Ext::Ah(self.rng.range(1, 7) as u8),
            5 | 6 => Ext::Fragment {
                offset8: if self.rng.percent(50) {
                    0
                } else {
                    self.rng.u16() >> 3
                },
                more: self.rng.percent(50),
                id: self.rng.u32(),
            },
            _ => {
                let any = self.rng.u8();
                Ext::Other {
                    next_header: self.rng.pick(&[135, 139, 140, 253, 254, any]),
                    units,
                }
            }
        }
    }

    /// A packet as built (honest lengths, valid checksum), before mutations.
    fn packet(&mut self, depth: usize) -> Ipv6Packet {
        let (s, d) = (self.addr(), self.addr());
        let (sport, dport) = (self.rng.u16(), self.rng.pick(&[80, 443, 8080, 5353, 9000]));
        let mut p = match self.rng.below(10) {
            0..=2 => Ipv6Packet::tcp(s, sport, d, dport),
            // IPv6 forbids a UDP checksum of 0; senders of tunnels send it anyway (RFC 6936).
            3 | 4 if self.rng.percent(20) => Ipv6Packet {
                l4_csum: Some(0),
                ..Ipv6Packet::udp(s, sport, d, dport)
            },
            3 | 4 => Ipv6Packet::udp(s, sport, d, dport),
            5 => Ipv6Packet::sctp(s, sport, d, dport),
            6 | 7 if depth == 0 => {
                let quoted = self.packet(1).build();
                let keep = self.rng.range(14, quoted.len() + 1);
                let t = self.rng.range(1, 5) as u8;
                Ipv6Packet::icmp6(s, d, (t, self.rng.u8(), 1280), &quoted[14..keep])
            }
            6..=8 => {
                let any = self.rng.u8();
                let t = self.rng.pick(&[128, 129, 133, 134, 135, 136, 143, any]);
                let len = self.rng.below(40);
                let body = self.rng.bytes(len);
                Ipv6Packet::icmp6(s, d, (t, 0, 0), &body)
            }
            _ => {
                let any = self.rng.u8();
                Ipv6Packet {
                    proto: self.rng.pick(&[50, 59, 47, 4, 41, any]),
                    ..Ipv6Packet::tcp(s, sport, d, dport)
                }
            }
        };
        let len = self.rng.below(64);
        p.payload = self.rng.bytes(len);
        if p.proto == 58 && depth == 0 && p.icmp.0 < 128 {
            // Keep the quote an error was built with.
            p.payload.clear();
        }
        let n = match self.rng.below(10) {
            0..=3 => 0,
            4..=6 => 1,
            7 => 2,
            8 => self.rng.range(3, 5),
            _ => self.rng.range(5, 8),
        };
        p.exts = (0..n).map(|_| self.ext()).collect();
        if p.exts
            .iter()
            .any(|e| matches!(e, Ext::Fragment { offset8, .. } if *offset8 != 0))
        {
            let len = self.rng.range(8, 80);
            p.raw = Some(self.rng.bytes(len));
        }
        p
    }

    /// A frame and what was done to it.
    fn case(&mut self) -> (Vec<u8>, Vec<Mut6>) {
        let p = self.packet(0);
        let mut frame = p.build();
        let mut done = Vec::new();
        if self.rng.percent(40) {
            for _ in 0..self.rng.range(1, 3) {
                let m = Mut6::FIRST[self.rng.below(Mut6::FIRST.len())];
                done.push(m);
                m.apply(&mut self.rng, &mut frame, !p.exts.is_empty());
            }
        }
        (frame, done)
    }
}

#[test]
fn ipv6_frames_pass_every_program_byte_identical() {
    if !require_root("ipv6_frames_pass_every_program_byte_identical") {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    let packets = packets_from_env();
    println!("LB_FUZZ_SEED={seed:#x} LB_FUZZ_PACKETS={packets}");
    let mut f = Fixture::new(Masquerade::Always);
    let mut gen_ = Gen {
        rng: Rng::new(seed ^ 0x6666),
    };
    let empty = Tables::default();
    assert_eq!(f.tables(), empty);
    // By program and reason (`Reason::ALL` order).
    let mut totals: BTreeMap<(Prog, usize), u64> = BTreeMap::new();
    let mut refused = 0usize;
    let mut done = 0;
    while done < packets {
        let n = ROUND.min(packets - done);
        let before = f.dp.reasons().unwrap();
        let mut ran = [0u64; 3];
        for i in 0..n {
            let (frame, mutations) = gen_.case();
            for prog in Prog::ALL {
                let what = || {
                    format!(
                        "packet #{} {mutations:?} on {prog:?} (LB_FUZZ_SEED={seed:#x} \
                         LB_FUZZ_PACKETS={packets}): {}",
                        done + i,
                        hex(&frame)
                    )
                };
                match f.try_run(prog, &frame, None) {
                    Ok((verdict, out)) => {
                        ran[prog as usize] += 1;
                        let passed = match prog {
                            Prog::Xdp => verdict == XDP_PASS,
                            _ => verdict == TC_ACT_UNSPEC,
                        };
                        assert!(passed, "verdict {verdict}: {}", what());
                        assert!(out == frame, "changed: {}", what());
                    }
                    Err(e) => {
                        assert!(refused_by_test_run(prog, &frame), "{e:?}: {}", what());
                        refused += 1;
                    }
                }
            }
        }
        let after = f.dp.reasons().unwrap();
        let round = format!("packets #{done}.., LB_FUZZ_SEED={seed:#x}");
        for (prog, r, n) in round_counted(&before, &after, ran, &IPV6_OUTCOMES, &round) {
            *totals.entry((prog, r as usize)).or_default() += n;
        }
        assert_eq!(
            f.tables(),
            empty,
            "an IPv6 packet wrote a table (packets #{done}..)"
        );
        done += n;
    }
    println!("{packets} IPv6 frames, {refused} runs refused by the kernel for their length");
    for ((prog, r), n) in &totals {
        println!("  {prog:?} {}: {n}", Reason::ALL[*r].1);
    }
    if packets >= COVERAGE_FROM {
        for prog in Prog::ALL {
            for r in IPV6_OUTCOMES {
                // A chance outcome (a checksum that happens to equal its seed), XDP's only.
                if r == Reason::XdpDeferred {
                    continue;
                }
                assert!(
                    totals.get(&(prog, r as usize)).is_some_and(|n| *n > 0),
                    "{prog:?} never ended as {r:?}: the generator misses a path"
                );
            }
        }
    }
}

// The second test: IPv6 packets for an IPv6 service.

const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2);
const CLIENT6B: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 3);
/// A router between the node and the clients, which sends ICMPv6 errors.
const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 0xfe);
/// An address on the node's subnet that is not the node's.
const NOT_LOCAL6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x77);
/// Every IPv6 address that can key a service lookup, a flow entry or a fragment record of
/// the network: its service address, node address and backends. A frame that mentions none
/// of them cannot be for a service however it is parsed.
const SERVICE_SIDE6: [Ipv6Addr; 5] = [VIP6, NODE6, WEB6[0], WEB6[1], WEB6[2]];
/// Where packets for a service go: the VIP, `web`'s published ports on the node's IPv6
/// address per protocol, and near misses: ports the node does not publish over IPv6 (`db`'s,
/// IPv4 only), an address that is not the node's.
const TARGETS6: Targets<Ipv6Addr> = Targets {
    vip: |_| VIP6,
    tcp: &[(NODE6, 8080)],
    udp: &[(NODE6, 5353)],
    sctp: &[(NODE6, 9000), (NODE6, 9100)],
    near_misses: &[(NODE6, 7070), (NODE6, 9999), (NOT_LOCAL6, 8080)],
    clients: &[CLIENT6, CLIENT6, CLIENT6B, WEB6[0]],
};
/// How a case is made of the frame the generator built: IPv6's mutations; TC runs without a
/// context.
const CASES6: Cases<Mut6> = Cases {
    rounds: &[0, 0, 0, 0, 0, 1, 1, 1, 2, 3],
    structural: &Mut6::STRUCTURAL,
    garbage: &Mut6::GARBAGE,
    fix: fix_checksums6,
    ingress: |_| None,
    untouchable: |frame| !mentions6(frame, &SERVICE_SIDE6),
};

/// The service test's generator: a seeded PRNG, the no-service test's generator for its
/// frames, and what it learnt from the programs' translations (tuples to reply to, forward
/// and quote; first fragments to follow).
struct SvcGen {
    rng: Rng,
    wild: Gen,
    memory: Memory<Ipv6Addr, Ipv6Packet>,
}

impl SvcGen {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let wild = Gen {
            rng: Rng::new(rng.next_u64()),
        };
        SvcGen {
            rng,
            wild,
            memory: Memory::default(),
        }
    }

    /// A packet as its kind builds it, before mutations.
    fn base(&mut self) -> (Kind, Ipv6Packet) {
        let roll = self.rng.below(100);
        let proto = self.rng.pick(&[TCP, TCP, UDP, UDP, SCTP]);
        let seen = self.memory.recall(&mut self.rng);
        match (roll, seen) {
            (0..=19, _) | (33..=54, None) => (Kind::ToService, self.service_packet(proto)),
            (20..=26, _) => (Kind::FirstFragment, self.first_fragment(seen, proto)),
            (27..=32, _) => (Kind::LaterFragment, self.later_fragment(proto)),
            (33..=54, Some(s)) => {
                let kind = match roll {
                    33..=39 => Kind::Resend,
                    40..=48 => Kind::Reply,
                    _ => Kind::Forwarded,
                };
                (kind, self.dressed(s.follow_up(kind), s.proto))
            }
            (55..=66, _) => (Kind::IcmpQuote, self.icmp_quote(seen, proto)),
            (67..=86, _) => (Kind::NonService, self.non_service(proto)),
            _ => (Kind::Wild, self.wild.packet(0)),
        }
    }

    /// Extension headers of a packet that may be for a service: mostly none or a few the
    /// parser walks (an atomic fragment among them), now and then more than it walks, one it
    /// does not skip, or one reaching past what it parses (`ipv6_extension`).
    fn chain(&mut self) -> Vec<Ext> {
        let rng = &mut self.rng;
        let walked = |rng: &mut Rng| {
            let units = rng.below(3) as u8;
            match rng.below(4) {
                0 => Ext::HopByHop(units),
                1 => Ext::Routing(units),
                2 => Ext::DestOpts(units),
                _ => Ext::Ah(rng.range(1, 4) as u8),
            }
        };
        let n = rng.pick(&[0, 0, 0, 0, 0, 0, 1, 1, 2, 3]);
        let mut exts: Vec<Ext> = (0..n).map(|_| walked(rng)).collect();
        match rng.below(40) {
            0 => {
                for _ in 0..rng.range(4, 7) {
                    exts.push(walked(rng));
                }
            }
            1 => exts.push(Ext::Other {
                next_header: rng.pick(&[135, 139, 140, 253, 254]),
                units: 0,
            }),
            2 => exts.push(Ext::DestOpts(rng.range(24, 32) as u8)),
            3 | 4 => {
                let at = rng.below(exts.len() + 1);
                let id = rng.u32();
                exts.insert(
                    at,
                    Ext::Fragment {
                        offset8: 0,
                        more: false,
                        id,
                    },
                );
            }
            _ => {}
        }
        exts
    }

    /// A first fragment: of a client's datagram to the service, or of a packet of a flow a
    /// program translated (a backend's reply, a forwarded packet). Remembered for later
    /// fragments to follow.
    fn first_fragment(&mut self, seen: Option<Seen<Ipv6Addr>>, proto: u8) -> Ipv6Packet {
        let mut p = match seen {
            Some(s) if self.rng.percent(30) => {
                let t = if self.rng.percent(70) {
                    s.after.reversed()
                } else {
                    s.after
                };
                self.dressed(t, s.proto)
            }
            _ => self.service_packet(proto),
        };
        let rng = &mut self.rng;
        let id = if rng.percent(50) {
            rng.below(64) as u32
        } else {
            rng.u32()
        };
        let at = rng.below(p.exts.len() + 1);
        p.exts.insert(
            at,
            Ext::Fragment {
                offset8: 0,
                more: true,
                id,
            },
        );
        let words = rng.range(1, 6);
        p.payload = rng.bytes(8 * words);
        self.memory.first(p.clone());
        p
    }

    /// A later fragment of a first one generated before (its addresses, protocol, the headers
    /// before its fragment header and its identification), or of a datagram never seen.
    fn later_fragment(&mut self, proto: u8) -> Ipv6Packet {
        let mut p = match self.memory.recall_first(&mut self.rng) {
            Some(first) => first,
            None => {
                let mut p = self.service_packet(proto);
                let id = self.rng.u32();
                p.exts.push(Ext::Fragment {
                    offset8: 0,
                    more: true,
                    id,
                });
                p
            }
        };
        let at = (p.exts.iter())
            .position(|e| matches!(e, Ext::Fragment { more: true, .. }))
            .expect("a first fragment's fragment header");
        let Ext::Fragment { id, .. } = p.exts[at] else {
            unreachable!()
        };
        let rng = &mut self.rng;
        p.exts.truncate(at);
        p.exts.push(Ext::Fragment {
            offset8: rng.range(1, 200) as u16,
            more: rng.percent(50),
            id,
        });
        let n = rng.range(1, 49);
        p.raw = Some(rng.bytes(n));
        p
    }

    /// An ICMPv6 message (mostly an error) quoting a tuple a program translated (as it was
    /// before or after, either way) or a fresh one, from a router, the quoted destination or
    /// the node.
    fn icmp_quote(&mut self, seen: Option<Seen<Ipv6Addr>>, proto: u8) -> Ipv6Packet {
        let (quoted, mut q) = self.quoted(seen, proto);
        let rng = &mut self.rng;
        if rng.percent(10) {
            let id = rng.u32();
            q.exts.push(Ext::Fragment {
                offset8: 0,
                more: true,
                id,
            });
        }
        let frame = q.build();
        let ip = &frame[14..];
        let l4 = q.l4_offset() - 14;
        let len = quote_len(rng, l4, ip.len());
        let any = (rng.u8(), rng.u8(), rng.u32());
        let icmp = rng.pick(&[
            (1, 4, 0),
            (1, 0, 0),
            (2, 0, 1280),
            (2, 0, 1400),
            (3, 0, 0),
            (4, 0, 40),
            (128, 0, 0x1234_0001),
            (129, 0, 0x1234_0001),
            any,
        ]);
        let (src, dst) = quoted.error_ends(rng, ROUTER6, NODE6, CLIENT6);
        let mut p = Ipv6Packet::icmp6(src, dst, icmp, &ip[..len]);
        if rng.percent(10) {
            p.exts = vec![Ext::HopByHop(0)];
        }
        p
    }

    /// An address no service uses (the unspecified address among them).
    fn outsider(&mut self) -> Ipv6Addr {
        let rng = &mut self.rng;
        match rng.below(6) {
            0 => Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, rng.u16(), rng.u16()),
            1 => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, rng.u16(), rng.u16()),
            2 => Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, rng.u16()),
            3 => Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
            4 => Ipv6Addr::UNSPECIFIED,
            _ => Ipv6Addr::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())),
        }
    }

    fn non_service(&mut self, proto: u8) -> Ipv6Packet {
        let (saddr, daddr) = (self.outsider(), self.outsider());
        let dports = [8080, 5353, 9000, 9100, 443, 53];
        let t = Tuple::between(&mut self.rng, saddr, daddr, &dports);
        let mut p = self.dressed(t, proto);
        let rng = &mut self.rng;
        match rng.below(10) {
            0..=5 => p,
            6 => {
                let n = rng.below(57);
                let body = rng.bytes(n);
                let t = rng.pick(&[128, 129, 133, 134, 135, 136, 143]);
                Ipv6Packet::icmp6(saddr, daddr, (t, 0, 0), &body)
            }
            7 => {
                let quoted = p.build();
                let len = (p.l4_offset() + 8).min(quoted.len());
                Ipv6Packet::icmp6(daddr, saddr, (1, 4, 0), &quoted[14..len])
            }
            8 => {
                let (offset8, more, id) = (rng.range(1, 200) as u16, rng.percent(50), rng.u32());
                p.exts.push(Ext::Fragment { offset8, more, id });
                let n = rng.range(1, 49);
                p.raw = Some(rng.bytes(n));
                p
            }
            _ => {
                let any = rng.u8();
                p.proto = rng.pick(&[50, 59, 47, 4, 41, any]);
                p
            }
        }
    }
}

impl Generator for SvcGen {
    type Ip = Ipv6Addr;
    type Packet = Ipv6Packet;
    const TARGETS: Targets<Ipv6Addr> = TARGETS6;

    fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    fn packet(t: Tuple<Ipv6Addr>, proto: u8) -> Ipv6Packet {
        t.packet(proto)
    }

    fn tuple_of(p: &Ipv6Packet) -> Tuple<Ipv6Addr> {
        Tuple::new(p.saddr, p.sport, p.daddr, p.dport)
    }

    /// Random flags, payload, hop limit, extension headers; a UDP checksum of 0 and an SCTP
    /// CRC of 0 (offloaded) now and then.
    fn dress(&mut self, p: &mut Ipv6Packet) {
        let rng = &mut self.rng;
        p.tcp_flags = tcp_flags(rng);
        // Now and then a payload of more than one 512-byte chunk of the programs' UDP sum,
        // or past one page: an XDP run then gets a multi-buffer frame (the program is
        // frags-aware), an skb run refuses it past `SKB_RUN_MAX`.
        let n = match rng.below(100) {
            0 => rng.range(1400, 4000),
            1 | 2 => rng.range(500, 1100),
            _ => rng.below(41),
        };
        p.payload = rng.bytes(n);
        p.hop_limit = rng.range(1, 256) as u8;
        p.exts = self.chain();
        let zero = match p.proto {
            UDP => self.rng.percent(15),
            SCTP => self.rng.percent(5),
            _ => false,
        };
        if zero {
            p.l4_csum = Some(0);
        }
    }
}

const SERVICE_TEST: &str = "ipv6_frames_for_a_service_translate_only_addresses_ports_and_checksums";

impl Tier for SvcGen {
    type Addr = Addr6;
    type Mutation = Mut6;
    const TARGET: &'static str = "fuzz6";
    const SHARE: usize = 1;
    const NOT_FOR_A_SERVICE: &'static [Reason] = &IPV6_OUTCOMES;
    const KEPT: &'static [&'static str] = &["TCP", "UDP", UDP6_ZERO, "SCTP CRC32c", "ICMPv6"];
    const BACKENDS: &'static [Ipv6Addr] = &WEB6;
    const REPLY_FROM: &'static [Ipv6Addr] = &[VIP6, NODE6];
    const MASQ: Ipv6Addr = NODE6;

    fn case(&mut self, index: usize) -> Case<Mut6> {
        let (kind, p) = self.base();
        let exts = !p.exts.is_empty();
        CASES6.case(&mut self.rng, index, kind, p.build(), |m, rng, frame| {
            m.apply(rng, frame, exts)
        })
    }

    fn memory(&mut self) -> &mut Memory<Ipv6Addr, Ipv6Packet> {
        &mut self.memory
    }

    fn foreign_change(input: &[u8], output: &[u8]) -> Option<usize> {
        foreign_change6(input, output)
    }

    fn checksums(frame: &[u8]) -> Vec<(&'static str, bool)> {
        checksums6(frame)
    }

    /// IPv6 has no UDP checksum 0: a translation computes one, which must hold.
    fn kept_as(name: &'static str) -> &'static str {
        if name == UDP6_ZERO { "UDP" } else { name }
    }

    fn lengths_hold(frame: &[u8]) -> bool {
        lengths_hold6(frame)
    }

    /// What an IPv6 packet may end as while not for a service (`xdp_deferred` on XDP only,
    /// which defers to TC), and the outcomes of a packet for a service that opens no flow.
    fn pass_fits(prog: Prog, r: Reason) -> bool {
        (IPV6_OUTCOMES.contains(&r) || SERVICE_PASSES.contains(&r))
            && (r != Reason::XdpDeferred || prog == Prog::Xdp)
    }

    fn passes() -> String {
        format!("one of {IPV6_OUTCOMES:?} (xdp_deferred on XDP only) or {SERVICE_PASSES:?}")
    }

    /// Invariant 2's own part: no UDP first fragment with checksum 0 (the runner then checks
    /// the translation against its entry).
    fn translated(fuzz: &mut Fuzz<Self>, case: &Case<Mut6>, prog: Prog, out: &[u8]) {
        let input = &case.frame;
        let Some(l) = ipv6(input) else { return };
        if l.proto == UDP
            && matches!(l.frag, Frag::First(_))
            && input.get(l.l4 + 6..l.l4 + 8) == Some(&[0, 0])
        {
            let what = "translated a UDP first fragment with checksum 0, which cannot be given one";
            fuzz.fail(case, prog, Some(out), what);
        }
    }

    /// Invariant 4, per round.
    fn round_done(fuzz: &mut Fuzz<Self>, first: usize) {
        assert_eq!(
            fuzz.f.tables(),
            Tables::default(),
            "an IPv6 packet wrote an IPv4 flow or fragment entry (packets #{first}.., \
             LB_FUZZ_SEED={:#x})",
            fuzz.seed
        );
    }

    /// Every program counted every outcome an IPv6 packet reaches on it; the ingress programs
    /// translated packets to the service, later fragments, ICMPv6 errors and replies to
    /// masquerade ports; egress translated backends' replies (later fragments among them),
    /// forwarded packets (masqueraded) and ICMPv6 errors.
    fn assert_coverage(fuzz: &Fuzz<Self>) {
        for prog in Prog::ALL {
            for r in [
                Reason::Translated,
                Reason::NotService,
                Reason::FragUnknown,
                Reason::Udp6NoChecksum,
                Reason::Malformed,
                Reason::Ipv6Extension,
                Reason::NotL4,
            ] {
                fuzz.assert_counted(prog, r);
            }
            let kinds: &[Kind] = if prog == Prog::TcEgress {
                &[
                    Kind::Reply,
                    Kind::Forwarded,
                    Kind::LaterFragment,
                    Kind::IcmpQuote,
                ]
            } else {
                &[
                    Kind::ToService,
                    Kind::Reply,
                    Kind::LaterFragment,
                    Kind::IcmpQuote,
                ]
            };
            for kind in kinds {
                fuzz.assert_translated(&[prog], *kind);
            }
        }
    }
}

#[test]
fn ipv6_frames_for_a_service_translate_only_addresses_ports_and_checksums() {
    run_tier(
        SERVICE_TEST,
        0x0006_5e41_ce00,
        dual_stack_network(Masquerade::Always),
        SvcGen::new,
    );
}

/// A seed names one sequence of packets (what makes a failure repeatable); the valid class is
/// what it promises, every checksum a receiver can check holding; and packets that cannot be
/// for a service are a sizeable share.
#[test]
fn service_generator_is_a_function_of_the_seed_and_keeps_its_classes() {
    let frames = |seed| {
        let mut g = SvcGen::new(seed);
        (0..3000).map(|i| g.case(i)).collect::<Vec<_>>()
    };
    let cases = frames(42);
    let bytes = |cases: &[Case<Mut6>]| cases.iter().map(|c| c.frame.clone()).collect::<Vec<_>>();
    assert_eq!(bytes(&cases), bytes(&frames(42)));
    assert_ne!(bytes(&cases), bytes(&frames(43)));
    for c in cases.iter().filter(|c| c.class != Class::Garbage) {
        let sums = checksums6(&c.frame);
        assert!(sums.iter().all(|(_, ok)| *ok), "{sums:?}: {c:?}");
    }
    let untouchable = cases.iter().filter(|c| c.untouchable).count();
    assert!(
        (500..1500).contains(&untouchable),
        "{untouchable} of 3000 cannot be for a service"
    );
}
