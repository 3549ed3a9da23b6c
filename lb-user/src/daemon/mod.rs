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
    net::{IpAddr, SocketAddr},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use hyper::StatusCode;

use crate::{
    api::{
        ApiError, BackendState, BackendStats, ChangeWork, ConntrackEntry, Done, ElementEntry,
        Event, LastSync, NetworkStatus, NetworkSummary, Reply, Request, ServiceEntry, Status,
        StoreStatus,
    },
    core::{
        compose::ComposedNetwork,
        edit::{Desired, Edit, Edited, Refusal, Touched},
        elements::{SetKey, claims, network_elements},
        model::{DesiredState, Family, Network, PortKey, Proto, Service, ServiceKey},
    },
    dataplane::{
        Dataplane, Delta, FlowState, SyncStats,
        ebpf::{MapSizes, OnIncompatible, TcMode},
    },
    node::{
        check,
        hold::{self, Holder},
        netlink,
        watch::{Changes, NetnsKey},
    },
};

mod caps;
pub mod cluster;
mod metrics;
mod server;
pub mod store;

pub use server::{REVISION, metrics_addr, run};

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

/// Changes in one commit past which the daemon gives the allocator's free pages back.
const TRIM_AFTER: usize = 10_000;

/// How often at most applied.json is written (see [`Daemon::record`]).
pub const RECORD_EVERY: Duration = Duration::from_secs(2);

/// A change of the desired state: edits (one request's, or a batch) or a whole state.
pub enum Change {
    Edits(Vec<Edit>),
    Replace(DesiredState),
}

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

    /// Applies whole every network that needs it (removed, changed in a way a partial apply
    /// does not cover, failed, or whose node changed); returns the networks whose apply
    /// failed.
    pub fn reconcile(&mut self) -> BTreeMap<String, String> {
        let start = Instant::now();
        let mut failed = BTreeMap::new();
        let gone: Vec<String> = (self.applied.keys())
            .filter(|n| self.desired.network(n).is_none())
            .cloned()
            .collect();
        // A network neither desired nor on the node (its apply failed, then it was removed)
        // has nothing left to retry.
        let moot: Vec<String> = (self.errors.keys().chain(&self.stale).chain(&self.dirty))
            .filter(|n| self.desired.network(n).is_none() && !self.applied.contains_key(*n))
            .cloned()
            .collect();
        for name in moot {
            self.forget(&name);
        }
        for name in gone {
            let net = self.applied[&name].clone();
            match self.dp.remove(&net) {
                Ok(()) => {
                    self.holder.release(&name);
                    self.applied.remove(&name);
                    self.unrecorded = true;
                    self.forget(&name);
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(network = %name, error = %msg, "remove failed; will retry");
                    self.stats.own.apply_failed(&name);
                    self.errors.insert(name.clone(), msg.clone());
                    failed.insert(name, msg);
                }
            }
        }
        let names: Vec<String> = (self.desired.networks())
            .map(|n| n.name.clone())
            .filter(|n| {
                self.dirty.contains(n) || self.errors.contains_key(n) || self.stale.contains(n)
            })
            .collect();
        let mut recovered = Vec::new();
        for name in &names {
            let net = self.desired.network(name).expect("listed above").clone();
            let previous = self.applied.get(name);
            match self.dp.apply(&net, previous) {
                Ok(stats) => {
                    hold(&mut self.holder, &net);
                    if self.errors.contains_key(name) && !self.committing.contains(name) {
                        recovered.push(name.clone());
                    }
                    self.errors.remove(name);
                    self.stale.remove(name);
                    self.dirty.remove(name);
                    (self.stats.last_sync).insert(name.clone(), (SystemTime::now(), stats));
                    self.applied.insert(name.clone(), net);
                    self.unrecorded = true;
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(network = %name, error = %msg, "apply failed; the last good dataplane stays, will retry");
                    self.stats.own.apply_failed(name);
                    self.errors.insert(name.clone(), msg.clone());
                    failed.insert(name.clone(), msg);
                }
            }
        }
        if !recovered.is_empty() {
            self.announce(&Event {
                networks: recovered,
                ..Event::of(self.store.revision(), &[], Some(true))
            });
        }
        (self.stats.own.reconcile).observe(start.elapsed().as_secs_f64());
        failed
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

    /// Namespace `ns` changed (an address or a link came or went, or the namespace itself):
    /// its networks are applied again, which re-reads the node's addresses, re-attaches and
    /// re-adds aliases where an interface was recreated, or fails with a status that says why.
    pub fn node_changed(&mut self, ns: &NetnsKey, changes: Changes) {
        let names: Vec<String> = (self.desired.networks())
            .filter(|n| n.netns_key() == ns.as_deref())
            .map(|n| n.name.clone())
            .collect();
        if names.is_empty() {
            return;
        }
        if changes.node {
            tracing::debug!(netns = ?ns, networks = ?names, "the node changed; applying again");
            self.stale.extend(names);
            self.reconcile();
            return;
        }
        // Neighbours or the ruleset: only the fast path (and DSR backends' MACs) of the
        // networks applied there. One that is not applied gets all of it at its retry.
        for name in names {
            if self.errors.contains_key(&name) || self.dirty.contains(&name) {
                continue;
            }
            let Some(n) = self.desired.network(&name) else {
                continue;
            };
            if let Err(e) = self.dp.refresh(n, changes.firewall) {
                tracing::warn!(network = %name, error = %format!("{e:#}"), "refreshing the fast path failed; applying the network again");
                self.stale.insert(name);
                self.reconcile();
            }
        }
    }

    /// Drops what is kept of network `name` once it is off the node and not desired: its
    /// failure, its pending re-apply, its last sync and its metrics series.
    fn forget(&mut self, name: &str) {
        self.errors.remove(name);
        self.stale.remove(name);
        self.dirty.remove(name);
        self.stats.last_sync.remove(name);
        self.stats.own.forget(name);
    }

    /// Retries what failed (the actor calls this when idle).
    pub fn retry(&mut self) {
        if self.has_errors() {
            self.reconcile();
        }
        // Ports that could not be held, on the retry's clock: trying them costs the
        // network's ports, which a change must not pay.
        let unheld: Vec<String> = (self.desired.networks())
            .filter(|n| self.holder.has_failed(&n.name))
            .map(|n| n.name.clone())
            .collect();
        for name in unheld {
            if let Some(net) = self.desired.network(&name) {
                hold(&mut self.holder, net);
            }
        }
    }

    /// Checks `change` (against the indexes, then the node for what it adds), saves it in
    /// one store transaction, then applies it; a dry run stops after the checks. The answer
    /// says which of these it got to: a refusal (nothing saved), a failure to save (500,
    /// nothing changed), or saved but a network it touched not applied yet (500 with
    /// `saved`: the retry applies it); and, either way, what it changes.
    pub fn commit(
        &mut self,
        change: Change,
        what: String,
        dry_run: bool,
    ) -> Result<Reply, ApiError> {
        let start = Instant::now();
        let dumps = netlink::address_dumps();
        let edited = match change {
            Change::Edits(edits) => {
                for e in &edits {
                    self.refuse_cluster_edit(e)?;
                }
                let n = edits.len();
                let mut edited = Edited::default();
                for (i, e) in edits.into_iter().enumerate() {
                    if let Err(r) = self.desired.edit(e, &mut edited) {
                        self.desired.undo(edited);
                        return Err(refused(r, (n > 1).then_some(i)));
                    }
                }
                edited
            }
            Change::Replace(state) => {
                // The API's parse validates it; a state built in process is held to the same.
                state.validate().map_err(|e| {
                    ApiError::bad_request(format!("rejected: {}", anyhow::Error::new(e)))
                })?;
                let state = self.with_cluster(state);
                self.desired.replace(state)
            }
        };
        if let Err(e) = self.check(&edited) {
            self.desired.undo(edited);
            return Err(e);
        }
        if dry_run {
            let changes = edited.changes.clone();
            self.desired.undo(edited);
            return Ok(Reply::Done(Done {
                done: "dry run: nothing saved or applied; the change would make".to_owned(),
                changes,
                dry_run: true,
                revision: None,
            }));
        }
        // The cluster's contributions that the change lets in or takes out on this node.
        let mut edited = edited;
        let released = self.cluster_follow_local(&mut edited);
        self.save_and_apply(edited, &released, Vec::new(), what, start, dumps)
    }

    /// Saves `edited` (and `cluster`'s writes) in one store transaction, then applies it; the
    /// second half of [`Daemon::commit`], which the cluster's changes share. `released`: the
    /// cluster's contributions the change took out of the desired state (they were never the
    /// store's services).
    fn save_and_apply(
        &mut self,
        edited: Edited,
        released: &BTreeSet<crate::cluster::Key>,
        cluster: Vec<store::Write>,
        what: String,
        start: Instant,
        dumps: u64,
    ) -> Result<Reply, ApiError> {
        if edited.touched.is_empty() && cluster.is_empty() {
            // Nothing to save; what is failing is tried again now, as after any change.
            self.reconcile();
            return Ok(Reply::Done(Done {
                done: what,
                changes: Vec::new(),
                dry_run: false,
                revision: Some(self.store.revision()),
            }));
        }
        let log = |revision| {
            serde_json::to_vec(&Event::of(revision, &edited.changes, None))
                .expect("an event serializes")
        };
        let local =
            |network: &str, key: &ServiceKey| !self.is_cluster_owned(network, key, released);
        let mut all = writes(&self.desired, &edited, local);
        all.extend(cluster);
        let (revision, store_keys) = match self.store.commit(&all, log) {
            Ok(r) => r,
            Err(e) => {
                self.desired.undo(edited);
                let e = e.context("saving the desired state (nothing was changed)");
                return Err(ApiError::internal(&e, false));
            }
        };
        for name in edited.touched.keys() {
            self.left.remove(name);
        }
        self.committing = edited.touched.keys().cloned().collect();
        let synced_before: BTreeMap<String, SystemTime> = (edited.touched.keys())
            .filter_map(|n| Some((n.clone(), self.stats.last_sync.get(n)?.0)))
            .collect();
        let failed = self.apply(&edited.touched);
        self.committing.clear();
        // What this change's applies wrote, partial or whole.
        let mut stats = SyncStats::default();
        for name in edited.touched.keys() {
            if let Some((at, s)) = self.stats.last_sync.get(name)
                && synced_before.get(name) != Some(at)
            {
                stats.written += s.written;
                stats.deleted += s.deleted;
            }
        }
        let applied = !failed.keys().any(|n| edited.touched.contains_key(n));
        self.announce(&Event::of(revision, &edited.changes, Some(applied)));
        self.last_change = Some(ChangeWork {
            revision,
            validated: edited.checked,
            recomposed: edited.touched.values().map(|t| t.sets.len()).sum(),
            address_dumps: netlink::address_dumps() - dumps,
            store_keys,
            written: stats.written,
            deleted: stats.deleted,
            micros: start.elapsed().as_micros() as u64,
        });
        // A network that was failing before this change and is not part of it keeps its own
        // error (in `lb status`, and retried); it does not make this change's answer an error.
        if let Some((network, error)) =
            (failed.into_iter()).find(|(n, _)| edited.touched.contains_key(n))
        {
            let e = anyhow::anyhow!(
                "{what}: saved, but network {network} is not applied yet (its last good dataplane stays; retrying every few seconds): {error}"
            );
            return Err(ApiError::internal(&e, true));
        }
        let trim = edited.changes.len() > TRIM_AFTER;
        let done = Reply::Done(Done {
            done: what,
            changes: edited.changes,
            dry_run: false,
            revision: Some(revision),
        });
        if trim {
            // A large change (a whole state applied) peaks at copies of the state that are
            // gone by now; glibc keeps their pages unless asked to give them back.
            // SAFETY: malloc_trim only releases free memory of the allocator.
            unsafe { libc::malloc_trim(0) };
        }
        Ok(done)
    }

    /// Checks the networks `edited` touched against the dataplane and the node, for what the
    /// edits added: a network added or changed whole is checked whole (its interfaces, its
    /// VIPs and published ports new to it), one whose services changed only for the VIPs,
    /// `host_ip`s and ports they added (no address dump without one).
    fn check(&mut self, edited: &Edited) -> Result<(), ApiError> {
        let rejected = |e: anyhow::Error| ApiError::bad_request(format!("rejected: {e:#}"));
        for (name, t) in &edited.touched {
            let Some(net) = self.desired.network(name) else {
                continue;
            };
            self.dp.supports(net).map_err(rejected)?;
            if t.whole {
                self.dp.check_capacity(net).map_err(rejected)?;
            } else {
                self.dp
                    .check_capacity_sets(net, &t.sets)
                    .map_err(rejected)?;
            }
            // Every VIP lb has or had an alias for but those the change adds: such an address
            // on the node is lb's own. Only needed where a dump is made.
            let lb_vips = || -> BTreeSet<IpAddr> {
                (self
                    .desired
                    .networks()
                    .flat_map(|n| n.composed().vips.keys().copied()))
                .chain(
                    self.applied
                        .values()
                        .flat_map(|n| n.composed().vips.keys().copied()),
                )
                .filter(|v| !t.new_vips.contains(v))
                .collect()
            };
            check::check_added(net, &t.new_vips, &t.new_host_ips, lb_vips).map_err(rejected)?;
            let held = self.holder.held(name);
            let new_ports: BTreeSet<PortKey> = if t.whole {
                hold::wanted(net)
            } else {
                (t.new_ports.iter())
                    .filter(|k| hold::holds(net, k))
                    .copied()
                    .collect()
            };
            hold::check_free(net, new_ports.difference(&held)).map_err(rejected)?;
        }
        Ok(())
    }

    /// Applies what `touched` changed: a network whose services alone changed, and which is
    /// applied and clean, by its dataplane's partial apply; every other one whole (by the
    /// reconcile that follows). Returns the networks that failed, and what the partial
    /// applies wrote.
    fn apply(&mut self, touched: &BTreeMap<String, Touched>) -> BTreeMap<String, String> {
        for (name, t) in touched {
            let partial = !t.whole
                && !t.removed
                && !self.dirty.contains(name)
                && !self.errors.contains_key(name)
                && !self.stale.contains(name);
            let (Some(net), Some(applied), true) =
                (self.desired.network(name), self.applied.get(name), partial)
            else {
                self.dirty.insert(name.clone());
                continue;
            };
            let delta = delta(applied, net, t);
            let ports_changed = delta.ports_changed;
            match self.dp.apply_sets(net, &delta) {
                Ok(Some(stats)) => {
                    (self.stats.last_sync).insert(name.clone(), (SystemTime::now(), stats));
                    self.unrecorded = true;
                    let applied = self.applied.get_mut(name).expect("matched above");
                    for key in &t.services {
                        match net.service(key) {
                            Some(s) => {
                                applied.upsert(s.clone());
                            }
                            None => {
                                applied.remove(key);
                            }
                        }
                    }
                    if ports_changed {
                        hold(&mut self.holder, net);
                    }
                }
                Ok(None) => {
                    self.dirty.insert(name.clone());
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(network = %name, error = %msg, "a partial apply failed; the network is applied whole");
                    self.dirty.insert(name.clone());
                }
            }
        }
        self.reconcile()
    }

    fn network(&self, name: &str) -> Result<&ComposedNetwork, ApiError> {
        self.desired
            .network(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown network {name:?}")))
    }

    /// The network named, or every network.
    fn selected(&self, network: &Option<String>) -> Result<Vec<&ComposedNetwork>, ApiError> {
        match network {
            Some(n) => Ok(vec![self.network(n)?]),
            None => Ok(self.desired.networks().collect()),
        }
    }

    /// Answers one API request.
    pub fn handle(&mut self, req: Request) -> Result<Reply, ApiError> {
        match req {
            Request::NetworkAdd { network } => {
                let what = format!("network {} added", network.name);
                self.commit(
                    Change::Edits(vec![Edit::NetworkAdd { network }]),
                    what,
                    false,
                )
            }
            Request::NetworkRm { name } => {
                let what = format!("network {name} removed");
                self.commit(
                    Change::Edits(vec![Edit::NetworkRm { network: name }]),
                    what,
                    false,
                )
            }
            Request::NetworkList => Ok(Reply::Networks(
                (self.desired.networks())
                    .map(|n| NetworkSummary {
                        name: n.name.clone(),
                        interfaces: n.interfaces.clone(),
                        netns: n.netns.clone(),
                        mode: n.mode,
                        attach: n.attach,
                        masquerade: n.masquerade,
                        services: n.services.len(),
                    })
                    .collect(),
            )),
            Request::ServiceSet { network, service } => {
                let what = format!(
                    "service {} generation {} set in {network}",
                    service.id, service.generation
                );
                self.commit(
                    Change::Edits(vec![Edit::ServiceSet { network, service }]),
                    what,
                    false,
                )
            }
            Request::ServiceRm {
                network,
                id,
                generation,
            } => {
                let what = match &generation {
                    Some(g) => format!("service {id} generation {g} removed from {network}"),
                    None => format!("service {id} removed from {network}"),
                };
                let edit = Edit::ServiceRm {
                    network,
                    service: id,
                    generation,
                };
                self.commit(Change::Edits(vec![edit]), what, false)
            }
            Request::Changes { changes, dry_run } => {
                let what = match changes.as_slice() {
                    [one] => describe(one),
                    many => format!("{} changes applied as one", many.len()),
                };
                self.commit(Change::Edits(changes), what, dry_run)
            }
            Request::ServiceList { network } => {
                let selected: Vec<ComposedNetwork> =
                    self.selected(&network)?.into_iter().cloned().collect();
                let mut out = Vec::new();
                for n in selected {
                    out.extend(self.service_entries(&n));
                }
                Ok(Reply::Services(out))
            }
            Request::Apply { state, dry_run } => {
                let what = match state.networks.len() {
                    1 => "the state of 1 network applied".to_owned(),
                    n => format!("the state of {n} networks applied"),
                };
                self.commit(Change::Replace(state), what, dry_run)
            }
            Request::State => Ok(Reply::State(self.local_state())),
            // The server takes watches to the actor itself (they stream).
            Request::ClusterChange { .. } => Err(ApiError::bad_request(
                "a cluster change goes to etcd; see POST /v1/cluster/changes",
            )),
            Request::Watch { .. } => {
                Err(ApiError::bad_request("a watch streams; see GET /v1/watch"))
            }
            Request::Elements { network } => Ok(Reply::Elements(
                (self.selected(&network)?.into_iter())
                    .flat_map(|n| {
                        (network_elements(n).into_iter()).map(|e| ElementEntry::new(&n.name, e))
                    })
                    .collect(),
            )),
            Request::Conntrack { network } => {
                let selected: Vec<ComposedNetwork> =
                    self.selected(&network)?.into_iter().cloned().collect();
                let mut out = Vec::new();
                for n in selected {
                    let flows = (self.dp.flows(&n))
                        .with_context(|| format!("network {}: reading its flows", n.name))
                        .map_err(|e| ApiError::internal(&e, false))?;
                    out.extend(flows.into_iter().map(|mut flow| {
                        flow.service =
                            frontend_owner(&n, flow.proto, flow.frontend).map(|s| s.id.clone());
                        ConntrackEntry {
                            network: n.name.clone(),
                            flow,
                        }
                    }));
                }
                Ok(Reply::Conntrack(out))
            }
            Request::Status => Ok(Reply::Status(self.status())),
        }
    }

    fn status(&mut self) -> Status {
        let mut networks = Vec::new();
        let names: Vec<String> = self.desired.networks().map(|n| n.name.clone()).collect();
        for name in names {
            let n = self.desired.network(&name).expect("listed above");
            let counted = self.dp.flow_stats(n);
            let mut warnings = self
                .dp
                .warnings(n)
                .unwrap_or_else(|e| vec![format!("checking the node: {e:#}")]);
            warnings.extend(self.holder.warnings(&n.name));
            if let Ok(missing) = check::missing_interfaces(n)
                && !missing.is_empty()
            {
                warnings.push(format!(
                    "interface {} does not exist (yet): served from when it appears",
                    missing.join(", ")
                ));
            }
            let path = self.dp.path(n);
            let n = self.desired.network(&name).expect("listed above");
            networks.push(NetworkStatus {
                applied: !self.errors.contains_key(&n.name) && !self.dirty.contains(&n.name),
                error: self.errors.get(&n.name).cloned(),
                attach: n.attach,
                mode: n.mode,
                path,
                services: n.services.len(),
                backends: n.backend_addrs().count(),
                flows: counted.as_ref().map(|c| c.by_state.iter().sum()),
                flows_by_state: counted.as_ref().map(|c| {
                    (FlowState::ALL.iter())
                        .zip(c.by_state)
                        .filter(|(s, _)| s.shown_for(n))
                        .map(|(s, n)| (*s, n))
                        .collect()
                }),
                flow_entries: counted.as_ref().and_then(|c| c.entries),
                warnings,
                last_sync: self.stats.last_sync.get(&n.name).map(|(at, s)| LastSync {
                    at_unix: (at.duration_since(SystemTime::UNIX_EPOCH)).map_or(0, |d| d.as_secs()),
                    ago_secs: at.elapsed().map_or(0, |d| d.as_secs()),
                    written: s.written,
                    deleted: s.deleted,
                    flows_flushed: s.flows_flushed,
                }),
                name: n.name.clone(),
                interfaces: n.interfaces.clone(),
            });
        }
        Status {
            dataplane: self.dp.kind().to_string(),
            reason: self.dataplane_reason.clone(),
            store: Some(StoreStatus {
                path: self.store.path().display().to_string(),
                revision: self.store.revision(),
                bytes: self.store.bytes(),
            }),
            left: self.left.iter().cloned().collect(),
            last_change: self.last_change,
            cluster: self.cluster_status(),
            networks,
        }
    }
}

/// The store writes of `edited`: what each network it touched is now.
fn writes<'a>(
    desired: &'a Desired,
    edited: &'a Edited,
    local: impl Fn(&str, &ServiceKey) -> bool,
) -> Vec<store::Write<'a>> {
    let mut out = Vec::new();
    for (name, t) in &edited.touched {
        let Some(net) = desired.network(name) else {
            out.push(store::Write::NetworkGone(name));
            continue;
        };
        if t.whole {
            out.push(store::Write::Network {
                settings: net.network(),
                fresh: t.rewritten,
            });
        }
        if t.rewritten {
            // In the network's order, each in a new place.
            for s in net.services.iter().filter(|s| local(name, &s.key())) {
                out.push(store::Write::Service {
                    network: name,
                    key: t
                        .services
                        .get(&s.key())
                        .expect("a rewritten network's services are touched"),
                    service: Some(s),
                    fresh: true,
                });
            }
            continue;
        }
        // New contributions take their places in the network's order.
        let mut keys: Vec<&ServiceKey> = t.services.iter().filter(|k| local(name, k)).collect();
        keys.sort_by_key(|k| net.place(k).unwrap_or(usize::MAX));
        for key in keys {
            out.push(store::Write::Service {
                network: name,
                key,
                service: net.service(key),
                fresh: false,
            });
        }
    }
    out
}

/// What changed between `applied` and `net` in the sets and contributions `t` touched, for a
/// partial apply.
fn delta<'a>(applied: &'a ComposedNetwork, net: &ComposedNetwork, t: &'a Touched) -> Delta<'a> {
    let mut new_backends = BTreeSet::new();
    let mut gone_backends = BTreeSet::new();
    for key in &t.services {
        let old = applied.service(key).into_iter().flat_map(|s| &s.backends);
        let new = net.service(key).into_iter().flat_map(|s| &s.backends);
        new_backends.extend(
            new.map(|b| b.ip)
                .filter(|ip| applied.backend_refs(*ip) == 0),
        );
        gone_backends.extend(old.map(|b| b.ip).filter(|ip| net.backend_refs(*ip) == 0));
    }
    let exists = |n: &ComposedNetwork, set: &SetKey| match set {
        SetKey::Vip(v) => n.composed().vips.contains_key(v),
        SetKey::Port(k) => n.composed().ports.contains_key(k),
    };
    let changed = |set: &SetKey| exists(applied, set) != exists(net, set);
    Delta {
        previous: applied,
        sets: &t.sets,
        new_backends,
        gone_backends,
        vips_changed: (t.sets.iter()).any(|s| matches!(s, SetKey::Vip(_)) && changed(s)),
        ports_changed: (t.sets.iter()).any(|s| matches!(s, SetKey::Port(_)) && changed(s)),
    }
}

/// A refusal of an edit as the API answers it; `at`: its place in a batch.
fn refused(r: Refusal, at: Option<usize>) -> ApiError {
    let which = at.map_or_else(String::new, |i| format!("change {i}: "));
    match r {
        Refusal::NotFound(m) => ApiError::not_found(format!("{which}{m}")),
        Refusal::Conflict(m) => ApiError::new(StatusCode::CONFLICT, format!("{which}{m}")),
        Refusal::Invalid(v) => ApiError::bad_request(format!("{which}rejected: {v}")),
    }
}

/// One edit in words, as its answer says it was done.
fn describe(edit: &Edit) -> String {
    let generation = |g: &Option<String>| {
        g.as_ref()
            .map_or_else(String::new, |g| format!(" generation {g}"))
    };
    match edit {
        Edit::NetworkAdd { network } => format!("network {} added", network.name),
        Edit::NetworkRm { network } => format!("network {network} removed"),
        Edit::NetworkSet { network, .. } => format!("network {network} set"),
        Edit::ServiceSet { network, service } => format!(
            "service {} generation {} set in {network}",
            service.id, service.generation
        ),
        Edit::ServiceRm {
            network,
            service,
            generation: g,
        } => {
            format!("service {service}{} removed from {network}", generation(g))
        }
        Edit::BackendAdd {
            network,
            service,
            generation: g,
            backend,
        } => format!(
            "backend {} added to service {service}{} in {network}",
            backend.ip,
            generation(g)
        ),
        Edit::BackendRm {
            network,
            service,
            generation: g,
            ip,
        } => {
            format!(
                "backend {ip} removed from service {service}{} in {network}",
                generation(g)
            )
        }
        Edit::BackendDisable {
            network,
            service,
            generation: g,
            ip,
        } => {
            format!(
                "backend {ip} of service {service}{} in {network} disabled",
                generation(g)
            )
        }
        Edit::BackendEnable {
            network,
            service,
            generation: g,
            ip,
        } => {
            format!(
                "backend {ip} of service {service}{} in {network} enabled",
                generation(g)
            )
        }
    }
}

impl Daemon {
    /// `network`'s contributions as `lb service list` shows them: frontends, and each
    /// backend's state, live flows and counters (read once for the network).
    fn service_entries(&mut self, network: &ComposedNetwork) -> Vec<ServiceEntry> {
        let counts = self.dp.counts(network).unwrap_or_default();
        let flows = self.dp.flows(network).ok();
        let mut out = Vec::new();
        for service in &network.services {
            let keys: Vec<String> = claims(service).map(|k| k.to_string()).collect();
            let backends = (service.backends.iter())
                .map(|b| {
                    let (mut packets, mut bytes, mut seen) = (0, 0, false);
                    for c in counts
                        .iter()
                        .filter(|c| c.backend == Some(b.ip) && keys.contains(&c.frontend))
                    {
                        (packets, bytes, seen) = (packets + c.packets, bytes + c.bytes, true);
                    }
                    let flows = flows.as_ref().map(|f| {
                        (f.iter())
                            .filter(|f| f.backend.ip() == b.ip)
                            .filter(|f| {
                                frontend_owner(network, f.proto, f.frontend)
                                    .is_some_and(|s| s.id == service.id)
                            })
                            .count() as u64
                    });
                    BackendStats {
                        address: b.ip,
                        state: if b.disabled {
                            BackendState::Disabled
                        } else {
                            BackendState::Active
                        },
                        flows,
                        packets: seen.then_some(packets),
                        bytes: seen.then_some(bytes),
                    }
                })
                .collect();
            out.push(ServiceEntry {
                network: network.name.clone(),
                service: service.clone(),
                frontends: (service.vips.iter().map(|v| v.to_string()))
                    .chain(service.ports.iter().map(|p| p.to_string()))
                    .collect(),
                backends,
            });
        }
        out
    }
}

/// The contribution of `network` that a flow to `frontend` over `proto` was sent by: the
/// one with that VIP, else the one publishing that port (on that address, or on every address
/// of its family). Generations of one service share their frontends, so any of them names the
/// service.
fn frontend_owner(network: &Network, proto: Proto, frontend: SocketAddr) -> Option<&Service> {
    let addr = frontend.ip();
    // The packet's own destination, as a key bound to it: a published key matches it where
    // one packet could match both.
    let packet = PortKey::new(Some(addr), Family::of(addr), proto, frontend.port());
    (network.services.iter())
        .find(|s| s.vips.contains(&addr))
        .or_else(|| {
            (network.services.iter()).find(|s| s.port_keys().any(|(k, _)| k.overlaps(&packet)))
        })
}

/// Holds `net`'s published ports as they are now (after its apply: the dataplane serves them
/// first). A failure is `lb status`'s to show, not the apply's.
fn hold(holder: &mut Holder, net: &Network) {
    if let Err(e) = holder.sync(net) {
        tracing::warn!(network = %net.name, error = %format!("{e:#}"), "holding published ports");
    }
}

fn create_private_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting {}", dir.display()))?;
    }
    Ok(())
}
