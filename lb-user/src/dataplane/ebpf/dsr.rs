//! DSR on the eBPF dataplane, the controller's side: how each backend of a `dsr` network's
//! VIPs is reached by MAC (`lb_dsr_backends`), and which backends may take new sessions.
//!
//! Contracts:
//! - A backend is reached on the network interface whose subnet holds it (DSR rewrites only
//!   the Ethernet header, so the backend must share the link); its MAC comes from the
//!   namespace's neighbour table. lb asks the kernel to resolve every such backend and keep it
//!   resolved (a managed neighbour entry, `Netlink::manage_neighbour`): DSR frames bypass the
//!   stack, so nothing else would ever refresh the entry, and a backend whose MAC changed would
//!   keep receiving nothing.
//! - A backend without a usable MAC (not on any interface's subnet, or ARP unanswered so far)
//!   is left out of its VIPs' sets as written to the maps: it gets no new session, the others
//!   share the buckets, and `lb status` says why. The elements `lb elements` prints are the
//!   composed ones; the neighbour watch re-applies the network as MACs come and go.
//! - Sessions keep the MAC they were opened with (moby's `ether daddr` in its session map):
//!   a backend disabled or left out keeps its live sessions until they end or idle out.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{HashMap, MapData};
use lb_common::{
    DsrSession, Endpoint, FlowKey, SERVICE_DSR, Service, VipKey, dsr, flow::NS_PER_SEC,
};

use super::{EbpfNetwork, MapAddr, Plan, ServiceKey, be4, ip, ip4, sync::write_exactly};
use crate::{
    core::model::Proto,
    dataplane::{Flow, FlowState},
    node::{Link, Neighbour, Netlink, NodeAddr},
};

/// How long an apply waits for the kernel to resolve backends it just asked for: on a link
/// an ARP answer takes well under a millisecond, and what takes longer is picked up by the
/// neighbour watch.
const RESOLVE_WAIT: Duration = Duration::from_millis(300);

/// How a `dsr` network's backends are reached, as the node is now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Backend (network order) → the device its frames leave by, its MAC and the device's.
    pub endpoints: BTreeMap<u32, Endpoint>,
    /// Backends that get no new session, with why.
    pub unresolved: BTreeMap<Ipv4Addr, String>,
    /// (ifindex, backend): what the kernel is asked to keep resolved.
    pub managed: BTreeSet<(u32, Ipv4Addr)>,
}

/// Where each of `backends` is reached from the network's interfaces `ifindexes` (in the
/// network's order: the first whose subnet holds a backend carries it), by `links`, `addrs`
/// and `neighbours` of the namespace. Pure, so the rules are tested without a kernel.
pub fn resolve(
    backends: &BTreeSet<Ipv4Addr>,
    ifindexes: &[u32],
    links: &[Link],
    addrs: &[NodeAddr],
    neighbours: &[Neighbour],
) -> Resolution {
    let mut out = Resolution::default();
    for &b in backends {
        let on_link = ifindexes.iter().find_map(|&i| {
            let link = links.iter().find(|l| l.index == i)?;
            (addrs.iter())
                .any(|a| {
                    a.index == i
                        && a.prefix > 0
                        && matches!(a.addr, IpAddr::V4(a4) if same_subnet(a4, b, a.prefix))
                })
                .then_some(link)
        });
        let Some(link) = on_link else {
            out.unresolved.insert(
                b,
                "not on the subnet of any of the network's interfaces (DSR reaches a backend by its MAC, on a shared link)".to_owned(),
            );
            continue;
        };
        out.managed.insert((link.index, b));
        let (Some(smac), Some(n)) = (
            link.mac,
            (neighbours.iter()).find(|n| n.ifindex == link.index && n.addr == IpAddr::V4(b)),
        ) else {
            out.unresolved.insert(
                b,
                format!("its MAC on {} is not known yet (ARP unanswered)", link.name),
            );
            continue;
        };
        out.endpoints.insert(
            be4(b),
            Endpoint {
                ifindex: link.index,
                l3_ifindex: link.index,
                mtu: link.mtu,
                dmac: n.mac,
                smac,
                flags: 0,
            },
        );
    }
    out
}

fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0);
    u32::from(a) & mask == u32::from(b) & mask
}

/// The backends of a plan's DSR VIPs (enabled ones: what new sessions may pick). DSR is
/// IPv4's (`supports` refuses an IPv6 VIP in a `dsr` network).
fn vip_backends(plan: &Plan) -> BTreeSet<Ipv4Addr> {
    (plan.services.iter())
        .filter(|(k, _)| matches!(k, ServiceKey::Vip(MapAddr::V4(_))))
        .flat_map(|(_, set)| set.iter())
        .filter_map(|(addr, _)| match addr {
            MapAddr::V4(a) => Some(ip4(*a)),
            MapAddr::V6(_) => None,
        })
        .collect()
}

impl EbpfNetwork {
    /// Resolves the DSR backends of `plan` on the network's interfaces `ifindexes`, writes
    /// `lb_dsr_backends`, and takes the unresolved ones out of `plan`'s VIP sets (see the
    /// module's contracts). For a `nat` network it empties the map and lets lb's managed
    /// neighbour entries go. Runs in the network's namespace.
    pub fn sync_dsr(
        &mut self,
        nl: &Netlink,
        ifindexes: &[u32],
        addrs: &[NodeAddr],
        plan: &mut Plan,
    ) -> Result<()> {
        let ours: BTreeSet<(u32, Ipv4Addr)> = (nl.managed_neighbours()?.into_iter())
            .filter(|(i, _)| ifindexes.contains(i))
            .collect();
        if plan.dsr_timeout.is_none() {
            for (i, a) in &ours {
                nl.forget_neighbour(*i, *a)?;
            }
            self.dsr_unresolved.clear();
            return write_exactly(
                &mut self.dsr_backends,
                &mut self.dsr_mirror,
                &BTreeMap::new(),
                "lb_dsr_backends",
            );
        }
        let backends = vip_backends(plan);
        let links = nl.link_table()?;
        let mut res = resolve(&backends, ifindexes, &links, addrs, &nl.neighbours()?);
        let asked: Vec<_> = res.managed.difference(&ours).copied().collect();
        for (i, a) in &asked {
            nl.manage_neighbour(*i, *a)?;
        }
        for (i, a) in ours.difference(&res.managed) {
            nl.forget_neighbour(*i, *a)?;
        }
        // Backends just asked for are usually answered at once: wait briefly rather than
        // open the VIP without them.
        let started = Instant::now();
        while !asked.is_empty()
            && asked.iter().any(|(_, a)| res.unresolved.contains_key(a))
            && started.elapsed() < RESOLVE_WAIT
        {
            std::thread::sleep(Duration::from_millis(10));
            res = resolve(&backends, ifindexes, &links, addrs, &nl.neighbours()?);
        }
        write_exactly(
            &mut self.dsr_backends,
            &mut self.dsr_mirror,
            &res.endpoints,
            "lb_dsr_backends",
        )?;
        for (key, set) in plan.services.iter_mut() {
            if matches!(key, ServiceKey::Vip(MapAddr::V4(_))) {
                set.retain(|(addr, _)| match addr {
                    MapAddr::V4(a) => res.endpoints.contains_key(a),
                    MapAddr::V6(_) => false,
                });
            }
        }
        if res.unresolved != self.dsr_unresolved {
            tracing::info!(unresolved = ?res.unresolved, "dsr backends without a MAC (these get no new sessions) changed");
        }
        self.dsr_unresolved = res.unresolved;
        Ok(())
    }

    /// Backends of the network's DSR VIPs that get no new session, with why (as the last
    /// apply found them).
    pub fn dsr_unresolved(&self) -> &BTreeMap<Ipv4Addr, String> {
        &self.dsr_unresolved
    }

    /// The live DSR sessions as `lb conntrack` lists them, `timeout` seconds after their last
    /// packet counting as gone.
    pub fn dsr_flows(&self, timeout: u32, now: u64) -> Vec<Flow> {
        let mut out: Vec<Flow> = (self.dsr_sessions().iter())
            .filter_map(|(k, s)| session_row(k, s, timeout, now))
            .collect();
        out.sort_by(|a, b| (&a.frontend, &a.client).cmp(&(&b.frontend, &b.client)));
        out
    }
}

/// Whether a session whose VIP entry is `svc` (`None`: the VIP is gone) counts as ended at
/// `now`: idle past its VIP's timeout, or its VIP no longer a DSR VIP.
pub fn session_ended(s: &DsrSession, svc: Option<&Service>, now: u64) -> bool {
    match svc {
        Some(svc) if svc.flags & SERVICE_DSR != 0 => !dsr::live(s, svc.session_timeout, now),
        _ => true,
    }
}

/// Deletes the ended sessions of one network (the collector's pass, off the writer's path;
/// the programs already treat them as absent). Read first, deleted after, each re-read
/// before its delete so that a session a packet just refreshed stays. Returns how many are
/// live and how many went.
pub fn collect(
    sessions: &mut HashMap<MapData, FlowKey, DsrSession>,
    vips: &HashMap<MapData, VipKey, Service>,
    now: u64,
) -> (u64, u64) {
    let all: Vec<(FlowKey, DsrSession)> = sessions.iter().filter_map(|e| e.ok()).collect();
    let (mut live, mut deleted) = (0, 0);
    for (k, s) in &all {
        let svc = vips.get(&VipKey { addr: k.daddr }, 0).ok();
        if !session_ended(s, svc.as_ref(), now) {
            live += 1;
            continue;
        }
        if (sessions.get(k, 0)).is_ok_and(|again| session_ended(&again, svc.as_ref(), now))
            && sessions.remove(k).is_ok()
        {
            deleted += 1;
        }
    }
    (live, deleted)
}

/// One session's row, `None` once it is idle past `timeout`. Its idle time may lag its last
/// packet by up to `lb_common::dsr::refresh_ns`, as the programs write it.
pub fn session_row(k: &FlowKey, s: &DsrSession, timeout: u32, now: u64) -> Option<Flow> {
    if !dsr::live(s, timeout, now) {
        return None;
    }
    let idle = now.saturating_sub(s.seen_ns);
    let limit = u64::from(timeout) * NS_PER_SEC;
    Some(Flow {
        // Sessions are opened for the protocols ports are published for, and no other.
        proto: Proto::from_number(k.proto)?,
        client: SocketAddr::new(ip(k.saddr), u16::from_be(k.sport)),
        frontend: SocketAddr::new(ip(k.daddr), u16::from_be(k.dport)),
        service: None,
        // Backend and port as NAT rows show them: DSR keeps the VIP's port.
        backend: SocketAddr::new(ip(s.backend), u16::from_be(k.dport)),
        state: FlowState::Dsr,
        expires_secs: Some((limit - idle).div_ceil(NS_PER_SEC)),
        idle_secs: Some(idle / NS_PER_SEC),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::LinkKind;

    fn link(index: u32, mac: u8) -> Link {
        Link {
            index,
            name: format!("eth{index}"),
            kind: LinkKind::Veth,
            master: None,
            mac: Some([2, 0, 0, 0, 0, mac]),
            mtu: 1500,
            up: true,
            peer: None,
            peer_netnsid: None,
        }
    }

    fn addr(a: &str, prefix: u8, index: u32) -> NodeAddr {
        NodeAddr {
            addr: a.parse().unwrap(),
            prefix,
            index,
            proto: None,
        }
    }

    fn neigh(ifindex: u32, a: &str, mac: u8) -> Neighbour {
        Neighbour {
            ifindex,
            addr: a.parse().unwrap(),
            mac: [4, 0, 0, 0, 0, mac],
        }
    }

    #[test]
    fn backends_are_reached_on_the_interface_whose_subnet_holds_them() {
        let backends: BTreeSet<Ipv4Addr> = ["10.1.0.5", "10.2.0.7", "10.2.0.8", "192.0.2.1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let links = [link(3, 3), link(4, 4)];
        let addrs = [addr("10.1.0.1", 24, 3), addr("10.2.0.1", 16, 4)];
        let neighbours = [
            neigh(3, "10.1.0.5", 5),
            neigh(4, "10.2.0.7", 7),
            // Known, but on an interface that is not where its subnet is.
            neigh(3, "10.2.0.8", 8),
        ];
        let r = resolve(&backends, &[3, 4], &links, &addrs, &neighbours);
        let ep = r.endpoints[&be4("10.1.0.5".parse().unwrap())];
        assert_eq!(
            (ep.ifindex, ep.dmac, ep.smac),
            (3, [4, 0, 0, 0, 0, 5], [2, 0, 0, 0, 0, 3])
        );
        assert_eq!(r.endpoints[&be4("10.2.0.7".parse().unwrap())].ifindex, 4);
        assert_eq!(r.endpoints.len(), 2);
        let why = |a: &str| r.unresolved[&a.parse::<Ipv4Addr>().unwrap()].clone();
        assert!(
            why("10.2.0.8").contains("not known yet"),
            "{}",
            why("10.2.0.8")
        );
        assert!(
            why("192.0.2.1").contains("not on the subnet"),
            "{}",
            why("192.0.2.1")
        );
        // Every backend on a link is kept resolved, known or not; one off-link is not.
        let managed: Vec<(u32, String)> = (r.managed.iter())
            .map(|(i, a)| (*i, a.to_string()))
            .collect();
        assert_eq!(
            managed,
            [
                (3, "10.1.0.5".to_owned()),
                (4, "10.2.0.7".to_owned()),
                (4, "10.2.0.8".to_owned())
            ]
        );
    }

    #[test]
    fn a_session_row_says_idle_and_left_and_disappears_after_its_timeout() {
        let k = FlowKey {
            saddr: be4("10.0.0.2".parse().unwrap()),
            daddr: be4("10.0.0.100".parse().unwrap()),
            sport: 40000u16.to_be(),
            dport: 80u16.to_be(),
            proto: lb_common::IPPROTO_TCP,
            _pad: [0; 3],
        };
        let s = DsrSession {
            backend: be4("10.0.0.5".parse().unwrap()),
            seen_ns: 100 * NS_PER_SEC,
            ..Default::default()
        };
        let row = session_row(&k, &s, 60, 110 * NS_PER_SEC).unwrap();
        assert_eq!(
            (
                row.client.to_string().as_str(),
                row.frontend.to_string().as_str(),
                row.backend.to_string().as_str(),
                row.state.as_str()
            ),
            ("10.0.0.2:40000", "10.0.0.100:80", "10.0.0.5:80", "dsr")
        );
        assert_eq!((row.idle_secs, row.expires_secs), (Some(10), Some(50)));
        assert!(session_row(&k, &s, 60, 161 * NS_PER_SEC).is_none());
    }
}
