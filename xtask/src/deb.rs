//! The Debian package of `cargo xtask dist`, built with `dpkg-deb --root-owner-group` from a
//! tree laid out here (no debhelper):
//!
//! - `/usr/bin/lb`, `/usr/lib/cni/lb-cni` (beside Debian's reference CNI plugins);
//! - `/usr/lib/systemd/system/lb.service`, enabled and started on install, restarted on
//!   upgrade (dist/debian/postinst; dh_installsystemd's snippets);
//! - man pages gzipped in /usr/share/man/man1, bash, zsh and fish completions where those
//!   shells look for a package's;
//! - /usr/share/doc/lb: copyright (machine-readable), changelog.Debian.gz, the docs;
//! - `Depends:` the binaries' shared libraries (dpkg-shlibdeps) and the tools lb runs
//!   (RUNTIME_DEPENDS).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    output, root, run,
    stage::{Staged, copy, normalise, remove_dir, unit},
};

/// The package's maintainer (control, changelog, copyright's contact).
const MAINTAINER: &str = "The lb authors <maintainers@users.noreply.a-seed-53895d3f.example>";

/// The Debian revision of every package built: upstream releases only, none Debian's own.
const REVISION: &str = "1";

/// What lb runs: `nft` (node/nft.rs: the nftables dataplane, and the forward-hook checks of
/// every dataplane) and `conntrack` (dataplane/nft/conntrack.rs: flows on the nftables
/// dataplane, which `--dataplane auto` falls back to).
const RUNTIME_DEPENDS: &[&str] = &["nftables", "conntrack"];

/// Not run by lb, but what an operator names namespaces with for `--netns` (`ip netns`) and
/// looks at interfaces and attached programs with.
const RECOMMENDS: &[&str] = &["iproute2"];

/// The reference CNI plugins lb-cni is chained after (bridge, host-local), and bpftool for the
/// maps and programs the README inspects.
const SUGGESTS: &[&str] = &["containernetworking-plugins", "bpftool"];

const DESCRIPTION: &str = "\
eBPF/XDP service load balancer for container nodes
 lb balances a node's services over their backends: VIPs and published ports,
 in TC and XDP eBPF programs, or an equivalent nftables ruleset where the
 kernel cannot run them. `lb daemon` owns the desired state and programs each
 network's dataplane; the `lb` commands are its clients. lb-cni, a CNI plugin
 in /usr/lib/cni, publishes containers' port mappings through it.";

/// Builds the package from `staged` in `work/deb`; returns its path in `out`.
pub fn build(staged: &Staged, work: &Path, out: &Path) -> Result<PathBuf> {
    let tree = work.join("deb");
    remove_dir(&tree)?;
    let usr = tree.join("usr");
    copy(&staged.bin.join("lb"), &usr.join("bin/lb"))?;
    copy(&staged.bin.join("lb-cni"), &usr.join("lib/cni/lb-cni"))?;
    let units = usr.join("lib/systemd/system");
    std::fs::create_dir_all(&units)?;
    std::fs::write(
        units.join("lb.service"),
        unit("/usr/bin", "# lb daemon, as the lb package installs it.\n")?,
    )?;
    let man = usr.join("share/man/man1");
    std::fs::create_dir_all(&man)?;
    for page in std::fs::read_dir(&staged.man)? {
        let page = page?.path();
        let name = page.file_name().expect("a page's name");
        gzip(&page, &man.join(name).with_added_extension("gz"))?;
    }
    for (from, to) in [
        ("lb.bash", "share/bash-completion/completions/lb"),
        ("_lb", "share/zsh/vendor-completions/_lb"),
        ("lb.fish", "share/fish/vendor_completions.d/lb.fish"),
    ] {
        copy(&staged.completions.join(from), &usr.join(to))?;
    }
    let doc = usr.join("share/doc/lb");
    std::fs::create_dir_all(&doc)?;
    std::fs::write(doc.join("copyright"), copyright()?)?;
    let version = format!("{}-{REVISION}", staged.version);
    let changelog = work.join("changelog.Debian");
    std::fs::write(&changelog, changelog_entry(&version, staged.epoch)?)?;
    gzip(&changelog, &doc.join("changelog.Debian.gz"))?;
    docs(&doc)?;

    let debian = tree.join("DEBIAN");
    std::fs::create_dir_all(&debian)?;
    for script in ["postinst", "prerm", "postrm"] {
        copy(
            &root().join("dist/debian").join(script),
            &debian.join(script),
        )?;
    }
    let depends = [shlib_depends(staged, work)?]
        .into_iter()
        .chain(RUNTIME_DEPENDS.iter().map(|d| d.to_string()))
        .collect::<Vec<_>>()
        .join(", ");
    let control = format!(
        "Package: lb\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {size}\n\
         Depends: {depends}\n\
         Recommends: {recommends}\n\
         Suggests: {suggests}\n\
         Section: net\n\
         Priority: optional\n\
         Description: {DESCRIPTION}\n",
        arch = staged.arch.debian,
        size = installed_size(&usr)?,
        recommends = RECOMMENDS.join(", "),
        suggests = SUGGESTS.join(", "),
    );
    std::fs::write(debian.join("control"), control)?;
    std::fs::write(debian.join("md5sums"), md5sums(&tree)?)?;
    normalise(&tree, staged.epoch)?;

    let deb = out.join(format!("lb_{version}_{}.deb", staged.arch.debian));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&tree)
        .arg(&deb)
        .env("SOURCE_DATE_EPOCH", staged.epoch.to_string()))?;
    Ok(deb)
}

/// `gzip -9n` (no name, no time: the same bytes for the same file), as dh_compress.
fn gzip(from: &Path, to: &Path) -> Result<()> {
    let file = std::fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    run(Command::new("gzip")
        .args(["-9n", "--stdout"])
        .arg(from)
        .stdout(file))
}

/// The README, BENCHMARKS.md and docs/ in /usr/share/doc/lb, each gzipped past 4 kB as
/// dh_compress does (Debian policy 12.3).
fn docs(doc: &Path) -> Result<()> {
    let root = root();
    let mut files: Vec<(PathBuf, PathBuf)> = ["README.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| (root.join(f), doc.join(f)))
        .collect();
    for entry in std::fs::read_dir(root.join("docs"))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            files.push((entry.path(), doc.join("docs").join(entry.file_name())));
        }
    }
    for (from, to) in files {
        if std::fs::metadata(&from)?.len() > 4096 {
            std::fs::create_dir_all(to.parent().expect("in doc/"))?;
            gzip(&from, &to.with_added_extension("gz"))?;
        } else {
            copy(&from, &to)?;
        }
    }
    Ok(())
}

/// dist/debian/copyright with the copyright line and MIT text of LICENSE-MIT.
fn copyright() -> Result<String> {
    let root = root();
    let template = std::fs::read_to_string(root.join("dist/debian/copyright"))?;
    let mit = std::fs::read_to_string(root.join("LICENSE-MIT"))?;
    let holder = (mit.lines())
        .find_map(|l| l.strip_prefix("Copyright (c) "))
        .context("LICENSE-MIT has no `Copyright (c) ` line")?;
    // The licence's text after its copyright line, each line indented, blank ones as ` .`.
    let text: Vec<String> = (mit.lines())
        .skip_while(|l| !l.starts_with("Copyright"))
        .skip(1)
        .skip_while(|l| l.trim().is_empty())
        .map(|l| {
            if l.trim().is_empty() {
                " .".to_owned()
            } else {
                format!(" {}", l.trim_end())
            }
        })
        .collect();
    let text = text.join("\n");
    Ok(template
        .replace("@MAINTAINER@", MAINTAINER)
        .replace("@COPYRIGHT@", holder)
        .replace("@MIT@", text.trim_end_matches("\n .")))
}

/// One changelog entry for `version`, dated `epoch`.
fn changelog_entry(version: &str, epoch: u64) -> Result<String> {
    let date = output(
        Command::new("date")
            .args(["-u", "-R", "-d"])
            .arg(format!("@{epoch}"))
            .env("LC_ALL", "C"),
    )?;
    let upstream = version.rsplit_once('-').map_or(version, |(v, _)| v);
    Ok(format!(
        "lb ({version}) unstable; urgency=medium\n\n  \
         * lb {upstream}, packaged by `cargo xtask dist`.\n\n \
         -- {MAINTAINER}  {}\n",
        date.trim()
    ))
}

/// The `Depends:` of the binaries' shared libraries, as dpkg-shlibdeps computes it. It wants a
/// source package's debian/control: a minimal one in a directory of its own.
fn shlib_depends(staged: &Staged, work: &Path) -> Result<String> {
    let dir = work.join("shlibdeps");
    std::fs::create_dir_all(dir.join("debian"))?;
    std::fs::write(
        dir.join("debian/control"),
        format!(
            "Source: lb\nMaintainer: {MAINTAINER}\n\nPackage: lb\nArchitecture: {}\n",
            staged.arch.debian
        ),
    )?;
    let said = output(
        Command::new("dpkg-shlibdeps")
            .arg("-O")
            .arg(format!("-e{}", staged.bin.join("lb").display()))
            .arg(format!("-e{}", staged.bin.join("lb-cni").display()))
            .current_dir(&dir),
    )?;
    match (said.lines()).find_map(|l| l.strip_prefix("shlibs:Depends=")) {
        Some(depends) if !depends.trim().is_empty() => Ok(depends.trim().to_owned()),
        _ => bail!("dpkg-shlibdeps said no shlibs:Depends: {said}"),
    }
}

/// Installed-Size: KiB, each file rounded up, as dpkg-gencontrol counts it.
fn installed_size(dir: &Path) -> Result<u64> {
    let mut kib = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        kib += if meta.is_dir() {
            1 + installed_size(&entry.path())?
        } else {
            meta.len().div_ceil(1024)
        };
    }
    Ok(kib)
}

/// DEBIAN/md5sums: every file's, by its path in the package.
fn md5sums(tree: &Path) -> Result<String> {
    let files = output(
        Command::new("find")
            .args(["usr", "-type", "f"])
            .current_dir(tree),
    )?;
    let mut files: Vec<&str> = files.lines().collect();
    files.sort();
    output(Command::new("md5sum").args(&files).current_dir(tree))
}
