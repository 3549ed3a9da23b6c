//! The CNI error result: `{"cniVersion","code","msg","details"}` on stdout, exit status non-zero.
use serde::Serialize;

/// The spec's well-known error codes (SPEC.md, "Error"), those this plugin returns.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADDs now (the daemon is unreachable).
    pub const NOT_AVAILABLE: u32 = 50;
    /// Not a reserved code: the daemon refused or could not apply the request (a port held by
    /// another container, a network it would not take). Codes 100+ are the plugin's own.
    pub const REFUSED: u32 = 100;
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CniError {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            cni_version: super::service::LATEST_VERSION.into(),
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// What was being done and what failed, `"{doing}: {failure}"`, as `msg` (a runtime such as
    /// containerd or Nomad logs only `msg`: it must name the failure, not just the step), with
    /// the failure's whole chain as the details.
    pub fn with(code: u32, doing: impl Into<String>, e: &anyhow::Error) -> Self {
        CniError {
            details: format!("{e:#}"),
            ..CniError::new(code, format!("{}: {e}", doing.into()))
        }
    }

    /// The config's version, once it is known (the result must be in the caller's version).
    pub fn version(mut self, v: &str) -> Self {
        v.clone_into(&mut self.cni_version);
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a CNI error serializes")
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}
