//! The daemon's API: one JSON request per connection on a root-only unix socket, one JSON
//! response back. The `lb` CLI is a client of exactly this; anything it can do, a raw client
//! can, and every request is checked by the daemon as if it came from an untrusted one.
//!
//! Framing: the client writes the request and shuts down its write side; the daemon reads at
//! most [`MAX_REQUEST`] bytes (a larger body is refused, not truncated), answers, and closes.
use std::{io::Read as _, io::Write as _, os::unix::net::UnixStream, path::Path};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::core::model::{DesiredState, Network, Service};

/// The default socket, as DESIGN.md's CLI gives it (`LB_SOCKET` overrides).
pub const DEFAULT_SOCKET: &str = "/run/lb/lb.sock";
/// Largest request body the daemon reads: a desired state with tens of thousands of services
/// fits; anything larger is refused with an error.
pub const MAX_REQUEST: usize = 16 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// A new network, without services (`lb service set` adds them).
    NetworkAdd {
        network: Network,
    },
    NetworkRm {
        name: String,
    },
    // Field-less variants are written `{}`: serde ignores unknown fields of a unit variant
    // of an internally tagged enum, and a request with a field we do not know is refused.
    NetworkList {},
    /// Adds or replaces one contribution (service id + generation) of a network.
    ServiceSet {
        network: String,
        service: Service,
    },
    /// Removes one generation of a service, or all of them when `generation` is absent.
    ServiceRm {
        network: String,
        id: String,
        #[serde(default)]
        generation: Option<String>,
    },
    ServiceList {
        #[serde(default)]
        network: Option<String>,
    },
    /// Replaces the whole desired state.
    Apply {
        state: DesiredState,
    },
    State {},
    Elements {
        #[serde(default)]
        network: Option<String>,
    },
    Conntrack {
        #[serde(default)]
        network: Option<String>,
    },
    Status {},
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
                | Request::Apply { .. }
        )
    }
}

/// `{"ok":true,"result":…}` or `{"ok":false,"error":"…"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(result: serde_json::Value) -> Self {
        Self {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(e: &anyhow::Error) -> Self {
        Self {
            ok: false,
            result: None,
            // One line: the whole context chain, as the CLI prints it.
            error: Some(format!("{e:#}").replace('\n', " ")),
        }
    }
}

/// Parses a request body with the JSON path of whatever is wrong in it.
pub fn parse_request(body: &[u8]) -> Result<Request> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let req: Request = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            anyhow::anyhow!("bad request: {inner}")
        } else {
            anyhow::anyhow!("bad request: {path}: {inner}")
        }
    })?;
    de.end().map_err(|e| anyhow::anyhow!("bad request: {e}"))?;
    Ok(req)
}

/// Sends one request to the daemon at `socket` and returns its response (blocking).
pub fn call(socket: &Path, request: &Request) -> Result<Response> {
    let body = serde_json::to_vec(request).context("encoding the request")?;
    call_raw(socket, &body)
}

/// Sends raw bytes as a request (what a non-CLI client, or a test of one, does).
pub fn call_raw(socket: &Path, body: &[u8]) -> Result<Response> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the daemon at {} (is `lb daemon` running?)",
            socket.display()
        )
    })?;
    // A refused oversized body may close the socket before all of it is written: the
    // daemon's answer is still there to read.
    let wrote = s.write_all(body);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .with_context(|| format!("reading the daemon's answer on {}", socket.display()))?;
    if out.is_empty() {
        wrote.with_context(|| format!("writing to {}", socket.display()))?;
        bail!(
            "the daemon at {} closed the connection without an answer",
            socket.display()
        );
    }
    serde_json::from_slice(&out).context("the daemon's answer is not a response")
}
