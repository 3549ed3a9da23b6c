//! `lb load` / `lb unload`: the eBPF dataplane programmed once from a desired-state file, no
//! daemon. Programs stay attached and maps pinned after the command exits, for bpftool and
//! for the next `lb load`, which adopts them and applies only the difference.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::{
    core::{
        compose::ComposedNetwork,
        model::{DesiredState, Network},
    },
    dataplane::{
        Dataplane as _, EbpfDataplane, SyncStats,
        ebpf::{OnIncompatible, TcMode},
    },
};

/// Where `lb load` records what it applied, so `lb unload` knows which interfaces and
/// aliases are its own.
pub const DEFAULT_RECORD_DIR: &str = "/run/lb";
const LOADED: &str = "loaded.json";

/// Applies one network (a test's shortcut to what `lb load` does per network).
pub fn apply_network(network: &Network, bpffs: &Path, tc_mode: TcMode) -> Result<SyncStats> {
    EbpfDataplane::new(bpffs, tc_mode)?.apply(&ComposedNetwork::new(network.clone()), None)
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
    on_incompatible: OnIncompatible,
) -> Result<Vec<(String, SyncStats)>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let state = DesiredState::from_json(&text).with_context(|| format!("{}", file.display()))?;
    let previous = read_loaded(state_dir)?;
    let mut dp = EbpfDataplane::new(bpffs, tc_mode)?.on_incompatible(on_incompatible);
    for network in &state.networks {
        dp.supports(network)?;
    }
    let mut applied = Vec::new();
    for network in &state.networks {
        let previous = previous.network(&network.name).cloned();
        let stats = dp.apply(
            &ComposedNetwork::new(network.clone()),
            previous.map(ComposedNetwork::new).as_ref(),
        )?;
        applied.push((network.name.clone(), stats));
    }
    for gone in previous
        .networks
        .iter()
        .filter(|n| state.network(&n.name).is_none())
    {
        dp.remove(gone)?;
    }
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    crate::write_atomically(&loaded_path(state_dir), state.to_json().as_bytes())?;
    Ok(applied)
}

/// `lb unload`: removes every network the last `lb load` applied.
pub fn unload(bpffs: &Path, state_dir: &Path, tc_mode: TcMode) -> Result<usize> {
    let previous = read_loaded(state_dir)?;
    let mut dp = EbpfDataplane::new(bpffs, tc_mode)?;
    for network in &previous.networks {
        dp.remove(network)?;
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
