//! The real-traffic benchmark's own set-up, on the scenarios that need no `lb` binary (lb's
//! are the daemon's, tested in lb-user): the no-LB path and kube-proxy's iptables chains carry
//! the bench's traffic where the bench says, the chains spread flows over every backend, wrk's
//! per-thread backends work, and a scenario torn down leaves nothing on the node (the bench
//! fails a run otherwise). Counts only, no timing.
use std::path::Path;
use std::time::Duration;

use lb_tests::bench::real::{Bench, Config};
use lb_tests::bench::{Metric, Scenario};
use lb_tests::require_root;

#[test]
fn bench_scenarios_without_lb_deliver_where_they_say_and_leave_nothing_behind() {
    if !require_root("bench_scenarios_without_lb_deliver_where_they_say_and_leave_nothing_behind") {
        return;
    }
    // No lb binary is started by these two scenarios.
    let mut cfg = Config::new(Path::new("/nonexistent/lb"), true);
    cfg.rounds = 1;
    cfg.udp_packets = 20_000;
    cfg.idle_wait = Duration::ZERO;
    let bench = Bench::new(1).unwrap();
    for s in [Scenario::NoLb, Scenario::Iptables] {
        let mut notes = Vec::new();
        // UDP from 64k source ports, then connections/s; `scenario` fails if anything of the
        // scenario is left on the node after its teardown.
        let samples = bench.scenario(s, &cfg, 0, &[1, 2], &mut notes).unwrap();
        assert!(notes.is_empty(), "{s:?}: {notes:?}");
        let udp = samples.iter().find(|x| x.metric == Metric::Udp64k).unwrap();
        assert_eq!(udp.void, None, "{s:?}: {udp:?}");
        let per: Vec<u64> = (udp.detail["per_backend"].as_array().unwrap().iter())
            .map(|n| n.as_u64().unwrap())
            .collect();
        assert_eq!(udp.detail["sent"], 20_000, "{udp:?}");
        match s {
            // All to backend 0 (the others see at most the node's ARP broadcasts).
            Scenario::NoLb => {
                assert!(per[0] >= 20_000, "{per:?}");
                assert!(per[1..].iter().all(|&n| n < 100), "{per:?}");
            }
            // statistic random over 4 backends, 65,535 flows: each gets about a quarter.
            _ => {
                assert!(per.iter().sum::<u64>() >= 20_000, "{per:?}");
                assert!(per.iter().all(|&n| n > 20_000 / 8), "{per:?}");
            }
        }
        let conn = samples
            .iter()
            .find(|x| x.metric == Metric::ConnPerSec)
            .unwrap();
        assert!(conn.value > 0.0, "{s:?}: {conn:?}");
        assert_eq!(conn.detail["errors"], 0, "{s:?}: {conn:?}");
    }
}
