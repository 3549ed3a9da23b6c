//! `cargo xtask bench`: real traffic through a node, side by side with the kernel's load
//! balancers (`lb_tests::bench::real`); the programs' per-packet cost under
//! BPF_PROG_TEST_RUN (`lb_tests::bench::packets`); then the control plane's cost end to end through the CLI, on each dataplane
//! (`lb_tests::scale`). The report goes to `OUT/BENCHMARKS.md`, `OUT/bench/results.json` and
//! `OUT/bench/ratios.svg` (`lb_tests::bench::report`).
//!
//! `lb-bench [--quick] [--out DIR] [--dataplane ebpf|nftables]... [--lb PATH] [--no-packets]
//! [--no-traffic] [--no-control-plane] [--no-dsr] [--scenario NAME]... [--node SHAPE]...`: `--quick` runs fewer and shorter
//! rounds and the control plane at 100 and 1,000 services instead of 1,000 and 10,000;
//! `--dataplane` picks the control plane's dataplanes (both by default); without `--lb` (the
//! `lb` binary to drive) the real traffic and the control plane are left out; `--scenario`
//! (a key of the JSON, e.g. `lb_tc`) runs only those scenarios of the real traffic, `--node`
//! (`empty`, `docker`, `nomad`: `lb_tests::firewall`) only on those node shapes. Without
//! `--no-dsr` leaves out the DSR segment (`lb_tests::bench::dsr`). Without `--out` nothing is
//! written, the tables are printed only.
use std::{fmt::Write as _, path::PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use lb_tests::{
    bench::{Scenario, packets, real, report},
    firewall::NodeShape,
    scale,
};

/// Control-plane sizes (services of `PER` backends with a published port each).
const SIZES: [u32; 2] = [1000, 10_000];
const QUICK_SIZES: [u32; 2] = [100, 1000];
/// The size applied on eBPF alone, beyond the others (a full run only).
const LARGE: u32 = 50_000;
const PER: u32 = 10;
/// One-backend changes timed at each size.
const CHANGES: u32 = 40;
/// Backend changes a second of the churn (through the API, batched in 10 ms windows).
const CHURN: u32 = 1000;

struct Args {
    quick: bool,
    dataplanes: Vec<String>,
    lb: Option<PathBuf>,
    packets: bool,
    traffic: bool,
    control_plane: bool,
    dsr: bool,
    out: Option<PathBuf>,
    scenarios: Vec<Scenario>,
    nodes: Vec<NodeShape>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        quick: false,
        dataplanes: Vec::new(),
        lb: None,
        packets: true,
        traffic: true,
        control_plane: true,
        dsr: true,
        out: None,
        scenarios: Vec::new(),
        nodes: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => a.quick = true,
            "--no-packets" => a.packets = false,
            "--no-traffic" => a.traffic = false,
            "--no-control-plane" => a.control_plane = false,
            "--no-dsr" => a.dsr = false,
            "--out" => a.out = Some(it.next().context("--out takes a directory")?.into()),
            "--scenario" => {
                let key = it.next().context("--scenario takes a name")?;
                let s = (Scenario::ALL.into_iter())
                    .find(|s| s.key() == key)
                    .with_context(|| {
                        let keys: Vec<&str> = Scenario::ALL.iter().map(|s| s.key()).collect();
                        format!("--scenario {key}: one of {}", keys.join(", "))
                    })?;
                a.scenarios.push(s);
            }
            "--node" => {
                let key = it.next().context("--node takes a shape")?;
                let n = (NodeShape::ALL.into_iter())
                    .find(|n| n.key() == key)
                    .with_context(|| {
                        let keys: Vec<&str> = NodeShape::ALL.iter().map(|n| n.key()).collect();
                        format!("--node {key}: one of {}", keys.join(", "))
                    })?;
                a.nodes.push(n);
            }
            "--dataplane" => {
                let dp = it.next().context("--dataplane takes ebpf or nftables")?;
                ensure!(
                    dp == "ebpf" || dp == "nftables",
                    "--dataplane {dp}: ebpf or nftables"
                );
                a.dataplanes.push(dp);
            }
            "--lb" => a.lb = Some(it.next().context("--lb takes a path")?.into()),
            other => bail!("unknown argument {other:?}"),
        }
    }
    if a.dataplanes.is_empty() {
        a.dataplanes = vec!["ebpf".into(), "nftables".into()];
    }
    Ok(a)
}

fn main() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    let a = args()?;
    let mut outcome = None;
    let mut cfg = None;
    if let Some(lb) = a.lb.as_deref().filter(|_| a.traffic) {
        let mut c = real::Config::new(lb, a.quick);
        c.only = a.scenarios.clone();
        c.dsr = a.dsr;
        if !a.nodes.is_empty() {
            c.shapes = a.nodes.clone();
        }
        println!("lb bench: real traffic\n{}\n", c.method());
        outcome = Some(real::run(&c).context("the real-traffic benchmark")?);
        cfg = Some(c);
    }
    let micro = if a.packets {
        Some(packets::report(if a.quick {
            packets::QUICK_ROUNDS
        } else {
            packets::ROUNDS
        })?)
    } else {
        None
    };
    let control = match &a.lb {
        Some(lb) if a.control_plane => Some(control_plane(
            lb,
            &a.dataplanes,
            if a.quick { &QUICK_SIZES } else { &SIZES },
            (!a.quick).then_some(LARGE),
        )?),
        _ => None,
    };
    let (samples, notes, profiles, dsr) = outcome.map_or_else(Default::default, |o| {
        (o.samples, o.notes, o.profiles, o.dsr)
    });
    let run = report::Run {
        machine: machine(),
        params: cfg
            .as_ref()
            .map_or(serde_json::Value::Null, real::Config::params),
        method: cfg.as_ref().map_or_else(
            || "No real traffic in this run (no `--lb`, or `--no-traffic`).".to_owned(),
            real::Config::method,
        ),
        samples,
        notes,
        micro,
        control_plane: control,
        profiles,
        dsr,
        quick: a.quick,
    };
    let md = report::markdown(&run);
    println!("\n{md}");
    if let Some(out) = &a.out {
        report::write(&run, out)?;
        println!(
            "lb bench: wrote {0}/BENCHMARKS.md, {0}/bench/results.json, {0}/bench/ratios.svg",
            out.display()
        );
    }
    Ok(())
}

/// Kernel, CPUs and CPU model, as the report names the machine.
fn machine() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = (cpuinfo.lines())
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown".to_owned(), |(_, m)| m.trim().to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = (read("/proc/meminfo").lines())
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map_or("unknown".to_owned(), |m| m.trim().to_owned());
    vec![
        (
            "kernel".into(),
            read("/proc/sys/kernel/osrelease").trim().to_owned(),
        ),
        ("CPUs".into(), cpus.to_string()),
        ("CPU model".into(), model),
        ("memory".into(), mem),
    ]
}

/// Each size on each dataplane, from scratch (a fresh daemon, namespace and bpffs each), and
/// `large` on eBPF; a failure of `lb` is reported in its row, not raised: the report says
/// what does not work. Then the control-plane issue's targets, met or not, and what bounds a
/// missed one.
fn control_plane(
    lb: &std::path::Path,
    dataplanes: &[String],
    sizes: &[u32],
    large: Option<u32>,
) -> Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "control plane: N services of {PER} backends and one published TCP port each (while ports last), applied from scratch with `lb apply -f`; then {CHANGES} backend changes with `lb service backend disable|enable`, each timed end to end (CLI start to exit) and inside the daemon (`last_change.micros`); then {CHURN} backend changes a second for 5 s through the API, batched by the client in 10 ms windows, each timed from when it was due to its batch's answer (applied); the daemon's network is one veth in its own netns. aliases: the kernel's time to add the N VIP aliases alone (`ip -batch`), part of the eBPF apply"
    );
    let mut runs: Vec<(&str, u32, Option<u32>)> = Vec::new();
    for dp in dataplanes {
        for &n in sizes {
            runs.push((dp, n, Some(CHURN)));
        }
    }
    if let Some(n) = large
        && dataplanes.iter().any(|d| d == "ebpf")
    {
        runs.push(("ebpf", n, None));
    }
    let mut rows = Vec::new();
    for (dp, n, churn) in runs {
        let row = scale::control_plane(lb, dp, n, PER, CHANGES, churn)
            .with_context(|| format!("{dp} at {n} services"))?;
        println!(
            "{}",
            scale::report(std::slice::from_ref(&row))
                .lines()
                .nth(1)
                .unwrap_or("")
        );
        rows.push(row);
    }
    let _ = writeln!(out, "\n{}", scale::report(&rows));
    let _ = writeln!(
        out,
        "map memory: the memlock the kernel charges for the daemon's maps (per-CPU maps: every possible CPU); RSS: the daemon's, after the changes\n"
    );
    for line in targets(&rows) {
        let _ = writeln!(out, "{line}");
    }
    println!("\n{out}");
    Ok(out)
}

/// The control-plane issue's targets against `rows`, each missed one followed by what bounds
/// it (the work it cannot leave out, as profiles of these runs show it; the figures are the
/// run's).
fn targets(rows: &[scale::Row]) -> Vec<String> {
    use std::time::Duration;
    let ms = |d: Option<Duration>| {
        d.map_or("-".to_owned(), |d| {
            format!("{:.2} ms", d.as_secs_f64() * 1e3)
        })
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let row = |dp: &str, n: u32| rows.iter().find(|r| r.dataplane == dp && r.services == n);
    let mut out = Vec::new();
    if let Some(r) = row("ebpf", 10_000) {
        let (p50, p99) = (
            scale::quantile(&r.changes, 0.5),
            scale::quantile(&r.changes, 0.99),
        );
        let inside = scale::quantile(&r.inside, 0.5);
        let ms10 = Duration::from_millis(10);
        let ok = p50.is_some_and(|d| d <= ms10) && p99.is_some_and(|d| d <= 3 * ms10);
        out.push(format!(
            "target eBPF 10,000 x 10, one backend change through the CLI <= 10 ms p50 and <= 30 ms p99: {} / {} ({})",
            ms(p50),
            ms(p99),
            verdict(ok)
        ));
        if !ok {
            out.push(format!(
                "  bounded by: the CLI process (its start, the socket, the JSON both ways) around the daemon's {} p50; the p99 by the other core's load (two shared cores)",
                ms(inside)
            ));
        }
        let ok = inside.is_some_and(|d| d <= Duration::from_millis(2));
        out.push(format!(
            "target eBPF 10,000 x 10, a change inside the daemon <= 2 ms p50: {} ({})",
            ms(inside),
            verdict(ok)
        ));
        if !ok {
            out.push(
                "  bounded by: the store's transaction (one fsync) and the map writes of the set"
                    .into(),
            );
        }
        let rest = r.aliases.map(|a| r.apply.0.saturating_sub(a));
        let ok = rest.is_some_and(|d| d <= Duration::from_secs(1));
        out.push(format!(
            "target eBPF 10,000 x 10, a full apply <= 1 s apart from the VIP aliases: {} of {} total, the aliases {} ({})",
            ms(rest),
            ms(Some(r.apply.0)),
            ms(r.aliases),
            verdict(ok)
        ));
        if !ok {
            out.push(
                "  bounded by: kernel work per entry and per object, not one hot spot: one bpf(2) update per map entry (a service and its backends' slots: 220,006 here), the programs' load and verification, the maps' creation, the CLI's state parsed and composed and the store written once; and \"apart from the aliases\" subtracts their time as `ip -batch` takes it on a scratch interface, an estimate of the daemon's own adds (each address the kernel adds walks the interface's addresses: their time grows with the square of their number)".into(),
            );
        }
        if let Some(c) = &r.churn {
            let p99 = scale::quantile(&c.latency, 0.99);
            let done = c.made as f64 / c.secs.max(1e-9);
            out.push(format!(
                "target eBPF 10,000 x 10, {} backend changes a second each applied within 100 ms p99: {done:.0}/s made, p99 {} ({})",
                c.rate,
                ms(p99),
                verdict(
                    c.error.is_none()
                        && done >= 0.95 * f64::from(c.rate)
                        && p99.is_some_and(|d| d <= Duration::from_millis(100))
                )
            ));
        }
    }
    if let Some(r) = row("nftables", 10_000) {
        let p50 = scale::quantile(&r.changes, 0.5);
        let ok = p50.is_some_and(|d| d <= Duration::from_millis(50));
        out.push(format!(
            "target nftables 10,000 x 10, one change <= 50 ms p50: {} ({})",
            ms(p50),
            verdict(ok)
        ));
        if !ok {
            out.push(
                "  bounded by: `nft` itself: each `nft -f` loads its cache of the table's objects before it sends the transaction, a floor that grows with the table, whatever the change".into(),
            );
        }
    }
    if let Some(r) = rows
        .iter()
        .find(|r| r.dataplane == "ebpf" && r.services >= 50_000)
    {
        out.push(format!(
            "target eBPF {} x 10 applies: {} in {}, RSS {} ({})",
            r.services,
            if r.apply.1.is_none() {
                "applied"
            } else {
                "failed"
            },
            ms(Some(r.apply.0)),
            r.rss_kib
                .map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
            verdict(r.apply.1.is_none())
        ));
    }
    out
}
