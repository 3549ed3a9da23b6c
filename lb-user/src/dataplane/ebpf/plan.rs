//! What one network's maps must hold, computed from the composed state alone (pure).
use std::{collections::BTreeMap, net::Ipv4Addr};

use lb_common::{MASQ_ALWAYS, MASQ_AUTO, MASQ_NEVER, Timeouts};

use crate::{
    core::compose::Composed,
    core::model::{Masquerade, Network},
};

/// A service map key: the VIP map's or the published-port map's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServiceKey {
    Vip(u32),
    Port { addr: u32, port: u16, proto: u8 },
}

/// What one network's maps must hold: every service key with its backend set in slot order
/// (address, destination port to rewrite to or 0 to keep; network byte order), the
/// masquerade mode and the flow timeouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub masquerade: u32,
    pub timeouts: Timeouts,
    pub services: BTreeMap<ServiceKey, Vec<(u32, u16)>>,
}

pub fn plan(network: &Network, composed: &Composed) -> Plan {
    let mut services = BTreeMap::new();
    for (vip, backends) in &composed.vips {
        let set = backends.iter().map(|ip| (be(*ip), 0)).collect();
        services.insert(ServiceKey::Vip(be(*vip)), set);
    }
    for (key, backends) in &composed.ports {
        let set = backends
            .iter()
            .map(|(ip, port)| (be(*ip), port.to_be()))
            .collect();
        let addr = key.host_ip.map(be).unwrap_or(0);
        services.insert(
            ServiceKey::Port {
                addr,
                port: key.port.to_be(),
                proto: key.proto.number(),
            },
            set,
        );
    }
    let masquerade = match network.masquerade {
        Masquerade::Auto => MASQ_AUTO,
        Masquerade::Always => MASQ_ALWAYS,
        Masquerade::Never => MASQ_NEVER,
    };
    Plan {
        masquerade,
        timeouts: network.timeouts.resolve(),
        services,
    }
}

/// An address as the maps hold it (network byte order in memory).
pub fn be(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

pub fn ip(addr: u32) -> Ipv4Addr {
    Ipv4Addr::from(addr.to_ne_bytes())
}

/// The node facts a sync needs besides the plan, read by the caller in the network's
/// namespace.
#[derive(Clone, Debug, Default)]
pub struct NodeAddrs {
    /// Every IPv4 address of the node (its namespace): what published ports answer on.
    pub local: Vec<Ipv4Addr>,
    /// ifindex → masquerade address, for each of the network's interfaces.
    pub ifaces: Vec<(u32, Ipv4Addr)>,
    /// The namespace's ephemeral port range (`net.ipv4.ip_local_port_range`), where its own
    /// sockets pick local ports: masquerade ports stay out of it. `None`: unknown, the
    /// kernel's default 32768-60999 is assumed.
    pub ephemeral: Option<(u16, u16)>,
}

impl NodeAddrs {
    /// Reads `net.ipv4.ip_local_port_range` as the calling thread's namespace has it.
    pub fn read_ephemeral() -> Option<(u16, u16)> {
        let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
        let mut it = s.split_whitespace().map(|w| w.parse::<u16>().ok());
        Some((it.next()??, it.next()??))
    }
}
