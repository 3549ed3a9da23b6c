//! The live node, as the daemon sees it: what a change is checked against before it is saved
//! (interfaces, addresses).
use std::{collections::BTreeSet, net::IpAddr};

use anyhow::{Context as _, Result, bail};

use crate::{
    core::model::Network,
    node::{Netlink, in_netns},
};

/// Checks what a change adds to `net` against its namespace before it is saved, so that a
/// state the node cannot carry is refused instead of saved and retried forever:
/// - the first interface exists (and the namespace does): it carries the VIP aliases, and a
///   typo there would leave the network serving nothing. The others may appear later (the
///   bridge a CNI plugin creates with the first pod): the dataplanes skip a missing one, the
///   node's link events pick it up when it appears, and `lb status` says it is missing;
/// - a VIP new to the network (`vips`) is not an address of the node of either family (lb
///   would take over every port of it, SSH's too), nor the network or broadcast address of
///   one of the node's IPv4 subnets;
/// - a `host_ip` new to the network (`host_ips`) is an address of the node, as Docker
///   requires.
///
/// What the network had before is not checked again: an address the node gained later does
/// not block unrelated changes. `lb_vips` (every VIP lb has in the state, so that aliases lb
/// added, even without [`crate::node::ALIAS_PROTO`], do not count as the node's) is asked for
/// only where there is something to check against the node's addresses: no dump otherwise.
pub fn check_added(
    net: &Network,
    vips: &BTreeSet<IpAddr>,
    host_ips: &BTreeSet<IpAddr>,
    lb_vips: impl FnOnce() -> BTreeSet<IpAddr>,
) -> Result<()> {
    let ifaces = net.interfaces.clone();
    let name = net.name.clone();
    let (vips, host_ips) = (vips.clone(), host_ips.clone());
    let lb_vips = if vips.is_empty() && host_ips.is_empty() {
        BTreeSet::new()
    } else {
        lb_vips()
    };
    let where_ = net.netns.as_ref().map_or_else(
        || "the daemon's netns".to_owned(),
        |ns| format!("netns {ns}"),
    );
    in_netns(net.netns.as_deref(), move || {
        let nl = Netlink::new()?;
        nl.present(&ifaces)
            .with_context(|| format!("network {name}"))?;
        if vips.is_empty() && host_ips.is_empty() {
            // Nothing new to check against the node's addresses: no dump (thousands of
            // aliases make one cost more than the rest of a change).
            return Ok(());
        }
        let node: Vec<_> = (nl.addresses()?.into_iter())
            .filter(|a| !a.is_lb_alias(&lb_vips))
            .collect();
        for vip in &vips {
            if let Some(a) = node.iter().find(|a| a.addr == *vip) {
                bail!(
                    "network {name}: VIP {vip} is an address of the node ({vip}/{} on {} in {where_}); lb would take over every port of it: choose an address the node does not have",
                    a.prefix,
                    nl.ifname(a.index)
                );
            }
            for a in &node {
                if let Some((network, broadcast)) = a.network_and_broadcast()
                    && (*vip == IpAddr::V4(network) || *vip == IpAddr::V4(broadcast))
                {
                    let which = if *vip == IpAddr::V4(network) {
                        "network"
                    } else {
                        "broadcast"
                    };
                    bail!(
                        "network {name}: VIP {vip} is the {which} address of the node's subnet {}/{} ({} in {where_})",
                        a.addr,
                        a.prefix,
                        nl.ifname(a.index)
                    );
                }
            }
        }
        for host in &host_ips {
            if !node.iter().any(|a| a.addr == *host) {
                bail!(
                    "network {name}: host_ip {host} is not an address of the node in {where_}; a published port binds to one of the node's addresses (add the address first, or leave host_ip unset)"
                );
            }
        }
        Ok(())
    })
}

/// The interfaces of `net` that do not exist (yet) in its namespace, for `lb status`.
pub fn missing_interfaces(net: &Network) -> Result<Vec<String>> {
    let ifaces = net.interfaces.clone();
    in_netns(net.netns.as_deref(), move || {
        let nl = Netlink::new()?;
        let present: Vec<&str> = (nl.present(&ifaces)?.into_iter()).map(|(i, _)| i).collect();
        Ok((ifaces.iter())
            .filter(|i| !present.contains(&i.as_str()))
            .cloned()
            .collect())
    })
}
