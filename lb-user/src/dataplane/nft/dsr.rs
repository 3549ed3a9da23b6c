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
//! Counters: each `real-server` element counts the new sessions it placed (the first packet
//! of a session; the rest follow the session map), as the NAT elements count new flows.
use std::{collections::BTreeSet, fmt::Write as _, net::IpAddr};

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

pub fn ingress_chain(ifname: &str) -> String {
    format!("ingress-{ifname}")
}

pub fn egress_chain(ifname: &str) -> String {
    format!("egress-{ifname}")
}

/// Refuses a `dsr` network with an IPv6 VIP, naming it and the way out: the table serves
/// IPv4 VIPs only. An IPv6 session map cannot be learnt with nft 1.0.6 (Debian 12's): the
/// packet-path update of a dynamic map whose key is longer than 16 bytes is miscompiled
/// (the key gets one 16-byte register and the value is loaded into the next, over the rest of
/// the key: `ip6 saddr . th sport . ip6 daddr . th dport : ether daddr` learns keys whose
/// bytes 16 to 23 are the backend's MAC, so no packet ever finds its session; a key led by
/// an IPv6 address after a shorter field aborts nft, "netlink_gen_expr: Assertion `dreg <
/// ctx->reg_low' failed"), and a key of 16 bytes cannot hold the client's IPv6 address and a
/// port. An IPv6 VIP served by NAT instead would answer from the node rather than from the
/// backends, which is not what its backends are set up for. The eBPF dataplane serves DSR of
/// IPv6 VIPs. Checked before anything is saved.
pub fn refuse_ipv6(network: &Network) -> anyhow::Result<()> {
    if network.mode == Mode::Dsr
        && let Some(vip) = network.vips().into_iter().find(IpAddr::is_ipv6)
    {
        anyhow::bail!(
            "network {}: VIP {vip} is IPv6, and the nftables DSR table serves IPv4 VIPs only (nft 1.0.6 cannot learn a session keyed by IPv6 addresses): use the ebpf dataplane, or serve it from a nat network",
            network.name
        );
    }
    Ok(())
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
    let n = real_server(network, |_| true).len();
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

/// `KEY : BACKEND` of every `real-server` element of `network`'s sets that `wanted` selects
/// (the core's elements, the source of `lb elements`; never partitioned here).
pub fn real_server(
    network: &ComposedNetwork,
    wanted: impl Fn(&SetKey) -> bool,
) -> BTreeSet<String> {
    (placed_sets(network, wanted).into_iter())
        .filter(|p| p.element.map == REAL_SERVER)
        .map(|p| format!("{} : {}", p.element.key, p.element.value))
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

/// The sets and maps, declared if missing (`add` of an existing one changes nothing but a
/// session map's default timeout), with the VIP set and the real-server map emptied when
/// `empty` (the caller fills them). Sessions are kept.
fn maps(s: &mut String, t: &str, timeout: u32, empty: bool) {
    let _ = writeln!(
        s,
        "add table netdev {t}\nadd set netdev {t} {VIP_SET} {{ type ipv4_addr; }}\nadd map netdev {t} {REAL_SERVER} {{ typeof ip daddr . {NUMGEN} : ip daddr; flags interval; counter; }}"
    );
    if empty {
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
}

/// The chains: every chain in `sync.chains` that is not a present interface's goes (`add`
/// first, so a chain already gone is no error), and each present interface's two are
/// declared and their rules written again (flushed first: the same chain keeps its hook, so
/// no frame passes unseen during the swap).
fn chains(s: &mut String, t: &str, timeout: u32, sync: &Sync) {
    let keep: BTreeSet<String> = (sync.present.iter())
        .flat_map(|i| [ingress_chain(i), egress_chain(i)])
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
        let pass = [
            "meta protocol arp counter accept".to_owned(),
            "meta protocol != ip counter accept".to_owned(),
            format!("ip daddr != @{VIP_SET} counter accept"),
        ];
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
            PROTOS
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
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
    maps(s, &t, timeout, true);
    chains(s, &t, timeout, sync);
    add_elements(s, &t, VIP_SET, network.vips().iter().map(IpAddr::to_string));
    let rs = real_server(network, |_| true);
    let n = rs.len();
    add_elements(s, &t, REAL_SERVER, rs);
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
    maps(s, &t, timeout, false);
    let vips = |n: &ComposedNetwork| -> BTreeSet<IpAddr> {
        (n.composed().vips.keys())
            .filter(|v| changed(&SetKey::Vip(**v)))
            .copied()
            .collect()
    };
    let (was, now) = (vips(previous), vips(network));
    delete_elements(s, &t, VIP_SET, was.difference(&now).map(IpAddr::to_string));
    add_elements(s, &t, VIP_SET, now.difference(&was).map(IpAddr::to_string));
    let (was, now) = (
        real_server(previous, changed),
        real_server(network, changed),
    );
    // An element is its whole `KEY : BACKEND`; a key with another backend is deleted (by
    // key) and added again.
    let gone: Vec<String> = (was.difference(&now))
        .map(|e| e.split(" : ").next().unwrap_or(e).to_owned())
        .collect();
    let come: Vec<String> = now.difference(&was).cloned().collect();
    let counts = (come.len(), gone.len());
    delete_elements(s, &t, REAL_SERVER, gone);
    add_elements(s, &t, REAL_SERVER, come);
    chains(s, &t, timeout, sync);
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
    };
    maps(&mut s, PROBE_TABLE, 1, true);
    chains(&mut s, PROBE_TABLE, 1, &sync);
    let _ = writeln!(s, "delete table netdev {PROBE_TABLE}");
    s
}
