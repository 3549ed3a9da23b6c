//! Per-CPU counters: packets and bytes per service and per backend (the controller assigns
//! the slots and sums the CPUs), and one packet count per program and outcome reason. Per-CPU,
//! so the hot path needs no atomics.
use lb_common::{Counters, Flow, REASONS, Reason};

use crate::maps::{COUNTERS, REASON_COUNTS};

#[inline(always)]
fn add(slot: u32, bytes: u16) {
    if let Some(c) = COUNTERS.get_ptr_mut(&slot) {
        // SAFETY: a per-CPU slot is only ever touched by this CPU's program run.
        unsafe {
            let c: *mut Counters = c;
            (*c).packets += 1;
            (*c).bytes += u64::from(bytes);
        }
    }
}

/// Accounts one packet of a translated flow to its backend and its service.
#[inline(always)]
pub fn account(f: &Flow, bytes: u16) {
    add(f.counter, bytes);
    add(f.service_counter, bytes);
}

/// Counts one run of program `hook` that ended for `reason`.
#[inline(always)]
pub fn reason(hook: u32, reason: Reason) {
    if let Some(c) = REASON_COUNTS.get_ptr_mut(hook * REASONS + reason as u32) {
        // SAFETY: as above, this CPU's slot.
        unsafe { *c += 1 };
    }
}
