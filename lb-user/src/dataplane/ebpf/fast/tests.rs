use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;

fn link(index: u32, name: &str, kind: LinkKind, master: Option<u32>) -> Link {
    Link {
        index,
        name: name.into(),
        kind,
        master,
        mac: Some([2, 0, 0, 0, 0, index as u8]),
        mtu: 1500,
        up: true,
        peer: None,
        peer_netnsid: None,
    }
}

/// lbc0 (veth, 2) faces the client; lbbr0 (bridge, 3) has ports lbb0 (veth, 4) and eth9
/// (a physical port, 5); lbb1 (veth, 6) is a port of a bridge (7) the network lacks.
fn node() -> Vec<Link> {
    vec![
        link(2, "lbc0", LinkKind::Veth, None),
        link(3, "lbbr0", LinkKind::Bridge, None),
        link(4, "lbb0", LinkKind::Veth, Some(3)),
        link(5, "eth9", LinkKind::Other, Some(3)),
        link(6, "lbb1", LinkKind::Veth, Some(7)),
        link(7, "other", LinkKind::Bridge, None),
    ]
}

fn neigh(ifindex: u32, last: u8, mac: u8) -> Neighbour {
    Neighbour {
        ifindex,
        addr: Ipv4Addr::new(10, 0, 0, last).into(),
        mac: [0xaa, 0, 0, 0, 0, mac],
    }
}

fn fdb(port: u32, master: u32, mac: u8) -> FdbEntry {
    FdbEntry {
        port,
        master,
        mac: [0xaa, 0, 0, 0, 0, mac],
    }
}

#[test]
fn endpoints_follow_the_neighbour_table_and_the_fdb() {
    let neighbours = [
        neigh(2, 2, 0x02),  // the client, on the client-facing veth
        neigh(3, 10, 0x10), // a backend behind lbb0
        neigh(3, 11, 0x11), // a host behind the physical port
        neigh(3, 12, 0x12), // on the bridge, not learnt by its FDB
        neigh(7, 13, 0x13), // on a bridge the network does not have
    ];
    let table = [fdb(4, 3, 0x10), fdb(5, 3, 0x11), fdb(6, 7, 0x13)];
    let got = local(&node(), &neighbours, &table, &[2, 3]);
    assert_eq!(
        got.ports,
        ["lbb0"],
        "veth ports of the network's bridges only"
    );
    let ep = |last| {
        got.endpoints
            .get(&be4(Ipv4Addr::new(10, 0, 0, last)))
            .copied()
    };
    let client = ep(2).expect("the client");
    assert_eq!(
        (client.ifindex, client.l3_ifindex, client.flags),
        (2, 2, ENDPOINT_PEER)
    );
    assert_eq!(client.smac, [2, 0, 0, 0, 0, 2]);
    assert_eq!(client.dmac, [0xaa, 0, 0, 0, 0, 2]);
    let backend = ep(10).expect("the backend");
    assert_eq!(
        (backend.ifindex, backend.l3_ifindex, backend.flags),
        (4, 3, ENDPOINT_PEER | ENDPOINT_BRIDGED)
    );
    assert_eq!(backend.smac, [2, 0, 0, 0, 0, 3], "the bridge's MAC");
    let host = ep(11).expect("behind the physical port");
    assert_eq!((host.ifindex, host.flags), (5, ENDPOINT_BRIDGED));
    assert_eq!(ep(12), None, "no FDB entry: left to the bridge");
    assert_eq!(ep(13), None, "not the network's interface");
    assert_eq!(got.endpoints.len(), 3);
}

#[test]
fn ipv6_neighbours_are_endpoints_of_their_own_map_link_local_ones_none() {
    let v6 = |a: &str, mac: u8| Neighbour {
        ifindex: 3,
        addr: a.parse::<Ipv6Addr>().unwrap().into(),
        mac: [0xaa, 0, 0, 0, 0, mac],
    };
    let neighbours = [
        neigh(3, 10, 0x10),
        v6("fd00::10", 0x10),
        v6("fe80::10", 0x10),
    ];
    let got = local(&node(), &neighbours, &[fdb(4, 3, 0x10)], &[2, 3]);
    assert_eq!(got.endpoints.len(), 1);
    let ep = got.endpoints6[&be6("fd00::10".parse().unwrap())];
    assert_eq!(
        (ep.ifindex, ep.l3_ifindex, ep.flags, ep.dmac),
        (
            4,
            3,
            ENDPOINT_PEER | ENDPOINT_BRIDGED,
            [0xaa, 0, 0, 0, 0, 0x10]
        ),
        "found by its MAC in the FDB, as IPv4's"
    );
    assert_eq!(got.endpoints6.len(), 1, "no link-local endpoint");
    let v4_only = got.only(FAST_PATH_V4);
    assert!(v4_only.endpoints6.is_empty() && v4_only.endpoints.len() == 1);
}

#[test]
fn each_family_takes_the_vetted_fast_path_where_its_own_forward_rules_could_apply() {
    let rules = |v4: &[&str], v6: &[&str]| ForwardFilters {
        v4: v4.iter().map(|r| r.to_string()).collect(),
        v6: v6.iter().map(|r| r.to_string()).collect(),
    };
    let both = FAST_PATH_V4 | FAST_PATH_V6;
    assert_eq!(decide(FastPath::Auto, &rules(&[], &[])), (both, vec![]));
    let (on, why) = decide(FastPath::Auto, &rules(&[], &["table ip6 f chain fw"]));
    assert_eq!(
        on,
        both | FAST_PATH_VETTED_V6,
        "an ip6 rule vets IPv6 alone"
    );
    assert!(
        why[0].starts_with("IPv6 vetted") && why[0].contains("(table ip6 f chain fw)"),
        "{why:?}"
    );
    let (on, _) = decide(FastPath::Auto, &rules(&["table ip f chain fw"], &[]));
    assert_eq!(on, both | FAST_PATH_VETTED_V4, "an ip rule vets IPv4 alone");
    assert_eq!(
        decide(FastPath::Auto, &rules(&["a"], &["a"])).0,
        both | FAST_PATH_VETTED_V4 | FAST_PATH_VETTED_V6
    );
    assert_eq!(
        decide(FastPath::On, &rules(&["a"], &["a"])).0,
        both,
        "direct"
    );
    assert_eq!(decide(FastPath::Off, &rules(&[], &[])).0, 0);
}

#[test]
fn links_down_give_no_endpoints() {
    let mut links = node();
    links[2].up = false; // lbb0
    let got = local(&links, &[neigh(3, 10, 0x10)], &[fdb(4, 3, 0x10)], &[2, 3]);
    assert!(got.endpoints.is_empty());
    assert!(got.ports.is_empty());
}

#[test]
fn the_smaller_mtu_of_bridge_and_port_bounds_the_endpoint() {
    let mut links = node();
    links[2].mtu = 1400;
    let got = local(&links, &[neigh(3, 10, 0x10)], &[fdb(4, 3, 0x10)], &[3]);
    assert_eq!(got.endpoints.values().next().map(|e| e.mtu), Some(1400));
}
