//! Node firewalls as the systems users run leave them, loaded into a test topology's node
//! (its bridge `lbbr0` plays the containers' bridge): what the vetted fast path is tested on
//! (`lb-user/tests/vetted_path.rs`) and what `cargo xtask bench` measures every scenario on
//! besides an empty node.
//! - Docker: dockerd 20.10's filter table as `iptables-save` shows it for one bridge whose
//!   containers publish ports (FORWARD policy drop, DOCKER-USER, the isolation chains,
//!   `-o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`, an accept per
//!   published port in DOCKER), loaded with iptables-nft, and its ip6tables twin on a
//!   dual-stack topology (dockerd with `--ipv6`).
//! - Nomad: the chains the real CNI `firewall` plugin (Debian's containernetworking-plugins,
//!   iptables backend, admin chain NOMAD-ADMIN) makes for each backend, Nomad's own accept of
//!   its bridge's subnets in NOMAD-ADMIN, and FORWARD's policy drop (Docker beside Nomad).
use std::net::IpAddr;

use anyhow::{Context as _, Result};
use serde_json::json;

use crate::netns::{NODE_BRIDGE, Topology};

/// The firewall of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeShape {
    /// Nothing in the forward path.
    Empty,
    Docker,
    Nomad,
}

impl NodeShape {
    pub const ALL: [NodeShape; 3] = [NodeShape::Empty, NodeShape::Docker, NodeShape::Nomad];

    pub fn name(self) -> &'static str {
        match self {
            NodeShape::Empty => "empty node",
            NodeShape::Docker => "Docker-shaped node",
            NodeShape::Nomad => "Nomad-shaped node",
        }
    }

    /// The name in the JSON file.
    pub fn key(self) -> &'static str {
        match self {
            NodeShape::Empty => "empty",
            NodeShape::Docker => "docker",
            NodeShape::Nomad => "nomad",
        }
    }

    /// Loads the shape's rules into the node of `topo` (of both families on a dual-stack
    /// topology), the backends publishing `published` (protocol, port) as containers would.
    pub fn load(self, topo: &Topology, published: &[(&str, u16)]) -> Result<()> {
        match self {
            NodeShape::Empty => Ok(()),
            NodeShape::Docker => docker(topo, published),
            NodeShape::Nomad => nomad(topo),
        }
        .with_context(|| format!("loading the {}'s firewall", self.name()))
    }

    /// Takes the shape's rules out again: the filter tables of both families (iptables-nft
    /// keeps them as nftables tables) deleted.
    pub fn unload(self, topo: &Topology) -> Result<()> {
        if self == NodeShape::Empty {
            return Ok(());
        }
        for family in ["ip", "ip6"] {
            topo.node.sh(&format!("nft delete table {family} filter"))?;
        }
        Ok(())
    }

    /// The chain an operator (or Docker, or Nomad) puts their own rules in ahead of the rest.
    pub fn user_chain(self) -> &'static str {
        match self {
            NodeShape::Empty | NodeShape::Docker => "DOCKER-USER",
            NodeShape::Nomad => "NOMAD-ADMIN",
        }
    }

    /// A rule this system adds when a container starts (iptables arguments): unrelated to the
    /// topology's flows.
    pub fn unrelated_rule(self) -> &'static str {
        match self {
            NodeShape::Empty | NodeShape::Docker => {
                "-A DOCKER -d 10.20.0.99/32 ! -i lbbr0 -o lbbr0 -p tcp -m tcp --dport 81 -j ACCEPT"
            }
            NodeShape::Nomad => {
                "-A CNI-FORWARD -d 10.20.0.99/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
            }
        }
    }
}

/// dockerd 20.10's filter table (`iptables-save`) for the backends of `topo` publishing
/// `published`, and its ip6tables twin for their IPv6 addresses.
fn docker(topo: &Topology, published: &[(&str, u16)]) -> Result<()> {
    let mut families: Vec<(&str, Vec<IpAddr>, &str)> = vec![(
        "iptables-restore",
        topo.backend_ips.iter().map(|&a| a.into()).collect(),
        "/32",
    )];
    if let Some(v6) = &topo.ipv6 {
        families.push((
            "ip6tables-restore",
            v6.backends.iter().map(|&a| a.into()).collect(),
            "/128",
        ));
    }
    for (restore, backends, host) in families {
        let br = NODE_BRIDGE;
        let mut t = format!(
            "*filter\n\
             :INPUT ACCEPT [0:0]\n\
             :FORWARD DROP [0:0]\n\
             :OUTPUT ACCEPT [0:0]\n\
             :DOCKER - [0:0]\n\
             :DOCKER-ISOLATION-STAGE-1 - [0:0]\n\
             :DOCKER-ISOLATION-STAGE-2 - [0:0]\n\
             :DOCKER-USER - [0:0]\n\
             -A FORWARD -j DOCKER-USER\n\
             -A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
             -A FORWARD -o {br} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
             -A FORWARD -o {br} -j DOCKER\n\
             -A FORWARD -i {br} ! -o {br} -j ACCEPT\n\
             -A FORWARD -i {br} -o {br} -j ACCEPT\n"
        );
        // Port by port, each port's backends together: a datagram that is never answered
        // stays NEW in conntrack and walks DOCKER to its rule with every packet, and the
        // bench publishes some 60 ports per backend (one per scenario and round). In
        // Docker's own order (container by container) the last backend's first rule would
        // lie some 200 rules down the chain, while the no-LB path's backend 0 matches the
        // first: the ratios would measure the rule order, not the paths.
        for (proto, port) in published {
            for b in &backends {
                t += &format!(
                    "-A DOCKER -d {b}{host} ! -i {br} -o {br} -p {proto} -m {proto} --dport {port} -j ACCEPT\n"
                );
            }
        }
        t += &format!(
            "-A DOCKER-ISOLATION-STAGE-1 -i {br} ! -o {br} -j DOCKER-ISOLATION-STAGE-2\n\
             -A DOCKER-ISOLATION-STAGE-1 -j RETURN\n\
             -A DOCKER-ISOLATION-STAGE-2 -o {br} -j DROP\n\
             -A DOCKER-ISOLATION-STAGE-2 -j RETURN\n\
             -A DOCKER-USER -j RETURN\n\
             COMMIT\n"
        );
        topo.node.sh(&format!("{restore} <<'EOF'\n{t}EOF"))?;
    }
    Ok(())
}

/// The real `firewall` plugin's ADD for each backend, as Nomad's bridge network runs it;
/// Nomad's accept of its bridge's subnets in NOMAD-ADMIN; FORWARD's policy drop.
fn nomad(topo: &Topology) -> Result<()> {
    let v6 = topo.ipv6.as_ref();
    for tool in ["iptables", "ip6tables"] {
        topo.node.sh(&format!("{tool} -P FORWARD DROP"))?;
    }
    for (i, (ns, ip)) in topo.backends.iter().zip(&topo.backend_ips).enumerate() {
        let mut ips = vec![json!({"address": format!("{ip}/24"), "interface": 0})];
        if let Some(v6) = v6 {
            ips.push(json!({"address": format!("{}/64", v6.backends[i]), "interface": 0}));
        }
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "nomad",
            "type": "firewall",
            "backend": "iptables",
            "iptablesAdminChainName": "NOMAD-ADMIN",
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "sandbox": ns.path()}],
                "ips": ips
            }
        });
        topo.node.sh(&format!(
            "CNI_COMMAND=ADD CNI_CONTAINERID=lbtest{i} CNI_NETNS={} CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni /usr/lib/cni/firewall <<'EOF'\n{conf}\nEOF",
            ns.path().display()
        ))?;
    }
    let br = NODE_BRIDGE;
    topo.node.sh(&format!(
        "iptables -A NOMAD-ADMIN -o {br} -d 10.20.0.0/24 -j ACCEPT"
    ))?;
    if v6.is_some() {
        topo.node.sh(&format!(
            "ip6tables -A NOMAD-ADMIN -o {br} -d fd20::/64 -j ACCEPT"
        ))?;
    }
    Ok(())
}
