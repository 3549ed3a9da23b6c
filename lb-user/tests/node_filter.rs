//! Finding the node's forward-path filtering, which the fast path would skip
//! (`node::filter`): nftables base chains, iptables-nft and legacy iptables, each written by
//! its own tool into a fresh namespace and read back from inside it; and the notifications
//! that say the ruleset changed. Root only.
use std::os::fd::AsRawFd as _;

use lb_tests::{netns::Netns, require_root};
use lb_user::node::{ForwardFilters, NftEvents, forward_filters, in_netns, nft_events};

/// The node-side interfaces the fast path would use, in [`namespace`].
const OURS: &str = "f0";
/// An interface in the same namespace the fast path does not use.
const OTHER: &str = "g0";

/// A fresh namespace with the veth pairs `f0`–`f1` and `g0`–`g1` (ends in it, down).
fn namespace(tag: &str) -> Netns {
    let ns = Netns::new(tag).unwrap();
    for (a, b) in [(OURS, "f1"), (OTHER, "g1")] {
        ns.ip(["link", "add", a, "type", "veth", "peer", "name", b])
            .unwrap();
    }
    ns
}

/// `forward_filters([OURS])` inside `ns`, as the daemon calls it.
fn filters(ns: &Netns) -> ForwardFilters {
    in_netns(Some(ns.name()), || forward_filters(&[OURS.to_owned()]))
        .unwrap_or_else(|e| panic!("forward_filters in {}: {e:#}", ns.name()))
}

/// Each case: what it shows, an `nft -f` script, the reasons expected.
const NFT_CASES: &[(&str, &str, &[&str])] = &[
    ("an empty namespace has nothing", "", &[]),
    (
        "an inet forward chain with a rule filters",
        "table inet filter {\nchain forward {\ntype filter hook forward priority 0;\nip saddr 10.9.9.9 drop;\nip saddr 10.9.9.8 drop;\n}\n}",
        &["table inet filter chain forward (hook forward, policy accept, 2 rules)"],
    ),
    (
        "the same chain with no rules and policy accept does not",
        "table inet filter {\nchain forward {\ntype filter hook forward priority 0;\npolicy accept;\n}\n}",
        &[],
    ),
    (
        "policy drop alone filters",
        "table inet filter {\nchain forward {\ntype filter hook forward priority 0;\npolicy drop;\n}\n}",
        &["table inet filter chain forward (hook forward, policy drop, 0 rules)"],
    ),
    (
        "a bridge forward chain filters",
        "table bridge b {\nchain fw {\ntype filter hook forward priority 0;\nether type arp accept;\n}\n}",
        &["table bridge b chain fw (hook forward, policy accept, 1 rule)"],
    ),
    (
        "a netdev ingress chain on one of our devices filters",
        "table netdev n {\nchain in {\ntype filter hook ingress device f0 priority 0;\ncounter;\n}\n}",
        &["table netdev n chain in (hook ingress on f0, policy accept, 1 rule)"],
    ),
    (
        "a netdev egress chain naming several devices, ours among them, filters",
        "table netdev n {\nchain out {\ntype filter hook egress devices = { g0, f0 } priority 0;\npolicy drop;\n}\n}",
        &["table netdev n chain out (hook egress on f0, g0, policy drop, 0 rules)"],
    ),
    (
        "a netdev ingress chain on another device does not",
        "table netdev n {\nchain in {\ntype filter hook ingress device g0 priority 0;\npolicy drop;\ncounter;\n}\n}",
        &[],
    ),
    (
        "an inet ingress chain on one of our devices filters",
        "table inet i {\nchain in {\ntype filter hook ingress device f0 priority 0;\ncounter;\n}\n}",
        &["table inet i chain in (hook ingress on f0, policy accept, 1 rule)"],
    ),
    (
        "an inet ingress chain on another device does not",
        "table inet i {\nchain in {\ntype filter hook ingress device g0 priority 0;\ncounter;\n}\n}",
        &[],
    ),
    (
        "hooks the fast path does not skip do not count",
        "table inet filter {\nchain input {\ntype filter hook input priority 0;\npolicy drop;\n}\nchain output {\ntype filter hook output priority 0;\ncounter;\n}\n}",
        &[],
    ),
    (
        "a filter chain before routing (iptables' raw PREROUTING) filters",
        "table ip raw {\nchain PREROUTING {\ntype filter hook prerouting priority -300;\nip saddr 10.9.9.9 drop;\n}\n}",
        &["table ip raw chain PREROUTING (hook prerouting, policy accept, 1 rule)"],
    ),
    (
        "a filter chain after routing filters",
        "table inet m {\nchain post {\ntype filter hook postrouting priority -150;\nmeta mark set 1;\n}\n}",
        &["table inet m chain post (hook postrouting, policy accept, 1 rule)"],
    ),
    (
        "a nat chain translates, it does not filter",
        "table ip nat {\nchain PREROUTING {\ntype nat hook prerouting priority -100;\nip daddr 10.9.9.9 dnat to 10.9.9.8;\n}\nchain POSTROUTING {\ntype nat hook postrouting priority 100;\nip saddr 10.9.0.0/16 masquerade;\n}\n}",
        &[],
    ),
    (
        "lb's own table does not count, whatever its chains",
        "table ip lb-web {\nchain forward {\ntype filter hook forward priority 0;\npolicy drop;\ncounter;\n}\n}",
        &[],
    ),
    (
        "a table of another family under lb's prefix is not lb's",
        "table inet lb-web {\nchain forward {\ntype filter hook forward priority 0;\ncounter;\n}\n}",
        &["table inet lb-web chain forward (hook forward, policy accept, 1 rule)"],
    ),
];

#[test]
fn nftables_chains_that_filter_forwarded_traffic_are_found() {
    if !require_root("nftables_chains_that_filter_forwarded_traffic_are_found") {
        return;
    }
    for (what, script, expected) in NFT_CASES {
        let ns = namespace("filter");
        if !script.is_empty() {
            ns.exec(["sh", "-ec", &format!("echo '{script}' | nft -f -")])
                .unwrap_or_else(|e| panic!("{what}: setting up: {e:#}"));
        }
        let f = filters(&ns);
        assert_eq!(f.v4, *expected, "{what} (IPv4)");
        // An `ip` table's chain is IPv4's alone; every other family's sees IPv6 too.
        let v6: &[&str] = if script.starts_with("table ip ") {
            &[]
        } else {
            expected
        };
        assert_eq!(f.v6, v6, "{what} (IPv6)");
    }
}

/// `IPTABLES -A FORWARD -s 10.9.9.9 -j DROP` in `ns` (`fd99::9` for an ip6tables).
fn forward_drop(ns: &Netns, iptables: &str) {
    let source = if iptables.starts_with("ip6") {
        "fd99::9"
    } else {
        "10.9.9.9"
    };
    ns.exec([iptables, "-A", "FORWARD", "-s", source, "-j", "DROP"])
        .unwrap();
}

/// A family's own tables stop that family's fast path alone: an `ip6` chain IPv6's, an `ip`
/// chain IPv4's; ip6tables-nft and legacy ip6tables the same.
#[test]
fn ip_and_ip6_chains_filter_their_own_family_alone() {
    if !require_root("ip_and_ip6_chains_filter_their_own_family_alone") {
        return;
    }
    let ns = namespace("fam6");
    ns.exec([
        "sh",
        "-ec",
        "echo 'table ip6 f6 {\nchain fw {\ntype filter hook forward priority 0;\nip6 saddr fd99::9 drop;\n}\n}' | nft -f -",
    ])
    .unwrap();
    let f = filters(&ns);
    assert_eq!(
        f.v6,
        ["table ip6 f6 chain fw (hook forward, policy accept, 1 rule)"],
        "{f:?}"
    );
    assert!(f.v4.is_empty(), "an ip6 chain does not stop IPv4: {f:?}");
    let ns = namespace("fam4");
    ns.exec([
        "sh",
        "-ec",
        "echo 'table ip raw {\nchain pre {\ntype filter hook prerouting priority -300;\nip saddr 10.9.9.9 drop;\n}\n}' | nft -f -",
    ])
    .unwrap();
    let f = filters(&ns);
    assert_eq!(f.v4.len(), 1, "{f:?}");
    assert!(f.v6.is_empty(), "an ip chain does not stop IPv6: {f:?}");

    let ns = namespace("ip6nft");
    forward_drop(&ns, "ip6tables-nft");
    let f = filters(&ns);
    assert_eq!(
        f.v6,
        ["table ip6 filter chain FORWARD (hook forward, policy accept, 1 rule)"],
        "ip6tables-nft's FORWARD chain is table ip6 filter"
    );
    assert!(f.v4.is_empty(), "{f:?}");

    let ns = namespace("ip6leg");
    ns.exec(["ip6tables-legacy", "-S", "FORWARD"]).unwrap();
    assert_eq!(
        filters(&ns),
        ForwardFilters::default(),
        "an empty legacy table"
    );
    forward_drop(&ns, "ip6tables-legacy");
    let f = filters(&ns);
    assert_eq!(
        f.v6,
        ["legacy ip6tables table filter chain FORWARD (policy ACCEPT, 1 rule)"],
        "a rule in legacy ip6tables FORWARD"
    );
    assert!(f.v4.is_empty(), "{f:?}");
}

#[test]
fn iptables_nft_forward_rules_are_found() {
    if !require_root("iptables_nft_forward_rules_are_found") {
        return;
    }
    let ns = namespace("iptnft");
    forward_drop(&ns, "iptables-nft");
    assert!(filters(&ns).v6.is_empty(), "an IPv4 table stops IPv4 alone");
    assert_eq!(
        filters(&ns).v4,
        ["table ip filter chain FORWARD (hook forward, policy accept, 1 rule)"],
        "iptables-nft's FORWARD chain is table ip filter"
    );
}

#[test]
fn legacy_iptables_forward_rules_are_found() {
    if !require_root("legacy_iptables_forward_rules_are_found") {
        return;
    }
    let reasons = |ns: &Netns| {
        let f = filters(ns);
        assert!(f.v6.is_empty(), "legacy iptables stops IPv4 alone: {f:?}");
        f.v4
    };
    let ns = namespace("iptleg");
    // Listing loads the legacy filter table, empty: loaded alone, it filters nothing.
    ns.exec(["iptables-legacy", "-S", "FORWARD"]).unwrap();
    assert_eq!(reasons(&ns), Vec::<String>::new(), "an empty legacy table");
    forward_drop(&ns, "iptables-legacy");
    assert_eq!(
        reasons(&ns),
        ["legacy iptables table filter chain FORWARD (policy ACCEPT, 1 rule)"],
        "a rule in legacy FORWARD"
    );
    // Per namespace: another namespace's legacy table is not this one's.
    let other = namespace("iptleg2");
    assert_eq!(
        reasons(&other),
        Vec::<String>::new(),
        "another namespace's legacy rule"
    );
    ns.exec(["iptables-legacy", "-F", "FORWARD"]).unwrap();
    ns.exec(["iptables-legacy", "-P", "FORWARD", "DROP"])
        .unwrap();
    assert_eq!(
        reasons(&ns),
        ["legacy iptables table filter chain FORWARD (policy DROP, 0 rules)"],
        "a legacy DROP policy"
    );
}

/// Whether `events` is readable within `ms` milliseconds.
fn readable(events: &NftEvents, ms: i32) -> bool {
    let mut fd = libc::pollfd {
        fd: events.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1
}

/// How long a notification may take to be seen: a bound against hanging, not a measure. The
/// kernel queues it on the socket before the transaction's `nft` returns, so it is there at
/// once.
const BOUND_MS: i32 = 10_000;

#[test]
fn nft_events_report_changes_of_their_own_namespace() {
    if !require_root("nft_events_report_changes_of_their_own_namespace") {
        return;
    }
    let ns = namespace("events");
    let other = namespace("events2");
    let mut events = in_netns(Some(ns.name()), nft_events).unwrap();
    assert!(!readable(&events, 0), "nothing happened yet");

    ns.exec(["nft", "add", "table", "inet", "x"]).unwrap();
    assert!(readable(&events, BOUND_MS), "a table added");
    assert!(events.drain().unwrap(), "a table added is a change");
    assert!(!readable(&events, 0), "drained");
    assert!(!events.drain().unwrap(), "nothing new");

    ns.exec(["iptables-nft", "-A", "FORWARD", "-j", "ACCEPT"])
        .unwrap();
    assert!(readable(&events, BOUND_MS), "an iptables-nft rule added");
    assert!(events.drain().unwrap(), "an iptables-nft rule is a change");

    // lb's nftables dataplane writing its own table is no reason to check again.
    ns.exec(["nft", "add", "table", "ip", "lb-web"]).unwrap();
    assert!(readable(&events, BOUND_MS), "lb's table added");
    assert!(!events.drain().unwrap(), "lb's own table is no change");

    // Delivered before the other namespace's `nft` returned, had it been ours to see.
    other.exec(["nft", "add", "table", "inet", "x"]).unwrap();
    assert!(
        !readable(&events, 0),
        "a change in another namespace is not seen"
    );
}
