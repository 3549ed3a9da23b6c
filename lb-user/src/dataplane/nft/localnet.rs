//! `route_localnet` on the network's interfaces, for node-local clients of published ports
//! on `127.0.0.1` (see `ruleset::base_rules`): a flow from 127.0.0.1 translated to a backend
//! leaves by, and its replies come back in by, an interface the kernel only lets 127/8
//! through with `net.ipv4.conf.<interface>.route_localnet` on.
//!
//! Which interfaces. portmap (`snat: true`) turns it on for the interface of the route to
//! the container it maps to. Here a network's backends are reached by its interfaces (its
//! masquerade rules only take what leaves by them), so it is turned on for each of them, and
//! only while the network publishes a port that answers on 127.0.0.1 (one on every address,
//! or bound to a loopback `host_ip`): a network of VIPs alone changes nothing. The
//! namespace's `all`/`default` settings are never touched.
//!
//! Not surprising the operator. lb turns it on only where it is off, and records each
//! interface it turned on in the set [`RECORD_SET`] of the network's table, written in the
//! same transaction as the rules: the record outlives a daemon restart as the table does
//! (each sync reads it back before writing the table again), and an interface that was
//! already on is the operator's, never recorded, never turned off. Recorded interfaces go
//! back off when the network is removed, no longer publishes such a port, or no longer has
//! the interface. An interface recorded and then turned on by hand as well is turned off
//! all the same: lb cannot tell the two apart. An interface deleted and created again comes
//! back off, and the next sync turns it on again.
//!
//! Order. The record (and the guard, `ruleset::GUARD_CHAIN`) is written before an interface
//! is turned on and deleted after it is turned off, so a crash in between leaves a record
//! of an interface that is off (turning it off again is harmless), never an interface on
//! without its guard or its record.
use std::{collections::BTreeSet, fmt::Write as _, io, path::PathBuf};

use anyhow::{Context as _, Result};

use super::exec;
use crate::core::model::{Family, Network};

/// The interfaces on which lb turned `route_localnet` on and turns it off again.
pub const RECORD_SET: &str = "route-localnet";

fn path(interface: &str) -> PathBuf {
    // The interface's own directory: a name with a dot (`eth0.100`) keeps it, as in /proc.
    ["/proc/sys/net/ipv4/conf", interface, "route_localnet"]
        .iter()
        .collect()
}

/// `route_localnet` of `interface` in the calling thread's namespace; `None` when the
/// namespace has no such interface.
pub fn get(interface: &str) -> Result<Option<bool>> {
    let p = path(interface);
    match std::fs::read_to_string(&p) {
        Ok(v) => Ok(Some(v.trim() != "0")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

fn set(interface: &str, on: bool) -> Result<()> {
    let p = path(interface);
    std::fs::write(&p, if on { "1" } else { "0" })
        .with_context(|| format!("writing {} = {}", p.display(), u8::from(on)))?;
    tracing::info!(
        interface,
        route_localnet = u8::from(on),
        "set (node-local clients of published ports on 127.0.0.1)"
    );
    Ok(())
}

/// Whether `network` publishes a port that answers on 127.0.0.1: an IPv4 key on every address
/// or on a loopback one (IPv6 has no `route_localnet`, and `[::1]` is not served).
fn serves_loopback(network: &Network) -> bool {
    (network.services.iter())
        .flat_map(|s| s.port_keys())
        .any(|(k, _)| k.family == Family::V4 && k.host_ip.is_none_or(|ip| ip.is_loopback()))
}

/// The interfaces the record of table `table` names, in the calling thread's namespace
/// (none when the table or its record does not exist).
pub fn recorded(table: &str) -> Result<BTreeSet<String>> {
    // `-t`: the sets without their elements (the slot maps hold the whole network's).
    let sets = exec::nft(&["-t", "-j", "list", "sets", "ip"], None)?;
    let v: serde_json::Value = serde_json::from_str(&sets).context("nft's JSON output")?;
    let exists = (v["nftables"].as_array().into_iter().flatten())
        .any(|o| o["set"]["table"] == table && o["set"]["name"] == RECORD_SET);
    if !exists {
        return Ok(BTreeSet::new());
    }
    let json = exec::nft(&["-j", "list", "set", "ip", table, RECORD_SET], None)?;
    let v: serde_json::Value = serde_json::from_str(&json).context("nft's JSON output")?;
    let mut names = BTreeSet::new();
    for o in v["nftables"].as_array().into_iter().flatten() {
        for e in o["set"]["elem"].as_array().into_iter().flatten() {
            let name = e
                .as_str()
                .with_context(|| format!("{RECORD_SET}: element {e}"))?;
            names.insert(name.to_owned());
        }
    }
    Ok(names)
}

/// One sync's changes, decided from the record and the interfaces' current values.
#[derive(Debug, Default)]
pub struct Plan {
    /// The record the sync's transaction writes.
    pub record: BTreeSet<String>,
    turn_on: Vec<String>,
    turn_off: Vec<String>,
}

impl Plan {
    /// For `network`, given the interfaces `recorded` before (in the calling thread's
    /// namespace).
    pub fn new(network: &Network, recorded: &BTreeSet<String>) -> Result<Plan> {
        let wanted: BTreeSet<&str> = if serves_loopback(network) {
            network.interfaces.iter().map(String::as_str).collect()
        } else {
            BTreeSet::new()
        };
        let mut plan = Plan::default();
        for &i in &wanted {
            let keep = match get(i)? {
                Some(false) => {
                    plan.turn_on.push(i.to_owned());
                    true
                }
                // On: lb's if recorded, else the operator's (on before lb looked). Not there
                // now: a recorded one stays recorded, lb turns it on when it is back.
                Some(true) | None => recorded.contains(i),
            };
            if keep {
                plan.record.insert(i.to_owned());
            }
        }
        for i in recorded.iter().filter(|i| !wanted.contains(i.as_str())) {
            if get(i)? == Some(true) {
                plan.turn_off.push(i.clone());
            }
        }
        Ok(plan)
    }

    /// The commands writing the record into table `t`, for the sync's transaction.
    pub fn script(&self, t: &str) -> String {
        let mut s = format!(
            "add set ip {t} {RECORD_SET} {{ type ifname; }}\nflush set ip {t} {RECORD_SET}\n"
        );
        if !self.record.is_empty() {
            let q: Vec<String> = self.record.iter().map(|i| format!("\"{i}\"")).collect();
            let _ = writeln!(s, "add element ip {t} {RECORD_SET} {{ {} }}", q.join(", "));
        }
        s
    }

    /// Sets the interfaces, once the transaction holding the record is in.
    pub fn carry_out(&self) -> Result<()> {
        for i in &self.turn_on {
            set(i, true)?;
        }
        for i in &self.turn_off {
            set(i, false)?;
        }
        Ok(())
    }
}

/// Turns off every interface the record of `table` names (before the table is deleted).
pub fn restore(table: &str) -> Result<()> {
    for i in recorded(table)? {
        if get(&i)? == Some(true) {
            set(&i, false)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::DesiredState;

    /// A network with one service of `backends` publishing tcp/8080 on `host_ip` (JSON, or
    /// `null` for every address).
    fn network(backends: &[&str], host_ip: &str) -> Network {
        let backends: Vec<String> = backends
            .iter()
            .map(|b| format!(r#"{{"ip":"{b}"}}"#))
            .collect();
        let json = format!(
            r#"{{"networks":[{{"name":"n","interfaces":["lbc0"],"services":[{{"id":"a","backends":[{}],"ports":[{{"proto":"tcp","published":8080,"host_ip":{host_ip}}}]}}]}}]}}"#,
            backends.join(",")
        );
        DesiredState::from_json(&json)
            .expect("a valid state")
            .networks[0]
            .clone()
    }

    /// Only an IPv4 key answering on 127.0.0.1 turns `route_localnet` on: a port on every
    /// address of an IPv6-only service, or one bound to another address, leaves it alone.
    #[test]
    fn only_ipv4_ports_on_loopback_need_route_localnet() {
        for (backends, host_ip, serves) in [
            (&["10.20.0.2"][..], "null", true),
            (&["10.20.0.2", "fd20::2"], "null", true),
            (&["10.20.0.2"], r#""127.0.0.1""#, true),
            (&["fd20::2"], "null", false),
            (&["10.20.0.2"], r#""10.0.0.1""#, false),
            (&["fd20::2"], r#""fd00::1""#, false),
        ] {
            assert_eq!(
                serves_loopback(&network(backends, host_ip)),
                serves,
                "{backends:?} on {host_ip}"
            );
        }
    }
}
