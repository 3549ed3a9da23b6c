//! Header parsing, and nothing else: where the IPv4 and L4 headers are and what they say.
//! Every access is bounds-checked against the frame's end, which is what the verifier needs
//! and what makes a truncated packet at any offset fall out as "not ours" (pass).
use core::{mem::size_of, ptr::read_volatile};

use aya_ebpf::programs::{TcContext, XdpContext};

use crate::csum::pseudo_seed;
use lb_common::{FlowKey, IPPROTO_ICMP, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

/// A packet buffer the programs can read and write directly.
///
/// `start` and `end` are read with volatile loads: otherwise LLVM reuses an earlier load and
/// drops a bounds check it can prove redundant, while the verifier (which tracks each register
/// separately, and forgets ranges across helper calls and spills) cannot, and rejects the
/// access.
pub trait Frame {
    fn start(&self) -> usize;
    fn end(&self) -> usize;
}

impl Frame for XdpContext {
    #[inline(always)]
    fn start(&self) -> usize {
        // SAFETY: ctx is the program's valid context for the whole run.
        unsafe { read_volatile(&(*self.ctx).data) as usize }
    }
    #[inline(always)]
    fn end(&self) -> usize {
        unsafe { read_volatile(&(*self.ctx).data_end) as usize }
    }
}

impl Frame for TcContext {
    #[inline(always)]
    fn start(&self) -> usize {
        // SAFETY: the skb is the program's valid context for the whole run.
        unsafe { read_volatile(&(*self.skb.skb).data) as usize }
    }
    #[inline(always)]
    fn end(&self) -> usize {
        unsafe { read_volatile(&(*self.skb.skb).data_end) as usize }
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
pub const SADDR_OFF: usize = L3_OFF + 12;
pub const DADDR_OFF: usize = L3_OFF + 16;
pub const IP_CSUM_OFF: usize = L3_OFF + 10;

/// A parsed IPv4 packet of a protocol the balancer translates.
#[derive(Clone, Copy)]
pub struct Packet {
    /// The tuple as it stands in the packet (network byte order).
    pub key: FlowKey,
    /// Offset of the L4 header.
    pub l4_off: usize,
    /// The L4 checksum translating addresses or ports must update, if there is one.
    pub l4_csum: Option<L4Csum>,
    /// IPv4 total length, for the byte counters.
    pub len: u16,
}

#[derive(Clone, Copy)]
pub struct L4Csum {
    pub off: usize,
    pub udp: bool,
    /// The field holds a CHECKSUM_PARTIAL seed, not a full checksum (see `csum::pseudo_seed`).
    pub partial: bool,
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

/// Parses `f` as Ethernet + IPv4 + (TCP | UDP | SCTP | ICMP error). `None` is every packet the
/// balancer leaves alone: not IPv4, a fragment (without reassembly a later fragment cannot be
/// matched to its flow, so translating only the first would split the datagram), another
/// protocol, an ICMP message that is not an error, or a header cut short.
#[inline(always)]
pub fn packet(f: &impl Frame) -> Option<Parsed> {
    let eth: EthHdr = read(f, 0)?;
    if eth.ether_type != EtherType::Ipv4 as u16 {
        return None;
    }
    let ip: Ipv4Hdr = read(f, L3_OFF)?;
    let (proto, ihl) = ipv4_header(&ip)?;
    let l4_off = L3_OFF + ihl;
    let len = u16::from_be_bytes(ip.tot_len);
    let mut key = FlowKey {
        saddr: u32::from_ne_bytes(ip.src_addr),
        daddr: u32::from_ne_bytes(ip.dst_addr),
        proto,
        ..Default::default()
    };
    match proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => {
            let ports: [u16; 2] = read(f, l4_off)?;
            key.sport = ports[0];
            key.dport = ports[1];
            let csum_off = match proto {
                IPPROTO_TCP => l4_off + 16,
                IPPROTO_UDP => l4_off + 6,
                // SCTP's CRC32c covers neither addresses nor a pseudo-header.
                _ => {
                    return Some(Parsed::Flow(Packet {
                        key,
                        l4_off,
                        l4_csum: None,
                        len,
                    }));
                }
            };
            let check: u16 = read(f, csum_off)?;
            let seed = pseudo_seed(key.saddr, key.daddr, proto, len.wrapping_sub(ihl as u16));
            let l4_csum = L4Csum {
                off: csum_off,
                udp: proto == IPPROTO_UDP,
                partial: check == seed,
            };
            Some(Parsed::Flow(Packet {
                key,
                l4_off,
                l4_csum: Some(l4_csum),
                len,
            }))
        }
        IPPROTO_ICMP => {
            let icmp: [u8; 8] = read(f, l4_off)?;
            if !matches!(
                icmp[0],
                ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETERPROB
            ) {
                return None;
            }
            let inner_l3_off = l4_off + 8;
            let inner_ip: Ipv4Hdr = read(f, inner_l3_off)?;
            let (inner_proto, inner_ihl) = quoted_header(&inner_ip)?;
            let inner_l4_off = inner_l3_off + inner_ihl;
            let ports: [u16; 2] = read(f, inner_l4_off)?;
            let inner = FlowKey {
                saddr: u32::from_ne_bytes(inner_ip.src_addr),
                daddr: u32::from_ne_bytes(inner_ip.dst_addr),
                sport: ports[0],
                dport: ports[1],
                proto: inner_proto,
                ..Default::default()
            };
            // ICMP's checksum has no pseudo-header: the outer addresses are not under it.
            let outer = Packet {
                key,
                l4_off,
                l4_csum: None,
                len,
            };
            Some(Parsed::IcmpError(IcmpError {
                outer,
                inner_l3_off,
                inner_l4_off,
                inner,
            }))
        }
        _ => None,
    }
}

/// Protocol and header length of an unfragmented IPv4 header carrying TCP, UDP, SCTP or ICMP.
#[inline(always)]
fn ipv4_header(ip: &Ipv4Hdr) -> Option<(u8, usize)> {
    let ihl = header_len(ip)?;
    // MF set or a non-zero offset: a fragment.
    if u16::from_be_bytes(ip.frags) & 0x3fff != 0 {
        return None;
    }
    match ip.proto {
        p @ (IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP | IPPROTO_ICMP) => Some((p, ihl)),
        _ => None,
    }
}

/// Protocol and header length of the IPv4 header an ICMP error quotes, if it is of a flow
/// the balancer could have translated (TCP, UDP or SCTP).
#[inline(always)]
fn quoted_header(ip: &Ipv4Hdr) -> Option<(u8, usize)> {
    let ihl = header_len(ip)?;
    match ip.proto {
        p @ (IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP) => Some((p, ihl)),
        _ => None,
    }
}

#[inline(always)]
fn header_len(ip: &Ipv4Hdr) -> Option<usize> {
    let ihl = usize::from(ip.vihl & 0x0f) * 4;
    (ip.vihl >> 4 == 4 && ihl >= Ipv4Hdr::LEN).then_some(ihl)
}
