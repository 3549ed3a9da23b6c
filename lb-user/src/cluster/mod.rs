//! Many nodes, one desired state: the cluster's services from etcd (issue #26).
//!
//! Layout under the prefix (default [`DEFAULT_PREFIX`]):
//! - `services/NETWORK/SERVICE/GENERATION`: one contribution, the JSON of the API's
//!   `service_set` (`lb service list -j`'s `service`). Network, service and generation names
//!   have no `/` (validation allows `[A-Za-z0-9_.-]`), so a key names its contribution
//!   unambiguously; a value whose id or generation differs from its key's is refused.
//! - `nodes/NODE`: what node NODE applied (its [`NodeStatus`]), under a lease the node keeps
//!   alive: a node that is gone drops out of `lb nodes` when its lease expires.
//!
//! Contracts:
//! - Networks are node-scoped: the cluster carries services only. A node serves the cluster's
//!   services of every network it has; the others wait, unrefused, until it adds one.
//! - Who wins a VIP or published port that two keys claim is decided by a rule every node
//!   applies alike: the key created first (lowest create revision; ties, which one
//!   transaction makes, by key order) — see `daemon::cluster`.
//! - A writer never overwrites unseen: every write compares the key's revision with the one
//!   it read ([`write`]).
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::core::model::{Service, ServiceKey};

pub mod etcd;
pub mod follow;
pub mod write;

pub const DEFAULT_PREFIX: &str = "/lb/";

/// How long one request to etcd may take; a member that does not answer within it is taken
/// as down (the client tries the others).
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Client certificates for etcd's TLS port.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl Tls {
    fn given(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }
}

/// Where the cluster is and how lb finds its keys there.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// `http://HOST:PORT` (`https://` with TLS), one per member.
    pub endpoints: Vec<String>,
    /// Every key of lb's under it; ends with `/`.
    pub prefix: String,
    pub tls: Tls,
}

impl Cluster {
    /// `etcd://HOST:PORT[,HOST:PORT…]` (a member's `http://`/`https://` URLs are taken too),
    /// with the key prefix and the TLS files.
    pub fn parse(url: &str, prefix: &str, tls: Tls) -> Result<Cluster> {
        let scheme = if tls.given() { "https" } else { "http" };
        let members = url.strip_prefix("etcd://").unwrap_or(url);
        let mut endpoints = Vec::new();
        for m in members.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let hostport = (m
                .strip_prefix("http://")
                .or_else(|| m.strip_prefix("https://")))
            .unwrap_or(m)
            .trim_end_matches('/');
            if !hostport.contains(':') || hostport.contains('/') {
                bail!("--cluster {url}: {m:?} is not HOST:PORT (etcd://HOST:PORT[,HOST:PORT…])");
            }
            endpoints.push(format!("{scheme}://{hostport}"));
        }
        if endpoints.is_empty() {
            bail!("--cluster {url}: no member (etcd://HOST:PORT[,HOST:PORT…])");
        }
        if !prefix.starts_with('/') {
            bail!("--cluster-prefix {prefix:?}: a key prefix starts with /");
        }
        let prefix = if prefix.ends_with('/') {
            prefix.to_owned()
        } else {
            format!("{prefix}/")
        };
        Ok(Cluster {
            endpoints,
            prefix,
            tls,
        })
    }

    /// The members, as `lb status` names them.
    pub fn display(&self) -> String {
        self.endpoints.join(",")
    }

    pub fn services(&self) -> String {
        format!("{}services/", self.prefix)
    }

    /// The key of one service's generations (`…/services/NET/SVC/`).
    pub fn service_prefix(&self, network: &str, id: &str) -> String {
        format!("{}{network}/{id}/", self.services())
    }

    pub fn service_key(&self, key: &Key) -> String {
        format!(
            "{}{}",
            self.service_prefix(&key.network, &key.service.service_id),
            key.service.generation
        )
    }

    pub fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    pub fn node_key(&self, node: &str) -> String {
        format!("{}{node}", self.nodes())
    }

    /// The contribution `key` (an etcd key under [`Cluster::services`]) names, if it names one.
    pub fn parse_service_key(&self, key: &str) -> Option<Key> {
        let rest = key.strip_prefix(&self.services())?;
        let mut parts = rest.split('/');
        let (Some(network), Some(id), Some(generation), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(Key {
            network: network.to_owned(),
            service: ServiceKey {
                service_id: id.to_owned(),
                generation: generation.to_owned(),
            },
        })
    }

    /// The contribution an etcd key and value carry: the key's name, the value's service
    /// (the same id and generation, or refused).
    pub fn entry(&self, kv: &etcd::Kv) -> Result<(Key, Entry)> {
        let key = (self.parse_service_key(&kv.key))
            .with_context(|| format!("{}: not …/services/NETWORK/SERVICE/GENERATION", kv.key))?;
        let service: Service = serde_json::from_slice(&kv.value)
            .with_context(|| format!("{}: not a service's JSON", kv.key))?;
        if service.key() != key.service {
            bail!(
                "{}: the value is service {:?} generation {:?}, the key names another",
                kv.key,
                service.id,
                service.generation
            );
        }
        service
            .validate()
            .with_context(|| format!("{}: an invalid service", kv.key))?;
        Ok((
            key,
            Entry {
                service,
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
            },
        ))
    }
}

/// One contribution of the cluster: its network and its id and generation. In JSON, flat:
/// `{"network": …, "service": …, "generation": …}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(from = "FlatKey", into = "FlatKey")]
pub struct Key {
    pub network: String,
    pub service: ServiceKey,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.network, self.service.service_id, self.service.generation
        )
    }
}

#[derive(Serialize, Deserialize)]
struct FlatKey {
    network: String,
    service: String,
    generation: String,
}

impl From<FlatKey> for Key {
    fn from(k: FlatKey) -> Key {
        Key {
            network: k.network,
            service: ServiceKey {
                service_id: k.service,
                generation: k.generation,
            },
        }
    }
}

impl From<Key> for FlatKey {
    fn from(k: Key) -> FlatKey {
        FlatKey {
            network: k.network,
            service: k.service.service_id,
            generation: k.service.generation,
        }
    }
}

/// A contribution as the cluster has it, with the revisions that order it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub service: Service,
    /// Orders claims: the lowest wins a VIP or port that two keys want.
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// What a node reports under `nodes/NODE` (and `lb nodes` lists).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    /// The cluster revision this node's services are as of.
    pub revision: i64,
    /// Revisions of the services behind the last one the node heard of.
    pub lag: i64,
    /// Contributions this node refuses, and why.
    #[serde(default)]
    pub refused: Vec<Refused>,
    /// Unix seconds of the report.
    pub at_unix: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    #[serde(flatten)]
    pub key: Key,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_keys() {
        let c =
            Cluster::parse("etcd://10.0.0.1:2379, 10.0.0.2:2379", "/lb", Tls::default()).unwrap();
        assert_eq!(
            c.endpoints,
            ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(c.prefix, "/lb/");
        let key = c.parse_service_key("/lb/services/web/api/2").unwrap();
        assert_eq!(key.to_string(), "web/api/2");
        assert_eq!(c.service_key(&key), "/lb/services/web/api/2");
        assert!(c.parse_service_key("/lb/services/web/api").is_none());
        assert!(c.parse_service_key("/lb/services/web/api/2/x").is_none());
        assert!(Cluster::parse("etcd://nohost", "/lb/", Tls::default()).is_err());
        assert!(Cluster::parse("etcd://", "/lb/", Tls::default()).is_err());
        let tls = Tls {
            ca: Some("ca.pem".into()),
            ..Tls::default()
        };
        let c = Cluster::parse("etcd://h:2379", "lb", tls);
        assert!(c.is_err(), "a prefix without / is refused");
    }
}
