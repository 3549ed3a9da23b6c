//! `cargo xtask demo`: the whole path a user takes, on an embedded default, end to end — a
//! netns topology (client, node, three backends serving HTTP), a real `lb daemon`, one service
//! with a VIP and a published port programmed through the `lb` CLI, a few hundred HTTP requests
//! from the client, and where each of them went.
//!
//! One function drives it, so the demo the README shows and the test that keeps it green
//! (`lb-user/tests/demo.rs`) are the same code. Everything it makes is owned by guards
//! (topology, backends, daemon, bpffs), so an error or a panic anywhere still cleans up.
use std::{collections::BTreeMap, io::Write, net::Ipv4Addr, path::Path, time::Duration};

use anyhow::{Context as _, Result, ensure};

use crate::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    netns::Topology,
    traffic::{Reply, http_get, spawn_backends},
};

/// The demo's service: VIP 10.99.0.10 port 80, and the node's port 8080 published to the
/// backends' port 80.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
pub const HTTP_PORT: u16 = 80;
pub const PUBLISHED: u16 = 8080;
const BACKENDS: usize = 3;

/// Where the requests went, per backend name (`b0`, `b1`, …).
#[derive(Debug)]
pub struct Report {
    pub backends: Vec<(String, Ipv4Addr)>,
    pub via_vip: BTreeMap<String, usize>,
    pub via_published: BTreeMap<String, usize>,
    /// Backends answered these client addresses (the client's own: no masquerade here).
    pub peers: Vec<Ipv4Addr>,
    pub client_ip: Ipv4Addr,
    pub elements: String,
    pub conntrack: String,
}

/// Runs the demo with the `lb` binary at `lb`, sending `requests` HTTP requests (half to the
/// VIP, half to the published port), narrating to `out`.
pub fn run(lb: &Path, requests: usize, out: &mut dyn Write) -> Result<Report> {
    let step = |out: &mut dyn Write, what: &str| writeln!(out, "==> {what}");

    step(
        out,
        "creating the topology: client -> node (router, lb attached) -> 3 backends",
    )?;
    let topo = Topology::new(BACKENDS).context("creating the demo topology")?;
    let _servers = spawn_backends(&topo, HTTP_PORT, HTTP_PORT).context("starting the backends")?;
    let mut report = Report {
        backends: (0..BACKENDS)
            .map(|i| (format!("b{i}"), topo.backend_ips[i]))
            .collect(),
        via_vip: BTreeMap::new(),
        via_published: BTreeMap::new(),
        peers: Vec::new(),
        client_ip: topo.client_ip,
        elements: String::new(),
        conntrack: String::new(),
    };
    writeln!(
        out,
        "    client {} ({}), node {} ({}), backends {}",
        topo.client_ip,
        topo.client.name(),
        topo.node_ip,
        topo.node.name(),
        topo.backend_ips
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;

    step(
        out,
        "starting lb daemon (private state dir, socket and bpffs)",
    )?;
    let bpffs = Bpffs::new()?;
    let daemon = LbDaemon::start(lb, bpffs.path(), &[])?;
    let lb_cmd = |out: &mut dyn Write, args: &[&str]| -> Result<String> {
        writeln!(out, "    $ lb {}", args.join(" "))?;
        let run = daemon.cli(args);
        ensure!(
            run.ok(),
            "lb {} failed: {}",
            args.join(" "),
            run.stderr.trim()
        );
        Ok(run.stdout)
    };

    step(out, "programming the service through the lb CLI")?;
    let network = network_add(&topo, "demo");
    lb_cmd(out, &network.iter().map(String::as_str).collect::<Vec<_>>())?;
    let port = format!("tcp/{PUBLISHED}:{HTTP_PORT}");
    let service = service_set("demo", "web", "1", VIP, &port, &topo.backend_ips);
    lb_cmd(out, &service.iter().map(String::as_str).collect::<Vec<_>>())?;

    let half = requests / 2;
    step(
        out,
        &format!(
            "sending {half} HTTP requests to http://{VIP}:{HTTP_PORT}/ and {} to http://{}:{PUBLISHED}/ from the client",
            requests - half,
            topo.node_ip
        ),
    )?;
    for (i, (count, addr, port)) in [
        (half, VIP, HTTP_PORT),
        (requests - half, topo.node_ip, PUBLISHED),
    ]
    .into_iter()
    .enumerate()
    {
        for n in 0..count {
            let body = http_get(&topo.client, addr, port, Duration::from_secs(3))
                .with_context(|| format!("request {} of {count} to {addr}:{port}", n + 1))?;
            let reply: Reply = body.parse()?;
            let tally = if i == 0 {
                &mut report.via_vip
            } else {
                &mut report.via_published
            };
            *tally.entry(reply.backend).or_default() += 1;
            if !report.peers.contains(reply.peer.ip()) {
                report.peers.push(*reply.peer.ip());
            }
        }
    }

    writeln!(out)?;
    writeln!(
        out,
        "    {:<8} {:<12} {:>8} {:>10} {:>7}",
        "backend",
        "address",
        "via VIP",
        format!("via :{PUBLISHED}"),
        "total"
    )?;
    for (name, ip) in &report.backends {
        let v = report.via_vip.get(name).copied().unwrap_or(0);
        let p = report.via_published.get(name).copied().unwrap_or(0);
        writeln!(
            out,
            "    {name:<8} {:<12} {v:>8} {p:>10} {:>7}",
            ip.to_string(),
            v + p
        )?;
    }
    let peers: Vec<String> = report.peers.iter().map(|p| p.to_string()).collect();
    writeln!(
        out,
        "    backends saw the client as {} (routed: lb does not masquerade)\n",
        peers.join(", ")
    )?;

    step(out, "what lb composed and wrote to its maps")?;
    report.elements = lb_cmd(out, &["elements", "demo"])?;
    for line in report.elements.lines() {
        writeln!(out, "    {line}")?;
    }
    step(out, "the flows lb is tracking (first 8)")?;
    report.conntrack = lb_cmd(out, &["conntrack", "demo"])?;
    // The table's header, then its rows.
    let mut lines = report.conntrack.lines();
    if let Some(header) = lines.next() {
        writeln!(out, "    {header}")?;
    }
    let flows: Vec<&str> = lines.collect();
    for line in flows.iter().take(8) {
        writeln!(out, "    {line}")?;
    }
    if flows.len() > 8 {
        writeln!(out, "    … {} more", flows.len() - 8)?;
    }

    step(
        out,
        "cleaning up: network removed, daemon stopped, namespaces and bpffs deleted",
    )?;
    lb_cmd(out, &["network", "rm", "demo"])?;
    drop(daemon);
    drop(bpffs);
    drop(_servers);
    drop(topo);
    writeln!(out, "==> done")?;
    Ok(report)
}
