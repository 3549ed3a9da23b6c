//! The kernel's conntrack as this dataplane's flow table: flows listed from `conntrack -L`,
//! and stale UDP flows (of removed backends, or made while a port had none) deleted with
//! `conntrack -D`. All run in the calling thread's namespace.
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{
    core::{
        compose::Composed,
        model::{Family, Network, PortKey, Proto},
    },
    dataplane::{Flow, FlowState},
};

/// The kernel's conntrack state of a `conntrack -L` line in lb's three words: TCP's
/// SYN_SENT/SYN_RECV are opening, ESTABLISHED is established, the FIN and close states are
/// closing; other protocols are opening until the reply direction was seen.
fn kernel_state(proto: Proto, words: &[&str]) -> FlowState {
    match (proto, words.get(3).copied()) {
        (Proto::Tcp, Some("SYN_SENT" | "SYN_RECV" | "SYN_SENT2" | "NONE")) => FlowState::Opening,
        (Proto::Tcp, Some("ESTABLISHED")) => FlowState::Established,
        (Proto::Tcp, _) => FlowState::Closing,
        _ if words.contains(&"[UNREPLIED]") => FlowState::Opening,
        _ => FlowState::Established,
    }
}

/// One `conntrack -L` line's original tuple and its reply source (`src=` and `sport=` of the
/// reply direction): where the kernel sends the flow's packets, the backend of a translated
/// one.
struct Line<'a> {
    proto: &'a str,
    src: &'a str,
    dst: &'a str,
    sport: &'a str,
    dport: &'a str,
    reply_src: &'a str,
    reply_sport: &'a str,
}

fn line(line: &str) -> Option<Line<'_>> {
    let proto = line.split_whitespace().next()?;
    let field = |k: &str, nth: usize| -> Option<&str> {
        line.split_whitespace()
            .filter_map(|w| w.strip_prefix(k))
            .nth(nth)
    };
    Some(Line {
        proto,
        src: field("src=", 0)?,
        dst: field("dst=", 0)?,
        sport: field("sport=", 0)?,
        dport: field("dport=", 0)?,
        reply_src: field("src=", 1)?,
        reply_sport: field("sport=", 1)?,
    })
}

/// `conntrack ARGS` in the calling thread's namespace: its stdout, and how many flows its
/// stderr says it deleted (`conntrack -D` prints "N flow entries have been deleted"; it exits
/// 1 when nothing matched, which is no error here).
fn run(args: &[&str]) -> Result<(String, usize)> {
    let out = Command::new("conntrack")
        .args(args)
        .output()
        .with_context(|| format!("running conntrack {}", args.join(" ")))?;
    let said = String::from_utf8_lossy(&out.stderr);
    let deleted = (said.split_whitespace())
        .zip(said.split_whitespace().skip(1))
        .find(|(_, w)| w.starts_with("flow"))
        .and_then(|(n, _)| n.parse::<usize>().ok())
        .unwrap_or(0);
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), deleted))
}

/// The conntrack entries translated to one of `composed`'s services.
pub fn flows(composed: &Composed) -> Result<Vec<Flow>> {
    // `-f`: conntrack lists one family (IPv4 without it); IPv6 where the network has IPv6 sets.
    let (mut out, _) = run(&["-L", "-f", Family::V4.as_str()])?;
    if composed.has(Family::V6) {
        out += &run(&["-L", "-f", Family::V6.as_str()])?.0;
    }
    let mut flows = Vec::new();
    for l in out.lines() {
        let words: Vec<&str> = l.split_whitespace().collect();
        let Some(Line {
            proto,
            src,
            dst,
            sport,
            dport,
            reply_src: bsrc,
            reply_sport: bport,
        }) = line(l)
        else {
            continue;
        };
        let (Ok(daddr), Ok(proto)) = (dst.parse::<IpAddr>(), proto.parse::<Proto>()) else {
            // Not a flow of a protocol ports are published for: not one of lb's.
            continue;
        };
        let port: u16 = dport.parse().unwrap_or(0);
        let ours = composed.vips.contains_key(&daddr)
            || composed.ports.keys().any(|k| {
                k.port == port
                    && k.proto == proto
                    && k.family == Family::of(daddr)
                    && k.host_ip.is_none_or(|h| h == daddr)
            });
        // Translated: the reply comes from somewhere else than the client asked.
        if !ours || bsrc == dst {
            continue;
        }
        let addr = |a: &str, p: &str| Some(SocketAddr::new(a.parse().ok()?, p.parse().ok()?));
        let (Some(client), Some(frontend), Some(backend)) =
            (addr(src, sport), addr(dst, dport), addr(bsrc, bport))
        else {
            continue;
        };
        flows.push(Flow {
            proto,
            client,
            frontend,
            service: None,
            backend,
            state: kernel_state(proto, &words),
            expires_secs: words.get(2).and_then(|w| w.parse().ok()),
            idle_secs: None,
        });
    }
    flows.sort_by(|a, b| (&a.frontend, &a.client).cmp(&(&b.frontend, &b.client)));
    Ok(flows)
}

/// As the eBPF dataplane does: UDP flows of a backend `previous` had and `network` has not
/// go (a UDP client would otherwise stay pinned to a dead address); TCP flows end by
/// themselves. Returns how many conntrack deleted.
pub fn flush_removed_backends(previous: &Network, network: &Network) -> Result<usize> {
    let backends = |n: &Network| -> BTreeSet<IpAddr> {
        (n.services.iter())
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .collect()
    };
    let now = backends(network);
    let gone: Vec<IpAddr> = backends(previous).difference(&now).copied().collect();
    flush_backends(&gone)
}

/// [`flush_removed_backends`] of backends `gone` (those the network no longer has).
pub fn flush_backends(gone: &[IpAddr]) -> Result<usize> {
    let mut flushed = 0;
    for b in gone {
        let family = Family::of(*b).as_str();
        flushed += run(&[
            "-D",
            "-f",
            family,
            "-p",
            "udp",
            "--reply-src",
            &b.to_string(),
        ])?
        .1;
    }
    Ok(flushed)
}

/// The UDP flows to published port `key` (on its `host_ip`, or any address of its family) that were never
/// translated: made while the port had no backend (before it was published, or while its
/// set was empty), they point at the node itself. A client that keeps sending refreshes such
/// an entry forever and never reaches a backend, since the kernel's NAT rules see a flow's
/// first packet only: they go (kubelet's `ClearEntriesForPort`), after the rules that
/// translate the port are in. Translated flows stay (those of removed backends are
/// [`flush_removed_backends`]'). Returns how many went.
pub fn clear_untranslated(key: &PortKey) -> Result<usize> {
    let port = key.port.to_string();
    let host = key.host_ip.map(|h| h.to_string());
    let mut args = vec![
        "-L",
        "-f",
        key.family.as_str(),
        "-p",
        "udp",
        "--orig-port-dst",
        &port,
    ];
    if let Some(h) = &host {
        args.extend(["--orig-dst", h]);
    }
    let (out, _) = run(&args)?;
    let mut cleared = 0;
    for l in out.lines().filter_map(line) {
        if l.proto != "udp" || l.reply_src != l.dst {
            continue;
        }
        cleared += run(&[
            "-D",
            "-f",
            key.family.as_str(),
            "-p",
            "udp",
            "--orig-src",
            l.src,
            "--orig-dst",
            l.dst,
            "--sport",
            l.sport,
            "--dport",
            l.dport,
        ])?
        .1;
    }
    Ok(cleared)
}
