//! The eBPF dataplane: loads the embedded object once per network with every map pinned under
//! `<bpffs>/<network>/`, attaches the programs, and writes composed state into the maps.
//!
//! Contracts that make it safe:
//! - The maps are the record. A pinned map that already exists is adopted, not recreated, and
//!   the first sync reads what the maps hold (kept as a mirror, see `sync.rs`) and writes only
//!   the difference, so a restarted (or re-run) controller picks up where the last one stopped
//!   without flushing a flow.
//! - Capacity: a network's maps are created with the daemon's sizes ([`MapSizes`]:
//!   `--max-services`, `--max-backends`, `--max-flows`); a pinned map keeps the size it was
//!   created with, which is read back ([`EbpfNetwork::sizes`]) and is what a change is checked
//!   against ([`Need`]) before the daemon saves it.
//! - A pinned map is adopted only in the layout this binary's programs read: `lb_layout`
//!   records each map's layout version (`lb_common::MAP_LAYOUTS`). A network whose pins hold
//!   a map of another version (or predate the record: version 1) is refused, and nothing of
//!   it is touched: its old programs keep serving with its old maps, and the network fails
//!   with a message naming each map, the two versions and the way out. Statistics maps
//!   (`DISPOSABLE_MAPS`) are replaced without asking, and so is `lb_config`, converted
//!   (`layouts.rs`: every apply rewrites it but for the flow-hash key, which is
//!   carried over). For the rest lb defines no conversion, so the way out is the operator's
//!   explicit choice:
//!   `--replace-incompatible-maps` (daemon, `lb load`) replaces those maps, once, losing what
//!   they held (flows, for `lb_flows`: a connection then re-creates its entries on the same
//!   backend from its next packet, by the flow hash in the adopted `lb_config`); maps whose
//!   version matches are adopted as always. Or run the lb that pinned them.
//! - Upgrades keep maps and flows: a newer lb adopts the pins and replaces the programs at
//!   every hook in place (`attach.rs`), so its code runs from the first apply, with no gap.
//! - A packet never sees a half-written backend set: a changed set is written under a fresh
//!   set id, then the service entry is switched to it in one map update, and the old set's
//!   slots are deleted one sync later, when no program run can still hold the old entry.
//! - Flows of a backend that is gone from the network are flushed (UDP clients are not pinned
//!   to a dead backend); a disabled backend is not gone, and its flows drain.
//! - Expired flow entries are deleted by the collector ([`gc`]) off the hot path; the programs
//!   already treat them as absent.
//!
//! One file because it is [`EbpfNetwork`] itself: opening one under the contracts above
//! (which pinned maps it may adopt is `layouts.rs`'s), recording its layouts, and the typed
//! handles to its maps that the modules beside it use.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap},
};
use lb_common::{
    Addr6, Backend, Backend6, BackendKey, Config, Counters, DISPOSABLE_MAPS, DsrSession,
    DsrSession6, Endpoint, Flow, Flow6, FlowKey, FlowKey6, Iface, Iface6, LAYOUT_MAP, MAP_LAYOUTS,
    PortKey, PortKey6, REASONS, Reason, Service, SockConfig, VipKey, VipKey6, filter::AddrFilter,
};

mod attach;
pub mod dataplane;
pub mod dsr;
pub mod fast;
pub mod gc;
mod layouts;
mod liberal;
mod plan;
mod sync;

pub use attach::detach_all;
use layouts::{CONFIG_MAP, Incompatible, converted_config, incompatible_layouts};
pub use layouts::{OnIncompatible, layouts_compatible};
pub use plan::{
    Held, MapAddr, MapIp, MapSizes, Need, NodeAddrs, Plan, PlanSets, ServiceKey, SetBackend, be,
    be4, be6, ip, ip4, ip6, need, need_sets, plan, plan_sets,
};

/// Names of the programs in the object, as `bpftool prog show` lists them.
pub const PROG_XDP: &str = "lb_xdp";
pub const PROG_TC_INGRESS: &str = "lb_tc_ingress";
pub const PROG_TC_EGRESS: &str = "lb_tc_egress";
pub const PROG_TC_REPLY: &str = "lb_tc_reply";
/// The socket programs, on the cgroup2 root (`attach.rs`): IPv4 sockets' and IPv6 sockets'.
pub const PROG_SOCK: [&str; 8] = [
    "lb_connect4",
    "lb_sendmsg4",
    "lb_recvmsg4",
    "lb_getpeername4",
    "lb_connect6",
    "lb_sendmsg6",
    "lb_recvmsg6",
    "lb_getpeername6",
];

pub use lb_common::HOOKS;

/// Where `lb load` and the daemon pin by default.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf/lb";

/// The eBPF object this binary was built with.
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"))
}

/// `LB_EBPF_OBJECT=FILE` in the environment loads the programs from FILE instead of the
/// object this binary embeds: the tests of program upgrades run a build that differs, and an
/// operator may try one. Its maps must be this binary's layouts (they are checked as pins are).
pub const OBJECT_ENV: &str = "LB_EBPF_OBJECT";

/// The object networks load: the file [`OBJECT_ENV`] names, else [`object`].
fn loaded_object() -> Result<&'static [u8]> {
    static OVERRIDE: OnceLock<Option<&'static [u8]>> = OnceLock::new();
    if let Some(over) = OVERRIDE.get() {
        return Ok(over.unwrap_or(object()));
    }
    let over = match std::env::var_os(OBJECT_ENV) {
        None => None,
        Some(path) => {
            let path = PathBuf::from(path);
            let bytes = std::fs::read(&path)
                .with_context(|| format!("{OBJECT_ENV}: reading {}", path.display()))?;
            tracing::warn!(object = %path.display(), "loading the eBPF programs from {OBJECT_ENV}, not the embedded object");
            // ELF parsing wants the alignment include_bytes_aligned gives the embedded object.
            let mut words = vec![0u64; bytes.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(&bytes);
            let all: &'static [u8] = bytemuck::cast_slice(Vec::leak(words));
            Some(&all[..bytes.len()])
        }
    };
    Ok(OVERRIDE.get_or_init(|| over).unwrap_or(object()))
}

/// How TC programs are attached: TCX links (kernel ≥ 6.6, pinnable, survive the loader) or
/// netlink clsact filters (older kernels; they stay until detached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcMode {
    Tcx,
    Netlink,
}

impl TcMode {
    pub fn detect() -> Self {
        use aya::util::KernelVersion;
        match KernelVersion::current() {
            Ok(v) if v >= KernelVersion::new(6, 6, 0) => TcMode::Tcx,
            _ => TcMode::Netlink,
        }
    }
}

/// One network's loaded object and its maps.
pub struct EbpfNetwork {
    ebpf: Ebpf,
    dir: PathBuf,
    vips: HashMap<MapData, VipKey, Service>,
    ports: HashMap<MapData, PortKey, Service>,
    backends: HashMap<MapData, BackendKey, Backend>,
    flows: HashMap<MapData, FlowKey, Flow>,
    local: HashMap<MapData, u32, u32>,
    ifaces: HashMap<MapData, u32, Iface>,
    // The IPv6 twins (docs/dual-stack.md, "v4/v6 map pairs"); set and counter ids are shared.
    vips6: HashMap<MapData, VipKey6, Service>,
    ports6: HashMap<MapData, PortKey6, Service>,
    backends6: HashMap<MapData, BackendKey, Backend6>,
    flows6: HashMap<MapData, FlowKey6, Flow6>,
    local6: HashMap<MapData, Addr6, u32>,
    ifaces6: HashMap<MapData, u32, Iface6>,
    config: Array<MapData, Config>,
    addr_filter: Array<MapData, AddrFilter>,
    vetted_since: Array<MapData, u32>,
    counters: PerCpuHashMap<MapData, u32, Counters>,
    reasons: PerCpuArray<MapData, u64>,
    endpoints: HashMap<MapData, u32, Endpoint>,
    endpoints6: HashMap<MapData, Addr6, Endpoint>,
    dsr_sessions: HashMap<MapData, FlowKey, DsrSession>,
    dsr_backends: HashMap<MapData, u32, Endpoint>,
    dsr_sessions6: HashMap<MapData, FlowKey6, DsrSession6>,
    dsr_backends6: HashMap<MapData, Addr6, Endpoint>,
    sock: Array<MapData, SockConfig>,
    /// What `lb_dsr_backends` and `lb_dsr_backends6` hold, as the last write left them
    /// (`None`: read it first).
    dsr_mirror: Option<BTreeMap<u32, Endpoint>>,
    dsr_mirror6: Option<BTreeMap<Addr6, Endpoint>>,
    /// The DSR backends the last apply could not resolve, with why (`dsr`).
    dsr_unresolved: BTreeMap<std::net::IpAddr, String>,
    /// What `lb_endpoints` and `lb_endpoints6` hold, as the last write left them (`None`:
    /// read it first).
    endpoint_mirror: Option<BTreeMap<u32, Endpoint>>,
    endpoint_mirror6: Option<BTreeMap<Addr6, Endpoint>>,
    /// The forward-hook rules last read in the network's namespace (`fast`).
    filters: Option<crate::node::ForwardFilters>,
    /// The path last decided (`fast`).
    path: Option<fast::PathState>,
    /// The hooks (`attach::hook_name`) found running, or made to run, this object's programs,
    /// with the index of the interface they were checked on: an interface deleted and created
    /// again under its name has a new index, so its hooks are checked again.
    hooks: BTreeMap<String, u32>,
    /// The capacities of the maps as the kernel has them (a pinned map adopted keeps the size
    /// it was created with, whatever this process was configured with).
    sizes: MapSizes,
    /// What the maps hold (`None` until the first sync reads them).
    mirror: Option<sync::Mirror>,
}

/// The pin directory of `network` under `bpffs`.
pub fn pin_dir(bpffs: &Path, network: &str) -> PathBuf {
    bpffs.join(network)
}

impl EbpfNetwork {
    /// Loads the object with every map pinned under `dir` (created if missing; it must be on a
    /// bpffs). Maps already pinned there in this binary's layouts are adopted with their
    /// contents; a map of another layout is refused or replaced as `on_incompatible` says.
    /// Missing maps are created with `sizes`; maps already pinned keep theirs (see
    /// [`EbpfNetwork::sizes`]).
    pub fn open(dir: &Path, sizes: &MapSizes, on_incompatible: OnIncompatible) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating pin directory {}", dir.display()))?;
        let incompatible = incompatible_layouts(dir)?;
        // Statistics and short-lived hints (`DISPOSABLE_MAPS`) are replaced without asking:
        // losing them costs counter values, not a connection; so is the config, whose one
        // value to keep is carried over. The rest needs the operator.
        let (disposable, kept): (Vec<_>, Vec<_>) = (incompatible.iter())
            .partition(|m| DISPOSABLE_MAPS.contains(&m.name) || m.name == CONFIG_MAP);
        let describe = |maps: &[&Incompatible]| {
            maps.iter()
                .map(|m| m.described.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !kept.is_empty() && on_incompatible == OnIncompatible::Refuse {
            bail!(
                "pinned maps under {} are of another layout: {}; lb converts none, so the network stays as it is (its programs keep serving): run the lb that pinned them, or restart with --replace-incompatible-maps to replace those maps (what they hold is lost once)",
                dir.display(),
                describe(&kept)
            );
        }
        let replaced: Vec<_> = match on_incompatible {
            OnIncompatible::Replace => incompatible.iter().collect(),
            OnIncompatible::Refuse => disposable,
        };
        let carried = match replaced.iter().find(|m| m.name == CONFIG_MAP) {
            Some(m) => converted_config(&m.pin, m.have)?,
            None => None,
        };
        if !replaced.is_empty() {
            for m in &replaced {
                std::fs::remove_file(&m.pin)
                    .with_context(|| format!("removing {}", m.pin.display()))?;
            }
            // The programs still attached use the old maps until the first apply replaces
            // them in place (`attach`: their map ids differ from ours).
            tracing::warn!(
                dir = %dir.display(),
                maps = %describe(&replaced),
                "replacing pinned maps of another layout (statistics without asking, the others as --replace-incompatible-maps asks); what they held is lost once"
            );
        }
        let mut loader = EbpfLoader::new();
        for (map, n) in [
            ("lb_vips", sizes.services),
            ("lb_ports", sizes.services),
            ("lb_backends", sizes.backends),
            ("lb_flows", sizes.flows),
            ("lb_vips6", sizes.services),
            ("lb_ports6", sizes.services),
            ("lb_backends6", sizes.backends),
            ("lb_flows6", sizes.flows),
            ("lb_counters", sizes.counters),
        ] {
            loader.map_max_entries(map, n);
        }
        let paths: Vec<(&str, PathBuf)> = (MAP_LAYOUTS.iter().map(|(m, _)| *m))
            .chain([LAYOUT_MAP])
            .map(|m| (m, dir.join(m)))
            .collect();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let ebpf = loader.load(loaded_object()?).with_context(|| {
            format!(
                "loading the eBPF object with maps pinned under {} (is it on a bpffs?)",
                dir.display()
            )
        })?;
        let mut net = Self::from_ebpf(ebpf, dir.to_path_buf())?;
        if let Some(config) = carried {
            (net.config.set(0, config, 0)).context("writing the converted lb_config")?;
            tracing::info!(dir = %dir.display(), "lb_config of another layout replaced, its values (the flow-hash key among them) carried over");
        }
        net.record_layouts()?;
        Ok(net)
    }

    /// Loads the object with private, unpinned maps (program-level tests, the kernel probe).
    pub fn unpinned() -> Result<Self> {
        let ebpf = Ebpf::load(loaded_object()?).context("loading the eBPF object")?;
        Self::from_ebpf(ebpf, PathBuf::new())
    }

    fn from_ebpf(mut ebpf: Ebpf, dir: PathBuf) -> Result<Self> {
        fn take(ebpf: &mut Ebpf, name: &str) -> Result<Map> {
            ebpf.take_map(name)
                .with_context(|| format!("map {name} missing from the object"))
        }
        let (vips, backends, flows, counters) = (
            take(&mut ebpf, "lb_vips")?,
            take(&mut ebpf, "lb_backends")?,
            take(&mut ebpf, "lb_flows")?,
            take(&mut ebpf, "lb_counters")?,
        );
        let sizes = MapSizes {
            services: max_entries(&vips)?,
            backends: max_entries(&backends)?,
            flows: max_entries(&flows)?,
            counters: max_entries(&counters)?,
        };
        Ok(Self {
            vips: HashMap::try_from(vips)?,
            ports: HashMap::try_from(take(&mut ebpf, "lb_ports")?)?,
            backends: HashMap::try_from(backends)?,
            flows: HashMap::try_from(flows)?,
            local: HashMap::try_from(take(&mut ebpf, "lb_local_addrs")?)?,
            ifaces: HashMap::try_from(take(&mut ebpf, "lb_ifaces")?)?,
            vips6: HashMap::try_from(take(&mut ebpf, "lb_vips6")?)?,
            ports6: HashMap::try_from(take(&mut ebpf, "lb_ports6")?)?,
            backends6: HashMap::try_from(take(&mut ebpf, "lb_backends6")?)?,
            flows6: HashMap::try_from(take(&mut ebpf, "lb_flows6")?)?,
            local6: HashMap::try_from(take(&mut ebpf, "lb_local_addrs6")?)?,
            ifaces6: HashMap::try_from(take(&mut ebpf, "lb_ifaces6")?)?,
            config: Array::try_from(take(&mut ebpf, "lb_config")?)?,
            addr_filter: Array::try_from(take(&mut ebpf, "lb_addr_filter")?)?,
            vetted_since: Array::try_from(take(&mut ebpf, "lb_vetted_since")?)?,
            counters: PerCpuHashMap::try_from(counters)?,
            reasons: PerCpuArray::try_from(take(&mut ebpf, "lb_reasons")?)?,
            endpoints: HashMap::try_from(take(&mut ebpf, "lb_endpoints")?)?,
            endpoints6: HashMap::try_from(take(&mut ebpf, "lb_endpoints6")?)?,
            dsr_sessions: HashMap::try_from(take(&mut ebpf, "lb_dsr_sessions")?)?,
            dsr_backends: HashMap::try_from(take(&mut ebpf, "lb_dsr_backends")?)?,
            dsr_sessions6: HashMap::try_from(take(&mut ebpf, "lb_dsr_sessions6")?)?,
            dsr_backends6: HashMap::try_from(take(&mut ebpf, "lb_dsr_backends6")?)?,
            sock: Array::try_from(take(&mut ebpf, "lb_sock")?)?,
            endpoint_mirror: None,
            endpoint_mirror6: None,
            dsr_mirror: None,
            dsr_mirror6: None,
            dsr_unresolved: BTreeMap::new(),
            filters: None,
            path: None,
            ebpf,
            dir,
            hooks: BTreeMap::new(),
            sizes,
            mirror: None,
        })
    }

    /// The capacities of this network's maps.
    pub fn sizes(&self) -> MapSizes {
        self.sizes
    }

    fn record_layouts(&mut self) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(LAYOUT_MAP)
            .context("map lb_layout missing from the object")?;
        let mut array: Array<&mut MapData, u32> = Array::try_from(map)?;
        for (i, (_, version)) in MAP_LAYOUTS.iter().enumerate() {
            array
                .set(i as u32, version, 0)
                .context("writing lb_layout")?;
        }
        Ok(())
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Every flow entry (both directions and masquerade pairs), expired ones included.
    pub fn flow_entries(&self) -> Vec<(FlowKey, Flow)> {
        self.flows.iter().filter_map(|e| e.ok()).collect()
    }

    /// Every IPv6 flow entry, as [`EbpfNetwork::flow_entries`].
    pub fn flow_entries6(&self) -> Vec<(FlowKey6, Flow6)> {
        self.flows6.iter().filter_map(|e| e.ok()).collect()
    }

    /// Every DSR session, idle ones past their timeout included.
    pub fn dsr_sessions(&self) -> Vec<(FlowKey, DsrSession)> {
        self.dsr_sessions.iter().filter_map(|e| e.ok()).collect()
    }

    /// The DSR session map (the collector's deletes; tests that take sessions away).
    pub fn dsr_sessions_mut(&mut self) -> &mut HashMap<MapData, FlowKey, DsrSession> {
        &mut self.dsr_sessions
    }

    /// The DSR backend map: backend address → how a DSR frame reaches it.
    pub fn dsr_backends_mut(&mut self) -> &mut HashMap<MapData, u32, Endpoint> {
        &mut self.dsr_backends
    }

    /// Every IPv6 DSR session, as [`EbpfNetwork::dsr_sessions`].
    pub fn dsr_sessions6(&self) -> Vec<(FlowKey6, DsrSession6)> {
        self.dsr_sessions6.iter().filter_map(|e| e.ok()).collect()
    }

    pub fn dsr_sessions6_mut(&mut self) -> &mut HashMap<MapData, FlowKey6, DsrSession6> {
        &mut self.dsr_sessions6
    }

    pub fn dsr_backends6_mut(&mut self) -> &mut HashMap<MapData, Addr6, Endpoint> {
        &mut self.dsr_backends6
    }

    /// The flow map, for tests that take entries away as LRU eviction would.
    pub fn flows_mut(&mut self) -> &mut HashMap<MapData, FlowKey, Flow> {
        &mut self.flows
    }

    /// The IPv6 flow map, as [`EbpfNetwork::flows_mut`].
    pub fn flows6_mut(&mut self) -> &mut HashMap<MapData, FlowKey6, Flow6> {
        &mut self.flows6
    }

    /// Makes the socket programs serve the sockets of the namespace whose cookie is `netns`
    /// (`lb_common::SockConfig`); written only when it changed.
    pub fn serve_sockets_of(&mut self, netns: u64) -> Result<()> {
        let want = SockConfig {
            netns_cookie: netns,
        };
        if self.sock.get(&0, 0).ok() != Some(want) {
            self.sock.set(0, want, 0).context("writing lb_sock")?;
        }
        Ok(())
    }

    /// The config the programs run with.
    pub fn config(&self) -> Result<Config> {
        self.config.get(&0, 0).context("reading lb_config")
    }

    /// Packets and bytes of a counter, summed over CPUs (zero before its first packet).
    pub fn counter(&self, id: u32) -> Result<Counters> {
        match self.counters.get(&id, 0) {
            Ok(per_cpu) => Ok(sum_cpus(&per_cpu)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(Counters::default()),
            Err(e) => Err(e).context("reading lb_counters"),
        }
    }

    /// Every counter that has counted a packet, summed over CPUs: one walk of `lb_counters`,
    /// whose entries are only those of services and backends that carried traffic.
    pub fn counters(&self) -> Result<BTreeMap<u32, Counters>> {
        (self.counters.iter())
            .map(|e| {
                let (id, per_cpu) = e.context("reading lb_counters")?;
                Ok((id, sum_cpus(&per_cpu)))
            })
            .collect()
    }

    /// Every program's outcome counts, summed over CPUs: `(hook, reason, count)`.
    pub fn reasons(&self) -> Result<Vec<(&'static str, Reason, u64)>> {
        let mut out = Vec::new();
        for (h, hook) in HOOKS.iter().enumerate() {
            for (reason, _) in Reason::ALL {
                let slot = h as u32 * REASONS + reason as u32;
                let per_cpu = self.reasons.get(&slot, 0).context("reading lb_reasons")?;
                out.push((*hook, reason, per_cpu.iter().sum()));
            }
        }
        Ok(out)
    }
}

fn sum_cpus(per_cpu: &[Counters]) -> Counters {
    per_cpu.iter().fold(Counters::default(), |acc, c| Counters {
        packets: acc.packets + c.packets,
        bytes: acc.bytes + c.bytes,
    })
}

/// A map's capacity as the kernel has it.
fn max_entries(map: &Map) -> Result<u32> {
    let data = match map {
        Map::HashMap(m) | Map::LruHashMap(m) | Map::PerCpuHashMap(m) => m,
        _ => bail!("reading a map's size: not a hash map"),
    };
    Ok(data.info().context("reading a map's size")?.max_entries())
}

/// The system's bpffs mount point, which systemd mounts at boot on most distributions.
const SYSTEM_BPFFS: &str = "/sys/fs/bpf";

/// Makes sure pins under `dir` land on a bpffs: if `dir` lies under /sys/fs/bpf and nothing
/// is mounted there yet, mounts it (as systemd would at boot); any other directory must
/// already be on one.
pub fn ensure_bpffs(dir: &Path) -> Result<()> {
    if check_bpffs(dir).is_ok() {
        return Ok(());
    }
    let system = Path::new(SYSTEM_BPFFS);
    if dir.starts_with(system) && system.is_dir() {
        // SAFETY: constant C strings; no data argument.
        let rc = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                c"/sys/fs/bpf".as_ptr(),
                c"bpf".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            bail!(
                "mounting a bpffs on {SYSTEM_BPFFS}: {}",
                std::io::Error::last_os_error()
            );
        }
        tracing::info!("mounted a bpffs on {SYSTEM_BPFFS}");
    }
    check_bpffs(dir)
}

/// Fails with a clear message unless `dir` (or its nearest existing parent) is on a bpffs.
pub fn check_bpffs(dir: &Path) -> Result<()> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let mut probe = dir;
    while !probe.exists() {
        probe = probe.parent().context("no existing parent directory")?;
    }
    let c = std::ffi::CString::new(probe.as_os_str().as_encoded_bytes())?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and st a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        bail!(
            "statfs {}: {}",
            probe.display(),
            std::io::Error::last_os_error()
        );
    }
    if st.f_type as i64 != BPF_FS_MAGIC {
        bail!(
            "{} is not on a bpffs (mount one: mount -t bpf bpf {})",
            probe.display(),
            probe.display()
        );
    }
    Ok(())
}
