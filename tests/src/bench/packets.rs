//! The programs' per-packet cost under BPF_PROG_TEST_RUN, on one private (unpinned) instance
//! of the object with 1,000 services in its maps, for each ingress hook (`lb_tc_ingress`,
//! `lb_xdp`): a packet that is not for a service (the baseline), tracked TCP and UDP flows, a
//! flow creation and a mid-flow re-creation. `cargo xtask bench` reports it (`lb-bench`);
//! `cargo xtask test` prints one round of it (`tests/tests/micro.rs`).
//!
//! Every run is a single run (`repeat` 1): a repeated test run feeds each iteration the buffer
//! the previous one rewrote, so after the first iteration a translated packet would be timed on
//! another path (a "tracked flow" would be timed as "not for a service"). A case's sample is
//! the mean of a batch of single runs, as the kernel timed each.
//!
//! This VM's two shared cores drift from minute to minute, so absolute numbers mean little:
//! every case runs once per round, rounds interleave the cases (rotating which goes first),
//! and the report gives each case's median and its ratio to the baseline of the same hook —
//! a packet that is not for any service, which only pays for parsing and the lookups that
//! decide so. No timing is asserted anywhere; this is a report.
use std::{collections::BTreeSet, fmt::Write as _, net::Ipv4Addr};

use anyhow::{Context as _, Result, ensure};
use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp};
use lb_user::{
    core::compose::compose,
    core::model::{Attach, Backend, Masquerade, Mode, Network, PortConfig, Proto, Service},
    dataplane::ebpf::{self, EbpfNetwork, NodeAddrs, PROG_TC_INGRESS, PROG_XDP},
};

use crate::packet::Ipv4Packet;

const SERVICES: u32 = 1000;
/// Rounds of a full run and of a quick one.
pub const ROUNDS: usize = 15;
pub const QUICK_ROUNDS: usize = 3;
/// Single runs per case per round.
const BATCH: u16 = 400;
const NODE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 2);

#[derive(Clone, Copy, PartialEq)]
enum Hook {
    Xdp,
    Tc,
}

/// What a case sends, and what must hold before its timed runs.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// The same packet every run (its flow, if any, created by an untimed first run).
    Same,
    /// A TCP SYN from a client port no run used before: a new flow each run.
    NewSyn,
    /// A TCP ACK of a connection whose entries were all deleted (as LRU eviction does): a
    /// re-creation each run.
    Recreate,
}

struct Case {
    hook: Hook,
    what: &'static str,
    kind: Kind,
    packet: Ipv4Packet,
    /// Mean nanoseconds per run of each round's batch, as the kernel timed them.
    samples: Vec<f64>,
}

fn vip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 99, 0, 0)) + i)
}

fn network() -> Network {
    let services = (0..SERVICES)
        .map(|i| Service {
            id: format!("s{i}"),
            generation: "1".into(),
            vips: vec![vip(i).into()],
            backends: (0..3)
                .map(|k| Backend {
                    ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 20, 0, 0)) + 3 * i + k).into(),
                    disabled: false,
                })
                .collect(),
            ports: if i == 0 {
                vec![PortConfig {
                    proto: Proto::Tcp,
                    published: 8080,
                    target: Some(80),
                    host_ip: None,
                }]
            } else {
                vec![]
            },
        })
        .collect();
    Network {
        name: "bench".into(),
        interfaces: vec!["lo".into()],
        netns: None,
        mode: Mode::Nat,
        attach: Attach::Tc,
        masquerade: Masquerade::Never,
        fast_path: Default::default(),
        hold_ports: Default::default(),
        timeouts: Default::default(),
        services,
    }
}

fn run(dp: &mut EbpfNetwork, hook: Hook, packet: &[u8]) -> Result<(u32, f64)> {
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        repeat: 1,
        ..Default::default()
    };
    let ebpf = dp.ebpf_mut();
    let res = match hook {
        Hook::Xdp => {
            let p: &mut Xdp = ebpf.program_mut(PROG_XDP).context("lb_xdp")?.try_into()?;
            p.test_run(opts)?
        }
        Hook::Tc => {
            let p: &mut SchedClassifier = ebpf
                .program_mut(PROG_TC_INGRESS)
                .context("lb_tc_ingress")?
                .try_into()?;
            p.test_run(opts)?
        }
    };
    Ok((res.return_value, res.duration.as_nanos() as f64))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Verdicts a run may end with: XDP passes; TC passes (-1) or translated (0).
fn ok_verdict(hook: Hook, v: u32) -> bool {
    match hook {
        Hook::Xdp => v == 2,
        Hook::Tc => v == u32::MAX || v == 0,
    }
}

/// One round of a case: `BATCH` single runs, their mean. `next_port` hands out client ports no
/// run has used (new flows, re-creations).
fn round(dp: &mut EbpfNetwork, c: &Case, next_port: &mut u16) -> Result<f64> {
    let packets: Vec<Vec<u8>> = match c.kind {
        Kind::Same => vec![c.packet.build(); usize::from(BATCH)],
        Kind::NewSyn | Kind::Recreate => (0..BATCH)
            .map(|_| {
                *next_port = next_port.wrapping_add(1).max(1024);
                Ipv4Packet {
                    sport: *next_port,
                    ..c.packet.clone()
                }
            })
            .map(|p| p.build())
            .collect(),
    };
    if c.kind == Kind::Recreate {
        // The connections existed (their SYNs went through), then lost every entry.
        for p in &packets {
            let fixed = Ipv4Packet {
                tcp_flags: 0x02,
                sport: u16::from_be_bytes([p[34], p[35]]),
                ..c.packet.clone()
            };
            run(dp, c.hook, &fixed.build())?;
        }
        let keys: Vec<_> = dp.flow_entries().into_iter().map(|(k, _)| k).collect();
        for k in keys {
            let _ = dp.flows_mut().remove(&k);
        }
    }
    let mut total = 0.0;
    for p in &packets {
        let (verdict, ns) = run(dp, c.hook, p)?;
        ensure!(ok_verdict(c.hook, verdict), "{}: verdict {verdict}", c.what);
        total += ns;
    }
    Ok(total / f64::from(BATCH))
}

/// The cases in `rounds` interleaved rounds: the report's table (also printed).
pub fn report(rounds: usize) -> Result<String> {
    let mut dp = EbpfNetwork::unpinned().context("loading the eBPF object")?;
    dp.load_ipv6_twins()
        .context("loading the programs (and the IPv6 twins they tail-call)")?;
    let net = network();
    let composed = compose(&net);
    let plan = ebpf::plan(&net, &composed);
    let node = NodeAddrs {
        local: vec![NODE.into()],
        ifaces: vec![(1, NODE.into())],
        ephemeral: None,
    };
    let keep: BTreeSet<std::net::IpAddr> = (net.services.iter())
        .flat_map(|s| s.backends.iter().map(|b| b.ip))
        .collect();
    dp.sync(&plan, &node, &keep, None)
        .context("filling the maps")?;

    let mid = vip(SERVICES / 2);
    let ack = |p: Ipv4Packet| Ipv4Packet {
        tcp_flags: 0x10,
        ..p
    };
    let mut cases = Vec::new();
    for hook in [Hook::Tc, Hook::Xdp] {
        // Distinct client ports per hook: the two hooks share lb_flows.
        let sport = if hook == Hook::Tc { 40000 } else { 41000 };
        for (what, kind, packet) in [
            (
                "not for a service (baseline)",
                Kind::Same,
                Ipv4Packet::tcp(CLIENT, sport, Ipv4Addr::new(10, 0, 0, 77), 80),
            ),
            (
                "VIP, tracked TCP flow",
                Kind::Same,
                ack(Ipv4Packet::tcp(CLIENT, sport + 1, mid, 80)),
            ),
            (
                "VIP, tracked UDP flow",
                Kind::Same,
                Ipv4Packet::udp(CLIENT, sport + 2, mid, 53),
            ),
            (
                "published port, tracked TCP flow",
                Kind::Same,
                ack(Ipv4Packet::tcp(CLIENT, sport + 3, NODE, 8080)),
            ),
            (
                "VIP, new flow (TCP SYN)",
                Kind::NewSyn,
                Ipv4Packet::tcp(Ipv4Addr::new(10, 11, 0, 2), 0, mid, 80),
            ),
            (
                "VIP, mid-flow re-creation (TCP ACK)",
                Kind::Recreate,
                ack(Ipv4Packet::tcp(Ipv4Addr::new(10, 12, 0, 2), 0, mid, 80)),
            ),
        ] {
            cases.push(Case {
                hook,
                what,
                kind,
                packet,
                samples: Vec::new(),
            });
        }
    }
    // One run of each "same packet" case first: it creates the flow every timed run then
    // finds (a tracked flow's first packet is its opener: a SYN, then ACKs).
    for c in &cases {
        if c.kind == Kind::Same {
            let mut first = c.packet.clone();
            if first.proto == 6 {
                first.tcp_flags = 0x02;
            }
            let (verdict, _) = run(&mut dp, c.hook, &first.build())?;
            ensure!(ok_verdict(c.hook, verdict), "{}: verdict {verdict}", c.what);
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "BPF_PROG_TEST_RUN, {SERVICES} services x 3 backends, {rounds} interleaved rounds of {BATCH} single runs per case"
    );
    let mut next_port = 1024u16;
    for r in 0..rounds {
        let n = cases.len();
        for k in 0..n {
            let i = (r + k) % n;
            let ns = round(&mut dp, &cases[i], &mut next_port)?;
            cases[i].samples.push(ns);
        }
    }
    let tracked = dp.flow_entries().len();

    let _ = writeln!(
        out,
        "\n{:<6} {:<38} {:>10} {:>10} {:>12}",
        "hook", "case", "median ns", "min ns", "vs baseline"
    );
    for hook in [Hook::Tc, Hook::Xdp] {
        let of_hook: Vec<&Case> = cases.iter().filter(|c| c.hook == hook).collect();
        let base = median(&of_hook[0].samples);
        for c in of_hook {
            let m = median(&c.samples);
            let min = c.samples.iter().copied().fold(f64::INFINITY, f64::min);
            let _ = writeln!(
                out,
                "{:<6} {:<38} {m:>10.1} {min:>10.1} {:>11.2}x",
                if hook == Hook::Tc { "tc" } else { "xdp" },
                c.what,
                m / base
            );
        }
    }
    let n = cases.len() / 2;
    let _ = writeln!(
        out,
        "\nxdp / tc for the same packet (below 1: XDP is cheaper):"
    );
    for k in 0..n {
        let (tc, xdp) = (&cases[k], &cases[k + n]);
        let _ = writeln!(
            out,
            "  {:<38} {:>6.2}x",
            tc.what,
            median(&xdp.samples) / median(&tc.samples)
        );
    }
    let _ = writeln!(
        out,
        "\n{tracked} flow entries at the end; absolute numbers drift on this VM, ratios are the result"
    );
    println!("\n{out}");
    Ok(out)
}
