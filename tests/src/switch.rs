//! The direct-server-return topology: client, balancer and backends as hosts on one switch, and
//! the switch counting which port every packet came in and went out by.
//!
//! It is [`Topology::single_interface`] (every host has `lo` + `eth0` on one /24, the segment a
//! bridge in its own `switch` namespace), set up as a DSR segment is:
//! ```text
//!            switch (br0; nft bridge table `lbt_switch` counts every IPv4 and IPv6 hop)
//!   sw0 ─ balancer 10.30.0.1   (lb's dsr network; lb's VIP alias on eth0 answers ARP)
//!   sw1 ─ client   10.30.0.2   (arp_announce 2)
//!   sw2 ─ b0       10.30.0.10  ┐ VIP 10.30.0.100/32 on lo, arp_ignore 1, arp_announce 2:
//!   sw3 ─ b1       10.30.0.11  │ each accepts VIP traffic sent to its MAC and answers the
//!   …                          ┘ client directly from the VIP, but never answers ARP for it
//! ```
//! - The VIP is on the segment: the client ARPs for it, and only the balancer may answer (lb adds
//!   the alias when a dsr network serves the VIP; without it nobody answers).
//! - `arp_announce` 2 makes a host's ARP requests carry the address of the interface they leave
//!   by: with the default, a backend asking for the client while answering from the VIP would
//!   announce VIP → its own MAC and teach the client to bypass the balancer (and a client with
//!   several addresses would teach the wrong source likewise).
//! - rp_filter is off everywhere (every harness namespace's `all` and `default`, which `eth0`
//!   inherits): a backend receives the client's packets from the balancer's MAC.
//! - The balancer's switch port `sw0` runs an XDP program that passes every frame, unless
//!   asked otherwise: a veth delivers what its peer sends by XDP_TX or an XDP redirect only
//!   through its own XDP receive path. The kernel documents GRO on the receiving veth as
//!   enough too, but on Linux 6.18 here frames XDP_TX sent to a peer with GRO alone never
//!   arrived (counted as sent, no error, seen by nothing on the peer), while an XDP program
//!   there delivers them: DSR on XDP over a veth needs it, and `lb status` warns without it.
//!   The program is lb's own `lb_xdp` loaded with private, empty maps, which passes every
//!   frame (nothing is a service).
//!
//! The switch's counters are an nftables `bridge` table in the switch namespace (one this
//! harness created, holding nothing else): a dynamic set per family with a counter per (source,
//! destination, ingress port, egress port) of every IPv4 and IPv6 packet the bridge forwards. A flooded frame counts
//! once per port it goes out by. So "every reply went backend → client, none through the
//! balancer's port" is a query over [`Hops`].
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};
use aya::programs::{Xdp, XdpMode};
use lb_user::{
    dataplane::ebpf::{EbpfNetwork, PROG_XDP},
    node::in_netns,
};
use serde_json::Value;

use crate::netns::{ENDPOINT_IF, Netns, SWITCH_CLIENT_PORT, SWITCH_NODE_PORT, Topology};

/// The VIP of the topology: on the segment's /24, owned by every backend.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 30, 0, 100);
/// The IPv6 VIP of [`Switch::dual_stack`]: on the segment's /64, owned by every backend.
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 0x100);

/// The nftables table (family bridge) of the switch namespace, and its sets of hop counters
/// (IPv4's and IPv6's).
const TABLE: &str = "lbt_switch";
const HOPS: &str = "hops";
const HOPS6: &str = "hops6";

/// See the module documentation. Dropping it deletes every namespace, the switch's table with
/// its own, and the program on the balancer's switch port with its namespace.
pub struct Switch {
    /// The namespaces: `node` is the balancer, `switch` holds the bridge.
    pub topo: Topology,
    /// The XDP program on the balancer's switch port, while it is attached.
    peer_xdp: Option<EbpfNetwork>,
}

impl fmt::Debug for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Switch")
            .field("topo", &self.topo)
            .field("peer_xdp", &self.peer_xdp.is_some())
            .finish()
    }
}

impl Switch {
    /// A client, a balancer and `n_backends` backends on one switch, as in the module
    /// documentation; the balancer's switch port runs an XDP program iff `balancer_peer_xdp`.
    pub fn new(n_backends: usize, balancer_peer_xdp: bool) -> Result<Switch> {
        Switch::on(Topology::single_interface(n_backends)?, balancer_peer_xdp)
    }

    /// [`Switch::new`] with IPv6 beside IPv4 ([`Topology::single_interface_dual_stack`]),
    /// [`VIP6`] on every backend's `lo` too. IPv6 needs nothing in place of `arp_ignore`: a
    /// host answers a neighbour solicitation only for an address of the interface it came in
    /// on, so only the balancer (lb's alias on `eth0`) answers for the VIP; nor of
    /// `arp_announce`: a solicitation is sent from an address of the interface it leaves by.
    pub fn dual_stack(n_backends: usize, balancer_peer_xdp: bool) -> Result<Switch> {
        let sw = Switch::on(
            Topology::single_interface_dual_stack(n_backends)?,
            balancer_peer_xdp,
        )?;
        let vip = format!("{VIP6}/128");
        for backend in &sw.topo.backends {
            backend.ip(["-6", "addr", "add", &vip, "dev", "lo", "nodad"])?;
        }
        Ok(sw)
    }

    fn on(topo: Topology, balancer_peer_xdp: bool) -> Result<Switch> {
        let mut sw = Switch {
            topo,
            peer_xdp: None,
        };
        let vip = format!("{VIP}/32");
        for backend in &sw.topo.backends {
            backend.ip(["addr", "add", &vip, "dev", "lo"])?;
            for conf in ["all", ENDPOINT_IF] {
                backend.sysctl(&format!("net.ipv4.conf.{conf}.arp_ignore"), "1")?;
                backend.sysctl(&format!("net.ipv4.conf.{conf}.arp_announce"), "2")?;
            }
        }
        for conf in ["all", ENDPOINT_IF] {
            (sw.topo.client).sysctl(&format!("net.ipv4.conf.{conf}.arp_announce"), "2")?;
        }
        if balancer_peer_xdp {
            sw.attach_balancer_peer_xdp()?;
        }
        sw.switch().sh(&format!(
            "nft -f - <<'EOF'\n\
             table bridge {TABLE} {{\n\
               set {HOPS} {{\n\
                 type ipv4_addr . ipv4_addr . ifname . ifname\n\
                 flags dynamic\n\
                 counter\n\
                 size 4096\n\
               }}\n\
               set {HOPS6} {{\n\
                 type ipv6_addr . ipv6_addr . ifname . ifname\n\
                 flags dynamic\n\
                 counter\n\
                 size 4096\n\
               }}\n\
               chain forward {{\n\
                 type filter hook forward priority 0; policy accept;\n\
                 ether type ip add @{HOPS} {{ ip saddr . ip daddr . iifname . oifname }}\n\
                 ether type ip6 add @{HOPS6} {{ ip6 saddr . ip6 daddr . iifname . oifname }}\n\
               }}\n\
             }}\n\
             EOF"
        ))?;
        Ok(sw)
    }

    /// The balancer's namespace (lb's `--netns`).
    pub fn balancer(&self) -> &Netns {
        &self.topo.node
    }

    /// The balancer's interface (lb's `--interface`).
    pub fn balancer_if(&self) -> &'static str {
        ENDPOINT_IF
    }

    pub fn balancer_ip(&self) -> Ipv4Addr {
        self.topo.node_ip
    }

    /// The IPv6 addresses of a [`Switch::dual_stack`].
    pub fn v6(&self) -> &crate::netns::Ipv6Addrs {
        self.topo.v6()
    }

    pub fn client(&self) -> &Netns {
        &self.topo.client
    }

    pub fn client_ip(&self) -> Ipv4Addr {
        self.topo.client_ip
    }

    /// The switch namespace.
    pub fn switch(&self) -> &Netns {
        self.topo
            .switch
            .as_ref()
            .expect("single_interface has a switch")
    }

    /// The switch port facing the balancer, the client, backend `i`.
    pub fn balancer_port(&self) -> &'static str {
        SWITCH_NODE_PORT
    }

    pub fn client_port(&self) -> &'static str {
        SWITCH_CLIENT_PORT
    }

    pub fn backend_port(&self, i: usize) -> String {
        Topology::switch_port(i)
    }

    /// Sets GRO of the balancer's switch port (the peer of the balancer's `eth0`).
    pub fn set_balancer_peer_gro(&self, on: bool) -> Result<()> {
        self.switch().set_gro(self.balancer_port(), on)
    }

    /// Whether GRO of the balancer's switch port is on, as `ethtool -k` reads it.
    pub fn balancer_peer_gro(&self) -> Result<bool> {
        self.switch().gro(self.balancer_port())
    }

    /// Attaches the pass-everything XDP program to the balancer's switch port (see the module
    /// documentation), natively, in the switch namespace.
    pub fn attach_balancer_peer_xdp(&mut self) -> Result<()> {
        let mut net = EbpfNetwork::unpinned()?;
        let port = self.balancer_port();
        let net = in_netns(Some(&self.switch().path().to_string_lossy()), move || {
            let prog: &mut Xdp = (net.ebpf_mut().program_mut(PROG_XDP))
                .context("lb_xdp in the object")?
                .try_into()?;
            prog.load().context("loading lb_xdp")?;
            prog.attach(port, XdpMode::Driver)
                .with_context(|| format!("attaching lb_xdp to {port}"))?;
            Ok(net)
        })?;
        self.peer_xdp = Some(net);
        Ok(())
    }

    /// Detaches it again.
    pub fn detach_balancer_peer_xdp(&mut self) {
        self.peer_xdp = None;
    }

    /// The switch's counters of both families so far (since it was made, or since
    /// [`Switch::reset_counts`]).
    pub fn counts(&self) -> Result<Hops> {
        let mut all = Hops::default();
        for set in [HOPS, HOPS6] {
            let out = self
                .switch()
                .exec(["nft", "-j", "list", "set", "bridge", TABLE, set])?;
            let hops = Hops::parse(&out)
                .with_context(|| format!("`nft -j list set bridge {TABLE} {set}`: {out}"))?;
            all.0.extend(hops.0);
        }
        Ok(all)
    }

    /// Forgets every counter.
    pub fn reset_counts(&self) -> Result<()> {
        for set in [HOPS, HOPS6] {
            self.switch()
                .exec(["nft", "flush", "set", "bridge", TABLE, set])?;
        }
        Ok(())
    }
}

/// Packets of one source, destination, and ports of the switch they came in and went out by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hop {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub in_port: String,
    pub out_port: String,
}

impl Hop {
    /// Whether the packets came in or went out by `port`.
    pub fn touches(&self, port: &str) -> bool {
        self.in_port == port || self.out_port == port
    }
}

/// The switch's packet counts per [`Hop`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hops(pub BTreeMap<Hop, u64>);

impl Hops {
    /// The counts `nft -j list set` prints.
    fn parse(json: &str) -> Result<Hops> {
        let v: Value = serde_json::from_str(json)?;
        let set = (v["nftables"].as_array().context("no nftables array")?)
            .iter()
            .find_map(|o| o.get("set"))
            .context("no set")?;
        let mut hops = BTreeMap::new();
        // An empty set has no `elem` at all.
        for e in set["elem"].as_array().into_iter().flatten() {
            let elem = &e["elem"];
            let fields = elem["val"]["concat"]
                .as_array()
                .with_context(|| format!("not a concatenation: {e}"))?;
            let field = |i: usize| {
                (fields.get(i).and_then(Value::as_str)).with_context(|| format!("field {i} of {e}"))
            };
            let hop = Hop {
                src: field(0)?.parse()?,
                dst: field(1)?.parse()?,
                in_port: field(2)?.to_owned(),
                out_port: field(3)?.to_owned(),
            };
            let packets = (elem["counter"]["packets"].as_u64())
                .with_context(|| format!("no counter in {e}"))?;
            hops.insert(hop, packets);
        }
        Ok(Hops(hops))
    }

    /// Packets of the hops `which` selects.
    pub fn packets(&self, which: impl Fn(&Hop) -> bool) -> u64 {
        (self.0.iter())
            .filter(|(h, _)| which(h))
            .map(|(_, n)| n)
            .sum()
    }

    /// The hops `which` selects, with their packets.
    pub fn select(&self, which: impl Fn(&Hop) -> bool) -> Hops {
        Hops(
            (self.0.iter())
                .filter(|(h, _)| which(h))
                .map(|(h, n)| (h.clone(), *n))
                .collect(),
        )
    }
}

impl fmt::Display for Hops {
    /// One hop per line: `10.30.0.100 -> 10.30.0.2 sw2 -> sw1: 12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (h, n) in &self.0 {
            writeln!(
                f,
                "{} -> {} {} -> {}: {n}",
                h.src, h.dst, h.in_port, h.out_port
            )?;
        }
        Ok(())
    }
}
