//! The client side: one HTTP/1.1 request per connection to the daemon's socket (what the CLI
//! does, and what a test of a raw client uses).
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use super::{ErrorReply, Request};

/// The daemon's refusal as [`Client::call`] returns it (downcast the error to read the status
/// and whether the change was saved); it displays as the daemon's message.
#[derive(Debug, thiserror::Error)]
#[error("{}", reply.error)]
pub struct Refused {
    pub status: StatusCode,
    pub reply: ErrorReply,
}

/// The daemon could not be reached at all (no socket, nobody listening, or not permitted):
/// nothing was asked, so nothing changed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Unreachable {
    pub message: String,
}

impl Unreachable {
    /// Says why connecting to `socket` (named by `named_by`) failed with `e`, and what to do.
    fn new(socket: &Path, named_by: &str, e: &std::io::Error) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        let at = socket.display();
        let message = match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "cannot reach the daemon: no socket at {at} (is `lb daemon` running? {named_by} names another)"
            ),
            std::io::ErrorKind::ConnectionRefused => format!(
                "cannot reach the daemon: nothing listens on {at} (the daemon is not running; the file is left from an earlier one)"
            ),
            std::io::ErrorKind::PermissionDenied => {
                // The socket or a directory above it does not let this user in.
                let mode = std::fs::metadata(socket).map_or_else(
                    |_| "a directory above it is not searchable".to_owned(),
                    |m| format!("mode {:04o}, owner uid {}", m.mode() & 0o7777, m.uid()),
                );
                format!(
                    "not permitted to reach the daemon at {at} ({mode}; this process runs as uid {}): the API is for root and the daemon's own user; run lb as root",
                    // SAFETY: getuid cannot fail and touches no memory.
                    unsafe { libc::getuid() }
                )
            }
            _ => format!("cannot reach the daemon at {at}: {e}"),
        };
        Unreachable { message }
    }
}

/// The daemon took the request and went away before it answered (it was killed, or it
/// crashed): a change may have been saved or not, which only the daemon can say once it is
/// back. Its own exit code in the CLI.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct NoAnswer {
    pub message: String,
}

/// A client of the daemon at one socket.
pub struct Client {
    socket: PathBuf,
    /// Where the user names the socket, for the hint when it is not there.
    named_by: &'static str,
}

impl Client {
    /// A client of the socket the CLI was given (`--socket`, `LB_SOCKET`).
    pub fn new(socket: &Path) -> Self {
        Self::named_by(socket, "--socket or LB_SOCKET")
    }

    /// A client of `socket`, which the user names in `named_by` (lb-cni: the conflist's
    /// `socket`).
    pub fn named_by(socket: &Path, named_by: &'static str) -> Self {
        Client {
            socket: socket.to_path_buf(),
            named_by,
        }
    }

    /// Sends `request` and reads the reply as `T`; a refusal is an error with the daemon's
    /// message (and, for a change saved but not applied, says so).
    pub fn call<T: DeserializeOwned>(&self, request: &Request) -> Result<T> {
        let (method, path, body) = request.to_http();
        let sent = self.send(method, &path, body.unwrap_or_default());
        let (status, reply) = match sent {
            Err(e) if request.mutates() && e.downcast_ref::<NoAnswer>().is_some() => {
                return Err(NoAnswer {
                    message: format!(
                        "{e:#}: the change may have been saved before the daemon went; once it is back, `lb status` gives the store's revision and `lb state` the desired state (or `lb watch --from REVISION` what changed after a revision you read)"
                    ),
                }
                .into());
            }
            r => r?,
        };
        if !status.is_success() {
            return Err(refusal(status, &reply));
        }
        serde_json::from_slice(&reply)
            .with_context(|| format!("the daemon's reply to {path} is not what the CLI reads"))
    }

    /// Sends one request as given and returns the status and body (blocking).
    pub fn send(&self, method: Method, path: &str, body: Vec<u8>) -> Result<(StatusCode, Bytes)> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the client's runtime")?
            .block_on(self.send_async(method, path, body))
    }

    /// Watches the daemon's changes (`GET /v1/watch`), from after revision `from`: calls
    /// `on` with each event line as it arrives, until `on` says to stop (false), the daemon
    /// ends the stream, or the connection goes.
    pub fn watch(&self, from: Option<u64>, mut on: impl FnMut(&str) -> bool) -> Result<()> {
        let (_, path, _) = Request::Watch { from }.to_http();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the client's runtime")?
            .block_on(async {
                let (status, mut body, conn) = self.open(Method::GET, &path, Vec::new()).await?;
                if !status.is_success() {
                    let reply = body.collect().await?.to_bytes();
                    return Err(refusal(status, &reply));
                }
                let mut pending: Vec<u8> = Vec::new();
                while let Some(frame) = body.frame().await {
                    let Ok(data) = frame.context("reading the watch")?.into_data() else {
                        continue;
                    };
                    pending.extend_from_slice(&data);
                    while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=end).collect();
                        if !on(String::from_utf8_lossy(&line[..end]).as_ref()) {
                            conn.abort();
                            return Ok(());
                        }
                    }
                }
                conn.abort();
                Ok(())
            })
    }

    async fn send_async(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Bytes)> {
        let socket = self.socket.display();
        let (status, body, conn) = self.open(method, path, body).await?;
        let reply = (body.collect().await)
            .map_err(|e| NoAnswer {
                message: format!("the daemon at {socket} stopped answering: {e}"),
            })?
            .to_bytes();
        conn.abort();
        Ok((status, reply))
    }

    /// Sends one request; returns the status, the body as it comes, and the connection's
    /// task (aborted once the body is read).
    async fn open(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(
        StatusCode,
        hyper::body::Incoming,
        tokio::task::JoinHandle<hyper::Result<()>>,
    )> {
        let socket = self.socket.display();
        let stream = (tokio::net::UnixStream::connect(&self.socket).await)
            .map_err(|e| Unreachable::new(&self.socket, self.named_by, &e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("talking to {socket}"))?;
        let conn = tokio::spawn(conn);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "lb");
        if !body.is_empty() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .with_context(|| format!("building the request for {path}"))?;
        let response = (sender.send_request(request).await).map_err(|e| NoAnswer {
            message: format!("the daemon at {socket} did not answer: {e}"),
        })?;
        Ok((response.status(), response.into_body(), conn))
    }
}

/// The daemon's refusal `reply` (with `status`) as an error.
fn refusal(status: StatusCode, reply: &[u8]) -> anyhow::Error {
    match serde_json::from_slice::<ErrorReply>(reply) {
        Ok(reply) => Refused { status, reply }.into(),
        Err(_) => anyhow!(
            "the daemon answered {status}: {}",
            String::from_utf8_lossy(reply)
        ),
    }
}
