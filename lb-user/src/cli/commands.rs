//! What each command does: the daemon, a client request and its rendering, or the one-shot
//! `load`/`unload`.
//!
//! One file because it is one dispatch, a match over `args::Cmd` whose arms each turn a
//! command's arguments into a request and its rendering; what is longer than that (the
//! cluster's writes, the rendering, the version) lives in its own module already.
use std::{
    collections::BTreeSet,
    io::Read as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use lb_user::{
    api::{self, Done, ElementEntry, Request, Status},
    core::edit::{Edit, Settings},
    core::model::{self, Backend, DesiredState, FlowTimeouts, Network, PortConfig, Service},
    core::{compose::ComposedNetwork, elements},
    daemon,
    lock::Lock,
    oneshot,
};

use super::{
    args::{BackendArgs, BackendCmd, Cli, Cmd, Global, NetworkCmd, ServiceCmd},
    render,
};

/// A flag's value that clap let through and lb cannot read (`--backend 10.0.0.300`): a usage
/// error, exit 2, nothing asked.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct Usage(pub anyhow::Error);

/// A change was saved but its networks are not applied yet (`--wait` ran out): exit 3.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotApplied(pub String);

/// Every value of a repeated flag, the first bad one named with its flag.
fn parse_each<T>(values: &[String], flag: &str) -> Result<Vec<T>>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    (values.iter())
        .map(|v| {
            (v.parse::<T>())
                .map_err(|e| Usage(anyhow::Error::new(e).context(format!("{flag} {v}"))))
        })
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

/// Sends `req` and reads the reply as `T`, or the daemon's refusal as our error.
fn call<T: serde::de::DeserializeOwned>(global: &Global, req: &Request) -> Result<T> {
    api::Client::new(&global.socket).call(req)
}

/// A change: sends it and prints what was done.
fn change(global: &Global, req: &Request) -> Result<()> {
    render::done(global.json, &call(global, req)?);
    Ok(())
}

/// A file's text and its name for messages, or stdin's for `-`.
fn read_file(path: &Path) -> Result<(String, String)> {
    if path == Path::new("-") {
        let mut text = String::new();
        (std::io::stdin().read_to_string(&mut text)).context("reading stdin")?;
        Ok((text, "stdin".to_owned()))
    } else {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok((text, path.display().to_string()))
    }
}

/// A desired-state file, or stdin for `-`.
fn read_state_file(path: &Path) -> Result<DesiredState> {
    let (text, name) = read_file(path)?;
    DesiredState::from_json(&text).with_context(|| name)
}

/// One edit: sends it and prints what was done.
fn edit(global: &Global, e: Edit) -> Result<()> {
    change(
        global,
        &Request::Changes {
            changes: vec![e],
            dry_run: false,
        },
    )
}

/// `lb apply`: sends the state (a dry run changes nothing) and prints what changed; with
/// `wait`, blocks until every network it changed is applied, or exits 3 when `wait` runs out.
fn apply(global: &Global, file: &Path, dry_run: bool, wait: Option<u64>) -> Result<()> {
    // Checked here too, so the error names the file and the JSON path.
    let state = read_state_file(file)?;
    let networks: BTreeSet<String> =
        match api::Client::new(&global.socket).call::<Done>(&Request::Apply { state, dry_run }) {
            Ok(done) => {
                render::done(global.json, &done);
                done.changes.into_iter().map(|c| c.network).collect()
            }
            // Saved, not applied yet: which networks is in the status.
            Err(e) if wait.is_some() && saved(&e) => {
                // Under --json stderr carries one error document, the last word.
                if !global.json {
                    eprintln!("lb: {} (waiting)", format!("{e:#}").replace('\n', " "));
                }
                let status: Status = call(global, &Request::Status)?;
                (status.networks.into_iter())
                    .filter(|n| !n.applied)
                    .map(|n| n.name)
                    .collect()
            }
            Err(e) => return Err(e),
        };
    let Some(secs) = wait.filter(|_| !dry_run) else {
        return Ok(());
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let status: Status = call(global, &Request::Status)?;
        let pending: Vec<String> = (status.networks.iter())
            .filter(|n| networks.contains(&n.name) && !n.applied)
            .map(|n| {
                format!(
                    "{} ({})",
                    n.name,
                    n.error.as_deref().unwrap_or("not applied")
                )
            })
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(NotApplied(format!(
                "saved, but not applied after {secs}s (the daemon keeps retrying): {}",
                pending.join("; ")
            ))
            .into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether `e` is the daemon's "saved, not applied yet".
pub fn saved(e: &anyhow::Error) -> bool {
    e.downcast_ref::<api::Refused>()
        .is_some_and(|r| r.reply.saved)
}

/// The locks `lb load`/`lb unload` hold while they write: their record dir's, and the bpffs
/// lock a daemon holds, so neither writes under the other.
fn one_shot_locks(record_dir: &std::path::Path, bpffs: &std::path::Path) -> Result<[Lock; 2]> {
    Ok([
        Lock::dir(record_dir, "the record dir")?,
        Lock::dir(bpffs, "the bpffs dir")?,
    ])
}

pub fn run(cli: Cli, global: &Global) -> Result<()> {
    let cluster = super::cluster::of(global).map_err(Usage)?;
    // Only the commands that can act on the cluster take --cluster; of them, `service list`
    // is the node's (what it serves).
    if cluster.is_some()
        && let Cmd::Service {
            cmd: ServiceCmd::List { .. },
            ..
        } = &cli.cmd
    {
        return Err(super::cluster::on_the_node("service list"));
    }
    match cli.cmd {
        Cmd::Daemon {
            state_dir,
            import,
            bpffs,
            dataplane,
            metrics,
            tc,
            retry_secs,
            gc_secs,
            node,
            layouts,
            sizes,
            ..
        } => daemon::run(daemon::Options {
            state_dir,
            import,
            socket: global.socket.clone(),
            bpffs,
            dataplane: dataplane.choice(),
            tc_mode: tc.mode(),
            on_incompatible: layouts.choice(),
            metrics,
            retry: Duration::from_secs(retry_secs.max(1)),
            gc: Duration::from_secs(gc_secs.max(1)),
            map_sizes: sizes.map_sizes(),
            cluster: match cluster {
                Some(c) => Some((c, node.map_or_else(hostname, Ok)?)),
                None => None,
            },
        }),
        Cmd::Network { cmd, .. } => match cmd {
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
                    timeouts.set(spec).map_err(|e| Usage(e.into()))?;
                }
                // Checked here, as a port is: a value the CLI can check never reaches the daemon.
                timeouts
                    .validate()
                    .map_err(|e| Usage(anyhow::Error::new(e).context("--timeout")))?;
                let network = Network {
                    name,
                    interfaces,
                    netns,
                    mode,
                    attach,
                    masquerade,
                    fast_path,
                    hold_ports,
                    timeouts,
                    services: vec![],
                };
                change(global, &Request::NetworkAdd { network })
            }
            NetworkCmd::Rm { name } => change(global, &Request::NetworkRm { name }),
            NetworkCmd::Set {
                name,
                interfaces,
                add_interfaces,
                remove_interfaces,
                netns,
                own_netns,
                mode,
                attach,
                masquerade,
                fast_path,
                hold_ports,
                timeouts: specs,
            } => {
                let mut timeouts = std::collections::BTreeMap::new();
                for spec in &specs {
                    let (name, secs) = FlowTimeouts::parse(spec).map_err(|e| Usage(e.into()))?;
                    let mut alone = FlowTimeouts::default();
                    alone.set_value(name, secs).map_err(|e| Usage(e.into()))?;
                    alone
                        .validate()
                        .map_err(|e| Usage(anyhow::Error::new(e).context("--timeout")))?;
                    timeouts.insert(name.to_owned(), secs);
                }
                let settings = Settings {
                    interfaces: (!interfaces.is_empty()).then_some(interfaces),
                    add_interfaces,
                    remove_interfaces,
                    netns: if own_netns {
                        Some(None)
                    } else {
                        netns.map(Some)
                    },
                    mode,
                    attach,
                    masquerade,
                    fast_path,
                    hold_ports,
                    timeouts,
                };
                if settings.is_empty() {
                    return Err(Usage(anyhow::anyhow!(
                        "nothing to set: give at least one setting (lb network set --help)"
                    ))
                    .into());
                }
                edit(
                    global,
                    Edit::NetworkSet {
                        network: name,
                        settings,
                    },
                )
            }
            NetworkCmd::List { network } => {
                let mut list: Vec<lb_user::api::NetworkSummary> =
                    call(global, &Request::NetworkList)?;
                if let Some(want) = &network {
                    list.retain(|n| n.name == *want);
                    if list.is_empty() {
                        bail!("unknown network {want:?}");
                    }
                }
                render::networks(global.json, &list);
                Ok(())
            }
        },
        Cmd::Service { cmd, .. } => match cmd {
            ServiceCmd::Set {
                network,
                service_id,
                generation,
                vips,
                backends,
                ports,
                if_revision,
            } => {
                let mut vips = (vips.iter().map(|v| model::parse_ip(v)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Usage(anyhow::Error::new(e).context("--vip")))?;
                vips.sort_unstable();
                let service = Service {
                    id: service_id,
                    generation,
                    vips,
                    backends: parse_each::<Backend>(&backends, "--backend")?,
                    ports: parse_each::<PortConfig>(&ports, "--port")?,
                };
                if let Some(c) = &cluster {
                    let e = Edit::ServiceSet { network, service };
                    return super::cluster::edit(global, c, e, if_revision);
                }
                no_revision(if_revision)?;
                change(global, &Request::ServiceSet { network, service })
            }
            ServiceCmd::Rm {
                network,
                service_id,
                generation,
                if_revision,
            } => {
                if let Some(c) = &cluster {
                    let e = Edit::ServiceRm {
                        network,
                        service: service_id,
                        generation,
                    };
                    return super::cluster::edit(global, c, e, if_revision);
                }
                no_revision(if_revision)?;
                change(
                    global,
                    &Request::ServiceRm {
                        network,
                        id: service_id,
                        generation,
                    },
                )
            }
            ServiceCmd::List { network } => {
                let list: Vec<_> = call(global, &Request::ServiceList { network })?;
                render::services(global.json, &list);
                Ok(())
            }
            ServiceCmd::Backend { cmd } => {
                let ip = |a: &BackendArgs| {
                    model::parse_ip(&a.backend)
                        .map_err(|e| Usage(anyhow::Error::new(e).context("backend")))
                };
                let e = match cmd {
                    BackendCmd::Add(a) => Edit::BackendAdd {
                        backend: (a.backend.parse::<Backend>())
                            .map_err(|e| Usage(anyhow::Error::new(e).context("backend")))?,
                        network: a.network,
                        service: a.service_id,
                        generation: a.generation,
                    },
                    BackendCmd::Rm(a) => Edit::BackendRm {
                        ip: ip(&a)?,
                        network: a.network,
                        service: a.service_id,
                        generation: a.generation,
                    },
                    BackendCmd::Disable(a) => Edit::BackendDisable {
                        ip: ip(&a)?,
                        network: a.network,
                        service: a.service_id,
                        generation: a.generation,
                    },
                    BackendCmd::Enable(a) => Edit::BackendEnable {
                        ip: ip(&a)?,
                        network: a.network,
                        service: a.service_id,
                        generation: a.generation,
                    },
                };
                match &cluster {
                    Some(c) => super::cluster::edit(global, c, e, None),
                    None => edit(global, e),
                }
            }
        },
        Cmd::Batch { file, dry_run, .. } => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Batch {
                changes: Vec<Edit>,
            }
            let (text, name) = read_file(&file)?;
            let mut de = serde_json::Deserializer::from_str(&text);
            let batch: Batch = serde_path_to_error::deserialize(&mut de)
                .map_err(|e| anyhow::anyhow!("{name}: {}: {}", e.path(), e.inner()))?;
            change(
                global,
                &Request::Changes {
                    changes: batch.changes,
                    dry_run,
                },
            )
        }
        Cmd::Apply {
            file,
            stray,
            dry_run,
            wait,
            ..
        } => {
            let file = match (file, stray) {
                (Some(f), None) => f,
                (None, Some(f)) => {
                    return Err(Usage(anyhow::anyhow!(
                        "lb apply takes the state file with -f: lb apply -f {}",
                        f.display()
                    ))
                    .into());
                }
                (None, None) => {
                    return Err(Usage(anyhow::anyhow!(
                        "lb apply needs the state file: -f FILE (- reads stdin)"
                    ))
                    .into());
                }
                (Some(_), Some(f)) => {
                    return Err(Usage(anyhow::anyhow!(
                        "lb apply takes one state file (-f); {} is one too many",
                        f.display()
                    ))
                    .into());
                }
            };
            match &cluster {
                Some(c) => {
                    let (text, name) = read_file(&file)?;
                    super::cluster::apply(global, c, &text, &name, dry_run)
                }
                None => apply(global, &file, dry_run, wait),
            }
        }
        Cmd::Version { .. } => {
            super::version::show(global.json);
            Ok(())
        }
        Cmd::Schema => {
            let schema = lb_user::core::schema::desired_state();
            let text = serde_json::to_string_pretty(&schema).context("printing the schema")?;
            println!("{text}");
            Ok(())
        }
        Cmd::Nodes { .. } => match &cluster {
            Some(c) => super::cluster::nodes(global, c),
            None => Err(Usage(anyhow::anyhow!(
                "lb nodes lists a cluster's nodes: give --cluster etcd://HOST:PORT (or LB_CLUSTER)"
            ))
            .into()),
        },
        Cmd::Watch { from, .. } => {
            let mut out = std::io::stdout().lock();
            api::Client::new(&global.socket).watch(from, |line| {
                use std::io::Write as _;
                let text = if global.json {
                    line.to_owned()
                } else {
                    render::event(line)
                };
                // A closed pipe (`lb watch | head`) ends the watch.
                writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
            })
        }
        Cmd::State { .. } => match &cluster {
            Some(c) => super::cluster::state(global, c),
            None => {
                render::state(global.json, &call(global, &Request::State)?);
                Ok(())
            }
        },
        Cmd::Elements {
            network,
            state: Some(path),
            ..
        } => {
            let state = read_state_file(&path)?;
            if let Some(want) = &network
                && state.network(want).is_none()
            {
                bail!("unknown network {want:?}");
            }
            let out: Vec<ElementEntry> = (state.networks.iter())
                .filter(|n| network.as_ref().is_none_or(|w| *w == n.name))
                .flat_map(|n| {
                    let n = ComposedNetwork::new(n.clone());
                    (elements::network_elements(&n).into_iter())
                        .map(move |e| ElementEntry::new(&n.name, e))
                        .collect::<Vec<_>>()
                })
                .collect();
            render::elements(global.json, &out);
            Ok(())
        }
        Cmd::Elements {
            network,
            state: None,
            ..
        } => {
            let out: Vec<ElementEntry> = call(global, &Request::Elements { network })?;
            render::elements(global.json, &out);
            Ok(())
        }
        Cmd::Conntrack { network, .. } => {
            let flows: Vec<_> = call(global, &Request::Conntrack { network })?;
            render::conntrack(global.json, &flows);
            Ok(())
        }
        Cmd::Status { network, .. } => {
            let mut status: Status = call(global, &Request::Status)?;
            if let Some(want) = &network {
                status.networks.retain(|n| n.name == *want);
                if status.networks.is_empty() {
                    bail!("unknown network {want:?}");
                }
            }
            render::status(global.json, &status);
            Ok(())
        }
        Cmd::Load {
            state,
            bpffs,
            record_dir,
            tc,
            layouts,
            ..
        } => {
            let _locks = one_shot_locks(&record_dir, &bpffs)?;
            let loaded = oneshot::load(&state, &bpffs, &record_dir, tc.mode(), layouts.choice())?;
            render::loaded(global.json, &bpffs, &loaded);
            Ok(())
        }
        Cmd::Unload {
            bpffs,
            record_dir,
            tc,
            ..
        } => {
            let _locks = one_shot_locks(&record_dir, &bpffs)?;
            let n = oneshot::unload(&bpffs, &record_dir, tc.mode())?;
            render::show(global.json, &serde_json::json!({ "unloaded": n }), |_| {
                println!("unloaded {n} networks")
            });
            Ok(())
        }
    }
}

/// `--if-revision` without `--cluster`: the node's changes have no etcd revision.
fn no_revision(if_revision: Option<i64>) -> Result<()> {
    if if_revision.is_some() {
        return Err(Usage(anyhow::anyhow!(
            "--if-revision is an etcd revision: it goes with --cluster"
        ))
        .into());
    }
    Ok(())
}

/// This machine's hostname: a node's default name in the cluster.
fn hostname() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the hostname (give --node NAME)")?;
    Ok(name.trim().to_owned())
}
