//! `cargo xtask`: everything that is not plain cargo.
//!
//! `setup` is the one place that knows what a fresh machine lacks; every other command runs it
//! first, so the README's two commands (`cargo xtask demo`, `cargo xtask test`) are all the
//! set-up a machine needs. Setup prints one line per thing it installs and nothing when all is
//! present, so a second run is silent.
use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

/// The bpf-linker that builds with this machine's toolchain: 0.10.x loads rustup's own
/// libLLVM; 0.11+ wants a system LLVM 21-23 that is not to be had here.
const BPF_LINKER_VERSION: &str = "0.10.4";

/// Debian packages the tests, the demo and an operator's inspection commands use.
const DEBIAN_PACKAGES: &[&str] = &[
    "bpftool",   // map and program inspection (README, tests)
    "conntrack", // kernel conntrack of the nftables fallback
    "ethtool",   // checksum offload on/off in the netns tests
    "iproute2",  // ip netns, veth, tc
    "iptables",  // hostport-style baselines
    "nftables",  // the fallback dataplane
    "tcpdump",   // debugging captures in namespaces
];

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test and demo lb")]
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
    /// Interleaved dataplane benchmarks, reported as ratios.
    Bench,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Build { release } => {
            setup()?;
            build(release)
        }
        Cmd::BuildAndLoad { state, bpffs } => {
            setup()?;
            build(true)?;
            let mut args = vec!["load".into(), "--state".into(), state.into_os_string()];
            if let Some(dir) = bpffs {
                args.extend(["--bpffs".into(), dir.into_os_string()]);
            }
            run(Command::new(root().join("target/release/lb")).args(args))
        }
        Cmd::Test { args } => {
            setup()?;
            test(&args)
        }
        Cmd::Demo => {
            if !is_root() {
                bail!(
                    "the demo creates network namespaces and loads eBPF programs: run it as root"
                );
            }
            setup()?;
            build(false)?;
            // The demo itself lives in lb-tests (lb_tests::demo), shared with the test that
            // keeps it green; here it only gets the `lb` binary just built.
            let target = root().join("target/debug");
            run(Command::new(target.join("lb-demo")).arg(target.join("lb")))
        }
        Cmd::Bench => {
            if !is_root() {
                bail!("the benchmark loads eBPF programs: run it as root");
            }
            setup()?;
            run(cargo().args([
                "build",
                "--locked",
                "--release",
                "-p",
                "lb-tests",
                "--bin",
                "lb-bench",
            ]))?;
            run(&mut Command::new(root().join("target/release/lb-bench")))
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

fn build(release: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--locked", "--all-targets"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)
}

fn test(extra: &[String]) -> Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--locked",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Root-only tests refuse to pass silently when not root under CI=true; say it up front too.
    if !is_root() {
        eprintln!(
            "xtask: not running as root: program-level and netns tests will say they are skipped"
        );
    }
    // Doc-tests would close the run on a "0 passed" block; the crates have none to run.
    let mut cmd = cargo();
    cmd.args(["test", "--locked", "--all-targets", "--no-fail-fast"])
        .args(extra);
    let (passed, failed) = run_counting(&mut cmd)?;
    println!("xtask test: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("{failed} tests failed");
    }
    Ok(())
}

/// Runs `cargo test`, passing its output through, and adds up its `test result:` lines so the
/// run ends with one total rather than the last test binary's count.
fn run_counting(cmd: &mut Command) -> Result<(u64, u64)> {
    use std::io::{BufRead as _, BufReader};
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", show(cmd)))?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().expect("piped stdout")).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |what: &str| -> u64 {
                rest.split(';')
                    .filter_map(|part| part.trim().rsplit_once(' '))
                    .find(|(_, name)| name.trim_end_matches('.') == what)
                    .and_then(|(n, _)| n.rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            };
            passed += count("passed");
            failed += count("failed");
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() && failed == 0 {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok((passed, failed))
}

fn setup() -> Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        bail!(
            "the nightly toolchain is missing (rustup toolchain list shows none); the eBPF \
             programs need it with rust-src: rustup toolchain install nightly --component rust-src"
        );
    }

    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        say("installing rust-src for the nightly toolchain (rustup component add)");
        run_quiet(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }

    // -Z build-std=core resolves the standard library's own workspace; fetch it once so later
    // builds never need the network.
    let sysroot =
        output(Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]))?;
    let std_manifest = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/Cargo.toml");
    let fetch = |offline: bool| {
        let mut cmd = Command::new("rustup");
        cmd.args([
            "run",
            "nightly",
            "cargo",
            "fetch",
            "--locked",
            "--manifest-path",
        ])
        .arg(&std_manifest);
        if offline {
            cmd.arg("--offline")
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        }
        cmd
    };
    if !fetch(true).status().is_ok_and(|s| s.success()) {
        say("installing the std workspace crates for -Z build-std (cargo fetch)");
        run_quiet(&mut fetch(false))?;
    }

    let linker = Command::new("bpf-linker").arg("--version").output();
    let have_linker = linker.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .any(|w| w == BPF_LINKER_VERSION)
    });
    if !have_linker {
        say(&format!(
            "installing bpf-linker {BPF_LINKER_VERSION} (cargo install, about a minute)"
        ));
        run_quiet(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())).args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
            ]),
        )?;
    }

    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| !debian_installed(p))
        .collect();
    if !missing.is_empty() {
        if !is_root() {
            bail!(
                "Debian packages missing: {} (run `cargo xtask setup` as root, or apt-get install them)",
                missing.join(" ")
            );
        }
        for p in &missing {
            say(&format!("installing Debian package {p} (apt-get)"));
        }
        run_quiet(Command::new("apt-get").args(["update"]))?;
        run_quiet(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing),
        )?;
    }
    Ok(())
}

fn debian_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.stdout == b"installed")
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

fn say(what: &str) {
    println!("xtask setup: {what}");
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
