//! The daemon's process: choosing the dataplane, the actor thread that owns the [`Daemon`],
//! the API socket and the metrics endpoint.
use std::{
    collections::BTreeMap, os::unix::fs::PermissionsExt as _, path::Path, sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{APPLIED, Daemon, DataplaneChoice, Options, STATE, create_private_dir, read_state};
use crate::{
    api::{self, MAX_REQUEST, Request, Response},
    core::model::Network,
    dataplane::{Dataplane, EbpfDataplane, NftDataplane, nft, probe},
    netlink::in_netns,
};

enum Job {
    Api(Request, tokio::sync::oneshot::Sender<Response>),
    Metrics(tokio::sync::oneshot::Sender<String>),
}

fn actor(mut daemon: Daemon, jobs: mpsc::Receiver<Job>, retry: Duration) {
    // Retries run on a clock of their own: a steady stream of requests (a monitor polling
    // `lb status`) must not postpone them.
    let mut next_retry = std::time::Instant::now() + retry;
    loop {
        let now = std::time::Instant::now();
        if now >= next_retry {
            daemon.retry();
            next_retry = now + retry;
        }
        match jobs.recv_timeout(next_retry.saturating_duration_since(now)) {
            Ok(Job::Api(req, reply)) => {
                let mutates = req.mutates();
                let resp = match daemon.handle(req) {
                    Ok(v) => Response::ok(v),
                    Err(e) => {
                        if mutates {
                            tracing::warn!(error = %format!("{e:#}"), "request refused or not applied");
                        }
                        Response::err(&e)
                    }
                };
                let _ = reply.send(resp);
            }
            Ok(Job::Metrics(reply)) => {
                let _ = reply.send(daemon.metrics());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Picks the dataplane: `auto` probes the kernel and falls back to nftables, saying why.
fn dataplane(opts: &Options) -> Result<(Box<dyn Dataplane>, String)> {
    let ebpf = || -> Result<Box<dyn Dataplane>> {
        let mut dp = EbpfDataplane::new(&opts.bpffs, opts.tc_mode)?.with_sizes(opts.map_sizes);
        dp.collect_every(opts.gc)?;
        Ok(Box::new(dp))
    };
    match opts.dataplane {
        DataplaneChoice::Nftables => Ok((
            Box::new(NftDataplane),
            "forced with --dataplane nftables".into(),
        )),
        DataplaneChoice::Ebpf => Ok((ebpf()?, "forced with --dataplane ebpf".into())),
        DataplaneChoice::Auto => match probe::probe(opts.tc_mode) {
            Ok(what) => Ok((ebpf()?, format!("auto: {what}"))),
            Err(e) => {
                let reason = format!("auto: fell back to nftables: {e:#}").replace('\n', " ");
                tracing::warn!("{reason}");
                Ok((Box::new(NftDataplane), reason))
            }
        },
    }
}

/// Every network this state dir knows of (applied or desired), for retiring the dataplane
/// that is not in use: unreadable files only mean less to clean up.
fn known_networks(state_dir: &Path) -> Vec<Network> {
    let mut out: BTreeMap<String, Network> = BTreeMap::new();
    for file in [APPLIED, STATE] {
        if let Ok(Some(s)) = read_state(&state_dir.join(file)) {
            for n in s.networks {
                out.insert(n.name.clone(), n);
            }
        }
    }
    out.into_values().collect()
}

/// Removes what the other dataplane left (a restart that switched dataplanes), so that two
/// never translate the same traffic. VIP aliases stay: the dataplane in use keeps them.
fn retire_other(in_use: &str, opts: &Options, networks: &[Network]) {
    let result = if in_use == "nftables" {
        retire_ebpf(opts, networks)
    } else {
        retire_nft(networks)
    };
    if let Err(e) = result {
        tracing::warn!(error = %format!("{e:#}"), "removing the other dataplane's leftovers");
    }
}

fn retire_ebpf(opts: &Options, networks: &[Network]) -> Result<()> {
    for n in networks {
        let dir = crate::dataplane::ebpf::pin_dir(&opts.bpffs, &n.name);
        let (ifaces, tc_mode) = (n.interfaces.clone(), opts.tc_mode);
        in_netns(n.netns.as_deref(), move || {
            crate::dataplane::ebpf::detach_all(&dir, &ifaces, tc_mode)
        })
        .with_context(|| format!("network {}: detaching the eBPF programs", n.name))?;
    }
    if opts.bpffs.exists() {
        EbpfDataplane::new(&opts.bpffs, opts.tc_mode)?.remove_others(&[])?;
    }
    Ok(())
}

fn retire_nft(networks: &[Network]) -> Result<()> {
    for n in networks {
        in_netns(n.netns.as_deref(), {
            let name = n.name.clone();
            move || nft::delete_table(&name)
        })
        .with_context(|| format!("network {}: deleting its nftables table", n.name))?;
    }
    NftDataplane.remove_others(&[]).map(drop)
}

/// Binds the API socket: refuses to steal it from a live daemon, replaces a stale one, and
/// leaves it readable and writable by root only.
fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another lb daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    Ok(listener)
}

async fn serve_conn(mut stream: tokio::net::UnixStream, jobs: mpsc::Sender<Job>) {
    let resp = match handle_conn_request(&mut stream).await {
        Ok(req) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if jobs.send(Job::Api(req, tx)).is_err() {
                Response::err(&anyhow::anyhow!("the daemon is stopping"))
            } else {
                rx.await
                    .unwrap_or_else(|_| Response::err(&anyhow::anyhow!("the daemon is stopping")))
            }
        }
        Err(e) => Response::err(&e),
    };
    let body = serde_json::to_vec(&resp).expect("a response always serializes");
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
    // A refused request (too large, too slow) may still be arriving. Closing with unread
    // bytes would reset the connection and the client would lose the answer already sent,
    // so the rest is read and dropped, for a bounded time.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::copy(&mut stream, &mut tokio::io::sink()),
    )
    .await;
}

async fn handle_conn_request(stream: &mut tokio::net::UnixStream) -> Result<Request> {
    let cred = stream
        .peer_cred()
        .context("reading the client's credentials")?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if cred.uid() != 0 && cred.uid() != me {
        bail!(
            "permission denied: uid {} may not use the lb API",
            cred.uid()
        );
    }
    let mut body = Vec::new();
    let mut limited = (&mut *stream).take(MAX_REQUEST as u64 + 1);
    tokio::time::timeout(Duration::from_secs(10), limited.read_to_end(&mut body))
        .await
        .context("the request did not arrive within 10s")?
        .context("reading the request")?;
    if body.len() > MAX_REQUEST {
        bail!("request larger than {MAX_REQUEST} bytes");
    }
    api::parse_request(&body)
}

async fn serve_metrics(listener: tokio::net::TcpListener, jobs: mpsc::Sender<Job>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let jobs = jobs.clone();
        tokio::spawn(async move {
            let mut req = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut req)).await;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let body = if jobs.send(Job::Metrics(tx)).is_ok() {
                rx.await.unwrap_or_default()
            } else {
                String::new()
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

/// Runs the daemon until SIGTERM or SIGINT. The dataplane stays in place when it stops: the
/// next daemon adopts it.
pub fn run(opts: Options) -> Result<()> {
    if let Some(addr) = opts.metrics
        && !addr.ip().is_loopback()
    {
        bail!("--metrics {addr}: the metrics endpoint listens on loopback only");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let (dp, reason) = dataplane(&opts)?;
    tracing::info!(dataplane = dp.name(), reason = %reason, "dataplane selected");
    retire_other(dp.name(), &opts, &known_networks(&opts.state_dir));
    let daemon = Daemon::new(&opts.state_dir, dp, reason)?;
    let (jobs, rx) = mpsc::channel();
    let retry = opts.retry;
    let actor = std::thread::Builder::new()
        .name("lb-actor".into())
        .spawn(move || actor(daemon, rx, retry))
        .context("starting the actor")?;
    let socket = opts.socket.clone();
    rt.block_on(async {
        let listener = bind_socket(&socket)?;
        if let Some(addr) = opts.metrics {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics endpoint {addr}"))?;
            tokio::spawn(serve_metrics(l, jobs.clone()));
        }
        tracing::info!(socket = %socket.display(), "listening");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                conn = listener.accept() => {
                    if let Ok((stream, _)) = conn {
                        tokio::spawn(serve_conn(stream, jobs.clone()));
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
    drop(jobs);
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = actor.join();
    Ok(())
}
