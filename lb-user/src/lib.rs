//! The `lb` controller.
//!
//! The [`core`] is pure (model → compose → elements): everything a dataplane will be told is
//! decided there and can be asserted without root. The effectful shell is built around it:
//! the live node ([`node`]), the dataplanes ([`dataplane`]), the daemon and its store
//! ([`daemon`]), its API ([`api`]), the cluster over etcd ([`cluster`]), the CNI plugin
//! ([`cni`]), `lb load` ([`oneshot`]) and the writers' locks ([`lock`]); the command line is
//! the `lb` binary's (`src/cli/`).
pub mod api;
pub mod cluster;
pub mod cni;
pub mod core;
pub mod daemon;
pub mod dataplane;
pub mod lock;
pub mod node;
pub mod oneshot;

/// Writes `bytes` to `path` so that a reader (or a crash) sees the old file or the new one,
/// never a torn one: temp file in the same directory, fsync, rename over, fsync the directory.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let dir = path.parent().context("path has no parent directory")?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("state"),
        std::process::id()
    ));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.sync_all()
        .with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}
