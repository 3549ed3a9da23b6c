//! What one network's maps must hold, computed from the composed state and the node facts the
//! caller reads ([`NodeAddrs`]), without touching a map: the plan, the address forms it is
//! written in ([`MapIp`], [`be`], [`ip`]), and what it needs of the maps' sizes ([`Need`],
//! [`MapSizes`]). Pure but for [`NodeAddrs::read_ephemeral`], the one fact read here.
//!
//! One file because it is the one step between the composed state and the maps, and is tested
//! as one without a kernel (`plan/tests.rs`).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Result, bail};
use lb_common::{Addr6, MASQ_ALWAYS, MASQ_AUTO, MASQ_NEVER, MAX_IFACES, Service, Timeouts};

use crate::{
    core::compose::{Composed, PortKey},
    core::elements::SetKey,
    core::model::{Family, Masquerade, Mode, Network},
};

/// An address as the maps hold it (network byte order in memory): the key of the IPv4 maps
/// (`u32`) or of their IPv6 twins ([`Addr6`]). Which maps an entry goes to follows from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapAddr {
    V4(u32),
    V6(Addr6),
}

impl MapAddr {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => MapAddr::V4(be4(a)),
            IpAddr::V6(a) => MapAddr::V6(be6(a)),
        }
    }

    /// "Any address of the node" of `family` in a published-port key.
    pub fn any(family: Family) -> Self {
        match family {
            Family::V4 => MapAddr::V4(0),
            Family::V6 => MapAddr::V6([0; 4]),
        }
    }

    pub fn ip(self) -> IpAddr {
        match self {
            MapAddr::V4(a) => ip(a),
            MapAddr::V6(a) => IpAddr::V6(ip6(a)),
        }
    }

    pub fn is_v6(self) -> bool {
        matches!(self, MapAddr::V6(_))
    }
}

/// A service map key: the VIP map's or the published-port map's, of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServiceKey {
    Vip(MapAddr),
    Port { addr: MapAddr, port: u16, proto: u8 },
}

impl ServiceKey {
    /// The key's address: which family's maps hold it.
    pub fn addr(&self) -> MapAddr {
        match self {
            ServiceKey::Vip(a) | ServiceKey::Port { addr: a, .. } => *a,
        }
    }
}

/// A backend of a set as the maps hold it: address, destination port to rewrite to or 0 to
/// keep (network byte order) and its counter id. Its family is its service key's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetBackend {
    pub addr: MapAddr,
    pub port: u16,
    pub counter: u32,
}

/// What one network's maps must hold: every service key with its backend set in slot order
/// (address, destination port to rewrite to or 0 to keep; network byte order), the
/// masquerade mode and the flow timeouts. A flow is balanced over backends of its own family
/// only, so a key's set holds addresses of the key's family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub masquerade: u32,
    pub timeouts: Timeouts,
    pub services: BTreeMap<ServiceKey, Vec<(MapAddr, u16)>>,
    /// A `dsr` network's session timeout in seconds (`None` for a `nat` network): its VIPs
    /// are DSR VIPs (`SERVICE_DSR`), its published ports NAT as any.
    pub dsr_timeout: Option<u32>,
}

impl Plan {
    /// What the service entry of `key` carries besides its set: `(session_timeout, flags)`.
    pub fn service_meta(&self, key: &ServiceKey) -> (u32, u32) {
        match (key, self.dsr_timeout) {
            (ServiceKey::Vip(_), Some(secs)) => (secs, lb_common::SERVICE_DSR),
            _ => (0, 0),
        }
    }
}

pub fn plan(network: &Network, composed: &Composed) -> Plan {
    // Composition gives each key the backends of its own family.
    let mut services = BTreeMap::new();
    for (vip, backends) in &composed.vips {
        services.insert(vip_key(*vip), vip_set(backends));
    }
    for (key, backends) in &composed.ports {
        services.insert(port_key(key), port_set(backends));
    }
    let masquerade = match network.masquerade {
        Masquerade::Auto => MASQ_AUTO,
        Masquerade::Always => MASQ_ALWAYS,
        Masquerade::Never => MASQ_NEVER,
    };
    Plan {
        masquerade,
        timeouts: network.timeouts.resolve(),
        services,
        dsr_timeout: (network.mode == Mode::Dsr).then(|| network.timeouts.dsr_secs()),
    }
}

/// Some service entries of a plan, each with its set (`None`: no entry) and its
/// [`Plan::service_meta`]: what a change of some sets alone writes ([`plan_sets`]).
pub type PlanSets = BTreeMap<ServiceKey, (Option<Vec<(MapAddr, u16)>>, (u32, u32))>;

/// The entries of `sets` alone, as [`plan`] has them (`None`: the set is not composed, its
/// entry goes), each with its [`Plan::service_meta`]: what a change of those sets writes.
pub fn plan_sets(network: &Network, composed: &Composed, sets: &BTreeSet<SetKey>) -> PlanSets {
    let meta = Plan {
        masquerade: 0,
        timeouts: Timeouts::DEFAULT,
        services: BTreeMap::new(),
        dsr_timeout: (network.mode == Mode::Dsr).then(|| network.timeouts.dsr_secs()),
    };
    (sets.iter())
        .map(|set| {
            let (key, want) = match set {
                SetKey::Vip(vip) => (vip_key(*vip), composed.vips.get(vip).map(|b| vip_set(b))),
                SetKey::Port(k) => (port_key(k), composed.ports.get(k).map(|b| port_set(b))),
            };
            (key, (want, meta.service_meta(&key)))
        })
        .collect()
}

fn vip_key(vip: IpAddr) -> ServiceKey {
    ServiceKey::Vip(MapAddr::of(vip))
}

fn vip_set(backends: &[IpAddr]) -> Vec<(MapAddr, u16)> {
    backends.iter().map(|ip| (MapAddr::of(*ip), 0)).collect()
}

fn port_key(key: &PortKey) -> ServiceKey {
    ServiceKey::Port {
        addr: key.host_ip.map_or(MapAddr::any(key.family), MapAddr::of),
        port: key.port.to_be(),
        proto: key.proto.number(),
    }
}

fn port_set(backends: &[(IpAddr, u16)]) -> Vec<(MapAddr, u16)> {
    (backends.iter())
        .map(|(ip, port)| (MapAddr::of(*ip), port.to_be()))
        .collect()
}

/// An IPv4 address as the IPv4 maps hold it (network byte order in memory); `None` for
/// IPv6 (see [`MapAddr`]).
pub fn be(ip: IpAddr) -> Option<u32> {
    match ip {
        IpAddr::V4(v4) => Some(be4(v4)),
        IpAddr::V6(_) => None,
    }
}

pub fn be4(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

pub fn ip(addr: u32) -> IpAddr {
    IpAddr::V4(ip4(addr))
}

pub fn ip4(addr: u32) -> Ipv4Addr {
    Ipv4Addr::from(addr.to_ne_bytes())
}

/// An IPv6 address as the IPv6 maps hold it (its 16 bytes as they stand in a packet).
pub fn be6(ip: Ipv6Addr) -> Addr6 {
    bytemuck::cast(ip.octets())
}

pub fn ip6(addr: Addr6) -> Ipv6Addr {
    Ipv6Addr::from(bytemuck::cast::<Addr6, [u8; 16]>(addr))
}

/// An address type of the maps (`u32`, [`Addr6`]) as an [`IpAddr`]: what the readers of the
/// flow tables (`gc`) are written once over.
pub trait MapIp: lb_common::Addr + aya::Pod {
    fn ip(self) -> IpAddr;
}

impl MapIp for u32 {
    fn ip(self) -> IpAddr {
        ip(self)
    }
}

impl MapIp for Addr6 {
    fn ip(self) -> IpAddr {
        IpAddr::V6(ip6(self))
    }
}

/// The node facts a sync needs besides the plan, read by the caller in the network's
/// namespace.
#[derive(Clone, Debug, Default)]
pub struct NodeAddrs {
    /// Every address of the node (its namespace): what published ports answer on.
    pub local: Vec<IpAddr>,
    /// ifindex → masquerade address, for each of the network's interfaces and each family
    /// the interface has an address of (IPv6: not link-local).
    pub ifaces: Vec<(u32, IpAddr)>,
    /// The namespace's ephemeral port range (`net.ipv4.ip_local_port_range`), where its own
    /// sockets pick local ports: masquerade ports stay out of it. `None`: unknown, the
    /// kernel's default 32768-60999 is assumed.
    pub ephemeral: Option<(u16, u16)>,
}

impl NodeAddrs {
    /// Reads `net.ipv4.ip_local_port_range` as the calling thread's namespace has it.
    pub fn read_ephemeral() -> Option<(u16, u16)> {
        let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
        let mut it = s.split_whitespace().map(|w| w.parse::<u16>().ok());
        Some((it.next()??, it.next()??))
    }
}

/// What one network's service maps hold: every service entry with its backend set in slot
/// order.
pub type Held = BTreeMap<ServiceKey, (Service, Vec<SetBackend>)>;

/// The capacities of one network's maps that depend on the state (entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// `lb_vips`, and separately `lb_ports` (`--max-services`).
    pub services: u32,
    /// `lb_backends` (`--max-backends`).
    pub backends: u32,
    /// `lb_flows` (`--max-flows`).
    pub flows: u32,
    /// `lb_counters`: derived, [`lb_common::max_counters`] of the two above.
    pub counters: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self::new(
            lb_common::MAX_SERVICES,
            lb_common::MAX_BACKEND_SLOTS,
            lb_common::MAX_FLOWS,
        )
    }
}

impl MapSizes {
    pub fn new(services: u32, backends: u32, flows: u32) -> Self {
        Self {
            services,
            backends,
            flows,
            counters: lb_common::max_counters(services, backends),
        }
    }

    /// `(map, size here, size in other, flag)` for every map whose size differs.
    pub fn differences(&self, other: &MapSizes) -> Vec<(&'static str, u32, u32, &'static str)> {
        [
            ("lb_vips", self.services, other.services, "--max-services"),
            (
                "lb_backends",
                self.backends,
                other.backends,
                "--max-backends",
            ),
            ("lb_flows", self.flows, other.flows, "--max-flows"),
            (
                "lb_counters",
                self.counters,
                other.counters,
                "--max-services/--max-backends",
            ),
        ]
        .into_iter()
        .filter(|(_, a, b, _)| a != b)
        .collect()
    }
}

/// What a sync of a plan over what the maps hold needs of each map at its peak, entry for
/// entry as [`super::EbpfNetwork::sync`] writes: removed service entries go first; a changed
/// set is written whole under a fresh set id before its service entry switches to it, and the
/// old set stays until the next sync (so both count); a backend keeps its counter across set
/// changes of its service, a new service or backend takes a fresh one, and counters given up
/// stay until the next sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Need {
    pub vips: usize,
    pub ports: usize,
    pub backend_slots: usize,
    /// The IPv6 twins' (`lb_vips6`, ...: the same sizes as IPv4's).
    pub vips6: usize,
    pub ports6: usize,
    pub backend_slots6: usize,
    pub counters: usize,
    pub ifaces: usize,
}

pub fn need(plan: &Plan, held: &Held, ifaces: usize) -> Need {
    let mut n = Need {
        ifaces,
        counters: held.values().map(|(_, set)| set.len()).sum(),
        ..Need::default()
    };
    for (key, (_, set)) in held {
        *n.slots(key) += set.len();
    }
    for (key, want) in &plan.services {
        let v6 = key.addr().is_v6();
        match (key, v6) {
            (ServiceKey::Vip(_), false) => n.vips += 1,
            (ServiceKey::Vip(_), true) => n.vips6 += 1,
            (ServiceKey::Port { .. }, false) => n.ports += 1,
            (ServiceKey::Port { .. }, true) => n.ports6 += 1,
        }
        match held.get(key) {
            Some((_, have)) if same_set(have, want) => {}
            Some((_, have)) => {
                *n.slots(key) += want.len();
                n.counters += matching_backends(have, want)
                    .filter(Option::is_none)
                    .count();
            }
            None => {
                *n.slots(key) += want.len();
                n.counters += want.len();
            }
        }
    }
    n
}

/// [`need`] of a change of some sets alone (`sets`: [`plan_sets`]), every other entry held
/// as it is (`base`: [`held_need`] of what the maps hold).
pub fn need_sets(sets: &PlanSets, held: &Held, base: Need) -> Need {
    let mut n = base;
    for (key, (want, _)) in sets {
        match (held.get(key), want) {
            (Some(_), None) => *n.entries(key) -= 1,
            (None, Some(want)) => {
                *n.entries(key) += 1;
                *n.slots(key) += want.len();
                n.counters += want.len();
            }
            (Some((_, have)), Some(want)) if !same_set(have, want) => {
                *n.slots(key) += want.len();
                n.counters += matching_backends(have, want)
                    .filter(Option::is_none)
                    .count();
            }
            _ => {}
        }
    }
    n
}

/// What the maps hold now, as [`need`] counts it (every entry, its set's slots and counters):
/// kept with the mirror, change by change, so that [`need_sets`] costs the change.
pub fn held_need(held: &Held, ifaces: usize) -> Need {
    let mut n = Need {
        ifaces,
        ..Need::default()
    };
    for (key, (_, set)) in held {
        n.hold(key, set.len() as isize);
    }
    n
}

/// Whether a held backend set is the wanted one, slot for slot.
pub fn same_set(have: &[SetBackend], want: &[(MapAddr, u16)]) -> bool {
    have.iter()
        .map(|b| (b.addr, b.port))
        .eq(want.iter().copied())
}

/// For each wanted backend, the held backend of the same address whose counter it keeps (each
/// held backend matched once), or `None`: it takes a fresh counter.
pub fn matching_backends<'a>(
    have: &'a [SetBackend],
    want: &'a [(MapAddr, u16)],
) -> impl Iterator<Item = Option<&'a SetBackend>> + 'a {
    let mut taken = vec![false; have.len()];
    want.iter().map(move |(addr, _)| {
        let i = (0..have.len()).find(|&i| !taken[i] && have[i].addr == *addr)?;
        taken[i] = true;
        Some(&have[i])
    })
}

impl Need {
    /// Counts an entry of `key` with a set of `slots` as held (`slots` < 0: no longer).
    pub fn hold(&mut self, key: &ServiceKey, slots: isize) {
        let sign = slots.signum();
        let add = |v: &mut usize, d: isize| *v = v.saturating_add_signed(d);
        add(self.entries(key), sign);
        add(self.slots(key), slots);
        add(&mut self.counters, slots);
    }

    /// The service entries of `key`'s map.
    fn entries(&mut self, key: &ServiceKey) -> &mut usize {
        match (key, key.addr().is_v6()) {
            (ServiceKey::Vip(_), false) => &mut self.vips,
            (ServiceKey::Vip(_), true) => &mut self.vips6,
            (ServiceKey::Port { .. }, false) => &mut self.ports,
            (ServiceKey::Port { .. }, true) => &mut self.ports6,
        }
    }

    /// The backend slots of `key`'s family.
    fn slots(&mut self, key: &ServiceKey) -> &mut usize {
        if key.addr().is_v6() {
            &mut self.backend_slots6
        } else {
            &mut self.backend_slots
        }
    }

    /// Refuses a need that does not fit `sizes`, naming the map, its size and the flag that
    /// sets it. `configured` is what the daemon would create a network's maps with now: when
    /// the network's maps were created with other sizes, the message says so, since a flag
    /// changes only maps created after it.
    pub fn check(&self, network: &str, sizes: &MapSizes, configured: &MapSizes) -> Result<()> {
        let rows = [
            (
                "VIP entries",
                "lb_vips",
                self.vips,
                sizes.services,
                configured.services,
                "--max-services",
            ),
            (
                "published-port entries",
                "lb_ports",
                self.ports,
                sizes.services,
                configured.services,
                "--max-services",
            ),
            (
                "backend slots (every backend of every VIP and published port; a set being replaced counts twice)",
                "lb_backends",
                self.backend_slots,
                sizes.backends,
                configured.backends,
                "--max-backends",
            ),
            (
                "IPv6 VIP entries",
                "lb_vips6",
                self.vips6,
                sizes.services,
                configured.services,
                "--max-services",
            ),
            (
                "IPv6 published-port entries",
                "lb_ports6",
                self.ports6,
                sizes.services,
                configured.services,
                "--max-services",
            ),
            (
                "IPv6 backend slots (as IPv4's)",
                "lb_backends6",
                self.backend_slots6,
                sizes.backends,
                configured.backends,
                "--max-backends",
            ),
            (
                "counters (one per backend slot)",
                "lb_counters",
                self.counters,
                sizes.counters,
                configured.counters,
                "--max-services or --max-backends",
            ),
        ];
        for (what, map, need, have, conf, flag) in rows {
            if need <= have as usize {
                continue;
            }
            let how = if have == conf {
                format!("raise it with lb daemon {flag}")
            } else {
                format!(
                    "this network's maps were created with {have} entries and lb daemon {flag} now gives {conf}: a changed size applies to maps created after it, so remove the network and add it again to resize"
                )
            };
            bail!("network {network}: needs {need} {what} but {map} holds {have} ({how})");
        }
        if self.ifaces > MAX_IFACES as usize {
            bail!(
                "network {network}: {} interfaces, lb_ifaces holds {MAX_IFACES} (a fixed limit)",
                self.ifaces
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
