//! The eBPF fast path through `lb daemon`, on the routed topology (client → node `lbc0` →
//! bridge `lbbr0` → backend veths): translated packets are handed to the backend's namespace
//! and replies to the client's past the node's stack, shown by the programs' outcome counters
//! (`lb_datapath_packets_total`, reason `redirected`) and by the node's bridge, which no
//! redirected packet crosses. Where the fast path may not or cannot go — a forward-hook rule,
//! an unresolved neighbour — packets take the stack and meet the same fate as without lb's
//! programs. IPv6 twins on the dual-stack topology: both ways past the stack on both attach
//! modes, and an `ip6` table's forward rule stops IPv6's fast path alone. Root only.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, datapath, eventually, network_add, observe, scrape, service_set_ports},
    netns::{ENDPOINT_IF, Netns, Topology},
    require_root,
    tools::{Tcpdump, link_stats},
    traffic::{
        DualServer, DualSession, Reply, TIMEOUT, all_dropped, spawn_backend, spawn_backends,
        tcp_request, udp_request, udp6_ask, udp6_client, udp6_servers,
    },
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const VIP6: &str = "fd99::10";
/// Backends answer TCP on PORT and UDP on PORT + 1; the service publishes PUB → PORT and
/// PUB + 1 → PORT + 1 on the node's addresses.
const PORT: u16 = 8080;
const PUB: u16 = 9080;
const NET: &str = "fast";

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// A daemon serving `NET` over `topo` with `extra` network flags, and its metrics address.
fn serve(topo: &Topology, bpffs: &Bpffs, extra: &[&str]) -> (LbDaemon, String) {
    let (d, metrics) = start(topo, bpffs, "ebpf", extra);
    set_web(&d, &topo.backend_ips);
    (d, metrics)
}

/// A daemon of `dataplane` with network `NET` over `topo` (`extra` flags) and no service
/// yet, and its metrics address.
fn start(topo: &Topology, bpffs: &Bpffs, dataplane: &str, extra: &[&str]) -> (LbDaemon, String) {
    let (d, metrics) =
        LbDaemon::start_with_metrics(lb(), bpffs.path(), dataplane).expect("lb daemon starts");
    let mut add = network_add(topo, NET);
    add.extend(extra.iter().map(|s| s.to_string()));
    d.ok(&add);
    (d, metrics)
}

fn set_web(d: &LbDaemon, backends: &[Ipv4Addr]) {
    let ports = [
        format!("tcp/{PUB}:{PORT}"),
        format!("udp/{}:{}", PUB + 1, PORT + 1),
    ];
    d.ok(&service_set_ports(NET, "web", VIP, &ports, backends));
}

/// The network's `path` in `lb status --json`.
fn path(d: &LbDaemon) -> String {
    d.path(NET)
}

/// Until `lb status` shows the fast path with at least `n` endpoints.
fn wait_fast(d: &LbDaemon, n: usize) {
    observe(&format!("fast path with {n} endpoints"), || {
        let p = path(d);
        let fast = (p.strip_prefix("fast: "))
            .and_then(|r| r.split(' ').next())
            .and_then(|c| c.parse::<usize>().ok())
            .is_some_and(|c| c >= n);
        if fast { Ok(()) } else { Err(p) }
    });
}

/// One request of each kind the network serves, to the VIP and to the published ports on the
/// node's client-facing address: every one answered, with the client's own address seen.
fn ask_all(topo: &Topology, rounds: usize) {
    for _ in 0..rounds {
        for (proto, addr, port) in [
            ("tcp", VIP, PORT),
            ("udp", VIP, PORT + 1),
            ("tcp", topo.node_ip, PUB),
            ("udp", topo.node_ip, PUB + 1),
        ] {
            let answer = if proto == "tcp" {
                tcp_request(&topo.client, addr, port, TIMEOUT)
            } else {
                udp_request(&topo.client, addr, port, TIMEOUT)
            }
            .unwrap_or_else(|e| panic!("{proto} {addr}:{port}: {e:#}"));
            let reply: Reply = answer.parse().unwrap();
            assert_eq!(
                *reply.peer.ip(),
                topo.client_ip,
                "the backend sees the client: {reply}"
            );
        }
    }
}

/// Redirected packets at `hook` so far.
fn redirected(metrics: &str, hook: &str) -> u64 {
    datapath(&scrape(metrics).unwrap(), NET, hook, "redirected")
}

fn carries_both_ways(attach: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, &["--attach", attach]);
    redirected_both_ways(&topo, &d, &metrics, |n| ask_all(&topo, n));
}

/// The first rounds of `ask` (2 TCP and 2 UDP requests a round) resolve the neighbours
/// through the stack, and the endpoints follow (1 + the backends); then every packet of 25
/// more rounds is redirected both ways, and none crosses the node's bridge.
fn redirected_both_ways(topo: &Topology, d: &LbDaemon, metrics: &str, ask: impl Fn(usize)) {
    // 12 requests: each backend gets some but with odds of 1 in 2,000.
    ask(3);
    wait_fast(d, 1 + topo.backends.len());
    println!("{}", d.ok(&["status"]));
    let (fwd0, rep0) = (
        redirected(metrics, "tc_ingress"),
        redirected(metrics, "tc_reply"),
    );
    let bridge0 = link_stats(&topo.node, "lbbr0").unwrap();
    const ROUNDS: usize = 25;
    ask(ROUNDS);
    let (fwd, rep) = (
        redirected(metrics, "tc_ingress") - fwd0,
        redirected(metrics, "tc_reply") - rep0,
    );
    let bridge = link_stats(&topo.node, "lbbr0").unwrap().since(&bridge0);
    println!("redirected: {fwd} towards backends, {rep} towards the client; bridge {bridge:?}");
    // Each TCP request is at least SYN, data, ACK/FIN one way and SYN-ACK, data, FIN the
    // other; each UDP request one datagram each way.
    let least = (ROUNDS * 2 * (3 + 1)) as u64;
    assert!(fwd >= least, "client → backend redirected {fwd} < {least}");
    assert!(rep >= least, "backend → client redirected {rep} < {least}");
    // Nothing crossed the bridge but the odd neighbour probe.
    assert!(
        bridge.rx_packets + bridge.tx_packets <= 8,
        "redirected packets skip the bridge: {bridge:?}"
    );
}

#[test]
fn fast_path_carries_vip_and_published_ports_both_ways_on_tc() {
    if require_root("fast_path_carries_vip_and_published_ports_both_ways_on_tc") {
        carries_both_ways("tc");
    }
}

#[test]
fn fast_path_carries_vip_and_published_ports_both_ways_on_xdp() {
    if require_root("fast_path_carries_vip_and_published_ports_both_ways_on_xdp") {
        carries_both_ways("xdp");
    }
}

/// A backend whose neighbour entry is gone is no endpoint: its next packet takes the stack,
/// which resolves it, and is delivered; the endpoint is back afterwards.
#[test]
fn an_unresolved_neighbour_falls_back_to_the_stack_and_delivers() {
    if !require_root("an_unresolved_neighbour_falls_back_to_the_stack_and_delivers") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, &[]);
    ask_all(&topo, 1);
    wait_fast(&d, 2);
    let backend = topo.backend_ips[0].to_string();
    topo.node
        .ip(["neigh", "del", &backend, "dev", "lbbr0"])
        .unwrap();
    eventually("the backend's endpoint leaves with its neighbour", || {
        path(&d).starts_with("fast: 1 ")
    });
    let scrape0 = scrape(&metrics).unwrap();
    let answer: Reply = udp_request(&topo.client, VIP, PORT + 1, TIMEOUT)
        .expect("delivered through the stack")
        .parse()
        .unwrap();
    assert_eq!(*answer.peer.ip(), topo.client_ip);
    let scrape1 = scrape(&metrics).unwrap();
    let grew = |hook, reason| {
        datapath(&scrape1, NET, hook, reason) - datapath(&scrape0, NET, hook, reason)
    };
    assert_eq!(
        grew("tc_ingress", "redirected"),
        0,
        "no endpoint, no redirect"
    );
    assert!(
        grew("tc_ingress", "translated") >= 1,
        "translated for the stack"
    );
    // The stack resolved the neighbour: the backend is an endpoint again.
    wait_fast(&d, 2);
}

/// The kernel's own verdict on a forwarded packet stands with lb attached: a forward-hook rule
/// dropping the client drops its VIP and published-port traffic, as it does through the
/// kernel's NAT (the fast path is the vetted one while the rule exists, and nothing it drops
/// is redirected; direct again when it goes); `fast-path on` is the operator's explicit
/// choice to bypass such rules, and does.
#[test]
fn a_forward_rule_dropping_the_client_still_drops_it() {
    if !require_root("a_forward_rule_dropping_the_client_still_drops_it") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let rule = format!(
        "add table inet guard\n\
         add chain inet guard filter_fwd {{ type filter hook forward priority 0; }}\n\
         add rule inet guard filter_fwd ip saddr {} drop\n",
        topo.client_ip
    );
    let add_rule = || {
        topo.node
            .sh(&format!("printf '{rule}' | nft -f -"))
            .unwrap()
    };
    // The yardstick: the kernel's own NAT (lb's nftables dataplane, moby's ruleset) serves the
    // client, and drops it once the rule is in.
    {
        let nft_bpffs = Bpffs::new().unwrap();
        let kernel = LbDaemon::start(lb(), nft_bpffs.path(), &["--dataplane", "nftables"]).unwrap();
        kernel.ok(&network_add(&topo, NET));
        set_web(&kernel, &topo.backend_ips);
        ask_all(&topo, 1);
        add_rule();
        all_dropped(&topo, VIP, PORT, PUB, "the kernel's NAT");
        topo.node.sh("nft delete table inet guard").unwrap();
        kernel.ok(&["network", "rm", NET]);
    }
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, &[]);
    ask_all(&topo, 2);
    // The client and a backend at least (which backends the requests went to is chance).
    wait_fast(&d, 2);
    add_rule();
    eventually("the fast path waits for netfilter's judgment", || {
        path(&d).contains("IPv4 vetted: ")
    });
    println!("{}", d.ok(&["status"]));
    let fwd0 = redirected(&metrics, "tc_ingress");
    all_dropped(&topo, VIP, PORT, PUB, "lb eBPF");
    assert_eq!(
        redirected(&metrics, "tc_ingress"),
        fwd0,
        "nothing the rule drops is ever redirected"
    );
    // The operator forces the fast path: the rule no longer sees the network's traffic.
    d.ok(&["network", "rm", NET]);
    let mut add = network_add(&topo, NET);
    add.extend(["--fast-path", "on"].map(String::from));
    d.ok(&add);
    set_web(&d, &topo.backend_ips);
    ask_all(&topo, 1);
    assert!(path(&d).starts_with("fast: "), "{}", path(&d));
    // Back to auto, and the rule gone: the fast path returns by itself.
    d.ok(&["network", "rm", NET]);
    d.ok(&network_add(&topo, NET));
    set_web(&d, &topo.backend_ips);
    assert!(path(&d).contains("IPv4 vetted: "), "{}", path(&d));
    topo.node.sh("nft delete table inet guard").unwrap();
    eventually("the direct fast path returns when the rule goes", || {
        !path(&d).contains("vetted")
    });
    ask_all(&topo, 1);
}

/// A container started after the daemon: its veth gets the reply hook and it is served on the
/// fast path both ways.
#[test]
fn a_backend_added_later_is_served_on_the_fast_path() {
    if !require_root("a_backend_added_later_is_served_on_the_fast_path") {
        return;
    }
    let mut topo = Topology::new(1).unwrap();
    let mut servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, &[]);
    ask_all(&topo, 1);
    wait_fast(&d, 2);
    let i = topo.add_backend().unwrap();
    let late: &Netns = &topo.backends[i];
    servers.push(spawn_backend(late, &format!("b{i}"), PORT, PORT + 1).unwrap());
    let port = Topology::bridge_port(i);
    eventually("the new veth gets the reply hook", || {
        path(&d).contains(&port)
    });
    // The new backend alone behind the VIP.
    set_web(&d, &[topo.backend_ips[i]]);
    ask_all(&topo, 1);
    wait_fast(&d, 3);
    let (fwd0, rep0) = (
        redirected(&metrics, "tc_ingress"),
        redirected(&metrics, "tc_reply"),
    );
    for _ in 0..10 {
        let r: Reply = tcp_request(&topo.client, VIP, PORT, TIMEOUT)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r.backend, format!("b{i}"));
    }
    let (fwd, rep) = (
        redirected(&metrics, "tc_ingress") - fwd0,
        redirected(&metrics, "tc_reply") - rep0,
    );
    assert!(fwd >= 30 && rep >= 30, "redirected {fwd} / {rep}");
}

/// A client behind a router (its address on the client's `lo`, routed by the node via the
/// client's link address) is no neighbour of the node: its replies take the next hop the
/// kernel's FIB gives (`bpf_fib_lookup`), past the stack, and are answered as before.
#[test]
fn replies_to_a_client_behind_a_router_take_the_fib_next_hop() {
    if !require_root("replies_to_a_client_behind_a_router_take_the_fib_next_hop") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let remote = Ipv4Addr::new(10, 50, 0, 2);
    topo.client
        .ip(["addr", "add", &format!("{remote}/32"), "dev", "lo"])
        .unwrap();
    // ARP with the link's own address, so the node never learns the remote one as a
    // neighbour (the default announces the packet's source).
    topo.client
        .sysctl("net.ipv4.conf.all.arp_announce", "2")
        .unwrap();
    let gw = topo.node_ip.to_string();
    topo.client
        .ip([
            "route",
            "replace",
            "default",
            "via",
            &gw,
            "src",
            &remote.to_string(),
        ])
        .unwrap();
    let client = topo.client_ip.to_string();
    topo.node
        .ip(["route", "add", "10.50.0.0/24", "via", &client])
        .unwrap();
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve(&topo, &bpffs, &[]);
    let ask = |n: usize| {
        for _ in 0..n {
            let r: Reply = tcp_request(&topo.client, VIP, PORT, TIMEOUT)
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(*r.peer.ip(), remote, "the backend sees the remote client");
        }
    };
    ask(3);
    // The backends asked so far and the client's router are the neighbours; the client
    // itself is not.
    wait_fast(&d, 2);
    let neighbours = topo.node.ip(["neigh", "show"]).unwrap();
    assert!(!neighbours.contains("10.50.0.2"), "{neighbours}");
    let rep0 = redirected(&metrics, "tc_reply");
    ask(10);
    let rep = redirected(&metrics, "tc_reply") - rep0;
    assert!(
        rep >= 10 * 3,
        "replies redirected over the FIB's next hop: {rep}"
    );
}

/// Servers on every backend of the dual-stack topology: [`DualServer`] answering TCP of both
/// families on PORT, [`udp6_servers`] UDP of IPv6 on PORT + 1 (for the test binary's life:
/// once per topology).
fn servers6(topo: &Topology) -> Vec<DualServer> {
    udp6_servers(topo, PORT + 1);
    (topo.backends.iter().enumerate())
        .map(|(i, ns)| DualServer::start(ns, &format!("b{i}"), PORT))
        .collect()
}

/// The IPv6 service of the dual-stack topology: [`VIP6`] (and [`VIP`]) with TCP on PORT and
/// UDP on PORT + 1, published as PUB and PUB + 1, over every backend of both families.
fn serve6(topo: &Topology, bpffs: &Bpffs, dataplane: &str, extra: &[&str]) -> (LbDaemon, String) {
    let (d, metrics) = start(topo, bpffs, dataplane, extra);
    let mut args: Vec<String> = ["service", "set", NET, "web", "--vip", VIP6, "--vip"]
        .map(String::from)
        .into();
    args.push(VIP.to_string());
    for p in [
        format!("tcp/{PUB}:{PORT}"),
        format!("udp/{}:{}", PUB + 1, PORT + 1),
    ] {
        args.extend(["--port".into(), p]);
    }
    let v4 = topo.backend_ips.iter().map(|b| IpAddr::V4(*b));
    let v6 = topo.v6().backends.iter().map(|b| IpAddr::V6(*b));
    for b in v4.chain(v6) {
        args.extend(["--backend".into(), b.to_string()]);
    }
    d.ok(&args);
    (d, metrics)
}

/// The IPv6 requests of [`ask_all`]: TCP and UDP to [`VIP6`] and to the published ports on
/// the node's IPv6 address, each answered, TCP with the client's own address seen.
fn ask_all6(topo: &Topology, rounds: usize) {
    let v6 = topo.v6();
    let vip: IpAddr = VIP6.parse().unwrap();
    for _ in 0..rounds {
        for to in [
            SocketAddr::new(vip, PORT),
            SocketAddr::new(IpAddr::V6(v6.node), PUB),
        ] {
            let (backend, peer) = DualSession::connect(&topo.client, to).ask();
            assert_eq!(
                peer.ip(),
                IpAddr::V6(v6.client),
                "{to}: {backend} sees the client"
            );
        }
        for to in [
            SocketAddr::new(vip, PORT + 1),
            SocketAddr::new(IpAddr::V6(v6.node), PUB + 1),
        ] {
            udp6_ask(&udp6_client(&topo.client, to), 8).unwrap_or_else(|e| panic!("udp {to}: {e}"));
        }
    }
}

/// TCP to [`VIP`] and the published port on the node's IPv4 address (the [`DualServer`]s of
/// [`serve6`] answer both families), each with the client's own address seen.
fn tcp4(topo: &Topology, rounds: usize) {
    for _ in 0..rounds {
        for to in [
            SocketAddr::new(IpAddr::V4(VIP), PORT),
            SocketAddr::new(IpAddr::V4(topo.node_ip), PUB),
        ] {
            let (backend, peer) = DualSession::connect(&topo.client, to).ask();
            assert_eq!(peer.ip(), IpAddr::V4(topo.client_ip), "{to}: {backend}");
        }
    }
}

/// [`carries_both_ways`] for IPv6: endpoints from neighbour discovery, hop limit and MACs
/// rewritten, the FIB asked for IPv6.
fn carries_ipv6_both_ways(attach: &str) {
    let topo = Topology::dual_stack(2).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let _servers = servers6(&topo);
    let (d, metrics) = serve6(&topo, &bpffs, "ebpf", &["--attach", attach]);
    // The neighbours are the client's and the backends' IPv6 ones: no IPv4 is sent.
    redirected_both_ways(&topo, &d, &metrics, |n| ask_all6(&topo, n));
    hop_limit_and_checksum_as_forwarded(&topo, &metrics);
}

/// What a backend's tcpdump shows of datagrams to [`VIP6`] handed over past the stack: the
/// hop limit one below the client's 64, as forwarding leaves it, and a UDP checksum tcpdump
/// finds right (the client computes full checksums for this: no offload seed to mistake).
fn hop_limit_and_checksum_as_forwarded(topo: &Topology, metrics: &str) {
    topo.set_tx_checksum(false).unwrap();
    let captures: Vec<Tcpdump> = (topo.backends.iter())
        .map(|ns| {
            let filter = format!("ip6 and udp dst port {}", PORT + 1);
            Tcpdump::start(ns, ENDPOINT_IF, &filter, 1).unwrap()
        })
        .collect();
    let fwd0 = redirected(metrics, "tc_ingress");
    let to = SocketAddr::new(VIP6.parse().unwrap(), PORT + 1);
    // Each from a port of its own: a flow each, spread over the backends.
    for _ in 0..12 {
        udp6_ask(&udp6_client(&topo.client, to), 8).unwrap_or_else(|e| panic!("udp {to}: {e}"));
    }
    assert!(
        redirected(metrics, "tc_ingress") - fwd0 >= 12,
        "past the stack"
    );
    let seen: String = (captures.into_iter())
        .map(|c| c.finish(Duration::from_millis(500)).unwrap())
        .collect();
    println!("tcpdump in the backends:\n{seen}");
    let packets: Vec<&str> = seen.lines().filter(|l| l.starts_with("IP6 ")).collect();
    assert!(!packets.is_empty(), "captured: {seen}");
    for p in packets {
        assert!(
            p.contains("hlim 63,"),
            "the hop limit forwarding leaves: {p}"
        );
    }
    let sums = seen.matches("[udp sum ok]").count();
    assert!(
        sums >= 1 && !seen.contains("bad udp cksum"),
        "tcpdump checks the translated checksum: {seen}"
    );
}

#[test]
fn fast_path_carries_ipv6_vip_and_published_ports_both_ways_on_tc() {
    if require_root("fast_path_carries_ipv6_vip_and_published_ports_both_ways_on_tc") {
        carries_ipv6_both_ways("tc");
    }
}

#[test]
fn fast_path_carries_ipv6_vip_and_published_ports_both_ways_on_xdp() {
    if require_root("fast_path_carries_ipv6_vip_and_published_ports_both_ways_on_xdp") {
        carries_ipv6_both_ways("xdp");
    }
}

/// An `ip6` table's forward rule dropping the client drops its IPv6 service traffic with lb
/// attached, as it does through the kernel's NAT: IPv6's fast path is the vetted one while
/// IPv4, which no rule sees, stays direct; the rule gone, IPv6 is direct again.
#[test]
fn an_ip6_forward_rule_stops_the_ipv6_fast_path_alone() {
    if !require_root("an_ip6_forward_rule_stops_the_ipv6_fast_path_alone") {
        return;
    }
    let topo = Topology::dual_stack(2).unwrap();
    let _servers = servers6(&topo);
    let rule = format!(
        "add table ip6 guard\n\
         add chain ip6 guard filter_fwd {{ type filter hook forward priority 0; }}\n\
         add rule ip6 guard filter_fwd ip6 saddr {} drop\n",
        topo.v6().client
    );
    let add_rule = || {
        topo.node
            .sh(&format!("printf '{rule}' | nft -f -"))
            .unwrap()
    };
    let ipv6_dropped = |by: &str| {
        let short = Duration::from_millis(700);
        let vip: IpAddr = VIP6.parse().unwrap();
        let tcp = topo
            .client
            .run(|| std::net::TcpStream::connect_timeout(&SocketAddr::new(vip, PORT), short))
            .unwrap();
        assert!(tcp.is_err(), "{by}: TCP [{VIP6}]:{PORT} dropped: {tcp:?}");
        let s = udp6_client(&topo.client, SocketAddr::new(vip, PORT + 1));
        s.set_read_timeout(Some(short)).unwrap();
        let udp = udp6_ask(&s, 8);
        assert!(
            udp.is_err(),
            "{by}: UDP [{VIP6}]:{} dropped: {udp:?}",
            PORT + 1
        );
    };
    // The yardstick: the kernel's NAT serves the client over IPv6 and drops it once the rule
    // is in.
    {
        let nft_bpffs = Bpffs::new().unwrap();
        let (kernel, _m) = serve6(&topo, &nft_bpffs, "nftables", &[]);
        ask_all6(&topo, 1);
        add_rule();
        ipv6_dropped("the kernel's NAT");
        topo.node.sh("nft delete table ip6 guard").unwrap();
        kernel.ok(&["network", "rm", NET]);
    }
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve6(&topo, &bpffs, "ebpf", &[]);
    ask_all6(&topo, 2);
    tcp4(&topo, 2);
    wait_fast(&d, 3);
    add_rule();
    eventually("IPv6's fast path waits for netfilter's judgment", || {
        path(&d).contains("IPv6 vetted: ")
            && path(&d).contains("its traffic (table ip6 guard chain filter_fwd")
    });
    let p = path(&d);
    assert!(!p.contains("IPv4 vetted"), "IPv4 stays direct: {p}");
    ipv6_dropped("lb eBPF");
    let fwd0 = redirected(&metrics, "tc_ingress");
    tcp4(&topo, 5);
    let fwd = redirected(&metrics, "tc_ingress") - fwd0;
    assert!(fwd >= 5 * 2 * 3, "IPv4 still redirected: {fwd}");
    topo.node.sh("nft delete table ip6 guard").unwrap();
    eventually(
        "IPv6 returns to the direct fast path when the rule goes",
        || !path(&d).contains("IPv6 vetted"),
    );
    let fwd0 = redirected(&metrics, "tc_ingress");
    ask_all6(&topo, 5);
    let fwd = redirected(&metrics, "tc_ingress") - fwd0;
    assert!(fwd >= 5 * 2 * 4, "IPv6 redirected again: {fwd}");
}

/// [`replies_to_a_client_behind_a_router_take_the_fib_next_hop`] for IPv6: the remote client
/// is no neighbour of the node, and its replies go to the next hop `bpf_fib_lookup` gives for
/// AF_INET6, past the stack.
#[test]
fn ipv6_replies_to_a_client_behind_a_router_take_the_fib_next_hop() {
    if !require_root("ipv6_replies_to_a_client_behind_a_router_take_the_fib_next_hop") {
        return;
    }
    let topo = Topology::dual_stack(2).unwrap();
    let _servers = servers6(&topo);
    let remote: std::net::Ipv6Addr = "fd50::2".parse().unwrap();
    topo.client
        .ip(["-6", "addr", "add", &format!("{remote}/128"), "dev", "lo"])
        .unwrap();
    let gw = topo.v6().node.to_string();
    topo.client
        .ip([
            "-6",
            "route",
            "replace",
            "default",
            "via",
            &gw,
            "src",
            &remote.to_string(),
        ])
        .unwrap();
    let client = topo.v6().client.to_string();
    topo.node
        .ip(["-6", "route", "add", "fd50::/64", "via", &client])
        .unwrap();
    let bpffs = Bpffs::new().unwrap();
    let (d, metrics) = serve6(&topo, &bpffs, "ebpf", &[]);
    let to = SocketAddr::new(VIP6.parse().unwrap(), PORT);
    let ask = |n: usize| {
        for _ in 0..n {
            let (backend, peer) = DualSession::connect(&topo.client, to).ask();
            assert_eq!(
                peer.ip(),
                IpAddr::V6(remote),
                "{backend} sees the remote client"
            );
        }
    };
    ask(3);
    wait_fast(&d, 2);
    let neighbours = topo.node.ip(["-6", "neigh", "show"]).unwrap();
    assert!(!neighbours.contains("fd50::2"), "{neighbours}");
    let rep0 = redirected(&metrics, "tc_reply");
    ask(10);
    let rep = redirected(&metrics, "tc_reply") - rep0;
    assert!(
        rep >= 10 * 3,
        "replies redirected over the FIB's IPv6 next hop: {rep}"
    );
}
