//! The daemon's own logic over a dataplane that records what it is asked
//! (`dataplane::record`): no root, kernel or namespace. What a change applies, over which
//! previous network and with which composition; what a failed apply leaves and retries;
//! what a restart adopts and removes. The networks are on `lo` and hold no ports, so the
//! daemon's checks of the node only read it.
use std::{net::Ipv4Addr, path::PathBuf};

use lb_user::{
    api::{Event, Request},
    core::{
        compose::compose,
        edit::Edit,
        model::{Backend, DesiredState, HoldPorts, Network, Service},
    },
    daemon::{Daemon, store},
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
    d.record_now();
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

/// A batch is one transaction and one sync: a thousand backend changes over a hundred
/// services are saved at one revision and applied by one apply of their network; a batch
/// with one change that cannot be made changes nothing, applies nothing, and names it.
#[test]
fn a_batch_is_all_or_nothing_and_one_sync() {
    let dir = StateDir::new("batch");
    let dp = Recording::new();
    let mut d = daemon(&dir, &dp);
    d.handle(Request::NetworkAdd {
        network: network("a"),
    })
    .unwrap();
    let mut setup = Vec::new();
    for i in 0..100u8 {
        setup.push(Edit::ServiceSet {
            network: "a".into(),
            service: service(&format!("s{i}"), "1", [10, 99, 0, i], &[]),
        });
    }
    d.handle(Request::Changes {
        changes: setup,
        dry_run: false,
    })
    .unwrap();
    dp.take();
    let before = d.revision();
    let mut changes = Vec::new();
    for i in 0..100u8 {
        for j in 0..10u8 {
            changes.push(Edit::BackendAdd {
                network: "a".into(),
                service: format!("s{i}"),
                generation: None,
                backend: Backend {
                    ip: Ipv4Addr::new(10, 20, i, j + 1).into(),
                    disabled: false,
                },
            });
        }
    }
    assert_eq!(changes.len(), 1000);
    let mut bad = changes.clone();
    // A backend that is a VIP of the network: refused, as `lb service set` would be.
    bad[500] = Edit::BackendAdd {
        network: "a".into(),
        service: "s7".into(),
        generation: None,
        backend: Backend {
            ip: Ipv4Addr::new(10, 99, 0, 9).into(),
            disabled: false,
        },
    };
    let state = d.desired();
    let e = d
        .handle(Request::Changes {
            changes: bad,
            dry_run: false,
        })
        .expect_err("refused");
    assert!(
        e.reply.error.starts_with("change 500: rejected:")
            && e.reply.error.contains("10.99.0.9 is also a VIP"),
        "{e:?}"
    );
    assert!(d.desired() == state, "nothing of it was kept");
    assert_eq!(d.revision(), before, "nothing saved");
    assert_eq!(applies(&dp.take()), [], "nothing applied");

    d.handle(Request::Changes {
        changes,
        dry_run: false,
    })
    .unwrap();
    assert_eq!(d.revision(), before + 1, "one revision");
    assert_eq!(
        applies(&dp.take()),
        [("a".to_owned(), Some(100))],
        "one sync"
    );
    let state = d.desired();
    let backends: usize = (state.networks[0].services.iter())
        .map(|s| s.backends.len())
        .sum();
    assert_eq!(backends, 1000);
    // And it is what the store gives back.
    drop(d);
    let d = daemon(&dir, &dp);
    assert!(d.desired() == state, "the store gives it back in its order");
}

/// The watch: every change once, in order, with its revision and whether it was applied; a
/// retry that applies a failing network says so; a watcher that comes back with a revision
/// gets what it missed; one whose revision is older than the history kept is told to read
/// the state again.
#[test]
fn the_watch_gives_each_change_once_and_what_a_watcher_missed() {
    let dir = StateDir::new("watch");
    let dp = Recording::new();
    let mut d = daemon(&dir, &dp);
    let (history, mut live) = d.watch(None).unwrap();
    assert!(history.is_empty());
    let start = d.revision();
    d.handle(Request::NetworkAdd {
        network: network("a"),
    })
    .unwrap();
    for i in 1..=3u8 {
        d.handle(Request::ServiceSet {
            network: "a".into(),
            service: service("web", "1", [10, 99, 0, 10], &[[10, 20, 0, i]]),
        })
        .unwrap();
    }
    dp.fail("a", true);
    d.handle(Request::ServiceSet {
        network: "a".into(),
        service: service("web", "1", [10, 99, 0, 10], &[[10, 20, 0, 9]]),
    })
    .expect_err("saved, not applied");
    dp.fail("a", false);
    d.retry();
    let event = |line: &[u8]| serde_json::from_slice::<Event>(line).unwrap();
    let mut seen = Vec::new();
    while let Ok(line) = live.try_recv() {
        seen.push(event(&line));
    }
    let revisions: Vec<u64> = seen.iter().map(|e| e.revision).collect();
    assert_eq!(
        revisions,
        [
            start + 1,
            start + 2,
            start + 3,
            start + 4,
            start + 5,
            start + 5
        ],
        "{seen:?}"
    );
    assert!(seen[..4].iter().all(|e| e.applied == Some(true)));
    assert_eq!(seen[4].applied, Some(false));
    assert_eq!(seen[5].networks, ["a"], "the retry's");
    assert!(seen[3].changes.iter().any(|c| c.backend.is_some()));

    // Back from revision start + 2: the three after it, from the store.
    let (history, _) = d.watch(Some(start + 2)).unwrap();
    let missed: Vec<u64> = history.iter().map(|l| event(l).revision).collect();
    assert_eq!(missed, [start + 3, start + 4, start + 5]);
    assert_eq!(event(&history[0]).changes, seen[2].changes);
    // After a restart too.
    drop(d);
    let mut d = daemon(&dir, &dp);
    let (history, _) = d.watch(Some(start + 4)).unwrap();
    assert_eq!(history.len(), 1);

    // Past the history kept: a backend drained and back, again and again.
    for i in 0..store::HISTORY {
        let (network, service, generation, ip) = (
            "a".into(),
            "web".into(),
            None,
            Ipv4Addr::new(10, 20, 0, 9).into(),
        );
        let change = if i % 2 == 0 {
            Edit::BackendDisable {
                network,
                service,
                generation,
                ip,
            }
        } else {
            Edit::BackendEnable {
                network,
                service,
                generation,
                ip,
            }
        };
        d.handle(Request::Changes {
            changes: vec![change],
            dry_run: false,
        })
        .unwrap();
    }
    let e = d.watch(Some(start + 4)).expect_err("too old");
    assert_eq!(e.status.as_u16(), 410, "{e:?}");
    assert!(e.reply.error.contains("read the state again"), "{e:?}");
    let recent = d.revision() - 10;
    assert_eq!(d.watch(Some(recent)).unwrap().0.len(), 10);
}

/// A node of a cluster over the recording dataplane, started on the store in `dir` (the
/// cluster's services it has heard of included).
fn cluster_daemon(dir: &StateDir, dp: &Recording) -> Daemon {
    use lb_user::cluster::{Cluster, Tls};
    let cluster = Cluster::parse("etcd://192.0.2.1:2379", "/lb/", Tls::default()).unwrap();
    std::fs::create_dir_all(&dir.0).unwrap();
    let opened = store::Store::open(&dir.0, None).unwrap();
    let stored = opened.store.cluster().unwrap();
    let (node, _status) = lb_user::daemon::cluster::ClusterNode::new(cluster, "n".into(), stored);
    Daemon::with_store(
        opened,
        &dir.0,
        Box::new(dp.clone()),
        "recording".into(),
        Some(node),
    )
    .unwrap()
}

/// A new node of a cluster, with network `web` of its own.
fn cluster_node(dir: &StateDir, dp: &Recording) -> Daemon {
    let mut d = cluster_daemon(dir, dp);
    d.handle(Request::NetworkAdd {
        network: network("web"),
    })
    .unwrap();
    d
}

/// Services of network web as (id, generation, VIPs).
type Served = Vec<(String, String, Vec<std::net::IpAddr>)>;

/// What a node serves of the cluster and what it refuses: (services of web by id and
/// generation with their VIPs, refused keys).
fn served(d: &mut Daemon) -> (Served, Vec<String>) {
    let state = d.desired();
    let mut services: Vec<_> = (state.networks.iter())
        .flat_map(|n| &n.services)
        .map(|s| (s.id.clone(), s.generation.clone(), s.vips.clone()))
        .collect();
    services.sort();
    let lb_user::api::Reply::Status(status) = d.handle(Request::Status).unwrap() else {
        panic!("a status")
    };
    let refused = (status.cluster.unwrap().refused.iter())
        .map(|r| r.key.to_string())
        .collect();
    (services, refused)
}

/// What a node serves of the cluster is a function of the cluster's contributions, never of
/// the order it heard them in: random histories of puts and deletes over services that claim
/// VIPs from a pool of three (so that many conflict) give the same services and the same
/// refusals on a node that followed every revision, one that listed the end state at once,
/// one that followed half and then listed (a compacted history), and one restarted halfway
/// from its store. `LB_DEBUG_SEED=N` prints seed N's history.
#[test]
fn the_clusters_services_a_node_serves_do_not_depend_on_the_order_it_heard_them() {
    use lb_user::cluster::{
        etcd::{Change, Kv, Listing},
        follow::Update,
    };
    for seed in 1..=40u64 {
        let mut rng = lb_tests::fuzz::Rng::new(seed);
        // etcd's side: the keys as of each revision, and the changes of each.
        let mut kv: std::collections::BTreeMap<String, Kv> = Default::default();
        let mut revisions: Vec<(i64, Vec<Change>)> = Vec::new();
        for r in 2..40i64 {
            let id = ["a", "b", "c", "d", "e"][rng.below(5)];
            let generation = ["1", "2"][rng.below(2)];
            let key = format!("/lb/services/web/{id}/{generation}");
            if rng.below(5) == 0 && kv.contains_key(&key) {
                kv.remove(&key);
                revisions.push((
                    r,
                    vec![Change::Delete {
                        key,
                        mod_revision: r,
                    }],
                ));
                continue;
            }
            let vip = [10, 99, 0, 1 + rng.below(3) as u8];
            let s = service(id, generation, vip, &[[10, 20, 0, 2 + rng.below(4) as u8]]);
            let create_revision = kv.get(&key).map_or(r, |k| k.create_revision);
            let put = Kv {
                key: key.clone(),
                value: serde_json::to_vec(&s).unwrap(),
                create_revision,
                mod_revision: r,
            };
            kv.insert(key, put.clone());
            revisions.push((r, vec![Change::Put(put)]));
        }
        let listing = |upto: i64| -> Listing {
            // The state as of revision `upto`, replayed.
            let mut at: std::collections::BTreeMap<String, Kv> = Default::default();
            for (_, changes) in revisions.iter().take_while(|(r, _)| *r <= upto) {
                for c in changes {
                    match c {
                        Change::Put(k) => {
                            at.insert(k.key.clone(), k.clone());
                        }
                        Change::Delete { key, .. } => {
                            at.remove(key);
                        }
                    }
                }
            }
            Listing {
                revision: upto,
                kvs: at.into_values().collect(),
            }
        };
        let last = revisions.last().unwrap().0;
        let half = revisions[revisions.len() / 2].0;
        if std::env::var("LB_DEBUG_SEED").is_ok_and(|v| v == seed.to_string()) {
            for (r, c) in &revisions {
                for c in c {
                    match c {
                        Change::Put(k) => {
                            let s: Service = serde_json::from_slice(&k.value).unwrap();
                            eprintln!(
                                "{r}: put {} created {} vip {:?}",
                                k.key, k.create_revision, s.vips
                            )
                        }
                        Change::Delete { key, .. } => eprintln!("{r}: delete {key}"),
                    }
                }
            }
            eprintln!("half {half}");
        }

        let dp = Recording::default();
        let dir = StateDir::new(&format!("cluster-{seed}-follow"));
        let mut follow = cluster_node(&dir, &dp);
        follow.cluster_update(Update::Listing(listing(1)));
        for (revision, changes) in &revisions {
            follow.cluster_update(Update::Changes {
                revision: *revision,
                changes: changes.clone(),
            });
        }
        let want = served(&mut follow);

        let dir = StateDir::new(&format!("cluster-{seed}-list"));
        let mut list = cluster_node(&dir, &dp);
        list.cluster_update(Update::Listing(listing(last)));
        assert_eq!(served(&mut list), want, "seed {seed}: listed at once");

        let dir = StateDir::new(&format!("cluster-{seed}-half"));
        let mut half_node = cluster_node(&dir, &dp);
        half_node.cluster_update(Update::Listing(listing(1)));
        for (revision, changes) in revisions.iter().take_while(|(r, _)| *r <= half) {
            half_node.cluster_update(Update::Changes {
                revision: *revision,
                changes: changes.clone(),
            });
        }
        half_node.cluster_update(Update::Listing(listing(last)));
        assert_eq!(
            served(&mut half_node),
            want,
            "seed {seed}: half, then listed"
        );

        // Restarted halfway: the store's cluster state, then the rest of the watch.
        drop(half_node);
        let dir2 = StateDir::new(&format!("cluster-{seed}-restart"));
        let mut restarted = cluster_node(&dir2, &dp);
        restarted.cluster_update(Update::Listing(listing(half)));
        drop(restarted);
        let mut restarted = cluster_daemon(&dir2, &dp);
        let lb_user::api::Reply::Status(status) = restarted.handle(Request::Status).unwrap() else {
            panic!("a status")
        };
        assert_eq!(
            status.cluster.unwrap().revision,
            half,
            "seed {seed}: the store has the revision applied"
        );
        for (revision, changes) in revisions.iter().filter(|(r, _)| *r > half) {
            restarted.cluster_update(Update::Changes {
                revision: *revision,
                changes: changes.clone(),
            });
        }
        assert_eq!(
            served(&mut restarted),
            want,
            "seed {seed}: restarted halfway"
        );
    }
}

/// The cluster's contributions compose with the node's own as generations do: a node-local
/// generation and a cluster generation of one service share its VIP, their backends in one
/// set; a cluster key with the id and generation of a node-local service is refused on the
/// node, and the node's own edit of a cluster contribution is refused with 409.
#[test]
fn the_clusters_generations_compose_with_the_nodes_own() {
    use lb_user::cluster::{
        etcd::{Kv, Listing},
        follow::Update,
    };
    let dp = Recording::default();
    let dir = StateDir::new("cluster-compose");
    let mut d = cluster_node(&dir, &dp);
    d.handle(Request::ServiceSet {
        network: "web".into(),
        service: service("api", "1", [10, 99, 0, 10], &[[10, 20, 0, 2]]),
    })
    .unwrap();
    let kv = |revision: i64, s: &Service| Kv {
        key: format!("/lb/services/web/{}/{}", s.id, s.generation),
        value: serde_json::to_vec(s).unwrap(),
        create_revision: revision,
        mod_revision: revision,
    };
    let theirs = service("api", "2", [10, 99, 0, 10], &[[10, 20, 0, 3]]);
    let clash = service("api", "1", [10, 99, 0, 10], &[[10, 20, 0, 4]]);
    d.cluster_update(Update::Listing(Listing {
        revision: 5,
        kvs: vec![kv(4, &theirs), kv(5, &clash)],
    }));
    let state = d.desired();
    let composed = compose(&state.networks[0]);
    let vip: std::net::IpAddr = Ipv4Addr::new(10, 99, 0, 10).into();
    let mut backends = composed.vips[&vip].clone();
    backends.sort();
    backends.dedup();
    assert_eq!(
        backends,
        [
            std::net::IpAddr::from(Ipv4Addr::new(10, 20, 0, 2)),
            Ipv4Addr::new(10, 20, 0, 3).into()
        ],
        "the node's generation 1 and the cluster's generation 2 in one set"
    );
    let (_, refused) = served(&mut d);
    assert_eq!(
        refused,
        ["web/api/1"],
        "the cluster's api/1 is the node's own here"
    );
    let e = d
        .handle(Request::Changes {
            changes: vec![Edit::BackendDisable {
                network: "web".into(),
                service: "api".into(),
                generation: Some("2".into()),
                ip: Ipv4Addr::new(10, 20, 0, 3).into(),
            }],
            dry_run: false,
        })
        .unwrap_err();
    assert_eq!(e.status, 409, "{e:?}");
    assert!(e.reply.error.contains("is the cluster's"), "{e:?}");
    // `lb state` is the node's own: generation 1 only.
    let lb_user::api::Reply::State(own) = d.handle(Request::State).unwrap() else {
        panic!("a state")
    };
    let ids: Vec<(&str, &str)> = (own.networks[0].services.iter())
        .map(|s| (s.id.as_str(), s.generation.as_str()))
        .collect();
    assert_eq!(ids, [("api", "1")]);
}
