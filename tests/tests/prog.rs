//! Program-level tests: the embedded object loads into this kernel and runs under
//! BPF_PROG_TEST_RUN. Root only.
use aya::{
    Ebpf,
    programs::{ProgramError, SchedClassifier, TestRun as _, TestRunOptions, TestRunResult, Xdp},
};
use lb_tests::{packet::Ipv4Packet, require_root};
use lb_user::dataplane::ebpf::{PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_XDP, object};

const XDP_PASS: u32 = 2;
/// `TC_ACT_UNSPEC` (-1): what is not ours goes on to the next program untouched.
const TC_ACT_UNSPEC: u32 = u32::MAX;

fn syn() -> Vec<u8> {
    Ipv4Packet::tcp(
        "10.0.0.1".parse().unwrap(),
        40000,
        "10.0.0.5".parse().unwrap(),
        80,
    )
    .build()
}

/// Runs `input` once (repeat 1: a repeated run would see its own rewritten output) and returns
/// the verdict and the bytes the program left.
fn run_once(
    name: &str,
    input: &[u8],
    run: impl FnOnce(TestRunOptions<'_>) -> Result<TestRunResult, ProgramError>,
) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; input.len() + 256];
    let res = run(TestRunOptions {
        data_in: Some(input),
        data_out: Some(&mut out),
        repeat: 1,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN of {name}: {e}"));
    println!(
        "{name}: BPF_PROG_TEST_RUN verdict {} ({} bytes out, {:?})",
        res.return_value, res.data_size_out, res.duration
    );
    out.truncate(res.data_size_out as usize);
    (res.return_value, out)
}

#[test]
fn xdp_program_loads_and_passes_a_packet_unchanged() {
    if !require_root("xdp_program_loads_and_passes_a_packet_unchanged") {
        return;
    }
    let mut ebpf = Ebpf::load(object()).expect("load the embedded object");
    let prog: &mut Xdp = ebpf
        .program_mut(PROG_XDP)
        .expect("lb_xdp in object")
        .try_into()
        .unwrap();
    prog.load().expect("verifier accepts lb_xdp");
    let input = syn();
    let (verdict, out) = run_once(PROG_XDP, &input, |o| prog.test_run(o));
    assert_eq!(verdict, XDP_PASS);
    assert_eq!(out, input);
}

#[test]
fn tc_programs_load_and_pass_a_packet_not_for_them_on_unchanged() {
    if !require_root("tc_programs_load_and_pass_a_packet_not_for_them_on_unchanged") {
        return;
    }
    let mut ebpf = Ebpf::load(object()).expect("load the embedded object");
    for name in [PROG_TC_INGRESS, PROG_TC_EGRESS] {
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .unwrap_or_else(|| panic!("{name} in object"))
            .try_into()
            .unwrap();
        prog.load()
            .unwrap_or_else(|e| panic!("verifier rejects {name}: {e}"));
        let input = syn();
        let (verdict, out) = run_once(name, &input, |o| prog.test_run(o));
        assert_eq!(verdict, TC_ACT_UNSPEC, "{name}");
        assert_eq!(out, input, "{name}");
    }
}

/// What each program costs the verifier (instructions it walked, time), printed so a change
/// that makes a program harder to verify shows in the log; the kernel's limit is a million.
#[test]
fn every_program_passes_the_verifier_and_says_what_it_cost() {
    if !require_root("every_program_passes_the_verifier_and_says_what_it_cost") {
        return;
    }
    let mut ebpf = Ebpf::load(object()).expect("load the embedded object");
    for name in [PROG_XDP, PROG_TC_INGRESS, PROG_TC_EGRESS] {
        let start = std::time::Instant::now();
        let info = match ebpf.program_mut(name).expect(name) {
            aya::programs::Program::Xdp(p) => {
                p.load().unwrap_or_else(|e| panic!("{name}: {e}"));
                p.info().unwrap()
            }
            aya::programs::Program::SchedClassifier(p) => {
                p.load().unwrap_or_else(|e| panic!("{name}: {e}"));
                p.info().unwrap()
            }
            _ => panic!("{name}: unexpected program type"),
        };
        println!(
            "{name}: verified {} instructions in {:?} ({} instructions)",
            info.verified_instruction_count().unwrap_or(0),
            start.elapsed(),
            info.size_translated().unwrap_or(0) / 8,
        );
    }
}
