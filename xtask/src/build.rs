//! `cargo xtask build`, `install-cni`, `build-and-load` and `demo`: cargo builds, and what is
//! done with their binaries.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, is_root, root, run, setup};

/// `cargo build --locked --release` of the binaries `bins` names, each `(package, binary)`:
/// what install-cni, dist and bench ship or run.
pub fn release_bins(bins: &[(&str, &str)]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--locked", "--release"]);
    for (package, bin) in bins {
        cmd.args(["-p", package, "--bin", bin]);
    }
    run(&mut cmd)
}

pub fn build(release: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--locked", "--all-targets"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)
}

/// `cargo build --release --bin lb-cni`, then a copy to `dir/lb-cni` (written beside it and
/// renamed, so a runtime running the plugin meanwhile sees the old file or the new one).
pub fn install_cni(dir: &Path) -> Result<()> {
    let say = |what: &str| println!("xtask install-cni: {what}");
    say("building lb-cni (cargo build --release --bin lb-cni)");
    release_bins(&[("lb-user", "lb-cni")])?;
    let built = root().join("target/release/lb-cni");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let to = dir.join("lb-cni");
    let tmp = dir.join(".lb-cni.tmp");
    std::fs::copy(&built, &tmp)
        .with_context(|| format!("copying {} to {}", built.display(), tmp.display()))?;
    std::fs::rename(&tmp, &to)
        .with_context(|| format!("renaming {} to {}", tmp.display(), to.display()))?;
    say(&format!(
        "installed {} (from {})",
        to.display(),
        built.display()
    ));
    Ok(())
}

/// `cargo xtask build-and-load`: the release build, then `lb load` of a desired-state file.
pub fn build_and_load(state: PathBuf, bpffs: Option<PathBuf>) -> Result<()> {
    build(true)?;
    let mut args = vec!["load".into(), "--file".into(), state.into_os_string()];
    if let Some(dir) = bpffs {
        args.extend(["--bpffs".into(), dir.into_os_string()]);
    }
    run(Command::new(root().join("target/release/lb")).args(args))
}

/// `cargo xtask demo`: the debug build, then lb-demo with the `lb` just built.
pub fn demo() -> Result<()> {
    if !is_root() {
        bail!("the demo creates network namespaces and loads eBPF programs: run it as root");
    }
    setup()?;
    build(false)?;
    // The demo itself lives in lb-tests (lb_tests::demo), shared with the test that
    // keeps it green; here it only gets the `lb` binary just built.
    let target = root().join("target/debug");
    run(Command::new(target.join("lb-demo")).arg(target.join("lb")))
}
