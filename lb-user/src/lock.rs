//! One writer: an exclusive `flock` on each directory a writer owns (the state dir, the
//! bpffs dir) and on the API socket's lock file, taken before anything is read or changed.
//! The kernel drops a lock when its holder exits, however it exits, so a crashed daemon
//! never blocks the next one; a live holder is named in the refusal (its pid and command
//! line, found in /proc/locks).
use std::{
    fs::File,
    os::unix::{fs::MetadataExt as _, fs::OpenOptionsExt as _, io::AsRawFd as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// A held lock; released when dropped (or when the process exits).
#[derive(Debug)]
pub struct Lock {
    _file: File,
    pub path: PathBuf,
}

impl Lock {
    /// Locks the directory `dir` (created if missing), for `what` (how the refusal names
    /// the resource, e.g. "the bpffs dir").
    pub fn dir(dir: &Path, what: &str) -> Result<Lock> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
        Self::take(file, dir, what)
    }

    /// Locks the file `path` (created 0600 if missing).
    pub fn file(path: &Path, what: &str) -> Result<Lock> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Self::take(file, path, what)
    }

    fn take(file: File, path: &Path, what: &str) -> Result<Lock> {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Lock {
                _file: file,
                path: path.to_path_buf(),
            });
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err).with_context(|| format!("locking {}", path.display()));
        }
        let holder = file
            .metadata()
            .ok()
            .and_then(|m| holder(m.dev(), m.ino()))
            .map_or_else(
                || "another process".to_owned(),
                |pid| {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                        .unwrap_or_default();
                    format!("pid {pid} ({})", cmd.trim())
                },
            );
        bail!(
            "{what} {} is in use by {holder}: one writer at a time; stop it first (nothing was changed)",
            path.display()
        )
    }
}

/// The pid holding a lock on the file (`dev`, `ino`), from /proc/locks: lines of
/// `N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END`, the device in hex.
fn holder(dev: u64, ino: u64) -> Option<u32> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        // A blocked waiter's line starts with `N: ->`; its fields are shifted by one.
        let at = fields.iter().position(|f| *f == "FLOCK")?;
        (fields.get(at + 4) == Some(&want.as_str()))
            .then(|| fields.get(at + 3)?.parse().ok())
            .flatten()
    })
}
