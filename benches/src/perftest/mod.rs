//! perftest-compatible tools: `ib_write_bw`, `ib_write_lat`, `ib_read_bw`,
//! `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_bw` and
//! `ib_atomic_lat`, with perftest's flags, banner and result tables, over
//! any backend of the verbs API.
//!
//! Pieces:
//! - [`args`]: the command line and the parameters a run resolves from it;
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
//! - [`run`](mod@run): what `softverbs perf` does with all of it.

pub mod args;
pub mod bw;
pub mod exchange;
pub mod lat;
pub mod report;
pub mod resources;
pub mod run;
pub mod stats;

use std::fmt;
use std::io::{self, IsTerminal, Write};
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
        if any || spins.is_multiple_of(1024) {
            let now = clock.now();
            if any {
                last_progress = now;
            } else if now - last_progress > STALL_TIMEOUT.as_nanos() as u64 {
                return Err(PerfError::Failed(format!(
                    "no progress for {} s (a lost completion or a peer that stopped)",
                    STALL_TIMEOUT.as_secs()
                )));
            }
            if spins.is_multiple_of(1024) {
                let f = agents.iter().map(|a| a.progress()).fold(1.0, f64::min);
                progress.update(f);
            }
        }
    }
}

/// A progress indicator on standard error for long runs, shown only when
/// standard error is a terminal and the run has lasted half a second.
#[derive(Debug)]
pub struct Progress {
    label: String,
    enabled: bool,
    start: Instant,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    /// An indicator for `label`, enabled when standard error is a terminal.
    pub fn new(label: impl Into<String>) -> Progress {
        Progress {
            label: label.into(),
            enabled: io::stderr().is_terminal(),
            start: Instant::now(),
            last: None,
            shown: false,
        }
    }

    /// An indicator that never prints.
    pub fn hidden() -> Progress {
        let mut p = Progress::new("");
        p.enabled = false;
        p
    }

    /// Restarts for a new label (a new message size).
    pub fn restart(&mut self, label: impl Into<String>) {
        self.clear();
        self.label = label.into();
        self.start = Instant::now();
        self.last = None;
    }

    /// Reports `fraction` (0..=1) done.
    pub fn update(&mut self, fraction: f64) {
        if !self.enabled || self.start.elapsed() < Duration::from_millis(500) {
            return;
        }
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.last = Some(Instant::now());
        let pct = (fraction.clamp(0.0, 1.0) * 100.0) as u32;
        let _ = write!(
            io::stderr().lock(),
            "\r {} {:3}% ({:.1} s)\x1b[K",
            self.label,
            pct,
            self.start.elapsed().as_secs_f64()
        );
        self.shown = true;
    }

    /// Erases the indicator's line.
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
