//! What a plugin invocation is given: the `CNI_*` environment and the network configuration
//! on stdin (with `prevResult` and `runtimeConfig` inserted by the runtime).
use std::{net::IpAddr, path::PathBuf};

use serde::Deserialize;

use super::error::{CniError, code};
use crate::api::DEFAULT_SOCKET;

/// The `CNI_*` environment of one invocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    pub command: String,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    pub path: Option<String>,
}

impl Env {
    /// Reads the process environment; empty variables count as unset, as libcni sets them.
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Env {
            command: var("CNI_COMMAND").unwrap_or_default(),
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
            path: var("CNI_PATH"),
        }
    }

    /// The container id and interface name, which ADD, DEL and CHECK all require.
    pub fn attachment(&self) -> Result<(&str, &str), CniError> {
        fn need<'a>(v: &'a Option<String>, name: &str) -> Result<&'a str, CniError> {
            v.as_deref()
                .ok_or_else(|| CniError::new(code::INVALID_ENV, format!("{name} is not set")))
        }
        Ok((
            need(&self.container_id, "CNI_CONTAINERID")?,
            need(&self.ifname, "CNI_IFNAME")?,
        ))
    }
}

/// The plugin's network configuration. Fields the plugin does not know (those of the
/// conflist, `snat`, ...) are ignored, as the spec asks of plugins.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conf {
    pub cni_version: String,
    /// The daemon's API socket.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// The lb network the host ports are published in (created by the first ADD).
    pub network: String,
    /// The node's interfaces where outside traffic arrives; the bridge is added after them.
    #[serde(default)]
    pub external_interfaces: Vec<String>,
    /// The lb network's namespace (a name under /run/netns or a path); unset: the daemon's.
    #[serde(default)]
    pub netns: Option<String>,
    #[serde(default)]
    pub prev_result: Option<serde_json::Value>,
    #[serde(default)]
    pub runtime_config: RuntimeConfig,
    /// GC (1.1.0): the attachments the runtime still has.
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Vec<Attachment>,
}

fn default_socket() -> PathBuf {
    DEFAULT_SOCKET.into()
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfig {
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
}

/// One entry of the `portMappings` capability (libcni's `PortMapEntry`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// Empty or `0.0.0.0`: every address of the node.
    #[serde(default, rename = "hostIP")]
    pub host_ip: String,
}

fn default_protocol() -> String {
    "tcp".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl Conf {
    pub fn parse(stdin: &[u8]) -> Result<Conf, CniError> {
        serde_json::from_slice(stdin).map_err(|e| {
            CniError::with(
                code::INVALID_CONFIG,
                "the network configuration is not valid",
                &e.into(),
            )
        })
    }
}

/// What the plugin reads from the previous plugin's result (0.3.0+ shape: `interfaces` and
/// `ips` with an `interface` index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prev {
    /// The container's addresses, one per family (of each family, the first one on an
    /// interface inside the sandbox, or the first one at all when no interface is named):
    /// IPv4 first. A dual-stack container has two, a single-stack one either.
    pub ips: Vec<IpAddr>,
    /// The host-side bridge: the first interface without a sandbox that is not a veth peer
    /// (the bridge plugin lists the bridge first, then the host veth, then the container's).
    pub bridge: Option<String>,
}

#[derive(Deserialize)]
struct PrevResult {
    #[serde(default)]
    interfaces: Vec<PrevInterface>,
    #[serde(default)]
    ips: Vec<PrevIp>,
}

#[derive(Deserialize)]
struct PrevInterface {
    name: String,
    #[serde(default)]
    sandbox: Option<String>,
}

#[derive(Deserialize)]
struct PrevIp {
    address: String,
    #[serde(default)]
    interface: Option<usize>,
}

impl Prev {
    pub fn read(prev: &serde_json::Value) -> Result<Prev, CniError> {
        let invalid = |msg: String| CniError::new(code::INVALID_CONFIG, msg);
        let r: PrevResult = serde_json::from_value(prev.clone())
            .map_err(|e| invalid(format!("prevResult is not a CNI result: {e}")))?;
        let in_sandbox = |i: &Option<usize>| {
            i.and_then(|i| r.interfaces.get(i))
                .is_some_and(|itf| itf.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
        };
        let addr = |a: &str| a.split('/').next().and_then(|a| a.parse::<IpAddr>().ok());
        let mut ips: Vec<IpAddr> = Vec::new();
        for ip in (r.ips.iter()).filter(|ip| in_sandbox(&ip.interface) || ip.interface.is_none()) {
            let Some(ip) = addr(&ip.address) else {
                return Err(invalid(format!(
                    "prevResult: {:?} is not an IP address",
                    ip.address
                )));
            };
            if !ips.iter().any(|have| have.is_ipv4() == ip.is_ipv4()) {
                ips.push(ip);
            }
        }
        if ips.is_empty() {
            return Err(invalid(
                "prevResult has no IP address of the container".into(),
            ));
        }
        ips.sort_unstable();
        // The bridge plugin's result: [bridge, host veth, container veth]. The host veth is a
        // port of the bridge, not something outside traffic arrives on; the bridge is the
        // first host-side entry.
        let bridge = (r.interfaces.iter())
            .find(|i| i.sandbox.as_deref().is_none_or(str::is_empty))
            .map(|i| i.name.clone());
        Ok(Prev { ips, bridge })
    }
}
