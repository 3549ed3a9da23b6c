//! Host ports, through `lb daemon`, on both dataplanes: a service without a VIP is its
//! published ports only (a kubelet host port, keyed by its sandbox), and conflicting ones are
//! refused naming the holder. Published ports are held: while a port is
//! published no process of the node's namespace can bind it (as kubelet's `openLocalPort` and
//! Docker's proxy make sure), clients still reach the backends through it, a port a local
//! process holds is refused before anything is saved, a removed port is free again, a
//! restarted daemon holds its ports again, and `--hold-ports off` holds none. Node-local
//! clients on the nftables dataplane: the node's address, and `127.0.0.1` with
//! `route_localnet` set and restored and kube-proxy's CVE-2020-8558 guard. Root only.
use std::{
    io,
    net::{Ipv4Addr, TcpListener, UdpSocket},
    path::Path,
    time::Duration,
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    netns::{Netns, Topology},
    require_root,
    traffic::{Reply, TIMEOUT, spawn_backend, spawn_backends, tcp_request, udp_request},
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const NET: &str = "hold";
/// Published TCP and UDP ports (to the backends' 80 and 53), and one a local process holds.
const TCP_PORT: u16 = 18080;
const UDP_PORT: u16 = 15353;
const TAKEN: u16 = 19090;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// Whether a process of `ns` could bind `proto`/`port` on every address right now.
fn free(ns: &Netns, proto: &str, port: u16) -> bool {
    let bound: io::Result<()> = ns
        .run(|| match proto {
            "tcp" => TcpListener::bind(("0.0.0.0", port)).map(drop),
            _ => UdpSocket::bind(("0.0.0.0", port)).map(drop),
        })
        .unwrap();
    match bound {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => false,
        Err(e) => panic!("binding {proto}/{port}: {e}"),
    }
}

fn service(ports: &[String], topo: &Topology) -> Vec<String> {
    let mut args = service_set(NET, "web", "1", VIP, &ports[0], &topo.backend_ips[..2]);
    for p in &ports[1..] {
        args.extend(["--port".into(), p.clone()]);
    }
    args
}

fn held_ports_on(dataplane: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
    d.ok(&network_add(&topo, NET));
    let ports = [format!("tcp/{TCP_PORT}:80"), format!("udp/{UDP_PORT}:53")];
    d.ok(&service(&ports, &topo));
    let node = &topo.node;
    assert!(!free(node, "tcp", TCP_PORT), "tcp/{TCP_PORT} is held");
    assert!(!free(node, "udp", UDP_PORT), "udp/{UDP_PORT} is held");
    // The dataplane translates before the held socket could see anything.
    let short = Duration::from_secs(3);
    for (what, answer) in [
        (
            "tcp",
            tcp_request(&topo.client, topo.node_ip, TCP_PORT, short),
        ),
        (
            "udp",
            udp_request(&topo.client, topo.node_ip, UDP_PORT, short),
        ),
    ] {
        let answer = answer.unwrap_or_else(|e| panic!("{what} to the published port: {e:#}"));
        assert!(
            answer.starts_with('b'),
            "{what}: a backend answers: {answer}"
        );
    }

    // A port a local process holds is refused, and nothing is saved.
    let holder = node
        .run(|| TcpListener::bind(("0.0.0.0", TAKEN)))
        .unwrap()
        .unwrap();
    let taken = [
        ports[0].clone(),
        ports[1].clone(),
        format!("tcp/{TAKEN}:80"),
    ];
    let r = d.cli(&service(&taken, &topo));
    assert_eq!(r.code, Some(1), "refused: {r:?}");
    assert!(
        r.stderr.contains(&format!("tcp/{TAKEN} is in use")),
        "says which port: {}",
        r.stderr
    );
    assert!(
        !d.ok(&["state"]).contains(&TAKEN.to_string()),
        "nothing saved"
    );
    drop(holder);

    // A restarted daemon holds its ports again.
    d.kill9();
    assert!(
        free(node, "tcp", TCP_PORT),
        "the dead daemon's sockets are gone"
    );
    d.restart().unwrap();
    let held = lb_tests::poll_until(Duration::from_secs(20), || !free(node, "tcp", TCP_PORT));
    assert!(held.is_some(), "held again after the restart: {}", d.log());
    assert!(!free(node, "udp", UDP_PORT));

    // A port no longer published is free again.
    d.ok(&service(&ports[..1], &topo));
    assert!(free(node, "udp", UDP_PORT), "udp/{UDP_PORT} released");
    assert!(!free(node, "tcp", TCP_PORT), "tcp/{TCP_PORT} still held");
    d.ok(&["network", "rm", NET]);
    assert!(free(node, "tcp", TCP_PORT), "released with the network");

    // --hold-ports off holds nothing.
    let mut add = network_add(&topo, NET);
    add.extend(["--hold-ports".into(), "off".into()]);
    d.ok(&add);
    d.ok(&service(&ports, &topo));
    assert!(free(node, "tcp", TCP_PORT) && free(node, "udp", UDP_PORT));
    let answer = tcp_request(&topo.client, topo.node_ip, TCP_PORT, TIMEOUT).unwrap();
    assert!(answer.starts_with('b'), "still published: {answer}");
}

#[test]
fn published_ports_are_held_on_ebpf() {
    if require_root("published_ports_are_held_on_ebpf") {
        held_ports_on("ebpf");
    }
}

#[test]
fn published_ports_are_held_on_nftables() {
    if require_root("published_ports_are_held_on_nftables") {
        held_ports_on("nftables");
    }
}

/// A kubelet-style host port: a service keyed by its sandbox with no VIP and one backend.
/// It answers on the node's address, `lb elements` shows its port and no VIP, and a second
/// sandbox asking for the same port is refused, naming the first.
fn host_port_on(dataplane: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
    d.ok(&network_add(&topo, NET));
    let sandbox = |id: &str, backend: Ipv4Addr| -> Vec<String> {
        [
            "service",
            "set",
            NET,
            id,
            "--port",
            &format!("tcp/{TCP_PORT}:80"),
        ]
        .map(String::from)
        .into_iter()
        .chain(["--backend".into(), backend.to_string()])
        .collect()
    };
    d.ok(&sandbox("sandbox-1", topo.backend_ips[1]));
    let answer = tcp_request(&topo.client, topo.node_ip, TCP_PORT, TIMEOUT).unwrap();
    assert!(
        answer.starts_with("b1 "),
        "the sandbox's container answers: {answer}"
    );
    let elements = d.elements(NET);
    assert_eq!(
        elements,
        format!(
            "nat-publish-port tcp . {TCP_PORT} . 0-65535 : {} . 80\n",
            topo.backend_ips[1]
        ),
        "a port and no VIP"
    );
    assert!(!d.ok(&["state"]).contains("\"vip\""), "no VIP in the state");
    let r = d.cli(&sandbox("sandbox-2", topo.backend_ips[0]));
    assert_eq!(r.code, Some(1), "refused: {r:?}");
    assert!(
        r.stderr.contains("sandbox-1"),
        "names the sandbox holding it: {}",
        r.stderr
    );
}

#[test]
fn a_service_without_a_vip_is_a_host_port_on_ebpf() {
    if require_root("a_service_without_a_vip_is_a_host_port_on_ebpf") {
        host_port_on("ebpf");
    }
}

#[test]
fn a_service_without_a_vip_is_a_host_port_on_nftables() {
    if require_root("a_service_without_a_vip_is_a_host_port_on_nftables") {
        host_port_on("nftables");
    }
}

/// `route_localnet` of `iface` in `ns`.
fn route_localnet(ns: &Netns, iface: &str) -> bool {
    let path = format!("/proc/sys/net/ipv4/conf/{iface}/route_localnet");
    let v = ns.run(|| std::fs::read_to_string(&path)).unwrap().unwrap();
    v.trim() == "1"
}

/// Processes of the network's namespace reach a published port on `127.0.0.1` through the
/// nftables dataplane, over TCP and UDP, as portmap's `snat: true` serves them: the backend
/// sees the node's address (masqueraded, a 127.0.0.1 source could not be answered), and a
/// port bound to another `host_ip` does not answer there. lb turns `route_localnet` on for
/// the network's interfaces where it was off, keeps knowing it across a daemon restart, and
/// turns it off again when the network goes or no longer publishes a port on 127.0.0.1,
/// leaving the one the operator had on alone.
#[test]
fn localhost_reaches_a_published_port_on_nftables() {
    if !require_root("localhost_reaches_a_published_port_on_nftables") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let node = &topo.node;
    let (client_if, bridge) = (&topo.node_ifaces[0], &topo.node_ifaces[1]);
    // The operator's: on for the client side before lb runs; the bridge's is off.
    node.sysctl(&format!("net.ipv4.conf.{client_if}.route_localnet"), "1")
        .unwrap();
    assert!(!route_localnet(node, bridge), "off before lb");
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, NET));
    const BOUND: u16 = 18081;
    let ports = [
        format!("tcp/{TCP_PORT}:80"),
        format!("udp/{UDP_PORT}:53"),
        format!("tcp/{BOUND}:80@{}", topo.node_ip),
    ];
    d.ok(&service(&ports, &topo));
    assert!(route_localnet(node, bridge), "lb turned it on");
    assert!(route_localnet(node, client_if));

    let localhost = Ipv4Addr::LOCALHOST;
    for (what, answer) in [
        ("tcp", tcp_request(node, localhost, TCP_PORT, TIMEOUT)),
        ("udp", udp_request(node, localhost, UDP_PORT, TIMEOUT)),
    ] {
        let answer = answer.unwrap_or_else(|e| panic!("{what} to 127.0.0.1: {e:#}"));
        let reply: Reply = answer.parse().unwrap();
        assert!(reply.backend.starts_with('b'), "{what}: {answer}");
        assert_eq!(
            *reply.peer.ip(),
            topo.node_backend_ip,
            "{what}: the backend sees the node's address: {answer}"
        );
    }
    // The host-bound port answers on its address, and not on 127.0.0.1.
    let bound = tcp_request(node, topo.node_ip, BOUND, TIMEOUT).unwrap();
    assert!(bound.starts_with('b'), "on its host_ip: {bound}");
    let short = Duration::from_secs(2);
    let r = tcp_request(node, localhost, BOUND, short);
    assert!(r.is_err(), "a host_ip-bound port on 127.0.0.1: {r:?}");

    // The record survives a restart: the restarted daemon's first sync (a whole table) keeps
    // it, and the removal turns the bridge's off.
    d.kill9();
    d.restart().unwrap();
    let applied = lb_tests::poll_until(Duration::from_secs(20), || {
        d.network_status(NET)["applied"] == true
    });
    assert!(applied.is_some(), "applied again: {}", d.log());
    let answer = tcp_request(node, localhost, TCP_PORT, TIMEOUT).unwrap();
    assert!(answer.starts_with('b'), "after the restart: {answer}");
    // Only the host-bound port left: nothing answers on 127.0.0.1, so it is off again; and on
    // when a port on every address is back.
    d.ok(&service(&ports[2..], &topo));
    assert!(!route_localnet(node, bridge), "no port on 127.0.0.1, off");
    assert!(route_localnet(node, client_if), "the operator's stays on");
    d.ok(&service(&ports, &topo));
    assert!(route_localnet(node, bridge), "on again");
    d.ok(&["network", "rm", NET]);
    assert!(!route_localnet(node, bridge), "lb turned it off again");
    assert!(route_localnet(node, client_if), "the operator's stays on");
}

/// kube-proxy's CVE-2020-8558 guard: with `route_localnet` on, a host on the network's link
/// could reach a service listening on the node's loopback; the guard drops packets to (and
/// from) 127/8 arriving by the network's interfaces. The client routes 127/8 to the node
/// (its own loopback addresses removed) and accepts answers from 127.0.0.1 (its own
/// `route_localnet`); the same packets reach the node's service once the guard is flushed by
/// hand, which shows the guard is what stops them.
#[test]
fn a_host_on_the_link_cannot_reach_the_node_loopback_on_nftables() {
    if !require_root("a_host_on_the_link_cannot_reach_the_node_loopback_on_nftables") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    // A service of the node's own, on its loopback (and every other address).
    const LOCAL_TCP: u16 = 18443;
    const LOCAL_UDP: u16 = 15443;
    let _local = spawn_backend(&topo.node, "node", LOCAL_TCP, LOCAL_UDP).unwrap();
    let client = &topo.client;
    client.ip(["addr", "flush", "dev", "lo"]).unwrap();
    let via = topo.node_ip.to_string();
    client
        .ip(["route", "add", "127.0.0.0/8", "via", &via])
        .unwrap();
    client
        .sysctl("net.ipv4.conf.eth0.route_localnet", "1")
        .unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, NET));
    d.ok(&service(&[format!("tcp/{TCP_PORT}:80")], &topo));
    let client_if = &topo.node_ifaces[0];
    assert!(route_localnet(&topo.node, client_if), "lb turned it on");

    let localhost = Ipv4Addr::LOCALHOST;
    let short = Duration::from_secs(2);
    let tcp = tcp_request(client, localhost, LOCAL_TCP, short);
    assert!(tcp.is_err(), "tcp from the link to 127.0.0.1: {tcp:?}");
    let udp = udp_request(client, localhost, LOCAL_UDP, short);
    assert!(udp.is_err(), "udp from the link to 127.0.0.1: {udp:?}");

    use lb_user::dataplane::nft::{ruleset::GUARD_CHAIN, table_name};
    (topo.node)
        .exec(["nft", "flush", "chain", "ip", &table_name(NET), GUARD_CHAIN])
        .unwrap();
    for (what, answer) in [
        ("tcp", tcp_request(client, localhost, LOCAL_TCP, TIMEOUT)),
        ("udp", udp_request(client, localhost, LOCAL_UDP, TIMEOUT)),
    ] {
        let answer = answer.unwrap_or_else(|e| panic!("{what} without the guard: {e:#}"));
        assert!(answer.starts_with("node "), "{what}: {answer}");
    }
}
