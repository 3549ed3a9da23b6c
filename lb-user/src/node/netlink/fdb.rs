//! The bridges' forwarding database: which port of a bridge a MAC is behind.
use anyhow::Result;
use netlink_packet_route::{AddressFamily, neighbour::NeighbourAttribute};

use super::{Netlink, mac};

/// A bridge forwarding entry: frames to `mac` on bridge `master` leave by port `port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdbEntry {
    pub port: u32,
    pub master: u32,
    pub mac: [u8; 6],
}

impl Netlink {
    /// The forwarding entries of every bridge (one dump), the bridges' own addresses left out.
    pub fn fdb(&self) -> Result<Vec<FdbEntry>> {
        Ok(self
            .neighbour_dump(AddressFamily::Bridge, "listing bridge forwarding entries")?
            .iter()
            .filter_map(|m| {
                let mut master = None;
                let mut lladdr = None;
                for a in &m.attributes {
                    match a {
                        NeighbourAttribute::Controller(c) => master = Some(*c),
                        NeighbourAttribute::LinkLayerAddress(l) => lladdr = mac(l),
                        _ => {}
                    }
                }
                let master = master?;
                // An entry of the bridge device itself ("self") is not a port's.
                (master != m.header.ifindex).then_some(FdbEntry {
                    port: m.header.ifindex,
                    master,
                    mac: lladdr?,
                })
            })
            .collect())
    }
}
