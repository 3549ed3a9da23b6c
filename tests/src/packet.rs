//! Packet builders shared by every program-level test, so that no case writes bytes by hand.
//! Checksums here are computed from scratch (RFC 1071 over the whole header/pseudo-header),
//! independently of the programs' incremental updates, so a test that compares them checks
//! the dataplane against a second implementation.
use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_P_IP: u16 = 0x0800;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

/// RFC 1071 one's-complement sum of `data`, folded, not yet inverted.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The Internet checksum of `data` (as it goes in the header).
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum16(data, 0))
}

/// An Ethernet + IPv4 + TCP/UDP frame with valid IP and L4 checksums.
#[derive(Clone, Debug)]
pub struct Ipv4Packet {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub saddr: Ipv4Addr,
    pub daddr: Ipv4Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub ttl: u8,
    /// IP options (a multiple of 4 bytes), between the fixed header and L4.
    pub options: Vec<u8>,
    /// The flags + fragment offset field (DF by default).
    pub frag: u16,
    /// The IPv4 identification field.
    pub id: u16,
    /// TCP flags (SYN by default).
    pub tcp_flags: u8,
    /// Stores this L4 checksum instead of the computed one (e.g. `Some(0)`: UDP without one,
    /// or SCTP with its CRC32c left to the device).
    pub l4_csum: Option<u16>,
    pub payload: Vec<u8>,
}

/// `reply()` of a packet builder: the same packet in the other direction (addresses, ports
/// and MACs swapped), `$more` on what stays.
macro_rules! reply {
    ($more:literal) => {
        #[doc = concat!("The same packet in the other direction (addresses, ports and MACs swapped", $more, ").")]
        pub fn reply(&self) -> Self {
            Self {
                src_mac: self.dst_mac,
                dst_mac: self.src_mac,
                saddr: self.daddr,
                daddr: self.saddr,
                sport: self.dport,
                dport: self.sport,
                ..self.clone()
            }
        }
    };
}

impl Ipv4Packet {
    pub fn tcp(saddr: Ipv4Addr, sport: u16, daddr: Ipv4Addr, dport: u16) -> Self {
        Self {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            saddr,
            daddr,
            proto: 6,
            sport,
            dport,
            ttl: 64,
            options: Vec::new(),
            frag: 0x4000,
            id: 0x1234,
            tcp_flags: TCP_SYN,
            l4_csum: None,
            payload: b"hello".to_vec(),
        }
    }

    pub fn udp(saddr: Ipv4Addr, sport: u16, daddr: Ipv4Addr, dport: u16) -> Self {
        Self {
            proto: 17,
            ..Self::tcp(saddr, sport, daddr, dport)
        }
    }

    pub fn sctp(saddr: Ipv4Addr, sport: u16, daddr: Ipv4Addr, dport: u16) -> Self {
        Self {
            proto: 132,
            ..Self::tcp(saddr, sport, daddr, dport)
        }
    }

    /// A later fragment of this packet's datagram: its IPv4 header (same addresses, protocol
    /// and id) with fragment offset `offset8` (in 8-byte units, as the header counts it), MF
    /// as `more` says, and `data` (no L4 header: that is in the first fragment).
    pub fn later_fragment(&self, offset8: u16, more: bool, data: &[u8]) -> Vec<u8> {
        let frag = offset8 | if more { 0x2000 } else { 0 };
        let mut frame = eth_header(self.dst_mac, self.src_mac, ETH_P_IP);
        frame.extend(ipv4_header(
            self.saddr,
            self.daddr,
            self.proto,
            self.ttl,
            frag,
            self.id,
            &self.options,
            data.len(),
        ));
        frame.extend(data);
        frame
    }

    reply!("");

    pub fn build(&self) -> Vec<u8> {
        let l4 = l4_segment(
            self.proto,
            self.sport,
            self.dport,
            self.tcp_flags,
            &self.payload,
        );
        assert!(self.options.len().is_multiple_of(4) && self.options.len() <= 40);
        let mut frame = eth_header(self.dst_mac, self.src_mac, ETH_P_IP);
        frame.extend(ipv4_header(
            self.saddr,
            self.daddr,
            self.proto,
            self.ttl,
            self.frag,
            self.id,
            &self.options,
            l4.len(),
        ));
        let l4_off = frame.len();
        frame.extend(&l4);
        if let Some(at) = l4_csum_offset(self.proto) {
            let c = self.l4_csum.unwrap_or_else(|| l4_checksum(&frame[14..]));
            frame[l4_off + at..l4_off + at + 2].copy_from_slice(&c.to_be_bytes());
        }
        if self.proto == 132 {
            let crc = sctp_crc(self.l4_csum, &frame[l4_off..]);
            frame[l4_off + 8..l4_off + 12].copy_from_slice(&crc);
        }
        frame
    }
}

/// A TCP (SYN-style fixed header, flags as given), UDP or SCTP segment with its checksum
/// field 0: the builders fill it in over their family's pseudo-header.
fn l4_segment(proto: u8, sport: u16, dport: u16, tcp_flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(20 + payload.len());
    h.extend(sport.to_be_bytes());
    h.extend(dport.to_be_bytes());
    match proto {
        6 => {
            h.extend(1u32.to_be_bytes()); // seq
            h.extend(0u32.to_be_bytes()); // ack
            h.extend([0x50, tcp_flags]); // data offset 5
            h.extend(64240u16.to_be_bytes());
            h.extend([0, 0, 0, 0]); // checksum, urgent
        }
        17 => {
            h.extend(((8 + payload.len()) as u16).to_be_bytes());
            h.extend([0, 0]);
        }
        132 => {
            h.extend(0x0102_0304u32.to_be_bytes()); // verification tag
            h.extend([0; 4]); // CRC32c
        }
        p => panic!("builder does not know protocol {p}"),
    }
    h.extend(payload);
    h
}

fn eth_header(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut frame = Vec::with_capacity(128);
    frame.extend(dst);
    frame.extend(src);
    frame.extend(ethertype.to_be_bytes());
    frame
}

#[allow(clippy::too_many_arguments)]
fn ipv4_header(
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    proto: u8,
    ttl: u8,
    frag: u16,
    id: u16,
    options: &[u8],
    l4_len: usize,
) -> Vec<u8> {
    let ihl = (20 + options.len()) / 4;
    let total = (ihl * 4 + l4_len) as u16;
    let mut ip = vec![0x40 | ihl as u8, 0];
    ip.extend(total.to_be_bytes());
    ip.extend(id.to_be_bytes());
    ip.extend(frag.to_be_bytes());
    ip.extend([ttl, proto, 0, 0]);
    ip.extend(saddr.octets());
    ip.extend(daddr.octets());
    ip.extend(options);
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip
}

/// Where the checksum sits in a TCP or UDP header (SCTP and ICMP are not pseudo-header sums).
fn l4_csum_offset(proto: u8) -> Option<usize> {
    match proto {
        6 => Some(16),
        17 => Some(6),
        _ => None,
    }
}

/// An ICMP error (`icmp_type`/`code`, the 4 bytes after the checksum in `rest`) from `saddr`
/// to `daddr`, quoting the first 28 bytes of the IPv4 packet `quoted` (header + 8 bytes, as
/// RFC 792 asks at least).
pub fn icmp_error(
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    icmp_type: u8,
    code: u8,
    rest: u32,
    quoted: &[u8],
) -> Vec<u8> {
    let ihl = usize::from(quoted[0] & 0x0f) * 4;
    let quote = &quoted[..(ihl + 8).min(quoted.len())];
    icmp_message(saddr, daddr, icmp_type, code, rest, quote)
}

/// An ICMP message (`icmp_type`/`code`, the 4 bytes after the checksum in `rest`) from `saddr`
/// to `daddr` whose body is `body` as it is: an error's quote of any length, an echo's data.
pub fn icmp_message(
    saddr: Ipv4Addr,
    daddr: Ipv4Addr,
    icmp_type: u8,
    code: u8,
    rest: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut icmp = vec![icmp_type, code, 0, 0];
    icmp.extend(rest.to_be_bytes());
    icmp.extend(body);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut frame = eth_header([0x02, 0, 0, 0, 0, 0x02], [0x02, 0, 0, 0, 0, 0x01], ETH_P_IP);
    frame.extend(ipv4_header(saddr, daddr, 1, 64, 0, 0x1234, &[], icmp.len()));
    frame.extend(icmp);
    frame
}

/// An ARP request (who has `target`? tell `sender`).
pub fn arp_request(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut frame = eth_header([0xff; 6], [0x02, 0, 0, 0, 0, 0x01], 0x0806);
    frame.extend([0, 1, 0x08, 0, 6, 4, 0, 1]);
    frame.extend([0x02, 0, 0, 0, 0, 0x01]);
    frame.extend(sender.octets());
    frame.extend([0; 6]);
    frame.extend(target.octets());
    frame
}

/// An IPv6 TCP SYN between two addresses no service has.
pub fn ipv6_tcp_syn(dport: u16) -> Vec<u8> {
    Ipv6Packet {
        payload: Vec::new(),
        ..Ipv6Packet::tcp(
            Ipv6Addr::from([0xfd; 16]),
            40000,
            Ipv6Addr::from([0xfe; 16]),
            dport,
        )
    }
    .build()
}

/// The IPv4 packet of an Ethernet frame.
pub fn ip_of(frame: &[u8]) -> &[u8] {
    &frame[14..]
}

/// The folded, non-inverted pseudo-header sum of `ip`'s L4 segment: what a sender with
/// checksum offload leaves in the TCP/UDP checksum field (CHECKSUM_PARTIAL) for the device.
pub fn pseudo_seed(ip: &[u8]) -> u16 {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend(&ip[12..20]);
    pseudo.extend([0, ip[9]]);
    pseudo.extend(((total - ihl) as u16).to_be_bytes());
    fold(sum16(&pseudo, 0))
}

/// Checks every checksum of an IPv4 frame from scratch: the IP header's, TCP/UDP's over the
/// pseudo-header (a UDP 0 means "none" and passes), SCTP's CRC32c (0, left to the device,
/// passes), ICMP's over the whole message and, in an ICMP error, the quoted IP header's.
pub fn verify(frame: &[u8]) -> Result<(), String> {
    let ip = ip_of(frame);
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if checksum(&ip[..ihl]) != 0 {
        return Err(format!(
            "IP header checksum {:#06x} is wrong",
            u16::from_be_bytes([ip[10], ip[11]])
        ));
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let seg = &ip[ihl..total];
    if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
        // A later fragment: its L4 checksum is in the first one.
        return Ok(());
    }
    match ip[9] {
        p @ (6 | 17) => {
            let at = l4_csum_offset(p).unwrap();
            if p == 17 && seg[at..at + 2] == [0, 0] {
                return Ok(());
            }
            check_stored(seg, at, l4_checksum(ip))?;
        }
        132 => check_sctp(seg)?,
        1 => {
            if checksum(seg) != 0 {
                return Err("ICMP checksum is wrong".into());
            }
            if matches!(seg[0], 3 | 11 | 12) {
                let quoted = &seg[8..];
                let qihl = usize::from(quoted[0] & 0x0f) * 4;
                if checksum(&quoted[..qihl]) != 0 {
                    return Err("quoted IP header checksum is wrong".into());
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// The TCP/UDP checksum of the L4 segment of `ip` (an IPv4 packet without options or with),
/// over the pseudo-header, as a receiver computes it: what a valid packet stores.
pub fn l4_checksum(ip: &[u8]) -> u16 {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let seg = &ip[ihl..total];
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend(&ip[12..20]);
    pseudo.extend([0, ip[9]]);
    pseudo.extend((seg.len() as u16).to_be_bytes());
    over_pseudo_header(&pseudo, ip[9], seg, l4_csum_offset(ip[9]).unwrap())
}

/// The checksum a receiver computes for `seg` (its checksum field, at `at`, taken as 0) over
/// `pseudo`, its family's pseudo-header. UDP transmits a computed 0 as 0xffff (0 means "no
/// checksum" on IPv4, and is invalid on IPv6).
fn over_pseudo_header(pseudo: &[u8], proto: u8, seg: &[u8], at: usize) -> u16 {
    let mut zeroed = seg.to_vec();
    zeroed[at..at + 2].copy_from_slice(&[0, 0]);
    let c = !fold(sum16(&zeroed, sum16(pseudo, 0)));
    if proto == 17 && c == 0 { 0xffff } else { c }
}

/// Whether the checksum stored at `at` of `seg` is `want`.
fn check_stored(seg: &[u8], at: usize, want: u16) -> Result<(), String> {
    let stored = u16::from_be_bytes([seg[at], seg[at + 1]]);
    if stored != want {
        return Err(format!("L4 checksum {stored:#06x}, should be {want:#06x}"));
    }
    Ok(())
}

/// Whether an SCTP packet's CRC32c holds (0, left to the device, passes).
fn check_sctp(seg: &[u8]) -> Result<(), String> {
    let stored = [seg[8], seg[9], seg[10], seg[11]];
    let want = crate::crc32c::sctp_checksum(seg);
    if stored != [0; 4] && stored != want {
        return Err(format!("SCTP CRC32c {stored:02x?}, should be {want:02x?}"));
    }
    Ok(())
}

/// The CRC32c field of an SCTP packet `seg` as a builder stores it: `l4_csum` as given
/// (`Some(0)` leaves it 0, as a sender with CRC offload does), or computed.
fn sctp_crc(l4_csum: Option<u16>, seg: &[u8]) -> [u8; 4] {
    match l4_csum {
        Some(c) => u32::from(c).to_le_bytes(),
        None => crate::crc32c::sctp_checksum(seg),
    }
}

pub const ETH_P_IPV6: u16 = 0x86dd;

/// An IPv6 extension header of [`Ipv6Packet::exts`], in chain order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    /// Hop-by-hop options, `units` × 8 bytes beyond its first 8 (the length field), PadN.
    HopByHop(u8),
    /// A routing header (type 4, segment routing, no segments left), `units` beyond its first 8.
    Routing(u8),
    /// Destination options, `units` beyond its first 8.
    DestOpts(u8),
    /// AH with `icv_words` 4-byte words of integrity value after its fixed 12 bytes.
    Ah(u8),
    /// A fragment header: offset in 8-byte units, more fragments, identification.
    Fragment { offset8: u16, more: bool, id: u32 },
    /// Any other next-header value laid out as options are (`units` beyond its first 8):
    /// mobility (135), HIP (139), shim6 (140), the experimental 253 and 254.
    Other { next_header: u8, units: u8 },
}

impl Ext {
    pub fn next_header(self) -> u8 {
        match self {
            Ext::HopByHop(_) => 0,
            Ext::Routing(_) => 43,
            Ext::DestOpts(_) => 60,
            Ext::Ah(_) => 51,
            Ext::Fragment { .. } => 44,
            Ext::Other { next_header, .. } => next_header,
        }
    }

    /// The header's bytes, its own next-header field `next`.
    fn bytes(self, next: u8) -> Vec<u8> {
        let padded = |units: u8, fill: &[u8]| {
            let mut h = vec![next, units];
            h.extend(fill);
            // PadN over the rest: type 1, length.
            let rest = (usize::from(units) + 1) * 8 - h.len();
            h.extend([1, (rest - 2) as u8]);
            h.resize((usize::from(units) + 1) * 8, 0);
            h
        };
        match self {
            Ext::HopByHop(u) | Ext::DestOpts(u) | Ext::Other { units: u, .. } => padded(u, &[]),
            Ext::Routing(u) => {
                // Routing type 4, segments left 0, then type-specific data (zeros).
                let mut h = vec![next, u, 4, 0];
                h.resize((usize::from(u) + 1) * 8, 0);
                h
            }
            Ext::Ah(icv) => {
                let len = 12 + 4 * usize::from(icv);
                let mut h = vec![next, (len / 4 - 2) as u8, 0, 0];
                h.extend(0x0000_1000u32.to_be_bytes()); // SPI
                h.extend(1u32.to_be_bytes()); // sequence number
                h.resize(len, 0xab);
                h
            }
            Ext::Fragment { offset8, more, id } => {
                let mut h = vec![next, 0];
                h.extend((offset8 << 3 | u16::from(more)).to_be_bytes());
                h.extend(id.to_be_bytes());
                h
            }
        }
    }
}

/// An Ethernet + IPv6 (+ extension headers) + TCP/UDP/SCTP/ICMPv6 frame with a valid L4
/// checksum over the IPv6 pseudo-header (RFC 8200 8.1), computed from scratch.
#[derive(Clone, Debug)]
pub struct Ipv6Packet {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub saddr: Ipv6Addr,
    pub daddr: Ipv6Addr,
    pub hop_limit: u8,
    pub exts: Vec<Ext>,
    /// 6, 17, 132 or 58 (ICMPv6: `icmp` and `payload` make the message); anything else
    /// carries `payload` as it is.
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub tcp_flags: u8,
    /// ICMPv6 type, code and the 4 bytes after the checksum.
    pub icmp: (u8, u8, u32),
    /// Stores this L4 checksum instead of the computed one.
    pub l4_csum: Option<u16>,
    /// Replaces the upper-layer segment with these bytes as they are (a later fragment's data).
    pub raw: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

impl Ipv6Packet {
    pub fn tcp(saddr: Ipv6Addr, sport: u16, daddr: Ipv6Addr, dport: u16) -> Self {
        Self {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            saddr,
            daddr,
            hop_limit: 64,
            exts: Vec::new(),
            proto: 6,
            sport,
            dport,
            tcp_flags: TCP_SYN,
            icmp: (0, 0, 0),
            l4_csum: None,
            raw: None,
            payload: b"hello".to_vec(),
        }
    }

    pub fn udp(saddr: Ipv6Addr, sport: u16, daddr: Ipv6Addr, dport: u16) -> Self {
        Self {
            proto: 17,
            ..Self::tcp(saddr, sport, daddr, dport)
        }
    }

    pub fn sctp(saddr: Ipv6Addr, sport: u16, daddr: Ipv6Addr, dport: u16) -> Self {
        Self {
            proto: 132,
            ..Self::tcp(saddr, sport, daddr, dport)
        }
    }

    /// An ICMPv6 message `(type, code, rest)` whose body is `body`.
    pub fn icmp6(saddr: Ipv6Addr, daddr: Ipv6Addr, icmp: (u8, u8, u32), body: &[u8]) -> Self {
        Self {
            proto: 58,
            icmp,
            payload: body.to_vec(),
            ..Self::tcp(saddr, 0, daddr, 0)
        }
    }

    /// The upper-layer segment, its checksum filled in.
    fn segment(&self) -> Vec<u8> {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let mut seg = match self.proto {
            6 | 17 | 132 => l4_segment(
                self.proto,
                self.sport,
                self.dport,
                self.tcp_flags,
                &self.payload,
            ),
            58 => {
                let (t, c, rest) = self.icmp;
                let mut m = vec![t, c, 0, 0];
                m.extend(rest.to_be_bytes());
                m.extend(&self.payload);
                m
            }
            _ => self.payload.clone(),
        };
        match self.proto {
            132 => {
                let crc = sctp_crc(self.l4_csum, &seg);
                seg[8..12].copy_from_slice(&crc);
            }
            p => {
                if let Some(at) = l4_csum_offset6(p) {
                    let c = self
                        .l4_csum
                        .unwrap_or_else(|| l4_checksum6(self.saddr, self.daddr, p, &seg));
                    seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
                }
            }
        }
        seg
    }

    pub fn build(&self) -> Vec<u8> {
        let seg = self.segment();
        let mut exts = Vec::new();
        for (i, e) in self.exts.iter().enumerate() {
            let next = self.exts.get(i + 1).map_or(self.proto, |n| n.next_header());
            exts.extend(e.bytes(next));
        }
        let first = self.exts.first().map_or(self.proto, |e| e.next_header());
        let mut frame = eth_header(self.dst_mac, self.src_mac, ETH_P_IPV6);
        frame.extend([0x60, 0, 0, 0]);
        frame.extend(((exts.len() + seg.len()) as u16).to_be_bytes());
        frame.extend([first, self.hop_limit]);
        frame.extend(self.saddr.octets());
        frame.extend(self.daddr.octets());
        frame.extend(exts);
        frame.extend(seg);
        frame
    }

    reply!("; extension headers as they are");

    /// Where the upper-layer header starts in the built frame.
    pub fn l4_offset(&self) -> usize {
        let exts: usize = self.exts.iter().map(|e| e.bytes(0).len()).sum();
        14 + 40 + exts
    }
}

/// Where the checksum sits in a TCP, UDP or ICMPv6 header.
fn l4_csum_offset6(proto: u8) -> Option<usize> {
    match proto {
        58 => Some(2),
        p => l4_csum_offset(p),
    }
}

/// The TCP/UDP/ICMPv6 checksum of `seg` over the IPv6 pseudo-header, as a receiver computes
/// it (the field is taken as 0). UDP's 0 is transmitted as 0xffff: on IPv6 a UDP checksum of
/// 0 is invalid (RFC 8200 8.1), not "none".
pub fn l4_checksum6(saddr: Ipv6Addr, daddr: Ipv6Addr, proto: u8, seg: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40);
    pseudo.extend(saddr.octets());
    pseudo.extend(daddr.octets());
    pseudo.extend((seg.len() as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, proto]);
    let at = l4_csum_offset6(proto).expect("a pseudo-header checksum");
    over_pseudo_header(&pseudo, proto, seg, at)
}

/// Checks the L4 checksum of an IPv6 frame from scratch, walking its extension headers
/// (hop-by-hop, routing, destination options, AH, fragment) to the upper layer: TCP, UDP (0 is
/// wrong on IPv6) and ICMPv6 over the pseudo-header, SCTP's CRC32c (0, left to the device,
/// passes). A later fragment carries no L4 header and passes.
pub fn verify6(frame: &[u8]) -> Result<(), String> {
    let ip = ip_of(frame);
    let end = 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&ip[at..at + 16]).unwrap());
    let (mut next, mut off) = (ip[6], 40);
    while matches!(next, 0 | 43 | 44 | 51 | 60) {
        let h = &ip[off..];
        let len = match next {
            51 => (usize::from(h[1]) + 2) * 4,
            44 if u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0 => return Ok(()),
            44 => 8,
            _ => (usize::from(h[1]) + 1) * 8,
        };
        next = h[0];
        off += len;
    }
    let seg = &ip[off..end];
    match next {
        p @ (6 | 17 | 58) => check_stored(
            seg,
            l4_csum_offset6(p).unwrap(),
            l4_checksum6(addr(8), addr(24), p, seg),
        )?,
        132 => check_sctp(seg)?,
        _ => {}
    }
    Ok(())
}
