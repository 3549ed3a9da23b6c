//! The NAT programs under BPF_PROG_TEST_RUN: one packet in, the verdict, the bytes out and the
//! map entries it left, against maps filled by the same `sync` that `lb load` uses. Every
//! rewritten packet's checksums are recomputed from scratch by `lb_tests::packet::verify` (an
//! implementation independent of the programs' incremental updates). Root only.
//!
//! A TC run's skb is on loopback (ifindex 1) unless the case sets `ingress_ifindex`: a hairpin
//! is "leaves by the interface it came in on", i.e. ifindex == ingress_ifindex == 1.
use std::{collections::BTreeSet, net::Ipv4Addr};

use aya::programs::{ProgramError, SchedClassifier, TestRun as _, TestRunOptions, Xdp};
use lb_common::{FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY, Flow, FlowKey, MASQ_PORT_MAX, MASQ_PORT_MIN};
use lb_tests::{
    packet::{
        Ipv4Packet, SCTP_CRC_MARKER, arp_request, icmp_error, ip_of, ipv6_tcp_syn, pseudo_seed,
        verify,
    },
    require_root,
};
use lb_user::{
    compose::compose,
    dataplane::ebpf::{
        self, EbpfNetwork, NodeAddrs, PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_XDP, be,
    },
    model::{Attach, Backend, Masquerade, Mode, Network, PortConfig, Proto, Service},
};

const XDP_PASS: u32 = 2;
const TC_ACT_OK: u32 = 0;
/// `TC_ACT_UNSPEC` (-1): not translated, on to the next program.
const TC_ACT_UNSPEC: u32 = u32::MAX;
/// What XDP leaves in a translated packet's metadata for TC (lb-ebpf `nat::HANDOFF`).
const XDP_HANDOFF: u32 = 0x6c62_7864;

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 2);
const CLIENT2: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 3);
/// The node's address (ifindex 1's, for masquerade), and a second local address that only
/// the `db` service publishes on.
const NODE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const HOST_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 1);
const NOT_LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 77);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 20);
const DB_VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 30);
const WEB: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 20, 0, 10),
    Ipv4Addr::new(10, 20, 0, 11),
    Ipv4Addr::new(10, 20, 0, 12),
];
const DB: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prog {
    Xdp,
    TcIngress,
    TcEgress,
}

fn port(proto: Proto, published: u16, target: u16, host_ip: Option<Ipv4Addr>) -> PortConfig {
    PortConfig {
        proto,
        published,
        target: Some(target),
        host_ip,
    }
}

fn service(id: &str, vip: Ipv4Addr, backends: &[Ipv4Addr], ports: Vec<PortConfig>) -> Service {
    Service {
        id: id.into(),
        generation: "1".into(),
        vip,
        backends: backends
            .iter()
            .map(|ip| Backend {
                ip: *ip,
                disabled: false,
            })
            .collect(),
        ports,
    }
}

/// `web` (3 backends; tcp 8080→80, udp 5353→53, sctp 9000→9000 on every node address),
/// `empty` (its one backend disabled) and `db` (tcp 7070→5432 on HOST_IP only).
fn network(masquerade: Masquerade) -> Network {
    let mut empty = service("empty", EMPTY_VIP, &[Ipv4Addr::new(10, 20, 0, 20)], vec![]);
    empty.backends[0].disabled = true;
    Network {
        name: "prog".into(),
        interfaces: vec!["lo".into()],
        netns: None,
        mode: Mode::Nat,
        attach: Attach::Tc,
        masquerade,
        timeouts: Default::default(),
        services: vec![
            service(
                "web",
                VIP,
                &WEB,
                vec![
                    port(Proto::Tcp, 8080, 80, None),
                    port(Proto::Udp, 5353, 53, None),
                    port(Proto::Sctp, 9000, 9000, None),
                ],
            ),
            empty,
            service(
                "db",
                DB_VIP,
                &[DB],
                vec![port(Proto::Tcp, 7070, 5432, Some(HOST_IP))],
            ),
        ],
    }
}

/// One private instance of the object (unpinned maps) with its three programs loaded.
struct Fixture {
    dp: EbpfNetwork,
    net: Network,
}

impl Fixture {
    fn new(masquerade: Masquerade) -> Self {
        let mut dp = EbpfNetwork::unpinned().expect("load the object");
        let ebpf = dp.ebpf_mut();
        let xdp: &mut Xdp = ebpf.program_mut(PROG_XDP).unwrap().try_into().unwrap();
        xdp.load().expect("verifier accepts lb_xdp");
        for name in [PROG_TC_INGRESS, PROG_TC_EGRESS] {
            let tc: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            tc.load()
                .unwrap_or_else(|e| panic!("verifier accepts {name}: {e}"));
        }
        let mut f = Fixture {
            dp,
            net: network(masquerade),
        };
        f.sync();
        f
    }

    /// Writes the fixture's network into the maps, as `lb load` does.
    fn sync(&mut self) {
        let composed = compose(&self.net);
        let plan = ebpf::plan(&self.net, &composed);
        let node = NodeAddrs {
            local: vec![NODE, HOST_IP],
            ifaces: vec![(1, NODE)],
            ephemeral: None,
        };
        let keep: BTreeSet<Ipv4Addr> = self
            .net
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .collect();
        self.dp.sync(&plan, &node, &keep).expect("sync");
    }

    fn run(&mut self, prog: Prog, input: &[u8]) -> (u32, Vec<u8>) {
        self.run_ctx(prog, input, None)
    }

    /// Runs `input` once through `prog`; `ingress_ifindex` (TC only) sets the interface the
    /// skb "came in on". Returns the verdict and the bytes the program left.
    fn run_ctx(
        &mut self,
        prog: Prog,
        input: &[u8],
        ingress_ifindex: Option<u32>,
    ) -> (u32, Vec<u8>) {
        let (verdict, out) = self
            .try_run(prog, input, ingress_ifindex)
            .unwrap_or_else(|e| {
                panic!(
                    "BPF_PROG_TEST_RUN of {prog:?} on {} bytes: {e:?}",
                    input.len()
                )
            });
        let passed = if prog == Prog::Xdp {
            verdict == XDP_PASS
        } else {
            verdict == TC_ACT_OK || verdict == TC_ACT_UNSPEC
        };
        assert!(passed, "{prog:?} must not drop this (verdict {verdict})");
        (verdict, out)
    }

    fn try_run(
        &mut self,
        prog: Prog,
        input: &[u8],
        ingress_ifindex: Option<u32>,
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        let mut out = vec![0u8; input.len() + 256];
        // struct __sk_buff up to tc_index: ingress_ifindex at 36, ifindex at 40.
        let mut skb = [0u8; 48];
        if let Some(i) = ingress_ifindex {
            skb[36..40].copy_from_slice(&i.to_ne_bytes());
            skb[40..44].copy_from_slice(&1u32.to_ne_bytes());
        }
        let ctx = ingress_ifindex.map(|_| &skb[..]);
        let opts = TestRunOptions {
            data_in: Some(input),
            data_out: Some(&mut out),
            ctx_in: ctx,
            repeat: 1,
            ..Default::default()
        };
        let ebpf = self.dp.ebpf_mut();
        let res = match prog {
            Prog::Xdp => {
                let p: &mut Xdp = ebpf.program_mut(PROG_XDP).unwrap().try_into().unwrap();
                p.test_run(opts)
            }
            Prog::TcIngress | Prog::TcEgress => {
                let name = if prog == Prog::TcIngress {
                    PROG_TC_INGRESS
                } else {
                    PROG_TC_EGRESS
                };
                let p: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
                p.test_run(opts)
            }
        }?;
        out.truncate(res.data_size_out as usize);
        if prog == Prog::Xdp && out.len() == input.len() + 4 {
            // A packet XDP translated carries the handoff to TC ingress in its metadata,
            // which a test run returns in front of the frame.
            let hash_key = self.dp.config().unwrap().hash_key;
            let meta = u32::from_ne_bytes(out[..4].try_into().unwrap());
            assert_eq!(meta, XDP_HANDOFF ^ hash_key, "XDP's handoff to TC");
            out.drain(..4);
        }
        Ok((res.return_value, out))
    }

    fn flow(&self, key: &FlowKey) -> Option<Flow> {
        self.dp
            .flow_entries()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t)
    }
}

/// A flow key as the programs build it from `p` (addresses and ports in network order).
fn key(p: &Ipv4Packet) -> FlowKey {
    FlowKey {
        saddr: be(p.saddr),
        daddr: be(p.daddr),
        sport: p.sport.to_be(),
        dport: p.dport.to_be(),
        proto: p.proto,
        _pad: [0; 3],
    }
}

/// Destination address and port of an output frame (IPv4 without options unless `l4_off`).
fn dst(frame: &[u8]) -> (Ipv4Addr, u16) {
    let ip = ip_of(frame);
    let l4 = usize::from(ip[0] & 0x0f) * 4;
    (
        Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        u16::from_be_bytes([ip[l4 + 2], ip[l4 + 3]]),
    )
}

fn src(frame: &[u8]) -> (Ipv4Addr, u16) {
    let ip = ip_of(frame);
    let l4 = usize::from(ip[0] & 0x0f) * 4;
    (
        Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        u16::from_be_bytes([ip[l4], ip[l4 + 1]]),
    )
}

/// `expected` with its destination replaced by what the output says, checksums recomputed:
/// the output must equal this exactly, so nothing but the destination (and its checksums)
/// changed.
fn with_dst(p: &Ipv4Packet, daddr: Ipv4Addr, dport: u16) -> Vec<u8> {
    Ipv4Packet {
        daddr,
        dport,
        ..p.clone()
    }
    .build()
}

fn with_src(p: &Ipv4Packet, saddr: Ipv4Addr, sport: u16) -> Vec<u8> {
    Ipv4Packet {
        saddr,
        sport,
        ..p.clone()
    }
    .build()
}

/// Sends `p` through `prog` and asserts it came out DNATed to one of `backends`:port with
/// nothing else changed and valid checksums. Returns the backend.
fn expect_dnat(
    f: &mut Fixture,
    prog: Prog,
    p: &Ipv4Packet,
    backends: &[Ipv4Addr],
    port: u16,
) -> Ipv4Addr {
    let (_, out) = f.run(prog, &p.build());
    let (backend, dport) = dst(&out);
    assert!(
        backends.contains(&backend),
        "{prog:?}: {backend} is not a backend of {}",
        p.daddr
    );
    assert_eq!(dport, port, "{prog:?}: destination port");
    verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
    assert_eq!(
        out,
        with_dst(p, backend, port),
        "{prog:?}: only the destination changes"
    );
    backend
}

fn expect_untouched(f: &mut Fixture, prog: Prog, input: &[u8]) {
    let (_, out) = f.run(prog, input);
    assert_eq!(out, input, "{prog:?} must pass this byte-identical");
}

fn fixture() -> Option<Fixture> {
    let name = std::thread::current()
        .name()
        .unwrap_or("nat_prog")
        .to_owned();
    require_root(&name).then(|| Fixture::new(Masquerade::Never))
}

#[test]
fn tcp_syn_to_vip_is_dnated_and_both_directions_tracked() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40000, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let fwd = f.flow(&key(&syn)).expect("forward entry");
    assert_eq!(
        (fwd.daddr, fwd.dport, fwd.flags),
        (be(backend), 443u16.to_be(), 0)
    );
    let reply = f
        .flow(&key(&with_dst_packet(&syn, backend, 443).reply()))
        .expect("reply entry");
    assert_eq!((reply.saddr, reply.sport), (be(VIP), 443u16.to_be()));
    assert_eq!(reply.flags, FLOW_EGRESS | FLOW_REPLY);
    assert_eq!(f.dp.flow_entries().len(), 2, "one flow, two entries");
}

fn with_options(mut p: Ipv4Packet, len: usize) -> Vec<u8> {
    // NOPs, then end of options.
    p.options = vec![1; len];
    p.options[len - 1] = 0;
    p.build()
}

fn with_dst_packet(p: &Ipv4Packet, daddr: Ipv4Addr, dport: u16) -> Ipv4Packet {
    Ipv4Packet {
        daddr,
        dport,
        ..p.clone()
    }
}

#[test]
fn xdp_dnats_a_vip_syn_like_tc() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40001, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::Xdp, &syn, &WEB, 443);
    assert_eq!(f.flow(&key(&syn)).unwrap().daddr, be(backend));
}

#[test]
fn udp_to_vip_is_dnated() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::udp(CLIENT, 40002, VIP, 53);
    expect_dnat(&mut f, Prog::TcIngress, &p, &WEB, 53);
    expect_dnat(
        &mut f,
        Prog::Xdp,
        &Ipv4Packet::udp(CLIENT, 40003, VIP, 53),
        &WEB,
        53,
    );
}

#[test]
fn sctp_to_vip_is_dnated_and_its_crc_left_alone() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40004), (Prog::Xdp, 40005)] {
        let p = Ipv4Packet::sctp(CLIENT, sport, VIP, 9000);
        let backend = expect_dnat(&mut f, prog, &p, &WEB, 9000);
        let (_, out) = f.run(prog, &p.build());
        assert_eq!(&out[14 + 20 + 8..14 + 20 + 12], SCTP_CRC_MARKER, "{prog:?}");
        assert_eq!(
            dst(&out).0,
            backend,
            "{prog:?}: the tracked flow keeps its backend"
        );
    }
}

#[test]
fn published_port_rewrites_the_target_port() {
    let Some(mut f) = fixture() else { return };
    for prog in [Prog::TcIngress, Prog::Xdp] {
        let tcp = Ipv4Packet::tcp(CLIENT, 40010 + prog as u16, NODE, 8080);
        expect_dnat(&mut f, prog, &tcp, &WEB, 80);
        let udp = Ipv4Packet::udp(CLIENT, 40010 + prog as u16, NODE, 5353);
        expect_dnat(&mut f, prog, &udp, &WEB, 53);
    }
}

#[test]
fn published_port_to_a_non_local_address_is_untouched() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 40020, NOT_LOCAL, 8080).build();
    expect_untouched(&mut f, Prog::TcIngress, &p);
    expect_untouched(&mut f, Prog::Xdp, &p);
    assert!(f.dp.flow_entries().is_empty(), "nothing tracked");
}

#[test]
fn host_ip_port_matches_only_its_host_ip() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 40030, HOST_IP, 7070);
    expect_dnat(&mut f, Prog::TcIngress, &p, &[DB], 5432);
    expect_untouched(
        &mut f,
        Prog::TcIngress,
        &Ipv4Packet::tcp(CLIENT, 40031, NODE, 7070).build(),
    );
}

#[test]
fn tracked_flow_keeps_its_backend_after_the_set_changes() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40040, VIP, 443);
    let first = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    for b in &mut f.net.services[0].backends {
        b.disabled = b.ip == first;
    }
    f.sync();
    let mut ack = syn.clone();
    ack.payload = b"GET /".to_vec();
    for prog in [Prog::TcIngress, Prog::Xdp] {
        assert_eq!(
            expect_dnat(&mut f, prog, &ack, &WEB, 443),
            first,
            "{prog:?}: drained, not moved"
        );
    }
    for sport in 41000..41030 {
        let b = expect_dnat(
            &mut f,
            Prog::TcIngress,
            &Ipv4Packet::tcp(CLIENT, sport, VIP, 443),
            &WEB,
            443,
        );
        assert_ne!(b, first, "a new flow must not go to a disabled backend");
    }
}

/// A removed backend's UDP flows are flushed (a UDP client would otherwise stay pinned to a
/// dead backend); its TCP flows stay, to finish or be reset by the backend itself.
#[test]
fn removed_backend_loses_its_udp_flows_and_keeps_its_tcp_ones() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40050, VIP, 443);
    let first = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let udp = (41000..41200)
        .map(|sport| Ipv4Packet::udp(CLIENT, sport, VIP, 53))
        .find(|p| expect_dnat(&mut f, Prog::TcIngress, p, &WEB, 53) == first)
        .expect("one of 200 UDP flows lands on the same backend");
    f.net.services[0].backends.retain(|b| b.ip != first);
    f.sync();
    assert!(f.flow(&key(&udp)).is_none(), "UDP flushed with its backend");
    assert_ne!(expect_dnat(&mut f, Prog::TcIngress, &udp, &WEB, 53), first);
    assert_eq!(
        f.flow(&key(&syn)).map(|t| t.daddr),
        Some(be(first)),
        "TCP kept"
    );
    assert_eq!(expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443), first);
}

#[test]
fn reply_is_reverse_nated_on_egress() {
    let Some(mut f) = fixture() else { return };
    for (daddr, dport, target) in [(VIP, 443, 443), (NODE, 8080, 80)] {
        let syn = Ipv4Packet::tcp(CLIENT, 40060, daddr, dport);
        let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, target);
        let reply = with_dst_packet(&syn, backend, target).reply();
        let (_, out) = f.run(Prog::TcEgress, &reply.build());
        verify(&out).unwrap();
        assert_eq!(
            out,
            with_src(&reply, daddr, dport),
            "the client sees the address it spoke to"
        );
    }
}

#[test]
fn udp_zero_checksum_stays_zero() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40070), (Prog::Xdp, 40071)] {
        let mut p = Ipv4Packet::udp(CLIENT, sport, VIP, 53);
        p.l4_csum = Some(0);
        let (_, out) = f.run(prog, &p.build());
        let (backend, _) = dst(&out);
        assert!(WEB.contains(&backend), "{prog:?}");
        assert_eq!(
            &out[14 + 20 + 6..14 + 20 + 8],
            [0, 0],
            "{prog:?}: 0 means no checksum"
        );
        verify(&out).unwrap();
        let reply = with_dst_packet(&p, backend, 53).reply();
        let (_, back) = f.run(Prog::TcEgress, &reply.build());
        assert_eq!(&back[14 + 20 + 6..14 + 20 + 8], [0, 0]);
        assert_eq!(src(&back), (VIP, 53));
    }
}

#[test]
fn vip_without_backends_passes_to_the_stack() {
    let Some(mut f) = fixture() else { return };
    let p = Ipv4Packet::tcp(CLIENT, 40080, EMPTY_VIP, 80).build();
    expect_untouched(&mut f, Prog::TcIngress, &p);
    expect_untouched(&mut f, Prog::Xdp, &p);
    assert!(f.dp.flow_entries().is_empty());
}

#[test]
fn non_service_traffic_passes_byte_identical() {
    let Some(mut f) = fixture() else { return };
    let inputs = [
        Ipv4Packet::tcp(CLIENT, 40090, Ipv4Addr::new(10, 99, 0, 99), 443).build(),
        Ipv4Packet::udp(CLIENT, 40090, NODE, 9999).build(),
        Ipv4Packet::tcp(WEB[0], 80, CLIENT, 40090).build(),
    ];
    for input in &inputs {
        for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
            expect_untouched(&mut f, prog, input);
        }
    }
    assert!(f.dp.flow_entries().is_empty());
}

#[test]
fn arp_passes_byte_identical() {
    let Some(mut f) = fixture() else { return };
    let arp = arp_request(CLIENT, VIP);
    for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
        expect_untouched(&mut f, prog, &arp);
    }
}

#[test]
fn ipv6_passes_byte_identical() {
    let Some(mut f) = fixture() else { return };
    let v6 = ipv6_tcp_syn(443);
    for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
        expect_untouched(&mut f, prog, &v6);
    }
}

#[test]
fn ip_options_are_skipped_to_find_l4() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40100), (Prog::Xdp, 40101)] {
        let mut p = Ipv4Packet::tcp(CLIENT, sport, NODE, 8080);
        // NOP, NOP, NOP, end of options: IHL 6.
        p.options = vec![1, 1, 1, 0];
        let (_, out) = f.run(prog, &p.build());
        let (backend, dport) = dst(&out);
        assert!(WEB.contains(&backend), "{prog:?}");
        assert_eq!(
            dport, 80,
            "{prog:?}: the port behind the options was rewritten"
        );
        verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        assert_eq!(out, with_dst(&p, backend, 80));
    }
}

/// A fragmented datagram to a published port: the first fragment (the one with the UDP
/// header) is DNATed and records the datagram; the later ones, which have no ports, follow it to
/// the same backend with only their addresses changed. A later fragment of a datagram whose
/// first was never seen passes as it is.
#[test]
fn fragments_of_a_translated_datagram_are_followed() {
    let Some(mut f) = fixture() else { return };
    for (prog, sport) in [(Prog::TcIngress, 40110), (Prog::Xdp, 40111)] {
        let mut first = Ipv4Packet::udp(CLIENT, sport, NODE, 5353);
        first.frag = 0x2000;
        first.id = sport;
        let backend = expect_dnat(&mut f, prog, &first, &WEB, 53);
        let data = [0xab; 24];
        for (offset8, more) in [(2, true), (5, false)] {
            let later = first.later_fragment(offset8, more, &data);
            let (_, out) = f.run(prog, &later);
            verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
            let moved = Ipv4Packet {
                daddr: backend,
                ..first.clone()
            };
            assert_eq!(
                out,
                moved.later_fragment(offset8, more, &data),
                "{prog:?}: a later fragment goes where its first went, payload untouched"
            );
        }
        let stray = Ipv4Packet {
            id: sport + 1000,
            ..first.clone()
        }
        .later_fragment(2, true, &data);
        expect_untouched(&mut f, prog, &stray);
    }
}

/// Every cut inside the headers of a packet the programs would translate passes as it is and
/// is not tracked; each uncut packet is translated (so the case can fail). The kernel refuses
/// XDP test runs shorter than an Ethernet header, and skb ones of no more than one.
#[test]
fn truncated_headers_at_every_offset_pass_untouched() {
    let Some(mut f) = fixture() else { return };
    // A tracked flow, so that an ICMP error about it would be translated if it were whole.
    let syn = Ipv4Packet::tcp(CLIENT, 40125, VIP, 443);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let tracked = f.dp.flow_entries().len();
    let router = Ipv4Addr::new(10, 10, 0, 254);
    let cases: [(Vec<u8>, usize); 5] = [
        // Through the TCP checksum, the UDP header, the SCTP ports: what the programs read.
        (
            Ipv4Packet::tcp(CLIENT, 40120, VIP, 443).build(),
            14 + 20 + 18,
        ),
        (Ipv4Packet::udp(CLIENT, 40120, VIP, 53).build(), 14 + 20 + 8),
        (
            Ipv4Packet::sctp(CLIENT, 40120, VIP, 9000).build(),
            14 + 20 + 4,
        ),
        // Through the quoted ports of an ICMP error.
        (
            icmp_error(router, VIP, 3, 4, 1400, ip_of(&syn.reply().build())),
            14 + 20 + 8 + 20 + 4,
        ),
        // A header with 40 bytes of options: cuts inside them (past the fixed header, so
        // TC runs too) up to the ports behind them.
        (
            with_options(Ipv4Packet::tcp(CLIENT, 40121, VIP, 443), 40),
            14 + 60 + 18,
        ),
    ];
    let (mut runs, mut refused) = (0, 0);
    for (full, headers) in &cases {
        for cut in 14..*headers {
            for prog in [Prog::Xdp, Prog::TcIngress, Prog::TcEgress] {
                match f.try_run(prog, &full[..cut], None) {
                    Ok((_, out)) => {
                        assert_eq!(out, &full[..cut], "{prog:?} cut at {cut}");
                        runs += 1;
                    }
                    // An skb test run of an IPv4 frame needs its whole fixed IP header; XDP
                    // runs (the same parse code) cover those cuts.
                    Err(_) if prog != Prog::Xdp && cut < 14 + 20 => refused += 1,
                    Err(e) => panic!("{prog:?} cut at {cut}: {e:?}"),
                }
            }
        }
        assert_eq!(
            f.dp.flow_entries().len(),
            tracked,
            "a cut packet is never tracked"
        );
    }
    for (full, _) in &cases {
        let (_, out) = f.run(Prog::TcIngress, full);
        assert_ne!(&out, full, "the whole packet is translated");
    }
    println!("{runs} truncated runs passed untouched ({refused} refused by the kernel)");
}

/// XDP cannot tell a CHECKSUM_PARTIAL seed from a full checksum that happens to equal it, and
/// the two need different updates: such a packet is left to the TC program beside XDP,
/// untouched and untracked, and TC (which the kernel's helpers tell) translates it.
#[test]
fn xdp_leaves_a_possible_checksum_partial_seed_to_tc() {
    let Some(mut f) = fixture() else { return };
    // What a local sender with offload puts in the TCP checksum field (veth hands XDP the
    // packet like that): the pseudo-header sum for the device to complete.
    let p = Ipv4Packet::tcp(CLIENT, 40130, VIP, 443);
    let mut input = p.build();
    let seed = pseudo_seed(ip_of(&input));
    input[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&seed.to_be_bytes());
    expect_untouched(&mut f, Prog::Xdp, &input);
    assert!(
        f.dp.flow_entries().is_empty(),
        "XDP tracks nothing it leaves"
    );
    let (verdict, out) = f.run(Prog::TcIngress, &input);
    assert_eq!(verdict, TC_ACT_OK);
    assert!(WEB.contains(&dst(&out).0), "TC translates it");
}

#[test]
fn two_clients_with_one_source_port_get_distinct_masquerade_ports() {
    if !require_root("two_clients_with_one_source_port_get_distinct_masquerade_ports") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Always);
    // One backend, so both flows meet on the same (backend, port) tuple.
    f.net.services[0].backends.truncate(1);
    f.sync();
    let mut ports = BTreeSet::new();
    for client in [CLIENT, CLIENT2] {
        let syn = Ipv4Packet::tcp(client, 40140, VIP, 443);
        expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB[..1], 443);
        let (_, out) = f.run(Prog::TcEgress, &with_dst(&syn, WEB[0], 443));
        let (saddr, sport) = src(&out);
        assert_eq!(saddr, NODE, "masqueraded to the interface's address");
        assert!((MASQ_PORT_MIN..=MASQ_PORT_MAX).contains(&sport), "{sport}");
        verify(&out).unwrap();
        ports.insert(sport);
    }
    assert_eq!(ports.len(), 2, "two flows, two ports: {ports:?}");
}

/// Masquerade `always`, the whole round trip: client → VIP (ingress DNAT) → backend, leaving
/// from the node (egress SNAT); the backend's reply to the node (ingress: back to the client)
/// → client, from the VIP (egress).
#[test]
fn masquerade_always_round_trip() {
    if !require_root("masquerade_always_round_trip") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Always);
    let syn = Ipv4Packet::tcp(CLIENT, 40150, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let to_backend = with_dst_packet(&syn, backend, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &to_backend.build(), Some(7));
    let (saddr, masq_port) = src(&out);
    assert_eq!(saddr, NODE);
    verify(&out).unwrap();
    assert_eq!(out, with_src(&to_backend, NODE, masq_port));
    let snat = f.flow(&key(&to_backend)).expect("masquerade entry");
    assert_eq!(snat.flags, FLOW_EGRESS | FLOW_MASQ);

    let reply = Ipv4Packet {
        saddr: backend,
        sport: 443,
        daddr: NODE,
        dport: masq_port,
        ..syn.reply()
    };
    let (_, back) = f.run(Prog::TcIngress, &reply.build());
    verify(&back).unwrap();
    assert_eq!(dst(&back), (CLIENT, 40150), "the reply finds its client");
    let claim = f.flow(&key(&reply)).expect("claim entry");
    assert_eq!(claim.flags, FLOW_MASQ | FLOW_REPLY);
    let (_, last) = f.run(Prog::TcEgress, &back);
    verify(&last).unwrap();
    assert_eq!(
        last,
        with_src(&syn.reply(), VIP, 443),
        "the client sees the VIP answer"
    );
}

/// Masquerade `auto`: SNAT only for a flow leaving by the interface it came in on.
#[test]
fn hairpin_is_masqueraded_only_when_it_leaves_by_its_ingress_interface() {
    if !require_root("hairpin_is_masqueraded_only_when_it_leaves_by_its_ingress_interface") {
        return;
    }
    let mut f = Fixture::new(Masquerade::Auto);
    // A backend reaching its own VIP, on the interface it came in on: masqueraded.
    let hairpin = Ipv4Packet::tcp(WEB[0], 40160, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &hairpin, &WEB, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &with_dst(&hairpin, backend, 443), Some(1));
    assert_eq!(src(&out).0, NODE, "hairpin is masqueraded");
    verify(&out).unwrap();
    // A client on another interface: the backend sees the client.
    let syn = Ipv4Packet::tcp(CLIENT, 40161, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let to_backend = with_dst(&syn, backend, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &to_backend, Some(7));
    assert_eq!(
        out, to_backend,
        "not a hairpin: the client's address is kept"
    );
}

#[test]
fn masquerade_never_keeps_the_client_even_on_a_hairpin() {
    let Some(mut f) = fixture() else { return };
    let hairpin = Ipv4Packet::tcp(WEB[0], 40170, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &hairpin, &WEB, 443);
    let to_backend = with_dst(&hairpin, backend, 443);
    let (_, out) = f.run_ctx(Prog::TcEgress, &to_backend, Some(1));
    assert_eq!(out, to_backend);
}

/// A router between the node and a client tells the backend (via the VIP it answered from)
/// that its reply was too big: the error reaches the backend about the backend's own tuple.
#[test]
fn icmp_frag_needed_toward_a_backend_is_translated_on_ingress() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40180, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    // The reply as the client side saw it (from the VIP), quoted by a router.
    let reply_seen = syn.reply().build();
    let router = Ipv4Addr::new(10, 10, 0, 254);
    for prog in [Prog::TcIngress, Prog::Xdp] {
        let err = icmp_error(router, VIP, 3, 4, 1400, ip_of(&reply_seen));
        let (_, out) = f.run(prog, &err);
        verify(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        let want = icmp_error(
            router,
            backend,
            3,
            4,
            1400,
            ip_of(&with_src(&syn.reply(), backend, 443)),
        );
        assert_eq!(
            out, want,
            "{prog:?}: outer destination and quoted source are the backend's"
        );
    }
}

/// A router between the node and the backends tells the client that its packet was too big:
/// on egress the quoted destination (and the outer source, when the backend itself sent it)
/// become the VIP's.
#[test]
fn icmp_frag_needed_toward_a_client_is_translated_on_egress() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40190, VIP, 443);
    let backend = expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let forwarded = with_dst(&syn, backend, 443);
    let err = icmp_error(backend, CLIENT, 3, 4, 1400, ip_of(&forwarded));
    let (_, out) = f.run(Prog::TcEgress, &err);
    verify(&out).unwrap();
    assert_eq!(
        out,
        icmp_error(VIP, CLIENT, 3, 4, 1400, ip_of(&syn.build()))
    );
}

#[test]
fn counters_count_packets_and_bytes_per_backend_and_service() {
    let Some(mut f) = fixture() else { return };
    let syn = Ipv4Packet::tcp(CLIENT, 40200, VIP, 443);
    expect_dnat(&mut f, Prog::TcIngress, &syn, &WEB, 443);
    let t = f.flow(&key(&syn)).unwrap();
    for _ in 0..4 {
        f.run(Prog::TcIngress, &syn.build());
    }
    let ip_len = (syn.build().len() - 14) as u64;
    let backend = f.dp.counter(t.counter).unwrap();
    let svc = f.dp.counter(t.service_counter).unwrap();
    assert_ne!(t.counter, t.service_counter);
    assert_eq!((backend.packets, backend.bytes), (5, 5 * ip_len));
    assert_eq!((svc.packets, svc.bytes), (5, 5 * ip_len));
}

#[test]
fn egress_leaves_untracked_packets_alone() {
    let Some(mut f) = fixture() else { return };
    // A backend answering a client that never came through lb (no entry): untouched.
    let p = Ipv4Packet::tcp(WEB[1], 443, CLIENT, 40210).build();
    expect_untouched(&mut f, Prog::TcEgress, &p);
}
