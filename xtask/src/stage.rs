//! What both release artifacts are made of (`dist.rs` stages it, then writes the tarball, and
//! `deb.rs` the Debian package from the same pieces): the staged binaries, man pages and
//! completions, the unit from its template, the licences, and the file operations that make
//! two runs give the same archives.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{root, run};

/// The pieces both artifacts are made of, generated once into the work directory.
pub struct Staged {
    /// `lb`'s version, as `lb --version` says it.
    pub version: String,
    pub arch: Arch,
    /// Seconds since the epoch that every file is dated.
    pub epoch: u64,
    /// Stripped `lb` and `lb-cni`.
    pub bin: PathBuf,
    /// `lb generate man`'s pages.
    pub man: PathBuf,
    /// `lb generate completions`' lb.bash, _lb and lb.fish.
    pub completions: PathBuf,
}

/// The machine the binaries are built for, by its names in the two artifacts.
#[derive(Clone, Copy)]
pub struct Arch {
    /// The tarball's: `x86_64`.
    pub uname: &'static str,
    /// Debian's: `amd64`.
    pub debian: &'static str,
}

impl Arch {
    pub fn host() -> Result<Arch> {
        let debian = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => bail!("no Debian architecture known for {other}"),
        };
        Ok(Arch {
            uname: std::env::consts::ARCH,
            debian,
        })
    }
}

/// The systemd unit for `lb` installed in `bindir`: the template dist/lb.service with its
/// placeholder filled and its leading comment replaced by `header`.
pub fn unit(bindir: &str, header: &str) -> Result<String> {
    let path = root().join("dist/lb.service");
    let template =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let body: String = (template.lines())
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let unit = format!("{header}{}", body.replace("@BINDIR@", bindir));
    if let Some(line) = unit.lines().find(|l| l.contains('@')) {
        bail!("{}: a placeholder left unfilled: {line}", path.display());
    }
    Ok(unit)
}

/// The licence texts the crates name (lb-ebpf: MIT OR GPL-2.0; the rest: MIT OR Apache-2.0).
pub const LICENCES: [&str; 3] = ["LICENSE-MIT", "LICENSE-APACHE", "LICENSE-GPL-2.0"];

/// Copies a file, making its directory.
pub fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Copies a directory's files, and its directories' recursively, into `to`.
pub fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let entries = std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))?;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()))?;
        } else {
            copy(&path, &to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// Every file under `dir` readable by all and writable by its owner only (executables stay
/// executable), and dated `epoch`.
pub fn normalise(dir: &Path, epoch: u64) -> Result<()> {
    run(Command::new("chmod")
        .args(["-R", "u+rwX,go+rX,go-w"])
        .arg(dir))?;
    run(Command::new("find")
        .arg(dir)
        .args(["-exec", "touch", "--no-dereference"])
        .arg(format!("--date=@{epoch}"))
        .args(["{}", "+"]))
}

pub fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}
