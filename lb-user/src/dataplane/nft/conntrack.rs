//! The kernel's conntrack as this dataplane's flow table: flows listed from `conntrack -L`,
//! and UDP flows of removed backends deleted with `conntrack -D`. Both run in the calling
//! thread's namespace.
use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result};

use crate::{
    core::{compose::Composed, model::Network},
    dataplane::Flow,
};

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

/// The conntrack entries translated to one of `composed`'s services.
pub fn flows(composed: &Composed) -> Result<Vec<Flow>> {
    let out = Command::new("conntrack")
        .args(["-L"])
        .stderr(Stdio::null())
        .output()
        .context("running conntrack -L")?;
    let out = String::from_utf8_lossy(&out.stdout);
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
            idle_secs: None,
        });
    }
    flows.sort_by(|a, b| (&a.service, &a.client).cmp(&(&b.service, &b.client)));
    Ok(flows)
}

/// As the eBPF dataplane does: UDP flows of a backend `previous` had and `network` has not
/// go (a UDP client would otherwise stay pinned to a dead address); TCP flows end by
/// themselves. Returns how many conntrack deleted.
pub fn flush_removed_backends(previous: &Network, network: &Network) -> Result<usize> {
    let backends = |n: &Network| -> BTreeSet<Ipv4Addr> {
        (n.services.iter())
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .collect()
    };
    let now = backends(network);
    let mut flushed = 0;
    for b in backends(previous).difference(&now) {
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
            flushed += n;
        }
    }
    Ok(flushed)
}
