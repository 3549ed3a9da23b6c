//! `cargo xtask demo` stays green: the same code, against the real `lb` binary. Root only.
use std::path::Path;

use lb_tests::{demo, require_root};

#[test]
fn demo_spreads_300_requests_over_all_backends_on_both_paths() {
    if !require_root("demo_spreads_300_requests_over_all_backends_on_both_paths") {
        return;
    }
    let mut out = Vec::new();
    let result = demo::run(Path::new(env!("CARGO_BIN_EXE_lb")), 300, &mut out);
    let text = String::from_utf8_lossy(&out);
    println!("{text}");
    let r = result.unwrap();
    let total: usize = r.via_vip.values().chain(r.via_published.values()).sum();
    assert_eq!(total, 300, "every request answered");
    for (name, _) in &r.backends {
        // 150 uniform picks over 3 backends: P(a backend gets none) ≈ 3·(2/3)^150 ≈ 1e-26.
        assert!(
            r.via_vip.get(name).copied().unwrap_or(0) > 0,
            "{name} got nothing via the VIP"
        );
        assert!(
            r.via_published.get(name).copied().unwrap_or(0) > 0,
            "{name} got nothing via the published port"
        );
    }
    assert_eq!(r.peers, vec![r.client_ip], "backends saw the real client");
    let vip = demo::VIP.to_string();
    assert!(
        r.elements.contains(&vip),
        "elements name the VIP:\n{}",
        r.elements
    );
    assert!(
        r.elements.contains(&format!("tcp . {}", demo::PUBLISHED)),
        "elements name the published port:\n{}",
        r.elements
    );
    for (_, ip) in &r.backends {
        assert!(
            r.conntrack.contains(&ip.to_string()),
            "a flow to {ip}:\n{}",
            r.conntrack
        );
    }
    assert!(text.contains("==> done"));
}
