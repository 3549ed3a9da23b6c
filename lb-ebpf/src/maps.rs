//! Every map of the dataplane, declared once. One object instance (and so one set of these
//! maps) per network; the controller pins them under `<bpffs>/<network>/`.
//!
//! Ownership: the controller is the only writer of every map here except `lb_flows` (written
//! by the programs per new flow; the controller only deletes from it, to flush the flows of a
//! removed backend) and `lb_counters` (programs only).
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use lb_common::{
    Backend, BackendKey, Config, Counters, FlowKey, Iface, MAX_BACKEND_SLOTS, MAX_COUNTERS,
    MAX_FLOWS, MAX_IFACES, MAX_LOCAL_ADDRS, MAX_SERVICES, PortKey, Service, Translation, VipKey,
};

/// VIP → its backend set. Every port of a VIP is balanced.
#[map(name = "lb_vips")]
pub static VIPS: HashMap<VipKey, Service> =
    HashMap::with_max_entries(MAX_SERVICES, BPF_F_NO_PREALLOC);

/// (host_ip or 0, port, proto) → its backend set.
#[map(name = "lb_ports")]
pub static PORTS: HashMap<PortKey, Service> =
    HashMap::with_max_entries(MAX_SERVICES, BPF_F_NO_PREALLOC);

/// (set, slot) → backend. A set is immutable once a service entry points at it.
#[map(name = "lb_backends")]
pub static BACKENDS: HashMap<BackendKey, Backend> =
    HashMap::with_max_entries(MAX_BACKEND_SLOTS, BPF_F_NO_PREALLOC);

/// Both directions of every tracked flow (and the masquerade port claims).
#[map(name = "lb_flows")]
pub static FLOWS: LruHashMap<FlowKey, Translation> = LruHashMap::with_max_entries(MAX_FLOWS, 0);

/// The node's own addresses: a published port without `host_ip` matches only these.
#[map(name = "lb_local_addrs")]
pub static LOCAL_ADDRS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_LOCAL_ADDRS, 0);

/// ifindex → the address masqueraded flows leaving by it take.
#[map(name = "lb_ifaces")]
pub static IFACES: HashMap<u32, Iface> = HashMap::with_max_entries(MAX_IFACES, 0);

#[map(name = "lb_config")]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map(name = "lb_counters")]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(MAX_COUNTERS, 0);
