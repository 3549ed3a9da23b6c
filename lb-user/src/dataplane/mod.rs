//! Dataplanes: what turns a network's composed state into kernel state.
//!
//! Contract of [`Dataplane`]: `apply` is called with the network as it must be now and the
//! network as the dataplane last applied it (`None` the first time, including the first time
//! after a restart, when what is pinned is adopted), each with its composition
//! ([`ComposedNetwork`]: the caller composes once per change; a dataplane plans from the
//! composition and never composes). It makes the kernel match, changing only
//! what differs, and either succeeds or leaves the last good state serving: the caller keeps
//! `previous` as the applied state until a call succeeds. `apply_sets` is the same for a
//! change of some sets alone ([`Delta`]), where the dataplane can write those and nothing
//! else; it may decline (`None`), and the caller applies the network whole. `remove` undoes
//! everything `apply` did for a network and tolerates pieces already gone.
use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
};

use anyhow::Result;

use crate::core::elements::SetKey;

pub mod aliases;
pub mod ebpf;
pub mod nft;
pub mod probe;
pub mod record;

pub use ebpf::dataplane::EbpfDataplane;
pub use nft::NftDataplane;

use crate::core::{
    compose::ComposedNetwork,
    model::{Network, Proto},
};

/// One tracked flow, as `lb conntrack` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Flow {
    pub proto: Proto,
    pub client: SocketAddr,
    /// The address and port the client asked (a VIP's, or the node's for a published port).
    pub frontend: SocketAddr,
    /// The id of the service that frontend belongs to, filled in by the daemon (`None`: no
    /// service of the network has it any more).
    #[serde(default)]
    pub service: Option<String>,
    pub backend: SocketAddr,
    pub state: FlowState,
    /// Seconds until the flow expires if no packet comes.
    pub expires_secs: Option<u64>,
    /// Seconds since the flow's last packet, where the dataplane knows it (DSR sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<u64>,
}

/// The state a flow is listed in: by `lb conntrack`, the status and the metrics, in this
/// order.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FlowState {
    /// No answer yet.
    Opening,
    Established,
    /// TCP closed (FINs both ways) or reset.
    Closing,
    /// A DSR session: the balancer sees one direction only, so it has no state (shown for
    /// `dsr` networks only).
    Dsr,
}

impl FlowState {
    pub const ALL: [FlowState; 4] = [
        FlowState::Opening,
        FlowState::Established,
        FlowState::Closing,
        FlowState::Dsr,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            FlowState::Opening => "opening",
            FlowState::Established => "established",
            FlowState::Closing => "closing",
            FlowState::Dsr => "dsr",
        }
    }

    /// Its place in [`FlowState::ALL`] and [`FlowStats::by_state`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether `network`'s flows are ever in this state: DSR sessions only on a `dsr`
    /// network.
    pub fn shown_for(self, network: &Network) -> bool {
        network.mode == crate::core::model::Mode::Dsr || self != FlowState::Dsr
    }
}

impl std::fmt::Display for FlowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a sync changed: entries (map entries, or moby's elements on nftables) written or
/// deleted — the cost a one-backend change must keep O(1) — and flows flushed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub written: usize,
    pub deleted: usize,
    pub flows_flushed: usize,
}

/// Which dataplane programs the networks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ebpf,
    Nftables,
    /// [`record::Recording`]: nothing is programmed (the daemon's logic under test).
    Recording,
}

impl Kind {
    /// As `lb status` and `--dataplane` name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Ebpf => "ebpf",
            Kind::Nftables => "nftables",
            Kind::Recording => "recording",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Packets and bytes of one service frontend or one of its backends, summed over CPUs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Count {
    /// The id of the service; empty for a frontend no service claims any more.
    pub service: String,
    /// What clients address: `10.99.0.10` (a VIP), `tcp/8080`, `tcp/8080@192.168.1.1`,
    /// `tcp/8080@::` (see [`crate::core::model::PortKey`]'s display).
    pub frontend: String,
    /// `None` for the frontend's own total.
    pub backend: Option<IpAddr>,
    pub packets: u64,
    pub bytes: u64,
}

impl Count {
    /// The counts of `set` (of `backend`, or the set's total), named for the service that
    /// claims it in `ids` ([`crate::core::elements::claimed_by`] of the network).
    pub fn new(
        ids: &HashMap<SetKey, &str>,
        set: SetKey,
        backend: Option<IpAddr>,
        packets: u64,
        bytes: u64,
    ) -> Count {
        Count {
            service: ids.get(&set).copied().unwrap_or_default().to_owned(),
            frontend: set.to_string(),
            backend,
            packets,
            bytes,
        }
    }
}

/// What status and metrics say of a network's flows; `None` where the dataplane cannot tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Live flows by state, in [`FlowState::ALL`] order.
    pub by_state: [u64; 4],
    /// Entries in the flow table (eBPF: every kind, expired ones not yet collected).
    pub entries: Option<u64>,
    /// Expired entries deleted since the daemon started.
    pub expired_total: Option<u64>,
}

impl FlowStats {
    /// Counts `flows` by state.
    pub fn of(flows: &[Flow]) -> FlowStats {
        let mut by_state = [0; 4];
        for f in flows {
            by_state[f.state.index()] += 1;
        }
        FlowStats {
            by_state,
            ..Default::default()
        }
    }

    /// Adds `other`'s counts (another flow table of the same network: IPv6's).
    pub fn add(&mut self, other: &FlowStats) {
        for (a, b) in self.by_state.iter_mut().zip(other.by_state) {
            *a += b;
        }
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.entries = sum(self.entries, other.entries);
        self.expired_total = sum(self.expired_total, other.expired_total);
    }
}

/// A change of some sets of a network alone (its contributions changed; its settings, its
/// VIPs and its place did not), for [`Dataplane::apply_sets`].
#[derive(Clone, Debug)]
pub struct Delta<'a> {
    /// The network as the dataplane last applied it.
    pub previous: &'a ComposedNetwork,
    /// The sets (VIPs, published ports) whose composition may have changed.
    pub sets: &'a BTreeSet<SetKey>,
    /// Backends the network did not list before, and those it no longer lists (their flows
    /// go as a removed backend's do).
    pub new_backends: BTreeSet<IpAddr>,
    pub gone_backends: BTreeSet<IpAddr>,
    /// A VIP, or a published port, was added or removed: aliases, or held ports, change.
    pub vips_changed: bool,
    pub ports_changed: bool,
}

/// Reads one network's counters, off the actor (see [`Dataplane::counts_reader`]).
pub type CountsReader = fn(&ComposedNetwork) -> Result<Vec<Count>>;

pub trait Dataplane: Send {
    fn kind(&self) -> Kind;
    /// Whether this dataplane can serve `network` at all (checked before a change is saved,
    /// so that a network it cannot serve is refused instead of retried forever).
    fn supports(&self, network: &Network) -> Result<()>;
    /// Whether `network` fits what this dataplane can hold (map capacities, counted against
    /// what it holds for the network now), checked before a change is saved: a state that
    /// cannot be applied is refused with the limit and how to raise it, instead of saved and
    /// retried forever.
    fn check_capacity(&mut self, _network: &ComposedNetwork) -> Result<()> {
        Ok(())
    }
    /// [`Dataplane::check_capacity`] of a change of `sets` alone (counted against what the
    /// network holds now); by default the whole check.
    fn check_capacity_sets(
        &mut self,
        network: &ComposedNetwork,
        _sets: &BTreeSet<SetKey>,
    ) -> Result<()> {
        self.check_capacity(network)
    }
    fn apply(
        &mut self,
        network: &ComposedNetwork,
        previous: Option<&ComposedNetwork>,
    ) -> Result<SyncStats>;
    /// Applies a change of `delta.sets` alone, the network as it must be now: writes only
    /// those sets, and either succeeds or leaves the network serving, as [`Dataplane::apply`]
    /// does. `None`: this dataplane (or this network on it) has no partial apply for the
    /// change, and the caller applies the network whole; so does it after an error.
    fn apply_sets(
        &mut self,
        _network: &ComposedNetwork,
        _delta: &Delta,
    ) -> Result<Option<SyncStats>> {
        Ok(None)
    }
    fn remove(&mut self, network: &Network) -> Result<()>;
    /// The networks this dataplane holds something of that are not in `keep` (what
    /// [`Dataplane::remove_others`] would remove).
    fn others(&mut self, keep: &[&str]) -> Result<Vec<String>>;
    /// Removes whatever this dataplane holds for networks that are not in `keep` (left by a
    /// daemon that stopped before removing them), and returns their names.
    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>>;
    /// Removes everything this dataplane holds, of `networks` (every network the state dir
    /// knows) and of any other: the daemon retires the dataplane it does not use, so that
    /// two never translate the same traffic. VIP aliases stay: the dataplane in use keeps
    /// them.
    fn retire(&mut self, networks: &[Network]) -> Result<()>;
    fn flows(&mut self, network: &ComposedNetwork) -> Result<Vec<Flow>>;
    fn counts(&mut self, network: &ComposedNetwork) -> Result<Vec<Count>>;
    /// A way to read a network's counters without this dataplane (and so without the
    /// daemon's actor), for a dataplane whose read is slow and needs none of its state: the
    /// metrics endpoint then reads them on its own thread and the writer is never held up by
    /// a scrape. `None` (the default): [`Dataplane::counts`] is cheap enough for the actor.
    fn counts_reader(&self) -> Option<CountsReader> {
        None
    }
    /// The network's flows by state, as last counted off the writer's path (`None`: not
    /// counted yet).
    fn flow_stats(&mut self, network: &ComposedNetwork) -> Option<FlowStats>;
    /// Per program and outcome, how many packets the datapath saw (`(hook, reason, count)`).
    fn reasons(&mut self, _network: &Network) -> Result<Vec<(&'static str, &'static str, u64)>> {
        Ok(Vec::new())
    }
    /// Looks at the node again for what decides the network's fast path (neighbours, bridge
    /// ports; with `firewall` also the forward-hook rules) and a `dsr` network's backend MACs,
    /// and applies only that. Dataplanes without either have nothing to do.
    fn refresh(&mut self, _network: &ComposedNetwork, _firewall: bool) -> Result<()> {
        Ok(())
    }

    /// Which path the network's translated packets take and why, as last decided (`None`:
    /// not decided yet).
    fn path(&mut self, _network: &Network) -> Option<String> {
        None
    }

    /// Conditions of the node, outside what lb writes, under which part of the network's
    /// service will not work on this dataplane; `lb status` shows them.
    fn warnings(&mut self, _network: &Network) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}
