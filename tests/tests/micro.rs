//! Program micro-benchmarks under BPF_PROG_TEST_RUN, on both attach modes' ingress programs
//! (`lb_xdp`, `lb_tc_ingress`): the kernel's time per packet of a tracked flow (the same
//! datagram again and again, its flow live) and of a flow creation (each run a new client
//! port, so each looks the service up, picks a backend and claims its entries). Printed for
//! the reader and for BENCHMARKS.md's programs section; never asserted (a time is no test
//! threshold on a shared machine). Root only.
use std::time::Duration;

use lb_tests::{
    fixture::{CLIENT, Fixture, Prog, VIP},
    packet::Ipv4Packet,
    require_root,
};
use lb_user::core::model::Masquerade;

/// Runs of a tracked flow timed together, and flow creations timed one by one.
const TRACKED_RUNS: u32 = 20_000;
const CREATIONS: u16 = 2_000;

/// The median of `times`.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn per_packet(prog: Prog) -> (Duration, Duration) {
    let mut f = Fixture::new(Masquerade::Never);
    let tracked = Ipv4Packet::udp(CLIENT, 30000, VIP, 53).build();
    // The first run creates the flow; the timed ones find it.
    f.run(prog, &tracked);
    let hit = f.timed(prog, &tracked, TRACKED_RUNS);
    let created: Vec<Duration> = (0..CREATIONS)
        .map(|i| {
            let p = Ipv4Packet::udp(CLIENT, 31000 + i, VIP, 53).build();
            f.timed(prog, &p, 1)
        })
        .collect();
    (hit, median(created))
}

#[test]
fn ingress_programs_ns_per_packet_of_a_tracked_flow_and_a_flow_creation() {
    if !require_root("ingress_programs_ns_per_packet_of_a_tracked_flow_and_a_flow_creation") {
        return;
    }
    for (prog, name) in [(Prog::TcIngress, "lb_tc_ingress"), (Prog::Xdp, "lb_xdp")] {
        let (tracked, created) = per_packet(prog);
        println!(
            "{name}: {} ns per packet of a tracked flow (mean of {TRACKED_RUNS} runs), {} ns per flow creation (median of {CREATIONS})",
            tracked.as_nanos(),
            created.as_nanos()
        );
        // Not a time threshold: a run that did nothing would take no time.
        assert!(
            !tracked.is_zero() && !created.is_zero(),
            "{name}: timed runs"
        );
    }
}
