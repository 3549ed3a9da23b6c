//! The address filter (`lb_addr_filter`): the programs' answer to "could this packet be lb's
//! at all?" from one array value and a bit test, asked before any hash lookup, so that the
//! node's traffic that is no service's — containers talking to each other, the node's own
//! connections — costs lb a parse and a bit instead of a flow lookup and a service search.
//!
//! Two bitmaps over a hash of the address (one bit may stand for many addresses: the filter
//! only ever says "certainly not"): `not_dst`, set where no address a packet lb translates
//! at ingress or at a socket can be sent to hashes (a VIP, a published port's `host_ip`, the
//! node's addresses, a masquerade address, the unspecified address), and `not_backend`, set
//! where no backend's address hashes (every packet lb translates at egress comes from a
//! backend or, masqueraded or vetted, goes to one).
//!
//! A set bit is a promise, and an all-zero value promises nothing: a map not written yet, or
//! replaced (`DISPOSABLE_MAPS`), filters nothing and the programs do what they did without
//! it. So the controller clears the bits an apply needs before it writes the entries that
//! need them, and sets the bits it frees only after their entries are gone: it writes the
//! two values' intersection first and the new value last. A value written while a program
//! reads it can only tear between the old and the new value's words, and a bit both promise
//! is the same in both.
use crate::Addr;

/// Bits per bitmap: 32,768 (4 KiB each), so a node with thousands of service and backend
/// addresses still leaves most bits set.
pub const FILTER_BITS_LOG: u32 = 15;
pub const FILTER_WORDS: usize = (1 << FILTER_BITS_LOG) / 64;

/// The value of `lb_addr_filter`'s one slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrFilter {
    pub not_dst: [u64; FILTER_WORDS],
    pub not_backend: [u64; FILTER_WORDS],
}

#[cfg(feature = "user")]
// SAFETY: repr(C), two arrays of integers, no padding.
unsafe impl bytemuck::Zeroable for AddrFilter {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl bytemuck::Pod for AddrFilter {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for AddrFilter {}

/// Word index and mask of `a`'s bit: its words folded and spread by a multiplicative hash.
/// The index is masked to the bitmap, which also spares the programs a bounds check.
#[inline(always)]
pub fn bit<A: Addr>(a: &A) -> (usize, u64) {
    let mut x = 0u32;
    for i in 0..A::WORDS {
        x ^= a.word(i);
    }
    let h = x.wrapping_mul(0x9e37_79b1) >> (32 - FILTER_BITS_LOG);
    ((h as usize / 64) & (FILTER_WORDS - 1), 1u64 << (h % 64))
}

impl AddrFilter {
    /// A filter that promises nothing (every bit clear).
    pub const NONE: AddrFilter = AddrFilter {
        not_dst: [0; FILTER_WORDS],
        not_backend: [0; FILTER_WORDS],
    };

    /// A filter that says "certainly not" of every address, before any is admitted.
    pub const ALL: AddrFilter = AddrFilter {
        not_dst: [!0; FILTER_WORDS],
        not_backend: [!0; FILTER_WORDS],
    };

    /// Whether no packet lb translates at ingress or at a socket is sent to `a`.
    #[inline(always)]
    pub fn no_dst<A: Addr>(&self, a: &A) -> bool {
        let (w, m) = bit(a);
        self.not_dst[w] & m != 0
    }

    /// Whether `a` is no backend's address.
    #[inline(always)]
    pub fn no_backend<A: Addr>(&self, a: &A) -> bool {
        let (w, m) = bit(a);
        self.not_backend[w] & m != 0
    }

    pub fn admit_dst<A: Addr>(&mut self, a: &A) {
        let (w, m) = bit(a);
        self.not_dst[w] &= !m;
    }

    pub fn admit_backend<A: Addr>(&mut self, a: &A) {
        let (w, m) = bit(a);
        self.not_backend[w] &= !m;
    }

    /// What both promise: the value to write while moving from one to the other.
    pub fn both(&self, other: &AddrFilter) -> AddrFilter {
        let mut out = *self;
        for (o, x) in out.not_dst.iter_mut().zip(&other.not_dst) {
            *o &= x;
        }
        for (o, x) in out.not_backend.iter_mut().zip(&other.not_backend) {
            *o &= x;
        }
        out
    }
}

impl Default for AddrFilter {
    fn default() -> Self {
        AddrFilter::NONE
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::Addr6;

    #[test]
    fn admitted_addresses_pass_and_nothing_is_promised_by_default() {
        let mut f = AddrFilter::ALL;
        let vip: u32 = u32::from_be_bytes([10, 99, 0, 10]).to_be();
        let backend: Addr6 = [0xfd00_0000u32.to_be(), 0, 0, 2u32.to_be()];
        assert!(f.no_dst(&vip) && f.no_backend(&backend));
        f.admit_dst(&vip);
        f.admit_backend(&backend);
        assert!(!f.no_dst(&vip) && !f.no_backend(&backend));
        // The bitmaps are apart: a VIP is no backend for it.
        assert!(f.no_backend(&vip) && f.no_dst(&backend));
        let none = AddrFilter::default();
        assert!(!none.no_dst(&vip) && !none.no_backend(&backend));
    }

    #[test]
    fn the_intersection_keeps_only_what_both_promise() {
        let (a, b): (u32, u32) = (1u32.to_be(), 2u32.to_be());
        let mut old = AddrFilter::ALL;
        old.admit_dst(&a);
        let mut new = AddrFilter::ALL;
        new.admit_dst(&b);
        let both = old.both(&new);
        assert!(!both.no_dst(&a) && !both.no_dst(&b));
        assert!(both.no_dst(&3u32.to_be()) || bit(&3u32.to_be()) == bit(&a));
    }

    #[test]
    fn addresses_spread_over_the_bitmap() {
        // 4,096 consecutive addresses (a /20 of backends) take most of their own bits.
        let mut bits = std::collections::BTreeSet::new();
        for i in 0..4096u32 {
            bits.insert(bit(&(0x0a00_0000 + i).to_be()));
        }
        assert!(bits.len() > 3500, "{}", bits.len());
    }
}
