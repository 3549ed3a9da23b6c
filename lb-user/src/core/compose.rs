//! Compose (moby `composeNFTLB`): fold every contribution of a network into one backend set
//! per VIP and one per published port.
//!
//! A network's maps have one writer, and each VIP's and each published port's bucket space
//! must be partitioned by whoever owns it: two generations of a service partitioning a shared
//! port independently would claim overlapping buckets. So the sets are composed here, from
//! every contribution at once, and partitioned once downstream ([`crate::core::elements`] and the
//! dataplanes).
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::ops::Deref;

use crate::core::elements::{SetKey, claims};
pub use crate::core::model::PortKey;
use crate::core::model::{Family, Network, Proto, Service, ServiceKey};

/// The composed backend sets of one network. Every set is sorted and free of duplicates: its
/// order is the slot order the buckets are partitioned in, so both dataplanes and
/// `lb elements` agree bucket for bucket. A set holds backends of its key's family only: this
/// is where the family of a flow's backend is decided, once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Composed {
    /// Every VIP a contribution claims, with the union of their enabled backends of the VIP's
    /// family.
    pub vips: BTreeMap<IpAddr, Vec<IpAddr>>,
    /// Every published port key a contribution claims (one per family for a port on every
    /// address), with the union of their enabled backends of the key's family, each carrying
    /// the target port of the contribution it came from.
    pub ports: BTreeMap<PortKey, Vec<(IpAddr, u16)>>,
}

impl Composed {
    /// Whether a VIP or published-port key of `family` is composed (an IPv6 one gives the
    /// nftables dataplane its `ip6` table).
    pub fn has(&self, family: Family) -> bool {
        // Lookups, not scans (a change of one service asks this of networks of 10,000): IPv4
        // addresses sort before IPv6 ones, and port keys by host address, then family.
        let vip = match family {
            Family::V4 => self.vips.keys().next(),
            Family::V6 => self.vips.keys().next_back(),
        };
        let first_port = |host_ip: Option<IpAddr>| {
            let from = PortKey {
                host_ip,
                family,
                proto: Proto::Tcp,
                port: 0,
            };
            self.ports.range(from..).next().map(|(k, _)| *k)
        };
        let any = match family {
            Family::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            Family::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        vip.is_some_and(|v| Family::of(*v) == family)
            || first_port(None).is_some_and(|k| k.host_ip.is_none() && k.family == family)
            || first_port(Some(any))
                .is_some_and(|k| k.host_ip.is_some_and(|h| Family::of(h) == family))
    }
}

/// Composes `network`'s contributions.
///
/// As in moby, a contribution whose backends are all disabled still claims its VIP and its
/// ports, with nothing added: the key exists with an empty set, so the VIP alias stays while
/// the service exists and the set simply gets no elements. A removed contribution is absent
/// from the network and so releases its share. Unlike moby (which appends), a backend that two
/// generations share is one member of the union, not two, so it is not given double weight.
pub fn compose(network: &Network) -> Composed {
    let mut composed = Composed::default();
    for service in &network.services {
        let backends: Vec<IpAddr> = service.enabled_backends().collect();
        let of = |family| (backends.iter().copied()).filter(move |ip| Family::of(*ip) == family);
        for &vip in &service.vips {
            (composed.vips.entry(vip).or_default()).extend(of(Family::of(vip)));
        }
        for (key, port) in service.port_keys() {
            let target = port.target();
            (composed.ports.entry(key).or_default()).extend(of(key.family).map(|ip| (ip, target)));
        }
    }
    composed.vips.values_mut().for_each(sort_dedup);
    composed.ports.values_mut().for_each(sort_dedup);
    composed
}

/// A network with its composition: composed once, then kept up to date change by change by
/// its owner (the daemon, `lb load`), and handed as is to the dataplane, which plans and
/// applies it but never composes. So what a dataplane writes, what `lb elements` prints and
/// what the other dataplane would write come from one composition. It reads as the network it
/// holds.
///
/// Contract of the edits ([`ComposedNetwork::upsert`], [`ComposedNetwork::remove`]): they cost
/// what they change. Each keeps an index of who claims which set, so it recomposes only the
/// sets the contribution it adds or removes claims, and returns them: a dataplane writes
/// those and nothing else. The result is always the network [`ComposedNetwork::new`] would
/// compose from the same services (`edits_compose_as_a_whole_composition_does` holds them to
/// it); the services keep their order (an added one goes last, a replaced one keeps its place).
#[derive(Clone, Debug)]
pub struct ComposedNetwork {
    network: Network,
    composed: Composed,
    index: Index,
}

/// Who claims what in one network, kept with every edit.
#[derive(Clone, Debug, Default)]
struct Index {
    /// Each contribution's place in `network.services`, by key (a service's generations
    /// together).
    position: BTreeMap<ServiceKey, usize>,
    /// The contributions claiming each set (a VIP, a published-port key).
    claimants: HashMap<SetKey, BTreeSet<ServiceKey>>,
    /// Each published (family, protocol, port): the host addresses it is claimed on (`None`:
    /// every address), for overlap checks without a scan.
    port_hosts: HashMap<(Family, Proto, u16), BTreeSet<Option<IpAddr>>>,
    /// Each backend address: how many contributions list it, enabled or not.
    backends: HashMap<IpAddr, u32>,
}

impl Index {
    fn add(&mut self, service: &Service, position: usize) {
        let key = service.key();
        for set in claims(service) {
            self.claimants.entry(set).or_default().insert(key.clone());
            if let SetKey::Port(k) = set {
                let hosts = self.port_hosts.entry((k.family, k.proto, k.port));
                hosts.or_default().insert(k.host_ip);
            }
        }
        for b in &service.backends {
            *self.backends.entry(b.ip).or_default() += 1;
        }
        self.position.insert(key, position);
    }

    fn remove(&mut self, service: &Service) {
        let key = service.key();
        for set in claims(service) {
            let Some(c) = self.claimants.get_mut(&set) else {
                continue;
            };
            c.remove(&key);
            if !c.is_empty() {
                continue;
            }
            self.claimants.remove(&set);
            if let SetKey::Port(k) = set {
                let at = (k.family, k.proto, k.port);
                if let Some(hosts) = self.port_hosts.get_mut(&at) {
                    hosts.remove(&k.host_ip);
                    if hosts.is_empty() {
                        self.port_hosts.remove(&at);
                    }
                }
            }
        }
        for b in &service.backends {
            if let Some(n) = self.backends.get_mut(&b.ip) {
                *n -= 1;
                if *n == 0 {
                    self.backends.remove(&b.ip);
                }
            }
        }
        self.position.remove(&key);
    }
}

impl PartialEq for ComposedNetwork {
    /// The index is derived from the network.
    fn eq(&self, other: &Self) -> bool {
        self.network == other.network && self.composed == other.composed
    }
}

impl Eq for ComposedNetwork {}

impl ComposedNetwork {
    pub fn new(network: Network) -> ComposedNetwork {
        let composed = compose(&network);
        let mut index = Index::default();
        for (i, s) in network.services.iter().enumerate() {
            index.add(s, i);
        }
        ComposedNetwork {
            network,
            composed,
            index,
        }
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    pub fn composed(&self) -> &Composed {
        &self.composed
    }

    /// The contribution with `key`.
    pub fn service(&self, key: &ServiceKey) -> Option<&Service> {
        (self.index.position.get(key)).map(|&i| &self.network.services[i])
    }

    /// The generations of service `id`, by generation.
    pub fn generations(&self, id: &str) -> Vec<&Service> {
        let from = ServiceKey {
            service_id: id.to_owned(),
            generation: String::new(),
        };
        (self.index.position.range(from..))
            .take_while(|(k, _)| k.service_id == id)
            .map(|(_, &i)| &self.network.services[i])
            .collect()
    }

    /// The contributions claiming `set`.
    pub fn claimants(&self, set: &SetKey) -> impl Iterator<Item = &ServiceKey> + '_ {
        self.index.claimants.get(set).into_iter().flatten()
    }

    /// The published keys claimed on the same family, protocol and port as `key` that one
    /// packet could match together with it ([`PortKey::overlaps`]), `key` itself included.
    pub fn overlapping(&self, key: &PortKey) -> impl Iterator<Item = PortKey> + '_ {
        let key = *key;
        (self
            .index
            .port_hosts
            .get(&(key.family, key.proto, key.port))
            .into_iter())
        .flatten()
        .map(move |&host_ip| PortKey { host_ip, ..key })
        .filter(move |k| k.overlaps(&key))
    }

    /// How many contributions list `ip` as a backend (enabled or not).
    pub fn backend_refs(&self, ip: IpAddr) -> u32 {
        self.index.backends.get(&ip).copied().unwrap_or(0)
    }

    /// Every backend address the network lists (enabled or not): whose flows it keeps.
    pub fn backend_addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.index.backends.keys().copied()
    }

    /// Adds `service`, or replaces the contribution with its key (in place); returns the one
    /// replaced and the sets whose composition may have changed. Not validated here: the
    /// caller checks first ([`crate::core::validate`]).
    pub fn upsert(&mut self, service: Service) -> (Option<Service>, BTreeSet<SetKey>) {
        let mut touched: BTreeSet<SetKey> = claims(&service).collect();
        let old = match self.index.position.get(&service.key()).copied() {
            Some(i) => {
                let old = std::mem::replace(&mut self.network.services[i], service);
                self.index.remove(&old);
                self.index.add(&self.network.services[i], i);
                touched.extend(claims(&old));
                Some(old)
            }
            None => {
                let i = self.network.services.len();
                self.network.services.push(service);
                self.index.add(&self.network.services[i], i);
                None
            }
        };
        self.recompose(&touched);
        (old, touched)
    }

    /// The place of the contribution with `key` in the network's list.
    pub fn place(&self, key: &ServiceKey) -> Option<usize> {
        self.index.position.get(key).copied()
    }

    /// Puts `service` back at place `at` (taking back its removal).
    pub fn insert_at(&mut self, at: usize, service: Service) {
        let at = at.min(self.network.services.len());
        let touched: BTreeSet<SetKey> = claims(&service).collect();
        self.network.services.insert(at, service);
        for s in &self.network.services[at + 1..] {
            if let Some(p) = self.index.position.get_mut(&s.key()) {
                *p += 1;
            }
        }
        self.index.add(&self.network.services[at], at);
        self.recompose(&touched);
    }

    /// Removes the contribution with `key`; returns it and the sets whose composition may have
    /// changed.
    pub fn remove(&mut self, key: &ServiceKey) -> Option<(Service, BTreeSet<SetKey>)> {
        let i = self.index.position.get(key).copied()?;
        let old = self.network.services.remove(i);
        self.index.remove(&old);
        // Those after it moved up by one.
        for s in &self.network.services[i..] {
            if let Some(p) = self.index.position.get_mut(&s.key()) {
                *p -= 1;
            }
        }
        let touched: BTreeSet<SetKey> = claims(&old).collect();
        self.recompose(&touched);
        Some((old, touched))
    }

    /// Replaces the network's settings (everything but its services), which composition does
    /// not read.
    pub fn set_settings(&mut self, settings: Network) {
        let services = std::mem::take(&mut self.network.services);
        self.network = Network {
            services,
            ..settings
        };
    }

    /// Composes `sets` again from their claimants, as [`compose`] composes every set.
    fn recompose(&mut self, sets: &BTreeSet<SetKey>) {
        for set in sets {
            let claimants = self.index.claimants.get(set);
            let of = |key: &ServiceKey| &self.network.services[self.index.position[key]];
            match *set {
                SetKey::Vip(vip) => match claimants {
                    None => {
                        self.composed.vips.remove(&vip);
                    }
                    Some(c) => {
                        let family = Family::of(vip);
                        let mut backends: Vec<IpAddr> = (c.iter().map(of))
                            .flat_map(|s| s.enabled_backends())
                            .filter(|ip| Family::of(*ip) == family)
                            .collect();
                        sort_dedup(&mut backends);
                        self.composed.vips.insert(vip, backends);
                    }
                },
                SetKey::Port(key) => match claimants {
                    None => {
                        self.composed.ports.remove(&key);
                    }
                    Some(c) => {
                        let mut backends = Vec::new();
                        for s in c.iter().map(of) {
                            let Some((_, port)) = s.port_keys().find(|(k, _)| *k == key) else {
                                continue;
                            };
                            let target = port.target();
                            backends.extend(
                                (s.enabled_backends())
                                    .filter(|ip| Family::of(*ip) == key.family)
                                    .map(|ip| (ip, target)),
                            );
                        }
                        sort_dedup(&mut backends);
                        self.composed.ports.insert(key, backends);
                    }
                },
            }
        }
    }
}

impl Deref for ComposedNetwork {
    type Target = Network;

    fn deref(&self) -> &Network {
        &self.network
    }
}

fn sort_dedup<T: Ord>(set: &mut Vec<T>) {
    set.sort_unstable();
    set.dedup();
}
