//! The nftables fallback through the real daemon and CLI: the probe forced to fail selects it
//! (and says why), it serves a VIP and a published port, the kernel's table holds exactly
//! `lb elements`, a failing `nft` keeps the last good ruleset until the next sync heals it,
//! and switching dataplanes across a restart leaves nothing of the other. Root only.
use std::{collections::BTreeSet, net::Ipv4Addr, path::Path};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{FailingNft, LbDaemon, free_metrics_addr, network_add, scrape, service_set},
    netns::Topology,
    require_root,
    traffic::{Reply, TIMEOUT, spawn_backends, tcp_request},
};
use lb_user::{
    api,
    core::model::{Backend, DEFAULT_GENERATION, DesiredState, PortConfig, Service},
    dataplane::nft::{listed_elements, table_name},
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const PUBLISHED: u16 = 18080;

/// What the daemon logs when a difference could not be applied and it declares the table
/// whole instead.
const WHOLE: &str = "declaring it whole";

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn add_network(d: &LbDaemon, topo: &Topology, name: &str) {
    d.ok(&network_add(topo, name));
}

fn set_service(d: &LbDaemon, network: &str, generation: &str, backends: &[Ipv4Addr]) -> String {
    d.ok(&service_set(
        network,
        "api",
        generation,
        VIP,
        &port(),
        backends,
    ))
}

fn port() -> String {
    format!("tcp/{PUBLISHED}:{PORT}")
}

/// Which backends answer `n` new connections to the VIP and to the published port.
fn answering(topo: &Topology, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (addr, port) in [(VIP, PORT), (topo.node_ip, PUBLISHED)] {
        for _ in 0..n {
            let r: Reply = tcp_request(&topo.client, addr, port, TIMEOUT)
                .unwrap_or_else(|e| panic!("{addr}:{port}: {e:#}"))
                .parse()
                .unwrap();
            assert_eq!(*r.peer.ip(), topo.client_ip, "routed: no masquerade");
            seen.insert(r.backend);
        }
    }
    seen
}

fn status(d: &LbDaemon) -> Value {
    serde_json::from_str(&d.ok(&["status", "--json"])).unwrap()
}

/// `nft -j list table` of the network's table in the node namespace, as elements.
fn nft_elements(topo: &Topology, network: &str) -> String {
    let json = topo
        .node
        .exec(["nft", "-j", "list", "table", "ip", &table_name(network)])
        .unwrap();
    let mut listed: Vec<String> = listed_elements(&json)
        .unwrap()
        .into_iter()
        .map(|l| l.element.to_string())
        .collect();
    listed.sort();
    listed.join("\n")
}

fn sorted_lines(s: &str) -> String {
    let mut v: Vec<&str> = s.lines().collect();
    v.sort();
    v.join("\n")
}

#[test]
fn forced_probe_failure_selects_nftables_which_serves_and_holds_exactly_the_elements() {
    if !require_root(
        "forced_probe_failure_selects_nftables_which_serves_and_holds_exactly_the_elements",
    ) {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start_env(
        lb(),
        bpffs.path(),
        &["--dataplane", "auto"],
        &[("LB_PROBE_FAIL", "test of the fallback")],
    )
    .unwrap();
    let s = status(&d);
    assert_eq!(s["dataplane"], "nftables", "{s}");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("fell back") && reason.contains("test of the fallback"),
        "{reason}"
    );
    println!("status reason: {reason}");

    add_network(&d, &topo, "nf");
    set_service(&d, "nf", "1", &topo.backend_ips);
    let seen = answering(&topo, 30);
    assert_eq!(seen.len(), 3, "every backend answers: {seen:?}");

    let elements = d.elements("nf");
    assert_eq!(nft_elements(&topo, "nf"), sorted_lines(&elements));
    println!("nft -j list table holds exactly lb elements:\n{elements}");

    // The node condition that breaks a backend's hairpin to itself on this dataplane is said
    // by `lb status` while it holds (see nat_netns' hairpin case), and not once it is gone.
    let hairpin_warning = "warning: bridge lbbr0: hairpin mode is off on port(s) lbb0, lbb1, lbb2 ";
    if topo
        .node
        .sysctl("net.bridge.bridge-nf-call-iptables", "1")
        .is_ok()
    {
        let said = d.ok(&["status"]);
        assert!(said.contains(hairpin_warning), "{said}");
        println!("lb status with hairpin off:\n{said}");
    } else {
        eprintln!("br_netfilter is not loaded: no hairpin warning is due");
    }
    topo.set_hairpin(true).unwrap();
    let said = d.ok(&["status"]);
    assert!(!said.contains("warning"), "{said}");

    // A rolling update: generation 2 shares the VIP and the port; the union is partitioned.
    let gen2 = [topo.backend_ips[0]];
    set_service(&d, "nf", "2", &gen2);
    d.ok(&["service", "rm", "nf", "api", "--generation", "1"]);
    let elements = d.elements("nf");
    assert_eq!(nft_elements(&topo, "nf"), sorted_lines(&elements));
    assert_eq!(answering(&topo, 10), BTreeSet::from(["b0".to_owned()]));
    // Each of those syncs was a difference (a partition shape came and one went).
    assert!(!d.log().contains(WHOLE), "{}", d.log());

    let flows = d.conntrack("nf");
    assert!(
        flows.iter().any(|f| f["service"] == "api"
            && f["frontend"] == format!("{VIP}:{PORT}")
            && f["backend"] == format!("{}:{PORT}", topo.backend_ips[0])),
        "kernel conntrack listed: {flows:?}"
    );
    d.ok(&["network", "rm", "nf"]);
    assert!(
        topo.node
            .exec(["nft", "list", "table", "ip", &table_name("nf")])
            .is_err(),
        "the table goes with the network"
    );
}

#[test]
fn a_failing_nft_keeps_the_last_ruleset_serving_and_the_next_sync_heals() {
    if !require_root("a_failing_nft_keeps_the_last_ruleset_serving_and_the_next_sync_heals") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let nft = FailingNft::new().unwrap();
    let d = nft.start_daemon(lb(), bpffs.path()).unwrap();
    add_network(&d, &topo, "heal");
    set_service(&d, "heal", "1", &topo.backend_ips[..1]);
    assert_eq!(answering(&topo, 5), BTreeSet::from(["b0".to_owned()]));

    nft.fail(true).unwrap();
    // The API says so distinctly: 500 with `saved: true`, and the state holds the change.
    let service = Service {
        id: "api".into(),
        generation: "1".into(),
        vips: vec![VIP.into()],
        backends: (topo.backend_ips.iter())
            .map(|&ip| Backend {
                ip: ip.into(),
                disabled: false,
            })
            .collect(),
        ports: vec![port().parse::<PortConfig>().unwrap()],
    };
    let (method, path, body) = api::Request::ServiceSet {
        network: "heal".into(),
        service: service.clone(),
    }
    .to_http();
    let (code, reply) = (api::Client::new(&d.socket()))
        .send(method, &path, body.unwrap())
        .unwrap();
    let reply: api::ErrorReply = serde_json::from_slice(&reply).unwrap();
    println!("the API while nft fails: {code}: {reply:?}");
    assert!(
        code == 500 && reply.saved && reply.error.contains("injected failure"),
        "{code}: {reply:?}"
    );
    let saved: DesiredState = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    assert_eq!(saved.network("heal").unwrap().services, vec![service]);
    let r = d.cli(&service_set(
        "heal",
        "api",
        "1",
        VIP,
        &port(),
        &topo.backend_ips[1..],
    ));
    println!("while nft fails: {}", r.stderr.trim());
    assert!(
        !r.ok() && r.stderr.contains("saved, but") && r.stderr.contains("injected failure"),
        "{r:?}"
    );
    let s = status(&d);
    let err = s["networks"][0]["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("injected failure"),
        "status shows the failure: {s}"
    );
    assert_eq!(
        answering(&topo, 5),
        BTreeSet::from(["b0".to_owned()]),
        "the last good ruleset still serves"
    );

    nft.fail(false).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while status(&d)["networks"][0]["applied"] != true {
        assert!(
            std::time::Instant::now() < deadline,
            "not healed: {}",
            status(&d)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(answering(&topo, 5), BTreeSet::from(["b1".to_owned()]));
    assert_eq!(
        nft_elements(&topo, "heal"),
        sorted_lines(&d.elements("heal"))
    );
    drop(d);
}

/// `lb_reconcile_duration_seconds_count`: how many times the daemon has reconciled.
fn reconciles(metrics: &str) -> u64 {
    let text = scrape(metrics).unwrap();
    (text.lines())
        .find_map(|l| l.strip_prefix("lb_reconcile_duration_seconds_count "))
        .unwrap_or_else(|| panic!("no reconcile count:\n{text}"))
        .parse()
        .unwrap()
}

/// A network whose apply failed and that is removed before it was ever applied leaves
/// nothing behind: no failure to retry (the daemon goes idle: it reconciles no more), no
/// metrics series.
#[test]
fn a_network_removed_before_it_was_ever_applied_is_forgotten() {
    if !require_root("a_network_removed_before_it_was_ever_applied_is_forgotten") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let nft = FailingNft::new().unwrap();
    let metrics = free_metrics_addr().unwrap();
    let d = LbDaemon::start_env(
        lb(),
        bpffs.path(),
        &["--dataplane", "nftables", "--metrics", &metrics],
        &[("PATH", &nft.path_env())],
    )
    .unwrap();
    nft.fail(true).unwrap();
    let r = d.cli(&network_add(&topo, "ghost"));
    assert_eq!(r.code, Some(3), "saved, not applied: {r:?}");
    let r = d.cli(&["network", "rm", "ghost"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let before = reconciles(&metrics);
    // LbDaemon's daemons retry every second while a failure is kept.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let after = reconciles(&metrics);
    assert_eq!(before, after, "nothing is left to retry\n{}", d.log());
    let text = scrape(&metrics).unwrap();
    let left: Vec<&str> = (text.lines())
        .filter(|l| l.contains("network=\"ghost\""))
        .collect();
    assert!(left.is_empty(), "series of a removed network: {left:#?}");
}

#[test]
fn switching_dataplanes_across_a_restart_leaves_nothing_of_the_other() {
    if !require_root("switching_dataplanes_across_a_restart_leaves_nothing_of_the_other") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "ebpf"]).unwrap();
    add_network(&d, &topo, "sw");
    set_service(&d, "sw", "1", &topo.backend_ips);
    assert_eq!(answering(&topo, 20).len(), 2);
    let on_ebpf = d.elements("sw");
    let pins = bpffs.path().join("sw");
    assert!(pins.exists());

    d.set_extra(&["--dataplane", "nftables"]);
    d.restart().unwrap();
    assert_eq!(status(&d)["dataplane"], "nftables");
    assert!(!pins.exists(), "eBPF pins left after switching to nftables");
    assert_eq!(answering(&topo, 20).len(), 2, "served by nftables");
    let on_nft = d.elements("sw");
    assert_eq!(
        on_nft, on_ebpf,
        "the same state has the same elements on both"
    );
    assert_eq!(nft_elements(&topo, "sw"), sorted_lines(&on_nft));

    d.set_extra(&["--dataplane", "ebpf"]);
    d.restart().unwrap();
    assert_eq!(status(&d)["dataplane"], "ebpf");
    assert!(
        topo.node
            .exec(["nft", "list", "table", "ip", &table_name("sw")])
            .is_err(),
        "the nftables table is left after switching back to eBPF"
    );
    assert!(pins.exists());
    assert_eq!(answering(&topo, 20).len(), 2, "served by eBPF again");
}

#[test]
fn a_passing_probe_selects_ebpf_and_says_what_it_checked() {
    if !require_root("a_passing_probe_selects_ebpf_and_says_what_it_checked") {
        return;
    }
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "auto"]).unwrap();
    let s = status(&d);
    assert_eq!(s["dataplane"], "ebpf", "{s}");
    let reason = s["reason"].as_str().unwrap();
    assert!(reason.contains("pass the verifier"), "{reason}");
    println!("status reason: {reason}");
}

/// Flow timeouts set on a network are the eBPF dataplane's; on nftables the kernel's conntrack
/// keeps its own, and `lb status` says so rather than let them look applied. `lb conntrack`
/// shows the kernel's state and seconds left.
#[test]
fn nftables_says_the_networks_timeouts_are_the_kernels() {
    if !require_root("nftables_says_the_networks_timeouts_are_the_kernels") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    let mut add = network_add(&topo, "nt");
    add.extend(["--timeout", "udp=5"].map(String::from));
    d.ok(&add);
    set_service(&d, "nt", "1", &topo.backend_ips);
    let said = d.ok(&["status"]);
    assert!(
        said.contains("flow timeouts are not applied on the nftables dataplane"),
        "{said}"
    );
    let mut s = lb_tests::traffic::TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    s.ask().unwrap();
    let flows: Value = serde_json::from_str(&d.ok(&["conntrack", "nt", "--json"])).unwrap();
    let flows = flows.as_array().unwrap();
    assert_eq!(flows.len(), 1, "{flows:?}");
    assert_eq!(flows[0]["state"], "established", "{flows:?}");
    assert!(
        flows[0]["expires_secs"].as_u64().unwrap() > 3600,
        "{flows:?}"
    );
}

/// Sum of the kernel's counters of `vip`'s elements (one per new connection: a nat chain sees
/// a connection's first packet only).
fn vip_counted(topo: &Topology, network: &str, vip: Ipv4Addr) -> u64 {
    let json = topo
        .node
        .exec(["nft", "-j", "list", "table", "ip", &table_name(network)])
        .unwrap();
    let prefix = format!("{vip} . ");
    (listed_elements(&json).unwrap().iter())
        .filter(|l| l.element.key.starts_with(&prefix))
        .map(|l| l.packets)
        .sum()
}

/// A sync sends the difference from the last one, so the elements of a service that did not
/// change keep their counters: traffic counted, an unrelated service changed and another
/// added, the count goes on from where it was.
#[test]
fn nftables_counters_keep_counting_across_syncs() {
    if !require_root("nftables_counters_keep_counting_across_syncs") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    add_network(&d, &topo, "cnt");
    set_service(&d, "cnt", "1", &topo.backend_ips);
    let other = Ipv4Addr::new(10, 99, 0, 20);
    d.ok(&service_set(
        "cnt",
        "other",
        "1",
        other,
        "tcp/18081:8080",
        &topo.backend_ips[..1],
    ));
    for _ in 0..10 {
        tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    }
    assert_eq!(
        vip_counted(&topo, "cnt", VIP),
        10,
        "one count per connection"
    );

    // Unrelated changes: another service's backend, and a service added.
    d.ok(&service_set(
        "cnt",
        "other",
        "1",
        other,
        "tcp/18081:8080",
        &topo.backend_ips[1..],
    ));
    d.ok(&service_set(
        "cnt",
        "third",
        "1",
        Ipv4Addr::new(10, 99, 0, 30),
        "tcp/18082:8080",
        &topo.backend_ips,
    ));
    assert_eq!(
        vip_counted(&topo, "cnt", VIP),
        10,
        "the counts of an unchanged service survive a sync"
    );
    for _ in 0..5 {
        tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    }
    assert_eq!(vip_counted(&topo, "cnt", VIP), 15, "and go on counting");
    assert!(
        !d.log().contains(WHOLE),
        "every sync after the first was a difference: {}",
        d.log()
    );
    assert_eq!(
        nft_elements(&topo, "cnt"),
        sorted_lines(&d.elements("cnt")),
        "the differences add up to exactly lb elements"
    );
}

/// `lb_packets_total` series of network `net` in a scrape.
fn packet_series(text: &str, net: &str) -> Vec<String> {
    (text.lines())
        .filter(|l| l.starts_with("lb_packets_total{") && l.contains(&format!("network=\"{net}\"")))
        .map(str::to_owned)
        .collect()
}

/// A table that is not the one lb last wrote (here deleted by hand) fails the difference,
/// and the same sync declares it whole: the change is applied and served. Until then its
/// counters are left out of the metrics, never read as zeros (a counter back at zero reads
/// as a reset, and its rate as a burst).
#[test]
fn nftables_a_table_deleted_by_hand_is_declared_whole_by_the_next_sync() {
    if !require_root("nftables_a_table_deleted_by_hand_is_declared_whole_by_the_next_sync") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let metrics = free_metrics_addr().unwrap();
    let d = LbDaemon::start(
        lb(),
        bpffs.path(),
        &["--dataplane", "nftables", "--metrics", &metrics],
    )
    .unwrap();
    add_network(&d, &topo, "hand");
    set_service(&d, "hand", "1", &topo.backend_ips[..1]);
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    let counted = packet_series(&scrape(&metrics).unwrap(), "hand");
    assert!(
        counted.iter().any(|l| !l.ends_with(" 0")),
        "counted before: {counted:?}"
    );
    topo.node
        .exec(["nft", "delete", "table", "ip", &table_name("hand")])
        .unwrap();
    let gone = packet_series(&scrape(&metrics).unwrap(), "hand");
    assert!(gone.is_empty(), "no table, no counters: {gone:?}");
    set_service(&d, "hand", "1", &topo.backend_ips[1..]);
    assert_eq!(status(&d)["networks"][0]["applied"], true, "{}", status(&d));
    assert!(d.log().contains(WHOLE), "{}", d.log());
    assert_eq!(answering(&topo, 5), BTreeSet::from(["b1".to_owned()]));
    assert_eq!(
        nft_elements(&topo, "hand"),
        sorted_lines(&d.elements("hand"))
    );
}

/// Services of the node-scale test: `n` VIPs 10.100.x.y with 10 backends each and one
/// published TCP port each (20000 + i → 80); service 0 is the topology's own backends, the
/// only one traffic is sent to.
fn node_scale_state(topo: &Topology, network: &str, n: usize) -> Value {
    let vip = |i: usize| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + i as u32);
    let services: Vec<Value> = (0..n)
        .map(|i| {
            let backends: Vec<Value> = if i == 0 {
                (topo.backend_ips.iter())
                    .map(|b| serde_json::json!({ "ip": b.to_string() }))
                    .collect()
            } else {
                (0..10)
                    .map(|k| {
                        let b = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + (i * 10 + k) as u32;
                        serde_json::json!({ "ip": Ipv4Addr::from(b).to_string() })
                    })
                    .collect()
            };
            serde_json::json!({
                "id": format!("svc{i}"),
                "vip": vip(i).to_string(),
                "backends": backends,
                "ports": [{ "proto": "tcp", "published": 20000 + i, "target": PORT }],
            })
        })
        .collect();
    serde_json::json!({ "networks": [{
        "name": network,
        "netns": topo.node.name(),
        "interfaces": topo.node_ifaces,
        "services": services,
    }]})
}

/// Node scale on nftables (issue #10): 10,000 services × 10 backends with a published port
/// each (200,000 elements) applied from scratch with `lb apply -f`, then one backend of one
/// service changed with `lb service set`; both applied, the kernel's table read back equal to
/// `lb elements`, and the VIP and the published port of service 0 answer real traffic.
/// Timings are printed, not asserted.
#[test]
fn nftables_node_scale_apply_and_one_change() {
    if !require_root("nftables_node_scale_apply_and_one_change") {
        return;
    }
    let n: usize = std::env::var("LB_NFT_SCALE").map_or(10_000, |v| v.parse().unwrap());
    let topo = Topology::new(3).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    let file = d.state_dir().with_file_name("scale.json");
    std::fs::write(&file, node_scale_state(&topo, "big", n).to_string()).unwrap();

    let t = std::time::Instant::now();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
    let full = t.elapsed();
    assert_eq!(status(&d)["networks"][0]["applied"], true, "{}", status(&d));

    // One backend of service 1 replaced.
    let vip1 = Ipv4Addr::new(10, 100, 0, 1);
    let mut backends: Vec<Ipv4Addr> = (0..10)
        .map(|k| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + 10 + k))
        .collect();
    backends[3] = Ipv4Addr::new(10, 201, 0, 1);
    let t = std::time::Instant::now();
    d.ok(&service_set(
        "big",
        "svc1",
        DEFAULT_GENERATION,
        vip1,
        &format!("tcp/20001:{PORT}"),
        &backends,
    ));
    let one = t.elapsed();
    assert_eq!(status(&d)["networks"][0]["applied"], true, "{}", status(&d));
    println!(
        "nftables, {n} services × 10 backends + one port each: apply -f {full:?}, one backend changed {one:?}"
    );

    let vip0 = Ipv4Addr::new(10, 100, 0, 0);
    let mut seen = BTreeSet::new();
    for (addr, port) in [(vip0, PORT), (topo.node_ip, 20000)] {
        for _ in 0..20 {
            let r: Reply = tcp_request(&topo.client, addr, port, TIMEOUT)
                .unwrap_or_else(|e| panic!("{addr}:{port}: {e:#}"))
                .parse()
                .unwrap();
            seen.insert(r.backend);
        }
    }
    assert_eq!(
        seen.len(),
        3,
        "every backend of service 0 answers: {seen:?}"
    );
    let elements = d.elements("big");
    let changed = (elements.lines())
        .filter(|l| l.starts_with("nat-service-vip 10.100.0.1 . ") && l.ends_with(" : 10.201.0.1"))
        .count();
    assert_eq!(
        changed, 1,
        "the new backend has its interval in lb elements"
    );
    assert_eq!(nft_elements(&topo, "big"), sorted_lines(&elements));
    assert!(
        !d.log().contains(WHOLE),
        "the change was a difference: {}",
        d.log()
    );
}
