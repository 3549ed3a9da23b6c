//! No flow lost to a reconfiguration or an upgrade, through `lb daemon` (eBPF dataplane): a
//! network changed in place (an interface added and dropped, tc↔xdp) and a newer build of the
//! programs replacing the running ones keep the pinned flow table and 20 open connections,
//! each on its backend; pinned maps of another layout are refused, or replaced when the
//! operator asks; maps pinned without BTF (by an lb of before the BTF maps) are adopted as
//! they are. Root only.
use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, PinnedLink},
    loaded_programs,
};
use lb_common::LAYOUT_MAP;
use lb_tests::{
    bpffs::Bpffs,
    bpftool,
    daemon::{LbDaemon, service_set},
    netns::Topology,
    require_root,
    traffic::{TIMEOUT, TcpSession, spawn_backends},
};
use lb_user::dataplane::ebpf::PROG_SOCK;
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const CONNECTIONS: usize = 20;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// The kernel id of the map pinned at `path`.
fn map_id(path: &Path) -> u32 {
    aya::maps::MapData::from_pin(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .info()
        .unwrap()
        .id()
}

/// 20 connections through the VIP, each asked once: the sessions and what each answered
/// (backend and the client address it saw).
fn open_sessions(topo: &Topology) -> (Vec<TcpSession>, Vec<String>) {
    let mut sessions = Vec::new();
    let mut replies = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut s = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
        replies.push(s.ask().unwrap());
        sessions.push(s);
    }
    let backends: std::collections::BTreeSet<&str> = (replies.iter())
        .map(|r| r.split(' ').next().unwrap())
        .collect();
    assert!(
        backends.len() > 1,
        "20 connections spread over the backends: {replies:?}"
    );
    (sessions, replies)
}

/// Every session is asked again and answers as it did at first (same backend, same client
/// address seen): the connections live through `what`.
fn still_served(sessions: &mut [TcpSession], replies: &[String], what: &str) {
    for (i, (s, first)) in sessions.iter_mut().zip(replies).enumerate() {
        let now = s
            .ask()
            .unwrap_or_else(|e| panic!("connection {i} after {what}: {e:#}"));
        assert_eq!(&now, first, "connection {i} after {what}: same backend");
    }
}

/// The desired state with network `net` changed by `change`, applied with `lb apply -f`.
fn change_network(d: &LbDaemon, net: &str, change: impl FnOnce(&mut Value)) {
    let mut state: Value = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    let n = (state["networks"].as_array_mut().unwrap().iter_mut())
        .find(|n| n["name"] == net)
        .unwrap();
    change(n);
    let file = d.state_dir().with_file_name("change.json");
    std::fs::write(&file, state.to_string()).unwrap();
    d.ok(&["apply", "-f", file.to_str().unwrap()]);
}

fn start(bpffs: &Bpffs, extra: &[&str]) -> LbDaemon {
    let mut args = vec!["--dataplane", "ebpf"];
    args.extend(extra);
    LbDaemon::start(lb(), bpffs.path(), &args).expect("lb daemon starts")
}

/// The network `net` on the first `ifaces` interfaces of `topo`'s node (as `network_add`
/// names them), with one service on the VIP.
fn network(d: &LbDaemon, topo: &Topology, net: &str, ifaces: usize, attach: &str) {
    let mut args: Vec<String> = ["network", "add", net, "--netns", topo.node.name()]
        .map(String::from)
        .into();
    for i in &topo.node_ifaces[..ifaces] {
        args.extend(["--interface".into(), i.clone()]);
    }
    args.extend(["--attach".into(), attach.into()]);
    d.ok(&args);
    d.ok(&service_set(
        net,
        "api",
        "1",
        VIP,
        &format!("tcp/{PORT}"),
        &topo.backend_ips,
    ));
}

/// The link pins of `dir`, sorted.
fn link_pins(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("link_"))
        .collect();
    out.sort();
    out
}

/// The hooks of lb on the node of `topo`, as `link_<if>_<hook>` (pinned links, and under
/// `--tc netlink` the clsact filters of lb's programs): what is attached where.
fn attached(topo: &Topology, dir: &Path, netlink: bool) -> Vec<String> {
    let mut out = link_pins(dir);
    if netlink {
        let ports = (0..topo.backends.len()).map(Topology::bridge_port);
        let hooks = (topo.node_ifaces.iter().cloned())
            .flat_map(|i| [("ingress", "ingress", i.clone()), ("egress", "egress", i)])
            .chain(ports.map(|p| ("ingress", "reply", p)));
        for (hook, prog, ifname) in hooks {
            let f = topo
                .node
                .exec(["tc", "filter", "show", "dev", &ifname, hook])
                .unwrap();
            match f.matches(&format!("lb_tc_{prog}")).count() {
                0 => {}
                // `tc` prints the name twice: the filter's and the program's.
                2 => out.push(format!("link_{ifname}_{prog}")),
                _ => panic!("{ifname} {hook}: one filter of lb at most:\n{f}"),
            }
        }
    }
    out.sort();
    out
}

/// What a network on `ifaces` with `attach` has attached in `topo`, as [`attached`] lists it:
/// the socket programs on the cgroup, and with the bridge among the interfaces, the fast
/// path's reply hook on each of its ports too.
fn expected_hooks(topo: &Topology, ifaces: &[&String], attach: &str) -> Vec<String> {
    let mut out: Vec<String> = (PROG_SOCK.iter())
        .map(|p| format!("link_cgroup_{p}"))
        .collect();
    for i in ifaces {
        out.extend(["egress", "ingress"].map(|h| format!("link_{i}_{h}")));
        if attach == "xdp" && i.starts_with("lbc") {
            // The bridge has no native XDP.
            out.push(format!("link_{i}_xdp"));
        }
        if i.starts_with("lbbr") {
            out.extend(
                (0..topo.backends.len())
                    .map(|b| format!("link_{}_reply", Topology::bridge_port(b))),
            );
        }
    }
    out.sort();
    out
}

/// The /32 aliases on `ifname` in `topo`'s node.
fn aliases(topo: &Topology, ifname: &str) -> String {
    topo.node
        .ip(["-4", "-o", "addr", "show", "dev", ifname])
        .unwrap()
}

/// An interface added to a live network, made its first (the VIP aliases move to it), dropped
/// again, then its attach switched tc → xdp → tc: the flow table is the same map throughout,
/// its entries stay, and 20 open connections keep being answered by their backends; hooks
/// come and go with the network's shape, and no hook is attached twice.
fn changed_in_place(tc: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = start(&bpffs, &["--tc", tc]);
    let netlink = tc == "netlink";
    // The client-facing interface alone serves the VIP (replies leave by it).
    network(&d, &topo, "shape", 1, "tc");
    let dir = bpffs.path().join("shape");
    let (client_if, bridge) = (&topo.node_ifaces[0], &topo.node_ifaces[1]);
    assert_eq!(
        attached(&topo, &dir, netlink),
        expected_hooks(&topo, &[client_if], "tc")
    );
    let (mut sessions, replies) = open_sessions(&topo);
    let flows = map_id(&dir.join("lb_flows"));
    let entries = |d: &LbDaemon| -> usize {
        let v: Value = serde_json::from_str(&d.ok(&["conntrack", "shape", "--json"])).unwrap();
        v.as_array().unwrap().len()
    };
    assert_eq!(entries(&d), CONNECTIONS, "every connection is a flow");

    // (what, the interfaces, attach)
    let steps = [
        ("an interface added", vec![client_if, bridge], "tc"),
        ("the first interface changed", vec![bridge, client_if], "tc"),
        ("an interface dropped", vec![client_if], "tc"),
        ("attach switched to xdp", vec![client_if], "xdp"),
        ("attach switched back to tc", vec![client_if], "tc"),
    ];
    for (what, ifaces, attach) in steps {
        change_network(&d, "shape", |n| {
            n["interfaces"] = serde_json::json!(ifaces);
            n["attach"] = attach.into();
        });
        let hooks = attached(&topo, &dir, netlink);
        println!("{tc}: {what}: hooks {hooks:?}");
        assert_eq!(
            hooks,
            expected_hooks(&topo, &ifaces, attach),
            "{tc}: {what}: the network's hooks"
        );
        for i in [client_if, bridge] {
            assert_eq!(
                aliases(&topo, i).contains(&format!("{VIP}/32")),
                i == ifaces[0],
                "{tc}: {what}: the VIP alias on the first interface alone: {i}: {}",
                aliases(&topo, i)
            );
        }
        assert_eq!(
            map_id(&dir.join("lb_flows")),
            flows,
            "{tc}: {what}: the same flow table"
        );
        assert_eq!(entries(&d), CONNECTIONS, "{tc}: {what}: every flow kept");
        still_served(&mut sessions, &replies, what);
    }
    let log = d.log();
    assert!(!log.contains("network removed"), "never removed:\n{log}");
}

#[test]
fn a_network_changed_in_place_keeps_its_flows_and_connections() {
    if require_root("a_network_changed_in_place_keeps_its_flows_and_connections") {
        changed_in_place("tcx");
    }
}

#[test]
fn a_network_changed_in_place_keeps_its_flows_and_connections_netlink() {
    if require_root("a_network_changed_in_place_keeps_its_flows_and_connections_netlink") {
        changed_in_place("netlink");
    }
}

/// A pinned TCX or XDP link: its kernel id and the id and tag of the program it runs.
fn pinned_hook(pin: &Path) -> (u32, u32, u64) {
    let link: FdLink = PinnedLink::from_pin(pin)
        .unwrap_or_else(|e| panic!("{}: {e}", pin.display()))
        .into();
    let info = link.info().unwrap();
    let prog = info.program_id();
    (info.id(), prog, tag_of(prog))
}

fn tag_of(prog: u32) -> u64 {
    let info = (loaded_programs().flatten())
        .find(|p| p.id() == prog)
        .unwrap_or_else(|| panic!("program {prog} is loaded"));
    info.tag()
}

/// The object this lb embeds, rewritten into a build whose code differs and does the same:
/// in every program (a global function: a section may hold several, and a subprogram of
/// `.text` is called by some programs only), the first `rX = imm` (64-bit move of a
/// non-negative 32-bit immediate) becomes `wX = imm` (32-bit move, which zero-extends the
/// same value into rX). Each program's instructions, and so its tag, change; what it computes
/// does not, and no relocation or BTF offset moves (an instruction is replaced by one of the
/// same size).
fn patched_object(dir: &Path) -> PathBuf {
    const MOV64_IMM: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    const MOV32_IMM: u8 = 0xb4; // BPF_ALU | BPF_MOV | BPF_K
    const SHT_SYMTAB: u32 = 2;
    const SHF_EXECINSTR: u64 = 0x4;
    const STB_GLOBAL: u8 = 1;
    const STT_FUNC: u8 = 2;
    let mut elf = lb_user::dataplane::ebpf::object().to_vec();
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF object");
    let (shoff, shentsize, shnum) = (
        u64_at(&elf, 0x28) as usize,
        u16_at(&elf, 0x3a),
        u16_at(&elf, 0x3c),
    );
    let section = |i: usize| shoff + i * shentsize;
    let symtab = (0..shnum)
        .map(section)
        .find(|&sh| u32_at(&elf, sh + 4) == SHT_SYMTAB)
        .expect("a symbol table");
    let (symoff, symsize) = (
        u64_at(&elf, symtab + 24) as usize,
        u64_at(&elf, symtab + 32) as usize,
    );
    let mut programs = Vec::new();
    for sym in (symoff..symoff + symsize).step_by(24) {
        let (info, shndx) = (elf[sym + 4], u16_at(&elf, sym + 6));
        if info >> 4 != STB_GLOBAL || info & 0xf != STT_FUNC || shndx == 0 || shndx >= shnum {
            continue;
        }
        let sh = section(shndx);
        if u64_at(&elf, sh + 8) & SHF_EXECINSTR == 0 || u64_at(&elf, sym + 16) < 8 {
            continue;
        }
        let start = u64_at(&elf, sh + 24) as usize + u64_at(&elf, sym + 8) as usize;
        programs.push(start..start + u64_at(&elf, sym + 16) as usize);
    }
    let mut patched = 0;
    for range in programs {
        let insn = range.step_by(8).find(|&at| {
            let imm = i32::from_le_bytes(elf[at + 4..at + 8].try_into().unwrap());
            elf[at] == MOV64_IMM && imm >= 0
        });
        if let Some(at) = insn {
            elf[at] = MOV32_IMM;
            patched += 1;
        }
    }
    assert!(patched >= 8, "a move patched in each program: {patched}");
    let path = dir.join("lb-ebpf-patched.o");
    std::fs::write(&path, elf).unwrap();
    path
}

/// The bpf filters on `ifname`'s clsact `hook` in `ns`, as `tc filter show` lists them:
/// `(pref, handle, program id, tag)`.
fn tc_filters(topo: &Topology, ifname: &str, hook: &str) -> Vec<(String, String, u32, String)> {
    let out = topo
        .node
        .exec(["tc", "filter", "show", "dev", ifname, hook])
        .unwrap();
    let mut filters = Vec::new();
    for line in out.lines().filter(|l| l.contains(" handle ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |key: &str| {
            let i = words
                .iter()
                .position(|w| *w == key)
                .unwrap_or_else(|| panic!("{key} in {line}"));
            words[i + 1].to_owned()
        };
        filters.push((
            after("pref"),
            after("handle"),
            after("id").parse().unwrap(),
            after("tag"),
        ));
    }
    filters
}

/// What runs at every hook of network `net`: `(hook, link or filter, program id, tag)`.
fn hooks(topo: &Topology, dir: &Path, netlink: bool) -> Vec<(String, String, u32, String)> {
    let mut out = Vec::new();
    for ifname in &topo.node_ifaces {
        for hook in ["ingress", "egress"] {
            let name = format!("{ifname} {hook}");
            if netlink {
                let f = tc_filters(topo, ifname, hook);
                assert_eq!(f.len(), 1, "{name}: one filter of lb: {f:?}");
                let (pref, handle, id, tag) = f[0].clone();
                out.push((name, format!("pref {pref} handle {handle}"), id, tag));
            } else {
                let (link, id, tag) = pinned_hook(&dir.join(format!("link_{ifname}_{hook}")));
                out.push((name, format!("link {link}"), id, format!("{tag:016x}")));
            }
        }
    }
    let xdp = dir.join(format!("link_{}_xdp", topo.node_ifaces[0]));
    let (link, id, tag) = pinned_hook(&xdp);
    out.push((
        "xdp".into(),
        format!("link {link}"),
        id,
        format!("{tag:016x}"),
    ));
    out
}

/// A restart of the same build leaves every hook's program alone; a restart of a build whose
/// code differs replaces each in place — the same TCX/XDP link or netlink filter (priority
/// and handle), now running a program of another tag — while the flow table stays and 20
/// open connections keep being answered by their backends.
fn a_newer_build_replaces_the_programs_in_place(tc: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, &["--tc", tc]);
    network(&d, &topo, "up", 2, "xdp");
    let dir = bpffs.path().join("up");
    let netlink = tc == "netlink";
    let before = hooks(&topo, &dir, netlink);
    println!("{tc}: running {before:?}");
    let (mut sessions, replies) = open_sessions(&topo);
    let flows = map_id(&dir.join("lb_flows"));

    // Applies and a restart of the same build touch no hook.
    d.ok(&service_set(
        "up",
        "other",
        "1",
        Ipv4Addr::new(10, 99, 0, 11),
        "tcp/9090",
        &topo.backend_ips,
    ));
    d.restart().unwrap();
    d.ok(&["status"]);
    assert_eq!(
        hooks(&topo, &dir, netlink),
        before,
        "{tc}: the same programs run"
    );

    let object = patched_object(d.state_dir().parent().unwrap());
    d.set_extra(&["--dataplane", "ebpf", "--tc", tc]);
    d.set_env(&[("LB_EBPF_OBJECT", object.to_str().unwrap())]);
    d.restart().unwrap();
    let st: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    assert_eq!(st["networks"][0]["applied"], true, "{st}");
    let after = hooks(&topo, &dir, netlink);
    println!("{tc}: after the upgrade {after:?}");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            a.1, b.1,
            "{}: the same link or filter, replaced in place",
            a.0
        );
        assert_ne!(a.2, b.2, "{}: another program runs", a.0);
        assert_ne!(a.3, b.3, "{}: of another tag (the newer build's code)", a.0);
    }
    assert_eq!(
        map_id(&dir.join("lb_flows")),
        flows,
        "{tc}: the same flow table"
    );
    still_served(&mut sessions, &replies, "the upgrade");
    assert!(
        d.log().contains("replaced the running program in place"),
        "{}",
        d.log()
    );
}

#[test]
fn a_newer_build_replaces_tcx_and_xdp_programs_in_place() {
    if require_root("a_newer_build_replaces_tcx_and_xdp_programs_in_place") {
        a_newer_build_replaces_the_programs_in_place("tcx");
    }
}

#[test]
fn a_newer_build_replaces_netlink_filters_in_place() {
    if require_root("a_newer_build_replaces_netlink_filters_in_place") {
        a_newer_build_replaces_the_programs_in_place("netlink");
    }
}

/// `lb status --json`'s entry of network `net`.
fn status(d: &LbDaemon, net: &str) -> Value {
    let v: Value = serde_json::from_str(&d.ok(&["status", "--json"])).unwrap();
    (v["networks"].as_array().unwrap().iter())
        .find(|n| n["name"] == net)
        .unwrap()
        .clone()
}

/// The layout version `lb_layout` in `dir` records for `map`.
fn recorded_layout(dir: &Path, map: &str) -> u32 {
    let pin = aya::maps::MapData::from_pin(dir.join("lb_layout")).unwrap();
    let layout: aya::maps::Array<_, u32> =
        aya::maps::Array::try_from(aya::maps::Map::Array(pin)).unwrap();
    let i = (lb_common::MAP_LAYOUTS.iter())
        .position(|(m, _)| *m == map)
        .unwrap();
    layout.get(&(i as u32), 0).unwrap()
}

/// Records `version` as `map`'s layout in `dir`, as an lb of another layout left it.
fn record_layout(dir: &Path, map: &str, version: u32) {
    let pin = aya::maps::MapData::from_pin(dir.join("lb_layout")).unwrap();
    let mut layout: aya::maps::Array<_, u32> =
        aya::maps::Array::try_from(aya::maps::Map::Array(pin)).unwrap();
    let i = (lb_common::MAP_LAYOUTS.iter())
        .position(|(m, _)| *m == map)
        .unwrap();
    layout.set(i as u32, version, 0).unwrap();
}

/// A pinned map recorded in another layout (an older lb's) is never adopted. By default the
/// network is refused: `lb status` shows it failed, with a message naming the map, both
/// versions and the flag that replaces it, and nothing of it is touched (maps, record, links
/// and programs), so its programs keep serving an open connection. Restarted with
/// `--replace-incompatible-maps`, that map alone is replaced (its flows lost once), the others
/// adopted, and the programs replaced in place to use it: the connection goes on, its entries
/// re-created from its next packet on the same backend (the flow hash key in the adopted
/// `lb_config`). A pin directory without a record (lb before layouts were recorded) counts
/// as layout 1.
#[test]
fn a_pinned_map_of_another_layout_is_refused_unless_replacing_is_asked() {
    if !require_root("a_pinned_map_of_another_layout_is_refused_unless_replacing_is_asked") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    // A second, healthy network: applied as usual while the other is refused, and the sign
    // that the flow collector has made a pass.
    let healthy = Topology::new(1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, &["--gc-secs", "1"]);
    network(&d, &topo, "lay", 2, "tc");
    network(&d, &healthy, "ok", 2, "tc");
    let mut open = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    let first = open.ask().unwrap();
    let dir = bpffs.path().join("lay");
    let ids = |dir: &Path| ["lb_flows", "lb_config", "lb_vips"].map(|m| map_id(&dir.join(m)));
    let before = ids(&dir);
    let hook = dir.join(format!("link_{}_ingress", topo.node_ifaces[0]));
    let (link, prog, _) = pinned_hook(&hook);

    d.stop();
    record_layout(&dir, "lb_flows", 1);
    d.restart().unwrap();
    let st = status(&d, "lay");
    println!("refused: {st}");
    assert_eq!(st["applied"], false, "{st}");
    let error = st["error"].as_str().unwrap();
    assert!(
        error.contains("lb_flows (layout 1, this lb reads 2)")
            && error.contains("--replace-incompatible-maps")
            && !error.contains("lb_config"),
        "{error}"
    );
    assert_eq!(ids(&dir), before, "no map touched");
    assert_eq!(recorded_layout(&dir, "lb_flows"), 1, "the record untouched");
    assert_eq!(pinned_hook(&hook).0, link, "the link untouched");
    assert_eq!(pinned_hook(&hook).1, prog, "the old program still runs");
    let mut passes = 0;
    while status(&d, "ok")["flow_entries"].is_null() {
        passes += 1;
        assert!(passes < 50, "the collector makes a pass: {}", d.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(
        status(&d, "ok")["applied"],
        true,
        "the other network is applied"
    );
    assert!(
        status(&d, "lay")["flow_entries"].is_null(),
        "the collector leaves the refused network's flow table alone: {}",
        status(&d, "lay")
    );
    assert_eq!(
        open.ask().expect("the old programs serve on"),
        first,
        "on the same backend"
    );

    d.set_extra(&[
        "--dataplane",
        "ebpf",
        "--gc-secs",
        "1",
        "--replace-incompatible-maps",
    ]);
    d.restart().unwrap();
    let st = status(&d, "lay");
    assert_eq!(st["applied"], true, "{st}");
    let log = d.log();
    assert!(
        log.contains("replacing pinned maps of another layout")
            && log.contains("lb_flows (layout 1, this lb reads 2)"),
        "one line names the replaced map:\n{log}"
    );
    let after = ids(&dir);
    assert_ne!(after[0], before[0], "lb_flows replaced");
    assert_eq!(after[1..], before[1..], "lb_config and lb_vips adopted");
    assert_eq!(recorded_layout(&dir, "lb_flows"), 2, "recorded anew");
    let (new_link, new_prog, _) = pinned_hook(&hook);
    assert_eq!(new_link, link, "the same link");
    assert_ne!(
        new_prog, prog,
        "now running a program that uses the new lb_flows"
    );
    assert_eq!(
        open.ask()
            .expect("the connection goes on, re-created from its next packet"),
        first,
        "on the same backend"
    );
    let flows: Value = serde_json::from_str(&d.ok(&["conntrack", "lay", "--json"])).unwrap();
    assert_eq!(flows.as_array().unwrap().len(), 1, "re-created: {flows}");

    // As lb before layout records: no lb_layout at all (replacing still asked).
    d.stop();
    std::fs::remove_file(dir.join("lb_layout")).unwrap();
    d.restart().unwrap();
    let log = d.log();
    let line = (log.lines())
        .rfind(|l| l.contains("replacing pinned maps of another layout"))
        .unwrap();
    assert!(
        line.contains("lb_flows (layout 1, this lb reads 2)")
            && line.contains("lb_config (layout 1, this lb reads 3)"),
        "{line}"
    );
    assert_eq!(
        map_id(&dir.join("lb_vips")),
        before[2],
        "lb_vips (layout 1) adopted"
    );
    let r = lb_tests::traffic::tcp_request(&topo.client, VIP, PORT, TIMEOUT);
    assert!(r.is_ok(), "new connections are served: {r:?}");
}

/// A statistics map of another layout (here `lb_counters`, as an lb whose counters were an
/// array pinned it) is replaced without asking: the network is applied, its flows and their
/// connections stay, and only the counters start again.
#[test]
fn a_statistics_map_of_another_layout_is_replaced_without_asking() {
    if !require_root("a_statistics_map_of_another_layout_is_replaced_without_asking") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, &[]);
    network(&d, &topo, "stat", 2, "tc");
    let mut open = TcpSession::connect(&topo.client, VIP, PORT, TIMEOUT).unwrap();
    let first = open.ask().unwrap();
    let dir = bpffs.path().join("stat");
    let ids = |dir: &Path| ["lb_counters", "lb_flows"].map(|m| map_id(&dir.join(m)));
    let before = ids(&dir);

    d.stop();
    record_layout(&dir, "lb_counters", 1);
    d.restart().unwrap();
    let st = status(&d, "stat");
    assert_eq!(st["applied"], true, "{st}");
    let after = ids(&dir);
    assert_ne!(after[0], before[0], "lb_counters replaced");
    assert_eq!(after[1], before[1], "lb_flows adopted");
    assert_eq!(recorded_layout(&dir, "lb_counters"), 2, "recorded anew");
    let log = d.log();
    assert!(
        log.contains("replacing pinned maps of another layout")
            && log.contains("lb_counters (layout 1, this lb reads 2)"),
        "one line names the replaced map:\n{log}"
    );
    assert_eq!(
        open.ask().expect("the connection goes on"),
        first,
        "on the same backend"
    );
    println!(
        "an older lb_counters was replaced without asking; lb_flows and the connection stayed"
    );
}

/// An `lb_config` pinned in layout 2 (by an lb of before `tcp_time_wait`: 40 bytes, recreated
/// here with bpftool from the running network's own values) is replaced without asking and
/// its values carried over: the network is applied, the other maps adopted, the new config
/// has the old flow-hash key with the default `tcp_time_wait`, and 20 open connections keep
/// their backends even after every flow entry is deleted (re-created by that key) — under a
/// new key most would land elsewhere. (Broken on purpose, the conversion taking no key: the
/// connections after the flush fail.)
#[test]
fn an_lb_config_of_layout_2_is_converted_with_its_hash_key() {
    if !require_root("an_lb_config_of_layout_2_is_converted_with_its_hash_key") {
        return;
    }
    let topo = Topology::new(4).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, &[]);
    network(&d, &topo, "cfg", 2, "tc");
    let dir = bpffs.path().join("cfg");
    let config = |dir: &Path| -> lb_common::Config {
        let pin = aya::maps::MapData::from_pin(dir.join("lb_config")).unwrap();
        let array: aya::maps::Array<_, lb_common::Config> =
            aya::maps::Array::try_from(aya::maps::Map::Array(pin)).unwrap();
        array.get(&0, 0).unwrap()
    };
    let before = config(&dir);
    let (mut sessions, replies) = open_sessions(&topo);
    let flows_id = map_id(&dir.join("lb_flows"));

    d.stop();
    // Layout 2: the fields of today's config but `timeouts.tcp_time_wait`.
    let b = bytemuck::bytes_of(&before);
    let time_wait = std::mem::offset_of!(lb_common::Config, timeouts)
        + std::mem::offset_of!(lb_common::Timeouts, tcp_time_wait);
    let layout2: Vec<u8> = [&b[..time_wait], &b[time_wait + 4..]].concat();
    assert_eq!(layout2.len(), 40);
    let hex: Vec<String> = layout2.iter().map(|x| format!("0x{x:02x}")).collect();
    let pin = dir.join("lb_config");
    std::fs::remove_file(&pin).unwrap();
    bpftool::batch(&format!(
        "map create {p} type array key 4 value 40 entries 1 name lb_config
map update pinned {p} key 0 0 0 0 value {}
",
        hex.join(" "),
        p = pin.display()
    ))
    .unwrap();
    record_layout(&dir, "lb_config", 2);
    let old_id = map_id(&pin);
    d.restart().unwrap();

    let st = status(&d, "cfg");
    assert_eq!(st["applied"], true, "{st}");
    let log = d.log();
    assert!(
        log.contains("replacing pinned maps of another layout")
            && log.contains("lb_config (layout 2, this lb reads 3)")
            && log.contains("carried over"),
        "the log says what was replaced and carried:\n{log}"
    );
    assert_ne!(map_id(&pin), old_id, "lb_config replaced");
    assert_eq!(map_id(&dir.join("lb_flows")), flows_id, "lb_flows adopted");
    assert_eq!(recorded_layout(&dir, "lb_config"), 3, "recorded anew");
    let after = config(&dir);
    assert_eq!(
        after.hash_key, before.hash_key,
        "the flow-hash key carried over"
    );
    assert_eq!(
        after, before,
        "the network's own config, tcp_time_wait included"
    );
    still_served(&mut sessions, &replies, "the conversion");

    // As LRU pressure would: every entry gone; each connection's next packet re-creates it
    // by the flow hash, which must be the old one to find the same backends.
    let flows = aya::maps::MapData::from_pin(dir.join("lb_flows")).unwrap();
    let mut flows: aya::maps::HashMap<_, lb_common::FlowKey, lb_common::Flow> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(flows)).unwrap();
    let keys: Vec<lb_common::FlowKey> = flows.keys().filter_map(|k| k.ok()).collect();
    for k in &keys {
        let _ = flows.remove(k);
    }
    still_served(&mut sessions, &replies, "losing every flow entry");
}

/// Replaces every map pinned in `dir` by one as an lb of before the BTF maps (aya-ebpf's
/// legacy `maps` section) pinned it: the same type, key and value sizes, capacity, flags and
/// name, and no BTF; what the map held is copied over (per-CPU statistics excepted: they
/// start at zero, as a replaced statistics map does). The maps that lb had none of then (those
/// of dual stack, from `lb_vips6` on) are unpinned. Returns the new maps' ids by name.
fn pin_without_btf(dir: &Path) -> BTreeMap<String, u32> {
    const BEFORE_DUAL_STACK: usize = 15;
    for (map, _) in &lb_common::MAP_LAYOUTS[BEFORE_DUAL_STACK..] {
        std::fs::remove_file(dir.join(map)).unwrap();
    }
    let mut ids = BTreeMap::new();
    let legacy = &lb_common::MAP_LAYOUTS[..BEFORE_DUAL_STACK];
    for (map, _) in legacy.iter().chain([&(LAYOUT_MAP, 0)]) {
        let pin = dir.join(map);
        let show = bpftool::map_show(&pin).unwrap();
        assert!(show["btf_id"].is_u64(), "{map}: lb pins BTF maps: {show}");
        let dump = bpftool::json(&["map", "dump", "pinned", pin.to_str().unwrap()]).unwrap();
        std::fs::remove_file(&pin).unwrap();
        let field = |f: &str| show[f].to_string().trim_matches('"').to_owned();
        let mut script = format!(
            "map create {} type {} key {} value {} entries {} name {} flags {}\n",
            pin.display(),
            field("type"),
            field("bytes_key"),
            field("bytes_value"),
            field("max_entries"),
            field("name"),
            field("flags"),
        );
        let bytes = |v: &Value| -> String {
            (v.as_array().unwrap().iter())
                .map(|b| b.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        };
        for e in dump.as_array().unwrap() {
            if e.get("value").is_some() {
                script += &format!(
                    "map update pinned {} key {} value {}\n",
                    pin.display(),
                    bytes(&e["key"]),
                    bytes(&e["value"])
                );
            }
        }
        bpftool::batch(&script).unwrap_or_else(|e| panic!("{map}: {e:#}"));
        let legacy = bpftool::map_show(&pin).unwrap();
        assert!(legacy.get("btf_id").is_none(), "{map}: {legacy}");
        ids.insert(map.to_string(), map_id(&pin));
    }
    ids
}

/// Maps pinned by an lb of before the BTF maps carry no BTF, and are otherwise the same (type,
/// sizes, capacity, flags): this lb adopts them as they are, with their contents — replacing
/// them only to get BTF would drop every flow. Its programs run on them, flows are written to
/// the adopted `lb_flows`, and 20 connections live through an upgrade to a newer build; the
/// maps keep no BTF (bpftool dumps them as bytes) until they are created again.
#[test]
fn maps_pinned_without_btf_are_adopted_as_they_are() {
    if !require_root("maps_pinned_without_btf_are_adopted_as_they_are") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let mut d = start(&bpffs, &[]);
    network(&d, &topo, "old", 2, "tc");
    let dir = bpffs.path().join("old");
    d.stop();
    let legacy = pin_without_btf(&dir);
    d.restart().unwrap();
    let st = status(&d, "old");
    assert_eq!(st["applied"], true, "{st}");
    let (mut sessions, replies) = open_sessions(&topo);

    let object = patched_object(d.state_dir().parent().unwrap());
    d.set_env(&[("LB_EBPF_OBJECT", object.to_str().unwrap())]);
    d.restart().unwrap();
    let st = status(&d, "old");
    assert_eq!(st["applied"], true, "{st}");
    assert_eq!(st["flows"], CONNECTIONS, "{st}");
    still_served(&mut sessions, &replies, "the upgrade");
    for (map, id) in &legacy {
        let pin = dir.join(map);
        assert_eq!(map_id(&pin), *id, "{map} adopted, not replaced");
        let show = bpftool::map_show(&pin).unwrap();
        assert!(show.get("btf_id").is_none(), "{map} has BTF now: {show}");
    }
    let flows = dir.join("lb_flows");
    let dump = bpftool::map_dump(&flows).unwrap_err();
    println!("lb_flows pinned without BTF, after the upgrade: {dump:#}");
    assert!(
        !d.log().contains("replacing pinned maps"),
        "nothing replaced:\n{}",
        d.log()
    );
}
