//! Completion queues through the layer: polling turns completions into
//! callbacks.

use crate::sys::lock;
use std::collections::HashMap;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::guard::Guarded;
use super::qp::{Alone, Done, QpShared};
use crate::soft::SoftLock;
use crate::verbs::backend::{CqOps, DeviceSection};
use crate::verbs::{verr, CompChannel, Context, Cq, Result, WcStatus, WorkCompletion};

/// Completions read from the device per `poll_cq` call.
const BATCH: usize = 32;

/// QP numbers are already well spread: hash them as they are (SipHash of
/// a `u32` showed in the per-completion cost).
#[derive(Default)]
struct QpnHasher(u64);

impl std::hash::Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type QpMap = HashMap<u32, Arc<QpShared>, std::hash::BuildHasherDefault<QpnHasher>>;

thread_local! {
    /// This thread's list of finished requests, kept for its capacity (a
    /// callback that polls again finds it borrowed and uses a new one).
    static DONE: std::cell::RefCell<Vec<Done>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Whether this thread's list may hold requests whose callbacks have
    /// not run: a poll further up the stack is running it, or a callback
    /// panicked and left the rest there. While it is false the list is
    /// empty and not borrowed, and a poll retires lone completions
    /// without touching it.
    static LISTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A handler for completions that belong to no request of the layer.
pub type StraySink = Box<dyn Fn(&WorkCompletion) + Send + Sync + 'static>;

/// Counters of one CQ (a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CqStats {
    /// Completions read from the device.
    pub polled: u64,
    /// Callbacks called.
    pub callbacks: u64,
    /// Completions that named no outstanding WR of the layer (a WR posted
    /// directly on the verbs QP, or one of a QP already closed).
    pub stray: u64,
    /// Of those, the ones with an error status: never dropped silently,
    /// they are counted here and handed to the stray sink if one is set
    /// ([`UlpCq::set_stray_sink`]).
    pub stray_errors: u64,
}

/// What a poller holds while it reads completions and retires them: the
/// completion buffer and the QPs attached to the CQ, under one guard (the
/// device's lock where the backend offers one, else the layer's own
/// mutex; a poll takes it once; attaching and detaching a QP are rare).
struct PollState {
    wcs: Vec<WorkCompletion>,
    qps: QpMap,
    /// The QP of the last completion read (most runs of completions are
    /// of one QP: no map lookup for them). Also in `qps` while it is
    /// attached, so replacing it never drops a QP's last reference under
    /// the guard.
    last: Option<Arc<QpShared>>,
    /// Completions read.
    polled: u64,
    /// Callbacks called, counted when their completions are retired (just
    /// before they run, after the guard).
    callbacks: u64,
}

pub(crate) struct CqShared {
    // Field order: the CQ is destroyed before its channel.
    cq: Cq,
    channel: CompChannel,
    ctx: Context,
    poll: Guarded<PollState>,
    committed: Mutex<u32>,
    stray: AtomicU64,
    stray_errors: AtomicU64,
    stray_sink: RwLock<Option<StraySink>>,
}

/// What one read of the CQ gave ([`CqShared::read`]).
enum Read {
    /// Nothing.
    Empty,
    /// One completion, retired alone: its request is in the slot given,
    /// to run after the guard.
    Alone,
    /// This many completions, retired into the list given; and the stray
    /// errors among them, for the sink (called after the guard).
    Listed(usize, Vec<WorkCompletion>),
}

impl CqShared {
    /// The verbs CQ's backend object.
    #[inline]
    fn ops(&self) -> &dyn CqOps {
        &**self.cq.ops()
    }

    pub(crate) fn cq(&self) -> &Cq {
        &self.cq
    }

    /// The engine lock guarding the poll state (`None`: the layer's own
    /// mutex).
    pub(crate) fn soft_lock(&self) -> Option<&SoftLock> {
        self.poll.soft()
    }

    /// Runs `f` on the poll state holding its guard, with the section to
    /// poll and post through (`poll`: the section reads the device's link
    /// first, as a poll does). `f` must call no verb of the device but
    /// through the section, nor drop what could.
    #[inline(always)]
    fn with_poll<R>(&self, poll: bool, f: impl FnOnce(&mut PollState, &mut dyn DeviceSection) -> R) -> R {
        self.poll.with_cq(poll, f)
    }

    pub(crate) fn commit(&self, n: u32) -> Result<()> {
        let mut c = lock(&self.committed);
        let cap = self.cq.capacity();
        if u64::from(*c) + u64::from(n) > u64::from(cap) {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the CQ has {} of {cap} entries free; the QP's queues need {n}",
                cap - *c
            ));
        }
        *c += n;
        Ok(())
    }

    pub(crate) fn uncommit(&self, n: u32) {
        let mut c = lock(&self.committed);
        *c = c.saturating_sub(n);
    }

    pub(crate) fn attach(&self, qp: &Arc<QpShared>) {
        let qp = qp.clone();
        let old = self.with_poll(false, |st, _| st.qps.insert(qp.qpn, qp));
        drop(old);
    }

    pub(crate) fn detach(&self, qpn: u32) {
        // Under the guard: no poller is between reading a completion of
        // this QP and retiring it. The QP goes after it.
        let gone = self.with_poll(false, |st, _| {
            let last = st.last.take_if(|qp| qp.qpn == qpn);
            (st.qps.remove(&qpn), last)
        });
        drop(gone);
    }

    /// Reads up to `want` completions under the guard and retires what
    /// they complete: a lone completion of the common case into `alone`
    /// if `out` is `None` or empty ([`Read::Alone`]); anything else into
    /// `out`, or into this thread's list if `out` is `None` (the caller
    /// knows it is free: [`LISTED`] is false), which is then marked as
    /// listed.
    #[inline(always)]
    fn read(&self, want: usize, out: Option<&mut Vec<Done>>, alone: &mut MaybeUninit<Alone>) -> Result<Read> {
        self.with_poll(true, |st, sec| {
            let n = sec.poll(self.ops(), &mut st.wcs[..want])?;
            if n == 0 {
                return Ok(Read::Empty);
            }
            st.polled += n as u64;
            if n == 1 && out.as_ref().is_none_or(|o| o.is_empty()) {
                // One completion of the QP of the last one, the common
                // case of a shallow queue: no list of finished requests.
                if let Some(qp) = st.last.as_ref().filter(|qp| qp.qpn == st.wcs[0].qp_num) {
                    // SAFETY: inside the CQ's guard, which guards the QP's
                    // tracker too when it is the device's lock (QPs of a
                    // device-guarded CQ are device-guarded: `UlpQp::create`);
                    // no reference to the tracker is held here.
                    if unsafe { qp.retire_alone(&st.wcs[0], alone) } {
                        // SAFETY: `retire_alone` wrote it (it said so).
                        st.callbacks += u64::from(unsafe { alone.assume_init_ref() }.will_call());
                        return Ok(Read::Alone);
                    }
                }
            }
            let strays = match out {
                Some(out) => self.retire_read(n, st, sec, out),
                None => DONE.with(|d| {
                    LISTED.set(true);
                    self.retire_read(n, st, sec, &mut d.borrow_mut())
                }),
            };
            Ok(Read::Listed(n, strays))
        })
    }

    /// Retires what the `n` completions read into `st` complete into
    /// `out`, and counts the callbacks to call. Returns the stray errors
    /// among them, for the sink.
    #[inline(never)]
    fn retire_read(
        &self,
        n: usize,
        st: &mut PollState,
        sec: &mut dyn DeviceSection,
        out: &mut Vec<Done>,
    ) -> Vec<WorkCompletion> {
        let PollState {
            wcs,
            qps,
            last,
            callbacks,
            ..
        } = st;
        let before = out.len();
        let mut strays = Vec::new();
        // A run of completions of one QP is retired at once.
        let mut i = 0;
        while i < n {
            let qpn = wcs[i].qp_num;
            if last.as_ref().is_none_or(|qp| qp.qpn != qpn) {
                *last = qps.get(&qpn).cloned();
            }
            // SAFETY: as in `read`: inside the CQ's guard, which guards the
            // QP's tracker when it is the device's lock; `sec` is the
            // section it runs in; no reference to the tracker is held.
            let k = last
                .as_ref()
                .map_or(0, |qp| unsafe { qp.retire_run(&wcs[i..n], sec, out) });
            if k == 0 {
                self.count_stray(&wcs[i], &mut strays);
                i += 1;
            }
            i += k;
        }
        *callbacks += out[before..].iter().filter(|d| d.will_call()).count() as u64;
        strays
    }

    /// Counts a completion that names no request of the layer; keeps it
    /// for the sink if it is an error.
    #[cold]
    fn count_stray(&self, wc: &WorkCompletion, strays: &mut Vec<WorkCompletion>) {
        self.stray.fetch_add(1, Ordering::Relaxed);
        if wc.status != WcStatus::Success {
            self.stray_errors.fetch_add(1, Ordering::Relaxed);
            strays.push(*wc);
        }
    }

    /// Hands stray errors to the sink, outside every guard.
    #[inline]
    fn sink_strays(&self, strays: Vec<WorkCompletion>) {
        if !strays.is_empty() {
            self.sink_strays_now(&strays);
        }
    }

    #[cold]
    fn sink_strays_now(&self, strays: &[WorkCompletion]) {
        if let Some(sink) = &*self.stray_sink.read().unwrap_or_else(|p| p.into_inner()) {
            strays.iter().for_each(sink);
        }
    }

    /// Polls up to `budget` completions and runs their callbacks.
    ///
    /// A completion read alone that is the common case (see
    /// [`QpShared::retire_alone`]) is retired and its callback run here,
    /// in line, without this thread's list of finished requests, as long
    /// as that list is empty ([`LISTED`] false); anything else goes
    /// through the list, out of line.
    #[inline(always)]
    pub(crate) fn poll(&self, budget: usize) -> Result<usize> {
        if LISTED.get() {
            return self.poll_listed(budget);
        }
        let mut total = 0;
        while total < budget {
            let want = (budget - total).min(BATCH);
            let mut alone = MaybeUninit::uninit();
            match self.read(want, None, &mut alone)? {
                Read::Empty => break,
                Read::Alone => {
                    // SAFETY: `read` wrote the request there (it said so);
                    // it is run and then dropped (its MR with it), once.
                    unsafe { run_alone(&mut alone) };
                    total += 1;
                    if want > 1 {
                        break;
                    }
                }
                Read::Listed(n, strays) => return self.poll_read(n, strays, want, total, budget),
            }
        }
        Ok(total)
    }

    /// [`CqShared::poll`] after `n` completions that were not one lone
    /// completion were retired into this thread's list: their callbacks
    /// run, and the poll goes on through the list.
    #[inline(never)]
    fn poll_read(
        &self,
        n: usize,
        strays: Vec<WorkCompletion>,
        want: usize,
        total: usize,
        budget: usize,
    ) -> Result<usize> {
        self.sink_strays(strays);
        DONE.with(|d| {
            let mut out = d.borrow_mut();
            self.run_list(&mut out);
            let res = if n < want {
                Ok(total + n)
            } else {
                self.poll_into(budget, total + n, &mut out)
            };
            // Everything in the list ran (a panicking callback does not
            // get here: the flag stays with what it left).
            LISTED.set(false);
            res
        })
    }

    /// [`CqShared::poll`] while this thread's list may hold requests not
    /// run: a panicking callback's leftovers run first, in order; a poll
    /// from a callback (the list borrowed up the stack) uses a list of
    /// its own.
    #[cold]
    #[inline(never)]
    fn poll_listed(&self, budget: usize) -> Result<usize> {
        DONE.with(|d| match d.try_borrow_mut() {
            Ok(mut out) => {
                self.run_list(&mut out);
                let res = self.poll_into(budget, 0, &mut out);
                LISTED.set(false);
                res
            }
            Err(_) => self.poll_into(budget, 0, &mut Vec::new()),
        })
    }

    /// The poll loop over a list of finished requests (`out`): a lone
    /// completion is still retired without it while it is empty.
    fn poll_into(&self, budget: usize, mut total: usize, out: &mut Vec<Done>) -> Result<usize> {
        while total < budget {
            let want = (budget - total).min(BATCH);
            let mut alone = MaybeUninit::uninit();
            let read = self.read(want, Some(out), &mut alone);
            let n = match read {
                Ok(Read::Alone) => {
                    // SAFETY: as in `poll`.
                    unsafe { run_alone(&mut alone) };
                    total += 1;
                    if want > 1 {
                        break;
                    }
                    continue;
                }
                Ok(Read::Empty) => Ok(0),
                Ok(Read::Listed(n, strays)) => {
                    self.sink_strays(strays);
                    Ok(n)
                }
                Err(e) => Err(e),
            };
            self.run_list(out);
            let n = n?;
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }

    /// Runs the callbacks of the finished requests in `out`, in place (a
    /// request's resources go after all ran), and empties it; should one
    /// panic, the rest stay in this thread's list and run at its next
    /// poll.
    #[inline(never)]
    fn run_list(&self, out: &mut Vec<Done>) {
        for d in out.iter_mut() {
            d.call_back();
        }
        out.drain(..).for_each(Done::free);
    }

    /// Polls; if nothing came, arms the CQ, polls again (a completion may
    /// have arrived before the arming), and sleeps on the channel up to
    /// `timeout`; then polls what woke it.
    pub(crate) fn wait(&self, budget: usize, timeout: Option<Duration>) -> Result<usize> {
        let n = self.poll(budget)?;
        if n > 0 {
            return Ok(n);
        }
        self.cq.req_notify(false)?;
        let n = self.poll(budget)?;
        if n > 0 {
            return Ok(n);
        }
        if self.channel.get_cq_event(timeout)?.is_some() {
            self.cq.ack_events(1);
        }
        self.poll(budget)
    }
}

/// Runs the request retired alone into `slot` where it lies (its callback
/// called in place), then drops it (its MR goes).
///
/// # Safety
///
/// `slot` holds a request written by `retire_alone` and not run since;
/// it is consumed (the caller must treat it as uninitialized after, also
/// if the callback panics).
#[inline(always)]
unsafe fn run_alone(slot: &mut MaybeUninit<Alone>) {
    /// Drops the request once its callback returned or panicked.
    struct Free<'a>(&'a mut MaybeUninit<Alone>);
    impl Drop for Free<'_> {
        fn drop(&mut self) {
            // SAFETY: the slot holds the request (the contract), dropped
            // here once; `Alone::run` left its callback consumed.
            unsafe { self.0.assume_init_drop() }
        }
    }
    let free = Free(slot);
    // SAFETY: the slot holds the request (the contract).
    unsafe { free.0.assume_init_mut() }.run();
}

/// A completion queue whose completions run the callbacks of the requests
/// posted through the layer ([`UlpQp`](super::UlpQp)).
///
/// It has its own completion channel, so it can be polled directly (the
/// caller drives it with a budget: [`UlpCq::poll`]), waited on
/// ([`UlpCq::wait`]), or driven by a thread ([`CqWorker`](super::CqWorker),
/// [`CqPool`](super::CqPool)). Cheap to clone (shared).
#[derive(Clone)]
pub struct UlpCq {
    pub(crate) inner: Arc<CqShared>,
}

impl fmt::Debug for UlpCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UlpCq")
            .field("capacity", &self.inner.cq.capacity())
            .finish_non_exhaustive()
    }
}

impl UlpCq {
    /// A CQ of at least `cqe` entries on `ctx`, with a completion channel.
    ///
    /// # Errors
    ///
    /// Those of `create_comp_channel` and `create_cq`.
    ///
    /// # Examples
    ///
    /// ```
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let cq = softverbs::ulp::UlpCq::new(&ctx, 128)?;
    /// assert_eq!(cq.poll(16)?, 0);
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn new(ctx: &Context, cqe: u32) -> Result<UlpCq> {
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(cqe, 0, Some(&channel), 0)?;
        let soft = SoftLock::of_cq(&**cq.ops());
        Ok(UlpCq {
            inner: Arc::new(CqShared {
                cq,
                channel,
                ctx: ctx.clone(),
                poll: Guarded::new(
                    PollState {
                        wcs: vec![WorkCompletion::default(); BATCH],
                        qps: QpMap::default(),
                        last: None,
                        polled: 0,
                        callbacks: 0,
                    },
                    soft,
                ),
                committed: Mutex::new(0),
                stray: AtomicU64::new(0),
                stray_errors: AtomicU64::new(0),
                stray_sink: RwLock::new(None),
            }),
        })
    }

    /// The direct poll context: reads up to `budget` completions and runs
    /// the callbacks they finish, on this thread. Returns how many
    /// completions were read.
    ///
    /// # Errors
    ///
    /// `EIO` if the CQ failed (overrun, device failure).
    #[inline]
    pub fn poll(&self, budget: usize) -> Result<usize> {
        self.inner.poll(budget)
    }

    /// Like [`UlpCq::poll`], but sleeps on the completion channel up to
    /// `timeout` (`None`: forever) when nothing is there.
    ///
    /// # Errors
    ///
    /// As [`UlpCq::poll`]; the channel's errors.
    pub fn wait(&self, budget: usize, timeout: Option<Duration>) -> Result<usize> {
        self.inner.wait(budget, timeout)
    }

    /// Where completions that belong to no request go (besides being
    /// counted in [`CqStats`]).
    pub fn set_stray_sink(&self, sink: impl Fn(&WorkCompletion) + Send + Sync + 'static) {
        *self.inner.stray_sink.write().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(sink));
    }

    /// Counters.
    pub fn stats(&self) -> CqStats {
        let i = &self.inner;
        let (polled, callbacks) = i.with_poll(false, |st, _| (st.polled, st.callbacks));
        CqStats {
            polled,
            callbacks,
            stray: i.stray.load(Ordering::Relaxed),
            stray_errors: i.stray_errors.load(Ordering::Relaxed),
        }
    }

    /// Entries of the CQ not yet promised to a QP's queues.
    pub fn free_entries(&self) -> u32 {
        self.inner.cq.capacity() - *lock(&self.inner.committed)
    }

    /// The verbs CQ.
    pub fn cq(&self) -> &Cq {
        &self.inner.cq
    }

    /// The device context the CQ was created on.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}
