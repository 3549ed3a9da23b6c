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
        .map(|e| e.trim_start_matches("http://").to_owned())
        .collect();
    format!("etcd://{}", members.join(","))
}

impl Node {
    fn start(etcd: &mut EtcdCluster, i: usize) -> Node {
        let topo = Topology::new(2).unwrap();
        let servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
        let link = "etcd0".to_owned();
        etcd.attach(&topo.node, &link).unwrap();
        let bpffs = Bpffs::new().unwrap();
        let name = format!("n{i}");
        let cluster = url(etcd);
        let daemon = LbDaemon::start_wrapped(
            lb(),
            bpffs.path(),
            &["ip", "netns", "exec", topo.node.name()],
            &["--cluster", &cluster, "--node", &name],
        )
        .unwrap();
        let node = Node {
            name,
            topo,
            _servers: servers,
            _bpffs: bpffs,
            daemon,
            link,
        };
        node.daemon.ok(&network_add(&node.topo, "web"));
        node
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
        serde_json::from_str(&self.daemon.ok(&["status", "--json"])).unwrap()
    }

    /// The backend that answers a new connection to the VIP from this node's client.
    fn ask(&self) -> Result<String, String> {
        tcp_request(&self.topo.client, VIP, PORT, TIMEOUT)
            .map(|r| r.split(' ').next().unwrap_or_default().to_owned())
            .map_err(|e| format!("{e:#}"))
    }
}

/// Waits up to `within` for `cond` on every node; the time it took.
fn on_every_node(
    nodes: &[Node],
    within: Duration,
    what: &str,
    cond: impl Fn(&Node) -> Result<(), String>,
) -> Duration {
    let start = Instant::now();
    for n in nodes {
        loop {
            match cond(n) {
                Ok(()) => break,
                Err(e) if start.elapsed() > within => panic!(
                    "{what}: node {} not there within {within:?}: {e}\n{}",
                    n.name,
                    n.daemon.log()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
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
    let mut etcd = EtcdCluster::start(3).unwrap();
    let nodes: Vec<Node> = (0..3).map(|i| Node::start(&mut etcd, i)).collect();
    let (b0, b1) = (nodes[0].backend(0), nodes[0].backend(1));
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
        .map(|n| {
            (0..64)
                .map(|_| TcpSession::connect(&n.topo.client, VIP, PORT, TIMEOUT).unwrap())
                .find_map(|mut s| s.ask().unwrap().starts_with("b0 ").then_some(s))
                .unwrap_or_else(|| panic!("{}: a connection lands on b0", n.name))
        })
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
    let _ = &nodes[0].link;
}
