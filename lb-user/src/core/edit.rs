//! Changes to the desired state, one at a time ([`Edit`]) or many as one ([`Desired::edit`]
//! over a batch), each costing what it changes.
//!
//! [`Desired`] is the desired state as the daemon holds it: every network composed and
//! indexed ([`ComposedNetwork`]), in order. An edit is checked against those indexes (who
//! claims a VIP or a published port, which backends a network lists, which interfaces and
//! ports the other networks of its namespace have), never against the whole state, and
//! recomposes only the sets it touches. What it did is recorded in [`Edited`]: the changes in
//! the words of [`crate::core::diff`], which sets of which networks to write, and how to take
//! it back. A batch is all or nothing: the first refusal undoes every edit before it
//! ([`Desired::undo`]), so the state is as it was.
//!
//! The rules are [`DesiredState::validate`]'s: an edit is accepted exactly when the state it
//! leads to would pass it (`edits_are_refused_exactly_when_the_whole_state_is_invalid` holds
//! them to it).
//!
//! One file because each edit of [`Desired`] and the record that undoes it (`Undo`) are written
//! together: an undo that drifted from its edit would leave a refused batch half applied.
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    compose::ComposedNetwork,
    diff::{self, Change},
    elements::SetKey,
    model::{
        Attach, Backend, DesiredState, FastPath, HoldPorts, Masquerade, Mode, Network, PortKey,
        Service, ServiceKey,
    },
    validate::{Invalid, ValidationError},
};

/// One change. The JSON of a batch (`POST /v1/changes`) is a list of these, each an object
/// with its `op`: `{"op": "backend_disable", "network": "web", "service": "api", "ip":
/// "10.20.0.11"}`. A backend edit without `generation` is for the service's only generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    /// A new network, without services.
    NetworkAdd {
        network: Network,
    },
    NetworkRm {
        network: String,
    },
    /// Changes a network's settings; what is not given stays.
    NetworkSet {
        network: String,
        settings: Settings,
    },
    /// Adds or replaces one contribution (service id + generation).
    ServiceSet {
        network: String,
        service: Service,
    },
    /// Removes one generation of a service, or every generation without one.
    ServiceRm {
        network: String,
        service: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<String>,
    },
    BackendAdd {
        network: String,
        service: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<String>,
        backend: Backend,
    },
    /// Removes a backend: its UDP flows are flushed, its TCP connections finish.
    BackendRm {
        network: String,
        service: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<String>,
        ip: IpAddr,
    },
    /// Drains a backend: no new flows, existing ones kept.
    BackendDisable {
        network: String,
        service: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<String>,
        ip: IpAddr,
    },
    BackendEnable {
        network: String,
        service: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<String>,
        ip: IpAddr,
    },
}

impl Edit {
    /// The network the edit is in.
    pub fn network(&self) -> &str {
        match self {
            Edit::NetworkAdd { network } => &network.name,
            Edit::NetworkRm { network }
            | Edit::NetworkSet { network, .. }
            | Edit::ServiceSet { network, .. }
            | Edit::ServiceRm { network, .. }
            | Edit::BackendAdd { network, .. }
            | Edit::BackendRm { network, .. }
            | Edit::BackendDisable { network, .. }
            | Edit::BackendEnable { network, .. } => network,
        }
    }

    /// The edit in words, as its answer says it was done: the daemon's and the cluster
    /// writers' (`lb --cluster`) alike.
    pub fn describe(&self) -> String {
        let generation = |g: &Option<String>| {
            g.as_ref()
                .map_or_else(String::new, |g| format!(" generation {g}"))
        };
        match self {
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
}

/// A network's settings as `lb network set` changes them: each field given replaces the
/// network's, the others stay.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The whole list of interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<String>>,
    /// Interfaces added to the list (at its end) unless it has them: what a CNI plugin
    /// sends for the bridge it attaches, without reading the list first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_interfaces: Vec<String>,
    /// Interfaces taken out of the list if it has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_interfaces: Vec<String>,
    /// `null`: the daemon's own namespace.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "present_or_null"
    )]
    pub netns: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<Attach>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<Masquerade>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_path: Option<FastPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ports: Option<HoldPorts>,
    /// Timeouts by name (`udp`, `tcp_established`, …); `null` returns one to its default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timeouts: BTreeMap<String, Option<u32>>,
}

impl Settings {
    /// `network`'s settings with these applied (its services left out).
    pub fn applied_to(&self, network: &Network) -> Result<Network, Invalid> {
        let mut n = network.settings();
        if let Some(list) = &self.interfaces {
            n.interfaces = list.clone();
        }
        for i in &self.add_interfaces {
            if !n.interfaces.contains(i) {
                n.interfaces.push(i.clone());
            }
        }
        n.interfaces.retain(|i| !self.remove_interfaces.contains(i));
        if let Some(netns) = &self.netns {
            n.netns = netns.clone();
        }
        n.mode = self.mode.unwrap_or(n.mode);
        n.attach = self.attach.unwrap_or(n.attach);
        n.masquerade = self.masquerade.unwrap_or(n.masquerade);
        n.fast_path = self.fast_path.unwrap_or(n.fast_path);
        n.hold_ports = self.hold_ports.unwrap_or(n.hold_ports);
        for (name, secs) in &self.timeouts {
            n.timeouts.set_value(name, *secs)?;
        }
        Ok(n)
    }

    pub fn is_empty(&self) -> bool {
        *self == Settings::default()
    }
}

/// A field that is absent (`None`), `null` (`Some(None)`) or a value.
mod present_or_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Option<String>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().and_then(|v| v.as_ref()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<String>>, D::Error> {
        Option::<String>::deserialize(d).map(Some)
    }
}

/// Why an edit was refused. Nothing of it (or of its batch) was changed.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

/// What one network's edits touched, for the daemon's checks, its store and its dataplane.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// Added, or its settings changed: applied whole (settings are rare and reach every
    /// entry: the masquerade mode, the hooks, the namespace).
    pub whole: bool,
    /// Removed (possibly after being added by the same batch: then nothing to do).
    pub removed: bool,
    /// Written whole in its order: a whole state replaced it, or it was removed and added
    /// again (every contribution it has is in `services`).
    pub rewritten: bool,
    /// Sets whose composition may have changed.
    pub sets: BTreeSet<SetKey>,
    /// Contributions added, changed or removed.
    pub services: BTreeSet<ServiceKey>,
    /// VIPs, `host_ip`s and published ports that edits added: what the node checks look at.
    pub new_vips: BTreeSet<IpAddr>,
    pub new_host_ips: BTreeSet<IpAddr>,
    pub new_ports: BTreeSet<PortKey>,
}

/// What a batch of edits did: the changes, what each network's were, and the way back.
#[derive(Debug, Default)]
pub struct Edited {
    pub changes: Vec<Change>,
    pub touched: BTreeMap<String, Touched>,
    undo: Vec<Undo>,
    /// Contributions checked against the indexes (counted per change by the daemon).
    pub checked: usize,
}

impl Edited {
    /// Takes in `later`, edits of services made after this one's (the daemon checks a
    /// cluster contribution on its own before it joins the change): one change, one way back.
    pub fn absorb(&mut self, later: Edited) {
        self.changes.extend(later.changes);
        for (name, t) in later.touched {
            let mine = self.touched.entry(name).or_default();
            mine.whole |= t.whole;
            mine.rewritten |= t.rewritten;
            mine.removed &= t.removed;
            mine.sets.extend(t.sets);
            mine.services.extend(t.services);
            mine.new_vips.extend(t.new_vips);
            mine.new_host_ips.extend(t.new_host_ips);
            mine.new_ports.extend(t.new_ports);
        }
        self.undo.extend(later.undo);
        self.checked += later.checked;
    }
}

/// How to take one edit back.
#[derive(Debug)]
enum Undo {
    /// A network that was added: remove it.
    Added(String),
    /// A network that was removed, and its place.
    Removed(usize, Box<ComposedNetwork>),
    /// A network's settings before.
    Settings(Box<Network>),
    /// A contribution as it was (`None`: it did not exist), and its place in the list.
    Service(String, ServiceKey, Option<(usize, Service)>),
    /// The whole state before a replacement.
    Replaced(Vec<ComposedNetwork>),
}

/// The desired state, every network composed and indexed, in order (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct Desired {
    networks: Vec<ComposedNetwork>,
}

impl Desired {
    /// `state` (already valid: parsed and validated) composed.
    pub fn new(state: DesiredState) -> Self {
        Desired {
            networks: state
                .networks
                .into_iter()
                .map(ComposedNetwork::new)
                .collect(),
        }
    }

    pub fn network(&self, name: &str) -> Option<&ComposedNetwork> {
        self.networks.iter().find(|n| n.name == name)
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.networks.iter().position(|n| n.name == name)
    }

    pub fn networks(&self) -> impl Iterator<Item = &ComposedNetwork> + '_ {
        self.networks.iter()
    }

    /// The whole state, as `lb state` prints it (a copy: O(state), for exports only).
    pub fn to_state(&self) -> DesiredState {
        DesiredState {
            networks: self.networks.iter().map(|n| n.network().clone()).collect(),
        }
    }

    /// Replaces the whole state with `state` (valid), composing only the networks that
    /// differ; returns what changed, as [`Desired::edit`] does (every network that differs
    /// touched whole).
    pub fn replace(&mut self, state: DesiredState) -> Edited {
        let old = self.to_state();
        let changes = diff::diff(&old, &state);
        let mut edited = Edited {
            changes,
            ..Edited::default()
        };
        let mut networks = Vec::with_capacity(state.networks.len());
        for n in state.networks {
            match self.network(&n.name) {
                Some(have) if *have.network() == n => networks.push(have.clone()),
                _ => {
                    let t = edited.touched.entry(n.name.clone()).or_default();
                    t.whole = true;
                    t.rewritten = true;
                    let c = ComposedNetwork::new(n);
                    let old = self.network(&c.name);
                    t.new_vips = (c.composed().vips.keys())
                        .filter(|v| !old.is_some_and(|o| o.composed().vips.contains_key(*v)))
                        .copied()
                        .collect();
                    let old_hosts: BTreeSet<IpAddr> = old.map(host_ips).unwrap_or_default();
                    t.new_host_ips = host_ips(&c).difference(&old_hosts).copied().collect();
                    let old_ports: BTreeSet<PortKey> = old
                        .map(|o| o.composed().ports.keys().copied().collect())
                        .unwrap_or_default();
                    t.new_ports = (c.composed().ports.keys())
                        .filter(|k| !old_ports.contains(k))
                        .copied()
                        .collect();
                    t.services = c.services.iter().map(Service::key).collect();
                    if let Some(o) = old {
                        t.services.extend(o.services.iter().map(Service::key));
                    }
                    networks.push(c);
                }
            }
        }
        for n in &self.networks {
            if !networks.iter().any(|k| k.name == n.name) {
                let t = edited.touched.entry(n.name.clone()).or_default();
                t.removed = true;
            }
        }
        let old = std::mem::replace(&mut self.networks, networks);
        edited.undo.push(Undo::Replaced(old));
        edited
    }

    /// Applies `edit`, recording it in `edited`; refused, it changes nothing (the edits
    /// recorded before it stay: [`Desired::undo`] takes them back).
    pub fn edit(&mut self, edit: Edit, edited: &mut Edited) -> Result<(), Refusal> {
        match edit {
            Edit::NetworkAdd { network } => self.network_add(network, edited),
            Edit::NetworkRm { network } => {
                let i = self.existing(&network)?;
                let n = self.networks.remove(i);
                edited
                    .changes
                    .push(network_change(&n.name, diff::Op::Removed, vec![]));
                let t = edited.touched.entry(network).or_default();
                t.removed = true;
                edited.undo.push(Undo::Removed(i, Box::new(n)));
                Ok(())
            }
            Edit::NetworkSet { network, settings } => {
                let i = self.existing(&network)?;
                let old = self.networks[i].settings();
                let new = settings
                    .applied_to(&old)
                    .map_err(|reason| ValidationError {
                        path: format!("network {network:?}"),
                        reason,
                    })?;
                if new == old {
                    return Ok(());
                }
                new.validate_settings()?;
                self.check_interfaces(&new)?;
                if new.netns_key() != old.netns_key() {
                    // Every published port moves to the other namespace.
                    let n = &self.networks[i];
                    for service in &n.services {
                        self.check_ports_elsewhere(&new, service)?;
                    }
                }
                let detail = diff::settings(&old, &new);
                self.networks[i].set_settings(new);
                edited
                    .changes
                    .push(network_change(&network, diff::Op::Changed, detail));
                edited.touched.entry(network).or_default().whole = true;
                edited.undo.push(Undo::Settings(Box::new(old)));
                Ok(())
            }
            Edit::ServiceSet { network, service } => self.service_set(&network, service, edited),
            Edit::ServiceRm {
                network,
                service,
                generation,
            } => {
                let i = self.existing(&network)?;
                // In key order, as the changes of a whole-state diff are.
                let keys: BTreeSet<ServiceKey> =
                    (self.networks[i].generations(&service).into_iter())
                        .filter(|s| generation.as_ref().is_none_or(|g| *g == s.generation))
                        .map(Service::key)
                        .collect();
                if keys.is_empty() {
                    return Err(Refusal::NotFound(match &generation {
                        Some(g) => {
                            format!("network {network} has no service {service:?} generation {g:?}")
                        }
                        None => format!("network {network} has no service {service:?}"),
                    }));
                }
                for key in keys {
                    self.service_rm(i, &key, edited);
                }
                Ok(())
            }
            Edit::BackendAdd {
                network,
                service,
                generation,
                backend,
            } => {
                let mut s = self.generation(&network, &service, generation.as_deref())?;
                if s.backends.iter().any(|b| b.ip == backend.ip) {
                    return Err(Refusal::Conflict(format!(
                        "service {} generation {} in {network} has backend {} already",
                        s.id, s.generation, backend.ip
                    )));
                }
                s.backends.push(backend);
                self.service_set(&network, s, edited)
            }
            Edit::BackendRm {
                network,
                service,
                generation,
                ip,
            } => {
                let mut s = self.generation(&network, &service, generation.as_deref())?;
                let before = s.backends.len();
                s.backends.retain(|b| b.ip != ip);
                if s.backends.len() == before {
                    return Err(no_backend(&network, &s, ip));
                }
                self.service_set(&network, s, edited)
            }
            Edit::BackendDisable {
                network,
                service,
                generation,
                ip,
            } => self.backend_state(&network, &service, generation.as_deref(), ip, true, edited),
            Edit::BackendEnable {
                network,
                service,
                generation,
                ip,
            } => self.backend_state(&network, &service, generation.as_deref(), ip, false, edited),
        }
    }

    /// Disables or enables one backend of a generation (nothing to do if it is so already).
    fn backend_state(
        &mut self,
        network: &str,
        service: &str,
        generation: Option<&str>,
        ip: IpAddr,
        disabled: bool,
        edited: &mut Edited,
    ) -> Result<(), Refusal> {
        let mut s = self.generation(network, service, generation)?;
        let Some(b) = s.backends.iter_mut().find(|b| b.ip == ip) else {
            return Err(no_backend(network, &s, ip));
        };
        if b.disabled == disabled {
            return Ok(());
        }
        b.disabled = disabled;
        self.service_set(network, s, edited)
    }

    /// Takes back every edit `edited` recorded, latest first.
    pub fn undo(&mut self, edited: Edited) {
        for u in edited.undo.into_iter().rev() {
            match u {
                Undo::Added(name) => {
                    if let Some(i) = self.position(&name) {
                        self.networks.remove(i);
                    }
                }
                Undo::Replaced(networks) => self.networks = networks,
                Undo::Removed(i, n) => self.networks.insert(i, *n),
                Undo::Settings(old) => {
                    if let Some(i) = self.position(&old.name) {
                        self.networks[i].set_settings(*old);
                    }
                }
                Undo::Service(network, key, old) => {
                    let Some(i) = self.position(&network) else {
                        continue;
                    };
                    let n = &mut self.networks[i];
                    n.remove(&key);
                    if let Some((at, s)) = old {
                        n.insert_at(at, s);
                    }
                }
            }
        }
    }

    fn existing(&self, name: &str) -> Result<usize, Refusal> {
        self.position(name)
            .ok_or_else(|| Refusal::NotFound(format!("unknown network {name:?}")))
    }

    /// The generation of service `id` a backend edit is for: the one named, or the only one.
    fn generation(
        &self,
        network: &str,
        id: &str,
        generation: Option<&str>,
    ) -> Result<Service, Refusal> {
        let n = &self.networks[self.existing(network)?];
        let generations = n.generations(id);
        match (generation, generations.as_slice()) {
            (_, []) => Err(Refusal::NotFound(format!(
                "network {network} has no service {id:?}"
            ))),
            (None, [one]) => Ok((*one).clone()),
            (None, several) => Err(Refusal::Conflict(format!(
                "service {id} in {network} has generations {}: say which one (--generation)",
                (several.iter().map(|s| s.generation.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
            (Some(g), _) => (generations.iter())
                .find(|s| s.generation == g)
                .map(|s| (*s).clone())
                .ok_or_else(|| {
                    Refusal::NotFound(format!(
                        "network {network} has no service {id:?} generation {g:?}"
                    ))
                }),
        }
    }

    fn network_add(&mut self, network: Network, edited: &mut Edited) -> Result<(), Refusal> {
        if self.position(&network.name).is_some() {
            return Err(Refusal::Conflict(format!(
                "network {:?} exists (remove it first, or replace the whole state with lb apply)",
                network.name
            )));
        }
        if !network.services.is_empty() {
            return Err(Refusal::Invalid(ValidationError {
                path: format!("network {:?}", network.name),
                reason: Invalid::NetworkAddTakesNoServices,
            }));
        }
        network.validate()?;
        self.check_interfaces(&network)?;
        let name = network.name.clone();
        self.networks.push(ComposedNetwork::new(network));
        edited
            .changes
            .push(network_change(&name, diff::Op::Added, vec![]));
        let t = edited.touched.entry(name.clone()).or_default();
        // Added after a removal in the same batch: applied whole, as a new network.
        t.rewritten = t.removed;
        t.whole = true;
        t.removed = false;
        edited.undo.push(Undo::Added(name));
        Ok(())
    }

    /// Adds or replaces `service` in network `network`, checked against the indexes.
    fn service_set(
        &mut self,
        network: &str,
        service: Service,
        edited: &mut Edited,
    ) -> Result<(), Refusal> {
        let i = self.existing(network)?;
        let n = &self.networks[i];
        if n.service(&service.key()) == Some(&service) {
            return Ok(());
        }
        edited.checked += 1;
        n.check_service(&service)?;
        self.check_ports_elsewhere(n, &service)?;
        let key = service.key();
        let place = n.place(&key);
        let new_vips: BTreeSet<IpAddr> = (service.vips.iter())
            .filter(|v| !n.composed().vips.contains_key(v))
            .copied()
            .collect();
        let new_ports: BTreeSet<PortKey> = (service.port_keys().map(|(k, _)| k))
            .filter(|k| n.claimants(&SetKey::Port(*k)).next().is_none())
            .collect();
        let new_host_ips: BTreeSet<IpAddr> = new_ports.iter().filter_map(|k| k.host_ip).collect();
        let n = &mut self.networks[i];
        let (old, sets) = n.upsert(service);
        let new = n.service(&key).expect("just put");
        if let Err(e) = n.oversized(new, &sets) {
            n.remove(&key);
            if let Some(old) = old {
                n.insert_at(place.expect("it was there"), old);
            }
            return Err(e.into());
        }
        edited
            .changes
            .extend(diff::contribution(network, old.as_ref(), Some(new)));
        let t = edited.touched.entry(network.to_owned()).or_default();
        t.sets.extend(sets);
        t.services.insert(key.clone());
        t.new_vips.extend(new_vips);
        t.new_host_ips.extend(new_host_ips);
        t.new_ports.extend(new_ports);
        edited.undo.push(Undo::Service(
            network.to_owned(),
            key,
            old.map(|s| (place.expect("it was there"), s)),
        ));
        Ok(())
    }

    fn service_rm(&mut self, i: usize, key: &ServiceKey, edited: &mut Edited) {
        let n = &mut self.networks[i];
        let place = n.place(key).expect("listed by the caller");
        let (old, sets) = n.remove(key).expect("listed by the caller");
        let network = n.name.clone();
        edited
            .changes
            .extend(diff::contribution(&network, Some(&old), None));
        let t = edited.touched.entry(network.clone()).or_default();
        t.sets.extend(sets);
        t.services.insert(key.clone());
        edited
            .undo
            .push(Undo::Service(network, key.clone(), Some((place, old))));
    }

    /// Refuses an interface of `network` that another network of its namespace has.
    fn check_interfaces(&self, network: &Network) -> Result<(), Refusal> {
        let netns = network.netns_key();
        for other in
            (self.networks.iter()).filter(|o| o.name != network.name && o.netns_key() == netns)
        {
            if let Some(name) = (network.interfaces.iter()).find(|i| other.interfaces.contains(i)) {
                return Err(ValidationError {
                    path: format!("network {:?}", network.name),
                    reason: Invalid::InterfaceTaken {
                        name: name.clone(),
                        netns: in_ns(netns),
                        other: other.name.clone(),
                    },
                }
                .into());
            }
        }
        Ok(())
    }

    /// Refuses a published port of `service` (in `network`) that overlaps one another
    /// network of the same namespace publishes: the node has one port space per namespace.
    fn check_ports_elsewhere(&self, network: &Network, service: &Service) -> Result<(), Refusal> {
        let netns = network.netns_key();
        for other in
            (self.networks.iter()).filter(|o| o.name != network.name && o.netns_key() == netns)
        {
            for (key, _) in service.port_keys() {
                if let Some(other_key) = other.overlapping(&key).next() {
                    return Err(ValidationError {
                        path: format!(
                            "network {:?} service {:?} generation {:?}",
                            network.name, service.id, service.generation
                        ),
                        reason: Invalid::PortInOtherNetwork {
                            key,
                            other_key,
                            netns: in_ns(netns),
                            other: other.name.clone(),
                        },
                    }
                    .into());
                }
            }
        }
        Ok(())
    }
}

fn in_ns(netns: Option<&str>) -> String {
    netns.map_or_else(
        || "the daemon's netns".to_owned(),
        |ns| format!("netns {ns:?}"),
    )
}

fn network_change(name: &str, op: diff::Op, detail: Vec<String>) -> Change {
    Change {
        op,
        kind: diff::Kind::Network,
        network: name.to_owned(),
        service: None,
        generation: None,
        backend: None,
        detail,
    }
}

fn no_backend(network: &str, s: &Service, ip: IpAddr) -> Refusal {
    Refusal::NotFound(format!(
        "service {} generation {} in {network} has no backend {ip}",
        s.id, s.generation
    ))
}

/// Every `host_ip` the network's published ports bind to.
fn host_ips(n: &ComposedNetwork) -> BTreeSet<IpAddr> {
    (n.composed().ports.keys())
        .filter_map(|k| k.host_ip)
        .collect()
}

#[cfg(test)]
mod tests;
