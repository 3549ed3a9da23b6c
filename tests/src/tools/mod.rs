//! Real traffic with the tools operators use — nginx, wrk, trafgen, iperf, sockperf, tcpdump —
//! and the kernel counters that say what became of it, each run inside a test namespace.
//!
//! Every tool runs as `ip netns exec NS [taskset -c CPU] TOOL ...`; `ip netns exec` and
//! `taskset` both exec in place, so the child's pid is the tool's own. Each tool leads a process
//! group of its own, and a guard SIGKILLs that group (the tool and whatever it forked, nothing
//! else) and reaps it when dropped, on unwind too, or when a run outlives its time limit.
//! Configuration, logs, pid files and temp files go to a private temp dir removed with the
//! guard: nothing is written anywhere else, and nothing touches the root namespace.
//!
//! One module per tool or concern; their items are re-exported here, as `lb_tests::tools::…`.
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
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

mod counters;
mod iperf;
mod link;
mod nginx;
mod ports;
mod sink;
mod sockperf;
mod tcpdump;
mod trafgen;
mod wrk;

pub use counters::{Netstat, Snmp, netstat, snmp};
pub use iperf::{IperfServer, iperf_bits_per_sec, iperf_client};
pub use link::{LinkStats, Mac, link_mac, link_stats};
pub use nginx::Nginx;
pub use ports::{tcp_accepts, tcp_established, tcp_listening, udp_bound, wait_tcp_port};
pub use sink::{Received, UdpSink};
pub use sockperf::{SockperfResult, SockperfServer, sockperf_ping_pong};
pub use tcpdump::Tcpdump;
pub use trafgen::{MIN_UDP_PAYLOAD, SrcPorts, TrafgenRun, UdpSpec, trafgen_udp, udp_frame_len};
pub use wrk::{WrkOptions, WrkResult, wrk, wrk_script};

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
