//! `cargo xtask`: everything that is not plain cargo.
//!
//! `setup` is the one place that knows what a fresh machine lacks; every other command runs it
//! first, so the README's two commands (`cargo xtask demo`, `cargo xtask test`) are all the
//! set-up a machine needs. Setup prints one line per thing it installs and nothing when all is
//! present, so a second run is silent.
use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod build;
mod deb;
mod dist;
mod setup;
mod stage;
mod test;

use setup::setup;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test, demo and package lb")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what this machine lacks (nightly rust-src, std sources, bpf-linker, Debian packages).
    Setup,
    /// Build the eBPF object and the host crates.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build lb-cni (release) and copy it where the container runtime looks for CNI plugins.
    InstallCni {
        /// The runtime's plugin directory (containerd's and Nomad's default; Debian's own
        /// plugins are in /usr/lib/cni).
        #[arg(long, default_value = "/opt/cni/bin")]
        dir: PathBuf,
    },
    /// Build, then `lb load` a desired-state file (one shot, no daemon).
    BuildAndLoad {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        bpffs: Option<PathBuf>,
    },
    /// Set up, then run every test: formatting, clippy, pure, program-level and netns tests.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The main job on an embedded default: build, topology, daemon, traffic, where it went.
    Demo,
    /// Real traffic through a node (no LB, nft, kube-proxy iptables, lb tc/xdp with and
    /// without the fast path) in interleaved rounds, reported as ratios to the no-LB path; the
    /// programs' micro-benchmarks; then the control plane's cost end to end through the CLI on
    /// each dataplane (apply from scratch, one-backend changes, daemon RSS and map memory).
    /// Writes BENCHMARKS.md, bench/results.json and bench/ratios.svg.
    Bench {
        /// Fewer and shorter rounds (a few minutes), and the control plane at 100 and 1,000
        /// services instead of 1,000 and 10,000.
        #[arg(long)]
        quick: bool,
        /// Where the report goes: by default the workspace root for a full run (the committed
        /// report) and target/bench for --quick, so a quick run never overwrites it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The control plane's dataplanes (both unless given).
        #[arg(long, value_parser = ["ebpf", "nftables"])]
        dataplane: Vec<String>,
    },
    /// Build the release artifacts into target/dist: a tarball (binaries, unit, man pages,
    /// completions, docs, licences) and a Debian package, versioned as lb-user.
    Dist,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Build { release } => {
            setup()?;
            build::build(release)
        }
        Cmd::InstallCni { dir } => build::install_cni(&dir),
        Cmd::BuildAndLoad { state, bpffs } => {
            setup()?;
            build::build_and_load(state, bpffs)
        }
        Cmd::Test { args } => {
            setup()?;
            test::test(&args)
        }
        Cmd::Demo => build::demo(),
        Cmd::Bench {
            quick,
            out,
            dataplane,
        } => bench::bench(quick, out, dataplane),
        Cmd::Dist => {
            setup()?;
            dist::dist()
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Whether this is a CI run (`CI=true`, as `.ci/run` sets it).
fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn is_root() -> bool {
    // /proc/self/status is the one source that needs neither libc nor a subprocess.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {}", show(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok(())
}

/// Runs an installer with its chatter captured: setup's own line says what is being installed,
/// and the installer's output is shown only when it fails.
fn run_quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {}", show(cmd)))?;
    if !out.status.success() {
        eprint!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        bail!("{} failed ({})", show(cmd), out.status);
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {}", show(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("command output is not UTF-8")
}

fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}
