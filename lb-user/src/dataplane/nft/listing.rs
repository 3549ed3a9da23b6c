//! Reading a network's tables back (`nft -j list table`, a dsr network's DSR table too) into
//! DESIGN.md's notation, with each element's counter: what `counts` reports and
//! what the tests compare with `lb elements`; and a dsr network's sessions.
//!
//! Read through the kernel's own references, not the names: each shape vmap (a map of
//! verdicts keyed by `numgen`) says which interval jumps to which slot chain, and the slot
//! map of that name holds `set key : translation`; together, moby's `set key . interval :
//! translation`.
use std::{
    collections::HashMap,
    net::{Ipv6Addr, SocketAddr},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::ruleset::Kind;
use crate::core::{elements::Element, model::Family};

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

/// The kind of a slot chain or map, from its prefix.
fn kind_of(slot: &str) -> Option<Kind> {
    let prefix = slot.split('-').next()?;
    Kind::EVERY.into_iter().find(|k| k.prefix() == prefix)
}

/// The elements of the NAT table in `nft -j list table` output. A bucket interval of one
/// bucket is printed by nft as a plain number; it reads back as `N-N`.
pub fn listed_elements(json: &str) -> Result<Vec<Listed>> {
    listed_units(json, |_, v| Some(v))
}

/// The `real-server` elements of a DSR table in `nft -j list table netdev lb-NET` output
/// (see `dsr.rs`), an IPv6 unit's backend numbers read as the backends `backends6` numbers
/// (`dsr::backends6` of the network the table was written for).
pub fn listed_real_server(json: &str, backends6: &[Ipv6Addr]) -> Result<Vec<Listed>> {
    listed_units(json, |kind, v| match kind {
        Kind::RealServer(Family::V6) => {
            let n: usize = v.parse().ok()?;
            Some(backends6.get(n.checked_sub(1)?)?.to_string())
        }
        _ => Some(v),
    })
}

/// The elements of the units in `nft -j list table` output, each translation as `value`
/// makes it of its kind's (`None`: left out).
fn listed_units(json: &str, value: impl Fn(Kind, String) -> Option<String>) -> Result<Vec<Listed>> {
    let v: Value = serde_json::from_str(json).context("nft's JSON output")?;
    let maps: Vec<&Value> = maps_of(&v).collect();
    // Slot chain → interval, from every shape vmap (the verdict maps other than dispatch).
    let mut interval: HashMap<String, String> = HashMap::new();
    for map in &maps {
        let dispatch = Kind::EVERY.iter().any(|k| map["name"] == k.dispatch());
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
        let (Some(i), Some(kind)) = (interval.get(name), kind_of(name)) else {
            continue;
        };
        for e in map["elem"].as_array().into_iter().flatten() {
            let (packets, bytes) = counter(&e[0]);
            let Some(value) = value(kind, scalar(&e[1])?) else {
                continue;
            };
            out.push(Listed {
                element: Element {
                    map: kind.design_map(),
                    key: format!("{} . {i}", scalar(&e[0])?),
                    value,
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
