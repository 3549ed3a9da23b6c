//! Knowing when to look at the firewall again: nftables' change notifications of one
//! namespace, lb's own tables left out.
use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd},
};

use anyhow::{Context as _, Result};
use rtnetlink::sys::{Socket, protocols::NETLINK_NETFILTER};

use crate::node::nft::TABLE_PREFIX;

/// The multicast group of nf_tables' change notifications (`NFNLGRP_NFTABLES`).
const NFNLGRP_NFTABLES: u32 = 7;
/// nfnetlink's subsystem of nf_tables messages (`NFNL_SUBSYS_NFTABLES`), the high byte of a
/// message's type.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The message closing every transaction (`NFT_MSG_NEWGEN`): it names no table, and the
/// transaction's own messages come with it.
const NFT_MSG_NEWGEN: u16 = 15;
/// The attribute naming the table in every other nf_tables message (`NFTA_TABLE_NAME`,
/// `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, …, all 1).
const NFTA_TABLE: u16 = 1;
/// The families of lb's own tables (`NFPROTO_IPV4`, `NFPROTO_IPV6`).
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// `struct nlmsghdr` and `struct nfgenmsg`.
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

/// Changes to the nftables ruleset of one namespace: a NETLINK_NETFILTER socket subscribed to
/// `NFNLGRP_NFTABLES`, non-blocking. Readable means "the ruleset may have changed":
/// [`NftEvents::drain`] then says whether anything but lb's own tables did, and
/// [`forward_filters`](super::forward_filters) is due again.
///
/// iptables-nft and ebtables-nft changes arrive here too (they are nf_tables transactions);
/// legacy iptables changes do not (they replace a whole x_tables blob, announced to no one), so
/// a node using `iptables-legacy` is only seen anew when something else triggers a check.
pub struct NftEvents {
    socket: Socket,
    buf: Vec<u8>,
}

/// Subscribes to nftables changes in the calling thread's network namespace; the socket stays
/// in that namespace whichever thread polls it.
pub fn nft_events() -> Result<NftEvents> {
    let mut socket =
        Socket::new(NETLINK_NETFILTER).context("opening a netfilter netlink socket")?;
    socket
        .bind_auto()
        .context("binding a netfilter netlink socket")?;
    socket
        .add_membership(NFNLGRP_NFTABLES)
        .context("subscribing to nftables changes")?;
    socket
        .set_non_blocking(true)
        .context("making the netfilter netlink socket non-blocking")?;
    Ok(NftEvents {
        socket,
        buf: vec![0; 1 << 16],
    })
}

impl NftEvents {
    /// Reads every pending notification without blocking; true when one is about a table
    /// other than lb's own, could not be read, or some were lost (the socket overran), so
    /// [`forward_filters`](super::forward_filters) is due again. lb's nftables dataplane writing its tables thus never
    /// triggers a check (nor a loop of apply → change → apply).
    pub fn drain(&mut self) -> Result<bool> {
        let mut changed = false;
        loop {
            // MSG_TRUNC: the datagram's whole length, so a truncated one is noticed.
            match self.socket.recv(&mut &mut self.buf[..], libc::MSG_TRUNC) {
                Ok(n) if n > self.buf.len() => changed = true,
                Ok(n) => changed |= relevant(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(changed),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => changed = true,
                Err(e) => return Err(e).context("reading nftables changes"),
            }
        }
    }
}

impl AsRawFd for NftEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl AsFd for NftEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is the socket's, open as long as `self` is borrowed.
        unsafe { BorrowedFd::borrow_raw(self.socket.as_raw_fd()) }
    }
}

/// Whether a datagram of nf_tables notifications is about any table but lb's own (`ip lb-*`,
/// `ip6 lb-*`);
/// what cannot be read counts as a change.
fn relevant(mut bytes: &[u8]) -> bool {
    let mut any = false;
    while !bytes.is_empty() {
        if bytes.len() < NLMSG_HDRLEN {
            return true;
        }
        let len = u32::from_ne_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(bytes[4..6].try_into().expect("2 bytes"));
        if len < NLMSG_HDRLEN || len > bytes.len() {
            return true;
        }
        let msg = &bytes[..len];
        if kind >> 8 == NFNL_SUBSYS_NFTABLES && kind & 0xff != NFT_MSG_NEWGEN {
            any |= match table_of(msg) {
                Some((family, table)) => {
                    !(matches!(family, NFPROTO_IPV4 | NFPROTO_IPV6)
                        && table.starts_with(TABLE_PREFIX.as_bytes()))
                }
                None => true,
            };
        }
        bytes = &bytes[len.next_multiple_of(4).min(bytes.len())..];
    }
    any
}

/// The family and table name of one nf_tables message.
fn table_of(msg: &[u8]) -> Option<(u8, &[u8])> {
    let family = *msg.get(NLMSG_HDRLEN)?;
    let mut attrs = msg.get(NLMSG_HDRLEN + NFGENMSG_LEN..)?;
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes(attrs[..2].try_into().expect("2 bytes")) as usize;
        // NLA_TYPE_MASK: the top two bits are flags.
        let kind = u16::from_ne_bytes(attrs[2..4].try_into().expect("2 bytes")) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFTA_TABLE {
            let name = &attrs[4..len];
            return Some((family, name.split(|&b| b == 0).next().unwrap_or(name)));
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One nf_tables notification: `family`, message `msg`, attribute 1 = `table`.
    fn message(family: u8, msg: u16, table: &str) -> Vec<u8> {
        let attr_len = 4 + table.len() + 1;
        let len = NLMSG_HDRLEN + NFGENMSG_LEN + attr_len.next_multiple_of(4);
        let mut m = Vec::with_capacity(len);
        m.extend((len as u32).to_ne_bytes());
        m.extend(((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
        m.extend([0; 10]); // flags, seq, pid
        m.extend([family, 0, 0, 0]);
        m.extend((attr_len as u16).to_ne_bytes());
        m.extend(NFTA_TABLE.to_ne_bytes());
        m.extend(table.as_bytes());
        m.resize(len, 0);
        m
    }

    #[test]
    fn notifications_about_lb_tables_alone_are_no_change() {
        let ours = message(NFPROTO_IPV4, 6, "lb-web");
        let ours6 = message(NFPROTO_IPV6, 6, "lb-web");
        let gen_ = message(0, NFT_MSG_NEWGEN, "");
        let theirs = message(1, 6, "lb-web"); // inet: not lb's
        assert!(!relevant(&[ours.clone(), ours6, gen_.clone()].concat()));
        assert!(relevant(&[ours.clone(), theirs, gen_].concat()));
        assert!(relevant(&message(NFPROTO_IPV4, 3, "filter")));
        assert!(relevant(&ours[..ours.len() - 4]), "a truncated message");
    }
}
