//! A link's MAC and counters, as `ip -j link` reports them.
use std::fmt;
use std::str::FromStr;

use anyhow::{Context, Result, ensure};

use crate::netns::Netns;

/// An Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for Mac {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Mac> {
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut mac {
            let part = parts.next().with_context(|| format!("short MAC {s:?}"))?;
            ensure!(part.len() == 2, "bad MAC {s:?}");
            *byte = u8::from_str_radix(part, 16).with_context(|| format!("bad MAC {s:?}"))?;
        }
        ensure!(parts.next().is_none(), "long MAC {s:?}");
        Ok(Mac(mac))
    }
}

/// `ip -j [-s] link show dev IFNAME` in `ns`: the one link object.
fn link_json(ns: &Netns, ifname: &str, stats: bool) -> Result<serde_json::Value> {
    let mut args = vec!["-j"];
    if stats {
        args.push("-s");
    }
    args.extend(["link", "show", "dev", ifname]);
    let out = ns.ip(&args)?;
    let mut links: Vec<serde_json::Value> = serde_json::from_str(&out)
        .with_context(|| format!("`ip {}` in {}: {out}", args.join(" "), ns.name()))?;
    ensure!(
        links.len() == 1,
        "`ip {}` in {}: {out}",
        args.join(" "),
        ns.name()
    );
    Ok(links.remove(0))
}

/// The Ethernet address of `ifname` in `ns` (`ip -j link show`).
pub fn link_mac(ns: &Netns, ifname: &str) -> Result<Mac> {
    let link = link_json(ns, ifname, false)?;
    link["address"]
        .as_str()
        .with_context(|| format!("{ifname} in {} has no address: {link}", ns.name()))?
        .parse()
}

/// A link's packet counters (`ip -j -s link show`, the kernel's 64-bit stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_errors: u64,
}

impl LinkStats {
    /// What each counter grew by since `earlier`.
    pub fn since(&self, earlier: &LinkStats) -> LinkStats {
        LinkStats {
            rx_packets: self.rx_packets.saturating_sub(earlier.rx_packets),
            rx_bytes: self.rx_bytes.saturating_sub(earlier.rx_bytes),
            rx_dropped: self.rx_dropped.saturating_sub(earlier.rx_dropped),
            rx_errors: self.rx_errors.saturating_sub(earlier.rx_errors),
            tx_packets: self.tx_packets.saturating_sub(earlier.tx_packets),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
            tx_dropped: self.tx_dropped.saturating_sub(earlier.tx_dropped),
            tx_errors: self.tx_errors.saturating_sub(earlier.tx_errors),
        }
    }
}

/// The counters of `ifname` in `ns`.
pub fn link_stats(ns: &Netns, ifname: &str) -> Result<LinkStats> {
    let link = link_json(ns, ifname, true)?;
    let stats = &link["stats64"];
    let get = |dir: &str, key: &str| {
        stats[dir][key]
            .as_u64()
            .with_context(|| format!("no stats64.{dir}.{key} for {ifname} in {}", ns.name()))
    };
    Ok(LinkStats {
        rx_packets: get("rx", "packets")?,
        rx_bytes: get("rx", "bytes")?,
        rx_dropped: get("rx", "dropped")?,
        rx_errors: get("rx", "errors")?,
        tx_packets: get("tx", "packets")?,
        tx_bytes: get("tx", "bytes")?,
        tx_dropped: get("tx", "dropped")?,
        tx_errors: get("tx", "errors")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_print() {
        let mac: Mac = "4e:c4:e7:7a:ee:0a".parse().unwrap();
        assert_eq!(mac, Mac([0x4e, 0xc4, 0xe7, 0x7a, 0xee, 0x0a]));
        assert_eq!(mac.to_string(), "4e:c4:e7:7a:ee:0a");
        for bad in [
            "4e:c4:e7:7a:ee",
            "4e:c4:e7:7a:ee:0a:01",
            "4e:c4:e7:7a:ee:0g",
            "4ec4e77aee0a",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
    }
}
