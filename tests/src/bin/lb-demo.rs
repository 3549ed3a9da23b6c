//! The program behind `cargo xtask demo` (which builds it and passes the `lb` binary it built).
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

fn main() -> Result<()> {
    let lb: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .context("usage: lb-demo PATH_TO_LB (run it as `cargo xtask demo`)")?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the demo creates network namespaces and loads eBPF programs: run it as root \
             (sudo -E cargo xtask demo)"
        );
    }
    lb_tests::demo::run(&lb, 300, &mut std::io::stdout().lock())?;
    Ok(())
}
