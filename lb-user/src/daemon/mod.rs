//! `lb daemon`: the single writer of every network's dataplane.
//!
//! Contracts:
//! - Ownership: one thread (the actor) owns the desired state and the dataplane; API
//!   connections and the metrics endpoint only send it jobs. Requests are therefore applied
//!   one at a time, in arrival order, and no two writers ever touch one network's maps.
//! - Cost: a change costs what it changes. It is checked against indexes and composed set by
//!   set ([`crate::core::edit`]), checked against the node for what it adds only, saved as
//!   the keys it changes ([`store`]), and a change of services alone writes only the sets it
//!   touched ([`Dataplane::apply_sets`]). Settings, networks added or removed, a whole state
//!   replaced and retries apply a network whole.
//! - Durability: a change (one edit, or a batch as one) is checked, then committed to the
//!   store in one transaction, and only then applied. A crash at any point leaves either the
//!   old or the new desired state on disk, and the next start applies it.
//! - Failure: a network whose apply fails keeps its last good dataplane (the dataplane's
//!   contract), the error is logged and shown by `lb status`, and the apply is retried every
//!   [`Options::retry`] until it succeeds. `applied.json` records the settings and VIPs last
//!   applied to each network (its services as of its last whole apply: a change of services
//!   alone does not rewrite it), so a restarted daemon knows which aliases and hooks are its
//!   own.
//! - Restart: nothing is flushed. Maps and links are pinned; the new daemon adopts them and
//!   re-applies every network, which writes only what differs (nothing, after a plain restart).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use hyper::StatusCode;

use crate::{
    api::{ApiError, ChangeWork, Event},
    core::{
        compose::ComposedNetwork,
        edit::Desired,
        model::{DesiredState, Network},
    },
    dataplane::{
        Dataplane, SyncStats,
        ebpf::{MapSizes, OnIncompatible, TcMode},
    },
    node::{hold::Holder, watch::NetnsKey},
};

mod caps;
pub mod cluster;
mod commit;
mod http;
mod job;
mod metrics;
mod reconcile;
mod requests;
mod server;
mod status;
pub mod store;

pub use commit::Change;
pub use http::{REVISION, metrics_addr};
pub use server::run;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/lb";
const APPLIED: &str = "applied.json";

/// Which dataplane the daemon runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataplaneChoice {
    Auto,
    Ebpf,
    Nftables,
}

pub struct Options {
    pub state_dir: PathBuf,
    /// A state exported by `lb state`, to build a new store from (`--import`).
    pub import: Option<PathBuf>,
    pub socket: PathBuf,
    pub bpffs: PathBuf,
    pub dataplane: DataplaneChoice,
    pub tc_mode: TcMode,
    /// Pinned maps of another layout: refused, or replaced (`--replace-incompatible-maps`).
    pub on_incompatible: OnIncompatible,
    pub metrics: Option<SocketAddr>,
    /// How often failed applies are retried.
    pub retry: Duration,
    /// How often the eBPF dataplane's flow collector runs.
    pub gc: Duration,
    /// The sizes the eBPF dataplane creates a network's maps with.
    pub map_sizes: MapSizes,
    /// `--cluster`: the cluster whose services this node serves too, and the node's name.
    pub cluster: Option<(crate::cluster::Cluster, String)>,
}

/// Upper bounds (seconds) of the reconcile duration histogram.
const BUCKETS: [f64; 9] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

#[derive(Default)]
struct Stats {
    /// Failed applies and reconcile durations, as the metrics expose them.
    own: metrics::Own,
    /// When each network was last applied, and what that wrote.
    last_sync: BTreeMap<String, (SystemTime, SyncStats)>,
}

pub struct Daemon {
    state_dir: PathBuf,
    store: store::Store,
    /// The desired state: every network composed and indexed, kept up to date edit by edit
    /// and read by the checks, the apply, the status and the metrics.
    desired: Desired,
    /// What each network's dataplane holds now: the last network value applied successfully
    /// (whole, or changed by a partial apply as the desired one was).
    applied: BTreeMap<String, ComposedNetwork>,
    /// Networks to apply whole at the next reconcile: changed in a way a partial apply does
    /// not cover, or whose partial apply failed.
    dirty: BTreeSet<String>,
    /// The last apply error of each network that is not in its desired state yet.
    errors: BTreeMap<String, String>,
    /// Networks whose node changed under them (an address, a link, the namespace): applied
    /// again by the next reconcile even though their desired state did not change.
    stale: BTreeSet<String>,
    /// `applied` changed since applied.json was last written.
    unrecorded: bool,
    /// When applied.json was last written.
    recorded_at: Instant,
    /// Networks found on the node when the store was created, which it does not know: left
    /// as they are (see [`store`]).
    left: BTreeSet<String>,
    /// What the last change cost, counted.
    last_change: Option<ChangeWork>,
    dp: Box<dyn Dataplane>,
    dataplane_reason: String,
    stats: Stats,
    /// The published ports held for each applied network (`node::hold`).
    holder: Holder,
    /// Where each applied change goes out to the watchers (`GET /v1/watch`), one JSON line.
    events: tokio::sync::broadcast::Sender<hyper::body::Bytes>,
    /// The networks of the change being committed: a reconcile within it does not announce
    /// them as applied by a retry (the change's own event says it).
    committing: BTreeSet<String>,
    /// `--cluster`: what this node holds of the cluster's services.
    cluster: Option<cluster::ClusterNode>,
}

/// How many events a watcher may fall behind before its stream is ended (it watches again
/// from its last revision).
const WATCH_BACKLOG: usize = 1024;

/// How often at most applied.json is written (see [`Daemon::record`]).
pub const RECORD_EVERY: Duration = Duration::from_secs(2);

fn read_state(path: &Path) -> Result<Option<DesiredState>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            DesiredState::from_json(&text).with_context(|| format!("{}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

impl Daemon {
    /// Opens the state dir's store and brings every network to its desired state (see
    /// [`Daemon::with_store`]).
    pub fn new(state_dir: &Path, dp: Box<dyn Dataplane>, dataplane_reason: String) -> Result<Self> {
        create_private_dir(state_dir)?;
        let opened = store::Store::open(state_dir, None)?;
        Self::with_store(opened, state_dir, dp, dataplane_reason, None)
    }

    /// Brings every network of the store's state to its desired state (adopting what is
    /// pinned, removing what is no longer configured; on a store just created, leaving what
    /// it does not know).
    pub fn with_store(
        opened: store::Opened,
        state_dir: &Path,
        dp: Box<dyn Dataplane>,
        dataplane_reason: String,
        cluster: Option<cluster::ClusterNode>,
    ) -> Result<Self> {
        let store::Opened {
            store,
            state,
            origin,
        } = opened;
        let applied = match read_state(&state_dir.join(APPLIED)) {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                // Only alias clean-up of removed networks depends on it.
                tracing::warn!(error = %format!("{e:#}"), "ignoring an unreadable applied.json");
                DesiredState::default()
            }
        };
        let mut left = store.left()?;
        let mut d = Daemon {
            state_dir: state_dir.to_path_buf(),
            desired: Desired::new(state),
            applied: applied
                .networks
                .into_iter()
                .map(|n| (n.name.clone(), ComposedNetwork::new(n)))
                .collect(),
            dirty: BTreeSet::new(),
            errors: BTreeMap::new(),
            stale: BTreeSet::new(),
            unrecorded: true,
            recorded_at: Instant::now() - RECORD_EVERY,
            left: BTreeSet::new(),
            last_change: None,
            dp,
            dataplane_reason,
            stats: Stats::default(),
            holder: Holder::default(),
            events: tokio::sync::broadcast::channel(WATCH_BACKLOG).0,
            committing: BTreeSet::new(),
            cluster,
            store,
        };
        let desired: Vec<String> = d.desired.networks().map(|n| n.name.clone()).collect();
        if origin == store::Origin::Created {
            // A new store does not know what was served before it: nothing found is removed.
            let keep: Vec<&str> = desired.iter().map(String::as_str).collect();
            let mut found = d.dp.others(&keep)?;
            found.extend(d.applied.keys().filter(|n| !desired.contains(n)).cloned());
            found.sort();
            found.dedup();
            d.applied.retain(|n, _| desired.contains(n));
            if !found.is_empty() {
                tracing::warn!(networks = ?found, "a new, empty desired-state store: networks found on the node are left as they are (add or apply a network of that name to take it over)");
                d.store.leave(&found)?;
                left.extend(found);
            }
        }
        d.left = left;
        let keep: Vec<&str> = (desired.iter().chain(&d.left))
            .map(String::as_str)
            .collect();
        let gone: Vec<ComposedNetwork> = (d.applied.values())
            .filter(|n| !keep.contains(&n.name.as_str()))
            .cloned()
            .collect();
        for n in gone {
            match d.dp.remove(&n) {
                Ok(()) => {
                    d.applied.remove(&n.name);
                }
                Err(e) => {
                    tracing::warn!(network = %n.name, error = %format!("{e:#}"), "removing a network that is no longer configured")
                }
            }
        }
        let others = d.dp.remove_others(&keep)?;
        if !others.is_empty() {
            tracing::info!(networks = ?others, "removed dataplane state of unconfigured networks");
        }
        // The cluster's services as the store last heard them, with the node's own.
        d.cluster_start();
        // Every network once, even when applied.json says it is in place: after a reboot the
        // pins are gone, and after a plain restart this writes nothing.
        for name in desired {
            d.errors.insert(name.clone(), "not applied yet".into());
            d.dirty.insert(name);
        }
        d.reconcile();
        d.record_now();
        Ok(d)
    }

    /// The whole desired state (a copy, as `lb state` exports it).
    pub fn desired(&self) -> DesiredState {
        self.desired.to_state()
    }

    /// The store's revision: that of the last change saved.
    pub fn revision(&self) -> u64 {
        self.store.revision()
    }

    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// Sends `event` to the watchers.
    fn announce(&self, event: &Event) {
        let mut line = serde_json::to_vec(event).expect("an event serializes");
        line.push(b'\n');
        // No watcher is no error.
        let _ = self.events.send(line.into());
    }

    /// A new watcher's stream: the history after `from` (410 when the store no longer has
    /// all of it), then every event from now on. Taken by the actor, between changes, so
    /// that nothing is sent twice or missed between the two.
    pub fn watch(
        &self,
        from: Option<u64>,
    ) -> Result<
        (
            Vec<hyper::body::Bytes>,
            tokio::sync::broadcast::Receiver<hyper::body::Bytes>,
        ),
        ApiError,
    > {
        let rx = self.events.subscribe();
        let Some(from) = from else {
            return Ok((Vec::new(), rx));
        };
        let history = (self.store.history(from))
            .context("reading the history of changes")
            .map_err(|e| ApiError::internal(&e, false))?;
        let Some(history) = history else {
            let oldest = self.store.oldest().ok().flatten().unwrap_or(0);
            return Err(ApiError::new(
                StatusCode::GONE,
                format!(
                    "revision {from} is older than the history kept (revisions {oldest} to {}): read the state again (GET /v1/state, lb state) and watch from the revision it was read at (lb status)",
                    self.store.revision()
                ),
            ));
        };
        let lines = (history.into_iter())
            .map(|mut e| {
                e.push(b'\n');
                e.into()
            })
            .collect();
        Ok((lines, rx))
    }

    /// Writes applied.json if `applied` changed since it was last written: the applied
    /// networks, serialized by reference (none is cloned). Its own copy, not a link to the
    /// store: an operator may import another state while the daemon is down, and this
    /// record must still say what was applied then.
    ///
    /// The actor calls it after answering, so that a change's answer does not wait for the
    /// record (tens of milliseconds at 10,000 services), and at most every [`RECORD_EVERY`]
    /// (a stream of changes does not pay it per change; the actor wakes to write a pending
    /// one, and writes it as it stops). A crash before it is the crash between an apply and
    /// its record that was always possible: the next start applies the desired state over
    /// the previous record, which the dataplanes handle (aliases of VIPs no longer wanted are
    /// removed, an nftables table that is not the recorded one is declared whole).
    pub fn record(&mut self) {
        if !self.unrecorded || self.recorded_at.elapsed() < RECORD_EVERY {
            return;
        }
        self.record_now();
    }

    /// [`Daemon::record`] now, however recent the last one (the daemon is stopping).
    pub fn record_now(&mut self) {
        if !self.unrecorded {
            return;
        }
        self.recorded_at = Instant::now();
        // The shape of a DesiredState.
        #[derive(serde::Serialize)]
        struct Applied<'a> {
            networks: Vec<&'a Network>,
        }
        let applied = Applied {
            networks: self.applied.values().map(|n| n.network()).collect(),
        };
        let json = serde_json::to_string_pretty(&applied).expect("a network always serializes");
        match crate::write_atomically(&self.state_dir.join(APPLIED), json.as_bytes()) {
            Ok(()) => self.unrecorded = false,
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "recording the applied state"),
        }
    }

    /// The namespaces the desired state uses ([`crate::node::watch`] follows them).
    pub fn netns_keys(&self) -> BTreeSet<NetnsKey> {
        (self.desired.networks())
            .map(|n| n.netns_key().map(str::to_owned))
            .collect()
    }
}

impl Daemon {}

fn create_private_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting {}", dir.display()))?;
    }
    Ok(())
}
