//! How a program run ends ([`Verdict`]) and what a path may do to the frame it runs on
//! ([`Ctx`]): shared by every path (`nat`, `dsr`, `icmp`, `snat`), owned by none, so that the
//! paths depend on it and not on each other.
use lb_common::{Reason, csum::Rewrite};

use crate::parse::Frame;

/// How a program run ends.
pub enum Verdict {
    /// Not translated: on to the stack (or the next program) untouched.
    Pass(Reason),
    /// Rewritten by a flow entry.
    Translated,
    /// A flow that cannot be given a unique tuple (the kernel's NAT drops these too), or a
    /// packet whose rewrite failed halfway (which must not leave half-translated).
    Drop(Reason),
    /// Translated and handed to a local endpoint past the stack (`redirect`): the TC action.
    Redirect(i32),
    /// A DSR VIP's frame readdressed to its backend's MAC, L3 and L4 untouched (`dsr`), to be
    /// sent out of device `ifindex`: each hook turns it into its own action
    /// (`dsr::xdp_action`, `dsr::tc_action`).
    Dsr { reason: Reason, ifindex: u32 },
}

impl Verdict {
    pub fn reason(&self) -> Reason {
        match self {
            Verdict::Pass(r) | Verdict::Drop(r) | Verdict::Dsr { reason: r, .. } => *r,
            Verdict::Translated => Reason::Translated,
            Verdict::Redirect(_) => Reason::Redirected,
        }
    }
}

/// A program context the paths can parse and rewrite.
pub trait Ctx: Frame + Rewrite {}
impl<T: Frame + Rewrite> Ctx for T {}
