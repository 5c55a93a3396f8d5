//! Completion queues through the layer: polling turns completions into
//! callbacks.

use crate::sys::lock;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use super::qp::{Alone, Done, QpShared};
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
/// completion buffer and the QPs attached to the CQ, under one lock (a
/// poll takes it once; attaching and detaching a QP are rare).
struct PollState {
    wcs: Vec<WorkCompletion>,
    qps: QpMap,
    /// The QP of the last completion read (most runs of completions are
    /// of one QP: no map lookup for them).
    last: Option<Arc<QpShared>>,
    /// Completions read (counted under the lock: no atomic
    /// read-modify-write per poll).
    polled: u64,
    /// Callbacks called, counted when their completions are retired (just
    /// before they run, after the lock).
    callbacks: u64,
}

pub(crate) struct CqShared {
    // Field order: the CQ is destroyed before its channel.
    cq: Cq,
    channel: CompChannel,
    ctx: Context,
    poll: Mutex<PollState>,
    committed: Mutex<u32>,
    stray: AtomicU64,
    stray_errors: AtomicU64,
    stray_sink: RwLock<Option<StraySink>>,
}

impl CqShared {
    pub(crate) fn cq(&self) -> &Cq {
        &self.cq
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
        lock(&self.poll).qps.insert(qp.qp.qp_num(), qp.clone());
    }

    pub(crate) fn detach(&self, qpn: u32) {
        // Under the poll lock: no poller is between reading a completion
        // of this QP and retiring it.
        let mut st = lock(&self.poll);
        st.qps.remove(&qpn);
        if st.last.as_ref().is_some_and(|qp| qp.qpn == qpn) {
            st.last = None;
        }
    }

    /// Reads up to `want` completions and retires what they complete;
    /// the finished requests go to `out`. Returns how many were read.
    /// The one completion read, if it was the common case and `out` was
    /// empty, is retired alone into `alone` (with its completion), to be
    /// run by the caller, outside the lock.
    #[inline]
    fn poll_once(&self, want: usize, out: &mut Vec<Done>, alone: &mut Option<Alone>) -> Result<usize> {
        let mut st = lock(&self.poll);
        let st = &mut *st;
        let want = want.min(BATCH);
        let n = self.cq.poll(&mut st.wcs[..want])?;
        if n == 0 {
            return Ok(0);
        }
        st.polled += n as u64;
        if n == 1 && out.is_empty() {
            // One completion of the QP of the last one, the common case
            // of a shallow queue: no list of finished requests.
            if let Some(qp) = st.last.as_ref().filter(|qp| qp.qpn == st.wcs[0].qp_num) {
                *alone = qp.retire_alone(&st.wcs[0]);
                if let Some(a) = alone {
                    st.callbacks += u64::from(a.will_call());
                    return Ok(1);
                }
            }
        }
        Ok(self.retire_read(n, st, out))
    }

    /// Retires what the `n` completions read into `st` complete into
    /// `out`, and counts the callbacks to call.
    #[inline(never)]
    fn retire_read(&self, n: usize, st: &mut PollState, out: &mut Vec<Done>) -> usize {
        let PollState {
            wcs,
            qps,
            last,
            callbacks,
            ..
        } = st;
        let before = out.len();
        // A run of completions of one QP is retired under one lock of it.
        let mut i = 0;
        while i < n {
            let qpn = wcs[i].qp_num;
            if last.as_ref().is_none_or(|qp| qp.qpn != qpn) {
                *last = qps.get(&qpn).cloned();
            }
            let k = last.as_ref().map_or(0, |qp| qp.retire_run(&wcs[i..n], out));
            if k == 0 {
                self.count_stray(&wcs[i]);
                i += 1;
            }
            i += k;
        }
        *callbacks += out[before..].iter().filter(|d| d.will_call()).count() as u64;
        n
    }

    /// Counts a completion that names no request of the layer, and hands
    /// it to the sink if it is an error.
    #[cold]
    fn count_stray(&self, wc: &WorkCompletion) {
        self.stray.fetch_add(1, Ordering::Relaxed);
        if wc.status != WcStatus::Success {
            self.stray_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(sink) = &*self.stray_sink.read().unwrap_or_else(|p| p.into_inner()) {
                sink(wc);
            }
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
            let mut st = lock(&self.poll);
            let PollState {
                wcs,
                last,
                polled,
                callbacks,
                ..
            } = &mut *st;
            let n = self.cq.poll(&mut wcs[..want])?;
            if n == 0 {
                break;
            }
            *polled += n as u64;
            let alone = match last.as_ref() {
                Some(qp) if n == 1 && qp.qpn == wcs[0].qp_num => qp.retire_alone(&wcs[0]),
                _ => None,
            };
            let Some(mut alone) = alone else {
                return self.poll_read(st, n, want, total, budget);
            };
            *callbacks += u64::from(alone.will_call());
            drop(st);
            // Called where it lies; its MR goes when `alone` does.
            alone.run();
            total += 1;
            if want > 1 {
                break;
            }
        }
        Ok(total)
    }

    /// [`CqShared::poll`] of `n` completions read under `st` (the poll
    /// lock) that are not one lone completion: they are retired into this
    /// thread's list (a new one if a poll up the stack holds it), their
    /// callbacks run after the lock, and the poll goes on through the
    /// list.
    #[inline(never)]
    fn poll_read(
        &self,
        mut st: MutexGuard<'_, PollState>,
        n: usize,
        want: usize,
        total: usize,
        budget: usize,
    ) -> Result<usize> {
        DONE.with(|d| {
            let mut own = Vec::new();
            let mut list = d.try_borrow_mut();
            let thread = list.is_ok();
            let out = match &mut list {
                Ok(out) => &mut **out,
                Err(_) => &mut own,
            };
            if thread {
                LISTED.set(true);
            }
            self.retire_read(n, &mut st, out);
            drop(st);
            self.run_list(out);
            let res = if n < want {
                Ok(total + n)
            } else {
                self.poll_into(budget, total + n, out)
            };
            if thread {
                // Everything in the list ran (a panicking callback does
                // not get here: the flag stays with what it left).
                LISTED.set(false);
            }
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
            let mut alone = None;
            let n = self.poll_once(want, out, &mut alone);
            if let Some(alone) = &mut alone {
                // Called where it lies; its MR goes when `alone` does.
                alone.run();
                total += 1;
                if want > 1 {
                    break;
                }
                continue;
            }
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
        Ok(UlpCq {
            inner: Arc::new(CqShared {
                cq,
                channel,
                ctx: ctx.clone(),
                poll: Mutex::new(PollState {
                    wcs: vec![WorkCompletion::default(); BATCH],
                    qps: QpMap::default(),
                    last: None,
                    polled: 0,
                    callbacks: 0,
                }),
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
        let (polled, callbacks) = {
            let st = lock(&i.poll);
            (st.polled, st.callbacks)
        };
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
