//! CRC32c (Castagnoli, reflected) computed from scratch, byte by byte through a 256-entry table,
//! so that a program test can check the dataplane's incremental SCTP checksum update
//! (`lb_common::crc32c`, bitwise polynomial arithmetic) against a second, independent
//! implementation over the whole packet.

/// The Castagnoli generator, reflected.
const POLY: u32 = 0x82F6_3B78;

/// `TABLE[b]`: the CRC register after shifting the byte `b` through an otherwise zero register.
const TABLE: [u32; 256] = table();

const fn table() -> [u32; 256] {
    let mut table = [0; 256];
    let mut b = 0;
    while b < 256 {
        let mut crc = b as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            k += 1;
        }
        table[b] = crc;
        b += 1;
    }
    table
}

/// Runs `data` through the CRC register `crc` (no seeding, no final inversion).
fn feed(crc: u32, data: &[u8]) -> u32 {
    data.iter().fold(crc, |crc, &b| {
        (crc >> 8) ^ TABLE[usize::from((crc as u8) ^ b)]
    })
}

/// CRC32c of `data` as Linux's `crc32c(~0, ..)` followed by `~` computes it (RFC 3720 B.4).
pub fn crc32c(data: &[u8]) -> u32 {
    !feed(!0, data)
}

/// The checksum field of `sctp_packet` (common header + chunks), as Linux's
/// `sctp_compute_cksum` fills it: the CRC over the packet with the field (bytes 8..12) taken as
/// zero, stored least significant byte first. The packet's own field bytes are ignored.
///
/// Panics if the packet is shorter than the 12-byte common header.
pub fn sctp_checksum(sctp_packet: &[u8]) -> [u8; 4] {
    assert!(
        sctp_packet.len() >= 12,
        "an SCTP packet has a 12-byte common header, got {} bytes",
        sctp_packet.len()
    );
    let crc = feed(!0, &sctp_packet[..8]);
    let crc = feed(crc, &[0; 4]);
    (!feed(crc, &sctp_packet[12..])).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3720_vectors() {
        assert_eq!(crc32c(&[0x00; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFF; 32]), 0x62A8_AB43);
        let incrementing: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&incrementing), 0x46DD_794E);
        let decrementing: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&decrementing), 0x113F_DB5C);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn sctp_field_ignores_its_own_bytes_and_is_little_endian() {
        // A 40-byte INIT (ports 0, tag 0, IPv4 address parameter 127.0.0.1) whose field
        // scapy's SCTP regression tests pin as 40 2c 0b 5f on the wire.
        let mut init = [0u8; 40];
        init[12..16].copy_from_slice(&[0x01, 0x00, 0x00, 0x1c]);
        init[32..40].copy_from_slice(&[0x00, 0x05, 0x00, 0x08, 0x7f, 0x00, 0x00, 0x01]);
        assert_eq!(sctp_checksum(&init), [0x40, 0x2c, 0x0b, 0x5f]);
        init[8..12].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(sctp_checksum(&init), [0x40, 0x2c, 0x0b, 0x5f]);
        let mut zeroed = init;
        zeroed[8..12].fill(0);
        assert_eq!(sctp_checksum(&init), crc32c(&zeroed).to_le_bytes());
    }
}
