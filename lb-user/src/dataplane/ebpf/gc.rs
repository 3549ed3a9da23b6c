//! Reading the flow table: what each entry is, what `lb conntrack` shows, and the collector
//! that deletes expired entries.
//!
//! The programs already treat an expired entry as absent (`lb_common::flow`); the collector
//! only gives the memory back and keeps the counts `lb status` and the metrics read, so the
//! writer never walks the table for them. It also notes the counter ids the entries it read
//! name ([`Referenced`]): a counter id retired from a removed backend is handed out again
//! only once a walk that started after its retirement found no entry naming it, so that the
//! removed backend's draining flows never count to the backend that takes the id next. It runs on a thread of its own, with its own map
//! handles opened from the pins, and touches nothing but `lb_flows` entries that are expired
//! and DSR sessions that ended (`dsr::collect`).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::{HashMap, Map, MapData};
use lb_common::{
    FLOW_MASQ, FLOW_REPLY, FlowKeyOf, FlowOf,
    flow::{NS_PER_SEC, expired},
};

use super::MapIp;
use crate::core::model::Proto;
use crate::dataplane::{FlowState, FlowStats};

/// Which of a flow's entries one is (see `lb_common::flow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// client → service, ingress: the flow's own record in `lb conntrack`.
    Forward,
    /// backend → client, egress.
    Reply,
    /// client → backend rewritten to the masquerade source, egress.
    MasqForward,
    /// backend → masquerade address, ingress: the port claim.
    MasqReply,
}

pub fn entry_kind<A>(e: &FlowOf<A>) -> Entry {
    match (e.flags & FLOW_MASQ != 0, e.flags & FLOW_REPLY != 0) {
        (false, false) => Entry::Forward,
        (false, true) => Entry::Reply,
        (true, false) => Entry::MasqForward,
        (true, true) => Entry::MasqReply,
    }
}

/// The backend an entry is about, whichever kind it is.
pub fn backend_of<A: Copy>(k: &FlowKeyOf<A>, e: &FlowOf<A>) -> A {
    match entry_kind(e) {
        Entry::Forward => e.daddr,
        Entry::Reply | Entry::MasqReply => k.saddr,
        Entry::MasqForward => k.daddr,
    }
}

/// A flow's state as `lb conntrack` and the metrics name it.
pub fn flow_state<A>(k: &FlowKeyOf<A>, e: &FlowOf<A>) -> FlowState {
    if k.proto == lb_common::IPPROTO_TCP && e.closing_orig != 0 && e.closing_reply != 0 {
        FlowState::Closing
    } else if e.replied != 0 {
        FlowState::Established
    } else {
        FlowState::Opening
    }
}

/// CLOCK_MONOTONIC, the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The live flows among `entries`, as `lb conntrack` lists them (one per flow: its forward
/// entry), sorted by service and client.
pub fn live_flows<A: MapIp>(
    entries: &[(FlowKeyOf<A>, FlowOf<A>)],
    now: u64,
) -> Vec<crate::dataplane::Flow> {
    let mut flows: Vec<_> = entries
        .iter()
        .filter(|(_, e)| entry_kind(e) == Entry::Forward && !expired(e, now))
        // The programs open flows of the protocols ports are published for, and no other.
        .filter_map(|(k, e)| Some((k, e, Proto::from_number(k.proto)?)))
        .map(|(k, e, proto)| crate::dataplane::Flow {
            proto,
            client: SocketAddr::new(k.saddr.ip(), u16::from_be(k.sport)),
            frontend: SocketAddr::new(k.daddr.ip(), u16::from_be(k.dport)),
            service: None,
            backend: SocketAddr::new(e.daddr.ip(), u16::from_be(e.dport)),
            state: flow_state(k, e),
            expires_secs: Some(e.expires_ns.saturating_sub(now).div_ceil(NS_PER_SEC)),
            idle_secs: None,
        })
        .collect();
    flows.sort_by(|a, b| (&a.frontend, &a.client).cmp(&(&b.frontend, &b.client)));
    flows
}

/// Deletes the expired entries of one flow map and counts what is left (`expired_total`: what
/// this pass deleted). The table is read
/// first and deleted from after: deleting while iterating would restart the iteration (a
/// deleted key has no next). An entry the programs refreshed or re-created between the read
/// and its delete is re-read and kept; one re-created in the instant between that re-read and
/// the delete is lost, and its flow is re-created by its next packet (`lb_common::flow`).
pub fn collect<A: MapIp>(
    flows: &mut HashMap<MapData, FlowKeyOf<A>, FlowOf<A>>,
    now: u64,
    ids: &mut BTreeSet<u32>,
) -> FlowStats
where
    FlowKeyOf<A>: aya::Pod,
    FlowOf<A>: aya::Pod,
{
    let entries: Vec<(FlowKeyOf<A>, FlowOf<A>)> = flows.iter().filter_map(|e| e.ok()).collect();
    // Expired ones too: until deleted below, a program could still refresh one.
    ids.extend(entries.iter().map(|(_, e)| e.counter));
    let mut stats = FlowStats {
        entries: Some(entries.len() as u64),
        ..Default::default()
    };
    let mut deleted = 0;
    for (k, e) in &entries {
        if !expired(e, now) {
            if entry_kind(e) == Entry::Forward {
                stats.by_state[flow_state(k, e).index()] += 1;
            }
            continue;
        }
        if flows.get(k, 0).is_ok_and(|again| expired(&again, now)) && flows.remove(k).is_ok() {
            deleted += 1;
        }
    }
    stats.expired_total = Some(deleted);
    stats
}

/// The collector's latest findings per network (by pin directory name).
pub type Shared = Arc<Mutex<BTreeMap<String, FlowStats>>>;

/// The counter ids the entries of one network's flow and DSR session tables named, in a
/// walk that started at `since`: an id retired before `since` and not among them is named by
/// no entry any more.
#[derive(Clone, Debug)]
pub struct Referenced {
    pub since: Instant,
    pub ids: BTreeSet<u32>,
}

/// The latest walk of each network (by pin directory name).
pub type Walks = Arc<Mutex<BTreeMap<String, Referenced>>>;

/// A running collector: its findings, and a way to make it run now (after an apply, so that a
/// new network is counted without waiting a whole interval).
pub struct Collector {
    pub stats: Shared,
    pub referenced: Walks,
    kick: mpsc::Sender<()>,
}

impl Collector {
    pub fn kick(&self) {
        let _ = self.kick.send(());
    }

    /// The latest walk of network `name`'s tables.
    pub fn walked(&self, name: &str) -> Option<Referenced> {
        (self.referenced.lock().expect("collector lock"))
            .get(name)
            .cloned()
    }
}

/// Starts the collector: every `interval` (or when kicked), every network directory under
/// `bpffs` with a flow map is collected. It finds networks by their pins, so it needs no word
/// from the writer about networks coming and going; it stops with the process.
pub fn spawn(bpffs: &Path, interval: Duration) -> Result<Collector> {
    let stats: Shared = Arc::default();
    let referenced: Walks = Arc::default();
    let (dir, out, walks) = (bpffs.to_path_buf(), stats.clone(), referenced.clone());
    let (kick, kicks) = mpsc::channel();
    std::thread::Builder::new()
        .name("lb-gc".into())
        .spawn(move || {
            loop {
                run_once(&dir, &out, &walks);
                match kicks.recv_timeout(interval) {
                    Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
                // Kicks that came meanwhile are served by this run.
                while kicks.try_recv().is_ok() {}
            }
        })
        .context("starting the flow collector")?;
    Ok(Collector {
        stats,
        referenced,
        kick,
    })
}

/// The DSR sessions of both families of the network pinned in `dir`: how many are live, and
/// how many ended ones were deleted; the counter ids they name go to `ids`.
fn collect_dsr(dir: &Path, now: u64, ids: &mut BTreeSet<u32>) -> Result<(u64, u64)> {
    let (live, deleted) = collect_dsr_pinned::<u32>(dir, "lb_dsr_sessions", "lb_vips", now, ids)?;
    let (live6, deleted6) =
        collect_dsr_pinned::<lb_common::Addr6>(dir, "lb_dsr_sessions6", "lb_vips6", now, ids)?;
    Ok((live + live6, deleted + deleted6))
}

/// The DSR sessions pinned as `sessions` in `dir`, of the VIPs pinned as `vips` (a network
/// pinned by an lb without DSR, or without IPv6 DSR, has no such map until it loads).
fn collect_dsr_pinned<A: MapIp>(
    dir: &Path,
    sessions: &str,
    vips: &str,
    now: u64,
    ids: &mut BTreeSet<u32>,
) -> Result<(u64, u64)>
where
    FlowKeyOf<A>: aya::Pod,
    lb_common::DsrSessionOf<A>: aya::Pod,
    lb_common::VipKeyOf<A>: aya::Pod,
{
    let (pin, vips) = (dir.join(sessions), dir.join(vips));
    if !pin.exists() || !vips.exists() {
        return Ok((0, 0));
    }
    let mut sessions = HashMap::try_from(Map::LruHashMap(MapData::from_pin(&pin)?))?;
    let vips = HashMap::try_from(Map::HashMap(MapData::from_pin(&vips)?))?;
    Ok(super::dsr::collect::<A>(&mut sessions, &vips, now, ids))
}

/// [`collect`] of the flow map pinned as `name` in `dir`.
fn collect_pinned<A: MapIp>(
    dir: &Path,
    name: &str,
    now: u64,
    ids: &mut BTreeSet<u32>,
) -> Result<FlowStats>
where
    FlowKeyOf<A>: aya::Pod,
    FlowOf<A>: aya::Pod,
{
    let pin: PathBuf = dir.join(name);
    let map = MapData::from_pin(&pin).with_context(|| format!("opening {}", pin.display()))?;
    let mut map = HashMap::<_, FlowKeyOf<A>, FlowOf<A>>::try_from(Map::LruHashMap(map))?;
    Ok(collect(&mut map, now, ids))
}

fn run_once(bpffs: &Path, out: &Shared, walks: &Walks) {
    let Ok(dirs) = std::fs::read_dir(bpffs) else {
        return;
    };
    let mut seen = Vec::new();
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        // A network refused for its layouts is left as it is, entries included.
        if !d.path().join("lb_flows").exists() || !super::layouts_compatible(&d.path()) {
            continue;
        }
        let now = monotonic_ns();
        let since = Instant::now();
        let mut ids = BTreeSet::new();
        let mut stats = match collect_pinned::<u32>(&d.path(), "lb_flows", now, &mut ids) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(network = %name, error = %format!("{e:#}"), "flow collector: lb_flows");
                continue;
            }
        };
        // A network pinned by an lb before dual stack has no IPv6 flow map until it loads.
        if d.path().join("lb_flows6").exists() {
            match collect_pinned::<lb_common::Addr6>(&d.path(), "lb_flows6", now, &mut ids) {
                Ok(s6) => stats.add(&s6),
                Err(e) => {
                    tracing::warn!(network = %name, error = %format!("{e:#}"), "flow collector: lb_flows6")
                }
            }
        }
        let mut complete = true;
        match collect_dsr(&d.path(), now, &mut ids) {
            Ok((live, deleted)) => {
                stats.by_state[FlowState::Dsr.index()] = live;
                stats.expired_total = stats.expired_total.map(|n| n + deleted);
            }
            Err(e) => {
                complete = false;
                tracing::warn!(network = %name, error = %format!("{e:#}"), "flow collector: DSR sessions")
            }
        }
        // Only a walk that read every table can say an id is named by nothing.
        if complete {
            (walks.lock().expect("collector lock")).insert(name.clone(), Referenced { since, ids });
        }
        let mut all = out.lock().expect("collector stats lock");
        let before = all.get(&name).and_then(|s| s.expired_total).unwrap_or(0);
        stats.expired_total = stats.expired_total.map(|n| n + before);
        all.insert(name.clone(), stats);
        seen.push(name);
    }
    out.lock()
        .expect("collector stats lock")
        .retain(|n, _| seen.contains(n));
}
