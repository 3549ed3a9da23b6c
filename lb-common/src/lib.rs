//! What the eBPF programs and the controller must agree on, byte for byte: map key and value
//! layouts, limits, the bucket math that turns a flow into a backend, the flow lifecycle rules
//! and the checksum arithmetic of a rewrite.
//!
//! This crate is compiled into both sides (`no_std` for the programs, `user` feature for the
//! controller), so a layout, a partition rule or a timeout rule cannot drift between them: there
//! is no second copy to forget, and what the programs do can be unit-tested on the host. Every
//! multi-byte address and port in a map layout is in network byte order, exactly as it stands
//! in the packet, so the hot path never swaps bytes.
#![no_std]

pub mod crc32c;
pub mod csum;
pub mod dsr;
pub mod filter;
pub mod flow;
pub mod hash;

/// Size of the bucket space each VIP's and each published port's backends are partitioned
/// over (moby's `numgen random mod 65536`; here the low 16 bits of the flow hash).
pub const BUCKETS: u32 = 65536;

/// Most backends one set can hold: beyond this a backend would get no bucket at all, so the
/// controller rejects larger sets instead of silently never using their tail.
pub const MAX_BACKENDS_PER_SET: u32 = BUCKETS;

// Map capacities. These are the defaults compiled into the object; `lb daemon` sets the first
// three per daemon (`--max-services`, `--max-backends`, `--max-flows`) when it creates a
// network's maps, and refuses, before saving, a desired state that would not fit the maps as
// they are (lb-user's `dataplane::ebpf::plan::Need`). The service, backend and counter maps
// are allocated per entry (BPF_F_NO_PREALLOC): their memory follows what exists, and the
// capacity is only a bound.

/// Capacity of the VIP map and, separately, of the published-port map (entries per network).
pub const MAX_SERVICES: u32 = 65536;
/// Capacity of the backend-slot map: every slot of every live set plus the sets being swapped
/// in, and the retired sets kept for one more sync. 2^19 holds 10,000 services of 10 backends
/// with a published port each (200,000 slots) even while every one of their sets changes.
pub const MAX_BACKEND_SLOTS: u32 = 1 << 19;
/// Capacity of the flow table (preallocated: an LRU). A flow takes two entries (one per
/// direction) and two more when it is masqueraded; at 2^18 a node holds 65k masqueraded or
/// 131k plain flows before the LRU starts evicting (which the flow hash survives, see [`flow`]).
pub const MAX_FLOWS: u32 = 1 << 18;
/// Capacity of the fragment map: IPv4 datagrams whose later fragments are still expected.
/// Fragments of one datagram arrive within microseconds of each other, so a small LRU is ample.
pub const MAX_FRAGS: u32 = 8192;
/// Capacity of the node-local address set (what a published port answers on).
pub const MAX_LOCAL_ADDRS: u32 = 1024;
/// Capacity of the per-CPU counter map: one counter per backend of a live set (a service's
/// total is its backends' sum), plus those retired and deleted at the next sync. Bounded by
/// what the backend map and the two service maps hold together, which also covers the
/// per-service counters an lb before the single-counter datapath left behind. Entries exist
/// only for what carried traffic (a counter is inserted by its first packet and deleted a
/// sync after its backend is gone): each costs 16 bytes per possible CPU, so its memory
/// follows the state, not this bound.
pub const fn max_counters(services: u32, backend_slots: u32) -> u32 {
    services.saturating_mul(2).saturating_add(backend_slots)
}
pub const MAX_COUNTERS: u32 = max_counters(MAX_SERVICES, MAX_BACKEND_SLOTS);
/// Capacity of the interface map (the network's interfaces, by ifindex).
pub const MAX_IFACES: u32 = 64;
/// Capacity of the local-endpoint map: the neighbours on the network's interfaces (the
/// containers of a node, the clients on its links) that the fast path can hand packets to.
pub const MAX_ENDPOINTS: u32 = 16384;
/// Capacity of the DSR session table (an LRU, preallocated): moby's three per-protocol maps of
/// 65536 sessions each, in one map whose key carries the protocol.
pub const MAX_DSR_SESSIONS: u32 = 3 * 65536;
/// Capacity of the DSR backend map: one entry per backend address of the network.
pub const MAX_DSR_BACKENDS: u32 = 65536;
/// Sockets of the node's own processes sent to a backend and remembered for the answer
/// (`lb_sock_rev`, an LRU: Cilium's size for its reverse socket map).
pub const MAX_SOCK_REV: u32 = 65536;
/// How long a DSR session lives without packets by default, in seconds (moby's 60 s).
pub const DSR_TIMEOUT_DEFAULT: u32 = 60;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;
pub const IPPROTO_ICMPV6: u8 = 58;

/// The most IPv6 extension headers (hop-by-hop, routing, destination options, AH, fragment)
/// the programs walk to find the L4 header, Cilium's bound: real traffic carries one or two
/// (a fragment header, a hop-by-hop one for MLD or jumbograms). A longer chain passes
/// untouched and counted ([`Reason::Ipv6Extension`]).
pub const IPV6_MAX_EXT_HEADERS: usize = 4;

/// An IPv6 address in a map layout: four words as they stand in the packet (network byte
/// order), so that it is compared and hashed a word at a time.
pub type Addr6 = [u32; 4];

/// An address of either family as the maps hold it: `u32` (IPv4) or [`Addr6`]. The layouts
/// that hold an address (`FlowKeyOf`, `FlowOf`, ...) and the rules over them ([`flow`],
/// [`hash::flow_hash`], [`csum::set_addr`]) are written once over it, for a twin of each
/// IPv4 map with IPv6 addresses (docs/dual-stack.md, "v4/v6 map pairs").
pub trait Addr: Copy + Default + PartialEq + Eq + core::fmt::Debug + 'static {
    /// The explicit padding of [`DsrSessionOf`] before its `u64`: none after IPv4's address
    /// (the layout of an lb before dual stack), 4 bytes after IPv6's.
    type SessionPad: Copy + Default + PartialEq + Eq + core::fmt::Debug + 'static;
    /// The address's 32-bit words (1 or 4).
    const WORDS: usize;
    /// Whether this is IPv4's (whose header has a checksum of its own).
    const V4: bool = Self::WORDS == 1;
    /// Word `i` (< [`Addr::WORDS`]) as it stands in the packet.
    fn word(&self, i: usize) -> u32;
    /// One word standing for the address in a hash: IPv4's own, so that IPv4 flow hashes are
    /// those of an lb before dual stack (a restart or upgrade moves no flow).
    fn hash_word(&self) -> u32;
    /// The unspecified address (every byte 0).
    fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl Addr for u32 {
    type SessionPad = [u8; 0];
    const WORDS: usize = 1;
    #[inline(always)]
    fn word(&self, _i: usize) -> u32 {
        *self
    }
    #[inline(always)]
    fn hash_word(&self) -> u32 {
        *self
    }
}

impl Addr for Addr6 {
    type SessionPad = [u8; 4];
    const WORDS: usize = 4;
    #[inline(always)]
    fn word(&self, i: usize) -> u32 {
        self[i & 3]
    }
    #[inline(always)]
    fn hash_word(&self) -> u32 {
        hash::jhash_3words(self[0], self[1], self[2], self[3])
    }
}

/// The interval `[start, end]` (inclusive) of the bucket space `0..length` that slot `index`
/// of `n` owns, moby's `EqualWeightIntervals`: `per = length / n` buckets each and the first
/// `length % n` slots one more, contiguous from 0. With `n > length` only the first `length`
/// slots get a (one-bucket) interval; every other slot, and any slot of an empty set, gets
/// `None`.
pub const fn bucket_interval(index: u32, n: u32, length: u32) -> Option<(u32, u32)> {
    let m = if n < length { n } else { length };
    if index >= m {
        return None;
    }
    let per = length / m;
    let rem = length % m;
    let start = index * per + if index < rem { index } else { rem };
    let size = per + if index < rem { 1 } else { 0 };
    Some((start, start + size - 1))
}

/// The slot whose [`bucket_interval`] over `0..length` contains `bucket`: the inverse of the
/// partition, computed without a scan so that the programs can call it per new flow.
#[inline(always)]
pub const fn slot_in(bucket: u32, n: u32, length: u32) -> Option<u32> {
    if n == 0 || bucket >= length {
        return None;
    }
    let m = if n < length { n } else { length };
    let per = length / m;
    let rem = length % m;
    // The first `rem` slots are `per + 1` wide; `rem * (per + 1) <= length`, so no overflow.
    let wide_end = rem * (per + 1);
    if bucket < wide_end {
        Some(bucket / (per + 1))
    } else {
        Some(rem + (bucket - wide_end) / per)
    }
}

/// The backend index that `bucket` (in `0..BUCKETS`) selects in a set of `n` backends.
/// The one bucket → backend function: the programs call it per new flow and the controller's
/// rendering of `lb elements` is checked against it, so both dataplanes agree bucket for bucket.
#[inline(always)]
pub const fn slot_for_bucket(bucket: u32, n: u32) -> Option<u32> {
    slot_in(bucket, n, BUCKETS)
}

/// Declares a map layout: `#[repr(C)]`, plain old data, and (with `user`) the aya and bytemuck
/// marker impls the controller needs to read and write it. Layouts carry explicit padding
/// fields so that no byte of a key is undefined (hash keys are compared bytewise).
macro_rules! map_layout {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }

        #[cfg(feature = "user")]
        // SAFETY: repr(C), every field is an integer, padding is explicit.
        unsafe impl aya::Pod for $name {}
    };
}

/// [`map_layout`] for a layout that holds addresses of either family: generic over the
/// [`Addr`] `A`, with the marker impls for both families and an alias for each (`$v4` for
/// IPv4, whose layouts are those of an lb before dual stack, and `$v6`), each checked to have
/// the size `$s4` / `$s6` its explicit padding gives.
macro_rules! family_layout {
    (@pod $t:ty) => {
        // SAFETY: repr(C), every field is an integer or an array of them, padding is explicit
        // (the sizes are asserted where the aliases are declared).
        #[cfg(feature = "user")]
        unsafe impl bytemuck::Zeroable for $t {}
        #[cfg(feature = "user")]
        unsafe impl bytemuck::Pod for $t {}
        #[cfg(feature = "user")]
        unsafe impl aya::Pod for $t {}
    };
    ($v4:ident = $s4:literal, $v6:ident = $s6:literal,
     $(#[$m:meta])* pub struct $name:ident<A> { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name<A> { $($(#[$fm])* pub $f: $t),* }

        #[doc = concat!("[`", stringify!($name), "`] of IPv4.")]
        pub type $v4 = $name<u32>;
        #[doc = concat!("[`", stringify!($name), "`] of IPv6.")]
        pub type $v6 = $name<Addr6>;
        const _: () = assert!(core::mem::size_of::<$v4>() == $s4);
        const _: () = assert!(core::mem::size_of::<$v6>() == $s6);

        family_layout!(@pod $v4);
        family_layout!(@pod $v6);
    };
}

/// Every pinned map with the version of its layout (key and value types, map type). A version
/// changes whenever its layout does (a capacity is not a layout: a pinned map of another size
/// is adopted with its size, which the controller reads and reports); the controller records the versions
/// it pinned in `lb_layout` and never adopts a pinned map whose recorded version differs (or
/// that predates the record, version 1): it refuses the network, or replaces the map where
/// that is safe ([`DISPOSABLE_MAPS`]; `lb_config`, converted) or asked, so a program never
/// reads a map written in another layout. Index `i` of `lb_layout` holds the version of `MAP_LAYOUTS[i]`:
/// append new maps, never reorder.
pub const MAP_LAYOUTS: [(&str, u32); 35] = [
    ("lb_vips", 1),
    ("lb_ports", 1),
    ("lb_backends", 1),
    ("lb_flows", 2),
    ("lb_local_addrs", 1),
    ("lb_ifaces", 1),
    ("lb_config", 3),
    ("lb_counters", 2),
    ("lb_frags", 1),
    ("lb_reasons", 6),
    ("lb_endpoints", 1),
    ("lb_dsr_sessions", 1),
    ("lb_dsr_backends", 1),
    ("lb_sock", 1),
    ("lb_sock_rev", 1),
    // The IPv6 twins of the maps that hold addresses (docs/dual-stack.md).
    ("lb_vips6", 1),
    ("lb_ports6", 1),
    ("lb_backends6", 1),
    ("lb_flows6", 1),
    ("lb_frags6", 1),
    ("lb_local_addrs6", 1),
    ("lb_ifaces6", 1),
    // Where each hook's IPv4 program finds its IPv6 twin, and the paths' working memory:
    // pinned so that programs left attached by a stopped controller keep both (a program
    // array no process holds is emptied by the kernel), and so that a restarted controller's
    // programs use the maps those attached use (`attach`: a hook is left alone then).
    ("lb_jump6_xdp", 1),
    ("lb_jump6_tc", 1),
    ("lb_slots", 1),
    ("lb_slots6", 1),
    ("lb_sock_rev6", 1),
    ("lb_endpoints6", 1),
    // DSR of IPv6 VIPs: the twins of `lb_dsr_sessions` and `lb_dsr_backends`.
    ("lb_dsr_sessions6", 1),
    ("lb_dsr_backends6", 1),
    // Since when the vetted fast path's judgments count (`flow::vetted`).
    ("lb_vetted_since", 1),
    // The vetted fast path's TCP flows whose node conntrack entries the controller made
    // liberal, and its requests to (`flow::judgeable`, `CtRequestOf`).
    ("lb_liberal", 1),
    ("lb_liberal6", 1),
    ("lb_ct_requests", 1),
    // Which addresses no packet of lb's can be to or from (`filter`).
    ("lb_addr_filter", 1),
];

/// Maps whose contents are statistics, short-lived hints (counters, outcome counts, the
/// ports of fragments in flight), what the controller rewrites whole from the node at every
/// apply (the local endpoints, the address filter, the DSR backends' MACs, the namespace the socket programs
/// serve, since when the vetted fast path's judgments count) or at every load (the IPv6 programs' slots), or a run's working memory: one pinned in another layout is
/// replaced without asking, since losing it costs no connection. Every other map of another
/// layout is refused unless the operator asks for the replacement.
pub const DISPOSABLE_MAPS: [&str; 18] = [
    "lb_counters",
    "lb_addr_filter",
    "lb_vetted_since",
    "lb_liberal",
    "lb_liberal6",
    "lb_ct_requests",
    "lb_frags",
    "lb_frags6",
    "lb_jump6_xdp",
    "lb_jump6_tc",
    "lb_slots",
    "lb_slots6",
    "lb_reasons",
    "lb_endpoints",
    "lb_endpoints6",
    "lb_dsr_backends",
    "lb_dsr_backends6",
    "lb_sock",
];

/// The map that records [`MAP_LAYOUTS`]' versions of a pin directory: an array of `u32`
/// whose own layout never changes.
pub const LAYOUT_MAP: &str = "lb_layout";
pub const LAYOUT_MAP_SLOTS: u32 = 64;

family_layout! {
    VipKey = 4, VipKey6 = 16,
    /// Key of the VIP map: the address every port of which the service answers on.
    pub struct VipKeyOf<A> {
        pub addr: A,
    }
}

family_layout! {
    PortKey = 8, PortKey6 = 20,
    /// Key of the published-port map. `addr` is the port's `host_ip`, or 0 for "any address of
    /// this node" (the programs check the local-address set before they look up with 0).
    pub struct PortKeyOf<A> {
        pub addr: A,
        pub port: u16,
        pub proto: u8,
        pub _pad: u8,
    }
}

map_layout! {
    /// Value of the VIP and published-port maps: which backend set serves the key and how big
    /// it is. The controller fills a new set's slots first and then replaces this value in one
    /// update, so a packet sees either the whole old set or the whole new one.
    pub struct Service {
        pub set_id: u32,
        /// Backends in the set; 0 means "claimed, nothing to send to": the packet passes (a
        /// DSR VIP's is dropped, as moby's `counter drop`).
        pub count: u32,
        /// A DSR VIP's ([`SERVICE_DSR`]) session idle timeout in seconds; 0 on every other
        /// service. (The field once held a per-service counter id, which no lb since the
        /// single-counter datapath writes: hence its place.)
        pub session_timeout: u32,
        /// `SERVICE_*` bits.
        pub flags: u32,
    }
}

/// [`Service::flags`]: a VIP of a `dsr` network: its packets are sent to the backend's MAC,
/// L3 and L4 untouched, by a session of `lb_dsr_sessions` (see [`DsrSession`]).
pub const SERVICE_DSR: u32 = 1 << 0;

map_layout! {
    /// Key of the backend-slot map: slot `slot` (0..count) of set `set_id`.
    pub struct BackendKey {
        pub set_id: u32,
        pub slot: u32,
    }
}

family_layout! {
    Backend = 12, Backend6 = 24,
    /// Value of the backend-slot map.
    pub struct BackendOf<A> {
        pub addr: A,
        /// Destination port to rewrite to, or 0 to keep the packet's (VIPs are port-agnostic).
        pub port: u16,
        pub _pad: u16,
        /// Id of this backend's counter in `lb_counters`.
        pub counter: u32,
    }
}

family_layout! {
    FlowKey = 16, FlowKey6 = 40,
    /// One direction of a tracked flow at one hook, as the packet carries it when it gets
    /// there (before translation).
    pub struct FlowKeyOf<A> {
        pub saddr: A,
        pub daddr: A,
        pub sport: u16,
        pub dport: u16,
        pub proto: u8,
        pub _pad: [u8; 3],
    }
}

family_layout! {
    Flow = 40, Flow6 = 64,
    /// Value of the flow table: what a packet of this direction becomes, and the state of the
    /// flow it belongs to. [`flow`] holds the rules (which packets open a flow, transitions,
    /// timeouts) and why every entry carries the state rather than one entry for the flow.
    pub struct FlowOf<A> {
        /// The tuple the packet leaves with (addresses and ports rewritten to these). Reversed,
        /// it is the key of this entry's partner (see [`flow`]).
        pub saddr: A,
        pub daddr: A,
        pub sport: u16,
        pub dport: u16,
        /// `FLOW_*` bits: which hook, which direction, which pair.
        pub flags: u8,
        /// 1 once the reply direction (the backend) has carried a packet.
        pub replied: u8,
        /// 1 once the original direction (the client) has sent a FIN or either side a RST.
        pub closing_orig: u8,
        /// 1 once the reply direction has sent a FIN or either side a RST.
        pub closing_reply: u8,
        /// 1 for a flow re-created from a mid-connection packet whose entries were lost, until
        /// the backend answers (it gets the short `tcp_unreplied` timeout meanwhile).
        pub recreated: u8,
        /// 1 once either side has sent a RST: the connection is gone at both ends (a closed
        /// one ended by FINs is not, see [`flow::timeout_secs`]). Once this struct's padding:
        /// an entry written by an lb before it holds 0 there, "not reset", which keeps a
        /// closed flow the longer time, so the layout's version stands.
        pub reset: u8,
        /// The stamp ([`flow::stamp`], its low 16 bits) of the flow's first packet: how old
        /// a flow is when it asks for a liberal conntrack entry ([`flow::old_enough`]). Once
        /// this struct's padding (0 in an entry an earlier lb wrote: of some age), so the
        /// layout's version stands.
        pub born: u16,
        /// The flow hash of the client's original tuple (its low 16 bits are the flow's
        /// bucket), for whoever reads the table.
        pub hash: u32,
        /// The counter the flow's packets are accounted to: its backend's.
        pub counter: u32,
        /// When a packet of this entry's direction was last seen leaving the node past
        /// netfilter's forward and postrouting hooks ([`flow::stamp`]; 0: never), which the
        /// vetted fast path takes as the direction's judgment ([`flow::vetted`]). Set on F
        /// and R, the entries the fast path reads; a rebuilt partner starts without one.
        /// Once an unused field (0), so an entry an earlier lb wrote starts unjudged and the
        /// layout's version stands.
        pub vetted: u32,
        /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) after which the entry counts as absent.
        pub expires_ns: u64,
    }
}

/// [`Flow::flags`]: the entry is applied on egress (TC egress); without it, on ingress (XDP or
/// TC ingress).
pub const FLOW_EGRESS: u8 = 1 << 0;
/// [`Flow::flags`]: the entry belongs to the reply direction (backend → client).
pub const FLOW_REPLY: u8 = 1 << 1;
/// [`Flow::flags`]: the entry is one of a masqueraded flow's source-NAT pair (rather than of
/// its destination-NAT pair).
pub const FLOW_MASQ: u8 = 1 << 2;

map_layout! {
    /// Key of the fragment map: one IPv4 datagram in flight, as its fragments carry it.
    pub struct FragKey {
        pub saddr: u32,
        pub daddr: u32,
        pub id: u16,
        pub proto: u8,
        pub _pad: u8,
    }
}

map_layout! {
    /// [`FragKey`] of IPv6: its identification is 32 bits (the fragment header's).
    pub struct FragKey6 {
        pub saddr: Addr6,
        pub daddr: Addr6,
        pub id: u32,
        pub proto: u8,
        pub _pad: [u8; 3],
    }
}

impl FragKey {
    /// The key of datagram `id` from `saddr` to `daddr` of `proto` (what the programs record
    /// and look up, and the tests read back). An IPv4 datagram's identification is 16 bits:
    /// the parser's 32-bit one holds it.
    #[inline(always)]
    pub fn new(saddr: u32, daddr: u32, id: u32, proto: u8) -> FragKey {
        FragKey {
            saddr,
            daddr,
            id: id as u16,
            proto,
            _pad: 0,
        }
    }
}

impl FragKey6 {
    /// [`FragKey::new`] of IPv6.
    #[inline(always)]
    pub fn new(saddr: Addr6, daddr: Addr6, id: u32, proto: u8) -> FragKey6 {
        FragKey6 {
            saddr,
            daddr,
            id,
            proto,
            _pad: [0; 3],
        }
    }
}

map_layout! {
    /// Value of the fragment map: the ports the first fragment carried, which the later ones
    /// (no L4 header) need to find their flow.
    pub struct FragPorts {
        pub sport: u16,
        pub dport: u16,
    }
}

map_layout! {
    /// Per-CPU packet and byte counts of one service or backend.
    pub struct Counters {
        pub packets: u64,
        pub bytes: u64,
    }
}

map_layout! {
    /// Flow timeouts in seconds (see [`flow::timeout_secs`] for which applies when).
    pub struct Timeouts {
        pub tcp_syn: u32,
        pub tcp_established: u32,
        pub tcp_closing: u32,
        pub tcp_unreplied: u32,
        pub udp: u32,
        pub tcp_time_wait: u32,
    }
}

impl Timeouts {
    /// The defaults, Cilium's where it has one: a SYN waits 60 s for its answer, an
    /// established connection lives 6 h idle, a reset one 10 s, a flow re-created from a
    /// mid-connection packet 5 s until the backend answers, UDP and SCTP 60 s idle; and the
    /// kernel's for a connection closed by FINs both ways, 120 s
    /// (`nf_conntrack_tcp_timeout_time_wait`): its reply tuple stays claimed while the side
    /// that closed first holds it in TIME_WAIT (60 s on Linux), see [`flow::timeout_secs`].
    pub const DEFAULT: Timeouts = Timeouts {
        tcp_syn: 60,
        tcp_established: 21600,
        tcp_closing: 10,
        tcp_unreplied: 5,
        udp: 60,
        tcp_time_wait: 120,
    };
}

map_layout! {
    /// The one value of the per-network config array.
    pub struct Config {
        /// One of the `MASQ_*` modes.
        pub masquerade: u32,
        /// Key of the flow hash: random per network, kept across restarts (the map is pinned),
        /// so that clients cannot aim at a backend and a restart does not move flows.
        pub hash_key: u32,
        /// Masquerade source ports: `masq_port_min..=masq_port_max` minus
        /// `masq_hole_min..=masq_hole_max` (the node's ephemeral range, where its own sockets
        /// pick their ports; an empty hole has min > max).
        pub masq_port_min: u16,
        pub masq_port_max: u16,
        pub masq_hole_min: u16,
        pub masq_hole_max: u16,
        pub timeouts: Timeouts,
        /// Which families' translated packets may bypass the node's stack (the fast path,
        /// `lb_endpoints`, `lb_endpoints6`): [`FAST_PATH_V4`] and [`FAST_PATH_V6`] bits, as the
        /// node's forward hooks allow each (an `ip6` table's rule stops IPv6's alone). Once
        /// this struct's padding: a config pinned by an lb before the fast path holds 0 there,
        /// "off"; one pinned before dual stack holds 1, IPv4's bit, which it meant; so the
        /// layout's version stands. [`FAST_PATH_VETTED_V4`] and [`FAST_PATH_VETTED_V6`] make a
        /// family's fast path the vetted one (zero in a config pinned before it: direct).
        pub fast_path: u32,
    }
}

family_layout! {
    Iface = 8, Iface6 = 20,
    /// Value of the interface map (keyed by ifindex): the address a masqueraded flow leaving by
    /// this interface takes as its source.
    pub struct IfaceOf<A> {
        pub addr: A,
        pub flags: u32,
    }
}

map_layout! {
    /// Value of the local-endpoint maps (keyed by address, network order: `lb_endpoints` by
    /// IPv4's, `lb_endpoints6` by IPv6's): a neighbour of
    /// the node the fast path hands a translated packet to without the node's stack, as the
    /// controller found it in the neighbour table (and, behind a bridge, the bridge's FDB).
    pub struct Endpoint {
        /// Where the packet goes: the node's end of the neighbour's veth (into whose peer
        /// `bpf_redirect_peer` delivers, with [`ENDPOINT_PEER`]), or the device it is sent
        /// out of.
        pub ifindex: u32,
        /// The node's L3 interface the neighbour is on (a bridge, for a bridge port): the
        /// interface the stack would have routed the packet out of.
        pub l3_ifindex: u32,
        /// That interface's MTU: a bigger packet takes the stack (which fragments, or says
        /// "fragmentation needed").
        pub mtu: u32,
        /// The neighbour's MAC (destination) and the L3 interface's own (source).
        pub dmac: [u8; 6],
        pub smac: [u8; 6],
        /// `ENDPOINT_*` bits.
        pub flags: u32,
    }
}

/// Value of the DSR session tables (`lb_dsr_sessions`, `lb_dsr_sessions6`), keyed by the
/// client's packet as it arrives ([`FlowKeyOf`]: client address and port, VIP and port,
/// protocol): the backend the session sticks to and the frame header that reaches it. Written
/// by the programs only (a new session, the time of each packet; a TCP RST deletes it); the
/// controller reads it and deletes what the backend's removal or the timeout ended.
///
/// Not [`family_layout`]'s: IPv4's layout is that of an lb before dual stack (an upgrade
/// adopts its sessions), which leaves IPv6's 4 bytes short of `seen_ns`'s alignment, so the
/// padding is a field whose type the family gives ([`Addr::SessionPad`]: none for IPv4).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsrSessionOf<A: Addr> {
    /// The backend (for whoever reads the table; the frame goes by MAC).
    pub backend: A,
    /// The device the frame leaves by (the one it came in on, where XDP_TX is used).
    pub ifindex: u32,
    /// The backend's MAC (destination) and the device's own (source).
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    /// The backend's counter in `lb_counters`.
    pub counter: u32,
    pub _pad: A::SessionPad,
    /// `bpf_ktime_get_ns` of the session's last packet (of a recent one: it lags by at
    /// most [`dsr::refresh_ns`]); a session idle past its VIP's
    /// [`Service::session_timeout`] counts as absent ([`dsr::live`]).
    pub seen_ns: u64,
}

/// [`DsrSessionOf`] of IPv4.
pub type DsrSession = DsrSessionOf<u32>;
/// [`DsrSessionOf`] of IPv6.
pub type DsrSession6 = DsrSessionOf<Addr6>;
const _: () = assert!(core::mem::size_of::<DsrSession>() == 32);
const _: () = assert!(core::mem::size_of::<DsrSession6>() == 48);
family_layout!(@pod DsrSession);
family_layout!(@pod DsrSession6);

map_layout! {
    /// The one entry of `lb_sock`: the network namespace whose processes the socket programs
    /// serve (its cookie, `SO_NETNS_COOKIE`). The programs hang on a cgroup, which reaches
    /// every process below it in every namespace: any other namespace, and a map not written
    /// yet (0, which no namespace has), leaves a socket untouched.
    pub struct SockConfig {
        pub netns_cookie: u64,
    }
}

map_layout! {
    /// Key of `lb_sock_rev`: a socket (its cookie) and the backend address and port its
    /// connect or send was given instead of the service's.
    pub struct SockRevKey {
        pub cookie: u64,
        pub addr: u32,
        pub port: u16,
        pub _pad: u16,
    }
}

map_layout! {
    /// Value of `lb_sock_rev`: the service address and port the socket asked for, which its
    /// answers' source and its peer name show.
    pub struct SockRev {
        pub addr: u32,
        pub port: u16,
        pub _pad: u16,
    }
}

map_layout! {
    /// Key of `lb_sock_rev6`: [`SockRevKey`] of an IPv6 socket sent to an IPv6 backend (a
    /// socket of either family sent to an IPv4 one, by a v4-mapped address on an IPv6 socket,
    /// is `lb_sock_rev`'s). Not [`family_layout`]'s: the cookie's alignment would leave
    /// the IPv6 layout's tail padding implicit.
    pub struct SockRevKey6 {
        pub cookie: u64,
        pub addr: Addr6,
        pub port: u16,
        pub _pad: u16,
        pub _pad2: u32,
    }
}

map_layout! {
    /// Value of `lb_sock_rev6`: as [`SockRev`].
    pub struct SockRev6 {
        pub addr: Addr6,
        pub port: u16,
        pub _pad: u16,
    }
}

const _: () = assert!(core::mem::size_of::<SockRevKey6>() == 32);
const _: () = assert!(core::mem::size_of::<SockRev6>() == 20);

family_layout! {
    CtRequest = 32, CtRequest6 = 80,
    /// A record of `lb_ct_requests`: TC egress asks the controller to make the node's
    /// conntrack entry of a TCP flow on the vetted fast path liberal (window tracking off
    /// for it, `IP_CT_TCP_FLAG_BE_LIBERAL` both ways), as the kernel's flowtable does for
    /// the connections it offloads: conntrack sees one packet of a fast direction every
    /// [`flow::REJUDGE_NS`], far past the windows it tracked, and would call it invalid.
    /// Neither direction of the flow is judged until the controller has done so and put
    /// `key` in `lb_liberal` (or `lb_liberal6`).
    pub struct CtRequestOf<A> {
        /// The flow's F key.
        pub key: FlowKeyOf<A>,
        /// The conntrack entry's original tuple: the client's packet as it leaves towards
        /// its backend (lb translated it before netfilter saw it).
        pub orig: FlowKeyOf<A>,
    }
}

/// Records `lb_ct_requests` holds (bytes; a record of either family is at most
/// [`CtRequest6`]'s size, with the ring's header).
pub const CT_REQUESTS_BYTES: u32 = 1 << 16;
/// Flows `lb_liberal` and `lb_liberal6` remember (LRU: one evicted asks again).
pub const MAX_LIBERAL: u32 = 1 << 16;

/// [`Config::fast_path`]: IPv4's translated packets may bypass the stack.
pub const FAST_PATH_V4: u32 = 1 << 0;
/// [`Config::fast_path`]: IPv6's may.
pub const FAST_PATH_V6: u32 = 1 << 1;
/// [`Config::fast_path`]: IPv4's may, each direction of a flow only while netfilter's
/// judgment of it stands ([`flow::vetted`]): the vetted fast path. Without it beside
/// [`FAST_PATH_V4`], every translated packet may (the direct one).
pub const FAST_PATH_VETTED_V4: u32 = 1 << 2;
/// [`FAST_PATH_VETTED_V4`] of IPv6.
pub const FAST_PATH_VETTED_V6: u32 = 1 << 3;

/// [`Endpoint::flags`]: `ifindex` is a veth: deliver into its peer's namespace
/// (`bpf_redirect_peer`, TC ingress only) rather than out of it.
pub const ENDPOINT_PEER: u32 = 1 << 0;
/// [`Endpoint::flags`]: the neighbour is behind a bridge of the node. A reply from a port of
/// that bridge would have been bridged to it, never routed: the reply fast path leaves such
/// packets to the bridge.
pub const ENDPOINT_BRIDGED: u32 = 1 << 1;

/// [`Config::masquerade`]: SNAT only hairpin flows (those that leave by the interface they came in on).
pub const MASQ_AUTO: u32 = 0;
/// [`Config::masquerade`]: SNAT every load-balanced flow (moby's `ct status dnat masquerade`).
pub const MASQ_ALWAYS: u32 = 1;
/// [`Config::masquerade`]: never SNAT; backends see the client's address.
pub const MASQ_NEVER: u32 = 2;

/// The kernel's own NAT port range for a source port it must change (`nf_nat` picks from
/// 1024-65535 when the original port is above 1023): the widest range a masquerade can use.
pub const MASQ_PORT_MIN: u16 = 1024;
pub const MASQ_PORT_MAX: u16 = 65535;

/// Why a program run ended as it did: one per-CPU counter per reason (`lb_reasons`), so every
/// outcome, passing included, leaves a trace an operator can read (`lb_datapath_total`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Rewritten by a tracked flow's entry.
    Translated = 0,
    /// Neither IPv4 nor IPv6 (ARP, VLAN-tagged, LLDP, ...).
    NotIp,
    /// IPv4 or IPv6 whose headers are cut short or lie about their lengths.
    Malformed,
    /// No flow and no service for it.
    NotService,
    /// For a service, but a packet that never opens a flow (SYN-ACK, FIN, RST, bare ...).
    NoFlowOpener,
    /// A packet of a connection or connected socket of the node itself.
    NodeSocket,
    /// A service whose set is empty: the stack answers (the VIP alias resets TCP).
    NoBackend,
    /// XDP cannot prove the L4 checksum is a full one (it may be a CHECKSUM_PARTIAL seed):
    /// the TC program beside it translates the packet.
    XdpDeferred,
    /// A later fragment of a datagram whose first fragment was not seen.
    FragUnknown,
    /// A new flow (TCP SYN, or a UDP/SCTP packet).
    FlowNew,
    /// A TCP SYN that found its tuple's previous connection closing: selected afresh.
    FlowReopened,
    /// A mid-connection TCP packet whose entries were gone (evicted, flushed): re-created on
    /// the same backend by the flow hash.
    FlowRecreated,
    /// An entry's partner was missing and was put back from the entry.
    EntryRestored,
    /// An entry was found past its expiry and treated as absent.
    EntryExpired,
    /// The client's source port was changed so that two flows do not share a reply tuple.
    PortClash,
    /// No free reply tuple for a new flow (dropped, as the kernel's NAT does).
    NatFailed,
    /// A new masquerade port claim.
    MasqNew,
    /// No free masquerade port (dropped, as the kernel's NAT does).
    MasqFailed,
    /// An SCTP fragment that would need a port rewrite (its CRC32c covers the whole datagram).
    SctpFragment,
    /// Translated and handed straight to a local endpoint (the fast path), past the node's
    /// stack; `Translated` counts what was handed to the stack.
    Redirected,
    /// A reply the fast path could translate but not hand over (no known hop, TTL, MTU,
    /// masquerade, a bridged client): passed untouched, translated where it leaves the node.
    NotRedirected,
    /// A DSR VIP's packet that opened a session: sent to its backend's MAC.
    DsrNew,
    /// A DSR VIP's packet of a live session: sent to the session's backend.
    DsrSession,
    /// A TCP RST of a DSR session: sent on, and the session ended.
    DsrReset,
    /// A DSR VIP's packet with no session and no backend to take one: dropped (moby's
    /// `counter drop`).
    DsrNoBackend,
    /// A DSR VIP's packet whose chosen backend has no known MAC yet (the controller resolves
    /// it and takes it out of the set meanwhile): dropped.
    DsrUnresolved,
    /// A connect or send of a process of the network's namespace to a VIP or published port:
    /// its destination became a backend's (socket-level balancing, `HOOK_SOCK`).
    SockTranslated,
    /// An answer to (or the peer of) such a socket: its source shown as the service's.
    SockReversed,
    /// IP of a protocol the balancer never translates (ICMP and ICMPv6 messages other than
    /// errors, neighbour discovery among them; ESP, GRE, no next header, ...).
    NotL4,
    /// IPv6 whose extension headers the programs do not walk: more than
    /// [`IPV6_MAX_EXT_HEADERS`], a header they do not skip (mobility, HIP, shim6,
    /// experimental), or a chain reaching past the bytes they parse.
    Ipv6Extension,
    /// An IPv6 UDP datagram for a service with checksum 0, which IPv6 receivers discard
    /// (RFC 8200 8.1) and the programs give a computed checksum when they translate it, that
    /// cannot be given one: a fragment (the checksum covers the whole datagram) or one whose
    /// length field disagrees with its IPv6 payload. Passed untouched, no flow opened.
    Udp6NoChecksum,
}

/// The programs, in `lb_reasons` slot order (slot `hook * REASONS + reason`), with the label
/// metrics give them.
pub const HOOKS: [&str; 5] = ["xdp", "tc_ingress", "tc_egress", "tc_reply", "sock"];
pub const HOOK_XDP: u32 = 0;
pub const HOOK_TC_INGRESS: u32 = 1;
pub const HOOK_TC_EGRESS: u32 = 2;
/// TC ingress of the node's end of a local backend's veth (the fast path's replies).
pub const HOOK_TC_REPLY: u32 = 3;
/// The cgroup socket programs (connect, sendmsg, recvmsg, getpeername) of the network's
/// namespace.
pub const HOOK_SOCK: u32 = 4;

/// How many [`Reason`]s there are (the size of `lb_reasons` per hook).
pub const REASONS: u32 = Reason::Udp6NoChecksum as u32 + 1;

impl Reason {
    /// Every reason with its metric label, in counter-slot order.
    pub const ALL: [(Reason, &'static str); REASONS as usize] = [
        (Reason::Translated, "translated"),
        (Reason::NotIp, "not_ip"),
        (Reason::Malformed, "malformed"),
        (Reason::NotService, "not_service"),
        (Reason::NoFlowOpener, "no_flow_opener"),
        (Reason::NodeSocket, "node_socket"),
        (Reason::NoBackend, "no_backend"),
        (Reason::XdpDeferred, "xdp_deferred"),
        (Reason::FragUnknown, "frag_unknown"),
        (Reason::FlowNew, "flow_new"),
        (Reason::FlowReopened, "flow_reopened"),
        (Reason::FlowRecreated, "flow_recreated"),
        (Reason::EntryRestored, "entry_restored"),
        (Reason::EntryExpired, "entry_expired"),
        (Reason::PortClash, "port_clash"),
        (Reason::NatFailed, "nat_failed"),
        (Reason::MasqNew, "masq_new"),
        (Reason::MasqFailed, "masq_failed"),
        (Reason::SctpFragment, "sctp_fragment"),
        (Reason::Redirected, "redirected"),
        (Reason::NotRedirected, "not_redirected"),
        (Reason::DsrNew, "dsr_new"),
        (Reason::DsrSession, "dsr_session"),
        (Reason::DsrReset, "dsr_reset"),
        (Reason::DsrNoBackend, "dsr_no_backend"),
        (Reason::DsrUnresolved, "dsr_unresolved"),
        (Reason::SockTranslated, "sock_translated"),
        (Reason::SockReversed, "sock_reversed"),
        (Reason::NotL4, "not_l4"),
        (Reason::Ipv6Extension, "ipv6_extension"),
        (Reason::Udp6NoChecksum, "udp6_no_checksum"),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_backends_split_like_moby() {
        assert_eq!(bucket_interval(0, 3, BUCKETS), Some((0, 21845)));
        assert_eq!(bucket_interval(1, 3, BUCKETS), Some((21846, 43690)));
        assert_eq!(bucket_interval(2, 3, BUCKETS), Some((43691, 65535)));
        assert_eq!(bucket_interval(3, 3, BUCKETS), None);
    }

    #[test]
    fn empty_set_selects_nothing() {
        assert_eq!(slot_for_bucket(0, 0), None);
        assert_eq!(bucket_interval(0, 0, BUCKETS), None);
        assert_eq!(slot_for_bucket(BUCKETS, 3), None);
    }

    #[test]
    fn slot_for_bucket_is_interval_containment() {
        // For every set size the issue names and every bucket, the slot the programs pick is
        // the one whose rendered interval contains the bucket (walked independently here).
        for n in 1..=1024u32 {
            let mut slot = 0u32;
            let mut counts = [0u32; 1024];
            let (mut start, mut end) = bucket_interval(0, n, BUCKETS).unwrap();
            assert_eq!(start, 0);
            for b in 0..BUCKETS {
                if b > end {
                    slot += 1;
                    let next = bucket_interval(slot, n, BUCKETS).unwrap();
                    assert_eq!(next.0, end + 1, "n={n} slot={slot}: intervals must abut");
                    (start, end) = next;
                }
                assert!(start <= b && b <= end);
                assert_eq!(slot_for_bucket(b, n), Some(slot), "n={n} bucket={b}");
                counts[slot as usize] += 1;
            }
            assert_eq!(end, BUCKETS - 1);
            assert_eq!(slot, n - 1);
            let per = BUCKETS / n;
            for (i, c) in counts[..n as usize].iter().enumerate() {
                assert!(*c == per || *c == per + 1, "n={n} slot={i} got {c}");
            }
        }
    }

    #[test]
    fn more_backends_than_buckets_use_the_first_ones() {
        assert_eq!(slot_for_bucket(65535, 70000), Some(65535));
        assert_eq!(bucket_interval(65536, 70000, BUCKETS), None);
        assert_eq!(slot_in(4, 10, 5), Some(4));
        assert_eq!(bucket_interval(5, 10, 5), None);
    }

    #[test]
    fn reasons_are_listed_in_slot_order() {
        for (i, (r, _)) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
