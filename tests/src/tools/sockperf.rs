//! sockperf ping-pong: round-trip latency, its percentiles and drops.
use std::fs::File;
use std::net::Ipv4Addr;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::{
    POLL, START_TIMEOUT, TempDir, Tool, in_netns, ports::udp_bound, read_for_error, run_tool,
};
use crate::netns::Netns;

/// A sockperf (Debian `sockperf`, 3.7) UDP server in a namespace, answering ping-pong on
/// `0.0.0.0:port`; killed (by its pid) on drop.
pub struct SockperfServer {
    // Dropped before `dir`.
    process: Tool,
    dir: TempDir,
}

impl SockperfServer {
    /// Starts `sockperf server -p PORT` in `ns` and waits until its socket is bound.
    pub fn start(ns: &Netns, port: u16) -> Result<SockperfServer> {
        let dir = TempDir::new("sockperf")?;
        let log = File::create(dir.join("sockperf.log")).context("creating sockperf.log")?;
        let port_arg = port.to_string();
        let args = ["server", "-i", "0.0.0.0", "-p", &port_arg];
        let mut cmd = in_netns(ns, None, "sockperf", args);
        cmd.stdout(log.try_clone()?).stderr(log);
        let process = Tool::spawn(cmd, &format!("sockperf server in {}", ns.name()))?;
        let mut server = SockperfServer { process, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = server.process.exited()? {
                bail!(
                    "sockperf server in {} exited ({status}): {}",
                    ns.name(),
                    read_for_error(&server.dir.join("sockperf.log"))
                );
            }
            if udp_bound(ns, port)? {
                return Ok(server);
            }
            ensure!(
                Instant::now() < deadline,
                "sockperf server in {} is not bound to {port} after {START_TIMEOUT:?}: {}",
                ns.name(),
                read_for_error(&server.dir.join("sockperf.log"))
            );
            thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// What a sockperf ping-pong run measured: round trips in microseconds (`--full-rtt`), over
/// the run's valid part (after sockperf's warm-up).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SockperfResult {
    pub observations: u64,
    pub dropped: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl SockperfResult {
    /// Parses sockperf 3.7's ping-pong report (its colour escapes included).
    pub fn parse(report: &str) -> Result<SockperfResult> {
        let mut r = SockperfResult::default();
        let (mut obs, mut p50, mut p99) = (false, false, false);
        for line in report.lines() {
            // `\x1b[2;35mTotal 28303 observations\x1b[0m; each percentile contains ...`
            let line: String = strip_escapes(line);
            let line = line.trim_start_matches("sockperf: ").trim();
            if let Some(rest) = line.strip_prefix("Total ") {
                let n = rest.split_whitespace().next().unwrap_or_default();
                r.observations = n
                    .parse()
                    .with_context(|| format!("observations in {line:?}"))?;
                obs = true;
            } else if let Some(rest) = line.strip_prefix("# dropped messages = ") {
                let n = rest.split(';').next().unwrap_or_default().trim();
                r.dropped = n.parse().with_context(|| format!("drops in {line:?}"))?;
            } else if let Some(rest) = line.strip_prefix("---> percentile ") {
                let (pct, value) = rest
                    .split_once('=')
                    .with_context(|| format!("no `=` in {line:?}"))?;
                let value: f64 = value
                    .trim()
                    .parse()
                    .with_context(|| format!("percentile value in {line:?}"))?;
                match pct.trim() {
                    "50.000" => (r.p50_us, p50) = (value, true),
                    "99.000" => (r.p99_us, p99) = (value, true),
                    _ => {}
                }
            }
        }
        ensure!(
            obs && p50 && p99,
            "no observation count, p50 or p99 in sockperf's report: {report}"
        );
        Ok(r)
    }
}

/// `line` without ANSI SGR escapes (`ESC [ ... m`).
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs `sockperf ping-pong` (UDP, one message in flight, full round trips) from `ns` to
/// `addr:port` for `secs` seconds, pinned to `cpu` if given. sockperf spends its first 400 ms
/// warming up and reports only what follows, so `secs` is at least 2.
pub fn sockperf_ping_pong(
    ns: &Netns,
    addr: Ipv4Addr,
    port: u16,
    secs: u32,
    cpu: Option<usize>,
) -> Result<SockperfResult> {
    ensure!(
        secs >= 2,
        "sockperf: {secs} s leaves too little after its warm-up"
    );
    let args = [
        "ping-pong".to_owned(),
        "-i".to_owned(),
        addr.to_string(),
        "-p".to_owned(),
        port.to_string(),
        "-t".to_owned(),
        secs.to_string(),
        "--full-rtt".to_owned(),
    ];
    let cmd = in_netns(ns, cpu, "sockperf", &args);
    let limit = Duration::from_secs(u64::from(secs) + 15);
    let run = run_tool(
        cmd,
        &format!("sockperf to {addr}:{port} from {}", ns.name()),
        limit,
    )?;
    SockperfResult::parse(&format!("{}\n{}", run.stdout, run.stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sockperf 3.7's ping-pong report with --full-rtt (its colour escapes kept), shortened.
    const SOCKPERF: &str = "sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=40923; ReceivedMessages=40922
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=28303; ReceivedMessages=28303
sockperf: \x1b[2;35m====> avg-rtt=54.729 (std-dev=39.482)\x1b[0m
sockperf: # dropped messages = 2; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Round trip is 54.729 usec
sockperf: \x1b[2;35mTotal 28303 observations\x1b[0m; each percentile contains 283.03 observations
sockperf: ---> <MAX> observation = 3815.672
sockperf: ---> percentile 99.999 = 3815.672
sockperf: ---> percentile 99.000 =   77.574
sockperf: ---> percentile 90.000 =   62.992
sockperf: ---> percentile 50.000 =   53.979
sockperf: ---> <MIN> observation =   12.708
";

    #[test]
    fn sockperf_report_gives_observations_drops_and_percentiles() {
        let r = SockperfResult::parse(SOCKPERF).unwrap();
        assert_eq!(
            r,
            SockperfResult {
                observations: 28_303,
                dropped: 2,
                p50_us: 53.979,
                p99_us: 77.574,
            }
        );
        let none = "sockperf: No valid observations found. Try tune parameters: --time/--mps/--reply-every\n";
        assert!(SockperfResult::parse(none).is_err());
    }
}
