//! Unmodified Debian rdma_cm programs (rdmacm-utils, perftest with `-R`)
//! on softverbs' `libibverbs.so.1` and `librdmacm.so.1`: each test makes
//! a directory where the two names are the libraries cargo built for this
//! run, starts a server and a client process with `LD_LIBRARY_PATH`
//! pointing there, and requires the programs' own success and their
//! output of the data they moved.
//!
//! The two processes talk over the UDP link: each has its own soft device
//! on its own loopback address (127.a.b.1 for the server, .2 for the
//! client) on the standard RoCEv2 port 4791, so each has the standard GID
//! (`::ffff:127.a.b.h`) that rdma_cm's addresses resolve to, and the
//! connection manager's MADs travel on QP1 between them. A last test runs
//! them between two network namespaces (root only).
//!
//! A test whose program is missing prints a SKIP line and passes
//! (`apt-get install rdmacm-utils perftest`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one program may run before the test fails.
const TIMEOUT: Duration = Duration::from_secs(180);

/// The newest of `name` in the target directory and its `deps/`.
fn built(profile_dir: &Path, name: &str) -> PathBuf {
    [profile_dir.join(name), profile_dir.join("deps").join(name)]
        .into_iter()
        .filter(|p| p.exists())
        // `cargo test` refreshes deps/ only; `cargo build` also the copy
        // above it: the newer one is this build's.
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("cargo built {name} next to the test"))
}

/// The directory holding `libibverbs.so.1` and `librdmacm.so.1` → the
/// built cdylibs.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/e2e-<hash> → target/<profile>
        let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
        let verbs = built(profile_dir, "libsoftverbs_ibverbs.so");
        let cm = built(profile_dir, "libsoftverbs_rdmacm.so");
        let dir = std::env::temp_dir().join(format!("softverbs-rdmacm-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the library dir");
        for (name, lib) in [
            ("libibverbs.so.1", &verbs),
            ("libibverbs.so", &verbs),
            ("librdmacm.so.1", &cm),
            ("librdmacm.so", &cm),
        ] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(lib, &link).expect("symlink the library");
        }
        dir
    })
}

/// Whether `/usr/bin/<tool>` exists; prints a SKIP line if not.
fn have(tool: &str) -> bool {
    let ok = Path::new("/usr/bin").join(tool).exists();
    if !ok {
        println!("SKIP: /usr/bin/{tool} is absent (apt-get install rdmacm-utils perftest)");
    }
    ok
}

/// A pair of loopback addresses of this test (server, client), unique in
/// this run and unlikely to meet another run's.
fn pair_addrs() -> (String, String) {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let a = (std::process::id() % 200) as u8 + 20;
    let b = NEXT.fetch_add(1, Ordering::Relaxed);
    (format!("127.{a}.{b}.1"), format!("127.{a}.{b}.2"))
}

/// A port for the rdma_cm listener of one test.
fn cm_port() -> String {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    (21000 + (std::process::id() % 2000) as u16 * 10 + NEXT.fetch_add(1, Ordering::Relaxed)).to_string()
}

/// `tool args` in namespace `ns` (if any) with the device on `addr`.
fn command(ns: Option<&str>, tool: &str, args: &[String], addr: &str) -> Command {
    let path = Path::new("/usr/bin").join(tool);
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&path);
            c
        }
        None => Command::new(&path),
    };
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTVERBS_ADDR", addr)
        .env("SOFTVERBS_PORT", "4791")
        .env("SOFTVERBS_LINK", "udp")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A process that is killed if the test fails before it was waited for
/// (so a failed run leaves no process behind).
struct Proc(Option<Child>);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for `child` up to [`TIMEOUT`]; kills it and fails past that.
fn finish(mut child: Child, what: &str) -> Output {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if start.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "{what}: no exit after {TIMEOUT:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn check(out: &Output, what: &str) -> String {
    let t = text(out);
    assert!(out.status.success(), "{what} failed ({})\n{t}", out.status);
    t
}

/// Whether a process in namespace `ns` has UDP port 4791 bound on `addr`
/// (its soft device exists).
fn device_up(ns: Option<&str>, addr: &str) -> bool {
    let ip: std::net::Ipv4Addr = addr.parse().expect("IPv4");
    // /proc/net/udp: local address as little-endian hex, then the port.
    let want = format!("{:08X}:12B7", u32::from(ip).swap_bytes());
    let table = match ns {
        Some(ns) => Command::new("ip")
            .args(["netns", "exec", ns, "cat", "/proc/net/udp"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default(),
        None => std::fs::read_to_string("/proc/net/udp").unwrap_or_default(),
    };
    table
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
}

/// Where the two processes of [`pair`] run.
struct Topo<'a> {
    /// Network namespace of the server and of the client.
    ns: [Option<&'a str>; 2],
    /// The device address of the server and of the client.
    addr: [String; 2],
}

impl Topo<'static> {
    fn loopback() -> Topo<'static> {
        let (s, c) = pair_addrs();
        Topo {
            ns: [None, None],
            addr: [s, c],
        }
    }
}

/// What a client prints when the server is not listening yet (its CM
/// answered with a REJ or SIDR_REP, or its device is not up yet).
fn not_listening(t: &str) -> bool {
    // perftest failing after its out-of-band connection is not this (see
    // perftest_rdma_cm): its server has moved on.
    if t.contains("Failed to handle RDMA CM event") {
        return false;
    }
    [
        "REJECTED",
        "UNREACHABLE",
        "Connection refused",
        "error 8",
        // perftest: "Unexpected CM event bl blka 8" (REJECTED).
        "Unable to init the socket connection",
    ]
    .iter()
    .any(|s| t.contains(s))
}

/// Runs `tool` as a server and as a client of it (`{S}` in the arguments
/// is the server's address); while the client fails because the server
/// is not listening yet, both are started again. `server_exits`: whether
/// the server ends by itself (else it is killed after the client).
/// Returns both outputs.
fn pair(
    tool: &str,
    server_args: &[&str],
    client_args: &[&str],
    topo: &Topo<'_>,
    server_exits: bool,
) -> (String, String) {
    try_pair(tool, server_args, client_args, topo, server_exits).unwrap_or_else(|e| panic!("{e}"))
}

/// [`pair`], with a failure returned instead of raised.
///
/// A client that lost the race to the server's `rdma_listen` is rejected
/// (as by a kernel CM). The server is started again with it, not only
/// the client: a client of several connections may have had some of them
/// accepted before one was rejected, and those would take the places of
/// the next client's connections in the server (cmatose then refuses the
/// extra ones with ENOMEM and exits, and the next client waits for a
/// server that is gone).
fn try_pair(
    tool: &str,
    server_args: &[&str],
    client_args: &[&str],
    topo: &Topo<'_>,
    server_exits: bool,
) -> Result<(String, String), String> {
    let subst = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.replace("{S}", &topo.addr[0])).collect() };
    let cargs = subst(client_args);
    let start = Instant::now();
    let (mut server, client_out) = loop {
        let mut server = Proc(Some(
            command(topo.ns[0], tool, &subst(server_args), &topo.addr[0])
                .spawn()
                .expect("spawn server"),
        ));
        while !device_up(topo.ns[0], &topo.addr[0]) {
            if start.elapsed() > Duration::from_secs(60) {
                return Err(format!("{tool} server: no device came up"));
            }
            if let Some(st) = server.0.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let out = server.0.take().expect("server").wait_with_output().expect("output");
                return Err(format!("{tool} server exited early ({st})\n{}", text(&out)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = finish(
            command(topo.ns[1], tool, &cargs, &topo.addr[1])
                .spawn()
                .expect("spawn client"),
            tool,
        );
        if !out.status.success() && not_listening(&text(&out)) && start.elapsed() < Duration::from_secs(60) {
            // The server is killed and waited for (its device's port is
            // free again) before the next round.
            drop(server);
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break (server, out);
    };
    let c = text(&client_out);
    if !client_out.status.success() {
        return Err(format!(
            "{tool} client {client_args:?} failed ({})\n{c}",
            client_out.status
        ));
    }
    let mut child = server.0.take().expect("server");
    let s = if server_exits {
        let out = finish(child, tool);
        let s = text(&out);
        if !out.status.success() {
            return Err(format!("{tool} server {server_args:?} failed ({})\n{s}", out.status));
        }
        s
    } else {
        let _ = child.kill();
        text(&child.wait_with_output().expect("output"))
    };
    Ok((s, c))
}

/// rping: RC connect/accept, SEND of the buffer advertisements, RDMA
/// READ of the client's data by the server and RDMA WRITE back, then
/// disconnect; `-v` prints each ping as it arrived.
fn rping(topo: &Topo<'_>) {
    let port = cm_port();
    let (s, c) = pair(
        "rping",
        &["-s", "-a", "{S}", "-p", &port, "-C", "5", "-v", "-S", "100"],
        &["-c", "-a", "{S}", "-p", &port, "-C", "5", "-v", "-S", "100"],
        topo,
        true,
    );
    for i in 0..5 {
        assert!(c.contains(&format!("ping data: rdma-ping-{i}: ")), "client:\n{c}");
        assert!(
            s.contains(&format!("server ping data: rdma-ping-{i}: ")),
            "server:\n{s}"
        );
    }
}

#[test]
fn rping_rc_read_write_send() {
    if have("rping") {
        rping(&Topo::loopback());
    }
}

#[test]
fn ucmatose_connections_and_data() {
    if !have("ucmatose") {
        return;
    }
    let port = cm_port();
    let (s, c) = pair(
        "ucmatose",
        &["-b", "{S}", "-p", &port, "-c", "3", "-C", "10", "-S", "256"],
        &["-s", "{S}", "-p", &port, "-c", "3", "-C", "10", "-S", "256"],
        &Topo::loopback(),
        true,
    );
    for t in [&s, &c] {
        assert!(
            t.contains("data transfers complete") && t.contains("return status 0"),
            "{t}"
        );
    }
}

#[test]
fn rdma_server_and_client_synchronous_ids() {
    if !have("rdma_server") || !have("rdma_client") {
        return;
    }
    let topo = Topo::loopback();
    let port = cm_port();
    let mut server = Proc(Some(
        command(None, "rdma_server", &["-p".into(), port.clone()], &topo.addr[0])
            .spawn()
            .expect("spawn rdma_server"),
    ));
    let start = Instant::now();
    while !device_up(None, &topo.addr[0]) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rdma_server: no device came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = loop {
        let out = finish(
            command(
                None,
                "rdma_client",
                &["-s".into(), topo.addr[0].clone(), "-p".into(), port.clone()],
                &topo.addr[1],
            )
            .spawn()
            .expect("spawn rdma_client"),
            "rdma_client",
        );
        if !out.status.success() && not_listening(&text(&out)) && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break out;
    };
    let c = check(&client, "rdma_client");
    let s = check(&finish(server.0.take().expect("server"), "rdma_server"), "rdma_server");
    assert!(c.contains("rdma_client: end 0"), "{c}");
    assert!(s.contains("rdma_server: end 0"), "{s}");
}

#[test]
fn udaddy_ud_sidr() {
    if !have("udaddy") {
        return;
    }
    // udaddy listens on its fixed port (7174; its -p is the port space).
    let (s, c) = pair(
        "udaddy",
        &["-b", "{S}", "-c", "2", "-C", "10", "-S", "256"],
        &["-s", "{S}", "-c", "2", "-C", "10", "-S", "256"],
        &Topo::loopback(),
        true,
    );
    for t in [&s, &c] {
        assert!(
            t.contains("data transfers complete") && t.contains("return status 0"),
            "{t}"
        );
    }
}

#[test]
fn cmtime_connects_and_disconnects() {
    if !have("cmtime") {
        return;
    }
    let port = cm_port();
    // The cmtime server runs until it is stopped: the client's own
    // success (every step for each connection) is the check.
    let (_, c) = pair(
        "cmtime",
        &["-b", "{S}", "-p", &port],
        &["-s", "{S}", "-p", &port, "-c", "20"],
        &Topo::loopback(),
        false,
    );
    assert!(c.contains("connect") && c.contains("disconnect"), "{c}");
}

/// perftest with `-R`: its out-of-band exchange and its test QPs both
/// connect through rdma_cm. Its client connects the test QPs right after
/// the exchange, racing the server's `rdma_listen` of them; losing that
/// race gets a REJ (nobody listens yet), as it would from the kernel's
/// rdma_cm, and perftest's own retry then reuses the ids it has just
/// destroyed (and fails or crashes). So a run whose client lost that race
/// is started again, server and client, a bounded number of times.
fn perftest_rdma_cm(tool: &str, topo: &Topo<'_>) {
    let mut last = String::new();
    for _ in 0..20 {
        let port = cm_port();
        match try_pair(
            tool,
            &["-R", "-p", &port, "-n", "200"],
            &["-R", "-p", &port, "-n", "200", "{S}"],
            topo,
            true,
        ) {
            Ok((s, c)) => {
                for t in [&s, &c] {
                    assert!(
                        t.contains("Data ex. method : rdma_cm") && t.contains("#bytes"),
                        "{tool}:\n{t}"
                    );
                }
                return;
            }
            Err(e) if lost_listen_race(&e) => {
                println!("{tool}: the client lost the race to rdma_listen; again");
                last = e;
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("{tool}: the client lost the race to the server's rdma_listen 20 times\n{last}");
}

/// Whether a failed perftest run is one whose client connected its test
/// QPs before the server listened (see [`perftest_rdma_cm`]).
fn lost_listen_race(e: &str) -> bool {
    e.contains("client") && e.contains("Failed to handle RDMA CM event")
}

#[test]
fn perftest_send_bw_over_rdma_cm() {
    if have("ib_send_bw") {
        perftest_rdma_cm("ib_send_bw", &Topo::loopback());
    }
}

#[test]
fn perftest_write_lat_over_rdma_cm() {
    if have("ib_write_lat") {
        perftest_rdma_cm("ib_write_lat", &Topo::loopback());
    }
}

/// Two network namespaces joined by a veth pair, deleted on drop.
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
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (creating network namespaces needs CAP_SYS_ADMIN)".into());
        }
        let id = std::process::id();
        let n = Netns {
            a: format!("svcm{id}a"),
            b: format!("svcm{id}b"),
            subnet: (id % 200) as u8 + 20,
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (format!("svcm{id}a"), format!("svcm{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        for (ns, dev, host) in [(&n.a, &va, 1), (&n.b, &vb, 2)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.202.{}.{host}/24", n.subnet),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    fn addr(&self, host: u8) -> String {
        format!("10.202.{}.{host}", self.subnet)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it (and its peer).
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

#[test]
fn between_two_network_namespaces() {
    if !have("rping") || !have("ucmatose") || !have("udaddy") {
        return;
    }
    let n = match Netns::new() {
        Ok(n) => n,
        Err(why) => {
            println!("SKIP: rdma_cm programs between network namespaces: {why}");
            return;
        }
    };
    let topo = Topo {
        ns: [Some(&n.a), Some(&n.b)],
        addr: [n.addr(1), n.addr(2)],
    };
    rping(&topo);
    for tool in ["ucmatose", "udaddy"] {
        let (s, c) = pair(
            tool,
            &["-b", "{S}", "-c", "2", "-C", "10"],
            &["-s", "{S}", "-c", "2", "-C", "10"],
            &topo,
            true,
        );
        for t in [&s, &c] {
            assert!(
                t.contains("data transfers complete") && t.contains("return status 0"),
                "{tool}: {t}"
            );
        }
    }
    if have("ib_send_bw") {
        perftest_rdma_cm("ib_send_bw", &topo);
    }
}
