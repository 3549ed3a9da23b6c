//! The fast path's controller side: whether a network may bypass the node's stack, the local
//! endpoints its programs hand packets to (`lb_endpoints`), and the backends' veths whose
//! replies are caught where they enter the node (`lb_tc_reply`).
//!
//! Contracts:
//! - The programs redirect a family's packets only while `lb_config` says that family's fast
//!   path is on (`FAST_PATH_V4`, `FAST_PATH_V6`), to an endpoint of its map (`lb_endpoints`,
//!   `lb_endpoints6`) or to a next hop the kernel's FIB resolves. A family's switch is set
//!   after its endpoints are written and cleared before they are emptied and the reply hooks
//!   go. Each direction falls back to the stack on its own, so any mix of a filled map and
//!   attached hooks during a change delivers every packet.
//! - On with `fast-path on` (direct: every translated packet may be redirected); with `auto`,
//!   direct for each family no rule of the namespace's forward hooks (`node::filter`) can
//!   see, vetted for a family such rules can see (`FAST_PATH_VETTED_*`): each direction of a
//!   flow is redirected only while netfilter's judgment of it stands (`lb_common::flow`,
//!   "Judgment"), a flowtable's contract. The rules are read again at every apply and
//!   whenever the namespace's ruleset changes (the watcher); a change voids every judgment
//!   (`lb_vetted_since`, written before the switch that asks for judgments), so the next
//!   packet of every fast direction is judged under the new rules. The decision with its
//!   reasons is kept for `lb status`.
//! - Endpoints come from the kernel's own tables, never guessed: a neighbour (ARP's or
//!   neighbour discovery's) with a usable MAC on one of the network's interfaces; behind a
//!   bridge, the port the bridge's FDB names for that MAC. They follow neighbour and link
//!   events (the watcher); a neighbour the kernel has not resolved is no endpoint, and its
//!   packets take the stack, which resolves it.
use std::{collections::BTreeMap, net::IpAddr};

use anyhow::{Context as _, Result};
use lb_common::{
    Addr6, ENDPOINT_BRIDGED, ENDPOINT_PEER, Endpoint, FAST_PATH_V4, FAST_PATH_V6,
    FAST_PATH_VETTED_V4, FAST_PATH_VETTED_V6,
    flow::{self, REJUDGE_NS},
};

use super::{EbpfNetwork, TcMode, be4, be6, gc::monotonic_ns, sync::write_exactly};
use crate::{
    core::model::{FastPath, Network},
    node::{FdbEntry, ForwardFilters, Link, LinkKind, Neighbour, Netlink, filter},
};

/// How a sync finds the namespace's forward-hook rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// As last read (neighbours changed, not the ruleset).
    Kept,
    /// Read again (an apply): a reading that differs from the last is a change.
    Read,
    /// Changed (the watcher saw the ruleset change): read again, and every judgment voided.
    Changed,
}

/// Which path a network's translated packets take, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathState {
    /// Handed to local endpoints past the stack; replies caught on these ports. `families`:
    /// the `FAST_PATH_*` bits of the families that take it (with `FAST_PATH_VETTED_*` for
    /// those that take it only once judged); `notes`, why a family is vetted or on the stack.
    Fast {
        families: u32,
        endpoints: usize,
        ports: Vec<String>,
        notes: Option<String>,
    },
    /// Through the node's stack, for this reason.
    Stack(String),
}

impl PathState {
    /// The `Config::fast_path` bits this state stands for.
    pub fn families(&self) -> u32 {
        match self {
            PathState::Fast { families, .. } => *families,
            PathState::Stack(_) => 0,
        }
    }
}

impl std::fmt::Display for PathState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathState::Fast {
                endpoints,
                ports,
                notes,
                ..
            } => write!(
                f,
                "fast: {endpoints} local endpoint(s) reached past the stack, replies caught on {} port(s){}{}",
                ports.len(),
                if ports.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", ports.join(", "))
                },
                notes
                    .as_deref()
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default()
            ),
            PathState::Stack(why) => write!(f, "stack: {why}"),
        }
    }
}

/// What the fast path reaches, from one look at the namespace's tables.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Local {
    /// Address (network order) → endpoint, per family.
    pub endpoints: BTreeMap<u32, Endpoint>,
    pub endpoints6: BTreeMap<Addr6, Endpoint>,
    /// The veths plugged into the network's bridges (local backends), by name.
    pub ports: Vec<String>,
}

impl Local {
    /// Keeps the endpoints of the families of `families` (`FAST_PATH_*` bits) alone.
    fn only(mut self, families: u32) -> Self {
        if families & FAST_PATH_V4 == 0 {
            self.endpoints.clear();
        }
        if families & FAST_PATH_V6 == 0 {
            self.endpoints6.clear();
        }
        self
    }
}

/// Which families take the fast path under `mode` with the forward-hook rules `filters`, as
/// `FAST_PATH_*` bits (`FAST_PATH_VETTED_*` beside a family's bit where it takes the vetted
/// path), and why a family is vetted or takes the stack.
fn decide(mode: FastPath, filters: &ForwardFilters) -> (u32, Vec<String>) {
    match mode {
        FastPath::Off => (0, vec!["fast-path off".to_owned()]),
        FastPath::On => (FAST_PATH_V4 | FAST_PATH_V6, Vec::new()),
        FastPath::Auto => {
            let mut on = 0;
            let mut why = Vec::new();
            for (bit, vetted, rules, family) in [
                (FAST_PATH_V4, FAST_PATH_VETTED_V4, &filters.v4, "IPv4"),
                (FAST_PATH_V6, FAST_PATH_VETTED_V6, &filters.v6, "IPv6"),
            ] {
                if rules.is_empty() {
                    on |= bit;
                } else {
                    on |= bit | vetted;
                    why.push(format!(
                        "{family} vetted: each direction of a flow takes the stack until netfilter has passed one of its packets, again every {} s and after every ruleset change, as rules in the forward hooks could apply to its traffic ({}); fast-path on bypasses them",
                        REJUDGE_NS / 1_000_000_000,
                        rules.join("; ")
                    ));
                }
            }
            (on, why)
        }
    }
}

/// The endpoints and ports of a network whose interfaces have `interfaces` as indexes.
pub fn local(
    links: &[Link],
    neighbours: &[Neighbour],
    fdb: &[FdbEntry],
    interfaces: &[u32],
) -> Local {
    let by_index: BTreeMap<u32, &Link> = links.iter().map(|l| (l.index, l)).collect();
    let up = |i: u32| by_index.get(&i).copied().filter(|l| l.up);
    let mut out = Local::default();
    for l in links {
        let on_bridge = (l.master)
            .and_then(|m| by_index.get(&m))
            .is_some_and(|m| m.kind == LinkKind::Bridge && interfaces.contains(&m.index));
        if on_bridge && l.kind == LinkKind::Veth && l.up {
            out.ports.push(l.name.clone());
        }
    }
    out.ports.sort();
    for n in neighbours {
        if !interfaces.contains(&n.ifindex) {
            continue;
        }
        let Some(l3) = up(n.ifindex) else { continue };
        let Some(smac) = l3.mac else { continue };
        let (out_link, flags) = match l3.kind {
            LinkKind::Bridge => {
                let Some(port) = (fdb.iter())
                    .find(|e| e.master == l3.index && e.mac == n.mac)
                    .and_then(|e| up(e.port))
                else {
                    // Not learnt yet: the bridge would flood; the stack's path does.
                    continue;
                };
                let peer = if port.kind == LinkKind::Veth {
                    ENDPOINT_PEER
                } else {
                    0
                };
                (port, ENDPOINT_BRIDGED | peer)
            }
            LinkKind::Veth => (l3, ENDPOINT_PEER),
            LinkKind::Other => (l3, 0),
        };
        let ep = Endpoint {
            ifindex: out_link.index,
            l3_ifindex: l3.index,
            mtu: l3.mtu.min(out_link.mtu),
            dmac: n.mac,
            smac,
            flags,
        };
        match n.addr {
            IpAddr::V4(a) => {
                out.endpoints.insert(be4(a), ep);
            }
            // Link-local neighbours (every IPv6 neighbour has one) are never a translated
            // packet's destination: no service, backend or client of one is accepted.
            IpAddr::V6(a) if !a.is_unicast_link_local() && !a.is_multicast() => {
                out.endpoints6.insert(be6(a), ep);
            }
            IpAddr::V6(_) => {}
        }
    }
    out
}

impl EbpfNetwork {
    /// Decides the network's path and makes the maps and reply hooks say so (in the calling
    /// thread's namespace); `check_filters`: read the forward-hook rules again (otherwise the
    /// last reading stands). Returns the ports whose reply hooks the network wants.
    pub(super) fn sync_fast_path(
        &mut self,
        nl: &Netlink,
        network: &Network,
        interfaces: &[u32],
        tc_mode: TcMode,
        rules: Rules,
    ) -> Result<Vec<String>> {
        // Whether judgments made so far may stand: not after a change of the rules, nor when
        // this process has not seen them before (they may have changed while no lb watched).
        let mut changed = rules == Rules::Changed;
        if rules != Rules::Kept || self.filters.is_none() {
            // What cannot be read cannot be ruled out: vetted, saying why (a judgment is the
            // kernel's own, whatever the rules).
            let read = match network.fast_path {
                FastPath::Auto => {
                    filter::forward_filters(&network.interfaces).unwrap_or_else(|e| {
                        ForwardFilters::both(format!("the ruleset could not be read: {e:#}"))
                    })
                }
                _ => ForwardFilters::default(),
            };
            changed |= self.filters.as_ref() != Some(&read);
            self.filters = Some(read);
        }
        let filters = self.filters.clone().unwrap_or_default();
        let (on, why) = decide(network.fast_path, &filters);
        let before = self.fast_path_bits();
        // A family that becomes vetted must not take judgments from an earlier vetted spell.
        let vetted = FAST_PATH_VETTED_V4 | FAST_PATH_VETTED_V6;
        if on & vetted & !before != 0 || changed && on & vetted != 0 {
            self.void_judgments()?;
        }
        if on == 0 {
            self.path = Some(PathState::Stack(why.join("; ")));
            self.write_switch(0)?;
            self.write_endpoints(&Local::default())?;
            return Ok(Vec::new());
        }
        let local = local(&nl.link_table()?, &nl.neighbours()?, &nl.fdb()?, interfaces).only(on);
        for port in &local.ports {
            self.attach_reply(nl, port, tc_mode)
                .with_context(|| format!("attaching the reply hook to {port}"))?;
        }
        // A family turned off stops redirecting before its endpoints go; one turned on
        // starts once they are written (the module's contract).
        self.write_switch(before & on)?;
        self.write_endpoints(&local)?;
        self.path = Some(PathState::Fast {
            families: on,
            endpoints: local.endpoints.len() + local.endpoints6.len(),
            ports: local.ports.clone(),
            notes: (!why.is_empty()).then(|| why.join("; ")),
        });
        self.write_switch(on)?;
        Ok(local.ports)
    }

    /// Makes every judgment made so far void (`lb_vetted_since`: now).
    fn void_judgments(&mut self) -> Result<()> {
        let since = flow::stamp(monotonic_ns());
        self.vetted_since
            .set(0, since, 0)
            .context("writing lb_vetted_since")
    }

    /// The `Config::fast_path` bits of the last decision.
    pub(super) fn fast_path_bits(&self) -> u32 {
        self.path.as_ref().map_or(0, PathState::families)
    }

    /// Makes `lb_config` hold `bits` as its fast-path switch, where the maps have been synced
    /// once (before that, the apply's sync writes the whole config with the decision's).
    fn write_switch(&mut self, bits: u32) -> Result<()> {
        let Some(m) = self.mirror.as_mut() else {
            return Ok(());
        };
        m.set_fast_path(&mut self.config, bits)
    }

    /// Makes `lb_endpoints` and `lb_endpoints6` hold exactly `want`'s, writing only the
    /// difference with what they held (read once per loaded object).
    fn write_endpoints(&mut self, want: &Local) -> Result<()> {
        write_exactly(
            &mut self.endpoints,
            &mut self.endpoint_mirror,
            &want.endpoints,
            "lb_endpoints",
        )?;
        write_exactly(
            &mut self.endpoints6,
            &mut self.endpoint_mirror6,
            &want.endpoints6,
            "lb_endpoints6",
        )
    }

    /// The network's path as last decided (`None` before its first apply).
    pub fn path(&self) -> Option<&PathState> {
        self.path.as_ref()
    }
}

#[cfg(test)]
mod tests;
