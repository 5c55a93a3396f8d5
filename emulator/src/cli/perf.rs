//! `softverbs perf <test>`: perftest-compatible bandwidth and latency tests
//! (write_bw, write_lat, read_bw, read_lat, send_bw, send_lat, atomic_bw,
//! atomic_lat) and the many-QP `scale` test, over the selected backend.
//!
//! The tests live in the `softverbs-benches` crate
//! ([`softverbs_benches::perftest`]); this module maps their errors to the
//! CLI's exit statuses: a flag combination the test rejects is a usage error
//! (2), a device or link that does not exist (yet) is 1, a failed verb or
//! an error completion is 3.
//!
//! ```text
//! $ softverbs perf write_bw -a               # both ends in this process
//! $ softverbs perf send_lat -s 64 -n 10000
//! $ softverbs --backend hw perf write_bw --server
//! $ softverbs --backend hw perf write_bw --client server-host
//! $ softverbs perf write_bw -a --backends soft,hw   # side by side
//! ```
//!
//! `--backends soft,hw` runs the same loopback test on each backend in
//! turn (each with its full report), then prints one line per message size
//! with every backend's figure and the ratio of each to the first:
//!
//! ```text
//! ---------------------------------------------------------------------------------------
//!  #bytes              soft BW            hw BW      hw/soft    (BW average[MiB/sec])
//!  65536               812.34           1043.20        1.28x
//! ---------------------------------------------------------------------------------------
//! ```
//!
//! With a NIC the `hw` column is the NIC; built with `--features hardware`
//! and run with `LD_LIBRARY_PATH` at softverbs' own `libibverbs.so.1`
//! (`emulator/ibverbs/mklibdir.sh`), it is the library's soft device seen
//! through the hardware backend.

use std::io::Write;

use softverbs::verbs::BackendKind;
use softverbs_benches::perftest::report::{self, Row};
use softverbs_benches::perftest::{self, PerfArgs, PerfError};

use super::{eprintln_safe, Backend, CliError, Env};

/// Arguments of `softverbs perf`: perftest's flags, and `--backends`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// perftest's flags.
    #[command(flatten)]
    pub perf: PerfArgs,
    /// Run the test on each of these backends in turn (comma-separated,
    /// e.g. soft,hw) and print their results side by side with ratios to
    /// the first (loopback only; overrides --backend)
    #[arg(long = "backends", value_enum, value_delimiter = ',', value_name = "LIST")]
    pub backends: Vec<Backend>,
}

/// Runs the test.
///
/// # Errors
///
/// Usage errors (exit 2), missing devices or links (1), verbs failures and
/// failed tests (3).
pub fn run(env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    // With the `probes` feature: room for 4 Mi marks (32 MiB), and the
    // stages of this process's messages on stderr at the end.
    softverbs::soft::probe::start(1 << 22);
    let r = run_tests(env, args, out);
    if let Some(report) = softverbs::soft::probe::report() {
        eprint!("{report}");
    }
    r
}

fn run_tests(env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    let p = &args.perf;
    if args.backends.is_empty() {
        return perftest::run(p, env.global.backend(), out).map_err(|e| cli_error(p, e));
    }
    let mut kinds: Vec<BackendKind> = Vec::new();
    for b in &args.backends {
        let k = BackendKind::from(*b);
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let mut columns: Vec<(&str, Vec<Row>)> = Vec::new();
    for &kind in &kinds {
        writeln!(out, "\n==== {} on backend {} ====", p.test, backend_name(kind))?;
        out.flush()?;
        let rows = perftest::run::run_rows(p, kind, out).map_err(|e| cli_error(p, e))?;
        columns.push((backend_name(kind), rows));
    }
    writeln!(
        out,
        "\n==== {}: {} side by side ====",
        p.test,
        columns.iter().map(|c| c.0).collect::<Vec<_>>().join(" vs ")
    )?;
    out.write_all(report::comparison(&columns, p.report_gbits).as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The name `--backend` takes for `kind`.
fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Soft => "soft",
        BackendKind::Hardware => "hw",
    }
}

/// The CLI's error (and exit status) for a test's error.
fn cli_error(args: &PerfArgs, e: PerfError) -> CliError {
    match e {
        PerfError::Usage(m) => {
            eprintln_safe(&format!("softverbs: perf {}: {m}", args.test));
            CliError::Reported(2)
        }
        PerfError::NotAvailable(m) => CliError::NotFound(m),
        PerfError::Verbs { context, error } => CliError::Verbs { context, error },
        PerfError::Io(e) => CliError::Io(e),
        PerfError::Failed(m) => {
            eprintln_safe(&format!("softverbs: perf {}: {m}", args.test));
            CliError::Reported(3)
        }
    }
}
