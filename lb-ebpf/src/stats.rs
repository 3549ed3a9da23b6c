//! Per-CPU packet and byte counters, one slot per service and per backend (the controller
//! assigns the slots and sums the CPUs). Per-CPU, so the hot path needs no atomics.
use lb_common::Translation;

use crate::maps::COUNTERS;

#[inline(always)]
fn add(slot: u32, bytes: u16) {
    if let Some(c) = COUNTERS.get_ptr_mut(slot) {
        // SAFETY: a per-CPU slot is only ever touched by this CPU's program run.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += u64::from(bytes);
        }
    }
}

/// Accounts one packet of a translated flow to its backend and its service.
#[inline(always)]
pub fn account(t: &Translation, bytes: u16) {
    add(t.counter, bytes);
    add(t.service_counter, bytes);
}
