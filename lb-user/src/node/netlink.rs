//! Interface addresses, aliases and links over rtnetlink.
//!
//! Contract: [`Netlink`] talks to the namespace of the thread that created it, so it is only
//! made inside [`super::in_netns`] (or the watcher's own thread). The methods block; they own
//! a private current-thread runtime, so they are safe to call from a thread that is not a
//! tokio worker.
use std::{
    collections::BTreeSet,
    ffi::CString,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::{Context as _, Result, bail};
use futures_util::TryStreamExt as _;
use netlink_packet_route::{
    AddressFamily,
    address::{
        AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol,
        CacheInfo,
    },
    link::{
        InfoBridgePort, InfoKind, InfoPortData, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
        LinkXdp,
    },
    neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourExtFlags, NeighbourFlags, NeighbourState,
    },
};

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

/// A blocking rtnetlink client for the current thread's network namespace.
pub struct Netlink {
    rt: tokio::runtime::Runtime,
    handle: rtnetlink::Handle,
}

/// A netlink NACK's errno (the kernel sends it negated), if the error is one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

impl Netlink {
    pub fn new() -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .context("starting a netlink runtime")?;
        // The connection's socket is opened here, in the caller's (namespace's) thread.
        let handle = rt.block_on(async {
            let (conn, handle, _) =
                rtnetlink::new_connection().context("opening a rtnetlink socket")?;
            tokio::spawn(conn);
            anyhow::Ok(handle)
        })?;
        Ok(Self { rt, handle })
    }

    /// The index of interface `ifname`, with an error naming it when it does not exist.
    pub fn ifindex(&self, ifname: &str) -> Result<u32> {
        let c = CString::new(ifname).with_context(|| format!("interface name {ifname:?}"))?;
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            bail!("interface {ifname} does not exist");
        }
        Ok(index)
    }

    /// The interfaces of a network (`interfaces`, in its order) that exist here, with their
    /// indexes. The first must exist: it carries the VIP aliases, and its absence is an error
    /// naming it. A later one that does not exist yet is left out; it is served from when it
    /// appears (the bridge a CNI plugin creates with its first pod), since the daemon applies
    /// the network again on the node's link events. The one place that rule lives.
    pub fn present<'a>(&self, interfaces: &'a [String]) -> Result<Vec<(&'a str, u32)>> {
        let mut out = Vec::new();
        for (i, name) in interfaces.iter().enumerate() {
            match self.ifindex(name) {
                Ok(index) => out.push((name.as_str(), index)),
                Err(_) if i > 0 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The name of interface `index`, or `if<index>` when it has none any more (for messages).
    pub fn ifname(&self, index: u32) -> String {
        let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname writes at most.
        let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
        if p.is_null() {
            return format!("if{index}");
        }
        // SAFETY: on success `buf` holds a NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

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

    fn links(&self) -> Result<Vec<LinkMessage>> {
        self.rt.block_on(async {
            (self.handle.link().get().execute())
                .try_collect()
                .await
                .context("listing links")
        })
    }

    /// The id this namespace knows the namespace at `path` by (RTM_GETNSID), as a link's
    /// IFLA_LINK_NETNSID names it; `None` when it has none.
    pub fn nsid_of(&self, path: &std::path::Path) -> Result<Option<i32>> {
        use futures_util::StreamExt as _;
        use netlink_packet_route::{
            RouteNetlinkMessage,
            nsid::{NsidAttribute, NsidMessage},
        };
        use rtnetlink::packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
        let file = std::fs::File::open(path)
            .with_context(|| format!("opening network namespace {}", path.display()))?;
        let mut msg = NsidMessage::default();
        (msg.attributes).push(NsidAttribute::Fd(
            std::os::fd::AsRawFd::as_raw_fd(&file) as u32
        ));
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetNsId(msg));
        req.header.flags = NLM_F_REQUEST;
        let mut handle = self.handle.clone();
        self.rt.block_on(async {
            let mut replies = handle.request(req).context("asking for a namespace id")?;
            while let Some(reply) = replies.next().await {
                match reply.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(m)) => {
                        return Ok(m.attributes.iter().find_map(|a| match a {
                            NsidAttribute::Id(id) if *id >= 0 => Some(*id),
                            _ => None,
                        }));
                    }
                    NetlinkPayload::Error(e) if e.code.is_some() => {
                        bail!("asking for the id of {}: {e}", path.display())
                    }
                    _ => {}
                }
            }
            Ok(None)
        })
    }

    /// The id of the XDP program attached to `ifname`, if any.
    pub fn xdp_prog_id(&self, ifname: &str) -> Result<Option<u32>> {
        let index = self.ifindex(ifname)?;
        let links = self.links()?;
        let Some(link) = links.iter().find(|m| m.header.index == index) else {
            return Ok(None);
        };
        Ok(link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Xdp(x) => x.iter().find_map(|x| match x {
                LinkXdp::ProgId(id) if *id != 0 => Some(*id),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// Whether `ifname` is a veth.
    pub fn is_veth(&self, ifname: &str) -> Result<bool> {
        let index = self.ifindex(ifname)?;
        Ok((self.links()?.iter())
            .find(|m| m.header.index == index)
            .is_some_and(|m| link_infos(m).contains(&LinkInfo::Kind(InfoKind::Veth))))
    }

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

/// A link's IFLA_LINKINFO attributes (kind, port data).
fn link_infos(m: &LinkMessage) -> Vec<LinkInfo> {
    (m.attributes.iter())
        .filter_map(|a| match a {
            LinkAttribute::LinkInfo(i) => Some(i.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A bpf classifier on a clsact hook, as the kernel lists it.
#[derive(Clone, Debug)]
pub struct BpfFilter {
    pub priority: u16,
    pub handle: u32,
    /// The name it was attached with (lb's: the program's name).
    pub name: String,
    /// The loaded program it runs.
    pub prog_id: u32,
}

impl Netlink {
    /// The bpf filters on `index`'s clsact egress (or ingress) hook; none without clsact.
    pub fn bpf_filters(&self, index: u32, egress: bool) -> Result<Vec<BpfFilter>> {
        use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};
        let msgs: Vec<_> = self.rt.block_on(async {
            let req = self.handle.traffic_filter(index as i32).get();
            let req = if egress { req.egress() } else { req.ingress() };
            let mut out = Vec::new();
            let mut stream = std::pin::pin!(req.execute());
            loop {
                match stream.try_next().await {
                    Ok(Some(m)) => out.push(m),
                    Ok(None) => return Ok(out),
                    // No clsact qdisc: no filters.
                    Err(e) if errno(&e) == Some(libc::EINVAL) => return Ok(out),
                    Err(e) => return Err(anyhow::Error::new(e).context("listing tc filters")),
                }
            }
        })?;
        let mut out = Vec::new();
        for m in msgs {
            let (mut name, mut prog_id) = (None, None);
            for attr in &m.attributes {
                let TcAttribute::Options(opts) = attr else {
                    continue;
                };
                for o in opts {
                    match o {
                        TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => name = Some(n.clone()),
                        TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => prog_id = Some(*id),
                        _ => {}
                    }
                }
            }
            // A filter chain's head (handle 0) carries no program.
            if let (Some(name), Some(prog_id)) = (name, prog_id) {
                out.push(BpfFilter {
                    priority: (m.header.info >> 16) as u16,
                    handle: u32::from(m.header.handle),
                    name,
                    prog_id,
                });
            }
        }
        Ok(out)
    }
}

/// What kind of device a link is, as far as the fast path cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Veth,
    Bridge,
    Other,
}

/// A link of the namespace, as a dump gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub kind: LinkKind,
    /// The bridge (or other master) it is a port of.
    pub master: Option<u32>,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    /// Administratively up with a carrier (IFF_UP and IFF_LOWER_UP).
    pub up: bool,
    /// A veth's peer: its ifindex (IFLA_LINK) and, when it is in another namespace, that
    /// namespace's id as this one knows it (IFLA_LINK_NETNSID).
    pub peer: Option<u32>,
    pub peer_netnsid: Option<i32>,
}

/// A neighbour entry: an address on a link with a MAC the kernel holds as good (reachable,
/// stale, being re-checked, or set by hand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    /// ARP's (IPv4) or neighbour discovery's (IPv6).
    pub addr: IpAddr,
    pub mac: [u8; 6],
}

/// A bridge forwarding entry: frames to `mac` on bridge `master` leave by port `port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdbEntry {
    pub port: u32,
    pub master: u32,
    pub mac: [u8; 6],
}

fn mac(bytes: &[u8]) -> Option<[u8; 6]> {
    bytes.try_into().ok()
}

impl Netlink {
    /// Every link of the namespace (one dump).
    pub fn link_table(&self) -> Result<Vec<Link>> {
        Ok((self.links()?.iter())
            .map(|m| {
                let infos = link_infos(m);
                let kind = if infos.contains(&LinkInfo::Kind(InfoKind::Veth)) {
                    LinkKind::Veth
                } else if infos.contains(&LinkInfo::Kind(InfoKind::Bridge)) {
                    LinkKind::Bridge
                } else {
                    LinkKind::Other
                };
                let mut link = Link {
                    index: m.header.index,
                    name: format!("if{}", m.header.index),
                    kind,
                    master: None,
                    mac: None,
                    mtu: 0,
                    up: m.header.flags.contains(LinkFlags::Up)
                        && m.header.flags.contains(LinkFlags::LowerUp),
                    peer: None,
                    peer_netnsid: None,
                };
                for a in &m.attributes {
                    match a {
                        LinkAttribute::IfName(n) => link.name = n.clone(),
                        LinkAttribute::Link(p) if kind == LinkKind::Veth => link.peer = Some(*p),
                        LinkAttribute::LinkNetNsId(n) => link.peer_netnsid = Some(*n),
                        LinkAttribute::Controller(c) => link.master = Some(*c),
                        LinkAttribute::Address(a) => link.mac = mac(a),
                        LinkAttribute::Mtu(v) => link.mtu = *v,
                        _ => {}
                    }
                }
                link
            })
            .collect())
    }

    /// One dump of the neighbour table of `family` (AF_BRIDGE: the bridges' FDB).
    fn neighbour_dump(
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

/// Address dumps made by this process ([`Netlink::addresses`]): with thousands of VIP aliases
/// one costs more than the rest of a change, so the daemon counts them per change.
static DUMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn address_dumps() -> u64 {
    DUMPS.load(std::sync::atomic::Ordering::Relaxed)
}
