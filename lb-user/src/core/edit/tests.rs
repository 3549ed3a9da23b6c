use super::*;
use crate::core::model::{PortConfig, Proto};

/// xorshift: the edits are random but the same at every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a, T>(&mut self, of: &'a [T]) -> &'a T {
        &of[(self.next() % of.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const NETWORKS: [&str; 3] = ["n1", "n2", "n3"];
const IDS: [&str; 3] = ["a", "b", "c"];
const GENERATIONS: [&str; 2] = ["1", "2"];
const VIPS: [&str; 5] = [
    "10.99.0.1",
    "10.99.0.2",
    "10.99.0.3",
    "fd99::1",
    "10.20.0.1",
];
const BACKENDS: [&str; 8] = [
    "10.20.0.1",
    "10.20.0.2",
    "10.20.0.3",
    "10.20.0.4",
    "fd20::1",
    "fd20::2",
    "10.99.0.1",
    "fd99::1",
];
const PORTS: [&str; 5] = [
    "tcp/80",
    "tcp/80:8080",
    "tcp/80@10.0.0.1",
    "udp/53",
    "tcp/443",
];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn network(name: &str) -> Network {
    let netns = (name == "n3").then(|| "x".to_owned());
    Network {
        name: name.to_owned(),
        interfaces: vec![format!("if-{name}")],
        netns,
        mode: Mode::Nat,
        attach: Attach::Tc,
        masquerade: Masquerade::Auto,
        fast_path: FastPath::Auto,
        hold_ports: HoldPorts::On,
        timeouts: Default::default(),
        services: vec![],
    }
}

fn service(r: &mut Rng) -> Service {
    let mut vips: Vec<IpAddr> = Vec::new();
    for _ in 0..r.next() % 3 {
        let v = ip(r.pick::<&str>(&VIPS));
        if !vips.contains(&v) {
            vips.push(v);
        }
    }
    vips.sort_unstable();
    let mut backends: Vec<Backend> = Vec::new();
    for _ in 0..r.next() % 5 {
        let b = ip(r.pick::<&str>(&BACKENDS));
        if !backends.iter().any(|x| x.ip == b) {
            backends.push(Backend {
                ip: b,
                disabled: r.chance(20),
            });
        }
    }
    let mut ports: Vec<PortConfig> = Vec::new();
    for _ in 0..r.next() % 3 {
        let p: PortConfig = r.pick(&PORTS).parse().unwrap();
        if !ports
            .iter()
            .any(|x| (x.proto, x.published, x.host_ip) == (p.proto, p.published, p.host_ip))
        {
            ports.push(p);
        }
    }
    Service {
        id: (*r.pick(&IDS)).to_owned(),
        generation: (*r.pick(&GENERATIONS)).to_owned(),
        vips,
        backends,
        ports,
    }
}

fn edit(r: &mut Rng) -> Edit {
    let network = (*r.pick(&NETWORKS)).to_owned();
    let svc = (*r.pick(&IDS)).to_owned();
    let generation = r.chance(50).then(|| (*r.pick(&GENERATIONS)).to_owned());
    let b = ip(r.pick::<&str>(&BACKENDS));
    match r.next() % 12 {
        0 => Edit::NetworkAdd {
            network: self::network(&network),
        },
        1 if r.chance(30) => Edit::NetworkRm { network },
        2 => Edit::NetworkSet {
            network,
            settings: Settings {
                masquerade: Some(*r.pick(Masquerade::ALL)),
                netns: r.chance(30).then(|| r.chance(50).then(|| "x".to_owned())),
                timeouts: [("udp".to_owned(), r.chance(50).then_some(30))].into(),
                ..Settings::default()
            },
        },
        3..=5 => Edit::ServiceSet {
            network,
            service: service(r),
        },
        6 => Edit::ServiceRm {
            network,
            service: svc,
            generation,
        },
        7 | 8 => Edit::BackendAdd {
            network,
            service: svc,
            generation,
            backend: Backend {
                ip: b,
                disabled: r.chance(20),
            },
        },
        9 => Edit::BackendRm {
            network,
            service: svc,
            generation,
            ip: b,
        },
        10 => Edit::BackendDisable {
            network,
            service: svc,
            generation,
            ip: b,
        },
        _ => Edit::BackendEnable {
            network,
            service: svc,
            generation,
            ip: b,
        },
    }
}

/// `edit` done the plain way, on a whole state (what the daemon did before edits): `None`
/// where the edit names something that is not there (a refusal that is not about
/// validity).
fn plainly(state: &DesiredState, edit: &Edit) -> Option<DesiredState> {
    let mut s = state.clone();
    fn of<'a>(
        s: &'a mut DesiredState,
        network: &str,
        id: &str,
        g: &Option<String>,
    ) -> Option<&'a mut Service> {
        let n = s.network_mut(network)?;
        let gens: Vec<usize> = (n.services.iter().enumerate())
            .filter(|(_, x)| x.id == id && g.as_ref().is_none_or(|g| *g == x.generation))
            .map(|(i, _)| i)
            .collect();
        match gens.as_slice() {
            [one] => Some(&mut n.services[*one]),
            _ => None,
        }
    }
    match edit {
        Edit::NetworkAdd { network } => {
            if s.network(&network.name).is_some() {
                return None;
            }
            s.networks.push(network.clone());
        }
        Edit::NetworkRm { network } => {
            s.network(network)?;
            s.networks.retain(|n| n.name != *network);
        }
        Edit::NetworkSet { network, settings } => {
            let n = s.network_mut(network)?;
            let new = settings.applied_to(n).ok()?;
            *n = Network {
                services: std::mem::take(&mut n.services),
                ..new
            };
        }
        Edit::ServiceSet { network, service } => {
            s.network_mut(network)?.upsert_service(service.clone());
        }
        Edit::ServiceRm {
            network,
            service,
            generation,
        } => {
            if s.network_mut(network)?
                .remove_services(service, generation.as_deref())
                == 0
            {
                return None;
            }
        }
        Edit::BackendAdd {
            network,
            service,
            generation,
            backend,
        } => {
            let x = of(&mut s, network, service, generation)?;
            if x.backends.iter().any(|b| b.ip == backend.ip) {
                return None;
            }
            x.backends.push(*backend);
        }
        Edit::BackendRm {
            network,
            service,
            generation,
            ip,
        } => {
            let x = of(&mut s, network, service, generation)?;
            let n = x.backends.len();
            x.backends.retain(|b| b.ip != *ip);
            if n == x.backends.len() {
                return None;
            }
        }
        Edit::BackendDisable {
            network,
            service,
            generation,
            ip,
        }
        | Edit::BackendEnable {
            network,
            service,
            generation,
            ip,
        } => {
            let x = of(&mut s, network, service, generation)?;
            x.backends.iter_mut().find(|b| b.ip == *ip)?.disabled =
                matches!(edit, Edit::BackendDisable { .. });
        }
    }
    Some(s)
}

fn composed_as_a_whole(d: &Desired) {
    for n in d.networks() {
        for f in [
            crate::core::model::Family::V4,
            crate::core::model::Family::V6,
        ] {
            let c = n.composed();
            let scan = c
                .vips
                .keys()
                .any(|v| crate::core::model::Family::of(*v) == f)
                || c.ports.keys().any(|k| k.family == f);
            assert_eq!(c.has(f), scan, "{f} in {c:?}");
        }
        assert_eq!(
            *n,
            ComposedNetwork::new(n.network().clone()),
            "network {} composed edit by edit differs from its whole composition",
            n.name
        );
    }
}

#[test]
fn edits_are_refused_exactly_when_the_whole_state_is_invalid() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..40 {
        let mut d = Desired::new(DesiredState {
            networks: vec![network("n1"), network("n2")],
        });
        for step in 0..150 {
            let e = edit(&mut r);
            let before = d.to_state();
            let plain = plainly(&before, &e);
            let mut edited = Edited::default();
            match d.edit(e.clone(), &mut edited) {
                Ok(()) => {
                    accepted += 1;
                    let after = d.to_state();
                    assert_eq!(
                        Some(&after),
                        plain.as_ref(),
                        "round {round} step {step}: {e:?}"
                    );
                    after.validate().unwrap_or_else(|v| {
                            panic!("round {round} step {step}: {e:?} accepted, but the state is invalid: {v}")
                        });
                    assert_eq!(
                        edited.changes,
                        diff::diff(&before, &after),
                        "round {round} step {step}: {e:?}"
                    );
                }
                Err(refusal) => {
                    refused += 1;
                    assert_eq!(d.to_state(), before, "a refused edit changed the state");
                    if let Refusal::Invalid(_) = refusal {
                        let plain = plain.expect("a validity refusal of an edit that applies");
                        assert!(
                            plain.validate().is_err(),
                            "round {round} step {step}: {e:?} refused ({refusal}), but the state it leads to is valid"
                        );
                    } else if let Some(plain) = plain {
                        panic!(
                            "round {round} step {step}: {e:?} refused ({refusal}), but applies: {plain:?}"
                        );
                    }
                }
            }
            composed_as_a_whole(&d);
        }
    }
    // Both ways, often: the pools are small so that edits collide.
    assert!(
        accepted > 1000 && refused > 1000,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn a_batch_is_taken_back_whole() {
    let mut r = Rng(42);
    for _ in 0..200 {
        let mut d = Desired::new(DesiredState {
            networks: vec![network("n1"), network("n2"), network("n3")],
        });
        for _ in 0..30 {
            let _ = d.edit(edit(&mut r), &mut Edited::default());
        }
        let before = d.to_state();
        let mut edited = Edited::default();
        for _ in 0..10 {
            let _ = d.edit(edit(&mut r), &mut edited);
        }
        d.undo(edited);
        assert_eq!(d.to_state(), before);
        composed_as_a_whole(&d);
    }
}

#[test]
fn a_backend_edit_touches_its_sets_only() {
    let mut d = Desired::new(DesiredState {
        networks: vec![network("n1")],
    });
    let mut edited = Edited::default();
    for (id, vip) in [("a", "10.99.0.1"), ("b", "10.99.0.2")] {
        let service = Service {
            id: id.into(),
            generation: "1".into(),
            vips: vec![ip(vip)],
            backends: vec![Backend {
                ip: ip("10.20.0.1"),
                disabled: false,
            }],
            ports: vec![PortConfig {
                proto: Proto::Tcp,
                published: if id == "a" { 80 } else { 81 },
                target: None,
                host_ip: None,
            }],
        };
        d.edit(
            Edit::ServiceSet {
                network: "n1".into(),
                service,
            },
            &mut edited,
        )
        .unwrap();
    }
    let mut edited = Edited::default();
    d.edit(
        Edit::BackendDisable {
            network: "n1".into(),
            service: "a".into(),
            generation: None,
            ip: ip("10.20.0.1"),
        },
        &mut edited,
    )
    .unwrap();
    let t = &edited.touched["n1"];
    let port = PortKey::new(None, crate::core::model::Family::V4, Proto::Tcp, 80);
    assert_eq!(
        t.sets,
        [SetKey::Vip(ip("10.99.0.1")), SetKey::Port(port)].into()
    );
    assert!(!t.whole && t.new_vips.is_empty() && t.new_ports.is_empty());
    assert_eq!(edited.checked, 1);
}
