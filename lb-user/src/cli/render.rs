//! How the CLI prints the daemon's replies: one line per item for people, the reply's own
//! JSON under `--json`.
use lb_user::{
    api::{ConntrackEntry, Done, NetworkStatus, NetworkSummary, ServiceEntry, Status},
    core::model::DesiredState,
};
use serde::Serialize;

/// Prints `v` as one line of JSON under `--json`, else by `human`.
pub fn show<T: Serialize>(json: bool, v: &T, human: impl FnOnce(&T)) {
    if json {
        println!(
            "{}",
            serde_json::to_string(v).expect("a reply always serializes")
        );
    } else {
        human(v);
    }
}

pub fn done(json: bool, d: &Done) {
    show(json, d, |d| println!("{}", d.done));
}

/// `-` for what is absent or empty.
fn or_dash(s: Option<&str>) -> &str {
    s.filter(|s| !s.is_empty()).unwrap_or("-")
}

pub fn networks(json: bool, list: &[NetworkSummary]) {
    show(json, &list, |list| {
        for n in *list {
            println!(
                "{} interfaces={} netns={} mode={} attach={} masquerade={} services={}",
                n.name,
                n.interfaces.join(","),
                or_dash(n.netns.as_deref()),
                n.mode,
                n.attach,
                n.masquerade,
                n.services
            );
        }
    });
}

pub fn services(json: bool, list: &[ServiceEntry]) {
    show(json, &list, |list| {
        for ServiceEntry { network, service } in *list {
            let backends: Vec<String> = service.backends.iter().map(|b| b.to_string()).collect();
            let ports: Vec<String> = service.ports.iter().map(|p| p.to_string()).collect();
            println!(
                "{network} {} generation {} vip {} backends {} ports {}",
                service.id,
                service.generation,
                or_dash(service.vip.map(|v| v.to_string()).as_deref()),
                or_dash(Some(&backends.join(" "))),
                or_dash(Some(&ports.join(" "))),
            );
        }
    });
}

/// The desired state in the canonical field order, so that `lb apply -f` of a canonical file
/// and `lb state` print the same bytes; pretty unless `--json` asks for one line.
pub fn state(json: bool, state: &DesiredState) {
    show(json, state, |s| println!("{}", s.to_json()));
}

pub fn lines(json: bool, lines: &[String]) {
    show(json, &lines, |lines| {
        for l in *lines {
            println!("{l}");
        }
    });
}

pub fn conntrack(json: bool, flows: &[ConntrackEntry]) {
    show(json, &flows, |flows| {
        for ConntrackEntry { network, flow: f } in *flows {
            let idle = f
                .idle_secs
                .map(|i| format!(" idle {i}s"))
                .unwrap_or_default();
            println!(
                "{network} {} {} -> {} => {} {} {}{idle}",
                f.proto,
                f.client,
                f.service,
                f.backend,
                f.state,
                f.expires_secs.map_or("-".to_owned(), |a| format!("{a}s"))
            );
        }
    });
}

pub fn status(json: bool, status: &Status) {
    show(json, status, |v| {
        println!("dataplane: {} ({})", v.dataplane, v.reason);
        for n in &v.networks {
            network_status(n);
        }
    });
}

fn network_status(n: &NetworkStatus) {
    let state = if n.applied {
        "applied".to_owned()
    } else {
        format!("NOT APPLIED: {}", or_dash(n.error.as_deref()))
    };
    let by_state = (n.flows_by_state.as_ref())
        .map(|m| {
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{v} {k}")).collect();
            format!(" ({})", parts.join(", "))
        })
        .unwrap_or_default();
    println!(
        "network {}: {state}; {} services, {} backends, {} flows{by_state}; attach {} on {}",
        n.name,
        n.services,
        n.backends,
        n.flows.map_or("-".to_owned(), |f| f.to_string()),
        n.attach,
        n.interfaces.join(",")
    );
    if let Some(path) = &n.path {
        println!("  path: {path}");
    }
    for w in &n.warnings {
        println!("  warning: {w}");
    }
}
