//! The daemon's process: choosing the dataplane, the actor thread that owns the [`Daemon`],
//! the API socket and the metrics endpoint.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    sync::{Arc, mpsc},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use http_body_util::BodyExt as _;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};

use super::{
    APPLIED, Daemon, DataplaneChoice, Options, create_private_dir, metrics, read_state, store,
};
use crate::{
    api::{self, ApiError, MAX_REQUEST, Reply, Request},
    cluster::follow,
    core::model::{DesiredState, Network},
    dataplane::{Dataplane, EbpfDataplane, Kind, NftDataplane, probe},
    lock::Lock,
    node::watch,
};

/// A watcher's history (JSON lines) and its subscription to what follows.
type Watching = (
    Vec<hyper::body::Bytes>,
    tokio::sync::broadcast::Receiver<hyper::body::Bytes>,
);

enum Job {
    /// A request, answered with the store's revision once it is done.
    Api(
        Request,
        tokio::sync::oneshot::Sender<(Result<Reply, ApiError>, u64)>,
    ),
    Metrics(tokio::sync::oneshot::Sender<metrics::Scrape>),
    /// A new watcher: its history and its subscription, taken between two changes.
    Watch(
        Option<u64>,
        tokio::sync::oneshot::Sender<Result<Watching, ApiError>>,
    ),
    /// Something in a namespace changed (from [`watch`]).
    Node(watch::NetnsKey, watch::Changes),
    /// The cluster's services changed, or contact with etcd did (from [`follow`]).
    Cluster(follow::Update),
    /// The daemon is stopping. Explicit, because the actor holds a sender of its own (the
    /// watchers report through it), so the channel never disconnects while it runs.
    Stop,
}

fn actor(
    mut daemon: Daemon,
    jobs: mpsc::Receiver<Job>,
    to_self: mpsc::Sender<Job>,
    retry: Duration,
) {
    let report: watch::Report =
        Arc::new(move |ns, changes| to_self.send(Job::Node(ns, changes)).is_ok());
    let mut watcher = watch::Watcher::default();
    // Retries run on a clock of their own: a steady stream of requests (a monitor polling
    // `lb status`) must not postpone them.
    let mut next_retry = std::time::Instant::now() + retry;
    loop {
        // After the answer of the last job (see `Daemon::record`).
        daemon.record();
        // The namespaces to follow change only with the desired state; a thread whose
        // namespace went away is replaced here once it is back.
        watcher.sync(&daemon.netns_keys(), &report);
        let now = std::time::Instant::now();
        if now >= next_retry {
            daemon.retry();
            next_retry = now + retry;
        }
        // Awake at least as often as a pending record is due.
        let wait = next_retry
            .saturating_duration_since(now)
            .min(super::RECORD_EVERY);
        match jobs.recv_timeout(wait) {
            Ok(Job::Api(req, reply)) => {
                let mutates = req.mutates();
                let answer = daemon.handle(req);
                if let Err(e) = &answer
                    && mutates
                {
                    tracing::warn!(status = %e.status, error = %e.reply.error, "request refused or not applied");
                }
                let _ = reply.send((answer, daemon.revision()));
            }
            Ok(Job::Metrics(reply)) => {
                let _ = reply.send(daemon.metrics());
            }
            Ok(Job::Watch(from, reply)) => {
                let _ = reply.send(daemon.watch(from));
            }
            Ok(Job::Node(ns, changes)) => daemon.node_changed(&ns, changes),
            Ok(Job::Cluster(update)) => daemon.cluster_update(update),
            Ok(Job::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                daemon.record_now();
                return;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Picks the dataplane: `auto` probes the kernel and falls back to nftables, saying why.
fn dataplane(opts: &Options) -> Result<(Box<dyn Dataplane>, String)> {
    let ebpf = || -> Result<Box<dyn Dataplane>> {
        let mut dp = EbpfDataplane::new(&opts.bpffs, opts.tc_mode)?
            .on_incompatible(opts.on_incompatible)
            .with_sizes(opts.map_sizes);
        dp.collect_every(opts.gc)?;
        Ok(Box::new(dp))
    };
    match opts.dataplane {
        DataplaneChoice::Nftables => Ok((
            Box::new(NftDataplane::default()),
            "forced with --dataplane nftables".into(),
        )),
        DataplaneChoice::Ebpf => Ok((ebpf()?, "forced with --dataplane ebpf".into())),
        DataplaneChoice::Auto => match probe::probe(opts.tc_mode) {
            Ok(what) => Ok((ebpf()?, format!("auto: {what}"))),
            Err(e) => {
                let reason = format!("auto: fell back to nftables: {e:#}").replace('\n', " ");
                tracing::warn!("{reason}");
                Ok((Box::new(NftDataplane::default()), reason))
            }
        },
    }
}

/// Every network this state dir knows of (applied, or desired in `desired`), for retiring
/// the dataplane that is not in use: an unreadable applied.json only means less to clean up.
fn known_networks(state_dir: &Path, desired: &DesiredState) -> Vec<Network> {
    let mut out: BTreeMap<String, Network> = BTreeMap::new();
    if let Ok(Some(s)) = read_state(&state_dir.join(APPLIED)) {
        for n in s.networks {
            out.insert(n.name.clone(), n);
        }
    }
    for n in &desired.networks {
        out.insert(n.name.clone(), n.clone());
    }
    out.into_values().collect()
}

/// Retires the dataplane not in use (a restart that switched dataplanes), so that two never
/// translate the same traffic.
fn retire_other(in_use: Kind, opts: &Options, networks: &[Network]) {
    let mut other: Box<dyn Dataplane> = match in_use {
        Kind::Nftables => Box::new(EbpfDataplane::retiring(&opts.bpffs, opts.tc_mode)),
        Kind::Ebpf => Box::new(NftDataplane::default()),
        // Never run by `lb daemon`: it has no other dataplane to retire.
        Kind::Recording => return,
    };
    if let Err(e) = other.retire(networks) {
        tracing::warn!(error = %format!("{e:#}"), "removing the other dataplane's leftovers");
    }
}

/// What a start created (files, then directories) and removes again if it fails before it
/// serves: a failed start leaves nothing behind. Disarmed once the daemon serves.
struct Created {
    paths: Vec<std::path::PathBuf>,
    armed: bool,
}

impl Created {
    fn new() -> Self {
        Self {
            paths: Vec::new(),
            armed: true,
        }
    }

    /// Runs `make`, which may create `path`; remembers `path` if it did.
    fn track<T>(&mut self, path: &Path, make: impl FnOnce() -> Result<T>) -> Result<T> {
        let existed = path.exists();
        let out = make();
        if !existed && path.exists() {
            self.paths.push(path.to_path_buf());
        }
        out
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Latest first: a file before the directory it was created in. A directory is only
        // removed if empty (something else may have put a file there since).
        for p in self.paths.iter().rev() {
            let _ = if p.is_dir() {
                std::fs::remove_dir(p)
            } else {
                std::fs::remove_file(p)
            };
        }
    }
}

/// The locks that make this daemon the only writer of its state dir, its bpffs dir and its
/// socket, taken before anything is read or changed; held until the process exits.
fn take_locks(opts: &Options, created: &mut Created) -> Result<Vec<Lock>> {
    created.track(&opts.state_dir, || create_private_dir(&opts.state_dir))?;
    let mut locks = vec![Lock::dir(&opts.state_dir, "the state dir")?];
    // No bpffs dir (and none can be made) means nothing of lb's is pinned there and no eBPF
    // dataplane can be run on it: there is nothing to guard.
    match created.track(&opts.bpffs, || Lock::dir(&opts.bpffs, "the bpffs dir")) {
        Ok(l) => locks.push(l),
        Err(e) if !opts.bpffs.is_dir() => {
            tracing::info!(error = %format!("{e:#}"), "no bpffs dir to lock");
        }
        Err(e) => return Err(e),
    }
    if let Some(dir) = opts.socket.parent() {
        created.track(dir, || create_private_dir(dir))?;
    }
    let mut lock = opts.socket.clone().into_os_string();
    lock.push(".lock");
    let lock = Path::new(&lock);
    locks.push(created.track(lock, || Lock::file(lock, "the API socket's lock"))?);
    // A daemon that predates the lock file would not hold it.
    if std::os::unix::net::UnixStream::connect(&opts.socket).is_ok() {
        bail!(
            "another lb daemon is listening on {} (nothing was changed)",
            opts.socket.display()
        );
    }
    Ok(locks)
}

/// Binds the API socket (under the socket's lock: a file there is a stale one) with mode
/// 0600 from its first instant: it is bound in a private directory beside it (mode 0700),
/// restricted there, and renamed into place, so that no one but root and the daemon's user
/// can connect even between `bind` and `chmod` (peer credentials are checked too:
/// [`permitted`] answers anyone else 403).
fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener> {
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
async fn serve_conn(
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
async fn serve_metrics(listener: tokio::net::TcpListener, jobs: mpsc::Sender<Job>) {
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

/// Runs the daemon until SIGTERM or SIGINT. The dataplane stays in place when it stops: the
/// next daemon adopts it.
///
/// A start that fails leaves nothing behind: capabilities are checked before anything else,
/// the metrics port is bound before a dataplane is chosen, and what the start created (the
/// socket, its lock file, directories) is removed again ([`Created`]).
pub fn run(opts: Options) -> Result<()> {
    super::caps::check(opts.dataplane)?;
    if let Some(addr) = opts.metrics
        && !addr.ip().is_loopback()
    {
        bail!("--metrics {addr}: the metrics endpoint listens on loopback only");
    }
    let fds = crate::node::hold::raise_fd_limit();
    tracing::debug!(limit = fds, "open files");
    let mut created = Created::new();
    // First of all: a second daemon on the same state dir, bpffs or socket stops here, before
    // it chooses a dataplane, retires the other one or reconciles anything.
    let _locks = take_locks(&opts, &mut created)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let socket = opts.socket.clone();
    // The metrics port, which another process may hold, is bound before a dataplane is
    // chosen, so that a taken one fails the start with nothing applied.
    let metrics_listener = match opts.metrics {
        Some(addr) => Some({
            let _in_rt = rt.enter();
            std::net::TcpListener::bind(addr)
                .and_then(|l| {
                    l.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(l)
                })
                .with_context(|| {
                    format!("binding the metrics endpoint {addr} (nothing was changed)")
                })?
        }),
        None => None,
    };
    // The store before anything on the node: one that cannot be read stops the start here,
    // with the dataplane as it is.
    let store_file = opts.state_dir.join(store::FILE);
    let opened = created.track(&store_file, || {
        store::Store::open(&opts.state_dir, opts.import.as_deref())
    })?;
    tracing::info!(store = %opened.store.path().display(), revision = opened.store.revision(), origin = ?opened.origin, "desired state opened");
    let (dp, reason) = dataplane(&opts)?;
    tracing::info!(dataplane = %dp.kind(), reason = %reason, "dataplane selected");
    retire_other(
        dp.kind(),
        &opts,
        &known_networks(&opts.state_dir, &opened.state),
    );
    // With --cluster, the cluster's services as the store last heard them are served from the
    // start; etcd is followed once the daemon serves (an etcd away delays nothing).
    let (cluster, status) = match &opts.cluster {
        Some((c, node)) => {
            let (n, status) =
                super::cluster::ClusterNode::new(c.clone(), node.clone(), opened.store.cluster()?);
            tracing::info!(cluster = %c.display(), prefix = %c.prefix, node = %node, revision = n.revision(), "following the cluster's services");
            (Some(n), Some(status))
        }
        None => {
            let (revision, entries) = opened.store.cluster()?;
            if !entries.is_empty() {
                tracing::warn!(
                    services = entries.len(),
                    revision,
                    "the store has the cluster's services of an earlier --cluster run: not served without --cluster"
                );
            }
            (None, None)
        }
    };
    let from = cluster.as_ref().map_or(0, |c| c.revision());
    let daemon = Daemon::with_store(opened, &opts.state_dir, dp, reason, cluster)?;
    // The socket last (under its lock, so nothing else binds it meanwhile): a client (and
    // the tests' harness) that can connect talks to a daemon that has applied its state.
    let listener = {
        let _in_rt = rt.enter();
        created.track(&socket, || bind_socket(&socket))?
    };
    let (jobs, rx) = mpsc::channel();
    let retry = opts.retry;
    let actor = std::thread::Builder::new()
        .name("lb-actor".into())
        .spawn({
            let to_self = jobs.clone();
            move || actor(daemon, rx, to_self, retry)
        })
        .context("starting the actor")?;
    // Serving from here: what the start created is the running daemon's.
    created.armed = false;
    rt.block_on(async {
        if let Some(l) = metrics_listener {
            if let Ok(addr) = l.local_addr() {
                tracing::info!("metrics served on http://{addr}/metrics");
            }
            tokio::spawn(serve_metrics(l, jobs.clone()));
        }
        tracing::info!("API listening on {}", socket.display());
        let writes_to = opts.cluster.as_ref().map(|(c, _)| Arc::new(c.clone()));
        if let (Some((c, _)), Some(status)) = (&opts.cluster, status) {
            let jobs = jobs.clone();
            tokio::spawn(follow::follow(c.clone(), from, move |u| {
                jobs.send(Job::Cluster(u)).is_ok()
            }));
            tokio::spawn(follow::publish(c.clone(), status));
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                conn = listener.accept() => {
                    if let Ok((stream, _)) = conn {
                        tokio::spawn(serve_conn(stream, jobs.clone(), writes_to.clone()));
                    }
                }
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        anyhow::Ok(())
    })?;
    tracing::info!("stopping; the dataplane stays in place for the next daemon");
    let _ = std::fs::remove_file(&socket);
    let _ = jobs.send(Job::Stop);
    drop(jobs);
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = actor.join();
    Ok(())
}
