//! `cargo xtask dist`: lb's release artifacts in target/dist, versioned as the `lb` built:
//!
//! - `lb-VERSION-ARCH-linux.tar.gz`, unpacking to `lb-VERSION/`: `bin/lb`, `bin/lb-cni`,
//!   `lb.service` (for /usr/local/bin/lb), `man/man1/`, `completions/`, `doc/` and the
//!   licences;
//! - `lb_VERSION-1_DEBARCH.deb` (deb.rs).
//!
//! Man pages and completions come from `lb generate` (the CLI's own definition); the unit from
//! the template dist/lb.service. Both artifacts hold the same stripped binaries. Timestamps
//! are the last commit's (or `SOURCE_DATE_EPOCH`'s), owners root and modes normalised: the
//! archives change only with what is in them. xtask/tests/dist.rs checks what comes out.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    deb, output, root, run,
    stage::{Arch, LICENCES, Staged, copy, copy_dir, normalise, remove_dir, unit},
};

fn say(what: &str) {
    println!("xtask dist: {what}");
}

pub fn dist() -> Result<()> {
    say("building the release lb and lb-cni");
    crate::build::release_bins(&[("lb-user", "lb"), ("lb-user", "lb-cni")])?;
    let release = root().join("target/release");
    let out = root().join("target/dist");
    let work = out.join("work");
    remove_dir(&work)?;
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let lb = release.join("lb");
    let version = version(&lb)?;
    let staged = Staged {
        version,
        arch: Arch::host()?,
        epoch: source_date_epoch()?,
        bin: work.join("bin"),
        man: work.join("man"),
        completions: work.join("completions"),
    };
    std::fs::create_dir_all(&staged.bin)?;
    for name in ["lb", "lb-cni"] {
        let to = staged.bin.join(name);
        std::fs::copy(release.join(name), &to)
            .with_context(|| format!("copying {name} to {}", to.display()))?;
        // As dh_strip does for an executable: symbols and build notes out, the binaries a
        // fraction of their size. The eBPF object inside lb is data and stays whole.
        run(Command::new("strip")
            .args(["--remove-section=.comment", "--remove-section=.note"])
            .arg(&to))?;
    }
    run(Command::new(&lb).args(["generate", "man"]).arg(&staged.man))?;
    run(Command::new(&lb)
        .args(["generate", "completions"])
        .arg(&staged.completions))?;

    let tarball = tarball(&staged, &work, &out)?;
    say(&format!("wrote {}", tarball.display()));
    let deb = deb::build(&staged, &work, &out)?;
    say(&format!("wrote {}", deb.display()));
    Ok(())
}

/// `lb --version`'s version: the one the binary was built as (lb-user's Cargo.toml).
fn version(lb: &Path) -> Result<String> {
    let said = output(Command::new(lb).arg("--version"))?;
    match said.split_whitespace().collect::<Vec<_>>()[..] {
        ["lb", version] => Ok(version.to_owned()),
        _ => bail!("`lb --version` said {said:?}, not `lb VERSION`"),
    }
}

/// The time every packaged file is dated: `SOURCE_DATE_EPOCH` when set (reproducible-builds.org),
/// else the last commit's, else now.
fn source_date_epoch() -> Result<u64> {
    if let Ok(epoch) = std::env::var("SOURCE_DATE_EPOCH") {
        return epoch
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={epoch:?}"));
    }
    let commit = Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(root())
        .output();
    if let Ok(out) = commit
        && out.status.success()
        && let Ok(epoch) = String::from_utf8_lossy(&out.stdout).trim().parse()
    {
        return Ok(epoch);
    }
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs())
}

/// The tarball: `lb-VERSION/` with the binaries, the unit for /usr/local, man pages,
/// completions, docs and licences.
fn tarball(staged: &Staged, work: &Path, out: &Path) -> Result<PathBuf> {
    let name = format!("lb-{}", staged.version);
    let top = work.join("tar").join(&name);
    for bin in ["lb", "lb-cni"] {
        copy(&staged.bin.join(bin), &top.join("bin").join(bin))?;
    }
    std::fs::write(
        top.join("lb.service"),
        unit(
            "/usr/local/bin",
            "# lb daemon, for bin/lb installed as /usr/local/bin/lb (docs/install.md):\n\
             #   cp lb.service /etc/systemd/system/ && systemctl daemon-reload && systemctl enable --now lb\n",
        )?,
    )?;
    copy_dir(&staged.man, &top.join("man/man1"))?;
    copy_dir(&staged.completions, &top.join("completions"))?;
    let root = root();
    for doc in ["README.md", "BENCHMARKS.md"] {
        copy(&root.join(doc), &top.join("doc").join(doc))?;
    }
    copy_dir(&root.join("docs"), &top.join("doc/docs"))?;
    for licence in LICENCES {
        copy(&root.join(licence), &top.join(licence))?;
    }
    normalise(&work.join("tar"), staged.epoch)?;
    let tarball = out.join(format!("{name}-{}-linux.tar.gz", staged.arch.uname));
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--format=gnu",
            "--use-compress-program=gzip -9n",
            "-C",
        ])
        .arg(work.join("tar"))
        .arg("-cf")
        .arg(&tarball)
        .arg(&name))?;
    Ok(tarball)
}
