//! Reading a network's tables back (`nft -j list table`, and a dsr network's `real-server`
//! map) into DESIGN.md's notation, with each element's counter: what `counts` reports and
//! what the tests compare with `lb elements`; and a dsr network's sessions.
//!
//! Read through the kernel's own references, not the names: each shape vmap (a map of
//! verdicts keyed by `numgen`) says which interval jumps to which slot chain, and the slot
//! map of that name holds `set key : translation`; together, moby's `set key . interval :
//! translation`.
use std::{collections::HashMap, net::SocketAddr};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::ruleset::Kind;
use crate::core::elements::{Element, NAT_PUBLISH_PORT, NAT_SERVICE_VIP, REAL_SERVER};

/// One element in DESIGN.md's notation, with its counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub element: Element,
    pub packets: u64,
    pub bytes: u64,
}

fn scalar(v: &Value) -> Result<String> {
    Ok(match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Object(o) if o.contains_key("range") => {
            let r = &o["range"];
            format!("{}-{}", scalar(&r[0])?, scalar(&r[1])?)
        }
        Value::Object(o) if o.contains_key("concat") => (o["concat"].as_array())
            .context("concat is not a list")?
            .iter()
            .map(scalar)
            .collect::<Result<Vec<_>>>()?
            .join(" . "),
        Value::Object(o) if o.contains_key("elem") => scalar(&o["elem"]["val"])?,
        _ => bail!("unexpected nft value {v}"),
    })
}

/// The element's counter, where the map counts.
fn counter(key: &Value) -> (u64, u64) {
    let c = &key["elem"]["counter"];
    (
        c["packets"].as_u64().unwrap_or(0),
        c["bytes"].as_u64().unwrap_or(0),
    )
}

/// Moby's map of a slot chain's kind, from its prefix.
fn design_map(slot: &str) -> Option<&'static str> {
    let prefix = slot.split('-').next()?;
    Kind::ALL
        .into_iter()
        .find(|k| k.prefix() == prefix)
        .map(|k| match k {
            Kind::Vip => NAT_SERVICE_VIP,
            Kind::Port | Kind::HostPort => NAT_PUBLISH_PORT,
        })
}

/// The elements of the table in `nft -j list table` output. A bucket interval of one bucket
/// is printed by nft as a plain number; it reads back as `N-N`.
pub fn listed_elements(json: &str) -> Result<Vec<Listed>> {
    let v: Value = serde_json::from_str(json).context("nft's JSON output")?;
    let maps: Vec<&Value> = maps_of(&v).collect();
    // Slot chain → interval, from every shape vmap (the verdict maps other than dispatch).
    let mut interval: HashMap<String, String> = HashMap::new();
    for map in &maps {
        let dispatch = Kind::ALL.iter().any(|k| map["name"] == k.dispatch());
        if map["map"] != "verdict" || dispatch {
            continue;
        }
        for e in map["elem"].as_array().into_iter().flatten() {
            let Some(target) = e[1]["goto"]["target"].as_str() else {
                continue;
            };
            let i = scalar(&e[0])?;
            let i = if i.contains('-') {
                i
            } else {
                format!("{i}-{i}")
            };
            interval.insert(target.to_owned(), i);
        }
    }
    let mut out = Vec::new();
    for map in maps {
        let Some(name) = map["name"].as_str() else {
            continue;
        };
        let (Some(i), Some(design)) = (interval.get(name), design_map(name)) else {
            continue;
        };
        for e in map["elem"].as_array().into_iter().flatten() {
            let (packets, bytes) = counter(&e[0]);
            out.push(Listed {
                element: Element {
                    map: design,
                    key: format!("{} . {i}", scalar(&e[0])?),
                    value: scalar(&e[1])?,
                },
                packets,
                bytes,
            });
        }
    }
    Ok(out)
}

/// The maps of `nft -j list ...` output.
fn maps_of(v: &Value) -> impl Iterator<Item = &Value> {
    (v["nftables"].as_array().into_iter().flatten()).filter_map(|o| o.get("map"))
}

/// The `real-server` elements in `nft -j list map netdev lb-NET real-server` output, in
/// DESIGN.md's notation (`VIP . a-b : BACKEND`), with their counters.
pub fn listed_real_server(json: &str) -> Result<Vec<Listed>> {
    listed_dsr_map(json, REAL_SERVER, Some)
}

/// The elements of DSR map `name` (`real-server`, `real-server6`) in `nft -j list map`
/// output as `real-server` elements, each value as `backend` gives it (`None`: left out).
pub fn listed_dsr_map(
    json: &str,
    name: &str,
    backend: impl Fn(String) -> Option<String>,
) -> Result<Vec<Listed>> {
    let v: Value = serde_json::from_str(json).context("nft's JSON output")?;
    let mut out = Vec::new();
    for map in maps_of(&v).filter(|m| m["name"] == name) {
        for e in map["elem"].as_array().into_iter().flatten() {
            let key = scalar(&e[0])?;
            // An interval of one bucket is printed as a plain number.
            let key = match key.rsplit_once(" . ") {
                Some((vip, bucket)) if !bucket.contains('-') => {
                    format!("{vip} . {bucket}-{bucket}")
                }
                _ => key,
            };
            let (packets, bytes) = counter(&e[0]);
            let Some(value) = backend(scalar(&e[1])?) else {
                continue;
            };
            out.push(Listed {
                element: Element {
                    map: REAL_SERVER,
                    key,
                    value,
                },
                packets,
                bytes,
            });
        }
    }
    Ok(out)
}

/// One DSR session as its map or set holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub client: SocketAddr,
    pub service: SocketAddr,
    /// The backend's MAC, as nft prints it (`aa:bb:cc:dd:ee:ff`): IPv4's sessions map to it;
    /// IPv6's are in a set per backend, and have none.
    pub mac: Option<String>,
    /// The session's timeout and the seconds left of it (whole seconds, rounded down).
    pub timeout_secs: u64,
    pub expires_secs: u64,
}

/// The sessions in `nft -j list map netdev lb-NET dsr-conntrack-P` output (or `list set` of
/// an IPv6 session set). An element updated with the map's own default timeout is listed
/// without one: it takes the map's.
pub fn sessions(json: &str) -> Result<Vec<Session>> {
    let v: Value = serde_json::from_str(json).context("nft's JSON output")?;
    let mut out = Vec::new();
    let objects = (v["nftables"].as_array().into_iter().flatten())
        .filter_map(|o| o.get("map").or_else(|| o.get("set")));
    for map in objects {
        let default = map["timeout"].as_u64().unwrap_or(0);
        for e in map["elem"].as_array().into_iter().flatten() {
            // A map's element is `[key, value]`; a set's is the key alone.
            let (key, mac) = match e.as_array() {
                Some(pair) => (&pair[0], Some(scalar(&pair[1])?)),
                None => (e, None),
            };
            let elem = &key["elem"];
            let parts = elem["val"]["concat"]
                .as_array()
                .with_context(|| format!("a session key is a concatenation: {e}"))?;
            let part = |i: usize| scalar(parts.get(i).unwrap_or(&Value::Null));
            let addr = |a: usize, p: usize| -> Result<SocketAddr> {
                Ok(SocketAddr::new(
                    part(a)?
                        .parse()
                        .with_context(|| format!("address in {e}"))?,
                    part(p)?.parse().with_context(|| format!("port in {e}"))?,
                ))
            };
            out.push(Session {
                client: addr(0, 1)?,
                service: addr(2, 3)?,
                mac,
                timeout_secs: elem["timeout"].as_u64().unwrap_or(default),
                expires_secs: elem["expires"].as_u64().unwrap_or(0),
            });
        }
    }
    Ok(out)
}
