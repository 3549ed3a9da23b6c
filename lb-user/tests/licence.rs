//! The eBPF object's licence: what the kernel reads from its `license` section decides
//! whether the programs may call GPL-only helpers (`bpf_fib_lookup` on the fast path, the
//! `bpf_trace_printk` of aya-log). A string the kernel does not count as GPL-compatible would
//! fail the load, and `--dataplane auto` would quietly put every node on the nftables
//! fallback; so it is held here to the kernel's list (`license_is_gpl_compatible` in
//! include/linux/license.h) and to the licence lb-ebpf's Cargo.toml declares.

/// The strings the kernel takes as GPL-compatible.
const GPL_COMPATIBLE: [&str; 6] = [
    "GPL",
    "GPL v2",
    "GPL and additional rights",
    "Dual BSD/GPL",
    "Dual MIT/GPL",
    "Dual MPL/GPL",
];

#[test]
fn the_ebpf_object_carries_a_gpl_compatible_licence_matching_its_crate() {
    let object = aya_obj::Object::parse(lb_user::dataplane::ebpf::object())
        .expect("the embedded eBPF object parses");
    let licence = object.license.to_str().expect("an ASCII licence");
    assert!(
        GPL_COMPATIBLE.contains(&licence),
        "the kernel would refuse GPL-only helpers to a program licensed {licence:?}"
    );
    // lb-ebpf's Cargo.toml says the same in SPDX: Dual MIT/GPL is MIT OR GPL-2.0.
    let manifest = include_str!("../../lb-ebpf/Cargo.toml");
    let declared = (manifest.lines())
        .find_map(|l| l.strip_prefix("license = "))
        .expect("lb-ebpf declares its licence");
    assert_eq!(
        (licence, declared.trim_matches('"')),
        ("Dual MIT/GPL", "MIT OR GPL-2.0"),
        "the object's licence and the crate's"
    );
    // Each licence the crates name has its text in the repository.
    for file in ["LICENSE-MIT", "LICENSE-APACHE", "LICENSE-GPL-2.0"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(file);
        assert!(path.is_file(), "{} is missing", path.display());
    }
}
