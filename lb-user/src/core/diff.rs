//! What a change does to the desired state: the networks, services (one contribution: id +
//! generation) and backends added, changed and removed, in the order a reader scans them
//! (network by network, a network's own settings before its services). Every change the API
//! accepts answers with this list, and `lb apply --dry-run` answers with it alone; the CLI
//! prints it. Computed from the two whole states, so it lists exactly what differs and nothing
//! that merely moved in a list.
use std::{collections::BTreeMap, fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

use super::model::{DesiredState, Network, Service};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Added,
    Changed,
    Removed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Network,
    Service,
    Backend,
}

/// One difference. `service`/`generation` name the contribution of a service or backend
/// change, `backend` the backend of a backend change; `detail` says, for `changed`, what
/// changed (`masquerade: auto -> always`, `ports: +tcp/8080:80`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub op: Op,
    pub kind: Kind,
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub detail: Vec<String>,
}

impl fmt::Display for Change {
    /// `+ network web`, `~ service api generation 1 in web: vip: 10.0.0.1 -> 10.0.0.2`,
    /// `- backend 10.20.0.11 of service api generation 1 in web`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = match self.op {
            Op::Added => '+',
            Op::Changed => '~',
            Op::Removed => '-',
        };
        write!(f, "{sign} ")?;
        let service = || {
            format!(
                "service {} generation {} in {}",
                self.service.as_deref().unwrap_or("?"),
                self.generation.as_deref().unwrap_or("?"),
                self.network
            )
        };
        match self.kind {
            Kind::Network => write!(f, "network {}", self.network)?,
            Kind::Service => f.write_str(&service())?,
            Kind::Backend => write!(
                f,
                "backend {} of {}",
                self.backend.map_or("?".to_owned(), |b| b.to_string()),
                service()
            )?,
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail.join("; "))?;
        }
        Ok(())
    }
}

/// Every difference from `old` to `new`.
pub fn diff(old: &DesiredState, new: &DesiredState) -> Vec<Change> {
    let old_nets: BTreeMap<&str, &Network> =
        old.networks.iter().map(|n| (n.name.as_str(), n)).collect();
    let new_nets: BTreeMap<&str, &Network> =
        new.networks.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut out = Vec::new();
    let names: std::collections::BTreeSet<&str> =
        old_nets.keys().chain(new_nets.keys()).copied().collect();
    for name in names {
        let change = |op, detail| Change {
            op,
            kind: Kind::Network,
            network: name.to_owned(),
            service: None,
            generation: None,
            backend: None,
            detail,
        };
        match (old_nets.get(name), new_nets.get(name)) {
            (None, Some(n)) => {
                out.push(change(Op::Added, vec![]));
                out.extend(services(name, &[], &n.services));
            }
            (Some(_), None) => out.push(change(Op::Removed, vec![])),
            (Some(o), Some(n)) => {
                let detail = settings(o, n);
                if !detail.is_empty() {
                    out.push(change(Op::Changed, detail));
                }
                out.extend(services(name, &o.services, &n.services));
            }
            (None, None) => unreachable!("a name of one of the two"),
        }
    }
    out
}

/// The changes of one contribution (`None`: absent before, or after).
pub fn contribution(network: &str, old: Option<&Service>, new: Option<&Service>) -> Vec<Change> {
    services(
        network,
        old.map_or(&[], std::slice::from_ref),
        new.map_or(&[], std::slice::from_ref),
    )
}

/// A network's settings that differ, `field: old -> new`, read off their JSON so that every
/// field the state file has is compared (services apart).
pub fn settings(old: &Network, new: &Network) -> Vec<String> {
    let fields = |n: &Network| -> BTreeMap<String, serde_json::Value> {
        let mut v = serde_json::to_value(n.settings()).expect("a network serializes");
        let map = std::mem::take(v.as_object_mut().expect("a network is an object"));
        map.into_iter().filter(|(k, _)| k != "services").collect()
    };
    let (o, n) = (fields(old), fields(new));
    let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
    let show = |v: Option<&serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => "-".to_owned(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    keys.into_iter()
        .filter(|k| o.get(*k) != n.get(*k))
        .map(|k| format!("{k}: {} -> {}", show(o.get(k)), show(n.get(k))))
        .collect()
}

fn services(network: &str, old: &[Service], new: &[Service]) -> Vec<Change> {
    let key = |s: &Service| (s.id.clone(), s.generation.clone());
    let old: BTreeMap<_, &Service> = old.iter().map(|s| (key(s), s)).collect();
    let new: BTreeMap<_, &Service> = new.iter().map(|s| (key(s), s)).collect();
    let keys: std::collections::BTreeSet<_> = old.keys().chain(new.keys()).cloned().collect();
    let mut out = Vec::new();
    for (id, generation) in keys {
        let change = |op, kind, backend, detail| Change {
            op,
            kind,
            network: network.to_owned(),
            service: Some(id.clone()),
            generation: Some(generation.clone()),
            backend,
            detail,
        };
        let k = (id.clone(), generation.clone());
        let (o, n) = (old.get(&k), new.get(&k));
        match (o, n) {
            (None, Some(_)) => out.push(change(Op::Added, Kind::Service, None, vec![])),
            (Some(_), None) => {
                out.push(change(Op::Removed, Kind::Service, None, vec![]));
                continue;
            }
            (Some(o), Some(n)) => {
                let mut detail = Vec::new();
                if o.vips != n.vips {
                    let show = |v: &[IpAddr]| match v {
                        [] => "-".to_owned(),
                        v => (v.iter().map(IpAddr::to_string))
                            .collect::<Vec<_>>()
                            .join(","),
                    };
                    detail.push(format!("vip: {} -> {}", show(&o.vips), show(&n.vips)));
                }
                let ports = |s: &Service| -> Vec<String> {
                    let mut p: Vec<String> = s.ports.iter().map(|p| p.to_string()).collect();
                    p.sort();
                    p
                };
                let (op, np) = (ports(o), ports(n));
                if op != np {
                    let mut d: Vec<String> = (np.iter().filter(|p| !op.contains(p)))
                        .map(|p| format!("+{p}"))
                        .collect();
                    d.extend(
                        op.iter()
                            .filter(|p| !np.contains(p))
                            .map(|p| format!("-{p}")),
                    );
                    detail.push(format!("ports: {}", d.join(" ")));
                }
                if !detail.is_empty() {
                    out.push(change(Op::Changed, Kind::Service, None, detail));
                }
            }
            (None, None) => unreachable!("a key of one of the two"),
        }
        // Backends of a contribution that is added or stays.
        let state = |disabled: bool| if disabled { "disabled" } else { "active" };
        let before: BTreeMap<IpAddr, bool> = (o.into_iter())
            .flat_map(|s| s.backends.iter().map(|b| (b.ip, b.disabled)))
            .collect();
        let after: BTreeMap<IpAddr, bool> = (n.into_iter())
            .flat_map(|s| s.backends.iter().map(|b| (b.ip, b.disabled)))
            .collect();
        let ips: std::collections::BTreeSet<IpAddr> =
            before.keys().chain(after.keys()).copied().collect();
        for ip in ips {
            match (before.get(&ip), after.get(&ip)) {
                (None, Some(&d)) => out.push(change(
                    Op::Added,
                    Kind::Backend,
                    Some(ip),
                    if d { vec!["disabled".into()] } else { vec![] },
                )),
                (Some(_), None) => out.push(change(Op::Removed, Kind::Backend, Some(ip), vec![])),
                (Some(&a), Some(&b)) if a != b => out.push(change(
                    Op::Changed,
                    Kind::Backend,
                    Some(ip),
                    vec![format!("{} -> {}", state(a), state(b))],
                )),
                _ => {}
            }
        }
    }
    out
}
