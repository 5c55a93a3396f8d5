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
//! through the hardware backend. The soft column uses the soft backend's
//! default link (two devices of this process, no network); `--link udp`
//! puts it on RoCEv2 over loopback UDP, as the library's device is (the
//! hardware backend ignores `--link`).
//!
//! Counters ([`stats`]): `--stats` prints every soft device counter that
//! moved at the end, `SIGUSR1` prints them to standard error during the
//! run, and what was dropped or refused is said on standard error at the
//! end of every run.

use std::io::Write;

use softverbs::verbs::BackendKind;
use softverbs_benches::perftest::report::{self, Row};
use softverbs_benches::perftest::{self, PerfArgs, PerfError};

use super::{eprintln_safe, stats, Backend, CliError, Env};

/// Arguments of `softverbs perf`: perftest's flags, and `--backends`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// perftest's flags (boxed: they are most of the command line's size).
    #[command(flatten)]
    pub perf: Box<PerfArgs>,
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
    // Before any device (and its threads): SIGUSR1 prints the counters.
    let usr1 = stats::OnSignal::start("softverbs: perf");
    let r = run_tests(env, args, out);
    drop(usr1);
    if let Some(report) = softverbs::soft::probe::report() {
        eprint!("{report}");
    }
    // The soft devices a run creates stay for the process: their
    // counters are there after it, failed or not.
    if args.perf.stats {
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
    stats::report_drops(&format!("softverbs: perf {}", args.perf.test));
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{run as run_cli, Cli};
    use super::*;

    fn cli(args: &[&str]) -> (Result<(), CliError>, String) {
        let cli = Cli::try_parse_from(args).expect("valid command line");
        let mut out = Vec::new();
        let r = run_cli(cli, &mut out);
        (r, String::from_utf8(out).expect("UTF-8 output"))
    }

    #[test]
    fn backends_are_a_comma_separated_list() {
        let cli = Cli::try_parse_from(["softverbs", "perf", "send_lat", "--backends", "soft,hw"]).expect("parses");
        match cli.command {
            super::super::Command::Perf(a) => assert_eq!(a.backends, vec![Backend::Soft, Backend::Hw]),
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["softverbs", "perf", "send_lat", "--backends", "soft,nic"]).is_err());
    }

    #[test]
    fn a_comparison_runs_each_backend_then_prints_the_table() {
        // The soft backend twice over (listed once): one full report, then
        // the side-by-side table with its figure.
        let (r, out) = cli(&[
            "softverbs",
            "perf",
            "send_lat",
            "-s",
            "8",
            "-n",
            "200",
            "--backends",
            "soft,soft",
        ]);
        assert!(r.is_ok(), "{r:?}\n{out}");
        assert_eq!(out.matches("==== send_lat on backend soft ====").count(), 1, "{out}");
        let table = out.split("side by side ====").nth(1).expect("the comparison table");
        assert!(table.contains("soft lat") && table.contains("t_typical[usec]"), "{out}");
        let row = table
            .lines()
            .find(|l| l.trim_start().starts_with("8 "))
            .expect("the 8-byte row");
        let t: f64 = row
            .split_whitespace()
            .nth(1)
            .expect("figure")
            .parse()
            .expect("a number");
        assert!(t > 0.0, "{row}");
    }

    #[test]
    fn a_comparison_refuses_server_mode() {
        let (r, _) = cli(&[
            "softverbs",
            "perf",
            "send_lat",
            "--server",
            "--link",
            "udp",
            "--backends",
            "soft",
        ]);
        assert!(matches!(r, Err(CliError::Reported(2))), "{r:?}");
    }
}
