//! `softverbs perf scale`: how the cost of a device pair grows with the
//! number of QPs. For each QP count N, both ends create N RC QPs (sharing
//! one PD, one MR and one CQ per direction per end), connect them pairwise,
//! and run small RDMA writes round-robin over all of them; the table gives
//! the aggregate message rate, the setup time per QP and the resident
//! memory per QP (growth of the process's RSS, from `/proc/self/status`,
//! divided by the 2·N QPs of the two ends).
//!
//! Counts run in ascending order in one process: memory freed by a smaller
//! count can be reused by the next, so the per-QP figure of a count is a
//! slight underestimate when the previous count was large.

use std::io::Write;
use std::time::Instant;

use softverbs::verbs::BackendKind;

use crate::perftest::args::{Params, PerfArgs, PerfTest};
use crate::perftest::bw::BwSender;
use crate::perftest::resources::Side;
use crate::perftest::run::loopback_devices;
use crate::perftest::{drive, Clock, PerfError, Progress, VerbsContext};

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
    if base.mode != crate::perftest::Mode::Loopback {
        return Err(PerfError::Usage("the scale test runs in loopback only".into()));
    }
    if args.qp_counts.is_empty() || args.qp_counts.contains(&0) {
        return Err(PerfError::Usage("--qp-counts needs positive counts".into()));
    }
    let (a, b) = loopback_devices(&base)?;
    let ctx_a = a.open().ctx("open")?;
    let ctx_b = b.open().ctx("open")?;
    let size = base.sizes[0];
    writeln!(out, "{}", crate::perftest::report::RESULT_LINE)?;
    writeln!(out, "                    RDMA_Write QP scale Test")?;
    writeln!(out, " Devices         : {} <-> {} (loopback)", a.name(), b.name())?;
    writeln!(
        out,
        " Message size    : {size}[B]\t\tTX depth/QP    : {}\t\tCQ Moderation : {}",
        base.tx_depth, base.cq_mod
    )?;
    writeln!(out, " Messages/count  : {}", args.messages)?;
    writeln!(out, "{}", crate::perftest::report::RESULT_LINE)?;
    writeln!(out, "{SCALE_HEADER}")?;
    out.flush()?;
    for &n in &args.qp_counts {
        let r = one_count(&base, &ctx_a, &ctx_b, n, args.messages)?;
        out.write_all(scale_row(&r).as_bytes())?;
        out.flush()?;
    }
    writeln!(out, "{}", crate::perftest::report::RESULT_LINE)?;
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
    let mut s = BwSender::new(&sa, &db, &p, size);
    let mut progress = Progress::new(format!("scale {n} QPs"));
    drive(&mut [&mut s], &clock, &mut progress)?;
    progress.clear();
    let rss2 = rss_bytes();
    let r = s.result();
    let qps = 2.0 * f64::from(n);
    let per = |x: Option<u64>| match (rss0, x) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / qps),
        _ => None,
    };
    Ok(ScaleRow {
        qps: n,
        iters: p.iters,
        msg_rate: r.msg_rate,
        bps: r.avg_bps,
        setup_us_per_qp: setup.as_secs_f64() * 1e6 / qps,
        rss_setup_per_qp: per(rss1),
        rss_run_per_qp: per(rss2),
    })
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
