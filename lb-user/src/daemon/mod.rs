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
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use hyper::StatusCode;

use crate::{
    api::{
        ApiError, BackendState, BackendStats, ConntrackEntry, Done, ElementEntry, LastSync,
        NetworkStatus, NetworkSummary, Reply, Request, ServiceEntry, Status,
    },
    core::{
        compose::ComposedNetwork,
        diff::diff,
        elements::{claims, network_elements},
        model::{DesiredState, Family, Network, PortKey, Proto, Service},
    },
    dataplane::{
        Dataplane, FlowState, SyncStats,
        ebpf::{MapSizes, OnIncompatible, TcMode},
    },
    node::{
        check,
        hold::{self, Holder},
        watch::{Changes, NetnsKey},
    },
};

mod caps;
mod metrics;
mod server;

pub use server::{metrics_addr, run};

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
    /// Pinned maps of another layout: refused, or replaced (`--replace-incompatible-maps`).
    pub on_incompatible: OnIncompatible,
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
    /// Failed applies and reconcile durations, as the metrics expose them.
    own: metrics::Own,
    /// When each network was last applied, and what that wrote.
    last_sync: BTreeMap<String, (SystemTime, SyncStats)>,
}

pub struct Daemon {
    state_dir: PathBuf,
    desired: DesiredState,
    /// Every network of `desired`, composed: once when it changes (a commit composes what it
    /// changes), then read by the capacity check, the apply, the status and the metrics.
    composed: BTreeMap<String, ComposedNetwork>,
    /// What each network's dataplane holds now: the last network value applied successfully.
    applied: BTreeMap<String, ComposedNetwork>,
    /// The last apply error of each network that is not in its desired state yet.
    errors: BTreeMap<String, String>,
    /// Networks whose node changed under them (an address, a link, the namespace): applied
    /// again by the next reconcile even though their desired state did not change.
    stale: BTreeSet<String>,
    /// `applied` changed since applied.json was last written.
    unrecorded: bool,
    dp: Box<dyn Dataplane>,
    dataplane_reason: String,
    stats: Stats,
    /// The published ports held for each applied network (`node::hold`).
    holder: Holder,
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
        let composed = (desired.networks.iter())
            .map(|n| (n.name.clone(), ComposedNetwork::new(n.clone())))
            .collect();
        let mut d = Daemon {
            state_dir: state_dir.to_path_buf(),
            desired,
            composed,
            applied: applied
                .networks
                .into_iter()
                .map(|n| (n.name.clone(), ComposedNetwork::new(n)))
                .collect(),
            errors: BTreeMap::new(),
            stale: BTreeSet::new(),
            unrecorded: true,
            dp,
            dataplane_reason,
            stats: Stats::default(),
            holder: Holder::default(),
        };
        let keep: Vec<&str> = d.desired.networks.iter().map(|n| n.name.as_str()).collect();
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
        // Every network once, even when applied.json says it is in place: after a reboot the
        // pins are gone, and after a plain restart this writes nothing.
        let names: Vec<String> = d.desired.networks.iter().map(|n| n.name.clone()).collect();
        for name in names {
            d.errors.insert(name, "not applied yet".into());
        }
        d.reconcile();
        d.record();
        Ok(d)
    }

    /// Holds `net`'s published ports as they are now (after its apply: the dataplane serves
    /// them first). A failure is `lb status`'s to show, not the apply's.
    fn hold(&mut self, net: &Network) {
        if let Err(e) = self.holder.sync(net) {
            tracing::warn!(network = %net.name, error = %format!("{e:#}"), "holding published ports");
        }
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
        // A network neither desired nor on the node (its apply failed, then it was removed)
        // has nothing left to retry.
        let moot: Vec<String> = (self.errors.keys().chain(&self.stale))
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
        let names: Vec<String> = (self.desired.networks.iter())
            .map(|n| n.name.clone())
            .collect();
        for name in names {
            let net = &self.composed[&name];
            let previous = self.applied.get(&name);
            if previous.map(|p| p.network()) == Some(net.network())
                && !self.errors.contains_key(&name)
                && !self.stale.contains(&name)
            {
                if self.holder.has_failed(&name) {
                    let net = net.clone();
                    self.hold(&net);
                }
                continue;
            }
            let net = net.clone();
            match self.dp.apply(&net, previous) {
                Ok(stats) => {
                    self.hold(&net);
                    self.errors.remove(&net.name);
                    self.stale.remove(&net.name);
                    (self.stats.last_sync).insert(net.name.clone(), (SystemTime::now(), stats));
                    self.applied.insert(net.name.clone(), net);
                    self.unrecorded = true;
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    tracing::warn!(network = %net.name, error = %msg, "apply failed; the last good dataplane stays, will retry");
                    self.stats.own.apply_failed(&net.name);
                    self.errors.insert(net.name.clone(), msg.clone());
                    failed.insert(net.name.clone(), msg);
                }
            }
        }
        (self.stats.own.reconcile).observe(start.elapsed().as_secs_f64());
        failed
    }

    /// Writes applied.json if `applied` changed since it was last written: the applied
    /// networks, serialized by reference (none is cloned). Its own copy, not a link to
    /// state.json: an operator may rewrite state.json in place while the daemon is down, and
    /// this record must still say what was applied then.
    ///
    /// The actor calls it after answering, so that a change's answer does not wait for the
    /// record (tens of milliseconds at 10,000 services). A crash before it is the crash
    /// between an apply and its record that was always possible: the next start applies the
    /// desired state over the previous record, which the dataplanes handle (aliases of VIPs
    /// no longer wanted are removed, an nftables table that is not the recorded one is
    /// declared whole).
    pub fn record(&mut self) {
        if !self.unrecorded {
            return;
        }
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
        (self.desired.networks.iter())
            .map(|n| n.netns_key().map(str::to_owned))
            .collect()
    }

    /// Namespace `ns` changed (an address or a link came or went, or the namespace itself):
    /// its networks are applied again, which re-reads the node's addresses, re-attaches and
    /// re-adds aliases where an interface was recreated, or fails with a status that says why.
    pub fn node_changed(&mut self, ns: &NetnsKey, changes: Changes) {
        let names: Vec<String> = (self.desired.networks.iter())
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
            if self.errors.contains_key(&name) {
                continue;
            }
            let Some(n) = self.composed.get(&name) else {
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
        self.stats.last_sync.remove(name);
        self.stats.own.forget(name);
    }

    /// Retries what failed (the actor calls this when idle).
    pub fn retry(&mut self) {
        if self.has_errors() {
            self.reconcile();
        }
    }

    /// Validates `new` whole and checks it against the node, saves it, then applies it; a dry
    /// run stops after the checks. The answer says which of these it got to: a refusal (400,
    /// nothing saved), a failure to save (500, nothing changed), or saved but a network it
    /// touched not applied yet (500 with `saved`: the retry applies it); and, either way,
    /// what differs from the current desired state.
    fn commit(
        &mut self,
        new: DesiredState,
        what: String,
        dry_run: bool,
    ) -> Result<Reply, ApiError> {
        let rejected = |e: anyhow::Error| ApiError::bad_request(format!("rejected: {e:#}"));
        new.validate()
            .map_err(|e| rejected(anyhow::Error::new(e)))?;
        // Every VIP lb has or had an alias for: such an address on the node is lb's own.
        let lb_vips: BTreeSet<_> = (self.desired.networks.iter())
            .chain(self.applied.values().map(|n| n.network()))
            .flat_map(|n| n.vips())
            .collect();
        // Each network the change touches is composed here, once: checked, then kept for the
        // apply and every later read.
        let mut composed = BTreeMap::new();
        for net in &new.networks {
            if self.desired.network(&net.name) != Some(net) {
                let c = ComposedNetwork::new(net.clone());
                self.dp.supports(net).map_err(rejected)?;
                self.dp.check_capacity(&c).map_err(rejected)?;
                check::check(net, self.desired.network(&net.name), lb_vips.clone())
                    .map_err(rejected)?;
                hold::check_free(
                    net,
                    self.desired.network(&net.name),
                    self.holder.held(&net.name),
                )
                .map_err(rejected)?;
                composed.insert(net.name.clone(), c);
            }
        }
        let changes = diff(&self.desired, &new);
        if dry_run {
            return Ok(Reply::Done(Done {
                done: "dry run: nothing saved or applied; the change would make".to_owned(),
                changes,
                dry_run: true,
            }));
        }
        crate::write_atomically(&self.state_dir.join(STATE), new.to_json().as_bytes())
            .context("saving the desired state (nothing was changed)")
            .map_err(|e| ApiError::internal(&e, false))?;
        // A network that was failing before this change and is not part of it keeps its own
        // error (in `lb status`, and retried); it does not make this change's answer an error.
        let touched: BTreeSet<String> = (new.networks.iter())
            .filter(|n| self.desired.network(&n.name) != Some(*n))
            .chain((self.desired.networks.iter()).filter(|n| new.network(&n.name).is_none()))
            .map(|n| n.name.clone())
            .collect();
        self.desired = new;
        (self.composed).retain(|name, _| self.desired.network(name).is_some());
        self.composed.extend(composed);
        let failed = self.reconcile();
        if let Some((network, error)) = (failed.into_iter()).find(|(n, _)| touched.contains(n)) {
            let e = anyhow::anyhow!(
                "{what}: saved, but network {network} is not applied yet (its last good dataplane stays; retrying every few seconds): {error}"
            );
            return Err(ApiError::internal(&e, true));
        }
        Ok(Reply::Done(Done {
            done: what,
            changes,
            dry_run: false,
        }))
    }

    fn network(&self, name: &str) -> Result<&Network, ApiError> {
        self.desired
            .network(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown network {name:?}")))
    }

    /// The network named, or every network, composed.
    fn selected(&self, network: &Option<String>) -> Result<Vec<ComposedNetwork>, ApiError> {
        match network {
            Some(n) => {
                self.network(n)?;
                Ok(vec![self.composed[n].clone()])
            }
            None => Ok((self.desired.networks.iter())
                .map(|n| self.composed[&n.name].clone())
                .collect()),
        }
    }

    /// Answers one API request.
    pub fn handle(&mut self, req: Request) -> Result<Reply, ApiError> {
        match req {
            Request::NetworkAdd { network } => {
                if self.desired.network(&network.name).is_some() {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        format!(
                            "network {:?} exists (remove it first, or replace the whole state with lb apply)",
                            network.name
                        ),
                    ));
                }
                if !network.services.is_empty() {
                    return Err(ApiError::bad_request(
                        "network add takes no services: add them with lb service set",
                    ));
                }
                let what = format!("network {} added", network.name);
                let mut new = self.desired.clone();
                new.networks.push(network);
                self.commit(new, what, false)
            }
            Request::NetworkRm { name } => {
                self.network(&name)?;
                let mut new = self.desired.clone();
                new.networks.retain(|n| n.name != name);
                self.commit(new, format!("network {name} removed"), false)
            }
            Request::NetworkList => Ok(Reply::Networks(
                (self.desired.networks.iter())
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
                self.network(&network)?;
                let what = format!(
                    "service {} generation {} set in {network}",
                    service.id, service.generation
                );
                let mut new = self.desired.clone();
                new.network_mut(&network)
                    .expect("checked above")
                    .upsert_service(service);
                self.commit(new, what, false)
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
                    return Err(ApiError::not_found(match &generation {
                        Some(g) => {
                            format!("network {network} has no service {id:?} generation {g:?}")
                        }
                        None => format!("network {network} has no service {id:?}"),
                    }));
                }
                self.commit(
                    new,
                    format!(
                        "{n} {} of service {id} removed from {network}",
                        if n == 1 { "generation" } else { "generations" }
                    ),
                    false,
                )
            }
            Request::ServiceList { network } => {
                let mut out = Vec::new();
                for n in self.selected(&network)? {
                    out.extend(self.service_entries(&n));
                }
                Ok(Reply::Services(out))
            }
            Request::Apply { state, dry_run } => {
                let what = match state.networks.len() {
                    1 => "the state of 1 network applied".to_owned(),
                    n => format!("the state of {n} networks applied"),
                };
                self.commit(state, what, dry_run)
            }
            Request::State => Ok(Reply::State(self.desired.clone())),
            Request::Elements { network } => Ok(Reply::Elements(
                (self.selected(&network)?.iter())
                    .flat_map(|n| {
                        (network_elements(n).into_iter()).map(|e| ElementEntry::new(&n.name, e))
                    })
                    .collect(),
            )),
            Request::Conntrack { network } => {
                let mut out = Vec::new();
                for n in self.selected(&network)? {
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
        for name in self
            .desired
            .networks
            .iter()
            .map(|n| n.name.clone())
            .collect::<Vec<_>>()
        {
            let n = self.composed[&name].clone();
            let counted = self.dp.flow_stats(&n);
            let mut warnings = self
                .dp
                .warnings(&n)
                .unwrap_or_else(|e| vec![format!("checking the node: {e:#}")]);
            warnings.extend(self.holder.warnings(&n.name));
            if let Ok(missing) = check::missing_interfaces(&n)
                && !missing.is_empty()
            {
                warnings.push(format!(
                    "interface {} does not exist (yet): served from when it appears",
                    missing.join(", ")
                ));
            }
            networks.push(NetworkStatus {
                applied: !self.errors.contains_key(&n.name),
                error: self.errors.get(&n.name).cloned(),
                attach: n.attach,
                mode: n.mode,
                path: self.dp.path(&n),
                services: n.services.len(),
                backends: (n.services.iter())
                    .flat_map(|s| s.backends.iter().map(|b| b.ip))
                    .collect::<BTreeSet<_>>()
                    .len(),
                flows: counted.as_ref().map(|c| c.by_state.iter().sum()),
                flows_by_state: counted.as_ref().map(|c| {
                    (FlowState::ALL.iter())
                        .zip(c.by_state)
                        .filter(|(s, _)| s.shown_for(&n))
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
            networks,
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

fn create_private_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting {}", dir.display()))?;
    }
    Ok(())
}
