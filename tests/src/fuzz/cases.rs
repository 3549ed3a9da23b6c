//! What the tiers generate alike: cases and their classes, the tuples and targets a generator
//! follows up on, and the tier a family brings.
use super::*;

// What the tiers generate and run alike: cases, the tuples a generator follows up on, and the
// runner.

/// Packets a fuzz target generates unless `LB_FUZZ_PACKETS` says otherwise.
pub const DEFAULT_PACKETS: usize = 100_000;
/// Packets generated at once. A round runs the packets that may be for a service first, then
/// those that cannot be, with the flow and fragment tables read before and after the second
/// phase (a read costs a few µs per entry: per packet it would cost more than the packet).
pub const ROUND: usize = 500;
/// Flow entries beyond which the tables are emptied between rounds, keeping reads cheap.
pub const TABLE_CAP: usize = 800;
/// Packets per test from which a run must reach every path it is for (see
/// [`Fuzz::assert_coverage`]).
pub const COVERAGE_FROM: usize = 20_000;
/// Ports a packet to a service address goes to, mostly: the fixture's services' ports, their
/// targets, and ports no service has.
pub const PORTS: [u16; 8] = [443, 80, 53, 8080, 5353, 9000, 9100, 7070];

/// `LB_FUZZ_PACKETS`, or [`DEFAULT_PACKETS`].
pub fn packets_from_env() -> usize {
    count_from_env("LB_FUZZ_PACKETS", DEFAULT_PACKETS)
}

/// How a case was generated (for the summary, the coverage checks and reproducing a failure).
/// Each tier generates the kinds of its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// TCP (any flags), UDP or SCTP from a client to a VIP, a published port or a near miss.
    ToService,
    /// The first fragment (more to come, offset 0) of such a datagram; in the IPv6 tier also
    /// of a reply or a forwarded packet of a flow a program translated.
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
    /// An ICMP (ICMPv6) message quoting a tracked tuple (or a fresh one), from a router or an
    /// endpoint.
    IcmpQuote,
    /// TCP, UDP, SCTP, ICMP (ICMPv6), fragments and other protocols between addresses no
    /// service uses.
    NonService,
    /// The IPv4 tier's ARP requests.
    Arp,
    /// The IPv4 tier's IPv6 frames.
    Ipv6,
    /// The IPv4 tier's service packets behind an 802.1Q (or QinQ) tag.
    Vlan,
    /// The IPv4 tier's other ethertypes, and IPv4 under a wrong ethertype.
    OtherEthertype,
    /// The IPv6 tier's frames of its no-service test.
    Wild,
}

/// What a case's checksums are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// As built: valid checksums, honest headers.
    Clean,
    /// Structural mutations, checksums fixed up to match what the headers claim.
    ValidMutated,
    /// Checksums as they fell, or garbage on purpose: nothing a translation must keep.
    Garbage,
}

/// One generated packet and how to run it; `M` is the tier's mutation.
#[derive(Clone, Debug)]
pub struct Case<M> {
    pub index: usize,
    pub kind: Kind,
    pub class: Class,
    pub mutations: Vec<M>,
    pub frame: Vec<u8>,
    /// The order the three programs see it in.
    pub order: [Prog; 3],
    /// The TC runs' ingress interface (`Some(1)`: a hairpin on loopback), or no context.
    pub ingress_ifindex: Option<u32>,
    /// Cannot be for a service: must pass untouched everywhere.
    pub untouchable: bool,
}

/// How a tier makes a case of a frame it built.
pub struct Cases<M: 'static> {
    /// How many structural mutations a case gets: one of these, drawn.
    pub rounds: &'static [usize],
    pub structural: &'static [M],
    /// The mutations garbage by nature.
    pub garbage: &'static [M],
    /// Makes every checksum of a frame hold, by the layout it claims.
    pub fix: fn(&mut [u8]),
    /// The TC runs' ingress interface, drawn (or not) last.
    pub ingress: fn(&mut Rng) -> Option<u32>,
    /// Whether a frame cannot be for a service.
    pub untouchable: fn(&[u8]) -> bool,
}

impl<M: Copy> Cases<M> {
    /// Case `index`, of `kind`: `frame` made valid (55%: structural mutations, then its
    /// checksums fixed up, so only the lies are wrong) or garbage (structural mutations and,
    /// 60% of the time, one garbage by nature; checksums as they fall), `apply` applying each
    /// mutation; the programs' order shuffled.
    pub fn case(
        &self,
        rng: &mut Rng,
        index: usize,
        kind: Kind,
        mut frame: Vec<u8>,
        mut apply: impl FnMut(M, &mut Rng, &mut Vec<u8>),
    ) -> Case<M> {
        let valid = rng.percent(55);
        let mut mutations = Vec::new();
        for _ in 0..rng.pick(self.rounds) {
            let m = rng.pick(self.structural);
            apply(m, rng, &mut frame);
            mutations.push(m);
        }
        if valid {
            (self.fix)(&mut frame);
        } else if rng.percent(60) {
            let m = rng.pick(self.garbage);
            apply(m, rng, &mut frame);
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
            order,
            ingress_ifindex: (self.ingress)(rng),
            untouchable: (self.untouchable)(&frame),
            frame,
        }
    }
}

/// An address and port pair each way, as in a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple<A> {
    pub saddr: A,
    pub sport: u16,
    pub daddr: A,
    pub dport: u16,
}

impl<A: Copy> Tuple<A> {
    pub fn new(saddr: A, sport: u16, daddr: A, dport: u16) -> Self {
        Tuple {
            saddr,
            sport,
            daddr,
            dport,
        }
    }

    pub fn reversed(self) -> Self {
        Tuple::new(self.daddr, self.dport, self.saddr, self.sport)
    }

    /// This tuple or its reverse, even odds.
    pub fn either_way(self, rng: &mut Rng) -> Self {
        if rng.percent(50) {
            self
        } else {
            self.reversed()
        }
    }

    /// A tuple between `saddr` and `daddr` with a source port of anything, a client's or a
    /// server's, and a destination port of anything or of `dports`.
    pub fn between(rng: &mut Rng, saddr: A, daddr: A, dports: &[u16]) -> Self {
        let any = rng.u16();
        let sport = rng.pick(&[any, 40000, 443]);
        let dport = rng.pick(&[&[any], dports].concat());
        Tuple::new(saddr, sport, daddr, dport)
    }

    /// Who sends an ICMP error about a packet of this tuple, and to whom: mostly `router` on
    /// the path or the packet's destination, to its source; now and then the node is either
    /// end, or `client` the receiver.
    pub fn error_ends(self, rng: &mut Rng, router: A, node: A, client: A) -> (A, A) {
        let src = rng.pick(&[router, router, self.daddr, node]);
        let dst = rng.pick(&[self.saddr, self.saddr, node, client]);
        (src, dst)
    }
}

impl Tuple<Ipv4Addr> {
    /// The addresses of `frame`'s IPv4 header (untagged, right after the Ethernet header) and
    /// the ports at frame offset `l4`.
    pub fn of(frame: &[u8], l4: usize) -> Self {
        Tuple::at(frame, ETH_HLEN, Some(l4))
    }

    /// A packet of `proto` (TCP, UDP, SCTP) with this tuple.
    pub fn packet(self, proto: u8) -> Ipv4Packet {
        let p = Ipv4Packet::tcp(self.saddr, self.sport, self.daddr, self.dport);
        Ipv4Packet { proto, ..p }
    }
}

impl Tuple<Ipv6Addr> {
    /// A packet of `proto` (TCP, UDP, SCTP) with this tuple.
    pub fn packet(self, proto: u8) -> Ipv6Packet {
        let p = Ipv6Packet::tcp(self.saddr, self.sport, self.daddr, self.dport);
        Ipv6Packet { proto, ..p }
    }
}

impl<A: Family> Tuple<A> {
    /// The addresses of the IP header at frame offset `ip` and the ports at `l4` (none, 0:
    /// a later fragment).
    pub fn at(frame: &[u8], ip: usize, l4: Option<usize>) -> Self {
        let port = |at: usize| be16(frame, at);
        let (saddr, daddr) = A::addrs(frame, ip);
        Tuple {
            saddr,
            daddr,
            sport: l4.map_or(0, port),
            dport: l4.map_or(0, |l4| port(l4 + 2)),
        }
    }

    /// What an entry rewrites a packet to.
    pub fn of_entry(e: &FlowOf<A::Map>) -> Self {
        let port = u16::from_be;
        let ip = A::of_map;
        Tuple::new(ip(e.saddr), port(e.sport), ip(e.daddr), port(e.dport))
    }

    /// The flow key of a packet of `proto` with this tuple.
    pub fn key(self, proto: u8) -> FlowKeyOf<A::Map> {
        FlowKeyOf {
            saddr: self.saddr.to_map(),
            daddr: self.daddr.to_map(),
            sport: self.sport.to_be(),
            dport: self.dport.to_be(),
            proto,
            _pad: [0; 3],
        }
    }

    /// The record key of the datagram `id` of `proto` with this tuple's addresses.
    pub fn frag_key(self, proto: u8, id: u32) -> <A::Map as MapFamily>::FragKey {
        A::Map::frag_key(self.saddr.to_map(), self.daddr.to_map(), id, proto)
    }
}

/// Where a packet's headers are, as the programs' parser claims them, in either family: its
/// IP header, its upper-layer header (a later fragment's data), its protocol and where it
/// stands in its datagram.
#[derive(Clone, Copy, Debug)]
pub struct Headers {
    pub ip: usize,
    pub l4: usize,
    pub proto: u8,
    pub frag: Frag,
}

impl From<Ipv6Layout> for Headers {
    fn from(l: Ipv6Layout) -> Self {
        Headers {
            ip: l.ip,
            l4: l.l4,
            proto: l.proto,
            frag: l.frag,
        }
    }
}

/// An address family as the fuzz tiers check a translation against its flow entry
/// ([`Fuzz`]'s entry check): its address (`Ipv4Addr`, `Ipv6Addr`) in a packet and in the maps,
/// and where a packet's headers, and an ICMP error's quote, are.
pub trait Family: Copy + fmt::Debug + fmt::Display + PartialEq + 'static {
    /// The family's map address (`u32`, `Addr6`).
    type Map: MapFamily;
    /// The family's name, and its ICMP's name and protocol number.
    const NAME: &'static str;
    const ICMP: (&'static str, u8);
    /// The source and destination addresses of the IP header at frame offset `ip`.
    fn addrs(frame: &[u8], ip: usize) -> (Self, Self);
    fn to_map(self) -> Self::Map;
    fn of_map(a: Self::Map) -> Self;
    /// The headers of `frame` as the programs' parser reads them, or `None` when it is no
    /// packet of the family.
    fn headers(frame: &[u8]) -> Option<Headers>;
    /// The headers of the packet an ICMP error (whose headers are `h`) quotes, if it is an
    /// error the programs translate and it quotes a packet of the family.
    fn quote(frame: &[u8], h: &Headers) -> Option<Headers>;
}

impl Family for Ipv4Addr {
    type Map = u32;
    const NAME: &'static str = "IPv4";
    const ICMP: (&'static str, u8) = ("ICMP", IPPROTO_ICMP);
    fn addrs(frame: &[u8], ip: usize) -> (Self, Self) {
        let at = |at: usize| Ipv4Addr::from(<[u8; 4]>::try_from(&frame[at..at + 4]).unwrap());
        (at(ip + IP_ADDRS.start), at(ip + IP_ADDRS.start + 4))
    }
    fn to_map(self) -> u32 {
        be4(self)
    }
    fn of_map(a: u32) -> Self {
        Ipv4Addr::from(a.to_ne_bytes())
    }
    fn headers(frame: &[u8]) -> Option<Headers> {
        let l = ipv4(frame)?;
        Some(Headers {
            ip: ETH_HLEN,
            l4: l.l4(),
            proto: l.proto,
            frag: frag4(&frame[ETH_HLEN..]),
        })
    }
    /// Destination unreachable, time exceeded and parameter problem (lb-ebpf
    /// `parse::packet4`); the quoted header's fragment bits are not looked at there.
    fn quote(frame: &[u8], h: &Headers) -> Option<Headers> {
        let error = h.proto == IPPROTO_ICMP
            && !matches!(h.frag, Frag::Later(_))
            && [3, 11, 12].contains(frame.get(h.l4)?);
        let q = h.l4 + ICMP_QUOTE;
        let ip = frame.get(q..q + 20).filter(|_| error)?;
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        (ip[0] >> 4 == 4 && ihl >= 20).then(|| Headers {
            ip: q,
            l4: q + ihl,
            proto: ip[IP_PROTO],
            frag: frag4(ip),
        })
    }
}

/// Where the IPv4 packet whose header `ip` starts with stands in its datagram.
pub(super) fn frag4(ip: &[u8]) -> Frag {
    let (id, bits) = (u32::from(be16(ip, 4)), be16(ip, IP_FRAG));
    match (bits & 0x1fff, bits & 0x2000 != 0) {
        (0, false) => Frag::Whole,
        (0, true) => Frag::First(id),
        _ => Frag::Later(id),
    }
}

impl Family for Ipv6Addr {
    type Map = Addr6;
    const NAME: &'static str = "IPv6";
    const ICMP: (&'static str, u8) = ("ICMPv6", IPPROTO_ICMPV6);
    fn addrs(frame: &[u8], ip: usize) -> (Self, Self) {
        let at = ip + IP6_ADDRS.start;
        (addr6_at(frame, at), addr6_at(frame, at + 16))
    }
    fn to_map(self) -> Addr6 {
        be6(self)
    }
    fn of_map(a: Addr6) -> Self {
        ip6(a)
    }
    fn headers(frame: &[u8]) -> Option<Headers> {
        ipv6(frame).map(Headers::from)
    }
    fn quote(frame: &[u8], h: &Headers) -> Option<Headers> {
        let l = ipv6(frame).filter(|l| l.ip == h.ip)?;
        l.quote(frame).map(Headers::from)
    }
}

/// A translation a program made: the tuple before and after.
#[derive(Clone, Copy, Debug)]
pub struct Seen<A> {
    pub proto: u8,
    pub before: Tuple<A>,
    pub after: Tuple<A>,
}

impl<A: Copy> Seen<A> {
    /// The tuple of a packet that follows up on the translation as `kind` says: the same again
    /// (`Resend`), the reverse of what it became (`Reply`), what it became sent on
    /// (`Forwarded`).
    pub fn follow_up(&self, kind: Kind) -> Tuple<A> {
        match kind {
            Kind::Resend => self.before,
            Kind::Reply => self.after.reversed(),
            Kind::Forwarded => self.after,
            _ => unreachable!("{kind:?} follows up on no translation"),
        }
    }

    /// One of the four tuples the flow's packets carry, for an ICMP error to quote: as
    /// translated or not, either way.
    pub fn any_tuple(&self, rng: &mut Rng) -> Tuple<A> {
        match rng.below(4) {
            0 => self.before,
            1 => self.after,
            2 => self.before.reversed(),
            _ => self.after.reversed(),
        }
    }
}

/// What a generator learnt for packets that follow up on what came before: the latest 64
/// translations the programs made, and the latest 32 first fragments (`P`: a packet builder)
/// it made.
pub struct Memory<A, P> {
    seen: VecDeque<Seen<A>>,
    firsts: VecDeque<P>,
}

impl<A, P> Default for Memory<A, P> {
    fn default() -> Self {
        Memory {
            seen: VecDeque::new(),
            firsts: VecDeque::new(),
        }
    }
}

impl<A: Copy, P> Memory<A, P> {
    /// Forgets it all: the tables were emptied, and what follows up on the flows they held
    /// would only meet no flow.
    pub fn forget(&mut self) {
        self.seen.clear();
        self.firsts.clear();
    }

    pub fn observe(&mut self, seen: Seen<A>) {
        if self.seen.len() == 64 {
            self.seen.pop_front();
        }
        self.seen.push_back(seen);
    }

    /// Remembers a first fragment, for later ones to follow.
    pub fn first(&mut self, p: P) {
        if self.firsts.len() == 32 {
            self.firsts.pop_front();
        }
        self.firsts.push_back(p);
    }

    /// A translation seen, drawn; `None` before the first (and no draw).
    pub fn recall(&self, rng: &mut Rng) -> Option<Seen<A>> {
        (!self.seen.is_empty()).then(|| self.seen[rng.below(self.seen.len())])
    }
}

impl<A, P: Clone> Memory<A, P> {
    /// A first fragment made before (85% of the time, when there is one).
    pub fn recall_first(&self, rng: &mut Rng) -> Option<P> {
        (!self.firsts.is_empty() && rng.percent(85))
            .then(|| self.firsts[rng.below(self.firsts.len())].clone())
    }
}

/// Where a tier's packets for a service go, and from where ([`Targets::tuple`]).
pub struct Targets<A: 'static> {
    /// A service address: drawn, or the one there is.
    pub vip: fn(&mut Rng) -> A,
    /// Published ports per protocol, on the addresses that publish them.
    pub tcp: &'static [(A, u16)],
    pub udp: &'static [(A, u16)],
    pub sctp: &'static [(A, u16)],
    /// Published ports on addresses that do not publish them, and ports nobody publishes.
    pub near_misses: &'static [(A, u16)],
    /// Clients, a backend among them (reaching its own service: a hairpin).
    pub clients: &'static [A],
}

impl<A: Copy> Targets<A> {
    /// A client's tuple of `proto` to a VIP (mostly at one of [`PORTS`]), a published port or
    /// a near miss.
    pub fn tuple(&self, rng: &mut Rng, proto: u8) -> Tuple<A> {
        let (daddr, dport) = match rng.below(10) {
            0..=3 => {
                let vip = (self.vip)(rng);
                let port = if rng.percent(80) {
                    rng.pick(&PORTS)
                } else {
                    rng.u16()
                };
                (vip, port)
            }
            4..=7 => rng.pick(match proto {
                IPPROTO_TCP => self.tcp,
                IPPROTO_UDP => self.udp,
                _ => self.sctp,
            }),
            _ => rng.pick(self.near_misses),
        };
        let saddr = rng.pick(self.clients);
        // Few client ports, so that flows are met again: resent, reopened, clashing.
        let sport = if rng.percent(90) {
            40000 + rng.below(16) as u16
        } else {
            rng.u16()
        };
        Tuple::new(saddr, sport, daddr, dport)
    }
}

/// A tier's generator, for what both tiers draw alike: packets to a service, and the packets
/// ICMP errors quote.
pub trait Generator {
    /// The family's address (`Ipv4Addr`, `Ipv6Addr`) and packet builder.
    type Ip: Copy + 'static;
    type Packet;
    /// Where its packets for a service go.
    const TARGETS: Targets<Self::Ip>;

    fn rng(&mut self) -> &mut Rng;
    /// A packet of `proto` (TCP, UDP, SCTP) with tuple `t`, as built by default.
    fn packet(t: Tuple<Self::Ip>, proto: u8) -> Self::Packet;
    fn tuple_of(p: &Self::Packet) -> Tuple<Self::Ip>;
    /// Dresses `p` in the tier's random flags, payload and headers.
    fn dress(&mut self, p: &mut Self::Packet);

    /// A packet of `proto` with tuple `t`, dressed.
    fn dressed(&mut self, t: Tuple<Self::Ip>, proto: u8) -> Self::Packet {
        let mut p = Self::packet(t, proto);
        self.dress(&mut p);
        p
    }

    /// A client's packet of `proto` to a service address, a published port or a near miss.
    fn service_packet(&mut self, proto: u8) -> Self::Packet {
        let t = Self::TARGETS.tuple(self.rng(), proto);
        self.dressed(t, proto)
    }

    /// What an ICMP error quotes, and its tuple: mostly (85%) a packet of a translation seen
    /// (any of its four tuples), or else a fresh packet to a service, either way.
    fn quoted(
        &mut self,
        seen: Option<Seen<Self::Ip>>,
        proto: u8,
    ) -> (Tuple<Self::Ip>, Self::Packet) {
        let (quoted, proto) = match seen {
            Some(s) if self.rng().percent(85) => (s.any_tuple(self.rng()), s.proto),
            _ => {
                let p = self.service_packet(proto);
                (Self::tuple_of(&p).either_way(self.rng()), proto)
            }
        };
        (quoted, self.dressed(quoted, proto))
    }
}

/// TCP flags of a generated packet: mostly a SYN, an ACK, a close (FIN, RST), now and then
/// anything.
pub fn tcp_flags(rng: &mut Rng) -> u8 {
    let any = rng.u8();
    rng.pick(&[
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
    ])
}

/// How many bytes of a packet (`len` from its IP header on, its L4 header `l4` bytes in) an
/// ICMP error quotes: mostly up to 8 bytes into the L4 header, as RFC 792 asks (which holds
/// the ports), or all of it, or too few for the ports, or any length.
pub fn quote_len(rng: &mut Rng, l4: usize, len: usize) -> usize {
    let want = match rng.below(10) {
        0..=5 => l4 + 8,
        6 | 7 => len,
        8 => l4 + 4,
        _ => rng.below(len + 1),
    };
    want.min(len)
}

/// The outcomes each program counted between two reads of `EbpfNetwork::reasons`, checked
/// against what a round of runs may count: one outcome per run that ran (`ran`, by program)
/// and only outcomes of `allowed` (nothing else either: no event of a new flow). `round`
/// names the runs in a failure. Returns them.
pub fn round_counted(
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

/// A fuzz tier as [`Fuzz`] runs it: its family, its generator (the tier itself), and what it
/// checks beyond what every tier checks.
pub trait Tier: Generator<Ip: Family<Map = Self::Addr>> + Sized {
    /// The family's map address (`u32`, `Addr6`).
    type Addr: MapFamily;
    type Mutation: Copy + fmt::Debug + Ord;
    /// The test target (`cargo test --test`) the tier's tests are in.
    const TARGET: &'static str;
    /// How many tests of the target share `LB_FUZZ_PACKETS` between them.
    const SHARE: usize;
    /// Every outcome a packet that cannot be for a service may have.
    const NOT_FOR_A_SERVICE: &'static [Reason];
    /// The checksums (by [`Tier::checksums`]'s names) a long run must have kept through a
    /// translation.
    const KEPT: &'static [&'static str];
    /// The roles the entry check holds a translation to ([`Fuzz::check_entry`]): the backends
    /// a packet to a service goes to, the addresses a reply leaves from (services' and the
    /// node's), the node's address a masqueraded packet leaves from.
    const BACKENDS: &'static [Self::Ip];
    const REPLY_FROM: &'static [Self::Ip];
    const MASQ: Self::Ip;

    fn case(&mut self, index: usize) -> Case<Self::Mutation>;
    /// What the generator learnt from the translations.
    fn memory(&mut self) -> &mut Memory<Self::Ip, Self::Packet>;
    /// Forgets what the generator learnt: the tables were emptied.
    fn forget(&mut self) {
        self.memory().forget();
    }
    /// [`foreign_change`] of the family.
    fn foreign_change(input: &[u8], output: &[u8]) -> Option<usize>;
    /// [`checksums`] of the family.
    fn checksums(frame: &[u8]) -> Vec<(&'static str, bool)>;
    /// The name a checksum that held must hold under after a translation: its own, unless
    /// the translation must give the packet another kind of checksum.
    fn kept_as(name: &'static str) -> &'static str {
        name
    }
    /// [`lengths_hold`] of the family: a run may drop a packet as `malformed` only then.
    fn lengths_hold(frame: &[u8]) -> bool;
    /// Whether a run of `prog` that passed its packet may have counted `r`.
    fn pass_fits(prog: Prog, r: Reason) -> bool;
    /// Those outcomes, as a failure names them.
    fn passes() -> String;
    /// The tier's own checks of a translated run (after what changed and the checksums,
    /// before the entry check).
    fn translated(_fuzz: &mut Fuzz<Self>, _case: &Case<Self::Mutation>, _prog: Prog, _out: &[u8]) {}
    /// The tier's own checks after each round, whose first packet is `first`.
    fn round_done(_fuzz: &mut Fuzz<Self>, _first: usize) {}
    /// What else a long run of the tier must have reached.
    fn assert_coverage(_fuzz: &Fuzz<Self>) {}
}
