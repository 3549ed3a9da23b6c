//! Which pinned maps may be adopted: the layout version each map was pinned in (recorded in
//! `lb_layout`), the maps whose version is not this binary's, and `lb_config` carried over
//! from an older layout (see the contract "A pinned map is adopted only in the layout this
//! binary's programs read" in [`super`]).
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use aya::maps::{Array, Map, MapData};
use lb_common::{Config, LAYOUT_MAP, MAP_LAYOUTS, Timeouts};

/// The layout versions recorded in `dir` (`None` when nothing is recorded).
fn recorded_layouts(dir: &Path) -> Result<Option<Vec<u32>>> {
    let path = dir.join(LAYOUT_MAP);
    if !path.exists() {
        return Ok(None);
    }
    let map = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    let array: Array<MapData, u32> = Array::try_from(Map::Array(map))?;
    let versions = (0..MAP_LAYOUTS.len() as u32)
        .map(|i| array.get(&i, 0).unwrap_or(0))
        .collect();
    Ok(Some(versions))
}

/// A pinned map whose recorded layout is not this binary's.
pub(super) struct Incompatible {
    pub(super) pin: PathBuf,
    pub(super) name: &'static str,
    /// The layout recorded for it (1: pinned before layouts were recorded).
    pub(super) have: u32,
    /// `"name (layout A, this lb reads B)"`.
    pub(super) described: String,
}

/// The pinned maps of `dir` whose recorded layout is not this binary's.
pub(super) fn incompatible_layouts(dir: &Path) -> Result<Vec<Incompatible>> {
    let recorded = recorded_layouts(dir)?;
    let mut out = Vec::new();
    for (i, (name, version)) in MAP_LAYOUTS.iter().enumerate() {
        let pin = dir.join(name);
        if !pin.exists() {
            continue;
        }
        // Maps pinned before versions were recorded are version 1.
        let have = recorded.as_ref().map_or(1, |r| r[i]);
        if have != *version {
            out.push(Incompatible {
                pin,
                name,
                have,
                described: format!("{name} (layout {have}, this lb reads {version})"),
            });
        }
    }
    Ok(out)
}

/// The map the controller rewrites whole at every apply but for one value it must keep: the
/// network's flow-hash key (a flow that loses its entries is re-created on its backend by it).
/// One pinned in another layout is replaced without asking, its values carried over
/// ([`converted_config`]).
pub(super) const CONFIG_MAP: &str = "lb_config";

/// `lb_config`'s value in layout 2 (before `tcp_time_wait`): the fields of [`Config`] then.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ConfigLayout2 {
    masquerade: u32,
    hash_key: u32,
    masq_port_min: u16,
    masq_port_max: u16,
    masq_hole_min: u16,
    masq_hole_max: u16,
    tcp_syn: u32,
    tcp_established: u32,
    tcp_closing: u32,
    tcp_unreplied: u32,
    udp: u32,
    fast_path: u32,
}

/// The config an `lb_config` pinned in layout `have` holds, in this binary's layout (what it
/// lacks at its default), or `None` where it is nothing to keep: layout 1 had no hash key.
/// Programs attached by the next apply run with it until that apply's sync writes the
/// network's own (attaching comes first), so it must be whole, not just the key.
pub(super) fn converted_config(pin: &Path, have: u32) -> Result<Option<Config>> {
    if have != 2 {
        return Ok(None);
    }
    let map = MapData::from_pin(pin).with_context(|| format!("opening {}", pin.display()))?;
    let array: Array<MapData, [u8; size_of::<ConfigLayout2>()]> = Array::try_from(Map::Array(map))
        .with_context(|| format!("{} is not a layout 2 lb_config", pin.display()))?;
    let bytes = (array.get(&0, 0)).with_context(|| format!("reading {}", pin.display()))?;
    let old: ConfigLayout2 = bytemuck::pod_read_unaligned(&bytes);
    Ok((old.hash_key != 0).then_some(Config {
        masquerade: old.masquerade,
        hash_key: old.hash_key,
        masq_port_min: old.masq_port_min,
        masq_port_max: old.masq_port_max,
        masq_hole_min: old.masq_hole_min,
        masq_hole_max: old.masq_hole_max,
        timeouts: Timeouts {
            tcp_syn: old.tcp_syn,
            tcp_established: old.tcp_established,
            tcp_closing: old.tcp_closing,
            tcp_unreplied: old.tcp_unreplied,
            udp: old.udp,
            tcp_time_wait: Timeouts::DEFAULT.tcp_time_wait,
        },
        fast_path: old.fast_path,
    }))
}

/// Whether every map pinned in `dir` is of this binary's layout (an unreadable record is not).
pub fn layouts_compatible(dir: &Path) -> bool {
    incompatible_layouts(dir).is_ok_and(|v| v.is_empty())
}

/// What to do with pinned maps of another layout (see the module's contracts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnIncompatible {
    /// Refuse the network and touch nothing.
    #[default]
    Refuse,
    /// Replace those maps, losing their contents once (the operator asked).
    Replace,
}
