//! The etcd harness (`lb_tests::etcd`) against Debian's real etcd 3.4: three members on one
//! segment elect a leader, a write through one member is read through another and from an
//! attached host, a SIGKILLed leader is replaced and the cluster keeps taking writes, the
//! killed member comes back with its data and catches up, and a host whose link is down
//! reaches no member. What the cluster tests of `lb daemon --cluster` stand on. Root only.
use lb_tests::{etcd::EtcdCluster, netns::Netns, require_root};

#[test]
fn a_real_three_member_cluster_elects_survives_its_leader_and_cuts_off_a_host() {
    if !require_root("a_real_three_member_cluster_elects_survives_its_leader_and_cuts_off_a_host") {
        return;
    }
    let mut c = EtcdCluster::start(3).unwrap();
    let endpoints = c.endpoints();
    assert_eq!(endpoints.len(), 3);
    c.etcdctl(&endpoints[..1], &["put", "/lb/a", "one"])
        .unwrap();
    let got = c
        .etcdctl(&endpoints[2..], &["get", "/lb/a", "--print-value-only"])
        .unwrap();
    assert_eq!(got.trim(), "one");

    // A host on the segment reads the same; with its link down it reaches no member.
    let host = Netns::new("etcdhost").unwrap();
    let addr = c.attach(&host, "ctl0").unwrap();
    println!("host attached at {addr}");
    let got = c
        .etcdctl_in(&host, &[], &["get", "/lb/a", "--print-value-only"], None)
        .unwrap();
    assert_eq!(got.trim(), "one");
    host.ip(["link", "set", "ctl0", "down"]).unwrap();
    let cut = c.etcdctl_in(&host, &[], &["get", "/lb/a"], None);
    assert!(
        cut.is_err(),
        "a host with its link down still reads: {cut:?}"
    );
    host.ip(["link", "set", "ctl0", "up"]).unwrap();

    // The leader killed by its pid: another member leads, writes go on.
    let leader = c.leader().unwrap();
    let pid = c.kill(leader).unwrap();
    println!("killed leader m{leader} (pid {pid})");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let new = loop {
        match c.leader() {
            Ok(l) => break l,
            Err(e) if std::time::Instant::now() > deadline => panic!("no new leader: {e:#}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    };
    assert_ne!(new, leader);
    c.etcdctl::<&str>(&[], &["put", "/lb/b", "two"]).unwrap();

    // The killed member comes back with its data and has the write it missed.
    c.restart(leader).unwrap();
    let mine = [endpoints[leader].clone()];
    let got = c
        .etcdctl(
            &mine,
            &["get", "/lb/b", "--print-value-only", "--consistency=s"],
        )
        .unwrap();
    assert_eq!(got.trim(), "two", "{}", c.log(leader));
}
