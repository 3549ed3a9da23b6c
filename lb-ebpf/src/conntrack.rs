//! The LRU flow table. Each flow has an ingress entry (keyed by the packet as it arrives:
//! rewrite its destination) and an egress entry (keyed by the packet as it leaves: rewrite its
//! source). A tracked flow follows its entries whatever the service maps say now: that is what
//! keeps a flow on its backend while the backend set changes.
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
};
use lb_common::{FlowKey, MASQ_PORT_MAX, MASQ_PORT_MIN, Translation};

use crate::maps::FLOWS;

/// `last_seen_ns` is refreshed at most this often: a write per packet would bounce the entry's
/// cache line between CPUs for a value `lb conntrack` shows in seconds.
const TOUCH_NS: u64 = 1_000_000_000;

/// How many random masquerade ports a new flow tries before it gives up (and passes
/// untranslated): with a few thousand ports per backend this fails only when nearly all are taken.
const MASQ_PORT_TRIES: u32 = 8;

#[inline(always)]
pub fn lookup(key: &FlowKey) -> Option<Translation> {
    let entry = FLOWS.get_ptr_mut(key)?;
    // SAFETY: the map owns the value; a concurrent update of last_seen_ns is benign.
    unsafe {
        let now = bpf_ktime_get_ns();
        if now.wrapping_sub((*entry).last_seen_ns) > TOUCH_NS {
            (*entry).last_seen_ns = now;
        }
        Some(*entry)
    }
}

/// The tuple a packet of the opposite direction carries.
#[inline(always)]
pub fn reversed(key: &FlowKey) -> FlowKey {
    FlowKey {
        saddr: key.daddr,
        daddr: key.saddr,
        sport: key.dport,
        dport: key.sport,
        proto: key.proto,
        _pad: [0; 3],
    }
}

/// Records a new flow: `key` → `forward` (ingress) and the reply's tuple → `reply` (egress).
/// Two CPUs may see the first packets of one flow at once and pick different backends; the
/// forward entry is inserted only if absent, and whoever loses takes the winner's choice, so
/// one flow never has two backends.
#[inline(always)]
pub fn track(
    key: &FlowKey,
    forward: &Translation,
    reply_key: &FlowKey,
    reply: &Translation,
) -> Option<Translation> {
    if FLOWS.insert(key, forward, BPF_NOEXIST as u64).is_err() {
        return lookup(key);
    }
    FLOWS.insert(reply_key, reply, BPF_ANY as u64).ok()?;
    Some(*forward)
}

/// Claims a masquerade source port: inserts the reply-side entry `claim` under `base` with a
/// random port in `MASQ_PORT_MIN..=MASQ_PORT_MAX` as its destination port, only if that tuple
/// is free. The entry itself is the claim, so two clients with the same source port reaching
/// the same backend get two different ports.
#[inline(always)]
pub fn claim_masq_port(base: &FlowKey, claim: &Translation) -> Option<u16> {
    let span = u32::from(MASQ_PORT_MAX - MASQ_PORT_MIN) + 1;
    let mut key = *base;
    for _ in 0..MASQ_PORT_TRIES {
        // SAFETY: helper without preconditions.
        let port = MASQ_PORT_MIN + (unsafe { bpf_get_prandom_u32() } % span) as u16;
        key.dport = port.to_be();
        if FLOWS.insert(&key, claim, BPF_NOEXIST as u64).is_ok() {
            return Some(port.to_be());
        }
    }
    None
}

#[inline(always)]
pub fn forget(key: &FlowKey) {
    let _ = FLOWS.remove(key);
}

#[inline(always)]
pub fn insert_new(key: &FlowKey, value: &Translation) -> bool {
    FLOWS.insert(key, value, BPF_NOEXIST as u64).is_ok()
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}
