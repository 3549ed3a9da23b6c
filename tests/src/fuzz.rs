//! The fuzz tier's tools, independent of the programs: a seeded PRNG, a reading of an Ethernet
//! frame as the programs' parser would claim it (`ipv4`), what a translation may change in it
//! (`rewritable`), which of its checksums hold (`checksums`, computed from scratch as a receiver
//! checks them), a fix-up that makes them hold again after a structural mutation, and the
//! mutations themselves.
//!
//! Everything here reads lengths and offsets as the headers *claim* them, lies included, and
//! never indexes past the frame: a mutated frame may claim anything.
use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    ops::Range,
};

use lb_common::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, Reason};

use crate::{
    crc32c::sctp_checksum,
    packet::{checksum, l4_checksum, l4_checksum6, pseudo_seed},
};

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and every seed gives a full-quality
/// stream, which is all a reproducible fuzz run needs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias of a 64-bit draw is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0)");
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    pub fn u8(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn u16(&mut self) -> u16 {
        self.next_u64() as u16
    }

    pub fn u32(&mut self) -> u32 {
        self.next_u64() as u32
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
}

/// The seed in `var` (decimal or 0x-hex), or a fresh one, which the caller prints so that a
/// failing run can be repeated.
pub fn seed_from_env(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{var}={v}: not a seed: {e}"))
        }
        Err(_) => {
            let mut buf = [0u8; 8];
            // SAFETY: getrandom writes at most `buf.len()` bytes into `buf`.
            let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
            assert_eq!(n, buf.len() as isize, "getrandom for a fuzz seed");
            u64::from_ne_bytes(buf)
        }
    }
}

/// The number in `var`, or `default`.
pub fn count_from_env(var: &str, default: usize) -> usize {
    std::env::var(var).map_or(default, |v| {
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={v}: not a count: {e}"))
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether any of `addrs` appears anywhere in `frame`, at any offset. A frame that mentions
/// none of a network's service addresses, node addresses and backends cannot be for a service
/// however it is parsed: every service lookup, flow entry and fragment record is keyed by at
/// least one of them (see `lb_common::flow`, "Entries").
pub fn mentions(frame: &[u8], addrs: &[Ipv4Addr]) -> bool {
    frame
        .windows(4)
        .any(|w| addrs.iter().any(|a| a.octets() == w))
}

pub const ETH_HLEN: usize = 14;
const ETH_P_IP: [u8; 2] = [0x08, 0x00];
/// Offsets in the IPv4 header.
const IP_TOTAL: usize = 2;
const IP_FRAG: usize = 6;
const IP_PROTO: usize = 9;
const IP_CSUM: usize = 10;
const IP_ADDRS: Range<usize> = 12..20;
/// An ICMP error's quote starts after its 8-byte header.
const ICMP_QUOTE: usize = 8;

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

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Where a TCP/UDP/SCTP header keeps its checksum, and the smallest segment that holds it.
fn l4_csum_field(proto: u8) -> Option<Range<usize>> {
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
fn pseudo_sum_holds(ip: &[u8], seg: &[u8]) -> bool {
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
fn quoted_header(seg: &[u8]) -> Option<&[u8]> {
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
    fn allow(mask: &mut [bool], r: Range<usize>) {
        for b in mask.iter_mut().take(r.end).skip(r.start) {
            *b = true;
        }
    }
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

/// The first offset at which `output` differs from `input` where a translation has no business
/// (see [`rewritable`]), or a length change (`min(len)`).
pub fn foreign_change(input: &[u8], output: &[u8]) -> Option<usize> {
    if input.len() != output.len() {
        return Some(input.len().min(output.len()));
    }
    let mask = rewritable(input);
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

const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];
const IPV6_HLEN: usize = 40;
/// Offsets in the IPv6 header.
const IP6_PAYLOAD: usize = 4;
const IP6_NEXT: usize = 6;
pub const IP6_ADDRS: Range<usize> = 8..40;
/// Extension headers a reading walks at most: more than the programs walk
/// (`IPV6_MAX_EXT_HEADERS`), so that wherever their walk ends, this one ends there too.
const EXT_WALK_MAX: usize = 16;

/// Where an IPv6 packet stands in its datagram, by its fragment header, with the datagram's
/// identification (as the programs' parser reads it: offset 0 and no more fragments is whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frag6 {
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
    pub frag: Frag6,
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
fn ipv6_at(frame: &[u8], ip: usize) -> Option<Ipv6Layout> {
    let h = frame.get(ip..ip + IPV6_HLEN)?;
    if h[0] >> 4 != 6 {
        return None;
    }
    let (mut off, mut next, mut frag) = (ip + IPV6_HLEN, h[IP6_NEXT], Frag6::Whole);
    for _ in 0..EXT_WALK_MAX {
        if !matches!(next, 0 | 43 | 44 | 51 | 60) {
            return Some(Ipv6Layout {
                ip,
                payload: be16(h, IP6_PAYLOAD).into(),
                l4: off,
                proto: next,
                frag,
            });
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
                (0, false) => Frag6::Whole,
                (0, true) => Frag6::First(id),
                _ => Frag6::Later(id),
            };
            if let Frag6::Later(_) = frag {
                return Some(Ipv6Layout {
                    ip,
                    payload: be16(h, IP6_PAYLOAD).into(),
                    l4: off,
                    proto: next,
                    frag,
                });
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
            && !matches!(self.frag, Frag6::Later(_))
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
    matches!(l.frag, Frag6::Later(_))
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
fn pseudo_sum6(frame: &[u8], l: &Ipv6Layout, seg: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40);
    pseudo.extend(&frame[l.ip + IP6_ADDRS.start..l.ip + IP6_ADDRS.end]);
    pseudo.extend((seg.len() as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, l.proto]);
    !checksum(&pseudo)
}

/// Where the upper-layer checksum field sits (TCP, UDP, SCTP, ICMPv6).
fn l4_csum_field6(proto: u8) -> Option<Range<usize>> {
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
    let Some(l) = ipv6(frame).filter(|l| l.frag == Frag6::Whole) else {
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
fn checksum_with(data: &[u8], seed: u16) -> u16 {
    let mut with = Vec::with_capacity(data.len() + 2);
    with.extend(seed.to_be_bytes());
    with.extend(data);
    checksum(&with)
}

/// Makes every checksum [`checksums6`] can check hold, by the layout the frame claims
/// ([`fix_checksums`] of IPv6). A UDP checksum of 0 and an SCTP CRC of 0 stay 0.
pub fn fix_checksums6(frame: &mut [u8]) {
    let Some(l) = ipv6(frame).filter(|l| l.frag == Frag6::Whole) else {
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
    let mut allow = |r: Range<usize>| {
        for b in mask.iter_mut().take(r.end).skip(r.start) {
            *b = true;
        }
    };
    let Some(l) = ipv6(frame) else { return mask };
    allow(l.ip + IP6_ADDRS.start..l.ip + IP6_ADDRS.end);
    if let Frag6::Later(_) = l.frag {
        return mask;
    }
    if let Some(f) = l4_csum_field6(l.proto) {
        allow(l.l4 + f.start..l.l4 + f.end);
    }
    if l.proto != IPPROTO_ICMPV6 {
        allow(l.l4..l.l4 + 4);
    } else if let Some(q) = l.quote(frame) {
        allow(q.ip + IP6_ADDRS.start..q.ip + IP6_ADDRS.end);
        if !matches!(q.frag, Frag6::Later(_)) {
            allow(q.l4..q.l4 + 4);
        }
    }
    mask
}

/// The first offset at which `output` differs from `input` where a translation of an IPv6
/// frame has no business (see [`rewritable6`]), or a length change (`min(len)`).
pub fn foreign_change6(input: &[u8], output: &[u8]) -> Option<usize> {
    if input.len() != output.len() {
        return Some(input.len().min(output.len()));
    }
    let mask = rewritable6(input);
    (0..input.len()).find(|&i| input[i] != output[i] && !mask[i])
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
    let l = ipv6(frame).filter(|l| !matches!(l.frag, Frag6::Later(_)))?;
    let f = l4_csum_field6(l.proto)?;
    let at = l.l4 + f.start..l.l4 + f.end;
    (at.end <= frame.len()).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{Ipv4Packet, icmp_error, ip_of, verify};

    const A: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 2);

    fn built() -> Vec<Vec<u8>> {
        let mut sctp = Ipv4Packet::sctp(A, 1000, B, 2000).build();
        fix_checksums(&mut sctp);
        let mut with_options = Ipv4Packet::udp(A, 1000, B, 53);
        with_options.options = vec![1, 1, 1, 0];
        vec![
            Ipv4Packet::tcp(A, 1000, B, 80).build(),
            Ipv4Packet::udp(A, 1000, B, 53).build(),
            with_options.build(),
            sctp,
            icmp_error(
                B,
                A,
                3,
                4,
                1400,
                ip_of(&Ipv4Packet::tcp(A, 1, B, 2).build()),
            ),
        ]
    }

    #[test]
    fn checksums_hold_on_built_packets_and_agree_with_verify() {
        for frame in built() {
            verify(&frame).unwrap();
            let sums = checksums(&frame);
            assert!(sums.len() >= 2, "{sums:?}");
            assert!(sums.iter().all(|(_, ok)| *ok), "{sums:?} {}", hex(&frame));
        }
    }

    #[test]
    fn every_checksum_notices_a_flipped_byte_it_covers() {
        for frame in built() {
            let l = ipv4(&frame).unwrap();
            // One byte of the header, and the last byte of the segment.
            for at in [ETH_HLEN + 8, ETH_HLEN + l.total - 1] {
                let mut bad = frame.clone();
                bad[at] ^= 0x5a;
                let sums = checksums(&bad);
                assert!(sums.iter().any(|(_, ok)| !ok), "{at}: {sums:?}");
            }
        }
    }

    #[test]
    fn fix_up_makes_lies_consistent_and_keeps_zero_fields() {
        let mut rng = Rng::new(7);
        for i in 0..2000 {
            let mut frame = built()[i % 5].clone();
            for _ in 0..3 {
                rng.pick(&Mutation::STRUCTURAL).apply(&mut rng, &mut frame);
            }
            fix_checksums(&mut frame);
            let sums = checksums(&frame);
            assert!(sums.iter().all(|(_, ok)| *ok), "{sums:?} {}", hex(&frame));
        }
        let mut none = Ipv4Packet::udp(A, 1, B, 2);
        none.l4_csum = Some(0);
        let mut frame = none.build();
        fix_checksums(&mut frame);
        assert_eq!(checksums(&frame)[1], ("UDP checksum 0 (none)", true));
    }

    #[test]
    fn rewritable_is_addresses_ports_and_checksums() {
        let frame = Ipv4Packet::tcp(A, 1000, B, 80).build();
        let mask = rewritable(&frame);
        let allowed: Vec<usize> = (0..frame.len()).filter(|&i| mask[i]).collect();
        let l4 = ETH_HLEN + 20;
        let want: Vec<usize> = (ETH_HLEN + 10..ETH_HLEN + 20)
            .chain(l4..l4 + 4)
            .chain(l4 + 16..l4 + 18)
            .collect();
        assert_eq!(allowed, want);
        let mut out = frame.clone();
        out[l4 + 13] ^= 1;
        assert_eq!(foreign_change(&frame, &out), Some(l4 + 13), "TCP flags");
    }

    #[test]
    fn lengths_hold_on_built_packets_and_not_on_lies() {
        for frame in built() {
            assert!(lengths_hold(&frame), "{}", hex(&frame));
            let l = ipv4(&frame).unwrap();
            assert!(!lengths_hold(&frame[..frame.len() - 1]), "cut short");
            let mut lie = frame.clone();
            lie[ETH_HLEN + IP_TOTAL..ETH_HLEN + IP_TOTAL + 2]
                .copy_from_slice(&(l.ihl as u16 + 4).to_be_bytes());
            assert!(!lengths_hold(&lie), "no room for an L4 header");
        }
    }

    #[test]
    fn mentions_finds_an_address_at_any_offset() {
        let mut frame = vec![0u8; 40];
        assert!(!mentions(&frame, &[A]));
        frame[17..21].copy_from_slice(&A.octets());
        assert!(mentions(&frame, &[B, A]));
    }

    #[test]
    fn rng_is_a_function_of_its_seed() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(1).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut r = Rng::new(1);
        let b: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_ne!(b[0], b[1]);
    }

    mod ipv6 {
        use super::*;
        use crate::packet::{Ext, Ipv6Packet, verify6};

        const C: Ipv6Addr = Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2);
        const S: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x10);
        const CHAIN: [Ext; 3] = [Ext::HopByHop(1), Ext::Ah(2), Ext::Routing(0)];

        fn with_exts(p: Ipv6Packet, exts: &[Ext]) -> Ipv6Packet {
            Ipv6Packet {
                exts: exts.to_vec(),
                ..p
            }
        }

        fn fragment(offset8: u16, more: bool) -> Ext {
            Ext::Fragment {
                offset8,
                more,
                id: 7,
            }
        }

        #[test]
        fn the_layout_is_where_the_builder_put_it() {
            let tcp = with_exts(Ipv6Packet::tcp(C, 1000, S, 80), &CHAIN);
            let l = ipv6(&tcp.build()).unwrap();
            assert_eq!((l.l4, l.proto, l.frag), (tcp.l4_offset(), 6, Frag6::Whole));
            let first = with_exts(Ipv6Packet::udp(C, 1000, S, 53), &[fragment(0, true)]);
            assert_eq!(ipv6(&first.build()).unwrap().frag, Frag6::First(7));
            let later = Ipv6Packet {
                raw: Some(vec![1; 16]),
                ..with_exts(Ipv6Packet::udp(C, 1000, S, 53), &[fragment(3, false)])
            };
            let l = ipv6(&later.build()).unwrap();
            assert_eq!((l.l4, l.frag), (later.l4_offset(), Frag6::Later(7)));
            let error = Ipv6Packet::icmp6(S, C, (2, 0, 1280), &tcp.build()[14..]);
            let q = ipv6(&error.build()).unwrap().quote(&error.build()).unwrap();
            assert_eq!((q.ip, q.l4 - q.ip), (14 + 48, tcp.l4_offset() - 14));
        }

        #[test]
        fn checksums_hold_on_built_packets_agree_with_verify6_and_notice_a_flip() {
            let tcp = with_exts(Ipv6Packet::tcp(C, 1000, S, 80), &CHAIN);
            let mut sctp = Ipv6Packet::sctp(C, 1000, S, 9000).build();
            fix_checksums6(&mut sctp);
            for frame in [
                tcp.build(),
                Ipv6Packet::udp(C, 1000, S, 53).build(),
                sctp,
                Ipv6Packet::icmp6(S, C, (2, 0, 1280), &tcp.build()[14..]).build(),
            ] {
                verify6(&frame).unwrap();
                let sums = checksums6(&frame);
                assert!(sums.len() == 1 && sums[0].1, "{sums:?} {}", hex(&frame));
                let mut bad = frame.clone();
                *bad.last_mut().unwrap() ^= 0x5a;
                assert!(!checksums6(&bad)[0].1, "{}", hex(&bad));
            }
            let first = with_exts(Ipv6Packet::tcp(C, 1000, S, 80), &[fragment(0, true)]);
            assert!(
                checksums6(&first.build()).is_empty(),
                "a first fragment's covers more"
            );
        }

        #[test]
        fn fix_up_follows_a_changed_protocol_and_keeps_zero_fields() {
            let mut frame = Ipv6Packet::tcp(C, 1000, S, 80).build();
            frame[20] = 17;
            fix_checksums6(&mut frame);
            assert_eq!(checksums6(&frame), [("UDP", true)]);
            let zero = Ipv6Packet {
                l4_csum: Some(0),
                ..Ipv6Packet::udp(C, 1000, S, 53)
            };
            let mut frame = zero.build();
            fix_checksums6(&mut frame);
            assert_eq!(checksums6(&frame), [(UDP6_ZERO, true)]);
        }

        #[test]
        fn rewritable_is_addresses_ports_and_checksums_of_packet_and_quote() {
            let tcp = Ipv6Packet::tcp(C, 1000, S, 80);
            let frame = tcp.build();
            let mask = rewritable6(&frame);
            let l4 = tcp.l4_offset();
            let want: Vec<usize> = (22..54).chain(l4..l4 + 4).chain(l4 + 16..l4 + 18).collect();
            assert_eq!(
                (0..frame.len()).filter(|&i| mask[i]).collect::<Vec<_>>(),
                want
            );
            let quoted = with_exts(tcp, &[Ext::DestOpts(0)]);
            let error = Ipv6Packet::icmp6(S, C, (1, 4, 0), &quoted.build()[14..]).build();
            let mask = rewritable6(&error);
            let q = 14 + 48;
            let ql4 = q + quoted.l4_offset() - 14;
            let want: Vec<usize> = (22..54)
                .chain(56..58)
                .chain(q + 8..q + 40)
                .chain(ql4..ql4 + 4)
                .collect();
            assert_eq!(
                (0..error.len()).filter(|&i| mask[i]).collect::<Vec<_>>(),
                want
            );
            let mut out = error.clone();
            out[ql4 + 16] ^= 1;
            assert_eq!(
                foreign_change6(&error, &out),
                Some(ql4 + 16),
                "quoted checksum"
            );
        }
    }
}
