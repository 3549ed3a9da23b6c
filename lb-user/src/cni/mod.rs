//! `lb-cni`, a CNI plugin (spec 0.3.0 to 1.1.0) that publishes a container's `portMappings`
//! as a VIP-less `lb` service, in place of the reference `portmap` plugin. It is a client of
//! the daemon's API exactly as the `lb` CLI is ([`crate::api::Client`]); the daemon holds the
//! state, the plugin holds none.
//!
//! Contract with the runtime: the plugin is chained after a `bridge` plugin (its `prevResult`
//! gives the container's addresses, one per family, and the host-side bridge); `ADD` returns only once the
//! service is applied (anything else is a CNI error with nothing left behind) and passes
//! `prevResult` on unchanged; `DEL` and a repeated `ADD` are idempotent.
mod commands;
mod config;
mod error;
mod service;

pub use config::Env;
pub use error::{CniError, code};
pub use service::{SUPPORTED_VERSIONS, service_id};

/// Runs one plugin invocation: the `CNI_*` environment and the config read from stdin. The
/// `Ok` value is the result JSON to print (empty for a command that prints nothing).
pub fn run(env: &Env, stdin: &[u8]) -> Result<String, CniError> {
    commands::run(env, stdin)
}
