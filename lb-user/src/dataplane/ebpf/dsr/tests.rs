use super::*;
use crate::{
    dataplane::ebpf::{be4, be6},
    node::LinkKind,
};
use lb_common::{DsrSession, DsrSession6, FlowKey, FlowKey6};

fn link(index: u32, mac: u8) -> Link {
    Link {
        index,
        name: format!("eth{index}"),
        kind: LinkKind::Veth,
        master: None,
        mac: Some([2, 0, 0, 0, 0, mac]),
        mtu: 1500,
        up: true,
        peer: None,
        peer_netnsid: None,
    }
}

fn addr(a: &str, prefix: u8, index: u32) -> NodeAddr {
    NodeAddr {
        addr: a.parse().unwrap(),
        prefix,
        index,
        proto: None,
        deprecated: false,
    }
}

fn neigh(ifindex: u32, a: &str, mac: u8) -> Neighbour {
    Neighbour {
        ifindex,
        addr: a.parse().unwrap(),
        mac: [4, 0, 0, 0, 0, mac],
    }
}

#[test]
fn backends_are_reached_on_the_interface_whose_subnet_holds_them() {
    let backends: BTreeSet<IpAddr> = ["10.1.0.5", "10.2.0.7", "10.2.0.8", "192.0.2.1"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let links = [link(3, 3), link(4, 4)];
    let addrs = [addr("10.1.0.1", 24, 3), addr("10.2.0.1", 16, 4)];
    let neighbours = [
        neigh(3, "10.1.0.5", 5),
        neigh(4, "10.2.0.7", 7),
        // Known, but on an interface that is not where its subnet is.
        neigh(3, "10.2.0.8", 8),
    ];
    let r = resolve(&backends, &[3, 4], &links, &addrs, &neighbours);
    let ep = r.endpoints[&be4("10.1.0.5".parse().unwrap())];
    assert_eq!(
        (ep.ifindex, ep.dmac, ep.smac),
        (3, [4, 0, 0, 0, 0, 5], [2, 0, 0, 0, 0, 3])
    );
    assert_eq!(r.endpoints[&be4("10.2.0.7".parse().unwrap())].ifindex, 4);
    assert_eq!(r.endpoints.len(), 2);
    let why = |a: &str| r.unresolved[&a.parse::<IpAddr>().unwrap()].clone();
    assert!(
        why("10.2.0.8").contains("not known yet"),
        "{}",
        why("10.2.0.8")
    );
    assert!(
        why("192.0.2.1").contains("not on the subnet"),
        "{}",
        why("192.0.2.1")
    );
    // Every backend on a link is kept resolved, known or not; one off-link is not.
    let managed: Vec<(u32, String)> = (r.managed.iter())
        .map(|(i, a)| (*i, a.to_string()))
        .collect();
    assert_eq!(
        managed,
        [
            (3, "10.1.0.5".to_owned()),
            (4, "10.2.0.7".to_owned()),
            (4, "10.2.0.8".to_owned())
        ]
    );
}

#[test]
fn a_session_row_says_idle_and_left_and_disappears_after_its_timeout() {
    let k = FlowKey {
        saddr: be4("10.0.0.2".parse().unwrap()),
        daddr: be4("10.0.0.100".parse().unwrap()),
        sport: 40000u16.to_be(),
        dport: 80u16.to_be(),
        proto: lb_common::IPPROTO_TCP,
        _pad: [0; 3],
    };
    let s = DsrSession {
        backend: be4("10.0.0.5".parse().unwrap()),
        seen_ns: 100 * NS_PER_SEC,
        ..Default::default()
    };
    let row = session_row(&k, &s, 60, 110 * NS_PER_SEC).unwrap();
    assert_eq!(
        (
            row.client.to_string().as_str(),
            row.frontend.to_string().as_str(),
            row.backend.to_string().as_str(),
            row.state.as_str()
        ),
        ("10.0.0.2:40000", "10.0.0.100:80", "10.0.0.5:80", "dsr")
    );
    assert_eq!((row.idle_secs, row.expires_secs), (Some(10), Some(50)));
    assert!(session_row(&k, &s, 60, 161 * NS_PER_SEC).is_none());
}

/// IPv6 backends are reached as IPv4's, by the IPv6 neighbour table and the interface's
/// IPv6 subnet (an IPv4 subnet of the same interface holds no IPv6 backend), and their
/// sessions print as every IPv6 socket address lb prints.
#[test]
fn ipv6_backends_resolve_by_neighbour_discovery_and_print_bracketed() {
    let backends: BTreeSet<IpAddr> = ["fd30::10", "fd30::11", "fd99::1", "10.1.0.5"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let links = [link(3, 3)];
    let addrs = [addr("10.1.0.1", 24, 3), addr("fd30::1", 64, 3)];
    let neighbours = [neigh(3, "fd30::10", 0x10), neigh(3, "10.1.0.5", 5)];
    let r = resolve(&backends, &[3], &links, &addrs, &neighbours);
    let ep = r.endpoints6[&be6("fd30::10".parse().unwrap())];
    assert_eq!((ep.ifindex, ep.dmac), (3, [4, 0, 0, 0, 0, 0x10]));
    assert_eq!((r.endpoints.len(), r.endpoints6.len()), (1, 1));
    let why = |a: &str| r.unresolved[&a.parse::<IpAddr>().unwrap()].clone();
    assert!(
        why("fd30::11").contains("neighbour solicitation unanswered"),
        "{}",
        why("fd30::11")
    );
    assert!(
        why("fd99::1").contains("not on the subnet"),
        "{}",
        why("fd99::1")
    );
    assert!(r.managed.contains(&(3, "fd30::11".parse().unwrap())));

    let k = FlowKey6 {
        saddr: be6("fd30::2".parse().unwrap()),
        daddr: be6("fd30::100".parse().unwrap()),
        sport: 40000u16.to_be(),
        dport: 80u16.to_be(),
        proto: lb_common::IPPROTO_UDP,
        _pad: [0; 3],
    };
    let s = DsrSession6 {
        backend: be6("fd30::10".parse().unwrap()),
        seen_ns: 100 * NS_PER_SEC,
        ..Default::default()
    };
    let row = session_row(&k, &s, 60, 110 * NS_PER_SEC).unwrap();
    assert_eq!(
        (
            row.client.to_string().as_str(),
            row.frontend.to_string().as_str(),
            row.backend.to_string().as_str(),
        ),
        ("[fd30::2]:40000", "[fd30::100]:80", "[fd30::10]:80")
    );
}
