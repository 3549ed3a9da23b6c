//! `lb daemon` against a live node: networks fail and succeed on their own, validation sees the
//! node's addresses, and the daemon follows addresses, interfaces and namespaces that come and
//! go. The real binaries, in netns topologies. Root only.
use std::{net::Ipv4Addr, path::Path};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    netns::Topology,
    require_root,
    traffic::{TIMEOUT, spawn_backends, tcp_request},
};
use lb_user::core::model::DesiredState;
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const PUBLISHED: u16 = 18080;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn status(d: &LbDaemon) -> Value {
    serde_json::from_str(&d.ok(&["status", "--json"])).expect("lb status --json is JSON")
}

/// The status of network `name` in `lb status --json`.
fn network_status(d: &LbDaemon, name: &str) -> Value {
    let s = status(d);
    (s["networks"].as_array().expect("networks"))
        .iter()
        .find(|n| n["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("network {name} missing from {s}"))
}

#[test]
fn a_failing_network_does_not_fail_a_change_to_another() {
    if !require_root("a_failing_network_does_not_fail_a_change_to_another") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    d.ok(&network_add(&topo, "good"));
    let port = format!("tcp/{PUBLISHED}:{PORT}");
    d.ok(&service_set(
        "good",
        "api",
        "1",
        VIP,
        &port,
        &topo.backend_ips[..1],
    ));
    // A second network whose namespace is gone while the daemon is down: saved, failing.
    d.stop();
    let path = d.state_dir().join("state.json");
    let mut state = DesiredState::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut broken = state.networks[0].clone();
    broken.name = "broken".into();
    broken.netns = Some(format!("lbt-gone-{}", std::process::id()));
    broken.services.clear();
    state.networks.push(broken);
    std::fs::write(&path, state.to_json()).unwrap();
    d.restart().unwrap();
    let b = network_status(&d, "broken");
    assert_eq!(b["applied"], false, "{b}");
    assert!(
        b["error"].as_str().unwrap_or("").contains("namespace"),
        "the failing network says why: {b}"
    );

    // A change to the healthy network is applied and acknowledged as such.
    let run = d.cli(&service_set(
        "good",
        "api",
        "1",
        VIP,
        &port,
        &topo.backend_ips,
    ));
    assert!(
        run.ok(),
        "a change to a healthy network succeeds while another fails: {}{}",
        run.stdout,
        run.stderr
    );
    let g = network_status(&d, "good");
    assert_eq!(g["applied"], true, "{g}");
    assert_eq!(g["backends"], 2, "{g}");
    assert_eq!(network_status(&d, "broken")["applied"], false);
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).expect("the healthy network's VIP answers");

    // A change to the failing network itself is refused, and says why.
    let run = d.cli(&service_set(
        "broken",
        "web",
        "1",
        VIP,
        &port,
        &topo.backend_ips,
    ));
    assert!(
        !run.ok() && run.stderr.contains("namespace"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    println!(
        "a failing network: its own status says {}; a change to another network applied",
        b["error"]
    );
}
