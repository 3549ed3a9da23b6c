//! `lb daemon` and its CLI, the real binaries, against netns topologies: rolling update,
//! apply/state round trip, kill -9 with open connections, bad input, 10,000 services of 10
//! backends applied and changed, metrics. Root only.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use hyper::Method;
use lb_tests::{
    bpffs::Bpffs,
    bpftool,
    daemon::{LbDaemon, check_metrics, http_get, network_add, scrape, service_set},
    netns::Topology,
    require_root, scale,
    traffic::{Reply, TIMEOUT, TcpSession, spawn_backends, tcp_request},
};
use lb_user::{
    api,
    core::elements::network_elements,
    core::model::{
        Attach, Backend, DesiredState, Masquerade, Mode, Network, PortConfig, Proto, Service,
    },
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const PUBLISHED: u16 = 18080;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn start(bpffs: &Bpffs) -> LbDaemon {
    LbDaemon::start(lb(), bpffs.path(), &[]).expect("lb daemon starts")
}

/// A daemon on dataplane `dp` (`ebpf` or `nftables`): the cases that both must pass run on
/// each, through the same CLI.
fn start_on(bpffs: &Bpffs, dp: &str) -> LbDaemon {
    LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dp]).expect("lb daemon starts")
}

fn add_network(d: &LbDaemon, topo: &Topology, name: &str) {
    d.ok(&network_add(topo, name));
}

fn set_service(d: &LbDaemon, network: &str, generation: &str, backends: &[Ipv4Addr]) {
    let port = format!("tcp/{PUBLISHED}:{PORT}");
    d.ok(&service_set(
        network, "api", generation, VIP, &port, backends,
    ));
}

/// A service's (IPv4) VIP, as the traffic helpers take it.
fn vip4(s: &Service) -> Ipv4Addr {
    match s.vips.first() {
        Some(IpAddr::V4(vip)) => *vip,
        other => panic!("not one IPv4 VIP: {other:?}"),
    }
}

fn backend_of(topo: &Topology, name: &str) -> Ipv4Addr {
    // spawn_backends names backend i "b{i}".
    topo.backend_ips[name.trim_start_matches('b').parse::<usize>().unwrap()]
}

#[test]
fn rolling_update_shares_the_port_and_drains_the_old_generation() {
    if require_root("rolling_update_shares_the_port_and_drains_the_old_generation") {
        rolling_update("ebpf");
    }
}

#[test]
fn nftables_rolling_update_shares_the_port_and_drains_the_old_generation() {
    if require_root("nftables_rolling_update_shares_the_port_and_drains_the_old_generation") {
        rolling_update("nftables");
    }
}

fn rolling_update(dp: &str) {
    let topo = Topology::new(4).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start_on(&bpffs, dp);
    add_network(&d, &topo, "roll");
    let (gen1, gen2) = (&topo.backend_ips[..2], &topo.backend_ips[2..]);
    set_service(&d, "roll", "1", gen1);
    set_service(&d, "roll", "2", gen2);

    // The union, partitioned once: four intervals for the VIP and four for the port.
    let elements = d.elements("roll");
    println!("lb elements roll:\n{elements}");
    let state: DesiredState = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    let want: Vec<String> = network_elements(&lb_user::core::compose::ComposedNetwork::new(
        state.network("roll").unwrap().clone(),
    ))
    .iter()
    .map(|e| e.to_string())
    .collect();
    assert_eq!(elements.lines().collect::<Vec<_>>(), want);
    for set in ["nat-service-vip", "nat-publish-port"] {
        let lines: Vec<&str> = elements.lines().filter(|l| l.starts_with(set)).collect();
        assert_eq!(
            lines.len(),
            4,
            "{set}: one partition over 4 backends: {lines:?}"
        );
        for b in &topo.backend_ips {
            assert!(
                lines.iter().any(|l| l.contains(&b.to_string())),
                "{set} lacks {b}"
            );
        }
    }

    // A connection that landed on generation 1, kept open across its removal.
    let mut old = None;
    for _ in 0..50 {
        let mut s = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
        let r: Reply = s.ask().unwrap().parse().unwrap();
        if gen1.contains(&backend_of(&topo, &r.backend)) {
            old = Some((s, r.backend));
            break;
        }
    }
    let (mut old, old_backend) = old.expect("one of 50 connections lands on generation 1");
    let said = d.ok(&["service", "rm", "roll", "api", "--generation", "1"]);
    println!("{}", said.trim());
    for _ in 0..30 {
        for addr in [VIP, topo.node_ip] {
            let port = if addr == VIP { PORT } else { PUBLISHED };
            let r: Reply = tcp_request(&topo.client, addr, port, TIMEOUT)
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                gen2.contains(&backend_of(&topo, &r.backend)),
                "a new connection reached generation 1's {}",
                r.backend
            );
        }
    }
    for _ in 0..5 {
        let r: Reply = old
            .ask()
            .expect("the generation-1 connection keeps working")
            .parse()
            .unwrap();
        assert_eq!(r.backend, old_backend);
    }
}

fn full_state(topo: &Topology) -> DesiredState {
    let b = |i: usize, disabled| Backend {
        ip: topo.backend_ips[i].into(),
        disabled,
    };
    DesiredState {
        networks: vec![Network {
            name: "rt".into(),
            interfaces: topo.node_ifaces.clone(),
            netns: Some(topo.node.name().into()),
            mode: Mode::Nat,
            attach: Attach::Xdp,
            masquerade: Masquerade::Always,
            fast_path: Default::default(),
            hold_ports: Default::default(),
            timeouts: Default::default(),
            services: vec![
                Service {
                    id: "api".into(),
                    generation: "7".into(),
                    vips: vec![VIP.into()],
                    backends: vec![b(0, false), b(1, true)],
                    ports: vec![
                        PortConfig {
                            proto: Proto::Tcp,
                            published: PUBLISHED,
                            target: Some(PORT),
                            host_ip: None,
                        },
                        PortConfig {
                            proto: Proto::Udp,
                            published: 5353,
                            target: None,
                            host_ip: Some(topo.node_ip.into()),
                        },
                    ],
                },
                Service {
                    id: "db".into(),
                    generation: "1".into(),
                    vips: vec![Ipv4Addr::new(10, 99, 0, 20).into()],
                    backends: vec![b(2, false)],
                    ports: vec![],
                },
            ],
        }],
    }
}

#[test]
fn apply_then_state_round_trips() {
    if !require_root("apply_then_state_round_trips") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs);
    let file = d.state_dir().with_file_name("apply.json");
    let canonical = full_state(&topo).to_json();
    std::fs::write(&file, &canonical).unwrap();
    println!("{}", d.ok(&["apply", "-f", file.to_str().unwrap()]).trim());
    let state = d.ok(&["state"]);
    assert_eq!(
        state.trim_end(),
        canonical.trim_end(),
        "lb state returns the applied file"
    );
    let parsed = DesiredState::from_json(&d.ok(&["state", "--json"])).unwrap();
    assert_eq!(parsed, full_state(&topo));
}

/// Client, frontend (the address asked) and backend of every tracked flow, as
/// `lb conntrack --json` shows them.
fn flows(d: &LbDaemon) -> BTreeSet<(String, String, String)> {
    let v: Value = serde_json::from_str(&d.ok(&["conntrack", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["client"].as_str().unwrap().to_owned(),
                f["frontend"].as_str().unwrap().to_owned(),
                f["backend"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn kill_9_keeps_20_open_connections_and_a_restart_reports_the_same() {
    if require_root("kill_9_keeps_20_open_connections_and_a_restart_reports_the_same") {
        kill_9("ebpf");
    }
}

#[test]
fn nftables_kill_9_keeps_20_open_connections_and_a_restart_reports_the_same() {
    if require_root("nftables_kill_9_keeps_20_open_connections_and_a_restart_reports_the_same") {
        kill_9("nftables");
    }
}

fn kill_9(dp: &str) {
    let topo = Topology::new(4).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start_on(&bpffs, dp);
    add_network(&d, &topo, "k9");
    set_service(&d, "k9", "1", &topo.backend_ips);
    let mut sessions: Vec<(TcpSession, String)> = (0..20)
        .map(|_| {
            let mut s = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
            let r: Reply = s.ask().unwrap().parse().unwrap();
            (s, r.backend)
        })
        .collect();
    let state = d.ok(&["state"]);
    let before = flows(&d);
    assert_eq!(before.len(), 20, "20 tracked flows: {before:?}");

    d.kill9();
    for (s, backend) in &mut sessions {
        let r: Reply = s
            .ask()
            .expect("still exchanging data after kill -9")
            .parse()
            .unwrap();
        assert_eq!(&r.backend, backend);
    }
    d.restart().unwrap();
    assert_eq!(d.ok(&["state"]), state, "the same desired state");
    assert_eq!(flows(&d), before, "the same conntrack entries");
    let status: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    let sync = &status["networks"][0]["last_sync"];
    assert_eq!(
        sync["flows_flushed"].as_u64(),
        Some(0),
        "nothing flushed: {status}"
    );
    if dp == "ebpf" {
        // The pinned maps are adopted as they are. (nftables declares its table again on
        // every sync: the kernel's conntrack, not the table, carries the flows.)
        assert_eq!(
            sync["written"].as_u64(),
            Some(0),
            "a restart adopts: {status}"
        );
    }
    for (s, backend) in &mut sessions {
        let r: Reply = s
            .ask()
            .expect("still exchanging data after the restart")
            .parse()
            .unwrap();
        assert_eq!(&r.backend, backend);
    }
    println!(
        "20 connections survived kill -9 and the restart; {} flows",
        before.len()
    );
}

#[test]
fn a_network_removed_while_the_daemon_was_down_is_cleaned_up_at_start() {
    if !require_root("a_network_removed_while_the_daemon_was_down_is_cleaned_up_at_start") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs);
    add_network(&d, &topo, "gone");
    set_service(&d, "gone", "1", &topo.backend_ips);
    tcp_request(&topo.client, VIP, PORT, TIMEOUT).expect("the VIP answers");
    let alias_if = &topo.node_ifaces[0];
    let aliases = || {
        topo.node
            .ip(["-4", "-o", "addr", "show", "dev", alias_if])
            .unwrap()
    };
    let pins = bpffs.path().join("gone");
    assert!(pins.exists() && aliases().contains(&format!("{VIP}/32")));
    // TCX attachments (the daemon's default on this kernel), queried in the node's namespace:
    // `bpftool net show` of this machine's bpftool does not list them.
    let attached = || -> Vec<String> {
        let ifname = alias_if.clone();
        topo.node
            .run(move || {
                use aya::programs::{SchedClassifier, TcAttachType};
                let (_, progs) = SchedClassifier::query_tcx(&ifname, TcAttachType::Ingress)
                    .expect("querying TCX ingress");
                progs
                    .iter()
                    .filter_map(|p| p.name_as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap()
    };
    assert!(
        attached().iter().any(|p| p.starts_with("lb_")),
        "attached: {:?}",
        attached()
    );

    // The daemon is down while the state is replaced (config management, a restored backup).
    d.stop();
    assert!(
        pins.exists(),
        "a stopped daemon leaves its dataplane in place"
    );
    d.restart_with_state(&DesiredState { networks: vec![] }.to_json())
        .unwrap();
    assert!(!pins.exists(), "the pins of the removed network are gone");
    assert!(
        !aliases().contains(&format!("{VIP}/32")),
        "its VIP alias is gone: {}",
        aliases()
    );
    assert!(
        !attached().iter().any(|p| p.starts_with("lb_")),
        "still attached: {:?}",
        attached()
    );
    assert!(
        tcp_request(&topo.client, VIP, PORT, Duration::from_secs(1)).is_err(),
        "the VIP still answers"
    );
    assert_eq!(d.ok(&["network", "list", "--json"]).trim(), "[]");
    println!("network removed while down: pins, alias and programs gone at start");
}

#[test]
fn a_second_daemon_is_refused_before_it_touches_anything() {
    if !require_root("a_second_daemon_is_refused_before_it_touches_anything") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs);
    add_network(&d, &topo, "first");
    set_service(&d, "first", "1", &topo.backend_ips[..1]);
    let answers = |what: &str| {
        for (addr, port) in [(VIP, PORT), (topo.node_ip, PUBLISHED)] {
            tcp_request(&topo.client, addr, port, TIMEOUT)
                .unwrap_or_else(|e| panic!("{what}: {addr}:{port} does not answer: {e:#}"));
        }
    };
    answers("before");
    let first = d.pid().unwrap().to_string();
    let (other_bpffs, work) = (
        Bpffs::new().unwrap(),
        d.state_dir().with_file_name("second"),
    );
    let (other_state, other_socket) = (work.join("state"), work.join("lb.sock"));
    // The case first (another state dir, the same bpffs and socket: refused by the
    // bpffs lock, the second taken), then each of the three locks alone.
    let cases = [
        (
            "another state dir, the same bpffs and socket",
            &other_state,
            &d.socket(),
            bpffs.path(),
            "the bpffs dir",
        ),
        (
            "another state dir and socket, the same bpffs",
            &other_state,
            &other_socket,
            bpffs.path(),
            "the bpffs dir",
        ),
        (
            "the same state dir, another bpffs and socket",
            &d.state_dir(),
            &other_socket,
            other_bpffs.path(),
            "the state dir",
        ),
        (
            "another state dir and bpffs, the same socket",
            &other_state,
            &d.socket(),
            other_bpffs.path(),
            "the API socket",
        ),
    ];
    for (i, (what, state_dir, socket, pins, lock)) in cases.into_iter().enumerate() {
        let before = snapshot(&d, &bpffs, "first");
        let run = d.another(state_dir, socket, pins);
        println!("{what}: {:?}: {}", run.code, run.stderr.trim());
        assert!(
            run.code.is_some_and(|c| c != 0),
            "{what}: the second daemon did not exit with an error: {run:?}"
        );
        assert!(
            run.stderr.contains(lock)
                && run.stderr.contains(&format!("in use by pid {first} "))
                && run.stderr.contains("nothing was changed"),
            "{what}: the refusal names the lock and the first daemon (pid {first}): {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("dataplane selected"),
            "{what}: the second daemon got past the locks: {}",
            run.stderr
        );
        assert_eq!(
            snapshot(&d, &bpffs, "first"),
            before,
            "{what}: state or maps changed"
        );
        assert!(
            d.socket().exists(),
            "{what}: the first daemon's socket is gone"
        );
        answers(what);
        // The first daemon's next change succeeds and is served.
        let backend = &topo.backend_ips[(i + 1) % 2..][..1];
        set_service(&d, "first", "1", backend);
        let r: Reply = tcp_request(&topo.client, VIP, PORT, TIMEOUT)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            backend_of(&topo, &r.backend),
            backend[0],
            "{what}: the change after it"
        );
    }
    // A live socket without the lock file (a daemon that predates it) is not taken over
    // either.
    std::fs::create_dir_all(&work).unwrap();
    let old_socket = work.join("old.sock");
    let _old = std::os::unix::net::UnixListener::bind(&old_socket).unwrap();
    let run = d.another(&other_state, &old_socket, other_bpffs.path());
    println!(
        "a live socket without its lock: {:?}: {}",
        run.code,
        run.stderr.trim()
    );
    assert!(
        run.code.is_some_and(|c| c != 0)
            && run.stderr.contains("another lb daemon is listening on")
            && old_socket.exists(),
        "{run:?}"
    );
    println!(
        "a second daemon on any of the first's state dir, bpffs or socket is refused; the first untouched"
    );
}

/// Everything observable that bad input must not change: the desired state and the maps.
fn snapshot(d: &LbDaemon, bpffs: &Bpffs, network: &str) -> (String, Vec<String>) {
    let maps = [
        "lb_vips",
        "lb_ports",
        "lb_backends",
        "lb_config",
        "lb_local_addrs",
    ]
    .iter()
    .map(|m| {
        let pin = bpffs.path().join(network).join(m);
        let dump = bpftool::json(&["map", "dump", "pinned", pin.to_str().unwrap()]);
        dump.unwrap_or_else(|e| panic!("{m}: {e:#}")).to_string()
    })
    .collect();
    (d.ok(&["state", "--json"]), maps)
}

#[test]
fn bad_input_is_refused_with_a_reason_and_changes_nothing() {
    if !require_root("bad_input_is_refused_with_a_reason_and_changes_nothing") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs);
    add_network(&d, &topo, "bad");
    set_service(&d, "bad", "1", &topo.backend_ips);
    d.ok(&[
        "service",
        "set",
        "bad",
        "other",
        "--vip",
        "10.99.0.20",
        "--port",
        "tcp/9090",
    ]);
    let before = snapshot(&d, &bpffs, "bad");
    let work = d.state_dir().with_file_name("bad-input");
    std::fs::create_dir_all(&work).unwrap();
    let file = |name: &str, body: &str| {
        let p = work.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let ns = topo.node.name().to_owned();
    let (if0, if1) = (topo.node_ifaces[0].clone(), topo.node_ifaces[1].clone());
    let b0 = topo.backend_ips[0].to_string();
    let long = "n".repeat(40);
    let malformed = file("malformed.json", "{\"networks\": [");
    let unknown_field = file("unknown.json", "{\"networks\": [], \"colour\": 1}");
    let array = file("array.json", "[]");
    let conflict = {
        let mut s = full_state(&topo);
        s.networks[0].name = "bad".into();
        s.networks[0].services[1].vips = vec![VIP.into()];
        file("conflict.json", &serde_json::to_string(&s).unwrap())
    };
    // `network add n2` on the second interface, with `extra` flags.
    let add_n2 = |extra: &[&'static str]| -> Vec<&str> {
        let mut v = vec!["network", "add", "n2", "--interface", &if1, "--netns", &ns];
        v.extend_from_slice(extra);
        v
    };
    let cli: Vec<(&str, Vec<&str>)> = vec![
        (
            "empty network name",
            vec!["network", "add", "", "--interface", &if0, "--netns", &ns],
        ),
        (
            "network name too long",
            vec!["network", "add", &long, "--interface", "x0", "--netns", &ns],
        ),
        (
            "network exists",
            vec!["network", "add", "bad", "--interface", &if0, "--netns", &ns],
        ),
        (
            "no such interface",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                "nosuch0",
                "--netns",
                &ns,
            ],
        ),
        (
            "unknown mode",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                &if1,
                "--mode",
                "tunnel",
            ],
        ),
        (
            "unknown attach",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                &if1,
                "--attach",
                "kprobe",
            ],
        ),
        (
            "unknown masquerade",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                &if1,
                "--masquerade",
                "sometimes",
            ],
        ),
        (
            "interface of another network",
            vec!["network", "add", "n2", "--interface", &if0, "--netns", &ns],
        ),
        (
            "interface twice",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                "y0",
                "--interface",
                "y0",
                "--netns",
                &ns,
            ],
        ),
        (
            "no such netns",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                "lo",
                "--netns",
                "lbt-nosuch-ns",
            ],
        ),
        (
            "interface name too long",
            vec![
                "network",
                "add",
                "n2",
                "--interface",
                "abcdefghijklmnopq",
                "--netns",
                &ns,
            ],
        ),
        ("rm unknown network", vec!["network", "rm", "nosuch"]),
        (
            "service in unknown network",
            vec!["service", "set", "nosuch", "api", "--vip", "10.99.0.30"],
        ),
        (
            "VIP out of range",
            vec!["service", "set", "bad", "s2", "--vip", "10.99.0.300"],
        ),
        (
            "VIP not an address",
            vec!["service", "set", "bad", "s2", "--vip", "vip"],
        ),
        (
            "IPv6 VIP with IPv4 backends only",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "fd00::1",
                "--backend",
                "10.20.0.5",
            ],
        ),
        (
            "bad backend address",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--backend",
                "10.20.0.999",
            ],
        ),
        (
            "bad backend flag",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--backend",
                "10.20.0.10,sleeping",
            ],
        ),
        (
            "published port 0",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "tcp/0",
            ],
        ),
        (
            "published port too big",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "tcp/70000",
            ],
        ),
        (
            "unknown protocol",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "icmp/80",
            ],
        ),
        (
            "target port 0",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "tcp/80:0",
            ],
        ),
        (
            "bad host_ip",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "tcp/80@1.2.3.999",
            ],
        ),
        (
            "port without protocol",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "80",
            ],
        ),
        (
            "VIP of another service",
            vec!["service", "set", "bad", "s2", "--vip", "10.99.0.10"],
        ),
        (
            "published port of another service",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                "10.99.0.30",
                "--port",
                "tcp/9090",
            ],
        ),
        (
            "VIP is its own backend",
            vec![
                "service",
                "set",
                "bad",
                "s2",
                "--vip",
                &b0,
                "--backend",
                &b0,
            ],
        ),
        (
            "empty service id",
            vec!["service", "set", "bad", "", "--vip", "10.99.0.30"],
        ),
        ("rm unknown service", vec!["service", "rm", "bad", "nosuch"]),
        (
            "rm unknown generation",
            vec!["service", "rm", "bad", "api", "--generation", "9"],
        ),
        (
            "apply of a missing file",
            vec!["apply", "-f", "/nonexistent/state.json"],
        ),
        ("apply of malformed JSON", vec!["apply", "-f", &malformed]),
        (
            "apply with an unknown field",
            vec!["apply", "-f", &unknown_field],
        ),
        ("apply of a JSON array", vec!["apply", "-f", &array]),
        ("apply with a VIP conflict", vec!["apply", "-f", &conflict]),
        ("elements of an unknown network", vec!["elements", "nosuch"]),
        (
            "conntrack of an unknown network",
            vec!["conntrack", "nosuch"],
        ),
        (
            "dsr timeout on a nat network",
            add_n2(&["--timeout", "dsr=5"]),
        ),
        ("timeout without seconds", add_n2(&["--timeout", "tcp_syn"])),
        ("unknown timeout", add_n2(&["--timeout", "tcp_fin=3"])),
        ("timeout of 0", add_n2(&["--timeout", "udp=0"])),
        (
            "a backend that is a VIP of the network",
            vec![
                "service",
                "set",
                "bad",
                "s3",
                "--vip",
                "10.99.0.40",
                "--backend",
                "10.99.0.10",
            ],
        ),
    ];
    let mut refused = 0;
    for (what, args) in &cli {
        let r = d.cli(args);
        let msg = r.stderr.trim_end();
        assert_ne!(r.code, Some(0), "{what}: accepted: {r:?}");
        assert!(msg.starts_with("lb: "), "{what}: no reason: {r:?}");
        assert!(!msg.is_empty(), "{what}: no reason");
        println!("{what}: {}", msg.lines().next().unwrap());
        if what.starts_with("dsr") {
            assert!(
                msg.contains("timeout dsr is the session timeout of a dsr network"),
                "{what}: says why: {msg}"
            );
        }
        refused += 1;
    }
    let bad_network = serde_json::to_vec(&full_state(&topo).networks[0]).unwrap();
    let mut empty_network = full_state(&topo).networks[0].clone();
    empty_network.name = "bad".into();
    empty_network.services.clear();
    let client = api::Client::new(&d.socket());
    let raw: Vec<(&str, Method, &str, Vec<u8>, u16)> = vec![
        (
            "malformed JSON",
            Method::PUT,
            "/v1/state",
            b"{\"networks\": ".to_vec(),
            400,
        ),
        ("empty body", Method::PUT, "/v1/state", Vec::new(), 400),
        (
            "oversized body",
            Method::PUT,
            "/v1/state",
            vec![b' '; api::MAX_REQUEST + 4096],
            413,
        ),
        ("unknown path", Method::GET, "/v1/reboot", Vec::new(), 404),
        ("unversioned path", Method::GET, "/state", Vec::new(), 404),
        (
            "unknown method",
            Method::PATCH,
            "/v1/state",
            Vec::new(),
            405,
        ),
        (
            "unknown field",
            Method::PUT,
            "/v1/state",
            b"{\"networks\":[],\"verbose\":true}".to_vec(),
            400,
        ),
        (
            "trailing garbage",
            Method::PUT,
            "/v1/state",
            b"{\"networks\":[]} {}".to_vec(),
            400,
        ),
        (
            "bad VIP in raw JSON",
            Method::PUT,
            "/v1/networks/bad/services/s/1",
            b"{\"vip\":\"1.2.3\"}".to_vec(),
            400,
        ),
        (
            "the service id in the body",
            Method::PUT,
            "/v1/networks/bad/services/s/1",
            b"{\"id\":\"t\",\"vip\":\"10.99.0.50\"}".to_vec(),
            400,
        ),
        (
            "a service of an unknown network",
            Method::PUT,
            "/v1/networks/nope/services/s/1",
            b"{\"vip\":\"10.99.0.50\"}".to_vec(),
            404,
        ),
        (
            "network add with services",
            Method::POST,
            "/v1/networks",
            bad_network,
            400,
        ),
        (
            "a network that exists",
            Method::POST,
            "/v1/networks",
            serde_json::to_vec(&empty_network).unwrap(),
            409,
        ),
        (
            "not JSON at all",
            Method::PUT,
            "/v1/state",
            b"\x00\xffhello".to_vec(),
            400,
        ),
        (
            "a body on GET",
            Method::GET,
            "/v1/state",
            b"{}".to_vec(),
            400,
        ),
        (
            "an unknown query",
            Method::GET,
            "/v1/services?verbose=1",
            Vec::new(),
            400,
        ),
    ];
    for (what, method, path, body, want) in raw {
        let (status, reply) = client
            .send(method, path, body)
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let reply: api::ErrorReply = serde_json::from_slice(&reply)
            .unwrap_or_else(|e| panic!("{what}: not an error reply ({e}): {reply:?}"));
        assert_eq!(status.as_u16(), want, "{what}: {reply:?}");
        assert!(!reply.saved, "{what}: {reply:?}");
        let msg = reply.error;
        assert!(!msg.is_empty() && !msg.contains('\n'), "{what}: {msg:?}");
        println!("raw {what}: {status}: {msg}");
        refused += 1;
    }
    assert_eq!(snapshot(&d, &bpffs, "bad"), before, "state or maps changed");
    println!("{refused} bad inputs refused; state and maps unchanged");
    assert!(refused >= 30);
}

/// A state that would not fit a network's maps is refused before it is saved, with the map,
/// its size and the flag that raises it; the desired state and the maps stay as they were.
/// Maps pinned with another size than the daemon's flags now give are adopted with their size,
/// logged, and the refusal says how to resize them.
#[test]
fn a_state_over_a_map_size_is_refused_before_saving_and_changes_nothing() {
    if !require_root("a_state_over_a_map_size_is_refused_before_saving_and_changes_nothing") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let small = ["--max-services", "2", "--max-backends", "8"];
    let mut d = LbDaemon::start(lb(), bpffs.path(), &small).unwrap();
    add_network(&d, &topo, "cap");
    // A VIP and a published port of two backends each: 4 of the 8 backend slots.
    set_service(&d, "cap", "1", &topo.backend_ips);
    let before = snapshot(&d, &bpffs, "cap");
    let three: Vec<Ipv4Addr> = (1..=3).map(|i| Ipv4Addr::new(10, 20, 9, i)).collect();
    let vip2 = Ipv4Addr::new(10, 99, 0, 20);
    // Two sets of three: 4 held + 6 = 10 slots.
    let over_backends = service_set("cap", "b", "1", vip2, "tcp/9090", &three);
    let refused = |d: &LbDaemon, args: &[String], needles: &[&str]| {
        let r = d.cli(args);
        assert!(!r.ok(), "{args:?} accepted");
        for n in needles {
            assert!(r.stderr.contains(n), "{n:?} missing: {}", r.stderr);
        }
        println!("refused: {}", r.stderr.trim());
        assert_eq!(snapshot(d, &bpffs, "cap"), before, "state or maps changed");
    };
    refused(
        &d,
        &over_backends,
        &[
            "needs 10 backend slots",
            "lb_backends holds 8",
            "raise it with lb daemon --max-backends",
        ],
    );
    // Three VIPs where lb_vips holds two, by lb apply.
    let mut state: DesiredState = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    for i in 1..=2u8 {
        let mut s = state.networks[0].services[0].clone();
        (s.id, s.vips, s.ports) = (
            format!("v{i}"),
            vec![Ipv4Addr::new(10, 99, 1, i).into()],
            vec![],
        );
        s.backends.truncate(1);
        state.networks[0].services.push(s);
    }
    let file = d.state_dir().with_file_name("over.json");
    std::fs::write(&file, state.to_json()).unwrap();
    let apply = ["apply", "-f", file.to_str().unwrap()].map(String::from);
    refused(
        &d,
        &apply,
        &["needs 3 VIP entries but lb_vips holds 2", "--max-services"],
    );

    // Larger sizes for maps created from now on; this network's stay as they were made.
    d.set_extra(&["--max-services", "2", "--max-backends", "100"]);
    d.restart().unwrap();
    assert!(
        d.log().contains("adopted a pinned map of another size"),
        "{}",
        d.log()
    );
    refused(
        &d,
        &over_backends,
        &[
            "lb_backends holds 8",
            "created with 8 entries and lb daemon --max-backends now gives 100",
            "remove the network and add it again",
        ],
    );
    // Removed and added again, the network's maps take the new size.
    d.ok(&["network", "rm", "cap"]);
    add_network(&d, &topo, "cap");
    set_service(&d, "cap", "1", &topo.backend_ips);
    d.ok(&over_backends);
}

/// Node scale (issue 10): 10,000 services of 10 backends and one published TCP port each,
/// applied from scratch through the daemon. A VIP and a published port answer, and one backend
/// changed with `lb service set` writes O(1) map entries and is served at once. (10,000 x 10
/// takes seconds here, most of them adding the VIP aliases, so CI runs the full size.)
#[test]
fn ten_thousand_services_of_ten_backends_apply_answer_and_change_in_o1() {
    if !require_root("ten_thousand_services_of_ten_backends_apply_answer_and_change_in_o1") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs);
    const N: u32 = 10_000;
    // One service is served by the topology's backends b0 and b1; the others point nowhere.
    const REAL: usize = 4321;
    let mut services = scale::services(N, 10, PORT);
    services[REAL].backends = (topo.backend_ips[..2].iter())
        .map(|ip| Backend {
            ip: (*ip).into(),
            disabled: false,
        })
        .collect();
    let state = scale::state("big", topo.node.name(), &topo.node_ifaces, services);
    let file = d.state_dir().with_file_name("big.json");
    std::fs::write(&file, state.to_json()).unwrap();
    let start = std::time::Instant::now();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
    println!("{N} x 10 applied in {:?} (a debug build)", start.elapsed());
    let last_sync = |d: &LbDaemon| -> (u64, u64) {
        let v: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
        let s = &v["networks"][0]["last_sync"];
        (
            s["written"].as_u64().unwrap(),
            s["deleted"].as_u64().unwrap(),
        )
    };
    let (full, _) = last_sync(&d);
    println!("applying {N} services wrote {full} map entries");
    // Each service: a VIP entry and a port entry, each with a slot per backend.
    let entries: u64 = (state.networks[0].services.iter())
        .map(|s| 2 * (1 + s.backends.len() as u64))
        .sum();
    assert!(
        full >= entries,
        "every VIP, port and backend slot written: {full} < {entries}"
    );

    let s = &state.networks[0].services[REAL];
    let published = s.ports[0].published;
    let ask = |addr: Ipv4Addr, port: u16| -> Ipv4Addr {
        let r: Reply = tcp_request(&topo.client, addr, port, TIMEOUT)
            .unwrap_or_else(|e| panic!("{addr}:{port}: {e:#}"))
            .parse()
            .unwrap();
        backend_of(&topo, &r.backend)
    };
    for (addr, port) in [(vip4(s), PORT), (topo.node_ip, published)] {
        let b = ask(addr, port);
        assert!(
            topo.backend_ips[..2].contains(&b),
            "{addr}:{port} reached {b}"
        );
    }

    // b0 replaced by b2: one backend of one service changed.
    d.ok(&scale::one_backend_changed("big", s, topo.backend_ips[2]));
    let (written, deleted) = last_sync(&d);
    println!("one backend changed at {N} x 10: {written} written, {deleted} deleted");
    // A new two-backend set for the VIP and for the port (4), both service entries switched
    // (2); the old sets stay until the next sync.
    assert!(
        written + deleted <= 8,
        "{written} written + {deleted} deleted is not O(1)"
    );
    assert!(written >= 6, "the change was applied: {written}");
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        for (addr, port) in [(vip4(s), PORT), (topo.node_ip, published)] {
            let b = ask(addr, port);
            assert_ne!(
                b, topo.backend_ips[0],
                "{addr}:{port} reached the replaced backend"
            );
            seen.insert(b);
        }
    }
    assert!(
        seen.contains(&topo.backend_ips[2]),
        "the new backend is served: {seen:?}"
    );
}

#[test]
fn metrics_are_prometheus_text_on_loopback() {
    if require_root("metrics_are_prometheus_text_on_loopback") {
        metrics("ebpf");
    }
}

#[test]
fn nftables_metrics_are_prometheus_text_on_loopback() {
    if require_root("nftables_metrics_are_prometheus_text_on_loopback") {
        metrics("nftables");
    }
}

/// The same series on both dataplanes, which `promtool check metrics` accepts, on `/metrics`
/// only (any other path is 404). The eBPF counters count packets (a connection is a SYN,
/// data and ACKs at least); the nftables map counters sit in a nat chain, which sees a
/// connection's first packet only, so there they count connections, exactly.
fn metrics(dp: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let d = LbDaemon::start(lb(), bpffs.path(), &["--metrics", &addr, "--dataplane", dp]).unwrap();
    add_network(&d, &topo, "met");
    set_service(&d, "met", "1", &topo.backend_ips);
    for _ in 0..10 {
        tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    }
    let text = scrape(&addr).unwrap();
    check_metrics(&text);
    let (status, body) = http_get(&addr, "/").unwrap();
    assert_eq!(status, 404, "only /metrics is served: {body}");
    let mut per_backend = BTreeMap::new();
    for line in text.lines().filter(|l| {
        l.starts_with(
            "lb_packets_total{network=\"met\",service=\"api\",frontend=\"10.99.0.10\",backend=\"1",
        )
    }) {
        let (labels, n) = line.rsplit_once(' ').unwrap();
        per_backend.insert(labels.to_owned(), n.parse::<u64>().unwrap());
    }
    assert_eq!(per_backend.len(), 2, "{text}");
    let counted = per_backend.values().sum::<u64>();
    if dp == "nftables" {
        assert_eq!(counted, 10, "one per connection: {per_backend:?}");
    } else {
        assert!(counted >= 10 * 3, "SYN, data, ACKs: {per_backend:?}");
    }
    let service_total = format!(
        "lb_packets_total{{network=\"met\",service=\"api\",frontend=\"{VIP}\",backend=\"\"}} {counted}\n"
    );
    assert!(
        text.contains(&service_total),
        "{service_total} missing:\n{text}"
    );
    for needle in [
        "lb_bytes_total{network=\"met\"",
        "lb_conntrack_entries{network=\"met\"} ",
        "lb_flows{network=\"met\",state=\"established\"} ",
        "lb_reconcile_duration_seconds_count ",
        "# TYPE lb_reconcile_duration_seconds histogram",
        "# TYPE lb_apply_errors_total counter",
        "lb_apply_errors_total{network=\"met\"} 0\n",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    if dp == "ebpf" {
        for needle in [
            "lb_flow_table_entries{network=\"met\"} ",
            "lb_flow_expiries_total{network=\"met\"} ",
            "lb_flow_evictions_total{network=\"met\"} 0\n",
            "lb_masquerade_failures_total{network=\"met\"} 0\n",
            "lb_datapath_packets_total{network=\"met\",hook=\"tc_ingress\",reason=\"flow_new\"} 10\n",
        ] {
            assert!(text.contains(needle), "{needle} missing:\n{text}");
        }
        let translated: u64 = (text.lines())
            .filter(|l| {
                l.starts_with("lb_datapath_packets_total{network=\"met\"")
                    && (l.contains("reason=\"translated\"") || l.contains("reason=\"redirected\""))
            })
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        assert!(
            translated >= counted,
            "every counted packet was translated (for the stack, or redirected past it): {translated}"
        );
    }
    // A removed network's series go with it, its error count's too: a series left behind
    // would look like a network that still exists (and lingers in `sum()`s and alerts).
    d.ok(&["network", "rm", "met"]);
    let text = scrape(&addr).unwrap();
    check_metrics(&text);
    let left: Vec<&str> = (text.lines())
        .filter(|l| l.contains("network=\"met\""))
        .collect();
    assert!(left.is_empty(), "series of a removed network: {left:#?}");
    let refused = LbDaemon::start(lb(), bpffs.path(), &["--metrics", "0.0.0.0:9"]);
    let err = format!(
        "{:#}",
        refused
            .err()
            .expect("a non-loopback metrics address is refused")
    );
    assert!(err.contains("loopback"), "{err}");
}
