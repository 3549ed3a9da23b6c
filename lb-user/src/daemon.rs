//! `lb daemon`: the single writer of every network's dataplane.
//!
//! Contracts:
//! - Ownership: one thread (the actor) owns the desired state and the dataplane; API
//!   connections and the metrics endpoint only send it jobs. Requests are therefore applied
//!   one at a time, in arrival order, and no two writers ever touch one network's maps.
//! - Durability: a change is validated whole, then written atomically to `state.json` under
//!   the state dir, and only then applied. A crash at any point leaves either the old or the
//!   new desired state on disk, and the next start applies it.
//! - Failure: a network whose apply fails keeps its last good dataplane (the dataplane's
//!   contract), the error is logged and shown by `lb status`, and the apply is retried every
//!   [`Options::retry`] until it succeeds. `applied.json` records what was last applied to
//!   each network, so a restarted daemon knows which aliases and hooks are its own.
//! - Restart: nothing is flushed. Maps and links are pinned; the new daemon adopts them and
//!   re-applies every network, which writes only what differs (nothing, after a plain restart).
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{
    api::{self, MAX_REQUEST, Request, Response},
    dataplane::{
        Dataplane, EbpfDataplane, NftDataplane, STATES, SyncStats, ebpf::TcMode, nft, probe,
    },
    elements::network_elements,
    model::{DesiredState, Network},
    netlink::{Netlink, in_netns},
};

pub const DEFAULT_STATE_DIR: &str = "/var/lib/lb";
const STATE: &str = "state.json";
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
    pub socket: PathBuf,
    pub bpffs: PathBuf,
    pub dataplane: DataplaneChoice,
    pub tc_mode: TcMode,
    pub metrics: Option<SocketAddr>,
    /// How often failed applies are retried.
    pub retry: Duration,
    /// How often the eBPF dataplane's flow collector runs.
    pub gc: Duration,
}

/// Upper bounds (seconds) of the reconcile duration histogram.
const BUCKETS: [f64; 9] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

#[derive(Default)]
struct Stats {
    reconcile_buckets: [u64; BUCKETS.len()],
    reconcile_count: u64,
    reconcile_sum: f64,
    apply_errors: BTreeMap<String, u64>,
    last_sync: BTreeMap<String, SyncStats>,
}

pub struct Daemon {
    state_dir: PathBuf,
    desired: DesiredState,
    /// What each network's dataplane holds now: the last network value applied successfully.
    applied: BTreeMap<String, Network>,
    /// The last apply error of each network that is not in its desired state yet.
    errors: BTreeMap<String, String>,
    dp: Box<dyn Dataplane>,
    dataplane_reason: String,
    stats: Stats,
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
    /// Loads the state dir and brings every network to its desired state (adopting what is
    /// pinned, removing what is no longer configured).
    pub fn new(state_dir: &Path, dp: Box<dyn Dataplane>, dataplane_reason: String) -> Result<Self> {
        create_private_dir(state_dir)?;
        let state_path = state_dir.join(STATE);
        let desired = read_state(&state_path)
            .context("the desired state on disk is unreadable; fix or remove it to start empty")?
            .unwrap_or_default();
        let applied = match read_state(&state_dir.join(APPLIED)) {
            Ok(s) => s.unwrap_or_default(),
            Err(e) => {
                // Only alias clean-up of removed networks depends on it.
                tracing::warn!(error = %format!("{e:#}"), "ignoring an unreadable applied.json");
                DesiredState::default()
            }
        };
        let mut d = Daemon {
            state_dir: state_dir.to_path_buf(),
            desired,
            applied: applied
                .networks
                .into_iter()
                .map(|n| (n.name.clone(), n))
                .collect(),
            errors: BTreeMap::new(),
            dp,
            dataplane_reason,
            stats: Stats::default(),
        };
        let keep: Vec<&str> = d.desired.networks.iter().map(|n| n.name.as_str()).collect();
        let gone: Vec<Network> = (d.applied.values())
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
        // Every network once, even when applied.json says it is in place: after a reboot the
        // pins are gone, and after a plain restart this writes nothing.
        let names: Vec<String> = d.desired.networks.iter().map(|n| n.name.clone()).collect();
        for name in names {
            d.errors.insert(name, "not applied yet".into());
        }
        d.reconcile();
        Ok(d)
    }

    pub fn desired(&self) -> &DesiredState {
        &self.desired
    }

    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// Brings every network to its desired state; returns the networks whose apply failed.
    pub fn reconcile(&mut self) -> BTreeMap<String, String> {
        let start = Instant::now();
        let mut failed = BTreeMap::new();
        let gone: Vec<String> = (self.applied.keys())
            .filter(|n| self.desired.network(n).is_none())
            .cloned()
            .collect();
        for name in gone {
            let net = self.applied[&name].clone();
            match self.dp.remove(&net) {
                Ok(()) => {
                    self.applied.remove(&name);
                    self.errors.remove(&name);
                    self.stats.last_sync.remove(&name);
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(network = %name, error = %msg, "remove failed; will retry");
                    *self.stats.apply_errors.entry(name.clone()).or_default() += 1;
                    self.errors.insert(name.clone(), msg.clone());
                    failed.insert(name, msg);
                }
            }
        }
        for net in self.desired.networks.clone() {
            let previous = self.applied.get(&net.name);
            if previous == Some(&net) && !self.errors.contains_key(&net.name) {
                continue;
            }
            match self.dp.apply(&net, previous) {
                Ok(stats) => {
                    self.errors.remove(&net.name);
                    self.stats.last_sync.insert(net.name.clone(), stats);
                    self.applied.insert(net.name.clone(), net);
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(network = %net.name, error = %msg, "apply failed; the last good dataplane stays, will retry");
                    *self.stats.apply_errors.entry(net.name.clone()).or_default() += 1;
                    self.errors.insert(net.name.clone(), msg.clone());
                    failed.insert(net.name.clone(), msg);
                }
            }
        }
        let applied = DesiredState {
            networks: self.applied.values().cloned().collect(),
        };
        if let Err(e) =
            crate::write_atomically(&self.state_dir.join(APPLIED), applied.to_json().as_bytes())
        {
            tracing::warn!(error = %format!("{e:#}"), "recording the applied state");
        }
        let secs = start.elapsed().as_secs_f64();
        self.stats.reconcile_count += 1;
        self.stats.reconcile_sum += secs;
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.stats.reconcile_buckets[i] += 1;
            }
        }
        failed
    }

    /// Retries what failed (the actor calls this when idle).
    pub fn retry(&mut self) {
        if self.has_errors() {
            self.reconcile();
        }
    }

    /// Validates `new` whole, checks that its interfaces exist, saves it, then applies it.
    fn commit(&mut self, new: DesiredState, what: String) -> Result<Value> {
        new.validate().context("rejected")?;
        for net in &new.networks {
            if self.desired.network(&net.name) != Some(net) {
                self.dp.supports(net).context("rejected")?;
                check_interfaces(net).context("rejected")?;
            }
        }
        crate::write_atomically(&self.state_dir.join(STATE), new.to_json().as_bytes())
            .context("saving the desired state (nothing was changed)")?;
        self.desired = new;
        let failed = self.reconcile();
        if let Some((network, error)) = failed.into_iter().next() {
            bail!(
                "{what}: saved, but network {network} is not applied yet (its last good dataplane stays; retrying every few seconds): {error}"
            );
        }
        Ok(json!({ "done": what }))
    }

    fn network(&self, name: &str) -> Result<&Network> {
        self.desired
            .network(name)
            .with_context(|| format!("unknown network {name:?}"))
    }

    fn selected(&self, network: &Option<String>) -> Result<Vec<Network>> {
        match network {
            Some(n) => Ok(vec![self.network(n)?.clone()]),
            None => Ok(self.desired.networks.clone()),
        }
    }

    /// Answers one API request.
    pub fn handle(&mut self, req: Request) -> Result<Value> {
        match req {
            Request::NetworkAdd { network } => {
                if self.desired.network(&network.name).is_some() {
                    bail!(
                        "network {:?} exists (remove it first, or replace the whole state with lb apply)",
                        network.name
                    );
                }
                if !network.services.is_empty() {
                    bail!("network add takes no services: add them with lb service set");
                }
                let what = format!("network {} added", network.name);
                let mut new = self.desired.clone();
                new.networks.push(network);
                self.commit(new, what)
            }
            Request::NetworkRm { name } => {
                self.network(&name)?;
                let mut new = self.desired.clone();
                new.networks.retain(|n| n.name != name);
                self.commit(new, format!("network {name} removed"))
            }
            Request::NetworkList {} => Ok(Value::Array(
                self.desired
                    .networks
                    .iter()
                    .map(|n| {
                        json!({
                            "name": n.name, "interfaces": n.interfaces, "netns": n.netns,
                            "mode": n.mode, "attach": n.attach, "masquerade": n.masquerade,
                            "services": n.services.len(),
                        })
                    })
                    .collect(),
            )),
            Request::ServiceSet { network, service } => {
                self.network(&network)?;
                let what = format!(
                    "service {} generation {} set in {network}",
                    service.id, service.generation
                );
                let mut new = self.desired.clone();
                new.network_mut(&network)
                    .expect("checked above")
                    .upsert_service(service);
                self.commit(new, what)
            }
            Request::ServiceRm {
                network,
                id,
                generation,
            } => {
                self.network(&network)?;
                let mut new = self.desired.clone();
                let n = new
                    .network_mut(&network)
                    .expect("checked above")
                    .remove_services(&id, generation.as_deref());
                if n == 0 {
                    match &generation {
                        Some(g) => {
                            bail!("network {network} has no service {id:?} generation {g:?}")
                        }
                        None => bail!("network {network} has no service {id:?}"),
                    }
                }
                self.commit(
                    new,
                    format!("{n} contribution(s) of service {id} removed from {network}"),
                )
            }
            Request::ServiceList { network } => {
                let mut out = Vec::new();
                for n in self.selected(&network)? {
                    for s in &n.services {
                        let mut v = serde_json::to_value(s)?;
                        v["network"] = json!(n.name);
                        out.push(v);
                    }
                }
                Ok(Value::Array(out))
            }
            Request::Apply { state } => {
                let what = format!("{} network(s) applied", state.networks.len());
                self.commit(state, what)
            }
            Request::State {} => Ok(serde_json::to_value(&self.desired)?),
            Request::Elements { network } => {
                let mut out = Vec::new();
                for n in self.selected(&network)? {
                    out.extend(network_elements(&n).iter().map(|e| e.to_string()));
                }
                Ok(json!(out))
            }
            Request::Conntrack { network } => {
                let mut out = Vec::new();
                for n in self.selected(&network)? {
                    for f in self
                        .dp
                        .flows(&n)
                        .with_context(|| format!("network {}", n.name))?
                    {
                        let mut v = serde_json::to_value(&f)?;
                        v["network"] = json!(n.name);
                        out.push(v);
                    }
                }
                Ok(Value::Array(out))
            }
            Request::Status {} => self.status(),
        }
    }

    fn status(&mut self) -> Result<Value> {
        let mut networks = Vec::new();
        for n in self.desired.networks.clone() {
            let counted = self.dp.flow_stats(&n);
            let warnings = self
                .dp
                .warnings(&n)
                .unwrap_or_else(|e| vec![format!("checking the node: {e:#}")]);
            let last = self.stats.last_sync.get(&n.name);
            networks.push(json!({
                "name": n.name,
                "applied": !self.errors.contains_key(&n.name),
                "error": self.errors.get(&n.name),
                "interfaces": n.interfaces,
                "attach": n.attach,
                "mode": n.mode,
                "services": n.services.len(),
                "backends": n.services.iter().map(|s| s.backends.len()).sum::<usize>(),
                "flows": counted.as_ref().map(|c| c.by_state.iter().sum::<u64>()),
                "flows_by_state": counted.as_ref().map(|c| STATES.iter().zip(c.by_state).map(|(s, n)| (s.to_string(), n)).collect::<BTreeMap<_, _>>()),
                "flow_entries": counted.as_ref().and_then(|c| c.entries),
                "warnings": warnings,
                "last_sync": last.map(|s| json!({"written": s.written, "deleted": s.deleted, "flows_flushed": s.flows_flushed})),
            }));
        }
        Ok(json!({
            "dataplane": self.dp.name(),
            "reason": self.dataplane_reason,
            "networks": networks,
        }))
    }

    /// Prometheus text exposition of every network's counters and the daemon's own.
    pub fn metrics(&mut self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        out.push_str("# HELP lb_packets_total Packets translated, per service (backend=\"\") and backend.\n# TYPE lb_packets_total counter\n");
        let mut bytes = String::from(
            "# HELP lb_bytes_total Bytes (IP length) translated, per service and backend.\n# TYPE lb_bytes_total counter\n",
        );
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
            if let Ok(counts) = self.dp.counts(&n) {
                for c in counts {
                    let labels = format!(
                        "network=\"{}\",service=\"{}\",backend=\"{}\"",
                        esc(&n.name),
                        esc(&c.service),
                        c.backend.map(|b| b.to_string()).unwrap_or_default()
                    );
                    let _ = writeln!(out, "lb_packets_total{{{labels}}} {}", c.packets);
                    let _ = writeln!(bytes, "lb_bytes_total{{{labels}}} {}", c.bytes);
                }
            }
            let net = format!("network=\"{}\"", esc(&n.name));
            if let Some(c) = self.dp.flow_stats(&n) {
                flows.add(&net, c.by_state.iter().sum());
                for (state, count) in STATES.iter().zip(c.by_state) {
                    states.add(&format!("{net},state=\"{state}\""), count);
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
        out.push_str(&bytes);
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
        out
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
        use std::fmt::Write as _;
        let _ = writeln!(self.text, "{}{{{labels}}} {value}", self.name);
    }
}

/// Every interface of `net` exists in its namespace (and the namespace exists): a network
/// whose interface is a typo is refused instead of saved and retried forever.
fn check_interfaces(net: &Network) -> Result<()> {
    let ifaces = net.interfaces.clone();
    let name = net.name.clone();
    in_netns(net.netns.as_deref(), move || {
        let nl = Netlink::new()?;
        for i in &ifaces {
            nl.ifindex(i).with_context(|| format!("network {name}"))?;
        }
        Ok(())
    })
}

fn create_private_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting {}", dir.display()))?;
    }
    Ok(())
}

enum Job {
    Api(Request, tokio::sync::oneshot::Sender<Response>),
    Metrics(tokio::sync::oneshot::Sender<String>),
}

fn actor(mut daemon: Daemon, jobs: mpsc::Receiver<Job>, retry: Duration) {
    // Retries run on a clock of their own: a steady stream of requests (a monitor polling
    // `lb status`) must not postpone them.
    let mut next_retry = std::time::Instant::now() + retry;
    loop {
        let now = std::time::Instant::now();
        if now >= next_retry {
            daemon.retry();
            next_retry = now + retry;
        }
        match jobs.recv_timeout(next_retry.saturating_duration_since(now)) {
            Ok(Job::Api(req, reply)) => {
                let mutates = req.mutates();
                let resp = match daemon.handle(req) {
                    Ok(v) => Response::ok(v),
                    Err(e) => {
                        if mutates {
                            tracing::warn!(error = %format!("{e:#}"), "request refused or not applied");
                        }
                        Response::err(&e)
                    }
                };
                let _ = reply.send(resp);
            }
            Ok(Job::Metrics(reply)) => {
                let _ = reply.send(daemon.metrics());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Picks the dataplane: `auto` probes the kernel and falls back to nftables, saying why.
fn dataplane(opts: &Options) -> Result<(Box<dyn Dataplane>, String)> {
    let ebpf = || -> Result<Box<dyn Dataplane>> {
        let mut dp = EbpfDataplane::new(&opts.bpffs, opts.tc_mode)?;
        dp.collect_every(opts.gc)?;
        Ok(Box::new(dp))
    };
    match opts.dataplane {
        DataplaneChoice::Nftables => Ok((
            Box::new(NftDataplane),
            "forced with --dataplane nftables".into(),
        )),
        DataplaneChoice::Ebpf => Ok((ebpf()?, "forced with --dataplane ebpf".into())),
        DataplaneChoice::Auto => match probe::probe(opts.tc_mode) {
            Ok(what) => Ok((ebpf()?, format!("auto: {what}"))),
            Err(e) => {
                let reason = format!("auto: fell back to nftables: {e:#}").replace('\n', " ");
                tracing::warn!("{reason}");
                Ok((Box::new(NftDataplane), reason))
            }
        },
    }
}

/// Every network this state dir knows of (applied or desired), for retiring the dataplane
/// that is not in use: unreadable files only mean less to clean up.
fn known_networks(state_dir: &Path) -> Vec<Network> {
    let mut out: BTreeMap<String, Network> = BTreeMap::new();
    for file in [APPLIED, STATE] {
        if let Ok(Some(s)) = read_state(&state_dir.join(file)) {
            for n in s.networks {
                out.insert(n.name.clone(), n);
            }
        }
    }
    out.into_values().collect()
}

/// Removes what the other dataplane left (a restart that switched dataplanes), so that two
/// never translate the same traffic. VIP aliases stay: the dataplane in use keeps them.
fn retire_other(in_use: &str, opts: &Options, networks: &[Network]) {
    let result = if in_use == "nftables" {
        retire_ebpf(opts, networks)
    } else {
        retire_nft(networks)
    };
    if let Err(e) = result {
        tracing::warn!(error = %format!("{e:#}"), "removing the other dataplane's leftovers");
    }
}

fn retire_ebpf(opts: &Options, networks: &[Network]) -> Result<()> {
    for n in networks {
        let dir = crate::dataplane::ebpf::pin_dir(&opts.bpffs, &n.name);
        let (ifaces, tc_mode) = (n.interfaces.clone(), opts.tc_mode);
        in_netns(n.netns.as_deref(), move || {
            crate::dataplane::ebpf::detach_all(&dir, &ifaces, tc_mode)
        })
        .with_context(|| format!("network {}: detaching the eBPF programs", n.name))?;
    }
    if opts.bpffs.exists() {
        EbpfDataplane::new(&opts.bpffs, opts.tc_mode)?.remove_others(&[])?;
    }
    Ok(())
}

fn retire_nft(networks: &[Network]) -> Result<()> {
    for n in networks {
        in_netns(n.netns.as_deref(), {
            let name = n.name.clone();
            move || nft::delete_table(&name)
        })
        .with_context(|| format!("network {}: deleting its nftables table", n.name))?;
    }
    NftDataplane.remove_others(&[]).map(drop)
}

/// Binds the API socket: refuses to steal it from a live daemon, replaces a stale one, and
/// leaves it readable and writable by root only.
fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another lb daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    Ok(listener)
}

async fn serve_conn(mut stream: tokio::net::UnixStream, jobs: mpsc::Sender<Job>) {
    let resp = match handle_conn_request(&mut stream).await {
        Ok(req) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if jobs.send(Job::Api(req, tx)).is_err() {
                Response::err(&anyhow::anyhow!("the daemon is stopping"))
            } else {
                rx.await
                    .unwrap_or_else(|_| Response::err(&anyhow::anyhow!("the daemon is stopping")))
            }
        }
        Err(e) => Response::err(&e),
    };
    let body = serde_json::to_vec(&resp).expect("a response always serializes");
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
    // A refused request (too large, too slow) may still be arriving. Closing with unread
    // bytes would reset the connection and the client would lose the answer already sent,
    // so the rest is read and dropped, for a bounded time.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::copy(&mut stream, &mut tokio::io::sink()),
    )
    .await;
}

async fn handle_conn_request(stream: &mut tokio::net::UnixStream) -> Result<Request> {
    let cred = stream
        .peer_cred()
        .context("reading the client's credentials")?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if cred.uid() != 0 && cred.uid() != me {
        bail!(
            "permission denied: uid {} may not use the lb API",
            cred.uid()
        );
    }
    let mut body = Vec::new();
    let mut limited = (&mut *stream).take(MAX_REQUEST as u64 + 1);
    tokio::time::timeout(Duration::from_secs(10), limited.read_to_end(&mut body))
        .await
        .context("the request did not arrive within 10s")?
        .context("reading the request")?;
    if body.len() > MAX_REQUEST {
        bail!("request larger than {MAX_REQUEST} bytes");
    }
    api::parse_request(&body)
}

async fn serve_metrics(listener: tokio::net::TcpListener, jobs: mpsc::Sender<Job>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let jobs = jobs.clone();
        tokio::spawn(async move {
            let mut req = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut req)).await;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let body = if jobs.send(Job::Metrics(tx)).is_ok() {
                rx.await.unwrap_or_default()
            } else {
                String::new()
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

/// Runs the daemon until SIGTERM or SIGINT. The dataplane stays in place when it stops: the
/// next daemon adopts it.
pub fn run(opts: Options) -> Result<()> {
    if let Some(addr) = opts.metrics
        && !addr.ip().is_loopback()
    {
        bail!("--metrics {addr}: the metrics endpoint listens on loopback only");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let (dp, reason) = dataplane(&opts)?;
    tracing::info!(dataplane = dp.name(), reason = %reason, "dataplane selected");
    retire_other(dp.name(), &opts, &known_networks(&opts.state_dir));
    let daemon = Daemon::new(&opts.state_dir, dp, reason)?;
    let (jobs, rx) = mpsc::channel();
    let retry = opts.retry;
    let actor = std::thread::Builder::new()
        .name("lb-actor".into())
        .spawn(move || actor(daemon, rx, retry))
        .context("starting the actor")?;
    let socket = opts.socket.clone();
    rt.block_on(async {
        let listener = bind_socket(&socket)?;
        if let Some(addr) = opts.metrics {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics endpoint {addr}"))?;
            tokio::spawn(serve_metrics(l, jobs.clone()));
        }
        tracing::info!(socket = %socket.display(), "listening");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                conn = listener.accept() => {
                    if let Ok((stream, _)) = conn {
                        tokio::spawn(serve_conn(stream, jobs.clone()));
                    }
                }
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        anyhow::Ok(())
    })?;
    tracing::info!("stopping; the dataplane stays in place for the next daemon");
    let _ = std::fs::remove_file(&socket);
    drop(jobs);
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = actor.join();
    Ok(())
}
