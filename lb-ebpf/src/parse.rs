//! Header parsing, and nothing else: where the IP (IPv4, or IPv6 past its extension headers)
//! and L4 headers are and what they say.
//! Every access is bounds-checked against the frame's end, which is what the verifier needs
//! and what makes a truncated packet at any offset fall out as "not ours" (pass). Lengths the
//! headers claim are checked against what arrived, so a packet that lies about them is passed
//! untouched rather than translated by guesswork.
use core::{ffi::c_void, mem::size_of, ptr::read_volatile};

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_skb_load_bytes, bpf_xdp_get_buff_len, bpf_xdp_load_bytes},
    programs::{TcContext, XdpContext},
};
use lb_common::{
    Addr6, FlowKey, FlowKey6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
    IPV6_MAX_EXT_HEADERS, Reason,
    csum::{L4Sum, pseudo_seed, pseudo_seed6},
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{Ipv4Hdr, Ipv6Hdr},
};

/// A packet buffer the programs can read and write directly.
///
/// `start` and `end` are read with volatile loads: otherwise LLVM reuses an earlier load and
/// drops a bounds check it can prove redundant, while the verifier (which tracks each register
/// separately, and forgets ranges across helper calls and spills) cannot, and rejects the
/// access. They are re-read at every access because [`Frame::ensure`] may move the buffer.
pub trait Frame {
    fn start(&self) -> usize;
    fn end(&self) -> usize;
    /// The whole packet's length, paged-in data included.
    fn len(&self) -> usize;
    /// Makes the first `len` bytes (at most the packet's length) directly accessible. A TC
    /// skb may hold only the link header in its linear area (a PF_PACKET TX ring, as trafgen
    /// uses, and many NIC drivers put the rest in page fragments): this pulls what the
    /// headers need, and no more, so a GRO'd segment's payload stays where it is. XDP headers
    /// are in the first buffer or not at all.
    fn ensure(&self, len: usize);
    fn raw(&self) -> *mut c_void;
    /// Copies `len` bytes at `off` (paged-in data included) to `to`: false if they are not
    /// all in the packet.
    fn copy_out(&self, off: usize, to: *mut c_void, len: u32) -> bool;
}

/// The program contexts, wrapped so that the crate can give them the shared
/// `lb_common::csum::Rewrite` (see `csum`).
pub struct Xdp(pub XdpContext);
pub struct Skb(pub TcContext);

impl Frame for Xdp {
    #[inline(always)]
    fn start(&self) -> usize {
        // SAFETY: ctx is the program's valid context for the whole run.
        unsafe { read_volatile(&(*self.0.ctx).data) as usize }
    }
    #[inline(always)]
    fn end(&self) -> usize {
        unsafe { read_volatile(&(*self.0.ctx).data_end) as usize }
    }
    #[inline(always)]
    fn len(&self) -> usize {
        // SAFETY: the helper only reads the context (fragments included, for xdp.frags).
        unsafe { bpf_xdp_get_buff_len(self.0.ctx) as usize }
    }
    #[inline(always)]
    fn ensure(&self, _len: usize) {}
    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.0.as_ptr()
    }
    #[inline(always)]
    fn copy_out(&self, off: usize, to: *mut c_void, len: u32) -> bool {
        // SAFETY: the helper checks the range against the packet; `to` holds `len` bytes.
        unsafe { bpf_xdp_load_bytes(self.0.ctx, off as u32, to, len) == 0 }
    }
}

impl Frame for Skb {
    #[inline(always)]
    fn start(&self) -> usize {
        // SAFETY: the skb is the program's valid context for the whole run.
        unsafe { read_volatile(&(*self.0.skb.skb).data) as usize }
    }
    #[inline(always)]
    fn end(&self) -> usize {
        unsafe { read_volatile(&(*self.0.skb.skb).data_end) as usize }
    }
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.skb.len() as usize
    }
    #[inline(always)]
    fn ensure(&self, len: usize) {
        let want = len.min(Frame::len(self));
        if self.end() - self.start() < want {
            // A failed pull leaves the skb as it was; the bounds checks then pass the packet.
            let _ = self.0.pull_data(want as u32);
        }
    }
    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.0.as_ptr()
    }
    #[inline(always)]
    fn copy_out(&self, off: usize, to: *mut c_void, len: u32) -> bool {
        // SAFETY: the helper checks the range against the packet; `to` holds `len` bytes.
        unsafe { bpf_skb_load_bytes(self.raw(), off as u32, to, len) == 0 }
    }
}

/// Offsets the programs ever use lie below this: Ethernet, two IPv4 headers with options
/// (an ICMP error quotes one) and the L4 headers; or two IPv6 headers with such extension
/// headers as fit (an IPv6 chain reaching past it is refused, `Reason::Ipv6Extension`).
/// Saying so gives the verifier a bound on offsets that were spilled to the stack, without
/// which it rejects the pointer arithmetic.
const MAX_OFF: usize = 256;

/// A pointer to a `T` at `off`, if the whole `T` lies inside the frame.
#[inline(always)]
pub fn ptr_at<T>(f: &impl Frame, off: usize) -> Option<*mut T> {
    if off > MAX_OFF {
        return None;
    }
    // The bound is checked on `ptr + size` with `ptr` kept as its own value: the verifier only
    // credits an access to the register the comparison was made against (plus a constant).
    let ptr = f.start() + off;
    if ptr + size_of::<T>() > f.end() {
        return None;
    }
    Some(ptr as *mut T)
}

/// Reads a `T` at `off` (unaligned: IP options and odd offsets are legal).
#[inline(always)]
pub fn read<T: Copy>(f: &impl Frame, off: usize) -> Option<T> {
    // SAFETY: ptr_at checked that the whole T lies inside the frame.
    ptr_at::<T>(f, off).map(|p| unsafe { p.read_unaligned() })
}

pub const L3_OFF: usize = EthHdr::LEN;
/// Offsets within L4 headers.
const TCP_FLAGS: usize = 13;
const TCP_CSUM: usize = 16;
const UDP_CSUM: usize = 6;
const SCTP_CSUM: usize = 8;
const ICMP_HDR: usize = 8;
/// The most a TCP/UDP/SCTP header needs read: TCP's fixed part (flags, checksum).
const L4_MAX: usize = 20;

/// Where a packet stands in its datagram, with the datagram's identification (16 bits in
/// IPv4's header, 32 in IPv6's fragment header).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Frag {
    /// Not fragmented (an IPv6 atomic fragment, offset 0 and no more to come, included).
    Whole,
    /// The first fragment (offset 0, more to come): it carries the L4 header.
    First(u32),
    /// A later fragment: no L4 header, its ports are in `lb_frags`.
    Later(u32),
}

/// A flow key of either family, as the parser fills it in.
pub trait Key: Copy {
    fn proto(&self) -> u8;
    fn set_ports(&mut self, sport: u16, dport: u16);
    /// The pseudo-header seed of a TCP/UDP segment of `l4_len` bytes with this key's
    /// addresses ([`Packet::seed`]).
    fn seed(&self, l4_len: usize) -> u16;
}

/// Implements [`Key`] for a key type whose fields are named as `FlowKey`'s, its seed given by
/// `$seed` (the family's pseudo-header sum) over `$k` and `$len`.
macro_rules! key {
    ($t:ty, |$k:ident, $len:ident| $seed:expr) => {
        impl Key for $t {
            #[inline(always)]
            fn proto(&self) -> u8 {
                self.proto
            }
            #[inline(always)]
            fn set_ports(&mut self, sport: u16, dport: u16) {
                self.sport = sport;
                self.dport = dport;
            }
            #[inline(always)]
            fn seed(&self, $len: usize) -> u16 {
                let $k = self;
                $seed
            }
        }
    };
}

key!(FlowKey, |k, len| pseudo_seed(
    k.saddr, k.daddr, k.proto, len as u16
));
key!(FlowKey6, |k, len| pseudo_seed6(
    &k.saddr, &k.daddr, k.proto, len as u32
));

/// A parsed packet of a protocol the balancer translates: IPv4 (`FlowKey`) or IPv6
/// (`FlowKey6`).
#[derive(Clone, Copy)]
pub struct Packet<K = FlowKey> {
    /// The tuple as it stands in the packet (network byte order). A later fragment's ports are
    /// 0 until `frag::follow` fills them in.
    pub key: K,
    /// Offset of the L4 header (of the ports).
    pub l4_off: usize,
    /// The L4 checksum translating addresses or ports must update; `None` for a later fragment.
    pub l4: L4Sum,
    /// The IP packet's length (IPv4 total length; IPv6 payload length and its header), for
    /// the byte counters.
    pub len: u32,
    /// TCP flags (0 for other protocols and later fragments).
    pub tcp_flags: u8,
    pub frag: Frag,
    /// The L4 checksum field as found, and the pseudo-header seed it would hold if it were
    /// CHECKSUM_PARTIAL (TCP/UDP only), for XDP's rule in `nat::xdp_can_rewrite`.
    pub check: u16,
    pub seed: u16,
}

/// An ICMP or ICMPv6 error quoting a packet of some flow: the outer packet (ports 0) and the
/// quoted one.
#[derive(Clone, Copy)]
pub struct IcmpError<K = FlowKey> {
    pub outer: Packet<K>,
    /// Offsets of the quoted IP and L4 headers.
    pub inner_l3_off: usize,
    pub inner_l4_off: usize,
    /// The quoted tuple (ports included: an ICMP error quotes at least 8 bytes of L4).
    pub inner: K,
}

/// What [`packet4`] or [`packet6`] found: a flow's packet or an ICMP error quoting one.
pub enum Parsed<K = FlowKey> {
    Flow(Packet<K>),
    IcmpError(IcmpError<K>),
}

/// The family of a frame's network header, told by its ethertype.
pub enum Family {
    V4,
    V6,
}

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETERPROB: u8 = 12;
/// ICMPv6 errors (destination unreachable, packet too big, time exceeded, parameter
/// problem) are types 1 to 4; informational messages (echo, neighbour discovery, MLD) are 128
/// and up.
const ICMPV6_ERRORS: core::ops::RangeInclusive<u8> = 1..=4;

/// IPv6 extension headers the parser skips (RFC 8200 4.1; AH is RFC 4302's).
const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;

/// The family of `f`'s network header; an error for a frame that is not IP (or too short to
/// tell). Each family's parser and paths are separate functions, so that neither family's
/// parsed state takes stack space on the other's path.
#[inline(always)]
pub fn family(f: &impl Frame) -> Result<Family, Reason> {
    f.ensure(L3_OFF + Ipv4Hdr::LEN);
    let eth: EthHdr = read(f, 0).ok_or(Reason::Malformed)?;
    if eth.ether_type == EtherType::Ipv4 as u16 {
        Ok(Family::V4)
    } else if eth.ether_type == EtherType::Ipv6 as u16 {
        Ok(Family::V6)
    } else {
        Err(Reason::NotIp)
    }
}

/// Parses `f`, an IPv4 frame ([`family`]), as IPv4 + (TCP | UDP | SCTP | ICMP error). The
/// error is why the balancer leaves the packet alone: a protocol it does not translate
/// (including ICMP messages that are not errors), or headers that are cut short or lie about
/// their lengths.
#[inline(always)]
pub fn packet4(f: &impl Frame) -> Result<Parsed, Reason> {
    let ip: Ipv4Hdr = read(f, L3_OFF).ok_or(Reason::Malformed)?;
    let ihl = header_len(&ip).ok_or(Reason::Malformed)?;
    let len = u16::from_be_bytes(ip.tot_len);
    if usize::from(len) < ihl || usize::from(len) > f.len().saturating_sub(L3_OFF) {
        return Err(Reason::Malformed);
    }
    let proto = ip.proto;
    if !matches!(
        proto,
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP | IPPROTO_ICMP
    ) {
        return Err(Reason::NotL4);
    }
    let frags = u16::from_be_bytes(ip.frags);
    let id = u32::from(u16::from_be_bytes(ip.id));
    let frag = match (frags & 0x1fff, frags & 0x2000 != 0) {
        (0, false) => Frag::Whole,
        (0, true) => Frag::First(id),
        _ => Frag::Later(id),
    };
    let l4_off = L3_OFF + ihl;
    let key = FlowKey {
        saddr: u32::from_ne_bytes(ip.src_addr),
        daddr: u32::from_ne_bytes(ip.dst_addr),
        proto,
        ..Default::default()
    };
    let p = Packet {
        key,
        l4_off,
        l4: L4Sum::None,
        len: u32::from(len),
        tcp_flags: 0,
        frag,
        check: 0,
        seed: 0,
    };
    if let Frag::Later(_) = frag {
        // ICMP is never translated by fragment (an error quotes from the first one).
        return if proto == IPPROTO_ICMP {
            Err(Reason::NotL4)
        } else {
            Ok(Parsed::Flow(p))
        };
    }
    let l4_len = usize::from(len) - ihl;
    f.ensure(l4_off + L4_MAX);
    if proto != IPPROTO_ICMP {
        let mut p = p;
        transport(f, &mut p, l4_len)?;
        return Ok(Parsed::Flow(p));
    }
    let icmp: [u8; 8] = read(f, l4_off).ok_or(Reason::Malformed)?;
    if !matches!(
        icmp[0],
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETERPROB
    ) {
        return Err(Reason::NotL4);
    }
    let inner_l3_off = l4_off + ICMP_HDR;
    f.ensure(inner_l3_off + 60 + 8);
    let inner_ip: Ipv4Hdr = read(f, inner_l3_off).ok_or(Reason::Malformed)?;
    let inner_ihl = header_len(&inner_ip).ok_or(Reason::Malformed)?;
    if !matches!(inner_ip.proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP) {
        return Err(Reason::NotL4);
    }
    // The quoted header and ports lie inside the datagram, not in bytes trailing it
    // (which the ICMP checksum does not cover).
    if l4_len < ICMP_HDR + inner_ihl + 4 {
        return Err(Reason::Malformed);
    }
    let inner_l4_off = inner_l3_off + inner_ihl;
    let ports: [u16; 2] = read(f, inner_l4_off).ok_or(Reason::Malformed)?;
    let inner = FlowKey {
        saddr: u32::from_ne_bytes(inner_ip.src_addr),
        daddr: u32::from_ne_bytes(inner_ip.dst_addr),
        sport: ports[0],
        dport: ports[1],
        proto: inner_ip.proto,
        ..Default::default()
    };
    Ok(Parsed::IcmpError(IcmpError {
        outer: p,
        inner_l3_off,
        inner_l4_off,
        inner,
    }))
}

/// Parses `f`, an IPv6 frame ([`family`]), as IPv6 + extension headers + (TCP | UDP | SCTP |
/// ICMPv6 error) into `out`, [`packet4`]'s twin; an extension chain it does not walk is
/// refused too. The headers are walked first and the addresses read last, straight into
/// `out` (the run's slot): read first, their eight words would live across every pull of
/// the walk, each spilled to a stack slot of its own.
#[inline(always)]
pub fn packet6(f: &impl Frame, out: &mut Parsed<FlowKey6>) -> Result<(), Reason> {
    f.ensure(L3_OFF + Ipv6Hdr::LEN);
    let (payload, next) = ipv6_header(f, L3_OFF)?;
    let l3_end = L3_OFF + Ipv6Hdr::LEN + payload;
    if l3_end > f.len() {
        return Err(Reason::Malformed);
    }
    let (l4_off, proto, frag) = extensions(f, L3_OFF + Ipv6Hdr::LEN, next, l3_end)?;
    let l4_len = l3_end - l4_off;
    let packet = |f: &_| -> Result<Packet<FlowKey6>, Reason> {
        Ok(Packet {
            key: ipv6_key(f, L3_OFF, proto)?,
            l4_off,
            l4: L4Sum::None,
            len: (Ipv6Hdr::LEN + payload) as u32,
            tcp_flags: 0,
            frag,
            check: 0,
            seed: 0,
        })
    };
    match proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => {
            if !matches!(frag, Frag::Later(_)) {
                f.ensure(l4_off + L4_MAX);
            }
            *out = Parsed::Flow(packet(f)?);
            if let Parsed::Flow(p) = out
                && !matches!(frag, Frag::Later(_))
            {
                transport(f, p, l4_len)?;
                if proto == IPPROTO_UDP && p.check == 0 {
                    udp6_unchecked(f, p, l4_len)?;
                }
            }
            Ok(())
        }
        IPPROTO_ICMPV6 if !matches!(frag, Frag::Later(_)) => {
            // The ICMPv6 checksum (at `l4_off + 2`) covers the pseudo-header, unlike ICMP's:
            // translating the outer addresses must update it.
            let icmp: [u8; 8] = read(f, l4_off).ok_or(Reason::Malformed)?;
            if !ICMPV6_ERRORS.contains(&icmp[0]) {
                return Err(Reason::NotL4);
            }
            if l4_len < ICMP_HDR + Ipv6Hdr::LEN {
                return Err(Reason::Malformed);
            }
            let inner_l3_off = l4_off + ICMP_HDR;
            f.ensure(inner_l3_off + Ipv6Hdr::LEN + 8);
            let (_, inner_next) = ipv6_header(f, inner_l3_off)?;
            // The quote is cut short (its payload length claims more than it holds): its
            // headers are walked within the error's own datagram.
            let (inner_l4_off, inner_proto, inner_frag) =
                extensions(f, inner_l3_off + Ipv6Hdr::LEN, inner_next, l3_end)?;
            if matches!(inner_frag, Frag::Later(_))
                || !matches!(inner_proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP)
            {
                return Err(Reason::NotL4);
            }
            if inner_l4_off + 4 > l3_end {
                return Err(Reason::Malformed);
            }
            f.ensure(inner_l4_off + 4);
            let ports: [u16; 2] = read(f, inner_l4_off).ok_or(Reason::Ipv6Extension)?;
            *out = Parsed::IcmpError(IcmpError {
                outer: Packet {
                    l4: L4Sum::Icmp6((l4_off + 2) as u16),
                    ..packet(f)?
                },
                inner_l3_off,
                inner_l4_off,
                inner: FlowKey6 {
                    sport: ports[0],
                    dport: ports[1],
                    ..ipv6_key(f, inner_l3_off, inner_proto)?
                },
            });
            Ok(())
        }
        _ => Err(Reason::NotL4),
    }
}

/// Walks IPv6 extension headers from `off` (whose type is `next`) to the upper-layer header,
/// within a datagram ending at `end`: its offset, its protocol, and where the packet stands
/// in its datagram (from a fragment header). A later fragment's payload is not headers: the
/// walk stops at its fragment header, with the protocol that header names.
///
/// Hop-by-hop, routing and destination options headers and AH are skipped by their length
/// fields, as the kernel's `ipv6_skip_exthdr` does (a routing header's segments left are not
/// followed: conntrack, too, keys a flow by the header's destination). Anything else is the
/// upper layer, except the extension headers it does not skip, which are refused.
#[inline(always)]
fn extensions(
    f: &impl Frame,
    mut off: usize,
    mut next: u8,
    end: usize,
) -> Result<(usize, u8, Frag), Reason> {
    let mut frag = Frag::Whole;
    for _ in 0..IPV6_MAX_EXT_HEADERS {
        if !walked(next) {
            break;
        }
        if off + 8 > end {
            return Err(Reason::Malformed);
        }
        f.ensure(off + 8);
        // Inside the datagram, so only the parse window can leave it unread.
        let h: [u8; 8] = read(f, off).ok_or(Reason::Ipv6Extension)?;
        let len = match next {
            NEXTHDR_AUTH => (usize::from(h[1]) + 2) * 4,
            NEXTHDR_FRAGMENT => 8,
            _ => (usize::from(h[1]) + 1) * 8,
        };
        let this = next;
        next = h[0];
        off += len;
        if this == NEXTHDR_FRAGMENT {
            let fo = u16::from_be_bytes([h[2], h[3]]);
            let id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            frag = match (fo & 0xfff8, fo & 1 != 0) {
                (0, false) => Frag::Whole,
                (0, true) => Frag::First(id),
                _ => return Ok((off, next, Frag::Later(id))),
            };
        }
    }
    // Beyond the bound, or one not skipped: mobility, HIP, shim6 and the two experimental
    // values (RFC 7045).
    if walked(next) || matches!(next, 135 | 139 | 140 | 253 | 254) {
        return Err(Reason::Ipv6Extension);
    }
    if off > end {
        return Err(Reason::Malformed);
    }
    if off + L4_MAX > MAX_OFF {
        return Err(Reason::Ipv6Extension);
    }
    Ok((off, next, frag))
}

/// Whether `next` names an extension header [`extensions`] skips.
#[inline(always)]
fn walked(next: u8) -> bool {
    matches!(
        next,
        NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST | NEXTHDR_AUTH | NEXTHDR_FRAGMENT
    )
}

/// TCP, UDP or SCTP at `p.l4_off`, of which `l4_len` bytes are in the datagram: its ports,
/// its flags and the checksum a rewrite must update.
#[inline(always)]
fn transport<K: Key>(f: &impl Frame, p: &mut Packet<K>, l4_len: usize) -> Result<(), Reason> {
    let proto = p.key.proto();
    let hdr = match proto {
        IPPROTO_TCP => 20,
        IPPROTO_UDP => 8,
        _ => 12,
    };
    if l4_len < hdr {
        return Err(Reason::Malformed);
    }
    let l4_off = p.l4_off;
    let ports: [u16; 2] = read(f, l4_off).ok_or(Reason::Malformed)?;
    p.key.set_ports(ports[0], ports[1]);
    p.l4 = match proto {
        IPPROTO_TCP => {
            p.tcp_flags = read(f, l4_off + TCP_FLAGS).ok_or(Reason::Malformed)?;
            L4Sum::Tcp((l4_off + TCP_CSUM) as u16)
        }
        IPPROTO_UDP => L4Sum::Udp((l4_off + UDP_CSUM) as u16),
        _ => L4Sum::Sctp {
            off: (l4_off + SCTP_CSUM) as u16,
            len: l4_len as u16,
        },
    };
    if let L4Sum::Tcp(off) | L4Sum::Udp(off) = p.l4 {
        p.check = read(f, off.into()).ok_or(Reason::Malformed)?;
        p.seed = p.key.seed(l4_len);
    }
    Ok(())
}

/// Whether an IPv6 UDP datagram with checksum 0 (which `csum::fill_udp6` gives a checksum
/// when it is translated) can be given one: it must be whole, and its length field must say
/// what its IPv6 payload does (the checksum covers what the field says, and the programs sum
/// what the payload holds).
#[inline(always)]
fn udp6_unchecked(f: &impl Frame, p: &Packet<FlowKey6>, l4_len: usize) -> Result<(), Reason> {
    let len: u16 = read(f, p.l4_off + 4).ok_or(Reason::Malformed)?;
    if p.frag != Frag::Whole || usize::from(u16::from_be(len)) != l4_len {
        return Err(Reason::Udp6NoChecksum);
    }
    Ok(())
}

/// The IPv6 header at `off`: its payload length and its next header.
#[inline(always)]
fn ipv6_header(f: &impl Frame, off: usize) -> Result<(usize, u8), Reason> {
    let head: [u8; 8] = read(f, off).ok_or(Reason::Malformed)?;
    if head[0] >> 4 != 6 {
        return Err(Reason::Malformed);
    }
    Ok((usize::from(u16::from_be_bytes([head[4], head[5]])), head[6]))
}

/// The addresses of the IPv6 header at `off`, as they stand, in a key of protocol `proto`
/// (ports 0).
#[inline(always)]
fn ipv6_key(f: &impl Frame, off: usize, proto: u8) -> Result<FlowKey6, Reason> {
    Ok(FlowKey6 {
        saddr: read::<Addr6>(f, off + 8).ok_or(Reason::Malformed)?,
        daddr: read::<Addr6>(f, off + 24).ok_or(Reason::Malformed)?,
        proto,
        ..Default::default()
    })
}

#[inline(always)]
fn header_len(ip: &Ipv4Hdr) -> Option<usize> {
    let ihl = usize::from(ip.vihl & 0x0f) * 4;
    (ip.vihl >> 4 == 4 && ihl >= Ipv4Hdr::LEN).then_some(ihl)
}
