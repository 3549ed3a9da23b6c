//! The DSR session rules (see [`DsrSession`]): when a session counts as live and when a
//! packet of it rewrites its time. Run by the programs per packet and by whatever in the
//! controller reads the table (idle time, expiry), and unit-tested here.
//!
//! A session's `seen_ns` is the time of a recent packet, not always of the last one: it is
//! rewritten once the stored time lags by more than [`refresh_ns`] (a write per packet
//! would bounce the entry's cache line between the CPUs of a busy session, as for flows,
//! `flow::REFRESH_NS`). The lag is bounded by a fraction of the timeout, so a session with
//! packets at least that often never ends, however short its timeout.
use crate::{
    Addr, DsrSessionOf,
    flow::{NS_PER_SEC, REFRESH_NS},
};

/// A session whose last packet is at most `timeout_secs` old at `now` (its VIP's
/// `Service::session_timeout`) is live; an older one counts as absent.
#[inline(always)]
pub fn live<A: Addr>(s: &DsrSessionOf<A>, timeout_secs: u32, now: u64) -> bool {
    now <= s.seen_ns + u64::from(timeout_secs) * NS_PER_SEC
}

/// How far `seen_ns` may lag behind a session's latest packet: [`REFRESH_NS`], or an eighth
/// of a shorter timeout.
#[inline(always)]
pub fn refresh_ns(timeout_secs: u32) -> u64 {
    let eighth = u64::from(timeout_secs) * (NS_PER_SEC / 8);
    if eighth < REFRESH_NS {
        eighth
    } else {
        REFRESH_NS
    }
}

/// Whether a packet at `now` of live session `s` writes its time.
#[inline(always)]
pub fn refresh_due<A: Addr>(s: &DsrSessionOf<A>, timeout_secs: u32, now: u64) -> bool {
    now > s.seen_ns + refresh_ns(timeout_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DsrSession;

    fn at(seen_ns: u64) -> DsrSession {
        DsrSession {
            seen_ns,
            ..Default::default()
        }
    }

    #[test]
    fn a_session_lives_its_timeout_after_its_last_packet() {
        let s = at(100 * NS_PER_SEC);
        assert!(live(&s, 60, 160 * NS_PER_SEC), "exactly the timeout");
        assert!(!live(&s, 60, 160 * NS_PER_SEC + 1), "past it");
        assert!(
            !live(&s, 0, 100 * NS_PER_SEC + 1),
            "no timeout: gone at once"
        );
    }

    #[test]
    fn the_time_is_rewritten_once_it_lags_a_second_or_an_eighth_of_the_timeout() {
        let s = at(100 * NS_PER_SEC);
        assert!(!refresh_due(&s, 60, 100 * NS_PER_SEC + REFRESH_NS));
        assert!(refresh_due(&s, 60, 100 * NS_PER_SEC + REFRESH_NS + 1));
        // 1 s timeout: an eighth (125 ms), so packets every 200 ms keep the session.
        assert_eq!(refresh_ns(1), NS_PER_SEC / 8);
        let mut s = at(0);
        for t in (1..=50).map(|i| i * NS_PER_SEC / 5) {
            assert!(
                live(&s, 1, t),
                "packets every 200 ms keep a 1 s session: {t}"
            );
            if refresh_due(&s, 1, t) {
                s.seen_ns = t;
            }
        }
    }
}
