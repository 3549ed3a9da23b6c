//! The kernel's protocol counters of a namespace (`/proc/net/snmp`, `/proc/net/netstat`).
use std::collections::HashMap;

use anyhow::{Context, Result, ensure};

use super::ports::proc_net;
use crate::netns::Netns;

/// `/proc/net/snmp` and `/proc/net/netstat` hold pairs of lines, `Sect: Name1 Name2 ...` and
/// `Sect: v1 v2 ...`: every value keyed by (section, name). Values are signed (`Tcp MaxConn`
/// is -1).
fn proc_net_table(text: &str) -> Result<HashMap<(String, String), i64>> {
    let mut table = HashMap::new();
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines
            .next()
            .with_context(|| format!("no values after {names:?}"))?;
        let (section, names) = names
            .split_once(": ")
            .with_context(|| format!("not a counter header: {names:?}"))?;
        let values = values
            .strip_prefix(section)
            .and_then(|v| v.strip_prefix(": "))
            .with_context(|| format!("{section} values expected, found {values:?}"))?;
        let (names, values): (Vec<_>, Vec<_>) = (
            names.split_whitespace().collect(),
            values.split_whitespace().collect(),
        );
        ensure!(
            names.len() == values.len(),
            "{section}: {} names, {} values",
            names.len(),
            values.len()
        );
        for (name, value) in names.into_iter().zip(values) {
            let value = value
                .parse()
                .with_context(|| format!("{section} {name} = {value:?}"))?;
            table.insert((section.to_owned(), name.to_owned()), value);
        }
    }
    Ok(table)
}

fn counter(table: &HashMap<(String, String), i64>, section: &str, name: &str) -> Result<u64> {
    let value = table
        .get(&(section.to_owned(), name.to_owned()))
        .with_context(|| format!("no counter {section} {name}"))?;
    u64::try_from(*value).with_context(|| format!("{section} {name} = {value}"))
}

/// A struct of named counters read from one `/proc/net` file, with `parse` and `since`.
macro_rules! counters {
    (
        $(#[$doc:meta])* $name:ident from $file:literal {
            $($(#[$field_doc:meta])* $field:ident = $section:literal $key:literal,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$field_doc])* pub $field: u64,)*
        }

        impl $name {
            /// Parses the text of the file.
            pub fn parse(text: &str) -> Result<$name> {
                let table = proc_net_table(text)?;
                Ok($name {
                    $($field: counter(&table, $section, $key)?,)*
                })
            }

            /// What each counter grew by since `earlier`.
            pub fn since(&self, earlier: &$name) -> $name {
                $name {
                    $($field: self.$field.saturating_sub(earlier.$field),)*
                }
            }

            /// Reads the counters of `ns`.
            pub fn read(ns: &Netns) -> Result<$name> {
                let text = proc_net(ns, $file)?;
                $name::parse(&text).with_context(|| format!("/proc/net/{} in {}", $file, ns.name()))
            }
        }
    };
}

counters! {
    /// The counters of `/proc/net/snmp` (per namespace) a traffic test asks about: where
    /// datagrams, segments and ICMP errors went.
    Snmp from "snmp" {
        /// Forwarded by this namespace (the node, when it routes).
        ip_forw_datagrams = "Ip" "ForwDatagrams",
        ip_in_hdr_errors = "Ip" "InHdrErrors",
        ip_in_discards = "Ip" "InDiscards",
        icmp_in_dest_unreachs = "Icmp" "InDestUnreachs",
        /// Port (and other) unreachables sent, e.g. for a datagram to a port nobody binds.
        icmp_out_dest_unreachs = "Icmp" "OutDestUnreachs",
        /// Connections this namespace opened (one per connect, so one per request under
        /// `Connection: close`).
        tcp_active_opens = "Tcp" "ActiveOpens",
        tcp_passive_opens = "Tcp" "PassiveOpens",
        tcp_attempt_fails = "Tcp" "AttemptFails",
        tcp_estab_resets = "Tcp" "EstabResets",
        tcp_retrans_segs = "Tcp" "RetransSegs",
        tcp_in_errs = "Tcp" "InErrs",
        tcp_out_rsts = "Tcp" "OutRsts",
        tcp_in_csum_errors = "Tcp" "InCsumErrors",
        /// Datagrams delivered to a socket; counted when the application reads them.
        udp_in_datagrams = "Udp" "InDatagrams",
        /// Datagrams for a port nobody binds.
        udp_no_ports = "Udp" "NoPorts",
        udp_in_errors = "Udp" "InErrors",
        udp_out_datagrams = "Udp" "OutDatagrams",
        /// Datagrams dropped because the receiving socket's buffer was full.
        udp_rcvbuf_errors = "Udp" "RcvbufErrors",
        /// Datagrams dropped for a bad UDP checksum.
        udp_in_csum_errors = "Udp" "InCsumErrors",
    }
}

counters! {
    /// The `TcpExt` counters of `/proc/net/netstat` (per namespace) that show a lossy or
    /// overloaded TCP path.
    Netstat from "netstat" {
        /// SYNs sent again: a first SYN (or its SYN-ACK) was lost.
        tcp_syn_retrans = "TcpExt" "TCPSynRetrans",
        tcp_timeouts = "TcpExt" "TCPTimeouts",
        /// Connections dropped because a listener's accept queue was full.
        listen_overflows = "TcpExt" "ListenOverflows",
        listen_drops = "TcpExt" "ListenDrops",
        tcp_abort_on_data = "TcpExt" "TCPAbortOnData",
        /// SYNs a socket in TIME_WAIT refused for an older TCP timestamp (answering with the
        /// old connection's ACK): another client connection sent onto a 4-tuple it closed.
        paws_timewait = "TcpExt" "PAWSTimewait",
    }
}

/// The `/proc/net/snmp` counters of `ns`.
pub fn snmp(ns: &Netns) -> Result<Snmp> {
    Snmp::read(ns)
}

/// The `/proc/net/netstat` `TcpExt` counters of `ns`.
pub fn netstat(ns: &Netns) -> Result<Netstat> {
    Netstat::read(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of a real /proc/net/snmp (6.18) and its TcpExt line pair, shortened.
    const SNMP: &str = "\
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 1 64 3012 0 0 3001 0 0 11 11 0 0 0 0 0 0 0 0 0 3012
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs InTimeExcds InParmProbs InSrcQuenchs InRedirects InEchos InEchoReps InTimestamps InTimestampReps InAddrMasks InAddrMaskReps OutMsgs OutErrors OutRateLimitGlobal OutRateLimitHost OutDestUnreachs OutTimeExcds OutParmProbs OutSrcQuenchs OutRedirects OutEchos OutEchoReps OutTimestamps OutTimestampReps OutAddrMasks OutAddrMaskReps
Icmp: 2 0 0 2 0 0 0 0 0 0 0 0 0 0 1 0 0 0 1 0 0 0 0 0 0 0 0 0 0
IcmpMsg: InType3 OutType3
IcmpMsg: 2 1
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 31518 0 2 56 0 813594 743634 7 0 16534 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 3000 1 2851 0 2751 0 100 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
";

    #[test]
    fn snmp_counters_are_read_by_section_and_name() {
        let s = Snmp::parse(SNMP).unwrap();
        assert_eq!(s.ip_forw_datagrams, 3001);
        assert_eq!(s.icmp_out_dest_unreachs, 1);
        assert_eq!(s.icmp_in_dest_unreachs, 2);
        assert_eq!(
            (s.tcp_active_opens, s.tcp_attempt_fails, s.tcp_estab_resets),
            (31_518, 2, 56)
        );
        assert_eq!((s.tcp_retrans_segs, s.tcp_out_rsts), (7, 16_534));
        // Udp, not UdpLite, whose names are the same.
        assert_eq!(
            (
                s.udp_in_datagrams,
                s.udp_no_ports,
                s.udp_in_errors,
                s.udp_rcvbuf_errors,
                s.udp_in_csum_errors
            ),
            (3000, 1, 2851, 2751, 100)
        );
        let earlier = Snmp {
            udp_in_datagrams: 1000,
            ..s
        };
        assert_eq!(s.since(&earlier).udp_in_datagrams, 2000);
        assert_eq!(s.since(&earlier).tcp_active_opens, 0);
    }

    #[test]
    fn counter_tables_refuse_what_they_cannot_pair() {
        assert!(Snmp::parse("Udp: InDatagrams NoPorts\nUdp: 1\n").is_err());
        assert!(Snmp::parse("Udp: InDatagrams\nTcp: 1\n").is_err());
        // A counter the kernel does not have is an error, not a zero.
        let netstat = "TcpExt: TCPSynRetrans ListenOverflows\nTcpExt: 3 0\n";
        assert!(Netstat::parse(netstat).is_err());
        let netstat = "TcpExt: SyncookiesSent TCPSynRetrans ListenOverflows ListenDrops TCPTimeouts TCPAbortOnData PAWSTimewait\nTcpExt: 0 3 1 1 4 0 7\nIpExt: InNoRoutes\nIpExt: 0\n";
        let n = Netstat::parse(netstat).unwrap();
        assert_eq!(
            (
                n.tcp_syn_retrans,
                n.listen_overflows,
                n.tcp_timeouts,
                n.paws_timewait
            ),
            (3, 1, 4, 7)
        );
    }
}
