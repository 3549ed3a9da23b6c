//! The actor's mailbox: what the HTTP endpoints ([`super::http`]) and the node and cluster
//! watchers hand the actor thread ([`super::server`]), which alone owns the `Daemon`. A job
//! that expects an answer carries the sender it is answered on.
use crate::{
    api::{ApiError, Reply, Request},
    cluster::follow,
    node::watch,
};

use super::metrics;

/// A watcher's history (JSON lines) and its subscription to what follows.
pub(super) type Watching = (
    Vec<hyper::body::Bytes>,
    tokio::sync::broadcast::Receiver<hyper::body::Bytes>,
);

pub(super) enum Job {
    /// A request, answered with the store's revision once it is done.
    Api(
        Request,
        tokio::sync::oneshot::Sender<(Result<Reply, ApiError>, u64)>,
    ),
    Metrics(tokio::sync::oneshot::Sender<metrics::Scrape>),
    /// A new watcher: its history and its subscription, taken between two changes.
    Watch(
        Option<u64>,
        tokio::sync::oneshot::Sender<Result<Watching, ApiError>>,
    ),
    /// Something in a namespace changed (from [`watch`]).
    Node(watch::NetnsKey, watch::Changes),
    /// The cluster's services changed, or contact with etcd did (from [`follow`]).
    Cluster(follow::Update),
    /// The daemon is stopping. Explicit, because the actor holds a sender of its own (the
    /// watchers report through it), so the channel never disconnects while it runs.
    Stop,
}
