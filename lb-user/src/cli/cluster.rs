//! The commands that act on the cluster (`--cluster`): written to etcd directly, no daemon
//! needed (a CI job, an orchestrator's agent).
use anyhow::{Context as _, Result, bail};
use lb_user::{
    api::Done,
    cluster::{self, Cluster, write},
    core::edit::Edit,
};

use super::{args::Global, render};

/// The cluster `--cluster` names, if it names one.
pub fn of(global: &Global) -> Result<Option<Cluster>> {
    let Some(url) = &global.cluster else {
        return Ok(None);
    };
    let tls = cluster::Tls {
        ca: global.cluster_ca.clone(),
        cert: global.cluster_cert.clone(),
        key: global.cluster_key.clone(),
    };
    Cluster::parse(url, &global.cluster_prefix, tls).map(Some)
}

/// Runs `f` to its end on a runtime of this thread, SIGPIPE ignored meanwhile: a member that
/// closes a connection (etcd refusing a client certificate) makes the next write to it fail
/// with EPIPE, and hyper writes with writev, which raises SIGPIPE; the CLI's default
/// disposition (`main.rs`, for pipes into `head`) would kill the process before it says why.
fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    // SAFETY: SIG_IGN is a valid disposition; the previous one is put back below, once the
    // runtime (the only thread that talks to etcd) is gone.
    let before = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let out = runtime.block_on(f);
    drop(runtime);
    // SAFETY: the disposition read above.
    unsafe { libc::signal(libc::SIGPIPE, before) };
    out
}

/// One service edit, written with compare-and-swap; prints what it changed.
pub fn edit(global: &Global, c: &Cluster, e: Edit, if_revision: Option<i64>) -> Result<()> {
    let what = e.describe();
    let (changes, revision) = block_on(write::edit(c, e, if_revision))?;
    render::done(
        global.json,
        &Done {
            done: format!("{what} in the cluster (etcd revision {revision})"),
            changes,
            dry_run: false,
            revision: Some(revision as u64),
        },
    );
    Ok(())
}

/// `lb --cluster state`: the cluster's services, by network.
pub fn state(global: &Global, c: &Cluster) -> Result<()> {
    let (_, state) = block_on(write::state(c))?;
    if global.json {
        println!("{}", serde_json::to_string(&state)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&state)?);
    }
    Ok(())
}

/// `lb --cluster apply -f`: the cluster's services made the file's.
pub fn apply(global: &Global, c: &Cluster, text: &str, name: &str, dry_run: bool) -> Result<()> {
    if dry_run {
        bail!(
            "--dry-run checks against a node: leave out --cluster, or apply to a test prefix (--cluster-prefix)"
        );
    }
    let state = write::ClusterState::from_json(text).with_context(|| name.to_owned())?;
    let applied = block_on(write::apply(c, &state))?;
    render::show(global.json, &applied, |a| {
        println!(
            "the cluster's services are {name}'s: {} written, {} deleted, {} unchanged, in {} transactions (etcd revision {})",
            a.written, a.deleted, a.unchanged, a.transactions, a.revision
        );
    });
    Ok(())
}

/// `lb --cluster nodes`.
pub fn nodes(global: &Global, c: &Cluster) -> Result<()> {
    let (revision, nodes) = block_on(write::nodes(c))?;
    render::nodes(global.json, revision, &nodes);
    Ok(())
}

/// A command that acts on the node, given --cluster.
pub fn on_the_node(command: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "lb {command} acts on the node (its daemon): leave out --cluster (or unset LB_CLUSTER); the cluster takes service set|rm|backend, state, apply and nodes"
    )
}
