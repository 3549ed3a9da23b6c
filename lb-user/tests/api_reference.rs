//! docs/api.md against the router: every route the reference lists is one the router takes,
//! with exactly the methods it lists; every request the client can make is listed; a query
//! parameter is listed where it is taken. The reference cannot drift from `api::route` without
//! this failing. Pure: no daemon, no root (`tests/api.rs` drives a live one with curl).
use std::{collections::BTreeSet, net::Ipv4Addr};

use hyper::{Method, StatusCode};
use lb_user::{
    api::{Request, route},
    core::{
        edit::Edit,
        model::{Backend, DesiredState, Network, Service},
    },
};

/// One row of the reference's route table: `METHOD /v1/a/{b}[/{c}][?q=…]`.
#[derive(Debug)]
struct Row {
    method: Method,
    /// The path's segments, `{…}` for a name; one template per optional part taken or not.
    templates: Vec<Vec<String>>,
    /// The query parameters the row lists.
    query: BTreeSet<String>,
    line: String,
}

const METHODS: [Method; 5] = [
    Method::GET,
    Method::PUT,
    Method::POST,
    Method::DELETE,
    Method::PATCH,
];

fn reference() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rows of every table whose first cell is a method and a `/v1/` path.
fn rows(doc: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for line in doc.lines() {
        let Some(cell) = line.strip_prefix("| `").and_then(|l| l.split('`').next()) else {
            continue;
        };
        let Some((method, path)) = cell.split_once(' ') else {
            continue;
        };
        let Ok(method) = method.parse::<Method>() else {
            continue;
        };
        if !path.starts_with("/v1/") {
            continue;
        }
        let (path, query) = match path.split_once("[?") {
            Some((p, q)) => (p, q.trim_end_matches(']')),
            None => (path, ""),
        };
        let query = (query.split('&'))
            .filter(|q| !q.is_empty())
            .map(|q| q.split('=').next().unwrap().to_owned())
            .collect();
        // One optional part at most (`[/{generation}]`): the path without it and with it.
        let templates = match path.split_once('[') {
            Some((head, tail)) => {
                let tail = tail.trim_end_matches(']');
                vec![head.to_owned(), format!("{head}{tail}")]
            }
            None => vec![path.to_owned()],
        };
        let templates = (templates.iter())
            .map(|t| {
                let t = t.strip_prefix("/v1/").unwrap();
                t.split('/').map(str::to_owned).collect()
            })
            .collect();
        rows.push(Row {
            method,
            templates,
            query,
            line: line.to_owned(),
        });
    }
    rows
}

fn matches(template: &[String], segments: &[&str]) -> bool {
    template.len() == segments.len()
        && (template.iter().zip(segments))
            .all(|(t, s)| (t.starts_with('{') && t.ends_with('}')) || t == s)
}

/// A path of `template` with each name filled in.
fn instance(template: &[String]) -> String {
    let segments: Vec<&str> = (template.iter())
        .map(|t| if t.starts_with('{') { "x1" } else { t })
        .collect();
    format!("/v1/{}", segments.join("/"))
}

/// One request of every kind, with each optional part both ways. The match in `kind` has no
/// wildcard: a new kind of request does not compile until it is named here, and then the
/// reference must list its route.
fn samples() -> Vec<Request> {
    let service = Service {
        id: "api".into(),
        generation: "1".into(),
        vips: vec![Ipv4Addr::new(10, 99, 0, 10).into()],
        backends: vec![Backend {
            ip: Ipv4Addr::new(10, 20, 0, 2).into(),
            disabled: false,
        }],
        ports: vec![],
    };
    let network: Network =
        serde_json::from_str(r#"{"name":"web","interfaces":["eth0"],"services":[]}"#).unwrap();
    let mut state = DesiredState::default();
    state.networks.push(network.clone());
    let change = Edit::BackendDisable {
        network: "web".into(),
        service: "api".into(),
        generation: None,
        ip: service.backends[0].ip,
    };
    let samples = vec![
        Request::NetworkAdd { network },
        Request::NetworkRm { name: "web".into() },
        Request::NetworkList,
        Request::ServiceSet {
            network: "web".into(),
            service,
        },
        Request::ServiceRm {
            network: "web".into(),
            id: "api".into(),
            generation: Some("1".into()),
        },
        Request::ServiceRm {
            network: "web".into(),
            id: "api".into(),
            generation: None,
        },
        Request::ServiceList { network: None },
        Request::ServiceList {
            network: Some("web".into()),
        },
        Request::Changes {
            changes: vec![change.clone()],
            dry_run: false,
        },
        Request::Changes {
            changes: vec![change.clone()],
            dry_run: true,
        },
        Request::Apply {
            state: state.clone(),
            dry_run: false,
        },
        Request::Apply {
            state,
            dry_run: true,
        },
        Request::State,
        Request::Watch { from: None },
        Request::Watch { from: Some(3) },
        Request::Elements { network: None },
        Request::Elements {
            network: Some("web".into()),
        },
        Request::Conntrack { network: None },
        Request::Conntrack {
            network: Some("web".into()),
        },
        Request::Status,
        Request::ClusterChange {
            change,
            if_revision: Some(4),
        },
    ];
    let kinds: BTreeSet<&str> = samples.iter().map(kind).collect();
    // As many as `kind` has arms.
    assert_eq!(kinds.len(), 14, "every kind of request sampled: {kinds:?}");
    samples
}

fn kind(r: &Request) -> &'static str {
    match r {
        Request::NetworkAdd { .. } => "network add",
        Request::NetworkRm { .. } => "network rm",
        Request::NetworkList => "network list",
        Request::ServiceSet { .. } => "service set",
        Request::ServiceRm { .. } => "service rm",
        Request::ServiceList { .. } => "service list",
        Request::Changes { .. } => "changes",
        Request::Apply { .. } => "apply",
        Request::State => "state",
        Request::Watch { .. } => "watch",
        Request::Elements { .. } => "elements",
        Request::Conntrack { .. } => "conntrack",
        Request::Status => "status",
        Request::ClusterChange { .. } => "cluster change",
    }
}

#[test]
fn the_api_reference_lists_every_route_the_router_takes_and_no_other() {
    let doc = reference();
    let rows = rows(&doc);
    assert!(rows.len() >= 10, "the route table is found: {rows:?}");
    let mut used = vec![false; rows.len()];

    // Every request the client makes is a listed route, its query parameters listed with it,
    // and the router reads it back.
    for r in samples() {
        let (method, uri, body) = r.to_http();
        let (path, query) = match uri.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (uri.as_str(), None),
        };
        let segments: Vec<&str> = path.strip_prefix("/v1/").unwrap().split('/').collect();
        let row = (rows.iter().enumerate()).find(|(_, row)| {
            row.method == method && row.templates.iter().any(|t| matches(t, &segments))
        });
        let Some((i, row)) = row else {
            panic!("{method} {uri} ({}) is not in docs/api.md", kind(&r));
        };
        used[i] = true;
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            let name = param.split('=').next().unwrap();
            assert!(
                row.query.contains(name),
                "{method} {uri}: ?{name} is not listed in {:?}",
                row.line
            );
        }
        let read = route(&method, path, query, body.as_deref().unwrap_or_default());
        assert_eq!(read.as_ref().ok(), Some(&r), "{method} {uri}: {read:?}");
    }
    let unused: Vec<&str> = (rows.iter().zip(&used))
        .filter(|(_, used)| !**used)
        .map(|(row, _)| row.line.as_str())
        .collect();
    assert!(
        unused.is_empty(),
        "listed, but no request of lb's uses it: {unused:#?}"
    );

    // On every listed path, the methods the reference does not list for it are refused with
    // 405 naming exactly the ones it lists.
    let paths: BTreeSet<String> = (rows.iter())
        .flat_map(|row| row.templates.iter().map(|t| instance(t)))
        .collect();
    for path in paths {
        let segments: Vec<&str> = path.strip_prefix("/v1/").unwrap().split('/').collect();
        let listed: BTreeSet<&str> = (rows.iter())
            .filter(|row| row.templates.iter().any(|t| matches(t, &segments)))
            .map(|row| row.method.as_str())
            .collect();
        for method in METHODS.iter().filter(|m| !listed.contains(m.as_str())) {
            let e = route(method, &path, None, b"")
                .expect_err(&format!("{method} {path} is not listed, yet routed"));
            assert_eq!(
                e.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}: {e:?}"
            );
            let takes: BTreeSet<&str> = (e.reply.error.rsplit_once("takes ").unwrap().1)
                .split(", ")
                .collect();
            assert_eq!(takes, listed, "{method} {path}: {}", e.reply.error);
        }
    }
}

/// The status codes of the reference's table of refusals.
fn documented_statuses(doc: &str) -> BTreeSet<u16> {
    let table = doc
        .split("| status | when |")
        .nth(1)
        .expect("docs/api.md has a table `| status | when |`");
    (table.lines().skip(2))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let code = l.trim_start_matches('|').split('|').next().unwrap().trim();
            code.parse().unwrap_or_else(|_| panic!("a status: {l:?}"))
        })
        .collect()
}

/// Every status the daemon's side answers with, read from its sources: the `StatusCode`s
/// named in `api/route.rs` and `daemon/`, and those of `ApiError`'s constructors.
fn answered_statuses() -> BTreeSet<u16> {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut files = vec![format!("{src}/api/route.rs")];
    for e in std::fs::read_dir(format!("{src}/daemon")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "rs") {
            files.push(path.to_str().unwrap().to_owned());
        }
    }
    let mut codes = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (name, code) in [
            ("ApiError::bad_request", 400),
            ("ApiError::not_found", 404),
            ("ApiError::too_large", 413),
            ("ApiError::internal", 500),
        ] {
            if text.contains(name) {
                codes.insert(code);
            }
        }
        for part in text.split("StatusCode::").skip(1) {
            let name: String = (part.chars())
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            let code = match name.as_str() {
                "" => continue,
                "OK" => 200,
                "CREATED" => 201,
                "BAD_REQUEST" => 400,
                "FORBIDDEN" => 403,
                "NOT_FOUND" => 404,
                "METHOD_NOT_ALLOWED" => 405,
                "REQUEST_TIMEOUT" => 408,
                "CONFLICT" => 409,
                "GONE" => 410,
                "PAYLOAD_TOO_LARGE" => 413,
                "INTERNAL_SERVER_ERROR" => 500,
                "SERVICE_UNAVAILABLE" => 503,
                other => panic!("{file}: StatusCode::{other}: give it its number here"),
            };
            codes.insert(code);
        }
    }
    codes
}

/// The refusals' table lists exactly the statuses the daemon answers with besides 200 and
/// 201 (the route table says which route answers 201).
#[test]
fn the_api_reference_lists_every_status_the_daemon_answers_with() {
    let doc = reference();
    let mut answered = answered_statuses();
    assert!(
        answered.remove(&200) && answered.remove(&201),
        "{answered:?}"
    );
    assert_eq!(
        documented_statuses(&doc),
        answered,
        "docs/api.md's `| status | when |` table"
    );
    let created: Vec<&str> = (doc.lines())
        .filter(|l| l.starts_with("| `") && l.contains(" 201 "))
        .collect();
    assert_eq!(created.len(), 1, "one route answers 201: {created:?}");
    assert!(
        created[0].starts_with("| `POST /v1/networks`"),
        "{created:?}"
    );
}
