//! The `lb` command. Every failure exits non-zero with a one-line reason on stderr.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use lb_user::{
    dataplane::ebpf::{DEFAULT_BPFFS, TcMode},
    elements, model, oneshot,
};

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

#[derive(Subcommand)]
enum Cmd {
    /// Program the eBPF dataplane once from a desired-state file (no daemon); programs stay
    /// attached and maps pinned under --bpffs.
    Load {
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        #[arg(long, default_value = oneshot::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
    },
    /// Remove everything the last `lb load` programmed.
    Unload {
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        #[arg(long, default_value = oneshot::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        tc: TcChoice,
    },
    /// Composed elements in DESIGN.md's notation (of a desired-state file with --state).
    Elements {
        network: Option<String>,
        #[arg(long)]
        state: Option<PathBuf>,
        #[arg(long)]
        json: bool,
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
            tracing_subscriber::EnvFilter::try_from_env("LB_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("lb: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
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
        Cmd::Elements {
            network,
            state,
            json,
        } => {
            let path = state
                .context("lb elements without --state needs the daemon, which is not built yet")?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let state = model::DesiredState::from_json(&text)
                .with_context(|| format!("{}", path.display()))?;
            let mut out = Vec::new();
            for n in &state.networks {
                if network.as_ref().is_none_or(|want| *want == n.name) {
                    out.extend(
                        elements::network_elements(n)
                            .into_iter()
                            .map(|e| e.to_string()),
                    );
                }
            }
            if let Some(want) = &network
                && state.network(want).is_none()
            {
                anyhow::bail!("unknown network {want:?}");
            }
            if json {
                println!("{}", serde_json::to_string(&out)?);
            } else {
                out.iter().for_each(|l| println!("{l}"));
            }
            Ok(())
        }
    }
}
