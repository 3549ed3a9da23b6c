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
//! 4. The kernel runs every frame it does not refuse for its length (`refused_by_test_run`).
//!
//! `LB_FUZZ_SEED` (decimal or 0x-hex) repeats a run: the packets, their order, the programs'
//! order and the flow hash key all follow from it (flow expiry, by the clock, is the one thing
//! that does not). `LB_FUZZ_PACKETS` sets how many packets the fuzz tests generate together
//! (100,000 by default; `LB_FUZZ_PACKETS=1000000` for a long run). Root only.
use std::{
    collections::{BTreeMap, VecDeque},
    net::Ipv4Addr,
    time::Instant,
};

use aya::{
    maps::{MapData, PerCpuArray},
    programs::ProgramError,
};
use lb_common::{REASONS, Reason};
use lb_tests::{
    fixture::{
        CLIENT, CLIENT2, DB, DB_VIP, EMPTY_BACKEND, EMPTY_VIP, Fixture, HOST_IP, NODE, NOT_LOCAL,
        Prog, Run, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC, Tables, VIP, WEB, XDP_DROP, XDP_PASS,
        network, port, refused_by_test_run, service,
    },
    fuzz::{
        Mutation, Rng, checksums, count_from_env, fix_checksums, foreign_change, hex, ipv4,
        lengths_hold, mentions, seed_from_env,
    },
    packet::{
        Ipv4Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, arp_request, icmp_message,
        ipv6_tcp_syn,
    },
    require_root,
};
use lb_user::{
    core::model::{Masquerade, Network, Proto},
    dataplane::ebpf::ip,
};

/// Packets the fuzz tests generate together unless `LB_FUZZ_PACKETS` says otherwise.
const DEFAULT_PACKETS: usize = 100_000;
/// The fuzz tests, which split the packets between them.
const FUZZ_TESTS: usize = 2;
/// Packets generated at once. A round runs the packets that may be for a service first, then
/// those that cannot be, with the flow and fragment tables read before and after the second
/// phase (a read costs a few µs per entry: per packet it would cost more than the packet).
const ROUND: usize = 500;
/// Flow entries beyond which the tables are emptied between rounds, keeping reads cheap.
const TABLE_CAP: usize = 800;
/// Packets per test from which the run must reach every path it is for (see
/// `Fuzz::assert_coverage`).
const COVERAGE_FROM: usize = 20_000;

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
const CLIENTS: [Ipv4Addr; 4] = [CLIENT, CLIENT, CLIENT2, WEB[0]];
const VIPS: [Ipv4Addr; 5] = [VIP, VIP, API_VIP, DB_VIP, EMPTY_VIP];
/// Published ports per protocol, on the addresses that publish them.
const TCP_PUBLISHED: [(Ipv4Addr, u16); 4] = [
    (NODE, 8080),
    (HOST_IP, 8080),
    (HOST_IP, 7070),
    (HOST_IP, 8443),
];
const UDP_PUBLISHED: [(Ipv4Addr, u16); 4] =
    [(NODE, 5353), (HOST_IP, 5353), (NODE, 6000), (HOST_IP, 6000)];
const SCTP_PUBLISHED: [(Ipv4Addr, u16); 3] = [(NODE, 9000), (HOST_IP, 9000), (NODE, 9100)];
/// Published ports on addresses that do not publish them, and ports nobody publishes.
const NEAR_MISSES: [(Ipv4Addr, u16); 4] =
    [(NODE, 7070), (NODE, 8443), (NOT_LOCAL, 8080), (NODE, 9999)];
const PORTS: [u16; 8] = [443, 80, 53, 8080, 5353, 9000, 9100, 7070];
const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

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

/// How a case was generated (for the summary and for reproducing a failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// TCP (any flags), UDP or SCTP from a client to a VIP, a published port or a near miss.
    ToService,
    /// The first fragment of such a datagram (MF, offset 0).
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
    /// An ICMP message quoting a tracked tuple (or a fresh one), from a router or an endpoint.
    IcmpQuote,
    /// TCP, UDP, SCTP, ICMP, fragments and other protocols between addresses no service uses.
    NonService,
    Arp,
    Ipv6,
    /// A service packet behind an 802.1Q (or QinQ) tag.
    Vlan,
    /// Any other ethertype, and IPv4 under a wrong ethertype.
    OtherEthertype,
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
    mutations: Vec<Mutation>,
    frame: Vec<u8>,
    /// The order the three programs see it in.
    order: [Prog; 3],
    /// The TC runs' ingress interface (`Some(1)`: a hairpin on loopback), or no context.
    ingress_ifindex: Option<u32>,
    /// Not IPv4, or mentions no service-side address: must pass untouched everywhere.
    untouchable: bool,
}

/// An address and port pair each way, as in a packet.
#[derive(Clone, Copy, Debug)]
struct Tuple {
    saddr: Ipv4Addr,
    sport: u16,
    daddr: Ipv4Addr,
    dport: u16,
}

impl Tuple {
    fn of(frame: &[u8], l4: usize) -> Self {
        let addr =
            |at: usize| Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
        Tuple {
            saddr: addr(26),
            daddr: addr(30),
            sport: u16::from_be_bytes([frame[l4], frame[l4 + 1]]),
            dport: u16::from_be_bytes([frame[l4 + 2], frame[l4 + 3]]),
        }
    }

    fn reversed(self) -> Self {
        Tuple {
            saddr: self.daddr,
            sport: self.dport,
            daddr: self.saddr,
            dport: self.sport,
        }
    }

    fn packet(self, proto: u8) -> Ipv4Packet {
        let p = Ipv4Packet::tcp(self.saddr, self.sport, self.daddr, self.dport);
        Ipv4Packet { proto, ..p }
    }
}

/// A translation a program made: the tuple before and after.
#[derive(Clone, Copy, Debug)]
struct Seen {
    proto: u8,
    before: Tuple,
    after: Tuple,
}

/// The packet generator: a seeded PRNG and what it learnt from the programs' translations
/// (tuples to reply to, forward and quote; first fragments to follow).
struct Gen {
    rng: Rng,
    seen: VecDeque<Seen>,
    firsts: VecDeque<Ipv4Packet>,
}

impl Gen {
    fn new(seed: u64) -> Self {
        Gen {
            rng: Rng::new(seed),
            seen: VecDeque::new(),
            firsts: VecDeque::new(),
        }
    }

    /// Forgets what the tables forgot.
    fn forget(&mut self) {
        self.seen.clear();
        self.firsts.clear();
    }

    fn observe(&mut self, input: &[u8], output: &[u8]) {
        let Some(l) = ipv4(input) else { return };
        if l.later || !matches!(l.proto, TCP | UDP | SCTP) || l.l4() + 4 > input.len() {
            return;
        }
        if self.seen.len() == 64 {
            self.seen.pop_front();
        }
        self.seen.push_back(Seen {
            proto: l.proto,
            before: Tuple::of(input, l.l4()),
            after: Tuple::of(output, l.l4()),
        });
    }

    fn case(&mut self, index: usize) -> Case {
        let (mut kind, mut frame) = self.base();
        if frame.is_empty() {
            // Nothing seen yet to follow up on.
            kind = Kind::ToService;
            let proto = self.rng.pick(&[TCP, TCP, UDP, SCTP]);
            let p = self.service_packet(proto);
            frame = self.finish(p);
        }
        let rng = &mut self.rng;
        let valid = rng.percent(55);
        let mut mutations = Vec::new();
        for _ in 0..rng.pick(&[0, 0, 0, 0, 1, 1, 1, 1, 2, 3]) {
            let m = rng.pick(&Mutation::STRUCTURAL);
            m.apply(rng, &mut frame);
            mutations.push(m);
        }
        if valid {
            fix_checksums(&mut frame);
        } else if rng.percent(60) {
            let m = rng.pick(&Mutation::GARBAGE);
            m.apply(rng, &mut frame);
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
        let ingress_ifindex = rng.pick(&[None, Some(1), Some(7)]);
        let ipv4_ethertype = frame.len() >= 14 && frame[12..14] == [0x08, 0x00];
        Case {
            index,
            kind,
            class,
            mutations,
            untouchable: !ipv4_ethertype || !mentions(&frame, &SERVICE_SIDE),
            frame,
            order,
            ingress_ifindex,
        }
    }

    /// A packet as its kind builds it, before mutations (empty: the kind needs a translation
    /// seen first).
    fn base(&mut self) -> (Kind, Vec<u8>) {
        let roll = self.rng.below(100);
        let proto = self.rng.pick(&[TCP, TCP, UDP, SCTP]);
        let seen = (!self.seen.is_empty()).then(|| {
            let i = self.rng.below(self.seen.len());
            self.seen[i]
        });
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
                if self.firsts.len() == 32 {
                    self.firsts.pop_front();
                }
                self.firsts.push_back(p.clone());
                (Kind::FirstFragment, self.finish(p))
            }
            28..=32 => {
                let first = if !self.firsts.is_empty() && self.rng.percent(85) {
                    let i = self.rng.below(self.firsts.len());
                    self.firsts[i].clone()
                } else {
                    let mut p = self.service_packet(proto);
                    p.id = self.rng.u16();
                    p
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
                let (kind, t) = match roll {
                    33..=40 => (Kind::Resend, s.before),
                    41..=50 => (Kind::Reply, s.after.reversed()),
                    _ => (Kind::Forwarded, s.after),
                };
                let mut p = t.packet(s.proto);
                self.dress(&mut p);
                (kind, self.finish(p))
            }
            57..=66 => (Kind::IcmpQuote, self.icmp_quote(seen, proto)),
            67..=88 => (Kind::NonService, self.non_service(proto)),
            _ => self.other_ethertype(proto),
        }
    }

    fn service_packet(&mut self, proto: u8) -> Ipv4Packet {
        let rng = &mut self.rng;
        let (daddr, dport) = match rng.below(10) {
            0..=3 => (
                rng.pick(&VIPS),
                if rng.percent(80) {
                    rng.pick(&PORTS)
                } else {
                    rng.u16()
                },
            ),
            4..=7 => match proto {
                TCP => rng.pick(&TCP_PUBLISHED),
                UDP => rng.pick(&UDP_PUBLISHED),
                _ => rng.pick(&SCTP_PUBLISHED),
            },
            _ => rng.pick(&NEAR_MISSES),
        };
        let saddr = rng.pick(&CLIENTS);
        // Few client ports, so that flows are met again: resent, reopened, clashing.
        let sport = if rng.percent(90) {
            40000 + rng.below(16) as u16
        } else {
            rng.u16()
        };
        let mut p = Tuple {
            saddr,
            sport,
            daddr,
            dport,
        }
        .packet(proto);
        self.dress(&mut p);
        p
    }

    /// Random flags, payload, identification, TTL, DF and (valid) options.
    fn dress(&mut self, p: &mut Ipv4Packet) {
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

    fn icmp_quote(&mut self, seen: Option<Seen>, proto: u8) -> Vec<u8> {
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
                let t = Tuple {
                    saddr: p.saddr,
                    sport: p.sport,
                    daddr: p.daddr,
                    dport: p.dport,
                };
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
        let quoted_frame = self.finish(q);
        let ip = &quoted_frame[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let rng = &mut self.rng;
        let len = match rng.below(10) {
            0..=5 => ihl + 8,
            6 | 7 => ip.len(),
            8 => ihl + 4,
            _ => rng.below(ip.len() + 1),
        }
        .min(ip.len());
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
        let src = rng.pick(&[ROUTER, ROUTER, quoted.daddr, NODE]);
        let dst = rng.pick(&[quoted.saddr, quoted.saddr, NODE, CLIENT]);
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
        let any = self.rng.u16();
        let sport = self.rng.pick(&[any, 40000, 443]);
        let dport = self.rng.pick(&[any, 8080, 5353, 9000, 7070, 443]);
        let t = Tuple {
            saddr,
            sport,
            daddr,
            dport,
        };
        let mut p = t.packet(proto);
        self.dress(&mut p);
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

/// How one run ended, as the checks read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The kernel refused the frame for its length.
    Refused,
    Passed,
    Translated,
    Dropped,
}

/// Whether `r` is a run's outcome (each run counts exactly one) rather than an event along
/// the way (a new flow, a restored entry, ...). Exhaustive, so that a new reason must be
/// placed here.
fn is_outcome(r: Reason) -> bool {
    match r {
        Reason::Translated
        | Reason::NotIp
        | Reason::NotL4
        | Reason::Ipv6Extension
        | Reason::Udp6NoChecksum
        | Reason::Malformed
        | Reason::NotService
        | Reason::NoFlowOpener
        | Reason::NodeSocket
        | Reason::NoBackend
        | Reason::XdpDeferred
        | Reason::FragUnknown
        | Reason::NatFailed
        | Reason::MasqFailed
        | Reason::SctpFragment
        | Reason::Redirected
        | Reason::NotRedirected
        // DSR's (this fuzz runs NAT networks, where none of them may occur).
        | Reason::DsrNew
        | Reason::DsrSession
        | Reason::DsrReset
        | Reason::DsrNoBackend
        | Reason::DsrUnresolved
        // The socket programs' (which run on no packet).
        | Reason::SockTranslated
        | Reason::SockReversed => true,
        Reason::FlowNew
        | Reason::FlowReopened
        | Reason::FlowRecreated
        | Reason::EntryRestored
        | Reason::EntryExpired
        | Reason::PortClash
        | Reason::MasqNew => false,
    }
}

fn outcomes() -> Vec<Reason> {
    Reason::ALL
        .iter()
        .map(|(r, _)| *r)
        .filter(|r| is_outcome(*r))
        .collect()
}

/// The outcomes a run of `prog` on `input` that ended as `o` may have counted. A drop is for
/// a flow that gets no unique tuple (`nat_failed`, and `masq_failed` on egress, where
/// masquerade is), or a rewrite that failed half-way (`malformed`, after the parser accepted
/// the packet: its lengths held).
fn reason_fits(prog: Prog, input: &[u8], o: Outcome, r: Reason) -> bool {
    match o {
        Outcome::Translated => r == Reason::Translated,
        Outcome::Dropped => match r {
            Reason::NatFailed => true,
            Reason::Malformed => lengths_hold(input),
            Reason::MasqFailed => prog == Prog::TcEgress,
            _ => false,
        },
        Outcome::Passed => !matches!(
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
        ),
        Outcome::Refused => false,
    }
}

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

#[derive(Default)]
struct ProgStats {
    runs: usize,
    refused: usize,
    passed: usize,
    translated: usize,
    dropped: usize,
    /// Translations whose input had checksums that held, all re-checked on the output.
    sums_kept: usize,
    reasons: BTreeMap<&'static str, u64>,
}

#[derive(Default)]
struct Stats {
    packets: BTreeMap<(Kind, Class), usize>,
    mutations: BTreeMap<Mutation, usize>,
    untouchable: usize,
    progs: [ProgStats; 3],
    /// Translations per kind of packet, all programs together.
    translated: BTreeMap<Kind, usize>,
    /// Checksums that held in a translated packet and were re-checked on its output, by name.
    kept: BTreeMap<&'static str, usize>,
    flushes: usize,
}

/// One fuzz run: the fixture, the generator and the counts.
struct Fuzz {
    test: &'static str,
    seed: u64,
    f: Fixture,
    generator: Gen,
    handoff: u32,
    slots: PerCpuArray<MapData, u64>,
    /// Each program's outcome counters as last read.
    counted: [Vec<u64>; 3],
    stats: Stats,
}

impl Fuzz {
    /// `stream` tells the fuzz tests' packet streams apart under one seed.
    fn new(test: &'static str, seed: u64, stream: u64, masquerade: Masquerade) -> Self {
        let mut rng = Rng::new(seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let hash_key = rng.u32() | 1;
        let mut f = Fixture::with_network(fuzz_network(masquerade), Some(hash_key));
        let handoff = f.handoff();
        let slots = f.reason_slots();
        let mut fuzz = Fuzz {
            test,
            seed,
            f,
            generator: Gen::new(rng.next_u64()),
            handoff,
            slots,
            counted: Default::default(),
            stats: Stats::default(),
        };
        for prog in Prog::ALL {
            fuzz.counted[prog as usize] = fuzz.outcome_counts(prog);
        }
        fuzz
    }

    fn outcome_counts(&self, prog: Prog) -> Vec<u64> {
        outcomes()
            .into_iter()
            .map(|r| {
                let slot = prog as u32 * REASONS + r as u32;
                self.slots.get(&slot, 0).unwrap().iter().sum()
            })
            .collect()
    }

    /// Panics with everything needed to repeat the failure.
    fn fail(&self, case: &Case, prog: Prog, out: Option<&[u8]>, what: &str) -> ! {
        panic!(
            "{what}\n  packet #{} ({:?}, {:?}, mutations {:?}) through {prog:?} (order {:?}, \
             TC ingress_ifindex {:?})\n  in:  {}\n  out: {}\n  repeat with LB_FUZZ_SEED={:#x} \
             LB_FUZZ_PACKETS={} cargo test -p lb-tests --test fuzz {} (the same packets, in \
             the same order)",
            case.index,
            case.kind,
            case.class,
            case.mutations,
            case.order,
            case.ingress_ifindex,
            hex(&case.frame),
            out.map_or("-".into(), hex),
            self.seed,
            packets_total(),
            self.test,
        )
    }

    fn run(&mut self, packets: usize) {
        let started = Instant::now();
        let mut index = 0;
        let mut tables = self.f.tables();
        while index < packets {
            if tables.flows.len() > TABLE_CAP {
                self.f.restore(&Tables::default());
                self.generator.forget();
                self.stats.flushes += 1;
            }
            let n = ROUND.min(packets - index);
            let cases: Vec<Case> = (index..index + n).map(|i| self.generator.case(i)).collect();
            index += n;
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
            tables = self.untouchable_phase(&untouchable);
        }
        self.summary(packets, started.elapsed().as_secs_f64());
    }

    /// Runs what cannot be for a service: the tables must not move, and the outcomes counted
    /// must all be ones such a packet may have. Returns the tables.
    fn untouchable_phase(&mut self, cases: &[Case]) -> Tables {
        let before = self.f.tables();
        let counts_before = self.f.dp.reasons().unwrap();
        let mut runs = [0u64; 3];
        for case in cases {
            for (prog, o) in self.run_case(case, false) {
                runs[prog as usize] += u64::from(o != Outcome::Refused);
            }
        }
        let after = self.f.tables();
        if after != before {
            self.find_table_change(&before, &after, cases);
        }
        let counts_after = self.f.dp.reasons().unwrap();
        for prog in Prog::ALL {
            let moved: Vec<(Reason, u64)> = counts_before
                .iter()
                .zip(&counts_after)
                .filter(|((hook, ..), _)| *hook == prog.hook())
                .map(|((_, r, b), (_, _, a))| (*r, a - b))
                .filter(|(_, d)| *d > 0)
                .collect();
            let total: u64 = moved.iter().map(|(_, d)| d).sum();
            assert!(
                total == runs[prog as usize]
                    && moved.iter().all(|(r, _)| NOT_FOR_A_SERVICE.contains(r)),
                "{prog:?}: {} runs of packets that cannot be for a service counted {moved:?}; \
                 only one outcome per run, and only {NOT_FOR_A_SERVICE:?}, fit (packets #{}..; \
                 LB_FUZZ_SEED={:#x})",
                runs[prog as usize],
                cases.first().map_or(0, |c| c.index),
                self.seed,
            );
            self.counted[prog as usize] = self.outcome_counts(prog);
        }
        after
    }

    /// The tables changed while only packets that cannot be for a service ran: puts them back
    /// and runs those packets again one at a time to name the one that does it.
    fn find_table_change(&mut self, before: &Tables, after: &Tables, cases: &[Case]) -> ! {
        for case in cases {
            self.f.restore(before);
            self.run_case(case, false);
            let now = self.f.tables();
            if now != *before {
                self.fail(
                    case,
                    case.order[0],
                    None,
                    &format!(
                        "a packet that cannot be for a service changed the flow or fragment \
                         tables: {}",
                        table_diff(before, &now)
                    ),
                );
            }
        }
        panic!(
            "packets #{}.. that cannot be for a service changed the tables together but not \
             alone: {}; LB_FUZZ_SEED={:#x}",
            cases.first().map_or(0, |c| c.index),
            table_diff(before, after),
            self.seed
        );
    }

    /// Runs `case` through the three programs in its order and checks every run; `counted`:
    /// also checks each run's outcome counter (a few syscalls per run, so only where the
    /// outcome is not known in advance).
    fn run_case(&mut self, case: &Case, counted: bool) -> Vec<(Prog, Outcome)> {
        let mut done = Vec::with_capacity(3);
        for prog in case.order {
            let ctx = if prog == Prog::Xdp {
                None
            } else {
                case.ingress_ifindex
            };
            let res = self.f.test_run(prog, &case.frame, ctx);
            let (o, out) = self.check(case, prog, res);
            if counted {
                self.check_counted(case, prog, o, out.as_deref());
            }
            if let (Outcome::Translated, Some(out)) = (o, &out) {
                self.generator.observe(&case.frame, out);
                *self.stats.translated.entry(case.kind).or_default() += 1;
            }
            let s = &mut self.stats.progs[prog as usize];
            s.runs += 1;
            match o {
                Outcome::Refused => s.refused += 1,
                Outcome::Passed => s.passed += 1,
                Outcome::Translated => s.translated += 1,
                Outcome::Dropped => s.dropped += 1,
            }
            done.push((prog, o));
        }
        done
    }

    /// Invariants 1–4 for one run (the counters apart).
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
        let outcome = match (prog, run.verdict) {
            (Prog::Xdp, XDP_PASS) if run.meta.is_some() => Outcome::Translated,
            (Prog::Xdp, XDP_PASS) => Outcome::Passed,
            (Prog::Xdp, XDP_DROP) => Outcome::Dropped,
            (Prog::TcIngress | Prog::TcEgress, TC_ACT_UNSPEC) => Outcome::Passed,
            (Prog::TcIngress | Prog::TcEgress, TC_ACT_OK) => Outcome::Translated,
            (Prog::TcIngress | Prog::TcEgress, TC_ACT_SHOT) => Outcome::Dropped,
            (_, v) => self.fail(
                case,
                prog,
                Some(out),
                &format!("verdict {v:#x} is not one {prog:?} may give"),
            ),
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
            Outcome::Translated => {
                if let Some(at) = foreign_change(input, out) {
                    self.fail(
                        case,
                        prog,
                        Some(out),
                        &format!(
                            "translated, and changed byte {at}, which is no address, port or \
                             checksum (or the length)"
                        ),
                    );
                }
                let held: Vec<&str> = checksums(input)
                    .into_iter()
                    .filter_map(|(name, ok)| ok.then_some(name))
                    .collect();
                let after = checksums(out);
                if let Some(broken) = held.iter().find(|n| !after.contains(&(**n, true))) {
                    self.fail(
                        case,
                        prog,
                        Some(out),
                        &format!(
                            "translated, and the {broken} checksum, which held, no longer \
                             does ({after:?})"
                        ),
                    );
                }
                if !held.is_empty() {
                    self.stats.progs[prog as usize].sums_kept += 1;
                }
                for name in held {
                    *self.stats.kept.entry(name).or_default() += 1;
                }
            }
            _ => {}
        }
        (outcome, Some(run.out))
    }

    /// The run counted exactly one outcome, and the one its verdict implies.
    fn check_counted(&mut self, case: &Case, prog: Prog, o: Outcome, out: Option<&[u8]>) {
        let now = self.outcome_counts(prog);
        let before = std::mem::replace(&mut self.counted[prog as usize], now.clone());
        let moved: Vec<(Reason, u64)> = outcomes()
            .into_iter()
            .zip(before.iter().zip(&now))
            .map(|(r, (b, a))| (r, a - b))
            .filter(|(_, d)| *d > 0)
            .collect();
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
                    "{o:?}, and counted {moved:?}: a run counts one outcome, its own (a drop: \
                     nat_failed, masq_failed on egress, malformed only once the parser accepted \
                     the packet, whose lengths then hold)"
                ),
            );
        }
        if let [(r, _)] = moved.as_slice() {
            let label = Reason::ALL[*r as usize].1;
            *self.stats.progs[prog as usize]
                .reasons
                .entry(label)
                .or_default() += 1;
        }
    }

    fn summary(&self, packets: usize, secs: f64) {
        let s = &self.stats;
        println!(
            "{}: seed {:#x}, {packets} packets ({} that cannot be for a service), {} runs in \
             {secs:.1} s; tables emptied {} times",
            self.test,
            self.seed,
            s.untouchable,
            s.progs.iter().map(|p| p.runs).sum::<usize>(),
            s.flushes,
        );
        println!(
            "  {:<16}{:>8}{:>15}{:>9}",
            "kind", "clean", "valid-mutated", "garbage"
        );
        let kinds: Vec<Kind> = {
            let mut k: Vec<Kind> = s.packets.keys().map(|(k, _)| *k).collect();
            k.dedup();
            k
        };
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
        let muts: Vec<String> = s
            .mutations
            .iter()
            .map(|(m, n)| format!("{m} {n}"))
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
        for prog in Prog::ALL {
            let r: Vec<String> = s.progs[prog as usize]
                .reasons
                .iter()
                .map(|(l, n)| format!("{l} {n}"))
                .collect();
            println!(
                "  {prog:?} outcomes (packets that may be for a service): {}",
                r.join(", ")
            );
        }
        let events = self.events();
        for prog in Prog::ALL {
            let e: Vec<String> = events
                .iter()
                .filter(|(p, ..)| *p == prog)
                .map(|(_, r, n)| format!("{} {n}", Reason::ALL[*r as usize].1))
                .collect();
            println!("  {prog:?} events: {}", e.join(", "));
        }
        let t: Vec<String> = s
            .translated
            .iter()
            .map(|(k, n)| format!("{k:?} {n}"))
            .collect();
        println!("  translated, by kind: {}", t.join(", "));
        let k: Vec<String> = s.kept.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!("  checksums kept through a translation: {}", k.join(", "));
    }

    /// What the programs counted besides outcomes (new flows, masquerade claims, port clashes,
    /// ...), per program, from the counters.
    fn events(&self) -> Vec<(Prog, Reason, u64)> {
        let counts = self.f.dp.reasons().unwrap();
        Prog::ALL
            .into_iter()
            .flat_map(|prog| {
                counts
                    .iter()
                    .filter(move |(hook, r, n)| *hook == prog.hook() && !is_outcome(*r) && *n > 0)
                    .map(move |(_, r, n)| (prog, *r, *n))
            })
            .collect()
    }

    /// The run must have reached what it is for, so that a generator gone blind fails rather
    /// than passes: every program translated packets with valid checksums and passed others;
    /// every kind of checksum was kept through a translation; later fragments, ICMP errors and
    /// replies were translated; with masquerade `always`, flows were masqueraded. (Checked
    /// from [`COVERAGE_FROM`] packets on, where each of these happens hundreds of times.)
    fn assert_coverage(&self, masquerade: Masquerade) {
        let seed = self.seed;
        for prog in Prog::ALL {
            let p = &self.stats.progs[prog as usize];
            assert!(
                p.sums_kept > 0 && p.passed > 0,
                "{prog:?} translated no packet with valid checksums, or passed none: the \
                 generator no longer reaches it (LB_FUZZ_SEED={seed:#x})"
            );
        }
        for sum in [
            "TCP",
            "UDP",
            "UDP checksum 0 (none)",
            "SCTP CRC32c",
            "ICMP",
            "quoted IPv4 header",
        ] {
            assert!(
                self.stats.kept.contains_key(sum),
                "no translation re-checked a {sum} checksum (LB_FUZZ_SEED={seed:#x})"
            );
        }
        for kind in [
            Kind::LaterFragment,
            Kind::IcmpQuote,
            Kind::Reply,
            Kind::Forwarded,
        ] {
            assert!(
                self.stats.translated.contains_key(&kind),
                "no {kind:?} packet was translated (LB_FUZZ_SEED={seed:#x})"
            );
        }
        if masquerade == Masquerade::Always {
            assert!(
                self.events()
                    .iter()
                    .any(|(p, r, _)| *p == Prog::TcEgress && *r == Reason::MasqNew),
                "masquerade `always` masqueraded no flow (LB_FUZZ_SEED={seed:#x})"
            );
        }
    }
}

/// What `after` holds that `before` does not (new or changed entries), readably.
fn table_diff(before: &Tables, after: &Tables) -> String {
    let port = |p: u16| u16::from_be(p);
    let flows = after
        .flows
        .iter()
        .filter(|e| !before.flows.contains(e))
        .map(|(k, v)| {
            format!(
                "flow proto {} {}:{} -> {}:{} => {}:{} -> {}:{} flags {:#x}",
                k.proto,
                ip(k.saddr),
                port(k.sport),
                ip(k.daddr),
                port(k.dport),
                ip(v.saddr),
                port(v.sport),
                ip(v.daddr),
                port(v.dport),
                v.flags
            )
        });
    let frags = after
        .frags
        .iter()
        .filter(|e| !before.frags.contains(e))
        .map(|(k, v)| {
            format!(
                "fragment record proto {} {} -> {} id {} => ports {} -> {}",
                k.proto,
                ip(k.saddr),
                ip(k.daddr),
                k.id,
                port(v.sport),
                port(v.dport)
            )
        });
    let gone = before
        .flows
        .iter()
        .filter(|(k, _)| !after.flows.iter().any(|e| e.0 == *k))
        .count()
        + before
            .frags
            .iter()
            .filter(|(k, _)| !after.frags.iter().any(|e| e.0 == *k))
            .count();
    let mut all: Vec<String> = flows.chain(frags).collect();
    if gone > 0 {
        all.push(format!("{gone} entries gone"));
    }
    all.join("; ")
}

fn packets_total() -> usize {
    count_from_env("LB_FUZZ_PACKETS", DEFAULT_PACKETS)
}

fn packets_per_test() -> usize {
    packets_total().div_ceil(FUZZ_TESTS)
}

fn fuzz(test: &'static str, stream: u64, masquerade: Masquerade) {
    if !require_root(test) {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    println!("{test}: LB_FUZZ_SEED={seed:#x}");
    let mut fuzz = Fuzz::new(test, seed, stream, masquerade);
    let packets = packets_per_test();
    fuzz.run(packets);
    if packets >= COVERAGE_FROM {
        fuzz.assert_coverage(masquerade);
    }
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
    let cases: Vec<Case> = (0..5000).map(|i| g.case(i)).collect();
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
