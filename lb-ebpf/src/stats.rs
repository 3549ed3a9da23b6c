//! Per-CPU counters: packets and bytes per backend (the controller assigns the ids, sums the
//! CPUs, and sums a service's backends), and one packet count per program and outcome reason. Per-CPU,
//! so the hot path needs no atomics.
//!
//! A service's or backend's counter is created by its first packet, not by the controller:
//! per-CPU memory is spent on what carries traffic, and writing 200,000 backends costs no
//! per-CPU allocation (one took ~40 µs from the controller here). The controller deletes a
//! counter one sync after its owner is gone, before its id is handed out again, so a new
//! owner starts at zero.
use aya_ebpf::bindings::BPF_NOEXIST;
use lb_common::{Counters, REASONS, Reason};

use crate::maps::{COUNTERS, REASON_COUNTS};

#[inline(always)]
fn add(id: u32, bytes: u32) {
    for _ in 0..2 {
        if let Some(c) = COUNTERS.get_ptr_mut(&id) {
            // SAFETY: a per-CPU value is only ever touched by this CPU's program run.
            unsafe {
                let c: *mut Counters = c;
                (*c).packets += 1;
                (*c).bytes += u64::from(bytes);
            }
            return;
        }
        // Created with this CPU's value; the kernel zeroes the other CPUs'. Another CPU may
        // create it first: then the lookup finds it.
        let first = Counters {
            packets: 1,
            bytes: u64::from(bytes),
        };
        if COUNTERS.insert(&id, &first, BPF_NOEXIST as u64).is_ok() {
            return;
        }
    }
}

/// Accounts one packet of a translated flow or a DSR session to its backend's counter
/// (`counter`). Its service's total is the sum of its backends', summed by the controller:
/// one counter lookup per packet, not two (a per-CPU hash lookup is ~35 ns of a tracked
/// packet's ~170 here).
#[inline(always)]
pub fn account(counter: u32, bytes: u32) {
    add(counter, bytes);
}

/// Counts one run of program `hook` that ended for `reason`.
#[inline(always)]
pub fn reason(hook: u32, reason: Reason) {
    if let Some(c) = REASON_COUNTS.get_ptr_mut(hook * REASONS + reason as u32) {
        // SAFETY: as above, this CPU's slot.
        unsafe { *c += 1 };
    }
}
