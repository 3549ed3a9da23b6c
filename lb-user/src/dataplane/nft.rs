//! The nftables dataplane: moby's own ruleset (seed `service_nftables_lb_linux.go`), for
//! kernels that cannot run the programs. Fed by the same composed elements as the eBPF
//! dataplane and `lb elements`, so both agree bucket for bucket.
//!
//! One table per network, `ip lb-<network>`, with one writer (this daemon). Every sync is one
//! `nft -f` transaction that deletes the table and declares it again with all of its elements:
//! map contents are replaced wholesale, as the seed does, so whatever a failed sync left is
//! gone after the next one, and a failed transaction changes nothing. Connections already
//! translated keep their NAT binding in the kernel's conntrack, which a table replacement
//! does not touch, so flows survive syncs and daemon restarts alike.
//!
//! Why text and not the `nftables` crate's JSON: the maps are keyed by a concatenation that
//! ends in `numgen random mod 65536`, which needs `typeof` declarations; nft 1.0.6 (this
//! machine's, Debian 12's) accepts `typeof` only in its text syntax and refuses the JSON form
//! ("can not use variable sized data types (integer) in concat expressions"). The seed renders
//! text for `nft -f` too. Reading back (`nft -j list table`) is JSON.
//!
//! Published ports with a `host_ip` need a key that starts with that address, so they live in
//! a third map, `nat-publish-port-host`, consulted before `nat-publish-port`; both read back
//! as `nat-publish-port` elements in DESIGN.md's notation.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    io::Write as _,
    net::Ipv4Addr,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{Count, Dataplane, Flow, FlowStats, SyncStats};
use crate::{
    core::compose::compose,
    core::elements::{
        Element, NAT_PUBLISH_PORT, NAT_SERVICE_VIP, SetKey, network_elements, placed_elements,
    },
    core::model::{Masquerade, Mode, Network},
    node::{Netlink, in_netns},
};

/// Tables of this dataplane start with this: `lb` owns no other tables.
pub const TABLE_PREFIX: &str = "lb-";
/// The map of published ports bound to one address (`host_ip`).
pub const NAT_PUBLISH_PORT_HOST: &str = "nat-publish-port-host";
/// Every VIP of the network: published ports never apply to a VIP's own address.
const VIP_SET: &str = "service-vips";
const NUMGEN: &str = "numgen random mod 65536";

pub fn table_name(network: &str) -> String {
    format!("{TABLE_PREFIX}{network}")
}

/// The nft map an element of DESIGN.md's notation is loaded into.
fn nft_map(e: &Element) -> &'static str {
    // `host . proto . port . buckets` has one field more than `proto . port . buckets`.
    if e.map == NAT_PUBLISH_PORT && e.key.split(" . ").count() == 4 {
        NAT_PUBLISH_PORT_HOST
    } else {
        e.map
    }
}

fn quoted_set(names: &[String]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("{{ {} }}", q.join(", "))
}

/// The IPv4 subnets on each of a network's interfaces (aliases excluded): what hairpin
/// masquerade needs to know.
pub type Subnets = [(String, Ipv4Addr, u8)];

/// The whole `nft -f` transaction of one sync of `network`, given the `subnets` on its
/// interfaces (pure: the golden tests read it).
pub fn ruleset(network: &Network, subnets: &Subnets) -> Result<String> {
    if network.mode == Mode::Dsr {
        bail!(
            "network {}: mode dsr is not available on the nftables dataplane",
            network.name
        );
    }
    let table = table_name(&network.name);
    let elements = network_elements(network);
    let vips = network.vips();
    let ifaces = quoted_set(&network.interfaces);
    let mut s = String::new();
    // `add` then `delete` makes the delete valid whether or not the table exists; both and the
    // new declaration are one transaction.
    let _ = writeln!(
        s,
        "add table ip {table}\ndelete table ip {table}\ntable ip {table} {{"
    );
    let maps = [
        (NAT_SERVICE_VIP, format!("ip daddr . {NUMGEN} : ip daddr")),
        (
            NAT_PUBLISH_PORT,
            format!("meta l4proto . th dport . {NUMGEN} : ip daddr . th dport"),
        ),
        (
            NAT_PUBLISH_PORT_HOST,
            format!("ip daddr . meta l4proto . th dport . {NUMGEN} : ip daddr . th dport"),
        ),
    ];
    for (name, typeof_) in maps {
        let _ = writeln!(
            s,
            "\tmap {name} {{\n\t\ttypeof {typeof_}\n\t\tflags interval\n\t\tcounter"
        );
        let mine: Vec<String> = (elements.iter())
            .filter(|e| nft_map(e) == name)
            .map(|e| format!("{} : {}", e.key, e.value))
            .collect();
        if !mine.is_empty() {
            let _ = writeln!(s, "\t\telements = {{ {} }}", mine.join(",\n\t\t\t"));
        }
        let _ = writeln!(s, "\t}}");
    }
    let _ = writeln!(s, "\tset {VIP_SET} {{\n\t\ttype ipv4_addr");
    if !vips.is_empty() {
        let v: Vec<String> = vips.iter().map(|v| v.to_string()).collect();
        let _ = writeln!(s, "\t\telements = {{ {} }}", v.join(", "));
    }
    let _ = writeln!(s, "\t}}");
    // A lookup that misses ends its rule, so each rule only translates what its map holds;
    // the host-bound map goes first, as a more specific binding does in the eBPF dataplane.
    let l4 = "meta l4proto { tcp, udp, sctp }";
    let _ = writeln!(
        s,
        "\tchain prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;"
    );
    let _ = writeln!(
        s,
        "\t\tiifname {ifaces} dnat ip to ip daddr . {NUMGEN} map @{NAT_SERVICE_VIP}"
    );
    let _ = writeln!(
        s,
        "\t\tiifname {ifaces} {l4} ip daddr != @{VIP_SET} dnat ip to ip daddr . meta l4proto . th dport . {NUMGEN} map @{NAT_PUBLISH_PORT_HOST}"
    );
    let _ = writeln!(
        s,
        "\t\tiifname {ifaces} {l4} ip daddr != @{VIP_SET} fib daddr type local dnat ip to meta l4proto . th dport . {NUMGEN} map @{NAT_PUBLISH_PORT}"
    );
    let _ = writeln!(
        s,
        "\t}}\n\tchain postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;"
    );
    match network.masquerade {
        // The seed's rule, limited to what leaves by this network's interfaces.
        Masquerade::Always => {
            let _ = writeln!(s, "\t\tct status dnat oifname {ifaces} counter masquerade");
        }
        // Hairpin: a translated flow from a client on the segment it is sent back to would be
        // answered around the node, so it takes the node's address. (The eBPF dataplane asks
        // "does it leave by the interface it came in on"; postrouting has no input interface,
        // so the equivalent here is the client's address being on the output's subnet.)
        Masquerade::Auto => {
            for (ifname, addr, prefix) in subnets {
                let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
                let net = Ipv4Addr::from(u32::from(*addr) & mask);
                let _ = writeln!(
                    s,
                    "\t\tct status dnat oifname \"{ifname}\" ip saddr {net}/{prefix} counter masquerade"
                );
            }
        }
        Masquerade::Never => {}
    }
    let _ = writeln!(s, "\t}}\n}}");
    Ok(s)
}

/// Runs `nft ARGS` (the first `nft` on PATH) with `stdin`, in the calling thread's namespace.
fn nft(args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (is the nftables package installed?)")?;
    // An nft that refuses early exits before reading everything (a broken pipe here): its
    // own exit status and message say why, so the write error only counts if it succeeded.
    let wrote = stdin.map(|input| {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(input.as_bytes())
    });
    let out = child.wait_with_output().context("waiting for nft")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "nft {} failed ({}): {}",
            args.join(" "),
            out.status,
            err.trim().replace('\n', " ")
        );
    }
    if let Some(Err(e)) = wrote {
        return Err(e).context("writing the ruleset to nft");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One map element of `nft -j list table` output, in DESIGN.md's notation, with its counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub element: Element,
    pub packets: u64,
    pub bytes: u64,
}

fn scalar(v: &Value) -> Result<String> {
    Ok(match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Object(o) if o.contains_key("range") => {
            let r = &o["range"];
            format!("{}-{}", scalar(&r[0])?, scalar(&r[1])?)
        }
        Value::Object(o) if o.contains_key("concat") => (o["concat"].as_array())
            .context("concat is not a list")?
            .iter()
            .map(scalar)
            .collect::<Result<Vec<_>>>()?
            .join(" . "),
        Value::Object(o) if o.contains_key("elem") => scalar(&o["elem"]["val"])?,
        _ => bail!("unexpected nft value {v}"),
    })
}

/// The elements of the NAT maps in `nft -j list table` output. A bucket interval of one
/// bucket is printed by nft as a plain number; it reads back as `N-N`.
pub fn listed_elements(json: &str) -> Result<Vec<Listed>> {
    let v: Value = serde_json::from_str(json).context("nft's JSON output")?;
    let mut out = Vec::new();
    for obj in v["nftables"].as_array().into_iter().flatten() {
        let Some(map) = obj.get("map") else { continue };
        let name: &'static str = match map["name"].as_str() {
            Some(NAT_SERVICE_VIP) => NAT_SERVICE_VIP,
            Some(NAT_PUBLISH_PORT | NAT_PUBLISH_PORT_HOST) => NAT_PUBLISH_PORT,
            _ => continue,
        };
        for e in map["elem"].as_array().into_iter().flatten() {
            let (key, value) = (&e[0], &e[1]);
            let mut key = scalar(key)?;
            // The last field is the bucket interval.
            if let Some((head, last)) = key.rsplit_once(" . ")
                && !last.contains('-')
            {
                key = format!("{head} . {last}-{last}");
            }
            let counter = &key_counter(&e[0]);
            out.push(Listed {
                element: Element {
                    map: name,
                    key,
                    value: scalar(value)?,
                },
                packets: counter.0,
                bytes: counter.1,
            });
        }
    }
    Ok(out)
}

fn key_counter(key: &Value) -> (u64, u64) {
    let c = &key["elem"]["counter"];
    (
        c["packets"].as_u64().unwrap_or(0),
        c["bytes"].as_u64().unwrap_or(0),
    )
}

/// The nftables dataplane. It holds no state of its own: the kernel's tables are the record.
#[derive(Default)]
pub struct NftDataplane;

impl NftDataplane {
    fn list(network: &Network) -> Result<Vec<Listed>> {
        let table = table_name(&network.name);
        let json = in_netns(network.netns.as_deref(), move || {
            nft(&["-j", "list", "table", "ip", &table], None)
        })?;
        listed_elements(&json)
    }
}

fn apply_in_netns(network: &Network, previous: Option<&Network>) -> Result<SyncStats> {
    let nl = Netlink::new()?;
    let mut subnets = Vec::new();
    for (k, i) in network.interfaces.iter().enumerate() {
        // Only the first interface must exist; `iifname` matches another from when it appears.
        if k > 0 && nl.ifindex(i).is_err() {
            continue;
        }
        for (addr, prefix) in nl.ipv4_addrs(i)? {
            if prefix < 32 {
                subnets.push((i.clone(), addr, prefix));
            }
        }
    }
    let script = ruleset(network, &subnets)?;
    let alias_if = &network.interfaces[0];
    let want = network.vips();
    nl.add_aliases(alias_if, &want)?;
    nft(&["-f", "-"], Some(&script))?;
    // The whole table is declared again: every element is written.
    let mut stats = SyncStats {
        written: network_elements(network).len(),
        ..SyncStats::default()
    };
    if let Some(prev) = previous {
        nl.remove_aliases(alias_if, &prev.vips().difference(&want).copied().collect())?;
        // As the eBPF dataplane does: UDP flows of a removed backend go (a UDP client would
        // otherwise stay pinned to a dead address); TCP flows end by themselves.
        let now: BTreeSet<Ipv4Addr> = (network.services.iter())
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .collect();
        for b in (prev.services.iter())
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .filter(|b| !now.contains(b))
            .collect::<BTreeSet<_>>()
        {
            // conntrack exits 1 when nothing matched.
            let out = Command::new("conntrack")
                .args(["-D", "-p", "udp", "--reply-src", &b.to_string()])
                .output()
                .context("running conntrack")?;
            let said = String::from_utf8_lossy(&out.stderr);
            if let Some(n) = said
                .split_whitespace()
                .zip(said.split_whitespace().skip(1))
                .find(|(_, w)| w.starts_with("flow"))
                .and_then(|(n, _)| n.parse::<usize>().ok())
            {
                stats.flows_flushed += n;
            }
        }
    }
    Ok(stats)
}

/// Where br_netfilter hands the IP hooks a bridge's frames (a node running Docker or
/// Kubernetes loads it).
const BR_NETFILTER: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// One line per bridge of the network on which a backend balanced to *itself* through its own
/// VIP or published port would get no answer, naming the ports at fault.
///
/// Why: with br_netfilter on, the IP prerouting hook (our DNAT) runs from the bridge layer, and
/// when the new destination is on the same bridge the kernel *bridges* the frame to it instead
/// of routing it (`br_nf_pre_routing_finish`'s bridged DNAT). A peer backend gets it, and
/// postrouting still masquerades it; the asking backend does not, because a bridge sends a
/// frame back out the port it came in by only when that port is in hairpin mode. Docker (with
/// the userland proxy off) and the CNI bridge plugin (`hairpinMode`) set it on the ports they
/// create; lb does not change ports it does not own, it says so. The eBPF dataplane translates
/// on the bridge's own ingress, after the bridge layer has delivered the frame locally, so it
/// has no such case. Reads the calling thread's namespace (/proc/sys/net is per namespace).
fn hairpin_warnings_here(network: &Network) -> Result<Vec<String>> {
    if network.masquerade == Masquerade::Never {
        // Nothing hairpins without masquerade, on either dataplane.
        return Ok(Vec::new());
    }
    match std::fs::read_to_string(BR_NETFILTER) {
        Ok(v) if v.trim() == "1" => {}
        // br_netfilter not loaded, or off here: the DNATed frame is routed and masqueraded.
        Ok(_) => return Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {BR_NETFILTER}")),
    }
    let nl = Netlink::new()?;
    let mut warnings = Vec::new();
    for bridge in &network.interfaces {
        if let Some(ports) = nl.ports_without_hairpin(bridge)?
            && !ports.is_empty()
        {
            warnings.push(format!(
                "bridge {bridge}: hairpin mode is off on port(s) {} while br_netfilter is on \
                 (net.bridge.bridge-nf-call-iptables=1), so a backend behind them balanced to \
                 itself through its own VIP or published port gets no answer; turn it on as \
                 Docker and the CNI bridge plugin do: ip link set PORT type bridge_slave \
                 hairpin on",
                ports.join(", ")
            ));
        }
    }
    Ok(warnings)
}

/// Deletes network `name`'s table in the calling thread's namespace, if there is one.
pub fn delete_table(name: &str) -> Result<()> {
    let table = table_name(name);
    nft(
        &["-f", "-"],
        Some(&format!("add table ip {table}\ndelete table ip {table}\n")),
    )
    .map(drop)
}

/// The kernel's conntrack state of a `conntrack -L` line in lb's three words: TCP's
/// SYN_SENT/SYN_RECV are opening, ESTABLISHED is established, the FIN and close states are
/// closing; other protocols are opening until the reply direction was seen.
fn kernel_state(proto: &str, words: &[&str]) -> &'static str {
    match (proto, words.get(3).copied()) {
        ("tcp", Some("SYN_SENT" | "SYN_RECV" | "SYN_SENT2" | "NONE")) => "opening",
        ("tcp", Some("ESTABLISHED")) => "established",
        ("tcp", _) => "closing",
        _ if words.contains(&"[UNREPLIED]") => "opening",
        _ => "established",
    }
}

impl Dataplane for NftDataplane {
    fn supports(&self, network: &Network) -> Result<()> {
        if network.mode == Mode::Dsr {
            bail!(
                "network {}: mode dsr is not available on the nftables dataplane",
                network.name
            );
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "nftables"
    }

    fn apply(&mut self, network: &Network, previous: Option<&Network>) -> Result<SyncStats> {
        if let Some(prev) = previous
            && (prev.netns != network.netns
                || prev.interfaces.first() != network.interfaces.first())
        {
            self.remove(prev)?;
        }
        let (net, prev) = (network.clone(), previous.cloned());
        let stats = in_netns(network.netns.as_deref(), move || {
            apply_in_netns(&net, prev.as_ref())
        })
        .with_context(|| format!("network {}", network.name))?;
        tracing::info!(network = %network.name, table = %table_name(&network.name), "network applied (nftables)");
        // Said once per apply, that is once per change of the network; `lb status` says it
        // for as long as it holds (ports come and go without a sync).
        match self.warnings(network) {
            Ok(w) => {
                for warning in w {
                    tracing::warn!(network = %network.name, "{warning}");
                }
            }
            Err(e) => {
                tracing::warn!(network = %network.name, error = %format!("{e:#}"), "checking bridge hairpin modes")
            }
        }
        Ok(stats)
    }

    fn remove(&mut self, network: &Network) -> Result<()> {
        let net = network.clone();
        in_netns(network.netns.as_deref(), move || {
            delete_table(&net.name)?;
            Netlink::new()?.remove_aliases(&net.interfaces[0], &net.vips())
        })
        .with_context(|| format!("network {}: removing", network.name))?;
        tracing::info!(network = %network.name, "network removed (nftables)");
        Ok(())
    }

    /// Tables of networks not in `keep`, in the daemon's own namespace (a network in another
    /// namespace is known from applied.json and removed by `remove`).
    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let json = nft(&["-j", "list", "tables", "ip"], None)?;
        let v: Value = serde_json::from_str(&json).context("nft's JSON output")?;
        let mut removed = Vec::new();
        for obj in v["nftables"].as_array().into_iter().flatten() {
            let Some(name) = obj["table"]["name"].as_str() else {
                continue;
            };
            let Some(network) = name.strip_prefix(TABLE_PREFIX) else {
                continue;
            };
            if keep.contains(&network) {
                continue;
            }
            nft(&["delete", "table", "ip", name], None)?;
            tracing::info!(
                network,
                "removed the table of a network that is no longer configured"
            );
            removed.push(network.to_owned());
        }
        Ok(removed)
    }

    fn warnings(&mut self, network: &Network) -> Result<Vec<String>> {
        let net = network.clone();
        let mut warnings = in_netns(network.netns.as_deref(), move || {
            hairpin_warnings_here(&net)
        })
        .with_context(|| format!("network {}", network.name))?;
        if !network.timeouts.is_default() {
            warnings.push(
                "the network's flow timeouts are not applied on the nftables dataplane: the kernel's conntrack keeps its own (net.netfilter.nf_conntrack_*timeout* in the network's namespace)"
                    .to_owned(),
            );
        }
        Ok(warnings)
    }

    /// From the kernel's conntrack, which keeps no table of lb's to count.
    fn flow_stats(&mut self, network: &Network) -> Option<FlowStats> {
        self.flows(network).ok().map(|f| FlowStats::of(&f))
    }

    /// The kernel's conntrack entries translated to one of this network's services.
    fn flows(&mut self, network: &Network) -> Result<Vec<Flow>> {
        let composed = compose(network);
        let out = in_netns(network.netns.as_deref(), || {
            let out = Command::new("conntrack")
                .args(["-L"])
                .stderr(Stdio::null())
                .output()
                .context("running conntrack -L")?;
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        })?;
        let mut flows = Vec::new();
        for line in out.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(&proto) = words.first() else {
                continue;
            };
            let field = |k: &str, nth: usize| -> Option<&str> {
                line.split_whitespace()
                    .filter_map(|w| w.strip_prefix(k))
                    .nth(nth)
            };
            let (Some(src), Some(dst), Some(sport), Some(dport), Some(bsrc), Some(bport)) = (
                field("src=", 0),
                field("dst=", 0),
                field("sport=", 0),
                field("dport=", 0),
                field("src=", 1),
                field("sport=", 1),
            ) else {
                continue;
            };
            let Ok(daddr) = dst.parse::<Ipv4Addr>() else {
                continue;
            };
            let port: u16 = dport.parse().unwrap_or(0);
            let ours = composed.vips.contains_key(&daddr)
                || composed.ports.keys().any(|k| {
                    k.port == port
                        && k.proto.to_string() == proto
                        && k.host_ip.is_none_or(|h| h == daddr)
                });
            // Translated: the reply comes from somewhere else than the client asked.
            if !ours || bsrc == dst {
                continue;
            }
            flows.push(Flow {
                proto: proto.to_owned(),
                client: format!("{src}:{sport}"),
                service: format!("{dst}:{dport}"),
                backend: format!("{bsrc}:{bport}"),
                state: kernel_state(proto, &words).to_owned(),
                expires_secs: words.get(2).and_then(|w| w.parse().ok()),
            });
        }
        flows.sort_by(|a, b| (&a.service, &a.client).cmp(&(&b.service, &b.client)));
        Ok(flows)
    }

    /// Per-element counters: the nat chain sees the first packet of each connection only, so
    /// here packets and bytes count new flows, not traffic. Each element is reported under
    /// the set and backend the desired state places it in; a sync replaces the table
    /// wholesale, so the table holds exactly those, except while a sync is failing, when the
    /// elements only the previous state had are left out until the retry heals it.
    fn counts(&mut self, network: &Network) -> Result<Vec<Count>> {
        let owner: HashMap<Element, (SetKey, Ipv4Addr)> = (placed_elements(network).into_iter())
            .map(|p| (p.element, (p.set, p.backend)))
            .collect();
        // (service, backend) → (packets, bytes): one pass over the elements.
        let mut sums: BTreeMap<(SetKey, Option<Ipv4Addr>), (u64, u64)> = BTreeMap::new();
        for l in Self::list(network)? {
            let Some(&(set, backend)) = owner.get(&l.element) else {
                continue;
            };
            for b in [None, Some(backend)] {
                let sum = sums.entry((set, b)).or_default();
                sum.0 += l.packets;
                sum.1 += l.bytes;
            }
        }
        Ok(sums
            .into_iter()
            .map(|((set, backend), (packets, bytes))| Count {
                service: set.to_string(),
                backend,
                packets,
                bytes,
            })
            .collect())
    }
}
