//! iperf3 server and client, and the throughput of its report.
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::{
    POLL, START_TIMEOUT, TempDir, Tool, in_netns, ports::tcp_listening, read_for_error, run_tool,
};
use crate::netns::Netns;

/// An iperf 2 (Debian `iperf`) TCP server in a namespace, listening on `port`; killed (by its
/// pid) on drop. Its output goes to a private temp dir, quoted if it fails to start.
pub struct IperfServer {
    port: u16,
    // Dropped before `dir`.
    process: Tool,
    dir: TempDir,
}

impl IperfServer {
    /// Starts `iperf -s -p PORT` in `ns` and waits until it listens (read from the namespace's
    /// socket table, so the wait is no connection iperf would count).
    pub fn start(ns: &Netns, port: u16) -> Result<IperfServer> {
        IperfServer::start_with(ns, port, false)
    }

    /// Like [`IperfServer::start`], serving IPv6 (`iperf -s -V`), for [`iperf_client`] to
    /// an IPv6 address: iperf 2 serves one family per server, so a dual-stack backend runs
    /// one of each, on ports of their own.
    pub fn start_v6(ns: &Netns, port: u16) -> Result<IperfServer> {
        IperfServer::start_with(ns, port, true)
    }

    fn start_with(ns: &Netns, port: u16, ipv6: bool) -> Result<IperfServer> {
        let dir = TempDir::new("iperf")?;
        let log = File::create(dir.join("iperf.log")).context("creating iperf.log")?;
        let port_arg = port.to_string();
        let mut args = vec!["-s", "-p", &port_arg];
        if ipv6 {
            args.push("-V");
        }
        let mut cmd = in_netns(ns, None, "iperf", args);
        cmd.stdout(log.try_clone()?).stderr(log);
        let process = Tool::spawn(cmd, &format!("iperf server in {}", ns.name()))?;
        let mut server = IperfServer { port, process, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = server.process.exited()? {
                bail!(
                    "iperf server in {} exited ({status}): {}",
                    ns.name(),
                    read_for_error(&server.dir.join("iperf.log"))
                );
            }
            if tcp_listening(ns, port)? {
                return Ok(server);
            }
            ensure!(
                Instant::now() < deadline,
                "iperf server in {} does not listen on {port} after {START_TIMEOUT:?}: {}",
                ns.name(),
                read_for_error(&server.dir.join("iperf.log"))
            );
            thread::sleep(POLL);
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// Runs an iperf 2 TCP client from `ns` to `addr:port` for `secs` seconds (pinned to `cpu`
/// with taskset if given) and returns the throughput it reports, in bits per second. An
/// IPv6 `addr` is given with iperf 2's `-V`.
pub fn iperf_client(
    ns: &Netns,
    addr: impl Into<IpAddr>,
    port: u16,
    secs: u32,
    cpu: Option<usize>,
) -> Result<f64> {
    ensure!(secs > 0, "iperf: 0 s would mean its default");
    let peer = SocketAddr::new(addr.into(), port);
    let mut args = vec![
        "-c".to_owned(),
        peer.ip().to_string(),
        "-p".to_owned(),
        port.to_string(),
        "-t".to_owned(),
        secs.to_string(),
        "-y".to_owned(),
        "C".to_owned(),
    ];
    if peer.is_ipv6() {
        args.push("-V".to_owned());
    }
    let cmd = in_netns(ns, cpu, "iperf", &args);
    let limit = Duration::from_secs(u64::from(secs) + 15);
    let run = run_tool(cmd, &format!("iperf to {peer} from {}", ns.name()), limit)?;
    // iperf 2 exits 0 even when it cannot connect; then there is no report, only stderr.
    iperf_bits_per_sec(&run.stdout)
        .with_context(|| format!("iperf stdout: {}\nstderr: {}", run.stdout, run.stderr))
}

/// The throughput in iperf 2's `-y C` report: one CSV line per stream,
/// `time,src,sport,dst,dport,id,interval,bytes,bits_per_second`. A line with id -1 is the sum
/// over parallel streams and is the answer when present; otherwise the streams are added up.
pub fn iperf_bits_per_sec(csv: &str) -> Result<f64> {
    let mut sum = None;
    let mut streams = Vec::new();
    for line in csv.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        ensure!(fields.len() >= 9, "not an iperf CSV report line: {line:?}");
        let bps: f64 = fields[8]
            .parse()
            .with_context(|| format!("bits per second in {line:?}"))?;
        if fields[5] == "-1" {
            sum = Some(bps);
        } else {
            streams.push(bps);
        }
    }
    ensure!(
        sum.is_some() || !streams.is_empty(),
        "no iperf CSV report (could it connect?)"
    );
    Ok(sum.unwrap_or_else(|| streams.iter().sum()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf_csv_single_stream_and_parallel_streams() {
        // iperf 2.1.8 prints a 1970 timestamp in its CSV lines.
        let single =
            "19700101000000,10.77.0.1,39254,10.77.0.2,5201,1,0.0-2.0,4442423356,17708378164\n";
        assert_eq!(iperf_bits_per_sec(single).unwrap(), 17_708_378_164.0);
        let two = "\
19700101000000,10.77.0.1,39286,10.77.0.2,5201,2,0.0-1.0,1947205692,15505899737
19700101000000,10.77.0.1,39270,10.77.0.2,5201,1,0.0-1.0,1679818812,13376310523
";
        assert_eq!(
            iperf_bits_per_sec(two).unwrap(),
            15_505_899_737.0 + 13_376_310_523.0
        );
        let with_sum = format!(
            "{two}19700101000000,10.77.0.1,0,10.77.0.2,5201,-1,0.0-1.0,3627024504,29000000000\n"
        );
        assert_eq!(iperf_bits_per_sec(&with_sum).unwrap(), 29_000_000_000.0);
    }

    #[test]
    fn iperf_without_a_report_is_an_error() {
        // What a refused connection leaves on stdout: nothing (iperf 2 still exits 0).
        assert!(iperf_bits_per_sec("").is_err());
        assert!(iperf_bits_per_sec("Server listening on TCP port 5001\n").is_err());
    }
}
