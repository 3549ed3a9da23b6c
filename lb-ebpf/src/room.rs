//! The working memory of one path run: the entries, keys, packet bytes, next hop and DSR
//! session the paths build or copy out, too large for the BPF stack ([`Room`]), in a per-CPU
//! [`Slot`] of the run's hook (`maps::SLOTS`, `maps::SLOTS6`).
use aya_ebpf::bindings::bpf_fib_lookup as FibParams;
use lb_common::{Addr, DsrSessionOf, Endpoint, FlowKeyOf, FlowOf};

use crate::{csum::SumChunk, parse::Parsed};

/// Working memory of one path run: the entries and keys it builds or copies out of the flow
/// table (`nat`, `lb::new_flow`, `conntrack::update`, `snat`), in a per-CPU map slot of the
/// hook (`maps::SLOTS`, `maps::SLOTS6`): on the 512 bytes of a BPF stack an IPv6 path could
/// not hold them beside the rest (LLVM keeps every field of an entry in a register or a slot
/// of its own: an IPv6 entry took 128 bytes), and IPv4's took 80 bytes more as one local than
/// as separate values. A slot is used by one run at a time: program runs of one hook do not
/// nest on a CPU.
#[repr(C)]
pub struct Room<A: Addr> {
    /// The entry the packet is rewritten by.
    pub entry: FlowOf<A>,
    /// A live entry's next state (`conntrack::update`), or a masquerade claim (`snat`).
    pub next: FlowOf<A>,
    /// A partner entry being written, and a key being looked up or written.
    pub other: FlowOf<A>,
    pub key: FlowKeyOf<A>,
    pub other_key: FlowKeyOf<A>,
    /// Packet bytes being summed (`csum::fill_udp6`; IPv6's alone).
    pub chunk: SumChunk,
    /// The fast path's next hop (`redirect`).
    pub hop: Hop<A>,
    /// A DSR session being followed or opened (`dsr`), for the same reason.
    pub dsr: DsrSessionOf<A>,
}

/// A run's per-CPU slot: what it parsed (read through a reference, like the room, so that
/// its addresses are not kept in registers spilled to the stack around every helper call)
/// and its room.
#[repr(C)]
pub struct Slot<A: Addr> {
    pub parsed: Parsed<FlowKeyOf<A>>,
    pub room: Room<A>,
}

/// Room for finding a packet's next hop, in the run's slot ([`Room`]): on the stack,
/// it left the IPv6 TC ingress program's frame, with DSR's beside it, over its 512 bytes.
#[repr(C)]
pub struct Hop<A> {
    /// The packet's destination as it stands.
    pub daddr: A,
    /// A FIB lookup's parameters and answer.
    pub fib: FibParams,
    /// The endpoint that lookup gives.
    pub ep: Endpoint,
}
