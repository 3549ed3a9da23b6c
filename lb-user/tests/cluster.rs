//! Many nodes, one desired state (issue 26): a real three-member etcd cluster (Debian's
//! etcd-server) and three `lb daemon --cluster` nodes, each in namespaces of its own with a
//! client and backends and a link to the etcd segment; services written once with
//! `lb --cluster` (no daemon) and served by every node. Root only.
use std::{
    net::Ipv4Addr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, Run, network_add},
    etcd::EtcdCluster,
    netns::Topology,
    require_root,
    traffic::{Backend, TIMEOUT, TcpSession, spawn_backends, tcp_request},
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
/// Where a node's metrics are served, in its own namespace.
const METRICS: &str = "127.0.0.1:9464";

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// One lb node: its namespaces (client, node, backends), its backends' servers, its bpffs
/// and its daemon, run inside the node's namespace with a link to the etcd segment.
struct Node {
    name: String,
    topo: Topology,
    _servers: Vec<Backend>,
    _bpffs: Bpffs,
    daemon: LbDaemon,
    /// The node's link to the etcd segment.
    link: String,
}

/// `etcd://` of every member.
fn url(etcd: &EtcdCluster) -> String {
    let members: Vec<String> = (etcd.endpoints().iter())
        .map(|e| {
            (e.strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://")))
            .unwrap_or(e)
            .to_owned()
        })
        .collect();
    format!("etcd://{}", members.join(","))
}

impl Node {
    fn start(etcd: &mut EtcdCluster, i: usize) -> Node {
        Self::start_with(etcd, i, &[])
    }

    /// [`Node::start`] with `extra` daemon flags.
    fn start_with(etcd: &mut EtcdCluster, i: usize, extra: &[&str]) -> Node {
        let topo = Topology::new(2).unwrap();
        let servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
        let link = "etcd0".to_owned();
        etcd.attach(&topo.node, &link).unwrap();
        let bpffs = Bpffs::new().unwrap();
        let name = format!("n{i}");
        let cluster = url(etcd);
        let mut args = vec![
            "--cluster".to_owned(),
            cluster,
            "--node".to_owned(),
            name.clone(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let daemon = LbDaemon::start_wrapped(
            lb(),
            bpffs.path(),
            &["ip", "netns", "exec", topo.node.name()],
            &args,
        )
        .unwrap();
        let mut node = Node {
            name,
            topo,
            _servers: servers,
            _bpffs: bpffs,
            daemon,
            link,
        };
        node.daemon.ok(&network_add(&node.topo, "web"));
        node.daemon.set_extra(&args);
        node
    }

    /// Cuts this node off etcd (its link to the segment down), or heals it.
    fn partition(&self, cut: bool) {
        let state = if cut { "down" } else { "up" };
        (self.topo.node)
            .ip(["link", "set", self.link.as_str(), state])
            .unwrap();
    }

    /// Asserts that this node's log has each revision it applied once, in increasing order.
    fn assert_revisions_in_order(&self) {
        let applied = self.applied_revisions();
        assert!(
            applied.windows(2).all(|w| w[0] < w[1]),
            "{}: each revision once, in increasing order: {applied:?}",
            self.name
        );
    }

    /// The etcd revisions this node's log says it applied, in the order it applied them.
    fn applied_revisions(&self) -> Vec<i64> {
        (self.daemon.log().lines())
            .filter(|l| {
                l.contains("cluster revision applied") || l.contains("cluster listing applied")
            })
            .filter_map(|l| {
                let at = l.find(" revision=")? + " revision=".len();
                let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .collect()
    }

    /// This node's service `id` of network web as it serves it: (backend, state) pairs.
    fn backends(&self, id: &str) -> Vec<(String, String)> {
        backends(&self.daemon, id)
    }

    fn backend(&self, i: usize) -> String {
        self.topo.backend_ips[i].to_string()
    }

    /// `lb --cluster URL ARGS` run from this node's namespace (a writer on this node).
    fn write<S: AsRef<str>>(&self, etcd: &EtcdCluster, args: &[S]) -> Run {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.topo.node.name()])
            .arg(lb())
            .args(["--cluster", &url(etcd)]);
        for a in args {
            cmd.arg(a.as_ref());
        }
        cmd.output().unwrap().into()
    }

    fn write_ok<S: AsRef<str>>(&self, etcd: &EtcdCluster, args: &[S]) -> String {
        let r = self.write(etcd, args);
        assert!(r.ok(), "{}: lb --cluster: {r:?}", self.name);
        r.stdout
    }

    fn status(&self) -> Value {
        status(&self.daemon)
    }

    /// The backend that answers a new connection to the VIP from this node's client.
    fn ask(&self) -> Result<String, String> {
        tcp_request(&self.topo.client, VIP, PORT, TIMEOUT)
            .map(|r| r.split(' ').next().unwrap_or_default().to_owned())
            .map_err(|e| format!("{e:#}"))
    }
}

fn status(d: &LbDaemon) -> Value {
    serde_json::from_str(&d.ok(&["status", "--json"])).unwrap()
}

/// Service `id` of network web as daemon `d` serves it: (backend, state) pairs.
fn backends(d: &LbDaemon, id: &str) -> Vec<(String, String)> {
    let list: Value = serde_json::from_str(&d.ok(&["service", "list", "web", "-j"])).unwrap();
    let Some(entry) = (list.as_array().unwrap().iter()).find(|e| e["service"]["id"] == id) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = (entry["backends"].as_array().unwrap().iter())
        .map(|b| {
            (
                b["address"].as_str().unwrap().to_owned(),
                b["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Waits up to `limit` for `cond` on daemon `d`.
fn within(d: &LbDaemon, limit: Duration, what: &str, cond: impl Fn() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match cond() {
            Ok(()) => return,
            Err(e) if start.elapsed() > limit => {
                panic!("{what}: not there within {limit:?}: {e}\n{}", d.log())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// One cluster test at a time: each runs three etcd members and three nodes.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cluster's service `id` of network web as `lb --cluster state` has it: (backend,
/// state) pairs, as [`Node::backends`] gives a node's.
fn cluster_backends(etcd: &EtcdCluster, writer: &Node, id: &str) -> Vec<(String, String)> {
    let state: Value = serde_json::from_str(&writer.write_ok(etcd, &["state", "-j"])).unwrap();
    let Some(service) = (state["networks"].as_array().unwrap().iter())
        .filter(|n| n["name"] == "web")
        .flat_map(|n| n["services"].as_array().unwrap())
        .find(|s| s["id"] == id)
    else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = (service["backends"].as_array().unwrap().iter())
        .map(|b| {
            let state = if b["disabled"] == true {
                "disabled"
            } else {
                "active"
            };
            (b["ip"].as_str().unwrap().to_owned(), state.to_owned())
        })
        .collect();
    out.sort();
    out
}

/// `service set web ID --vip VIP --backend B[,disabled]…` as arguments (every port of the
/// VIP balanced).
fn set(id: &str, vip: Ipv4Addr, backends: &[String]) -> Vec<String> {
    let mut args: Vec<String> = ["service", "set", "web", id, "--vip", &vip.to_string()]
        .map(String::from)
        .into();
    for b in backends {
        args.extend(["--backend".to_owned(), b.clone()]);
    }
    args
}

/// A test's cluster: three etcd members and `n` nodes, one test at a time (the guard), and
/// the backends' addresses b0 and b1 (the same on every node).
struct Fleet {
    _one: std::sync::MutexGuard<'static, ()>,
    etcd: EtcdCluster,
    nodes: Vec<Node>,
    b0: String,
    b1: String,
}

fn fleet(n: usize) -> Fleet {
    fleet_with(n, &[])
}

/// [`fleet`] with `extra` flags for every node's daemon.
fn fleet_with(n: usize, extra: &[&str]) -> Fleet {
    let one = serial();
    let mut etcd = EtcdCluster::start(3).unwrap();
    let nodes: Vec<Node> = (0..n)
        .map(|i| Node::start_with(&mut etcd, i, extra))
        .collect();
    let (b0, b1) = (nodes[0].backend(0), nodes[0].backend(1));
    Fleet {
        _one: one,
        etcd,
        nodes,
        b0,
        b1,
    }
}

/// A connection from `client` to the VIP that landed on b0, kept open by the caller.
fn session_to_b0(client: &lb_tests::netns::Netns) -> TcpSession {
    (0..64)
        .map(|_| TcpSession::connect(client, VIP, PORT, TIMEOUT).unwrap())
        .find_map(|mut s| s.ask().unwrap().starts_with("b0 ").then_some(s))
        .expect("a connection lands on b0")
}

/// Waits up to `within` for `cond` on every node; the time it took.
fn on_every_node(
    nodes: &[Node],
    limit: Duration,
    what: &str,
    cond: impl Fn(&Node) -> Result<(), String>,
) -> Duration {
    let start = Instant::now();
    for n in nodes {
        let left = limit.saturating_sub(start.elapsed());
        within(
            &n.daemon,
            left,
            &format!("{what} on node {}", n.name),
            || cond(n),
        );
    }
    start.elapsed()
}

/// A service written once through one node's writer is served by all three nodes within
/// 5 s (each node's client answered by the service's backends); a backend drained once is
/// drained everywhere, the connections it has kept.
#[test]
fn a_service_written_once_is_served_by_every_node_and_drained_everywhere() {
    if !require_root("a_service_written_once_is_served_by_every_node_and_drained_everywhere") {
        return;
    }
    let Fleet {
        etcd,
        nodes,
        b0,
        b1,
        ..
    } = fleet(3);
    nodes[1].write_ok(
        &etcd,
        &[
            "service",
            "set",
            "web",
            "api",
            "--vip",
            &VIP.to_string(),
            "--port",
            &format!("tcp/{PORT}"),
            "--backend",
            &b0,
            "--backend",
            &b1,
        ],
    );
    let took = on_every_node(&nodes, Duration::from_secs(5), "served", |n| {
        let who = n.ask()?;
        if who == "b0" || who == "b1" {
            Ok(())
        } else {
            Err(format!("answered by {who}"))
        }
    });
    println!("served on every node {took:?} after the write");
    for n in &nodes {
        let c = &n.status()["cluster"];
        assert_eq!(c["connected"], true, "{}: {c}", n.name);
        assert_eq!(c["services"], 1, "{}: {c}", n.name);
        assert_eq!(c["refused"], serde_json::json!([]), "{}: {c}", n.name);
    }

    // A connection to b0 on every node, kept open through the drain.
    let mut kept: Vec<TcpSession> = (nodes.iter())
        .map(|n| session_to_b0(&n.topo.client))
        .collect();
    nodes[2].write_ok(&etcd, &["service", "backend", "disable", "web", "api", &b0]);
    let took = on_every_node(&nodes, Duration::from_secs(5), "drained", |n| {
        let list: Value =
            serde_json::from_str(&n.daemon.ok(&["service", "list", "web", "-j"])).unwrap();
        let state = (list[0]["backends"].as_array().unwrap().iter())
            .find(|b| b["address"] == b0.as_str())
            .map(|b| b["state"].clone());
        if state == Some(Value::from("disabled")) {
            Ok(())
        } else {
            Err(format!("b0 is {state:?}"))
        }
    });
    println!("drained on every node {took:?} after the write");
    for (n, s) in nodes.iter().zip(&mut kept) {
        for _ in 0..20 {
            assert_eq!(
                n.ask().unwrap(),
                "b1",
                "{}: a new connection to b1 only",
                n.name
            );
        }
        let r = s.ask().unwrap();
        assert!(
            r.starts_with("b0 "),
            "{}: the drained backend keeps its connection: {r}",
            n.name
        );
    }
}

/// The etcd leader killed (by its pid) during a stream of changes from a writer: within 30 s
/// of the last write every node has every acknowledged change (its service is the cluster's
/// and its revision at least the last acknowledged one), and each node's log of applied
/// revisions has each revision once, in increasing order.
#[test]
fn the_leader_killed_during_a_stream_of_changes_loses_no_acknowledged_change() {
    if !require_root("the_leader_killed_during_a_stream_of_changes_loses_no_acknowledged_change") {
        return;
    }
    let Fleet {
        mut etcd,
        nodes,
        b0,
        b1,
        ..
    } = fleet(3);
    let mut acked: Vec<i64> = Vec::new();
    let mut failed = 0;
    let mut killed = None;
    for i in 0..40 {
        if i == 15 {
            let leader = etcd.leader().unwrap();
            let pid = etcd.kill(leader).unwrap();
            println!("killed the leader, member {leader} (pid {pid}), after write {i}");
            killed = Some(leader);
        }
        let b1 = if i % 2 == 0 {
            b1.clone()
        } else {
            format!("{b1},disabled")
        };
        let mut args = set("api", VIP, &[b0.clone(), b1]);
        args.push("-j".into());
        let r = nodes[0].write(&etcd, &args);
        if r.ok() {
            let done: Value = serde_json::from_str(&r.stdout).unwrap();
            acked.push(done["revision"].as_i64().unwrap());
        } else {
            failed += 1;
            println!("write {i} not acknowledged: {}", r.stderr.trim());
        }
    }
    let last_write = Instant::now();
    println!("{} writes acknowledged, {failed} not", acked.len());
    assert!(
        acked.len() >= 20,
        "the cluster took writes after the election"
    );
    assert!(killed.is_some());
    let last = *acked.iter().max().unwrap();
    let want = cluster_backends(&etcd, &nodes[1], "api");
    let took = on_every_node(&nodes, Duration::from_secs(30), "converged", |n| {
        let c = &n.status()["cluster"];
        let revision = c["revision"].as_i64().unwrap_or(0);
        if revision < last {
            return Err(format!(
                "at revision {revision}, the last acknowledged is {last}"
            ));
        }
        let have = n.backends("api");
        if have != want {
            return Err(format!("serves {have:?}, the cluster has {want:?}"));
        }
        Ok(())
    });
    println!(
        "every node converged {:?} after the last write ({took:?} of waiting)",
        last_write.elapsed()
    );
    for n in &nodes {
        n.assert_revisions_in_order();
        let applied = n.applied_revisions();
        for r in &acked {
            assert!(
                applied.iter().any(|a| a >= r),
                "{}: acknowledged revision {r} not applied: {applied:?}",
                n.name
            );
        }
    }
}

/// One node cut off etcd while its client's traffic runs: no request of it fails, a daemon
/// restarted meanwhile serves its last state (and says etcd is away), and what the cluster
/// changed meanwhile is applied within 10 s of the heal.
#[test]
fn a_partitioned_node_serves_on_restarts_with_its_last_state_and_converges_after_the_heal() {
    if !require_root(
        "a_partitioned_node_serves_on_restarts_with_its_last_state_and_converges_after_the_heal",
    ) {
        return;
    }
    let Fleet {
        etcd,
        mut nodes,
        b0,
        b1,
        ..
    } = fleet(3);
    nodes[0].write_ok(&etcd, &set("api", VIP, &[b0.clone(), b1.clone()]));
    on_every_node(&nodes, Duration::from_secs(5), "served", |n| {
        n.ask().map(drop)
    });

    // Traffic through node 2 for the whole partition.
    let (rest, last) = nodes.split_at_mut(2);
    let Node {
        topo, daemon, link, ..
    } = &mut last[0];
    let cut = |down: bool| {
        let state = if down { "down" } else { "up" };
        topo.node.ip(["link", "set", link.as_str(), state]).unwrap();
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let client = &topo.client;
    let (ok, failed) = std::thread::scope(|s| {
        let traffic = s.spawn(|| {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match tcp_request(client, VIP, PORT, TIMEOUT) {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(format!("{e:#}")),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        });
        cut(true);
        // Changes while node 2 is cut off: b1 drained, a second service.
        rest[0].write_ok(&etcd, &["service", "backend", "disable", "web", "api", &b1]);
        const VIP2: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 11);
        rest[1].write_ok(&etcd, &set("api2", VIP2, std::slice::from_ref(&b1)));
        on_every_node(rest, Duration::from_secs(5), "changed", |n| {
            (n.backends("api2").len() == 1)
                .then_some(())
                .ok_or_else(|| "no api2".to_owned())
        });
        // Node 2 finds etcd away and keeps serving; restarted, it serves its last state.
        within(daemon, Duration::from_secs(20), "etcd away", || {
            let c = status(daemon)["cluster"].clone();
            (c["connected"] == false)
                .then_some(())
                .ok_or_else(|| format!("{c}"))
        });
        daemon.restart().unwrap();
        let c = status(daemon)["cluster"].clone();
        assert_eq!(c["connected"], false, "{c}");
        assert_eq!(c["services"], 1, "the last state, from the store: {c}");
        let text = daemon.ok(&["status"]);
        assert!(
            text.contains("unreachable, serving the last services applied"),
            "{text}"
        );
        assert_eq!(
            backends(daemon, "api")[1].1,
            "active",
            "nothing of the partition yet"
        );
        std::thread::sleep(Duration::from_secs(2));
        cut(false);
        let healed = Instant::now();
        within(
            daemon,
            Duration::from_secs(10),
            "converged after the heal",
            || {
                let b = backends(daemon, "api");
                let api2 = backends(daemon, "api2");
                if b.get(1).map(|x| x.1.as_str()) != Some("disabled") || api2.is_empty() {
                    return Err(format!("api {b:?}, api2 {api2:?}"));
                }
                Ok(())
            },
        );
        println!("node 2 converged {:?} after the heal", healed.elapsed());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        traffic.join().unwrap()
    });
    println!(
        "node 2's client: {ok} requests answered, {} failed",
        failed.len()
    );
    assert!(ok > 50, "traffic ran");
    assert!(
        failed.is_empty(),
        "no request failed on the partitioned node: {failed:?}"
    );
    nodes[2].assert_revisions_in_order();
}

/// etcd's history compacted past a partitioned node's revision: after the heal the node
/// lists again and converges, and a connection it carries through it is kept.
#[test]
fn a_node_behind_a_compaction_lists_again_and_converges_keeping_its_flows() {
    if !require_root("a_node_behind_a_compaction_lists_again_and_converges_keeping_its_flows") {
        return;
    }
    let Fleet {
        etcd,
        nodes,
        b0,
        b1,
        ..
    } = fleet(3);
    nodes[0].write_ok(&etcd, &set("api", VIP, &[b0.clone(), b1.clone()]));
    on_every_node(&nodes, Duration::from_secs(5), "served", |n| {
        n.ask().map(drop)
    });
    let mut kept = session_to_b0(&nodes[1].topo.client);
    nodes[1].partition(true);
    on_every_node(&nodes[1..2], Duration::from_secs(20), "etcd away", |n| {
        let c = n.status()["cluster"].clone();
        (c["connected"] == false)
            .then_some(())
            .ok_or_else(|| format!("{c}"))
    });
    let mut last = 0;
    for i in 0..5 {
        let id = format!("more{i}");
        let done: Value = serde_json::from_str(
            &nodes[0].write_ok(
                &etcd,
                &[
                    set(&id, Ipv4Addr::new(10, 99, 1, i), std::slice::from_ref(&b1)),
                    vec!["-j".into()],
                ]
                .concat(),
            ),
        )
        .unwrap();
        last = done["revision"].as_i64().unwrap();
    }
    nodes[0].write_ok(&etcd, &["service", "backend", "disable", "web", "api", &b1]);
    let out = etcd
        .etcdctl::<&str>(&[], &["compact", &(last + 1).to_string()])
        .unwrap();
    println!("{}", out.trim());
    nodes[1].partition(false);
    on_every_node(&nodes[1..2], Duration::from_secs(15), "converged", |n| {
        let b = n.backends("api");
        let c = n.status()["cluster"].clone();
        if c["services"] != 6 || b.get(1).map(|x| x.1.as_str()) != Some("disabled") {
            return Err(format!("{c} api {b:?}"));
        }
        Ok(())
    });
    let log = nodes[1].daemon.log();
    assert!(log.contains("compacted: listing again"), "{log}");
    assert!(log.contains("cluster listing applied"), "{log}");
    let r = kept.ask().unwrap();
    assert!(
        r.starts_with("b0 "),
        "the connection through the re-list is kept: {r}"
    );
    nodes[1].assert_revisions_in_order();
}

/// Two writers racing on one key: exactly one wins, the other is told of the conflict with
/// the key's revision now; a writer that read before another wrote is refused too.
#[test]
fn two_writers_racing_on_one_service_one_wins_the_other_gets_the_conflict() {
    if !require_root("two_writers_racing_on_one_service_one_wins_the_other_gets_the_conflict") {
        return;
    }
    let Fleet {
        etcd,
        nodes,
        b0,
        b1,
        ..
    } = fleet(2);
    let race = |expected: &str| {
        let runs: Vec<Run> = std::thread::scope(|s| {
            let handles: Vec<_> = (nodes.iter().zip([&b0, &b1]))
                .map(|(n, b)| {
                    let mut args = set("race", VIP, std::slice::from_ref(b));
                    args.extend(["--if-revision".into(), expected.into(), "-j".into()]);
                    let etcd = &etcd;
                    s.spawn(move || n.write(etcd, &args))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<&Run> = runs.iter().filter(|r| r.ok()).collect();
        let lost: Vec<&Run> = runs.iter().filter(|r| !r.ok()).collect();
        assert_eq!(won.len(), 1, "exactly one wins: {runs:?}");
        assert_eq!(lost[0].code, Some(1), "{:?}", lost[0]);
        assert!(lost[0].stderr.contains("conflict"), "{:?}", lost[0]);
        let done: Value = serde_json::from_str(&won[0].stdout).unwrap();
        let revision = done["revision"].as_i64().unwrap();
        assert!(
            lost[0].stderr.contains(&format!("at revision {revision}")),
            "the loser is told the revision now: {:?}",
            lost[0]
        );
        revision
    };
    let first = race("0");
    let second = race(&first.to_string());
    assert!(second > first);
    // Both served alike: the winner's backend on every node.
    let want = cluster_backends(&etcd, &nodes[0], "race");
    assert_eq!(want.len(), 1);
    on_every_node(&nodes, Duration::from_secs(5), "the winner served", |n| {
        let have = n.backends("race");
        (have == want)
            .then_some(())
            .ok_or_else(|| format!("{have:?} vs {want:?}"))
    });

    // A node's API writes to the cluster as well: with a revision read before the last
    // write, 409 and nothing written; with the revision now, written and served everywhere.
    let api = lb_user::api::Client::new(&nodes[1].daemon.socket());
    let drain = |if_revision| lb_user::api::Request::ClusterChange {
        change: lb_user::core::edit::Edit::BackendDisable {
            network: "web".into(),
            service: "race".into(),
            generation: None,
            ip: want[0].0.parse().unwrap(),
        },
        if_revision: Some(if_revision),
    };
    let stale = api
        .call::<lb_user::api::Done>(&drain(first))
        .expect_err("a stale revision is refused");
    let refused = stale
        .downcast_ref::<lb_user::api::Refused>()
        .unwrap_or_else(|| panic!("{stale:#}"));
    assert_eq!(refused.status, 409, "{stale:#}");
    assert!(
        format!("{stale:#}").contains(&format!("at revision {second}")),
        "{stale:#}"
    );
    let done = api.call::<lb_user::api::Done>(&drain(second)).unwrap();
    assert!(done.revision.unwrap() as i64 > second, "{done:?}");
    on_every_node(
        &nodes,
        Duration::from_secs(5),
        "drained through the API",
        |n| {
            let have = n.backends("race");
            (have.first().map(|b| b.1.as_str()) == Some("disabled"))
                .then_some(())
                .ok_or_else(|| format!("{have:?}"))
        },
    );
}

/// Two services written on two nodes claiming one VIP: every node serves the one created
/// first and refuses the other (in `lb status` and in `lb nodes`); the first moved to another
/// VIP, the second is served everywhere; the first back on the VIP, it takes it again.
#[test]
fn two_services_claiming_one_vip_every_node_serves_the_same_one() {
    if !require_root("two_services_claiming_one_vip_every_node_serves_the_same_one") {
        return;
    }
    let Fleet {
        etcd,
        nodes,
        b0,
        b1,
        ..
    } = fleet_with(3, &["--metrics", METRICS]);
    nodes[0].write_ok(&etcd, &set("first", VIP, std::slice::from_ref(&b0)));
    nodes[1].write_ok(&etcd, &set("second", VIP, std::slice::from_ref(&b1)));
    let refused = |n: &Node, id: &str| -> Result<(), String> {
        let c = n.status()["cluster"].clone();
        let r = c["refused"].as_array().cloned().unwrap_or_default();
        match r.as_slice() {
            [one] if one["service"] == id && one["network"] == "web" => Ok(()),
            _ => Err(format!("refused: {r:?}")),
        }
    };
    on_every_node(&nodes, Duration::from_secs(5), "second refused", |n| {
        refused(n, "second")?;
        match n.ask()?.as_str() {
            "b0" => Ok(()),
            other => Err(format!("answered by {other}")),
        }
    });
    for n in &nodes {
        for _ in 0..10 {
            assert_eq!(
                n.ask().unwrap(),
                "b0",
                "{}: the first one's backend",
                n.name
            );
        }
    }
    let listed: Value = serde_json::from_str(&nodes[2].write_ok(&etcd, &["nodes", "-j"])).unwrap();
    let rows = listed["nodes"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{listed}");
    for row in rows {
        let r = row["refused"].as_array().unwrap();
        assert_eq!(r.len(), 1, "{row}");
        assert_eq!(r[0]["service"], "second", "{row}");
        assert!(
            r[0]["reason"].as_str().unwrap().contains("10.99.0.10"),
            "{row}"
        );
    }
    let text = nodes[2].write_ok(&etcd, &["nodes"]);
    assert!(text.contains("web/second/1"), "{text}");
    // And in the metrics of a node.
    let metrics = (nodes[0].topo.node)
        .run(|| lb_tests::daemon::scrape(METRICS))
        .unwrap()
        .unwrap();
    lb_tests::daemon::check_metrics(&metrics);
    for line in [
        "lb_cluster_connected 1",
        "lb_cluster_services 1",
        "lb_cluster_refused 1",
        "lb_cluster_lag 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }

    // The first moves: the second is let in everywhere.
    const OTHER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 12);
    nodes[2].write_ok(&etcd, &set("first", OTHER, std::slice::from_ref(&b0)));
    on_every_node(&nodes, Duration::from_secs(5), "second served", |n| {
        let c = n.status()["cluster"].clone();
        if c["refused"] != serde_json::json!([]) {
            return Err(format!("{c}"));
        }
        match n.ask()?.as_str() {
            "b1" => Ok(()),
            other => Err(format!("answered by {other}")),
        }
    });
    // And back: the older claim wins the VIP again, on every node alike.
    nodes[1].write_ok(&etcd, &set("first", VIP, std::slice::from_ref(&b0)));
    on_every_node(&nodes, Duration::from_secs(5), "first again", |n| {
        refused(n, "second")?;
        match n.ask()?.as_str() {
            "b0" => Ok(()),
            other => Err(format!("answered by {other}")),
        }
    });
}

/// A `--cluster` daemon that cannot reach etcd at its first start, with no store: it starts,
/// serves its node-local services and says why the cluster's are missing; once etcd is
/// reachable, the cluster's arrive beside them.
#[test]
fn a_node_that_cannot_reach_etcd_at_first_start_serves_its_own_services_and_says_why() {
    if !require_root(
        "a_node_that_cannot_reach_etcd_at_first_start_serves_its_own_services_and_says_why",
    ) {
        return;
    }
    let _one = serial();
    let mut etcd = EtcdCluster::start(3).unwrap();
    let writer = Node::start(&mut etcd, 0);
    let (b0, b1) = (writer.backend(0), writer.backend(1));
    writer.write_ok(&etcd, &set("api", VIP, std::slice::from_ref(&b0)));

    // A node whose link to etcd is down from the start.
    let topo = Topology::new(2).unwrap();
    let servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    etcd.attach(&topo.node, "etcd0").unwrap();
    topo.node.ip(["link", "set", "etcd0", "down"]).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let cluster = url(&etcd);
    let daemon = LbDaemon::start_wrapped(
        lb(),
        bpffs.path(),
        &["ip", "netns", "exec", topo.node.name()],
        &["--cluster", &cluster, "--node", "cut"],
    )
    .unwrap();
    let node = Node {
        name: "cut".into(),
        topo,
        _servers: servers,
        _bpffs: bpffs,
        daemon,
        link: "etcd0".into(),
    };
    node.daemon.ok(&network_add(&node.topo, "web"));
    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 20);
    node.daemon
        .ok(&set("local", LOCAL, std::slice::from_ref(&b1)));
    let answer = tcp_request(&node.topo.client, LOCAL, PORT, TIMEOUT).unwrap();
    assert!(
        answer.starts_with("b1 "),
        "the node's own service is served: {answer}"
    );
    on_every_node(
        std::slice::from_ref(&node),
        Duration::from_secs(10),
        "says why",
        |n| {
            let c = n.status()["cluster"].clone();
            let error = c["last_error"].as_str().unwrap_or_default().to_owned();
            if c["connected"] == true || error.is_empty() || error == "not connected yet" {
                return Err(format!("{c}"));
            }
            Ok(())
        },
    );
    let text = node.daemon.ok(&["status"]);
    assert!(
        text.contains("unreachable, serving the last services applied"),
        "{text}"
    );
    assert!(text.contains("0 services served"), "{text}");
    println!(
        "{}",
        text.lines().find(|l| l.starts_with("cluster:")).unwrap()
    );
    node.partition(false);
    on_every_node(
        std::slice::from_ref(&node),
        Duration::from_secs(15),
        "joined",
        |n| match n.ask()?.as_str() {
            "b0" => Ok(()),
            other => Err(format!("answered by {other}")),
        },
    );
    let answer = tcp_request(&node.topo.client, LOCAL, PORT, TIMEOUT).unwrap();
    assert!(
        answer.starts_with("b1 "),
        "and its own beside them: {answer}"
    );
    let state: Value = serde_json::from_str(&node.daemon.ok(&["state", "-j"])).unwrap();
    let ids: Vec<&str> = (state["networks"][0]["services"].as_array().unwrap().iter())
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["local"], "lb state is the node's own");
    // Applied back, the node's own state leaves the cluster's services as they are.
    let file = node.daemon.state_dir().with_file_name("own.json");
    std::fs::write(&file, node.daemon.ok(&["state"])).unwrap();
    let out = node.daemon.ok(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.contains("no changes"), "{out}");
    assert_eq!(
        node.ask().unwrap(),
        "b0",
        "the cluster's service still served"
    );
    let refused = node.daemon.cli(&["service", "rm", "web", "api"]);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("is the cluster's"), "{refused:?}");
}

/// 10,000 services of 10 backends written to etcd (`lb --cluster apply -f`, in transactions
/// of 128 keys) are applied on all three nodes; the time is reported, not asserted.
#[test]
fn ten_thousand_services_written_to_etcd_are_applied_on_every_node() {
    if !require_root("ten_thousand_services_written_to_etcd_are_applied_on_every_node") {
        return;
    }
    let Fleet { etcd, nodes, .. } = fleet(3);
    let state = lb_tests::scale::state(
        "web",
        nodes[0].topo.node.name(),
        &nodes[0].topo.node_ifaces,
        lb_tests::scale::services(10_000, 10, PORT),
    );
    let file = std::env::temp_dir().join(format!("lbt-cluster-{}.json", std::process::id()));
    std::fs::write(&file, state.to_json()).unwrap();
    let start = Instant::now();
    let out = nodes[0].write_ok(&etcd, &["apply", "-f", file.to_str().unwrap()]);
    let written = start.elapsed();
    let _ = std::fs::remove_file(&file);
    println!("{}", out.trim());
    assert!(out.contains("10000 written"), "{out}");
    let took = on_every_node(&nodes, Duration::from_secs(600), "applied", |n| {
        let c = n.status()["cluster"].clone();
        (c["services"] == 10_000)
            .then_some(())
            .ok_or_else(|| format!("{c}"))
    });
    println!(
        "cluster of 3 nodes, 10000 services × 10 backends: written to etcd in {written:?}, applied on every node {:?} after the write began",
        written + took
    );
    for n in &nodes {
        let s = n.status();
        assert_eq!(s["cluster"]["refused"], serde_json::json!([]), "{}", n.name);
        let net = &s["networks"][0];
        assert_eq!(net["applied"], true, "{}: {net}", n.name);
        assert_eq!(net["services"], 10_000, "{}: {net}", n.name);
    }

    // Then one backend drained and enabled again, five times: each write timed until every
    // node applied it, and what each node's change cost counted (the change, not the state).
    let b = lb_tests::scale::backend(0, 0, 10).to_string();
    let mut took = Vec::new();
    for i in 0..6 {
        let op = if i % 2 == 0 { "disable" } else { "enable" };
        let start = Instant::now();
        let done: Value = serde_json::from_str(
            &nodes[1].write_ok(&etcd, &["service", "backend", op, "web", "s0", &b, "-j"]),
        )
        .unwrap();
        let revision = done["revision"].as_i64().unwrap();
        on_every_node(&nodes, Duration::from_secs(30), "the change applied", |n| {
            let c = n.status()["cluster"]["revision"].as_i64().unwrap_or(0);
            (c >= revision)
                .then_some(())
                .ok_or_else(|| format!("at {c}, written at {revision}"))
        });
        took.push(start.elapsed());
        for n in &nodes {
            let work = n.status()["last_change"].clone();
            assert_eq!(
                work["validated"], 1,
                "{}: one contribution checked: {work}",
                n.name
            );
            assert_eq!(work["address_dumps"], 0, "{}: {work}", n.name);
            assert!(
                work["store_keys"].as_u64().unwrap() <= 2,
                "{}: the cluster's key and its revision stored: {work}",
                n.name
            );
            assert!(
                work["written"].as_u64().unwrap() < 100,
                "{}: map entries of one set written: {work}",
                n.name
            );
        }
    }
    took.sort();
    println!(
        "one backend change written through etcd and applied on all 3 nodes (debug build, status polled): median {:?}, max {:?}",
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

/// etcd replaced by a new cluster (a disaster recovery: the same members' addresses, a
/// history that starts again below the revision the node applied): the node finds the
/// revision behind its own, lists again and serves the new cluster's services.
#[test]
fn a_node_of_a_replaced_etcd_lists_again() {
    if !require_root("a_node_of_a_replaced_etcd_lists_again") {
        return;
    }
    let Fleet {
        etcd,
        nodes,
        b0,
        b1,
        ..
    } = fleet(1);
    let node = &nodes[0];
    for i in 0..10u8 {
        node.write_ok(
            &etcd,
            &set(
                &format!("s{i}"),
                Ipv4Addr::new(10, 99, 1, i),
                std::slice::from_ref(&b1),
            ),
        );
    }
    node.write_ok(&etcd, &set("api", VIP, std::slice::from_ref(&b0)));
    within(&node.daemon, Duration::from_secs(5), "served", || {
        (node.ask()? == "b0")
            .then_some(())
            .ok_or_else(|| "not b0".to_owned())
    });
    let before = node.status()["cluster"]["revision"].as_i64().unwrap();
    drop(etcd);
    let mut etcd = EtcdCluster::start(3).unwrap();
    etcd.attach(&node.topo.node, "etcd1").unwrap();
    let done: Value = serde_json::from_str(
        &node.write_ok(
            &etcd,
            &[
                set("api", VIP, std::slice::from_ref(&b1)),
                vec!["-j".into()],
            ]
            .concat(),
        ),
    )
    .unwrap();
    let written = done["revision"].as_i64().unwrap();
    assert!(
        written < before,
        "the new history is behind: {written} vs {before}"
    );
    within(
        &node.daemon,
        Duration::from_secs(30),
        "the new cluster's",
        || {
            let c = node.status()["cluster"].clone();
            if c["services"] != 1 || node.ask()? != "b1" {
                return Err(format!("{c}"));
            }
            Ok(())
        },
    );
    let log = node.daemon.log();
    assert!(log.contains("etcd's revision went back"), "{log}");
}

/// A cluster whose members speak TLS and require a client certificate of their CA: a node
/// given the CA and a client certificate (`--cluster-ca`, `--cluster-cert`, `--cluster-key`)
/// follows it and serves what a writer with the same flags writes; a writer without a client
/// certificate is refused by etcd, and a certificate without its key by lb.
#[test]
fn a_tls_cluster_is_followed_and_written_with_client_certificates() {
    if !require_root("a_tls_cluster_is_followed_and_written_with_client_certificates") {
        return;
    }
    let _one = serial();
    let mut etcd = EtcdCluster::start_tls(1).unwrap();
    let c = etcd.certs().unwrap();
    let (ca, cert, key) = (c.file("ca.pem"), c.file("client.pem"), c.file("client.key"));
    let tls = [
        "--cluster-ca",
        ca.as_str(),
        "--cluster-cert",
        cert.as_str(),
        "--cluster-key",
        key.as_str(),
    ];
    let node = Node::start_with(&mut etcd, 0, &tls);
    let b0 = node.backend(0);
    let service = set("api", VIP, std::slice::from_ref(&b0));
    let mut args: Vec<&str> = tls.to_vec();
    args.extend(service.iter().map(String::as_str));
    node.write_ok(&etcd, &args);
    within(
        &node.daemon,
        Duration::from_secs(10),
        "served over TLS",
        || {
            (node.ask()? == "b0")
                .then_some(())
                .ok_or_else(|| "not b0".to_owned())
        },
    );
    assert_eq!(node.status()["cluster"]["connected"], true);
    assert!(
        node.status()["cluster"]["endpoints"]
            .as_str()
            .unwrap()
            .starts_with("https://")
    );
    let no_cert = node.write(&etcd, &["--cluster-ca", ca.as_str(), "state"]);
    assert_eq!(
        no_cert.code,
        Some(1),
        "etcd refuses a client without a certificate: {no_cert:?}"
    );
    let no_key = node.write(
        &etcd,
        &[
            "--cluster-ca",
            ca.as_str(),
            "--cluster-cert",
            cert.as_str(),
            "state",
        ],
    );
    assert_eq!(no_key.code, Some(1), "{no_key:?}");
    assert!(no_key.stderr.contains("--cluster-key"), "{no_key:?}");
    let with = node.write_ok(&etcd, &[&tls[..], &["state", "-j"]].concat());
    assert!(with.contains("\"api\""), "{with}");
}
