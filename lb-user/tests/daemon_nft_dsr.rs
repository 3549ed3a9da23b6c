//! DSR on the nftables dataplane through the real daemon and CLI, on moby's LB sandbox
//! topology (client, node and backends on one switch; the backends own the VIP on `lo` and
//! answer the client directly): the netdev table forwards VIP frames by MAC without NAT,
//! learns sessions that `lb conntrack` lists with their backend, keeps them across a backend
//! being disabled, a daemon restart and a timeout change, ends one at its TCP RST, lets an
//! idle UDP one expire; and where the kernel cannot run the table, serves the VIP by NAT and
//! says so. Root only.
use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, free_metrics_addr, scrape},
    netns::{ENDPOINT_IF, Netns, Topology},
    require_root,
    tools::link_mac,
    traffic::{Reply, TIMEOUT, TcpSession, spawn_backends, tcp_request},
};
use lb_user::{
    api::ConntrackEntry,
    core::elements::{NAT_SERVICE_VIP, REAL_SERVER},
    dataplane::{
        Flow, FlowState,
        nft::{Listed, listed_elements, listed_real_server, table_name},
    },
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const UDP_PORT: u16 = 8081;
const PUBLISHED: u16 = 18080;
const NET: &str = "dsr";

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// The single-interface topology with backends set up for DSR as DESIGN.md says: each owns
/// the VIP on `lo` and answers no ARP for it on `eth0`.
fn dsr_topology(backends: usize) -> Topology {
    let topo = Topology::single_interface(backends).unwrap();
    for b in &topo.backends {
        b.ip(["addr", "add", &format!("{VIP}/32"), "dev", "lo"])
            .unwrap();
        b.sysctl("net.ipv4.conf.all.arp_ignore", "1").unwrap();
        b.sysctl("net.ipv4.conf.all.arp_announce", "2").unwrap();
    }
    topo
}

fn add_dsr_network(d: &LbDaemon, topo: &Topology) {
    d.ok(&[
        "network",
        "add",
        NET,
        "--netns",
        topo.node.name(),
        "--interface",
        ENDPOINT_IF,
        "--mode",
        "dsr",
    ]);
}

/// The service: the VIP, and a published port (served by NAT on a dsr network, as moby).
fn set_service(d: &LbDaemon, backends: &[String]) {
    let mut args: Vec<String> = ["service", "set", NET, "web", "--vip", &VIP.to_string()]
        .map(String::from)
        .into();
    args.extend(["--port".into(), format!("tcp/{PUBLISHED}:{PORT}")]);
    for b in backends {
        args.extend(["--backend".into(), b.clone()]);
    }
    d.ok(&args);
}

/// The DSR sessions `lb conntrack` lists for the network.
fn sessions(d: &LbDaemon) -> Vec<Flow> {
    let out = d.ok(&["conntrack", NET, "--json"]);
    let entries: Vec<ConntrackEntry> = serde_json::from_str(&out).unwrap();
    (entries.into_iter())
        .map(|e| e.flow)
        .filter(|f| f.state == FlowState::Dsr)
        .collect()
}

/// The session of client address `client`, if listed.
fn session_of(d: &LbDaemon, proto: &str, client: SocketAddrV4) -> Option<Flow> {
    (sessions(d).into_iter())
        .find(|f| f.proto.as_str() == proto && f.client == std::net::SocketAddr::from(client))
}

/// The kernel's `real-server` elements, with counters (IPv4 ones: the network has no IPv6
/// backends to number).
fn real_server(topo: &Topology) -> Vec<Listed> {
    let json = (topo.node)
        .exec(["nft", "-j", "list", "table", "netdev", &table_name(NET)])
        .unwrap();
    listed_real_server(&json, &[]).unwrap()
}

/// Packets the VIP's NAT elements translated.
fn nat_vip_packets(topo: &Topology) -> u64 {
    let json = (topo.node)
        .exec(["nft", "-j", "list", "table", "ip", &table_name(NET)])
        .unwrap();
    (listed_elements(&json).unwrap().iter())
        .filter(|l| l.element.map == NAT_SERVICE_VIP)
        .map(|l| l.packets)
        .sum()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Asks the VIP once over a new connection; the answer.
fn ask_vip(topo: &Topology) -> Reply {
    tcp_request(&topo.client, VIP, PORT, TIMEOUT)
        .unwrap()
        .parse()
        .unwrap()
}

/// `lb apply` of the state with the network's session timeout set to `secs`.
fn set_dsr_timeout(d: &LbDaemon, secs: u32) {
    let mut state: Value = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    state["networks"][0]["timeouts"]["dsr"] = secs.into();
    let file = d.state_dir().join("dsr-timeout.json");
    std::fs::write(&file, state.to_string()).unwrap();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
}

/// A connection from the client that can end in a RST (`SO_LINGER` 0 on close).
struct Resettable {
    stream: TcpStream,
}

impl Resettable {
    fn connect(ns: &Netns) -> Resettable {
        let stream = ns
            .run(|| TcpStream::connect_timeout(&(VIP, PORT).into(), TIMEOUT))
            .unwrap()
            .unwrap();
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        Resettable { stream }
    }

    fn ask(&mut self) -> Reply {
        self.stream.write_all(b"hello\n").unwrap();
        let mut line = String::new();
        BufReader::new(&self.stream).read_line(&mut line).unwrap();
        line.parse().unwrap()
    }

    fn local(&self) -> SocketAddrV4 {
        match self.stream.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            a => panic!("not IPv4: {a}"),
        }
    }

    /// Closes with a RST.
    fn reset(self) {
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt on a socket we own, with a correctly sized `linger`.
        let rc = unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    }
}

/// Polls `done` until it holds or `limit` passes; whether it held.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nftables_dsr_forwards_by_mac_and_keeps_sessions_until_rst_or_idle() {
    if !require_root("nftables_dsr_forwards_by_mac_and_keeps_sessions_until_rst_or_idle") {
        return;
    }
    let topo = dsr_topology(2);
    let _servers = spawn_backends(&topo, PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let metrics = free_metrics_addr().unwrap();
    let mut d = LbDaemon::start(
        lb(),
        bpffs.path(),
        &["--dataplane", "nftables", "--metrics", &metrics],
    )
    .unwrap();
    add_dsr_network(&d, &topo);
    let ips: Vec<String> = topo.backend_ips.iter().map(|b| b.to_string()).collect();
    set_service(&d, &ips);
    let status = d.ok(&["status"]);
    assert!(!status.contains("warning"), "{status}");

    // The kernel's real-server map holds exactly what `lb elements` prints for it.
    let elements = d.elements(NET);
    let want: Vec<String> = (elements.lines())
        .filter(|l| l.starts_with(REAL_SERVER))
        .map(str::to_owned)
        .collect();
    assert_eq!(want.len(), 2, "{elements}");
    let have: Vec<String> = (real_server(&topo).iter())
        .map(|l| l.element.to_string())
        .collect();
    assert_eq!(sorted(have), sorted(want));

    // New connections: every backend answers and sees the client itself (no NAT), each
    // connection is one new session placed by a real-server element, none by NAT.
    let n = 20;
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let r = ask_vip(&topo);
        assert_eq!(*r.peer.ip(), topo.client_ip, "DSR keeps the client address");
        seen.insert(r.backend);
    }
    assert_eq!(seen.len(), 2, "both backends answer: {seen:?}");
    let placed: u64 = real_server(&topo).iter().map(|l| l.packets).sum();
    assert_eq!(placed, n, "one real-server lookup per new connection");
    assert_eq!(nat_vip_packets(&topo), 0, "the VIP took no NAT path");
    // The metrics count them per service and backend, from the real-server elements.
    let text = scrape(&metrics).unwrap();
    let counted = |backend: &str| -> u64 {
        let series = format!(
            "lb_packets_total{{network=\"{NET}\",service=\"web\",frontend=\"{VIP}\",backend=\"{backend}\"}} "
        );
        (text.lines())
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(counted(""), n, "{text}");
    for l in real_server(&topo) {
        assert_eq!(counted(&l.element.value), l.packets, "{text}");
    }
    // The published port of the dsr network is served by NAT.
    let r: Reply = tcp_request(&topo.client, topo.node_ip, PUBLISHED, TIMEOUT)
        .unwrap()
        .parse()
        .unwrap();
    println!("published port answered by {r} (NAT)");

    // A long-lived connection: its session holds the MAC of the backend that answers it,
    // and `lb conntrack` names that backend.
    let mut long = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    let first: Reply = long.ask().unwrap().parse().unwrap();
    let i: usize = first.backend[1..].parse().unwrap();
    let client = match long.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        a => panic!("{a}"),
    };
    let s = session_of(&d, "tcp", client).expect("the long connection's session");
    assert_eq!(
        s.backend.to_string(),
        format!("{}:{PORT}", topo.backend_ips[i]),
        "{s:?}"
    );
    assert_eq!(s.frontend.to_string(), format!("{VIP}:{PORT}"));
    let (expires, idle) = (s.expires_secs.unwrap(), s.idle_secs.unwrap());
    assert!(expires <= 60 && expires + idle == 60, "{s:?}");
    let mac = link_mac(&topo.backends[i], ENDPOINT_IF)
        .unwrap()
        .to_string();
    let map = (topo.node)
        .exec([
            "nft",
            "list",
            "map",
            "netdev",
            &table_name(NET),
            "dsr-conntrack-tcp",
        ])
        .unwrap();
    let line = (map.lines())
        .find(|l| l.contains(&format!("{} . {} . ", client.ip(), client.port())))
        .unwrap_or_else(|| panic!("no session of {client}: {map}"));
    assert!(
        line.contains(&mac),
        "the session holds b{i}'s MAC {mac}: {line}"
    );
    println!("lb conntrack: {s:?}\nsession map: {}", line.trim());

    // Disabled, its backend keeps the session; new connections go to the other one. The
    // change is a difference: the sessions are not touched.
    let mut with_disabled = ips.clone();
    with_disabled[i] = format!("{},disabled", ips[i]);
    set_service(&d, &with_disabled);
    assert_eq!(
        long.ask().unwrap().parse::<Reply>().unwrap().backend,
        first.backend
    );
    for _ in 0..10 {
        assert_ne!(ask_vip(&topo).backend, first.backend, "a disabled backend");
    }
    assert!(!d.log().contains("declaring it whole"), "{}", d.log());

    // A restarted daemon keeps the sessions (its first sync is a difference from
    // applied.json).
    d.kill9();
    d.restart().unwrap();
    assert_eq!(
        long.ask().unwrap().parse::<Reply>().unwrap().backend,
        first.backend
    );
    assert!(session_of(&d, "tcp", client).is_some());

    // So does a whole declaration: the NAT table deleted by hand fails the next difference
    // (a new session timeout), and the sync declares both tables whole.
    (topo.node)
        .exec(["nft", "delete", "table", "ip", &table_name(NET)])
        .unwrap();
    set_dsr_timeout(&d, 30);
    assert!(d.log().contains("declaring it whole"), "{}", d.log());
    assert_eq!(
        long.ask().unwrap().parse::<Reply>().unwrap().backend,
        first.backend
    );
    assert_eq!(nat_vip_packets(&topo), 0, "the VIP took no NAT path");

    // A RST ends its session at once (a packet-path delete); the others stay.
    let mut r = Resettable::connect(&topo.client);
    r.ask();
    let reset_client = r.local();
    assert!(session_of(&d, "tcp", reset_client).is_some());
    r.reset();
    assert!(
        within(Duration::from_secs(1), || session_of(
            &d,
            "tcp",
            reset_client
        )
        .is_none()),
        "the RST did not end the session: {:?}",
        session_of(&d, "tcp", reset_client)
    );
    assert!(session_of(&d, "tcp", client).is_some());

    // A short session timeout, by a difference: the sessions stay, and an idle UDP session
    // expires.
    let wholes = d.log().matches("declaring it whole").count();
    set_dsr_timeout(&d, 2);
    assert_eq!(
        d.log().matches("declaring it whole").count(),
        wholes,
        "{}",
        d.log()
    );
    assert_eq!(
        long.ask().unwrap().parse::<Reply>().unwrap().backend,
        first.backend
    );
    let udp = topo
        .client
        .run(|| UdpSocket::bind((topo.client_ip, 0)))
        .unwrap()
        .unwrap();
    udp.connect((VIP, UDP_PORT)).unwrap();
    udp.send(b"hello\n").unwrap();
    let udp_client = match udp.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        a => panic!("{a}"),
    };
    let mut listed = None;
    assert!(within(TIMEOUT, || {
        listed = session_of(&d, "udp", udp_client);
        listed.is_some()
    }));
    let s = listed.unwrap();
    assert!(s.expires_secs.unwrap() <= 2, "{s:?}");
    assert!(
        within(Duration::from_secs(12), || session_of(
            &d, "udp", udp_client
        )
        .is_none()),
        "the idle UDP session did not expire"
    );
    println!("udp session {s:?} expired");

    // Turned nat, the network loses its DSR table by a difference and its VIP is NAT; turned
    // dsr again, it gets it back.
    let mut state: Value = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    let network = &mut state["networks"][0];
    network["mode"] = "nat".into();
    network["timeouts"] = serde_json::json!({});
    let file = d.state_dir().join("nat.json");
    std::fs::write(&file, state.to_string()).unwrap();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
    let no_table = (topo.node).exec(["nft", "list", "table", "netdev", &table_name(NET)]);
    assert!(no_table.is_err(), "{no_table:?}");
    // NAT: a masqueraded client (hairpin on one segment) and a NAT element counted. (Exact
    // counts would not hold: the last packets of a connection that began on the other path
    // are counted where they land.)
    let before = nat_vip_packets(&topo);
    assert_eq!(ask_vip(&topo).peer.ip(), &topo.node_ip);
    let after = nat_vip_packets(&topo);
    assert!(after > before, "{before} -> {after}");
    state["networks"][0]["mode"] = "dsr".into();
    std::fs::write(&file, state.to_string()).unwrap();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
    assert_eq!(ask_vip(&topo).peer.ip(), &topo.client_ip);
    assert!(real_server(&topo).iter().any(|l| l.packets > 0));
    assert_eq!(
        d.log().matches("declaring it whole").count(),
        wholes,
        "{}",
        d.log()
    );

    // Both tables go with the network.
    d.ok(&["network", "rm", NET]);
    for family in ["ip", "netdev"] {
        let table = (topo.node).exec(["nft", "list", "table", family, &table_name(NET)]);
        assert!(table.is_err(), "{family}: {table:?}");
    }
}

/// Where the kernel cannot run the DSR table (the probe's failure injected), a dsr network
/// is served by NAT, and the log and `lb status` say why.
#[test]
fn nftables_dsr_without_the_egress_hook_serves_the_vip_by_nat_and_says_so() {
    if !require_root("nftables_dsr_without_the_egress_hook_serves_the_vip_by_nat_and_says_so") {
        return;
    }
    let topo = dsr_topology(2);
    let _servers = spawn_backends(&topo, PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start_env(
        lb(),
        bpffs.path(),
        &["--dataplane", "nftables"],
        &[(
            lb_user::dataplane::nft::DSR_FAIL_ENV,
            "injected: Operation not supported",
        )],
    )
    .unwrap();
    add_dsr_network(&d, &topo);
    let ips: Vec<String> = topo.backend_ips.iter().map(|b| b.to_string()).collect();
    set_service(&d, &ips);
    let status = d.ok(&["status"]);
    assert!(
        status.contains("Linux 5.16") && status.contains("injected: Operation not supported"),
        "{status}"
    );
    assert!(d.log().contains("Linux 5.16"), "{}", d.log());
    assert!(
        (topo.node)
            .exec(["nft", "list", "table", "netdev", &table_name(NET)])
            .is_err(),
        "no DSR table"
    );
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        seen.insert(ask_vip(&topo).backend);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(nat_vip_packets(&topo), 20, "the VIP is served by NAT");
    println!("lb status:\n{status}");
}

/// A DSR network at node scale on nftables (issue #25): 10,000 services × 10 backends
/// (`LB_NFT_SCALE` services), 100,000 `real-server` elements — past the 1,365 one
/// concatenated interval map took — applied from scratch with `lb apply -f`; the kernel's
/// DSR table read back equal to `lb elements`; then a backend added to one service (a shape
/// it had not: a new unit) and another removed, each a difference, the table equal again;
/// and service 0's VIP answered by its backends directly. Timings are printed, not asserted.
#[test]
fn nftables_dsr_node_scale_apply_and_changes() {
    if !require_root("nftables_dsr_node_scale_apply_and_changes") {
        return;
    }
    let n: u32 = std::env::var("LB_NFT_SCALE").map_or(10_000, |v| v.parse().unwrap());
    let topo = dsr_topology(2);
    let _servers = spawn_backends(&topo, PORT, UDP_PORT).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", "nftables"]).unwrap();
    let synthetic =
        |i: u32, k: u32| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + i * 10 + k);
    let services: Vec<Value> = (0..n)
        .map(|i| {
            let (vip, backends): (Ipv4Addr, Vec<Ipv4Addr>) = if i == 0 {
                (VIP, topo.backend_ips.clone())
            } else {
                (
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + i),
                    (0..10).map(|k| synthetic(i, k)).collect(),
                )
            };
            let backends: Vec<Value> = (backends.iter())
                .map(|b| serde_json::json!({ "ip": b.to_string() }))
                .collect();
            serde_json::json!({ "id": format!("svc{i}"), "vip": vip.to_string(), "backends": backends })
        })
        .collect();
    let state = serde_json::json!({ "networks": [{
        "name": NET,
        "netns": topo.node.name(),
        "interfaces": [ENDPOINT_IF],
        "mode": "dsr",
        "services": services,
    }]});
    let file = d.state_dir().with_file_name("dsr-scale.json");
    std::fs::write(&file, state.to_string()).unwrap();
    let t = Instant::now();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
    let full = t.elapsed();
    let status: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert_eq!(status["networks"][0]["applied"], true, "{status}");

    let equal = |what: &str| {
        let elements = d.elements(NET);
        let want: Vec<String> = (elements.lines())
            .filter(|l| l.starts_with(REAL_SERVER))
            .map(str::to_owned)
            .collect();
        assert_eq!(want.len(), 10 * (n as usize - 1) + 2, "{what}");
        let have: Vec<String> = (real_server(&topo).iter())
            .map(|l| l.element.to_string())
            .collect();
        assert!(
            sorted(have) == sorted(want),
            "{what}: the DSR table differs from lb elements"
        );
    };
    equal("after the apply");

    // An 11th backend for service 1 (a shape no set had), then one of its first ten gone.
    let wholes = d.log().matches("declaring it whole").count();
    let t = Instant::now();
    let added = synthetic(n, 0).to_string();
    d.ok(&["service", "backend", "add", NET, "svc1", &added]);
    let add = t.elapsed();
    let t = Instant::now();
    d.ok(&[
        "service",
        "backend",
        "rm",
        NET,
        "svc1",
        &synthetic(1, 3).to_string(),
    ]);
    let rm = t.elapsed();
    equal("after the changes");
    let elements = d.elements(NET);
    let svc1 = (elements.lines())
        .filter(|l| l.starts_with("real-server 10.100.0.1 . "))
        .collect::<Vec<_>>();
    assert_eq!(svc1.len(), 10, "{svc1:?}");
    assert!(
        svc1.iter().any(|l| l.ends_with(&format!(" : {added}"))),
        "{svc1:?}"
    );
    assert_eq!(
        d.log().matches("declaring it whole").count(),
        wholes,
        "the changes were differences: {}",
        d.log()
    );
    println!(
        "nftables dsr, {n} services × 10 backends: apply -f {full:?}, backend add {add:?}, backend rm {rm:?}"
    );

    // Service 0's VIP: both backends answer, and see the client itself (no NAT).
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let r = ask_vip(&topo);
        assert_eq!(r.peer.ip(), &topo.client_ip, "{r:?}");
        seen.insert(r.backend);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

/// A DSR table that the lb before per-shape units wrote (`golden/shared_port.edge6.lb-dsr-1.nft`:
/// that lb's whole transaction for the dual-stack golden network, frozen; its `real-server`
/// maps were concatenated interval maps, its IPv6 sessions learnt in a chain per device) is
/// taken over by the first sync from the state it was written for: the difference is
/// refused (a dsr network's token names the DSR layout) and the table declared whole — the
/// earlier layout's maps and chains gone, the units holding exactly the `real-server`
/// elements of `lb elements` — with the sessions it held kept.
#[test]
fn nftables_dsr_table_of_the_earlier_layout_is_taken_over_with_its_sessions() {
    if !require_root("nftables_dsr_table_of_the_earlier_layout_is_taken_over_with_its_sessions") {
        return;
    }
    use lb_user::{
        core::{compose::ComposedNetwork, elements::placed_elements, model::DesiredState},
        dataplane::{Dataplane as _, nft::NftDataplane},
    };
    let ns = Netns::new("dsrup").unwrap();
    // The VIPs become aliases on the interface: IPv6 on.
    ns.enable_ipv6().unwrap();
    ns.ip([
        "link",
        "add",
        "veth-dsr",
        "type",
        "veth",
        "peer",
        "name",
        "veth-dsr-p",
    ])
    .unwrap();
    ns.ip(["link", "set", "veth-dsr", "up"]).unwrap();
    ns.ip(["link", "set", "veth-dsr-p", "up"]).unwrap();
    // The dual-stack golden network (`core::golden_nft_ruleset_dsr_dual_stack`), here.
    let mut json: Value = serde_json::from_str(include_str!("golden/shared_port.json")).unwrap();
    let edge = (json["networks"].as_array_mut().unwrap().iter_mut())
        .find(|n| n["name"] == "edge")
        .unwrap();
    let svc = &mut edge["services"][0];
    svc["vips"] = serde_json::json!(["10.1.0.53", "fd01::53"]);
    svc.as_object_mut().unwrap().remove("vip");
    let backends = svc["backends"].as_array_mut().unwrap();
    backends.push(serde_json::json!({"ip": "fd01::3"}));
    backends.push(serde_json::json!({"ip": "fd01::2", "disabled": true}));
    edge["timeouts"] = serde_json::json!({ "dsr": 30 });
    let state = DesiredState::from_json(&json.to_string()).unwrap();
    let network = ComposedNetwork::new(state.network("edge").unwrap().clone());

    let earlier = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/shared_port.edge6.lb-dsr-1.nft"
    );
    ns.exec(["nft", "-f", earlier]).unwrap();
    let session6 = format!(
        "dsr6-tcp-{:032x}",
        u128::from("fd01::3".parse::<std::net::Ipv6Addr>().unwrap())
    );
    let table = table_name("edge");
    // A session of each family, as the packet path learns them.
    for (set, session) in [
        (
            "dsr-conntrack-tcp",
            "{ 10.9.0.1 . 40000 . 10.1.0.53 . 80 : 02:00:00:00:00:01 }",
        ),
        (session6.as_str(), "{ fd09::1 . 40000 . fd01::53 . 80 }"),
    ] {
        ns.exec(["nft", "add", "element", "netdev", &table, set, session])
            .unwrap();
    }
    let listed = ns.exec(["nft", "list", "table", "netdev", &table]).unwrap();
    assert!(
        listed.contains("map real-server {") && listed.contains("chain new6-veth-dsr {"),
        "{listed}"
    );

    // Run from within the namespace, the network naming none: its token is then the one
    // the earlier lb wrote, but for the DSR layout.
    let mut nft = NftDataplane::default();
    ns.run(|| nft.apply(&network, Some(&network)))
        .unwrap()
        .unwrap();

    let listed = ns.exec(["nft", "list", "table", "netdev", &table]).unwrap();
    for gone in [
        "map real-server {",
        "map real-server6 {",
        "chain new6-veth-dsr {",
    ] {
        assert!(!listed.contains(gone), "{gone} is still there: {listed}");
    }
    assert!(listed.contains("chain new6 {"), "{listed}");
    assert!(
        listed.contains("10.9.0.1 . 40000 . 10.1.0.53 . 80"),
        "the IPv4 session went: {listed}"
    );
    assert!(
        listed.contains("fd09::1 . 40000 . fd01::53 . 80"),
        "the IPv6 session went: {listed}"
    );
    let json = ns
        .exec(["nft", "-j", "list", "table", "netdev", &table])
        .unwrap();
    let backends6 = lb_user::dataplane::nft::dsr::backends6(network.network());
    let have: Vec<String> = (listed_real_server(&json, &backends6).unwrap().iter())
        .map(|l| l.element.to_string())
        .collect();
    let want: Vec<String> = (placed_elements(&network).into_iter())
        .filter(|p| p.element.map == REAL_SERVER)
        .map(|p| p.element.to_string())
        .collect();
    assert_eq!(want.len(), 3, "{want:?}");
    assert_eq!(sorted(have), sorted(want));
}
