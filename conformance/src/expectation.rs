//! Committed expectations: what every case does on a backend (pass, skip
//! with which reason, or which known divergence), so that a case that moves
//! from pass to skip, a skip whose reason changes, or a new case nobody
//! looked at fails the suite's own test with a diff, instead of passing as
//! long as nothing fails.
//!
//! # The file
//!
//! One line per case, sorted by id; `#` starts a comment line:
//!
//! ```text
//! dev.query_port.active pass
//! qp.state.rc.sqe_to_err.required skip: an RC QP never enters SQE (…)
//! cq.overflow.poll_fails divergence: mlx5_ cq.overflow.poll_fails
//! ```
//!
//! - `pass`: the case passes;
//! - `skip: <reason>`: the case is skipped with exactly this reason;
//! - `divergence: <device prefix> <case pattern>`: the case fails and the
//!   [`crate::divergence`] entry with that device prefix and case pattern
//!   covers it.
//!
//! A failed case is never expected: failures fail the run on their own.
//!
//! # Where the files are
//!
//! `conformance/expected/soft.txt` for the soft provider (the embedded
//! pair), `conformance/expected/hw-<driver>.txt` for a hardware device,
//! `<driver>` being the device name without its trailing instance number
//! (`mlx5` for `mlx5_0`, `rxe` for `rxe0`): see [`file_name`].
//!
//! # Regenerating
//!
//! Set [`WRITE_ENV`] (`SOFTVERBS_CONFORMANCE_WRITE=1`) when running the
//! suite's test: it writes the file from the run instead of comparing
//! (a run with failures writes nothing). Review the diff (`git diff
//! conformance/expected/`) and commit it with the change that moved the
//! cases.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use softverbs::verbs::BackendKind;

use crate::divergence;
use crate::runner::{Report, Verdict};

/// The environment variable that makes the suite's test write the
/// expectation file instead of comparing against it.
pub const WRITE_ENV: &str = "SOFTVERBS_CONFORMANCE_WRITE";

/// What a case is expected to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It passes.
    Pass,
    /// It is skipped with this reason.
    Skip(String),
    /// It fails, covered by the known divergence `<device prefix> <case
    /// pattern>`.
    Divergence(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Pass => f.write_str("pass"),
            Outcome::Skip(why) => write!(f, "skip: {why}"),
            Outcome::Divergence(entry) => write!(f, "divergence: {entry}"),
        }
    }
}

/// Every case's expected outcome, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectation {
    /// Outcome per case id.
    pub cases: BTreeMap<String, Outcome>,
}

/// The file name of the expectation of `backend` on device `device`:
/// `soft.txt`, or `hw-<driver>.txt` with the device name's instance
/// number (trailing digits, and the `_` before them) removed (`mlx5_0` →
/// `hw-mlx5.txt`, `rxe0` → `hw-rxe.txt`).
pub fn file_name(backend: BackendKind, device: &str) -> String {
    match backend {
        BackendKind::Soft => "soft.txt".to_string(),
        BackendKind::Hardware => {
            // The instance number, then the one separator before it
            // (`mlx5_0` → `mlx5`, `hfi1_0` → `hfi1`).
            let driver = device.trim_end_matches(|c: char| c.is_ascii_digit());
            let driver = driver.strip_suffix('_').unwrap_or(driver);
            let driver = if driver.is_empty() { device } else { driver };
            format!("hw-{driver}.txt")
        }
    }
}

/// The directory of the committed expectation files
/// (`conformance/expected`).
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("expected")
}

/// A reason as one line of the file (line breaks become spaces, no
/// trailing blanks, which the parser would not keep).
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ").trim_end().to_string()
}

impl Expectation {
    /// What `report` did, as an expectation.
    ///
    /// # Errors
    ///
    /// The ids of the failed cases: a failure is never an expectation.
    pub fn from_report(report: &Report) -> Result<Expectation, String> {
        let mut cases = BTreeMap::new();
        let mut failed = Vec::new();
        for c in &report.cases {
            let outcome = match c.verdict {
                Verdict::Pass => Outcome::Pass,
                Verdict::Skip => Outcome::Skip(one_line(&c.detail)),
                Verdict::KnownDivergence => {
                    let entry = divergence::lookup(report.backend, &report.device_a, &c.id)
                        .or_else(|| divergence::lookup(report.backend, &report.device_b, &c.id));
                    match entry {
                        Some(d) => Outcome::Divergence(format!("{} {}", d.device_prefix, d.case)),
                        None => Outcome::Divergence(format!("? {}", c.id)),
                    }
                }
                Verdict::Fail => {
                    failed.push(c.id.clone());
                    continue;
                }
            };
            cases.insert(c.id.clone(), outcome);
        }
        match failed.is_empty() {
            true => Ok(Expectation { cases }),
            false => Err(format!(
                "{} case(s) failed, which no expectation records: {}",
                failed.len(),
                failed.join(", ")
            )),
        }
    }

    /// Parses an expectation file.
    ///
    /// # Errors
    ///
    /// `line N: …` for a malformed line or a case listed twice.
    pub fn parse(text: &str) -> Result<Expectation, String> {
        let mut cases = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let (id, rest) = line
                .split_once(' ')
                .ok_or_else(|| format!("line {}: expected '<case id> <outcome>', got {line:?}", n + 1))?;
            let outcome = if rest == "pass" {
                Outcome::Pass
            } else if let Some(why) = rest.strip_prefix("skip: ") {
                Outcome::Skip(why.to_string())
            } else if let Some(entry) = rest.strip_prefix("divergence: ") {
                Outcome::Divergence(entry.to_string())
            } else {
                return Err(format!(
                    "line {}: outcome of {id} must be 'pass', 'skip: <reason>' or 'divergence: <entry>', got {rest:?}",
                    n + 1
                ));
            };
            if cases.insert(id.to_string(), outcome).is_some() {
                return Err(format!("line {}: {id} is listed twice", n + 1));
            }
        }
        Ok(Expectation { cases })
    }

    /// The file text: a comment header (`header` lines, then how to
    /// regenerate), then one line per case sorted by id.
    pub fn render(&self, header: &str) -> String {
        let mut out = String::new();
        for l in header.lines() {
            let _ = writeln!(out, "# {l}");
        }
        let _ = writeln!(
            out,
            "# One line per case: '<id> pass', '<id> skip: <reason>' or '<id> divergence: <device prefix> <case pattern>'."
        );
        let _ = writeln!(
            out,
            "# Regenerate: {WRITE_ENV}=1 cargo test -p softverbs-conformance --test suite (see conformance/README.md)."
        );
        for (id, outcome) in &self.cases {
            let _ = writeln!(out, "{id} {outcome}");
        }
        out
    }

    /// How `actual` departs from this expectation, one line per case
    /// (sorted by id); empty when they agree.
    pub fn diff(&self, actual: &Expectation) -> Vec<String> {
        let mut out = Vec::new();
        let ids: std::collections::BTreeSet<&String> = self.cases.keys().chain(actual.cases.keys()).collect();
        for id in ids {
            match (self.cases.get(id), actual.cases.get(id)) {
                (Some(want), Some(got)) if want == got => {}
                (Some(want), Some(got)) => out.push(format!("{id}: expected {want}\n  {id}: got      {got}")),
                (None, Some(got)) => out.push(format!("{id}: new case, not in the expectation (got {got})")),
                (Some(want), None) => out.push(format!("{id}: expected {want}, but the case did not run")),
                (None, None) => {}
            }
        }
        out
    }
}

/// What the suite's test does with a run: compares it with the committed
/// expectation at `path`, or (with [`WRITE_ENV`] set) writes the file.
/// Returns a line saying what happened.
///
/// # Errors
///
/// A report for the test's failure: failed cases, a missing or malformed
/// file, or the diff with the expectation and how to accept it.
pub fn check_or_write(report: &Report, path: &Path) -> Result<String, String> {
    let actual = Expectation::from_report(report)?;
    let shown = path.display();
    if std::env::var_os(WRITE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        let header = format!(
            "Conformance expectation: backend {}, device {} (side B {}).",
            report.backend, report.device_a, report.device_b
        );
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(path, actual.render(&header)).map_err(|e| format!("writing {shown}: {e}"))?;
        return Ok(format!(
            "wrote {} case(s) to {shown} ({WRITE_ENV} is set)",
            actual.cases.len()
        ));
    }
    let regenerate = format!(
        "To accept this run as the new expectation (after checking every line above): \
         {WRITE_ENV}=1 cargo test -p softverbs-conformance --test suite, then commit {shown}."
    );
    let text = std::fs::read_to_string(path).map_err(|e| format!("no expectation at {shown} ({e}). {regenerate}"))?;
    let want = Expectation::parse(&text).map_err(|e| format!("{shown}: {e}"))?;
    let diff = want.diff(&actual);
    if diff.is_empty() {
        return Ok(format!("{} case(s) as expected by {shown}", actual.cases.len()));
    }
    Err(format!(
        "{} case(s) differ from the expectation {shown}:\n  {}\n{regenerate}",
        diff.len(),
        diff.join("\n  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(lines: &[(&str, Outcome)]) -> Expectation {
        Expectation {
            cases: lines.iter().map(|(id, o)| (id.to_string(), o.clone())).collect(),
        }
    }

    #[test]
    fn render_then_parse_round_trips() {
        let e = exp(&[
            ("a.b.c", Outcome::Pass),
            ("a.b.d", Outcome::Skip("needs fast_reg: no page list".into())),
            (
                "cq.overflow.poll_fails",
                Outcome::Divergence("mlx5_ cq.overflow.poll_fails".into()),
            ),
        ]);
        let text = e.render("header\nsecond line");
        assert!(text.starts_with("# header\n# second line\n"), "{text}");
        assert_eq!(Expectation::parse(&text).unwrap(), e);
    }

    #[test]
    fn parse_rejects_what_it_cannot_read() {
        assert!(Expectation::parse("a.b pass\na.b pass\n")
            .unwrap_err()
            .contains("twice"));
        assert!(Expectation::parse("a.b fail: x\n").unwrap_err().contains("line 1"));
        assert!(Expectation::parse("lonely\n").unwrap_err().contains("line 1"));
        assert!(Expectation::parse("# only\n\n").unwrap().cases.is_empty());
    }

    #[test]
    fn diff_names_moved_new_and_missing_cases() {
        let want = exp(&[
            ("a.moved", Outcome::Pass),
            ("a.same", Outcome::Pass),
            ("a.gone", Outcome::Pass),
            ("a.reason", Outcome::Skip("old".into())),
        ]);
        let got = exp(&[
            ("a.moved", Outcome::Skip("not supported by this backend".into())),
            ("a.same", Outcome::Pass),
            ("a.new", Outcome::Pass),
            ("a.reason", Outcome::Skip("new".into())),
        ]);
        let d = want.diff(&got);
        assert_eq!(d.len(), 4, "{d:?}");
        assert!(
            d[0].starts_with("a.gone: expected pass, but the case did not run"),
            "{d:?}"
        );
        assert!(
            d[1].contains("a.moved: expected pass") && d[1].contains("got      skip: not supported"),
            "{d:?}"
        );
        assert!(d[2].starts_with("a.new: new case"), "{d:?}");
        assert!(d[3].contains("skip: old") && d[3].contains("skip: new"), "{d:?}");
        assert!(want.diff(&want).is_empty());
    }

    #[test]
    fn file_names_per_backend_and_driver() {
        assert_eq!(file_name(BackendKind::Soft, "softverbs_0"), "soft.txt");
        assert_eq!(file_name(BackendKind::Hardware, "mlx5_0"), "hw-mlx5.txt");
        assert_eq!(file_name(BackendKind::Hardware, "rxe0"), "hw-rxe.txt");
        assert_eq!(file_name(BackendKind::Hardware, "siw_eth1"), "hw-siw_eth.txt");
        assert_eq!(file_name(BackendKind::Hardware, "hfi1_0"), "hw-hfi1.txt");
        assert_eq!(file_name(BackendKind::Hardware, "0"), "hw-0.txt");
    }
}
