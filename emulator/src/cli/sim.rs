//! `softverbs sim`: the deterministic simulated fabric
//! ([`crate::sim`]) from the command line.
//!
//! - `sim bench`: goodput and completion latency of RC writes and sends in
//!   virtual time at 0, 0.1, 1 and 5 % loss with reordering, for
//!   standard go-back-N and selective repeat side by side
//!   (`--recovery gbn|sr` for one).
//! - `sim run --seed S`: one random scenario, checked against the reference
//!   model; `--trace` prints its packet log (replay a failing seed).
//! - `sim fuzz --count N`: many random scenarios; reports every failing
//!   seed.
//!
//! ```text
//! $ softverbs sim bench
//! $ softverbs sim bench --reorder 0 --loss 1 --recovery sr
//! $ softverbs sim run --seed 0x2a --trace --tail 200
//! $ softverbs sim fuzz --count 10000 --permanent-cut
//! ```
//!
//! A scenario that breaks an invariant (or a bench that cannot finish)
//! exits with status 3.

use std::io::Write;

use clap::Subcommand;

use super::{CliError, Env};
use crate::sim::bench::{self, BenchConfig, BenchOp};
use crate::sim::workload::GenLimits;
use crate::sim::Scenario;
use softverbs::soft::proto::Recovery;

/// Arguments of `softverbs sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: SimCommand,
}

/// The `sim` subcommands.
#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Goodput and completion latency of RC write and send in virtual time
    /// under loss with reordering
    Bench(BenchArgs),
    /// Run one random scenario from its seed and check it against the
    /// reference model (replays a failure bit for bit)
    Run(RunArgs),
    /// Run many random scenarios and report the failing seeds
    Fuzz(FuzzArgs),
}

/// What random scenarios may contain.
#[derive(Debug, Clone, clap::Args)]
pub struct GenArgs {
    /// Most work requests per scenario
    #[arg(long, default_value_t = 24)]
    pub ops: usize,
    /// Allow messages up to 1 MiB
    #[arg(long)]
    pub large: bool,
    /// No link faults or partitions (RNR NAKs still happen)
    #[arg(long)]
    pub no_faults: bool,
    /// End with a partition that never heals (RETRY_EXC_ERR expected)
    #[arg(long)]
    pub permanent_cut: bool,
    /// Only node A posts work requests
    #[arg(long)]
    pub one_sided: bool,
}

impl GenArgs {
    fn limits(&self) -> GenLimits {
        GenLimits {
            max_ops: self.ops.max(1),
            large: self.large,
            faults: !self.no_faults,
            permanent_cut: self.permanent_cut,
            both_sides: !self.one_sided,
        }
    }
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("'{s}' is not a seed: {e}"))
}

/// Arguments of `softverbs sim run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The seed (decimal or 0x-hex)
    #[arg(long, value_parser = parse_seed)]
    pub seed: u64,
    /// What the scenario may contain
    #[command(flatten)]
    pub gen: GenArgs,
    /// Print the packet log (decoded headers)
    #[arg(long)]
    pub trace: bool,
    /// With --trace, only the last N events
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Print the whole scenario (the program, QP options, links, cuts)
    #[arg(long)]
    pub show: bool,
}

/// Arguments of `softverbs sim fuzz`.
#[derive(Debug, Clone, clap::Args)]
pub struct FuzzArgs {
    /// First seed
    #[arg(long, default_value = "0", value_parser = parse_seed)]
    pub start: u64,
    /// Number of seeds
    #[arg(long, default_value_t = 1000)]
    pub count: u64,
    /// What the scenarios may contain
    #[command(flatten)]
    pub gen: GenArgs,
}

/// Arguments of `softverbs sim bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Message size in bytes
    #[arg(long, short = 's', default_value_t = 65_536)]
    pub size: u32,
    /// Messages per row
    #[arg(long, short = 'n', default_value_t = 400)]
    pub messages: u32,
    /// Work requests kept outstanding
    #[arg(long, default_value_t = 8)]
    pub window: u32,
    /// Loss rates in percent, comma separated
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,1,5")]
    pub loss: Vec<f64>,
    /// Reordered packets in percent
    #[arg(long, default_value_t = 1.0)]
    pub reorder: f64,
    /// Local ACK timeout exponent (4.096 µs · 2^timeout)
    #[arg(long, default_value_t = 12)]
    pub timeout: u8,
    /// Seed of the faults
    #[arg(long, default_value = "1", value_parser = parse_seed)]
    pub seed: u64,
    /// Also draw goodput and p99 latency against loss as an SVG chart in
    /// FILE
    #[arg(long = "plot", value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// Loss recoveries to compare, comma separated: `gbn` (standard
    /// go-back-N on the wire), `sr` (selective repeat between soft devices)
    #[arg(long, value_delimiter = ',', default_value = "gbn,sr", value_parser = parse_recovery)]
    pub recovery: Vec<Recovery>,
}

fn parse_recovery(s: &str) -> Result<Recovery, String> {
    match s {
        "gbn" => Ok(Recovery::GoBackN),
        "sr" => Ok(Recovery::SelectiveRepeat),
        _ => Err(format!("unknown recovery {s:?} (gbn or sr)")),
    }
}

/// Runs `softverbs sim`.
///
/// # Errors
///
/// Exit status 3 when a scenario breaks an invariant or a bench fails;
/// output errors.
pub fn run(_env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    match &args.command {
        SimCommand::Bench(a) => run_bench(a, out),
        SimCommand::Run(a) => run_one(a, out),
        SimCommand::Fuzz(a) => run_fuzz(a, out),
    }
}

fn run_bench(a: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let d = BenchConfig::default();
    let cfg = BenchConfig {
        ops: vec![BenchOp::Write, BenchOp::Send],
        losses: a.loss.iter().map(|p| p / 100.0).collect(),
        reorder: a.reorder / 100.0,
        size: a.size,
        messages: a.messages.max(1),
        window: a.window.max(1),
        qp: crate::sim::QpOptions {
            timeout: a.timeout,
            ..d.qp
        },
        seed: a.seed,
        recoveries: a.recovery.clone(),
        ..d
    };
    match bench::run(&cfg) {
        Ok(rows) => {
            out.write_all(bench::render(&cfg, &rows).as_bytes())?;
            match &a.plot {
                Some(path) => plot_bench(path, &rows),
                None => Ok(()),
            }
        }
        Err(e) => {
            super::eprintln_safe(&format!("softverbs: sim bench: {e}"));
            Err(CliError::Reported(3))
        }
    }
}

/// `sim bench --plot`: the result rows as charts, one line per operation
/// and loss recovery.
fn plot_bench(path: &std::path::Path, rows: &[bench::BenchRow]) -> Result<(), CliError> {
    let charts = super::plot::sim_charts(rows, |r| {
        let recovery = match r.recovery {
            Recovery::GoBackN => "gbn",
            Recovery::SelectiveRepeat => "sr",
        };
        format!("{} {recovery}", r.op.name())
    });
    super::plot::write_svg(path, &charts).map_err(|e| {
        super::eprintln_safe(&format!("softverbs: sim bench: {e}"));
        CliError::Reported(3)
    })
}

fn run_one(a: &RunArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let sc = Scenario::random(a.seed, &a.gen.limits());
    if a.show {
        writeln!(out, "{sc:#?}")?;
    } else {
        writeln!(
            out,
            "seed {:#x}: {} WRs, {:?} path MTU {}, timeout {}, cuts {:?}",
            a.seed,
            sc.program.ops.len(),
            sc.qp.qp_type,
            sc.qp.path_mtu.bytes(),
            sc.qp.timeout,
            sc.cuts
        )?;
        writeln!(out, "  A->B {:?}\n  B->A {:?}", sc.link_ab, sc.link_ba)?;
    }
    let (result, trace) = if a.trace {
        sc.run_traced(a.tail)
    } else {
        (sc.run(), None)
    };
    if let Some(t) = trace {
        out.write_all(t.render(a.tail).as_bytes())?;
    }
    match result {
        Ok(r) => {
            writeln!(
                out,
                "ok: {} steps, virtual time {}, {} packets ({} lost, {} duplicated, {} corrupted), failed: {:?}",
                r.steps,
                crate::sim::trace::fmt_time(r.end_ns),
                r.stats.sent,
                r.stats.lost,
                r.stats.duplicated,
                r.stats.corrupted,
                r.failed
            )?;
            Ok(())
        }
        Err(mut v) => {
            // The trace (if any) was printed in full above.
            v.trace_tail = None;
            writeln!(out, "VIOLATION: {v}")?;
            Err(CliError::Reported(3))
        }
    }
}

fn run_fuzz(a: &FuzzArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let limits = a.gen.limits();
    let mut failed = 0u64;
    for seed in a.start..a.start.saturating_add(a.count) {
        if let Err(v) = Scenario::random(seed, &limits).run() {
            failed += 1;
            writeln!(out, "FAIL {v}")?;
        }
    }
    writeln!(out, "{} of {} scenarios failed", failed, a.count)?;
    if failed > 0 {
        return Err(CliError::Reported(3));
    }
    Ok(())
}
