//! A network's VIP aliases around what a dataplane writes, in the one order every dataplane
//! keeps (the seed's): the aliases a network needs are added before its maps or rules point
//! at them, and those only the previously applied network had go after its maps or rules no
//! longer do. So a VIP is never routed to without its address on the node, and an address
//! never outlives the last rule that serves it. Only aliases lb added are ever removed
//! (`Netlink::remove_aliases`): an operator's own /32 or /128 on the interface is not lb's to take.
//!
//! Each dataplane calls these in its network's namespace, with the address dump it reads
//! anyway (with thousands of aliases, a dump costs more than the rest of a one-service
//! change).
use std::{collections::BTreeSet, net::IpAddr};

use anyhow::Result;

use crate::{
    core::model::Network,
    node::{Netlink, NodeAddr},
};

/// The aliases of a network applied before: the interface that carried them (its first)
/// and its VIPs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Previous {
    pub interface: String,
    pub vips: BTreeSet<IpAddr>,
}

impl Previous {
    pub fn of(network: &Network) -> Previous {
        Previous {
            interface: network.interfaces[0].clone(),
            vips: network.vips(),
        }
    }
}

/// Adds `network`'s aliases (on its first interface) that `addrs` shows missing, runs
/// `write`, then removes the aliases `previous` had that `network` has not — all of them from
/// the old interface when the first interface changed. A failed `write` removes nothing:
/// the last good dataplane keeps serving the old VIPs.
pub fn around<T>(
    nl: &Netlink,
    addrs: &[NodeAddr],
    network: &Network,
    previous: Option<&Previous>,
    write: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let interface = &network.interfaces[0];
    let want = network.vips();
    nl.add_aliases(interface, &want, addrs)?;
    let written = write()?;
    if let Some(p) = previous {
        if p.interface != *interface {
            nl.remove_aliases(&p.interface, &p.vips)?;
        } else {
            nl.remove_aliases(interface, &p.vips.difference(&want).copied().collect())?;
        }
    }
    Ok(written)
}

/// Runs `remove` (the network's maps or rules), then removes its aliases.
pub fn after(nl: &Netlink, network: &Network, remove: impl FnOnce() -> Result<()>) -> Result<()> {
    remove()?;
    nl.remove_aliases(&network.interfaces[0], &network.vips())
}
