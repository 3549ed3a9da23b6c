//! Fragments of translated datagrams (IPv4's, and IPv6's by their fragment header), as Cilium's fragment map follows them: the first
//! fragment (the only one with an L4 header) records its datagram's ports, and later fragments
//! look them up to find their flow. Without reassembly, a later fragment that arrives before
//! its first passes untranslated (the kernel's conntrack, which reassembles, would translate
//! it); on the paths lb serves fragments arrive in order.
use lb_common::{FlowKeyOf, FragPorts};

use crate::{
    family::Inet,
    parse::{Frag, Packet},
};

/// Records a translated first fragment's ports (as they stood before translation: its later
/// fragments carry the same addresses).
#[inline(always)]
pub fn record<A: Inet>(p: &Packet<FlowKeyOf<A>>) {
    if let Frag::First(id) = p.frag {
        let ports = FragPorts {
            sport: p.key.sport,
            dport: p.key.dport,
        };
        A::frag_put(&p.key, id, &ports);
    }
}

/// Fills in a later fragment's ports from its datagram's record; false when there is none.
#[inline(always)]
pub fn follow<A: Inet>(p: &mut Packet<FlowKeyOf<A>>) -> bool {
    let Frag::Later(id) = p.frag else {
        return true;
    };
    match A::frag_get(&p.key, id) {
        Some(ports) => {
            p.key.sport = ports.sport;
            p.key.dport = ports.dport;
            true
        }
        None => false,
    }
}
