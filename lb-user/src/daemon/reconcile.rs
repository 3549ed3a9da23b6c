//! Bringing the dataplane to the desired state: a network applied whole when it needs it
//! (changed whole, failed, or its node changed) and retried until it succeeds, or only in the
//! sets a change of services touched (see the daemon's contract "Failure" in [`super`]).
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Instant, SystemTime},
};

use super::Daemon;
use crate::{
    api::Event,
    core::{compose::ComposedNetwork, edit::Touched, elements::SetKey, model::Network},
    dataplane::Delta,
    node::{
        hold::Holder,
        watch::{Changes, NetnsKey},
    },
};

impl Daemon {
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

    /// Applies what `touched` changed: a network whose services alone changed, and which is
    /// applied and clean, by its dataplane's partial apply; every other one whole (by the
    /// reconcile that follows). Returns the networks that failed, and what the partial
    /// applies wrote.
    pub(super) fn apply(
        &mut self,
        touched: &BTreeMap<String, Touched>,
    ) -> BTreeMap<String, String> {
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

/// Holds `net`'s published ports as they are now (after its apply: the dataplane serves them
/// first). A failure is `lb status`'s to show, not the apply's.
fn hold(holder: &mut Holder, net: &Network) {
    if let Err(e) = holder.sync(net) {
        tracing::warn!(network = %net.name, error = %format!("{e:#}"), "holding published ports");
    }
}
