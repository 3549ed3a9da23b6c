//! Validation: the rules that make a desired state safe to compose and program, and the
//! words a refusal is reported in.
//!
//! [`DesiredState::validate`] checks what one field alone cannot: names that become kernel
//! object names, uniqueness, and ownership of VIPs, published ports and interfaces, within a
//! network and across the networks of one namespace. Whatever passes is something
//! [`crate::core::compose`] and the dataplanes can take as is: they never re-check. What
//! depends on the live node (its interfaces and addresses) is checked by [`crate::node::check`].
//!
//! One file because the rules are one set, refused in one vocabulary ([`Invalid`]): `edit.rs`
//! accepts an edit exactly when these rules would pass the state it leads to, so they are read
//! together.
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::model::{
    DesiredState, Family, IFNAMSIZ, MAX_NETWORK_NAME, MAX_SERVICE_NAME, MAX_TIMEOUT_SECS, Mode,
    Network, PortConfig, PortKey, Proto, Service, port_number,
};
use crate::core::compose::{ComposedNetwork, compose};
use crate::core::elements::SetKey;

/// Why a value is not acceptable. Parse errors and validation errors share it so that the
/// JSON file, the CLI flags and the API report a bad value in the same words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("unknown {what} {value:?}, expected one of {expected}")]
    UnknownKeyword {
        what: &'static str,
        value: String,
        expected: String,
    },
    #[error("invalid IP address {0:?}")]
    Ip(String),
    #[error("invalid {field} port number {value:?}")]
    PortNumber { field: &'static str, value: String },
    #[error("{field} port {value} out of range 1-65535")]
    PortRange { field: &'static str, value: i64 },
    #[error("invalid port {0:?}: expected PROTO/PUBLISHED[:TARGET][@HOST_IP]")]
    PortSyntax(String),
    #[error("invalid backend {0:?}: expected IP[,disabled]")]
    BackendSyntax(String),
    #[error(
        "invalid backend {0:?}: a backend is an address; the port it is reached on comes from the service's ports (--port PROTO/PUBLISHED:{1}) or, for a VIP without ports, is the port the client asked"
    )]
    BackendWithPort(String, u16),
    #[error("{what} is empty")]
    NameEmpty { what: &'static str },
    #[error("{what} {value:?} contains {c:?}; only A-Z a-z 0-9 _ . - are allowed")]
    NameChar {
        what: &'static str,
        value: String,
        c: char,
    },
    #[error("{what} {value:?} is {len} characters long; at most {max} are allowed")]
    NameLength {
        what: &'static str,
        value: String,
        len: usize,
        max: usize,
    },
    #[error("{what} cannot be \".\" or \"..\"")]
    NameDots { what: &'static str },
    #[error("network is defined twice")]
    NetworkTwice,
    #[error("invalid netns {value:?}: {why}")]
    Netns { value: String, why: &'static str },
    #[error("no interface; a network needs at least one to attach to")]
    NoInterface,
    #[error("invalid interface name {name:?}: {why}")]
    Interface { name: String, why: String },
    #[error("interface {0:?} is listed twice")]
    InterfaceTwice(String),
    #[error("interface {name:?} in {netns} is already used by network {other:?}")]
    InterfaceTaken {
        name: String,
        netns: String,
        other: String,
    },
    #[error("{key} overlaps {other_key} published by network {other:?} in {netns}")]
    PortInOtherNetwork {
        key: PortKey,
        other_key: PortKey,
        netns: String,
        other: String,
    },
    #[error("service is defined twice (same id and generation)")]
    ServiceTwice,
    #[error("{role} {ip} is {class}; it must be a unicast address")]
    NotUnicast {
        role: &'static str,
        ip: IpAddr,
        class: &'static str,
    },
    #[error("VIP {0} is also one of its own backends")]
    VipIsBackend(IpAddr),
    #[error("backend {0} is listed twice")]
    BackendTwice(IpAddr),
    #[error("host_ip {0} means any address; leave host_ip unset (null) instead")]
    HostIpUnspecified(IpAddr),
    #[error(
        "host_ip ::1 cannot be published: IPv6 has no route_localnet, so a connection from ::1 never leaves the node for a backend; node-local clients use the node's own IPv6 address"
    )]
    HostIpLoopback6,
    #[error("has two {0} VIPs ({1} and {2}); a service has at most one VIP per address family")]
    VipFamilyTwice(Family, IpAddr, IpAddr),
    #[error(
        "VIP {vip} is {family} but no backend is: a flow is balanced over the backends of its own family only (no NAT46/64)"
    )]
    VipFamilyMismatch { vip: IpAddr, family: Family },
    #[error(
        "port {port} is bound to {family} host_ip {host_ip} but no backend is {family}: a flow is balanced over the backends of its own family only (kubelet refuses this as an IP family mismatch)"
    )]
    HostIpFamilyMismatch {
        port: String,
        host_ip: IpAddr,
        family: Family,
    },
    #[error("port {0} is listed twice")]
    PortTwice(PortKey),
    #[error("VIP {vip} is already used by service {other:?}")]
    VipTaken { vip: IpAddr, other: String },
    #[error("has neither a VIP nor a published port: it would serve nothing")]
    NothingServed,
    #[error("{key} is already published by service {other:?}")]
    PortTaken { key: PortKey, other: String },
    #[error("{key} overlaps {other_key} published by service {other:?}")]
    PortOverlaps {
        key: PortKey,
        other_key: PortKey,
        other: String,
    },
    #[error("{set} has {n} backends once composed; at most {max} fit the bucket space")]
    TooManyBackends { set: String, n: usize, max: u32 },
    #[error("invalid timeout {0:?}: expected NAME=SECONDS")]
    TimeoutSyntax(String),
    #[error("timeout {name}={secs} out of range 1-{max}", max = MAX_TIMEOUT_SECS)]
    TimeoutRange { name: &'static str, secs: u32 },
    #[error("timeout dsr is the session timeout of a dsr network; this network's mode is nat")]
    DsrTimeoutOnNat,
    #[error("backend {0} is also a VIP of this network; a VIP cannot be a backend")]
    BackendIsVip(IpAddr),
    #[error("network add takes no services: add them with lb service set")]
    NetworkAddTakesNoServices,
    #[error("VIP {vip} is a backend of service {other:?}; a VIP cannot be a backend")]
    VipIsOthersBackend { vip: IpAddr, other: String },
}

/// A validation failure: where (`network "web" service "api" generation "2"`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ValidationError {
    pub path: String,
    pub reason: Invalid,
}

impl DesiredState {
    /// Checks every rule of [`Network::validate`] for each network, and what networks must not
    /// share: their name; in one namespace, an interface (two writers of one attachment would
    /// undo each other) and overlapping published ports (the node has one port space per
    /// namespace: the same packet would match both networks). A VIP may be in two networks:
    /// each translates it on its own interfaces.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let mut names = BTreeSet::new();
        let mut interfaces: BTreeMap<(Option<&str>, &str), &str> = BTreeMap::new();
        // (netns, protocol, port) → every key on it and the network publishing it.
        type PortOwners<'a> = BTreeMap<(Option<&'a str>, Proto, u16), Vec<(PortKey, &'a str)>>;
        let mut ports: PortOwners = BTreeMap::new();
        let in_ns = |netns: Option<&str>| {
            netns.map_or_else(
                || "the daemon's netns".to_owned(),
                |ns| format!("netns {ns:?}"),
            )
        };
        for network in &self.networks {
            network.validate()?;
            let at = at_path(network.path());
            if !names.insert(network.name.as_str()) {
                return Err(at(Invalid::NetworkTwice));
            }
            let netns = network.netns_key();
            for service in &network.services {
                let at = |reason| network.service_error(service, reason);
                for (key, _) in service.port_keys() {
                    let owners = ports.entry((netns, key.proto, key.port)).or_default();
                    if let Some((other_key, other)) =
                        (owners.iter()).find(|(k, n)| *n != network.name && k.overlaps(&key))
                    {
                        return Err(at(Invalid::PortInOtherNetwork {
                            key,
                            other_key: *other_key,
                            netns: in_ns(netns),
                            other: (*other).to_owned(),
                        }));
                    }
                    owners.push((key, &network.name));
                }
            }
            for name in &network.interfaces {
                if let Some(other) = interfaces.insert((netns, name), &network.name) {
                    return Err(at(Invalid::InterfaceTaken {
                        name: name.clone(),
                        netns: in_ns(netns),
                        other: other.to_owned(),
                    }));
                }
            }
        }
        Ok(())
    }
}

impl Network {
    /// Checks the network on its own: its names, its interfaces, each contribution, who owns
    /// each VIP and published port, and that every composed set fits the bucket space.
    ///
    /// Generations of one service may share a VIP and a port key (that is the rolling update
    /// compose exists for); different services may not, because their traffic would be split
    /// over each other's backends.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let at = at_path(self.path());
        check_network_name(&self.name).map_err(&at)?;
        if let Some(netns) = &self.netns {
            check_netns(netns).map_err(&at)?;
        }
        if self.interfaces.is_empty() {
            return Err(at(Invalid::NoInterface));
        }
        self.timeouts.validate().map_err(&at)?;
        if self.mode != Mode::Dsr && self.timeouts.dsr.is_some() {
            return Err(at(Invalid::DsrTimeoutOnNat));
        }
        let mut interfaces = BTreeSet::new();
        for name in &self.interfaces {
            check_interface(name).map_err(&at)?;
            if !interfaces.insert(name) {
                return Err(at(Invalid::InterfaceTwice(name.clone())));
            }
        }

        let mut keys = BTreeSet::new();
        let mut vip_owner: BTreeMap<IpAddr, &str> = BTreeMap::new();
        let mut port_owners: BTreeMap<(Proto, u16), Vec<(PortKey, &str)>> = BTreeMap::new();
        for service in &self.services {
            let at = |reason| self.service_error(service, reason);
            service.validate().map_err(at)?;
            if !keys.insert((service.id.as_str(), service.generation.as_str())) {
                return Err(at(Invalid::ServiceTwice));
            }
            // A service without a VIP publishes ports only.
            for &vip in &service.vips {
                match vip_owner.get(&vip) {
                    Some(other) if *other != service.id => {
                        return Err(at(Invalid::VipTaken {
                            vip,
                            other: (*other).to_owned(),
                        }));
                    }
                    Some(_) => {}
                    None => {
                        vip_owner.insert(vip, &service.id);
                    }
                }
            }
            for (key, _) in service.port_keys() {
                let owners = port_owners.entry((key.proto, key.port)).or_default();
                // Only one service may have ports that overlap: the same packet would match both.
                let clash = (owners.iter()).find(|(k, id)| *id != service.id && k.overlaps(&key));
                if let Some((other_key, other)) = clash {
                    let other = (*other).to_owned();
                    return Err(at(if *other_key == key {
                        Invalid::PortTaken { key, other }
                    } else {
                        Invalid::PortOverlaps {
                            key,
                            other_key: *other_key,
                            other,
                        }
                    }));
                }
                owners.push((key, &service.id));
            }
        }

        // A packet translated to a backend must not be a service's packet again (it would be
        // translated twice, by XDP and then TC, or by two hooks).
        for service in &self.services {
            if let Some(b) = service
                .backends
                .iter()
                .find(|b| vip_owner.contains_key(&b.ip))
            {
                return Err(self.service_error(service, Invalid::BackendIsVip(b.ip)));
            }
        }

        let composed = compose(self);
        let max = lb_common::MAX_BACKENDS_PER_SET;
        let fits = |n: usize| n <= max as usize;
        let oversized = (composed.vips.iter())
            .find(|(_, b)| !fits(b.len()))
            .map(|(vip, b)| (format!("VIP {vip}"), b.len()))
            .or_else(|| {
                (composed.ports.iter())
                    .find(|(_, b)| !fits(b.len()))
                    .map(|(key, b)| (format!("port {key}"), b.len()))
            });
        if let Some((set, n)) = oversized {
            return Err(at(Invalid::TooManyBackends { set, n, max }));
        }
        Ok(())
    }

    fn path(&self) -> String {
        format!("network {:?}", self.name)
    }

    /// Checks the network's settings alone (everything [`Network::validate`] checks but its
    /// services): what `lb network set` changes.
    pub fn validate_settings(&self) -> Result<(), ValidationError> {
        self.settings().validate()
    }

    /// A refusal of one service. The path is formatted only when there is one: formatting
    /// it for every service checked costs more than the checks at 10,000 services.
    fn service_error(&self, service: &Service, reason: Invalid) -> ValidationError {
        ValidationError {
            path: format!(
                "network {:?} service {:?} generation {:?}",
                self.name, service.id, service.generation
            ),
            reason,
        }
    }
}

impl ComposedNetwork {
    /// Checks `service` as it would be added to this network (or replace the contribution
    /// with its key), against the network's index: the rules [`Network::validate`] applies to
    /// it, without looking at any other contribution than those claiming what it claims. The
    /// set sizes are checked once it is in ([`ComposedNetwork::oversized`]).
    pub fn check_service(&self, service: &Service) -> Result<(), ValidationError> {
        let at = |reason| self.service_error(service, reason);
        service.validate().map_err(at)?;
        let me = service.key();
        let other = |set: &SetKey| {
            (self.claimants(set))
                .find(|k| k.service_id != service.id)
                .map(|k| k.service_id.clone())
        };
        for &vip in &service.vips {
            if let Some(other) = other(&SetKey::Vip(vip)) {
                return Err(at(Invalid::VipTaken { vip, other }));
            }
            // A backend of another contribution (its own old version's does not count).
            let own = (self.service(&me)).is_some_and(|s| s.backends.iter().any(|b| b.ip == vip));
            if self.backend_refs(vip) > u32::from(own) {
                let other = (self.services.iter())
                    .find(|s| s.key() != me && s.backends.iter().any(|b| b.ip == vip))
                    .map_or_else(String::new, |s| s.id.clone());
                return Err(at(Invalid::VipIsOthersBackend { vip, other }));
            }
        }
        if let Some(b) = (service.backends.iter())
            .find(|b| (self.claimants(&SetKey::Vip(b.ip))).any(|k| *k != me))
        {
            return Err(at(Invalid::BackendIsVip(b.ip)));
        }
        for (key, _) in service.port_keys() {
            for other_key in self.overlapping(&key) {
                if let Some(other) = other(&SetKey::Port(other_key)) {
                    return Err(at(if other_key == key {
                        Invalid::PortTaken { key, other }
                    } else {
                        Invalid::PortOverlaps {
                            key,
                            other_key,
                            other,
                        }
                    }));
                }
            }
        }
        Ok(())
    }

    /// The first of `sets` composed with more backends than the bucket space takes, refused
    /// for `service` (the contribution that made it so).
    pub fn oversized(
        &self,
        service: &Service,
        sets: &BTreeSet<SetKey>,
    ) -> Result<(), ValidationError> {
        let max = lb_common::MAX_BACKENDS_PER_SET;
        let composed = self.composed();
        for set in sets {
            let n = match set {
                SetKey::Vip(vip) => composed.vips.get(vip).map_or(0, Vec::len),
                SetKey::Port(key) => composed.ports.get(key).map_or(0, Vec::len),
            };
            if n > max as usize {
                let set = match set {
                    SetKey::Vip(vip) => format!("VIP {vip}"),
                    SetKey::Port(key) => format!("port {key}"),
                };
                return Err(self.service_error(service, Invalid::TooManyBackends { set, n, max }));
            }
        }
        Ok(())
    }
}

impl Service {
    /// What one contribution must satisfy on its own.
    pub fn validate(&self) -> Result<(), Invalid> {
        check_service_id(&self.id)?;
        check_generation(&self.generation)?;
        if self.vips.is_empty() && self.ports.is_empty() {
            return Err(Invalid::NothingServed);
        }
        for (i, &vip) in self.vips.iter().enumerate() {
            check_unicast("VIP", vip, false)?;
            if let Some(&other) =
                (self.vips[..i].iter()).find(|v| Family::of(**v) == Family::of(vip))
            {
                return Err(Invalid::VipFamilyTwice(Family::of(vip), other, vip));
            }
        }
        let mut backends = BTreeSet::new();
        for backend in &self.backends {
            // A loopback backend is never reachable by DNAT (the kernel drops it as martian)
            // nor by DSR (no MAC), so it is refused rather than programmed as a black hole.
            check_unicast("backend", backend.ip, false)?;
            if self.vips.contains(&backend.ip) {
                return Err(Invalid::VipIsBackend(backend.ip));
            }
            if !backends.insert(backend.ip) {
                return Err(Invalid::BackendTwice(backend.ip));
            }
        }
        // A VIP or a host_ip of a family no backend has would serve nothing: a mistake, since
        // a flow never crosses families. (A service with no backend at all is a service
        // scaled to zero: its VIP and ports stay claimed, with empty sets.)
        let has = |family| self.backends.iter().any(|b| Family::of(b.ip) == family);
        if !self.backends.is_empty() {
            if let Some(&vip) = self.vips.iter().find(|v| !has(Family::of(**v))) {
                let family = Family::of(vip);
                return Err(Invalid::VipFamilyMismatch { vip, family });
            }
            for port in &self.ports {
                if let Some(host_ip) = port.host_ip.filter(|ip| !has(Family::of(*ip))) {
                    return Err(Invalid::HostIpFamilyMismatch {
                        port: port.to_string(),
                        host_ip,
                        family: Family::of(host_ip),
                    });
                }
            }
        }
        for port in &self.ports {
            port.validate()?;
        }
        let mut ports = BTreeSet::new();
        if let Some((key, _)) = self.port_keys().find(|(key, _)| !ports.insert(*key)) {
            return Err(Invalid::PortTwice(key));
        }
        Ok(())
    }
}

impl PortConfig {
    /// Parsing already enforces these; a port built in code is held to the same rules.
    fn validate(&self) -> Result<(), Invalid> {
        port_number("published", self.published.into())?;
        if let Some(target) = self.target {
            port_number("target", target.into())?;
        }
        match self.host_ip {
            Some(ip) if ip.is_unspecified() => Err(Invalid::HostIpUnspecified(ip)),
            Some(IpAddr::V6(ip)) if ip.is_loopback() => Err(Invalid::HostIpLoopback6),
            // IPv4 loopback is a legitimate node address to publish on (local clients only):
            // the kernel routes a 127/8 source out of an interface with route_localnet on.
            Some(ip) => check_unicast("host_ip", ip, true),
            None => Ok(()),
        }
    }
}

fn at_path(path: String) -> impl Fn(Invalid) -> ValidationError {
    move |reason| ValidationError {
        path: path.clone(),
        reason,
    }
}

/// A network's name, a service's id or a generation alone, as the CLI reads one from its
/// arguments: refused there, before the daemon is asked, by the rule the daemon applies.
pub fn check_network_name(value: &str) -> Result<(), Invalid> {
    check_name("network name", value, MAX_NETWORK_NAME)
}

/// See [`check_network_name`].
pub fn check_service_id(value: &str) -> Result<(), Invalid> {
    check_name("service id", value, MAX_SERVICE_NAME)
}

/// See [`check_network_name`].
pub fn check_generation(value: &str) -> Result<(), Invalid> {
    check_name("generation", value, MAX_SERVICE_NAME)
}

/// Names that become nftables table names, bpffs directory names and map pin paths: a
/// conservative character set that needs no quoting anywhere, and never `.` or `..`, which
/// would be path traversal once joined to a directory.
fn check_name(what: &'static str, value: &str, max: usize) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err(Invalid::NameEmpty { what });
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(Invalid::NameChar {
            what,
            value: value.to_owned(),
            c,
        });
    }
    if value.len() > max {
        return Err(Invalid::NameLength {
            what,
            value: value.to_owned(),
            len: value.len(),
            max,
        });
    }
    if value == "." || value == ".." {
        return Err(Invalid::NameDots { what });
    }
    Ok(())
}

/// The kernel's `dev_valid_name`: what `ip link` would accept, so that a name that passes here
/// cannot fail at attach time for its spelling. Control characters are refused as well.
fn check_interface(name: &str) -> Result<(), Invalid> {
    let why = if name.is_empty() {
        "it is empty".to_owned()
    } else if name.len() >= IFNAMSIZ {
        format!(
            "it is {} bytes long; at most {} fit IFNAMSIZ",
            name.len(),
            IFNAMSIZ - 1
        )
    } else if name == "." || name == ".." {
        "\".\" and \"..\" are reserved".to_owned()
    } else if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '/' | ':') || c.is_whitespace() || c.is_control())
    {
        format!("it contains {c:?}")
    } else {
        return Ok(());
    };
    Err(Invalid::Interface {
        name: name.to_owned(),
        why,
    })
}

/// A netns is a name under /run/netns (no `/`) or an absolute path to a namespace file.
fn check_netns(value: &str) -> Result<(), Invalid> {
    let why = if value.is_empty() {
        "it is empty"
    } else if value.contains('\0') {
        "it contains a NUL byte"
    } else if value.contains('/') && !value.starts_with('/') {
        "a path must be absolute; a bare name is looked up under /run/netns"
    } else if value == "." || value == ".." {
        "\".\" and \"..\" are not namespace names"
    } else {
        return Ok(());
    };
    Err(Invalid::Netns {
        value: value.to_owned(),
        why,
    })
}

/// Addresses that cannot stand for one host: traffic to them is never a single flow to a
/// single endpoint, so they cannot be a VIP, a backend or a host address. IPv6 link-local
/// addresses are refused too: they are scoped to one link (an address needs its interface to
/// mean anything), and IPv4-mapped ones (`::ffff:a.b.c.d`) are IPv4 in disguise, which a
/// service writes as IPv4.
fn check_unicast(role: &'static str, ip: IpAddr, allow_loopback: bool) -> Result<(), Invalid> {
    let class = match ip {
        _ if ip.is_unspecified() => "the unspecified address",
        _ if ip.is_multicast() => "a multicast address",
        _ if ip.is_loopback() && !allow_loopback => "a loopback address",
        IpAddr::V4(v4) if v4.is_broadcast() => "the broadcast address",
        IpAddr::V6(v6) if v6.is_unicast_link_local() => "a link-local address",
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            "an IPv4-mapped IPv6 address (write the IPv4 address)"
        }
        _ => return Ok(()),
    };
    Err(Invalid::NotUnicast { role, ip, class })
}
