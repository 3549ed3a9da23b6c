//! Node-scale desired states and the control-plane benchmark: a state of N services applied
//! with `lb apply -f` from scratch, then one backend at a time changed with `lb service set`,
//! timed end to end (CLI start to exit) against a daemon whose network is one veth in a
//! namespace of its own; with the daemon's RSS and the memory its maps charge.
use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_user::core::model::{
    Attach, Backend, DesiredState, Masquerade, Mode, Network, PortConfig, Proto, Service,
};

use crate::{bpffs::Bpffs, daemon::LbDaemon, netns::Netns};

/// First port published by a generated state: service `i` publishes `tcp/(FIRST_PORT + i)`.
pub const FIRST_PORT: u16 = 20000;

fn nth(base: Ipv4Addr, i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + i)
}

/// The VIP of generated service `i`.
pub fn vip(i: u32) -> Ipv4Addr {
    nth(Ipv4Addr::new(10, 128, 0, 1), i)
}

/// Backend `k` of generated service `i` (`per` backends each), addresses no one answers on.
pub fn backend(i: u32, k: u32, per: u32) -> Ipv4Addr {
    nth(Ipv4Addr::new(100, 64, 0, 1), i * per + k)
}

/// `n` services `s0`…, each a VIP with `per` backends and one published TCP port
/// (`FIRST_PORT + i` to `target`), as a generated node would have them.
pub fn services(n: u32, per: u32, target: u16) -> Vec<Service> {
    assert!(
        u32::from(FIRST_PORT) + n <= 65536,
        "{n} services run out of ports"
    );
    (0..n)
        .map(|i| Service {
            id: format!("s{i}"),
            generation: "1".into(),
            vips: vec![vip(i).into()],
            backends: (0..per)
                .map(|k| Backend {
                    ip: backend(i, k, per).into(),
                    disabled: false,
                })
                .collect(),
            ports: vec![PortConfig {
                proto: Proto::Tcp,
                published: FIRST_PORT + i as u16,
                target: Some(target),
                host_ip: None,
            }],
        })
        .collect()
}

/// One network named `name` on `interfaces` in `netns`, holding `services`.
pub fn state(
    name: &str,
    netns: &str,
    interfaces: &[String],
    services: Vec<Service>,
) -> DesiredState {
    DesiredState {
        networks: vec![Network {
            name: name.into(),
            interfaces: interfaces.to_vec(),
            netns: Some(netns.into()),
            mode: Mode::Nat,
            attach: Attach::Tc,
            masquerade: Masquerade::Auto,
            fast_path: Default::default(),
            hold_ports: Default::default(),
            timeouts: Default::default(),
            services,
        }],
    }
}

/// `lb service set` arguments that give service `s` its backends with the first replaced by
/// `new`: one backend changed, the VIP and port kept.
pub fn one_backend_changed(network: &str, s: &Service, new: Ipv4Addr) -> Vec<String> {
    let mut args: Vec<String> = [
        "service",
        "set",
        network,
        &s.id,
        "--generation",
        &s.generation,
    ]
    .map(String::from)
    .into();
    for vip in &s.vips {
        args.extend(["--vip".into(), vip.to_string()]);
    }
    for p in &s.ports {
        args.extend(["--port".into(), p.to_string()]);
    }
    args.extend(["--backend".into(), new.to_string()]);
    for b in &s.backends[1..] {
        args.extend(["--backend".into(), b.ip.to_string()]);
    }
    args
}

/// What one dataplane did with one size.
pub struct Row {
    pub dataplane: String,
    pub services: u32,
    pub per: u32,
    /// The full apply's time, or why it failed (with its time).
    pub apply: (Duration, Option<String>),
    /// Each one-backend change's time, and the first failure if any did.
    pub changes: Vec<Duration>,
    pub change_error: Option<String>,
    pub rss_kib: Option<u64>,
    /// Memory the daemon's maps charge (the kernel's `memlock` of each map it holds).
    pub map_kib: Option<u64>,
}

fn timed(d: &LbDaemon, args: &[String]) -> (Duration, Option<String>) {
    let start = Instant::now();
    let r = d.cli(args);
    let took = start.elapsed();
    // The last two links of the error chain: the cause, without the daemon's preamble.
    let err = (!r.ok()).then(|| {
        let e = r.stderr.trim().replace('\n', " ");
        let mut tail: Vec<&str> = e.rsplit(": ").take(2).collect();
        tail.reverse();
        tail.join(": ")
    });
    (took, err)
}

/// `field` (in kB) of /proc/PID/status.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The `memlock` of every BPF map `pid` holds a descriptor of, each map once.
fn map_memlock_kib(pid: u32) -> Option<u64> {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .ok()?
        .flatten()
    {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        let field = |name: &str| -> Option<u64> {
            let l = info.lines().find(|l| l.starts_with(name))?;
            l.split_whitespace().nth(1)?.parse().ok()
        };
        if let (Some(id), Some(mem)) = (field("map_id:"), field("memlock:"))
            && seen.insert(id)
        {
            total += mem;
        }
    }
    (!seen.is_empty()).then_some(total / 1024)
}

/// Applies `n` services of `per` backends from scratch through `lb` on `dataplane`, then
/// changes one backend of `changes` services one at a time.
pub fn control_plane(lb: &Path, dataplane: &str, n: u32, per: u32, changes: u32) -> Result<Row> {
    let ns = Netns::new("cpbench")?;
    ns.ip([
        "link", "add", "cpb0", "type", "veth", "peer", "name", "cpb1",
    ])?;
    ns.ip(["link", "set", "cpb0", "up"])?;
    ns.ip(["addr", "add", "10.250.0.1/16", "dev", "cpb0"])?;
    let bpffs = Bpffs::new()?;
    let d = LbDaemon::start(lb, bpffs.path(), &["--dataplane", dataplane])?;
    let st = state("bench", ns.name(), &["cpb0".into()], services(n, per, 80));
    let file = d.state_dir().with_file_name("bench.json");
    std::fs::write(&file, st.to_json()).context("writing the generated state")?;
    let apply = timed(
        &d,
        &["apply".into(), "-f".into(), file.display().to_string()],
    );
    let mut row = Row {
        dataplane: dataplane.into(),
        services: n,
        per,
        apply,
        changes: Vec::new(),
        change_error: None,
        rss_kib: None,
        map_kib: None,
    };
    let svcs = &st.networks[0].services;
    for k in 0..changes {
        // Spread over the state, and a backend address no generated service uses.
        let s = &svcs[(k as usize * 7919) % svcs.len()];
        let args = one_backend_changed("bench", s, nth(Ipv4Addr::new(100, 200, 0, 1), k));
        let (took, err) = timed(&d, &args);
        row.changes.push(took);
        if let Some(e) = err {
            row.change_error.get_or_insert(e);
        }
    }
    let pid = d.pid().context("the daemon is running")?;
    row.rss_kib = status_kib(pid, "VmRSS:");
    row.map_kib = map_memlock_kib(pid);
    if row.apply.1.is_none() && row.change_error.is_none() {
        let status = d.ok(&["status"]);
        if !status.contains("applied") {
            bail!("status after the bench: {status}");
        }
    }
    Ok(row)
}

/// The `q` quantile (0..=1) of `v`, nearest rank.
pub fn quantile(v: &[Duration], q: f64) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(rank - 1).copied()
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// The report's lines for `rows`.
pub fn report(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<9} {:>9} {:>10} {:>11} {:>11} {:>9} {:>11}  {}\n",
        "dataplane",
        "services",
        "apply",
        "change p50",
        "change p99",
        "RSS",
        "map memory",
        "failures"
    );
    for r in rows {
        let opt_ms = |d: Option<Duration>| d.map_or("-".into(), ms);
        let kib =
            |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let mut failures = Vec::new();
        if let Some(e) = &r.apply.1 {
            failures.push(format!("apply failed: {e}"));
        }
        if let Some(e) = &r.change_error {
            failures.push(format!("changes failed: {e}"));
        }
        let _ = writeln!(
            out,
            "{:<9} {:>9} {:>10} {:>11} {:>11} {:>9} {:>11}  {}",
            r.dataplane,
            format!("{}x{}", r.services, r.per),
            ms(r.apply.0),
            opt_ms(quantile(&r.changes, 0.5)),
            opt_ms(quantile(&r.changes, 0.99)),
            kib(r.rss_kib),
            kib(r.map_kib),
            if failures.is_empty() {
                "-".into()
            } else {
                failures.join("; ")
            },
        );
    }
    out
}
