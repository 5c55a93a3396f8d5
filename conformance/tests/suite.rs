//! The whole conformance suite against the soft provider (the embedded
//! default pair), compared with its committed expectation
//! (`conformance/expected/soft.txt`: every case's pass, skip reason or
//! known divergence), plus checks of the suite itself: ids, counts,
//! reports. With the `hardware` feature, the same comparison on a hardware
//! device when there is one (`conformance/expected/hw-<driver>.txt`).
//!
//! `SOFTVERBS_CONFORMANCE_WRITE=1` writes the expectation from the run
//! instead of comparing (see `softverbs_conformance::expectation`).
//!
//! One test runs every case in sequence (the cases share the process-wide
//! soft devices and some measure quiet periods, so they are not run in
//! parallel with each other).

use std::collections::HashSet;

use softverbs::verbs::BackendKind;
use softverbs_conformance::case::valid_id;
use softverbs_conformance::cases;
use softverbs_conformance::divergence::{KNOWN_DIVERGENCES, KNOWN_SOFT_BUGS};
use softverbs_conformance::expectation;
use softverbs_conformance::runner::{self, Report, RunOptions, Target, Verdict};

/// The failures of a run and stale soft-bug entries, as problem lines.
fn problems_of(report: &Report) -> Vec<String> {
    let mut problems = Vec::new();
    for c in report.failures() {
        problems.push(format!("FAILED {}: {} [{}]", c.id, c.detail, c.rule));
    }
    for bug in KNOWN_SOFT_BUGS {
        let stale = report
            .cases
            .iter()
            .filter(|c| bug.matches(report.backend, &report.device_a, &c.id))
            .any(|c| c.verdict == Verdict::Pass);
        if stale {
            problems.push(format!(
                "KNOWN_SOFT_BUGS entry '{}' now passes: remove it from conformance/src/divergence.rs",
                bug.case
            ));
        }
    }
    problems
}

/// Fails the test on failed cases, then on any difference from the
/// committed expectation of the run's backend and device.
fn check_against_expectation(report: &Report) {
    let summary = report.summary();
    println!("{} (in {:.2} s)", summary.line(), report.duration.as_secs_f64());
    for c in report.cases.iter().filter(|c| c.verdict == Verdict::KnownDivergence) {
        println!("known divergence {}: {}", c.id, c.detail);
    }
    let problems = problems_of(report);
    assert!(
        problems.is_empty(),
        "{} problem(s) ({}):\n{}",
        problems.len(),
        summary.line(),
        problems.join("\n")
    );
    let path = expectation::dir().join(expectation::file_name(report.backend, &report.device_a));
    match expectation::check_or_write(report, &path) {
        Ok(line) => println!("{line}"),
        Err(diff) => panic!("{diff}"),
    }
}

#[test]
fn soft_provider_matches_its_conformance_expectation() {
    let target = Target::soft_default().expect("embedded soft devices");
    let report = runner::run(&target, cases::all(), &RunOptions::default(), &mut |_| {}).expect("run the suite");
    assert_eq!(report.backend, BackendKind::Soft);
    check_against_expectation(&report);
}

/// The suite on a hardware device, compared with
/// `conformance/expected/hw-<driver>.txt`. The device is
/// `SOFTVERBS_CONFORMANCE_HW_DEVICE` or the first one listed (both sides on
/// it); without a device the test prints a SKIP line and passes.
#[cfg(feature = "hardware")]
#[test]
fn hardware_device_matches_its_conformance_expectation() {
    let devices = match softverbs::verbs::devices(Some(BackendKind::Hardware)) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIP: no hardware RDMA device to run the conformance suite on ({e})");
            return;
        }
    };
    let wanted = std::env::var("SOFTVERBS_CONFORMANCE_HW_DEVICE").ok();
    let device = match &wanted {
        Some(name) => devices.into_iter().find(|d| d.name() == name.as_str()),
        None => devices.into_iter().next(),
    };
    let Some(device) = device else {
        match wanted {
            Some(name) => panic!("SOFTVERBS_CONFORMANCE_HW_DEVICE names {name}, which is not an RDMA device here"),
            None => {
                println!(
                    "SKIP: no hardware RDMA device to run the conformance suite on (none in /sys/class/infiniband)"
                );
                return;
            }
        }
    };
    let report = runner::run(
        &Target::single(device),
        cases::all(),
        &RunOptions::default(),
        &mut |_| {},
    )
    .expect("run the suite on the hardware device");
    check_against_expectation(&report);
}

#[test]
fn case_ids_are_unique_well_formed_and_documented() {
    let all = cases::all();
    assert!(all.len() >= 120, "only {} cases", all.len());
    let mut seen = HashSet::new();
    for c in &all {
        assert!(valid_id(&c.id), "malformed id {:?}", c.id);
        assert!(seen.insert(c.id.to_string()), "duplicate id {}", c.id);
        assert!(
            !c.description.is_empty() && !c.rule.is_empty(),
            "{} lacks a description or rule",
            c.id
        );
        assert!(!c.description.contains('\n'), "{}: the description is one line", c.id);
    }
    for d in KNOWN_DIVERGENCES.iter().chain(KNOWN_SOFT_BUGS) {
        let prefix = d.case.trim_end_matches('*');
        assert!(
            all.iter().any(|c| c.id.starts_with(prefix)),
            "divergence entry {} names no case",
            d.case
        );
    }
}

#[test]
fn every_area_is_covered() {
    let all = cases::all();
    for area in [
        "dev", "pd", "mr", "mw", "cq", "qp", "post", "data", "comp", "order", "err", "srq",
    ] {
        let n = all.iter().filter(|c| c.area() == area).count();
        assert!(n > 0, "no case in area {area}");
    }
    // Every state-table transition of every transport has a case.
    for t in ["rc", "uc", "ud"] {
        let n = all
            .iter()
            .filter(|c| c.id.starts_with(&format!("qp.state.{t}.")))
            .count();
        assert!(n >= 49, "{t}: only {n} state-table cases");
    }
}

#[test]
fn report_renders_as_table_json_and_junit() {
    let target = Target::soft_default().expect("embedded soft devices");
    let opts = RunOptions {
        filter: runner::Filter::new(Some("dev.query_port.active,mr.fast_reg.alloc_above_max_pages")),
        ..RunOptions::default()
    };
    let mut rows = Vec::new();
    let report = runner::run(&target, cases::all(), &opts, &mut |r| {
        rows.push(runner::table_row(r, 40))
    })
    .expect("run two cases");
    assert_eq!(report.cases.len(), 2);
    assert_eq!(rows.len(), 2);
    assert!(rows[0].starts_with("dev.query_port.active"), "{rows:?}");
    let json = report.to_json();
    assert!(json.contains("\"id\": \"dev.query_port.active\""), "{json}");
    assert!(json.contains("\"summary\": {\"passed\": "), "{json}");
    let xml = report.to_junit();
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(
        xml.contains("<testcase classname=\"conformance.dev\" name=\"dev.query_port.active\""),
        "{xml}"
    );
    assert!(report
        .summary()
        .line()
        .starts_with(&format!("{} passed, ", report.summary().passed)));
}
