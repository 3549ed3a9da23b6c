//! Attaching a network's programs to its interfaces, replacing what runs there, detaching.
//!
//! Contracts:
//! - A hook runs one lb program, and the one this process loaded. What runs at a hook is
//!   compared with it by tag (the kernel's digest of the instructions, map references
//!   blanked) and by the maps it uses: the same program is left alone; any other (the build
//!   of another lb, or the same code bound to maps that were replaced) is replaced in one
//!   step, never detached first, so no packet passes the hook untranslated: TCX and XDP links
//!   are updated in place (`BPF_LINK_UPDATE`), a netlink clsact filter is changed at its own
//!   priority and handle (the kernel swaps the program under the filter).
//! - A hook is checked once per loaded object (per process and network): later applies cost
//!   nothing here, and a netlink filter is not touched again.
//! - TCX and XDP links are pinned under the network's directory (`link_<if>_<hook>`), so they
//!   outlive the process; netlink filters belong to the interface and need no pin.
//! - Only what the network no longer wants is detached: the hooks of an interface it dropped,
//!   XDP when it switched to `attach tc`, TCX links when the daemon switched to netlink filters.
//! - The socket programs hang on the cgroup2 root as links pinned like the others
//!   (`link_cgroup_<program>`): they outlive the process, as the TC hooks do (a UDP socket of
//!   the node sent to a backend needs its answers shown as the service's while the daemon
//!   restarts), and go with the network. A cgroup link cannot be updated in place through aya:
//!   a replacement is attached beside the old one (the cgroup runs both; the second finds a
//!   socket the first sent to a backend, which is no service) and pinned over it, which
//!   detaches the old one.
//!
//! One file because the contracts above hold for every kind of hook alike (TCX, netlink clsact
//! filters, XDP, cgroup links): one identity test, one rule for replacing in one step, one for
//! detaching.
use std::{collections::BTreeSet, path::Path};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::ProgramArray,
    programs::{
        CgroupAttachMode, CgroupSockAddr, Link as _, Program, ProgramError, ProgramFd, ProgramInfo,
        SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        loaded_programs,
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions},
        xdp::XdpLink,
    },
};

use super::{
    EbpfNetwork, PROG_SOCK, PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_TC_REPLY, PROG_XDP, TcMode,
};
use crate::{core::model::Attach, node::Netlink};
use lb_common::{HOOK_TC_EGRESS, HOOK_TC_INGRESS, HOOK_TC_REPLY, HOOK_XDP};

/// Prefix of link pin names.
const LINK_PREFIX: &str = "link_";

/// The TC hooks every interface gets: program, attach point, pin suffix.
const TC_HOOKS: [(&str, TcAttachType, &str); 2] = [
    (PROG_TC_EGRESS, TcAttachType::Egress, "egress"),
    (PROG_TC_INGRESS, TcAttachType::Ingress, "ingress"),
];
const XDP_HOOK: &str = "xdp";
/// The hook a local backend's veth gets while the fast path is on (`fast`).
const REPLY_HOOK: (&str, TcAttachType, &str) = (PROG_TC_REPLY, TcAttachType::Ingress, "reply");

/// What the socket programs' hooks are named on, in place of an interface.
const CGROUP: &str = "cgroup";

/// The name of `hook` on `ifname`: its pin's file name, and its key among checked hooks.
fn hook_name(ifname: &str, hook: &str) -> String {
    format!("{LINK_PREFIX}{ifname}_{hook}")
}

/// The hooks of a network, by [`hook_name`].
pub(super) struct Wanted {
    /// Every hook.
    hooks: BTreeSet<String>,
    /// The hooks that are pinned links (all but netlink filters).
    pins: BTreeSet<String>,
}

impl Wanted {
    /// The hooks of a network on `ifnames` with `attach` under `tc_mode`, and the reply
    /// hooks of the fast path on `ports`.
    pub(super) fn new(
        ifnames: &[String],
        ports: &[String],
        attach: Attach,
        tc_mode: TcMode,
    ) -> Self {
        let mut w = Wanted {
            hooks: BTreeSet::new(),
            pins: BTreeSet::new(),
        };
        for p in PROG_SOCK {
            w.hooks.insert(hook_name(CGROUP, p));
            w.pins.insert(hook_name(CGROUP, p));
        }
        for p in ports {
            w.hooks.insert(hook_name(p, REPLY_HOOK.2));
            if tc_mode == TcMode::Tcx {
                w.pins.insert(hook_name(p, REPLY_HOOK.2));
            }
        }
        for i in ifnames {
            for (_, _, hook) in TC_HOOKS {
                w.hooks.insert(hook_name(i, hook));
                if tc_mode == TcMode::Tcx {
                    w.pins.insert(hook_name(i, hook));
                }
            }
            if attach == Attach::Xdp {
                w.hooks.insert(hook_name(i, XDP_HOOK));
                w.pins.insert(hook_name(i, XDP_HOOK));
            }
        }
        w
    }
}

/// What tells two loaded programs apart: the tag and the maps they use. Maps are compared by
/// kernel id, which is stable because every map the programs use is pinned (`MAP_LAYOUTS`):
/// the same code over the same pins is the same identity. A map created per load (`.rodata`,
/// aya-log's) would make every restart replace the programs — harmless, but no longer "left
/// alone", which the upgrade tests check.
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    tag: u64,
    maps: BTreeSet<u32>,
}

impl Identity {
    fn of(info: &ProgramInfo) -> Result<Self> {
        let maps = (info.map_ids())
            .context("reading a program's map ids")?
            .unwrap_or_default();
        Ok(Identity {
            tag: info.tag(),
            maps: maps.into_iter().collect(),
        })
    }

    /// The identity of the loaded program `id` (`None` when it is gone).
    fn of_id(id: u32) -> Result<Option<Self>> {
        // aya has no lookup by id; programs come and go while this walks, so one that fails
        // to open is simply not it.
        for info in loaded_programs().flatten() {
            if info.id() == id {
                return Self::of(&info).map(Some);
            }
        }
        Ok(None)
    }
}

/// The program types lb attaches; each is loaded into the kernel on first use, once per
/// object (an attach or a replacement reuses the loaded program).
trait Loadable {
    fn load_once(&mut self) -> Result<(), ProgramError>;
    fn program_fd(&self) -> Result<&ProgramFd, ProgramError>;
}

macro_rules! loadable {
    ($($t:ty),*) => {$(
        impl Loadable for $t {
            fn load_once(&mut self) -> Result<(), ProgramError> {
                if self.fd().is_err() {
                    self.load()?;
                }
                Ok(())
            }
            fn program_fd(&self) -> Result<&ProgramFd, ProgramError> {
                self.fd()
            }
        }
    )*};
}
loadable!(SchedClassifier, Xdp, CgroupSockAddr);

/// Program `prog` of `ebpf` as a `T`, loaded.
fn loaded<'a, T: Loadable>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let p: &mut T = (ebpf.program_mut(prog))
        .with_context(|| format!("{prog} missing from the object"))?
        .try_into()?;
    p.load_once().with_context(|| format!("loading {prog}"))?;
    Ok(p)
}

/// The IPv6 program each IPv4 one tail-calls for an IPv6 frame (lb-ebpf's `main.rs`): the
/// IPv4 program, its twin, the program array and the slot (the hook's number).
const IPV6_TWINS: [(&str, &str, &str, u32); 4] = [
    (PROG_XDP, "lb_xdp6", "lb_jump6_xdp", HOOK_XDP),
    (
        PROG_TC_INGRESS,
        "lb_tc_ingress6",
        "lb_jump6_tc",
        HOOK_TC_INGRESS,
    ),
    (
        PROG_TC_EGRESS,
        "lb_tc_egress6",
        "lb_jump6_tc",
        HOOK_TC_EGRESS,
    ),
    (PROG_TC_REPLY, "lb_tc_reply6", "lb_jump6_tc", HOOK_TC_REPLY),
];

/// Program `prog` of `ebpf` loaded as a `T`, with its IPv6 twin (if it has one) loaded and in
/// its slot first: a program is never attached while its twin's slot is empty or holds
/// another object's twin.
fn loaded_with_twin<'a, T: Loadable>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut T>
where
    for<'b> &'b mut T: TryFrom<&'b mut Program, Error = ProgramError>,
{
    if let Some(&(_, twin, jump, slot)) = IPV6_TWINS.iter().find(|t| t.0 == prog) {
        let fd = loaded::<T>(ebpf, twin)?.program_fd()?.try_clone()?;
        let map =
            (ebpf.map_mut(jump)).with_context(|| format!("map {jump} missing from the object"))?;
        ProgramArray::try_from(map)?
            .set(slot, &fd, 0)
            .with_context(|| format!("putting {twin} in {jump}"))?;
    }
    loaded(ebpf, prog)
}

impl EbpfNetwork {
    /// Loads the IPv6 twins of the TC and XDP programs into their slots (what attaching
    /// does): for runs of the programs that attach nothing (program-level tests).
    pub fn load_ipv6_twins(&mut self) -> Result<()> {
        loaded_with_twin::<Xdp>(&mut self.ebpf, PROG_XDP)?;
        loaded_with_twin::<SchedClassifier>(&mut self.ebpf, PROG_TC_INGRESS)?;
        loaded_with_twin::<SchedClassifier>(&mut self.ebpf, PROG_TC_EGRESS)?;
        loaded_with_twin::<SchedClassifier>(&mut self.ebpf, PROG_TC_REPLY)?;
        Ok(())
    }

    fn link_path(&self, ifname: &str, hook: &str) -> std::path::PathBuf {
        self.dir.join(hook_name(ifname, hook))
    }

    fn tc_program(&mut self, prog: &str) -> Result<&mut SchedClassifier> {
        loaded_with_twin(&mut self.ebpf, prog)
    }

    fn xdp_program(&mut self) -> Result<&mut Xdp> {
        loaded_with_twin(&mut self.ebpf, PROG_XDP)
    }

    /// Attaches the programs to `ifname` (in the calling thread's network namespace), or
    /// replaces what runs there (see the module's contracts): TC egress and TC ingress always;
    /// with `attach xdp` also XDP in front of TC ingress where the driver runs XDP natively,
    /// which translates what it can prove it rewrites right and leaves the rest to TC
    /// ingress. Generic (skb) XDP is never used: it runs on the same skb TC sees, after the
    /// same allocation, so it only adds cost (and on a bridge the kernel hands TC ingress a
    /// frame it no longer parses).
    pub fn attach(
        &mut self,
        nl: &Netlink,
        ifname: &str,
        attach: Attach,
        tc_mode: TcMode,
    ) -> Result<()> {
        let index = nl.ifindex(ifname)?;
        for tc in TC_HOOKS {
            self.attach_tc(nl, ifname, index, tc, tc_mode)?;
        }
        let key = hook_name(ifname, XDP_HOOK);
        if attach == Attach::Xdp && self.hooks.get(&key) != Some(&index) {
            self.attach_xdp(nl, ifname)?;
            self.hooks.insert(key, index);
        }
        Ok(())
    }

    /// Attaches the fast path's reply program to TC ingress of `ifname` (a local backend's
    /// veth), or replaces what runs there, as for the network's own interfaces.
    pub(super) fn attach_reply(
        &mut self,
        nl: &Netlink,
        ifname: &str,
        tc_mode: TcMode,
    ) -> Result<()> {
        let index = nl.ifindex(ifname)?;
        self.attach_tc(nl, ifname, index, REPLY_HOOK, tc_mode)
    }

    /// One TC hook, checked once per interface index.
    fn attach_tc(
        &mut self,
        nl: &Netlink,
        ifname: &str,
        index: u32,
        (prog, hook, name): (&str, TcAttachType, &str),
        tc_mode: TcMode,
    ) -> Result<()> {
        let key = hook_name(ifname, name);
        if self.hooks.get(&key) == Some(&index) {
            return Ok(());
        }
        match tc_mode {
            TcMode::Tcx => self.attach_tcx(ifname, prog, hook, name)?,
            TcMode::Netlink => self.attach_netlink(nl, ifname, prog, hook)?,
        }
        self.hooks.insert(key, index);
        Ok(())
    }

    fn attach_tcx(
        &mut self,
        ifname: &str,
        prog: &str,
        hook: TcAttachType,
        name: &str,
    ) -> Result<()> {
        let pin = self.link_path(ifname, name);
        drop_if_detached(&pin, ifname, || {
            let (_, progs) = SchedClassifier::query_tcx(ifname, hook)?;
            Ok(progs.iter().map(|p| p.id()).collect())
        })?;
        let p = self.tc_program(prog)?;
        if pin.exists() {
            if let Some((link, running)) = stale_link(&pin, &p.info()?)? {
                let link = SchedClassifierLink::try_from(link)
                    .with_context(|| format!("{} is not a TCX link", pin.display()))?;
                let id = p
                    .attach_to_link(link)
                    .with_context(|| format!("replacing the program of {}", pin.display()))?;
                // The pin keeps the link; this process's handle may go.
                drop(p.take_link(id)?);
                replaced(ifname, prog, running, &p.info()?);
            }
            return Ok(());
        }
        let id = p
            .attach_with_options(ifname, hook, TcAttachOptions::TcxOrder(Default::default()))
            .with_context(|| format!("attaching {prog} to {ifname} {name} (TCX)"))?;
        let fd: FdLink = p
            .take_link(id)?
            .try_into()
            .context("a TCX link is an fd link")?;
        pin_link(fd, &pin)?;
        // A netlink filter of ours left by a daemon run with `--tc netlink` goes once the TCX
        // link is in (for a moment both translate; the second finds nothing to match).
        let _ = tc::qdisc_detach_program(ifname, hook, prog);
        Ok(())
    }

    /// A netlink clsact filter: added once; later left alone while it runs our program, and
    /// replaced at its priority and handle when it runs another. Filters of our program's
    /// name stacked beside it (an lb that re-attached on every apply) are removed.
    fn attach_netlink(
        &mut self,
        nl: &Netlink,
        ifname: &str,
        prog: &str,
        hook: TcAttachType,
    ) -> Result<()> {
        let index = nl.ifindex(ifname)?;
        let mut filters: Vec<_> = nl
            .bpf_filters(index, hook == TcAttachType::Egress)?
            .into_iter()
            .filter(|f| f.name == prog)
            .collect();
        filters.sort_by_key(|f| (f.priority, f.handle));
        let p = self.tc_program(prog)?;
        let Some((first, stacked)) = filters.split_first() else {
            // clsact may be there already (an earlier run, another tool): that is fine, and
            // any other failure surfaces as the attach's error below.
            let _ = tc::qdisc_add_clsact(ifname);
            let id = p
                .attach_with_options(ifname, hook, TcAttachOptions::Netlink(NlOptions::default()))
                .with_context(|| format!("attaching {prog} to {ifname} (netlink)"))?;
            // A netlink filter belongs to the interface, not to this process: dropping the
            // handle must not detach it.
            std::mem::forget(p.take_link(id)?);
            return Ok(());
        };
        for f in stacked {
            SchedClassifierLink::attached(ifname, hook, f.priority, f.handle.into(), None)?
                .detach()
                .with_context(|| format!("removing a stacked {prog} filter from {ifname}"))?;
        }
        if Identity::of_id(first.prog_id)? == Some(Identity::of(&p.info()?)?) {
            return Ok(());
        }
        let link =
            SchedClassifierLink::attached(ifname, hook, first.priority, first.handle.into(), None)?;
        let id = p
            .attach_to_link(link)
            .with_context(|| format!("replacing {prog} on {ifname} (netlink)"))?;
        std::mem::forget(p.take_link(id)?);
        replaced(ifname, prog, first.prog_id, &p.info()?);
        Ok(())
    }

    /// XDP in driver mode, or nothing where the driver has no native XDP (logged).
    fn attach_xdp(&mut self, nl: &Netlink, ifname: &str) -> Result<()> {
        let pin = self.link_path(ifname, XDP_HOOK);
        drop_if_detached(&pin, ifname, || {
            Ok(nl.xdp_prog_id(ifname)?.into_iter().collect())
        })?;
        let p = self.xdp_program()?;
        if pin.exists() {
            if let Some((link, running)) = stale_link(&pin, &p.info()?)? {
                let link = XdpLink::try_from(link)
                    .with_context(|| format!("{} is not an XDP link", pin.display()))?;
                let id = p
                    .attach_to_link(link)
                    .with_context(|| format!("replacing the program of {}", pin.display()))?;
                drop(p.take_link(id)?);
                replaced(ifname, PROG_XDP, running, &p.info()?);
            }
            return Ok(());
        }
        let id = match p.attach(ifname, XdpMode::Driver) {
            Ok(id) => id,
            Err(native) => {
                tracing::info!(interface = ifname, error = %native, "no native XDP on this interface: TC ingress serves it alone");
                return Ok(());
            }
        };
        let fd: FdLink = p
            .take_link(id)?
            .try_into()
            .context("XDP link is not an fd link (kernel too old)")?;
        pin_link(fd, &pin)
    }

    /// Attaches the socket programs to the cgroup2 root `cgroup`, or replaces what runs there
    /// (see the module's contracts); checked once per loaded object.
    pub(super) fn attach_sock(&mut self, cgroup: &Path) -> Result<()> {
        for prog in PROG_SOCK {
            let key = hook_name(CGROUP, prog);
            if self.hooks.contains_key(&key) {
                continue;
            }
            let pin = self.dir.join(&key);
            let p: &mut CgroupSockAddr = loaded(&mut self.ebpf, prog)?;
            let running = if pin.exists() {
                match stale_link(&pin, &p.info()?)? {
                    None => {
                        self.hooks.insert(key, 0);
                        continue;
                    }
                    Some((_, running)) => Some(running),
                }
            } else {
                None
            };
            let dir = std::fs::File::open(cgroup)
                .with_context(|| format!("opening cgroup {}", cgroup.display()))?;
            // A cgroup link always runs beside the cgroup's other programs; the kernel takes
            // no flags with one (`Single` is aya's "none": it asks for allow-multi
            // otherwise, which the kernel refuses with EINVAL).
            let id = p
                .attach(&dir, CgroupAttachMode::Single)
                .with_context(|| format!("attaching {prog} to cgroup {}", cgroup.display()))?;
            let fd: FdLink = p
                .take_link(id)?
                .try_into()
                .context("a cgroup link is not an fd link (kernel without BPF_LINK_CREATE)")?;
            // bpffs takes no '.' in a name; a leftover of a crash here is a `link_` pin no
            // network wants, which `detach_unwanted` removes.
            let fresh = self.dir.join(format!("{key}_new"));
            let _ = std::fs::remove_file(&fresh);
            pin_link(fd, &fresh)?;
            std::fs::rename(&fresh, &pin)
                .with_context(|| format!("pinning {} over {}", fresh.display(), pin.display()))?;
            if let Some(old) = running {
                replaced(CGROUP, prog, old, &p.info()?);
            }
            self.hooks.insert(key, 0);
        }
        Ok(())
    }

    /// Detaches every hook of this network that `want` does not name: pinned links by their
    /// pins, and the netlink filters of `dropped` (interfaces the network no longer has;
    /// netlink filters have no pin to find them by).
    pub(super) fn detach_unwanted(
        &mut self,
        want: &Wanted,
        dropped: &[String],
        tc_mode: TcMode,
    ) -> Result<()> {
        for entry in std::fs::read_dir(&self.dir)
            .with_context(|| format!("listing {}", self.dir.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", self.dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(LINK_PREFIX) && !want.pins.contains(&name) {
                // Unpinning detaches: this process holds no handle of its links.
                std::fs::remove_file(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
                tracing::info!(link = name, "detached a hook the network no longer has");
            }
        }
        if tc_mode == TcMode::Netlink {
            detach_netlink(dropped);
            // Ports that lost their reply hook (the fast path went off, the port left the
            // bridge) are not interfaces of the network: found by the hooks checked here.
            let ports: Vec<String> = (self.hooks.keys())
                .filter(|h| !want.hooks.contains(*h))
                .filter_map(|h| {
                    h.strip_prefix(LINK_PREFIX)?
                        .strip_suffix(REPLY_HOOK.2)?
                        .strip_suffix('_')
                })
                .map(str::to_owned)
                .collect();
            detach_netlink(&ports);
        }
        self.hooks.retain(|h, _| want.hooks.contains(h));
        Ok(())
    }

    /// Whether XDP is attached to `ifname` (its link is pinned).
    pub fn has_xdp(&self, ifname: &str) -> bool {
        self.link_path(ifname, XDP_HOOK).exists()
    }
}

/// Removes the pin of a link that no longer runs on `ifname`, so the caller attaches afresh.
/// A link outlives the interface it was attached to: when the interface is deleted (or its
/// namespace goes) the link stays, defunct, and a same-named interface that comes back has
/// nothing attached; such a link cannot be updated back to life. `attached` lists the ids of
/// the programs that run on the hook now.
fn drop_if_detached(
    pin: &Path,
    ifname: &str,
    attached: impl FnOnce() -> Result<Vec<u32>>,
) -> Result<()> {
    if !pin.exists() {
        return Ok(());
    }
    let (_, prog) = pinned(pin)?;
    if attached()
        .with_context(|| format!("listing the programs attached to {ifname}"))?
        .contains(&prog)
    {
        return Ok(());
    }
    tracing::info!(interface = ifname, pin = %pin.display(), "the pinned link no longer runs on its interface (the interface was recreated); attaching again");
    std::fs::remove_file(pin).with_context(|| format!("removing {}", pin.display()))
}

/// The link pinned at `pin`, with the id of the program it runs.
fn pinned(pin: &Path) -> Result<(FdLink, u32)> {
    let link: FdLink = PinnedLink::from_pin(pin)
        .with_context(|| format!("opening {}", pin.display()))?
        .into();
    let running = (link.info())
        .with_context(|| format!("reading {}", pin.display()))?
        .program_id();
    Ok((link, running))
}

/// The link pinned at `pin`, with the id of the program it runs, when that program is not
/// `ours`; `None` when it is.
fn stale_link(pin: &Path, ours: &ProgramInfo) -> Result<Option<(FdLink, u32)>> {
    let (link, running) = pinned(pin)?;
    if Identity::of_id(running)? == Some(Identity::of(ours)?) {
        return Ok(None);
    }
    Ok(Some((link, running)))
}

/// The one line an upgrade leaves per hook.
fn replaced(ifname: &str, prog: &str, old: u32, new: &ProgramInfo) {
    tracing::info!(
        interface = ifname,
        program = prog,
        old = old,
        new = new.id(),
        "replaced the running program in place"
    );
}

fn pin_link(link: FdLink, path: &Path) -> Result<()> {
    let pinned: PinnedLink = link
        .pin(path)
        .with_context(|| format!("pinning link at {}", path.display()))?;
    // The pin keeps the link; this process's handle may go.
    drop(pinned);
    Ok(())
}

/// Removes our netlink filters from `ifnames` (best effort: an interface that is gone took
/// its filters with it).
fn detach_netlink(ifnames: &[String]) {
    for ifname in ifnames {
        for (prog, hook, _) in TC_HOOKS.into_iter().chain([REPLY_HOOK]) {
            let _ = tc::qdisc_detach_program(ifname, hook, prog);
        }
    }
}

/// Detaches everything `attach` attached to `ifnames` and removes the network's pins.
pub fn detach_all(dir: &Path, ifnames: &[String], tc_mode: TcMode) -> Result<()> {
    if tc_mode == TcMode::Netlink {
        detach_netlink(ifnames);
    }
    if dir.exists() {
        // Unpinning a link detaches it once no process holds it; unpinning a map frees it once
        // no program does.
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}
