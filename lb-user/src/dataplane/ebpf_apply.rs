//! The eBPF dataplane behind [`Dataplane`]: one loaded object per network, kept open between
//! applies (so a change costs map writes, not a program load), pinned so that a restarted
//! daemon adopts it.
//!
//! Order per network, as in the seed: VIP aliases are added before the maps point at them and
//! removed only after the maps no longer do, so a VIP is never routed to without its address.
//! Only aliases this dataplane added are ever removed (the VIPs of the previously applied
//! network): an operator's own /32 on the interface is not ours to take.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use lb_common::{FLOW_EGRESS, FLOW_MASQ, FLOW_REPLY};

use super::{
    Count, Dataplane, Flow,
    ebpf::{self, EbpfNetwork, NodeAddrs, ServiceKey, SyncStats, TcMode, ip},
};
use crate::{
    compose::{PortKey, compose},
    elements::SetKey,
    model::{Network, Proto},
    netlink::{Netlink, in_netns},
};

pub struct EbpfDataplane {
    bpffs: PathBuf,
    tc_mode: TcMode,
    nets: BTreeMap<String, EbpfNetwork>,
}

impl EbpfDataplane {
    /// A dataplane pinning under `bpffs` (mounted if it lies under an unmounted /sys/fs/bpf).
    pub fn new(bpffs: &Path, tc_mode: TcMode) -> Result<Self> {
        ebpf::ensure_bpffs(bpffs)?;
        Ok(Self {
            bpffs: bpffs.to_path_buf(),
            tc_mode,
            nets: BTreeMap::new(),
        })
    }

    pub fn tc_mode(&self) -> TcMode {
        self.tc_mode
    }

    fn open(&mut self, name: &str) -> Result<EbpfNetwork> {
        match self.nets.remove(name) {
            Some(dp) => Ok(dp),
            None => {
                let dir = ebpf::pin_dir(&self.bpffs, name);
                EbpfNetwork::open(&dir).with_context(|| format!("network {name}: opening its maps"))
            }
        }
    }

    fn net(&mut self, name: &str) -> Result<&mut EbpfNetwork> {
        if !self.nets.contains_key(name) {
            let dp = self.open(name)?;
            self.nets.insert(name.to_owned(), dp);
        }
        Ok(self.nets.get_mut(name).expect("inserted above"))
    }
}

/// Whether two versions of a network can be applied one over the other, or the old one must
/// be removed first (its hooks are on other interfaces, in another namespace, or of a kind the
/// new one does not use).
fn same_shape(a: &Network, b: &Network) -> bool {
    a.interfaces == b.interfaces && a.netns == b.netns && a.attach == b.attach && a.mode == b.mode
}

/// Everything of one apply that must run inside the network's namespace.
fn apply_in_netns(
    dp: &mut EbpfNetwork,
    network: &Network,
    previous_vips: &BTreeSet<Ipv4Addr>,
    tc_mode: TcMode,
) -> Result<SyncStats> {
    let nl = Netlink::new()?;
    let mut ifaces = Vec::new();
    for name in &network.interfaces {
        let index = nl.ifindex(name)?;
        // A masqueraded flow leaving by this interface takes its primary address.
        if let Some((addr, _)) = nl.ipv4_addrs(name)?.first() {
            ifaces.push((index, *addr));
        }
        dp.attach(name, network.attach, tc_mode)
            .with_context(|| format!("attaching to {name}"))?;
    }
    let composed = compose(network);
    let plan = ebpf::plan(network, &composed);
    let alias_if = &network.interfaces[0];
    let want = network.vips();
    nl.add_aliases(alias_if, &want)?;
    // The node's own addresses, without the VIP aliases: a VIP is matched on every port by
    // its own map, and thousands of aliases would not fit the local-address map.
    let node = NodeAddrs {
        local: (nl.all_local_ipv4()?.into_iter())
            .filter(|a| !want.contains(a) && !previous_vips.contains(a))
            .collect(),
        ifaces,
    };
    let keep: BTreeSet<Ipv4Addr> = network
        .services
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.ip))
        .collect();
    let stats = dp.sync(&plan, &node, &keep).context("writing maps")?;
    nl.remove_aliases(
        alias_if,
        &previous_vips.difference(&want).copied().collect(),
    )?;
    Ok(stats)
}

impl Dataplane for EbpfDataplane {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn apply(&mut self, network: &Network, previous: Option<&Network>) -> Result<SyncStats> {
        let mut previous_vips = previous.map(Network::vips).unwrap_or_default();
        if let Some(prev) = previous
            && !same_shape(prev, network)
        {
            self.remove(prev)?;
            previous_vips.clear();
        }
        let mut dp = self.open(&network.name)?;
        let net = network.clone();
        let tc_mode = self.tc_mode;
        // The object travels into the namespace's thread and back; if the thread cannot join
        // the namespace it is dropped, and the next apply adopts the pins again.
        let (dp, result) = in_netns(network.netns.as_deref(), move || {
            let r = apply_in_netns(&mut dp, &net, &previous_vips, tc_mode);
            Ok((dp, r))
        })
        .with_context(|| format!("network {}", network.name))?;
        self.nets.insert(network.name.clone(), dp);
        let stats = result.with_context(|| format!("network {}", network.name))?;
        tracing::info!(network = %network.name, written = stats.written, deleted = stats.deleted,
            flushed = stats.flows_flushed, "network applied");
        Ok(stats)
    }

    fn remove(&mut self, network: &Network) -> Result<()> {
        // Our handles go first: the pins are then the only references, and removing them
        // frees the maps and detaches TCX/XDP links.
        self.nets.remove(&network.name);
        let dir = ebpf::pin_dir(&self.bpffs, &network.name);
        let net = network.clone();
        let tc_mode = self.tc_mode;
        in_netns(network.netns.as_deref(), move || {
            ebpf::detach_all(&dir, &net.interfaces, tc_mode)?;
            Netlink::new()?.remove_aliases(&net.interfaces[0], &net.vips())
        })
        .with_context(|| format!("network {}: removing", network.name))?;
        tracing::info!(network = %network.name, "network removed");
        Ok(())
    }

    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        let entries = match std::fs::read_dir(&self.bpffs) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
            Err(e) => return Err(e).with_context(|| format!("listing {}", self.bpffs.display())),
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", self.bpffs.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.path().is_dir() || keep.contains(&name.as_str()) {
                continue;
            }
            self.nets.remove(&name);
            // Unknown interfaces: TCX and XDP links go with their pins.
            ebpf::detach_all(&entry.path(), &[], self.tc_mode)?;
            tracing::info!(network = %name, "removed pins of a network that is no longer configured");
            removed.push(name);
        }
        Ok(removed)
    }

    fn flows(&mut self, network: &Network) -> Result<Vec<Flow>> {
        let now = monotonic_ns();
        let dp = self.net(&network.name)?;
        let mut flows: Vec<Flow> = dp
            .flows()
            .into_iter()
            // The client → service entry of each flow (not its reply, masquerade or claim).
            .filter(|(_, t)| t.flags & (FLOW_EGRESS | FLOW_REPLY | FLOW_MASQ) == 0)
            .map(|(k, t)| Flow {
                proto: proto_name(k.proto),
                client: format!("{}:{}", ip(k.saddr), u16::from_be(k.sport)),
                service: format!("{}:{}", ip(k.daddr), u16::from_be(k.dport)),
                backend: format!("{}:{}", ip(t.daddr), u16::from_be(t.dport)),
                age_secs: Some(now.saturating_sub(t.last_seen_ns) / 1_000_000_000),
            })
            .collect();
        flows.sort_by(|a, b| (&a.service, &a.client).cmp(&(&b.service, &b.client)));
        Ok(flows)
    }

    fn counts(&mut self, network: &Network) -> Result<Vec<Count>> {
        let dp = self.net(&network.name)?;
        let mut out = Vec::new();
        for (key, (svc, backends)) in dp.current_services()? {
            let service = service_label(&key);
            let c = dp.counter(svc.counter)?;
            out.push(Count {
                service: service.clone(),
                backend: None,
                packets: c.packets,
                bytes: c.bytes,
            });
            for b in backends {
                let c = dp.counter(b.counter)?;
                out.push(Count {
                    service: service.clone(),
                    backend: Some(ip(b.addr)),
                    packets: c.packets,
                    bytes: c.bytes,
                });
            }
        }
        Ok(out)
    }
}

/// `tcp`, `udp`, `sctp`, or the number of a protocol lb does not publish.
fn proto_name(proto: u8) -> String {
    Proto::from_number(proto).map_or_else(|| proto.to_string(), |p| p.to_string())
}

/// The composed set a service entry holds, as [`SetKey`]'s `Display` names it for every
/// dataplane. lb writes only protocols it publishes; anything else is shown raw.
fn service_label(key: &ServiceKey) -> String {
    let set = match *key {
        ServiceKey::Vip(a) => Some(SetKey::Vip(ip(a))),
        ServiceKey::Port { addr, port, proto } => Proto::from_number(proto).map(|proto| {
            SetKey::Port(PortKey {
                host_ip: (addr != 0).then(|| ip(addr)),
                proto,
                port: u16::from_be(port),
            })
        }),
    };
    set.map_or_else(|| format!("{key:?}"), |s| s.to_string())
}

/// CLOCK_MONOTONIC, the clock `bpf_ktime_get_ns` reads.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
