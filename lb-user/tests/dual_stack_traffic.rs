//! Dual stack through the real daemon and CLI, with real traffic in a dual-stack topology
//! (client, node, bridge of backends that have both families): on the nftables dataplane a
//! dual-stack service is reached over each family and every flow lands on a backend of its
//! own family, balanced; its published port answers on the node's address of each family;
//! `lb elements` and `lb conntrack` show IPv6 as nft and `[addr]:port` write it; the IPv6
//! table comes and goes with the network's IPv6 sets; neighbour discovery still works with lb
//! attached; IPv6 twins of hairpin, `host_ip`, drain, fragments and Packet Too Big. The eBPF
//! dataplane serves the same dual-stack service on both attach modes, both families on its
//! fast path, and a `dsr` network takes it on both dataplanes (DSR of an IPv6 VIP is
//! `dsr.rs`'s); IPv6 not for a service (neighbour discovery, routed traffic) passes the
//! eBPF programs untouched. Root only.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::Path,
    time::Duration,
};

use lb_common::{
    Flow6,
    flow::{NS_PER_SEC, expired},
};
use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, datapath, network_add, scrape},
    netns::Topology,
    require_root,
    storm::{STORM, storm},
    tools::Nginx,
    traffic::{
        DualServer, DualSession, TIMEOUT, assert_uniform_over_4, http_get_from, tcp_ask, udp6_ask,
        udp6_client, udp6_servers,
    },
};
use lb_user::dataplane::ebpf::{EbpfNetwork, be6, gc::monotonic_ns, pin_dir};

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

/// `lb service set web api` with `vips`, `ports` (`--port` specs) and `backends` (`--backend`
/// specs).
fn service_set<B: ToString>(
    vips: &[&str],
    ports: &[String],
    backends: impl IntoIterator<Item = B>,
) -> Vec<String> {
    let mut args: Vec<String> = ["service", "set", "web", "api"].map(String::from).into();
    for v in vips {
        args.extend(["--vip".into(), v.to_string()]);
    }
    for p in ports {
        args.extend(["--port".into(), p.clone()]);
    }
    for b in backends {
        args.extend(["--backend".into(), b.to_string()]);
    }
    args
}

/// `lb service set web api` with both VIPs, every backend of both families and the published
/// port.
fn dual_service(topo: &Topology) -> Vec<String> {
    let v4 = topo.backend_ips.iter().map(|b| IpAddr::V4(*b));
    let v6 = topo.v6().backends.iter().map(|b| IpAddr::V6(*b));
    service_set(
        &[VIP4, VIP6],
        &[format!("tcp/{PUBLISHED}:{PORT}")],
        v4.chain(v6),
    )
}

/// A daemon of `dataplane` with metrics on, and network `web` of `topo` attached by `attach`
/// with `flags` (`lb network add` options): its bpffs (which must outlive it), its metrics
/// address and the daemon, in the order that drops the daemon first when bound in it.
fn start_network(
    topo: &Topology,
    dataplane: &str,
    attach: &str,
    flags: &[&str],
) -> (Bpffs, String, LbDaemon) {
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = LbDaemon::start_with_metrics(lb(), bpffs.path(), dataplane).unwrap();
    let mut add = network_add(topo, "web");
    add.extend(
        ["--attach", attach]
            .iter()
            .chain(flags)
            .map(|f| f.to_string()),
    );
    d.ok(&add);
    (bpffs, metrics, d)
}

/// A [`DualServer`] on [`PORT`] in every backend, named `b<i>`.
fn dual_servers(topo: &Topology) -> Vec<DualServer> {
    (topo.backends.iter().enumerate())
        .map(|(i, ns)| DualServer::start(ns, &format!("b{i}"), PORT))
        .collect()
}

/// [`start_network`] on the eBPF dataplane, with a server on every backend.
fn ebpf_network(topo: &Topology, attach: &str) -> (Bpffs, Vec<DualServer>, String, LbDaemon) {
    let servers = dual_servers(topo);
    let (bpffs, metrics, d) = start_network(topo, "ebpf", attach, &[]);
    (bpffs, servers, metrics, d)
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
    let _servers = dual_servers(&topo);
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
        assert_uniform_over_4(&balanced(&topo, to, 200), &to.to_string());
    }

    // What the operator sees: IPv6 elements as nft writes them, flows as [addr]:port.
    let elements = d.elements("web");
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
    d.ok(&service_set(&[VIP4], &[], &topo.backend_ips));
    assert!(!nft_tables(&topo).contains("ip6"), "{}", nft_tables(&topo));
    let (backend, _) = tcp_ask(&topo.client, SocketAddr::new(VIP4.parse().unwrap(), PORT));
    assert!(backend.starts_with('b'), "{backend}");
    d.ok(&["network", "rm", "web"]);
    let left = nft_tables(&topo);
    assert!(!left.contains("lb-web"), "{left}");
}

/// A `dsr` network takes a dual-stack service on both dataplanes (its traffic is `dsr.rs`'s
/// `dsr6_*`), and leaves nothing behind when it goes.
#[test]
fn dsr_of_an_ipv6_vip_is_taken_by_both_dataplanes() {
    if !require_root("dsr_of_an_ipv6_vip_is_taken_by_both_dataplanes") {
        return;
    }
    let topo = Topology::dual_stack(1).unwrap();
    for dataplane in ["ebpf", "nftables"] {
        let bpffs = Bpffs::new().unwrap();
        let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
        let mut add = network_add(&topo, "web");
        add.extend(["--mode".into(), "dsr".into()]);
        d.ok(&add);
        d.ok(&dual_service(&topo));
        let state = d.ok(&["state"]);
        assert!(state.contains(VIP6), "{dataplane}: saved: {state}");
        d.ok(&["network", "rm", "web"]);
        let left = nft_tables(&topo);
        assert!(!left.contains("lb-web"), "{dataplane}: {left}");
    }
}

/// The node watcher follows IPv6 addresses as it does IPv4 ones: a subnet added to the
/// backends' bridge after the network was applied gets its hairpin masquerade rule in the
/// IPv6 table within seconds, and loses it with the address.
#[test]
fn an_ipv6_subnet_added_later_gets_its_hairpin_masquerade_on_nftables() {
    if !require_root("an_ipv6_subnet_added_later_gets_its_hairpin_masquerade_on_nftables") {
        return;
    }
    let topo = Topology::dual_stack(2).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, "web"));
    d.ok(&dual_service(&topo));
    let table = lb_user::dataplane::nft::table_name("web");
    let masquerades = |subnet: &str| {
        let rules = topo
            .node
            .exec(["nft", "list", "table", "ip6", &table])
            .unwrap();
        (rules.lines())
            .any(|l| l.contains(&format!("ip6 saddr {subnet} ")) && l.contains("masquerade"))
    };
    // The bridge's subnet from the start (fd20::/64, see Topology::dual_stack).
    assert!(masquerades("fd20::/64"), "the bridge's subnet");
    assert!(!masquerades("fd21::/64"), "no such subnet yet");
    let addr = [
        "-6",
        "addr",
        "add",
        "fd21::1/64",
        "dev",
        lb_tests::netns::NODE_BRIDGE,
        "nodad",
    ];
    topo.node.ip(addr).unwrap();
    let added = lb_tests::poll_until(Duration::from_secs(5), || masquerades("fd21::/64"));
    assert!(
        added.is_some(),
        "the new subnet's hairpin masquerade: {}",
        d.log()
    );
    topo.node
        .ip([
            "-6",
            "addr",
            "del",
            "fd21::1/64",
            "dev",
            lb_tests::netns::NODE_BRIDGE,
        ])
        .unwrap();
    let removed = lb_tests::poll_until(Duration::from_secs(5), || !masquerades("fd21::/64"));
    assert!(removed.is_some(), "gone with the address: {}", d.log());
}

/// IPv6 twins of IPv4 behaviours on the nftables dataplane and on the eBPF one (both attach
/// modes), with the same assertions: a backend reaching its own VIP
/// (hairpin) is masqueraded to the node's IPv6 address on the backends' link and answered;
/// a port bound to an IPv6 `host_ip` answers there and not on the node's other IPv6 address;
/// a disabled (draining) backend keeps its connection and gets no new one.
#[test]
fn ipv6_hairpins_binds_its_host_ip_and_drains_on_both_dataplanes() {
    if !require_root("ipv6_hairpins_binds_its_host_ip_and_drains_on_both_dataplanes") {
        return;
    }
    for (dataplane, attach) in [("nftables", "tc"), ("ebpf", "tc"), ("ebpf", "xdp")] {
        println!("{dataplane} (attach {attach})");
        hairpin_host_ip_drain(dataplane, attach);
    }
}

fn hairpin_host_ip_drain(dataplane: &str, attach: &str) {
    let topo = Topology::dual_stack(2).unwrap();
    // A backend reaching itself through the VIP needs hairpin mode on its bridge port
    // whenever br_netfilter is loaded, for IPv6 as for IPv4 (nat_netns.rs's `hairpin`).
    topo.set_hairpin(true).unwrap();
    let _servers = dual_servers(&topo);
    let v6 = topo.v6().clone();
    let (_bpffs, _, d) = start_network(&topo, dataplane, attach, &[]);
    let set = |disabled: Option<usize>| {
        let backends = (v6.backends.iter().enumerate()).map(|(i, b)| {
            let state = if disabled == Some(i) { ",disabled" } else { "" };
            format!("{b}{state}")
        });
        d.ok(&service_set(
            &[VIP6],
            &[format!("tcp/{PUBLISHED}:{PORT}@{}", v6.node)],
            backends,
        ));
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
        .run(|| std::net::TcpStream::connect_timeout(&other, TIMEOUT))
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

const UDP_PORT: u16 = 9090;

/// Fragments: 3000 bytes over a 1500-byte link, ten datagrams to `vip`, every one answered
/// by a backend that got it whole.
fn fragmented_datagrams_arrive_whole(topo: &Topology, vip: SocketAddr) {
    for _ in 0..10 {
        let s = udp6_client(&topo.client, vip);
        let answer =
            udp6_ask(&s, 3000).unwrap_or_else(|e| panic!("a fragmented datagram is answered: {e}"));
        assert!(answer.ends_with(" 3000"), "arrived whole: {answer}");
    }
}

/// A datagram too big for the node's link to the backends makes the node answer Packet Too
/// Big, whose quoted packet must be translated back to the VIP: the client's socket then
/// takes the smaller path MTU (the kernel applies a PTB only to a socket of the quoted
/// tuple, so an untranslated one is lost on it) and its next datagram, fragmented at the
/// source, arrives whole.
fn packet_too_big_reaches_the_client(topo: &Topology, vip: SocketAddr) {
    // Packet Too Big: the node's link to the backends gets IPv6's minimum MTU.
    topo.node
        .ip([
            "link",
            "set",
            "dev",
            lb_tests::netns::NODE_BRIDGE,
            "mtu",
            "1280",
        ])
        .unwrap();
    let s = udp6_client(&topo.client, vip);
    let e = udp6_ask(&s, 1400).expect_err("the node cannot forward 1400 bytes");
    assert_eq!(
        e.raw_os_error(),
        Some(EMSGSIZE),
        "the PTB reached the client's socket: {e}"
    );
    let route = (topo
        .client
        .ip(["-6", "route", "get", &vip.ip().to_string()]))
    .unwrap();
    assert!(
        route.contains("mtu 1280"),
        "the client learnt the VIP's path MTU from the translated PTB: {route}"
    );
    let answer = udp6_ask(&s, 1400)
        .unwrap_or_else(|e| panic!("the datagram, fragmented at the source, arrives: {e}"));
    assert!(answer.ends_with(" 1400"), "arrived whole: {answer}");
}

/// The eBPF programs follow an IPv6 datagram's later fragments by its first (the fragment
/// header's identification), as they do IPv4's, on both attach modes: each of ten 3000-byte
/// datagrams to the VIP arrives whole at a backend. And the node's Packet Too Big about a
/// translated datagram reaches the client quoting the VIP (TC egress translates it, as it
/// does IPv4's "fragmentation needed").
#[test]
fn ipv6_fragments_and_packet_too_big_on_ebpf() {
    if !require_root("ipv6_fragments_and_packet_too_big_on_ebpf") {
        return;
    }
    for attach in ["tc", "xdp"] {
        let topo = Topology::dual_stack(2).unwrap();
        udp6_servers(&topo, UDP_PORT);
        let (_bpffs, _, d) = start_network(&topo, "ebpf", attach, &[]);
        d.ok(&service_set(&[VIP6], &[], &topo.v6().backends));
        println!("attach {attach}");
        let vip = SocketAddr::new(VIP6.parse().unwrap(), UDP_PORT);
        fragmented_datagrams_arrive_whole(&topo, vip);
        packet_too_big_reaches_the_client(&topo, vip);
    }
}

/// nginx's port in the backends (the storm).
const HTTP_PORT: u16 = 80;

/// The IPv6 twin of real_traffic.rs's storms, with masquerade `always`, through the
/// nftables dataplane (the kernel's NAT: the yardstick) and the eBPF one on both attach
/// modes: 100,000 connections through the IPv6 VIP to nginx on two backends; on eBPF no flow
/// dropped for want of a reply tuple or a masquerade port (the programs count both) and no
/// more connections failed than through nftables, give or take 0.1% of the storm; and
/// afterwards 50 new connections all answered and masqueraded (nginx sees the node's IPv6
/// address on the backends' link).
#[test]
fn ipv6_storm_of_100k_connections_then_new_ones_still_masqueraded_on_both_dataplanes() {
    if !require_root(
        "ipv6_storm_of_100k_connections_then_new_ones_still_masqueraded_on_both_dataplanes",
    ) {
        return;
    }
    let mut nft_failed = None;
    for (dataplane, attach) in [("nftables", "tc"), ("ebpf", "tc"), ("ebpf", "xdp")] {
        let what = format!("{dataplane} {attach}");
        let topo = Topology::dual_stack(2).unwrap();
        let _nginx: Vec<Nginx> = (topo.backends.iter().enumerate())
            .map(|(i, ns)| Nginx::start_dual(ns, &format!("b{i}"), HTTP_PORT).unwrap())
            .collect();
        let v6 = topo.v6().clone();
        let (_bpffs, metrics, d) =
            start_network(&topo, dataplane, attach, &["--masquerade", "always"]);
        d.ok(&service_set(&[VIP6], &[], &v6.backends));
        let vip = SocketAddr::new(VIP6.parse().unwrap(), HTTP_PORT);

        let s = storm(&topo.client, &format!("http://{vip}/"));
        println!("{what}: storm: {}", s.summary());
        assert!(s.wrk.requests >= STORM, "{what}: {}", s.summary());
        match nft_failed {
            None => nft_failed = Some(s.failed()),
            Some(nft) => {
                let slack = s.opened.div_ceil(1000);
                assert!(
                    s.failed() <= nft + slack,
                    "{what}: {} connections failed, through nftables {nft}; allowed nft + \
                     0.1% of the storm ({slack}): {}",
                    s.failed(),
                    s.summary()
                );
                let text = scrape(&metrics).unwrap();
                for hook in ["xdp", "tc_ingress", "tc_egress"] {
                    for reason in ["nat_failed", "masq_failed"] {
                        let n = datapath(&text, "web", hook, reason);
                        assert_eq!(n, 0, "{what}: {hook} dropped {n} for {reason}");
                    }
                }
                let masqueraded = datapath(&text, "web", "tc_egress", "masq_new");
                assert!(masqueraded >= STORM, "{what}: {masqueraded} masquerades");
            }
        }

        let mut seen = BTreeMap::<String, usize>::new();
        for i in 0..50 {
            let (line, _) = http_get_from(&topo.client, vip, TIMEOUT)
                .unwrap_or_else(|e| panic!("{what}: connection {i} after the storm: {e:#}"));
            let (who, peer) = line.split_once(' ').unwrap_or_default();
            let (addr, _) = peer.rsplit_once(':').unwrap_or_default();
            assert_eq!(
                addr,
                v6.node_backend.to_string(),
                "{what}: connection {i} is masqueraded to the node: {line}"
            );
            *seen.entry(who.to_owned()).or_default() += 1;
        }
        println!("{what}: 50 connections after the storm, all masqueraded: {seen:?}");
    }
}

/// Linux's errno for "Message too long": what a connected UDP socket reports once a Packet
/// Too Big for its own tuple arrived.
const EMSGSIZE: i32 = 90;

/// IPv6 fragments and Packet Too Big through the nftables dataplane, as the kernel's own NAT
/// handles them: a UDP datagram larger than the client's MTU leaves it in fragments and
/// arrives whole at a backend, and the node's Packet Too Big reaches the client quoting the
/// VIP.
#[test]
fn ipv6_fragments_and_packet_too_big_on_nftables() {
    if !require_root("ipv6_fragments_and_packet_too_big_on_nftables") {
        return;
    }
    let topo = Topology::dual_stack(2).unwrap();
    udp6_servers(&topo, UDP_PORT);
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, "web"));
    d.ok(&service_set(&[VIP6], &[], &topo.v6().backends));
    let vip = SocketAddr::new(VIP6.parse().unwrap(), UDP_PORT);
    fragmented_datagrams_arrive_whole(&topo, vip);

    packet_too_big_reaches_the_client(&topo, vip);
}

/// The eBPF dataplane serves a dual-stack service on both attach modes as the nftables one
/// does: each family from its own backends (checked per answer, no masquerade), balanced over
/// all four, on its VIP and on the node's published port; `lb conntrack` shows the IPv6 flows
/// as `[addr]:port`; neighbour discovery on the node still works with the programs attached;
/// `lb status` says what IPv6 does not get yet.
#[test]
fn a_dual_stack_service_on_ebpf_serves_each_family_from_its_own_backends() {
    if !require_root("a_dual_stack_service_on_ebpf_serves_each_family_from_its_own_backends") {
        return;
    }
    for attach in ["tc", "xdp"] {
        let topo = Topology::dual_stack(4).unwrap();
        let (_bpffs, _servers, metrics, d) = ebpf_network(&topo, attach);
        d.ok(&dual_service(&topo));
        let v6 = topo.v6().clone();
        for to in [
            SocketAddr::new(VIP6.parse().unwrap(), PORT),
            SocketAddr::new(IpAddr::V6(v6.node), PUBLISHED),
            SocketAddr::new(VIP4.parse().unwrap(), PORT),
            SocketAddr::new(IpAddr::V4(topo.node_ip), PUBLISHED),
        ] {
            let what = format!("{attach}: {to}");
            assert_uniform_over_4(&balanced(&topo, to, 200), &what);
        }
        let flows = d.ok(&["conntrack", "web"]);
        assert!(
            flows.contains(&format!("[{}]:", v6.client))
                && flows.contains(&format!("[{VIP6}]:{PORT}")),
            "{attach}: {flows}"
        );
        topo.client
            .exec(["ping", "-6", "-c", "1", "-W", "3", &v6.node.to_string()])
            .unwrap_or_else(|e| panic!("{attach}: ping -6 {}: {e:#}", v6.node));
        let status = d.ok(&["status"]);
        assert!(
            status.contains("fast: ") && !status.contains("IPv6 traffic"),
            "{attach}: both families on the fast path: {status}"
        );
        let text = scrape(&metrics).unwrap();
        // Translated for the stack, or handed over past it (`redirected`).
        let translated: u64 = (["xdp", "tc_ingress"].iter())
            .flat_map(|hook| ["translated", "redirected"].map(|r| (hook, r)))
            .map(|(hook, reason)| datapath(&text, "web", hook, reason))
            .sum();
        assert!(translated >= 800, "{attach}: every connection translated");
    }
}

/// The eBPF dataplane on a dual-stack node, serving IPv4: IPv6 passes its programs
/// untouched on both attach modes — neighbour discovery (pings to the node and through it),
/// TCP to a backend's own IPv6 address (routed, unNATed: the backend sees the client) — while
/// IPv4 is served beside it. The programs parse IPv6: its ICMPv6 (echo, neighbour discovery)
/// is counted as `not_l4` on every hook.
#[test]
fn ipv6_passes_the_ebpf_programs_untouched_on_both_attach_modes() {
    if !require_root("ipv6_passes_the_ebpf_programs_untouched_on_both_attach_modes") {
        return;
    }
    for attach in ["tc", "xdp"] {
        let topo = Topology::dual_stack(2).unwrap();
        let (_bpffs, _servers, metrics, d) = ebpf_network(&topo, attach);
        let v6 = topo.v6().clone();
        d.ok(&service_set(&[VIP4], &[], &topo.backend_ips));

        let (who, peer) = tcp_ask(&topo.client, SocketAddr::new(VIP4.parse().unwrap(), PORT));
        assert_eq!(peer.ip(), IpAddr::V4(topo.client_ip), "{attach}: {who}");
        for to in [v6.node, v6.node_backend, v6.backends[1]] {
            topo.client
                .exec(["ping", "-6", "-c", "1", "-W", "3", &to.to_string()])
                .unwrap_or_else(|e| panic!("{attach}: ping -6 {to}: {e:#}"));
        }
        for (i, b) in v6.backends.iter().enumerate() {
            for _ in 0..5 {
                let (who, peer) = tcp_ask(&topo.client, SocketAddr::new((*b).into(), PORT));
                assert_eq!(who, format!("b{i}"), "{attach}: to {b}");
                assert_eq!(peer.ip(), IpAddr::V6(v6.client), "{attach}: untouched");
            }
        }
        let text = scrape(&metrics).unwrap();
        let mut hooks = vec!["tc_ingress", "tc_egress"];
        if attach == "xdp" {
            hooks.push("xdp");
        }
        for hook in hooks {
            let n = datapath(&text, "web", hook, "not_l4");
            println!("{attach}: {hook} not_l4 = {n}");
            assert!(n > 0, "{attach}: {hook} saw IPv6 and passed it");
        }
        let translated: u64 = (["xdp", "tc_ingress"].iter())
            .map(|hook| datapath(&text, "web", hook, "translated"))
            .sum();
        assert!(translated > 0, "{attach}: IPv4 served beside");
    }
}

/// Node-local clients over IPv6, a process of the node's own namespace: TCP to the IPv6 VIP,
/// to the published port on the node's IPv6 address and, on the eBPF dataplane, on `[::1]`
/// (the socket programs of IPv6 sockets send the socket to a backend before the stack picks
/// a route; nftables cannot serve `[::1]`, which has no `route_localnet`: its documented
/// limit); an IPv6 socket reaching the IPv4 VIP by its v4-mapped address is an IPv4 client
/// (balanced over the IPv4 backends); `getpeername` shows the service; an unconnected UDP
/// socket's answer comes from the VIP it asked; sockets spread over both IPv6 backends. The
/// nftables dataplane, the kernel's answer, is held to the same but `[::1]`.
#[test]
fn node_local_ipv6_clients_reach_the_service_on_both_dataplanes() {
    if !require_root("node_local_ipv6_clients_reach_the_service_on_both_dataplanes") {
        return;
    }
    for dataplane in ["ebpf", "nftables"] {
        let topo = Topology::dual_stack(2).unwrap();
        let _servers = dual_servers(&topo);
        udp6_servers(&topo, UDP_PORT);
        let (_bpffs, metrics, d) = start_network(&topo, dataplane, "tc", &[]);
        d.ok(&dual_service(&topo));
        let v6 = topo.v6().clone();
        let node = &topo.node;
        let vip6 = SocketAddr::new(VIP6.parse().unwrap(), PORT);
        let mut targets = vec![vip6, SocketAddr::new(IpAddr::V6(v6.node), PUBLISHED)];
        if dataplane == "ebpf" {
            targets.push(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), PUBLISHED));
        }
        for to in targets {
            let (who, peer) = tcp_ask(node, to);
            assert!(
                peer.is_ipv6(),
                "{dataplane}: {to} from the node is served over IPv6 by {who}, which saw {peer}"
            );
        }
        let mapped = SocketAddr::new(
            VIP4.parse::<Ipv4Addr>().unwrap().to_ipv6_mapped().into(),
            PORT,
        );
        let (who, peer) = tcp_ask(node, mapped);
        assert!(
            peer.is_ipv4(),
            "{dataplane}: {mapped} is reached over IPv4 ({who} saw {peer})"
        );

        for to in [vip6, mapped] {
            let s = (node.run(|| TcpStream::connect_timeout(&to, Duration::from_secs(2))))
                .unwrap()
                .unwrap_or_else(|e| panic!("{dataplane}: {to}: {e}"));
            assert_eq!(s.peer_addr().unwrap(), to, "{dataplane}: getpeername");
        }

        let udp = SocketAddr::new(VIP6.parse().unwrap(), UDP_PORT);
        let s = (node.run(|| UdpSocket::bind(("::", 0)))).unwrap().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send_to(b"hello", udp).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = (s.recv_from(&mut buf))
            .unwrap_or_else(|e| panic!("{dataplane}: UDP to {udp} from the node: {e}"));
        assert_eq!(
            from, udp,
            "{dataplane}: the answer comes from the VIP asked"
        );
        assert!(buf[..n].starts_with(b"b"), "{dataplane}: a backend answers");

        let mut seen = BTreeMap::<String, usize>::new();
        for _ in 0..30 {
            *seen.entry(tcp_ask(node, vip6).0).or_default() += 1;
        }
        assert_eq!(seen.len(), 2, "{dataplane}: both IPv6 backends: {seen:?}");
        if dataplane == "ebpf" {
            let text = scrape(&metrics).unwrap();
            let translated = datapath(&text, "web", "sock", "sock_translated");
            assert!(translated >= 36, "{dataplane}: counted: {translated}");
        }
    }
}

/// Keep-alive sessions the programs tracked.
const SESSIONS: usize = 8;

/// The IPv6 twin of real_traffic.rs's flushed sessions, through the daemon on both attach
/// modes, masquerade `never` and `always`: [`SESSIONS`] keep-alive connections to the IPv6
/// VIP, every entry of `lb_flows6` deleted (as LRU pressure or a flush would), and each
/// session asked again. Contract: each answer is the one before (backend, and the peer it
/// sees: the client, or the node's masquerade address and port), without error: the next
/// packet re-creates its flow by the keyed flow hash, on the same backend and, masqueraded,
/// the same port.
#[test]
fn ipv6_sessions_keep_backend_and_peer_after_the_flow_table_is_flushed() {
    if !require_root("ipv6_sessions_keep_backend_and_peer_after_the_flow_table_is_flushed") {
        return;
    }
    for (attach, masquerade) in [("tc", "never"), ("xdp", "never"), ("tc", "always")] {
        let what = format!("{attach}, masquerade {masquerade}");
        let topo = Topology::dual_stack(4).unwrap();
        let _servers = dual_servers(&topo);
        let (bpffs, metrics, d) =
            start_network(&topo, "ebpf", attach, &["--masquerade", masquerade]);
        d.ok(&dual_service(&topo));
        let vip6 = SocketAddr::new(VIP6.parse().unwrap(), PORT);
        let mut sessions: Vec<DualSession> = (0..SESSIONS)
            .map(|_| DualSession::connect(&topo.client, vip6))
            .collect();
        let before: Vec<(String, SocketAddr)> = sessions.iter_mut().map(|s| s.ask()).collect();
        let seen_as = match masquerade {
            "always" => topo.v6().node_backend,
            _ => topo.v6().client,
        };
        assert!(
            before
                .iter()
                .all(|(_, peer)| peer.ip() == IpAddr::V6(seen_as)),
            "{what}: seen as {seen_as}: {before:?}"
        );

        let mut maps = EbpfNetwork::open(
            &pin_dir(bpffs.path(), "web"),
            &Default::default(),
            Default::default(),
        )
        .unwrap();
        let keys: Vec<_> = maps.flow_entries6().into_iter().map(|(k, _)| k).collect();
        let per_flow = if masquerade == "always" { 4 } else { 2 };
        assert!(
            keys.len() >= SESSIONS * per_flow,
            "{what}: {SESSIONS} sessions hold {per_flow} entries each, found {}",
            keys.len()
        );
        for k in &keys {
            maps.flows6_mut().remove(k).unwrap();
        }
        assert!(maps.flow_entries6().is_empty(), "{what}: flushed");
        let recreated = || {
            let text = scrape(&metrics).unwrap();
            (["xdp", "tc_ingress", "tc_egress"].iter())
                .map(|hook| datapath(&text, "web", hook, "flow_recreated"))
                .sum::<u64>()
        };
        let recreated_before = recreated();

        for (i, (s, was)) in sessions.iter_mut().zip(&before).enumerate() {
            for _ in 0..3 {
                assert_eq!(&s.ask(), was, "{what}: session {i} after the flush");
            }
        }
        let recreated = recreated() - recreated_before;
        assert!(
            recreated >= SESSIONS as u64,
            "{what}: each session's flow re-created from a mid-flow packet: {recreated}"
        );
        println!("{what}: {SESSIONS} sessions kept their answers; {recreated} flows re-created");
    }
}

/// The IPv6 twin of real_traffic.rs's expiry, through the daemon on both attach modes: with
/// 2 s timeouts for UDP and for TCP connections closed by FINs, and masquerade `always`, the
/// entries of a few answered UDP exchanges and closed connections to the IPv6 VIP are live
/// right after their traffic and expired (or collected) once the timeout has passed since
/// their last packet, while an open session's entries stay live and it still answers.
#[test]
fn ipv6_idle_udp_and_closed_tcp_flows_expire_after_their_timeouts() {
    if !require_root("ipv6_idle_udp_and_closed_tcp_flows_expire_after_their_timeouts") {
        return;
    }
    const TIMEOUT_SECS: u64 = 2;
    const FLOWS: usize = 4;
    for attach in ["tc", "xdp"] {
        let topo = Topology::dual_stack(2).unwrap();
        let _servers = dual_servers(&topo);
        let _nginx: Vec<Nginx> = (topo.backends.iter().enumerate())
            .map(|(i, ns)| Nginx::start_dual(ns, &format!("b{i}"), HTTP_PORT).unwrap())
            .collect();
        udp6_servers(&topo, UDP_PORT);
        let flags = [
            "--masquerade",
            "always",
            "--timeout",
            "udp=2",
            "--timeout",
            "tcp_time_wait=2",
        ];
        let (bpffs, _metrics, d) = start_network(&topo, "ebpf", attach, &flags);
        d.ok(&dual_service(&topo));
        let vip6 = SocketAddr::new(VIP6.parse().unwrap(), PORT);
        let mut open = DualSession::connect(&topo.client, vip6);
        open.ask();
        let open_port = open.local_addr().port();
        let mut ports = Vec::new();
        for _ in 0..FLOWS {
            let s = udp6_client(&topo.client, SocketAddr::new(vip6.ip(), UDP_PORT));
            udp6_ask(&s, 8).unwrap_or_else(|e| panic!("{attach}: UDP: {e}"));
            ports.push((lb_common::IPPROTO_UDP, s.local_addr().unwrap().port()));
            let (_, local) =
                http_get_from(&topo.client, SocketAddr::new(vip6.ip(), HTTP_PORT), TIMEOUT)
                    .unwrap_or_else(|e| panic!("{attach}: HTTP: {e:#}"));
            ports.push((lb_common::IPPROTO_TCP, local.port()));
        }
        let done = monotonic_ns();

        let maps = EbpfNetwork::open(
            &pin_dir(bpffs.path(), "web"),
            &Default::default(),
            Default::default(),
        )
        .unwrap();
        let client = be6(topo.v6().client);
        // Every entry of the client's flow from `port`: F and S keyed from the client, R to
        // it, C rewriting back to it.
        let entries = |proto: u8, port: u16| -> Vec<Flow6> {
            let port = port.to_be();
            (maps.flow_entries6().into_iter())
                .filter(|(k, e)| {
                    k.proto == proto
                        && ((k.saddr == client && k.sport == port)
                            || (k.daddr == client && k.dport == port)
                            || (e.daddr == client && e.dport == port))
                })
                .map(|(_, e)| e)
                .collect()
        };
        let now = monotonic_ns();
        for &(proto, port) in ports.iter().chain([&(lb_common::IPPROTO_TCP, open_port)]) {
            let e = entries(proto, port);
            assert_eq!(
                e.len(),
                4,
                "{attach}: {proto}/{port}: 4 masqueraded entries"
            );
            assert!(
                e.iter().all(|e| !expired(e, now)),
                "{attach}: {proto}/{port} live right after its traffic: {e:?}"
            );
        }
        while monotonic_ns() <= done + TIMEOUT_SECS * NS_PER_SEC {
            std::thread::sleep(Duration::from_millis(100));
        }
        let now = monotonic_ns();
        for &(proto, port) in &ports {
            let e = entries(proto, port);
            assert!(
                e.iter().all(|e| expired(e, now)),
                "{attach}: {proto}/{port} expired (or collected) {TIMEOUT_SECS} s after its \
                 last packet: {e:?}"
            );
        }
        let e = entries(lb_common::IPPROTO_TCP, open_port);
        assert!(
            e.len() == 4 && e.iter().all(|e| !expired(e, now)),
            "{attach}: the open session's entries stay live: {e:?}"
        );
        open.ask();
        println!("{attach}: {FLOWS} UDP and {FLOWS} closed TCP IPv6 flows expired; open one live");
    }
}

/// A UDP datagram with checksum 0 from the client to the IPv6 VIP, sent by a raw socket (as
/// a tunnel endpoint that leaves IPv6 UDP checksums out, RFC 6935, sends them), from the port
/// of a UDP socket that then waits for the answer. Whether a backend's socket took it, and
/// so answered.
fn zero_checksum_datagram_answered(topo: &Topology, vip: SocketAddr, sport: u16) -> bool {
    use std::os::fd::FromRawFd as _;
    let (answers, raw) = (topo.client.run(|| {
        let answers = UdpSocket::bind(("::", sport)).unwrap();
        // SAFETY: a plain socket call; the fd is owned by the File below.
        let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_UDP) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a new socket nothing else owns.
        (answers, unsafe { std::fs::File::from_raw_fd(fd) })
    }))
    .unwrap();
    answers
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let payload = b"zero checksum";
    let mut datagram = Vec::new();
    datagram.extend(sport.to_be_bytes());
    datagram.extend(vip.port().to_be_bytes());
    datagram.extend(((8 + payload.len()) as u16).to_be_bytes());
    datagram.extend([0, 0]);
    datagram.extend(payload);
    let IpAddr::V6(to) = vip.ip() else {
        panic!("{vip} is IPv6")
    };
    let to = libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: 0,
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr {
            s6_addr: to.octets(),
        },
        sin6_scope_id: 0,
    };
    use std::os::fd::AsRawFd as _;
    // SAFETY: the buffer and address outlive the call, with the lengths given.
    let sent = unsafe {
        libc::sendto(
            raw.as_raw_fd(),
            datagram.as_ptr().cast(),
            datagram.len(),
            0,
            (&to as *const libc::sockaddr_in6).cast(),
            size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    };
    assert_eq!(
        sent,
        datagram.len() as isize,
        "sendto: {}",
        std::io::Error::last_os_error()
    );
    let mut buf = [0u8; 64];
    answers.recv_from(&mut buf).is_ok()
}

/// IPv6 forbids a UDP checksum of 0 (RFC 8200 8.1: the receiver discards the datagram);
/// the kernel's NAT keeps a 0 through its translation, for IPv6 as for IPv4 (where it means
/// "none"), so behind the nftables dataplane the backend's socket never sees such a
/// datagram. The eBPF programs give it its checksum: the backend answers. Both asserted:
/// the nftables outcome is the yardstick lb is held to and, here, beats.
#[test]
fn ipv6_udp_with_checksum_0_is_answered_on_ebpf_and_lost_on_nftables() {
    if !require_root("ipv6_udp_with_checksum_0_is_answered_on_ebpf_and_lost_on_nftables") {
        return;
    }
    for (dataplane, attach, answered) in [
        ("ebpf", "tc", true),
        ("ebpf", "xdp", true),
        ("nftables", "tc", false),
    ] {
        let topo = Topology::dual_stack(2).unwrap();
        udp6_servers(&topo, UDP_PORT);
        let (_bpffs, _metrics, d) = start_network(&topo, dataplane, attach, &[]);
        d.ok(&service_set(&[VIP6], &[], &topo.v6().backends));
        let vip = SocketAddr::new(VIP6.parse().unwrap(), UDP_PORT);
        // The path works for a datagram with its checksum.
        udp6_ask(&udp6_client(&topo.client, vip), 8)
            .unwrap_or_else(|e| panic!("{dataplane} {attach}: a checksummed datagram: {e}"));
        assert_eq!(
            zero_checksum_datagram_answered(&topo, vip, 41000),
            answered,
            "{dataplane} {attach}: a datagram with UDP checksum 0 answered"
        );
    }
}
