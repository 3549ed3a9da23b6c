//! The write path: a change (edits, or a whole state) checked against the indexes and the
//! node, saved in one store transaction, then applied (see the daemon's contracts
//! "Durability" and "Cost" in [`super`]).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Instant, SystemTime},
};

use hyper::StatusCode;

use super::{Daemon, store};
use crate::{
    api::{ApiError, ChangeWork, Done, Event, Reply},
    core::{
        edit::{Desired, Edit, Edited, Refusal},
        model::{DesiredState, PortKey, ServiceKey},
    },
    dataplane::SyncStats,
    node::{check, hold, netlink},
};

/// Changes in one commit past which the daemon gives the allocator's free pages back.
const TRIM_AFTER: usize = 10_000;

/// A change of the desired state: edits (one request's, or a batch) or a whole state.
pub enum Change {
    Edits(Vec<Edit>),
    Replace(DesiredState),
}

impl Daemon {
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
    pub(super) fn save_and_apply(
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
    pub(super) fn check(&mut self, edited: &Edited) -> Result<(), ApiError> {
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

/// A refusal of an edit as the API answers it; `at`: its place in a batch.
fn refused(r: Refusal, at: Option<usize>) -> ApiError {
    let which = at.map_or_else(String::new, |i| format!("change {i}: "));
    match r {
        Refusal::NotFound(m) => ApiError::not_found(format!("{which}{m}")),
        Refusal::Conflict(m) => ApiError::new(StatusCode::CONFLICT, format!("{which}{m}")),
        Refusal::Invalid(v) => ApiError::bad_request(format!("{which}rejected: {v}")),
    }
}
