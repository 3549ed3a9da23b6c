//! The two ways a program writes packet bytes with their checksums (`lb_common::csum`
//! decides what to write; this is how). TC goes through the kernel's helpers for the L4
//! checksums, which depend on the skb's checksum state (offloaded or not, `skb->csum`), and
//! writes the rest in place; XDP does the arithmetic on bytes that are known to carry full
//! checksums (`nat::xdp_can_rewrite` decides which).
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    helpers::bpf_csum_diff,
};
use lb_common::csum::{L4Sum, Rewrite, Width, fold, updated_field};

use crate::parse::{Frame, L3_OFF, Packet, Skb, Xdp, ptr_at, read};

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

/// The most bytes one `bpf_csum_diff` call sums (its scratch area's size in the kernel).
const CHUNK: usize = 512;

/// Where [`fill_udp6`] copies packet bytes to sum them: a chunk and one word more, so that the
/// word padding a short last chunk with zeros fits whatever bound the verifier keeps on its
/// length.
pub type SumChunk = [u32; CHUNK / 4 + 1];

/// Gives the IPv6 UDP datagram `p`, whose checksum field is 0, its full checksum as it stands,
/// before it is translated (which then updates it as any other). IPv6 has no "no checksum"
/// (RFC 8200 8.1: a receiver discards such a datagram, unless a tunnel socket opted in, and
/// a valid checksum suits that one too), so translating it and leaving 0, as IPv4 does
/// (`lb_common::csum::updated_field`) and the kernel's NAT does for both families, would hand
/// on a datagram no endpoint takes. The parser refused those that cannot be given one
/// (`parse::udp6_unchecked`): a fragment, a length field that disagrees with the payload. A 0
/// is never partial (a CHECKSUM_PARTIAL field holds a nonzero seed), so no helper accounts
/// for the store: `skb->csum` follows it (CHECKSUM_COMPLETE).
#[inline(always)]
pub fn fill_udp6<C: Frame + Rewrite, K>(
    ctx: &C,
    p: &Packet<K>,
    chunk: &mut SumChunk,
) -> Option<()> {
    let L4Sum::Udp(check_off) = p.l4 else {
        return Some(());
    };
    let l4_len = (L3_OFF + p.len as usize).checked_sub(p.l4_off)?;
    match datagram_sum(ctx, p.l4_off, l4_len, p.seed, chunk) {
        0 => None,
        check => ctx.store16(check_off.into(), check, true),
    }
}

/// The checksum field of the `len` bytes at `off` (a checksum field among them holding 0)
/// under the pseudo-header sum `seed`, or 0 (which a computed field never is) if they cannot
/// be read. Not inlined: the loop is built once per context type (and a BPF subprogram takes
/// five arguments in registers, no `Option` returned through memory).
#[inline(never)]
fn datagram_sum<C: Frame>(ctx: &C, off: usize, len: usize, seed: u16, chunk: &mut SumChunk) -> u16 {
    if len == 0 {
        return 0;
    }
    let mut sum = u64::from(seed);
    let mut done = 0;
    // Whole chunks (even-sized, so each 16-bit word of the datagram is summed in its place),
    // then the rest, whose odd byte is padded with a zero, as RFC 1071 pads. Each iteration
    // either goes on by a whole chunk or ends: the verifier walks the loop once per chunk.
    for _ in 0..=u16::MAX as usize / CHUNK {
        let left = len - done;
        if left > CHUNK {
            let Some(s) = chunk_sum(ctx, off + done, CHUNK, chunk) else {
                return 0;
            };
            sum += s;
            done += CHUNK;
            continue;
        }
        // 1 to CHUNK, written so that the verifier sees both bounds on the value it passes.
        let Some(s) = chunk_sum(ctx, off + done, (left - 1) % CHUNK + 1, chunk) else {
            return 0;
        };
        let sum = sum + s;
        let sum = (sum & 0xffff_ffff) + (sum >> 32);
        let c = !fold(((sum & 0xffff_ffff) + (sum >> 32)) as u32);
        return if c == 0 { 0xffff } else { c };
    }
    0
}

/// The one's complement sum (32 bits, unfolded) of the `n` bytes at `off`.
#[inline(always)]
fn chunk_sum<C: Frame>(ctx: &C, off: usize, n: usize, chunk: &mut SumChunk) -> Option<u64> {
    *chunk.get_mut(n / 4)? = 0;
    if !ctx.copy_out(off, chunk.as_mut_ptr().cast(), n as u32) {
        return None;
    }
    // SAFETY: `chunk` holds the `n` bytes rounded up to a word (the zeroed word above).
    let s = unsafe {
        bpf_csum_diff(
            core::ptr::null_mut(),
            0,
            chunk.as_mut_ptr(),
            ((n + 3) & !3) as u32,
            0,
        )
    };
    (s >= 0).then_some(s as u64 & 0xffff_ffff)
}
