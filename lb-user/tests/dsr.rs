//! DSR mode through `lb daemon`, on eBPF at TC, eBPF at XDP and nftables, over the switch
//! topology ([`lb_tests::switch`]): client, balancer and 4 backends as hosts on one bridge,
//! the backends owning the VIP on `lo`. The balancer sees the client's packets only; the
//! backends answer the client directly from the VIP, and the switch counts which ports every
//! packet took, so "no reply passed the balancer" is counted, not inferred.
//!
//! The network publishes a port too (served by NAT, as moby does on a dsr network). Its
//! backends answer the client on the segment directly, not through the balancer, so it runs
//! with `--masquerade always` (moby's ingress masquerades likewise): then the published port's
//! replies come back through the balancer, while VIP traffic, never translated, still shows the
//! backends the client's own address.
//!
//! The IPv6 twin (`dsr6_*`) runs the same contract, step for step, over IPv6 on the same
//! segment ([`Switch::dual_stack`]: the VIP's IPv6 address on every backend's `lo`, the
//! clients' neighbour solicitations for it answered by the balancer alone). Root only.
use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, datapath, free_metrics_addr, scrape},
    plane::Plane,
    poll_until, require_root,
    switch::{Switch, VIP, VIP6},
    tools::tcp_established,
    traffic::{
        Backend, TIMEOUT, TcpSession, UdpSession, assert_uniform_over_4, parse_answer,
        spawn_backend6, spawn_backends, tcp_request,
    },
};
use serde_json::Value;

const NET: &str = "dsr";
/// Backends answer TCP and UDP on PORT; VIP traffic keeps its port (DSR rewrites MACs only).
const PORT: u16 = 8080;
/// Published on the balancer's address, `tcp/PUB:PORT`.
const PUB: u16 = 9080;
const BACKENDS: usize = 4;
/// Long-lived connections that must keep their backend.
const LONG_LIVED: usize = 8;
/// What a broken dataplane gets before a wait fails (a bound against hanging, not a
/// measurement: each wait asserts that something happened, not how fast).
const PATIENCE: Duration = Duration::from_secs(20);

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// A backend's answer: who answered, and the client address it saw.
struct Reply {
    backend: String,
    peer: SocketAddr,
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.backend, self.peer)
    }
}

fn reply(answer: &str) -> Reply {
    let (backend, peer) = parse_answer(answer).unwrap();
    Reply { backend, peer }
}

/// The switch and the addresses of one family the contract runs over: IPv4's, or IPv6's of a
/// [`Switch::dual_stack`].
struct Net {
    sw: Switch,
    vip: IpAddr,
    client: IpAddr,
    balancer: IpAddr,
    backends: Vec<IpAddr>,
}

impl Net {
    fn v4(sw: Switch) -> Net {
        Net {
            vip: VIP.into(),
            client: sw.client_ip().into(),
            balancer: sw.balancer_ip().into(),
            backends: sw.topo.backend_ips.iter().map(|&b| b.into()).collect(),
            sw,
        }
    }

    fn v6(sw: Switch) -> Net {
        let v6 = sw.v6().clone();
        Net {
            vip: VIP6.into(),
            client: v6.client.into(),
            balancer: v6.node.into(),
            backends: v6.backends.iter().map(|&b| b.into()).collect(),
            sw,
        }
    }

    /// The backends' servers: IPv4's, and IPv6's beside them on a dual-stack switch (UDP
    /// answered from the VIP, as IPv4's is by `IP_PKTINFO`).
    fn serve(&self) -> Vec<Backend> {
        let mut servers = spawn_backends(&self.sw.topo, PORT, PORT).unwrap();
        if self.vip.is_ipv6() {
            for (i, ns) in self.sw.topo.backends.iter().enumerate() {
                servers.push(spawn_backend6(ns, &format!("b{i}"), PORT, VIP6).unwrap());
            }
        }
        servers
    }

    /// `ip -4`/`ip -6`: the family's neighbour table.
    fn ip_family(&self) -> &'static str {
        if self.vip.is_ipv6() { "-6" } else { "-4" }
    }
}

/// `lb daemon` on `plane`'s dataplane, its metrics on `metrics`, the flow collector every
/// second (it counts the DSR sessions `lb status` shows).
fn start(plane: Plane, bpffs: &Bpffs, metrics: &str) -> LbDaemon {
    let dataplane = if plane == Plane::Nft {
        "nftables"
    } else {
        "ebpf"
    };
    let args = [
        "--dataplane",
        dataplane,
        "--metrics",
        metrics,
        "--gc-secs",
        "1",
    ];
    LbDaemon::start(lb(), bpffs.path(), &args).expect("lb daemon starts")
}

/// `lb network add` of the dsr network on the balancer's interface, with `extra` flags.
fn add_network(d: &LbDaemon, sw: &Switch, plane: Plane, extra: &[&str]) {
    let mut args = vec![
        "network",
        "add",
        NET,
        "--netns",
        sw.balancer().name(),
        "--interface",
        sw.balancer_if(),
        "--mode",
        "dsr",
        "--masquerade",
        "always",
    ];
    if plane == Plane::Xdp {
        args.extend(["--attach", "xdp"]);
    }
    args.extend(extra);
    d.ok(&args);
}

/// `lb service set` of the one service: the VIP, the published port and every backend,
/// `disabled` marked so.
fn set_service(d: &LbDaemon, n: &Net, disabled: Option<IpAddr>) {
    let mut args: Vec<String> = [
        "service",
        "set",
        NET,
        "web",
        "--vip",
        &n.vip.to_string(),
        "--port",
        &format!("tcp/{PUB}:{PORT}"),
    ]
    .map(String::from)
    .into();
    for &b in &n.backends {
        let flag = if Some(b) == disabled { ",disabled" } else { "" };
        args.extend(["--backend".into(), format!("{b}{flag}")]);
    }
    d.ok(&args);
}

/// The index of the backend that answered as `name` (`b<i>`).
fn backend_index(name: &str) -> usize {
    (name.strip_prefix('b').and_then(|i| i.parse().ok()))
        .unwrap_or_else(|| panic!("not a backend name: {name}"))
}

/// The address of the backend that answered as `name`.
fn backend_ip(n: &Net, name: &str) -> IpAddr {
    n.backends[backend_index(name)]
}

/// One request on a fresh TCP connection to the VIP, answered by a backend that saw the
/// client itself.
fn ask_vip_tcp(n: &Net) -> Reply {
    let r = reply(
        &tcp_request(n.sw.client(), n.vip, PORT, TIMEOUT)
            .unwrap_or_else(|e| panic!("tcp VIP: {e:#}")),
    );
    assert_eq!(r.peer.ip(), n.client, "the backend sees the client: {r}");
    r
}

/// Until new connections to the VIP have reached every backend: the controller resolves the
/// backends' MACs after the network is applied, and until then a backend takes no new
/// sessions (so a count taken earlier would be skewed by setup, not by the hash).
fn wait_all_backends(d: &LbDaemon, n: &Net) {
    let mut seen = BTreeMap::new();
    let short = Duration::from_millis(500);
    let all = poll_until(PATIENCE, || {
        if let Ok(a) = tcp_request(n.sw.client(), n.vip, PORT, short) {
            *seen.entry(reply(&a).backend).or_insert(0) += 1;
        }
        seen.len() == BACKENDS
    });
    assert!(
        all.is_some(),
        "new connections to the VIP reached only {seen:?} within {PATIENCE:?}\nstatus: {}\ndaemon log:\n{}",
        d.network_status(NET),
        d.log()
    );
}

/// The network's warnings in `lb status --json`.
fn warnings(d: &LbDaemon) -> Vec<String> {
    let n = d.network_status(NET);
    (n["warnings"].as_array().into_iter().flatten())
        .map(|w| w.as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The `lb conntrack` row of the `proto` session from `client` (`ip:port`), if listed.
fn session(d: &LbDaemon, proto: &str, client: &str) -> Option<Value> {
    (d.conntrack(NET).into_iter()).find(|r| r["proto"] == proto && r["client"] == client)
}

/// A DSR session row: state `dsr`, the VIP and port as its frontend, `backend` as its
/// backend (`IP:PORT`, the VIP's port, as NAT rows show a backend), and its idle time.
fn assert_dsr_row(n: &Net, row: &Value, backend: IpAddr) {
    assert_eq!(row["state"], "dsr", "{row}");
    assert_eq!(
        row["frontend"],
        SocketAddr::new(n.vip, PORT).to_string(),
        "{row}"
    );
    assert_eq!(
        row["backend"],
        SocketAddr::new(backend, PORT).to_string(),
        "{row}"
    );
    assert!(
        row["idle_secs"].is_u64(),
        "a DSR session shows its idle time: {row}"
    );
}

/// The whole contract on one dataplane, over IPv4 or (`v6`) IPv6; see each step.
fn dsr(plane: Plane, v6: bool) {
    let n = if v6 {
        Net::v6(Switch::dual_stack(BACKENDS, true).unwrap())
    } else {
        Net::v4(Switch::new(BACKENDS, true).unwrap())
    };
    let sw = &n.sw;
    if plane == Plane::Xdp {
        // XDP leaves a packet whose checksum may be a CHECKSUM_PARTIAL seed (what a veth
        // carries from a sender with offload on) to TC: the client computes its checksums,
        // so XDP sends every VIP frame itself (XDP_TX, to the XDP program of its peer).
        sw.client().set_tx_checksum("eth0", false).unwrap();
    }
    let _servers = n.serve();
    let bpffs = Bpffs::new().unwrap();
    let metrics = free_metrics_addr().unwrap();
    let mut d = start(plane, &bpffs, &metrics);
    add_network(&d, sw, plane, &[]);
    set_service(&d, &n, None);
    wait_all_backends(&d, &n);
    println!("{}", d.ok(&["status"]));
    if plane == Plane::Xdp {
        let w = warnings(&d);
        assert!(
            !w.iter().any(|w| w.contains("has no XDP program")),
            "the balancer's peer has an XDP program: no warning about it, got {w:?}"
        );
    }

    spread_and_bypass(&d, &n);
    counted(&d, &n, plane, &metrics);
    real_server_elements(&d, &n);
    let long = sticky_after_disable(&d, &n);
    let long = survives_restart(&mut d, long);
    rst_ends_the_session(&d, &n, &long);
    drop(long);
    published_port_is_nat(&d, &n, &metrics);
    idle_udp_session_expires(&d, &n, plane);
}

/// 400 TCP connections and 100 UDP queries from connected sockets: all answered, from the VIP
/// (a connected socket sees nothing else), uniformly over the 4 backends, each backend seeing
/// the client; and at the switch, every packet from the VIP went from a backend's port to the
/// client's, none by the balancer's port, while every client packet to the VIP went to the
/// balancer (only the balancer answers ARP for the VIP) and the balancer sent it on to each
/// backend.
fn spread_and_bypass(d: &LbDaemon, n: &Net) {
    let sw = &n.sw;
    const TCP: usize = 400;
    const UDP: usize = 100;
    sw.reset_counts().unwrap();
    let mut tcp: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..TCP {
        *tcp.entry(ask_vip_tcp(n).backend).or_default() += 1;
    }
    let mut udp: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..UDP {
        let r = reply(
            &UdpSession::connected(sw.client(), n.vip, PORT, TIMEOUT)
                .and_then(|mut s| s.ask())
                .unwrap_or_else(|e| panic!("udp VIP: {e:#}\nstatus: {}", d.network_status(NET))),
        );
        assert_eq!(r.peer.ip(), n.client, "the backend sees the client: {r}");
        *udp.entry(r.backend).or_default() += 1;
    }
    assert_uniform_over_4(&tcp, "400 TCP connections to the VIP");
    assert_uniform_over_4(&udp, "100 UDP queries to the VIP");

    let hops = sw.counts().unwrap();
    println!("at the switch:\n{hops}");
    let replies = hops.select(|h| h.src == n.vip);
    let backend_ports: Vec<String> = (0..BACKENDS).map(|i| sw.backend_port(i)).collect();
    let total = replies.packets(|_| true);
    // A TCP exchange is at least SYN-ACK and the answer from the backend; a query one datagram.
    assert!(
        total >= (2 * TCP + UDP) as u64,
        "{total} replies counted:\n{hops}"
    );
    assert_eq!(
        replies.packets(|h| h.touches(sw.balancer_port())),
        0,
        "no reply passes the balancer's port:\n{replies}"
    );
    assert_eq!(
        replies.packets(|h| h.out_port == sw.client_port() && backend_ports.contains(&h.in_port)),
        total,
        "every reply goes from a backend's port to the client's:\n{replies}"
    );
    let requests = hops.select(|h| h.src == n.client && h.dst == n.vip);
    assert_eq!(
        requests.packets(|h| h.in_port == sw.client_port() && h.out_port == sw.balancer_port()),
        requests.packets(|h| h.in_port == sw.client_port()),
        "the client sends every VIP packet to the balancer:\n{requests}"
    );
    for port in &backend_ports {
        assert!(
            requests.packets(|h| h.in_port == sw.balancer_port() && h.out_port == *port) > 0,
            "the balancer sends VIP packets on to {port}:\n{requests}"
        );
        assert!(
            replies.packets(|h| h.in_port == *port) > 0,
            "the backend on {port} answers directly:\n{replies}"
        );
    }
}

/// After `spread_and_bypass`: the metrics count every backend of the VIP (eBPF: every packet
/// the balancer sent it, at least one per connection and query; nftables: the sessions it
/// started), eBPF counts the sessions opened by the program that took them, and `lb status`
/// counts live sessions as flows in state `dsr`.
fn counted(d: &LbDaemon, n: &Net, plane: Plane, metrics: &str) {
    let text = scrape(metrics).unwrap();
    let vip = n.vip;
    for b in &n.backends {
        let series = format!(
            "lb_packets_total{{network=\"{NET}\",service=\"web\",frontend=\"{vip}\",backend=\"{b}\"}} "
        );
        let n: u64 = (text.lines())
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series}in:\n{text}"));
        assert!(
            n >= 60,
            "backend {b} counted {n} packets (about 125 sessions each)"
        );
    }
    if plane != Plane::Nft {
        let hook = if plane == Plane::Xdp {
            "xdp"
        } else {
            "tc_ingress"
        };
        let new = datapath(&text, NET, hook, "dsr_new");
        assert!(
            new >= 500,
            "{hook} opened {new} DSR sessions for 500 clients"
        );
        assert!(
            datapath(&text, NET, hook, "dsr_session") > 0,
            "{hook} carried packets of live sessions"
        );
    }
    let sessions = poll_until(PATIENCE, || {
        let st = d.network_status(NET);
        let n = st["flows_by_state"]["dsr"].as_u64().unwrap_or(0);
        n >= 400
    });
    assert!(
        sessions.is_some(),
        "lb status counts the live sessions as dsr flows: {}",
        d.network_status(NET)
    );
}

/// `lb elements` prints the real-server partition of the VIP over the 4 backends.
fn real_server_elements(d: &LbDaemon, n: &Net) {
    let elements = d.elements(NET);
    println!("{elements}");
    let prefix = format!("real-server {} . ", n.vip);
    let mut backends: Vec<IpAddr> = (elements.lines())
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (interval, backend) = rest
                .split_once(" : ")
                .unwrap_or_else(|| panic!("not `a-b : BACKEND`: {rest}"));
            assert!(
                interval.split_once('-').is_some(),
                "not an interval: {rest}"
            );
            backend
                .parse()
                .unwrap_or_else(|_| panic!("not a backend: {rest}"))
        })
        .collect();
    backends.sort();
    let mut want = n.backends.clone();
    want.sort();
    assert_eq!(backends, want, "one interval per backend:\n{elements}");
}

/// 8 long-lived connections, then the backend of the first disabled: every connection keeps
/// answering from its own backend, the disabled one's included, and 40 new connections all
/// go elsewhere. Returns the connections with their backends.
fn sticky_after_disable(d: &LbDaemon, n: &Net) -> Vec<(TcpSession, String)> {
    let mut long: Vec<(TcpSession, String)> = (0..LONG_LIVED)
        .map(|_| {
            let mut s = TcpSession::connect(n.sw.client(), n.vip, PORT, TIMEOUT).unwrap();
            let backend = reply(&s.ask().unwrap()).backend;
            (s, backend)
        })
        .collect();
    let victim = long[0].1.clone();
    set_service(d, n, Some(backend_ip(n, &victim)));
    println!("{victim} disabled");
    ask_long_lived(&mut long, "after its backend was disabled");
    for _ in 0..40 {
        let r = ask_vip_tcp(n);
        assert_ne!(
            r.backend, victim,
            "a new connection went to the disabled backend"
        );
    }
    long
}

/// Each long-lived connection answers again, from its own backend.
fn ask_long_lived(long: &mut [(TcpSession, String)], when: &str) {
    for (i, (s, backend)) in long.iter_mut().enumerate() {
        let r = reply(
            &s.ask()
                .unwrap_or_else(|e| panic!("long-lived connection {i} ({backend}) {when}: {e:#}")),
        );
        assert_eq!(r.backend, *backend, "long-lived connection {i} {when}");
    }
}

/// The daemon killed (SIGKILL, by its pid) and started again: the long-lived connections —
/// those on the disabled backend too, which no new session would reach, so only a kept
/// session serves them — answer from their backends while it is gone and after it is back.
fn survives_restart(
    d: &mut LbDaemon,
    mut long: Vec<(TcpSession, String)>,
) -> Vec<(TcpSession, String)> {
    let pid = d.pid().expect("the daemon runs");
    d.kill9();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the daemon (pid {pid}) is gone"
    );
    ask_long_lived(&mut long, "while the daemon is gone");
    d.restart().expect("lb daemon restarts");
    let applied = poll_until(PATIENCE, || d.network_status(NET)["applied"] == true);
    assert!(
        applied.is_some(),
        "the restarted daemon applies the network: {}\n{}",
        d.network_status(NET),
        d.log()
    );
    ask_long_lived(&mut long, "after the daemon restarted");
    long
}

/// A connection's session is listed (state `dsr`, its backend, idle time); the client resets
/// the connection, and once the backend has seen the RST — which passed the balancer first —
/// the session is no longer listed, while the long-lived ones still are. The RST ends the
/// session on the packet path, so no timeout (60 s by default) is waited for.
fn rst_ends_the_session(d: &LbDaemon, n: &Net, long: &[(TcpSession, String)]) {
    let mut s = TcpSession::connect(n.sw.client(), n.vip, PORT, TIMEOUT).unwrap();
    let r = reply(&s.ask().unwrap());
    let port = s.local_addr().unwrap().port();
    let client = SocketAddr::new(n.client, port).to_string();
    let row = session(d, "tcp", &client)
        .unwrap_or_else(|| panic!("no session of {client}: {:?}", d.conntrack(NET)));
    println!("before the RST: {row}");
    assert_dsr_row(n, &row, backend_ip(n, &r.backend));

    let backend = &n.sw.topo.backends[backend_index(&r.backend)];
    assert!(tcp_established(backend, port).unwrap());
    let reset = Instant::now();
    s.reset().unwrap();
    let seen = poll_until(PATIENCE, || !tcp_established(backend, port).unwrap());
    assert!(
        seen.is_some(),
        "the RST of {client} never reached {}",
        r.backend
    );
    let after = session(d, "tcp", &client);
    println!("the RST reached the backend after {:?}", reset.elapsed());
    assert!(
        after.is_none(),
        "the RST ends the session at once: {after:?}"
    );
    for (s, backend) in long {
        let client = SocketAddr::new(n.client, s.local_addr().unwrap().port()).to_string();
        let row = session(d, "tcp", &client)
            .unwrap_or_else(|| panic!("the long-lived {client} ({backend}) is still listed"));
        assert_dsr_row(n, &row, backend_ip(n, backend));
    }
}

/// The published port, on the balancer's address: NAT, so a backend answers (seeing the
/// balancer: masquerade `always`) and every packet of the exchange passes the balancer's port
/// — backend → balancer, balancer → client — and no backend answers the client with its own
/// address.
fn published_port_is_nat(d: &LbDaemon, n: &Net, metrics: &str) {
    let sw = &n.sw;
    sw.reset_counts().unwrap();
    let r = reply(
        &tcp_request(sw.client(), n.balancer, PUB, TIMEOUT).unwrap_or_else(|e| {
            panic!(
                "tcp {}: {e:#}\nflows: {:?}\nat the switch:\n{}\nmetrics:\n{}",
                SocketAddr::new(n.balancer, PUB),
                d.conntrack(NET),
                sw.counts().unwrap(),
                scrape(metrics).unwrap_or_default()
            )
        }),
    );
    assert_eq!(r.peer.ip(), n.balancer, "masqueraded: {r}");
    let (backend, i) = (backend_ip(n, &r.backend), backend_index(&r.backend));
    let hops = sw.counts().unwrap();
    println!("published port, answered by {}:\n{hops}", r.backend);
    let (balancer, client) = (sw.balancer_port(), sw.client_port());
    let hop = |src, dst, from: &str, to: &str| {
        hops.packets(|h| h.src == src && h.dst == dst && h.in_port == from && h.out_port == to)
    };
    assert!(hop(n.client, n.balancer, client, balancer) > 0, "{hops}");
    assert!(
        hop(n.balancer, backend, balancer, &sw.backend_port(i)) > 0,
        "{hops}"
    );
    assert!(
        hop(backend, n.balancer, &sw.backend_port(i), balancer) > 0,
        "{hops}"
    );
    assert!(hop(n.balancer, n.client, balancer, client) > 0, "{hops}");
    assert_eq!(
        hops.packets(|h| h.dst == n.client && n.backends.contains(&h.src)),
        0,
        "no backend answers the client with its own address:\n{hops}"
    );
}

/// With `--timeout dsr=2` (the network added again with it), a UDP session is listed with at
/// most 2 s left, and once idle past that it is no longer listed; the same socket is then
/// served again (a new session).
fn idle_udp_session_expires(d: &LbDaemon, n: &Net, plane: Plane) {
    d.ok(&["network", "rm", NET]);
    add_network(d, &n.sw, plane, &["--timeout", "dsr=2"]);
    set_service(d, n, None);
    wait_all_backends(d, n);
    let mut u = UdpSession::connected(n.sw.client(), n.vip, PORT, TIMEOUT).unwrap();
    let r = reply(&u.ask().unwrap());
    let client = SocketAddr::new(n.client, u.local_addr().unwrap().port()).to_string();
    let row = session(d, "udp", &client)
        .unwrap_or_else(|| panic!("no session of {client}: {:?}", d.conntrack(NET)));
    assert_dsr_row(n, &row, backend_ip(n, &r.backend));
    let left = row["expires_secs"].as_u64().unwrap_or(u64::MAX);
    assert!(left <= 2, "the dsr timeout applies: {row}");
    let gone = poll_until(PATIENCE, || session(d, "udp", &client).is_none());
    let took = gone.unwrap_or_else(|| {
        panic!(
            "the idle session is still listed: {:?}",
            session(d, "udp", &client)
        )
    });
    println!("the idle UDP session left lb conntrack after {took:?}");
    reply(&u.ask().expect("a new session for the same socket"));
}

#[test]
fn dsr_on_ebpf_tc() {
    if require_root("dsr_on_ebpf_tc") {
        dsr(Plane::Tc, false);
    }
}

#[test]
fn dsr_on_ebpf_xdp() {
    if require_root("dsr_on_ebpf_xdp") {
        dsr(Plane::Xdp, false);
    }
}

#[test]
fn dsr_on_nftables() {
    if require_root("dsr_on_nftables") {
        dsr(Plane::Nft, false);
    }
}

#[test]
fn dsr6_on_ebpf_tc() {
    if require_root("dsr6_on_ebpf_tc") {
        dsr(Plane::Tc, true);
    }
}

#[test]
fn dsr6_on_ebpf_xdp() {
    if require_root("dsr6_on_ebpf_xdp") {
        dsr(Plane::Xdp, true);
    }
}

/// The nftables dataplane's IPv6 DSR (`dataplane::nft::dsr`: a session set per backend,
/// since nft 1.0.6 cannot learn a session map keyed by IPv6 addresses), held to the same
/// contract.
#[test]
fn dsr6_on_nftables() {
    if require_root("dsr6_on_nftables") {
        dsr(Plane::Nft, true);
    }
}

/// XDP_TX out of the balancer's veth reaches the switch only through the peer's (`sw0`) XDP
/// receive path: with GRO alone there (which the kernel documents as enough) the frames are
/// lost on this kernel, and `lb status` says so; with an XDP program there, they arrive and
/// the warning goes.
#[test]
fn dsr_on_xdp_warns_when_the_balancers_peer_has_no_xdp_program() {
    if !require_root("dsr_on_xdp_warns_when_the_balancers_peer_has_no_xdp_program") {
        return;
    }
    let mut n = Net::v4(Switch::new(BACKENDS, false).unwrap());
    n.sw.set_balancer_peer_gro(true).unwrap();
    // Full checksums from the client, so that XDP (not TC) sends the VIP frames.
    n.sw.client().set_tx_checksum("eth0", false).unwrap();
    let _servers = n.serve();
    let bpffs = Bpffs::new().unwrap();
    let d = start(Plane::Xdp, &bpffs, &free_metrics_addr().unwrap());
    add_network(&d, &n.sw, Plane::Xdp, &[]);
    set_service(&d, &n, None);
    let missing = |w: &[String]| w.iter().any(|w| w.contains("has no XDP program"));
    let warned = poll_until(PATIENCE, || missing(&warnings(&d)));
    assert!(warned.is_some(), "no warning: {}", d.network_status(NET));
    let w = warnings(&d);
    println!("{w:?}");
    assert!(
        w.iter().any(|w| w.contains("it has GRO on")),
        "the warning says GRO is not enough: {w:?}"
    );
    let ask = |sw: &Switch| {
        UdpSession::connected(sw.client(), VIP, PORT, Duration::from_secs(1))
            .and_then(|mut s| s.ask())
    };
    assert!(
        ask(&n.sw).is_err(),
        "a query answered although XDP_TX frames to a GRO-only peer are lost (the warning would be wrong)"
    );

    n.sw.attach_balancer_peer_xdp().unwrap();
    let gone = poll_until(PATIENCE, || !missing(&warnings(&d)));
    assert!(gone.is_some(), "the warning stays: {:?}", warnings(&d));
    let r = reply(&ask(&n.sw).expect("answered once the peer has an XDP program"));
    assert_eq!(r.peer.ip(), n.client, "{r}");
}

/// A backend the balancer cannot reach by MAC (on the segment's subnet, but no host answers
/// ARP, or neighbour solicitation for IPv6, for it) gets no new sessions on eBPF: every
/// connection is served by the others, and `lb status` says why. The daemon keeps the
/// backends resolved with managed neighbour entries of its own (`managed extern_learn`), and
/// removes them with the network.
fn unresolved_backend_gets_no_sessions(v6: bool) {
    let (n, ghost): (Net, IpAddr) = if v6 {
        let sw = Switch::dual_stack(2, false).unwrap();
        (
            Net::v6(sw),
            Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 0x200).into(),
        )
    } else {
        (
            Net::v4(Switch::new(2, false).unwrap()),
            [10, 30, 0, 200].into(),
        )
    };
    let _servers = n.serve();
    let bpffs = Bpffs::new().unwrap();
    let d = start(Plane::Tc, &bpffs, &free_metrics_addr().unwrap());
    add_network(&d, &n.sw, Plane::Tc, &[]);
    let mut args: Vec<String> = ["service", "set", NET, "web", "--vip", &n.vip.to_string()]
        .map(String::from)
        .into();
    for b in n.backends.iter().chain([&ghost]) {
        args.extend(["--backend".into(), b.to_string()]);
    }
    d.ok(&args);
    let why = format!("dsr backend {ghost} gets no new sessions");
    let warned = poll_until(PATIENCE, || warnings(&d).iter().any(|w| w.contains(&why)));
    assert!(warned.is_some(), "{why}: {:?}", warnings(&d));
    println!("{:?}", warnings(&d));
    let mut seen = BTreeMap::new();
    for _ in 0..40 {
        *seen.entry(ask_vip_tcp(&n).backend).or_insert(0) += 1;
    }
    assert_eq!(
        seen.len(),
        2,
        "both real backends serve, nothing is lost: {seen:?}"
    );
    let managed = |n: &Net| -> Vec<String> {
        (n.sw
            .balancer()
            .ip([n.ip_family(), "neigh", "show", "nud", "all"])
            .unwrap()
            .lines())
        .filter(|l| l.contains("managed") && l.contains("extern_learn"))
        .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
        .collect()
    };
    let mut ours = managed(&n);
    ours.sort();
    let mut want: Vec<String> = (n.backends.iter().chain([&ghost]))
        .map(|b| b.to_string())
        .collect();
    want.sort();
    assert_eq!(ours, want, "lb keeps every backend resolved");
    d.ok(&["network", "rm", NET]);
    assert_eq!(
        managed(&n),
        Vec::<String>::new(),
        "removed with the network"
    );
}

#[test]
fn dsr_unresolved_backend_gets_no_sessions_and_status_says_why() {
    if require_root("dsr_unresolved_backend_gets_no_sessions_and_status_says_why") {
        unresolved_backend_gets_no_sessions(false);
    }
}

#[test]
fn dsr6_unresolved_backend_gets_no_sessions_and_status_says_why() {
    if require_root("dsr6_unresolved_backend_gets_no_sessions_and_status_says_why") {
        unresolved_backend_gets_no_sessions(true);
    }
}

/// A backend removed while a DSR session to it drains, then a new backend added: the new
/// backend's counters show only its own packets (issue 25: the removed backend's counter id
/// is not handed out while its session names it). On eBPF at TC and on nftables.
fn new_backend_counts_only_its_own(plane: Plane) {
    let n = Net::v4(Switch::new(BACKENDS, true).unwrap());
    let _servers = n.serve();
    let bpffs = Bpffs::new().unwrap();
    let d = start(plane, &bpffs, &free_metrics_addr().unwrap());
    add_network(&d, &n.sw, plane, &[]);
    let [b0, b1, b2] = [0, 1, 2].map(|i| n.backends[i].to_string());
    let vip = n.vip.to_string();
    d.ok(&[
        "service",
        "set",
        NET,
        "web",
        "--vip",
        &vip,
        "--backend",
        &b0,
        "--backend",
        &b1,
    ]);
    let mut draining = (0..64)
        .map(|_| TcpSession::connect(n.sw.client(), n.vip, PORT, TIMEOUT).unwrap())
        .find_map(|mut s| s.ask().unwrap().starts_with("b0 ").then_some(s))
        .expect("a connection lands on b0");
    let packets = |ip: &str| -> u64 {
        let list: Value = serde_json::from_str(&d.ok(&["service", "list", NET, "-j"])).unwrap();
        let web = (list.as_array().unwrap().iter())
            .find(|e| e["service"]["id"] == "web")
            .unwrap();
        (web["backends"].as_array().unwrap().iter())
            .find(|b| b["address"] == ip)
            .map_or(0, |b| b["packets"].as_u64().unwrap_or(0))
    };
    d.ok(&["service", "backend", "rm", NET, "web", &b0]);
    // Two more syncs: the first deletes what b0's removal retired, the second would hand
    // its counter id out again, to b2.
    d.ok(&["service", "set", NET, "other", "--vip", "10.99.0.77"]);
    d.ok(&["service", "backend", "add", NET, "web", &b2]);
    let b1_before = packets(&b1);
    for i in 0..30 {
        let r = draining
            .ask()
            .unwrap_or_else(|e| panic!("{plane:?}: ask {i}: {e:#}"));
        assert!(
            r.starts_with("b0 "),
            "{plane:?}: the removed backend drains: {r}"
        );
    }
    assert_eq!(
        packets(&b1),
        b1_before,
        "{plane:?}: b1 counts nothing of it"
    );
    assert_eq!(packets(&b2), 0, "{plane:?}: b2 has carried nothing yet");
    let hit = (0..40).any(|_| {
        tcp_request(n.sw.client(), n.vip, PORT, TIMEOUT)
            .unwrap()
            .starts_with("b2 ")
    });
    assert!(hit, "{plane:?}: b2 is served");
    assert!(packets(&b2) > 0, "{plane:?}: and counts its own packets");
}

#[test]
fn dsr_new_backend_counts_only_its_own_packets() {
    if require_root("dsr_new_backend_counts_only_its_own_packets") {
        new_backend_counts_only_its_own(Plane::Tc);
        new_backend_counts_only_its_own(Plane::Nft);
    }
}
