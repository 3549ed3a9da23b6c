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
//!
//! Where each part lives: the PRNG and environment knobs here; IPv4 frames and their
//! mutations in `frame4`, IPv6 frames in `frame6`; cases, draws and the `Tier` trait in
//! `cases`; the runner in `run`. Every name is re-exported here (`lb_tests::fuzz::…`).
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

mod cases;
mod frame4;
mod frame6;
mod run;

pub use cases::*;
pub use frame4::*;
pub use frame6::*;
pub use run::*;

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
