//! Shared helpers of the root-only tests: the root guard, packet builders, netns guards, and
//! real traffic with operators' tools.

/// Whether a root-only test may run. Off root it prints why and returns false so the test can
/// return early; under `CI=true` (CI runs as root) an unprivileged run is a failure, never a
/// silent pass.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "{test}: needs root (BPF, netns), and CI=true forbids skipping it"
    );
    eprintln!("{test}: SKIPPED: needs root (BPF, netns); run `cargo xtask test` as root");
    false
}

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
pub mod fixture;
pub mod fuzz;
pub mod netns;
pub mod packet;
pub mod plane;
pub mod scale;
pub mod switch;
pub mod tools;
pub mod traffic;

pub mod bpffs;
pub mod bpftool;
pub mod daemon;
pub mod demo;
