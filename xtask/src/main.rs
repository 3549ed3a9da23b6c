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
    time::{Duration, Instant},
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
    // The reference CNI plugins (bridge, host-local, firewall, loopback; in /usr/lib/cni):
    // the chain lb-cni runs in (tests/cni.rs).
    "containernetworking-plugins",
    "curl", // the API over the unix socket, as the README shows it (tests)
    // A real etcd 3.4 cluster, each member in its own namespace (lb_tests::etcd), and its
    // etcdctl. The packaged service is not started (policy-rc.d, as for prometheus).
    "etcd-client",
    "etcd-server",
    "ethtool",      // checksum offload on/off in the netns tests
    "iperf",        // iperf 2: TCP throughput through a namespace path (tests)
    "iproute2",     // ip netns, veth, tc
    "iptables",     // hostport-style baselines; kube-proxy's chains in `cargo xtask bench`
    "iputils-ping", // ping -6: neighbour discovery with lb attached (tests)
    "netsniff-ng",  // trafgen: UDP from a PF_PACKET TX ring, skbs with paged payload (tests)
    "nftables",     // the fallback dataplane
    "nginx-light",  // HTTP backends that answer who they are and whom they saw (tests)
    "openssl",      // a CA and certificates for the TLS etcd cluster (lb_tests::etcd)
    // promtool: `promtool check metrics` on the daemon's /metrics (tests). Its server is not
    // started: setup installs under a policy-rc.d that refuses service starts.
    "prometheus",
    // protoc: the etcd client crate (etcd-client, through tonic-build) compiles etcd's
    // protobuf definitions when it builds.
    "protobuf-compiler",
    "python3",  // the README's "First five minutes" serves its backends with http.server
    "sockperf", // request round trips (ping-pong) in `cargo xtask bench`
    "tcpdump",  // debugging captures in namespaces
    "wrk",      // HTTP load: keep-alive runs and connection storms (tests)
];

/// Where Debian's invoke-rc.d asks whether a maintainer script may start a service; exit
/// status 101 means it may not (init-system-helpers' README.policy-rc.d).
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

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
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Build { release } => {
            setup()?;
            build(release)
        }
        Cmd::InstallCni { dir } => install_cni(&dir),
        Cmd::BuildAndLoad { state, bpffs } => {
            setup()?;
            build(true)?;
            let mut args = vec!["load".into(), "--file".into(), state.into_os_string()];
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
        Cmd::Bench {
            quick,
            out,
            dataplane,
        } => {
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
                "-p",
                "lb-user",
                "--bin",
                "lb",
            ]))?;
            let release = root().join("target/release");
            let out = out.unwrap_or_else(|| {
                if quick {
                    root().join("target/bench")
                } else {
                    root()
                }
            });
            let mut bench = Command::new(release.join("lb-bench"));
            bench
                .arg("--lb")
                .arg(release.join("lb"))
                .arg("--out")
                .arg(out);
            if quick {
                bench.arg("--quick");
            }
            for dp in dataplane {
                bench.args(["--dataplane", &dp]);
            }
            run(&mut bench)
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

/// `cargo build --release --bin lb-cni`, then a copy to `dir/lb-cni` (written beside it and
/// renamed, so a runtime running the plugin meanwhile sees the old file or the new one).
fn install_cni(dir: &Path) -> Result<()> {
    let say = |what: &str| println!("xtask install-cni: {what}");
    say("building lb-cni (cargo build --release --bin lb-cni)");
    run(cargo().args([
        "build",
        "--locked",
        "--release",
        "-p",
        "lb-user",
        "--bin",
        "lb-cni",
    ]))?;
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
    // A root-only test that cannot run returns early, which libtest counts as passed; it
    // records its name here (lb_tests::require_root) so that it is counted as skipped.
    let skips = root().join("target/xtask-skipped-tests");
    match std::fs::remove_file(&skips) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", skips.display())),
    }
    // Doc-tests would close the run on a "0 passed" block; the crates have none to run.
    let mut cmd = cargo();
    cmd.args(["test", "--locked", "--all-targets", "--no-fail-fast"])
        .args(extra)
        .env(SKIPS_ENV, &skips);
    let TestRun {
        passed,
        failed,
        times,
    } = run_counting(&mut cmd)?;
    print_times(&times);
    let skipped = match std::fs::read_to_string(&skips) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", skips.display())),
    };
    let counted = Counted::new(passed, failed, skipped);
    println!("{}", counted.summary());
    counted.verdict(ci())
}

/// The environment variable `lb_tests::require_root` records skipped tests by.
const SKIPS_ENV: &str = "LB_TEST_SKIPS";

/// Whether this is a CI run (`CI=true`, as `.ci/run` sets it).
fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A test run's outcome: libtest's counts, with the tests that skipped taken out of its
/// passed.
#[derive(Debug, PartialEq, Eq)]
struct Counted {
    passed: u64,
    failed: u64,
    /// The names of the skipped tests, as they recorded themselves.
    skipped: Vec<String>,
}

impl Counted {
    fn new(passed: u64, failed: u64, mut skipped: Vec<String>) -> Counted {
        skipped.sort();
        Counted {
            passed: passed.saturating_sub(skipped.len() as u64),
            failed,
            skipped,
        }
    }

    fn summary(&self) -> String {
        let mut s = format!(
            "xtask test: {} passed, {} failed, {} skipped",
            self.passed,
            self.failed,
            self.skipped.len()
        );
        if !self.skipped.is_empty() {
            s += "\nxtask test: skipped (not run as root):";
            for name in &self.skipped {
                s += &format!("\n  {name}");
            }
        }
        s
    }

    /// An error for failed tests, and under CI for skipped ones: CI runs every test.
    fn verdict(&self, ci: bool) -> Result<()> {
        if self.failed > 0 {
            bail!("{} tests failed", self.failed);
        }
        if ci && !self.skipped.is_empty() {
            bail!(
                "{} tests skipped, and CI=true runs every test (as root)",
                self.skipped.len()
            );
        }
        Ok(())
    }
}

/// Runs `cargo test`, passing its output through, and adds up its `test result:` lines so the
/// run ends with one total rather than the last test binary's count. Also times each test
/// binary, from cargo's `Running ...` line (stderr) to the binary's `test result:` line
/// (stdout). Both pipes are read on threads of their own into one channel: the lines of the
/// two streams arrive in the order they were written, give or take the microseconds between
/// a write and its reader, which cannot reorder a binary's start and its result.
fn run_counting(cmd: &mut Command) -> Result<TestRun> {
    use std::io::{BufRead as _, BufReader, Read};
    use std::sync::mpsc;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", show(cmd)))?;
    let (tx, rx) = mpsc::channel();
    let forward = |pipe: Box<dyn Read + Send>, stderr: bool| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                if tx.send((stderr, line)).is_err() {
                    return;
                }
            }
        })
    };
    let readers = [
        forward(Box::new(child.stdout.take().expect("piped stdout")), false),
        forward(Box::new(child.stderr.take().expect("piped stderr")), true),
    ];
    // The channel ends when both readers have.
    drop(tx);
    let (mut passed, mut failed) = (0, 0);
    let mut timer = BinaryTimer::default();
    for (stderr, line) in rx {
        let line = line.context("reading cargo test output")?;
        let now = Instant::now();
        if stderr {
            eprintln!("{line}");
            timer.cargo_line(&line, now);
            continue;
        }
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            timer.result_line(now);
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
    for reader in readers {
        let _ = reader.join();
    }
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() && failed == 0 {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok(TestRun {
        passed,
        failed,
        times: timer.finish(Instant::now()),
    })
}

/// What a `cargo test` run counted: tests passed and failed over every binary, and each
/// binary's wall time in the order they ran.
struct TestRun {
    passed: u64,
    failed: u64,
    times: Vec<(String, Duration)>,
}

/// The wall time of each test binary of a `cargo test` run, in the order they ran.
#[derive(Default)]
struct BinaryTimer {
    running: Option<(String, Instant)>,
    done: Vec<(String, Duration)>,
}

impl BinaryTimer {
    /// A line cargo printed on stderr: `Running ...` and `Doc-tests ...` start a binary (and
    /// end the one before, if it died before its `test result:`).
    fn cargo_line(&mut self, line: &str, now: Instant) {
        if let Some(binary) = test_binary(line) {
            self.end(now);
            self.running = Some((binary, now));
        }
    }

    /// A binary's `test result:` line: it is done.
    fn result_line(&mut self, now: Instant) {
        self.end(now);
    }

    fn end(&mut self, now: Instant) {
        if let Some((binary, started)) = self.running.take() {
            self.done.push((binary, now - started));
        }
    }

    fn finish(mut self, now: Instant) -> Vec<(String, Duration)> {
        self.end(now);
        self.done
    }
}

/// The test binary a cargo status line starts, named by its source and its crate or test name
/// without cargo's hash: `     Running tests/tools.rs (target/debug/deps/tools-ecc3...)` is
/// `tests/tools.rs (tools)`, `     Running unittests src/lib.rs (target/debug/deps/lb_user-1f...)`
/// is `unittests src/lib.rs (lb_user)`.
fn test_binary(line: &str) -> Option<String> {
    let line = line.trim();
    if line.starts_with("Doc-tests ") {
        return Some(line.to_owned());
    }
    let rest = line.strip_prefix("Running ")?;
    let Some((source, path)) = rest.rsplit_once(" (") else {
        return Some(rest.to_owned());
    };
    let file = path
        .trim_end_matches(')')
        .rsplit('/')
        .next()
        .unwrap_or(path);
    let name = match file.rsplit_once('-') {
        Some((name, hash)) if !hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            name
        }
        _ => file,
    };
    Some(format!("{source} ({name})"))
}

/// The binaries' wall times, longest first.
fn print_times(times: &[(String, Duration)]) {
    if times.is_empty() {
        return;
    }
    let mut times = times.to_vec();
    times.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!("xtask test: wall time per test binary, longest first");
    for (binary, time) in &times {
        println!("{:>9.1} s  {binary}", time.as_secs_f64());
    }
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
        // nginx-light's postinst would start nginx on this machine, listening on port 80.
        let _no_starts = NoServiceStarts::new(Path::new(POLICY_RC_D))?;
        run_quiet(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing),
        )?;
    }
    Ok(())
}

/// While alive, package installs start no service: a [`POLICY_RC_D`] that exits 101. It is
/// written only when none exists (an existing one is the machine's policy and is left alone),
/// and only the one written here is removed, on drop: after apt-get, whether it failed or not.
struct NoServiceStarts {
    /// The file written here, if any.
    written: Option<PathBuf>,
}

impl NoServiceStarts {
    /// The guard on `path` ([`POLICY_RC_D`] but in tests).
    fn new(path: &Path) -> Result<NoServiceStarts> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        // create_new: a policy that appears between a check and the write is never replaced.
        let mut file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Ok(NoServiceStarts { written: None });
            }
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        };
        // From here on the guard owns the file: a failed write still removes it.
        let guard = NoServiceStarts {
            written: Some(path.to_path_buf()),
        };
        file.write_all(
            b"#!/bin/sh\n# cargo xtask setup: no service starts while it installs packages.\nexit 101\n",
        )
        .with_context(|| format!("writing {}", path.display()))?;
        Ok(guard)
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if let Some(path) = &self.written
            && let Err(e) = std::fs::remove_file(path)
        {
            eprintln!("xtask setup: cannot remove {}: {e}", path.display());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_running_lines_name_the_binary_without_its_hash() {
        let cases = [
            (
                "     Running tests/tools.rs (target/debug/deps/tools-ecc376998a43aaf1)",
                Some("tests/tools.rs (tools)"),
            ),
            (
                "     Running unittests src/lib.rs (target/debug/deps/lb_user-1f0e2d3c4b5a6978)",
                Some("unittests src/lib.rs (lb_user)"),
            ),
            (
                "     Running unittests src/main.rs (target/debug/deps/xtask-0123456789abcdef)",
                Some("unittests src/main.rs (xtask)"),
            ),
            ("   Doc-tests lb_common", Some("Doc-tests lb_common")),
            ("   Compiling lb-tests v0.1.0 (/work/tests)", None),
            ("running 6 tests", None),
        ];
        for (line, binary) in cases {
            assert_eq!(test_binary(line).as_deref(), binary, "{line:?}");
        }
    }

    #[test]
    fn a_binary_runs_from_its_running_line_to_its_result_or_the_next_binary() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut timer = BinaryTimer::default();
        timer.cargo_line("   Compiling lb-tests v0.1.0", at(0));
        timer.cargo_line("     Running tests/a.rs (target/debug/deps/a-0a)", at(100));
        timer.result_line(at(1100));
        // Crashes before its result line: it ends where the next binary starts.
        timer.cargo_line("     Running tests/b.rs (target/debug/deps/b-0b)", at(1200));
        timer.cargo_line("     Running tests/c.rs (target/debug/deps/c-0c)", at(1500));
        timer.result_line(at(1600));
        // A stray result line (none running) times nothing.
        timer.result_line(at(1700));
        timer.cargo_line("     Running tests/d.rs (target/debug/deps/d-0d)", at(2000));
        let ms = |d: Duration| d.as_millis();
        let times: Vec<(String, u128)> = (timer.finish(at(2500)).into_iter())
            .map(|(b, d)| (b, ms(d)))
            .collect();
        let expected = [("a", 1000), ("b", 300), ("c", 100), ("d", 500)]
            .map(|(n, t)| (format!("tests/{n}.rs ({n})"), t));
        assert_eq!(times, expected);
    }

    /// A private empty directory under the system temp dir.
    fn temp_dir(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn skipped_tests_are_counted_apart_from_the_passed_and_fail_under_ci() {
        let run = Counted::new(10, 0, vec!["b_test".into(), "a_test".into()]);
        assert_eq!(
            run.summary(),
            "xtask test: 8 passed, 0 failed, 2 skipped\nxtask test: skipped (not run as root):\n  a_test\n  b_test"
        );
        assert!(run.verdict(false).is_ok());
        let err = run.verdict(true).unwrap_err().to_string();
        assert!(err.contains("2 tests skipped"), "{err}");
        let clean = Counted::new(10, 0, Vec::new());
        assert_eq!(
            clean.summary(),
            "xtask test: 10 passed, 0 failed, 0 skipped"
        );
        assert!(clean.verdict(true).is_ok());
        assert!(Counted::new(9, 1, Vec::new()).verdict(false).is_err());
    }

    #[test]
    fn policy_rc_d_is_written_forbidding_starts_and_removed_after() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = temp_dir("policy-written");
        let path = dir.join("policy-rc.d");
        let guard = NoServiceStarts::new(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "executable: {mode:o}");
        // What invoke-rc.d would run, answering "forbidden".
        let status = Command::new(&path)
            .arg("nginx")
            .arg("start")
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(101));
        drop(guard);
        assert!(!path.exists(), "left behind");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_existing_policy_rc_d_is_left_alone() {
        let dir = temp_dir("policy-existing");
        let path = dir.join("policy-rc.d");
        let policy = "#!/bin/sh\nexit 0\n";
        std::fs::write(&path, policy).unwrap();
        drop(NoServiceStarts::new(&path).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), policy);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
