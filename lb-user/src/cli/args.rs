//! The `lb` command line: DESIGN.md's CLI, in the style of `ip`, `nft` and `docker`: every
//! command and flag described, the allowed values listed, each option on the commands it
//! acts on.
//!
//! One file because clap derives the command line as one tree: every command's flags, their
//! help and their allowed values, in the order `lb --help` and the man pages show them (the
//! options shared between commands are in `options.rs`).
use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use super::options::{Before, ClusterArgs, Global, JsonArg, SocketArg};
use lb_user::{
    core::{
        model::{Attach, DEFAULT_GENERATION, FastPath, HoldPorts, Masquerade, Mode},
        validate,
    },
    daemon::{self, DataplaneChoice},
    dataplane::ebpf::{DEFAULT_BPFFS, MapSizes, OnIncompatible, TcMode},
    oneshot,
};

/// Exit codes, as docs/operating.md's "Using the CLI" lists them.
pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NOT_APPLIED: i32 = 3;
pub const EXIT_UNREACHABLE: i32 = 4;
pub const EXIT_NO_ANSWER: i32 = 5;

#[derive(Parser)]
#[command(
    name = "lb",
    version,
    about = "eBPF/XDP service load balancer for container nodes",
    long_about = "eBPF/XDP service load balancer for container nodes.\n\n\
        `lb daemon` owns the desired state and programs every network's dataplane; the other \
        commands are its clients over the API socket (or, for `load`/`unload`/`elements \
        -f`, work without it).",
    after_help = "Exit codes: 0 done (applied); 1 refused, nothing changed; 2 usage; \
        3 accepted but not applied yet (retrying, or --wait timed out); \
        4 the daemon is unreachable or not permitted; 5 the daemon went away before it \
        answered a change (which may have been saved: `lb status` and `lb state` say)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    #[command(flatten)]
    pub before: Before,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TcChoice {
    /// TCX links where the kernel has them (6.6+), netlink clsact otherwise.
    Auto,
    /// TCX links (kernel 6.6+), pinned: replaced in place on upgrade.
    Tcx,
    /// clsact qdisc filters over netlink (any kernel).
    Netlink,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DataplaneArg {
    /// eBPF where the kernel loads and verifies the programs, else nftables.
    Auto,
    /// The TC/XDP programs; the daemon fails if the kernel cannot run them.
    Ebpf,
    /// The equivalent nftables ruleset (one table per network).
    Nftables,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the daemon: owns the desired state and every network's dataplane.
    Daemon {
        /// Where the desired state is kept (state.redb, each change saved before it is
        /// applied; a state.json there from an earlier lb is migrated on first start).
        #[arg(long, default_value = daemon::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// Build a new store from a state exported by `lb state` (the JSON `lb apply -f`
        /// takes) and start with it; the store it replaces is kept beside it as
        /// state.redb.before-import. The way back from a store that cannot be read.
        #[arg(long, value_name = "FILE")]
        import: Option<PathBuf>,
        /// Maps and links are pinned here, one directory per network, so a restarted daemon
        /// adopts them without dropping a flow.
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        /// Which dataplane programs the networks: `auto` probes the kernel and falls back to
        /// nftables (LB_PROBE_FAIL=REASON forces the fallback; on nftables,
        /// LB_NFT_DSR_FAIL=REASON serves dsr networks' VIPs by NAT, as a kernel without the
        /// netdev egress hook does).
        #[arg(long, value_enum, default_value = "auto")]
        dataplane: DataplaneArg,
        /// Serve Prometheus metrics on http://ADDR/metrics (off unless given): an address or
        /// a host:port (localhost:9464) that resolves to loopback only.
        #[arg(long, value_name = "HOST:PORT", value_parser = daemon::metrics_addr)]
        metrics: Option<SocketAddr>,
        /// How TC programs are attached.
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
        /// Seconds between retries of a failed apply.
        #[arg(long, default_value_t = 5)]
        retry_secs: u64,
        /// Seconds between passes of the flow collector, which deletes expired flow entries
        /// (the programs already ignore them) and counts flows by state for status and
        /// metrics.
        #[arg(long, default_value_t = 10)]
        gc_secs: u64,
        /// This node's name in the cluster (--cluster): its status key and `lb nodes`' row.
        /// Default: the hostname.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        #[command(flatten)]
        layouts: Layouts,
        #[command(flatten)]
        sizes: Sizes,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Networks: a set of interfaces the programs attach to, and their services.
    #[command(visible_alias = "net")]
    Network {
        #[command(subcommand)]
        cmd: NetworkCmd,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Services: one contribution (id + generation) of a VIP and/or published ports, and
    /// backends.
    #[command(visible_alias = "svc")]
    Service {
        #[command(subcommand)]
        cmd: ServiceCmd,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Apply many changes as one (an orchestrator's endpoint sync): a JSON file of
    /// `{"changes": [...]}`, each change an object with its "op" (network_add, network_rm,
    /// network_set, service_set, service_rm, backend_add, backend_rm, backend_disable,
    /// backend_enable); every change or none is saved and applied, in one sync.
    Batch {
        /// The changes; `-` reads stdin.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Check the changes and print what they would change; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Replace the whole desired state with a JSON file, atomically, and print what changed
    /// (the node's own; with --cluster, the cluster's services, in transactions of at most
    /// 128 keys).
    Apply {
        /// The desired state (the JSON `lb state` prints; its schema: `lb schema`, its
        /// reference: docs/schema.md); `-` reads stdin.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: Option<PathBuf>,
        /// A file given without -f (`lb apply state.json`): answered with how to say it.
        #[arg(hide = true, value_name = "FILE")]
        stray: Option<PathBuf>,
        /// Check the state against the daemon and the node and print what would change;
        /// change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Wait until every changed network is applied, up to SECS (default 60); exit 3 if
        /// one is still not applied then.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "60")]
        wait: Option<u64>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// The desired state, as JSON (the format `lb apply -f` takes): the node's own (the
    /// cluster's services it serves left out), or with --cluster the cluster's services.
    State {
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// The JSON Schema (draft 2020-12) of the desired state that `lb apply -f`, `lb load -f`
    /// and `lb elements -f` read and `lb state` prints, for editors and CI checks
    /// (docs/schema.md explains it). Needs no daemon.
    Schema,
    /// What this lb is (version, commit, the eBPF object it carries) and what this kernel
    /// supports: as root, the probe `--dataplane auto` runs (the programs through the
    /// verifier, TCX or netlink TC).
    Version {
        #[command(flatten)]
        json: JsonArg,
    },
    /// The cluster's nodes (--cluster): the revision each applied, its lag, the services it
    /// refuses, from the status each keeps under a lease.
    Nodes {
        #[command(flatten)]
        json: JsonArg,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Follow the changes the daemon applies, one line each, as they happen (JSON lines
    /// with -j): from after revision --from first (the history keeps the last 4096), then
    /// live, until interrupted.
    Watch {
        /// Start after this revision (`lb status` and every change's answer give it).
        #[arg(long, value_name = "REVISION")]
        from: Option<u64>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Composed elements, what the dataplane is told bucket by bucket: a table of NETWORK,
    /// then MAP, KEY and VALUE in moby's notation (`nat-service-vip`, `10.99.0.10 . 0-32767`,
    /// `10.20.0.11`); of a desired-state file with -f, without a daemon.
    Elements {
        /// Only this network's.
        network: Option<String>,
        /// Compose this desired-state file instead of asking the daemon (`--state`, the old
        /// spelling, still works).
        #[arg(short = 'f', long = "file", alias = "state", value_name = "FILE")]
        state: Option<PathBuf>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Live flows: protocol, client, service and frontend, backend, state, time left.
    #[command(visible_alias = "ct")]
    Conntrack {
        /// Only this network's.
        network: Option<String>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// The dataplane in use and why, and each network's state and last sync.
    Status {
        /// Only this network's.
        network: Option<String>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Program the eBPF dataplane once from a desired-state file (no daemon); programs stay
    /// attached and maps pinned under --bpffs.
    Load {
        /// The desired-state file (`--state`, the old spelling, still works).
        #[arg(short = 'f', long = "file", alias = "state", value_name = "FILE")]
        state: PathBuf,
        /// Where maps and links are pinned, one directory per network.
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        /// Where this load records what it programmed, for `lb unload` (`--state-dir`, the
        /// old spelling, still works; the daemon's --state-dir is its desired state).
        #[arg(long, alias = "state-dir", default_value = oneshot::DEFAULT_RECORD_DIR)]
        record_dir: PathBuf,
        /// How TC programs are attached.
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
        #[command(flatten)]
        layouts: Layouts,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Remove everything the last `lb load` programmed.
    Unload {
        /// Where `lb load` pinned maps and links.
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        /// Where `lb load` recorded what it programmed (`--state-dir`, the old spelling,
        /// still works).
        #[arg(long, alias = "state-dir", default_value = oneshot::DEFAULT_RECORD_DIR)]
        record_dir: PathBuf,
        /// How TC programs are attached.
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
        #[command(flatten)]
        json: JsonArg,
    },
}

#[derive(Subcommand)]
pub enum NetworkCmd {
    /// Add a network (without services: `lb service set` adds them).
    Add {
        /// The network's name (letters, digits, `_`, `.`, `-`): names its pins, its nftables
        /// table and its services' keys.
        #[arg(value_parser = checked(validate::check_network_name))]
        name: String,
        /// An interface the programs attach to (a bridge, a veth, the node's uplink); the
        /// first one also carries the VIP aliases. Repeatable; one that does not exist yet is
        /// served from when it appears.
        #[arg(long = "interface", value_name = "IFNAME", required = true)]
        interfaces: Vec<String>,
        /// The network namespace the interfaces are in (a name under /run/netns, or a path);
        /// the daemon's own namespace without it.
        #[arg(long, value_name = "NETNS")]
        netns: Option<String>,
        /// nat: DNAT to the backend, replies back through lb; dsr: direct server return,
        /// only MACs rewritten (VIPs only).
        #[arg(long, value_enum, default_value_t)]
        mode: Mode,
        /// Where the VIP programs run: tc, or xdp in front of tc where the driver runs XDP
        /// natively.
        #[arg(long, value_enum, default_value_t)]
        attach: Attach,
        /// Which flows get the network's address as their source: auto (hairpin flows
        /// only), always, never.
        #[arg(long, value_enum, default_value_t)]
        masquerade: Masquerade,
        /// Whether translated packets may bypass the node's stack (eBPF): auto (directly where
        /// no forward-hook rule applies, once netfilter has passed a flow where rules do), on
        /// (even past such rules), off.
        #[arg(long, value_enum, default_value_t)]
        fast_path: FastPath,
        /// Whether the daemon holds a socket bound to each published port so that no process
        /// of the node takes it, as kubelet and Docker do.
        #[arg(long, value_enum, default_value_t)]
        hold_ports: HoldPorts,
        /// A flow timeout, NAME=SECONDS (tcp_syn, tcp_established, tcp_closing (reset),
        /// tcp_time_wait (closed by FINs), tcp_unreplied, udp; dsr for a dsr network's
        /// sessions); repeatable.
        #[arg(long = "timeout", value_name = "NAME=SECONDS")]
        timeouts: Vec<String>,
    },
    /// Remove a network, its services and everything its dataplane holds.
    #[command(visible_alias = "remove")]
    Rm {
        /// The network's name.
        #[arg(value_parser = checked(validate::check_network_name))]
        name: String,
    },
    /// Change a network's settings in place; what is not given stays. Flows are kept,
    /// except where the namespace changes (the network moves: its hooks and flows start
    /// anew there).
    Set {
        /// The network's name.
        #[arg(value_parser = checked(validate::check_network_name))]
        name: String,
        /// Replace the interfaces with these (repeatable).
        #[arg(long = "interface", value_name = "IFNAME")]
        interfaces: Vec<String>,
        /// Add an interface (at the end) unless the network has it; repeatable.
        #[arg(long = "add-interface", value_name = "IFNAME")]
        add_interfaces: Vec<String>,
        /// Take an interface out; repeatable.
        #[arg(long = "remove-interface", value_name = "IFNAME")]
        remove_interfaces: Vec<String>,
        /// Move the network to this namespace (a name under /run/netns, or a path).
        #[arg(long, value_name = "NETNS", conflicts_with = "own_netns")]
        netns: Option<String>,
        /// Move the network to the daemon's own namespace.
        #[arg(long)]
        own_netns: bool,
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        #[arg(long, value_enum)]
        attach: Option<Attach>,
        #[arg(long, value_enum)]
        masquerade: Option<Masquerade>,
        #[arg(long, value_enum)]
        fast_path: Option<FastPath>,
        #[arg(long, value_enum)]
        hold_ports: Option<HoldPorts>,
        /// A flow timeout, NAME=SECONDS, or NAME=default to return it to its default;
        /// repeatable (names as `lb network add --timeout`).
        #[arg(long = "timeout", value_name = "NAME=SECONDS")]
        timeouts: Vec<String>,
    },
    /// The networks, one row each.
    #[command(visible_alias = "ls")]
    List {
        /// Only this network.
        network: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum ServiceCmd {
    /// Add or replace one contribution (service id + generation) of a network's service.
    Set {
        /// The network it belongs to.
        #[arg(value_parser = checked(validate::check_network_name))]
        network: String,
        /// The service's id (a container, a sandbox, a job): generations of one id compose.
        #[arg(value_parser = checked(validate::check_service_id))]
        service_id: String,
        /// The contribution's generation: several generations of one service (a rolling
        /// update) are served together, their backends in one set.
        #[arg(value_parser = checked(validate::check_generation), long, default_value = DEFAULT_GENERATION)]
        generation: String,
        /// A VIP (every port of it is balanced over the backends of its family); repeatable
        /// once per family (a dual-stack service: `--vip 10.99.0.10 --vip fd99::10`).
        /// Without one the service is its published ports only (a host port).
        #[arg(long = "vip", value_name = "IP")]
        vips: Vec<String>,
        /// A backend, IP[,disabled] (a disabled one gets no new flows and keeps its
        /// existing ones); repeatable.
        #[arg(long = "backend", value_name = "IP[,disabled]")]
        backends: Vec<String>,
        /// A published port on the node's addresses (or on HOST_IP), to TARGET on the
        /// backends (the same port without it); repeatable.
        #[arg(long = "port", value_name = "PROTO/PUBLISHED[:TARGET][@HOST_IP]")]
        ports: Vec<String>,
        /// With --cluster: write only if the key is at this etcd revision (0: absent), else
        /// fail with a conflict. Without it, the revision the write read.
        #[arg(long, value_name = "REVISION")]
        if_revision: Option<i64>,
    },
    /// Remove a service: one generation with --generation, else every generation of it.
    #[command(visible_alias = "remove")]
    Rm {
        /// The network it belongs to.
        #[arg(value_parser = checked(validate::check_network_name))]
        network: String,
        /// The service's id.
        #[arg(value_parser = checked(validate::check_service_id))]
        service_id: String,
        /// Only this generation.
        #[arg(value_parser = checked(validate::check_generation), long)]
        generation: Option<String>,
        /// With --cluster: remove only if the key is at this etcd revision.
        #[arg(long, value_name = "REVISION")]
        if_revision: Option<i64>,
    },
    /// Services with their frontends and each backend's state, flows and packets.
    #[command(visible_alias = "ls")]
    List {
        /// Only this network's.
        network: Option<String>,
    },
    /// One backend of a service: add, remove, drain (disable) or enable it, without
    /// repeating the rest of the service.
    Backend {
        #[command(subcommand)]
        cmd: BackendCmd,
    },
}

#[derive(Subcommand)]
pub enum BackendCmd {
    /// Add a backend, IP[,disabled].
    Add(BackendArgs),
    /// Remove a backend: its UDP flows are flushed, its TCP connections finish.
    #[command(visible_alias = "remove")]
    Rm(BackendArgs),
    /// Drain a backend: no new flows, its flows kept.
    Disable(BackendArgs),
    /// Let a drained backend take new flows again.
    Enable(BackendArgs),
}

#[derive(Args)]
pub struct BackendArgs {
    /// The network it belongs to.
    #[arg(value_parser = checked(validate::check_network_name))]
    pub network: String,
    /// The service's id.
    #[arg(value_parser = checked(validate::check_service_id))]
    pub service_id: String,
    /// The backend's address (`add`: IP[,disabled]).
    pub backend: String,
    /// The generation; without it, the service's only one.
    #[arg(value_parser = checked(validate::check_generation), long)]
    pub generation: Option<String>,
}

/// The sizes `lb daemon` creates a network's maps with.
#[derive(Args, Clone, Copy)]
pub struct Sizes {
    /// Entries of a network's VIP map, and of its published-port map. Sizes apply to maps
    /// created after they are set (a network added, or removed and added again); a state
    /// that does not fit its network's maps is refused before it is saved.
    #[arg(long, default_value_t = lb_common::MAX_SERVICES, value_parser = clap::value_parser!(u32).range(1..))]
    max_services: u32,
    /// Backend slots of a network: every backend of every VIP and published port, twice
    /// for a set being replaced. With the service maps, also bounds the per-CPU counters
    /// (one per service and backend, allocated only for those that exist).
    #[arg(long, default_value_t = lb_common::MAX_BACKEND_SLOTS, value_parser = clap::value_parser!(u32).range(1..))]
    max_backends: u32,
    /// Entries of a network's flow table (an LRU, preallocated): a flow takes two, four
    /// when masqueraded.
    #[arg(long, default_value_t = lb_common::MAX_FLOWS, value_parser = clap::value_parser!(u32).range(1..))]
    max_flows: u32,
}

impl Sizes {
    pub fn map_sizes(self) -> MapSizes {
        MapSizes::new(self.max_services, self.max_backends, self.max_flows)
    }
}

/// What `lb daemon` and `lb load` do with pinned maps of another layout.
#[derive(Args, Clone, Copy)]
pub struct Layouts {
    /// Replace pinned maps whose layout is not this lb's, losing what they hold (flows of
    /// lb_flows: connections re-create them on the same backend). Without it such a network
    /// is refused and left as it is, its programs serving on.
    #[arg(long)]
    replace_incompatible_maps: bool,
}

impl Layouts {
    pub fn choice(self) -> OnIncompatible {
        if self.replace_incompatible_maps {
            OnIncompatible::Replace
        } else {
            OnIncompatible::Refuse
        }
    }
}

impl TcChoice {
    pub fn mode(self) -> TcMode {
        match self {
            TcChoice::Auto => TcMode::detect(),
            TcChoice::Tcx => TcMode::Tcx,
            TcChoice::Netlink => TcMode::Netlink,
        }
    }
}

impl DataplaneArg {
    pub fn choice(self) -> DataplaneChoice {
        match self {
            DataplaneArg::Auto => DataplaneChoice::Auto,
            DataplaneArg::Ebpf => DataplaneChoice::Ebpf,
            DataplaneArg::Nftables => DataplaneChoice::Nftables,
        }
    }
}

impl Cmd {
    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Cmd::Daemon { .. } => "daemon",
            Cmd::Network { .. } => "network",
            Cmd::Service { .. } => "service",
            Cmd::Batch { .. } => "batch",
            Cmd::Apply { .. } => "apply",
            Cmd::State { .. } => "state",
            Cmd::Schema => "schema",
            Cmd::Nodes { .. } => "nodes",
            Cmd::Version { .. } => "version",
            Cmd::Watch { .. } => "watch",
            Cmd::Elements { .. } => "elements",
            Cmd::Conntrack { .. } => "conntrack",
            Cmd::Status { .. } => "status",
            Cmd::Load { .. } => "load",
            Cmd::Unload { .. } => "unload",
        }
    }
}

/// A name the daemon would refuse, refused here as usage (exit 2) before it is asked, by
/// `check`, the daemon's own rule for it.
fn checked(
    check: fn(&str) -> Result<(), validate::Invalid>,
) -> impl Fn(&str) -> Result<String, String> + Clone + Send + Sync + 'static {
    move |s| {
        check(s).map_err(|e| e.to_string())?;
        Ok(s.to_owned())
    }
}
