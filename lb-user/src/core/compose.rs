//! Compose (moby `composeNFTLB`): fold every contribution of a network into one backend set
//! per VIP and one per published port.
//!
//! A network's maps have one writer, and each VIP's and each published port's bucket space
//! must be partitioned by whoever owns it: two generations of a service partitioning a shared
//! port independently would claim overlapping buckets. So the sets are composed here, from
//! every contribution at once, and partitioned once downstream ([`crate::core::elements`] and the
//! dataplanes).
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::Deref;

pub use crate::core::model::PortKey;
use crate::core::model::{Family, Network};

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
        self.vips.keys().any(|ip| Family::of(*ip) == family)
            || self.ports.keys().any(|k| k.family == family)
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

/// A network with its composition: composed once per change, by the owner of the network (the
/// daemon, `lb load`), and handed as is to the dataplane, which plans and applies it but never
/// composes. So what a dataplane writes, what `lb elements` prints and what the other
/// dataplane would write come from one composition. It reads as the network it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComposedNetwork {
    network: Network,
    composed: Composed,
}

impl ComposedNetwork {
    pub fn new(network: Network) -> ComposedNetwork {
        let composed = compose(&network);
        ComposedNetwork { network, composed }
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    pub fn composed(&self) -> &Composed {
        &self.composed
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
