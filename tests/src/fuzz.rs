//! The fuzz tiers' shared parts. First their tools, independent of the programs: a seeded PRNG,
//! a reading of an Ethernet frame as the programs' parser would claim it (`ipv4`, `ipv6`), what
//! a translation may change in it (`rewritable`, `rewritable6`), which of its checksums hold
//! (`checksums`, `checksums6`, computed from scratch as a receiver checks them), a fix-up that
//! makes them hold again after a structural mutation, and the IPv4 mutations themselves.
//!
//! Then what both tiers generate and run alike: a case and its class (`Case`, made by
//! `Cases`), the draws of packets for a service and of what follows up on a translation
//! (`Targets`, `Tuple`, `Seen`, `Memory`), and the runner (`Fuzz`, over the fixture's
//! programs): rounds of packets that may be for a service, then of packets that cannot be,
//! whose flow and fragment tables must not move; every run's verdict, outcome counter and
//! bytes checked, and a translation against its flow entry (either family: `Family`); a
//! summary, and the coverage a long run must reach. A tier (`Tier`) brings its
//! family, its generator and its own checks.
//!
//! Everything here reads lengths and offsets as the headers *claim* them, lies included, and
//! never indexes past the frame: a mutated frame may claim anything.
use std::{
    collections::{BTreeMap, VecDeque},
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    ops::Range,
    time::Instant,
};

use aya::{Pod, programs::ProgramError};
use lb_common::{
    Addr6, FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, FlowKeyOf, FlowOf, IPPROTO_ICMP, IPPROTO_ICMPV6,
    IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, Reason,
};
use lb_user::{
    core::model::{Masquerade, Network},
    dataplane::ebpf::{be4, be6, ip6},
};

use crate::{
    crc32c::sctp_checksum,
    fixture::{
        Fixture, MapFamily, Outcome, Outcomes, Prog, Run, TablesOf, reason_count,
        refused_by_test_run,
    },
    packet::{
        Ipv4Packet, Ipv6Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, checksum, l4_checksum,
        l4_checksum6, pseudo_seed,
    },
    require_root,
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
fn allow(mask: &mut [bool], r: Range<usize>) {
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
fn foreign_change_by(
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

const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];
const IPV6_HLEN: usize = 40;
/// Offsets in the IPv6 header.
const IP6_PAYLOAD: usize = 4;
const IP6_NEXT: usize = 6;
pub const IP6_ADDRS: Range<usize> = 8..40;
/// Extension headers a reading walks at most: more than the programs walk
/// (`IPV6_MAX_EXT_HEADERS`), so that wherever their walk ends, this one ends there too.
const EXT_WALK_MAX: usize = 16;

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
fn ipv6_at(frame: &[u8], ip: usize) -> Option<Ipv6Layout> {
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
fn checksum_with(data: &[u8], seed: u16) -> u16 {
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

// What the tiers generate and run alike: cases, the tuples a generator follows up on, and the
// runner.

/// Packets a fuzz target generates unless `LB_FUZZ_PACKETS` says otherwise.
pub const DEFAULT_PACKETS: usize = 100_000;
/// Packets generated at once. A round runs the packets that may be for a service first, then
/// those that cannot be, with the flow and fragment tables read before and after the second
/// phase (a read costs a few µs per entry: per packet it would cost more than the packet).
pub const ROUND: usize = 500;
/// Flow entries beyond which the tables are emptied between rounds, keeping reads cheap.
pub const TABLE_CAP: usize = 800;
/// Packets per test from which a run must reach every path it is for (see
/// [`Fuzz::assert_coverage`]).
pub const COVERAGE_FROM: usize = 20_000;
/// Ports a packet to a service address goes to, mostly: the fixture's services' ports, their
/// targets, and ports no service has.
pub const PORTS: [u16; 8] = [443, 80, 53, 8080, 5353, 9000, 9100, 7070];

/// `LB_FUZZ_PACKETS`, or [`DEFAULT_PACKETS`].
pub fn packets_from_env() -> usize {
    count_from_env("LB_FUZZ_PACKETS", DEFAULT_PACKETS)
}

/// How a case was generated (for the summary, the coverage checks and reproducing a failure).
/// Each tier generates the kinds of its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// TCP (any flags), UDP or SCTP from a client to a VIP, a published port or a near miss.
    ToService,
    /// The first fragment (more to come, offset 0) of such a datagram; in the IPv6 tier also
    /// of a reply or a forwarded packet of a flow a program translated.
    FirstFragment,
    /// A later fragment of one of those, or of a datagram never seen.
    LaterFragment,
    /// A packet of a flow a program translated before, sent again with other flags.
    Resend,
    /// The reverse of what a program made of a packet: a backend's reply, a reply to a
    /// masquerade port.
    Reply,
    /// What a program made of a packet, sent on (the translated packet on egress).
    Forwarded,
    /// An ICMP (ICMPv6) message quoting a tracked tuple (or a fresh one), from a router or an
    /// endpoint.
    IcmpQuote,
    /// TCP, UDP, SCTP, ICMP (ICMPv6), fragments and other protocols between addresses no
    /// service uses.
    NonService,
    /// The IPv4 tier's ARP requests.
    Arp,
    /// The IPv4 tier's IPv6 frames.
    Ipv6,
    /// The IPv4 tier's service packets behind an 802.1Q (or QinQ) tag.
    Vlan,
    /// The IPv4 tier's other ethertypes, and IPv4 under a wrong ethertype.
    OtherEthertype,
    /// The IPv6 tier's frames of its no-service test.
    Wild,
}

/// What a case's checksums are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// As built: valid checksums, honest headers.
    Clean,
    /// Structural mutations, checksums fixed up to match what the headers claim.
    ValidMutated,
    /// Checksums as they fell, or garbage on purpose: nothing a translation must keep.
    Garbage,
}

/// One generated packet and how to run it; `M` is the tier's mutation.
#[derive(Clone, Debug)]
pub struct Case<M> {
    pub index: usize,
    pub kind: Kind,
    pub class: Class,
    pub mutations: Vec<M>,
    pub frame: Vec<u8>,
    /// The order the three programs see it in.
    pub order: [Prog; 3],
    /// The TC runs' ingress interface (`Some(1)`: a hairpin on loopback), or no context.
    pub ingress_ifindex: Option<u32>,
    /// Cannot be for a service: must pass untouched everywhere.
    pub untouchable: bool,
}

/// How a tier makes a case of a frame it built.
pub struct Cases<M: 'static> {
    /// How many structural mutations a case gets: one of these, drawn.
    pub rounds: &'static [usize],
    pub structural: &'static [M],
    /// The mutations garbage by nature.
    pub garbage: &'static [M],
    /// Makes every checksum of a frame hold, by the layout it claims.
    pub fix: fn(&mut [u8]),
    /// The TC runs' ingress interface, drawn (or not) last.
    pub ingress: fn(&mut Rng) -> Option<u32>,
    /// Whether a frame cannot be for a service.
    pub untouchable: fn(&[u8]) -> bool,
}

impl<M: Copy> Cases<M> {
    /// Case `index`, of `kind`: `frame` made valid (55%: structural mutations, then its
    /// checksums fixed up, so only the lies are wrong) or garbage (structural mutations and,
    /// 60% of the time, one garbage by nature; checksums as they fall), `apply` applying each
    /// mutation; the programs' order shuffled.
    pub fn case(
        &self,
        rng: &mut Rng,
        index: usize,
        kind: Kind,
        mut frame: Vec<u8>,
        mut apply: impl FnMut(M, &mut Rng, &mut Vec<u8>),
    ) -> Case<M> {
        let valid = rng.percent(55);
        let mut mutations = Vec::new();
        for _ in 0..rng.pick(self.rounds) {
            let m = rng.pick(self.structural);
            apply(m, rng, &mut frame);
            mutations.push(m);
        }
        if valid {
            (self.fix)(&mut frame);
        } else if rng.percent(60) {
            let m = rng.pick(self.garbage);
            apply(m, rng, &mut frame);
            mutations.push(m);
        }
        let class = match (valid, mutations.is_empty()) {
            (false, _) => Class::Garbage,
            (true, true) => Class::Clean,
            (true, false) => Class::ValidMutated,
        };
        let mut order = Prog::ALL;
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        Case {
            index,
            kind,
            class,
            mutations,
            order,
            ingress_ifindex: (self.ingress)(rng),
            untouchable: (self.untouchable)(&frame),
            frame,
        }
    }
}

/// An address and port pair each way, as in a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple<A> {
    pub saddr: A,
    pub sport: u16,
    pub daddr: A,
    pub dport: u16,
}

impl<A: Copy> Tuple<A> {
    pub fn new(saddr: A, sport: u16, daddr: A, dport: u16) -> Self {
        Tuple {
            saddr,
            sport,
            daddr,
            dport,
        }
    }

    pub fn reversed(self) -> Self {
        Tuple::new(self.daddr, self.dport, self.saddr, self.sport)
    }

    /// This tuple or its reverse, even odds.
    pub fn either_way(self, rng: &mut Rng) -> Self {
        if rng.percent(50) {
            self
        } else {
            self.reversed()
        }
    }

    /// A tuple between `saddr` and `daddr` with a source port of anything, a client's or a
    /// server's, and a destination port of anything or of `dports`.
    pub fn between(rng: &mut Rng, saddr: A, daddr: A, dports: &[u16]) -> Self {
        let any = rng.u16();
        let sport = rng.pick(&[any, 40000, 443]);
        let dport = rng.pick(&[&[any], dports].concat());
        Tuple::new(saddr, sport, daddr, dport)
    }

    /// Who sends an ICMP error about a packet of this tuple, and to whom: mostly `router` on
    /// the path or the packet's destination, to its source; now and then the node is either
    /// end, or `client` the receiver.
    pub fn error_ends(self, rng: &mut Rng, router: A, node: A, client: A) -> (A, A) {
        let src = rng.pick(&[router, router, self.daddr, node]);
        let dst = rng.pick(&[self.saddr, self.saddr, node, client]);
        (src, dst)
    }
}

impl Tuple<Ipv4Addr> {
    /// The addresses of `frame`'s IPv4 header (untagged, right after the Ethernet header) and
    /// the ports at frame offset `l4`.
    pub fn of(frame: &[u8], l4: usize) -> Self {
        Tuple::at(frame, ETH_HLEN, Some(l4))
    }

    /// A packet of `proto` (TCP, UDP, SCTP) with this tuple.
    pub fn packet(self, proto: u8) -> Ipv4Packet {
        let p = Ipv4Packet::tcp(self.saddr, self.sport, self.daddr, self.dport);
        Ipv4Packet { proto, ..p }
    }
}

impl Tuple<Ipv6Addr> {
    /// A packet of `proto` (TCP, UDP, SCTP) with this tuple.
    pub fn packet(self, proto: u8) -> Ipv6Packet {
        let p = Ipv6Packet::tcp(self.saddr, self.sport, self.daddr, self.dport);
        Ipv6Packet { proto, ..p }
    }
}

impl<A: Family> Tuple<A> {
    /// The addresses of the IP header at frame offset `ip` and the ports at `l4` (none, 0:
    /// a later fragment).
    pub fn at(frame: &[u8], ip: usize, l4: Option<usize>) -> Self {
        let port = |at: usize| be16(frame, at);
        let (saddr, daddr) = A::addrs(frame, ip);
        Tuple {
            saddr,
            daddr,
            sport: l4.map_or(0, port),
            dport: l4.map_or(0, |l4| port(l4 + 2)),
        }
    }

    /// What an entry rewrites a packet to.
    pub fn of_entry(e: &FlowOf<A::Map>) -> Self {
        let port = u16::from_be;
        let ip = A::of_map;
        Tuple::new(ip(e.saddr), port(e.sport), ip(e.daddr), port(e.dport))
    }

    /// The flow key of a packet of `proto` with this tuple.
    pub fn key(self, proto: u8) -> FlowKeyOf<A::Map> {
        FlowKeyOf {
            saddr: self.saddr.to_map(),
            daddr: self.daddr.to_map(),
            sport: self.sport.to_be(),
            dport: self.dport.to_be(),
            proto,
            _pad: [0; 3],
        }
    }

    /// The record key of the datagram `id` of `proto` with this tuple's addresses.
    pub fn frag_key(self, proto: u8, id: u32) -> <A::Map as MapFamily>::FragKey {
        A::Map::frag_key(self.saddr.to_map(), self.daddr.to_map(), id, proto)
    }
}

/// Where a packet's headers are, as the programs' parser claims them, in either family: its
/// IP header, its upper-layer header (a later fragment's data), its protocol and where it
/// stands in its datagram.
#[derive(Clone, Copy, Debug)]
pub struct Headers {
    pub ip: usize,
    pub l4: usize,
    pub proto: u8,
    pub frag: Frag,
}

impl From<Ipv6Layout> for Headers {
    fn from(l: Ipv6Layout) -> Self {
        Headers {
            ip: l.ip,
            l4: l.l4,
            proto: l.proto,
            frag: l.frag,
        }
    }
}

/// An address family as the fuzz tiers check a translation against its flow entry
/// ([`Fuzz`]'s entry check): its address (`Ipv4Addr`, `Ipv6Addr`) in a packet and in the maps,
/// and where a packet's headers, and an ICMP error's quote, are.
pub trait Family: Copy + fmt::Debug + fmt::Display + PartialEq + 'static {
    /// The family's map address (`u32`, `Addr6`).
    type Map: MapFamily;
    /// The family's name, and its ICMP's name and protocol number.
    const NAME: &'static str;
    const ICMP: (&'static str, u8);
    /// The source and destination addresses of the IP header at frame offset `ip`.
    fn addrs(frame: &[u8], ip: usize) -> (Self, Self);
    fn to_map(self) -> Self::Map;
    fn of_map(a: Self::Map) -> Self;
    /// The headers of `frame` as the programs' parser reads them, or `None` when it is no
    /// packet of the family.
    fn headers(frame: &[u8]) -> Option<Headers>;
    /// The headers of the packet an ICMP error (whose headers are `h`) quotes, if it is an
    /// error the programs translate and it quotes a packet of the family.
    fn quote(frame: &[u8], h: &Headers) -> Option<Headers>;
}

impl Family for Ipv4Addr {
    type Map = u32;
    const NAME: &'static str = "IPv4";
    const ICMP: (&'static str, u8) = ("ICMP", IPPROTO_ICMP);
    fn addrs(frame: &[u8], ip: usize) -> (Self, Self) {
        let at = |at: usize| Ipv4Addr::from(<[u8; 4]>::try_from(&frame[at..at + 4]).unwrap());
        (at(ip + IP_ADDRS.start), at(ip + IP_ADDRS.start + 4))
    }
    fn to_map(self) -> u32 {
        be4(self)
    }
    fn of_map(a: u32) -> Self {
        Ipv4Addr::from(a.to_ne_bytes())
    }
    fn headers(frame: &[u8]) -> Option<Headers> {
        let l = ipv4(frame)?;
        Some(Headers {
            ip: ETH_HLEN,
            l4: l.l4(),
            proto: l.proto,
            frag: frag4(&frame[ETH_HLEN..]),
        })
    }
    /// Destination unreachable, time exceeded and parameter problem (lb-ebpf
    /// `parse::packet4`); the quoted header's fragment bits are not looked at there.
    fn quote(frame: &[u8], h: &Headers) -> Option<Headers> {
        let error = h.proto == IPPROTO_ICMP
            && !matches!(h.frag, Frag::Later(_))
            && [3, 11, 12].contains(frame.get(h.l4)?);
        let q = h.l4 + ICMP_QUOTE;
        let ip = frame.get(q..q + 20).filter(|_| error)?;
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        (ip[0] >> 4 == 4 && ihl >= 20).then(|| Headers {
            ip: q,
            l4: q + ihl,
            proto: ip[IP_PROTO],
            frag: frag4(ip),
        })
    }
}

/// Where the IPv4 packet whose header `ip` starts with stands in its datagram.
fn frag4(ip: &[u8]) -> Frag {
    let (id, bits) = (u32::from(be16(ip, 4)), be16(ip, IP_FRAG));
    match (bits & 0x1fff, bits & 0x2000 != 0) {
        (0, false) => Frag::Whole,
        (0, true) => Frag::First(id),
        _ => Frag::Later(id),
    }
}

impl Family for Ipv6Addr {
    type Map = Addr6;
    const NAME: &'static str = "IPv6";
    const ICMP: (&'static str, u8) = ("ICMPv6", IPPROTO_ICMPV6);
    fn addrs(frame: &[u8], ip: usize) -> (Self, Self) {
        let at = ip + IP6_ADDRS.start;
        (addr6_at(frame, at), addr6_at(frame, at + 16))
    }
    fn to_map(self) -> Addr6 {
        be6(self)
    }
    fn of_map(a: Addr6) -> Self {
        ip6(a)
    }
    fn headers(frame: &[u8]) -> Option<Headers> {
        ipv6(frame).map(Headers::from)
    }
    fn quote(frame: &[u8], h: &Headers) -> Option<Headers> {
        let l = ipv6(frame).filter(|l| l.ip == h.ip)?;
        l.quote(frame).map(Headers::from)
    }
}

/// A translation a program made: the tuple before and after.
#[derive(Clone, Copy, Debug)]
pub struct Seen<A> {
    pub proto: u8,
    pub before: Tuple<A>,
    pub after: Tuple<A>,
}

impl<A: Copy> Seen<A> {
    /// The tuple of a packet that follows up on the translation as `kind` says: the same again
    /// (`Resend`), the reverse of what it became (`Reply`), what it became sent on
    /// (`Forwarded`).
    pub fn follow_up(&self, kind: Kind) -> Tuple<A> {
        match kind {
            Kind::Resend => self.before,
            Kind::Reply => self.after.reversed(),
            Kind::Forwarded => self.after,
            _ => unreachable!("{kind:?} follows up on no translation"),
        }
    }

    /// One of the four tuples the flow's packets carry, for an ICMP error to quote: as
    /// translated or not, either way.
    pub fn any_tuple(&self, rng: &mut Rng) -> Tuple<A> {
        match rng.below(4) {
            0 => self.before,
            1 => self.after,
            2 => self.before.reversed(),
            _ => self.after.reversed(),
        }
    }
}

/// What a generator learnt for packets that follow up on what came before: the latest 64
/// translations the programs made, and the latest 32 first fragments (`P`: a packet builder)
/// it made.
pub struct Memory<A, P> {
    seen: VecDeque<Seen<A>>,
    firsts: VecDeque<P>,
}

impl<A, P> Default for Memory<A, P> {
    fn default() -> Self {
        Memory {
            seen: VecDeque::new(),
            firsts: VecDeque::new(),
        }
    }
}

impl<A: Copy, P> Memory<A, P> {
    /// Forgets it all: the tables were emptied, and what follows up on the flows they held
    /// would only meet no flow.
    pub fn forget(&mut self) {
        self.seen.clear();
        self.firsts.clear();
    }

    pub fn observe(&mut self, seen: Seen<A>) {
        if self.seen.len() == 64 {
            self.seen.pop_front();
        }
        self.seen.push_back(seen);
    }

    /// Remembers a first fragment, for later ones to follow.
    pub fn first(&mut self, p: P) {
        if self.firsts.len() == 32 {
            self.firsts.pop_front();
        }
        self.firsts.push_back(p);
    }

    /// A translation seen, drawn; `None` before the first (and no draw).
    pub fn recall(&self, rng: &mut Rng) -> Option<Seen<A>> {
        (!self.seen.is_empty()).then(|| self.seen[rng.below(self.seen.len())])
    }
}

impl<A, P: Clone> Memory<A, P> {
    /// A first fragment made before (85% of the time, when there is one).
    pub fn recall_first(&self, rng: &mut Rng) -> Option<P> {
        (!self.firsts.is_empty() && rng.percent(85))
            .then(|| self.firsts[rng.below(self.firsts.len())].clone())
    }
}

/// Where a tier's packets for a service go, and from where ([`Targets::tuple`]).
pub struct Targets<A: 'static> {
    /// A service address: drawn, or the one there is.
    pub vip: fn(&mut Rng) -> A,
    /// Published ports per protocol, on the addresses that publish them.
    pub tcp: &'static [(A, u16)],
    pub udp: &'static [(A, u16)],
    pub sctp: &'static [(A, u16)],
    /// Published ports on addresses that do not publish them, and ports nobody publishes.
    pub near_misses: &'static [(A, u16)],
    /// Clients, a backend among them (reaching its own service: a hairpin).
    pub clients: &'static [A],
}

impl<A: Copy> Targets<A> {
    /// A client's tuple of `proto` to a VIP (mostly at one of [`PORTS`]), a published port or
    /// a near miss.
    pub fn tuple(&self, rng: &mut Rng, proto: u8) -> Tuple<A> {
        let (daddr, dport) = match rng.below(10) {
            0..=3 => {
                let vip = (self.vip)(rng);
                let port = if rng.percent(80) {
                    rng.pick(&PORTS)
                } else {
                    rng.u16()
                };
                (vip, port)
            }
            4..=7 => rng.pick(match proto {
                IPPROTO_TCP => self.tcp,
                IPPROTO_UDP => self.udp,
                _ => self.sctp,
            }),
            _ => rng.pick(self.near_misses),
        };
        let saddr = rng.pick(self.clients);
        // Few client ports, so that flows are met again: resent, reopened, clashing.
        let sport = if rng.percent(90) {
            40000 + rng.below(16) as u16
        } else {
            rng.u16()
        };
        Tuple::new(saddr, sport, daddr, dport)
    }
}

/// A tier's generator, for what both tiers draw alike: packets to a service, and the packets
/// ICMP errors quote.
pub trait Generator {
    /// The family's address (`Ipv4Addr`, `Ipv6Addr`) and packet builder.
    type Ip: Copy + 'static;
    type Packet;
    /// Where its packets for a service go.
    const TARGETS: Targets<Self::Ip>;

    fn rng(&mut self) -> &mut Rng;
    /// A packet of `proto` (TCP, UDP, SCTP) with tuple `t`, as built by default.
    fn packet(t: Tuple<Self::Ip>, proto: u8) -> Self::Packet;
    fn tuple_of(p: &Self::Packet) -> Tuple<Self::Ip>;
    /// Dresses `p` in the tier's random flags, payload and headers.
    fn dress(&mut self, p: &mut Self::Packet);

    /// A packet of `proto` with tuple `t`, dressed.
    fn dressed(&mut self, t: Tuple<Self::Ip>, proto: u8) -> Self::Packet {
        let mut p = Self::packet(t, proto);
        self.dress(&mut p);
        p
    }

    /// A client's packet of `proto` to a service address, a published port or a near miss.
    fn service_packet(&mut self, proto: u8) -> Self::Packet {
        let t = Self::TARGETS.tuple(self.rng(), proto);
        self.dressed(t, proto)
    }

    /// What an ICMP error quotes, and its tuple: mostly (85%) a packet of a translation seen
    /// (any of its four tuples), or else a fresh packet to a service, either way.
    fn quoted(
        &mut self,
        seen: Option<Seen<Self::Ip>>,
        proto: u8,
    ) -> (Tuple<Self::Ip>, Self::Packet) {
        let (quoted, proto) = match seen {
            Some(s) if self.rng().percent(85) => (s.any_tuple(self.rng()), s.proto),
            _ => {
                let p = self.service_packet(proto);
                (Self::tuple_of(&p).either_way(self.rng()), proto)
            }
        };
        (quoted, self.dressed(quoted, proto))
    }
}

/// TCP flags of a generated packet: mostly a SYN, an ACK, a close (FIN, RST), now and then
/// anything.
pub fn tcp_flags(rng: &mut Rng) -> u8 {
    let any = rng.u8();
    rng.pick(&[
        TCP_SYN,
        TCP_SYN,
        TCP_SYN,
        TCP_ACK,
        TCP_ACK | TCP_PSH,
        TCP_SYN | TCP_ACK,
        TCP_FIN | TCP_ACK,
        TCP_RST,
        TCP_RST | TCP_ACK,
        any,
    ])
}

/// How many bytes of a packet (`len` from its IP header on, its L4 header `l4` bytes in) an
/// ICMP error quotes: mostly up to 8 bytes into the L4 header, as RFC 792 asks (which holds
/// the ports), or all of it, or too few for the ports, or any length.
pub fn quote_len(rng: &mut Rng, l4: usize, len: usize) -> usize {
    let want = match rng.below(10) {
        0..=5 => l4 + 8,
        6 | 7 => len,
        8 => l4 + 4,
        _ => rng.below(len + 1),
    };
    want.min(len)
}

/// The outcomes each program counted between two reads of `EbpfNetwork::reasons`, checked
/// against what a round of runs may count: one outcome per run that ran (`ran`, by program)
/// and only outcomes of `allowed` (nothing else either: no event of a new flow). `round`
/// names the runs in a failure. Returns them.
pub fn round_counted(
    before: &[(&str, Reason, u64)],
    after: &[(&str, Reason, u64)],
    ran: [u64; 3],
    allowed: &[Reason],
    round: &str,
) -> Vec<(Prog, Reason, u64)> {
    let mut all = Vec::new();
    for prog in Prog::ALL {
        let moved: Vec<(Reason, u64)> = (before.iter().zip(after))
            .filter(|((hook, ..), _)| *hook == prog.hook())
            .map(|((_, r, b), (_, _, a))| (*r, a - b))
            .filter(|(_, d)| *d > 0)
            .collect();
        let total: u64 = moved.iter().map(|(_, d)| d).sum();
        assert!(
            total == ran[prog as usize] && moved.iter().all(|(r, _)| allowed.contains(r)),
            "{prog:?}: {} runs counted {moved:?}; one outcome per run, and only {allowed:?}, \
             fit ({round})",
            ran[prog as usize],
        );
        all.extend(moved.into_iter().map(|(r, d)| (prog, r, d)));
    }
    all
}

/// A fuzz tier as [`Fuzz`] runs it: its family, its generator (the tier itself), and what it
/// checks beyond what every tier checks.
pub trait Tier: Generator<Ip: Family<Map = Self::Addr>> + Sized {
    /// The family's map address (`u32`, `Addr6`).
    type Addr: MapFamily;
    type Mutation: Copy + fmt::Debug + Ord;
    /// The test target (`cargo test --test`) the tier's tests are in.
    const TARGET: &'static str;
    /// How many tests of the target share `LB_FUZZ_PACKETS` between them.
    const SHARE: usize;
    /// Every outcome a packet that cannot be for a service may have.
    const NOT_FOR_A_SERVICE: &'static [Reason];
    /// The checksums (by [`Tier::checksums`]'s names) a long run must have kept through a
    /// translation.
    const KEPT: &'static [&'static str];
    /// The roles the entry check holds a translation to ([`Fuzz::check_entry`]): the backends
    /// a packet to a service goes to, the addresses a reply leaves from (services' and the
    /// node's), the node's address a masqueraded packet leaves from.
    const BACKENDS: &'static [Self::Ip];
    const REPLY_FROM: &'static [Self::Ip];
    const MASQ: Self::Ip;

    fn case(&mut self, index: usize) -> Case<Self::Mutation>;
    /// What the generator learnt from the translations.
    fn memory(&mut self) -> &mut Memory<Self::Ip, Self::Packet>;
    /// Forgets what the generator learnt: the tables were emptied.
    fn forget(&mut self) {
        self.memory().forget();
    }
    /// [`foreign_change`] of the family.
    fn foreign_change(input: &[u8], output: &[u8]) -> Option<usize>;
    /// [`checksums`] of the family.
    fn checksums(frame: &[u8]) -> Vec<(&'static str, bool)>;
    /// The name a checksum that held must hold under after a translation: its own, unless
    /// the translation must give the packet another kind of checksum.
    fn kept_as(name: &'static str) -> &'static str {
        name
    }
    /// [`lengths_hold`] of the family: a run may drop a packet as `malformed` only then.
    fn lengths_hold(frame: &[u8]) -> bool;
    /// Whether a run of `prog` that passed its packet may have counted `r`.
    fn pass_fits(prog: Prog, r: Reason) -> bool;
    /// Those outcomes, as a failure names them.
    fn passes() -> String;
    /// The tier's own checks of a translated run (after what changed and the checksums,
    /// before the entry check).
    fn translated(_fuzz: &mut Fuzz<Self>, _case: &Case<Self::Mutation>, _prog: Prog, _out: &[u8]) {}
    /// The tier's own checks after each round, whose first packet is `first`.
    fn round_done(_fuzz: &mut Fuzz<Self>, _first: usize) {}
    /// What else a long run of the tier must have reached.
    fn assert_coverage(_fuzz: &Fuzz<Self>) {}
}

/// One program's runs in a fuzz test.
#[derive(Default)]
struct ProgStats {
    runs: usize,
    refused: usize,
    passed: usize,
    translated: usize,
    dropped: usize,
    /// Translations whose input had checksums that held, all re-checked on the output.
    sums_kept: usize,
    /// The outcomes that runs of packets that may be for a service counted, by label.
    outcomes: BTreeMap<&'static str, u64>,
}

/// What a fuzz test ran and saw, for its summary and its coverage checks.
struct Stats<M> {
    packets: BTreeMap<(Kind, Class), usize>,
    mutations: BTreeMap<M, usize>,
    untouchable: usize,
    progs: [ProgStats; 3],
    /// Translations per program and kind of packet.
    translated: BTreeMap<(Prog, Kind), usize>,
    /// Checksums that held in a translated packet and were re-checked on its output, by name.
    kept: BTreeMap<&'static str, usize>,
    flushes: usize,
}

impl<M> Default for Stats<M> {
    fn default() -> Self {
        Stats {
            packets: BTreeMap::new(),
            mutations: BTreeMap::new(),
            untouchable: 0,
            progs: Default::default(),
            translated: BTreeMap::new(),
            kept: BTreeMap::new(),
            flushes: 0,
        }
    }
}

/// Runs the fuzz test `test` of tier `T`: its share of `LB_FUZZ_PACKETS` through the programs
/// of a fixture of `net`, the flow hash key and the generator's seed following from
/// `LB_FUZZ_SEED` (or a fresh seed) and `salt`, which tells apart the tests that run under one
/// seed; then, from [`COVERAGE_FROM`] packets on, [`Fuzz::assert_coverage`].
pub fn run_tier<T: Tier>(
    test: &'static str,
    salt: u64,
    net: Network,
    generator: impl FnOnce(u64) -> T,
) where
    FlowKeyOf<T::Addr>: Pod,
    FlowOf<T::Addr>: Pod,
{
    if !require_root(test) {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    let total = packets_from_env();
    println!("{test}: LB_FUZZ_SEED={seed:#x} LB_FUZZ_PACKETS={total}");
    let mut rng = Rng::new(seed ^ salt);
    let hash_key = rng.u32() | 1;
    let masquerade = net.masquerade;
    let mut f = Fixture::with_network(net, Some(hash_key));
    let handoff = f.handoff();
    let outcomes = Outcomes::new(&mut f);
    let mut fuzz = Fuzz {
        test,
        seed,
        total,
        f,
        generator: generator(rng.next_u64()),
        masquerade,
        handoff,
        outcomes,
        stats: Stats::default(),
    };
    let packets = total.div_ceil(T::SHARE);
    fuzz.run(packets);
    if packets >= COVERAGE_FROM {
        fuzz.assert_coverage();
    }
}

/// One fuzz test of a tier: the fixture, the generator and the counts.
pub struct Fuzz<T: Tier> {
    test: &'static str,
    pub seed: u64,
    /// `LB_FUZZ_PACKETS` (what repeats a run).
    total: usize,
    pub f: Fixture,
    pub generator: T,
    masquerade: Masquerade,
    /// What XDP must leave in the metadata of a packet it translated.
    handoff: u32,
    outcomes: Outcomes,
    stats: Stats<T::Mutation>,
}

impl<T: Tier> Fuzz<T>
where
    FlowKeyOf<T::Addr>: Pod,
    FlowOf<T::Addr>: Pod,
{
    /// Panics with everything needed to repeat the failure.
    pub fn fail(&self, case: &Case<T::Mutation>, prog: Prog, out: Option<&[u8]>, what: &str) -> ! {
        panic!(
            "{what}\n  packet #{} ({:?}, {:?}, mutations {:?}) through {prog:?} (order {:?}, \
             TC ingress_ifindex {:?})\n  in:  {}\n  out: {}\n  repeat with LB_FUZZ_SEED={:#x} \
             LB_FUZZ_PACKETS={} cargo test -p lb-tests --test {} {} (the same packets, in the \
             same order)",
            case.index,
            case.kind,
            case.class,
            case.mutations,
            case.order,
            case.ingress_ifindex,
            hex(&case.frame),
            out.map_or("-".into(), hex),
            self.seed,
            self.total,
            T::TARGET,
            self.test,
        )
    }

    fn run(&mut self, packets: usize) {
        let started = Instant::now();
        let mut index = 0;
        let mut flows = self.f.tables_of::<T::Addr>().flows.len();
        while index < packets {
            if flows > TABLE_CAP {
                self.f.restore_of(&TablesOf::<T::Addr>::default());
                self.generator.forget();
                self.stats.flushes += 1;
            }
            let n = ROUND.min(packets - index);
            let cases: Vec<_> = (index..index + n).map(|i| self.generator.case(i)).collect();
            for c in &cases {
                *self.stats.packets.entry((c.kind, c.class)).or_default() += 1;
                for m in &c.mutations {
                    *self.stats.mutations.entry(*m).or_default() += 1;
                }
            }
            let (untouchable, candidates): (Vec<_>, Vec<_>) =
                cases.into_iter().partition(|c| c.untouchable);
            self.stats.untouchable += untouchable.len();
            for case in &candidates {
                self.run_case(case, true);
            }
            flows = self.untouchable_phase(&untouchable, index).flows.len();
            T::round_done(self, index);
            index += n;
        }
        self.summary(packets, started.elapsed().as_secs_f64());
    }

    /// Runs what cannot be for a service (of the round from packet `first` on): the tables
    /// must not move, and the outcomes counted must all be ones such a packet may have.
    /// Returns the tables.
    fn untouchable_phase(
        &mut self,
        cases: &[Case<T::Mutation>],
        first: usize,
    ) -> TablesOf<T::Addr> {
        let before = self.f.tables_of();
        let counts_before = self.f.dp.reasons().unwrap();
        let mut ran = [0u64; 3];
        for case in cases {
            for (prog, o) in self.run_case(case, false) {
                ran[prog as usize] += u64::from(o != Outcome::Refused);
            }
        }
        let after = self.f.tables_of();
        if after != before {
            self.find_table_change(&before, &after, cases, first);
        }
        let counts_after = self.f.dp.reasons().unwrap();
        let round = format!(
            "packets #{first}.. that cannot be for a service, LB_FUZZ_SEED={:#x}",
            self.seed
        );
        let allowed = T::NOT_FOR_A_SERVICE;
        round_counted(&counts_before, &counts_after, ran, allowed, &round);
        // What these runs counted is checked: the next run's own count starts here.
        for prog in Prog::ALL {
            self.outcomes.moved(prog);
        }
        after
    }

    /// The tables changed while only packets that cannot be for a service ran: puts them back
    /// and runs those packets again one at a time to name the one that does it.
    fn find_table_change(
        &mut self,
        before: &TablesOf<T::Addr>,
        after: &TablesOf<T::Addr>,
        cases: &[Case<T::Mutation>],
        first: usize,
    ) -> ! {
        for case in cases {
            self.f.restore_of(before);
            self.run_case(case, false);
            let now = self.f.tables_of();
            if now != *before {
                let (flows, frags) = (T::Addr::FLOWS, T::Addr::FRAGS);
                let what = format!(
                    "a packet that cannot be for a service changed {flows} or {frags}: {}",
                    before.diff(&now)
                );
                self.fail(case, case.order[0], None, &what);
            }
        }
        panic!(
            "packets #{first}.. that cannot be for a service changed the tables together but not \
             alone: {}; LB_FUZZ_SEED={:#x}",
            before.diff(after),
            self.seed
        );
    }

    /// Runs `case` through the three programs in its order and checks every run; `counted`:
    /// also checks each run's outcome counters (a few syscalls per run, so only where the
    /// outcome is not known in advance).
    fn run_case(&mut self, case: &Case<T::Mutation>, counted: bool) -> Vec<(Prog, Outcome)> {
        let mut done = Vec::with_capacity(3);
        for prog in case.order {
            let ctx = if prog == Prog::Xdp {
                None
            } else {
                case.ingress_ifindex
            };
            let res = self.f.test_run(prog, &case.frame, ctx);
            let (o, out) = self.check(case, prog, res);
            if counted {
                self.check_counted(case, prog, o, out.as_deref());
            }
            let s = &mut self.stats.progs[prog as usize];
            s.runs += 1;
            match o {
                Outcome::Refused => s.refused += 1,
                Outcome::Passed => s.passed += 1,
                Outcome::Translated => s.translated += 1,
                Outcome::Dropped => s.dropped += 1,
            }
            if o == Outcome::Translated {
                *self.stats.translated.entry((prog, case.kind)).or_default() += 1;
            }
            done.push((prog, o));
        }
        done
    }

    /// One run: the kernel runs what it does not refuse for its length; the verdict is one
    /// the program may give, the handoff XDP's; a packet that cannot be for a service passes,
    /// and a passed packet leaves byte-identical; a translated one as [`Fuzz::check_translated`]
    /// says.
    fn check(
        &mut self,
        case: &Case<T::Mutation>,
        prog: Prog,
        res: Result<Run, ProgramError>,
    ) -> (Outcome, Option<Vec<u8>>) {
        let input = &case.frame;
        let run = match res {
            Err(_) if refused_by_test_run(prog, input) => return (Outcome::Refused, None),
            Err(e) => self.fail(
                case,
                prog,
                None,
                &format!("BPF_PROG_TEST_RUN failed on a frame it should run: {e:?}"),
            ),
            Ok(run) => run,
        };
        let out = run.out.as_slice();
        let Some(outcome) = Outcome::of(prog, &run) else {
            let what = format!("verdict {:#x} is not one {prog:?} may give", run.verdict);
            self.fail(case, prog, Some(out), &what);
        };
        if let Some(meta) = run.meta.filter(|m| *m != self.handoff) {
            let what = format!(
                "XDP metadata {meta:#010x} is not the handoff {:#010x}",
                self.handoff
            );
            self.fail(case, prog, Some(out), &what);
        }
        if case.untouchable && outcome != Outcome::Passed {
            let what = format!("{outcome:?} a packet that cannot be for a service");
            self.fail(case, prog, Some(out), &what);
        }
        match outcome {
            Outcome::Passed if out != input => {
                let at = (0..input.len().max(out.len()))
                    .find(|&i| input.get(i) != out.get(i))
                    .unwrap();
                let what = format!(
                    "passed (verdict {:#x}) but changed, first at byte {at}",
                    run.verdict
                );
                self.fail(case, prog, Some(out), &what);
            }
            Outcome::Translated => self.check_translated(case, prog, out),
            _ => {}
        }
        (outcome, Some(run.out))
    }

    /// A translated packet changed only addresses, ports and checksum fields, and every
    /// checksum that held in it still holds (under [`Tier::kept_as`]'s name); then the
    /// tier's own checks, and it left as its entry says ([`Fuzz::check_entry`]).
    fn check_translated(&mut self, case: &Case<T::Mutation>, prog: Prog, out: &[u8]) {
        let input = &case.frame;
        if let Some(at) = T::foreign_change(input, out) {
            let what = format!(
                "translated, and changed byte {at}, which is no address, port or checksum (or \
                 the length)"
            );
            self.fail(case, prog, Some(out), &what);
        }
        let held: Vec<&'static str> = (T::checksums(input).into_iter())
            .filter_map(|(name, ok)| ok.then_some(name))
            .collect();
        let after = T::checksums(out);
        if let Some(broken) = held
            .iter()
            .find(|n| !after.contains(&(T::kept_as(n), true)))
        {
            let what = format!(
                "translated, and the {broken} checksum, which held, is no valid {} checksum now \
                 (after: {after:?})",
                T::kept_as(broken)
            );
            self.fail(case, prog, Some(out), &what);
        }
        if !held.is_empty() {
            self.stats.progs[prog as usize].sums_kept += 1;
        }
        for name in held {
            *self.stats.kept.entry(name).or_default() += 1;
        }
        T::translated(self, case, prog, out);
        self.check_entry(case, prog, out);
    }

    /// A translated packet left as the entry of its flow says (a later fragment's found by its
    /// datagram's record, an ICMP error's by the flow it quotes), in the role that entry
    /// gives it ([`Tier::BACKENDS`], [`Tier::REPLY_FROM`], [`Tier::MASQ`]). Where the packet
    /// was no ICMP error, the generator learns its translation, to follow up on it.
    fn check_entry(&mut self, case: &Case<T::Mutation>, prog: Prog, out: &[u8]) {
        let input = &case.frame;
        let has_ports = |h: &Headers| matches!(h.frag, Frag::Later(_)) || h.l4 + 4 <= input.len();
        let Some(l) = T::Ip::headers(input).filter(has_ports) else {
            let what = format!("translated a frame that is no {} packet", T::Ip::NAME);
            self.fail(case, prog, Some(out), &what);
        };
        let (icmp, icmp_proto) = T::Ip::ICMP;
        if l.proto != icmp_proto {
            return self.flow_entry(case, prog, &l, out);
        }
        let Some(q) = T::Ip::quote(input, &l).filter(|q| q.l4 + 4 <= input.len()) else {
            let what = format!(
                "translated an {icmp} message that quotes no {} packet",
                T::Ip::NAME
            );
            self.fail(case, prog, Some(out), &what);
        };
        self.error_entry(case, prog, &l, &q, out);
    }

    /// A translated packet of a flow left as its entry says, in the role the entry gives it.
    fn flow_entry(&mut self, case: &Case<T::Mutation>, prog: Prog, l: &Headers, out: &[u8]) {
        let input = &case.frame;
        let (flows, frags) = (T::Addr::FLOWS, T::Addr::FRAGS);
        let later = matches!(l.frag, Frag::Later(_));
        let ports = (!later).then_some(l.l4);
        let mut t = Tuple::<T::Ip>::at(input, l.ip, ports);
        if let Frag::Later(id) = l.frag {
            let Some(rec) = self.f.frag_of::<T::Addr>(&t.frag_key(l.proto, id)) else {
                let what =
                    format!("translated a later fragment whose datagram has no record in {frags}");
                self.fail(case, prog, Some(out), &what);
            };
            (t.sport, t.dport) = (u16::from_be(rec.sport), u16::from_be(rec.dport));
        }
        let Some(e) = self.f.flow_of::<T::Addr>(&t.key(l.proto)) else {
            let what = format!("translated, but {flows} has no entry for its tuple {t:?}");
            self.fail(case, prog, Some(out), &what);
        };
        let want = Tuple::<T::Ip>::of_entry(&e);
        let got = Tuple::<T::Ip>::at(out, l.ip, ports);
        let as_entry = if later {
            (got.saddr, got.daddr) == (want.saddr, want.daddr)
        } else {
            got == want
        };
        let egress = prog == Prog::TcEgress;
        let role = match (egress, e.flags & FLOW_MASQ != 0) {
            (false, false) => T::BACKENDS.contains(&got.daddr),
            (false, true) => t.daddr == T::MASQ && got.saddr == t.saddr,
            (true, false) => e.flags & FLOW_REPLY != 0 && T::REPLY_FROM.contains(&got.saddr),
            (true, true) => got.saddr == T::MASQ && T::BACKENDS.contains(&got.daddr),
        };
        if !as_entry || (e.flags & FLOW_EGRESS != 0) != egress || !role {
            let what = format!(
                "translated {t:?} to {got:?}, by the entry {want:?} (flags {:#x}): it must \
                 leave as its entry says, by an entry of its own hook, a packet to the \
                 service towards an {} backend, a reply from the service's address, a \
                 masqueraded one from the node's ({})",
                e.flags,
                T::Ip::NAME,
                T::MASQ
            );
            self.fail(case, prog, Some(out), &what);
        }
        if let Frag::First(id) = l.frag {
            let rec = self.f.frag_of::<T::Addr>(&t.frag_key(l.proto, id));
            if rec.map(|r| (u16::from_be(r.sport), u16::from_be(r.dport)))
                != Some((t.sport, t.dport))
            {
                let what = format!(
                    "translated a first fragment, and {frags} holds {rec:?} for its datagram, \
                     not its ports"
                );
                self.fail(case, prog, Some(out), &what);
            }
        }
        if !later {
            self.generator.memory().observe(Seen {
                proto: l.proto,
                before: t,
                after: got,
            });
        }
    }

    /// A translated ICMP error left as the entry of the flow it quotes says (lb-ebpf
    /// `icmp.rs`): the error travels against the quoted packet, so the entry keyed by the
    /// quoted tuple reversed rewrites it; the quote becomes that entry's tuple reversed, and
    /// the outer addresses that were the quoted ones follow.
    fn error_entry(
        &mut self,
        case: &Case<T::Mutation>,
        prog: Prog,
        l: &Headers,
        q: &Headers,
        out: &[u8],
    ) {
        let input = &case.frame;
        let quoted = Tuple::<T::Ip>::at(input, q.ip, Some(q.l4));
        let Some(e) = self.f.flow_of::<T::Addr>(&quoted.reversed().key(q.proto)) else {
            let what = format!(
                "translated an {} error quoting {quoted:?}, a flow with no entry",
                T::Ip::ICMP.0
            );
            self.fail(case, prog, Some(out), &what);
        };
        let to = Tuple::<T::Ip>::of_entry(&e);
        let at = |frame| Tuple::<T::Ip>::at(frame, l.ip, None);
        let (outer, outer_out) = (at(input), at(out));
        let want_outer = (
            if outer.saddr == quoted.daddr {
                to.saddr
            } else {
                outer.saddr
            },
            if outer.daddr == quoted.saddr {
                to.daddr
            } else {
                outer.daddr
            },
        );
        let got = Tuple::<T::Ip>::at(out, q.ip, Some(q.l4));
        if got != to.reversed()
            || (outer_out.saddr, outer_out.daddr) != want_outer
            || (e.flags & FLOW_EGRESS != 0) != (prog == Prog::TcEgress)
        {
            let what = format!(
                "translated an {} error quoting {quoted:?} to one quoting {got:?} from {} to \
                 {}, by the entry {to:?} (flags {:#x}): the quote must become the entry's \
                 tuple reversed, the error go from {} to {}",
                T::Ip::ICMP.0,
                outer_out.saddr,
                outer_out.daddr,
                e.flags,
                want_outer.0,
                want_outer.1
            );
            self.fail(case, prog, Some(out), &what);
        }
    }

    /// The run counted exactly one outcome, and the one its verdict implies.
    fn check_counted(
        &mut self,
        case: &Case<T::Mutation>,
        prog: Prog,
        o: Outcome,
        out: Option<&[u8]>,
    ) {
        let moved = self.outcomes.moved(prog);
        let fits = match (o, moved.as_slice()) {
            (Outcome::Refused, []) => true,
            (_, [(r, 1)]) => Self::reason_fits(prog, &case.frame, o, *r),
            _ => false,
        };
        if !fits {
            let what = format!(
                "{o:?}, and counted {moved:?}: a run counts one outcome, its own (a pass: {}; a \
                 drop: nat_failed, masq_failed on egress, malformed only once the parser \
                 accepted the packet, whose lengths then hold)",
                T::passes()
            );
            self.fail(case, prog, out, &what);
        }
        if let [(r, _)] = moved.as_slice() {
            let label = Reason::ALL[*r as usize].1;
            *self.stats.progs[prog as usize]
                .outcomes
                .entry(label)
                .or_default() += 1;
        }
    }

    /// Whether a run of `prog` on `input` that ended as `o` may have counted `r`. A drop is
    /// for a flow that gets no unique tuple (`nat_failed`, and `masq_failed` on egress, where
    /// masquerade is), or a rewrite that failed half-way (`malformed`, after the parser
    /// accepted the packet: its lengths held).
    fn reason_fits(prog: Prog, input: &[u8], o: Outcome, r: Reason) -> bool {
        match o {
            Outcome::Translated => r == Reason::Translated,
            Outcome::Dropped => match r {
                Reason::NatFailed => true,
                Reason::Malformed => T::lengths_hold(input),
                Reason::MasqFailed => prog == Prog::TcEgress,
                _ => false,
            },
            Outcome::Passed => T::pass_fits(prog, r),
            Outcome::Refused => false,
        }
    }

    fn summary(&self, packets: usize, secs: f64) {
        let s = &self.stats;
        println!(
            "{}: seed {:#x}, {packets} packets ({} that cannot be for a service), {} runs in \
             {secs:.1} s; tables emptied {} times",
            self.test,
            self.seed,
            s.untouchable,
            s.progs.iter().map(|p| p.runs).sum::<usize>(),
            s.flushes,
        );
        println!(
            "  {:<16}{:>8}{:>15}{:>9}",
            "kind", "clean", "valid-mutated", "garbage"
        );
        let mut kinds: Vec<Kind> = s.packets.keys().map(|(k, _)| *k).collect();
        kinds.dedup();
        for k in kinds {
            let n = |c| s.packets.get(&(k, c)).copied().unwrap_or(0);
            println!(
                "  {:<16}{:>8}{:>15}{:>9}",
                format!("{k:?}"),
                n(Class::Clean),
                n(Class::ValidMutated),
                n(Class::Garbage)
            );
        }
        let muts: Vec<String> = (s.mutations.iter())
            .map(|(m, n)| format!("{m:?} {n}"))
            .collect();
        println!("  mutations: {}", muts.join(", "));
        println!(
            "  {:<11}{:>8}{:>9}{:>12}{:>9}{:>9}{:>11}",
            "program", "runs", "passed", "translated", "dropped", "refused", "sums kept"
        );
        for prog in Prog::ALL {
            let p = &s.progs[prog as usize];
            println!(
                "  {:<11}{:>8}{:>9}{:>12}{:>9}{:>9}{:>11}",
                format!("{prog:?}"),
                p.runs,
                p.passed,
                p.translated,
                p.dropped,
                p.refused,
                p.sums_kept
            );
        }
        let counts = self.f.dp.reasons().unwrap();
        let list = |items: Vec<String>| items.join(", ");
        for prog in Prog::ALL {
            let outcomes = (s.progs[prog as usize].outcomes.iter())
                .map(|(l, n)| format!("{l} {n}"))
                .collect();
            println!(
                "  {prog:?} outcomes (packets that may be for a service): {}",
                list(outcomes)
            );
            let counted = (counts.iter())
                .filter(|(hook, _, n)| *hook == prog.hook() && *n > 0)
                .map(|(_, r, n)| format!("{} {n}", Reason::ALL[*r as usize].1))
                .collect();
            println!("  {prog:?} counted (all packets): {}", list(counted));
            let translated = (s.translated.iter())
                .filter(|((p, _), _)| *p == prog)
                .map(|((_, k), n)| format!("{k:?} {n}"))
                .collect();
            println!("  {prog:?} translated, by kind: {}", list(translated));
        }
        let kept = s.kept.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!("  checksums kept through a translation: {}", list(kept));
    }

    /// The run must have reached what it is for, so that a generator gone blind fails rather
    /// than passes: every program translated packets with valid checksums and passed others;
    /// every checksum of [`Tier::KEPT`] was kept through a translation; with masquerade
    /// `always`, flows were masqueraded; and what the tier asks besides. (Checked from
    /// [`COVERAGE_FROM`] packets on, where each of these happens dozens of times at least.)
    pub fn assert_coverage(&self) {
        let seed = self.seed;
        for prog in Prog::ALL {
            let p = &self.stats.progs[prog as usize];
            assert!(
                p.sums_kept > 0 && p.passed > 0,
                "{prog:?} translated no packet with valid checksums, or passed none: the \
                 generator no longer reaches it (LB_FUZZ_SEED={seed:#x})"
            );
        }
        T::assert_coverage(self);
        for sum in T::KEPT {
            assert!(
                self.stats.kept.contains_key(sum),
                "no translation re-checked a {sum} checksum (LB_FUZZ_SEED={seed:#x})"
            );
        }
        if self.masquerade == Masquerade::Always {
            assert!(
                reason_count(&self.f, Prog::TcEgress.hook(), Reason::MasqNew) > 0,
                "masquerade `always` masqueraded no flow of {} (LB_FUZZ_SEED={seed:#x})",
                T::Addr::FLOWS
            );
        }
    }

    /// That one of `progs` translated a packet of `kind`.
    pub fn assert_translated(&self, progs: &[Prog], kind: Kind) {
        assert!(
            (progs.iter()).any(|p| self.stats.translated.contains_key(&(*p, kind))),
            "{progs:?} translated no {kind:?} packet (LB_FUZZ_SEED={:#x})",
            self.seed
        );
    }

    /// That `prog` ended a run as `r`.
    pub fn assert_counted(&self, prog: Prog, r: Reason) {
        assert!(
            reason_count(&self.f, prog.hook(), r) > 0,
            "{prog:?} never ended as {r:?}: the generator misses a path (LB_FUZZ_SEED={:#x})",
            self.seed
        );
    }
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
            assert_eq!((l.l4, l.proto, l.frag), (tcp.l4_offset(), 6, Frag::Whole));
            let first = with_exts(Ipv6Packet::udp(C, 1000, S, 53), &[fragment(0, true)]);
            assert_eq!(ipv6(&first.build()).unwrap().frag, Frag::First(7));
            let later = Ipv6Packet {
                raw: Some(vec![1; 16]),
                ..with_exts(Ipv6Packet::udp(C, 1000, S, 53), &[fragment(3, false)])
            };
            let l = ipv6(&later.build()).unwrap();
            assert_eq!((l.l4, l.frag), (later.l4_offset(), Frag::Later(7)));
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
