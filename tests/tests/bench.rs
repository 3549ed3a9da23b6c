//! The real-traffic benchmark's own set-up, on the scenarios that need no `lb` binary (lb's
//! are the daemon's, tested in lb-user): the no-LB path and kube-proxy's iptables chains (and
//! their ip6tables twins) carry the bench's traffic of both families where the bench says,
//! the chains spread flows over every backend, wrk's per-thread backends work, iperf reaches
//! the IPv6 servers, and a scenario torn down leaves nothing on the node (the bench fails a
//! run otherwise). Counts only, no timing.
use std::path::Path;
use std::time::Duration;

use lb_tests::bench::real::{Bench, Config, step};
use lb_tests::bench::{Metric, Scenario};
use lb_tests::firewall::NodeShape;
use lb_tests::require_root;

const PACKETS: u64 = 20_000;

#[test]
fn bench_scenarios_without_lb_deliver_where_they_say_and_leave_nothing_behind() {
    if !require_root("bench_scenarios_without_lb_deliver_where_they_say_and_leave_nothing_behind") {
        return;
    }
    // No lb binary is started by these two scenarios.
    let mut cfg = Config::new(Path::new("/nonexistent/lb"), true);
    cfg.rounds = 1;
    cfg.udp_packets = PACKETS;
    cfg.idle_wait = Duration::ZERO;
    let bench = Bench::new(1).unwrap();
    let v6 = bench.topo.v6().clone();
    let measured = [
        Metric::Udp64k,
        Metric::ConnPerSec,
        Metric::Udp64kV6,
        Metric::ConnPerSecV6,
        Metric::TcpV6,
    ];
    let steps = measured.map(step);
    for s in [Scenario::NoLb, Scenario::Iptables] {
        let mut notes = Vec::new();
        // UDP from 64k source ports and connections/s over each family, TCP over IPv6;
        // `scenario` fails if anything of the scenario (an nft table, an iptables or
        // ip6tables chain) is left on the node after its teardown.
        let samples = bench.scenario(s, &cfg, 0, &steps, &mut notes).unwrap();
        assert!(notes.is_empty(), "{s:?}: {notes:?}");
        let of = |m: Metric| samples.iter().find(|x| x.metric == m).unwrap();
        for m in measured {
            assert_eq!(of(m).void, None, "{s:?} {m:?}: {:?}", of(m));
        }
        for m in [Metric::Udp64k, Metric::Udp64kV6] {
            let udp = of(m);
            let per: Vec<u64> = (udp.detail["per_backend"].as_array().unwrap().iter())
                .map(|n| n.as_u64().unwrap())
                .collect();
            assert_eq!(udp.detail["sent"], PACKETS, "{udp:?}");
            let want_dst = match (s, m.ipv6()) {
                (Scenario::NoLb, false) => bench.topo.backend_ips[0].to_string(),
                (Scenario::NoLb, true) => v6.backends[0].to_string(),
                (_, false) => "10.99.0.12".into(),
                (_, true) => "fd99::12".into(),
            };
            assert_eq!(udp.detail["dst"], want_dst, "{s:?} {m:?}");
            match s {
                // All to backend 0 (the others see at most the node's ARP broadcasts and
                // neighbour discovery).
                Scenario::NoLb => {
                    assert!(per[0] >= PACKETS, "{m:?}: {per:?}");
                    assert!(per[1..].iter().all(|&n| n < 100), "{m:?}: {per:?}");
                }
                // statistic random over 4 backends, 65,535 flows: each gets about a quarter.
                _ => {
                    assert!(per.iter().sum::<u64>() >= PACKETS, "{m:?}: {per:?}");
                    assert!(per.iter().all(|&n| n > PACKETS / 8), "{m:?}: {per:?}");
                }
            }
        }
        for m in [Metric::ConnPerSec, Metric::ConnPerSecV6] {
            let conn = of(m);
            assert!(conn.value > 0.0, "{s:?} {m:?}: {conn:?}");
            assert_eq!(conn.detail["errors"], 0, "{s:?} {m:?}: {conn:?}");
            assert_eq!(conn.detail["dst"].as_str().unwrap().contains(':'), m.ipv6());
        }
        let tcp = of(Metric::TcpV6);
        assert!(tcp.value > 0.0, "{s:?}: {tcp:?}");
    }
}

/// The bench's node shapes (`lb_tests::firewall`): on a Docker-shaped and a Nomad-shaped node
/// the no-LB path and kube-proxy's chains still carry every family's traffic (the shapes
/// accept what containers publish), every sample says which node it was measured on, and a
/// shape taken out leaves the node as clean as it found it.
#[test]
fn bench_scenarios_run_on_docker_and_nomad_shaped_nodes() {
    if !require_root("bench_scenarios_run_on_docker_and_nomad_shaped_nodes") {
        return;
    }
    let mut cfg = Config::new(Path::new("/nonexistent/lb"), true);
    cfg.rounds = 1;
    cfg.udp_packets = PACKETS;
    cfg.idle_wait = Duration::ZERO;
    let mut bench = Bench::new(1).unwrap();
    let measured = [Metric::Udp64k, Metric::Udp64kV6, Metric::ConnPerSec];
    let steps = measured.map(step);
    for shape in [NodeShape::Docker, NodeShape::Nomad] {
        bench.set_shape(shape).unwrap();
        for s in [Scenario::NoLb, Scenario::Iptables] {
            let mut notes = Vec::new();
            let samples = bench.scenario(s, &cfg, 0, &steps, &mut notes).unwrap();
            assert!(notes.is_empty(), "{shape:?} {s:?}: {notes:?}");
            for x in &samples {
                assert_eq!(x.node, shape);
                assert_eq!(x.void, None, "{shape:?} {s:?}: {x:?}");
            }
        }
    }
    bench.set_shape(NodeShape::Empty).unwrap();
    let left = lb_tests::bench::real::leftovers(&bench.topo.node).unwrap();
    assert!(left.is_empty(), "{left:?}");
}
