use super::*;
use crate::core::model::{DesiredState, Mode};

fn network(services: &str) -> ComposedNetwork {
    let json = format!(
        r#"{{"networks":[{{"name":"roll","interfaces":["lbc0"],"services":[{services}]}}]}}"#
    );
    ComposedNetwork::new(
        DesiredState::from_json(&json)
            .expect("a valid state")
            .networks[0]
            .clone(),
    )
}

/// Generation `g` of service `api` on VIP 10.99.0.10 and tcp/8080, with `backends`
/// (`!` before an address: disabled).
fn generation(g: u32, backends: &[&str]) -> String {
    let backends: Vec<String> = (backends.iter())
        .map(|b| match b.strip_prefix('!') {
            Some(ip) => format!(r#"{{"ip":"{ip}","disabled":true}}"#),
            None => format!(r#"{{"ip":"{b}"}}"#),
        })
        .collect();
    format!(
        r#"{{"id":"api","generation":"{g}","vip":"10.99.0.10","backends":[{}],"ports":[{{"proto":"tcp","published":8080,"target":80}}]}}"#,
        backends.join(",")
    )
}

/// The chains of units (`v-…`, `p-…`, `h-…`) a script declares.
fn declared_units(script: &str) -> BTreeSet<String> {
    (script.lines())
        .filter_map(|l| l.strip_prefix("add chain ip lb-roll "))
        .map(|c| c.split_whitespace().next().unwrap_or_default().to_owned())
        .filter(|c| ["v-", "p-", "h-"].iter().any(|k| c.starts_with(k)))
        .collect()
}

/// The contract of [`Update::prepare`] and [`Update::retire`], over the steps of a rolling
/// update whose sets change their number of backends (2, 4, 2 of the new generation, a
/// new generation alone) and back: the switching transaction declares and deletes no unit,
/// and every dispatch entry it writes leads to a unit that is in the table already or
/// declared by `prepare`, which holds no dispatch entry and deletes nothing; units no set
/// uses go in `retire`, after the switch; a step that needs no new unit and drops none is
/// one transaction. (Break it by declaring units in `script` again: the first assertion
/// fails.)
#[test]
fn units_are_declared_a_transaction_before_anything_leads_to_them() {
    let (a, b, c, d) = ("10.20.0.10", "10.20.0.11", "10.20.0.12", "10.20.0.13");
    let steps = [
        network(&generation(1, &[a, b])),
        network(&format!(
            "{},{}",
            generation(1, &[a, b]),
            generation(2, &[c, d])
        )),
        network(&format!(
            "{},{}",
            generation(1, &[&format!("!{a}"), &format!("!{b}")]),
            generation(2, &[c, d])
        )),
        network(&generation(2, &[c, d])),
        network(&generation(2, &[c])),
        network(&generation(2, &[a, b, c, d])),
    ];
    let sync = dsr::Sync::fresh(&steps[0]);
    for (i, pair) in steps.windows(2).enumerate() {
        let (prev, next) = (&pair[0], &pair[1]);
        let u = update(prev, next, &[], &sync).unwrap();
        assert!(
            declared_units(&u.script).is_empty(),
            "step {i}: the switch declares units:\n{}",
            u.script
        );
        let before: BTreeSet<String> = (Layout::of(prev, Family::V4).units.keys())
            .map(|(kind, shape)| super::super::ruleset::chain(*kind, shape))
            .collect();
        let prepared = u.prepare.as_deref().map(declared_units).unwrap_or_default();
        for target in u.script.split("goto ").skip(1) {
            let chain = target.split([' ', ',', '}']).next().unwrap_or_default();
            if chain.matches('-').count() == 2 {
                // A unit's own chain (a dispatch target), not one of its slot chains.
                assert!(
                    before.contains(chain) || prepared.contains(chain),
                    "step {i}: a dispatch entry leads to {chain}, declared in neither the table nor prepare:\n{}",
                    u.script
                );
            }
        }
        let new_units = Layout::of(next, Family::V4)
            .units
            .keys()
            .any(|(kind, shape)| !before.contains(&super::super::ruleset::chain(*kind, shape)));
        assert_eq!(u.prepare.is_some(), new_units, "step {i}: {u:?}");
        if let Some(p) = &u.prepare {
            assert!(
                !p.contains("dispatch"),
                "step {i}: prepare dispatches:\n{p}"
            );
            let deletes: Vec<&str> = (p.lines())
                .filter(|l| l.starts_with("delete") && !l.contains(SYNC_SET))
                .collect();
            assert!(deletes.is_empty(), "step {i}: prepare deletes {deletes:?}");
            let check = format!(
                "add element ip lb-roll {SYNC_SET} {{ {} }}",
                sync_token(prev)
            );
            assert!(
                p.contains(&check),
                "step {i}: prepare checks the table:\n{p}"
            );
        }
        let unit_deletes = |script: &str| -> Vec<String> {
            (script.lines())
                .filter(|l| l.starts_with("delete chain") || l.starts_with("delete map"))
                .map(str::to_owned)
                .collect()
        };
        assert!(
            unit_deletes(&u.script).is_empty(),
            "step {i}: the switch deletes units:\n{}",
            u.script
        );
        let now: BTreeSet<String> = (Layout::of(next, Family::V4).units.keys())
            .map(|(kind, shape)| super::super::ruleset::chain(*kind, shape))
            .collect();
        assert_eq!(
            u.retire.is_some(),
            before.difference(&now).next().is_some(),
            "step {i}: units go in their own transaction, when some do: {u:?}"
        );
        if let Some(r) = &u.retire {
            assert!(
                !r.contains("dispatch") && !r.contains("add chain"),
                "step {i}: retire only deletes:\n{r}"
            );
            assert!(!unit_deletes(r).is_empty(), "step {i}: {r}");
        }
    }
}

/// `update` decides which chains to add and delete from `units_in_use`, which names
/// shapes without rendering elements: it must name them as `Layout::of` does.
#[test]
fn units_in_use_names_the_shapes_the_layout_has() {
    let state = DesiredState::from_json(include_str!("../../../../tests/golden/shared_port.json"))
        .expect("golden state");
    for network in state.networks.iter().filter(|n| n.mode == Mode::Nat) {
        let network = ComposedNetwork::new(network.clone());
        let layout: BTreeSet<Unit> = Layout::of(&network, Family::V4).units.into_keys().collect();
        assert_eq!(
            units_in_use(network.composed(), Family::V4, &|_| false, false),
            layout,
            "network {}",
            network.name
        );
    }
    // And the DSR table's units, of both families (the golden dsr network has IPv4 VIPs
    // alone: IPv6's none on both sides).
    for network in state.networks.iter().filter(|n| n.mode == Mode::Dsr) {
        let network = ComposedNetwork::new(network.clone());
        for &family in Family::ALL {
            let layout: BTreeSet<Unit> = (dsr::layout(&network, family, |_| true).units)
                .into_keys()
                .collect();
            assert!(family == Family::V6 || !layout.is_empty());
            assert_eq!(
                units_in_use(network.composed(), family, &|_| false, true),
                layout,
                "network {} {family:?}",
                network.name
            );
        }
    }
}

/// The IPv6 table follows the network's IPv6 sets: declared whole in `prepare` when the
/// first comes (before anything could reach it, like a new unit), changed like the IPv4
/// one while both have some (with its own token check), deleted with the last; the IPv4
/// table's part is the same as without IPv6.
#[test]
fn the_ipv6_table_comes_changes_and_goes_with_the_ipv6_sets() {
    let dual = |b6: &[&str]| {
        let b: Vec<String> = (["10.20.0.10", "10.20.0.11"].iter().chain(b6))
            .map(|ip| format!(r#"{{"ip":"{ip}"}}"#))
            .collect();
        let vips = if b6.is_empty() {
            r#""vip":"10.99.0.10""#.to_owned()
        } else {
            r#""vips":["10.99.0.10","fd99::10"]"#.to_owned()
        };
        network(&format!(
            r#"{{"id":"api",{vips},"backends":[{}],"ports":[{{"proto":"tcp","published":8080,"target":80}}]}}"#,
            b.join(",")
        ))
    };
    let (v4, two, three) = (
        dual(&[]),
        dual(&["fd20::10", "fd20::11"]),
        dual(&["fd20::10", "fd20::11", "fd20::12"]),
    );
    let sync = dsr::Sync::fresh(&v4);
    let gain = update(&v4, &two, &[], &sync).unwrap();
    let p = gain
        .prepare
        .as_deref()
        .expect("the IPv6 table is declared ahead");
    assert!(p.contains("add table ip6 lb-roll\n"), "{p}");
    assert!(p.contains("add rule ip6 lb-roll prerouting"), "{p}");
    assert!(!gain.script.contains("ip6"), "{}", gain.script);

    let change = update(&two, &three, &[], &sync).unwrap();
    let swap = format!(
        "delete element ip6 lb-roll {SYNC_SET} {{ {} }}",
        sync_token(&two)
    );
    assert!(change.script.contains(&swap), "{}", change.script);
    // Three backends are a new shape: its unit, elements included, comes in `prepare`.
    let p = change.prepare.as_deref().expect("a new IPv6 unit");
    assert!(p.contains("fd20::12 . 80"), "{p}");
    assert!(p.contains("add map ip6 lb-roll p-s3-"), "{p}");
    assert!(
        !change.script.contains("add element ip lb-roll v-"),
        "no IPv4 element changed: {}",
        change.script
    );

    let lose = update(&three, &v4, &[], &sync).unwrap();
    assert!(
        lose.script
            .contains("add table ip6 lb-roll\ndelete table ip6 lb-roll"),
        "{}",
        lose.script
    );
}
