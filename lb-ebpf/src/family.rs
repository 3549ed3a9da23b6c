//! What the paths, written once over the address family ([`Inet`]), ask of it besides the
//! maps [`FamilyMaps`] gives: its run's slot and its parser, where its header keeps the
//! addresses, hop count and protocol, its fast-path bits, how the FIB and the kernel's socket
//! lookup take its addresses, and its fragment and liberal-flow maps. Each path is built
//! twice, for `u32` (IPv4) and `Addr6` (IPv6).
use core::mem::size_of;

use aya_ebpf::{
    bindings::{BPF_ANY, bpf_fib_lookup as FibParams, bpf_sock_tuple},
    btf_maps::LruHashMap,
};
use lb_common::{
    Addr6, FAST_PATH_V4, FAST_PATH_V6, FAST_PATH_VETTED_V4, FAST_PATH_VETTED_V6, FlowKeyOf,
    FragKey, FragKey6, FragPorts, MAX_LIBERAL, Reason,
    csum::{IP_DADDR, IP_PROTO, IP_SADDR, IP_TTL, IP6_DADDR, IP6_HOP_LIMIT, IP6_NEXT, IP6_SADDR},
};

use crate::{
    maps::{FRAGS, FRAGS6, FamilyMaps, LIBERAL, LIBERAL6, SLOTS, SLOTS6},
    parse::{self, Frame, Parsed},
    room::Slot,
};

pub trait Inet: FamilyMaps {
    /// The slot of a run at `hook` (per CPU).
    fn slot(hook: u32) -> Option<&'static mut Slot<Self>>;
    /// Parses a frame of this family (`parse::family` told it) into `out` (which holds
    /// nothing it may read when the frame is refused: a refusal's `Result` is not stored,
    /// because LLVM would store the undefined bytes of its other variant from registers the
    /// verifier sees as never written).
    fn parse(f: &impl Frame, out: &mut Parsed<FlowKeyOf<Self>>) -> Result<(), Reason>;
    /// Offsets of the source and destination address in the IP header.
    const SADDR: usize;
    const DADDR: usize;
    /// Offsets of the hop count (IPv4's TTL, IPv6's hop limit) and of the protocol (IPv6's
    /// first next header: the FIB's policy rules match it as the kernel's own lookup does).
    const HOPS: usize;
    const PROTO: usize;
    /// This family's bits of `Config::fast_path` (the fast path; its vetted kind), and its
    /// `AF_*` for `bpf_fib_lookup`.
    const FAST_PATH: u32;
    const VETTED: u32;
    const AF: u8;
    /// Puts the addresses of a FIB lookup in `params`.
    fn fib_addrs(params: &mut FibParams, saddr: Self, daddr: Self);
    /// `key`'s addresses and ports in the lookup tuple of `bpf_sk_lookup_*`; returns the
    /// tuple's size, which tells the helper the family.
    fn sock_tuple(key: &FlowKeyOf<Self>, t: &mut bpf_sock_tuple) -> u32;
    /// The ports recorded for the datagram `id` that `key`'s fragment belongs to, and
    /// recording them (`frag`).
    fn frag_get(key: &FlowKeyOf<Self>, id: u32) -> Option<FragPorts>;
    fn frag_put(key: &FlowKeyOf<Self>, id: u32, ports: &FragPorts);
    /// The flows made liberal in the node's conntrack (`lb_liberal`, `lb_liberal6`).
    fn liberal() -> &'static LruHashMap<FlowKeyOf<Self>, u32, { MAX_LIBERAL as usize }>;
}

impl Inet for u32 {
    #[inline(always)]
    fn liberal() -> &'static LruHashMap<FlowKeyOf<u32>, u32, { MAX_LIBERAL as usize }> {
        &LIBERAL
    }
    #[inline(always)]
    fn slot(hook: u32) -> Option<&'static mut Slot<u32>> {
        // SAFETY: a per-CPU slot of this hook, used by this run alone (see `Room`).
        SLOTS.get_ptr_mut(hook).map(|r| unsafe { &mut *r })
    }
    #[inline(always)]
    fn parse(f: &impl Frame, out: &mut Parsed<FlowKeyOf<u32>>) -> Result<(), Reason> {
        *out = parse::packet4(f)?;
        Ok(())
    }
    const SADDR: usize = IP_SADDR;
    const DADDR: usize = IP_DADDR;
    const HOPS: usize = IP_TTL;
    const PROTO: usize = IP_PROTO;
    const FAST_PATH: u32 = FAST_PATH_V4;
    const VETTED: u32 = FAST_PATH_VETTED_V4;
    const AF: u8 = 2;
    #[inline(always)]
    fn fib_addrs(params: &mut FibParams, saddr: u32, daddr: u32) {
        params.__bindgen_anon_3.ipv4_src = saddr;
        params.__bindgen_anon_4.ipv4_dst = daddr;
    }
    #[inline(always)]
    fn sock_tuple(key: &FlowKeyOf<u32>, t: &mut bpf_sock_tuple) -> u32 {
        t.__bindgen_anon_1.ipv4.saddr = key.saddr;
        t.__bindgen_anon_1.ipv4.daddr = key.daddr;
        t.__bindgen_anon_1.ipv4.sport = key.sport;
        t.__bindgen_anon_1.ipv4.dport = key.dport;
        (size_of::<u32>() * 2 + size_of::<u16>() * 2) as u32
    }
    #[inline(always)]
    fn frag_get(key: &FlowKeyOf<u32>, id: u32) -> Option<FragPorts> {
        // SAFETY: plain data copied out.
        unsafe { FRAGS.get(&FragKey::new(key.saddr, key.daddr, id, key.proto)) }.copied()
    }
    #[inline(always)]
    fn frag_put(key: &FlowKeyOf<u32>, id: u32, ports: &FragPorts) {
        let _ = FRAGS.insert(
            &FragKey::new(key.saddr, key.daddr, id, key.proto),
            ports,
            BPF_ANY as u64,
        );
    }
}

impl Inet for Addr6 {
    #[inline(always)]
    fn liberal() -> &'static LruHashMap<FlowKeyOf<Addr6>, u32, { MAX_LIBERAL as usize }> {
        &LIBERAL6
    }
    #[inline(always)]
    fn slot(hook: u32) -> Option<&'static mut Slot<Addr6>> {
        // SAFETY: a per-CPU slot of this hook, used by this run alone (see `Room`).
        SLOTS6.get_ptr_mut(hook).map(|r| unsafe { &mut *r })
    }
    #[inline(always)]
    fn parse(f: &impl Frame, out: &mut Parsed<FlowKeyOf<Addr6>>) -> Result<(), Reason> {
        parse::packet6(f, out)
    }
    const SADDR: usize = IP6_SADDR;
    const DADDR: usize = IP6_DADDR;
    const HOPS: usize = IP6_HOP_LIMIT;
    const PROTO: usize = IP6_NEXT;
    const FAST_PATH: u32 = FAST_PATH_V6;
    const VETTED: u32 = FAST_PATH_VETTED_V6;
    const AF: u8 = 10;
    #[inline(always)]
    fn fib_addrs(params: &mut FibParams, saddr: Addr6, daddr: Addr6) {
        params.__bindgen_anon_3.ipv6_src = saddr;
        params.__bindgen_anon_4.ipv6_dst = daddr;
    }
    #[inline(always)]
    fn sock_tuple(key: &FlowKeyOf<Addr6>, t: &mut bpf_sock_tuple) -> u32 {
        t.__bindgen_anon_1.ipv6.saddr = key.saddr;
        t.__bindgen_anon_1.ipv6.daddr = key.daddr;
        t.__bindgen_anon_1.ipv6.sport = key.sport;
        t.__bindgen_anon_1.ipv6.dport = key.dport;
        (size_of::<Addr6>() * 2 + size_of::<u16>() * 2) as u32
    }
    #[inline(always)]
    fn frag_get(key: &FlowKeyOf<Addr6>, id: u32) -> Option<FragPorts> {
        // SAFETY: plain data copied out.
        unsafe { FRAGS6.get(&FragKey6::new(key.saddr, key.daddr, id, key.proto)) }.copied()
    }
    #[inline(always)]
    fn frag_put(key: &FlowKeyOf<Addr6>, id: u32, ports: &FragPorts) {
        let _ = FRAGS6.insert(
            &FragKey6::new(key.saddr, key.daddr, id, key.proto),
            ports,
            BPF_ANY as u64,
        );
    }
}
