//! The options that are not a command's own: `--socket`, `-j` and `--cluster` with its TLS
//! files, each offered by the commands it acts on (a command's help is what it takes), and
//! their resolution into the [`Global`] a command runs with, which also takes them from
//! before the command's name as earlier lb versions did (`lb -j status`).
use std::path::PathBuf;

use clap::Args;
use lb_user::api::DEFAULT_SOCKET;

use super::args::{Cli, Cmd};

/// The options before the command's name (`lb -j status`, `lb --socket PATH network ls`), as
/// earlier lb versions took every option: hidden, and taken only by a command they act on
/// (`Cli::global`), so a command's help offers what it uses and nothing else.
#[derive(Args, Clone)]
pub struct Before {
    #[arg(long, hide = true)]
    pub socket: Option<PathBuf>,
    #[arg(short = 'j', long, hide = true)]
    pub json: bool,
    #[arg(long, hide = true)]
    pub cluster: Option<String>,
    #[arg(long, hide = true)]
    pub cluster_prefix: Option<String>,
    #[arg(long, hide = true)]
    pub cluster_ca: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub cluster_cert: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub cluster_key: Option<PathBuf>,
}

/// `--socket`, on the commands that talk to the daemon (and the daemon, which listens on it).
/// Global within the command, so `lb network --socket PATH add …` and `lb network add …
/// --socket PATH` both work.
#[derive(Args, Clone)]
pub struct SocketArg {
    /// The daemon's API socket [default: /run/lb/lb.sock].
    #[arg(long, env = "LB_SOCKET", value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
}

/// `-j`, on the commands that print something a script reads.
#[derive(Args, Clone)]
pub struct JsonArg {
    /// Print JSON: the same data as the table, one document on stdout; errors as JSON on
    /// stderr.
    #[arg(short = 'j', long, global = true)]
    pub json: bool,
}

/// `--cluster` and its TLS files, on the daemon and the commands that can write the cluster.
#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// An etcd cluster, etcd://HOST:PORT[,HOST:PORT…]: `lb daemon` serves its services beside
    /// the node's own; `service set|rm|backend`, `state`, `apply` and `nodes` act on the
    /// cluster instead of the node (no daemon needed).
    #[arg(long, env = "LB_CLUSTER", value_name = "URL", global = true)]
    pub cluster: Option<String>,
    /// Where lb's keys live in etcd [default: /lb/].
    #[arg(long, env = "LB_CLUSTER_PREFIX", value_name = "PREFIX", global = true)]
    pub cluster_prefix: Option<String>,
    /// The CA certificate (PEM) that signed etcd's (TLS: the endpoints become https).
    #[arg(long, value_name = "FILE", global = true)]
    pub cluster_ca: Option<PathBuf>,
    /// A client certificate (PEM) for etcd, with --cluster-key.
    #[arg(long, value_name = "FILE", global = true)]
    pub cluster_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, value_name = "FILE", global = true)]
    pub cluster_key: Option<PathBuf>,
}

/// The options a command runs with: its own, else the ones given before its name, else the
/// defaults.
#[derive(Clone)]
pub struct Global {
    pub socket: PathBuf,
    pub json: bool,
    pub cluster: Option<String>,
    pub cluster_prefix: String,
    pub cluster_ca: Option<PathBuf>,
    pub cluster_cert: Option<PathBuf>,
    pub cluster_key: Option<PathBuf>,
}

impl Cli {
    /// The options `cmd` runs with. An option given before the name of a command it does not
    /// act on is refused (`lb --socket PATH load …`), not ignored. An option before the name
    /// wins over the command's own environment variable (it was typed; the variable was not).
    pub fn global(&self) -> Result<Global, String> {
        let (socket, json, cluster) = self.cmd.options();
        let b = &self.before;
        let name = self.cmd.name();
        let refused = |flag: &str| Err(format!("{flag} does not act on `lb {name}`"));
        if socket.is_none() && b.socket.is_some() {
            return refused("--socket");
        }
        if json.is_none() && b.json {
            return refused("--json");
        }
        if cluster.is_none()
            && (b.cluster.is_some()
                || b.cluster_prefix.is_some()
                || b.cluster_ca.is_some()
                || b.cluster_cert.is_some()
                || b.cluster_key.is_some())
        {
            return refused("--cluster");
        }
        // Before the name wins; else the command's own (given, or its variable).
        fn pick<T: Clone>(before: &Option<T>, own: Option<&Option<T>>) -> Option<T> {
            before.clone().or_else(|| own.and_then(Option::clone))
        }
        Ok(Global {
            socket: pick(&b.socket, socket.map(|s| &s.socket))
                .unwrap_or_else(|| DEFAULT_SOCKET.into()),
            json: b.json || json.is_some_and(|j| j.json),
            cluster: pick(&b.cluster, cluster.map(|c| &c.cluster)),
            cluster_prefix: pick(&b.cluster_prefix, cluster.map(|c| &c.cluster_prefix))
                .unwrap_or_else(|| lb_user::cluster::DEFAULT_PREFIX.into()),
            cluster_ca: pick(&b.cluster_ca, cluster.map(|c| &c.cluster_ca)),
            cluster_cert: pick(&b.cluster_cert, cluster.map(|c| &c.cluster_cert)),
            cluster_key: pick(&b.cluster_key, cluster.map(|c| &c.cluster_key)),
        })
    }
}

impl Cmd {
    /// The option groups this command takes: what `Cli::global` resolves.
    pub(super) fn options(&self) -> (Option<&SocketArg>, Option<&JsonArg>, Option<&ClusterArgs>) {
        match self {
            Cmd::Daemon {
                socket, cluster, ..
            } => (Some(socket), None, Some(cluster)),
            Cmd::Service {
                socket,
                json,
                cluster,
                ..
            }
            | Cmd::Apply {
                socket,
                json,
                cluster,
                ..
            }
            | Cmd::State {
                socket,
                json,
                cluster,
            } => (Some(socket), Some(json), Some(cluster)),
            Cmd::Network { socket, json, .. }
            | Cmd::Batch { socket, json, .. }
            | Cmd::Watch { socket, json, .. }
            | Cmd::Elements { socket, json, .. }
            | Cmd::Conntrack { socket, json, .. }
            | Cmd::Status { socket, json, .. } => (Some(socket), Some(json), None),
            Cmd::Nodes { json, cluster } => (None, Some(json), Some(cluster)),
            Cmd::Schema => (None, None, None),
            Cmd::Version { json } | Cmd::Load { json, .. } | Cmd::Unload { json, .. } => {
                (None, Some(json), None)
            }
        }
    }
}
