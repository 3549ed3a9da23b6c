//! Attaching a network's programs to its interfaces, and detaching them.
//!
//! Links are pinned under the network's directory (`link_<if>_<hook>`), so they outlive the
//! process that made them; a hook whose link is already pinned is adopted as it is. On kernels
//! without TCX, TC programs are netlink clsact filters, which belong to the interface and are
//! replaced rather than stacked.
use std::path::Path;

use anyhow::{Context as _, Result};
use aya::programs::{
    SchedClassifier, TcAttachType, Xdp, XdpMode,
    links::{FdLink, PinnedLink},
    tc::{self, NlOptions, TcAttachOptions},
};

use super::{EbpfNetwork, PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_XDP, TcMode};
use crate::{core::model::Attach, netlink::Netlink};

/// Prefix of link pin names.
const LINK_PREFIX: &str = "link_";

impl EbpfNetwork {
    fn link_path(&self, ifname: &str, hook: &str) -> std::path::PathBuf {
        self.dir.join(format!("{LINK_PREFIX}{ifname}_{hook}"))
    }

    /// Attaches the programs to `ifname` (in the calling thread's network namespace): TC
    /// egress and TC ingress always; with `attach xdp` also XDP in front of TC ingress where
    /// the driver runs XDP natively, which translates what it can prove it rewrites right and
    /// leaves the rest to TC ingress. Generic (skb) XDP is never used: it runs on the same skb
    /// TC sees, after the same allocation, so it only adds cost (and on a bridge the kernel
    /// hands TC ingress a frame it no longer parses). Returns whether XDP is attached.
    pub fn attach(&mut self, ifname: &str, attach: Attach, tc_mode: TcMode) -> Result<bool> {
        self.attach_tc(
            ifname,
            PROG_TC_EGRESS,
            TcAttachType::Egress,
            "egress",
            tc_mode,
        )?;
        self.attach_tc(
            ifname,
            PROG_TC_INGRESS,
            TcAttachType::Ingress,
            "ingress",
            tc_mode,
        )?;
        match attach {
            Attach::Tc => Ok(false),
            Attach::Xdp => self.attach_xdp(ifname),
        }
    }

    fn attach_tc(
        &mut self,
        ifname: &str,
        prog: &str,
        hook: TcAttachType,
        name: &str,
        mode: TcMode,
    ) -> Result<()> {
        let pin = self.link_path(ifname, name);
        if mode == TcMode::Tcx
            && keep_pinned(&pin, ifname, || {
                let (_, progs) = SchedClassifier::query_tcx(ifname, hook)?;
                Ok(progs.iter().map(|p| p.id()).collect())
            })?
        {
            return Ok(());
        }
        let p: &mut SchedClassifier = self
            .ebpf
            .program_mut(prog)
            .with_context(|| format!("{prog} missing from the object"))?
            .try_into()?;
        if p.fd().is_err() {
            p.load().with_context(|| format!("loading {prog}"))?;
        }
        let options = match mode {
            TcMode::Tcx => TcAttachOptions::TcxOrder(Default::default()),
            TcMode::Netlink => {
                // clsact may be there already (an earlier run, another tool): that is fine, and
                // any other failure surfaces as the attach's error below.
                let _ = tc::qdisc_add_clsact(ifname);
                // A filter of ours from an earlier run is replaced rather than stacked. Between
                // the two a packet passes untranslated; flows survive (they live in the maps).
                let _ = tc::qdisc_detach_program(ifname, hook, prog);
                TcAttachOptions::Netlink(NlOptions::default())
            }
        };
        let id = p
            .attach_with_options(ifname, hook, options)
            .with_context(|| format!("attaching {prog} to {ifname} {name} ({mode:?})"))?;
        let link = p.take_link(id)?;
        match mode {
            TcMode::Tcx => {
                let fd: FdLink = link.try_into().context("a TCX link is an fd link")?;
                pin_link(fd, &pin)
            }
            // A netlink filter belongs to the interface, not to this process: nothing to pin,
            // and dropping the handle must not detach it.
            TcMode::Netlink => {
                std::mem::forget(link);
                Ok(())
            }
        }
    }

    fn attach_xdp(&mut self, ifname: &str) -> Result<bool> {
        let pin = self.link_path(ifname, "xdp");
        if keep_pinned(&pin, ifname, || {
            Ok(Netlink::new()?.xdp_prog_id(ifname)?.into_iter().collect())
        })? {
            return Ok(true);
        }
        let p: &mut Xdp = self
            .ebpf
            .program_mut(PROG_XDP)
            .context("lb_xdp missing from the object")?
            .try_into()?;
        if p.fd().is_err() {
            p.load().context("loading lb_xdp")?;
        }
        let id = match p.attach(ifname, XdpMode::Driver) {
            Ok(id) => id,
            Err(native) => {
                tracing::info!(interface = ifname, error = %native, "no native XDP on this interface: TC ingress serves it alone");
                return Ok(false);
            }
        };
        let link = p.take_link(id)?;
        let fd: FdLink = link
            .try_into()
            .context("XDP link is not an fd link (kernel too old)")?;
        pin_link(fd, &pin)?;
        Ok(true)
    }

    /// Whether XDP is attached to `ifname` (its link is pinned).
    pub fn has_xdp(&self, ifname: &str) -> bool {
        self.link_path(ifname, "xdp").exists()
    }
}

/// Whether the link pinned at `pin` (if any) is attached to `ifname` now, so it is kept as it
/// is. A link outlives the interface it was attached to: when the interface is deleted (or its
/// namespace goes) the link stays, defunct, and a same-named interface that comes back has
/// nothing attached. Such a pin is removed (which frees the link) so the caller attaches
/// again. `attached` lists the ids of the programs that run on the hook now.
fn keep_pinned(
    pin: &Path,
    ifname: &str,
    attached: impl FnOnce() -> Result<Vec<u32>>,
) -> Result<bool> {
    if !pin.exists() {
        return Ok(false);
    }
    let link: FdLink = PinnedLink::from_pin(pin)
        .with_context(|| format!("opening the pinned link {}", pin.display()))?
        .into();
    let prog = link
        .info()
        .with_context(|| format!("reading the pinned link {}", pin.display()))?
        .program_id();
    if attached()
        .with_context(|| format!("listing the programs attached to {ifname}"))?
        .contains(&prog)
    {
        return Ok(true);
    }
    tracing::info!(interface = ifname, pin = %pin.display(), "the pinned link is no longer attached (the interface was recreated); attaching again");
    std::fs::remove_file(pin).with_context(|| format!("removing {}", pin.display()))?;
    Ok(false)
}

fn pin_link(link: FdLink, path: &Path) -> Result<()> {
    let pinned: PinnedLink = link
        .pin(path)
        .with_context(|| format!("pinning link at {}", path.display()))?;
    // The pin keeps the link; this process's handle may go.
    drop(pinned);
    Ok(())
}

/// Removes the pinned links of a network directory: each detaches once no process holds it.
pub(super) fn unpin_links(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with(LINK_PREFIX) {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Detaches everything `attach` attached to `ifnames` and removes the network's pins.
pub fn detach_all(dir: &Path, ifnames: &[String], tc_mode: TcMode) -> Result<()> {
    for ifname in ifnames {
        if tc_mode == TcMode::Netlink {
            for (hook, prog) in [
                (TcAttachType::Ingress, PROG_TC_INGRESS),
                (TcAttachType::Egress, PROG_TC_EGRESS),
            ] {
                let _ = tc::qdisc_detach_program(ifname, hook, prog);
            }
        }
    }
    if dir.exists() {
        // Unpinning a link detaches it once no process holds it; unpinning a map frees it once
        // no program does.
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}
