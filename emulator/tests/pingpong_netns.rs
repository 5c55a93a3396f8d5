//! `softverbs pingpong` between two hosts: two network namespaces created
//! here, joined by a veth pair, with addresses that exist only inside them
//! (10.200.x.0/24 and fd00:5376:x::/64). Needs root and `ip`; skips with a
//! line saying why otherwise.

mod pingpong_common;

use pingpong_common::*;

fn setup() -> Option<Netns> {
    match Netns::new("pp", 200, 20, 200, true) {
        Ok(n) => Some(n),
        Err(why) => {
            eprintln!("SKIP pingpong between network namespaces: {why}");
            None
        }
    }
}

#[test]
fn pingpong_between_two_namespaces() {
    let Some(n) = setup() else { return };
    let (ns_a, ns_b) = (Some(n.a.as_str()), Some(n.b.as_str()));
    // IPv4, each side on 4791 of its own "host": standard GIDs.
    let port = "18515";
    let (s, c) = run_pair(
        ns_a,
        &["-p", port, "-s", "1000", "-n", "200", "--warmup", "10"],
        ns_b,
        &[
            &n.v4(1),
            "-p",
            port,
            "-s",
            "1000",
            "-n",
            "200",
            "--warmup",
            "10",
            "--stats",
        ],
    );
    check_send_report(&s, 200);
    check_send_report(&c, 200);
    // As ibv_rc_pingpong prints it (inet_ntop).
    let a_gid = format!("GID ::ffff:{}\n", n.v4(1));
    assert!(c.contains("  remote address: LID 0x0000") && c.contains(&a_gid), "{c}");
    // IPv6 with the progress-thread engine, and an RDMA WRITE stream (path
    // MTU 1024: RoCE packets must fit the veth's 1500-byte MTU, DF is set).
    let v6 = n.v6(1);
    let (s, c) = run_pair(
        ns_a,
        &["-p", port, "-s", "3000", "-n", "50", "--engine", "thread"],
        ns_b,
        &[&v6, "-p", port, "-s", "3000", "-n", "50", "--engine", "thread"],
    );
    check_send_report(&s, 50);
    check_send_report(&c, 50);
    let (s, c) = run_pair(
        ns_a,
        &["-p", port, "--op", "write", "-s", "300000", "-n", "20", "-m", "1024"],
        ns_b,
        &[
            &n.v4(1),
            "-p",
            port,
            "--op",
            "write",
            "-s",
            "300000",
            "-n",
            "20",
            "-m",
            "1024",
        ],
    );
    assert!(c.contains("write: 20 x 300000 bytes"), "{c}");
    assert!(s.contains("data verified"), "{s}");
}
