//! Queue pairs through the layer: the per-queue trackers that map
//! completions back to requests, send-queue budgets and reservations, the
//! READ/atomic depth cap, and draining on close.
//!
//! Here: the types (requests, the tracker), creation, counters and close.
//! By concern: [`budget`] (what a QP is created with, and the queue sizes
//! that follow), [`ring`] (the per-queue rings of posted WRs), [`post`]
//! (posting), [`retire`] (retiring completions into finished requests),
//! [`backlog`] (the READ-credit backlog and the posts that follow a
//! retirement).

mod backlog;
mod budget;
mod post;
mod retire;
mod ring;

pub use budget::{SqBudget, UlpQpInit};
use ring::{Ring, Slot};

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cb::Cb;
use super::cq::{CqShared, UlpCq};
use super::guard::Guarded;
use super::pool::PooledMr;
use super::wr::{Callback, Chain, Kept, LocalBuf, Sgl, UlpWr};
use crate::soft::SoftLock;
use crate::verbs::backend::{DeviceSection, QpOps};
use crate::verbs::{
    verr, Error, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, Result, SendOp, SendWr,
    Sge, WcOpcode, WcStatus, WorkCompletion,
};

/// `wr_id` bit saying the WR was posted to the receive queue (error
/// completions do not define their opcode, so the queue is in the id).
pub(crate) const RQ_BIT: u64 = 1 << 63;
/// Bits of the per-queue sequence number in a `wr_id`.
const SEQ_BITS: u32 = 48;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// The QP's epoch: 15 bits above the sequence, so that a completion of a
/// closed QP whose number was reused is not taken for one of the new QP.
const EPOCH_MASK: u64 = !(RQ_BIT | SEQ_MASK);

/// [`QpShared::rd_depth`] before the depth is known.
const RD_UNKNOWN: u32 = u32::MAX;

/// How long closing a QP waits for the device to flush what it has in
/// flight before completing the rest itself.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// A failed post: the error, and the callback, which was not called and
/// will not be (the request was not posted, or only a prefix of it was;
/// that prefix still retires inside the layer).
pub struct UlpPostError {
    /// Why.
    pub error: Error,
    /// The callback given with the request, uncalled.
    pub callback: Option<Callback>,
}

impl fmt::Debug for UlpPostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UlpPostError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for UlpPostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for UlpPostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<UlpPostError> for Error {
    fn from(e: UlpPostError) -> Error {
        e.error
    }
}

/// Counters of one QP (a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Requests accepted (posted or queued).
    pub requests: u64,
    /// Callbacks called.
    pub callbacks: u64,
    /// Callbacks dropped uncalled (unsignaled successes).
    pub silent: u64,
    /// Completions the layer made up: requests that were waiting in the
    /// layer (for READ credits) when the queue failed or the QP closed,
    /// and never reached the device; WRs retired by a later completion
    /// after the queue had failed (a device that gives no flush
    /// completion to unsignaled WRs); and WRs still outstanding when a
    /// close gave up waiting for the device.
    pub synthesized: u64,
    /// Requests that had to wait for READ/atomic credits.
    pub queued_rd: u64,
    /// READs/atomics posted and not retired now.
    pub rd_outstanding: u32,
    /// The most READs/atomics ever posted and not retired at once.
    pub rd_peak: u32,
    /// The READ/atomic depth in force (`max_rd_atomic`; 0 until known).
    pub rd_depth: u32,
    /// Send slots in use (posted, queued or reserved).
    pub sq_used: u32,
    /// Send slots the application and contexts may use (the queue less
    /// the drain slot).
    pub sq_cap: u32,
}

/// A finished request, run outside every lock.
pub(crate) struct Done {
    req: Req,
    wc: WorkCompletion,
    call: bool,
}

/// A request [`QpShared::retire_alone`] finished, with its completion, to
/// finish outside every lock ([`Alone::run`], where it lies: the poller
/// keeps it in its frame and the callback is called in place).
pub(crate) struct Alone {
    /// Consumed by [`Alone::run`] (called or dropped); an `Alone` dropped
    /// without running leaks its callback's captures, nothing worse.
    cb: std::mem::ManuallyDrop<Option<Cb>>,
    /// Whether the callback is to be called (a signaled request's; an
    /// unsignaled request's success drops it uncalled).
    call: bool,
    /// The request's MR, released when the `Alone` is dropped (after the
    /// callback ran).
    _mr: Option<Arc<Mr>>,
    wc: WorkCompletion,
}

/// A request: its callback and what it keeps alive until every WR of it
/// has retired and the callback has run. Kept small (it moves into its
/// slot and out to the poller): the common request (one WR over one
/// buffer) holds its callback inline and one MR, and allocates nothing;
/// what chains, contexts and errors need lives in [`Rare`].
struct Req {
    cb: Option<Cb>,
    /// The MR of a request of one WR over one buffer.
    mr: Option<Arc<Mr>>,
    rare: Option<Box<Rare>>,
    signaled: bool,
}

/// The less common part of a request.
#[derive(Default)]
struct Rare {
    /// The first error of a request of several WRs (a request of one WR
    /// completes with its own completion).
    first_err: Option<WorkCompletion>,
    /// WRs kept whole (chains, several buffers, registrations).
    keep: Vec<UlpWr>,
    pooled: Option<PooledMr>,
    /// Lazy invalidation: the key a LOCAL_INV posted after the request
    /// finished must invalidate before the pooled MR is reused (its slot
    /// is reserved with the request).
    lazy_inv: Option<u32>,
}

impl Req {
    fn new(cb: Option<Cb>, signaled: bool) -> Req {
        Req {
            cb,
            mr: None,
            rare: None,
            signaled,
        }
    }

    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Keeps what the posted `chain` needs alive: of a WR over one
    /// buffer, only its MR; of anything else, the WRs.
    fn keep(&mut self, chain: Chain) {
        match chain.into_one() {
            Ok(w) if self.mr.is_none() => match w.into_kept() {
                Kept::Mr(mr) => self.mr = mr,
                Kept::Whole(w) => self.rare().keep.push(w),
            },
            Ok(w) => self.rare().keep.push(w),
            Err(v) => {
                // The chain's own list is kept as it is when nothing else
                // is (no second list allocated).
                let r = self.rare();
                if r.keep.is_empty() {
                    r.keep = v;
                } else {
                    r.keep.extend(v);
                }
            }
        }
    }

    /// Marks the request's pooled MRs as never to be reused (they may
    /// still be valid).
    fn poison(&mut self) {
        if let Some(r) = &mut self.rare {
            r.pooled.iter_mut().for_each(PooledMr::poison);
        }
    }
}

/// A LOCAL_INV to post after a request finished (lazy invalidation), and
/// its request (no callback), which keeps what must live until it has
/// retired.
struct Followup {
    key: u32,
    req: Req,
}

/// A request waiting for READ/atomic credits (or behind one that does).
struct Queued {
    req: Req,
    chain: Chain,
    rd: u32,
}

struct Track {
    sq: Ring,
    rq: Ring,
    sq_cap: u32,
    sq_used: u32,
    rq_cap: u32,
    rq_used: u32,
    rd_out: u32,
    rd_peak: u32,
    backlog: VecDeque<Queued>,
    closing: bool,
    followups: Vec<Followup>,
    stats: QpStats,
}

pub(crate) struct QpShared {
    pub(crate) qp: Qp,
    pub(crate) qpn: u32,
    epoch: u64,
    /// Guarded by the device's lock when the QP and its CQs share one
    /// (the soft provider): then every post and poll takes one lock, the
    /// device's, for the verb and the layer's bookkeeping together.
    track: Guarded<Track>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    budget: SqBudget,
    qp_type: QpType,
    /// The READ/atomic depth in force (`max_rd_atomic`), given through
    /// [`UlpQp::modify`] or asked of the QP at the first READ; [`RD_UNKNOWN`]
    /// until then.
    rd_depth: AtomicU32,
}

impl Track {
    fn new(sq_cap: u32, rq_cap: u32) -> Track {
        Track {
            sq: Ring::new(sq_cap + 1),
            rq: Ring::new(rq_cap + 1),
            sq_cap,
            sq_used: 0,
            rq_cap,
            rq_used: 0,
            rd_out: 0,
            rd_peak: 0,
            backlog: VecDeque::new(),
            closing: false,
            followups: Vec::new(),
            stats: QpStats::default(),
        }
    }

    fn ring(&mut self, rq: bool) -> &mut Ring {
        if rq {
            &mut self.rq
        } else {
            &mut self.sq
        }
    }
}

impl QpShared {
    /// The verbs QP's backend object.
    #[inline]
    fn ops(&self) -> &dyn QpOps {
        &**self.qp.ops()
    }

    /// Runs `f` on the tracker, holding its guard (the device's lock, in a
    /// section of it, or the layer's own mutex), with the section through
    /// which to post. `f` must not call a verb of the device but through
    /// the section, nor drop what could (an MR, a callback): what it
    /// releases goes out to be dropped after.
    #[inline(always)]
    fn with_track<R>(&self, f: impl FnOnce(&mut Track, &mut dyn DeviceSection) -> R) -> R {
        self.track.with_qp(false, f)
    }

    /// [`QpShared::with_track`] for a caller already inside a section of
    /// the device (a poll of one of the QP's CQs), or of a QP guarded by
    /// its own mutex.
    ///
    /// # Safety
    ///
    /// If the tracker is guarded by the device's lock, the caller runs
    /// inside a section of that device and holds no other reference to
    /// this QP's tracker.
    #[inline(always)]
    unsafe fn with_track_in<R>(&self, f: impl FnOnce(&mut Track) -> R) -> R {
        // SAFETY: the caller's contract.
        unsafe { self.track.with_held(f) }
    }

    /// The READ/atomic depth in force, asked of the QP (a verb: never
    /// under the tracker's guard) if it is not known yet.
    fn rd_depth(&self) -> u32 {
        match self.rd_depth.load(Ordering::Relaxed) {
            RD_UNKNOWN => {
                let d = self.qp.query().map_or(1, |a| u32::from(a.max_rd_atomic).max(1));
                // A `modify` meanwhile wins.
                let _ = self
                    .rd_depth
                    .compare_exchange(RD_UNKNOWN, d, Ordering::Relaxed, Ordering::Relaxed);
                self.rd_depth.load(Ordering::Relaxed)
            }
            d => d,
        }
    }

    /// The READ/atomic depth to keep to, without asking the QP (under the
    /// tracker's guard: the depth is known once a READ was posted).
    fn rd_limit(&self) -> u32 {
        match self.rd_depth.load(Ordering::Relaxed) {
            RD_UNKNOWN => 1,
            d => d.max(1),
        }
    }

    fn is_idle(&self) -> bool {
        self.with_track(|t, _| t.sq.is_empty() && t.rq.is_empty() && t.backlog.is_empty())
    }
}

/// A queue pair whose work requests carry callbacks instead of ids.
///
/// Every request (a chain of one or more send WRs, or one receive) is
/// tracked in post order per queue; completions come back to it through
/// the [`UlpCq`]s it was created with:
///
/// - a **signaled** request ([`UlpQp::post`]) calls its callback once,
///   with the completion of its last WR, or with the first error of any of
///   its WRs;
/// - an **unsignaled** request ([`UlpQp::post_unsignaled`]) calls nothing
///   on success (its callback is dropped, uncalled, when a later
///   completion proves it done), and calls its callback once on error or
///   flush;
/// - every error and every flush calls the callback of every request it
///   completes, exactly once, whether the device gives each flushed WR a
///   completion (the soft provider, as the verbs contract says) or not
///   (the layer then completes the unsignaled WRs a later completion
///   retires after the queue failed with a flush of its own making);
/// - closing or dropping the QP moves it to ERR, posts a drain marker on
///   each queue and polls until everything was flushed: every callback
///   runs before the QP is gone; if the device cannot flush (removed), the
///   layer completes what remains with flushes of its own.
///
/// A callback runs on the thread that polls the CQ ([`UlpCq::poll`], a
/// [`CqWorker`](super::CqWorker), …) with no lock of the layer held: it
/// may post, and it may close QPs.
pub struct UlpQp {
    sh: Arc<QpShared>,
}

impl fmt::Debug for UlpQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UlpQp")
            .field("qpn", &self.sh.qpn)
            .finish_non_exhaustive()
    }
}

static EPOCH: AtomicU64 = AtomicU64::new(1);

/// A reservation of send-queue slots ([`UlpQp::reserve`]): while it lives
/// no other post can take them, so a chain posted with it
/// ([`UlpQp::post_reserved`]) always finds room. Unused slots go back on
/// drop.
#[derive(Debug)]
pub struct SqReservation<'a> {
    qp: &'a UlpQp,
    slots: u32,
}

impl SqReservation<'_> {
    /// Slots held.
    pub fn slots(&self) -> u32 {
        self.slots
    }
}

impl Drop for SqReservation<'_> {
    fn drop(&mut self) {
        if self.slots > 0 {
            let slots = self.slots;
            self.qp.sh.with_track(|t, _| t.sq_used -= slots);
        }
    }
}

impl UlpQp {
    /// Creates a QP of `init` whose send queue is sized by its
    /// [`SqBudget`] and whose completions go to `send_cq` and `recv_cq`
    /// (which must have room for both queues: the layer never lets a CQ
    /// overrun).
    ///
    /// # Errors
    ///
    /// Those of [`SqBudget::of`]; `EINVAL` if a CQ has fewer free entries
    /// than the queues need (saying how many it has), or if the device
    /// granted less than asked; the errors of `create_qp`.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::ulp::{UlpCq, UlpQp, UlpQpInit};
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = UlpCq::new(&ctx, 256)?;
    /// let qp = UlpQp::create(&pd, &cq, &cq, &UlpQpInit::default())?;
    /// assert_eq!(qp.budget().total, 64 + 1);
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn create(pd: &Pd, send_cq: &UlpCq, recv_cq: &UlpCq, init: &UlpQpInit) -> Result<UlpQp> {
        let ctx_budget = {
            // The PD's device: the CQ knows its context.
            SqBudget::of(send_cq.context(), init)?
        };
        let same = Arc::ptr_eq(&send_cq.inner, &recv_cq.inner);
        let (sq_need, rq_need) = (ctx_budget.total, ctx_budget.recv_total);
        if same {
            send_cq.inner.commit(sq_need + rq_need)?;
        } else {
            send_cq.inner.commit(sq_need)?;
            if let Err(e) = recv_cq.inner.commit(rq_need) {
                send_cq.inner.uncommit(sq_need);
                return Err(e);
            }
        }
        let uncommit = || {
            if same {
                send_cq.inner.uncommit(sq_need + rq_need);
            } else {
                send_cq.inner.uncommit(sq_need);
                recv_cq.inner.uncommit(rq_need);
            }
        };
        let cap = QpCap {
            max_send_wr: sq_need,
            max_recv_wr: rq_need,
            max_send_sge: init.max_send_sge.max(1),
            max_recv_sge: init.max_recv_sge.max(1),
            max_inline_data: init.max_inline_data,
        };
        let qp = match pd.create_qp(&QpInitAttr {
            qp_type: init.qp_type,
            send_cq: send_cq.inner.cq(),
            recv_cq: recv_cq.inner.cq(),
            srq: None,
            cap,
            sq_sig_all: false,
        }) {
            Ok(qp) => qp,
            Err(e) => {
                uncommit();
                return Err(e);
            }
        };
        let got = qp.cap();
        if got.max_send_wr < sq_need || got.max_recv_wr < rq_need {
            uncommit();
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the device granted {} send / {} receive WRs for {sq_need} / {rq_need} asked",
                got.max_send_wr,
                got.max_recv_wr
            ));
        }
        let qpn = qp.qp_num();
        let epoch = (EPOCH.fetch_add(1, Ordering::Relaxed) << SEQ_BITS) & EPOCH_MASK;
        // A soft QP's tracker is guarded by its engine lock, which must
        // also guard both CQs' poll state: posts take it through the QP,
        // polls through a CQ.
        let soft = SoftLock::of_qp(&**qp.ops());
        let alike = |cq: &UlpCq| SoftLock::alike(soft.as_ref(), cq.inner.soft_lock());
        if !alike(send_cq) || !alike(recv_cq) {
            // A CQ retires its QPs' requests under its own guard (inside
            // the engine lock for a soft CQ), where a QP's tracker is
            // reached taking only the QP's own mutex, if it has one: the
            // QP and both CQs must be guarded alike, by one engine lock
            // or each by a mutex of its own.
            uncommit();
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the QP and its CQs must be of one device"
            ));
        }
        let sh = Arc::new(QpShared {
            qp,
            qpn,
            epoch,
            track: Guarded::new(Track::new(sq_need - 1, rq_need - 1), soft),
            send_cq: send_cq.inner.clone(),
            recv_cq: recv_cq.inner.clone(),
            budget: ctx_budget,
            qp_type: init.qp_type,
            rd_depth: AtomicU32::new(RD_UNKNOWN),
        });
        send_cq.inner.attach(&sh);
        if !same {
            recv_cq.inner.attach(&sh);
        }
        Ok(UlpQp { sh })
    }

    /// The verbs QP (for `query`, and for what the layer does not wrap).
    /// Post only through the layer: a completion of a WR posted directly
    /// is not the layer's and is counted as a stray by the CQ.
    pub fn qp(&self) -> &Qp {
        &self.sh.qp
    }

    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.sh.qpn
    }

    /// The send-queue budget the QP was created with.
    pub fn budget(&self) -> SqBudget {
        self.sh.budget
    }

    /// Modifies the QP (`ibv_modify_qp`); the layer takes the negotiated
    /// READ/atomic initiator depth from `max_rd_atomic` when the mask has
    /// it.
    ///
    /// # Errors
    ///
    /// Those of [`Qp::modify`].
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.sh.qp.modify(attr, mask)?;
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            self.sh.rd_depth.store(u32::from(attr.max_rd_atomic), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.sh.with_track(|t, _| QpStats {
            rd_outstanding: t.rd_out,
            rd_peak: t.rd_peak,
            rd_depth: match self.sh.rd_depth.load(Ordering::Relaxed) {
                RD_UNKNOWN => 0,
                d => d,
            },
            sq_used: t.sq_used,
            sq_cap: t.sq_cap,
            ..t.stats
        })
    }

    /// Reserves `slots` send-queue slots.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if fewer are free, saying how many are; `EINVAL` on a
    /// closing QP.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::ulp::{UlpCq, UlpQp, UlpQpInit};
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = UlpCq::new(&ctx, 64)?;
    /// let qp = UlpQp::create(&pd, &cq, &cq, &UlpQpInit { send_wr: 4, recv_wr: 4, ..UlpQpInit::default() })?;
    /// let r = qp.reserve(3)?;
    /// assert!(qp.reserve(2).is_err()); // one left
    /// drop(r);
    /// assert!(qp.reserve(4).is_ok());
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn reserve(&self, slots: u32) -> Result<SqReservation<'_>> {
        self.sh.with_track(|t, _| {
            if t.closing {
                return Err(verr!(PostSend, InvalidArgument, "the QP is closing"));
            }
            let free = t.sq_cap - t.sq_used;
            if slots > free {
                return Err(verr!(
                    PostSend,
                    NoMemory,
                    "{slots} send slots asked, {free} of {} free",
                    t.sq_cap
                ));
            }
            t.sq_used += slots;
            Ok(())
        })?;
        Ok(SqReservation { qp: self, slots })
    }

    /// Moves the QP to ERR, flushes everything it has in flight (every
    /// callback runs, on this thread or a CQ's worker) and closes it. The
    /// same happens on drop; this returns how many completions the layer
    /// had to make up because the device gave none (a removed device).
    pub fn close(self) -> u64 {
        let before = self.sh.with_track(|t, _| t.stats.synthesized);
        close_shared(&self.sh);
        let after = self.sh.with_track(|t, _| t.stats.synthesized);
        after - before
    }
}

impl Drop for UlpQp {
    fn drop(&mut self) {
        close_shared(&self.sh);
    }
}

fn close_shared(sh: &Arc<QpShared>) {
    let mut out = Vec::new();
    let closed_before = sh.with_track(|t, _| {
        if t.closing {
            return true;
        }
        t.closing = true;
        // Requests that never reached the device flush now.
        while let Some(q) = t.backlog.pop_front() {
            t.flush_queued(sh, q, 0, &mut out);
        }
        false
    });
    if closed_before {
        return;
    }
    for d in out.drain(..) {
        d.run();
    }
    let _ = sh.qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    );
    // Drain markers: one signaled WR per queue, posted after everything
    // else, whose flush proves every earlier WR of the queue retired (the
    // slot was kept for it).
    let markers = sh.with_track(|t, sec| {
        let mut markers = true;
        if !t.sq.is_empty() && sh.qp_type != QpType::Ud {
            let seq = t.sq.next;
            let wr = SendWr::new(sh.epoch | seq, SendOp::Send, &[]).flags(crate::verbs::SendFlags::SIGNALED);
            if sec.post_send(sh.ops(), &[wr]).is_ok() {
                t.sq_used += 1;
                t.sq.push(None, 0, false);
            } else {
                markers = false;
            }
        }
        if !t.rq.is_empty() {
            let seq = t.rq.next;
            if sec
                .post_recv(sh.ops(), &[RecvWr::new(sh.epoch | RQ_BIT | seq, &[])])
                .is_ok()
            {
                t.rq_used += 1;
                t.rq.push(None, 0, false);
            } else {
                markers = false;
            }
        }
        markers
    });
    let deadline = Instant::now() + DRAIN_DEADLINE;
    let same = Arc::ptr_eq(&sh.send_cq, &sh.recv_cq);
    while !sh.is_idle() {
        let mut got = match sh.send_cq.poll(64) {
            Ok(n) => n,
            Err(_) => break,
        };
        if !same {
            got += match sh.recv_cq.poll(64) {
                Ok(n) => n,
                Err(_) => break,
            };
        }
        if got == 0 {
            // Without markers nothing more is known to come once the CQs
            // are empty (a removed device flushed all it had at once).
            if !markers || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let (sq, rq) = sh.with_track(|t, sec| {
        t.synthesize_all(sh.epoch, sh.qpn, &mut out);
        t.post_followups(sh, sec, &mut out);
        (t.sq_cap + 1, t.rq_cap + 1)
    });
    for d in out.drain(..) {
        d.run();
    }
    sh.send_cq.detach(sh.qpn);
    if same {
        sh.send_cq.uncommit(sq + rq);
    } else {
        sh.recv_cq.detach(sh.qpn);
        sh.send_cq.uncommit(sq);
        sh.recv_cq.uncommit(rq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// On the soft provider, a QP's tracker and its CQ's poll state are
    /// guarded by the device's own lock (the one its posts and polls take
    /// anyway), not by mutexes of the layer's.
    #[test]
    fn a_soft_qp_and_its_cq_are_guarded_by_the_device_lock() {
        let ctx = crate::soft::embedded_default().unwrap()[0].open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = UlpCq::new(&ctx, 256).unwrap();
        let qp = UlpQp::create(&pd, &cq, &cq, &UlpQpInit::default()).unwrap();
        let lock = SoftLock::of_qp(&**qp.sh.qp.ops());
        assert!(lock.is_some());
        assert!(qp.sh.track.soft().is_some());
        assert!(SoftLock::alike(qp.sh.track.soft(), lock.as_ref()));
        assert!(qp.sh.track.lock_own().is_none());
        assert!(SoftLock::alike(cq.inner.soft_lock(), lock.as_ref()));
    }

    /// A QP may not be served by a CQ of another device (on the soft
    /// provider `create_qp` refuses it; the layer also refuses a CQ
    /// guarded by another device's lock, under which its retirements would
    /// run unguarded), and a refused QP leaves nothing committed.
    #[test]
    fn a_qp_whose_cq_is_of_another_device_is_refused() {
        let devs = crate::soft::embedded_default().unwrap();
        let (c0, c1) = (devs[0].open().unwrap(), devs[1].open().unwrap());
        let pd = c1.alloc_pd().unwrap();
        let (cq0, cq1) = (UlpCq::new(&c0, 256).unwrap(), UlpCq::new(&c1, 256).unwrap());
        for (s, r) in [(&cq0, &cq1), (&cq1, &cq0), (&cq0, &cq0)] {
            assert!(UlpQp::create(&pd, s, r, &UlpQpInit::default()).is_err());
        }
        // Nothing stays committed on a CQ by a refused QP.
        assert_eq!(
            (cq0.free_entries(), cq1.free_entries()),
            (cq0.cq().capacity(), cq1.cq().capacity())
        );
    }

    /// The completion of the WR with sequence number `seq` on QP 7.
    fn wc(seq: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: seq,
            status,
            qp_num: 7,
            ..WorkCompletion::default()
        }
    }

    /// A device that gives no completion to unsignaled WRs, not even
    /// flushed ones (the other model the verbs contract allows in
    /// practice): the layer completes them itself, once, as flushed if
    /// the queue had failed before them and silently if not.
    #[test]
    fn unsignaled_wrs_without_completions_of_their_own_are_completed_by_the_layer() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut t = Track::new(16, 16);
        // r0 unsignaled, r1 signaled, r2 and r3 unsignaled, r4 signaled.
        let signaled = [false, true, false, false, true];
        for (k, &sig) in signaled.iter().enumerate() {
            let l = log.clone();
            let req = Req::new(
                Some(Cb::new(move |wc: &WorkCompletion| {
                    l.lock().unwrap().push((k, wc.status))
                })),
                sig,
            );
            t.sq.push(Some(req), 0, false);
            t.sq_used += 1;
        }
        let mut out = Vec::new();
        assert!(t.retire(false, &wc(1, WcStatus::Success), 7, &mut out));
        assert!(t.retire(false, &wc(2, WcStatus::RemAccessErr), 7, &mut out));
        // The device flushes only the signaled r4: r3 is retired with it.
        assert!(t.retire(false, &wc(4, WcStatus::WrFlushErr), 7, &mut out));
        // A completion for something already retired is not ours.
        assert!(!t.retire(false, &wc(4, WcStatus::WrFlushErr), 7, &mut out));
        for d in out {
            d.run();
        }
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                (1, WcStatus::Success),
                (2, WcStatus::RemAccessErr),
                (3, WcStatus::WrFlushErr),
                (4, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!((t.stats.silent, t.stats.synthesized, t.sq_used), (1, 1, 0));
    }

    /// A request of several WRs completes once, with the first error of
    /// any of them (not the flush of its last WR that followed it).
    #[test]
    fn a_chain_completes_once_with_its_first_error() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut t = Track::new(16, 16);
        let l = log.clone();
        let req = Req::new(
            Some(Cb::new(move |wc: &WorkCompletion| l.lock().unwrap().push(wc.status))),
            true,
        );
        // A chain of three WRs: the request is in its last WR's slot.
        t.sq.push(None, 2, false);
        t.sq.push(None, 1, false);
        t.sq.push(Some(req), 0, false);
        t.sq_used += 3;
        let mut out = Vec::new();
        assert!(t.retire(false, &wc(1, WcStatus::RemAccessErr), 7, &mut out));
        assert!(out.is_empty(), "the request has a WR left");
        assert!(t.retire(false, &wc(2, WcStatus::WrFlushErr), 7, &mut out));
        let calls: u32 = out.drain(..).map(|d| u32::from(d.run())).sum();
        assert_eq!((calls, log.lock().unwrap().clone()), (1, vec![WcStatus::RemAccessErr]));
        assert!(t.sq.is_empty() && t.sq_used == 0);
    }
}
