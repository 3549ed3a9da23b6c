//! Reading a network's table back (`nft -j list table`) into DESIGN.md's notation, with each
//! element's counter: what `counts` reports and what the tests compare with `lb elements`.
//!
//! Read through the kernel's own references, not the names: each shape vmap (a map of
//! verdicts keyed by `numgen`) says which interval jumps to which slot chain, and the slot
//! map of that name holds `set key : translation`; together, moby's `set key . interval :
//! translation`.
use std::collections::HashMap;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::ruleset::Kind;
use crate::core::elements::{Element, NAT_PUBLISH_PORT, NAT_SERVICE_VIP};

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
    let maps: Vec<&Value> = (v["nftables"].as_array().into_iter().flatten())
        .filter_map(|o| o.get("map"))
        .collect();
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
