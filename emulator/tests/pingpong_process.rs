//! `softverbs pingpong` between two processes on one host (loopback),
//! IPv4 and IPv6, both engine modes, send/receive and RDMA WRITE.

mod pingpong_common;

use pingpong_common::*;

#[test]
fn send_recv_between_two_processes_ipv4() {
    let port = free_tcp_port().to_string();
    let (s, c) = run_pair(
        None,
        &[
            "-p",
            &port,
            "--bind",
            "127.0.0.1",
            "-s",
            "100",
            "-n",
            "200",
            "--warmup",
            "10",
        ],
        None,
        &[
            "127.0.0.1",
            "-p",
            &port,
            "-s",
            "100",
            "-n",
            "200",
            "--warmup",
            "10",
            "--stats",
        ],
    );
    check_send_report(&s, 200);
    check_send_report(&c, 200);
    assert!(c.contains("latency (half round trip, usec): min "), "{c}");
    // The client got a private port (the server may hold 4791): its GID
    // is either standard or the documented private form.
    let gid_line = c.lines().find(|l| l.starts_with("  local address:")).unwrap();
    assert!(
        gid_line.contains("GID fd73:7665:7262:4:0:") || gid_line.ends_with("GID ::ffff:127.0.0.1"),
        "{gid_line}"
    );
    assert!(c.contains("udp_tx_datagrams:"), "--stats prints counters: {c}");
}

#[test]
fn send_recv_ipv6_progress_threads_and_events() {
    let port = free_tcp_port().to_string();
    let common = ["-s", "5000", "-n", "100", "--warmup", "5", "--engine", "thread", "-e"];
    let mut server = vec!["-p", port.as_str(), "--bind", "::1"];
    server.extend_from_slice(&common);
    let mut client = vec!["::1", "-p", port.as_str()];
    client.extend_from_slice(&common);
    let (s, c) = run_pair(None, &server, None, &client);
    check_send_report(&s, 100);
    check_send_report(&c, 100);
}

#[test]
fn rdma_write_stream_to_a_passive_server() {
    for engine in ["inline", "thread"] {
        let port = free_tcp_port().to_string();
        let args = [
            "--op", "write", "-s", "200000", "-n", "30", "-m", "4096", "--engine", engine,
        ];
        let mut server = vec!["-p", port.as_str(), "--bind", "127.0.0.1"];
        server.extend_from_slice(&args);
        let mut client = vec!["127.0.0.1", "-p", port.as_str()];
        client.extend_from_slice(&args);
        let (s, c) = run_pair(None, &server, None, &client);
        assert!(c.contains("write: 30 x 200000 bytes in "), "{c}");
        assert!(s.contains("data verified"), "{engine}: {s}");
    }
}

#[test]
fn a_missing_server_is_a_clean_failure() {
    let port = free_tcp_port().to_string();
    let (ok, _out, err) = finish(spawn(None, &["127.0.0.1", "-p", &port, "--connect-timeout", "0"]));
    assert!(!ok);
    assert!(err.contains("softverbs: pingpong: connecting to 127.0.0.1:"), "{err}");
}
