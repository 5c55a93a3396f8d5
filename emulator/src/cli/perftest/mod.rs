//! perftest-compatible tools: `ib_write_bw`, `ib_write_lat`, `ib_read_bw`,
//! `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_bw` and
//! `ib_atomic_lat`, with perftest's flags, banner and result tables, over
//! any backend of the verbs API.
//!
//! Pieces:
//! - [`args`]: the command line (the flags, as clap parses them);
//! - [`params`]: the parameters a run resolves from it (perftest's defaults
//!   per test, checked combinations);
//! - [`resources`]: one end of a test (context, PD, CQs, QPs, one MR) and
//!   the address record the ends exchange ([`resources::Dest`]);
//! - [`bw`] and [`lat`]: the measuring loops, written as per-end state
//!   machines with a non-blocking `step`, so that both ends can share one
//!   thread (the soft provider's inline progress makes that the fastest
//!   arrangement on a small machine) or run in two processes;
//! - [`stats`]: perftest's arithmetic (peak and average bandwidth, median,
//!   percentiles, half round trips);
//! - [`report`]: the banner, the tables and the JSON file;
//! - [`exchange`]: the TCP exchange of QPN/PSN/GID/rkey/address between a
//!   `--server` and a `--client`, in perftest's key-message format;
//! - [`run`](mod@run): what `softverbs perf` does with all of it;
//! - [`scale`]: the many-QP scale test (`softverbs perf scale`).
//!
//! The `softverbs perf <test>` subcommand ([`perf`](super::perf)) is a thin
//! wrapper over [`run`](fn@run), so the tool, the tests and the criterion
//! benches of `softverbs-benches` share one implementation.
//!
//! # Examples
//!
//! A tiny RDMA write bandwidth run between the embedded soft devices:
//!
//! ```
//! use clap::Parser;
//! use softverbs_emulator::cli::perftest::{self, PerfArgs};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     perf: PerfArgs,
//! }
//!
//! softverbs::soft::embedded_default()?;
//! let cli = Cli::parse_from(["perf", "write_bw", "-s", "4096", "-n", "20"]);
//! let mut out = Vec::new();
//! perftest::run(&cli.perf, softverbs::verbs::BackendKind::Soft, &mut out)?;
//! let text = String::from_utf8(out)?;
//! assert!(text.contains("BW average[MB/sec]"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod args;
pub mod bw;
pub mod exchange;
pub mod lat;
pub mod params;
pub mod report;
pub mod resources;
pub mod run;
pub mod scale;
pub mod stats;

use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use args::{Mode, Params, PerfArgs, PerfTest};
pub use run::run;

/// A failed perf run.
#[derive(Debug)]
pub enum PerfError {
    /// A combination of flags the test does not support.
    Usage(String),
    /// What was asked for does not exist (yet): a link, a device.
    NotAvailable(String),
    /// A verbs call failed.
    Verbs {
        /// What was being done.
        context: String,
        /// The error.
        error: softverbs::verbs::Error,
    },
    /// The test itself failed: an error completion, a stall, a protocol
    /// error with the peer.
    Failed(String),
    /// An I/O error (output, the TCP exchange).
    Io(io::Error),
}

impl PerfError {
    /// A verbs failure while doing `context`.
    pub fn verbs(context: impl Into<String>, error: softverbs::verbs::Error) -> PerfError {
        PerfError::Verbs {
            context: context.into(),
            error,
        }
    }
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerfError::Usage(m) | PerfError::NotAvailable(m) | PerfError::Failed(m) => f.write_str(m),
            PerfError::Verbs { context, error } => write!(f, "{context}: {error}"),
            PerfError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PerfError {}

impl From<io::Error> for PerfError {
    fn from(e: io::Error) -> PerfError {
        PerfError::Io(e)
    }
}

/// Adds a context to a verbs result.
pub(crate) trait VerbsContext<T> {
    /// Maps the error to [`PerfError::Verbs`] with `what` as context.
    fn ctx(self, what: &str) -> Result<T, PerfError>;
}

impl<T> VerbsContext<T> for softverbs::verbs::Result<T> {
    fn ctx(self, what: &str) -> Result<T, PerfError> {
        self.map_err(|e| PerfError::verbs(what, e))
    }
}

impl<T> VerbsContext<T> for Result<T, softverbs::verbs::PostError> {
    fn ctx(self, what: &str) -> Result<T, PerfError> {
        self.map_err(|e| PerfError::verbs(format!("{what} (WR #{})", e.index), e.error))
    }
}

/// Nanoseconds since the start of a run: the one clock every timestamp of
/// a run is taken from.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock {
            epoch: softverbs::soft::engine::process_now(),
        }
    }

    /// Nanoseconds since the clock started: the engine's clock (the TSC
    /// through `quanta`, a few ns; `Instant` costs a vDSO call).
    #[inline]
    pub fn now(&self) -> u64 {
        softverbs::soft::engine::process_now().saturating_sub(self.epoch)
    }
}

/// What one `step` of an end achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// The end has finished its part of the test.
    pub done: bool,
    /// Something happened (a post, a completion): the stall watchdog
    /// restarts.
    pub progressed: bool,
}

/// One end's measuring loop as a state machine.
pub trait Agent {
    /// Does a bounded amount of work without blocking (except on a
    /// completion channel with `-e`, for at most a millisecond).
    ///
    /// # Errors
    ///
    /// A failed post or poll, or an error completion.
    fn step(&mut self, clock: &Clock) -> Result<Step, PerfError>;

    /// Fraction of the work done, for the progress indicator.
    fn progress(&self) -> f64;
}

/// How long the loops wait without any progress before giving up.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs agents in turn in this thread until every one is done.
///
/// # Errors
///
/// The first agent error, or [`PerfError::Failed`] when nothing progressed
/// for [`STALL_TIMEOUT`].
pub fn drive(agents: &mut [&mut dyn Agent], clock: &Clock, progress: &mut Progress) -> Result<(), PerfError> {
    let mut done = vec![false; agents.len()];
    let mut last_progress = clock.now();
    let mut next_update = last_progress + PROGRESS_EVERY_NS;
    let mut spins: u32 = 0;
    loop {
        let mut any = false;
        for (i, a) in agents.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let s = a.step(clock)?;
            done[i] = s.done;
            any |= s.progressed;
        }
        if done.iter().all(|d| *d) {
            return Ok(());
        }
        spins = spins.wrapping_add(1);
        // The clock is read on progress (the step read it anyway) and
        // every 64 idle turns: enough for the stall check and for the
        // progress indicator, which is fed every 100 ms of run time
        // however long a step takes (a debug build, a busy machine).
        if any || spins.is_multiple_of(64) {
            let now = clock.now();
            if any {
                last_progress = now;
            } else if now - last_progress > STALL_TIMEOUT.as_nanos() as u64 {
                return Err(PerfError::Failed(format!(
                    "no progress for {} s (a lost completion or a peer that stopped)",
                    STALL_TIMEOUT.as_secs()
                )));
            }
            if now >= next_update {
                next_update = now + PROGRESS_EVERY_NS;
                let f = agents.iter().map(|a| a.progress()).fold(1.0, f64::min);
                progress.update(f);
            }
        }
    }
}

/// How often [`drive`] feeds the progress indicator, in ns of run time.
const PROGRESS_EVERY_NS: u64 = 100_000_000;

/// Whether progress indicators are off (`--quiet`): process-wide, set
/// once by the command line.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Turns every [`Progress`] created afterwards off (`quiet`) or on.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether progress indicators are off.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// On a terminal: how long a run goes before the indicator shows, and how
/// often it is redrawn in place.
const TTY_DELAY: Duration = Duration::from_millis(500);
const TTY_EVERY: Duration = Duration::from_millis(100);
/// Elsewhere (a log, a pipe): how long a run goes before its first line,
/// and the time between lines.
const LINE_DELAY: Duration = Duration::from_secs(3);
const LINE_EVERY: Duration = Duration::from_secs(5);

/// How a [`Progress`] shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Never.
    Off,
    /// One line redrawn in place (standard error is a terminal).
    Redraw,
    /// A new line every few seconds (a log or a pipe).
    Lines,
}

/// A progress indicator on standard error for long runs: on a terminal a
/// line redrawn in place once the run has lasted half a second; otherwise
/// a line every 5 s once it has lasted 3 s, so that a log shows that a
/// long run is alive. Off with [`set_quiet`].
#[derive(Debug)]
pub struct Progress {
    label: String,
    style: Style,
    start: Instant,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    /// An indicator for `label`, in the style standard error calls for.
    pub fn new(label: impl Into<String>) -> Progress {
        let style = if quiet() {
            Style::Off
        } else if io::stderr().is_terminal() {
            Style::Redraw
        } else {
            Style::Lines
        };
        Progress {
            label: label.into(),
            style,
            start: Instant::now(),
            last: None,
            shown: false,
        }
    }

    /// An indicator that never prints.
    pub fn hidden() -> Progress {
        let mut p = Progress::new("");
        p.style = Style::Off;
        p
    }

    /// Restarts for a new label (a new message size).
    pub fn restart(&mut self, label: impl Into<String>) {
        self.clear();
        self.label = label.into();
        self.start = Instant::now();
        self.last = None;
    }

    /// The line to print for `fraction` done, or `None` when nothing is
    /// due at `elapsed` since the start (the last line was printed
    /// `since_last` ago).
    fn due(&self, fraction: f64, elapsed: Duration, since_last: Option<Duration>) -> Option<String> {
        let (delay, every) = match self.style {
            Style::Off => return None,
            Style::Redraw => (TTY_DELAY, TTY_EVERY),
            Style::Lines => (LINE_DELAY, LINE_EVERY),
        };
        if elapsed < delay || since_last.is_some_and(|t| t < every) {
            return None;
        }
        let pct = (fraction.clamp(0.0, 1.0) * 100.0) as u32;
        let secs = elapsed.as_secs_f64();
        Some(match self.style {
            Style::Redraw => format!("\r {} {pct:3}% ({secs:.1} s)\x1b[K", self.label),
            _ => format!("softverbs: {} {pct}% ({secs:.0} s)\n", self.label),
        })
    }

    /// Reports `fraction` (0..=1) done.
    pub fn update(&mut self, fraction: f64) {
        let Some(line) = self.due(fraction, self.start.elapsed(), self.last.map(|t| t.elapsed())) else {
            return;
        };
        self.last = Some(Instant::now());
        let _ = io::stderr().lock().write_all(line.as_bytes());
        self.shown = self.style == Style::Redraw;
    }

    /// Erases the indicator's line (on a terminal).
    pub fn clear(&mut self) {
        if self.shown {
            let _ = write!(io::stderr().lock(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(style: Style) -> Progress {
        let mut p = Progress::new("write_bw 65536 B");
        p.style = style;
        p
    }

    #[test]
    fn lines_every_few_seconds_when_not_a_terminal() {
        let p = progress(Style::Lines);
        let s = Duration::from_secs;
        assert_eq!(p.due(0.1, s(1), None), None, "not before 3 s");
        assert_eq!(
            p.due(0.42, s(3), None).as_deref(),
            Some("softverbs: write_bw 65536 B 42% (3 s)\n")
        );
        assert_eq!(p.due(0.5, s(6), Some(s(3))), None, "5 s between lines");
        assert!(p.due(0.9, s(9), Some(s(5))).is_some());
    }

    #[test]
    fn a_terminal_redraws_one_line() {
        let p = progress(Style::Redraw);
        let line = p.due(0.5, Duration::from_secs(1), None).expect("due");
        assert!(line.starts_with('\r') && line.ends_with("\x1b[K"), "{line:?}");
        assert_eq!(p.due(0.5, Duration::from_millis(100), None), None);
    }

    #[test]
    fn quiet_and_hidden_print_nothing() {
        assert_eq!(progress(Style::Off).due(0.5, Duration::from_secs(60), None), None);
        assert_eq!(Progress::hidden().due(0.5, Duration::from_secs(60), None), None);
    }
}
