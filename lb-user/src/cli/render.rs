//! How the CLI prints the daemon's replies: headed, aligned tables in one style for every list
//! (as `docker ps` and `cilium service list` print them; a list with no rows prints its
//! header), and under `--json` the reply itself, the same data as the table, as one document.
use lb_user::{
    api::{
        ConntrackEntry, Done, ElementEntry, Event, NetworkStatus, NetworkSummary, ServiceEntry,
        Status,
    },
    core::model::DesiredState,
    dataplane::SyncStats,
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

/// A table: a header row and rows of cells, each column as wide as its widest cell, two
/// spaces apart; the last column is not padded.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn print(&self) {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                (self.rows.iter())
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c + 1 < r.len() {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
                } else {
                    line.push_str(cell);
                }
            }
            println!("{}", line.trim_end());
        }
    }
}

/// `-` for what is absent or empty.
fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("-".to_owned(), |v| v.to_string())
}

/// `1 service`, `2 services`.
fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The differences `done` lists in words; past them it says how many more there are (a
/// whole state applied on a new node is hundreds of thousands of lines nobody reads).
const SHOWN_CHANGES: usize = 200;

/// What a change did (or, for a dry run, would do): its summary, then one line per
/// difference (`+` added, `~` changed, `-` removed), the first [`SHOWN_CHANGES`] of them
/// (`--json` has them all).
pub fn done(json: bool, d: &Done) {
    show(json, d, |d| {
        println!("{}", d.done);
        if d.changes.is_empty() {
            println!("  no changes");
        }
        for c in d.changes.iter().take(SHOWN_CHANGES) {
            println!("  {c}");
        }
        let more = d.changes.len().saturating_sub(SHOWN_CHANGES);
        if more > 0 {
            println!("  … and {more} more (--json lists every one)");
        }
    });
}

/// One line of `lb watch` in words: `revision 12: + backend 10.20.0.11 of ... (applied)`.
pub fn event(line: &str) -> String {
    let Ok(e) = serde_json::from_str::<Event>(line) else {
        // The daemon's last word on a stream it ends (`{"error": ...}`), or a line this lb
        // does not know: as it is.
        return line.to_owned();
    };
    let state = match e.applied {
        Some(true) => " (applied)",
        Some(false) => " (saved, NOT APPLIED yet)",
        None => "",
    };
    if !e.networks.is_empty() {
        return format!("revision {}: applied {}", e.revision, e.networks.join(", "));
    }
    if e.omitted > 0 {
        return format!(
            "revision {}{state}: {} changes (not listed: lb state shows the state)",
            e.revision, e.omitted
        );
    }
    if e.changes.is_empty() {
        return format!("revision {}: no changes{state}", e.revision);
    }
    let changes: Vec<String> = e.changes.iter().map(ToString::to_string).collect();
    format!("revision {}{state}: {}", e.revision, changes.join("; "))
}

pub fn networks(json: bool, list: &[NetworkSummary]) {
    show(json, &list, |list| {
        let mut t = Table::new(&[
            "NETWORK",
            "INTERFACES",
            "NETNS",
            "MODE",
            "ATTACH",
            "MASQUERADE",
            "SERVICES",
        ]);
        for n in *list {
            t.row(vec![
                n.name.clone(),
                n.interfaces.join(","),
                or_dash(n.netns.as_deref()),
                n.mode.to_string(),
                n.attach.to_string(),
                n.masquerade.to_string(),
                n.services.to_string(),
            ]);
        }
        t.print();
    });
}

/// One row per backend, as `cilium service list`: the service's own columns on its first.
pub fn services(json: bool, list: &[ServiceEntry]) {
    show(json, &list, |list| {
        let mut t = Table::new(&[
            "NETWORK",
            "SERVICE",
            "GENERATION",
            "FRONTENDS",
            "BACKEND",
            "STATE",
            "FLOWS",
            "PACKETS",
            "BYTES",
        ]);
        for e in *list {
            let head = vec![
                e.network.clone(),
                e.service.id.clone(),
                e.service.generation.clone(),
                or_dash(Some(&e.frontends.join(" "))),
            ];
            if e.backends.is_empty() {
                t.row([head.clone(), vec!["-".into(); 5]].concat());
            }
            for (i, b) in e.backends.iter().enumerate() {
                let first = if i == 0 {
                    head.clone()
                } else {
                    vec![String::new(); 4]
                };
                t.row(
                    [
                        first,
                        vec![
                            b.address.to_string(),
                            b.state.to_string(),
                            opt(b.flows),
                            opt(b.packets),
                            opt(b.bytes),
                        ],
                    ]
                    .concat(),
                );
            }
        }
        t.print();
    });
}

/// The desired state in the canonical field order, so that `lb apply -f` of a canonical file
/// and `lb state` print the same bytes; pretty unless `--json` asks for one line.
pub fn state(json: bool, state: &DesiredState) {
    show(json, state, |s| println!("{}", s.to_json()));
}

/// Elements in DESIGN.md's notation, one per line (what the dataplane tests compare with the
/// kernel's tables).
/// Composed elements: a row per element, its network first (two networks may share a VIP),
/// then DESIGN.md's `{map} {key} : {value}` split into its columns.
pub fn elements(json: bool, list: &[ElementEntry]) {
    show(json, &list, |list| {
        let mut t = Table::new(&["NETWORK", "MAP", "KEY", "VALUE"]);
        for e in *list {
            t.row(vec![
                e.network.clone(),
                e.map.clone(),
                e.key.clone(),
                e.value.clone(),
            ]);
        }
        t.print();
    });
}

/// What `lb load` programmed, a line (or a JSON object) per network.
pub fn loaded(json: bool, bpffs: &std::path::Path, loaded: &[(String, SyncStats)]) {
    let list: Vec<_> = (loaded.iter())
        .map(|(network, s)| {
            serde_json::json!({
                "network": network,
                "written": s.written,
                "deleted": s.deleted,
                "flows_flushed": s.flows_flushed,
                "pinned": bpffs.join(network),
            })
        })
        .collect();
    show(json, &list, |_| {
        for (network, s) in loaded {
            println!(
                "{network}: loaded ({} map entries written, {} deleted, {} flows flushed); pinned under {}",
                s.written,
                s.deleted,
                s.flows_flushed,
                bpffs.join(network).display()
            );
        }
    });
}

pub fn conntrack(json: bool, flows: &[ConntrackEntry]) {
    show(json, &flows, |flows| {
        let mut t = Table::new(&[
            "NETWORK", "PROTO", "CLIENT", "SERVICE", "FRONTEND", "BACKEND", "STATE", "EXPIRES",
            "IDLE",
        ]);
        for ConntrackEntry { network, flow: f } in *flows {
            t.row(vec![
                network.clone(),
                f.proto.to_string(),
                f.client.to_string(),
                or_dash(f.service.as_deref()),
                f.frontend.to_string(),
                f.backend.to_string(),
                f.state.to_string(),
                f.expires_secs.map_or("-".to_owned(), |s| format!("{s}s")),
                f.idle_secs.map_or("-".to_owned(), |s| format!("{s}s")),
            ]);
        }
        t.print();
    });
}

pub fn status(json: bool, status: &Status) {
    show(json, status, |v| {
        println!("dataplane: {} ({})", v.dataplane, v.reason);
        if let Some(st) = &v.store {
            println!(
                "desired state: {} at revision {} ({} bytes)",
                st.path, st.revision, st.bytes
            );
        }
        if let Some(c) = &v.last_change {
            println!(
                "last change: revision {} in {} µs: {} checked, {} sets composed, {} address dumps, {} store keys, {} written, {} deleted",
                c.revision,
                c.micros,
                c.validated,
                c.recomposed,
                c.address_dumps,
                c.store_keys,
                c.written,
                c.deleted
            );
        }
        if let Some(c) = &v.cluster {
            let contact = if c.connected {
                "following".to_owned()
            } else {
                format!(
                    "unreachable, serving the last services applied: {}",
                    c.last_error.as_deref().unwrap_or("no contact yet")
                )
            };
            println!(
                "cluster: {} ({}) as node {}: {contact}; etcd revision {} applied, lag {}; {} services served, {} waiting for a network, {} refused",
                c.endpoints,
                c.prefix,
                c.node,
                c.revision,
                c.lag,
                c.services,
                c.waiting,
                c.refused.len()
            );
            for r in &c.refused {
                println!("  refused {}: {}", r.key, r.reason);
            }
            for (key, why) in &c.invalid {
                println!("  not a service: {key}: {why}");
            }
        }
        if !v.left.is_empty() {
            println!(
                "left as found (not in the desired state when its store was created; add or apply a network of that name to take it over): {}",
                v.left.join(", ")
            );
        }
        let mut t = Table::new(&[
            "NETWORK",
            "STATE",
            "SERVICES",
            "BACKENDS",
            "FLOWS",
            "ATTACH",
            "INTERFACES",
            "LAST SYNC",
        ]);
        for n in &v.networks {
            t.row(vec![
                n.name.clone(),
                if n.applied { "applied" } else { "NOT APPLIED" }.to_owned(),
                n.services.to_string(),
                n.backends.to_string(),
                opt(n.flows),
                n.attach.to_string(),
                n.interfaces.join(","),
                n.last_sync
                    .map_or("-".to_owned(), |s| format!("{}s ago", s.ago_secs)),
            ]);
        }
        println!();
        t.print();
        for n in &v.networks {
            network_details(n);
        }
    });
}

/// What a row of the status table cannot hold.
fn network_details(n: &NetworkStatus) {
    println!("\nnetwork {}:", n.name);
    if let Some(e) = &n.error {
        println!("  error: {e}");
    }
    println!(
        "  {}, {}",
        count(n.services as u64, "service", "services"),
        count(n.backends as u64, "backend", "backends"),
    );
    if let Some(f) = n.flows {
        let by_state = (n.flows_by_state.as_ref())
            .map(|m| {
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{v} {k}")).collect();
                format!(" ({})", parts.join(", "))
            })
            .unwrap_or_default();
        println!("  flows: {f}{by_state}");
    }
    if let Some(s) = &n.last_sync {
        println!(
            "  last sync: {}s ago, {} written, {} deleted, {} flushed",
            s.ago_secs,
            count(s.written as u64, "entry", "entries"),
            s.deleted,
            count(s.flows_flushed as u64, "flow", "flows"),
        );
    }
    if let Some(path) = &n.path {
        println!("  path: {path}");
    }
    for w in &n.warnings {
        println!("  warning: {w}");
    }
}

/// `lb nodes`: one row per node that keeps its status key alive.
pub fn nodes(json: bool, revision: i64, nodes: &[lb_user::cluster::NodeStatus]) {
    #[derive(Serialize)]
    struct Nodes<'a> {
        revision: i64,
        nodes: &'a [lb_user::cluster::NodeStatus],
    }
    show(json, &Nodes { revision, nodes }, |n| {
        let mut t = Table::new(&["NODE", "REVISION", "LAG", "REFUSED"]);
        for node in n.nodes {
            t.row(vec![
                node.node.clone(),
                node.revision.to_string(),
                node.lag.to_string(),
                (node.refused.iter())
                    .map(|r| format!("{} ({})", r.key, r.reason))
                    .collect::<Vec<_>>()
                    .join("; "),
            ]);
        }
        t.print();
        println!("etcd revision now: {}", n.revision);
    });
}
