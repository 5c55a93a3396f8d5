//! Soft device counters for the operator of a `pingpong` or `perf` run:
//! what was dropped and refused (malformed packets, bad ICRCs, unknown
//! QPs, bad rkeys, refused peers: [`softverbs::soft::DROP_COUNTERS`]) is
//! said on standard error at the end of every run that dropped something;
//! `--stats` prints every counter that moved at the end; and `SIGUSR1`
//! (`kill -USR1 <pid>`, as with `dd`) prints them to standard error while
//! the run goes on.
//!
//! The signal is blocked in the thread that calls [`OnSignal::start`]
//! (and so in every thread it starts afterwards: the devices' progress
//! threads) and taken by a thread of its own with `sigtimedwait`, so no
//! system call of the data path is interrupted; a flag-setting handler
//! catches it should the kernel hand it to a thread started earlier.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softverbs::soft::SoftDevice;
use softverbs::verbs::{self, BackendKind};

use super::eprintln_safe;

/// The soft devices of this process.
fn soft_devices() -> Vec<verbs::Device> {
    verbs::devices(Some(BackendKind::Soft)).unwrap_or_default()
}

/// `  name: value` lines for the counters of `d` that are not zero.
pub fn counter_lines(d: &SoftDevice) -> String {
    let mut s = String::new();
    for (k, v) in d.counters() {
        if v != 0 {
            let _ = writeln!(s, "  {k}: {v}");
        }
    }
    s
}

/// One line naming what `d` dropped or refused (`name=value` for each
/// drop counter that is not zero), or `None` if nothing.
pub fn drop_line(d: &SoftDevice) -> Option<String> {
    let drops: Vec<String> = d
        .drop_counters()
        .into_iter()
        .filter(|&(_, v)| v != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (!drops.is_empty()).then(|| format!("{} dropped: {}", d.name(), drops.join(" ")))
}

/// Says on standard error, as `prog: <device> dropped: …`, what each soft
/// device of this process dropped, if anything.
pub fn report_drops(prog: &str) {
    for dev in soft_devices() {
        if let Some(l) = SoftDevice::of(&dev).and_then(drop_line) {
            eprintln_safe(&format!("{prog}: {l}"));
        }
    }
}

/// `counters of <device>:` and its counter lines, for every soft device of
/// this process with a counter that is not zero.
pub fn all_counters() -> String {
    let mut s = String::new();
    for dev in soft_devices() {
        if let Some(d) = SoftDevice::of(&dev) {
            let lines = counter_lines(d);
            if !lines.is_empty() {
                let _ = write!(s, "counters of {}:\n{lines}", d.name());
            }
        }
    }
    s
}

/// While alive, `SIGUSR1` prints [`all_counters`] to standard error.
#[derive(Debug)]
pub struct OnSignal {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OnSignal {
    /// Starts listening for `SIGUSR1` (see the module docs); `prog` heads
    /// what is printed. Without Linux, nothing.
    pub fn start(prog: &'static str) -> OnSignal {
        let stop = Arc::new(AtomicBool::new(false));
        #[cfg(target_os = "linux")]
        let thread = signal::start(prog, Arc::clone(&stop));
        #[cfg(not(target_os = "linux"))]
        let thread = {
            let _ = prog;
            None
        };
        OnSignal { stop, thread }
    }
}

impl Drop for OnSignal {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(target_os = "linux")]
mod signal {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Set by the handler, for a signal delivered to a thread that does
    /// not block it.
    static CAUGHT: AtomicBool = AtomicBool::new(false);

    extern "C" fn caught(_: libc::c_int) {
        CAUGHT.store(true, Ordering::Relaxed);
    }

    fn usr1_set() -> libc::sigset_t {
        // SAFETY: sigemptyset initializes the set it is given; SIGUSR1 is
        // a valid signal.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            set
        }
    }

    pub(super) fn start(prog: &'static str, stop: Arc<AtomicBool>) -> Option<std::thread::JoinHandle<()>> {
        let set = usr1_set();
        // SAFETY: a zeroed sigaction with a plain handler (no SA_SIGINFO),
        // SA_RESTART so that interrupted calls resume, an empty mask; the
        // handler only stores to an atomic (async-signal-safe). Then
        // SIGUSR1 is blocked in this thread (inherited by the threads it
        // starts), so that the waiter below takes it.
        let ok = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = caught as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) == 0
                && libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == 0
        };
        if !ok {
            return None;
        }
        std::thread::Builder::new()
            .name("stats-on-usr1".into())
            .spawn(move || {
                let tick = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: `set` and `tick` are valid for the call; a
                    // null siginfo is allowed.
                    let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &tick) };
                    if sig == libc::SIGUSR1 || CAUGHT.swap(false, Ordering::Relaxed) {
                        let s = super::all_counters();
                        let body = if s.is_empty() {
                            "no counter moved yet\n".to_string()
                        } else {
                            s
                        };
                        let _ = std::io::Write::write_all(
                            &mut std::io::stderr().lock(),
                            format!("{prog}: {body}").as_bytes(),
                        );
                    }
                }
            })
            .ok()
    }
}
