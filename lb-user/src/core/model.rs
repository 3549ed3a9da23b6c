//! The desired state: what the operator asked for, exactly as `lb apply -f` reads it and
//! `lb state` prints it, and the rules that make it safe to compose and program.
//!
//! Parsing is strict (`deny_unknown_fields` everywhere, addresses and ports checked where they
//! are read, errors carrying the JSON path) because a typo that parsed would silently program
//! the wrong thing. [`DesiredState::validate`] then checks what one field alone cannot: names
//! that become kernel object names, uniqueness, and ownership of VIPs, published ports and
//! interfaces. Whatever passes is something [`crate::core::compose`] and the dataplanes can take as
//! is: they never re-check.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::core::compose::compose;

/// The generation a service gets when none is given (CLI and JSON alike).
pub const DEFAULT_GENERATION: &str = "1";
/// Longest network name: it becomes an nftables table name and a bpffs directory name.
pub const MAX_NETWORK_NAME: usize = 32;
/// Longest service id and generation.
pub const MAX_SERVICE_NAME: usize = 64;
/// Linux `IFNAMSIZ`: an interface name is at most `IFNAMSIZ - 1` bytes.
pub const IFNAMSIZ: usize = 16;

/// Declares a keyword enum: lower-case on the wire, on the command line and in messages, from
/// one list of spellings, so serde, `FromStr` and `Display` cannot disagree.
macro_rules! keyword_enum {
    ($(#[$m:meta])* pub enum $name:ident as $what:literal {
        $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum $name { $($(#[$vm])* #[serde(rename = $s)] $v),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            pub const fn as_str(self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = Invalid;

            fn from_str(s: &str) -> Result<Self, Invalid> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    Invalid::UnknownKeyword {
                        what: $what,
                        value: s.to_owned(),
                        expected: Self::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", "),
                    }
                })
            }
        }
    };
}

keyword_enum! {
    /// How a network's VIP traffic reaches the backends.
    #[derive(Default)]
    pub enum Mode as "mode" {
        /// DNAT to the backend (and SNAT per [`Masquerade`]); replies come back through us.
        #[default]
        Nat = "nat",
        /// Direct server return: only the destination MAC is rewritten, backends own the VIP
        /// and answer the client directly. VIP traffic only, like moby.
        Dsr = "dsr",
    }
}

keyword_enum! {
    /// Where the ingress program runs. TC is always attached for egress either way.
    #[derive(Default)]
    pub enum Attach as "attach" {
        #[default]
        Tc = "tc",
        Xdp = "xdp",
    }
}

keyword_enum! {
    /// When load-balanced flows get their source rewritten to the network's address.
    #[derive(Default)]
    pub enum Masquerade as "masquerade" {
        /// Only hairpin flows (a backend reaching its own service), which would otherwise
        /// answer itself directly and break the connection.
        #[default]
        Auto = "auto",
        /// Every flow, moby's `ct status dnat masquerade`.
        Always = "always",
        /// Never: backends see the client's address.
        Never = "never",
    }
}

keyword_enum! {
    /// The L4 protocols a port can be published for. Declared in protocol-number order, which
    /// is therefore also the order of [`PortKey`] and of rendered elements.
    pub enum Proto as "protocol" {
        Tcp = "tcp",
        Udp = "udp",
        Sctp = "sctp",
    }
}

impl Proto {
    /// The IP protocol number, as the programs match it.
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => lb_common::IPPROTO_TCP,
            Proto::Udp => lb_common::IPPROTO_UDP,
            Proto::Sctp => lb_common::IPPROTO_SCTP,
        }
    }

    /// The protocol of IP protocol number `n`, if ports can be published for it.
    pub fn from_number(n: u8) -> Option<Proto> {
        [Proto::Tcp, Proto::Udp, Proto::Sctp]
            .into_iter()
            .find(|p| p.number() == n)
    }
}

/// Everything `lb` should program, all networks at once (`lb apply` replaces it wholesale).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    #[serde(default)]
    pub networks: Vec<Network>,
}

/// One load-balancer sandbox: the interfaces the programs attach to and the services
/// (contributions) composed over them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub name: String,
    /// Where the programs attach; the first one carries the VIP aliases.
    pub interfaces: Vec<String>,
    /// Name under /run/netns, or a path to a namespace file; `None` is the daemon's own.
    #[serde(default)]
    pub netns: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub attach: Attach,
    #[serde(default)]
    pub masquerade: Masquerade,
    /// Flow timeouts, where the defaults do not suit (eBPF dataplane; the nftables one keeps
    /// the kernel's conntrack timeouts).
    #[serde(default, skip_serializing_if = "FlowTimeouts::is_default")]
    pub timeouts: FlowTimeouts,
    #[serde(default)]
    pub services: Vec<Service>,
}

/// How long a flow's entries live without packets, in seconds, per state (see
/// `lb_common::flow::timeout_secs`); unset ones take [`lb_common::Timeouts::DEFAULT`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowTimeouts {
    /// A TCP SYN not answered yet (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_syn: Option<u32>,
    /// An answered TCP connection (default 21600, 6 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_established: Option<u32>,
    /// A TCP connection closed both ways or reset (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_closing: Option<u32>,
    /// A TCP flow re-created from a mid-connection packet, until the backend answers
    /// (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_unreplied: Option<u32>,
    /// UDP and SCTP (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<u32>,
}

/// Longest timeout accepted: a week (the kernel's longest conntrack default is 5 days).
pub const MAX_TIMEOUT_SECS: u32 = 7 * 24 * 3600;

impl FlowTimeouts {
    /// The timeout names, as `--timeout NAME=SECS` and the JSON fields spell them.
    pub const NAMES: [&'static str; 5] = [
        "tcp_syn",
        "tcp_established",
        "tcp_closing",
        "tcp_unreplied",
        "udp",
    ];

    pub fn is_default(&self) -> bool {
        *self == FlowTimeouts::default()
    }

    fn fields(&mut self) -> [(&'static str, &mut Option<u32>); 5] {
        [
            ("tcp_syn", &mut self.tcp_syn),
            ("tcp_established", &mut self.tcp_established),
            ("tcp_closing", &mut self.tcp_closing),
            ("tcp_unreplied", &mut self.tcp_unreplied),
            ("udp", &mut self.udp),
        ]
    }

    /// Sets one timeout from `NAME=SECS`, as `lb network add --timeout` takes it.
    pub fn set(&mut self, spec: &str) -> Result<(), Invalid> {
        let syntax = || Invalid::TimeoutSyntax(spec.to_owned());
        let (name, secs) = spec.split_once('=').ok_or_else(syntax)?;
        let secs: u32 = secs.parse().map_err(|_| syntax())?;
        let slot = self
            .fields()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .ok_or_else(|| Invalid::UnknownKeyword {
                what: "timeout",
                value: name.to_owned(),
                expected: Self::NAMES.join(", "),
            })?;
        *slot = Some(secs);
        Ok(())
    }

    fn validate(mut self) -> Result<(), Invalid> {
        for (name, v) in self.fields() {
            if let Some(secs) = *v
                && !(1..=MAX_TIMEOUT_SECS).contains(&secs)
            {
                return Err(Invalid::TimeoutRange { name, secs });
            }
        }
        Ok(())
    }

    /// Every timeout, defaults filled in.
    pub fn resolve(&self) -> lb_common::Timeouts {
        let d = lb_common::Timeouts::DEFAULT;
        lb_common::Timeouts {
            tcp_syn: self.tcp_syn.unwrap_or(d.tcp_syn),
            tcp_established: self.tcp_established.unwrap_or(d.tcp_established),
            tcp_closing: self.tcp_closing.unwrap_or(d.tcp_closing),
            tcp_unreplied: self.tcp_unreplied.unwrap_or(d.tcp_unreplied),
            udp: self.udp.unwrap_or(d.udp),
        }
    }
}

/// One contribution (moby's loadBalancer): one generation of one service. Generations of a
/// service coexist during a rolling update and share its VIP and published ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub id: String,
    #[serde(default = "default_generation")]
    pub generation: String,
    #[serde(deserialize_with = "de::ipv4")]
    pub vip: Ipv4Addr,
    #[serde(default)]
    pub backends: Vec<Backend>,
    #[serde(default)]
    pub ports: Vec<PortConfig>,
}

fn default_generation() -> String {
    DEFAULT_GENERATION.to_owned()
}

/// A backend of one contribution. A disabled one is deweighted: it gets no new flows but
/// keeps the ones it has (graceful drain).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    #[serde(deserialize_with = "de::ipv4")]
    pub ip: Ipv4Addr,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

/// A published port of one contribution: `published` on this node (or on `host_ip` only) is
/// forwarded to `target` on the backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    pub proto: Proto,
    #[serde(deserialize_with = "de::published")]
    pub published: u16,
    /// `None` means the same as `published`.
    #[serde(default, deserialize_with = "de::target")]
    pub target: Option<u16>,
    /// `None` means every address of this node. `0.0.0.0` is read as `None` (as kubelet
    /// does), so one port never has two spellings that would compose as two keys.
    #[serde(default, deserialize_with = "de::host_ip")]
    pub host_ip: Option<Ipv4Addr>,
}

/// What identifies a contribution within a network (moby keys on id + ingress-ports string).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub service_id: String,
    pub generation: String,
}

/// What a published port is looked up by, and what contributions share when they publish the
/// "same" port. Fields are declared in element order: ports on every address first, then per
/// host address; within those by protocol number, then port number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    pub host_ip: Option<Ipv4Addr>,
    pub proto: Proto,
    pub port: u16,
}

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
    #[error("invalid IPv4 address {0:?}")]
    Ipv4(String),
    #[error("invalid {field} port number {value:?}")]
    PortNumber { field: &'static str, value: String },
    #[error("{field} port {value} out of range 1-65535")]
    PortRange { field: &'static str, value: i64 },
    #[error("invalid port {0:?}: expected PROTO/PUBLISHED[:TARGET][@HOST_IP]")]
    PortSyntax(String),
    #[error("invalid backend {0:?}: expected IP[,disabled]")]
    BackendSyntax(String),
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
    #[error("service is defined twice (same id and generation)")]
    ServiceTwice,
    #[error("{role} {ip} is {class}; it must be a unicast address")]
    NotUnicast {
        role: &'static str,
        ip: Ipv4Addr,
        class: &'static str,
    },
    #[error("VIP {0} is also one of its own backends")]
    VipIsBackend(Ipv4Addr),
    #[error("backend {0} is listed twice")]
    BackendTwice(Ipv4Addr),
    #[error("host_ip 0.0.0.0 means any address; leave host_ip unset (null) instead")]
    HostIpUnspecified,
    #[error("port {0} is listed twice")]
    PortTwice(PortKey),
    #[error("publishes {0}, but a dsr network carries VIP traffic only")]
    DsrPorts(PortKey),
    #[error("VIP {vip} is already used by service {other:?}")]
    VipTaken { vip: Ipv4Addr, other: String },
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
    #[error("backend {0} is also a VIP of this network; a VIP cannot be a backend")]
    BackendIsVip(Ipv4Addr),
}

/// A validation failure: where (`network "web" service "api" generation "2"`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ValidationError {
    pub path: String,
    pub reason: Invalid,
}

/// Why a desired-state document was not accepted: it did not parse (with the JSON path of the
/// offending value), or it parsed and is not valid.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    // Not `source`: the message already carries serde's, and a source would repeat it in
    // every `{:#}` chain.
    #[error("{}{cause}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
    Parse {
        path: String,
        cause: serde_json::Error,
    },
    /// serde would read a JSON array as a struct's fields in order, so `[]` would parse as
    /// the empty state and `lb apply` would wipe everything: only an object is a state.
    #[error("a desired state is a JSON object, {{\"networks\": [...]}}")]
    NotAnObject,
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

impl DesiredState {
    /// Parses and validates a desired-state document: only a state that passes both is
    /// returned, so nothing downstream ever sees a half-checked one.
    pub fn from_json(json: &str) -> Result<Self, StateError> {
        if !json.trim_start().starts_with('{') && !json.trim().is_empty() {
            return Err(StateError::NotAnObject);
        }
        let parse = |path: String, cause| StateError::Parse { path, cause };
        let mut de = serde_json::Deserializer::from_str(json);
        let state: Self = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            parse(path, e.into_inner())
        })?;
        de.end().map_err(|e| parse(String::new(), e))?;
        state.validate()?;
        Ok(state)
    }

    /// The canonical document: fields in declared order, so equal states print equally.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a desired state always serializes")
    }

    pub fn network(&self, name: &str) -> Option<&Network> {
        self.networks.iter().find(|n| n.name == name)
    }

    pub fn network_mut(&mut self, name: &str) -> Option<&mut Network> {
        self.networks.iter_mut().find(|n| n.name == name)
    }

    /// Checks every rule of [`Network::validate`] for each network, and what networks must not
    /// share: their name, and an interface in one namespace (two writers of one attachment
    /// would undo each other).
    pub fn validate(&self) -> Result<(), ValidationError> {
        let mut names = BTreeSet::new();
        let mut interfaces: BTreeMap<(Option<&str>, &str), &str> = BTreeMap::new();
        for network in &self.networks {
            network.validate()?;
            let at = at_path(network.path());
            if !names.insert(network.name.as_str()) {
                return Err(at(Invalid::NetworkTwice));
            }
            let netns = network.netns_key();
            for name in &network.interfaces {
                if let Some(other) = interfaces.insert((netns, name), &network.name) {
                    return Err(at(Invalid::InterfaceTaken {
                        name: name.clone(),
                        netns: netns.map_or_else(
                            || "the daemon's netns".to_owned(),
                            |ns| format!("netns {ns:?}"),
                        ),
                        other: other.to_owned(),
                    }));
                }
            }
        }
        Ok(())
    }
}

impl Network {
    /// Every VIP a contribution claims (the aliases the network keeps on its first interface).
    pub fn vips(&self) -> std::collections::BTreeSet<Ipv4Addr> {
        self.services.iter().map(|s| s.vip).collect()
    }

    /// Checks the network on its own: its names, its interfaces, each contribution, who owns
    /// each VIP and published port, and that every composed set fits the bucket space.
    ///
    /// Generations of one service may share a VIP and a port key (that is the rolling update
    /// compose exists for); different services may not, because their traffic would be split
    /// over each other's backends.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let at = at_path(self.path());
        check_name("network name", &self.name, MAX_NETWORK_NAME).map_err(&at)?;
        if let Some(netns) = &self.netns {
            check_netns(netns).map_err(&at)?;
        }
        if self.interfaces.is_empty() {
            return Err(at(Invalid::NoInterface));
        }
        self.timeouts.validate().map_err(&at)?;
        let mut interfaces = BTreeSet::new();
        for name in &self.interfaces {
            check_interface(name).map_err(&at)?;
            if !interfaces.insert(name) {
                return Err(at(Invalid::InterfaceTwice(name.clone())));
            }
        }

        let mut keys = BTreeSet::new();
        let mut vip_owner: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
        let mut port_owners: BTreeMap<(Proto, u16), Vec<(PortKey, &str)>> = BTreeMap::new();
        for service in &self.services {
            let at = at_path(self.service_path(service));
            service.validate().map_err(&at)?;
            if !keys.insert(service.key()) {
                return Err(at(Invalid::ServiceTwice));
            }
            if let (Mode::Dsr, Some(port)) = (self.mode, service.ports.first()) {
                return Err(at(Invalid::DsrPorts(port.key())));
            }
            match vip_owner.get(&service.vip) {
                Some(other) if *other != service.id => {
                    return Err(at(Invalid::VipTaken {
                        vip: service.vip,
                        other: (*other).to_owned(),
                    }));
                }
                Some(_) => {}
                None => {
                    vip_owner.insert(service.vip, &service.id);
                }
            }
            for port in &service.ports {
                let key = port.key();
                let owners = port_owners.entry((key.proto, key.port)).or_default();
                // A port on every address overlaps the same port on any one address: the
                // same packet would match both, so only one service may have them.
                let clash = owners.iter().find(|(k, id)| {
                    *id != service.id
                        && (k.host_ip == key.host_ip
                            || k.host_ip.is_none()
                            || key.host_ip.is_none())
                });
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
                return Err(at_path(self.service_path(service))(Invalid::BackendIsVip(
                    b.ip,
                )));
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

    /// The namespace an interface name is resolved in, so that `x` and `/run/netns/x` are
    /// recognised as one. Other paths naming the same namespace cannot be told apart
    /// without opening them; the daemon does that.
    pub fn netns_key(&self) -> Option<&str> {
        self.netns
            .as_deref()
            .map(|ns| ns.strip_prefix("/run/netns/").unwrap_or(ns))
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&Service> {
        self.services.iter().find(|s| s.key() == *key)
    }

    /// Adds `service`, or replaces the contribution with its key; returns the one replaced.
    pub fn upsert_service(&mut self, service: Service) -> Option<Service> {
        match self.services.iter_mut().find(|s| s.key() == service.key()) {
            Some(old) => Some(std::mem::replace(old, service)),
            None => {
                self.services.push(service);
                None
            }
        }
    }

    /// Removes one generation of service `id`, or every generation with `None`; returns how
    /// many contributions went. Removing one releases its share of its VIP and ports.
    pub fn remove_services(&mut self, id: &str, generation: Option<&str>) -> usize {
        let before = self.services.len();
        self.services
            .retain(|s| s.id != id || generation.is_some_and(|g| s.generation != g));
        before - self.services.len()
    }

    fn path(&self) -> String {
        format!("network {:?}", self.name)
    }

    fn service_path(&self, service: &Service) -> String {
        format!(
            "network {:?} service {:?} generation {:?}",
            self.name, service.id, service.generation
        )
    }
}

impl Service {
    pub fn key(&self) -> ServiceKey {
        ServiceKey {
            service_id: self.id.clone(),
            generation: self.generation.clone(),
        }
    }

    /// The backends new flows may be sent to.
    pub fn enabled_backends(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.backends.iter().filter(|b| !b.disabled).map(|b| b.ip)
    }

    /// What one contribution must satisfy on its own.
    fn validate(&self) -> Result<(), Invalid> {
        check_name("service id", &self.id, MAX_SERVICE_NAME)?;
        check_name("generation", &self.generation, MAX_SERVICE_NAME)?;
        check_unicast("VIP", self.vip, false)?;
        let mut backends = BTreeSet::new();
        for backend in &self.backends {
            // A loopback backend is never reachable by DNAT (the kernel drops it as martian)
            // nor by DSR (no MAC), so it is refused rather than programmed as a black hole.
            check_unicast("backend", backend.ip, false)?;
            if backend.ip == self.vip {
                return Err(Invalid::VipIsBackend(self.vip));
            }
            if !backends.insert(backend.ip) {
                return Err(Invalid::BackendTwice(backend.ip));
            }
        }
        let mut ports = BTreeSet::new();
        for port in &self.ports {
            port.validate()?;
            if !ports.insert(port.key()) {
                return Err(Invalid::PortTwice(port.key()));
            }
        }
        Ok(())
    }
}

impl FromStr for Backend {
    type Err = Invalid;

    /// `IP[,disabled]`, as `lb service set --backend` takes it.
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let (ip, disabled) = match s.split_once(',') {
            None => (s, false),
            Some((ip, "disabled")) => (ip, true),
            Some(_) => return Err(Invalid::BackendSyntax(s.to_owned())),
        };
        Ok(Backend {
            ip: parse_ipv4(ip)?,
            disabled,
        })
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ip)?;
        if self.disabled {
            f.write_str(",disabled")?;
        }
        Ok(())
    }
}

impl PortConfig {
    /// The port the backends are reached on.
    pub fn target(&self) -> u16 {
        self.target.unwrap_or(self.published)
    }

    pub fn key(&self) -> PortKey {
        PortKey {
            host_ip: self.host_ip,
            proto: self.proto,
            port: self.published,
        }
    }

    /// Parsing already enforces these; a port built in code is held to the same rules.
    fn validate(&self) -> Result<(), Invalid> {
        port_number("published", self.published.into())?;
        if let Some(target) = self.target {
            port_number("target", target.into())?;
        }
        match self.host_ip {
            Some(ip) if ip.is_unspecified() => Err(Invalid::HostIpUnspecified),
            // Loopback is a legitimate node address to publish on (local clients only).
            Some(ip) => check_unicast("host_ip", ip, true),
            None => Ok(()),
        }
    }
}

impl FromStr for PortConfig {
    type Err = Invalid;

    /// `PROTO/PUBLISHED[:TARGET][@HOST_IP]`, as `lb service set --port` takes it; the form
    /// [`Display`](fmt::Display) prints.
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let (rest, host_ip) = match s.split_once('@') {
            Some((rest, host)) => (rest, parse_host_ip(host)?),
            None => (s, None),
        };
        let (proto, ports) = rest
            .split_once('/')
            .ok_or_else(|| Invalid::PortSyntax(s.to_owned()))?;
        let (published, target) = match ports.split_once(':') {
            Some((published, target)) => (published, Some(target)),
            None => (ports, None),
        };
        Ok(PortConfig {
            proto: proto.parse()?,
            published: parse_port("published", published)?,
            target: target.map(|t| parse_port("target", t)).transpose()?,
            host_ip,
        })
    }
}

impl fmt::Display for PortConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.proto, self.published)?;
        if let Some(target) = self.target {
            write!(f, ":{target}")?;
        }
        if let Some(host_ip) = self.host_ip {
            write!(f, "@{host_ip}")?;
        }
        Ok(())
    }
}

impl fmt::Display for PortKey {
    /// `tcp/8080` or `tcp/8080@192.168.1.10`: the CLI's spelling, without the target.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.proto, self.port)?;
        if let Some(host_ip) = self.host_ip {
            write!(f, "@{host_ip}")?;
        }
        Ok(())
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} generation {}", self.service_id, self.generation)
    }
}

fn at_path(path: String) -> impl Fn(Invalid) -> ValidationError {
    move |reason| ValidationError {
        path: path.clone(),
        reason,
    }
}

/// Dotted-quad only; Rust's parser already refuses leading zeros, which some C parsers would
/// read as octal.
pub fn parse_ipv4(s: &str) -> Result<Ipv4Addr, Invalid> {
    s.parse().map_err(|_| Invalid::Ipv4(s.to_owned()))
}

/// A `host_ip`: `0.0.0.0` means "any address", which is spelled `None`.
pub fn parse_host_ip(s: &str) -> Result<Option<Ipv4Addr>, Invalid> {
    parse_ipv4(s).map(|ip| (!ip.is_unspecified()).then_some(ip))
}

fn parse_port(field: &'static str, s: &str) -> Result<u16, Invalid> {
    let value = s.parse().map_err(|_| Invalid::PortNumber {
        field,
        value: s.to_owned(),
    })?;
    port_number(field, value)
}

/// The one range rule for port numbers, wherever they come from. Taken as `i64` so that a
/// negative or too large number is reported as itself, not as a type overflow.
fn port_number(field: &'static str, value: i64) -> Result<u16, Invalid> {
    match u16::try_from(value) {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(Invalid::PortRange { field, value }),
    }
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
/// single endpoint, so they cannot be a VIP, a backend or a host address.
fn check_unicast(role: &'static str, ip: Ipv4Addr, allow_loopback: bool) -> Result<(), Invalid> {
    let class = if ip.is_unspecified() {
        "the unspecified address"
    } else if ip.is_broadcast() {
        "the broadcast address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if ip.is_loopback() && !allow_loopback {
        "a loopback address"
    } else {
        return Ok(());
    };
    Err(Invalid::NotUnicast { role, ip, class })
}

/// Field deserializers that check values where they are read, so the error names the value
/// (and, through serde_path_to_error, the field) instead of a generic type mismatch.
mod de {
    use std::net::Ipv4Addr;

    use serde::de::Error;
    use serde::{Deserialize, Deserializer};

    pub fn ipv4<'de, D: Deserializer<'de>>(d: D) -> Result<Ipv4Addr, D::Error> {
        super::parse_ipv4(&String::deserialize(d)?).map_err(D::Error::custom)
    }

    pub fn host_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Ipv4Addr>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(s) => super::parse_host_ip(&s).map_err(D::Error::custom),
            None => Ok(None),
        }
    }

    pub fn published<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
        super::port_number("published", i64::deserialize(d)?).map_err(D::Error::custom)
    }

    pub fn target<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
        Option::<i64>::deserialize(d)?
            .map(|v| super::port_number("target", v))
            .transpose()
            .map_err(D::Error::custom)
    }
}
