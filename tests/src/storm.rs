//! Connection storms: `Connection: close` requests through a path in wrk rounds until
//! [`STORM`] connections were made, with the client kernel's view of them (the storm tests of
//! `real_traffic.rs` and `dual_stack_traffic.rs`).
use std::time::{Duration, Instant};

use crate::{
    netns::Netns,
    tools::{WrkOptions, WrkResult, netstat, snmp, wrk},
};

/// The storm: connections opened (one request each, `Connection: close`). A storm
/// test asserts it made at least this many.
pub const STORM: u64 = 100_000;
/// A storm's first wrk round; later rounds last what the rate so far says the rest of
/// [`STORM`] takes (plus a tenth), until it has made [`STORM`] requests.
const STORM_ROUND: Duration = Duration::from_secs(10);
/// A hang guard, not a measure: a storm still short of [`STORM`] after this long fails,
/// saying the rate it reached (this VM makes 100,000 in 10-20 s; a path that needs minutes
/// is broken, not slow).
const STORM_GUARD: Duration = Duration::from_secs(300);
/// wrk's concurrent connections in a storm: enough to keep both CPUs busy with handshakes.
const STORM_CONNECTIONS: u32 = 32;

/// What a storm did: wrk's report summed over its rounds, and the client kernel's view.
#[derive(Debug, Default)]
pub struct Storm {
    pub wrk: WrkResult,
    pub rounds: u32,
    pub elapsed: Duration,
    /// Connections the client opened (`Tcp ActiveOpens`), failed ones included.
    pub opened: u64,
    /// Connects that failed (`Tcp AttemptFails`).
    pub attempt_fails: u64,
    /// SYNs the client sent again (`TCPSynRetrans`): a SYN or its SYN-ACK was lost.
    pub syn_retrans: u64,
}

impl Storm {
    /// Failed connections: wrk's socket errors, timeouts and non-2xx answers.
    pub fn failed(&self) -> u64 {
        self.wrk.errors()
    }

    pub fn rate(&self) -> f64 {
        self.wrk.requests as f64 / self.elapsed.as_secs_f64()
    }

    pub fn summary(&self) -> String {
        let w = &self.wrk;
        format!(
            "{} requests in {} round(s), {:.1} s ({:.0} connections/s); client opened {}, \
             attempt fails {}, SYN retransmits {}; failed {} (connect {}, read {}, write {}, \
             timeout {}, non-2xx {})",
            w.requests,
            self.rounds,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.opened,
            self.attempt_fails,
            self.syn_retrans,
            self.failed(),
            w.connect_errors,
            w.read_errors,
            w.write_errors,
            w.timeouts,
            w.non_2xx,
        )
    }
}

/// `Connection: close` requests from `client` to `url` in wrk rounds until [`STORM`] are
/// done (failing past [`STORM_GUARD`]).
pub fn storm(client: &Netns, url: &str) -> Storm {
    let (tcp_before, ext_before) = (snmp(client).unwrap(), netstat(client).unwrap());
    let started = Instant::now();
    let mut s = Storm::default();
    let mut round = STORM_ROUND;
    while s.wrk.requests < STORM {
        assert!(
            started.elapsed() < STORM_GUARD,
            "{url}: {} of {STORM} connections after {:?} ({:.0} connections/s): the path hangs",
            s.wrk.requests,
            started.elapsed(),
            s.wrk.requests as f64 / started.elapsed().as_secs_f64()
        );
        let opts = WrkOptions {
            duration: round,
            connections: STORM_CONNECTIONS,
            threads: 1,
            close: true,
            cpu: None,
        };
        let r = wrk(client, url, &opts).unwrap_or_else(|e| panic!("wrk {url}: {e:#}"));
        s.wrk.requests += r.requests;
        s.wrk.secs += r.secs;
        s.wrk.connect_errors += r.connect_errors;
        s.wrk.read_errors += r.read_errors;
        s.wrk.write_errors += r.write_errors;
        s.wrk.timeouts += r.timeouts;
        s.wrk.non_2xx += r.non_2xx;
        s.rounds += 1;
        // The next round: what the rest takes at the rate so far (at least wrk's one second).
        let rate = s.wrk.requests as f64 / started.elapsed().as_secs_f64();
        let rest = STORM.saturating_sub(s.wrk.requests) as f64 / rate.max(1.0);
        round = Duration::from_secs((rest * 1.1).ceil().max(1.0) as u64);
    }
    s.elapsed = started.elapsed();
    let tcp = snmp(client).unwrap().since(&tcp_before);
    s.opened = tcp.tcp_active_opens;
    s.attempt_fails = tcp.tcp_attempt_fails;
    s.syn_retrans = netstat(client).unwrap().since(&ext_before).tcp_syn_retrans;
    s
}
