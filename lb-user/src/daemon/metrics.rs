//! The Prometheus text exposition of every network's counters and the daemon's own.
//!
//! Contract: a scrape holds the actor (the one writer) only for what needs its state. The
//! per-service counters of a dataplane that can read them without it
//! ([`crate::dataplane::Dataplane::counts_reader`]: nftables, whose read is a listing of the table) are read by
//! the scrape's own thread, in [`Scrape::render`].
use std::fmt::Write as _;

use super::{BUCKETS, Daemon};
use crate::{
    core::model::Network,
    dataplane::{Count, CountsReader, STATES},
};

/// One scrape: what the actor read, and what is left to read off it.
pub struct Scrape {
    /// Each network's counters, read by the actor.
    counts: Vec<(String, Vec<Count>)>,
    /// Networks whose counters are read in [`Scrape::render`], and how.
    deferred: Option<(CountsReader, Vec<Network>)>,
    /// Every other family, rendered by the actor.
    rest: String,
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
        let mut out = String::from(
            "# HELP lb_packets_total Packets translated, per service (backend=\"\") and backend.\n# TYPE lb_packets_total counter\n",
        );
        let mut bytes = String::from(
            "# HELP lb_bytes_total Bytes (IP length) translated, per service and backend.\n# TYPE lb_bytes_total counter\n",
        );
        for (network, counts) in &self.counts {
            for c in counts {
                let labels = format!(
                    "network=\"{}\",service=\"{}\",backend=\"{}\"",
                    esc(network),
                    esc(&c.service),
                    c.backend.map(|b| b.to_string()).unwrap_or_default()
                );
                let _ = writeln!(out, "lb_packets_total{{{labels}}} {}", c.packets);
                let _ = writeln!(bytes, "lb_bytes_total{{{labels}}} {}", c.bytes);
            }
        }
        out.push_str(&bytes);
        out.push_str(&self.rest);
        out
    }
}

/// A label value, escaped as the text format wants it.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

impl Daemon {
    /// A scrape of every network's counters and the daemon's own; see [`Scrape::render`].
    pub fn metrics(&mut self) -> Scrape {
        let mut out = String::new();
        let reader = self.dp.counts_reader();
        let mut counts = Vec::new();
        let mut flows = Metric::new("lb_conntrack_entries", "gauge", "Live tracked flows.");
        let mut states = Metric::new("lb_flows", "gauge", "Live tracked flows by state.");
        let mut entries = Metric::new(
            "lb_flow_table_entries",
            "gauge",
            "Entries in the flow table (eBPF: both directions and masquerade pairs, expired ones not yet collected).",
        );
        let mut expiries = Metric::new(
            "lb_flow_expiries_total",
            "counter",
            "Flow entries the collector deleted after they expired.",
        );
        let mut evictions = Metric::new(
            "lb_flow_evictions_total",
            "counter",
            "Flows found to have lost entries before they expired (LRU eviction), re-created or restored by the datapath.",
        );
        let mut masq_failures = Metric::new(
            "lb_masquerade_failures_total",
            "counter",
            "New flows dropped because no masquerade port was free.",
        );
        let mut datapath = Metric::new(
            "lb_datapath_packets_total",
            "counter",
            "Program runs per hook and outcome or event reason.",
        );
        for n in self.desired.networks.clone() {
            if reader.is_none()
                && let Ok(c) = self.dp.counts(&n)
            {
                counts.push((n.name.clone(), c));
            }
            let net = format!("network=\"{}\"", esc(&n.name));
            if let Some(c) = self.dp.flow_stats(&n) {
                flows.add(&net, c.by_state.iter().sum());
                for (state, count) in STATES.iter().zip(c.by_state) {
                    if super::shows_state(&n, state) {
                        states.add(&format!("{net},state=\"{state}\""), count);
                    }
                }
                if let Some(e) = c.entries {
                    entries.add(&net, e);
                }
                if let Some(e) = c.expired_total {
                    expiries.add(&net, e);
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
                evictions.add(&net, sum(&["flow_recreated", "entry_restored"]));
                masq_failures.add(&net, sum(&["masq_failed"]));
                for (hook, reason, count) in reasons {
                    datapath.add(&format!("{net},hook=\"{hook}\",reason=\"{reason}\""), count);
                }
            }
        }
        for m in [
            flows,
            states,
            entries,
            expiries,
            evictions,
            masq_failures,
            datapath,
        ] {
            out.push_str(&m.text);
        }
        out.push_str("# HELP lb_apply_errors_total Failed applies, per network.\n# TYPE lb_apply_errors_total counter\n");
        for (n, c) in &self.stats.apply_errors {
            let _ = writeln!(out, "lb_apply_errors_total{{network=\"{}\"}} {c}", esc(n));
        }
        out.push_str("# HELP lb_reconcile_duration_seconds Time to bring every network to its desired state.\n# TYPE lb_reconcile_duration_seconds histogram\n");
        for (le, c) in BUCKETS.iter().zip(self.stats.reconcile_buckets) {
            let _ = writeln!(
                out,
                "lb_reconcile_duration_seconds_bucket{{le=\"{le}\"}} {c}"
            );
        }
        let _ = writeln!(
            out,
            "lb_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {}\nlb_reconcile_duration_seconds_sum {}\nlb_reconcile_duration_seconds_count {}",
            self.stats.reconcile_count, self.stats.reconcile_sum, self.stats.reconcile_count
        );
        Scrape {
            counts,
            deferred: reader.map(|r| (r, self.desired.networks.clone())),
            rest: out,
        }
    }
}

/// One metric family of the exposition: its HELP and TYPE lines, then its samples.
struct Metric {
    name: &'static str,
    text: String,
}

impl Metric {
    fn new(name: &'static str, kind: &str, help: &str) -> Self {
        Self {
            name,
            text: format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"),
        }
    }

    fn add(&mut self, labels: &str, value: u64) {
        let _ = writeln!(self.text, "{}{{{labels}}} {value}", self.name);
    }
}
