//! Goodput and completion latency of RC writes and sends in virtual time,
//! under loss with reordering: the figures later changes to the
//! retransmission logic are measured against (`softverbs sim bench`).
//!
//! A closed loop keeps `window` signaled WRs of `size` bytes outstanding
//! from node A to node B until `messages` have completed; latency is from
//! post to the poll of the CQE, goodput is payload bits over the virtual
//! time from the first post to the last completion. Everything is virtual:
//! the figures depend only on the configuration and the seed, not on the
//! machine.

use std::fmt::Write as _;

use softverbs::soft::proto::Nanos;
use softverbs::verbs::{Mtu, RecvWr, SendFlags, SendOp, SendWr};

use softverbs::soft::proto::Recovery;

use super::conn::{pair_with, QpOptions};
use super::link::{FaultModel, LinkConfig};
use super::SimError;

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchOp {
    /// RDMA write.
    Write,
    /// Send (the receiver keeps receives posted).
    Send,
}

impl BenchOp {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::Write => "write",
            BenchOp::Send => "send",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// Operations (one table row per operation and loss rate).
    pub ops: Vec<BenchOp>,
    /// Loss probabilities (per packet, both directions).
    pub losses: Vec<f64>,
    /// Probability that a packet is reordered (held back up to 20 µs).
    pub reorder: f64,
    /// Message size in bytes.
    pub size: u32,
    /// Messages per row.
    pub messages: u32,
    /// WRs kept outstanding.
    pub window: u32,
    /// The link (faults are set per row).
    pub link: LinkConfig,
    /// QP options (path MTU, timeout, retries).
    pub qp: QpOptions,
    /// Seed of every row's fabric.
    pub seed: u64,
    /// Loss recoveries compared (both nodes run the same one).
    pub recoveries: Vec<Recovery>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            ops: vec![BenchOp::Write, BenchOp::Send],
            losses: vec![0.0, 0.001, 0.01, 0.05],
            reorder: 0.01,
            size: 64 * 1024,
            messages: 400,
            window: 8,
            link: LinkConfig {
                latency_ns: 2_000,
                bandwidth_bps: 25_000_000_000,
                ..LinkConfig::ideal()
            },
            qp: QpOptions {
                path_mtu: Mtu::Mtu4096,
                timeout: 12,
                retry_cnt: 7,
                ..QpOptions::default()
            },
            seed: 1,
            recoveries: vec![Recovery::GoBackN, Recovery::SelectiveRepeat],
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// Operation.
    pub op: BenchOp,
    /// Loss recovery of both nodes.
    pub recovery: Recovery,
    /// Loss probability.
    pub loss: f64,
    /// Message size.
    pub size: u32,
    /// Messages completed.
    pub messages: u32,
    /// Virtual time from the first post to the last completion.
    pub elapsed_ns: Nanos,
    /// Payload goodput in Gb/s.
    pub goodput_gbps: f64,
    /// Completion latency percentiles and extremes (ns): p50, p99, max.
    pub lat_p50_ns: Nanos,
    /// 99th percentile latency.
    pub lat_p99_ns: Nanos,
    /// Largest latency.
    pub lat_max_ns: Nanos,
    /// Mean latency.
    pub lat_avg_ns: Nanos,
    /// Request packets the requester resent (go-back-N episodes).
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Packets the fabric lost.
    pub lost: u64,
    /// Packets transmitted (both directions).
    pub packets: u64,
}

/// Runs every row.
///
/// # Errors
///
/// A livelock (never expected) or a failed completion, as text.
pub fn run(cfg: &BenchConfig) -> Result<Vec<BenchRow>, String> {
    let mut rows = Vec::new();
    for &op in &cfg.ops {
        for &loss in &cfg.losses {
            for &r in &cfg.recoveries {
                rows.push(run_one(cfg, op, loss, r)?);
            }
        }
    }
    Ok(rows)
}

fn percentile(sorted: &[Nanos], p: f64) -> Nanos {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs one row.
///
/// # Errors
///
/// As [`run`].
pub fn run_one(cfg: &BenchConfig, op: BenchOp, loss: f64, recovery: Recovery) -> Result<BenchRow, String> {
    let link = LinkConfig {
        faults: FaultModel {
            loss,
            reorder: cfg.reorder,
            reorder_ns: 20_000,
            ..FaultModel::NONE
        },
        ..cfg.link
    };
    let window = cfg.window.max(1);
    let qp = QpOptions {
        sq_depth: window,
        rq_depth: cfg.messages.max(1),
        ..cfg.qp
    };
    let size = cfg.size;
    let (mut f, a, b) = pair_with(cfg.seed, link, &qp, (size as usize).max(8), (recovery, recovery))
        .map_err(|e| format!("setting up the pair: {e}"))?;
    if op == BenchOp::Send {
        let rsgl = [b.sge(0, size)];
        for i in 0..cfg.messages {
            b.post_recv(&mut f, &[RecvWr::new(u64::from(i), &rsgl)])
                .map_err(|e| format!("post_recv: {e:?}"))?;
        }
    }
    let sgl = [a.sge(0, size)];
    let remote = b.remote(0);
    let post = |f: &mut super::Fabric, i: u32| -> Result<(), String> {
        let sop = match op {
            BenchOp::Write => SendOp::Write { remote },
            BenchOp::Send => SendOp::Send,
        };
        let wr = SendWr::new(u64::from(i), sop, &sgl).flags(SendFlags::SIGNALED);
        a.post_send(f, &[wr]).map_err(|e| format!("post_send: {e:?}"))
    };
    let start = f.now();
    let mut posted_at = vec![0; cfg.messages as usize];
    let mut posted = 0u32;
    while posted < window.min(cfg.messages) {
        posted_at[posted as usize] = f.now();
        post(&mut f, posted)?;
        posted += 1;
    }
    let mut lat = Vec::with_capacity(cfg.messages as usize);
    let max_steps = 200_000 + 50 * u64::from(cfg.messages) * u64::from(size / 1024 + 1);
    let mut steps = 0u64;
    while lat.len() < cfg.messages as usize {
        if !f.step() {
            return Err(format!("idle with {} of {} messages done", lat.len(), cfg.messages));
        }
        steps += 1;
        if steps > max_steps {
            return Err(SimError::to_string(&f.livelock(steps)));
        }
        if f.core(a.node).cq_len(a.send_cq) == 0 {
            continue;
        }
        for wc in a.poll_send(&mut f) {
            if !wc.is_success() {
                return Err(format!("message {} completed with {:?}", wc.wr_id, wc.status));
            }
            lat.push(f.now() - posted_at[wc.wr_id as usize]);
            if posted < cfg.messages {
                posted_at[posted as usize] = f.now();
                post(&mut f, posted)?;
                posted += 1;
            }
        }
    }
    let elapsed = (f.now() - start).max(1);
    let avg = lat.iter().sum::<Nanos>() / lat.len().max(1) as Nanos;
    lat.sort_unstable();
    let c = f.core(a.node).counters().clone();
    Ok(BenchRow {
        op,
        recovery,
        loss,
        size,
        messages: cfg.messages,
        elapsed_ns: elapsed,
        goodput_gbps: f64::from(cfg.messages) * f64::from(size) * 8.0 / elapsed as f64,
        lat_p50_ns: percentile(&lat, 0.5),
        lat_p99_ns: percentile(&lat, 0.99),
        lat_max_ns: lat.last().copied().unwrap_or(0),
        lat_avg_ns: avg,
        retransmits: c.retransmits,
        timeouts: c.retransmit_timeouts,
        lost: f.stats().lost,
        packets: f.stats().sent,
    })
}

fn us(ns: Nanos) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// The rows as a table, with the configuration in a header line.
pub fn render(cfg: &BenchConfig, rows: &[BenchRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# RC over the simulated fabric, virtual time: {} B messages, {} per row, window {}, path MTU {}, \
         {} Gb/s, {} µs one-way, reorder {}%, timeout {} ({} µs), seed {}",
        cfg.size,
        cfg.messages,
        cfg.window,
        cfg.qp.path_mtu.bytes(),
        cfg.link.bandwidth_bps / 1_000_000_000,
        us(cfg.link.latency_ns),
        cfg.reorder * 100.0,
        cfg.qp.timeout,
        us(4096u64 << cfg.qp.timeout),
        cfg.seed
    );
    let _ = writeln!(
        s,
        "{:<6} {:<4} {:>6} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "op",
        "rec",
        "loss%",
        "goodput",
        "elapsed[ms]",
        "p50[us]",
        "p99[us]",
        "max[us]",
        "avg[us]",
        "retrans",
        "timeouts",
        "lost"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<6} {:<4} {:>6} {:>7.2}Gb/s {:>12.3} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
            r.op.name(),
            recovery_name(r.recovery),
            format!("{}", r.loss * 100.0),
            r.goodput_gbps,
            r.elapsed_ns as f64 / 1e6,
            us(r.lat_p50_ns),
            us(r.lat_p99_ns),
            us(r.lat_max_ns),
            us(r.lat_avg_ns),
            r.retransmits,
            r.timeouts,
            r.lost
        );
    }
    s
}

/// The short name of a recovery in the table (`gbn`, `sr`).
pub fn recovery_name(r: Recovery) -> &'static str {
    match r {
        Recovery::GoBackN => "gbn",
        Recovery::SelectiveRepeat => "sr",
    }
}
