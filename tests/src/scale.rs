//! Node-scale desired states and the control-plane benchmark: a state of N services applied
//! with `lb apply -f` from scratch, then one backend at a time drained or enabled again with
//! `lb service backend`, timed end to end (CLI start to exit) and inside the daemon (its
//! `last_change`), then a stream of backend changes at a steady rate through the API, batched
//! by the client in 10 ms windows, each timed from when it was due to its batch's answer
//! (applied); against a daemon whose network is one veth in a namespace of its own; with the
//! kernel's time to add N VIP aliases alone, the daemon's RSS and the memory its maps charge.
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

/// `ms` of a duration below a second, `s` above.
fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

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
/// (`FIRST_PORT + i` to `target`) while ports last (45,535 of them), as a generated node
/// would have them.
pub fn services(n: u32, per: u32, target: u16) -> Vec<Service> {
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
            ports: u16::try_from(u32::from(FIRST_PORT) + i)
                .ok()
                .map(|published| PortConfig {
                    proto: Proto::Tcp,
                    published,
                    target: Some(target),
                    host_ip: None,
                })
                .into_iter()
                .collect(),
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
    /// The kernel's time to add the state's VIP aliases alone (`ip -batch` in a scratch
    /// namespace): the part of an eBPF apply lb does not decide.
    pub aliases: Option<Duration>,
    /// Each one-backend change's time through the CLI, and the first failure if any did.
    pub changes: Vec<Duration>,
    pub change_error: Option<String>,
    /// Each of those changes inside the daemon (`last_change.micros`).
    pub inside: Vec<Duration>,
    /// The churn: changes asked per second, changes made, and each change's time from when
    /// it was due to its batch's answer.
    pub churn: Option<Churn>,
    pub rss_kib: Option<u64>,
    /// Memory the daemon's maps charge (the kernel's `memlock` of each map it holds).
    pub map_kib: Option<u64>,
}

/// A stream of backend changes at a steady rate.
pub struct Churn {
    pub rate: u32,
    pub made: usize,
    pub secs: f64,
    pub latency: Vec<Duration>,
    pub error: Option<String>,
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

/// The kernel's time to add `n` host addresses (the VIP aliases of `n` services) to a veth
/// in a namespace of its own.
fn alias_time(n: u32) -> Result<Duration> {
    let ns = Netns::new("cpalias")?;
    ns.ip([
        "link", "add", "cpa0", "type", "veth", "peer", "name", "cpa1",
    ])?;
    ns.ip(["link", "set", "cpa0", "up"])?;
    let batch: String = (0..n)
        .map(|i| format!("address add {}/32 dev cpa0\n", vip(i)))
        .collect();
    let file = std::env::temp_dir().join(format!("lb-aliases-{}", std::process::id()));
    std::fs::write(&file, batch)?;
    let start = Instant::now();
    let r = ns.ip(["-batch", file.to_str().unwrap_or_default()]);
    let took = start.elapsed();
    let _ = std::fs::remove_file(&file);
    r?;
    Ok(took)
}

/// The daemon's last change's time inside it (`lb status -j`'s `last_change.micros`).
fn inside(d: &LbDaemon) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_str(&d.ok(&["status", "--json"])).ok()?;
    Some(Duration::from_micros(v["last_change"]["micros"].as_u64()?))
}

/// Drains or enables again backend `k % per` of service `(k * 7919) % n` (spread over the
/// state), as change `k` of a stream does; `state` is each backend's (disabled or not).
fn toggle(
    state: &mut std::collections::BTreeMap<(u32, u32), bool>,
    svcs: &[Service],
    k: u32,
) -> lb_user::core::edit::Edit {
    let i = (k as usize * 7919) % svcs.len();
    let s = &svcs[i];
    let b = k % s.backends.len() as u32;
    let disabled = state.entry((i as u32, b)).or_default();
    *disabled = !*disabled;
    let (network, service, generation, ip) = (
        "bench".to_owned(),
        s.id.clone(),
        None,
        s.backends[b as usize].ip,
    );
    if *disabled {
        lb_user::core::edit::Edit::BackendDisable {
            network,
            service,
            generation,
            ip,
        }
    } else {
        lb_user::core::edit::Edit::BackendEnable {
            network,
            service,
            generation,
            ip,
        }
    }
}

/// `rate` backend changes a second for `secs`, through the API: each due at its time, sent in
/// the batch of every change due when the previous batch was answered (at least every 10 ms),
/// and timed from when it was due to its batch's answer.
fn churn(d: &LbDaemon, svcs: &[Service], rate: u32, secs: u32) -> Churn {
    use lb_user::api::{Client, Done, Request};
    let client = Client::new(&d.socket());
    let mut state = std::collections::BTreeMap::new();
    let every = Duration::from_secs(1) / rate;
    let total = rate * secs;
    let start = Instant::now();
    let mut next = 0u32;
    let mut out = Churn {
        rate,
        made: 0,
        secs: 0.0,
        latency: Vec::new(),
        error: None,
    };
    while next < total {
        let window = start + every * next + Duration::from_millis(10);
        if let Some(wait) = window.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let due = ((start.elapsed().as_nanos() / every.as_nanos()) as u32 + 1).min(total);
        let changes: Vec<_> = (next..due).map(|k| toggle(&mut state, svcs, k)).collect();
        let req = Request::Changes {
            changes,
            dry_run: false,
        };
        if let Err(e) = client.call::<Done>(&req) {
            out.error = Some(format!("{e:#}"));
            break;
        }
        let answered = start.elapsed();
        for k in next..due {
            out.latency.push(answered.saturating_sub(every * k));
        }
        out.made += (due - next) as usize;
        next = due;
    }
    out.secs = start.elapsed().as_secs_f64();
    out
}

/// Applies `n` services of `per` backends from scratch through `lb` on `dataplane`, then
/// drains and enables again one backend of `changes` services one at a time through the CLI,
/// then (`churn`: changes a second) a stream of backend changes for 5 s through the API.
pub fn control_plane(
    lb: &Path,
    dataplane: &str,
    n: u32,
    per: u32,
    changes: u32,
    churn_rate: Option<u32>,
) -> Result<Row> {
    let ns = Netns::new("cpbench")?;
    ns.ip([
        "link", "add", "cpb0", "type", "veth", "peer", "name", "cpb1",
    ])?;
    ns.ip(["link", "set", "cpb0", "up"])?;
    ns.ip(["addr", "add", "10.250.0.1/16", "dev", "cpb0"])?;
    let bpffs = Bpffs::new()?;
    // Every VIP's and port's set, and room for those a change replaces.
    let slots = (2 * n * per + 1024).max(lb_common::MAX_BACKEND_SLOTS);
    let slots = slots.to_string();
    let d = LbDaemon::start(
        lb,
        bpffs.path(),
        &["--dataplane", dataplane, "--max-backends", &slots],
    )?;
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
        aliases: None,
        changes: Vec::new(),
        change_error: None,
        inside: Vec::new(),
        churn: None,
        rss_kib: None,
        map_kib: None,
    };
    let svcs = &st.networks[0].services;
    let mut toggled = std::collections::BTreeMap::new();
    for k in 0..changes {
        let args: Vec<String> = match toggle(&mut toggled, svcs, k) {
            lb_user::core::edit::Edit::BackendDisable { service, ip, .. } => [
                "service",
                "backend",
                "disable",
                "bench",
                &service,
                &ip.to_string(),
            ]
            .map(String::from)
            .into(),
            lb_user::core::edit::Edit::BackendEnable { service, ip, .. } => [
                "service",
                "backend",
                "enable",
                "bench",
                &service,
                &ip.to_string(),
            ]
            .map(String::from)
            .into(),
            _ => unreachable!("a toggle drains or enables"),
        };
        let (took, err) = timed(&d, &args);
        row.changes.push(took);
        if let Some(e) = err {
            row.change_error.get_or_insert(e);
        } else if let Some(t) = inside(&d) {
            row.inside.push(t);
        }
    }
    if row.apply.1.is_none()
        && let Some(rate) = churn_rate
    {
        // Changes after the CLI's: toggles of other backends.
        let svcs: Vec<Service> = svcs.iter().skip(1).cloned().collect();
        row.churn = Some(churn(&d, &svcs, rate, 5));
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
    drop(d);
    if dataplane == "ebpf" {
        row.aliases = alias_time(n).ok();
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

/// The report's lines for `rows`.
pub fn report(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<9} {:>9} {:>10} {:>9} {:>11} {:>11} {:>10} {:>16} {:>11} {:>9} {:>11}  {}\n",
        "dataplane",
        "services",
        "apply",
        "aliases",
        "change p50",
        "change p99",
        "in daemon",
        "churn (p99)",
        "churn done",
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
        if let Some(e) = r.churn.as_ref().and_then(|c| c.error.as_ref()) {
            failures.push(format!("churn failed: {e}"));
        }
        let (churn, done) = match &r.churn {
            Some(c) => (
                format!("{}/s ({})", c.rate, opt_ms(quantile(&c.latency, 0.99))),
                format!("{:.0}/s", c.made as f64 / c.secs.max(1e-9)),
            ),
            None => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "{:<9} {:>9} {:>10} {:>9} {:>11} {:>11} {:>10} {:>16} {:>11} {:>9} {:>11}  {}",
            r.dataplane,
            format!("{}x{}", r.services, r.per),
            ms(r.apply.0),
            opt_ms(r.aliases),
            opt_ms(quantile(&r.changes, 0.5)),
            opt_ms(quantile(&r.changes, 0.99)),
            opt_ms(quantile(&r.inside, 0.5)),
            churn,
            done,
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
