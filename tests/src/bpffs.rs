//! A private bpffs for one test: pins of a test never land in (or collide under) a shared
//! /sys/fs/bpf, and disappear with the test (DESIGN.md: mount a bpffs for tests that need one).
use std::{
    ffi::CString,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result, bail};

const PREFIX: &str = "lbt-bpffs-";

pub struct Bpffs {
    path: PathBuf,
}

impl Bpffs {
    /// Mounts a fresh bpffs on a unique directory under the temp dir, after unmounting those
    /// of runs whose process is gone.
    pub fn new() -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        stale_cleanup();
        let path = std::env::temp_dir().join(format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let target = CString::new(path.as_os_str().as_encoded_bytes())?;
        // SAFETY: valid C strings; no data argument.
        let rc = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                target.as_ptr(),
                c"bpf".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            let _ = std::fs::remove_dir(&path);
            bail!("mounting a bpffs on {}: {err}", path.display());
        }
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn unmount(path: &Path) {
    if let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: valid C string. MNT_DETACH: a pin still held open must not keep it mounted.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    if let Err(e) = std::fs::remove_dir(path) {
        eprintln!("bpffs: could not remove {}: {e}", path.display());
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        unmount(&self.path);
    }
}

fn stale_cleanup() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            unmount(&entry.path());
        }
    }
}
