//! Packet builders shared by every program-level test, so that no case writes bytes by hand.
//! Checksums here are computed from scratch (RFC 1071 over the whole header/pseudo-header),
//! independently of the programs' incremental updates, so a test that compares them checks
//! the dataplane against a second implementation.
use std::net::Ipv4Addr;

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

    /// The same packet in the other direction (addresses, ports and MACs swapped).
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

    pub fn build(&self) -> Vec<u8> {
        let l4 = match self.proto {
            6 => {
                let mut h = Vec::with_capacity(20 + self.payload.len());
                h.extend(self.sport.to_be_bytes());
                h.extend(self.dport.to_be_bytes());
                h.extend(1u32.to_be_bytes()); // seq
                h.extend(0u32.to_be_bytes()); // ack
                h.extend([0x50, self.tcp_flags]); // data offset 5
                h.extend(64240u16.to_be_bytes());
                h.extend([0, 0, 0, 0]); // checksum, urgent
                h.extend(&self.payload);
                h
            }
            17 => {
                let len = (8 + self.payload.len()) as u16;
                let mut h = Vec::with_capacity(len as usize);
                h.extend(self.sport.to_be_bytes());
                h.extend(self.dport.to_be_bytes());
                h.extend(len.to_be_bytes());
                h.extend([0, 0]);
                h.extend(&self.payload);
                h
            }
            132 => {
                let mut h = Vec::with_capacity(12 + self.payload.len());
                h.extend(self.sport.to_be_bytes());
                h.extend(self.dport.to_be_bytes());
                h.extend(0x0102_0304u32.to_be_bytes()); // verification tag
                h.extend([0; 4]); // CRC32c, below
                h.extend(&self.payload);
                h
            }
            p => panic!("builder does not know protocol {p}"),
        };
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
            // `l4_csum: Some(0)` leaves the field 0, as a sender with CRC offload does.
            let crc = match self.l4_csum {
                Some(c) => u32::from(c).to_le_bytes(),
                None => crate::crc32c::sctp_checksum(&frame[l4_off..]),
            };
            frame[l4_off + 8..l4_off + 12].copy_from_slice(&crc);
        }
        frame
    }
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

/// An IPv6 TCP SYN (the programs are IPv4-only and must pass it untouched).
pub fn ipv6_tcp_syn(dport: u16) -> Vec<u8> {
    let mut frame = eth_header([0x02, 0, 0, 0, 0, 0x02], [0x02, 0, 0, 0, 0, 0x01], 0x86dd);
    frame.extend([0x60, 0, 0, 0, 0, 20, 6, 64]);
    frame.extend(std::iter::repeat_n(0xfd, 16));
    frame.extend(std::iter::repeat_n(0xfe, 16));
    frame.extend(40000u16.to_be_bytes());
    frame.extend(dport.to_be_bytes());
    frame.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xfa, 0xf0, 0, 0, 0, 0]);
    frame
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
            let stored = u16::from_be_bytes([seg[at], seg[at + 1]]);
            if p == 17 && stored == 0 {
                return Ok(());
            }
            let want = l4_checksum(ip);
            if stored != want {
                return Err(format!("L4 checksum {stored:#06x}, should be {want:#06x}"));
            }
        }
        132 => {
            let stored = [seg[8], seg[9], seg[10], seg[11]];
            let want = crate::crc32c::sctp_checksum(seg);
            if stored != [0; 4] && stored != want {
                return Err(format!("SCTP CRC32c {stored:02x?}, should be {want:02x?}"));
            }
        }
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
/// over the pseudo-header, as a receiver computes it. A valid packet's stored checksum makes
/// `verify_l4(ip)` true.
pub fn l4_checksum(ip: &[u8]) -> u16 {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let seg = &ip[ihl..total];
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend(&ip[12..20]);
    pseudo.extend([0, ip[9]]);
    pseudo.extend((seg.len() as u16).to_be_bytes());
    let csum_at = if ip[9] == 6 { 16 } else { 6 };
    let mut zeroed = seg.to_vec();
    zeroed[csum_at..csum_at + 2].copy_from_slice(&[0, 0]);
    let c = !fold(sum16(&zeroed, sum16(&pseudo, 0)));
    // UDP transmits a computed 0 as 0xffff (0 means "no checksum").
    if ip[9] == 17 && c == 0 { 0xffff } else { c }
}
