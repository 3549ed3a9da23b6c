use super::*;
use crate::core::model::DesiredState;

fn edge() -> ComposedNetwork {
    let state = DesiredState::from_json(include_str!("../../../tests/golden/shared_port.json"))
        .expect("golden state");
    ComposedNetwork::new(state.network("edge").expect("the dsr network").clone())
}

/// Where the probe fails (a kernel before 5.16 has no netdev egress hook; the failure is
/// injected here), a dsr network's syncs write no DSR table — a whole declaration deletes
/// one left over, a difference leaves it alone — while its VIPs keep their NAT elements,
/// and `lb status` says why; with the probe passing the same network gets its chains.
#[test]
fn without_the_egress_hook_a_dsr_network_is_served_by_nat_and_says_so() {
    let edge = edge();
    let present = ["veth-dsr".to_owned()];
    let missing: Result<(), String> = Err("Operation not supported".to_owned());

    let sync = dsr_sync(&edge, None, &present, &missing, true).unwrap();
    assert!(!sync.on, "{sync:?}");
    let (script, _) = ruleset::declare(&edge, &[], &sync).unwrap();
    assert!(!script.contains("add chain netdev"), "{script}");
    assert!(script.contains("delete table netdev lb-edge"), "{script}");
    assert!(
        script.contains("add element ip lb-edge vip-dispatch { 10.1.0.53 : goto"),
        "the VIP keeps its NAT elements: {script}"
    );
    let sync = dsr_sync(&edge, Some(&edge), &present, &missing, false).unwrap();
    let diff = update(&edge, &edge, &[], &sync).unwrap();
    assert!(!diff.script.contains("netdev"), "{}", diff.script);
    let warning = dsr_warning(&edge, &missing).expect("a warning");
    assert!(
        warning.contains("Linux 5.16") && warning.ends_with("(Operation not supported)"),
        "{warning}"
    );

    let works = Ok(());
    assert_eq!(dsr_warning(&edge, &works), None);
    let sync = dsr_sync(&edge, Some(&edge), &present, &works, false).unwrap();
    assert!(sync.on && sync.was_on, "{sync:?}");
    let diff = update(&edge, &edge, &[], &sync).unwrap();
    assert!(
        diff.script
            .contains("add chain netdev lb-edge egress-veth-dsr { type filter hook egress"),
        "{}",
        diff.script
    );

    // A nat network never has the table, and nothing to say about it.
    let nat = Network {
        mode: Mode::Nat,
        ..edge.network().clone()
    };
    assert!(!dsr_on(&nat, &works));
    assert_eq!(dsr_warning(&nat, &missing), None);
}
