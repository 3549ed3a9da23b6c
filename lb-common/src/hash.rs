//! The flow hash: which bucket (and so which backend) a flow gets, and where its masquerade
//! port probe starts.
//!
//! A keyed hash of the client's 5-tuple instead of a random draw (moby's `numgen random`):
//! equally uniform over the buckets, but a flow whose entries were evicted or flushed hashes to
//! the same bucket again, so while its service's set is unchanged it is re-created on the same
//! backend (Katran's answer to LRU pressure), and two CPUs racing to create one flow choose
//! the same backend. The key is random per network so that clients cannot aim at a backend.
//!
//! The mixing is the kernel's `jhash_3words` (include/linux/jhash.h), as Katran and Cilium use
//! for the same purpose: cheap in BPF (no loops) and well spread in every bit.
use crate::{Addr, FlowKeyOf};

const JHASH_INITVAL: u32 = 0xdead_beef;

#[inline(always)]
fn final_mix(mut a: u32, mut b: u32, mut c: u32) -> u32 {
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

/// The kernel's `jhash_3words(a, b, c, initval)`.
#[inline(always)]
pub fn jhash_3words(a: u32, b: u32, c: u32, initval: u32) -> u32 {
    let init = initval.wrapping_add(JHASH_INITVAL).wrapping_add(3 << 2);
    final_mix(
        a.wrapping_add(init),
        b.wrapping_add(init),
        c.wrapping_add(init),
    )
}

/// The flow hash of a client's tuple (as the client sent it, before any translation) under the
/// network's key. The protocol goes into the initial value, so a TCP and a UDP flow with equal
/// addresses and ports hash independently.
#[inline(always)]
pub fn flow_hash<A: Addr>(key: &FlowKeyOf<A>, hash_key: u32) -> u32 {
    let ports = (u32::from(key.sport) << 16) | u32::from(key.dport);
    jhash_3words(
        key.saddr.hash_word(),
        key.daddr.hash_word(),
        ports,
        hash_key ^ u32::from(key.proto),
    )
}

/// The hash a socket of the node's own processes is balanced by (`lb_common::HOOK_SOCK`): the
/// socket's cookie and the service address and port it asked for, under the network's key.
/// One socket sends to one backend per service while the set is unchanged, which a UDP
/// client sending datagrams from one socket needs (its answers come back to that socket).
#[inline(always)]
pub fn sock_hash(cookie: u64, addr: u32, port: u16, proto: u8, hash_key: u32) -> u32 {
    jhash_3words(
        cookie as u32,
        (cookie >> 32) as u32,
        addr ^ u32::from(port),
        hash_key ^ u32::from(proto),
    )
}

/// The flow's bucket in `0..BUCKETS`.
#[inline(always)]
pub fn bucket(hash: u32) -> u32 {
    hash & 0xffff
}

/// How many masquerade ports a flow tries before its claim fails. Cilium's
/// `SNAT_COLLISION_RETRIES` is 32 for the same search; with the range a few percent full, 16
/// misses in a row happen once in ~10^20 flows, and a full range fails in bounded time.
pub const PORT_PROBES: u32 = 16;

/// How many other source ports a flow tries, derived from its flow hash, when its reply tuple
/// is taken: the same client address and port reach the same backend port through another
/// flow, live or closed within `tcp_time_wait` (a client that reuses its ports across two
/// services, or across a change of the backend set, meets them all the time: a proxy in
/// front of a VIP does). Derived from the hash, so a flow re-created after losing its
/// entries finds its port again while that is free.
pub const CLASH_PROBES: u32 = 4;

/// How many random source ports a flow's first packet (a SYN, a datagram) tries after the
/// [`CLASH_PROBES`]: were they derived from the hash too, a SYN whose hash-derived ports are
/// all taken would fail again, port for port, each time the client sent it again, for as long
/// as their holders live (the kernel's NAT draws at random too). With the same density as
/// [`PORT_PROBES`]' search, 16 misses in a row are as rare.
pub const RANDOM_CLASH_PROBES: u32 = 12;

/// Source ports a flow may be given: `min..=max` minus the hole `hole_min..=hole_max` (empty
/// when `hole_min > hole_max`), as [`crate::Config`] holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub min: u16,
    pub max: u16,
    pub hole_min: u16,
    pub hole_max: u16,
}

impl PortRange {
    /// How many ports of `min..=max` the hole takes out.
    #[inline(always)]
    fn hole(&self) -> u32 {
        if self.hole_min > self.hole_max || self.hole_max < self.min || self.hole_min > self.max {
            return 0;
        }
        let lo = if self.hole_min < self.min {
            self.min
        } else {
            self.hole_min
        };
        let hi = if self.hole_max > self.max {
            self.max
        } else {
            self.hole_max
        };
        u32::from(hi - lo) + 1
    }

    /// How many ports the range holds.
    #[inline(always)]
    pub fn size(&self) -> u32 {
        if self.min > self.max {
            return 0;
        }
        (u32::from(self.max - self.min) + 1).saturating_sub(self.hole())
    }

    /// The `index`-th port of the range counted from a start derived from `hash`'s high half
    /// (the low half is a flow's bucket), wrapping; `None` for an empty range. The same hash
    /// and index always give the same port.
    #[inline(always)]
    pub fn probe(&self, hash: u32, index: u32) -> Option<u16> {
        let size = self.size();
        if size == 0 {
            return None;
        }
        let start = ((hash >> 16) * size) >> 16;
        let index = (start + index) % size;
        let mut port = u32::from(self.min) + index;
        let hole = self.hole();
        if hole != 0 && port >= u32::from(self.hole_min.max(self.min)) {
            port += hole;
        }
        Some(port as u16)
    }
}

/// Where the masquerade port search starts for the flow whose packet leaves as `key` (client →
/// backend, after DNAT): a hash and an index for [`PortRange::probe`], whose `attempt`-th port
/// is `probe(hash, index + attempt)`. A client's source ports map one-to-one onto the range,
/// offset by a keyed hash of the client, the backend and its port — as the kernel's NAT keeps a
/// client's own port where it can: one client's flows to a backend port never compete for a
/// masquerade port (its ephemeral range is smaller than the masquerade range), and a flow gets
/// the same port each time it is (re-)created while that port is free, so the backend sees the
/// same 4-tuple, and a client port reused for a new connection lands on the backend's
/// TIME_WAIT of its own previous connection, which accepts it. Two clients meet at random, and
/// the later one probes on.
#[inline(always)]
pub fn masq_start<A: Addr>(key: &FlowKeyOf<A>, hash_key: u32) -> (u32, u32) {
    let base = jhash_3words(
        key.saddr.hash_word(),
        key.daddr.hash_word(),
        u32::from(key.dport),
        hash_key ^ u32::from(key.proto),
    );
    (base, u32::from(u16::from_be(key.sport)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlowKey, FlowKey6};

    /// Values of the kernel's `jhash_3words`, computed by include/linux/jhash.h compiled
    /// with gcc.
    #[test]
    fn matches_the_kernels_jhash_3words() {
        assert_eq!(jhash_3words(0, 0, 0, 0), 0x1b68_e557);
        assert_eq!(jhash_3words(1, 2, 3, 0), 0xa461_58f5);
        assert_eq!(
            jhash_3words(0x0020_0a0a, 0x0a00_630a, 0x9c40_0050, 0x1234_5678 ^ 6),
            0x7f23_7ae1
        );
    }

    #[test]
    fn buckets_of_sequential_client_ports_are_uniform() {
        // 64k flows of one client to one VIP, as a load generator makes them: chi-square over
        // 16 groups of buckets stays far below the p = 1e-6 bound (df 15: 48.3).
        assert_uniform((0..65536u32).map(|port| {
            let key = FlowKey {
                saddr: 0x0200_0a0a,
                daddr: 0x0a00_630a,
                sport: (port as u16).to_be(),
                dport: 80u16.to_be(),
                proto: 6,
                _pad: [0; 3],
            };
            flow_hash(&key, 0x1234_5678)
        }));
    }

    #[test]
    fn ipv4_flow_hashes_are_those_before_dual_stack() {
        // A restart or upgrade must not move a flow: the IPv4 hash is jhash_3words over the
        // addresses themselves, as before addresses were generic.
        let key = FlowKey {
            saddr: 0x0200_0a0a,
            daddr: 0x0a00_630a,
            sport: 40000u16.to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            _pad: [0; 3],
        };
        let ports = (u32::from(key.sport) << 16) | u32::from(key.dport);
        assert_eq!(
            flow_hash(&key, 0x1234_5678),
            jhash_3words(key.saddr, key.daddr, ports, 0x1234_5678 ^ 6)
        );
    }

    #[test]
    fn buckets_of_ipv6_flows_are_uniform() {
        let addr = |last: u32| [0xfd10_0000u32.to_be(), 0, 0, last.to_be()];
        let key = |saddr, sport: u16| FlowKey6 {
            saddr,
            daddr: addr(0x10),
            sport: sport.to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            _pad: [0; 3],
        };
        // One client's sequential ports, and 64k clients of one /64 with one port each.
        assert_uniform((0..65536u32).map(|p| flow_hash(&key(addr(2), p as u16), 0x1234_5678)));
        assert_uniform((0..65536u32).map(|c| flow_hash(&key(addr(c), 40000), 0x1234_5678)));
        // Every word of the address counts.
        let base = flow_hash(&key(addr(2), 40000), 7);
        for w in 0..4 {
            let mut other = addr(2);
            other[w] ^= 1u32.to_be();
            assert_ne!(base, flow_hash(&key(other, 40000), 7), "word {w}");
        }
    }

    /// Chi-square of `hashes`' buckets over 16 groups below the p = 1e-6 bound (df 15).
    fn assert_uniform(hashes: impl Iterator<Item = u32>) {
        let mut groups = [0u32; 16];
        for h in hashes {
            groups[(bucket(h) >> 12) as usize] += 1;
        }
        let expect = f64::from(groups.iter().sum::<u32>()) / 16.0;
        let chi2: f64 = groups
            .iter()
            .map(|&g| (f64::from(g) - expect).powi(2) / expect)
            .sum();
        assert!(chi2 < 48.3, "chi2 {chi2}: {groups:?}");
    }

    #[test]
    fn buckets_of_sequential_socket_cookies_are_uniform() {
        // Socket cookies are a counter: one process's connections get consecutive ones. The
        // same bound as for client ports above; the service address and port move the hash.
        let start = 0x1_0000_4000u64;
        assert_uniform(
            (0..65536u64).map(|c| sock_hash(start + c, 0x0a00_630a, 80u16.to_be(), 6, 0x1234_5678)),
        );
        let h = |addr, port, proto| sock_hash(start, addr, port, proto, 7);
        let base = h(0x0a00_630a, 80u16.to_be(), 6);
        assert_ne!(base, h(0x0b00_630a, 80u16.to_be(), 6), "another service");
        assert_ne!(base, h(0x0a00_630a, 81u16.to_be(), 6), "another port");
        assert_ne!(base, h(0x0a00_630a, 80u16.to_be(), 17), "another protocol");
        assert_eq!(
            base,
            h(0x0a00_630a, 80u16.to_be(), 6),
            "the same every time"
        );
    }

    #[test]
    fn one_clients_ports_get_distinct_masquerade_ports() {
        let range = PortRange {
            min: 1024,
            max: 65535,
            hole_min: 32768,
            hole_max: 60999,
        };
        let mut seen = [false; 65536];
        let mut key = FlowKey {
            saddr: 0x0200_0a0a,
            daddr: 0x0a00_140a,
            sport: 0,
            dport: 80u16.to_be(),
            proto: 6,
            _pad: [0; 3],
        };
        // The kernel's whole default ephemeral range of one client.
        let port = |key: &FlowKey, attempt| {
            let (base, index) = masq_start(key, 7);
            range.probe(base, index + attempt).unwrap()
        };
        for p in 32768..=60999u16 {
            key.sport = p.to_be();
            let m = port(&key, 0);
            assert!(
                !seen[usize::from(m)],
                "client port {p} shares masquerade port {m}"
            );
            seen[usize::from(m)] = true;
            assert_eq!(port(&key, 0), m, "the same every time");
            assert_ne!(port(&key, 1), m, "the next attempt moves on");
        }
        key.saddr = 0x0300_0a0a;
        key.sport = 40000u16.to_be();
        let other = port(&key, 0);
        key.saddr = 0x0200_0a0a;
        assert_ne!(other, port(&key, 0), "another client, another offset");
    }

    #[test]
    fn probes_stay_in_the_range_and_skip_the_hole() {
        let r = PortRange {
            min: 1024,
            max: 65535,
            hole_min: 32768,
            hole_max: 60999,
        };
        assert_eq!(r.size(), 65535 - 1024 + 1 - (60999 - 32768 + 1));
        let mut seen = [false; 65536];
        for i in 0..r.size() {
            let p = r.probe(0, i).unwrap();
            assert!(
                (1024..32768).contains(&p) || (61000..=65535).contains(&p),
                "{p}"
            );
            assert!(!seen[p as usize], "port {p} probed twice");
            seen[p as usize] = true;
        }
        assert_eq!(r.probe(0, r.size()), r.probe(0, 0), "probes wrap");
        for h in [0, 1 << 16, u32::MAX, 0x8000_0000] {
            let p = r.probe(h, 0).unwrap();
            assert!((1024..32768).contains(&p) || (61000..=65535).contains(&p));
        }
        let empty_hole = PortRange {
            min: 61000,
            max: 61003,
            hole_min: 1,
            hole_max: 0,
        };
        assert_eq!(empty_hole.size(), 4);
        assert_eq!(empty_hole.probe(0, 5), Some(61001));
        let all_hole = PortRange {
            min: 100,
            max: 200,
            hole_min: 50,
            hole_max: 300,
        };
        assert_eq!(all_hole.size(), 0);
        assert_eq!(all_hole.probe(7, 0), None);
    }
}
