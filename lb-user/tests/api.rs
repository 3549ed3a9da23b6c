//! The HTTP API as a raw client sees it: `curl --unix-socket` drives a real daemon, the socket
//! is root's only, and a seeded fuzz of the request handling and the desired-state JSON (in
//! process against `api::route`, and against a live daemon) finds no panic, only refusals
//! with their HTTP status and a one-line reason, and nothing changed by a refused request.
//!
//! `LB_API_FUZZ_SEED` repeats a run (the seed is printed); `LB_API_FUZZ_ROUTES` and
//! `LB_API_FUZZ_REQUESTS` set how many requests each fuzz sends.
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::Ipv4Addr,
    os::unix::{fs::PermissionsExt as _, net::UnixStream, process::CommandExt as _},
    path::Path,
    process::Command,
};

use hyper::{Method, StatusCode};
use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    fuzz::{Rng, count_from_env, seed_from_env},
    netns::Topology,
    require_root,
    traffic::{Reply, TIMEOUT, spawn_backends, tcp_request},
};
use lb_user::{
    api::{self, ErrorReply, Request},
    core::edit::{Edit, Settings},
    core::model::{
        Attach, Backend, DesiredState, Masquerade, Mode, Network, PortConfig, Proto, Service,
    },
    dataplane::nft::table_name,
};
use serde_json::Value;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const PORT: u16 = 8080;
const PUBLISHED: u16 = 18080;

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// One request as it goes on the wire: method, path (with its query) and body.
#[derive(Clone)]
struct Raw {
    method: Method,
    path: String,
    body: Vec<u8>,
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(500)]);
        write!(f, "{} {} {body:?}", self.method, self.path)
    }
}

impl Raw {
    fn of(r: &Request) -> Raw {
        let (method, path, body) = r.to_http();
        Raw {
            method,
            path,
            body: body.unwrap_or_default(),
        }
    }

    fn route(&self) -> Result<Request, api::ApiError> {
        let (path, query) = match self.path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (self.path.as_str(), None),
        };
        api::route(&self.method, path, query, &self.body)
    }

    fn writes(&self) -> bool {
        self.method != Method::GET
    }
}

fn sample_network(name: &str) -> Network {
    Network {
        name: name.into(),
        interfaces: vec!["eth0".into(), "eth1".into()],
        netns: Some("node".into()),
        mode: Mode::Nat,
        attach: Attach::Tc,
        masquerade: Masquerade::Auto,
        fast_path: Default::default(),
        hold_ports: Default::default(),
        timeouts: Default::default(),
        services: vec![Service {
            id: "web".into(),
            generation: "1".into(),
            vips: vec![VIP.into()],
            backends: vec![
                Backend {
                    ip: Ipv4Addr::new(10, 20, 0, 2).into(),
                    disabled: false,
                },
                Backend {
                    ip: Ipv4Addr::new(10, 20, 0, 3).into(),
                    disabled: true,
                },
            ],
            ports: vec![PortConfig {
                proto: Proto::Tcp,
                published: PUBLISHED,
                target: Some(PORT),
                host_ip: None,
            }],
        }],
    }
}

/// Every kind of request, about `state`'s first network and its first service.
fn corpus(state: &DesiredState) -> Vec<Request> {
    let net = &state.networks[0];
    let service = net.services[0].clone();
    let mut bare = net.clone();
    bare.services.clear();
    let mut other = bare.clone();
    other.name = format!("{}-2", net.name);
    let name = Some(net.name.clone());
    vec![
        Request::Status,
        Request::State,
        Request::Apply {
            state: state.clone(),
            dry_run: false,
        },
        Request::Apply {
            state: state.clone(),
            dry_run: true,
        },
        Request::NetworkList,
        Request::NetworkAdd { network: bare },
        Request::NetworkAdd { network: other },
        Request::NetworkRm {
            name: net.name.clone(),
        },
        Request::ServiceList { network: None },
        Request::ServiceList {
            network: name.clone(),
        },
        Request::ServiceSet {
            network: net.name.clone(),
            service: service.clone(),
        },
        Request::ServiceRm {
            network: net.name.clone(),
            id: service.id.clone(),
            generation: Some(service.generation.clone()),
        },
        Request::ServiceRm {
            network: net.name.clone(),
            id: service.id.clone(),
            generation: None,
        },
        Request::Changes {
            changes: vec![
                Edit::BackendDisable {
                    network: net.name.clone(),
                    service: service.id.clone(),
                    generation: None,
                    ip: service.backends[0].ip,
                },
                Edit::NetworkSet {
                    network: net.name.clone(),
                    settings: Settings {
                        masquerade: Some(Masquerade::Always),
                        netns: Some(None),
                        timeouts: [("udp".to_owned(), None)].into(),
                        ..Settings::default()
                    },
                },
            ],
            dry_run: true,
        },
        Request::Elements { network: None },
        Request::Elements {
            network: name.clone(),
        },
        Request::Conntrack { network: name },
    ]
}

#[test]
fn every_request_reads_back_as_written() {
    let state = DesiredState {
        networks: vec![sample_network("web")],
    };
    let mut requests = corpus(&state);
    requests.extend([
        Request::Watch { from: None },
        Request::Watch { from: Some(7) },
        Request::ClusterChange {
            change: Edit::BackendDisable {
                network: "web".into(),
                service: "api".into(),
                generation: None,
                ip: "10.20.0.2".parse().unwrap(),
            },
            if_revision: Some(12),
        },
    ]);
    // Names the daemon refuses still travel intact, to be refused by name.
    for odd in ["a b", "x/y", "50%", "é", "?q=1", "..", "#"] {
        requests.extend([
            Request::NetworkRm { name: odd.into() },
            Request::ServiceRm {
                network: odd.into(),
                id: odd.into(),
                generation: Some(odd.into()),
            },
            Request::Elements {
                network: Some(odd.into()),
            },
        ]);
    }
    for r in &requests {
        let raw = Raw::of(r);
        assert_eq!(raw.route().as_ref(), Ok(r), "{raw:?}");
    }
}

/// What a fuzzed request may be answered when it is refused: a request or desired state that
/// is not valid, an unknown network, service or path, a method the path does not take, a
/// network that exists, a body over the limit.
const REFUSALS: [u16; 6] = [400, 404, 405, 408, 409, 413];

/// Bad values for a name, an address or a number, as JSON text.
const BAD_VALUES: &[&str] = &[
    "\"\"",
    "\"a b\"",
    "\"é\"",
    "\"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\"",
    "\"1.2.3\"",
    "\"256.0.0.1\"",
    "\"::1\"",
    "\"10.0.0.1/32\"",
    "\" 10.0.0.1\"",
    "\"0.0.0.0\"",
    "\"255.255.255.255\"",
    "\"tcp/0\"",
    "-1",
    "0",
    "65536",
    "4294967296",
    "18446744073709551616",
    "1e400",
    "-1e400",
    "0.5",
    "true",
    "null",
    "[]",
    "{}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "{\"unknown\":1}",
];

/// Values of the right type that a field must not take (the model's validation, and the
/// daemon's checks against the node, refuse them), by the field's name.
fn well_typed_but_wrong(key: &str) -> &'static [&'static str] {
    match key {
        "vip" | "ip" | "host_ip" => &[
            "\"0.0.0.0\"",
            "\"127.0.0.1\"",
            "\"224.0.0.1\"",
            "\"255.255.255.255\"",
            "\"10.99.0.20\"",
            "\"10.99.0.10\"",
        ],
        "published" | "target" => &["0"],
        "name" | "id" | "generation" => &[
            "\"\"",
            "\"a b\"",
            "\"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\"",
        ],
        "interfaces" => &["[]", "[\"nope0\"]", "[\"x\",\"x\"]"],
        "netns" => &["\"nope\"", "\"\"", "\"../x\""],
        "mode" | "attach" | "masquerade" | "proto" => &["\"dsr\"", "\"\""],
        "tcp_syn" | "tcp_established" | "udp" => &["0", "4294967295"],
        _ => &[],
    }
}

/// Bad path segments and query values.
const BAD_SEGMENTS: &[&str] = &[
    "", ".", "..", "%", "%zz", "%2F", "a%20b", "%C3%28", "%C3%A9", "v2", "-", "a.b", "NETWORK",
];

/// Every JSON pointer into `v`.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

/// A mutation of the body's JSON: a value replaced by a bad one (wrong type, huge number,
/// invalid address or name) or by one of the right type that validation refuses, a field
/// removed, an unknown one added. None when the body is not JSON.
fn mutate_json(rng: &mut Rng, body: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let mut at = Vec::new();
    pointers(&v, String::new(), &mut at);
    const MARK: &str = "\u{1}BAD\u{1}";
    let mut bad = rng.pick(BAD_VALUES);
    match (rng.below(5), at.is_empty()) {
        (0, false) => *v.pointer_mut(&at[rng.below(at.len())])? = Value::from(MARK),
        (1 | 2, false) => {
            let fields: Vec<(&String, &[&str])> = (at.iter())
                .map(|p| (p, well_typed_but_wrong(p.rsplit('/').next().unwrap_or(""))))
                .filter(|(_, wrong)| !wrong.is_empty())
                .collect();
            if fields.is_empty() {
                return None;
            }
            let (p, wrong) = fields[rng.below(fields.len())];
            bad = rng.pick(wrong);
            *v.pointer_mut(p)? = Value::from(MARK);
        }
        (3, false) => {
            let p = &at[rng.below(at.len())];
            let (parent, key) = p.rsplit_once('/')?;
            match v.pointer_mut(parent)? {
                Value::Object(m) => drop(m.remove(key)),
                Value::Array(a) => drop(a.remove(key.parse::<usize>().ok()?)),
                _ => return None,
            }
        }
        _ => {
            // An unknown field, at the top or in a nested object.
            let objects: Vec<&String> = (at.iter())
                .filter(|p| v.pointer(p).is_some_and(Value::is_object))
                .collect();
            let target = match objects.is_empty() || rng.percent(30) {
                true => &mut v,
                false => v.pointer_mut(objects[rng.below(objects.len())])?,
            };
            target
                .as_object_mut()?
                .insert("colour".into(), Value::from(MARK));
        }
    }
    let text = v.to_string().replace(&Value::from(MARK).to_string(), bad);
    Some(text.into_bytes())
}

/// 1 to 3 mutations of one of `bases`, each named in `kinds`. Half the requests have only
/// their JSON body mutated (so that most reach the daemon's validation rather than stop at a
/// bad path), a few go unmutated (so that accepted ones are part of the mix), the rest mix
/// every kind.
fn mutate(rng: &mut Rng, bases: &[Raw], kinds: &mut Vec<&'static str>) -> Raw {
    let with_body: Vec<&Raw> = bases.iter().filter(|b| !b.body.is_empty()).collect();
    let body_only = rng.percent(50);
    let mut r = match body_only {
        true => with_body[rng.below(with_body.len())].clone(),
        false => bases[rng.below(bases.len())].clone(),
    };
    if rng.percent(5) {
        kinds.push("none");
        return r;
    }
    for _ in 0..rng.range(1, 4) {
        match if body_only { 4 } else { rng.below(9) } {
            0 => {
                kinds.push("method");
                let methods = [
                    Method::GET,
                    Method::PUT,
                    Method::POST,
                    Method::DELETE,
                    Method::PATCH,
                    Method::OPTIONS,
                ];
                r.method = methods[rng.below(methods.len())].clone();
            }
            1 | 2 => {
                kinds.push("path");
                let (path, query) = match r.path.split_once('?') {
                    Some((p, q)) => (p.to_owned(), format!("?{q}")),
                    None => (r.path.clone(), String::new()),
                };
                let mut segs: Vec<String> = path.split('/').map(str::to_owned).collect();
                let i = rng.range(1, segs.len().max(2));
                match (rng.below(3), i < segs.len()) {
                    (0, true) => segs[i] = rng.pick(BAD_SEGMENTS).to_owned(),
                    (1, true) => drop(segs.remove(i)),
                    _ => segs.insert(i.min(segs.len()), rng.pick(BAD_SEGMENTS).to_owned()),
                }
                r.path = format!("/{}{query}", segs.join("/").trim_start_matches('/'));
            }
            3 => {
                kinds.push("query");
                let sep = if r.path.contains('?') { '&' } else { '?' };
                let q = match rng.below(4) {
                    0 => format!("network={}", rng.pick(BAD_SEGMENTS)),
                    1 => "network=a&network=b".to_owned(),
                    2 => "verbose=1".to_owned(),
                    _ => rng.pick(BAD_SEGMENTS).to_owned(),
                };
                r.path = format!("{}{sep}{q}", r.path);
            }
            4..=6 => match mutate_json(rng, &r.body) {
                Some(body) => {
                    kinds.push("json");
                    r.body = body;
                }
                None => {
                    kinds.push("body replaced");
                    r.body = br#"{"networks":[]}"#.to_vec();
                }
            },
            _ => {
                kinds.push("bytes");
                let n = r.body.len();
                match rng.below(5) {
                    0 if n > 0 => r.body.truncate(rng.below(n)),
                    1 if n > 0 => r.body[rng.below(n)] = rng.u8(),
                    2 => r.body.insert(rng.below(n + 1), rng.u8()),
                    3 => r.body.extend_from_slice(b" {}"),
                    _ => r.body.clear(),
                }
            }
        }
    }
    r
}

/// A refusal as the API promises it: a listed status and a one-line reason; nothing saved.
fn check_refusal(status: u16, body: &[u8], sent: &Raw) -> ErrorReply {
    assert!(
        REFUSALS.contains(&status),
        "{sent:?}: refused with {status}: {}",
        String::from_utf8_lossy(body)
    );
    let reply: ErrorReply = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "{sent:?}: {status} without an error reply ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    assert!(
        !reply.error.trim().is_empty() && !reply.error.contains('\n') && !reply.saved,
        "{sent:?}: {status}: {reply:?}"
    );
    reply
}

#[test]
fn fuzzed_requests_are_read_without_panic_and_refused_with_their_status() {
    let seed = seed_from_env("LB_API_FUZZ_SEED");
    let n = count_from_env("LB_API_FUZZ_ROUTES", 20_000);
    println!("seed {seed:#x} (LB_API_FUZZ_SEED={seed:#x} repeats this run), {n} requests");
    let mut rng = Rng::new(seed);
    let state = DesiredState {
        networks: vec![sample_network("web")],
    };
    let bases: Vec<Raw> = corpus(&state).iter().map(Raw::of).collect();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for _ in 0..n {
        let mut kinds = Vec::new();
        let sent = mutate(&mut rng, &bases, &mut kinds);
        match sent.route() {
            // Whatever is read is a request the client side writes the same way.
            Ok(r) => {
                assert_eq!(Raw::of(&r).route().as_ref(), Ok(&r), "{sent:?} ({kinds:?})");
                *by_status.entry(200).or_default() += 1;
            }
            Err(e) => {
                let body = serde_json::to_vec(&e.reply).unwrap();
                check_refusal(e.status.as_u16(), &body, &sent);
                *by_status.entry(e.status.as_u16()).or_default() += 1;
            }
        }
    }
    println!("read as (200 = a valid request): {by_status:?}");
    for status in [200, 400, 404, 405] {
        assert!(
            by_status.contains_key(&status),
            "no {status} in {by_status:?}"
        );
    }
}

/// What a change of network `fz` writes into the dataplane: on eBPF its maps, as bpftool
/// dumps them (one bpftool run for all); on nftables its table, as nft lists it.
fn dataplane_of(dp: &str, topo: &Topology, bpffs: &Path) -> String {
    if dp == "nftables" {
        return (topo.node)
            .exec(["nft", "list", "table", "ip", &table_name("fz")])
            .unwrap();
    }
    let script: String = [
        "lb_vips",
        "lb_ports",
        "lb_backends",
        "lb_config",
        "lb_local_addrs",
    ]
    .iter()
    .map(|m| format!("map dump pinned {}\n", bpffs.join("fz").join(m).display()))
    .collect();
    lb_tests::bpftool::batch(&script).unwrap()
}

fn get_state(client: &api::Client) -> Vec<u8> {
    let (status, body) = client.send(Method::GET, "/v1/state", Vec::new()).unwrap();
    assert_eq!(status, StatusCode::OK);
    body.to_vec()
}

/// A daemon on dataplane `dp` serving network `fz` on `topo`: service `web` (VIP, a
/// published port, both backends) and `db` (a second VIP).
fn serving(dp: &str, topo: &Topology, bpffs: &Bpffs) -> LbDaemon {
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dp]).expect("lb daemon starts");
    d.ok(&network_add(topo, "fz"));
    let port = format!("tcp/{PUBLISHED}:{PORT}");
    d.ok(&service_set(
        "fz",
        "web",
        "1",
        VIP,
        &port,
        &topo.backend_ips,
    ));
    let db = Ipv4Addr::new(10, 99, 0, 20);
    d.ok(&service_set(
        "fz",
        "db",
        "1",
        db,
        "udp/5353",
        &topo.backend_ips[..1],
    ));
    d
}

#[test]
fn fuzzed_requests_to_a_live_daemon_change_nothing_they_refuse() {
    if require_root("fuzzed_requests_to_a_live_daemon_change_nothing_they_refuse") {
        fuzz_live("ebpf");
    }
}

#[test]
fn nftables_fuzzed_requests_to_a_live_daemon_change_nothing_they_refuse() {
    if require_root("nftables_fuzzed_requests_to_a_live_daemon_change_nothing_they_refuse") {
        fuzz_live("nftables");
    }
}

fn fuzz_live(dp: &str) {
    let seed = seed_from_env("LB_API_FUZZ_SEED");
    let n = count_from_env("LB_API_FUZZ_REQUESTS", 200);
    println!("{dp}: seed {seed:#x} (LB_API_FUZZ_SEED={seed:#x} repeats this run), {n} requests");
    let mut rng = Rng::new(seed);
    let topo = Topology::new(2).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = serving(dp, &topo, &bpffs);
    let maps = || dataplane_of(dp, &topo, bpffs.path());
    let client = api::Client::new(&d.socket());
    let state: DesiredState = serde_json::from_slice(&get_state(&client)).unwrap();
    let bases: Vec<Raw> = corpus(&state).iter().map(Raw::of).collect();
    let mut before = (get_state(&client), maps());
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut validated = 0;
    for i in 0..n {
        let mut kinds = Vec::new();
        let sent = match i {
            // Once: a body over the limit.
            0 => Raw {
                method: Method::PUT,
                path: "/v1/state".into(),
                body: vec![b' '; api::MAX_REQUEST + 1],
            },
            _ => mutate(&mut rng, &bases, &mut kinds),
        };
        let (status, body) = (client.send(sent.method.clone(), &sent.path, sent.body.clone()))
            .unwrap_or_else(|e| panic!("{sent:?} ({kinds:?}): no answer: {e:#}"));
        *by_status.entry(status.as_u16()).or_default() += 1;
        if status.is_success() {
            // Accepted (a valid request among the mutants): the state is put back as it was
            // for the next ones.
            if sent.writes() {
                let (status, body) = client
                    .send(Method::PUT, "/v1/state", before.0.clone())
                    .unwrap();
                assert_eq!(status, StatusCode::OK, "restoring: {body:?}");
                before = (get_state(&client), maps());
            }
            continue;
        }
        let reply = check_refusal(status.as_u16(), &body, &sent);
        // Refused by the daemon's validation of the whole new state (well-formed requests
        // whose content is wrong), not by the request's parsing.
        validated += usize::from(reply.error.starts_with("rejected: "));
        let after_state = get_state(&client);
        assert!(
            after_state == before.0,
            "{sent:?} ({kinds:?}): refused with {status} but the state changed"
        );
        if sent.writes() {
            assert!(
                maps() == before.1,
                "{sent:?} ({kinds:?}): refused with {status} but the dataplane changed"
            );
        }
    }
    // Requests the HTTP client would not send: a body shorter than it claims, a request line
    // that is not HTTP, a path that is not ASCII. The daemon refuses (4xx) or closes, and
    // keeps serving.
    for raw in [
        &b"PUT /v1/state HTTP/1.1\r\nHost: lb\r\nContent-Length: 100\r\n\r\n{\"networks\":"[..],
        b"GET /v1/state HTTP/1.1\r\nHost: lb\r\nContent-Length: -1\r\n\r\n",
        b"\x00\x01\x02 / HTTP/9\r\n\r\n",
        b"GET /v1/state\r\n\r\n",
        "GET /v1/networks/\u{e9} HTTP/1.1\r\nHost: lb\r\n\r\n".as_bytes(),
    ] {
        let mut s = UnixStream::connect(d.socket()).unwrap();
        s.write_all(raw).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let line = answer.lines().next().unwrap_or("(closed)");
        println!(
            "raw {:?}: {line}",
            String::from_utf8_lossy(&raw[..raw.len().min(30)])
        );
        assert!(
            answer.is_empty() || line.starts_with("HTTP/1.1 4"),
            "{}: {answer}",
            String::from_utf8_lossy(raw)
        );
    }
    assert!(get_state(&client) == before.0, "the state changed");
    assert!(maps() == before.1, "the dataplane changed");
    println!("answered: {by_status:?}; {validated} refused by the state's validation");
    let refused: usize = (by_status.iter())
        .filter(|(s, _)| **s >= 400)
        .map(|(_, n)| n)
        .sum();
    assert!(refused >= n / 2, "most mutants are refused: {by_status:?}");
    // Reached, not a rate: about 6-9% of the requests are refused there.
    assert!(
        validated >= (n / 100).max(1),
        "{validated} refused by validation"
    );
    for status in [400, 404, 405, 413] {
        assert!(
            by_status.contains_key(&status),
            "no {status} in {by_status:?}"
        );
    }
}

/// `curl STATUS-AND-BODY`: curl's `-w` status is on the last line.
fn curl(d: &LbDaemon, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(d.socket())
        .args(["-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "curl {args:?}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    println!("curl {args:?}: {status} {body}");
    (status.parse().unwrap(), body.to_owned())
}

#[test]
fn curl_drives_the_api() {
    if !require_root("curl_drives_the_api") {
        return;
    }
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, PORT, PORT + 1).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &[]).expect("lb daemon starts");
    let mode = std::fs::metadata(d.socket()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is root's only");
    // Bound in a private directory and moved into place: none is left beside it.
    let dir = d.socket().parent().unwrap().to_owned();
    let left: Vec<String> = (std::fs::read_dir(&dir).unwrap())
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".d"))
        .collect();
    assert!(left.is_empty(), "left beside the socket: {left:?}");

    let (status, body) = curl(&d, &["http://lb/v1/status"]);
    assert_eq!(status, 200);
    let st: api::Status = serde_json::from_str(&body).unwrap();
    assert_eq!(st.dataplane, "ebpf");

    let mut network = sample_network("web");
    network.interfaces = topo.node_ifaces.clone();
    network.netns = Some(topo.node.name().into());
    let mut service = network.services.remove(0);
    service.id = "api".into();
    service.backends = (topo.backend_ips.iter())
        .map(|&ip| Backend {
            ip: ip.into(),
            disabled: false,
        })
        .collect();
    let add = serde_json::to_string(&network).unwrap();
    let post = [
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        &add,
    ];
    let (status, body) = curl(&d, &[&post[..], &["http://lb/v1/networks"]].concat());
    assert_eq!(status, 201, "{body}");
    let (status, body) = curl(&d, &[&post[..], &["http://lb/v1/networks"]].concat());
    assert_eq!(status, 409, "{body}");
    let mut fields = serde_json::to_value(&service).unwrap();
    fields.as_object_mut().unwrap().remove("id");
    fields.as_object_mut().unwrap().remove("generation");
    let (status, body) = curl(
        &d,
        &[
            "-X",
            "PUT",
            "-d",
            &fields.to_string(),
            "http://lb/v1/networks/web/services/api/1",
        ],
    );
    assert_eq!(status, 200, "{body}");
    let done: api::Done = serde_json::from_str(&body).unwrap();
    assert_eq!(done.done, "service api generation 1 set in web");
    for (addr, port) in [(VIP, PORT), (topo.node_ip, PUBLISHED)] {
        let r: Reply = tcp_request(&topo.client, addr, port, TIMEOUT)
            .unwrap_or_else(|e| panic!("{addr}:{port} after curl: {e:#}"))
            .parse()
            .unwrap();
        // spawn_backends names backend i "b{i}".
        let i: usize = r.backend.trim_start_matches('b').parse().unwrap();
        assert!(i < topo.backend_ips.len(), "{r:?}");
    }

    // curl and the CLI read the same state.
    let (status, body) = curl(&d, &["http://lb/v1/state"]);
    assert_eq!(status, 200);
    let by_curl: DesiredState = serde_json::from_str(&body).unwrap();
    let by_cli: DesiredState = serde_json::from_str(&d.ok(&["state", "--json"])).unwrap();
    assert_eq!(by_curl, by_cli);
    assert_eq!(by_curl.networks[0].services, vec![service]);
    let (status, body) = curl(&d, &["http://lb/v1/services?network=web"]);
    assert_eq!(status, 200);
    let list: Vec<api::ServiceEntry> = serde_json::from_str(&body).unwrap();
    assert_eq!(list.len(), 1);

    // Refusals: JSON with their status.
    for (args, want) in [
        (&["http://lb/v1/nope"][..], 404),
        (&["http://lb/state"], 404),
        (&["-X", "DELETE", "http://lb/v1/networks/nope"], 404),
        (&["-X", "PATCH", "http://lb/v1/state"], 405),
        (
            &[
                "-X",
                "PUT",
                "-d",
                "{\"networks\":[{\"name\":1}]}",
                "http://lb/v1/state",
            ],
            400,
        ),
    ] {
        let (status, body) = curl(&d, args);
        assert_eq!(status, want, "{args:?}: {body}");
        let e: ErrorReply = serde_json::from_str(&body).unwrap();
        assert!(!e.error.is_empty());
        if want == 400 {
            assert!(
                e.error.contains("networks[0].name"),
                "the JSON path: {}",
                e.error
            );
        }
    }

    // A client that is neither root nor the daemon's user is refused even where the socket's
    // mode would let it connect.
    std::fs::set_permissions(d.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(d.socket())
        .args(["-w", "\n%{http_code}", "http://lb/v1/state"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("curl as uid 65534: {text}");
    let (body, status) = text.rsplit_once('\n').unwrap();
    assert_eq!(status, "403", "{text}");
    let e: ErrorReply = serde_json::from_str(body).unwrap();
    assert!(e.error.contains("uid 65534"), "{e:?}");
}
