//! Requests: what a method, path and body mean ([`route`], the daemon's side) and the method,
//! path and body of a request ([`Request::to_http`], the client's side). Both sides are here
//! so that they cannot drift apart: `route(to_http(r)) == r` for every request.
//!
//! One file because of that: the two directions of every route, side by side.
use hyper::{Method, StatusCode};
use serde::de::DeserializeOwned;

use super::{ErrorReply, MAX_REQUEST};
use crate::core::edit::Edit;
use crate::core::model::{DesiredState, Network, Service};

/// One API request, decoded and typed.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// A new network, without services (`lb service set` adds them).
    NetworkAdd {
        network: Network,
    },
    NetworkRm {
        name: String,
    },
    NetworkList,
    /// Adds or replaces one contribution (service id + generation) of a network.
    ServiceSet {
        network: String,
        service: Service,
    },
    /// Removes one generation of a service, or all of them when `generation` is absent.
    ServiceRm {
        network: String,
        id: String,
        generation: Option<String>,
    },
    ServiceList {
        network: Option<String>,
    },
    /// Many changes as one: checked, saved and applied all together or not at all (a dry run
    /// checks them and changes nothing).
    Changes {
        changes: Vec<Edit>,
        dry_run: bool,
    },
    /// Replaces the whole desired state; a dry run checks it as the change would be checked
    /// and answers with what would change, changing nothing.
    Apply {
        state: DesiredState,
        dry_run: bool,
    },
    State,
    /// The stream of applied changes, from after revision `from` (`None`: from now).
    Watch {
        from: Option<u64>,
    },
    Elements {
        network: Option<String>,
    },
    Conntrack {
        network: Option<String>,
    },
    Status,
    /// One change of a service in the cluster, written to etcd by a `--cluster` daemon with
    /// compare-and-swap, as `lb --cluster` writes it (`cluster::write::edit`); answered by
    /// the server, not the actor (the node's state changes when the cluster's watch says).
    ClusterChange {
        change: Edit,
        if_revision: Option<i64>,
    },
}

/// The body of `POST /v1/cluster/changes`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterBody {
    change: Edit,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    if_revision: Option<i64>,
}

/// A refusal: the HTTP status and the [`ErrorReply`] that says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub reply: ErrorReply,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl std::fmt::Display) -> Self {
        ApiError {
            status,
            // One line: the whole context chain, as the CLI prints it.
            reply: ErrorReply {
                error: message.to_string().replace('\n', " "),
                saved: false,
            },
        }
    }

    pub fn bad_request(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// A failure of the daemon itself; `saved` says whether the change is on disk.
    pub fn internal(e: &anyhow::Error, saved: bool) -> Self {
        let mut err = Self::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"));
        err.reply.saved = saved;
        err
    }

    pub fn too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {MAX_REQUEST} bytes"),
        )
    }
}

impl Request {
    /// Whether the request changes the desired state.
    pub fn mutates(&self) -> bool {
        matches!(
            self,
            Request::NetworkAdd { .. }
                | Request::NetworkRm { .. }
                | Request::ServiceSet { .. }
                | Request::ServiceRm { .. }
                | Request::Changes { .. }
                | Request::Apply { .. }
        )
    }

    /// The method, path (with query) and JSON body that [`route`] reads back as `self`.
    pub fn to_http(&self) -> (Method, String, Option<Vec<u8>>) {
        let query = |network: &Option<String>| match network {
            Some(n) => format!("?network={}", encode(n)),
            None => String::new(),
        };
        fn json<T: serde::Serialize>(v: &T) -> Option<Vec<u8>> {
            Some(serde_json::to_vec(v).expect("a request body serializes"))
        }
        match self {
            Request::NetworkAdd { network } => (Method::POST, "/v1/networks".into(), json(network)),
            Request::NetworkRm { name } => (
                Method::DELETE,
                format!("/v1/networks/{}", encode(name)),
                None,
            ),
            Request::NetworkList => (Method::GET, "/v1/networks".into(), None),
            Request::ServiceSet { network, service } => {
                let mut body = serde_json::to_value(service).expect("a service serializes");
                let fields = body.as_object_mut().expect("a service is an object");
                fields.remove("id");
                fields.remove("generation");
                (
                    Method::PUT,
                    format!(
                        "/v1/networks/{}/services/{}/{}",
                        encode(network),
                        encode(&service.id),
                        encode(&service.generation)
                    ),
                    Some(body.to_string().into_bytes()),
                )
            }
            Request::ServiceRm {
                network,
                id,
                generation,
            } => {
                let mut path = format!("/v1/networks/{}/services/{}", encode(network), encode(id));
                if let Some(g) = generation {
                    path = format!("{path}/{}", encode(g));
                }
                (Method::DELETE, path, None)
            }
            Request::ServiceList { network } => {
                (Method::GET, format!("/v1/services{}", query(network)), None)
            }
            Request::Changes { changes, dry_run } => {
                let path = if *dry_run {
                    "/v1/changes?dry_run=true"
                } else {
                    "/v1/changes"
                };
                (
                    Method::POST,
                    path.into(),
                    json(&Batch {
                        changes: changes.clone(),
                    }),
                )
            }
            Request::Apply { state, dry_run } => {
                let path = if *dry_run {
                    "/v1/state?dry_run=true"
                } else {
                    "/v1/state"
                };
                (Method::PUT, path.into(), json(state))
            }
            Request::State => (Method::GET, "/v1/state".into(), None),
            Request::Watch { from } => (
                Method::GET,
                match from {
                    Some(r) => format!("/v1/watch?from={r}"),
                    None => "/v1/watch".into(),
                },
                None,
            ),
            Request::Elements { network } => {
                (Method::GET, format!("/v1/elements{}", query(network)), None)
            }
            Request::Conntrack { network } => (
                Method::GET,
                format!("/v1/conntrack{}", query(network)),
                None,
            ),
            Request::Status => (Method::GET, "/v1/status".into(), None),
            Request::ClusterChange {
                change,
                if_revision,
            } => (
                Method::POST,
                "/v1/cluster/changes".into(),
                json(&ClusterBody {
                    change: change.clone(),
                    if_revision: *if_revision,
                }),
            ),
        }
    }
}

/// Decodes one request. `path` is the URI's path, `query` its query string; every refusal is
/// a 400 (a body or query that is not valid), 404 (no such path) or 405 (a method the path
/// does not take).
pub fn route(
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Result<Request, ApiError> {
    let segments: Vec<&str> = match path.strip_prefix("/v1/") {
        Some(rest) => rest.split('/').collect(),
        None => return Err(no_such_path(path)),
    };
    // Which methods the path takes, and the request for the one used.
    let (allowed, request): (&[Method], Option<Request>) = match (segments.as_slice(), method) {
        (["status"], &Method::GET) => (&[Method::GET], Some(Request::Status)),
        (["status"], _) => (&[Method::GET], None),
        (["state"], &Method::GET) => (&[Method::GET, Method::PUT], Some(Request::State)),
        (["state"], &Method::PUT) => {
            let text = std::str::from_utf8(body)
                .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
            let state = DesiredState::from_json(text)
                .map_err(|e| ApiError::bad_request(format!("invalid desired state: {e}")))?;
            let dry_run = dry_run_query(query)?;
            (&[], Some(Request::Apply { state, dry_run }))
        }
        (["state"], _) => (&[Method::GET, Method::PUT], None),
        (["changes"], &Method::POST) => {
            let Batch { changes } = parse_json(body)?;
            if changes.is_empty() {
                return Err(ApiError::bad_request("changes: the list is empty"));
            }
            let dry_run = dry_run_query(query)?;
            (&[], Some(Request::Changes { changes, dry_run }))
        }
        (["changes"], _) => (&[Method::POST], None),
        (["cluster", "changes"], &Method::POST) => {
            let ClusterBody {
                change,
                if_revision,
            } = parse_json(body)?;
            (
                &[],
                Some(Request::ClusterChange {
                    change,
                    if_revision,
                }),
            )
        }
        (["cluster", "changes"], _) => (&[Method::POST], None),
        (["networks"], &Method::GET) => (&[], Some(Request::NetworkList)),
        (["networks"], &Method::POST) => {
            let network = parse_json(body)?;
            (&[], Some(Request::NetworkAdd { network }))
        }
        (["networks"], _) => (&[Method::GET, Method::POST], None),
        (["networks", name], &Method::DELETE) => (
            &[],
            Some(Request::NetworkRm {
                name: segment(name)?,
            }),
        ),
        (["networks", _], _) => (&[Method::DELETE], None),
        (["networks", network, "services", id, generation], &Method::PUT) => {
            let mut fields: serde_json::Map<String, serde_json::Value> = parse_json(body)?;
            for key in ["id", "generation"] {
                if fields.contains_key(key) {
                    return Err(ApiError::bad_request(format!(
                        "{key}: the service's {key} is in the path, not the body"
                    )));
                }
            }
            fields.insert("id".into(), segment(id)?.into());
            fields.insert("generation".into(), segment(generation)?.into());
            let service = from_value(serde_json::Value::Object(fields))?;
            (
                &[],
                Some(Request::ServiceSet {
                    network: segment(network)?,
                    service,
                }),
            )
        }
        (["networks", network, "services", id, generation], &Method::DELETE) => (
            &[],
            Some(Request::ServiceRm {
                network: segment(network)?,
                id: segment(id)?,
                generation: Some(segment(generation)?),
            }),
        ),
        (["networks", _, "services", _, _], _) => (&[Method::PUT, Method::DELETE], None),
        (["networks", network, "services", id], &Method::DELETE) => (
            &[],
            Some(Request::ServiceRm {
                network: segment(network)?,
                id: segment(id)?,
                generation: None,
            }),
        ),
        (["networks", _, "services", _], _) => (&[Method::DELETE], None),
        (["services"], &Method::GET) => (
            &[],
            Some(Request::ServiceList {
                network: network_query(query)?,
            }),
        ),
        (["elements"], &Method::GET) => (
            &[],
            Some(Request::Elements {
                network: network_query(query)?,
            }),
        ),
        (["conntrack"], &Method::GET) => (
            &[],
            Some(Request::Conntrack {
                network: network_query(query)?,
            }),
        ),
        (["watch"], &Method::GET) => {
            let from = match query {
                None | Some("") => None,
                Some(q) => Some(
                    (q.strip_prefix("from="))
                        .and_then(|r| r.parse().ok())
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "query: {q:?} (only from=REVISION, a number)"
                            ))
                        })?,
                ),
            };
            (&[], Some(Request::Watch { from }))
        }
        (["services" | "elements" | "conntrack" | "watch"], _) => (&[Method::GET], None),
        _ => return Err(no_such_path(path)),
    };
    let Some(request) = request else {
        let allowed: Vec<&str> = allowed.iter().map(Method::as_str).collect();
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} {path}: the path takes {}", allowed.join(", ")),
        ));
    };
    let takes_body = matches!(
        request,
        Request::Apply { .. }
            | Request::NetworkAdd { .. }
            | Request::ServiceSet { .. }
            | Request::Changes { .. }
            | Request::ClusterChange { .. }
    );
    if !takes_body && !body.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{method} {path} takes no body"
        )));
    }
    let takes_query = matches!(
        request,
        Request::ServiceList { .. }
            | Request::Elements { .. }
            | Request::Conntrack { .. }
            | Request::Apply { .. }
            | Request::Changes { .. }
            | Request::Watch { .. }
    );
    if !takes_query && query.is_some() {
        return Err(ApiError::bad_request(format!(
            "{method} {path} takes no query"
        )));
    }
    Ok(request)
}

fn no_such_path(path: &str) -> ApiError {
    ApiError::not_found(format!(
        "no such path {path:?} (the API is under /v1/: status, state, changes, watch, networks, services, elements, conntrack)"
    ))
}

/// A name as a path segment or query value. A valid name (letters, digits, `_`, `.`, `-`: the
/// model checks them) is written as is; anything else is percent-encoded, so that a name the
/// daemon will refuse still reaches it, and is refused by name, not as a malformed URI.
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A path segment or query value as the name it encodes ([`encode`]'s inverse); an empty one
/// is a malformed path.
fn segment(s: &str) -> Result<String, ApiError> {
    if s.is_empty() {
        return Err(ApiError::bad_request("an empty path segment"));
    }
    let bad = || ApiError::bad_request(format!("{s:?}: bad percent-encoding"));
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let mut digit = || {
            (bytes.next())
                .and_then(|d| char::from(d).to_digit(16))
                .ok_or_else(bad)
        };
        let (high, low) = (digit()?, digit()?);
        out.push((high << 4 | low) as u8);
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_request(format!("{s:?}: not UTF-8")))
}

/// `network=NAME`, the only query the list endpoints take.
fn network_query(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut network = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("network", name)) if network.is_none() => network = Some(segment(name)?),
            Some(("network", _)) => {
                return Err(ApiError::bad_request("query: network given twice"));
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "query: unknown parameter {pair:?} (only network=NAME)"
                )));
            }
        }
    }
    Ok(network)
}

/// The body of `POST /v1/changes`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    changes: Vec<Edit>,
}

/// `dry_run=true|false`, the only query `PUT /v1/state` and `POST /v1/changes` take.
fn dry_run_query(query: Option<&str>) -> Result<bool, ApiError> {
    match query {
        None | Some("") | Some("dry_run=false") => Ok(false),
        Some("dry_run=true") => Ok(true),
        Some(q) => Err(ApiError::bad_request(format!(
            "query: {q:?} (only dry_run=true or dry_run=false)"
        ))),
    }
}

/// A JSON object body as `T`, refused with the JSON path of whatever is wrong in it.
fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // serde reads a JSON array as a struct's fields in order: only an object is a body.
    if !body.trim_ascii_start().starts_with(b"{") {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(path_error)?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?;
    Ok(value)
}

fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(path_error)
}

fn path_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if path == "." || path.is_empty() {
        ApiError::bad_request(format!("invalid body: {inner}"))
    } else {
        ApiError::bad_request(format!("invalid body: {path}: {inner}"))
    }
}
