//! The real-traffic tools of `lb_tests::tools` on the plain routed topology, without lb: the
//! node only routes 10.10.0.0/24 <-> 10.20.0.0/24 and the client reaches each backend at its
//! own address. Each test proves a helper drives real traffic and reports what happened to it,
//! so that the lb tests built on them can trust their numbers. Root only.
use std::collections::BTreeSet;
use std::fs;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use lb_tests::netns::{ENDPOINT_IF, NODE_CLIENT_IF, Netns, Topology};
use lb_tests::require_root;
use lb_tests::tools::{
    IperfServer, Nginx, SrcPorts, UdpSink, UdpSpec, WrkOptions, iperf_client, link_mac, link_stats,
    snmp, tcp_accepts, tcp_listening, trafgen_udp, wait_tcp_port, wrk,
};
use lb_tests::traffic::{Reply, TIMEOUT, http_get};

const HTTP_PORT: u16 = 80;
const UDP_PORT: u16 = 9999;
const IPERF_PORT: u16 = 5001;
/// trafgen's burst: far more than a default socket buffer holds, a few ms of sending.
const PACKETS: u64 = 3000;
const TRAFGEN_PORT: u16 = 40000;

/// One datagram from a kernel socket in `from` to `to:port`; its source port.
/// The source port of [`send_datagram`]: outside every trafgen range of these tests, so a
/// burst's ports are never confused with it (an ephemeral port could be one of them).
const WARM_UP_PORT: u16 = 39999;

/// Sends one datagram from [`WARM_UP_PORT`]; returns that port.
fn send_datagram(from: &Netns, to: Ipv4Addr, port: u16) -> u16 {
    from.run(|| {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, WARM_UP_PORT)).unwrap();
        sock.send_to(b"hello\n", (to, port)).unwrap();
        sock.local_addr().unwrap().port()
    })
    .unwrap()
}

#[test]
fn nginx_answers_as_its_backend_and_sees_the_client() {
    if !require_root("nginx_answers_as_its_backend_and_sees_the_client") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let servers: Vec<Nginx> = (topo.backends.iter().enumerate())
        .map(|(i, ns)| Nginx::start(ns, &format!("b{i}"), HTTP_PORT).unwrap())
        .collect();
    for (i, &addr) in topo.backend_ips.iter().enumerate() {
        let body = http_get(&topo.client, addr, HTTP_PORT, TIMEOUT).unwrap();
        println!("GET http://{addr}:{HTTP_PORT}/ -> {body}");
        let reply: Reply = body.parse().unwrap();
        assert_eq!(reply.backend, format!("b{i}"), "answered by: {body}");
        assert_eq!(*reply.peer.ip(), topo.client_ip, "client seen as: {body}");
    }

    // Dropping one stops that nginx and removes its files; the other keeps serving.
    let mut servers = servers.into_iter();
    let first = servers.next().unwrap();
    let (pid, dir) = (first.pid(), first.dir().to_owned());
    assert!(
        dir.join("nginx.pid").exists(),
        "nginx writes its pid file in its prefix"
    );
    drop(first);
    assert!(!dir.exists(), "{} left behind", dir.display());
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()),
        "nginx {pid} still runs"
    );
    let (addr0, addr1) = (topo.backend_ips[0], topo.backend_ips[1]);
    assert!(
        !tcp_accepts(&topo.client, addr0, HTTP_PORT).unwrap(),
        "b0 still accepts"
    );
    http_get(&topo.client, addr1, HTTP_PORT, TIMEOUT).unwrap();
}

#[test]
fn wrk_storms_nginx_with_close_and_keeps_connections_alive_without() {
    if !require_root("wrk_storms_nginx_with_close_and_keeps_connections_alive_without") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let _nginx = Nginx::start(&topo.backends[0], "b0", HTTP_PORT).unwrap();
    let url = format!("http://{}:{HTTP_PORT}/", topo.backend_ips[0]);
    let connections = 16;

    // Connection: close: one connection per request, which the client's ActiveOpens show.
    let before = snmp(&topo.client).unwrap();
    let opts = WrkOptions {
        duration: Duration::from_secs(2),
        connections,
        close: true,
        ..WrkOptions::default()
    };
    let storm = wrk(&topo.client, &url, &opts).unwrap();
    let tcp = snmp(&topo.client).unwrap().since(&before);
    println!(
        "wrk close: {storm:?}, {:.0} req/s, {} connections opened",
        storm.requests_per_sec(),
        tcp.tcp_active_opens
    );
    assert!(storm.requests >= 2000, "{storm:?}");
    assert_eq!(storm.errors(), 0, "{storm:?}");
    assert!(tcp.tcp_active_opens >= storm.requests, "{tcp:?} {storm:?}");
    assert_eq!(tcp.tcp_attempt_fails, 0, "{tcp:?}");

    // Keep-alive: the same `connections` (and wrk's own connect check) carry every request.
    let before = snmp(&topo.client).unwrap();
    let opts = WrkOptions {
        duration: Duration::from_secs(1),
        close: false,
        ..opts
    };
    let kept = wrk(&topo.client, &url, &opts).unwrap();
    let tcp = snmp(&topo.client).unwrap().since(&before);
    println!(
        "wrk keep-alive: {kept:?}, {:.0} req/s, {} connections opened",
        kept.requests_per_sec(),
        tcp.tcp_active_opens
    );
    assert!(kept.requests >= 2000, "{kept:?}");
    assert_eq!(kept.errors(), 0, "{kept:?}");
    assert!(
        tcp.tcp_active_opens <= u64::from(connections) + 1,
        "keep-alive opened {} connections for {} requests",
        tcp.tcp_active_opens,
        kept.requests
    );
}

/// Sends [`PACKETS`] UDP datagrams with trafgen from the client, through the node, to a
/// [`UdpSink`] on the backend, and checks that every one arrived with good checksums: the
/// backend's kernel delivered all of them (`Udp InDatagrams`) and found no bad checksum
/// (`InCsumErrors`, which it counts instead of delivering). Returns the source ports seen.
fn trafgen_to_backend(src_ports: SrcPorts, cpu: Option<usize>) -> BTreeSet<u16> {
    let topo = Topology::new(1).unwrap();
    let (backend, to) = (&topo.backends[0], topo.backend_ips[0]);
    let sink = UdpSink::bind(backend, UDP_PORT).unwrap();
    // The node knows the backend's MAC before the burst, so that no packet of it depends on
    // how fast ARP answers (packets waiting for it queue in a few hundred kB only).
    let warm_up = send_datagram(&topo.client, to, UDP_PORT);
    assert_eq!(sink.wait_for(1, TIMEOUT).datagrams, 1, "warm-up datagram");

    let spec = UdpSpec {
        src_ports,
        cpu,
        ..UdpSpec::new(
            ENDPOINT_IF,
            link_mac(&topo.client, ENDPOINT_IF).unwrap(),
            link_mac(&topo.node, NODE_CLIENT_IF).unwrap(),
            topo.client_ip,
            TRAFGEN_PORT,
            to,
            UDP_PORT,
            PACKETS,
        )
    };
    let (udp_before, node_before) = (snmp(backend).unwrap(), snmp(&topo.node).unwrap());
    let link_before = link_stats(&topo.node, NODE_CLIENT_IF).unwrap();
    let started = Instant::now();
    trafgen_udp(&topo.client, &spec).unwrap();
    let sent_in = started.elapsed();
    let received = sink.wait_for(PACKETS + 1, TIMEOUT);
    let udp = snmp(backend).unwrap().since(&udp_before);
    let forwarded = snmp(&topo.node)
        .unwrap()
        .since(&node_before)
        .ip_forw_datagrams;
    let link = link_stats(&topo.node, NODE_CLIENT_IF)
        .unwrap()
        .since(&link_before);
    println!(
        "trafgen {src_ports:?} cpu {cpu:?}: {PACKETS} sent in {sent_in:?}; node {} rx, {forwarded} \
         forwarded; backend {udp:?}; sink {} datagrams from {} sources",
        link.rx_packets,
        received.datagrams - 1,
        received.sources.len() - 1,
    );
    assert!(
        link.rx_packets >= PACKETS,
        "node {NODE_CLIENT_IF}: {link:?}"
    );
    assert_eq!(forwarded, PACKETS, "forwarded by the node");
    assert_eq!(udp.udp_in_csum_errors, 0, "bad checksums: {udp:?}");
    assert_eq!(udp.udp_in_errors, 0, "{udp:?}");
    assert_eq!(udp.udp_in_datagrams, PACKETS, "delivered: {udp:?}");
    assert_eq!(received.datagrams, PACKETS + 1, "read by the sink");
    let mut ports = BTreeSet::new();
    for (from, n) in &received.sources {
        assert_eq!(*from.ip(), topo.client_ip, "{from} sent {n}");
        if from.port() != warm_up {
            ports.insert(from.port());
        }
    }
    ports
}

#[test]
fn trafgen_udp_from_one_port_all_delivered_with_good_checksums() {
    if !require_root("trafgen_udp_from_one_port_all_delivered_with_good_checksums") {
        return;
    }
    let ports = trafgen_to_backend(SrcPorts::Fixed(TRAFGEN_PORT), None);
    assert_eq!(ports, BTreeSet::from([TRAFGEN_PORT]));
}

#[test]
fn trafgen_udp_in_64_flows_from_a_chosen_cpu_all_delivered() {
    if !require_root("trafgen_udp_in_64_flows_from_a_chosen_cpu_all_delivered") {
        return;
    }
    let flows = 64;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ports = trafgen_to_backend(
        SrcPorts::Flows {
            first: TRAFGEN_PORT,
            count: flows,
        },
        Some(cpus - 1),
    );
    let expected: BTreeSet<u16> = (TRAFGEN_PORT..TRAFGEN_PORT + flows).collect();
    assert_eq!(ports, expected, "source ports of the {flows} flows");
}

#[test]
fn iperf_measures_client_to_backend_throughput() {
    if !require_root("iperf_measures_client_to_backend_throughput") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let to = topo.backend_ips[0];
    let server = IperfServer::start(&topo.backends[0], IPERF_PORT).unwrap();
    let bps = iperf_client(&topo.client, to, IPERF_PORT, 2, Some(0)).unwrap();
    println!("iperf client -> {to}: {:.2} Gbit/s", bps / 1e9);
    assert!(bps > 0.0, "{bps} bit/s");

    // No server: iperf 2 exits 0 without a report, which is an error, not 0 bit/s.
    drop(server);
    assert!(!tcp_listening(&topo.backends[0], IPERF_PORT).unwrap());
    let err = iperf_client(&topo.client, to, IPERF_PORT, 1, None).unwrap_err();
    println!("iperf without a server: {err:#}");
}

#[test]
fn counters_and_ports_are_read_in_the_namespace_asked_about() {
    if !require_root("counters_and_ports_are_read_in_the_namespace_asked_about") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let (backend, to) = (&topo.backends[0], topo.backend_ips[0]);

    // A datagram to a port nobody binds: NoPorts and a port unreachable on the backend, the
    // unreachable arriving at the client, and nothing of it counted in the other namespaces.
    let (backend_before, client_before) = (snmp(backend).unwrap(), snmp(&topo.client).unwrap());
    let node_before = snmp(&topo.node).unwrap();
    let link_before = link_stats(backend, ENDPOINT_IF).unwrap();
    send_datagram(&topo.client, to, UDP_PORT);
    let deadline = Instant::now() + TIMEOUT;
    let client = loop {
        let client = snmp(&topo.client).unwrap().since(&client_before);
        if client.icmp_in_dest_unreachs > 0 || Instant::now() > deadline {
            break client;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let b = snmp(backend).unwrap().since(&backend_before);
    let node = snmp(&topo.node).unwrap().since(&node_before);
    let link = link_stats(backend, ENDPOINT_IF)
        .unwrap()
        .since(&link_before);
    println!("backend {b:?}\nclient {client:?}\nnode {node:?}\nbackend eth0 {link:?}");
    assert_eq!((b.udp_no_ports, b.icmp_out_dest_unreachs), (1, 1), "{b:?}");
    assert_eq!(b.udp_in_datagrams, 0, "{b:?}");
    assert_eq!(client.icmp_in_dest_unreachs, 1, "{client:?}");
    assert_eq!(
        (client.udp_no_ports, client.udp_out_datagrams),
        (0, 1),
        "{client:?}"
    );
    assert_eq!(
        node.ip_forw_datagrams, 2,
        "the datagram and its ICMP error: {node:?}"
    );
    assert_eq!(node.udp_no_ports, 0, "{node:?}");
    assert!(link.rx_packets >= 1 && link.tx_packets >= 1, "{link:?}");

    // Ports: listening is seen in the backend only, and waiting for one ends either way.
    assert!(!tcp_listening(backend, HTTP_PORT).unwrap());
    let err = wait_tcp_port(&topo.client, to, HTTP_PORT, Duration::from_millis(300)).unwrap_err();
    println!("waiting for a closed port: {err:#}");
    let _listener = backend
        .run(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, HTTP_PORT)))
        .unwrap()
        .unwrap();
    assert!(tcp_listening(backend, HTTP_PORT).unwrap());
    assert!(!tcp_listening(&topo.client, HTTP_PORT).unwrap());
    wait_tcp_port(&topo.client, to, HTTP_PORT, TIMEOUT).unwrap();
}
