//! What each command does: the daemon, a client request and its rendering, or the one-shot
//! `load`/`unload`.
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use lb_user::{
    api::{self, Request},
    core::elements,
    core::model::{self, Backend, DesiredState, FlowTimeouts, Network, PortConfig, Service},
    daemon,
    lock::Lock,
    oneshot,
};

use super::{
    args::{Client, Cmd, NetworkCmd, ServiceCmd},
    render,
};

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

/// Sends `req` and reads the reply as `T`, or the daemon's refusal as our error.
fn call<T: serde::de::DeserializeOwned>(client: &Client, req: &Request) -> Result<T> {
    api::Client::new(&client.socket).call(req)
}

/// A change: sends it and prints what was done.
fn change(client: &Client, req: &Request) -> Result<()> {
    render::done(client.json, &call(client, req)?);
    Ok(())
}

fn read_state_file(path: &std::path::Path) -> Result<DesiredState> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    DesiredState::from_json(&text).with_context(|| format!("{}", path.display()))
}

/// The locks `lb load`/`lb unload` hold while they write: the same state dir and bpffs
/// locks a daemon holds, so neither writes under the other.
fn one_shot_locks(state_dir: &std::path::Path, bpffs: &std::path::Path) -> Result<[Lock; 2]> {
    Ok([
        Lock::dir(state_dir, "the state dir")?,
        Lock::dir(bpffs, "the bpffs dir")?,
    ])
}

pub fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Daemon {
            state_dir,
            socket,
            bpffs,
            dataplane,
            metrics,
            tc,
            retry_secs,
            gc_secs,
            layouts,
            sizes,
        } => daemon::run(daemon::Options {
            state_dir,
            socket,
            bpffs,
            dataplane: dataplane.choice(),
            tc_mode: tc.mode(),
            on_incompatible: layouts.choice(),
            metrics,
            retry: Duration::from_secs(retry_secs.max(1)),
            gc: Duration::from_secs(gc_secs.max(1)),
            map_sizes: sizes.map_sizes(),
        }),
        Cmd::Network { cmd, client } => match cmd {
            NetworkCmd::Add {
                name,
                interfaces,
                netns,
                mode,
                attach,
                masquerade,
                fast_path,
                hold_ports,
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
                    fast_path: fast_path.parse()?,
                    hold_ports: hold_ports.parse()?,
                    timeouts,
                    services: vec![],
                };
                change(&client, &Request::NetworkAdd { network })
            }
            NetworkCmd::Rm { name } => change(&client, &Request::NetworkRm { name }),
            NetworkCmd::List => {
                render::networks(
                    client.json,
                    &call::<Vec<_>>(&client, &Request::NetworkList)?,
                );
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
                    vip: (vip.as_deref().map(model::parse_ipv4))
                        .transpose()
                        .context("--vip")?,
                    backends: parse_each::<Backend>(&backends, "--backend")?,
                    ports: parse_each::<PortConfig>(&ports, "--port")?,
                };
                change(&client, &Request::ServiceSet { network, service })
            }
            ServiceCmd::Rm {
                network,
                service_id,
                generation,
            } => change(
                &client,
                &Request::ServiceRm {
                    network,
                    id: service_id,
                    generation,
                },
            ),
            ServiceCmd::List { network } => {
                let list: Vec<_> = call(&client, &Request::ServiceList { network })?;
                render::services(client.json, &list);
                Ok(())
            }
        },
        Cmd::Apply { file, client } => {
            // Checked here too, so the error names the file and the JSON path.
            let state = read_state_file(&file)?;
            change(&client, &Request::Apply { state })
        }
        Cmd::State { client } => {
            render::state(client.json, &call(&client, &Request::State)?);
            Ok(())
        }
        Cmd::Elements {
            network,
            state: Some(path),
            client,
        } => {
            let state = read_state_file(&path)?;
            if let Some(want) = &network
                && state.network(want).is_none()
            {
                bail!("unknown network {want:?}");
            }
            let out: Vec<String> = (state.networks.iter())
                .filter(|n| network.as_ref().is_none_or(|w| *w == n.name))
                .flat_map(|n| (elements::network_elements(n).into_iter()).map(|e| e.to_string()))
                .collect();
            render::lines(client.json, &out);
            Ok(())
        }
        Cmd::Elements {
            network,
            state: None,
            client,
        } => {
            let out: Vec<String> = call(&client, &Request::Elements { network })?;
            render::lines(client.json, &out);
            Ok(())
        }
        Cmd::Conntrack { network, client } => {
            let flows: Vec<_> = call(&client, &Request::Conntrack { network })?;
            render::conntrack(client.json, &flows);
            Ok(())
        }
        Cmd::Status { client } => {
            render::status(client.json, &call(&client, &Request::Status)?);
            Ok(())
        }
        Cmd::Load {
            state,
            bpffs,
            state_dir,
            tc,
            layouts,
        } => {
            let _locks = one_shot_locks(&state_dir, &bpffs)?;
            let loaded = oneshot::load(&state, &bpffs, &state_dir, tc.mode(), layouts.choice())?;
            for (network, s) in loaded {
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
            let _locks = one_shot_locks(&state_dir, &bpffs)?;
            let n = oneshot::unload(&bpffs, &state_dir, tc.mode())?;
            println!("unloaded {n} networks");
            Ok(())
        }
    }
}
