//! lb's access to an etcd cluster: listings, conditional writes and watches of a key prefix,
//! in the terms the cluster code needs (revisions, conflicts, a compacted history).
//!
//! Contract: only the v3 API that etcd 3.4 serves — Range with a limit and a revision, Txn
//! with compares on a key's create or mod revision, Watch with a start revision — through
//! `etcd-client` (tonic; tested upstream on 3.5+, here on Debian's 3.4.23: `tests/etcd.rs`).
//! Revisions are etcd's: the store's revision when a listing was read or a write committed,
//! a key's `mod_revision` the revision of its last write.
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, Txn, TxnOp,
    TxnOpResponse, WatchOptions, WatchStream,
};

/// One key and its value, with the revisions that order it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key (the oldest claim wins a tie between keys).
    pub create_revision: i64,
    /// The revision of its last write: what a conditional write compares.
    pub mod_revision: i64,
}

impl Kv {
    fn of(kv: &KeyValue) -> Result<Kv> {
        Ok(Kv {
            key: kv.key_str().context("a key that is not UTF-8")?.to_owned(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        })
    }
}

/// A prefix's keys as of one revision of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub revision: i64,
    pub kvs: Vec<Kv>,
}

/// What a conditional write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// Committed at this revision.
    Done { revision: i64 },
    /// The key was not as expected: its mod revision now (`None`: it does not exist).
    Conflict { current: Option<i64> },
}

/// One change a watch saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Put(Kv),
    Delete { key: String, mod_revision: i64 },
}

/// What a watch delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Changes, in the order etcd committed them (one revision may carry several).
    Changes(Vec<Change>),
    /// The revision asked for is compacted away: the watch is over, and the caller lists
    /// again (from this revision on the history is there).
    Compacted { compact_revision: i64 },
}

/// A connection to the cluster's members.
pub struct Etcd {
    client: Client,
}

/// The first key after every key that starts with `prefix` (etcd's range end of a prefix).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key (an empty prefix, or one of 0xff bytes): etcd's "\0" range end.
    vec![0]
}

impl Etcd {
    /// Connects to `endpoints` (`http://HOST:PORT`), each request bounded by `timeout`.
    pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Etcd> {
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let client = Client::connect(endpoints, Some(options))
            .await
            .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))?;
        Ok(Etcd { client })
    }

    /// Every key under `prefix` as of one revision, read `page` keys a request (etcd bounds
    /// a response's size; every page after the first is read at the first one's revision,
    /// so the listing is one consistent state however many writes land meanwhile).
    pub async fn list(&mut self, prefix: &str, page: i64) -> Result<Listing> {
        let end = prefix_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut kvs = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
            if revision != 0 {
                options = options.with_revision(revision);
            }
            let r = (self.client.get(from.clone(), Some(options)).await)
                .with_context(|| format!("listing {prefix} in etcd"))?;
            if revision == 0 {
                revision = r
                    .header()
                    .context("a response without a header")?
                    .revision();
            }
            for kv in r.kvs() {
                kvs.push(Kv::of(kv)?);
            }
            match (r.more(), r.kvs().last()) {
                (true, Some(last)) => {
                    // The next page starts right after the last key read.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(Listing { revision, kvs }),
            }
        }
    }

    /// Writes `value` at `key` if the key is as `expected` says: `None`, absent; `Some(r)`,
    /// last written at revision `r`. Two writers never overwrite each other unseen: the one
    /// that read an older revision gets [`Written::Conflict`] with the key's revision now.
    pub async fn put_if(
        &mut self,
        key: &str,
        value: &[u8],
        expected: Option<i64>,
    ) -> Result<Written> {
        let compare = match expected {
            None => Compare::create_revision(key, CompareOp::Equal, 0),
            Some(r) => Compare::mod_revision(key, CompareOp::Equal, r),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)]);
        let r = (self.client.txn(txn).await).with_context(|| format!("writing {key} to etcd"))?;
        if r.succeeded() {
            let revision = r
                .header()
                .context("a response without a header")?
                .revision();
            return Ok(Written::Done { revision });
        }
        let current = (r.op_responses().into_iter()).find_map(|op| match op {
            TxnOpResponse::Get(g) => Some(g.kvs().first().map(KeyValue::mod_revision)),
            _ => None,
        });
        Ok(Written::Conflict {
            current: current.flatten(),
        })
    }

    /// Watches every key under `prefix` from revision `from` on (the changes a listing at
    /// revision `from - 1` does not have).
    pub async fn watch(&mut self, prefix: &str, from: i64) -> Result<Watch> {
        let options = WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_start_revision(from);
        let stream = (self.client.watch(prefix, Some(options)).await)
            .with_context(|| format!("watching {prefix} in etcd from revision {from}"))?;
        Ok(Watch { stream })
    }
}

/// A watch of a prefix ([`Etcd::watch`]).
pub struct Watch {
    stream: WatchStream,
}

impl Watch {
    /// The next changes (or the news that the history asked for is gone); `None` when the
    /// cluster ended the stream. Responses without changes (the watch's creation, progress
    /// notices) are skipped.
    pub async fn next(&mut self) -> Result<Option<Watched>> {
        loop {
            let Some(r) = (self.stream.message().await).context("reading an etcd watch")? else {
                return Ok(None);
            };
            if r.compact_revision() != 0 {
                return Ok(Some(Watched::Compacted {
                    compact_revision: r.compact_revision(),
                }));
            }
            if r.canceled() {
                bail!("etcd cancelled the watch: {}", r.cancel_reason());
            }
            if r.events().is_empty() {
                continue;
            }
            let mut changes = Vec::with_capacity(r.events().len());
            for e in r.events() {
                let kv = e.kv().context("a watch event without its key")?;
                changes.push(match e.event_type() {
                    EventType::Put => Change::Put(Kv::of(kv)?),
                    EventType::Delete => Change::Delete {
                        key: kv.key_str().context("a key that is not UTF-8")?.to_owned(),
                        mod_revision: kv.mod_revision(),
                    },
                });
            }
            return Ok(Some(Watched::Changes(changes)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_ends_at_its_last_byte_plus_one() {
        assert_eq!(prefix_end("/lb/"), b"/lb0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }
}
