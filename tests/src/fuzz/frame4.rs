//! IPv4 frames as the programs' parser would claim them: layout, checksums computed as a
//! receiver checks them, what a translation may change, and the mutations.
use super::*;

pub const ETH_HLEN: usize = 14;
pub(super) const ETH_P_IP: [u8; 2] = [0x08, 0x00];
/// Offsets in the IPv4 header.
pub(super) const IP_TOTAL: usize = 2;
pub(super) const IP_FRAG: usize = 6;
pub(super) const IP_PROTO: usize = 9;
pub(super) const IP_CSUM: usize = 10;
pub(super) const IP_ADDRS: Range<usize> = 12..20;
/// An ICMP error's quote starts after its 8-byte header.
pub(super) const ICMP_QUOTE: usize = 8;

/// An IPv4 frame as its headers claim it: what the programs' parser reads before it checks the
/// claims against the frame.
#[derive(Clone, Copy, Debug)]
pub struct Ipv4Layout {
    /// Header length (IHL × 4), at least 20.
    pub ihl: usize,
    /// Total length.
    pub total: usize,
    pub proto: u8,
    /// A later fragment (offset ≠ 0): no L4 header.
    pub later: bool,
}

/// `frame` as an IPv4 frame (ethertype IPv4, version 4, IHL ≥ 5, the fixed header present),
/// or `None`.
pub fn ipv4(frame: &[u8]) -> Option<Ipv4Layout> {
    if frame.len() < ETH_HLEN + 20 || frame[12..14] != ETH_P_IP {
        return None;
    }
    let ip = &frame[ETH_HLEN..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || ihl < 20 {
        return None;
    }
    Some(Ipv4Layout {
        ihl,
        total: be16(ip, IP_TOTAL).into(),
        proto: ip[IP_PROTO],
        later: be16(ip, IP_FRAG) & 0x1fff != 0,
    })
}

impl Ipv4Layout {
    /// Frame offset of the L4 header.
    pub fn l4(&self) -> usize {
        ETH_HLEN + self.ihl
    }

    /// The L4 segment as the total length claims it, when the frame holds all of it.
    fn segment(&self) -> Option<Range<usize>> {
        (self.total >= self.ihl).then(|| self.l4()..ETH_HLEN + self.total)
    }
}

/// Whether `frame` is an IPv4 frame whose lengths hold against what arrived: the header within
/// the total length, the total length within the frame, and (unless it is a later fragment)
/// a whole TCP, UDP, SCTP or ICMP header within the total length. A program's parser passes
/// any other frame (`Malformed`) before it could rewrite anything.
pub fn lengths_hold(frame: &[u8]) -> bool {
    let Some(l) = ipv4(frame) else { return false };
    if l.total < l.ihl || ETH_HLEN + l.total > frame.len() {
        return false;
    }
    let seg = l.total - l.ihl;
    l.later
        || match l.proto {
            IPPROTO_TCP => seg >= 20,
            IPPROTO_UDP | IPPROTO_ICMP => seg >= 8,
            IPPROTO_SCTP => seg >= 12,
            _ => false,
        }
}

pub(super) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Where a TCP/UDP/SCTP header keeps its checksum, and the smallest segment that holds it.
pub(super) fn l4_csum_field(proto: u8) -> Option<Range<usize>> {
    match proto {
        IPPROTO_TCP => Some(16..18),
        IPPROTO_UDP => Some(6..8),
        IPPROTO_SCTP => Some(8..12),
        _ => None,
    }
}

/// Whether the TCP/UDP checksum of the IP packet `ip` (header as claimed, segment within it)
/// holds as a receiver checks it: the one's complement sum over pseudo-header and segment,
/// stored checksum included, is all ones. (Both encodings of zero pass, as they do in the
/// kernel; `packet::verify` also wants the canonical one.)
pub(super) fn pseudo_sum_holds(ip: &[u8], seg: &[u8]) -> bool {
    let mut data = Vec::with_capacity(12 + seg.len());
    data.extend(&ip[IP_ADDRS]);
    data.extend([0, ip[IP_PROTO]]);
    data.extend((seg.len() as u16).to_be_bytes());
    data.extend(seg);
    checksum(&data) == 0
}

/// Every checksum of `frame` that its claimed layout lets a receiver check, by name, and
/// whether it holds. A translation must keep every one that held: the list of a translated
/// frame has the same names (a translation changes no length or protocol), and a name whose
/// check held before must hold after. A UDP checksum of 0 ("none") and an SCTP CRC of 0
/// (offloaded) are their own entries, which hold only while the field stays 0.
pub fn checksums(frame: &[u8]) -> Vec<(&'static str, bool)> {
    let mut sums = Vec::new();
    let Some(l) = ipv4(frame) else { return sums };
    let ip = &frame[ETH_HLEN..];
    if l.ihl <= ip.len() {
        sums.push(("IPv4 header", checksum(&ip[..l.ihl]) == 0));
    }
    let Some(seg) = l.segment().filter(|s| s.end <= frame.len()) else {
        return sums;
    };
    if l.later {
        return sums;
    }
    let seg = &frame[seg];
    match l.proto {
        IPPROTO_TCP if seg.len() >= 18 => sums.push(("TCP", pseudo_sum_holds(ip, seg))),
        IPPROTO_UDP if seg.len() >= 8 => sums.push(if be16(seg, 6) == 0 {
            ("UDP checksum 0 (none)", true)
        } else {
            ("UDP", pseudo_sum_holds(ip, seg))
        }),
        IPPROTO_SCTP if seg.len() >= 12 => sums.push(if seg[8..12] == [0; 4] {
            ("SCTP CRC32c 0 (offloaded)", true)
        } else {
            ("SCTP CRC32c", sctp_checksum(seg) == seg[8..12])
        }),
        IPPROTO_ICMP if seg.len() >= ICMP_QUOTE => {
            sums.push(("ICMP", checksum(seg) == 0));
            if let Some(q) = quoted_header(seg) {
                sums.push(("quoted IPv4 header", checksum(q) == 0));
            }
        }
        _ => {}
    }
    sums
}

/// The IPv4 header an ICMP message's body quotes, if the segment holds all of it.
pub(super) fn quoted_header(seg: &[u8]) -> Option<&[u8]> {
    let q = seg.get(ICMP_QUOTE..)?;
    let qihl = usize::from(q.first()? & 0x0f) * 4;
    (q[0] >> 4 == 4 && qihl >= 20 && qihl <= q.len()).then(|| &q[..qihl])
}

/// Makes every checksum `checksums` can check hold, by the layout the frame claims (lies
/// included): after a structural mutation, this is what a sender that believes its own
/// headers would have sent. A UDP checksum of 0 and an SCTP CRC of 0 stay 0.
pub fn fix_checksums(frame: &mut [u8]) {
    let Some(l) = ipv4(frame) else { return };
    if l.l4() <= frame.len() {
        frame[ETH_HLEN + IP_CSUM..ETH_HLEN + IP_CSUM + 2].fill(0);
        let c = checksum(&frame[ETH_HLEN..l.l4()]);
        frame[ETH_HLEN + IP_CSUM..ETH_HLEN + IP_CSUM + 2].copy_from_slice(&c.to_be_bytes());
    }
    let Some(seg) = l.segment().filter(|s| s.end <= frame.len()) else {
        return;
    };
    if l.later {
        return;
    }
    let len = seg.len();
    match l.proto {
        IPPROTO_TCP if len >= 18 => {
            let c = l4_checksum(&frame[ETH_HLEN..]);
            frame[seg.start + 16..seg.start + 18].copy_from_slice(&c.to_be_bytes());
        }
        IPPROTO_UDP if len >= 8 => {
            let at = seg.start + 6..seg.start + 8;
            if frame[at.clone()] != [0, 0] {
                let c = l4_checksum(&frame[ETH_HLEN..]);
                frame[at].copy_from_slice(&c.to_be_bytes());
            }
        }
        IPPROTO_SCTP if len >= 12 => {
            let at = seg.start + 8..seg.start + 12;
            if frame[at.clone()] != [0; 4] {
                let crc = sctp_checksum(&frame[seg]);
                frame[at].copy_from_slice(&crc);
            }
        }
        IPPROTO_ICMP if len >= ICMP_QUOTE => {
            let q = seg.start + ICMP_QUOTE;
            if let Some(qihl) = quoted_header(&frame[seg.clone()]).map(<[u8]>::len) {
                frame[q + IP_CSUM..q + IP_CSUM + 2].fill(0);
                let c = checksum(&frame[q..q + qihl]);
                frame[q + IP_CSUM..q + IP_CSUM + 2].copy_from_slice(&c.to_be_bytes());
            }
            frame[seg.start + 2..seg.start + 4].fill(0);
            let c = checksum(&frame[seg.clone()]);
            frame[seg.start + 2..seg.start + 4].copy_from_slice(&c.to_be_bytes());
        }
        _ => {}
    }
}

/// Which bytes of `frame` a translation may change: the IPv4 addresses and header checksum;
/// unless it is a later fragment, the L4 ports and checksum (TCP, UDP, SCTP); in an ICMP
/// message, its checksum and the quoted packet's addresses, header checksum and ports. Offsets
/// follow the claimed IHLs, as the programs' do.
pub fn rewritable(frame: &[u8]) -> Vec<bool> {
    let mut mask = vec![false; frame.len()];
    let Some(l) = ipv4(frame) else { return mask };
    allow(&mut mask, ETH_HLEN + IP_CSUM..ETH_HLEN + IP_ADDRS.end);
    if l.later {
        return mask;
    }
    let l4 = l.l4();
    if let Some(f) = l4_csum_field(l.proto) {
        allow(&mut mask, l4..l4 + 4);
        allow(&mut mask, l4 + f.start..l4 + f.end);
    } else if l.proto == IPPROTO_ICMP {
        allow(&mut mask, l4 + 2..l4 + 4);
        let q = l4 + ICMP_QUOTE;
        if let Some(b) = frame.get(q) {
            let qihl = usize::from(b & 0x0f) * 4;
            allow(&mut mask, q + IP_CSUM..q + IP_ADDRS.end);
            allow(&mut mask, q + qihl..q + qihl + 4);
        }
    }
    mask
}

/// Marks `r` (as far as the frame goes) as bytes a translation may change.
pub(super) fn allow(mask: &mut [bool], r: Range<usize>) {
    for b in mask.iter_mut().take(r.end).skip(r.start) {
        *b = true;
    }
}

/// The first offset at which `output` differs from `input` where a translation has no business
/// (see [`rewritable`]), or a length change (`min(len)`).
pub fn foreign_change(input: &[u8], output: &[u8]) -> Option<usize> {
    foreign_change_by(rewritable, input, output)
}

/// [`foreign_change`] by the mask of a family's bytes a translation may change (`rewritable`,
/// `rewritable6`).
pub(super) fn foreign_change_by(
    mask_of: fn(&[u8]) -> Vec<bool>,
    input: &[u8],
    output: &[u8],
) -> Option<usize> {
    if input.len() != output.len() {
        return Some(input.len().min(output.len()));
    }
    let mask = mask_of(input);
    (0..input.len()).find(|&i| input[i] != output[i] && !mask[i])
}

/// What a mutation does to a frame. Structural ones change what the headers claim or where
/// they are; a valid-checksum case then has its checksums fixed up (so only the lie itself is
/// wrong), a garbage case keeps them as they fall. `ByteFlips` and `ChecksumGarbage` are
/// garbage by nature and come after any fix-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mutation {
    /// Cut at a random length (mostly inside the headers, sometimes under 14 bytes).
    Truncate,
    /// IHL set to any of 0..=15 (below 5, above what is there).
    IhlLie,
    /// Total length bigger or smaller than the frame, or below the header length.
    TotalLengthLie,
    /// 4..=40 bytes of IP options inserted after the header, IHL and total length following.
    Options,
    /// MF, DF, the reserved bit, fragment offsets.
    FragmentBits,
    /// UDP length field set to a lie.
    UdpLengthLie,
    /// TCP data offset set to a lie.
    TcpDataOffset,
    /// TCP flags set to a random combination.
    TcpFlags,
    /// IP protocol set to another (ICMP, TCP, UDP, SCTP, IPv6-ICMP, GRE, ESP, random).
    Protocol,
    /// IP version set to something else.
    Version,
    /// Bytes after what the IP header claims (Ethernet padding).
    Trailer,
    /// Ethertype set to ARP, IPv6, VLAN, MPLS, random.
    Ethertype,
    /// An 802.1Q (or 802.1ad + 802.1Q) tag inserted before the ethertype.
    VlanTag,
    /// 1..=4 random bytes changed.
    ByteFlips,
    /// A checksum field set to 0, 0xffff, a random value or the CHECKSUM_PARTIAL seed.
    ChecksumGarbage,
}

impl Mutation {
    pub const STRUCTURAL: [Mutation; 13] = [
        Mutation::Truncate,
        Mutation::IhlLie,
        Mutation::TotalLengthLie,
        Mutation::Options,
        Mutation::FragmentBits,
        Mutation::UdpLengthLie,
        Mutation::TcpDataOffset,
        Mutation::TcpFlags,
        Mutation::Protocol,
        Mutation::Version,
        Mutation::Trailer,
        Mutation::Ethertype,
        Mutation::VlanTag,
    ];
    pub const GARBAGE: [Mutation; 2] = [Mutation::ByteFlips, Mutation::ChecksumGarbage];

    /// Applies the mutation; one that does not fit the frame (a UDP lie on TCP, say) leaves it
    /// as it is.
    pub fn apply(self, rng: &mut Rng, frame: &mut Vec<u8>) {
        let len = frame.len();
        let l = ipv4(frame);
        let ip = ETH_HLEN;
        match self {
            Mutation::Truncate if len > 0 => {
                let cut = match rng.below(20) {
                    0 => rng.below(ETH_HLEN.min(len)),
                    _ if len <= ETH_HLEN => rng.below(len),
                    1..=6 => rng.below(len),
                    _ => rng.range(ETH_HLEN, len.min(ETH_HLEN + 100)),
                };
                frame.truncate(cut);
            }
            Mutation::IhlLie | Mutation::Version if len > ip => {
                let b = &mut frame[ip];
                *b = if self == Mutation::IhlLie {
                    (*b & 0xf0) | rng.below(16) as u8
                } else {
                    ((rng.below(16) as u8) << 4) | (*b & 0x0f)
                };
            }
            Mutation::TotalLengthLie if len >= ip + IP_TOTAL + 2 => {
                let here = len - ip;
                let ihl = usize::from(frame[ip] & 0x0f) * 4;
                let lie = match rng.below(6) {
                    0 => rng.u16().into(),
                    1 => here + rng.range(1, 17),
                    2 => here.saturating_sub(rng.range(1, 17)),
                    3 => ihl,
                    4 => ihl.saturating_sub(rng.range(1, 5)),
                    _ => rng.below(20),
                };
                frame[ip + IP_TOTAL..ip + IP_TOTAL + 2]
                    .copy_from_slice(&(lie as u16).to_be_bytes());
            }
            Mutation::Options if len > ip => {
                let ihl = usize::from(frame[ip] & 0x0f) * 4;
                if ihl >= 60 || ip + ihl > len {
                    return;
                }
                let words = rng.range(1, (60 - ihl) / 4 + 1);
                let opts: Vec<u8> = match rng.below(3) {
                    // NOPs and an end of options.
                    0 => (0..words * 4)
                        .map(|i| u8::from(i + 1 != words * 4))
                        .collect(),
                    // Router alert (RFC 2113), then NOPs.
                    1 => [148, 4, 0, 0]
                        .into_iter()
                        .chain(std::iter::repeat_n(1, words * 4 - 4))
                        .collect(),
                    _ => rng.bytes(words * 4),
                };
                frame.splice(ip + ihl..ip + ihl, opts);
                frame[ip] = (frame[ip] & 0xf0) | ((ihl / 4 + words) as u8);
                if len >= ip + IP_TOTAL + 2 {
                    let total = be16(frame, ip + IP_TOTAL).wrapping_add(words as u16 * 4);
                    frame[ip + IP_TOTAL..ip + IP_TOTAL + 2].copy_from_slice(&total.to_be_bytes());
                }
            }
            Mutation::FragmentBits if len >= ip + IP_FRAG + 2 => {
                let offset = rng.range(1, 0x2000) as u16;
                let frag = match rng.below(6) {
                    0 => 0x2000,
                    1 => 0x2000 | offset,
                    2 => offset,
                    3 => 0x8000,
                    4 => 0x4000,
                    _ => rng.u16(),
                };
                frame[ip + IP_FRAG..ip + IP_FRAG + 2].copy_from_slice(&frag.to_be_bytes());
            }
            Mutation::UdpLengthLie => {
                let Some(l) = l.filter(|l| l.proto == IPPROTO_UDP && l.l4() + 6 <= len) else {
                    return;
                };
                let here = len - l.l4();
                let lie = match rng.below(4) {
                    0 => rng.u16().into(),
                    1 => rng.below(8),
                    2 => here + rng.range(1, 17),
                    _ => here.saturating_sub(rng.range(1, 17)),
                };
                frame[l.l4() + 4..l.l4() + 6].copy_from_slice(&(lie as u16).to_be_bytes());
            }
            Mutation::TcpDataOffset | Mutation::TcpFlags => {
                let Some(l) = l.filter(|l| l.proto == IPPROTO_TCP && l.l4() + 14 <= len) else {
                    return;
                };
                if self == Mutation::TcpFlags {
                    frame[l.l4() + 13] = rng.u8();
                } else {
                    let b = &mut frame[l.l4() + 12];
                    *b = ((rng.below(16) as u8) << 4) | (*b & 0x0f);
                }
            }
            Mutation::Protocol if len > ip + IP_PROTO => {
                let any = rng.u8();
                frame[ip + IP_PROTO] = rng.pick(&[1, 6, 17, 132, 0, 2, 47, 50, 58, 255, any]);
            }
            Mutation::Trailer => {
                let n = rng.range(1, 33);
                frame.extend(rng.bytes(n));
            }
            Mutation::Ethertype if len >= ETH_HLEN => {
                let any = rng.u16();
                let t = rng.pick(&[0x0806, 0x86dd, 0x8100, 0x88a8, 0x8847, 0, 0xffff, any]);
                frame[12..14].copy_from_slice(&t.to_be_bytes());
            }
            Mutation::VlanTag if len >= ETH_HLEN => {
                let tci = rng.u16() & 0xefff;
                let mut tag = vec![0x81, 0x00];
                tag.extend(tci.to_be_bytes());
                if rng.percent(20) {
                    // 802.1ad outer tag around the 802.1Q one.
                    let mut outer = vec![0x88, 0xa8];
                    outer.extend(rng.u16().to_be_bytes());
                    tag.splice(0..0, outer);
                }
                frame.splice(12..12, tag);
            }
            Mutation::ByteFlips if len > 0 => {
                for _ in 0..rng.range(1, 5) {
                    // Mostly inside the headers, where the parser looks.
                    let at = if rng.percent(80) {
                        rng.below(len.min(ETH_HLEN + 80))
                    } else {
                        rng.below(len)
                    };
                    frame[at] ^= rng.range(1, 256) as u8;
                }
            }
            Mutation::ChecksumGarbage => {
                let Some(l) = l else { return };
                // (offset, width) of each checksum field the frame claims.
                let mut fields = vec![(ip + IP_CSUM, 2)];
                if let Some(f) = l4_csum_field(l.proto) {
                    fields.push((l.l4() + f.start, f.len()));
                } else if l.proto == IPPROTO_ICMP {
                    fields.push((l.l4() + 2, 2));
                    fields.push((l.l4() + ICMP_QUOTE + IP_CSUM, 2));
                }
                let (at, width) = rng.pick(&fields);
                if at + width > len {
                    return;
                }
                let tcp_udp = width == 2 && at != ip + IP_CSUM && l.proto != IPPROTO_ICMP;
                let value: u32 = match rng.below(4) {
                    0 => 0,
                    1 => u32::MAX,
                    2 if tcp_udp && l.total >= l.ihl => pseudo_seed(&frame[ip..]).into(),
                    _ => rng.u32(),
                };
                frame[at..at + width].copy_from_slice(&value.to_be_bytes()[4 - width..]);
            }
            _ => {}
        }
    }
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Whether `r` is a run's outcome (each run counts exactly one) rather than an event along
/// the way (a new flow, a restored entry, ...). Exhaustive, so that a new reason must be
/// placed here.
pub fn is_outcome(r: Reason) -> bool {
    match r {
        Reason::Translated
        | Reason::NotIp
        | Reason::NotL4
        | Reason::Ipv6Extension
        | Reason::Udp6NoChecksum
        | Reason::Malformed
        | Reason::NotService
        | Reason::NoFlowOpener
        | Reason::NodeSocket
        | Reason::NoBackend
        | Reason::XdpDeferred
        | Reason::FragUnknown
        | Reason::NatFailed
        | Reason::MasqFailed
        | Reason::SctpFragment
        | Reason::Redirected
        | Reason::NotRedirected
        // DSR's (NAT networks, where the fuzz tiers run, count none of them).
        | Reason::DsrNew
        | Reason::DsrSession
        | Reason::DsrReset
        | Reason::DsrNoBackend
        | Reason::DsrUnresolved
        // The socket programs' (which run on no packet).
        | Reason::SockTranslated
        | Reason::SockReversed => true,
        Reason::FlowNew
        | Reason::FlowReopened
        | Reason::FlowRecreated
        | Reason::EntryRestored
        | Reason::EntryExpired
        | Reason::PortClash
        | Reason::MasqNew => false,
    }
}

/// Every outcome ([`is_outcome`]), in counter-slot order.
pub fn outcomes() -> Vec<Reason> {
    (Reason::ALL.iter())
        .map(|(r, _)| *r)
        .filter(|r| is_outcome(*r))
        .collect()
}
