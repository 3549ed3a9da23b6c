//! Answering the API's requests: each write is one change (an edit, a batch, a whole state)
//! handed to the write path ([`Daemon::commit`]); each read is answered from the desired
//! state and, for flows and counters, the dataplane.
use std::net::SocketAddr;

use anyhow::Context as _;

use super::{Change, Daemon};
use crate::{
    api::{
        ApiError, BackendState, BackendStats, ConntrackEntry, ElementEntry, NetworkSummary, Reply,
        Request, ServiceEntry,
    },
    core::{
        compose::ComposedNetwork,
        edit::Edit,
        elements::{claims, network_elements},
        model::{Family, Network, PortKey, Proto, Service},
    },
};

impl Daemon {
    /// Answers one API request: a write as the change it makes (see [`Daemon::commit`]), a
    /// read from the desired state and the dataplane.
    pub fn handle(&mut self, req: Request) -> Result<Reply, ApiError> {
        match req {
            Request::NetworkAdd { network } => self.edit(Edit::NetworkAdd { network }),
            Request::NetworkRm { name } => self.edit(Edit::NetworkRm { network: name }),
            Request::ServiceSet { network, service } => {
                self.edit(Edit::ServiceSet { network, service })
            }
            Request::ServiceRm {
                network,
                id,
                generation,
            } => self.edit(Edit::ServiceRm {
                network,
                service: id,
                generation,
            }),
            Request::Changes { changes, dry_run } => {
                let what = match changes.as_slice() {
                    [one] => one.describe(),
                    many => format!("{} changes applied as one", many.len()),
                };
                self.commit(Change::Edits(changes), what, dry_run)
            }
            Request::Apply { state, dry_run } => {
                let what = match state.networks.len() {
                    1 => "the state of 1 network applied".to_owned(),
                    n => format!("the state of {n} networks applied"),
                };
                self.commit(Change::Replace(state), what, dry_run)
            }
            Request::NetworkList => Ok(Reply::Networks(self.network_list())),
            Request::ServiceList { network } => {
                let selected: Vec<ComposedNetwork> =
                    self.selected(&network)?.into_iter().cloned().collect();
                let mut out = Vec::new();
                for n in selected {
                    out.extend(self.service_entries(&n));
                }
                Ok(Reply::Services(out))
            }
            Request::Elements { network } => Ok(Reply::Elements(
                (self.selected(&network)?.into_iter())
                    .flat_map(|n| {
                        (network_elements(n).into_iter()).map(|e| ElementEntry::new(&n.name, e))
                    })
                    .collect(),
            )),
            Request::Conntrack { network } => Ok(Reply::Conntrack(self.conntrack(&network)?)),
            Request::Status => Ok(Reply::Status(self.status())),
            Request::State => Ok(Reply::State(self.local_state())),
            // The server takes watches to the actor itself (they stream).
            Request::ClusterChange { .. } => Err(ApiError::bad_request(
                "a cluster change goes to etcd; see POST /v1/cluster/changes",
            )),
            Request::Watch { .. } => {
                Err(ApiError::bad_request("a watch streams; see GET /v1/watch"))
            }
        }
    }

    /// Commits the one edit of a request, its answer saying what it did.
    fn edit(&mut self, edit: Edit) -> Result<Reply, ApiError> {
        let what = edit.describe();
        self.commit(Change::Edits(vec![edit]), what, false)
    }

    fn network_list(&self) -> Vec<NetworkSummary> {
        (self.desired.networks())
            .map(|n| NetworkSummary {
                name: n.name.clone(),
                interfaces: n.interfaces.clone(),
                netns: n.netns.clone(),
                mode: n.mode,
                attach: n.attach,
                masquerade: n.masquerade,
                services: n.services.len(),
            })
            .collect()
    }

    /// The live flows of the network named (or of every network), each with the service it
    /// was sent to.
    fn conntrack(&mut self, network: &Option<String>) -> Result<Vec<ConntrackEntry>, ApiError> {
        let selected: Vec<ComposedNetwork> = self.selected(network)?.into_iter().cloned().collect();
        let mut out = Vec::new();
        for n in selected {
            let flows = (self.dp.flows(&n))
                .with_context(|| format!("network {}: reading its flows", n.name))
                .map_err(|e| ApiError::internal(&e, false))?;
            out.extend(flows.into_iter().map(|mut flow| {
                flow.service = frontend_owner(&n, flow.proto, flow.frontend).map(|s| s.id.clone());
                ConntrackEntry {
                    network: n.name.clone(),
                    flow,
                }
            }));
        }
        Ok(out)
    }

    fn network(&self, name: &str) -> Result<&ComposedNetwork, ApiError> {
        self.desired
            .network(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown network {name:?}")))
    }

    /// The network named, or every network.
    fn selected(&self, network: &Option<String>) -> Result<Vec<&ComposedNetwork>, ApiError> {
        match network {
            Some(n) => Ok(vec![self.network(n)?]),
            None => Ok(self.desired.networks().collect()),
        }
    }

    /// `network`'s contributions as `lb service list` shows them: frontends, and each
    /// backend's state, live flows and counters (read once for the network).
    fn service_entries(&mut self, network: &ComposedNetwork) -> Vec<ServiceEntry> {
        let counts = self.dp.counts(network).unwrap_or_default();
        let flows = self.dp.flows(network).ok();
        let mut out = Vec::new();
        for service in &network.services {
            let keys: Vec<String> = claims(service).map(|k| k.to_string()).collect();
            let backends = (service.backends.iter())
                .map(|b| {
                    let (mut packets, mut bytes, mut seen) = (0, 0, false);
                    for c in counts
                        .iter()
                        .filter(|c| c.backend == Some(b.ip) && keys.contains(&c.frontend))
                    {
                        (packets, bytes, seen) = (packets + c.packets, bytes + c.bytes, true);
                    }
                    let flows = flows.as_ref().map(|f| {
                        (f.iter())
                            .filter(|f| f.backend.ip() == b.ip)
                            .filter(|f| {
                                frontend_owner(network, f.proto, f.frontend)
                                    .is_some_and(|s| s.id == service.id)
                            })
                            .count() as u64
                    });
                    BackendStats {
                        address: b.ip,
                        state: if b.disabled {
                            BackendState::Disabled
                        } else {
                            BackendState::Active
                        },
                        flows,
                        packets: seen.then_some(packets),
                        bytes: seen.then_some(bytes),
                    }
                })
                .collect();
            out.push(ServiceEntry {
                network: network.name.clone(),
                service: service.clone(),
                frontends: (service.vips.iter().map(|v| v.to_string()))
                    .chain(service.ports.iter().map(|p| p.to_string()))
                    .collect(),
                backends,
            });
        }
        out
    }
}

/// The contribution of `network` that a flow to `frontend` over `proto` was sent by: the
/// one with that VIP, else the one publishing that port (on that address, or on every address
/// of its family). Generations of one service share their frontends, so any of them names the
/// service.
fn frontend_owner(network: &Network, proto: Proto, frontend: SocketAddr) -> Option<&Service> {
    let addr = frontend.ip();
    // The packet's own destination, as a key bound to it: a published key matches it where
    // one packet could match both.
    let packet = PortKey::new(Some(addr), Family::of(addr), proto, frontend.port());
    (network.services.iter())
        .find(|s| s.vips.contains(&addr))
        .or_else(|| {
            (network.services.iter()).find(|s| s.port_keys().any(|(k, _)| k.overlaps(&packet)))
        })
}
