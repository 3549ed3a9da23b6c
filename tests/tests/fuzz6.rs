//! The fuzz tier for IPv6: generated and mutated IPv6 frames (extension header chains of
//! every kind and length, fragments, TCP/UDP/SCTP, ICMPv6 errors quoting such packets and
//! informational messages, other protocols; then truncated, lying about their lengths,
//! flipped) run through all three programs under BPF_PROG_TEST_RUN against the fixture's
//! network, which has no IPv6 service, so what must hold for every frame:
//!
//! 1. It leaves byte-identical with a passing verdict, or the kernel refuses it for its length.
//! 2. Each run counts exactly one outcome, and only one an IPv6 packet may have (`not_service`,
//!    `frag_unknown`, `not_l4`, `ipv6_extension`, `udp6_no_checksum`, `malformed`), checked
//!    per round of packets.
//! 3. No flow or fragment entry is written.
//!
//! A run of at least `COVERAGE_FROM` packets must have reached every one of those outcomes
//! on every program, so that the generator cannot drift into testing one path only.
//! `LB_FUZZ_SEED` repeats a run and `LB_FUZZ_PACKETS` sets how many packets (100,000 by
//! default), as for the IPv4 tier. Root only.
use std::{collections::BTreeMap, net::Ipv6Addr};

use lb_common::Reason;
use lb_tests::{
    fixture::{Fixture, Prog, Tables, refused_by_test_run},
    fuzz::{Rng, count_from_env, hex, seed_from_env},
    packet::{Ext, Ipv6Packet},
    require_root,
};
use lb_user::core::model::Masquerade;

const DEFAULT_PACKETS: usize = 100_000;
const ROUND: usize = 500;
const COVERAGE_FROM: usize = 20_000;

/// What an IPv6 frame may end as while no IPv6 service exists (`frag_unknown`: a later
/// fragment of a datagram no flow translated; `xdp_deferred`: XDP leaves a checksum it
/// cannot tell full from partial to TC before it looks anything up).
/// `udp6_no_checksum`: a UDP fragment or a datagram whose length fields disagree, with
/// checksum 0).
const IPV6_OUTCOMES: [Reason; 7] = [
    Reason::NotService,
    Reason::Udp6NoChecksum,
    Reason::FragUnknown,
    Reason::XdpDeferred,
    Reason::NotL4,
    Reason::Ipv6Extension,
    Reason::Malformed,
];

const ADDRS: [Ipv6Addr; 6] = [
    Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x10),
    Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::UNSPECIFIED,
];

struct Gen {
    rng: Rng,
}

impl Gen {
    fn addr(&mut self) -> Ipv6Addr {
        if self.rng.percent(10) {
            Ipv6Addr::from(self.rng.u32() as u128 | (u128::from(self.rng.u32()) << 96))
        } else {
            self.rng.pick(&ADDRS)
        }
    }

    fn ext(&mut self) -> Ext {
        let units = self.rng.below(4) as u8;
        match self.rng.below(8) {
            0 | 1 => Ext::HopByHop(units),
            2 => Ext::Routing(units),
            3 => Ext::DestOpts(units),
            4 => Ext::Ah(self.rng.range(1, 7) as u8),
            5 | 6 => Ext::Fragment {
                offset8: if self.rng.percent(50) {
                    0
                } else {
                    self.rng.u16() >> 3
                },
                more: self.rng.percent(50),
                id: self.rng.u32(),
            },
            _ => {
                let any = self.rng.u8();
                Ext::Other {
                    next_header: self.rng.pick(&[135, 139, 140, 253, 254, any]),
                    units,
                }
            }
        }
    }

    /// A packet as built (honest lengths, valid checksum), before mutations.
    fn packet(&mut self, depth: usize) -> Ipv6Packet {
        let (s, d) = (self.addr(), self.addr());
        let (sport, dport) = (self.rng.u16(), self.rng.pick(&[80, 443, 8080, 5353, 9000]));
        let mut p = match self.rng.below(10) {
            0..=2 => Ipv6Packet::tcp(s, sport, d, dport),
            // IPv6 forbids a UDP checksum of 0; senders of tunnels send it anyway (RFC 6936).
            3 | 4 if self.rng.percent(20) => Ipv6Packet {
                l4_csum: Some(0),
                ..Ipv6Packet::udp(s, sport, d, dport)
            },
            3 | 4 => Ipv6Packet::udp(s, sport, d, dport),
            5 => Ipv6Packet::sctp(s, sport, d, dport),
            6 | 7 if depth == 0 => {
                let quoted = self.packet(1).build();
                let keep = self.rng.range(14, quoted.len() + 1);
                let t = self.rng.range(1, 5) as u8;
                Ipv6Packet::icmp6(s, d, (t, self.rng.u8(), 1280), &quoted[14..keep])
            }
            6..=8 => {
                let any = self.rng.u8();
                let t = self.rng.pick(&[128, 129, 133, 134, 135, 136, 143, any]);
                let len = self.rng.below(40);
                let body = self.rng.bytes(len);
                Ipv6Packet::icmp6(s, d, (t, 0, 0), &body)
            }
            _ => {
                let any = self.rng.u8();
                Ipv6Packet {
                    proto: self.rng.pick(&[50, 59, 47, 4, 41, any]),
                    ..Ipv6Packet::tcp(s, sport, d, dport)
                }
            }
        };
        let len = self.rng.below(64);
        p.payload = self.rng.bytes(len);
        if p.proto == 58 && depth == 0 && p.icmp.0 < 128 {
            // Keep the quote an error was built with.
            p.payload.clear();
        }
        let n = match self.rng.below(10) {
            0..=3 => 0,
            4..=6 => 1,
            7 => 2,
            8 => self.rng.range(3, 5),
            _ => self.rng.range(5, 8),
        };
        p.exts = (0..n).map(|_| self.ext()).collect();
        if p.exts
            .iter()
            .any(|e| matches!(e, Ext::Fragment { offset8, .. } if *offset8 != 0))
        {
            let len = self.rng.range(8, 80);
            p.raw = Some(self.rng.bytes(len));
        }
        p
    }

    /// A frame and what was done to it.
    fn case(&mut self) -> (Vec<u8>, Vec<&'static str>) {
        let p = self.packet(0);
        let mut frame = p.build();
        let mut done = Vec::new();
        if self.rng.percent(40) {
            for _ in 0..self.rng.range(1, 3) {
                let m = self.rng.below(6);
                done.push(["truncate", "length", "flip", "next", "version", "trailer"][m]);
                match m {
                    0 => frame.truncate(self.rng.range(14, frame.len() + 1)),
                    1 if frame.len() >= 20 => {
                        let v = self.rng.u16() >> self.rng.below(16);
                        frame[18..20].copy_from_slice(&v.to_be_bytes());
                    }
                    2 if frame.len() > 15 => {
                        for _ in 0..self.rng.range(1, 5) {
                            let at = self.rng.range(14, frame.len().min(160));
                            frame[at] = self.rng.u8();
                        }
                    }
                    3 if frame.len() > 20 => {
                        // A next-header field: the IPv6 header's or an extension header's.
                        let at = if self.rng.percent(50) || p.exts.is_empty() {
                            20
                        } else {
                            54
                        };
                        if at < frame.len() {
                            frame[at] = self.rng.pick(&[0, 43, 44, 51, 60, 6, 17, 58, 135]);
                        }
                    }
                    4 if frame.len() > 14 => frame[14] = self.rng.u8(),
                    5 => {
                        let n = self.rng.range(1, 30);
                        frame.extend(self.rng.bytes(n));
                    }
                    _ => {}
                }
            }
        }
        (frame, done)
    }
}

#[test]
fn ipv6_frames_pass_every_program_byte_identical() {
    if !require_root("ipv6_frames_pass_every_program_byte_identical") {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    let packets = count_from_env("LB_FUZZ_PACKETS", DEFAULT_PACKETS);
    println!("LB_FUZZ_SEED={seed:#x} LB_FUZZ_PACKETS={packets}");
    let mut f = Fixture::new(Masquerade::Always);
    let mut gen_ = Gen {
        rng: Rng::new(seed ^ 0x6666),
    };
    let empty = Tables::default();
    assert_eq!(f.tables(), empty);
    // By program and reason (`Reason::ALL` order).
    let mut totals: BTreeMap<(Prog, usize), u64> = BTreeMap::new();
    let mut refused = 0usize;
    let mut done = 0;
    while done < packets {
        let n = ROUND.min(packets - done);
        let before = f.dp.reasons().unwrap();
        let mut ran = [0u64; 3];
        for i in 0..n {
            let (frame, mutations) = gen_.case();
            for prog in Prog::ALL {
                let what = || {
                    format!(
                        "packet #{} {mutations:?} on {prog:?} (LB_FUZZ_SEED={seed:#x} \
                         LB_FUZZ_PACKETS={packets}): {}",
                        done + i,
                        hex(&frame)
                    )
                };
                match f.try_run(prog, &frame, None) {
                    Ok((verdict, out)) => {
                        ran[prog as usize] += 1;
                        let passed = match prog {
                            Prog::Xdp => verdict == lb_tests::fixture::XDP_PASS,
                            _ => verdict == lb_tests::fixture::TC_ACT_UNSPEC,
                        };
                        assert!(passed, "verdict {verdict}: {}", what());
                        assert!(out == frame, "changed: {}", what());
                    }
                    Err(e) => {
                        assert!(refused_by_test_run(prog, &frame), "{e:?}: {}", what());
                        refused += 1;
                    }
                }
            }
        }
        let after = f.dp.reasons().unwrap();
        for prog in Prog::ALL {
            let mut counted = 0;
            for ((h, r, a), (_, _, b)) in before.iter().zip(&after) {
                if *h != prog.hook() || b == a {
                    continue;
                }
                assert!(
                    IPV6_OUTCOMES.contains(r),
                    "{prog:?} counted {r:?} for IPv6 (packets #{done}.., LB_FUZZ_SEED={seed:#x})"
                );
                counted += b - a;
                *totals.entry((prog, *r as usize)).or_default() += b - a;
            }
            assert_eq!(
                counted, ran[prog as usize],
                "{prog:?}: one outcome per run (packets #{done}.., LB_FUZZ_SEED={seed:#x})"
            );
        }
        assert_eq!(
            f.tables(),
            empty,
            "an IPv6 packet wrote a table (packets #{done}..)"
        );
        done += n;
    }
    println!("{packets} IPv6 frames, {refused} runs refused by the kernel for their length");
    for ((prog, r), n) in &totals {
        println!("  {prog:?} {}: {n}", Reason::ALL[*r].1);
    }
    if packets >= COVERAGE_FROM {
        for prog in Prog::ALL {
            for r in IPV6_OUTCOMES {
                // A chance outcome (a checksum that happens to equal its seed), XDP's only.
                if r == Reason::XdpDeferred {
                    continue;
                }
                assert!(
                    totals.get(&(prog, r as usize)).is_some_and(|n| *n > 0),
                    "{prog:?} never ended as {r:?}: the generator misses a path"
                );
            }
        }
    }
}
