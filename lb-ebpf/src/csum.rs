//! Checksum arithmetic (RFC 1071 / RFC 1624), and the one place where a header field is
//! rewritten together with every checksum that covers it.
//!
//! Contract of [`Rewrite`]: the checksum is updated *before* the field is stored, so that the
//! XDP side can still see the old header when it decides whether the L4 checksum is a full
//! one or a CHECKSUM_PARTIAL seed (see [`XdpContext`]'s impl).
use aya_ebpf::{
    bindings::{BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    programs::{TcContext, XdpContext},
};

use crate::parse::{Frame, ptr_at};

/// `BPF_F_MARK_MANGLED_0`: a UDP checksum of 0 ("none") stays 0, and a computed 0 is sent as
/// 0xffff. (Not in aya-ebpf's bindings.)
const BPF_F_MARK_MANGLED_0: u64 = 32;

/// What a checksum field covers, which decides how a change under it is folded in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Csum {
    /// The IPv4 header checksum.
    Ip,
    /// A TCP or UDP checksum; `pseudo` when the changed word is in the pseudo-header (an
    /// address) rather than in the segment (a port); `partial` when the field holds a
    /// CHECKSUM_PARTIAL seed (only XDP needs to be told: the skb helpers know).
    L4 {
        udp: bool,
        pseudo: bool,
        partial: bool,
    },
    /// A checksum over plain data, no pseudo-header (ICMP, covering a quoted packet).
    Plain,
}

#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

#[inline(always)]
fn halves(v: u32) -> u32 {
    (v & 0xffff) + (v >> 16)
}

/// RFC 1624 eqn. 3: checksum `check` after a covered 32-bit word went from `old` to `new`.
#[inline(always)]
pub fn replace32(check: u16, old: u32, new: u32) -> u16 {
    !fold(u32::from(!check) + halves(!old) + halves(new))
}

/// RFC 1624 eqn. 3 for a 16-bit word.
#[inline(always)]
pub fn replace16(check: u16, old: u16, new: u16) -> u16 {
    !fold(u32::from(!check) + u32::from(!old) + u32::from(new))
}

/// A CHECKSUM_PARTIAL seed (the folded, *non*-inverted pseudo-header sum the sender's device
/// completes) after a pseudo-header word went from `old` to `new`: it moves the other way.
#[inline(always)]
pub fn reseed32(seed: u16, old: u32, new: u32) -> u16 {
    fold(u32::from(seed) + halves(!old) + halves(new))
}

/// A header field rewrite with every checksum covering it.
pub trait Rewrite: Frame {
    fn store32(&self, off: usize, new: u32) -> Option<()>;
    fn store16(&self, off: usize, new: u16) -> Option<()>;
    fn csum32(&self, csum_off: usize, old: u32, new: u32, kind: Csum) -> Option<()>;
    fn csum16(&self, csum_off: usize, old: u16, new: u16, kind: Csum) -> Option<()>;
}

impl Rewrite for TcContext {
    // The skb helpers know the skb's checksum state (CHECKSUM_PARTIAL from a local sender with
    // offload, COMPLETE, NONE), so TC never has to guess it.
    #[inline(always)]
    fn store32(&self, off: usize, new: u32) -> Option<()> {
        self.store(off, &new, BPF_F_RECOMPUTE_CSUM as u64).ok()
    }
    #[inline(always)]
    fn store16(&self, off: usize, new: u16) -> Option<()> {
        self.store(off, &new, BPF_F_RECOMPUTE_CSUM as u64).ok()
    }
    #[inline(always)]
    fn csum32(&self, csum_off: usize, old: u32, new: u32, kind: Csum) -> Option<()> {
        let (old, new) = (u64::from(old), u64::from(new));
        match kind {
            Csum::Ip => self.l3_csum_replace(csum_off, old, new, 4),
            Csum::L4 { udp, pseudo, .. } => {
                self.l4_csum_replace(csum_off, old, new, l4_flags(udp, pseudo) | 4)
            }
            Csum::Plain => self.l4_csum_replace(csum_off, old, new, 4),
        }
        .ok()
    }
    #[inline(always)]
    fn csum16(&self, csum_off: usize, old: u16, new: u16, kind: Csum) -> Option<()> {
        let (old, new) = (u64::from(old), u64::from(new));
        match kind {
            Csum::Ip => self.l3_csum_replace(csum_off, old, new, 2),
            Csum::L4 { udp, pseudo, .. } => {
                self.l4_csum_replace(csum_off, old, new, l4_flags(udp, pseudo) | 2)
            }
            Csum::Plain => self.l4_csum_replace(csum_off, old, new, 2),
        }
        .ok()
    }
}

#[inline(always)]
fn l4_flags(udp: bool, pseudo: bool) -> u64 {
    (if pseudo { BPF_F_PSEUDO_HDR as u64 } else { 0 }) | if udp { BPF_F_MARK_MANGLED_0 } else { 0 }
}

impl Rewrite for XdpContext {
    #[inline(always)]
    fn store32(&self, off: usize, new: u32) -> Option<()> {
        // SAFETY: ptr_at bounds-checked the 4 bytes.
        unsafe { ptr_at::<u32>(self, off)?.write_unaligned(new) };
        Some(())
    }
    #[inline(always)]
    fn store16(&self, off: usize, new: u16) -> Option<()> {
        // SAFETY: ptr_at bounds-checked the 2 bytes.
        unsafe { ptr_at::<u16>(self, off)?.write_unaligned(new) };
        Some(())
    }
    #[inline(always)]
    fn csum32(&self, csum_off: usize, old: u32, new: u32, kind: Csum) -> Option<()> {
        let p = ptr_at::<u16>(self, csum_off)?;
        // SAFETY: bounds-checked above.
        let check = unsafe { p.read_unaligned() };
        let updated = match kind {
            Csum::L4 { udp: true, .. } if check == 0 => return Some(()),
            Csum::L4 {
                pseudo: true,
                partial: true,
                ..
            } => reseed32(check, old, new),
            _ => replace32(check, old, new),
        };
        unsafe { p.write_unaligned(mangle_zero(kind, updated)) };
        Some(())
    }
    #[inline(always)]
    fn csum16(&self, csum_off: usize, old: u16, new: u16, kind: Csum) -> Option<()> {
        let p = ptr_at::<u16>(self, csum_off)?;
        // SAFETY: bounds-checked above.
        let check = unsafe { p.read_unaligned() };
        let updated = match kind {
            Csum::L4 { udp: true, .. } if check == 0 => return Some(()),
            // A partial seed covers only the pseudo-header; the device sums the ports itself.
            Csum::L4 {
                pseudo: false,
                partial: true,
                ..
            } => return Some(()),
            _ => replace16(check, old, new),
        };
        unsafe { p.write_unaligned(mangle_zero(kind, updated)) };
        Some(())
    }
}

#[inline(always)]
fn mangle_zero(kind: Csum, check: u16) -> u16 {
    match kind {
        Csum::L4 { udp: true, .. } if check == 0 => 0xffff,
        _ => check,
    }
}

/// The CHECKSUM_PARTIAL seed of a TCP/UDP packet: the folded pseudo-header sum, which a
/// sender with checksum offload (a local socket behind a veth, say) leaves in the checksum
/// field for its device to complete. XDP has no skb to ask whether a packet is partial; a
/// field equal to its seed is one (a full checksum equals it only by a 1-in-65536
/// coincidence), and the two need different updates (see [`reseed32`]).
#[inline(always)]
pub fn pseudo_seed(saddr: u32, daddr: u32, proto: u8, l4_len: u16) -> u16 {
    fold(
        halves(saddr)
            + halves(daddr)
            + u32::from(u16::from(proto).to_be())
            + u32::from(l4_len.to_be()),
    )
}
