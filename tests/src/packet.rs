//! Packet builders shared by every program-level test, so that no case writes bytes by hand.
//! Checksums here are computed from scratch (RFC 1071 over the whole header/pseudo-header),
//! independently of the programs' incremental updates, so a test that compares them checks
//! the dataplane against a second implementation.
use std::net::Ipv4Addr;

pub const ETH_P_IP: u16 = 0x0800;

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
            payload: b"hello".to_vec(),
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
                h.extend([0x50, 0x02]); // data offset 5, SYN
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
            p => panic!("builder does not know protocol {p}"),
        };
        let mut frame = Vec::with_capacity(14 + 20 + l4.len());
        frame.extend(self.dst_mac);
        frame.extend(self.src_mac);
        frame.extend(ETH_P_IP.to_be_bytes());
        let total = (20 + l4.len()) as u16;
        let mut ip = vec![0x45, 0];
        ip.extend(total.to_be_bytes());
        ip.extend([0x12, 0x34, 0x40, 0x00]); // id, DF
        ip.extend([self.ttl, self.proto, 0, 0]);
        ip.extend(self.saddr.octets());
        ip.extend(self.daddr.octets());
        let c = checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        frame.extend(&ip);
        let l4_off = frame.len();
        frame.extend(&l4);
        let csum_at = l4_off + if self.proto == 6 { 16 } else { 6 };
        let c = l4_checksum(&frame[14..]);
        frame[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
        frame
    }
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
