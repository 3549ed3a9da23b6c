//! The NAT dataplane carrying real traffic: client → node → 4 backends behind a bridge, the
//! programs attached to the node's interfaces by the same library call `lb load` makes.
//! Root only.
use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use lb_tests::{
    bpffs::Bpffs,
    bpftool,
    netns::{NODE_BRIDGE, Topology},
    plane::{Plane, apply},
    require_root,
    traffic::{
        Reply, TIMEOUT, TcpSession, assert_uniform_over_4, spawn_backends, tcp_request, udp_request,
    },
};
use lb_user::{
    core::model::{Attach, Backend, Masquerade, Mode, Network, PortConfig, Proto, Service},
    dataplane::{Dataplane as _, NftDataplane},
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 8081;
const PUBLISHED: u16 = 18080;

fn network(topo: &Topology, name: &str, attach: Attach, backends: &[Backend]) -> Network {
    Network {
        name: name.into(),
        interfaces: topo.node_ifaces.clone(),
        netns: Some(topo.node.name().into()),
        mode: Mode::Nat,
        attach,
        masquerade: Masquerade::Never,
        fast_path: Default::default(),
        hold_ports: Default::default(),
        timeouts: Default::default(),
        services: vec![Service {
            id: "web".into(),
            generation: "1".into(),
            vips: vec![VIP.into()],
            backends: backends.to_vec(),
            ports: vec![PortConfig {
                proto: Proto::Tcp,
                published: PUBLISHED,
                target: Some(TCP_PORT),
                host_ip: None,
            }],
        }],
    }
}

fn all(topo: &Topology) -> Vec<Backend> {
    topo.backend_ips
        .iter()
        .map(|ip| Backend {
            ip: (*ip).into(),
            disabled: false,
        })
        .collect()
}

fn ask_tcp(topo: &Topology, addr: Ipv4Addr, port: u16) -> Reply {
    tcp_request(&topo.client, addr, port, TIMEOUT)
        .unwrap_or_else(|e| panic!("tcp {addr}:{port}: {e:#}"))
        .parse()
        .unwrap()
}

/// VIP over TCP and UDP, and the published port with its target rewrite, each reaching every
/// backend, each backend seeing the client's own address, replies coming back from the
/// address the client spoke to (a reply from the wrong source is reported, not accepted).
fn vip_and_published_port(plane: Plane, offload: bool, name: &str) {
    let topo = Topology::new(4).unwrap();
    topo.set_tx_checksum(offload).unwrap();
    let _servers = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let net = network(&topo, name, plane.attach(), &all(&topo));
    apply(plane, &net, &bpffs, None);

    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..60 {
        let r = ask_tcp(&topo, VIP, TCP_PORT);
        assert_eq!(
            *r.peer.ip(),
            topo.client_ip,
            "backend must see the real client"
        );
        *seen.entry(r.backend).or_default() += 1;
    }
    assert_eq!(
        seen.len(),
        4,
        "60 connections over 4 backends reach all of them: {seen:?}"
    );

    for _ in 0..10 {
        let udp: Reply = udp_request(&topo.client, VIP, UDP_PORT, TIMEOUT)
            .expect("udp via VIP")
            .parse()
            .unwrap();
        assert_eq!(*udp.peer.ip(), topo.client_ip);
    }

    let r = ask_tcp(&topo, topo.node_ip, PUBLISHED);
    assert_eq!(*r.peer.ip(), topo.client_ip);
    // The published port answers on the node's own addresses only.
    assert!(
        tcp_request(
            &topo.client,
            Ipv4Addr::new(10, 10, 0, 99),
            PUBLISHED,
            Duration::from_millis(300)
        )
        .is_err()
    );

    if plane == Plane::Nft {
        let ct = topo.node.exec(["conntrack", "-L"]).unwrap();
        assert!(
            ct.contains(&format!("src={} dst={VIP}", topo.client_ip)),
            "the kernel's conntrack holds the client's flows:\n{ct}"
        );
    } else {
        // As an operator reads the conntrack entries: `bpftool map dump pinned …/lb_flows`.
        let flows = bpftool::map_dump(&bpffs.path().join(name).join("lb_flows")).unwrap();
        assert!(
            (flows.iter()).any(|e| bpftool::addr(&e.key["saddr"]) == topo.client_ip),
            "bpftool shows the client's flows: {flows:?}"
        );
    }
    println!(
        "{name}: offload {offload}: VIP spread {seen:?}; published port answered by {}",
        r.backend
    );
}

#[test]
fn tc_vip_and_published_port_with_offload() {
    if require_root("tc_vip_and_published_port_with_offload") {
        vip_and_published_port(Plane::Tc, true, "tcon");
    }
}

#[test]
fn tc_vip_and_published_port_without_offload() {
    if require_root("tc_vip_and_published_port_without_offload") {
        vip_and_published_port(Plane::Tc, false, "tcoff");
    }
}

#[test]
fn xdp_vip_and_published_port_with_offload() {
    if require_root("xdp_vip_and_published_port_with_offload") {
        vip_and_published_port(Plane::Xdp, true, "xdpon");
    }
}

#[test]
fn xdp_vip_and_published_port_without_offload() {
    if require_root("xdp_vip_and_published_port_without_offload") {
        vip_and_published_port(Plane::Xdp, false, "xdpoff");
    }
}

/// 4000 new connections over 4 backends: the counts fit a uniform distribution
/// ([`assert_uniform_over_4`]).
fn chi_square(plane: Plane, name: &str) {
    let topo = Topology::new(4).unwrap();
    let _servers = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    apply(
        plane,
        &network(&topo, name, plane.attach(), &all(&topo)),
        &bpffs,
        None,
    );
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    const N: usize = 4000;
    for _ in 0..N {
        *counts
            .entry(ask_tcp(&topo, VIP, TCP_PORT).backend)
            .or_default() += 1;
    }
    assert_uniform_over_4(&counts, name);
}

#[test]
fn tc_4000_connections_spread_uniformly() {
    if require_root("tc_4000_connections_spread_uniformly") {
        chi_square(Plane::Tc, "chitc");
    }
}

#[test]
fn xdp_4000_connections_spread_uniformly() {
    if require_root("xdp_4000_connections_spread_uniformly") {
        chi_square(Plane::Xdp, "chixdp");
    }
}

/// moby's LB sandbox: one interface, backends that do not route via the node. Only with
/// masquerade `always` do their replies come back through lb; the backend sees the node.
fn single_interface_masquerade_always(plane: Plane, name: &str) {
    let topo = Topology::single_interface(4).unwrap();
    let _servers = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut net = network(&topo, name, plane.attach(), &all(&topo));
    net.masquerade = Masquerade::Always;
    apply(plane, &net, &bpffs, None);
    let mut seen = BTreeMap::<String, usize>::new();
    for _ in 0..40 {
        let r = ask_tcp(&topo, VIP, TCP_PORT);
        assert_eq!(
            *r.peer.ip(),
            topo.node_ip,
            "masqueraded to the node's address"
        );
        *seen.entry(r.backend).or_default() += 1;
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
    let udp: Reply = udp_request(&topo.client, VIP, UDP_PORT, TIMEOUT)
        .expect("udp")
        .parse()
        .unwrap();
    assert_eq!(*udp.peer.ip(), topo.node_ip);
}

#[test]
fn tc_single_interface_sandbox_with_masquerade_always() {
    if require_root("tc_single_interface_sandbox_with_masquerade_always") {
        single_interface_masquerade_always(Plane::Tc, "sbtc");
    }
}

#[test]
fn xdp_single_interface_sandbox_with_masquerade_always() {
    if require_root("xdp_single_interface_sandbox_with_masquerade_always") {
        single_interface_masquerade_always(Plane::Xdp, "sbxdp");
    }
}

/// A backend reaching its own VIP or published port (masquerade `auto`): the flow leaves by the interface it
/// came in on, so it is masqueraded, and the answer comes back from the VIP, also when the
/// backend is balanced to itself.
///
/// On nftables, with br_netfilter on, that last case needs hairpin mode on the backend's
/// bridge port (the kernel bridges a frame DNATed to the same bridge; see
/// `hairpin_warnings_here` in lb-user's nft.rs): the dataplane must say so while it is off and
/// stop saying so once it is on, as a runtime sets it. br_netfilter is turned on in the test's
/// own node namespace when the module is loaded, so the warning is exercised; without the
/// module the frame is routed and no warning is due.
fn hairpin(plane: Plane, name: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut net = network(&topo, name, plane.attach(), &all(&topo));
    net.masquerade = Masquerade::Auto;
    apply(plane, &net, &bpffs, None);
    if plane == Plane::Nft {
        let br_netfilter = topo
            .node
            .sysctl("net.bridge.bridge-nf-call-iptables", "1")
            .is_ok();
        let warnings = NftDataplane::default().warnings(&net).expect("warnings");
        if br_netfilter {
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            let ports = format!(
                "bridge {NODE_BRIDGE}: hairpin mode is off on port(s) {}, {} ",
                Topology::bridge_port(0),
                Topology::bridge_port(1)
            );
            assert!(warnings[0].starts_with(&ports), "{warnings:?}");
        } else {
            eprintln!("br_netfilter is not loaded: the nft hairpin case is routed, no warning due");
            assert_eq!(warnings, Vec::<String>::new());
        }
        topo.set_hairpin(true).unwrap();
        assert_eq!(
            NftDataplane::default().warnings(&net).expect("warnings"),
            Vec::<String>::new(),
            "hairpin on everywhere"
        );
    }
    // Its own VIP, and its own published port on the node's address on its link.
    for (addr, port) in [(VIP, TCP_PORT), (topo.node_backend_ip, PUBLISHED)] {
        let mut seen = BTreeMap::<String, usize>::new();
        for _ in 0..30 {
            let r: Reply = tcp_request(&topo.backends[0], addr, port, TIMEOUT)
                .unwrap_or_else(|e| panic!("backend 0 reaches {addr}:{port}: {e:#}"))
                .parse()
                .unwrap();
            assert_eq!(*r.peer.ip(), topo.node_backend_ip, "hairpin is masqueraded");
            *seen.entry(r.backend).or_default() += 1;
        }
        assert!(
            seen.contains_key("b0") && seen.contains_key("b1"),
            "b0 reached itself and its peer through {addr}:{port}: {seen:?}"
        );
    }
}

#[test]
fn tc_hairpin_from_a_backend_to_its_own_service() {
    if require_root("tc_hairpin_from_a_backend_to_its_own_service") {
        hairpin(Plane::Tc, "hptc");
    }
}

#[test]
fn xdp_hairpin_from_a_backend_to_its_own_service() {
    if require_root("xdp_hairpin_from_a_backend_to_its_own_service") {
        hairpin(Plane::Xdp, "hpxdp");
    }
}

/// Graceful drain: a connection keeps its backend after that backend is disabled, while new
/// connections avoid it.
fn drain(plane: Plane, name: &str) {
    let topo = Topology::new(4).unwrap();
    let _servers = spawn_backends(&topo, TCP_PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut net = network(&topo, name, plane.attach(), &all(&topo));
    apply(plane, &net, &bpffs, None);

    let mut long = TcpSession::connect(&topo.client, VIP, TCP_PORT, TIMEOUT).unwrap();
    let first: Reply = long.ask().unwrap().parse().unwrap();
    // spawn_backends names backend i "b{i}".
    let drained = first.backend.clone();
    let drained_ip = topo.backend_ips[drained.trim_start_matches('b').parse::<usize>().unwrap()];
    let before = net.clone();
    for b in &mut net.services[0].backends {
        b.disabled = b.ip == drained_ip;
    }
    apply(plane, &net, &bpffs, Some(&before));

    for _ in 0..5 {
        let again: Reply = long
            .ask()
            .expect("the long-lived connection still works")
            .parse()
            .unwrap();
        assert_eq!(again.backend, drained);
    }
    for _ in 0..30 {
        let r = ask_tcp(&topo, VIP, TCP_PORT);
        assert_ne!(
            r.backend, drained,
            "a new connection reached the disabled backend"
        );
    }
}

#[test]
fn tc_disabled_backend_keeps_its_connection_and_gets_no_new_ones() {
    if require_root("tc_disabled_backend_keeps_its_connection_and_gets_no_new_ones") {
        drain(Plane::Tc, "draintc");
    }
}

#[test]
fn xdp_disabled_backend_keeps_its_connection_and_gets_no_new_ones() {
    if require_root("xdp_disabled_backend_keeps_its_connection_and_gets_no_new_ones") {
        drain(Plane::Xdp, "drainxdp");
    }
}

#[test]
fn nft_vip_and_published_port_with_offload() {
    if require_root("nft_vip_and_published_port_with_offload") {
        vip_and_published_port(Plane::Nft, true, "vpnft1");
    }
}

#[test]
fn nft_vip_and_published_port_without_offload() {
    if require_root("nft_vip_and_published_port_without_offload") {
        vip_and_published_port(Plane::Nft, false, "vpnft0");
    }
}

#[test]
fn nft_4000_connections_spread_uniformly() {
    if require_root("nft_4000_connections_spread_uniformly") {
        chi_square(Plane::Nft, "chinft");
    }
}

#[test]
fn nft_single_interface_sandbox_with_masquerade_always() {
    if require_root("nft_single_interface_sandbox_with_masquerade_always") {
        single_interface_masquerade_always(Plane::Nft, "sbnft");
    }
}

#[test]
fn nft_hairpin_from_a_backend_to_its_own_service() {
    if require_root("nft_hairpin_from_a_backend_to_its_own_service") {
        hairpin(Plane::Nft, "hpnft");
    }
}

#[test]
fn nft_disabled_backend_keeps_its_connection_and_gets_no_new_ones() {
    if require_root("nft_disabled_backend_keeps_its_connection_and_gets_no_new_ones") {
        drain(Plane::Nft, "drainnft");
    }
}
