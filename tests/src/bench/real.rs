//! The real-traffic benchmark: one routed, dual-stack topology (client → node `lbc0` → bridge
//! `lbbr0` → 4 backends, each link with both families, [`Topology::dual_stack`]), and for each
//! round every scenario in turn (which one goes first rotates with the round): set up on the
//! node for both families (an IPv4 and an IPv6 VIP, backends of both), measured with trafgen,
//! wrk, sockperf and iperf from the client, torn down, and the node checked to hold nothing
//! of it any more.
//!
//! Every sample is checked before it counts: UDP datagrams are counted where they reach the
//! backends (their `eth0` rx), a connection run with SYN retransmits or wrk errors is void, a
//! tool that fails or reports nothing makes its samples void with its error. A broken scenario
//! is reported as broken, never as a fast number.
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use super::dsr::{self, DsrSample};
use super::report::{Idle, Sample};
use super::{Metric, Scenario};
use crate::bpffs::Bpffs;
use crate::daemon::{LbDaemon, network_add, service_set};
use crate::firewall::NodeShape;
use crate::netns::{ENDPOINT_IF, NODE_CLIENT_IF, Netns, Topology};
use crate::tools::{
    IperfServer, MIN_UDP_PAYLOAD, Nginx, SockperfServer, SrcPorts, UdpSpec, WrkOptions,
    iperf_client, link_mac, link_stats, netstat, sockperf_ping_pong, trafgen_udp, udp_frame_len,
    wait_tcp_port, wrk, wrk_script,
};

/// Backends of the topology.
const BACKENDS: usize = 4;
/// The UDP port trafgen sends to; each backend binds it (on `[::]`, both families) with a
/// socket it never reads, so a datagram ends in a full receive buffer (a counter) rather
/// than an ICMP error.
pub(super) const UDP_PORT: u16 = 9;
const SOCKPERF_PORT: u16 = 11111;
const IPERF_PORT: u16 = 5001;
/// The IPv6 iperf server's port (iperf 2 serves one family per server): a port of the
/// service as the others, the same on VIP and backend.
const IPERF6_PORT: u16 = 5002;
/// nginx port of scenario `s` in round `r`: `HTTP_BASE + 10 r + s`, one per run, so no run
/// meets another's TIME_WAIT sockets.
const HTTP_BASE: u16 = 20000;
/// The service's name in lb.
pub(super) const NETWORK: &str = "bench";
/// Source port of the 1-flow UDP run.
const UDP_SPORT: u16 = 40000;
/// A UDP run counts only when at least this share of what was sent reached the backends.
const MIN_DELIVERED: f64 = 0.9;
/// The machine counts as idle when all its CPUs together were busy less than this share of
/// a look at /proc/stat.
const IDLE_BUSY: f64 = 0.15;
const IDLE_LOOK: Duration = Duration::from_millis(250);
/// An Ethernet frame's check sequence: the bytes a frame size on the wire counts beyond
/// what trafgen writes.
const FCS: usize = 4;
/// How long a scenario may take to serve its first connection after set-up.
pub(super) const READY: Duration = Duration::from_secs(15);

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
    /// The node firewalls every scenario runs on, one after the other.
    pub shapes: Vec<NodeShape>,
    /// Whether the DSR part ([`super::dsr`]) runs.
    pub dsr: bool,
}

impl Config {
    pub fn new(lb: &Path, quick: bool) -> Config {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Config {
            lb: lb.to_path_buf(),
            // Three node shapes in one interleaved run: three rounds each keep the full run
            // within about 45 minutes on this VM.
            rounds: if quick { 2 } else { 3 },
            udp_packets: if quick { 200_000 } else { 1_000_000 },
            secs: if quick { 2 } else { 3 },
            // Bounded so that a machine shared with other work still finishes a full run
            // (63 scenario rounds of 9 measurements: 5 over IPv4, 4 over IPv6).
            idle_wait: Duration::from_millis(if quick { 1000 } else { 3000 }),
            cpu: cpus - 1,
            only: Vec::new(),
            shapes: NodeShape::ALL.to_vec(),
            dsr: true,
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
            "nodes": self.shapes.iter().map(|n| n.key()).collect::<Vec<_>>(),
            "backends": BACKENDS,
            "min_delivered": MIN_DELIVERED,
            "udp_frame_bytes": udp_frame_len(false, MIN_UDP_PAYLOAD) + FCS,
            "udp6_frame_bytes": udp_frame_len(true, MIN_UDP_PAYLOAD) + FCS,
        })
    }

    pub fn method(&self) -> String {
        format!(
            "One run on one dual-stack topology ({BACKENDS} backends behind the node's \
             bridge, IPv4 and IPv6 on every link, `lb_tests::netns::Topology::dual_stack`): {} \
             rounds; in each round every scenario is set \
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
             - TCP: iperf 2, one stream, {} s.\n\
             - IPv6 rows: the same measurements over IPv6, to the service's IPv6 VIP (no LB: \
             to backend 0's IPv6 address; for connections/s each wrk thread to another \
             backend's). UDP carries the IPv4 frames' {MIN_UDP_PAYLOAD}-byte payload, so its \
             frames are {} bytes ({} without FCS; IPv6's header is 20 bytes longer than \
             IPv4's), counted, rated and voided as the IPv4 ones; TCP is iperf 2 `-V`. On the \
             fast scenarios an IPv6 packet the eBPF fast path does not cover takes lb's path \
             without it, and is measured as it goes.\n\n\
             Medians and min–max are over the valid rounds; ratios are to the same run's \
             no-LB path. Scenarios: no LB (routed by the node); nft (`lb daemon --dataplane \
             nftables`, moby's ruleset); iptables (kube-proxy's chains: KUBE-SERVICES → \
             KUBE-SVC (statistic random) → KUBE-SEP (DNAT), written with iptables-restore and \
             their IPv6 twins with ip6tables-restore); \
             lb tc / lb xdp (`--dataplane ebpf`, `--attach tc|xdp --fast-path off`); \
             lb tc fast / lb xdp fast (`--fast-path auto`). Masquerade is off everywhere (the \
             backends route through the node). After each scenario the node holds no nft \
             table, tc filter, XDP program nor iptables or ip6tables chain (checked), and its \
             conntrack table is flushed (both families).\n\n\
             Node shapes ({}): every round of every scenario runs on each, one shape after the \
             other, each with its own no-LB base: an empty node (nothing in the forward path), \
             a Docker-shaped node (dockerd 20.10's filter table and its ip6tables twin, the \
             bridge as `docker0`, an accept per published port) and a Nomad-shaped node (the \
             real CNI `firewall` plugin's chains per backend, NOMAD-ADMIN's accept of the \
             bridge's subnets, FORWARD policy drop), from `lb_tests::firewall`; on those the \
             node's conntrack is active for every scenario, no-LB included, and `--fast-path \
             auto` takes the vetted fast path (docs/fast-path.md). Whether the kernel has \
             nftables flowtables, for an \"nft + flowtable\" peer, is probed at the start \
             (the notes say what it answered). The profile runs are made on the empty node.",
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
            udp_frame_len(true, MIN_UDP_PAYLOAD) + FCS,
            udp_frame_len(true, MIN_UDP_PAYLOAD),
            (self.shapes.iter().map(|n| n.name()))
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

/// What the real-traffic part produced.
pub struct Outcome {
    pub samples: Vec<Sample>,
    pub notes: Vec<String>,
    pub profiles: Vec<Profile>,
    pub dsr: Vec<DsrSample>,
}

/// Where an lb scenario's time goes: its programs while one [`Load`] runs through it,
/// measured in runs of their own after the timed rounds with `kernel.bpf_stats_enabled` on
/// (the kernel times every program run then, which the timed rounds must not pay).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub scenario: Scenario,
    pub load: Load,
    /// Program name, runs, nanoseconds in all runs (the kernel's run_cnt and run_time_ns).
    pub programs: Vec<(String, u64, u64)>,
    /// Datagrams delivered at the backends meanwhile (sends: datagrams sent).
    pub delivered: u64,
    /// Their rate (with the kernel's timing on: a little below the timed rounds').
    pub pps: f64,
}

/// The traffic of one profile run: lb's own (a tracked flow, flow creations) and traffic
/// that is not lb's but passes its hooks all the same, which lb must cost as little as the
/// hooks allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// UDP from one source port to the IPv4 VIP: every datagram but the first a tracked
    /// flow's.
    Tracked,
    /// One datagram from each source port 1..65535 to the IPv4 VIP: every datagram a flow's
    /// first, so a flow creation each.
    Created,
    /// UDP from one source port to backend 0's address, routed by the node: not a service,
    /// through lb's ingress and the bridge's egress.
    Unrelated,
    /// Unconnected UDP sends by a socket of the node's namespace (the one lb serves) to
    /// backend 0's address: the node's own traffic, not a service's, through the socket hooks
    /// and the bridge's egress.
    NodeSends,
    /// The same sends in a namespace lb does not serve (the client's, to its loopback): the
    /// socket hooks run there too, being on the cgroup2 root.
    OtherSends,
}

impl Load {
    pub const ALL: [Load; 5] = [
        Load::Tracked,
        Load::Created,
        Load::Unrelated,
        Load::NodeSends,
        Load::OtherSends,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Load::Tracked => "tracked flow",
            Load::Created => "new flows",
            Load::Unrelated => "not a service",
            Load::NodeSends => "node's sends",
            Load::OtherSends => "other netns' sends",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Load::Tracked => "tracked",
            Load::Created => "created",
            Load::Unrelated => "unrelated",
            Load::NodeSends => "node_sends",
            Load::OtherSends => "other_sends",
        }
    }
}

/// Datagrams each send profile sends.
const SENDS: u64 = 100_000;

/// `SENDS` unconnected sends from a socket of `ns` to `to`: the rate they were made at.
fn sends(ns: &Netns, to: SocketAddr) -> Result<f64> {
    ns.run(move || -> Result<f64> {
        let bind: SocketAddr = if to.is_ipv6() {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let sock = UdpSocket::bind(bind).context("binding the sender")?;
        let payload = [0u8; MIN_UDP_PAYLOAD];
        let start = Instant::now();
        for _ in 0..SENDS {
            // A full queue (ENOBUFS) still ran the hooks: what is measured.
            let _ = sock.send_to(&payload, to);
        }
        Ok(SENDS as f64 / start.elapsed().as_secs_f64())
    })?
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

/// The VIP of scenario `s` of one family: one per scenario, so no flow of one (in a table
/// that outlived it) is ever one of another's.
fn vip(s: Scenario, ipv6: bool) -> IpAddr {
    let i = s.index() as u8;
    if ipv6 {
        Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x10 + u16::from(i)).into()
    } else {
        Ipv4Addr::new(10, 99, 0, 10 + i).into()
    }
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
    /// nginx on both families, an iperf server for each, the UDP sink on `[::]` (a
    /// dual-stack socket: IPv4 datagrams reach it too); sockperf on IPv4 (RTT is measured
    /// over IPv4 only).
    fn start(topo: &Topology, http_ports: &[u16]) -> Result<Servers> {
        let mut s = Servers {
            _nginx: Vec::new(),
            _iperf: Vec::new(),
            _sockperf: Vec::new(),
            _udp: Vec::new(),
        };
        for (i, ns) in topo.backends.iter().enumerate() {
            s._nginx
                .push(Nginx::start_ports_dual(ns, &format!("b{i}"), http_ports)?);
            s._iperf.push(IperfServer::start(ns, IPERF_PORT)?);
            s._iperf.push(IperfServer::start_v6(ns, IPERF6_PORT)?);
            s._sockperf.push(SockperfServer::start(ns, SOCKPERF_PORT)?);
            s._udp.push(
                ns.run(|| UdpSocket::bind((Ipv6Addr::UNSPECIFIED, UDP_PORT)))?
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

pub(super) fn lb_ok(d: &LbDaemon, args: &[String]) -> Result<String> {
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

/// The service's ports: `PROTO/PORT`, each published and target the same (on both VIPs).
fn ports(http: u16) -> Vec<(&'static str, u16)> {
    vec![
        ("tcp", http),
        ("udp", UDP_PORT),
        ("udp", SOCKPERF_PORT),
        ("tcp", IPERF_PORT),
        ("tcp", IPERF6_PORT),
    ]
}

/// The tools and names of one family's kube-proxy chains: iptables or its ip6tables twin.
#[derive(Debug, Clone, Copy)]
struct Xtables {
    /// `iptables`, `ip6tables`.
    cmd: &'static str,
    restore: &'static str,
    save: &'static str,
    /// The nft family of the `nat` table the nf_tables backend of `cmd` makes.
    nft_family: &'static str,
}

impl Xtables {
    const BOTH: [Xtables; 2] = [
        Xtables {
            cmd: "iptables",
            restore: "iptables-restore",
            save: "iptables-save",
            nft_family: "ip",
        },
        Xtables {
            cmd: "ip6tables",
            restore: "ip6tables-restore",
            save: "ip6tables-save",
            nft_family: "ip6",
        },
    ];

    fn of(ipv6: bool) -> Xtables {
        Xtables::BOTH[usize::from(ipv6)]
    }
}

/// kube-proxy's NAT chains for `vip` (iptables mode, masquerade off), for iptables-restore
/// when `vip` is IPv4 and ip6tables-restore when it is IPv6 (as kube-proxy writes one
/// ruleset per family): PREROUTING → KUBE-SERVICES → one KUBE-SVC chain per port choosing a
/// KUBE-SEP chain with `statistic random` rules of probability 1/n, 1/(n-1), …, each KUBE-SEP
/// DNATing to its backend (`backends` of `vip`'s family: an error otherwise).
pub fn kube_proxy_rules(vip: IpAddr, ports: &[(&str, u16)], backends: &[IpAddr]) -> Result<String> {
    ensure!(
        backends.iter().all(|b| b.is_ipv6() == vip.is_ipv6()),
        "kube-proxy's chains for {vip}: backends {backends:?} of another family"
    );
    let host = if vip.is_ipv6() { 128 } else { 32 };
    let mut chains = vec![
        ":PREROUTING ACCEPT [0:0]".to_owned(),
        ":KUBE-SERVICES - [0:0]".into(),
    ];
    let mut rules = vec!["-A PREROUTING -j KUBE-SERVICES".to_owned()];
    for (p, &(proto, port)) in ports.iter().enumerate() {
        let svc = format!("KUBE-SVC-BENCH{p}");
        chains.push(format!(":{svc} - [0:0]"));
        rules.push(format!(
            "-A KUBE-SERVICES -d {vip}/{host} -p {proto} -m {proto} --dport {port} -j {svc}"
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
            // `10.20.0.10:80`, `[fd20::10]:80`: the address:port forms of either tool.
            let to = SocketAddr::new(*b, port);
            rules.push(format!(
                "-A {sep} -p {proto} -m {proto} -j DNAT --to-destination {to}"
            ));
        }
    }
    Ok(format!(
        "*nat\n{}\n{}\nCOMMIT\n",
        chains.join("\n"),
        rules.join("\n")
    ))
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
        let ports = ports(http);
        let v6 = topo.v6();
        let daemon = |dataplane: &str, net: &[&str]| -> Result<Active> {
            let bpffs = Bpffs::new()?;
            let daemon = LbDaemon::start(&cfg.lb, bpffs.path(), &["--dataplane", dataplane])?;
            let mut add = network_add(topo, NETWORK);
            add.extend(net.iter().map(|s| s.to_string()));
            add.extend(["--masquerade".into(), "never".into()]);
            lb_ok(&daemon, &add)?;
            let (p0, rest) = ports.split_first().context("ports")?;
            let IpAddr::V4(vip4) = vip(s, false) else {
                bail!("the IPv4 VIP of {s:?}");
            };
            // One service of both families: the IPv6 VIP and backends beside the IPv4 ones
            // (the daemon sends each family to the backends of its own).
            let mut set = service_set(
                NETWORK,
                "svc",
                "1",
                vip4,
                &format!("{}/{}", p0.0, p0.1),
                &topo.backend_ips,
            );
            set.extend(["--vip".into(), vip(s, true).to_string()]);
            for b in &v6.backends {
                set.extend(["--backend".into(), b.to_string()]);
            }
            for (proto, port) in rest {
                set.extend(["--port".into(), format!("{proto}/{port}")]);
            }
            lb_ok(&daemon, &set)?;
            Ok(Active::Daemon { daemon, bpffs })
        };
        let active = match s {
            Scenario::NoLb => Active::Nothing,
            Scenario::Iptables => {
                let v4: Vec<IpAddr> = topo.backend_ips.iter().map(|&b| b.into()).collect();
                let v6: Vec<IpAddr> = v6.backends.iter().map(|&b| b.into()).collect();
                // Active before the first family is written: a failure of the second still
                // tears the first down.
                let active = Active::Iptables;
                for (ipv6, backends) in [(false, v4), (true, v6)] {
                    let written =
                        kube_proxy_rules(vip(s, ipv6), &ports, &backends).and_then(|rules| {
                            let restore = Xtables::of(ipv6).restore;
                            exec_stdin(&topo.node, &[restore, "--noflush"], &rules)
                        });
                    if let Err(e) = written {
                        let undone = match active.stop(topo) {
                            Ok(()) => "torn down".to_owned(),
                            Err(e) => format!("tearing down failed too: {e:#}"),
                        };
                        return Err(e.context(format!("kube-proxy's chains ({undone})")));
                    }
                }
                active
            }
            Scenario::Nft => daemon("nftables", &[])?,
            Scenario::LbTc => daemon("ebpf", &["--attach", "tc", "--fast-path", "off"])?,
            Scenario::LbXdp => daemon("ebpf", &["--attach", "xdp", "--fast-path", "off"])?,
            Scenario::LbTcFast => daemon("ebpf", &["--attach", "tc", "--fast-path", "auto"])?,
            Scenario::LbXdpFast => daemon("ebpf", &["--attach", "xdp", "--fast-path", "auto"])?,
        };
        // Served end to end over each family before anything is measured (and the daemon
        // has applied it).
        for ipv6 in [false, true] {
            let to = target(s, topo, ipv6, http);
            if let Err(e) = wait_tcp_port(&topo.client, to.ip(), to.port(), READY) {
                // Undone here: a scenario that never served must leave nothing behind either.
                let undone = active.stop(topo);
                let undone = match undone {
                    Ok(()) => "torn down".to_owned(),
                    Err(e) => format!("tearing down failed too: {e:#}"),
                };
                bail!("{}: not served: {e:#} ({undone})", s.name());
            }
        }
        Ok(active)
    }

    /// Undoes the scenario: lb's network removed before its daemon stops (so its programs are
    /// detached and its tables deleted by lb itself), the bench's iptables and ip6tables
    /// chains and their tables deleted; then the node's conntrack table flushed.
    fn stop(self, topo: &Topology) -> Result<()> {
        match self {
            Active::Nothing => {}
            Active::Iptables => {
                for x in Xtables::BOTH {
                    topo.node.exec([x.cmd, "-t", "nat", "-F"])?;
                    topo.node.exec([x.cmd, "-t", "nat", "-X"])?;
                    topo.node
                        .exec(["nft", "delete", "table", x.nft_family, "nat"])?;
                }
            }
            Active::Daemon { daemon, bpffs } => {
                let rm = lb_ok(&daemon, &["network", "rm", NETWORK].map(String::from));
                drop(daemon);
                drop(bpffs);
                rm?;
            }
        }
        // No conntrack entry of one scenario is found by the next, of either family (nothing
        // to flush when no rule of the node ever loaded conntrack: that failure is not one).
        for family in ["ipv4", "ipv6"] {
            let _ = topo.node.exec(["conntrack", "-F", "-f", family]);
        }
        Ok(())
    }
}

/// Whatever of a scenario is left on the node: nft tables, tc filters, XDP programs, and
/// chains of either iptables family (whichever backend holds them).
pub fn leftovers(node: &Netns) -> Result<Vec<String>> {
    let mut left = Vec::new();
    for table in node.exec(["nft", "list", "tables"])?.lines() {
        left.push(format!("nft {}", table.trim()));
    }
    for x in Xtables::BOTH {
        // Rules (`-A CHAIN ...`) and chains of our own (`:CHAIN - [0:0]`; a built-in chain
        // has a policy instead of `-`, and a table the kernel keeps may list them empty).
        // The save tools list what is there and create nothing.
        let saved = node.exec([x.save])?;
        left.extend(
            (saved.lines())
                .filter(|l| l.starts_with("-A ") || (l.starts_with(':') && l.contains(" - [")))
                .map(|l| format!("{}: {l}", x.cmd)),
        );
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

/// What the node's kernel answers for an nftables flowtable on its client-facing interface
/// (the kernel's own fast path past the forward chain), as a note of the run: the peer
/// "nft + flowtable" needs it, and this lb does not run that peer yet.
fn flowtables(node: &Netns) -> String {
    let probe = format!(
        "add table inet lb-bench-ft\n\
         add flowtable inet lb-bench-ft ft {{ hook ingress priority 0; devices = {{ {NODE_CLIENT_IF} }}; }}\n"
    );
    let made = exec_stdin(node, &["nft", "-f", "-"], &probe);
    let _ = node.exec(["nft", "delete", "table", "inet", "lb-bench-ft"]);
    match made {
        Ok(()) => "the kernel has nftables flowtables, but the bench has no \"nft + flowtable\" \
                   peer yet"
            .to_owned(),
        Err(e) => format!(
            "no \"nft + flowtable\" peer: this kernel refuses a flowtable ({}; \
             CONFIG_NF_FLOW_TABLE is likely not set)",
            (format!("{e:#}").lines())
                .find(|l| l.trim_start().starts_with("Error:"))
                .unwrap_or("nft failed")
                .trim()
        ),
    }
}

/// Where the client sends in scenario `s` over one family: the VIP, or backend 0 without a
/// load balancer.
fn target(s: Scenario, topo: &Topology, ipv6: bool, port: u16) -> SocketAddr {
    let ip = match (s, ipv6) {
        (Scenario::NoLb, false) => topo.backend_ips[0].into(),
        (Scenario::NoLb, true) => topo.v6().backends[0].into(),
        _ => vip(s, ipv6),
    };
    SocketAddr::new(ip, port)
}

/// One measurement's result: its samples (value, void reason, detail) by metric.
type Measured = Vec<(Metric, f64, Option<String>, Value)>;

/// UDP from trafgen, [`MIN_UDP_PAYLOAD`] bytes of payload (64-byte IPv4 frames, 84-byte
/// IPv6 ones, FCS counted) over the metric's family; delivered counted at the backends'
/// `eth0`.
fn udp(topo: &Topology, s: Scenario, cfg: &Config, metric: Metric) -> Result<Measured> {
    let ipv6 = metric.ipv6();
    let ports = match metric {
        Metric::Udp1 | Metric::Udp1V6 => SrcPorts::Fixed(UDP_SPORT),
        _ => SrcPorts::Range {
            first: 1,
            count: 65_535,
        },
    };
    let dst = target(s, topo, ipv6, UDP_PORT).ip();
    let via = (&topo.node, NODE_CLIENT_IF);
    let (pps, void, detail) = udp_run(topo, via, cfg, dst, ports, cfg.udp_packets)?;
    Ok(vec![(metric, pps, void, detail)])
}

/// `count` datagrams from the client to `dst` (its family's client address, ports `ports`),
/// framed to the interface `via` of a namespace (the node's, where it routes or balances):
/// the delivered rate at the backends, why the run is void if it is, and what was counted.
pub(super) fn udp_run(
    topo: &Topology,
    via: (&Netns, &str),
    cfg: &Config,
    dst: IpAddr,
    ports: SrcPorts,
    count: u64,
) -> Result<(f64, Option<String>, Value)> {
    let ipv6 = dst.is_ipv6();
    let src: IpAddr = if ipv6 {
        topo.v6().client.into()
    } else {
        topo.client_ip.into()
    };
    let spec = UdpSpec {
        src_ports: ports,
        cpu: Some(cfg.cpu),
        ..UdpSpec::new(
            ENDPOINT_IF,
            link_mac(&topo.client, ENDPOINT_IF)?,
            link_mac(via.0, via.1)?,
            src,
            UDP_SPORT,
            dst,
            UDP_PORT,
            count,
        )
    };
    let rx = |topo: &Topology| -> Result<Vec<u64>> {
        (topo.backends.iter())
            .map(|ns| Ok(link_stats(ns, ENDPOINT_IF)?.rx_packets))
            .collect()
    };
    let before = rx(topo)?;
    let node_before = link_stats(via.0, via.1)?;
    let run = trafgen_udp(&topo.client, &spec)?;
    // What is still in a queue of the path arrives within this.
    std::thread::sleep(Duration::from_millis(200));
    let per_backend: Vec<u64> = (rx(topo)?.iter().zip(&before))
        .map(|(a, b)| a - b)
        .collect();
    let node = link_stats(via.0, via.1)?.since(&node_before);
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
        "dst": dst.to_string(),
        "frame_bytes": udp_frame_len(ipv6, spec.payload_len) + FCS,
    });
    Ok((pps, void, detail))
}

/// Connections/s with wrk, `Connection: close`, over the metric's family.
fn conn(
    topo: &Topology,
    s: Scenario,
    cfg: &Config,
    round: usize,
    metric: Metric,
) -> Result<Measured> {
    let ipv6 = metric.ipv6();
    let http = http_port(s, round);
    let to = target(s, topo, ipv6, http);
    let opts = WrkOptions {
        duration: Duration::from_secs(cfg.secs.into()),
        connections: 16,
        threads: 4,
        close: true,
        cpu: Some(cfg.cpu),
    };
    // `http://10.99.0.10:20000/`, `http://[fd99::10]:20000/`.
    let url = format!("http://{to}/");
    let before = netstat(&topo.client)?;
    let r = match s {
        // Without a load balancer each thread has a backend of its own, as the service
        // spreads connections over all four.
        Scenario::NoLb => {
            let addrs: Vec<String> = if ipv6 {
                (topo.v6().backends.iter())
                    .map(|a| format!("\"{a}\""))
                    .collect()
            } else {
                (topo.backend_ips.iter())
                    .map(|a| format!("\"{a}\""))
                    .collect()
            };
            let script = format!(
                "local addrs = {{{}}}\nlocal n = 0\nfunction setup(thread)\n  n = n + 1\n  \
                 thread.addr = wrk.lookup(addrs[(n - 1) % #addrs + 1], \"{http}\")[1]\nend\n",
                addrs.join(", ")
            );
            wrk_script(&topo.client, &url, &opts, &script)?
        }
        _ => wrk(&topo.client, &url, &opts)?,
    };
    // TcpExt counts both families' TCP.
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
        "port": http,
        "dst": to.ip().to_string(),
    });
    let void = (!why.is_empty()).then(|| why.join(", "));
    Ok(vec![(metric, r.requests_per_sec(), void, detail)])
}

/// Round trips with sockperf ping-pong (IPv4).
fn rtt(topo: &Topology, s: Scenario, cfg: &Config) -> Result<Measured> {
    let to = target(s, topo, false, SOCKPERF_PORT);
    let IpAddr::V4(dst) = to.ip() else {
        bail!("sockperf's target {to} is not IPv4");
    };
    let r = sockperf_ping_pong(&topo.client, dst, to.port(), cfg.secs.max(2), Some(cfg.cpu))?;
    let void = (r.observations == 0).then(|| "no observation".to_owned());
    let detail = json!({"observations": r.observations, "dropped": r.dropped});
    Ok(vec![
        (Metric::RttP50, r.p50_us, void.clone(), detail.clone()),
        (Metric::RttP99, r.p99_us, void, detail),
    ])
}

/// TCP throughput of one iperf stream over the metric's family (iperf 2 `-V` for IPv6, to
/// the backends' IPv6 server).
fn tcp(topo: &Topology, s: Scenario, cfg: &Config, metric: Metric) -> Result<Measured> {
    let ipv6 = metric.ipv6();
    let port = if ipv6 { IPERF6_PORT } else { IPERF_PORT };
    let to = target(s, topo, ipv6, port);
    let bps = iperf_client(&topo.client, to.ip(), to.port(), cfg.secs, Some(cfg.cpu))?;
    let void = (bps <= 0.0).then(|| "no bytes".to_owned());
    Ok(vec![(
        metric,
        bps,
        void,
        json!({"dst": to.ip().to_string()}),
    )])
}

/// The measurements of a scenario, in the order they run: each gives the metrics of its
/// entry (a failed one makes each of them void). IPv4's first, then IPv6's.
pub const STEPS: [&[Metric]; 9] = [
    &[Metric::Udp1],
    &[Metric::Udp64k],
    &[Metric::ConnPerSec],
    &[Metric::RttP50, Metric::RttP99],
    &[Metric::Tcp],
    &[Metric::Udp1V6],
    &[Metric::Udp64kV6],
    &[Metric::ConnPerSecV6],
    &[Metric::TcpV6],
];

/// The step of [`STEPS`] that measures `m`.
pub fn step(m: Metric) -> usize {
    (STEPS.iter())
        .position(|ms| ms.contains(&m))
        .expect("every metric is measured by a step")
}

fn measure(
    step: usize,
    topo: &Topology,
    s: Scenario,
    cfg: &Config,
    round: usize,
) -> Result<Measured> {
    let m = STEPS[step][0];
    match m {
        Metric::Udp1 | Metric::Udp64k | Metric::Udp1V6 | Metric::Udp64kV6 => udp(topo, s, cfg, m),
        Metric::ConnPerSec | Metric::ConnPerSecV6 => conn(topo, s, cfg, round, m),
        Metric::RttP50 | Metric::RttP99 => rtt(topo, s, cfg),
        Metric::Tcp | Metric::TcpV6 => tcp(topo, s, cfg, m),
    }
}

/// The topology and the backends' servers of a run.
pub struct Bench {
    // Dropped before the topology: the servers run in its namespaces.
    _servers: Servers,
    pub topo: Topology,
    /// The node's firewall now, and what of it [`leftovers`] lists (which no scenario left).
    shape: NodeShape,
    baseline: Vec<String>,
    /// Rounds per node shape: a shape's rounds are numbered after the earlier shapes', so
    /// that every scenario of every round of every shape has an HTTP port of its own.
    rounds: usize,
}

impl Bench {
    /// Builds the topology, starts the servers (nginx on every port of `rounds` rounds on
    /// each node shape), and checks that the node starts clean (an empty node).
    pub fn new(rounds: usize) -> Result<Bench> {
        let topo = Topology::dual_stack(BACKENDS).context("building the topology")?;
        let http_ports: Vec<u16> = (0..rounds * NodeShape::ALL.len())
            .flat_map(|r| Scenario::ALL.map(|s| http_port(s, r)))
            .collect();
        let servers = Servers::start(&topo, &http_ports)?;
        // Every neighbour of the node resolved before the first measurement, of both
        // families (ARP, neighbour discovery): one datagram of the node's own to each (to the
        // backends' UDP port, which they hold; the client answers an ICMP error, which is as
        // good).
        let v6 = topo.v6();
        let v4 = (topo.backend_ips.iter().chain([&topo.client_ip])).map(|&a| IpAddr::from(a));
        let v6 = (v6.backends.iter().chain([&v6.client])).map(|&a| IpAddr::from(a));
        for addr in v4.chain(v6) {
            topo.node
                .run(|| {
                    let sock = match addr {
                        IpAddr::V4(_) => UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?,
                        IpAddr::V6(_) => UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))?,
                    };
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
            shape: NodeShape::Empty,
            baseline: Vec::new(),
            rounds,
        })
    }

    /// Gives the node the firewall of `shape` (the backends publishing every port the
    /// scenarios use, as containers would), taking the last one out first.
    pub fn set_shape(&mut self, shape: NodeShape) -> Result<()> {
        self.shape.unload(&self.topo)?;
        let left = leftovers(&self.topo.node)?;
        ensure!(
            left.is_empty(),
            "the node is not clean without the {}'s firewall: {left:?}",
            self.shape.name()
        );
        let mut published: Vec<(&str, u16)> = ports(0)[1..].to_vec();
        published.extend(
            (0..self.rounds * NodeShape::ALL.len())
                .flat_map(|r| Scenario::ALL.map(|s| ("tcp", http_port(s, r)))),
        );
        shape.load(&self.topo, &published)?;
        self.shape = shape;
        self.baseline = leftovers(&self.topo.node)?;
        Ok(())
    }

    /// What a scenario left on the node: [`leftovers`] beyond the firewall's own.
    fn left_behind(&self) -> Result<Vec<String>> {
        let mut left = leftovers(&self.topo.node)?;
        left.retain(|l| !self.baseline.contains(l));
        Ok(left)
    }

    /// The round number `round` of the current shape has in the run (its HTTP ports').
    fn global_round(&self, round: usize) -> usize {
        let shape = NodeShape::ALL.iter().position(|&s| s == self.shape);
        shape.unwrap_or(0) * self.rounds + round
    }

    /// Scenario `s` in round `round`: set up, the measurements `steps` (indexes of [`STEPS`],
    /// [`step`] finds a metric's), torn down; an error if anything of it is left on the node. A set-up or a measurement that fails makes its samples void (and
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
        println!(
            "lb bench: {}, round {round}, {}",
            self.shape.name(),
            s.name()
        );
        let port_round = self.global_round(round);
        let active = Active::start(s, topo, cfg, port_round);
        let setup_error = active.as_ref().err().map(|e| format!("{e:#}"));
        if let Some(e) = &setup_error {
            notes.push(format!("round {round}, {}: set-up failed: {e}", s.name()));
            eprintln!("lb bench: round {round}, {}: set-up failed: {e}", s.name());
        }
        for &step in steps {
            let idle = wait_idle(cfg.idle_wait)?;
            let measured = match &setup_error {
                Some(e) => Err(anyhow::anyhow!("set-up failed: {e}")),
                None => measure(step, topo, s, cfg, port_round),
            };
            let measured = measured.unwrap_or_else(|e| {
                let why = format!("{e:#}");
                (STEPS[step].iter())
                    .map(|&m| (m, 0.0, Some(why.clone()), Value::Null))
                    .collect()
            });
            for (metric, value, void, detail) in measured {
                print_measured(metric, value, void.as_deref());
                samples.push(Sample {
                    node: self.shape,
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
        let left = self.left_behind()?;
        ensure!(
            left.is_empty(),
            "{}, round {round}, {} left this behind on the node: {left:?}",
            self.shape.name(),
            s.name()
        );
        Ok(samples)
    }
}

/// The progress line of one measurement.
pub(super) fn print_measured(metric: Metric, value: f64, void: Option<&str>) {
    println!(
        "lb bench:   {:<26} {:>16}{}",
        metric.name(),
        metric.show(value),
        void.map(|v| format!("  VOID: {v}")).unwrap_or_default()
    );
}

/// The whole real-traffic part.
pub fn run(cfg: &Config) -> Result<Outcome> {
    let scenarios: Vec<Scenario> = (Scenario::ALL.into_iter())
        .filter(|s| cfg.only.is_empty() || cfg.only.contains(s))
        .collect();
    ensure!(!scenarios.is_empty(), "no scenario to run");
    let mut bench = Bench::new(cfg.rounds)?;
    let mut samples = Vec::new();
    let mut notes = vec![flowtables(&bench.topo.node)];
    for &shape in &cfg.shapes {
        bench.set_shape(shape)?;
        for round in 0..cfg.rounds {
            let n = scenarios.len();
            for k in 0..n {
                let s = scenarios[(round + k) % n];
                let steps: Vec<usize> = (0..STEPS.len()).collect();
                samples.extend(bench.scenario(s, cfg, round, &steps, &mut notes)?);
            }
        }
    }
    // Where the time goes is measured on the empty node.
    bench.set_shape(NodeShape::Empty)?;
    let lb: Vec<Scenario> = (scenarios.iter().copied())
        .filter(|s| Scenario::LB.contains(s))
        .collect();
    let profiles = bench.profile(cfg, &lb, &mut notes)?;
    drop(bench);
    let dsr = if cfg.dsr {
        dsr::run(cfg, &mut notes)?
    } else {
        Vec::new()
    };
    Ok(Outcome {
        samples,
        notes,
        profiles,
        dsr,
    })
}

impl Bench {
    /// Every [`Load`] through every scenario of `lb`, with the kernel timing its programs.
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
            let mut measured = Vec::new();
            for load in Load::ALL {
                wait_idle(cfg.idle_wait)?;
                let before = program_stats()?;
                let run = self.load(s, cfg, load);
                let after = program_stats()?;
                measured.push((load, run, before, after));
            }
            active
                .stop(topo)
                .with_context(|| format!("tearing {} down", s.name()))?;
            let left = self.left_behind()?;
            ensure!(left.is_empty(), "profile, {} left {left:?}", s.name());
            for (load, run, before, after) in measured {
                let what = format!("profile, {}, {}", s.name(), load.name());
                let (delivered, pps) = match run {
                    Ok((_, _, Some(void))) => {
                        notes.push(format!("{what}: void: {void}"));
                        continue;
                    }
                    Ok((delivered, pps, None)) => (delivered, pps),
                    Err(e) => {
                        notes.push(format!("{what}: {e:#}"));
                        continue;
                    }
                };
                let programs = (after.iter())
                    .map(|(name, &(runs, ns))| {
                        let (r0, n0) = before.get(name).copied().unwrap_or_default();
                        (name.clone(), runs - r0, ns - n0)
                    })
                    .filter(|(_, runs, _)| *runs > 0)
                    .collect();
                out.push(Profile {
                    scenario: s,
                    load,
                    programs,
                    delivered,
                    pps,
                });
            }
        }
        Ok(out)
    }

    /// One profile run of `load` through scenario `s`: datagrams delivered (or sent), their
    /// rate, and why the run is void if it is.
    fn load(&self, s: Scenario, cfg: &Config, load: Load) -> Result<(u64, f64, Option<String>)> {
        let topo = &self.topo;
        let backend = SocketAddr::new(topo.backend_ips[0].into(), UDP_PORT);
        let (dst, ports, count) = match load {
            Load::Tracked => (vip(s, false), SrcPorts::Fixed(UDP_SPORT), cfg.udp_packets),
            Load::Created => (
                vip(s, false),
                SrcPorts::Range {
                    first: 1,
                    count: 65_535,
                },
                65_535,
            ),
            Load::Unrelated => (backend.ip(), SrcPorts::Fixed(UDP_SPORT), cfg.udp_packets),
            Load::NodeSends => return Ok((SENDS, sends(&topo.node, backend)?, None)),
            Load::OtherSends => {
                let sink = topo
                    .client
                    .run(|| UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)))?
                    .context("binding the client's loopback sink")?;
                let to = sink.local_addr()?;
                return Ok((SENDS, sends(&topo.client, to)?, None));
            }
        };
        let via = (&topo.node, NODE_CLIENT_IF);
        let (pps, void, detail) = udp_run(topo, via, cfg, dst, ports, count)?;
        Ok((detail["delivered"].as_u64().unwrap_or(0), pps, void))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips<T: Into<IpAddr> + Copy>(v: &[T]) -> Vec<IpAddr> {
        v.iter().map(|&a| a.into()).collect()
    }

    #[test]
    fn kube_proxy_chains_choose_each_backend_with_equal_chance() {
        let backends = ips(&[Ipv4Addr::new(10, 20, 0, 10), Ipv4Addr::new(10, 20, 0, 11)]);
        let vip = Ipv4Addr::new(10, 99, 0, 12).into();
        let rules = kube_proxy_rules(vip, &[("tcp", 80)], &backends).unwrap();
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
        let four = ips(&(10..14)
            .map(|i| Ipv4Addr::new(10, 20, 0, i))
            .collect::<Vec<_>>());
        let rules = kube_proxy_rules(vip, &[("udp", 9)], &four).unwrap();
        for p in ["0.25000000000", "0.33333333333", "0.50000000000"] {
            assert!(rules.contains(&format!("--probability {p} ")), "{rules}");
        }
    }

    #[test]
    fn kube_proxy_ip6tables_twin_is_the_same_chains_with_ipv6_addresses() {
        let v6 = |h: u16| IpAddr::from(Ipv6Addr::new(0xfd20, 0, 0, 0, 0, 0, 0, h));
        let vip = IpAddr::from(Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x12));
        let rules = kube_proxy_rules(vip, &[("udp", 9)], &[v6(0x10), v6(0x11)]).unwrap();
        assert_eq!(
            rules,
            "*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BENCH0 - [0:0]
:KUBE-SEP-BENCH0X0 - [0:0]
:KUBE-SEP-BENCH0X1 - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d fd99::12/128 -p udp -m udp --dport 9 -j KUBE-SVC-BENCH0
-A KUBE-SVC-BENCH0 -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BENCH0X0
-A KUBE-SEP-BENCH0X0 -p udp -m udp -j DNAT --to-destination [fd20::10]:9
-A KUBE-SVC-BENCH0 -j KUBE-SEP-BENCH0X1
-A KUBE-SEP-BENCH0X1 -p udp -m udp -j DNAT --to-destination [fd20::11]:9
COMMIT
"
        );
        // One family per ruleset, as each restore tool takes.
        let v4 = IpAddr::from(Ipv4Addr::new(10, 20, 0, 10));
        assert!(kube_proxy_rules(vip, &[("udp", 9)], &[v6(0x10), v4]).is_err());
    }

    #[test]
    fn every_scenario_and_round_has_its_own_http_port_and_vips() {
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..5 {
            for s in Scenario::ALL {
                assert!(seen.insert(http_port(s, r)), "{s:?} round {r}");
            }
        }
        for ipv6 in [false, true] {
            let vips: std::collections::BTreeSet<_> = Scenario::ALL.map(|s| vip(s, ipv6)).into();
            assert_eq!(vips.len(), Scenario::ALL.len());
            assert!(vips.iter().all(|v| v.is_ipv6() == ipv6), "{vips:?}");
        }
    }

    #[test]
    fn every_metric_is_measured_once_over_its_own_family() {
        for m in Metric::ALL {
            let steps: Vec<usize> = (0..STEPS.len())
                .filter(|&i| STEPS[i].contains(&m))
                .collect();
            assert_eq!(steps, [step(m)], "{m:?}");
            assert!(STEPS[step(m)].iter().all(|x| x.ipv6() == m.ipv6()));
        }
    }

    #[test]
    fn udp_metric_names_say_the_frame_size_sent() {
        // What a UDP row's name says is what trafgen's frame is on a wire (FCS counted).
        for (m, ipv6) in [
            (Metric::Udp1, false),
            (Metric::Udp64k, false),
            (Metric::Udp1V6, true),
            (Metric::Udp64kV6, true),
        ] {
            assert_eq!(m.ipv6(), ipv6);
            let bytes = udp_frame_len(ipv6, MIN_UDP_PAYLOAD) + FCS;
            assert!(m.name().starts_with(&format!("UDP {bytes} B, ")), "{m:?}");
        }
    }
}
