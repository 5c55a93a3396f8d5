//! Unmodified Debian binaries (ibverbs-utils, perftest) on this library:
//! each test makes a directory where `libibverbs.so.1` is the library
//! cargo built for this test run, runs the tools with `LD_LIBRARY_PATH`
//! pointing there, and requires the tool's own success. Two-process tests
//! run a server and a client over the UDP link on 127.0.0.1 (each process
//! has its own soft device; the second gets a private-port GID).
//!
//! A test whose binary is missing prints a SKIP line and passes
//! (`apt-get install ibverbs-utils perftest`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one tool may run before the test fails.
const TIMEOUT: Duration = Duration::from_secs(180);

/// The directory holding `libibverbs.so.1` → the built cdylib.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/e2e-<hash> → target/<profile>
        let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
        let lib = [
            profile_dir.join("libsoftverbs_ibverbs.so"),
            profile_dir.join("deps/libsoftverbs_ibverbs.so"),
        ]
        .into_iter()
        .filter(|p| p.exists())
        // `cargo test` refreshes deps/ only; `cargo build` also the copy
        // above it: the newer one is this build's.
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("cargo built libsoftverbs_ibverbs.so next to the test");
        let dir = std::env::temp_dir().join(format!("softverbs-ibverbs-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the library dir");
        for name in ["libibverbs.so.1", "libibverbs.so"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).expect("symlink the library");
        }
        dir
    })
}

/// Whether `/usr/bin/<tool>` exists; prints a SKIP line if not.
fn have(tool: &str) -> bool {
    let ok = Path::new("/usr/bin").join(tool).exists();
    if !ok {
        println!("SKIP: /usr/bin/{tool} is absent (apt-get install ibverbs-utils perftest)");
    }
    ok
}

fn command(tool: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    command_in(None, tool, args, env)
}

/// [`command`] inside network namespace `ns` (`ip netns exec`).
fn command_in(ns: Option<&str>, tool: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
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
        .env("SOFTVERBS_ADDR", "127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A server process that is killed if the test fails before it was
/// waited for (so a failed run leaves no process behind).
struct Server(Option<Child>);

impl Drop for Server {
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

fn check(out: &Output, what: &str) -> String {
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{so}\nstderr:\n{se}",
        out.status
    );
    so + &se
}

/// Runs a one-process tool.
fn run(tool: &str, args: &[&str]) -> String {
    let child = command(tool, args, &[]).spawn().expect("spawn");
    check(&finish(child, tool), tool)
}

/// A TCP port for the out-of-band exchange of one test: below Linux's
/// ephemeral range (32768 up), where another connection's local port
/// could take it first.
fn tcp_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let offset = (std::process::id() % 500) as u16 * 20 + NEXT.fetch_add(1, Ordering::Relaxed);
    20000 + offset % 12000
}

/// Runs `tool` as a server and as a client of it, with extra environment
/// for both; the client is retried while the server is not listening yet.
/// Returns both outputs.
fn pair_env(
    tool: &str,
    port_flag: &str,
    server_args: &[&str],
    client_args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    let topo = Topo {
        ns: [None, None],
        env: [env, env],
        server_addr: "127.0.0.1",
    };
    pair_topo(tool, port_flag, server_args, client_args, &topo)
}

/// Where the two processes of [`pair_topo`] run.
struct Topo<'a> {
    /// Network namespace of the server and of the client.
    ns: [Option<&'a str>; 2],
    /// Extra environment of the server and of the client.
    env: [&'a [(&'a str, &'a str)]; 2],
    /// The address the client connects to.
    server_addr: &'a str,
}

fn pair_topo(
    tool: &str,
    port_flag: &str,
    server_args: &[&str],
    client_args: &[&str],
    topo: &Topo<'_>,
) -> (String, String) {
    let start_server = |port: &str| {
        let mut sargs: Vec<&str> = server_args.to_vec();
        sargs.extend([port_flag, port]);
        Server(Some(
            command_in(topo.ns[0], tool, &sargs, topo.env[0])
                .spawn()
                .expect("spawn server"),
        ))
    };
    let mut port = tcp_port().to_string();
    let mut server = start_server(&port);
    let start = Instant::now();
    let client_out = loop {
        let mut cargs: Vec<&str> = client_args.to_vec();
        cargs.extend([port_flag, port.as_str(), topo.server_addr]);
        let out = finish(
            command_in(topo.ns[1], tool, &cargs, topo.env[1])
                .spawn()
                .expect("spawn client"),
            tool,
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let not_listening = !out.status.success()
            && (text.contains("Couldn't connect")
                || text.contains("Unable to open file descriptor for socket connection"));
        if not_listening && start.elapsed() < Duration::from_secs(30) {
            // A server that could not listen (its port taken meanwhile)
            // is started again on another; one that failed otherwise is
            // the failure to report.
            let exited = server.0.as_mut().expect("server").try_wait().expect("wait").is_some();
            if exited {
                let out = finish(server.0.take().expect("server"), tool);
                let stext = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
                if !stext.contains("Couldn't listen") && !stext.contains("Failed to bind") {
                    check(&out, &format!("{tool} server {server_args:?}"));
                    panic!("{tool} server {server_args:?} exited before its client connected:\n{stext}");
                }
                port = tcp_port().to_string();
                server = start_server(&port);
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break out;
    };
    let server_out = finish(server.0.take().expect("server"), tool);
    let c = check(&client_out, &format!("{tool} client {client_args:?}"));
    let s = check(&server_out, &format!("{tool} server {server_args:?}"));
    (s, c)
}

#[test]
fn ibv_devices_lists_the_soft_device() {
    if !have("ibv_devices") {
        return;
    }
    let out = run("ibv_devices", &[]);
    assert!(out.contains("softverbs_0"), "{out}");
}

#[test]
fn ibv_asyncwatch_sees_hot_unplug() {
    if !have("ibv_asyncwatch") {
        return;
    }
    let child = command("ibv_asyncwatch", &[], &[("SOFTVERBS_UNPLUG_AFTER_MS", "200")])
        .spawn()
        .expect("spawn");
    let out = finish(child, "ibv_asyncwatch");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // It prints every event and exits 1 when the event file reports an
    // error, as it does on a removed kernel device.
    assert!(text.contains("IBV_EVENT_DEVICE_FATAL"), "{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
}

#[test]
fn ibv_devinfo_verbose() {
    if !have("ibv_devinfo") {
        return;
    }
    let out = run("ibv_devinfo", &["-v"]);
    // GID 0 is ::ffff:127.0.0.1 if this process got UDP port 4791, else
    // the private form that encodes the port (fd73:7665:7262:4:…:7f00:1).
    for want in [
        "hca_id:\tsoftverbs_0",
        "PORT_ACTIVE",
        "link_layer:\t\tEthernet",
        "GID[  0]:",
        "RoCE v2",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(out.contains("::ffff:127.0.0.1") || out.contains(":7f00:1,"), "{out}");
}

fn pingpong(tool: &str, extra: &[&str]) {
    pingpong_env(tool, extra, &[]);
}

fn pingpong_env(tool: &str, extra: &[&str], env: &[(&str, &str)]) {
    if !have(tool) {
        return;
    }
    // -c: each side checks the bytes it received.
    let mut args = vec!["-g", "0", "-n", "50", "-c"];
    args.extend_from_slice(extra);
    let (s, c) = pair_env(tool, "-p", &args, &args, env);
    for out in [&s, &c] {
        assert!(out.contains("50 iters in"), "{tool} {extra:?}: {out}");
    }
}

#[test]
fn rc_pingpong_sizes() {
    pingpong("ibv_rc_pingpong", &[]);
    pingpong("ibv_rc_pingpong", &["-s", "1"]);
    pingpong("ibv_rc_pingpong", &["-s", "65536", "-m", "4096"]);
}

#[test]
fn rc_pingpong_events() {
    pingpong("ibv_rc_pingpong", &["-e"]);
    pingpong("ibv_rc_pingpong", &["-e", "-s", "10000"]);
}

#[test]
fn uc_pingpong() {
    pingpong("ibv_uc_pingpong", &[]);
    pingpong("ibv_uc_pingpong", &["-e", "-s", "1024"]);
}

#[test]
fn ud_pingpong() {
    pingpong("ibv_ud_pingpong", &["-s", "1024"]);
    pingpong("ibv_ud_pingpong", &["-e", "-s", "64"]);
    pingpong_env(
        "ibv_ud_pingpong",
        &["-e", "-s", "64"],
        &[("SOFTVERBS_ENGINE", "inline")],
    );
    // The provider's progress thread sleeps on the link's descriptors: a
    // shared-memory answer that rang while the connect was being made
    // once left it asleep for good (a third of the runs hung).
    for _ in 0..3 {
        pingpong_env(
            "ibv_ud_pingpong",
            &["-e", "-s", "64"],
            &[("SOFTVERBS_ENGINE", "provider-thread")],
        );
    }
}

#[test]
fn srq_pingpong() {
    pingpong("ibv_srq_pingpong", &[]);
    pingpong("ibv_srq_pingpong", &["-e", "-s", "1024"]);
}

#[test]
fn rc_pingpong_over_shared_memory() {
    if !have("ibv_rc_pingpong") {
        return;
    }
    for extra in [&[][..], &["-e", "-s", "65536"][..]] {
        let mut args = vec!["-g", "0", "-n", "50"];
        args.extend_from_slice(extra);
        let (s, c) = pair_env("ibv_rc_pingpong", "-p", &args, &args, &[("SOFTVERBS_LINK", "shm")]);
        assert!(s.contains("50 iters in") && c.contains("50 iters in"), "{s}\n{c}");
    }
}

/// Runs a perftest tool as server and client on the soft device (GID
/// index 0) and checks that the client printed its result table.
fn perftest(tool: &str, extra: &[&str], env: &[(&str, &str)]) {
    if !have(tool) {
        return;
    }
    let mut args = vec!["-d", "softverbs_0", "-x", "0"];
    args.extend_from_slice(extra);
    let (s, c) = pair_env(tool, "-p", &args, &args, env);
    // The client prints the result table (the server of a latency test
    // prints none); both exited 0.
    assert!(c.contains("#bytes"), "{tool} {extra:?}: no result table in\n{c}");
    for out in [&s, &c] {
        assert!(
            !out.contains("Couldn't") && !out.contains("Failed"),
            "{tool} {extra:?}:\n{out}"
        );
    }
}

#[test]
fn perftest_bandwidth() {
    perftest("ib_write_bw", &["-n", "200"], &[]);
    perftest("ib_write_bw", &["-n", "200", "-s", "1048576"], &[]);
    perftest("ib_read_bw", &["-n", "200"], &[]);
    perftest("ib_send_bw", &["-n", "200"], &[]);
    perftest("ib_send_bw", &["-n", "200", "-s", "8"], &[]);
    perftest("ib_atomic_bw", &["-n", "200"], &[]);
}

#[test]
fn perftest_latency() {
    perftest("ib_write_lat", &["-n", "200", "-s", "8"], &[]);
    perftest("ib_read_lat", &["-n", "200", "-s", "8"], &[]);
    perftest("ib_send_lat", &["-n", "200", "-s", "8"], &[]);
    perftest("ib_atomic_lat", &["-n", "200"], &[]);
}

#[test]
fn perftest_all_sizes() {
    // -a: every size from 2 bytes to 8 MiB.
    perftest("ib_write_bw", &["-a", "-n", "20"], &[]);
    perftest("ib_send_lat", &["-a", "-n", "20"], &[]);
}

#[test]
fn perftest_over_shared_memory() {
    let shm = [("SOFTVERBS_LINK", "shm")];
    perftest("ib_write_bw", &["-n", "200"], &shm);
    perftest("ib_read_lat", &["-n", "200", "-s", "8"], &shm);
    perftest("ib_send_bw", &["-n", "200"], &shm);
}

/// Two network namespaces joined by a veth pair, with addresses that
/// exist only inside them (10.201.x.0/24), removed on drop.
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
            a: format!("svib{id}a"),
            b: format!("svib{id}b"),
            subnet: (id % 200) as u8 + 20,
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        let (va, vb) = (format!("svib{id}a"), format!("svib{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        for (ns, dev, host) in [(&n.a, &va, 1), (&n.b, &vb, 2)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.201.{}.{host}/24", n.subnet),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    fn addr(&self, host: u8) -> String {
        format!("10.201.{}.{host}", self.subnet)
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
    if !have("ibv_rc_pingpong") || !have("ib_write_bw") {
        return;
    }
    let n = match Netns::new() {
        Ok(n) => n,
        Err(why) => {
            println!("SKIP: tools between network namespaces: {why}");
            return;
        }
    };
    let (a, b) = (n.addr(1), n.addr(2));
    let (ea, eb) = ([("SOFTVERBS_ADDR", a.as_str())], [("SOFTVERBS_ADDR", b.as_str())]);
    let topo = Topo {
        ns: [Some(&n.a), Some(&n.b)],
        env: [&ea, &eb],
        server_addr: &a,
    };
    // Each namespace is its own host: both devices own UDP port 4791 and
    // have the standard GID ::ffff:10.201.x.h.
    let args = ["-g", "0", "-n", "100", "-s", "4096"];
    let (s, c) = pair_topo("ibv_rc_pingpong", "-p", &args, &args, &topo);
    assert!(s.contains("100 iters in") && c.contains("100 iters in"), "{s}\n{c}");
    assert!(c.contains(&format!("GID ::ffff:{a}")), "{c}");
    let args = ["-g", "0", "-n", "50", "-e", "-s", "64"];
    let (s, c) = pair_topo("ibv_ud_pingpong", "-p", &args, &args, &topo);
    assert!(s.contains("50 iters in") && c.contains("50 iters in"), "{s}\n{c}");
    for (tool, extra) in [
        ("ib_write_bw", &["-n", "200"][..]),
        ("ib_read_lat", &["-n", "200", "-s", "8"][..]),
    ] {
        let mut args = vec!["-d", "softverbs_0", "-x", "0"];
        args.extend_from_slice(extra);
        let (_, c) = pair_topo(tool, "-p", &args, &args, &topo);
        assert!(c.contains("#bytes"), "{tool}: {c}");
    }
}
