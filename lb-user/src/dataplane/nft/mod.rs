//! The nftables dataplane: moby's ruleset (seed `service_nftables_lb_linux.go`) in a shape the
//! kernel takes at node scale, for kernels that cannot run the programs. Fed by the same
//! composed elements as the eBPF dataplane and `lb elements`, so both agree bucket for bucket.
//!
//! One table per network, `ip lb-<network>`, with one writer (this daemon); `ruleset.rs`
//! renders it whole (its doc has the layout), `diff.rs` renders a sync's difference, `exec.rs` runs `nft`, `listing.rs` reads elements and
//! counters back, `conntrack.rs` lists flows.
//!
//! Why not moby's layout. Its maps are keyed by a concatenation ending in a bucket interval
//! (`typeof ip daddr . numgen random mod 65536`, flags interval): the kernel stores them as
//! pipapo sets. Measured here (nft 1.0.6, kernel 6.18, `nft -f` of hand-made files in a fresh
//! namespace): libnftnl cuts a set's elements into netlink messages under 64 KiB (the u16
//! length of the element-list attribute), 1,365 elements of such a map each, and pipapo
//! refuses the first element of a later message at some of those boundaries, depending on
//! the intervals, not the count: 273 VIPs × 10 intervals fail at element 1,365 ("Invalid
//! argument"), 1,366 × 2 at element 2,731 ("File exists"), 1,500 × 4 at 5,460, while 1,000 ×
//! 4 (4,000 elements) and 1,365 × 2 pass. Around 20,000 elements (2,000 × 10) the transaction
//! ends in "No buffer space available". A chain and a named map per set (kube-proxy's shape)
//! is accepted at 10,000 × 10 but takes 30 s: the kernel finds a set by name by walking the
//! table's list of sets (`nft_set_lookup`, once per new set, set-element message and lookup
//! rule, seen with perf), so 20,000 sets cost O(n²); anonymous maps are worse (over 120 s,
//! each `__set%d` name is allocated by a scan of the same list). So sets are grouped by
//! shape (see `ruleset.rs`): a few dozen maps whatever the number of services. Measured with
//! the same kernel: 10,000 × 10 with one published port each (200,000 elements) declared in
//! 2.5 s, a one-set difference in 0.03 s.
//!
//! Syncs. Each sync is one `nft -f` transaction, so a failed one changes nothing. The first
//! sync (and the first after a restart, when `previous` is `None`) declares the table whole.
//! Later ones send the difference from `previous`, which starts by swapping the network's
//! hash in the `lb-sync` set: a table that is not the one written for `previous` (deleted,
//! flushed, redeclared by hand) fails that transaction, and the same sync declares the table
//! whole instead. A hand edit inside a map that leaves `lb-sync` alone is not detected; the
//! next whole declaration (a restart) drops it.
//!
//! Counters: each element (moby's element, see `ruleset.rs`) carries its counter. A
//! difference touches only the elements that changed, so every other counter keeps counting
//! across syncs; an element deleted and added again (its backend or its partition changed)
//! starts from zero, as does everything after a whole declaration (a restart).
//!
//! Connections already translated keep their NAT binding in the kernel's conntrack, which no
//! sync touches, so flows survive syncs and daemon restarts alike.
//!
//! Why text and not the `nftables` crate's JSON: the maps are declared with `typeof`
//! (`numgen random mod 65536`, `th dport`), which nft 1.0.6 (Debian 12's) accepts only in its
//! text syntax. The seed renders text for `nft -f` too. Reading back is JSON.
use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{Count, Dataplane, Flow, FlowStats, SyncStats};
use crate::{
    core::compose::compose,
    core::elements::{Element, SetKey, placed_elements},
    core::model::{Masquerade, Mode, Network},
    node::{Netlink, NodeAddr, in_netns, netlink},
};

mod conntrack;
mod diff;
mod exec;
pub mod listing;
pub mod ruleset;

pub use diff::{Update, update};
pub use exec::{delete_table, nft};
pub use listing::{Listed, listed_elements};
pub use ruleset::{Layout, Subnets, TABLE_PREFIX, ruleset, table_name};

/// The nftables dataplane. It holds no state of its own: the kernel's tables are the record.
#[derive(Default)]
pub struct NftDataplane;

impl NftDataplane {
    fn list(network: &Network) -> Result<Vec<Listed>> {
        let name = network.name.clone();
        let json = in_netns(network.netns.as_deref(), move || exec::list_table(&name))?;
        listed_elements(&json)
    }
}

/// The IPv4 subnets on the network's interfaces, for hairpin masquerade.
fn subnets(
    nl: &Netlink,
    network: &Network,
    addrs: &[NodeAddr],
) -> Result<Vec<(String, Ipv4Addr, u8)>> {
    let mut subnets = Vec::new();
    // `iifname` matches an interface that appears later from when it does.
    for (i, index) in nl.present(&network.interfaces)? {
        for a in netlink::on_interface(addrs, index) {
            if a.prefix < 32 {
                subnets.push((i.to_owned(), a.addr, a.prefix));
            }
        }
    }
    Ok(subnets)
}

/// One sync in the network's namespace: the difference from `previous` when there is one and
/// the table is still the one written for it, else the whole table.
fn apply_in_netns(network: &Network, previous: Option<&Network>) -> Result<SyncStats> {
    let nl = Netlink::new()?;
    // One dump per apply, shared by the subnets and the aliases (see the eBPF dataplane).
    let addrs = nl.addresses()?;
    let subnets = subnets(&nl, network, &addrs)?;
    let alias_if = &network.interfaces[0];
    let want = network.vips();
    nl.add_aliases(alias_if, &want, &addrs)?;
    let mut stats = SyncStats::default();
    let applied = match previous {
        Some(prev) => {
            let diff = update(prev, network, &subnets)?;
            match exec::transaction(&diff.script) {
                Ok(()) => {
                    (stats.written, stats.deleted) = (diff.written, diff.deleted);
                    true
                }
                Err(e) => {
                    tracing::warn!(network = %network.name, error = %format!("{e:#}"),
                        "the table is not the one lb last wrote, or the difference was refused: declaring it whole");
                    false
                }
            }
        }
        None => false,
    };
    if !applied {
        let (script, elements) = ruleset::declare(network, &subnets)?;
        exec::transaction(&script)?;
        stats.written = elements;
    }
    if let Some(prev) = previous {
        nl.remove_aliases(alias_if, &prev.vips().difference(&want).copied().collect())?;
        stats.flows_flushed = conntrack::flush_removed_backends(prev, network)?;
    }
    Ok(stats)
}

/// Where br_netfilter hands the IP hooks a bridge's frames (a node running Docker or
/// Kubernetes loads it).
const BR_NETFILTER: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// One line per bridge of the network on which a backend balanced to *itself* through its own
/// VIP or published port would get no answer, naming the ports at fault.
///
/// Why: with br_netfilter on, the IP prerouting hook (our DNAT) runs from the bridge layer, and
/// when the new destination is on the same bridge the kernel *bridges* the frame to it instead
/// of routing it (`br_nf_pre_routing_finish`'s bridged DNAT). A peer backend gets it, and
/// postrouting still masquerades it; the asking backend does not, because a bridge sends a
/// frame back out the port it came in by only when that port is in hairpin mode. Docker (with
/// the userland proxy off) and the CNI bridge plugin (`hairpinMode`) set it on the ports they
/// create; lb does not change ports it does not own, it says so. The eBPF dataplane translates
/// on the bridge's own ingress, after the bridge layer has delivered the frame locally, so it
/// has no such case. Reads the calling thread's namespace (/proc/sys/net is per namespace).
fn hairpin_warnings_here(network: &Network) -> Result<Vec<String>> {
    if network.masquerade == Masquerade::Never {
        // Nothing hairpins without masquerade, on either dataplane.
        return Ok(Vec::new());
    }
    match std::fs::read_to_string(BR_NETFILTER) {
        Ok(v) if v.trim() == "1" => {}
        // br_netfilter not loaded, or off here: the DNATed frame is routed and masqueraded.
        Ok(_) => return Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {BR_NETFILTER}")),
    }
    let nl = Netlink::new()?;
    let mut warnings = Vec::new();
    for bridge in &network.interfaces {
        if let Some(ports) = nl.ports_without_hairpin(bridge)?
            && !ports.is_empty()
        {
            warnings.push(format!(
                "bridge {bridge}: hairpin mode is off on port(s) {} while br_netfilter is on \
                 (net.bridge.bridge-nf-call-iptables=1), so a backend behind them balanced to \
                 itself through its own VIP or published port gets no answer; turn it on as \
                 Docker and the CNI bridge plugin do: ip link set PORT type bridge_slave \
                 hairpin on",
                ports.join(", ")
            ));
        }
    }
    Ok(warnings)
}

impl Dataplane for NftDataplane {
    fn supports(&self, network: &Network) -> Result<()> {
        if network.mode == Mode::Dsr {
            bail!(
                "network {}: mode dsr is not available on the nftables dataplane",
                network.name
            );
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "nftables"
    }

    fn apply(&mut self, network: &Network, previous: Option<&Network>) -> Result<SyncStats> {
        let mut previous = previous;
        if let Some(prev) = previous
            && (prev.netns != network.netns
                || prev.interfaces.first() != network.interfaces.first())
        {
            // Another namespace or alias interface: the old table and aliases go, and the
            // new place gets the whole table.
            self.remove(prev)?;
            previous = None;
        }
        let (net, prev) = (network.clone(), previous.cloned());
        let stats = in_netns(network.netns.as_deref(), move || {
            apply_in_netns(&net, prev.as_ref())
        })
        .with_context(|| format!("network {}", network.name))?;
        tracing::info!(network = %network.name, table = %table_name(&network.name), "network applied (nftables)");
        // Said once per apply, that is once per change of the network; `lb status` says it
        // for as long as it holds (ports come and go without a sync).
        match self.warnings(network) {
            Ok(w) => {
                for warning in w {
                    tracing::warn!(network = %network.name, "{warning}");
                }
            }
            Err(e) => {
                tracing::warn!(network = %network.name, error = %format!("{e:#}"), "checking bridge hairpin modes")
            }
        }
        Ok(stats)
    }

    fn remove(&mut self, network: &Network) -> Result<()> {
        let net = network.clone();
        in_netns(network.netns.as_deref(), move || {
            delete_table(&net.name)?;
            Netlink::new()?.remove_aliases(&net.interfaces[0], &net.vips())
        })
        .with_context(|| format!("network {}: removing", network.name))?;
        tracing::info!(network = %network.name, "network removed (nftables)");
        Ok(())
    }

    /// Tables of networks not in `keep`, in the daemon's own namespace (a network in another
    /// namespace is known from applied.json and removed by `remove`).
    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let json = exec::nft(&["-j", "list", "tables", "ip"], None)?;
        let v: Value = serde_json::from_str(&json).context("nft's JSON output")?;
        let mut removed = Vec::new();
        for obj in v["nftables"].as_array().into_iter().flatten() {
            let Some(name) = obj["table"]["name"].as_str() else {
                continue;
            };
            let Some(network) = name.strip_prefix(TABLE_PREFIX) else {
                continue;
            };
            if keep.contains(&network) {
                continue;
            }
            exec::nft(&["delete", "table", "ip", name], None)?;
            tracing::info!(
                network,
                "removed the table of a network that is no longer configured"
            );
            removed.push(network.to_owned());
        }
        Ok(removed)
    }

    /// The kernel's NAT hands every packet to the stack; `fast-path` is the eBPF dataplane's.
    fn path(&mut self, _network: &Network) -> Option<String> {
        Some("stack: the nftables dataplane has no fast path".to_owned())
    }

    fn warnings(&mut self, network: &Network) -> Result<Vec<String>> {
        let net = network.clone();
        let mut warnings = in_netns(network.netns.as_deref(), move || {
            hairpin_warnings_here(&net)
        })
        .with_context(|| format!("network {}", network.name))?;
        if !network.timeouts.is_default() {
            warnings.push(
                "the network's flow timeouts are not applied on the nftables dataplane: the kernel's conntrack keeps its own (net.netfilter.nf_conntrack_*timeout* in the network's namespace)"
                    .to_owned(),
            );
        }
        Ok(warnings)
    }

    /// From the kernel's conntrack, which keeps no table of lb's to count.
    fn flow_stats(&mut self, network: &Network) -> Option<FlowStats> {
        self.flows(network).ok().map(|f| FlowStats::of(&f))
    }

    /// The kernel's conntrack entries translated to one of this network's services.
    fn flows(&mut self, network: &Network) -> Result<Vec<Flow>> {
        let composed = compose(network);
        in_netns(network.netns.as_deref(), move || {
            conntrack::flows(&composed)
        })
    }

    /// Per-element counters: the nat chain sees the first packet of each connection only, so
    /// here packets and bytes count new flows, not traffic. Each element is reported under
    /// the set and backend the desired state places it in; the table holds exactly those,
    /// except while a sync is failing, when the elements only the previous state had are left
    /// out until the retry heals it.
    fn counts(&mut self, network: &Network) -> Result<Vec<Count>> {
        Self::read_counts(network)
    }

    /// Listing the table is the whole cost of a scrape (seconds at 10,000 services), and the
    /// kernel's table is the record: read it off the actor.
    fn counts_reader(&self) -> Option<super::CountsReader> {
        Some(Self::read_counts)
    }
}

impl NftDataplane {
    /// Every service's and backend's packets and bytes, from the elements' counters.
    fn read_counts(network: &Network) -> Result<Vec<Count>> {
        let owner: HashMap<Element, (SetKey, Ipv4Addr)> = (placed_elements(network).into_iter())
            .map(|p| (p.element, (p.set, p.backend)))
            .collect();
        // (service, backend) → (packets, bytes): one pass over the elements.
        let mut sums: BTreeMap<(SetKey, Option<Ipv4Addr>), (u64, u64)> = BTreeMap::new();
        for l in Self::list(network)? {
            let Some(&(set, backend)) = owner.get(&l.element) else {
                continue;
            };
            for b in [None, Some(backend)] {
                let sum = sums.entry((set, b)).or_default();
                sum.0 += l.packets;
                sum.1 += l.bytes;
            }
        }
        Ok(sums
            .into_iter()
            .map(|((set, backend), (packets, bytes))| Count {
                service: set.to_string(),
                backend,
                packets,
                bytes,
            })
            .collect())
    }
}
