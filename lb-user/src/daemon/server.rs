//! The daemon's process: choosing the dataplane, the locks and what a failed start leaves
//! behind, and the actor thread that owns the [`Daemon`] and answers the jobs the HTTP
//! endpoints ([`super::http`]) and the node and cluster watchers send it.
use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, mpsc},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use super::{
    APPLIED, Daemon, DataplaneChoice, Options, create_private_dir,
    http::{bind_socket, serve_conn, serve_metrics},
    job::Job,
    read_state, store,
};
use crate::{
    cluster::follow,
    core::model::{DesiredState, Network},
    dataplane::{Dataplane, EbpfDataplane, Kind, NftDataplane, probe},
    lock::Lock,
    node::watch,
};

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
