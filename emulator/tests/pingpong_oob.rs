//! The out-of-band TCP exchange of `softverbs pingpong` among strangers:
//! a connection that streams garbage without a newline, or says nothing,
//! reaches the server before the real client; the server drops it with a
//! line on standard error and serves the client (before: it read the
//! first connection's line without bound and for ever).

mod pingpong_common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use pingpong_common::*;

/// Connects to the server on `port` once it listens (bounded).
fn connect_when_listening(port: u16) -> TcpStream {
    let start = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if start.elapsed() > Duration::from_secs(30) => panic!("the server never listened: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The port of an address column of `/proc/net/tcp` (`0100007F:1F90`).
fn port_of(a: &str) -> Option<u16> {
    a.split(':').nth(1).and_then(|p| u16::from_str_radix(p, 16).ok())
}

/// Waits (bounded) until process `pid` listens on TCP `port`: one of its
/// own sockets is in LISTEN on it. Connecting merely until a connection
/// succeeds is not enough: another test's server, run beside this one,
/// may hold the same port for a moment (the port was free when picked),
/// take the stranger's connection and exit with it still queued (reset,
/// and never seen by this test's server).
fn wait_listening(pid: u32, port: u16) {
    let start = Instant::now();
    loop {
        let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter_map(|l| {
                        let l = l.to_string_lossy().into_owned();
                        Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let listening = table.lines().skip(1).any(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            port_of(f[1]) == Some(port) && f[3] == "0A" && inodes.iter().any(|i| i == f[9])
        });
        if listening {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the server never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (bounded) until the server listening on 127.0.0.1:`port` has
/// taken the stranger's connection `held` off its accept queue, so that
/// the stranger is surely among the connections the server holds before
/// the client starts. On a loaded machine the last ACK of a handshake can
/// reach the listener after a later connection's, and the server would
/// then serve the client without ever seeing the stranger.
///
/// Two observations in order. First, the server's end is past the
/// handshake: `/proc/net/tcp` shows it past `SYN_RECV` (the kernel queues
/// a connection for `accept` before it leaves that state), or the server
/// has already closed or reset it, which `held` sees. Then, in a later
/// pass, the listener's accept queue (its `rx_queue`) is empty. The file
/// is no snapshot (listeners come before connections, a bucket at a
/// time), so one pass cannot show both in the right order.
fn wait_until_accepted(port: u16, held: &TcpStream) {
    let from = held.local_addr().unwrap().port();
    let start = Instant::now();
    let mut past_handshake = false;
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        if !past_handshake {
            past_handshake = ended_by_the_server(held)
                || table.lines().skip(1).any(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    port_of(f[1]) == Some(port) && port_of(f[2]) == Some(from) && f[3] != "03"
                });
        } else {
            let drained = table.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                port_of(f[1]) == Some(port) && f[3] == "0A" && f[4].split(':').nth(1) == Some("00000000")
            });
            if drained {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the server never accepted the stranger's connection"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the server has closed or reset `s` (it must have accepted it
/// first: its listener still listens). Peeks with a short read timeout.
fn ended_by_the_server(s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let ended = match s.peek(&mut [0u8]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    };
    s.set_read_timeout(None).unwrap();
    ended
}

/// Runs a server, lets `stranger` connect first, then a client; returns
/// the server's standard error after checking that both runs succeeded.
fn serve_after(stranger: impl FnOnce(u16) -> TcpStream) -> String {
    let port = free_tcp_port();
    let p = port.to_string();
    let common = ["-p", p.as_str(), "-s", "64", "-n", "50", "--warmup", "5"];
    let mut server_args = vec!["--bind", "127.0.0.1"];
    server_args.extend_from_slice(&common);
    let server = spawn(None, &server_args);
    // Should the wait below fail, the server must not outlive the test.
    struct KillOnPanic(Option<std::process::Child>);
    impl Drop for KillOnPanic {
        fn drop(&mut self) {
            if let Some(c) = self.0.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let pid = server.id();
    let mut guard = KillOnPanic(Some(server));
    wait_listening(pid, port);
    let held = stranger(port);
    wait_until_accepted(port, &held);
    let server = guard.0.take().expect("the server");
    let mut client_args = vec!["127.0.0.1"];
    client_args.extend_from_slice(&common);
    let client = spawn(None, &client_args);
    let (c_ok, c_out, c_err) = finish(client);
    let (s_ok, s_out, s_err) = finish(server);
    drop(held);
    assert!(
        c_ok && s_ok,
        "server ok={s_ok}\n{s_out}\n{s_err}\nclient ok={c_ok}\n{c_out}\n{c_err}"
    );
    check_send_report(&s_out, 50);
    check_send_report(&c_out, 50);
    s_err
}

#[test]
fn a_garbage_connection_is_dropped_and_the_client_served() {
    let err = serve_after(|port| {
        let mut s = connect_when_listening(port);
        // More than a line's worth before the client starts (it fits the
        // socket buffers), so the server finds it over the limit whatever
        // the scheduling; then more, up to 64 KiB without a newline, the
        // connection held open; the writes stop when the server closes it.
        s.write_all(&[b'x'; 8192]).unwrap();
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..14 {
                if w.write_all(&[b'x'; 4096]).is_err() {
                    break;
                }
            }
        });
        s
    });
    assert!(
        err.contains("softverbs: pingpong: dropped connection from 127.0.0.1:")
            && err.contains("more than 4096 bytes without a newline"),
        "{err}"
    );
}

#[test]
fn a_silent_connection_does_not_keep_the_client_waiting() {
    let err = serve_after(connect_when_listening);
    assert!(
        err.contains("softverbs: pingpong: dropped connection from 127.0.0.1:"),
        "{err}"
    );
    // Dropped for its silence, or when the client came first.
    assert!(
        err.contains("another client came first") || err.contains("no line within"),
        "{err}"
    );
}

#[test]
fn a_stranger_line_is_dropped() {
    let err = serve_after(|port| {
        let mut s = connect_when_listening(port);
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        s
    });
    assert!(err.contains("not a pingpong address line: \"GET / HTTP/1.0\""), "{err}");
}
