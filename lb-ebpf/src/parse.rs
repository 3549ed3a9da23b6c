//! Header parsing, and nothing else: where the IPv4 and L4 headers are and what they say.
//! Every access is bounds-checked against the frame's end, which is what the verifier needs
//! and what makes a truncated packet at any offset fall out as "not ours" (pass). Lengths the
//! headers claim are checked against what arrived, so a packet that lies about them is passed
//! untouched rather than translated by guesswork.
use core::{ffi::c_void, mem::size_of, ptr::read_volatile};

use aya_ebpf::{
    EbpfContext as _,
    helpers::bpf_xdp_get_buff_len,
    programs::{TcContext, XdpContext},
};
use lb_common::{
    FlowKey, IPPROTO_ICMP, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, Reason, csum::L4Sum,
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
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
}

/// Offsets the programs ever use lie below this: Ethernet, two IPv4 headers with options
/// (an ICMP error quotes one) and the L4 headers. Saying so gives the verifier a bound on
/// offsets that were spilled to the stack, without which it rejects the pointer arithmetic.
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

/// Where a packet stands in its datagram.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Frag {
    /// Not fragmented.
    Whole,
    /// The first fragment (offset 0, more to come): it carries the L4 header.
    First(u16),
    /// A later fragment: no L4 header, its ports are in `lb_frags`.
    Later(u16),
}

/// A parsed IPv4 packet of a protocol the balancer translates.
#[derive(Clone, Copy)]
pub struct Packet {
    /// The tuple as it stands in the packet (network byte order). A later fragment's ports are
    /// 0 until `frag::follow` fills them in.
    pub key: FlowKey,
    /// Offset of the L4 header (of the ports).
    pub l4_off: usize,
    /// The L4 checksum translating addresses or ports must update; `None` for a later fragment.
    pub l4: L4Sum,
    /// IPv4 total length, for the byte counters.
    pub len: u16,
    /// TCP flags (0 for other protocols and later fragments).
    pub tcp_flags: u8,
    pub frag: Frag,
    /// The L4 checksum field as found, and the pseudo-header seed it would hold if it were
    /// CHECKSUM_PARTIAL (TCP/UDP only), for XDP's rule in `nat::xdp_can_rewrite`.
    pub check: u16,
    pub seed: u16,
}

/// An ICMP error quoting a packet of some flow: the outer packet (ports 0) and the quoted one.
#[derive(Clone, Copy)]
pub struct IcmpError {
    pub outer: Packet,
    /// Offsets of the quoted IPv4 and L4 headers.
    pub inner_l3_off: usize,
    pub inner_l4_off: usize,
    /// The quoted tuple (ports included: an ICMP error quotes at least 8 bytes of L4).
    pub inner: FlowKey,
}

pub enum Parsed {
    Flow(Packet),
    IcmpError(IcmpError),
}

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETERPROB: u8 = 12;

/// Parses `f` as Ethernet + IPv4 + (TCP | UDP | SCTP | ICMP error). The error is why the
/// balancer leaves the packet alone: not IPv4 or not a protocol it translates (including ICMP
/// messages that are not errors), or headers that are cut short or lie about their lengths.
#[inline(always)]
pub fn packet(f: &impl Frame) -> Result<Parsed, Reason> {
    f.ensure(L3_OFF + Ipv4Hdr::LEN);
    let eth: EthHdr = read(f, 0).ok_or(Reason::Malformed)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return Err(Reason::NotIpv4);
    }
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
        return Err(Reason::NotIpv4);
    }
    let frags = u16::from_be_bytes(ip.frags);
    let id = u16::from_be_bytes(ip.id);
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
    let mut p = Packet {
        key,
        l4_off,
        l4: L4Sum::None,
        len,
        tcp_flags: 0,
        frag,
        check: 0,
        seed: 0,
    };
    if let Frag::Later(_) = frag {
        // ICMP is never translated by fragment (an error quotes from the first one).
        return if proto == IPPROTO_ICMP {
            Err(Reason::NotIpv4)
        } else {
            Ok(Parsed::Flow(p))
        };
    }
    let l4_len = usize::from(len) - ihl;
    f.ensure(l4_off + L4_MAX);
    match proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => {
            let hdr = match proto {
                IPPROTO_TCP => 20,
                IPPROTO_UDP => 8,
                _ => 12,
            };
            if l4_len < hdr {
                return Err(Reason::Malformed);
            }
            let ports: [u16; 2] = read(f, l4_off).ok_or(Reason::Malformed)?;
            p.key.sport = ports[0];
            p.key.dport = ports[1];
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
                p.seed =
                    lb_common::csum::pseudo_seed(p.key.saddr, p.key.daddr, proto, l4_len as u16);
            }
            Ok(Parsed::Flow(p))
        }
        _ => {
            let icmp: [u8; 8] = read(f, l4_off).ok_or(Reason::Malformed)?;
            if !matches!(
                icmp[0],
                ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETERPROB
            ) {
                return Err(Reason::NotIpv4);
            }
            let inner_l3_off = l4_off + ICMP_HDR;
            f.ensure(inner_l3_off + 60 + 8);
            let inner_ip: Ipv4Hdr = read(f, inner_l3_off).ok_or(Reason::Malformed)?;
            let inner_ihl = header_len(&inner_ip).ok_or(Reason::Malformed)?;
            if !matches!(inner_ip.proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP) {
                return Err(Reason::NotIpv4);
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
    }
}

#[inline(always)]
fn header_len(ip: &Ipv4Hdr) -> Option<usize> {
    let ihl = usize::from(ip.vihl & 0x0f) * 4;
    (ip.vihl >> 4 == 4 && ihl >= Ipv4Hdr::LEN).then_some(ihl)
}
