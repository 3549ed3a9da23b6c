//! Writing a [`Plan`] into a network's maps, touching only what differs.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap, MapData, PerCpuValues};
use lb_common::{
    Backend, BackendKey, Config, Counters, IPPROTO_UDP, Iface, MASQ_PORT_MAX, MASQ_PORT_MIN,
    MAX_COUNTERS, PortKey, Service, VipKey,
};

use super::{EbpfNetwork, NodeAddrs, Plan, ServiceKey, be, gc, ip};

/// What a sync changed, in map entries written or deleted (the cost a one-backend change must
/// keep O(1)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub written: usize,
    pub deleted: usize,
    pub flows_flushed: usize,
}

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

impl EbpfNetwork {
    /// Writes `plan` and `node` into the maps, touching only what differs. `keep` is every
    /// backend of the network, enabled or disabled: flows to any other backend are flushed.
    pub fn sync(
        &mut self,
        plan: &Plan,
        node: &NodeAddrs,
        keep: &BTreeSet<Ipv4Addr>,
    ) -> Result<SyncStats> {
        let mut stats = SyncStats::default();
        let current_cfg = self.config.get(&0, 0).ok();
        let (hole_min, hole_max) = node.ephemeral.unwrap_or(DEFAULT_EPHEMERAL);
        let cfg = Config {
            masquerade: plan.masquerade,
            // The key a network was first given stays: flows keep their backends across
            // restarts and changes.
            hash_key: match current_cfg {
                Some(c) if c.hash_key != 0 => c.hash_key,
                _ => random_key()?,
            },
            masq_port_min: MASQ_PORT_MIN,
            masq_port_max: MASQ_PORT_MAX,
            masq_hole_min: hole_min,
            masq_hole_max: hole_max,
            timeouts: plan.timeouts,
            _pad: 0,
        };
        if current_cfg != Some(cfg) {
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
        if !self.adopted {
            self.retired = self.orphan_sets(&current)?;
            self.adopted = true;
        }
        // Sets retired by the previous sync: no program run that read their service entry
        // before it switched can still be going.
        for (set_id, count) in std::mem::take(&mut self.retired) {
            self.delete_set(set_id, count, &mut stats)?;
        }
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
            if let Some((s, _)) = old {
                self.retired.push((s.set_id, s.count));
            }
        }
        for (key, (s, _)) in &current {
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
            self.retired.push((s.set_id, s.count));
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

    fn delete_set(&mut self, set_id: u32, count: u32, stats: &mut SyncStats) -> Result<()> {
        for slot in 0..count {
            match self.backends.remove(&BackendKey { set_id, slot }) {
                Ok(()) => stats.deleted += 1,
                // An orphan set may have lost slots with the process that was writing it.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e).context("deleting from lb_backends"),
            }
        }
        Ok(())
    }

    /// Sets in `lb_backends` that no service entry points at (retired by a controller that
    /// stopped before the next sync), as (set id, highest slot + 1).
    fn orphan_sets(
        &self,
        current: &BTreeMap<ServiceKey, (Service, Vec<Backend>)>,
    ) -> Result<Vec<(u32, u32)>> {
        let live: BTreeSet<u32> = current.values().map(|(s, _)| s.set_id).collect();
        let mut orphans: BTreeMap<u32, u32> = BTreeMap::new();
        for k in self.backends.keys() {
            let k = k.context("reading lb_backends")?;
            if !live.contains(&k.set_id) {
                let n = orphans.entry(k.set_id).or_default();
                *n = (*n).max(k.slot + 1);
            }
        }
        Ok(orphans.into_iter().collect())
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

    /// The ids of every backend set in `lb_backends`, live or retired.
    pub fn backend_set_ids(&self) -> Result<BTreeSet<u32>> {
        (self.backends.keys())
            .map(|k| Ok(k.context("reading lb_backends")?.set_id))
            .collect()
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

    /// Deletes every entry of the UDP flows whose backend is not in `keep`, as kube-proxy
    /// clears stale UDP conntrack: a UDP client never learns its backend died and would keep
    /// sending to it. TCP and SCTP flows stay: a removed backend that is still running (a
    /// rolling update's old generation) finishes its connections, and one that is gone resets
    /// them, which ends the flow; the collector then takes the entries.
    fn flush_flows(&mut self, keep: &BTreeSet<Ipv4Addr>) -> Result<usize> {
        let doomed: Vec<_> = self
            .flows
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(k, e)| k.proto == IPPROTO_UDP && !keep.contains(&ip(gc::backend_of(k, e))))
            .map(|(k, _)| k)
            .collect();
        for k in &doomed {
            // The LRU may have evicted it meanwhile: that is the same outcome.
            let _ = self.flows.remove(k);
        }
        Ok(doomed.len())
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
