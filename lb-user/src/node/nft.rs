//! Running `nft`, the first one on PATH, in the calling thread's namespace: what the node's
//! firewall is ([`super::filter`]) and what the nftables dataplane writes are both read and
//! written through it. And the name every table of lb's starts with, which the dataplane
//! gives its tables and the node's checks leave out.
use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// Tables of lb's nftables dataplane start with this: `lb` owns no other tables.
pub const TABLE_PREFIX: &str = "lb-";

/// Runs `nft ARGS` with `stdin`, returning what it printed.
pub fn nft(args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (is the nftables package installed?)")?;
    // An nft that refuses early exits before reading everything (a broken pipe here): its
    // own exit status and message say why, so the write error only counts if it succeeded.
    let wrote = stdin.map(|input| {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(input.as_bytes())
    });
    let out = child.wait_with_output().context("waiting for nft")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "nft {} failed ({}): {}",
            args.join(" "),
            out.status,
            err.trim().replace('\n', " ")
        );
    }
    if let Some(Err(e)) = wrote {
        return Err(e).context("writing the ruleset to nft");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
