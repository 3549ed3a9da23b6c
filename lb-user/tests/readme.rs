//! The README's "First five minutes", run as it stands: the block a newcomer copies, with
//! the `lb` just built first on `PATH` and a prefix of its own for what it makes, then its
//! clean-up block (also when the first fails). Root only.
use std::{path::Path, process::Command};

use lb_tests::require_root;

/// The first ```sh block after `marker` in the README.
fn block(readme: &str, marker: &str) -> String {
    let after = &readme[readme.find(marker).unwrap_or_else(|| panic!("no {marker}"))..];
    let start = after.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let len = after[start..].find("```").expect("the block ends");
    after[start..start + len].to_owned()
}

/// Runs `script` with bash (`-e` unless `keep_going`), returning what it printed.
fn run(script: &str, prefix: &str, keep_going: bool) -> (bool, String, String) {
    let lb_dir = Path::new(env!("CARGO_BIN_EXE_lb")).parent().unwrap();
    let path = format!(
        "{}:{}",
        lb_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A block whose background process kept stdout open would hang the test: bounded.
    let out = Command::new("timeout")
        .args([
            "300",
            "bash",
            if keep_going { "-u" } else { "-eu" },
            "-c",
            script,
        ])
        .env("PATH", path)
        .env("N", prefix)
        .env("LB_SOCKET", format!("/tmp/{prefix}/lb.sock"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the README's clean-up block when dropped, so a failed run leaves nothing behind.
struct Cleanup<'a> {
    script: String,
    prefix: &'a str,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let (ok, out, err) = run(&self.script, self.prefix, true);
        if !ok {
            eprintln!("clean-up said:\n{out}{err}");
        }
    }
}

#[test]
fn first_five_minutes() {
    if !require_root("first_five_minutes") {
        return;
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    let script = block(&readme, "<!-- first-five-minutes -->");
    // Short: it names namespaces and a bpffs directory; unique per run.
    let prefix = format!("f{}", std::process::id() % 100_000);
    let cleanup = Cleanup {
        script: block(&readme, "<!-- first-five-minutes-cleanup -->"),
        prefix: &prefix,
    };
    let (ok, out, err) = run(&script, &prefix, false);
    let log = std::fs::read_to_string(format!("/tmp/{prefix}/daemon.log")).unwrap_or_default();
    println!("{out}");
    assert!(ok, "the block failed:\n{out}\n{err}\ndaemon log:\n{log}");

    let counts: Vec<(u32, &str)> = (out.lines())
        .filter_map(|l| {
            // `uniq -c`'s lines: a count and a backend's page.
            let (n, who) = l.trim().split_once(' ')?;
            let who = who.trim();
            (who == "b1" || who == "b2").then_some((n.parse().ok()?, who))
        })
        .collect();
    // 20 requests over both backends, then 5 while b1 drains: b2 alone.
    assert_eq!(counts.len(), 3, "{out}");
    assert_eq!(counts[0].1, "b1", "{out}");
    assert_eq!(counts[1].1, "b2", "{out}");
    assert_eq!(counts[0].0 + counts[1].0, 20, "{out}");
    assert_eq!(counts[2], (5, "b2"), "{out}");
    for want in [
        "NETWORK  INTERFACES",
        "NETWORK  SERVICE  GENERATION  FRONTENDS",
        "~ backend 10.20.0.11 of service api generation 1 in web: active -> disabled",
        "dry run: nothing saved or applied; the change would make",
        "~ network web: masquerade: auto -> always",
        "\"dataplane\":",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    drop(cleanup);
    for ns in ["node", "client", "b1", "b2"] {
        assert!(
            !Path::new(&format!("/run/netns/{prefix}-{ns}")).exists(),
            "the clean-up removes {prefix}-{ns}"
        );
    }
    assert!(!Path::new(&format!("/sys/fs/bpf/{prefix}")).exists());
}
