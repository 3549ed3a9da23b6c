//! The live node: its namespaces ([`netns`]), addresses, aliases and links over rtnetlink
//! ([`netlink`]), what a change is checked against before it is saved ([`check`]), and the
//! events that tell the daemon the node changed under a network ([`watch`]).
pub mod check;
pub mod netlink;
pub mod netns;
pub mod watch;

pub use netlink::{ALIAS_PROTO, BpfFilter, Netlink, NodeAddr};
pub use netns::{in_netns, join_netns, netns_path};
