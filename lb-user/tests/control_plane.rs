//! The control plane at churn (issue 25), through `lb daemon` on a real node: what a change
//! costs does not grow with the state (counted, on both dataplanes); partial updates keep
//! flows; a `kill -9` at any point of a stream of changes leaves the old or the new state,
//! never a mix, with the dataplane matching it; a `state.json` of an earlier lb is taken
//! over; a store that cannot be read is refused with the way out and the running dataplane
//! left as it is; a new, empty store leaves what it finds. Root only.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    fuzz::Rng,
    netns::Topology,
    require_root, scale,
    traffic::{Reply, TIMEOUT, TcpSession, spawn_backends, tcp_request},
};
use lb_user::{
    api::{Client, Done, Request},
    core::{
        compose::compose,
        edit::Edit,
        model::{Backend, DesiredState},
    },
    dataplane::ebpf::{EbpfNetwork, MapAddr, MapSizes, OnIncompatible, plan},
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

fn start(bpffs: &Bpffs, dataplane: &str) -> LbDaemon {
    LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).expect("lb daemon starts")
}

/// The counted cost of the last change (`lb status`'s `last_change`), without its revision
/// and time.
fn last_change(d: &LbDaemon) -> BTreeMap<String, u64> {
    let v: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    let c = v["last_change"].as_object().expect("a change was made");
    (c.iter())
        .filter(|(k, _)| *k != "revision" && *k != "micros")
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect()
}

/// Per-change work, counted, at 1,000 and at 10,000 services of 10 backends: a backend
/// drained, one replaced by `lb service set`, and a backend added: each costs the same
/// number of contributions checked, sets composed, address dumps (none), store keys and map
/// entries (eBPF) or elements (nftables) at both sizes.
#[test]
fn per_change_work_does_not_grow_with_the_state() {
    if !require_root("per_change_work_does_not_grow_with_the_state") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    for dataplane in ["ebpf", "nftables"] {
        let mut work = Vec::new();
        for n in [1_000u32, 10_000] {
            let bpffs = Bpffs::new().unwrap();
            let d = start(&bpffs, dataplane);
            let state = scale::state(
                "big",
                topo.node.name(),
                &topo.node_ifaces,
                scale::services(n, 10, PORT),
            );
            let file = d.state_dir().with_file_name("big.json");
            std::fs::write(&file, state.to_json()).unwrap();
            d.ok(&["apply", "-f", file.to_str().unwrap()]);
            let s = &state.networks[0].services[n as usize / 2];
            let b = s.backends[3].ip.to_string();
            let mut costs = Vec::new();
            d.ok(&["service", "backend", "disable", "big", &s.id, &b]);
            costs.push(("drain", last_change(&d)));
            d.ok(&scale::one_backend_changed(
                "big",
                s,
                Ipv4Addr::new(100, 200, 0, 1),
            ));
            costs.push(("replace", last_change(&d)));
            d.ok(&["service", "backend", "add", "big", &s.id, "100.200.0.2"]);
            costs.push(("add", last_change(&d)));
            println!("{dataplane} at {n} services: {costs:?}");
            for (what, c) in &costs {
                assert_eq!(c["validated"], 1, "{what}: {c:?}");
                assert_eq!(c["address_dumps"], 0, "{what}: {c:?}");
                assert!(c["written"] + c["deleted"] > 0, "{what} was applied: {c:?}");
            }
            work.push(costs);
        }
        for ((what, small), (_, large)) in work[0].iter().zip(&work[1]) {
            for (k, v) in small {
                // The address filter (`lb_addr_filter`, one entry) is written only where a new
                // backend's bit is not admitted already: a matter of hash collisions, which
                // more addresses make likelier.
                let slack = u64::from(dataplane == "ebpf" && k == "written");
                assert!(
                    v.abs_diff(large[k]) <= slack,
                    "{dataplane} {what}: {k} is {v} at 1,000 services and {} at 10,000",
                    large[k]
                );
            }
        }
    }
}

/// Partial updates with traffic: a backend drained with one command keeps its connections
/// (every one answers on its backend) and gets no new ones; enabled again it does; `lb
/// network set` switches masquerade, a timeout and the attach mode with every connection
/// kept; a batch with one change that cannot be made changes nothing and names the change.
#[test]
fn partial_updates_keep_flows() {
    if !require_root("partial_updates_keep_flows") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs, "ebpf");
    d.ok(&network_add(&topo, "web"));
    d.ok(&service_set(
        "web",
        "api",
        "1",
        VIP,
        &format!("tcp/{PORT}"),
        &topo.backend_ips,
    ));
    let backend_of = |r: &str| -> String { r.split(' ').next().unwrap().to_owned() };
    let mut sessions = Vec::new();
    let mut first = Vec::new();
    for _ in 0..24 {
        let mut s = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
        first.push(backend_of(&s.ask().unwrap()));
        sessions.push(s);
    }
    let drained = first[0].clone();
    // spawn_backends names backend i "b{i}".
    let index: usize = drained.trim_start_matches('b').parse().unwrap();
    let ip = topo.backend_ips[index].to_string();
    let still = |what: &str, sessions: &mut Vec<TcpSession>| {
        for (i, (s, b)) in sessions.iter_mut().zip(&first).enumerate() {
            let now = s
                .ask()
                .unwrap_or_else(|e| panic!("connection {i} after {what}: {e:#}"));
            assert_eq!(
                &backend_of(&now),
                b,
                "connection {i} after {what}: its backend"
            );
        }
    };
    d.ok(&["service", "backend", "disable", "web", "api", &ip]);
    still("the drain", &mut sessions);
    for _ in 0..30 {
        let r = tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
        assert_ne!(
            backend_of(&r),
            drained,
            "a drained backend gets no new flows"
        );
    }
    let services: Value = serde_json::from_str(&d.ok(&["service", "list", "web", "-j"])).unwrap();
    let states: Vec<&str> = (services[0]["backends"].as_array().unwrap().iter())
        .map(|b| b["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == "disabled").count(),
        1,
        "{services}"
    );
    d.ok(&["service", "backend", "enable", "web", "api", &ip]);
    let mut seen = BTreeSet::new();
    for _ in 0..60 {
        let r = tcp_request(&topo.client, VIP, PORT, TIMEOUT).unwrap();
        seen.insert(backend_of(&r));
    }
    assert!(
        seen.contains(&drained),
        "enabled again, it takes new flows: {seen:?}"
    );
    still("the enable", &mut sessions);

    for (what, args) in [
        ("masquerade always", vec!["--masquerade", "always"]),
        ("a timeout", vec!["--timeout", "tcp_established=3600"]),
        ("attach xdp", vec!["--attach", "xdp"]),
        ("attach tc", vec!["--attach", "tc"]),
        (
            "the timeout's default",
            vec!["--timeout", "tcp_established=default"],
        ),
    ] {
        let mut cmd = vec!["network", "set", "web"];
        cmd.extend(args);
        let out = d.ok(&cmd);
        assert!(out.contains("~ network web"), "{what}: {out}");
        still(what, &mut sessions);
    }
    let state: DesiredState = serde_json::from_str(&d.ok(&["state"])).unwrap();
    let n = &state.networks[0];
    assert_eq!(n.masquerade.as_str(), "always");
    assert!(n.timeouts.is_default(), "{:?}", n.timeouts);

    // All or nothing.
    let batch = serde_json::json!({"changes": [
        {"op": "backend_disable", "network": "web", "service": "api", "ip": topo.backend_ips[1].to_string()},
        {"op": "backend_add", "network": "web", "service": "api", "backend": {"ip": VIP.to_string()}},
    ]});
    let file = d.state_dir().with_file_name("batch.json");
    std::fs::write(&file, batch.to_string()).unwrap();
    let r = d.cli(&["batch", "-f", file.to_str().unwrap()]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("change 1: rejected"), "{r:?}");
    assert_eq!(
        serde_json::from_str::<DesiredState>(&d.ok(&["state"])).unwrap(),
        state,
        "nothing of the batch"
    );
}

/// The state's services `a` and `b` as the stream below writes them: the backends of each.
fn backends(state: &DesiredState) -> [BTreeSet<IpAddr>; 2] {
    let of = |id: &str| -> BTreeSet<IpAddr> {
        (state.networks[0].services.iter())
            .find(|s| s.id == id)
            .map(|s| s.backends.iter().map(|b| b.ip).collect())
            .unwrap_or_default()
    };
    [of("a"), of("b")]
}

/// Backend `k` of the stream.
fn nth(k: u32) -> IpAddr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + k).into()
}

/// Change `k` of the stream: backend `k` added to both services and backend `k - 20` taken
/// out of both, one batch (so the two services always list the same backends).
fn change(k: u32) -> Vec<Edit> {
    let mut out = Vec::new();
    for s in ["a", "b"] {
        out.push(Edit::BackendAdd {
            network: "crash".into(),
            service: s.into(),
            generation: None,
            backend: Backend {
                ip: nth(k),
                disabled: false,
            },
        });
        if k >= 20 {
            out.push(Edit::BackendRm {
                network: "crash".into(),
                service: s.into(),
                generation: None,
                ip: nth(k - 20),
            });
        }
    }
    out
}

/// What the stream's state is once change `k` is in: backends `k - 19` to `k`.
fn after(k: u32) -> BTreeSet<IpAddr> {
    (k.saturating_sub(19)..=k).map(nth).collect()
}

/// The maps of network `net` under `bpffs` hold what its desired state composes: every
/// service entry, with its set, slot for slot.
fn maps_match(bpffs: &Path, state: &DesiredState) {
    let n = &state.networks[0];
    let net = EbpfNetwork::open(
        &bpffs.join(&n.name),
        &MapSizes::default(),
        OnIncompatible::Refuse,
    )
    .expect("opening the pinned maps");
    let held: BTreeMap<_, Vec<(MapAddr, u16)>> = (net.current_services().unwrap().into_iter())
        .map(|(k, (_, set))| (k, set.iter().map(|b| (b.addr, b.port)).collect()))
        .collect();
    assert_eq!(
        held,
        plan(n, &compose(n)).services,
        "the maps hold the state"
    );
}

/// `kill -9` at random points of a stream of changes, 200 times: after each restart every
/// acknowledged change is in the state, the one in flight wholly or not at all, and the maps
/// hold what the state composes.
#[test]
fn kill_9_during_a_stream_of_changes_leaves_the_old_or_the_new_state() {
    if !require_root("kill_9_during_a_stream_of_changes_leaves_the_old_or_the_new_state") {
        return;
    }
    const KILLS: u32 = 200;
    let topo = Topology::new(1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, "ebpf");
    d.ok(&network_add(&topo, "crash"));
    for (id, vip) in [("a", "10.99.0.1"), ("b", "10.99.0.2")] {
        d.ok(&["service", "set", "crash", id, "--vip", vip]);
    }
    let mut rng = Rng::new(0x25);
    // The last change acknowledged; the next to send.
    let mut acked: Option<u32> = None;
    let mut next = 0u32;
    let (mut mid_change, mut between) = (0, 0);
    for kill in 0..KILLS {
        let pid = d.pid().expect("running");
        let delay = Duration::from_micros(rng.range(0, 40_000) as u64);
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        });
        let client = Client::new(&d.socket());
        let in_flight = loop {
            let req = Request::Changes {
                changes: change(next),
                dry_run: false,
            };
            match client.call::<Done>(&req) {
                Ok(_) => {
                    acked = Some(next);
                    next += 1;
                }
                Err(_) => break next,
            }
        };
        killer.join().unwrap();
        d.kill9();
        d.restart().unwrap();
        let state: DesiredState = serde_json::from_str(&d.ok(&["state"])).unwrap();
        let [a, b] = backends(&state);
        assert_eq!(
            a, b,
            "kill {kill}: a change is wholly in or out: {a:?} / {b:?}"
        );
        let old = acked.map(after).unwrap_or_default();
        let new = after(in_flight);
        if a == new {
            mid_change += 1;
            acked = Some(in_flight);
            next = in_flight + 1;
        } else {
            assert_eq!(
                a, old,
                "kill {kill}: every acknowledged change, and no part of change {in_flight}"
            );
            between += 1;
        }
        if kill % 50 == 49 || kill + 1 == KILLS {
            maps_match(bpffs.path(), &state);
        }
        let status: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
        assert_eq!(
            status["networks"][0]["applied"], true,
            "kill {kill}: {status}"
        );
    }
    println!(
        "{KILLS} kills: {} changes acknowledged; the change in flight was in the state after {mid_change} restarts and out after {between}",
        next
    );
    assert!(
        next > KILLS,
        "changes went through between the kills: {next}"
    );
}

/// A `state.json` of an earlier lb is taken over on first start (the same state, served); a
/// store that cannot be read (truncated, or not a store) stops the start with the way out
/// and leaves the running dataplane as it is; `--import` of an export is that way out; a
/// new, empty store leaves the networks it finds on the node, until one of that name is
/// applied.
#[test]
fn migration_a_broken_store_and_a_new_one() {
    if !require_root("migration_a_broken_store_and_a_new_one") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, "ebpf");
    d.ok(&network_add(&topo, "old"));
    d.ok(&service_set(
        "old",
        "api",
        "1",
        VIP,
        &format!("tcp/{PORT}"),
        &topo.backend_ips,
    ));
    let state: DesiredState = serde_json::from_str(&d.ok(&["state"])).unwrap();
    let answers = || tcp_request(&topo.client, VIP, PORT, TIMEOUT).map(|r| r.parse::<Reply>());
    answers().expect("served").unwrap();
    d.stop();
    // As an lb before the store left its state dir.
    let dir = d.state_dir();
    std::fs::remove_file(dir.join("state.redb")).unwrap();
    std::fs::write(dir.join("state.json"), state.to_json()).unwrap();
    d.restart().unwrap();
    assert_eq!(
        serde_json::from_str::<DesiredState>(&d.ok(&["state"])).unwrap(),
        state,
        "taken over with nothing lost"
    );
    assert!(dir.join("state.json.migrated").exists() && !dir.join("state.json").exists());
    answers().expect("served after the migration").unwrap();
    d.stop();

    // Broken stores: refused, the dataplane serving on.
    let store = dir.join("state.redb");
    let good = std::fs::read(&store).unwrap();
    for (what, bytes) in [
        ("truncated", good[..good.len() / 3].to_vec()),
        ("not a store", b"{\"networks\": []}\n".to_vec()),
    ] {
        std::fs::write(&store, &bytes).unwrap();
        let e = d.restart().expect_err(what);
        let e = format!("{e:#}");
        assert!(
            e.contains("cannot be read") && e.contains("lb daemon --import FILE"),
            "{what}: {e}"
        );
        answers()
            .unwrap_or_else(|e| panic!("{what}: the dataplane stays: {e:#}"))
            .unwrap();
        assert!(bpffs.path().join("old").exists(), "{what}: pins kept");
    }
    let export = dir.join("state.json.migrated");
    d.restart_with_state(&std::fs::read_to_string(&export).unwrap())
        .unwrap();
    assert_eq!(
        serde_json::from_str::<DesiredState>(&d.ok(&["state"])).unwrap(),
        state,
        "imported"
    );
    answers().expect("served after the import").unwrap();
    d.stop();

    // A new, empty store: what is on the node stays, said in the status.
    std::fs::remove_file(&store).unwrap();
    d.restart().unwrap();
    let status: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert_eq!(status["left"], serde_json::json!(["old"]), "{status}");
    answers().expect("left as it was").unwrap();
    d.restart().unwrap();
    answers()
        .expect("still left after another restart")
        .unwrap();
    let file = dir.with_file_name("again.json");
    std::fs::write(&file, state.to_json()).unwrap();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
    let status: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert!(status.get("left").is_none(), "taken over: {status}");
    answers().expect("served by the state applied").unwrap();
}

/// A backend removed while a connection to it drains, then a new backend added: the new
/// backend's counters show only its own packets, never the draining connection's (on eBPF
/// its counter id is not handed out while a flow names it; on nftables every element has a
/// counter of its own).
#[test]
fn a_new_backend_counts_only_its_own_packets() {
    if !require_root("a_new_backend_counts_only_its_own_packets") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let [b0, b1, b2] = [0, 1, 2].map(|i| topo.backend_ips[i].to_string());
    for dataplane in ["ebpf", "nftables"] {
        let bpffs = Bpffs::new().unwrap();
        let d = start(&bpffs, dataplane);
        d.ok(&network_add(&topo, "web"));
        d.ok(&service_set(
            "web",
            "api",
            "1",
            VIP,
            &format!("tcp/{PORT}"),
            &topo.backend_ips[..2],
        ));
        let packets = |d: &LbDaemon, ip: &str| -> u64 {
            let list: Value =
                serde_json::from_str(&d.ok(&["service", "list", "web", "-j"])).unwrap();
            let api = (list.as_array().unwrap().iter())
                .find(|e| e["service"]["id"] == "api")
                .unwrap();
            (api["backends"].as_array().unwrap().iter())
                .find(|b| b["address"] == ip)
                .map_or(0, |b| b["packets"].as_u64().unwrap_or(0))
        };
        // A connection to b0, kept open.
        let mut draining = (0..64)
            .map(|_| TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap())
            .find_map(|mut s| s.ask().unwrap().starts_with("b0 ").then_some(s))
            .expect("a connection lands on b0");
        d.ok(&["service", "backend", "rm", "web", "api", &b0]);
        // Two more syncs: the first deletes what b0's removal retired, the second would
        // hand its counter id out again, to b2.
        d.ok(&["service", "set", "web", "other", "--vip", "10.99.0.77"]);
        d.ok(&["service", "backend", "add", "web", "api", &b2]);
        // The connections that landed elsewhere were closed as they were found; their last
        // segments may still be on the way and count to b1. Read b1 once it holds still.
        let mut b1_before = packets(&d, &b1);
        for _ in 0..25 {
            std::thread::sleep(Duration::from_millis(200));
            let now = packets(&d, &b1);
            if now == b1_before {
                break;
            }
            b1_before = now;
        }
        const ASKS: u64 = 30;
        for i in 0..ASKS {
            let r = draining
                .ask()
                .unwrap_or_else(|e| panic!("{dataplane}: ask {i}: {e:#}"));
            assert!(
                r.starts_with("b0 "),
                "{dataplane}: the removed backend drains: {r}"
            );
        }
        // Each ask is at least one segment client → backend: mislabelled, the draining
        // connection would add at least ASKS to b1; a stray closing segment adds one or two.
        let b1_gained = packets(&d, &b1) - b1_before;
        assert!(
            b1_gained < ASKS,
            "{dataplane}: b1 counts nothing of it (gained {b1_gained} over {ASKS} asks)"
        );
        assert_eq!(
            packets(&d, &b2),
            0,
            "{dataplane}: b2 has carried nothing yet, whatever b0's connection sent"
        );
        let mut hit = false;
        for _ in 0..40 {
            if tcp_request(&topo.client, VIP, PORT, TIMEOUT)
                .unwrap()
                .starts_with("b2 ")
            {
                hit = true;
            }
        }
        assert!(hit, "{dataplane}: b2 is served");
        assert!(
            packets(&d, &b2) > 0,
            "{dataplane}: and counts its own packets"
        );
    }
}

/// The watch over the socket: `lb watch -j` prints every change once, in order, with its
/// revision, as it is applied; a watcher that comes back with the last revision it read gets
/// what it missed, then what follows (`daemon_logic.rs` covers a revision older than the
/// history kept).
#[test]
fn the_watch_streams_every_change_and_what_a_watcher_missed() {
    if !require_root("the_watch_streams_every_change_and_what_a_watcher_missed") {
        return;
    }
    use std::io::BufRead as _;
    let topo = Topology::new(2).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs, "ebpf");
    d.ok(&network_add(&topo, "web"));
    d.ok(&["service", "set", "web", "api", "--vip", &VIP.to_string()]);
    let watch = |from: Option<u64>| {
        let mut cmd = std::process::Command::new(lb());
        cmd.args(["watch", "-j", "--socket", d.socket().to_str().unwrap()]);
        if let Some(r) = from {
            cmd.args(["--from", &r.to_string()]);
        }
        let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
        // Lines through a channel, so that a missing one fails the test instead of hanging it.
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    };
    let revision = |d: &LbDaemon| -> u64 {
        let v: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
        v["store"]["revision"].as_u64().unwrap()
    };
    let read = |lines: &mut std::sync::mpsc::Receiver<String>, n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                let line = (lines.recv_timeout(Duration::from_secs(20)))
                    .unwrap_or_else(|e| panic!("event {i} of {n}: none within 20 s ({e})"));
                serde_json::from_str(&line).unwrap()
            })
            .collect()
    };
    // From the revision now: whenever it connects, it misses nothing after it.
    let start_rev = revision(&d);
    let (mut live, mut live_lines) = watch(Some(start_rev));
    let ips: Vec<String> = (1..=6).map(|i| format!("10.20.9.{i}")).collect();
    for ip in &ips[..3] {
        d.ok(&["service", "backend", "add", "web", "api", ip]);
    }
    let events = read(&mut live_lines, 3);
    let revs: Vec<u64> = events
        .iter()
        .map(|e| e["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(
        revs,
        [start_rev + 1, start_rev + 2, start_rev + 3],
        "{events:?}"
    );
    for (e, ip) in events.iter().zip(&ips) {
        // Sent live (applied) or, made before the watcher connected, from the history.
        assert!(e["applied"] == true || e["applied"].is_null(), "{e}");
        assert_eq!(e["changes"][0]["backend"], ip.as_str(), "{e}");
    }
    let _ = live.kill();
    let _ = live.wait();
    // Missed while away: three more.
    for ip in &ips[3..] {
        d.ok(&["service", "backend", "add", "web", "api", ip]);
    }
    let (mut back, mut back_lines) = watch(Some(start_rev + 3));
    let missed = read(&mut back_lines, 3);
    let revs: Vec<u64> = missed
        .iter()
        .map(|e| e["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(
        revs,
        [start_rev + 4, start_rev + 5, start_rev + 6],
        "{missed:?}"
    );
    d.ok(&["service", "backend", "disable", "web", "api", &ips[0]]);
    let next = read(&mut back_lines, 1);
    assert_eq!(next[0]["revision"], start_rev + 7, "then live: {next:?}");
    let _ = back.kill();
    let _ = back.wait();
}
