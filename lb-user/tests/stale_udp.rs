//! Stale UDP flows, through `lb daemon` on both dataplanes: a UDP client that keeps sending
//! to a published port from one socket reaches a backend as soon as the port is published
//! (its packets before that made a flow pointing at the node itself, which the nftables
//! dataplane clears, as kubelet's `ClearEntriesForPort`), and reaches the new backend as soon
//! as its old one is removed and the port given to another (the old one's flows are flushed).
//! Root only.
use std::{
    net::{Ipv4Addr, UdpSocket},
    path::Path,
    time::Duration,
};

use lb_tests::{
    bpffs::Bpffs,
    daemon::{LbDaemon, network_add, service_set},
    netns::Topology,
    require_root,
    traffic::spawn_backends,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const NET: &str = "udp";
const PORT: u16 = 15353;
/// How long the client keeps sending, one datagram every 100 ms, before a test fails. The
/// kernel's UDP conntrack timeout (30 s unreplied) is refreshed by every one of them, so a
/// stale flow would never let the client through.
const PATIENCE: Duration = Duration::from_secs(10);

fn lb() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lb"))
}

/// Sends from `sock` until an answer comes back (within [`PATIENCE`]): the answering
/// backend's name.
fn keep_asking(sock: &UdpSocket) -> Option<String> {
    let start = std::time::Instant::now();
    let mut buf = [0u8; 512];
    while start.elapsed() < PATIENCE {
        let _ = sock.send(b"who");
        // A refused send (the ICMP port unreachable of an earlier datagram) is one more try.
        if let Ok(n) = sock.recv(&mut buf) {
            return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    None
}

fn stale_udp_on(dataplane: &str) {
    let topo = Topology::new(2).unwrap();
    let _servers = spawn_backends(&topo, 80, 53).unwrap();
    let bpffs = Bpffs::new().unwrap();
    let d = LbDaemon::start(lb(), bpffs.path(), &["--dataplane", dataplane]).unwrap();
    d.ok(&network_add(&topo, NET));
    let node_ip = topo.node_ip;
    let sock = topo
        .client
        .run(|| -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind(("0.0.0.0", 0))?;
            s.connect((node_ip, PORT))?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            Ok(s)
        })
        .unwrap()
        .unwrap();
    // Not published yet: nothing answers, and the node tracks the client's flow to itself.
    let mut buf = [0u8; 64];
    for _ in 0..5 {
        let _ = sock.send(b"early");
        assert!(sock.recv(&mut buf).is_err(), "nothing answers yet");
    }
    let set = |backend: Ipv4Addr| {
        service_set(NET, "dns", "1", VIP, &format!("udp/{PORT}:53"), &[backend])
    };
    d.ok(&set(topo.backend_ips[0]));
    let first = keep_asking(&sock).unwrap_or_else(|| {
        panic!(
            "the client's socket never reached b0 after the port was published: {}",
            d.ok(&["conntrack", NET])
        )
    });
    assert!(first.starts_with("b0 "), "{first}");
    // The port given to another backend: the same socket follows it.
    d.ok(&set(topo.backend_ips[1]));
    let second = keep_asking(&sock).expect("the client's socket reaches b1");
    assert!(second.starts_with("b1 "), "{second}");
}

#[test]
fn a_udp_client_follows_its_published_port_on_ebpf() {
    if require_root("a_udp_client_follows_its_published_port_on_ebpf") {
        stale_udp_on("ebpf");
    }
}

#[test]
fn a_udp_client_follows_its_published_port_on_nftables() {
    if require_root("a_udp_client_follows_its_published_port_on_nftables") {
        stale_udp_on("nftables");
    }
}
