//! The pure core: [`model`] (the desired state) and [`validate`] (its rules) → [`compose`] (every
//! contribution of a network folded into one backend set per VIP and per published port) →
//! [`elements`] (the partitioned bucket intervals, in DESIGN.md's notation); [`edit`] changes
//! the desired state as the daemon holds it, composed and indexed, edit by edit, and [`diff`]
//! says what a change does to it. No I/O: everything a dataplane will be told is decided here
//! and can be asserted without root.
pub mod compose;
pub mod diff;
pub mod edit;
pub mod elements;
pub mod model;
pub mod schema;
pub mod validate;
