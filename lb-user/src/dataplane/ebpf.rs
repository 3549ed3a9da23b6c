//! The eBPF dataplane. The object is built by `build.rs` and embedded in the binary.

/// Names of the programs in the object, as `bpftool prog show` lists them.
pub const PROG_XDP: &str = "lb_xdp";
pub const PROG_TC_INGRESS: &str = "lb_tc_ingress";
pub const PROG_TC_EGRESS: &str = "lb_tc_egress";

/// The eBPF object this binary was built with.
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"))
}
