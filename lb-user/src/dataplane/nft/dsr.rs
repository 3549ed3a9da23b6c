//! The DSR table of a `mode: dsr` network: moby's `docker-lb-dsr` (seed `initNFTLBDSR`,
//! `applyNFTLBDSR`) as `netdev lb-<network>`, beside the network's `ip lb-<network>` NAT table
//! and written in the same `nft -f` transactions.
//!
//! Layout:
//! - set `vip`: the network's VIPs;
//! - the `real-server` elements (exactly those `lb elements` prints) in the NAT table's
//!   per-shape units (`ruleset.rs`), kind `d`: verdict map `real-server-dispatch` (VIP →
//!   `jump d-S`), chain `d-S` drawing `numgen random mod 65536` into the interval vmap `d-S`
//!   (`I_k : goto d-S-k`), and chain `d-S-k` with `fwd ip to ip daddr map @d-S-k device meta
//!   iif`, its map `VIP : backend` (with a counter) being moby's element `VIP . I_k :
//!   backend`. One unit serves every device: the frame leaves by the device it came in by;
//! - maps `dsr-conntrack-{tcp,udp,sctp}`: the sessions, `ip saddr . th sport . ip daddr .
//!   th dport : ether daddr` (the backend's MAC), dynamic, 65536 each, per protocol as moby
//!   (nft 1.0.6 cannot compile an update of one map keyed by `meta l4proto` too);
//! - per present interface `IF`, base chains `ingress-IF` and `egress-IF` (netdev ingress and
//!   egress hooks of that device). Ingress: ARP, other non-IPv4 and non-VIP frames pass; a VIP
//!   frame is untracked and takes our MAC as its source, then either its session's MAC or, new,
//!   the dispatch to the backend its bucket draws (the kernel resolves its MAC as for any next
//!   hop), out of `IF` again; a VIP frame of no session and no backend comes back from the
//!   dispatch (a `jump`) and is counted and dropped.
//!   Egress learns the session from the frame `fwd` sent (its destination MAC is the
//!   backend's), and a TCP RST deletes it.
//!
//! Differences from the seed, and why:
//! - moby's `real-server` is one map keyed `ip daddr . numgen random mod 65536`, flags
//!   interval: a concatenated interval (pipapo) set, which nft 1.0.6 and the kernel refuse
//!   past ~1,365 elements (see `dataplane::nft`); the units have no limit but the maps' sizes,
//!   and a change writes only its sets' elements, as on the NAT table.
//! - moby's chains drop every non-ARP frame that is not IPv4 (`ip daddr != @vip` carries an
//!   implicit `meta protocol ip`, so an IPv6 frame matches neither it nor a session and ends
//!   in `counter drop`); here such frames pass, as the design says of non-VIP traffic.
//! - moby's RST rule updates the session with `timeout 0s`, which nft 1.0.6 drops without a
//!   word (the rule lists back without it and refreshes the session instead); the packet-path
//!   `delete @dsr-conntrack-tcp { KEY : ether daddr }` ends it (without `: ether daddr` the
//!   kernel refuses the rule: "Invalid argument").
//! - the session timeout is written per element by the update (`KEY timeout Ns : ether
//!   daddr`), not only as the map's default, so a changed `timeouts.dsr` takes effect by
//!   rewriting the chains, and no sync ever has to delete a session map: sessions survive
//!   every sync, daemon restart and change of this layout (their map is declared with `add`,
//!   a no-op when it exists; a whole declaration deletes only the chains and maps it does not
//!   write, and never a session's).
//!
//! IPv6 VIPs (beside IPv4's in the same table: one table per network, its chains per device,
//! and each frame's family tells the rules apart): set `vip6`; units of kind `d6` (dispatch
//! `real-server6-dispatch`) whose slot chains draw the backend's number in [`backends6`],
//! from 1, into the mark (`meta mark set ip6 daddr map @d6-S-k goto new6`); one dataless
//! dynamic set of sessions per backend and protocol, `dsr6-P-HEX` (HEX: the backend's
//! address), keyed `ip6 saddr . th sport . ip6 daddr . th dport`; and the chain `new6`. Why
//! not IPv4's sessions: nft 1.0.6 miscompiles the packet-path update of a dynamic map whose
//! key is longer than 16 bytes (the key gets one 16-byte register and the value is loaded
//! into the next, over the rest of the key: sessions learnt with the backend's MAC in the
//! client's address, which no packet ever finds; a key led by an IPv6 address after a shorter
//! field aborts nft, "netlink_gen_expr: Assertion `dreg < ctx->reg_low' failed"), while
//! updates of dataless sets with the same key compile and run. So a session's set says its
//! backend: ingress tries each backend's sets (a RST is sent on and ends its session), and a
//! new session has its unit draw its backend's number into the mark and goes to `new6`,
//! which learns it in that backend's set (IPv6 needs no egress rule) and sends it with `fwd
//! ip6 to` out of the device it came in by (the kernel resolves the MAC by neighbour
//! discovery). ICMPv6 to an IPv6 VIP passes (neighbour discovery of the VIP, and echo, which
//! the balancer answers, as on the eBPF dataplane). What it costs: a session's packet is
//! looked up in the sets of each backend before its own (a few per backend), where IPv4's is
//! one map lookup, and the ingress and `new6` chains have rules per IPv6 backend, rewritten
//! with every sync; the numbers are places, so a change of the IPv6 backends rewrites every
//! IPv6 unit's elements. A network of IPv4 VIPs alone has none of IPv6's objects.
//! Differences from IPv4's: sessions are learnt as the frame is sent on, not as it leaves;
//! the sets of a backend that leaves the network go with it, its TCP sessions too.
//!
//! Counters: each `real-server` element counts the new sessions it placed (the first packet
//! of a session; the rest follow the session map), as the NAT elements count new flows.
//!
//! One file because the DSR table has one layout (above): its declaration, chains, fill and probe
//! are written from the same names.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv6Addr},
};

use super::{
    diff::{TableUpdate, layout_update, units_in_use},
    ruleset::{self, Kind, Layout, table_name},
};
use crate::core::{
    compose::ComposedNetwork,
    elements::SetKey,
    model::{Family, Mode, Network, Proto},
};

/// The set of VIPs the chains divert (moby's name).
pub const VIP_SET: &str = "vip";
/// The protocols with a session map, in rule order.
pub const PROTOS: &[Proto] = Proto::ALL;
/// A session's key and what it maps to (moby's session map type).
const SESSION_KEY: &str = "ip saddr . th sport . ip daddr . th dport";
/// Sessions per protocol (moby's size).
pub const SESSIONS: u32 = 65536;

/// The session map of `proto`.
pub fn session_map(proto: Proto) -> String {
    format!("dsr-conntrack-{proto}")
}

/// IPv6's VIP set (see the module).
pub const VIP6_SET: &str = "vip6";
/// The version of this table's layout, in a dsr network's sync token (`ruleset::sync_token`):
/// a table an lb of another layout wrote is declared whole, its objects replaced.
pub const LAYOUT: &str = "lb-dsr-2";
/// An IPv6 session's key (the set it is in says its backend).
const SESSION_KEY6: &str = "ip6 saddr . th sport . ip6 daddr . th dport";
/// The prefix of IPv6's session sets.
const SESSION_SET6: &str = "dsr6-";

/// Whether `network` has IPv6 VIPs, and so the table IPv6's objects and rules.
pub fn has_ipv6(network: &Network) -> bool {
    network.vips().iter().any(IpAddr::is_ipv6)
}

/// The IPv6 backends of the network's services with an IPv6 VIP, disabled ones included
/// (their sessions go on), in the order that numbers them: backend `i` is `i + 1` in
/// `real-server6` and in the mark a new session's rules test.
pub fn backends6(network: &Network) -> Vec<Ipv6Addr> {
    let all: BTreeSet<Ipv6Addr> = (network.services.iter())
        .filter(|s| s.vips.iter().any(IpAddr::is_ipv6))
        .flat_map(|s| s.backends.iter())
        .filter_map(|b| match b.ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        })
        .collect();
    all.into_iter().collect()
}

/// The session set of IPv6 backend `backend` for `proto`.
pub fn session_set6(proto: Proto, backend: Ipv6Addr) -> String {
    format!("{SESSION_SET6}{proto}-{:032x}", u128::from(backend))
}

/// The protocol and backend a session set's name says ([`session_set6`]).
pub fn parse_session_set6(name: &str) -> Option<(Proto, Ipv6Addr)> {
    let (proto, hex) = name.strip_prefix(SESSION_SET6)?.split_once('-')?;
    let proto = PROTOS.iter().copied().find(|p| p.as_str() == proto)?;
    Some((proto, u128::from_str_radix(hex, 16).ok()?.into()))
}

/// The session sets of `backends` (every protocol's).
fn session_sets6(backends: &[Ipv6Addr]) -> impl Iterator<Item = String> + '_ {
    (backends.iter()).flat_map(|&b| PROTOS.iter().map(move |&p| session_set6(p, b)))
}

/// The chain a new IPv6 session goes to, from the unit that drew its backend's number.
pub const NEW6: &str = "new6";

/// The chains of device `ifname` (its base chains).
pub fn device_chains(ifname: &str) -> [String; 2] {
    [ingress_chain(ifname), egress_chain(ifname)]
}

pub fn ingress_chain(ifname: &str) -> String {
    format!("ingress-{ifname}")
}

pub fn egress_chain(ifname: &str) -> String {
    format!("egress-{ifname}")
}

/// What one sync writes of a network's DSR table, decided by the caller from the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sync {
    /// The network has the table: mode dsr on a kernel that runs it.
    pub on: bool,
    /// The table was written for the previous state (a difference from it only).
    pub was_on: bool,
    /// The network's interfaces present in its namespace: each gets its two chains (a rule
    /// can only `fwd` to a device that exists; one that appears later makes the node watcher
    /// apply again).
    pub present: Vec<String>,
    /// Chains the table holds before this sync (read back before a whole declaration; for a
    /// difference, the chains of the previous state's interfaces): each one not rewritten
    /// is deleted.
    pub chains: Vec<String>,
    /// Maps the table holds before a whole declaration (read back): each one the new layout
    /// does not use is deleted.
    pub maps: Vec<String>,
    /// IPv6's session sets the table holds before this sync (as `chains`): the sets of
    /// backends the network no longer has are deleted.
    pub sets6: Vec<String>,
}

impl Sync {
    /// The table for a first declaration into an empty namespace where every interface
    /// exists (the pure rendering the golden test pins).
    pub fn fresh(network: &Network) -> Sync {
        Sync {
            on: network.mode == Mode::Dsr,
            was_on: false,
            present: network.interfaces.clone(),
            ..Sync::default()
        }
    }
}

/// The DSR table's layout of `family` for the VIPs `wanted` selects: the `real-server`
/// elements as per-shape units, an IPv4 element translating to its backend, an IPv6 one to
/// its backend's number ([`backends6`]).
pub fn layout(
    network: &ComposedNetwork,
    family: Family,
    wanted: impl Fn(&SetKey) -> bool,
) -> Layout {
    match family {
        Family::V4 => Layout::of_real_server(network, family, wanted, |b| {
            b.is_ipv4().then(|| b.to_string())
        }),
        Family::V6 => {
            let number: BTreeMap<IpAddr, usize> = (backends6(network).into_iter().enumerate())
                .map(|(i, b)| (IpAddr::V6(b), i + 1))
                .collect();
            Layout::of_real_server(network, family, wanted, |b| {
                number.get(&b).map(usize::to_string)
            })
        }
    }
}

/// `add table` then `delete table`: the table goes whether or not it exists.
pub fn delete_table(s: &mut String, network: &str) {
    super::ruleset::delete_table(s, &format!("netdev {}", table_name(network)));
}

/// Which VIP sets and dispatch maps [`maps`] empties (the caller fills them).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Empty {
    None,
    /// IPv6's alone (the network's first IPv6 VIP: whatever an earlier one left goes).
    Ipv6,
    Both,
}

/// The sets, the dispatch maps and the session maps, declared if missing (`add` of an
/// existing one changes nothing but a session map's default timeout), with the VIP sets and
/// the dispatch maps emptied as `empty` says; with IPv6's, the chain `new6` (declared before
/// the units whose rules go to it). Sessions are kept.
fn maps(s: &mut String, t: &str, timeout: u32, empty: Empty, v6: Option<&[Ipv6Addr]>) {
    let _ = writeln!(s, "add table netdev {t}");
    for &family in families(v6.is_some()) {
        let (set, kind) = (vip_set(family), Kind::RealServer(family));
        let _ = writeln!(
            s,
            "add set netdev {t} {set} {{ type {}; }}\nadd map netdev {t} {} {{ type {} : verdict; }}",
            kind.key_type(family),
            kind.dispatch(),
            kind.key_type(family)
        );
        if empty == Empty::Both || (empty == Empty::Ipv6 && family == Family::V6) {
            let _ = writeln!(
                s,
                "flush set netdev {t} {set}\nflush map netdev {t} {}",
                kind.dispatch()
            );
        }
    }
    for &p in PROTOS {
        let _ = writeln!(
            s,
            "add map netdev {t} {} {{ typeof {SESSION_KEY} : ether daddr; flags dynamic, timeout; size {SESSIONS}; timeout {timeout}s; }}",
            session_map(p)
        );
    }
    let Some(backends) = v6 else { return };
    let _ = writeln!(s, "add chain netdev {t} {NEW6}");
    for set in session_sets6(backends) {
        session_set(s, t, &set, timeout);
    }
}

/// The VIP set of `family`.
fn vip_set(family: Family) -> &'static str {
    match family {
        Family::V4 => VIP_SET,
        Family::V6 => VIP6_SET,
    }
}

/// Declares IPv6 session set `set` (a no-op but for its default timeout when it exists).
fn session_set(s: &mut String, t: &str, set: &str, timeout: u32) {
    let _ = writeln!(
        s,
        "add set netdev {t} {set} {{ typeof {SESSION_KEY6}; flags dynamic, timeout; size {SESSIONS}; timeout {timeout}s; }}"
    );
}

/// Deletes the IPv6 session sets of `sync.sets6` that are not `backends`' (after the chains
/// that used them were rewritten: a set a rule uses cannot go).
fn drop_sets6(s: &mut String, t: &str, timeout: u32, sync: &Sync, backends: &[Ipv6Addr]) {
    let keep: BTreeSet<String> = session_sets6(backends).collect();
    for set in sync.sets6.iter().filter(|n| !keep.contains(*n)) {
        // Declared first, so a set already gone is no error.
        session_set(s, t, set, timeout);
        let _ = writeln!(s, "delete set netdev {t} {set}");
    }
}

/// Deletes chains `gone`, which nothing refers to any more (`add` first, so a chain already
/// gone is no error).
fn drop_chains<'a>(s: &mut String, t: &str, gone: impl IntoIterator<Item = &'a String>) {
    for c in gone {
        let _ = writeln!(
            s,
            "add chain netdev {t} {c}\nflush chain netdev {t} {c}\ndelete chain netdev {t} {c}"
        );
    }
}

/// The chains of every present interface, declared and their rules written again (flushed
/// first: the same chain keeps its hook, so no frame passes unseen during the swap), and
/// with IPv6's rules the chain `new6` (declared by [`maps`]).
fn chains(s: &mut String, t: &str, timeout: u32, present: &[String], v6: Option<&[Ipv6Addr]>) {
    if let Some(backends) = v6 {
        new6(s, t, timeout, backends);
    }
    for ifname in present {
        let dev = format!("\"{ifname}\"");
        let (ingress, egress) = (ingress_chain(ifname), egress_chain(ifname));
        let pass = match v6 {
            None => vec![
                "meta protocol arp counter accept".to_owned(),
                "meta protocol != ip counter accept".to_owned(),
                format!("ip daddr != @{VIP_SET} counter accept"),
            ],
            // Each family's test matches its own frames only (`ip daddr` implies IPv4).
            Some(_) => vec![
                "meta protocol arp counter accept".to_owned(),
                "meta protocol != { ip, ip6 } counter accept".to_owned(),
                format!("ip daddr != @{VIP_SET} counter accept"),
                format!("ip6 daddr != @{VIP6_SET} counter accept"),
                "meta l4proto ipv6-icmp counter accept".to_owned(),
            ],
        };
        let mut rules = pass.to_vec();
        rules.push("notrack ether saddr set ether daddr counter".to_owned());
        for &p in PROTOS {
            rules.push(format!(
                "ip protocol {p} ether daddr set {SESSION_KEY} map @{} counter fwd to {dev}",
                session_map(p)
            ));
        }
        rules.push(format!(
            "ip protocol {{ {} }} ip daddr vmap @{}",
            protos(),
            Kind::RealServer(Family::V4).dispatch()
        ));
        if let Some(backends) = v6 {
            for &b in backends {
                let tcp = session_set6(Proto::Tcp, b);
                rules.push(format!(
                    "tcp flags rst {SESSION_KEY6} @{tcp} delete @{tcp} {{ {SESSION_KEY6} }} counter fwd ip6 to {b} device {dev}"
                ));
                for &p in PROTOS {
                    let set = session_set6(p, b);
                    rules.push(format!(
                        "meta l4proto {p} {SESSION_KEY6} @{set} update @{set} {{ {SESSION_KEY6} timeout {timeout}s }} counter fwd ip6 to {b} device {dev}"
                    ));
                }
            }
            rules.push(format!(
                "meta l4proto {{ {} }} ip6 daddr vmap @{}",
                protos(),
                Kind::RealServer(Family::V6).dispatch()
            ));
        }
        rules.push("counter drop".to_owned());
        base_chain(s, t, &ingress, "ingress", &dev, &rules);

        let mut rules = pass.to_vec();
        rules.push(format!(
            "tcp flags rst delete @{} {{ {SESSION_KEY} : ether daddr }} counter accept",
            session_map(Proto::Tcp)
        ));
        for &p in PROTOS {
            rules.push(format!(
                "ip protocol {p} update @{} {{ {SESSION_KEY} timeout {timeout}s : ether daddr }} counter accept",
                session_map(p)
            ));
        }
        base_chain(s, t, &egress, "egress", &dev, &rules);
    }
}

/// `tcp, udp, sctp`.
fn protos() -> String {
    (PROTOS.iter().map(|p| p.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The chain of new IPv6 sessions (reached with the mark an IPv6 unit drew): learnt in their
/// backend's set and sent to it, out of the device they came in by; a RST is sent and opens
/// nothing.
fn new6(s: &mut String, t: &str, timeout: u32, backends: &[Ipv6Addr]) {
    let _ = writeln!(s, "flush chain netdev {t} {NEW6}");
    for (i, &b) in backends.iter().enumerate() {
        let n = i + 1;
        let _ = writeln!(
            s,
            "add rule netdev {t} {NEW6} meta mark {n} tcp flags rst counter fwd ip6 to {b} device meta iif"
        );
        for &p in PROTOS {
            let _ = writeln!(
                s,
                "add rule netdev {t} {NEW6} meta mark {n} meta l4proto {p} update @{} {{ {SESSION_KEY6} timeout {timeout}s }} counter fwd ip6 to {b} device meta iif",
                session_set6(p, b)
            );
        }
    }
    let _ = writeln!(s, "add rule netdev {t} {NEW6} counter drop");
}

fn base_chain(s: &mut String, t: &str, name: &str, hook: &str, dev: &str, rules: &[String]) {
    let _ = writeln!(
        s,
        "add chain netdev {t} {name} {{ type filter hook {hook} device {dev} priority filter; policy accept; }}\nflush chain netdev {t} {name}"
    );
    for r in rules {
        let _ = writeln!(s, "add rule netdev {t} {name} {r}");
    }
}

/// The families whose objects the table has: IPv4's always, IPv6's with an IPv6 VIP (`v6`).
fn families(v6: bool) -> &'static [Family] {
    if v6 { Family::ALL } else { &[Family::V4] }
}

/// The whole table for `network` (its sessions kept if it exists), or its removal when
/// `sync.on` is off; returns the real-server elements written. Every chain and map the table
/// had (`sync.chains`, `sync.maps`) that this layout does not use goes: units of shapes gone,
/// and the objects of an earlier layout.
pub fn declare(s: &mut String, network: &ComposedNetwork, sync: &Sync) -> usize {
    if !sync.on {
        delete_table(s, &network.name);
        return 0;
    }
    let t = table_name(&network.name);
    let timeout = network.timeouts.dsr_secs();
    let backends = backends6(network);
    let v6 = has_ipv6(network).then_some(backends.as_slice());
    maps(s, &t, timeout, Empty::Both, v6);
    let layouts: Vec<(Family, Layout)> = (families(v6.is_some()).iter())
        .map(|&f| (f, layout(network, f, |_| true)))
        .collect();
    // What is kept: the present devices' chains, `new6` with IPv6's rules, the units, and
    // every map `maps` declares.
    let mut keep: BTreeSet<String> = (sync.present.iter())
        .flat_map(|i| device_chains(i))
        .collect();
    if v6.is_some() {
        keep.insert(NEW6.to_owned());
    }
    keep.extend(PROTOS.iter().map(|&p| session_map(p)));
    for (family, layout) in &layouts {
        keep.insert(Kind::RealServer(*family).dispatch().to_owned());
        keep.extend(layout.objects());
    }
    // No rule refers to anything once every chain is empty, and no verdict to a chain once
    // the verdict maps that go are (the kept dispatch maps were emptied by `maps`): then
    // what is not kept can go.
    for c in &sync.chains {
        let _ = writeln!(s, "flush chain netdev {t} {c}");
    }
    for m in sync.maps.iter().filter(|m| !keep.contains(*m)) {
        let _ = writeln!(s, "flush map netdev {t} {m}\ndelete map netdev {t} {m}");
    }
    for c in sync.chains.iter().filter(|c| !keep.contains(*c)) {
        let _ = writeln!(s, "delete chain netdev {t} {c}");
    }
    let mut n = 0;
    for (family, layout) in &layouts {
        fill(s, &t, *family, layout);
        n += layout.element_count();
    }
    chains(s, &t, timeout, &sync.present, v6);
    drop_sets6(s, &t, timeout, sync, &backends);
    n
}

/// Declares `layout`'s units (emptied first where they exist) with their elements, its
/// VIPs and its dispatch entries, into a table whose VIP set and dispatch map of `family`
/// are empty.
fn fill(s: &mut String, t: &str, family: Family, layout: &Layout) {
    let nt = format!("netdev {t}");
    ruleset::add_units(s, &nt, family, layout);
    let vips = layout.vips.iter().map(IpAddr::to_string).collect();
    ruleset::add_elements(s, &nt, vip_set(family), vips);
    ruleset::dispatch_elements(s, &nt, &layout.dispatch, |_| true);
}

/// The difference from the table written for `previous` to `network`'s, over the sets
/// `changed` selects (`diff::changed`; every other set is the same in both), into `u`'s
/// transactions as the NAT tables' (see `diff::Update`): units that come are declared in
/// `prepare`, changed elements deleted and added again in `script` (the rest keep their
/// counters), units that go deleted in `retire`. A table that appears or goes is declared or
/// deleted whole in `script`.
pub(super) fn update(
    u: &mut TableUpdate,
    network: &ComposedNetwork,
    previous: &ComposedNetwork,
    changed: &dyn Fn(&SetKey) -> bool,
    sync: &Sync,
) {
    if sync.on != sync.was_on {
        // A table that appears is new: the previous state had none (the objects `sync`
        // names from it are not there).
        let fresh = Sync {
            chains: Vec::new(),
            maps: Vec::new(),
            sets6: Vec::new(),
            ..sync.clone()
        };
        u.written += declare(&mut u.script, network, &fresh);
        return;
    }
    if !sync.on {
        return;
    }
    let t = table_name(&network.name);
    let nt = format!("netdev {t}");
    // A new timeout lands in the map's default too (the rules carry it per element).
    let timeout = network.timeouts.dsr_secs();
    let backends = backends6(network);
    let v6 = has_ipv6(network).then_some(backends.as_slice());
    let had6 = has_ipv6(previous);
    // IPv6's objects appear with the network's first IPv6 VIP: their sets emptied then.
    let empty = if v6.is_some() && !had6 {
        Empty::Ipv6
    } else {
        Empty::None
    };
    if v6.is_some() {
        // A new IPv6 unit's rule goes to `new6`, which the table may not have yet.
        let _ = writeln!(u.prepare, "add chain {nt} {NEW6}");
    }
    maps(&mut u.script, &t, timeout, empty, v6);
    let (was, now) = (
        layout(previous, Family::V4, changed),
        layout(network, Family::V4, changed),
    );
    let rest = || units_in_use(network.composed(), Family::V4, changed, true);
    layout_update(u, &nt, Family::V4, VIP_SET, (&was, &now), rest);
    if v6.is_some() || had6 {
        // The backends' numbers are their places in `backends6`: where the backends changed
        // (and where IPv6's units come or go whole), every element is written again;
        // otherwise only the changed sets' are.
        let all = backends6(previous) != backends || v6.is_none() || !had6;
        let wanted = |k: &SetKey| all || changed(k);
        let (was, now) = (
            layout(previous, Family::V6, wanted),
            layout(network, Family::V6, wanted),
        );
        let rest = || {
            if all {
                BTreeSet::new()
            } else {
                units_in_use(network.composed(), Family::V6, changed, true)
            }
        };
        layout_update(u, &nt, Family::V6, VIP6_SET, (&was, &now), rest);
    }
    let present: BTreeSet<String> = (sync.present.iter())
        .flat_map(|i| device_chains(i))
        .collect();
    drop_chains(
        &mut u.script,
        &t,
        sync.chains.iter().filter(|c| !present.contains(*c)),
    );
    chains(&mut u.script, &t, timeout, &sync.present, v6);
    if v6.is_none() && had6 {
        // The last IPv6 VIP went: `new6` goes once the units that lead to it have (in
        // `retire`); emptied now, as the sets its rules name go below.
        let _ = writeln!(u.script, "flush chain {nt} {NEW6}");
        drop_chains(&mut u.retire, &t, [NEW6.to_owned()].iter());
        u.retired = true;
    }
    drop_sets6(&mut u.script, &t, timeout, sync, &backends);
}

/// The network whose table (`lb-dsr-probe`) the probe declares and deletes in one
/// transaction: never seen by anyone.
const PROBE_NETWORK: &str = "dsr-probe";

/// One transaction that declares a DSR table with chains on `lo` and deletes it again:
/// every kernel feature the table uses (the netdev egress hook, Linux 5.16; `fwd`, `notrack`
/// and the packet-path `delete` in a netdev chain) is checked by the kernel when the
/// transaction is prepared, and nothing remains after it. (`nft -c` does not do: nft 1.0.6
/// sends the batch without its end and never reads the kernel's answer.)
pub fn probe_script() -> String {
    let mut s = String::new();
    let sync = Sync {
        on: true,
        was_on: false,
        present: vec!["lo".to_owned()],
        ..Sync::default()
    };
    // With one unit of each family and IPv6's rules for one backend: their `fwd … device
    // meta iif`, the packet-path set update and `fwd ip6` too.
    let state = format!(
        r#"{{"networks":[{{"name":"{PROBE_NETWORK}","mode":"dsr","interfaces":["lo"],"services":[{{"id":"p","vips":["10.255.255.1","fd00::1"],"backends":[{{"ip":"10.255.255.2"}},{{"ip":"fd00::2"}}]}}]}}]}}"#
    );
    let network = crate::core::model::DesiredState::from_json(&state)
        .expect("the probe's network is valid")
        .networks
        .remove(0);
    declare(&mut s, &ComposedNetwork::new(network), &sync);
    let _ = writeln!(s, "delete table netdev {}", table_name(PROBE_NETWORK));
    s
}
