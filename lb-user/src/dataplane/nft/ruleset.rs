//! The tables of one network (`ip`, and `ip6` while it has IPv6 sets), each rendered whole (pure: the golden tests read it) for a first
//! sync; `diff.rs` renders the next ones from the same pieces.
//!
//! Layout. Moby's elements `VIP . I : backend` (and the port ones) are grouped by their set's
//! *shape*, the list of bucket intervals its partition has (moby's equal partition of n
//! backends gives every set of n backends the same shape). Per kind of set (`v` VIPs, `p`
//! published ports, `h` ports bound to a `host_ip`) and shape `S`:
//! - chain `K-S` draws `numgen random mod 65536` once and jumps through the interval vmap
//!   `K-S` (`I_k : goto K-S-k`): moby's partition, bucket for bucket;
//! - chain `K-S-k` translates by the map `K-S-k` (set key → backend of interval `I_k`), whose
//!   element `VIP : backend` *is* moby's element `VIP . I_k : backend`, with its counter.
//!
//! A dsr network's `real-server` elements take the same layout in its DSR table (kinds `d` and
//! `d6`, [`Kind::RealServer`]; `dsr.rs` has their chains).
//!
//! The prerouting chain (what arrives by the network's interfaces) and the output chain (what
//! the namespace's own processes send) dispatch by verdict maps: `vip-dispatch` (VIP →
//! `goto v-S`), then, off the VIPs, `port-host-dispatch` (`host . proto . port`, the more
//! specific binding) and `port-dispatch` (`proto . port`, on the node's own addresses only).
//!
//! Why this shape and not moby's three concatenated interval maps: see the module doc of
//! `dataplane::nft` (pipapo refuses them past ~1,365 elements per netlink message; a map and
//! a chain per set is refused by nothing but costs 30 s at 10,000 services because the kernel
//! finds a set by name in a list). Here the number of sets is the number of shapes, not of
//! services, and each map is a hash (or a one-field interval map of a few elements).
//!
//! One file because the layout is one: the names and shapes of chains, maps and units are defined
//! here once, for the whole tables rendered here and for the differences `diff.rs` renders from the
//! same pieces.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    hash::{Hash as _, Hasher},
    net::{IpAddr, Ipv4Addr},
};

use anyhow::Result;

use super::dsr;
use crate::node::netlink::network_of;

use crate::core::{
    compose::ComposedNetwork,
    compose::PortKey,
    elements::{NAT_PUBLISH_PORT, NAT_SERVICE_VIP, Placed, REAL_SERVER, SetKey, placed_sets},
    model::{Family, Masquerade, Mode, Network},
};

/// nft's type of an address of `family`.
fn addr_type(family: Family) -> &'static str {
    match family {
        Family::V4 => "ipv4_addr",
        Family::V6 => "ipv6_addr",
    }
}

pub use crate::node::nft::TABLE_PREFIX;
/// Every VIP of the network: published ports never apply to a VIP's own address.
pub const VIP_SET: &str = "service-vips";
/// One element, a hash of the network the table was last written for: a difference is only
/// applied on top of the network it was computed from (see [`super::diff::update`]).
pub const SYNC_SET: &str = "lb-sync";
const NUMGEN: &str = "numgen random mod 65536";
/// The version of this layout, part of the sync hash: a table of another layout is never
/// taken for this one.
const LAYOUT: &str = "lb-nft-2";

pub fn table_name(network: &str) -> String {
    format!("{TABLE_PREFIX}{network}")
}

/// nft's name of `family`, both as a table family and as the prefix of its header's fields
/// (`ip daddr`, `ip6 daddr`).
pub fn nft_family(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// Network `network`'s NAT table of `family` as commands name it: `ip lb-web`, `ip6 lb-web`.
/// The two tables are moby's ruleset once per family (as the CNI portmap plugin writes `ip`
/// and `ip6` tables), rather than one `inet` table: an IPv4 table an lb before dual stack
/// wrote stays the same table, so an upgrade changes nothing of it, and a network without
/// IPv6 has no second table. Every command of this module takes it whole, as `t`.
pub fn table(family: Family, network: &str) -> String {
    format!("{} {}", nft_family(family), table_name(network))
}

/// The kinds of sets, each with its own dispatch map and key: three in the NAT tables, and a
/// dsr network's VIPs in its DSR table (`dsr.rs`), one kind per family there (both families'
/// units share that table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Vip,
    Port,
    HostPort,
    RealServer(Family),
}

impl Kind {
    /// The kinds of the NAT tables.
    pub const ALL: [Kind; 3] = [Kind::Vip, Kind::Port, Kind::HostPort];
    /// Every kind, the DSR table's too.
    pub const EVERY: [Kind; 5] = [
        Kind::Vip,
        Kind::Port,
        Kind::HostPort,
        Kind::RealServer(Family::V4),
        Kind::RealServer(Family::V6),
    ];

    /// The prefix of the chains and maps of this kind.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Vip => "v",
            Kind::Port => "p",
            Kind::HostPort => "h",
            Kind::RealServer(Family::V4) => "d",
            Kind::RealServer(Family::V6) => "d6",
        }
    }

    pub fn dispatch(self) -> &'static str {
        match self {
            Kind::Vip => "vip-dispatch",
            Kind::Port => "port-dispatch",
            Kind::HostPort => "port-host-dispatch",
            Kind::RealServer(Family::V4) => "real-server-dispatch",
            Kind::RealServer(Family::V6) => "real-server6-dispatch",
        }
    }

    /// Moby's map whose elements this kind's slot maps hold.
    pub fn design_map(self) -> &'static str {
        match self {
            Kind::Vip => NAT_SERVICE_VIP,
            Kind::Port | Kind::HostPort => NAT_PUBLISH_PORT,
            Kind::RealServer(_) => REAL_SERVER,
        }
    }

    /// How a dispatch entry leads to its shape's chain. The DSR table's jumps, so that what
    /// its units do not send on comes back to the ingress chain's drop (a NAT chain that
    /// ends lets the packet go untranslated, as a missed dispatch does).
    fn verdict(self) -> &'static str {
        match self {
            Kind::RealServer(_) => "jump",
            _ => "goto",
        }
    }

    /// The dispatch map's key type (a DSR kind's family is its own).
    pub(super) fn key_type(self, family: Family) -> String {
        let addr = addr_type(family);
        match self {
            Kind::Vip => addr.to_owned(),
            Kind::Port => "inet_proto . inet_service".to_owned(),
            Kind::HostPort => format!("{addr} . inet_proto . inet_service"),
            Kind::RealServer(f) => addr_type(f).to_owned(),
        }
    }

    /// The slot map's declaration: the set key to the translation (for IPv6's DSR units, the
    /// backend's number, see `dsr.rs`).
    fn slot_typeof(self, family: Family) -> String {
        let ip = nft_family(family);
        match self {
            Kind::Vip => format!("{ip} daddr : {ip} daddr"),
            Kind::Port => format!("meta l4proto . th dport : {ip} daddr . th dport"),
            Kind::HostPort => {
                format!("{ip} daddr . meta l4proto . th dport : {ip} daddr . th dport")
            }
            Kind::RealServer(Family::V4) => "ip daddr : ip daddr".to_owned(),
            Kind::RealServer(Family::V6) => "ip6 daddr : meta mark".to_owned(),
        }
    }

    /// The slot chain's rule, translating by map `map`. A DSR unit sends the frame out of
    /// the device it came in by (`device meta iif`), so one unit serves every device.
    fn slot_rule(self, family: Family, map: &str) -> String {
        let l4 = "meta l4proto { tcp, udp, sctp }";
        let ip = nft_family(family);
        match self {
            Kind::Vip => format!("dnat {ip} to {ip} daddr map @{map}"),
            Kind::Port => format!("{l4} dnat {ip} to meta l4proto . th dport map @{map}"),
            Kind::HostPort => {
                format!("{l4} dnat {ip} to {ip} daddr . meta l4proto . th dport map @{map}")
            }
            Kind::RealServer(Family::V4) => {
                format!("fwd ip to ip daddr map @{map} device meta iif")
            }
            Kind::RealServer(Family::V6) => {
                format!("meta mark set ip6 daddr map @{map} goto {}", dsr::NEW6)
            }
        }
    }
}

pub(super) fn kind(set: &SetKey) -> Kind {
    match set {
        SetKey::Vip(_) => Kind::Vip,
        SetKey::Port(PortKey { host_ip: None, .. }) => Kind::Port,
        SetKey::Port(PortKey {
            host_ip: Some(_), ..
        }) => Kind::HostPort,
    }
}

/// A set's key in nft's notation (`10.0.0.5`, `tcp . 80`, `192.168.1.10 . tcp . 5432`).
pub(super) fn nft_key(set: &SetKey) -> String {
    match set {
        SetKey::Vip(vip) => vip.to_string(),
        SetKey::Port(PortKey {
            host_ip: None,
            proto,
            port,
            ..
        }) => format!("{proto} . {port}"),
        SetKey::Port(PortKey {
            host_ip: Some(h),
            proto,
            port,
            ..
        }) => format!("{h} . {proto} . {port}"),
    }
}

/// A shape's name: its interval count and a hash of the intervals, so the same partition has
/// the same chains in every sync and after a restart.
pub(super) fn shape_name(intervals: &[String]) -> String {
    format!(
        "s{}-{:016x}",
        intervals.len(),
        fnv1a(intervals.join(",").as_bytes())
    )
}

/// 64-bit FNV-1a: stable across builds and machines, unlike std's `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(bytes);
    h.finish()
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The hash [`SYNC_SET`] holds for `network`, of what the table is rendered from (hashing
/// the fields costs milliseconds at 10,000 services where the JSON took half a second).
pub fn sync_token(network: &Network) -> u32 {
    let mut h = Fnv::default();
    (LAYOUT, &network.name, &network.interfaces, &network.netns).hash(&mut h);
    (network.mode, network.masquerade).hash(&mut h);
    if network.mode == Mode::Dsr {
        // A DSR table of another layout is never taken for this one either (only a dsr
        // network's token says it, so the others' stay those of the lb before it).
        dsr::LAYOUT.hash(&mut h);
    }
    for s in &network.services {
        match Ipv4Service::of(s) {
            Some(v4) => v4.hash(&mut h),
            None => (&s.id, &s.generation, &s.vips, &s.backends, &s.ports).hash(&mut h),
        }
    }
    let h = h.finish();
    (h ^ (h >> 32)) as u32
}

/// A service of IPv4 addresses only, hashed in the types an lb before dual stack hashed (the
/// std `Hash` of `Ipv4Addr` differs from that of `IpAddr`): a table that lb wrote keeps its
/// token across the upgrade, so the first sync after it applies the difference instead of
/// declaring the whole table again (which briefly leaves new connections untranslated, see
/// `diff::update`). The golden rulesets hold tokens of that lb.
#[derive(Hash)]
struct Ipv4Service<'a> {
    id: &'a str,
    generation: &'a str,
    vip: Option<Ipv4Addr>,
    backends: Vec<(Ipv4Addr, bool)>,
    ports: Vec<(
        crate::core::model::Proto,
        u16,
        Option<u16>,
        Option<Ipv4Addr>,
    )>,
}

impl<'a> Ipv4Service<'a> {
    fn of(s: &'a crate::core::model::Service) -> Option<Ipv4Service<'a>> {
        let v4 = |ip: IpAddr| match ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        };
        let vip = match s.vips.as_slice() {
            [] => None,
            [one] => Some(v4(*one)?),
            _ => return None,
        };
        let backends = (s.backends.iter())
            .map(|b| Some((v4(b.ip)?, b.disabled)))
            .collect::<Option<_>>()?;
        let ports = (s.ports.iter())
            .map(|p| {
                let host_ip = match p.host_ip {
                    Some(h) => Some(v4(h)?),
                    None => None,
                };
                Some((p.proto, p.published, p.target, host_ip))
            })
            .collect::<Option<_>>()?;
        Some(Ipv4Service {
            id: &s.id,
            generation: &s.generation,
            vip,
            backends,
            ports,
        })
    }
}

/// One kind's chains for one shape.
pub type Unit = (Kind, String);

/// What the table holds for a network, by object.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub vips: BTreeSet<IpAddr>,
    /// Set → its kind and shape.
    pub dispatch: BTreeMap<SetKey, Unit>,
    /// Every (kind, shape) in use → its intervals in slot order.
    pub units: BTreeMap<Unit, Vec<String>>,
    /// (kind, shape, slot) → set key → translation.
    pub slots: BTreeMap<(Kind, String, usize), BTreeMap<SetKey, String>>,
}

impl Layout {
    /// The NAT table of `family`, from the core's elements (`placed_elements`, the source of
    /// `lb elements`): the sets of that family.
    pub fn of(network: &ComposedNetwork, family: Family) -> Layout {
        Layout::of_sets(network, |k| k.family() == family)
    }

    /// [`Layout::of`] the sets `wanted` selects (and of the VIPs among them), which are of
    /// one family. A dsr network's real-server elements are the DSR table's
    /// ([`Layout::of_real_server`]).
    pub fn of_sets(network: &ComposedNetwork, wanted: impl Fn(&SetKey) -> bool) -> Layout {
        let placed = placed_sets(network, &wanted).into_iter();
        Layout::build(
            network,
            &wanted,
            placed
                .filter(|p| p.element.map != REAL_SERVER)
                .map(|p| (kind(&p.set), p.element.value.clone(), p)),
        )
    }

    /// The DSR table's units of `family` for the VIPs `wanted` selects: the `real-server`
    /// elements, each translating to what `value` makes of its backend.
    pub fn of_real_server(
        network: &ComposedNetwork,
        family: Family,
        wanted: impl Fn(&SetKey) -> bool,
        value: impl Fn(IpAddr) -> Option<String>,
    ) -> Layout {
        let wanted = |k: &SetKey| k.family() == family && wanted(k);
        let placed = placed_sets(network, wanted).into_iter();
        Layout::build(
            network,
            &wanted,
            placed
                .filter(|p| p.element.map == REAL_SERVER)
                .filter_map(|p| Some((Kind::RealServer(family), value(p.backend)?, p))),
        )
    }

    /// The layout of `elements` (each with its kind and translation, in `placed_elements`'
    /// order: per set, in interval order) and of the VIPs `wanted` selects.
    fn build(
        network: &ComposedNetwork,
        wanted: &dyn Fn(&SetKey) -> bool,
        elements: impl Iterator<Item = (Kind, String, Placed)>,
    ) -> Layout {
        let mut sets: BTreeMap<SetKey, (Kind, Vec<(String, String)>)> = BTreeMap::new();
        for (kind, value, p) in elements {
            let (_, interval) = (p.element.key.rsplit_once(" . "))
                .expect("an element key ends in its bucket interval");
            let set = sets.entry(p.set).or_insert_with(|| (kind, Vec::new()));
            set.1.push((interval.to_owned(), value));
        }
        let mut layout = Layout {
            vips: (network.composed().vips.keys())
                .filter(|v| wanted(&SetKey::Vip(**v)))
                .copied()
                .collect(),
            ..Layout::default()
        };
        for (key, (kind, elements)) in sets {
            let intervals: Vec<String> = elements.iter().map(|(i, _)| i.clone()).collect();
            let unit = (kind, shape_name(&intervals));
            for (k, (_, value)) in elements.into_iter().enumerate() {
                (layout.slots.entry((kind, unit.1.clone(), k)).or_default()).insert(key, value);
            }
            layout.units.entry(unit.clone()).or_insert(intervals);
            layout.dispatch.insert(key, unit);
        }
        layout
    }

    /// Moby's elements in this layout.
    pub fn element_count(&self) -> usize {
        self.slots.values().map(BTreeMap::len).sum()
    }

    /// The names of the chains and the maps of its units.
    pub fn objects(&self) -> impl Iterator<Item = String> + '_ {
        (self.units.iter()).flat_map(|((kind, shape), intervals)| {
            let slots = (0..intervals.len()).map(move |k| slot(*kind, shape, k));
            std::iter::once(chain(*kind, shape)).chain(slots)
        })
    }
}

pub(super) fn chain(kind: Kind, shape: &str) -> String {
    format!("{}-{shape}", kind.prefix())
}

pub(super) fn slot(kind: Kind, shape: &str, k: usize) -> String {
    format!("{}-{shape}-{k}", kind.prefix())
}

/// The subnets on each of a network's interfaces, of both families (aliases and IPv6
/// link-local ones excluded): what hairpin masquerade needs to know.
pub type Subnets = [(String, IpAddr, u8)];

fn quoted_set(names: &[String]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("{{ {} }}", q.join(", "))
}

/// `{ a, b }`, or nothing for no items (nft refuses an empty element list).
fn elements<I: IntoIterator<Item = String>>(items: I) -> Option<String> {
    let v: Vec<String> = items.into_iter().collect();
    (!v.is_empty()).then(|| format!("{{ {} }}", v.join(", ")))
}

/// The dispatch rules, each prefixed by `on` (which packets they look at): VIPs, then the
/// host-bound ports, then the ports on every address of the node. A verdict map that misses
/// ends its rule, so each rule only dispatches what its map holds; the host-bound ports go
/// first, as a more specific binding does on eBPF. `local` further limits the ports on every
/// address (IPv6's output chain leaves `::1` alone, see [`base_rules`]).
fn dispatch_rules(family: Family, on: &str, local: &str) -> Vec<String> {
    let l4 = "meta l4proto { tcp, udp, sctp }";
    let ip = nft_family(family);
    vec![
        format!("{on}{ip} daddr vmap @{}", Kind::Vip.dispatch()),
        format!(
            "{on}{l4} {ip} daddr != @{VIP_SET} {ip} daddr . meta l4proto . th dport vmap @{}",
            Kind::HostPort.dispatch()
        ),
        format!(
            "{on}{l4} {ip} daddr != @{VIP_SET} {local}fib daddr type local meta l4proto . th dport vmap @{}",
            Kind::Port.dispatch()
        ),
    ]
}

/// Every loopback address: `127.0.0.1` and the rest of 127/8 are the node's own.
const LOOPBACK: &str = "127.0.0.0/8";
/// IPv6's one loopback address.
const LOOPBACK6: &str = "::1";

/// The chain dropping what no link may bring (see [`base_rules`]).
pub const GUARD_CHAIN: &str = "localnet-guard";

/// The rules of the base chains, one per line.
struct BaseRules {
    /// What arrives by the network's interfaces.
    prerouting: Vec<String>,
    /// What processes of the namespace send.
    output: Vec<String>,
    postrouting: Vec<String>,
    /// Filter, before conntrack, on what arrives by the network's interfaces.
    guard: Vec<String>,
}

/// The base chains' rules. Node-local clients: the output chain dispatches what processes of
/// the namespace send, as the kernel's own NAT serves them (portmap's and kubelet's OUTPUT
/// rules), so they reach VIPs and published ports on the node's addresses, and from a
/// loopback source published ports on `127.0.0.1` (portmap's `snat` case): a port on every
/// address is on 127.0.0.1 too (`fib daddr type local`), a `host_ip`-bound one only on its
/// `host_ip` (its key has the address), and no VIP is on 127/8. Such a flow leaves with a
/// 127.0.0.1 source, which the kernel only routes out of, and back in by, an interface with
/// `route_localnet` on (the dataplane sets it, see `localnet.rs`), and which no backend could
/// answer: postrouting masquerades it whatever the network's masquerade mode.
///
/// The guard, kube-proxy's answer to CVE-2020-8558: with `route_localnet` on, an interface
/// no longer drops packets to or from 127/8 as martians, so a host on the link could reach a
/// service listening on the node's loopback. The guard drops them on the network's
/// interfaces (the ones lb turns `route_localnet` on for; other interfaces are the
/// operator's), at prerouting before conntrack and NAT: there a packet's addresses are the
/// ones it came with — the replies of a masqueraded 127.0.0.1 flow come to the node's
/// address, and a DNAT to 127.0.0.1 (an operator's `route_localnet` use) is still to the
/// node's address — so, unlike kube-proxy's filter INPUT rule, it needs no exception for
/// established or DNATed flows.
///
/// IPv6 has no `route_localnet`: a flow from `::1` can never leave the node, so the IPv6
/// output chain leaves connections to `[::1]:port` alone (the node answers them itself, as
/// without lb: a refusal where nothing listens), and needs neither the loopback masquerade
/// nor the guard.
fn base_rules(network: &Network, family: Family, subnets: &Subnets) -> BaseRules {
    let ifaces = quoted_set(&network.interfaces);
    let iif = format!("iifname {ifaces} ");
    let ip = nft_family(family);
    let loopback_masquerade = (family == Family::V4)
        .then(|| format!("ct status dnat oifname {ifaces} ip saddr {LOOPBACK} counter masquerade"));
    let postrouting = match network.masquerade {
        // The seed's rule, limited to what leaves by this network's interfaces (loopback
        // sources included).
        Masquerade::Always => vec![format!(
            "ct status dnat oifname {ifaces} counter masquerade"
        )],
        // Hairpin: a translated flow from a client on the segment it is sent back to would be
        // answered around the node, so it takes the node's address. (The eBPF dataplane asks
        // "does it leave by the interface it came in on"; postrouting has no input interface,
        // so the equivalent here is the client's address being on the output's subnet.)
        Masquerade::Auto => (loopback_masquerade.into_iter())
            .chain(
                (subnets.iter())
                    .filter(|(_, addr, _)| Family::of(*addr) == family)
                    .map(|(ifname, addr, prefix)| {
                        let net = network_of(*addr, *prefix);
                        format!(
                            "ct status dnat oifname \"{ifname}\" {ip} saddr {net}/{prefix} counter masquerade"
                        )
                    }),
            )
            .collect(),
        Masquerade::Never => loopback_masquerade.into_iter().collect(),
    };
    let (local, guard) = match family {
        Family::V4 => (
            String::new(),
            vec![
                format!("{iif}ip daddr {LOOPBACK} counter drop"),
                format!("{iif}ip saddr {LOOPBACK} counter drop"),
            ],
        ),
        Family::V6 => (format!("ip6 daddr != {LOOPBACK6} "), Vec::new()),
    };
    BaseRules {
        prerouting: dispatch_rules(family, &iif, ""),
        output: dispatch_rules(family, "", &local),
        postrouting,
        guard,
    }
}

/// Commands declaring one unit's maps and chains (its slot maps empty), emptied first where
/// they exist: the same text declares a unit whatever an earlier, failed sync left of it
/// (see `diff::update`, which declares new units one transaction ahead).
pub(super) fn add_unit(
    s: &mut String,
    t: &str,
    family: Family,
    (kind, shape): &Unit,
    intervals: &[String],
) {
    for k in 0..intervals.len() {
        let m = slot(*kind, shape, k);
        let _ = writeln!(
            s,
            "add map {t} {m} {{ typeof {}; counter; }}\nflush map {t} {m}\nadd chain {t} {m}\nflush chain {t} {m}\nadd rule {t} {m} {}",
            kind.slot_typeof(family),
            kind.slot_rule(family, &m)
        );
    }
    let c = chain(*kind, shape);
    let jumps = (intervals.iter().enumerate())
        .map(|(k, i)| format!("{i} : goto {}", slot(*kind, shape, k)));
    let _ = writeln!(
        s,
        "add map {t} {c} {{ typeof {NUMGEN} : verdict; flags interval; }}\nflush map {t} {c}\nadd element {t} {c} {}\nadd chain {t} {c}\nflush chain {t} {c}\nadd rule {t} {c} {NUMGEN} vmap @{c}",
        elements(jumps).expect("a shape has an interval")
    );
}

/// `delete` commands for one unit, whose chains nothing jumps to any more.
pub(super) fn delete_unit(s: &mut String, t: &str, (kind, shape): &Unit, slots: usize) {
    let c = chain(*kind, shape);
    // A chain is deleted empty, and only once no rule or verdict refers to it: the shape's
    // chain (its rule refers to the vmap), the vmap (it refers to the slot chains), then each
    // slot chain (its rule refers to its map) and map.
    let _ = writeln!(
        s,
        "flush chain {t} {c}\ndelete chain {t} {c}\ndelete map {t} {c}"
    );
    for k in 0..slots {
        let m = slot(*kind, shape, k);
        let _ = writeln!(
            s,
            "flush chain {t} {m}\ndelete chain {t} {m}\ndelete map {t} {m}"
        );
    }
}

pub(super) fn add_elements(s: &mut String, t: &str, map: &str, items: Vec<String>) {
    if let Some(e) = elements(items) {
        let _ = writeln!(s, "add element {t} {map} {e}");
    }
}

pub(super) fn delete_elements(s: &mut String, t: &str, map: &str, items: Vec<String>) {
    if let Some(e) = elements(items) {
        let _ = writeln!(s, "delete element {t} {map} {e}");
    }
}

/// The base chains and sets, emptied and declared again (small, so always rewritten: the
/// interfaces, masquerade and subnets they depend on are not all in the network).
pub(super) fn base(s: &mut String, t: &str, family: Family, network: &Network, subnets: &Subnets) {
    let rules = base_rules(network, family, subnets);
    for (name, kind, hook, prio, rules) in [
        (
            "prerouting",
            "nat",
            "prerouting",
            "dstnat",
            rules.prerouting,
        ),
        // -100, what `dstnat` names at prerouting: nft 1.0.6 takes no keyword at output.
        ("output", "nat", "output", "-100", rules.output),
        (
            "postrouting",
            "nat",
            "postrouting",
            "srcnat",
            rules.postrouting,
        ),
        (GUARD_CHAIN, "filter", "prerouting", "raw", rules.guard),
    ] {
        // IPv6 has no guard (see `base_rules`): the chain is not declared.
        if rules.is_empty() && name == GUARD_CHAIN {
            continue;
        }
        let _ = writeln!(
            s,
            "add chain {t} {name} {{ type {kind} hook {hook} priority {prio}; policy accept; }}\nflush chain {t} {name}"
        );
        for r in rules {
            let _ = writeln!(s, "add rule {t} {name} {r}");
        }
    }
}

/// The whole `nft -f` transaction of a first sync of `network`, given the `subnets` on its
/// interfaces, into a namespace where all of them exist: the tables deleted if they exist and
/// declared again with every element — the IPv4 table always, the IPv6 one where the network
/// has IPv6 sets ([`has_ipv6`]) — and for a dsr network its DSR table (see `dsr.rs`).
pub fn ruleset(network: &ComposedNetwork, subnets: &Subnets) -> Result<String> {
    declare(network, subnets, &dsr::Sync::fresh(network)).map(|(s, _)| s)
}

/// Whether `network` has a set of IPv6 (and so an IPv6 table).
pub fn has_ipv6(network: &ComposedNetwork) -> bool {
    network.composed().has(Family::V6)
}

/// [`ruleset`] with the DSR table as `dsr` says, and how many of moby's elements it writes.
pub fn declare(
    network: &ComposedNetwork,
    subnets: &Subnets,
    dsr: &dsr::Sync,
) -> Result<(String, usize)> {
    let mut s = String::new();
    let mut elements = declare_table(&mut s, network, Family::V4, subnets);
    if has_ipv6(network) {
        elements += declare_table(&mut s, network, Family::V6, subnets);
    } else {
        delete_table(&mut s, &table(Family::V6, &network.name));
    }
    elements += dsr::declare(&mut s, network, dsr);
    Ok((s, elements))
}

/// Commands deleting table `t` whether or not it exists (`add` first makes the `delete`
/// valid either way).
pub(super) fn delete_table(s: &mut String, t: &str) {
    let _ = writeln!(s, "add table {t}\ndelete table {t}");
}

/// The commands declaring `network`'s table of `family` whole (deleted first, in the same
/// transaction, where it exists), and how many of moby's elements it holds.
pub(super) fn declare_table(
    s: &mut String,
    network: &ComposedNetwork,
    family: Family,
    subnets: &Subnets,
) -> usize {
    let t = table(family, &network.name);
    let layout = Layout::of(network, family);
    delete_table(s, &t);
    let _ = writeln!(
        s,
        "add table {t}\nadd set {t} {SYNC_SET} {{ type mark; elements = {{ {} }}; }}\nadd set {t} {VIP_SET} {{ type {}; }}",
        sync_token(network),
        addr_type(family)
    );
    add_elements(
        s,
        &t,
        VIP_SET,
        layout.vips.iter().map(|v| v.to_string()).collect(),
    );
    for kind in Kind::ALL {
        let _ = writeln!(
            s,
            "add map {t} {} {{ type {} : verdict; }}",
            kind.dispatch(),
            kind.key_type(family)
        );
    }
    add_units(s, &t, family, &layout);
    dispatch_elements(s, &t, &layout.dispatch, |_| true);
    base(s, &t, family, network, subnets);
    layout.element_count()
}

/// Declares every unit of `layout` in table `t` (emptied first where it exists) with its
/// slots' elements: a whole table's units, before the dispatch entries that lead to them.
pub(super) fn add_units(s: &mut String, t: &str, family: Family, layout: &Layout) {
    for (unit, intervals) in &layout.units {
        add_unit(s, t, family, unit, intervals);
    }
    for ((kind, shape, k), items) in &layout.slots {
        let items = (items.iter())
            .map(|(key, v)| format!("{} : {v}", nft_key(key)))
            .collect();
        add_elements(s, t, &slot(*kind, shape, *k), items);
    }
}

/// Adds the dispatch entries that `keep` selects, one command per kind.
pub(super) fn dispatch_elements(
    s: &mut String,
    t: &str,
    dispatch: &BTreeMap<SetKey, Unit>,
    keep: impl Fn(&SetKey) -> bool,
) {
    let mut by_kind: BTreeMap<Kind, Vec<String>> = BTreeMap::new();
    for (set, (kind, shape)) in dispatch.iter().filter(|(set, _)| keep(set)) {
        (by_kind.entry(*kind).or_default()).push(format!(
            "{} : {} {}",
            nft_key(set),
            kind.verdict(),
            chain(*kind, shape)
        ));
    }
    for (kind, items) in by_kind {
        add_elements(s, t, kind.dispatch(), items);
    }
}
