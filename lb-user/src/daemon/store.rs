//! The daemon's desired state on disk: an embedded, transactional store (`state.redb` in the
//! state dir), written change by change.
//!
//! Why redb: every change is one transaction that writes only the keys it changes (a
//! network's settings, one contribution), so saving costs the change, not the state, and is
//! crash-safe: redb's copy-on-write B-trees switch to a commit only once it is on disk
//! (checksummed, one fsync), so a `kill -9` or a power cut at any point leaves the last
//! committed state whole, never a mix. It is pure Rust (no C library to build or install
//! beside lb) and its file format is stable. SQLite would give the same guarantees with a C
//! build and a query language this key-value layout does not need.
//!
//! Layout: `networks` (network name → its settings), `services` ((network, service id,
//! generation) → the contribution), each value with its place (`seq`: the order of networks
//! and of a network's services, as `lb state` prints them); `meta` (the revision, bumped
//! by every commit, the next place, the format); `log` (the last [`HISTORY`] revisions'
//! changes, written in the commit of each, for watchers); `left` (see the contracts);
//! `cluster` (`lb daemon --cluster`: the cluster's contributions as the node last heard them,
//! with META's `cluster_revision`, the etcd revision they are as of; never in `services`,
//! which holds the node's own). `state.json` is the export and import
//! format: an existing one is migrated on first start (and kept, renamed
//! `state.json.migrated`); `lb daemon --import FILE` builds a new store from an export.
//!
//! Contracts:
//! - A store that cannot be read (not a redb file, truncated, damaged, of another format) is
//!   refused before anything on the node is touched, with the way out in the message.
//! - A store created empty (first start, or after an operator moved a broken one away) does
//!   not know the networks found pinned on the node: they are left as they are and named in
//!   the log and `lb status` (`left`) until a network of that name is added or applied, not
//!   removed as unconfigured ones are.
//!
//! One file because the layout of `state.redb` (its tables, its keys, the places that keep services
//! in order) is private to it: every read and write of the store is here.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::{
    cluster::{Entry, Key},
    core::model::{DesiredState, Network, Service, ServiceKey},
};

pub const FILE: &str = "state.redb";
/// The desired state of a daemon before the store: migrated on first start.
pub const LEGACY: &str = "state.json";
/// The format of the values; a store of another one is refused.
const FORMAT: u64 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NETWORKS: TableDefinition<&str, &[u8]> = TableDefinition::new("networks");
const SERVICES: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("services");
/// Networks found pinned when the store was created: left as they are (see the contracts).
const LEFT: TableDefinition<&str, u64> = TableDefinition::new("left");
/// The changes of the last [`HISTORY`] revisions (revision → the watch's event), written in
/// the commit of each: what a watcher that reconnects with a revision is sent.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// The cluster's contributions as this node last heard them (`daemon --cluster`): key
/// (`NETWORK/SERVICE/GENERATION`) → the contribution with its etcd revisions, served from
/// here while etcd is away; META's `cluster_revision` says as of which etcd revision.
const CLUSTER: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster");
/// How many revisions of changes the store keeps for watchers.
pub const HISTORY: u64 = 4096;

/// A value with its place.
#[derive(Serialize, Deserialize)]
struct Placed<T> {
    seq: u64,
    value: T,
}

/// One write of a commit.
#[derive(Debug)]
pub enum Write<'a> {
    /// A network and its services, removed.
    NetworkGone(&'a str),
    /// A network's settings (its services are not read). `fresh`: it takes a new place and
    /// whatever the store had of a network of that name goes first (removed and added again
    /// in one commit, or a whole state replaced).
    Network { settings: &'a Network, fresh: bool },
    /// A contribution (`None`: removed). `fresh`: it takes a new place even if the store has
    /// it (a whole network rewritten in its new order); otherwise a contribution replaced
    /// keeps its place and a new one goes last.
    Service {
        network: &'a str,
        key: &'a ServiceKey,
        service: Option<&'a Service>,
        fresh: bool,
    },
    /// A contribution of the cluster as this node heard it (`None`: gone from the cluster).
    /// The services table holds the node's own contributions only.
    Cluster {
        key: &'a Key,
        entry: Option<&'a Entry>,
    },
    /// The etcd revision the cluster's contributions are as of.
    ClusterRevision(i64),
}

pub struct Store {
    db: Database,
    path: PathBuf,
    revision: u64,
}

/// How the store came to be at this start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// It was there.
    Existing,
    /// Created empty.
    Created,
    /// Created from `state.json` (migration) or from an export (`--import`).
    Imported(PathBuf),
}

pub struct Opened {
    pub store: Store,
    pub state: DesiredState,
    pub origin: Origin,
}

/// What it takes to start from a store that cannot be read.
fn way_out(path: &Path) -> String {
    format!(
        "nothing on the node was changed (the dataplane serves on as it is); restore it from an exported state with `lb daemon --import FILE` (the JSON `lb state` prints), or move {} away to start with an empty state",
        path.display()
    )
}

impl Store {
    /// Opens the store of `dir`: the existing one, or one made from `import`, or from a
    /// `state.json` there (migration), or an empty one.
    pub fn open(dir: &Path, import: Option<&Path>) -> Result<Opened> {
        let path = dir.join(FILE);
        let legacy = dir.join(LEGACY);
        let origin = if let Some(file) = import {
            let state = read_export(file)?;
            if path.exists() {
                let kept = dir.join(format!("{FILE}.before-import"));
                std::fs::rename(&path, &kept)
                    .with_context(|| format!("keeping {} as {}", path.display(), kept.display()))?;
                tracing::info!(kept = %kept.display(), "the store before the import is kept");
            }
            create(&path, &state)?;
            Origin::Imported(file.to_path_buf())
        } else if path.exists() {
            Origin::Existing
        } else if legacy.exists() {
            let state = read_export(&legacy)?;
            create(&path, &state)?;
            let done = dir.join(format!("{LEGACY}.migrated"));
            std::fs::rename(&legacy, &done)
                .with_context(|| format!("renaming {} to {}", legacy.display(), done.display()))?;
            tracing::info!(from = %legacy.display(), kept = %done.display(), "desired state migrated into the store");
            Origin::Imported(legacy)
        } else {
            create(&path, &DesiredState::default())?;
            Origin::Created
        };
        // redb asserts rather than fails on some damage (a file shorter than its header says,
        // seen with a truncated store): a panic while opening or reading is a store that
        // cannot be read, refused as one.
        let opened = std::panic::catch_unwind(|| -> Result<_> {
            let db = builder().open(&path).map_err(anyhow::Error::new)?;
            let (state, revision) = read(&db)?;
            Ok((db, state, revision))
        });
        let (db, state, revision) = match opened {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => bail!(
                "the desired-state store {} cannot be read ({e:#}); {}",
                path.display(),
                way_out(&path)
            ),
            Err(panic) => bail!(
                "the desired-state store {} cannot be read (damaged: {}); {}",
                path.display(),
                (panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "redb gave up on it".to_owned()),
                way_out(&path)
            ),
        };
        Ok(Opened {
            store: Store { db, path, revision },
            state,
            origin,
        })
    }

    /// The revision of the last commit (1: the state the store was created with).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The store's size on disk, in bytes.
    pub fn bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// Writes `writes` in one transaction: all of them or, if it fails, none; `log(revision)`
    /// is the change's entry in the watch's history. Returns the new revision and how many
    /// keys were written or deleted.
    pub fn commit(
        &mut self,
        writes: &[Write],
        log: impl FnOnce(u64) -> Vec<u8>,
    ) -> Result<(u64, usize)> {
        let txn = self.db.begin_write().context("starting a transaction")?;
        let mut keys = 0;
        let revision = self.revision + 1;
        {
            let mut history = txn.open_table(LOG)?;
            history.insert(revision, log(revision).as_slice())?;
            if let Some(old) = revision.checked_sub(HISTORY) {
                history.remove(old)?;
            }
            let mut meta = txn.open_table(META)?;
            let mut networks = txn.open_table(NETWORKS)?;
            let mut services = txn.open_table(SERVICES)?;
            let mut left = txn.open_table(LEFT)?;
            let mut cluster = txn.open_table(CLUSTER)?;
            let mut seq = meta.get("seq")?.map_or(0, |v| v.value());
            let mut next = || {
                seq += 1;
                seq
            };
            for w in writes {
                match w {
                    Write::NetworkGone(name) => {
                        networks.remove(*name)?;
                        keys += 1 + remove_services(&mut services, name)?;
                    }
                    Write::Network { settings, fresh } => {
                        let name = settings.name.as_str();
                        let seq = match networks.get(name)? {
                            Some(v) if !fresh => placed_seq(v.value())?,
                            Some(_) => {
                                keys += remove_services(&mut services, name)?;
                                next()
                            }
                            None => next(),
                        };
                        let value = serde_json::to_vec(&Placed {
                            seq,
                            value: settings.settings(),
                        })?;
                        networks.insert(name, value.as_slice())?;
                        if left.remove(name)?.is_some() {
                            keys += 1;
                        }
                        keys += 1;
                    }
                    Write::Service {
                        network,
                        key,
                        service,
                        fresh,
                    } => {
                        let k = (*network, key.service_id.as_str(), key.generation.as_str());
                        let Some(service) = service else {
                            services.remove(k)?;
                            keys += 1;
                            continue;
                        };
                        let seq = match services.get(k)? {
                            Some(v) if !fresh => placed_seq(v.value())?,
                            _ => next(),
                        };
                        let value = serde_json::to_vec(&Placed {
                            seq,
                            value: service,
                        })?;
                        services.insert(k, value.as_slice())?;
                        keys += 1;
                    }
                    Write::Cluster { key, entry } => {
                        let k = key.to_string();
                        match entry {
                            Some(e) => {
                                let value = serde_json::to_vec(&(key, e))?;
                                cluster.insert(k.as_str(), value.as_slice())?;
                            }
                            None => {
                                cluster.remove(k.as_str())?;
                            }
                        }
                        keys += 1;
                    }
                    Write::ClusterRevision(r) => {
                        meta.insert("cluster_revision", *r as u64)?;
                        keys += 1;
                    }
                }
            }
            meta.insert("seq", seq)?;
            meta.insert("revision", revision)?;
        }
        txn.commit().context("committing")?;
        self.revision = revision;
        Ok((self.revision, keys))
    }

    /// The history's entries after revision `from`, oldest first; `None` when the store no
    /// longer has all of them (`from` is older than the history kept: read the state again).
    pub fn history(&self, from: u64) -> Result<Option<Vec<Vec<u8>>>> {
        if from >= self.revision {
            return Ok(Some(Vec::new()));
        }
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        let oldest = table.first()?.map(|(k, _)| k.value());
        if oldest.is_none_or(|o| o > from + 1) {
            return Ok(None);
        }
        let out = table
            .range(from + 1..)?
            .map(|e| Ok(e?.1.value().to_vec()))
            .collect::<Result<_>>()?;
        Ok(Some(out))
    }

    /// The cluster's contributions as this node last heard them, and the etcd revision they
    /// are as of (0: never heard).
    pub fn cluster(&self) -> Result<(i64, BTreeMap<Key, Entry>)> {
        let txn = self.db.begin_read()?;
        let revision = (txn.open_table(META)?.get("cluster_revision")?).map_or(0, |v| v.value());
        let table = match txn.open_table(CLUSTER) {
            Ok(t) => t,
            // A store written before the cluster came.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok((0, BTreeMap::new())),
            Err(e) => return Err(e.into()),
        };
        let mut out = BTreeMap::new();
        for e in table.iter()? {
            let (k, v) = e?;
            let (key, entry): (Key, Entry) = serde_json::from_slice(v.value())
                .with_context(|| format!("the cluster's contribution {}", k.value()))?;
            out.insert(key, entry);
        }
        Ok((revision as i64, out))
    }

    /// The oldest revision the history has.
    pub fn oldest(&self) -> Result<Option<u64>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        Ok(table.first()?.map(|(k, _)| k.value()))
    }

    /// The networks found pinned when the store was created, left as they are.
    pub fn left(&self) -> Result<BTreeSet<String>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LEFT)?;
        table.iter()?.map(|e| Ok(e?.0.value().to_owned())).collect()
    }

    /// Records `names` as networks left on the node (see the contracts).
    pub fn leave(&mut self, names: &[String]) -> Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut left = txn.open_table(LEFT)?;
            for n in names {
                left.insert(n.as_str(), self.revision)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Forgets that network `name` was left on the node (it was removed by hand).
    pub fn forget_left(&mut self, name: &str) -> Result<()> {
        let txn = self.db.begin_write()?;
        txn.open_table(LEFT)?.remove(name)?;
        txn.commit()?;
        Ok(())
    }
}

/// How the store is opened: a cache of 16 MiB (redb's default is 1 GiB, all of which the
/// first read of a large state would keep resident; a change reads a handful of pages).
fn builder() -> redb::Builder {
    let mut b = redb::Builder::new();
    b.set_cache_size(16 << 20);
    b
}

fn placed_seq(bytes: &[u8]) -> Result<u64> {
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    Ok(serde_json::from_slice::<Seq>(bytes)?.seq)
}

/// Removes every contribution of network `name`; returns how many. Names are of
/// `A-Z a-z 0-9 _ . -` (validation), all below `~`.
fn remove_services(
    services: &mut redb::Table<(&str, &str, &str), &[u8]>,
    name: &str,
) -> Result<usize> {
    let keys: Vec<(String, String)> = services
        .range((name, "", "")..(name, "~", ""))?
        .map(|e| {
            let e = e?;
            let (_, id, g) = e.0.value();
            Ok((id.to_owned(), g.to_owned()))
        })
        .collect::<Result<_>>()?;
    for (id, g) in &keys {
        services.remove((name, id.as_str(), g.as_str()))?;
    }
    Ok(keys.len())
}

/// An exported state (`lb state`'s JSON), parsed and validated.
fn read_export(file: &Path) -> Result<DesiredState> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    DesiredState::from_json(&text).with_context(|| format!("{}", file.display()))
}

/// Creates a store at `path` holding `state`: built beside it and renamed into place, so a
/// crash leaves no half-made store under the name.
fn create(path: &Path, state: &DesiredState) -> Result<()> {
    let tmp = path.with_extension("redb.new");
    let _ = std::fs::remove_file(&tmp);
    let db = builder()
        .create(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let mut store = Store {
        db,
        path: tmp.clone(),
        revision: 0,
    };
    let mut writes = Vec::new();
    for n in &state.networks {
        writes.push(Write::Network {
            settings: n,
            fresh: true,
        });
    }
    let keys: Vec<(&str, ServiceKey, &Service)> = (state.networks.iter())
        .flat_map(|n| {
            n.services
                .iter()
                .map(move |s| (n.name.as_str(), s.key(), s))
        })
        .collect();
    for (network, key, service) in &keys {
        writes.push(Write::Service {
            network,
            key,
            service: Some(service),
            fresh: true,
        });
    }
    // The import is the history's first entry: a watcher from before it reads the state again.
    store.commit(&writes, |_| b"{\"revision\":1,\"changes\":[]}".to_vec())?;
    {
        // Every table exists from the start (a read never finds one missing).
        let txn = store.db.begin_write()?;
        txn.open_table(LEFT)?;
        txn.open_table(META)?.insert("format", FORMAT)?;
        txn.commit()?;
    }
    drop(store);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(())
}

/// The whole desired state and the revision, networks and services in their places.
fn read(db: &Database) -> Result<(DesiredState, u64)> {
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    match meta.get("format")?.map(|v| v.value()) {
        Some(FORMAT) => {}
        Some(f) => bail!("store format {f}, this lb reads format {FORMAT}"),
        None => bail!("no format recorded: not an lb store"),
    }
    let revision = meta.get("revision")?.map_or(0, |v| v.value());
    let mut networks: Vec<(u64, Network)> = Vec::new();
    for e in txn.open_table(NETWORKS)?.iter()? {
        let (k, v) = e?;
        let p: Placed<Network> = serde_json::from_slice(v.value())
            .with_context(|| format!("network {:?}", k.value()))?;
        networks.push((p.seq, p.value));
    }
    networks.sort_by_key(|(seq, _)| *seq);
    let mut services: Vec<(u64, String, Service)> = Vec::new();
    for e in txn.open_table(SERVICES)?.iter()? {
        let (k, v) = e?;
        let (network, id, generation) = k.value();
        let p: Placed<Service> = serde_json::from_slice(v.value()).with_context(|| {
            format!("network {network:?} service {id:?} generation {generation:?}")
        })?;
        services.push((p.seq, network.to_owned(), p.value));
    }
    services.sort_by_key(|(seq, _, _)| *seq);
    let mut state = DesiredState {
        networks: networks.into_iter().map(|(_, n)| n).collect(),
    };
    for (_, network, service) in services {
        let n = state.network_mut(&network).with_context(|| {
            format!(
                "service {:?} of network {network:?}, which it does not have",
                service.id
            )
        })?;
        n.services.push(service);
    }
    state
        .validate()
        .context("the state it holds is not valid")?;
    Ok((state, revision))
}

#[cfg(test)]
mod tests;
