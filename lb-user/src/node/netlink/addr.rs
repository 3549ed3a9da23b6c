//! The namespace's addresses and lb's VIP aliases among them: one dump of every address
//! ([`Netlink::addresses`], counted: [`address_dumps`]), and adding and removing the aliases
//! (told from the node's own addresses by [`ALIAS_PROTO`]).
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::{Context as _, Result};
use futures_util::TryStreamExt as _;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol, CacheInfo,
};

use super::{Netlink, errno};

/// The IFA_PROTO every VIP alias of lb carries ('l'): how an alias lb added is told from an
/// address of the node, also after a restart, without trusting a record on disk. `ip addr`
/// shows it as `proto 0x6c`. Kernels before 5.18 ignore it; there the applied VIPs are the
/// record (see [`NodeAddr::is_lb_alias`]).
pub const ALIAS_PROTO: u8 = 0x6c;

/// One address of the namespace, of either family, as a dump gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddr {
    pub addr: IpAddr,
    pub prefix: u8,
    pub index: u32,
    /// The address's IFA_PROTO, when it has one.
    pub proto: Option<u8>,
    /// IPv6: its preferred lifetime is over (IFA_F_DEPRECATED): never chosen as a source
    /// while another address is there.
    pub deprecated: bool,
}

impl NodeAddr {
    /// Whether lb added this address as a VIP alias: it carries [`ALIAS_PROTO`], or it is a
    /// host address (/32, /128) without any protocol that is one of `vips` (an alias of a
    /// kernel or an lb without IFA_PROTO). Everything else is the node's own, which lb never
    /// removes or claims.
    pub fn is_lb_alias(&self, vips: &BTreeSet<IpAddr>) -> bool {
        self.proto == Some(ALIAS_PROTO)
            || (self.proto.is_none() && self.is_host() && vips.contains(&self.addr))
    }

    /// Whether the address is a host address (/32 or /128), as VIP aliases are.
    pub fn is_host(&self) -> bool {
        self.prefix == host_prefix(self.addr)
    }

    /// An IPv4 subnet's network and broadcast addresses (none for /31 and /32, which have
    /// neither, and for IPv6, which has no broadcast).
    pub fn network_and_broadcast(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        let IpAddr::V4(addr) = self.addr else {
            return None;
        };
        if self.prefix >= 31 {
            return None;
        }
        let IpAddr::V4(net) = network_of(addr.into(), self.prefix) else {
            unreachable!("an IPv4 address's network is IPv4");
        };
        let broadcast = u32::from(net) | (u32::MAX >> self.prefix);
        Some((net, Ipv4Addr::from(broadcast)))
    }
}

/// The network address of `addr`'s subnet of length `prefix` (of either family).
pub fn network_of(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a) & mask))
        }
    }
}

/// The prefix length of a host address of `ip`'s family: 32 or 128.
pub fn host_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// The addresses of interface `index` in a dump, in the kernel's order (the primary one
/// first).
pub fn on_interface(addrs: &[NodeAddr], index: u32) -> impl Iterator<Item = &NodeAddr> {
    addrs.iter().filter(move |a| a.index == index)
}

/// The node's own addresses in a dump, sorted (IPv4 first), without lb's aliases (see
/// [`NodeAddr::is_lb_alias`]; `vips` are the VIPs lb has or had here): the addresses
/// published ports answer on.
pub fn node_addrs(addrs: &[NodeAddr], vips: &BTreeSet<IpAddr>) -> Vec<IpAddr> {
    let mut all: Vec<IpAddr> = (addrs.iter())
        .filter(|a| !a.is_lb_alias(vips))
        .map(|a| a.addr)
        .collect();
    all.sort();
    all.dedup();
    all
}

impl Netlink {
    fn addr_messages(&self, index: Option<u32>) -> Result<Vec<AddressMessage>> {
        self.rt.block_on(async {
            let mut req = self.handle.address().get();
            if let Some(index) = index {
                req = req.set_link_index_filter(index);
            }
            req.execute()
                .try_collect::<Vec<_>>()
                .await
                .context("listing addresses")
        })
    }

    fn addr(msg: &AddressMessage) -> Option<(IpAddr, u8)> {
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's on
        // point-to-point links, so prefer the former (IPv6 sends IFA_ADDRESS alone).
        let mut found = None;
        for attr in &msg.attributes {
            match attr {
                AddressAttribute::Local(a) => return Some((*a, msg.header.prefix_len)),
                AddressAttribute::Address(a) => found = Some((*a, msg.header.prefix_len)),
                _ => {}
            }
        }
        found
    }

    /// The address's IFA_PROTO, if it has one.
    fn proto(msg: &AddressMessage) -> Option<u8> {
        msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Protocol(p) => Some(u8::from(*p)),
            _ => None,
        })
    }

    /// Whether the kernel holds `msg`'s address deprecated (in IFA_FLAGS, or the header's
    /// 8 bits of them where the attribute is absent).
    fn deprecated(msg: &AddressMessage) -> bool {
        (msg.attributes.iter())
            .find_map(|a| match a {
                AddressAttribute::Flags(f) => Some(f.contains(AddressFlags::Deprecated)),
                _ => None,
            })
            .unwrap_or_else(|| msg.header.flags.contains(AddressHeaderFlags::Deprecated))
    }

    /// Every address of every interface of the namespace, of both families, lb's aliases
    /// included.
    pub fn addresses(&self) -> Result<Vec<NodeAddr>> {
        DUMPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((self.addr_messages(None)?.iter())
            .filter_map(|m| {
                let (addr, prefix) = Self::addr(m)?;
                Some(NodeAddr {
                    addr,
                    prefix,
                    index: m.header.index,
                    proto: Self::proto(m),
                    deprecated: Self::deprecated(m),
                })
            })
            .collect())
    }

    /// Adds `vip/32` (`vip/128`) to `ifname` for every VIP of `want` that is not there yet,
    /// so the node answers ARP (neighbour solicitations) for them and accepts their traffic.
    /// An IPv6 alias skips duplicate address detection (`nodad`): a VIP is meant to be
    /// answered for by this node at once, and a tentative address would drop the service's
    /// traffic for a second or more; and it is deprecated (see below), which an lb before
    /// that left undone: such an alias of lb's is written again, deprecated. `addrs` is the
    /// caller's dump of the namespace ([`Netlink::addresses`], one per apply, shared with
    /// what else the apply reads of the node): one request per missing alias, so an apply at
    /// thousands of VIPs costs requests only for what changed.
    pub fn add_aliases(
        &self,
        ifname: &str,
        want: &BTreeSet<IpAddr>,
        addrs: &[NodeAddr],
    ) -> Result<()> {
        let index = self.ifindex(ifname)?;
        // lb's IPv6 aliases an lb before deprecation left preferred: written again.
        let stale: BTreeSet<IpAddr> = (on_interface(addrs, index))
            .filter(|a| a.addr.is_ipv6() && a.is_lb_alias(want) && !a.deprecated)
            .map(|a| a.addr)
            .collect();
        let have: BTreeSet<IpAddr> = (on_interface(addrs, index))
            .filter(|a| a.is_host() && !stale.contains(&a.addr))
            .map(|a| a.addr)
            .collect();
        for vip in want.difference(&have) {
            let prefix = host_prefix(*vip);
            let mut req = self.handle.address().add(index, *vip, prefix);
            if stale.contains(vip) {
                req = req.replace();
            }
            let attrs = &mut req.message_mut().attributes;
            attrs.push(AddressAttribute::Protocol(AddressProtocol::from(
                ALIAS_PROTO,
            )));
            if vip.is_ipv6() {
                attrs.push(AddressAttribute::Flags(AddressFlags::Nodad));
                // Deprecated (preferred lifetime 0, valid for ever): the kernel's source
                // address selection prefers the longest matching prefix, which a /128 alias
                // wins over the interface's /64 for any destination on the subnet, so a
                // masqueraded flow (nftables') or a node's own connection would leave from
                // the VIP, which DSR backends own too and keep the answers to. A deprecated
                // address is never chosen while another is there, and is still one the
                // node answers neighbour discovery and traffic for.
                let mut life = CacheInfo::default();
                life.ifa_valid = u32::MAX;
                attrs.push(AddressAttribute::CacheInfo(life));
            }
            let r = self.rt.block_on(req.execute());
            match r {
                // Already present (a concurrent writer, a race with the dump) is success.
                Ok(()) => {}
                Err(e) if errno(&e) == Some(libc::EEXIST) => {}
                Err(e) => {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("adding alias {vip}/{prefix} to {ifname}"));
                }
            }
        }
        Ok(())
    }

    /// Removes `vip/32` (`vip/128`) from `ifname` for every VIP of `vips` that is lb's alias
    /// (never an address of the node that happens to be equal), with one dump. Idempotent:
    /// an alias already gone, or the interface itself, is success.
    pub fn remove_aliases(&self, ifname: &str, vips: &BTreeSet<IpAddr>) -> Result<()> {
        if vips.is_empty() {
            return Ok(());
        }
        let Ok(index) = self.ifindex(ifname) else {
            // The interface went away, and its addresses with it.
            return Ok(());
        };
        let msgs = self.addr_messages(Some(index))?;
        for msg in msgs {
            let Some((vip, prefix)) = Self::addr(&msg) else {
                continue;
            };
            if prefix != host_prefix(vip)
                || !vips.contains(&vip)
                || Self::proto(&msg).is_some_and(|p| p != ALIAS_PROTO)
            {
                continue;
            }
            match self.rt.block_on(self.handle.address().del(msg).execute()) {
                Ok(()) => {}
                Err(e) if errno(&e) == Some(libc::EADDRNOTAVAIL) => {}
                Err(e) => {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("removing alias {vip}/{prefix} from {ifname}"));
                }
            }
        }
        Ok(())
    }
}

/// Address dumps made by this process ([`Netlink::addresses`]): with thousands of VIP aliases
/// one costs more than the rest of a change, so the daemon counts them per change.
static DUMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn address_dumps() -> u64 {
    DUMPS.load(std::sync::atomic::Ordering::Relaxed)
}
