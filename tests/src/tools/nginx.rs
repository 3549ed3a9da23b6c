//! nginx as the backend server: a configuration of its own per instance, listening on the
//! ports asked for in a namespace.
use std::fs::{self, File};
use std::net::Ipv4Addr;
use std::path::Path;
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use super::{POLL, START_TIMEOUT, TempDir, Tool, in_netns, ports::tcp_accepts, read_for_error};
use crate::netns::Netns;

/// An nginx (Debian `nginx-light`) in a namespace that answers every request on
/// `0.0.0.0:port` with 200 and the body `"{name} $remote_addr:$remote_port\n"`, the
/// [`crate::traffic::Reply`] line: which backend answered and which client address it saw.
///
/// Built for connection storms and long keep-alive runs (one process, `backlog=4096`,
/// `keepalive_requests` 1,000,000, no access log); `Connection: close` closes after each
/// answer. Its configuration, pid file, error log and temp paths live in a private temp dir;
/// dropping it kills nginx (by its pid) and removes that dir.
pub struct Nginx {
    name: String,
    port: u16,
    // Dropped before `dir`: nginx is dead before its prefix goes.
    process: Tool,
    dir: TempDir,
}

impl Nginx {
    /// Starts nginx as `name` on `port` in `ns` and waits until a TCP connect from inside `ns`
    /// is accepted. If nginx exits first, or never accepts within [`START_TIMEOUT`], the error
    /// carries its stderr and error log. `name` is one token of `[A-Za-z0-9_.-]` (it goes into
    /// the configuration and the reply line).
    pub fn start(ns: &Netns, name: &str, port: u16) -> Result<Nginx> {
        Nginx::start_ports(ns, name, &[port])
    }

    /// Like [`Nginx::start`], listening on every port of `ports` (one process, one listening
    /// socket each): a benchmark gives each run a port of its own, so that no run meets the
    /// TIME_WAIT sockets of another. [`Nginx::port`] is the first.
    pub fn start_ports(ns: &Netns, name: &str, ports: &[u16]) -> Result<Nginx> {
        Nginx::start_with(ns, name, ports, false)
    }

    /// Like [`Nginx::start`], listening on `[::]:port` too (a dual-stack backend).
    pub fn start_dual(ns: &Netns, name: &str, port: u16) -> Result<Nginx> {
        Nginx::start_with(ns, name, &[port], true)
    }

    /// [`Nginx::start_ports`] of a dual-stack backend: every port on `[::]` too.
    pub fn start_ports_dual(ns: &Netns, name: &str, ports: &[u16]) -> Result<Nginx> {
        Nginx::start_with(ns, name, ports, true)
    }

    fn start_with(ns: &Netns, name: &str, ports: &[u16], ipv6: bool) -> Result<Nginx> {
        let &[port, ..] = ports else {
            bail!("nginx {name}: no port to listen on");
        };
        ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
            "nginx name {name:?}: want one token of [A-Za-z0-9_.-]"
        );
        let dir = TempDir::new(&format!("nginx-{name}"))?;
        let conf = dir.join("nginx.conf");
        fs::write(&conf, nginx_conf(dir.path(), name, ports, ipv6))
            .with_context(|| format!("writing {}", conf.display()))?;
        let log = File::create(dir.join("stderr.log")).context("creating nginx's stderr.log")?;
        let mut cmd = in_netns(ns, None, "/usr/sbin/nginx", None::<&str>);
        // -e: the error log nginx opens before it has read the configuration (by default
        // /var/log/nginx/error.log); -p: the prefix relative paths resolve against.
        cmd.arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdout(log.try_clone()?)
            .stderr(log);
        let process = Tool::spawn(cmd, &format!("nginx {name} in {}", ns.name()))?;
        let mut nginx = Nginx {
            name: name.to_owned(),
            port,
            process,
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = nginx.process.exited()? {
                bail!(
                    "nginx {name} in {} exited ({status}); stderr: {}\nerror log: {}",
                    ns.name(),
                    read_for_error(&nginx.dir.join("stderr.log")),
                    read_for_error(&nginx.dir.join("error.log")),
                );
            }
            // nginx opens every listening socket before it accepts on any.
            if tcp_accepts(ns, Ipv4Addr::LOCALHOST, port)? {
                return Ok(nginx);
            }
            ensure!(
                Instant::now() < deadline,
                "nginx {name} in {} does not accept on port {port} after {START_TIMEOUT:?}; \
                 error log: {}",
                ns.name(),
                read_for_error(&nginx.dir.join("error.log")),
            );
            thread::sleep(POLL);
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// nginx's pid (one process: `master_process off`).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The private prefix dir (configuration, pid file, logs, temp paths).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The whole configuration of [`Nginx`]: every path nginx would write is under `dir`.
fn nginx_conf(dir: &Path, name: &str, ports: &[u16], ipv6: bool) -> String {
    let dir = dir.display();
    let listen: String = (ports.iter())
        .map(|port| {
            let v6 = if ipv6 {
                format!("        listen [::]:{port} ipv6only=on backlog=4096;\n")
            } else {
                String::new()
            };
            format!("        listen 0.0.0.0:{port} backlog=4096;\n{v6}")
        })
        .collect();
    format!(
        r#"# One process in the foreground, so the test's pid is nginx's and nothing outlives it.
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections 8192;
    multi_accept on;
}}

http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # A keep-alive run (wrk) keeps its connections for the whole run.
    keepalive_requests 1000000;
    keepalive_timeout 60s;

    server {{
{listen}        location / {{
            default_type text/plain;
            return 200 "{name} $remote_addr:$remote_port\n";
        }}
    }}
}}
"#
    )
}
