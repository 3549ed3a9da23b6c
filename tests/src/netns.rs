//! Network namespaces and the standard lb test topologies.
//!
//! Everything here lives in namespaces the harness creates: both ends of every veth pair are
//! created from inside one of them (`ip -n A link add X type veth peer name Y netns B`), so no
//! link, address, route or sysctl of the root namespace is ever touched. Every namespace is named
//! `lbt-<pid>-<n>-<tag>`: its guard deletes it on drop (on unwind too), and
//! [`Netns::stale_cleanup`] removes those whose process is gone, so a crashed run never breaks
//! the next one.
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::iter;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail, ensure};

const PREFIX: &str = "lbt-";
const NETNS_DIR: &str = "/run/netns";

/// The only interface of the client, of every backend, and of the node in
/// [`Topology::single_interface`].
pub const ENDPOINT_IF: &str = "eth0";
/// The node's interface facing the client in [`Topology::new`].
pub const NODE_CLIENT_IF: &str = "lbc0";
/// The node's bridge facing the backends in [`Topology::new`].
pub const NODE_BRIDGE: &str = "lbbr0";
/// Every topology puts each link in one /24.
const PREFIX_LEN: u8 = 24;
/// The bridge of the switch namespace in [`Topology::single_interface`].
pub const SWITCH_BRIDGE: &str = "br0";
/// The switch's port facing the node in [`Topology::single_interface`].
pub const SWITCH_NODE_PORT: &str = "sw0";
/// The switch's port facing the client in [`Topology::single_interface`].
pub const SWITCH_CLIENT_PORT: &str = "sw1";

/// Runs `cmd` to completion and returns its stdout; a failure names the command line, its exit
/// status and its stderr, which is all a test log needs to explain a broken setup.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{cmd:?} printed non-UTF-8"))
}

fn ip() -> Command {
    Command::new("ip")
}

/// `ip netns add NAME`, serialised across every process of the machine. The first `ip netns
/// add` after /run/netns lost its mount makes it a mount point by bind-mounting it on itself;
/// a concurrent add whose file was created just before that mount finds it hidden and fails
/// with "Bind /proc/self/ns/net -> /run/netns/NAME failed: No such file or directory".
pub fn add_netns(name: &str) -> Result<()> {
    let _lock = netns_add_lock()?;
    output(ip().args(["netns", "add", name])).map(drop)
}

/// The machine-wide lock of `ip netns add` (and of stale clean-up), held while the returned
/// file is open.
fn netns_add_lock() -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/lbt-netns-add.lock")
        .context("opening /run/lbt-netns-add.lock")?;
    // SAFETY: flock on an fd we own; the lock goes with the file when it is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error()).context("locking /run/lbt-netns-add.lock");
    }
    Ok(lock)
}

/// Deletes the named namespace. Idempotent: a name that is already gone (a concurrent
/// stale cleanup, a test that deleted it itself) counts as deleted.
fn delete(name: &str) -> Result<()> {
    match output(ip().args(["netns", "del", name])) {
        Err(_) if !Path::new(NETNS_DIR).join(name).exists() => Ok(()),
        res => res.map(drop),
    }
}

/// The pid embedded in a harness namespace name, `None` for every other namespace.
fn owner_pid(name: &str) -> Option<libc::pid_t> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

fn pid_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists; nothing is delivered.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A named network namespace owned by this process; deleted when dropped. Deleting it also
/// destroys every veth end inside it, and with it the peer end, wherever that lives — once no
/// socket or thread of ours is left in it.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `lbt-<pid>-<n>-<tag>` (tag: its first 8 ASCII alphanumerics) with `lo` up.
    ///
    /// IPv4 `conf/{all,default}` of a new namespace are inherited from the root namespace, so the
    /// host's sysctls would otherwise decide a test: every harness namespace starts with
    /// rp_filter off (DNAT, masquerade and DSR all make asymmetric paths). IPv6 is disabled, so
    /// that no DAD, MLD or router solicitation reaches the programs and packet counts in a test
    /// are exactly its own traffic; a test that needs IPv6 re-enables it with [`Netns::enable_ipv6`].
    pub fn new(tag: &str) -> Result<Netns> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag: String = tag
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect();
        let name = format!(
            "{PREFIX}{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        add_netns(&name)?;
        // From here on the guard owns the namespace: a failed setup still deletes it.
        let ns = Netns { name };
        ns.setup()?;
        Ok(ns)
    }

    fn setup(&self) -> Result<()> {
        self.ip(["link", "set", "lo", "up"])?;
        for (key, value) in [
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
        ] {
            self.sysctl(key, value)?;
        }
        Ok(())
    }

    /// IPv6 on (every harness namespace starts without it, see [`Netns::new`]), taking no
    /// router advertisements: the addresses a test gives are all there are.
    pub fn enable_ipv6(&self) -> Result<()> {
        for (key, value) in [
            ("net.ipv6.conf.all.disable_ipv6", "0"),
            ("net.ipv6.conf.default.disable_ipv6", "0"),
            ("net.ipv6.conf.all.accept_ra", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
        ] {
            self.sysctl(key, value)?;
        }
        Ok(())
    }

    /// `addr/64` on `ifname`, usable at once (`nodad`: no duplicate address detection).
    pub fn add_ipv6(&self, addr: Ipv6Addr, ifname: &str) -> Result<()> {
        let addr = format!("{addr}/64");
        self.ip(["-6", "addr", "add", &addr, "dev", ifname, "nodad"])
            .map(drop)
    }

    /// Deletes the namespace while the guard lives on (a pod sandbox or container that went
    /// away); [`Netns::restore`] brings an empty one back under the same name.
    pub fn remove(&self) -> Result<()> {
        delete(&self.name)
    }

    /// A new, empty namespace under the name of one [`Netns::remove`]d, set up as by
    /// [`Netns::new`].
    pub fn restore(&self) -> Result<()> {
        add_netns(&self.name)?;
        self.setup()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/NAME`, the handle `setns(2)` and `ip netns` use.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// Every namespace name `ip netns list` shows, ours or not.
    pub fn list() -> Result<Vec<String>> {
        let out = output(ip().args(["netns", "list"]))?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect())
    }

    /// Deletes the `lbt-*` namespaces whose owning process is gone and returns their names.
    /// Namespaces of live processes (concurrent test binaries included) are left alone; a
    /// deletion that fails is printed, not returned, so that one stuck leftover does not stop
    /// the test that found it.
    pub fn stale_cleanup() -> Result<Vec<String>> {
        // Under the `ip netns add` lock: a name whose file exists but is not yet mounted is
        // being created (by a test that names a dead pid on purpose, or a run that reuses
        // one), and deleting it then would make that `ip netns add` fail.
        let _lock = netns_add_lock()?;
        let mut removed = Vec::new();
        for name in Netns::list()? {
            if owner_pid(&name).is_none_or(pid_alive) {
                continue;
            }
            match delete(&name) {
                Ok(()) => removed.push(name),
                Err(e) => eprintln!("lb-tests: cannot delete stale netns {name}: {e:#}"),
            }
        }
        Ok(removed)
    }

    /// `ip netns exec NAME args...`; its stdout.
    pub fn exec<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output(ip().args(["netns", "exec", &self.name]).args(args))
    }

    /// `ip -n NAME args...`; its stdout.
    pub fn ip<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output(ip().args(["-n", &self.name]).args(args))
    }

    /// A `sh -ec` snippet inside the namespace; its stdout.
    pub fn sh(&self, script: &str) -> Result<String> {
        self.exec(["sh", "-ec", script])
    }

    /// Runs `f` on a fresh thread that has entered the namespace (`setns(CLONE_NEWNET)`), and
    /// returns its result; a panic in `f` is resumed on the caller. Sockets `f` creates stay in
    /// the namespace for their whole life, whichever thread uses them later, and threads `f`
    /// spawns start in the namespace: that is how a long-lived server runs in it.
    pub fn run<F, R>(&self, f: F) -> Result<R>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let path = self.path();
        let ns = File::open(&path).with_context(|| format!("open {}", path.display()))?;
        std::thread::scope(|s| {
            let worker = s.spawn(move || {
                // SAFETY: `ns` is an open namespace fd; setns only changes this thread's netns.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error())
                        .with_context(|| format!("setns into {}", path.display()));
                }
                Ok(f())
            });
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Writes `/proc/sys/<key with dots as slashes>` as seen from inside the namespace (the
    /// `net.*` tree is per network namespace, resolved for the calling thread).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        self.run(|| fs::write(&path, value))?
            .with_context(|| format!("sysctl {key}={value} in {}", self.name))
    }

    /// The interface names in the namespace, `lo` included, in ifindex order.
    pub fn links(&self) -> Result<Vec<String>> {
        let out = self.ip(["-o", "link", "show"])?;
        // `2: eth0@if3: <...>`: the veth peer suffix is not part of the name.
        Ok(out
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .filter_map(|n| n.split('@').next())
            .map(str::to_owned)
            .collect())
    }

    /// Turns tx checksum offload of `ifname` on or off (`ethtool -K IF tx on|off`). With it on,
    /// the stack hands a veth CHECKSUM_PARTIAL packets whose L4 checksum holds only the
    /// pseudo-header sum, and the receiving side sees them that way; with it off the sender
    /// computes full checksums. A dataplane must be right for both.
    pub fn set_tx_checksum(&self, ifname: &str, on: bool) -> Result<()> {
        let state = if on { "on" } else { "off" };
        self.exec(["ethtool", "-K", ifname, "tx", state]).map(drop)
    }

    /// Whether tx checksum offload of `ifname` is on (`ethtool -k`).
    pub fn tx_checksum(&self, ifname: &str) -> Result<bool> {
        self.feature(ifname, "tx-checksumming")
    }

    /// Turns GRO of `ifname` on or off (`ethtool -K IF gro on|off`).
    pub fn set_gro(&self, ifname: &str, on: bool) -> Result<()> {
        let state = if on { "on" } else { "off" };
        self.exec(["ethtool", "-K", ifname, "gro", state]).map(drop)
    }

    /// Whether GRO of `ifname` is on (`ethtool -k`).
    pub fn gro(&self, ifname: &str) -> Result<bool> {
        self.feature(ifname, "generic-receive-offload")
    }

    /// Whether the offload `feature` of `ifname` is on, as `ethtool -k` names it.
    fn feature(&self, ifname: &str, feature: &str) -> Result<bool> {
        let out = self.exec(["ethtool", "-k", ifname])?;
        let state = out
            .lines()
            .find_map(|l| l.strip_prefix(feature)?.strip_prefix(':'))
            .with_context(|| format!("no {feature} in `ethtool -k {ifname}`: {out}"))?;
        Ok(state.trim_start().starts_with("on"))
    }

    /// Creates the veth pair `local` (here) — `peer_if` (in `peer`), both down. The peer end is
    /// created directly in `peer`, never in the root namespace.
    pub(crate) fn veth(&self, local: &str, peer: &Netns, peer_if: &str) -> Result<()> {
        self.ip([
            "link", "add", local, "type", "veth", "peer", "name", peer_if, "netns", &peer.name,
        ])
        .map(drop)
    }

    /// Makes `port` a port of `bridge` and brings it up.
    pub(crate) fn enslave(&self, port: &str, bridge: &str) -> Result<()> {
        self.ip(["link", "set", port, "master", bridge, "up"])
            .map(drop)
    }

    /// Brings `ifname` up, with `addr/24` when given.
    pub(crate) fn up(&self, ifname: &str, addr: Option<Ipv4Addr>) -> Result<()> {
        if let Some(addr) = addr {
            self.ip([
                "addr",
                "add",
                &format!("{addr}/{PREFIX_LEN}"),
                "dev",
                ifname,
            ])?;
        }
        self.ip(["link", "set", ifname, "up"]).map(drop)
    }

    /// `eth0` up with `addr`, and a default route via `gateway` if any.
    fn endpoint(&self, addr: Ipv4Addr, gateway: Option<Ipv4Addr>) -> Result<()> {
        self.up(ENDPOINT_IF, Some(addr))?;
        if let Some(gw) = gateway {
            self.ip(["route", "add", "default", "via", &gw.to_string()])?;
        }
        Ok(())
    }

    /// The node forwards (its DNATed and masqueraded packets are forwarded ones) and sends no
    /// ICMP redirects: a packet that leaves by the interface it came in on (hairpin, or every
    /// packet in the single-interface topology) must not teach the sender to bypass the node.
    fn make_router(&self) -> Result<()> {
        for (key, value) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
        ] {
            self.sysctl(key, value)?;
        }
        Ok(())
    }

    /// A bridge with an address of its own, as Docker and the CNI bridge plugin make theirs:
    /// otherwise it takes its ports' lowest MAC, so plugging in a port with a lower one changes
    /// it, and the kernel flushes the bridge's neighbours (`neigh_changeaddr`).
    pub(crate) fn create_bridge(&self, bridge: &str) -> Result<()> {
        // Locally administered, unicast, and one per namespace (the names are unique).
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&self.name, &mut h);
        let b = std::hash::Hasher::finish(&h).to_be_bytes();
        let mac = format!(
            "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4]
        );
        self.ip(["link", "add", bridge, "address", &mac, "type", "bridge"])?;
        self.up(bridge, None)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // A namespace left behind is a test that did not clean up: it fails, as aya's guard
        // fails it. Unless the test is failing already (Drop runs during unwinding too, and a
        // second panic would abort the binary and hide the first): then it is only reported.
        if let Err(e) = delete(&self.name) {
            let message = format!("lb-tests: cannot delete netns {}: {e:#}", self.name);
            if std::thread::panicking() {
                eprintln!("{message}");
            } else {
                panic!("{message}");
            }
        }
    }
}

/// A client, a node (where lb runs) and N backends, each in its own namespace.
///
/// [`Topology::new`] (routed): the node is the router between a client subnet and a backend
/// subnet, and the backends' default route is the node, so lb sees both directions of every
/// flow and a backend sees the real client address unless lb masquerades.
/// ```text
/// client 10.10.0.2 eth0 ─veth─ lbc0 10.10.0.1  node  lbbr0 10.20.0.1 ─┬─ lbb0 ─veth─ eth0 10.20.0.10 backend 0
///                                                                      └─ lbb1 ─veth─ eth0 10.20.0.11 backend 1 …
/// ```
/// [`Topology::single_interface`] (moby's LB sandbox): see there.
///
/// Fields drop in declaration order — backends, client, switch, node — and deleting a namespace
/// destroys its veth pairs, so dropping a topology leaves nothing behind.
#[derive(Debug)]
pub struct Topology {
    pub backends: Vec<Netns>,
    pub client: Netns,
    /// The namespace holding the shared bridge of [`Topology::single_interface`].
    pub switch: Option<Netns>,
    pub node: Netns,
    pub client_ip: Ipv4Addr,
    /// The node address the client talks to (its gateway in the routed topology).
    pub node_ip: Ipv4Addr,
    /// The node address on the backends' link: the source backends see when lb masquerades.
    pub node_backend_ip: Ipv4Addr,
    /// `backend_ips[i]` is the address of `backends[i]`.
    pub backend_ips: Vec<Ipv4Addr>,
    /// The node interfaces lb attaches to; the first faces the client and carries VIP aliases.
    pub node_ifaces: Vec<String>,
    /// The IPv6 addresses of [`Topology::dual_stack`] (`None` and empty elsewhere), as the
    /// IPv4 fields above.
    pub ipv6: Option<Ipv6Addrs>,
}

/// The IPv6 side of [`Topology::dual_stack`].
#[derive(Clone, Debug)]
pub struct Ipv6Addrs {
    pub client: Ipv6Addr,
    pub node: Ipv6Addr,
    pub node_backend: Ipv6Addr,
    /// `backends[i]` is the IPv6 address of backend `i`.
    pub backends: Vec<Ipv6Addr>,
}

/// The addresses of a topology variant; backends are numbered up from `first_backend`.
struct Addressing {
    client: Ipv4Addr,
    node: Ipv4Addr,
    node_backend: Ipv4Addr,
    first_backend: Ipv4Addr,
}

impl Topology {
    /// The routed topology (see [`Topology`]): client 10.10.0.2/24 via node `lbc0` 10.10.0.1;
    /// node bridge `lbbr0` 10.20.0.1/24 with one veth port `lbb<i>` per backend; backend i at
    /// 10.20.0.(10+i)/24 with its default route via 10.20.0.1.
    pub fn new(n_backends: usize) -> Result<Topology> {
        let topo = Topology::create(
            n_backends,
            false,
            Addressing {
                client: Ipv4Addr::new(10, 10, 0, 2),
                node: Ipv4Addr::new(10, 10, 0, 1),
                node_backend: Ipv4Addr::new(10, 20, 0, 1),
                first_backend: Ipv4Addr::new(10, 20, 0, 10),
            },
            &[NODE_CLIENT_IF, NODE_BRIDGE],
        )?;
        let node = &topo.node;
        node.make_router()?;
        node.veth(NODE_CLIENT_IF, &topo.client, ENDPOINT_IF)?;
        node.up(NODE_CLIENT_IF, Some(topo.node_ip))?;
        node.create_bridge(NODE_BRIDGE)?;
        node.up(NODE_BRIDGE, Some(topo.node_backend_ip))?;
        for (i, backend) in topo.backends.iter().enumerate() {
            let port = Self::bridge_port(i);
            node.veth(&port, backend, ENDPOINT_IF)?;
            node.enslave(&port, NODE_BRIDGE)?;
        }
        topo.client.endpoint(topo.client_ip, Some(topo.node_ip))?;
        for (backend, &addr) in topo.backends.iter().zip(&topo.backend_ips) {
            backend.endpoint(addr, Some(topo.node_backend_ip))?;
        }
        Ok(topo)
    }

    /// [`Topology::new`] with IPv6 beside IPv4 on every link: client fd10::2/64 via node
    /// `lbc0` fd10::1/64; node bridge `lbbr0` fd20::1/64; backend i at fd20::(a+i)/64 (hex, as
    /// 10+i) with its default route via fd20::1. Every address given skips duplicate address
    /// detection (`nodad`), and the topology is returned once the kernel's own link-local
    /// addresses are through it; the node forwards IPv6.
    pub fn dual_stack(n_backends: usize) -> Result<Topology> {
        let mut topo = Topology::new(n_backends)?;
        let v6 = |net: u16, host: u16| Ipv6Addr::new(0xfd00 + net, 0, 0, 0, 0, 0, 0, host);
        let addrs = Ipv6Addrs {
            client: v6(0x10, 2),
            node: v6(0x10, 1),
            node_backend: v6(0x20, 1),
            backends: (0..n_backends).map(|i| v6(0x20, 0x10 + i as u16)).collect(),
        };
        for ns in topo.namespaces() {
            ns.enable_ipv6()?;
        }
        topo.node.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        topo.node.add_ipv6(addrs.node, NODE_CLIENT_IF)?;
        topo.node.add_ipv6(addrs.node_backend, NODE_BRIDGE)?;
        topo.client.add_ipv6(addrs.client, ENDPOINT_IF)?;
        let gw = addrs.node.to_string();
        topo.client
            .ip(["-6", "route", "add", "default", "via", &gw])?;
        let gw = addrs.node_backend.to_string();
        for (backend, &addr) in topo.backends.iter().zip(&addrs.backends) {
            backend.add_ipv6(addr, ENDPOINT_IF)?;
            backend.ip(["-6", "route", "add", "default", "via", &gw])?;
        }
        topo.ipv6 = Some(addrs);
        topo.settle_ipv6()?;
        Ok(topo)
    }

    /// Waits (up to 5 s) until no namespace has a tentative IPv6 address: the link-local
    /// addresses the kernel gives every interface go through duplicate address detection,
    /// and until they are through, neighbour discovery and the first datagrams of a path
    /// may be lost (a fragmented UDP datagram sent at once was, 1 time in 3).
    pub(crate) fn settle_ipv6(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for ns in self.namespaces() {
            while !ns
                .ip(["-6", "addr", "show", "tentative"])?
                .trim()
                .is_empty()
            {
                ensure!(
                    std::time::Instant::now() < deadline,
                    "{}: IPv6 addresses still tentative after 5 s",
                    ns.name()
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The IPv6 addresses of a [`Topology::dual_stack`].
    pub fn v6(&self) -> &Ipv6Addrs {
        self.ipv6.as_ref().expect("a dual-stack topology")
    }

    /// [`Topology::single_interface`] with IPv6 beside IPv4 on the segment: node fd30::1/64,
    /// client fd30::2/64, backend i fd30::(10+i)/64 (hex), all on `eth0`, on-link only as the
    /// IPv4 side is (the client reaches everything on the segment directly); the node
    /// forwards IPv6. Returned once the link-local addresses are through duplicate address
    /// detection, as [`Topology::dual_stack`].
    pub fn single_interface_dual_stack(n_backends: usize) -> Result<Topology> {
        let mut topo = Topology::single_interface(n_backends)?;
        let v6 = |host: u16| Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, host);
        let addrs = Ipv6Addrs {
            client: v6(2),
            node: v6(1),
            node_backend: v6(1),
            backends: (0..n_backends).map(|i| v6(0x10 + i as u16)).collect(),
        };
        for ns in topo.namespaces() {
            ns.enable_ipv6()?;
        }
        topo.node.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        topo.node.add_ipv6(addrs.node, ENDPOINT_IF)?;
        topo.client.add_ipv6(addrs.client, ENDPOINT_IF)?;
        for (backend, &addr) in topo.backends.iter().zip(&addrs.backends) {
            backend.add_ipv6(addr, ENDPOINT_IF)?;
        }
        topo.ipv6 = Some(addrs);
        topo.settle_ipv6()?;
        Ok(topo)
    }

    /// Moby's LB sandbox: the node has ONE interface, `eth0` 10.30.0.1/24, on the same L2
    /// segment as the client (10.30.0.2) and the backends (10.30.0.(10+i)), and lb turns
    /// traffic around on that interface.
    ///
    /// The segment is a bridge `br0` in its own `switch` namespace with one veth port `sw<k>` per
    /// participant (sw0 = node, sw1 = client, sw2.. = backends: [`Topology::switch_port`]), so that every participant,
    /// the node included, has exactly `lo` + `eth0` and lb's programs on the node's `eth0` see
    /// only the node's own traffic (a bridge in the node namespace would switch client↔backend
    /// frames without any hook of the node's address seeing them, and would give the node more
    /// interfaces than the sandbox has).
    ///
    /// The client's default route is the node (so VIPs reach lb). The backends have no default
    /// route, only the on-link /24 — in moby their gateway is elsewhere (docker_gwbridge), never
    /// the sandbox — so a backend answers a client it sees directly, bypassing the node: replies
    /// only come back through lb when it masquerades (`always`), which is why moby does.
    pub fn single_interface(n_backends: usize) -> Result<Topology> {
        let topo = Topology::create(
            n_backends,
            true,
            Addressing {
                client: Ipv4Addr::new(10, 30, 0, 2),
                node: Ipv4Addr::new(10, 30, 0, 1),
                node_backend: Ipv4Addr::new(10, 30, 0, 1),
                first_backend: Ipv4Addr::new(10, 30, 0, 10),
            },
            &[ENDPOINT_IF],
        )?;
        let switch = topo
            .switch
            .as_ref()
            .context("single_interface has a switch")?;
        switch.create_bridge(SWITCH_BRIDGE)?;
        let participants = [
            (SWITCH_NODE_PORT.to_owned(), &topo.node),
            (SWITCH_CLIENT_PORT.to_owned(), &topo.client),
        ]
        .into_iter()
        .chain((topo.backends.iter().enumerate()).map(|(i, b)| (Self::switch_port(i), b)));
        for (port, ns) in participants {
            switch.veth(&port, ns, ENDPOINT_IF)?;
            switch.enslave(&port, SWITCH_BRIDGE)?;
        }
        topo.node.make_router()?;
        topo.node.endpoint(topo.node_ip, None)?;
        topo.client.endpoint(topo.client_ip, Some(topo.node_ip))?;
        for (backend, &addr) in topo.backends.iter().zip(&topo.backend_ips) {
            backend.endpoint(addr, None)?;
        }
        Ok(topo)
    }

    /// The namespaces and addresses of a variant, nothing linked yet. Clears leftovers of dead
    /// runs first, so that a crashed earlier run never breaks this one.
    fn create(
        n_backends: usize,
        switched: bool,
        addrs: Addressing,
        node_ifaces: &[&str],
    ) -> Result<Topology> {
        let first = addrs.first_backend.octets()[3];
        ensure!(
            usize::from(u8::MAX - first) >= n_backends,
            "{n_backends} backends do not fit in a /24 starting at {}",
            addrs.first_backend
        );
        Netns::stale_cleanup()?;
        let backend_ips = (0..n_backends)
            .map(|i| Ipv4Addr::from(u32::from(addrs.first_backend) + i as u32))
            .collect();
        // A field that fails to build returns early and drops the namespaces built before it.
        Ok(Topology {
            backends: (0..n_backends)
                .map(|i| Netns::new(&format!("b{i}")))
                .collect::<Result<_>>()?,
            client: Netns::new("client")?,
            switch: switched.then(|| Netns::new("switch")).transpose()?,
            node: Netns::new("node")?,
            client_ip: addrs.client,
            node_ip: addrs.node,
            node_backend_ip: addrs.node_backend,
            backend_ips,
            node_ifaces: node_ifaces.iter().map(|&s| s.to_owned()).collect(),
            ipv6: None,
        })
    }

    /// Deletes the node's client-facing veth (`lbc0`, and with it the client's `eth0`) and
    /// creates it again with the same names and addresses: an interface that went away and
    /// came back (a container restarted, a link recreated by its manager). Routed topology.
    pub fn recreate_client_link(&self) -> Result<()> {
        self.node.ip(["link", "del", NODE_CLIENT_IF])?;
        self.node.veth(NODE_CLIENT_IF, &self.client, ENDPOINT_IF)?;
        self.node.up(NODE_CLIENT_IF, Some(self.node_ip))?;
        self.client.endpoint(self.client_ip, Some(self.node_ip))
    }

    /// Plugs one more backend into the node bridge of [`Topology::new`], numbered and
    /// addressed as the others (a container started after the node's load balancer); returns
    /// its index.
    pub fn add_backend(&mut self) -> Result<usize> {
        let i = self.backends.len();
        let addr =
            Ipv4Addr::from(u32::from(*self.backend_ips.first().context("a backend")?) + i as u32);
        let backend = Netns::new(&format!("b{i}"))?;
        let port = Self::bridge_port(i);
        self.node.veth(&port, &backend, ENDPOINT_IF)?;
        self.node.enslave(&port, NODE_BRIDGE)?;
        backend.endpoint(addr, Some(self.node_backend_ip))?;
        self.backends.push(backend);
        self.backend_ips.push(addr);
        Ok(i)
    }

    /// Every namespace of the topology, in drop order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Netns> {
        self.backends
            .iter()
            .chain(iter::once(&self.client))
            .chain(&self.switch)
            .chain(iter::once(&self.node))
    }

    /// The node bridge's port facing backend `i` in [`Topology::new`].
    pub fn bridge_port(i: usize) -> String {
        format!("lbb{i}")
    }

    /// The switch's port facing backend `i` in [`Topology::single_interface`] (after the
    /// node's and the client's).
    pub fn switch_port(i: usize) -> String {
        format!("sw{}", i + 2)
    }

    /// Sets hairpin mode on every port of the node bridge of [`Topology::new`], as Docker (with
    /// the userland proxy off) and the CNI bridge plugin (`hairpinMode`) do on theirs.
    pub fn set_hairpin(&self, on: bool) -> Result<()> {
        let on = if on { "on" } else { "off" };
        for i in 0..self.backends.len() {
            let port = Self::bridge_port(i);
            self.node
                .ip(["link", "set", &port, "type", "bridge_slave", "hairpin", on])?;
        }
        Ok(())
    }

    /// Sets tx checksum offload on every interface of every namespace of the topology (bridges
    /// and bridge ports included: a port with offload off checksums in software on its way
    /// out), so that "offload off" means no packet anywhere in the test is CHECKSUM_PARTIAL.
    pub fn set_tx_checksum(&self, on: bool) -> Result<()> {
        for ns in self.namespaces() {
            for link in ns.links()? {
                if link != "lo" {
                    ns.set_tx_checksum(&link, on)?;
                }
            }
        }
        Ok(())
    }
}
