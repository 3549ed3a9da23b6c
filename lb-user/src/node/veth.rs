//! Whether the peer of a veth takes frames that XDP sends out of it.
//!
//! XDP_TX (and an XDP redirect) out of a veth hands the frame straight to the peer's XDP
//! receive queue (`veth_xdp_xmit`). The kernel runs that queue while the peer has an XDP
//! program or GRO on, but on Linux 6.18 here frames sent to a peer with GRO alone were never
//! delivered (counted as sent, no error, never seen on the peer), while a peer with an XDP
//! program (one that passes every frame will do) takes them. A DSR balancer attached by XDP
//! sends every VIP frame that way, so `lb status` checks the peer for an XDP program. The peer
//! may sit in another namespace: it is found among the named ones (/run/netns), as the one
//! whose id here is the veth's link-netnsid.
use std::{mem::zeroed, os::fd::AsRawFd as _};

use anyhow::{Context as _, Result, bail};

use super::{Link, Netlink, in_netns};

/// `ETHTOOL_GGRO` (linux/ethtool.h): read whether GRO is on.
const ETHTOOL_GGRO: u32 = 0x0000_002b;
/// `SIOCETHTOOL` (linux/sockios.h).
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// What the peer of a veth does with frames XDP sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// An XDP program: frames are taken.
    Takes,
    /// None: frames are lost. The peer's name and where it is, and whether it has GRO on.
    Drops { peer: String, gro: bool },
    /// The peer could not be looked at (why).
    Unknown(String),
}

/// Whether GRO is on for `ifname` in the calling thread's namespace.
pub fn gro_on(ifname: &str) -> Result<bool> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_GGRO,
        data: 0,
    };
    // SAFETY: an all-zero ifreq is valid; the name is copied in below within its size.
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    let name = ifname.as_bytes();
    if name.len() >= ifr.ifr_name.len() {
        bail!("interface name {ifname:?} too long");
    }
    for (d, s) in ifr.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: a plain socket call; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening a socket for ethtool");
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: SIOCETHTOOL with an ifreq whose data points at a live ethtool_value.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut ifr) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading whether GRO is on for {ifname}"));
    }
    Ok(value.data != 0)
}

/// The state of `link`'s peer (a veth of the calling thread's namespace).
pub fn peer_of(nl: &Netlink, link: &Link) -> Peer {
    match peer(nl, link) {
        Ok(p) => p,
        Err(e) => Peer::Unknown(format!("{e:#}")),
    }
}

fn peer(nl: &Netlink, link: &Link) -> Result<Peer> {
    let Some(index) = link.peer else {
        bail!("{} is not a veth with a peer", link.name);
    };
    if link.peer_netnsid.is_none() {
        let links = nl.link_table()?;
        let Some(p) = links.iter().find(|l| l.index == index) else {
            bail!(
                "the peer if{index} of {} is not in its namespace",
                link.name
            );
        };
        return judge(nl, p, "this namespace");
    }
    let entries = match std::fs::read_dir("/run/netns") {
        Ok(e) => e,
        Err(e) => bail!(
            "the peer of {} is in another namespace, and /run/netns cannot be listed: {e}",
            link.name
        ),
    };
    // The peer's namespace is the named one this namespace knows by the link's netnsid.
    for entry in entries.flatten() {
        let path = entry.path();
        if nl.nsid_of(&path).ok().flatten() != link.peer_netnsid {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let place = format!("namespace {name}");
        return in_netns(Some(&name), move || {
            let nl = Netlink::new()?;
            let links = nl.link_table()?;
            let Some(p) = links.iter().find(|l| l.index == index) else {
                bail!("the peer if{index} is not in {place}");
            };
            judge(&nl, p, &place)
        });
    }
    bail!(
        "the peer of {} is in a namespace without a name under /run/netns",
        link.name
    )
}

fn judge(nl: &Netlink, peer: &Link, place: &str) -> Result<Peer> {
    if nl.xdp_prog_id(&peer.name)?.is_some() {
        return Ok(Peer::Takes);
    }
    Ok(Peer::Drops {
        peer: format!("{} in {place}", peer.name),
        gro: gro_on(&peer.name)?,
    })
}
