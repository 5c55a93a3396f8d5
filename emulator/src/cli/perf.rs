//! `softverbs perf <test>`: perftest-compatible bandwidth and latency tests
//! (write_bw, write_lat, read_bw, read_lat, send_bw, send_lat, atomic_bw,
//! atomic_lat) and the many-QP `scale` test, over the selected backend.
//!
//! The tests live in [`perftest`] (shared with the criterion benches);
//! this module maps their errors to the CLI's exit statuses: a flag
//! combination the test rejects is a usage error (2), a device or link
//! that does not exist (yet) is 1, a failed verb or an error completion
//! is 3.
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
//! with every backend's figure and the ratio of each to the first
//! (`--links inproc,udp,shm` does the same for the soft backend's links,
//! and combines with `--backends`):
//!
//! ```text
//! ---------------------------------------------------------------------------------------
//!  #bytes              soft BW            hw BW      hw/soft    (BW average[MB/sec])
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
//! `--plot FILE.svg` draws the rows as a chart (bandwidth, or typical and
//! 99th-percentile latency, against message size; one line per backend of
//! `--backends`), with [`plot`](super::plot::write_svg).
//!
//! Every perftest flag is accepted: those with no effect here are named on
//! standard error with the reason, values the run changes (a margin too
//! long for `-D`, an inline size above the device's) too; a flag given
//! twice takes its last value. `-w`/`-y` fail the run (exit 3) below the
//! limit, as perftest's verifier does.
//!
//! Counters ([`stats`]): `--stats` prints every soft device counter that
//! moved at the end, `SIGUSR1` prints them to standard error during the
//! run, and what was dropped or refused is said on standard error at the
//! end of every run.

use std::io::Write;
use std::path::PathBuf;

use crate::cli::perftest::args::LinkKind;
use crate::cli::perftest::report::{self, Row};
use crate::cli::perftest::stats::BwResult;
use crate::cli::perftest::{self, Params, PerfArgs, PerfError, PerfTest};
use softverbs::verbs::BackendKind;

use super::{eprintln_safe, plot, stats, Backend, CliError, Env};

/// Arguments of `softverbs perf`: perftest's flags, and `--backends`, `--links`, `--plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// perftest's flags (boxed: they are most of the command line's size).
    #[command(flatten)]
    pub perf: Box<PerfArgs>,
    /// Run the test on each of these backends in turn (comma-separated,
    /// e.g. soft,hw) and print their results side by side with ratios to
    /// the first (loopback only; overrides --backend)
    #[arg(
        long = "backends",
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        help_heading = "softverbs options"
    )]
    pub backends: Vec<Backend>,
    /// Run the test on the soft backend over each of these links in turn
    /// (comma-separated: inproc,udp,shm) and compare them as --backends
    /// does (combines with --backends; the hw backend has no link)
    #[arg(
        long = "links",
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        help_heading = "softverbs options"
    )]
    pub links: Vec<LinkKind>,
    /// Draw the results as an SVG chart in FILE: bandwidth (or latency)
    /// against message size, one line per backend and link
    #[arg(long = "plot", value_name = "FILE.svg", help_heading = "softverbs options")]
    pub plot: Option<PathBuf>,
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
    if p.version {
        writeln!(
            out,
            "softverbs perf {} (the flags, tables and exchange of perftest 4.5)",
            env!("CARGO_PKG_VERSION")
        )?;
        return Ok(());
    }
    if p.run_infinitely && !(args.backends.is_empty() && args.links.is_empty()) {
        return Err(usage(
            p,
            "--run_infinitely runs one test: not with --backends or --links",
        ));
    }
    if args.plot.is_some() && p.test == PerfTest::Scale {
        return Err(usage(p, "--plot draws per-size rows: the scale test has none"));
    }
    let first = args
        .backends
        .first()
        .map_or(env.global.backend(), |b| BackendKind::from(*b));
    if p.test != PerfTest::Scale {
        // Resolved here once for its notes and checks; each run resolves
        // the same parameters again.
        let params = Params::from_args(p, first).map_err(|e| cli_error(p, e))?;
        for n in &params.notes {
            eprintln_safe(&format!("softverbs: perf {}: {n}", p.test));
        }
        check_port(env, &params)?;
    }
    if args.backends.is_empty() && args.links.is_empty() {
        let backend = env.global.backend();
        let name = backend_name(backend);
        loop {
            let rows = perftest::run(p, backend, out).map_err(|e| cli_error(p, e))?;
            verify(p, &rows)?;
            if let Some(path) = &args.plot {
                write_plot(path, p, &[(name, rows)])?;
            }
            // --run_infinitely: another -D round, until interrupted.
            if !p.run_infinitely {
                return Ok(());
            }
        }
    }
    let mut kinds: Vec<BackendKind> = Vec::new();
    for k in args.backends.iter().map(|b| BackendKind::from(*b)) {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    if kinds.is_empty() {
        kinds.push(env.global.backend());
    }
    let mut links: Vec<LinkKind> = Vec::new();
    for l in &args.links {
        if !links.contains(l) {
            links.push(*l);
        }
    }
    // One run per backend, and per link on the soft backend: named by
    // the link alone when only soft runs, else `soft-udp`.
    let only_soft = kinds == [BackendKind::Soft];
    let mut runs: Vec<(String, BackendKind, Option<LinkKind>)> = Vec::new();
    for &kind in &kinds {
        if kind == BackendKind::Soft && !links.is_empty() {
            for &l in &links {
                let name = if only_soft {
                    l.name().to_string()
                } else {
                    format!("{}-{}", backend_name(kind), l.name())
                };
                runs.push((name, kind, Some(l)));
            }
        } else {
            runs.push((backend_name(kind).to_string(), kind, None));
        }
    }
    let mut named: Vec<(String, Vec<Row>)> = Vec::new();
    for (name, kind, link) in runs {
        let mut a = (**p).clone();
        match link {
            Some(l) => {
                writeln!(
                    out,
                    "\n==== {} on backend {}, link {} ====",
                    p.test,
                    backend_name(kind),
                    l.name()
                )?;
                a.link = l;
            }
            None => writeln!(out, "\n==== {} on backend {} ====", p.test, backend_name(kind))?,
        }
        out.flush()?;
        let rows = perftest::run::run_rows(&a, kind, out).map_err(|e| cli_error(p, e))?;
        named.push((name, rows));
    }
    let columns: Vec<(&str, Vec<Row>)> = named.iter().map(|(n, r)| (n.as_str(), r.clone())).collect();
    writeln!(
        out,
        "\n==== {}: {} side by side ====",
        p.test,
        columns.iter().map(|c| c.0).collect::<Vec<_>>().join(" vs ")
    )?;
    out.write_all(report::comparison(&columns, p.report_gbits).as_bytes())?;
    out.flush()?;
    if let Some(path) = &args.plot {
        write_plot(path, p, &columns)?;
    }
    for (_, rows) in &columns {
        verify(p, rows)?;
    }
    Ok(())
}

/// A usage error of `perf`: said here, exit status 2.
fn usage(args: &PerfArgs, msg: &str) -> CliError {
    eprintln_safe(&format!("softverbs: perf {}: {msg}", args.test));
    CliError::Reported(2)
}

/// `-i`: the port must exist on this end's device (exit 1 otherwise, as
/// `devinfo -i`). Devices a networked soft link creates later are soft
/// devices too, with the ports of the backend's devices.
fn check_port(env: &Env, p: &Params) -> Result<(), CliError> {
    let net = p.backend == BackendKind::Soft && p.link != perftest::args::LinkKind::Inproc;
    let dev = match &p.ib_dev {
        Some(name) if !net => env.device(Some(p.backend), name)?,
        _ => match env.devices(Some(p.backend)) {
            Ok(devs) => devs[0].clone(),
            // A networked soft link creates its own devices.
            Err(_) if net => return Ok(()),
            Err(e) => return Err(e),
        },
    };
    let ctx = dev.open().map_err(|e| CliError::verbs(dev.name(), e))?;
    let attr = ctx.query_device().map_err(|e| CliError::verbs(dev.name(), e))?;
    if p.ib_port > attr.phys_port_cnt {
        return Err(CliError::NotFound(format!(
            "{}: port {} does not exist (the device has {} port{})",
            dev.name(),
            p.ib_port,
            attr.phys_port_cnt,
            if attr.phys_port_cnt == 1 { "" } else { "s" }
        )));
    }
    Ok(())
}

/// perftest's verifier (`-w`, `-y`): a bandwidth row whose average (in
/// the report's unit) or message rate is below the limit fails the run.
fn verify(args: &PerfArgs, rows: &[Row]) -> Result<(), CliError> {
    for r in rows {
        let Row::Bw(b) = r else { continue };
        let bw = BwResult::in_units(b.avg_bps, args.report_gbits);
        if let Some(limit) = args.limit_bw.filter(|&l| bw < l) {
            eprintln_safe(&format!(
                "softverbs: perf {}: {} bytes: BW average {bw:.2} is below the limit {limit} (-w)",
                args.test, b.size
            ));
            return Err(CliError::Reported(3));
        }
        let rate = b.msg_rate / 1e6;
        if let Some(limit) = args.limit_msgrate.filter(|&l| rate < l) {
            eprintln_safe(&format!(
                "softverbs: perf {}: {} bytes: message rate {rate:.6} Mpps is below the limit {limit} (-y)",
                args.test, b.size
            ));
            return Err(CliError::Reported(3));
        }
    }
    Ok(())
}

/// Writes the `--plot` chart of `runs`.
fn write_plot(path: &std::path::Path, args: &PerfArgs, runs: &[(&str, Vec<Row>)]) -> Result<(), CliError> {
    let chart = plot::perf_chart(args.test.name(), runs, args.report_gbits);
    plot::write_svg(path, &[chart]).map_err(|e| {
        eprintln_safe(&format!("softverbs: perf {}: {e}", args.test));
        CliError::Reported(3)
    })
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
    fn links_compare_like_backends() {
        let parsed = Cli::try_parse_from(["softverbs", "perf", "send_lat", "--links", "inproc,udp"]).expect("parses");
        match parsed.command {
            super::super::Command::Perf(a) => assert_eq!(a.links, vec![LinkKind::Inproc, LinkKind::Udp]),
            other => panic!("{other:?}"),
        }
        let (r, out) = cli(&[
            "softverbs",
            "perf",
            "send_lat",
            "-s",
            "8",
            "-n",
            "100",
            "--links",
            "inproc,udp,inproc",
        ]);
        assert!(r.is_ok(), "{r:?}\n{out}");
        assert_eq!(
            out.matches("==== send_lat on backend soft, link inproc ====").count(),
            1,
            "{out}"
        );
        assert_eq!(
            out.matches("==== send_lat on backend soft, link udp ====").count(),
            1,
            "{out}"
        );
        let table = out.split("side by side ====").nth(1).expect("the comparison table");
        assert!(table.contains("inproc lat") && table.contains("udp/inproc"), "{out}");
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
