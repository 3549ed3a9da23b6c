//! The docs hold to the code: every shell block of README.md, DEVELOPING.md and docs/*.md is
//! run here or says why not, and every relative link between them leads to a file and, with
//! `#anchor`, to a heading of it.
//!
//! A shell block (` ```sh `, ` ```bash `, ` ```shell `) is marked by an HTML comment on the
//! line before its fence:
//! - `<!-- run -->`: run as it stands (root: it may load programs);
//! - `<!-- run: after first-five-minutes -->`: run on the README's quick-start node, each on
//!   a fresh one: the quick start's block, then this one, then the quick start's clean-up
//!   block (also when a block fails), with `$N` the prefix of every name they make;
//! - `<!-- not run: REASON -->`: shown, never run, for REASON;
//! - `<!-- first-five-minutes -->` and `<!-- first-five-minutes-cleanup -->` (README only):
//!   the quick start, which `first_five_minutes` runs and checks.
//!
//! Any other shell block, and a fence without a language (output samples are `text`), fails
//! `every_shell_block_is_run_or_marked`.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use lb_tests::require_root;

const SHELLS: [&str; 3] = ["sh", "bash", "shell"];
const FIVE: &str = "<!-- first-five-minutes -->";
const FIVE_CLEANUP: &str = "<!-- first-five-minutes-cleanup -->";
const RUN: &str = "<!-- run -->";
const AFTER_FIVE: &str = "<!-- run: after first-five-minutes -->";
const NOT_RUN: &str = "<!-- not run: ";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents, as paths relative to the workspace root: README.md, DEVELOPING.md, then
/// docs/*.md by name.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_owned(), "DEVELOPING.md".to_owned()];
    let mut more: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

fn read(doc: &str) -> String {
    std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("reading {doc}: {e}"))
}

/// A fenced block: where it opens (1-based), its language, the comment on the line before
/// its fence (if that line is one), and its text.
struct Block {
    line: usize,
    lang: String,
    marker: Option<String>,
    body: String,
}

fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - lines[i].trim_start().len();
        let marker = (i > 0)
            .then(|| lines[i - 1].trim())
            .filter(|l| l.starts_with("<!--") && l.ends_with("-->"))
            .map(str::to_owned);
        let start = i;
        i += 1;
        let mut body = String::new();
        while i < lines.len() && lines[i].trim() != "```" {
            body.push_str(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
            body.push('\n');
            i += 1;
        }
        assert!(
            i < lines.len(),
            "the block at line {} never ends",
            start + 1
        );
        out.push(Block {
            line: start + 1,
            lang: lang.trim().to_owned(),
            marker,
            body,
        });
        i += 1;
    }
    out
}

/// What is wrong with `doc`'s blocks, one line each.
fn problems(doc: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in blocks(text) {
        let at = format!("{doc}:{}", b.line);
        if b.lang.is_empty() {
            out.push(format!(
                "{at}: a fence without a language (an output sample is ```text)"
            ));
            continue;
        }
        if !SHELLS.contains(&b.lang.as_str()) {
            continue;
        }
        match b.marker.as_deref() {
            Some(RUN | AFTER_FIVE) => {}
            Some(FIVE | FIVE_CLEANUP) if doc == "README.md" => {}
            Some(m) if m.starts_with(NOT_RUN) => {
                let reason = m[NOT_RUN.len()..m.len() - "-->".len()].trim();
                if reason.len() < 10 {
                    out.push(format!("{at}: `not run` needs its reason, got {reason:?}"));
                }
            }
            other => out.push(format!(
                "{at}: a ```{} block that is neither run nor marked not run (the line before \
                 its fence is {:?}; mark it {RUN}, {AFTER_FIVE} or {NOT_RUN}REASON -->)",
                b.lang,
                other.unwrap_or("no comment"),
            )),
        }
    }
    out
}

#[test]
fn every_shell_block_is_run_or_marked() {
    let mut all = Vec::new();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for doc in documents() {
        let text = read(&doc);
        for b in blocks(&text)
            .iter()
            .filter(|b| SHELLS.contains(&b.lang.as_str()))
        {
            let kind = match b.marker.as_deref() {
                Some(m) if m.starts_with(NOT_RUN) => "not run".to_owned(),
                Some(m) => m.to_owned(),
                None => "unmarked".to_owned(),
            };
            *counts.entry(kind).or_default() += 1;
        }
        all.extend(problems(&doc, &text));
    }
    println!("shell blocks by marker: {counts:?}");
    assert!(all.is_empty(), "{}", all.join("\n"));
    // The quick start is there for first_five_minutes, and something runs here.
    assert_eq!(counts.get(FIVE), Some(&1), "{counts:?}");
    assert_eq!(counts.get(FIVE_CLEANUP), Some(&1), "{counts:?}");
    assert!(counts.get(AFTER_FIVE).is_some_and(|n| *n > 0), "{counts:?}");
}

#[test]
fn an_unmarked_block_and_a_bare_fence_are_found() {
    let text = "a\n\n```sh\nls\n```\n\n<!-- not run: -->\n```bash\nls\n```\n\n```\nout\n```\n\
                <!-- not run: a synopsis with placeholders -->\n```sh\nlb X\n```\n\
                ```json\n{}\n```\n  <!-- run -->\n  ```sh\n  true\n  ```\n";
    let found = problems("t.md", text);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].starts_with("t.md:3: a ```sh block"), "{found:#?}");
    assert!(
        found[1].starts_with("t.md:8: `not run` needs its reason"),
        "{found:#?}"
    );
    assert!(
        found[2].starts_with("t.md:12: a fence without"),
        "{found:#?}"
    );
    // An indented block loses its indentation.
    assert_eq!(blocks(text).last().unwrap().body, "true\n");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `text`'s headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `text`'s inline links `[..](target)` outside code blocks and spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn relative_links_lead_to_files_and_headings() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        let dir = Path::new(&doc).parent().unwrap().to_owned();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                PathBuf::from(&doc)
            } else {
                dir.join(file)
            };
            let full = root().join(&path);
            if !full.exists() {
                broken.push(format!("{doc}:{line}: {target}: no {}", path.display()));
                continue;
            }
            if !anchor.is_empty() {
                let heads = anchors(&std::fs::read_to_string(&full).unwrap_or_default());
                if !heads.contains(anchor) {
                    broken.push(format!(
                        "{doc}:{line}: {target}: no heading #{anchor} in {}",
                        path.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(slug(" Using the CLI"), "using-the-cli");
    assert_eq!(
        slug(" One-shot loading and inspecting the maps"),
        "one-shot-loading-and-inspecting-the-maps"
    );
    assert_eq!(
        slug(" containerd and Kubernetes `hostPort`"),
        "containerd-and-kubernetes-hostport"
    );
    assert_eq!(
        links("[a](b.md#c) `[x](y)` [d](../e.md)\n```\n[f](g)\n```\n"),
        vec![(1, "b.md#c".to_owned()), (1, "../e.md".to_owned())]
    );
}

/// Runs `script` with bash (`-e` unless `keep_going`) with the `lb` and `lb-cni` just built
/// first on PATH, `N` = `prefix`: whether it succeeded, and what it printed.
fn run(script: &str, prefix: &str, keep_going: bool) -> (bool, String) {
    let bin = Path::new(env!("CARGO_BIN_EXE_lb")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Bounded: a block whose background process kept stdout open would hang the test.
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
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The quick start's clean-up, run when dropped: nothing is left behind by a failed block.
struct Cleanup<'a> {
    script: &'a str,
    prefix: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let (ok, out) = run(self.script, &self.prefix, true);
        if !ok {
            eprintln!("clean-up of {} said:\n{out}", self.prefix);
        }
        for ns in ["node", "client", "b1", "b2"] {
            let left = Path::new("/run/netns").join(format!("{}-{ns}", self.prefix));
            if left.exists() && !std::thread::panicking() {
                panic!("the clean-up left {}", left.display());
            }
        }
    }
}

/// The README's quick start and its clean-up block.
fn quick_start() -> (String, String) {
    let readme = blocks(&read("README.md"));
    let find = |m: &str| {
        (readme.iter())
            .find(|b| b.marker.as_deref() == Some(m))
            .map(|b| b.body.clone())
            .unwrap_or_else(|| panic!("no {m} block in README.md"))
    };
    (find(FIVE), find(FIVE_CLEANUP))
}

/// The README's "First five minutes", run as it stands, a newcomer's first block, and what it
/// printed checked: where the requests went, the drain, the dry run, the tables.
#[test]
fn first_five_minutes() {
    if !require_root("first_five_minutes") {
        return;
    }
    let (five, cleanup) = quick_start();
    // Short: it names namespaces and a bpffs directory; unique per run.
    let prefix = format!("f{}", std::process::id() % 100_000);
    let guard = Cleanup {
        script: &cleanup,
        prefix: prefix.clone(),
    };
    let (ok, out) = run(&five, &prefix, false);
    let log = std::fs::read_to_string(format!("/tmp/{prefix}/daemon.log")).unwrap_or_default();
    println!("{out}");
    assert!(ok, "the block failed:\n{out}\ndaemon log:\n{log}");

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
    drop(guard);
    assert!(!Path::new(&format!("/sys/fs/bpf/{prefix}")).exists());
}

#[test]
fn runnable_blocks_run() {
    if !require_root("runnable_blocks_run") {
        return;
    }
    let (five, cleanup) = quick_start();
    let mut ran = 0;
    for doc in documents() {
        for (i, b) in blocks(&read(&doc)).into_iter().enumerate() {
            let at = format!("{doc}:{}", b.line);
            match b.marker.as_deref() {
                Some(RUN) => {
                    let prefix = format!("d{}r{i}", std::process::id() % 10_000);
                    let (ok, out) = run(&b.body, &prefix, false);
                    println!("== {at} (run)\n{out}");
                    assert!(ok, "{at} failed:\n{}\nit said:\n{out}", b.body);
                }
                Some(AFTER_FIVE) => {
                    let prefix = format!("d{}a{i}", std::process::id() % 10_000);
                    let guard = Cleanup {
                        script: &cleanup,
                        prefix: prefix.clone(),
                    };
                    let (ok, out) = run(&five, &prefix, false);
                    assert!(ok, "the quick start before {at} failed:\n{out}");
                    let (ok, out) = run(&b.body, &prefix, false);
                    let log = std::fs::read_to_string(format!("/tmp/{prefix}/daemon.log"))
                        .unwrap_or_default();
                    println!("== {at} (after first-five-minutes)\n{out}");
                    assert!(
                        ok,
                        "{at} failed:\n{}\nit said:\n{out}\ndaemon log:\n{log}",
                        b.body
                    );
                    drop(guard);
                }
                _ => continue,
            }
            ran += 1;
        }
    }
    assert!(ran > 0, "no block ran");
    println!("{ran} blocks ran");
}
