//! SCTP's CRC32c checksum (RFC 4960 §6.8, RFC 3309), updated in place when a port of the
//! common header is rewritten, without reading a byte of the rest of the packet.
//!
//! Why incremental: the programs cannot recompute the CRC over the packet. Its chunks may sit
//! in non-linear skb data or XDP fragments, and a loop over packet bytes costs the verifier
//! per byte. But a CRC is linear over GF(2): for two messages `A` and `B` of the same length,
//! `crc32c(A) ^ crc32c(B) == raw(A ^ B)`, where `raw` is the CRC with zero initial value and no
//! final inversion (the `!0` seed and the final `!` cancel out). A port rewrite makes `A ^ B`
//! zero except for the 2 changed bytes, so the correction depends only on those bytes
//! (`old ^ new`) and on how far before the end of the packet they stand.
//!
//! The math, in the bit order of the reflected CRC (the one Linux's `crc32c()` runs): a `u32`
//! `a` stands for the polynomial `Σ a_i · x^(31 - i)` over GF(2), so bit 0 is the coefficient of
//! x^31 and `1 << 31` is the polynomial 1; `P` is the Castagnoli generator, whose low 32
//! coefficients in this order are [`POLY`]. An `L`-byte message is the polynomial `M` in which
//! bit `j` (least significant first) of byte `k` is the coefficient of `x^(8(L - k) - 1 - j)`,
//! and `raw(M) = M · x^32 mod P`. Four bytes `d0 d1 d2 d3` at offset `k`, read as
//! `u32::from_le_bytes`, are a word `W` whose polynomial times `x^(8(L - k) - 32)` is their
//! contribution to `M`; hence their raw CRC is `W · x^(8(L - k)) mod P`. A 2-byte change is the
//! same with `d2 = d3 = 0` (then `W` is a multiple of `x^16`, so this holds down to `L - k = 2`).
//! Linux stores the CRC as `cpu_to_le32` (RFC 4960 appendix B: least significant byte first), so
//! the correction is XORed into the field as `to_le_bytes`.
//!
//! `x^(8n)` for the distance `n = L - k < 2^16` comes from square-and-multiply over the bits of
//! `n`: bit `i` multiplies by the constant `x^(8 · 2^i) mod P`. Multiplying by a constant is a
//! linear map of `W`, a 32×32 bit matrix computed at compile time ([`COLUMNS`]), so each step
//! XORs the matrix columns of `W`'s set bits: 16 steps × 32 columns, unrolled into straight-line
//! code with every column an immediate; no loop, no data-indexed table, no panic on any input.
//!
//! A column is selected by an integer multiplication, `(W & 2^j) · column >> j`, not by the
//! textbook mask `-(W >> j & 1) & column`. LLVM compiles that mask to `(W << k) s>> 63 & column`,
//! and kernels with commit bffacdb80b93 ("bpf: Recognize special arithmetic shift in the
//! verifier", in the 6.12+ stable series too) fork the verifier state on every AND of a register
//! in [-1, 0] with a constant: 2^32 paths per step, and the program is rejected at the
//! one-million-instruction limit. The multiplication gives the verifier nothing to fork on.

/// The Castagnoli generator `x^32 + …` without its `x^32` term, bit-reversed (bit `i` is the
/// coefficient of `x^(31 - i)`): `0x1EDC6F41` reflected.
pub const POLY: u32 = 0x82F6_3B78;

/// The polynomial 1 in the reflected representation.
const ONE: u32 = 1 << 31;

/// Largest SCTP packet the update accepts. Both the IPv4 total length and the IPv6 payload
/// length are 16-bit fields, so without jumbograms (which lb does not handle) no SCTP packet is
/// longer; the distance tables are sized for it.
pub const SCTP_MAX_LEN: u32 = 65535;

/// Bits of the distance from the changed bytes to the end of the packet (`<= SCTP_MAX_LEN`):
/// the levels of [`COLUMNS`], which [`shift`] lists one by one.
const DISTANCE_BITS: usize = 16;
const _: () = assert!(SCTP_MAX_LEN < 1 << DISTANCE_BITS && DISTANCE_BITS == 16);

/// Where the checksum field sits in the common header: the CRC is computed with these bytes
/// taken as zero, so a change to them is not a change of the checksummed message.
const CHECKSUM_START: u32 = 8;
const CHECKSUM_END: u32 = 12;

/// `a · x mod P`. Compile time and tests only: its `-(a & 1) & POLY` mask is the pattern the
/// module doc says the programs must not contain.
#[inline(always)]
const fn mul_x(a: u32) -> u32 {
    (a >> 1) ^ (POLY & (a & 1).wrapping_neg())
}

/// `a · b mod P` by shift-and-add. Compile time and tests only: the programs use the precomputed
/// [`COLUMNS`] instead, which halves the work per bit and needs no mask.
#[inline(always)]
const fn mul(a: u32, b: u32) -> u32 {
    let mut product = 0;
    let mut b = b;
    let mut i = 0;
    // Bit 31 - i of `a` is the coefficient of x^i, and `b` is `b · x^i` at that point.
    while i < 32 {
        product ^= b & ((a >> (31 - i)) & 1).wrapping_neg();
        b = mul_x(b);
        i += 1;
    }
    product
}

/// `COLUMNS[i][j] = x^(8 · 2^i) · x^(31 - j) mod P`: column `j` of the matrix that multiplies a
/// word by `x^(8 · 2^i)`, i.e. the product's share of the word's bit `j`.
const COLUMNS: [[u32; 32]; DISTANCE_BITS] = columns();

const fn columns() -> [[u32; 32]; DISTANCE_BITS] {
    let mut table = [[0; 32]; DISTANCE_BITS];
    // x^8, then each next power by squaring: x^(8 · 2^(i+1)) = (x^(8 · 2^i))^2.
    let mut power = ONE;
    let mut k = 0;
    while k < 8 {
        power = mul_x(power);
        k += 1;
    }
    let mut i = 0;
    while i < DISTANCE_BITS {
        let mut column = power;
        let mut j = 32;
        while j > 0 {
            j -= 1;
            table[i][j] = column;
            column = mul_x(column);
        }
        power = mul(power, power);
        i += 1;
    }
    table
}

/// Repeats `$body` once per listed index, with the index bound as a `usize` const: straight-line
/// code in which each table entry is a compile-time constant. Left as loops, LLVM does not unroll
/// the 16 × 32 steps of [`shift`] for BPF and reads [`COLUMNS`] from `.rodata` by a computed
/// index, at about 3.5 times the instructions per step.
macro_rules! unroll {
    ($i:ident in [$($n:literal)*] $body:block) => {
        $({
            const $i: usize = $n;
            $body
        })*
    };
}

/// `w · x^(8 · n) mod P` for `n < 2^16` (higher bits of `n` are ignored): the raw CRC of the
/// bytes `w.to_le_bytes()` standing `n` bytes before the end of a message (see the module doc).
/// Straight-line: `DISTANCE_BITS` × 32 multiply-and-XOR steps at most (a level whose bit of `n`
/// is clear may be skipped by a branch).
#[inline(always)]
fn shift(w: u32, n: u32) -> u32 {
    let mut w = w;
    unroll!(I in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15] {
        let mut product = 0;
        unroll!(J in [
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
            16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        ] {
            const COLUMN: u32 = COLUMNS[I][J];
            product ^= ((u64::from(w) & (1 << J)).wrapping_mul(u64::from(COLUMN)) >> J) as u32;
        });
        // A [-1, 0] mask again, but ANDed only with `product` and `w`, which come from packet
        // bytes the verifier does not know: no fork (and LLVM makes this select a branch).
        let take = ((n >> I) & 1).wrapping_neg();
        w = (product & take) | (w & !take);
    });
    w
}

/// The checksum field after the `width` bytes at `offset` changed by `diff` (their XOR, as
/// `u32::from_le_bytes` of the bytes, zero-padded). The one implementation behind both public
/// updates. Outside the contract (bytes past `len`, `len` over [`SCTP_MAX_LEN`], or bytes in
/// the checksum field itself) the field is returned untouched.
#[inline(always)]
fn update(field: [u8; 4], len: u32, offset: u32, width: u32, diff: u32) -> [u8; 4] {
    let in_packet = len <= SCTP_MAX_LEN && offset <= len && len.wrapping_sub(offset) >= width;
    let in_checksum = offset < CHECKSUM_END && offset.wrapping_add(width) > CHECKSUM_START;
    if !in_packet || in_checksum {
        return field;
    }
    let correction = shift(diff, len.wrapping_sub(offset));
    (u32::from_le_bytes(field) ^ correction).to_le_bytes()
}

/// The SCTP checksum field (its 4 bytes exactly as they stand in the packet) after the 2 bytes
/// at `offset` of the SCTP packet (offset counted from the start of the SCTP common header;
/// 0 = source port, 2 = destination port) changed from `old` to `new` (each as the 2 bytes stand
/// in the packet), in an SCTP packet (common header + chunks) of `len` bytes in all.
///
/// Any 2 bytes of the packet may be given, not only a port, as long as `offset + 2 <= len <=`
/// [`SCTP_MAX_LEN`] and they are not in the checksum field (bytes 8..12); otherwise `field` is
/// returned unchanged. A valid checksum stays valid, an invalid one stays invalid by exactly as
/// much. Cost: straight-line code of at most 512 multiply-and-XOR steps, about 3,000 BPF
/// instructions per inlined call (each call site carries its own copy).
#[inline(always)]
pub fn sctp_checksum_update(
    field: [u8; 4],
    len: u32,
    offset: u32,
    old: [u8; 2],
    new: [u8; 2],
) -> [u8; 4] {
    let diff = u32::from_le_bytes([old[0] ^ new[0], old[1] ^ new[1], 0, 0]);
    update(field, len, offset, 2, diff)
}

/// [`sctp_checksum_update`] for both ports at once: the first 4 bytes of the common header
/// (source port, then destination port, as they stand in the packet) changed from `old` to
/// `new`. Costs the same as one port's update, so a DNAT plus masquerade pays once. `field` is
/// returned unchanged unless `4 <= len <=` [`SCTP_MAX_LEN`].
#[inline(always)]
pub fn sctp_ports_checksum_update(field: [u8; 4], len: u32, old: [u8; 4], new: [u8; 4]) -> [u8; 4] {
    let diff = u32::from_le_bytes(old) ^ u32::from_le_bytes(new);
    update(field, len, 0, 4, diff)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// CRC32c bit by bit, the textbook way (`!0` seed, reflected, final inversion): the
    /// reference the incremental update is checked against.
    fn crc32c(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// The checksum field of a whole SCTP packet, as Linux's `sctp_compute_cksum` fills it:
    /// the CRC over the packet with the field taken as zero, stored `cpu_to_le32`.
    fn full_field(packet: &[u8]) -> [u8; 4] {
        let mut zeroed = packet.to_vec();
        zeroed[8..12].fill(0);
        crc32c(&zeroed).to_le_bytes()
    }

    /// splitmix64: deterministic, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform enough in `lo..=hi` for test inputs.
        fn range(&mut self, lo: u32, hi: u32) -> u32 {
            lo + (self.next() % u64::from(hi - lo + 1)) as u32
        }

        fn bytes<const N: usize>(&mut self) -> [u8; N] {
            core::array::from_fn(|_| self.next() as u8)
        }

        /// A packet of `len` bytes with random content and a valid checksum.
        fn packet(&mut self, len: usize) -> Vec<u8> {
            let mut p: Vec<u8> = (0..len).map(|_| self.next() as u8).collect();
            let field = full_field(&p);
            p[8..12].copy_from_slice(&field);
            p
        }
    }

    fn field_of(p: &[u8]) -> [u8; 4] {
        p[8..12].try_into().unwrap()
    }

    /// Rewrites `p[offset..offset + 2]` to `new` the way the programs do, through the
    /// incremental update, and checks the result against a full recomputation.
    fn rewrite_and_check(p: &mut [u8], offset: usize, new: [u8; 2]) {
        let old = [p[offset], p[offset + 1]];
        let updated = sctp_checksum_update(field_of(p), p.len() as u32, offset as u32, old, new);
        p[offset..offset + 2].copy_from_slice(&new);
        p[8..12].copy_from_slice(&updated);
        assert_eq!(
            updated,
            full_field(p),
            "len {} offset {offset} {old:02x?} -> {new:02x?}",
            p.len()
        );
    }

    #[test]
    fn reference_matches_rfc3720_vectors() {
        // RFC 3720 appendix B.4 (iSCSI's CRC32c, the same CRC SCTP uses).
        assert_eq!(crc32c(&[0x00; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFF; 32]), 0x62A8_AB43);
        let incrementing: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&incrementing), 0x46DD_794E);
        let decrementing: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&decrementing), 0x113F_DB5C);
        // The catalogue check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn field_is_the_crc_least_significant_byte_first() {
        // RFC 3720 B.4 gives the 32-zero-byte CRC on the wire as `aa 36 91 8a`, and RFC 4960
        // appendix B stores the CRC's low byte first; Linux's `cpu_to_le32(~crc32c(~0, ..))`
        // is the same.
        assert_eq!(crc32c(&[0; 32]).to_le_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
        // A 40-byte INIT (ports 0, tag 0, one IPv4 address parameter 127.0.0.1) whose field
        // scapy's SCTP regression tests pin as 0x402c0b5f in wire order.
        let mut init = [0u8; 40];
        init[8..16].copy_from_slice(&[0x40, 0x2c, 0x0b, 0x5f, 0x01, 0x00, 0x00, 0x1c]);
        init[32..40].copy_from_slice(&[0x00, 0x05, 0x00, 0x08, 0x7f, 0x00, 0x00, 0x01]);
        assert_eq!(full_field(&init), [0x40, 0x2c, 0x0b, 0x5f]);
    }

    #[test]
    fn columns_are_the_powers_of_x() {
        // x^32 mod P is the generator's low part; x^8 is one byte's shift of 1.
        assert_eq!(mul(ONE, mul_x(ONE)), mul_x(ONE));
        let mut x32 = ONE;
        for _ in 0..32 {
            x32 = mul_x(x32);
        }
        assert_eq!(x32, POLY);
        for (i, columns) in COLUMNS.iter().enumerate() {
            // x^(8 · 2^i) by 8 · 2^i single shifts, independently of the squaring.
            let mut power = ONE;
            for _ in 0..8u32 << i {
                power = mul_x(power);
            }
            assert_eq!(columns[31], power, "x^(8·2^{i})");
            for (j, &column) in columns.iter().enumerate() {
                // Bit j of a word is x^(31 - j).
                assert_eq!(column, mul(power, 1 << j), "column {j} of x^(8·2^{i})");
            }
        }
    }

    #[test]
    fn shift_is_zero_bytes_through_the_crc_register() {
        // Feeding a zero byte into the raw CRC register multiplies it by x^8: after n zero
        // bytes a register that held `w` holds `w · x^(8n)`. Every distance the update can
        // see, for words with low, high and all bits set.
        for w in [
            0x0000_0001,
            0x0000_ffff,
            0x8000_0000,
            0xdead_beef,
            0xffff_ffff,
        ] {
            let mut register = w;
            for n in 0..=SCTP_MAX_LEN {
                assert_eq!(shift(w, n), register, "w {w:#010x} n {n}");
                for _ in 0..8 {
                    register = mul_x(register);
                }
            }
        }
    }

    #[test]
    fn random_port_rewrites_match_full_recomputation() {
        let mut rng = Rng(0x5c7b_2024);
        for round in 0..2000 {
            let len = rng.range(12, 9000) as usize;
            let mut p = rng.packet(len);
            // DNAT of the destination port, then masquerade of the source port, then both
            // back at once: each step's field checked against a full recomputation.
            rewrite_and_check(&mut p, 2, rng.bytes());
            rewrite_and_check(&mut p, 0, rng.bytes());
            let old = [p[0], p[1], p[2], p[3]];
            let new: [u8; 4] = rng.bytes();
            let both = sctp_ports_checksum_update(field_of(&p), len as u32, old, new);
            p[..4].copy_from_slice(&new);
            assert_eq!(both, full_field(&p), "round {round} len {len}");
            p[8..12].copy_from_slice(&both);
            // Any other 2 bytes outside the field, up to the packet's very last two.
            let mut offset = rng.range(0, len as u32 - 2) as usize;
            if (7..12).contains(&offset) {
                offset = len - 2;
            }
            if len >= 14 {
                rewrite_and_check(&mut p, offset, rng.bytes());
            }
        }
    }

    #[test]
    fn edge_lengths_and_offsets() {
        let mut rng = Rng(7);
        // The bare common header, a packet whose last 2 bytes change, the longest packet.
        let mut header = rng.packet(12);
        rewrite_and_check(&mut header, 0, [0x23, 0x28]);
        rewrite_and_check(&mut header, 2, [0xff, 0xff]);
        let mut tail = rng.packet(14);
        rewrite_and_check(&mut tail, 12, [0x00, 0x01]);
        for len in [15, 16, 17, 1500, 9000] {
            let mut p = rng.packet(len);
            rewrite_and_check(&mut p, len - 2, rng.bytes());
            rewrite_and_check(&mut p, len - 3, rng.bytes());
        }
        let mut longest = rng.packet(SCTP_MAX_LEN as usize);
        rewrite_and_check(&mut longest, 0, [0x13, 0x88]);
        rewrite_and_check(&mut longest, 2, [0x00, 0x50]);
        rewrite_and_check(&mut longest, SCTP_MAX_LEN as usize - 2, [0xaa, 0x55]);
        let old = [longest[0], longest[1], longest[2], longest[3]];
        let both = sctp_ports_checksum_update(field_of(&longest), SCTP_MAX_LEN, old, [9; 4]);
        longest[..4].fill(9);
        assert_eq!(both, full_field(&longest));
    }

    #[test]
    fn unchanged_bytes_leave_the_field_alone() {
        let field = [0x12, 0x34, 0x56, 0x78];
        for len in [12, 100, SCTP_MAX_LEN] {
            for offset in [0, 2] {
                assert_eq!(
                    sctp_checksum_update(field, len, offset, [7, 9], [7, 9]),
                    field
                );
            }
            assert_eq!(
                sctp_ports_checksum_update(field, len, [1; 4], [1; 4]),
                field
            );
        }
    }

    #[test]
    fn out_of_contract_inputs_return_the_field() {
        // Tests run with overflow checks on, so these also prove no arithmetic panics.
        let field = [0xa1, 0xb2, 0xc3, 0xd4];
        let (old, new) = ([1, 2], [3, 4]);
        for (len, offset) in [
            (0, 0),
            (1, 0),
            (12, 11),
            (12, 12),
            (12, u32::MAX),
            (u32::MAX, 0),
            (u32::MAX, u32::MAX - 1),
            (SCTP_MAX_LEN + 1, 0),
            (100, 7),
            (100, 8),
            (100, 10),
            (100, 99),
        ] {
            assert_eq!(
                sctp_checksum_update(field, len, offset, old, new),
                field,
                "len {len} offset {offset}"
            );
        }
        for len in [0, 3, SCTP_MAX_LEN + 1, u32::MAX] {
            assert_eq!(
                sctp_ports_checksum_update(field, len, [0; 4], [1; 4]),
                field
            );
        }
        // Just inside: the first byte after the field, and the last 2 bytes of the packet.
        assert_ne!(sctp_checksum_update(field, 100, 12, old, new), field);
        assert_ne!(sctp_checksum_update(field, 100, 98, old, new), field);
        assert_ne!(sctp_checksum_update(field, 12, 6, old, new), field);
    }
}
