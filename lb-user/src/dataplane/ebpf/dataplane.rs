//! The eBPF dataplane behind [`Dataplane`]: one loaded object per network, kept open between
//! applies (so a change costs map writes, not a program load), pinned so that a restarted
//! daemon adopts it.
//!
//! The VIP aliases follow the maps in `dataplane::aliases`' order (added before the maps
//! point at them, removed after they no longer do).
//!
//! A network changed in place keeps its pins, and so its flows: interfaces added get the
//! programs, interfaces dropped lose them, `attach` switched between tc and xdp adds or
//! removes XDP alone, and the VIP aliases move with the first interface (added on the new one
//! before they leave the old). Only a change of namespace removes the network first: its
//! hooks and aliases are in another namespace, which the new one's apply cannot reach.
//!
//! One file because it is the [`Dataplane`] trait's eBPF implementation, a method per operation of
//! the trait; what the methods need at length (plans, syncs, attaching, the fast path, DSR) is in
//! the modules beside it.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{
    self as ebpf, EbpfNetwork, Held, MapSizes, NodeAddrs, OnIncompatible, ServiceKey, TcMode,
    attach::Wanted, fast::Rules, gc, liberal,
};
use crate::{
    core::compose::{ComposedNetwork, PortKey},
    core::elements::{SetKey, claimed_by},
    core::model::{Attach, Family, Mode, Network, Proto},
    dataplane::{Count, Dataplane, Delta, Flow, FlowStats, Kind, SyncStats, aliases},
    node::{
        LinkKind, Netlink, cgroup, in_netns, netlink, netns,
        veth::{self, Peer},
    },
};

pub struct EbpfDataplane {
    bpffs: PathBuf,
    tc_mode: TcMode,
    on_incompatible: OnIncompatible,
    /// What a network's maps are created with.
    sizes: MapSizes,
    nets: BTreeMap<String, EbpfNetwork>,
    /// The flow collector's findings, when one runs (the daemon's; `lb load` has none, and
    /// needs none: the programs expire flows themselves).
    collector: Option<gc::Collector>,
    /// Each applied network's conntrack worker (`liberal`), where a collector runs (the
    /// daemon).
    liberal: BTreeMap<String, liberal::Worker>,
}

impl EbpfDataplane {
    /// A dataplane pinning under `bpffs` (mounted if it lies under an unmounted /sys/fs/bpf).
    pub fn new(bpffs: &Path, tc_mode: TcMode) -> Result<Self> {
        ebpf::ensure_bpffs(bpffs)?;
        Ok(Self::at(bpffs, tc_mode))
    }

    /// A dataplane only to retire ([`Dataplane::retire`]) what an earlier daemon left under
    /// `bpffs`: unlike [`EbpfDataplane::new`] it mounts nothing (a bpffs that is not mounted
    /// holds no pins).
    pub fn retiring(bpffs: &Path, tc_mode: TcMode) -> Self {
        Self::at(bpffs, tc_mode)
    }

    fn at(bpffs: &Path, tc_mode: TcMode) -> Self {
        Self {
            bpffs: bpffs.to_path_buf(),
            tc_mode,
            on_incompatible: OnIncompatible::Refuse,
            sizes: MapSizes::default(),
            nets: BTreeMap::new(),
            collector: None,
            liberal: BTreeMap::new(),
        }
    }

    /// What opening a network does with pinned maps of another layout (refused by default).
    pub fn on_incompatible(mut self, on: OnIncompatible) -> Self {
        self.on_incompatible = on;
        self
    }

    /// Maps created from now on get `sizes`; maps already pinned keep theirs (reported).
    pub fn with_sizes(mut self, sizes: MapSizes) -> Self {
        self.sizes = sizes;
        self
    }

    /// Starts the conntrack worker of `network` (`liberal`), unless it runs in that namespace
    /// already.
    fn serve_conntrack(&mut self, network: &Network) -> Result<()> {
        let netns = network.netns.as_deref();
        if self
            .liberal
            .get(&network.name)
            .is_some_and(|w| w.netns() == netns)
        {
            return Ok(());
        }
        let dir = ebpf::pin_dir(&self.bpffs, &network.name);
        let worker = liberal::spawn(&network.name, &dir, netns)?;
        self.liberal.insert(network.name.clone(), worker);
        Ok(())
    }

    /// Starts the flow collector over this dataplane's pins, every `interval`.
    pub fn collect_every(&mut self, interval: Duration) -> Result<()> {
        self.collector = Some(gc::spawn(&self.bpffs, interval)?);
        Ok(())
    }

    /// The collector's latest walk of network `name`'s tables (`None` without a collector:
    /// retired counter ids then stay out of use for the process's life).
    fn walked(&self, name: &str) -> Option<gc::Referenced> {
        self.collector.as_ref()?.walked(name)
    }

    pub fn tc_mode(&self) -> TcMode {
        self.tc_mode
    }

    fn open(&mut self, name: &str) -> Result<EbpfNetwork> {
        match self.nets.remove(name) {
            Some(dp) => Ok(dp),
            None => {
                let dir = ebpf::pin_dir(&self.bpffs, name);
                let net = EbpfNetwork::open(&dir, &self.sizes, self.on_incompatible)
                    .with_context(|| format!("network {name}: opening its maps"))?;
                for (map, have, want, flag) in net.sizes().differences(&self.sizes) {
                    tracing::warn!(network = %name, map, pinned = have, configured = want, flag,
                        "adopted a pinned map of another size; it keeps its size until the network is removed and added again");
                }
                Ok(net)
            }
        }
    }

    fn net(&mut self, name: &str) -> Result<&mut EbpfNetwork> {
        if !self.nets.contains_key(name) {
            let dp = self.open(name)?;
            self.nets.insert(name.to_owned(), dp);
        }
        Ok(self.nets.get_mut(name).expect("inserted above"))
    }
}

/// Whether `b` can be applied over `a` in place, or `a` must be removed first: only when
/// the namespace changes, since `a`'s hooks and aliases are out of `b`'s reach (every other
/// change keeps the pins and the flows, see the module doc).
fn same_shape(a: &Network, b: &Network) -> bool {
    a.netns == b.netns
}

/// What of the previously applied version an apply changes in place.
#[derive(Default)]
struct Previous {
    aliases: Option<aliases::Previous>,
    /// Interfaces the network no longer has.
    dropped: Vec<String>,
}

/// Everything of one apply that must run inside the network's namespace.
fn apply_in_netns(
    dp: &mut EbpfNetwork,
    network: &ComposedNetwork,
    previous: &Previous,
    tc_mode: TcMode,
    walked: Option<&gc::Referenced>,
) -> Result<SyncStats> {
    let nl = Netlink::new()?;
    // One dump of the namespace's addresses per apply, for the interfaces' primary addresses,
    // the aliases present and the node's own addresses: with thousands of VIP aliases a dump
    // costs more than the rest of a one-service change. Aliases this apply adds are lb's, so
    // they could not change what is read of the node; anything else that changes meanwhile
    // is an address event, and the daemon applies again.
    let addrs = nl.addresses()?;
    let mut ifaces = Vec::new();
    let mut indexes = Vec::new();
    let vips = network.vips();
    for (name, index) in nl.present(&network.interfaces)? {
        // A masqueraded flow leaving by this interface takes its primary address of the
        // flow's family (IPv6: not a link-local one, which a backend elsewhere cannot answer),
        // never one of lb's VIP aliases: the kernel lists IPv6 addresses newest first, so an
        // alias would come before the interface's own address, and a backend that owns the
        // VIP (a dsr network's) would take the answer to it for itself.
        for v6 in [false, true] {
            let primary = netlink::on_interface(&addrs, index)
                .filter(|a| !a.is_lb_alias(&vips))
                .map(|a| a.addr)
                .find(|a| a.is_ipv6() == v6 && !is_link_local(*a));
            if let Some(a) = primary {
                ifaces.push((index, a));
            }
        }
        indexes.push(index);
        dp.attach(&nl, name, network.attach, tc_mode)
            .with_context(|| format!("attaching to {name}"))?;
    }
    sync_sock(dp).context("socket-level balancing of the namespace's own processes")?;
    let ports = dp
        .sync_fast_path(&nl, network, &indexes, tc_mode, Rules::Read)
        .context("the fast path")?;
    // The new hooks are in before the old ones go: an interface that stays never loses its
    // programs, and one that goes keeps them until its last packet here is written.
    dp.detach_unwanted(
        &Wanted::new(&network.interfaces, &ports, network.attach, tc_mode),
        &previous.dropped,
        tc_mode,
    )
    .context("detaching hooks the network no longer has")?;
    let mut plan = ebpf::plan(network, network.composed());
    dp.sync_dsr(&nl, &indexes, &addrs, &mut plan)
        .context("resolving the DSR backends")?;
    // The node's own addresses, without lb's VIP aliases: a VIP is matched on every port by
    // its own map, and thousands of aliases would not fit the local-address map. An address
    // of the node is never taken for an alias, so no service added or removed here can take
    // it out of the map.
    let mut vips = network.vips();
    if let Some(p) = &previous.aliases {
        vips.extend(&p.vips);
    }
    let node = NodeAddrs {
        local: netlink::node_addrs(&addrs, &vips).into_iter().collect(),
        ifaces,
        ephemeral: NodeAddrs::read_ephemeral(),
    };
    let keep: BTreeSet<IpAddr> = (network.services.iter())
        .flat_map(|s| s.backends.iter().map(|b| b.ip))
        .collect();
    aliases::around(&nl, &addrs, network, previous.aliases.as_ref(), || {
        dp.sync(&plan, &node, &keep, walked).context("writing maps")
    })
}

/// Socket-level balancing for the calling thread's namespace (`lb-ebpf` `sock`): the record
/// of which namespace the programs serve is written before they are attached, so they never
/// act on another's sockets. Without a cgroup2 hierarchy there is nothing to attach them to:
/// logged here, and in the network's status (`warnings`).
fn sync_sock(dp: &mut EbpfNetwork) -> Result<()> {
    dp.serve_sockets_of(netns::cookie()?)?;
    match cgroup::cgroup2_root()? {
        Some(root) => dp.attach_sock(&root),
        None => {
            tracing::warn!("{NO_CGROUP2}");
            Ok(())
        }
    }
}

/// Why processes of the network's namespace do not reach its services on a node without
/// cgroup2.
const NO_CGROUP2: &str = "no cgroup2 hierarchy is mounted (see /proc/self/mountinfo): processes of the network's namespace do not reach its VIPs and published ports (socket-level balancing attaches to the cgroup2 root)";

/// The fast path alone, again (neighbours, bridge ports or forward-hook rules changed): no
/// other map or hook is touched.
fn refresh_in_netns(
    dp: &mut EbpfNetwork,
    network: &Network,
    rules: Rules,
    tc_mode: TcMode,
) -> Result<()> {
    let nl = Netlink::new()?;
    let indexes: Vec<u32> = (nl.present(&network.interfaces)?.into_iter())
        .map(|(_, i)| i)
        .collect();
    let ports = dp.sync_fast_path(&nl, network, &indexes, tc_mode, rules)?;
    dp.detach_unwanted(
        &Wanted::new(&network.interfaces, &ports, network.attach, tc_mode),
        &[],
        tc_mode,
    )
}

impl Dataplane for EbpfDataplane {
    fn kind(&self) -> Kind {
        Kind::Ebpf
    }

    /// Every network, DSR of both families included.
    fn supports(&self, _network: &Network) -> Result<()> {
        Ok(())
    }

    /// The plan's need against what the network's maps hold and their real sizes; a network
    /// with no maps yet against the sizes its maps will be created with.
    fn check_capacity(&mut self, network: &ComposedNetwork) -> Result<()> {
        let plan = ebpf::plan(network, network.composed());
        let configured = self.sizes;
        let exists = self.nets.contains_key(&network.name)
            || ebpf::pin_dir(&self.bpffs, &network.name).exists();
        let empty = Held::new();
        let (held, sizes) = if exists {
            let dp = self.net(&network.name)?;
            let sizes = dp.sizes();
            (dp.held()?, sizes)
        } else {
            (&empty, configured)
        };
        ebpf::need(&plan, held, network.interfaces.len()).check(&network.name, &sizes, &configured)
    }

    fn apply(
        &mut self,
        network: &ComposedNetwork,
        previous: Option<&ComposedNetwork>,
    ) -> Result<SyncStats> {
        self.supports(network)?;
        let mut prev = Previous::default();
        if let Some(p) = previous {
            if same_shape(p, network) {
                prev = Previous {
                    aliases: Some(aliases::Previous::of(p)),
                    dropped: (p.interfaces.iter())
                        .filter(|i| !network.interfaces.contains(i))
                        .cloned()
                        .collect(),
                };
            } else {
                self.remove(p)?;
            }
        }
        let mut dp = self.open(&network.name)?;
        let net = network.clone();
        let tc_mode = self.tc_mode;
        let walked = self.walked(&network.name);
        // The object travels into the namespace's thread and back; if the thread cannot join
        // the namespace it is dropped, and the next apply adopts the pins again.
        let (dp, result) = in_netns(network.netns.as_deref(), move || {
            let r = apply_in_netns(&mut dp, &net, &prev, tc_mode, walked.as_ref());
            Ok((dp, r))
        })
        .with_context(|| format!("network {}", network.name))?;
        self.nets.insert(network.name.clone(), dp);
        let stats = result.with_context(|| format!("network {}", network.name))?;
        // A dsr network is applied again at every neighbour event (its backends' MACs), most
        // of which change nothing: those are not worth an info line each.
        if stats == SyncStats::default() {
            tracing::debug!(network = %network.name, "network applied, nothing changed");
        } else {
            tracing::info!(network = %network.name, written = stats.written, deleted = stats.deleted,
                flushed = stats.flows_flushed, "network applied");
        }
        if let Some(c) = &self.collector {
            c.kick();
            self.serve_conntrack(network)?;
        }
        Ok(stats)
    }

    /// The sets' entries alone, through the mirror, without entering the namespace (maps
    /// are reached by their fds), reading the node, or touching hooks and aliases. Not for a
    /// change of VIPs (aliases), nor a `dsr` network (its sets carry backend MACs resolved
    /// from the node), nor a network this process has not applied whole yet.
    fn apply_sets(
        &mut self,
        network: &ComposedNetwork,
        delta: &Delta,
    ) -> Result<Option<SyncStats>> {
        if delta.vips_changed || network.mode == Mode::Dsr {
            return Ok(None);
        }
        let walked = self.walked(&network.name);
        let Some(dp) = self.nets.get_mut(&network.name) else {
            return Ok(None);
        };
        let sets = ebpf::plan_sets(network, network.composed(), delta.sets);
        let synced = dp.sync_sets(
            &sets,
            &delta.new_backends,
            &delta.gone_backends,
            walked.as_ref(),
        );
        let stats = synced.with_context(|| format!("network {}: writing maps", network.name))?;
        tracing::debug!(network = %network.name, written = stats.written, deleted = stats.deleted,
            flushed = stats.flows_flushed, "sets applied");
        Ok(Some(stats))
    }

    /// What the sets need, counted against what the maps hold.
    fn check_capacity_sets(
        &mut self,
        network: &ComposedNetwork,
        sets: &BTreeSet<SetKey>,
    ) -> Result<()> {
        if !self.nets.contains_key(&network.name) {
            return self.check_capacity(network);
        }
        let configured = self.sizes;
        let part = ebpf::plan_sets(network, network.composed(), sets);
        let dp = self.net(&network.name)?;
        let sizes = dp.sizes();
        let (held, mut base) = dp.held_with_need()?;
        base.ifaces = network.interfaces.len();
        ebpf::need_sets(&part, held, base).check(&network.name, &sizes, &configured)
    }

    fn refresh(&mut self, network: &ComposedNetwork, firewall: bool) -> Result<()> {
        if !self.nets.contains_key(&network.name) {
            // Never applied by this process: its next apply decides the path.
            return Ok(());
        }
        if network.mode == Mode::Dsr {
            // Which backends may take new sessions follows their MACs: the whole network is
            // applied again (only what differs is written).
            return self.apply(network, Some(network)).map(|_| ());
        }
        let Some(mut dp) = self.nets.remove(&network.name) else {
            return Ok(());
        };
        let net = network.clone();
        let tc_mode = self.tc_mode;
        let (dp, result) = in_netns(network.netns.as_deref(), move || {
            let rules = if firewall {
                Rules::Changed
            } else {
                Rules::Kept
            };
            let r = refresh_in_netns(&mut dp, &net, rules, tc_mode);
            Ok((dp, r))
        })
        .with_context(|| format!("network {}", network.name))?;
        self.nets.insert(network.name.clone(), dp);
        result.with_context(|| format!("network {}: the fast path", network.name))
    }

    fn path(&mut self, network: &Network) -> Option<String> {
        let dp = self.nets.get(&network.name)?;
        dp.path().map(|p| p.to_string())
    }

    fn remove(&mut self, network: &Network) -> Result<()> {
        // Our handles go first: the pins are then the only references, and removing them
        // frees the maps and detaches TCX/XDP links.
        self.nets.remove(&network.name);
        self.liberal.remove(&network.name);
        let dir = ebpf::pin_dir(&self.bpffs, &network.name);
        let net = network.clone();
        let tc_mode = self.tc_mode;
        in_netns(network.netns.as_deref(), move || {
            // Netlink filters have no pin: the reply hooks are found on the ports of the
            // network's bridges as they are now.
            let mut ifnames = net.interfaces.clone();
            if tc_mode == TcMode::Netlink {
                let nl = Netlink::new()?;
                let links = nl.link_table()?;
                let ours: Vec<u32> = (nl.present(&net.interfaces)?.into_iter())
                    .map(|(_, i)| i)
                    .collect();
                ifnames.extend(
                    (links.iter())
                        .filter(|l| l.master.is_some_and(|m| ours.contains(&m)))
                        .map(|l| l.name.clone()),
                );
            }
            ebpf::detach_all(&dir, &ifnames, tc_mode)?;
            let nl = Netlink::new()?;
            // The neighbour entries lb kept resolved for the network's DSR backends.
            let ours: Vec<u32> = (nl.present(&net.interfaces)?.into_iter())
                .map(|(_, i)| i)
                .collect();
            aliases::after(&nl, &net, || {
                for (i, a) in nl.managed_neighbours()? {
                    if ours.contains(&i) {
                        nl.forget_neighbour(i, a)?;
                    }
                }
                Ok(())
            })
        })
        .with_context(|| format!("network {}: removing", network.name))?;
        tracing::info!(network = %network.name, "network removed");
        Ok(())
    }

    /// Every hook of `networks` (netlink filters have no pin: they are found on the
    /// networks' interfaces), then every pin directory.
    fn retire(&mut self, networks: &[Network]) -> Result<()> {
        for n in networks {
            let dir = ebpf::pin_dir(&self.bpffs, &n.name);
            let (ifaces, tc_mode) = (n.interfaces.clone(), self.tc_mode);
            in_netns(n.netns.as_deref(), move || {
                ebpf::detach_all(&dir, &ifaces, tc_mode)
            })
            .with_context(|| format!("network {}: detaching the eBPF programs", n.name))?;
        }
        self.remove_others(&[]).map(drop)
    }

    fn others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.bpffs) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e).with_context(|| format!("listing {}", self.bpffs.display())),
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", self.bpffs.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && !keep.contains(&name.as_str()) {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let others = self.others(keep)?;
        for name in &others {
            self.nets.remove(name);
            self.liberal.remove(name);
            // Unknown interfaces: TCX and XDP links go with their pins.
            ebpf::detach_all(&ebpf::pin_dir(&self.bpffs, name), &[], self.tc_mode)?;
            tracing::info!(network = %name, "removed pins of a network that is no longer configured");
        }
        Ok(others)
    }

    fn flows(&mut self, network: &ComposedNetwork) -> Result<Vec<Flow>> {
        let dp = self.net(&network.name)?;
        let now = gc::monotonic_ns();
        let mut flows = gc::live_flows(&dp.flow_entries(), now);
        flows.extend(gc::live_flows(&dp.flow_entries6(), now));
        if network.mode == Mode::Dsr {
            flows.extend(dp.dsr_flows(network.timeouts.dsr_secs(), now));
        }
        Ok(flows)
    }

    /// The collector's last pass (the writer never walks the table for this).
    fn flow_stats(&mut self, network: &ComposedNetwork) -> Option<FlowStats> {
        let all = (self.collector.as_ref()?.stats)
            .lock()
            .expect("collector stats lock");
        all.get(&network.name).cloned()
    }

    fn reasons(&mut self, network: &Network) -> Result<Vec<(&'static str, &'static str, u64)>> {
        let dp = self.net(&network.name)?;
        Ok(dp
            .reasons()?
            .into_iter()
            .map(|(hook, r, n)| (hook, lb_common::Reason::ALL[r as usize].1, n))
            .collect())
    }

    /// What `attach xdp` does not deliver on this node: interfaces without native XDP (TC
    /// serves them alone), and veths, where XDP costs more than it saves: the kernel turns
    /// TSO/GSO off on the peer of a veth with any XDP program (frags-aware or not:
    /// `veth_fix_features`), and makes the veth run its peer's packets through NAPI and an
    /// xdp_buff (20-25% of packets per second measured here before the program does anything),
    /// while TC alone sees the same skb for free.
    fn warnings(&mut self, network: &Network) -> Result<Vec<String>> {
        let mut out = Vec::new();
        if cgroup::cgroup2_root()?.is_none() {
            out.push(NO_CGROUP2.to_owned());
        }
        if network.mode == Mode::Dsr {
            let dp = self.net(&network.name)?;
            for (b, why) in dp.dsr_unresolved() {
                out.push(format!("dsr backend {b} gets no new sessions: {why}"));
            }
            if network.attach == Attach::Xdp {
                out.extend(xdp_tx_peers(network)?);
            }
        }
        if network.attach != Attach::Xdp {
            return Ok(out);
        }
        let dp = self.net(&network.name)?;
        let (with, without): (Vec<String>, Vec<String>) = (network.interfaces.iter())
            .cloned()
            .partition(|i| dp.has_xdp(i));
        let veths = in_netns(network.netns.as_deref(), move || {
            let nl = Netlink::new()?;
            let mut veths = Vec::new();
            for i in &with {
                if nl.is_veth(i)? {
                    veths.push(i.clone());
                }
            }
            Ok(veths)
        })?;
        if !without.is_empty() {
            out.push(format!(
                "attach xdp: {} has no native XDP; TC ingress serves it alone (generic XDP would only add cost)",
                without.join(", ")
            ));
        }
        if !veths.is_empty() {
            out.push(format!(
                "attach xdp on veth {}: on a veth XDP costs more than it saves (the kernel turns TSO/GSO off on the veth's peer for any XDP program, and the veth switches to NAPI and xdp_buff for every packet: 20-25% of packets/s here before lb does anything); attach tc is faster on veth, XDP pays off on physical NICs with native driver support",
                veths.join(", ")
            ));
        }
        Ok(out)
    }

    fn counts(&mut self, network: &ComposedNetwork) -> Result<Vec<Count>> {
        let dp = self.net(&network.name)?;
        let mut out = Vec::new();
        // What the mirror says is named, with what the counters map holds: no map is walked
        // but the counters, and only those that counted a packet.
        let counted = dp.counters()?;
        let of = |id: u32| counted.get(&id).copied().unwrap_or_default();
        let (held, totals) = dp.service_totals(&counted)?;
        let ids = claimed_by(network);
        for (key, (_, backends)) in held {
            // lb writes only protocols it publishes: an entry of any other is not its own.
            let Some(set) = set_key(key) else {
                tracing::warn!(network = %network.name, entry = ?key, "a service entry of an unknown protocol");
                continue;
            };
            let c = totals.get(key).copied().unwrap_or_default();
            out.push(Count::new(&ids, set, None, c.packets, c.bytes));
            for b in backends {
                let c = of(b.counter);
                out.push(Count::new(&ids, set, Some(b.addr.ip()), c.packets, c.bytes));
            }
        }
        Ok(out)
    }
}

fn is_link_local(a: IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local())
}

/// For a `dsr` network attached by XDP: the veths among its interfaces whose peer would lose
/// what XDP_TX sends (no XDP program there, `node::veth`), or could not be checked.
fn xdp_tx_peers(network: &Network) -> Result<Vec<String>> {
    let interfaces = network.interfaces.clone();
    in_netns(network.netns.as_deref(), move || {
        let nl = Netlink::new()?;
        let links = nl.link_table()?;
        let mut out = Vec::new();
        for name in &interfaces {
            let Some(link) = links
                .iter()
                .find(|l| &l.name == name && l.kind == LinkKind::Veth)
            else {
                continue;
            };
            match veth::peer_of(&nl, link) {
                Peer::Takes => {}
                Peer::Drops { peer, gro } => out.push(format!(
                    "dsr with attach xdp on veth {name}: XDP_TX out of a veth reaches its peer through the peer's XDP receive path, and its peer {peer} has no XDP program, so DSR frames are lost{}; attach an XDP program that passes frames to the peer, or use attach tc",
                    if gro {
                        " (it has GRO on, which the kernel documents as enough, but frames to a peer with GRO alone were lost on Linux 6.18 in lb's tests)"
                    } else {
                        ""
                    }
                )),
                Peer::Unknown(why) => out.push(format!(
                    "dsr with attach xdp on veth {name}: XDP_TX out of a veth reaches its peer only while the peer has an XDP program, which could not be checked ({why})"
                )),
            }
        }
        Ok(out)
    })
}

/// The composed set a service entry holds; `None` for a protocol lb does not publish.
fn set_key(key: &ServiceKey) -> Option<SetKey> {
    match *key {
        ServiceKey::Vip(a) => Some(SetKey::Vip(a.ip())),
        ServiceKey::Port { addr, port, proto } => Proto::from_number(proto).map(|proto| {
            let ip = addr.ip();
            SetKey::Port(PortKey::new(
                (!ip.is_unspecified()).then_some(ip),
                Family::of(ip),
                proto,
                u16::from_be(port),
            ))
        }),
    }
}
