//! The commands: each turns the invocation into requests to the daemon, and the daemon's
//! answers into a CNI result or error.
use std::collections::BTreeSet;

use hyper::StatusCode;

use super::{
    config::{Conf, Env, Prev},
    error::{CniError, code},
    service::{self, ID_PREFIX, LATEST_VERSION, SUPPORTED_VERSIONS, service_id},
};
use crate::{
    api::{Client, Done, NetworkSummary, Refused, Request, ServiceEntry, Status},
    core::edit::{Edit, Settings},
    core::model::{Network, Service},
};

pub fn run(env: &Env, stdin: &[u8]) -> Result<String, CniError> {
    if env.command.is_empty() {
        return Err(CniError::new(code::INVALID_ENV, "CNI_COMMAND is not set"));
    }
    if env.command == "VERSION" {
        return Ok(version(stdin));
    }
    let conf = Conf::parse(stdin)?;
    if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "cniVersion {} is not one of {}",
                conf.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let client = Client::named_by(&conf.socket, "the network configuration's \"socket\"");
    match env.command.as_str() {
        "ADD" => add(env, &conf, &client),
        "DEL" => del(env, &conf, &client).map(|()| String::new()),
        "CHECK" => check(env, &conf, &client).map(|()| String::new()),
        "GC" => gc(&conf, &client).map(|()| String::new()),
        "STATUS" => status(&client).map(|()| String::new()),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_COMMAND {other:?} is not a CNI command"),
        )),
    }
    .map_err(|e| e.version(&conf.cni_version))
}

fn version(stdin: &[u8]) -> String {
    let asked = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| LATEST_VERSION.to_owned());
    serde_json::json!({"cniVersion": asked, "supportedVersions": SUPPORTED_VERSIONS}).to_string()
}

/// The daemon's refusal or unreachability as a CNI error: unreachable (or a change saved but
/// not applied) is worth retrying later, a refusal is not.
fn daemon_error(what: &str, e: anyhow::Error) -> CniError {
    let code = match e.downcast_ref::<Refused>() {
        Some(r) if !r.reply.saved => code::REFUSED,
        _ => code::TRY_AGAIN_LATER,
    };
    CniError::with(code, what, &e)
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>()
        .is_some_and(|r| r.status == StatusCode::NOT_FOUND)
}

/// The attachment's service as the config and `prevResult` ask for it.
fn wanted(env: &Env, conf: &Conf) -> Result<(Prev, Service), CniError> {
    let (container, ifname) = env.attachment()?;
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "no prevResult: lb-cni is chained after a plugin (bridge) that gives the container its address",
        )
    })?;
    let prev = Prev::read(prev)?;
    // Every address of the container: a dual-stack one is published on both families.
    let service = service::build(
        &service_id(container, ifname),
        &prev.ips,
        &conf.runtime_config.port_mappings,
    )?;
    Ok((prev, service))
}

fn add(env: &Env, conf: &Conf, client: &Client) -> Result<String, CniError> {
    let (prev, service) = wanted(env, conf)?;
    let result = pass_on(conf);
    if service.ports.is_empty() {
        // Nothing to publish (lb takes no service without a VIP or a port); a previous ADD of
        // the same attachment with ports must not leave them published.
        del(env, conf, client)?;
        return Ok(result);
    }
    let created = ensure_network(client, conf, prev.bridge.as_deref())?;
    let set = Request::ServiceSet {
        network: conf.network.clone(),
        service: service.clone(),
    };
    // The daemon answers a change only once it is applied: 200 means the dataplane has it.
    match client.call::<Done>(&set) {
        Ok(_) => Ok(result),
        Err(e) => {
            let saved = e.downcast_ref::<Refused>().is_some_and(|r| r.reply.saved);
            let mut err = daemon_error(
                &format!(
                    "publishing the ports of {} in lb network {}",
                    service.id, conf.network
                ),
                e,
            );
            if let Err(undo) = undo_add(client, conf, &service.id, saved, created) {
                err.details = format!("{}; and undoing it failed: {undo:#}", err.details);
            }
            Err(err)
        }
    }
}

/// Takes back what a failed ADD left: the service when the daemon saved it, and the network
/// when this ADD created it and nothing else joined it since.
fn undo_add(
    client: &Client,
    conf: &Conf,
    id: &str,
    saved: bool,
    created: bool,
) -> anyhow::Result<()> {
    if saved {
        remove_service(client, &conf.network, id)?;
    }
    if created {
        let nets: Vec<NetworkSummary> = client.call(&Request::NetworkList)?;
        if (nets.iter()).any(|n| n.name == conf.network && n.services == 0) {
            accept_saved(client.call::<Done>(&Request::NetworkRm {
                name: conf.network.clone(),
            }))?;
        }
    }
    Ok(())
}

/// A removal the daemon saved but has not applied yet is done as far as the desired state
/// goes (the daemon retries the apply); it is not a reason to fail a DEL.
fn accept_saved(r: anyhow::Result<Done>) -> anyhow::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.downcast_ref::<Refused>().is_some_and(|r| r.reply.saved) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

fn remove_service(client: &Client, network: &str, id: &str) -> anyhow::Result<()> {
    accept_saved(client.call::<Done>(&Request::ServiceRm {
        network: network.to_owned(),
        id: id.to_owned(),
        generation: None,
    }))
}

/// `prevResult` as this plugin's result, in the config's version: the 0.3.0 to 1.1.0 results
/// have the same `interfaces`/`ips`/`routes`/`dns`, so only the version field changes.
fn pass_on(conf: &Conf) -> String {
    let mut result = conf
        .prev_result
        .clone()
        .unwrap_or_else(|| serde_json::json!({}));
    if let Some(fields) = result.as_object_mut() {
        fields.insert("cniVersion".into(), conf.cni_version.clone().into());
    }
    result.to_string()
}

/// Makes the lb network exist with the external interfaces and the bridge; true when this
/// call created it. The bridge is created by the chain's bridge plugin on the node's first
/// ADD, so a network made before it (or by an earlier ADD on another bridge) gains it here.
fn ensure_network(client: &Client, conf: &Conf, bridge: Option<&str>) -> Result<bool, CniError> {
    let mut want = conf.external_interfaces.clone();
    if let Some(b) = bridge.filter(|b| !want.iter().any(|w| w == b)) {
        want.push(b.to_owned());
    }
    let err = |what: &str| {
        let what = format!("{what} lb network {}", conf.network);
        move |e| daemon_error(&what, e)
    };
    let nets: Vec<NetworkSummary> = client
        .call(&Request::NetworkList)
        .map_err(err("listing networks for"))?;
    let Some(have) = nets.iter().find(|n| n.name == conf.network) else {
        let network: Network = serde_json::from_value(serde_json::json!({
            "name": conf.network,
            "interfaces": want,
            "netns": conf.netns,
        }))
        .map_err(|e| CniError::with(code::INVALID_CONFIG, "the lb network's fields", &e.into()))?;
        return match client.call::<Done>(&Request::NetworkAdd { network }) {
            Ok(_) => Ok(true),
            // Another ADD created it meanwhile: join it as if it had been there.
            Err(e)
                if e.downcast_ref::<Refused>()
                    .is_some_and(|r| r.status == StatusCode::CONFLICT) =>
            {
                ensure_network(client, conf, bridge).map(|_| false)
            }
            Err(e) => {
                // Saved but not applied: the network would stay in the desired state with
                // no service of this ADD in it; take it back (nothing else can be in it yet).
                if e.downcast_ref::<Refused>().is_some_and(|r| r.reply.saved) {
                    let rm = Request::NetworkRm {
                        name: conf.network.clone(),
                    };
                    if let Err(undo) = accept_saved(client.call::<Done>(&rm)) {
                        tracing::warn!(network = conf.network, "taking the network back: {undo:#}");
                    }
                }
                Err(err("creating")(e))
            }
        };
    };
    if want.iter().all(|w| have.interfaces.contains(w)) {
        return Ok(false);
    }
    // Added by name, not by writing back a list read before: two ADDs at once each add
    // their own, and nothing another client changed meanwhile is lost.
    let add = want
        .into_iter()
        .filter(|w| !have.interfaces.contains(w))
        .collect();
    client
        .call::<Done>(&Request::Changes {
            changes: vec![Edit::NetworkSet {
                network: conf.network.clone(),
                settings: Settings {
                    add_interfaces: add,
                    ..Settings::default()
                },
            }],
            dry_run: false,
        })
        .map_err(err("adding the bridge to"))?;
    Ok(false)
}

fn del(env: &Env, conf: &Conf, client: &Client) -> Result<(), CniError> {
    let (container, ifname) = env.attachment()?;
    let id = service_id(container, ifname);
    remove_service(client, &conf.network, &id).map_err(|e| {
        daemon_error(
            &format!("removing {id} from lb network {}", conf.network),
            e,
        )
    })
}

fn check(env: &Env, conf: &Conf, client: &Client) -> Result<(), CniError> {
    let (_, want) = wanted(env, conf)?;
    let entries: Vec<ServiceEntry> = client
        .call(&Request::ServiceList {
            network: Some(conf.network.clone()),
        })
        .map_err(|e| daemon_error(&format!("listing lb network {}", conf.network), e))?;
    let have: Vec<&Service> = (entries.iter().map(|e| &e.service))
        .filter(|s| s.id == want.id)
        .collect();
    let fail = |msg: String| Err(CniError::new(code::REFUSED, msg));
    match (have.as_slice(), want.ports.is_empty()) {
        ([], true) => Ok(()),
        ([], false) => fail(format!(
            "service {} is not in lb network {}",
            want.id, conf.network
        )),
        ([s], false) if service::matches(s, &want) => Ok(()),
        (have, _) => fail(format!(
            "service {} in lb network {} is {:?}, not {:?}",
            want.id, conf.network, have, want
        )),
    }
}

fn gc(conf: &Conf, client: &Client) -> Result<(), CniError> {
    let valid: BTreeSet<String> = (conf.valid_attachments.iter())
        .map(|a| service_id(&a.container_id, &a.ifname))
        .collect();
    let entries: Vec<ServiceEntry> = match client.call(&Request::ServiceList {
        network: Some(conf.network.clone()),
    }) {
        Ok(entries) => entries,
        Err(e) if is_not_found(&e) => return Ok(()),
        Err(e) => {
            return Err(daemon_error(
                &format!("listing lb network {}", conf.network),
                e,
            ));
        }
    };
    let stale: BTreeSet<&str> = (entries.iter().map(|e| e.service.id.as_str()))
        .filter(|id| id.starts_with(ID_PREFIX) && !valid.contains(*id))
        .collect();
    for id in stale {
        tracing::info!(
            service = id,
            network = conf.network,
            "GC: no such attachment"
        );
        remove_service(client, &conf.network, id)
            .map_err(|e| daemon_error(&format!("GC of {id}"), e))?;
    }
    Ok(())
}

fn status(client: &Client) -> Result<(), CniError> {
    client
        .call::<Status>(&Request::Status)
        .map(|_| ())
        .map_err(|e| CniError::with(code::NOT_AVAILABLE, "the lb daemon is not available", &e))
}
