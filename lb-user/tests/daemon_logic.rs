//! The daemon's own logic over a dataplane that records what it is asked
//! (`dataplane::record`): no root, kernel or namespace. What a change applies, over which
//! previous network and with which composition; what a failed apply leaves and retries;
//! what a restart adopts and removes. The networks are on `lo` and hold no ports, so the
//! daemon's checks of the node only read it.
use std::{net::Ipv4Addr, path::PathBuf};

use lb_user::{
    api::Request,
    core::{
        compose::compose,
        model::{Backend, DesiredState, HoldPorts, Network, Service},
    },
    daemon::Daemon,
    dataplane::record::{Call, Recording},
};

/// A private state dir, removed on drop.
struct StateDir(PathBuf);

impl StateDir {
    fn new(tag: &str) -> StateDir {
        let dir = std::env::temp_dir().join(format!("lb-logic-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        StateDir(dir)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(dir: &StateDir, dp: &Recording) -> Daemon {
    Daemon::new(&dir.0, Box::new(dp.clone()), "recording".into()).expect("the daemon starts")
}

fn network(name: &str) -> Network {
    let mut n: Network = serde_json::from_value(serde_json::json!({
        "name": name, "interfaces": ["lo"]
    }))
    .unwrap();
    n.hold_ports = HoldPorts::Off;
    n
}

fn service(id: &str, generation: &str, vip: [u8; 4], backends: &[[u8; 4]]) -> Service {
    Service {
        id: id.into(),
        generation: generation.into(),
        vips: vec![Ipv4Addr::from(vip).into()],
        backends: (backends.iter())
            .map(|b| Backend {
                ip: Ipv4Addr::from(*b).into(),
                disabled: false,
            })
            .collect(),
        ports: Vec::new(),
    }
}

/// The applies among `calls`: (network, previous network's service count, if any).
fn applies(calls: &[Call]) -> Vec<(String, Option<usize>)> {
    (calls.iter())
        .filter_map(|c| match c {
            Call::Apply {
                network, previous, ..
            } => Some((
                network.name.clone(),
                previous.as_ref().map(|p| p.services.len()),
            )),
            _ => None,
        })
        .collect()
}

/// A change applies its network once, over the network applied before, handed with its
/// composition (the daemon composes; the dataplane never does); a change that changes
/// nothing applies nothing.
#[test]
fn a_change_applies_its_network_over_the_previous_one_with_its_composition() {
    let dir = StateDir::new("change");
    let dp = Recording::new();
    let mut d = daemon(&dir, &dp);
    d.handle(Request::NetworkAdd {
        network: network("a"),
    })
    .unwrap();
    assert_eq!(applies(&dp.take()), [("a".to_owned(), None)]);
    let web = service(
        "web",
        "1",
        [10, 99, 0, 10],
        &[[10, 20, 0, 11], [10, 20, 0, 12]],
    );
    d.handle(Request::ServiceSet {
        network: "a".into(),
        service: web.clone(),
    })
    .unwrap();
    let calls = dp.take();
    assert_eq!(applies(&calls), [("a".to_owned(), Some(0))], "{calls:?}");
    let Call::Apply {
        network, composed, ..
    } = &calls[0]
    else {
        panic!("{calls:?}")
    };
    assert_eq!(**composed, compose(network), "handed its own composition");
    assert_eq!(composed.vips.len(), 1);
    d.handle(Request::ServiceSet {
        network: "a".into(),
        service: web,
    })
    .unwrap();
    assert_eq!(applies(&dp.take()), [], "nothing changed, nothing applied");
}

/// A failed apply leaves the network's last applied value as the base of the next apply, and
/// the daemon applies it again when asked to retry — until it succeeds, and not after.
#[test]
fn a_failed_apply_is_retried_over_the_last_good_network() {
    let dir = StateDir::new("retry");
    let dp = Recording::new();
    let mut d = daemon(&dir, &dp);
    d.handle(Request::NetworkAdd {
        network: network("a"),
    })
    .unwrap();
    dp.take();
    dp.fail("a", true);
    let refused = d.handle(Request::ServiceSet {
        network: "a".into(),
        service: service("web", "1", [10, 99, 0, 10], &[[10, 20, 0, 11]]),
    });
    let e = refused.expect_err("not applied");
    assert!(e.reply.saved, "saved, to be retried: {e:?}");
    assert_eq!(applies(&dp.take()), [("a".to_owned(), Some(0))]);
    d.retry();
    assert_eq!(applies(&dp.take()), [("a".to_owned(), Some(0))], "retried");
    dp.fail("a", false);
    d.retry();
    assert_eq!(
        applies(&dp.take()),
        [("a".to_owned(), Some(0))],
        "over the last good network"
    );
    d.retry();
    assert_eq!(applies(&dp.take()), [], "nothing left to retry");
}

/// A restarted daemon applies every network over what applied.json records (so a dataplane
/// writes only the difference), removes the networks applied before that the state no
/// longer has, and tells the dataplane which networks to keep.
#[test]
fn a_restart_applies_over_the_recorded_networks_and_removes_the_others() {
    let dir = StateDir::new("restart");
    let dp = Recording::new();
    let mut d = daemon(&dir, &dp);
    d.handle(Request::NetworkAdd {
        network: network("a"),
    })
    .unwrap();
    d.handle(Request::ServiceSet {
        network: "a".into(),
        service: service("web", "1", [10, 99, 0, 10], &[[10, 20, 0, 11]]),
    })
    .unwrap();
    d.record();
    drop(d);
    // As a daemon that applied network b too left it, before b left the desired state.
    let path = dir.0.join("applied.json");
    let mut applied = DesiredState::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut b = network("b");
    b.interfaces = vec!["lbgone0".into()];
    applied.networks.push(b);
    std::fs::write(&path, applied.to_json()).unwrap();
    dp.take();

    let _d = daemon(&dir, &dp);
    let calls = dp.take();
    assert!(calls.contains(&Call::Remove("b".into())), "{calls:?}");
    assert!(
        calls.contains(&Call::RemoveOthers(vec!["a".into()])),
        "{calls:?}"
    );
    assert_eq!(
        applies(&calls),
        [("a".to_owned(), Some(1))],
        "over the recorded network: {calls:?}"
    );
}

/// A network whose apply failed and that was removed before it was ever applied is
/// forgotten: no error is left to retry, and its removal asks the dataplane nothing.
#[test]
fn a_network_never_applied_and_removed_is_forgotten() {
    let dir = StateDir::new("ghost");
    let dp = Recording::new();
    let mut d = daemon(&dir, &dp);
    dp.fail("ghost", true);
    assert!(
        d.handle(Request::NetworkAdd {
            network: network("ghost"),
        })
        .is_err()
    );
    d.handle(Request::NetworkRm {
        name: "ghost".into(),
    })
    .unwrap();
    dp.take();
    assert!(!d.has_errors(), "its failure went with it");
    d.retry();
    assert_eq!(dp.take(), [], "nothing left to retry or remove");
}
