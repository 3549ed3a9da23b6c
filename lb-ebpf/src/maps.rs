//! Every map of the dataplane, declared once. One object instance (and so one set of these
//! maps) per network; the controller pins them under `<bpffs>/<network>/` and records their
//! layout versions (`lb_common::MAP_LAYOUTS`).
//!
//! Who writes what (each IPv6 twin as its IPv4 map): the controller is the only writer of the
//! service, backend, address, address filter, endpoint, interface, DSR backend, socket
//! config, config, vetted-since, liberal, layout and jump maps. The programs write `lb_flows`
//! (entries of new flows, state and expiry of live ones), `lb_dsr_sessions`, `lb_sock_rev`,
//! `lb_frags`, the counters, their own slots (`lb_slots`) and the ring of conntrack requests
//! (`lb_ct_requests`, which the controller reads); the controller only deletes from
//! `lb_flows` and `lb_dsr_sessions` (expired entries, and the UDP flows and sessions of a
//! removed backend).
//!
//! Every map is a BTF map (`#[btf_map]`, section `.maps`): the kernel keeps its key and value
//! types, so `bpftool map dump` shows each field by name. A map pinned by an lb of before the
//! BTF maps (legacy `maps` section) is adopted as it is when its type, sizes and flags match:
//! the programs read it the same, and it shows bytes until it is created again.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, ProgramArray, RingBuf},
    macros::btf_map,
};
use lb_common::{
    Addr, Addr6, Backend, Backend6, BackendKey, BackendOf, CT_REQUESTS_BYTES, Config, Counters,
    DsrSession, DsrSession6, DsrSessionOf, Endpoint, Flow, Flow6, FlowKey, FlowKey6, FlowKeyOf,
    FlowOf, FragKey, FragKey6, FragPorts, HOOKS, Iface, Iface6, IfaceOf, LAYOUT_MAP_SLOTS,
    MAX_BACKEND_SLOTS, MAX_COUNTERS, MAX_DSR_BACKENDS, MAX_DSR_SESSIONS, MAX_ENDPOINTS, MAX_FLOWS,
    MAX_FRAGS, MAX_IFACES, MAX_LIBERAL, MAX_LOCAL_ADDRS, MAX_SERVICES, MAX_SOCK_REV, PortKey,
    PortKey6, PortKeyOf, REASONS, Service, SockConfig, SockRev, SockRev6, SockRevKey, SockRevKey6,
    VipKey, VipKey6, VipKeyOf, filter::AddrFilter,
};

use crate::room::Slot;

/// `BPF_F_NO_PREALLOC` as a BTF map's flags parameter: hashes that are mostly empty allocate
/// per entry instead of their whole capacity up front.
const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

/// VIP → its backend set. Every port of a VIP is balanced.
#[btf_map(name = "lb_vips")]
pub static VIPS: HashMap<VipKey, Service, { MAX_SERVICES as usize }, NO_PREALLOC> = HashMap::new();

/// (host_ip or 0, port, proto) → its backend set.
#[btf_map(name = "lb_ports")]
pub static PORTS: HashMap<PortKey, Service, { MAX_SERVICES as usize }, NO_PREALLOC> =
    HashMap::new();

/// (set, slot) → backend. A set is immutable once a service entry points at it, and stays
/// one sync after the last service entry stopped pointing at it.
#[btf_map(name = "lb_backends")]
pub static BACKENDS: HashMap<BackendKey, Backend, { MAX_BACKEND_SLOTS as usize }, NO_PREALLOC> =
    HashMap::new();

/// Every entry of every tracked flow (lb_common::flow: both directions, and the masquerade
/// pair with its port claim).
#[btf_map(name = "lb_flows")]
pub static FLOWS: LruHashMap<FlowKey, Flow, { MAX_FLOWS as usize }> = LruHashMap::new();

/// IPv4 datagrams whose first fragment was translated: the ports their later fragments lack.
#[btf_map(name = "lb_frags")]
pub static FRAGS: LruHashMap<FragKey, FragPorts, { MAX_FRAGS as usize }> = LruHashMap::new();

/// The node's own addresses: a published port without `host_ip` matches only these.
#[btf_map(name = "lb_local_addrs")]
pub static LOCAL_ADDRS: HashMap<u32, u32, { MAX_LOCAL_ADDRS as usize }> = HashMap::new();

/// ifindex → the address masqueraded flows leaving by it take.
#[btf_map(name = "lb_ifaces")]
pub static IFACES: HashMap<u32, Iface, { MAX_IFACES as usize }> = HashMap::new();

/// The network's settings: masquerade mode and ports, flow hash key, timeouts.
#[btf_map(name = "lb_config")]
pub static CONFIG: Array<Config, 1> = Array::new();

/// Addresses no packet of lb's can be to or from (`lb_common::filter`). Written only by the
/// controller, at every apply that changes it.
#[btf_map(name = "lb_addr_filter")]
pub static ADDR_FILTER: Array<AddrFilter, 1> = Array::new();

/// The stamp (`lb_common::flow::stamp`) of the controller's last look at a changed ruleset:
/// the vetted fast path counts only judgments made after it (`lb_common::flow::vetted`).
/// Written only by the controller, at every load and after every ruleset change.
#[btf_map(name = "lb_vetted_since")]
pub static VETTED_SINCE: Array<u32, 1> = Array::new();

/// The F keys of the TCP flows whose node conntrack entries the controller made liberal
/// (`lb_common::CtRequestOf`): written by the controller, read by TC egress before it judges
/// a TCP direction. The value is unused (1).
#[btf_map(name = "lb_liberal")]
pub static LIBERAL: LruHashMap<FlowKey, u32, { MAX_LIBERAL as usize }> = LruHashMap::new();

#[btf_map(name = "lb_liberal6")]
pub static LIBERAL6: LruHashMap<FlowKey6, u32, { MAX_LIBERAL as usize }> = LruHashMap::new();

/// TC egress's requests to the controller (`lb_common::CtRequestOf` of either family, told
/// apart by their size); a full ring drops a request, which the flow's next packet on the
/// stack makes again.
#[btf_map(name = "lb_ct_requests")]
pub static CT_REQUESTS: RingBuf<(), { CT_REQUESTS_BYTES as usize }> = RingBuf::new();

/// Packets and bytes per backend (a service is the sum of its backends), by a counter id the
/// controller assigns; an entry is created by the first packet counted to it (`stats`). A
/// hash allocated per entry, not an array: per-CPU memory is spent only on counters in use
/// (an array of the capacity takes 16 bytes per slot per CPU up front: 128 MiB at 131,072
/// slots and 64 CPUs).
#[btf_map(name = "lb_counters")]
pub static COUNTERS: PerCpuHashMap<u32, Counters, { MAX_COUNTERS as usize }, NO_PREALLOC> =
    PerCpuHashMap::new();

/// Packets per program and outcome: slot `hook * REASONS + reason` (see `stats`).
#[btf_map(name = "lb_reasons")]
pub static REASON_COUNTS: PerCpuArray<u64, { (HOOKS.len() as u32 * REASONS) as usize }> =
    PerCpuArray::new();

/// The layout version of every map pinned beside it (`lb_common::MAP_LAYOUTS`): written by the
/// controller when it pins, read by the next controller before it adopts the pins. The
/// programs never touch it.
#[btf_map(name = "lb_layout")]
pub static LAYOUT: Array<u32, { LAYOUT_MAP_SLOTS as usize }> = Array::new();

/// Address → the local endpoint the fast path hands packets for it to (`redirect`). Written
/// only by the controller, from the namespace's neighbour table and bridge FDB, and kept
/// empty while the network may not bypass the stack.
#[btf_map(name = "lb_endpoints")]
pub static ENDPOINTS: HashMap<u32, Endpoint, { MAX_ENDPOINTS as usize }> = HashMap::new();

/// A DSR VIP's sessions: the client's tuple → the backend it sticks to and the frame header
/// that reaches it (`dsr`). An LRU, so a full table forgets its idlest sessions, which then
/// pick by the flow hash again (the same backend while the set is unchanged).
#[btf_map(name = "lb_dsr_sessions")]
pub static DSR_SESSIONS: LruHashMap<FlowKey, DsrSession, { MAX_DSR_SESSIONS as usize }> =
    LruHashMap::new();

/// Backend address → how a DSR frame reaches it (`Endpoint`: the device out of which, the
/// backend's MAC and the device's). Written only by the controller, from the neighbour table
/// of the network's namespace; a backend absent here gets no new session.
#[btf_map(name = "lb_dsr_backends")]
pub static DSR_BACKENDS: HashMap<u32, Endpoint, { MAX_DSR_BACKENDS as usize }, NO_PREALLOC> =
    HashMap::new();

/// Which namespace's sockets the socket programs serve (`sock`). Written only by the
/// controller, at every apply.
#[btf_map(name = "lb_sock")]
pub static SOCK: Array<SockConfig, 1> = Array::new();

/// A socket sent to a backend → the service address it asked for (`sock`): what its answers
/// and its peer name show. Written by the socket programs; an LRU, so sockets long closed
/// make room (a socket idle behind more than this many newer ones shows the backend's
/// address again).
#[btf_map(name = "lb_sock_rev")]
pub static SOCK_REV: LruHashMap<SockRevKey, SockRev, { MAX_SOCK_REV as usize }> = LruHashMap::new();

#[btf_map(name = "lb_sock_rev6")]
pub static SOCK_REV6: LruHashMap<SockRevKey6, SockRev6, { MAX_SOCK_REV as usize }> =
    LruHashMap::new();

// The IPv6 twins of the maps that hold addresses (docs/dual-stack.md): the same roles, keys
// and values with IPv6 addresses, written and read by the same code built for IPv6
// ([`FamilyMaps`]). Set ids, counter ids and the config are shared with IPv4.

#[btf_map(name = "lb_vips6")]
pub static VIPS6: HashMap<VipKey6, Service, { MAX_SERVICES as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "lb_ports6")]
pub static PORTS6: HashMap<PortKey6, Service, { MAX_SERVICES as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "lb_backends6")]
pub static BACKENDS6: HashMap<BackendKey, Backend6, { MAX_BACKEND_SLOTS as usize }, NO_PREALLOC> =
    HashMap::new();

#[btf_map(name = "lb_flows6")]
pub static FLOWS6: LruHashMap<FlowKey6, Flow6, { MAX_FLOWS as usize }> = LruHashMap::new();

#[btf_map(name = "lb_frags6")]
pub static FRAGS6: LruHashMap<FragKey6, FragPorts, { MAX_FRAGS as usize }> = LruHashMap::new();

#[btf_map(name = "lb_local_addrs6")]
pub static LOCAL_ADDRS6: HashMap<Addr6, u32, { MAX_LOCAL_ADDRS as usize }> = HashMap::new();

#[btf_map(name = "lb_ifaces6")]
pub static IFACES6: HashMap<u32, Iface6, { MAX_IFACES as usize }> = HashMap::new();

#[btf_map(name = "lb_endpoints6")]
pub static ENDPOINTS6: HashMap<Addr6, Endpoint, { MAX_ENDPOINTS as usize }> = HashMap::new();

#[btf_map(name = "lb_dsr_sessions6")]
pub static DSR_SESSIONS6: LruHashMap<FlowKey6, DsrSession6, { MAX_DSR_SESSIONS as usize }> =
    LruHashMap::new();

/// The backend's MAC as the namespace's IPv6 neighbour table has it (neighbour discovery
/// where IPv4's has ARP); the value is IPv4's, which holds no address.
#[btf_map(name = "lb_dsr_backends6")]
pub static DSR_BACKENDS6: HashMap<Addr6, Endpoint, { MAX_DSR_BACKENDS as usize }, NO_PREALLOC> =
    HashMap::new();

/// The maps of one address family: what the paths written once over [`Addr`] look up.
pub trait FamilyMaps: Addr {
    fn vips() -> &'static HashMap<VipKeyOf<Self>, Service, { MAX_SERVICES as usize }, NO_PREALLOC>;
    fn ports() -> &'static HashMap<PortKeyOf<Self>, Service, { MAX_SERVICES as usize }, NO_PREALLOC>;
    fn backends()
    -> &'static HashMap<BackendKey, BackendOf<Self>, { MAX_BACKEND_SLOTS as usize }, NO_PREALLOC>;
    fn flows() -> &'static LruHashMap<FlowKeyOf<Self>, FlowOf<Self>, { MAX_FLOWS as usize }>;
    fn local_addrs() -> &'static HashMap<Self, u32, { MAX_LOCAL_ADDRS as usize }>;
    fn ifaces() -> &'static HashMap<u32, IfaceOf<Self>, { MAX_IFACES as usize }>;
    fn endpoints() -> &'static HashMap<Self, Endpoint, { MAX_ENDPOINTS as usize }>;
    fn dsr_sessions()
    -> &'static LruHashMap<FlowKeyOf<Self>, DsrSessionOf<Self>, { MAX_DSR_SESSIONS as usize }>;
    fn dsr_backends() -> &'static HashMap<Self, Endpoint, { MAX_DSR_BACKENDS as usize }, NO_PREALLOC>;
}

/// Implements [`FamilyMaps`] for `$a` by the maps named.
macro_rules! family_maps {
    (
        $a:ty,
        $vips:ident,
        $ports:ident,
        $backends:ident,
        $flows:ident,
        $local:ident,
        $ifaces:ident,
        $endpoints:ident,
        $dsr_sessions:ident,
        $dsr_backends:ident
    ) => {
        impl FamilyMaps for $a {
            #[inline(always)]
            fn vips()
            -> &'static HashMap<VipKeyOf<Self>, Service, { MAX_SERVICES as usize }, NO_PREALLOC>
            {
                &$vips
            }
            #[inline(always)]
            fn ports()
            -> &'static HashMap<PortKeyOf<Self>, Service, { MAX_SERVICES as usize }, NO_PREALLOC>
            {
                &$ports
            }
            #[inline(always)]
            fn backends() -> &'static HashMap<
                BackendKey,
                BackendOf<Self>,
                { MAX_BACKEND_SLOTS as usize },
                NO_PREALLOC,
            > {
                &$backends
            }
            #[inline(always)]
            fn flows() -> &'static LruHashMap<FlowKeyOf<Self>, FlowOf<Self>, { MAX_FLOWS as usize }>
            {
                &$flows
            }
            #[inline(always)]
            fn local_addrs() -> &'static HashMap<Self, u32, { MAX_LOCAL_ADDRS as usize }> {
                &$local
            }
            #[inline(always)]
            fn ifaces() -> &'static HashMap<u32, IfaceOf<Self>, { MAX_IFACES as usize }> {
                &$ifaces
            }
            #[inline(always)]
            fn endpoints() -> &'static HashMap<Self, Endpoint, { MAX_ENDPOINTS as usize }> {
                &$endpoints
            }
            #[inline(always)]
            fn dsr_sessions() -> &'static LruHashMap<
                FlowKeyOf<Self>,
                DsrSessionOf<Self>,
                { MAX_DSR_SESSIONS as usize },
            > {
                &$dsr_sessions
            }
            #[inline(always)]
            fn dsr_backends()
            -> &'static HashMap<Self, Endpoint, { MAX_DSR_BACKENDS as usize }, NO_PREALLOC> {
                &$dsr_backends
            }
        }
    };
}

family_maps!(
    u32,
    VIPS,
    PORTS,
    BACKENDS,
    FLOWS,
    LOCAL_ADDRS,
    IFACES,
    ENDPOINTS,
    DSR_SESSIONS,
    DSR_BACKENDS
);
family_maps!(
    Addr6,
    VIPS6,
    PORTS6,
    BACKENDS6,
    FLOWS6,
    LOCAL_ADDRS6,
    IFACES6,
    ENDPOINTS6,
    DSR_SESSIONS6,
    DSR_BACKENDS6
);

/// The working memory of the paths, a slot per hook (`room::Slot`): never persisted, never
/// read by the controller.
#[btf_map(name = "lb_slots")]
pub static SLOTS: PerCpuArray<Slot<u32>, { HOOKS.len() }> = PerCpuArray::new();

#[btf_map(name = "lb_slots6")]
pub static SLOTS6: PerCpuArray<Slot<Addr6>, { HOOKS.len() }> = PerCpuArray::new();

/// The IPv6 paths, each a program of its own that the IPv4 program of its hook tail-calls
/// for an IPv6 frame, at slot `hook` (`lb_common::HOOK_*`): a tail call starts a fresh stack,
/// and an IPv6 path's own does not fit in the 512 bytes of one beside IPv4's. One map per
/// program type (the kernel lets a program array serve one type): XDP's and TC's. Written
/// only by the controller, when it loads the programs; an empty slot passes IPv6 untouched.
#[btf_map(name = "lb_jump6_xdp")]
pub static JUMP6_XDP: ProgramArray<{ HOOKS.len() }> = ProgramArray::new();

#[btf_map(name = "lb_jump6_tc")]
pub static JUMP6_TC: ProgramArray<{ HOOKS.len() }> = ProgramArray::new();
