//! The vetted fast path (`--fast-path auto` where forward-hook rules exist) on nodes shaped
//! like the ones users run (`lb_tests::firewall`: Docker's filter table, the real CNI
//! `firewall` plugin's chains as Nomad runs it), on the routed topology (client → node `lbc0`
//! → bridge `lbbr0` → backend veths).
//!
//! On both: a flow's packets take the redirect after its first ones, both ways; what the
//! forward chain drops is never redirected and never reaches a backend; a drop rule inserted
//! under an established fast flow stops it within the documented bound, and its removal lets
//! new flows be fast again; a long-lived fast TCP connection and a UDP flow idle-then-active
//! survive an unrelated rule being added (as Docker does at every container start) and outlive
//! the node's conntrack timeouts, whose entries the periodic judgments keep fresh. Root only.
use std::{
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    bpffs::Bpffs,
    bpftool,
    daemon::{LbDaemon, datapath, eventually, network_add, scrape, service_set_ports},
    firewall::NodeShape,
    netns::{Netns, Topology},
    require_root,
    tools::{IperfServer, iperf_client},
    traffic::{
        TIMEOUT, TcpSession, UdpSession, all_dropped, spawn_backends, tcp_request, udp_request,
    },
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
/// Backends answer TCP on PORT and UDP on PORT + 1; the service publishes PUB → PORT and
/// PUB + 1 → PORT + 1 on the node's addresses.
const PORT: u16 = 8080;
const PUB: u16 = 9080;
const NET: &str = "vetted";
/// The backends' iperf servers (reached through the VIP, which serves every port).
const IPERF: u16 = 5201;
/// The node's conntrack timeouts for established TCP and for UDP with traffic both ways
/// (`nf_conntrack_tcp_timeout_established`, `nf_conntrack_udp_timeout_stream`; 5 days and
/// 120 s by default), shortened so that a test outlives them.
const CT_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a rule change reaches every fast flow: the watcher's report and the daemon's
/// refresh, and at most `lb_common::flow::REJUDGE_NS` (2 s) without them.
const BOUND: Duration = Duration::from_millis(2500);
/// Longer than a TCP flow waits before it asks for a liberal conntrack entry and may take the
/// vetted path (`lb_common::flow::LIBERAL_AFTER`, about 100 ms).
const OLD_ENOUGH: Duration = Duration::from_millis(300);

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// The ports the backends publish, as the shapes' accept rules name them.
const PUBLISHED: [(&str, u16); 3] = [("tcp", PORT), ("udp", PORT + 1), ("tcp", IPERF)];

fn set_conntrack_timeouts(node: &Netns) {
    let secs = CT_TIMEOUT.as_secs().to_string();
    for key in [
        "net.netfilter.nf_conntrack_tcp_timeout_established",
        "net.netfilter.nf_conntrack_udp_timeout_stream",
        "net.netfilter.nf_conntrack_udp_timeout",
    ] {
        node.sysctl(key, &secs).unwrap();
    }
}

/// A daemon of `dataplane` serving `NET` over `topo` (VIP and published ports, TCP and UDP),
/// and its metrics address.
fn serve(topo: &Topology, bpffs: &Bpffs, dataplane: &str) -> (LbDaemon, String) {
    let (d, metrics) =
        LbDaemon::start_with_metrics(lb(), bpffs.path(), dataplane).expect("lb daemon starts");
    d.ok(&network_add(topo, NET));
    let ports = [
        format!("tcp/{PUB}:{PORT}"),
        format!("udp/{}:{}", PUB + 1, PORT + 1),
    ];
    d.ok(&service_set_ports(
        NET,
        "web",
        VIP,
        &ports,
        &topo.backend_ips,
    ));
    (d, metrics)
}

/// Redirected packets so far: towards backends (TC ingress) and towards clients (the reply
/// hook).
fn redirected(metrics: &str) -> (u64, u64) {
    let text = scrape(metrics).unwrap();
    (
        datapath(&text, NET, "tc_ingress", "redirected"),
        datapath(&text, NET, "tc_reply", "redirected"),
    )
}

fn ipt(node: &Netns, rule: &str) {
    node.sh(&format!("iptables {rule}")).unwrap();
}

/// The whole contract on a node of `shape`: see the module.
fn judged_by_netfilter(shape: NodeShape) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    shape.load(&topo, &PUBLISHED).unwrap();
    set_conntrack_timeouts(&topo.node);
    let drop_client = format!("{} -s {} -j DROP", shape.user_chain(), topo.client_ip);

    // The yardstick: through the kernel's NAT the node's rules serve the client, and a drop
    // rule for it drops everything.
    {
        let nft_bpffs = Bpffs::new().unwrap();
        let (kernel, _m) = serve(&topo, &nft_bpffs, "nftables");
        for (addr, port) in [(VIP, PORT), (topo.node_ip, PUB)] {
            tcp_request(&topo.client, addr, port, TIMEOUT).unwrap();
            udp_request(&topo.client, addr, port + 1, TIMEOUT).unwrap();
        }
        ipt(&topo.node, &format!("-I {drop_client}"));
        all_dropped(&topo, VIP, PORT, PUB, "the kernel's NAT");
        ipt(&topo.node, &format!("-D {drop_client}"));
        kernel.ok(&["network", "rm", NET]);
    }

    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, "ebpf");
    let p = d.path(NET);
    assert!(p.contains("IPv4 vetted: "), "{shape:?}: {p}");
    println!("{shape:?} node: {}", d.ok(&["status"]));

    // 1. Fast after the first packets, both ways: a UDP flow and a TCP connection to the
    //    VIP, a UDP flow and a TCP connection to the published ports.
    let mut udp = UdpSession::connect(&topo.client, VIP, PORT + 1, TIMEOUT).unwrap();
    let mut tcp = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    let mut udp_pub = UdpSession::connect(&topo.client, topo.node_ip, PUB + 1, TIMEOUT).unwrap();
    let mut tcp_pub = TcpSession::connect(&topo.client, topo.node_ip, PUB, TIMEOUT).unwrap();
    let mut ask_each = |n: usize| {
        for _ in 0..n {
            udp.ask().unwrap();
            tcp.ask().unwrap();
            udp_pub.ask().unwrap();
            tcp_pub.ask().unwrap();
        }
    };
    // Neighbours resolved through the stack first (the endpoints follow them); the TCP
    // connections old enough to ask for a liberal conntrack entry (`flow::LIBERAL_AFTER`).
    ask_each(2);
    eventually("the backends and the client are endpoints", || {
        d.path(NET).starts_with("fast: 3 ")
    });
    std::thread::sleep(OLD_ENOUGH);
    ask_each(1);
    let before = redirected(&metrics);
    const ASKS: usize = 30;
    ask_each(ASKS);
    let after = redirected(&metrics);
    let (fwd, rep) = (after.0 - before.0, after.1 - before.1);
    println!(
        "{shape:?}: {ASKS} asks on 4 flows: redirected {fwd} towards backends, {rep} towards the client"
    );
    // Each ask is a datagram each way per UDP flow, data and its ACK each way per TCP one;
    // only a flow's first packets, and one per direction every 2 s, take the stack.
    let least = (ASKS * 4 - 8) as u64;
    assert!(fwd >= least, "client → backend redirected {fwd} < {least}");
    assert!(rep >= least, "backend → client redirected {rep} < {least}");

    // 2. A drop rule under the established fast flows stops them: as soon as the daemon has
    //    seen the change (it voids every judgment: the next packet of every flow is judged
    //    under the new rules), and within the bound whatever it saw.
    let since0 = vetted_since(&bpffs);
    udp.ask().unwrap();
    ipt(&topo.node, &format!("-I {drop_client}"));
    let inserted = Instant::now();
    eventually(
        "the daemon voids the judgments made before the rule",
        || vetted_since(&bpffs) != since0,
    );
    let seen = inserted.elapsed();
    let r = udp.ask();
    assert!(
        r.is_err(),
        "{shape:?}: the fast UDP flow's first packet after the change seen {seen:?} after it is judged, and dropped: {r:?}"
    );
    println!("{shape:?}: the rule change was seen {seen:?} after it");
    std::thread::sleep(BOUND.saturating_sub(inserted.elapsed()));
    let fwd0 = redirected(&metrics).0;
    let mut short =
        UdpSession::connect(&topo.client, VIP, PORT + 1, Duration::from_millis(400)).unwrap();
    drop(short.ask());
    for (what, r) in [("udp", udp.ask()), ("tcp", tcp.ask())] {
        assert!(
            r.is_err(),
            "{shape:?}: the established {what} flow stopped {:?} after the rule: {r:?}",
            inserted.elapsed()
        );
    }
    // 3. What the rule drops is never fast and never at a backend: new flows of every kind.
    all_dropped(&topo, VIP, PORT, PUB, "lb eBPF");
    assert!(short.ask().is_err());
    assert_eq!(
        redirected(&metrics).0,
        fwd0,
        "{shape:?}: nothing the forward chain drops is redirected"
    );
    // 4. The rule gone, new flows are fast again.
    ipt(&topo.node, &format!("-D {drop_client}"));
    let mut udp = UdpSession::connect(&topo.client, VIP, PORT + 1, TIMEOUT).unwrap();
    let mut tcp = TcpSession::connect(&topo.client, topo.node_ip, PUB, TIMEOUT).unwrap();
    udp.ask().unwrap();
    tcp.ask().unwrap();
    std::thread::sleep(OLD_ENOUGH);
    let before = redirected(&metrics);
    for _ in 0..ASKS {
        udp.ask().unwrap();
        tcp.ask().unwrap();
    }
    let after = redirected(&metrics);
    let least = (ASKS * 2 - 8) as u64;
    assert!(
        after.0 - before.0 >= least && after.1 - before.1 >= least,
        "{shape:?}: fast again without the rule: {before:?} → {after:?}"
    );

    // 5. An unrelated rule, and the node's conntrack timeouts outlived: the TCP connection
    //    asks every 100 ms for three timeouts; the UDP flow is active, then idle for longer
    //    than a timeout, then active again.
    let start = Instant::now();
    let mut added = false;
    while start.elapsed() < CT_TIMEOUT * 3 {
        let t = start.elapsed();
        tcp.ask()
            .unwrap_or_else(|e| panic!("{shape:?}: the fast TCP connection at {t:?}: {e:#}"));
        if t < CT_TIMEOUT / 2 || t > CT_TIMEOUT * 2 {
            udp.ask()
                .unwrap_or_else(|e| panic!("{shape:?}: the UDP flow at {t:?}: {e:#}"));
        }
        if !added && t > CT_TIMEOUT {
            ipt(&topo.node, shape.unrelated_rule());
            added = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let during = redirected(&metrics);
    assert!(
        during.0 - after.0 >= 100 && during.1 - after.1 >= 100,
        "{shape:?}: the flows stayed fast: {after:?} → {during:?}"
    );
    // The node's own record of the connection is alive and established: the judgments every
    // 2 s refreshed it (it would have expired twice over otherwise).
    let local = tcp_local_port(&tcp);
    let ct = topo
        .node
        .sh(&format!("conntrack -L -p tcp --sport {local} 2>/dev/null"))
        .unwrap();
    assert!(
        ct.contains("ESTABLISHED") && ct.contains("ASSURED"),
        "{shape:?}: the node's conntrack keeps the fast connection: {ct:?}"
    );
}

/// The flows in `lb_liberal` (made liberal in the node's conntrack).
fn liberal_flows(bpffs: &Bpffs) -> usize {
    let pin = bpffs.path().join(NET).join("lb_liberal");
    let dump = bpftool::json(&["map", "dump", "pinned", pin.to_str().unwrap()]).unwrap();
    dump.as_array().map_or(0, Vec::len)
}

/// What `lb_vetted_since` holds (the stamp of the daemon's last look at a changed ruleset).
fn vetted_since(bpffs: &Bpffs) -> u64 {
    let pin = bpffs.path().join(NET).join("lb_vetted_since");
    let dump = bpftool::json(&["map", "dump", "pinned", pin.to_str().unwrap()]).unwrap();
    dump[0]["formatted"]["value"]
        .as_u64()
        .unwrap_or_else(|| panic!("lb_vetted_since: {dump}"))
}

fn tcp_local_port(s: &TcpSession) -> u16 {
    s.local_addr().unwrap().port()
}

#[test]
fn a_docker_node_judges_every_fast_flow() {
    if require_root("a_docker_node_judges_every_fast_flow") {
        judged_by_netfilter(NodeShape::Docker);
    }
}

#[test]
fn a_nomad_node_judges_every_fast_flow() {
    if require_root("a_nomad_node_judges_every_fast_flow") {
        judged_by_netfilter(NodeShape::Nomad);
    }
}

/// The invalid packets the node's conntrack counted so far (`conntrack -S`, every CPU).
fn ct_invalid(node: &Netns) -> u64 {
    let stats = node.sh("conntrack -S").unwrap();
    stats
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("invalid="))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// A bulk TCP transfer on the vetted path, where the node drops what its conntrack finds
/// invalid (kube-proxy's `KUBE-FORWARD` rule, ahead of Docker's): the packets judged every
/// 2 s are of a connection conntrack has not seen for that long, and must still pass.
#[test]
fn a_bulk_transfer_stays_valid_for_the_nodes_conntrack() {
    if !require_root("a_bulk_transfer_stays_valid_for_the_nodes_conntrack") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let _iperf = IperfServer::start(&topo.backends[0], IPERF).unwrap();
    NodeShape::Docker.load(&topo, &PUBLISHED).unwrap();
    ipt(
        &topo.node,
        "-I FORWARD -m conntrack --ctstate INVALID -j DROP",
    );
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, "ebpf");
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    eventually("the backend and the client are endpoints", || {
        d.path(NET).starts_with("fast: 2 ")
    });
    let liberal0 = liberal_flows(&bpffs);
    let invalid0 = ct_invalid(&topo.node);
    let before = redirected(&metrics);
    let bps = iperf_client(&topo.client, VIP, IPERF, 7, None).unwrap();
    let after = redirected(&metrics);
    let invalid = ct_invalid(&topo.node) - invalid0;
    println!(
        "iperf through the VIP: {:.2} Gbit/s, redirected {:?}, conntrack invalid {invalid}",
        bps / 1e9,
        (after.0 - before.0, after.1 - before.1)
    );
    assert!(after.0 - before.0 > 1000, "the transfer took the fast path");
    assert_eq!(
        invalid, 0,
        "every judged packet is valid for the node's conntrack"
    );
    // The transfer's connection, once older than `flow::LIBERAL_AFTER`.
    assert_eq!(
        liberal_flows(&bpffs),
        liberal0 + 1,
        "the transfer's connection, made liberal"
    );
}
