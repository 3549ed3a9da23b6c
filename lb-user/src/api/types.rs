//! The replies of the API, shared by the daemon (which serializes them) and the CLI (which
//! reads them as these types, never by field name).
use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::{
    core::{
        diff::Change,
        model::{Attach, DesiredState, Masquerade, Mode, Service},
    },
    dataplane::{Flow, FlowState},
};

/// The reply to a change: what was done, in words, and every difference it made to the
/// desired state (for a dry run: would make; nothing was saved or applied).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    pub done: String,
    #[serde(default)]
    pub changes: Vec<Change>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The store's revision with the change saved (`None` for a dry run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// A refusal. `saved` is true when the change was saved and will be applied by a retry (the
/// daemon answers 500); false when nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: String,
    #[serde(default)]
    pub saved: bool,
}

/// One network of `GET /v1/networks`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSummary {
    pub name: String,
    pub interfaces: Vec<String>,
    pub netns: Option<String>,
    pub mode: Mode,
    pub attach: Attach,
    pub masquerade: Masquerade,
    /// How many contributions (service id + generation) it has.
    pub services: usize,
}

/// One contribution of `GET /v1/services`, with the network it is in, where clients reach it,
/// and how each backend is doing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub network: String,
    pub service: Service,
    /// The VIP (`10.99.0.10`, every port) and each published port
    /// (`tcp/8080:80@192.168.1.10`).
    #[serde(default)]
    pub frontends: Vec<String>,
    /// One per backend of `service`, in its order.
    #[serde(default)]
    pub backends: Vec<BackendStats>,
}

/// A backend of one contribution as `lb service list` shows it. The counts are the
/// frontends' (a VIP or port that generations share counts once, under each of them);
/// `None` where the dataplane cannot tell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStats {
    pub address: IpAddr,
    pub state: BackendState,
    /// Live flows to it.
    pub flows: Option<u64>,
    pub packets: Option<u64>,
    pub bytes: Option<u64>,
}

/// Whether a backend takes new flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendState {
    Active,
    /// No new flows; existing ones drain.
    Disabled,
}

impl std::fmt::Display for BackendState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendState::Active => "active",
            BackendState::Disabled => "disabled",
        })
    }
}

/// One composed element of `GET /v1/elements`: `{map} {key} : {value}` in DESIGN.md's
/// notation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElementEntry {
    pub network: String,
    pub map: String,
    pub key: String,
    pub value: String,
}

/// One flow of `GET /v1/conntrack`, with the network it is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackEntry {
    pub network: String,
    #[serde(flatten)]
    pub flow: Flow,
}

impl ElementEntry {
    pub fn new(network: &str, e: crate::core::elements::Element) -> Self {
        ElementEntry {
            network: network.to_owned(),
            map: e.map.to_owned(),
            key: e.key,
            value: e.value,
        }
    }
}

/// The element in DESIGN.md's notation (its network is not part of it).
impl std::fmt::Display for ElementEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::core::elements::notation(f, &self.map, &self.key, &self.value)
    }
}

/// What the last successful apply of a network wrote, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastSync {
    /// Seconds since the Unix epoch.
    pub at_unix: u64,
    /// Seconds ago, when the status was read.
    pub ago_secs: u64,
    pub written: usize,
    pub deleted: usize,
    pub flows_flushed: usize,
}

/// One network of `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStatus {
    pub name: String,
    /// Whether the dataplane holds the network's desired state.
    pub applied: bool,
    /// The last apply error while it does not.
    pub error: Option<String>,
    pub interfaces: Vec<String>,
    pub attach: Attach,
    pub mode: Mode,
    /// Which path translated packets take and why (`None`: not decided yet).
    #[serde(default)]
    pub path: Option<String>,
    /// Contributions (service id + generation).
    pub services: usize,
    /// Distinct backend addresses over every contribution.
    pub backends: usize,
    /// Flows as last counted off the writer's path (`None`: not counted yet).
    pub flows: Option<u64>,
    pub flows_by_state: Option<BTreeMap<FlowState, u64>>,
    /// Entries of the flow table, where the dataplane has one.
    pub flow_entries: Option<u64>,
    pub warnings: Vec<String>,
    pub last_sync: Option<LastSync>,
}

/// `GET /v1/status`: the dataplane in use and why, the store, what the last change cost, and
/// each network's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub dataplane: String,
    pub reason: String,
    #[serde(default)]
    pub store: Option<StoreStatus>,
    /// Networks found on the node when the store was created, which it does not know: left
    /// as they are until a network of that name is added or applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<String>,
    #[serde(default)]
    pub last_change: Option<ChangeWork>,
    /// `lb daemon --cluster`: what this node applied of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Box<ClusterStatus>>,
    pub networks: Vec<NetworkStatus>,
}

/// What a `--cluster` daemon holds of the cluster's services.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The members, as given.
    pub endpoints: String,
    pub prefix: String,
    pub node: String,
    /// Following the cluster now.
    pub connected: bool,
    /// The etcd revision the cluster's services here are as of.
    pub revision: i64,
    /// Revisions behind the newest etcd told of.
    pub lag: i64,
    /// Cluster services served here.
    pub services: usize,
    /// Cluster services of networks this node does not have.
    pub waiting: usize,
    /// Cluster services this node refuses, and why.
    pub refused: Vec<crate::cluster::Refused>,
    /// Keys under the prefix that are not a service lb can read.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub invalid: std::collections::BTreeMap<String, String>,
    pub last_error: Option<String>,
    pub down_since_unix: Option<u64>,
    pub last_contact_unix: Option<u64>,
}

/// One line of `GET /v1/watch`: a change saved at a revision, once applied (or failing to
/// be, `applied: false`: a retry applies it and says so with an event of its own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub revision: u64,
    /// The changes saved at this revision (none for an event of networks applied by a retry).
    #[serde(default)]
    pub changes: Vec<Change>,
    /// Whether every network the change touched is applied; absent from events sent from
    /// the history (a watcher that reconnects: `lb status` says what is applied now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<bool>,
    /// Networks a retry applied (their changes were saved at earlier revisions), the state
    /// being that of `revision`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Changes left out of `changes`: a change of more than [`Event::MAX_CHANGES`]
    /// differences (a whole state applied) is sent without them; a watcher that needs them
    /// reads the state.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: usize,
}

impl Event {
    pub const MAX_CHANGES: usize = 10_000;

    /// The event of the change saved at `revision` with `changes`.
    pub fn of(revision: u64, changes: &[Change], applied: Option<bool>) -> Event {
        let (changes, omitted) = if changes.len() > Self::MAX_CHANGES {
            (Vec::new(), changes.len())
        } else {
            (changes.to_vec(), 0)
        };
        Event {
            revision,
            changes,
            applied,
            networks: Vec::new(),
            omitted,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The daemon's desired-state store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStatus {
    pub path: String,
    /// Bumped by every change saved.
    pub revision: u64,
    /// Its size on disk.
    pub bytes: u64,
}

/// What one change cost the daemon, counted: what a change costs must not grow with the
/// state (`lb status -j` shows the last one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeWork {
    /// The revision it was saved at.
    pub revision: u64,
    /// Contributions checked against the indexes.
    pub validated: usize,
    /// Sets (VIPs, published ports) composed again.
    pub recomposed: usize,
    /// Dumps of a namespace's addresses (the node checks' and the applies').
    pub address_dumps: u64,
    /// Keys the store wrote or deleted.
    pub store_keys: usize,
    /// Map entries (eBPF) or elements (nftables) written and deleted by its applies.
    pub written: usize,
    pub deleted: usize,
    /// Inside the daemon, from the request to its answer.
    pub micros: u64,
}

/// Every reply the daemon sends on success; the JSON is the inner value's.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Done(Done),
    State(DesiredState),
    Networks(Vec<NetworkSummary>),
    Services(Vec<ServiceEntry>),
    Elements(Vec<ElementEntry>),
    Conntrack(Vec<ConntrackEntry>),
    Status(Status),
}
