//! bpftool's JSON output (`bpftool -j`), as an operator reads lb's maps and links with it.
//!
//! lb's maps are BTF maps, so `bpftool -j map dump` gives every entry's fields by name under
//! `formatted` (besides the raw bytes under `key` and `value`). Addresses and ports are kept in
//! network byte order, and bpftool prints such a field as the integer its bytes make on the
//! host (little-endian here): [`addr`] and [`port`] read them back.
use std::{net::Ipv4Addr, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

/// `bpftool -j ARGS`, parsed.
pub fn json(args: &[&str]) -> Result<Value> {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .context("running bpftool")?;
    ensure!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "bpftool {args:?} printed no JSON: {:?}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `bpftool batch file -`: runs every line of `script` as one bpftool command, in one
/// process; what they printed, one after the other.
pub fn batch(script: &str) -> Result<String> {
    let out = crate::tools::output_with_stdin(
        Command::new("bpftool").args(["batch", "file", "-"]),
        script.as_bytes(),
    )?;
    ensure!(
        out.status.success(),
        "bpftool batch {script:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn pin_arg(pin: &Path) -> Result<&str> {
    pin.to_str()
        .with_context(|| format!("{} is not UTF-8", pin.display()))
}

/// `bpftool -j map show pinned PIN`: the map's type, sizes, flags and, for a BTF map, `btf_id`.
pub fn map_show(pin: &Path) -> Result<Value> {
    json(&["map", "show", "pinned", pin_arg(pin)?])
}

/// One entry of a map with BTF, as `bpftool -j map dump` formats it: its fields by name.
#[derive(Clone, Debug)]
pub struct Entry {
    pub key: Value,
    pub value: Value,
}

/// `bpftool -j map dump pinned PIN`, every entry by its fields. Fails if an entry comes
/// without `formatted` fields, which is how bpftool dumps a map that has no BTF.
pub fn map_dump(pin: &Path) -> Result<Vec<Entry>> {
    let dump = json(&["map", "dump", "pinned", pin_arg(pin)?])?;
    let entries = dump
        .as_array()
        .with_context(|| format!("{}: a dump is a list: {dump}", pin.display()))?;
    (entries.iter())
        .map(|e| {
            let f = &e["formatted"];
            ensure!(
                f["key"].is_object() && f["value"].is_object(),
                "{}: an entry without fields by name (a map without BTF?): {e}",
                pin.display()
            );
            Ok(Entry {
                key: f["key"].clone(),
                value: f["value"].clone(),
            })
        })
        .collect()
}

/// An address field (`u32` in network byte order) as bpftool prints it: `"saddr": 33557002`
/// is the bytes 0a 0a 00 02, 10.10.0.2.
pub fn addr(field: &Value) -> Ipv4Addr {
    let n = field.as_u64().and_then(|n| u32::try_from(n).ok());
    Ipv4Addr::from(
        n.unwrap_or_else(|| panic!("{field} is no u32"))
            .to_ne_bytes(),
    )
}

/// A port field (`u16` in network byte order) as bpftool prints it: `"dport": 36895` is 8080.
pub fn port(field: &Value) -> u16 {
    let n = field.as_u64().and_then(|n| u16::try_from(n).ok());
    u16::from_be_bytes(
        n.unwrap_or_else(|| panic!("{field} is no u16"))
            .to_ne_bytes(),
    )
}
