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
//! ```

use std::io::Write;

use softverbs_benches::perftest::{self, PerfError};

use super::{eprintln_safe, CliError, Env};

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
    let r = run_tests(env, args, out);
    if let Some(report) = softverbs::soft::probe::report() {
        eprint!("{report}");
    }
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
