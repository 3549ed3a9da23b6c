//! `cargo xtask dist`, accepted: the artifacts it writes are built here (the xtask binary's
//! `dist`, a release build), then taken apart as an operator and Debian's tools would:
//!
//! - the tarball's layout, and its `lb version` and `lb-cni` run from the unpacked `bin/` with
//!   nothing of the workspace around them (PATH of that `bin/` and /usr/bin:/bin, cwd outside
//!   the workspace, no CARGO* variables: no variables at all);
//! - the .deb's contents (`dpkg-deb -c`) and control fields;
//! - lintian: no error (its warnings printed);
//! - both units through `systemd-analyze verify`, in a root holding the artifact's files;
//! - as root, the .deb installed into a throwaway root and purged, leaving nothing behind.
//!
//! The tools are Debian's (`cargo xtask setup` installs them). Without one, the tests say so
//! and are counted as skipped, except under CI=true, where a missing tool fails them.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
};

use lb_tests::{is_root, skip};

/// The tools `dist` and these tests run.
const TOOLS: &[&str] = &[
    "dpkg",
    "dpkg-deb",
    "dpkg-shlibdeps",
    "lintian",
    "systemd-analyze",
    "strip",
    "tar",
    "gzip",
    "md5sum",
];

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(dir.join(tool))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What `dist` wrote, by its own account.
struct Built {
    tarball: PathBuf,
    deb: PathBuf,
    /// `lb-VERSION`, the tarball's top directory.
    version: String,
}

/// The artifacts, built once for every test here; `None` when a tool is missing (skipped).
fn built(test: &str) -> Option<&'static Built> {
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        skip(
            test,
            &format!(
                "{} not installed (`cargo xtask setup` installs them)",
                missing.join(", ")
            ),
        );
        return None;
    }
    static BUILT: OnceLock<Result<Built, String>> = OnceLock::new();
    match BUILT.get_or_init(build) {
        Ok(built) => Some(built),
        Err(e) => panic!("{e}"),
    }
}

fn build() -> Result<Built, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("dist")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running xtask dist: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "xtask dist failed ({}):\n{stdout}\n{stderr}",
            out.status
        ));
    }
    println!("{stdout}");
    let wrote = |suffix: &str| {
        (stdout.lines())
            .filter_map(|l| l.strip_prefix("xtask dist: wrote "))
            .find(|p| p.ends_with(suffix))
            .map(PathBuf::from)
            .ok_or_else(|| format!("xtask dist said it wrote no {suffix}:\n{stdout}"))
    };
    let tarball = wrote(".tar.gz")?;
    let deb = wrote(".deb")?;
    let name = tarball.file_name().unwrap().to_string_lossy().into_owned();
    // lb-VERSION-ARCH-linux.tar.gz, VERSION perhaps with a `-` of its own (0.2.0-rc.1).
    let version = (name.strip_suffix("-linux.tar.gz"))
        .and_then(|rest| rest.rsplit_once('-'))
        .and_then(|(rest, _arch)| rest.strip_prefix("lb-"))
        .map(str::to_owned)
        .ok_or_else(|| format!("{name} is not lb-VERSION-ARCH-linux.tar.gz"))?;
    Ok(Built {
        tarball,
        deb,
        version,
    })
}

/// Runs `cmd`, returning its output; panics with what it said when it fails.
fn ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A private empty directory under the system temp dir (outside the workspace), removed when
/// dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("lb-dist-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            !dir.starts_with(workspace().canonicalize().unwrap()),
            "{} is inside the workspace",
            dir.display()
        );
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The paths of a `tar -tv` or `dpkg-deb -c` listing (`./` and trailing `/` taken off) after
/// checking that root owns every entry.
fn listed(listing: &str, what: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(
            fields
                .get(1)
                .is_some_and(|o| *o == "root/root" || *o == "0/0"),
            "{what}: an entry not owned by root: {line}"
        );
        let path = fields[5..].join(" ");
        let path = path.split(" -> ").next().unwrap();
        let path = path.trim_start_matches("./").trim_end_matches('/');
        if !path.is_empty() {
            paths.insert(path.to_owned());
        }
    }
    paths
}

/// Fails naming every expected path `paths` lacks.
fn assert_holds(paths: &BTreeSet<String>, expected: &[String], what: &str) {
    let missing: Vec<&String> = expected.iter().filter(|p| !paths.contains(*p)).collect();
    assert!(
        missing.is_empty(),
        "{what} lacks {missing:?}; it holds:\n{}",
        paths.iter().cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The man pages a listing holds under `dir`, by their names without `.gz`.
fn man_pages(paths: &BTreeSet<String>, dir: &str) -> BTreeSet<String> {
    (paths.iter())
        .filter_map(|p| p.strip_prefix(dir))
        .filter(|p| p.ends_with(".1") || p.ends_with(".1.gz"))
        .map(|p| p.trim_end_matches(".gz").to_owned())
        .collect()
}

fn tar_listing(built: &Built) -> BTreeSet<String> {
    let out = ok(Command::new("tar")
        .args(["-tvzf"])
        .arg(&built.tarball)
        .env("LC_ALL", "C"));
    listed(&stdout(&out), "the tarball")
}

fn deb_listing(built: &Built) -> BTreeSet<String> {
    let out = ok(Command::new("dpkg-deb").arg("-c").arg(&built.deb));
    listed(&stdout(&out), "the .deb")
}

/// The man pages every artifact must have: lb's, and the commands' the unit's Documentation=
/// names.
const MAN_PAGES: &[&str] = &[
    "lb.1",
    "lb-daemon.1",
    "lb-network-add.1",
    "lb-service-set.1",
];

#[test]
fn the_tarball_holds_binaries_unit_man_pages_completions_docs_and_licences() {
    let Some(built) =
        built("the_tarball_holds_binaries_unit_man_pages_completions_docs_and_licences")
    else {
        return;
    };
    let paths = tar_listing(built);
    let top = format!("lb-{}", built.version);
    let outside: Vec<&String> = paths
        .iter()
        .filter(|p| *p != &top && !p.starts_with(&format!("{top}/")))
        .collect();
    assert!(outside.is_empty(), "entries outside {top}/: {outside:?}");
    let mut expected: Vec<String> = [
        "bin/lb",
        "bin/lb-cni",
        "lb.service",
        "completions/lb.bash",
        "completions/_lb",
        "completions/lb.fish",
        "doc/README.md",
        "doc/BENCHMARKS.md",
        "doc/docs/install.md",
        "doc/docs/cli.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "LICENSE-GPL-2.0",
    ]
    .iter()
    .map(|p| format!("{top}/{p}"))
    .collect();
    expected.extend(MAN_PAGES.iter().map(|p| format!("{top}/man/man1/{p}")));
    assert_holds(&paths, &expected, "the tarball");
}

#[test]
fn the_tarball_binaries_run_on_their_own() {
    let Some(built) = built("the_tarball_binaries_run_on_their_own") else {
        return;
    };
    let dir = TempDir::new("run");
    ok(Command::new("tar")
        .arg("-xzf")
        .arg(&built.tarball)
        .arg("-C")
        .arg(&dir.0));
    let bin = dir.0.join(format!("lb-{}/bin", built.version));
    // Nothing of the workspace or of cargo: no variable but PATH, cwd outside.
    let alone = |program: &str| {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .current_dir(&dir.0)
            .stdin(Stdio::null());
        cmd
    };
    // By name, as PATH finds it.
    let out = ok(alone("lb").arg("version"));
    let said = stdout(&out);
    print!("lb version:\n{said}");
    assert!(
        said.starts_with(&format!("lb {} ", built.version)),
        "`lb version` said {said:?}"
    );
    let out = ok(&mut alone("lb-cni"));
    let said = String::from_utf8_lossy(&out.stderr);
    print!("lb-cni:\n{said}");
    assert!(
        said.starts_with(&format!("CNI lb plugin v{}", built.version)),
        "lb-cni said {said:?} on stderr"
    );
    assert!(out.stdout.is_empty(), "lb-cni wrote on stdout: {out:?}");
}

#[test]
fn the_deb_installs_every_file_where_debian_looks_for_it() {
    let Some(built) = built("the_deb_installs_every_file_where_debian_looks_for_it") else {
        return;
    };
    let paths = deb_listing(built);
    let mut expected: Vec<String> = [
        "usr/bin/lb",
        "usr/lib/cni/lb-cni",
        "usr/lib/systemd/system/lb.service",
        "usr/share/bash-completion/completions/lb",
        "usr/share/zsh/vendor-completions/_lb",
        "usr/share/fish/vendor_completions.d/lb.fish",
        "usr/share/doc/lb/copyright",
        "usr/share/doc/lb/changelog.Debian.gz",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    expected.extend(
        MAN_PAGES
            .iter()
            .map(|p| format!("usr/share/man/man1/{p}.gz")),
    );
    assert_holds(&paths, &expected, "the .deb");
    // Every man page gzipped, and the same pages as the tarball's.
    let plain: Vec<&String> = (paths.iter())
        .filter(|p| p.starts_with("usr/share/man/") && p.ends_with(".1"))
        .collect();
    assert!(plain.is_empty(), "man pages not gzipped: {plain:?}");
    let tarball_pages = man_pages(
        &tar_listing(built),
        &format!("lb-{}/man/man1/", built.version),
    );
    assert_eq!(
        man_pages(&paths, "usr/share/man/man1/"),
        tarball_pages,
        "the .deb's man pages and the tarball's"
    );

    let field = |name: &str| {
        let out = ok(Command::new("dpkg-deb").arg("-f").arg(&built.deb).arg(name));
        stdout(&out).trim().to_owned()
    };
    assert_eq!(field("Package"), "lb");
    let version = field("Version");
    assert!(
        version.starts_with(&format!("{}-", built.version)),
        "Version: {version}, for lb {}",
        built.version
    );
    let depends = field("Depends");
    for needed in ["libc6", "nftables", "conntrack"] {
        assert!(
            depends
                .split(',')
                .any(|d| d.trim().split(' ').next() == Some(needed)),
            "Depends: {depends} (no {needed})"
        );
    }
    let info = stdout(&ok(Command::new("dpkg-deb").arg("-I").arg(&built.deb)));
    for script in ["postinst", "prerm", "postrm", "md5sums"] {
        assert!(
            info.contains(script),
            "no {script} in the control archive:\n{info}"
        );
    }
    let copyright = extract(built, "usr/share/doc/lb/copyright");
    for licence in [
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
        "License: MIT or Apache-2.0",
        "License: MIT or GPL-2",
        "Files: lb-ebpf/*",
    ] {
        assert!(
            copyright.contains(licence),
            "copyright has no {licence:?}:\n{copyright}"
        );
    }
}

/// A file of the .deb, read from `dpkg-deb --fsys-tarfile`.
fn extract(built: &Built, path: &str) -> String {
    let dir = TempDir::new("extract");
    ok(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&built.deb)
        .arg(&dir.0));
    std::fs::read_to_string(dir.0.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn lintian_finds_no_error_in_the_deb() {
    let Some(built) = built("lintian_finds_no_error_in_the_deb") else {
        return;
    };
    // --allow-root: lintian unpacks the package; as root it asks to be told that is meant.
    let out = Command::new("lintian")
        .args(["--allow-root", "--display-info", "--fail-on", "none"])
        .arg(&built.deb)
        .output()
        .expect("running lintian");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("lintian {}:\n{said}", built.deb.display());
    assert!(
        out.status.success(),
        "lintian failed ({}):\n{said}",
        out.status
    );
    let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("E: ")).collect();
    assert!(errors.is_empty(), "lintian errors:\n{}", errors.join("\n"));
}

/// A root for `systemd-analyze verify --root`: the host's units (the targets lb.service
/// orders itself against), then the artifact's files over them.
fn verify_root(what: &str) -> TempDir {
    let dir = TempDir::new(what);
    let units = dir.0.join("usr/lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    ok(Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system/."])
        .arg(&units));
    dir
}

/// `systemd-analyze verify --root ROOT lb.service`: passes, and says nothing of lb.service.
/// It runs `man` for each man: page of Documentation=, which looks in `man` (the artifact's
/// pages, not the host's).
fn verify(root: &Path, man: &Path, what: &str) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("lb.service")
        .env("MANPATH", man)
        .current_dir(root)
        .output()
        .expect("running systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    println!("systemd-analyze verify ({what}): {}{said}", out.status);
    assert!(
        out.status.success() && !said.contains("lb.service"),
        "systemd-analyze verify refuses {what}'s lb.service ({}):\n{said}",
        out.status
    );
}

/// The unit's `KEY=` value.
fn unit_value<'a>(unit: &'a str, key: &str) -> &'a str {
    (unit.lines())
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the unit has no {key}=:\n{unit}"))
}

/// Every man:PAGE(1) of the unit's Documentation= is among `pages`.
fn assert_documented(unit: &str, pages: &BTreeSet<String>, what: &str) {
    for doc in unit_value(unit, "Documentation").split_whitespace() {
        let page = (doc.strip_prefix("man:"))
            .and_then(|p| p.strip_suffix("(1)"))
            .unwrap_or_else(|| {
                panic!("{what}: Documentation={doc} is not a man page of section 1")
            });
        assert!(
            pages.contains(&format!("{page}.1")),
            "{what}: Documentation={doc}, a page it does not install"
        );
    }
}

#[test]
fn both_units_pass_systemd_analyze_verify_where_their_binary_is() {
    let Some(built) = built("both_units_pass_systemd_analyze_verify_where_their_binary_is") else {
        return;
    };
    // The .deb's, in a root holding the unpacked package; systemd's word first, then
    // where the unit must run lb from.
    let root = verify_root("verify-deb");
    ok(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&built.deb)
        .arg(&root.0));
    verify(&root.0, &root.0.join("usr/share/man"), "the .deb");
    let unit = std::fs::read_to_string(root.0.join("usr/lib/systemd/system/lb.service")).unwrap();
    assert!(
        unit_value(&unit, "ExecStart").starts_with("/usr/bin/lb daemon "),
        "the .deb's ExecStart: {}",
        unit_value(&unit, "ExecStart")
    );
    assert_documented(
        &unit,
        &man_pages(&deb_listing(built), "usr/share/man/man1/"),
        "the .deb",
    );

    // The tarball's, installed as docs/install.md says: bin/lb as /usr/local/bin/lb.
    let unpacked = TempDir::new("verify-tar-unpacked");
    ok(Command::new("tar")
        .arg("-xzf")
        .arg(&built.tarball)
        .arg("-C")
        .arg(&unpacked.0));
    let top = unpacked.0.join(format!("lb-{}", built.version));
    let root = verify_root("verify-tar");
    let unit = std::fs::read_to_string(top.join("lb.service")).unwrap();
    std::fs::create_dir_all(root.0.join("usr/local/bin")).unwrap();
    std::fs::create_dir_all(root.0.join("etc/systemd/system")).unwrap();
    std::fs::copy(top.join("bin/lb"), root.0.join("usr/local/bin/lb")).unwrap();
    std::fs::write(root.0.join("etc/systemd/system/lb.service"), &unit).unwrap();
    verify(&root.0, &top.join("man"), "the tarball");
    assert!(
        unit_value(&unit, "ExecStart").starts_with("/usr/local/bin/lb daemon "),
        "the tarball's ExecStart: {}",
        unit_value(&unit, "ExecStart")
    );
    assert_documented(
        &unit,
        &man_pages(
            &tar_listing(built),
            &format!("lb-{}/man/man1/", built.version),
        ),
        "the tarball",
    );
}

/// Every path under `root` but dpkg's own records (its database and log).
fn tree(root: &Path) -> BTreeSet<String> {
    let out = ok(Command::new("find").arg(".").current_dir(root));
    (stdout(&out).lines())
        .map(|p| p.trim_start_matches("./").to_owned())
        .filter(|p| p != "." && !p.starts_with("var/lib/dpkg/") && p != "var/log/dpkg.log")
        .collect()
}

#[test]
fn the_deb_installs_into_a_throwaway_root_and_its_purge_leaves_nothing() {
    const TEST: &str = "the_deb_installs_into_a_throwaway_root_and_its_purge_leaves_nothing";
    let Some(built) = built(TEST) else {
        return;
    };
    if !is_root() {
        skip(TEST, "needs root (dpkg installs as root)");
        return;
    }
    let root = TempDir::new("dpkg-root");
    // dpkg's database, empty, and the directories every Debian system has that the package's
    // scripts and its daemon write in: what is left beyond these is the package's.
    for dir in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/log",
        "etc/systemd/system",
        "var/lib/systemd",
        "run",
    ] {
        std::fs::create_dir_all(root.0.join(dir)).unwrap();
    }
    std::fs::write(root.0.join("var/lib/dpkg/status"), "").unwrap();
    let before = tree(&root.0);
    // The maintainer scripts run from the host (chrootless: the root has no shell), told
    // the root in DPKG_ROOT; the libraries and tools lb depends on are the host's business.
    let dpkg = |args: &[&str]| {
        let mut cmd = Command::new("dpkg");
        cmd.arg(format!("--root={}", root.0.display()))
            .args(["--force-script-chrootless", "--force-depends"])
            .arg(format!(
                "--log={}",
                root.0.join("var/log/dpkg.log").display()
            ))
            .args(args);
        let out = ok(&mut cmd);
        print!(
            "dpkg {args:?}:\n{}{}",
            stdout(&out),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    dpkg(&["--install", built.deb.to_str().unwrap()]);
    for installed in [
        "usr/bin/lb",
        "usr/lib/cni/lb-cni",
        "usr/lib/systemd/system/lb.service",
        "usr/share/man/man1/lb.1.gz",
    ] {
        assert!(root.0.join(installed).exists(), "{installed} not installed");
    }
    // postinst enabled the unit (in the root, as DPKG_ROOT told it).
    let wants = root
        .0
        .join("etc/systemd/system/multi-user.target.wants/lb.service");
    assert!(
        wants.symlink_metadata().is_ok(),
        "postinst did not enable lb.service: {} missing; the root holds:\n{}",
        wants.display(),
        tree(&root.0).into_iter().collect::<Vec<_>>().join("\n")
    );
    // What a daemon that ran would have left: its state and its runtime directory.
    for (dir, file) in [("var/lib/lb", "state.redb"), ("run/lb", "lb.sock.lock")] {
        std::fs::create_dir_all(root.0.join(dir)).unwrap();
        std::fs::write(root.0.join(dir).join(file), "").unwrap();
    }
    dpkg(&["--purge", "lb"]);
    let left: Vec<String> = tree(&root.0).difference(&before).cloned().collect();
    assert!(
        left.is_empty(),
        "the purge left behind:\n{}",
        left.join("\n")
    );
}
