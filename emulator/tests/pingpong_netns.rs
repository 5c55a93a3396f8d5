//! `softverbs pingpong` between two hosts: two network namespaces created
//! here, joined by a veth pair, with addresses that exist only inside them
//! (10.200.x.0/24 and fd00:5376:x::/64). Needs root and `ip`; skips with a
//! line saying why otherwise.

mod pingpong_common;

use std::process::Command;

use pingpong_common::*;

/// Two namespaces and a veth pair between them, removed on drop.
struct Netns {
    a: String,
    b: String,
    subnet: u8,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn new() -> Result<Netns, String> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string));
        if euid.as_deref() != Some("0") {
            return Err("not root (creating network namespaces needs CAP_SYS_ADMIN)".into());
        }
        let id = std::process::id();
        let subnet = (id % 200) as u8 + 20;
        let n = Netns {
            a: format!("svpp{id}a"),
            b: format!("svpp{id}b"),
            subnet,
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (format!("sv{id}a"), format!("sv{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        for (ns, dev, host) in [(&n.a, &va, 1), (&n.b, &vb, 2)] {
            let v4 = format!("10.200.{subnet}.{host}/24");
            let v6 = format!("fd00:5376:{subnet:x}::{host}/64");
            ip(&["-n", ns, "addr", "add", &v4, "dev", dev])?;
            ip(&["-n", ns, "addr", "add", &v6, "dev", dev, "nodad"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    fn v4(&self, host: u8) -> String {
        format!("10.200.{}.{host}", self.subnet)
    }

    fn v6(&self, host: u8) -> String {
        format!("fd00:5376:{:x}::{host}", self.subnet)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it (and its peer).
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn setup() -> Option<Netns> {
    match Netns::new() {
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
    let a_gid = format!("GID ::ffff:10.200.{}.1\n", n.subnet);
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
