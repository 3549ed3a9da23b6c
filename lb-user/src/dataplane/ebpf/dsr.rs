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
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{HashMap, MapData};
use lb_common::{
    Addr6, DsrSessionOf, Endpoint, FlowKeyOf, SERVICE_DSR, Service, VipKeyOf, dsr, flow::NS_PER_SEC,
};

use super::{EbpfNetwork, MapAddr, MapIp, Plan, ServiceKey, sync::write_exactly};
use crate::{
    core::model::Proto,
    dataplane::{Flow, FlowState},
    node::{Link, Neighbour, Netlink, NodeAddr},
};

/// How long an apply waits for the kernel to resolve backends it just asked for: on a link
/// an ARP or neighbour discovery answer takes well under a millisecond, and what takes
/// longer is picked up by the neighbour watch.
const RESOLVE_WAIT: Duration = Duration::from_millis(300);

/// How a `dsr` network's backends are reached, as the node is now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// IPv4 backend (network order) → the device its frames leave by, its MAC and the
    /// device's (`lb_dsr_backends`).
    pub endpoints: BTreeMap<u32, Endpoint>,
    /// The same of IPv6 backends (`lb_dsr_backends6`).
    pub endpoints6: BTreeMap<Addr6, Endpoint>,
    /// Backends that get no new session, with why.
    pub unresolved: BTreeMap<IpAddr, String>,
    /// (ifindex, backend): what the kernel is asked to keep resolved.
    pub managed: BTreeSet<(u32, IpAddr)>,
}

impl Resolution {
    /// Whether `addr` (as a map holds it) has a MAC.
    fn resolved(&self, addr: &MapAddr) -> bool {
        match addr {
            MapAddr::V4(a) => self.endpoints.contains_key(a),
            MapAddr::V6(a) => self.endpoints6.contains_key(a),
        }
    }
}

/// Where each of `backends` is reached from the network's interfaces `ifindexes` (in the
/// network's order: the first with a subnet of the backend's family that holds it carries
/// it), by `links`, `addrs` and `neighbours` of the namespace: the same rules for both
/// families, ARP's neighbours for IPv4 and neighbour discovery's for IPv6. Pure, so the rules
/// are tested without a kernel.
pub fn resolve(
    backends: &BTreeSet<IpAddr>,
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
                .any(|a| a.index == i && a.prefix > 0 && same_subnet(a.addr, b, a.prefix))
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
            (neighbours.iter()).find(|n| n.ifindex == link.index && n.addr == b),
        ) else {
            let asked = if b.is_ipv4() {
                "ARP"
            } else {
                "neighbour solicitation"
            };
            out.unresolved.insert(
                b,
                format!(
                    "its MAC on {} is not known yet ({asked} unanswered)",
                    link.name
                ),
            );
            continue;
        };
        let ep = Endpoint {
            ifindex: link.index,
            l3_ifindex: link.index,
            mtu: link.mtu,
            dmac: n.mac,
            smac,
            flags: 0,
        };
        match MapAddr::of(b) {
            MapAddr::V4(a) => out.endpoints.insert(a, ep),
            MapAddr::V6(a) => out.endpoints6.insert(a, ep),
        };
    }
    out
}

/// Whether `a` and `b` are of one family and share their first `prefix` bits.
fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    let bits = |ip: IpAddr| -> (u128, u32) {
        match ip {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32),
            IpAddr::V6(v6) => (u128::from(v6), 128),
        }
    };
    let ((a, width), (b, width_b)) = (bits(a), bits(b));
    if width != width_b {
        return false;
    }
    let mask = u128::MAX
        .checked_shl(128 - u32::from(prefix).min(width))
        .unwrap_or(0);
    a & mask == b & mask
}

/// The backends of a plan's DSR VIPs of both families (enabled ones: what new sessions may
/// pick).
fn vip_backends(plan: &Plan) -> BTreeSet<IpAddr> {
    (plan.services.iter())
        .filter(|(k, _)| matches!(k, ServiceKey::Vip(_)))
        .flat_map(|(_, set)| set.iter())
        .map(|(addr, _)| addr.ip())
        .collect()
}

impl EbpfNetwork {
    /// Resolves the DSR backends of `plan` on the network's interfaces `ifindexes`, writes
    /// `lb_dsr_backends` and `lb_dsr_backends6`, and takes the unresolved ones out of `plan`'s
    /// VIP sets (see the module's contracts). For a `nat` network it empties both maps and
    /// lets lb's managed neighbour entries go. Runs in the network's namespace.
    pub fn sync_dsr(
        &mut self,
        nl: &Netlink,
        ifindexes: &[u32],
        addrs: &[NodeAddr],
        plan: &mut Plan,
    ) -> Result<()> {
        let ours: BTreeSet<(u32, IpAddr)> = (nl.managed_neighbours()?.into_iter())
            .filter(|(i, _)| ifindexes.contains(i))
            .collect();
        let res = if plan.dsr_timeout.is_none() {
            for (i, a) in &ours {
                nl.forget_neighbour(*i, *a)?;
            }
            Resolution::default()
        } else {
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
            res
        };
        write_exactly(
            &mut self.dsr_backends,
            &mut self.dsr_mirror,
            &res.endpoints,
            "lb_dsr_backends",
        )?;
        write_exactly(
            &mut self.dsr_backends6,
            &mut self.dsr_mirror6,
            &res.endpoints6,
            "lb_dsr_backends6",
        )?;
        if plan.dsr_timeout.is_some() {
            for (key, set) in plan.services.iter_mut() {
                if matches!(key, ServiceKey::Vip(_)) {
                    set.retain(|(addr, _)| res.resolved(addr));
                }
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
    pub fn dsr_unresolved(&self) -> &BTreeMap<IpAddr, String> {
        &self.dsr_unresolved
    }

    /// The live DSR sessions of both families as `lb conntrack` lists them, `timeout` seconds
    /// after their last packet counting as gone.
    pub fn dsr_flows(&self, timeout: u32, now: u64) -> Vec<Flow> {
        let mut out: Vec<Flow> = (self.dsr_sessions().iter())
            .filter_map(|(k, s)| session_row(k, s, timeout, now))
            .collect();
        out.extend(
            (self.dsr_sessions6().iter()).filter_map(|(k, s)| session_row(k, s, timeout, now)),
        );
        out.sort_by(|a, b| (&a.frontend, &a.client).cmp(&(&b.frontend, &b.client)));
        out
    }
}

/// Whether a session whose VIP entry is `svc` (`None`: the VIP is gone) counts as ended at
/// `now`: idle past its VIP's timeout, or its VIP no longer a DSR VIP.
pub fn session_ended<A: MapIp>(s: &DsrSessionOf<A>, svc: Option<&Service>, now: u64) -> bool {
    match svc {
        Some(svc) if svc.flags & SERVICE_DSR != 0 => !dsr::live(s, svc.session_timeout, now),
        _ => true,
    }
}

/// Deletes the ended sessions of one family of one network (the collector's pass, off the
/// writer's path; the programs already treat them as absent). Read first, deleted after, each
/// re-read before its delete so that a session a packet just refreshed stays. Returns how
/// many are live and how many went; the counter ids the sessions read name go to `ids`.
pub fn collect<A: MapIp>(
    sessions: &mut HashMap<MapData, FlowKeyOf<A>, DsrSessionOf<A>>,
    vips: &HashMap<MapData, VipKeyOf<A>, Service>,
    now: u64,
    ids: &mut std::collections::BTreeSet<u32>,
) -> (u64, u64)
where
    FlowKeyOf<A>: aya::Pod,
    DsrSessionOf<A>: aya::Pod,
    VipKeyOf<A>: aya::Pod,
{
    let all: Vec<(FlowKeyOf<A>, DsrSessionOf<A>)> =
        sessions.iter().filter_map(|e| e.ok()).collect();
    ids.extend(all.iter().map(|(_, s)| s.counter));
    let (mut live, mut deleted) = (0, 0);
    for (k, s) in &all {
        let svc = vips.get(&VipKeyOf { addr: k.daddr }, 0).ok();
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
/// packet by up to `lb_common::dsr::refresh_ns`, as the programs write it. An IPv6 session's
/// addresses show as `[addr]:port`, as every IPv6 socket address lb prints.
pub fn session_row<A: MapIp>(
    k: &FlowKeyOf<A>,
    s: &DsrSessionOf<A>,
    timeout: u32,
    now: u64,
) -> Option<Flow> {
    if !dsr::live(s, timeout, now) {
        return None;
    }
    let idle = now.saturating_sub(s.seen_ns);
    let limit = u64::from(timeout) * NS_PER_SEC;
    Some(Flow {
        // Sessions are opened for the protocols ports are published for, and no other.
        proto: Proto::from_number(k.proto)?,
        client: SocketAddr::new(k.saddr.ip(), u16::from_be(k.sport)),
        frontend: SocketAddr::new(k.daddr.ip(), u16::from_be(k.dport)),
        service: None,
        // Backend and port as NAT rows show them: DSR keeps the VIP's port.
        backend: SocketAddr::new(s.backend.ip(), u16::from_be(k.dport)),
        state: FlowState::Dsr,
        expires_secs: Some((limit - idle).div_ceil(NS_PER_SEC)),
        idle_secs: Some(idle / NS_PER_SEC),
    })
}

#[cfg(test)]
mod tests;
