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

/// A closed TCP connection and an idle UDP flow, with `tcp_closing` and `udp` set to 2 s on
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
    add.extend(["--timeout", "tcp_closing=2", "--timeout", "udp=2"].map(String::from));
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
        serde_json::json!({"tcp_closing": 2, "udp": 2}),
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
        metrics_like.contains("flows: 1 (0 closing, 1 established, 0 opening)"),
        "{metrics_like}"
    );
}

/// What one rolling update under load did.
struct Rolled {
    requests: u64,
    errors: u64,
    /// New connections after the old generation was removed that reached it.
    reached_old: usize,
}

/// A rolling update under load, through the daemon on dataplane `dp`: wrk on the VIP and on a
/// published port at once (both to backend port 80, so the two services' flows meet on the
/// same backend ports, with `Connection: close`: a storm of new connections, many reusing a
/// client port for the other service), while generation 2 is added, generation 1 disabled and
/// then removed. Then 40 new connections, none of which may reach generation 1.
fn rolling_update_under_load(dp: &str) -> Rolled {
    use lb_tests::tools::{Nginx, WrkOptions, wrk};
    let topo = Topology::new(4).unwrap();
    let _nginx: Vec<Nginx> = (topo.backends.iter().enumerate())
        .map(|(i, ns)| Nginx::start(ns, &format!("b{i}"), 80).unwrap())
        .collect();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dp]).unwrap();
    d.ok(&network_add(&topo, "roll"));
    let (gen1, gen2) = (&topo.backend_ips[..2], &topo.backend_ips[2..]);
    let port = "tcp/18080:80";
    d.ok(&service_set("roll", "api", "1", VIP, port, gen1));
    let secs = 6;
    let opts = WrkOptions {
        duration: Duration::from_secs(secs),
        connections: 20,
        threads: 1,
        close: true,
        cpu: None,
    };
    let (client, node_ip) = (&topo.client, topo.node_ip);
    let (vip, published) = std::thread::scope(|s| {
        let vip = s.spawn(|| wrk(client, &format!("http://{VIP}:80/"), &opts));
        let published = s.spawn(|| wrk(client, &format!("http://{node_ip}:18080/"), &opts));
        std::thread::sleep(Duration::from_secs(1));
        d.ok(&service_set("roll", "api", "2", VIP, port, gen2));
        std::thread::sleep(Duration::from_secs(1));
        let disabled: Vec<String> = gen1.iter().map(|b| format!("{b},disabled")).collect();
        let mut args = service_set("roll", "api", "1", VIP, port, &[]);
        for b in &disabled {
            args.extend(["--backend".into(), b.clone()]);
        }
        d.ok(&args);
        std::thread::sleep(Duration::from_secs(1));
        d.ok(&["service", "rm", "roll", "api", "--generation", "1"]);
        (vip.join().unwrap(), published.join().unwrap())
    });
    let (vip, published) = (vip.unwrap(), published.unwrap());
    println!("{dp}: VIP {vip:?}\n{dp}: published port {published:?}");
    let mut reached_old = 0;
    for i in 0..40 {
        let (addr, p) = if i % 2 == 0 {
            (VIP, 80)
        } else {
            (node_ip, 18080)
        };
        let body = lb_tests::traffic::http_get(client, addr, p, TIMEOUT).unwrap();
        let r: lb_tests::traffic::Reply = body.parse().unwrap();
        if r.backend == "b0" || r.backend == "b1" {
            reached_old += 1;
        }
    }
    Rolled {
        requests: vip.requests + published.requests,
        errors: vip.errors() + published.errors(),
        reached_old,
    }
}

/// The rolling update under load on the eBPF dataplane and on the nftables ruleset in the same
/// test: lb fails no request, serves at least 0.7 times what the kernel's NAT serves, and
/// once the old generation is gone no new connection reaches it (a client port seen before
/// never finds an old entry: entries close with their connections, and a SYN on a closed
/// tuple is selected afresh).
#[test]
fn a_rolling_update_under_load_fails_nothing_and_serves_like_the_kernel() {
    if !require_root("a_rolling_update_under_load_fails_nothing_and_serves_like_the_kernel") {
        return;
    }
    let nft = rolling_update_under_load("nftables");
    let ebpf = rolling_update_under_load("ebpf");
    println!(
        "rolling update under load: ebpf {} requests, {} errors; nftables {} requests, {} errors; ratio {:.2}",
        ebpf.requests,
        ebpf.errors,
        nft.requests,
        nft.errors,
        ebpf.requests as f64 / nft.requests.max(1) as f64
    );
    assert_eq!(ebpf.errors, 0, "no failed request on lb");
    assert_eq!(
        ebpf.reached_old, 0,
        "no new connection reaches the removed generation"
    );
    assert_eq!(
        nft.reached_old, 0,
        "nor on the kernel's (a check of the test itself)"
    );
    assert!(
        ebpf.requests as f64 >= 0.7 * nft.requests as f64,
        "lb served {} where the kernel served {}",
        ebpf.requests,
        nft.requests
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
