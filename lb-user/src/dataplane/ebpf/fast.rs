//! The fast path's controller side: whether a network may bypass the node's stack, the local
//! endpoints its programs hand packets to (`lb_endpoints`), and the backends' veths whose
//! replies are caught where they enter the node (`lb_tc_reply`).
//!
//! Contracts:
//! - The programs redirect only while `lb_config` says the fast path is on, to an endpoint of
//!   `lb_endpoints` or to a next hop the kernel's FIB resolves. The switch is set after the
//!   endpoints are written and cleared before they are emptied and the reply hooks go.
//!   Each direction falls back to the stack on its own, so any mix of a filled map and
//!   attached hooks during a change delivers every packet.
//! - On with `fast-path on`, or with `auto` while no rule of the namespace's forward hooks
//!   (`node::filter`) can see the network's traffic: redirected packets skip those hooks. The
//!   rules are read again at every apply and whenever the namespace's ruleset changes (the
//!   watcher), and the decision with its reason is kept for `lb status`.
//! - Endpoints come from the kernel's own tables, never guessed: a neighbour with a usable MAC
//!   on one of the network's interfaces; behind a bridge, the port the bridge's FDB names for
//!   that MAC. They follow neighbour and link events (the watcher); a neighbour the kernel has
//!   not resolved is no endpoint, and its packets take the stack, which resolves it.
use std::{collections::BTreeMap, net::IpAddr};

use anyhow::{Context as _, Result};
use lb_common::{ENDPOINT_BRIDGED, ENDPOINT_PEER, Endpoint};

use super::{EbpfNetwork, TcMode, be4, sync::write_exactly};
use crate::{
    core::model::{FastPath, Network},
    node::{FdbEntry, Link, LinkKind, Neighbour, Netlink, filter},
};

/// Which path a network's translated packets take, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathState {
    /// Handed to local endpoints past the stack; replies caught on these ports.
    Fast {
        endpoints: usize,
        ports: Vec<String>,
    },
    /// Through the node's stack, for this reason.
    Stack(String),
}

impl std::fmt::Display for PathState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathState::Fast { endpoints, ports } => write!(
                f,
                "fast: {endpoints} local endpoint(s) reached past the stack, replies caught on {} port(s){}",
                ports.len(),
                if ports.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", ports.join(", "))
                }
            ),
            PathState::Stack(why) => write!(f, "stack: {why}"),
        }
    }
}

/// What the fast path reaches, from one look at the namespace's tables.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Local {
    /// Address (network order) → endpoint.
    pub endpoints: BTreeMap<u32, Endpoint>,
    /// The veths plugged into the network's bridges (local backends), by name.
    pub ports: Vec<String>,
}

/// The endpoints and ports of a network whose interfaces have `interfaces` as indexes.
pub fn local(
    links: &[Link],
    neighbours: &[Neighbour],
    fdb: &[FdbEntry],
    interfaces: &[u32],
) -> Local {
    let by_index: BTreeMap<u32, &Link> = links.iter().map(|l| (l.index, l)).collect();
    let up = |i: u32| by_index.get(&i).copied().filter(|l| l.up);
    let mut out = Local::default();
    for l in links {
        let on_bridge = (l.master)
            .and_then(|m| by_index.get(&m))
            .is_some_and(|m| m.kind == LinkKind::Bridge && interfaces.contains(&m.index));
        if on_bridge && l.kind == LinkKind::Veth && l.up {
            out.ports.push(l.name.clone());
        }
    }
    out.ports.sort();
    for n in neighbours {
        // The fast path hands over IPv4 only (`redirect`).
        let IpAddr::V4(addr) = n.addr else { continue };
        if !interfaces.contains(&n.ifindex) {
            continue;
        }
        let Some(l3) = up(n.ifindex) else { continue };
        let Some(smac) = l3.mac else { continue };
        let (out_link, flags) = match l3.kind {
            LinkKind::Bridge => {
                let Some(port) = (fdb.iter())
                    .find(|e| e.master == l3.index && e.mac == n.mac)
                    .and_then(|e| up(e.port))
                else {
                    // Not learnt yet: the bridge would flood; the stack's path does.
                    continue;
                };
                let peer = if port.kind == LinkKind::Veth {
                    ENDPOINT_PEER
                } else {
                    0
                };
                (port, ENDPOINT_BRIDGED | peer)
            }
            LinkKind::Veth => (l3, ENDPOINT_PEER),
            LinkKind::Other => (l3, 0),
        };
        out.endpoints.insert(
            be4(addr),
            Endpoint {
                ifindex: out_link.index,
                l3_ifindex: l3.index,
                mtu: l3.mtu.min(out_link.mtu),
                dmac: n.mac,
                smac,
                flags,
            },
        );
    }
    out
}

impl EbpfNetwork {
    /// Decides the network's path and makes the maps and reply hooks say so (in the calling
    /// thread's namespace); `check_filters`: read the forward-hook rules again (otherwise the
    /// last reading stands). Returns the ports whose reply hooks the network wants.
    pub(super) fn sync_fast_path(
        &mut self,
        nl: &Netlink,
        network: &Network,
        interfaces: &[u32],
        tc_mode: TcMode,
        check_filters: bool,
    ) -> Result<Vec<String>> {
        if check_filters || self.filters.is_none() {
            // What cannot be read cannot be ruled out: the stack, saying why.
            self.filters = Some(match network.fast_path {
                FastPath::Auto => filter::forward_filters(&network.interfaces)
                    .unwrap_or_else(|e| vec![format!("the ruleset could not be read: {e:#}")]),
                _ => Vec::new(),
            });
        }
        let stack = match (network.fast_path, self.filters.as_deref()) {
            (FastPath::Off, _) => Some("fast-path off".to_owned()),
            (FastPath::Auto, Some(rules)) if !rules.is_empty() => Some(format!(
                "rules in the forward hooks could apply to the network's traffic ({}); fast-path on bypasses them",
                rules.join("; ")
            )),
            _ => None,
        };
        if let Some(why) = stack {
            self.path = Some(PathState::Stack(why));
            self.write_switch()?;
            self.write_endpoints(&BTreeMap::new())?;
            return Ok(Vec::new());
        }
        let local = local(&nl.link_table()?, &nl.neighbours()?, &nl.fdb()?, interfaces);
        for port in &local.ports {
            self.attach_reply(nl, port, tc_mode)
                .with_context(|| format!("attaching the reply hook to {port}"))?;
        }
        self.write_endpoints(&local.endpoints)?;
        self.path = Some(PathState::Fast {
            endpoints: local.endpoints.len(),
            ports: local.ports.clone(),
        });
        self.write_switch()?;
        Ok(local.ports)
    }

    /// Whether the last decision put the network on the fast path (`Config::fast_path`).
    pub(super) fn fast_path_on(&self) -> bool {
        matches!(self.path, Some(PathState::Fast { .. }))
    }

    /// Makes `lb_config` say what the last decision says, where the maps have been synced
    /// once (before that, the apply's sync writes the whole config with it).
    fn write_switch(&mut self) -> Result<()> {
        let on = self.fast_path_on() as u32;
        let Some(m) = self.mirror.as_mut() else {
            return Ok(());
        };
        m.set_fast_path(&mut self.config, on)
    }

    /// Makes `lb_endpoints` hold exactly `want`, writing only the difference with what it
    /// held (read once per loaded object).
    fn write_endpoints(&mut self, want: &BTreeMap<u32, Endpoint>) -> Result<()> {
        write_exactly(
            &mut self.endpoints,
            &mut self.endpoint_mirror,
            want,
            "lb_endpoints",
        )
    }

    /// The network's path as last decided (`None` before its first apply).
    pub fn path(&self) -> Option<&PathState> {
        self.path.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn link(index: u32, name: &str, kind: LinkKind, master: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            kind,
            master,
            mac: Some([2, 0, 0, 0, 0, index as u8]),
            mtu: 1500,
            up: true,
            peer: None,
            peer_netnsid: None,
        }
    }

    /// lbc0 (veth, 2) faces the client; lbbr0 (bridge, 3) has ports lbb0 (veth, 4) and eth9
    /// (a physical port, 5); lbb1 (veth, 6) is a port of a bridge (7) the network lacks.
    fn node() -> Vec<Link> {
        vec![
            link(2, "lbc0", LinkKind::Veth, None),
            link(3, "lbbr0", LinkKind::Bridge, None),
            link(4, "lbb0", LinkKind::Veth, Some(3)),
            link(5, "eth9", LinkKind::Other, Some(3)),
            link(6, "lbb1", LinkKind::Veth, Some(7)),
            link(7, "other", LinkKind::Bridge, None),
        ]
    }

    fn neigh(ifindex: u32, last: u8, mac: u8) -> Neighbour {
        Neighbour {
            ifindex,
            addr: Ipv4Addr::new(10, 0, 0, last).into(),
            mac: [0xaa, 0, 0, 0, 0, mac],
        }
    }

    fn fdb(port: u32, master: u32, mac: u8) -> FdbEntry {
        FdbEntry {
            port,
            master,
            mac: [0xaa, 0, 0, 0, 0, mac],
        }
    }

    #[test]
    fn endpoints_follow_the_neighbour_table_and_the_fdb() {
        let neighbours = [
            neigh(2, 2, 0x02),  // the client, on the client-facing veth
            neigh(3, 10, 0x10), // a backend behind lbb0
            neigh(3, 11, 0x11), // a host behind the physical port
            neigh(3, 12, 0x12), // on the bridge, not learnt by its FDB
            neigh(7, 13, 0x13), // on a bridge the network does not have
        ];
        let table = [fdb(4, 3, 0x10), fdb(5, 3, 0x11), fdb(6, 7, 0x13)];
        let got = local(&node(), &neighbours, &table, &[2, 3]);
        assert_eq!(
            got.ports,
            ["lbb0"],
            "veth ports of the network's bridges only"
        );
        let ep = |last| {
            got.endpoints
                .get(&be4(Ipv4Addr::new(10, 0, 0, last)))
                .copied()
        };
        let client = ep(2).expect("the client");
        assert_eq!(
            (client.ifindex, client.l3_ifindex, client.flags),
            (2, 2, ENDPOINT_PEER)
        );
        assert_eq!(client.smac, [2, 0, 0, 0, 0, 2]);
        assert_eq!(client.dmac, [0xaa, 0, 0, 0, 0, 2]);
        let backend = ep(10).expect("the backend");
        assert_eq!(
            (backend.ifindex, backend.l3_ifindex, backend.flags),
            (4, 3, ENDPOINT_PEER | ENDPOINT_BRIDGED)
        );
        assert_eq!(backend.smac, [2, 0, 0, 0, 0, 3], "the bridge's MAC");
        let host = ep(11).expect("behind the physical port");
        assert_eq!((host.ifindex, host.flags), (5, ENDPOINT_BRIDGED));
        assert_eq!(ep(12), None, "no FDB entry: left to the bridge");
        assert_eq!(ep(13), None, "not the network's interface");
        assert_eq!(got.endpoints.len(), 3);
    }

    #[test]
    fn links_down_give_no_endpoints() {
        let mut links = node();
        links[2].up = false; // lbb0
        let got = local(&links, &[neigh(3, 10, 0x10)], &[fdb(4, 3, 0x10)], &[2, 3]);
        assert!(got.endpoints.is_empty());
        assert!(got.ports.is_empty());
    }

    #[test]
    fn the_smaller_mtu_of_bridge_and_port_bounds_the_endpoint() {
        let mut links = node();
        links[2].mtu = 1400;
        let got = local(&links, &[neigh(3, 10, 0x10)], &[fdb(4, 3, 0x10)], &[3]);
        assert_eq!(got.endpoints.values().next().map(|e| e.mtu), Some(1400));
    }
}
