//! `cargo xtask bench`, the real-traffic part: scenarios (no load balancer, the kernel's load
//! balancers, lb's dataplanes) measured with operators' tools through one topology
//! ([`real`]), and what is made of their samples ([`report`]: medians, ratios, void runs,
//! the targets, BENCHMARKS.md, the JSON and the chart).
pub mod dsr;
pub mod packets;
pub mod real;
pub mod report;

/// One way of carrying the client's traffic through the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// The client talks to a backend address, routed by the node: the ratios' base.
    NoLb,
    /// `lb daemon --dataplane nftables` (moby's ruleset).
    Nft,
    /// kube-proxy's iptables chains, written by the bench.
    Iptables,
    /// `lb daemon --dataplane ebpf`, `--attach tc --fast-path off`.
    LbTc,
    /// `--attach xdp --fast-path off`.
    LbXdp,
    /// `--attach tc --fast-path auto`.
    LbTcFast,
    /// `--attach xdp --fast-path auto`.
    LbXdpFast,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::NoLb,
        Scenario::Nft,
        Scenario::Iptables,
        Scenario::LbTc,
        Scenario::LbXdp,
        Scenario::LbTcFast,
        Scenario::LbXdpFast,
    ];

    /// lb's own scenarios: those the targets are about.
    pub const LB: [Scenario; 4] = [
        Scenario::LbTc,
        Scenario::LbXdp,
        Scenario::LbTcFast,
        Scenario::LbXdpFast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::NoLb => "no LB",
            Scenario::Nft => "nft",
            Scenario::Iptables => "iptables",
            Scenario::LbTc => "lb tc",
            Scenario::LbXdp => "lb xdp",
            Scenario::LbTcFast => "lb tc fast",
            Scenario::LbXdpFast => "lb xdp fast",
        }
    }

    /// The name in the JSON file.
    pub fn key(self) -> &'static str {
        match self {
            Scenario::NoLb => "no_lb",
            Scenario::Nft => "nft",
            Scenario::Iptables => "iptables",
            Scenario::LbTc => "lb_tc",
            Scenario::LbXdp => "lb_xdp",
            Scenario::LbTcFast => "lb_tc_fast",
            Scenario::LbXdpFast => "lb_xdp_fast",
        }
    }

    pub fn index(self) -> usize {
        Scenario::ALL
            .iter()
            .position(|&s| s == self)
            .expect("every scenario is in ALL")
    }
}

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// UDP 64 B (IPv4) packets per second delivered at the backends, one flow.
    Udp1,
    /// The same from 64k source ports.
    Udp64k,
    /// New connections per second (wrk, `Connection: close`).
    ConnPerSec,
    /// Round trip (sockperf UDP ping-pong), median and 99th percentile, microseconds.
    RttP50,
    RttP99,
    /// TCP throughput of one stream (iperf 2), bits per second.
    Tcp,
    /// [`Metric::Udp1`] over IPv6: the same 18-byte payload, so 84-byte frames (IPv6's header
    /// is 20 bytes longer than IPv4's).
    Udp1V6,
    /// [`Metric::Udp64k`] over IPv6.
    Udp64kV6,
    /// [`Metric::ConnPerSec`] over IPv6.
    ConnPerSecV6,
    /// [`Metric::Tcp`] over IPv6 (iperf 2 `-V`).
    TcpV6,
}

impl Metric {
    pub const ALL: [Metric; 10] = [
        Metric::Udp1,
        Metric::Udp64k,
        Metric::ConnPerSec,
        Metric::RttP50,
        Metric::RttP99,
        Metric::Tcp,
        Metric::Udp1V6,
        Metric::Udp64kV6,
        Metric::ConnPerSecV6,
        Metric::TcpV6,
    ];

    /// Whether the metric is measured over IPv6 (to the service's IPv6 VIP; no LB: to
    /// backend 0's IPv6 address).
    pub fn ipv6(self) -> bool {
        matches!(
            self,
            Metric::Udp1V6 | Metric::Udp64kV6 | Metric::ConnPerSecV6 | Metric::TcpV6
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Udp1 => "UDP 64 B, 1 flow",
            Metric::Udp64k => "UDP 64 B, 64k flows",
            Metric::ConnPerSec => "new connections/s",
            Metric::RttP50 => "RTT p50",
            Metric::RttP99 => "RTT p99",
            Metric::Tcp => "TCP, 1 stream",
            Metric::Udp1V6 => "UDP 84 B, 1 flow (IPv6)",
            Metric::Udp64kV6 => "UDP 84 B, 64k flows (IPv6)",
            Metric::ConnPerSecV6 => "new connections/s (IPv6)",
            Metric::TcpV6 => "TCP, 1 stream (IPv6)",
        }
    }

    /// A short name for the chart's axis.
    pub fn short(self) -> &'static str {
        match self {
            Metric::Udp1 => "UDP 1 flow",
            Metric::Udp64k => "UDP 64k flows",
            Metric::ConnPerSec => "conn/s",
            Metric::RttP50 => "RTT p50",
            Metric::RttP99 => "RTT p99",
            Metric::Tcp => "TCP",
            Metric::Udp1V6 => "UDP6 1 flow",
            Metric::Udp64kV6 => "UDP6 64k flows",
            Metric::ConnPerSecV6 => "conn/s v6",
            Metric::TcpV6 => "TCP v6",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Metric::Udp1 => "udp_1flow_pps",
            Metric::Udp64k => "udp_64kflows_pps",
            Metric::ConnPerSec => "conn_per_sec",
            Metric::RttP50 => "rtt_p50_us",
            Metric::RttP99 => "rtt_p99_us",
            Metric::Tcp => "tcp_bps",
            Metric::Udp1V6 => "udp6_1flow_pps",
            Metric::Udp64kV6 => "udp6_64kflows_pps",
            Metric::ConnPerSecV6 => "conn6_per_sec",
            Metric::TcpV6 => "tcp6_bps",
        }
    }

    /// Whether more is better (throughputs) or less (round trips).
    pub fn higher_is_better(self) -> bool {
        !matches!(self, Metric::RttP50 | Metric::RttP99)
    }

    /// A value in the metric's unit, for the report.
    pub fn show(self, v: f64) -> String {
        format!("{} {}", self.number(v), self.unit())
    }

    /// A value as a number of [`Metric::unit`]s.
    pub fn number(self, v: f64) -> String {
        match self {
            Metric::Udp1 | Metric::Udp64k | Metric::Udp1V6 | Metric::Udp64kV6 => {
                format!("{:.3}", v / 1e6)
            }
            Metric::ConnPerSec | Metric::ConnPerSecV6 => format!("{:.1}", v / 1e3),
            Metric::RttP50 | Metric::RttP99 => format!("{v:.1}"),
            Metric::Tcp | Metric::TcpV6 => format!("{:.2}", v / 1e9),
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::Udp1 | Metric::Udp64k | Metric::Udp1V6 | Metric::Udp64kV6 => "Mpps",
            Metric::ConnPerSec | Metric::ConnPerSecV6 => "k/s",
            Metric::RttP50 | Metric::RttP99 => "µs",
            Metric::Tcp | Metric::TcpV6 => "Gbit/s",
        }
    }
}
