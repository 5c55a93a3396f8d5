//! `softverbs pingpong --link shm` between two processes on one host:
//! send/receive and RDMA WRITE through shared memory, the automatic
//! choice, and a peer killed mid-transfer.

mod pingpong_common;

use std::time::{Duration, Instant};

use pingpong_common::*;

/// The QPs' local ACK timeout in these runs: 4.096 µs · 2^18 ≈ 1.07 s
/// per try, so the run fails only if a peer stays silent for about 8.6 s
/// (8 tries). With pingpong's default (14, 67 ms per try) a busy-polling
/// peer that waits half a second for a CPU on a loaded host exhausts the
/// retries of the other side, which then ends with `RETRY_EXC_ERR`: correct
/// RC behaviour, but not what these tests are about. The test of a peer
/// that really dies keeps the default.
const QP_TIMEOUT: &str = "18";

fn pair(link: &str, extra: &[&str]) -> (String, String) {
    let port = free_tcp_port().to_string();
    let mut server = vec![
        "-p",
        port.as_str(),
        "--bind",
        "127.0.0.1",
        "--link",
        link,
        "--stats",
        "--qp-timeout",
        QP_TIMEOUT,
    ];
    server.extend_from_slice(extra);
    let mut client = vec![
        "127.0.0.1",
        "-p",
        port.as_str(),
        "--link",
        link,
        "--stats",
        "--qp-timeout",
        QP_TIMEOUT,
    ];
    client.extend_from_slice(extra);
    run_pair(None, &server, None, &client)
}

/// The peer line shows a shared-memory channel that came up. The peer may
/// already have exited when the statistics are printed (each side prints
/// after the final exchange), so `dead` and `closing` count as well; only
/// a channel that never left `pending` fails.
fn assert_shm_peer(out: &str) {
    let up = out.lines().filter_map(|l| l.trim().strip_prefix("peer: ")).any(|p| {
        [" shm up pid ", " shm closing pid ", " shm dead pid "]
            .iter()
            .any(|s| p.contains(s))
    });
    assert!(up, "no shared-memory peer line: {out}");
}

#[test]
fn send_recv_over_shared_memory() {
    let (s, c) = pair("shm", &["-s", "8", "-n", "2000", "--warmup", "10"]);
    check_send_report(&s, 2000);
    check_send_report(&c, 2000);
    for out in [&s, &c] {
        assert!(out.contains("shm_tx_datagrams:"), "{out}");
        assert_shm_peer(out);
        assert!(
            !out.contains("udp_tx_datagrams:"),
            "--link shm sends nothing by UDP: {out}"
        );
    }
    assert!(c.contains("shm_channels_opened: 1"), "{c}");
    assert!(s.contains("shm_channels_accepted: 1"), "{s}");
}

/// With two sends in flight at most (`-t 2`), the server waits for send
/// completions after most of its replies (the client holds its ACKs back
/// to coalesce them), and the client's next message completes on the
/// server during that wait. The ping-pong used to reap and drop that
/// receive completion there, then wait for it again: both sides hung
/// (one run in five with the default depth of 32 on a fast host).
#[test]
fn a_receive_completing_during_a_send_queue_wait_is_counted() {
    let (s, c) = pair("shm", &["-s", "8", "-n", "300", "--warmup", "10", "--tx-depth", "2"]);
    check_send_report(&s, 300);
    check_send_report(&c, 300);
}

#[test]
fn multi_packet_sends_with_sleeping_progress_threads() {
    let (s, c) = pair(
        "shm",
        &[
            "-s",
            "9000",
            "-n",
            "200",
            "--warmup",
            "5",
            "--engine",
            "thread",
            "--spin-us",
            "0",
            "-e",
        ],
    );
    check_send_report(&s, 200);
    check_send_report(&c, 200);
    assert!(c.contains("shm_doorbells:") || s.contains("shm_doorbells:"), "{s}\n{c}");
}

#[test]
fn rdma_write_stream_over_shared_memory() {
    for engine in ["inline", "thread"] {
        let (s, c) = pair(
            "shm",
            &[
                "--op", "write", "-s", "200000", "-n", "30", "-m", "4096", "--engine", engine,
            ],
        );
        assert!(c.contains("write: 30 x 200000 bytes in "), "{c}");
        assert!(s.contains("data verified"), "{engine}: {s}");
        assert!(c.contains("shm_tx_datagrams:"), "{c}");
    }
}

#[test]
fn auto_uses_shared_memory_and_udp_does_not() {
    let (_, c) = pair("auto", &["-s", "64", "-n", "300", "--warmup", "10"]);
    assert_shm_peer(&c);
    assert!(c.contains("shm_tx_datagrams:"), "{c}");
    let (_, c) = pair("udp", &["-s", "64", "-n", "100", "--warmup", "10"]);
    assert!(!c.contains("shm_"), "{c}");
    assert!(c.contains("udp_tx_datagrams:"), "{c}");
}

/// A client stopped (SIGSTOP) for 1.5 s in the middle of the ping-pong,
/// as a loaded host can stall a process, is slow, not dead: with a local
/// ACK timeout long enough for the stall both sides finish. (With the
/// default timeout, 67 ms per try, the server exhausts its retries
/// during such a stall.)
#[test]
fn a_stalled_peer_is_not_a_lost_one() {
    let port = free_tcp_port().to_string();
    let args = [
        "-s",
        "8",
        "-n",
        "2000",
        "--warmup",
        "0",
        "--link",
        "shm",
        "--qp-timeout",
        QP_TIMEOUT,
    ];
    let mut sargs = vec!["-p", port.as_str(), "--bind", "127.0.0.1"];
    sargs.extend_from_slice(&args);
    let mut cargs = vec!["127.0.0.1", "-p", port.as_str()];
    cargs.extend_from_slice(&args);
    let server = spawn(None, &sargs);
    let client = spawn(None, &cargs);
    let pid = client.id().to_string();
    // Most likely in the middle of the run (on a fast host it may be
    // over, or on a slow one not started: then the stall is harmless
    // anyway).
    std::thread::sleep(Duration::from_millis(300));
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, pid.as_str()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    std::thread::sleep(Duration::from_millis(1500));
    signal("-CONT");
    let (c_ok, c_out, c_err) = finish(client);
    let (s_ok, s_out, s_err) = finish(server);
    assert!(c_ok && s_ok, "server: {s_out}{s_err}\nclient: {c_out}{c_err}");
    check_send_report(&s_out, 2000);
    check_send_report(&c_out, 2000);
}

/// The server dies in the middle of a long ping-pong: the client's work
/// requests complete with an error (retries exhausted) and it exits, no
/// hang, no crash.
#[test]
fn a_peer_killed_mid_transfer_fails_the_survivor_cleanly() {
    let port = free_tcp_port().to_string();
    let args = ["-s", "8", "-n", "100000000", "--warmup", "0", "--link", "shm"];
    let mut sargs = vec!["-p", port.as_str(), "--bind", "127.0.0.1"];
    sargs.extend_from_slice(&args);
    let mut cargs = vec!["127.0.0.1", "-p", port.as_str()];
    cargs.extend_from_slice(&args);
    let mut server = spawn(None, &sargs);
    let client = spawn(None, &cargs);
    // Long enough for the connection and the channel on a loaded machine;
    // the run itself would take minutes.
    std::thread::sleep(Duration::from_millis(1500));
    server.kill().expect("kill the server");
    let _ = server.wait();
    let start = Instant::now();
    let (ok, _out, err) = finish(client);
    assert!(!ok, "the client cannot succeed: {err}");
    assert!(
        err.contains("completion with status"),
        "the client's WRs complete with an error: {err}"
    );
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
}
