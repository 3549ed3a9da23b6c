//! trafgen sending UDP frames at line rate from a namespace: the configuration of the flows
//! asked for, and how many it sent in how long.
use std::fs;
use std::net::IpAddr;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::{TempDir, in_netns, link::Mac, run_tool};
use crate::netns::Netns;

/// The UDP source ports of a [`UdpSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcPorts {
    /// Every packet from this port: one flow.
    Fixed(u16),
    /// `count` flows, ports `first .. first + count`, taken in turn (trafgen's `dinc` on the
    /// port's low byte, so the range stays within one 256-port block).
    Flows { first: u16, count: u16 },
    /// `count` flows, ports `first .. first + count` (up to all 65,535), taken in turn:
    /// written with trafgen's header functions (`udp(sp=dinc(..))`), whose 16-bit counter
    /// and checksums trafgen computes for every packet.
    Range { first: u16, count: u16 },
}

/// The UDP packets [`trafgen_udp`] sends: one Ethernet/IPv4/UDP or Ethernet/IPv6/UDP frame
/// (the family of the addresses, which must agree), repeated.
#[derive(Debug, Clone)]
pub struct UdpSpec {
    /// The interface trafgen sends on, in the namespace it runs in.
    pub ifname: String,
    pub src_mac: Mac,
    /// The next hop's address (the node's interface, for a routed path).
    pub dst_mac: Mac,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub src_ports: SrcPorts,
    pub dst_port: u16,
    /// UDP payload bytes; the default 18 makes 60-byte IPv4 frames, 64 on a wire with its
    /// FCS (IPv6's header is 20 bytes longer: 80, and 84 with the FCS).
    pub payload_len: usize,
    pub count: u64,
    /// The CPU trafgen sends from. trafgen pins its senders itself (taskset would be undone),
    /// so this schedules the packet with the configuration's `cpu(N):`; without it, one sender
    /// runs pinned to CPU 0.
    pub cpu: Option<usize>,
}

/// UDP payload bytes for a minimum-size (64-byte with FCS) Ethernet frame.
pub const MIN_UDP_PAYLOAD: usize = 18;

const ETH_HLEN: usize = 14;
const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const UDP_HLEN: usize = 8;
/// The ring's default frame slot holds 2048 bytes, and the namespaces' links have MTU 1500.
const MAX_UDP_PAYLOAD: usize = 1500 - IPV4_HLEN - UDP_HLEN;
const MAX_UDP6_PAYLOAD: usize = 1500 - IPV6_HLEN - UDP_HLEN;

/// The Ethernet frame, without its FCS, of a UDP datagram of `payload_len` bytes over IPv4
/// (`ipv6` false) or IPv6: what a [`UdpSpec`] of that family sends.
pub fn udp_frame_len(ipv6: bool, payload_len: usize) -> usize {
    let ip = if ipv6 { IPV6_HLEN } else { IPV4_HLEN };
    ETH_HLEN + ip + UDP_HLEN + payload_len
}

impl UdpSpec {
    /// `count` packets with [`MIN_UDP_PAYLOAD`] bytes of payload (minimum-size frames over
    /// IPv4) from `src_ip:src_port` to `dst_ip:dst_port`, sent on `ifname` from `src_mac` to
    /// `dst_mac`, on CPU 0.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ifname: &str,
        src_mac: Mac,
        dst_mac: Mac,
        src_ip: impl Into<IpAddr>,
        src_port: u16,
        dst_ip: impl Into<IpAddr>,
        dst_port: u16,
        count: u64,
    ) -> UdpSpec {
        UdpSpec {
            ifname: ifname.to_owned(),
            src_mac,
            dst_mac,
            src_ip: src_ip.into(),
            dst_ip: dst_ip.into(),
            src_ports: SrcPorts::Fixed(src_port),
            dst_port,
            payload_len: MIN_UDP_PAYLOAD,
            count,
            cpu: None,
        }
    }

    /// The trafgen configuration: one IPv4 frame in trafgen's byte language, with the IPv4
    /// header checksum (`csumip`) and the UDP checksum over the pseudo-header (`csumudp`)
    /// computed by trafgen — again for every packet when a `dinc` port changes it. An IPv6
    /// frame, and an IPv4 one of a 16-bit port range, are written in trafgen's header
    /// functions ([`UdpSpec::header_config`]).
    pub fn config(&self) -> Result<String> {
        let (src_ip, dst_ip) = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (s, d),
            (IpAddr::V6(_), IpAddr::V6(_)) => return self.config6(),
            (s, d) => bail!("trafgen: {s} and {d} are not of one family"),
        };
        ensure!(
            self.payload_len <= MAX_UDP_PAYLOAD,
            "UDP payload {} > {MAX_UDP_PAYLOAD} does not fit a 1500-byte MTU",
            self.payload_len
        );
        let bytes = |b: &[u8], fmt: fn(&u8) -> String| b.iter().map(fmt).collect::<Vec<_>>();
        let hex = |b: &[u8]| bytes(b, |x| format!("0x{x:02x}")).join(", ");
        let dec = |b: &[u8]| bytes(b, |x| x.to_string()).join(", ");
        let cpu = self.cpu.map(|c| format!("cpu({c}): ")).unwrap_or_default();
        let src_port = match self.src_ports {
            SrcPorts::Range { first, count } => {
                ensure!(
                    count > 0 && u32::from(first) + u32::from(count) <= 0x1_0000,
                    "{count} flows from port {first} run past port 65535"
                );
                return Ok(self.header_config(&cpu, first, first + (count - 1)));
            }
            SrcPorts::Fixed(port) => format!("c16({port})"),
            SrcPorts::Flows { first, count } => {
                let low = first & 0xff;
                ensure!(
                    count > 0 && u32::from(low) + u32::from(count) <= 0x100,
                    "{count} flows from port {first}: trafgen's dinc counts one byte, so the \
                     ports must lie within one 256-port block"
                );
                format!("c8({}), dinc({low}, {}, 1)", first >> 8, low + count - 1)
            }
        };
        let ip_len = IPV4_HLEN + UDP_HLEN + self.payload_len;
        let udp_len = UDP_HLEN + self.payload_len;
        let ip_off = ETH_HLEN;
        let udp_off = ETH_HLEN + IPV4_HLEN;
        let payload = if self.payload_len > 0 {
            format!("fill(0x61, {}),", self.payload_len)
        } else {
            String::new()
        };
        Ok(format!(
            "{cpu}{{
  {dst_mac},
  {src_mac},
  c16(0x0800),
  0x45, 0x00, c16({ip_len}), c16(0), c16(0x4000), 64, 17, csumip({ip_off}, {ip_end}),
  {src_ip},
  {dst_ip},
  {src_port}, c16({dst_port}), c16({udp_len}), csumudp({ip_off}, {udp_off}),
  {payload}
}}
",
            dst_mac = hex(&self.dst_mac.0),
            src_mac = hex(&self.src_mac.0),
            ip_end = udp_off - 1,
            src_ip = dec(&src_ip.octets()),
            dst_ip = dec(&dst_ip.octets()),
            dst_port = self.dst_port,
        ))
    }
}

impl UdpSpec {
    /// The IPv6 frame, in trafgen's header functions: every source port form as a `dinc`
    /// of the port (a fixed port is a range of one), and the UDP checksum over IPv6's
    /// pseudo-header computed by trafgen for every packet (UDP over IPv6 must carry one).
    fn config6(&self) -> Result<String> {
        ensure!(
            self.payload_len <= MAX_UDP6_PAYLOAD,
            "UDP payload {} > {MAX_UDP6_PAYLOAD} does not fit a 1500-byte MTU over IPv6",
            self.payload_len
        );
        let (first, count) = match self.src_ports {
            SrcPorts::Fixed(port) => (port, 1),
            SrcPorts::Flows { first, count } | SrcPorts::Range { first, count } => (first, count),
        };
        ensure!(
            count > 0 && u32::from(first) + u32::from(count) <= 0x1_0000,
            "{count} flows from port {first} run past port 65535"
        );
        let cpu = self.cpu.map(|c| format!("cpu({c}): ")).unwrap_or_default();
        Ok(self.header_config(&cpu, first, first + (count - 1)))
    }

    /// The same frame in trafgen's header functions, source port counting from `first` to
    /// `last` (a fixed port when they are equal); trafgen fills in lengths and checksums
    /// (IPv4's `df`: the byte form's flags 0x4000; IPv6's hop limit as IPv4's TTL).
    fn header_config(&self, cpu: &str, first: u16, last: u16) -> String {
        let payload = if self.payload_len > 0 {
            format!("  fill(0x61, {}),\n", self.payload_len)
        } else {
            String::new()
        };
        let (ethertype, ip) = match self.dst_ip {
            IpAddr::V4(_) => ("0x0800", "ipv4(id=0, ttl=64, df"),
            IpAddr::V6(_) => ("0x86dd", "ipv6(hl=64"),
        };
        let sp = if first == last {
            first.to_string()
        } else {
            format!("dinc({first}, {last})")
        };
        format!(
            "{cpu}{{
  eth(da={}, sa={}, type={ethertype}),
  {ip}, sa={}, da={}),
  udp(sp={sp}, dp={}),
{payload}}}
",
            self.dst_mac, self.src_mac, self.src_ip, self.dst_ip, self.dst_port
        )
    }
}

/// What [`trafgen_udp`] sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafgenRun {
    pub sent: u64,
    /// How long the sender on the spec's CPU took, as trafgen timed it (its
    /// `S sec, U usec on CPUn (N packets)` line): the sending window, without trafgen's own
    /// start and set-up. `None` without a spec CPU.
    pub window: Option<Duration>,
}

/// Sends `spec.count` UDP packets from `ns` with netsniff-ng's trafgen through its default
/// PF_PACKET TX ring (never `--gap`/`--rate`, which switch trafgen to sendto()): the kernel
/// then builds skbs whose payload lies in page fragments of the ring, as no kernel socket
/// does. Frames go straight to the device (trafgen bypasses the qdisc layer, so no tc egress
/// hook of the sending namespace sees them). trafgen is told not to retune socket memory
/// (`--no-sock-mem`) nor IRQ affinity (`--notouch-irq`): it would write /proc/sys and
/// /proc/irq otherwise. Returns when trafgen has sent them all, having checked that it says so.
pub fn trafgen_udp(ns: &Netns, spec: &UdpSpec) -> Result<TrafgenRun> {
    ensure!(spec.count > 0, "trafgen: count 0 means forever");
    let processes = match spec.cpu {
        None => 1,
        Some(cpu) => {
            let cpus = thread::available_parallelism().map_or(1, |n| n.get());
            ensure!(cpu < cpus, "trafgen: no CPU {cpu} (of {cpus})");
            // Senders 0..cpu are forked, find no packet for their CPU and end at once.
            cpu + 1
        }
    };
    let dir = TempDir::new("trafgen")?;
    let conf = dir.join("udp.cfg");
    fs::write(&conf, spec.config()?).with_context(|| format!("writing {}", conf.display()))?;
    let mut cmd = in_netns(ns, None, "trafgen", ["--dev", &spec.ifname]);
    cmd.arg("--conf").arg(&conf).args([
        "--num",
        &spec.count.to_string(),
        "--cpus",
        &processes.to_string(),
        // The short forms of these two are listed in `--help` but refused by trafgen 0.6.8.
        "--no-sock-mem",
        "--notouch-irq",
    ]);
    // A hung sender, not a slow one: this VM's sends run at well over 100k packets/s.
    let limit = Duration::from_secs(10) + Duration::from_millis(spec.count / 10);
    let run = run_tool(cmd, &format!("trafgen in {}", ns.name()), limit)?;
    let sent = trafgen_sent(&run.stdout).with_context(|| {
        format!(
            "trafgen ({}): stdout: {}\nstderr: {}",
            run.status, run.stdout, run.stderr
        )
    })?;
    ensure!(
        sent == spec.count,
        "trafgen sent {sent} packets, not {}: {}",
        spec.count,
        run.stdout
    );
    // Its per-CPU summary, `0 sec, 8692 usec on CPU1 (3000 packets)`, shows where they went.
    let window = match spec.cpu {
        None => None,
        Some(cpu) => Some(
            trafgen_window(&run.stdout, cpu, sent)
                .with_context(|| format!("trafgen did not send from CPU {cpu}: {}", run.stdout))?,
        ),
    };
    Ok(TrafgenRun { sent, window })
}

/// The time trafgen's sender on `cpu` took to send `sent` packets, from its summary line
/// `           0 sec, 581524 usec on CPU1 (200000 packets)`.
fn trafgen_window(stdout: &str, cpu: usize, sent: u64) -> Result<Duration> {
    let suffix = format!(" usec on CPU{cpu} ({sent} packets)");
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.ends_with(&suffix))
        .with_context(|| format!("no line ending in {suffix:?}"))?;
    let (secs, usecs) = line
        .trim_end_matches(&suffix)
        .split_once(" sec, ")
        .with_context(|| format!("no `sec, ` in {line:?}"))?;
    let (secs, usecs): (u64, u64) = (
        secs.trim().parse().with_context(|| format!("{line:?}"))?,
        usecs.trim().parse().with_context(|| format!("{line:?}"))?,
    );
    Ok(Duration::from_secs(secs) + Duration::from_micros(usecs))
}

/// trafgen's `      3000 packets outgoing` line.
fn trafgen_sent(stdout: &str) -> Result<u64> {
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.ends_with(" packets outgoing"))
        .context("no `packets outgoing` line")?;
    let n = line.split_whitespace().next().unwrap_or_default();
    n.parse()
        .with_context(|| format!("packets outgoing in {line:?}"))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn spec() -> UdpSpec {
        UdpSpec::new(
            "eth0",
            Mac([0x02, 0, 0, 0, 0, 0x01]),
            Mac([0x02, 0, 0, 0, 0, 0xfe]),
            Ipv4Addr::new(10, 10, 0, 2),
            40000,
            Ipv4Addr::new(10, 20, 0, 10),
            9999,
            3000,
        )
    }

    #[test]
    fn trafgen_config_of_one_minimum_size_flow() {
        assert_eq!(
            spec().config().unwrap(),
            "{
  0x02, 0x00, 0x00, 0x00, 0x00, 0xfe,
  0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
  c16(0x0800),
  0x45, 0x00, c16(46), c16(0), c16(0x4000), 64, 17, csumip(14, 33),
  10, 10, 0, 2,
  10, 20, 0, 10,
  c16(40000), c16(9999), c16(26), csumudp(14, 34),
  fill(0x61, 18),
}
"
        );
    }

    #[test]
    fn trafgen_config_of_flows_counts_the_port_low_byte_on_a_cpu() {
        let spec = UdpSpec {
            src_ports: SrcPorts::Flows {
                first: 40000,
                count: 64,
            },
            payload_len: 0,
            cpu: Some(1),
            ..spec()
        };
        let config = spec.config().unwrap();
        // 40000 = 0x9c40: high byte 156, low bytes 0x40..=0x7f.
        assert!(config.starts_with("cpu(1): {"), "{config}");
        assert!(
            config.contains("c8(156), dinc(64, 127, 1), c16(9999), c16(8)"),
            "{config}"
        );
        assert!(config.contains("c16(28)"), "{config}");
        assert!(!config.contains("fill"), "{config}");
        let crossing = UdpSpec {
            src_ports: SrcPorts::Flows {
                first: 40000,
                count: 200,
            },
            ..spec.clone()
        };
        assert!(crossing.config().is_err());
        let jumbo = UdpSpec {
            payload_len: MAX_UDP_PAYLOAD + 1,
            ..spec
        };
        assert!(jumbo.config().is_err());
    }

    #[test]
    fn trafgen_config_of_ipv6_uses_header_functions_for_every_port_form() {
        let v6 = |h: u16| std::net::Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, h);
        let spec = UdpSpec {
            cpu: Some(1),
            ..UdpSpec::new(
                "eth0",
                Mac([0x02, 0, 0, 0, 0, 0x01]),
                Mac([0x02, 0, 0, 0, 0, 0xfe]),
                v6(2),
                40000,
                v6(0x10),
                9,
                3000,
            )
        };
        assert_eq!(
            spec.config().unwrap(),
            "cpu(1): {
  eth(da=02:00:00:00:00:fe, sa=02:00:00:00:00:01, type=0x86dd),
  ipv6(hl=64, sa=fd10::2, da=fd10::10),
  udp(sp=40000, dp=9),
  fill(0x61, 18),
}
"
        );
        // 14 + 40 + 8 + 18 bytes: the IPv4 frame's payload in an IPv6 frame.
        assert_eq!(udp_frame_len(true, MIN_UDP_PAYLOAD), 80);
        assert_eq!(udp_frame_len(false, MIN_UDP_PAYLOAD), 60);
        for ports in [
            SrcPorts::Range {
                first: 1,
                count: 65_535,
            },
            SrcPorts::Flows {
                first: 1,
                count: 65_535,
            },
        ] {
            let range = UdpSpec {
                src_ports: ports,
                ..spec.clone()
            };
            let config = range.config().unwrap();
            assert!(config.contains("udp(sp=dinc(1, 65535), dp=9)"), "{config}");
        }
        let jumbo = UdpSpec {
            payload_len: MAX_UDP6_PAYLOAD + 1,
            ..spec.clone()
        };
        assert!(jumbo.config().is_err());
        let mixed = UdpSpec {
            src_ip: Ipv4Addr::new(10, 10, 0, 2).into(),
            ..spec
        };
        assert!(mixed.config().is_err(), "one family per frame");
    }

    #[test]
    fn trafgen_sent_count_is_read_from_its_summary() {
        let stdout = "     1 packets to schedule\n    60 bytes in total\nRunning! Hang up with ^C!\n\n\n        3000 packets outgoing\n      180000 bytes outgoing\n";
        assert_eq!(trafgen_sent(stdout).unwrap(), 3000);
        assert!(trafgen_sent("Running! Hang up with ^C!\n").is_err());
    }

    #[test]
    fn trafgen_window_is_the_chosen_cpus_sending_time() {
        // trafgen 0.6.8 with --cpus 2 and a `cpu(1):` packet.
        let stdout = "      200000 packets outgoing\n    12000000 bytes outgoing\n           0 sec, 1 usec on CPU0 (0 packets)\n           2 sec, 581524 usec on CPU1 (200000 packets)\n";
        assert_eq!(
            trafgen_window(stdout, 1, 200_000).unwrap(),
            Duration::from_micros(2_581_524)
        );
        assert!(trafgen_window(stdout, 0, 200_000).is_err());
        assert!(trafgen_window(stdout, 1, 100).is_err());
    }

    #[test]
    fn trafgen_config_of_a_16_bit_port_range_uses_header_functions() {
        let spec = UdpSpec {
            src_ports: SrcPorts::Range {
                first: 1,
                count: 65_535,
            },
            cpu: Some(1),
            ..spec()
        };
        assert_eq!(
            spec.config().unwrap(),
            "cpu(1): {
  eth(da=02:00:00:00:00:fe, sa=02:00:00:00:00:01, type=0x0800),
  ipv4(id=0, ttl=64, df, sa=10.10.0.2, da=10.20.0.10),
  udp(sp=dinc(1, 65535), dp=9999),
  fill(0x61, 18),
}
"
        );
        let past = UdpSpec {
            src_ports: SrcPorts::Range {
                first: 2,
                count: 65_535,
            },
            ..spec
        };
        assert!(past.config().is_err());
    }
}
