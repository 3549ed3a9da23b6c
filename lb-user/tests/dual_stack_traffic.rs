//! Dual stack through the real daemon and CLI, with real traffic in a dual-stack topology
//! (client, node, bridge of backends that have both families): on the nftables dataplane a
//! dual-stack service is reached over each family and every flow lands on a backend of its
//! own family, balanced; its published port answers on the node's address of each family;
//! `lb elements` and `lb conntrack` show IPv6 as nft and `[addr]:port` write it; the IPv6
//! table comes and goes with the network's IPv6 sets; neighbour discovery still works with lb
//! attached; IPv6 twins of hairpin, `host_ip` and drain. What cannot be served yet is refused
//! before it is saved, with the reason: IPv6 on the eBPF dataplane, DSR of an IPv6 VIP on
//! nftables. Root only.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::Path,
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add},
    netns::Topology,
    require_root,
    traffic::{CHI2_4_BINS_P1E6, DualServer, DualSession, chi_square, tcp_ask},
};

const VIP4: &str = "10.99.0.10";
const VIP6: &str = "fd99::10";
const PORT: u16 = 8080;
const PUBLISHED: u16 = 18080;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// `n` connections to `to`: answers per backend, each checked to come from a backend of
/// `to`'s family that saw the client's own address of that family (no masquerade here).
fn balanced(topo: &Topology, to: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let client = match to.ip() {
        IpAddr::V4(_) => IpAddr::V4(topo.client_ip),
        IpAddr::V6(_) => IpAddr::V6(topo.v6().client),
    };
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let (backend, peer) = tcp_ask(&topo.client, to);
        assert_eq!(peer.ip(), client, "{to}: answered by {backend} for {peer}");
        *counts.entry(backend).or_default() += 1;
    }
    counts
}

/// `lb service set web api` with both VIPs, every backend of both families and the published
/// port.
fn dual_service(topo: &Topology) -> Vec<String> {
    let mut args: Vec<String> = ["service", "set", "web", "api", "--vip", VIP4, "--vip", VIP6]
        .map(String::from)
        .into();
    args.extend(["--port".into(), format!("tcp/{PUBLISHED}:{PORT}")]);
    let v4 = topo.backend_ips.iter().map(|b| IpAddr::V4(*b));
    let v6 = topo.v6().backends.iter().map(|b| IpAddr::V6(*b));
    for b in v4.chain(v6) {
        args.extend(["--backend".into(), b.to_string()]);
    }
    args
}

fn nft_tables(topo: &Topology) -> String {
    topo.node.exec(["nft", "list", "tables"]).unwrap()
}

#[test]
fn a_dual_stack_service_on_nftables_serves_each_family_from_its_own_backends() {
    if !require_root("a_dual_stack_service_on_nftables_serves_each_family_from_its_own_backends") {
        return;
    }
    let topo = Topology::dual_stack(4).unwrap();
    let _servers: Vec<DualServer> = (topo.backends.iter().enumerate())
        .map(|(i, ns)| DualServer::start(ns, &format!("b{i}"), PORT))
        .collect();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, "web"));
    d.ok(&dual_service(&topo));
    assert!(
        nft_tables(&topo).contains("table ip6 lb-web"),
        "{}",
        nft_tables(&topo)
    );

    // Each family from its own backends (checked per answer), balanced over all four.
    let v6 = topo.v6().clone();
    for to in [
        SocketAddr::new(VIP6.parse().unwrap(), PORT),
        SocketAddr::new(IpAddr::V6(v6.node), PUBLISHED),
        SocketAddr::new(VIP4.parse().unwrap(), PORT),
        SocketAddr::new(IpAddr::V4(topo.node_ip), PUBLISHED),
    ] {
        let counts = balanced(&topo, to, 200);
        let chi2 = chi_square(&counts, 4);
        println!("{to}: {counts:?} chi2 = {chi2:.2}");
        assert_eq!(counts.len(), 4, "{to}: every backend answers: {counts:?}");
        assert!(chi2 < CHI2_4_BINS_P1E6, "{to}: χ² = {chi2:.2}: {counts:?}");
    }

    // What the operator sees: IPv6 elements as nft writes them, flows as [addr]:port.
    let elements = d.ok(&["elements", "web"]);
    assert!(
        elements.contains(&format!(
            "nat-service-vip {VIP6} . 0-16383 : {}",
            v6.backends[0]
        )),
        "{elements}"
    );
    assert!(
        elements.contains(&format!(
            "nat-publish-port tcp . {PUBLISHED} . 0-16383 : {} . {PORT}",
            v6.backends[0]
        )),
        "{elements}"
    );
    let flows = d.ok(&["conntrack", "web"]);
    assert!(
        flows.contains(&format!("[{}]:", v6.client)) && flows.contains(&format!("[{VIP6}]:{PORT}")),
        "{flows}"
    );
    let status = d.ok(&["status"]);
    assert!(
        status.contains("[::1]"),
        "the [::1] limit is said: {status}"
    );

    // Neighbour discovery with lb attached: the client reaches the node's IPv6 address.
    topo.client
        .exec(["ping", "-6", "-c", "1", "-W", "3", &v6.node.to_string()])
        .unwrap();

    // The IPv6 table goes with the network's last IPv6 set, and IPv4 is served on.
    let mut args: Vec<String> = ["service", "set", "web", "api", "--vip", VIP4]
        .map(String::from)
        .into();
    for b in &topo.backend_ips {
        args.extend(["--backend".into(), b.to_string()]);
    }
    d.ok(&args);
    assert!(!nft_tables(&topo).contains("ip6"), "{}", nft_tables(&topo));
    let (backend, _) = tcp_ask(&topo.client, SocketAddr::new(VIP4.parse().unwrap(), PORT));
    assert!(backend.starts_with('b'), "{backend}");
    d.ok(&["network", "rm", "web"]);
    let left = nft_tables(&topo);
    assert!(!left.contains("lb-web"), "{left}");
}

/// What cannot be served yet is refused before anything is saved, naming the address and
/// the reason.
#[test]
fn ipv6_the_dataplane_cannot_serve_is_refused_with_the_reason() {
    if !require_root("ipv6_the_dataplane_cannot_serve_is_refused_with_the_reason") {
        return;
    }
    let topo = Topology::dual_stack(1).unwrap();
    for (dataplane, mode, said) in [
        (
            "ebpf",
            "nat",
            "VIP fd99::10 is IPv6, and the ebpf dataplane serves IPv4 only so far",
        ),
        (
            "nftables",
            "dsr",
            "VIP fd99::10 is IPv6, and the nftables dataplane serves DSR for IPv4 VIPs only so far",
        ),
    ] {
        let bpffs = Bpffs::new().unwrap();
        let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
        let mut add = network_add(&topo, "web");
        add.extend(["--mode".into(), mode.into()]);
        d.ok(&add);
        let r = d.cli(&dual_service(&topo));
        assert!(!r.ok(), "{dataplane}/{mode}: {r:?}");
        assert!(r.stderr.contains(said), "{dataplane}/{mode}: {}", r.stderr);
        let state = d.ok(&["state"]);
        assert!(!state.contains("fd99"), "nothing saved: {state}");
        d.ok(&["network", "rm", "web"]);
    }
}

/// IPv6 twins of IPv4 behaviours on the nftables dataplane: a backend reaching its own VIP
/// (hairpin) is masqueraded to the node's IPv6 address on the backends' link and answered;
/// a port bound to an IPv6 `host_ip` answers there and not on the node's other IPv6 address;
/// a disabled (draining) backend keeps its connection and gets no new one.
#[test]
fn ipv6_on_nftables_hairpins_binds_its_host_ip_and_drains() {
    if !require_root("ipv6_on_nftables_hairpins_binds_its_host_ip_and_drains") {
        return;
    }
    let topo = Topology::dual_stack(2).unwrap();
    // A backend reaching itself through the VIP needs hairpin mode on its bridge port
    // whenever br_netfilter is loaded, for IPv6 as for IPv4 (nat_netns.rs's `hairpin`).
    topo.set_hairpin(true).unwrap();
    let _servers: Vec<DualServer> = (topo.backends.iter().enumerate())
        .map(|(i, ns)| DualServer::start(ns, &format!("b{i}"), PORT))
        .collect();
    let v6 = topo.v6().clone();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, "web"));
    let set = |disabled: Option<usize>| {
        let mut args: Vec<String> = ["service", "set", "web", "api", "--vip", VIP6, "--port"]
            .map(String::from)
            .into();
        args.push(format!("tcp/{PUBLISHED}:{PORT}@{}", v6.node));
        for (i, b) in v6.backends.iter().enumerate() {
            let state = if disabled == Some(i) { ",disabled" } else { "" };
            args.extend(["--backend".into(), format!("{b}{state}")]);
        }
        d.ok(&args);
    };
    set(None);
    let vip: SocketAddr = SocketAddr::new(VIP6.parse().unwrap(), PORT);

    // Hairpin: b0 to its own service, answered by either backend (itself included), which
    // sees the node's address on the backends' link.
    let mut seen = BTreeMap::<String, usize>::new();
    for _ in 0..40 {
        let (who, peer) = tcp_ask(&topo.backends[0], vip);
        assert_eq!(peer.ip(), IpAddr::V6(v6.node_backend), "hairpin to {who}");
        *seen.entry(who).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "both backends, b0 itself included: {seen:?}");

    // The host_ip: on fd10::1 only.
    let (_, peer) = tcp_ask(&topo.client, SocketAddr::new(v6.node.into(), PUBLISHED));
    assert_eq!(
        peer.ip(),
        IpAddr::V6(v6.client),
        "no masquerade from outside"
    );
    let other = SocketAddr::new(v6.node_backend.into(), PUBLISHED);
    let refused = topo
        .client
        .run(|| std::net::TcpStream::connect_timeout(&other, lb_tests::traffic::TIMEOUT))
        .unwrap();
    assert!(
        refused.is_err(),
        "{other} is not the port's host_ip: {refused:?}"
    );

    // Drain: a connection keeps its backend once it is disabled; new ones avoid it.
    let mut session = DualSession::connect(&topo.client, vip);
    let (kept, _) = session.ask();
    let i: usize = kept[1..].parse().unwrap();
    set(Some(i));
    for _ in 0..5 {
        assert_eq!(
            session.ask().0,
            kept,
            "the draining backend keeps its connection"
        );
    }
    for _ in 0..30 {
        let (who, _) = tcp_ask(&topo.client, vip);
        assert_ne!(who, kept, "no new connection to the disabled backend");
    }
}
