//! The `lb` command: the daemon, its API client (DESIGN.md's CLI, spelled exactly so), and the
//! one-shot `load`/`unload`. Every failure exits 1 with a one-line reason on stderr.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use lb_user::{
    api::{self, DEFAULT_SOCKET, Request},
    core::elements,
    core::model::{self, Backend, DEFAULT_GENERATION, FlowTimeouts, Network, PortConfig, Service},
    daemon::{self, DataplaneChoice},
    dataplane::ebpf::{DEFAULT_BPFFS, MapSizes, TcMode},
    oneshot,
};
use serde_json::Value;

#[derive(Parser)]
#[command(
    name = "lb",
    version,
    about = "eBPF/XDP service load balancer for container nodes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum TcChoice {
    /// TCX links where the kernel has them (6.6+), netlink clsact otherwise.
    Auto,
    Tcx,
    Netlink,
}

#[derive(Clone, Copy, ValueEnum)]
enum DataplaneArg {
    Auto,
    Ebpf,
    Nftables,
}

/// What every client command takes.
#[derive(Args, Clone)]
struct Client {
    /// The daemon's API socket.
    #[arg(long, env = "LB_SOCKET", default_value = DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    /// Print the daemon's answer as JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Cmd {
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
        /// Prometheus text on this loopback address (off unless given).
        #[arg(long)]
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
enum NetworkCmd {
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
        /// A flow timeout, NAME=SECONDS (tcp_syn, tcp_established, tcp_closing,
        /// tcp_unreplied, udp); repeatable.
        #[arg(long = "timeout")]
        timeouts: Vec<String>,
    },
    Rm {
        name: String,
    },
    List,
}

#[derive(Subcommand)]
enum ServiceCmd {
    Set {
        network: String,
        service_id: String,
        #[arg(long, default_value = DEFAULT_GENERATION)]
        generation: String,
        #[arg(long)]
        vip: String,
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

fn tc_mode(c: TcChoice) -> TcMode {
    match c {
        TcChoice::Auto => TcMode::detect(),
        TcChoice::Tcx => TcMode::Tcx,
        TcChoice::Netlink => TcMode::Netlink,
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LB_LOG").unwrap_or_else(|_| {
                // The daemon says what it does; one-shot commands only what went wrong.
                let daemon = std::env::args().nth(1).as_deref() == Some("daemon");
                (if daemon { "info" } else { "warn" }).into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("lb: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}

/// Sends `req` and returns the result, or the daemon's error as ours.
/// Every value of a repeated flag, the first bad one named with its flag.
fn parse_each<T>(values: &[String], flag: &str) -> Result<Vec<T>>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    (values.iter())
        .map(|v| v.parse::<T>().with_context(|| format!("{flag} {v}")))
        .collect()
}

fn call(client: &Client, req: &Request) -> Result<Value> {
    let resp = api::call(&client.socket, req)?;
    match (resp.ok, resp.result, resp.error) {
        (true, Some(v), _) => Ok(v),
        (true, None, _) => Ok(Value::Null),
        (false, _, e) => {
            Err(anyhow::anyhow!(e.unwrap_or_else(|| {
                "the daemon refused without a reason".into()
            })))
        }
    }
}

/// Prints `v` as JSON under `--json`, else by `human`.
fn show(client: &Client, v: &Value, human: impl FnOnce(&Value)) {
    if client.json {
        println!("{v}");
    } else {
        human(v);
    }
}

fn done(client: &Client, v: &Value) {
    show(client, v, |v| {
        println!("{}", v["done"].as_str().unwrap_or("done"))
    });
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Daemon {
            state_dir,
            socket,
            bpffs,
            dataplane,
            metrics,
            tc,
            retry_secs,
            gc_secs,
            max_services,
            max_backends,
            max_flows,
        } => daemon::run(daemon::Options {
            state_dir,
            socket,
            bpffs,
            dataplane: match dataplane {
                DataplaneArg::Auto => DataplaneChoice::Auto,
                DataplaneArg::Ebpf => DataplaneChoice::Ebpf,
                DataplaneArg::Nftables => DataplaneChoice::Nftables,
            },
            tc_mode: tc_mode(tc),
            metrics,
            retry: Duration::from_secs(retry_secs.max(1)),
            gc: Duration::from_secs(gc_secs.max(1)),
            map_sizes: MapSizes::new(max_services, max_backends, max_flows),
        }),
        Cmd::Network { cmd, client } => match cmd {
            NetworkCmd::Add {
                name,
                interfaces,
                netns,
                mode,
                attach,
                masquerade,
                timeouts: specs,
            } => {
                let mut timeouts = FlowTimeouts::default();
                for spec in &specs {
                    timeouts.set(spec)?;
                }
                let network = Network {
                    name,
                    interfaces,
                    netns,
                    mode: mode.parse()?,
                    attach: attach.parse()?,
                    masquerade: masquerade.parse()?,
                    timeouts,
                    services: vec![],
                };
                done(&client, &call(&client, &Request::NetworkAdd { network })?);
                Ok(())
            }
            NetworkCmd::Rm { name } => {
                done(&client, &call(&client, &Request::NetworkRm { name })?);
                Ok(())
            }
            NetworkCmd::List => {
                let v = call(&client, &Request::NetworkList {})?;
                show(&client, &v, |v| {
                    for n in v.as_array().into_iter().flatten() {
                        let ifs: Vec<String> = n["interfaces"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(s)
                            .collect();
                        println!(
                            "{} interfaces={} netns={} mode={} attach={} masquerade={} services={}",
                            s(&n["name"]),
                            ifs.join(","),
                            s(&n["netns"]),
                            s(&n["mode"]),
                            s(&n["attach"]),
                            s(&n["masquerade"]),
                            n["services"]
                        );
                    }
                });
                Ok(())
            }
        },
        Cmd::Service { cmd, client } => match cmd {
            ServiceCmd::Set {
                network,
                service_id,
                generation,
                vip,
                backends,
                ports,
            } => {
                let service = Service {
                    id: service_id,
                    generation,
                    vip: model::parse_ipv4(&vip).context("--vip")?,
                    backends: parse_each::<Backend>(&backends, "--backend")?,
                    ports: parse_each::<PortConfig>(&ports, "--port")?,
                };
                done(
                    &client,
                    &call(&client, &Request::ServiceSet { network, service })?,
                );
                Ok(())
            }
            ServiceCmd::Rm {
                network,
                service_id,
                generation,
            } => {
                let req = Request::ServiceRm {
                    network,
                    id: service_id,
                    generation,
                };
                done(&client, &call(&client, &req)?);
                Ok(())
            }
            ServiceCmd::List { network } => {
                let v = call(&client, &Request::ServiceList { network })?;
                show(&client, &v, |v| {
                    for svc_v in v.as_array().into_iter().flatten() {
                        let svc: Service = match serde_json::from_value(strip_network(svc_v)) {
                            Ok(s) => s,
                            Err(_) => continue,
                        };
                        let backends: Vec<String> =
                            svc.backends.iter().map(|b| b.to_string()).collect();
                        let ports: Vec<String> = svc.ports.iter().map(|p| p.to_string()).collect();
                        println!(
                            "{} {} generation {} vip {} backends {} ports {}",
                            s(&svc_v["network"]),
                            svc.id,
                            svc.generation,
                            svc.vip,
                            if backends.is_empty() {
                                "-".into()
                            } else {
                                backends.join(" ")
                            },
                            if ports.is_empty() {
                                "-".into()
                            } else {
                                ports.join(" ")
                            },
                        );
                    }
                });
                Ok(())
            }
        },
        Cmd::Apply { file, client } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            // Checked here too, so the error names the file and the JSON path.
            let state = model::DesiredState::from_json(&text)
                .with_context(|| format!("{}", file.display()))?;
            done(&client, &call(&client, &Request::Apply { state })?);
            Ok(())
        }
        Cmd::State { client } => {
            let v = call(&client, &Request::State {})?;
            // Printed in the canonical field order, so that `lb apply -f` of a canonical file
            // and `lb state` print the same bytes; pretty unless --json asks for one line.
            let state: model::DesiredState =
                serde_json::from_value(v).context("the daemon's state does not parse")?;
            if client.json {
                println!("{}", serde_json::to_string(&state)?);
            } else {
                println!("{}", state.to_json());
            }
            Ok(())
        }
        Cmd::Elements {
            network,
            state: Some(path),
            client,
        } => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let state = model::DesiredState::from_json(&text)
                .with_context(|| format!("{}", path.display()))?;
            if let Some(want) = &network
                && state.network(want).is_none()
            {
                anyhow::bail!("unknown network {want:?}");
            }
            let out: Vec<String> = state
                .networks
                .iter()
                .filter(|n| network.as_ref().is_none_or(|w| *w == n.name))
                .flat_map(|n| {
                    elements::network_elements(n)
                        .into_iter()
                        .map(|e| e.to_string())
                })
                .collect();
            print_lines(&client, &Value::from(out));
            Ok(())
        }
        Cmd::Elements {
            network,
            state: None,
            client,
        } => {
            let v = call(&client, &Request::Elements { network })?;
            print_lines(&client, &v);
            Ok(())
        }
        Cmd::Conntrack { network, client } => {
            let v = call(&client, &Request::Conntrack { network })?;
            show(&client, &v, |v| {
                for f in v.as_array().into_iter().flatten() {
                    println!(
                        "{} {} {} -> {} => {} {} {}",
                        s(&f["network"]),
                        s(&f["proto"]),
                        s(&f["client"]),
                        s(&f["service"]),
                        s(&f["backend"]),
                        s(&f["state"]),
                        f["expires_secs"]
                            .as_u64()
                            .map_or("-".to_owned(), |a| format!("{a}s"))
                    );
                }
            });
            Ok(())
        }
        Cmd::Status { client } => {
            let v = call(&client, &Request::Status {})?;
            show(&client, &v, |v| {
                println!("dataplane: {} ({})", s(&v["dataplane"]), s(&v["reason"]));
                for n in v["networks"].as_array().into_iter().flatten() {
                    let state = if n["applied"].as_bool() == Some(true) {
                        "applied".to_owned()
                    } else {
                        format!("NOT APPLIED: {}", s(&n["error"]))
                    };
                    let by_state = (n["flows_by_state"].as_object())
                        .map(|m| {
                            let parts: Vec<String> =
                                m.iter().map(|(k, v)| format!("{v} {k}")).collect();
                            format!(" ({})", parts.join(", "))
                        })
                        .unwrap_or_default();
                    println!(
                        "network {}: {state}; {} services, {} backends, {} flows{by_state}; attach {} on {}",
                        s(&n["name"]),
                        n["services"],
                        n["backends"],
                        s(&n["flows"]),
                        s(&n["attach"]),
                        n["interfaces"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(s)
                            .collect::<Vec<_>>()
                            .join(",")
                    );
                    for w in n["warnings"].as_array().into_iter().flatten() {
                        println!("  warning: {}", s(w));
                    }
                }
            });
            Ok(())
        }
        Cmd::Load {
            state,
            bpffs,
            state_dir,
            tc,
        } => {
            for (network, s) in oneshot::load(&state, &bpffs, &state_dir, tc_mode(tc))? {
                println!(
                    "{network}: loaded ({} map entries written, {} deleted, {} flows flushed); pinned under {}",
                    s.written,
                    s.deleted,
                    s.flows_flushed,
                    bpffs.join(&network).display()
                );
            }
            Ok(())
        }
        Cmd::Unload {
            bpffs,
            state_dir,
            tc,
        } => {
            let n = oneshot::unload(&bpffs, &state_dir, tc_mode(tc))?;
            println!("unloaded {n} networks");
            Ok(())
        }
    }
}

fn strip_network(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("network");
    }
    v
}

fn print_lines(client: &Client, v: &Value) {
    show(client, v, |v| {
        for l in v.as_array().into_iter().flatten() {
            println!("{}", s(l));
        }
    });
}
