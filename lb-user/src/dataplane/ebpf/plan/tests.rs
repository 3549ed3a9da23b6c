use super::*;
use crate::core::{
    compose::ComposedNetwork,
    model::{DesiredState, Network},
};

fn network(json_services: &str) -> ComposedNetwork {
    let json = format!(
        r#"{{"networks":[{{"name":"n","interfaces":["x"],"services":[{json_services}]}}]}}"#
    );
    let n: Network = DesiredState::from_json(&json).unwrap().networks[0].clone();
    ComposedNetwork::new(n)
}

/// What the maps hold once `plan` is written (counters numbered in order).
fn held(plan: &Plan) -> Held {
    let mut counter = 0;
    (plan.services.iter())
        .enumerate()
        .map(|(i, (k, set))| {
            let set: Vec<SetBackend> = (set.iter())
                .map(|(addr, port)| {
                    counter += 1;
                    SetBackend {
                        addr: *addr,
                        port: *port,
                        counter,
                    }
                })
                .collect();
            let svc = Service {
                set_id: i as u32 + 1,
                count: set.len() as u32,
                session_timeout: 0,
                flags: 0,
            };
            (*k, (svc, set))
        })
        .collect()
}

/// A change of some sets needs, counted from what is held and the sets alone, what the
/// whole plan over what is held needs.
#[test]
fn a_change_of_sets_needs_what_the_whole_plan_needs() {
    let before = network(
        r#"{"id":"a","vip":"10.99.0.1","backends":[{"ip":"10.20.0.1"},{"ip":"10.20.0.2"}],"ports":[{"proto":"tcp","published":80}]},
               {"id":"b","vip":"10.99.0.2","backends":[{"ip":"10.20.0.3"}]},
               {"id":"c","vip":"fd99::1","backends":[{"ip":"fd20::1"}]}"#,
    );
    let after = network(
        r#"{"id":"a","vip":"10.99.0.1","backends":[{"ip":"10.20.0.1"},{"ip":"10.20.0.9"},{"ip":"10.20.0.8"}],"ports":[{"proto":"tcp","published":80}]},
               {"id":"c","vip":"fd99::1","backends":[{"ip":"fd20::1"}]},
               {"id":"d","vip":"10.99.0.4","backends":[{"ip":"10.20.0.4"}],"ports":[{"proto":"udp","published":53}]}"#,
    );
    let held = held(&plan(&before, before.composed()));
    let whole = need(&plan(&after, after.composed()), &held, 1);
    let sets: BTreeSet<SetKey> = (before.composed().vips.keys().map(|v| SetKey::Vip(*v)))
        .chain(after.composed().vips.keys().map(|v| SetKey::Vip(*v)))
        .chain(before.composed().ports.keys().map(|k| SetKey::Port(*k)))
        .chain(after.composed().ports.keys().map(|k| SetKey::Port(*k)))
        .collect();
    let part = plan_sets(&after, after.composed(), &sets);
    assert_eq!(need_sets(&part, &held, held_need(&held, 1)), whole);
}
