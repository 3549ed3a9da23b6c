//! Hairpin mode of a bridge's ports: a packet a port sends back out of that same port (a
//! pod reaching a service whose backend is itself) needs it on.
use anyhow::Result;
use netlink_packet_route::link::{InfoBridgePort, InfoKind, InfoPortData, LinkAttribute, LinkInfo};

use super::{Netlink, link::link_infos};

impl Netlink {
    /// The ports of bridge `ifname` whose hairpin mode is off (sorted), or `None` when
    /// `ifname` is not a bridge. One link dump.
    pub fn ports_without_hairpin(&self, ifname: &str) -> Result<Option<Vec<String>>> {
        let index = self.ifindex(ifname)?;
        let links = self.links()?;
        let is_bridge = (links.iter())
            .find(|m| m.header.index == index)
            .is_some_and(|m| link_infos(m).contains(&LinkInfo::Kind(InfoKind::Bridge)));
        if !is_bridge {
            return Ok(None);
        }
        let mut off = Vec::new();
        for m in &links {
            if !m.attributes.contains(&LinkAttribute::Controller(index)) {
                continue;
            }
            let hairpin = link_infos(m).iter().any(|i| {
                matches!(i, LinkInfo::PortData(InfoPortData::BridgePort(p))
                    if p.contains(&InfoBridgePort::HairpinMode(true)))
            });
            if !hairpin {
                let name = m.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                });
                off.push(name.unwrap_or_else(|| format!("if{}", m.header.index)));
            }
        }
        off.sort();
        Ok(Some(off))
    }
}
