//! Every map of the dataplane, declared once. One object instance (and so one set of these
//! maps) per network; the controller pins them under `<bpffs>/<network>/` and records their
//! layout versions (`lb_common::MAP_LAYOUTS`).
//!
//! Who writes what: the controller is the only writer of the service, backend, address, endpoint,
//! interface, DSR backend, socket config and config maps. The programs write `lb_flows`
//! (entries of new flows, state and expiry of live ones), `lb_dsr_sessions`,
//! `lb_sock_rev`, `lb_frags`, and the counters; the
//! controller only deletes from `lb_flows` and `lb_dsr_sessions` (expired entries, and the
//! UDP flows and sessions of a removed backend).
//!
//! Every map is a BTF map (`#[btf_map]`, section `.maps`): the kernel keeps its key and value
//! types, so `bpftool map dump` shows each field by name. A map pinned by an lb of before the
//! BTF maps (legacy `maps` section) is adopted as it is when its type, sizes and flags match:
//! the programs read it the same, and it shows bytes until it is created again.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    macros::btf_map,
};
use lb_common::{
    Backend, BackendKey, Config, Counters, DsrSession, Endpoint, Flow, FlowKey, FragKey, FragPorts,
    HOOKS, Iface, LAYOUT_MAP_SLOTS, MAX_BACKEND_SLOTS, MAX_COUNTERS, MAX_DSR_BACKENDS,
    MAX_DSR_SESSIONS, MAX_ENDPOINTS, MAX_FLOWS, MAX_FRAGS, MAX_IFACES, MAX_LOCAL_ADDRS,
    MAX_SERVICES, MAX_SOCK_REV, PortKey, REASONS, Service, SockConfig, SockRev, SockRevKey, VipKey,
};

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
