//! `lb status`: how each network stands (applied or failing and why, its flows, what the
//! node lacks for it, its last sync) with the store, the dataplane and the cluster.
use std::time::SystemTime;

use super::Daemon;
use crate::{
    api::{LastSync, NetworkStatus, Status, StoreStatus},
    dataplane::FlowState,
    node::check,
};

impl Daemon {
    pub(super) fn status(&mut self) -> Status {
        let mut networks = Vec::new();
        let names: Vec<String> = self.desired.networks().map(|n| n.name.clone()).collect();
        for name in names {
            let n = self.desired.network(&name).expect("listed above");
            let counted = self.dp.flow_stats(n);
            let mut warnings = self
                .dp
                .warnings(n)
                .unwrap_or_else(|e| vec![format!("checking the node: {e:#}")]);
            warnings.extend(self.holder.warnings(&n.name));
            if let Ok(missing) = check::missing_interfaces(n)
                && !missing.is_empty()
            {
                warnings.push(format!(
                    "interface {} does not exist (yet): served from when it appears",
                    missing.join(", ")
                ));
            }
            let path = self.dp.path(n);
            let n = self.desired.network(&name).expect("listed above");
            networks.push(NetworkStatus {
                applied: !self.errors.contains_key(&n.name) && !self.dirty.contains(&n.name),
                error: self.errors.get(&n.name).cloned(),
                attach: n.attach,
                mode: n.mode,
                path,
                services: n.services.len(),
                backends: n.backend_addrs().count(),
                flows: counted.as_ref().map(|c| c.by_state.iter().sum()),
                flows_by_state: counted.as_ref().map(|c| {
                    (FlowState::ALL.iter())
                        .zip(c.by_state)
                        .filter(|(s, _)| s.shown_for(n))
                        .map(|(s, n)| (*s, n))
                        .collect()
                }),
                flow_entries: counted.as_ref().and_then(|c| c.entries),
                warnings,
                last_sync: self.stats.last_sync.get(&n.name).map(|(at, s)| LastSync {
                    at_unix: (at.duration_since(SystemTime::UNIX_EPOCH)).map_or(0, |d| d.as_secs()),
                    ago_secs: at.elapsed().map_or(0, |d| d.as_secs()),
                    written: s.written,
                    deleted: s.deleted,
                    flows_flushed: s.flows_flushed,
                }),
                name: n.name.clone(),
                interfaces: n.interfaces.clone(),
            });
        }
        Status {
            dataplane: self.dp.kind().to_string(),
            reason: self.dataplane_reason.clone(),
            store: Some(StoreStatus {
                path: self.store.path().display().to_string(),
                revision: self.store.revision(),
                bytes: self.store.bytes(),
            }),
            left: self.left.iter().cloned().collect(),
            last_change: self.last_change,
            cluster: self.cluster_status(),
            networks,
        }
    }
}
