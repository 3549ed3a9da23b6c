//! Can this kernel run the programs? `--dataplane auto` asks by doing it: the real object is
//! loaded with private maps (LRU hash, per-CPU arrays: the map types it declares) and
//! `lb_xdp`, `lb_tc_ingress` and `lb_tc_egress` are put through the verifier (which checks
//! each helper they call), as an apply would, minus attaching. A kernel that refuses any of
//! it gets the nftables dataplane. The other programs (IPv6, reply, the socket hooks) are not
//! probed: the first apply loads them, and its error says which one the kernel refused.
//!
//! `LB_PROBE_FAIL=REASON` in the daemon's environment makes the probe fail with REASON without
//! asking the kernel: the documented way for tests (and operators trying the fallback) to
//! take the nftables path on a kernel that could run the programs.
use anyhow::{Context as _, Result, bail};
use aya::programs::{SchedClassifier, Xdp};

use super::ebpf::{EbpfNetwork, PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_XDP, TcMode};

pub const FORCE_FAIL_ENV: &str = "LB_PROBE_FAIL";

/// `Ok` with what was checked, or why the programs cannot run here.
pub fn probe(tc_mode: TcMode) -> Result<String> {
    if let Some(reason) = std::env::var_os(FORCE_FAIL_ENV) {
        bail!(
            "probe forced to fail by {FORCE_FAIL_ENV}: {}",
            reason.to_string_lossy()
        );
    }
    let mut dp = EbpfNetwork::unpinned()?;
    let ebpf = dp.ebpf_mut();
    let xdp: &mut Xdp = (ebpf.program_mut(PROG_XDP))
        .context("lb_xdp missing from the object")?
        .try_into()?;
    xdp.load().context("the verifier refuses lb_xdp")?;
    for name in [PROG_TC_INGRESS, PROG_TC_EGRESS] {
        let tc: &mut SchedClassifier = (ebpf.program_mut(name))
            .with_context(|| format!("{name} missing from the object"))?
            .try_into()?;
        tc.load()
            .with_context(|| format!("the verifier refuses {name}"))?;
    }
    Ok(format!(
        "the eBPF object loads and lb_xdp, lb_tc_ingress and lb_tc_egress pass the verifier; TC by {}",
        match tc_mode {
            TcMode::Tcx => "TCX links",
            TcMode::Netlink => "netlink clsact (kernel older than 6.6)",
        }
    ))
}
