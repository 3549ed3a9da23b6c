use super::*;

#[test]
fn device_bound_chains_read_their_devices_from_the_text_listing() {
    let text = "table netdev nd {\n\tchain in {\n\t\ttype filter hook ingress device \"d0\" priority filter; policy accept;\n\t\tcounter\n\t}\n}\n\
            table netdev nd2 {\n\tflowtable f {\n\t\thook ingress priority filter\n\t\tdevices = { d9 }\n\t}\n\n\tchain in2 {\n\t\ttype filter hook ingress devices = { d0, \"lo\" } priority filter; policy accept;\n\t}\n\n\tchain none {\n\t\ttype filter hook egress priority filter; policy drop;\n\t}\n}\n";
    let d = text_devices(text);
    let k = |t: &str, c: &str| ("netdev".to_owned(), t.to_owned(), c.to_owned());
    assert_eq!(d[&k("nd", "in")], ["d0"], "{d:?}");
    assert_eq!(d[&k("nd2", "in2")], ["d0", "lo"], "{d:?}");
    assert!(d[&k("nd2", "none")].is_empty(), "{d:?}");
    assert_eq!(d.len(), 3, "the flowtable is no chain: {d:?}");
}

#[test]
fn a_chain_naming_devices_filters_only_those_and_one_naming_none_filters_all() {
    let chain = |devices: &[&str]| Chain {
        family: "netdev".into(),
        table: "t".into(),
        name: "c".into(),
        hook: "ingress".into(),
        policy: "accept".into(),
        rules: 1,
        devices: Some(devices.iter().map(|d| d.to_string()).collect()),
    };
    let ours = ["lbc0".to_owned(), "veth1".to_owned()];
    assert!(chain(&["veth1"]).filters(&ours), "a listed device");
    assert!(!chain(&["eth9"]).filters(&ours), "another device");
    assert!(chain(&["veth*"]).filters(&ours), "a wildcard");
    assert!(chain(&[]).filters(&ours), "no device: any");
    assert_eq!(
        chain(&["veth1", "lo"]).reason(),
        "table netdev t chain c (hook ingress on veth1, lo, policy accept, 1 rule)"
    );
}

#[test]
fn base_chains_take_devices_from_json_where_nft_prints_them() {
    // Newer nft prints `dev` (one device, or a list); 1.0.6 prints neither.
    let json = r#"{"nftables": [
            {"chain": {"family": "netdev", "table": "n", "name": "one", "hook": "ingress", "policy": "drop", "dev": "f0"}},
            {"chain": {"family": "netdev", "table": "n", "name": "two", "hook": "egress", "policy": "drop", "dev": ["f0", "g0"]}},
            {"chain": {"family": "netdev", "table": "n", "name": "old", "hook": "ingress", "policy": "drop"}},
            {"chain": {"family": "inet", "table": "f", "name": "regular"}},
            {"rule": {"family": "inet", "table": "f", "chain": "regular", "expr": []}},
            {"chain": {"family": "ip", "table": "lb-web", "name": "forward", "hook": "forward", "policy": "drop"}}
        ]}"#;
    let chains = base_chains(json).unwrap();
    let devices: Vec<_> = chains
        .iter()
        .map(|c| (c.name.as_str(), c.devices.clone()))
        .collect();
    assert_eq!(
        devices,
        [
            ("one", Some(vec!["f0".to_owned()])),
            ("two", Some(vec!["f0".to_owned(), "g0".to_owned()])),
            ("old", None),
        ],
        "regular chains and lb's table are left out"
    );
}

#[test]
fn legacy_forward_filters_with_a_rule_or_a_drop_policy() {
    assert!(!legacy_filters("-P FORWARD ACCEPT\n"));
    assert!(legacy_filters("-P FORWARD DROP\n"));
    assert!(legacy_filters(
        "-P FORWARD ACCEPT\n-A FORWARD -s 10.0.0.1/32 -j DROP\n"
    ));
    assert_eq!(
        legacy_reason(&LEGACY_V4, Some("-P FORWARD DROP\n-A FORWARD -j ACCEPT\n")),
        "legacy iptables table filter chain FORWARD (policy DROP, 1 rule)"
    );
    assert_eq!(
        legacy_reason(&LEGACY_V6, Some("-P FORWARD DROP\n")),
        "legacy ip6tables table filter chain FORWARD (policy DROP, 0 rules)"
    );
    assert!(legacy_reason(&LEGACY_V4, None).contains("iptables-legacy is not installed"));
}
