//! `cargo xtask bench`: the programs' per-packet cost under BPF_PROG_TEST_RUN, on one private
//! (unpinned) instance of the object with 1,000 services in its maps.
//!
//! This VM's two shared cores drift from minute to minute, so absolute numbers mean little:
//! every case runs once per round, rounds interleave the cases (rotating which goes first),
//! and the report gives each case's median and its ratio to the baseline of the same hook —
//! a packet that is not for any service, which only pays for parsing and the lookups that
//! decide so. No timing is asserted anywhere; this is a report.
use std::{collections::BTreeSet, net::Ipv4Addr};

use anyhow::{Context as _, Result, bail, ensure};
use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp};
use lb_tests::packet::Ipv4Packet;
use lb_user::{
    compose::compose,
    dataplane::ebpf::{self, EbpfNetwork, NodeAddrs, PROG_TC_INGRESS, PROG_XDP},
    model::{Attach, Backend, Masquerade, Mode, Network, PortConfig, Proto, Service},
};

const SERVICES: u32 = 1000;
const ROUNDS: usize = 15;
const REPEAT: u32 = 20_000;
const NODE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 2);

#[derive(Clone, Copy, PartialEq)]
enum Hook {
    Xdp,
    Tc,
}

struct Case {
    hook: Hook,
    what: &'static str,
    packet: Vec<u8>,
    /// Per-run nanoseconds of each round, as the kernel measured them.
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
            vip: vip(i),
            backends: (0..3)
                .map(|k| Backend {
                    ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 20, 0, 0)) + 3 * i + k),
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
        timeouts: Default::default(),
        services,
    }
}

fn run(dp: &mut EbpfNetwork, hook: Hook, packet: &[u8], repeat: u32) -> Result<(u32, f64)> {
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        repeat,
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
    // The kernel reports the mean duration of one run of the `repeat`.
    Ok((res.return_value, res.duration.as_nanos() as f64))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    let mut dp = EbpfNetwork::unpinned().context("loading the eBPF object")?;
    {
        let ebpf = dp.ebpf_mut();
        let xdp: &mut Xdp = ebpf.program_mut(PROG_XDP).context("lb_xdp")?.try_into()?;
        xdp.load().context("loading lb_xdp")?;
        let tc: &mut SchedClassifier = ebpf
            .program_mut(PROG_TC_INGRESS)
            .context("lb_tc_ingress")?
            .try_into()?;
        tc.load().context("loading lb_tc_ingress")?;
    }
    let net = network();
    let composed = compose(&net);
    let plan = ebpf::plan(&net, &composed);
    let node = NodeAddrs {
        local: vec![NODE],
        ifaces: vec![(1, NODE)],
        ephemeral: None,
    };
    let keep: BTreeSet<Ipv4Addr> = (net.services.iter())
        .flat_map(|s| s.backends.iter().map(|b| b.ip))
        .collect();
    dp.sync(&plan, &node, &keep).context("filling the maps")?;

    let bytes = |p: Ipv4Packet| p.build();
    let mid = vip(SERVICES / 2);
    let mut cases = Vec::new();
    for hook in [Hook::Tc, Hook::Xdp] {
        // Distinct client ports per hook: the two hooks share lb_flows.
        let sport = if hook == Hook::Tc { 40000 } else { 41000 };
        for (what, packet) in [
            (
                "not for a service (baseline)",
                bytes(Ipv4Packet::tcp(
                    CLIENT,
                    sport,
                    Ipv4Addr::new(10, 0, 0, 77),
                    80,
                )),
            ),
            (
                "VIP, tracked TCP flow",
                bytes(Ipv4Packet::tcp(CLIENT, sport + 1, mid, 80)),
            ),
            (
                "VIP, tracked UDP flow",
                bytes(Ipv4Packet::udp(CLIENT, sport + 2, mid, 53)),
            ),
            (
                "published port, tracked TCP flow",
                bytes(Ipv4Packet::tcp(CLIENT, sport + 3, NODE, 8080)),
            ),
        ] {
            cases.push(Case {
                hook,
                what,
                packet,
                samples: Vec::new(),
            });
        }
    }
    // One run each first: it creates the flow that every timed run then finds (the "tracked"
    // cases), and checks that nothing is dropped.
    for c in &cases {
        let (verdict, _) = run(&mut dp, c.hook, &c.packet, 1)?;
        let pass = if c.hook == Hook::Xdp { 2 } else { 0 };
        ensure!(verdict == pass, "{}: verdict {verdict}", c.what);
    }
    let tracked = dp.flow_entries().len();

    println!(
        "lb bench: BPF_PROG_TEST_RUN, {SERVICES} services x 3 backends, {ROUNDS} interleaved rounds of {REPEAT} runs per case"
    );
    for round in 0..ROUNDS {
        let n = cases.len();
        for k in 0..n {
            let c = &mut cases[(round + k) % n];
            let (_, ns) = run(&mut dp, c.hook, &c.packet, REPEAT)?;
            c.samples.push(ns);
        }
    }

    println!(
        "\n{:<6} {:<34} {:>10} {:>10} {:>12}",
        "hook", "case", "median ns", "min ns", "vs baseline"
    );
    for hook in [Hook::Tc, Hook::Xdp] {
        let of_hook: Vec<&Case> = cases.iter().filter(|c| c.hook == hook).collect();
        let base = median(&of_hook[0].samples);
        for c in of_hook {
            let m = median(&c.samples);
            let min = c.samples.iter().copied().fold(f64::INFINITY, f64::min);
            println!(
                "{:<6} {:<34} {m:>10.1} {min:>10.1} {:>11.2}x",
                if hook == Hook::Tc { "tc" } else { "xdp" },
                c.what,
                m / base
            );
        }
    }
    let n = cases.len() / 2;
    println!("\nxdp / tc for the same packet (below 1: XDP is cheaper):");
    for k in 0..n {
        let (tc, xdp) = (&cases[k], &cases[k + n]);
        println!(
            "  {:<34} {:>6.2}x",
            tc.what,
            median(&xdp.samples) / median(&tc.samples)
        );
    }
    println!(
        "\n{tracked} flows tracked during the run; absolute numbers drift on this VM, ratios are the result"
    );
    Ok(())
}
