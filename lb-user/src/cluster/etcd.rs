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
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KeyValue, PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
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
    /// The answer to [`Watch::request_progress`]: every change up to `revision` has been
    /// delivered.
    Progress { revision: i64 },
}

/// One write of [`Etcd::write_all`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conditional {
    pub key: String,
    /// `None`: the key is deleted.
    pub value: Option<Vec<u8>>,
    /// What the key must be for the write to happen: `Some(None)` absent, `Some(Some(r))`
    /// last written at `r`; `None`, anything.
    pub expected: Option<Option<i64>>,
}

/// What [`Etcd::write_all`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Batch {
    Done {
        revision: i64,
    },
    /// Nothing written: `key` is not as expected (its mod revision now; `None`, absent).
    Conflict {
        key: String,
        current: Option<i64>,
    },
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
        Self::connect_to(endpoints, &super::Tls::default(), timeout).await
    }

    /// Connects to one of the cluster's members that answers, with its client certificates:
    /// each connection starts with the member after the one the last one started with, so a
    /// caller that connects again after a failure tries the others first. (etcd-client's
    /// balanced channel over every member kept sending requests to a killed one.) A
    /// connection that stops answering (a member killed, a partition) is found dead within
    /// about twice `timeout` by HTTP/2 keepalives, also while a watch waits, instead of
    /// hanging on it; a member without a leader refuses requests rather than serving stale
    /// ones.
    pub async fn connect_to(
        endpoints: &[String],
        tls: &super::Tls,
        timeout: Duration,
    ) -> Result<Etcd> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if endpoints.is_empty() {
            bail!("no etcd member given");
        }
        let first = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut errors = Vec::new();
        for k in 0..endpoints.len() {
            let member = &endpoints[(first + k) % endpoints.len()];
            match Self::connect_member(member, tls, timeout).await {
                Ok(etcd) => return Ok(etcd),
                Err(e) => errors.push(format!("{member}: {e:#}")),
            }
        }
        bail!("no etcd member answers ({})", errors.join("; "))
    }

    async fn connect_member(member: &str, tls: &super::Tls, timeout: Duration) -> Result<Etcd> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(timeout, timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if tls.given() {
            let read = |p: &std::path::Path| {
                std::fs::read(p).with_context(|| format!("reading {}", p.display()))
            };
            let mut t = TlsOptions::new();
            if let Some(ca) = &tls.ca {
                t = t.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            match (&tls.cert, &tls.key) {
                (Some(cert), Some(key)) => {
                    t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                (None, None) => {}
                _ => bail!("a client certificate takes both --cluster-cert and --cluster-key"),
            }
            options = options.with_tls(t);
        }
        let mut client = Client::connect([member], Some(options))
            .await
            .context("connecting")?;
        client.status().await.context("asking for its status")?;
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

    /// Writes every one of `writes` (a value, or `None`: the key deleted) in one transaction
    /// if each key is as its `expected` revision says (`Some(None)`: absent, `Some(Some(r))`:
    /// last written at `r`, `None`: whatever it is). All or none: a conflict writes nothing
    /// and names the first key that was not as expected. etcd takes at most 128 operations a
    /// transaction (its default `--max-txn-ops`): a caller with more splits them.
    pub async fn write_all(&mut self, writes: &[Conditional]) -> Result<Batch> {
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        for w in writes {
            match w.expected {
                Some(None) => compares.push(Compare::create_revision(
                    w.key.as_str(),
                    CompareOp::Equal,
                    0,
                )),
                Some(Some(r)) => {
                    compares.push(Compare::mod_revision(w.key.as_str(), CompareOp::Equal, r))
                }
                None => {}
            }
            ops.push(match &w.value {
                Some(v) => TxnOp::put(w.key.as_str(), v.clone(), None),
                None => TxnOp::delete(w.key.as_str(), None),
            });
        }
        let gets: Vec<TxnOp> = (writes.iter())
            .filter(|w| w.expected.is_some())
            .map(|w| TxnOp::get(w.key.as_str(), None))
            .collect();
        let txn = Txn::new().when(compares).and_then(ops).or_else(gets);
        let r = (self.client.txn(txn).await).context("writing to etcd")?;
        let revision = r
            .header()
            .context("a response without a header")?
            .revision();
        if r.succeeded() {
            return Ok(Batch::Done { revision });
        }
        let now: Vec<Option<i64>> = (r.op_responses().into_iter())
            .filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some(g.kvs().first().map(KeyValue::mod_revision)),
                _ => None,
            })
            .collect();
        let conflict = (writes.iter().filter(|w| w.expected.is_some()))
            .zip(now)
            .find(|(w, now)| w.expected != Some(*now))
            .map(|(w, now)| (w.key.clone(), now));
        match conflict {
            Some((key, current)) => Ok(Batch::Conflict { key, current }),
            // Written between the compare and the read that reports it: say which was first.
            None => Ok(Batch::Conflict {
                key: writes[0].key.clone(),
                current: None,
            }),
        }
    }

    /// Writes `value` at `key` under a new lease of `ttl` (the key goes when the lease is not
    /// kept alive); returns the lease to keep alive ([`Etcd::keep_alive`]).
    pub async fn put_leased(&mut self, key: &str, value: &[u8], ttl: Duration) -> Result<i64> {
        let lease = (self.client.lease_grant(ttl.as_secs() as i64, None).await)
            .context("granting a lease")?
            .id();
        self.put_on(key, value, lease).await?;
        Ok(lease)
    }

    /// Writes `value` at `key` under `lease`.
    pub async fn put_on(&mut self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        let options = PutOptions::new().with_lease(lease);
        (self.client.put(key, value, Some(options)).await)
            .with_context(|| format!("writing {key} to etcd"))?;
        Ok(())
    }

    /// Renews `lease` once; false if it is gone (expired: its keys are gone too).
    pub async fn keep_alive(&mut self, lease: i64) -> Result<bool> {
        let (mut keeper, mut answers) =
            (self.client.lease_keep_alive(lease).await).context("keeping a lease alive")?;
        keeper.keep_alive().await.context("keeping a lease alive")?;
        let answer = (answers.message().await)
            .context("keeping a lease alive")?
            .context("etcd ended the lease's keepalive")?;
        Ok(answer.ttl() > 0)
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
    /// Asks etcd to say up to which revision it has delivered every change
    /// ([`Watched::Progress`]; etcd answers once the watch has caught up).
    pub async fn request_progress(&mut self) -> Result<()> {
        (self.stream.request_progress().await).context("asking an etcd watch for its progress")
    }

    /// The next changes (or the news that the history asked for is gone, or an answer to
    /// [`Watch::request_progress`]); `None` when the cluster ended the stream. The watch's
    /// creation is skipped.
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
            if r.created() {
                continue;
            }
            if r.events().is_empty() {
                let revision = r.header().map_or(0, |h| h.revision());
                return Ok(Some(Watched::Progress { revision }));
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
