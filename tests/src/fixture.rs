//! The program-level test fixture: one private instance of the dataplane object (unpinned maps)
//! with its three programs loaded, maps filled by the same `ebpf::plan` + `sync` that `lb load`
//! uses, and packets run through BPF_PROG_TEST_RUN. Shared by the program tests (`nat_prog.rs`
//! and its kin: one behaviour per case) and the fuzz tiers (`fuzz.rs`, `fuzz6.rs`: generated
//! packets against the same state, through `crate::fuzz::Fuzz`).
//!
//! A TC run's skb is on loopback (ifindex 1) unless the run passes a context: a hairpin is
//! "leaves by the interface it came in on", i.e. ifindex == ingress_ifindex == 1.
use std::{
    collections::BTreeSet,
    fmt,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
};

use aya::{
    Ebpf, Pod,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
    programs::{ProgramError, SchedClassifier, TestRun as _, TestRunOptions, TestRunResult, Xdp},
};
use lb_common::{
    Addr6, Config, Flow, Flow6, FlowKey, FlowKey6, FlowKeyOf, FlowOf, FragKey, FragKey6, FragPorts,
    Reason,
};
use lb_user::{
    core::compose::compose,
    core::model::{Attach, Backend, Family, Masquerade, Mode, Network, PortConfig, Proto, Service},
    dataplane::ebpf::{
        self, EbpfNetwork, MapIp, NodeAddrs, PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_XDP, be4,
    },
};

use crate::packet::{Ipv4Packet, Ipv6Packet};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
/// `TC_ACT_UNSPEC` (-1): not translated, on to the next program.
pub const TC_ACT_UNSPEC: u32 = u32::MAX;
/// What XDP leaves in a translated packet's metadata for TC (lb-ebpf `nat::HANDOFF`), before
/// it is mixed with the network's hash key.
pub const XDP_HANDOFF: u32 = 0x6c62_7864;

pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 2);
pub const CLIENT2: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 3);
/// The node's address (ifindex 1's, for masquerade), and a second local address that only
/// the `db` service publishes on.
pub const NODE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 1);
pub const NOT_LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 77);
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 10);
pub const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 20);
/// The disabled (only) backend of `empty`.
pub const EMPTY_BACKEND: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 20);
pub const DB_VIP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 30);
pub const WEB: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 20, 0, 10),
    Ipv4Addr::new(10, 20, 0, 11),
    Ipv4Addr::new(10, 20, 0, 12),
];
pub const DB: Ipv4Addr = Ipv4Addr::new(10, 20, 0, 30);
/// The node's IPv6 address (ifindex 1's too). A local address only of a network that has
/// IPv6 services ([`dual_stack_network`]), so that every other network syncs as it did
/// before dual stack.
pub const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
/// `web`'s IPv6 VIP and backends in [`dual_stack_network`].
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x10);
pub const WEB6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd20, 0, 0, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd20, 0, 0, 0, 0, 0, 0, 3),
    Ipv6Addr::new(0xfd20, 0, 0, 0, 0, 0, 0, 4),
];
/// A port `db` publishes (tcp and udp) on 127.0.0.1, where the test process itself can hold
/// sockets: the programs' socket lookup runs in the test's own namespace.
pub const LOOPBACK_PORT: u16 = 47080;

/// The three programs, in `lb_reasons` hook order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Prog {
    Xdp,
    TcIngress,
    TcEgress,
}

impl Prog {
    pub const ALL: [Prog; 3] = [Prog::Xdp, Prog::TcIngress, Prog::TcEgress];

    /// The label `EbpfNetwork::reasons` gives this program's counters.
    pub fn hook(self) -> &'static str {
        ebpf::HOOKS[self as usize]
    }
}

pub fn port(proto: Proto, published: u16, target: u16, host_ip: Option<Ipv4Addr>) -> PortConfig {
    PortConfig {
        proto,
        published,
        target: Some(target),
        host_ip: host_ip.map(Into::into),
    }
}

pub fn service(id: &str, vip: Ipv4Addr, backends: &[Ipv4Addr], ports: Vec<PortConfig>) -> Service {
    Service {
        id: id.into(),
        generation: "1".into(),
        vips: vec![vip.into()],
        backends: backends
            .iter()
            .map(|ip| Backend {
                ip: (*ip).into(),
                disabled: false,
            })
            .collect(),
        ports,
    }
}

/// `web` (3 backends; tcp 8080→80, udp 5353→53, sctp 9000→9000 and 9100→9200 on every node
/// address), `empty` (its one backend disabled) and `db` (tcp 7070→5432 on HOST_IP only, tcp
/// and udp LOOPBACK_PORT→5432 on 127.0.0.1).
pub fn network(masquerade: Masquerade) -> Network {
    let mut empty = service("empty", EMPTY_VIP, &[EMPTY_BACKEND], vec![]);
    empty.backends[0].disabled = true;
    Network {
        name: "prog".into(),
        interfaces: vec!["lo".into()],
        netns: None,
        mode: Mode::Nat,
        attach: Attach::Tc,
        masquerade,
        fast_path: Default::default(),
        hold_ports: Default::default(),
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
                    port(Proto::Sctp, 9100, 9200, None),
                ],
            ),
            empty,
            service(
                "db",
                DB_VIP,
                &[DB],
                vec![
                    port(Proto::Tcp, 7070, 5432, Some(HOST_IP)),
                    port(Proto::Tcp, LOOPBACK_PORT, 5432, Some(Ipv4Addr::LOCALHOST)),
                    port(Proto::Udp, LOOPBACK_PORT, 5432, Some(Ipv4Addr::LOCALHOST)),
                ],
            ),
        ],
    }
}

/// [`network`] with `web` dual-stack: [`VIP6`] beside [`VIP`] and [`WEB6`] beside [`WEB`],
/// its ports published on every node address of both families ([`NODE6`] among them).
/// `empty` and `db` stay IPv4 only.
pub fn dual_stack_network(masquerade: Masquerade) -> Network {
    let mut net = network(masquerade);
    let web = &mut net.services[0];
    web.vips.push(VIP6.into());
    web.backends.extend(WEB6.iter().map(|ip| Backend {
        ip: (*ip).into(),
        disabled: false,
    }));
    net
}

/// One run's result as the kernel returned it.
#[derive(Clone, Debug)]
pub struct Run {
    pub verdict: u32,
    /// The bytes the program left, without XDP metadata.
    pub out: Vec<u8>,
    /// The first 4 of the 8 bytes of XDP metadata in front of the frame (the handoff; a
    /// judgment stamp follows), when the program wrote them (XDP writes them only for a
    /// packet it translated, as its handoff to TC).
    pub meta: Option<u32>,
}

/// One private instance of the object (unpinned maps) with its three programs (and their
/// IPv6 twins) loaded.
pub struct Fixture {
    pub dp: EbpfNetwork,
    pub net: Network,
}

impl Fixture {
    pub fn new(masquerade: Masquerade) -> Self {
        Self::with_network(network(masquerade), None)
    }

    /// A fixture for `net`. `hash_key` fixes the flow hash key (otherwise random, as `sync`
    /// gives a new network), so that a seeded run picks the same backends and ports each time.
    pub fn with_network(net: Network, hash_key: Option<u32>) -> Self {
        let mut dp = EbpfNetwork::unpinned().expect("load the object");
        // The three programs and the IPv6 twins they tail-call, as attaching loads them.
        dp.load_ipv6_twins()
            .unwrap_or_else(|e| panic!("verifier accepts the programs: {e:?}"));
        let ebpf = dp.ebpf_mut();
        if let Some(key) = hash_key {
            // `sync` keeps a nonzero key it finds, as it does across restarts.
            assert_ne!(key, 0, "0 means no key yet");
            let mut config: Array<MapData, Config> =
                Array::try_from(Map::Array(program_map(ebpf, "lb_config"))).unwrap();
            let cfg = Config {
                hash_key: key,
                ..Default::default()
            };
            config.set(0, cfg, 0).expect("writing lb_config");
        }
        let mut f = Fixture { dp, net };
        f.sync();
        if let Some(key) = hash_key {
            assert_eq!(f.dp.config().unwrap().hash_key, key, "sync kept the key");
        }
        f
    }

    /// Writes the fixture's network into the maps, as `lb load` does.
    pub fn sync(&mut self) {
        self.sync_walked(None);
    }

    /// [`Fixture::sync`] after the flow collector's walk `walked` (what lets retired counter
    /// ids be handed out again), as the daemon syncs.
    pub fn sync_walked(&mut self, walked: Option<&ebpf::gc::Referenced>) {
        let composed = compose(&self.net);
        let plan = ebpf::plan(&self.net, &composed);
        let mut node = NodeAddrs {
            local: vec![NODE.into(), HOST_IP.into()],
            ifaces: vec![(1, NODE.into())],
            ephemeral: None,
        };
        if (self.net.services.iter()).any(|s| s.families().contains(&Family::V6)) {
            node.local.push(NODE6.into());
            node.ifaces.push((1, NODE6.into()));
        }
        let keep: BTreeSet<std::net::IpAddr> = (self.net.services.iter())
            .flat_map(|s| s.backends.iter().map(|b| b.ip))
            .collect();
        self.dp.sync(&plan, &node, &keep, walked).expect("sync");
    }

    pub fn run(&mut self, prog: Prog, input: &[u8]) -> (u32, Vec<u8>) {
        self.run_ctx(prog, input, None)
    }

    /// Runs `input` once through `prog`, which must pass it; `ingress_ifindex` (TC only) sets
    /// the interface the skb "came in on". Returns the verdict and the bytes the program left.
    pub fn run_ctx(
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

    /// [`Fixture::test_run`], checking XDP's handoff when it is there.
    pub fn try_run(
        &mut self,
        prog: Prog,
        input: &[u8],
        ingress_ifindex: Option<u32>,
    ) -> Result<(u32, Vec<u8>), ProgramError> {
        let run = self.test_run(prog, input, ingress_ifindex)?;
        if let Some(meta) = run.meta {
            assert_eq!(meta, self.handoff(), "XDP's handoff to TC");
        }
        Ok((run.verdict, run.out))
    }

    /// The metadata XDP leaves in a packet it translated: [`XDP_HANDOFF`] under this network's
    /// hash key.
    pub fn handoff(&self) -> u32 {
        XDP_HANDOFF ^ self.dp.config().unwrap().hash_key
    }

    /// Runs `input` once (repeat 1: a repeated run would see its own rewritten output) through
    /// `prog`; `ingress_ifindex` (TC only) sets the interface the skb "came in on".
    pub fn test_run(
        &mut self,
        prog: Prog,
        input: &[u8],
        ingress_ifindex: Option<u32>,
    ) -> Result<Run, ProgramError> {
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
        let res = self.test_run_opts(prog, opts)?;
        out.truncate(res.data_size_out as usize);
        let mut meta = None;
        if prog == Prog::Xdp && out.len() == input.len() + 8 {
            // A test run returns XDP metadata in front of the frame: the handoff, then the
            // judgment stamp of the entry the frame was rewritten by.
            meta = Some(u32::from_ne_bytes(out[..4].try_into().unwrap()));
            out.drain(..8);
        }
        Ok(Run {
            verdict: res.return_value,
            out,
            meta,
        })
    }

    /// BPF_PROG_TEST_RUN of `prog` with `opts`.
    fn test_run_opts(
        &mut self,
        prog: Prog,
        opts: TestRunOptions<'_>,
    ) -> Result<TestRunResult, ProgramError> {
        let ebpf = self.dp.ebpf_mut();
        match prog {
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
        }
    }

    /// Runs `input` once through a TC program as a CHECKSUM_COMPLETE skb
    /// (`BPF_F_TEST_SKB_CHECKSUM_COMPLETE`, kernel 6.11+: the kernel sums the packet into
    /// `skb->csum` before the run and checks it against the packet the program left). The
    /// run's only way to see that state, which a NIC or a veth delivering to a GRO'd path
    /// gives: a rewrite whose helpers get `skb->csum` wrong fails with `EBADMSG`. aya keeps
    /// test-run flags to itself, so this is the syscall.
    pub fn test_run_complete(&mut self, prog: Prog, input: &[u8]) -> std::io::Result<Run> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        const BPF_PROG_TEST_RUN: libc::c_long = 10;
        const BPF_F_TEST_SKB_CHECKSUM_COMPLETE: u32 = 1 << 2;
        /// `union bpf_attr`'s `test` member (include/uapi/linux/bpf.h).
        #[repr(C)]
        #[derive(Default)]
        struct TestAttr {
            prog_fd: u32,
            retval: u32,
            data_size_in: u32,
            data_size_out: u32,
            data_in: u64,
            data_out: u64,
            repeat: u32,
            duration: u32,
            ctx_size_in: u32,
            ctx_size_out: u32,
            ctx_in: u64,
            ctx_out: u64,
            flags: u32,
            cpu: u32,
            batch_size: u32,
            _pad: u32,
        }
        let name = match prog {
            Prog::TcIngress => PROG_TC_INGRESS,
            Prog::TcEgress => PROG_TC_EGRESS,
            Prog::Xdp => panic!("CHECKSUM_COMPLETE is an skb's state; XDP has none"),
        };
        let p: &mut SchedClassifier = (self.dp.ebpf_mut().program_mut(name))
            .unwrap()
            .try_into()
            .unwrap();
        let fd = p.fd().unwrap().as_fd().as_raw_fd();
        let mut out = vec![0u8; input.len() + 256];
        let mut attr = TestAttr {
            prog_fd: fd as u32,
            data_size_in: input.len() as u32,
            data_size_out: out.len() as u32,
            data_in: input.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat: 1,
            flags: BPF_F_TEST_SKB_CHECKSUM_COMPLETE,
            ..Default::default()
        };
        // SAFETY: `attr` points at buffers that outlive the call, sized as it says.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &mut attr as *mut TestAttr,
                size_of::<TestAttr>(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        out.truncate(attr.data_size_out as usize);
        Ok(Run {
            verdict: attr.retval,
            out,
            meta: None,
        })
    }

    pub fn flow(&self, key: &FlowKey) -> Option<Flow> {
        self.dp
            .flow_entries()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| t)
    }

    /// Every entry the programs wrote to `lb_flows` and `lb_frags`.
    pub fn tables(&mut self) -> Tables {
        self.tables_of()
    }

    /// Every entry the IPv6 twins wrote to `lb_flows6` and `lb_frags6`.
    pub fn tables6(&mut self) -> Tables6 {
        self.tables_of()
    }

    /// Every entry of family `A`'s flow and fragment maps.
    pub fn tables_of<A: MapFamily>(&mut self) -> TablesOf<A>
    where
        FlowKeyOf<A>: Pod,
        FlowOf<A>: Pod,
    {
        let mut flows: Vec<_> = (A::flow_map(&mut self.dp).iter())
            .filter_map(|e| e.ok())
            .collect();
        flows.sort_by_key(|(k, _)| (k.saddr, k.daddr, k.sport, k.dport, k.proto));
        let map = self.dp.ebpf_mut().map(A::FRAGS).expect(A::FRAGS);
        let frags: HashMap<&MapData, A::FragKey, FragPorts> = HashMap::try_from(map).unwrap();
        let mut frags: Vec<_> = frags.iter().filter_map(|e| e.ok()).collect();
        frags.sort_by_key(|(k, _)| A::datagram(k));
        TablesOf { flows, frags }
    }

    /// Puts `lb_flows` and `lb_frags` back to `t` (`Tables::default()`: as if every flow had
    /// expired and been collected).
    pub fn restore(&mut self, t: &Tables) {
        self.restore_of(t);
    }

    /// Puts `lb_flows6` and `lb_frags6` back to `t`.
    pub fn restore6(&mut self, t: &Tables6) {
        self.restore_of(t);
    }

    /// Puts family `A`'s flow and fragment maps back to `t`.
    pub fn restore_of<A: MapFamily>(&mut self, t: &TablesOf<A>)
    where
        FlowKeyOf<A>: Pod,
        FlowOf<A>: Pod,
    {
        let now = self.tables_of::<A>();
        let flows = A::flow_map(&mut self.dp);
        for (k, _) in (now.flows.iter()).filter(|(k, _)| !t.flows.iter().any(|e| e.0 == *k)) {
            // An LRU map may drop an entry on its own: absence is what is wanted.
            let _ = flows.remove(k);
        }
        for (k, v) in &t.flows {
            (flows.insert(k, v, 0)).unwrap_or_else(|e| panic!("restoring {}: {e:?}", A::FLOWS));
        }
        let map = self.dp.ebpf_mut().map_mut(A::FRAGS).expect(A::FRAGS);
        let mut frags: HashMap<&mut MapData, A::FragKey, FragPorts> =
            HashMap::try_from(map).unwrap();
        for (k, _) in (now.frags.iter()).filter(|(k, _)| !t.frags.iter().any(|e| e.0 == *k)) {
            let _ = frags.remove(k);
        }
        for (k, v) in &t.frags {
            (frags.insert(k, v, 0)).unwrap_or_else(|e| panic!("restoring {}: {e:?}", A::FRAGS));
        }
    }

    /// The entry of `key` in family `A`'s flow map, expired or not (one lookup, where
    /// [`Fixture::tables_of`] reads them all).
    pub fn flow_of<A: MapFamily>(&mut self, key: &FlowKeyOf<A>) -> Option<FlowOf<A>>
    where
        FlowKeyOf<A>: Pod,
        FlowOf<A>: Pod,
    {
        A::flow_map(&mut self.dp).get(key, 0).ok()
    }

    /// The record of `key` in family `A`'s fragment map.
    pub fn frag_of<A: MapFamily>(&mut self, key: &A::FragKey) -> Option<FragPorts> {
        let map = self.dp.ebpf_mut().map(A::FRAGS).expect(A::FRAGS);
        let frags: HashMap<&MapData, A::FragKey, FragPorts> = HashMap::try_from(map).unwrap();
        frags.get(key, 0).ok()
    }

    /// `lb_reasons`, opened a second time (the `EbpfNetwork` keeps its handle to itself) to
    /// read single slots: slot `hook * REASONS + reason` (lb-ebpf `maps::REASON_COUNTS`).
    pub fn reason_slots(&mut self) -> PerCpuArray<MapData, u64> {
        PerCpuArray::try_from(Map::PerCpuArray(program_map(
            self.dp.ebpf_mut(),
            "lb_reasons",
        )))
        .unwrap()
    }
}

/// A flow key as the programs build it from `p` (addresses and ports in network order).
pub fn key(p: &Ipv4Packet) -> FlowKey {
    FlowKey {
        saddr: be4(p.saddr),
        daddr: be4(p.daddr),
        sport: p.sport.to_be(),
        dport: p.dport.to_be(),
        proto: p.proto,
        _pad: [0; 3],
    }
}

/// [`key`] of an IPv6 packet.
pub fn key6(p: &Ipv6Packet) -> FlowKey6 {
    FlowKey6 {
        saddr: ebpf::be6(p.saddr),
        daddr: ebpf::be6(p.daddr),
        sport: p.sport.to_be(),
        dport: p.dport.to_be(),
        proto: p.proto,
        _pad: [0; 3],
    }
}

/// Runs `input` through `prog`, which must pass it byte-identical.
pub fn expect_untouched(f: &mut Fixture, prog: Prog, input: &[u8]) {
    let (_, out) = f.run(prog, input);
    assert_eq!(out, input, "{prog:?} must pass this byte-identical");
}

/// `count` of `reason` on program `hook` (as `lb_datapath_packets_total` names them).
pub fn reason_count(f: &Fixture, hook: &str, reason: Reason) -> u64 {
    f.dp.reasons()
        .unwrap()
        .into_iter()
        .find(|(h, r, _)| *h == hook && *r == reason)
        .map_or(0, |(_, _, n)| n)
}

/// Runs `input` once through `prog` and returns what it left (`None` when the kernel refused
/// the frame, see [`refused_by_test_run`]) with every reason the run counted on `prog`'s hook.
pub fn run_counted(
    f: &mut Fixture,
    prog: Prog,
    input: &[u8],
) -> (Option<(u32, Vec<u8>)>, Vec<Reason>) {
    let before = f.dp.reasons().unwrap();
    let run = f.try_run(prog, input, None);
    if run.is_err() {
        assert!(
            refused_by_test_run(prog, input),
            "{prog:?} on {} bytes: {run:?}",
            input.len()
        );
    }
    let after = f.dp.reasons().unwrap();
    let counted = before
        .iter()
        .zip(&after)
        .filter(|((h, _, a), (_, _, b))| *h == prog.hook() && b > a)
        .map(|(_, (_, r, _))| *r)
        .collect();
    (run.ok(), counted)
}

/// The largest frame an skb test run is sure to take: a 4 KiB page less the skb's headroom
/// (`NET_SKB_PAD`) and, generously, its `skb_shared_info`.
pub const SKB_RUN_MAX: usize = 4096 - 64 - 448;

/// Whether BPF_PROG_TEST_RUN may refuse to run `prog` on `frame` at all (an error rather than
/// a verdict): an XDP run needs an Ethernet header; an skb run needs one too, for an IPv4 or
/// IPv6 ethertype also that protocol's fixed header (20 or 40 bytes, which the kernel reads to
/// set up the run's socket), and all of it in one page with the skb's headroom and shared info
/// (3,712 bytes on this x86-64 kernel; [`SKB_RUN_MAX`] leaves room for other configurations).
/// XDP (frags-aware) takes frames of any IPv4 size.
pub fn refused_by_test_run(prog: Prog, frame: &[u8]) -> bool {
    const ETH_HLEN: usize = 14;
    if frame.len() < ETH_HLEN || (prog != Prog::Xdp && frame.len() > SKB_RUN_MAX) {
        return true;
    }
    let l3 = match (prog, [frame[12], frame[13]]) {
        (Prog::Xdp, _) => 0,
        (_, [0x08, 0x00]) => 20,
        (_, [0x86, 0xdd]) => 40,
        _ => 0,
    };
    frame.len() < ETH_HLEN + l3
}

/// A map the loaded XDP program uses, by name, for one the `EbpfNetwork` keeps to itself.
fn program_map(ebpf: &Ebpf, name: &str) -> MapData {
    let xdp: &Xdp = ebpf.program(PROG_XDP).unwrap().try_into().unwrap();
    let ids = xdp
        .info()
        .expect("lb_xdp's info")
        .map_ids()
        .expect("lb_xdp's map ids")
        .expect("the kernel lists a program's maps");
    ids.into_iter()
        .map(|id| MapData::from_id(id).expect("open a map of lb_xdp by id"))
        .find(|m| m.info().is_ok_and(|i| i.name_as_str() == Some(name)))
        .unwrap_or_else(|| panic!("lb_xdp uses no map {name}"))
}

/// What the programs write besides counters, of one family: every entry of its flow map and
/// its fragment map, in a stable order so that two reads compare equal when nothing changed.
/// Empty (`default()`): as if every flow had expired and been collected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TablesOf<A: MapFamily> {
    pub flows: Vec<(FlowKeyOf<A>, FlowOf<A>)>,
    pub frags: Vec<(A::FragKey, FragPorts)>,
}

/// `lb_flows` and `lb_frags`.
pub type Tables = TablesOf<u32>;
/// `lb_flows6` and `lb_frags6`.
pub type Tables6 = TablesOf<Addr6>;

impl<A: MapFamily> TablesOf<A> {
    /// What `after` holds that these tables do not (new or changed entries), readably, and
    /// how many of their entries it no longer holds.
    pub fn diff(&self, after: &Self) -> String {
        let at = |a: A, port: u16| SocketAddr::new(a.ip(), u16::from_be(port));
        let flows = (after.flows.iter())
            .filter(|e| !self.flows.contains(e))
            .map(|(k, v)| {
                format!(
                    "flow proto {} {} -> {} => {} -> {} flags {:#x}",
                    k.proto,
                    at(k.saddr, k.sport),
                    at(k.daddr, k.dport),
                    at(v.saddr, v.sport),
                    at(v.daddr, v.dport),
                    v.flags
                )
            });
        let frags = (after.frags.iter())
            .filter(|e| !self.frags.contains(e))
            .map(|(k, v)| {
                let (saddr, daddr, id, proto) = A::datagram(k);
                format!(
                    "fragment record proto {proto} {} -> {} id {id} => ports {} -> {}",
                    saddr.ip(),
                    daddr.ip(),
                    u16::from_be(v.sport),
                    u16::from_be(v.dport)
                )
            });
        let gone = (self.flows.iter())
            .filter(|(k, _)| !after.flows.iter().any(|e| e.0 == *k))
            .count()
            + (self.frags.iter())
                .filter(|(k, _)| !after.frags.iter().any(|e| e.0 == *k))
                .count();
        let mut all: Vec<String> = flows.chain(frags).collect();
        if gone > 0 {
            all.push(format!("{gone} entries gone"));
        }
        all.join("; ")
    }
}

/// A family's flow and fragment maps, as the fixture reads and restores them: its map address
/// type (`u32`, [`Addr6`]), over which `lb_common`'s flow layouts are generic; its fragment
/// records differ beyond the address (IPv6's identification is 32 bits).
pub trait MapFamily: MapIp + Ord {
    /// `FragKey` or `FragKey6`.
    type FragKey: Pod + Copy + Default + fmt::Debug + Eq;
    /// The names of the flow and fragment maps.
    const FLOWS: &'static str;
    const FRAGS: &'static str;
    fn flow_map(dp: &mut EbpfNetwork) -> &mut HashMap<MapData, FlowKeyOf<Self>, FlowOf<Self>>;
    /// The datagram a fragment record is for: source, destination, identification, protocol.
    fn datagram(k: &Self::FragKey) -> (Self, Self, u32, u8);
    /// The record key of that datagram ([`MapFamily::datagram`]'s inverse; IPv4 keeps 16 bits
    /// of the identification).
    fn frag_key(saddr: Self, daddr: Self, id: u32, proto: u8) -> Self::FragKey;
}

impl MapFamily for u32 {
    type FragKey = FragKey;
    const FLOWS: &'static str = "lb_flows";
    const FRAGS: &'static str = "lb_frags";
    fn flow_map(dp: &mut EbpfNetwork) -> &mut HashMap<MapData, FlowKey, Flow> {
        dp.flows_mut()
    }
    fn datagram(k: &FragKey) -> (u32, u32, u32, u8) {
        (k.saddr, k.daddr, k.id.into(), k.proto)
    }
    fn frag_key(saddr: u32, daddr: u32, id: u32, proto: u8) -> FragKey {
        FragKey::new(saddr, daddr, id, proto)
    }
}

impl MapFamily for Addr6 {
    type FragKey = FragKey6;
    const FLOWS: &'static str = "lb_flows6";
    const FRAGS: &'static str = "lb_frags6";
    fn flow_map(dp: &mut EbpfNetwork) -> &mut HashMap<MapData, FlowKey6, Flow6> {
        dp.flows6_mut()
    }
    fn datagram(k: &FragKey6) -> (Addr6, Addr6, u32, u8) {
        (k.saddr, k.daddr, k.id, k.proto)
    }
    fn frag_key(saddr: Addr6, daddr: Addr6, id: u32, proto: u8) -> FragKey6 {
        FragKey6::new(saddr, daddr, id, proto)
    }
}

/// Each program's outcome counters ([`crate::fuzz::is_outcome`]), read slot by slot: a lookup
/// per outcome of one hook, where `EbpfNetwork::reasons` makes one per reason of every hook,
/// cheap enough to tell what each single run counted.
pub struct Outcomes {
    slots: PerCpuArray<MapData, u64>,
    last: [Vec<u64>; 3],
}

impl Outcomes {
    pub fn new(f: &mut Fixture) -> Self {
        let mut o = Outcomes {
            slots: f.reason_slots(),
            last: Default::default(),
        };
        for prog in Prog::ALL {
            o.last[prog as usize] = o.read(prog);
        }
        o
    }

    fn read(&self, prog: Prog) -> Vec<u64> {
        (crate::fuzz::outcomes().into_iter())
            .map(|r| {
                let slot = prog as u32 * lb_common::REASONS + r as u32;
                self.slots.get(&slot, 0).unwrap().iter().sum()
            })
            .collect()
    }

    /// The outcomes `prog` counted since this was last asked (or since `new`), each with how
    /// many times.
    pub fn moved(&mut self, prog: Prog) -> Vec<(Reason, u64)> {
        let now = self.read(prog);
        let before = std::mem::replace(&mut self.last[prog as usize], now);
        (crate::fuzz::outcomes().into_iter())
            .zip(before.iter().zip(&self.last[prog as usize]))
            .map(|(r, (b, a))| (r, a - b))
            .filter(|(_, d)| *d > 0)
            .collect()
    }
}

/// How a run ended, as the fuzz tiers' checks read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The kernel refused the frame for its length ([`refused_by_test_run`]).
    Refused,
    Passed,
    Translated,
    Dropped,
}

impl Outcome {
    /// What `run` of `prog` ended as by its verdict (XDP passes what it translated, with its
    /// handoff to TC in the metadata); `None` for a verdict `prog` may not give.
    pub fn of(prog: Prog, run: &Run) -> Option<Outcome> {
        Some(match (prog, run.verdict) {
            (Prog::Xdp, XDP_PASS) if run.meta.is_some() => Outcome::Translated,
            (Prog::Xdp, XDP_PASS) => Outcome::Passed,
            (Prog::Xdp, XDP_DROP) => Outcome::Dropped,
            (Prog::TcIngress | Prog::TcEgress, TC_ACT_UNSPEC) => Outcome::Passed,
            (Prog::TcIngress | Prog::TcEgress, TC_ACT_OK) => Outcome::Translated,
            (Prog::TcIngress | Prog::TcEgress, TC_ACT_SHOT) => Outcome::Dropped,
            _ => return None,
        })
    }
}
