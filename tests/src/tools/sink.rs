//! A UDP sink: a socket in a namespace that counts what arrives, on a thread of its own.
use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::POLL;
use crate::netns::Netns;

/// What a [`UdpSink`] has received: datagrams in total and per source address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    pub datagrams: u64,
    pub sources: BTreeMap<SocketAddrV4, u64>,
}

/// A UDP socket bound in a namespace that reads and counts every datagram, on a thread of its
/// own, with a receive buffer large enough for a burst of a few ten thousand small datagrams
/// (the kernel counts `Udp InDatagrams` only when they are read, and drops what overflows the
/// buffer as `RcvbufErrors`). Dropping it stops the thread and closes the socket.
pub struct UdpSink {
    sock: Arc<UdpSocket>,
    shared: Arc<SinkShared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct SinkShared {
    stopping: AtomicBool,
    received: Mutex<Received>,
}

/// SO_RCVBUFFORCE of a [`UdpSink`]: above `net.core.rmem_max`, which only root may exceed.
const SINK_RCVBUF: libc::c_int = 32 << 20;

impl UdpSink {
    /// Binds `0.0.0.0:port` in `ns` and starts counting.
    pub fn bind(ns: &Netns, port: u16) -> Result<UdpSink> {
        let sock = ns
            .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))?
            .with_context(|| format!("udp sink: bind port {port} in {}", ns.name()))?;
        let size = SINK_RCVBUF;
        // SAFETY: setsockopt on a socket we own, with a c_int value of the right size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error()).context("udp sink: SO_RCVBUFFORCE");
        }
        let sock = Arc::new(sock);
        let shared = Arc::new(SinkShared::default());
        let thread = {
            let (sock, shared) = (sock.clone(), shared.clone());
            thread::Builder::new()
                .name(format!("udp-sink-{port}"))
                .spawn(move || sink_loop(&sock, &shared))
                .context("udp sink: spawn its thread")?
        };
        Ok(UdpSink {
            sock,
            shared,
            thread: Some(thread),
        })
    }

    /// Everything received so far.
    pub fn received(&self) -> Received {
        self.shared.received.lock().unwrap().clone()
    }

    /// Waits until at least `datagrams` have arrived, or `timeout` has passed, and returns
    /// what has arrived: the caller decides whether fewer is a failure.
    pub fn wait_for(&self, datagrams: u64, timeout: Duration) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.received();
            if received.datagrams >= datagrams || Instant::now() >= deadline {
                return received;
            }
            thread::sleep(POLL);
        }
    }
}

fn sink_loop(sock: &UdpSocket, shared: &SinkShared) {
    let mut buf = [0u8; 2048];
    while !shared.stopping.load(Ordering::SeqCst) {
        match sock.recv_from(&mut buf) {
            Ok((_, SocketAddr::V4(from))) if !shared.stopping.load(Ordering::SeqCst) => {
                let mut received = shared.received.lock().unwrap();
                received.datagrams += 1;
                *received.sources.entry(from).or_default() += 1;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if !shared.stopping.load(Ordering::SeqCst) {
                    eprintln!("lb-tests: udp sink: {e}");
                }
                return;
            }
        }
    }
}

impl Drop for UdpSink {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Linux wakes a thread blocked in recvfrom(2) on an unconnected UDP socket when it is
        // shut down (recvfrom returns 0), although shutdown itself reports ENOTCONN.
        // SAFETY: the fd stays open while `self` holds the socket.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
