//! The library's progress thread: the engine runs inline (a busy-polling
//! application reads the link itself inside `ibv_poll_cq`, the fastest
//! path on a small machine), and this thread drives the device when
//! nobody else does: a passive RDMA WRITE/READ target that sits in a TCP
//! read, a receiver that spins on memory (perftest's `ib_write_lat` polls
//! the last byte of its buffer and never calls a verb), a thread blocked in
//! `ibv_get_cq_event`, and the engine's timers.
//!
//! The thread never spins: on a 2-core machine where each side of a
//! ping-pong already spins an application thread, a spinning progress
//! thread could only run by taking a core's time slice from one of them.
//! It sleeps in `ppoll(2)` on the link's descriptors and asks the
//! scheduler for a short time slice, so that a wake-up preempts a spinning
//! application thread on its core at once.
//!
//! What makes it adaptive is the sleep's timeout ([`Pacer`]). The shared
//! memory link rings a reader's doorbell only while the reader has
//! announced that it sleeps ([`Wakeups::prepare_sleep`](softverbs::soft::link::Wakeups::prepare_sleep)), and any thread that
//! reads the link withdraws that announcement: an application polling CQs
//! keeps its peers from making a system call per message. The price is
//! that after the application's last `ibv_poll_cq` nobody is announced as
//! sleeping until this thread wakes and announces itself again, and a
//! datagram arriving meanwhile waits for that wake-up. So the timeout is
//! short while traffic goes unattended (data this thread found waiting, or
//! was woken for, that the application threads, although they ran, did
//! not read: [`Watch`]), and doubles on every other wake-up, up to 1 ms
//! while traffic is recent and 20 ms when idle; and while the application
//! lately left data unread, an `ibv_poll_cq` that returns completions
//! announces this thread as sleeping again ([`rearm`]), so that the next
//! datagram rings the doorbell at once. A busy-polling application is
//! left alone (about one wake-up per millisecond); one that stops calling
//! verbs after a completion is served within tens of microseconds.
//!
//! Leaving a busy application alone takes two more rules, because the
//! thread often shares the application's only core (`taskset`): it never
//! waits for the engine's lock (a verb holding it progresses the device
//! itself; blocking on it would make the application's unlock wake the
//! thread back), and while an application thread polls CQs or is in a
//! verb, with no traffic left unattended lately, the thread sleeps on its
//! timer alone, unannounced, so that its peers do not ring its doorbell
//! for every message (each ring a context switch each way on that core).
//! Data that a drive on such a timeout reads counts as traffic the
//! application left, as if it had woken the thread ([`Judge::drove`]): an
//! application that polled when the thread went quiet and then spins on
//! memory ends the quiet at the first datagram it leaves. And after a
//! drive that found a verb holding the engine, the thread sleeps on its
//! timer too ([`Judge::held`]): the verb reads the link, and a UDP socket
//! stays readable until it does.
//! After serving traffic for an application that does not run at all (a
//! passive target blocked in a TCP read), it keeps reading the link for a
//! while before it sleeps ([`linger`]).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softverbs::soft::engine::DeviceShared;
use softverbs::soft::link::Link;
use softverbs::soft::SoftDevice;

use crate::state::{POLLS, REARM};

/// How many re-announcements [`Pacer::rearm_wanted`] judges at a time.
const REARM_TRIAL: u64 = 64;

/// Re-announcements made ([`rearm`]).
static REARMS: AtomicU64 = AtomicU64::new(0);

/// The links of the running progress threads, for [`rearm`].
static SLEEPERS: Mutex<Vec<Arc<dyn Link>>> = Mutex::new(Vec::new());

/// Announces every progress thread as sleeping again (their links ring
/// the doorbell for the next datagram). An application thread calls it
/// when it gets a completion while [`REARM`] is set: it reads the link
/// when it polls, which withdraws the announcement, and an application
/// that stops polling after a completion and spins on memory (perftest's
/// `ib_write_lat`) would otherwise leave the next datagram to the
/// thread's timeout. Costs the application, if it polls again, one
/// non-blocking read of the doorbell.
pub(crate) fn rearm() {
    let links = SLEEPERS.lock().unwrap_or_else(|p| p.into_inner());
    REARMS.store(REARMS.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    for l in links.iter() {
        if let Some(w) = l.wakeups() {
            w.prepare_sleep();
        }
    }
}

/// The shortest timeout: while traffic goes unattended.
pub(crate) const MIN_TICK: Duration = Duration::from_micros(20);
/// The longest timeout while traffic is recent.
pub(crate) const BUSY_TICK: Duration = Duration::from_millis(1);
/// The longest timeout when idle (the engine's timers still run).
pub(crate) const IDLE_TICK: Duration = Duration::from_millis(20);
/// How long after the last traffic the device counts as busy.
pub(crate) const BUSY_FOR: Duration = Duration::from_millis(200);
/// How long the thread watches for an application thread that polls on
/// another core to take a datagram before it drives the device itself.
const HANDOFF: Duration = Duration::from_micros(5);

/// How a sleep of the thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Data was waiting when the thread went to sleep; it did not sleep.
    Pending,
    /// One of the link's descriptors became readable during the sleep.
    Readable,
    /// The sleep timed out.
    Timeout,
}

/// The thread's sleep timeout, adapted to who reads the link. A pure
/// state machine (time is an argument), so that its behaviour is tested
/// without timing.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    tick: Duration,
    last_traffic: Option<Duration>,
    last_unattended: Option<Duration>,
    /// Re-announcements by application threads ([`rearm`]) and wake-ups
    /// that found data, counted from when [`Pacer::rearm_wanted`] last
    /// turned true.
    rearm_base: Option<(u64, u64)>,
}

impl Pacer {
    /// A pacer for an idle device.
    pub(crate) fn new() -> Self {
        Pacer {
            tick: IDLE_TICK,
            last_traffic: None,
            last_unattended: None,
            rearm_base: None,
        }
    }

    /// The timeout of the next sleep.
    pub(crate) fn tick(&self) -> Duration {
        self.tick
    }

    /// Whether an application thread that gets a completion should
    /// announce this thread as sleeping ([`rearm`]): while the
    /// application has lately left data unread (it stops polling after a
    /// completion and spins on memory), within [`BUSY_FOR`] of the last
    /// time, unless the announcements do not pay: `rearms` (how many
    /// there were) and `served` (wake-ups that found data) are running
    /// totals, and an application that keeps polling after its
    /// completions withdraws each announcement before a datagram comes
    /// (each costs it a read of the doorbell for nothing).
    pub(crate) fn rearm_wanted(&mut self, now: Duration, rearms: u64, served: u64) -> bool {
        let recent = self.last_unattended.is_some_and(|t| now.saturating_sub(t) < BUSY_FOR);
        if !recent {
            self.rearm_base = None;
            return false;
        }
        let (r0, s0) = *self.rearm_base.get_or_insert((rearms, served));
        let (r, s) = (rearms.wrapping_sub(r0), served.wrapping_sub(s0));
        if r >= REARM_TRIAL && s.saturating_mul(4) < r {
            // Wait for new evidence before trying again.
            self.last_unattended = None;
            self.rearm_base = None;
            return false;
        }
        if r >= REARM_TRIAL {
            // A fresh window, so that a change of pattern shows.
            self.rearm_base = Some((rearms, served));
        }
        true
    }

    /// Whether traffic went unattended within `span` before `now`.
    pub(crate) fn unattended_within(&self, now: Duration, span: Duration) -> bool {
        self.last_unattended.is_some_and(|t| now.saturating_sub(t) < span)
    }

    /// Records a wake-up at `now` (any monotonic origin) and what it
    /// found; returns the timeout of the next sleep.
    pub(crate) fn on_wake(&mut self, now: Duration, seen: Seen) -> Duration {
        if seen != Seen::Nothing {
            self.last_traffic = Some(now);
        }
        let busy = self.last_traffic.is_some_and(|t| now.saturating_sub(t) < BUSY_FOR);
        let cap = if busy { BUSY_TICK } else { IDLE_TICK };
        if seen == Seen::Unattended {
            self.last_unattended = Some(now);
        }
        self.tick = if seen == Seen::Unattended {
            // The application ran and did not read the link: it spins on
            // memory or works outside the verbs. Look again soon,
            // announced as sleeping, so that the next datagram rings the
            // doorbell.
            MIN_TICK
        } else {
            (self.tick * 2).clamp(MIN_TICK, cap)
        };
        self.tick
    }
}

/// What a wake-up of the thread found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// No datagram.
    Nothing,
    /// Datagrams, and an application thread polling CQs that reads them.
    Attended,
    /// Datagrams that the application threads, although they ran, did
    /// not read.
    Unattended,
    /// Datagrams nobody read, while the application threads did not run
    /// (the machine is busy elsewhere): no sign either way.
    Unknown,
}

/// Sleeps in `ppoll(2)` on `fds` for at most `timeout`; true if one
/// became readable.
fn wait(fds: &[RawFd], timeout: Duration) -> bool {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `pfds` is a valid array of pollfd and `ts` a valid timespec
    // for the call; no signal mask is passed.
    let n = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    n > 0
}

/// Whether the calling thread may run on one CPU only: then the
/// application threads of this process (which inherited the same
/// affinity, as `taskset` gives it) cannot run while this one does.
fn single_cpu() -> bool {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for the
    // calling thread (pid 0) and keeps no pointer.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return false;
        }
        libc::CPU_COUNT(&set) == 1
    }
}

/// CPU time of the process and of the calling thread.
fn cpu_times() -> (Duration, Duration) {
    let get = |clock| {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    (get(libc::CLOCK_PROCESS_CPUTIME_ID), get(libc::CLOCK_THREAD_CPUTIME_ID))
}

/// Follows the application threads from the progress thread's wake-ups:
/// whether they read the link by polling CQs. A thread polling CQs moves
/// the poll count about once a microsecond (or faster) for as long as it
/// runs; one that spins on memory or computes runs without moving it, or
/// moves it now and then (perftest's `ib_write_lat` polls its send CQ
/// until the completion, then spins on memory until the peer's WRITE).
#[derive(Debug, Clone, Default)]
pub(crate) struct Watch {
    /// The poll count at the previous wake-up.
    polls: u64,
    /// The other threads' CPU time at the previous wake-up.
    others: Duration,
    /// The other threads' CPU time when the poll count last moved.
    at_poll: Duration,
    /// How far the poll count moved between the last two wake-ups.
    moves: u64,
    /// The CPU time the other threads had between the last two wake-ups.
    ran: Duration,
}

impl Watch {
    /// Records the poll count and the other threads' CPU time `others`
    /// (monotonic) at a wake-up, and judges data found then (`found`):
    /// nobody reads it if the other threads ran [`RAN`] or more without
    /// polling, or polled less than once per [`POLL_SPAN`] of the CPU
    /// time they had since the previous wake-up; an application thread
    /// does if it polled since; else (the other threads did not run)
    /// there is no sign either way.
    pub(crate) fn update(&mut self, polls: u64, others: Duration, found: bool) -> Seen {
        self.moves = polls.wrapping_sub(self.polls);
        self.ran = others.saturating_sub(self.others);
        if self.moves != 0 {
            self.at_poll = others;
        }
        self.polls = polls;
        self.others = others;
        if found {
            self.found()
        } else {
            Seen::Nothing
        }
    }

    /// Judges data found at the last wake-up ([`Watch::update`]), as
    /// [`Watch::update`] does; for data that a wake-up judged as a
    /// timeout found after all, when it drove the device.
    pub(crate) fn found(&self) -> Seen {
        let since_poll = self.others.saturating_sub(self.at_poll);
        let sparse =
            self.ran >= RAN && (POLL_SPAN.as_nanos() as u64).saturating_mul(self.moves) < self.ran.as_nanos() as u64;
        if since_poll >= RAN || sparse {
            Seen::Unattended
        } else if self.moves != 0 {
            Seen::Attended
        } else {
            Seen::Unknown
        }
    }
}

/// An application thread that polls CQs less often than once per this
/// much of its CPU time does not read the link as fast as data comes.
pub(crate) const POLL_SPAN: Duration = Duration::from_micros(2);

/// The other threads of the process (the application's) have had this
/// much CPU time without polling a CQ: they are not polling.
pub(crate) const RAN: Duration = Duration::from_micros(10);

/// The CPU time the other threads of the process have had (monotonic).
fn others_cpu() -> Duration {
    let (process, thread) = cpu_times();
    process.saturating_sub(thread)
}

/// Whether an application thread polling CQs on another core takes data
/// that is waiting: the poll count moves within [`HANDOFF`].
fn polls_elsewhere() -> bool {
    let p0 = POLLS.load(Ordering::Relaxed);
    let t0 = Instant::now();
    while t0.elapsed() < HANDOFF {
        if POLLS.load(Ordering::Relaxed) != p0 {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// `Wakeups::prepare_sleep` on a link that has it; `true` (sleep) on
/// one that does not.
fn prepare_sleep(link: &dyn Link) -> bool {
    link.wakeups().is_none_or(|w| w.prepare_sleep())
}

/// The decisions of the thread's wake-ups, apart from their system
/// calls: the [`Pacer`], the [`Watch`] and whether the thread sleeps
/// quietly. A pure state machine (the time, the poll count, the other
/// threads' CPU time and what a drive read are arguments), so that its
/// behaviour over a run of wake-ups is tested without timing.
#[derive(Debug, Clone)]
pub(crate) struct Judge {
    pacer: Pacer,
    watch: Watch,
    /// Wake-ups that found data (for [`Pacer::rearm_wanted`]).
    served: u64,
    /// An application thread reads the link itself (it polls CQs, or is
    /// in a verb) and no traffic went unattended lately: the thread then
    /// sleeps on its timer alone, without announcing itself, so that
    /// peers do not ring its doorbell and it does not take the core from
    /// a busy application thread (on a shared core each wake-up is a
    /// context switch each way).
    quiet: bool,
    /// A verb held the engine when the thread last tried to drive: the
    /// application thread in it reads the link ([`Judge::held`]).
    held: bool,
}

/// One wake-up being judged ([`Judge::wake`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Turn {
    /// What the wake-up found, and who reads it.
    pub(crate) seen: Seen,
    /// Whether data was waiting (the wake-up's own sign, or what the
    /// drive read: [`Judge::drove`]).
    pub(crate) found: bool,
    /// An application thread polled a CQ since the previous wake-up.
    polled: bool,
    /// A verb held the engine when the thread tried to drive.
    in_verb: bool,
}

impl Judge {
    /// The judge of an idle device.
    pub(crate) fn new() -> Self {
        Judge {
            pacer: Pacer::new(),
            watch: Watch::default(),
            served: 0,
            quiet: false,
            held: false,
        }
    }

    /// Whether the next sleep is on the timer alone, unannounced.
    pub(crate) fn quiet(&self) -> bool {
        self.quiet
    }

    /// The timeout of the next sleep.
    pub(crate) fn tick(&self) -> Duration {
        self.pacer.tick()
    }

    /// Whether the next sleep is on the timer alone, as when quiet: a
    /// verb held the engine at the last drive, and the application
    /// thread in it reads the link. The UDP socket stays readable until
    /// then, so a sleep on it would return at once, again and again: on
    /// the application's core this thread would spin until its time
    /// slice ends, keeping the very thread that reads from running. (The
    /// timeout stays the pacer's, which grows while verbs keep holding
    /// the engine: an application posting a long list of WRITEs is not
    /// to be looked at every [`MIN_TICK`].)
    pub(crate) fn held(&self) -> bool {
        self.held
    }

    /// Starts judging a wake-up: `found` if data was waiting, the poll
    /// count and the other threads' CPU time now.
    pub(crate) fn wake(&mut self, found: bool, polls: u64, others: Duration) -> Turn {
        self.held = false;
        let polled = polls != self.watch.polls;
        Turn {
            seen: self.watch.update(polls, others, found),
            found,
            polled,
            in_verb: false,
        }
    }

    /// Whether the thread drives the device, alone on its core or not.
    /// It drives on timeouts too, for the engine's timers, unless an
    /// application thread polled CQs since the last wake-up (its polls
    /// run them; driving would only contend for the engine's lock with a
    /// busy-polling thread). Data is left only to an application thread
    /// polling on another core.
    pub(crate) fn drive(turn: &Turn, alone: bool) -> bool {
        match turn.seen {
            Seen::Nothing => !turn.polled,
            Seen::Attended => alone,
            Seen::Unattended | Seen::Unknown => true,
        }
    }

    /// Records what driving read: `None` if a verb held the engine, else
    /// how many datagrams. A drive on a timeout that reads datagrams
    /// found data that nobody read since it came, and is judged as a
    /// wake-up for them would be: judged as a plain timeout, data that an
    /// application spinning on memory left would never count as
    /// unattended, so a thread that went quiet while the application
    /// still polled would stay quiet, placing each datagram only at a
    /// timeout without a poll before it (about 1.5 ms per message).
    pub(crate) fn drove(&mut self, turn: &mut Turn, read: Option<usize>) {
        self.held = read.is_none();
        match read {
            None => {
                turn.in_verb = true;
                turn.seen = Seen::Attended;
            }
            Some(n) if n > 0 && !turn.found => {
                turn.found = true;
                turn.seen = self.watch.found();
            }
            Some(_) => {}
        }
    }

    /// Ends the wake-up at `now` (any monotonic origin), `rearms` being
    /// the running count of re-announcements ([`rearm`]); returns whether
    /// application threads should re-announce the thread ([`REARM`]).
    pub(crate) fn finish(&mut self, now: Duration, turn: &Turn, rearms: u64) -> bool {
        self.pacer.on_wake(now, turn.seen);
        if turn.seen != Seen::Nothing {
            self.served = self.served.wrapping_add(1);
        }
        let want = self.pacer.rearm_wanted(now, rearms, self.served);
        self.quiet = (turn.in_verb || turn.polled)
            && turn.seen != Seen::Unattended
            && !self.pacer.unattended_within(now, BUSY_FOR);
        want
    }
}

/// The thread's body: sleeps on the link's descriptors with the
/// [`Pacer`]'s timeout, announced as sleeping; when data is waiting (found
/// on announcing, or woken for), leaves it to an application thread that
/// is polling CQs and drives the device otherwise; drives on timeouts for
/// the engine's timers.
pub(crate) fn run(soft: Arc<SoftDevice>, link: Arc<dyn Link>, stop: Arc<AtomicBool>, linger: Duration) {
    let shared = soft.shared().clone();
    short_slice();
    fine_timer_slack();
    let start = Instant::now();
    SLEEPERS.lock().unwrap_or_else(|p| p.into_inner()).push(link.clone());
    let mut judge = Judge::new();
    let mut alone = single_cpu();
    let mut wakes: u64 = 0;
    let mut idle_mark = others_cpu();
    while !stop.load(Ordering::Acquire) {
        let quiet = judge.quiet();
        let mut wake = if quiet || judge.held() {
            if wait(&[], sleep_for(&shared, judge.tick())) {
                Wake::Readable
            } else {
                Wake::Timeout
            }
        } else if !prepare_sleep(&*link) {
            Wake::Pending
        } else if wait(&link.poll_fds(), sleep_for(&shared, judge.tick())) {
            Wake::Readable
        } else {
            Wake::Timeout
        };
        if stop.load(Ordering::Acquire) {
            break;
        }
        wakes = wakes.wrapping_add(1);
        if wakes.is_multiple_of(1024) {
            // The application may change its affinity.
            alone = single_cpu();
        }
        if wake == Wake::Timeout && !quiet && !prepare_sleep(&*link) {
            // Data arrived after an application thread withdrew the
            // announcement (it read the link), and nobody read it since.
            wake = Wake::Pending;
        }
        // On this thread's only core the application cannot run (and
        // take the data) until this thread sleeps again; on another core it
        // may be polling right now.
        let others = others_cpu();
        let mut turn = judge.wake(wake != Wake::Timeout, POLLS.load(Ordering::Relaxed), others);
        if turn.found && turn.seen != Seen::Unattended && !alone && polls_elsewhere() {
            turn.seen = Seen::Attended;
        }
        if Judge::drive(&turn, alone) {
            // Never wait for the engine's lock: an application thread in a
            // verb holds it and progresses the device itself, and on a
            // shared core blocking on it would make its unlock wake this
            // thread back (a context switch each way, per message).
            let read = shared.try_drive();
            judge.drove(&mut turn, read);
            if read.is_some() && turn.found && !linger.is_zero() && others_idle(others, &mut idle_mark) {
                self::linger(&shared, &stop, linger);
                idle_mark = others_cpu();
            }
        }
        let want = judge.finish(start.elapsed(), &turn, REARMS.load(Ordering::Relaxed));
        if REARM.load(Ordering::Relaxed) != want {
            REARM.store(want, Ordering::Relaxed);
        }
    }
    let mut links = SLEEPERS.lock().unwrap_or_else(|p| p.into_inner());
    links.retain(|l| !std::ptr::addr_eq(Arc::as_ptr(l), Arc::as_ptr(&link)));
}

/// How long the thread keeps reading the link after serving traffic
/// while the application's threads do not run ([`linger`]), unless
/// `SOFTVERBS_SPIN_US` says otherwise.
pub(crate) const LINGER_US: u64 = 50;

/// Whether the application's threads, whose CPU time is `now` (a value of
/// [`others_cpu`]), have had none since `mark`, which moves to `now`: they
/// are blocked (a passive RDMA target in a TCP read), so this thread may
/// keep a core busy without taking it from them.
fn others_idle(now: Duration, mark: &mut Duration) -> bool {
    let idle = now.saturating_sub(*mark) < IDLE_CPU;
    *mark = now;
    idle
}

/// CPU time the application's threads may have had between two wake-ups
/// and still count as not running (the clock's granularity, a signal).
const IDLE_CPU: Duration = Duration::from_micros(2);

/// Keeps reading the link of `shared` until it has been quiet for `span`,
/// an application thread polls a CQ (it reads the link itself then), or
/// the application's threads start running. A stream of WRITEs to a
/// passive target then costs one wake-up per burst instead of one per
/// message: a wake-up takes the sender's next message as long again as
/// placing it does on a quiet machine.
fn linger(shared: &Arc<DeviceShared>, stop: &AtomicBool, span: Duration) {
    let polls = POLLS.load(Ordering::Relaxed);
    let others = others_cpu();
    let mut quiet_since = Instant::now();
    let mut turns: u32 = 0;
    while quiet_since.elapsed() < span && !stop.load(Ordering::Relaxed) {
        match shared.poll_link() {
            // An application thread is in a verb: it reads the link.
            None => return,
            Some(0) => std::hint::spin_loop(),
            Some(_) => quiet_since = Instant::now(),
        }
        turns = turns.wrapping_add(1);
        if POLLS.load(Ordering::Relaxed) != polls {
            return;
        }
        // The process CPU clock is a system call: look now and then.
        if turns.is_multiple_of(64) && others_cpu().saturating_sub(others) >= IDLE_CPU {
            return;
        }
    }
}

/// The timeout of a sleep: the pacer's `tick`, or less if one of the
/// engine's timers (a retransmission, an RNR wait) comes due sooner, so
/// that an application sleeping on an event descriptor hears of what the
/// timer brings (a retry, an error completion) in time. Never shorter
/// than [`MIN_TICK`]: a deadline that an application's polls are about to
/// run must not make this thread spin.
fn sleep_for(shared: &DeviceShared, tick: Duration) -> Duration {
    shared
        .until_deadline()
        .map_or(tick, |d| d.clamp(MIN_TICK, tick.max(MIN_TICK)))
}

/// Asks for a timer slack of 1 ns for the calling thread, so that its
/// short timeouts are not stretched by the default 50 µs.
fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and affects only the
    // calling thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

/// `struct sched_attr` of `sched_setattr(2)` (its first version, 48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// The time slice the progress thread asks for (the smallest Linux takes).
const SLICE_NS: u64 = 100_000;

/// Asks the scheduler for a short time slice for the calling thread (an
/// ordinary `SCHED_OTHER` thread; no privilege needed). Since Linux 6.12,
/// a woken thread with a shorter slice than the running one preempts it at
/// once; without it, a thread woken by a datagram may wait for the rest of
/// the slice of an application thread that spins on memory on the same
/// core. The thread mostly sleeps and runs briefly, so the short slice
/// costs nothing. Older kernels ignore the runtime of a `SCHED_OTHER`
/// thread or refuse; either is harmless.
fn short_slice() {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_setattr reads `attr` (its size field says how much)
    // for the calling thread (pid 0) and keeps no pointer.
    let _ = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn idle_device_sleeps_long() {
        let mut p = Pacer::new();
        assert_eq!(p.tick(), IDLE_TICK);
        for i in 1..10 {
            assert_eq!(p.on_wake(ms(20 * i), Seen::Nothing), IDLE_TICK);
        }
    }

    #[test]
    fn unattended_traffic_shortens_the_timeout_at_once() {
        // A receiver spinning on memory (perftest's ib_write_lat): data
        // that the application, although it ran, did not read. With a
        // fixed 1 ms timeout each such datagram waited up to 1 ms.
        let mut p = Pacer::new();
        assert_eq!(p.on_wake(ms(5), Seen::Unattended), MIN_TICK);
        // It stays short while that goes on.
        for i in 0..100 {
            assert_eq!(p.on_wake(ms(5) + MIN_TICK * i, Seen::Unattended), MIN_TICK);
        }
        // And comes back at once after a few quiet wakes.
        let mut now = ms(10);
        for _ in 0..3 {
            now += p.tick();
            p.on_wake(now, Seen::Nothing);
        }
        assert_eq!(p.tick(), MIN_TICK * 8);
        assert_eq!(p.on_wake(now + p.tick(), Seen::Unattended), MIN_TICK);
    }

    #[test]
    fn quiet_wakes_back_off_to_the_busy_then_the_idle_tick() {
        let mut p = Pacer::new();
        let mut now = ms(1);
        p.on_wake(now, Seen::Unattended);
        let mut ticks = Vec::new();
        // Timeouts right after traffic: doubling, capped at 1 ms.
        for _ in 0..10 {
            now += p.tick();
            ticks.push(p.on_wake(now, Seen::Nothing));
        }
        assert_eq!(ticks[0], MIN_TICK * 2);
        assert_eq!(ticks[1], MIN_TICK * 4);
        assert!(ticks.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*ticks.last().unwrap(), BUSY_TICK);
        // Once the traffic is older than BUSY_FOR, up to the idle tick.
        now += BUSY_FOR;
        for _ in 0..10 {
            now += p.tick();
            p.on_wake(now, Seen::Nothing);
        }
        assert_eq!(p.tick(), IDLE_TICK);
    }

    #[test]
    fn a_busy_polling_application_keeps_the_thread_away() {
        // The application polls CQs and takes the data (or was merely
        // descheduled when the thread found some): the timeout grows to
        // the busy tick, and stays there while traffic flows (it does not
        // fall back to the idle tick).
        for seen in [Seen::Attended, Seen::Unknown] {
            let mut p = Pacer::new();
            let mut now = ms(1);
            p.on_wake(now, Seen::Unattended);
            for _ in 0..1000 {
                now += p.tick();
                p.on_wake(now, seen);
            }
            assert_eq!(p.tick(), BUSY_TICK, "{seen:?}");
        }
    }

    #[test]
    fn traffic_after_an_idle_period_is_served_promptly_again() {
        let mut p = Pacer::new();
        let mut now = ms(0);
        for _ in 0..20 {
            now += p.tick();
            p.on_wake(now, Seen::Nothing);
        }
        assert_eq!(p.tick(), IDLE_TICK);
        now += ms(3);
        assert_eq!(p.on_wake(now, Seen::Unattended), MIN_TICK);
    }

    #[test]
    fn other_threads_cpu_time_is_measured() {
        // A thread spinning here for a while shows in `others_cpu`, which
        // tells an application spinning on memory from one descheduled.
        let before = others_cpu();
        let spin = std::thread::spawn(|| {
            let t0 = Instant::now();
            while t0.elapsed() < ms(20) {
                std::hint::spin_loop();
            }
        });
        spin.join().unwrap();
        assert!(others_cpu().saturating_sub(before) >= RAN);
    }

    #[test]
    fn an_application_running_without_polling_is_unattended() {
        // perftest's ib_write_lat: polls its send CQ, then spins on memory.
        let mut w = Watch::default();
        let us = Duration::from_micros;
        w.update(0, us(0), false);
        // It polled densely since the last wake-up: attended.
        assert_eq!(w.update(100, us(50), true), Seen::Attended);
        // Then ran 40 µs without polling: whatever waits is stranded.
        assert_eq!(w.update(100, us(90), true), Seen::Unattended);
        // A wake-up period as long as an iteration: the count moves every
        // time, but by a few dozen polls per hundreds of microseconds.
        assert_eq!(w.update(130, us(590), true), Seen::Unattended);
        assert_eq!(w.update(160, us(1090), true), Seen::Unattended);
        // Polling densely again: attended again.
        assert_eq!(w.update(1160, us(1190), true), Seen::Attended);
        // Timeouts judge nothing (but keep the marks).
        assert_eq!(w.update(1170, us(1200), false), Seen::Nothing);
    }

    #[test]
    fn a_descheduled_or_busy_polling_application_is_not_neglect() {
        let mut w = Watch::default();
        let us = Duration::from_micros;
        // Other processes kept the application off the core: it neither
        // polled nor ran since the last wake-up.
        w.update(7, us(500), false);
        assert_eq!(w.update(7, us(502), true), Seen::Unknown);
        // A busy poller: at least one poll per POLL_SPAN of CPU time
        // (a poll that reads a socket costs about a microsecond).
        let mut polls = 8;
        let mut cpu = us(600);
        for _ in 0..100u64 {
            polls += 300;
            cpu += us(300);
            assert_eq!(w.update(polls, cpu, true), Seen::Attended);
        }
    }

    #[test]
    fn data_a_quiet_timeout_drives_out_ends_the_quiet() {
        // perftest's ib_write_lat: the application polls its send CQ once
        // per iteration, then spins on memory for the peer's WRITE. The
        // thread went quiet while the application polled (before any
        // datagram went unattended), so only its timer wakes it.
        let us = Duration::from_micros;
        let mut j = Judge::new();
        let t = j.wake(false, 5, us(100));
        assert!(!Judge::drive(&t, true));
        j.finish(us(100), &t, 0);
        assert!(j.quiet());
        // A timeout after the application polled: left to it.
        let t = j.wake(false, 6, us(1100));
        assert!(!Judge::drive(&t, true));
        j.finish(us(1100), &t, 0);
        assert!(j.quiet());
        // A timeout after it spun a millisecond without polling: the
        // thread drives and reads the peer's WRITE that waited. That is
        // traffic the application left, as if it had woken the thread.
        let mut t = j.wake(false, 6, us(2100));
        assert!(Judge::drive(&t, true));
        j.drove(&mut t, Some(1));
        assert_eq!((t.found, t.seen), (true, Seen::Unattended));
        j.finish(us(2100), &t, 0);
        assert_eq!(j.tick(), MIN_TICK);
        assert!(!j.quiet());
        // The application's next poll (its send CQ) does not make the
        // thread quiet again: it sleeps announced, woken by the next WRITE.
        let t = j.wake(false, 7, us(2120));
        j.finish(us(2120), &t, 0);
        assert!(!j.quiet());
    }

    #[test]
    fn a_drive_that_finds_the_engine_held_sleeps_on_the_timer() {
        // Data woke the thread while the application thread polled on its
        // core and held the engine: the thread does not sleep on the link
        // again (a UDP socket that stays readable until the application
        // reads it would end every sleep at once), but on its timer.
        let us = Duration::from_micros;
        let mut j = Judge::new();
        let t = j.wake(false, 0, us(0));
        j.finish(us(0), &t, 0);
        let mut t = j.wake(true, 1, us(5));
        assert!(Judge::drive(&t, true));
        j.drove(&mut t, None);
        j.finish(us(5), &t, 0);
        assert!(j.held());
        // The next wake-up that drives and gets the engine ends it.
        let mut t = j.wake(true, 1, us(30));
        assert!(!j.held());
        j.drove(&mut t, Some(1));
        j.finish(us(30), &t, 0);
        assert!(!j.held());
    }

    #[test]
    fn a_quiet_thread_leaves_a_busy_poller_alone() {
        // An application polling CQs all the time (ib_send_lat): the
        // quiet thread never drives, whatever waits on the link, and its
        // timeout grows to the busy tick.
        let us = Duration::from_micros;
        let mut j = Judge::new();
        let (mut now, mut polls) = (us(0), 0);
        for _ in 0..50 {
            now += j.tick();
            polls += 1000;
            let mut t = j.wake(false, polls, now);
            assert!(!Judge::drive(&t, true));
            if j.quiet() {
                // A verb holding the engine reads nothing for the thread.
                j.drove(&mut t, Some(0));
                assert_eq!(t.seen, Seen::Nothing);
            }
            j.finish(now, &t, 0);
            assert!(j.quiet());
        }
        assert_eq!(j.tick(), IDLE_TICK);
    }

    #[test]
    fn rearming_lasts_while_it_pays() {
        let us = Duration::from_micros;
        let mut p = Pacer::new();
        // No sign of an application that stops polling: no re-announcing.
        assert!(!p.rearm_wanted(us(10), 0, 0));
        p.on_wake(us(20), Seen::Unattended);
        // ib_write_lat: one completion (one re-announcement) per datagram
        // that then wakes the thread: stays on, window after window.
        let (mut r, mut s) = (0, 0);
        for i in 0..1000u64 {
            r += 1;
            s += 1;
            assert!(p.rearm_wanted(us(30 + i), r, s), "{i}");
        }
        // Until BUSY_FOR after the last unread datagram.
        assert!(!p.rearm_wanted(us(20) + BUSY_FOR, r, s));
    }

    #[test]
    fn rearming_stops_when_the_application_keeps_polling() {
        let us = Duration::from_micros;
        let mut p = Pacer::new();
        p.on_wake(us(20), Seen::Unattended);
        // A busy-polling application: many completions, hardly a wake-up
        // that found data. It stops within one trial window.
        let mut stopped_at = None;
        for r in 0..(4 * REARM_TRIAL) {
            if !p.rearm_wanted(us(30 + r), r, r / 16) {
                stopped_at = Some(r);
                break;
            }
        }
        assert_eq!(stopped_at, Some(REARM_TRIAL));
        // And does not come back without a new unread datagram.
        assert!(!p.rearm_wanted(us(400), 500, 0));
        p.on_wake(us(500), Seen::Unattended);
        assert!(p.rearm_wanted(us(501), 500, 0));
    }
}
