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
//! $ softverbs perf send_lat --link udp --server --stats   # counters at exit
//! ```
//!
//! Counters ([`stats`]): `--stats` prints every soft device counter that
//! moved at the end, `SIGUSR1` prints them to standard error during the
//! run, and what was dropped or refused is said on standard error at the
//! end of every run.

use std::io::Write;

use softverbs_benches::perftest::{self, PerfError};

use super::{eprintln_safe, stats, CliError, Env};

/// Arguments of `softverbs perf` (perftest's flags).
pub use softverbs_benches::perftest::PerfArgs as Args;

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
    // Before any device (and its threads): SIGUSR1 prints the counters.
    let usr1 = stats::OnSignal::start("softverbs: perf");
    let r = run_tests(env, args, out);
    drop(usr1);
    if let Some(report) = softverbs::soft::probe::report() {
        eprint!("{report}");
    }
    // The soft devices a run creates stay for the process: their
    // counters are there after it, failed or not.
    if args.stats {
        let s = stats::all_counters();
        let _ = out.write_all(
            if s.is_empty() {
                "no soft device counter moved\n"
            } else {
                &s
            }
            .as_bytes(),
        );
    }
    stats::report_drops(&format!("softverbs: perf {}", args.test));
    r
}

fn run_tests(env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    perftest::run(args, env.global.backend(), out).map_err(|e| match e {
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
    })
}
