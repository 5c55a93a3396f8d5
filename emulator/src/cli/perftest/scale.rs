//! `softverbs perf scale`: how the cost of a device pair grows with the
//! number of QPs. For each QP count N, both ends create N RC QPs (sharing
//! one PD, one MR and one CQ per direction per end), connect them pairwise,
//! and run small RDMA writes round-robin over all of them; the table gives
//! the aggregate message rate, the setup time per QP and the resident
//! memory per QP (growth of the process's RSS, from `/proc/self/status`,
//! divided by the 2·N QPs of the two ends).
//!
//! The sender keeps the QPs that have room in the send queue in a FIFO
//! (filled as their moderated completions arrive), so a message costs the
//! benchmark O(1) whatever the count: the perftest loop of `write_bw -q`
//! visits every QP on every turn, and at 16,384 QPs that scan (two 128 KiB
//! counter arrays per CQ poll) cost more than the provider did. The QPs
//! are still served in turn: completions arrive in post order.
//!
//! Counts run in ascending order in one process: memory freed by a smaller
//! count can be reused by the next, so the per-QP figure of a count is a
//! slight underestimate when the previous count was large.

use std::collections::VecDeque;
use std::io::Write;
use std::time::Instant;

use softverbs::verbs::{BackendKind, SendFlags, SendOp, SendWr, WorkCompletion};

use crate::cli::perftest::args::{Params, PerfArgs, PerfTest};
use crate::cli::perftest::bw::{check_wc, POLL_BATCH};
use crate::cli::perftest::resources::{Dest, Side};
use crate::cli::perftest::run::loopback_devices;
use crate::cli::perftest::{drive, Agent, Clock, PerfError, Progress, Step, VerbsContext};

/// Resident set size of this process in bytes (`VmRSS`), if known.
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One row of the scale table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleRow {
    /// QPs per end.
    pub qps: u32,
    /// Writes per QP.
    pub iters: u64,
    /// Aggregate messages per second.
    pub msg_rate: f64,
    /// Aggregate bytes per second.
    pub bps: f64,
    /// Create + connect time per QP, microseconds (both ends).
    pub setup_us_per_qp: f64,
    /// RSS growth per QP after setup, bytes (`None` without /proc).
    pub rss_setup_per_qp: Option<f64>,
    /// RSS growth per QP after the run, bytes.
    pub rss_run_per_qp: Option<f64>,
}

/// The table header.
pub const SCALE_HEADER: &str =
    " #QPs     iters/QP   MsgRate[Mpps]   BW average[MiB/sec]   setup[usec/QP]   RSS/QP[KiB] setup   RSS/QP[KiB] run";

/// One table row.
pub fn scale_row(r: &ScaleRow) -> String {
    let kib = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |b| format!("{:.2}", b / 1024.0));
    format!(
        " {:<8} {:<10} {:<15.6} {:<21.2} {:<16.2} {:<19} {}\n",
        r.qps,
        r.iters,
        r.msg_rate / 1e6,
        r.bps / 1_048_576.0,
        r.setup_us_per_qp,
        kib(r.rss_setup_per_qp),
        kib(r.rss_run_per_qp)
    )
}

/// Runs the scale benchmark (loopback only).
///
/// # Errors
///
/// See [`PerfError`].
pub fn run(args: &PerfArgs, backend: BackendKind, out: &mut dyn Write) -> Result<(), PerfError> {
    let mut wa = args.clone();
    wa.test = PerfTest::WriteBw;
    wa.size = Some(args.size.unwrap_or(8));
    wa.tx_depth = Some(args.tx_depth.unwrap_or(16));
    wa.cq_mod = Some(args.cq_mod.unwrap_or(16));
    wa.no_peak = true;
    wa.iters = Some(100);
    let base = Params::from_args(&wa, backend)?;
    if base.mode != crate::cli::perftest::Mode::Loopback {
        return Err(PerfError::Usage("the scale test runs in loopback only".into()));
    }
    if args.qp_counts.is_empty() || args.qp_counts.contains(&0) {
        return Err(PerfError::Usage("--qp-counts needs positive counts".into()));
    }
    let (a, b) = loopback_devices(&base)?;
    let ctx_a = a.open().ctx("open")?;
    let ctx_b = b.open().ctx("open")?;
    let size = base.sizes[0];
    writeln!(out, "{}", crate::cli::perftest::report::RESULT_LINE)?;
    writeln!(out, "                    RDMA_Write QP scale Test")?;
    writeln!(out, " Devices         : {} <-> {} (loopback)", a.name(), b.name())?;
    writeln!(
        out,
        " Message size    : {size}[B]\t\tTX depth/QP    : {}\t\tCQ Moderation : {}",
        base.tx_depth, base.cq_mod
    )?;
    writeln!(out, " Messages/count  : {}", args.messages)?;
    writeln!(out, "{}", crate::cli::perftest::report::RESULT_LINE)?;
    writeln!(out, "{SCALE_HEADER}")?;
    out.flush()?;
    for &n in &args.qp_counts {
        let r = one_count(&base, &ctx_a, &ctx_b, n, args.messages)?;
        out.write_all(scale_row(&r).as_bytes())?;
        out.flush()?;
    }
    writeln!(out, "{}", crate::cli::perftest::report::RESULT_LINE)?;
    Ok(())
}

/// Measures one QP count.
///
/// # Errors
///
/// See [`PerfError`].
pub fn one_count(
    base: &Params,
    ctx_a: &softverbs::verbs::Context,
    ctx_b: &softverbs::verbs::Context,
    n: u32,
    messages: u64,
) -> Result<ScaleRow, PerfError> {
    let mut p = base.clone();
    p.qps = n;
    let m = u64::from(p.cq_mod);
    p.iters = (messages / u64::from(n)).max(m).div_ceil(m) * m;
    let size = p.sizes[0];
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let mut sa = Side::with_qps(ctx_a, &p, size, 1, n)?;
    let mut sb = Side::with_qps(ctx_b, &p, size, 2, n)?;
    let (da, db) = (sa.dests(), sb.dests());
    sa.connect(&db)?;
    sb.connect(&da)?;
    let setup = t0.elapsed();
    let rss1 = rss_bytes();
    let clock = Clock::new();
    let mut s = ScaleSender::new(&sa, &db, &p, size);
    let mut progress = Progress::new(format!("scale {n} QPs"));
    drive(&mut [&mut s], &clock, &mut progress)?;
    progress.clear();
    let rss2 = rss_bytes();
    let secs = s.end.saturating_sub(s.start).max(1) as f64 / 1e9;
    let msg_rate = s.completed as f64 / secs;
    let qps = 2.0 * f64::from(n);
    let per = |x: Option<u64>| match (rss0, x) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / qps),
        _ => None,
    };
    Ok(ScaleRow {
        qps: n,
        iters: p.iters,
        msg_rate,
        bps: msg_rate * size as f64,
        setup_us_per_qp: setup.as_secs_f64() * 1e6 / qps,
        rss_setup_per_qp: per(rss1),
        rss_run_per_qp: per(rss2),
    })
}

/// The writer of the scale test: `iters` RDMA writes on each QP, at most
/// `tx_depth` outstanding per QP, every `cq_mod`-th (and each QP's last)
/// signaled, as `write_bw`; what differs is how the next QP to post on is
/// found (see the module docs).
struct ScaleSender<'a> {
    side: &'a Side,
    remote: &'a [Dest],
    size: u64,
    flags: SendFlags,
    iters: u64,
    tx_depth: u64,
    cq_mod: u64,
    /// Posted and completed writes per QP.
    posted: Vec<u64>,
    done: Vec<u64>,
    /// QPs that may have room, in the order their room appeared.
    ready: VecDeque<u32>,
    /// Whether a QP is in `ready`.
    queued: Vec<bool>,
    total_posted: u64,
    completed: u64,
    total: u64,
    start: u64,
    end: u64,
    started: bool,
    wc: [WorkCompletion; POLL_BATCH],
}

impl<'a> ScaleSender<'a> {
    fn new(side: &'a Side, remote: &'a [Dest], p: &Params, size: u64) -> ScaleSender<'a> {
        let n = side.qps.len();
        let inline = p.inline_for(size) && size <= u64::from(side.inline_size);
        ScaleSender {
            side,
            remote,
            size,
            flags: if inline { SendFlags::INLINE } else { SendFlags::empty() },
            iters: p.iters,
            tx_depth: u64::from(p.tx_depth),
            cq_mod: u64::from(p.cq_mod.max(1)),
            posted: vec![0; n],
            done: vec![0; n],
            ready: (0..n as u32).collect(),
            queued: vec![true; n],
            total_posted: 0,
            completed: 0,
            total: p.iters * n as u64,
            start: 0,
            end: 0,
            started: false,
            wc: [WorkCompletion::default(); POLL_BATCH],
        }
    }

    /// Posts on QP `i` until its send queue or its share is full.
    fn fill(&mut self, i: usize) -> Result<bool, PerfError> {
        let qp = &self.side.qps[i];
        let sge = [self.side.send_sge(i, self.size)?];
        let remote = self.remote[i].remote();
        let mut any = false;
        loop {
            let k = self.posted[i];
            if k >= self.iters || k >= self.tx_depth + self.done[i] {
                return Ok(any);
            }
            let mut flags = self.flags;
            if k % self.cq_mod == self.cq_mod - 1 || k == self.iters - 1 {
                flags |= SendFlags::SIGNALED;
            }
            let wr = SendWr::new(i as u64, SendOp::Write { remote }, &sge).flags(flags);
            qp.post_send(&[wr]).ctx("post_send")?;
            self.posted[i] = k + 1;
            self.total_posted += 1;
            any = true;
        }
    }
}

impl Agent for ScaleSender<'_> {
    // Kept out of line: one call per turn, and a profiler can select it
    // (`valgrind --tool=callgrind --toggle-collect='*ScaleSender*step*'`).
    #[inline(never)]
    fn step(&mut self, clock: &Clock) -> Result<Step, PerfError> {
        if !self.started {
            self.started = true;
            self.start = clock.now();
        }
        let mut progressed = false;
        // The QPs queued now; those a completion queues below wait for
        // the next turn, after this turn's CQ poll.
        for _ in 0..self.ready.len() {
            let Some(i) = self.ready.pop_front() else { break };
            self.queued[i as usize] = false;
            progressed |= self.fill(i as usize)?;
        }
        if self.completed < self.total_posted {
            let n = self.side.scq.poll(&mut self.wc).ctx("poll_cq")?;
            for k in 0..n {
                let wc = self.wc[k];
                check_wc(&wc, "send", self.total_posted, self.completed)?;
                let i = wc.wr_id as usize;
                let fill = self.cq_mod.min(self.iters - self.done[i]);
                self.done[i] += fill;
                self.completed += fill;
                if self.posted[i] < self.iters && !self.queued[i] {
                    self.queued[i] = true;
                    self.ready.push_back(i as u32);
                }
            }
            if n > 0 {
                progressed = true;
                self.end = clock.now();
            }
        }
        Ok(Step {
            done: self.completed >= self.total,
            progressed,
        })
    }

    fn progress(&self) -> f64 {
        self.completed as f64 / self.total.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    #[test]
    fn small_scale_run() {
        softverbs::soft::embedded_default().unwrap();
        let cli = Cli::try_parse_from(["perf", "scale", "--qp-counts", "1,8", "--messages", "2000"]).unwrap();
        let mut out = Vec::new();
        run(&cli.perf, BackendKind::Soft, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(SCALE_HEADER), "{text}");
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(" 1 ") || l.starts_with(" 8 "))
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(rss_bytes().is_some());
    }
}
