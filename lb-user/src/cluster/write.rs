//! Writing the cluster's services: what `lb --cluster …` does, with no daemon needed.
//!
//! Contracts:
//! - Compare-and-swap: a write reads the keys it changes, makes the change as a node's edit
//!   would ([`Desired::edit`] over those keys: the same rules and messages), and writes them
//!   on condition that each is still at the revision it read (or the one the caller names).
//!   Two writers never overwrite each other unseen: the later gets [`Conflict`].
//! - A whole file (`lb --cluster apply -f`) is written as the difference to the cluster's
//!   services, in transactions of at most [`MAX_OPS`] keys and [`MAX_BYTES`] of values (etcd's
//!   default limits are 128 operations and 1.5 MiB a request): each transaction is all or
//!   nothing, the file as a whole is not — a conflict stops it at that transaction, and what
//!   was written before stays (said in the error; running it again finishes it).
use std::collections::BTreeMap;

use anyhow::{Context as _, Result, bail};

use super::{
    Cluster, Entry, Key, NodeStatus, TIMEOUT,
    etcd::{Batch, Conditional, Etcd},
};
use crate::core::{
    diff::Change,
    edit::{Desired, Edit, Edited},
    model::{DesiredState, Network, Service},
};

/// Keys a transaction writes at most (etcd's default `--max-txn-ops` is 128).
pub const MAX_OPS: usize = 128;
/// Bytes of values a transaction writes at most (etcd's default request limit is 1.5 MiB).
pub const MAX_BYTES: usize = 1 << 20;
const PAGE: i64 = 1000;

/// A write refused because a key is not at the revision the writer read.
#[derive(Debug, thiserror::Error)]
#[error(
    "conflict: {key} is {} (this change expected {}); read it again and retry",
    revision(.current),
    revision(.expected)
)]
pub struct Conflict {
    pub key: String,
    pub expected: Option<i64>,
    pub current: Option<i64>,
}

fn revision(r: &Option<i64>) -> String {
    match r {
        Some(r) => format!("at revision {r}"),
        None => "absent".to_owned(),
    }
}

async fn connect(cluster: &Cluster) -> Result<Etcd> {
    Etcd::connect_to(&cluster.endpoints, &cluster.tls, TIMEOUT).await
}

/// Every contribution of the cluster, as of one revision.
pub async fn read_all(cluster: &Cluster) -> Result<(i64, BTreeMap<Key, Entry>)> {
    retrying(cluster, || read_all_once(cluster)).await
}

async fn read_all_once(cluster: &Cluster) -> Result<(i64, BTreeMap<Key, Entry>)> {
    let mut etcd = connect(cluster).await?;
    let listing = etcd.list(&cluster.services(), PAGE).await?;
    let mut out = BTreeMap::new();
    for kv in &listing.kvs {
        let (key, entry) = cluster.entry(kv)?;
        out.insert(key, entry);
    }
    Ok((listing.revision, out))
}

/// The cluster's services as a state document: one network per network name, with its
/// services only (no interfaces: networks are node-scoped). `lb --cluster apply -f` takes it.
pub async fn state(cluster: &Cluster) -> Result<(i64, ClusterState)> {
    let (revision, entries) = read_all(cluster).await?;
    let mut networks: BTreeMap<String, Vec<Service>> = BTreeMap::new();
    for (key, e) in entries {
        networks.entry(key.network).or_default().push(e.service);
    }
    Ok((
        revision,
        ClusterState {
            networks: (networks.into_iter())
                .map(|(name, services)| ClusterNetwork { name, services })
                .collect(),
        },
    ))
}

/// The cluster's services, by network (what `lb --cluster state` prints). A node's `lb state`
/// reads as one too: its networks' settings are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterState {
    pub networks: Vec<ClusterNetwork>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterNetwork {
    pub name: String,
    #[serde(default)]
    pub services: Vec<Service>,
}

impl ClusterState {
    /// Parses and checks it as a node would check each network's services together (names,
    /// VIP and port ownership within a network, backends).
    pub fn from_json(text: &str) -> Result<ClusterState> {
        let state: ClusterState = serde_json::from_str(text).context("not a state document")?;
        for n in &state.networks {
            as_network(&n.name, n.services.clone()).validate()?;
        }
        Ok(state)
    }
}

/// A network of `services` for the rules that do not depend on a node.
fn as_network(name: &str, services: Vec<Service>) -> Network {
    let mut n: Network = serde_json::from_value(serde_json::json!({
        "name": name,
        "interfaces": ["cluster"],
    }))
    .expect("a network of a name and an interface");
    n.services = services;
    n
}

/// Runs `attempt` again, up to once per member, while it fails on etcd's side (a member
/// down, a leader election): each attempt connects to the next member. A refusal or a
/// conflict is an answer, not retried. An attempt whose write landed but whose answer was
/// lost is retried like any other: the retry reads again, so a whole-file apply finds the
/// keys written and a compare-and-swap reports a conflict with the revision it wrote.
async fn retrying<T, F, Fut>(cluster: &Cluster, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut left = cluster.endpoints.len();
    loop {
        left -= 1;
        match attempt().await {
            Err(e)
                if left > 0
                    && e.downcast_ref::<Conflict>().is_none()
                    && e.chain().any(|c| c.is::<etcd_client::Error>()) =>
            {
                tracing::debug!(error = %format!("{e:#}"), "etcd failed; trying another member");
            }
            r => return r,
        }
    }
}

/// Makes one service edit (`service_set`, `service_rm`, `backend_*`) in the cluster: over the
/// generations of its service as the cluster has them, written if each key it changes is
/// still as read, or at `if_revision` (0: absent) when given (then written even unchanged,
/// so that it orders with every other conditional write of the key). Returns the changes
/// and the revision they were written at.
pub async fn edit(
    cluster: &Cluster,
    edit: Edit,
    if_revision: Option<i64>,
) -> Result<(Vec<Change>, i64)> {
    retrying(cluster, || edit_once(cluster, edit.clone(), if_revision)).await
}

async fn edit_once(
    cluster: &Cluster,
    edit: Edit,
    if_revision: Option<i64>,
) -> Result<(Vec<Change>, i64)> {
    let (network, id) = match &edit {
        Edit::ServiceSet { network, service } => (network.clone(), service.id.clone()),
        Edit::ServiceRm {
            network, service, ..
        }
        | Edit::BackendAdd {
            network, service, ..
        }
        | Edit::BackendRm {
            network, service, ..
        }
        | Edit::BackendDisable {
            network, service, ..
        }
        | Edit::BackendEnable {
            network, service, ..
        } => (network.clone(), service.clone()),
        Edit::NetworkAdd { .. } | Edit::NetworkRm { .. } | Edit::NetworkSet { .. } => bail!(
            "networks are each node's own: change them on the node (lb network …, without --cluster)"
        ),
    };
    let mut etcd = connect(cluster).await?;
    let listing = (etcd.list(&cluster.service_prefix(&network, &id), PAGE)).await?;
    let mut read: BTreeMap<Key, Entry> = BTreeMap::new();
    for kv in &listing.kvs {
        let (key, entry) = cluster.entry(kv)?;
        read.insert(key, entry);
    }
    // With a revision to hold to, a service set as it is is written all the same.
    let unchanged = match (&edit, if_revision) {
        (Edit::ServiceSet { service, .. }, Some(_)) => Some(service.key()),
        _ => None,
    };
    let services = read.values().map(|e| e.service.clone()).collect();
    let mut desired = Desired::new(DesiredState {
        networks: vec![as_network(&network, services)],
    });
    let mut edited = Edited::default();
    desired
        .edit(edit, &mut edited)
        .map_err(|r| anyhow::anyhow!("refused: {r}"))?;
    let n = desired.network(&network).expect("the one network");
    let mut writes = Vec::new();
    let mut touched: Vec<&crate::core::model::ServiceKey> =
        edited.touched.values().flat_map(|t| &t.services).collect();
    if touched.is_empty()
        && let Some(k) = &unchanged
    {
        touched.push(k);
    }
    {
        for service in touched {
            let key = Key {
                network: network.clone(),
                service: service.clone(),
            };
            let expected = match if_revision {
                Some(0) => None,
                Some(r) => Some(r),
                None => read.get(&key).map(|e| e.mod_revision),
            };
            writes.push(Conditional {
                key: cluster.service_key(&key),
                value: n
                    .service(service)
                    .map(|s| serde_json::to_vec(s).expect("a service serializes")),
                expected: Some(expected),
            });
        }
    }
    if writes.is_empty() {
        return Ok((Vec::new(), listing.revision));
    }
    if writes.len() > MAX_OPS {
        bail!(
            "one service's {} generations are more than a transaction takes ({MAX_OPS})",
            writes.len()
        );
    }
    match etcd.write_all(&writes).await? {
        Batch::Done { revision } => Ok((edited.changes, revision)),
        Batch::Conflict { key, current } => {
            let expected =
                (writes.iter().find(|w| w.key == key)).and_then(|w| w.expected.flatten());
            Err(Conflict {
                key,
                expected,
                current,
            }
            .into())
        }
    }
}

/// What `apply` wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    pub written: usize,
    pub deleted: usize,
    pub unchanged: usize,
    pub transactions: usize,
    /// The revision of the last transaction.
    pub revision: i64,
}

/// Makes the cluster's services those of `state`: the keys that differ are written and the
/// keys it does not have deleted, each on condition that it is as listed (see the module's
/// contract on transactions).
pub async fn apply(cluster: &Cluster, state: &ClusterState) -> Result<Applied> {
    retrying(cluster, || apply_once(cluster, state)).await
}

async fn apply_once(cluster: &Cluster, state: &ClusterState) -> Result<Applied> {
    let (listed_at, have) = read_all_once(cluster).await?;
    let mut want: BTreeMap<Key, &Service> = BTreeMap::new();
    for n in &state.networks {
        for s in &n.services {
            want.insert(
                Key {
                    network: n.name.clone(),
                    service: s.key(),
                },
                s,
            );
        }
    }
    let mut out = Applied {
        revision: listed_at,
        ..Applied::default()
    };
    let mut writes = Vec::new();
    for (key, s) in &want {
        let old = have.get(key);
        if old.is_some_and(|e| e.service == **s) {
            out.unchanged += 1;
            continue;
        }
        writes.push(Conditional {
            key: cluster.service_key(key),
            value: Some(serde_json::to_vec(s).expect("a service serializes")),
            expected: Some(old.map(|e| e.mod_revision)),
        });
    }
    for (key, e) in &have {
        if !want.contains_key(key) {
            writes.push(Conditional {
                key: cluster.service_key(key),
                value: None,
                expected: Some(Some(e.mod_revision)),
            });
        }
    }
    let mut etcd = connect(cluster).await?;
    for chunk in chunks(&writes) {
        match etcd.write_all(chunk).await? {
            Batch::Done { revision } => {
                out.transactions += 1;
                out.revision = revision;
                for w in chunk {
                    match w.value {
                        Some(_) => out.written += 1,
                        None => out.deleted += 1,
                    }
                }
            }
            Batch::Conflict { key, current } => {
                let expected =
                    (chunk.iter().find(|w| w.key == key)).and_then(|w| w.expected.flatten());
                return Err(anyhow::Error::new(Conflict {
                    key,
                    expected,
                    current,
                })
                .context(format!(
                    "after {} of {} transactions ({} keys written, {} deleted, which stay)",
                    out.transactions,
                    chunks(&writes).count(),
                    out.written,
                    out.deleted
                )));
            }
        }
    }
    Ok(out)
}

/// `writes` cut into transactions of at most [`MAX_OPS`] keys and about [`MAX_BYTES`].
fn chunks(writes: &[Conditional]) -> impl Iterator<Item = &[Conditional]> + '_ {
    let mut rest = writes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut n = 0;
        for w in rest.iter().take(MAX_OPS) {
            let size = w.key.len() + w.value.as_ref().map_or(0, Vec::len);
            if n > 0 && bytes + size > MAX_BYTES {
                break;
            }
            bytes += size;
            n += 1;
        }
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// Every node's last report, and the cluster's revision now.
pub async fn nodes(cluster: &Cluster) -> Result<(i64, Vec<NodeStatus>)> {
    retrying(cluster, || nodes_once(cluster)).await
}

async fn nodes_once(cluster: &Cluster) -> Result<(i64, Vec<NodeStatus>)> {
    let mut etcd = connect(cluster).await?;
    let listing = etcd.list(&cluster.nodes(), PAGE).await?;
    let mut out = Vec::new();
    for kv in &listing.kvs {
        match serde_json::from_slice::<NodeStatus>(&kv.value) {
            Ok(s) => out.push(s),
            Err(e) => tracing::warn!(key = %kv.key, error = %e, "not a node's status"),
        }
    }
    Ok((listing.revision, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_stay_within_etcds_limits() {
        let w = |n: usize| Conditional {
            key: "k".into(),
            value: Some(vec![0; n]),
            expected: None,
        };
        let many: Vec<Conditional> = (0..300).map(|_| w(10)).collect();
        let sizes: Vec<usize> = chunks(&many).map(<[_]>::len).collect();
        assert_eq!(sizes, [128, 128, 44]);
        let big: Vec<Conditional> = (0..5).map(|_| w(400 << 10)).collect();
        let sizes: Vec<usize> = chunks(&big).map(<[_]>::len).collect();
        assert_eq!(sizes, [2, 2, 1], "about 1 MiB each");
        let huge = vec![w(2 << 20)];
        assert_eq!(chunks(&huge).count(), 1, "one value too large goes alone");
    }
}
