//! A real etcd cluster for the cluster tests: Debian's `etcd-server` (etcd 3.4, the version
//! lb must work with) and its `etcdctl`, never a mock. N members, each in a namespace of its
//! own on one segment, a bridge in a `control` namespace; the hosts a test attaches (an lb
//! node's namespace, say) get a port on the same segment:
//! ```text
//!   control: br0 (10.40.0.0/24)
//!     m0 ─ eth0 10.40.0.10  etcd member 0: clients on :2379, peers on :2380
//!     m1 ─ eth0 10.40.0.11  etcd member 1
//!     m2 ─ eth0 10.40.0.12  etcd member 2
//!     h0 ─ IF   10.40.0.100 a host attached with [`EtcdCluster::attach`]
//! ```
//! So a test does to the cluster what happens to one in production, each through the tool an
//! operator would use: kill a member by its pid (the leader, found by `etcdctl endpoint
//! status`), start it again with its data, cut a host off by taking its link down, compact
//! the history with `etcdctl compact`. Every process is killed, every namespace deleted, on
//! drop (on unwind too).
use std::{
    net::Ipv4Addr,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::{
    netns::Netns,
    tools::{TempDir, Tool, in_netns, output_with_stdin},
};

/// The segment's bridge, in the control namespace.
const BRIDGE: &str = "br0";
/// A member's interface on the segment.
const MEMBER_IF: &str = "eth0";
const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;
/// How long a cluster (or a restarted member) may take to answer as healthy.
const HEALTHY_WITHIN: Duration = Duration::from_secs(20);

/// Member `i`'s address.
fn member_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 40, 0, 10 + i as u8)
}

/// One member: while it runs its process, its data directory, its namespace (dropped in
/// that order: the process is killed before its files and namespace go).
struct Member {
    process: Option<Tool>,
    data: TempDir,
    ns: Netns,
}

/// A running etcd cluster (see the module).
pub struct EtcdCluster {
    // Dropped in order: the members' processes (with their namespaces), then the segment.
    members: Vec<Member>,
    control: Netns,
    /// The token every member of this cluster was started with (a cluster of its own per
    /// test process and cluster).
    token: String,
    attached: u8,
    /// With [`EtcdCluster::start_tls`]: the certificates; clients then speak TLS and must
    /// show a client certificate the CA signed.
    tls: Option<Certs>,
}

/// The certificates of a TLS cluster: a CA, the members' (for every member address and
/// 127.0.0.1) and a client's, each a PEM file. Made with `openssl`, ECDSA P-256, valid a day.
pub struct Certs {
    dir: TempDir,
}

impl Certs {
    fn make(members: usize) -> Result<Certs> {
        let dir = TempDir::new("etcd-certs")?;
        let d = dir.path().to_owned();
        let openssl = |args: &[&str]| -> Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&d)
                .output()
                .context("running openssl")?;
            if !out.status.success() {
                bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &key,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=lbt-etcd-ca",
                ],
            ]
            .concat(),
        )?;
        let sans: Vec<String> = (0..members)
            .map(|i| format!("IP:{}", member_ip(i)))
            .chain(["IP:127.0.0.1".to_owned()])
            .collect();
        for (name, usage, san) in [
            ("server", "serverAuth,clientAuth", Some(sans.join(","))),
            ("client", "clientAuth", None),
        ] {
            openssl(
                &[
                    &["req"][..],
                    &key,
                    &[
                        "-keyout",
                        &format!("{name}.key"),
                        "-out",
                        &format!("{name}.csr"),
                        "-subj",
                        &format!("/CN=lbt-{name}"),
                    ],
                ]
                .concat(),
            )?;
            let mut ext = format!("extendedKeyUsage={usage}\n");
            if let Some(san) = san {
                ext.push_str(&format!("subjectAltName={san}\n"));
            }
            std::fs::write(d.join(format!("{name}.ext")), ext)?;
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "1",
                "-extfile",
                &format!("{name}.ext"),
            ])?;
        }
        Ok(Certs { dir })
    }

    /// A file of the set: `ca.pem`, `client.pem`, `client.key` (`server.*` are the members').
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one answers as healthy.
    pub fn start(n: usize) -> Result<EtcdCluster> {
        Self::start_with(n, None)
    }

    /// [`EtcdCluster::start`] with clients on TLS (`https://` endpoints), each required to
    /// show a client certificate of the cluster's CA ([`EtcdCluster::certs`]).
    pub fn start_tls(n: usize) -> Result<EtcdCluster> {
        Self::start_with(n, Some(Certs::make(n)?))
    }

    /// The certificates of a TLS cluster.
    pub fn certs(&self) -> Option<&Certs> {
        self.tls.as_ref()
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    fn start_with(n: usize, tls: Option<Certs>) -> Result<EtcdCluster> {
        let control = Netns::new("etcdctl")?;
        control.create_bridge(BRIDGE)?;
        let mut members = Vec::new();
        for i in 0..n {
            let ns = Netns::new(&format!("etcd{i}"))?;
            let port = format!("m{i}");
            control.veth(&port, &ns, MEMBER_IF)?;
            control.enslave(&port, BRIDGE)?;
            ns.up(MEMBER_IF, Some(member_ip(i)))?;
            members.push(Member {
                process: None,
                data: TempDir::new(&format!("etcd{i}"))?,
                ns,
            });
        }
        let mut cluster = EtcdCluster {
            members,
            control,
            token: format!("lbt-{}-{}", std::process::id(), unique()),
            attached: 0,
            tls,
        };
        for i in 0..n {
            cluster.run(i, "new")?;
        }
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    /// Starts member `i`'s process; `state` is etcd's `--initial-cluster-state` (`new` for
    /// the first start, `existing` for a member that starts again with its data).
    fn run(&mut self, i: usize, state: &str) -> Result<()> {
        let initial: Vec<String> = (0..self.members.len())
            .map(|k| format!("m{k}=http://{}:{PEER_PORT}", member_ip(k)))
            .collect();
        let ip = member_ip(i);
        let member = &mut self.members[i];
        let data = member.data.path().display().to_string();
        let log = std::fs::File::create(member.data.join("etcd.log"))
            .context("creating the member's log")?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let tls: Vec<String> = match &self.tls {
            Some(c) => vec![
                format!("--cert-file={}", c.file("server.pem")),
                format!("--key-file={}", c.file("server.key")),
                format!("--trusted-ca-file={}", c.file("ca.pem")),
                "--client-cert-auth".to_owned(),
            ],
            None => Vec::new(),
        };
        let mut cmd = in_netns(
            &member.ns,
            None,
            "etcd",
            [
                format!("--name=m{i}"),
                format!("--data-dir={data}/data"),
                format!(
                    "--listen-client-urls={scheme}://{ip}:{CLIENT_PORT},{scheme}://127.0.0.1:{CLIENT_PORT}"
                ),
                format!("--advertise-client-urls={scheme}://{ip}:{CLIENT_PORT}"),
                format!("--listen-peer-urls=http://{ip}:{PEER_PORT}"),
                format!("--initial-advertise-peer-urls=http://{ip}:{PEER_PORT}"),
                format!("--initial-cluster={}", initial.join(",")),
                format!("--initial-cluster-state={state}"),
                format!("--initial-cluster-token={}", self.token),
            ]
            .into_iter()
            .chain(tls),
        );
        cmd.stdout(log.try_clone()?).stderr(log);
        member.process = Some(Tool::spawn(cmd, &format!("etcd member {i}"))?);
        Ok(())
    }

    /// The client URL of every member: what an `lb daemon --cluster` is given.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len())
            .map(|i| format!("{}://{}:{CLIENT_PORT}", self.scheme(), member_ip(i)))
            .collect()
    }

    /// Member `i`'s namespace.
    pub fn member_ns(&self, i: usize) -> &Netns {
        &self.members[i].ns
    }

    /// The pid of member `i`'s etcd, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.as_ref().map(Tool::pid)
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.members[i].data.join("etcd.log")).unwrap_or_default()
    }

    /// Gives `host` a port on the segment, `ifname` there with the next host address, up;
    /// returns the address. The host reaches every member by it (taking `ifname` down cuts
    /// the host off the cluster).
    pub fn attach(&mut self, host: &Netns, ifname: &str) -> Result<Ipv4Addr> {
        let addr = Ipv4Addr::new(10, 40, 0, 100 + self.attached);
        let port = format!("h{}", self.attached);
        self.attached += 1;
        self.control.veth(&port, host, ifname)?;
        self.control.enslave(&port, BRIDGE)?;
        host.up(ifname, Some(addr))?;
        Ok(addr)
    }

    /// `etcdctl ARGS` run from the segment (member 0's namespace), against the members
    /// `endpoints` lists (every running one when empty); its output.
    pub fn etcdctl<S: AsRef<str>>(&self, endpoints: &[String], args: &[S]) -> Result<String> {
        self.etcdctl_in(&self.members[0].ns, endpoints, args, None)
    }

    /// [`EtcdCluster::etcdctl`] from namespace `ns` (a host [`attach`](Self::attach)ed), with
    /// `stdin` when given.
    pub fn etcdctl_in<S: AsRef<str>>(
        &self,
        ns: &Netns,
        endpoints: &[String],
        args: &[S],
        stdin: Option<&str>,
    ) -> Result<String> {
        let all: Vec<String> = (0..self.members.len())
            .filter(|&i| self.members[i].process.is_some())
            .map(|i| format!("{}://{}:{CLIENT_PORT}", self.scheme(), member_ip(i)))
            .collect();
        let endpoints = if endpoints.is_empty() {
            &all
        } else {
            endpoints
        };
        let mut cmd: Command = in_netns(
            ns,
            None,
            "etcdctl",
            std::iter::once(format!("--endpoints={}", endpoints.join(",")))
                .chain(["--command-timeout=5s".to_owned()])
                .chain((self.tls.iter()).flat_map(|c| {
                    [
                        format!("--cacert={}", c.file("ca.pem")),
                        format!("--cert={}", c.file("client.pem")),
                        format!("--key={}", c.file("client.key")),
                    ]
                }))
                .chain(args.iter().map(|a| a.as_ref().to_owned())),
        );
        cmd.env("ETCDCTL_API", "3");
        let out = output_with_stdin(&mut cmd, stdin.unwrap_or("").as_bytes())?;
        if !out.status.success() {
            bail!(
                "etcdctl {:?} failed ({}): {}{}",
                args.iter().map(AsRef::as_ref).collect::<Vec<_>>(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until every running member answers `etcdctl endpoint health`.
    pub fn wait_healthy(&mut self) -> Result<()> {
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            for i in 0..self.members.len() {
                if let Some(p) = &mut self.members[i].process
                    && let Some(status) = p.exited()?
                {
                    bail!("etcd member {i} exited with {status}:\n{}", self.log(i));
                }
            }
            match self.etcdctl::<&str>(&[], &["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "the etcd cluster is not healthy within {HEALTHY_WITHIN:?}"
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// The member that leads now, from `etcdctl endpoint status` of the running members
    /// (the one whose member id is the leader every one of them names).
    pub fn leader(&self) -> Result<usize> {
        let json = self.etcdctl::<&str>(&[], &["endpoint", "status", "-w", "json"])?;
        let v: Value = serde_json::from_str(&json).context("etcdctl's JSON")?;
        let rows = v.as_array().context("endpoint status is a list")?;
        for row in rows {
            let status = &row["Status"];
            if status["header"]["member_id"] == status["leader"] {
                let endpoint = row["Endpoint"].as_str().unwrap_or_default();
                return (0..self.members.len())
                    .find(|&i| {
                        endpoint == format!("{}://{}:{CLIENT_PORT}", self.scheme(), member_ip(i))
                    })
                    .with_context(|| format!("a leader at an unknown endpoint {endpoint}"));
            }
        }
        bail!("no member leads: {json}")
    }

    /// Kills member `i` with SIGKILL (by its pid) and reaps it; returns the pid.
    pub fn kill(&mut self, i: usize) -> Result<u32> {
        let tool = (self.members[i].process.take())
            .with_context(|| format!("etcd member {i} is not running"))?;
        let pid = tool.pid();
        drop(tool);
        Ok(pid)
    }

    /// Starts member `i` again with its data (after [`EtcdCluster::kill`]) and waits until
    /// the cluster is healthy.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if self.members[i].process.is_some() {
            bail!("etcd member {i} is running");
        }
        self.run(i, "existing")?;
        self.wait_healthy()
    }
}

/// A number of its own per cluster of this process.
fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
