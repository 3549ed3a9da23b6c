//! `lb version`: what this binary is and what this kernel can run of it.
use lb_user::dataplane::{
    ebpf::{self, TcMode},
    probe,
};
use serde::Serialize;

use super::render;

#[derive(Serialize)]
struct Version {
    version: &'static str,
    /// `git describe` of the checkout built (`unknown` outside one).
    commit: &'static str,
    /// The eBPF object embedded in the binary: its size and an FNV-1a 64 hash of it (two
    /// binaries with the same hash load the same programs).
    ebpf_object: Object,
    /// `uname -r`.
    kernel: String,
    /// How TC programs attach on this kernel by default (TCX from 6.6).
    tc: &'static str,
    /// The probe of `--dataplane auto`: `ok` with what it checked, or why not.
    probe: Probe,
}

#[derive(Serialize)]
struct Object {
    bytes: usize,
    fnv64: String,
}

#[derive(Serialize)]
struct Probe {
    /// `None`: not run (not root).
    ok: Option<bool>,
    said: String,
}

/// FNV-1a, 64 bits: a tag for the object, not a security hash.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn show(json: bool) {
    let object = ebpf::object();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|e| format!("unknown ({e})"), |s| s.trim().to_owned());
    let tc_mode = TcMode::detect();
    // SAFETY: geteuid has no preconditions.
    let probe = if unsafe { libc::geteuid() } != 0 {
        Probe {
            ok: None,
            said: "not run: loading programs needs root (run lb version as root)".to_owned(),
        }
    } else {
        match probe::probe(tc_mode) {
            Ok(what) => Probe {
                ok: Some(true),
                said: what,
            },
            Err(e) => Probe {
                ok: Some(false),
                said: format!("{e:#}; lb daemon --dataplane auto would use nftables"),
            },
        }
    };
    let v = Version {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("LB_COMMIT"),
        ebpf_object: Object {
            bytes: object.len(),
            fnv64: format!("{:016x}", fnv64(object)),
        },
        kernel,
        tc: match tc_mode {
            TcMode::Tcx => "tcx",
            TcMode::Netlink => "netlink",
        },
        probe,
    };
    render::show(json, &v, |v| {
        println!("lb {} (commit {})", v.version, v.commit);
        println!(
            "eBPF object: {} bytes, fnv64 {}",
            v.ebpf_object.bytes, v.ebpf_object.fnv64
        );
        println!("kernel: {} (TC by {})", v.kernel, v.tc);
        println!("probe: {}", v.probe.said);
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv64_is_the_reference_one() {
        // The FNV reference values of "" and "a".
        assert_eq!(super::fnv64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
