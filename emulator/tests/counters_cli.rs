//! Counters a server's operator sees: `pingpong` and `perf` print every
//! soft device counter that moved with `--stats` at the end, print them to
//! standard error on SIGUSR1 while running (without dying of the signal),
//! and say what was dropped at the end of every run.

mod pingpong_common;

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use pingpong_common::*;

/// A UDP port free on the loopback now, below 49152 (pingpong refuses
/// RoCEv2's source-port range, into which the kernel's ephemeral ports
/// reach).
fn free_udp_port() -> u16 {
    let start = 20_000 + (std::process::id() % 20_000) as u16;
    (start..49_152)
        .chain(20_000..start)
        .find(|&p| UdpSocket::bind(("127.0.0.1", p)).is_ok())
        .expect("a free UDP port")
}

/// Sends SIGUSR1 to `child` (by its own pid).
fn usr1(child: &Child) {
    // SAFETY: kill with a valid signal number on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR1) }, 0);
}

/// The child's standard error, line by line, on a channel.
fn stderr_lines(child: &mut Child) -> Receiver<String> {
    let (tx, rx) = channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (bounded) for the server to listen on `port`. The probing
/// connection is one the server drops.
fn wait_listening(port: u16) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Signals `child` until a line of its standard error contains `want`
/// (bounded); returns the lines seen.
fn usr1_until(child: &Child, err: &Receiver<String>, want: &str) -> Vec<String> {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        usr1(child);
        let until = Instant::now() + Duration::from_secs(1);
        while let Ok(l) = err.recv_timeout(until.saturating_duration_since(Instant::now())) {
            let hit = l.contains(want);
            seen.push(l);
            if hit {
                return seen;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {want:?} on SIGUSR1: {seen:#?}"
        );
    }
}

fn wait_ok(mut child: Child, what: &str) -> String {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    let _ = child.stdout.take().unwrap().read_to_string(&mut out);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "{what} failed:\n{out}\n{err}");
    out
}

/// Garbage datagrams reach a pingpong server's UDP port while it waits
/// for its client: SIGUSR1 shows them counted as malformed, the run goes
/// on, and its end says what was dropped.
#[test]
fn pingpong_counts_drops_and_tells_on_usr1_and_at_the_end() {
    let (tcp, udp) = (free_tcp_port(), free_udp_port());
    let (tcp_s, udp_s) = (tcp.to_string(), udp.to_string());
    let common = ["-p", tcp_s.as_str(), "-s", "64", "-n", "50", "--warmup", "5"];
    let mut server_args = vec![
        "--bind",
        "127.0.0.1",
        "--udp-port",
        udp_s.as_str(),
        "--engine",
        "thread",
    ];
    server_args.extend_from_slice(&common);
    let mut server = spawn(None, &server_args);
    let err = stderr_lines(&mut server);
    wait_listening(tcp);
    let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..5 {
        junk.send_to(b"junk!", ("127.0.0.1", udp)).unwrap();
    }
    let seen = usr1_until(&server, &err, "rx_malformed: 5");
    assert!(
        seen.iter().any(|l| l.starts_with("softverbs: pingpong: counters of ")),
        "{seen:#?}"
    );
    let mut client_args = vec!["127.0.0.1", "--stats"];
    client_args.extend_from_slice(&common);
    let client = spawn(None, &client_args);
    let c_out = wait_ok(client, "client");
    let s_out = wait_ok(server, "server");
    // The server has exited: its standard error ends, and so does the channel.
    let rest: Vec<String> = err.iter().collect();
    check_send_report(&s_out, 50);
    assert!(
        c_out.contains("counters of ") && c_out.contains("udp_tx_datagrams: "),
        "{c_out}"
    );
    assert!(
        rest.iter()
            .any(|l| l.starts_with("softverbs: pingpong: ") && l.contains(" dropped: rx_malformed=5")),
        "{rest:#?}"
    );
}

fn perf(args: &[&str]) -> Child {
    Command::new(bin())
        .args(["--no-embedded", "perf"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softverbs perf")
}

/// `perf --server --stats` and its client print their devices' counters
/// at the end; SIGUSR1 to a waiting server prints (and does not kill it).
#[test]
fn perf_prints_counters_with_stats_and_on_usr1() {
    let port = free_tcp_port().to_string();
    let common = ["send_lat", "--link", "udp", "-n", "50", "-p", port.as_str(), "--stats"];
    let mut server_args = common.to_vec();
    server_args.push("--server");
    let mut server = perf(&server_args);
    let err = stderr_lines(&mut server);
    wait_listening(port.parse().unwrap());
    usr1_until(&server, &err, "softverbs: perf: ");
    let mut client_args = common.to_vec();
    client_args.extend_from_slice(&["--client", "127.0.0.1"]);
    let c_out = wait_ok(perf(&client_args), "client");
    let s_out = wait_ok(server, "server");
    assert!(
        s_out.contains("counters of perf_udp_server") && s_out.contains("udp_rx_datagrams: "),
        "{s_out}"
    );
    assert!(
        c_out.contains("counters of perf_udp_client") && c_out.contains("udp_tx_datagrams: "),
        "{c_out}"
    );
}
