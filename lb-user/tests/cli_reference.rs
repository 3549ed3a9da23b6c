//! `lb generate`: docs/cli.md is what the CLI's definition generates, and the man pages and
//! completions `cargo xtask dist` packages come out of it whole. Pure: no root, no daemon.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// `lb generate ARGS…`, with the variables the CLI reads unset (their values must not reach
/// the generated text): its stdout, after checking it succeeded.
fn generate(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lb"))
        .arg("generate")
        .args(args)
        .env_remove("LB_SOCKET")
        .env_remove("LB_CLUSTER")
        .env_remove("LB_CLUSTER_PREFIX")
        .output()
        .expect("running lb generate");
    assert!(
        out.status.success(),
        "lb generate {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A private empty directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("lb-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn docs_cli_md_is_what_the_cli_generates() {
    let generated = generate(&["cli-reference"]);
    let path = workspace().join("docs/cli.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == generated {
        return;
    }
    // The first line that differs, so the failure says where without a whole-file diff.
    let (line, (was, is)) = (committed.lines().chain(std::iter::repeat("<end of file>")))
        .zip(generated.lines().chain(std::iter::repeat("<end of file>")))
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, pair)| (i + 1, pair))
        .unwrap_or((0, ("", "")));
    panic!(
        "docs/cli.md is not what the CLI's definition generates (first difference at line \
         {line}:\n  docs/cli.md: {was}\n  generated:   {is}\n); regenerate it from the \
         workspace root with\n  {}\nand commit it",
        "cargo run -p lb-user --bin lb -- generate cli-reference > docs/cli.md"
    );
}

/// Every command of the reference: the `## lb …` headings.
fn commands(reference: &str) -> Vec<String> {
    (reference.lines())
        .filter_map(|l| l.strip_prefix("## lb"))
        .map(|rest| format!("lb{rest}"))
        .collect()
}

#[test]
fn the_reference_names_every_command_and_each_one_has_its_man_page() {
    let reference = generate(&["cli-reference"]);
    let commands = commands(&reference);
    for expected in [
        "lb",
        "lb daemon",
        "lb network add",
        "lb service backend enable",
    ] {
        assert!(
            commands.iter().any(|c| c == expected),
            "{expected} is not in the reference: {commands:?}"
        );
    }
    assert!(
        !commands.iter().any(|c| c.starts_with("lb generate")),
        "the hidden `lb generate` is in the reference"
    );
    let dir = TempDir::new("man");
    generate(&["man", dir.0.to_str().unwrap()]);
    let mut pages: Vec<String> = (std::fs::read_dir(&dir.0).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    let mut expected: Vec<String> = (commands.iter())
        .map(|c| format!("{}.1", c.replace(' ', "-")))
        .collect();
    expected.sort();
    assert_eq!(pages, expected, "one man page per command of the reference");
    let lb1 = std::fs::read_to_string(dir.0.join("lb.1")).unwrap();
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH FILES",
        "CNI PLUGIN",
        "SEE ALSO",
    ] {
        assert!(lb1.contains(section), "lb.1 has no {section}:\n{lb1}");
    }
    assert!(lb1.contains(r"lb\-cni"), "lb.1 does not mention lb-cni");
    let add = std::fs::read_to_string(dir.0.join("lb-network-add.1")).unwrap();
    assert!(add.contains(r"\-\-interface"), "{add}");
    // man(1) reads every page without a warning, where it is installed.
    if Command::new("man").arg("--version").output().is_ok() {
        for page in &pages {
            let out = Command::new("man")
                .args(["--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z"])
                .arg(dir.0.join(page))
                .env("LC_ALL", "C.UTF-8")
                .output()
                .unwrap();
            let warnings = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && warnings.trim().is_empty(),
                "man --warnings {page}: {warnings}"
            );
        }
    }
}

#[test]
fn completions_are_written_for_bash_zsh_and_fish_without_hidden_commands() {
    let dir = TempDir::new("completions");
    generate(&["completions", dir.0.to_str().unwrap()]);
    for file in ["lb.bash", "_lb", "lb.fish"] {
        let text =
            std::fs::read_to_string(dir.0.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for word in ["network", "service", "backend", "interface", "nftables"] {
            assert!(text.contains(word), "{file} does not complete {word}");
        }
        assert!(!text.contains("generate"), "{file} completes `lb generate`");
    }
    // bash parses its script (bash is everywhere lb runs).
    let out = Command::new("bash")
        .arg("-n")
        .arg(dir.0.join("lb.bash"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash -n lb.bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn generate_refuses_what_it_does_not_know_as_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_lb"))
        .args(["generate", "pdf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
