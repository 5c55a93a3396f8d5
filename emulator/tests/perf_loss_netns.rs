//! RC recovery over real UDP with loss: two network namespaces joined by a
//! veth pair, a `softverbs` process in each, and 1 % of the datagrams each
//! side sends dropped by the UDP link's loss injector (`--drop`; the
//! kernel here has no `netem`). Go-back-N and selective repeat each have
//! a test; the two take turns (each runs four busy-polling processes'
//! worth of work on a host that may have two CPUs: at once, a starved
//! peer could look dead to its requester):
//!
//! - `perf write_bw` (64 KiB WRITEs) must complete in both modes; the
//!   goodput of each is printed (no speed assertion: the machine is
//!   shared). The counters show the loss was injected and recovered, and
//!   that only a selective-repeat run uses SACKs.
//! - `pingpong --op write` (which checks every byte written) must complete
//!   with correct data in both modes under the same loss.
//!
//! Needs root and `ip`; prints a `SKIP:` line saying why otherwise.
//!
//! With the figures of a release build:
//! `cargo test --release -p softverbs-emulator --test perf_loss_netns -- --nocapture`

mod pingpong_common;

use std::process::{Command, Stdio};

use pingpong_common::{bin, finish, run_pair, Netns};

/// Share of the datagrams each side drops.
const LOSS: &str = "0.01";

/// Held by the test running: one at a time.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn setup(tag: &str) -> Option<Netns> {
    // Another range than pingpong_netns's (10.200.20–219), so that the
    // two tests may run at once.
    match Netns::new(tag, 201, 220, 30, false) {
        Ok(n) => Some(n),
        Err(why) => {
            println!("SKIP: RC over lossy UDP between network namespaces: {why}");
            None
        }
    }
}

/// `softverbs --no-embedded perf ARGS` inside `ns`.
fn perf(ns: &str, args: &[&str]) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns, bin(), "--no-embedded", "perf"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softverbs perf")
}

/// A counter's value in a `--stats` report (0 when it did not move, as
/// the report leaves those out); summed over the devices listed.
fn counter(report: &str, name: &str) -> u64 {
    let key = format!("{name}: ");
    report
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&key))
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .sum()
}

/// The average bandwidth (MB/s) of the `size` row of a bandwidth report.
fn average_bw(report: &str, size: u64) -> Option<f64> {
    report.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 5 && f[0] == size.to_string()).then(|| f[3].parse().ok())?
    })
}

/// One `perf write_bw` run under loss with `recovery`; returns the
/// client's goodput (MB/s) after checking both ends succeeded and the
/// loss was injected and recovered.
fn write_bw(n: &Netns, recovery: &str, port: &str) -> f64 {
    let common = [
        "write_bw",
        "--link",
        "udp",
        "-s",
        "65536",
        "-n",
        "1000",
        "-m",
        "1024",
        "-p",
        port,
        "--recovery",
        recovery,
        "--drop",
        LOSS,
        "--stats",
    ];
    let server = perf(&n.a, &[&common[..], &["--server"]].concat());
    let client = perf(&n.b, &[&common[..], &["--client", &n.v4(1)]].concat());
    let (c_ok, c_out, c_err) = finish(client);
    let (s_ok, s_out, s_err) = finish(server);
    assert!(
        c_ok && s_ok,
        "perf write_bw --recovery {recovery} under {LOSS} loss failed\nserver: ok={s_ok}\n{s_out}\n{s_err}\nclient: \
         ok={c_ok}\n{c_out}\n{c_err}"
    );
    let bw = average_bw(&c_out, 65536).unwrap_or_else(|| panic!("no 65536-byte row:\n{c_out}"));
    // The client sends ~64,000 data packets: ~640 of them dropped, each
    // recovered by a retransmission.
    let (drops, resent) = (counter(&c_out, "udp_tx_injected_drops"), counter(&c_out, "retransmits"));
    assert!(drops > 0 && resent > 0, "drops {drops}, retransmits {resent}\n{c_out}");
    assert!(counter(&s_out, "udp_tx_injected_drops") > 0, "{s_out}");
    // Selective repeat is negotiated only when both ends offer it.
    let sacks = counter(&c_out, "sacks_received");
    match recovery {
        "gbn" => assert_eq!(sacks, 0, "{c_out}"),
        _ => assert!(sacks > 0, "{c_out}"),
    }
    println!(
        "{recovery}: write_bw 64 KiB x 1000 under {LOSS} loss: {bw:.2} MB/s ({drops} datagrams dropped at the \
         client, {resent} retransmitted, {sacks} SACKs)"
    );
    bw
}

/// `write_bw` then `pingpong --op write` with data checked, in `recovery`.
fn recovers(recovery: &str, port: &str) {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // A tag of its own: both tests run in one process, and the namespaces
    // are named after the tag and the process.
    let tag = if recovery == "gbn" { "lg" } else { "lr" };
    let Some(n) = setup(tag) else { return };
    let bw = write_bw(&n, recovery, port);
    println!("goodput under {LOSS} loss, {recovery}: {bw:.2} MB/s");
    // Data: pingpong --op write checks every byte the peer wrote.
    let args = [
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
        "--recovery",
        recovery,
        "--drop",
        LOSS,
    ];
    let (s, c) = run_pair(
        Some(&n.a),
        &args,
        Some(&n.b),
        &[&[n.v4(1).as_str()][..], &args[..]].concat(),
    );
    assert!(c.contains("write: 20 x 300000 bytes"), "{recovery}: {c}");
    assert!(s.contains("data verified"), "{recovery}: {s}");
}

#[test]
fn go_back_n_recovers_from_injected_udp_loss_between_namespaces() {
    recovers("gbn", "18517");
}

#[test]
fn selective_repeat_recovers_from_injected_udp_loss_between_namespaces() {
    recovers("sr", "18519");
}
