//! Running `softverbs pingpong` servers and clients as child processes.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Generous bound for one run (never reached unless something hangs).
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_softverbs")
}

/// A TCP port free on the loopback right now.
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `softverbs --no-embedded pingpong ARGS`, optionally inside `netns`.
pub fn spawn(netns: Option<&str>, args: &[&str]) -> Child {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin()]);
            c
        }
        None => Command::new(bin()),
    };
    cmd.args(["--no-embedded", "pingpong"]).args(args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("spawn softverbs")
}

/// The outcome of a child: (success, stdout, stderr). Kills it (by its
/// own pid) after `RUN_TIMEOUT`.
pub fn finish(mut child: Child) -> (bool, String, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status.is_some_and(|s| s.success()), out, err)
}

/// Runs a server and a client; returns their stdouts after checking that
/// both succeeded.
pub fn run_pair(
    server_ns: Option<&str>,
    server_args: &[&str],
    client_ns: Option<&str>,
    client_args: &[&str],
) -> (String, String) {
    let server = spawn(server_ns, server_args);
    // The client retries its TCP connection until the server listens.
    let client = spawn(client_ns, client_args);
    let (c_ok, c_out, c_err) = finish(client);
    let (s_ok, s_out, s_err) = finish(server);
    assert!(
        c_ok && s_ok,
        "pingpong failed\nserver {server_args:?}: ok={s_ok}\n{s_out}\n{s_err}\nclient {client_args:?}: ok={c_ok}\n{c_out}\n{c_err}"
    );
    (s_out, c_out)
}

/// Checks the report of a `--op send` run of `iters` iterations.
pub fn check_send_report(out: &str, iters: u32) {
    assert!(out.contains("  local address:  LID 0x0000, QPN 0x"), "{out}");
    assert!(out.contains("  remote address: LID 0x0000, QPN 0x"), "{out}");
    assert!(out.contains(" Mbit/sec"), "{out}");
    assert!(out.contains(&format!("{iters} iters in ")), "{out}");
    assert!(out.contains(" usec/iter"), "{out}");
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

/// Two network namespaces and a veth pair between them, hosts `.1` (in
/// `a`) and `.2` (in `b`) of 10.`net`.`subnet`.0/24, and with `v6` of
/// fd00:5376:`subnet`::/64; removed on drop.
pub struct Netns {
    pub a: String,
    pub b: String,
    net: u8,
    subnet: u8,
}

impl Netns {
    /// Names made of `tag` and the process id; `subnet` is
    /// `base + pid % span` (tests that may run at once use ranges apart).
    /// `Err(why)` without root or when `ip` fails.
    pub fn new(tag: &str, net: u8, base: u8, span: u32, v6: bool) -> Result<Netns, String> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string));
        if euid.as_deref() != Some("0") {
            return Err("not root (creating network namespaces needs CAP_SYS_ADMIN)".into());
        }
        let id = std::process::id();
        let subnet = (id % span) as u8 + base;
        // Made before the first `ip` call so that Drop removes whatever
        // part of the setup succeeded.
        let n = Netns {
            a: format!("sv{tag}{id}a"),
            b: format!("sv{tag}{id}b"),
            net,
            subnet,
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (format!("sv{tag}v{id}a"), format!("sv{tag}v{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        for (ns, dev, host) in [(&n.a, &va, 1), (&n.b, &vb, 2)] {
            ip(&["-n", ns, "addr", "add", &format!("{}/24", n.v4(host)), "dev", dev])?;
            if v6 {
                ip(&[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/64", n.v6(host)),
                    "dev",
                    dev,
                    "nodad",
                ])?;
            }
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    pub fn v4(&self, host: u8) -> String {
        format!("10.{}.{}.{host}", self.net, self.subnet)
    }

    pub fn v6(&self, host: u8) -> String {
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
