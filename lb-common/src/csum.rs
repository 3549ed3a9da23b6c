//! Checksum arithmetic (RFC 1071 / RFC 1624) and the one place where a header field is
//! rewritten together with every checksum that covers it.
//!
//! The programs reach the packet through [`Rewrite`]: on TC the kernel's helpers
//! (`bpf_skb_store_bytes`, `bpf_l3_csum_replace`, `bpf_l4_csum_replace`), which know the skb's
//! checksum state; on XDP plain arithmetic on the bytes. [`set_addr`] and [`set_ports`] decide
//! which checksums a change touches and in what order, once for both; the host tests run the
//! same two functions against a model of the kernel helpers for each `ip_summed` state.
//!
//! The contract for TC, which the model test holds the code to: a field is stored *without*
//! `BPF_F_RECOMPUTE_CSUM` when an inet checksum helper accounts for it. A TCP/UDP change is
//! then exact in every state: on CHECKSUM_PARTIAL `bpf_l4_csum_replace` moves the seed for
//! pseudo-header words and leaves it for ports; on CHECKSUM_COMPLETE an address change and its
//! IP-checksum change cancel in `skb->csum`, a port change and its L4-checksum change cancel,
//! and the pseudo-header flag makes the helper account for the L4 checksum's own change.
//! Storing with the recompute flag as well would count the change twice. SCTP's CRC32c is not
//! an inet sum, so its port and CRC stores do recompute `skb->csum`.
use crate::{Addr, crc32c};

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
/// Words are taken as they stand in memory; one's complement sums do not depend on byte order
/// as long as every word is taken the same way.
#[inline(always)]
pub fn replace32(check: u16, old: u32, new: u32) -> u16 {
    !fold(u32::from(!check) + halves(!old) + halves(new))
}

/// RFC 1624 eqn. 3 for a 16-bit word.
#[inline(always)]
pub fn replace16(check: u16, old: u16, new: u16) -> u16 {
    !fold(u32::from(!check) + u32::from(!old) + u32::from(new))
}

/// The folded, non-inverted pseudo-header sum of a TCP/UDP segment: what a sender with
/// checksum offload leaves in the checksum field (CHECKSUM_PARTIAL) for its device to
/// complete. A partial packet always holds exactly this, so a field that differs from it is a
/// full checksum; one that equals it may be either (see [`crate::flow`]'s XDP rule).
#[inline(always)]
pub fn pseudo_seed(saddr: u32, daddr: u32, proto: u8, l4_len: u16) -> u16 {
    fold(
        halves(saddr)
            + halves(daddr)
            + u32::from(u16::from(proto).to_be())
            + u32::from(l4_len.to_be()),
    )
}

/// [`pseudo_seed`] for IPv6 (RFC 8200 8.1): the addresses as they stand in the packet, the
/// upper-layer length as 32 bits and the final next header (that of the L4 header, not of an
/// extension header before it). ICMPv6 is covered by it too, unlike ICMP.
#[inline(always)]
pub fn pseudo_seed6(saddr: &[u32; 4], daddr: &[u32; 4], proto: u8, l4_len: u32) -> u16 {
    let mut sum = halves(l4_len.to_be()) + u32::from(u16::from(proto).to_be());
    let mut i = 0;
    while i < 4 {
        sum += halves(saddr[i]) + halves(daddr[i]);
        i += 1;
    }
    fold(sum)
}

/// The checksum a packet's L4 header carries, which rewriting its addresses or ports must fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4Sum {
    /// No L4 header in this packet (a later fragment) or none to fix (ICMP's does not cover
    /// the IP addresses).
    None,
    /// TCP's checksum field at this offset.
    Tcp(u16),
    /// UDP's checksum field at this offset (0 in it means "no checksum" and stays 0; on IPv6
    /// it is invalid, and the programs compute one before the rewrite: lb-ebpf's
    /// `csum::fill_udp6`).
    Udp(u16),
    /// ICMPv6's checksum field at this offset (an error's, which the programs translate): it
    /// covers the addresses by its pseudo-header, as TCP's does, and has no ports.
    Icmp6(u16),
    /// SCTP's CRC32c field at `off`, over a packet of `len` bytes (the IP payload). It covers
    /// the ports but neither addresses nor a pseudo-header. A field of 0 is taken as
    /// offloaded (CHECKSUM_PARTIAL with `csum_not_inet`: the device computes it over the final
    /// bytes) and left alone; a full CRC of exactly 0 is the one value that would be missed.
    Sctp { off: u16, len: u16 },
}

/// How a program context writes packet bytes and folds changes into checksum fields. Values
/// are as they stand in memory (network byte order).
pub trait Rewrite {
    fn load16(&self, off: usize) -> Option<u16>;
    fn load32(&self, off: usize) -> Option<u32>;
    /// Stores without touching a checksum field. `recompute`: the bytes are not accounted for
    /// by any inet checksum helper, so `skb->csum` (CHECKSUM_COMPLETE) must follow them.
    fn store32(&self, off: usize, new: u32, recompute: bool) -> Option<()>;
    fn store16(&self, off: usize, new: u16, recompute: bool) -> Option<()>;
    /// The IPv4 header checksum at `csum_off` after a word under it changed.
    fn ip_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()>;
    /// A TCP/UDP checksum (`udp`: a 0 stays 0, a computed 0 is sent as 0xffff) after a word
    /// under it changed; `pseudo` when the word is in the pseudo-header (an address), whose
    /// changes a CHECKSUM_PARTIAL seed and CHECKSUM_COMPLETE's `skb->csum` must follow.
    fn l4_csum(
        &self,
        csum_off: usize,
        old: u32,
        new: u32,
        size: Width,
        udp: bool,
        pseudo: bool,
    ) -> Option<()>;
    /// A checksum over plain data without a pseudo-header (ICMP's), after a word under it
    /// changed.
    fn plain_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()>;
}

/// The width of a changed word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    W16 = 2,
    W32 = 4,
}

/// IPv4 header offsets relative to the IP header.
pub const IP_TTL: usize = 8;
pub const IP_PROTO: usize = 9;
pub const IP_CSUM: usize = 10;
pub const IP_SADDR: usize = 12;
pub const IP_DADDR: usize = 16;

/// IPv6 header offsets relative to the IP header.
pub const IP6_NEXT: usize = 6;
pub const IP6_HOP_LIMIT: usize = 7;
pub const IP6_SADDR: usize = 8;
pub const IP6_DADDR: usize = 24;

/// Rewrites the address at `addr_off` (the source or destination field of the IP header at
/// `l3_off`) from `old` to `new`, a word at a time, with the IPv4 header checksum and the L4
/// checksum whose pseudo-header holds it. Checksums first, then the field: the order the
/// kernel's own NAT uses, and the one the model test checks. IPv6 has no header checksum: no
/// field of the packet compensates the address's change in the packet's sum, so `skb->csum`
/// (CHECKSUM_COMPLETE) follows the store itself (the L4 checksum's change, which the helper
/// folds in, is the other half).
#[inline(always)]
pub fn set_addr<C: Rewrite, A: Addr>(
    ctx: &C,
    l3_off: usize,
    l4: L4Sum,
    addr_off: usize,
    old: A,
    new: A,
) -> Option<()> {
    if old == new {
        return Some(());
    }
    for i in 0..A::WORDS {
        let (old, new) = (old.word(i), new.word(i));
        if old == new {
            continue;
        }
        if A::V4 {
            ctx.ip_csum(l3_off + IP_CSUM, old, new, Width::W32)?;
        }
        match l4 {
            L4Sum::Tcp(off) | L4Sum::Icmp6(off) => {
                ctx.l4_csum(off.into(), old, new, Width::W32, false, true)?
            }
            L4Sum::Udp(off) => ctx.l4_csum(off.into(), old, new, Width::W32, true, true)?,
            L4Sum::Sctp { .. } | L4Sum::None => {}
        }
        ctx.store32(addr_off + 4 * i, new, !A::V4)?;
    }
    Some(())
}

/// Rewrites the source and destination ports of the L4 header at `l4_off` from `old` to `new`
/// (each `(source, destination)`), with the L4 checksum. `L4Sum::None` means there is no L4
/// header: nothing happens. SCTP's CRC32c takes both ports in one update.
#[inline(always)]
pub fn set_ports<C: Rewrite>(
    ctx: &C,
    l4_off: usize,
    l4: L4Sum,
    old: (u16, u16),
    new: (u16, u16),
) -> Option<()> {
    if old == new {
        return Some(());
    }
    match l4 {
        L4Sum::None | L4Sum::Icmp6(_) => Some(()),
        L4Sum::Tcp(c) => {
            set_port(ctx, l4_off, c, false, old.0, new.0)?;
            set_port(ctx, l4_off + 2, c, false, old.1, new.1)
        }
        L4Sum::Udp(c) => {
            set_port(ctx, l4_off, c, true, old.0, new.0)?;
            set_port(ctx, l4_off + 2, c, true, old.1, new.1)
        }
        L4Sum::Sctp { off: crc_off, len } => {
            let crc_off = usize::from(crc_off);
            let field = ctx.load32(crc_off)?;
            let ports = |(s, d): (u16, u16)| {
                let (s, d) = (s.to_ne_bytes(), d.to_ne_bytes());
                [s[0], s[1], d[0], d[1]]
            };
            if field != 0 {
                let fixed = sctp_crc(
                    field,
                    len.into(),
                    u32::from_ne_bytes(ports(old)),
                    u32::from_ne_bytes(ports(new)),
                );
                ctx.store32(crc_off, fixed, true)?;
            }
            ctx.store32(l4_off, u32::from_ne_bytes(ports(new)), true)
        }
    }
}

/// The SCTP checksum field (as loaded) after the ports word went from `old` to `new`. Not
/// inlined: in a program it is one subprogram of a few thousand instructions, called from
/// every path, rather than a copy per path.
#[inline(never)]
fn sctp_crc(field: u32, len: u32, old: u32, new: u32) -> u32 {
    u32::from_ne_bytes(crc32c::sctp_ports_checksum_update(
        field.to_ne_bytes(),
        len,
        old.to_ne_bytes(),
        new.to_ne_bytes(),
    ))
}

/// One TCP or UDP port at `off` with the checksum at `csum`.
#[inline(always)]
fn set_port<C: Rewrite>(
    ctx: &C,
    off: usize,
    csum: u16,
    udp: bool,
    old: u16,
    new: u16,
) -> Option<()> {
    if old == new {
        return Some(());
    }
    // Without a checksum nothing compensates the port's change in the packet's sum, so
    // `skb->csum` must follow the store itself.
    if udp && ctx.load16(csum.into())? == 0 {
        return ctx.store16(off, new, true);
    }
    ctx.l4_csum(csum.into(), old.into(), new.into(), Width::W16, udp, false)?;
    ctx.store16(off, new, false)
}

/// The arithmetic XDP (and the host model) applies to a checksum field: what the kernel's
/// `bpf_l4_csum_replace` does on a full checksum, `BPF_F_MARK_MANGLED_0` included for UDP.
#[inline(always)]
pub fn updated_field(check: u16, old: u32, new: u32, size: Width, udp: bool) -> u16 {
    if udp && check == 0 {
        return 0;
    }
    let c = match size {
        Width::W32 => replace32(check, old, new),
        Width::W16 => replace16(check, old as u16, new as u16),
    };
    if udp && c == 0 { 0xffff } else { c }
}

#[cfg(test)]
mod tests {
    //! The TC contract, checked against a model of the kernel helpers for each `ip_summed`
    //! state (net/core/filter.c `bpf_skb_store_bytes`, `bpf_l3_csum_replace`,
    //! `bpf_l4_csum_replace`; net/core/utils.c `inet_proto_csum_replace4/2`). BPF_PROG_TEST_RUN
    //! cannot make CHECKSUM_COMPLETE skbs and nothing on this machine produces them, so this is
    //! where that state is proven.
    extern crate std;
    use std::vec::Vec;

    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Summed {
        /// The stack computed everything (or the receiver will verify): plain arithmetic.
        None,
        /// `skb->csum` is the one's complement sum of the IP packet (as the driver saw it).
        Complete,
        /// The L4 field holds the pseudo-header seed; the device sums the segment.
        Partial,
    }

    /// An IP packet (no Ethernet header, offsets from the IP header) in a model skb.
    struct Skb {
        data: core::cell::RefCell<Vec<u8>>,
        summed: Summed,
        csum: core::cell::Cell<u32>,
    }

    fn sum(data: &[u8]) -> u32 {
        let mut acc = 0u32;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                [c[0], c[1]]
            } else {
                [c[0], 0]
            };
            acc += u32::from(u16::from_ne_bytes(w));
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc
    }

    /// One's complement add of two folded sums (the kernel's csum_add, folded).
    fn add(a: u32, b: u32) -> u32 {
        u32::from(fold(a + b))
    }

    /// One's complement has two zeros; compare sums with 0xffff read as 0.
    fn norm(s: u32) -> u32 {
        if s == 0xffff { 0 } else { s }
    }

    impl Skb {
        fn word(&self, off: usize, size: Width) -> u32 {
            let d = self.data.borrow();
            match size {
                Width::W16 => u16::from_ne_bytes([d[off], d[off + 1]]).into(),
                Width::W32 => u32::from_ne_bytes([d[off], d[off + 1], d[off + 2], d[off + 3]]),
            }
        }
        fn put(&self, off: usize, bytes: &[u8]) {
            self.data.borrow_mut()[off..off + bytes.len()].copy_from_slice(bytes);
        }
        fn field(&self, off: usize) -> u16 {
            self.word(off, Width::W16) as u16
        }
        /// `skb->csum` follows a change of covered bytes (csum_sub old, csum_add new).
        fn follow(&self, old: u32, new: u32) {
            if self.summed == Summed::Complete {
                let c = add(add(self.csum.get(), halves(!old)), halves(new));
                self.csum.set(u32::from(fold(c)));
            }
        }
    }

    impl Rewrite for Skb {
        fn load16(&self, off: usize) -> Option<u16> {
            Some(self.field(off))
        }
        fn load32(&self, off: usize) -> Option<u32> {
            Some(self.word(off, Width::W32))
        }
        fn store32(&self, off: usize, new: u32, recompute: bool) -> Option<()> {
            if recompute {
                self.follow(self.word(off, Width::W32), new);
            }
            self.put(off, &new.to_ne_bytes());
            Some(())
        }
        fn store16(&self, off: usize, new: u16, recompute: bool) -> Option<()> {
            if recompute {
                self.follow(self.word(off, Width::W16), new.into());
            }
            self.put(off, &new.to_ne_bytes());
            Some(())
        }
        fn ip_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()> {
            // bpf_l3_csum_replace: csum_replace4/2 on the field, skb->csum untouched.
            let c = updated_field(self.field(csum_off), old, new, size, false);
            self.put(csum_off, &c.to_ne_bytes());
            Some(())
        }
        fn l4_csum(
            &self,
            csum_off: usize,
            old: u32,
            new: u32,
            size: Width,
            udp: bool,
            pseudo: bool,
        ) -> Option<()> {
            let check = self.field(csum_off);
            // BPF_F_MARK_MANGLED_0: a UDP packet without a checksum keeps none.
            if udp && check == 0 {
                return Some(());
            }
            let c = match self.summed {
                Summed::Partial if pseudo => {
                    // inet_proto_csum_replace*: the seed moves with the pseudo-header.
                    fold(u32::from(check) + halves(!old) + halves(new))
                }
                Summed::Partial => check,
                _ => {
                    let c = updated_field(check, old, new, size, false);
                    if self.summed == Summed::Complete && pseudo {
                        // skb->csum = ~csum_add(csum_sub(~skb->csum, from), to)
                        let s = add(add(!self.csum.get() & 0xffff, halves(!old)), halves(new));
                        self.csum.set(u32::from(!fold(s)));
                    }
                    c
                }
            };
            let c = if udp && c == 0 { 0xffff } else { c };
            self.put(csum_off, &c.to_ne_bytes());
            Some(())
        }
        fn plain_csum(&self, csum_off: usize, old: u32, new: u32, size: Width) -> Option<()> {
            // bpf_l4_csum_replace without the pseudo flag: field only.
            let c = updated_field(self.field(csum_off), old, new, size, false);
            self.put(csum_off, &c.to_ne_bytes());
            Some(())
        }
    }

    const TCP: u8 = 6;
    const UDP: u8 = 17;

    fn packet(proto: u8, payload: usize) -> Vec<u8> {
        let l4_len = if proto == TCP { 20 } else { 8 } + payload;
        let total = 20 + l4_len;
        let mut p = std::vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = proto;
        p[12..16].copy_from_slice(&[10, 10, 0, 2]);
        p[16..20].copy_from_slice(&[10, 99, 0, 10]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&8080u16.to_be_bytes());
        if proto == TCP {
            p[32] = 0x50;
        } else {
            p[24..26].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        for (i, b) in p[20 + if proto == TCP { 20 } else { 8 }..]
            .iter_mut()
            .enumerate()
        {
            *b = (i * 7 + 3) as u8;
        }
        let ip = !fold(sum(&p[..20]));
        p[10..12].copy_from_slice(&ip.to_ne_bytes());
        p
    }

    fn l4_off(proto: u8) -> u16 {
        if proto == TCP { 36 } else { 26 }
    }

    /// The full L4 checksum a receiver computes.
    fn full_l4(p: &[u8]) -> u16 {
        let proto = p[9];
        let mut pseudo = Vec::new();
        pseudo.extend(&p[12..20]);
        pseudo.extend([0, proto]);
        pseudo.extend(((p.len() - 20) as u16).to_be_bytes());
        segment_sum(&pseudo, &p[20..], usize::from(l4_off(proto)) - 20, proto)
    }

    /// The L4 checksum over `pseudo` and `seg`, with the checksum field at `at` of `seg` read
    /// as zero (RFC 768/9293; UDP's 0 is sent as 0xffff).
    fn segment_sum(pseudo: &[u8], seg: &[u8], at: usize, proto: u8) -> u16 {
        let mut seg = seg.to_vec();
        seg[at] = 0;
        seg[at + 1] = 0;
        let c = !fold(sum(pseudo) + sum(&seg));
        if proto == UDP && c == 0 { 0xffff } else { c }
    }

    /// `p` as an skb in state `summed`, its L4 checksum at `at` filled as a sender in that
    /// state leaves it: the pseudo-header seed for Partial (`seed`), the full sum otherwise.
    fn summed_skb(mut p: Vec<u8>, at: usize, summed: Summed, seed: u16, full: u16) -> Skb {
        let c = if summed == Summed::Partial {
            seed
        } else {
            full
        };
        p[at..at + 2].copy_from_slice(&c.to_ne_bytes());
        let csum = sum(&p);
        Skb {
            data: core::cell::RefCell::new(p),
            summed,
            csum: core::cell::Cell::new(csum),
        }
    }

    fn seed(p: &[u8]) -> u16 {
        let addr = |o: usize| u32::from_ne_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
        pseudo_seed(addr(12), addr(16), p[9], (p.len() - 20) as u16)
    }

    fn skb(proto: u8, summed: Summed, payload: usize) -> Skb {
        let p = packet(proto, payload);
        let (seed, full) = (seed(&p), full_l4(&p));
        summed_skb(p, usize::from(l4_off(proto)), summed, seed, full)
    }

    /// A DNAT and a SNAT as the programs do them: destination address and port, then source
    /// address and port.
    fn translate(s: &Skb, proto: u8) {
        let l4 = if proto == TCP {
            L4Sum::Tcp(l4_off(proto))
        } else {
            L4Sum::Udp(l4_off(proto))
        };
        let w32 = |o: usize| s.word(o, Width::W32);
        let w16 = |o: usize| s.word(o, Width::W16) as u16;
        let (d, sa, dp, sp) = (w32(16), w32(12), w16(22), w16(20));
        set_addr(s, 0, l4, IP_DADDR, d, u32::from_ne_bytes([10, 20, 0, 11])).unwrap();
        set_ports(s, 20, l4, (sp, dp), (sp, 80u16.to_be())).unwrap();
        set_addr(s, 0, l4, IP_SADDR, sa, u32::from_ne_bytes([10, 30, 0, 1])).unwrap();
        set_ports(
            s,
            20,
            l4,
            (sp, 80u16.to_be()),
            (61234u16.to_be(), 80u16.to_be()),
        )
        .unwrap();
    }

    #[test]
    fn tc_rewrites_are_exact_in_every_checksum_state() {
        for proto in [TCP, UDP] {
            for summed in [Summed::None, Summed::Complete, Summed::Partial] {
                for payload in [0, 1, 13, 100] {
                    let s = skb(proto, summed, payload);
                    translate(&s, proto);
                    let p = s.data.borrow().clone();
                    let what = std::format!("proto {proto} {summed:?} payload {payload}");
                    assert_eq!(fold(sum(&p[..20])), 0xffff, "{what}: IP checksum");
                    let at = usize::from(l4_off(proto));
                    let field = u16::from_ne_bytes([p[at], p[at + 1]]);
                    match summed {
                        Summed::Partial => assert_eq!(field, seed(&p), "{what}: seed"),
                        _ => assert_eq!(field, full_l4(&p), "{what}: L4 checksum"),
                    }
                    if summed == Summed::Complete {
                        assert_eq!(norm(s.csum.get()), norm(sum(&p)), "{what}: skb->csum");
                    }
                }
            }
        }
    }

    #[test]
    fn udp_without_a_checksum_keeps_none() {
        for summed in [Summed::None, Summed::Complete] {
            let s = skb(UDP, summed, 10);
            s.put(26, &[0, 0]);
            s.csum.set(sum(&s.data.borrow()));
            translate(&s, UDP);
            let p = s.data.borrow().clone();
            assert_eq!(&p[26..28], &[0, 0]);
            if summed == Summed::Complete {
                assert_eq!(norm(s.csum.get()), norm(sum(&p)), "skb->csum");
            }
        }
    }

    #[test]
    fn recompute_on_inet_fields_would_count_twice() {
        // The defect this module's contract exists against: the same DNAT with the stores
        // also recomputing skb->csum leaves CHECKSUM_COMPLETE wrong.
        struct Twice(Skb);
        impl Rewrite for Twice {
            fn load16(&self, off: usize) -> Option<u16> {
                self.0.load16(off)
            }
            fn load32(&self, off: usize) -> Option<u32> {
                self.0.load32(off)
            }
            fn store32(&self, off: usize, new: u32, _: bool) -> Option<()> {
                self.0.store32(off, new, true)
            }
            fn store16(&self, off: usize, new: u16, _: bool) -> Option<()> {
                self.0.store16(off, new, true)
            }
            fn ip_csum(&self, o: usize, a: u32, b: u32, w: Width) -> Option<()> {
                self.0.ip_csum(o, a, b, w)
            }
            fn l4_csum(&self, o: usize, a: u32, b: u32, w: Width, u: bool, p: bool) -> Option<()> {
                self.0.l4_csum(o, a, b, w, u, p)
            }
            fn plain_csum(&self, o: usize, a: u32, b: u32, w: Width) -> Option<()> {
                self.0.plain_csum(o, a, b, w)
            }
        }
        let t = Twice(skb(TCP, Summed::Complete, 5));
        let l4 = L4Sum::Tcp(36);
        let d = t.0.word(16, Width::W32);
        set_addr(&t, 0, l4, IP_DADDR, d, u32::from_ne_bytes([10, 20, 0, 11])).unwrap();
        assert_ne!(norm(t.0.csum.get()), norm(sum(&t.0.data.borrow())));
    }

    /// An IPv6 packet (40-byte header, no extension headers) with a TCP or UDP segment whose
    /// checksum field is as `summed` has it, in a model skb.
    fn skb6(proto: u8, summed: Summed, payload: usize) -> Skb {
        let hdr = if proto == TCP { 20 } else { 8 };
        let l4_len = hdr + payload;
        let mut p = std::vec![0u8; 40 + l4_len];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        p[6] = proto;
        p[7] = 64;
        p[8..24].copy_from_slice(&[0xfd, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p[24..40].copy_from_slice(&[0xfd, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        p[40..42].copy_from_slice(&40000u16.to_be_bytes());
        p[42..44].copy_from_slice(&8080u16.to_be_bytes());
        if proto == TCP {
            p[52] = 0x50;
        } else {
            p[44..46].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        for (i, b) in p[40 + hdr..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let (seed, full) = (seed6(&p), full_l4_6(&p));
        summed_skb(p, l4_off6(proto), summed, seed, full)
    }

    fn l4_off6(proto: u8) -> usize {
        if proto == TCP { 56 } else { 46 }
    }

    fn addr6(p: &[u8], off: usize) -> [u32; 4] {
        core::array::from_fn(|i| {
            let o = off + 4 * i;
            u32::from_ne_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]])
        })
    }

    fn seed6(p: &[u8]) -> u16 {
        pseudo_seed6(&addr6(p, 8), &addr6(p, 24), p[6], (p.len() - 40) as u32)
    }

    /// The full L4 checksum a receiver computes, from RFC 8200's pseudo-header written out
    /// byte by byte (not through [`pseudo_seed6`]).
    fn full_l4_6(p: &[u8]) -> u16 {
        let proto = p[6];
        let mut pseudo = Vec::new();
        pseudo.extend(&p[8..40]);
        pseudo.extend(((p.len() - 40) as u32).to_be_bytes());
        pseudo.extend([0, 0, 0, proto]);
        segment_sum(&pseudo, &p[40..], l4_off6(proto) - 40, proto)
    }

    #[test]
    fn ipv6_rewrites_are_exact_in_every_checksum_state() {
        // DNAT to a backend in another /64 (every word differs but the first), then SNAT of
        // the source (one word differs), each with its ports.
        let backend: [u32; 4] = addr6(
            &[0xfd, 0x20, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b],
            0,
        );
        let node: [u32; 4] = addr6(&[0xfd, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 0);
        for proto in [TCP, UDP] {
            for summed in [Summed::None, Summed::Complete, Summed::Partial] {
                for payload in [0, 1, 13, 100] {
                    let s = skb6(proto, summed, payload);
                    let at = l4_off6(proto);
                    let l4 = if proto == TCP {
                        L4Sum::Tcp(at as u16)
                    } else {
                        L4Sum::Udp(at as u16)
                    };
                    let (sa, da) = (addr6(&s.data.borrow(), 8), addr6(&s.data.borrow(), 24));
                    let w16 = |o: usize| s.word(o, Width::W16) as u16;
                    let (sp, dp) = (w16(40), w16(42));
                    set_addr(&s, 0, l4, IP6_DADDR, da, backend).unwrap();
                    set_ports(&s, 40, l4, (sp, dp), (sp, 80u16.to_be())).unwrap();
                    set_addr(&s, 0, l4, IP6_SADDR, sa, node).unwrap();
                    let p = s.data.borrow().clone();
                    let what = std::format!("proto {proto} {summed:?} payload {payload}");
                    assert_eq!((addr6(&p, 8), addr6(&p, 24)), (node, backend), "{what}");
                    let field = u16::from_ne_bytes([p[at], p[at + 1]]);
                    match summed {
                        Summed::Partial => assert_eq!(field, seed6(&p), "{what}: seed"),
                        _ => assert_eq!(field, full_l4_6(&p), "{what}: L4 checksum"),
                    }
                    if summed == Summed::Complete {
                        assert_eq!(norm(s.csum.get()), norm(sum(&p)), "{what}: skb->csum");
                    }
                }
            }
        }
    }
}
