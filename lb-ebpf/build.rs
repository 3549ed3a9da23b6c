/// The object is linked by `bpf-linker`, which cargo does not know about: rebuild when the
/// linker binary changes (e.g. `cargo xtask setup` installed another version).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
