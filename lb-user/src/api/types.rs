//! The replies of the API, shared by the daemon (which serializes them) and the CLI (which
//! reads them as these types, never by field name).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    core::model::{Attach, DesiredState, Masquerade, Mode, Service},
    dataplane::Flow,
};

/// The reply to a change: what was done, in words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    pub done: String,
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

/// One contribution of `GET /v1/services`, with the network it is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub network: String,
    pub service: Service,
}

/// One flow of `GET /v1/conntrack`, with the network it is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackEntry {
    pub network: String,
    #[serde(flatten)]
    pub flow: Flow,
}

/// What the last successful apply of a network wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastSync {
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
    pub services: usize,
    pub backends: usize,
    /// Flows as last counted off the writer's path (`None`: not counted yet).
    pub flows: Option<u64>,
    pub flows_by_state: Option<BTreeMap<String, u64>>,
    /// Entries of the flow table, where the dataplane has one.
    pub flow_entries: Option<u64>,
    pub warnings: Vec<String>,
    pub last_sync: Option<LastSync>,
}

/// `GET /v1/status`: the dataplane in use and why, and each network's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub dataplane: String,
    pub reason: String,
    pub networks: Vec<NetworkStatus>,
}

/// Every reply the daemon sends on success; the JSON is the inner value's.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Done(Done),
    State(DesiredState),
    Networks(Vec<NetworkSummary>),
    Services(Vec<ServiceEntry>),
    Elements(Vec<String>),
    Conntrack(Vec<ConntrackEntry>),
    Status(Status),
}
