//! Whether the node's firewall filters forwarded traffic: the fast path hands translated
//! packets to a local interface's peer (`bpf_redirect_peer`), which skips the routing, bridge
//! and netfilter forward path, and with it every rule there (Docker's DOCKER-USER and
//! isolation chains, the CNI `firewall` plugin's CNI-FORWARD, a policy engine's tables). So the
//! fast path is only taken where [`forward_filters`] finds nothing, and found again after every
//! change [`nft_events`] reports.
//!
//! Per family: the fast path of each family is its own switch, so an `ip6` table's rule stops
//! IPv6's fast path alone and an `ip` table's IPv4's, while `inet`, `bridge` and `netdev`
//! chains see both ([`ForwardFilters`]).
//!
//! What filters (a base chain with at least one rule, or with policy drop):
//! - hook `forward` of family ip, ip6, inet or bridge. iptables-nft's FORWARD is `table ip
//!   filter chain FORWARD` (ip6tables-nft's `table ip6 filter`); with `br_netfilter` the
//!   ip-family chains also see bridged traffic, so no case of its own;
//! - hook `ingress` or `egress` of family netdev, and hook `ingress` of family inet, on one of
//!   the interfaces the caller names (or on any, if the chain names none): TC ingress, where
//!   the redirect happens, runs before them, and the peer's egress is never reached;
//! - legacy iptables' FORWARD chain (table `filter` in `/proc/net/ip_tables_names` of the
//!   namespace), read with `iptables-legacy`; legacy ip6tables' (`ip6_tables_names`,
//!   `ip6tables-legacy`) for IPv6.
//!
//! lb's own tables (`ip lb-*` and `ip6 lb-*`, the nftables dataplane) never count: they only translate, and a
//! leftover of that dataplane must not keep the eBPF one off its fast path.
//!
//! - filter-type chains at the `prerouting` and `postrouting` hooks of those families
//!   (iptables-nft's raw and mangle tables, Docker's direct-access drops in raw PREROUTING):
//!   the redirect skips them as well. NAT-type chains there do not count: they translate a
//!   connection's first packet, they do not filter it.
//!
//! Not covered: legacy ebtables, and legacy iptables' tables other than `filter`.
use std::{collections::HashMap, io, process::Command};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

mod events;

pub use events::{NftEvents, nft_events};

use super::nft::{TABLE_PREFIX, nft};

/// What can filter each family's forwarded traffic: one reason per filtering chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardFilters {
    pub v4: Vec<String>,
    pub v6: Vec<String>,
}

impl ForwardFilters {
    /// The same reason for both families (what could not be read rules out neither).
    pub fn both(reason: String) -> Self {
        ForwardFilters {
            v4: vec![reason.clone()],
            v6: vec![reason],
        }
    }
}

/// The filtering chains found in the calling thread's network namespace (callers wrap it in
/// [`crate::node::in_netns`]), per family; empty when nothing can filter that family's
/// forwarded traffic through `devices` (the node's interfaces the fast path would send from
/// and to).
pub fn forward_filters(devices: &[String]) -> Result<ForwardFilters> {
    // Terse: set elements (an nft dataplane's maps can hold 100,000s) are not needed.
    let json =
        nft(&["-j", "-t", "list", "ruleset"], None).context("listing the nftables ruleset")?;
    let chains = base_chains(&json)?;
    // nft 1.0.6 leaves the devices of netdev and inet-ingress chains out of its JSON; its text
    // listing has them. A chain that changed in between reads as naming no device: any device.
    let text = if chains.iter().any(|c| c.devices.is_none()) {
        Some(nft(&["-t", "list", "ruleset"], None).context("listing the nftables ruleset")?)
    } else {
        None
    };
    let listed = text.as_deref().map(text_devices).unwrap_or_default();
    let mut out = ForwardFilters::default();
    for mut c in chains {
        if c.devices.is_none() {
            let key = (c.family.clone(), c.table.clone(), c.name.clone());
            c.devices = Some(listed.get(&key).cloned().unwrap_or_default());
        }
        if !c.filters(devices) {
            continue;
        }
        let reason = c.reason();
        if c.family != "ip6" {
            out.v4.push(reason.clone());
        }
        if c.family != "ip" {
            out.v6.push(reason);
        }
    }
    out.v4.extend(legacy_forward(&LEGACY_V4)?);
    out.v6.extend(legacy_forward(&LEGACY_V6)?);
    Ok(out)
}

/// A base chain that may filter forwarded traffic, whatever the devices.
#[derive(Debug)]
struct Chain {
    family: String,
    table: String,
    name: String,
    hook: String,
    policy: String,
    rules: usize,
    /// The devices of a device-bound hook (empty: any); `None` while unknown (not in nft's
    /// JSON); always `Some(empty)` for a forward hook.
    devices: Option<Vec<String>>,
}

impl Chain {
    fn filters(&self, devices: &[String]) -> bool {
        let on = self.devices.as_deref().unwrap_or_default();
        on.is_empty()
            || on.iter().any(|pattern| {
                devices.iter().any(|d| match pattern.strip_suffix('*') {
                    // A wildcard hook (`device "veth*"`, recent kernels and nft) covers every
                    // interface whose name starts with the rest.
                    Some(prefix) => d.starts_with(prefix),
                    None => d == pattern,
                })
            })
    }

    fn reason(&self) -> String {
        let Chain {
            family,
            table,
            name,
            hook,
            policy,
            rules,
            devices,
        } = self;
        let on = match devices.as_deref().unwrap_or_default() {
            [] if !matches!(hook.as_str(), "ingress" | "egress") => String::new(),
            [] => " on any device".to_owned(),
            d => format!(" on {}", d.join(", ")),
        };
        let s = if *rules == 1 { "" } else { "s" };
        format!(
            "table {family} {table} chain {name} (hook {hook}{on}, policy {policy}, {rules} rule{s})"
        )
    }
}

/// The base chains of `nft -j list ruleset` output that are at a hook the fast path skips and
/// have a rule or a drop policy, outside lb's own tables; their devices when the JSON has them.
fn base_chains(json: &str) -> Result<Vec<Chain>> {
    let v: Value = serde_json::from_str(json).context("nft's JSON output")?;
    let objects = v["nftables"]
        .as_array()
        .context("nft's JSON output has no nftables list")?;
    // (family, table, chain) of an object, the chain's name under `chain_key`.
    let key = |o: &Value, chain_key: &str| {
        let s = |k: &str| o[k].as_str().unwrap_or_default().to_owned();
        (s("family"), s("table"), s(chain_key))
    };
    let mut rules: HashMap<(String, String, String), usize> = HashMap::new();
    for rule in objects.iter().filter_map(|o| o.get("rule")) {
        *rules.entry(key(rule, "chain")).or_default() += 1;
    }
    let mut chains = Vec::new();
    for chain in objects.iter().filter_map(|o| o.get("chain")) {
        let Some(hook) = chain["hook"].as_str() else {
            continue; // a regular chain: only reached from a base chain, which is what counts
        };
        let (family, table, name) = key(chain, "name");
        let device_bound = match (family.as_str(), hook, chain["type"].as_str()) {
            ("ip" | "ip6" | "inet" | "bridge", "forward", _) => false,
            // Filter-type chains before and after routing (iptables' raw and mangle tables,
            // Docker's direct-access drops in raw PREROUTING): the redirect skips them too.
            // NAT-type chains see a connection's first packet only, for address translation
            // of its own; they are not filtering.
            ("ip" | "ip6" | "inet" | "bridge", "prerouting" | "postrouting", Some("filter")) => {
                false
            }
            ("netdev", "ingress" | "egress", _) | ("inet", "ingress", _) => true,
            _ => continue,
        };
        if matches!(family.as_str(), "ip" | "ip6") && table.starts_with(TABLE_PREFIX) {
            continue;
        }
        let policy = chain["policy"].as_str().unwrap_or("accept").to_owned();
        let count = rules
            .get(&(family.clone(), table.clone(), name.clone()))
            .copied()
            .unwrap_or(0);
        if count == 0 && policy != "drop" {
            continue;
        }
        let devices = if device_bound {
            match &chain["dev"] {
                Value::String(d) => Some(vec![d.clone()]),
                Value::Array(ds) => Some(
                    ds.iter()
                        .filter_map(|d| d.as_str().map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            }
        } else {
            Some(Vec::new())
        };
        chains.push(Chain {
            family,
            table,
            name,
            hook: hook.to_owned(),
            policy,
            rules: count,
            devices,
        });
    }
    Ok(chains)
}

/// The devices of each base chain in `nft list ruleset` text output, keyed by family, table
/// and chain: `device "d0"` or `devices = { d0, lo }` on the chain's `type … hook …` line.
fn text_devices(text: &str) -> HashMap<(String, String, String), Vec<String>> {
    let unquote = |s: &str| s.trim_matches(|c| c == '"' || c == ',').to_owned();
    let mut out = HashMap::new();
    let mut table: Option<(String, String)> = None;
    let mut chain: Option<String> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["table", family, name, "{", ..] => {
                table = Some((family.to_string(), unquote(name)));
                chain = None;
            }
            ["chain", name, "{", ..] => chain = Some(unquote(name)),
            // Sets, maps, flowtables (whose `devices = {…}` is not a hook's) and the like.
            [_, _, "{", ..] => chain = None,
            ["type", ..] => {
                let (Some((family, t)), Some(c)) = (&table, &chain) else {
                    continue;
                };
                let Some(hook) = words.iter().position(|w| *w == "hook") else {
                    continue;
                };
                // After `hook NAME`.
                let devices = match words.get(hook + 2..).unwrap_or_default() {
                    ["device", d, ..] => vec![unquote(d)],
                    ["devices", "=", "{", more @ ..] => more
                        .iter()
                        .take_while(|w| !w.starts_with('}'))
                        .map(|w| unquote(w))
                        .filter(|w| !w.is_empty())
                        .collect(),
                    _ => Vec::new(),
                };
                out.insert((family.clone(), t.clone(), c.clone()), devices);
            }
            _ => {}
        }
    }
    out
}

/// One family's legacy x_tables: the proc file listing its loaded tables, the tool that
/// reads them, and its name in reasons.
struct Legacy {
    names: &'static str,
    tool: &'static str,
    label: &'static str,
}

const LEGACY_V4: Legacy = Legacy {
    names: "ip_tables_names",
    tool: "iptables-legacy",
    label: "legacy iptables",
};

const LEGACY_V6: Legacy = Legacy {
    names: "ip6_tables_names",
    tool: "ip6tables-legacy",
    label: "legacy ip6tables",
};

/// The reason `legacy`'s tables filter forwarded traffic in the calling thread's namespace,
/// if they do: its `filter` table is loaded there and FORWARD has a rule or policy DROP.
/// Nothing is run when the table is not loaded (the tool would load it).
fn legacy_forward(legacy: &Legacy) -> Result<Option<String>> {
    // thread-self: /proc/net is the namespace of the process's main thread, not of the
    // thread in_netns runs this on.
    let path = format!("/proc/thread-self/net/{}", legacy.names);
    let names = match std::fs::read_to_string(&path) {
        Ok(names) => names,
        // The family's x_tables are not loaded: no legacy table anywhere.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {path}")),
    };
    if !names.lines().any(|t| t.trim() == "filter") {
        return Ok(None);
    }
    let out = match Command::new(legacy.tool)
        .args(["-w", "-S", "FORWARD"])
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Some(legacy_reason(legacy, None)));
        }
        Err(e) => return Err(e).with_context(|| format!("running {}", legacy.tool)),
    };
    if !out.status.success() {
        bail!(
            "{} -S FORWARD failed ({}): {}",
            legacy.tool,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    Ok(legacy_filters(&listing).then(|| legacy_reason(legacy, Some(&listing))))
}

/// Whether `iptables-legacy -S FORWARD` output (or ip6tables') has a rule or policy DROP.
fn legacy_filters(listing: &str) -> bool {
    listing
        .lines()
        .any(|l| l.starts_with("-A FORWARD ") || l.split_whitespace().eq(["-P", "FORWARD", "DROP"]))
}

/// The reason for a loaded legacy `filter` table: from its FORWARD listing, or, without the
/// tool to read it, for being loaded at all.
fn legacy_reason(legacy: &Legacy, listing: Option<&str>) -> String {
    let Some(listing) = listing else {
        return format!(
            "{} table filter is loaded and {} is not installed to read its FORWARD chain",
            legacy.label, legacy.tool
        );
    };
    let policy = listing
        .lines()
        .find_map(|l| l.strip_prefix("-P FORWARD "))
        .unwrap_or("ACCEPT")
        .trim();
    let rules = listing
        .lines()
        .filter(|l| l.starts_with("-A FORWARD "))
        .count();
    let s = if rules == 1 { "" } else { "s" };
    format!(
        "{} table filter chain FORWARD (policy {policy}, {rules} rule{s})",
        legacy.label
    )
}

#[cfg(test)]
mod tests;
