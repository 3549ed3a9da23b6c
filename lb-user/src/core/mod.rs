//! The pure core: [`model`] (the desired state) and [`validate`] (its rules) → [`compose`] (every
//! contribution of a network folded into one backend set per VIP and per published port) →
//! [`elements`] (the partitioned bucket intervals, in DESIGN.md's notation); [`diff`] says what a
//! change does to the desired state. No I/O: everything
//! a dataplane will be told is decided here and can be asserted without root.
pub mod compose;
pub mod diff;
pub mod edit;
pub mod elements;
pub mod model;
pub mod schema;
pub mod validate;
