//! The desired state's JSON Schema (`lb schema`) held against the parser
//! (`DesiredState::from_json`) with a real validator: every state example of the docs and every
//! state fixture of the tests passes both; documents broken one way at a time fail both; the
//! schema's address, name and number rules agree with the parser's value by value; and
//! docs/schema.md names every field the schema has. Pure: no root.
//!
//! A state example in the docs (the Markdown files at the top and in docs/) is a ```json block
//! right after a `<!-- state -->` line; an unmarked block that looks like a state (an object
//! with `networks` and nothing else) fails the test, so that no example escapes the check by
//! its marker being forgotten.
use std::path::{Path, PathBuf};

use jsonschema::Validator;
use lb_user::core::{model::DesiredState, model::parse_ip, schema};
use serde_json::{Value, json};

const STATE_MARKER: &str = "<!-- state -->";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn validator_of(schema: &Value) -> Validator {
    jsonschema::meta::validate(schema).expect("the schema is a valid draft 2020-12 schema");
    jsonschema::validator_for(schema).expect("the schema compiles")
}

fn validator() -> Validator {
    validator_of(&schema::desired_state().to_value())
}

/// The schema's first complaint about `doc`, if it has one.
fn schema_says(v: &Validator, doc: &Value) -> Option<String> {
    (v.iter_errors(doc).next()).map(|e| format!("{}: {e}", e.instance_path()))
}

fn parser_says(text: &str) -> Option<String> {
    DesiredState::from_json(text).err().map(|e| e.to_string())
}

/// Checks that `text` (named `what`) is a state both the schema and the parser accept, and so
/// is the canonical form the parser prints of it.
fn both_accept(v: &Validator, what: &str, text: &str) {
    let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"));
    let state = DesiredState::from_json(text)
        .unwrap_or_else(|e| panic!("{what}: the parser refuses it: {e}\n{text}"));
    if let Some(e) = schema_says(v, &doc) {
        panic!("{what}: the schema refuses it: {e}\n{text}");
    }
    let printed: Value = serde_json::from_str(&state.to_json()).unwrap();
    if let Some(e) = schema_says(v, &printed) {
        panic!("{what}: the schema refuses its canonical form: {e}\n{printed:#}");
    }
}

/// Whether `doc` looks like a desired state: an object with `networks` and no other key.
fn state_like(doc: &Value) -> bool {
    doc.as_object()
        .is_some_and(|o| o.contains_key("networks") && o.len() == 1)
}

/// Every ```json block of a Markdown text, with whether the line before it is the marker.
fn json_blocks(text: &str) -> Vec<(usize, bool, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "```json" {
            let marked = (lines[..i].iter().rev())
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.trim() == STATE_MARKER);
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].trim() == "```")
                .unwrap_or_else(|| panic!("the block at line {} never ends", i + 1));
            blocks.push((i + 1, marked, lines[i + 1..end].join("\n")));
            i = end;
        }
        i += 1;
    }
    blocks
}

/// The Markdown files at the top (README.md, DEVELOPING.md, …) and in docs/, wherever the docs
/// are at the time.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [repo(), repo().join("docs")] {
        let mut here: Vec<PathBuf> = (std::fs::read_dir(&dir).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        here.sort();
        files.extend(here);
    }
    assert!(files.iter().any(|f| f.ends_with("README.md")), "{files:?}");
    files
}

#[test]
fn every_state_example_in_the_docs_passes_schema_and_parser() {
    let v = validator();
    let mut checked = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(repo()).unwrap().display().to_string();
        for (line, marked, block) in json_blocks(&text) {
            let what = format!("{name}:{line}");
            if marked {
                both_accept(&v, &what, &block);
                checked.push(what);
            } else if serde_json::from_str::<Value>(&block).is_ok_and(|d| state_like(&d)) {
                panic!(
                    "{what} looks like a desired state: put {STATE_MARKER} on the line before it"
                );
            }
        }
    }
    println!("checked {}: {}", checked.len(), checked.join(", "));
    assert!(
        checked.iter().any(|w| w.starts_with("docs/schema.md:")),
        "docs/schema.md has no state example marked {STATE_MARKER}"
    );
}

/// Every file and directory under `dir`, recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The raw string literals (`r#"…"#`) of a Rust source.
fn raw_strings(source: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("r#\"") {
        let body = &rest[start + 3..];
        let Some(end) = body.find("\"#") else { break };
        out.push(&body[..end]);
        rest = &body[end + 2..];
    }
    out
}

#[test]
fn every_state_fixture_of_the_tests_passes_schema_and_parser() {
    let v = validator();
    let mut files = Vec::new();
    for dir in ["lb-user/tests", "tests"] {
        walk(&repo().join(dir), &mut files);
    }
    files.sort();
    let (mut fixtures, mut inline, mut refused) = (0, 0, Vec::new());
    for file in &files {
        let name = file.strip_prefix(repo()).unwrap().display().to_string();
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        if name.ends_with(".json") {
            let doc: Value = serde_json::from_str(&text).unwrap();
            if state_like(&doc) {
                both_accept(&v, &name, &text);
                fixtures += 1;
            }
        } else if name.ends_with(".rs") {
            // Inline states are valid fixtures and deliberately broken ones alike: whatever the
            // parser accepts, the schema must; what it refuses is listed, not judged (a test
            // breaks a document in ways a schema cannot see, as `schema_leaves_to_the_parser`).
            for literal in raw_strings(&text) {
                let Ok(doc) = serde_json::from_str::<Value>(literal) else {
                    continue;
                };
                if !state_like(&doc) {
                    continue;
                }
                if parser_says(literal).is_none() {
                    both_accept(&v, &name, literal);
                    inline += 1;
                } else if schema_says(&v, &doc).is_none() {
                    refused.push(name.clone());
                }
            }
        }
    }
    println!(
        "{fixtures} fixture files and {inline} inline states accepted by both; inline states \
         only the parser refuses: {refused:?}"
    );
    assert!(fixtures >= 1, "no state fixture file found (golden/*.json)");
    assert!(inline >= 1, "no inline state found in the tests' sources");
}

#[test]
fn lb_schema_prints_the_schema() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lb"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Not assert_eq: the schema is 19 kB on one line.
    assert!(
        printed == schema::desired_state().to_value(),
        "lb schema printed another schema than core::schema::desired_state():\n{printed:#}"
    );
    assert_eq!(
        printed["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "{printed:#}"
    );
}

/// A state with every kind of object and field, valid for both.
fn base() -> Value {
    json!({"networks": [
        {"name": "web", "interfaces": ["veth-lb", "br0"], "netns": "node", "mode": "nat",
         "attach": "tc", "masquerade": "auto", "fast_path": "auto", "hold_ports": "on",
         "timeouts": {"tcp_syn": 30, "tcp_established": 3600, "tcp_closing": 10,
                      "tcp_time_wait": 120, "tcp_unreplied": 5, "udp": 30},
         "services": [
            {"id": "api", "generation": "1", "vip": "10.99.0.10",
             "backends": [{"ip": "10.20.0.2"}, {"ip": "10.20.0.3", "disabled": true}],
             "ports": [{"proto": "tcp", "published": 8080, "target": 80, "host_ip": null}]},
            {"id": "dns", "vips": ["10.99.0.53", "fd99::53"],
             "backends": [{"ip": "10.20.0.5"}, {"ip": "fd20::5"}]}
         ]},
        {"name": "edge", "interfaces": ["eth1"], "netns": "/proc/1/ns/net", "mode": "dsr",
         "timeouts": {"dsr": 120},
         "services": [{"id": "web", "vip": "10.30.0.100", "backends": [{"ip": "10.30.0.10"}]}]}
    ]})
}

/// `doc` with the value at `pointer` set to `value` (the key added if absent, or the element
/// appended one past an array's end), or removed.
fn with(doc: &Value, pointer: &str, value: Option<Value>) -> Value {
    let mut doc = doc.clone();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = doc
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("{parent}"));
    match (parent, value) {
        (Value::Object(o), Some(v)) => {
            o.insert(key.to_owned(), v);
        }
        (Value::Object(o), None) => {
            o.remove(key).unwrap_or_else(|| panic!("no {pointer}"));
        }
        (Value::Array(a), Some(v)) => match key.parse::<usize>().unwrap() {
            i if i == a.len() => a.push(v),
            i => a[i] = v,
        },
        (Value::Array(a), None) => {
            a.remove(key.parse().unwrap());
        }
        _ => panic!("{pointer} is in neither an object nor an array"),
    }
    doc
}

const NET: &str = "/networks/0";
const SVC: &str = "/networks/0/services/0";
const DNS: &str = "/networks/0/services/1";
const PORT: &str = "/networks/0/services/0/ports/0";
const EDGE: &str = "/networks/1";

/// One change to the base document, named by where and what.
fn case(base: &Value, pointer: &str, value: Option<Value>) -> (String, Value) {
    let what = match &value {
        Some(v) => format!("{pointer} = {v}"),
        None => format!("{pointer} removed"),
    };
    (what, with(base, pointer, value))
}

/// Documents broken one way each: wrong types, unknown fields, bad keywords, missing fields,
/// ill-spelt values, numbers out of range, and the rules within one object.
fn broken(base: &Value) -> Vec<(String, Value)> {
    let at = |p: &str, f: &str| format!("{p}/{f}");
    let mut cases: Vec<(String, Option<Value>)> = vec![
        // Unknown fields, at every level.
        ("/bogus".into(), Some(json!(1))),
        (at(NET, "bogus"), Some(json!(1))),
        (at(NET, "timeouts/tcp_fin"), Some(json!(1))),
        (at(SVC, "weight"), Some(json!(1))),
        (at(SVC, "backends/0/weight"), Some(json!(2))),
        (at(PORT, "protocol"), Some(json!("tcp"))),
        // Wrong types.
        ("/networks".into(), Some(json!({}))),
        ("/networks".into(), Some(json!(null))),
        (at(NET, "name"), Some(json!(1))),
        (at(NET, "interfaces"), Some(json!("eth0"))),
        (at(NET, "netns"), Some(json!(5))),
        (at(NET, "mode"), Some(json!(null))),
        (at(NET, "timeouts"), Some(json!(null))),
        (at(NET, "timeouts/udp"), Some(json!("30"))),
        (at(NET, "services"), Some(json!(null))),
        (at(SVC, "id"), Some(json!(7))),
        (at(SVC, "generation"), Some(json!(null))),
        (at(SVC, "generation"), Some(json!(2))),
        (at(SVC, "vip"), Some(json!(10))),
        (at(DNS, "vips"), Some(json!("10.99.0.53"))),
        (at(SVC, "backends"), Some(json!(null))),
        (at(SVC, "backends/0"), Some(json!("10.20.0.2"))),
        (at(SVC, "backends/1/disabled"), Some(json!("yes"))),
        (at(SVC, "ports"), Some(json!(null))),
        (at(SVC, "ports/0"), Some(json!("tcp/8080:80"))),
        (at(PORT, "published"), Some(json!("8080"))),
        (at(PORT, "published"), Some(json!(80.5))),
        (at(PORT, "target"), Some(json!("80"))),
        // Keywords.
        (at(NET, "mode"), Some(json!("ipvs"))),
        (at(NET, "attach"), Some(json!("bpf"))),
        (at(NET, "masquerade"), Some(json!("sometimes"))),
        (at(NET, "fast_path"), Some(json!("maybe"))),
        (at(NET, "hold_ports"), Some(json!(true))),
        (at(PORT, "proto"), Some(json!("icmp"))),
        (at(PORT, "proto"), Some(json!("TCP"))),
        // Required fields.
        (at(NET, "name"), None),
        (at(NET, "interfaces"), None),
        (at(SVC, "id"), None),
        (at(SVC, "backends/0/ip"), None),
        (at(PORT, "proto"), None),
        (at(PORT, "published"), None),
        // Numbers out of range.
        (at(PORT, "published"), Some(json!(0))),
        (at(PORT, "published"), Some(json!(65536))),
        (at(PORT, "published"), Some(json!(-1))),
        (at(PORT, "target"), Some(json!(0))),
        (at(PORT, "target"), Some(json!(70000))),
        (at(NET, "timeouts/udp"), Some(json!(0))),
        (at(NET, "timeouts/tcp_syn"), Some(json!(604801))),
        (at(NET, "timeouts/tcp_syn"), Some(json!(-5))),
        (at(NET, "timeouts/tcp_syn"), Some(json!(4294967296u64))),
        // A session timeout on a `nat` network.
        (at(NET, "timeouts/dsr"), Some(json!(60))),
        // Names.
        (at(NET, "name"), Some(json!(""))),
        (at(NET, "name"), Some(json!(".."))),
        (at(NET, "name"), Some(json!("a b"))),
        (at(NET, "name"), Some(json!("web/1"))),
        (at(NET, "name"), Some(json!("w".repeat(33)))),
        (at(SVC, "id"), Some(json!("é"))),
        (at(SVC, "id"), Some(json!("."))),
        (at(SVC, "generation"), Some(json!("g".repeat(65)))),
        (at(SVC, "generation"), Some(json!(""))),
        // Interfaces and namespaces.
        (at(NET, "interfaces"), Some(json!([]))),
        (at(NET, "interfaces"), Some(json!(["eth0", "eth0"]))),
        (at(NET, "interfaces/0"), Some(json!(""))),
        (at(NET, "interfaces/0"), Some(json!("eth0:1"))),
        (at(NET, "interfaces/0"), Some(json!("my eth"))),
        (at(NET, "interfaces/0"), Some(json!("a\u{a0}b"))),
        (at(NET, "interfaces/0"), Some(json!("a\tb"))),
        (at(NET, "interfaces/0"), Some(json!("x".repeat(16)))),
        (at(NET, "interfaces/0"), Some(json!(".."))),
        (at(NET, "netns"), Some(json!(""))),
        (at(NET, "netns"), Some(json!("run/netns/node"))),
        (at(NET, "netns"), Some(json!("."))),
        (at(NET, "netns"), Some(json!("no\u{0}de"))),
        // A service's VIPs and what it serves.
        (at(SVC, "vips"), Some(json!(["10.99.0.11"]))),
        (
            at(DNS, "vips"),
            Some(json!(["10.99.0.53", "fd99::53", "10.99.0.54"])),
        ),
        (at(DNS, "vips"), Some(json!(["fd99::53", "fd99::53"]))),
        (at(DNS, "vips"), Some(json!([]))),
        (at(EDGE, "services/0/vip"), None),
        (at(EDGE, "services/0/vip"), Some(json!(null))),
        (
            at(SVC, "ports/1"),
            Some(base.pointer(PORT).unwrap().clone()),
        ),
    ];
    // Ill-spelt addresses, wherever an address goes.
    for ip in [
        "10.0.0.300",
        "10.0.0",
        "1.2.3.4.5",
        "010.0.0.1",
        "10.0.0.1/32",
        "10.0.0.1:80",
        "[10.0.0.1]",
        " 10.0.0.1",
        "fe80::1%eth0",
        "1::2::3",
        "1:2:3:4:5:6:7:8:9",
        "fd00::12345",
        "::ffff:1.2.3",
        "[fd00::1",
        "localhost",
    ] {
        for field in ["vip", "backends/0/ip", "ports/0/host_ip"] {
            cases.push((at(SVC, field), Some(json!(ip))));
        }
        cases.push((at(DNS, "vips/1"), Some(json!(ip))));
    }
    (cases.into_iter())
        .map(|(pointer, value)| case(base, &pointer, value))
        .collect()
}

#[test]
fn broken_documents_are_refused_by_schema_and_parser() {
    let v = validator();
    let base = base();
    both_accept(&v, "the base document", &base.to_string());
    let mut cases = broken(&base);
    for json in ["[]", "null", "1", "\"networks\""] {
        cases.push((json.to_owned(), serde_json::from_str(json).unwrap()));
    }
    let mut disagree = Vec::new();
    for (what, doc) in &cases {
        let (schema, parser) = (schema_says(&v, doc), parser_says(&doc.to_string()));
        println!("{what}\n  schema: {schema:?}\n  parser: {parser:?}");
        if schema.is_none() || parser.is_none() {
            let verdict = |c: &Option<String>| if c.is_some() { "refuses" } else { "accepts" };
            disagree.push(format!(
                "{what}: schema {}, parser {}",
                verdict(&schema),
                verdict(&parser)
            ));
        }
    }
    println!("{} broken documents", cases.len());
    assert!(
        disagree.is_empty(),
        "not refused by both:\n{}",
        disagree.join("\n")
    );
}

/// What a schema cannot see, across objects or by an address's class: the parser alone
/// refuses these (docs/schema.md states them). Listed so that the difference is known, and
/// so that a schema that learns one of them moves it to the broken documents above.
#[test]
fn schema_leaves_to_the_parser() {
    let v = validator();
    let base = base();
    let two_networks_one_interface = with(
        &with(&base, &format!("{EDGE}/netns"), Some(json!("node"))),
        &format!("{EDGE}/interfaces/0"),
        Some(json!("br0")),
    );
    let mut cases: Vec<(String, Value)> = [
        (format!("{EDGE}/name"), json!("web")),
        (format!("{SVC}/vip"), json!("224.0.0.1")),
        (format!("{SVC}/backends/0/ip"), json!("127.0.0.1")),
        (format!("{SVC}/backends/1/ip"), json!("10.20.0.2")),
        (format!("{SVC}/backends/0/ip"), json!("10.99.0.10")),
        (format!("{PORT}/host_ip"), json!("::1")),
        (format!("{DNS}/vips/1"), json!("10.99.0.54")),
        (format!("{SVC}/vip"), json!("fd99::10")),
        (format!("{DNS}/id"), json!("api")),
        (
            format!("{DNS}/ports"),
            json!([{"proto": "tcp", "published": 8080}]),
        ),
        (format!("{PORT}/published"), json!(8080.0)),
        (format!("{NET}/timeouts/udp"), json!(30.0)),
        // The schema counts characters where the kernel counts bytes.
        (format!("{NET}/interfaces/0"), json!("ééééééééé")),
    ]
    .into_iter()
    .map(|(pointer, value)| case(&base, &pointer, Some(value)))
    .collect();
    cases.push((
        "two networks, one interface".into(),
        two_networks_one_interface,
    ));
    let mut moved = Vec::new();
    for (what, doc) in cases {
        let parser = parser_says(&doc.to_string());
        let parser = parser.unwrap_or_else(|| panic!("{what}: the parser accepts it"));
        println!("{what}: only the parser refuses it: {parser}");
        if let Some(e) = schema_says(&v, &doc) {
            moved.push(format!("{what}: {e}"));
        }
    }
    assert!(
        moved.is_empty(),
        "the schema refuses these now: move them to the broken documents\n{}",
        moved.join("\n")
    );
}

/// A deterministic generator (xorshift64*): the same strings every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }

    /// A string of up to `max` characters of `alphabet`.
    fn string(&mut self, alphabet: &[char], max: usize) -> String {
        let len = self.below(max + 1);
        (0..len).map(|_| *self.pick(alphabet)).collect()
    }

    /// `s` with one to three characters inserted, removed or replaced from `alphabet`.
    fn mutate(&mut self, s: &str, alphabet: &[char]) -> String {
        let mut chars: Vec<char> = s.chars().collect();
        for _ in 0..=self.below(3) {
            let at = self.below(chars.len() + 1);
            match self.below(3) {
                0 => chars.insert(at, *self.pick(alphabet)),
                1 if at < chars.len() => drop(chars.remove(at)),
                _ if at < chars.len() => chars[at] = *self.pick(alphabet),
                _ => {}
            }
        }
        chars.into_iter().collect()
    }
}

/// The schema of one definition (`IpAddress`), with the others it may refer to.
fn definition(name: &str) -> Value {
    let root = schema::desired_state().to_value();
    json!({
        "$schema": root["$schema"],
        "$defs": root["$defs"],
        "$ref": format!("#/$defs/{name}"),
    })
}

#[test]
fn address_spellings_agree_with_the_parser() {
    let v = validator_of(&definition("IpAddress"));
    let alphabet: Vec<char> = "0123456789abcdefABCDEF:.[]% ".chars().collect();
    let seeds = [
        "10.0.0.1",
        "255.255.255.255",
        "0.0.0.0",
        "::",
        "::1",
        "fd00::1",
        "[fd00::1]",
        "1:2:3:4:5:6:7:8",
        "1:2:3:4:5:6:1.2.3.4",
        "::ffff:10.0.0.1",
        "64:ff9b::192.0.2.33",
        "1::8",
        "1:2:3:4:5:6:7::",
        "::2:3:4:5:6:7:8",
        "fe80::1%eth0",
        "0001:0db8:0000:0000:0000:0000:0000:0001",
    ];
    let mut rng = Rng(0x5eed_1b5c_4e3a_0001);
    let (mut accepted, mut total) = (0, 0);
    let mut check = |s: String| {
        let parser = parse_ip(&s).is_ok();
        let schema = v.is_valid(&json!(s));
        assert_eq!(schema, parser, "{s:?}: schema {schema}, parser {parser}");
        accepted += usize::from(parser);
        total += 1;
    };
    for seed in seeds {
        check(seed.to_owned());
        for _ in 0..1000 {
            check(rng.mutate(seed, &alphabet));
        }
    }
    for _ in 0..5000 {
        check(rng.string(&alphabet, 24));
    }
    // Every address printed in each of its spellings (Rust prints IPv4-mapped ones with an
    // embedded IPv4 address, others compressed).
    for _ in 0..2000 {
        let groups: [u16; 8] = std::array::from_fn(|_| match rng.below(3) {
            0 => 0,
            _ => rng.next() as u16,
        });
        let ip = std::net::Ipv6Addr::from(groups);
        check(ip.to_string());
        check(format!("[{ip}]"));
        check(groups.map(|g| format!("{g:04X}")).join(":"));
        check(std::net::Ipv4Addr::from(rng.next() as u32).to_string());
    }
    println!("{total} spellings, {accepted} addresses");
    assert!(
        accepted > 5000 && total - accepted > 5000,
        "{accepted} of {total}"
    );
}

/// Checks the schema and the parser agree on every value of `values` put at `pointer` of the
/// base document.
fn values_agree(pointer: &str, values: impl IntoIterator<Item = Value>) -> (usize, usize) {
    let v = validator();
    let base = base();
    let (mut accepted, mut total) = (0, 0);
    for value in values {
        let doc = with(&base, pointer, Some(value.clone()));
        let parser = parser_says(&doc.to_string());
        let schema = schema_says(&v, &doc);
        assert_eq!(
            schema.is_none(),
            parser.is_none(),
            "{pointer} = {value}: schema {schema:?}, parser {parser:?}"
        );
        accepted += usize::from(parser.is_none());
        total += 1;
    }
    (accepted, total)
}

#[test]
fn names_agree_with_the_parser() {
    let mut rng = Rng(0x5eed_0000_0000_0002);
    let alphabet: Vec<char> = "aZ09_.-/: \t\u{0}\u{7f}\u{a0}\u{85}\u{2028}\u{feff}é"
        .chars()
        .collect();
    let mut strings = |n: usize, max: usize| -> Vec<Value> {
        let mut out: Vec<Value> = ["", ".", "..", "...", "a", "/", "/x", "x/"]
            .iter()
            .map(|s| json!(s))
            .collect();
        out.extend((0..n).map(|_| json!(rng.string(&alphabet, max))));
        out.extend((0..n / 4).map(|_| json!("a".repeat(rng.below(max + 20)))));
        out
    };
    for (pointer, max) in [
        (format!("{NET}/name"), 40),
        (format!("{SVC}/id"), 70),
        (format!("{SVC}/generation"), 70),
        (format!("{NET}/interfaces/0"), 18),
        (format!("{NET}/netns"), 10),
    ] {
        let (accepted, total) = values_agree(&pointer, strings(2000, max));
        println!("{pointer}: {accepted} of {total} accepted");
        assert!(accepted > 10 && total - accepted > 10, "{pointer}");
    }
}

#[test]
fn numbers_agree_with_the_parser() {
    let edges = [
        -1i64, 0, 1, 2, 59, 65535, 65536, 604800, 604801, 4294967295, 4294967296,
    ];
    let values = || {
        edges
            .iter()
            .map(|n| json!(n))
            .chain([json!(null), json!(1.5), json!("1")])
    };
    for pointer in [
        format!("{PORT}/published"),
        format!("{PORT}/target"),
        format!("{NET}/timeouts/tcp_syn"),
        "/networks/1/timeouts/dsr".to_owned(),
    ] {
        let (accepted, total) = values_agree(&pointer, values());
        println!("{pointer}: {accepted} of {total} accepted");
    }
}

/// docs/schema.md is the reference: every field of every object the schema has is in it.
#[test]
fn the_reference_names_every_field() {
    let doc = std::fs::read_to_string(repo().join("docs/schema.md")).expect("docs/schema.md");
    let schema = schema::desired_state().to_value();
    let mut objects = vec![&schema];
    objects.extend(schema["$defs"].as_object().unwrap().values());
    let mut missing = Vec::new();
    for object in objects {
        for field in (object["properties"].as_object())
            .into_iter()
            .flat_map(|p| p.keys())
        {
            if !doc.contains(&format!("`{field}`")) {
                missing.push(field.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/schema.md does not name {missing:?}"
    );
}
