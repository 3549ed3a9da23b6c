//! `lb load` / `lb unload`: the eBPF dataplane programmed once from a desired-state file, no
//! daemon. Programs stay attached and maps pinned after the command exits, for bpftool and
//! for the next `lb load`, which adopts them and applies only the difference.
//!
//! Order per network, as in the seed: VIP aliases are added before the maps point at them and
//! removed only after the maps no longer do, so a VIP is never routed to without its address.
use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::{
    compose::compose,
    dataplane::ebpf::{self, EbpfNetwork, NodeAddrs, SyncStats, TcMode},
    model::{DesiredState, Network},
    netlink::{Netlink, in_netns},
};

/// Where `lb load` records what it applied, so `lb unload` knows which interfaces and
/// aliases are its own.
pub const DEFAULT_STATE_DIR: &str = "/run/lb";
const LOADED: &str = "loaded.json";

/// Applies one network: attach (or adopt), aliases, maps. Runs inside the network's netns.
pub fn apply_network(network: &Network, bpffs: &Path, tc_mode: TcMode) -> Result<SyncStats> {
    let dir = ebpf::pin_dir(bpffs, &network.name);
    ebpf::ensure_bpffs(bpffs)?;
    let bpffs = bpffs.to_path_buf();
    let netns = network.netns.clone();
    let network = network.clone();
    in_netns(netns.as_deref(), move || {
        let nl = Netlink::new()?;
        let mut ifaces = Vec::new();
        for name in &network.interfaces {
            let index = nl.ifindex(name)?;
            // A masqueraded flow leaving by this interface takes its primary address.
            if let Some((addr, _)) = nl.ipv4_addrs(name)?.first() {
                ifaces.push((index, *addr));
            }
        }
        let composed = compose(&network);
        let plan = ebpf::plan(&network, &composed);
        let mut dp = EbpfNetwork::open(&dir).with_context(|| {
            format!(
                "network {}: opening its maps under {}",
                network.name,
                bpffs.display()
            )
        })?;
        for name in &network.interfaces {
            dp.attach(name, network.attach, tc_mode)
                .with_context(|| format!("network {}: attaching to {name}", network.name))?;
        }
        let alias_if = &network.interfaces[0];
        let want: BTreeSet<Ipv4Addr> = composed.vips.keys().copied().collect();
        for vip in &want {
            nl.add_alias(alias_if, *vip)?;
        }
        let node = NodeAddrs {
            local: nl.all_local_ipv4()?,
            ifaces,
        };
        let keep: BTreeSet<Ipv4Addr> = network
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .collect();
        let stats = dp
            .sync(&plan, &node, &keep)
            .with_context(|| format!("network {}: writing maps", network.name))?;
        for vip in nl.aliases(alias_if)? {
            if !want.contains(&vip) {
                nl.remove_alias(alias_if, vip)?;
            }
        }
        tracing::info!(network = %network.name, written = stats.written, deleted = stats.deleted,
            flushed = stats.flows_flushed, "network applied");
        Ok(stats)
    })
}

/// Removes one network: maps stop matching first (pins go, links detach), then its aliases.
pub fn remove_network(network: &Network, bpffs: &Path, tc_mode: TcMode) -> Result<()> {
    let dir = ebpf::pin_dir(bpffs, &network.name);
    let netns = network.netns.clone();
    let network = network.clone();
    in_netns(netns.as_deref(), move || {
        ebpf::detach_all(&dir, &network.interfaces, tc_mode)?;
        let nl = Netlink::new()?;
        let alias_if = &network.interfaces[0];
        for vip in network.services.iter().map(|s| s.vip) {
            nl.remove_alias(alias_if, vip)?;
        }
        Ok(())
    })
}

fn loaded_path(state_dir: &Path) -> PathBuf {
    state_dir.join(LOADED)
}

/// `lb load`: validates the whole file first (nothing is applied from an invalid one), then
/// applies every network, removes networks an earlier `lb load` applied that the file no
/// longer has, and records what it applied.
pub fn load(
    file: &Path,
    bpffs: &Path,
    state_dir: &Path,
    tc_mode: TcMode,
) -> Result<Vec<(String, SyncStats)>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let state = DesiredState::from_json(&text).with_context(|| format!("{}", file.display()))?;
    let previous = read_loaded(state_dir)?;
    let mut applied = Vec::new();
    for network in &state.networks {
        applied.push((
            network.name.clone(),
            apply_network(network, bpffs, tc_mode)?,
        ));
    }
    for gone in previous
        .networks
        .iter()
        .filter(|n| state.network(&n.name).is_none())
    {
        remove_network(gone, bpffs, tc_mode)?;
    }
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    crate::write_atomically(&loaded_path(state_dir), state.to_json().as_bytes())?;
    Ok(applied)
}

/// `lb unload`: removes every network the last `lb load` applied.
pub fn unload(bpffs: &Path, state_dir: &Path, tc_mode: TcMode) -> Result<usize> {
    let previous = read_loaded(state_dir)?;
    for network in &previous.networks {
        remove_network(network, bpffs, tc_mode)?;
    }
    let path = loaded_path(state_dir);
    if path.exists() {
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(previous.networks.len())
}

fn read_loaded(state_dir: &Path) -> Result<DesiredState> {
    let path = loaded_path(state_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => DesiredState::from_json(&text).with_context(|| format!("{}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DesiredState::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}
