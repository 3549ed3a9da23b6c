//! `cargo xtask bench`: the release `lb` and `lb-bench`, then the benchmark run that writes
//! BENCHMARKS.md, bench/results.json and bench/ratios.svg.
use std::{path::PathBuf, process::Command};

use anyhow::{Result, bail};

use crate::{is_root, root, run, setup};

pub fn bench(quick: bool, out: Option<PathBuf>, dataplane: Vec<String>) -> Result<()> {
    if !is_root() {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    setup()?;
    crate::build::release_bins(&[("lb-tests", "lb-bench"), ("lb-user", "lb")])?;
    let release = root().join("target/release");
    let out = out.unwrap_or_else(|| {
        if quick {
            root().join("target/bench")
        } else {
            root()
        }
    });
    let mut bench = Command::new(release.join("lb-bench"));
    bench
        .arg("--lb")
        .arg(release.join("lb"))
        .arg("--out")
        .arg(out);
    if quick {
        bench.arg("--quick");
    }
    for dp in dataplane {
        bench.args(["--dataplane", &dp]);
    }
    run(&mut bench)
}
