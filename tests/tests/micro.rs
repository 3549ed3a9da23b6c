//! The program micro-benchmarks (`lb_tests::bench::packets`, which `cargo xtask bench`
//! reports in full) in one round: the kernel's time per packet of `lb_tc_ingress` and
//! `lb_xdp` for tracked flows and for flow creations, printed for the reader. No time is
//! asserted (a time is no test threshold on a shared machine). Root only.
use lb_tests::{bench::packets, require_root};

#[test]
fn ingress_programs_ns_per_packet_of_tracked_flows_and_flow_creations() {
    if !require_root("ingress_programs_ns_per_packet_of_tracked_flows_and_flow_creations") {
        return;
    }
    let table = packets::report(1).expect("the micro-benchmarks run");
    for case in ["tracked TCP flow", "tracked UDP flow", "new flow (TCP SYN)"] {
        for hook in ["tc ", "xdp "] {
            assert!(
                (table.lines()).any(|l| l.starts_with(hook) && l.contains(case)),
                "{hook}{case} in:\n{table}"
            );
        }
    }
}
