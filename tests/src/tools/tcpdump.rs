//! tcpdump capturing in a namespace: what a packet looked like on the wire.
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{POLL, START_TIMEOUT, Tool, collect, in_netns};
use crate::netns::Netns;

/// A tcpdump capture in a namespace (`-t -nn -v -l`: no timestamps): what a packet looked like on the wire,
/// decoded by the tool operators read packets with. Killed on drop.
pub struct Tcpdump {
    tool: Tool,
    stdout: JoinHandle<String>,
}

impl Tcpdump {
    /// Starts capturing `count` packets matching `filter` (a pcap filter) on `iface` of `ns`,
    /// and returns once tcpdump says it is listening (packets sent after that are seen).
    pub fn start(ns: &Netns, iface: &str, filter: &str, count: usize) -> Result<Tcpdump> {
        let mut cmd = in_netns(
            ns,
            None,
            "tcpdump",
            [
                "-i",
                iface,
                "-t",
                "-nn",
                "-v",
                "-l",
                "-c",
                &count.to_string(),
                filter,
            ],
        );
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut tool = Tool::spawn(cmd, "tcpdump")?;
        let stdout = collect(tool.child.stdout.take());
        let stderr = tool.child.stderr.take().context("tcpdump's stderr")?;
        // tcpdump says "tcpdump: listening on IFACE, ..." once its socket is bound and
        // filtering; its stderr is read to the end on a thread of its own (so tcpdump never
        // blocks on it), line by line to here.
        let (lines, said) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match said.recv_timeout(left) {
                Ok(line) if line.contains("listening on ") => break,
                Ok(line) => seen.push(line),
                Err(_) => bail!(
                    "tcpdump on {iface} in {} not listening within {START_TIMEOUT:?}: {}",
                    ns.name(),
                    seen.join("\n")
                ),
            }
        }
        Ok(Tcpdump { tool, stdout })
    }

    /// What tcpdump printed once it has captured its count, or within `limit` (then it is
    /// killed and what it printed so far is returned: the caller judges).
    pub fn finish(mut self, limit: Duration) -> Result<String> {
        let deadline = Instant::now() + limit;
        while self.tool.exited()?.is_none() && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        drop(self.tool);
        Ok(self.stdout.join().unwrap_or_default())
    }
}
