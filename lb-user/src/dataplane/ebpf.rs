//! The eBPF dataplane: loads the embedded object once per network with every map pinned under
//! `<bpffs>/<network>/`, attaches the programs, and writes composed state into the maps.
//!
//! Contracts that make it safe:
//! - The maps are the record. A pinned map that already exists is adopted, not recreated, and
//!   a sync reads what the maps hold and writes only the difference, so a restarted (or
//!   re-run) controller picks up where the last one stopped without flushing a flow.
//! - A packet never sees a half-written backend set: a changed set is written under a fresh
//!   set id, then the service entry is switched to it in one map update, then the old set's
//!   slots are deleted.
//! - Flows of a backend that is gone from the network are flushed (UDP clients are not pinned
//!   to a dead backend); a disabled backend is not gone, and its flows drain.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuValues},
    programs::{
        SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        tc::{self, NlOptions, TcAttachOptions},
    },
};
use lb_common::{
    Backend, BackendKey, Config, Counters, FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, FlowKey,
    IPPROTO_UDP, Iface, MASQ_ALWAYS, MASQ_AUTO, MASQ_NEVER, MAX_COUNTERS, PortKey, Service,
    Translation, VipKey,
};

use crate::{
    compose::Composed,
    model::{Attach, Masquerade, Network},
};

/// Names of the programs in the object, as `bpftool prog show` lists them.
pub const PROG_XDP: &str = "lb_xdp";
pub const PROG_TC_INGRESS: &str = "lb_tc_ingress";
pub const PROG_TC_EGRESS: &str = "lb_tc_egress";

/// Every map of the object (`bpftool map show` lists them by these names).
pub const MAPS: [&str; 8] = [
    "lb_vips",
    "lb_ports",
    "lb_backends",
    "lb_flows",
    "lb_local_addrs",
    "lb_ifaces",
    "lb_config",
    "lb_counters",
];

/// Where `lb load` and the daemon pin by default.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf/lb";

/// The eBPF object this binary was built with.
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"))
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

/// A service map key: the VIP map's or the published-port map's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServiceKey {
    Vip(u32),
    Port { addr: u32, port: u16, proto: u8 },
}

/// What one network's maps must hold: every service key with its backend set in slot order
/// (address, destination port to rewrite to or 0 to keep; network byte order), plus the
/// masquerade mode. Pure: computed from the composed state alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub masquerade: u32,
    pub services: BTreeMap<ServiceKey, Vec<(u32, u16)>>,
}

pub fn plan(network: &Network, composed: &Composed) -> Plan {
    let mut services = BTreeMap::new();
    for (vip, backends) in &composed.vips {
        let set = backends.iter().map(|ip| (be(*ip), 0)).collect();
        services.insert(ServiceKey::Vip(be(*vip)), set);
    }
    for (key, backends) in &composed.ports {
        let set = backends
            .iter()
            .map(|(ip, port)| (be(*ip), port.to_be()))
            .collect();
        let addr = key.host_ip.map(be).unwrap_or(0);
        services.insert(
            ServiceKey::Port {
                addr,
                port: key.port.to_be(),
                proto: key.proto.number(),
            },
            set,
        );
    }
    let masquerade = match network.masquerade {
        Masquerade::Auto => MASQ_AUTO,
        Masquerade::Always => MASQ_ALWAYS,
        Masquerade::Never => MASQ_NEVER,
    };
    Plan {
        masquerade,
        services,
    }
}

/// An address as the maps hold it (network byte order in memory).
pub fn be(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

pub fn ip(addr: u32) -> Ipv4Addr {
    Ipv4Addr::from(addr.to_ne_bytes())
}

/// What a sync changed, in map entries written or deleted (the cost a one-backend change must
/// keep O(1)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub written: usize,
    pub deleted: usize,
    pub flows_flushed: usize,
}

/// The node facts a sync needs besides the plan, read from netlink by the caller.
#[derive(Clone, Debug, Default)]
pub struct NodeAddrs {
    /// Every IPv4 address of the node (its namespace): what published ports answer on.
    pub local: Vec<Ipv4Addr>,
    /// ifindex → masquerade address, for each of the network's interfaces.
    pub ifaces: Vec<(u32, Ipv4Addr)>,
}

/// One network's loaded object and its maps.
pub struct EbpfNetwork {
    ebpf: Ebpf,
    dir: PathBuf,
    vips: HashMap<MapData, VipKey, Service>,
    ports: HashMap<MapData, PortKey, Service>,
    backends: HashMap<MapData, BackendKey, Backend>,
    flows: HashMap<MapData, FlowKey, Translation>,
    local: HashMap<MapData, u32, u32>,
    ifaces: HashMap<MapData, u32, Iface>,
    config: Array<MapData, Config>,
    counters: PerCpuArray<MapData, Counters>,
}

/// The pin directory of `network` under `bpffs`.
pub fn pin_dir(bpffs: &Path, network: &str) -> PathBuf {
    bpffs.join(network)
}

impl EbpfNetwork {
    /// Loads the object with every map pinned under `dir` (created if missing; it must be on a
    /// bpffs). Maps already pinned there are adopted with their contents.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating pin directory {}", dir.display()))?;
        let paths: Vec<(&str, PathBuf)> = MAPS.iter().map(|m| (*m, dir.join(m))).collect();
        let mut loader = EbpfLoader::new();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        let ebpf = loader.load(object()).with_context(|| {
            format!(
                "loading the eBPF object with maps pinned under {} (is it on a bpffs?)",
                dir.display()
            )
        })?;
        Self::from_ebpf(ebpf, dir.to_path_buf())
    }

    /// Loads the object with private, unpinned maps (program-level tests, the kernel probe).
    pub fn unpinned() -> Result<Self> {
        let ebpf = Ebpf::load(object()).context("loading the eBPF object")?;
        Self::from_ebpf(ebpf, PathBuf::new())
    }

    fn from_ebpf(mut ebpf: Ebpf, dir: PathBuf) -> Result<Self> {
        fn take(ebpf: &mut Ebpf, name: &str) -> Result<Map> {
            ebpf.take_map(name)
                .with_context(|| format!("map {name} missing from the object"))
        }
        Ok(Self {
            vips: HashMap::try_from(take(&mut ebpf, "lb_vips")?)?,
            ports: HashMap::try_from(take(&mut ebpf, "lb_ports")?)?,
            backends: HashMap::try_from(take(&mut ebpf, "lb_backends")?)?,
            flows: HashMap::try_from(take(&mut ebpf, "lb_flows")?)?,
            local: HashMap::try_from(take(&mut ebpf, "lb_local_addrs")?)?,
            ifaces: HashMap::try_from(take(&mut ebpf, "lb_ifaces")?)?,
            config: Array::try_from(take(&mut ebpf, "lb_config")?)?,
            counters: PerCpuArray::try_from(take(&mut ebpf, "lb_counters")?)?,
            ebpf,
            dir,
        })
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    fn link_path(&self, ifname: &str, hook: &str) -> PathBuf {
        self.dir.join(format!("link_{ifname}_{hook}"))
    }

    /// Attaches the programs to `ifname` (in the calling thread's network namespace): TC egress
    /// always; ingress by TC or XDP (native where the driver has it, generic otherwise). Links
    /// are pinned under the network's directory, so they outlive this process; a hook whose
    /// link is already pinned is left as it is (adopted).
    pub fn attach(&mut self, ifname: &str, attach: Attach, tc_mode: TcMode) -> Result<()> {
        self.attach_tc(
            ifname,
            PROG_TC_EGRESS,
            TcAttachType::Egress,
            "egress",
            tc_mode,
        )?;
        match attach {
            Attach::Tc => self.attach_tc(
                ifname,
                PROG_TC_INGRESS,
                TcAttachType::Ingress,
                "ingress",
                tc_mode,
            ),
            Attach::Xdp => self.attach_xdp(ifname),
        }
    }

    fn attach_tc(
        &mut self,
        ifname: &str,
        prog: &str,
        hook: TcAttachType,
        name: &str,
        mode: TcMode,
    ) -> Result<()> {
        let pin = self.link_path(ifname, name);
        if mode == TcMode::Tcx && pin.exists() {
            return Ok(());
        }
        let p: &mut SchedClassifier = self
            .ebpf
            .program_mut(prog)
            .with_context(|| format!("{prog} missing from the object"))?
            .try_into()?;
        if p.fd().is_err() {
            p.load().with_context(|| format!("loading {prog}"))?;
        }
        let options = match mode {
            TcMode::Tcx => TcAttachOptions::TcxOrder(Default::default()),
            TcMode::Netlink => {
                // clsact may be there already (an earlier run, another tool): that is fine, and
                // any other failure surfaces as the attach's error below.
                let _ = tc::qdisc_add_clsact(ifname);
                // A filter of ours from an earlier run is replaced rather than stacked. Between
                // the two a packet passes untranslated; flows survive (they live in the maps).
                let _ = tc::qdisc_detach_program(ifname, hook, prog);
                TcAttachOptions::Netlink(NlOptions::default())
            }
        };
        let id = p
            .attach_with_options(ifname, hook, options)
            .with_context(|| format!("attaching {prog} to {ifname} {name} ({mode:?})"))?;
        let link = p.take_link(id)?;
        match mode {
            TcMode::Tcx => {
                let fd: FdLink = link.try_into().context("a TCX link is an fd link")?;
                pin_link(fd, &pin)
            }
            // A netlink filter belongs to the interface, not to this process: nothing to pin,
            // and dropping the handle must not detach it.
            TcMode::Netlink => {
                std::mem::forget(link);
                Ok(())
            }
        }
    }

    fn attach_xdp(&mut self, ifname: &str) -> Result<()> {
        let pin = self.link_path(ifname, "xdp");
        if pin.exists() {
            return Ok(());
        }
        let p: &mut Xdp = self
            .ebpf
            .program_mut(PROG_XDP)
            .context("lb_xdp missing from the object")?
            .try_into()?;
        if p.fd().is_err() {
            p.load().context("loading lb_xdp")?;
        }
        let id = match p.attach(ifname, XdpMode::Driver) {
            Ok(id) => id,
            Err(native) => {
                tracing::info!(interface = ifname, error = %native, "native XDP unavailable, using generic XDP");
                p.attach(ifname, XdpMode::Skb)
                    .with_context(|| format!("attaching lb_xdp to {ifname}"))?
            }
        };
        let link = p.take_link(id)?;
        let fd: FdLink = link
            .try_into()
            .context("XDP link is not an fd link (kernel too old)")?;
        pin_link(fd, &pin)
    }

    /// Writes `plan` and `node` into the maps, touching only what differs. `keep` is every
    /// backend of the network, enabled or disabled: flows to any other backend are flushed.
    pub fn sync(
        &mut self,
        plan: &Plan,
        node: &NodeAddrs,
        keep: &BTreeSet<Ipv4Addr>,
    ) -> Result<SyncStats> {
        let mut stats = SyncStats::default();
        let cfg = Config {
            masquerade: plan.masquerade,
            flags: 0,
        };
        if self.config.get(&0, 0).ok() != Some(cfg) {
            self.config.set(0, cfg, 0).context("writing lb_config")?;
            stats.written += 1;
        }
        sync_set(
            &mut self.local,
            node.local.iter().map(|a| (be(*a), 1)).collect(),
            &mut stats,
        )
        .context("writing lb_local_addrs")?;
        sync_set(
            &mut self.ifaces,
            node.ifaces
                .iter()
                .map(|(i, a)| {
                    (
                        *i,
                        Iface {
                            addr: be(*a),
                            flags: 0,
                        },
                    )
                })
                .collect(),
            &mut stats,
        )
        .context("writing lb_ifaces")?;

        let current = self.current_services()?;
        // Set ids start at 1, so that a zeroed service entry never names a live set.
        let mut set_ids = IdPool::new(current.values().map(|(s, _)| s.set_id), 1, u32::MAX);
        let mut counter_ids = IdPool::new(
            current.values().flat_map(|(s, set)| {
                std::iter::once(s.counter).chain(set.iter().map(|b| b.counter))
            }),
            0,
            MAX_COUNTERS,
        );
        let ncpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;

        for (key, want) in &plan.services {
            let old = current.get(key);
            if let Some((_, have)) = old
                && have
                    .iter()
                    .map(|b| (b.addr, b.port))
                    .eq(want.iter().copied())
            {
                continue;
            }
            let set_id = set_ids.take().context("no free backend set id")?;
            for (slot, (addr, port)) in want.iter().enumerate() {
                // A backend keeps its counter slot across set changes of its service.
                let counter = match old.and_then(|(_, have)| have.iter().find(|b| b.addr == *addr))
                {
                    Some(b) => b.counter,
                    None => self.alloc_counter(&mut counter_ids, ncpus)?,
                };
                let b = Backend {
                    addr: *addr,
                    port: *port,
                    _pad: 0,
                    counter,
                };
                self.backends
                    .insert(
                        BackendKey {
                            set_id,
                            slot: slot as u32,
                        },
                        b,
                        0,
                    )
                    .context("writing lb_backends")?;
                stats.written += 1;
            }
            let counter = match old {
                Some((s, _)) => s.counter,
                None => self.alloc_counter(&mut counter_ids, ncpus)?,
            };
            let svc = Service {
                set_id,
                count: want.len() as u32,
                counter,
                flags: 0,
            };
            self.put_service(key, svc)?;
            stats.written += 1;
            if let Some((s, have)) = old {
                self.delete_set(s.set_id, have.len(), &mut stats)?;
            }
        }
        for (key, (s, have)) in &current {
            if plan.services.contains_key(key) {
                continue;
            }
            match key {
                ServiceKey::Vip(addr) => self.vips.remove(&VipKey { addr: *addr }),
                ServiceKey::Port { addr, port, proto } => self.ports.remove(&PortKey {
                    addr: *addr,
                    port: *port,
                    proto: *proto,
                    _pad: 0,
                }),
            }
            .context("deleting a service entry")?;
            stats.deleted += 1;
            self.delete_set(s.set_id, have.len(), &mut stats)?;
        }
        stats.flows_flushed = self.flush_flows(keep)?;
        Ok(stats)
    }

    fn put_service(&mut self, key: &ServiceKey, svc: Service) -> Result<()> {
        match key {
            ServiceKey::Vip(addr) => self.vips.insert(VipKey { addr: *addr }, svc, 0),
            ServiceKey::Port { addr, port, proto } => self.ports.insert(
                PortKey {
                    addr: *addr,
                    port: *port,
                    proto: *proto,
                    _pad: 0,
                },
                svc,
                0,
            ),
        }
        .context("writing a service entry")
    }

    fn delete_set(&mut self, set_id: u32, count: usize, stats: &mut SyncStats) -> Result<()> {
        for slot in 0..count as u32 {
            self.backends
                .remove(&BackendKey { set_id, slot })
                .context("deleting from lb_backends")?;
            stats.deleted += 1;
        }
        Ok(())
    }

    fn alloc_counter(&mut self, ids: &mut IdPool, ncpus: usize) -> Result<u32> {
        let slot = ids.take().context("no free counter slot")?;
        // A freed slot keeps what its last owner counted: start the new owner at zero.
        let zero = PerCpuValues::try_from(vec![Counters::default(); ncpus])?;
        self.counters
            .set(slot, zero, 0)
            .context("zeroing a counter slot")?;
        Ok(slot)
    }

    /// Every service entry with its backend set, in slot order.
    pub fn current_services(&self) -> Result<BTreeMap<ServiceKey, (Service, Vec<Backend>)>> {
        let mut out = BTreeMap::new();
        for k in self.vips.keys() {
            let k = k.context("reading lb_vips")?;
            let s = self.vips.get(&k, 0).context("reading lb_vips")?;
            out.insert(ServiceKey::Vip(k.addr), (s, self.read_set(&s)?));
        }
        for k in self.ports.keys() {
            let k = k.context("reading lb_ports")?;
            let s = self.ports.get(&k, 0).context("reading lb_ports")?;
            out.insert(
                ServiceKey::Port {
                    addr: k.addr,
                    port: k.port,
                    proto: k.proto,
                },
                (s, self.read_set(&s)?),
            );
        }
        Ok(out)
    }

    fn read_set(&self, s: &Service) -> Result<Vec<Backend>> {
        (0..s.count)
            .map(|slot| {
                self.backends
                    .get(
                        &BackendKey {
                            set_id: s.set_id,
                            slot,
                        },
                        0,
                    )
                    .with_context(|| format!("backend set {} slot {slot} missing", s.set_id))
            })
            .collect()
    }

    /// Deletes every UDP flow entry whose backend is not in `keep`, as kube-proxy clears
    /// stale UDP conntrack: a UDP client never learns its backend died and would keep sending
    /// to it. TCP and SCTP flows stay: a removed backend that is still running (a rolling
    /// update's old generation) finishes its connections, and one that is gone resets them,
    /// which ends the flow at the client; the LRU reclaims the entries.
    fn flush_flows(&mut self, keep: &BTreeSet<Ipv4Addr>) -> Result<usize> {
        let doomed: Vec<FlowKey> = self
            .flows
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(k, t)| k.proto == IPPROTO_UDP && !keep.contains(&ip(flow_backend(k, t))))
            .map(|(k, _)| k)
            .collect();
        for k in &doomed {
            // The LRU may have evicted it meanwhile: that is the same outcome.
            let _ = self.flows.remove(k);
        }
        Ok(doomed.len())
    }

    /// Every flow entry (both directions and masquerade claims).
    pub fn flows(&self) -> Vec<(FlowKey, Translation)> {
        self.flows.iter().filter_map(|e| e.ok()).collect()
    }

    /// Packets and bytes of a counter slot, summed over CPUs.
    pub fn counter(&self, slot: u32) -> Result<Counters> {
        let per_cpu = self.counters.get(&slot, 0).context("reading lb_counters")?;
        Ok(per_cpu.iter().fold(Counters::default(), |acc, c| Counters {
            packets: acc.packets + c.packets,
            bytes: acc.bytes + c.bytes,
        }))
    }
}

/// The backend a flow entry is about, whichever of its kinds it is.
pub fn flow_backend(k: &FlowKey, t: &Translation) -> u32 {
    match (
        t.flags & FLOW_EGRESS != 0,
        t.flags & FLOW_REPLY != 0,
        t.flags & FLOW_MASQ != 0,
    ) {
        // client → service, rewritten to the backend.
        (false, false, _) => t.daddr,
        // backend → client (reply), or backend → masquerade address (claim).
        (_, true, _) => k.saddr,
        // client → backend, rewritten to the masquerade source.
        (true, false, _) => k.daddr,
    }
}

fn sync_set<V: aya::Pod + PartialEq>(
    map: &mut HashMap<MapData, u32, V>,
    want: BTreeMap<u32, V>,
    stats: &mut SyncStats,
) -> Result<()> {
    let have: Vec<u32> = map.keys().filter_map(|k| k.ok()).collect();
    for k in have {
        if !want.contains_key(&k) {
            map.remove(&k)?;
            stats.deleted += 1;
        }
    }
    for (k, v) in want {
        if map.get(&k, 0).ok() != Some(v) {
            map.insert(k, v, 0)?;
            stats.written += 1;
        }
    }
    Ok(())
}

/// The free ids of one id space (backend sets, counter slots), handed out lowest first so
/// that the space stays dense. Built once per sync from the ids in use: each allocation is
/// O(log n), so writing tens of thousands of services is not quadratic.
struct IdPool {
    /// Unused ids below `next`.
    gaps: BTreeSet<u32>,
    /// Every id from here up to `end` is unused.
    next: u32,
    end: u32,
}

impl IdPool {
    /// Ids in `from..end`, minus those in `used`.
    fn new(used: impl IntoIterator<Item = u32>, from: u32, end: u32) -> Self {
        let used: BTreeSet<u32> = used.into_iter().filter(|&i| i >= from).collect();
        let next = used.last().map_or(from, |&m| m + 1);
        let gaps = (from..next).filter(|i| !used.contains(i)).collect();
        Self { gaps, next, end }
    }

    fn take(&mut self) -> Option<u32> {
        if let Some(id) = self.gaps.pop_first() {
            return Some(id);
        }
        (self.next < self.end).then(|| {
            self.next += 1;
            self.next - 1
        })
    }
}

fn pin_link(link: FdLink, path: &Path) -> Result<()> {
    let pinned: PinnedLink = link
        .pin(path)
        .with_context(|| format!("pinning link at {}", path.display()))?;
    // The pin keeps the link; this process's handle may go.
    drop(pinned);
    Ok(())
}

/// Detaches everything `attach` attached to `ifname` and removes the network's pins.
pub fn detach_all(dir: &Path, ifnames: &[String], tc_mode: TcMode) -> Result<()> {
    for ifname in ifnames {
        if tc_mode == TcMode::Netlink {
            for (hook, prog) in [
                (TcAttachType::Ingress, PROG_TC_INGRESS),
                (TcAttachType::Egress, PROG_TC_EGRESS),
            ] {
                let _ = tc::qdisc_detach_program(ifname, hook, prog);
            }
        }
    }
    if dir.exists() {
        // Unpinning a link detaches it once no process holds it; unpinning a map frees it once
        // no program does.
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
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
