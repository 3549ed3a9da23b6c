//! `lb-cni` driven as a container runtime drives it: a small CNI runtime here execs each
//! plugin of a conflist with the `CNI_*` environment and its config on stdin, passing each
//! result on as the next one's `prevResult` and deleting in reverse order, as libcni does.
//! The chain is Nomad's bridge networking (seed 002: loopback, bridge with hairpin, gateway
//! and masquerade, host-local, firewall) with `lb-cni` in place of `portmap`, the real plugins
//! of Debian's containernetworking-plugins. The plugins run inside a "node" namespace, as a
//! node's runtime runs them in its own; the daemon's network lives there too. Root only.
use std::{
    io::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{FailingNft, LbDaemon},
    netns::Netns,
    require_root,
    tools::{TempDir, output_with_stdin},
    traffic::{DualServer, TIMEOUT, spawn_backend, tcp_ask, tcp_request, udp_request},
};
use lb_user::api::{Client, Request, ServiceEntry};
use serde_json::{Value, json};

/// Where Debian's containernetworking-plugins puts the plugins.
const CNI_DIR: &str = "/usr/lib/cni";
const NET: &str = "nomad";
const BRIDGE: &str = "nomad";
const SUBNET: &str = "172.26.64.0/20";
/// The node's external address (on `ext0`) and the client's, on one link.
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 1);
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 2);
/// The same link's IPv6 addresses, and the bridge's IPv6 range, for the dual-stack chains.
const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd21, 0, 0, 0, 0, 0, 0, 1);
const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd21, 0, 0, 0, 0, 0, 0, 2);
const SUBNET6: &str = "fd26:64::/64";
/// The IPv6-only chain's bridge and range.
const BRIDGE6: &str = "nomad6";
const SUBNET6_ONLY: &str = "fd26:65::/64";
/// Where each container's server listens (TCP and UDP), and the host ports.
const CONTAINER_PORT: u16 = 8080;
const HOST_PORTS: [u16; 2] = [20001, 20002];

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// The runtime's side of one plugin invocation's outcome.
#[derive(Debug)]
#[expect(
    dead_code,
    reason = "stderr is read through Debug, in a failure's message"
)]
struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("plugin output is not JSON ({e}): {self:?}"))
    }

    /// Asserts that this is a CNI error of `code` whose details contain `detail`.
    fn assert_error(&self, code: u64, detail: &str, what: &str) {
        let err = self.json();
        assert_eq!(err["code"], code, "{what}: {self:?}");
        assert!(
            err["details"].as_str().unwrap_or_default().contains(detail),
            "{what}: details name {detail:?}: {err}"
        );
    }
}

/// The tiny runtime: one conflist, plugins run in `node`.
struct Runtime<'a> {
    node: &'a Netns,
    conflist: Value,
    /// host-local's leases, private to this test.
    _ipam_dir: TempDir,
}

/// A container: its namespace and the id the runtime gives it.
struct Container {
    id: String,
    ns: Netns,
}

impl Container {
    fn new(id: &str) -> Container {
        Container {
            id: id.to_owned(),
            ns: Netns::new("ctr").unwrap(),
        }
    }
}

impl<'a> Runtime<'a> {
    /// Nomad's template (seed 002) with loopback first, hairpin on, and `lb-cni` for `portmap`.
    fn nomad(node: &'a Netns, node_netns: &str, socket: &Path) -> Runtime<'a> {
        let ipam_dir = TempDir::new("cni-ipam").unwrap();
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "nomad",
            "plugins": [
                {"type": "loopback"},
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "ipMasq": true,
                    "isGateway": true,
                    "forceAddress": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": ipam_dir.path(),
                        "ranges": [[{"subnet": SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}]
                    }
                },
                {"type": "firewall", "backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN"},
                {
                    "type": "lb-cni",
                    "capabilities": {"portMappings": true},
                    "socket": socket,
                    "network": NET,
                    "externalInterfaces": ["ext0"],
                    "netns": node_netns
                }
            ]
        });
        Runtime {
            node,
            conflist,
            _ipam_dir: ipam_dir,
        }
    }

    fn plugins(&self) -> Vec<Value> {
        self.conflist["plugins"].as_array().unwrap().clone()
    }

    fn binary(kind: &str) -> PathBuf {
        match kind {
            "lb-cni" => PathBuf::from(env!("CARGO_BIN_EXE_lb-cni")),
            other => Path::new(CNI_DIR).join(other),
        }
    }

    /// One plugin, as libcni builds its config: the list's name and version, `prevResult`,
    /// and `runtimeConfig` for the capabilities it declares.
    fn exec(
        &self,
        plugin: &Value,
        command: &str,
        c: &Container,
        prev: Option<&Value>,
        ports: &[Value],
        extra: &[(&str, Value)],
    ) -> Outcome {
        let mut conf = plugin.clone();
        let fields = conf.as_object_mut().unwrap();
        fields.insert("name".into(), self.conflist["name"].clone());
        fields.insert("cniVersion".into(), self.conflist["cniVersion"].clone());
        if let Some(prev) = prev {
            fields.insert("prevResult".into(), prev.clone());
        }
        if plugin["capabilities"]["portMappings"] == json!(true) {
            fields.insert("runtimeConfig".into(), json!({"portMappings": ports}));
        }
        for (k, v) in extra {
            fields.insert((*k).into(), v.clone());
        }
        let kind = plugin["type"].as_str().unwrap();
        let out = output_with_stdin(
            Command::new("ip")
                .args(["netns", "exec", self.node.name()])
                .arg(Self::binary(kind))
                .env("CNI_COMMAND", command)
                .env("CNI_CONTAINERID", &c.id)
                .env("CNI_NETNS", c.ns.path())
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", CNI_DIR),
            conf.to_string().as_bytes(),
        )
        .unwrap();
        Outcome {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// ADD through the chain; the last result, or the failing plugin's outcome. After a
    /// failure the caller DELs the chain, as containerd and Nomad do, once it has looked at
    /// what the failed ADD itself left (a runtime's DEL must not be what cleans up).
    fn add(&self, c: &Container, ports: &[Value]) -> Result<Value, Outcome> {
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let out = self.exec(&plugin, "ADD", c, prev.as_ref(), ports, &[]);
            if !out.ok {
                return Err(out);
            }
            prev = Some(out.json());
        }
        Ok(prev.unwrap())
    }

    /// DEL in reverse order, with the cached ADD result as `prevResult` when there is one.
    fn del(&self, c: &Container, ports: &[Value], cached: Option<&Value>) -> Result<(), Outcome> {
        for plugin in self.plugins().iter().rev() {
            let out = self.exec(plugin, "DEL", c, cached, ports, &[]);
            if !out.ok {
                return Err(out);
            }
        }
        Ok(())
    }

    /// One command (CHECK, GC, STATUS, VERSION) of lb-cni alone.
    fn lb_cni(
        &self,
        command: &str,
        c: &Container,
        prev: Option<&Value>,
        ports: &[Value],
        extra: &[(&str, Value)],
    ) -> Outcome {
        let plugin = self.plugins().last().unwrap().clone();
        self.exec(&plugin, command, c, prev, ports, extra)
    }
}

/// Nomad's port mapping: one port, TCP and UDP.
fn mapping(host: u16) -> Vec<Value> {
    ["tcp", "udp"]
        .map(|p| json!({"hostPort": host, "containerPort": CONTAINER_PORT, "protocol": p}))
        .into()
}

fn services(socket: &Path) -> Vec<ServiceEntry> {
    Client::new(socket)
        .call(&Request::ServiceList {
            network: Some(NET.into()),
        })
        .unwrap()
}

fn answer_from(who: &str, answer: anyhow::Result<String>, what: &str) {
    let answer = answer.unwrap_or_else(|e| panic!("{what}: {e:#}"));
    assert!(
        answer.starts_with(&format!("{who} ")),
        "{what}: {who} answers: {answer}"
    );
}

/// The node (forwarding, `ext0` at [`NODE_IP`]) and an outside client on its external link.
fn node_and_client() -> (Netns, Netns) {
    let node = Netns::new("node").unwrap();
    let client = Netns::new("client").unwrap();
    node.ip([
        "link",
        "add",
        "ext0",
        "type",
        "veth",
        "peer",
        "name",
        "c0",
        "netns",
        client.name(),
    ])
    .unwrap();
    node.ip(["addr", "add", &format!("{NODE_IP}/24"), "dev", "ext0"])
        .unwrap();
    node.ip(["link", "set", "ext0", "up"]).unwrap();
    client
        .ip(["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "c0"])
        .unwrap();
    client.ip(["link", "set", "c0", "up"]).unwrap();
    node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    (node, client)
}

fn nomad_chain_on(dataplane: &str) {
    if !require_root("cni") {
        return;
    }
    assert!(
        Path::new(CNI_DIR).join("bridge").exists(),
        "the CNI plugins are in {CNI_DIR} (Debian containernetworking-plugins; cargo xtask setup)"
    );
    let (node, client) = node_and_client();

    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
    let rt = Runtime::nomad(&node, node.name(), &d.socket());

    // VERSION, as a runtime asks before anything else.
    let c1 = Container::new("0c1a2b3c4d5e6f708192a3b4c5d6e7f8");
    let version = rt.lb_cni("VERSION", &c1, None, &[], &[]);
    assert!(version.ok, "{version:?}");
    assert_eq!(
        version.json()["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );

    // The first ADD on a fresh node: the bridge did not exist before the chain ran.
    assert!(!node.links().unwrap().iter().any(|l| l == BRIDGE));
    let _s1 = spawn_backend(&c1.ns, "c1", CONTAINER_PORT, CONTAINER_PORT).unwrap();
    let p1 = mapping(HOST_PORTS[0]);
    let r1 = rt
        .add(&c1, &p1)
        .unwrap_or_else(|o| panic!("ADD c1: {o:?}\n{}", d.log()));
    assert_eq!(r1["cniVersion"], "1.0.0");
    let nets: Vec<lb_user::api::NetworkSummary> = Client::new(&d.socket())
        .call(&Request::NetworkList)
        .unwrap();
    assert_eq!(nets.len(), 1);
    assert_eq!(
        nets[0].interfaces,
        ["ext0", BRIDGE],
        "the first ADD made the network with the bridge the chain created"
    );
    let c2 = Container::new("99887766554433221100aabbccddeeff");
    let _s2 = spawn_backend(&c2.ns, "c2", CONTAINER_PORT, CONTAINER_PORT).unwrap();
    // c2's port is bound to the node's external address (hostIP), as kubelet's can be.
    let p2: Vec<Value> = (mapping(HOST_PORTS[1]).into_iter())
        .map(|mut m| {
            m["hostIP"] = json!(NODE_IP.to_string());
            m
        })
        .collect();
    let r2 = rt
        .add(&c2, &p2)
        .unwrap_or_else(|o| panic!("ADD c2: {o:?}\n{}", d.log()));
    assert_eq!(services(&d.socket()).len(), 2, "one service per container");

    // From outside, each host port reaches its container over TCP and UDP.
    for (who, port) in [("c1", HOST_PORTS[0]), ("c2", HOST_PORTS[1])] {
        answer_from(
            who,
            tcp_request(&client, NODE_IP, port, TIMEOUT),
            &format!("tcp/{port} from outside"),
        );
        answer_from(
            who,
            udp_request(&client, NODE_IP, port, TIMEOUT),
            &format!("udp/{port} from outside"),
        );
    }
    // A container reaches its own host port through the node's address (hairpin).
    answer_from(
        "c1",
        tcp_request(&c1.ns, NODE_IP, HOST_PORTS[0], TIMEOUT),
        "c1 to its own host port, tcp",
    );
    answer_from(
        "c1",
        udp_request(&c1.ns, NODE_IP, HOST_PORTS[0], TIMEOUT),
        "c1 to its own host port, udp",
    );

    // From the node itself: through its address, and through 127.0.0.1 (portmap's `snat`
    // case) for the port on every address; the hostIP-bound one answers on its address only.
    for (what, answer) in [
        ("tcp", tcp_request(&node, NODE_IP, HOST_PORTS[0], TIMEOUT)),
        ("udp", udp_request(&node, NODE_IP, HOST_PORTS[0], TIMEOUT)),
        (
            "tcp via 127.0.0.1",
            tcp_request(&node, LOCALHOST, HOST_PORTS[0], TIMEOUT),
        ),
        (
            "udp via 127.0.0.1",
            udp_request(&node, LOCALHOST, HOST_PORTS[0], TIMEOUT),
        ),
    ] {
        answer_from(
            "c1",
            answer,
            &format!("c1's host port from the node, {what}"),
        );
    }
    answer_from(
        "c2",
        tcp_request(&node, NODE_IP, HOST_PORTS[1], TIMEOUT),
        "c2's hostIP-bound port from the node",
    );
    assert!(
        tcp_request(&node, LOCALHOST, HOST_PORTS[1], TIMEOUT).is_err(),
        "c2's hostIP-bound port does not answer on 127.0.0.1"
    );

    // A repeated ADD of lb-cni (the bridge plugin's own is not idempotent: its veth exists)
    // gives the same result and the same one service.
    let again = rt.lb_cni("ADD", &c1, Some(&r1), &p1, &[]);
    assert!(again.ok, "ADD c1 again: {again:?}");
    assert_eq!(again.json(), r1, "prevResult passed on");
    assert_eq!(
        services(&d.socket()).len(),
        2,
        "still one service per container"
    );
    answer_from(
        "c1",
        tcp_request(&client, NODE_IP, HOST_PORTS[0], TIMEOUT),
        "after the second ADD",
    );

    // CHECK passes after ADD, and fails when asked for ports the service does not have.
    let check = rt.lb_cni("CHECK", &c1, Some(&r1), &p1, &[]);
    assert!(check.ok, "CHECK after ADD: {check:?}");
    let check = rt.lb_cni("CHECK", &c2, Some(&r2), &p2, &[]);
    assert!(check.ok, "CHECK of the hostIP-bound one: {check:?}");
    let check = rt.lb_cni("CHECK", &c2, Some(&r2), &mapping(HOST_PORTS[1]), &[]);
    assert!(!check.ok, "CHECK with another hostIP: {check:?}");

    // A third container asking for c1's port: a CNI error naming the holder, nothing applied.
    let elements = d.elements(NET);
    let c3 = Container::new("c3c3c3c3c3c3c3c3c3c3");
    let refused = rt
        .add(&c3, &mapping(HOST_PORTS[0]))
        .expect_err("c3 takes a held port");
    refused.assert_error(100, "cni-0c1a2b3c4d5e-eth0", "names the holder");
    assert_eq!(services(&d.socket()).len(), 2, "nothing added");
    assert_eq!(d.elements(NET), elements, "nothing applied");
    rt.del(&c3, &[], None)
        .unwrap_or_else(|o| panic!("DEL after the failed ADD: {o:?}"));
    answer_from(
        "c1",
        tcp_request(&client, NODE_IP, HOST_PORTS[0], TIMEOUT),
        "c1 keeps its port",
    );

    // GC (1.1.0) with c1 and c2 valid removes nothing.
    let valid =
        json!([{"containerID": c1.id, "ifname": "eth0"}, {"containerID": c2.id, "ifname": "eth0"}]);
    let gc = rt.lb_cni(
        "GC",
        &c1,
        None,
        &[],
        &[
            ("cniVersion", json!("1.1.0")),
            ("cni.dev/valid-attachments", valid),
        ],
    );
    assert!(gc.ok, "{gc:?}");
    assert_eq!(services(&d.socket()).len(), 2, "GC keeps valid attachments");
    let status = rt.lb_cni("STATUS", &c1, None, &[], &[("cniVersion", json!("1.1.0"))]);
    assert!(status.ok, "STATUS with the daemon up: {status:?}");

    // CHECK fails once the service was removed behind the plugin's back.
    d.ok(&["service", "rm", NET, "cni-0c1a2b3c4d5e-eth0"]);
    let check = rt.lb_cni("CHECK", &c1, Some(&r1), &p1, &[]);
    assert!(!check.ok, "CHECK after the service went: {check:?}");
    assert!(
        check.json()["msg"]
            .as_str()
            .unwrap()
            .contains("not in lb network"),
        "{check:?}"
    );
    let again = rt.lb_cni("ADD", &c1, Some(&r1), &p1, &[]);
    assert!(again.ok, "ADD c1 once more: {again:?}");
    answer_from(
        "c1",
        tcp_request(&client, NODE_IP, HOST_PORTS[0], TIMEOUT),
        "ADD again restores it",
    );

    // GC with only c1 valid removes c2's service.
    let valid = json!([{"containerID": c1.id, "ifname": "eth0"}]);
    let gc = rt.lb_cni(
        "GC",
        &c1,
        None,
        &[],
        &[
            ("cniVersion", json!("1.1.0")),
            ("cni.dev/valid-attachments", valid),
        ],
    );
    assert!(gc.ok, "{gc:?}");
    let left: Vec<String> = services(&d.socket())
        .into_iter()
        .map(|e| e.service.id)
        .collect();
    assert_eq!(
        left,
        ["cni-0c1a2b3c4d5e-eth0"],
        "GC removed c2's service only"
    );

    // DEL removes everything; a second DEL (no cached result, state gone) succeeds.
    rt.del(&c1, &p1, Some(&r1))
        .unwrap_or_else(|o| panic!("DEL c1: {o:?}"));
    rt.del(&c2, &p2, Some(&r2))
        .unwrap_or_else(|o| panic!("DEL c2: {o:?}"));
    assert!(services(&d.socket()).is_empty(), "no lb service left");
    assert_eq!(d.elements(NET), "", "no element left");
    assert!(
        tcp_request(&client, NODE_IP, HOST_PORTS[0], TIMEOUT).is_err(),
        "the port is gone"
    );
    assert!(
        tcp_request(&node, LOCALHOST, HOST_PORTS[0], TIMEOUT).is_err(),
        "the port is gone from 127.0.0.1 too"
    );
    for c in [&c1, &c2] {
        rt.del(c, &[], None)
            .unwrap_or_else(|o| panic!("second DEL of {}: {o:?}", c.id));
    }
}

#[test]
fn nomad_chain_ebpf() {
    nomad_chain_on("ebpf");
}

#[test]
fn nomad_chain_nftables() {
    nomad_chain_on("nftables");
}

/// Nomad's chain with a bridge of both families (host-local with an IPv4 and an IPv6 range,
/// as Nomad's `bridge` network mode takes them), its conflist otherwise [`Runtime::nomad`]'s;
/// `v4: false` gives an IPv6 range alone (a single-stack IPv6 chain), on a bridge and range
/// of its own (host-local's leases are the runtime's: two runtimes on one range would hand
/// out one address twice).
fn dual_runtime<'a>(node: &'a Netns, socket: &Path, v4: bool) -> Runtime<'a> {
    let mut rt = Runtime::nomad(node, node.name(), socket);
    let bridge = &mut rt.conflist["plugins"][1];
    let ranges = if v4 {
        json!([[{"subnet": SUBNET}], [{"subnet": SUBNET6}]])
    } else {
        bridge["bridge"] = json!(BRIDGE6);
        json!([[{"subnet": SUBNET6_ONLY}]])
    };
    let ipam = &mut bridge["ipam"];
    ipam["ranges"] = ranges;
    ipam["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
    rt
}

/// lb-cni in a dual-stack Nomad chain on `dataplane`: a dual-stack container's host port
/// answers over both families from outside, from the node and from the container itself,
/// each family from the container's own address of that family; a container of an IPv6-only
/// chain is published on IPv6, reached the same three ways; a `hostIP` of a family the
/// container has no address of is refused, as kubelet refuses an IP family mismatch, and
/// nothing is published.
fn nomad_dual_stack_chain_on(dataplane: &str) {
    let (node, client) = node_and_client();
    for (ns, addr, dev) in [(&node, NODE_IP6, "ext0"), (&client, CLIENT_IP6, "c0")] {
        ns.enable_ipv6().unwrap();
        ns.add_ipv6(addr, dev).unwrap();
    }
    node.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
    let port = HOST_PORTS[0];
    let at = |ip: std::net::IpAddr| std::net::SocketAddr::new(ip, port);

    let c1 = Container::new("d1d1d1d1d1d1d1d1d1d1d1d1");
    c1.ns.enable_ipv6().unwrap();
    let _s1 = DualServer::start(&c1.ns, "c1", CONTAINER_PORT);
    let dual = dual_runtime(&node, &d.socket(), true);
    let tcp = |host: u16| {
        vec![json!({"hostPort": host, "containerPort": CONTAINER_PORT, "protocol": "tcp"})]
    };
    let r1 = dual
        .add(&c1, &tcp(port))
        .unwrap_or_else(|o| panic!("ADD c1: {o:?}\n{}", d.log()));
    let ips: Vec<std::net::IpAddr> = (r1["ips"].as_array().unwrap().iter())
        .map(|ip| {
            ip["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(ips.len(), 2, "dual stack: {r1}");
    let backends: Vec<std::net::IpAddr> = (services(&d.socket())[0].service.backends.iter())
        .map(|b| b.ip)
        .collect();
    assert_eq!(backends.len(), 2, "one backend per family: {backends:?}");
    for ip in [NODE_IP.into(), std::net::IpAddr::V6(NODE_IP6)] {
        let (who, peer) = tcp_ask(&client, at(ip));
        assert_eq!(who, "c1", "{ip}");
        assert_eq!(
            peer.is_ipv6(),
            ip.is_ipv6(),
            "{ip}: the container saw {peer}"
        );
        // From the node itself, and from the container through the node's address (the
        // bridge's hairpin mode, masqueraded back to it).
        for (from, ns) in [("the node", &node), ("the container itself", &c1.ns)] {
            let (who, peer) = tcp_ask(ns, at(ip));
            assert_eq!(who, "c1", "{ip} from {from}");
            assert_eq!(peer.is_ipv6(), ip.is_ipv6(), "{ip} from {from}: {peer}");
        }
    }

    // An IPv6-only chain (its own bridge range, the same daemon network).
    let c2 = Container::new("e2e2e2e2e2e2e2e2e2e2e2e2");
    c2.ns.enable_ipv6().unwrap();
    let _s2 = DualServer::start(&c2.ns, "c2", CONTAINER_PORT);
    let v6only = dual_runtime(&node, &d.socket(), false);
    v6only
        .add(&c2, &tcp(HOST_PORTS[1]))
        .unwrap_or_else(|o| panic!("ADD c2: {o:?}\n{}", d.log()));
    for (from, ns) in [
        ("outside", &client),
        ("the node", &node),
        ("the container itself", &c2.ns),
    ] {
        let (who, _) = tcp_ask(
            ns,
            std::net::SocketAddr::new(NODE_IP6.into(), HOST_PORTS[1]),
        );
        assert_eq!(who, "c2", "from {from}");
    }

    // kubelet's "IP family mismatch": an IPv4 hostIP for the IPv6-only container.
    let c3 = Container::new("f3f3f3f3f3f3f3f3f3f3f3f3");
    c3.ns.enable_ipv6().unwrap();
    let mut m = tcp(20003);
    m[0]["hostIP"] = json!(NODE_IP.to_string());
    let refused = v6only.add(&c3, &m).expect_err("a family mismatch");
    let err = refused.json();
    assert_eq!(err["code"], 7, "{refused:?}");
    let msg = err["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("hostIP 10.210.0.1 is ipv4") && msg.contains("IP family mismatch"),
        "{msg}"
    );
    assert_eq!(services(&d.socket()).len(), 2, "nothing published for c3");
    let _ = v6only.del(&c3, &m, None);

    for (rt, c, p) in [(&dual, &c1, tcp(port)), (&v6only, &c2, tcp(HOST_PORTS[1]))] {
        rt.del(c, &p, None)
            .unwrap_or_else(|o| panic!("DEL {}: {o:?}", c.id));
    }
    assert!(services(&d.socket()).is_empty());
}

#[test]
fn nomad_dual_stack_chain_ebpf() {
    if require_root("nomad_dual_stack_chain_ebpf") {
        nomad_dual_stack_chain_on("ebpf");
    }
}

#[test]
fn nomad_dual_stack_chain_nftables() {
    if require_root("nomad_dual_stack_chain_nftables") {
        nomad_dual_stack_chain_on("nftables");
    }
}

/// An ADD the daemon saves but cannot apply (nftables' `nft` fails after the change was
/// validated and saved) is a CNI error worth retrying that leaves no service behind: the
/// daemon keeps serving what it had, and once `nft` works again nothing of it shows up.
#[test]
fn a_failed_apply_leaves_nothing() {
    if !require_root("a_failed_apply_leaves_nothing") {
        return;
    }
    let (node, client) = node_and_client();
    let nft = FailingNft::new().unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = nft.start_daemon(lb(), bpffs.path()).unwrap();
    let rt = Runtime::nomad(&node, node.name(), &d.socket());
    let c1 = Container::new("0c1a2b3c4d5e6f708192a3b4c5d6e7f8");
    let _s1 = spawn_backend(&c1.ns, "c1", CONTAINER_PORT, CONTAINER_PORT).unwrap();
    rt.add(&c1, &mapping(HOST_PORTS[0]))
        .unwrap_or_else(|o| panic!("ADD c1: {o:?}"));
    let elements = d.elements(NET);

    nft.fail(true).unwrap();
    let c2 = Container::new("99887766554433221100aabbccddeeff");
    let failed = rt
        .add(&c2, &mapping(HOST_PORTS[1]))
        .expect_err("saved but not applied is a failed ADD");
    failed.assert_error(11, "injected failure", "try again later");
    let left: Vec<String> = (services(&d.socket()).into_iter())
        .map(|e| e.service.id)
        .collect();
    assert_eq!(
        left,
        ["cni-0c1a2b3c4d5e-eth0"],
        "c2's service was taken back"
    );
    answer_from(
        "c1",
        tcp_request(&client, NODE_IP, HOST_PORTS[0], TIMEOUT),
        "c1 still served",
    );
    rt.del(&c2, &[], None)
        .unwrap_or_else(|o| panic!("DEL after the failed ADD: {o:?}"));

    nft.fail(false).unwrap();
    let healed = lb_tests::poll_until(std::time::Duration::from_secs(20), || {
        d.network_status(NET)["applied"] == true
    });
    assert!(healed.is_some(), "applied again: {}", d.log());
    assert_eq!(d.elements(NET), elements, "nothing of c2 applied");
    assert!(
        tcp_request(&client, NODE_IP, HOST_PORTS[1], TIMEOUT).is_err(),
        "c2's port is not published"
    );
}

/// lb-cni run directly with `env` and `stdin`: its exit status and its stdout as JSON.
fn lb_cni_direct(env: &[(&str, &str)], stdin: &Value) -> (bool, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lb-cni"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    (child.stdin.take().unwrap())
        .write_all(stdin.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.success(), json)
}

/// Errors are the spec's error result with its codes, and a non-zero exit: a missing
/// `CNI_CONTAINERID` (4), a config that is not one (7), a version it does not speak (1), a daemon
/// that cannot be reached for ADD or DEL (11, try again later) and for STATUS (50). Needs
/// no root: nothing reaches a daemon.
#[test]
fn errors_are_cni_errors_with_the_spec_codes() {
    let socket = std::env::temp_dir().join(format!("lbt-cni-none-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap();
    let conf = |version: &str| json!({"cniVersion": version, "network": NET, "socket": socket});
    let attachment = [
        ("CNI_CONTAINERID", "abc"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/proc/1/ns/net"),
    ];
    let with = |command: &'static str| {
        let mut env = vec![("CNI_COMMAND", command)];
        env.extend(attachment);
        env
    };
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": "/x"}],
        "ips": [{"address": "172.26.64.2/20", "interface": 1}]});
    let mut add = conf("1.0.0");
    add["prevResult"] = prev;
    add["runtimeConfig"] = json!({"portMappings": mapping(20001)});
    let cases = [
        (
            "ADD without CNI_CONTAINERID",
            vec![
                ("CNI_COMMAND", "ADD"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", "/proc/1/ns/net"),
            ],
            conf("1.0.0"),
            4,
        ),
        ("no network", with("ADD"), json!({"cniVersion": "1.0.0"}), 7),
        ("version 0.2.0", with("DEL"), conf("0.2.0"), 1),
        ("ADD, no daemon", with("ADD"), add, 11),
        ("DEL, no daemon", with("DEL"), conf("1.0.0"), 11),
        (
            "STATUS, no daemon",
            vec![("CNI_COMMAND", "STATUS")],
            conf("1.1.0"),
            50,
        ),
    ];
    for (what, env, stdin, code) in cases {
        let (ok, out) = lb_cni_direct(&env, &stdin);
        assert!(!ok, "{what}: exits non-zero: {out}");
        assert_eq!(out["code"], code, "{what}: {out}");
        assert!(
            out["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {out}"
        );
        assert!(out["cniVersion"].is_string(), "{what}: {out}");
        if what.ends_with("no daemon") {
            // `msg` (what a runtime logs) names the failure, not only the step.
            assert!(
                (out["msg"].as_str().unwrap()).contains("cannot reach the daemon"),
                "{what}: {out}"
            );
            // The hint names the plugin's setting, not the CLI's flags.
            let text = out.to_string();
            assert!(
                text.contains(r#"the network configuration's \"socket\" names another"#),
                "{what}: {out}"
            );
            assert!(!text.contains("LB_SOCKET"), "{what}: {out}");
        }
    }
}

/// Run by hand (no `CNI_COMMAND`), lb-cni says what it is and which CNI versions it speaks on
/// stderr and exits 0 without reading stdin, in the reference plugins' words (the `bridge`
/// plugin of containernetworking-plugins, run the same way, is the yardstick). Needs no root.
#[test]
fn run_by_hand_it_says_what_it_is_as_the_reference_plugins_do() {
    let by_hand = |program: &str| {
        Command::new(program)
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let reference = by_hand("/usr/lib/cni/bridge");
    let reference = String::from_utf8_lossy(&reference.stderr).into_owned();
    let ours = by_hand(env!("CARGO_BIN_EXE_lb-cni"));
    assert!(ours.status.success(), "{ours:?}");
    assert!(ours.stdout.is_empty(), "{ours:?}");
    let text = String::from_utf8_lossy(&ours.stderr);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(&format!("CNI lb plugin v{}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let versions = "CNI protocol versions supported: ";
    assert!(
        reference
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with(versions)),
        "the reference plugin's second line: {reference}"
    );
    assert_eq!(
        lines[1],
        format!("{versions}{}", lb_user::cni::SUPPORTED_VERSIONS.join(", "))
    );
}
