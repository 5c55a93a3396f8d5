//! The runner: selects cases, runs each against a backend with fresh
//! contexts, classifies the outcome, and renders the report (text table,
//! JSON, JUnit XML).
//!
//! Each case runs on its own thread with a deadline, and a panic inside a
//! case is caught: a misbehaving device or case is reported as a failure of
//! that case and the run goes on.

use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use softverbs::verbs::{BackendKind, Device};

use crate::case::{Caps, Case, Env, Stop};
use crate::divergence;

/// The devices a run uses: side A and side B (the same device when only one
/// is available).
#[derive(Clone)]
pub struct Target {
    /// Backend under test.
    pub backend: BackendKind,
    /// Side A's device.
    pub a: Device,
    /// Side B's device.
    pub b: Device,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("backend", &self.backend)
            .field("a", &self.a.name())
            .field("b", &self.b.name())
            .finish()
    }
}

impl Target {
    /// The soft provider's embedded default pair (`softverbs_0`,
    /// `softverbs_1`), created on first use.
    ///
    /// # Errors
    ///
    /// The error of creating the embedded devices.
    pub fn soft_default() -> softverbs::verbs::Result<Target> {
        let devs = softverbs::soft::embedded_default()?;
        Ok(Target {
            backend: BackendKind::Soft,
            a: devs[0].device(),
            b: devs[1].device(),
        })
    }

    /// Both sides on one device.
    pub fn single(device: Device) -> Target {
        Target {
            backend: device.backend(),
            a: device.clone(),
            b: device,
        }
    }
}

/// Which cases to run: `--filter` patterns. A pattern with `*` or `?` is a
/// glob over the whole id; any other pattern matches ids that contain it.
/// Several comma-separated patterns select the union.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    patterns: Vec<String>,
}

impl Filter {
    /// A filter from `--filter`'s value (`None` or empty: every case).
    pub fn new(spec: Option<&str>) -> Filter {
        let patterns = spec
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        Filter { patterns }
    }

    /// Whether the case id is selected.
    pub fn matches(&self, id: &str) -> bool {
        self.patterns.is_empty()
            || self.patterns.iter().any(|p| match p.contains(['*', '?']) {
                true => glob(p.as_bytes(), id.as_bytes()),
                false => id.contains(p.as_str()),
            })
    }
}

/// `*` (any run) and `?` (any one byte) glob matching.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The device follows the rule.
    Pass,
    /// The device departs from the rule (or the case could not run).
    Fail,
    /// Not applicable to this device or backend.
    Skip,
    /// Failed, and listed as a known divergence of this device.
    KnownDivergence,
}

impl Verdict {
    /// Upper-case name for the table.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
            Verdict::KnownDivergence => "KNOWN",
        }
    }

    /// Lower-case name for JSON.
    pub fn json_name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Skip => "skip",
            Verdict::KnownDivergence => "known_divergence",
        }
    }
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// The case id.
    pub id: String,
    /// What the case checks.
    pub description: String,
    /// The rule.
    pub rule: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Failure detail, skip reason, or divergence reason (empty on pass).
    pub detail: String,
    /// Wall time of the case (contexts included).
    pub duration: Duration,
}

/// Counts per verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Passed.
    pub passed: usize,
    /// Failed.
    pub failed: usize,
    /// Skipped (not applicable).
    pub skipped: usize,
    /// Known divergences.
    pub known: usize,
}

impl Summary {
    /// `N passed, N failed, N skipped, N known divergence`.
    pub fn line(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped, {} known divergence",
            self.passed, self.failed, self.skipped, self.known
        )
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Backend under test.
    pub backend: BackendKind,
    /// Side A's device.
    pub device_a: String,
    /// Side B's device.
    pub device_b: String,
    /// Per-case outcomes, in run order.
    pub cases: Vec<CaseReport>,
    /// Wall time of the whole run.
    pub duration: Duration,
}

/// Options of a run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Cases to run.
    pub filter: Filter,
    /// A case running longer than this is abandoned and failed.
    pub case_timeout: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            filter: Filter::default(),
            case_timeout: Duration::from_secs(60),
        }
    }
}

/// Runs the selected `cases` on `target`, calling `progress` after each.
///
/// # Errors
///
/// The verbs error when the devices cannot be opened or queried at all
/// (before any case runs).
pub fn run(
    target: &Target,
    cases: Vec<Case>,
    opts: &RunOptions,
    progress: &mut dyn FnMut(&CaseReport),
) -> softverbs::verbs::Result<Report> {
    let start = Instant::now();
    let caps = Arc::new(Caps::probe(&target.a.open()?)?);
    let mut reports = Vec::new();
    for case in cases.into_iter().filter(|c| opts.filter.matches(&c.id)) {
        let r = run_one(target, &caps, Arc::new(case), opts.case_timeout);
        progress(&r);
        reports.push(r);
    }
    Ok(Report {
        backend: target.backend,
        device_a: target.a.name().to_string(),
        device_b: target.b.name().to_string(),
        cases: reports,
        duration: start.elapsed(),
    })
}

fn run_one(target: &Target, caps: &Arc<Caps>, case: Arc<Case>, timeout: Duration) -> CaseReport {
    let start = Instant::now();
    let mut report = CaseReport {
        id: case.id.to_string(),
        description: case.description.to_string(),
        rule: case.rule.to_string(),
        verdict: Verdict::Pass,
        detail: String::new(),
        duration: Duration::ZERO,
    };
    let outcome = match case.not_applicable(caps) {
        Some(why) => Err(Stop::Skip(why)),
        None => execute(target, caps, case.clone(), timeout),
    };
    match outcome {
        Ok(()) => {}
        Err(Stop::Skip(why)) => (report.verdict, report.detail) = (Verdict::Skip, why),
        Err(Stop::Fail(why)) => {
            let known = divergence::lookup(target.backend, target.a.name(), &case.id)
                .or_else(|| divergence::lookup(target.backend, target.b.name(), &case.id));
            match known {
                Some(d) => {
                    report.verdict = Verdict::KnownDivergence;
                    report.detail = format!("{} [observed: {why}]", d.reason);
                }
                None => (report.verdict, report.detail) = (Verdict::Fail, why),
            }
        }
    }
    report.duration = start.elapsed();
    report
}

/// Opens fresh contexts and runs the case body on its own thread, with a
/// deadline and panic capture.
fn execute(target: &Target, caps: &Arc<Caps>, case: Arc<Case>, timeout: Duration) -> Result<(), Stop> {
    let open = |d: &Device| d.open().map_err(|e| Stop::Fail(format!("opening {}: {e}", d.name())));
    let env = Env {
        a: open(&target.a)?,
        b: open(&target.b)?,
        caps: caps.clone(),
        backend: target.backend,
        device_a: target.a.name().to_string(),
        device_b: target.b.name().to_string(),
        dev_a: target.a.clone(),
        dev_b: target.b.clone(),
    };
    let (tx, rx) = mpsc::channel();
    let name = format!("case {}", case.id);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(|| (case.run)(&env)));
        let r = r.unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(Stop::Fail(format!("the case panicked: {msg}")))
        });
        let _ = tx.send(r);
    });
    let handle = spawned.map_err(|e| Stop::Fail(format!("cannot spawn the case thread: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(r) => {
            let _ = handle.join();
            r
        }
        // The thread is abandoned: it holds only its own objects.
        Err(_) => Err(Stop::Fail(format!(
            "the case did not finish within {} s (abandoned)",
            timeout.as_secs()
        ))),
    }
}

impl Report {
    /// Counts per verdict.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for c in &self.cases {
            match c.verdict {
                Verdict::Pass => s.passed += 1,
                Verdict::Fail => s.failed += 1,
                Verdict::Skip => s.skipped += 1,
                Verdict::KnownDivergence => s.known += 1,
            }
        }
        s
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| c.verdict == Verdict::Fail)
    }

    /// The report as JSON (one object; `cases` in run order).
    pub fn to_json(&self) -> String {
        let s = self.summary();
        let mut out = String::new();
        let _ = writeln!(out, "{{");
        let _ = writeln!(out, "  \"backend\": {},", json_str(self.backend.name()));
        let _ = writeln!(out, "  \"device_a\": {},", json_str(&self.device_a));
        let _ = writeln!(out, "  \"device_b\": {},", json_str(&self.device_b));
        let _ = writeln!(out, "  \"duration_ms\": {:.3},", ms(self.duration));
        let _ = writeln!(
            out,
            "  \"summary\": {{\"passed\": {}, \"failed\": {}, \"skipped\": {}, \"known_divergence\": {}}},",
            s.passed, s.failed, s.skipped, s.known
        );
        let _ = writeln!(out, "  \"cases\": [");
        for (i, c) in self.cases.iter().enumerate() {
            let comma = if i + 1 < self.cases.len() { "," } else { "" };
            let _ = writeln!(
                out,
                "    {{\"id\": {}, \"result\": {}, \"time_ms\": {:.3}, \"detail\": {}, \"rule\": {}, \"description\": {}}}{comma}",
                json_str(&c.id),
                json_str(c.verdict.json_name()),
                ms(c.duration),
                json_str(&c.detail),
                json_str(&c.rule),
                json_str(&c.description),
            );
        }
        let _ = writeln!(out, "  ]");
        let _ = writeln!(out, "}}");
        out
    }

    /// The report as JUnit XML: one `testsuite` per area, failures as
    /// `<failure>`, skips and known divergences as `<skipped>`.
    pub fn to_junit(&self) -> String {
        let s = self.summary();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites name=\"softverbs conformance ({} {}/{})\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            self.backend,
            xml(&self.device_a),
            xml(&self.device_b),
            self.cases.len(),
            s.failed,
            s.skipped + s.known,
            self.duration.as_secs_f64()
        );
        let mut areas: Vec<&str> = Vec::new();
        for c in &self.cases {
            let area = c.id.split('.').next().unwrap_or("");
            if !areas.contains(&area) {
                areas.push(area);
            }
        }
        for area in areas {
            let cases: Vec<&CaseReport> = self
                .cases
                .iter()
                .filter(|c| c.id.split('.').next() == Some(area))
                .collect();
            let count = |v: Verdict| cases.iter().filter(|c| c.verdict == v).count();
            let time: f64 = cases.iter().map(|c| c.duration.as_secs_f64()).sum();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{time:.3}\">",
                xml(area),
                cases.len(),
                count(Verdict::Fail),
                count(Verdict::Skip) + count(Verdict::KnownDivergence)
            );
            for c in cases {
                let _ = write!(
                    out,
                    "    <testcase classname=\"conformance.{}\" name=\"{}\" time=\"{:.6}\"",
                    xml(area),
                    xml(&c.id),
                    c.duration.as_secs_f64()
                );
                match c.verdict {
                    Verdict::Pass => out.push_str("/>\n"),
                    Verdict::Fail => {
                        let _ = writeln!(
                            out,
                            ">\n      <failure message=\"{}\">{} ({})</failure>\n    </testcase>",
                            xml(&c.detail),
                            xml(&c.description),
                            xml(&c.rule)
                        );
                    }
                    Verdict::Skip => {
                        let _ = writeln!(
                            out,
                            ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                            xml(&c.detail)
                        );
                    }
                    Verdict::KnownDivergence => {
                        let _ = writeln!(
                            out,
                            ">\n      <skipped message=\"known divergence: {}\"/>\n    </testcase>",
                            xml(&c.detail)
                        );
                    }
                }
            }
            let _ = writeln!(out, "  </testsuite>");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// XML attribute/text escaping.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// One row of the text table: id, result, time, detail.
pub fn table_row(r: &CaseReport, id_width: usize) -> String {
    let time = format!("{:.1}ms", ms(r.duration));
    let mut row = format!("{:<id_width$}  {:<5}  {:>9}", r.id, r.verdict.name(), time);
    if !r.detail.is_empty() {
        row.push_str("  ");
        row.push_str(&r.detail);
    }
    row
}

/// The table header matching [`table_row`].
pub fn table_header(id_width: usize) -> String {
    format!("{:<id_width$}  {:<5}  {:>9}  detail", "case", "result", "time")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        let f = Filter::new(Some("qp.state.rc.*,err.ud"));
        assert!(f.matches("qp.state.rc.init_to_rtr.missing_av"));
        assert!(!f.matches("qp.state.uc.init_to_rtr.missing_av"));
        assert!(f.matches("err.ud.no_recv_dropped"));
        assert!(Filter::new(None).matches("anything"));
        assert!(Filter::new(Some("*.missing_?v")).matches("qp.state.rc.init_to_rtr.missing_av"));
        assert!(!Filter::new(Some("qp.*.rts")).matches("qp.state.rc.init_to_rtr.missing_av"));
        assert!(Filter::new(Some("dev")).matches("dev.query_port.active"));
    }

    #[test]
    fn escaping() {
        assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(xml("<a & 'b'>"), "&lt;a &amp; &apos;b&apos;&gt;");
    }

    #[test]
    fn summary_line_shape() {
        let s = Summary {
            passed: 3,
            failed: 1,
            skipped: 2,
            known: 0,
        };
        assert_eq!(s.line(), "3 passed, 1 failed, 2 skipped, 0 known divergence");
    }
}
