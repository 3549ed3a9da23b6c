//! The shape a newcomer relies on, read from the sources (no root, nothing built): lb-ebpf's
//! modules import one another without a cycle, so each can be read after the ones it uses;
//! nothing under `lb-user/src/node/` reaches into `dataplane/`, so the node plumbing stays
//! below the dataplanes that drive it; and a file in `lb-user/src` longer than
//! [`LONG`] lines says in its opening comment why it is one file, in a line starting
//! `//! One file because`.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Past this many lines a file must say why it is not split.
const LONG: usize = 450;

/// The sentence that says why a long file is one file.
const WHY_ONE_FILE: &str = "//! One file because";

/// Long files exempted while others edit them: each still has to gain its line (or be split)
/// once their work is merged, and is dropped from here then. The test fails if one of them no
/// longer needs the exemption, so the list cannot outlive its reason.
const AWAITING: [&str; 0] = [];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `.rs` files under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `source` without its `//` comments (doc comments included), so prose naming a module
/// is not taken for a use of it. String literals are left alone: none of these rules is
/// about a path spelled inside one.
fn code(source: &str) -> String {
    (source.lines())
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = (s.find(|c: char| !(c.is_alphanumeric() || c == '_'))).unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of each item in the `{…}` group `s` opens (`s` starts after `{`).
fn group_heads(s: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let (mut depth, mut item_start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                heads.push(ident(s[item_start..i].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(ident(s[item_start..i].trim_start()));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    heads.retain(|h| !h.is_empty());
    heads
}

/// The top-level modules `source` names through `crate::` (`use crate::{a, b::C}`,
/// `crate::a::f()`).
fn crate_modules(source: &str) -> BTreeSet<String> {
    let code = code(source);
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = code[at + "crate::".len()..].trim_start();
        match rest.strip_prefix('{') {
            Some(group) => found.extend(group_heads(group).into_iter().map(str::to_owned)),
            None => _ = found.insert(ident(rest).to_owned()),
        }
    }
    found
}

/// lb-ebpf's module graph: each module file to the sibling modules it names. `main.rs` is
/// the root holding the entry points and `lib.rs` the host build's stub; neither is a node.
fn ebpf_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("lb-ebpf/src");
    let modules: BTreeSet<String> = (sources(&src).iter())
        .map(|p| p.file_stem().unwrap().to_str().unwrap().to_owned())
        .filter(|m| m != "main" && m != "lib")
        .collect();
    (modules.iter())
        .map(|m| {
            let source = fs::read_to_string(src.join(format!("{m}.rs"))).unwrap();
            let uses = (crate_modules(&source).into_iter())
                .filter(|u| u != m && modules.contains(u))
                .collect();
            (m.clone(), uses)
        })
        .collect()
}

/// One cycle in `graph` (its modules in import order, the first repeated at the end), if any.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    (graph.keys()).find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

#[test]
fn the_cycle_finder_finds_cycles_it_is_shown() {
    // The parser and the search, on a graph whose answer is known, so a clean lb-ebpf
    // cannot be the finder being blind.
    let uses = crate_modules(
        "use crate::{\n    a::{B, c::D},\n    e, // crate::f\n};\nfn g() { crate::h::i(); }",
    );
    assert_eq!(uses, ["a", "e", "h"].map(String::from).into());
    let graph = |edges: &[(&str, &str)]| {
        let mut g = BTreeMap::<String, BTreeSet<String>>::new();
        for (from, to) in edges {
            g.entry(from.to_string())
                .or_default()
                .insert(to.to_string());
        }
        g
    };
    assert_eq!(cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "b")])),
        Some(["b", "c", "b"].map(String::from).to_vec())
    );
}

#[test]
fn lb_ebpf_modules_import_one_another_without_a_cycle() {
    let graph = ebpf_graph();
    assert!(
        graph.len() > 5,
        "lb-ebpf's modules were not found: {graph:?}"
    );
    if let Some(cycle) = cycle(&graph) {
        panic!(
            "lb-ebpf has a module cycle: {}\nits import graph: {graph:#?}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn nothing_under_node_names_the_dataplanes() {
    let files = sources(&root().join("lb-user/src/node"));
    assert!(!files.is_empty(), "lb-user/src/node has no sources");
    let mut offenders = Vec::new();
    for file in files {
        let code = code(&fs::read_to_string(&file).unwrap());
        // A path through it anywhere, or the module itself imported (`use crate::{dataplane, …}`).
        let in_use = (code.split(';'))
            .filter_map(|s| s.trim_start().split_once("use ").map(|(_, u)| u))
            .any(|u| {
                (u.split(|c: char| !(c.is_alphanumeric() || c == '_'))).any(|w| w == "dataplane")
            });
        if in_use || code.contains("dataplane::") {
            offenders.push(file.strip_prefix(root()).unwrap().display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "node/ sits below the dataplanes and must not import them: {offenders:#?}"
    );
}

#[test]
fn a_long_file_says_why_it_is_one_file() {
    let src = root().join("lb-user/src");
    let mut unexplained = Vec::new();
    let mut awaiting_without_reason = Vec::new();
    for file in sources(&src) {
        let source = fs::read_to_string(&file).unwrap();
        let name = file
            .strip_prefix(&src)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let long = source.lines().count() > LONG;
        let says_why = (source.lines())
            .take_while(|l| l.starts_with("//!"))
            .any(|l| l.starts_with(WHY_ONE_FILE));
        let awaiting = AWAITING.contains(&name.as_str());
        if awaiting && (!long || says_why) {
            awaiting_without_reason.push(name);
        } else if long && !says_why && !awaiting {
            unexplained.push(format!("{name} ({} lines)", source.lines().count()));
        }
    }
    assert!(
        unexplained.is_empty(),
        "files over {LONG} lines without a `{WHY_ONE_FILE} …` line in their opening comment \
         (split them by concern, or say why not): {unexplained:#?}"
    );
    assert!(
        awaiting_without_reason.is_empty(),
        "no longer need the AWAITING exemption, drop them from it: {awaiting_without_reason:#?}"
    );
}
