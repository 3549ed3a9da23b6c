//! The `lb` command line: DESIGN.md's CLI, spelled exactly so.
use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use lb_user::{
    api::DEFAULT_SOCKET,
    core::model::DEFAULT_GENERATION,
    daemon::{self, DataplaneChoice},
    dataplane::ebpf::{DEFAULT_BPFFS, MapSizes, OnIncompatible, TcMode},
    oneshot,
};

#[derive(Parser)]
#[command(
    name = "lb",
    version,
    about = "eBPF/XDP service load balancer for container nodes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TcChoice {
    /// TCX links where the kernel has them (6.6+), netlink clsact otherwise.
    Auto,
    Tcx,
    Netlink,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DataplaneArg {
    Auto,
    Ebpf,
    Nftables,
}

/// What every client command takes.
#[derive(Args, Clone)]
pub struct Client {
    /// The daemon's API socket.
    #[arg(long, env = "LB_SOCKET", default_value = DEFAULT_SOCKET, global = true)]
    pub socket: PathBuf,
    /// Print the daemon's answer as JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the daemon: owns the desired state and every network's dataplane.
    Daemon {
        /// Where the desired state is kept (state.json, written before it is applied).
        #[arg(long, default_value = daemon::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// The API socket (created 0600; root and the daemon's own user only).
        #[arg(long, env = "LB_SOCKET", default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Maps and links are pinned here, one directory per network, so a restarted daemon
        /// adopts them without dropping a flow.
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        /// Which dataplane programs the networks: `auto` probes the kernel and falls back to
        /// nftables (LB_PROBE_FAIL=REASON forces the fallback).
        #[arg(long, value_enum, default_value = "auto")]
        dataplane: DataplaneArg,
        /// Prometheus text on http://ADDR/metrics (off unless given): an address or a
        /// host:port (localhost:9464) that resolves to loopback only.
        #[arg(long, value_parser = daemon::metrics_addr)]
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
        #[command(flatten)]
        layouts: Layouts,
        #[command(flatten)]
        sizes: Sizes,
    },
    /// Networks: a set of interfaces the programs attach to, and their services.
    Network {
        #[command(subcommand)]
        cmd: NetworkCmd,
        #[command(flatten)]
        client: Client,
    },
    /// Services: one contribution (id + generation) of VIP, backends and published ports.
    Service {
        #[command(subcommand)]
        cmd: ServiceCmd,
        #[command(flatten)]
        client: Client,
    },
    /// Replace the whole desired state with a JSON file (DESIGN.md's format), atomically.
    Apply {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[command(flatten)]
        client: Client,
    },
    /// The desired state, as JSON.
    State {
        #[command(flatten)]
        client: Client,
    },
    /// Composed elements in DESIGN.md's notation (of a desired-state file with --state,
    /// without a daemon).
    Elements {
        network: Option<String>,
        #[arg(long)]
        state: Option<PathBuf>,
        #[command(flatten)]
        client: Client,
    },
    /// Live flows: proto client -> service => backend, state, seconds left.
    Conntrack {
        network: Option<String>,
        #[command(flatten)]
        client: Client,
    },
    /// The dataplane in use and why, and each network's state.
    Status {
        #[command(flatten)]
        client: Client,
    },
    /// Program the eBPF dataplane once from a desired-state file (no daemon); programs stay
    /// attached and maps pinned under --bpffs.
    Load {
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        #[arg(long, default_value = oneshot::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// How TC programs are attached.
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
        #[command(flatten)]
        layouts: Layouts,
    },
    /// Remove everything the last `lb load` programmed.
    Unload {
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        #[arg(long, default_value = oneshot::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        /// How TC programs are attached.
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
    },
}

#[derive(Subcommand)]
pub enum NetworkCmd {
    Add {
        name: String,
        #[arg(long = "interface", required = true)]
        interfaces: Vec<String>,
        #[arg(long)]
        netns: Option<String>,
        #[arg(long, default_value = "nat")]
        mode: String,
        #[arg(long, default_value = "tc")]
        attach: String,
        #[arg(long, default_value = "auto")]
        masquerade: String,
        /// Whether translated packets may bypass the node's stack (eBPF): auto (where no
        /// forward-hook rule applies), on (even past such rules), off.
        #[arg(long, default_value = "auto")]
        fast_path: String,
        /// Whether the daemon holds a socket bound to each published port so that no process
        /// of the node takes it, as kubelet and Docker do: on, off.
        #[arg(long, default_value = "on")]
        hold_ports: String,
        /// A flow timeout, NAME=SECONDS (tcp_syn, tcp_established, tcp_closing,
        /// tcp_unreplied, udp; dsr for a dsr network's sessions); repeatable.
        #[arg(long = "timeout")]
        timeouts: Vec<String>,
    },
    Rm {
        name: String,
    },
    List,
}

#[derive(Subcommand)]
pub enum ServiceCmd {
    Set {
        network: String,
        service_id: String,
        #[arg(long, default_value = DEFAULT_GENERATION)]
        generation: String,
        /// The VIP (every port of it is balanced); without one the service is its published
        /// ports only (a host port).
        #[arg(long)]
        vip: Option<String>,
        /// IP[,disabled]
        #[arg(long = "backend")]
        backends: Vec<String>,
        /// PROTO/PUBLISHED[:TARGET][@HOST_IP]
        #[arg(long = "port")]
        ports: Vec<String>,
    },
    /// Without --generation, every generation of the service goes.
    Rm {
        network: String,
        service_id: String,
        #[arg(long)]
        generation: Option<String>,
    },
    List {
        network: Option<String>,
    },
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
