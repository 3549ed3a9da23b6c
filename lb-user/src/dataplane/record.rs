//! A dataplane that programs nothing and records what it is asked, in order — netavark's
//! `fwnone` firewall driver plays this part there. With it the daemon's own logic (which
//! networks a change applies, over which previous network and with which composition, what
//! a failed apply leaves, what a restart removes) is asserted without root, a kernel or a
//! namespace.
//!
//! Handles are cheap clones sharing one record: a test keeps one to read the calls and to
//! make applies fail, and hands another, boxed, to the daemon.
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
};

use anyhow::{Result, bail};

use super::{Count, Dataplane, Flow, FlowStats, Kind, SyncStats};
use crate::core::{
    compose::{Composed, ComposedNetwork},
    model::Network,
};

/// One call the dataplane was asked, with what it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Apply {
        network: Box<Network>,
        /// The composition it was handed.
        composed: Box<Composed>,
        previous: Option<Box<Network>>,
    },
    Remove(String),
    RemoveOthers(Vec<String>),
    Retire(Vec<String>),
    Refresh(String),
}

#[derive(Default)]
struct Shared {
    calls: Vec<Call>,
    /// Networks whose applies (and removals) fail while named here.
    failing: BTreeSet<String>,
}

#[derive(Clone, Default)]
pub struct Recording(Arc<Mutex<Shared>>);

impl Recording {
    pub fn new() -> Recording {
        Recording::default()
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every call so far, in order, and forgets them.
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut self.shared().calls)
    }

    /// Makes every apply and removal of network `name` fail (`false`: succeed again).
    pub fn fail(&self, name: &str, failing: bool) {
        let mut s = self.shared();
        if failing {
            s.failing.insert(name.to_owned());
        } else {
            s.failing.remove(name);
        }
    }

    fn call(&self, call: Call, network: &str) -> Result<()> {
        let mut s = self.shared();
        s.calls.push(call);
        if s.failing.contains(network) {
            bail!("network {network}: a failure the test asked for");
        }
        Ok(())
    }
}

impl Dataplane for Recording {
    fn kind(&self) -> Kind {
        Kind::Recording
    }

    fn supports(&self, _network: &Network) -> Result<()> {
        Ok(())
    }

    fn apply(
        &mut self,
        network: &ComposedNetwork,
        previous: Option<&ComposedNetwork>,
    ) -> Result<SyncStats> {
        let call = Call::Apply {
            network: Box::new(network.network().clone()),
            composed: Box::new(network.composed().clone()),
            previous: previous.map(|p| Box::new(p.network().clone())),
        };
        self.call(call, &network.name)?;
        Ok(SyncStats::default())
    }

    fn remove(&mut self, network: &Network) -> Result<()> {
        self.call(Call::Remove(network.name.clone()), &network.name)
    }

    fn others(&mut self, _keep: &[&str]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    fn remove_others(&mut self, keep: &[&str]) -> Result<Vec<String>> {
        let keep = keep.iter().map(|k| (*k).to_owned()).collect();
        self.shared().calls.push(Call::RemoveOthers(keep));
        Ok(Vec::new())
    }

    fn retire(&mut self, networks: &[Network]) -> Result<()> {
        let names = networks.iter().map(|n| n.name.clone()).collect();
        self.shared().calls.push(Call::Retire(names));
        Ok(())
    }

    fn flows(&mut self, _network: &ComposedNetwork) -> Result<Vec<Flow>> {
        Ok(Vec::new())
    }

    fn counts(&mut self, _network: &ComposedNetwork) -> Result<Vec<Count>> {
        Ok(Vec::new())
    }

    fn flow_stats(&mut self, _network: &ComposedNetwork) -> Option<FlowStats> {
        None
    }

    fn refresh(&mut self, network: &ComposedNetwork, _firewall: bool) -> Result<()> {
        self.call(Call::Refresh(network.name.clone()), &network.name)
    }
}
