//! The Prometheus exposition of every network's counters and the daemon's own, encoded by
//! `prometheus-client` in the Prometheus text format (0.0.4, which every Prometheus and
//! `promtool check metrics` read). A counter is registered without its `_total`, which the
//! encoder appends: `lb_packets` is exposed as `lb_packets_total`.
//!
//! Contract: a scrape holds the actor (the one writer) only for what needs its state. The
//! per-service counters of a dataplane that can read them without it
//! ([`crate::dataplane::Dataplane::counts_reader`]: nftables, whose read is a listing of the table) are read by
//! the scrape's own thread, in [`Scrape::render`].
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, prometheus_text},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{BUCKETS, Daemon};
use crate::{
    core::compose::ComposedNetwork,
    dataplane::{Count, CountsReader, FlowState},
};

/// The `Content-Type` of [`Scrape::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A gauge of a count (the default gauge is an `i64`).
type Gauge64 = Gauge<u64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NetworkLabels {
    network: String,
}

impl NetworkLabels {
    fn of(network: &str) -> Self {
        Self {
            network: network.to_owned(),
        }
    }
}

/// A service's counters: `service` is its id, `frontend` what clients address (its VIP,
/// or a published port as `tcp/8080` or `tcp/8080@192.168.1.10`), `backend` empty for the
/// frontend's own total.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    network: String,
    service: String,
    frontend: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    network: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DatapathLabels {
    network: String,
    hook: String,
    reason: String,
}

/// The daemon's own series, kept across scrapes (the actor updates them as it works).
pub struct Own {
    apply_errors: Family<NetworkLabels, Counter>,
    pub reconcile: Histogram,
}

impl Default for Own {
    fn default() -> Self {
        Self {
            apply_errors: Family::default(),
            reconcile: Histogram::new(BUCKETS),
        }
    }
}

impl Own {
    /// Counts a failed apply (or removal) of `network`.
    pub fn apply_failed(&self, network: &str) {
        self.apply_errors
            .get_or_create(&NetworkLabels::of(network))
            .inc();
    }

    /// Drops `network`'s series: it is off the node and no longer desired (the daemon's
    /// `forget`), so a series left would look like a network that still exists.
    pub fn forget(&self, network: &str) {
        self.apply_errors.remove(&NetworkLabels::of(network));
    }
}

/// One scrape: what the actor read, and what is left to read off it.
pub struct Scrape {
    /// Each network's counters, read by the actor.
    counts: Vec<(String, Vec<Count>)>,
    /// Networks whose counters are read in [`Scrape::render`], and how.
    deferred: Option<(CountsReader, Vec<ComposedNetwork>)>,
    /// Every other family, filled by the actor.
    rest: Registry,
}

impl Scrape {
    /// The exposition; runs the deferred counter reads (blocking: call it off the actor).
    pub fn render(mut self) -> String {
        if let Some((read, networks)) = self.deferred.take() {
            for n in networks {
                if let Ok(c) = read(&n) {
                    self.counts.push((n.name.clone(), c));
                }
            }
        }
        let packets = Family::<ServiceLabels, Counter>::default();
        let bytes = Family::<ServiceLabels, Counter>::default();
        for (network, counts) in &self.counts {
            for c in counts {
                let labels = ServiceLabels {
                    network: network.clone(),
                    service: c.service.clone(),
                    frontend: c.frontend.clone(),
                    backend: c.backend.map(|b| b.to_string()).unwrap_or_default(),
                };
                packets.get_or_create(&labels).inc_by(c.packets);
                bytes.get_or_create(&labels).inc_by(c.bytes);
            }
        }
        let mut registry = self.rest;
        registry.register(
            "lb_packets",
            "Packets translated, per service frontend (backend=\"\") and backend",
            packets,
        );
        registry.register(
            "lb_bytes",
            "Bytes (IP length) translated, per service frontend and backend",
            bytes,
        );
        let mut out = String::new();
        prometheus_text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

impl Daemon {
    /// A scrape of every network's counters and the daemon's own; see [`Scrape::render`].
    pub fn metrics(&mut self) -> Scrape {
        let reader = self.dp.counts_reader();
        let mut counts = Vec::new();
        let flows = Family::<NetworkLabels, Gauge64>::default();
        let states = Family::<StateLabels, Gauge64>::default();
        let entries = Family::<NetworkLabels, Gauge64>::default();
        let expiries = Family::<NetworkLabels, Counter>::default();
        let evictions = Family::<NetworkLabels, Counter>::default();
        let masq_failures = Family::<NetworkLabels, Counter>::default();
        let datapath = Family::<DatapathLabels, Counter>::default();
        let networks: Vec<ComposedNetwork> = self.desired.networks().cloned().collect();
        for n in networks.iter().cloned() {
            if reader.is_none()
                && let Ok(c) = self.dp.counts(&n)
            {
                counts.push((n.name.clone(), c));
            }
            let net = NetworkLabels::of(&n.name);
            // Every network has its series from the start, 0 until an apply fails: a
            // series that appears only with its first error breaks `rate()` and alerts.
            self.stats.own.apply_errors.get_or_create(&net).inc_by(0);
            if let Some(c) = self.dp.flow_stats(&n) {
                flows.get_or_create(&net).set(c.by_state.iter().sum());
                for (state, count) in FlowState::ALL.iter().zip(c.by_state) {
                    if state.shown_for(&n) {
                        let labels = StateLabels {
                            network: n.name.clone(),
                            state: state.to_string(),
                        };
                        states.get_or_create(&labels).set(count);
                    }
                }
                if let Some(e) = c.entries {
                    entries.get_or_create(&net).set(e);
                }
                if let Some(e) = c.expired_total {
                    expiries.get_or_create(&net).inc_by(e);
                }
            }
            if let Ok(reasons) = self.dp.reasons(&n)
                && !reasons.is_empty()
            {
                let sum = |names: &[&str]| -> u64 {
                    (reasons.iter())
                        .filter(|(_, r, _)| names.contains(r))
                        .map(|(_, _, c)| c)
                        .sum()
                };
                (evictions.get_or_create(&net)).inc_by(sum(&["flow_recreated", "entry_restored"]));
                (masq_failures.get_or_create(&net)).inc_by(sum(&["masq_failed"]));
                for (hook, reason, count) in reasons {
                    let labels = DatapathLabels {
                        network: n.name.clone(),
                        hook: hook.to_string(),
                        reason: reason.to_string(),
                    };
                    datapath.get_or_create(&labels).inc_by(count);
                }
            }
        }
        let mut rest = Registry::default();
        rest.register("lb_conntrack_entries", "Live tracked flows", flows);
        rest.register("lb_flows", "Live tracked flows by state", states);
        rest.register(
            "lb_flow_table_entries",
            "Entries in the flow table (eBPF: both directions and masquerade pairs, expired ones not yet collected)",
            entries,
        );
        rest.register(
            "lb_flow_expiries",
            "Flow entries the collector deleted after they expired",
            expiries,
        );
        rest.register(
            "lb_flow_evictions",
            "Flows found to have lost entries before they expired (LRU eviction), re-created or restored by the datapath",
            evictions,
        );
        rest.register(
            "lb_masquerade_failures",
            "New flows dropped because no masquerade port was free",
            masq_failures,
        );
        rest.register(
            "lb_datapath_packets",
            "Program runs per hook and outcome or event reason",
            datapath,
        );
        rest.register(
            "lb_apply_errors",
            "Failed applies, per network",
            self.stats.own.apply_errors.clone(),
        );
        rest.register(
            "lb_reconcile_duration_seconds",
            "Time to bring every network to its desired state",
            self.stats.own.reconcile.clone(),
        );
        if let Some(c) = self.cluster_status() {
            // `--cluster` only: what this node applied of the cluster, for an alert on a
            // node that stopped following it or refuses what the others serve.
            let gauge = |v: u64| {
                let g = Gauge64::default();
                g.set(v);
                g
            };
            rest.register(
                "lb_cluster_connected",
                "1 while the daemon follows the etcd cluster, 0 while it serves its last state without it",
                gauge(u64::from(c.connected)),
            );
            rest.register(
                "lb_cluster_revision",
                "The etcd revision the cluster's services on this node are as of",
                gauge(c.revision.max(0) as u64),
            );
            rest.register(
                "lb_cluster_lag",
                "Revisions of etcd behind the newest one it told of",
                gauge(c.lag.max(0) as u64),
            );
            rest.register(
                "lb_cluster_services",
                "Cluster services served on this node",
                gauge(c.services as u64),
            );
            rest.register(
                "lb_cluster_refused",
                "Cluster services this node refuses",
                gauge(c.refused.len() as u64),
            );
        }
        Scrape {
            counts,
            deferred: reader.map(|r| (r, networks)),
            rest,
        }
    }
}
