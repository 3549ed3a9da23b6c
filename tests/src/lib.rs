//! Shared helpers of the root-only tests: the root guard, packet builders, netns guards, and
//! real traffic with operators' tools.

/// Whether a root-only test may run. Off root it prints why and returns false so the test can
/// return early; under `CI=true` (CI runs as root) an unprivileged run is a failure, never a
/// silent pass.
///
/// libtest counts a test that returns early as passed and captures what it printed, so a skip
/// is also recorded: one line with the test's name appended to the file [`SKIPS_ENV`] names,
/// from which `cargo xtask test` counts and names the skipped tests apart from the passed.
pub fn require_root(test: &str) -> bool {
    is_root()
        || skip(
            test,
            "needs root (BPF, netns); run `cargo xtask test` as root",
        )
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Says why `test` cannot run and records it as skipped (see [`require_root`]), returning
/// false for the test to return early; under `CI=true` fails it instead: any test that cannot
/// run what it checks (no root, a tool missing) goes through here.
pub fn skip(test: &str, why: &str) -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(!ci, "{test}: {why}, and CI=true forbids skipping it");
    eprintln!("{test}: SKIPPED: {why}");
    if let Some(path) = std::env::var_os(SKIPS_ENV) {
        use std::io::Write as _;
        // One write of one line to a file opened for appending: lines of tests running at once
        // do not interleave.
        let recorded = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{test}\n").as_bytes()));
        assert!(
            recorded.is_ok(),
            "{test}: recording the skip in {}: {recorded:?}",
            std::path::Path::new(&path).display()
        );
    }
    false
}

/// The environment variable naming the file skipped tests are recorded in (`cargo xtask test`
/// sets it).
pub const SKIPS_ENV: &str = "LB_TEST_SKIPS";

/// Polls `cond` every 50 ms until it holds, for at most `within`: how long it took, or `None`.
/// `within` only keeps a broken run from hanging; what a test asserts is that `cond` came to
/// hold, never how fast.
pub fn poll_until(
    within: std::time::Duration,
    mut cond: impl FnMut() -> bool,
) -> Option<std::time::Duration> {
    let start = std::time::Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= within {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub mod bench;
pub mod crc32c;
pub mod etcd;
pub mod firewall;
pub mod fixture;
pub mod fuzz;
pub mod netns;
pub mod packet;
pub mod plane;
pub mod scale;
pub mod storm;
pub mod switch;
pub mod tools;
pub mod traffic;

pub mod bpffs;
pub mod bpftool;
pub mod daemon;
pub mod demo;
