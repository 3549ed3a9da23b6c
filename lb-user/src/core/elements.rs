//! Element rendering (moby `nftLBNATElements` and the DSR real-server map): every composed set
//! partitioned over the bucket space, in DESIGN.md's notation.
//!
//! This is the whole observable output of the load balancer's data plane, and it is the same
//! for both dataplanes (the nftables one loads these elements, the eBPF one loads the same
//! partition as slots), so it can be asserted without root, a namespace or an `nft` binary.
//!
//! Order: by map name, then by the structured key — VIP address, or published port (ports on
//! every address first, then per host address; each by protocol number, then port number) —
//! then by interval start, all compared as numbers, never as rendered text. So
//! `10.0.0.5 . 0-32767` precedes `10.0.0.5 . 32768-65535`, `10.0.0.5` precedes `10.0.0.10` and
//! port 80 precedes 443. Within a set, interval order is slot order, which is the set's sorted
//! order, so the output is stable.
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use lb_common::{BUCKETS, bucket_interval};

use crate::core::compose::{Composed, ComposedNetwork, PortKey};
use crate::core::model::{Family, Mode, Network, Service};

/// NAT map of VIP → backend (any port).
pub const NAT_SERVICE_VIP: &str = "nat-service-vip";
/// NAT map of published port → backend and target port.
pub const NAT_PUBLISH_PORT: &str = "nat-publish-port";
/// DSR map of VIP → backend whose MAC the packet is sent to.
pub const REAL_SERVER: &str = "real-server";

/// One map element: `{map} {key} : {value}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Element {
    pub map: &'static str,
    pub key: String,
    pub value: String,
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        notation(f, self.map, &self.key, &self.value)
    }
}

/// DESIGN.md's element notation, `{map} {key} : {value}`: of a composed [`Element`] and of the
/// API's `ElementEntry` alike.
pub fn notation(f: &mut fmt::Formatter<'_>, map: &str, key: &str, value: &str) -> fmt::Result {
    write!(f, "{map} {key} : {value}")
}

/// An inclusive range `start-end` of buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval {
    pub start: u32,
    pub end: u32,
}

impl Interval {
    pub fn contains(self, bucket: u32) -> bool {
        self.start <= bucket && bucket <= self.end
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

impl FromStr for Interval {
    type Err = String;

    /// The rendered `start-end` form, as `nft list` prints it back.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid interval {s:?}: expected START-END");
        let (start, end) = s.split_once('-').ok_or_else(bad)?;
        let (start, end) = (
            start.parse().map_err(|_| bad())?,
            end.parse().map_err(|_| bad())?,
        );
        if start > end {
            return Err(bad());
        }
        Ok(Interval { start, end })
    }
}

/// moby's `EqualWeightIntervals`: the interval of `0..length` each value owns, in the order
/// given, from [`lb_common::bucket_interval`] (the one partition rule the programs share).
/// Values beyond `length` get none; no values, or `length` 0, yield nothing. The iterator is
/// `Clone` and restartable: collecting it twice gives the same result.
pub fn equal_weight_intervals<T>(
    values: &[T],
    length: u32,
) -> impl Iterator<Item = (Interval, &T)> + Clone + '_ {
    let n = u32::try_from(values.len()).unwrap_or(u32::MAX);
    values.iter().zip(0..).map_while(move |(value, index)| {
        let (start, end) = bucket_interval(index, n, length)?;
        Some((Interval { start, end }, value))
    })
}

/// The elements of the NAT maps: every VIP's and every published port's set.
pub fn nat_elements(composed: &Composed) -> Vec<Element> {
    elements(composed, Maps::Nat)
}

/// The elements of the DSR real-server map: every VIP's set.
pub fn dsr_elements(composed: &Composed) -> Vec<Element> {
    elements(composed, Maps::Dsr)
}

/// Everything `network` programs. A NAT network has the NAT maps; a DSR network has, as in
/// moby, the NAT maps as well as the real-server map: its published ports are served by NAT,
/// and its VIPs by NAT wherever DSR cannot run (a kernel without the netdev egress hook).
pub fn network_elements(network: &ComposedNetwork) -> Vec<Element> {
    (placed_elements(network).into_iter())
        .map(|p| p.element)
        .collect()
}

/// One element per line, each ending in a newline; nothing for no elements.
pub fn render(elements: &[Element]) -> String {
    elements.iter().map(|e| format!("{e}\n")).collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Maps {
    Nat,
    Dsr,
    Both,
}

/// The key of one composed set — a service's frontend, as counters name it — ordered structurally (see
/// the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKey {
    Vip(IpAddr),
    Port(PortKey),
}

impl SetKey {
    /// The family of the set's key, and so of its backends.
    pub fn family(&self) -> Family {
        match self {
            SetKey::Vip(vip) => Family::of(*vip),
            SetKey::Port(key) => key.family,
        }
    }
}

impl fmt::Display for SetKey {
    /// `10.99.0.10`, `tcp/8080`, `tcp/8080@192.168.1.10`: the `frontend` label of the
    /// metrics, on every dataplane.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetKey::Vip(vip) => vip.fmt(f),
            SetKey::Port(key) => key.fmt(f),
        }
    }
}

/// The sets a service claims (its VIP and its published ports).
pub fn claims(service: &Service) -> impl Iterator<Item = SetKey> + '_ {
    (service.vips.iter().map(|v| SetKey::Vip(*v)))
        .chain(service.port_keys().map(|(k, _)| SetKey::Port(k)))
}

/// The id of the service claiming each of `network`'s sets: one id per set, as validation
/// refuses a VIP or a port claimed by two services (only the generations of one share them).
pub fn claimed_by(network: &Network) -> HashMap<SetKey, &str> {
    (network.services.iter())
        .flat_map(|s| claims(s).map(|k| (k, s.id.as_str())))
        .collect()
}

/// An element with the set it belongs to and the backend it sends to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub set: SetKey,
    pub backend: IpAddr,
    pub element: Element,
}

/// [`network_elements`], each with its set and backend (what per-element counters are
/// reported under), in the same order.
pub fn placed_elements(network: &ComposedNetwork) -> Vec<Placed> {
    placed_sets(network, |_| true)
}

/// [`placed_elements`] of the sets `wanted` selects (what a difference between two
/// networks renders).
pub fn placed_sets(network: &ComposedNetwork, wanted: impl Fn(&SetKey) -> bool) -> Vec<Placed> {
    let maps = match network.mode {
        Mode::Nat => Maps::Nat,
        Mode::Dsr => Maps::Both,
    };
    placed(network.composed(), maps, wanted)
}

fn elements(composed: &Composed, maps: Maps) -> Vec<Element> {
    placed(composed, maps, |_| true)
        .into_iter()
        .map(|p| p.element)
        .collect()
}

fn placed(composed: &Composed, maps: Maps, wanted: impl Fn(&SetKey) -> bool) -> Vec<Placed> {
    let nat = maps != Maps::Dsr;
    let dsr = maps != Maps::Nat;
    let mut rows: Vec<(&'static str, SetKey, Interval, IpAddr, String)> = Vec::new();
    for (&vip, backends) in (composed.vips.iter()).filter(|(v, _)| wanted(&SetKey::Vip(**v))) {
        for (interval, &backend) in equal_weight_intervals(backends, BUCKETS) {
            let value = backend.to_string();
            if dsr {
                let row = (
                    REAL_SERVER,
                    SetKey::Vip(vip),
                    interval,
                    backend,
                    value.clone(),
                );
                rows.push(row);
            }
            if nat {
                rows.push((NAT_SERVICE_VIP, SetKey::Vip(vip), interval, backend, value));
            }
        }
    }
    if nat {
        for (&key, backends) in (composed.ports.iter()).filter(|(k, _)| wanted(&SetKey::Port(**k)))
        {
            for (interval, (ip, target)) in equal_weight_intervals(backends, BUCKETS) {
                rows.push((
                    NAT_PUBLISH_PORT,
                    SetKey::Port(key),
                    interval,
                    *ip,
                    format!("{ip} . {target}"),
                ));
            }
        }
    }
    // (map, set, interval) is unique per element, so the value never decides the order.
    rows.sort_unstable_by_key(|(map, set, interval, _, _)| (*map, *set, *interval));
    rows.into_iter()
        .map(|(map, set, interval, backend, value)| Placed {
            set,
            backend,
            element: Element {
                map,
                key: match set {
                    SetKey::Vip(vip) => format!("{vip} . {interval}"),
                    // A port on every address reads the same in both families (nftables keys
                    // it so in each family's table); its backends tell them apart.
                    SetKey::Port(PortKey {
                        host_ip: None,
                        proto,
                        port,
                        ..
                    }) => format!("{proto} . {port} . {interval}"),
                    SetKey::Port(PortKey {
                        host_ip: Some(host_ip),
                        proto,
                        port,
                        ..
                    }) => format!("{host_ip} . {proto} . {port} . {interval}"),
                },
                value,
            },
        })
        .collect()
}
