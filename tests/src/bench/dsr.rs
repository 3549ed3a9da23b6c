//! The DSR part of the real-traffic bench: client → backends packets/s through a balancer in
//! DSR mode, on the segment DSR needs ([`Switch`]: client, balancer and 4 backends on one
//! bridge, the backends owning the VIP on `lo`), against moby's netdev DSR table (lb's
//! nftables dataplane on a `dsr` network) and the same path without a balancer (the client
//! sending to backend 0 itself: the ratios' base). The backends answer the client directly,
//! so what the balancer costs is all on the way in: UDP from trafgen, counted where it
//! reaches the backends, one flow and 64k flows, in rounds whose first scenario rotates as
//! the main part's do.
//!
//! The switch's hop counters (an nftables bridge table the tests use) are deleted first: a
//! set update per packet would be the bench's cost, not the balancer's.
use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};
use std::net::{IpAddr, Ipv6Addr, TcpListener, UdpSocket};

use super::Metric;
use super::real::{
    Config, NETWORK, READY, UDP_PORT, lb_ok, leftovers, print_measured, udp_run, wait_idle,
};
use super::report::Idle;
use crate::bpffs::Bpffs;
use crate::daemon::{LbDaemon, service_set_ports};
use crate::netns::ENDPOINT_IF;
use crate::switch::{Switch, VIP};
use crate::tools::{SrcPorts, wait_tcp_port};

/// A TCP port every backend listens on (without ever accepting): a scenario counts as served
/// once a connection to the VIP completes through it.
const READY_PORT: u16 = 8099;

/// One way of carrying the client's datagrams to the backends on the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DsrScenario {
    /// To backend 0's own address and MAC: no balancer on the way.
    Direct,
    /// `lb daemon --dataplane nftables`, a `dsr` network: moby's netdev DSR table.
    Nft,
    /// `--dataplane ebpf --attach tc`, a `dsr` network.
    LbTc,
    /// `--attach xdp` (the balancer's switch port runs an XDP program, which a veth needs to
    /// deliver what XDP sends back out).
    LbXdp,
}

impl DsrScenario {
    pub const ALL: [DsrScenario; 4] = [
        DsrScenario::Direct,
        DsrScenario::Nft,
        DsrScenario::LbTc,
        DsrScenario::LbXdp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DsrScenario::Direct => "no balancer",
            DsrScenario::Nft => "nft dsr (moby's netdev table)",
            DsrScenario::LbTc => "lb tc dsr",
            DsrScenario::LbXdp => "lb xdp dsr",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            DsrScenario::Direct => "direct",
            DsrScenario::Nft => "nft_dsr",
            DsrScenario::LbTc => "lb_tc_dsr",
            DsrScenario::LbXdp => "lb_xdp_dsr",
        }
    }
}

/// The metrics of the DSR part.
pub const METRICS: [Metric; 2] = [Metric::Udp1, Metric::Udp64k];

/// One measurement of the DSR part.
#[derive(Debug, Clone, PartialEq)]
pub struct DsrSample {
    pub scenario: DsrScenario,
    pub metric: Metric,
    pub round: usize,
    pub value: f64,
    pub void: Option<String>,
    pub idle: Idle,
    pub detail: Value,
}

/// What a DSR scenario set up on the balancer.
enum Active {
    Nothing,
    Daemon { daemon: LbDaemon, _bpffs: Bpffs },
}

fn start(s: DsrScenario, sw: &mut Switch, cfg: &Config) -> Result<Active> {
    let (dataplane, attach) = match s {
        DsrScenario::Direct => return Ok(Active::Nothing),
        DsrScenario::Nft => ("nftables", None),
        DsrScenario::LbTc => ("ebpf", Some("tc")),
        DsrScenario::LbXdp => ("ebpf", Some("xdp")),
    };
    if s == DsrScenario::LbXdp {
        sw.attach_balancer_peer_xdp()?;
    }
    let bpffs = Bpffs::new()?;
    let daemon = LbDaemon::start(&cfg.lb, bpffs.path(), &["--dataplane", dataplane])?;
    let mut add: Vec<String> = ["network", "add", NETWORK, "--netns", sw.balancer().name()]
        .map(String::from)
        .into();
    add.extend(["--interface".into(), sw.balancer_if().into()]);
    add.extend(["--mode".into(), "dsr".into()]);
    if let Some(a) = attach {
        add.extend(["--attach".into(), a.into()]);
    }
    let active = Active::Daemon {
        daemon,
        _bpffs: bpffs,
    };
    let Active::Daemon { daemon, .. } = &active else {
        unreachable!()
    };
    let backends = &sw.topo.backend_ips;
    let served = lb_ok(daemon, &add)
        .and_then(|_| {
            lb_ok(
                daemon,
                &service_set_ports(NETWORK, "svc", VIP, &[], backends),
            )
        })
        .and_then(|_| wait_tcp_port(sw.client(), IpAddr::from(VIP), READY_PORT, READY));
    if let Err(e) = served {
        let undone = match stop(active, sw) {
            Ok(()) => "torn down".to_owned(),
            Err(e) => format!("tearing down failed too: {e:#}"),
        };
        bail!("{}: not served: {e:#} ({undone})", s.name());
    }
    Ok(active)
}

/// The network removed before the daemon stops (lb detaches and deletes what it made), and the
/// XDP program on the balancer's switch port gone with it.
fn stop(active: Active, sw: &mut Switch) -> Result<()> {
    let rm = match active {
        Active::Nothing => Ok(()),
        Active::Daemon { daemon, .. } => {
            lb_ok(&daemon, &["network", "rm", NETWORK].map(String::from)).map(|_| ())
        }
    };
    sw.detach_balancer_peer_xdp();
    rm
}

/// The DSR part: every round, every scenario (the first rotating), each metric once.
pub fn run(cfg: &Config, notes: &mut Vec<String>) -> Result<Vec<DsrSample>> {
    let mut sw = Switch::new(4, false)?;
    (sw.switch()
        .exec(["nft", "delete", "table", "bridge", "lbt_switch"]))
    .context("deleting the switch's hop counters")?;
    // Bound on `[::]`, so IPv4 datagrams to the VIP reach them too; never read. The
    // listeners are never accepted from: the kernel completes the handshakes.
    let (mut sinks, mut listeners) = (Vec::new(), Vec::new());
    for ns in &sw.topo.backends {
        sinks.push(
            ns.run(|| UdpSocket::bind((Ipv6Addr::UNSPECIFIED, UDP_PORT)))?
                .with_context(|| format!("binding udp/{UDP_PORT} in {}", ns.name()))?,
        );
        listeners.push(
            ns.run(|| TcpListener::bind((Ipv6Addr::UNSPECIFIED, READY_PORT)))?
                .with_context(|| format!("listening on tcp/{READY_PORT} in {}", ns.name()))?,
        );
    }
    let baseline = leftovers(sw.balancer())?;
    let mut samples = Vec::new();
    let n = DsrScenario::ALL.len();
    for round in 0..cfg.rounds {
        for k in 0..n {
            let s = DsrScenario::ALL[(round + k) % n];
            println!("lb bench: dsr segment, round {round}, {}", s.name());
            let active = start(s, &mut sw, cfg);
            let setup = active.as_ref().err().map(|e| format!("{e:#}"));
            if let Some(e) = &setup {
                notes.push(format!(
                    "dsr, round {round}, {}: set-up failed: {e}",
                    s.name()
                ));
            }
            for metric in METRICS {
                let idle = wait_idle(cfg.idle_wait)?;
                let (dst, via) = match s {
                    DsrScenario::Direct => (
                        IpAddr::from(sw.topo.backend_ips[0]),
                        (&sw.topo.backends[0], ENDPOINT_IF),
                    ),
                    _ => (IpAddr::from(VIP), (sw.balancer(), sw.balancer_if())),
                };
                let ports = match metric {
                    Metric::Udp1 => SrcPorts::Fixed(40000),
                    _ => SrcPorts::Range {
                        first: 1,
                        count: 65_535,
                    },
                };
                let measured = match &setup {
                    Some(e) => Err(anyhow::anyhow!("set-up failed: {e}")),
                    None => udp_run(&sw.topo, via, cfg, dst, ports, cfg.udp_packets),
                };
                let (value, void, detail) =
                    measured.unwrap_or_else(|e| (0.0, Some(format!("{e:#}")), Value::Null));
                print_measured(metric, value, void.as_deref());
                samples.push(DsrSample {
                    scenario: s,
                    metric,
                    round,
                    value,
                    void,
                    idle,
                    detail,
                });
            }
            if let Ok(active) = active {
                stop(active, &mut sw).with_context(|| format!("tearing {} down", s.name()))?;
            }
            let mut left = leftovers(sw.balancer())?;
            left.retain(|l| !baseline.contains(l));
            ensure!(
                left.is_empty(),
                "dsr, round {round}, {} left this behind on the balancer: {left:?}",
                s.name()
            );
        }
    }
    drop((sinks, listeners));
    Ok(samples)
}

/// The DSR samples for the JSON.
pub fn json(samples: &[DsrSample]) -> Value {
    Value::from(
        (samples.iter())
            .map(|s| {
                json!({
                    "scenario": s.scenario.key(),
                    "metric": s.metric.key(),
                    "round": s.round,
                    "value": s.value,
                    "void": s.void,
                    "idle": s.idle.json(),
                    "detail": s.detail,
                })
            })
            .collect::<Vec<_>>(),
    )
}
