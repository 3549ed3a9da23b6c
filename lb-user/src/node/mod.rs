//! The live node: its namespaces ([`netns`]), its kernel state over rtnetlink (addresses and
//! lb's aliases, links, neighbours, bridge forwarding entries, tc filters: [`netlink`]), what a change is checked against before it is saved ([`check`]), and the
//! events that tell the daemon the node changed under a network ([`watch`]), and whether the
//! node's firewall filters forwarded traffic, which the fast path would skip ([`filter`]), and
//! whether a veth's peer takes what XDP sends out of it ([`veth`]); the published ports the
//! daemon holds ([`hold`]); where the cgroup2 hierarchy is ([`cgroup`]); the `nft` command
//! ([`nft`]). Nothing here depends on a dataplane: the dataplanes build on it.
pub mod cgroup;
pub mod check;
pub mod filter;
pub mod hold;
pub mod netlink;
pub mod netns;
pub mod nft;
pub mod veth;
pub mod watch;

pub use filter::{ForwardFilters, NftEvents, forward_filters, nft_events};
pub use netlink::{ALIAS_PROTO, BpfFilter, FdbEntry, Link, LinkKind, Neighbour, Netlink, NodeAddr};
pub use netns::{in_netns, join_netns, netns_path};
