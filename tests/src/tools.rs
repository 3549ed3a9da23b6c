//! Real traffic with the tools operators use — nginx, wrk, trafgen, iperf — and the kernel
//! counters that say what became of it, each run inside a test namespace.
//!
//! Every tool runs as `ip netns exec NS [taskset -c CPU] TOOL ...`; `ip netns exec` and
//! `taskset` both exec in place, so the child's pid is the tool's own. Each tool leads a process
//! group of its own, and a guard SIGKILLs that group (the tool and whatever it forked, nothing
//! else) and reaps it when dropped, on unwind too, or when a run outlives its time limit.
//! Configuration, logs, pid files and temp files go to a private temp dir removed with the
//! guard: nothing is written anywhere else, and nothing touches the root namespace.
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::netns::Netns;

/// Runs `cmd` with `input` on its standard input (then closed) and collects its output, as
/// a shell's `cmd <<< input` does. A command that exits before reading all of it is not an
/// error of this function: its exit status says what happened.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> Result<std::process::Output> {
    use std::io::Write as _;
    let mut child = (cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()))
    .spawn()
    .with_context(|| format!("running {cmd:?}"))?;
    let mut stdin = child.stdin.take().context("the child's stdin")?;
    if let Err(e) = stdin.write_all(input)
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        return Err(e).with_context(|| format!("writing to {cmd:?}"));
    }
    drop(stdin);
    child
        .wait_with_output()
        .with_context(|| format!("waiting for {cmd:?}"))
}

/// How long a server may take to accept connections after it was started: generous for a
/// loaded 2-CPU VM, short enough that a broken configuration fails the test quickly.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a wait polls (a process's exit, a port, a counter).
const POLL: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------------------------
// Processes and temp dirs

/// A tool process started by this module. Dropping it SIGKILLs its process group and reaps it.
pub(crate) struct Tool {
    what: String,
    child: Child,
    /// Once the leader is reaped its pid (the group id) may be reused, so the group is never
    /// signalled after that.
    reaped: bool,
}

impl Tool {
    /// Starts `cmd` (stdin closed) as the leader of a new process group, named `what` in errors.
    pub(crate) fn spawn(mut cmd: Command, what: &str) -> Result<Tool> {
        cmd.stdin(Stdio::null()).process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {what}: {cmd:?}"))?;
        Ok(Tool {
            what: what.to_owned(),
            child,
            reaped: false,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the tool has exited (it is then reaped), `None` while it runs.
    pub(crate) fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let status = self
            .child
            .try_wait()
            .with_context(|| format!("waiting for {}", self.what))?;
        self.reaped |= status.is_some();
        Ok(status)
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        let group = -(self.child.id() as libc::pid_t);
        // SAFETY: plain kill(2). The group leader is our child and not yet reaped, so its pid
        // still names this group: only the tool and what it forked get the signal.
        unsafe { libc::kill(group, libc::SIGKILL) };
        // Drop runs during unwinding too: a failure is reported, not raised.
        if let Err(e) = self.child.wait() {
            eprintln!("lb-tests: cannot reap {}: {e}", self.what);
        }
    }
}

/// `ip netns exec NS [taskset -c CPU] PROGRAM ARGS...`.
pub(crate) fn in_netns<S: AsRef<OsStr>>(
    ns: &Netns,
    cpu: Option<usize>,
    program: &str,
    args: impl IntoIterator<Item = S>,
) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name()]);
    if let Some(cpu) = cpu {
        cmd.args(["taskset", "-c", &cpu.to_string()]);
    }
    cmd.arg(program).args(args);
    cmd
}

/// A tcpdump capture in a namespace (`-t -nn -v -l`: no timestamps): what a packet looked like on the wire,
/// decoded by the tool operators read packets with. Killed on drop.
pub struct Tcpdump {
    tool: Tool,
    stdout: JoinHandle<String>,
}

impl Tcpdump {
    /// Starts capturing `count` packets matching `filter` (a pcap filter) on `iface` of `ns`,
    /// and returns once tcpdump says it is listening (packets sent after that are seen).
    pub fn start(ns: &Netns, iface: &str, filter: &str, count: usize) -> Result<Tcpdump> {
        let mut cmd = in_netns(
            ns,
            None,
            "tcpdump",
            [
                "-i",
                iface,
                "-t",
                "-nn",
                "-v",
                "-l",
                "-c",
                &count.to_string(),
                filter,
            ],
        );
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut tool = Tool::spawn(cmd, "tcpdump")?;
        let stdout = collect(tool.child.stdout.take());
        let stderr = tool.child.stderr.take().context("tcpdump's stderr")?;
        // tcpdump says "tcpdump: listening on IFACE, ..." once its socket is bound and
        // filtering; its stderr is read to the end on a thread of its own (so tcpdump never
        // blocks on it), line by line to here.
        let (lines, said) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match said.recv_timeout(left) {
                Ok(line) if line.contains("listening on ") => break,
                Ok(line) => seen.push(line),
                Err(_) => bail!(
                    "tcpdump on {iface} in {} not listening within {START_TIMEOUT:?}: {}",
                    ns.name(),
                    seen.join("\n")
                ),
            }
        }
        Ok(Tcpdump { tool, stdout })
    }

    /// What tcpdump printed once it has captured its count, or within `limit` (then it is
    /// killed and what it printed so far is returned: the caller judges).
    pub fn finish(mut self, limit: Duration) -> Result<String> {
        let deadline = Instant::now() + limit;
        while self.tool.exited()?.is_none() && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        drop(self.tool);
        Ok(self.stdout.join().unwrap_or_default())
    }
}

/// What a tool run to completion printed.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Reads a pipe to its end on a thread of its own, so that neither pipe of a tool can fill up
/// and stall it while the other is being read.
fn collect(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `cmd` to completion within `limit`. A run past `limit` is killed and is an error; so
/// is a non-zero exit. Either error carries everything the tool printed.
fn run_tool(mut cmd: Command, what: &str, limit: Duration) -> Result<Finished> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut tool = Tool::spawn(cmd, what)?;
    let stdout = collect(tool.child.stdout.take());
    let stderr = collect(tool.child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = tool.exited()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        thread::sleep(POLL);
    };
    // Killed here when it overran, so that the pipes reach their end.
    drop(tool);
    let (stdout, stderr) = (stdout.join(), stderr.join());
    let (stdout, stderr) = (stdout.unwrap_or_default(), stderr.unwrap_or_default());
    let Some(status) = status else {
        bail!("{what} still running after {limit:?}, killed; stdout: {stdout}\nstderr: {stderr}");
    };
    ensure!(
        status.success(),
        "{what} failed ({status}); stdout: {stdout}\nstderr: {stderr}"
    );
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// A private directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `<tmp>/lbt-tools-<pid>-<n>-<what>`, empty.
    pub fn new(what: &str) -> Result<TempDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lbt-tools-{}-{}-{what}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // A leftover of a dead run with the same pid would hold stale files.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            eprintln!("lb-tests: cannot remove {}: {e}", self.0.display());
        }
    }
}

/// The contents of `path` for an error message; what went wrong reading it otherwise.
fn read_for_error(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Ports

/// Whether a TCP connection from `ns` to `addr:port` (either family) is accepted (within
/// 200 ms).
pub fn tcp_accepts(ns: &Netns, addr: impl Into<IpAddr>, port: u16) -> Result<bool> {
    let peer = SocketAddr::new(addr.into(), port);
    Ok(ns
        .run(|| TcpStream::connect_timeout(&peer, Duration::from_millis(200)))?
        .is_ok())
}

/// Waits until a TCP connection from `ns` to `addr:port` (either family) is accepted; an
/// error after `timeout`.
pub fn wait_tcp_port(
    ns: &Netns,
    addr: impl Into<IpAddr>,
    port: u16,
    timeout: Duration,
) -> Result<()> {
    let peer = SocketAddr::new(addr.into(), port);
    let deadline = Instant::now() + timeout;
    while !tcp_accepts(ns, peer.ip(), port)? {
        ensure!(
            Instant::now() < deadline,
            "nothing accepts tcp {peer} in {} after {timeout:?}",
            ns.name()
        );
        thread::sleep(POLL);
    }
    Ok(())
}

/// Whether some socket in `ns` listens on TCP `port` (any address of either family), read
/// from the namespace's `/proc/net/tcp` and `tcp6` rather than by connecting: a server that
/// counts connections (iperf) sees no probe.
pub fn tcp_listening(ns: &Netns, port: u16) -> Result<bool> {
    let table = proc_net(ns, "tcp")? + &proc_net(ns, "tcp6")?;
    // `sl local_address rem_address st ...`: `0100007F:1F90 00000000:0000 0A`, 0A = LISTEN
    // (tcp6: the same with 32 hex digits of address). Each table's header line has no
    // state `0A`.
    Ok(table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let local_port = fields
            .next()
            .and_then(|local| local.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        let state = fields.nth(1);
        local_port == Some(port) && state == Some("0A")
    }))
}

/// Whether some TCP connection in `ns` whose remote end has port `remote_port` is established,
/// from the namespace's `/proc/net/tcp`: a server's side of a client's connection, until a RST
/// (or the server's own close) ends it.
pub fn tcp_established(ns: &Netns, remote_port: u16) -> Result<bool> {
    // IPv4's and IPv6's tables, whose lines have the same fields (a kernel without IPv6 has
    // no tcp6, and no IPv6 connection).
    let table = proc_net(ns, "tcp")? + &proc_net(ns, "tcp6").unwrap_or_default();
    // `sl local_address rem_address st ...`, 01 = ESTABLISHED.
    Ok(table.lines().skip(1).any(|line| {
        let mut fields = line.split_whitespace().skip(2);
        let remote = fields
            .next()
            .and_then(|remote| remote.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        remote == Some(remote_port) && fields.next() == Some("01")
    }))
}

/// Whether some UDP socket in `ns` is bound to `port` (any address), from the namespace's
/// `/proc/net/udp`.
pub fn udp_bound(ns: &Netns, port: u16) -> Result<bool> {
    let table = proc_net(ns, "udp")?;
    Ok(table.lines().skip(1).any(|line| {
        let local_port = (line.split_whitespace().nth(1))
            .and_then(|local| local.rsplit_once(':'))
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        local_port == Some(port)
    }))
}

/// `/proc/net/<file>` of `ns`. Read through `/proc/thread-self`: `/proc/net` is
/// `/proc/self/net`, the namespace of the process's main thread, not of the thread that
/// entered `ns`.
fn proc_net(ns: &Netns, file: &str) -> Result<String> {
    let path = Path::new("/proc/thread-self/net").join(file);
    ns.run(|| fs::read_to_string(&path))?
        .with_context(|| format!("reading /proc/net/{file} in {}", ns.name()))
}

// ---------------------------------------------------------------------------------------------
// nginx

/// An nginx (Debian `nginx-light`) in a namespace that answers every request on
/// `0.0.0.0:port` with 200 and the body `"{name} $remote_addr:$remote_port\n"`, the
/// [`crate::traffic::Reply`] line: which backend answered and which client address it saw.
///
/// Built for connection storms and long keep-alive runs (one process, `backlog=4096`,
/// `keepalive_requests` 1,000,000, no access log); `Connection: close` closes after each
/// answer. Its configuration, pid file, error log and temp paths live in a private temp dir;
/// dropping it kills nginx (by its pid) and removes that dir.
pub struct Nginx {
    name: String,
    port: u16,
    // Dropped before `dir`: nginx is dead before its prefix goes.
    process: Tool,
    dir: TempDir,
}

impl Nginx {
    /// Starts nginx as `name` on `port` in `ns` and waits until a TCP connect from inside `ns`
    /// is accepted. If nginx exits first, or never accepts within [`START_TIMEOUT`], the error
    /// carries its stderr and error log. `name` is one token of `[A-Za-z0-9_.-]` (it goes into
    /// the configuration and the reply line).
    pub fn start(ns: &Netns, name: &str, port: u16) -> Result<Nginx> {
        Nginx::start_ports(ns, name, &[port])
    }

    /// Like [`Nginx::start`], listening on every port of `ports` (one process, one listening
    /// socket each): a benchmark gives each run a port of its own, so that no run meets the
    /// TIME_WAIT sockets of another. [`Nginx::port`] is the first.
    pub fn start_ports(ns: &Netns, name: &str, ports: &[u16]) -> Result<Nginx> {
        Nginx::start_with(ns, name, ports, false)
    }

    /// Like [`Nginx::start`], listening on `[::]:port` too (a dual-stack backend).
    pub fn start_dual(ns: &Netns, name: &str, port: u16) -> Result<Nginx> {
        Nginx::start_with(ns, name, &[port], true)
    }

    /// [`Nginx::start_ports`] of a dual-stack backend: every port on `[::]` too.
    pub fn start_ports_dual(ns: &Netns, name: &str, ports: &[u16]) -> Result<Nginx> {
        Nginx::start_with(ns, name, ports, true)
    }

    fn start_with(ns: &Netns, name: &str, ports: &[u16], ipv6: bool) -> Result<Nginx> {
        let &[port, ..] = ports else {
            bail!("nginx {name}: no port to listen on");
        };
        ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
            "nginx name {name:?}: want one token of [A-Za-z0-9_.-]"
        );
        let dir = TempDir::new(&format!("nginx-{name}"))?;
        let conf = dir.join("nginx.conf");
        fs::write(&conf, nginx_conf(dir.path(), name, ports, ipv6))
            .with_context(|| format!("writing {}", conf.display()))?;
        let log = File::create(dir.join("stderr.log")).context("creating nginx's stderr.log")?;
        let mut cmd = in_netns(ns, None, "/usr/sbin/nginx", None::<&str>);
        // -e: the error log nginx opens before it has read the configuration (by default
        // /var/log/nginx/error.log); -p: the prefix relative paths resolve against.
        cmd.arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdout(log.try_clone()?)
            .stderr(log);
        let process = Tool::spawn(cmd, &format!("nginx {name} in {}", ns.name()))?;
        let mut nginx = Nginx {
            name: name.to_owned(),
            port,
            process,
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = nginx.process.exited()? {
                bail!(
                    "nginx {name} in {} exited ({status}); stderr: {}\nerror log: {}",
                    ns.name(),
                    read_for_error(&nginx.dir.join("stderr.log")),
                    read_for_error(&nginx.dir.join("error.log")),
                );
            }
            // nginx opens every listening socket before it accepts on any.
            if tcp_accepts(ns, Ipv4Addr::LOCALHOST, port)? {
                return Ok(nginx);
            }
            ensure!(
                Instant::now() < deadline,
                "nginx {name} in {} does not accept on port {port} after {START_TIMEOUT:?}; \
                 error log: {}",
                ns.name(),
                read_for_error(&nginx.dir.join("error.log")),
            );
            thread::sleep(POLL);
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// nginx's pid (one process: `master_process off`).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The private prefix dir (configuration, pid file, logs, temp paths).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The whole configuration of [`Nginx`]: every path nginx would write is under `dir`.
fn nginx_conf(dir: &Path, name: &str, ports: &[u16], ipv6: bool) -> String {
    let dir = dir.display();
    let listen: String = (ports.iter())
        .map(|port| {
            let v6 = if ipv6 {
                format!("        listen [::]:{port} ipv6only=on backlog=4096;\n")
            } else {
                String::new()
            };
            format!("        listen 0.0.0.0:{port} backlog=4096;\n{v6}")
        })
        .collect();
    format!(
        r#"# One process in the foreground, so the test's pid is nginx's and nothing outlives it.
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections 8192;
    multi_accept on;
}}

http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # A keep-alive run (wrk) keeps its connections for the whole run.
    keepalive_requests 1000000;
    keepalive_timeout 60s;

    server {{
{listen}        location / {{
            default_type text/plain;
            return 200 "{name} $remote_addr:$remote_port\n";
        }}
    }}
}}
"#
    )
}

// ---------------------------------------------------------------------------------------------
// wrk

/// How [`wrk`] loads a URL.
#[derive(Debug, Clone)]
pub struct WrkOptions {
    /// Whole seconds (wrk's `-d` takes no fractions).
    pub duration: Duration,
    /// Open connections in total (wrk's `-c`), at least `threads`.
    pub connections: u32,
    pub threads: u32,
    /// Sends `Connection: close`: one request per connection, a connection storm.
    pub close: bool,
    /// Pins wrk to this CPU (`taskset -c`).
    pub cpu: Option<usize>,
}

impl Default for WrkOptions {
    fn default() -> WrkOptions {
        WrkOptions {
            duration: Duration::from_secs(2),
            connections: 10,
            threads: 1,
            close: false,
            cpu: None,
        }
    }
}

/// What one wrk run reports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WrkResult {
    /// Completed requests (any status).
    pub requests: u64,
    /// The run's length as wrk prints it (two decimals, e.g. `2.10s`).
    pub secs: f64,
    pub connect_errors: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub timeouts: u64,
    /// Responses with a status outside 2xx and 3xx.
    pub non_2xx: u64,
}

impl WrkResult {
    /// Every failed exchange: socket errors, timeouts and non-2xx/3xx answers.
    pub fn errors(&self) -> u64 {
        self.connect_errors + self.read_errors + self.write_errors + self.timeouts + self.non_2xx
    }

    pub fn requests_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.requests as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Parses wrk 4.1's text report. The `Socket errors:` and `Non-2xx or 3xx responses:`
    /// lines appear only when their counts are not all zero.
    pub fn parse(report: &str) -> Result<WrkResult> {
        let mut result = WrkResult::default();
        let mut seen_requests = false;
        for line in report.lines().map(str::trim) {
            if let Some((requests, rest)) = line.split_once(" requests in ") {
                // `198027 requests in 2.10s, 31.54MB read`
                result.requests = requests
                    .parse()
                    .with_context(|| format!("wrk requests in {line:?}"))?;
                let time = rest.split(',').next().unwrap_or_default();
                result.secs =
                    wrk_secs(time).with_context(|| format!("wrk run time in {line:?}"))?;
                seen_requests = true;
            } else if let Some(errors) = line.strip_prefix("Socket errors:") {
                // `Socket errors: connect 0, read 43, write 16489, timeout 0`
                for part in errors.split(',') {
                    let (kind, n) = part
                        .trim()
                        .split_once(' ')
                        .with_context(|| format!("wrk socket errors {line:?}"))?;
                    let n: u64 = n
                        .parse()
                        .with_context(|| format!("wrk socket errors {line:?}"))?;
                    match kind {
                        "connect" => result.connect_errors = n,
                        "read" => result.read_errors = n,
                        "write" => result.write_errors = n,
                        "timeout" => result.timeouts = n,
                        _ => bail!("wrk socket error kind {kind:?} in {line:?}"),
                    }
                }
            } else if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
                result.non_2xx = n
                    .trim()
                    .parse()
                    .with_context(|| format!("wrk non-2xx count in {line:?}"))?;
            }
        }
        ensure!(
            seen_requests,
            "no `N requests in` line in wrk's report: {report}"
        );
        Ok(result)
    }
}

/// wrk's run time (`format_time_us`): a number with one of `us`, `ms`, `s`, `m`, `h`.
fn wrk_secs(time: &str) -> Result<f64> {
    let time = time.trim();
    let split = time
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .with_context(|| format!("no unit in {time:?}"))?;
    let (number, unit) = time.split_at(split);
    let number: f64 = number.parse().with_context(|| format!("{time:?}"))?;
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => bail!("unknown time unit in {time:?}"),
    };
    Ok(number * scale)
}

/// Runs wrk (Debian `wrk`, 4.1) from `ns` against `url` and returns its report. wrk itself
/// fails (an error here) when its first test connection is refused; refusals later in the run
/// are counted as errors (as write errors, by wrk 4.1).
pub fn wrk(ns: &Netns, url: &str, opts: &WrkOptions) -> Result<WrkResult> {
    wrk_with(ns, url, opts, None)
}

/// Like [`wrk`], with a Lua `script` (wrk's `--script`), e.g. one whose `setup(thread)` sets
/// `thread.addr` to send each thread's connections to another server.
pub fn wrk_script(ns: &Netns, url: &str, opts: &WrkOptions, script: &str) -> Result<WrkResult> {
    let dir = TempDir::new("wrk")?;
    let path = dir.join("script.lua");
    fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
    wrk_with(ns, url, opts, Some(&path))
}

fn wrk_with(ns: &Netns, url: &str, opts: &WrkOptions, script: Option<&Path>) -> Result<WrkResult> {
    let secs = opts.duration.as_secs();
    ensure!(
        secs > 0 && opts.duration.subsec_nanos() == 0,
        "wrk duration {:?}: whole seconds only",
        opts.duration
    );
    ensure!(
        opts.threads > 0 && opts.connections >= opts.threads,
        "wrk: {} connections over {} threads",
        opts.connections,
        opts.threads
    );
    let mut args = vec![
        format!("--threads={}", opts.threads),
        format!("--connections={}", opts.connections),
        format!("--duration={secs}s"),
        "--timeout=5s".to_owned(),
    ];
    if opts.close {
        args.extend(["--header".to_owned(), "Connection: close".to_owned()]);
    }
    if let Some(script) = script {
        args.push(format!("--script={}", script.display()));
    }
    args.push(url.to_owned());
    let cmd = in_netns(ns, opts.cpu, "wrk", &args);
    // wrk stops at `duration`; what remains is its last timeouts and the report.
    let limit = opts.duration + Duration::from_secs(15);
    let run = run_tool(cmd, &format!("wrk {url} from {}", ns.name()), limit)?;
    WrkResult::parse(&run.stdout)
}

// ---------------------------------------------------------------------------------------------
// Links

/// An Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for Mac {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Mac> {
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut mac {
            let part = parts.next().with_context(|| format!("short MAC {s:?}"))?;
            ensure!(part.len() == 2, "bad MAC {s:?}");
            *byte = u8::from_str_radix(part, 16).with_context(|| format!("bad MAC {s:?}"))?;
        }
        ensure!(parts.next().is_none(), "long MAC {s:?}");
        Ok(Mac(mac))
    }
}

/// `ip -j [-s] link show dev IFNAME` in `ns`: the one link object.
fn link_json(ns: &Netns, ifname: &str, stats: bool) -> Result<serde_json::Value> {
    let mut args = vec!["-j"];
    if stats {
        args.push("-s");
    }
    args.extend(["link", "show", "dev", ifname]);
    let out = ns.ip(&args)?;
    let mut links: Vec<serde_json::Value> = serde_json::from_str(&out)
        .with_context(|| format!("`ip {}` in {}: {out}", args.join(" "), ns.name()))?;
    ensure!(
        links.len() == 1,
        "`ip {}` in {}: {out}",
        args.join(" "),
        ns.name()
    );
    Ok(links.remove(0))
}

/// The Ethernet address of `ifname` in `ns` (`ip -j link show`).
pub fn link_mac(ns: &Netns, ifname: &str) -> Result<Mac> {
    let link = link_json(ns, ifname, false)?;
    link["address"]
        .as_str()
        .with_context(|| format!("{ifname} in {} has no address: {link}", ns.name()))?
        .parse()
}

/// A link's packet counters (`ip -j -s link show`, the kernel's 64-bit stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_errors: u64,
}

impl LinkStats {
    /// What each counter grew by since `earlier`.
    pub fn since(&self, earlier: &LinkStats) -> LinkStats {
        LinkStats {
            rx_packets: self.rx_packets.saturating_sub(earlier.rx_packets),
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            rx_dropped: self.rx_dropped.saturating_sub(earlier.rx_dropped),
            rx_errors: self.rx_errors.saturating_sub(earlier.rx_errors),
            tx_packets: self.tx_packets.saturating_sub(earlier.tx_packets),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            tx_dropped: self.tx_dropped.saturating_sub(earlier.tx_dropped),
            tx_errors: self.tx_errors.saturating_sub(earlier.tx_errors),
        }
    }
}

/// The counters of `ifname` in `ns`.
pub fn link_stats(ns: &Netns, ifname: &str) -> Result<LinkStats> {
    let link = link_json(ns, ifname, true)?;
    let stats = &link["stats64"];
    let get = |dir: &str, key: &str| {
        stats[dir][key]
            .as_u64()
            .with_context(|| format!("no stats64.{dir}.{key} for {ifname} in {}", ns.name()))
    };
    Ok(LinkStats {
        rx_packets: get("rx", "packets")?,
        rx_bytes: get("rx", "bytes")?,
        rx_dropped: get("rx", "dropped")?,
        rx_errors: get("rx", "errors")?,
        tx_packets: get("tx", "packets")?,
        tx_bytes: get("tx", "bytes")?,
        tx_dropped: get("tx", "dropped")?,
        tx_errors: get("tx", "errors")?,
    })
}

// ---------------------------------------------------------------------------------------------
// Kernel counters

/// `/proc/net/snmp` and `/proc/net/netstat` hold pairs of lines, `Sect: Name1 Name2 ...` and
/// `Sect: v1 v2 ...`: every value keyed by (section, name). Values are signed (`Tcp MaxConn`
/// is -1).
fn proc_net_table(text: &str) -> Result<HashMap<(String, String), i64>> {
    let mut table = HashMap::new();
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines
            .next()
            .with_context(|| format!("no values after {names:?}"))?;
        let (section, names) = names
            .split_once(": ")
            .with_context(|| format!("not a counter header: {names:?}"))?;
        let values = values
            .strip_prefix(section)
            .and_then(|v| v.strip_prefix(": "))
            .with_context(|| format!("{section} values expected, found {values:?}"))?;
        let (names, values): (Vec<_>, Vec<_>) = (
            names.split_whitespace().collect(),
            values.split_whitespace().collect(),
        );
        ensure!(
            names.len() == values.len(),
            "{section}: {} names, {} values",
            names.len(),
            values.len()
        );
        for (name, value) in names.into_iter().zip(values) {
            let value = value
                .parse()
                .with_context(|| format!("{section} {name} = {value:?}"))?;
            table.insert((section.to_owned(), name.to_owned()), value);
        }
    }
    Ok(table)
}

fn counter(table: &HashMap<(String, String), i64>, section: &str, name: &str) -> Result<u64> {
    let value = table
        .get(&(section.to_owned(), name.to_owned()))
        .with_context(|| format!("no counter {section} {name}"))?;
    u64::try_from(*value).with_context(|| format!("{section} {name} = {value}"))
}

/// A struct of named counters read from one `/proc/net` file, with `parse` and `since`.
macro_rules! counters {
    (
        $(#[$doc:meta])* $name:ident from $file:literal {
            $($(#[$field_doc:meta])* $field:ident = $section:literal $key:literal,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$field_doc])* pub $field: u64,)*
        }

        impl $name {
            /// Parses the text of the file.
            pub fn parse(text: &str) -> Result<$name> {
                let table = proc_net_table(text)?;
                Ok($name {
                    $($field: counter(&table, $section, $key)?,)*
                })
            }

            /// What each counter grew by since `earlier`.
            pub fn since(&self, earlier: &$name) -> $name {
                $name {
                    $($field: self.$field.saturating_sub(earlier.$field),)*
                }
            }

            /// Reads the counters of `ns`.
            pub fn read(ns: &Netns) -> Result<$name> {
                let text = proc_net(ns, $file)?;
                $name::parse(&text).with_context(|| format!("/proc/net/{} in {}", $file, ns.name()))
            }
        }
    };
}

counters! {
    /// The counters of `/proc/net/snmp` (per namespace) a traffic test asks about: where
    /// datagrams, segments and ICMP errors went.
    Snmp from "snmp" {
        /// Forwarded by this namespace (the node, when it routes).
        ip_forw_datagrams = "Ip" "ForwDatagrams",
        ip_in_hdr_errors = "Ip" "InHdrErrors",
        ip_in_discards = "Ip" "InDiscards",
        icmp_in_dest_unreachs = "Icmp" "InDestUnreachs",
        /// Port (and other) unreachables sent, e.g. for a datagram to a port nobody binds.
        icmp_out_dest_unreachs = "Icmp" "OutDestUnreachs",
        /// Connections this namespace opened (one per connect, so one per request under
        /// `Connection: close`).
        tcp_active_opens = "Tcp" "ActiveOpens",
        tcp_passive_opens = "Tcp" "PassiveOpens",
        tcp_attempt_fails = "Tcp" "AttemptFails",
        tcp_estab_resets = "Tcp" "EstabResets",
        tcp_retrans_segs = "Tcp" "RetransSegs",
        tcp_in_errs = "Tcp" "InErrs",
        tcp_out_rsts = "Tcp" "OutRsts",
        tcp_in_csum_errors = "Tcp" "InCsumErrors",
        /// Datagrams delivered to a socket; counted when the application reads them.
        udp_in_datagrams = "Udp" "InDatagrams",
        /// Datagrams for a port nobody binds.
        udp_no_ports = "Udp" "NoPorts",
        udp_in_errors = "Udp" "InErrors",
        udp_out_datagrams = "Udp" "OutDatagrams",
        /// Datagrams dropped because the receiving socket's buffer was full.
        udp_rcvbuf_errors = "Udp" "RcvbufErrors",
        /// Datagrams dropped for a bad UDP checksum.
        udp_in_csum_errors = "Udp" "InCsumErrors",
    }
}

counters! {
    /// The `TcpExt` counters of `/proc/net/netstat` (per namespace) that show a lossy or
    /// overloaded TCP path.
    Netstat from "netstat" {
        /// SYNs sent again: a first SYN (or its SYN-ACK) was lost.
        tcp_syn_retrans = "TcpExt" "TCPSynRetrans",
        tcp_timeouts = "TcpExt" "TCPTimeouts",
        /// Connections dropped because a listener's accept queue was full.
        listen_overflows = "TcpExt" "ListenOverflows",
        listen_drops = "TcpExt" "ListenDrops",
        tcp_abort_on_data = "TcpExt" "TCPAbortOnData",
        /// SYNs a socket in TIME_WAIT refused for an older TCP timestamp (answering with the
        /// old connection's ACK): another client connection sent onto a 4-tuple it closed.
        paws_timewait = "TcpExt" "PAWSTimewait",
    }
}

/// The `/proc/net/snmp` counters of `ns`.
pub fn snmp(ns: &Netns) -> Result<Snmp> {
    Snmp::read(ns)
}

/// The `/proc/net/netstat` `TcpExt` counters of `ns`.
pub fn netstat(ns: &Netns) -> Result<Netstat> {
    Netstat::read(ns)
}

// ---------------------------------------------------------------------------------------------
// trafgen

/// The UDP source ports of a [`UdpSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SrcPorts {
    /// Every packet from this port: one flow.
    Fixed(u16),
    /// `count` flows, ports `first .. first + count`, taken in turn (trafgen's `dinc` on the
    /// port's low byte, so the range stays within one 256-port block).
    Flows { first: u16, count: u16 },
    /// `count` flows, ports `first .. first + count` (up to all 65,535), taken in turn:
    /// written with trafgen's header functions (`udp(sp=dinc(..))`), whose 16-bit counter
    /// and checksums trafgen computes for every packet.
    Range { first: u16, count: u16 },
}

/// The UDP packets [`trafgen_udp`] sends: one Ethernet/IPv4/UDP or Ethernet/IPv6/UDP frame
/// (the family of the addresses, which must agree), repeated.
#[derive(Debug, Clone)]
pub struct UdpSpec {
    /// The interface trafgen sends on, in the namespace it runs in.
    pub ifname: String,
    pub src_mac: Mac,
    /// The next hop's address (the node's interface, for a routed path).
    pub dst_mac: Mac,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub src_ports: SrcPorts,
    pub dst_port: u16,
    /// UDP payload bytes; the default 18 makes 60-byte IPv4 frames, 64 on a wire with its
    /// FCS (IPv6's header is 20 bytes longer: 80, and 84 with the FCS).
    pub payload_len: usize,
    pub count: u64,
    /// The CPU trafgen sends from. trafgen pins its senders itself (taskset would be undone),
    /// so this schedules the packet with the configuration's `cpu(N):`; without it, one sender
    /// runs pinned to CPU 0.
    pub cpu: Option<usize>,
}

/// UDP payload bytes for a minimum-size (64-byte with FCS) Ethernet frame.
pub const MIN_UDP_PAYLOAD: usize = 18;

const ETH_HLEN: usize = 14;
const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const UDP_HLEN: usize = 8;
/// The ring's default frame slot holds 2048 bytes, and the namespaces' links have MTU 1500.
const MAX_UDP_PAYLOAD: usize = 1500 - IPV4_HLEN - UDP_HLEN;
const MAX_UDP6_PAYLOAD: usize = 1500 - IPV6_HLEN - UDP_HLEN;

/// The Ethernet frame, without its FCS, of a UDP datagram of `payload_len` bytes over IPv4
/// (`ipv6` false) or IPv6: what a [`UdpSpec`] of that family sends.
pub fn udp_frame_len(ipv6: bool, payload_len: usize) -> usize {
    let ip = if ipv6 { IPV6_HLEN } else { IPV4_HLEN };
    ETH_HLEN + ip + UDP_HLEN + payload_len
}

impl UdpSpec {
    /// `count` packets with [`MIN_UDP_PAYLOAD`] bytes of payload (minimum-size frames over
    /// IPv4) from `src_ip:src_port` to `dst_ip:dst_port`, sent on `ifname` from `src_mac` to
    /// `dst_mac`, on CPU 0.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ifname: &str,
        src_mac: Mac,
        dst_mac: Mac,
        src_ip: impl Into<IpAddr>,
        src_port: u16,
        dst_ip: impl Into<IpAddr>,
        dst_port: u16,
        count: u64,
    ) -> UdpSpec {
        UdpSpec {
            ifname: ifname.to_owned(),
            src_mac,
            dst_mac,
            src_ip: src_ip.into(),
            dst_ip: dst_ip.into(),
            src_ports: SrcPorts::Fixed(src_port),
            dst_port,
            payload_len: MIN_UDP_PAYLOAD,
            count,
            cpu: None,
        }
    }

    /// The trafgen configuration: one IPv4 frame in trafgen's byte language, with the IPv4
    /// header checksum (`csumip`) and the UDP checksum over the pseudo-header (`csumudp`)
    /// computed by trafgen — again for every packet when a `dinc` port changes it. An IPv6
    /// frame, and an IPv4 one of a 16-bit port range, are written in trafgen's header
    /// functions ([`UdpSpec::header_config`]).
    pub fn config(&self) -> Result<String> {
        let (src_ip, dst_ip) = match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (s, d),
            (IpAddr::V6(_), IpAddr::V6(_)) => return self.config6(),
            (s, d) => bail!("trafgen: {s} and {d} are not of one family"),
        };
        ensure!(
            self.payload_len <= MAX_UDP_PAYLOAD,
            "UDP payload {} > {MAX_UDP_PAYLOAD} does not fit a 1500-byte MTU",
            self.payload_len
        );
        let bytes = |b: &[u8], fmt: fn(&u8) -> String| b.iter().map(fmt).collect::<Vec<_>>();
        let hex = |b: &[u8]| bytes(b, |x| format!("0x{x:02x}")).join(", ");
        let dec = |b: &[u8]| bytes(b, |x| x.to_string()).join(", ");
        let cpu = self.cpu.map(|c| format!("cpu({c}): ")).unwrap_or_default();
        let src_port = match self.src_ports {
            SrcPorts::Range { first, count } => {
                ensure!(
                    count > 0 && u32::from(first) + u32::from(count) <= 0x1_0000,
                    "{count} flows from port {first} run past port 65535"
                );
                return Ok(self.header_config(&cpu, first, first + (count - 1)));
            }
            SrcPorts::Fixed(port) => format!("c16({port})"),
            SrcPorts::Flows { first, count } => {
                let low = first & 0xff;
                ensure!(
                    count > 0 && u32::from(low) + u32::from(count) <= 0x100,
                    "{count} flows from port {first}: trafgen's dinc counts one byte, so the \
                     ports must lie within one 256-port block"
                );
                format!("c8({}), dinc({low}, {}, 1)", first >> 8, low + count - 1)
            }
        };
        let ip_len = IPV4_HLEN + UDP_HLEN + self.payload_len;
        let udp_len = UDP_HLEN + self.payload_len;
        let ip_off = ETH_HLEN;
        let udp_off = ETH_HLEN + IPV4_HLEN;
        let payload = if self.payload_len > 0 {
            format!("fill(0x61, {}),", self.payload_len)
        } else {
            String::new()
        };
        Ok(format!(
            "{cpu}{{
  {dst_mac},
  {src_mac},
  c16(0x0800),
  0x45, 0x00, c16({ip_len}), c16(0), c16(0x4000), 64, 17, csumip({ip_off}, {ip_end}),
  {src_ip},
  {dst_ip},
  {src_port}, c16({dst_port}), c16({udp_len}), csumudp({ip_off}, {udp_off}),
  {payload}
}}
",
            dst_mac = hex(&self.dst_mac.0),
            src_mac = hex(&self.src_mac.0),
            ip_end = udp_off - 1,
            src_ip = dec(&src_ip.octets()),
            dst_ip = dec(&dst_ip.octets()),
            dst_port = self.dst_port,
        ))
    }
}

impl UdpSpec {
    /// The IPv6 frame, in trafgen's header functions: every source port form as a `dinc`
    /// of the port (a fixed port is a range of one), and the UDP checksum over IPv6's
    /// pseudo-header computed by trafgen for every packet (UDP over IPv6 must carry one).
    fn config6(&self) -> Result<String> {
        ensure!(
            self.payload_len <= MAX_UDP6_PAYLOAD,
            "UDP payload {} > {MAX_UDP6_PAYLOAD} does not fit a 1500-byte MTU over IPv6",
            self.payload_len
        );
        let (first, count) = match self.src_ports {
            SrcPorts::Fixed(port) => (port, 1),
            SrcPorts::Flows { first, count } | SrcPorts::Range { first, count } => (first, count),
        };
        ensure!(
            count > 0 && u32::from(first) + u32::from(count) <= 0x1_0000,
            "{count} flows from port {first} run past port 65535"
        );
        let cpu = self.cpu.map(|c| format!("cpu({c}): ")).unwrap_or_default();
        Ok(self.header_config(&cpu, first, first + (count - 1)))
    }

    /// The same frame in trafgen's header functions, source port counting from `first` to
    /// `last` (a fixed port when they are equal); trafgen fills in lengths and checksums
    /// (IPv4's `df`: the byte form's flags 0x4000; IPv6's hop limit as IPv4's TTL).
    fn header_config(&self, cpu: &str, first: u16, last: u16) -> String {
        let payload = if self.payload_len > 0 {
            format!("  fill(0x61, {}),\n", self.payload_len)
        } else {
            String::new()
        };
        let (ethertype, ip) = match self.dst_ip {
            IpAddr::V4(_) => ("0x0800", "ipv4(id=0, ttl=64, df"),
            IpAddr::V6(_) => ("0x86dd", "ipv6(hl=64"),
        };
        let sp = if first == last {
            first.to_string()
        } else {
            format!("dinc({first}, {last})")
        };
        format!(
            "{cpu}{{
  eth(da={}, sa={}, type={ethertype}),
  {ip}, sa={}, da={}),
  udp(sp={sp}, dp={}),
{payload}}}
",
            self.dst_mac, self.src_mac, self.src_ip, self.dst_ip, self.dst_port
        )
    }
}

/// What [`trafgen_udp`] sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafgenRun {
    pub sent: u64,
    /// How long the sender on the spec's CPU took, as trafgen timed it (its
    /// `S sec, U usec on CPUn (N packets)` line): the sending window, without trafgen's own
    /// start and set-up. `None` without a spec CPU.
    pub window: Option<Duration>,
}

/// Sends `spec.count` UDP packets from `ns` with netsniff-ng's trafgen through its default
/// PF_PACKET TX ring (never `--gap`/`--rate`, which switch trafgen to sendto()): the kernel
/// then builds skbs whose payload lies in page fragments of the ring, as no kernel socket
/// does. Frames go straight to the device (trafgen bypasses the qdisc layer, so no tc egress
/// hook of the sending namespace sees them). trafgen is told not to retune socket memory
/// (`--no-sock-mem`) nor IRQ affinity (`--notouch-irq`): it would write /proc/sys and
/// /proc/irq otherwise. Returns when trafgen has sent them all, having checked that it says so.
pub fn trafgen_udp(ns: &Netns, spec: &UdpSpec) -> Result<TrafgenRun> {
    ensure!(spec.count > 0, "trafgen: count 0 means forever");
    let processes = match spec.cpu {
        None => 1,
        Some(cpu) => {
            let cpus = thread::available_parallelism().map_or(1, |n| n.get());
            ensure!(cpu < cpus, "trafgen: no CPU {cpu} (of {cpus})");
            // Senders 0..cpu are forked, find no packet for their CPU and end at once.
            cpu + 1
        }
    };
    let dir = TempDir::new("trafgen")?;
    let conf = dir.join("udp.cfg");
    fs::write(&conf, spec.config()?).with_context(|| format!("writing {}", conf.display()))?;
    let mut cmd = in_netns(ns, None, "trafgen", ["--dev", &spec.ifname]);
    cmd.arg("--conf").arg(&conf).args([
        "--num",
        &spec.count.to_string(),
        "--cpus",
        &processes.to_string(),
        // The short forms of these two are listed in `--help` but refused by trafgen 0.6.8.
        "--no-sock-mem",
        "--notouch-irq",
    ]);
    // A hung sender, not a slow one: this VM's sends run at well over 100k packets/s.
    let limit = Duration::from_secs(10) + Duration::from_millis(spec.count / 10);
    let run = run_tool(cmd, &format!("trafgen in {}", ns.name()), limit)?;
    let sent = trafgen_sent(&run.stdout).with_context(|| {
        format!(
            "trafgen ({}): stdout: {}\nstderr: {}",
            run.status, run.stdout, run.stderr
        )
    })?;
    ensure!(
        sent == spec.count,
        "trafgen sent {sent} packets, not {}: {}",
        spec.count,
        run.stdout
    );
    // Its per-CPU summary, `0 sec, 8692 usec on CPU1 (3000 packets)`, shows where they went.
    let window = match spec.cpu {
        None => None,
        Some(cpu) => Some(
            trafgen_window(&run.stdout, cpu, sent)
                .with_context(|| format!("trafgen did not send from CPU {cpu}: {}", run.stdout))?,
        ),
    };
    Ok(TrafgenRun { sent, window })
}

/// The time trafgen's sender on `cpu` took to send `sent` packets, from its summary line
/// `           0 sec, 581524 usec on CPU1 (200000 packets)`.
fn trafgen_window(stdout: &str, cpu: usize, sent: u64) -> Result<Duration> {
    let suffix = format!(" usec on CPU{cpu} ({sent} packets)");
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.ends_with(&suffix))
        .with_context(|| format!("no line ending in {suffix:?}"))?;
    let (secs, usecs) = line
        .trim_end_matches(&suffix)
        .split_once(" sec, ")
        .with_context(|| format!("no `sec, ` in {line:?}"))?;
    let (secs, usecs): (u64, u64) = (
        secs.trim().parse().with_context(|| format!("{line:?}"))?,
        usecs.trim().parse().with_context(|| format!("{line:?}"))?,
    );
    Ok(Duration::from_secs(secs) + Duration::from_micros(usecs))
}

/// trafgen's `      3000 packets outgoing` line.
fn trafgen_sent(stdout: &str) -> Result<u64> {
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.ends_with(" packets outgoing"))
        .context("no `packets outgoing` line")?;
    let n = line.split_whitespace().next().unwrap_or_default();
    n.parse()
        .with_context(|| format!("packets outgoing in {line:?}"))
}

// ---------------------------------------------------------------------------------------------
// A UDP sink

/// What a [`UdpSink`] has received: datagrams in total and per source address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    pub datagrams: u64,
    pub sources: BTreeMap<SocketAddrV4, u64>,
}

/// A UDP socket bound in a namespace that reads and counts every datagram, on a thread of its
/// own, with a receive buffer large enough for a burst of a few ten thousand small datagrams
/// (the kernel counts `Udp InDatagrams` only when they are read, and drops what overflows the
/// buffer as `RcvbufErrors`). Dropping it stops the thread and closes the socket.
pub struct UdpSink {
    sock: Arc<UdpSocket>,
    shared: Arc<SinkShared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct SinkShared {
    stopping: AtomicBool,
    received: Mutex<Received>,
}

/// SO_RCVBUFFORCE of a [`UdpSink`]: above `net.core.rmem_max`, which only root may exceed.
const SINK_RCVBUF: libc::c_int = 32 << 20;

impl UdpSink {
    /// Binds `0.0.0.0:port` in `ns` and starts counting.
    pub fn bind(ns: &Netns, port: u16) -> Result<UdpSink> {
        let sock = ns
            .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))?
            .with_context(|| format!("udp sink: bind port {port} in {}", ns.name()))?;
        let size = SINK_RCVBUF;
        // SAFETY: setsockopt on a socket we own, with a c_int value of the right size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error()).context("udp sink: SO_RCVBUFFORCE");
        }
        let sock = Arc::new(sock);
        let shared = Arc::new(SinkShared::default());
        let thread = {
            let (sock, shared) = (sock.clone(), shared.clone());
            thread::Builder::new()
                .name(format!("udp-sink-{port}"))
                .spawn(move || sink_loop(&sock, &shared))
                .context("udp sink: spawn its thread")?
        };
        Ok(UdpSink {
            sock,
            shared,
            thread: Some(thread),
        })
    }

    /// Everything received so far.
    pub fn received(&self) -> Received {
        self.shared.received.lock().unwrap().clone()
    }

    /// Waits until at least `datagrams` have arrived, or `timeout` has passed, and returns
    /// what has arrived: the caller decides whether fewer is a failure.
    pub fn wait_for(&self, datagrams: u64, timeout: Duration) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.received();
            if received.datagrams >= datagrams || Instant::now() >= deadline {
                return received;
            }
            thread::sleep(POLL);
        }
    }
}

fn sink_loop(sock: &UdpSocket, shared: &SinkShared) {
    let mut buf = [0u8; 2048];
    while !shared.stopping.load(Ordering::SeqCst) {
        match sock.recv_from(&mut buf) {
            Ok((_, SocketAddr::V4(from))) if !shared.stopping.load(Ordering::SeqCst) => {
                let mut received = shared.received.lock().unwrap();
                received.datagrams += 1;
                *received.sources.entry(from).or_default() += 1;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if !shared.stopping.load(Ordering::SeqCst) {
                    eprintln!("lb-tests: udp sink: {e}");
                }
                return;
            }
        }
    }
}

impl Drop for UdpSink {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Linux wakes a thread blocked in recvfrom(2) on an unconnected UDP socket when it is
        // shut down (recvfrom returns 0), although shutdown itself reports ENOTCONN.
        // SAFETY: the fd stays open while `self` holds the socket.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// iperf

/// An iperf 2 (Debian `iperf`) TCP server in a namespace, listening on `port`; killed (by its
/// pid) on drop. Its output goes to a private temp dir, quoted if it fails to start.
pub struct IperfServer {
    port: u16,
    // Dropped before `dir`.
    process: Tool,
    dir: TempDir,
}

impl IperfServer {
    /// Starts `iperf -s -p PORT` in `ns` and waits until it listens (read from the namespace's
    /// socket table, so the wait is no connection iperf would count).
    pub fn start(ns: &Netns, port: u16) -> Result<IperfServer> {
        IperfServer::start_with(ns, port, false)
    }

    /// Like [`IperfServer::start`], serving IPv6 (`iperf -s -V`), for [`iperf_client`] to
    /// an IPv6 address: iperf 2 serves one family per server, so a dual-stack backend runs
    /// one of each, on ports of their own.
    pub fn start_v6(ns: &Netns, port: u16) -> Result<IperfServer> {
        IperfServer::start_with(ns, port, true)
    }

    fn start_with(ns: &Netns, port: u16, ipv6: bool) -> Result<IperfServer> {
        let dir = TempDir::new("iperf")?;
        let log = File::create(dir.join("iperf.log")).context("creating iperf.log")?;
        let port_arg = port.to_string();
        let mut args = vec!["-s", "-p", &port_arg];
        if ipv6 {
            args.push("-V");
        }
        let mut cmd = in_netns(ns, None, "iperf", args);
        cmd.stdout(log.try_clone()?).stderr(log);
        let process = Tool::spawn(cmd, &format!("iperf server in {}", ns.name()))?;
        let mut server = IperfServer { port, process, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = server.process.exited()? {
                bail!(
                    "iperf server in {} exited ({status}): {}",
                    ns.name(),
                    read_for_error(&server.dir.join("iperf.log"))
                );
            }
            if tcp_listening(ns, port)? {
                return Ok(server);
            }
            ensure!(
                Instant::now() < deadline,
                "iperf server in {} does not listen on {port} after {START_TIMEOUT:?}: {}",
                ns.name(),
                read_for_error(&server.dir.join("iperf.log"))
            );
            thread::sleep(POLL);
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// Runs an iperf 2 TCP client from `ns` to `addr:port` for `secs` seconds (pinned to `cpu`
/// with taskset if given) and returns the throughput it reports, in bits per second. An
/// IPv6 `addr` is given with iperf 2's `-V`.
pub fn iperf_client(
    ns: &Netns,
    addr: impl Into<IpAddr>,
    port: u16,
    secs: u32,
    cpu: Option<usize>,
) -> Result<f64> {
    ensure!(secs > 0, "iperf: 0 s would mean its default");
    let peer = SocketAddr::new(addr.into(), port);
    let mut args = vec![
        "-c".to_owned(),
        peer.ip().to_string(),
        "-p".to_owned(),
        port.to_string(),
        "-t".to_owned(),
        secs.to_string(),
        "-y".to_owned(),
        "C".to_owned(),
    ];
    if peer.is_ipv6() {
        args.push("-V".to_owned());
    }
    let cmd = in_netns(ns, cpu, "iperf", &args);
    let limit = Duration::from_secs(u64::from(secs) + 15);
    let run = run_tool(cmd, &format!("iperf to {peer} from {}", ns.name()), limit)?;
    // iperf 2 exits 0 even when it cannot connect; then there is no report, only stderr.
    iperf_bits_per_sec(&run.stdout)
        .with_context(|| format!("iperf stdout: {}\nstderr: {}", run.stdout, run.stderr))
}

/// The throughput in iperf 2's `-y C` report: one CSV line per stream,
/// `time,src,sport,dst,dport,id,interval,bytes,bits_per_second`. A line with id -1 is the sum
/// over parallel streams and is the answer when present; otherwise the streams are added up.
pub fn iperf_bits_per_sec(csv: &str) -> Result<f64> {
    let mut sum = None;
    let mut streams = Vec::new();
    for line in csv.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        ensure!(fields.len() >= 9, "not an iperf CSV report line: {line:?}");
        let bps: f64 = fields[8]
            .parse()
            .with_context(|| format!("bits per second in {line:?}"))?;
        if fields[5] == "-1" {
            sum = Some(bps);
        } else {
            streams.push(bps);
        }
    }
    ensure!(
        sum.is_some() || !streams.is_empty(),
        "no iperf CSV report (could it connect?)"
    );
    Ok(sum.unwrap_or_else(|| streams.iter().sum()))
}

// ---------------------------------------------------------------------------------------------
// sockperf

/// A sockperf (Debian `sockperf`, 3.7) UDP server in a namespace, answering ping-pong on
/// `0.0.0.0:port`; killed (by its pid) on drop.
pub struct SockperfServer {
    // Dropped before `dir`.
    process: Tool,
    dir: TempDir,
}

impl SockperfServer {
    /// Starts `sockperf server -p PORT` in `ns` and waits until its socket is bound.
    pub fn start(ns: &Netns, port: u16) -> Result<SockperfServer> {
        let dir = TempDir::new("sockperf")?;
        let log = File::create(dir.join("sockperf.log")).context("creating sockperf.log")?;
        let port_arg = port.to_string();
        let args = ["server", "-i", "0.0.0.0", "-p", &port_arg];
        let mut cmd = in_netns(ns, None, "sockperf", args);
        cmd.stdout(log.try_clone()?).stderr(log);
        let process = Tool::spawn(cmd, &format!("sockperf server in {}", ns.name()))?;
        let mut server = SockperfServer { process, dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = server.process.exited()? {
                bail!(
                    "sockperf server in {} exited ({status}): {}",
                    ns.name(),
                    read_for_error(&server.dir.join("sockperf.log"))
                );
            }
            if udp_bound(ns, port)? {
                return Ok(server);
            }
            ensure!(
                Instant::now() < deadline,
                "sockperf server in {} is not bound to {port} after {START_TIMEOUT:?}: {}",
                ns.name(),
                read_for_error(&server.dir.join("sockperf.log"))
            );
            thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// What a sockperf ping-pong run measured: round trips in microseconds (`--full-rtt`), over
/// the run's valid part (after sockperf's warm-up).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SockperfResult {
    pub observations: u64,
    pub dropped: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl SockperfResult {
    /// Parses sockperf 3.7's ping-pong report (its colour escapes included).
    pub fn parse(report: &str) -> Result<SockperfResult> {
        let mut r = SockperfResult::default();
        let (mut obs, mut p50, mut p99) = (false, false, false);
        for line in report.lines() {
            // `\x1b[2;35mTotal 28303 observations\x1b[0m; each percentile contains ...`
            let line: String = strip_escapes(line);
            let line = line.trim_start_matches("sockperf: ").trim();
            if let Some(rest) = line.strip_prefix("Total ") {
                let n = rest.split_whitespace().next().unwrap_or_default();
                r.observations = n
                    .parse()
                    .with_context(|| format!("observations in {line:?}"))?;
                obs = true;
            } else if let Some(rest) = line.strip_prefix("# dropped messages = ") {
                let n = rest.split(';').next().unwrap_or_default().trim();
                r.dropped = n.parse().with_context(|| format!("drops in {line:?}"))?;
            } else if let Some(rest) = line.strip_prefix("---> percentile ") {
                let (pct, value) = rest
                    .split_once('=')
                    .with_context(|| format!("no `=` in {line:?}"))?;
                let value: f64 = value
                    .trim()
                    .parse()
                    .with_context(|| format!("percentile value in {line:?}"))?;
                match pct.trim() {
                    "50.000" => (r.p50_us, p50) = (value, true),
                    "99.000" => (r.p99_us, p99) = (value, true),
                    _ => {}
                }
            }
        }
        ensure!(
            obs && p50 && p99,
            "no observation count, p50 or p99 in sockperf's report: {report}"
        );
        Ok(r)
    }
}

/// `line` without ANSI SGR escapes (`ESC [ ... m`).
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs `sockperf ping-pong` (UDP, one message in flight, full round trips) from `ns` to
/// `addr:port` for `secs` seconds, pinned to `cpu` if given. sockperf spends its first 400 ms
/// warming up and reports only what follows, so `secs` is at least 2.
pub fn sockperf_ping_pong(
    ns: &Netns,
    addr: Ipv4Addr,
    port: u16,
    secs: u32,
    cpu: Option<usize>,
) -> Result<SockperfResult> {
    ensure!(
        secs >= 2,
        "sockperf: {secs} s leaves too little after its warm-up"
    );
    let args = [
        "ping-pong".to_owned(),
        "-i".to_owned(),
        addr.to_string(),
        "-p".to_owned(),
        port.to_string(),
        "-t".to_owned(),
        secs.to_string(),
        "--full-rtt".to_owned(),
    ];
    let cmd = in_netns(ns, cpu, "sockperf", &args);
    let limit = Duration::from_secs(u64::from(secs) + 15);
    let run = run_tool(
        cmd,
        &format!("sockperf to {addr}:{port} from {}", ns.name()),
        limit,
    )?;
    SockperfResult::parse(&format!("{}\n{}", run.stdout, run.stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wrk 4.1 against nginx, keep-alive, no errors: neither optional line.
    const WRK_CLEAN: &str = "\
Running 2s test @ http://10.77.0.2:8080/
  1 threads and 10 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   103.24us  166.41us   4.32ms   98.40%
    Req/Sec    95.06k    23.19k  135.73k    76.19%
  198027 requests in 2.10s, 31.54MB read
Requests/sec:  94300.01
Transfer/sec:     15.02MB
";

    /// Every answer a 404.
    const WRK_NON_2XX: &str = "\
Running 1s test @ http://10.77.0.2:8082/
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    48.37us   70.90us   2.40ms   99.29%
    Req/Sec    82.12k     9.45k  102.07k    72.73%
  89497 requests in 1.10s, 14.85MB read
  Non-2xx or 3xx responses: 89497
Requests/sec:  81333.55
Transfer/sec:     13.50MB
";

    /// The server killed one second into a `Connection: close` run (404s before that).
    const WRK_SOCKET_ERRORS: &str = "\
Running 3s test @ http://10.77.0.2:8082/
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.09ms  667.68us   5.63ms   64.26%
    Req/Sec    17.62k     1.49k   19.92k    70.00%
  17554 requests in 3.00s, 2.83MB read
  Socket errors: connect 0, read 43, write 16489, timeout 0
  Non-2xx or 3xx responses: 17554
Requests/sec:   5843.41
Transfer/sec:      0.94MB
";

    #[test]
    fn wrk_report_without_optional_lines_has_no_errors() {
        let r = WrkResult::parse(WRK_CLEAN).unwrap();
        assert_eq!(r.requests, 198_027);
        assert!((r.secs - 2.10).abs() < 1e-9, "secs {}", r.secs);
        assert_eq!(r.errors(), 0, "{r:?}");
        assert!((r.requests_per_sec() - 198_027.0 / 2.1).abs() < 1e-6);
    }

    #[test]
    fn wrk_report_counts_non_2xx_answers() {
        let r = WrkResult::parse(WRK_NON_2XX).unwrap();
        assert_eq!((r.requests, r.non_2xx), (89_497, 89_497), "{r:?}");
        assert_eq!(r.errors(), 89_497, "{r:?}");
    }

    #[test]
    fn wrk_report_counts_socket_errors_by_kind() {
        let r = WrkResult::parse(WRK_SOCKET_ERRORS).unwrap();
        assert_eq!(
            r,
            WrkResult {
                requests: 17_554,
                secs: 3.0,
                connect_errors: 0,
                read_errors: 43,
                write_errors: 16_489,
                timeouts: 0,
                non_2xx: 17_554,
            }
        );
        assert_eq!(r.errors(), 43 + 16_489 + 17_554);
    }

    #[test]
    fn wrk_times_in_every_unit_and_a_report_without_requests_is_refused() {
        for (time, secs) in [
            ("2.10s", 2.1),
            ("1.00m", 60.0),
            ("1.50h", 5400.0),
            ("500.00ms", 0.5),
            ("10.00us", 1e-5),
        ] {
            assert!((wrk_secs(time).unwrap() - secs).abs() < 1e-9, "{time}");
        }
        assert!(wrk_secs("2.10x").is_err());
        assert!(WrkResult::parse("unable to connect to 10.0.0.1:80 Connection refused").is_err());
    }

    #[test]
    fn iperf_csv_single_stream_and_parallel_streams() {
        // iperf 2.1.8 prints a 1970 timestamp in its CSV lines.
        let single =
            "19700101000000,10.77.0.1,39254,10.77.0.2,5201,1,0.0-2.0,4442423356,17708378164\n";
        assert_eq!(iperf_bits_per_sec(single).unwrap(), 17_708_378_164.0);
        let two = "\
19700101000000,10.77.0.1,39286,10.77.0.2,5201,2,0.0-1.0,1947205692,15505899737
19700101000000,10.77.0.1,39270,10.77.0.2,5201,1,0.0-1.0,1679818812,13376310523
";
        assert_eq!(
            iperf_bits_per_sec(two).unwrap(),
            15_505_899_737.0 + 13_376_310_523.0
        );
        let with_sum = format!(
            "{two}19700101000000,10.77.0.1,0,10.77.0.2,5201,-1,0.0-1.0,3627024504,29000000000\n"
        );
        assert_eq!(iperf_bits_per_sec(&with_sum).unwrap(), 29_000_000_000.0);
    }

    #[test]
    fn iperf_without_a_report_is_an_error() {
        // What a refused connection leaves on stdout: nothing (iperf 2 still exits 0).
        assert!(iperf_bits_per_sec("").is_err());
        assert!(iperf_bits_per_sec("Server listening on TCP port 5001\n").is_err());
    }

    /// The start of a real /proc/net/snmp (6.18) and its TcpExt line pair, shortened.
    const SNMP: &str = "\
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 1 64 3012 0 0 3001 0 0 11 11 0 0 0 0 0 0 0 0 0 3012
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs InTimeExcds InParmProbs InSrcQuenchs InRedirects InEchos InEchoReps InTimestamps InTimestampReps InAddrMasks InAddrMaskReps OutMsgs OutErrors OutRateLimitGlobal OutRateLimitHost OutDestUnreachs OutTimeExcds OutParmProbs OutSrcQuenchs OutRedirects OutEchos OutEchoReps OutTimestamps OutTimestampReps OutAddrMasks OutAddrMaskReps
Icmp: 2 0 0 2 0 0 0 0 0 0 0 0 0 0 1 0 0 0 1 0 0 0 0 0 0 0 0 0 0
IcmpMsg: InType3 OutType3
IcmpMsg: 2 1
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 31518 0 2 56 0 813594 743634 7 0 16534 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 3000 1 2851 0 2751 0 100 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
";

    #[test]
    fn snmp_counters_are_read_by_section_and_name() {
        let s = Snmp::parse(SNMP).unwrap();
        assert_eq!(s.ip_forw_datagrams, 3001);
        assert_eq!(s.icmp_out_dest_unreachs, 1);
        assert_eq!(s.icmp_in_dest_unreachs, 2);
        assert_eq!(
            (s.tcp_active_opens, s.tcp_attempt_fails, s.tcp_estab_resets),
            (31_518, 2, 56)
        );
        assert_eq!((s.tcp_retrans_segs, s.tcp_out_rsts), (7, 16_534));
        // Udp, not UdpLite, whose names are the same.
        assert_eq!(
            (
                s.udp_in_datagrams,
                s.udp_no_ports,
                s.udp_in_errors,
                s.udp_rcvbuf_errors,
                s.udp_in_csum_errors
            ),
            (3000, 1, 2851, 2751, 100)
        );
        let earlier = Snmp {
            udp_in_datagrams: 1000,
            ..s
        };
        assert_eq!(s.since(&earlier).udp_in_datagrams, 2000);
        assert_eq!(s.since(&earlier).tcp_active_opens, 0);
    }

    #[test]
    fn counter_tables_refuse_what_they_cannot_pair() {
        assert!(Snmp::parse("Udp: InDatagrams NoPorts\nUdp: 1\n").is_err());
        assert!(Snmp::parse("Udp: InDatagrams\nTcp: 1\n").is_err());
        // A counter the kernel does not have is an error, not a zero.
        let netstat = "TcpExt: TCPSynRetrans ListenOverflows\nTcpExt: 3 0\n";
        assert!(Netstat::parse(netstat).is_err());
        let netstat = "TcpExt: SyncookiesSent TCPSynRetrans ListenOverflows ListenDrops TCPTimeouts TCPAbortOnData PAWSTimewait\nTcpExt: 0 3 1 1 4 0 7\nIpExt: InNoRoutes\nIpExt: 0\n";
        let n = Netstat::parse(netstat).unwrap();
        assert_eq!(
            (
                n.tcp_syn_retrans,
                n.listen_overflows,
                n.tcp_timeouts,
                n.paws_timewait
            ),
            (3, 1, 4, 7)
        );
    }

    #[test]
    fn macs_parse_and_print() {
        let mac: Mac = "4e:c4:e7:7a:ee:0a".parse().unwrap();
        assert_eq!(mac, Mac([0x4e, 0xc4, 0xe7, 0x7a, 0xee, 0x0a]));
        assert_eq!(mac.to_string(), "4e:c4:e7:7a:ee:0a");
        for bad in [
            "4e:c4:e7:7a:ee",
            "4e:c4:e7:7a:ee:0a:01",
            "4e:c4:e7:7a:ee:0g",
            "4ec4e77aee0a",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
    }

    fn spec() -> UdpSpec {
        UdpSpec::new(
            "eth0",
            Mac([0x02, 0, 0, 0, 0, 0x01]),
            Mac([0x02, 0, 0, 0, 0, 0xfe]),
            Ipv4Addr::new(10, 10, 0, 2),
            40000,
            Ipv4Addr::new(10, 20, 0, 10),
            9999,
            3000,
        )
    }

    #[test]
    fn trafgen_config_of_one_minimum_size_flow() {
        assert_eq!(
            spec().config().unwrap(),
            "{
  0x02, 0x00, 0x00, 0x00, 0x00, 0xfe,
  0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
  c16(0x0800),
  0x45, 0x00, c16(46), c16(0), c16(0x4000), 64, 17, csumip(14, 33),
  10, 10, 0, 2,
  10, 20, 0, 10,
  c16(40000), c16(9999), c16(26), csumudp(14, 34),
  fill(0x61, 18),
}
"
        );
    }

    #[test]
    fn trafgen_config_of_flows_counts_the_port_low_byte_on_a_cpu() {
        let spec = UdpSpec {
            src_ports: SrcPorts::Flows {
                first: 40000,
                count: 64,
            },
            payload_len: 0,
            cpu: Some(1),
            ..spec()
        };
        let config = spec.config().unwrap();
        // 40000 = 0x9c40: high byte 156, low bytes 0x40..=0x7f.
        assert!(config.starts_with("cpu(1): {"), "{config}");
        assert!(
            config.contains("c8(156), dinc(64, 127, 1), c16(9999), c16(8)"),
            "{config}"
        );
        assert!(config.contains("c16(28)"), "{config}");
        assert!(!config.contains("fill"), "{config}");
        let crossing = UdpSpec {
            src_ports: SrcPorts::Flows {
                first: 40000,
                count: 200,
            },
            ..spec.clone()
        };
        assert!(crossing.config().is_err());
        let jumbo = UdpSpec {
            payload_len: MAX_UDP_PAYLOAD + 1,
            ..spec
        };
        assert!(jumbo.config().is_err());
    }

    #[test]
    fn trafgen_config_of_ipv6_uses_header_functions_for_every_port_form() {
        let v6 = |h: u16| std::net::Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, h);
        let spec = UdpSpec {
            cpu: Some(1),
            ..UdpSpec::new(
                "eth0",
                Mac([0x02, 0, 0, 0, 0, 0x01]),
                Mac([0x02, 0, 0, 0, 0, 0xfe]),
                v6(2),
                40000,
                v6(0x10),
                9,
                3000,
            )
        };
        assert_eq!(
            spec.config().unwrap(),
            "cpu(1): {
  eth(da=02:00:00:00:00:fe, sa=02:00:00:00:00:01, type=0x86dd),
  ipv6(hl=64, sa=fd10::2, da=fd10::10),
  udp(sp=40000, dp=9),
  fill(0x61, 18),
}
"
        );
        // 14 + 40 + 8 + 18 bytes: the IPv4 frame's payload in an IPv6 frame.
        assert_eq!(udp_frame_len(true, MIN_UDP_PAYLOAD), 80);
        assert_eq!(udp_frame_len(false, MIN_UDP_PAYLOAD), 60);
        for ports in [
            SrcPorts::Range {
                first: 1,
                count: 65_535,
            },
            SrcPorts::Flows {
                first: 1,
                count: 65_535,
            },
        ] {
            let range = UdpSpec {
                src_ports: ports,
                ..spec.clone()
            };
            let config = range.config().unwrap();
            assert!(config.contains("udp(sp=dinc(1, 65535), dp=9)"), "{config}");
        }
        let jumbo = UdpSpec {
            payload_len: MAX_UDP6_PAYLOAD + 1,
            ..spec.clone()
        };
        assert!(jumbo.config().is_err());
        let mixed = UdpSpec {
            src_ip: Ipv4Addr::new(10, 10, 0, 2).into(),
            ..spec
        };
        assert!(mixed.config().is_err(), "one family per frame");
    }

    #[test]
    fn trafgen_sent_count_is_read_from_its_summary() {
        let stdout = "     1 packets to schedule\n    60 bytes in total\nRunning! Hang up with ^C!\n\n\n        3000 packets outgoing\n      180000 bytes outgoing\n";
        assert_eq!(trafgen_sent(stdout).unwrap(), 3000);
        assert!(trafgen_sent("Running! Hang up with ^C!\n").is_err());
    }

    /// sockperf 3.7's ping-pong report with --full-rtt (its colour escapes kept), shortened.
    const SOCKPERF: &str = "sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=40923; ReceivedMessages=40922
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=28303; ReceivedMessages=28303
sockperf: \x1b[2;35m====> avg-rtt=54.729 (std-dev=39.482)\x1b[0m
sockperf: # dropped messages = 2; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Round trip is 54.729 usec
sockperf: \x1b[2;35mTotal 28303 observations\x1b[0m; each percentile contains 283.03 observations
sockperf: ---> <MAX> observation = 3815.672
sockperf: ---> percentile 99.999 = 3815.672
sockperf: ---> percentile 99.000 =   77.574
sockperf: ---> percentile 90.000 =   62.992
sockperf: ---> percentile 50.000 =   53.979
sockperf: ---> <MIN> observation =   12.708
";

    #[test]
    fn sockperf_report_gives_observations_drops_and_percentiles() {
        let r = SockperfResult::parse(SOCKPERF).unwrap();
        assert_eq!(
            r,
            SockperfResult {
                observations: 28_303,
                dropped: 2,
                p50_us: 53.979,
                p99_us: 77.574,
            }
        );
        let none = "sockperf: No valid observations found. Try tune parameters: --time/--mps/--reply-every\n";
        assert!(SockperfResult::parse(none).is_err());
    }

    #[test]
    fn trafgen_window_is_the_chosen_cpus_sending_time() {
        // trafgen 0.6.8 with --cpus 2 and a `cpu(1):` packet.
        let stdout = "      200000 packets outgoing\n    12000000 bytes outgoing\n           0 sec, 1 usec on CPU0 (0 packets)\n           2 sec, 581524 usec on CPU1 (200000 packets)\n";
        assert_eq!(
            trafgen_window(stdout, 1, 200_000).unwrap(),
            Duration::from_micros(2_581_524)
        );
        assert!(trafgen_window(stdout, 0, 200_000).is_err());
        assert!(trafgen_window(stdout, 1, 100).is_err());
    }

    #[test]
    fn trafgen_config_of_a_16_bit_port_range_uses_header_functions() {
        let spec = UdpSpec {
            src_ports: SrcPorts::Range {
                first: 1,
                count: 65_535,
            },
            cpu: Some(1),
            ..spec()
        };
        assert_eq!(
            spec.config().unwrap(),
            "cpu(1): {
  eth(da=02:00:00:00:00:fe, sa=02:00:00:00:00:01, type=0x0800),
  ipv4(id=0, ttl=64, df, sa=10.10.0.2, da=10.20.0.10),
  udp(sp=dinc(1, 65535), dp=9999),
  fill(0x61, 18),
}
"
        );
        let past = UdpSpec {
            src_ports: SrcPorts::Range {
                first: 2,
                count: 65_535,
            },
            ..spec
        };
        assert!(past.config().is_err());
    }
}
