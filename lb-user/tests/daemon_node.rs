//! `lb daemon` against a live node: networks fail and succeed on their own, validation sees the
//! node's addresses, and the daemon follows addresses, interfaces and namespaces that come and
//! go. The real binaries, in netns topologies. Root only.
use std::{net::Ipv4Addr, path::Path};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    netns::Topology,
    require_root,
    traffic::{TIMEOUT, spawn_backends, tcp_request},
};
use lb_user::core::model::DesiredState;
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const PUBLISHED: u16 = 18080;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn status(d: &LbDaemon) -> Value {
    serde_json::from_str(&d.ok(&["status", "--json"])).expect("lb status --json is JSON")
}

/// The status of network `name` in `lb status --json`.
fn network_status(d: &LbDaemon, name: &str) -> Value {
    let s = status(d);
    (s["networks"].as_array().expect("networks"))
        .iter()
        .find(|n| n["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("network {name} missing from {s}"))
}

/// A daemon on dataplane `dp` serving network `web` over `topo`: service `api` generation 1
/// with [`VIP`] and port [`PUBLISHED`] → [`PORT`] on every backend of the topology.
fn serving(topo: &Topology, bpffs: &Bpffs, dp: &str) -> LbDaemon {
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dp]).unwrap();
    d.ok(&network_add(topo, "web"));
    d.ok(&service_set(
        "web",
        "api",
        "1",
        VIP,
        &published(),
        &topo.backend_ips,
    ));
    d
}

/// `tcp/PUBLISHED:PORT`.
fn published() -> String {
    format!("tcp/{PUBLISHED}:{PORT}")
}

#[test]
fn a_failing_network_does_not_fail_a_change_to_another() {
    if !require_root("a_failing_network_does_not_fail_a_change_to_another") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    d.ok(&network_add(&topo, "good"));
    let port = format!("tcp/{PUBLISHED}:{PORT}");
    d.ok(&service_set(
        "good",
        "api",
        "1",
        VIP,
        &port,
        &topo.backend_ips[..1],
    ));
    // A second network whose namespace is gone while the daemon is down: saved, failing.
    let mut state = DesiredState::from_json(&d.ok(&["state"])).unwrap();
    d.stop();
    let mut broken = state.networks[0].clone();
    broken.name = "broken".into();
    broken.netns = Some(format!("lbt-gone-{}", std::process::id()));
    broken.services.clear();
    state.networks.push(broken);
    d.restart_with_state(&state.to_json()).unwrap();
    let b = network_status(&d, "broken");
    assert_eq!(b["applied"], false, "{b}");
    assert!(
        b["error"].as_str().unwrap_or("").contains("namespace"),
        "the failing network says why: {b}"
    );

    // A change to the healthy network is applied and acknowledged as such.
    let run = d.cli(&service_set(
        "good",
        "api",
        "1",
        VIP,
        &port,
        &topo.backend_ips,
    ));
    assert!(
        run.ok(),
        "a change to a healthy network succeeds while another fails: {}{}",
        run.stdout,
        run.stderr
    );
    let g = network_status(&d, "good");
    assert_eq!(g["applied"], true, "{g}");
    assert_eq!(g["backends"], 2, "{g}");
    assert_eq!(network_status(&d, "broken")["applied"], false);
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).expect("the healthy network's VIP answers");

    // A change to the failing network itself is refused, and says why.
    let run = d.cli(&service_set(
        "broken",
        "web",
        "1",
        VIP,
        &port,
        &topo.backend_ips,
    ));
    assert!(
        !run.ok() && run.stderr.contains("namespace"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    println!(
        "a failing network: its own status says {}; a change to another network applied",
        b["error"]
    );
}

#[test]
fn a_vip_or_host_ip_that_contradicts_the_node_is_refused_and_nothing_is_saved() {
    if !require_root("a_vip_or_host_ip_that_contradicts_the_node_is_refused_and_nothing_is_saved") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = serving(&topo, &bpffs, "ebpf");
    let port = published();
    let state = || d.ok(&["state"]);
    let before = state();
    let node_if = &topo.node_ifaces[0];
    // The client-facing subnet is 10.10.0.0/24, with the node at .1. The VIP cases publish a
    // port of their own, so that only the VIP is wrong.
    let other = format!("tcp/{}:{PORT}", PUBLISHED + 2);
    let cases = [
        (
            topo.node_ip.to_string(),
            other.clone(),
            format!(
                "VIP {} is an address of the node ({}/24 on {node_if} in netns {})",
                topo.node_ip,
                topo.node_ip,
                topo.node.name()
            ),
        ),
        (
            "10.10.0.0".into(),
            other.clone(),
            "VIP 10.10.0.0 is the network address of the node's subnet 10.10.0.1/24".into(),
        ),
        (
            "10.10.0.255".into(),
            other.clone(),
            "VIP 10.10.0.255 is the broadcast address of the node's subnet".into(),
        ),
        (
            "10.99.0.20".into(),
            format!("tcp/{}:{PORT}@192.0.2.7", PUBLISHED + 1),
            "host_ip 192.0.2.7 is not an address of the node".into(),
        ),
    ];
    for (vip, port, want) in cases {
        let run = d.cli(&service_set(
            "web",
            "other",
            "1",
            vip.parse().unwrap(),
            &port,
            &topo.backend_ips,
        ));
        assert!(
            !run.ok() && run.stderr.contains(&want),
            "VIP {vip} port {port}: want a refusal saying {want:?}, got {}{}",
            run.stdout,
            run.stderr
        );
        assert_eq!(state(), before, "a refused change saved nothing");
    }
    // A host_ip that is an address of the node is accepted, and so is lb's own VIP alias
    // set again (the alias is lb's: it carries lb's address protocol).
    // iproute2 6.1 does not show an address's protocol: read it over netlink.
    let alias = topo
        .node
        .run(|| {
            let addrs = lb_user::node::Netlink::new().unwrap().addresses().unwrap();
            addrs.into_iter().find(|a| a.addr == VIP)
        })
        .unwrap()
        .expect("the VIP alias is on the node");
    assert_eq!(
        (alias.prefix, alias.proto),
        (32, Some(lb_user::node::ALIAS_PROTO)),
        "lb's alias carries its address protocol: {alias:?}"
    );
    d.ok(&service_set(
        "web",
        "other",
        "1",
        "10.99.0.20".parse().unwrap(),
        &format!("tcp/{}:{PORT}@{}", PUBLISHED + 1, topo.node_ip),
        &topo.backend_ips,
    ));
    d.ok(&service_set(
        "web",
        "api",
        "2",
        VIP,
        &port,
        &topo.backend_ips,
    ));
    println!("VIPs on node addresses and foreign host_ips refused; lb's alias: {alias:?}");
}

/// Polls `f` every 50 ms for up to `bound` (a correctness bound, not a measurement); returns
/// how long it took, or `None`.
fn wait_for(
    bound: std::time::Duration,
    mut f: impl FnMut() -> bool,
) -> Option<std::time::Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < bound {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

#[test]
fn an_address_added_to_the_node_later_serves_a_published_port() {
    if !require_root("an_address_added_to_the_node_later_serves_a_published_port") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = serving(&topo, &bpffs, "ebpf");
    tcp_request(&topo.client, topo.node_ip, PUBLISHED, TIMEOUT)
        .expect("the published port answers on the node's address");
    // A second address on the client-facing link, added after the service: nothing tells lb
    // but the node itself.
    let later: Ipv4Addr = "10.10.0.77".parse().unwrap();
    topo.node
        .ip([
            "addr",
            "add",
            &format!("{later}/24"),
            "dev",
            &topo.node_ifaces[0],
        ])
        .unwrap();
    let short = std::time::Duration::from_millis(300);
    let took = wait_for(std::time::Duration::from_secs(10), || {
        tcp_request(&topo.client, later, PUBLISHED, short).is_ok()
    });
    let took = took.unwrap_or_else(|| {
        panic!(
            "the published port never answered on {later}, added later\n{}",
            d.log()
        )
    });
    println!("a published port answered on an address added later after {took:?}");
    // And when the address goes, lb_local_addrs follows (the port is no longer the node's).
    topo.node
        .ip([
            "addr",
            "del",
            &format!("{later}/24"),
            "dev",
            &topo.node_ifaces[0],
        ])
        .unwrap();
    let local_addrs = bpffs.path().join("web").join("lb_local_addrs");
    let has = |a: Ipv4Addr| local_addrs_of(&local_addrs).contains(&a);
    assert!(has(topo.node_ip), "the node's address is in lb_local_addrs");
    assert!(
        wait_for(std::time::Duration::from_secs(10), || !has(later)).is_some(),
        "{later} stays in lb_local_addrs after it left the node: {:?}",
        local_addrs_of(&local_addrs)
    );
    tcp_request(&topo.client, topo.node_ip, PUBLISHED, TIMEOUT)
        .expect("the node's first address still serves the port");
}

/// The addresses in a network's pinned `lb_local_addrs` (keys in network byte order).
fn local_addrs_of(pin: &Path) -> Vec<Ipv4Addr> {
    let map =
        aya::maps::MapData::from_pin(pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    let map: aya::maps::HashMap<_, u32, u32> =
        aya::maps::HashMap::try_from(aya::maps::Map::HashMap(map)).unwrap();
    map.keys()
        .map(|k| Ipv4Addr::from(k.unwrap().to_ne_bytes()))
        .collect()
}

#[test]
fn an_interface_deleted_and_recreated_is_served_again() {
    if !require_root("an_interface_deleted_and_recreated_is_served_again") {
        return;
    }
    recreated_interface("ebpf");
}

#[test]
fn nftables_an_interface_deleted_and_recreated_is_served_again() {
    if !require_root("nftables_an_interface_deleted_and_recreated_is_served_again") {
        return;
    }
    recreated_interface("nftables");
}

fn recreated_interface(dp: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = serving(&topo, &bpffs, dp);
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).expect("the VIP answers");
    tcp_request(&topo.client, topo.node_ip, PUBLISHED, TIMEOUT).expect("the port answers");

    // The client-facing interface goes away, with the VIP alias and the programs on it, and
    // comes back under the same name: only the node's link events tell lb.
    topo.recreate_client_link().unwrap();
    let short = std::time::Duration::from_millis(300);
    // The alias matters where the client resolves the VIP on the link (moby's sandbox); in
    // this routed topology nftables would DNAT without it, so it is checked by itself.
    let alias = || {
        (topo.node)
            .ip(["-4", "-o", "addr", "show", "dev", &topo.node_ifaces[0]])
            .unwrap_or_default()
            .contains(&format!("{VIP}/32"))
    };
    let took = wait_for(std::time::Duration::from_secs(10), || {
        alias()
            && tcp_request(&topo.client, VIP, PORT, short).is_ok()
            && tcp_request(&topo.client, topo.node_ip, PUBLISHED, short).is_ok()
    })
    .unwrap_or_else(|| {
        panic!(
            "the VIP alias never came back, or the VIP or the published port never answered again, after the interface came back\n{}",
            d.log()
        )
    });
    let n = network_status(&d, "web");
    assert_eq!(n["applied"], true, "{n}");
    // Nothing else answers the VIP or the port (no listener on the node): it is lb, and on
    // eBPF its programs are attached to the recreated interface again.
    if dp == "ebpf" {
        let attached = attached_programs(&topo, &topo.node_ifaces[0]);
        assert!(
            attached.iter().any(|p| p == "lb_tc_ingress"),
            "lb's programs are attached to the recreated interface: {attached:?}"
        );
    }
    println!("{dp}: an interface deleted and recreated was served again after {took:?}");
}

/// The names of the TCX ingress programs on `ifname` in the topology's node.
fn attached_programs(topo: &Topology, ifname: &str) -> Vec<String> {
    let ifname = ifname.to_owned();
    topo.node
        .run(move || {
            use aya::programs::{SchedClassifier, TcAttachType};
            let (_, progs) = SchedClassifier::query_tcx(&ifname, TcAttachType::Ingress)
                .expect("querying TCX ingress");
            (progs.iter())
                .filter_map(|p| p.name_as_str().map(str::to_owned))
                .collect()
        })
        .unwrap()
}

#[test]
fn a_namespace_that_goes_away_fails_its_network_until_it_is_back() {
    if !require_root("a_namespace_that_goes_away_fails_its_network_until_it_is_back") {
        return;
    }
    // A namespace of its own with one veth pair inside: no traffic is needed to see the
    // network applied (programs attached), failed, and applied again.
    let ns = lb_tests::netns::Netns::new("sandbox").unwrap();
    let link = |ns: &lb_tests::netns::Netns| {
        ns.ip([
            "link", "add", "lbv0", "type", "veth", "peer", "name", "lbv1",
        ])
        .unwrap();
        ns.ip(["addr", "add", "10.50.0.1/24", "dev", "lbv0"])
            .unwrap();
        ns.ip(["link", "set", "lbv0", "up"]).unwrap();
        ns.ip(["link", "set", "lbv1", "up"]).unwrap();
    };
    link(&ns);
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    d.ok(&[
        "network",
        "add",
        "sb",
        "--netns",
        ns.name(),
        "--interface",
        "lbv0",
    ]);
    let backend: Ipv4Addr = "10.50.0.2".parse().unwrap();
    d.ok(&service_set(
        "sb",
        "api",
        "1",
        VIP,
        &format!("tcp/{PUBLISHED}:{PORT}"),
        &[backend],
    ));
    let attached = || {
        ns.run(|| {
            use aya::programs::{SchedClassifier, TcAttachType};
            SchedClassifier::query_tcx("lbv0", TcAttachType::Ingress)
                .map(|(_, p)| p.iter().any(|p| p.name_as_str() == Some("lb_tc_ingress")))
                .unwrap_or(false)
        })
        .unwrap_or(false)
    };
    assert!(attached());
    let bound = std::time::Duration::from_secs(20);

    ns.remove().unwrap();
    let failed = wait_for(bound, || {
        let n = network_status(&d, "sb");
        n["applied"] == false && n["error"].as_str().unwrap_or("").contains("namespace")
    });
    assert!(
        failed.is_some(),
        "the network is not marked failed after its namespace went away: {}",
        network_status(&d, "sb")
    );
    let error = network_status(&d, "sb")["error"].clone();

    ns.restore().unwrap();
    link(&ns);
    let back = wait_for(bound, || {
        network_status(&d, "sb")["applied"] == true && attached()
    });
    assert!(
        back.is_some(),
        "the network did not recover when its namespace came back: {}\n{}",
        network_status(&d, "sb"),
        d.log()
    );
    println!(
        "namespace gone: failed after {:?} with {error}; back: applied again after {:?}",
        failed.unwrap(),
        back.unwrap()
    );
}

#[test]
fn an_interface_that_appears_later_is_picked_up() {
    if !require_root("an_interface_that_appears_later_is_picked_up") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    // The second interface does not exist yet (the bridge a CNI plugin creates with the first
    // pod); a typo in the first one is still refused.
    let add = |first: &str| {
        d.cli(&[
            "network",
            "add",
            "web",
            "--netns",
            topo.node.name(),
            "--interface",
            first,
            "--interface",
            "lbnew0",
        ])
    };
    let typo = add("lbc9");
    assert!(
        !typo.ok() && typo.stderr.contains("interface lbc9 does not exist"),
        "{}",
        typo.stderr
    );
    let run = add(&topo.node_ifaces[0]);
    assert!(run.ok(), "{}", run.stderr);
    d.ok(&service_set(
        "web",
        "api",
        "1",
        VIP,
        &published(),
        &topo.backend_ips,
    ));
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).expect("served on the interface that exists");
    let warned = |n: &Value| {
        (n["warnings"].as_array().into_iter().flatten())
            .any(|w| w.as_str().unwrap_or("").contains("lbnew0 does not exist"))
    };
    let n = network_status(&d, "web");
    assert!(n["applied"] == true && warned(&n), "{n}");

    topo.node
        .ip([
            "link", "add", "lbnew0", "type", "veth", "peer", "name", "lbnew1",
        ])
        .unwrap();
    topo.node.ip(["link", "set", "lbnew0", "up"]).unwrap();
    let took = wait_for(std::time::Duration::from_secs(10), || {
        attached_programs(&topo, "lbnew0")
            .iter()
            .any(|p| p == "lb_tc_ingress")
    })
    .unwrap_or_else(|| panic!("lbnew0 never got lb's programs\n{}", d.log()));
    let n = network_status(&d, "web");
    assert!(n["applied"] == true && !warned(&n), "{n}");
    println!("an interface that appeared later had lb's programs after {took:?}");
}
