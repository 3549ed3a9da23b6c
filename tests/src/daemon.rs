//! A real `lb daemon` process for a test (or the demo): private state dir and socket, a
//! bpffs the caller owns, stopped (by its own pid) when dropped.
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::netns::Topology;

pub struct LbDaemon {
    lb: PathBuf,
    bpffs: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// A command the daemon runs under (`setpriv …`), if any.
    wrapper: Vec<String>,
}

/// What one `lb` client command did.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// `lb network add NAME --netns NODE --interface …` over `topo`'s node interfaces (the first
/// faces the client and carries the VIP aliases).
pub fn network_add(topo: &Topology, name: &str) -> Vec<String> {
    let mut args: Vec<String> = ["network", "add", name, "--netns", topo.node.name()]
        .map(String::from)
        .into();
    for i in &topo.node_ifaces {
        args.extend(["--interface".into(), i.clone()]);
    }
    args
}

/// `lb service set NETWORK ID --generation G --vip VIP --port PORT --backend B…`.
pub fn service_set(
    network: &str,
    id: &str,
    generation: &str,
    vip: Ipv4Addr,
    port: &str,
    backends: &[Ipv4Addr],
) -> Vec<String> {
    let mut args: Vec<String> = ["service", "set", network, id, "--generation", generation]
        .map(String::from)
        .into();
    args.extend([
        "--vip".into(),
        vip.to_string(),
        "--port".into(),
        port.into(),
    ]);
    for b in backends {
        args.extend(["--backend".into(), b.to_string()]);
    }
    args
}

/// `lb service set NETWORK ID --vip VIP --port P… --backend B…` (the default generation).
pub fn service_set_ports(
    network: &str,
    id: &str,
    vip: Ipv4Addr,
    ports: &[String],
    backends: &[Ipv4Addr],
) -> Vec<String> {
    let mut args: Vec<String> = ["service", "set", network, id, "--vip", &vip.to_string()]
        .map(String::from)
        .into();
    for p in ports {
        args.extend(["--port".into(), p.clone()]);
    }
    for b in backends {
        args.extend(["--backend".into(), b.to_string()]);
    }
    args
}

impl LbDaemon {
    /// Starts `lb daemon` (binary `lb`) pinning under `bpffs`, with `extra` daemon flags.
    pub fn start(lb: &Path, bpffs: &Path, extra: &[&str]) -> Result<Self> {
        Self::start_env(lb, bpffs, extra, &[])
    }

    /// `lb daemon --dataplane DATAPLANE --metrics ADDR` on a free address, and that address.
    pub fn start_with_metrics(lb: &Path, bpffs: &Path, dataplane: &str) -> Result<(Self, String)> {
        let metrics = free_metrics_addr()?;
        let d = Self::start(
            lb,
            bpffs,
            &["--dataplane", dataplane, "--metrics", &metrics],
        )?;
        Ok((d, metrics))
    }

    /// Like [`LbDaemon::start`], with `env` added to the daemon's environment.
    pub fn start_env(
        lb: &Path,
        bpffs: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut d = Self::new(lb, bpffs, extra)?;
        d.set_env(env);
        d.spawn()?;
        Ok(d)
    }

    /// A daemon not started yet, with its private directory.
    fn new(lb: &Path, bpffs: &Path, extra: &[&str]) -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lbt-daemon-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(LbDaemon {
            lb: lb.to_path_buf(),
            bpffs: bpffs.to_path_buf(),
            dir,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            wrapper: Vec::new(),
        })
    }

    /// Like [`LbDaemon::start`], with the daemon run by `wrapper` (a command that runs its
    /// arguments, such as `setpriv --bounding-set=…`).
    pub fn start_wrapped(
        lb: &Path,
        bpffs: &Path,
        wrapper: &[&str],
        extra: &[&str],
    ) -> Result<Self> {
        let mut d = Self::new(lb, bpffs, extra)?;
        d.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        d.spawn()?;
        Ok(d)
    }

    /// Daemon flags and environment for the next [`LbDaemon::restart`].
    /// Restarts the daemon on `state` (the store rebuilt from it with `--import`, as an
    /// operator restores an export): the desired state replaced while the daemon was down.
    pub fn restart_with_state(&mut self, state: &str) -> Result<()> {
        let file = self.state_dir().join("restored.json");
        std::fs::write(&file, state)?;
        let extra = self.extra.clone();
        self.extra
            .extend(["--import".to_owned(), file.display().to_string()]);
        let r = self.restart();
        self.extra = extra;
        r
    }

    pub fn set_extra(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
    }

    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.env = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("lb.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))?;
        let child = wrapped(&self.wrapper, &self.lb)
            .arg("daemon")
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--socket")
            .arg(self.socket())
            .arg("--bpffs")
            .arg(&self.bpffs)
            .args(["--retry-secs", "1"])
            .args(&self.extra)
            .env("LB_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.lb.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(self.socket()).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait()? {
                bail!("lb daemon exited with {status}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("lb daemon did not listen within 20s:\n{}", self.log())
    }

    /// `lb ARGS --socket …`.
    pub fn cli<S: AsRef<str>>(&self, args: &[S]) -> Run {
        Command::new(&self.lb)
            .args(args.iter().map(AsRef::as_ref))
            .arg("--socket")
            .arg(self.socket())
            .output()
            .expect("lb runs")
            .into()
    }

    /// Like [`LbDaemon::cli`], and panics with everything `lb` said unless it succeeded.
    pub fn ok<S: AsRef<str>>(&self, args: &[S]) -> String {
        let r = self.cli(args);
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        assert!(
            r.ok(),
            "lb {args:?} failed: {r:?}\ndaemon log:\n{}",
            self.log()
        );
        r.stdout
    }

    /// `lb elements NETWORK`'s elements in DESIGN.md's notation, `{map} {key} : {value}`, a
    /// line each in the daemon's order (read from `-j`: the table's columns are for a reader,
    /// and the notation is what the nft listings and the plans are compared in).
    pub fn elements(&self, network: &str) -> String {
        let listed: Vec<lb_user::api::ElementEntry> =
            serde_json::from_str(&self.ok(&["elements", network, "-j"]))
                .expect("lb elements -j is a JSON list of elements");
        listed.iter().map(|e| format!("{e}\n")).collect()
    }

    /// The entry of `network` in `lb status --json`; panics (with the status) without one.
    pub fn network_status(&self, network: &str) -> serde_json::Value {
        let status: serde_json::Value =
            serde_json::from_str(&self.ok(&["status", "--json"])).expect("lb status --json");
        (status["networks"].as_array().into_iter().flatten())
            .find(|n| n["name"] == network)
            .unwrap_or_else(|| panic!("no network {network} in lb status: {status}"))
            .clone()
    }

    /// The `path` of `network` in `lb status --json` ("-" before its first apply).
    pub fn path(&self, network: &str) -> String {
        self.network_status(network)["path"]
            .as_str()
            .unwrap_or("-")
            .to_owned()
    }

    /// The rows of `lb conntrack NETWORK --json`.
    pub fn conntrack(&self, network: &str) -> Vec<serde_json::Value> {
        let rows: serde_json::Value =
            serde_json::from_str(&self.ok(&["conntrack", network, "--json"]))
                .expect("lb conntrack --json");
        rows.as_array()
            .cloned()
            .unwrap_or_else(|| panic!("not a list: {rows}"))
    }

    /// Runs another `lb daemon` on `state_dir`, `socket` and `bpffs` (some of them this
    /// one's) with this one's flags, which is expected to refuse and exit ([`refusal`]).
    pub fn another(&self, state_dir: &Path, socket: &Path, bpffs: &Path) -> Run {
        let mut cmd = Command::new(&self.lb);
        cmd.arg("daemon")
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--socket")
            .arg(socket)
            .arg("--bpffs")
            .arg(bpffs)
            .args(&self.extra);
        refusal(cmd)
    }

    /// SIGKILL: no clean-up of any kind, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A new daemon process on the same state dir, socket and bpffs.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }

    /// SIGTERM, then SIGKILL after 5s.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for LbDaemon {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `program` run by `wrapper` (a command that runs its arguments, such as `setpriv …`), or
/// by itself when `wrapper` is empty.
pub fn wrapped<S: AsRef<std::ffi::OsStr>>(wrapper: &[S], program: &Path) -> Command {
    match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Runs `cmd` (an `lb daemon` expected to refuse and exit) with `LB_LOG=info`, and what it
/// said. One that still runs after 20s (it took the resources over) is killed and reported
/// as `code: None`.
pub fn refusal(mut cmd: Command) -> Run {
    let mut child = cmd
        .env("LB_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lb runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("waiting for lb").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.try_wait().expect("waiting for lb").is_none() {
        let _ = child.kill();
    }
    let mut run: Run = child.wait_with_output().expect("lb's output").into();
    if run.code.is_some_and(|_| Instant::now() >= deadline) {
        run.code = None;
    }
    run
}

/// One scrape of the daemon's metrics at `addr` (`--metrics ADDR`): the Prometheus text.
pub fn scrape(addr: &str) -> Result<String> {
    let (status, body) = http_get(addr, "/metrics")?;
    ensure!(status == 200, "metrics answered {status}: {body}");
    Ok(body)
}

/// `GET path` on `addr` over HTTP/1.1: the status code and the body.
pub fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut conn =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .with_context(|| format!("reading {path} from {addr}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no end of the head in {text:?}"))?;
    let status = (head.strip_prefix("HTTP/1.1 "))
        .and_then(|h| h.get(..3))
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP/1.1 answer: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Panics unless `promtool check metrics` (Debian `prometheus`, `cargo xtask setup`)
/// accepts `text`: the Prometheus text format and its lint (HELP on every series, `_total`
/// on counters only, units spelled out).
pub fn check_metrics(text: &str) {
    let out: Run = crate::tools::output_with_stdin(
        Command::new("promtool").args(["check", "metrics"]),
        text.as_bytes(),
    )
    .expect("promtool runs (cargo xtask setup installs the prometheus package)")
    .into();
    assert!(
        out.ok(),
        "promtool check metrics refused the exposition ({:?}):\n{}{}\nthe exposition:\n{text}",
        out.code,
        out.stdout,
        out.stderr
    );
}

/// `lb_datapath_packets_total` of `network`'s program `hook` for `reason` in a scrape (0 when
/// absent).
pub fn datapath(text: &str, network: &str, hook: &str, reason: &str) -> u64 {
    let series = format!(
        "lb_datapath_packets_total{{network=\"{network}\",hook=\"{hook}\",reason=\"{reason}\"}} "
    );
    (text.lines())
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A free TCP port on loopback for a daemon's `--metrics`.
pub fn free_metrics_addr() -> Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(format!("127.0.0.1:{port}"))
}

/// An `nft` first on the daemon's PATH that fails (`nft: injected failure`) while
/// [`FailingNft::fail`] is on and runs the real one otherwise, as the seed's tests do: how a
/// test makes the nftables dataplane's apply fail after a change was validated and saved.
/// Its directory is private to it and removed on drop.
pub struct FailingNft {
    dir: crate::tools::TempDir,
}

impl FailingNft {
    pub fn new() -> Result<FailingNft> {
        use std::os::unix::fs::PermissionsExt as _;
        let nft = FailingNft {
            dir: crate::tools::TempDir::new("fake-nft")?,
        };
        let real = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .context("nft is installed (cargo xtask setup)")?;
        let fake = nft.dir.join("nft");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\nif [ -e {} ]; then echo 'nft: injected failure' >&2; exit 1; fi\nexec {real} \"$@\"\n",
                nft.marker().display()
            ),
        )?;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
        Ok(nft)
    }

    fn marker(&self) -> PathBuf {
        self.dir.join("fail")
    }

    /// The daemon's `PATH`, with the fake first.
    pub fn path_env(&self) -> String {
        format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// `lb daemon` (binary `lb`) on the nftables dataplane with this `nft` first on its PATH.
    pub fn start_daemon(&self, lb: &Path, bpffs: &Path) -> Result<LbDaemon> {
        LbDaemon::start_env(
            lb,
            bpffs,
            &["--dataplane", "nftables"],
            &[("PATH", &self.path_env())],
        )
    }

    pub fn fail(&self, on: bool) -> Result<()> {
        if on {
            std::fs::write(self.marker(), "")?;
        } else {
            std::fs::remove_file(self.marker())?;
        }
        Ok(())
    }
}

/// Polls `what` every 100 ms until it holds or 20 s pass (the daemon tests' patience: with the
/// suite's tests running beside it on two cores, 10 s was once not enough for the third
/// endpoint of a fast path to be seen).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    observe(what, || if cond() { Ok(()) } else { Err(String::new()) });
}

/// [`eventually`] for a condition that says what it saw when it does not hold yet: the last
/// such observation is in the failure.
pub fn observe(what: &str, mut cond: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(20) {
        match cond() {
            Ok(()) => return,
            Err(seen) => last = seen,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("not within 20 s: {what}; last seen: {last}");
}
