//! How `lb daemon` starts: it checks its capabilities before it probes or touches anything,
//! says where it listens (no colours in a log file), takes a `host:port` name for
//! `--metrics` that resolves to loopback, a start that fails leaves nothing behind, and the
//! capabilities the shipped unit grants are enough for each dataplane.
//! Root only (the capability tests drop root's capabilities from a root start).
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{
        LbDaemon, Run, free_metrics_addr, network_add, refusal, scrape, service_set, wrapped,
    },
    netns::Topology,
    poll_until, require_root,
    tools::TempDir,
    traffic::{TIMEOUT, spawn_backends, tcp_request},
};

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// Where a daemon that is expected to fail would keep its state, socket and pins: none of
/// them exists beforehand, so that whatever exists afterwards, the failed start made.
struct Paths {
    dir: TempDir,
}

impl Paths {
    fn new() -> Paths {
        Paths {
            dir: TempDir::new("daemon-start").unwrap(),
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run/lb.sock")
    }

    fn bpffs(&self) -> PathBuf {
        self.dir.join("bpffs")
    }

    /// `lb daemon` on these paths with `extra` flags, run through `wrapper` (a command
    /// that runs its arguments, e.g. `setpriv …`), expected to exit.
    fn start(&self, wrapper: &[&str], extra: &[&str]) -> Run {
        let mut cmd = wrapped(wrapper, lb());
        cmd.arg("daemon")
            .arg("--state-dir")
            .arg(self.state())
            .arg("--socket")
            .arg(self.socket())
            .arg("--bpffs")
            .arg(self.bpffs())
            .args(extra);
        refusal(cmd)
    }

    /// Panics unless `run` exited 1 before it probed the kernel or chose a dataplane, and
    /// left nothing behind.
    fn assert_refused_early(&self, run: &Run) {
        assert_eq!(run.code, Some(1), "{run:?}");
        for word in PROBED {
            assert!(
                !run.stderr.contains(word),
                "{word:?} before the refusal: {run:?}"
            );
        }
        self.assert_empty(run);
    }

    /// Panics, naming them, if the failed start left anything in the directory.
    fn assert_empty(&self, run: &Run) {
        let left: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            left.is_empty(),
            "a failed start leaves nothing behind, found {left:?}; it said: {run:?}"
        );
    }
}

/// What a daemon logs once it probes the kernel or picks a dataplane.
const PROBED: [&str; 3] = ["fell back", "dataplane selected", "probe"];

/// Stripped of every capability (as user nobody, as a unit without any would run it), the
/// daemon exits 1 naming what it lacks, before it probes, falls back or creates a file.
#[test]
fn a_daemon_without_capabilities_exits_naming_them_before_it_probes() {
    if !require_root("a_daemon_without_capabilities_exits_naming_them_before_it_probes") {
        return;
    }
    let paths = Paths::new();
    let run = paths.start(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ],
        &[],
    );
    for cap in [
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_NET_ADMIN",
        "CAP_SYS_ADMIN",
        "CAP_NET_BIND_SERVICE",
    ] {
        assert!(
            run.stderr.contains(cap),
            "names {cap} as missing: {}",
            run.stderr
        );
    }
    assert!(
        run.stderr.contains("missing capabilities"),
        "{}",
        run.stderr
    );
    paths.assert_refused_early(&run);
}

/// Root without one capability (a unit that forgot it) is told exactly which one.
#[test]
fn root_without_cap_net_admin_is_told_that_one() {
    if !require_root("root_without_cap_net_admin_is_told_that_one") {
        return;
    }
    let paths = Paths::new();
    let run = paths.start(
        &[
            "setpriv",
            "--inh-caps=-net_admin",
            "--bounding-set=-net_admin",
        ],
        &[],
    );
    let line = (run.stderr.lines())
        .find(|l| l.contains("missing capabilities"))
        .unwrap_or_else(|| panic!("no capability error: {run:?}"));
    assert!(
        line.contains("missing capabilities: CAP_NET_ADMIN ("),
        "{line}"
    );
    for other in ["CAP_BPF (", "CAP_SYS_ADMIN (", "CAP_PERFMON ("] {
        assert!(
            !line.contains(other),
            "only CAP_NET_ADMIN is missing: {line}"
        );
    }
    paths.assert_refused_early(&run);
}

/// A metrics port another process holds fails the start with a message naming it, before
/// a dataplane is chosen, and the socket, its lock file and the directories the start
/// created are gone.
#[test]
fn a_taken_metrics_port_fails_the_start_and_leaves_nothing_behind() {
    if !require_root("a_taken_metrics_port_fails_the_start_and_leaves_nothing_behind") {
        return;
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let paths = Paths::new();
    let run = paths.start(&[], &["--metrics", &addr]);
    assert!(
        run.stderr
            .contains(&format!("binding the metrics endpoint {addr}"))
            && run.stderr.contains("in use"),
        "says which address is taken: {}",
        run.stderr
    );
    assert!(!paths.socket().exists(), "no socket left: {run:?}");
    paths.assert_refused_early(&run);
}

/// The daemon logs one line per endpoint, without colours when its stderr is a file, and
/// serves metrics on a name that resolves to loopback; a non-loopback address is refused.
#[test]
fn the_daemon_says_where_it_listens_and_takes_a_loopback_name() {
    if !require_root("the_daemon_says_where_it_listens_and_takes_a_loopback_name") {
        return;
    }
    let bpffs = Bpffs::new().unwrap();
    let port = free_metrics_addr().unwrap();
    let port = port.rsplit_once(':').unwrap().1;
    let name = format!("localhost:{port}");
    let d = LbDaemon::start(
        lb(),
        bpffs.path(),
        &["--metrics", &name, "--dataplane", "nftables"],
    )
    .unwrap();
    let lines = [
        format!("API listening on {}", d.socket().display()),
        format!("metrics served on http://127.0.0.1:{port}/metrics"),
    ];
    poll_until(Duration::from_secs(20), || {
        lines.iter().all(|l| d.log().contains(l.as_str()))
    })
    .unwrap_or_else(|| panic!("{lines:?} not logged:\n{}", d.log()));
    assert!(
        !d.log().contains('\x1b'),
        "no colours in a file:\n{}",
        d.log()
    );
    scrape(&format!("127.0.0.1:{port}")).unwrap();
    let paths = Paths::new();
    let run = paths.start(&[], &["--metrics", "192.0.2.1:9464"]);
    assert_eq!(run.code, Some(2), "a usage error: {run:?}");
    assert!(
        run.stderr
            .contains("resolves to 192.0.2.1, which is not loopback"),
        "{}",
        run.stderr
    );
    paths.assert_empty(&run);
}

/// `setpriv` arguments for the capabilities `dist/lb.service` grants: its
/// `CapabilityBoundingSet=` line, read from the unit itself, so that what is tested is what
/// ships (`caps.rs` checks the unit against what the daemon asks for).
fn shipped_bounding_set() -> Vec<String> {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../dist/lb.service"))
        .expect("dist/lb.service");
    let line = (unit.lines())
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit bounds its capabilities");
    let caps: Vec<String> = (line.split_whitespace())
        .map(|c| {
            let name = c.strip_prefix("CAP_").expect("a CAP_ name");
            format!("+{}", name.to_lowercase())
        })
        .collect();
    vec![
        "setpriv".into(),
        "--inh-caps=-all".into(),
        format!("--bounding-set=-all,{}", caps.join(",")),
    ]
}

/// Under exactly the capabilities the shipped unit grants, a root daemon on `dataplane`
/// applies a network with a VIP and a published port below 1024 (held by the daemon) with
/// no warning, and both answer: from a client; from the node itself (the eBPF dataplane's
/// socket programs, attached to the cgroup2 root, or the nftables output chain); and on
/// 127.0.0.1 from the node (on nftables, `route_localnet` written in the node's namespace).
fn the_shipped_capabilities_are_enough(dataplane: &str) {
    const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
    const PORT: u16 = 8080;
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let wrapper = shipped_bounding_set();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let d =
        LbDaemon::start_wrapped(lb(), bpffs.path(), &wrapper, &["--dataplane", dataplane]).unwrap();
    d.ok(&network_add(&topo, "caps"));
    d.ok(&service_set(
        "caps",
        "api",
        "1",
        VIP,
        &format!("tcp/80:{PORT}"),
        &topo.backend_ips,
    ));
    let all: serde_json::Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert_eq!(all["dataplane"], dataplane, "{all}");
    let status = d.network_status("caps");
    assert_eq!(status["applied"], true, "{status}\n{}", d.log());
    // nftables warns of the topology's bridge (hairpin off under br_netfilter) whatever the
    // capabilities; anything else would be one of them missing (port 80 not held, say).
    let warnings: Vec<&serde_json::Value> = (status["warnings"].as_array().unwrap().iter())
        .filter(|w| !w.as_str().unwrap().contains("hairpin mode is off"))
        .collect();
    assert!(
        warnings.is_empty(),
        "port 80 held, nothing else amiss: {status}"
    );
    for (what, ns, addr, port) in [
        ("the VIP from a client", &topo.client, VIP, PORT),
        ("port 80 from a client", &topo.client, topo.node_ip, 80),
        ("the VIP from the node", &topo.node, VIP, PORT),
        ("port 80 from the node", &topo.node, topo.node_ip, 80),
        (
            "127.0.0.1:80 from the node",
            &topo.node,
            Ipv4Addr::LOCALHOST,
            80,
        ),
    ] {
        let answer = tcp_request(ns, addr, port, TIMEOUT)
            .unwrap_or_else(|e| panic!("{what} on {dataplane}: {e:#}\n{}", d.log()));
        assert!(
            answer.starts_with('b'),
            "{what}: a backend answers: {answer}"
        );
    }
}

#[test]
fn the_shipped_units_capabilities_are_enough_for_ebpf() {
    if !require_root("the_shipped_units_capabilities_are_enough_for_ebpf") {
        return;
    }
    the_shipped_capabilities_are_enough("ebpf");
}

#[test]
fn the_shipped_units_capabilities_are_enough_for_nftables() {
    if !require_root("the_shipped_units_capabilities_are_enough_for_nftables") {
        return;
    }
    the_shipped_capabilities_are_enough("nftables");
}
