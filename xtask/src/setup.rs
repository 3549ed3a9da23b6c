//! `cargo xtask setup`: the one place that knows what a fresh machine lacks. Every other
//! command runs it first; it prints one line per thing it installs and nothing when all is
//! present, so a second run is silent.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{is_root, output, run_quiet};

/// The bpf-linker that builds with this machine's toolchain: 0.10.x loads rustup's own
/// libLLVM; 0.11+ wants a system LLVM 21-23 that is not to be had here.
const BPF_LINKER_VERSION: &str = "0.10.4";

/// Debian packages the tests, the demo and an operator's inspection commands use.
const DEBIAN_PACKAGES: &[&str] = &[
    "binutils",  // strip: the binaries `cargo xtask dist` packages
    "bpftool",   // map and program inspection (README, tests)
    "conntrack", // kernel conntrack of the nftables fallback
    // The reference CNI plugins (bridge, host-local, firewall, loopback; in /usr/lib/cni):
    // the chain lb-cni runs in (tests/cni.rs).
    "containernetworking-plugins",
    "curl",     // the API over the unix socket, as the README shows it (tests)
    "dpkg-dev", // dpkg-shlibdeps: the .deb's Depends on shared libraries (`cargo xtask dist`)
    // A real etcd 3.4 cluster, each member in its own namespace (lb_tests::etcd), and its
    // etcdctl. The packaged service is not started (policy-rc.d, as for prometheus).
    "etcd-client",
    "etcd-server",
    "ethtool",      // checksum offload on/off in the netns tests
    "iperf",        // iperf 2: TCP throughput through a namespace path (tests)
    "iproute2",     // ip netns, veth, tc
    "iptables",     // hostport-style baselines; kube-proxy's chains in `cargo xtask bench`
    "iputils-ping", // ping -6: neighbour discovery with lb attached (tests)
    "lintian",      // the .deb `cargo xtask dist` builds, checked (xtask/tests/dist.rs)
    // man: the generated pages read without warnings (lb-user/tests/cli_reference.rs), and
    // the units' Documentation= found (systemd-analyze verify, xtask/tests/dist.rs).
    "man-db",
    "netsniff-ng", // trafgen: UDP from a PF_PACKET TX ring, skbs with paged payload (tests)
    "nftables",    // the fallback dataplane
    "nginx-light", // HTTP backends that answer who they are and whom they saw (tests)
    "openssl",     // a CA and certificates for the TLS etcd cluster (lb_tests::etcd)
    // promtool: `promtool check metrics` on the daemon's /metrics (tests). Its server is not
    // started: setup installs under a policy-rc.d that refuses service starts.
    "prometheus",
    // protoc: the etcd client crate (etcd-client, through tonic-build) compiles etcd's
    // protobuf definitions when it builds.
    "protobuf-compiler",
    "python3",  // the README's "First five minutes" serves its backends with http.server
    "sockperf", // request round trips (ping-pong) in `cargo xtask bench`
    "systemd",  // systemd-analyze verify: the packaged units (xtask/tests/dist.rs)
    "tcpdump",  // debugging captures in namespaces
    "wrk",      // HTTP load: keep-alive runs and connection storms (tests)
];

/// Where Debian's invoke-rc.d asks whether a maintainer script may start a service; exit
/// status 101 means it may not (init-system-helpers' README.policy-rc.d).
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

pub fn setup() -> Result<()> {
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

fn say(what: &str) {
    println!("xtask setup: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private empty directory under the system temp dir.
    fn temp_dir(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
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
