//! Builds the eBPF object (nightly, `-Z build-std=core`, bpf-linker) and leaves it in OUT_DIR,
//! where `lb_user::dataplane::ebpf::object()` embeds it: the `lb` binary carries its programs,
//! so what is loaded is always what was built with it.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
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
