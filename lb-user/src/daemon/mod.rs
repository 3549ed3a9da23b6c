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
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{
    api::Request,
    core::{
        elements::network_elements,
        model::{DesiredState, Network},
    },
    dataplane::{
        Dataplane, STATES, SyncStats,
        ebpf::{MapSizes, TcMode},
    },
    netlink::{Netlink, in_netns},
};

mod metrics;
mod server;

pub use server::run;

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
    /// The sizes the eBPF dataplane creates a network's maps with.
    pub map_sizes: MapSizes,
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
                self.dp.check_capacity(net).context("rejected")?;
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
