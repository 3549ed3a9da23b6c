//! Running work inside a network's namespace.
//!
//! Contract: setns changes only the calling thread, so work for a namespace runs on a thread
//! of its own that joins it ([`in_netns`] for one call, the node watcher for its life); the
//! caller's thread, and the daemon's tokio workers, never leave the daemon's namespace.
use std::{os::fd::AsRawFd as _, path::PathBuf};

use anyhow::{Context as _, Result};

/// Runs `f` on a new thread that has joined network namespace `netns` (a name under
/// /run/netns, or a path such as /proc/PID/ns/net); `None` runs it in the caller's namespace,
/// still on a new thread so that it may block.
pub fn in_netns<R, F>(netns: Option<&str>, f: F) -> Result<R>
where
    F: FnOnce() -> Result<R> + Send + 'static,
    R: Send + 'static,
{
    let path = netns.map(netns_path);
    let handle = std::thread::Builder::new()
        .name("lb-netns".into())
        .spawn(move || {
            // This thread exits when `f` returns, so no other code ever runs in the joined
            // namespace.
            if let Some(path) = path {
                join_netns(&path)?;
            }
            f()
        })
        .context("spawning a thread for a network namespace")?;
    match handle.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Moves the calling thread (only it: setns is per thread) into the namespace at `path`. The
/// caller owns the thread and makes sure nothing else runs on it afterwards.
pub fn join_netns(path: &std::path::Path) -> Result<()> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening network namespace {}", path.display()))?;
    // SAFETY: setns on an fd we own; it affects only the calling thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("joining network namespace {}", path.display()));
    }
    Ok(())
}

/// The path of namespace `netns`: a name under /run/netns, or a path as given.
pub fn netns_path(netns: &str) -> PathBuf {
    if netns.contains('/') {
        PathBuf::from(netns)
    } else {
        PathBuf::from("/run/netns").join(netns)
    }
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14): what
/// a BPF program reads of a socket's namespace (`bpf_get_netns_cookie`). Stable for the
/// namespace's life, never reused, never 0.
pub fn cookie() -> Result<u64> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0")
        .context("opening a socket to read the namespace's cookie")?;
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`, which lives for the call.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .context("reading the network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14)");
    }
    Ok(cookie)
}
