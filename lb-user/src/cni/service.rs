//! The lb service one container attachment is: its id, its backend and its ports.
use std::net::IpAddr;

use super::{
    config::PortMapping,
    error::{CniError, code},
};
use crate::core::model::{
    Backend, DEFAULT_GENERATION, Family, MAX_SERVICE_NAME, PortConfig, Proto, Service,
    parse_host_ip,
};

pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST_VERSION: &str = "1.1.0";
/// Every service the plugin makes starts with this, so GC never touches another client's.
pub const ID_PREFIX: &str = "cni-";

/// The service id of one attachment: `cni-<first 12 of the container id>-<ifname>` when that
/// is a valid lb name (runtimes use hex ids and `eth0`-like names), otherwise `cni-` and a
/// stable hash of both. The same attachment always gets the same id (ADD, CHECK, DEL and GC
/// agree without any state in the plugin).
pub fn service_id(container_id: &str, ifname: &str) -> String {
    let short: String = container_id.chars().take(12).collect();
    let id = format!("{ID_PREFIX}{short}-{ifname}");
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    };
    if plain(&short) && plain(ifname) && id.len() <= MAX_SERVICE_NAME {
        return id;
    }
    // FNV-1a: stable across builds and machines, which std's hasher is not promised to be.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id.bytes().chain([0]).chain(ifname.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{ID_PREFIX}{h:016x}")
}

/// The service for `id`: the container's addresses as its backends (one per family), each
/// port mapping a published port. A mapping without `hostIP` is published on every family the
/// container has (the portmap plugin writes its rules into `ip` and `ip6` tables alike); one
/// with a `hostIP` on that address's family only, which the container must have.
pub fn build(id: &str, ips: &[IpAddr], mappings: &[PortMapping]) -> Result<Service, CniError> {
    let ports = (mappings.iter())
        .map(|m| port(m, ips))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Service {
        id: id.to_owned(),
        generation: DEFAULT_GENERATION.to_owned(),
        vips: Vec::new(),
        backends: (ips.iter())
            .map(|&ip| Backend {
                ip,
                disabled: false,
            })
            .collect(),
        ports,
    })
}

fn port(m: &PortMapping, ips: &[IpAddr]) -> Result<PortConfig, CniError> {
    let invalid = |msg: String| CniError::new(code::INVALID_CONFIG, msg);
    let proto: Proto = (m.protocol.to_ascii_lowercase().parse())
        .map_err(|e| invalid(format!("portMappings: protocol {:?}: {e}", m.protocol)))?;
    // `0.0.0.0` and `::` are every address, as no hostIP is.
    let host_ip = match m.host_ip.as_str() {
        "" => None,
        ip => parse_host_ip(ip)
            .map_err(|_| invalid(format!("portMappings: hostIP {ip:?} is not an IP address")))?,
    };
    // kubelet's hostport manager refuses a hostIP of a family the pod has no address of
    // ("HostPortManager IP family mismatch"): nothing could be sent on.
    if let Some(ip) = host_ip
        && !ips.iter().any(|c| Family::of(*c) == Family::of(ip))
    {
        return Err(invalid(format!(
            "portMappings: hostIP {ip} is {}, and none of the container's addresses lb publishes ({}) is: an IP family mismatch",
            Family::of(ip),
            (ips.iter().map(IpAddr::to_string))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(PortConfig {
        proto,
        published: m.host_port,
        target: Some(m.container_port),
        host_ip,
    })
}

/// Whether `have` (as the daemon lists it) is what `want` asks for: same backends and ports,
/// in any order.
pub fn matches(have: &Service, want: &Service) -> bool {
    let sorted = |s: &Service| {
        let mut b = s.backends.clone();
        b.sort();
        let mut p: Vec<PortConfig> = (s.ports.iter())
            .map(|p| PortConfig {
                target: p.target.or(Some(p.published)),
                ..*p
            })
            .collect();
        p.sort();
        (b, p)
    };
    have.vips == want.vips && sorted(have) == sorted(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_valid_names() {
        assert_eq!(
            service_id("0123456789abcdef0123", "eth0"),
            "cni-0123456789ab-eth0"
        );
        let odd = service_id("pod/with spaces", "eth0");
        assert!(odd.starts_with(ID_PREFIX) && odd.len() == ID_PREFIX.len() + 16);
        assert_eq!(odd, service_id("pod/with spaces", "eth0"));
        assert_ne!(odd, service_id("pod/with spaces", "eth1"));
    }
}
