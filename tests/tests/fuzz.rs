//! The seeded fuzz tier: generated and mutated packets, each run through all three programs
//! (XDP, TC ingress, TC egress, in a random order) under BPF_PROG_TEST_RUN, against a network
//! with VIPs and published ports (tcp, udp, sctp, some on a host_ip only) whose flows the
//! packets themselves open, answer, masquerade, fragment and quote in ICMP errors. What must
//! hold for any packet whatsoever:
//!
//! 1. The verdict is one the program may give, and each run counts exactly one outcome reason,
//!    the one its verdict implies: `translated` for a translation, a drop reason for a drop.
//! 2. A packet that cannot be for a service — not IPv4, or mentioning no service, node or
//!    backend address anywhere (see `lb_tests::fuzz::mentions`) — leaves byte-identical and
//!    creates no flow or fragment entry. Any packet a program passes rather than translates
//!    leaves byte-identical.
//! 3. A translated packet changes only addresses, ports and checksum fields, and every checksum
//!    that held in it still holds, recomputed from scratch (`lb_tests::fuzz::checksums`).
//!    Packets come in two classes: valid checksums (structural lies included, their checksums
//!    fixed up to match) and garbage; a garbage checksum has nothing to keep.
//!    It leaves as the entry of its flow in `lb_flows` says (a later fragment's found by its
//!    datagram's record in `lb_frags`, an ICMP error's by the flow it quotes, keyed by the
//!    quoted tuple reversed), by an entry of its own hook, in the role the entry gives it: a
//!    packet to a service towards one of the backends (`empty`'s disabled one is none), a
//!    backend's reply from a service address (a VIP, or the node address the port is
//!    published on, `HOST_IP` among them), a masqueraded packet (`always`; `auto`'s hairpins)
//!    from the node's address `NODE`, a reply to it back to its client.
//! 4. The kernel runs every frame it does not refuse for its length (`refused_by_test_run`).
//!
//! The runner, its rounds and these checks are shared with the IPv6 tier
//! (`lb_tests::fuzz::Fuzz`); this file is the IPv4 tier (`Tier`): its network, its generator,
//! what a pass may count, the roles its entries give. A run of at least `COVERAGE_FROM`
//! packets per test must have reached every path it is for (`Fuzz::assert_coverage`).
//!
//! `LB_FUZZ_SEED` (decimal or 0x-hex) repeats a run: the packets, their order, the programs'
//! order and the flow hash key all follow from it (flow expiry, by the clock, is the one thing
//! that does not). `LB_FUZZ_PACKETS` sets how many packets the fuzz tests generate together
//! (100,000 by default; `LB_FUZZ_PACKETS=1000000` for a long run). Root only.
use std::net::Ipv4Addr;

use lb_common::{IPPROTO_SCTP as SCTP, IPPROTO_TCP as TCP, IPPROTO_UDP as UDP, Reason};
use lb_tests::{
    fixture::{
        CLIENT, CLIENT2, DB, DB_VIP, EMPTY_BACKEND, EMPTY_VIP, Fixture, HOST_IP, NODE, NOT_LOCAL,
        Prog, VIP, WEB, network, port, service,
    },
    fuzz::{
        Case, Cases, Class, Fuzz, Generator, Kind, Memory, Mutation, PORTS, Rng, Seen, Targets,
        Tier, Tuple, checksums, fix_checksums, foreign_change, hex, lengths_hold, mentions,
        quote_len, run_tier, tcp_flags,
    },
    packet::{Ipv4Packet, arp_request, icmp_message, ipv6_tcp_syn},
    require_root,
};
use lb_user::core::model::{Masquerade, Network, Proto};

/// A fourth service, so that a published UDP and SCTP port rewrite their port too (SCTP's
/// CRC32c then has to follow) and a second port sits on HOST_IP only.
const API_VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 40);
const API: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 20, 0, 40), Ipv4Addr::new(10, 20, 0, 41)];
/// A router between the node and the clients, which sends ICMP errors.
const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 254);

/// Every address that can key a service lookup, a flow entry or a fragment record: service
/// addresses, node addresses and backends. A frame that mentions none of them cannot be for a
/// service however it is parsed.
const SERVICE_SIDE: [Ipv4Addr; 13] = [
    VIP,
    EMPTY_VIP,
    DB_VIP,
    API_VIP,
    NODE,
    HOST_IP,
    WEB[0],
    WEB[1],
    WEB[2],
    DB,
    EMPTY_BACKEND,
    API[0],
    API[1],
];
/// Clients, a backend among them (reaching its own service: a hairpin).
const CLIENTS: [Ipv4Addr; 4] = [CLIENT, CLIENT, CLIENT2, WEB[0]];
const VIPS: [Ipv4Addr; 5] = [VIP, VIP, API_VIP, DB_VIP, EMPTY_VIP];
/// Where packets for a service go: the VIPs (`web`'s twice as often), the published ports per
/// protocol on the addresses that publish them, and near misses (published ports on addresses
/// that do not publish them, ports nobody publishes).
const TARGETS: Targets<Ipv4Addr> = Targets {
    vip: |rng| rng.pick(&VIPS),
    tcp: &[
        (NODE, 8080),
        (HOST_IP, 8080),
        (HOST_IP, 7070),
        (HOST_IP, 8443),
    ],
    udp: &[(NODE, 5353), (HOST_IP, 5353), (NODE, 6000), (HOST_IP, 6000)],
    sctp: &[(NODE, 9000), (HOST_IP, 9000), (NODE, 9100)],
    near_misses: &[(NODE, 7070), (NODE, 8443), (NOT_LOCAL, 8080), (NODE, 9999)],
    clients: &CLIENTS,
};

/// How a case is made of the frame the generator built: IPv4's mutations; TC runs with no
/// context, as a hairpin's (ingress_ifindex 1) or as another interface's; not IPv4, or
/// mentioning no service-side address, it cannot be for a service.
const CASES: Cases<Mutation> = Cases {
    rounds: &[0, 0, 0, 0, 1, 1, 1, 1, 2, 3],
    structural: &Mutation::STRUCTURAL,
    garbage: &Mutation::GARBAGE,
    fix: fix_checksums,
    ingress: |rng| rng.pick(&[None, Some(1), Some(7)]),
    untouchable: |frame| {
        frame.get(12..14) != Some(&[0x08, 0x00][..]) || !mentions(frame, &SERVICE_SIDE)
    },
};

/// Outcomes a packet that cannot be for a service may end with.
const NOT_FOR_A_SERVICE: [Reason; 8] = [
    Reason::NotIp,
    Reason::NotL4,
    Reason::Ipv6Extension,
    Reason::Udp6NoChecksum,
    Reason::Malformed,
    Reason::NotService,
    Reason::XdpDeferred,
    Reason::FragUnknown,
];

/// The fixture's network plus `api`.
fn fuzz_network(masquerade: Masquerade) -> Network {
    let mut net = network(masquerade);
    net.services.push(service(
        "api",
        API_VIP,
        &API,
        vec![
            port(Proto::Udp, 6000, 6001, None),
            port(Proto::Sctp, 9100, 9101, None),
            port(Proto::Tcp, 8443, 443, Some(HOST_IP)),
        ],
    ));
    net
}

/// The packet generator: a seeded PRNG and what it learnt from the programs' translations
/// (tuples to reply to, forward and quote; first fragments to follow).
struct Gen {
    rng: Rng,
    memory: Memory<Ipv4Addr, Ipv4Packet>,
}

impl Gen {
    fn new(seed: u64) -> Self {
        Gen {
            rng: Rng::new(seed),
            memory: Memory::default(),
        }
    }

    /// A packet as its kind builds it, before mutations (empty: the kind needs a translation
    /// seen first).
    fn base(&mut self) -> (Kind, Vec<u8>) {
        let roll = self.rng.below(100);
        let proto = self.rng.pick(&[TCP, TCP, UDP, SCTP]);
        let seen = self.memory.recall(&mut self.rng);
        match roll {
            0..=21 => {
                let p = self.service_packet(proto);
                (Kind::ToService, self.finish(p))
            }
            22..=27 => {
                let mut p = self.service_packet(proto);
                p.frag = 0x2000;
                p.id = self.rng.below(64) as u16;
                let words = self.rng.range(1, 6);
                p.payload = self.rng.bytes(8 * words);
                self.memory.first(p.clone());
                (Kind::FirstFragment, self.finish(p))
            }
            28..=32 => {
                let first = match self.memory.recall_first(&mut self.rng) {
                    Some(first) => first,
                    None => {
                        let mut p = self.service_packet(proto);
                        p.id = self.rng.u16();
                        p
                    }
                };
                let n = self.rng.range(1, 49);
                let data = self.rng.bytes(n);
                let offset8 = self.rng.range(1, 200) as u16;
                let more = self.rng.percent(50);
                (
                    Kind::LaterFragment,
                    first.later_fragment(offset8, more, &data),
                )
            }
            33..=56 => {
                let Some(s) = seen else {
                    return (Kind::ToService, Vec::new());
                };
                let kind = match roll {
                    33..=40 => Kind::Resend,
                    41..=50 => Kind::Reply,
                    _ => Kind::Forwarded,
                };
                let p = self.dressed(s.follow_up(kind), s.proto);
                (kind, self.finish(p))
            }
            57..=66 => (Kind::IcmpQuote, self.icmp_quote(seen, proto)),
            67..=88 => (Kind::NonService, self.non_service(proto)),
            _ => self.other_ethertype(proto),
        }
    }

    /// Builds `p`; an SCTP packet sometimes with a CRC of 0 (offloaded, which the programs
    /// leave alone).
    fn finish(&mut self, p: Ipv4Packet) -> Vec<u8> {
        let mut frame = p.build();
        if p.proto == SCTP && self.rng.percent(5) {
            let crc = 14 + 20 + p.options.len() + 8;
            frame[crc..crc + 4].fill(0);
        }
        frame
    }

    fn icmp_quote(&mut self, seen: Option<Seen<Ipv4Addr>>, proto: u8) -> Vec<u8> {
        let (quoted, q) = self.quoted(seen, proto);
        let quoted_frame = self.finish(q);
        let ip = &quoted_frame[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let rng = &mut self.rng;
        let len = quote_len(rng, ihl, ip.len());
        let any = (rng.u8(), rng.u8(), rng.u32());
        let (icmp_type, code, rest) = rng.pick(&[
            (3, 4, 1400),
            (3, 1, 0),
            (3, 3, 0),
            (11, 0, 0),
            (12, 0, 0x1400_0000),
            (0, 0, 0x1234_0001),
            (8, 0, 0x1234_0001),
            (5, 1, 0x0a0a_00fe),
            any,
        ]);
        let (src, dst) = quoted.error_ends(rng, ROUTER, NODE, CLIENT);
        icmp_message(src, dst, icmp_type, code, rest, &ip[..len])
    }

    /// An address no service uses.
    fn outsider(&mut self) -> Ipv4Addr {
        let rng = &mut self.rng;
        match rng.below(3) {
            0 => Ipv4Addr::new(172, 16 + rng.below(16) as u8, rng.u8(), rng.u8()),
            1 => Ipv4Addr::new(192, 168, 2 + rng.below(250) as u8, rng.u8()),
            _ => Ipv4Addr::new(198, 51, 100, rng.u8()),
        }
    }

    fn non_service(&mut self, proto: u8) -> Vec<u8> {
        let (saddr, daddr) = (self.outsider(), self.outsider());
        let t = Tuple::between(&mut self.rng, saddr, daddr, &[8080, 5353, 9000, 7070, 443]);
        let p = self.dressed(t, proto);
        match self.rng.below(10) {
            0..=5 => self.finish(p),
            6 => {
                let n = self.rng.below(57);
                let body = self.rng.bytes(n);
                icmp_message(saddr, daddr, 8, 0, 0x1234_0001, &body)
            }
            7 => {
                let quoted = p.build();
                let len = (20 + 8).min(quoted.len() - 14);
                icmp_message(daddr, saddr, 3, 4, 1400, &quoted[14..14 + len])
            }
            8 => {
                let n = self.rng.range(1, 49);
                let data = self.rng.bytes(n);
                p.later_fragment(self.rng.range(1, 200) as u16, self.rng.percent(50), &data)
            }
            _ => {
                // Another protocol (IGMP, GRE, ESP, OSPF, anything) under an IPv4 header.
                let mut frame = p.build();
                let any = self.rng.u8();
                frame[14 + 9] = self.rng.pick(&[2, 47, 50, 89, 58, any]);
                frame
            }
        }
    }

    fn other_ethertype(&mut self, proto: u8) -> (Kind, Vec<u8>) {
        match self.rng.below(6) {
            0 => {
                let sender = self.rng.pick(&CLIENTS);
                let target = self.rng.pick(&SERVICE_SIDE);
                (Kind::Arp, arp_request(sender, target))
            }
            1 => (Kind::Ipv6, ipv6_tcp_syn(self.rng.pick(&PORTS))),
            2 | 3 => {
                let p = self.service_packet(proto);
                let mut frame = self.finish(p);
                Mutation::VlanTag.apply(&mut self.rng, &mut frame);
                (Kind::Vlan, frame)
            }
            4 => {
                let p = self.service_packet(proto);
                let mut frame = self.finish(p);
                let t: u16 = self.rng.pick(&[0x86dd, 0x0806, 0x88cc, 0x8847]);
                frame[12..14].copy_from_slice(&t.to_be_bytes());
                (Kind::OtherEthertype, frame)
            }
            _ => {
                let mut frame = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
                let t = loop {
                    let t = self.rng.u16();
                    if t != 0x0800 {
                        break t;
                    }
                };
                frame.extend(t.to_be_bytes());
                let n = self.rng.below(81);
                frame.extend(self.rng.bytes(n));
                (Kind::OtherEthertype, frame)
            }
        }
    }
}

impl Generator for Gen {
    type Ip = Ipv4Addr;
    type Packet = Ipv4Packet;
    const TARGETS: Targets<Ipv4Addr> = TARGETS;

    fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    fn packet(t: Tuple<Ipv4Addr>, proto: u8) -> Ipv4Packet {
        t.packet(proto)
    }

    fn tuple_of(p: &Ipv4Packet) -> Tuple<Ipv4Addr> {
        Tuple::new(p.saddr, p.sport, p.daddr, p.dport)
    }

    /// Random flags, payload, identification, TTL, DF and (valid) options.
    fn dress(&mut self, p: &mut Ipv4Packet) {
        let rng = &mut self.rng;
        p.tcp_flags = tcp_flags(rng);
        // Now and then a payload past one page: an XDP run then gets a multi-buffer frame
        // (the program is frags-aware), an skb run refuses it past `SKB_RUN_MAX`.
        let n = if rng.percent(1) {
            rng.range(1400, 6000)
        } else {
            rng.below(41)
        };
        p.payload = rng.bytes(n);
        p.id = rng.u16();
        p.ttl = rng.range(1, 256) as u8;
        p.frag = rng.pick(&[0x4000, 0x4000, 0]);
        if rng.percent(10) {
            let words = rng.range(1, 11);
            p.options = vec![1; words * 4];
            p.options[words * 4 - 1] = 0;
        }
        if p.proto == UDP && rng.percent(10) {
            p.l4_csum = Some(0);
        }
    }
}

impl Tier for Gen {
    type Addr = u32;
    type Mutation = Mutation;
    const TARGET: &'static str = "fuzz";
    /// `fuzz_with_masquerade_always` and `fuzz_with_masquerade_auto`.
    const SHARE: usize = 2;
    const NOT_FOR_A_SERVICE: &'static [Reason] = &NOT_FOR_A_SERVICE;
    const KEPT: &'static [&'static str] = &[
        "TCP",
        "UDP",
        "UDP checksum 0 (none)",
        "SCTP CRC32c",
        "ICMP",
        "quoted IPv4 header",
    ];
    /// `empty`'s one backend is disabled: no flow goes to it, or replies from its VIP.
    const BACKENDS: &'static [Ipv4Addr] = &[WEB[0], WEB[1], WEB[2], DB, API[0], API[1]];
    const REPLY_FROM: &'static [Ipv4Addr] = &[VIP, DB_VIP, API_VIP, NODE, HOST_IP];
    /// The address of the interface a TC run's skb is on (ifindex 1).
    const MASQ: Ipv4Addr = NODE;

    fn case(&mut self, index: usize) -> Case<Mutation> {
        let (mut kind, mut frame) = self.base();
        if frame.is_empty() {
            // Nothing seen yet to follow up on.
            kind = Kind::ToService;
            let proto = self.rng.pick(&[TCP, TCP, UDP, SCTP]);
            let p = self.service_packet(proto);
            frame = self.finish(p);
        }
        CASES.case(&mut self.rng, index, kind, frame, |m, rng, frame| {
            m.apply(rng, frame)
        })
    }

    fn memory(&mut self) -> &mut Memory<Ipv4Addr, Ipv4Packet> {
        &mut self.memory
    }

    fn foreign_change(input: &[u8], output: &[u8]) -> Option<usize> {
        foreign_change(input, output)
    }

    fn checksums(frame: &[u8]) -> Vec<(&'static str, bool)> {
        checksums(frame)
    }

    fn lengths_hold(frame: &[u8]) -> bool {
        lengths_hold(frame)
    }

    /// Any outcome but a translation's, a redirect's, a failure's and DSR's (which a NAT
    /// network's programs give no packet they pass).
    fn pass_fits(_prog: Prog, r: Reason) -> bool {
        !matches!(
            r,
            Reason::Translated
                | Reason::Redirected
                | Reason::NatFailed
                | Reason::MasqFailed
                | Reason::DsrNew
                | Reason::DsrSession
                | Reason::DsrReset
                | Reason::DsrNoBackend
                | Reason::DsrUnresolved
        )
    }

    fn passes() -> String {
        "any but translated, redirected, nat_failed, masq_failed and DSR's".into()
    }

    /// Later fragments, ICMP errors, replies and forwarded packets were translated.
    fn assert_coverage(fuzz: &Fuzz<Self>) {
        for kind in [
            Kind::LaterFragment,
            Kind::IcmpQuote,
            Kind::Reply,
            Kind::Forwarded,
        ] {
            fuzz.assert_translated(&Prog::ALL, kind);
        }
    }
}

/// `stream` tells the fuzz tests' packet streams apart under one seed.
fn fuzz(test: &'static str, stream: u64, masquerade: Masquerade) {
    let salt = stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    run_tier(test, salt, fuzz_network(masquerade), Gen::new);
}

/// Masquerade `always`: every load-balanced flow also gets the source-NAT pair on egress, so
/// replies to masquerade ports come back through ingress.
#[test]
fn fuzz_with_masquerade_always() {
    fuzz("fuzz_with_masquerade_always", 1, Masquerade::Always);
}

/// Masquerade `auto`: only hairpins (TC runs with ingress_ifindex 1) are masqueraded.
#[test]
fn fuzz_with_masquerade_auto() {
    fuzz("fuzz_with_masquerade_auto", 2, Masquerade::Auto);
}

/// A seed names one sequence of packets: what makes a failure repeatable.
#[test]
fn generator_is_a_function_of_the_seed() {
    let frames = |seed| {
        let mut g = Gen::new(seed);
        (0..2000).map(|i| g.case(i).frame).collect::<Vec<_>>()
    };
    assert_eq!(frames(42), frames(42));
    assert_ne!(frames(42), frames(43));
}

/// The classes the generator promises: most packets of the valid class have checksums that all
/// hold, and packets that cannot be for a service are a sizeable share of every round.
#[test]
fn generator_makes_every_class() {
    let mut g = Gen::new(7);
    let cases: Vec<Case<Mutation>> = (0..5000).map(|i| g.case(i)).collect();
    let valid_holding = cases
        .iter()
        .filter(|c| c.class != Class::Garbage)
        .filter(|c| checksums(&c.frame).iter().all(|(_, ok)| *ok))
        .count();
    let valid = cases.iter().filter(|c| c.class != Class::Garbage).count();
    assert_eq!(valid_holding, valid, "fix-up makes every checksum hold");
    let untouchable = cases.iter().filter(|c| c.untouchable).count();
    assert!(
        (1000..4000).contains(&untouchable),
        "{untouchable} of 5000 cannot be for a service"
    );
    for kind in [
        Kind::ToService,
        Kind::NonService,
        Kind::Vlan,
        Kind::IcmpQuote,
    ] {
        assert!(cases.iter().any(|c| c.kind == kind), "{kind:?}");
    }
}

// Regressions the fuzzer found: each is the smallest form of a failing case, named for the
// behaviour it expects, with the seed that found it.

/// REGRESSION, found by `fuzz_with_masquerade_always` (LB_FUZZ_SEED=0xdf0e0c39b566f6e3,
/// packet #39806). An ICMP error whose IPv4 total length ends inside its quote, the rest of
/// the quote following as trailing bytes (link-layer padding, as far as IP is concerned). The
/// parser takes the quoted header and ports from past the datagram's end (lb-ebpf `parse.rs`,
/// the ICMP branch bounds them by the frame, not by the total length as it does TCP, UDP and
/// SCTP headers); the translation rewrites them there and folds the change into the ICMP
/// checksum, which does not cover them, so a checksum that held no longer does. `parse.rs`'s
/// contract: a packet that lies about its lengths passes untouched.
#[test]
fn icmp_error_whose_quote_lies_past_its_total_length_passes_untouched() {
    if !require_root("icmp_error_whose_quote_lies_past_its_total_length_passes_untouched") {
        return;
    }
    let mut f = Fixture::with_network(fuzz_network(Masquerade::Never), Some(0x5eed));
    let syn = Ipv4Packet::tcp(CLIENT, 40000, VIP, 443);
    let (_, out) = f.run(Prog::TcIngress, &syn.build());
    let backend = Tuple::of(&out, 14 + 20).daddr;
    let forwarded = Ipv4Packet {
        daddr: backend,
        ..syn.clone()
    }
    .build();
    let reply_seen = syn.reply().build();
    let cases = [
        // The backend's error about the packet it got, toward the client (egress, entry R).
        (Prog::TcEgress, backend, CLIENT, forwarded),
        // A router's error about the reply as the client got it, toward the VIP (ingress, F).
        (Prog::TcIngress, ROUTER, VIP, reply_seen.clone()),
        (Prog::Xdp, ROUTER, VIP, reply_seen),
    ];
    let mut failures = Vec::new();
    for (prog, src, dst, quoted) in cases {
        let whole = icmp_message(src, dst, 3, 4, 1400, &quoted[14..14 + 28]);
        let run = f.test_run(prog, &whole, None).unwrap();
        assert_ne!(run.out, whole, "{prog:?} translates the whole error");
        // Total length 40: the ICMP header and the quoted header's first 12 bytes; the quoted
        // addresses and ports lie past it.
        let mut cut = whole.clone();
        cut[14 + 2..14 + 4].copy_from_slice(&40u16.to_be_bytes());
        fix_checksums(&mut cut);
        assert!(checksums(&cut).iter().all(|(_, ok)| *ok));
        let run = f.test_run(prog, &cut, None).unwrap();
        if run.out != cut {
            failures.push(format!(
                "{prog:?}: verdict {:#x}, checksums after {:?}\n  in:  {}\n  out: {}",
                run.verdict,
                checksums(&run.out),
                hex(&cut),
                hex(&run.out)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "an ICMP error whose quote lies past its total length must pass untouched:\n{}",
        failures.join("\n")
    );
}
