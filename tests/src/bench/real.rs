//! The real-traffic benchmark: one routed topology (client → node `lbc0` → bridge `lbbr0` →
//! 4 backends, [`Topology::new`]), and for each round every scenario in turn (which one goes
//! first rotates with the round): set up on the node, measured with trafgen, wrk, sockperf and
//! iperf from the client, torn down, and the node checked to hold nothing of it any more.
//!
//! Every sample is checked before it counts: UDP datagrams are counted where they reach the
//! backends (their `eth0` rx), a connection run with SYN retransmits or wrk errors is void, a
//! tool that fails or reports nothing makes its samples void with its error. A broken scenario
//! is reported as broken, never as a fast number.
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use super::report::{Idle, Sample};
use super::{Metric, Scenario};
use crate::bpffs::Bpffs;
use crate::daemon::{LbDaemon, network_add, service_set};
use crate::netns::{ENDPOINT_IF, NODE_CLIENT_IF, Netns, Topology};
use crate::tools::{
    IperfServer, Nginx, SockperfServer, SrcPorts, UdpSpec, WrkOptions, iperf_client, link_mac,
    link_stats, netstat, sockperf_ping_pong, trafgen_udp, wait_tcp_port, wrk, wrk_script,
};

/// Backends of the topology.
const BACKENDS: usize = 4;
/// The UDP port trafgen sends to; each backend binds it with a socket it never reads, so a
/// datagram ends in a full receive buffer (a counter) rather than an ICMP error.
const UDP_PORT: u16 = 9;
const SOCKPERF_PORT: u16 = 11111;
const IPERF_PORT: u16 = 5001;
/// nginx port of scenario `s` in round `r`: `HTTP_BASE + 10 r + s`, one per run, so no run
/// meets another's TIME_WAIT sockets.
const HTTP_BASE: u16 = 20000;
/// The service's name in lb.
const NETWORK: &str = "bench";
/// Source port of the 1-flow UDP run.
const UDP_SPORT: u16 = 40000;
/// A UDP run counts only when at least this share of what was sent reached the backends.
const MIN_DELIVERED: f64 = 0.9;
/// The machine counts as idle when all its CPUs together were busy less than this share of
/// a look at /proc/stat.
const IDLE_BUSY: f64 = 0.15;
const IDLE_LOOK: Duration = Duration::from_millis(250);
/// How long a scenario may take to serve its first connection after set-up.
const READY: Duration = Duration::from_secs(15);

/// How much to measure.
#[derive(Debug, Clone)]
pub struct Config {
    pub lb: PathBuf,
    pub rounds: usize,
    pub udp_packets: u64,
    /// wrk's, sockperf's and iperf's run, seconds.
    pub secs: u32,
    /// The longest wait for an idle machine before each measurement.
    pub idle_wait: Duration,
    /// The CPU trafgen, wrk, sockperf and iperf run on (and with them the path's softirqs).
    pub cpu: usize,
    /// Only these scenarios (all when empty).
    pub only: Vec<Scenario>,
}

impl Config {
    pub fn new(lb: &Path, quick: bool) -> Config {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Config {
            lb: lb.to_path_buf(),
            rounds: if quick { 2 } else { 5 },
            udp_packets: if quick { 200_000 } else { 1_000_000 },
            secs: if quick { 2 } else { 3 },
            // Bounded so that a machine shared with other work still finishes a full run in
            // about 20 minutes (35 scenario rounds of 5 measurements).
            idle_wait: Duration::from_millis(if quick { 1000 } else { 3000 }),
            cpu: cpus - 1,
            only: Vec::new(),
        }
    }

    pub fn params(&self) -> Value {
        json!({
            "rounds": self.rounds,
            "udp_packets": self.udp_packets,
            "run_secs": self.secs,
            "idle_wait_ms": self.idle_wait.as_millis() as u64,
            "idle_busy_below": IDLE_BUSY,
            "cpu": self.cpu,
            "backends": BACKENDS,
            "min_delivered": MIN_DELIVERED,
        })
    }

    pub fn method(&self) -> String {
        format!(
            "One run on one topology ({BACKENDS} backends behind the node's bridge, \
             `lb_tests::netns::Topology::new`): {} rounds; in each round every scenario is set \
             up, measured and torn down in turn, and which one goes first rotates with the \
             round. Before each measurement the bench waits (at most {:?}) until all CPUs \
             together were busy less than {:.0}% over {:?} of /proc/stat. The generator (trafgen, \
             wrk, sockperf, iperf client) runs on CPU {} (trafgen's `cpu()`, `taskset` for the \
             others); a veth hands a packet on in the sender's softirq, so the path through \
             the node runs there too.\n\n\
             - UDP: trafgen sends {} 64-byte frames (one flow; then source ports 1..65535) to \
             the service (no LB: to backend 0); delivered = the backends' `eth0` rx packets, \
             rate = delivered / trafgen's own sending time. Fewer than {:.0}% delivered makes \
             the run void.\n\
             - Connections/s: wrk, `Connection: close`, 4 threads and 16 connections, {} s, to \
             an nginx port of its own per scenario and round (no LB: each wrk thread to another \
             backend). A run with SYN retransmits (the client's TcpExt TCPSynRetrans) or any \
             wrk error is void.\n\
             - RTT: sockperf UDP ping-pong, full round trips, {} s (its first 400 ms are \
             warm-up), p50 and p99.\n\
             - TCP: iperf 2, one stream, {} s.\n\n\
             Medians and min–max are over the valid rounds; ratios are to the same run's \
             no-LB path. Scenarios: no LB (routed by the node); nft (`lb daemon --dataplane \
             nftables`, moby's ruleset); iptables (kube-proxy's chains: KUBE-SERVICES → \
             KUBE-SVC (statistic random) → KUBE-SEP (DNAT), written with iptables-restore); \
             lb tc / lb xdp (`--dataplane ebpf`, `--attach tc|xdp --fast-path off`); \
             lb tc fast / lb xdp fast (`--fast-path auto`). Masquerade is off everywhere (the \
             backends route through the node). After each scenario the node holds no nft \
             table, tc filter or XDP program (checked), and its conntrack table is flushed.",
            self.rounds,
            self.idle_wait,
            IDLE_BUSY * 100.0,
            IDLE_LOOK,
            self.cpu,
            self.udp_packets,
            MIN_DELIVERED * 100.0,
            self.secs,
            self.secs.max(2),
            self.secs,
        )
    }
}

/// What the real-traffic part produced.
pub struct Outcome {
    pub samples: Vec<Sample>,
    pub notes: Vec<String>,
    pub profiles: Vec<Profile>,
}

/// Where an lb scenario's time goes: its programs while trafgen sends one UDP flow through
/// it, measured in a run of its own after the timed rounds with `kernel.bpf_stats_enabled`
/// on (the kernel times every program run then, which the timed rounds must not pay).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub scenario: Scenario,
    /// Program name, runs, nanoseconds in all runs (the kernel's run_cnt and run_time_ns).
    pub programs: Vec<(String, u64, u64)>,
    /// Datagrams delivered at the backends meanwhile.
    pub delivered: u64,
    /// Their rate (with the kernel's timing on: a little below the timed rounds').
    pub pps: f64,
}

/// The run count and run time of every loaded program whose name starts with `lb_`, summed by
/// name (`bpftool -j prog show`; the fields exist while `kernel.bpf_stats_enabled` is on).
fn program_stats() -> Result<BTreeMap<String, (u64, u64)>> {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .context("running bpftool prog show")?;
    ensure!(out.status.success(), "bpftool prog show failed: {out:?}");
    let progs: Vec<Value> = serde_json::from_slice(&out.stdout).context("bpftool's JSON output")?;
    let mut stats = BTreeMap::new();
    for p in progs {
        let Some(name) = p["name"].as_str().filter(|n| n.starts_with("lb_")) else {
            continue;
        };
        let e: &mut (u64, u64) = stats.entry(name.to_owned()).or_default();
        e.0 += p["run_cnt"].as_u64().unwrap_or(0);
        e.1 += p["run_time_ns"].as_u64().unwrap_or(0);
    }
    Ok(stats)
}

/// `kernel.bpf_stats_enabled` on while it lives, then back to what it was. A machine-wide
/// switch with no effect but the kernel timing program runs (its cost is why only the
/// profile runs with it).
struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> Result<BpfStats> {
        let was =
            std::fs::read_to_string(BPF_STATS).with_context(|| format!("reading {BPF_STATS}"))?;
        std::fs::write(BPF_STATS, "1").with_context(|| format!("writing {BPF_STATS}"))?;
        Ok(BpfStats(was.trim().to_owned()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.0);
    }
}

fn http_port(s: Scenario, round: usize) -> u16 {
    HTTP_BASE + 10 * round as u16 + s.index() as u16
}

/// The VIP of scenario `s`: one per scenario, so no flow of one (in a table that outlived it)
/// is ever one of another's.
fn vip(s: Scenario) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, 10 + s.index() as u8)
}

/// Busy and total jiffies of all CPUs (`cpu` line of /proc/stat).
fn cpu_times() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = (line.split_whitespace().skip(1))
        .map(|x| x.parse().with_context(|| format!("/proc/stat: {line}")))
        .collect::<Result<_>>()?;
    ensure!(v.len() >= 5, "/proc/stat: {line}");
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    let total: u64 = v.iter().take(8).sum();
    Ok((total - v[3] - v[4], total))
}

/// Waits until the machine is idle (see [`IDLE_BUSY`]), at most `max`.
pub fn wait_idle(max: Duration) -> Result<Idle> {
    let start = Instant::now();
    loop {
        let (b0, t0) = cpu_times()?;
        std::thread::sleep(IDLE_LOOK);
        let (b1, t1) = cpu_times()?;
        let busy = (b1 - b0) as f64 / (t1 - t0).max(1) as f64;
        let reached = busy < IDLE_BUSY;
        if reached || start.elapsed() >= max {
            return Ok(Idle {
                busy,
                waited_ms: start.elapsed().as_millis() as u64,
                reached,
            });
        }
    }
}

/// The servers every scenario uses, in the backends.
struct Servers {
    _nginx: Vec<Nginx>,
    _iperf: Vec<IperfServer>,
    _sockperf: Vec<SockperfServer>,
    _udp: Vec<UdpSocket>,
}

impl Servers {
    fn start(topo: &Topology, http_ports: &[u16]) -> Result<Servers> {
        let mut s = Servers {
            _nginx: Vec::new(),
            _iperf: Vec::new(),
            _sockperf: Vec::new(),
            _udp: Vec::new(),
        };
        for (i, ns) in topo.backends.iter().enumerate() {
            s._nginx
                .push(Nginx::start_ports(ns, &format!("b{i}"), http_ports)?);
            s._iperf.push(IperfServer::start(ns, IPERF_PORT)?);
            s._sockperf.push(SockperfServer::start(ns, SOCKPERF_PORT)?);
            s._udp.push(
                ns.run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, UDP_PORT)))?
                    .with_context(|| format!("binding udp/{UDP_PORT} in {}", ns.name()))?,
            );
        }
        Ok(s)
    }
}

/// What a scenario set up on the node, undone by [`Active::stop`].
enum Active {
    Nothing,
    Iptables,
    Daemon { daemon: LbDaemon, bpffs: Bpffs },
}

fn lb_ok(d: &LbDaemon, args: &[String]) -> Result<String> {
    let r = d.cli(args);
    ensure!(
        r.ok(),
        "lb {}: {}{}\ndaemon log:\n{}",
        args.join(" "),
        r.stdout,
        r.stderr,
        d.log()
    );
    Ok(r.stdout)
}

/// The service's ports: `PROTO/PORT`, each published and target the same.
fn ports(http: u16) -> Vec<(&'static str, u16)> {
    vec![
        ("tcp", http),
        ("udp", UDP_PORT),
        ("udp", SOCKPERF_PORT),
        ("tcp", IPERF_PORT),
    ]
}

/// kube-proxy's NAT chains for `vip` (iptables mode, masquerade off): PREROUTING →
/// KUBE-SERVICES → one KUBE-SVC chain per port choosing a KUBE-SEP chain with `statistic
/// random` rules of probability 1/n, 1/(n-1), …, each KUBE-SEP DNATing to its backend.
pub fn kube_proxy_rules(vip: Ipv4Addr, ports: &[(&str, u16)], backends: &[Ipv4Addr]) -> String {
    let mut chains = vec![
        ":PREROUTING ACCEPT [0:0]".to_owned(),
        ":KUBE-SERVICES - [0:0]".into(),
    ];
    let mut rules = vec!["-A PREROUTING -j KUBE-SERVICES".to_owned()];
    for (p, &(proto, port)) in ports.iter().enumerate() {
        let svc = format!("KUBE-SVC-BENCH{p}");
        chains.push(format!(":{svc} - [0:0]"));
        rules.push(format!(
            "-A KUBE-SERVICES -d {vip}/32 -p {proto} -m {proto} --dport {port} -j {svc}"
        ));
        let n = backends.len();
        for (k, b) in backends.iter().enumerate() {
            let sep = format!("KUBE-SEP-BENCH{p}X{k}");
            chains.push(format!(":{sep} - [0:0]"));
            if k + 1 < n {
                rules.push(format!(
                    "-A {svc} -m statistic --mode random --probability {:.11} -j {sep}",
                    1.0 / (n - k) as f64
                ));
            } else {
                rules.push(format!("-A {svc} -j {sep}"));
            }
            rules.push(format!(
                "-A {sep} -p {proto} -m {proto} -j DNAT --to-destination {b}:{port}"
            ));
        }
    }
    format!(
        "*nat\n{}\n{}\nCOMMIT\n",
        chains.join("\n"),
        rules.join("\n")
    )
}

/// Runs `cmd` in `ns` with `input` on its stdin.
fn exec_stdin(ns: &Netns, cmd: &[&str], input: &str) -> Result<()> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?} in {}", ns.name()))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "{cmd:?} in {} failed ({}): {}",
        ns.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

impl Active {
    fn start(s: Scenario, topo: &Topology, cfg: &Config, round: usize) -> Result<Active> {
        let http = http_port(s, round);
        let vip = vip(s);
        let ports = ports(http);
        let daemon = |dataplane: &str, net: &[&str]| -> Result<Active> {
            let bpffs = Bpffs::new()?;
            let daemon = LbDaemon::start(&cfg.lb, bpffs.path(), &["--dataplane", dataplane])?;
            let mut add = network_add(topo, NETWORK);
            add.extend(net.iter().map(|s| s.to_string()));
            add.extend(["--masquerade".into(), "never".into()]);
            lb_ok(&daemon, &add)?;
            let (p0, rest) = ports.split_first().context("ports")?;
            let mut set = service_set(
                NETWORK,
                "svc",
                "1",
                vip,
                &format!("{}/{}", p0.0, p0.1),
                &topo.backend_ips,
            );
            for (proto, port) in rest {
                set.extend(["--port".into(), format!("{proto}/{port}")]);
            }
            lb_ok(&daemon, &set)?;
            Ok(Active::Daemon { daemon, bpffs })
        };
        let active = match s {
            Scenario::NoLb => Active::Nothing,
            Scenario::Iptables => {
                let rules = kube_proxy_rules(vip, &ports, &topo.backend_ips);
                exec_stdin(&topo.node, &["iptables-restore", "--noflush"], &rules)?;
                Active::Iptables
            }
            Scenario::Nft => daemon("nftables", &[])?,
            Scenario::LbTc => daemon("ebpf", &["--attach", "tc", "--fast-path", "off"])?,
            Scenario::LbXdp => daemon("ebpf", &["--attach", "xdp", "--fast-path", "off"])?,
            Scenario::LbTcFast => daemon("ebpf", &["--attach", "tc", "--fast-path", "auto"])?,
            Scenario::LbXdpFast => daemon("ebpf", &["--attach", "xdp", "--fast-path", "auto"])?,
        };
        // Served end to end before anything is measured (and the daemon has applied it).
        let (to, port) = target(s, topo, http);
        if let Err(e) = wait_tcp_port(&topo.client, to, port, READY) {
            // Undone here: a scenario that never served must leave nothing behind either.
            let undone = active.stop(topo);
            let undone = match undone {
                Ok(()) => "torn down".to_owned(),
                Err(e) => format!("tearing down failed too: {e:#}"),
            };
            bail!("{}: not served: {e:#} ({undone})", s.name());
        }
        Ok(active)
    }

    /// Undoes the scenario: lb's network removed before its daemon stops (so its programs are
    /// detached and its tables deleted by lb itself), the bench's iptables chains and their
    /// table deleted; then the node's conntrack table flushed.
    fn stop(self, topo: &Topology) -> Result<()> {
        match self {
            Active::Nothing => {}
            Active::Iptables => {
                topo.node.exec(["iptables", "-t", "nat", "-F"])?;
                topo.node.exec(["iptables", "-t", "nat", "-X"])?;
                topo.node.exec(["nft", "delete", "table", "ip", "nat"])?;
            }
            Active::Daemon { daemon, bpffs } => {
                let rm = lb_ok(&daemon, &["network", "rm", NETWORK].map(String::from));
                drop(daemon);
                drop(bpffs);
                rm?;
            }
        }
        // No conntrack entry of one scenario is found by the next (nothing to flush when no
        // rule of the node ever loaded conntrack: that failure is not one).
        let _ = topo.node.exec(["conntrack", "-F"]);
        Ok(())
    }
}

/// Whatever of a scenario is left on the node: nft tables, tc filters, XDP programs.
pub fn leftovers(node: &Netns) -> Result<Vec<String>> {
    let mut left = Vec::new();
    let ruleset = node.exec(["nft", "list", "ruleset"])?;
    if !ruleset.trim().is_empty() {
        left.push(format!("nft ruleset: {}", ruleset.trim()));
    }
    for link in node.links()? {
        for dir in ["ingress", "egress"] {
            let filters = node.exec(["tc", "filter", "show", "dev", &link, dir])?;
            if !filters.trim().is_empty() {
                left.push(format!("tc {dir} filter on {link}: {}", filters.trim()));
            }
        }
    }
    let links: Vec<Value> = serde_json::from_str(&node.ip(["-j", "-d", "link", "show"])?)
        .context("ip -j -d link show in the node")?;
    for l in links {
        if l.get("xdp").is_some() {
            left.push(format!("xdp on {}: {}", l["ifname"], l["xdp"]));
        }
    }
    Ok(left)
}

/// Where the client sends in scenario `s`: the VIP, or backend 0 without a load balancer.
fn target(s: Scenario, topo: &Topology, port: u16) -> (Ipv4Addr, u16) {
    match s {
        Scenario::NoLb => (topo.backend_ips[0], port),
        _ => (vip(s), port),
    }
}

/// One measurement's result: its samples (value, void reason, detail) by metric.
type Measured = Vec<(Metric, f64, Option<String>, Value)>;

/// UDP 64 B from trafgen; delivered counted at the backends' `eth0`.
fn udp(topo: &Topology, s: Scenario, cfg: &Config, metric: Metric) -> Result<Measured> {
    let (dst, _) = target(s, topo, UDP_PORT);
    let ports = match metric {
        Metric::Udp1 => SrcPorts::Fixed(UDP_SPORT),
        _ => SrcPorts::Range {
            first: 1,
            count: 65_535,
        },
    };
    let spec = UdpSpec {
        src_ports: ports,
        cpu: Some(cfg.cpu),
        ..UdpSpec::new(
            ENDPOINT_IF,
            link_mac(&topo.client, ENDPOINT_IF)?,
            link_mac(&topo.node, NODE_CLIENT_IF)?,
            topo.client_ip,
            UDP_SPORT,
            dst,
            UDP_PORT,
            cfg.udp_packets,
        )
    };
    let rx = |topo: &Topology| -> Result<Vec<u64>> {
        (topo.backends.iter())
            .map(|ns| Ok(link_stats(ns, ENDPOINT_IF)?.rx_packets))
            .collect()
    };
    let before = rx(topo)?;
    let node_before = link_stats(&topo.node, NODE_CLIENT_IF)?;
    let run = trafgen_udp(&topo.client, &spec)?;
    // What is still in a queue of the path arrives within this.
    std::thread::sleep(Duration::from_millis(200));
    let per_backend: Vec<u64> = (rx(topo)?.iter().zip(&before))
        .map(|(a, b)| a - b)
        .collect();
    let node = link_stats(&topo.node, NODE_CLIENT_IF)?.since(&node_before);
    let delivered: u64 = per_backend.iter().sum();
    let window = run.window.context("trafgen ran on a CPU of its own")?;
    let pps = delivered as f64 / window.as_secs_f64();
    let void = (delivered as f64) < MIN_DELIVERED * run.sent as f64;
    let void = void.then(|| {
        format!(
            "delivered {delivered} of {} ({:.1}%)",
            run.sent,
            100.0 * delivered as f64 / run.sent as f64
        )
    });
    let detail = json!({
        "sent": run.sent,
        "delivered": delivered,
        "per_backend": per_backend,
        "window_us": window.as_micros() as u64,
        "node_rx": node.rx_packets,
        "node_rx_dropped": node.rx_dropped,
    });
    Ok(vec![(metric, pps, void, detail)])
}

/// Connections/s with wrk, `Connection: close`.
fn conn(topo: &Topology, s: Scenario, cfg: &Config, round: usize) -> Result<Measured> {
    let http = http_port(s, round);
    let (dst, port) = target(s, topo, http);
    let opts = WrkOptions {
        duration: Duration::from_secs(cfg.secs.into()),
        connections: 16,
        threads: 4,
        close: true,
        cpu: Some(cfg.cpu),
    };
    let url = format!("http://{dst}:{port}/");
    let before = netstat(&topo.client)?;
    let r = match s {
        // Without a load balancer each thread has a backend of its own, as the service
        // spreads connections over all four.
        Scenario::NoLb => {
            let addrs: Vec<String> = (topo.backend_ips.iter())
                .map(|a| format!("\"{a}\""))
                .collect();
            let script = format!(
                "local addrs = {{{}}}\nlocal n = 0\nfunction setup(thread)\n  n = n + 1\n  \
                 thread.addr = wrk.lookup(addrs[(n - 1) % #addrs + 1], \"{port}\")[1]\nend\n",
                addrs.join(", ")
            );
            wrk_script(&topo.client, &url, &opts, &script)?
        }
        _ => wrk(&topo.client, &url, &opts)?,
    };
    let grown = netstat(&topo.client)?.since(&before);
    let mut why = Vec::new();
    if grown.tcp_syn_retrans > 0 {
        why.push(format!("{} SYN retransmits", grown.tcp_syn_retrans));
    }
    if r.errors() > 0 {
        why.push(format!("{} wrk errors ({r:?})", r.errors()));
    }
    if r.requests == 0 {
        why.push("no request completed".into());
    }
    let detail = json!({
        "requests": r.requests,
        "secs": r.secs,
        "errors": r.errors(),
        "syn_retrans": grown.tcp_syn_retrans,
        "listen_overflows": grown.listen_overflows,
        "port": port,
    });
    let void = (!why.is_empty()).then(|| why.join(", "));
    Ok(vec![(
        Metric::ConnPerSec,
        r.requests_per_sec(),
        void,
        detail,
    )])
}

/// Round trips with sockperf ping-pong.
fn rtt(topo: &Topology, s: Scenario, cfg: &Config) -> Result<Measured> {
    let (dst, port) = target(s, topo, SOCKPERF_PORT);
    let r = sockperf_ping_pong(&topo.client, dst, port, cfg.secs.max(2), Some(cfg.cpu))?;
    let void = (r.observations == 0).then(|| "no observation".to_owned());
    let detail = json!({"observations": r.observations, "dropped": r.dropped});
    Ok(vec![
        (Metric::RttP50, r.p50_us, void.clone(), detail.clone()),
        (Metric::RttP99, r.p99_us, void, detail),
    ])
}

/// TCP throughput of one iperf stream.
fn tcp(topo: &Topology, s: Scenario, cfg: &Config) -> Result<Measured> {
    let (dst, port) = target(s, topo, IPERF_PORT);
    let bps = iperf_client(&topo.client, dst, port, cfg.secs, Some(cfg.cpu))?;
    let void = (bps <= 0.0).then(|| "no bytes".to_owned());
    Ok(vec![(Metric::Tcp, bps, void, json!({}))])
}

/// The metrics one measurement gives (a failed one makes each of them void).
fn metrics_of(step: usize) -> &'static [Metric] {
    const STEPS: [&[Metric]; 5] = [
        &[Metric::Udp1],
        &[Metric::Udp64k],
        &[Metric::ConnPerSec],
        &[Metric::RttP50, Metric::RttP99],
        &[Metric::Tcp],
    ];
    STEPS[step]
}

fn measure(
    step: usize,
    topo: &Topology,
    s: Scenario,
    cfg: &Config,
    round: usize,
) -> Result<Measured> {
    match step {
        0 => udp(topo, s, cfg, Metric::Udp1),
        1 => udp(topo, s, cfg, Metric::Udp64k),
        2 => conn(topo, s, cfg, round),
        3 => rtt(topo, s, cfg),
        _ => tcp(topo, s, cfg),
    }
}

/// The topology and the backends' servers of a run.
pub struct Bench {
    // Dropped before the topology: the servers run in its namespaces.
    _servers: Servers,
    pub topo: Topology,
}

impl Bench {
    /// Builds the topology, starts the servers (nginx on every port of `rounds` rounds), and
    /// checks that the node starts clean.
    pub fn new(rounds: usize) -> Result<Bench> {
        let topo = Topology::new(BACKENDS).context("building the topology")?;
        let http_ports: Vec<u16> = (0..rounds)
            .flat_map(|r| Scenario::ALL.map(|s| http_port(s, r)))
            .collect();
        let servers = Servers::start(&topo, &http_ports)?;
        // Every neighbour of the node resolved before the first measurement: one datagram of
        // the node's own to each (to the backends' UDP port, which they hold; the client
        // answers an ICMP error, which is as good).
        for &addr in topo.backend_ips.iter().chain([&topo.client_ip]) {
            topo.node
                .run(|| {
                    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                    sock.send_to(b"warm-up\n", (addr, UDP_PORT))
                })?
                .with_context(|| format!("the node sends a warm-up datagram to {addr}"))?;
        }
        std::thread::sleep(Duration::from_millis(200));
        let left = leftovers(&topo.node)?;
        ensure!(left.is_empty(), "the fresh node is not clean: {left:?}");
        Ok(Bench {
            _servers: servers,
            topo,
        })
    }

    /// Scenario `s` in round `round`: set up, the measurements `steps` (0: UDP 1 flow, 1: UDP
    /// 64k flows, 2: connections/s, 3: RTT, 4: TCP), torn down; an error if anything of it is
    /// left on the node. A set-up or a measurement that fails makes its samples void (and
    /// notes the set-up failure), it does not end the run.
    pub fn scenario(
        &self,
        s: Scenario,
        cfg: &Config,
        round: usize,
        steps: &[usize],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Sample>> {
        let topo = &self.topo;
        let mut samples = Vec::new();
        println!("lb bench: round {round}, {}", s.name());
        let active = Active::start(s, topo, cfg, round);
        let setup_error = active.as_ref().err().map(|e| format!("{e:#}"));
        if let Some(e) = &setup_error {
            notes.push(format!("round {round}, {}: set-up failed: {e}", s.name()));
            eprintln!("lb bench: round {round}, {}: set-up failed: {e}", s.name());
        }
        for &step in steps {
            let idle = wait_idle(cfg.idle_wait)?;
            let measured = match &setup_error {
                Some(e) => Err(anyhow::anyhow!("set-up failed: {e}")),
                None => measure(step, topo, s, cfg, round),
            };
            let measured = measured.unwrap_or_else(|e| {
                let why = format!("{e:#}");
                (metrics_of(step).iter())
                    .map(|&m| (m, 0.0, Some(why.clone()), Value::Null))
                    .collect()
            });
            for (metric, value, void, detail) in measured {
                println!(
                    "lb bench:   {:<20} {:>16}{}",
                    metric.name(),
                    metric.show(value),
                    void.as_deref()
                        .map(|v| format!("  VOID: {v}"))
                        .unwrap_or_default()
                );
                samples.push(Sample {
                    scenario: s,
                    metric,
                    round,
                    value,
                    void,
                    idle,
                    detail,
                });
            }
        }
        if let Ok(active) = active {
            active
                .stop(topo)
                .with_context(|| format!("tearing {} down", s.name()))?;
        }
        let left = leftovers(&topo.node)?;
        ensure!(
            left.is_empty(),
            "round {round}, {} left this behind on the node: {left:?}",
            s.name()
        );
        Ok(samples)
    }
}

/// The whole real-traffic part.
pub fn run(cfg: &Config) -> Result<Outcome> {
    let scenarios: Vec<Scenario> = (Scenario::ALL.into_iter())
        .filter(|s| cfg.only.is_empty() || cfg.only.contains(s))
        .collect();
    ensure!(!scenarios.is_empty(), "no scenario to run");
    let bench = Bench::new(cfg.rounds)?;
    let mut samples = Vec::new();
    let mut notes = Vec::new();
    for round in 0..cfg.rounds {
        let n = scenarios.len();
        for k in 0..n {
            let s = scenarios[(round + k) % n];
            samples.extend(bench.scenario(s, cfg, round, &[0, 1, 2, 3, 4], &mut notes)?);
        }
    }
    let lb: Vec<Scenario> = (scenarios.iter().copied())
        .filter(|s| Scenario::LB.contains(s))
        .collect();
    let profiles = bench.profile(cfg, &lb, &mut notes)?;
    Ok(Outcome {
        samples,
        notes,
        profiles,
    })
}

impl Bench {
    /// One UDP 1-flow run per scenario of `lb` with the kernel timing its programs.
    pub fn profile(
        &self,
        cfg: &Config,
        lb: &[Scenario],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Profile>> {
        let topo = &self.topo;
        let _stats = BpfStats::enable()?;
        let mut out = Vec::new();
        for &s in lb {
            println!("lb bench: profile, {}", s.name());
            let active = match Active::start(s, topo, cfg, 0) {
                Ok(a) => a,
                Err(e) => {
                    notes.push(format!("profile, {}: set-up failed: {e:#}", s.name()));
                    continue;
                }
            };
            wait_idle(cfg.idle_wait)?;
            let before = program_stats()?;
            let measured = udp(topo, s, cfg, Metric::Udp1);
            let after = program_stats()?;
            active
                .stop(topo)
                .with_context(|| format!("tearing {} down", s.name()))?;
            let left = leftovers(&topo.node)?;
            ensure!(left.is_empty(), "profile, {} left {left:?}", s.name());
            let (_, pps, void, detail) = match measured {
                Ok(mut m) if !m.is_empty() => m.remove(0),
                Ok(_) => continue,
                Err(e) => {
                    notes.push(format!("profile, {}: {e:#}", s.name()));
                    continue;
                }
            };
            if let Some(v) = void {
                notes.push(format!("profile, {}: void: {v}", s.name()));
                continue;
            }
            let programs = (after.iter())
                .map(|(name, &(runs, ns))| {
                    let (r0, n0) = before.get(name).copied().unwrap_or_default();
                    (name.clone(), runs - r0, ns - n0)
                })
                .filter(|(_, runs, _)| *runs > 0)
                .collect();
            out.push(Profile {
                scenario: s,
                programs,
                delivered: detail["delivered"].as_u64().unwrap_or(0),
                pps,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_chains_choose_each_backend_with_equal_chance() {
        let backends = [Ipv4Addr::new(10, 20, 0, 10), Ipv4Addr::new(10, 20, 0, 11)];
        let rules = kube_proxy_rules(Ipv4Addr::new(10, 99, 0, 12), &[("tcp", 80)], &backends);
        assert_eq!(
            rules,
            "*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BENCH0 - [0:0]
:KUBE-SEP-BENCH0X0 - [0:0]
:KUBE-SEP-BENCH0X1 - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.99.0.12/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BENCH0
-A KUBE-SVC-BENCH0 -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BENCH0X0
-A KUBE-SEP-BENCH0X0 -p tcp -m tcp -j DNAT --to-destination 10.20.0.10:80
-A KUBE-SVC-BENCH0 -j KUBE-SEP-BENCH0X1
-A KUBE-SEP-BENCH0X1 -p tcp -m tcp -j DNAT --to-destination 10.20.0.11:80
COMMIT
"
        );
        let four: Vec<Ipv4Addr> = (10..14).map(|i| Ipv4Addr::new(10, 20, 0, i)).collect();
        let rules = kube_proxy_rules(Ipv4Addr::new(10, 99, 0, 12), &[("udp", 9)], &four);
        for p in ["0.25000000000", "0.33333333333", "0.50000000000"] {
            assert!(rules.contains(&format!("--probability {p} ")), "{rules}");
        }
    }

    #[test]
    fn every_scenario_and_round_has_its_own_http_port_and_vip() {
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..5 {
            for s in Scenario::ALL {
                assert!(seen.insert(http_port(s, r)), "{s:?} round {r}");
            }
        }
        let vips: std::collections::BTreeSet<_> = Scenario::ALL.map(vip).into();
        assert_eq!(vips.len(), Scenario::ALL.len());
    }
}
