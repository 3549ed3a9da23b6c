//! Node-local clients: processes of the network's namespace (the node itself) reach its VIPs,
//! its published ports on the node's addresses and on `127.0.0.1`, over TCP and UDP, on the
//! nftables dataplane (its output chain) and on the eBPF dataplane through the socket
//! programs on the cgroup2 root (`lb-ebpf` `sock`), where what their sockets are told of the
//! peer is the service. A process of another namespace,
//! under the same cgroup, is untouched. The socket programs' links outlive the daemon like
//! its TC hooks (node-local clients are served while it is down), a restarted daemon leaves
//! them alone, and they go with the network. Root only.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
};

use lb_tests::{
    bpffs::Bpffs,
    bpftool,
    daemon::{LbDaemon, datapath, free_metrics_addr, network_add, scrape, service_set},
    netns::Topology,
    require_root,
    traffic::{
        Reply, TIMEOUT, UdpSession, spawn_backend, spawn_backends, tcp_request, udp_request,
    },
};
use lb_user::dataplane::ebpf::PROG_SOCK;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const NET: &str = "socklb";
/// Published TCP and UDP ports (to the backends' 80 and 53).
const TCP_PORT: u16 = 18081;
const UDP_PORT: u16 = 15354;
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn service(topo: &Topology) -> Vec<String> {
    let mut args = service_set(
        NET,
        "web",
        "1",
        VIP,
        &format!("tcp/{TCP_PORT}:80"),
        &topo.backend_ips[..2],
    );
    args.extend(["--port".into(), format!("udp/{UDP_PORT}:53")]);
    args
}

/// The backend that answered `answer`, checking that it saw the node's own address (no
/// masquerade: the socket itself was sent to it).
fn backend_of(what: &str, answer: anyhow::Result<String>, node: &[Ipv4Addr]) -> String {
    let answer = answer.unwrap_or_else(|e| panic!("{what} from the node: {e:#}"));
    let reply: Reply = answer.parse().unwrap();
    assert!(
        reply.backend.starts_with('b'),
        "{what}: a backend answers: {answer}"
    );
    assert!(
        node.contains(reply.peer.ip()),
        "{what}: the backend sees one of the node's addresses {node:?}: {answer}"
    );
    reply.backend
}

/// Every way a process of the node reaches the service: a VIP and a published port on the
/// node's address and on 127.0.0.1, each over TCP and UDP (an unconnected UDP socket, which
/// checks that the answer's source is the address asked), and the backend that answered.
/// The backend sees one of the node's addresses or one of `sources`.
fn node_requests(topo: &Topology, sources: &[Ipv4Addr]) -> Vec<(String, String)> {
    let node = &topo.node;
    let addrs = [&[topo.node_ip, topo.node_backend_ip][..], sources].concat();
    [
        ("tcp VIP", tcp_request(node, VIP, 80, TIMEOUT)),
        ("udp VIP", udp_request(node, VIP, 53, TIMEOUT)),
        (
            "tcp port",
            tcp_request(node, topo.node_ip, TCP_PORT, TIMEOUT),
        ),
        (
            "udp port",
            udp_request(node, topo.node_ip, UDP_PORT, TIMEOUT),
        ),
        (
            "tcp 127.0.0.1",
            tcp_request(node, LOCALHOST, TCP_PORT, TIMEOUT),
        ),
        (
            "udp 127.0.0.1",
            udp_request(node, LOCALHOST, UDP_PORT, TIMEOUT),
        ),
    ]
    .into_iter()
    .map(|(what, answer)| (what.to_owned(), backend_of(what, answer, &addrs)))
    .collect()
}

/// The same asks through the nftables dataplane (its output chain, and for 127.0.0.1
/// `route_localnet` and masquerade, as portmap's `snat: true`): the kernel's answer, which the
/// socket programs match.
#[test]
fn node_local_clients_reach_vips_and_published_ports_on_nftables() {
    if !require_root("node_local_clients_reach_vips_and_published_ports_on_nftables") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    d.ok(&network_add(&topo, NET));
    d.ok(&service(&topo));
    // The VIP is a local address (its alias), and a socket sending to a local address
    // takes that address as its source, chosen before the output chain translates; the
    // backend sees the VIP (masquerade `auto` leaves it, and the answer comes back by the
    // node, which owns it).
    node_requests(&topo, &[VIP]);
}

#[test]
fn node_local_clients_reach_vips_and_published_ports_on_ebpf() {
    if !require_root("node_local_clients_reach_vips_and_published_ports_on_ebpf") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let metrics = free_metrics_addr().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--metrics", &metrics]).unwrap();
    d.ok(&network_add(&topo, NET));
    d.ok(&service(&topo));
    let node = &topo.node;

    node_requests(&topo, &[]);

    // The socket is told the service is its peer: getpeername of a TCP connection to the
    // VIP, and a connected UDP socket, which the kernel lets receive only from its peer (an
    // answer shown from the backend would be dropped, and the ask would time out).
    let stream = node
        .run(|| TcpStream::connect_timeout(&SocketAddr::from((VIP, 80)), TIMEOUT))
        .unwrap()
        .unwrap();
    assert_eq!(
        stream.peer_addr().unwrap(),
        SocketAddr::from((VIP, 80)),
        "getpeername shows the VIP"
    );
    drop(stream);
    let mut connected = UdpSession::connected(node, LOCALHOST, UDP_PORT, TIMEOUT).unwrap();
    let first = connected.ask().unwrap();
    for _ in 0..3 {
        let again = connected.ask().unwrap();
        assert_eq!(
            again.split(' ').next(),
            first.split(' ').next(),
            "one socket stays with one backend"
        );
    }

    // Sockets are spread over the backends by their cookies.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..40 {
        let answer = tcp_request(node, VIP, 80, TIMEOUT);
        *seen
            .entry(backend_of(
                "tcp VIP",
                answer,
                &[topo.node_ip, topo.node_backend_ip],
            ))
            .or_default() += 1;
    }
    assert_eq!(
        seen.len(),
        2,
        "40 connections reach both backends: {seen:?}"
    );

    let text = scrape(&metrics).unwrap();
    let translated = datapath(&text, NET, "sock", "sock_translated");
    let reversed = datapath(&text, NET, "sock", "sock_reversed");
    println!("sock_translated {translated}, sock_reversed {reversed}");
    assert!(
        translated >= 50,
        "every connect and send counted: {translated}"
    );
    assert!(
        reversed >= 4,
        "the UDP answers and getpeername counted: {reversed}"
    );

    // Another namespace, below the same cgroup: its own VIP address and its own 127.0.0.1
    // are its own business. (A program that acted there would send these to the backends,
    // which the client reaches through the node.)
    let client = &topo.client;
    client
        .exec(["ip", "addr", "add", &format!("{VIP}/32"), "dev", "lo"])
        .unwrap();
    let _own = spawn_backend(client, "own", 80, 53).unwrap();
    let _own_port = spawn_backend(client, "ownport", TCP_PORT, UDP_PORT).unwrap();
    for (what, answer) in [
        ("tcp VIP", tcp_request(client, VIP, 80, TIMEOUT)),
        ("udp VIP", udp_request(client, VIP, 53, TIMEOUT)),
        (
            "tcp 127.0.0.1",
            tcp_request(client, LOCALHOST, TCP_PORT, TIMEOUT),
        ),
        (
            "udp 127.0.0.1",
            udp_request(client, LOCALHOST, UDP_PORT, TIMEOUT),
        ),
    ] {
        let answer = answer.unwrap_or_else(|e| panic!("{what} in another namespace: {e:#}"));
        assert!(
            answer.starts_with("own"),
            "{what} in another namespace reaches its own server: {answer}"
        );
    }
}

/// The pins of the network's socket links.
fn link_pins(bpffs: &Path) -> Vec<PathBuf> {
    PROG_SOCK
        .iter()
        .map(|p| bpffs.join(NET).join(format!("link_cgroup_{p}")))
        .collect()
}

/// The ids of the programs the network's socket links run.
fn linked_programs(bpffs: &Path) -> Vec<u64> {
    (link_pins(bpffs).iter())
        .map(|pin| {
            let link = bpftool::json(&["link", "show", "pinned", pin.to_str().unwrap()]).unwrap();
            link["prog_id"]
                .as_u64()
                .unwrap_or_else(|| panic!("no prog_id in {link}"))
        })
        .collect()
}

/// The programs the node's cgroup links run, each as often as a link runs it. (This
/// machine's bpftool 7.1 lists nothing under `cgroup show`; the links are what lb attaches.)
fn cgroup_programs() -> Vec<u64> {
    let links = bpftool::json(&["link", "show"]).unwrap();
    (links.as_array().unwrap().iter())
        .filter(|l| l["type"] == "cgroup")
        .map(|l| l["prog_id"].as_u64().unwrap())
        .collect()
}

#[test]
fn socket_programs_outlive_the_daemon_and_go_with_the_network() {
    if !require_root("socket_programs_outlive_the_daemon_and_go_with_the_network") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    d.ok(&network_add(&topo, NET));
    d.ok(&service(&topo));
    node_requests(&topo, &[]);
    let ids = linked_programs(bpffs.path());
    let attached = |ids: &[u64]| {
        let on = cgroup_programs();
        ids.iter()
            .map(|id| on.iter().filter(|p| *p == id).count())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        attached(&ids),
        [1; PROG_SOCK.len()],
        "each program attached once"
    );

    // Killed: the links stay, and the node's processes are still served.
    d.kill9();
    node_requests(&topo, &[]);
    // Restarted: the same programs are found running and left alone (not stacked).
    d.restart().unwrap();
    d.ok(&["service", "list", NET]);
    node_requests(&topo, &[]);
    assert_eq!(linked_programs(bpffs.path()), ids, "left alone");
    assert_eq!(attached(&ids), [1; PROG_SOCK.len()], "nothing stacked");

    // Gone with the network: detached, and 127.0.0.1 is the node's own again (nothing
    // listens there, so the connection is refused).
    d.ok(&["network", "rm", NET]);
    assert!(
        link_pins(bpffs.path()).iter().all(|p| !p.exists()),
        "pins removed"
    );
    let on = cgroup_programs();
    let left: BTreeSet<_> = ids.iter().filter(|id| on.contains(id)).collect();
    assert!(
        left.is_empty(),
        "detached from the cgroup: {left:?} still attached"
    );
    let refused = tcp_request(&topo.node, LOCALHOST, TCP_PORT, TIMEOUT);
    assert!(
        refused.is_err(),
        "127.0.0.1:{TCP_PORT} is no service now: {refused:?}"
    );
}
