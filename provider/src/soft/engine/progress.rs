//! The progress-thread mode of a device engine: one thread per device
//! that reads the link, runs timers and sends what the engine produced,
//! busy-polling for a configurable time after the last work and then
//! sleeping on a `mio` poller (the link's sockets, a waker, and the next
//! engine deadline).
//!
//! Hand-off with application threads (in [`DeviceShared::with_core`]): a
//! verb sends what it produced itself, whether the thread spins or sleeps
//! (a UC or UD send completes when its packet is built, so the packet must
//! have left when the application can poll the completion: one that exits
//! right after its last completion must not take its last datagram with
//! it). While the thread sleeps, the verb wakes it only if it armed an
//! earlier deadline than the one the thread sleeps towards (a new
//! retransmission timer). The thread announces sleep (`awake = false`)
//! before it takes the engine lock for its last look, and application
//! threads read `awake` under that lock, so no deadline is missed.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::DeviceShared;

/// How a device's engine makes progress. See the [engine
/// docs](super#engine-modes-and-when-to-use-which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineMode {
    /// No engine thread: posting and polling drive the engine (the
    /// default).
    #[default]
    Inline,
    /// One progress thread per device, busy-polling for `spin` after the
    /// last work, then sleeping until the link is readable, a deadline
    /// passes or an application thread wakes it.
    ProgressThread {
        /// How long to busy-poll after the last work before sleeping
        /// (`Duration::ZERO`: sleep at once).
        spin: Duration,
    },
}

impl EngineMode {
    /// A progress thread with the default spin time (50 µs: longer than a
    /// loopback round trip, so a ping-pong never sleeps, and short enough
    /// that an idle device costs nothing).
    pub const fn progress_thread() -> EngineMode {
        EngineMode::ProgressThread {
            spin: Duration::from_micros(50),
        }
    }
}

/// Datagrams the thread reads per turn (bounded work: timers and sends
/// get their turn between batches).
const TURN_BUDGET: usize = 64;
const WAKER: Token = Token(usize::MAX);
/// `armed` when the thread sleeps without a deadline.
const NO_DEADLINE: u64 = u64::MAX;

/// The state shared between a device and its progress thread.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    mode: OnceLock<EngineMode>,
    /// The thread is spinning (or working), not sleeping.
    pub(crate) awake: AtomicBool,
    /// The engine deadline the sleeping thread wakes up for.
    pub(crate) armed: AtomicU64,
    /// The engine's next deadline, refreshed at the end of every engine
    /// section (lets the spinning thread skip the lock when idle).
    pub(crate) deadline: AtomicU64,
    /// Shared with the thread, which keeps it registered with its poller
    /// for as long as it runs (see [`run`]).
    waker: OnceLock<Arc<Waker>>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Progress {
    pub(crate) fn new() -> Progress {
        Progress {
            armed: AtomicU64::new(NO_DEADLINE),
            deadline: AtomicU64::new(NO_DEADLINE),
            ..Progress::default()
        }
    }

    /// The mode (inline until [`DeviceShared::start`] set another).
    pub(crate) fn mode(&self) -> EngineMode {
        self.mode.get().copied().unwrap_or_default()
    }

    /// Whether a progress thread runs the engine.
    #[inline]
    pub(crate) fn threaded(&self) -> bool {
        matches!(self.mode.get(), Some(EngineMode::ProgressThread { .. }))
    }

    /// Records the engine's next deadline (call with the engine locked).
    #[inline]
    pub(crate) fn set_deadline(&self, d: Option<u64>) {
        self.deadline.store(d.unwrap_or(NO_DEADLINE), Ordering::Relaxed);
    }

    /// Wakes the thread if it sleeps towards a later deadline than `d`.
    pub(crate) fn wake_for(&self, d: Option<u64>) {
        if let Some(d) = d {
            if d < self.armed.load(Ordering::SeqCst) {
                self.wake();
            }
        }
    }

    pub(crate) fn wake(&self) {
        if let Some(w) = self.waker.get() {
            let _ = w.wake();
        }
    }

    /// Stops the thread (it exits at its next turn).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }
}

impl DeviceShared {
    /// Sets the engine mode; starts the progress thread for
    /// [`EngineMode::ProgressThread`]. Called once, right after creation.
    ///
    /// # Errors
    ///
    /// The error of creating the poller or spawning the thread.
    pub(crate) fn start(self: &Arc<Self>, mode: EngineMode) -> io::Result<()> {
        let EngineMode::ProgressThread { spin } = mode else {
            let _ = self.progress.mode.set(mode);
            return Ok(());
        };
        let poll = Poll::new()?;
        for (i, fd) in self.link.poll_fds().iter().enumerate() {
            poll.registry()
                .register(&mut SourceFd(fd), Token(i), Interest::READABLE)?;
        }
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let _ = self.progress.waker.set(waker.clone());
        self.progress.awake.store(true, Ordering::SeqCst);
        let _ = self.progress.mode.set(mode);
        let weak = Arc::downgrade(self);
        let handle = std::thread::Builder::new()
            .name(format!("softverbs-{}", self.name))
            .spawn(move || run(weak, poll, spin, waker))?;
        *self.progress.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(())
    }

    /// One turn of the progress thread: read up to a budget of datagrams,
    /// run due timers, send everything produced. Takes the engine lock only
    /// when there is something to do. Returns whether there was.
    fn turn(self: &Arc<Self>) -> bool {
        let now = self.now();
        let mut guard = None;
        let n = self.link.recv(TURN_BUDGET, &mut |d| {
            guard.get_or_insert_with(|| self.lock()).handle_datagram(now, d);
        });
        let due = self.progress.deadline.load(Ordering::Relaxed) <= now;
        let inbox = !self.inbox.is_empty();
        if n == 0 && !due && !inbox && guard.is_none() {
            return !self.link.flush();
        }
        let mut core = match guard {
            Some(g) => g,
            None => self.lock(),
        };
        let mut out = Vec::new();
        let mut events = Vec::new();
        Self::progress_locked(&mut core, &self.inbox, now);
        Self::drain_locked(&mut core, &mut out, &mut events);
        self.progress.set_deadline(core.poll_timeout());
        let worked = n > 0 || !out.is_empty() || !events.is_empty();
        if self.network {
            Self::send_recycling(&self.link, &mut core, &mut out);
        }
        drop(core);
        self.dispatch_events(events);
        self.send_all(out, now);
        worked
    }
}

/// The progress thread.
/// The progress thread. It holds the device weakly and its waker strongly:
/// the device's last reference may be the one this thread drops on its way
/// to sleep, and the device's drop wakes the thread (`Progress::stop`); if
/// the waker went with the device, its eventfd would leave the poller with
/// that wake-up pending, and a thread asleep without a deadline would never
/// wake again.
fn run(dev: Weak<DeviceShared>, mut poll: Poll, spin: Duration, _waker: Arc<Waker>) {
    let mut events = Events::with_capacity(16);
    let mut idle_since = Instant::now();
    loop {
        let Some(d) = dev.upgrade() else { return };
        if d.progress.stop.load(Ordering::SeqCst) {
            return;
        }
        if d.turn() {
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        // Going to sleep: announce it, then take a last look under the
        // engine lock (see the module docs for why this order).
        d.progress.awake.store(false, Ordering::SeqCst);
        let (busy, deadline) = {
            let core = d.lock();
            let busy = core.has_transmit() || !d.inbox.is_empty();
            let deadline = core.poll_timeout();
            d.progress
                .armed
                .store(deadline.unwrap_or(NO_DEADLINE), Ordering::SeqCst);
            (busy, deadline)
        };
        if busy {
            d.progress.awake.store(true, Ordering::SeqCst);
            continue;
        }
        let backlog = !d.link.flush();
        let mut timeout = deadline.map(|t| Duration::from_nanos(t.saturating_sub(d.now())));
        if backlog {
            // A full send buffer: retry soon.
            timeout = Some(timeout.map_or(Duration::from_millis(1), |t| t.min(Duration::from_millis(1))));
        }
        if !d.link.wakeups().is_none_or(|w| w.prepare_sleep()) {
            timeout = Some(Duration::ZERO);
        }
        drop(d);
        let _ = poll.poll(&mut events, timeout);
        let Some(d) = dev.upgrade() else { return };
        d.progress.armed.store(NO_DEADLINE, Ordering::SeqCst);
        d.progress.awake.store(true, Ordering::SeqCst);
        idle_since = Instant::now();
    }
}
