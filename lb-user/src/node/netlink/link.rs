//! The namespace's links: one dump read as a table ([`Netlink::link_table`]: kinds, masters,
//! MACs, veth peers), a veth peer's namespace id, and the XDP program an interface runs.
use anyhow::{Context as _, Result, bail};
use futures_util::TryStreamExt as _;
use netlink_packet_route::link::{
    InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, LinkXdp,
};

use super::{Netlink, mac};

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

/// A link's IFLA_LINKINFO attributes (kind, port data).
pub(super) fn link_infos(m: &LinkMessage) -> Vec<LinkInfo> {
    (m.attributes.iter())
        .filter_map(|a| match a {
            LinkAttribute::LinkInfo(i) => Some(i.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

impl Netlink {
    pub(super) fn links(&self) -> Result<Vec<LinkMessage>> {
        self.rt.block_on(async {
            (self.handle.link().get().execute())
                .try_collect()
                .await
                .context("listing links")
        })
    }

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
}
