//! The daemon's HTTP endpoints: the API on its unix socket (bound 0600, callers checked by
//! their credentials, each request a job for the actor, watches streamed, cluster changes
//! written to etcd) and the unauthenticated metrics endpoint on loopback.
use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::{Arc, mpsc},
    time::Duration,
};

use anyhow::{Context as _, Result};
use http_body_util::BodyExt as _;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};

use super::{job::Job, metrics};
use crate::api::{self, ApiError, MAX_REQUEST, Request};

/// Binds the API socket (under the socket's lock: a file there is a stale one) with mode
/// 0600 from its first instant: it is bound in a private directory beside it (mode 0700),
/// restricted there, and renamed into place, so that no one but root and the daemon's user
/// can connect even between `bind` and `chmod` (peer credentials are checked too:
/// [`permitted`] answers anyone else 403).
pub(super) fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::DirBuilderExt as _;
    if path.exists() {
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let name = path
        .file_name()
        .context("the socket path has no file name")?;
    let mut private = path.as_os_str().to_owned();
    private.push(format!(".{}.d", std::process::id()));
    let private = std::path::PathBuf::from(private);
    // One left by a daemon that died here: nothing in it is of use.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    let inside = private.join(name);
    let bound = (|| -> Result<tokio::net::UnixListener> {
        let listener = tokio::net::UnixListener::bind(&inside)
            .with_context(|| format!("binding {}", inside.display()))?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {}", inside.display()))?;
        std::fs::rename(&inside, path)
            .with_context(|| format!("moving the socket to {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Serves one API connection.
pub(super) async fn serve_conn(
    stream: tokio::net::UnixStream,
    jobs: mpsc::Sender<Job>,
    cluster: Option<Arc<crate::cluster::Cluster>>,
) {
    let permitted = permitted(&stream);
    serve_http(stream, "API", move |req| {
        respond(req, permitted.clone(), jobs.clone(), cluster.clone())
    })
    .await;
}

/// Serves one connection of the API or the metrics endpoint: HTTP/1.1, any number of
/// requests, each answered in turn by `answer`.
async fn serve_http<S, F, Fut>(stream: S, what: &'static str, answer: F)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = hyper::Response<Body>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let answer = answer(req);
        async move { Ok::<_, std::convert::Infallible>(answer.await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "{what} connection");
    }
}

/// How long a request's head, and then its body, may take to arrive.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Root and the daemon's own user may use the API; anyone else is answered 403.
fn permitted(stream: &tokio::net::UnixStream) -> Result<(), ApiError> {
    let cred = stream.peer_cred().map_err(|e| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!("reading the client's credentials: {e}"),
        )
    })?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if cred.uid() != 0 && cred.uid() != me {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "permission denied: uid {} may not use the lb API",
                cred.uid()
            ),
        ));
    }
    Ok(())
}

type Body = http_body_util::combinators::BoxBody<hyper::body::Bytes, std::convert::Infallible>;

fn reply(status: StatusCode, body: &impl serde::Serialize) -> hyper::Response<Body> {
    let body = serde_json::to_vec(body).expect("a reply always serializes");
    response(status, body, "application/json")
}

fn response(
    status: StatusCode,
    body: impl Into<hyper::body::Bytes>,
    content_type: &'static str,
) -> hyper::Response<Body> {
    let mut resp = hyper::Response::new(http_body_util::Full::new(body.into()).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

fn refusal(e: &ApiError) -> hyper::Response<Body> {
    reply(e.status, &e.reply)
}

async fn respond(
    req: hyper::Request<hyper::body::Incoming>,
    permitted: Result<(), ApiError>,
    jobs: mpsc::Sender<Job>,
    cluster: Option<Arc<crate::cluster::Cluster>>,
) -> hyper::Response<Body> {
    if let Err(e) = permitted {
        return refusal(&e);
    }
    let (head, body) = req.into_parts();
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(e) => return refusal(&e),
    };
    let request = match api::route(&head.method, head.uri.path(), head.uri.query(), &body) {
        Ok(r) => r,
        Err(e) => return refusal(&e),
    };
    if let Request::Watch { from } = request {
        return watch(from, jobs).await;
    }
    if let Request::ClusterChange {
        change,
        if_revision,
    } = request
    {
        return cluster_change(cluster.as_deref(), change, if_revision).await;
    }
    let created = matches!(request, Request::NetworkAdd { .. });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stopping = || ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping");
    let (answer, revision) = if jobs.send(Job::Api(request, tx)).is_err() {
        (Err(stopping()), None)
    } else {
        match rx.await {
            Ok((answer, revision)) => (answer, Some(revision)),
            Err(_) => (Err(stopping()), None),
        }
    };
    let mut resp = match answer {
        Ok(r) if created => reply(StatusCode::CREATED, &r),
        Ok(r) => reply(StatusCode::OK, &r),
        Err(e) => refusal(&e),
    };
    // What the answer was given at: a watcher reading the state watches from it.
    if let Some(r) = revision {
        resp.headers_mut().insert(REVISION, r.into());
    }
    resp
}

/// `POST /v1/cluster/changes`: the change written to etcd as `lb --cluster` writes it. 404
/// without `--cluster`; 409 on a conflict (the key is not at the revision read or given);
/// 400 for a change the rules refuse; 503 when no member answers.
async fn cluster_change(
    cluster: Option<&crate::cluster::Cluster>,
    change: crate::core::edit::Edit,
    if_revision: Option<i64>,
) -> hyper::Response<Body> {
    let Some(c) = cluster else {
        return refusal(&ApiError::not_found(
            "this daemon follows no cluster (lb daemon --cluster etcd://…)",
        ));
    };
    match crate::cluster::write::edit(c, change, if_revision).await {
        Ok((changes, revision)) => reply(
            StatusCode::OK,
            &api::Done {
                done: format!("written to the cluster at etcd revision {revision}"),
                changes,
                dry_run: false,
                revision: Some(revision as u64),
            },
        ),
        Err(e) => {
            let status = if e
                .downcast_ref::<crate::cluster::write::Conflict>()
                .is_some()
            {
                StatusCode::CONFLICT
            } else if e.chain().any(|c| c.is::<etcd_client::Error>())
                || format!("{e}").starts_with("no etcd member")
            {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::BAD_REQUEST
            };
            refusal(&ApiError::new(status, format!("{e:#}")))
        }
    }
}

/// The header every API answer carries: the store's revision when it was given.
pub const REVISION: &str = "lb-revision";

/// `GET /v1/watch`: the watcher's history, then each event as the actor sends it, one JSON
/// line each, until the client goes, the daemon stops, or the watcher falls more than
/// [`super::WATCH_BACKLOG`] events behind (a last line says so; it watches again from the
/// last revision it read).
async fn watch(from: Option<u64>, jobs: mpsc::Sender<Job>) -> hyper::Response<Body> {
    use tokio::sync::broadcast::error::RecvError;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stopping = || ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping");
    let watching = if jobs.send(Job::Watch(from, tx)).is_err() {
        Err(stopping())
    } else {
        rx.await.unwrap_or_else(|_| Err(stopping()))
    };
    let (history, events) = match watching {
        Ok(w) => w,
        Err(e) => return refusal(&e),
    };
    let frames = futures_util::stream::unfold(
        (history.into_iter(), events, false),
        |(mut history, mut events, ended)| async move {
            if ended {
                return None;
            }
            let frame = |line| Ok(hyper::body::Frame::data(line));
            if let Some(line) = history.next() {
                return Some((frame(line), (history, events, false)));
            }
            match events.recv().await {
                Ok(line) => Some((frame(line), (history, events, false))),
                Err(RecvError::Lagged(n)) => {
                    let line = format!(
                        "{{\"error\":\"fell {n} events behind: watch again from the last revision read\"}}\n"
                    );
                    Some((frame(line.into()), (history, events, true)))
                }
                Err(RecvError::Closed) => None,
            }
        },
    );
    let mut resp = hyper::Response::new(http_body_util::StreamBody::new(frames).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-ndjson"),
    );
    resp
}

/// The whole body, at most [`MAX_REQUEST`] bytes. A larger one is read to its end and
/// dropped (within the read timeout) before the 413 goes out: closing a unix socket with
/// unread bytes resets it, and the client would lose the answer.
async fn read_body(mut body: hyper::body::Incoming) -> Result<Vec<u8>, ApiError> {
    let read = async {
        let mut out = Vec::new();
        let mut too_large = false;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > MAX_REQUEST {
                    too_large = true;
                    out = Vec::new();
                }
                if !too_large {
                    out.extend_from_slice(&data);
                }
            }
        }
        if too_large {
            return Err(ApiError::too_large());
        }
        Ok(out)
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {}s",
                    READ_TIMEOUT.as_secs()
                ),
            ))
        })
}

/// The metrics endpoint: `GET /metrics` (or `HEAD`), 404 on any other path.
pub(super) async fn serve_metrics(listener: tokio::net::TcpListener, jobs: mpsc::Sender<Job>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let jobs = jobs.clone();
        tokio::spawn(serve_http(stream, "metrics", move |req| {
            metrics_answer(req, jobs.clone())
        }));
    }
}

async fn metrics_answer(
    req: hyper::Request<hyper::body::Incoming>,
    jobs: mpsc::Sender<Job>,
) -> hyper::Response<Body> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.uri().path() != "/metrics" {
        return response(
            StatusCode::NOT_FOUND,
            format!("{} not found: metrics are on /metrics\n", req.uri().path()),
            PLAIN,
        );
    }
    if !matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD) {
        let mut resp = response(
            StatusCode::METHOD_NOT_ALLOWED,
            "/metrics answers GET\n",
            PLAIN,
        );
        resp.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return resp;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stopping = || {
        response(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is stopping\n",
            PLAIN,
        )
    };
    if jobs.send(Job::Metrics(tx)).is_err() {
        return stopping();
    }
    let Ok(scrape) = rx.await else {
        return stopping();
    };
    // The actor handed over its part; the rest is read on a blocking thread here.
    match tokio::task::spawn_blocking(move || scrape.render()).await {
        Ok(body) => response(StatusCode::OK, body, metrics::CONTENT_TYPE),
        Err(e) => response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the metrics: {e}\n"),
            PLAIN,
        ),
    }
}

/// `--metrics`: an address, or a `host:port` whose name resolves to loopback only (the
/// endpoint is unauthenticated). The first IPv4 address of a name, else its first.
pub fn metrics_addr(arg: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    let addrs: Vec<SocketAddr> = (arg.to_socket_addrs())
        .map_err(|e| format!("{arg}: not an address or host:port that resolves: {e}"))?
        .collect();
    if let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "{arg} resolves to {}, which is not loopback: the metrics endpoint listens on loopback only",
            a.ip()
        ));
    }
    (addrs.iter().find(|a| a.is_ipv4()))
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{arg} resolves to no address"))
}
