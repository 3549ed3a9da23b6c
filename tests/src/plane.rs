//! The dataplanes a netns case runs on, and applying a network to one as `lb load` (eBPF) or
//! the daemon's fallback (nftables) would.
use lb_user::{
    core::{
        compose::ComposedNetwork,
        model::{Attach, Network},
    },
    dataplane::{Dataplane as _, NftDataplane, ebpf::TcMode},
    oneshot,
};

use crate::bpffs::Bpffs;

/// The programs with ingress at TC or at XDP (TC beside it), and the nftables ruleset (the
/// same network value; its `attach` is ignored there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Tc,
    Xdp,
    Nft,
}

impl Plane {
    pub fn attach(self) -> Attach {
        if self == Plane::Xdp {
            Attach::Xdp
        } else {
            Attach::Tc
        }
    }
}

/// Applies `net` (over `previous`, as the daemon would) on `plane`; panics with the reason
/// when it fails.
pub fn apply(plane: Plane, net: &Network, bpffs: &Bpffs, previous: Option<&Network>) {
    match plane {
        Plane::Nft => NftDataplane::default()
            .apply(
                &ComposedNetwork::new(net.clone()),
                previous.cloned().map(ComposedNetwork::new).as_ref(),
            )
            .map(drop)
            .expect("nftables apply"),
        Plane::Tc | Plane::Xdp => oneshot::apply_network(net, bpffs.path(), TcMode::detect())
            .map(drop)
            .expect("eBPF apply"),
    }
}
