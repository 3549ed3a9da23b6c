//! The daemon's share of the cluster (`lb daemon --cluster`): the cluster's contributions
//! let into the desired state beside the node's own, change by change.
//!
//! Contracts:
//! - What a node serves of the cluster is a function of the cluster's contributions (as of
//!   the revision applied) and of the node's own state, never of the order the node heard
//!   them in: contributions are let in by create revision (then key), and one that cannot
//!   be let in (a VIP or port another contribution already has, a VIP that is this node's
//!   address, a network over capacity, the id and generation of a node-local service) is
//!   refused on this node only, with the reason in `lb status` and in the node's status key.
//!   A contribution that wants what a younger cluster contribution holds takes it back: the
//!   younger one is taken out and tried again after it, as a node that re-listed would do.
//!   Between the node's own services and the cluster's, what the node has keeps it: a cluster
//!   contribution that wants what a node-local service holds is refused here (and tried again
//!   when the node's services change), a local edit that wants what a cluster one holds is
//!   refused as any conflicting edit is.
//! - Each revision of the cluster is one change of the daemon (one store transaction, one
//!   sync, one event for watchers), applied through the same checks and partial apply as a
//!   local change; the cluster's contributions are stored apart from the node's own
//!   (`store::Write::Cluster`) with the revision they are as of, so a restart serves them
//!   without etcd and resumes the watch after that revision.
//! - The node's own edits never change a cluster contribution: one that would is refused
//!   (write it with `lb --cluster …`). Networks stay the node's: adding one lets in the
//!   cluster's contributions for it, removing it takes them out (they wait, unrefused).
//! - etcd away changes nothing that is served: the follower only reports it.
//!
//! One file because its contracts hold over all of it: letting contributions in by create revision,
//! refusing one on this node, and taking one back from a younger one are one algorithm over the
//! same state of the daemon.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Instant, SystemTime},
};

use hyper::StatusCode;

use super::{Daemon, store};
use crate::{
    api::{ApiError, ClusterStatus},
    cluster::{
        Cluster, Entry, Key, NodeStatus, Refused,
        etcd::{Change, Listing},
        follow::Update,
    },
    core::{
        edit::{Edit, Edited, Refusal},
        model::{Service, ServiceKey},
    },
    node::netlink,
};

/// What each key was (accepted, refused and why) before a pass of `Daemon::admit`.
type Journal = BTreeMap<Key, (bool, Option<String>)>;

/// What this node holds of the cluster.
pub struct ClusterNode {
    pub cluster: Cluster,
    pub node: String,
    /// The cluster's contributions as of `revision` (invalid ones left out, in `invalid`).
    entries: BTreeMap<Key, Entry>,
    /// The etcd revision `entries` is as of: every change up to it is applied.
    revision: i64,
    /// The newest revision etcd told of.
    heard: i64,
    /// In the desired state.
    accepted: BTreeSet<Key>,
    /// Not let in on this node, and why.
    refused: BTreeMap<Key, String>,
    /// Keys whose value is not a contribution lb can read, and why.
    invalid: BTreeMap<String, String>,
    connected: bool,
    last_error: Option<String>,
    /// When contact was lost (or the daemon started without it).
    down_since: Option<SystemTime>,
    last_contact: Option<SystemTime>,
    status: tokio::sync::watch::Sender<NodeStatus>,
}

impl ClusterNode {
    /// A node of `cluster` named `node`, with what its store heard of the cluster last.
    pub fn new(
        cluster: Cluster,
        node: String,
        stored: (i64, BTreeMap<Key, Entry>),
    ) -> (ClusterNode, tokio::sync::watch::Receiver<NodeStatus>) {
        let (status, rx) = tokio::sync::watch::channel(NodeStatus {
            node: node.clone(),
            ..NodeStatus::default()
        });
        let (revision, entries) = stored;
        (
            ClusterNode {
                cluster,
                node,
                entries,
                revision,
                heard: revision,
                accepted: BTreeSet::new(),
                refused: BTreeMap::new(),
                invalid: BTreeMap::new(),
                connected: false,
                last_error: Some("not connected yet".to_owned()),
                down_since: Some(SystemTime::now()),
                last_contact: None,
                status,
            },
            rx,
        )
    }

    /// The revision the follower resumes after.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    fn owns(&self, network: &str, id: &str, generation: Option<&str>) -> Option<&Key> {
        let from = Key {
            network: network.to_owned(),
            service: ServiceKey {
                service_id: id.to_owned(),
                generation: generation.unwrap_or_default().to_owned(),
            },
        };
        (self.accepted.range(from..)).next().filter(|k| {
            k.network == network
                && k.service.service_id == id
                && generation.is_none_or(|g| k.service.generation == g)
        })
    }

    fn refusals(&self) -> Vec<Refused> {
        (self.refused.iter())
            .map(|(key, reason)| Refused {
                key: key.clone(),
                reason: reason.clone(),
            })
            .collect()
    }

    fn publish(&self) {
        let refused = self.refusals();
        let status = NodeStatus {
            node: self.node.clone(),
            revision: self.revision,
            lag: (self.heard - self.revision).max(0),
            refused,
            at_unix: unix(SystemTime::now()),
        };
        self.status.send_if_modified(|s| {
            let changed =
                (s.revision, s.lag, &s.refused) != (status.revision, status.lag, &status.refused);
            if changed {
                *s = status;
            }
            changed
        });
    }

    pub fn status(&self) -> ClusterStatus {
        ClusterStatus {
            endpoints: self.cluster.display(),
            prefix: self.cluster.prefix.clone(),
            node: self.node.clone(),
            connected: self.connected,
            revision: self.revision,
            lag: (self.heard - self.revision).max(0),
            services: self.accepted.len(),
            waiting: (self.entries.len()).saturating_sub(self.accepted.len() + self.refused.len()),
            refused: self.refusals(),
            invalid: self.invalid.clone(),
            last_error: self.last_error.clone(),
            down_since_unix: self.down_since.map(unix),
            last_contact_unix: self.last_contact.map(unix),
        }
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether two contributions of different services want the same thing: a VIP, overlapping
/// published ports, or one's backend is the other's VIP (what validation refuses between
/// services).
fn conflict(a: &Service, b: &Service) -> bool {
    if a.id == b.id {
        return false;
    }
    let vip_of = |s: &Service, ip| s.vips.contains(&ip);
    a.vips.iter().any(|v| b.vips.contains(v))
        || a.backends.iter().any(|x| vip_of(b, x.ip))
        || b.backends.iter().any(|x| vip_of(a, x.ip))
        || (a.port_keys()).any(|(k, _)| b.port_keys().any(|(o, _)| k.overlaps(&o)))
}

impl Daemon {
    /// Takes one update of the follower.
    pub fn cluster_update(&mut self, update: Update) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        match update {
            Update::Down(error) => {
                if c.connected || c.down_since.is_none() {
                    c.down_since = Some(SystemTime::now());
                }
                c.connected = false;
                c.last_error = Some(error);
            }
            Update::Progress { revision } => {
                c.contact();
                c.heard = c.heard.max(revision);
                // Every change up to it was sent, and applied before this.
                c.revision = c.revision.max(revision);
            }
            Update::Listing(listing) => {
                c.contact();
                self.cluster_listing(listing);
            }
            Update::Changes { revision, changes } => {
                c.contact();
                c.heard = c.heard.max(revision);
                self.cluster_changes(revision, changes);
            }
        }
        if let Some(c) = &self.cluster {
            c.publish();
        }
    }

    /// The whole prefix as of a revision: the difference to what this node had is one change.
    fn cluster_listing(&mut self, listing: Listing) {
        let c = self.cluster.as_mut().expect("called with a cluster");
        let mut now = BTreeMap::new();
        c.invalid.clear();
        for kv in &listing.kvs {
            match c.cluster.entry(kv) {
                Ok((key, entry)) => {
                    now.insert(key, entry);
                }
                Err(e) => {
                    c.invalid.insert(kv.key.clone(), format!("{e:#}"));
                }
            }
        }
        let mut changed: BTreeMap<Key, Option<Entry>> = BTreeMap::new();
        for (key, e) in &c.entries {
            if !now.contains_key(key) {
                changed.insert(key.clone(), None);
            } else if now[key] != *e {
                changed.insert(key.clone(), Some(now[key].clone()));
            }
        }
        for (key, e) in now {
            changed.entry(key).or_insert(Some(e));
        }
        c.heard = c.heard.max(listing.revision);
        self.cluster_commit(changed, listing.revision, "listing");
    }

    fn cluster_changes(&mut self, revision: i64, changes: Vec<Change>) {
        let c = self.cluster.as_mut().expect("called with a cluster");
        let mut changed = BTreeMap::new();
        for change in changes {
            match change {
                Change::Put(kv) => match c.cluster.entry(&kv) {
                    Ok((key, entry)) => {
                        c.invalid.remove(&kv.key);
                        changed.insert(key, Some(entry));
                    }
                    Err(e) => {
                        tracing::warn!(key = %kv.key, error = %format!("{e:#}"), "a cluster key lb cannot read: not served");
                        c.invalid.insert(kv.key.clone(), format!("{e:#}"));
                        if let Some(key) = c.cluster.parse_service_key(&kv.key) {
                            changed.insert(key, None);
                        }
                    }
                },
                Change::Delete { key, .. } => {
                    c.invalid.remove(&key);
                    if let Some(key) = c.cluster.parse_service_key(&key) {
                        changed.insert(key, None);
                    }
                }
            }
        }
        self.cluster_commit(changed, revision, "revision");
    }

    /// Applies the cluster's `changed` contributions (`None`: gone) as of `revision`: one
    /// store transaction, one sync, whatever this node refuses of it.
    fn cluster_commit(&mut self, changed: BTreeMap<Key, Option<Entry>>, revision: i64, what: &str) {
        let start = Instant::now();
        let dumps = netlink::address_dumps();
        let mut c = self.cluster.take().expect("called with a cluster");
        let mut queue = BTreeSet::new();
        for (key, e) in &changed {
            match e {
                Some(e) => {
                    c.entries.insert(key.clone(), e.clone());
                }
                None => {
                    c.entries.remove(key);
                }
            }
            queue.insert(key.clone());
        }
        c.revision = revision;
        self.cluster = Some(c);
        let mut edited = Edited::default();
        let released = self.admit(queue, true, &mut edited);
        let c = self.cluster.as_ref().expect("put back");
        let mut writes: Vec<store::Write> = (changed.iter())
            .map(|(key, e)| store::Write::Cluster {
                key,
                entry: e.as_ref(),
            })
            .collect();
        writes.push(store::Write::ClusterRevision(revision));
        let n = changed.len();
        let refused = c.refused.len();
        let label = format!("cluster {what} at revision {revision}");
        match self.save_and_apply(edited, &released, writes, label, start, dumps) {
            Ok(_) => {
                tracing::info!(revision, keys = n, refused, "cluster {what} applied");
            }
            Err(e) if e.status == StatusCode::INTERNAL_SERVER_ERROR && !e.reply.saved => {
                // The cluster's view and the desired state moved ahead of the store: exit, and
                // the restart serves what the store has and resumes from its revision.
                tracing::error!(revision, error = %e.reply.error, "the store could not save a cluster change; exiting (a restart resumes from the store)");
                std::process::exit(70);
            }
            Err(e) => {
                tracing::warn!(revision, error = %e.reply.error, "cluster {what} saved; not applied yet (retrying)");
            }
        }
    }

    /// Lets the cluster's contributions `keys` (gone ones are taken out) into the desired
    /// state as far as this node can, recording the edits in `edited`; with `retry`, the
    /// refused ones of the networks touched are tried again too. Returns the keys taken out
    /// of the desired state.
    ///
    /// The node is checked once for the whole change (one address dump and one pass over the
    /// VIPs, as for a local batch: a check per contribution would make a listing of 10,000
    /// quadratic); only when that fails is each contribution checked on its own, so that the
    /// one the node cannot take is refused and the others go in.
    fn admit(&mut self, keys: BTreeSet<Key>, retry: bool, edited: &mut Edited) -> BTreeSet<Key> {
        let mut pending = Edited::default();
        let mut journal = Journal::new();
        let released = self.admit_pass(&keys, retry, &mut pending, false, &mut journal);
        if pending.touched.is_empty() || self.check(&pending).is_ok() {
            edited.absorb(pending);
            return released;
        }
        self.desired.undo(pending);
        let c = self.cluster.as_mut().expect("called with a cluster");
        for (key, (accepted, refused)) in journal {
            if accepted {
                c.accepted.insert(key.clone());
            } else {
                c.accepted.remove(&key);
            }
            match refused {
                Some(r) => c.refused.insert(key, r),
                None => c.refused.remove(&key),
            };
        }
        self.admit_pass(&keys, retry, edited, true, &mut Journal::new())
    }

    /// One pass of [`Daemon::admit`]: with `node_checks`, each contribution is checked
    /// against the node as it goes in; `journal` keeps what each key was before the pass.
    fn admit_pass(
        &mut self,
        keys: &BTreeSet<Key>,
        retry: bool,
        edited: &mut Edited,
        node_checks: bool,
        journal: &mut Journal,
    ) -> BTreeSet<Key> {
        let mut c = self.cluster.take().expect("called with a cluster");
        let mut released = BTreeSet::new();
        let mut queue: BTreeSet<(i64, Key)> = BTreeSet::new();
        let networks: BTreeSet<&str> = keys.iter().map(|k| k.network.as_str()).collect();
        let mut note = |c: &ClusterNode, key: &Key| {
            if !journal.contains_key(key) {
                let before = (c.accepted.contains(key), c.refused.get(key).cloned());
                journal.insert(key.clone(), before);
            }
        };
        for key in keys {
            match c.entries.get(key) {
                Some(e) => {
                    queue.insert((e.create_revision, key.clone()));
                }
                None => {
                    note(&c, key);
                    c.refused.remove(key);
                    if c.accepted.remove(key) {
                        self.take_out(key, edited);
                        released.insert(key.clone());
                    }
                }
            }
        }
        if retry {
            for key in (c.refused.keys()).filter(|k| networks.contains(k.network.as_str())) {
                queue.insert((c.entries[key].create_revision, key.clone()));
            }
        }
        let mut evicted_for: BTreeSet<Key> = BTreeSet::new();
        while let Some((created, key)) = queue.pop_first() {
            note(&c, &key);
            let entry = c.entries[&key].clone();
            if self.desired.network(&key.network).is_none() {
                // Waits for the network.
                c.refused.remove(&key);
                continue;
            }
            let local = !c.accepted.contains(&key)
                && (self.desired.network(&key.network))
                    .is_some_and(|n| n.service(&key.service).is_some());
            if local {
                c.refused.insert(
                    key.clone(),
                    "this node has a service of its own with this id and generation".to_owned(),
                );
                continue;
            }
            match self.try_set(&key, entry.service.clone(), edited, node_checks) {
                Ok(()) => {
                    c.refused.remove(&key);
                    c.accepted.insert(key.clone());
                    released.remove(&key);
                }
                Err(reason) => {
                    // Younger cluster contributions that want the same: they give way. What
                    // they want is what they hold in the desired state now (their entry may
                    // be newer, queued after this one).
                    let younger: Vec<Key> = if evicted_for.insert(key.clone()) {
                        let net = self.desired.network(&key.network);
                        (c.accepted.iter())
                            .filter(|k| k.network == key.network && **k != key)
                            .filter(|k| {
                                let held = net.and_then(|n| n.service(&k.service));
                                (c.entries[*k].create_revision, *k) > (created, &key)
                                    && held.is_some_and(|h| conflict(&entry.service, h))
                            })
                            .cloned()
                            .collect()
                    } else {
                        Vec::new()
                    };
                    if !younger.is_empty() {
                        for y in younger {
                            note(&c, &y);
                            c.accepted.remove(&y);
                            self.take_out(&y, edited);
                            queue.insert((c.entries[&y].create_revision, y.clone()));
                            released.insert(y);
                        }
                        queue.insert((created, key));
                        continue;
                    }
                    if c.accepted.remove(&key) {
                        self.take_out(&key, edited);
                        released.insert(key.clone());
                    }
                    tracing::warn!(service = %key, reason = %reason, "a cluster service refused on this node");
                    c.refused.insert(key, reason);
                }
            }
        }
        self.cluster = Some(c);
        released
    }

    /// Sets one cluster contribution, checked as a local change would be (the indexes, then
    /// the node for what it adds); refused, nothing of it stays.
    fn try_set(
        &mut self,
        key: &Key,
        service: Service,
        edited: &mut Edited,
        node_checks: bool,
    ) -> Result<(), String> {
        let mut one = Edited::default();
        let edit = Edit::ServiceSet {
            network: key.network.clone(),
            service,
        };
        if let Err(r) = self.desired.edit(edit, &mut one) {
            return Err(match r {
                Refusal::Invalid(e) => e.reason.to_string(),
                other => other.to_string(),
            });
        }
        if node_checks && let Err(e) = self.check(&one) {
            self.desired.undo(one);
            return Err(e.reply.error.trim_start_matches("rejected: ").to_owned());
        }
        edited.absorb(one);
        Ok(())
    }

    /// Takes a cluster contribution out of the desired state.
    fn take_out(&mut self, key: &Key, edited: &mut Edited) {
        let edit = Edit::ServiceRm {
            network: key.network.clone(),
            service: key.service.service_id.clone(),
            generation: Some(key.service.generation.clone()),
        };
        if let Err(e) = self.desired.edit(edit, edited) {
            // Its network went with the same change.
            tracing::debug!(service = %key, error = %e, "taking a cluster service out");
        }
    }

    /// After a local change: the cluster's contributions of the networks it added or changed
    /// whole are let in, the refused ones of the networks it touched tried again, and those
    /// of networks it removed wait. Returns the keys taken out of the desired state.
    pub(super) fn cluster_follow_local(&mut self, edited: &mut Edited) -> BTreeSet<Key> {
        let Some(c) = self.cluster.as_mut() else {
            return BTreeSet::new();
        };
        let mut released = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for (name, t) in &edited.touched {
            let range = |set: &BTreeSet<Key>| -> Vec<Key> {
                (set.iter())
                    .filter(|k| k.network == *name)
                    .cloned()
                    .collect()
            };
            if self.desired.network(name).is_none() {
                // Removed: its cluster contributions went with it and wait for it.
                for key in range(&c.accepted) {
                    c.accepted.remove(&key);
                    released.insert(key);
                }
                c.refused.retain(|k, _| k.network != *name);
                continue;
            }
            if t.whole {
                // Added, or replaced whole (`lb apply`): every contribution of it, again.
                keys.extend((c.entries.keys()).filter(|k| k.network == *name).cloned());
                if t.rewritten {
                    for key in range(&c.accepted) {
                        c.accepted.remove(&key);
                        released.insert(key);
                    }
                }
            } else {
                keys.extend((c.refused.keys()).filter(|k| k.network == *name).cloned());
            }
        }
        if keys.is_empty() {
            return released;
        }
        let admitted = self.admit(keys, false, edited);
        released.extend(admitted);
        let c = self.cluster.as_ref().expect("put back");
        released.retain(|k| !c.accepted.contains(k));
        c.publish();
        released
    }

    /// Whether the service `key` of `network` is the cluster's here (or was, before the change
    /// being saved took it out: `released`): the store's services are the node's own.
    pub(super) fn is_cluster_owned(
        &self,
        network: &str,
        key: &ServiceKey,
        released: &BTreeSet<Key>,
    ) -> bool {
        let Some(c) = &self.cluster else {
            return false;
        };
        let key = Key {
            network: network.to_owned(),
            service: key.clone(),
        };
        c.accepted.contains(&key) || released.contains(&key)
    }

    /// Refuses a local edit of a cluster contribution.
    pub(super) fn refuse_cluster_edit(&self, edit: &Edit) -> Result<(), ApiError> {
        let Some(c) = &self.cluster else {
            return Ok(());
        };
        let (network, id, generation) = match edit {
            Edit::ServiceSet { network, service } => {
                (network, &service.id, Some(service.generation.as_str()))
            }
            Edit::ServiceRm {
                network,
                service,
                generation,
            }
            | Edit::BackendAdd {
                network,
                service,
                generation,
                ..
            }
            | Edit::BackendRm {
                network,
                service,
                generation,
                ..
            }
            | Edit::BackendDisable {
                network,
                service,
                generation,
                ..
            }
            | Edit::BackendEnable {
                network,
                service,
                generation,
                ..
            } => (network, service, generation.as_deref()),
            Edit::NetworkAdd { .. } | Edit::NetworkRm { .. } | Edit::NetworkSet { .. } => {
                return Ok(());
            }
        };
        if let Some(key) = c.owns(network, id, generation) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "service {} generation {} in {network} is the cluster's ({}): change it there (lb --cluster {} …)",
                    key.service.service_id,
                    key.service.generation,
                    c.cluster.service_key(key),
                    c.cluster.display()
                ),
            ));
        }
        Ok(())
    }

    /// The node's own state, as `lb state` exports it: the cluster's contributions left out.
    pub(super) fn local_state(&self) -> crate::core::model::DesiredState {
        let mut state = self.desired.to_state();
        if let Some(c) = &self.cluster {
            for n in &mut state.networks {
                n.services.retain(|s| {
                    !c.accepted.contains(&Key {
                        network: n.name.clone(),
                        service: s.key(),
                    })
                });
            }
        }
        state
    }

    /// `state` (the node's own, as `lb apply -f` gives it) with the cluster's contributions
    /// this node serves added to its networks, so that replacing the state neither shows nor
    /// makes a change of them; `state` as it is when they would not fit (they are let in
    /// again one by one after the replacement, and refused where they cannot be).
    pub(super) fn with_cluster(
        &self,
        state: crate::core::model::DesiredState,
    ) -> crate::core::model::DesiredState {
        let Some(c) = self.cluster.as_ref().filter(|c| !c.accepted.is_empty()) else {
            return state;
        };
        let mut merged = state.clone();
        for n in &mut merged.networks {
            let from = Key {
                network: n.name.clone(),
                service: ServiceKey {
                    service_id: String::new(),
                    generation: String::new(),
                },
            };
            for key in c.accepted.range(from..).take_while(|k| k.network == n.name) {
                if !n.services.iter().any(|s| s.key() == key.service) {
                    n.services.push(c.entries[key].service.clone());
                }
            }
        }
        if merged.validate().is_ok() {
            merged
        } else {
            state
        }
    }

    /// At start: the cluster's contributions the store has, let in before the first apply.
    pub(super) fn cluster_start(&mut self) {
        let Some(c) = &self.cluster else {
            return;
        };
        let keys: BTreeSet<Key> = c.entries.keys().cloned().collect();
        let n = keys.len();
        let revision = c.revision;
        let mut edited = Edited::default();
        self.admit(keys, false, &mut edited);
        let c = self.cluster.as_ref().expect("put back");
        if n > 0 {
            tracing::info!(
                revision,
                services = n,
                accepted = c.accepted.len(),
                refused = c.refused.len(),
                "the cluster's services as of the store, served until etcd answers"
            );
        }
        c.publish();
    }

    pub(super) fn cluster_status(&self) -> Option<Box<ClusterStatus>> {
        self.cluster.as_ref().map(|c| Box::new(c.status()))
    }
}

impl ClusterNode {
    fn contact(&mut self) {
        self.connected = true;
        self.last_error = None;
        self.down_since = None;
        self.last_contact = Some(SystemTime::now());
    }
}
