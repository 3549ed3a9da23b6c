//! Dual stack in the desired state, without root: how a service says it has a VIP per family
//! and backends of both, what composition makes of it (one backend set per family, a flow never
//! crossing families), the elements both dataplanes print for it, what validation refuses and
//! in which words, and that what the dataplanes do not serve yet (DSR of an IPv6 VIP) is
//! refused before anything is saved.
use std::net::{IpAddr, Ipv4Addr};

use lb_user::{
    api::Request,
    core::{
        compose::{ComposedNetwork, compose},
        elements::{SetKey, network_elements, render},
        model::{
            DesiredState, Family, HoldPorts, Network, PortConfig, PortKey, Proto, Service,
            parse_host_ip, parse_ip,
        },
    },
    daemon::Daemon,
    dataplane::{
        Dataplane,
        ebpf::{TcMode, dataplane::EbpfDataplane},
        nft::NftDataplane,
        record::Recording,
    },
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn state(services: serde_json::Value) -> Result<DesiredState, String> {
    let json = serde_json::json!({"networks": [{
        "name": "web", "interfaces": ["lo"], "services": services
    }]});
    DesiredState::from_json(&json.to_string()).map_err(|e| e.to_string())
}

fn dual() -> serde_json::Value {
    serde_json::json!([
        {"id": "api", "vips": ["fd99::10", "10.99.0.10"],
         "backends": [{"ip": "10.20.0.2"}, {"ip": "fd20::2"}, {"ip": "10.20.0.3"}, {"ip": "fd20::3"}],
         "ports": [{"proto": "tcp", "published": 8080, "target": 80}]},
        {"id": "db", "backends": [{"ip": "fd20::9"}],
         "ports": [{"proto": "tcp", "published": 5432, "host_ip": "fd00::1"}]}
    ])
}

/// One VIP reads and prints as `vip`, as every state before dual stack did; two print as
/// `vips`, IPv4 first, whatever order they were given in; both fields at once are refused.
#[test]
fn a_service_has_a_vip_or_one_vip_per_family() {
    let one = state(serde_json::json!([{"id": "a", "vip": "10.99.0.10",
        "backends": [{"ip": "10.20.0.2"}]}]))
    .unwrap();
    let printed = one.to_json();
    assert!(printed.contains("\"vip\": \"10.99.0.10\""), "{printed}");
    assert!(!printed.contains("vips"), "{printed}");
    assert_eq!(DesiredState::from_json(&printed).unwrap(), one);

    let two = state(dual()).unwrap();
    let api = &two.networks[0].services[0];
    assert_eq!(api.vips, [ip("10.99.0.10"), ip("fd99::10")]);
    assert_eq!(api.vip(Family::V6), Some(ip("fd99::10")));
    let printed = two.to_json();
    assert!(printed.contains("\"vips\": ["), "{printed}");
    assert_eq!(DesiredState::from_json(&printed).unwrap(), two);

    let both = state(serde_json::json!([{"id": "a", "vip": "10.99.0.10",
        "vips": ["fd99::10"], "backends": []}]));
    let e = both.unwrap_err();
    assert!(e.contains("not both"), "{e}");
}

/// Each VIP and each published-port key gets the backends of its own family: a dual-stack
/// port on every address is two keys, a port on an IPv6 `host_ip` one.
#[test]
fn composition_gives_each_family_its_own_backends() {
    let s = state(dual()).unwrap();
    let c = compose(&s.networks[0]);
    assert_eq!(
        c.vips[&ip("10.99.0.10")],
        [ip("10.20.0.2"), ip("10.20.0.3")]
    );
    assert_eq!(c.vips[&ip("fd99::10")], [ip("fd20::2"), ip("fd20::3")]);
    let key = |h: Option<&str>, f, port| PortKey::new(h.map(ip), f, Proto::Tcp, port);
    assert_eq!(
        c.ports[&key(None, Family::V4, 8080)],
        [(ip("10.20.0.2"), 80), (ip("10.20.0.3"), 80)]
    );
    assert_eq!(
        c.ports[&key(None, Family::V6, 8080)],
        [(ip("fd20::2"), 80), (ip("fd20::3"), 80)]
    );
    assert_eq!(
        c.ports[&key(Some("fd00::1"), Family::V6, 5432)],
        [(ip("fd20::9"), 5432)]
    );
    assert_eq!(c.ports.len(), 3, "db is IPv6 only: no IPv4 key: {c:?}");
    assert_eq!(key(Some("fd00::1"), Family::V4, 1).family, Family::V6);
}

/// The element notation with IPv6 lines: addresses as nft writes them; a port on every
/// address reads the same in both families (each family's table keys it so), its backends
/// tell them apart; IPv4 sets before IPv6 ones.
#[test]
fn elements_print_ipv6_as_nft_writes_it() {
    let s = state(dual()).unwrap();
    let n = ComposedNetwork::new(s.networks[0].clone());
    assert_eq!(
        render(&network_elements(&n)),
        "\
nat-publish-port tcp . 8080 . 0-32767 : 10.20.0.2 . 80
nat-publish-port tcp . 8080 . 32768-65535 : 10.20.0.3 . 80
nat-publish-port tcp . 8080 . 0-32767 : fd20::2 . 80
nat-publish-port tcp . 8080 . 32768-65535 : fd20::3 . 80
nat-publish-port fd00::1 . tcp . 5432 . 0-65535 : fd20::9 . 5432
nat-service-vip 10.99.0.10 . 0-32767 : 10.20.0.2
nat-service-vip 10.99.0.10 . 32768-65535 : 10.20.0.3
nat-service-vip fd99::10 . 0-32767 : fd20::2
nat-service-vip fd99::10 . 32768-65535 : fd20::3
"
    );
    let frontends: Vec<String> = n.composed().ports.keys().map(|k| k.to_string()).collect();
    assert_eq!(frontends, ["tcp/8080", "tcp/8080@::", "tcp/5432@fd00::1"]);
    assert_eq!(SetKey::Vip(ip("fd99::10")).to_string(), "fd99::10");
}

/// What is refused, and why: a second VIP of one family, a VIP or `host_ip` of a family no
/// backend has (no NAT46/64; kubelet's "IP family mismatch"), addresses that are not one
/// host's (`::1`, link-local, multicast, unspecified, IPv4-mapped), and `::1` as a `host_ip`.
#[test]
fn validation_refuses_what_crosses_or_cannot_be_a_family() {
    let refused = |services: serde_json::Value| state(services).unwrap_err();
    let e = refused(
        serde_json::json!([{"id": "a", "vips": ["10.99.0.10", "10.99.0.11"],
        "backends": [{"ip": "10.20.0.2"}]}]),
    );
    assert!(e.contains("at most one VIP per address family"), "{e}");
    let e = refused(serde_json::json!([{"id": "a", "vip": "fd99::10",
        "backends": [{"ip": "10.20.0.2"}]}]));
    assert!(e.contains("VIP fd99::10 is ipv6 but no backend is"), "{e}");
    let e = refused(
        serde_json::json!([{"id": "a", "backends": [{"ip": "10.20.0.2"}],
        "ports": [{"proto": "tcp", "published": 80, "host_ip": "fd00::1"}]}]),
    );
    assert!(e.contains("IP family mismatch"), "{e}");
    for (addr, class) in [
        ("::1", "a loopback address"),
        ("fe80::1", "a link-local address"),
        ("ff02::1", "a multicast address"),
        ("::ffff:10.0.0.1", "an IPv4-mapped IPv6 address"),
    ] {
        let e = refused(serde_json::json!([{"id": "a", "vip": addr, "backends": []}]));
        assert!(e.contains(&format!("VIP {addr} is {class}")), "{addr}: {e}");
        let e = refused(serde_json::json!([{"id": "a", "vip": "fd99::10",
            "backends": [{"ip": addr}]}]));
        assert!(
            e.contains(&format!("backend {addr} is {class}")),
            "{addr}: {e}"
        );
    }
    // `[::1]:port` cannot be DNATed anywhere (IPv6 has no route_localnet), unlike
    // `127.0.0.1:port`.
    let e = refused(
        serde_json::json!([{"id": "a", "backends": [{"ip": "fd20::2"}],
        "ports": [{"proto": "tcp", "published": 80, "host_ip": "::1"}]}]),
    );
    assert!(e.contains("host_ip ::1 cannot be published"), "{e}");
    state(
        serde_json::json!([{"id": "a", "backends": [{"ip": "10.20.0.2"}],
        "ports": [{"proto": "tcp", "published": 80, "host_ip": "127.0.0.1"}]}]),
    )
    .unwrap();
    // A scaled-to-zero service keeps its VIPs, whatever their family.
    state(serde_json::json!([{"id": "a", "vips": ["10.99.0.10", "fd99::10"], "backends": []}]))
        .unwrap();
}

/// `::` and `0.0.0.0` both mean every address; IPv6 is taken bare or in brackets in a port
/// spec, never with a zone.
#[test]
fn addresses_parse_in_either_family() {
    assert_eq!(parse_host_ip("::").unwrap(), None);
    assert_eq!(parse_host_ip("0.0.0.0").unwrap(), None);
    assert_eq!(parse_ip("[fd00::1]").unwrap(), ip("fd00::1"));
    assert!(parse_ip("fe80::1%eth0").is_err());
    assert!(parse_ip("[10.0.0.1]").is_err(), "brackets are IPv6's");
    for spec in ["tcp/8080:80@fd00::1", "tcp/8080:80@[fd00::1]"] {
        let p: PortConfig = spec.parse().unwrap();
        assert_eq!(p.host_ip, Some(ip("fd00::1")), "{spec}");
        assert_eq!(p.target, Some(80));
        assert_eq!(p.to_string(), "tcp/8080:80@fd00::1");
    }
}

/// The same port on every address may belong to one service in IPv4 and another in IPv6
/// (as kubelet keeps one hostport table per family); within a family it stays one owner's.
#[test]
fn port_ownership_is_per_family() {
    state(serde_json::json!([
        {"id": "a", "backends": [{"ip": "10.20.0.2"}], "ports": [{"proto": "tcp", "published": 80}]},
        {"id": "b", "backends": [{"ip": "fd20::2"}], "ports": [{"proto": "tcp", "published": 80}]}
    ]))
    .unwrap();
    let e = state(serde_json::json!([
        {"id": "a", "backends": [{"ip": "10.20.0.2"}], "ports": [{"proto": "tcp", "published": 80}]},
        {"id": "b", "backends": [{"ip": "fd20::2"}, {"ip": "10.20.0.3"}],
         "ports": [{"proto": "tcp", "published": 80}]}
    ]))
    .unwrap_err();
    assert!(
        e.contains("tcp/80 is already published by service \"a\""),
        "{e}"
    );
}

/// A `dsr` network with an IPv6 VIP (beside an IPv4 one) is served by both dataplanes (once
/// refused by both, "serves DSR for IPv4 VIPs only so far"), as a `nat` one is.
#[test]
fn dsr_of_an_ipv6_vip_is_served_by_both_dataplanes() {
    let mut s = state(dual()).unwrap();
    let ebpf = EbpfDataplane::retiring(std::path::Path::new("/nonexistent"), TcMode::Netlink);
    let nft = NftDataplane::default();
    let planes: [&dyn Dataplane; 2] = [&ebpf, &nft];
    for mode in [
        lb_user::core::model::Mode::Nat,
        lb_user::core::model::Mode::Dsr,
    ] {
        s.networks[0].mode = mode;
        for plane in planes {
            plane.supports(&s.networks[0]).unwrap();
        }
    }
}

/// The daemon takes a dual-stack service through its whole change path (validation, node
/// checks, composition) and hands the dataplane both families' sets.
#[test]
fn the_daemon_applies_a_dual_stack_service() {
    let dir = lb_tests::tools::TempDir::new("lb-dual").unwrap();
    let dp = Recording::new();
    let mut d = Daemon::new(dir.path(), Box::new(dp.clone()), "recording".into()).unwrap();
    let mut network: Network =
        serde_json::from_value(serde_json::json!({"name": "web", "interfaces": ["lo"]})).unwrap();
    network.hold_ports = HoldPorts::Off;
    d.handle(Request::NetworkAdd { network }).unwrap();
    let s = state(dual()).unwrap();
    let api: Service = s.networks[0].services[0].clone();
    d.handle(Request::ServiceSet {
        network: "web".into(),
        service: api,
    })
    .unwrap();
    let calls = dp.take();
    let composed = (calls.iter())
        .rev()
        .find_map(|c| match c {
            lb_user::dataplane::record::Call::Apply { composed, .. } => Some(composed.clone()),
            _ => None,
        })
        .expect("applied");
    assert_eq!(composed.vips.len(), 2, "{composed:?}");
    assert_eq!(composed.ports.len(), 2, "{composed:?}");
    assert!(
        composed.vips[&ip("10.99.0.10")]
            .iter()
            .all(|b| matches!(b, IpAddr::V4(a) if *a != Ipv4Addr::UNSPECIFIED))
    );
}

/// A namespace with IPv6 on and a veth pair up (a veth runs duplicate address detection, a
/// dummy interface would not), for the node-side tests below.
fn ipv6_node(tag: &str) -> lb_tests::netns::Netns {
    let ns = lb_tests::netns::Netns::new(tag).unwrap();
    ns.enable_ipv6().unwrap();
    ns.ip([
        "link", "add", "lbv0", "type", "veth", "peer", "name", "lbv1",
    ])
    .unwrap();
    for l in ["lbv0", "lbv1"] {
        ns.ip(["link", "set", l, "up"]).unwrap();
    }
    ns
}

/// VIP aliases of both families go on and off the interface with lb's IFA_PROTO; an IPv6
/// one without duplicate address detection, so it answers at once instead of after the
/// probe (a tentative address drops what is sent to it).
#[test]
fn aliases_of_both_families_carry_lbs_mark_and_ipv6_ones_skip_dad() {
    if !lb_tests::require_root("aliases_of_both_families_carry_lbs_mark_and_ipv6_ones_skip_dad") {
        return;
    }
    use lb_user::node::netlink::{ALIAS_PROTO, Netlink};
    let ns = ipv6_node("alias6");
    // An alias as an earlier lb left it: preferred (and, older still, without IFA_PROTO:
    // a host address that is a VIP is lb's, `NodeAddr::is_lb_alias`).
    ns.ip(["-6", "addr", "add", "fd99::11/128", "dev", "lbv0", "nodad"])
        .unwrap();
    let vips: std::collections::BTreeSet<IpAddr> =
        [ip("10.99.0.10"), ip("fd99::10"), ip("fd99::11")].into();
    let addrs = ns
        .run(move || {
            let nl = Netlink::new()?;
            nl.add_aliases("lbv0", &vips, &nl.addresses()?)?;
            anyhow::Ok(nl.addresses()?)
        })
        .unwrap()
        .unwrap();
    for vip in ["10.99.0.10", "fd99::10"] {
        let a = (addrs.iter())
            .find(|a| a.addr == ip(vip))
            .unwrap_or_else(|| panic!("{vip} not added: {addrs:?}"));
        assert_eq!(a.proto, Some(ALIAS_PROTO), "{a:?}");
        assert!(a.is_host(), "{a:?}");
    }
    let shown = ns.ip(["-6", "addr", "show", "dev", "lbv0"]).unwrap();
    let line = (shown.lines())
        .find(|l| l.contains("fd99::10/128"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        !line.contains("tentative"),
        "an alias must not wait for DAD: {line}"
    );
    // Never the source the kernel picks (a /128 wins its longest-prefix rule over the
    // interface's /64): a masqueraded flow would leave from the VIP.
    assert!(
        line.contains("deprecated"),
        "an IPv6 alias is deprecated: {shown}"
    );
    let old = (shown.lines())
        .find(|l| l.contains("fd99::11/128"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        old.contains("deprecated"),
        "an earlier lb's alias is made deprecated: {shown}"
    );
    ns.ip(["-6", "addr", "add", "fd99::2/64", "dev", "lbv0", "nodad"])
        .unwrap();
    let route = ns.ip(["-6", "route", "get", "fd99::5"]).unwrap();
    assert!(
        route.contains("src fd99::2 "),
        "the node's source on the VIP's subnet is its own address, not the VIP: {route}"
    );
    let vips: std::collections::BTreeSet<IpAddr> =
        [ip("10.99.0.10"), ip("fd99::10"), ip("fd99::11")].into();
    let left = ns
        .run(move || {
            let nl = Netlink::new()?;
            nl.remove_aliases("lbv0", &vips)?;
            anyhow::Ok(nl.addresses()?)
        })
        .unwrap()
        .unwrap();
    assert!(
        !left.iter().any(|a| a.proto == Some(ALIAS_PROTO)),
        "{left:?}"
    );
}

/// A dual-stack published port is held in each family (`[::]` with IPV6_V6ONLY beside
/// `0.0.0.0`), and a port a process already holds in IPv6 is refused before it is published.
#[test]
fn published_ports_are_held_per_family() {
    if !lb_tests::require_root("published_ports_are_held_per_family") {
        return;
    }
    use lb_user::node::hold::{Holder, check_free, wanted};
    let ns = ipv6_node("hold6");
    let mut network: Network = serde_json::from_value(serde_json::json!({
        "name": "web", "interfaces": ["lbv0"], "netns": ns.name(),
        "services": [{"id": "a", "backends": [{"ip": "10.20.0.2"}, {"ip": "fd20::2"}],
            "ports": [{"proto": "tcp", "published": 18080}]}]
    }))
    .unwrap();
    let mut holder = Holder::default();
    holder.sync(&network).unwrap();
    assert!(!holder.has_failed("web"), "{:?}", holder.warnings("web"));
    // Held means bound (not listening): a process of the node cannot bind the port in either
    // family while lb holds it, and can once lb lets it go. (The namespace's bindv6only makes
    // `[::]` the IPv6 port alone, as lb's own socket holds it.)
    ns.sysctl("net.ipv6.bindv6only", "1").unwrap();
    let bind_both = || {
        ns.run(|| {
            ["0.0.0.0:18080", "[::]:18080"].map(|a| match std::net::TcpListener::bind(a) {
                Ok(_) => "free".to_owned(),
                Err(e) => e.kind().to_string(),
            })
        })
        .unwrap()
    };
    let in_use = std::io::ErrorKind::AddrInUse.to_string();
    assert_eq!(
        bind_both(),
        [in_use.clone(), in_use],
        "held in both families"
    );
    holder.release("web");
    // Let go at once by lb; but a process another test of this binary forks meanwhile holds
    // a copy of every descriptor until its exec closes them (they are CLOEXEC), and on a
    // loaded machine that child may wait its turn to run: a port is free once no copy is
    // left (CI saw both ports in use just after the release once).
    let mut after = bind_both();
    for _ in 0..100 {
        if after == ["free", "free"] {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        after = bind_both();
    }
    assert_eq!(after, ["free", "free"], "let go");

    // Another process on [::]:18081, IPv6 only (the namespace's bindv6only): the IPv6 key of
    // a new port there is taken, the IPv4 one free.
    let _taken = ns
        .run(|| std::net::TcpListener::bind("[::]:18081"))
        .unwrap()
        .unwrap();
    network.services[0].ports[0].published = 18081;
    let e = check_free(&network, wanted(&network).iter()).unwrap_err();
    assert!(format!("{e:#}").contains("tcp/18081@:: is in use"), "{e:#}");
}

/// An nftables table written by an lb before dual stack keeps its sync token: the token of an
/// IPv4 network is the one that lb computed (3731851184 is what it printed for this network),
/// so the first sync after an upgrade applies the difference rather than declaring the whole
/// table again.
#[test]
fn an_ipv4_network_keeps_the_nftables_sync_token_of_before_dual_stack() {
    let n: Network = serde_json::from_str(
        r#"{"name":"web","interfaces":["eth0","br0"],"netns":"ns1","mode":"nat","masquerade":"always","services":[{"id":"api","generation":"2","vip":"10.99.0.10","backends":[{"ip":"10.20.0.2"},{"ip":"10.20.0.3","disabled":true}],"ports":[{"proto":"tcp","published":8080,"target":80},{"proto":"udp","published":53,"host_ip":"192.168.1.10"}]},{"id":"host","backends":[{"ip":"10.20.0.9"}],"ports":[{"proto":"sctp","published":9000}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        lb_user::dataplane::nft::ruleset::sync_token(&n),
        3_731_851_184
    );
}
