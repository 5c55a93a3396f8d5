//! The ring ping-pong tool runs and reports figures in the documented form.

use std::process::Command;

#[test]
fn ring_pingpong_reports_one_way_times() {
    let out = Command::new(env!("CARGO_BIN_EXE_ring_pingpong"))
        .arg("200")
        .output()
        .expect("running ring_pingpong");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.starts_with("ring_pingpong size=24 iters=200 "), "{line}");
    for key in ["p50_oneway_ns=", "p99_oneway_ns=", "avg_oneway_ns="] {
        let v: f64 = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(key))
            .unwrap_or_else(|| panic!("{key} missing: {line}"))
            .parse()
            .unwrap_or_else(|e| panic!("{key}: {e}: {line}"));
        assert!(v > 0.0, "{key} {v}: {line}");
    }
}
