//! The flow lifecycle through `lb daemon` (eBPF dataplane): what `lb conntrack` shows, flows
//! leaving it when their (short, set per network) timeouts pass, the collector giving their
//! entries back. Root only.
use std::{
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    netns::Topology,
    require_root,
    traffic::{TIMEOUT, TcpSession, http_get, spawn_backends, udp_request},
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
/// The collector's period in these tests.
const GC_SECS: u64 = 1;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn start(bpffs: &Bpffs) -> LbDaemon {
    LbDaemon::start(
        lb(),
        bpffs.path(),
        &["--dataplane", "ebpf", "--gc-secs", &GC_SECS.to_string()],
    )
    .expect("lb daemon starts")
}

/// `lb conntrack NET --json`.
fn conntrack(d: &LbDaemon, net: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(&d.ok(&["conntrack", net, "--json"])).unwrap();
    v.as_array().unwrap().clone()
}

/// The network's entry in `lb status --json`.
fn status(d: &LbDaemon, net: &str) -> Value {
    let v: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    (v["networks"].as_array().unwrap().iter())
        .find(|n| n["name"] == net)
        .unwrap()
        .clone()
}

/// Polls `what` every 200 ms until it holds or `within` passes; returns how long it took.
fn within(within: Duration, mut what: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if what() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// A closed TCP connection and an idle UDP flow, with `tcp_time_wait` and `udp` set to 2 s on
/// the network: `lb conntrack` shows each with its state and the seconds it has left, and
/// neither is listed once its timeout has passed — nor, one collector period later, in the
/// flow table (`lb status`'s entry count); an open connection stays.
#[test]
fn closed_and_idle_flows_leave_lb_conntrack_within_their_timeouts() {
    if !require_root("closed_and_idle_flows_leave_lb_conntrack_within_their_timeouts") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs);
    let mut add = network_add(&topo, "ct");
    add.extend(["--timeout", "tcp_time_wait=2", "--timeout", "udp=2"].map(String::from));
    d.ok(&add);
    d.ok(&service_set(
        "ct",
        "api",
        "1",
        VIP,
        &format!("tcp/{PORT}"),
        &topo.backend_ips,
    ));
    let state: Value = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    assert_eq!(
        state["networks"][0]["timeouts"],
        serde_json::json!({"tcp_time_wait": 2, "udp": 2}),
        "the timeouts are part of the desired state"
    );

    let mut open = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    open.ask().unwrap();
    let open_port = open.local_addr().unwrap().port();
    let udp: lb_tests::traffic::Reply = udp_request(&topo.client, VIP, PORT + 1, TIMEOUT)
        .unwrap()
        .parse()
        .unwrap();
    println!("udp answered by {udp}");
    let flows = conntrack(&d, "ct");
    println!("{}", d.ok(&["conntrack", "ct"]));
    assert_eq!(flows.len(), 2, "{flows:?}");
    for f in &flows {
        assert_eq!(f["state"], "established", "answered flows: {f}");
        let left = f["expires_secs"].as_u64().unwrap();
        if f["proto"] == "udp" {
            assert!(left <= 2, "udp timeout applies: {f}");
        } else {
            assert!(left > 3600, "tcp_established (6 h by default) applies: {f}");
        }
    }
    // One HTTP/1.0 request: the server closes after answering, the client too.
    http_get(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    let client = |port: u16| format!("{}:{port}", topo.client_ip);
    let closing: Vec<Value> = conntrack(&d, "ct")
        .into_iter()
        .filter(|f| f["state"] == "closing")
        .collect();
    assert_eq!(closing.len(), 1, "{:?}", conntrack(&d, "ct"));
    assert!(
        closing[0]["expires_secs"].as_u64().unwrap() <= 2,
        "{closing:?}"
    );
    let gone = within(Duration::from_secs(2 + GC_SECS + 3), || {
        let flows = conntrack(&d, "ct");
        flows.len() == 1 && flows[0]["client"] == client(open_port)
    });
    let took = gone.unwrap_or_else(|| panic!("still listed: {:?}", conntrack(&d, "ct")));
    println!("closed and idle flows left lb conntrack after {took:?}");
    // Entries of the expired flows (both directions) are collected; the open connection's
    // two remain.
    let collected = within(Duration::from_secs(GC_SECS + 3), || {
        status(&d, "ct")["flow_entries"] == 2
    });
    assert!(
        collected.is_some(),
        "the collector deletes expired entries: {}",
        status(&d, "ct")
    );
    let st = status(&d, "ct");
    assert_eq!(st["flows"], 1, "{st}");
    assert_eq!(st["flows_by_state"]["established"], 1, "{st}");
    open.ask().expect("the open connection keeps working");
    let metrics_like = d.ok(&["status"]);
    assert!(
        metrics_like.contains("flows: 1 (0 opening, 1 established, 0 closing)"),
        "{metrics_like}"
    );
}

/// `attach xdp` where it does not pay: `lb status` says which interfaces have no native XDP
/// (a bridge: TC serves it alone) and that on a veth XDP costs more than it saves; traffic is
/// served either way.
#[test]
fn lb_status_says_where_attach_xdp_does_not_pay() {
    if !require_root("lb_status_says_where_attach_xdp_does_not_pay") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs);
    let mut add = network_add(&topo, "x");
    add.extend(["--attach", "xdp"].map(String::from));
    d.ok(&add);
    d.ok(&service_set(
        "x",
        "api",
        "1",
        VIP,
        &format!("tcp/{PORT}"),
        &topo.backend_ips,
    ));
    let said = d.ok(&["status"]);
    println!("{said}");
    assert!(
        said.contains("attach xdp: lbbr0 has no native XDP; TC ingress serves it alone"),
        "{said}"
    );
    assert!(
        said.contains("attach xdp on veth lbc0: on a veth XDP costs more than it saves"),
        "{said}"
    );
    lb_tests::traffic::tcp_request(&topo.client, VIP, PORT, TIMEOUT).expect("served");
    lb_tests::traffic::tcp_request(&topo.backends[0], VIP, PORT, TIMEOUT)
        .expect("served from the bridge side too");
}
