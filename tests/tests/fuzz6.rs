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
//! A run of at least `COVERAGE_FROM` packets must have reached every outcome it is for on
//! every program (and, in the second test, translations of every kind of packet, every kind
//! of checksum kept), so that the generator cannot drift into testing one path only.
//! `LB_FUZZ_SEED` repeats a run and `LB_FUZZ_PACKETS` sets how many packets each test runs
//! (100,000 by default), as for the IPv4 tier. Root only.
use std::{
    collections::{BTreeMap, VecDeque},
    net::Ipv6Addr,
    time::Instant,
};

use aya::programs::ProgramError;
use lb_common::{FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, Flow6, FlowKey6, FragKey6, Reason};
use lb_tests::{
    fixture::{
        Fixture, NODE6, Outcome, Outcomes, Prog, Run, TC_ACT_UNSPEC, Tables, Tables6, VIP6, WEB6,
        XDP_PASS, dual_stack_network, refused_by_test_run,
    },
    fuzz::{
        Frag6, Ipv6Layout, Rng, UDP6_ZERO, addr6_at, checksums6, count_from_env, fix_checksums6,
        foreign_change6, hex, ipv6, l4_csum_at6, lengths_hold6, mentions6, pseudo_seed6,
        seed_from_env,
    },
    packet::{Ext, Ipv6Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN},
    require_root,
};
use lb_user::{
    core::model::Masquerade,
    dataplane::ebpf::{be6, ip6},
};

const DEFAULT_PACKETS: usize = 100_000;
/// Packets generated at once. The second test runs a round's packets that may be for a
/// service first, then those that cannot be, with the tables read before and after them (a
/// read costs a few µs per entry: per packet it would cost more than the packet).
const ROUND: usize = 500;
const COVERAGE_FROM: usize = 20_000;

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

/// What a passed IPv6 frame may have counted where an IPv6 service exists: those, and the
/// outcomes of a packet for a service that opens no flow.
const IPV6_PASSES: [Reason; 11] = [
    Reason::NotService,
    Reason::Udp6NoChecksum,
    Reason::FragUnknown,
    Reason::XdpDeferred,
    Reason::NotL4,
    Reason::Ipv6Extension,
    Reason::Malformed,
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
                    l.proto == UDP && !matches!(l.frag, Frag6::Later(_)) && l.l4 + 6 <= len
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

/// The outcomes each program counted between two reads of `EbpfNetwork::reasons`, checked
/// against what a round of runs may count: one outcome per run that ran (`ran`, by program)
/// and only outcomes of `allowed` (nothing else either: no event of a new flow). Returns them.
fn round_counted(
    before: &[(&str, Reason, u64)],
    after: &[(&str, Reason, u64)],
    ran: [u64; 3],
    allowed: &[Reason],
    round: &str,
) -> Vec<(Prog, Reason, u64)> {
    let mut all = Vec::new();
    for prog in Prog::ALL {
        let moved: Vec<(Reason, u64)> = (before.iter().zip(after))
            .filter(|((hook, ..), _)| *hook == prog.hook())
            .map(|((_, r, b), (_, _, a))| (*r, a - b))
            .filter(|(_, d)| *d > 0)
            .collect();
        let total: u64 = moved.iter().map(|(_, d)| d).sum();
        assert!(
            total == ran[prog as usize] && moved.iter().all(|(r, _)| allowed.contains(r)),
            "{prog:?}: {} runs counted {moved:?}; one outcome per run, and only {allowed:?}, \
             fit ({round})",
            ran[prog as usize],
        );
        all.extend(moved.into_iter().map(|(r, d)| (prog, r, d)));
    }
    all
}

#[test]
fn ipv6_frames_pass_every_program_byte_identical() {
    if !require_root("ipv6_frames_pass_every_program_byte_identical") {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    let packets = count_from_env("LB_FUZZ_PACKETS", DEFAULT_PACKETS);
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
/// Clients, a backend among them (reaching its own service: a hairpin).
const CLIENTS6: [Ipv6Addr; 4] = [CLIENT6, CLIENT6, CLIENT6B, WEB6[0]];
/// `web`'s published ports on the node's IPv6 address, per protocol.
const TCP_PUBLISHED6: [(Ipv6Addr, u16); 1] = [(NODE6, 8080)];
const UDP_PUBLISHED6: [(Ipv6Addr, u16); 1] = [(NODE6, 5353)];
const SCTP_PUBLISHED6: [(Ipv6Addr, u16); 2] = [(NODE6, 9000), (NODE6, 9100)];
/// Ports the node does not publish over IPv6 (`db`'s, IPv4 only), and an address that is
/// not the node's.
const NEAR_MISSES6: [(Ipv6Addr, u16); 3] = [(NODE6, 7070), (NODE6, 9999), (NOT_LOCAL6, 8080)];
const PORTS: [u16; 8] = [443, 80, 53, 8080, 5353, 9000, 9100, 7070];
const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;
/// Flow entries beyond which the tables are emptied between rounds, keeping reads cheap.
const TABLE_CAP: usize = 800;

/// How a case was generated (for the summary and for reproducing a failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// TCP (any flags), UDP or SCTP from a client to the VIP, a published port or a near miss.
    ToService,
    /// The first fragment (offset 0, more to come) of such a datagram, or of a reply or a
    /// forwarded packet of a flow a program translated.
    FirstFragment,
    /// A later fragment of one of those, or of a datagram never seen.
    LaterFragment,
    /// A packet of a flow a program translated before, sent again with other flags.
    Resend,
    /// The reverse of what a program made of a packet: a backend's reply, a reply to a
    /// masquerade port.
    Reply,
    /// What a program made of a packet, sent on (the translated packet on egress).
    Forwarded,
    /// An ICMPv6 message quoting a tracked tuple (or a fresh one), from a router or an
    /// endpoint.
    IcmpQuote,
    /// TCP, UDP, SCTP, ICMPv6, fragments and other protocols between addresses no service
    /// uses.
    NonService,
    /// The no-service test's frames.
    Wild,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// As built: valid checksums, honest headers.
    Clean,
    /// Structural mutations, checksums fixed up to match what the headers claim.
    ValidMutated,
    /// Checksums as they fell, or garbage on purpose.
    Garbage,
}

/// One generated packet and how to run it.
#[derive(Clone, Debug)]
struct Case {
    index: usize,
    kind: Kind,
    class: Class,
    mutations: Vec<Mut6>,
    frame: Vec<u8>,
    /// The order the three programs see it in.
    order: [Prog; 3],
    /// Mentions no service-side address: must pass untouched everywhere.
    untouchable: bool,
}

/// An address and port pair each way, as in a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tuple6 {
    saddr: Ipv6Addr,
    sport: u16,
    daddr: Ipv6Addr,
    dport: u16,
}

impl Tuple6 {
    /// The addresses of the IPv6 header at frame offset `ip` and the ports at `l4` (none, 0:
    /// a later fragment).
    fn at(frame: &[u8], ip: usize, l4: Option<usize>) -> Self {
        let port = |at: usize| u16::from_be_bytes([frame[at], frame[at + 1]]);
        Tuple6 {
            saddr: addr6_at(frame, ip + 8),
            daddr: addr6_at(frame, ip + 24),
            sport: l4.map_or(0, port),
            dport: l4.map_or(0, |l4| port(l4 + 2)),
        }
    }

    /// What an entry rewrites a packet to.
    fn of_entry(e: &Flow6) -> Self {
        Tuple6 {
            saddr: ip6(e.saddr),
            daddr: ip6(e.daddr),
            sport: u16::from_be(e.sport),
            dport: u16::from_be(e.dport),
        }
    }

    fn reversed(self) -> Self {
        Tuple6 {
            saddr: self.daddr,
            sport: self.dport,
            daddr: self.saddr,
            dport: self.sport,
        }
    }

    fn packet(self, proto: u8) -> Ipv6Packet {
        let p = Ipv6Packet::tcp(self.saddr, self.sport, self.daddr, self.dport);
        Ipv6Packet { proto, ..p }
    }

    /// The flow key of a packet of `proto` with this tuple.
    fn key(self, proto: u8) -> FlowKey6 {
        FlowKey6 {
            saddr: be6(self.saddr),
            daddr: be6(self.daddr),
            sport: self.sport.to_be(),
            dport: self.dport.to_be(),
            proto,
            _pad: [0; 3],
        }
    }

    /// The record key of the datagram `id` of `proto` with this tuple's addresses.
    fn frag_key(self, proto: u8, id: u32) -> FragKey6 {
        FragKey6 {
            saddr: be6(self.saddr),
            daddr: be6(self.daddr),
            id,
            proto,
            _pad: [0; 3],
        }
    }
}

/// A translation a program made: the tuple before and after.
#[derive(Clone, Copy, Debug)]
struct Seen6 {
    proto: u8,
    before: Tuple6,
    after: Tuple6,
}

/// The service test's generator: a seeded PRNG, the no-service test's generator for its
/// frames, and what it learnt from the programs' translations (tuples to reply to, forward
/// and quote; first fragments to follow).
struct SvcGen {
    rng: Rng,
    wild: Gen,
    seen: VecDeque<Seen6>,
    firsts: VecDeque<Ipv6Packet>,
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
            seen: VecDeque::new(),
            firsts: VecDeque::new(),
        }
    }

    /// Forgets what the tables forgot.
    fn forget(&mut self) {
        self.seen.clear();
        self.firsts.clear();
    }

    fn observe(&mut self, proto: u8, before: Tuple6, after: Tuple6) {
        if self.seen.len() == 64 {
            self.seen.pop_front();
        }
        self.seen.push_back(Seen6 {
            proto,
            before,
            after,
        });
    }

    fn case(&mut self, index: usize) -> Case {
        let (kind, p) = self.base();
        let mut frame = p.build();
        let rng = &mut self.rng;
        let valid = rng.percent(55);
        let mut mutations = Vec::new();
        for _ in 0..rng.pick(&[0, 0, 0, 0, 0, 1, 1, 1, 2, 3]) {
            let m = rng.pick(&Mut6::STRUCTURAL);
            m.apply(rng, &mut frame, !p.exts.is_empty());
            mutations.push(m);
        }
        if valid {
            fix_checksums6(&mut frame);
        } else if rng.percent(60) {
            let m = rng.pick(&Mut6::GARBAGE);
            m.apply(rng, &mut frame, !p.exts.is_empty());
            mutations.push(m);
        }
        let class = match (valid, mutations.is_empty()) {
            (false, _) => Class::Garbage,
            (true, true) => Class::Clean,
            (true, false) => Class::ValidMutated,
        };
        let mut order = Prog::ALL;
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        Case {
            index,
            kind,
            class,
            mutations,
            untouchable: !mentions6(&frame, &SERVICE_SIDE6),
            frame,
            order,
        }
    }

    /// A packet as its kind builds it, before mutations.
    fn base(&mut self) -> (Kind, Ipv6Packet) {
        let roll = self.rng.below(100);
        let proto = self.rng.pick(&[TCP, TCP, UDP, UDP, SCTP]);
        let seen = (!self.seen.is_empty()).then(|| {
            let i = self.rng.below(self.seen.len());
            self.seen[i]
        });
        match (roll, seen) {
            (0..=19, _) | (33..=54, None) => (Kind::ToService, self.service_packet(proto)),
            (20..=26, _) => (Kind::FirstFragment, self.first_fragment(seen, proto)),
            (27..=32, _) => (Kind::LaterFragment, self.later_fragment(proto)),
            (33..=54, Some(s)) => {
                let (kind, t) = match roll {
                    33..=39 => (Kind::Resend, s.before),
                    40..=48 => (Kind::Reply, s.after.reversed()),
                    _ => (Kind::Forwarded, s.after),
                };
                let mut p = t.packet(s.proto);
                self.dress(&mut p);
                (kind, p)
            }
            (55..=66, _) => (Kind::IcmpQuote, self.icmp_quote(seen, proto)),
            (67..=86, _) => (Kind::NonService, self.non_service(proto)),
            _ => (Kind::Wild, self.wild.packet(0)),
        }
    }

    fn service_packet(&mut self, proto: u8) -> Ipv6Packet {
        let rng = &mut self.rng;
        let (daddr, dport) = match rng.below(10) {
            0..=3 => (
                VIP6,
                if rng.percent(80) {
                    rng.pick(&PORTS)
                } else {
                    rng.u16()
                },
            ),
            4..=7 => match proto {
                TCP => rng.pick(&TCP_PUBLISHED6),
                UDP => rng.pick(&UDP_PUBLISHED6),
                _ => rng.pick(&SCTP_PUBLISHED6),
            },
            _ => rng.pick(&NEAR_MISSES6),
        };
        let saddr = rng.pick(&CLIENTS6);
        // Few client ports, so that flows are met again: resent, reopened, clashing.
        let sport = if rng.percent(90) {
            40000 + rng.below(16) as u16
        } else {
            rng.u16()
        };
        let mut p = Tuple6 {
            saddr,
            sport,
            daddr,
            dport,
        }
        .packet(proto);
        self.dress(&mut p);
        p
    }

    /// Random flags, payload, hop limit, extension headers; a UDP checksum of 0 and an SCTP
    /// CRC of 0 (offloaded) now and then.
    fn dress(&mut self, p: &mut Ipv6Packet) {
        let rng = &mut self.rng;
        let any = rng.u8();
        p.tcp_flags = rng.pick(&[
            TCP_SYN,
            TCP_SYN,
            TCP_SYN,
            TCP_ACK,
            TCP_ACK | TCP_PSH,
            TCP_SYN | TCP_ACK,
            TCP_FIN | TCP_ACK,
            TCP_RST,
            TCP_RST | TCP_ACK,
            any,
        ]);
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
    fn first_fragment(&mut self, seen: Option<Seen6>, proto: u8) -> Ipv6Packet {
        let mut p = match seen {
            Some(s) if self.rng.percent(30) => {
                let t = if self.rng.percent(70) {
                    s.after.reversed()
                } else {
                    s.after
                };
                let mut p = t.packet(s.proto);
                self.dress(&mut p);
                p
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
        if self.firsts.len() == 32 {
            self.firsts.pop_front();
        }
        self.firsts.push_back(p.clone());
        p
    }

    /// A later fragment of a first one generated before (its addresses, protocol, the headers
    /// before its fragment header and its identification), or of a datagram never seen.
    fn later_fragment(&mut self, proto: u8) -> Ipv6Packet {
        let mut p = if !self.firsts.is_empty() && self.rng.percent(85) {
            let i = self.rng.below(self.firsts.len());
            self.firsts[i].clone()
        } else {
            let mut p = self.service_packet(proto);
            let id = self.rng.u32();
            p.exts.push(Ext::Fragment {
                offset8: 0,
                more: true,
                id,
            });
            p
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
    fn icmp_quote(&mut self, seen: Option<Seen6>, proto: u8) -> Ipv6Packet {
        let (quoted, proto) = match seen {
            Some(s) if self.rng.percent(85) => {
                let t = match self.rng.below(4) {
                    0 => s.before,
                    1 => s.after,
                    2 => s.before.reversed(),
                    _ => s.after.reversed(),
                };
                (t, s.proto)
            }
            _ => {
                let p = self.service_packet(proto);
                let t = Tuple6::at(&p.build(), 14, Some(p.l4_offset()));
                (
                    if self.rng.percent(50) {
                        t
                    } else {
                        t.reversed()
                    },
                    proto,
                )
            }
        };
        let mut q = quoted.packet(proto);
        self.dress(&mut q);
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
        let len = match rng.below(10) {
            0..=5 => l4 + 8,
            6 | 7 => ip.len(),
            8 => l4 + 4,
            _ => rng.below(ip.len() + 1),
        }
        .min(ip.len());
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
        let src = rng.pick(&[ROUTER6, ROUTER6, quoted.daddr, NODE6]);
        let dst = rng.pick(&[quoted.saddr, quoted.saddr, NODE6, CLIENT6]);
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
        let any = self.rng.u16();
        let t = Tuple6 {
            saddr,
            sport: self.rng.pick(&[any, 40000, 443]),
            daddr,
            dport: self.rng.pick(&[any, 8080, 5353, 9000, 9100, 443, 53]),
        };
        let mut p = t.packet(proto);
        self.dress(&mut p);
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

/// Whether a run of `prog` on `input` that ended as `o` may have counted `r`. A drop is for
/// a flow that gets no unique tuple (`nat_failed`, and `masq_failed` on egress), or a
/// rewrite that failed half-way (`malformed`, after the parser accepted the packet: its
/// lengths then hold).
fn reason_fits(prog: Prog, input: &[u8], o: Outcome, r: Reason) -> bool {
    match o {
        Outcome::Translated => r == Reason::Translated,
        Outcome::Dropped => match r {
            Reason::NatFailed => true,
            Reason::MasqFailed => prog == Prog::TcEgress,
            Reason::Malformed => lengths_hold6(input),
            _ => false,
        },
        Outcome::Passed => {
            IPV6_PASSES.contains(&r) && (r != Reason::XdpDeferred || prog == Prog::Xdp)
        }
        Outcome::Refused => false,
    }
}

#[derive(Default)]
struct ProgStats {
    runs: usize,
    refused: usize,
    passed: usize,
    translated: usize,
    dropped: usize,
    /// Translations whose input had checksums that held, all re-checked on the output.
    sums_kept: usize,
}

#[derive(Default)]
struct Stats {
    packets: BTreeMap<(Kind, Class), usize>,
    mutations: BTreeMap<Mut6, usize>,
    untouchable: usize,
    progs: [ProgStats; 3],
    /// Translations per program and kind of packet.
    translated: BTreeMap<(Prog, Kind), usize>,
    /// Checksums that held in a translated packet and were re-checked on its output, by name.
    kept: BTreeMap<&'static str, usize>,
    flushes: usize,
}

/// One run of the service test: the fixture, the generator and the counts.
struct Fuzz6 {
    seed: u64,
    packets: usize,
    f: Fixture,
    generator: SvcGen,
    handoff: u32,
    outcomes: Outcomes,
    stats: Stats,
}

const SERVICE_TEST: &str = "ipv6_frames_for_a_service_translate_only_addresses_ports_and_checksums";

impl Fuzz6 {
    fn new(seed: u64, packets: usize) -> Self {
        let mut rng = Rng::new(seed ^ 0x0006_5e41_ce00);
        let hash_key = rng.u32() | 1;
        let mut f = Fixture::with_network(dual_stack_network(Masquerade::Always), Some(hash_key));
        let handoff = f.handoff();
        let outcomes = Outcomes::new(&mut f);
        Fuzz6 {
            seed,
            packets,
            f,
            generator: SvcGen::new(rng.next_u64()),
            handoff,
            outcomes,
            stats: Stats::default(),
        }
    }

    /// Panics with everything needed to repeat the failure.
    fn fail(&self, case: &Case, prog: Prog, out: Option<&[u8]>, what: &str) -> ! {
        panic!(
            "{what}\n  packet #{} ({:?}, {:?}, mutations {:?}) through {prog:?} (order {:?})\n  \
             in:  {}\n  out: {}\n  repeat with LB_FUZZ_SEED={:#x} LB_FUZZ_PACKETS={} cargo test \
             -p lb-tests --test fuzz6 {SERVICE_TEST} (the same packets, in the same order)",
            case.index,
            case.kind,
            case.class,
            case.mutations,
            case.order,
            hex(&case.frame),
            out.map_or("-".into(), hex),
            self.seed,
            self.packets,
        )
    }

    fn run(&mut self) {
        let started = Instant::now();
        let mut index = 0;
        let mut flows = 0;
        while index < self.packets {
            if flows > TABLE_CAP {
                self.f.restore6(&Tables6::default());
                self.generator.forget();
                self.stats.flushes += 1;
            }
            let n = ROUND.min(self.packets - index);
            let cases: Vec<Case> = (index..index + n).map(|i| self.generator.case(i)).collect();
            for c in &cases {
                *self.stats.packets.entry((c.kind, c.class)).or_default() += 1;
                for m in &c.mutations {
                    *self.stats.mutations.entry(*m).or_default() += 1;
                }
            }
            let (untouchable, candidates): (Vec<Case>, Vec<Case>) =
                cases.into_iter().partition(|c| c.untouchable);
            self.stats.untouchable += untouchable.len();
            for case in &candidates {
                self.run_case(case, true);
            }
            flows = self.untouchable_phase(&untouchable, index).flows.len();
            assert_eq!(
                self.f.tables(),
                Tables::default(),
                "an IPv6 packet wrote an IPv4 flow or fragment entry (packets #{index}.., \
                 LB_FUZZ_SEED={:#x})",
                self.seed
            );
            index += n;
        }
        self.summary(started.elapsed().as_secs_f64());
    }

    /// Runs what cannot be for a service: the tables must not move, and the outcomes counted
    /// must all be ones such a packet may have. Returns the tables.
    fn untouchable_phase(&mut self, cases: &[Case], first: usize) -> Tables6 {
        let before = self.f.tables6();
        let counts_before = self.f.dp.reasons().unwrap();
        let mut ran = [0u64; 3];
        for case in cases {
            for (prog, o) in self.run_case(case, false) {
                ran[prog as usize] += u64::from(o != Outcome::Refused);
            }
        }
        let after = self.f.tables6();
        if after != before {
            self.find_table_change(&before, cases);
        }
        let counts_after = self.f.dp.reasons().unwrap();
        let round = format!(
            "packets #{first}.. that cannot be for a service, LB_FUZZ_SEED={:#x}",
            self.seed
        );
        round_counted(&counts_before, &counts_after, ran, &IPV6_OUTCOMES, &round);
        for prog in Prog::ALL {
            self.outcomes.moved(prog);
        }
        after
    }

    /// The tables changed while only packets that cannot be for a service ran: puts them back
    /// and runs those packets again one at a time to name the one that does it.
    fn find_table_change(&mut self, before: &Tables6, cases: &[Case]) -> ! {
        for case in cases {
            self.f.restore6(before);
            self.run_case(case, false);
            let now = self.f.tables6();
            if now != *before {
                let new: Vec<String> = (now.flows.iter())
                    .filter(|e| !before.flows.contains(e))
                    .map(|(k, v)| {
                        format!(
                            "flow proto {} [{}]:{} -> [{}]:{} => [{}]:{} -> [{}]:{} flags {:#x}",
                            k.proto,
                            ip6(k.saddr),
                            u16::from_be(k.sport),
                            ip6(k.daddr),
                            u16::from_be(k.dport),
                            ip6(v.saddr),
                            u16::from_be(v.sport),
                            ip6(v.daddr),
                            u16::from_be(v.dport),
                            v.flags
                        )
                    })
                    .chain(
                        (now.frags.iter())
                            .filter(|e| !before.frags.contains(e))
                            .map(|(k, _)| format!("fragment record id {:#x}", k.id)),
                    )
                    .collect();
                self.fail(
                    case,
                    case.order[0],
                    None,
                    &format!(
                        "a packet that cannot be for a service changed lb_flows6 or lb_frags6: \
                         {}",
                        new.join("; ")
                    ),
                );
            }
        }
        panic!(
            "packets #{}.. that cannot be for a service changed the tables together but not \
             alone; LB_FUZZ_SEED={:#x}",
            cases.first().map_or(0, |c| c.index),
            self.seed
        );
    }

    /// Runs `case` through the three programs in its order and checks every run; `counted`:
    /// also checks each run's outcome counters (a few syscalls per run, so only where the
    /// outcome is not known in advance).
    fn run_case(&mut self, case: &Case, counted: bool) -> Vec<(Prog, Outcome)> {
        let mut done = Vec::with_capacity(3);
        for prog in case.order {
            let res = self.f.test_run(prog, &case.frame, None);
            let (o, out) = self.check(case, prog, res);
            if counted {
                self.check_counted(case, prog, o, out.as_deref());
            }
            let s = &mut self.stats.progs[prog as usize];
            s.runs += 1;
            match o {
                Outcome::Refused => s.refused += 1,
                Outcome::Passed => s.passed += 1,
                Outcome::Translated => s.translated += 1,
                Outcome::Dropped => s.dropped += 1,
            }
            if o == Outcome::Translated {
                *self.stats.translated.entry((prog, case.kind)).or_default() += 1;
            }
            done.push((prog, o));
        }
        done
    }

    /// The verdict, the handoff, and what a passed or translated frame may be.
    fn check(
        &mut self,
        case: &Case,
        prog: Prog,
        res: Result<Run, ProgramError>,
    ) -> (Outcome, Option<Vec<u8>>) {
        let input = &case.frame;
        let run = match res {
            Err(_) if refused_by_test_run(prog, input) => return (Outcome::Refused, None),
            Err(e) => self.fail(
                case,
                prog,
                None,
                &format!("BPF_PROG_TEST_RUN failed on a frame it should run: {e:?}"),
            ),
            Ok(run) => run,
        };
        let out = run.out.as_slice();
        let Some(outcome) = Outcome::of(prog, &run) else {
            let what = format!("verdict {:#x} is not one {prog:?} may give", run.verdict);
            self.fail(case, prog, Some(out), &what);
        };
        if let Some(meta) = run.meta.filter(|m| *m != self.handoff) {
            self.fail(
                case,
                prog,
                Some(out),
                &format!(
                    "XDP metadata {meta:#010x} is not the handoff {:#010x}",
                    self.handoff
                ),
            );
        }
        if case.untouchable && outcome != Outcome::Passed {
            self.fail(
                case,
                prog,
                Some(out),
                &format!("{outcome:?} a packet that cannot be for a service"),
            );
        }
        match outcome {
            Outcome::Passed if out != input => self.fail(
                case,
                prog,
                Some(out),
                &format!(
                    "passed (verdict {:#x}) but changed, first at byte {}",
                    run.verdict,
                    (0..input.len().max(out.len()))
                        .find(|&i| input.get(i) != out.get(i))
                        .unwrap()
                ),
            ),
            Outcome::Translated => self.check_translated(case, prog, out),
            _ => {}
        }
        (outcome, Some(run.out))
    }

    /// Invariant 2 for one translated run.
    fn check_translated(&mut self, case: &Case, prog: Prog, out: &[u8]) {
        let input = &case.frame;
        if let Some(at) = foreign_change6(input, out) {
            let what = format!(
                "translated, and changed byte {at}, which is no address, port or checksum (or \
                 the length)"
            );
            self.fail(case, prog, Some(out), &what);
        }
        let Some(l) = ipv6(input) else {
            self.fail(
                case,
                prog,
                Some(out),
                "translated a frame that is no IPv6 packet",
            );
        };
        if l.proto == UDP
            && matches!(l.frag, Frag6::First(_))
            && input.get(l.l4 + 6..l.l4 + 8) == Some(&[0, 0])
        {
            let what = "translated a UDP first fragment with checksum 0, which cannot be given one";
            self.fail(case, prog, Some(out), what);
        }
        // IPv6 has no UDP checksum 0: a translation computes one, which must hold.
        let held: Vec<&str> = (checksums6(input).into_iter())
            .filter_map(|(name, ok)| ok.then_some(name))
            .collect();
        let after = checksums6(out);
        let want = |name: &'static str| if name == UDP6_ZERO { "UDP" } else { name };
        if let Some(broken) = held.iter().find(|n| !after.contains(&(want(n), true))) {
            let what = format!(
                "translated, and {broken}, which held, is no valid {} checksum now (after: \
                 {after:?})",
                want(broken)
            );
            self.fail(case, prog, Some(out), &what);
        }
        if !held.is_empty() {
            self.stats.progs[prog as usize].sums_kept += 1;
        }
        for name in held {
            *self.stats.kept.entry(name).or_default() += 1;
        }
        if l.proto == lb_common::IPPROTO_ICMPV6 {
            let Some(q) = l.quote(input) else {
                let what = "translated an ICMPv6 message that quotes no IPv6 packet";
                self.fail(case, prog, Some(out), what);
            };
            self.check_error_entry(case, prog, &l, &q, out);
        } else {
            self.check_flow_entry(case, prog, &l, out);
        }
    }

    /// A translated packet of a flow left as its entry says, in the role the entry gives it.
    fn check_flow_entry(&mut self, case: &Case, prog: Prog, l: &Ipv6Layout, out: &[u8]) {
        let input = &case.frame;
        let later = matches!(l.frag, Frag6::Later(_));
        let ports = (!later).then_some(l.l4);
        let mut t = Tuple6::at(input, l.ip, ports);
        if let Frag6::Later(id) = l.frag {
            let Some(rec) = self.f.frag6(&t.frag_key(l.proto, id)) else {
                self.fail(
                    case,
                    prog,
                    Some(out),
                    "translated a later fragment whose datagram has no record in lb_frags6",
                );
            };
            (t.sport, t.dport) = (u16::from_be(rec.sport), u16::from_be(rec.dport));
        }
        let Some(e) = self.f.flow6(&t.key(l.proto)) else {
            self.fail(
                case,
                prog,
                Some(out),
                &format!("translated, but lb_flows6 has no entry for its tuple {t:?}"),
            );
        };
        let want = Tuple6::of_entry(&e);
        let got = Tuple6::at(out, l.ip, ports);
        let as_entry = if later {
            (got.saddr, got.daddr) == (want.saddr, want.daddr)
        } else {
            got == want
        };
        let egress = prog == Prog::TcEgress;
        let role = match (egress, e.flags & FLOW_MASQ != 0) {
            (false, false) => WEB6.contains(&got.daddr),
            (false, true) => t.daddr == NODE6 && got.saddr == t.saddr,
            (true, false) => e.flags & FLOW_REPLY != 0 && [VIP6, NODE6].contains(&got.saddr),
            (true, true) => got.saddr == NODE6 && WEB6.contains(&got.daddr),
        };
        if !as_entry || (e.flags & FLOW_EGRESS != 0) != egress || !role {
            self.fail(
                case,
                prog,
                Some(out),
                &format!(
                    "translated {t:?} to {got:?}, by the entry {want:?} (flags {:#x}): it must \
                     leave as its entry says, by an entry of its own hook, a packet to the \
                     service towards an IPv6 backend, a reply from the service's address, a \
                     masqueraded one from the node's ({NODE6})",
                    e.flags
                ),
            );
        }
        if let Frag6::First(id) = l.frag {
            let rec = self.f.frag6(&t.frag_key(l.proto, id));
            if rec.map(|r| (u16::from_be(r.sport), u16::from_be(r.dport)))
                != Some((t.sport, t.dport))
            {
                self.fail(
                    case,
                    prog,
                    Some(out),
                    &format!(
                        "translated a first fragment, and lb_frags6 holds {rec:?} for its \
                         datagram, not its ports"
                    ),
                );
            }
        }
        if !later {
            self.generator.observe(l.proto, t, got);
        }
    }

    /// A translated ICMPv6 error left as the entry of the flow it quotes says (lb-ebpf
    /// `icmp.rs`): the error travels against the quoted packet, so the entry keyed by the
    /// quoted tuple reversed rewrites it; the quote becomes that entry's tuple reversed, and
    /// the outer addresses that were the quoted ones follow.
    fn check_error_entry(
        &mut self,
        case: &Case,
        prog: Prog,
        l: &Ipv6Layout,
        q: &Ipv6Layout,
        out: &[u8],
    ) {
        let input = &case.frame;
        let quoted = Tuple6::at(input, q.ip, Some(q.l4));
        let Some(e) = self.f.flow6(&quoted.reversed().key(q.proto)) else {
            self.fail(
                case,
                prog,
                Some(out),
                &format!("translated an ICMPv6 error quoting {quoted:?}, a flow with no entry"),
            );
        };
        let to = Tuple6::of_entry(&e);
        let (outer, outer_out) = (Tuple6::at(input, l.ip, None), Tuple6::at(out, l.ip, None));
        let want_outer = (
            if outer.saddr == quoted.daddr {
                to.saddr
            } else {
                outer.saddr
            },
            if outer.daddr == quoted.saddr {
                to.daddr
            } else {
                outer.daddr
            },
        );
        let got = Tuple6::at(out, q.ip, Some(q.l4));
        if got != to.reversed()
            || (outer_out.saddr, outer_out.daddr) != want_outer
            || (e.flags & FLOW_EGRESS != 0) != (prog == Prog::TcEgress)
        {
            self.fail(
                case,
                prog,
                Some(out),
                &format!(
                    "translated an ICMPv6 error quoting {quoted:?} to one quoting {got:?} from \
                     {} to {}, by the entry {to:?} (flags {:#x}): the quote must become the \
                     entry's tuple reversed, the error go from {} to {}",
                    outer_out.saddr, outer_out.daddr, e.flags, want_outer.0, want_outer.1
                ),
            );
        }
    }

    /// The run counted exactly one outcome, and the one its verdict implies.
    fn check_counted(&mut self, case: &Case, prog: Prog, o: Outcome, out: Option<&[u8]>) {
        let moved = self.outcomes.moved(prog);
        let fits = match (o, moved.as_slice()) {
            (Outcome::Refused, []) => true,
            (_, [(r, 1)]) => reason_fits(prog, &case.frame, o, *r),
            _ => false,
        };
        if !fits {
            self.fail(
                case,
                prog,
                out,
                &format!(
                    "{o:?}, and counted {moved:?}: a run counts one outcome, its own (a pass: \
                     one of {IPV6_PASSES:?}; a drop: nat_failed, masq_failed on egress, \
                     malformed only once the parser accepted the packet)"
                ),
            );
        }
    }

    fn summary(&self, secs: f64) {
        let s = &self.stats;
        println!(
            "{SERVICE_TEST}: seed {:#x}, {} packets ({} that cannot be for a service), {} runs \
             in {secs:.1} s; tables emptied {} times",
            self.seed,
            self.packets,
            s.untouchable,
            s.progs.iter().map(|p| p.runs).sum::<usize>(),
            s.flushes,
        );
        println!(
            "  {:<16}{:>8}{:>15}{:>9}",
            "kind", "clean", "valid-mutated", "garbage"
        );
        let mut kinds: Vec<Kind> = s.packets.keys().map(|(k, _)| *k).collect();
        kinds.dedup();
        for k in kinds {
            let n = |c| s.packets.get(&(k, c)).copied().unwrap_or(0);
            println!(
                "  {:<16}{:>8}{:>15}{:>9}",
                format!("{k:?}"),
                n(Class::Clean),
                n(Class::ValidMutated),
                n(Class::Garbage)
            );
        }
        let muts: Vec<String> = (s.mutations.iter())
            .map(|(m, n)| format!("{m:?} {n}"))
            .collect();
        println!("  mutations: {}", muts.join(", "));
        println!(
            "  {:<11}{:>8}{:>9}{:>12}{:>9}{:>9}{:>11}",
            "program", "runs", "passed", "translated", "dropped", "refused", "sums kept"
        );
        for prog in Prog::ALL {
            let p = &s.progs[prog as usize];
            println!(
                "  {:<11}{:>8}{:>9}{:>12}{:>9}{:>9}{:>11}",
                format!("{prog:?}"),
                p.runs,
                p.passed,
                p.translated,
                p.dropped,
                p.refused,
                p.sums_kept
            );
        }
        let counts = self.f.dp.reasons().unwrap();
        for prog in Prog::ALL {
            let r: Vec<String> = (counts.iter())
                .filter(|(hook, _, n)| *hook == prog.hook() && *n > 0)
                .map(|(_, r, n)| format!("{} {n}", Reason::ALL[*r as usize].1))
                .collect();
            println!("  {prog:?} counted: {}", r.join(", "));
            let t: Vec<String> = (s.translated.iter())
                .filter(|((p, _), _)| *p == prog)
                .map(|((_, k), n)| format!("{k:?} {n}"))
                .collect();
            println!("  {prog:?} translated, by kind: {}", t.join(", "));
        }
        let k: Vec<String> = s.kept.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!("  checksums kept through a translation: {}", k.join(", "));
    }

    /// The run must have reached what it is for, so that a generator gone blind fails rather
    /// than passes: every program translated packets with valid checksums and passed others,
    /// and counted every outcome an IPv6 packet reaches on it; every kind of checksum was
    /// kept through a translation; the ingress programs translated packets to the service,
    /// later fragments, ICMPv6 errors and replies to masquerade ports; egress translated
    /// backends' replies (later fragments among them), forwarded packets (masqueraded) and
    /// ICMPv6 errors. (Checked from [`COVERAGE_FROM`] packets on, where each of these happens
    /// dozens of times at least.)
    fn assert_coverage(&self) {
        let seed = self.seed;
        let counts = self.f.dp.reasons().unwrap();
        for prog in Prog::ALL {
            let p = &self.stats.progs[prog as usize];
            assert!(
                p.sums_kept > 0 && p.passed > 0,
                "{prog:?} translated no packet with valid checksums, or passed none: the \
                 generator no longer reaches it (LB_FUZZ_SEED={seed:#x})"
            );
            for r in [
                Reason::Translated,
                Reason::NotService,
                Reason::FragUnknown,
                Reason::Udp6NoChecksum,
                Reason::Malformed,
                Reason::Ipv6Extension,
                Reason::NotL4,
            ] {
                assert!(
                    (counts.iter()).any(|(h, x, n)| *h == prog.hook() && *x == r && *n > 0),
                    "{prog:?} never ended as {r:?}: the generator misses a path \
                     (LB_FUZZ_SEED={seed:#x})"
                );
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
                assert!(
                    self.stats.translated.contains_key(&(prog, *kind)),
                    "{prog:?} translated no {kind:?} packet (LB_FUZZ_SEED={seed:#x})"
                );
            }
        }
        for sum in ["TCP", "UDP", UDP6_ZERO, "SCTP CRC32c", "ICMPv6"] {
            assert!(
                self.stats.kept.contains_key(sum),
                "no translation re-checked a {sum} checksum (LB_FUZZ_SEED={seed:#x})"
            );
        }
        assert!(
            (counts.iter())
                .any(|(h, r, n)| *h == Prog::TcEgress.hook() && *r == Reason::MasqNew && *n > 0),
            "masquerade `always` masqueraded no IPv6 flow (LB_FUZZ_SEED={seed:#x})"
        );
    }
}

#[test]
fn ipv6_frames_for_a_service_translate_only_addresses_ports_and_checksums() {
    if !require_root(SERVICE_TEST) {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    let packets = count_from_env("LB_FUZZ_PACKETS", DEFAULT_PACKETS);
    println!("{SERVICE_TEST}: LB_FUZZ_SEED={seed:#x} LB_FUZZ_PACKETS={packets}");
    let mut fuzz = Fuzz6::new(seed, packets);
    fuzz.run();
    if packets >= COVERAGE_FROM {
        fuzz.assert_coverage();
    }
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
    let bytes = |cases: &[Case]| cases.iter().map(|c| c.frame.clone()).collect::<Vec<_>>();
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
