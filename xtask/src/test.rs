//! `cargo xtask test`: formatting, clippy, then every test, counted over all test binaries
//! with the skipped ones (not root) told apart from the passed.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, ci, is_root, root, run, show};

pub fn test(extra: &[String]) -> Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--locked",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Root-only tests refuse to pass silently when not root under CI=true; say it up front too.
    if !is_root() {
        eprintln!(
            "xtask: not running as root: program-level and netns tests will say they are skipped"
        );
    }
    // A root-only test that cannot run returns early, which libtest counts as passed; it
    // records its name here (lb_tests::require_root) so that it is counted as skipped.
    let skips = root().join("target/xtask-skipped-tests");
    match std::fs::remove_file(&skips) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", skips.display())),
    }
    // Doc-tests would close the run on a "0 passed" block; the crates have none to run.
    let mut cmd = cargo();
    cmd.args(["test", "--locked", "--all-targets", "--no-fail-fast"])
        .args(extra)
        .env(SKIPS_ENV, &skips);
    let TestRun {
        passed,
        failed,
        times,
    } = run_counting(&mut cmd)?;
    print_times(&times);
    let skipped = match std::fs::read_to_string(&skips) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", skips.display())),
    };
    let counted = Counted::new(passed, failed, skipped);
    println!("{}", counted.summary());
    counted.verdict(ci())
}

/// The environment variable `lb_tests::require_root` records skipped tests by.
const SKIPS_ENV: &str = "LB_TEST_SKIPS";

/// A test run's outcome: libtest's counts, with the tests that skipped taken out of its
/// passed.
#[derive(Debug, PartialEq, Eq)]
struct Counted {
    passed: u64,
    failed: u64,
    /// The names of the skipped tests, as they recorded themselves.
    skipped: Vec<String>,
}

impl Counted {
    fn new(passed: u64, failed: u64, mut skipped: Vec<String>) -> Counted {
        skipped.sort();
        Counted {
            passed: passed.saturating_sub(skipped.len() as u64),
            failed,
            skipped,
        }
    }

    fn summary(&self) -> String {
        let mut s = format!(
            "xtask test: {} passed, {} failed, {} skipped",
            self.passed,
            self.failed,
            self.skipped.len()
        );
        if !self.skipped.is_empty() {
            s += "\nxtask test: skipped (not run as root):";
            for name in &self.skipped {
                s += &format!("\n  {name}");
            }
        }
        s
    }

    /// An error for failed tests, and under CI for skipped ones: CI runs every test.
    fn verdict(&self, ci: bool) -> Result<()> {
        if self.failed > 0 {
            bail!("{} tests failed", self.failed);
        }
        if ci && !self.skipped.is_empty() {
            bail!(
                "{} tests skipped, and CI=true runs every test (as root)",
                self.skipped.len()
            );
        }
        Ok(())
    }
}

/// Runs `cargo test`, passing its output through, and adds up its `test result:` lines so the
/// run ends with one total rather than the last test binary's count. Also times each test
/// binary, from cargo's `Running ...` line (stderr) to the binary's `test result:` line
/// (stdout). Both pipes are read on threads of their own into one channel: the lines of the
/// two streams arrive in the order they were written, give or take the microseconds between
/// a write and its reader, which cannot reorder a binary's start and its result.
fn run_counting(cmd: &mut Command) -> Result<TestRun> {
    use std::io::{BufRead as _, BufReader, Read};
    use std::sync::mpsc;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("failed to start {}", show(cmd)))?;
    let (tx, rx) = mpsc::channel();
    let forward = |pipe: Box<dyn Read + Send>, stderr: bool| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                if tx.send((stderr, line)).is_err() {
                    return;
                }
            }
        })
    };
    let readers = [
        forward(Box::new(child.stdout.take().expect("piped stdout")), false),
        forward(Box::new(child.stderr.take().expect("piped stderr")), true),
    ];
    // The channel ends when both readers have.
    drop(tx);
    let (mut passed, mut failed) = (0, 0);
    let mut timer = BinaryTimer::default();
    for (stderr, line) in rx {
        let line = line.context("reading cargo test output")?;
        let now = Instant::now();
        if stderr {
            eprintln!("{line}");
            timer.cargo_line(&line, now);
            continue;
        }
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            timer.result_line(now);
            let count = |what: &str| -> u64 {
                rest.split(';')
                    .filter_map(|part| part.trim().rsplit_once(' '))
                    .find(|(_, name)| name.trim_end_matches('.') == what)
                    .and_then(|(n, _)| n.rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            };
            passed += count("passed");
            failed += count("failed");
        }
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() && failed == 0 {
        bail!("{} failed ({status})", show(cmd));
    }
    Ok(TestRun {
        passed,
        failed,
        times: timer.finish(Instant::now()),
    })
}

/// What a `cargo test` run counted: tests passed and failed over every binary, and each
/// binary's wall time in the order they ran.
struct TestRun {
    passed: u64,
    failed: u64,
    times: Vec<(String, Duration)>,
}

/// The wall time of each test binary of a `cargo test` run, in the order they ran.
#[derive(Default)]
struct BinaryTimer {
    running: Option<(String, Instant)>,
    done: Vec<(String, Duration)>,
}

impl BinaryTimer {
    /// A line cargo printed on stderr: `Running ...` and `Doc-tests ...` start a binary (and
    /// end the one before, if it died before its `test result:`).
    fn cargo_line(&mut self, line: &str, now: Instant) {
        if let Some(binary) = test_binary(line) {
            self.end(now);
            self.running = Some((binary, now));
        }
    }

    /// A binary's `test result:` line: it is done.
    fn result_line(&mut self, now: Instant) {
        self.end(now);
    }

    fn end(&mut self, now: Instant) {
        if let Some((binary, started)) = self.running.take() {
            self.done.push((binary, now - started));
        }
    }

    fn finish(mut self, now: Instant) -> Vec<(String, Duration)> {
        self.end(now);
        self.done
    }
}

/// The test binary a cargo status line starts, named by its source and its crate or test name
/// without cargo's hash: `     Running tests/tools.rs (target/debug/deps/tools-ecc3...)` is
/// `tests/tools.rs (tools)`, `     Running unittests src/lib.rs (target/debug/deps/lb_user-1f...)`
/// is `unittests src/lib.rs (lb_user)`.
fn test_binary(line: &str) -> Option<String> {
    let line = line.trim();
    if line.starts_with("Doc-tests ") {
        return Some(line.to_owned());
    }
    let rest = line.strip_prefix("Running ")?;
    let Some((source, path)) = rest.rsplit_once(" (") else {
        return Some(rest.to_owned());
    };
    let file = path
        .trim_end_matches(')')
        .rsplit('/')
        .next()
        .unwrap_or(path);
    let name = match file.rsplit_once('-') {
        Some((name, hash)) if !hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            name
        }
        _ => file,
    };
    Some(format!("{source} ({name})"))
}

/// The binaries' wall times, longest first.
fn print_times(times: &[(String, Duration)]) {
    if times.is_empty() {
        return;
    }
    let mut times = times.to_vec();
    times.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!("xtask test: wall time per test binary, longest first");
    for (binary, time) in &times {
        println!("{:>9.1} s  {binary}", time.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_running_lines_name_the_binary_without_its_hash() {
        let cases = [
            (
                "     Running tests/tools.rs (target/debug/deps/tools-ecc376998a43aaf1)",
                Some("tests/tools.rs (tools)"),
            ),
            (
                "     Running unittests src/lib.rs (target/debug/deps/lb_user-1f0e2d3c4b5a6978)",
                Some("unittests src/lib.rs (lb_user)"),
            ),
            (
                "     Running unittests src/main.rs (target/debug/deps/xtask-0123456789abcdef)",
                Some("unittests src/main.rs (xtask)"),
            ),
            ("   Doc-tests lb_common", Some("Doc-tests lb_common")),
            ("   Compiling lb-tests v0.1.0 (/work/tests)", None),
            ("running 6 tests", None),
        ];
        for (line, binary) in cases {
            assert_eq!(test_binary(line).as_deref(), binary, "{line:?}");
        }
    }

    #[test]
    fn a_binary_runs_from_its_running_line_to_its_result_or_the_next_binary() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut timer = BinaryTimer::default();
        timer.cargo_line("   Compiling lb-tests v0.1.0", at(0));
        timer.cargo_line("     Running tests/a.rs (target/debug/deps/a-0a)", at(100));
        timer.result_line(at(1100));
        // Crashes before its result line: it ends where the next binary starts.
        timer.cargo_line("     Running tests/b.rs (target/debug/deps/b-0b)", at(1200));
        timer.cargo_line("     Running tests/c.rs (target/debug/deps/c-0c)", at(1500));
        timer.result_line(at(1600));
        // A stray result line (none running) times nothing.
        timer.result_line(at(1700));
        timer.cargo_line("     Running tests/d.rs (target/debug/deps/d-0d)", at(2000));
        let ms = |d: Duration| d.as_millis();
        let times: Vec<(String, u128)> = (timer.finish(at(2500)).into_iter())
            .map(|(b, d)| (b, ms(d)))
            .collect();
        let expected = [("a", 1000), ("b", 300), ("c", 100), ("d", 500)]
            .map(|(n, t)| (format!("tests/{n}.rs ({n})"), t));
        assert_eq!(times, expected);
    }

    #[test]
    fn skipped_tests_are_counted_apart_from_the_passed_and_fail_under_ci() {
        let run = Counted::new(10, 0, vec!["b_test".into(), "a_test".into()]);
        assert_eq!(
            run.summary(),
            "xtask test: 8 passed, 0 failed, 2 skipped\nxtask test: skipped (not run as root):\n  a_test\n  b_test"
        );
        assert!(run.verdict(false).is_ok());
        let err = run.verdict(true).unwrap_err().to_string();
        assert!(err.contains("2 tests skipped"), "{err}");
        let clean = Counted::new(10, 0, Vec::new());
        assert_eq!(
            clean.summary(),
            "xtask test: 10 passed, 0 failed, 0 skipped"
        );
        assert!(clean.verdict(true).is_ok());
        assert!(Counted::new(9, 1, Vec::new()).verdict(false).is_err());
    }
}
