//! The `lb` controller.
//!
//! The core is pure: [`model`] (the desired state and its validation) → [`compose`] (every
//! contribution of a network folded into one backend set per VIP and per published port) →
//! [`elements`] (the partitioned bucket intervals, in DESIGN.md's notation). Everything a
//! dataplane will be told is decided there and can be asserted without root. The effectful
//! shell (dataplanes, netlink, daemon, api, cli) is built around it.
pub mod compose;
pub mod dataplane;
pub mod elements;
pub mod model;
