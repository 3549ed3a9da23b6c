//! The daemon's API: HTTP/1.1 and JSON on a root-only unix socket, as Docker's and Cilium's
//! are (`curl --unix-socket /run/lb/lb.sock http://lb/v1/state`). The `lb` CLI is a client of
//! exactly this; anything it can do, a raw client can, and every request is checked by the
//! daemon as if it came from an untrusted one.
//!
//! | method and path | body | reply |
//! |---|---|---|
//! | `GET /v1/status` | | [`Status`] |
//! | `GET /v1/state` | | the desired state |
//! | `PUT /v1/state[?dry_run=true]` | a desired state | [`Done`]: the whole state replaced (a dry run: checked, nothing changed) |
//! | `GET /v1/networks` | | [`NetworkSummary`] list |
//! | `POST /v1/networks` | a network without services | 201 [`Done`] |
//! | `DELETE /v1/networks/{network}` | | [`Done`] |
//! | `GET /v1/services[?network=N]` | | [`ServiceEntry`] list |
//! | `PUT /v1/networks/{network}/services/{id}/{generation}` | `{vip, backends, ports}` | [`Done`] |
//! | `DELETE /v1/networks/{network}/services/{id}[/{generation}]` | | [`Done`] |
//! | `POST /v1/changes[?dry_run=true]` | `{"changes": [edit, …]}` ([`crate::core::edit::Edit`]) | [`Done`]: every change or none, applied as one |
//! | `GET /v1/watch[?from=REVISION]` | | a stream of [`Event`]s, one JSON object per line: those after `from` first (410 when the history kept no longer has them all), then each as it happens |
//! | `GET /v1/elements[?network=N]` | | [`ElementEntry`] list |
//! | `GET /v1/conntrack[?network=N]` | | [`ConntrackEntry`] list |
//!
//! Every [`Done`] lists the changes made ([`crate::core::diff`]).
//!
//! A refusal is an [`ErrorReply`] with its status: 400 a request or desired state that is
//! not valid (the message names the JSON path), 403 a client that is neither root nor the
//! daemon's user, 404 an unknown network, service or path, 405 a method the path does not
//! take, 409 a network that exists, 413 a body over [`MAX_REQUEST`], 408 a body that does not
//! arrive within 10 s. A change that was saved but not applied yet is a 500 whose reply has
//! `saved: true`: the daemon keeps the network's last good dataplane and retries it.
mod client;
mod route;
mod types;

pub use client::{Client, NoAnswer, Refused, Unreachable};
pub use route::{ApiError, Request, route};
pub use types::{
    BackendState, BackendStats, ChangeWork, ClusterStatus, ConntrackEntry, Done, ElementEntry,
    ErrorReply, Event, LastSync, NetworkStatus, NetworkSummary, Reply, ServiceEntry, Status,
    StoreStatus,
};

/// The default socket, as DESIGN.md's CLI gives it (`LB_SOCKET` overrides).
pub const DEFAULT_SOCKET: &str = "/run/lb/lb.sock";
/// Largest request body the daemon reads: a desired state of 50,000 services of 10
/// backends (about 25 MiB of JSON) fits; anything larger is refused with 413, not truncated.
pub const MAX_REQUEST: usize = 64 << 20;
