//! What the eBPF programs and the controller must agree on, byte for byte: map key and value
//! layouts, limits, and the bucket math that turns a random draw into a backend.
//!
//! This crate is compiled into both sides (`no_std` for the programs, `user` feature for the
//! controller), so a layout or a partition rule cannot drift between them: there is no second
//! copy to forget. Every multi-byte address and port in a map layout is in network byte order,
//! exactly as it stands in the packet, so the hot path never swaps bytes.
#![no_std]

pub mod crc32c;

/// Size of the random bucket space each VIP's and each published port's backends are
/// partitioned over (moby's `numgen random mod 65536`).
pub const BUCKETS: u32 = 65536;

/// Most backends one set can hold: beyond this a backend would get no bucket at all, so the
/// controller rejects larger sets instead of silently never using their tail.
pub const MAX_BACKENDS_PER_SET: u32 = BUCKETS;

/// Capacity of the VIP and published-port service maps (entries per network).
pub const MAX_SERVICES: u32 = 65536;
/// Capacity of the backend-slot map: every slot of every live set plus the sets being swapped in.
pub const MAX_BACKEND_SLOTS: u32 = 1 << 18;
/// Capacity of the LRU connection table; each flow takes two entries (one per direction).
pub const MAX_FLOWS: u32 = 1 << 18;
/// Capacity of the node-local address set (what a published port answers on).
pub const MAX_LOCAL_ADDRS: u32 = 1024;
/// Slots in the per-CPU counter array: one per service and one per backend.
pub const MAX_COUNTERS: u32 = 1 << 17;
/// Capacity of the interface map (the network's interfaces, by ifindex).
pub const MAX_IFACES: u32 = 64;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;

/// The interval `[start, end]` (inclusive) of the bucket space `0..length` that slot `index`
/// of `n` owns, moby's `EqualWeightIntervals`: `per = length / n` buckets each and the first
/// `length % n` slots one more, contiguous from 0. With `n > length` only the first `length`
/// slots get a (one-bucket) interval; every other slot, and any slot of an empty set, gets
/// `None`.
pub const fn bucket_interval(index: u32, n: u32, length: u32) -> Option<(u32, u32)> {
    let m = if n < length { n } else { length };
    if index >= m {
        return None;
    }
    let per = length / m;
    let rem = length % m;
    let start = index * per + if index < rem { index } else { rem };
    let size = per + if index < rem { 1 } else { 0 };
    Some((start, start + size - 1))
}

/// The slot whose [`bucket_interval`] over `0..length` contains `bucket`: the inverse of the
/// partition, computed without a scan so that the programs can call it per new flow.
#[inline(always)]
pub const fn slot_in(bucket: u32, n: u32, length: u32) -> Option<u32> {
    if n == 0 || bucket >= length {
        return None;
    }
    let m = if n < length { n } else { length };
    let per = length / m;
    let rem = length % m;
    // The first `rem` slots are `per + 1` wide; `rem * (per + 1) <= length`, so no overflow.
    let wide_end = rem * (per + 1);
    if bucket < wide_end {
        Some(bucket / (per + 1))
    } else {
        Some(rem + (bucket - wide_end) / per)
    }
}

/// The backend index that `bucket` (a draw in `0..BUCKETS`) selects in a set of `n` backends.
/// The one bucket → backend function: the programs call it per new flow and the controller's
/// rendering of `lb elements` is checked against it, so both dataplanes agree bucket for bucket.
#[inline(always)]
pub const fn slot_for_bucket(bucket: u32, n: u32) -> Option<u32> {
    slot_in(bucket, n, BUCKETS)
}

/// Declares a map layout: `#[repr(C)]`, plain old data, and (with `user`) the aya and bytemuck
/// marker impls the controller needs to read and write it. Layouts carry explicit padding
/// fields so that no byte of a key is undefined (hash keys are compared bytewise).
macro_rules! map_layout {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }

        #[cfg(feature = "user")]
        // SAFETY: repr(C), every field is an integer, padding is explicit.
        unsafe impl aya::Pod for $name {}
    };
}

map_layout! {
    /// Key of the VIP map: the address every port of which the service answers on.
    pub struct VipKey {
        pub addr: u32,
    }
}

map_layout! {
    /// Key of the published-port map. `addr` is the port's `host_ip`, or 0 for "any address of
    /// this node" (the programs check the local-address set before they look up with 0).
    pub struct PortKey {
        pub addr: u32,
        pub port: u16,
        pub proto: u8,
        pub _pad: u8,
    }
}

map_layout! {
    /// Value of the VIP and published-port maps: which backend set serves the key and how big
    /// it is. The controller fills a new set's slots first and then replaces this value in one
    /// update, so a packet sees either the whole old set or the whole new one.
    pub struct Service {
        pub set_id: u32,
        /// Backends in the set; 0 means "claimed, nothing to send to": the packet passes.
        pub count: u32,
        /// Index of this service's slot in the counter array.
        pub counter: u32,
        pub flags: u32,
    }
}

map_layout! {
    /// Key of the backend-slot map: slot `slot` (0..count) of set `set_id`.
    pub struct BackendKey {
        pub set_id: u32,
        pub slot: u32,
    }
}

map_layout! {
    /// Value of the backend-slot map.
    pub struct Backend {
        pub addr: u32,
        /// Destination port to rewrite to, or 0 to keep the packet's (VIPs are port-agnostic).
        pub port: u16,
        pub _pad: u16,
        /// Index of this backend's slot in the counter array.
        pub counter: u32,
    }
}

map_layout! {
    /// One direction of a tracked flow, as the packet carries it before translation.
    pub struct FlowKey {
        pub saddr: u32,
        pub daddr: u32,
        pub sport: u16,
        pub dport: u16,
        pub proto: u8,
        pub _pad: [u8; 3],
    }
}

map_layout! {
    /// What to do with a packet of a tracked flow: rewrite its addresses and ports to these.
    /// The forward entry (client → service) carries the backend (and the masquerade source);
    /// the reverse entry (backend → client) carries the service address the client expects.
    pub struct Translation {
        pub saddr: u32,
        pub daddr: u32,
        pub sport: u16,
        pub dport: u16,
        pub flags: u32,
        /// Counter slots the flow's packets are accounted to: its backend's and its service's.
        pub counter: u32,
        pub service_counter: u32,
        /// `bpf_ktime_get_ns` of the last packet, for `lb conntrack`'s age and idle expiry.
        pub last_seen_ns: u64,
    }
}

map_layout! {
    /// Per-CPU packet and byte counts of one service or backend.
    pub struct Counters {
        pub packets: u64,
        pub bytes: u64,
    }
}

map_layout! {
    /// The one value of the per-network config array.
    pub struct Config {
        /// One of the `MASQ_*` modes.
        pub masquerade: u32,
        pub flags: u32,
    }
}

map_layout! {
    /// Value of the interface map (keyed by ifindex): the address a masqueraded flow leaving by
    /// this interface takes as its source.
    pub struct Iface {
        pub addr: u32,
        pub flags: u32,
    }
}

/// [`Config::masquerade`]: SNAT only hairpin flows (those that leave by the interface they came in on).
pub const MASQ_AUTO: u32 = 0;
/// [`Config::masquerade`]: SNAT every load-balanced flow (moby's `ct status dnat masquerade`).
pub const MASQ_ALWAYS: u32 = 1;
/// [`Config::masquerade`]: never SNAT; backends see the client's address.
pub const MASQ_NEVER: u32 = 2;

/// Source ports masqueraded flows are given: above the kernel's default ephemeral range
/// (32768-60999), so they do not collide with the node's own connections.
pub const MASQ_PORT_MIN: u16 = 61000;
pub const MASQ_PORT_MAX: u16 = 65535;

/// [`Translation::flags`]: the entry is applied on egress (it rewrites the source); entries
/// without it are applied on ingress (they rewrite the destination). Keys of the two kinds
/// never collide, but a reply's ingress lookup could otherwise find its egress entry.
pub const FLOW_EGRESS: u32 = 1 << 0;
/// [`Translation::flags`]: the entry belongs to a masqueraded flow.
pub const FLOW_MASQ: u32 = 1 << 1;
/// [`Translation::flags`]: the entry is the reply direction (backend → client) of its flow.
pub const FLOW_REPLY: u32 = 1 << 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_backends_split_like_moby() {
        assert_eq!(bucket_interval(0, 3, BUCKETS), Some((0, 21845)));
        assert_eq!(bucket_interval(1, 3, BUCKETS), Some((21846, 43690)));
        assert_eq!(bucket_interval(2, 3, BUCKETS), Some((43691, 65535)));
        assert_eq!(bucket_interval(3, 3, BUCKETS), None);
    }

    #[test]
    fn empty_set_selects_nothing() {
        assert_eq!(slot_for_bucket(0, 0), None);
        assert_eq!(bucket_interval(0, 0, BUCKETS), None);
        assert_eq!(slot_for_bucket(BUCKETS, 3), None);
    }

    #[test]
    fn slot_for_bucket_is_interval_containment() {
        // For every set size the issue names and every bucket, the slot the programs pick is
        // the one whose rendered interval contains the bucket (walked independently here).
        for n in 1..=1024u32 {
            let mut slot = 0u32;
            let mut counts = [0u32; 1024];
            let (mut start, mut end) = bucket_interval(0, n, BUCKETS).unwrap();
            assert_eq!(start, 0);
            for b in 0..BUCKETS {
                if b > end {
                    slot += 1;
                    let next = bucket_interval(slot, n, BUCKETS).unwrap();
                    assert_eq!(next.0, end + 1, "n={n} slot={slot}: intervals must abut");
                    (start, end) = next;
                }
                assert!(start <= b && b <= end);
                assert_eq!(slot_for_bucket(b, n), Some(slot), "n={n} bucket={b}");
                counts[slot as usize] += 1;
            }
            assert_eq!(end, BUCKETS - 1);
            assert_eq!(slot, n - 1);
            let per = BUCKETS / n;
            for (i, c) in counts[..n as usize].iter().enumerate() {
                assert!(*c == per || *c == per + 1, "n={n} slot={i} got {c}");
            }
        }
    }

    #[test]
    fn more_backends_than_buckets_use_the_first_ones() {
        assert_eq!(slot_for_bucket(65535, 70000), Some(65535));
        assert_eq!(bucket_interval(65536, 70000, BUCKETS), None);
        assert_eq!(slot_in(4, 10, 5), Some(4));
        assert_eq!(bucket_interval(5, 10, 5), None);
    }
}
