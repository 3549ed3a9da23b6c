//! The pure core, asserted without root: partition, compose, elements and the desired state.
//! Every assertion of moby's `interval_helper_test.go` and `service_nftables_lb_linux_test.go`
//! that DESIGN.md lists is ported here, plus golden element output and the validation rules.
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use lb_common::{BUCKETS, MAX_BACKENDS_PER_SET, slot_for_bucket};
use lb_user::core::compose::{Composed, ComposedNetwork, PortKey, compose};
use lb_user::core::elements::{
    Element, Interval, equal_weight_intervals, nat_elements, network_elements, render,
};
use lb_user::core::model::{
    Attach, Backend, DesiredState, Family, Invalid, Masquerade, Mode, Network, PortConfig, Proto,
    Service, StateError,
};

/// `lb elements`' lines of `network`, composed here (as the daemon composes it once).
fn elements_of(network: &Network) -> Vec<Element> {
    network_elements(&ComposedNetwork::new(network.clone()))
}

// ---------------------------------------------------------------------------------------------
// Builders

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// `"10.0.0.3 10.0.0.4,disabled"` → backends.
fn backends(list: &str) -> Vec<Backend> {
    list.split_whitespace()
        .map(|b| b.parse().unwrap())
        .collect()
}

/// `"tcp/8080:80 udp/53@192.168.1.10"` → ports.
fn ports(list: &str) -> Vec<PortConfig> {
    list.split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

fn service(id: &str, generation: &str, vip: &str, b: &str, p: &str) -> Service {
    Service {
        id: id.into(),
        generation: generation.into(),
        vips: vec![ip(vip)],
        backends: backends(b),
        ports: ports(p),
    }
}

fn network(name: &str, interface: &str, mode: Mode, services: Vec<Service>) -> Network {
    Network {
        name: name.into(),
        interfaces: vec![interface.into()],
        netns: None,
        mode,
        attach: Attach::Tc,
        masquerade: Masquerade::Auto,
        fast_path: Default::default(),
        hold_ports: Default::default(),
        timeouts: Default::default(),
        services,
    }
}

fn nat(services: Vec<Service>) -> Network {
    network("web", "veth-lb", Mode::Nat, services)
}

/// The key of an IPv4 service's port (what `PortConfig::key` was).
fn key_of(p: &PortConfig) -> PortKey {
    p.keys(&[Family::V4]).next().unwrap()
}

fn pk(s: &str) -> PortKey {
    key_of(&s.parse::<PortConfig>().unwrap())
}

fn keys(elements: &[Element]) -> Vec<&str> {
    elements.iter().map(|e| e.key.as_str()).collect()
}

/// The interval an element's key ends in (`... . START-END`).
fn interval_of(e: &Element) -> Interval {
    e.key.rsplit(" . ").next().unwrap().parse().unwrap()
}

/// Elements grouped by their set: map name and key without the interval.
fn by_set(elements: &[Element]) -> BTreeMap<String, Vec<(Interval, String)>> {
    let mut sets: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for e in elements {
        let (set, _) = e.key.rsplit_once(" . ").unwrap();
        sets.entry(format!("{} {set}", e.map))
            .or_default()
            .push((interval_of(e), e.value.clone()));
    }
    sets
}

// ---------------------------------------------------------------------------------------------
// Partition (moby interval_helper_test.go)

/// Asserts the moby partition invariants for `n` values over `0..length`: `min(n, length)`
/// intervals, in value order, starting at 0, abutting, ending at `length - 1`, each
/// `length / m` or one more buckets wide.
fn check_partition(values: &[u32], length: u32) {
    let n = values.len() as u32;
    let m = n.min(length);
    let mut next = 0;
    let mut count = 0;
    for (i, (iv, &v)) in equal_weight_intervals(values, length).enumerate() {
        assert_eq!(
            v, i as u32,
            "length={length} n={n}: intervals follow value order"
        );
        assert_eq!(
            iv.start, next,
            "length={length} n={n} i={i}: intervals abut"
        );
        let width = iv.end - iv.start + 1;
        assert!(
            width == length / m || width == length / m + 1,
            "length={length} n={n} i={i}: width {width}"
        );
        next = iv.end + 1;
        count += 1;
    }
    assert_eq!(count, m, "length={length} n={n}: interval count");
    assert_eq!(
        next, length,
        "length={length} n={n}: last interval ends at length-1"
    );
}

/// Compares `got` with `tests/golden/NAME`; `LB_BLESS=1` writes `got` there instead (then
/// the comparison holds on the next build).
macro_rules! assert_golden {
    ($got:expr, $name:literal) => {{
        let got: &str = &$got;
        if std::env::var_os("LB_BLESS").is_some() {
            std::fs::write(
                concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/", $name),
                got,
            )
            .unwrap();
        }
        assert_eq!(got, include_str!(concat!("golden/", $name)));
    }};
}

#[test]
fn intervals_of_no_values_or_length_zero_are_empty() {
    assert_eq!(equal_weight_intervals::<u32>(&[], BUCKETS).count(), 0);
    assert_eq!(equal_weight_intervals(&[1, 2, 3], 0).count(), 0);
    assert_eq!(equal_weight_intervals::<u32>(&[], 0).count(), 0);
}

#[test]
fn collecting_intervals_twice_is_equal() {
    let values = [ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")];
    let intervals = equal_weight_intervals(&values, BUCKETS);
    let first: Vec<_> = intervals.clone().collect();
    let second: Vec<_> = intervals.collect();
    assert_eq!(first, second);
    let again: Vec<_> = equal_weight_intervals(&values, BUCKETS).collect();
    assert_eq!(first, again);
    let rendered: Vec<String> = first.iter().map(|(iv, _)| iv.to_string()).collect();
    assert_eq!(rendered, ["0-21845", "21846-43690", "43691-65535"]);
}

#[test]
fn more_values_than_length_gives_length_one_bucket_intervals() {
    let values: Vec<u32> = (0..BUCKETS + 10).collect();
    let cases = (1..=64u32)
        .flat_map(|length| [(length, length + 1), (length, length * 3)])
        .chain([(BUCKETS, BUCKETS + 1), (BUCKETS, BUCKETS + 10)]);
    for (length, n) in cases {
        let got: Vec<_> = equal_weight_intervals(&values[..n as usize], length).collect();
        assert_eq!(got.len(), length as usize, "length={length} n={n}");
        for (i, &(iv, &v)) in got.iter().enumerate() {
            let i = i as u32;
            assert_eq!(iv, Interval { start: i, end: i }, "length={length} n={n}");
            assert_eq!(v, i, "the first `length` values get the buckets");
        }
    }
}

/// moby checks every `n in 1..=length` for every length up to 65536: that is ~2^44 interval
/// computations, far too slow. The partition is piecewise linear in the slot index with one
/// break at `length % n`, so the coverage that matters is every small `n` (where the break
/// moves fastest) for every length, every `n` for small lengths, and `n` near `length`, near
/// `length / 2` and `length / 3` and at a few primes for a sample of lengths (each of those is
/// an O(n) walk). About 10^8 interval checks: a few seconds in debug.
#[test]
fn intervals_start_at_zero_abut_and_end_at_length_minus_one() {
    let values: Vec<u32> = (0..=BUCKETS).collect();
    for length in 1..=512u32 {
        for n in 1..=length {
            check_partition(&values[..n as usize], length);
        }
    }
    for length in 1..=BUCKETS {
        for n in 1..=16.min(length) {
            check_partition(&values[..n as usize], length);
        }
    }
    let sampled = (1..=BUCKETS)
        .step_by(257)
        .chain((9..=16).flat_map(|p| [(1u32 << p) - 1, 1 << p, (1 << p) + 1]))
        .chain([65521, BUCKETS - 1, BUCKETS])
        .filter(|&l| l <= BUCKETS);
    for length in sampled {
        let ns = [
            length,
            length - 1,
            length / 2,
            length / 2 + 1,
            length / 3,
            17,
            61,
            257,
            4099,
        ];
        for n in ns.into_iter().filter(|&n| 1 <= n && n <= length) {
            check_partition(&values[..n as usize], length);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Compose (moby service_nftables_lb_linux_test.go)

/// Two generations of one service in a rolling update: both publish tcp/8080 on VIP 10.0.0.5,
/// only the first publishes tcp/9090.
fn two_generations() -> Network {
    nat(vec![
        service("api", "1", "10.0.0.5", "10.0.0.3", "tcp/8080 tcp/9090"),
        service("api", "2", "10.0.0.5", "10.0.0.4", "tcp/8080"),
    ])
}

#[test]
fn generations_sharing_vip_and_port_compose_the_union() {
    let c = compose(&two_generations());
    assert_eq!(c.vips[&ip("10.0.0.5")], [ip("10.0.0.3"), ip("10.0.0.4")]);
    assert_eq!(
        c.ports[&pk("tcp/8080")],
        [(ip("10.0.0.3"), 8080), (ip("10.0.0.4"), 8080)]
    );
    // A port only one generation publishes gets only that generation's backends.
    assert_eq!(c.ports[&pk("tcp/9090")], [(ip("10.0.0.3"), 9090)]);
    assert_eq!(c.vips.len(), 1);
    assert_eq!(c.ports.len(), 2);
}

#[test]
fn drained_generation_contributes_no_backends() {
    let c = compose(&nat(vec![
        service("api", "1", "10.0.0.5", "10.0.0.3,disabled", "tcp/8080"),
        service("api", "2", "10.0.0.5", "10.0.0.4", "tcp/8080"),
    ]));
    assert_eq!(c.vips[&ip("10.0.0.5")], [ip("10.0.0.4")]);
    assert_eq!(c.ports[&pk("tcp/8080")], [(ip("10.0.0.4"), 8080)]);
}

#[test]
fn all_disabled_keeps_empty_keys() {
    let c = compose(&nat(vec![service(
        "api",
        "1",
        "10.0.0.5",
        "10.0.0.3,disabled 10.0.0.4,disabled",
        "tcp/8080",
    )]));
    assert!(c.vips[&ip("10.0.0.5")].is_empty());
    assert!(c.ports[&pk("tcp/8080")].is_empty());
    // No backends at all claims the keys the same way.
    let c = compose(&nat(vec![service("api", "1", "10.0.0.5", "", "tcp/8080")]));
    assert!(c.vips[&ip("10.0.0.5")].is_empty());
    assert!(c.ports[&pk("tcp/8080")].is_empty());
}

#[test]
fn distinct_services_stay_separate() {
    let c = compose(&nat(vec![
        service("api", "1", "10.0.0.5", "10.0.0.3", "tcp/8080"),
        service("db", "1", "10.0.0.6", "10.0.0.4", "tcp/5432"),
    ]));
    assert_eq!(c.vips[&ip("10.0.0.5")], [ip("10.0.0.3")]);
    assert_eq!(c.vips[&ip("10.0.0.6")], [ip("10.0.0.4")]);
    assert_eq!(c.ports[&pk("tcp/8080")], [(ip("10.0.0.3"), 8080)]);
    assert_eq!(c.ports[&pk("tcp/5432")], [(ip("10.0.0.4"), 5432)]);
}

#[test]
fn composed_sets_are_sorted_deduplicated_and_carry_each_contributions_target() {
    let c = compose(&nat(vec![
        service(
            "api",
            "1",
            "10.0.0.5",
            "10.0.0.10 10.0.0.9 10.0.0.2",
            "tcp/8080:80",
        ),
        service("api", "2", "10.0.0.5", "10.0.0.9 10.0.0.3", "tcp/8080:81"),
    ]));
    // Numeric order (10.0.0.10 last), one member per backend shared by both generations.
    assert_eq!(
        c.vips[&ip("10.0.0.5")],
        ["10.0.0.2", "10.0.0.3", "10.0.0.9", "10.0.0.10"].map(ip)
    );
    // The same backend reached on two target ports is two endpoints.
    assert_eq!(
        c.ports[&pk("tcp/8080")],
        [
            (ip("10.0.0.2"), 80),
            (ip("10.0.0.3"), 81),
            (ip("10.0.0.9"), 80),
            (ip("10.0.0.9"), 81),
            (ip("10.0.0.10"), 80),
        ]
    );
    // A host_ip is part of the key: the same port on another address is another set.
    let c = compose(&nat(vec![service(
        "api",
        "1",
        "10.0.0.5",
        "10.0.0.3",
        "tcp/8080 tcp/8080@192.168.1.10 udp/8080",
    )]));
    assert_eq!(
        c.ports.keys().copied().collect::<Vec<_>>(),
        [pk("tcp/8080"), pk("udp/8080"), pk("tcp/8080@192.168.1.10")]
    );
}

// ---------------------------------------------------------------------------------------------
// Elements

#[test]
fn shared_port_element_keys() {
    let elements = nat_elements(&compose(&two_generations()));
    assert_eq!(
        keys(&elements),
        [
            "tcp . 8080 . 0-32767",
            "tcp . 8080 . 32768-65535",
            "tcp . 9090 . 0-65535",
            "10.0.0.5 . 0-32767",
            "10.0.0.5 . 32768-65535",
        ]
    );
    assert_eq!(elements_of(&two_generations()), elements);
}

#[test]
fn each_set_of_n_backends_has_n_intervals_covering_the_bucket_space() {
    for n in 1..=9u8 {
        let list: Vec<String> = (1..=n).map(|i| format!("10.0.0.{i}")).collect();
        let net = nat(vec![service(
            "api",
            "1",
            "10.0.9.1",
            &list.join(" "),
            "tcp/8080",
        )]);
        let sets = by_set(&elements_of(&net));
        assert_eq!(sets.len(), 2, "n={n}: one VIP set and one port set");
        for (set, intervals) in sets {
            assert_eq!(intervals.len(), n as usize, "n={n} {set}");
            let mut next = 0;
            for (iv, _) in &intervals {
                assert_eq!(iv.start, next, "n={n} {set}: no gap");
                next = iv.end + 1;
            }
            assert_eq!(next, BUCKETS, "n={n} {set}: ends at 65535");
        }
    }
}

#[test]
fn no_backends_no_elements() {
    assert!(nat_elements(&Composed::default()).is_empty());
    for b in ["", "10.0.0.3,disabled"] {
        let net = nat(vec![service("api", "1", "10.0.0.5", b, "tcp/8080")]);
        assert!(elements_of(&net).is_empty(), "backends {b:?}");
        let mut dsr = net.clone();
        dsr.mode = Mode::Dsr;
        dsr.services[0].ports.clear();
        assert!(elements_of(&dsr).is_empty(), "dsr, backends {b:?}");
    }
    assert_eq!(render(&[]), "");
}

/// The whole rendering pinned: a rolling update sharing a port with a target different from
/// the published one, a drained backend, host_ip ports (rendered with the address first),
/// numeric (not textual) order of addresses and ports, and a DSR network.
#[test]
fn golden_element_output() {
    let state = DesiredState::from_json(include_str!("golden/shared_port.json")).unwrap();
    let web = state.network("web").unwrap();
    let edge = state.network("edge").unwrap();
    assert_eq!(
        render(&elements_of(web)),
        include_str!("golden/shared_port.web.txt")
    );
    assert_eq!(
        render(&elements_of(edge)),
        include_str!("golden/shared_port.edge.txt")
    );
    assert_eq!(elements_of(web), nat_elements(&compose(web)));
}

/// Ties the rendering to the programs' bucket → backend function: parsing the rendered
/// intervals back, the element owning each sampled bucket is the backend `slot_for_bucket`
/// picks in the set's (sorted) order.
#[test]
fn rendered_intervals_agree_with_slot_for_bucket() {
    for n in 1..=64u32 {
        // Listed in reverse so that the sort, not the input order, decides the slots.
        let list: Vec<String> = (1..=n).rev().map(|i| format!("10.0.0.{i}")).collect();
        let net = nat(vec![service(
            "api",
            "1",
            "10.0.9.1",
            &list.join(" "),
            "tcp/8080:80",
        )]);
        let text = render(&elements_of(&net));
        let mut sets: BTreeMap<&str, Vec<(Interval, Ipv4Addr)>> = BTreeMap::new();
        for line in text.lines() {
            let (head, value) = line.split_once(" : ").unwrap();
            let (map, key) = head.split_once(' ').unwrap();
            let interval = key.rsplit(" . ").next().unwrap().parse().unwrap();
            let backend = ip4(value.split(" . ").next().unwrap());
            sets.entry(map).or_default().push((interval, backend));
        }
        assert_eq!(sets.len(), 2, "n={n}");
        for (map, owners) in sets {
            let mut buckets: Vec<u32> = (0..BUCKETS).step_by(509).collect();
            for (iv, _) in &owners {
                buckets.extend([iv.start, iv.end, iv.start.saturating_sub(1)]);
            }
            buckets.push(BUCKETS - 1);
            for b in buckets {
                let owning: Vec<_> = owners.iter().filter(|(iv, _)| iv.contains(b)).collect();
                assert_eq!(owning.len(), 1, "n={n} {map} bucket {b}: exactly one owner");
                let slot = slot_for_bucket(b, n).unwrap();
                assert_eq!(
                    owning[0].1,
                    Ipv4Addr::from(u32::from(ip4("10.0.0.1")) + slot),
                    "n={n} {map} bucket {b}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Desired state: parsing

const DESIGN_EXAMPLE: &str = r#"{"networks":[{"name":"web","interfaces":["veth-lb"],"netns":null,"mode":"nat","attach":"tc",
  "masquerade":"auto",
  "services":[{"id":"api","generation":"1","vip":"10.99.0.10",
     "backends":[{"ip":"10.20.0.2"},{"ip":"10.20.0.3","disabled":true}],
     "ports":[{"proto":"tcp","published":8080,"target":80,"host_ip":null}]}]}]}"#;

#[test]
fn design_example_parses_and_round_trips() {
    let state = DesiredState::from_json(DESIGN_EXAMPLE).unwrap();
    let web = &state.networks[0];
    assert_eq!(web.name, "web");
    assert_eq!(web.interfaces, ["veth-lb"]);
    assert_eq!(
        (web.netns.as_deref(), web.mode, web.attach, web.masquerade),
        (None, Mode::Nat, Attach::Tc, Masquerade::Auto)
    );
    let api = &web.services[0];
    assert_eq!(
        (api.id.as_str(), api.generation.as_str(), api.vips.clone()),
        ("api", "1", vec![ip("10.99.0.10")])
    );
    assert_eq!(api.backends, backends("10.20.0.2 10.20.0.3,disabled"));
    assert_eq!(api.ports, ports("tcp/8080:80"));

    let json = state.to_json();
    let again = DesiredState::from_json(&json).unwrap();
    assert_eq!(again, state);
    assert_eq!(again.to_json(), json, "output is stable");
    // The example is already canonical: every field in declared order, `null`s spelled out,
    // an enabled backend's `disabled` omitted.
    assert_eq!(
        serde_json::to_string(&state).unwrap(),
        DESIGN_EXAMPLE.replace(['\n', ' '], "")
    );
}

#[test]
fn absent_fields_take_their_defaults() {
    let state = DesiredState::from_json(
        r#"{"networks":[{"name":"n","interfaces":["eth0"],
            "services":[{"id":"s","vip":"10.0.0.1","ports":[{"proto":"udp","published":53}]}]}]}"#,
    )
    .unwrap();
    let n = &state.networks[0];
    assert_eq!(
        (n.netns.clone(), n.mode, n.attach, n.masquerade),
        (None, Mode::Nat, Attach::Tc, Masquerade::Auto)
    );
    let s = &n.services[0];
    assert_eq!(s.generation, "1");
    assert!(s.backends.is_empty());
    assert_eq!(s.ports[0].target, None);
    assert_eq!(s.ports[0].target(), 53);
    assert_eq!(s.ports[0].host_ip, None);
    assert_eq!(
        DesiredState::from_json("{}").unwrap(),
        DesiredState::default()
    );
    let round = DesiredState::from_json(&state.to_json()).unwrap();
    assert_eq!(round, state);
}

#[test]
fn every_field_round_trips() {
    let state = DesiredState::from_json(include_str!("golden/shared_port.json")).unwrap();
    let mut state = state;
    state.networks[1].netns = Some("ns1".into());
    state.networks[1].attach = Attach::Xdp;
    state.networks[1].masquerade = Masquerade::Never;
    state.networks[0].masquerade = Masquerade::Always;
    state.validate().unwrap();
    assert_eq!(DesiredState::from_json(&state.to_json()).unwrap(), state);
}

fn parse_err(json: &str) -> String {
    match DesiredState::from_json(json) {
        Ok(_) => panic!("accepted: {json}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parse_errors_name_the_field_and_the_value() {
    let cases = [
        (
            r#""vip":"10.99.0.10""#,
            r#""vip":"10.0.0.300""#,
            r#"networks[0].services[0].vip: invalid IP address "10.0.0.300""#,
        ),
        (
            r#"{"ip":"10.20.0.2"}"#,
            r#"{"ip":"10.20.0"}"#,
            r#"networks[0].services[0].backends[0].ip: invalid IP address "10.20.0""#,
        ),
        (
            r#""host_ip":null"#,
            r#""host_ip":"1.2.3.4.5""#,
            r#"ports[0].host_ip: invalid IP address "1.2.3.4.5""#,
        ),
        (
            r#""target":80"#,
            r#""target":70000"#,
            "networks[0].services[0].ports[0].target: target port 70000 out of range 1-65535",
        ),
        (
            r#""published":8080"#,
            r#""published":70000"#,
            "ports[0].published: published port 70000 out of range 1-65535",
        ),
        (
            r#""published":8080"#,
            r#""published":0"#,
            "published port 0 out of range 1-65535",
        ),
        (
            r#""target":80"#,
            r#""target":-1"#,
            "target port -1 out of range 1-65535",
        ),
        (
            r#""proto":"tcp""#,
            r#""proto":"icmp""#,
            "ports[0].proto: unknown variant `icmp`, expected one of `tcp`, `udp`, `sctp`",
        ),
        (
            r#""mode":"nat""#,
            r#""mode":"ipvs""#,
            "networks[0].mode: unknown variant `ipvs`, expected `nat` or `dsr`",
        ),
        (
            r#""attach":"tc""#,
            r#""attach":"bpf""#,
            "networks[0].attach: unknown variant `bpf`, expected `tc` or `xdp`",
        ),
        (
            r#""masquerade":"auto""#,
            r#""masquerade":"sometimes""#,
            "unknown variant `sometimes`, expected one of `auto`, `always`, `never`",
        ),
        (
            r#""disabled":true"#,
            r#""disabled":"yes""#,
            "backends[1].disabled: invalid type: string \"yes\", expected a boolean",
        ),
    ];
    for (from, to, expected) in cases {
        assert!(DESIGN_EXAMPLE.contains(from), "{from}");
        let got = parse_err(&DESIGN_EXAMPLE.replacen(from, to, 1));
        assert!(
            got.contains(expected),
            "{to}:\n  got {got}\n  want {expected}"
        );
    }
    let got = parse_err(&format!("{DESIGN_EXAMPLE} x"));
    assert!(got.contains("trailing characters"), "{got}");
    for json in ["[]", " [[]]", "null", "1"] {
        let got = parse_err(json);
        assert_eq!(
            got, r#"a desired state is a JSON object, {"networks": [...]}"#,
            "{json}"
        );
    }
    assert!(parse_err("").contains("EOF while parsing"));
    let got = parse_err(r#"{"networks":[{"name":"web"}]}"#);
    assert!(
        got.contains("networks[0]: missing field `interfaces`"),
        "{got}"
    );
    // What parses but does not validate is refused by `from_json` all the same.
    let err = DesiredState::from_json(&DESIGN_EXAMPLE.replace(r#"["veth-lb"]"#, "[]")).unwrap_err();
    assert!(matches!(err, StateError::Invalid(_)), "{err}");
    assert_eq!(
        err.to_string(),
        r#"network "web": no interface; a network needs at least one to attach to"#
    );
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    let cases = [
        (
            r#"{"networks""#,
            r#"{"bogus":1,"networks""#,
            "bogus: unknown field `bogus`",
        ),
        (
            r#"{"name":"web""#,
            r#"{"bogus":1,"name":"web""#,
            "networks[0].bogus: unknown field `bogus`",
        ),
        (
            r#"{"id":"api""#,
            r#"{"bogus":1,"id":"api""#,
            "networks[0].services[0].bogus: unknown field `bogus`",
        ),
        (
            r#"{"ip":"10.20.0.2"}"#,
            r#"{"ip":"10.20.0.2","weight":2}"#,
            "networks[0].services[0].backends[0].weight: unknown field `weight`, expected `ip` or `disabled`",
        ),
        (
            r#"{"proto":"tcp""#,
            r#"{"bogus":1,"proto":"tcp""#,
            "networks[0].services[0].ports[0].bogus: unknown field `bogus`",
        ),
    ];
    for (from, to, expected) in cases {
        assert!(DESIGN_EXAMPLE.contains(from), "{from}");
        let got = parse_err(&DESIGN_EXAMPLE.replacen(from, to, 1));
        assert!(
            got.contains(expected),
            "{to}:\n  got {got}\n  want {expected}"
        );
    }
}

#[test]
fn unspecified_host_ip_means_any_address() {
    let json = DESIGN_EXAMPLE.replace(r#""host_ip":null"#, r#""host_ip":"0.0.0.0""#);
    let state = DesiredState::from_json(&json).unwrap();
    assert_eq!(state.networks[0].services[0].ports[0].host_ip, None);
    assert_eq!(state, DesiredState::from_json(DESIGN_EXAMPLE).unwrap());
    let port: PortConfig = "tcp/8080@0.0.0.0".parse().unwrap();
    assert_eq!(port, "tcp/8080".parse().unwrap());
}

#[test]
fn cli_port_and_backend_syntax() {
    let port: PortConfig = "tcp/8080:80@192.168.1.10".parse().unwrap();
    assert_eq!(
        port,
        PortConfig {
            proto: Proto::Tcp,
            published: 8080,
            target: Some(80),
            host_ip: Some(ip("192.168.1.10")),
        }
    );
    assert_eq!(port.target(), 80);
    assert_eq!(key_of(&port).to_string(), "tcp/8080@192.168.1.10");
    for s in [
        "tcp/8080:80@192.168.1.10",
        "udp/53",
        "sctp/9:10",
        "tcp/1@10.0.0.1",
    ] {
        assert_eq!(s.parse::<PortConfig>().unwrap().to_string(), s);
    }
    let backend: Backend = "10.0.0.3,disabled".parse().unwrap();
    assert_eq!(
        backend,
        Backend {
            ip: ip("10.0.0.3"),
            disabled: true
        }
    );
    for s in ["10.0.0.3", "10.0.0.3,disabled"] {
        assert_eq!(s.parse::<Backend>().unwrap().to_string(), s);
    }
    assert_eq!("dsr".parse::<Mode>().unwrap(), Mode::Dsr);
    assert_eq!("xdp".parse::<Attach>().unwrap(), Attach::Xdp);
    assert_eq!("never".parse::<Masquerade>().unwrap(), Masquerade::Never);
    assert_eq!(Proto::Sctp.number(), 132);

    let errors = [
        ("tcp/70000", "published port 70000 out of range 1-65535"),
        ("tcp/0", "published port 0 out of range 1-65535"),
        ("tcp/8080:0", "target port 0 out of range 1-65535"),
        ("tcp/8080:99999", "target port 99999 out of range 1-65535"),
        ("tcp/http", r#"invalid published port number "http""#),
        ("tcp/80:", r#"invalid target port number """#),
        (
            "icmp/8",
            r#"unknown protocol "icmp", expected one of tcp, udp, sctp"#,
        ),
        (
            "8080",
            r#"invalid port "8080": expected PROTO/PUBLISHED[:TARGET][@HOST_IP]"#,
        ),
        ("tcp/8080@10.0.0.300", r#"invalid IP address "10.0.0.300""#),
        ("tcp/8080@", r#"invalid IP address """#),
    ];
    for (s, expected) in errors {
        let got = s.parse::<PortConfig>().unwrap_err().to_string();
        assert_eq!(got, expected, "{s}");
    }
    let errors = [
        ("10.0.0.300", r#"invalid IP address "10.0.0.300""#),
        (
            "10.0.0.3,drained",
            r#"invalid backend "10.0.0.3,drained": expected IP[,disabled]"#,
        ),
        ("", r#"invalid IP address """#),
    ];
    for (s, expected) in errors {
        let got = s.parse::<Backend>().unwrap_err().to_string();
        assert_eq!(got, expected, "{s}");
    }
    assert_eq!(
        "ipvs".parse::<Mode>().unwrap_err().to_string(),
        r#"unknown mode "ipvs", expected one of nat, dsr"#
    );
}

// ---------------------------------------------------------------------------------------------
// Desired state: validation

/// A valid state every validation case breaks in exactly one way.
fn valid_state() -> DesiredState {
    DesiredState {
        networks: vec![
            nat(vec![service(
                "api",
                "1",
                "10.99.0.10",
                "10.20.0.2 10.20.0.3,disabled",
                "tcp/8080:80",
            )]),
            network(
                "edge",
                "veth-dsr",
                Mode::Dsr,
                vec![service("dns", "1", "10.98.0.10", "10.21.0.2", "")],
            ),
        ],
    }
}

fn web(s: &mut DesiredState) -> &mut Network {
    &mut s.networks[0]
}

fn api(s: &mut DesiredState) -> &mut Service {
    &mut s.networks[0].services[0]
}

type Mutation = fn(&mut DesiredState);

#[test]
fn validation_rules() {
    valid_state().validate().unwrap();
    let cases: &[(&str, Mutation, &str)] = &[
        // Names.
        (
            "empty network name",
            |s| web(s).name = "".into(),
            r#"network "": network name is empty"#,
        ),
        (
            "network name character",
            |s| web(s).name = "we b".into(),
            r#"network "we b": network name "we b" contains ' '; only A-Z a-z 0-9 _ . - are allowed"#,
        ),
        (
            "network name length",
            |s| web(s).name = "n".repeat(33),
            "is 33 characters long; at most 32 are allowed",
        ),
        (
            "network name dots",
            |s| web(s).name = "..".into(),
            r#"network name cannot be "." or "..""#,
        ),
        (
            "duplicate network",
            |s| s.networks[1].name = "web".into(),
            r#"network "web": network is defined twice"#,
        ),
        // Interfaces and namespaces.
        (
            "no interface",
            |s| web(s).interfaces.clear(),
            r#"network "web": no interface; a network needs at least one"#,
        ),
        (
            "empty interface",
            |s| web(s).interfaces = vec!["".into()],
            r#"invalid interface name "": it is empty"#,
        ),
        (
            "long interface",
            |s| web(s).interfaces = vec!["a".repeat(16)],
            "it is 16 bytes long; at most 15 fit IFNAMSIZ",
        ),
        (
            "interface slash",
            |s| web(s).interfaces = vec!["eth/0".into()],
            "it contains '/'",
        ),
        (
            "interface space",
            |s| web(s).interfaces = vec!["eth 0".into()],
            "it contains ' '",
        ),
        (
            "interface colon",
            |s| web(s).interfaces = vec!["eth0:1".into()],
            "it contains ':'",
        ),
        (
            "interface dot",
            |s| web(s).interfaces = vec![".".into()],
            r#"invalid interface name ".": "." and ".." are reserved"#,
        ),
        (
            "interface twice",
            |s| web(s).interfaces.push("veth-lb".into()),
            r#"network "web": interface "veth-lb" is listed twice"#,
        ),
        (
            "interface of two networks",
            |s| s.networks[1].interfaces = vec!["veth-lb".into()],
            r#"network "edge": interface "veth-lb" in the daemon's netns is already used by network "web""#,
        ),
        (
            "interface of two networks in one netns",
            |s| {
                web(s).netns = Some("ns1".into());
                s.networks[1].netns = Some("/run/netns/ns1".into());
                s.networks[1].interfaces = vec!["veth-lb".into()];
            },
            r#"interface "veth-lb" in netns "ns1" is already used by network "web""#,
        ),
        (
            "one port published by two networks in one netns",
            |s| {
                s.networks[1].mode = Mode::Nat;
                s.networks[1].services[0].ports = ports("tcp/8080:53");
            },
            r#"network "edge" service "dns" generation "1": tcp/8080 overlaps tcp/8080 published by network "web" in the daemon's netns"#,
        ),
        (
            "a port on every address overlaps one on an address, across networks",
            |s| {
                s.networks[1].mode = Mode::Nat;
                s.networks[1].services[0].ports = ports("tcp/8080@192.168.1.10");
            },
            "tcp/8080 published by network \"web\"",
        ),
        (
            "empty netns",
            |s| web(s).netns = Some("".into()),
            r#"invalid netns "": it is empty"#,
        ),
        (
            "relative netns path",
            |s| web(s).netns = Some("a/b".into()),
            "a path must be absolute",
        ),
        // Service names and keys.
        (
            "service id character",
            |s| api(s).id = "api/v2".into(),
            r#"network "web" service "api/v2" generation "1": service id "api/v2" contains '/'"#,
        ),
        (
            "empty service id",
            |s| api(s).id = "".into(),
            "service id is empty",
        ),
        (
            "service id length",
            |s| api(s).id = "s".repeat(65),
            "service id \"sss",
        ),
        (
            "empty generation",
            |s| api(s).generation = "".into(),
            "generation is empty",
        ),
        (
            "generation length",
            |s| api(s).generation = "g".repeat(65),
            "is 65 characters long; at most 64 are allowed",
        ),
        (
            "duplicate service key",
            |s| {
                let dup = api(s).clone();
                web(s).services.push(dup);
            },
            r#"network "web" service "api" generation "1": service is defined twice (same id and generation)"#,
        ),
        // Ports.
        (
            "published port 0",
            |s| api(s).ports[0].published = 0,
            "published port 0 out of range 1-65535",
        ),
        (
            "target port 0",
            |s| api(s).ports[0].target = Some(0),
            "target port 0 out of range 1-65535",
        ),
        (
            "duplicate port",
            |s| api(s).ports.push("tcp/8080:81".parse().unwrap()),
            r#"service "api" generation "1": port tcp/8080 is listed twice"#,
        ),
        (
            "neither a VIP nor a port",
            |s| {
                api(s).vips.clear();
                api(s).ports.clear();
            },
            r#"service "api" generation "1": has neither a VIP nor a published port: it would serve nothing"#,
        ),
        (
            "unspecified host_ip",
            |s| api(s).ports[0].host_ip = Some(Ipv4Addr::UNSPECIFIED.into()),
            "host_ip 0.0.0.0 means any address; leave host_ip unset (null) instead",
        ),
        (
            "multicast host_ip",
            |s| api(s).ports[0].host_ip = Some(ip("224.0.0.1")),
            "host_ip 224.0.0.1 is a multicast address; it must be a unicast address",
        ),
        (
            "dsr timeout on a nat network",
            |s| s.networks[0].timeouts.dsr = Some(5),
            r#"network "web": timeout dsr is the session timeout of a dsr network; this network's mode is nat"#,
        ),
        // Addresses.
        (
            "vip is a backend",
            |s| {
                api(s).backends.push(Backend {
                    ip: ip("10.99.0.10"),
                    disabled: true,
                })
            },
            "VIP 10.99.0.10 is also one of its own backends",
        ),
        (
            "vip unspecified",
            |s| api(s).vips = vec![ip("0.0.0.0")],
            "VIP 0.0.0.0 is the unspecified address",
        ),
        (
            "vip broadcast",
            |s| api(s).vips = vec![ip("255.255.255.255")],
            "VIP 255.255.255.255 is the broadcast address",
        ),
        (
            "vip multicast",
            |s| api(s).vips = vec![ip("239.1.2.3")],
            "VIP 239.1.2.3 is a multicast address",
        ),
        (
            "vip loopback",
            |s| api(s).vips = vec![ip("127.0.0.1")],
            "VIP 127.0.0.1 is a loopback address",
        ),
        (
            "backend unspecified",
            |s| api(s).backends[0].ip = ip("0.0.0.0"),
            "backend 0.0.0.0 is the unspecified address",
        ),
        (
            "backend broadcast",
            |s| api(s).backends[0].ip = ip("255.255.255.255"),
            "backend 255.255.255.255 is the broadcast address",
        ),
        (
            "backend multicast",
            |s| api(s).backends[0].ip = ip("224.0.0.5"),
            "backend 224.0.0.5 is a multicast address",
        ),
        (
            "backend loopback",
            |s| api(s).backends[0].ip = ip("127.0.0.2"),
            "backend 127.0.0.2 is a loopback address",
        ),
        (
            "duplicate backend",
            |s| api(s).backends.push("10.20.0.2,disabled".parse().unwrap()),
            "backend 10.20.0.2 is listed twice",
        ),
        // Ownership between services.
        (
            "vip of two services",
            |s| {
                web(s)
                    .services
                    .push(service("other", "1", "10.99.0.10", "10.20.0.9", ""))
            },
            r#"network "web" service "other" generation "1": VIP 10.99.0.10 is already used by service "api""#,
        ),
        (
            "port of two services",
            |s| {
                web(s).services.push(service(
                    "other",
                    "1",
                    "10.99.0.11",
                    "10.20.0.9",
                    "tcp/8080:80",
                ))
            },
            r#"service "other" generation "1": tcp/8080 is already published by service "api""#,
        ),
        (
            "host port overlapping an any-address port",
            |s| {
                web(s).services.push(service(
                    "other",
                    "1",
                    "10.99.0.11",
                    "",
                    "tcp/8080@192.168.1.10",
                ))
            },
            r#"tcp/8080@192.168.1.10 overlaps tcp/8080 published by service "api""#,
        ),
        (
            "any-address port overlapping a host port",
            |s| {
                api(s).ports = ports("tcp/8080@192.168.1.10");
                web(s)
                    .services
                    .push(service("other", "1", "10.99.0.11", "", "tcp/8080"));
            },
            r#"tcp/8080 overlaps tcp/8080@192.168.1.10 published by service "api""#,
        ),
    ];
    for (name, mutate, expected) in cases {
        let mut state = valid_state();
        mutate(&mut state);
        let got = match state.validate() {
            Ok(()) => panic!("{name}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            got.contains(expected),
            "{name}:\n  got  {got}\n  want {expected}"
        );
    }
}

#[test]
fn what_validation_allows() {
    let cases: &[(&str, Mutation)] = &[
        ("rolling update sharing VIP and port", |s| {
            let mut next = service(
                "api",
                "2",
                "10.99.0.10",
                "10.20.0.4",
                "tcp/8080:8080 tcp/9090",
            );
            next.backends.extend(backends("10.20.0.2"));
            web(s).services.push(next);
        }),
        ("same interface in another netns", |s| {
            s.networks[1].netns = Some("ns1".into());
            s.networks[1].interfaces = vec!["veth-lb".into()];
        }),
        ("same port, other protocol, other service", |s| {
            web(s)
                .services
                .push(service("other", "1", "10.99.0.11", "", "udp/8080"));
        }),
        ("same port on two host addresses, two services", |s| {
            api(s).ports = ports("tcp/8080@192.168.1.10");
            web(s).services.push(service(
                "other",
                "1",
                "10.99.0.11",
                "",
                "tcp/8080@192.168.1.11",
            ));
        }),
        ("loopback host_ip", |s| {
            api(s).ports[0].host_ip = Some(ip("127.0.0.1"))
        }),
        ("longest names", |s| {
            web(s).name = "n".repeat(32);
            api(s).id = "s".repeat(64);
            api(s).generation = "g".repeat(64);
            web(s).interfaces = vec!["i".repeat(15)];
        }),
        ("all-disabled service", |s| {
            api(s).backends = backends("10.20.0.2,disabled")
        }),
        ("a service's VIP in another network", |s| {
            s.networks[1].services[0].vips = vec![ip("10.99.0.10")]
        }),
    ];
    for (name, mutate) in cases {
        let mut state = valid_state();
        mutate(&mut state);
        if let Err(e) = state.validate() {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn composed_set_larger_than_the_bucket_space_is_rejected() {
    // Each generation alone fits; their union does not.
    let half = MAX_BACKENDS_PER_SET / 2 + 1;
    let generation = |g: &str, base: u32| Service {
        id: "api".into(),
        generation: g.into(),
        vips: vec![ip("10.99.0.10")],
        backends: (base..base + half)
            .map(|a| Backend {
                ip: Ipv4Addr::from(a).into(),
                disabled: false,
            })
            .collect(),
        ports: ports("tcp/8080"),
    };
    let base = u32::from(ip4("10.0.0.1"));
    let mut state = DesiredState {
        networks: vec![nat(vec![generation("1", base)])],
    };
    state.validate().unwrap();
    state.networks[0]
        .services
        .push(generation("2", base + half));
    let err = state.validate().unwrap_err();
    assert!(
        matches!(err.reason, Invalid::TooManyBackends { n: 65538, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        r#"network "web": VIP 10.99.0.10 has 65538 backends once composed; at most 65536 fit the bucket space"#
    );
    // Exactly the bucket space is fine.
    state.networks[0].services[1]
        .backends
        .truncate(half as usize - 2);
    state.validate().unwrap();
}

#[test]
fn service_edits() {
    let mut net = two_generations();
    let replaced = net.upsert_service(service("api", "2", "10.0.0.5", "10.0.0.8", ""));
    assert_eq!(replaced.unwrap().backends, backends("10.0.0.4"));
    assert_eq!(net.services.len(), 2);
    assert!(
        net.upsert_service(service("db", "1", "10.0.0.6", "", ""))
            .is_none()
    );
    assert_eq!(net.remove_services("api", Some("1")), 1);
    assert_eq!(net.remove_services("api", Some("1")), 0);
    net.upsert_service(service("api", "3", "10.0.0.5", "", ""));
    assert_eq!(net.remove_services("api", None), 2);
    assert_eq!(net.services.len(), 1);
}

/// The nftables dataplane's whole transaction for the shared-port state, pinned: moby's
/// elements grouped by partition shape (a numgen interval vmap per shape, a slot map per
/// interval holding `set key : translation`), verdict-map dispatch with host-bound ports first
/// and off the VIPs, hairpin masquerade per interface. `daemon_nft` feeds the same rendering to
/// a real `nft` and reads it back as `lb elements`.
#[test]
fn golden_nft_ruleset() {
    let state = DesiredState::from_json(include_str!("golden/shared_port.json")).unwrap();
    let web = state.network("web").unwrap();
    let subnets = [(
        "veth-lb".to_owned(),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        24,
    )];
    let got =
        lb_user::dataplane::nft::ruleset(&ComposedNetwork::new(web.clone()), &subnets).unwrap();
    assert_golden!(got, "shared_port.web.nft");
}

/// A dsr network's whole transaction, pinned: its NAT table (the VIP's NAT elements serve
/// where the DSR table cannot run) and moby's DSR table `netdev lb-edge` — the VIP set, the
/// `real-server` elements `lb elements` prints in per-shape units (the NAT table's layout:
/// a dispatch map, a `numgen` verdict map per shape, a map per slot whose chain `fwd`s out of
/// the device the frame came in by), the per-protocol session maps with the network's
/// session timeout, and per interface an ingress and an egress chain with the RST `delete`.
/// `daemon_nft_dsr` runs the same rendering in a namespace.
#[test]
fn golden_nft_ruleset_dsr() {
    let state = DesiredState::from_json(include_str!("golden/shared_port.json")).unwrap();
    let mut edge = state.network("edge").unwrap().clone();
    edge.timeouts.dsr = Some(30);
    let got = lb_user::dataplane::nft::ruleset(&ComposedNetwork::new(edge.clone()), &[]).unwrap();
    assert_golden!(got, "shared_port.edge.nft");
}

/// The same DSR network with an IPv6 VIP and backends beside its IPv4 ones: IPv4's objects
/// and rules as above, and IPv6's (`dataplane::nft::dsr`): `vip6`, units whose slot maps
/// hold each backend's number, a session set per backend and protocol, the ingress rules that
/// find a session by its set, and the `new6` chain that learns a new one.
#[test]
fn golden_nft_ruleset_dsr_dual_stack() {
    let mut json: serde_json::Value =
        serde_json::from_str(include_str!("golden/shared_port.json")).unwrap();
    for n in json["networks"].as_array_mut().unwrap() {
        if n["name"] == "edge" {
            let svc = &mut n["services"][0];
            svc["vips"] = serde_json::json!(["10.1.0.53", "fd01::53"]);
            svc.as_object_mut().unwrap().remove("vip");
            let backends = svc["backends"].as_array_mut().unwrap();
            backends.push(serde_json::json!({"ip": "fd01::3"}));
            backends.push(serde_json::json!({"ip": "fd01::2", "disabled": true}));
        }
    }
    let state = DesiredState::from_json(&json.to_string()).unwrap();
    let mut edge = state.network("edge").unwrap().clone();
    edge.timeouts.dsr = Some(30);
    let got = lb_user::dataplane::nft::ruleset(&ComposedNetwork::new(edge.clone()), &[]).unwrap();
    assert_golden!(got, "shared_port.edge6.nft");
}

// ---------------------------------------------------------------------------------------------
// Capacity: what a sync needs of each map, from the plan and what the maps hold

mod capacity {
    use super::*;
    use lb_user::dataplane::ebpf::{
        Held, MapAddr, MapSizes, Need, ServiceKey, SetBackend, need, plan,
    };

    /// What the maps would hold after a sync of `net` from nothing (ids as a sync gives them).
    fn held_of(net: &Network) -> Held {
        let mut counter = 0;
        let mut next = || {
            counter += 1;
            counter
        };
        let p = plan(net, &compose(net));
        (p.services.into_iter().enumerate())
            .map(|(i, (key, set))| {
                let svc = lb_common::Service {
                    set_id: i as u32 + 1,
                    count: set.len() as u32,
                    session_timeout: 0,
                    flags: 0,
                };
                let backends = (set.into_iter())
                    .map(|(addr, port)| SetBackend {
                        addr,
                        port,
                        counter: next(),
                    })
                    .collect();
                (key, (svc, backends))
            })
            .collect()
    }

    fn two_services() -> Network {
        nat(vec![
            service(
                "a",
                "1",
                "10.99.0.1",
                "10.0.0.1 10.0.0.2 10.0.0.3",
                "tcp/8080:80",
            ),
            service(
                "b",
                "1",
                "10.99.0.2",
                "10.0.0.4 10.0.0.5 10.0.0.6",
                "tcp/8081:80",
            ),
        ])
    }

    fn need_of(net: &Network, held: &Held) -> Need {
        need(&plan(net, &compose(net)), held, net.interfaces.len())
    }

    #[test]
    fn a_sync_from_nothing_needs_every_entry_once() {
        let net = two_services();
        let n = need_of(&net, &Held::new());
        let want = Need {
            vips: 2,
            ports: 2,
            backend_slots: 12,
            counters: 12,
            ifaces: 1,
            ..Need::default()
        };
        assert_eq!(n, want);
        // What the maps hold afterwards is exactly that.
        let held = held_of(&net);
        assert_eq!(held.len(), 4);
        assert_eq!(
            need_of(&net, &held),
            want,
            "an unchanged plan needs nothing more"
        );
    }

    #[test]
    fn a_changed_set_counts_twice_and_only_a_new_backend_takes_a_counter() {
        let net = two_services();
        let held = held_of(&net);
        let mut changed = net.clone();
        changed.services[0].backends[2].ip = ip("10.0.0.9");
        let n = need_of(&changed, &held);
        // Both the VIP's set and the port's set of "a" change: 3 + 3 fresh slots beside the
        // 12 held; one new backend in each set takes a fresh counter.
        assert_eq!(n.backend_slots, 12 + 6);
        assert_eq!(n.counters, 12 + 2);
        assert_eq!((n.vips, n.ports), (2, 2));
    }

    #[test]
    fn removed_services_leave_the_service_maps_before_new_ones_come() {
        let net = two_services();
        let held = held_of(&net);
        let mut other = net.clone();
        other.services[1] = service("c", "1", "10.99.0.3", "10.0.0.7", "");
        let n = need_of(&other, &held);
        assert_eq!((n.vips, n.ports), (2, 1));
        assert_eq!(n.backend_slots, 12 + 1, "b's sets stay until the next sync");
        assert!(held.contains_key(&ServiceKey::Vip(MapAddr::of(ip("10.99.0.2")))));
    }

    #[test]
    fn ipv6_entries_and_slots_count_against_their_own_maps() {
        let mut svc = service(
            "a",
            "1",
            "10.99.0.1",
            "10.0.0.1 fd00::1 fd00::2",
            "tcp/8080:80",
        );
        svc.vips.push(ip("fd99::1"));
        let n = need_of(&nat(vec![svc]), &Held::new());
        // Each family's VIP and published port, each balanced over its own family's
        // backends only.
        assert_eq!((n.vips, n.vips6, n.ports, n.ports6), (1, 1, 1, 1));
        assert_eq!((n.backend_slots, n.backend_slots6), (2, 4));
        assert_eq!(n.counters, 6);
        let sizes = MapSizes::new(4, 3, 1024);
        let err = n.check("web", &sizes, &sizes).unwrap_err().to_string();
        assert!(err.contains("lb_backends6 holds 3"), "{err}");
    }

    #[test]
    fn a_need_over_a_size_names_the_map_the_size_and_the_flag() {
        let n = need_of(&two_services(), &Held::new());
        let sizes = MapSizes::new(2, 11, 1024);
        let err = n.check("web", &sizes, &sizes).unwrap_err().to_string();
        assert!(err.contains("network web: needs 12 backend slots"), "{err}");
        assert!(err.contains("lb_backends holds 11"), "{err}");
        assert!(err.contains("lb daemon --max-backends"), "{err}");
        let err = (n.check(
            "web",
            &MapSizes::new(1, 100, 1024),
            &MapSizes::new(1, 100, 1024),
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("needs 2 VIP entries but lb_vips holds 1"),
            "{err}"
        );
        assert!(err.contains("--max-services"), "{err}");
        // A counter per backend slot (a service is the sum of its backends).
        let tight = MapSizes {
            counters: 11,
            ..MapSizes::new(2, 12, 1024)
        };
        let err = n.check("web", &tight, &tight).unwrap_err().to_string();
        assert!(
            err.contains("needs 12 counters (one per backend slot) but lb_counters holds 11"),
            "{err}"
        );
        assert!(
            n.check("web", &MapSizes::new(2, 12, 1024), &MapSizes::default())
                .is_ok()
        );
        // Maps created with other sizes than the daemon's flags give now: raising the flag
        // does not resize them, and the message says what does.
        let err = (n.check("web", &sizes, &MapSizes::new(2, 1000, 1024)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("created with 11 entries and lb daemon --max-backends now gives 1000"),
            "{err}"
        );
        assert!(err.contains("remove the network and add it again"), "{err}");
    }
}

/// A change's difference lists exactly what differs, in reading order: a network's settings,
/// then each contribution and its backends; a whole network added or removed is one line
/// for itself (and, added, its contents), and a list merely reordered is no change.
#[test]
fn diff_lists_exactly_what_changed() {
    use lb_user::core::diff::diff;
    let state = |networks| DesiredState { networks };
    let a = service("api", "1", "10.0.0.5", "10.0.1.1 10.0.1.2", "tcp/8080:80");
    let old = state(vec![
        nat(vec![a.clone()]),
        network("gone", "v0", Mode::Nat, vec![]),
    ]);
    let lines = |o: &DesiredState, n: &DesiredState| -> Vec<String> {
        diff(o, n).iter().map(|c| c.to_string()).collect()
    };
    assert!(lines(&old, &old).is_empty());

    let mut reordered = old.clone();
    reordered.networks.reverse();
    reordered.networks[1].services[0].backends.reverse();
    assert!(lines(&old, &reordered).is_empty(), "order is no change");

    let mut a2 = a.clone();
    a2.vips.clear();
    a2.backends = backends("10.0.1.2,disabled 10.0.1.3");
    a2.ports = ports("tcp/8080:80 udp/53");
    let mut web = nat(vec![a2, service("db", "2", "10.0.0.6", "10.0.2.1", "")]);
    web.masquerade = Masquerade::Always;
    let new = state(vec![web, network("new", "v1", Mode::Nat, vec![a.clone()])]);
    assert_eq!(
        lines(&old, &new),
        [
            "- network gone",
            "+ network new",
            "+ service api generation 1 in new",
            "+ backend 10.0.1.1 of service api generation 1 in new",
            "+ backend 10.0.1.2 of service api generation 1 in new",
            "~ network web: masquerade: auto -> always",
            "~ service api generation 1 in web: vip: 10.0.0.5 -> -; ports: +udp/53",
            "- backend 10.0.1.1 of service api generation 1 in web",
            "~ backend 10.0.1.2 of service api generation 1 in web: active -> disabled",
            "+ backend 10.0.1.3 of service api generation 1 in web",
            "+ service db generation 2 in web",
            "+ backend 10.0.2.1 of service db generation 2 in web",
        ]
    );
}
