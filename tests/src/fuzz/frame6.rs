//! IPv6 frames as the programs' parser would claim them: layout through extension headers,
//! checksums with the pseudo-header, what a translation may change.
use super::*;

pub(super) const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];
pub(super) const IPV6_HLEN: usize = 40;
/// Offsets in the IPv6 header.
pub(super) const IP6_PAYLOAD: usize = 4;
pub(super) const IP6_NEXT: usize = 6;
pub const IP6_ADDRS: Range<usize> = 8..40;
/// Extension headers a reading walks at most: more than the programs walk
/// (`IPV6_MAX_EXT_HEADERS`), so that wherever their walk ends, this one ends there too.
pub(super) const EXT_WALK_MAX: usize = 16;

/// Where a packet stands in its datagram (IPv6: by its fragment header; IPv4: by its fragment
/// offset and MF flag), with the datagram's identification (IPv4's 16 bits widened), as the
/// programs' parser reads it: offset 0 and no more fragments is whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frag {
    Whole,
    /// Offset 0, more to come: the L4 header is here, its checksum covers the whole datagram.
    First(u32),
    /// No L4 header.
    Later(u32),
}

/// An IPv6 packet as its headers claim it ([`Ipv4Layout`]'s twin), at any offset of a frame:
/// the packet itself, or the one an ICMPv6 error quotes.
#[derive(Clone, Copy, Debug)]
pub struct Ipv6Layout {
    /// Frame offset of the IPv6 header.
    pub ip: usize,
    /// Payload length.
    pub payload: usize,
    /// Frame offset of the upper-layer header (of a later fragment's data).
    pub l4: usize,
    pub proto: u8,
    pub frag: Frag,
}

/// `frame` as an IPv6 frame (ethertype IPv6, version 6, the fixed header and every extension
/// header the parser walks present), or `None`.
pub fn ipv6(frame: &[u8]) -> Option<Ipv6Layout> {
    if frame.get(12..14)? != ETH_P_IPV6 {
        return None;
    }
    ipv6_at(frame, ETH_HLEN)
}

/// The IPv6 packet at `ip`, its extension headers walked as the programs' parser walks them
/// (lb-ebpf `parse::extensions`: hop-by-hop, routing, destination options, AH and fragment
/// headers skipped by their length fields; a later fragment's walk ends at its fragment
/// header), or `None` when the headers are not all in the frame.
pub(super) fn ipv6_at(frame: &[u8], ip: usize) -> Option<Ipv6Layout> {
    let h = frame.get(ip..ip + IPV6_HLEN)?;
    if h[0] >> 4 != 6 {
        return None;
    }
    let layout = |l4, proto, frag| Ipv6Layout {
        ip,
        payload: be16(h, IP6_PAYLOAD).into(),
        l4,
        proto,
        frag,
    };
    let (mut off, mut next, mut frag) = (ip + IPV6_HLEN, h[IP6_NEXT], Frag::Whole);
    for _ in 0..EXT_WALK_MAX {
        if !matches!(next, 0 | 43 | 44 | 51 | 60) {
            return Some(layout(off, next, frag));
        }
        let e = frame.get(off..off + 8)?;
        let this = next;
        next = e[0];
        off += match this {
            51 => (usize::from(e[1]) + 2) * 4,
            44 => 8,
            _ => (usize::from(e[1]) + 1) * 8,
        };
        if this == 44 {
            let id = u32::from_be_bytes([e[4], e[5], e[6], e[7]]);
            frag = match (be16(e, 2) & 0xfff8, be16(e, 2) & 1 != 0) {
                (0, false) => Frag::Whole,
                (0, true) => Frag::First(id),
                _ => Frag::Later(id),
            };
            if let Frag::Later(_) = frag {
                return Some(layout(off, next, frag));
            }
        }
    }
    None
}

impl Ipv6Layout {
    /// Frame offset of the end of the datagram as the payload length claims it.
    pub fn end(&self) -> usize {
        self.ip + IPV6_HLEN + self.payload
    }

    /// The upper-layer segment as the payload length claims it, when the frame holds it all.
    fn segment(&self, frame: &[u8]) -> Option<Range<usize>> {
        (self.l4 <= self.end() && self.end() <= frame.len()).then(|| self.l4..self.end())
    }

    /// The packet an ICMPv6 error quotes after its 8-byte header, if this is one that quotes
    /// an IPv6 packet whose headers are all in the frame.
    pub fn quote(&self, frame: &[u8]) -> Option<Ipv6Layout> {
        let error = self.proto == IPPROTO_ICMPV6
            && !matches!(self.frag, Frag::Later(_))
            && (1..=4).contains(frame.get(self.l4)?);
        if !error {
            return None;
        }
        ipv6_at(frame, self.l4 + ICMP_QUOTE)
    }
}

/// The address at `at` of `frame`.
pub fn addr6_at(frame: &[u8], at: usize) -> Ipv6Addr {
    Ipv6Addr::from(<[u8; 16]>::try_from(&frame[at..at + 16]).unwrap())
}

/// Whether any of `addrs` appears anywhere in `frame` ([`mentions`] of IPv6).
pub fn mentions6(frame: &[u8], addrs: &[Ipv6Addr]) -> bool {
    frame
        .windows(16)
        .any(|w| addrs.iter().any(|a| a.octets() == w))
}

/// Whether `frame` is an IPv6 frame whose lengths hold against what arrived: the payload within
/// the frame, the extension headers within the payload, and (unless it is a later fragment)
/// a whole TCP, UDP or SCTP header or ICMPv6 error within it ([`lengths_hold`] of IPv6).
pub fn lengths_hold6(frame: &[u8]) -> bool {
    let Some(l) = ipv6(frame) else { return false };
    let Some(seg) = l.segment(frame) else {
        return false;
    };
    matches!(l.frag, Frag::Later(_))
        || match l.proto {
            IPPROTO_TCP => seg.len() >= 20,
            IPPROTO_UDP => seg.len() >= 8,
            IPPROTO_SCTP => seg.len() >= 12,
            IPPROTO_ICMPV6 => seg.len() >= ICMP_QUOTE + IPV6_HLEN,
            _ => false,
        }
}

/// The pseudo-header sum (RFC 8200 8.1) of `frame`'s upper-layer segment `seg`, folded, not
/// inverted: what a CHECKSUM_PARTIAL sender leaves in the field.
pub(super) fn pseudo_sum6(frame: &[u8], l: &Ipv6Layout, seg: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40);
    pseudo.extend(&frame[l.ip + IP6_ADDRS.start..l.ip + IP6_ADDRS.end]);
    pseudo.extend((seg.len() as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, l.proto]);
    !checksum(&pseudo)
}

/// Where the upper-layer checksum field sits (TCP, UDP, SCTP, ICMPv6).
pub(super) fn l4_csum_field6(proto: u8) -> Option<Range<usize>> {
    match proto {
        IPPROTO_ICMPV6 => Some(2..4),
        p => l4_csum_field(p),
    }
}

/// The name [`checksums6`] gives a UDP checksum of 0, which IPv6 does not allow (RFC 8200
/// 8.1): a translated datagram must leave with a computed one (`UDP`, nonzero).
pub const UDP6_ZERO: &str = "UDP checksum 0";

/// Every checksum of an IPv6 frame its claimed layout lets a receiver check, by name, and
/// whether it holds ([`checksums`] of IPv6: a translation keeps every one that held). IPv6
/// has no header checksum. A fragment has none to check: a later one carries no L4 header,
/// a first one's L4 checksum covers the whole datagram. A UDP checksum of 0 ([`UDP6_ZERO`])
/// and an SCTP CRC of 0 (offloaded) are their own entries, which "hold" as they are.
pub fn checksums6(frame: &[u8]) -> Vec<(&'static str, bool)> {
    let mut sums = Vec::new();
    let Some(l) = ipv6(frame).filter(|l| l.frag == Frag::Whole) else {
        return sums;
    };
    let Some(seg) = l.segment(frame) else {
        return sums;
    };
    let seg = &frame[seg];
    let holds = || checksum_with(seg, pseudo_sum6(frame, &l, seg)) == 0;
    match l.proto {
        IPPROTO_TCP if seg.len() >= 18 => sums.push(("TCP", holds())),
        IPPROTO_UDP if seg.len() >= 8 => sums.push(if be16(seg, 6) == 0 {
            (UDP6_ZERO, true)
        } else {
            ("UDP", holds())
        }),
        IPPROTO_SCTP if seg.len() >= 12 => sums.push(if seg[8..12] == [0; 4] {
            ("SCTP CRC32c 0 (offloaded)", true)
        } else {
            ("SCTP CRC32c", sctp_checksum(seg) == seg[8..12])
        }),
        IPPROTO_ICMPV6 if seg.len() >= 4 => sums.push(("ICMPv6", holds())),
        _ => {}
    }
    sums
}

/// The Internet checksum of `data` on top of the folded sum `seed`.
pub(super) fn checksum_with(data: &[u8], seed: u16) -> u16 {
    let mut with = Vec::with_capacity(data.len() + 2);
    with.extend(seed.to_be_bytes());
    with.extend(data);
    checksum(&with)
}

/// Makes every checksum [`checksums6`] can check hold, by the layout the frame claims
/// ([`fix_checksums`] of IPv6). A UDP checksum of 0 and an SCTP CRC of 0 stay 0.
pub fn fix_checksums6(frame: &mut [u8]) {
    let Some(l) = ipv6(frame).filter(|l| l.frag == Frag::Whole) else {
        return;
    };
    let Some(seg) = l.segment(frame) else { return };
    let Some(f) = l4_csum_field6(l.proto).filter(|f| f.end <= seg.len()) else {
        return;
    };
    let at = seg.start + f.start..seg.start + f.end;
    let zero = frame[at.clone()].iter().all(|b| *b == 0);
    if zero && matches!(l.proto, IPPROTO_UDP | IPPROTO_SCTP) {
        return;
    }
    if l.proto == IPPROTO_SCTP {
        let crc = sctp_checksum(&frame[seg]);
        frame[at].copy_from_slice(&crc);
    } else {
        let c = l4_checksum6(
            addr6_at(frame, l.ip + IP6_ADDRS.start),
            addr6_at(frame, l.ip + IP6_ADDRS.start + 16),
            l.proto,
            &frame[seg],
        );
        frame[at].copy_from_slice(&c.to_be_bytes());
    }
}

/// Which bytes of an IPv6 frame a translation may change ([`rewritable`] of IPv6): the
/// addresses; unless it is a later fragment, the L4 ports and checksum field (TCP, UDP,
/// SCTP); in an ICMPv6 error, its checksum and the quoted packet's addresses and ports (not
/// the quote's L4 checksum, which no receiver checks and the programs leave as it is).
pub fn rewritable6(frame: &[u8]) -> Vec<bool> {
    let mut mask = vec![false; frame.len()];
    let Some(l) = ipv6(frame) else { return mask };
    allow(&mut mask, l.ip + IP6_ADDRS.start..l.ip + IP6_ADDRS.end);
    if let Frag::Later(_) = l.frag {
        return mask;
    }
    if let Some(f) = l4_csum_field6(l.proto) {
        allow(&mut mask, l.l4 + f.start..l.l4 + f.end);
    }
    if l.proto != IPPROTO_ICMPV6 {
        allow(&mut mask, l.l4..l.l4 + 4);
    } else if let Some(q) = l.quote(frame) {
        allow(&mut mask, q.ip + IP6_ADDRS.start..q.ip + IP6_ADDRS.end);
        if !matches!(q.frag, Frag::Later(_)) {
            allow(&mut mask, q.l4..q.l4 + 4);
        }
    }
    mask
}

/// The first offset at which `output` differs from `input` where a translation of an IPv6
/// frame has no business (see [`rewritable6`]), or a length change (`min(len)`).
pub fn foreign_change6(input: &[u8], output: &[u8]) -> Option<usize> {
    foreign_change_by(rewritable6, input, output)
}

/// The folded pseudo-header sum of an IPv6 frame's TCP or UDP segment, which a
/// CHECKSUM_PARTIAL sender leaves in the checksum field for the device (XDP cannot tell it
/// from a full checksum: `xdp_deferred`), or `None` when there is no such segment.
pub fn pseudo_seed6(frame: &[u8]) -> Option<u16> {
    let l = ipv6(frame).filter(|l| matches!(l.proto, IPPROTO_TCP | IPPROTO_UDP))?;
    let seg = l.segment(frame)?;
    Some(pseudo_sum6(frame, &l, &frame[seg]))
}

/// The offset and width of the L4 checksum field of an IPv6 frame's (whole or first)
/// upper-layer header, by its claimed layout, when the frame holds it.
pub fn l4_csum_at6(frame: &[u8]) -> Option<Range<usize>> {
    let l = ipv6(frame).filter(|l| !matches!(l.frag, Frag::Later(_)))?;
    let f = l4_csum_field6(l.proto)?;
    let at = l.l4 + f.start..l.l4 + f.end;
    (at.end <= frame.len()).then_some(at)
}
