//! The `lb` CLI as an operator meets it, the real binary against a real daemon: output piped
//! into a reader that goes away, each exit code (0 applied, 1 refused, 2 usage, 3 accepted but
//! not applied, 4 daemon unreachable or not permitted), errors as JSON under `--json`, global
//! options before or after the command, `apply -f -`, a dry run that changes nothing, the
//! difference every apply prints (exactly what changed), headed tables and their JSON. Root only
//! (the daemon programs a dataplane).
use std::{
    net::Ipv4Addr,
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::{Command, Output, Stdio},
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{FailingNft, LbDaemon, Run, network_add, service_set},
    netns::Topology,
    require_root,
    tools::output_with_stdin,
    traffic::{TIMEOUT, spawn_backends, tcp_request},
};
use lb_user::core::{
    diff::{Change, Kind, Op},
    model::DesiredState,
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const NET: &str = "clinet";

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// `lb ARGS` with `stdin` on its standard input.
fn lb_stdin(d: &LbDaemon, args: &[&str], stdin: &str) -> Run {
    output_with_stdin(
        Command::new(lb())
            .args(args)
            .arg("--socket")
            .arg(d.socket()),
        stdin.as_bytes(),
    )
    .unwrap()
    .into()
}

/// The error `lb --json` wrote on stderr, checked to carry the exit code it exited with.
fn json_error(r: &Run) -> String {
    let v: Value = serde_json::from_str(r.stderr.trim())
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {r:?}"));
    assert_eq!(v["exit_code"].as_i64(), r.code.map(i64::from), "{r:?}");
    v["error"].as_str().expect("an error message").to_owned()
}

fn state(d: &LbDaemon) -> DesiredState {
    DesiredState::from_json(&d.ok(&["state"])).unwrap()
}

fn changes(out: &str) -> Vec<Change> {
    let v: Value = serde_json::from_str(out).unwrap();
    serde_json::from_value(v["changes"].clone()).unwrap()
}

/// A change as the test expects it.
fn change(
    op: Op,
    kind: Kind,
    service: Option<&str>,
    backend: Option<Ipv4Addr>,
    detail: &[&str],
) -> Change {
    Change {
        op,
        kind,
        network: NET.into(),
        service: service.map(String::from),
        generation: service.map(|_| "1".to_owned()),
        backend: backend.map(Into::into),
        detail: detail.iter().map(|d| d.to_string()).collect(),
    }
}

/// A client whose reader goes away ends as `head` leaves any Unix tool: killed by SIGPIPE (or
/// done, if everything fit before), never a Rust panic.
fn assert_ends_quietly_on_a_closed_pipe(d: &LbDaemon, args: &[&str]) {
    let mut child = Command::new(lb())
        .args(args)
        .arg("--socket")
        .arg(d.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before lb writes a byte.
    drop(child.stdout.take());
    let Output { status, stderr, .. } = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(
        status.signal() == Some(libc::SIGPIPE) || status.code() == Some(0),
        "lb {args:?} into a closed pipe: {status:?} {stderr}"
    );
    assert!(!stderr.contains("panicked"), "lb {args:?}: {stderr}");
}

#[test]
fn exit_codes_json_errors_pipes_and_global_options() {
    if !require_root("exit_codes_json_errors_pipes_and_global_options") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let nft = FailingNft::new().unwrap();
    let d = nft.start_daemon(lb(), bpffs.path()).unwrap();

    // 0: applied; global options before the command, -j, the ls alias, a headed table.
    d.ok(&network_add(&topo, NET));
    let socket = d.socket();
    let socket = socket.to_str().unwrap();
    let listed = Command::new(lb())
        .args(["--socket", socket, "-j", "network", "ls"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let v: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(v[0]["name"], NET, "{v}");
    let table = d.ok(&["network", "ls"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NETWORK",
            "INTERFACES",
            "NETNS",
            "MODE",
            "ATTACH",
            "MASQUERADE",
            "SERVICES"
        ],
        "{table}"
    );
    assert!(table.lines().nth(1).unwrap().starts_with(NET), "{table}");
    // An empty list prints its header.
    let empty = d.ok(&["service", "ls"]);
    assert_eq!(empty.lines().count(), 1, "{empty}");
    assert!(empty.starts_with("NETWORK  SERVICE"), "{empty}");

    // Output into a reader that went away.
    for args in [&["state"][..], &["status", "--json"], &["network", "ls"]] {
        assert_ends_quietly_on_a_closed_pipe(&d, args);
    }

    // 1: refused, nothing changed; under --json the error is JSON on stderr.
    let before = state(&d);
    let r = d.cli(&["service", "rm", NET, "nosuch", "--json"]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        json_error(&r).contains("has no service \"nosuch\""),
        "{r:?}"
    );
    let r = d.cli(&["network", "add", NET, "--interface", "x"]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr.starts_with("lb: network \"clinet\" exists"),
        "{r:?}"
    );
    assert_eq!(state(&d), before, "nothing changed");

    // 2: usage, from clap and from a value lb cannot read; nothing asked.
    let r = d.cli(&["network", "add", "other"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("--interface"), "{r:?}");
    let r = d.cli(&["service", "set", NET, "a", "--backend", "10.0.0.300", "-j"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(json_error(&r).contains("--backend 10.0.0.300"), "{r:?}");
    let r = d.cli(&[
        "network",
        "add",
        "other",
        "--interface",
        "x",
        "--mode",
        "fast",
    ]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("[possible values: nat, dsr]"), "{r:?}");
    let r = d.cli(&["-j", "network", "add", "other", "--mode", "fast"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        json_error(&r).contains("invalid value 'fast' for '--mode <MODE>'"),
        "{r:?}"
    );
    assert_eq!(state(&d), before, "nothing changed");

    // 3: accepted, not applied yet (the dataplane fails); `apply --wait` gives up with 3, and
    // returns 0 once the daemon's retry gets through.
    nft.fail(true).unwrap();
    let set = service_set(NET, "api", "1", VIP, "tcp/18080:80", &topo.backend_ips);
    let r = d.cli(&set);
    assert_eq!(r.code, Some(3), "{r:?}");
    assert!(
        r.stderr
            .contains("saved, but network clinet is not applied yet"),
        "{r:?}"
    );
    let mut wanted = state(&d);
    wanted.networks[0].services[0].backends.truncate(1);
    let r = lb_stdin(
        &d,
        &["apply", "-f", "-", "--wait", "2", "-j"],
        &wanted.to_json(),
    );
    assert_eq!(r.code, Some(3), "{r:?}");
    assert!(json_error(&r).contains("not applied after 2s"), "{r:?}");
    nft.fail(false).unwrap();
    let r = lb_stdin(&d, &["apply", "-f", "-", "--wait", "30"], &wanted.to_json());
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(d.network_status(NET)["applied"].as_bool().unwrap());

    // 4: no daemon at the socket; a user the socket does not let in.
    let r: Run = Command::new(lb())
        .args(["status", "--socket", "/nonexistent/lb.sock", "--json"])
        .output()
        .unwrap()
        .into();
    assert_eq!(r.code, Some(4), "{r:?}");
    assert!(
        json_error(&r).contains("no socket at /nonexistent/lb.sock"),
        "{r:?}"
    );
    let r: Run = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(lb())
        .args(["status", "--socket", socket])
        .output()
        .unwrap()
        .into();
    assert_eq!(r.code, Some(4), "{r:?}");
    assert!(
        r.stderr.contains("not permitted to reach the daemon"),
        "{r:?}"
    );
    assert!(r.stderr.contains("mode 0600, owner uid 0"), "{r:?}");
}

#[test]
fn apply_prints_exactly_what_changed_and_a_dry_run_changes_nothing() {
    if !require_root("apply_prints_exactly_what_changed_and_a_dry_run_changes_nothing") {
        return;
    }
    let topo = Topology::new(3).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    d.ok(&network_add(&topo, NET));
    let [b0, b1, b2] = [0, 1, 2].map(|i| topo.backend_ips[i]);
    let mut set = service_set(NET, "api", "1", VIP, "tcp/18080:80", &[b0, b1]);
    set.push("-j".into());
    let out = d.ok(&set);
    assert_eq!(
        changes(&out),
        [
            change(Op::Added, Kind::Service, Some("api"), None, &[]),
            change(Op::Added, Kind::Backend, Some("api"), Some(b0), &[]),
            change(Op::Added, Kind::Backend, Some("api"), Some(b1), &[]),
        ]
    );
    let web = Ipv4Addr::new(10, 99, 0, 11);
    d.ok(&service_set(NET, "web", "1", web, "tcp/18081:80", &[b2]));

    // One file that changes a network setting, adds and disables a backend, removes another
    // and a whole service, and publishes one more port.
    let before = state(&d);
    let mut next = before.clone();
    let net = &mut next.networks[0];
    net.masquerade = "always".parse().unwrap();
    net.services.retain(|s| s.id != "web");
    let api = &mut net.services[0];
    api.backends[0].disabled = true;
    api.backends.retain(|b| b.ip != b1);
    api.backends.push(lb_user::core::model::Backend {
        ip: b2.into(),
        disabled: false,
    });
    api.ports.push("udp/15353:53".parse().unwrap());
    let expected = vec![
        change(
            Op::Changed,
            Kind::Network,
            None,
            None,
            &["masquerade: auto -> always"],
        ),
        change(
            Op::Changed,
            Kind::Service,
            Some("api"),
            None,
            &["ports: +udp/15353:53"],
        ),
        change(
            Op::Changed,
            Kind::Backend,
            Some("api"),
            Some(b0),
            &["active -> disabled"],
        ),
        change(Op::Removed, Kind::Backend, Some("api"), Some(b1), &[]),
        change(Op::Added, Kind::Backend, Some("api"), Some(b2), &[]),
        Change {
            service: Some("web".into()),
            generation: Some("1".into()),
            ..change(Op::Removed, Kind::Service, None, None, &[])
        },
    ];
    let file = d.state_dir().join("next.json");
    std::fs::write(&file, next.to_json()).unwrap();
    let file = file.to_str().unwrap();

    // A dry run: the same difference, nothing saved, nothing applied.
    let elements = d.elements(NET);
    let dry = d.ok(&["apply", "-f", file, "--dry-run", "--json"]);
    assert_eq!(changes(&dry), expected, "{dry}");
    assert_eq!(
        serde_json::from_str::<Value>(&dry).unwrap()["dry_run"],
        true
    );
    assert_eq!(state(&d), before, "a dry run saves nothing");
    assert_eq!(d.elements(NET), elements, "a dry run applies nothing");
    // A dry run is checked as the change would be: an invalid one is refused.
    let mut bad = next.clone();
    bad.networks[0].services[0].backends.clear();
    bad.networks[0].services[0].vips = vec![];
    bad.networks[0].services[0].ports.clear();
    let r = lb_stdin(&d, &["apply", "-f", "-", "--dry-run"], &bad.to_json());
    assert_eq!(r.code, Some(1), "{r:?}");

    // Applied: the printed lines list exactly those changes.
    let out = d.ok(&["apply", "-f", file]);
    let lines: Vec<&str> = out.lines().skip(1).map(str::trim).collect();
    assert_eq!(
        lines,
        [
            "~ network clinet: masquerade: auto -> always".to_owned(),
            "~ service api generation 1 in clinet: ports: +udp/15353:53".to_owned(),
            format!("~ backend {b0} of service api generation 1 in clinet: active -> disabled"),
            format!("- backend {b1} of service api generation 1 in clinet"),
            format!("+ backend {b2} of service api generation 1 in clinet"),
            "- service web generation 1 in clinet".to_owned(),
        ],
        "{out}"
    );
    assert_eq!(state(&d), next);
    // The same file again: nothing.
    let again = d.ok(&["apply", "-f", file]);
    assert!(again.contains("no changes"), "{again}");
    // A change of hundreds of differences (here 30 services of 10 backends, a dry run): the
    // first 200 lines in words and how many more, every one with --json.
    let mut many = next.clone();
    let template = many.networks[0].services[0].clone();
    for i in 0..30u32 {
        let mut s = template.clone();
        s.id = format!("many{i}");
        s.vips = vec![Ipv4Addr::new(10, 99, 1, i as u8).into()];
        s.ports.clear();
        s.backends = (0..10u32)
            .map(|k| lb_user::core::model::Backend {
                ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 98, 0, 0)) + i * 10 + k).into(),
                disabled: false,
            })
            .collect();
        many.networks[0].services.push(s);
    }
    let words = lb_stdin(&d, &["apply", "-f", "-", "--dry-run"], &many.to_json());
    let lines: Vec<&str> = words.stdout.lines().skip(1).collect();
    assert_eq!(lines.len(), 201, "{}", words.stdout);
    assert_eq!(lines[200].trim(), "… and 130 more (--json lists every one)");
    let json = lb_stdin(
        &d,
        &["apply", "-f", "-", "--dry-run", "--json"],
        &many.to_json(),
    );
    assert_eq!(changes(&json.stdout).len(), 330, "{}", json.stdout);

    // `service ls`: one row per backend with its state and counts, the service's columns on
    // its first; conntrack names the service by id, and the address asked as its frontend.
    let _conn = lb_tests::traffic::TcpSession::connect(&topo.client, VIP, 80, TIMEOUT).unwrap();
    tcp_request(&topo.client, VIP, 80, TIMEOUT).unwrap();
    let table = d.ok(&["service", "ls", NET]);
    println!("{table}");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NETWORK",
            "SERVICE",
            "GENERATION",
            "FRONTENDS",
            "BACKEND",
            "STATE",
            "FLOWS",
            "PACKETS",
            "BYTES"
        ]
    );
    assert_eq!(
        &rows[1][..6],
        [
            NET,
            "api",
            "1",
            &VIP.to_string(),
            "tcp/18080:80",
            "udp/15353:53"
        ]
        .as_slice()
    );
    assert_eq!(rows[1][6..8], [b0.to_string().as_str(), "disabled"]);
    assert_eq!(rows[2][..2], [b2.to_string().as_str(), "active"]);
    let json: Value = serde_json::from_str(&d.ok(&["service", "ls", NET, "-j"])).unwrap();
    let live = &json[0]["backends"][1];
    assert_eq!(live["address"], b2.to_string(), "{json}");
    assert!(live["flows"].as_u64().unwrap() >= 1, "{json}");
    assert!(live["packets"].as_u64().unwrap() > 0, "{json}");
    let flows = d.conntrack(NET);
    assert!(
        flows
            .iter()
            .any(|f| f["service"] == "api" && f["frontend"] == format!("{VIP}:80")),
        "{flows:?}"
    );
    let ct = d.ok(&["conntrack"]);
    assert!(ct.starts_with("NETWORK"), "{ct}");

    // Status counts distinct backends and says when the last sync was.
    let st = d.network_status(NET);
    assert_eq!(st["backends"], 2, "{st}");
    assert!(st["last_sync"]["at_unix"].as_u64().unwrap() > 0, "{st}");
    let said = d.ok(&["status"]);
    assert!(said.contains("1 service, 2 backends"), "{said}");
    assert!(said.contains("last sync: "), "{said}");
}

/// `lb version`: the version, the commit built, the eBPF object it carries, the kernel, and,
/// as root, what the probe of `--dataplane auto` found; as another user, that the probe was
/// not run and why. `-j` says the same as JSON.
#[test]
fn version_says_what_this_lb_is_and_what_the_kernel_runs() {
    if !require_root("version_says_what_this_lb_is_and_what_the_kernel_runs") {
        return;
    }
    let run = |wrapper: &[&str], json: bool| -> Run {
        let mut cmd = if wrapper.is_empty() {
            Command::new(lb())
        } else {
            let mut c = Command::new(wrapper[0]);
            c.args(&wrapper[1..]).arg(lb());
            c
        };
        cmd.arg("version");
        if json {
            cmd.arg("-j");
        }
        cmd.output().unwrap().into()
    };
    let text = run(&[], false);
    assert!(text.ok(), "{text:?}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for want in [
        format!("lb {} (commit ", env!("CARGO_PKG_VERSION")),
        "eBPF object: ".to_owned(),
        format!("kernel: {}", kernel.trim()),
        "probe: the eBPF object loads and lb_xdp, lb_tc_ingress and lb_tc_egress pass the verifier"
            .to_owned(),
    ] {
        assert!(text.stdout.contains(&want), "{want:?} in {}", text.stdout);
    }
    let j = run(&[], true);
    let v: Value = serde_json::from_str(&j.stdout).unwrap();
    assert_eq!(v["probe"]["ok"], true, "{v}");
    assert_eq!(
        v["ebpf_object"]["bytes"].as_u64().unwrap() as usize,
        lb_user::dataplane::ebpf::object().len(),
        "the object this test's lb-user embeds is the binary's"
    );
    assert_ne!(v["commit"], "", "{v}");
    let nobody = run(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        true,
    );
    assert!(nobody.ok(), "{nobody:?}");
    let v: Value = serde_json::from_str(&nobody.stdout).unwrap();
    assert_eq!(v["probe"]["ok"], Value::Null, "{v}");
    assert!(
        v["probe"]["said"].as_str().unwrap().contains("needs root"),
        "{v}"
    );
}

/// The habits a user brings from other tools get a hint, not just a refusal (usage, exit 2,
/// nothing asked): an `IP:PORT` backend says where the port goes, a state file without `-f`
/// says how to give it. Needs no daemon.
#[test]
fn habits_of_other_tools_get_a_hint() {
    let run = |args: &[&str]| -> Run { Command::new(lb()).args(args).output().unwrap().into() };
    let r = run(&[
        "service",
        "set",
        "web",
        "api",
        "--vip",
        "10.99.0.1",
        "--backend",
        "10.0.0.1:80",
    ]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("--port PROTO/PUBLISHED:80"), "{r:?}");
    let r = run(&["service", "backend", "add", "web", "api", "[fd00::1]:8080"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("a backend is an address"), "{r:?}");
    let r = run(&["apply", "state.json"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("lb apply -f state.json"), "{r:?}");
    let r = run(&["apply"]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.stderr.contains("-f FILE"), "{r:?}");
    // A timeout out of bounds and a name the daemon would refuse are checked here, as a port
    // is, by the daemon's own rules: usage, the daemon never asked (no daemon listens on this
    // socket: asking would be exit 4).
    let nowhere = std::env::temp_dir().join("lbt-cli-no-such.sock");
    for (args, said) in [
        (
            &[
                "network",
                "add",
                "x",
                "--interface",
                "eth0",
                "--timeout",
                "tcp_established=0",
            ][..],
            "out of range",
        ),
        (
            &["network", "set", "x", "--timeout", "udp=0"],
            "out of range",
        ),
        (
            &["network", "add", "a b", "--interface", "eth0"],
            "network name",
        ),
        (&["network", "rm", ".."], "network name"),
        (
            &["service", "set", "web", "a/b", "--vip", "10.99.0.1"],
            "service id",
        ),
        (
            &["service", "rm", "web", "api", "--generation", ""],
            "generation",
        ),
        (
            &[
                "service",
                "backend",
                "add",
                "web",
                "api",
                "10.0.0.1",
                "--generation",
                "g!",
            ],
            "generation",
        ),
    ] {
        let r: Run = Command::new(lb())
            .args(args)
            .args(["--socket", nowhere.to_str().unwrap()])
            .output()
            .unwrap()
            .into();
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.stderr.contains(said), "{args:?}: {r:?}");
    }
    // `LB_SOCKET= lb …`: an empty variable is an unset one, not a flag without its value.
    let r: Run = Command::new(lb())
        .env("LB_SOCKET", "")
        .args(["--socket", nowhere.to_str().unwrap(), "status"])
        .output()
        .unwrap()
        .into();
    assert_eq!(r.code, Some(4), "the daemon asked, and not there: {r:?}");
    assert!(r.stderr.contains(nowhere.to_str().unwrap()), "{r:?}");
}

/// A state file is `-f FILE` wherever one is read; `--state`, the old spelling of `elements`
/// (and `load`, exercised by `cli_load.rs`), still works and means the same. Needs no daemon.
#[test]
fn a_state_file_is_dash_f_everywhere_and_the_old_spelling_still_works() {
    let file = std::env::temp_dir().join(format!("lbt-cli-elements-{}.json", std::process::id()));
    std::fs::write(
        &file,
        r#"{"networks":[{"name":"web","interfaces":["eth0"],"services":[{"id":"api","vip":"10.99.0.10","backends":[{"ip":"10.20.0.11"}],"ports":[]}]}]}"#,
    )
    .unwrap();
    let run = |flag: &str| -> Run {
        Command::new(lb())
            .args(["elements", flag, file.to_str().unwrap()])
            .output()
            .unwrap()
            .into()
    };
    let (short, long, old) = (run("-f"), run("--file"), run("--state"));
    let _ = std::fs::remove_file(&file);
    assert!(short.ok(), "{short:?}");
    assert!(short.stdout.contains("10.99.0.10"), "{short:?}");
    assert_eq!(short.stdout, long.stdout);
    assert_eq!(short.stdout, old.stdout, "--state still works");
}

/// A daemon killed while it works on a change (`kill -9` during `lb apply` of 10,000
/// services) leaves the CLI without an answer: exit 5, saying the change may have been saved
/// and how to find out, not 1 ("refused, nothing changed"), which would be a lie once the
/// restarted daemon serves what it had saved.
#[test]
fn a_daemon_gone_before_it_answers_a_change_exits_5_and_says_how_to_check() {
    if !require_root("a_daemon_gone_before_it_answers_a_change_exits_5_and_says_how_to_check") {
        return;
    }
    let topo = Topology::new(1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    let state = lb_tests::scale::state(
        NET,
        topo.node.name(),
        &topo.node_ifaces,
        lb_tests::scale::services(10_000, 10, 8080),
    );
    let file = d.state_dir().with_file_name("big.json");
    std::fs::write(&file, state.to_json()).unwrap();
    let fds = |d: &LbDaemon| {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid().unwrap())).map_or(0, |dir| dir.count())
    };
    let before = fds(&d);
    let apply = Command::new(lb())
        .args(["apply", "-f", file.to_str().unwrap(), "--socket"])
        .arg(d.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed once the change is under way: the daemon has the client's connection (one more
    // descriptor), and a moment later the request (the change takes seconds at this size).
    let connected = lb_tests::poll_until(std::time::Duration::from_secs(20), || fds(&d) > before);
    assert!(connected.is_some(), "the CLI never connected");
    std::thread::sleep(std::time::Duration::from_millis(500));
    d.kill9();
    let r: Run = apply.wait_with_output().unwrap().into();
    assert_eq!(r.code, Some(5), "{r:?}");
    assert!(r.stderr.contains("may have been saved"), "{r:?}");
    assert!(r.stderr.contains("lb status"), "{r:?}");
    d.restart().unwrap();
    let status: Value = serde_json::from_str(&d.ok(&["status", "-j"])).unwrap();
    assert!(status["store"]["revision"].as_u64().is_some(), "{status}");
}

/// `lb status NETWORK` and `lb network ls NETWORK` show that network only (as `lb service ls`
/// and `lb conntrack` do), table and JSON; an unknown one is refused by name.
#[test]
fn status_and_network_ls_take_a_network() {
    if !require_root("status_and_network_ls_take_a_network") {
        return;
    }
    let (a, b) = (Topology::new(1).unwrap(), Topology::new(1).unwrap());
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &[]).unwrap();
    d.ok(&network_add(&a, "one"));
    d.ok(&network_add(&b, "two"));
    let status: Value = serde_json::from_str(&d.ok(&["status", "two", "-j"])).unwrap();
    let names: Vec<&str> = (status["networks"].as_array().unwrap().iter())
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["two"], "{status}");
    let table = d.ok(&["status", "one"]);
    let rows: Vec<&str> = (table.lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w == "one" || *w == "two")
        .collect();
    assert_eq!(rows, ["one"], "{table}");
    let list: Value = serde_json::from_str(&d.ok(&["network", "ls", "one", "-j"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["name"], "one", "{list}");
    for args in [&["status", "three"][..], &["network", "ls", "three"]] {
        let r = d.cli(args);
        assert_eq!(r.code, Some(1), "{args:?}: {r:?}");
        assert!(
            r.stderr.contains("unknown network \"three\""),
            "{args:?}: {r:?}"
        );
    }
}

/// `lb ARGS` with no daemon involved, `env` added to the environment.
fn run_with(args: &[&str], env: &[(&str, &str)]) -> Run {
    Command::new(lb())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
        .into()
}

/// Each option is offered by the commands it acts on and by no other (a command's help is
/// what it takes); the earlier spelling with the options before the command's name still works
/// where they act and is refused, as usage, where they would mean nothing. Needs no daemon.
#[test]
fn options_are_offered_where_they_act_and_the_old_spellings_still_work() {
    // (command, --socket, -j, --cluster)
    let offers: &[(&[&str], bool, bool, bool)] = &[
        (&["daemon"], true, false, true),
        (&["network", "add"], true, true, false),
        (&["network", "ls"], true, true, false),
        (&["service", "set"], true, true, true),
        (&["service", "backend", "add"], true, true, true),
        (&["batch"], true, true, false),
        (&["apply"], true, true, true),
        (&["state"], true, true, true),
        (&["version"], false, true, false),
        (&["nodes"], false, true, true),
        (&["watch"], true, true, false),
        (&["elements"], true, true, false),
        (&["conntrack"], true, true, false),
        (&["status"], true, true, false),
        (&["load"], false, true, false),
        (&["unload"], false, true, false),
    ];
    for (command, socket, json, cluster) in offers {
        let help = run_with(&[&command[..], &["--help"]].concat(), &[]);
        assert!(help.ok(), "{command:?}: {help:?}");
        let offered = |flag: &str| help.stdout.lines().any(|l| l.contains(flag));
        assert_eq!(offered("--socket"), *socket, "lb {command:?} --socket");
        assert_eq!(offered("--json"), *json, "lb {command:?} --json");
        assert_eq!(
            offered("--cluster <URL>"),
            *cluster,
            "lb {command:?} --cluster"
        );
    }

    // Before the command's name: taken where it acts (the socket named is the one asked) ...
    let r = run_with(
        &["--socket", "/nonexistent/before.sock", "-j", "status"],
        &[],
    );
    assert_eq!(r.code, Some(4), "{r:?}");
    assert!(json_error(&r).contains("/nonexistent/before.sock"), "{r:?}");
    // ... over the command's environment variable, as a flag after the name is ...
    let env = [("LB_SOCKET", "/nonexistent/env.sock")];
    let r = run_with(&["--socket", "/nonexistent/before.sock", "status"], &env);
    assert!(r.stderr.contains("/nonexistent/before.sock"), "{r:?}");
    let r = run_with(&["status", "--socket", "/nonexistent/after.sock"], &env);
    assert!(r.stderr.contains("/nonexistent/after.sock"), "{r:?}");
    let r = run_with(&["network", "--socket", "/nonexistent/mid.sock", "ls"], &[]);
    assert!(r.stderr.contains("/nonexistent/mid.sock"), "{r:?}");
    // ... and refused where it does not act: usage, nothing done.
    for (args, flag, command) in [
        (
            &["--socket", "/x.sock", "version"][..],
            "--socket",
            "version",
        ),
        (
            &["--socket", "/x.sock", "load", "-f", "/nonexistent"],
            "--socket",
            "load",
        ),
        (
            &["--cluster", "etcd://127.0.0.1:1", "network", "ls"],
            "--cluster",
            "network",
        ),
        // Paths that cannot be made: were the refusal broken, the daemon would fail at once
        // rather than serve on the node's own socket and state dir.
        (
            &[
                "-j",
                "daemon",
                "--state-dir",
                "/proc/lbt-none/state",
                "--socket",
                "/proc/lbt-none/lb.sock",
                "--bpffs",
                "/proc/lbt-none/bpf",
            ],
            "--json",
            "daemon",
        ),
    ] {
        let r = run_with(args, &[]);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        let said = format!("{flag} does not act on `lb {command}`");
        if flag == "--json" {
            assert!(json_error(&r).contains(&said), "{args:?}: {r:?}");
        } else {
            assert!(
                r.stderr.starts_with(&format!("lb: {said}")),
                "{args:?}: {r:?}"
            );
        }
    }
    // After the name, where it does not act: clap's usage error, in lb's one error style.
    let r = run_with(&["load", "-f", "/nonexistent", "--socket", "/x.sock"], &[]);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.starts_with("lb: unexpected argument '--socket'"),
        "{r:?}"
    );

    // `--state-dir` is the daemon's desired state; `lb load`'s record of what it programmed is
    // `--record-dir`, the old spelling kept as an alias (it reaches the record, not usage).
    // `--record-dir`, the old spelling kept as an alias: the same run either way, not usage.
    let unload = |flag: &str| {
        let args = [
            "unload",
            flag,
            "/nonexistent/record",
            "--bpffs",
            "/nonexistent/b",
        ];
        run_with(&args, &[])
    };
    let (new, old) = (unload("--record-dir"), unload("--state-dir"));
    assert_ne!(new.code, Some(2), "{new:?}");
    assert_eq!((new.code, &new.stderr), (old.code, &old.stderr), "{old:?}");
    let help = run_with(&["load", "--help"], &[]).stdout;
    assert!(
        help.contains("--record-dir") && !help.contains("--state-dir <"),
        "{help}"
    );
}

/// `lb elements` is a headed table whose first column is the network: two networks sharing a
/// VIP print rows that can be told apart; `-j` carries the same rows with their network.
#[test]
fn elements_is_a_headed_table_with_the_network() {
    let file = std::env::temp_dir().join(format!("lbt-cli-two-nets-{}.json", std::process::id()));
    let net = |name: &str, backend: &str| {
        format!(
            r#"{{"name":"{name}","interfaces":["eth-{name}"],"services":[{{"id":"api","vip":"10.99.0.10","backends":[{{"ip":"{backend}"}}],"ports":[]}}]}}"#
        )
    };
    let text = format!(
        r#"{{"networks":[{},{}]}}"#,
        net("blue", "10.20.0.11"),
        net("green", "10.30.0.11")
    );
    std::fs::write(&file, text).unwrap();
    let table = run_with(&["elements", "-f", file.to_str().unwrap()], &[]);
    let json = run_with(&["elements", "-f", file.to_str().unwrap(), "-j"], &[]);
    let _ = std::fs::remove_file(&file);
    assert!(table.ok() && json.ok(), "{table:?} {json:?}");
    let mut lines = table.stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NETWORK", "MAP", "KEY", "VALUE"], "{table:?}");
    let rows: Vec<&str> = lines.collect();
    let listed: Vec<Value> = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(rows.len(), listed.len(), "{table:?}");
    for (network, backend) in [("blue", "10.20.0.11"), ("green", "10.30.0.11")] {
        let vip_rows: Vec<&&str> = (rows.iter())
            .filter(|r| r.starts_with(network) && r.contains("10.99.0.10 . "))
            .collect();
        assert!(!vip_rows.is_empty(), "{network}: {table:?}");
        assert!(
            vip_rows.iter().all(|r| r.ends_with(backend)),
            "{network}: {vip_rows:?}"
        );
        assert!(
            listed
                .iter()
                .any(|e| e["network"] == network && e["value"] == backend),
            "{network}: {listed:?}"
        );
    }
}
