//! The capabilities `lb daemon` needs, checked before it locks, probes or changes anything:
//! a daemon without them would otherwise probe the kernel, fall back to nftables and only
//! then fail on a permission, with something half-done.
//!
//! The set is what `dist/lb.service` grants, no more (a test below holds the two together).
//! The kernel accepts CAP_SYS_ADMIN in place of CAP_BPF and CAP_PERFMON, but lb asks for each
//! by name: a unit lists what eBPF uses, and the check does not depend on that overlap.
use anyhow::{Context as _, Result, bail};

use super::DataplaneChoice;

/// A capability: its number (linux/capability.h), its name, and what lb uses it for.
type Cap = (u32, &'static str, &'static str);

/// Needed by every dataplane.
const ALWAYS: [Cap; 3] = [
    (
        12,
        "CAP_NET_ADMIN",
        "nftables, links and addresses, attaching programs",
    ),
    (
        21,
        "CAP_SYS_ADMIN",
        "entering network namespaces, mounting the bpffs",
    ),
    (
        10,
        "CAP_NET_BIND_SERVICE",
        "holding published ports below 1024",
    ),
];

/// Needed where the eBPF dataplane may run (`--dataplane auto` or `ebpf`).
const EBPF: [Cap; 2] = [
    (39, "CAP_BPF", "creating maps and loading programs"),
    (
        38,
        "CAP_PERFMON",
        "loading programs without the verifier's restrictions for unprivileged users",
    ),
];

/// The capabilities `choice` needs, as a unit's `AmbientCapabilities=` lists them.
pub fn needed(choice: DataplaneChoice) -> Vec<Cap> {
    let ebpf: &[Cap] = match choice {
        DataplaneChoice::Nftables => &[],
        DataplaneChoice::Auto | DataplaneChoice::Ebpf => &EBPF,
    };
    ebpf.iter().chain(&ALWAYS).copied().collect()
}

/// Fails, naming every missing capability, unless this process has all that `choice` needs.
pub fn check(choice: DataplaneChoice) -> Result<()> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let effective = effective(&status)?;
    let needed = needed(choice);
    let missing: Vec<String> = (needed.iter())
        .filter(|(bit, _, _)| effective & (1 << bit) == 0)
        .map(|(_, name, why)| format!("{name} ({why})"))
        .collect();
    if !missing.is_empty() {
        let all: Vec<&str> = needed.iter().map(|(_, name, _)| *name).collect();
        bail!(
            "missing capabilities: {}; lb daemon needs {} (run it as root, or grant them, e.g. systemd's AmbientCapabilities=); nothing was changed",
            missing.join(", "),
            all.join(" ")
        );
    }
    Ok(())
}

/// The effective set (`CapEff:`, hexadecimal) of a `/proc/PID/status`.
fn effective(status: &str) -> Result<u64> {
    let hex = (status.lines())
        .find_map(|l| l.strip_prefix("CapEff:"))
        .context("no CapEff line in /proc/self/status")?;
    u64::from_str_radix(hex.trim(), 16).with_context(|| format!("CapEff {:?}", hex.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_set() {
        let status = "Name:\tlb\nCapInh:\t0000000000000000\nCapEff:\t000000c000001400\n";
        let eff = effective(status).unwrap();
        let has = |bit: u32| eff & (1 << bit) != 0;
        // CAP_NET_BIND_SERVICE, CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF; not CAP_SYS_ADMIN.
        assert!(has(10) && has(12) && has(38) && has(39), "{eff:x}");
        assert!(!has(21), "{eff:x}");
        assert!(effective("Name:\tlb\n").is_err(), "no CapEff line");
    }

    /// The shipped unit grants exactly what the check asks for on the default dataplane
    /// choice, in both of its lines: a capability added here and not there would stop the
    /// unit's daemon at start; one there and not here would be granted for nothing.
    #[test]
    fn the_shipped_unit_grants_exactly_the_checked_set() {
        let unit = include_str!("../../../dist/lb.service");
        let mut want: Vec<&str> = needed(DataplaneChoice::Auto)
            .iter()
            .map(|(_, name, _)| *name)
            .collect();
        want.sort_unstable();
        for key in ["CapabilityBoundingSet=", "AmbientCapabilities="] {
            let line = (unit.lines().find_map(|l| l.strip_prefix(key)))
                .unwrap_or_else(|| panic!("dist/lb.service has no {key} line"));
            let mut granted: Vec<&str> = line.split_whitespace().collect();
            granted.sort_unstable();
            assert_eq!(granted, want, "dist/lb.service {key}");
        }
    }
}
