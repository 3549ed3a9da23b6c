//! The flow table as the programs use it: finding a live entry, folding a packet into its
//! state and expiry (and its partner's), and claiming a tuple for a new entry. The rules
//! themselves (what opens a flow, timeouts, partners) are `lb_common::flow`'s.
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
};
use lb_common::{
    Config, FlowKeyOf, FlowOf, Reason,
    flow::{self, expired, is_partner, partner, partner_key},
};

use crate::{maps::FamilyMaps, room::Room, stats};

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Copies the map value at `e` into `to` (the run's room). Written as a copy of one value
/// that does not overlap the other, which LLVM expands inline: an assignment between two
/// pointers it cannot tell apart becomes a call of compiler-builtins' `memmove`, a byte loop
/// of some 200 instructions for an IPv4 entry, on every packet of a tracked flow.
///
/// # Safety
/// `e` points to a live map value (see [`find`]).
#[inline(always)]
pub unsafe fn copy_entry<A>(e: *const FlowOf<A>, to: &mut FlowOf<A>) {
    unsafe { core::ptr::copy_nonoverlapping(e, to, 1) }
}

/// What the table holds for a key at this moment.
pub enum Found<A> {
    /// A live entry (a pointer into the map: updates are in place).
    Live(*mut FlowOf<A>),
    /// Nothing, or an entry past its expiry (absent, for every purpose).
    Absent,
}

#[inline(always)]
pub fn find<A: FamilyMaps>(key: &FlowKeyOf<A>, now: u64, hook: u32) -> Found<A> {
    match A::flows().get_ptr_mut(key) {
        // SAFETY: the map owns the value; concurrent byte-wise updates are benign (see
        // lb_common::flow, "State").
        Some(e) if !expired(unsafe { &*e }, now) => Found::Live(e),
        Some(_) => {
            stats::reason(hook, Reason::EntryExpired);
            Found::Absent
        }
        None => Found::Absent,
    }
}

/// Folds a packet with `tcp_flags` into the live entry `e` (keyed by `key`) and, when its state
/// changed or its expiry is due, writes state and expiry to it and its partner, putting a
/// missing partner back. Only the fields that change are written: a concurrent writer's state
/// bytes are never overwritten with an older copy.
#[inline(always)]
pub fn update<A: FamilyMaps>(
    hook: u32,
    key: &FlowKeyOf<A>,
    e: *mut FlowOf<A>,
    tcp_flags: u8,
    cfg: &Config,
    now: u64,
    room: &mut Room<A>,
) {
    let next = &mut room.next;
    // SAFETY: `e` points into the map (see `find`).
    unsafe { copy_entry(e, next) };
    let changed = flow::observe(next, key.proto, tcp_flags);
    let timeout = flow::timeout_secs(next, key.proto, &cfg.timeouts);
    let Some(expires) = flow::next_expiry(next, now, timeout, changed) else {
        return;
    };
    next.expires_ns = expires;
    // SAFETY: as above.
    unsafe { write_state(e, next) };
    room.other_key = partner_key(next, key.proto);
    match A::flows().get_ptr_mut(&room.other_key) {
        // SAFETY: as above.
        Some(p) if is_partner(unsafe { &*p }, key) => unsafe { write_state(p, &room.next) },
        Some(_) => {}
        None => {
            (room.other_key, room.other) = partner(key, &room.next);
            if A::flows()
                .insert(&room.other_key, &room.other, BPF_NOEXIST as u64)
                .is_ok()
            {
                stats::reason(hook, Reason::EntryRestored);
            }
        }
    }
}

/// Writes `next`'s state bytes (those set in it) and expiry into `*e`.
///
/// # Safety
/// `e` must point into the flow map.
#[inline(always)]
unsafe fn write_state<A>(e: *mut FlowOf<A>, next: &FlowOf<A>) {
    unsafe {
        if next.replied != 0 && (*e).replied == 0 {
            (*e).replied = 1;
            (*e).recreated = 0;
        }
        if next.closing_orig != 0 && (*e).closing_orig == 0 {
            (*e).closing_orig = 1;
        }
        if next.closing_reply != 0 && (*e).closing_reply == 0 {
            (*e).closing_reply = 1;
        }
        if next.reset != 0 && (*e).reset == 0 {
            (*e).reset = 1;
        }
        (*e).expires_ns = next.expires_ns;
    }
}

/// Claims `key` for `value`, whose partner is keyed by `owner`: succeeds where the key is
/// free, where its entry expired, or where it already belongs to `owner` (the same flow's
/// previous connection on a reused tuple, or another CPU creating the same flow at the same
/// moment, which computed the same entry). An entry of another live flow keeps its key — and
/// a flow closed by FINs stays live for `tcp_time_wait`, while its backend may still hold
/// the tuple in TIME_WAIT (`lb_common::flow::timeout_secs`).
///
/// Two CPUs may both find the same expired entry and both overwrite it for different flows;
/// the later write wins and the earlier flow loses its reply direction (its next packets are
/// then re-created, see `lb_common::flow`). That takes two new flows hashing to the same port
/// of the same backend within the same microsecond as an expiry.
#[inline(always)]
pub fn claim<A: FamilyMaps>(
    key: &FlowKeyOf<A>,
    value: &FlowOf<A>,
    owner: &FlowKeyOf<A>,
    now: u64,
) -> bool {
    let flows = A::flows();
    if flows.insert(key, value, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    match flows.get_ptr(key) {
        // SAFETY: map value read in place.
        Some(e) if expired(unsafe { &*e }, now) || is_partner(unsafe { &*e }, owner) => {
            flows.insert(key, value, BPF_ANY as u64).is_ok()
        }
        Some(_) => false,
        // Evicted or collected between the two calls: take it.
        None => flows.insert(key, value, BPF_NOEXIST as u64).is_ok(),
    }
}

/// Writes an entry whose key is the flow's own (F or S): a previous entry there is this
/// tuple's previous connection, replaced.
#[inline(always)]
pub fn put<A: FamilyMaps>(key: &FlowKeyOf<A>, value: &FlowOf<A>) -> bool {
    A::flows().insert(key, value, BPF_ANY as u64).is_ok()
}
