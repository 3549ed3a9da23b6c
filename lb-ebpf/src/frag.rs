//! IPv4 fragments of translated datagrams, as Cilium's fragment map follows them: the first
//! fragment (the only one with an L4 header) records its datagram's ports, and later fragments
//! look them up to find their flow. Without reassembly, a later fragment that arrives before
//! its first passes untranslated (the kernel's conntrack, which reassembles, would translate
//! it); on the paths lb serves fragments arrive in order.
use aya_ebpf::bindings::BPF_ANY;
use lb_common::{FragKey, FragPorts};

use crate::{
    maps::FRAGS,
    parse::{Frag, Packet},
};

#[inline(always)]
fn key(p: &Packet, id: u32) -> FragKey {
    FragKey {
        saddr: p.key.saddr,
        daddr: p.key.daddr,
        // An IPv4 datagram's identification is 16 bits (`parse::packet4`).
        id: id as u16,
        proto: p.key.proto,
        _pad: 0,
    }
}

/// Records a translated first fragment's ports (as they stood before translation: its later
/// fragments carry the same addresses).
#[inline(always)]
pub fn record(p: &Packet) {
    if let Frag::First(id) = p.frag {
        let ports = FragPorts {
            sport: p.key.sport,
            dport: p.key.dport,
        };
        let _ = FRAGS.insert(&key(p, id), &ports, BPF_ANY as u64);
    }
}

/// Fills in a later fragment's ports from its datagram's record; false when there is none.
#[inline(always)]
pub fn follow(p: &mut Packet) -> bool {
    let Frag::Later(id) = p.frag else {
        return true;
    };
    // SAFETY: plain data copied out.
    match unsafe { FRAGS.get(&key(p, id)) } {
        Some(ports) => {
            p.key.sport = ports.sport;
            p.key.dport = ports.dport;
            true
        }
        None => false,
    }
}
