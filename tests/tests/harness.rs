//! The netns harness itself, without lb: the topologies route and switch real traffic, the
//! checksum offload toggle changes what is on the wire, and nothing outlives a test — not after
//! a drop, not after a panic, not after a crashed earlier run. Root only.
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use lb_tests::netns::{ENDPOINT_IF, NODE_BRIDGE, NODE_CLIENT_IF, Netns, Topology};
use lb_tests::require_root;
use lb_tests::switch::{Hop, Hops, Switch, VIP};
use lb_tests::tools::link_mac;
use lb_tests::traffic::{
    Reply, TIMEOUT, TcpSession, UdpSession, spawn_backends, tcp_request, udp_request,
};

const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 9090;

fn reply(line: &str) -> Reply {
    line.parse().unwrap()
}

/// Every backend answers `from` over TCP and UDP, as itself, and sees `seen` as the peer.
fn assert_each_backend_answers(topo: &Topology, from: &Netns, seen: Ipv4Addr) {
    for (i, &addr) in topo.backend_ips.iter().enumerate() {
        for answer in [
            tcp_request(from, addr, TCP_PORT, TIMEOUT).unwrap(),
            udp_request(from, addr, UDP_PORT, TIMEOUT).unwrap(),
        ] {
            println!("{} -> {addr}: {answer}", from.name());
            let r = reply(&answer);
            assert_eq!(r.backend, format!("b{i}"));
            assert_eq!(*r.peer.ip(), seen);
        }
    }
}

fn names(topo: &Topology) -> Vec<String> {
    topo.namespaces().map(|ns| ns.name().to_owned()).collect()
}

fn assert_gone(names: &[String]) {
    let listed = Netns::list().unwrap();
    for name in names {
        assert!(!listed.contains(name), "{name} is still in `ip netns list`");
    }
}

/// Polls `cond` for up to 3 s: namespace teardown is asynchronous in the kernel.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn routed_topology_carries_client_traffic_to_every_backend() {
    if !require_root("routed_topology_carries_client_traffic_to_every_backend") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let _backends = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    assert_eq!(topo.node_ifaces, [NODE_CLIENT_IF, NODE_BRIDGE]);
    assert_eq!(
        topo.backend_ips,
        [10, 11, 12].map(|d| Ipv4Addr::new(10, 20, 0, d))
    );
    // Routed, not masqueraded: the backends see the client itself.
    assert_each_backend_answers(&topo, &topo.client, topo.client_ip);

    // A long-lived connection keeps its flow: same backend, same client port, every time.
    let mut session =
        TcpSession::connect(&topo.client, topo.backend_ips[1], TCP_PORT, TIMEOUT).unwrap();
    let local = session.local_addr().unwrap();
    for _ in 0..5 {
        let r = reply(&session.ask().unwrap());
        assert_eq!(r.backend, "b1");
        assert_eq!(std::net::SocketAddr::V4(r.peer), local);
    }
    let mut udp =
        UdpSession::connect(&topo.client, topo.backend_ips[2], UDP_PORT, TIMEOUT).unwrap();
    let port = udp.local_addr().unwrap().port();
    for _ in 0..3 {
        assert_eq!(reply(&udp.ask().unwrap()).peer.port(), port);
    }
}

#[test]
fn single_interface_topology_puts_everyone_on_one_segment() {
    if !require_root("single_interface_topology_puts_everyone_on_one_segment") {
        return;
    }
    let topo = Topology::single_interface(2).unwrap();
    let _backends = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    assert_eq!(topo.node_ifaces, [ENDPOINT_IF]);
    assert_eq!(topo.node.links().unwrap(), ["lo", ENDPOINT_IF]);
    assert_eq!(topo.node_ip, topo.node_backend_ip);
    assert_eq!(
        topo.backend_ips,
        [10, 11].map(|d| Ipv4Addr::new(10, 30, 0, d))
    );
    for backend in &topo.backends {
        let default = backend.ip(["route", "show", "default"]).unwrap();
        assert!(
            default.trim().is_empty(),
            "backend default route: {default}"
        );
    }
    // Same L2: client and node both reach the backends directly, as themselves.
    assert_each_backend_answers(&topo, &topo.client, topo.client_ip);
    assert_each_backend_answers(&topo, &topo.node, topo.node_ip);
    let client_route = topo.client.ip(["route", "show", "default"]).unwrap();
    assert!(
        client_route.contains(&format!("via {}", topo.node_ip)),
        "client default route: {client_route}"
    );
}

/// The DSR switch without lb: every host reaches every backend directly; the backends own the
/// VIP yet nobody answers ARP for it (that is the balancer's alias, lb's); a backend the client
/// is pointed at by MAC answers UDP and TCP to the VIP from the VIP, seeing the client; and the
/// switch counts each packet once, on the ports it really took. What the DSR tests assert
/// through lb rests on each of these.
#[test]
fn switch_topology_answers_from_the_vip_and_counts_every_hop() {
    if !require_root("switch_topology_answers_from_the_vip_and_counts_every_hop") {
        return;
    }
    let sw = Switch::new(4, true).unwrap();
    let topo = &sw.topo;
    let backends = spawn_backends(topo, TCP_PORT, UDP_PORT).unwrap();
    for ns in topo
        .namespaces()
        .filter(|ns| ns.name() != sw.switch().name())
    {
        assert_eq!(ns.links().unwrap(), ["lo", ENDPOINT_IF], "{}", ns.name());
    }
    for backend in &topo.backends {
        let lo = backend
            .ip(["-4", "-o", "addr", "show", "dev", "lo"])
            .unwrap();
        assert!(lo.contains(&format!("{VIP}/32")), "the VIP on lo: {lo}");
        let conf = |key: &str| {
            backend
                .exec([
                    "sysctl",
                    "-n",
                    &format!("net.ipv4.conf.{ENDPOINT_IF}.{key}"),
                ])
                .unwrap()
                .trim()
                .to_owned()
        };
        assert_eq!(
            [conf("arp_ignore"), conf("arp_announce"), conf("rp_filter")],
            ["1", "2", "0"]
        );
    }
    // Each backend directly, as itself (the UDP answer comes from the address asked).
    assert_each_backend_answers(topo, &topo.client, topo.client_ip);

    sw.set_balancer_peer_gro(false).unwrap();
    assert!(!sw.balancer_peer_gro().unwrap());
    sw.set_balancer_peer_gro(true).unwrap();
    assert!(sw.balancer_peer_gro().unwrap());

    // No alias on the balancer (no lb): the VIP stays unresolved, the backends keep quiet.
    let short = Duration::from_millis(500);
    let unanswered = udp_request(&topo.client, VIP, UDP_PORT, short);
    assert!(
        unanswered.is_err(),
        "nobody owns the VIP on the wire: {unanswered:?}"
    );
    let neigh = topo.client.ip(["neigh", "show", &VIP.to_string()]).unwrap();
    assert!(
        !neigh.contains("lladdr"),
        "a backend answered ARP for the VIP: {neigh}"
    );

    // The client sends VIP traffic to b2's MAC, as the balancer will.
    let b2_mac = link_mac(&topo.backends[2], ENDPOINT_IF)
        .unwrap()
        .to_string();
    topo.client
        .ip([
            "neigh",
            "replace",
            &VIP.to_string(),
            "lladdr",
            &b2_mac,
            "dev",
            ENDPOINT_IF,
            "nud",
            "permanent",
        ])
        .unwrap();
    sw.reset_counts().unwrap();
    const QUERIES: u64 = 5;
    for _ in 0..QUERIES {
        // Connected: an answer from anywhere but the VIP would never be seen.
        let answer = UdpSession::connected(&topo.client, VIP, UDP_PORT, TIMEOUT)
            .unwrap()
            .ask()
            .unwrap();
        let r = reply(&answer);
        assert_eq!(
            (r.backend.as_str(), *r.peer.ip()),
            ("b2", topo.client_ip),
            "{r}"
        );
    }
    let hops = sw.counts().unwrap();
    println!("{QUERIES} UDP queries to the VIP at b2's MAC:\n{hops}");
    let (client, b2) = (sw.client_port(), sw.backend_port(2));
    let expected = Hops(
        [
            ((topo.client_ip, VIP, client, b2.as_str()), QUERIES),
            ((VIP, topo.client_ip, b2.as_str(), client), QUERIES),
        ]
        .into_iter()
        .map(|((src, dst, i, o), n)| {
            (
                Hop {
                    src: src.into(),
                    dst: dst.into(),
                    in_port: i.to_owned(),
                    out_port: o.to_owned(),
                },
                n,
            )
        })
        .collect(),
    );
    assert_eq!(
        hops, expected,
        "each datagram counted once, on its own ports"
    );

    let r = reply(&tcp_request(&topo.client, VIP, TCP_PORT, TIMEOUT).unwrap());
    assert_eq!(
        (r.backend.as_str(), *r.peer.ip()),
        ("b2", topo.client_ip),
        "{r}"
    );
    let hops = sw.counts().unwrap();
    let replies = hops.select(|h| h.src == VIP);
    // SYN-ACK and the answer at least, one more datagram than before.
    assert!(replies.packets(|_| true) >= QUERIES + 2, "{hops}");
    assert_eq!(
        replies.packets(|h| h.in_port == b2 && h.out_port == client),
        replies.packets(|_| true),
        "{hops}"
    );
    assert_eq!(hops.packets(|h| h.touches(sw.balancer_port())), 0, "{hops}");

    // The connection's last packets (the server's FIN, the client's last ACK) may still be
    // crossing the switch after the answer was read.
    thread::sleep(Duration::from_millis(300));
    sw.reset_counts().unwrap();
    assert_eq!(sw.counts().unwrap(), Hops::default());
    let all = names(topo);
    drop(backends);
    drop(sw);
    assert_gone(&all);
}

/// Captures the first UDP datagram to `port` on `ifname` in `ns` while `send` runs and
/// returns tcpdump's verbose text of it, which says whether its checksum is complete.
fn capture_udp(ns: &Netns, ifname: &str, port: u16, send: impl FnOnce()) -> String {
    let filter = format!("udp dst port {port}");
    let mut tcpdump = Command::new("ip")
        .args(["netns", "exec", ns.name(), "timeout", "3", "tcpdump"])
        .args(["-l", "-n", "-vv", "-c", "1", "-i", ifname, &filter])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // tcpdump says "listening on" once its socket and filter are in place.
    let mut stderr = BufReader::new(tcpdump.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.contains("listening on"), "tcpdump: {line}");
    send();
    let out = tcpdump.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn tx_checksum_offload_toggle_changes_the_wire() {
    if !require_root("tx_checksum_offload_toggle_changes_the_wire") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let _backends = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let to = topo.backend_ips[0];
    // Seen where lb's programs will run: ingress of the node's client-facing veth.
    for on in [true, false, true] {
        topo.set_tx_checksum(on).unwrap();
        for ns in topo.namespaces() {
            for link in ns.links().unwrap().iter().filter(|l| *l != "lo") {
                assert_eq!(ns.tx_checksum(link).unwrap(), on, "{} {link}", ns.name());
            }
        }
        let seen = capture_udp(&topo.node, NODE_CLIENT_IF, UDP_PORT, || {
            udp_request(&topo.client, to, UDP_PORT, TIMEOUT).unwrap();
        });
        println!("tx checksum offload {on}: {}", seen.trim());
        let expected = if on { "bad udp cksum" } else { "udp sum ok" };
        assert!(
            seen.contains(expected),
            "offload {on}, expected {expected:?}: {seen}"
        );
        // Both kinds of packet make it end to end (the receiving stack accepts partial ones).
        tcp_request(&topo.client, to, TCP_PORT, TIMEOUT).unwrap();
    }
}

#[test]
fn dropping_a_topology_leaves_nothing_behind() {
    if !require_root("dropping_a_topology_leaves_nothing_behind") {
        return;
    }
    let mut topo = Topology::new(2).unwrap();
    let backends = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let mut session =
        TcpSession::connect(&topo.client, topo.backend_ips[0], TCP_PORT, TIMEOUT).unwrap();
    session.ask().unwrap();
    udp_request(&topo.client, topo.backend_ips[0], UDP_PORT, TIMEOUT).unwrap();

    // Stopping the servers returns while a connection is live, and ends that connection.
    let stopped = Instant::now();
    drop(backends);
    println!("the servers stopped in {:?}", stopped.elapsed());
    let err = session.ask().unwrap_err();
    println!("ask after the backend stopped: {err:#}");
    drop(session);

    // The node's end of a backend's veth goes only when that namespace is really destroyed,
    // i.e. when no socket or thread is left in it.
    let backend0 = topo.backends.remove(0);
    drop(backend0);
    eventually("the node loses lbb0", || {
        !topo.node.links().unwrap().contains(&"lbb0".to_owned())
    });
    assert!(topo.node.links().unwrap().contains(&"lbb1".to_owned()));

    let all = names(&topo);
    drop(topo);
    assert_gone(&all);
    // And nothing ever appeared in the root namespace.
    let root = String::from_utf8(
        Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for name in [NODE_CLIENT_IF, NODE_BRIDGE, "lbb0", "lbb1"] {
        assert!(
            !root.contains(&format!(": {name}")),
            "{name} in the root netns"
        );
    }
}

#[test]
fn a_panic_inside_a_test_still_deletes_its_namespaces() {
    if !require_root("a_panic_inside_a_test_still_deletes_its_namespaces") {
        return;
    }
    let mut created = Vec::new();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let topo = Topology::single_interface(1).unwrap();
        let _backends = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
        created = names(&topo);
        panic!("deliberate panic inside a topology (expected by this test)");
    }));
    assert!(result.is_err());
    assert_eq!(created.len(), 4, "backend, client, switch, node");
    assert_gone(&created);
}

#[test]
fn stale_cleanup_removes_namespaces_of_dead_runs_only() {
    if !require_root("stale_cleanup_removes_namespaces_of_dead_runs_only") {
        return;
    }
    // A pid that just exited stands for a crashed earlier run.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = format!("lbt-{dead}-0-stale");
    lb_tests::netns::add_netns(&stale).unwrap();
    let mine = Netns::new("live").unwrap();

    let removed = Netns::stale_cleanup().unwrap();
    println!("stale cleanup removed {removed:?}");
    let listed = Netns::list().unwrap();
    assert!(!listed.contains(&stale), "{stale} survived the cleanup");
    assert!(
        listed.contains(&mine.name().to_owned()),
        "a live run's namespace was removed"
    );
}

/// A namespace the guard cannot delete fails the test that owned it (as aya's guard does),
/// instead of a line on stderr: here its name is taken over by a directory behind the guard's
/// back, so `ip netns del` cannot remove it.
#[test]
fn a_namespace_that_cannot_be_deleted_fails_its_test() {
    if !require_root("a_namespace_that_cannot_be_deleted_fails_its_test") {
        return;
    }
    let ns = Netns::new("undeletable").unwrap();
    let path = ns.path();
    Command::new("ip")
        .args(["netns", "del", ns.name()])
        .status()
        .unwrap();
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("busy"), b"").unwrap();
    let dropped = catch_unwind(AssertUnwindSafe(move || drop(ns)));
    let _ = std::fs::remove_dir_all(&path);
    let panic = dropped.expect_err("the guard's failed cleanup fails the test");
    let message = (panic.downcast_ref::<String>().cloned())
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(message.contains("cannot delete netns"), "{message}");
}
