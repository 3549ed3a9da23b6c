//! The DSR table of a `mode: dsr` network: moby's `docker-lb-dsr` (seed `initNFTLBDSR`,
//! `applyNFTLBDSR`) as `netdev lb-<network>`, beside the network's `ip lb-<network>` NAT table
//! and written in the same `nft -f` transaction.
//!
//! Layout:
//! - set `vip`: the network's VIPs; map `real-server` (`VIP . numgen bucket : backend`, flags
//!   interval, counter): exactly the `real-server` elements `lb elements` prints;
//! - maps `dsr-conntrack-{tcp,udp,sctp}`: the sessions, `ip saddr . th sport . ip daddr .
//!   th dport : ether daddr` (the backend's MAC), dynamic, 65536 each, per protocol as moby
//!   (nft 1.0.6 cannot compile an update of one map keyed by `meta l4proto` too);
//! - per present interface `IF`, base chains `ingress-IF` and `egress-IF` (netdev ingress and
//!   egress hooks of that device). Ingress: ARP, other non-IPv4 and non-VIP frames pass; a VIP
//!   frame is untracked and takes our MAC as its source, then either its session's MAC or, new,
//!   `fwd ip to` the backend the bucket draws (the kernel resolves its MAC as for any next
//!   hop), out of `IF` again; a VIP frame of no session and no backend is counted and dropped.
//!   Egress learns the session from the frame `fwd` sent (its destination MAC is the
//!   backend's), and a TCP RST deletes it.
//!
//! Differences from the seed, and why:
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
//!   every sync and daemon restart (their map is declared with `add`, a no-op when it exists).
//!
//! IPv6 VIPs (beside IPv4's in the same table: one table per network, its chains per device,
//! and each frame's family tells the rules apart): set `vip6`; map `real-server6` (`VIP .
//! numgen bucket : N`, the number of the backend in [`backends6`], from 1, as a mark); one
//! dataless dynamic set of sessions per backend and protocol, `dsr6-P-HEX` (HEX: the
//! backend's address), keyed `ip6 saddr . th sport . ip6 daddr . th dport`; and per device a
//! regular chain `new6-IF`. Why not IPv4's layout: nft 1.0.6 miscompiles the packet-path
//! update of a dynamic map whose key is longer than 16 bytes (the key gets one 16-byte
//! register and the value is loaded into the next, over the rest of the key: sessions learnt
//! with the backend's MAC in the client's address, which no packet ever finds; a key led by
//! an IPv6 address after a shorter field aborts nft, "netlink_gen_expr: Assertion `dreg <
//! ctx->reg_low' failed"), while updates of dataless sets with the same key compile and run.
//! So a session's set says its backend: ingress tries each backend's sets (a RST is sent on
//! and ends its session), and a new session has `real-server6` draw its backend's number
//! into the mark, is learnt in that backend's set at ingress (IPv6 needs no egress rule) and
//! goes to `new6-IF`, which sends it with `fwd ip6 to` (the kernel resolves the MAC by
//! neighbour discovery). ICMPv6 to an IPv6 VIP passes (neighbour discovery of the VIP, and
//! echo, which the balancer answers, as on the eBPF dataplane). What it costs: a session's
//! packet is looked up in the sets of each backend before its own (a few per backend), where
//! IPv4's is one map lookup; a network of IPv4 VIPs alone has exactly the table it had.
//! Differences from IPv4's: sessions are learnt as the frame is sent on, not as it leaves;
//! the sets of a backend that leaves the network go with it, its TCP sessions too.
//!
//! Counters: each `real-server` (and `real-server6`) element counts the new sessions it
//! placed (the first packet of a session; the rest follow the session map), as the NAT
//! elements count new flows.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv6Addr},
};

use super::ruleset::table_name;
use crate::core::{
    compose::ComposedNetwork,
    elements::{REAL_SERVER, SetKey, placed_sets},
    model::{Mode, Network, Proto},
};

/// The set of VIPs the chains divert (moby's name).
pub const VIP_SET: &str = "vip";
/// The protocols with a session map, in rule order.
pub const PROTOS: &[Proto] = Proto::ALL;
/// A session's key and what it maps to (moby's session map type).
const SESSION_KEY: &str = "ip saddr . th sport . ip daddr . th dport";
/// Sessions per protocol (moby's size).
pub const SESSIONS: u32 = 65536;
const NUMGEN: &str = "numgen random mod 65536";

/// The session map of `proto`.
pub fn session_map(proto: Proto) -> String {
    format!("dsr-conntrack-{proto}")
}

/// IPv6's VIP set and real-server map (see the module).
pub const VIP6_SET: &str = "vip6";
pub const REAL_SERVER6: &str = "real-server6";
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

/// The chain a new IPv6 session on device `ifname` goes to.
pub fn new6_chain(ifname: &str) -> String {
    format!("new6-{ifname}")
}

/// The chains of device `ifname` in a table with (`v6`) or without IPv6's rules.
pub fn device_chains(ifname: &str, v6: bool) -> Vec<String> {
    let mut c = vec![ingress_chain(ifname), egress_chain(ifname)];
    if v6 {
        c.push(new6_chain(ifname));
    }
    c
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
            chains: Vec::new(),
            sets6: Vec::new(),
        }
    }
}

/// The most `real-server` elements a network's DSR table takes. nft 1.0.6 cuts a set's
/// elements into netlink messages of 1,365 of this map's, and the kernel's concatenated
/// interval map (pipapo) refuses the first element of a later message at some boundaries,
/// depending on the intervals (measured with kernel 6.18: 300 VIPs × 5 backends, 1,500
/// elements, fail with "File exists"; every shape tried up to 1,365 passes). The NAT table
/// avoids that map (see `dataplane::nft`); the DSR table is moby's, so it stays in one message.
pub const MAX_REAL_SERVER: usize = 1365;

/// Refuses a network whose `real-server` elements the table cannot take (see
/// [`MAX_REAL_SERVER`]), saying what to do instead.
pub fn check_capacity(network: &ComposedNetwork) -> anyhow::Result<()> {
    let n = (real_server(network, |_| true).len()).max(real_server6(network, |_| true).len());
    if n > MAX_REAL_SERVER {
        anyhow::bail!(
            "network {}: {n} real-server elements (one per backend of each VIP), more than the \
             {MAX_REAL_SERVER} the nftables DSR table takes (nft 1.0.6 splits more into several \
             netlink messages, which the kernel's concatenated interval map refuses); use the \
             eBPF dataplane, or fewer VIPs or backends per network",
            network.name
        );
    }
    Ok(())
}

/// `KEY : BACKEND` of every IPv4 `real-server` element of `network`'s sets that `wanted`
/// selects (the core's elements, the source of `lb elements`; never partitioned here).
pub fn real_server(
    network: &ComposedNetwork,
    wanted: impl Fn(&SetKey) -> bool,
) -> BTreeSet<String> {
    real_server_of(network, wanted, |b| b.is_ipv4().then(|| b.to_string()))
}

/// `KEY : N` of every IPv6 one, N the backend's number ([`backends6`]).
pub fn real_server6(
    network: &ComposedNetwork,
    wanted: impl Fn(&SetKey) -> bool,
) -> BTreeSet<String> {
    let number: BTreeMap<IpAddr, usize> = (backends6(network).into_iter().enumerate())
        .map(|(i, b)| (IpAddr::V6(b), i + 1))
        .collect();
    real_server_of(network, wanted, |b| number.get(&b).map(usize::to_string))
}

/// The `real-server` elements whose backend `value` writes (`None`: not this map's).
fn real_server_of(
    network: &ComposedNetwork,
    wanted: impl Fn(&SetKey) -> bool,
    value: impl Fn(IpAddr) -> Option<String>,
) -> BTreeSet<String> {
    (placed_sets(network, wanted).into_iter())
        .filter(|p| p.element.map == REAL_SERVER)
        .filter_map(|p| {
            let v = value(p.element.value.parse().ok()?)?;
            Some(format!("{} : {v}", p.element.key))
        })
        .collect()
}

fn elements(items: impl IntoIterator<Item = String>) -> Option<String> {
    let v: Vec<String> = items.into_iter().collect();
    (!v.is_empty()).then(|| format!("{{ {} }}", v.join(", ")))
}

fn add_elements(s: &mut String, t: &str, set: &str, items: impl IntoIterator<Item = String>) {
    if let Some(e) = elements(items) {
        let _ = writeln!(s, "add element netdev {t} {set} {e}");
    }
}

fn delete_elements(s: &mut String, t: &str, set: &str, items: impl IntoIterator<Item = String>) {
    if let Some(e) = elements(items) {
        let _ = writeln!(s, "delete element netdev {t} {set} {e}");
    }
}

/// `add table` then `delete table`: the table goes whether or not it exists.
pub fn delete_table(s: &mut String, network: &str) {
    super::ruleset::delete_table(s, &format!("netdev {}", table_name(network)));
}

/// Which VIP sets and real-server maps [`maps`] empties (the caller fills them).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Empty {
    None,
    /// IPv6's alone (the network's first IPv6 VIP: whatever an earlier one left goes).
    Ipv6,
    Both,
}

/// The sets and maps, declared if missing (`add` of an existing one changes nothing but a
/// session map's default timeout), with the VIP sets and the real-server maps emptied as
/// `empty` says. Sessions are kept.
fn maps(s: &mut String, t: &str, timeout: u32, empty: Empty, v6: Option<&[Ipv6Addr]>) {
    let _ = writeln!(
        s,
        "add table netdev {t}\nadd set netdev {t} {VIP_SET} {{ type ipv4_addr; }}\nadd map netdev {t} {REAL_SERVER} {{ typeof ip daddr . {NUMGEN} : ip daddr; flags interval; counter; }}"
    );
    if empty == Empty::Both {
        let _ = writeln!(
            s,
            "flush set netdev {t} {VIP_SET}\nflush map netdev {t} {REAL_SERVER}"
        );
    }
    for &p in PROTOS {
        let _ = writeln!(
            s,
            "add map netdev {t} {} {{ typeof {SESSION_KEY} : ether daddr; flags dynamic, timeout; size {SESSIONS}; timeout {timeout}s; }}",
            session_map(p)
        );
    }
    let Some(backends) = v6 else { return };
    let _ = writeln!(
        s,
        "add set netdev {t} {VIP6_SET} {{ type ipv6_addr; }}\nadd map netdev {t} {REAL_SERVER6} {{ typeof ip6 daddr . {NUMGEN} : meta mark; flags interval; counter; }}"
    );
    if empty != Empty::None {
        let _ = writeln!(
            s,
            "flush set netdev {t} {VIP6_SET}\nflush map netdev {t} {REAL_SERVER6}"
        );
    }
    for set in session_sets6(backends) {
        session_set(s, t, &set, timeout);
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

/// The chains: every chain in `sync.chains` that is not a present interface's goes (`add`
/// first, so a chain already gone is no error), and each present interface's two are
/// declared and their rules written again (flushed first: the same chain keeps its hook, so
/// no frame passes unseen during the swap).
fn chains(s: &mut String, t: &str, timeout: u32, sync: &Sync, v6: Option<&[Ipv6Addr]>) {
    let keep: BTreeSet<String> = (sync.present.iter())
        .flat_map(|i| device_chains(i, v6.is_some()))
        .collect();
    let gone: BTreeSet<&String> = (sync.chains.iter())
        .filter(|c| !keep.contains(*c))
        .collect();
    for c in gone {
        let _ = writeln!(
            s,
            "add chain netdev {t} {c}\nflush chain netdev {t} {c}\ndelete chain netdev {t} {c}"
        );
    }
    for ifname in &sync.present {
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
        if let Some(backends) = v6 {
            new6(s, t, timeout, ifname, &dev, backends);
        }
        let mut rules = pass.to_vec();
        rules.push("notrack ether saddr set ether daddr counter".to_owned());
        for &p in PROTOS {
            rules.push(format!(
                "ip protocol {p} ether daddr set {SESSION_KEY} map @{} counter fwd to {dev}",
                session_map(p)
            ));
        }
        rules.push(format!(
            "ip protocol {{ {} }} fwd ip to ip daddr . {NUMGEN} map @{REAL_SERVER} device {dev}",
            protos()
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
                "meta l4proto {{ {} }} meta mark set ip6 daddr . {NUMGEN} map @{REAL_SERVER6} goto {}",
                protos(),
                new6_chain(ifname)
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

/// Device `ifname`'s chain of new IPv6 sessions (reached with the mark `real-server6` drew):
/// learnt in their backend's set and sent to it; a RST is sent and opens nothing. Declared
/// before the ingress chain that jumps to it.
fn new6(s: &mut String, t: &str, timeout: u32, ifname: &str, dev: &str, backends: &[Ipv6Addr]) {
    let chain = new6_chain(ifname);
    let _ = writeln!(
        s,
        "add chain netdev {t} {chain}\nflush chain netdev {t} {chain}"
    );
    for (i, &b) in backends.iter().enumerate() {
        let n = i + 1;
        let _ = writeln!(
            s,
            "add rule netdev {t} {chain} meta mark {n} tcp flags rst counter fwd ip6 to {b} device {dev}"
        );
        for &p in PROTOS {
            let _ = writeln!(
                s,
                "add rule netdev {t} {chain} meta mark {n} meta l4proto {p} update @{} {{ {SESSION_KEY6} timeout {timeout}s }} counter fwd ip6 to {b} device {dev}",
                session_set6(p, b)
            );
        }
    }
    let _ = writeln!(s, "add rule netdev {t} {chain} counter drop");
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

/// The whole table for `network` (its sessions kept if it exists), or its removal when
/// `sync.on` is off; returns the real-server elements written.
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
    chains(s, &t, timeout, sync, v6);
    drop_sets6(s, &t, timeout, sync, &backends);
    let (vips4, vips6): (Vec<IpAddr>, Vec<IpAddr>) =
        network.vips().into_iter().partition(IpAddr::is_ipv4);
    add_elements(s, &t, VIP_SET, vips4.iter().map(IpAddr::to_string));
    let rs = real_server(network, |_| true);
    let mut n = rs.len();
    add_elements(s, &t, REAL_SERVER, rs);
    if v6.is_some() {
        add_elements(s, &t, VIP6_SET, vips6.iter().map(IpAddr::to_string));
        let rs6 = real_server6(network, |_| true);
        n += rs6.len();
        add_elements(s, &t, REAL_SERVER6, rs6);
    }
    n
}

/// The difference from the table written for `previous` to `network`'s, over the sets
/// `changed` selects (`diff::changed`; every other set is the same in both): changed elements
/// are deleted and added again, the rest keep their counters. A table that appears or goes is
/// declared or deleted whole. Returns (written, deleted) elements.
pub fn update(
    s: &mut String,
    network: &ComposedNetwork,
    previous: &ComposedNetwork,
    changed: &dyn Fn(&SetKey) -> bool,
    sync: &Sync,
) -> (usize, usize) {
    if sync.on != sync.was_on {
        return (declare(s, network, sync), 0);
    }
    if !sync.on {
        return (0, 0);
    }
    let t = table_name(&network.name);
    // A new timeout lands in the map's default too (the rules carry it per element).
    let timeout = network.timeouts.dsr_secs();
    let backends = backends6(network);
    let v6 = has_ipv6(network).then_some(backends.as_slice());
    // IPv6's objects appear with the network's first IPv6 VIP: declared whole then.
    let fresh6 = v6.is_some() && !has_ipv6(previous);
    let empty = if fresh6 { Empty::Ipv6 } else { Empty::None };
    maps(s, &t, timeout, empty, v6);
    let vips = |n: &ComposedNetwork, v4: bool| -> BTreeSet<IpAddr> {
        (n.composed().vips.keys())
            .filter(|v| v.is_ipv4() == v4 && changed(&SetKey::Vip(**v)))
            .copied()
            .collect()
    };
    let (was, now) = (vips(previous, true), vips(network, true));
    delete_elements(s, &t, VIP_SET, was.difference(&now).map(IpAddr::to_string));
    add_elements(s, &t, VIP_SET, now.difference(&was).map(IpAddr::to_string));
    let mut counts = update_real_server(
        s,
        &t,
        REAL_SERVER,
        real_server(previous, changed),
        real_server(network, changed),
    );
    if v6.is_some() {
        let was = if fresh6 {
            BTreeSet::new()
        } else {
            vips(previous, false)
        };
        let now = vips(network, false);
        delete_elements(s, &t, VIP6_SET, was.difference(&now).map(IpAddr::to_string));
        add_elements(s, &t, VIP6_SET, now.difference(&was).map(IpAddr::to_string));
        // The backends' numbers are their places in `backends6`: where the backends changed,
        // every element is written again; otherwise only the changed sets' are.
        let (was, now) = if fresh6 {
            (BTreeSet::new(), real_server6(network, |_| true))
        } else if backends6(previous) != backends {
            let _ = writeln!(s, "flush map netdev {t} {REAL_SERVER6}");
            (BTreeSet::new(), real_server6(network, |_| true))
        } else {
            (
                real_server6(previous, changed),
                real_server6(network, changed),
            )
        };
        let (come, gone) = update_real_server(s, &t, REAL_SERVER6, was, now);
        counts = (counts.0 + come, counts.1 + gone);
    }
    if v6.is_none() && has_ipv6(previous) {
        // The last IPv6 VIP went: nothing uses IPv6's map any more (its sets go below).
        let _ = writeln!(
            s,
            "flush set netdev {t} {VIP6_SET}\nflush map netdev {t} {REAL_SERVER6}"
        );
    }
    chains(s, &t, timeout, sync, v6);
    drop_sets6(s, &t, timeout, sync, &backends);
    counts
}

/// Makes map `map` hold `now` where it held `was`; returns (written, deleted) elements. An
/// element is its whole `KEY : VALUE`; a key with another value is deleted (by key) and added
/// again.
fn update_real_server(
    s: &mut String,
    t: &str,
    map: &str,
    was: BTreeSet<String>,
    now: BTreeSet<String>,
) -> (usize, usize) {
    let gone: Vec<String> = (was.difference(&now))
        .map(|e| e.split(" : ").next().unwrap_or(e).to_owned())
        .collect();
    let come: Vec<String> = now.difference(&was).cloned().collect();
    let counts = (come.len(), gone.len());
    delete_elements(s, t, map, gone);
    add_elements(s, t, map, come);
    counts
}

/// A table the probe declares and deletes in one transaction: never seen by anyone.
const PROBE_TABLE: &str = "lb-dsr-probe";

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
        chains: Vec::new(),
        sets6: Vec::new(),
    };
    // With IPv6's rules for one backend: their packet-path set update and `fwd ip6` too.
    let backends = [Ipv6Addr::LOCALHOST];
    maps(&mut s, PROBE_TABLE, 1, Empty::Both, Some(&backends));
    chains(&mut s, PROBE_TABLE, 1, &sync, Some(&backends));
    let _ = writeln!(s, "delete table netdev {PROBE_TABLE}");
    s
}
