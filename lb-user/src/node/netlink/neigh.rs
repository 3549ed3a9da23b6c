//! The neighbour table (ARP's and neighbour discovery's): the usable entries of both
//! families, and the managed entries lb keeps resolved for DSR backends.
use std::{collections::BTreeSet, net::IpAddr};

use anyhow::{Context as _, Result};
use futures_util::TryStreamExt as _;
use netlink_packet_route::{
    AddressFamily,
    neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourExtFlags, NeighbourFlags, NeighbourState,
    },
};

use super::{Netlink, mac};

/// A neighbour entry: an address on a link with a MAC the kernel holds as good (reachable,
/// stale, being re-checked, or set by hand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    /// ARP's (IPv4) or neighbour discovery's (IPv6).
    pub addr: IpAddr,
    pub mac: [u8; 6],
}

impl Netlink {
    /// One dump of the neighbour table of `family` (AF_BRIDGE: the bridges' FDB).
    pub(super) fn neighbour_dump(
        &self,
        family: AddressFamily,
        what: &'static str,
    ) -> Result<Vec<netlink_packet_route::neighbour::NeighbourMessage>> {
        self.rt.block_on(async {
            (self.handle.neighbours().get())
                .set_address_family(family)
                .execute()
                .try_collect()
                .await
                .context(what)
        })
    }

    /// The neighbour entries of IPv4 (ARP) and IPv6 (neighbour discovery).
    fn neighbour_dumps(&self) -> Result<Vec<netlink_packet_route::neighbour::NeighbourMessage>> {
        let mut all = self.neighbour_dump(AddressFamily::Inet, "listing IPv4 neighbours")?;
        all.extend(self.neighbour_dump(AddressFamily::Inet6, "listing IPv6 neighbours")?);
        Ok(all)
    }

    /// The neighbours of both families whose MAC is usable (a dump per family).
    pub fn neighbours(&self) -> Result<Vec<Neighbour>> {
        Ok(self
            .neighbour_dumps()?
            .iter()
            .filter(|m| {
                matches!(
                    m.header.state,
                    NeighbourState::Reachable
                        | NeighbourState::Stale
                        | NeighbourState::Delay
                        | NeighbourState::Probe
                        | NeighbourState::Permanent
                )
            })
            .filter_map(|m| {
                let mut addr = None;
                let mut lladdr = None;
                for a in &m.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                            addr = Some(IpAddr::V4(*ip))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => {
                            addr = Some(IpAddr::V6(*ip))
                        }
                        NeighbourAttribute::LinkLayerAddress(l) => lladdr = mac(l),
                        _ => {}
                    }
                }
                Some(Neighbour {
                    ifindex: m.header.ifindex,
                    addr: addr?,
                    mac: lladdr?,
                })
            })
            .collect())
    }

    /// The neighbour entries lb keeps resolved ([`Netlink::manage_neighbour`]), as
    /// (ifindex, address): managed and externally learned, which nothing else of a node makes
    /// together by accident.
    pub fn managed_neighbours(&self) -> Result<BTreeSet<(u32, IpAddr)>> {
        Ok(self
            .neighbour_dumps()?
            .iter()
            .filter(|m| m.header.flags.contains(NeighbourFlags::ExtLearned))
            .filter(|m| {
                (m.attributes.iter()).any(|a| {
                    matches!(a, NeighbourAttribute::ExtFlags(f) if f.contains(NeighbourExtFlags::Managed))
                })
            })
            .filter_map(|m| {
                m.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                        Some((m.header.ifindex, IpAddr::V4(*ip)))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => {
                        Some((m.header.ifindex, IpAddr::V6(*ip)))
                    }
                    _ => None,
                })
            })
            .collect())
    }

    /// Asks the kernel to resolve `addr` on `ifindex` and keep it resolved: a managed
    /// neighbour entry (Linux 5.16), which the kernel re-probes on its own so that the MAC
    /// stays current without traffic through the stack (DSR frames never use it). Marked
    /// externally learned, which tells lb's entries from the node's ([`managed_neighbours`]).
    /// A replace that keeps a MAC already known.
    ///
    /// [`managed_neighbours`]: Netlink::managed_neighbours
    pub fn manage_neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<()> {
        self.rt
            .block_on(async {
                let mut req = (self.handle.neighbours().add(ifindex, addr))
                    .state(NeighbourState::None)
                    .flags(NeighbourFlags::ExtLearned)
                    .replace();
                (req.message_mut().attributes)
                    .push(NeighbourAttribute::ExtFlags(NeighbourExtFlags::Managed));
                req.execute().await
            })
            .with_context(|| {
                format!(
                    "asking the kernel to resolve {addr} on if{ifindex} (a managed neighbour entry)"
                )
            })
    }

    /// Deletes lb's managed entry of `addr` on `ifindex` (gone already is fine).
    pub fn forget_neighbour(&self, ifindex: u32, addr: IpAddr) -> Result<()> {
        let mut msg = netlink_packet_route::neighbour::NeighbourMessage::default();
        msg.header.ifindex = ifindex;
        let (family, dest) = match addr {
            IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
        };
        msg.header.family = family;
        (msg.attributes).push(NeighbourAttribute::Destination(dest));
        let r = self
            .rt
            .block_on(async { self.handle.neighbours().del(msg).execute().await });
        match r {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => Ok(()),
            Err(e) => Err(e)
                .with_context(|| format!("deleting the neighbour entry of {addr} on if{ifindex}")),
        }
    }
}
