//! Writing a [`Plan`] into a network's maps, touching only what differs.
//!
//! The maps are the record, and a [`Mirror`] of them is kept beside: read from the maps once,
//! when a sync first finds none (a network opened or adopted, or a sync that failed half-way
//! and may have left the maps differing from it), then updated with every write. A sync
//! compares the plan with the mirror and makes one map call per entry that differs; it
//! reads no map, so a one-backend change costs a handful of syscalls at any size.
//!
//! One file because the [`Mirror`] is true only while every write of a sync updates it with
//! its map: the writes stay beside the mirror they keep true, and so does [`write_exactly`],
//! the same rule for the maps the DSR and fast-path writers rewrite whole from the node.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{Array, HashMap, MapData, MapError};
use lb_common::{
    Addr6, BackendKey, BackendOf, Config, Counters, DsrSessionOf, FlowKeyOf, FlowOf, IPPROTO_UDP,
    Iface6, IfaceOf, MASQ_PORT_MAX, MASQ_PORT_MIN, MAX_LOCAL_ADDRS, PortKeyOf, Service, VipKeyOf,
    filter::AddrFilter,
};

use super::{
    EbpfNetwork, Held, MapAddr, MapIp, NodeAddrs, Plan, ServiceKey, SetBackend, gc,
    plan::{PlanSets, held_need, matching_backends, same_set},
};
use crate::dataplane::SyncStats;

/// The kernel's default `ip_local_port_range`, for a namespace whose range cannot be read.
const DEFAULT_EPHEMERAL: (u16, u16) = (32768, 60999);

/// A nonzero random flow-hash key.
fn random_key() -> Result<u32> {
    let mut buf = [0u8; 4];
    loop {
        // SAFETY: getrandom writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n != buf.len() as isize {
            return Err(std::io::Error::last_os_error()).context("getrandom");
        }
        let key = u32::from_ne_bytes(buf);
        if key != 0 {
            return Ok(key);
        }
    }
}

/// The address filter (`lb_common::filter`) of a network synced to `plan` on `node`: its
/// service addresses (and the unspecified address, where a socket's connect finds the ports
/// published on every node address), the node's and masquerade addresses as destinations;
/// as backends, those of its sets and every backend in `keep`, whose flows outlive a drain.
fn addr_filter(plan: &Plan, node: &NodeAddrs, keep: &BTreeSet<IpAddr>) -> AddrFilter {
    let mut f = AddrFilter::ALL;
    let (dst, backend) = (admit_dst, admit_backend);
    dst(&mut f, MapAddr::V4(0));
    dst(&mut f, MapAddr::V6(Addr6::default()));
    for key in plan.services.keys() {
        dst(&mut f, key.addr());
    }
    for a in node.local.iter().chain(node.ifaces.iter().map(|(_, a)| a)) {
        dst(&mut f, MapAddr::of(*a));
    }
    for (a, _) in plan.services.values().flatten() {
        backend(&mut f, *a);
    }
    for a in keep {
        backend(&mut f, MapAddr::of(*a));
    }
    f
}

fn admit_dst(f: &mut AddrFilter, a: MapAddr) {
    match a {
        MapAddr::V4(a) => f.admit_dst(&a),
        MapAddr::V6(a) => f.admit_dst(&a),
    }
}

fn admit_backend(f: &mut AddrFilter, a: MapAddr) {
    match a {
        MapAddr::V4(a) => f.admit_backend(&a),
        MapAddr::V6(a) => f.admit_backend(&a),
    }
}

/// What the maps hold, as the last sync left them.
pub struct Mirror {
    config: Option<Config>,
    /// What `lb_addr_filter` promises (unreadable: nothing, as a map never written).
    filter: AddrFilter,
    local: BTreeMap<u32, u32>,
    ifaces: BTreeMap<u32, IfaceOf<u32>>,
    local6: BTreeMap<Addr6, u32>,
    ifaces6: BTreeMap<u32, Iface6>,
    services: Held,
    /// Backend sets (id, slot count) and counters that no service entry names any more:
    /// deleted by the next sync, when no program run that read the entry before it changed can
    /// still be using them. After a read, everything in the maps that nothing names. A
    /// counter retired from a service that still exists names it: its count is folded into
    /// the service's total when it is deleted. A set is in the backend map of its family
    /// (`true`: IPv6's).
    retired_sets: Vec<(u32, u32, bool)>,
    retired_counters: Vec<(Option<ServiceKey>, u32)>,
    /// What the deleted counters of a service's former backends had counted (see
    /// [`EbpfNetwork::service_total`]). Kept for the process's life: a restarted daemon's
    /// totals start from the backends the maps hold, as a Prometheus counter resets with
    /// its process.
    folded: BTreeMap<ServiceKey, Counters>,
    set_ids: IdPool,
    counter_ids: IdPool,
    /// Counter ids whose entries were deleted but that flow entries or DSR sessions may still
    /// name (a removed backend's draining flows), with when they were retired and the
    /// service they counted for: handed out again only once a walk of the tables that
    /// started after their retirement finds no entry naming them ([`gc::Referenced`]), their
    /// entries (which those flows may have re-created meanwhile) deleted again first.
    quarantine: Vec<(u32, std::time::Instant, Option<ServiceKey>)>,
    /// What `services` needs of the maps ([`plan::held_need`]), kept with every change.
    held: super::Need,
    /// The backends whose flows the last sync kept (`None`: not known, after a read): the flow
    /// table is walked only when one of them is gone.
    kept: Option<BTreeSet<IpAddr>>,
}

impl Mirror {
    /// Writes the config held with `fast_path` set to `bits` (`FAST_PATH_*`), if it differs
    /// (a config not read or written yet is left to the next sync).
    pub(super) fn set_fast_path(
        &mut self,
        map: &mut Array<MapData, Config>,
        bits: u32,
    ) -> Result<()> {
        let Some(mut c) = self.config.filter(|c| c.fast_path != bits) else {
            return Ok(());
        };
        c.fast_path = bits;
        map.set(0, c, 0).context("writing lb_config")?;
        self.config = Some(c);
        Ok(())
    }

    /// Reads everything a sync compares with from the maps: each map walked once.
    fn read(net: &EbpfNetwork) -> Result<Self> {
        // set id → (IPv6?, slot → backend).
        let mut sets: BTreeMap<u32, (bool, BTreeMap<u32, SetBackend>)> = BTreeMap::new();
        let mut add = |k: BackendKey, b: SetBackend| {
            let set = sets.entry(k.set_id).or_default();
            set.0 = b.addr.is_v6();
            set.1.insert(k.slot, b);
        };
        for e in net.backends.iter() {
            let (k, b) = e.context("reading lb_backends")?;
            add(k, held_backend(&b, MapAddr::V4(b.addr)));
        }
        for e in net.backends6.iter() {
            let (k, b) = e.context("reading lb_backends6")?;
            add(k, held_backend(&b, MapAddr::V6(b.addr)));
        }
        let mut entries = Vec::new();
        for e in net.vips.iter() {
            let (k, s) = e.context("reading lb_vips")?;
            entries.push((ServiceKey::Vip(MapAddr::V4(k.addr)), s));
        }
        for e in net.vips6.iter() {
            let (k, s) = e.context("reading lb_vips6")?;
            entries.push((ServiceKey::Vip(MapAddr::V6(k.addr)), s));
        }
        for e in net.ports.iter() {
            let (k, s) = e.context("reading lb_ports")?;
            entries.push((port_key(MapAddr::V4(k.addr), &k), s));
        }
        for e in net.ports6.iter() {
            let (k, s) = e.context("reading lb_ports6")?;
            entries.push((port_key(MapAddr::V6(k.addr), &k), s));
        }
        let mut services = Held::new();
        let mut named_counters = BTreeSet::new();
        for (key, s) in entries {
            // A key's set is in its family's map; one found in the other is not its set.
            let slots = (sets.get(&s.set_id)).filter(|(v6, _)| *v6 == key.addr().is_v6());
            let set = (0..s.count)
                .map(|slot| {
                    slots
                        .and_then(|(_, m)| m.get(&slot))
                        .copied()
                        .with_context(|| format!("backend set {} slot {slot} missing", s.set_id))
                })
                .collect::<Result<Vec<_>>>()?;
            // A service's own counter (an lb before 0.1's single-counter datapath) is named by
            // nothing any more: retired, it is deleted by the next sync.
            named_counters.extend(set.iter().map(|b| b.counter));
            services.insert(key, (s, set));
        }
        let live: BTreeSet<u32> = services.values().map(|(s, _)| s.set_id).collect();
        let retired_sets = (sets.iter())
            .filter(|(id, _)| !live.contains(id))
            .map(|(id, (v6, slots))| (*id, slots.keys().max().map_or(0, |m| m + 1), *v6))
            .collect();
        let mut counters = BTreeSet::new();
        for k in net.counters.keys() {
            counters.insert(k.context("reading lb_counters")?);
        }
        let retired_counters = (counters.difference(&named_counters))
            .map(|&id| (None, id))
            .collect();
        // Ids flows and sessions name that no service does (their counters deleted by an
        // earlier process, their flows draining): out of the pool until a walk finds them
        // gone.
        let now = std::time::Instant::now();
        let referenced = net.referenced_counters();
        let quarantine: Vec<_> = (referenced.iter())
            .filter(|id| !named_counters.contains(id) && !counters.contains(id))
            .map(|&id| (id, now, None))
            .collect();
        Ok(Self {
            config: net.config.get(&0, 0).ok(),
            filter: net.addr_filter.get(&0, 0).unwrap_or_default(),
            local: (net.local.iter())
                .collect::<Result<_, _>>()
                .context("reading lb_local_addrs")?,
            ifaces: (net.ifaces.iter())
                .collect::<Result<_, _>>()
                .context("reading lb_ifaces")?,
            local6: (net.local6.iter())
                .collect::<Result<_, _>>()
                .context("reading lb_local_addrs6")?,
            ifaces6: (net.ifaces6.iter())
                .collect::<Result<_, _>>()
                .context("reading lb_ifaces6")?,
            // Set ids start at 1, so that a zeroed service entry never names a live set.
            set_ids: IdPool::new(sets.keys().copied(), 1, u32::MAX),
            // Counter ids start at 1: 0 is "no counter" in a service entry.
            counter_ids: IdPool::new(
                (counters.union(&named_counters).copied())
                    .chain(quarantine.iter().map(|(id, _, _)| *id)),
                1,
                net.sizes.counters,
            ),
            held: held_need(&services, 0),
            quarantine,
            services,
            retired_sets,
            retired_counters,
            folded: BTreeMap::new(),
            kept: None,
        })
    }
}

fn held_backend<A>(b: &BackendOf<A>, addr: MapAddr) -> SetBackend {
    SetBackend {
        addr,
        port: b.port,
        counter: b.counter,
    }
}

fn port_key<A>(addr: MapAddr, k: &PortKeyOf<A>) -> ServiceKey {
    ServiceKey::Port {
        addr,
        port: k.port,
        proto: k.proto,
    }
}

impl EbpfNetwork {
    /// Writes `plan` and `node` into the maps, touching only what differs. `keep` is every
    /// backend of the network, enabled or disabled: flows to any other backend are flushed.
    /// When it fails the mirror is dropped: the maps may hold part of the change, and the
    /// next sync reads them again.
    pub fn sync(
        &mut self,
        plan: &Plan,
        node: &NodeAddrs,
        keep: &BTreeSet<IpAddr>,
        walked: Option<&gc::Referenced>,
    ) -> Result<SyncStats> {
        self.with_mirror(|net, m| net.sync_with(m, plan, node, keep, walked))
    }

    /// Runs `write` with the mirror (read from the maps if there is none): kept when it
    /// succeeds; dropped when it fails, since the maps may then hold part of the write.
    fn with_mirror<T>(
        &mut self,
        write: impl FnOnce(&mut Self, &mut Mirror) -> Result<T>,
    ) -> Result<T> {
        let mut m = match self.mirror.take() {
            Some(m) => m,
            None => Mirror::read(self)?,
        };
        let result = write(self, &mut m);
        if result.is_ok() {
            self.mirror = Some(m);
        }
        result
    }

    /// What the service maps hold (read from the maps once per open), with each service's
    /// packets and bytes. The programs count each packet once, to its backend (one per-CPU
    /// lookup per packet, not two), so a service's total is the sum of its backends'
    /// counters, those retired and not yet deleted, and those deleted since this process
    /// adopted the maps (`folded`). `counted` is [`EbpfNetwork::counters`]' reading.
    pub fn service_totals(
        &mut self,
        counted: &BTreeMap<u32, Counters>,
    ) -> Result<(&Held, BTreeMap<ServiceKey, Counters>)> {
        let m = self.held_mirror()?;
        let mut totals = m.folded.clone();
        let live = (m.services.iter())
            .flat_map(|(key, (_, set))| set.iter().map(move |b| (*key, b.counter)));
        let retired = (m.retired_counters.iter()).filter_map(|(owner, id)| Some(((*owner)?, *id)));
        for (key, id) in live.chain(retired) {
            let c = counted.get(&id).copied().unwrap_or_default();
            let t = totals.entry(key).or_default();
            t.packets += c.packets;
            t.bytes += c.bytes;
        }
        Ok((&m.services, totals))
    }

    /// One service's total, as [`EbpfNetwork::service_totals`] gives it.
    pub fn service_total(
        &mut self,
        key: &ServiceKey,
        counted: &BTreeMap<u32, Counters>,
    ) -> Result<Counters> {
        let (_, totals) = self.service_totals(counted)?;
        Ok(totals.get(key).copied().unwrap_or_default())
    }

    fn held_mirror(&mut self) -> Result<&Mirror> {
        if self.mirror.is_none() {
            self.mirror = Some(Mirror::read(self)?);
        }
        Ok(self.mirror.as_ref().expect("read above"))
    }

    /// What the service maps hold (read from the maps once per open).
    pub fn held(&mut self) -> Result<&Held> {
        Ok(&self.held_mirror()?.services)
    }

    /// What the service maps hold, and what that needs of them ([`plan::held_need`]).
    pub fn held_with_need(&mut self) -> Result<(&Held, super::Need)> {
        let m = self.held_mirror()?;
        Ok((&m.services, m.held))
    }

    fn sync_with(
        &mut self,
        m: &mut Mirror,
        plan: &Plan,
        node: &NodeAddrs,
        keep: &BTreeSet<IpAddr>,
        walked: Option<&gc::Referenced>,
    ) -> Result<SyncStats> {
        let mut stats = SyncStats::default();
        self.release_quarantined(m, walked, &mut stats)?;
        // The filter's bits this sync needs are cleared before anything it writes can need
        // them; those it frees are set once the entries that needed them are gone (the end).
        let filter = addr_filter(plan, node, keep);
        self.write_filter(m, m.filter.both(&filter), &mut stats)?;
        let (hole_min, hole_max) = node.ephemeral.unwrap_or(DEFAULT_EPHEMERAL);
        let cfg = Config {
            masquerade: plan.masquerade,
            // The key a network was first given stays: flows keep their backends across
            // restarts and changes.
            hash_key: match m.config {
                Some(c) if c.hash_key != 0 => c.hash_key,
                _ => random_key()?,
            },
            masq_port_min: MASQ_PORT_MIN,
            masq_port_max: MASQ_PORT_MAX,
            masq_hole_min: hole_min,
            masq_hole_max: hole_max,
            timeouts: plan.timeouts,
            // Decided by `fast`, which runs first in an apply.
            fast_path: self.fast_path_bits(),
        };
        if m.config != Some(cfg) {
            self.config.set(0, cfg, 0).context("writing lb_config")?;
            m.config = Some(cfg);
            stats.written += 1;
        }
        let (mut local, mut local6) = (BTreeMap::new(), BTreeMap::new());
        for a in &node.local {
            match MapAddr::of(*a) {
                MapAddr::V4(a) => local.insert(a, 1),
                MapAddr::V6(a) => local6.insert(a, 1),
            };
        }
        for (n, family) in [(local.len(), "IPv4"), (local6.len(), "IPv6")] {
            if n > MAX_LOCAL_ADDRS as usize {
                bail!(
                    "the node has {n} {family} addresses, lb_local_addrs holds {MAX_LOCAL_ADDRS} (a fixed limit)"
                );
            }
        }
        sync_set(&mut self.local, &mut m.local, local, &mut stats)
            .context("writing lb_local_addrs")?;
        sync_set(&mut self.local6, &mut m.local6, local6, &mut stats)
            .context("writing lb_local_addrs6")?;
        let (mut ifaces, mut ifaces6) = (BTreeMap::new(), BTreeMap::new());
        for (i, a) in &node.ifaces {
            match MapAddr::of(*a) {
                MapAddr::V4(addr) => {
                    ifaces.insert(*i, IfaceOf { addr, flags: 0 });
                }
                MapAddr::V6(addr) => {
                    ifaces6.insert(*i, IfaceOf { addr, flags: 0 });
                }
            }
        }
        sync_set(&mut self.ifaces, &mut m.ifaces, ifaces, &mut stats)
            .context("writing lb_ifaces")?;
        sync_set(&mut self.ifaces6, &mut m.ifaces6, ifaces6, &mut stats)
            .context("writing lb_ifaces6")?;

        self.delete_retired(m, &mut stats)?;
        // Removed entries first, so that the service maps never hold more than the plan.
        let gone: Vec<ServiceKey> = (m.services.keys())
            .filter(|k| !plan.services.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            self.sync_key(m, &key, None, (0, 0), &mut stats)?;
        }
        for (key, want) in &plan.services {
            self.sync_key(m, key, Some(want), plan.service_meta(key), &mut stats)?;
        }
        // Only a backend gone since the last sync can have flows to flush.
        if m.kept.as_ref().is_none_or(|k| !k.is_subset(keep)) {
            stats.flows_flushed = self.flush_flows(keep)?;
        }
        if m.kept.as_ref() != Some(keep) {
            m.kept = Some(keep.clone());
        }
        self.write_filter(m, filter, &mut stats)?;
        Ok(stats)
    }

    fn write_filter(
        &mut self,
        m: &mut Mirror,
        filter: AddrFilter,
        stats: &mut SyncStats,
    ) -> Result<()> {
        if m.filter != filter {
            (self.addr_filter.set(0, filter, 0)).context("writing lb_addr_filter")?;
            m.filter = filter;
            stats.written += 1;
        }
        Ok(())
    }

    /// Deletes what the previous sync retired: no program run that read a service entry
    /// before it switched can still be going.
    fn delete_retired(&mut self, m: &mut Mirror, stats: &mut SyncStats) -> Result<()> {
        for (set_id, count, v6) in std::mem::take(&mut m.retired_sets) {
            self.delete_set(set_id, count, v6, stats)?;
            m.set_ids.release(set_id);
        }
        for (owner, id) in std::mem::take(&mut m.retired_counters) {
            self.delete_counter(m, id, owner, stats)?;
            m.quarantine.push((id, std::time::Instant::now(), owner));
        }
        Ok(())
    }

    /// Deletes counter `id`, what it counted folded into the total of `owner` where that
    /// service still exists.
    fn delete_counter(
        &mut self,
        m: &mut Mirror,
        id: u32,
        owner: Option<ServiceKey>,
        stats: &mut SyncStats,
    ) -> Result<()> {
        if let Some(key) = owner.filter(|k| m.services.contains_key(k)) {
            let c = self.counter(id)?;
            let total = m.folded.entry(key).or_default();
            total.packets += c.packets;
            total.bytes += c.bytes;
        }
        match self.counters.remove(&id) {
            Ok(()) => stats.deleted += 1,
            // Never counted a packet.
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e).context("deleting from lb_counters"),
        }
        Ok(())
    }

    /// Hands the quarantined counter ids that `walked` finds named by no entry back to the
    /// pool (see [`Mirror::quarantine`]); without a walk (no collector) they stay out of it.
    fn release_quarantined(
        &mut self,
        m: &mut Mirror,
        walked: Option<&gc::Referenced>,
        stats: &mut SyncStats,
    ) -> Result<()> {
        let Some(walked) = walked else {
            return Ok(());
        };
        let (free, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut m.quarantine)
            .into_iter()
            .partition(|(id, at, _)| *at < walked.since && !walked.ids.contains(id));
        m.quarantine = kept;
        for (id, _, owner) in free {
            // Re-created by a draining flow after its delete: what it counted is its
            // service's still.
            if self.counter(id).is_ok_and(|c| c.packets != 0) {
                self.delete_counter(m, id, owner, stats)?;
            }
            m.counter_ids.release(id);
        }
        Ok(())
    }

    /// Makes service entry `key` hold `want` (`None`: no entry) with `meta` (the entry's
    /// `(session_timeout, flags)`, [`Plan::service_meta`]): a changed set is written whole
    /// under a fresh set id before the entry switches to it, and the old set and the counters
    /// it gave up are retired (deleted by the next sync).
    fn sync_key(
        &mut self,
        m: &mut Mirror,
        key: &ServiceKey,
        want: Option<&Vec<(MapAddr, u16)>>,
        (session_timeout, flags): (u32, u32),
        stats: &mut SyncStats,
    ) -> Result<()> {
        let Some(want) = want else {
            let Some((s, set)) = m.services.remove(key) else {
                return Ok(());
            };
            m.held.hold(key, -(set.len() as isize));
            self.delete_service(key)?;
            stats.deleted += 1;
            m.retired_sets.push((s.set_id, s.count, key.addr().is_v6()));
            m.retired_counters
                .extend(set.iter().map(|b| (None, b.counter)));
            m.folded.remove(key);
            return Ok(());
        };
        if let Some((svc, have)) = m.services.get_mut(key)
            && same_set(have, want)
        {
            // The same set under other settings (a network turned dsr, a new session
            // timeout): the entry changes, the set stays.
            if (svc.session_timeout, svc.flags) != (session_timeout, flags) {
                let new = Service {
                    session_timeout,
                    flags,
                    ..*svc
                };
                *svc = new;
                self.put_service(key, new)?;
                stats.written += 1;
            }
            return Ok(());
        }
        let old = m.services.get(key);
        let set_id = m.set_ids.take().context("no free backend set id")?;
        let have: &[SetBackend] = old.map_or(&[], |(_, have)| have);
        let kept: Vec<Option<u32>> = matching_backends(have, want)
            .map(|b| b.map(|b| b.counter))
            .collect();
        let mut set = Vec::with_capacity(want.len());
        for (slot, ((addr, port), kept)) in want.iter().zip(kept).enumerate() {
            // A backend keeps its counter across set changes of its service.
            let counter = match kept {
                Some(c) => c,
                None => self.new_counter(&mut m.counter_ids)?,
            };
            let b = SetBackend {
                addr: *addr,
                port: *port,
                counter,
            };
            let k = BackendKey {
                set_id,
                slot: slot as u32,
            };
            self.put_backend(k, &b)?;
            stats.written += 1;
            set.push(b);
        }
        let svc = Service {
            set_id,
            count: want.len() as u32,
            session_timeout,
            flags,
        };
        self.put_service(key, svc)?;
        stats.written += 1;
        m.held.hold(key, want.len() as isize);
        if let Some((s, have)) = m.services.insert(*key, (svc, set)) {
            m.held.hold(key, -(have.len() as isize));
            m.retired_sets.push((s.set_id, s.count, key.addr().is_v6()));
            let now: BTreeSet<u32> = (m.services[key].1.iter()).map(|b| b.counter).collect();
            (m.retired_counters).extend(
                (have.iter())
                    .map(|b| b.counter)
                    .filter(|c| !now.contains(c))
                    .map(|c| (Some(*key), c)),
            );
        }
        Ok(())
    }

    fn put_service(&mut self, key: &ServiceKey, svc: Service) -> Result<()> {
        match *key {
            ServiceKey::Vip(MapAddr::V4(addr)) => self.vips.insert(VipKeyOf { addr }, svc, 0),
            ServiceKey::Vip(MapAddr::V6(addr)) => self.vips6.insert(VipKeyOf { addr }, svc, 0),
            ServiceKey::Port { addr, port, proto } => match addr {
                MapAddr::V4(addr) => (self.ports).insert(ports_key(addr, port, proto), svc, 0),
                MapAddr::V6(addr) => (self.ports6).insert(ports_key(addr, port, proto), svc, 0),
            },
        }
        .context("writing a service entry")
    }

    fn delete_service(&mut self, key: &ServiceKey) -> Result<()> {
        match *key {
            ServiceKey::Vip(MapAddr::V4(addr)) => self.vips.remove(&VipKeyOf { addr }),
            ServiceKey::Vip(MapAddr::V6(addr)) => self.vips6.remove(&VipKeyOf { addr }),
            ServiceKey::Port { addr, port, proto } => match addr {
                MapAddr::V4(addr) => self.ports.remove(&ports_key(addr, port, proto)),
                MapAddr::V6(addr) => self.ports6.remove(&ports_key(addr, port, proto)),
            },
        }
        .context("deleting a service entry")
    }

    fn put_backend(&mut self, k: BackendKey, b: &SetBackend) -> Result<()> {
        match b.addr {
            MapAddr::V4(addr) => {
                (self.backends.insert(k, map_backend(addr, b), 0)).context("writing lb_backends")
            }
            MapAddr::V6(addr) => {
                (self.backends6.insert(k, map_backend(addr, b), 0)).context("writing lb_backends6")
            }
        }
    }

    fn delete_set(
        &mut self,
        set_id: u32,
        count: u32,
        v6: bool,
        stats: &mut SyncStats,
    ) -> Result<()> {
        for slot in 0..count {
            let k = BackendKey { set_id, slot };
            let removed = if v6 {
                self.backends6.remove(&k)
            } else {
                self.backends.remove(&k)
            };
            match removed {
                Ok(()) => stats.deleted += 1,
                // An orphan set may have lost slots with the process that was writing it.
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e).context("deleting from lb_backends"),
            }
        }
        Ok(())
    }

    /// A counter id of its own. Its entry is created by the datapath with its first packet;
    /// a freed id's entry was deleted before it was released, so the new owner starts at zero.
    fn new_counter(&self, ids: &mut IdPool) -> Result<u32> {
        ids.take().with_context(|| {
            format!(
                "no free counter id (lb_counters holds {})",
                self.sizes.counters
            )
        })
    }

    /// The ids of every backend set in `lb_backends` and `lb_backends6`, live or retired.
    pub fn backend_set_ids(&self) -> Result<BTreeSet<u32>> {
        (self.backends.keys())
            .chain(self.backends6.keys())
            .map(|k| Ok(k.context("reading the backend maps")?.set_id))
            .collect()
    }

    /// The ids of every counter in `lb_counters` (those that counted a packet), named or
    /// retired.
    pub fn counter_ids(&self) -> Result<BTreeSet<u32>> {
        (self.counters.keys())
            .map(|k| k.context("reading lb_counters"))
            .collect()
    }

    /// Every service entry with its backend set, in slot order, read from the maps (tests
    /// compare it with what the mirror says).
    pub fn current_services(&self) -> Result<Held> {
        Ok(Mirror::read(self)?.services)
    }

    /// Deletes every entry of the UDP flows whose backend is not in `keep`, as kube-proxy
    /// clears stale UDP conntrack: a UDP client never learns its backend died and would keep
    /// sending to it. TCP and SCTP flows stay: a removed backend that is still running (a
    /// rolling update's old generation) finishes its connections, and one that is gone resets
    /// them, which ends the flow; the collector then takes the entries. DSR sessions follow
    /// the same rule.
    fn flush_flows(&mut self, keep: &BTreeSet<IpAddr>) -> Result<usize> {
        self.flush_flows_to(&|ip| !keep.contains(&ip))
    }

    /// [`EbpfNetwork::flush_flows`] of the flows whose backend `doomed` says is gone.
    fn flush_flows_to(&mut self, doomed: &dyn Fn(IpAddr) -> bool) -> Result<usize> {
        Ok(flush_udp(&mut self.flows, doomed)
            + flush_udp(&mut self.flows6, doomed)
            + flush_udp_sessions(&mut self.dsr_sessions, doomed)
            + flush_udp_sessions(&mut self.dsr_sessions6, doomed))
    }

    /// Writes a change of some sets alone ([`plan::plan_sets`] of them), as [`EbpfNetwork::sync`]
    /// writes them within a whole plan: nothing else is compared or written, so the cost is
    /// the change's at any size. `new_backends` are the backends the network did not list
    /// before (admitted by the address filter first), `gone_backends` those it no longer
    /// lists (their UDP flows flushed). The filter only admits here: a bit an address no
    /// longer needs is set again by the next whole sync.
    pub fn sync_sets(
        &mut self,
        sets: &PlanSets,
        new_backends: &BTreeSet<IpAddr>,
        gone_backends: &BTreeSet<IpAddr>,
        walked: Option<&gc::Referenced>,
    ) -> Result<SyncStats> {
        self.with_mirror(|net, m| net.sync_sets_with(m, sets, new_backends, gone_backends, walked))
    }

    fn sync_sets_with(
        &mut self,
        m: &mut Mirror,
        sets: &PlanSets,
        new_backends: &BTreeSet<IpAddr>,
        gone_backends: &BTreeSet<IpAddr>,
        walked: Option<&gc::Referenced>,
    ) -> Result<SyncStats> {
        let mut stats = SyncStats::default();
        self.release_quarantined(m, walked, &mut stats)?;
        let mut filter = m.filter;
        for (key, (want, _)) in sets {
            if want.is_some() {
                admit_dst(&mut filter, key.addr());
            }
        }
        for b in new_backends {
            admit_backend(&mut filter, MapAddr::of(*b));
        }
        self.write_filter(m, filter, &mut stats)?;
        self.delete_retired(m, &mut stats)?;
        for (key, (want, meta)) in sets {
            self.sync_key(m, key, want.as_ref(), *meta, &mut stats)?;
        }
        if !gone_backends.is_empty() {
            stats.flows_flushed = self.flush_flows_to(&|ip| gone_backends.contains(&ip))?;
        }
        if let Some(kept) = &mut m.kept {
            kept.extend(new_backends);
            kept.retain(|ip| !gone_backends.contains(ip));
        }
        Ok(stats)
    }

    /// The counter ids every flow entry and DSR session names (read once, when the mirror
    /// is read).
    fn referenced_counters(&self) -> BTreeSet<u32> {
        let flows = (self.flows.iter().filter_map(|e| e.ok())).map(|(_, e)| e.counter);
        let flows6 = (self.flows6.iter().filter_map(|e| e.ok())).map(|(_, e)| e.counter);
        let dsr = (self.dsr_sessions.iter().filter_map(|e| e.ok())).map(|(_, s)| s.counter);
        let dsr6 = (self.dsr_sessions6.iter().filter_map(|e| e.ok())).map(|(_, s)| s.counter);
        flows.chain(flows6).chain(dsr).chain(dsr6).collect()
    }
}

/// Deletes the UDP sessions of `sessions` whose backend is `doomed`.
fn flush_udp_sessions<A: MapIp>(
    sessions: &mut HashMap<MapData, FlowKeyOf<A>, DsrSessionOf<A>>,
    doomed: &dyn Fn(IpAddr) -> bool,
) -> usize
where
    FlowKeyOf<A>: aya::Pod,
    DsrSessionOf<A>: aya::Pod,
{
    flush_udp_of(sessions, doomed, |_, s| s.backend.ip())
}

/// Deletes the entries of `flows` of UDP flows whose backend is `doomed`.
fn flush_udp<A: MapIp>(
    flows: &mut HashMap<MapData, FlowKeyOf<A>, FlowOf<A>>,
    doomed: &dyn Fn(IpAddr) -> bool,
) -> usize
where
    FlowKeyOf<A>: aya::Pod,
    FlowOf<A>: aya::Pod,
{
    flush_udp_of(flows, doomed, |k, e| gc::backend_of(k, e).ip())
}

/// Deletes the entries of `map` (keyed by a flow's tuple) of UDP whose backend, as `backend`
/// reads it, is `doomed`; returns how many.
fn flush_udp_of<A: MapIp, V: aya::Pod>(
    map: &mut HashMap<MapData, FlowKeyOf<A>, V>,
    doomed: &dyn Fn(IpAddr) -> bool,
    backend: impl Fn(&FlowKeyOf<A>, &V) -> IpAddr,
) -> usize
where
    FlowKeyOf<A>: aya::Pod,
{
    let doomed: Vec<_> = (map.iter())
        .filter_map(|e| e.ok())
        .filter(|(k, v)| k.proto == IPPROTO_UDP && doomed(backend(k, v)))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        // The LRU may have evicted it meanwhile: that is the same outcome.
        let _ = map.remove(k);
    }
    doomed.len()
}

fn ports_key<A>(addr: A, port: u16, proto: u8) -> PortKeyOf<A> {
    PortKeyOf {
        addr,
        port,
        proto,
        _pad: 0,
    }
}

fn map_backend<A>(addr: A, b: &SetBackend) -> BackendOf<A> {
    BackendOf {
        addr,
        port: b.port,
        _pad: 0,
        counter: b.counter,
    }
}

/// Whether a map call failed because its key is not there (aya reports a delete's ENOENT as
/// a plain syscall error).
fn not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(e) => e.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Makes `map` hold exactly `want`, writing only the difference with `mirror` (what it held
/// after the last write; `None`: read it first). The mirror is put back only once the map is
/// known to match it. For maps the controller rewrites whole from the node at every apply.
pub(super) fn write_exactly<K: aya::Pod + Ord, V: aya::Pod + PartialEq>(
    map: &mut HashMap<MapData, K, V>,
    mirror: &mut Option<BTreeMap<K, V>>,
    want: &BTreeMap<K, V>,
    name: &str,
) -> Result<()> {
    let have = match mirror.take() {
        Some(m) => m,
        None => (map.iter())
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {name}"))?,
    };
    for (k, v) in want {
        if have.get(k) != Some(v) {
            map.insert(k, v, 0)
                .with_context(|| format!("writing {name}"))?;
        }
    }
    for k in have.keys().filter(|k| !want.contains_key(k)) {
        match map.remove(k) {
            Ok(()) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e).with_context(|| format!("deleting from {name}")),
        }
    }
    *mirror = Some(want.clone());
    Ok(())
}

/// Makes a small map (and its mirror `have`) hold exactly `want`.
fn sync_set<K: aya::Pod + Ord, V: aya::Pod + PartialEq>(
    map: &mut HashMap<MapData, K, V>,
    have: &mut BTreeMap<K, V>,
    want: BTreeMap<K, V>,
    stats: &mut SyncStats,
) -> Result<()> {
    let gone: Vec<K> = have
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    for k in gone {
        map.remove(&k)?;
        have.remove(&k);
        stats.deleted += 1;
    }
    for (k, v) in want {
        if have.get(&k) != Some(&v) {
            map.insert(k, v, 0)?;
            have.insert(k, v);
            stats.written += 1;
        }
    }
    Ok(())
}

/// The free ids of one id space (backend sets, counters), handed out lowest first so that the
/// space stays dense. Built once per read of the maps from the ids in use and kept with the
/// mirror: each allocation is O(log n), so writing tens of thousands of services is not
/// quadratic.
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

    /// Gives `id` back (its entries are deleted).
    fn release(&mut self, id: u32) {
        if id < self.next {
            self.gaps.insert(id);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::{IPPROTO_TCP, Timeouts};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Every address a packet of lb's can be to or from passes the filter, and the node's
    /// other traffic is refused (these addresses hash to bits of their own).
    #[test]
    fn the_filter_admits_what_lb_translates_and_nothing_else() {
        let vip = MapAddr::of(ip("10.99.0.10"));
        let host_ip = MapAddr::of(ip("fd00::5"));
        let plan = Plan {
            masquerade: 0,
            timeouts: Timeouts::default(),
            services: BTreeMap::from([
                (ServiceKey::Vip(vip), vec![(MapAddr::of(ip("10.0.0.2")), 0)]),
                (
                    ServiceKey::Port {
                        addr: host_ip,
                        port: 8080u16.to_be(),
                        proto: IPPROTO_TCP,
                    },
                    vec![(MapAddr::of(ip("fd01::2")), 80u16.to_be())],
                ),
            ]),
            dsr_timeout: None,
        };
        let node = NodeAddrs {
            local: vec![ip("192.168.1.1"), ip("fd02::1")],
            ifaces: vec![(3, ip("10.0.0.1"))],
            ephemeral: None,
        };
        // A drained backend's flows are still translated: it stays admitted.
        let keep = BTreeSet::from([ip("10.0.0.2"), ip("10.0.0.3"), ip("fd01::2")]);
        let f = addr_filter(&plan, &node, &keep);
        let dst = |s: &str| !match MapAddr::of(ip(s)) {
            MapAddr::V4(a) => f.no_dst(&a),
            MapAddr::V6(a) => f.no_dst(&a),
        };
        let backend = |s: &str| !match MapAddr::of(ip(s)) {
            MapAddr::V4(a) => f.no_backend(&a),
            MapAddr::V6(a) => f.no_backend(&a),
        };
        for a in [
            "10.99.0.10",
            "fd00::5",
            "192.168.1.1",
            "fd02::1",
            "10.0.0.1",
            "0.0.0.0",
            "::",
        ] {
            assert!(dst(a), "{a} is a destination of lb's");
        }
        for a in ["10.0.0.2", "10.0.0.3", "fd01::2"] {
            assert!(backend(a), "{a} is a backend");
        }
        for a in ["10.0.0.4", "172.17.0.9", "fd01::9"] {
            assert!(!dst(a) && !backend(a), "{a} is nothing of lb's");
        }
    }
}
