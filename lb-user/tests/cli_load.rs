//! `lb load` / `lb unload`, the real binary against a netns topology: what an operator runs.
//! Root only.
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use lb_common::{FLOW_REPLY, LAYOUT_MAP, MAP_LAYOUTS};
use lb_tests::{
    bpffs::Bpffs,
    bpftool::{self, Entry, addr, port},
    daemon::{LbDaemon, network_add, service_set},
    netns::Topology,
    require_root,
    traffic::{Reply, TIMEOUT, spawn_backends, tcp_request},
};
use lb_user::{
    core::model::{
        Attach, Backend, DesiredState, Masquerade, Mode, Network, PortConfig, Proto, Service,
    },
    lock::Lock,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;

fn lb(args: &[&str], bpffs: &Path, record_dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lb"))
        .args(args)
        .arg("--bpffs")
        .arg(bpffs)
        .arg("--record-dir")
        .arg(record_dir)
        .output()
        .expect("lb runs")
}

fn state(topo: &Topology, attach: Attach) -> DesiredState {
    DesiredState {
        networks: vec![Network {
            name: "cli".into(),
            interfaces: topo.node_ifaces.clone(),
            netns: Some(topo.node.name().into()),
            mode: Mode::Nat,
            attach,
            masquerade: Masquerade::Auto,
            fast_path: Default::default(),
            hold_ports: Default::default(),
            timeouts: Default::default(),
            services: vec![Service {
                id: "web".into(),
                generation: "1".into(),
                vips: vec![VIP.into()],
                backends: topo
                    .backend_ips
                    .iter()
                    .map(|ip| Backend {
                        ip: (*ip).into(),
                        disabled: false,
                    })
                    .collect(),
                ports: vec![PortConfig {
                    proto: Proto::Tcp,
                    published: 18080,
                    target: Some(PORT),
                    host_ip: None,
                }],
            }],
        }],
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A topology whose backends serve, a private bpffs, and a work dir (the CLI's state dir)
/// holding `state.json` (its path, last): `state` of the topology as `edit` changes it.
fn setup(
    attach: Attach,
    edit: impl FnOnce(&mut DesiredState),
) -> (
    Topology,
    Vec<lb_tests::traffic::Backend>,
    Bpffs,
    PathBuf,
    PathBuf,
) {
    let topo = Topology::new(2).unwrap();
    let servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let work = tempdir();
    let file = work.join("state.json");
    let mut desired = state(&topo, attach);
    edit(&mut desired);
    std::fs::write(&file, desired.to_json()).unwrap();
    (topo, servers, Bpffs::new().unwrap(), work, file)
}

/// `tc`: the `--tc` choice (`auto` picks TCX on this kernel; `netlink` forces clsact filters).
fn load_serve_unload(attach: Attach, tc: &str) {
    let (topo, _servers, bpffs, work, file) = setup(attach, |_| {});
    let file_arg = file.to_str().unwrap();

    let out = lb(
        &["load", "--state", file_arg, "--tc", tc],
        bpffs.path(),
        &work,
    );
    assert!(out.status.success(), "lb load: {}", text(&out.stderr));
    let said = text(&out.stdout);
    println!("lb load printed: {said}");
    assert!(said.starts_with("cli: loaded"), "{said}");
    let aliases = topo
        .node
        .ip(["-4", "-o", "addr", "show", "dev", &topo.node_ifaces[0]])
        .unwrap();
    assert!(
        aliases.contains("10.99.0.10/32"),
        "VIP alias added: {aliases}"
    );
    if tc == "netlink" {
        let filters = topo
            .node
            .exec([
                "tc",
                "filter",
                "show",
                "dev",
                &topo.node_ifaces[0],
                "egress",
            ])
            .unwrap();
        assert!(
            filters.contains("lb_tc_egress"),
            "a clsact filter: {filters}"
        );
    }
    for addr in [VIP, topo.node_ip] {
        let port = if addr == VIP { PORT } else { 18080 };
        let r: Reply = tcp_request(&topo.client, addr, port, TIMEOUT)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(*r.peer.ip(), topo.client_ip);
    }

    // The same file again: everything adopted, nothing rewritten.
    let again = lb(&["load", "-f", file_arg, "--tc", tc], bpffs.path(), &work);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).contains("(0 map entries written, 0 deleted"),
        "{}",
        text(&again.stdout)
    );

    // An invalid file: a one-line reason, exit 1, and nothing of it applied.
    let bad = work.join("bad.json");
    std::fs::write(
        &bad,
        text(std::fs::read(&file).unwrap().as_slice()).replace("18080", "0"),
    )
    .unwrap();
    let refused = lb(
        &["load", "--state", bad.to_str().unwrap()],
        bpffs.path(),
        &work,
    );
    assert_eq!(refused.status.code(), Some(1));
    let reason = text(&refused.stderr);
    println!("lb load of an invalid file: {reason}");
    assert!(
        reason.starts_with("lb: ") && reason.trim_end().lines().count() == 1,
        "{reason}"
    );
    assert!(
        tcp_request(&topo.client, VIP, PORT, TIMEOUT).is_ok(),
        "the loaded state stays"
    );

    let gone = lb(&["unload", "--tc", tc], bpffs.path(), &work);
    assert!(gone.status.success(), "{}", text(&gone.stderr));
    assert_eq!(text(&gone.stdout).trim(), "unloaded 1 networks");
    let aliases = topo
        .node
        .ip(["-4", "-o", "addr", "show", "dev", &topo.node_ifaces[0]])
        .unwrap();
    assert!(
        !aliases.contains("10.99.0.10/32"),
        "VIP alias removed: {aliases}"
    );
    assert!(!bpffs.path().join("cli").exists(), "pins removed");
    assert!(tcp_request(&topo.client, VIP, PORT, Duration::from_millis(500)).is_err());
    let tc = topo
        .node
        .exec([
            "tc",
            "filter",
            "show",
            "dev",
            &topo.node_ifaces[0],
            "ingress",
        ])
        .unwrap();
    assert!(!tc.contains("lb_tc"), "no program left attached: {tc}");
    std::fs::remove_dir_all(&work).unwrap();
}

/// `lb load` and `lb unload` share the bpffs with the daemon and with each other: each takes
/// the bpffs dir's lock first, and one that finds it held exits 1 naming the holder, having
/// attached, pinned and aliased nothing.
#[test]
fn lb_load_and_unload_are_refused_while_another_writer_holds_the_bpffs() {
    if !require_root("lb_load_and_unload_are_refused_while_another_writer_holds_the_bpffs") {
        return;
    }
    let (topo, _servers, bpffs, work, file) = setup(Attach::Tc, |other| {
        other.networks[0].services[0].vips = vec![Ipv4Addr::new(10, 99, 0, 99).into()];
    });
    let file_arg = file.to_str().unwrap();
    let refused = |holder: u32, what: &str| {
        for args in [&["load", "--state", file_arg][..], &["unload"]] {
            let out = lb(args, bpffs.path(), &work);
            let reason = text(&out.stderr);
            println!("lb {} while {what} runs: {}", args[0], reason.trim());
            assert_eq!(out.status.code(), Some(1), "lb {args:?}: {reason}");
            assert!(
                reason.contains(&format!(
                    "the bpffs dir {} is in use by pid {holder} ",
                    bpffs.path().display()
                )),
                "lb {args:?}: the refusal names the bpffs dir and pid {holder}: {reason}"
            );
            assert!(!bpffs.path().join("cli").exists(), "lb {args:?} pinned");
            let aliases = (topo.node)
                .ip(["-4", "-o", "addr", "show", "dev", &topo.node_ifaces[0]])
                .unwrap();
            assert!(
                !aliases.contains("10.99.0.99/32"),
                "lb {args:?} added its VIP: {aliases}"
            );
        }
    };

    // Another one-shot writer (this test, taking the lock as `lb load` does).
    let held = Lock::dir(bpffs.path(), "the bpffs dir").unwrap();
    refused(std::process::id(), "another lb load");
    drop(held);

    // A daemon serving a network on the same interfaces.
    let d = LbDaemon::start(Path::new(env!("CARGO_BIN_EXE_lb")), bpffs.path(), &[]).unwrap();
    d.ok(&network_add(&topo, "d"));
    d.ok(&service_set(
        "d",
        "web",
        "1",
        VIP,
        "tcp/18080:8080",
        &topo.backend_ips,
    ));
    let pins = || {
        let mut v: Vec<_> = std::fs::read_dir(bpffs.path().join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let before = (d.ok(&["state", "--json"]), pins());
    refused(d.pid().unwrap(), "lb daemon");
    assert_eq!(
        (d.ok(&["state", "--json"]), pins()),
        before,
        "the daemon's state or pins changed"
    );
    for (addr, port) in [(VIP, PORT), (topo.node_ip, 18080)] {
        tcp_request(&topo.client, addr, port, TIMEOUT).expect("the daemon's service still answers");
    }
    std::fs::remove_dir_all(&work).unwrap();
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "lb-cli-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn lb_load_serves_and_lb_unload_removes_everything_tc() {
    if require_root("lb_load_serves_and_lb_unload_removes_everything_tc") {
        load_serve_unload(Attach::Tc, "auto");
    }
}

#[test]
fn lb_load_serves_and_lb_unload_removes_everything_xdp() {
    if require_root("lb_load_serves_and_lb_unload_removes_everything_xdp") {
        load_serve_unload(Attach::Xdp, "auto");
    }
}

#[test]
fn lb_load_with_netlink_tc_filters_serves_and_unloads() {
    if require_root("lb_load_with_netlink_tc_filters_serves_and_unloads") {
        load_serve_unload(Attach::Tc, "netlink");
    }
}

/// The dump of map `map` of network `cli`, after checking that the kernel holds its BTF (a
/// `btf_id`) and that every entry has the fields `key` and `value` name.
fn dump_by_fields(bpffs: &Path, map: &str, key: &[&str], value: &[&str]) -> Vec<Entry> {
    let pin = bpffs.join("cli").join(map);
    let show = bpftool::map_show(&pin).unwrap();
    assert!(
        show["btf_id"].as_u64().is_some_and(|id| id > 0),
        "{map}: bpftool map show reports no BTF: {show}"
    );
    let entries = bpftool::map_dump(&pin).unwrap();
    assert!(!entries.is_empty(), "{map}: no entries");
    for e in &entries {
        for (what, fields, json) in [("key", key, &e.key), ("value", value, &e.value)] {
            for f in fields {
                assert!(json.get(f).is_some(), "{map}: no {what} field {f} in {e:?}");
            }
        }
    }
    entries
}

/// What the README's inspection section shows: after `lb load` and real traffic, every map
/// pinned reports its BTF, bpftool dumps the service, backend and flow maps with every field
/// by name, and the values decode to what the state file and the traffic put there.
#[test]
fn bpftool_dumps_the_maps_by_field_name() {
    if !require_root("bpftool_dumps_the_maps_by_field_name") {
        return;
    }
    let (topo, _servers, bpffs, work, file) = setup(Attach::Tc, |_| {});
    let out = lb(
        &["load", "--state", file.to_str().unwrap()],
        bpffs.path(),
        &work,
    );
    assert!(out.status.success(), "lb load: {}", text(&out.stderr));
    let r: Reply = tcp_request(&topo.client, VIP, PORT, TIMEOUT)
        .unwrap()
        .parse()
        .unwrap();
    let served = *r.peer.ip();
    assert_eq!(served, topo.client_ip);
    tcp_request(&topo.client, topo.node_ip, 18080, TIMEOUT).unwrap();
    let bpffs = bpffs.path();
    // Every map lb pins carries BTF, empty ones included (but the ring buffer, which has no
    // key or value for BTF to describe: its records are the daemon's to read, never dumped);
    // the four below are read by field.
    for map in (MAP_LAYOUTS.iter().map(|(m, _)| *m)).chain([LAYOUT_MAP]) {
        let show = bpftool::map_show(&bpffs.join("cli").join(map)).unwrap();
        if show["type"] == "ringbuf" {
            continue;
        }
        assert!(show["btf_id"].is_u64(), "{map} has no BTF: {show}");
    }

    let service = ["set_id", "count", "session_timeout", "flags"];
    let vips = dump_by_fields(bpffs, "lb_vips", &["addr"], &service);
    println!("lb_vips: {vips:?}");
    let vip = (vips.iter())
        .find(|e| addr(&e.key["addr"]) == VIP)
        .unwrap_or_else(|| panic!("no entry of {VIP} in lb_vips: {vips:?}"));
    assert_eq!(vip.value["count"], 2, "{vip:?}");

    let ports = dump_by_fields(bpffs, "lb_ports", &["addr", "port", "proto"], &service);
    println!("lb_ports: {ports:?}");
    let published = (ports.iter())
        .find(|e| port(&e.key["port"]) == 18080)
        .unwrap_or_else(|| panic!("no entry of port 18080 in lb_ports: {ports:?}"));
    assert_eq!(published.key["proto"], libc::IPPROTO_TCP, "{published:?}");
    assert_eq!(published.value["count"], 2, "{published:?}");

    let backends = dump_by_fields(
        bpffs,
        "lb_backends",
        &["set_id", "slot"],
        &["addr", "port", "counter"],
    );
    println!("lb_backends: {backends:?}");
    // A VIP keeps the packet's port (0); the published port's set rewrites to the target.
    for (set, to) in [
        (&vip.value["set_id"], 0),
        (&published.value["set_id"], PORT),
    ] {
        let mut addrs: Vec<(Ipv4Addr, u16)> = (backends.iter())
            .filter(|e| &e.key["set_id"] == set)
            .map(|e| (addr(&e.value["addr"]), port(&e.value["port"])))
            .collect();
        addrs.sort();
        let configured: Vec<_> = topo.backend_ips.iter().map(|ip| (*ip, to)).collect();
        assert_eq!(
            addrs, configured,
            "set {set}: the configured backends and port: {backends:?}"
        );
    }

    let flows = dump_by_fields(
        bpffs,
        "lb_flows",
        &["saddr", "daddr", "sport", "dport", "proto"],
        &[
            "saddr",
            "daddr",
            "sport",
            "dport",
            "flags",
            "replied",
            "closing_orig",
            "closing_reply",
            "hash",
            "counter",
            "expires_ns",
        ],
    );
    println!("lb_flows: {flows:?}");
    let original = (flows.iter())
        .find(|e| {
            (
                addr(&e.key["saddr"]),
                addr(&e.key["daddr"]),
                port(&e.key["dport"]),
            ) == (topo.client_ip, VIP, PORT)
                && e.value["flags"].as_u64().unwrap() & u64::from(FLOW_REPLY) == 0
        })
        .unwrap_or_else(|| panic!("no entry of {} → {VIP}:{PORT}: {flows:?}", topo.client_ip));
    let to = addr(&original.value["daddr"]);
    assert!(
        topo.backend_ips.contains(&to),
        "the flow is sent to a backend, not {to}: {original:?}"
    );
    assert_eq!(original.value["replied"], 1, "{original:?}");
    std::fs::remove_dir_all(&work).unwrap();
}
