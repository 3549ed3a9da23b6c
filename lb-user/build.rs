//! Builds the eBPF object (nightly, `-Z build-std=core`, bpf-linker) and leaves it in OUT_DIR,
//! where `lb_user::dataplane::ebpf::object()` embeds it: the `lb` binary carries its programs,
//! so what is loaded is always what was built with it.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    commit();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("lb-user has no parent directory")?
        .join("lb-ebpf");
    println!(
        "cargo:rerun-if-changed={}",
        root.join("../lb-common/src").display()
    );
    let root = root.to_str().context("lb-ebpf path is not UTF-8")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "lb-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .context("building the eBPF programs failed (run `cargo xtask setup` to install nightly rust-src and bpf-linker)")
}

/// `LB_COMMIT`, the commit built (`lb version`): `git describe` of the checkout, with
/// `-dirty` for uncommitted changes; `unknown` outside a git checkout (a source tarball).
fn commit() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let described = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .current_dir(dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=LB_COMMIT={}",
        described.as_deref().unwrap_or("unknown")
    );
    // Rebuilt when HEAD moves (a checkout, a commit); an edit without a commit shows on the
    // next build that happens for another reason.
    let git = dir.join("../.git");
    for f in ["HEAD", "index"] {
        if git.join(f).exists() {
            println!("cargo:rerun-if-changed={}", git.join(f).display());
        }
    }
}
