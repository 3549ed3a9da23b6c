//! The nftables dataplane's uses of `nft` ([`crate::node::nft`] runs it): transactions,
//! its tables deleted, listed and read back.
use anyhow::{Context as _, Result};

use super::ruleset::{self, table_name};
use crate::core::model::Family;
pub use crate::node::nft::nft;

/// Applies `script` as one transaction (`nft -f -`): all of it or nothing.
pub fn transaction(script: &str) -> Result<()> {
    nft(&["-f", "-"], Some(script)).map(drop)
}

/// Deletes network `name`'s tables (its NAT tables of both families and its DSR table) in
/// the calling thread's namespace, those there are.
pub fn delete_table(name: &str) -> Result<()> {
    let mut s = String::new();
    for &family in Family::ALL {
        ruleset::delete_table(&mut s, &ruleset::table(family, name));
    }
    super::dsr::delete_table(&mut s, name);
    transaction(&s)
}

/// `nft -j list KIND netdev` of one map or set of network `name`'s DSR table.
pub fn list_dsr(name: &str, kind: &str, object: &str) -> Result<String> {
    nft(
        &["-j", "list", kind, "netdev", &table_name(name), object],
        None,
    )
}

/// The names of a DSR table's objects, by kind (a map is not a set here).
#[derive(Debug, Default)]
pub struct Objects {
    pub chains: Vec<String>,
    pub maps: Vec<String>,
    pub sets: Vec<String>,
}

/// The objects of network `name`'s DSR table (none when it has no such table).
pub fn dsr_objects(name: &str) -> Result<Objects> {
    let table = table_name(name);
    // An absent table is the only expected failure, told apart by listing the family's
    // tables (nft's message is not a contract).
    let tables = nft(&["-j", "list", "tables", "netdev"], None)?;
    if !names(&tables, "table")?.contains(&table) {
        return Ok(Objects::default());
    }
    // `-t`: without the sessions' elements.
    let json = nft(&["-t", "-j", "list", "table", "netdev", &table], None)?;
    Ok(Objects {
        chains: names(&json, "chain")?,
        maps: names(&json, "map")?,
        sets: names(&json, "set")?,
    })
}

/// `nft -j list table netdev` of network `name`'s DSR table.
pub fn list_dsr_table(name: &str) -> Result<String> {
    list_of("netdev", name)
}

/// The `name` of every object of kind `kind` in `nft -j` output.
pub fn names(json: &str, kind: &str) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(json).context("nft's JSON output")?;
    Ok((v["nftables"].as_array().into_iter().flatten())
        .filter_map(|o| o[kind]["name"].as_str())
        .map(str::to_owned)
        .collect())
}

/// `nft -j list table` of network `name`'s table of `family`. One run: the caller lists
/// only a table the network has, so an absent one is an error (nft's), not an empty table.
pub fn list_table(family: Family, name: &str) -> Result<String> {
    list_of(ruleset::nft_family(family), name)
}

/// `nft -j list table FAMILY lb-NAME`.
fn list_of(family: &str, name: &str) -> Result<String> {
    let table = table_name(name);
    nft(&["-j", "list", "table", family, &table], None)
        .with_context(|| format!("listing table {family} {table}"))
}
