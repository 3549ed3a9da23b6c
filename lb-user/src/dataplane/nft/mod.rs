//! The nftables dataplane: moby's ruleset (seed `service_nftables_lb_linux.go`) in a shape the
//! kernel takes at node scale, for kernels that cannot run the programs. Fed by the same
//! composed elements as the eBPF dataplane and `lb elements`, so both agree bucket for bucket.
//!
//! One table per network and family, `ip lb-<network>` and (while the network has IPv6 sets)
//! `ip6 lb-<network>`, with one writer (this daemon); `ruleset.rs`
//! renders it whole (its doc has the layout), `diff.rs` renders a sync's difference,
//! `exec.rs` runs `nft`, `listing.rs` reads elements and counters back, `conntrack.rs` lists
//! flows, `localnet.rs` sets `route_localnet` for node-local clients on 127.0.0.1 (and
//! records it in the table, to turn it off again). A `dsr` network also has moby's DSR
//! table, `netdev lb-<network>` (`dsr.rs`), written in the same transactions; its published
//! ports, and its VIPs where the kernel cannot run that table, are served by the NAT table.
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
//! Syncs. A sync is one `nft -f` transaction, or up to three where sets change shape (units
//! are declared a transaction before anything leads to them and deleted a transaction after
//! nothing does: `diff::Update::prepare` and `retire` say why), so a failed one leaves a
//! table that serves as before. A network's
//! first sync (`previous` is `None`: nothing recorded as applied) declares the table whole.
//! Later ones send the difference from `previous`, which starts by checking (and finally
//! swapping) the network's hash in the `lb-sync` set: a table that is not the one written
//! for `previous` (deleted, flushed, redeclared by hand) fails that transaction, and the same
//! sync declares the table whole instead. A hand edit inside a map that leaves `lb-sync` alone is not detected; the
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
//!
//! One file because it is the [`Dataplane`] trait's nftables implementation with the apply it runs
//! in a network's namespace; each part named above is a module beside it.
use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::OnceLock,
};

use anyhow::{Context as _, Result};

use super::{Count, Dataplane, Delta, Flow, FlowState, FlowStats, Kind, SyncStats, aliases};
use crate::{
    core::compose::ComposedNetwork,
    core::compose::PortKey,
    core::elements::{Element, SetKey, claimed_by, placed_elements},
    core::model::{Family, FlowTimeouts, Masquerade, Mode, Network, Proto},
    node::{Netlink, NodeAddr, in_netns, netlink},
};

mod conntrack;
mod diff;
pub mod dsr;
mod exec;
pub mod listing;
pub mod localnet;
pub mod ruleset;

pub use diff::{Update, update, update_sets};
pub use exec::{delete_table, nft};
pub use listing::{Listed, listed_elements, listed_real_server};
pub use ruleset::{Layout, Subnets, TABLE_PREFIX, ruleset, table_name};

/// The nftables dataplane. The kernel's tables are the record; it keeps only what the last
/// whole apply of each network read of the node (its subnets and the interfaces present),
/// so that a change of services alone ([`Dataplane::apply_sets`]) is one `nft` transaction,
/// no dump of the node's addresses or links.
#[derive(Default)]
pub struct NftDataplane {
    read: BTreeMap<String, NodeRead>,
}

/// What an apply read of the node: the subnets a network's base chains are rendered with
/// ([`Subnets`]), and its interfaces present (the DSR table's chains are theirs).
struct NodeRead {
    subnets: Vec<(String, IpAddr, u8)>,
    present: Vec<String>,
}

impl NftDataplane {
    /// The elements of the network's tables with their counters: the NAT tables' (the IPv6
    /// one only where the network has IPv6 sets: one `nft` run per table, none to look for
    /// tables), and the DSR table's `real-server` units where the network has one (listed
    /// with the table, its sessions too: nft lists no set of maps in one run). A table
    /// that cannot be listed (deleted by hand, or by a sync that ran meanwhile: the metrics
    /// read off the writer's path) leaves its counters out of this reading, never zeros: a
    /// counter back at zero would read as a reset.
    fn list(network: &ComposedNetwork) -> Result<Vec<Listed>> {
        let name = network.name.clone();
        let dsr6 = has_dsr_table(network).then(|| dsr::backends6(network));
        let families: Vec<Family> = (Family::ALL.iter().copied())
            .filter(|&f| f == Family::V4 || ruleset::has_ipv6(network))
            .collect();
        in_netns(network.netns.as_deref(), move || {
            let mut listed = Vec::new();
            for family in families {
                match exec::list_table(family, &name) {
                    Ok(json) => listed.extend(listed_elements(&json)?),
                    Err(e) => {
                        tracing::debug!(network = %name, error = %format!("{e:#}"), "counters not read")
                    }
                }
            }
            if let Some(backends6) = dsr6 {
                // IPv6's units have each backend's number ([`dsr::backends6`]) as its value.
                let json = exec::list_dsr_table(&name)?;
                listed.extend(listed_real_server(&json, &backends6)?);
            }
            Ok(listed)
        })
    }
}

/// `LB_NFT_DSR_FAIL=REASON` in the daemon's environment makes the DSR probe fail with REASON,
/// as on a kernel without the netdev egress hook (no kernel that runs the tests lacks it).
pub const DSR_FAIL_ENV: &str = "LB_NFT_DSR_FAIL";

/// Whether this kernel runs the DSR table (`Err`: why not, as the kernel or nft said): probed
/// once per daemon, on the first need, in the namespace of the network that needs it (a
/// kernel feature is the same in every namespace; `lo` is in each).
fn dsr_support() -> &'static Result<(), String> {
    static SUPPORT: OnceLock<Result<(), String>> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        let probed = match std::env::var(DSR_FAIL_ENV) {
            Ok(reason) => Err(anyhow::anyhow!("{reason}")),
            Err(_) => exec::transaction(&dsr::probe_script()),
        };
        let support = probed.map_err(|e| format!("{e:#}"));
        if let Err(why) = &support {
            tracing::warn!(error = %why, "{}", DSR_BY_NAT);
        }
        support
    })
}

/// What a dsr network gets where the DSR table cannot run (moby's message, and its answer).
const DSR_BY_NAT: &str = "the kernel does not run the nftables DSR table (it needs the netdev \
    egress hook, Linux 5.16 or later): the VIPs of dsr networks are load-balanced by NAT \
    instead of direct server return";

/// Whether `network` gets its DSR table, given what the kernel runs.
fn dsr_on(network: &Network, support: &Result<(), String>) -> bool {
    network.mode == Mode::Dsr && support.is_ok()
}

/// Whether `network` has its DSR table on this kernel (probing only for a dsr network).
fn has_dsr_table(network: &Network) -> bool {
    network.mode == Mode::Dsr && dsr_support().is_ok()
}

/// `lb status`'s line for a dsr network served by NAT.
fn dsr_warning(network: &Network, support: &Result<(), String>) -> Option<String> {
    match support {
        Err(why) if network.mode == Mode::Dsr => Some(format!("{DSR_BY_NAT} ({why})")),
        _ => None,
    }
}

/// The DSR part of a sync in the calling thread's namespace (see [`dsr::Sync`]): `whole` for
/// a whole declaration, which reads back the chains the table has.
fn dsr_sync(
    network: &Network,
    previous: Option<&Network>,
    present: &[String],
    support: &Result<(), String>,
    whole: bool,
) -> Result<dsr::Sync> {
    let on = dsr_on(network, support);
    let (chains, maps, sets6) = match previous {
        _ if whole && on => {
            let objects = exec::dsr_objects(&network.name)?;
            let sets6 = (objects.sets.into_iter())
                .filter(|s| dsr::parse_session_set6(s).is_some())
                .collect();
            (objects.chains, objects.maps, sets6)
        }
        Some(prev) if !whole => (
            (prev.interfaces.iter())
                .flat_map(|i| dsr::device_chains(i))
                .collect(),
            Vec::new(),
            (dsr::backends6(prev).into_iter())
                .flat_map(|b| dsr::PROTOS.iter().map(move |&p| dsr::session_set6(p, b)))
                .collect(),
        ),
        _ => (Vec::new(), Vec::new(), Vec::new()),
    };
    Ok(dsr::Sync {
        on,
        was_on: !whole && previous.is_some_and(|p| dsr_on(p, support)),
        present: present.to_vec(),
        chains,
        maps,
        sets6,
    })
}

/// The subnets on the network's interfaces, of both families, for hairpin masquerade: host
/// addresses (VIP aliases among them) and IPv6 link-local ones (no service is reached from
/// `fe80::/10`) are not subnets.
fn subnets(
    nl: &Netlink,
    network: &Network,
    addrs: &[NodeAddr],
) -> Result<Vec<(String, IpAddr, u8)>> {
    let mut subnets = Vec::new();
    // `iifname` matches an interface that appears later from when it does.
    for (i, index) in nl.present(&network.interfaces)? {
        for a in netlink::on_interface(addrs, index) {
            let link_local = matches!(a.addr, IpAddr::V6(v6) if v6.is_unicast_link_local());
            if !a.is_host() && !link_local {
                subnets.push((i.to_owned(), a.addr, a.prefix));
            }
        }
    }
    Ok(subnets)
}

/// One sync in the network's namespace: the difference from `previous` when there is one and
/// the table is still the one written for it, else the whole table.
fn apply_in_netns(
    network: &ComposedNetwork,
    previous: Option<&ComposedNetwork>,
) -> Result<(SyncStats, NodeRead)> {
    let nl = Netlink::new()?;
    // One dump per apply, shared by the subnets and the aliases (see the eBPF dataplane).
    let addrs = nl.addresses()?;
    let subnets = subnets(&nl, network, &addrs)?;
    let present: Vec<String> = (nl.present(&network.interfaces)?.into_iter())
        .map(|(i, _)| i.to_owned())
        .collect();
    let support = if network.mode == Mode::Dsr || previous.is_some_and(|p| p.mode == Mode::Dsr) {
        dsr_support()
    } else {
        &Ok(())
    };
    let table = table_name(&network.name);
    let localnet = localnet::Plan::new(network, &localnet::recorded(&table)?)?;
    let previous_aliases = previous.map(|p| aliases::Previous::of(p));
    let mut stats = aliases::around(&nl, &addrs, network, previous_aliases.as_ref(), || {
        let mut stats = SyncStats::default();
        let applied = match previous {
            Some(prev) => {
                let dsr = dsr_sync(network, Some(prev.network()), &present, support, false)?;
                let diff = update(prev, network, &subnets, &dsr)?;
                let prepared = diff.prepare.as_deref().map_or(Ok(()), exec::transaction);
                match prepared
                    .and_then(|()| exec::transaction(&(diff.script + &localnet.script(&table))))
                {
                    Ok(()) => {
                        // Switched: a failure from here is the apply's (its retry finds the
                        // table written for this network, not the previous one, and
                        // declares it whole).
                        if let Some(retire) = &diff.retire {
                            exec::transaction(retire)?;
                        }
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
            let dsr = dsr_sync(
                network,
                previous.map(|p| p.network()),
                &present,
                support,
                true,
            )?;
            let (script, elements) = ruleset::declare(network, &subnets, &dsr)?;
            exec::transaction(&(script + &localnet.script(&table)))?;
            stats.written = elements;
        }
        // With the record and the guard in.
        localnet.carry_out()?;
        Ok(stats)
    })?;
    if let Some(prev) = previous {
        stats.flows_flushed = conntrack::flush_removed_backends(prev, network)?;
    }
    // A UDP port that gained or changed its backends (every one, the first time after a
    // start): flows made while it had none would keep their clients off it.
    let none = BTreeMap::new();
    let before = previous.map_or(&none, |p| &p.composed().ports);
    for (key, set) in &network.composed().ports {
        if key.proto == Proto::Udp && !set.is_empty() && before.get(key) != Some(set) {
            stats.flows_flushed += conntrack::clear_untranslated(key)?;
        }
    }
    Ok((stats, NodeRead { subnets, present }))
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
    /// Every network: a dsr network's VIPs are served by NAT where the kernel cannot run the
    /// DSR table (said by `warnings`), as moby does. Both families.
    fn supports(&self, _network: &Network) -> Result<()> {
        Ok(())
    }

    fn kind(&self) -> Kind {
        Kind::Nftables
    }

    fn apply(
        &mut self,
        network: &ComposedNetwork,
        previous: Option<&ComposedNetwork>,
    ) -> Result<SyncStats> {
        self.supports(network)?;
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
        let (stats, read) = in_netns(network.netns.as_deref(), move || {
            apply_in_netns(&net, prev.as_ref())
        })
        .with_context(|| format!("network {}", network.name))?;
        self.read.insert(network.name.clone(), read);
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

    /// The touched sets' difference as one `nft` transaction (or up to three where a set's
    /// shape comes or goes, as a whole apply's), rendered outside the namespace from the
    /// previous and the current network, with the subnets the last whole apply read; then
    /// the conntrack entries a whole apply would clear, of the touched sets alone. Not for a
    /// VIP or a published port that comes or goes (aliases, held ports, `route_localnet`),
    /// nor a `dsr` network (its table's chains follow the node), nor one this process has not
    /// applied whole. A table that is not the one written for `previous` fails the first
    /// transaction, and the caller applies the network whole, which declares it.
    fn apply_sets(
        &mut self,
        network: &ComposedNetwork,
        delta: &Delta,
    ) -> Result<Option<SyncStats>> {
        if delta.vips_changed || delta.ports_changed || network.mode != delta.previous.mode {
            return Ok(None);
        }
        let Some(read) = self.read.get(&network.name) else {
            return Ok(None);
        };
        let support = if network.mode == Mode::Dsr {
            dsr_support()
        } else {
            &Ok(())
        };
        let previous = Some(delta.previous.network());
        let dsr = dsr_sync(network, previous, &read.present, support, false)?;
        let diff = diff::update_sets(delta.previous, network, delta.sets, &read.subnets, &dsr)?;
        let mut stats = SyncStats {
            written: diff.written,
            deleted: diff.deleted,
            flows_flushed: 0,
        };
        let udp: Vec<PortKey> = (delta.sets.iter())
            .filter_map(|s| match s {
                SetKey::Port(k) if k.proto == Proto::Udp => Some(*k),
                _ => None,
            })
            .filter(|k| {
                let now = network.composed().ports.get(k);
                now.is_some_and(|set| !set.is_empty())
                    && delta.previous.composed().ports.get(k) != now
            })
            .collect();
        let gone: Vec<IpAddr> = delta.gone_backends.iter().copied().collect();
        let flushed = in_netns(network.netns.as_deref(), move || {
            if let Some(p) = &diff.prepare {
                exec::transaction(p)?;
            }
            exec::transaction(&diff.script)?;
            if let Some(r) = &diff.retire {
                exec::transaction(r)?;
            }
            let mut flushed = conntrack::flush_backends(&gone)?;
            for key in &udp {
                flushed += conntrack::clear_untranslated(key)?;
            }
            Ok(flushed)
        })
        .with_context(|| format!("network {}: the difference of its sets", network.name))?;
        stats.flows_flushed = flushed;
        tracing::debug!(network = %network.name, written = stats.written, deleted = stats.deleted, "sets applied (nftables)");
        Ok(Some(stats))
    }

    fn remove(&mut self, network: &Network) -> Result<()> {
        let net = network.clone();
        in_netns(network.netns.as_deref(), move || {
            // route_localnet off before the guard goes with the table.
            aliases::after(&Netlink::new()?, &net, || {
                localnet::restore(&table_name(&net.name))?;
                delete_table(&net.name)
            })
        })
        .with_context(|| format!("network {}: removing", network.name))?;
        tracing::info!(network = %network.name, "network removed (nftables)");
        Ok(())
    }

    fn retire(&mut self, networks: &[Network]) -> Result<()> {
        for n in networks {
            in_netns(n.netns.as_deref(), {
                let name = n.name.clone();
                move || delete_table(&name)
            })
            .with_context(|| format!("network {}: deleting its nftables table", n.name))?;
        }
        self.remove_others(&[]).map(drop)
    }

    /// Tables of networks not in `keep`, in the daemon's own namespace (a network in another
    /// namespace is known from applied.json and removed by `remove`).
    fn others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for family in ["ip", "ip6", "netdev"] {
            let json = exec::nft(&["-j", "list", "tables", family], None)?;
            for name in exec::names(&json, "table")? {
                if let Some(network) = name.strip_prefix(TABLE_PREFIX)
                    && !keep.contains(&network)
                    && !out.iter().any(|o| o == network)
                {
                    out.push(network.to_owned());
                }
            }
        }
        Ok(out)
    }

    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        // A network's NAT tables, and its DSR table where it was a dsr network.
        for family in ["ip", "ip6", "netdev"] {
            let json = exec::nft(&["-j", "list", "tables", family], None)?;
            for name in exec::names(&json, "table")? {
                let Some(network) = name.strip_prefix(TABLE_PREFIX) else {
                    continue;
                };
                if keep.contains(&network) {
                    continue;
                }
                if family == "ip" {
                    localnet::restore(&name)?;
                }
                exec::nft(&["delete", "table", family, &name], None)?;
                tracing::info!(
                    network,
                    family,
                    "removed the table of a network that is no longer configured"
                );
                if !removed.iter().any(|r| r == network) {
                    removed.push(network.to_owned());
                }
            }
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
        if network.mode == Mode::Dsr {
            warnings.extend(dsr_warning(network, dsr_support()));
        }
        let nat_timeouts = FlowTimeouts {
            dsr: None,
            ..network.timeouts
        };
        let ipv6_any = |s: &crate::core::model::Service| {
            s.port_keys()
                .any(|(k, _)| k.family == Family::V6 && k.host_ip.is_none())
        };
        if network.services.iter().any(ipv6_any) {
            warnings.push(
                "published ports on every IPv6 address are not served on [::1] by the nftables dataplane: IPv6 has no route_localnet, so a flow from ::1 cannot leave the node (node-local clients use the node's own IPv6 address)"
                    .to_owned(),
            );
        }
        if !nat_timeouts.is_default() {
            warnings.push(
                "the network's flow timeouts are not applied on the nftables dataplane: the kernel's conntrack keeps its own (net.netfilter.nf_conntrack_*timeout* in the network's namespace)"
                    .to_owned(),
            );
        }
        Ok(warnings)
    }

    /// From the kernel's conntrack, which keeps no table of lb's to count.
    fn flow_stats(&mut self, network: &ComposedNetwork) -> Option<FlowStats> {
        self.flows(network).ok().map(|f| FlowStats::of(&f))
    }

    /// The kernel's conntrack entries translated to one of this network's services, and a
    /// dsr network's sessions.
    fn flows(&mut self, network: &ComposedNetwork) -> Result<Vec<Flow>> {
        let composed = network.composed().clone();
        let dsr = has_dsr_table(network).then(|| network.network().clone());
        in_netns(network.netns.as_deref(), move || {
            let mut flows = conntrack::flows(&composed)?;
            if let Some(network) = dsr {
                flows.extend(dsr_flows(&network)?);
            }
            Ok(flows)
        })
    }

    /// Per-element counters: the nat chain sees the first packet of each connection only, so
    /// here packets and bytes count new flows, not traffic. Each element is reported under
    /// the set and backend the desired state places it in; the table holds exactly those,
    /// except while a sync is failing, when the elements only the previous state had are left
    /// out until the retry heals it.
    fn counts(&mut self, network: &ComposedNetwork) -> Result<Vec<Count>> {
        Self::read_counts(network)
    }

    /// Listing the table is the whole cost of a scrape (seconds at 10,000 services), and the
    /// kernel's table is the record: read it off the actor.
    fn counts_reader(&self) -> Option<super::CountsReader> {
        Some(Self::read_counts)
    }
}

/// The DSR sessions of `network` in the calling thread's namespace, each with the backend
/// whose MAC it holds: the namespace's neighbour of that MAC, a backend of the network
/// first (`fwd ip to` resolved it as a neighbour when the session began), or the unspecified
/// address when no neighbour has it any more.
fn dsr_flows(network: &Network) -> Result<Vec<Flow>> {
    let backends: std::collections::BTreeSet<IpAddr> = (network.services.iter())
        .flat_map(|s| s.backends.iter().map(|b| b.ip))
        .collect();
    let mut by_mac: HashMap<String, IpAddr> = HashMap::new();
    // IPv4's sessions map to MACs; IPv6's are in their backend's set.
    for n in (Netlink::new()?.neighbours()?)
        .into_iter()
        .filter(|n| n.addr.is_ipv4())
    {
        let mac = (n.mac.iter())
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        let theirs = by_mac.get(&mac).is_some_and(|ip| backends.contains(ip));
        if !theirs {
            by_mac.insert(mac, n.addr);
        }
    }
    // (protocol, the set or map, the backend its sessions go to where it says).
    let mut lists: Vec<(Proto, &str, String, Option<IpAddr>)> = (dsr::PROTOS.iter())
        .map(|&p| (p, "map", dsr::session_map(p), None))
        .collect();
    if dsr::has_ipv6(network) {
        for b in dsr::backends6(network) {
            for &p in dsr::PROTOS {
                lists.push((p, "set", dsr::session_set6(p, b), Some(IpAddr::V6(b))));
            }
        }
    }
    let mut flows = Vec::new();
    for (proto, kind, object, set_backend) in lists {
        let json = exec::list_dsr(&network.name, kind, &object)
            .with_context(|| format!("listing the DSR sessions of network {}", network.name))?;
        for s in listing::sessions(&json)? {
            // A session whose MAC no neighbour has any more shows the unspecified address.
            let known = (s.mac.as_deref()).and_then(|m| by_mac.get(&m.to_ascii_lowercase()));
            let backend =
                (set_backend.or(known.copied())).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            flows.push(Flow {
                proto,
                client: s.client,
                frontend: s.service,
                service: None,
                backend: SocketAddr::new(backend, s.service.port()),
                state: FlowState::Dsr,
                expires_secs: Some(s.expires_secs),
                // nft lists whole seconds left, rounded down: idle rounds up.
                idle_secs: Some(s.timeout_secs.saturating_sub(s.expires_secs)),
            });
        }
    }
    flows.sort_by(|a, b| (&a.frontend, &a.client).cmp(&(&b.frontend, &b.client)));
    Ok(flows)
}

impl NftDataplane {
    /// Every service's and backend's packets and bytes, from the elements' counters.
    fn read_counts(network: &ComposedNetwork) -> Result<Vec<Count>> {
        let owner: HashMap<Element, (SetKey, IpAddr)> = (placed_elements(network).into_iter())
            .map(|p| (p.element, (p.set, p.backend)))
            .collect();
        // (service, backend) → (packets, bytes): one pass over the elements.
        let mut sums: BTreeMap<(SetKey, Option<IpAddr>), (u64, u64)> = BTreeMap::new();
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
        let ids = claimed_by(network);
        Ok(sums
            .into_iter()
            .map(|((set, backend), (packets, bytes))| {
                Count::new(&ids, set, backend, packets, bytes)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
