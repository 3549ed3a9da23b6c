//! The two ways a program writes packet bytes with their checksums (`lb_common::csum`
//! decides what to write; this is how). TC goes through the kernel's helpers for the L4
//! checksums, which depend on the skb's checksum state (offloaded or not, `skb->csum`), and
//! writes the rest in place; XDP does the arithmetic on bytes that are known to carry full
//! checksums (`nat::xdp_can_rewrite` decides which).
use aya_ebpf::bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM};
use lb_common::csum::{Rewrite, Width, updated_field};

use crate::parse::{Frame, Skb, Xdp, ptr_at, read};

impl Rewrite for Skb {
    #[inline(always)]
    fn load16(&self, off: usize) -> Option<u16> {
        read(self, off)
    }
    #[inline(always)]
    fn load32(&self, off: usize) -> Option<u32> {
        read(self, off)
    }
    // A store that no checksum compensates must make `skb->csum` follow (the helper with
    // BPF_F_RECOMPUTE_CSUM); every other store is written in place, which is what the helper
    // does without flags (the program's direct writes make the verifier unclone the skb
    // first, as the helper would): a helper call saved per field.
    #[inline(always)]
    fn store32(&self, off: usize, new: u32, recompute: bool) -> Option<()> {
        if recompute {
            return self.0.store(off, &new, flags(recompute)).ok();
        }
        // SAFETY: ptr_at bounds-checked the 4 bytes.
        unsafe { ptr_at::<u32>(self, off)?.write_unaligned(new) };
        Some(())
    }
    #[inline(always)]
    fn store16(&self, off: usize, new: u16, recompute: bool) -> Option<()> {
        if recompute {
            return self.0.store(off, &new, flags(recompute)).ok();
        }
        // SAFETY: ptr_at bounds-checked the 2 bytes.
        unsafe { ptr_at::<u16>(self, off)?.write_unaligned(new) };
        Some(())
    }
    /// The IPv4 header checksum is always a full one, never offloaded, and a header whose
    /// checksum follows its fields sums to the same value: `skb->csum` (CHECKSUM_COMPLETE)
    /// needs nothing. So the arithmetic is done in place, as XDP does it.
    #[inline(always)]
    fn ip_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()> {
        field(self, csum_off, old, new, size, false)
    }
    #[inline(always)]
    fn l4_csum(
        &self,
        csum_off: usize,
        old: u32,
        new: u32,
        size: Width,
        udp: bool,
        pseudo: bool,
    ) -> Option<()> {
        let mut flags = size as u64;
        if pseudo {
            flags |= BPF_F_PSEUDO_HDR as u64;
        }
        if udp {
            flags |= BPF_F_MARK_MANGLED_0 as u64;
        }
        self.0
            .l4_csum_replace(csum_off, old.into(), new.into(), flags)
            .ok()
    }
    #[inline(always)]
    fn plain_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()> {
        self.0
            .l4_csum_replace(csum_off, old.into(), new.into(), size as u64)
            .ok()
    }
}

#[inline(always)]
fn flags(recompute: bool) -> u64 {
    if recompute {
        BPF_F_RECOMPUTE_CSUM as u64
    } else {
        0
    }
}

impl Rewrite for Xdp {
    #[inline(always)]
    fn load16(&self, off: usize) -> Option<u16> {
        read(self, off)
    }
    #[inline(always)]
    fn load32(&self, off: usize) -> Option<u32> {
        read(self, off)
    }
    #[inline(always)]
    fn store32(&self, off: usize, new: u32, _recompute: bool) -> Option<()> {
        // SAFETY: ptr_at bounds-checked the 4 bytes.
        unsafe { ptr_at::<u32>(self, off)?.write_unaligned(new) };
        Some(())
    }
    #[inline(always)]
    fn store16(&self, off: usize, new: u16, _recompute: bool) -> Option<()> {
        // SAFETY: ptr_at bounds-checked the 2 bytes.
        unsafe { ptr_at::<u16>(self, off)?.write_unaligned(new) };
        Some(())
    }
    #[inline(always)]
    fn ip_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()> {
        field(self, csum_off, old, new, size, false)
    }
    #[inline(always)]
    fn l4_csum(
        &self,
        csum_off: usize,
        old: u32,
        new: u32,
        size: Width,
        udp: bool,
        _pseudo: bool,
    ) -> Option<()> {
        field(self, csum_off, old, new, size, udp)
    }
    #[inline(always)]
    fn plain_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()> {
        field(self, csum_off, old, new, size, false)
    }
}

#[inline(always)]
fn field(f: &impl Frame, off: usize, old: u32, new: u32, size: Width, udp: bool) -> Option<()> {
    let p = ptr_at::<u16>(f, off)?;
    // SAFETY: bounds-checked above.
    unsafe { p.write_unaligned(updated_field(p.read_unaligned(), old, new, size, udp)) };
    Some(())
}
