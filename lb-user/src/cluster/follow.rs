//! A daemon's side of the cluster: following the services prefix (list at a revision, then
//! watch from the next one) and reporting the node's status under a lease.
//!
//! Contracts:
//! - Order: updates are sent in the order etcd committed them, each revision once: a listing
//!   (the whole prefix as of its revision), then the changes of each later revision in
//!   increasing order. After a lost connection the watch resumes from the revision after the
//!   last one sent; only a compacted history (or no revision to resume from) lists again.
//! - Outages: contact lost is sent as [`Update::Down`] with the reason, and contact is tried
//!   again after a backoff that doubles from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`]. Nothing
//!   here ever asks the daemon to drop what it serves.
//! - Liveness: a watch that neither delivers nor answers a progress request within
//!   [`SILENT`] is taken as lost (a partitioned member keeps a TCP connection open).
use std::time::Duration;

use anyhow::{Result, bail};

use super::{
    Cluster, NodeStatus, TIMEOUT,
    etcd::{Change, Etcd, Listing, Watched},
};

pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(3);
/// How often the watch is asked for its progress (the node's lag is as fresh as this).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// A watch silent this long after a progress request is lost.
const SILENT: Duration = Duration::from_secs(5);
/// Keys a page of the listing reads.
const PAGE: i64 = 1000;
/// The lease of a node's status key: a node gone drops out of `lb nodes` after it.
pub const STATUS_TTL: Duration = Duration::from_secs(10);

/// What the follower tells the daemon.
#[derive(Debug)]
pub enum Update {
    /// The whole prefix as of a revision: first contact without a revision to resume from,
    /// or the history to resume from is compacted.
    Listing(Listing),
    /// The changes of one revision.
    Changes { revision: i64, changes: Vec<Change> },
    /// Every change up to `revision` has been sent.
    Progress { revision: i64 },
    /// Contact lost, or not made: why.
    Down(String),
}

/// Follows `cluster`'s services from `from` (the revision the daemon's services are as of;
/// 0: none, list first), sending each update through `send` until it returns false.
pub async fn follow(cluster: Cluster, from: i64, send: impl Fn(Update) -> bool) {
    let mut next = if from > 0 { Some(from + 1) } else { None };
    let mut backoff = FIRST_BACKOFF;
    loop {
        let mut contact = false;
        let e = session(&cluster, &mut next, &mut contact, &send).await;
        let Err(e) = e else {
            // The daemon is gone.
            return;
        };
        if contact {
            backoff = FIRST_BACKOFF;
        }
        tracing::warn!(error = %format!("{e:#}"), retry_in = ?backoff, "cluster unreachable; serving the last services applied");
        if !send(Update::Down(format!("{e:#}"))) {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection's worth of following; `Ok` only when `send` says the daemon is gone.
async fn session(
    cluster: &Cluster,
    next: &mut Option<i64>,
    contact: &mut bool,
    send: &impl Fn(Update) -> bool,
) -> Result<()> {
    let mut etcd = Etcd::connect_to(&cluster.endpoints, &cluster.tls, TIMEOUT).await?;
    let prefix = cluster.services();
    loop {
        let from = match *next {
            Some(r) => r,
            None => {
                let listing = etcd.list(&prefix, PAGE).await?;
                *contact = true;
                let r = listing.revision;
                if !send(Update::Listing(listing)) {
                    return Ok(());
                }
                *next = Some(r + 1);
                r + 1
            }
        };
        let mut watch = etcd.watch(&prefix, from).await?;
        let mut ask = tokio::time::interval(PROGRESS_EVERY);
        let mut answered = tokio::time::Instant::now();
        loop {
            tokio::select! {
                w = watch.next() => {
                    answered = tokio::time::Instant::now();
                    match w? {
                        None => bail!("etcd ended the watch"),
                        Some(Watched::Compacted { compact_revision }) => {
                            tracing::info!(from, compact_revision, "the history to resume from is compacted: listing again");
                            *next = None;
                            break;
                        }
                        Some(Watched::Progress { revision })
                            if next.is_some_and(|n| revision + 1 < n) =>
                        {
                            // Behind what was applied: a new or restored etcd, whose history
                            // is not the one followed.
                            tracing::warn!(revision, applied = next.map_or(0, |n| n - 1), "etcd's revision went back (a new or restored cluster): listing again");
                            *next = None;
                            break;
                        }
                        Some(Watched::Progress { revision }) => {
                            *contact = true;
                            if !send(Update::Progress { revision }) {
                                return Ok(());
                            }
                        }
                        Some(Watched::Changes(changes)) => {
                            *contact = true;
                            for (revision, changes) in by_revision(changes) {
                                if !send(Update::Changes { revision, changes }) {
                                    return Ok(());
                                }
                                *next = Some(revision + 1);
                            }
                        }
                    }
                }
                _ = ask.tick() => {
                    if answered.elapsed() > SILENT {
                        bail!("etcd's watch did not answer for {} s", SILENT.as_secs());
                    }
                    watch.request_progress().await?;
                }
            }
        }
    }
}

fn revision_of(c: &Change) -> i64 {
    match c {
        Change::Put(kv) => kv.mod_revision,
        Change::Delete { mod_revision, .. } => *mod_revision,
    }
}

/// A watch response's changes, one group per revision, in order.
fn by_revision(changes: Vec<Change>) -> Vec<(i64, Vec<Change>)> {
    let mut out: Vec<(i64, Vec<Change>)> = Vec::new();
    for c in changes {
        let r = revision_of(&c);
        match out.last_mut() {
            Some((last, group)) if *last == r => group.push(c),
            _ => out.push((r, vec![c])),
        }
    }
    out
}

/// Keeps `status` (the newest the daemon sent) under `nodes/NODE` with a lease of
/// [`STATUS_TTL`], rewritten as it changes, until the sender is dropped.
pub async fn publish(cluster: Cluster, mut status: tokio::sync::watch::Receiver<NodeStatus>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        match publish_session(&cluster, &mut status).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %format!("{e:#}"), "reporting the node's status to the cluster");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

async fn publish_session(
    cluster: &Cluster,
    status: &mut tokio::sync::watch::Receiver<NodeStatus>,
) -> Result<()> {
    let mut etcd = Etcd::connect_to(&cluster.endpoints, &cluster.tls, TIMEOUT).await?;
    let value = |s: &NodeStatus| serde_json::to_vec(s).expect("a status serializes");
    let (key, first) = {
        let s = status.borrow_and_update();
        (cluster.node_key(&s.node), value(&s))
    };
    let lease = etcd.put_leased(&key, &first, STATUS_TTL).await?;
    let mut renew = tokio::time::interval(STATUS_TTL / 3);
    loop {
        tokio::select! {
            changed = status.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let v = value(&status.borrow_and_update());
                etcd.put_on(&key, &v, lease).await?;
            }
            _ = renew.tick() => {
                if !etcd.keep_alive(lease).await? {
                    bail!("the status key's lease expired");
                }
            }
        }
    }
}
