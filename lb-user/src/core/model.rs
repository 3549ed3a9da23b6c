//! The desired state: what the operator asked for, exactly as `lb apply -f` reads it and
//! `lb state` prints it.
//!
//! Parsing is strict (`deny_unknown_fields` everywhere, addresses and ports checked where they
//! are read, errors carrying the JSON path) because a typo that parsed would silently program
//! the wrong thing. [`DesiredState::validate`] (in [`super::validate`]) then checks what one
//! field alone cannot.
//!
//! The doc comments of the types and fields a document has are its reference too: they are the
//! descriptions of the JSON Schema derived from these types (`lb schema`, [`super::schema`]),
//! so they say what a field means to the operator writing it.
//!
//! One file because it is the format in one place: the types `lb apply -f` reads and `lb state`
//! prints, and the keys derived from them, each with the parsing and printing of its fields.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;
pub use super::validate::{Invalid, ValidationError};

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
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
            JsonSchema,
        )]
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

        // The CLI's flags take the same spellings, and its help lists them.
        impl clap::ValueEnum for $name {
            fn value_variants<'a>() -> &'a [Self] {
                Self::ALL
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(self.as_str()))
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
        /// The destination is translated to the backend (and the source as `masquerade` says);
        /// replies come back through lb, which translates them back.
        #[default]
        Nat = "nat",
        /// Direct server return: only the destination MAC address is rewritten; the backends
        /// own the VIP and answer the client directly. VIP traffic only, like moby.
        Dsr = "dsr",
    }
}

keyword_enum! {
    /// Where the ingress program runs (eBPF dataplane). TC is always attached for egress
    /// either way.
    #[derive(Default)]
    pub enum Attach as "attach" {
        /// TC ingress.
        #[default]
        Tc = "tc",
        /// XDP, native driver mode only, in front of TC ingress; an interface without native
        /// XDP is served by TC alone.
        Xdp = "xdp",
    }
}

keyword_enum! {
    /// When load-balanced flows get their source rewritten to the network's address (`nat`
    /// networks).
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
    /// Whether translated packets may leave without the node's stack (eBPF dataplane): straight
    /// into the namespace of a local backend (`bpf_redirect_peer`), replies straight back to a
    /// local client, so they skip routing, the bridge and netfilter's forward path.
    #[derive(Default)]
    pub enum FastPath as "fast-path" {
        /// Directly where no firewall rule can apply to the redirected packets (no rules in
        /// the forward hooks of the network's namespace, re-checked as they change); where
        /// such rules exist, each direction of a flow only once netfilter has passed one of
        /// its packets, judged again every 2 s and after every ruleset change (a flowtable's
        /// contract, docs/fast-path.md).
        #[default]
        Auto = "auto",
        /// Always, even past forward-hook rules: those rules no longer see the network's
        /// load-balanced traffic (Docker's isolation, a CNI `firewall` chain, a policy engine).
        On = "on",
        /// Never: every packet takes the node's stack after its rewrite.
        Off = "off",
    }
}

impl FastPath {
    fn is_default(&self) -> bool {
        *self == FastPath::Auto
    }
}

keyword_enum! {
    /// Whether the daemon holds a socket bound to each published port of the network, as
    /// kubelet's `openLocalPort` and Docker's proxy do, so that no process of the node takes a
    /// port that is published (SCTP is not held, as kubelet). Both dataplanes.
    #[derive(Default)]
    pub enum HoldPorts as "hold-ports" {
        /// Hold every published TCP and UDP port.
        #[default]
        On = "on",
        /// Hold none.
        Off = "off",
    }
}

impl HoldPorts {
    fn is_default(&self) -> bool {
        *self == HoldPorts::On
    }
}

keyword_enum! {
    /// The port's protocol.
    // Declared in protocol-number order, which is therefore also the order of `PortKey` and of
    // rendered elements.
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

keyword_enum! {
    /// An address family. A flow is balanced over the backends of its own family only (no
    /// NAT46/64), so every VIP and published-port key has one backend set per family.
    pub enum Family as "address family" {
        V4 = "ipv4",
        V6 = "ipv6",
    }
}

impl Family {
    pub const fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// Everything lb should program on this node, all networks at once: `lb apply -f` replaces
/// the whole state with the document, `lb state` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    /// The networks, in the order they were added. Names are unique; two networks in one
    /// namespace share no interface and publish no overlapping port.
    #[serde(default)]
    pub networks: Vec<Network>,
}

/// One load-balancer sandbox: the interfaces the programs attach to and the services
/// (contributions) composed over them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = schema::network)]
pub struct Network {
    /// The network's name: it names its nftables table and its bpffs directory.
    #[schemars(with = "schema::NetworkName")]
    pub name: String,
    /// The interfaces the programs attach to, in the network's namespace; the first one
    /// carries the VIPs as addresses.
    #[schemars(with = "schema::Interfaces")]
    pub interfaces: Vec<String>,
    /// The network namespace of the interfaces: a name under /run/netns or an absolute path
    /// to a namespace file (`/proc/PID/ns/net`); null is the daemon's own namespace.
    #[serde(default)]
    #[schemars(with = "schema::Netns")]
    pub netns: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub attach: Attach,
    #[serde(default)]
    pub masquerade: Masquerade,
    /// eBPF dataplane only; the nftables one always passes packets through the node's stack.
    // `lb state` leaves these three out at their defaults, so a state reads as it did before
    // they existed; the schema states their defaults all the same.
    #[serde(default, skip_serializing_if = "FastPath::is_default")]
    #[schemars(extend("default" = FastPath::default()))]
    pub fast_path: FastPath,
    #[serde(default, skip_serializing_if = "HoldPorts::is_default")]
    #[schemars(extend("default" = HoldPorts::default()))]
    pub hold_ports: HoldPorts,
    #[serde(default, skip_serializing_if = "FlowTimeouts::is_default")]
    #[schemars(extend("default" = FlowTimeouts::default()))]
    pub timeouts: FlowTimeouts,
    /// The contributions composed over the network's interfaces.
    #[serde(default)]
    pub services: Vec<Service>,
}

/// How long a flow lives without packets, in seconds, per state, where the defaults do not
/// suit (1 to 604800, a week); an absent or null one takes its default. The flow timeouts are
/// the eBPF dataplane's (the nftables one keeps the kernel's conntrack timeouts); `dsr` is a
/// `dsr` network's session timeout on both dataplanes.
// The states are `lb_common::flow::timeout_secs`'s; unset ones take
// `lb_common::Timeouts::DEFAULT` and `lb_common::DSR_TIMEOUT_DEFAULT` (`resolve`, `dsr_secs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowTimeouts {
    /// A TCP SYN not answered yet (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub tcp_syn: Option<u32>,
    /// An answered TCP connection (default 21600, 6 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub tcp_established: Option<u32>,
    /// A TCP connection reset by either side (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub tcp_closing: Option<u32>,
    /// A TCP connection closed by FINs both ways (default 120, the kernel's conntrack
    /// TIME_WAIT): its reply tuple stays claimed while a backend may hold the connection in
    /// TIME_WAIT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub tcp_time_wait: Option<u32>,
    /// A TCP flow re-created from a mid-connection packet, until the backend answers
    /// (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub tcp_unreplied: Option<u32>,
    /// UDP and SCTP (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub udp: Option<u32>,
    /// A DSR session, every protocol (default 60, as moby): how long a client's 5-tuple
    /// keeps its backend without packets. A `dsr` network's only, on both dataplanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<schema::TimeoutSecs>")]
    pub dsr: Option<u32>,
}

/// Longest timeout accepted: a week (the kernel's longest conntrack default is 5 days).
pub const MAX_TIMEOUT_SECS: u32 = 7 * 24 * 3600;

impl FlowTimeouts {
    /// The timeout names, as `--timeout NAME=SECS` and the JSON fields spell them.
    pub const NAMES: [&'static str; 7] = [
        "tcp_syn",
        "tcp_established",
        "tcp_closing",
        "tcp_time_wait",
        "tcp_unreplied",
        "udp",
        "dsr",
    ];

    pub fn is_default(&self) -> bool {
        *self == FlowTimeouts::default()
    }

    fn fields(&mut self) -> [(&'static str, &mut Option<u32>); 7] {
        [
            ("tcp_syn", &mut self.tcp_syn),
            ("tcp_established", &mut self.tcp_established),
            ("tcp_closing", &mut self.tcp_closing),
            ("tcp_time_wait", &mut self.tcp_time_wait),
            ("tcp_unreplied", &mut self.tcp_unreplied),
            ("udp", &mut self.udp),
            ("dsr", &mut self.dsr),
        ]
    }

    /// Sets one timeout from `NAME=SECS`, as `lb network add --timeout` takes it.
    pub fn set(&mut self, spec: &str) -> Result<(), Invalid> {
        let (name, secs) = Self::parse(spec)?;
        self.set_value(name, secs)
    }

    /// `NAME=SECS` as its name and seconds; `NAME=default` (as `lb network set --timeout`
    /// takes it) as its name and `None`.
    pub fn parse(spec: &str) -> Result<(&str, Option<u32>), Invalid> {
        let syntax = || Invalid::TimeoutSyntax(spec.to_owned());
        let (name, secs) = spec.split_once('=').ok_or_else(syntax)?;
        if secs == "default" {
            return Ok((name, None));
        }
        Ok((name, Some(secs.parse().map_err(|_| syntax())?)))
    }

    /// Sets timeout `name` to `secs` (`None`: its default).
    pub fn set_value(&mut self, name: &str, secs: Option<u32>) -> Result<(), Invalid> {
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
        *slot = secs;
        Ok(())
    }

    /// Each timeout set is within its bounds (the CLI checks them before it asks the daemon,
    /// which holds a network to the same).
    pub fn validate(mut self) -> Result<(), Invalid> {
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
            tcp_time_wait: self.tcp_time_wait.unwrap_or(d.tcp_time_wait),
            tcp_unreplied: self.tcp_unreplied.unwrap_or(d.tcp_unreplied),
            udp: self.udp.unwrap_or(d.udp),
        }
    }

    /// The DSR session timeout, default filled in.
    pub fn dsr_secs(&self) -> u32 {
        self.dsr.unwrap_or(lb_common::DSR_TIMEOUT_DEFAULT)
    }
}

/// One contribution (moby's loadBalancer): one generation of one service, its VIPs and
/// published ports and the backends they are balanced over. Generations of a service coexist
/// during a rolling update and share its VIP and published ports, which are balanced over the
/// backends of every generation at once; two services never share a VIP or an overlapping
/// port. A service has a VIP, published ports, or both.
///
/// A service has at most one VIP per address family, as a Kubernetes Service has one
/// cluster IP per family (`clusterIPs`): `"vip": ADDR` for one, `"vips": [V4, V6]` for a
/// dual-stack service (either is read; `lb state` prints `vip` for one VIP, so a single-stack
/// state reads as it always did). Each VIP is balanced over the backends of its family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "wire::Service", into = "wire::Service")]
pub struct Service {
    pub id: String,
    pub generation: String,
    /// No VIP: a service of published ports only (a kubelet host port, a Nomad port
    /// mapping). Sorted, IPv4 first; validation allows one per family.
    pub vips: Vec<IpAddr>,
    pub backends: Vec<Backend>,
    pub ports: Vec<PortConfig>,
}

fn default_generation() -> String {
    DEFAULT_GENERATION.to_owned()
}

/// A backend of one contribution: flows to the service are balanced over its backends of the
/// flow's address family.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// The backend's address (without a port: the port is the service's `target`, or for a
    /// VIP without ports the one the client asked). A unicast address, not the service's VIP,
    /// listed once per contribution.
    #[serde(deserialize_with = "de::ip")]
    #[schemars(with = "schema::IpAddress")]
    pub ip: IpAddr,
    /// A disabled backend gets no new flows but keeps the ones it has (graceful drain).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub disabled: bool,
}

/// A published port of one contribution: `published` on this node (or on `host_ip` only) is
/// forwarded to `target` on the backends.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    pub proto: Proto,
    /// The port clients connect to on the node.
    #[serde(deserialize_with = "de::published")]
    #[schemars(with = "schema::Port")]
    pub published: u16,
    /// The port the backends are reached on; null is the same as `published`.
    #[serde(default, deserialize_with = "de::target")]
    #[schemars(with = "Option<schema::Port>")]
    pub target: Option<u16>,
    /// The node address the port is published on: a unicast address (IPv4 loopback too, for
    /// the node's own clients; `::1` not). Null is every address of the node, of each family
    /// the service has (the families of its VIPs and backends). `0.0.0.0` and `::` are read
    /// as null.
    // Read as `None` so that one port never has two spellings that would compose as two keys
    // (kubelet reads `0.0.0.0` so).
    #[serde(default, deserialize_with = "de::host_ip")]
    #[schemars(with = "Option<schema::IpAddress>")]
    pub host_ip: Option<IpAddr>,
}

/// What identifies a contribution within a network (moby keys on id + ingress-ports string).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub service_id: String,
    pub generation: String,
}

/// What a published port is looked up by, and what contributions share when they publish the
/// "same" port: one key per address family (a port on every address of a dual-stack service
/// has two). Fields are declared in element order: ports on every address first (IPv4, then
/// IPv6), then per host address (IPv4 addresses first); within those by protocol number, then
/// port number. `family` is `host_ip`'s when there is one ([`PortKey::new`] sees to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    pub host_ip: Option<IpAddr>,
    pub family: Family,
    pub proto: Proto,
    pub port: u16,
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
}

impl Network {
    /// The network without its services: its settings, as `lb network set` changes them.
    pub fn settings(&self) -> Network {
        Network {
            name: self.name.clone(),
            interfaces: self.interfaces.clone(),
            netns: self.netns.clone(),
            mode: self.mode,
            attach: self.attach,
            masquerade: self.masquerade,
            fast_path: self.fast_path,
            hold_ports: self.hold_ports,
            timeouts: self.timeouts,
            services: Vec::new(),
        }
    }

    /// Every VIP a contribution claims (the aliases the network keeps on its first interface).
    pub fn vips(&self) -> std::collections::BTreeSet<IpAddr> {
        self.services
            .iter()
            .flat_map(|s| s.vips.iter().copied())
            .collect()
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
}

impl Service {
    pub fn key(&self) -> ServiceKey {
        ServiceKey {
            service_id: self.id.clone(),
            generation: self.generation.clone(),
        }
    }

    /// The backends new flows may be sent to.
    pub fn enabled_backends(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.backends.iter().filter(|b| !b.disabled).map(|b| b.ip)
    }

    /// The families the service serves: those of its VIPs and of its backends (disabled ones
    /// included, so that draining the last backend of a family does not unpublish it), and
    /// IPv4 for a service that has neither (a port-only service with no backend yet). A port
    /// on every address is published on each of them.
    pub fn families(&self) -> &'static [Family] {
        let (mut v4, mut v6) = (false, false);
        for ip in self.vips.iter().chain(self.backends.iter().map(|b| &b.ip)) {
            match Family::of(*ip) {
                Family::V4 => v4 = true,
                Family::V6 => v6 = true,
            }
        }
        match (v4, v6) {
            (true, true) => Family::ALL,
            (false, true) => &[Family::V6],
            _ => &[Family::V4],
        }
    }

    /// The VIP of `family`, if the service has one.
    pub fn vip(&self, family: Family) -> Option<IpAddr> {
        self.vips.iter().copied().find(|v| Family::of(*v) == family)
    }

    /// Every port key the service publishes, per family (see [`PortConfig::keys`]).
    pub fn port_keys(&self) -> impl Iterator<Item = (PortKey, &PortConfig)> + '_ {
        let families = self.families();
        (self.ports.iter()).flat_map(move |p| p.keys(families).map(move |k| (k, p)))
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
        // The habit of other tools (`ip:port` endpoints): say where the port goes instead.
        if let Ok(with_port) = ip.parse::<std::net::SocketAddr>() {
            return Err(Invalid::BackendWithPort(s.to_owned(), with_port.port()));
        }
        Ok(Backend {
            ip: parse_ip(ip)?,
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

    /// The keys the port is published under for a service of `families`: its `host_ip`'s
    /// (whatever the service's families: validation refuses a mismatch), or one per family on
    /// every address.
    pub fn keys(&self, families: &'static [Family]) -> impl Iterator<Item = PortKey> + use<> {
        let (host_ip, proto, port) = (self.host_ip, self.proto, self.published);
        let one = host_ip.map(|ip| PortKey::new(Some(ip), Family::of(ip), proto, port));
        let every = host_ip
            .is_none()
            .then(move || (families.iter()).map(move |&f| PortKey::new(None, f, proto, port)));
        one.into_iter().chain(every.into_iter().flatten())
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

impl PortKey {
    /// The key of `port` on `host_ip` (whose family wins over `family`), or on every address
    /// of `family`.
    pub fn new(host_ip: Option<IpAddr>, family: Family, proto: Proto, port: u16) -> PortKey {
        PortKey {
            host_ip,
            family: host_ip.map_or(family, Family::of),
            proto,
            port,
        }
    }

    /// Whether one packet could match both keys: the same family, protocol and port, and the
    /// same address or either on every address.
    pub fn overlaps(&self, other: &PortKey) -> bool {
        self.family == other.family
            && self.proto == other.proto
            && self.port == other.port
            && (self.host_ip == other.host_ip || self.host_ip.is_none() || other.host_ip.is_none())
    }
}

impl fmt::Display for PortKey {
    /// `tcp/8080`, `tcp/8080@192.168.1.10`, `tcp/8080@fd00::1`: the CLI's spelling, without
    /// the target; a port on every IPv6 address is `tcp/8080@::` (what `ss` shows as
    /// `[::]:8080`), one on every IPv4 address keeps the short form. The `frontend` label of
    /// the metrics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.proto, self.port)?;
        match (self.host_ip, self.family) {
            (Some(host_ip), _) => write!(f, "@{host_ip}"),
            (None, Family::V6) => f.write_str("@::"),
            (None, Family::V4) => Ok(()),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} generation {}", self.service_id, self.generation)
    }
}

/// An IPv4 address in dotted-quad form (Rust's parser refuses leading zeros, which some C
/// parsers would read as octal) or an IPv6 address, bare or in brackets (`[fd00::1]`, as in
/// `[addr]:port`). Zone indices (`fe80::1%eth0`) are refused: a service address is not
/// link-local.
pub fn parse_ip(s: &str) -> Result<IpAddr, Invalid> {
    let bare = s
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .filter(|b| b.contains(':'))
        .unwrap_or(s);
    bare.parse().map_err(|_| Invalid::Ip(s.to_owned()))
}

/// A `host_ip`: `0.0.0.0` and `::` mean "any address", which is spelled `None`.
pub fn parse_host_ip(s: &str) -> Result<Option<IpAddr>, Invalid> {
    parse_ip(s).map(|ip| (!ip.is_unspecified()).then_some(ip))
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
pub(super) fn port_number(field: &'static str, value: i64) -> Result<u16, Invalid> {
    match u16::try_from(value) {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(Invalid::PortRange { field, value }),
    }
}

/// Field deserializers that check values where they are read, so the error names the value
/// (and, through serde_path_to_error, the field) instead of a generic type mismatch.
mod de {
    use std::net::IpAddr;

    use serde::de::Error;
    use serde::{Deserialize, Deserializer};

    pub fn ip<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
        super::parse_ip(&String::deserialize(d)?).map_err(D::Error::custom)
    }

    pub fn opt_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::parse_ip(&s))
            .transpose()
            .map_err(D::Error::custom)
    }

    pub fn ips<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<IpAddr>>, D::Error> {
        Option::<Vec<String>>::deserialize(d)?
            .map(|v| v.iter().map(|s| super::parse_ip(s)).collect())
            .transpose()
            .map_err(D::Error::custom)
    }

    pub fn host_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
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

/// A service as JSON carries it: `vip` (one) or `vips` (one per family), never both.
mod wire {
    use std::net::IpAddr;

    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::{Backend, PortConfig, de, default_generation, schema};

    // The schema of a service is this struct's (the model's `Service` is read through it,
    // `try_from`), with the model's doc comment as its description.
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[schemars(transform = schema::service)]
    pub struct Service {
        /// The service's name.
        #[schemars(with = "schema::ServiceName")]
        id: String,
        /// Which version of the service this contribution is; unique per `id` in a network.
        #[serde(default = "default_generation")]
        #[schemars(with = "schema::ServiceName")]
        generation: String,
        /// The service's virtual IP: a connection to it on any port goes to a backend, on the
        /// same port. `lb state` prints a service's only VIP here.
        #[serde(
            default,
            deserialize_with = "de::opt_ip",
            skip_serializing_if = "Option::is_none"
        )]
        #[schemars(with = "Option<schema::IpAddress>")]
        vip: Option<IpAddr>,
        /// A dual-stack service's VIPs, at most one per address family; not with `vip`. Each
        /// VIP is balanced over the backends of its family, and needs at least one when the
        /// service has any backend.
        #[serde(
            default,
            deserialize_with = "de::ips",
            skip_serializing_if = "Option::is_none"
        )]
        #[schemars(schema_with = "schema::vips")]
        vips: Option<Vec<IpAddr>>,
        /// Where flows go, each address once. None is a service scaled to zero: its VIP and
        /// ports stay claimed.
        #[serde(default)]
        #[schemars(extend("uniqueItems" = true))]
        backends: Vec<Backend>,
        /// The ports published on the node's own addresses (not on the VIP), each once.
        #[serde(default)]
        #[schemars(extend("uniqueItems" = true))]
        ports: Vec<PortConfig>,
    }

    impl TryFrom<Service> for super::Service {
        type Error = String;

        fn try_from(w: Service) -> Result<Self, String> {
            let mut vips = match (w.vip, w.vips) {
                (Some(_), Some(_)) => {
                    return Err(
                        "give \"vip\" (one address) or \"vips\" (one per family), not both"
                            .to_owned(),
                    );
                }
                (vip, None) => vip.into_iter().collect(),
                (None, Some(vips)) => vips,
            };
            vips.sort_unstable();
            Ok(super::Service {
                id: w.id,
                generation: w.generation,
                vips,
                backends: w.backends,
                ports: w.ports,
            })
        }
    }

    impl From<super::Service> for Service {
        fn from(s: super::Service) -> Self {
            let (vip, vips) = match s.vips.len() {
                0 => (None, None),
                1 => (Some(s.vips[0]), None),
                _ => (None, Some(s.vips)),
            };
            Service {
                id: s.id,
                generation: s.generation,
                vip,
                vips,
                backends: s.backends,
                ports: s.ports,
            }
        }
    }
}
