//! `softverbs conformance`: runs the verbs conformance suite
//! ([`softverbs_conformance`]) against the soft provider or a hardware
//! device and prints a table, one row per case as it finishes:
//!
//! ```text
//! case                                   result       time  detail
//! dev.query_device.limits                PASS        0.3ms
//! mr.fast_reg.register_then_access       SKIP        0.1ms  needs fast_reg: ...
//! ...
//! 412 passed, 0 failed, 9 skipped, 0 known divergence
//! ```
//!
//! The last line is always the summary, `N passed, N failed, N skipped, N
//! known divergence`. `--json` and `--junit` also write the report to
//! files. The exit status is 4 when a case failed (known divergences do
//! not count), 1 when there is no device, 3 when the device cannot be
//! opened or queried.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use softverbs::verbs::{BackendKind, Device};
use softverbs_conformance::case::{Cap, Caps};
use softverbs_conformance::cases;
use softverbs_conformance::runner::{self, Filter, RunOptions, Target};

use super::{CliError, Env};

/// Exit status when at least one case failed.
pub const EXIT_FAILED: u8 = 4;

/// Arguments of `softverbs conformance`.
#[derive(Debug, Clone, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// Device for side A (default: soft: softverbs_0; hw: the first device)
    #[arg(short = 'd', long = "device", value_name = "NAME")]
    pub device: Option<String>,
    /// Device for side B (default: soft without --device: softverbs_1;
    /// otherwise the same device as side A)
    #[arg(long = "peer-device", value_name = "NAME")]
    pub peer_device: Option<String>,
    /// Run only the cases whose id contains PATTERN, or matches it as a glob
    /// when it has * or ? (comma-separated patterns: any of them)
    #[arg(short = 'f', long, value_name = "PATTERN")]
    pub filter: Option<String>,
    /// Also write the report as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the report as JUnit XML to FILE
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// List the selected cases (id, required capabilities, description,
    /// rule) without running them
    #[arg(short = 'l', long)]
    pub list: bool,
    /// Abandon a case (and fail it) after this many seconds
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub case_timeout: u64,
}

/// Lists or runs the selected cases.
///
/// # Errors
///
/// [`CliError::NotFound`] (exit 1) without a device; a verbs error (exit 3)
/// when the device cannot be opened or queried; [`CliError::Reported`]
/// with [`EXIT_FAILED`] when a case failed.
pub fn run(env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    let filter = Filter::new(args.filter.as_deref());
    let selected: Vec<_> = cases::all().into_iter().filter(|c| filter.matches(&c.id)).collect();
    if args.list {
        return list(&selected, out);
    }
    let target = target(env, args)?;
    let caps = target
        .a
        .open()
        .and_then(|ctx| Caps::probe(&ctx))
        .map_err(|e| CliError::verbs(target.a.name(), e))?;
    let width = selected.iter().map(|c| c.id.len()).max().unwrap_or(4).max(4);
    let mut head = format!(
        "conformance: backend {}, side A {}, side B {}, {} case(s)\n",
        target.backend,
        target.a.name(),
        target.b.name(),
        selected.len()
    );
    let missing: Vec<String> = Cap::ALL
        .iter()
        .filter_map(|&c| caps.why_not(c).map(|why| format!("{c} ({why})")))
        .collect();
    if !missing.is_empty() {
        head.push_str(&format!("not applicable here: {}\n", missing.join("; ")));
    }
    head.push_str(&runner::table_header(width));
    head.push('\n');
    out.write_all(head.as_bytes())?;
    out.flush()?;
    let opts = RunOptions {
        filter: Filter::default(),
        case_timeout: Duration::from_secs(args.case_timeout),
    };
    let mut io_error = None;
    let report = runner::run(&target, selected, &opts, &mut |r| {
        if io_error.is_none() {
            let row = runner::table_row(r, width);
            if let Err(e) = writeln!(out, "{row}").and_then(|()| out.flush()) {
                io_error = Some(e);
            }
        }
    })
    .map_err(|e| CliError::verbs(target.a.name(), e))?;
    if let Some(e) = io_error {
        return Err(e.into());
    }
    let summary = report.summary();
    let mut tail = String::new();
    if summary.failed > 0 {
        tail.push_str("\nfailed:\n");
        for c in report.failures() {
            tail.push_str(&format!("  {}: {} [{}]\n", c.id, c.detail, c.rule));
        }
    }
    tail.push_str(&format!("\nran in {:.2} s\n", report.duration.as_secs_f64()));
    tail.push_str(&summary.line());
    tail.push('\n');
    out.write_all(tail.as_bytes())?;
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json())?;
    }
    if let Some(path) = &args.junit {
        std::fs::write(path, report.to_junit())?;
    }
    if summary.failed > 0 {
        return Err(CliError::Reported(EXIT_FAILED));
    }
    Ok(())
}

fn list(selected: &[softverbs_conformance::Case], out: &mut dyn Write) -> Result<(), CliError> {
    let width = selected.iter().map(|c| c.id.len()).max().unwrap_or(4).max(4);
    let mut s = String::new();
    for c in selected {
        let needs: Vec<&str> = c.requires.iter().map(|c| c.name()).collect();
        let needs = if needs.is_empty() {
            "-".to_string()
        } else {
            needs.join(",")
        };
        s.push_str(&format!(
            "{:<width$}  {:<14}  {}  [{}]\n",
            c.id, needs, c.description, c.rule
        ));
    }
    s.push_str(&format!("{} case(s)\n", selected.len()));
    out.write_all(s.as_bytes())?;
    Ok(())
}

/// The devices to run on: see [`Args::device`] and [`Args::peer_device`].
fn target(env: &Env, args: &Args) -> Result<Target, CliError> {
    let kind = env.global.backend();
    let devs = env.devices(Some(kind))?;
    let find = |name: &str| env.device(Some(kind), name);
    let a: Device = match &args.device {
        Some(name) => find(name)?,
        None => devs[0].clone(),
    };
    let b: Device = match (&args.peer_device, &args.device) {
        (Some(name), _) => find(name)?,
        (None, Some(_)) => a.clone(),
        // The soft backend's default is the embedded pair; hardware uses
        // one device for both sides (two NICs need not be cabled together).
        (None, None) if kind == BackendKind::Soft => devs.get(1).cloned().unwrap_or_else(|| a.clone()),
        (None, None) => a.clone(),
    };
    Ok(Target { backend: kind, a, b })
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
    fn list_prints_every_case_without_running() {
        let (r, out) = cli(&["softverbs", "conformance", "--list"]);
        assert!(r.is_ok(), "{r:?}");
        let n = cases::all().len();
        assert_eq!(out.lines().count(), n + 1, "{out}");
        assert_eq!(out.lines().last(), Some(format!("{n} case(s)").as_str()));
        assert!(out.contains("qp.state.rc.init_to_rtr.missing_av"), "{out}");
    }

    #[test]
    fn a_filtered_run_prints_rows_and_ends_with_the_summary() {
        let dir = std::env::temp_dir().join(format!("softverbs-conformance-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (json, junit) = (dir.join("r.json"), dir.join("r.xml"));
        let (r, out) = cli(&[
            "softverbs",
            "conformance",
            "--filter",
            "dev.query_pkey,mr.fast_reg.alloc_above_max_pages",
            "--json",
            json.to_str().expect("path"),
            "--junit",
            junit.to_str().expect("path"),
        ]);
        assert!(r.is_ok(), "{r:?}\n{out}");
        assert!(out.contains("dev.query_pkey.default"), "{out}");
        let last = out.lines().last().expect("output");
        assert!(
            last.starts_with("3 passed, 0 failed, ") || last.starts_with("2 passed, 0 failed, 1 skipped"),
            "{out}"
        );
        assert!(last.ends_with(" known divergence"), "{out}");
        let j = std::fs::read_to_string(&json).expect("JSON report");
        assert!(j.contains("\"dev.query_pkey.default\""), "{j}");
        let x = std::fs::read_to_string(&junit).expect("JUnit report");
        assert!(x.contains("<testsuite name=\"dev\""), "{x}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unknown_device_is_not_found() {
        let (r, _) = cli(&["softverbs", "conformance", "--device", "no_such_dev0"]);
        match r {
            Err(e @ CliError::NotFound(_)) => assert_eq!(e.exit_status(), 1),
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[cfg(not(feature = "hardware"))]
    #[test]
    fn hw_without_the_hardware_feature_is_one_line_not_found() {
        let (r, out) = cli(&["softverbs", "conformance", "--backend", "hw"]);
        assert!(out.is_empty(), "{out}");
        match r {
            Err(e @ CliError::NotFound(_)) => {
                assert_eq!(e.exit_status(), 1);
                let msg = e.to_string();
                assert!(msg.starts_with("No RDMA devices found"), "{msg}");
                assert!(!msg.contains('\n'), "{msg}");
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }
}
