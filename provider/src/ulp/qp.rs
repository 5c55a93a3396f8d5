//! Queue pairs through the layer: the per-queue trackers that map
//! completions back to requests, send-queue budgets and reservations, the
//! READ/atomic depth cap, and draining on close.

use crate::sys::lock;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::cb::Cb;
use super::cq::{CqShared, UlpCq};
use super::pool::PooledMr;
use super::wr::{Callback, Chain, Kept, LocalBuf, Sgl, UlpWr};
use crate::verbs::{
    verr, Context, Error, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, Result, SendOp,
    SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
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

/// How long closing a QP waits for the device to flush what it has in
/// flight before completing the rest itself.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// What to create a QP with through the layer ([`UlpQp::create`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UlpQpInit {
    /// Transport (RC for read/write contexts).
    pub qp_type: QpType,
    /// Send WRs the application posts itself at once (each WR of each
    /// request it posts with [`UlpQp::post`]).
    pub send_wr: u32,
    /// Receive WRs the application posts at once.
    pub recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// Read/write contexts ([`UlpQp::rw`], [`UlpQp::expose`]) in flight at
    /// once.
    pub rw_ctxs: u32,
    /// Local scatter entries of one read/write context at most.
    pub rw_max_sges: u32,
    /// Whether the read/write contexts may use fast registration (false
    /// where the backend has none: [`RwCaps::fast_reg`](super::RwCaps)).
    pub rw_fast_reg: bool,
}

impl Default for UlpQpInit {
    fn default() -> Self {
        UlpQpInit {
            qp_type: QpType::Rc,
            send_wr: 64,
            recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            rw_ctxs: 0,
            rw_max_sges: 1,
            rw_fast_reg: false,
        }
    }
}

/// The send-queue slots a QP created through the layer needs, and where
/// they go. No figure is ever clamped: if the device cannot give
/// `total`, creation fails and says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SqBudget {
    /// The application's own send WRs.
    pub app_wrs: u32,
    /// Read/write contexts in flight at once.
    pub rw_ctxs: u32,
    /// WRs one read/write context may take (the "MR factor"): a fast
    /// registration chain is REG_MR + op + LOCAL_INV (3); a plain one is
    /// one op WR per `max_send_sge` local entries.
    pub mr_factor: u32,
    /// The slot kept for the drain marker posted when the QP closes.
    pub drain: u32,
    /// Send queue depth asked of the device:
    /// `app_wrs + rw_ctxs × mr_factor + drain`.
    pub total: u32,
    /// Receive queue depth asked of the device (the application's
    /// receives + 1 drain marker).
    pub recv_total: u32,
}

impl SqBudget {
    /// The budget of `init` on the device behind `ctx`.
    ///
    /// # Errors
    ///
    /// `EINVAL` naming what the device can give if the send or receive
    /// queue, or the scatter/gather entries, exceed its limits.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::ulp::{SqBudget, UlpQpInit};
    /// let ctx = softverbs::soft::embedded_default()?[0].open()?;
    /// let init = UlpQpInit { send_wr: 16, rw_ctxs: 8, rw_max_sges: 8, max_send_sge: 4, rw_fast_reg: true, ..UlpQpInit::default() };
    /// let b = SqBudget::of(&ctx, &init)?;
    /// // 8 sges over 4-entry WRs: 2 plain WRs, but a fast-registration chain is 3.
    /// assert_eq!((b.mr_factor, b.total), (3, 16 + 8 * 3 + 1));
    /// let huge = UlpQpInit { send_wr: 1 << 30, ..init };
    /// assert!(SqBudget::of(&ctx, &huge).unwrap_err().to_string().contains("at most"));
    /// # Ok::<(), softverbs::verbs::Error>(())
    /// ```
    pub fn of(ctx: &Context, init: &UlpQpInit) -> Result<SqBudget> {
        let attr = ctx.query_device()?;
        let send_sge = init.max_send_sge.max(1);
        if send_sge > attr.max_sge || init.max_recv_sge > attr.max_sge {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "{} send / {} receive scatter entries asked; the device gives at most {}",
                send_sge,
                init.max_recv_sge,
                attr.max_sge
            ));
        }
        // A READ's local entries are bounded by max_sge_rd too.
        let per_wr = send_sge.min(attr.max_sge_rd.max(1));
        let plain = init.rw_max_sges.max(1).div_ceil(per_wr);
        let mr_factor = if init.rw_ctxs == 0 {
            0
        } else if init.rw_fast_reg {
            plain.max(3)
        } else {
            plain
        };
        let ctx_slots = u64::from(init.rw_ctxs) * u64::from(mr_factor);
        let total = u64::from(init.send_wr) + ctx_slots + 1;
        if total > u64::from(attr.max_qp_wr) {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the send queue needs {total} WRs ({} application + {} contexts × {mr_factor} + 1 drain) but the device gives at most {}",
                init.send_wr,
                init.rw_ctxs,
                attr.max_qp_wr
            ));
        }
        let recv_total = u64::from(init.recv_wr) + 1;
        if recv_total > u64::from(attr.max_qp_wr) {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "the receive queue needs {recv_total} WRs ({} application + 1 drain) but the device gives at most {}",
                init.recv_wr,
                attr.max_qp_wr
            ));
        }
        Ok(SqBudget {
            app_wrs: init.send_wr,
            rw_ctxs: init.rw_ctxs,
            mr_factor,
            drain: 1,
            total: total as u32,
            recv_total: recv_total as u32,
        })
    }
}

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
    /// Completions the layer made up: WRs retired by a later completion
    /// after the queue had failed (a device that gives no flush
    /// completion to unsignaled WRs), and WRs still outstanding when a
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

impl Done {
    /// A request whose resources are released without a callback.
    fn release(req: Req) -> Done {
        Done {
            req,
            wc: WorkCompletion::default(),
            call: false,
        }
    }

    /// Calls the callback if it is to be called, taking it (it runs at
    /// most once); what the request keeps goes when the `Done` is dropped.
    /// Returns whether a callback ran.
    #[inline]
    pub(crate) fn call_back(&mut self) -> bool {
        if !self.call {
            return false;
        }
        match self.req.cb.take() {
            Some(cb) => {
                cb.call(&self.wc);
                true
            }
            None => false,
        }
    }

    /// Releases what the request keeps (after [`Done::call_back`]): the
    /// common request's parts are dropped in line, its rare part only if
    /// it has one.
    #[inline]
    pub(crate) fn free(self) {
        let Req { cb, mr, rare, .. } = self.req;
        if cb.is_some() {
            drop(cb);
        }
        drop(mr);
        if let Some(rare) = rare {
            drop(rare);
        }
    }

    /// Calls the callback (if it is to be called), then releases the
    /// request's resources. Returns whether a callback ran.
    pub(crate) fn run(self) -> bool {
        let Done { req, wc, call } = self;
        let Req { cb, mr, rare, .. } = req;
        let ran = match cb {
            Some(cb) if call => {
                cb.call(&wc);
                true
            }
            _ => false,
        };
        drop((mr, rare));
        ran
    }
}

/// A request [`QpShared::retire_alone`] finished, to finish outside every
/// lock.
pub(crate) struct Alone {
    cb: Option<Cb>,
    /// Whether the callback is to be called (a signaled request's; an
    /// unsignaled request's success drops it uncalled).
    call: bool,
    mr: Option<Arc<Mr>>,
}

impl Alone {
    /// Calls the callback with `wc` if it is to be called, then releases
    /// what the request kept. Returns whether a callback ran.
    #[inline]
    pub(crate) fn run(self, wc: &WorkCompletion) -> bool {
        let Alone { cb, call, mr } = self;
        let ran = match cb {
            Some(cb) if call => {
                cb.call(wc);
                true
            }
            cb => {
                drop(cb);
                false
            }
        };
        drop(mr);
        ran
    }
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
            Err(v) => self.rare().keep.extend(v),
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

/// One posted WR of a queue, not retired yet.
#[derive(Default)]
struct Slot {
    /// The request, in the slot of its last posted WR (none in the slots
    /// of the chain's earlier WRs, nor in a drain marker's).
    req: Option<Req>,
    /// Of an earlier WR of a chain: how many slots ahead the slot holding
    /// its request is.
    ahead: u32,
    /// Whether the WR holds a READ/atomic credit.
    rd: bool,
}

/// The WRs of one queue posted and not retired, in post order: a ring
/// indexed by the sequence number each WR's `wr_id` carries, so a
/// completion finds its WR, and the request in it, without a lookup. The
/// layer never has more WRs posted than the queue holds; the ring grows
/// (by doubling) only up to that.
struct Ring {
    slots: Box<[Slot]>,
    mask: u64,
    /// Sequence number of the oldest WR not retired.
    head: u64,
    /// Sequence number of the next WR posted.
    next: u64,
    /// Whether a completion of the queue had an error: a later WR without
    /// a completion of its own was flushed.
    err: bool,
}

impl Ring {
    /// A ring for a queue of `depth` WRs (it starts smaller and grows).
    fn new(depth: u32) -> Ring {
        Ring::with_len(depth.clamp(1, 64).next_power_of_two() as usize)
    }

    fn with_len(len: usize) -> Ring {
        Ring {
            slots: (0..len).map(|_| Slot::default()).collect(),
            mask: len as u64 - 1,
            head: 0,
            next: 0,
            err: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.head == self.next
    }

    /// Whether `seq` names a WR posted and not retired.
    fn holds(&self, seq: u64) -> bool {
        seq.wrapping_sub(self.head) < self.next - self.head
    }

    fn slot(&mut self, seq: u64) -> &mut Slot {
        &mut self.slots[(seq & self.mask) as usize]
    }

    /// Records the next WR as posted (taking the next sequence number).
    #[inline]
    fn push(&mut self, req: Option<Req>, ahead: u32, rd: bool) {
        if self.next - self.head == self.slots.len() as u64 {
            self.grow();
        }
        let seq = self.next;
        let s = self.slot(seq);
        // The slot was emptied when its last WR retired (`pop`): nothing
        // to drop there (should it hold a request, it leaks, no worse).
        debug_assert!(s.req.is_none());
        std::mem::forget(std::mem::replace(&mut s.req, req));
        s.ahead = ahead;
        s.rd = rd;
        self.next = seq + 1;
    }

    #[cold]
    fn grow(&mut self) {
        let mut bigger = Ring::with_len(self.slots.len() * 2);
        bigger.head = self.head;
        bigger.next = self.next;
        bigger.err = self.err;
        for seq in self.head..self.next {
            *bigger.slot(seq) = std::mem::take(self.slot(seq));
        }
        *self = bigger;
    }

    /// Takes the oldest WR out.
    #[inline]
    fn pop(&mut self) -> Slot {
        let seq = self.head;
        self.head = seq + 1;
        let s = self.slot(seq);
        Slot {
            req: s.req.take(),
            ahead: s.ahead,
            rd: s.rd,
        }
    }
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
    rd_depth: u32,
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
    track: Mutex<Track>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    budget: SqBudget,
    qp_type: QpType,
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
            rd_depth: 0,
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

    /// Request `req` finished: `wc` is its last WR's completion (or the
    /// first error of any of its WRs, kept in it). It goes to `out`, to
    /// run outside the lock.
    #[inline]
    fn finish(&mut self, req: Req, wc: &WorkCompletion, out: &mut Vec<Done>) {
        if req.rare.is_some() {
            return self.finish_rare(req, wc, out);
        }
        let call = req.signaled || wc.status != WcStatus::Success;
        match (&req.cb, call) {
            (Some(_), true) => self.stats.callbacks += 1,
            (Some(_), false) => self.stats.silent += 1,
            (None, _) => {}
        }
        out.push(Done { req, wc: *wc, call });
    }

    /// [`Track::finish`] of a request with a first error, a lazy
    /// invalidation or kept WRs.
    #[inline(never)]
    fn finish_rare(&mut self, mut req: Req, wc: &WorkCompletion, out: &mut Vec<Done>) {
        let mut first_err = None;
        if let Some(r) = &mut req.rare {
            first_err = r.first_err.take();
            if let Some(key) = r.lazy_inv.take() {
                // The LOCAL_INV's own request takes over what this one
                // kept (the pooled MR goes back when it has retired).
                let mut inv = Req::new(None, true);
                inv.mr = req.mr.take();
                inv.rare = req.rare.take();
                self.followups.push(Followup { key, req: inv });
            }
        }
        let (wc, call) = match first_err {
            Some(err) => (err, true),
            None => (*wc, req.signaled || wc.status != WcStatus::Success),
        };
        match (&req.cb, call) {
            (Some(_), true) => self.stats.callbacks += 1,
            (Some(_), false) => self.stats.silent += 1,
            (None, _) => {}
        }
        out.push(Done { req, wc, call });
    }

    /// Retires the oldest WR of a queue with `wc`.
    #[inline(always)]
    fn retire_oldest(&mut self, rq: bool, wc: &WorkCompletion, out: &mut Vec<Done>) {
        let Slot { req, ahead, rd } = self.ring(rq).pop();
        if rq {
            self.rq_used -= 1;
        } else {
            self.sq_used -= 1;
        }
        if rd {
            self.rd_out -= 1;
        }
        match req {
            Some(req) => self.finish(req, wc, out),
            None if ahead > 0 && wc.status != WcStatus::Success => {
                // An earlier WR of a chain failed: the request, further
                // on, completes with the first error of its WRs.
                let q = self.ring(rq);
                let at = q.head - 1 + u64::from(ahead);
                if let Some(r) = q.slot(at).req.as_mut() {
                    r.rare().first_err.get_or_insert(*wc);
                }
            }
            None => {}
        }
    }

    /// Retires the WRs of one queue up to the one `wc` completes. Returns
    /// false if `wc` names no outstanding WR of this queue.
    #[inline(always)]
    fn retire(&mut self, rq: bool, wc: &WorkCompletion, qpn: u32, out: &mut Vec<Done>) -> bool {
        let seq = wc.wr_id & SEQ_MASK;
        let q = self.ring(rq);
        if seq == q.head && !q.is_empty() && wc.status == WcStatus::Success {
            // The common case: the oldest WR, completed successfully.
            self.retire_oldest(rq, wc, out);
            return true;
        }
        self.retire_walk(rq, wc, qpn, out)
    }

    /// [`Track::retire`] of anything but the oldest WR's success: a
    /// completion after unsignaled WRs, an error, a stray.
    #[inline(never)]
    fn retire_walk(&mut self, rq: bool, wc: &WorkCompletion, qpn: u32, out: &mut Vec<Done>) -> bool {
        let seq = wc.wr_id & SEQ_MASK;
        let q = self.ring(rq);
        if !q.holds(seq) {
            return false;
        }
        let failed_before = q.err;
        loop {
            let head = self.ring(rq).head;
            if head == seq {
                self.retire_oldest(rq, wc, out);
                break;
            }
            // An earlier WR without a completion of its own: completions
            // of a queue come in post order, so it succeeded unsignaled,
            // unless the queue had already failed (a device that flushes
            // only signaled WRs): then it was flushed.
            let implied = WorkCompletion {
                wr_id: head | self_epoch_bits(wc.wr_id) | if rq { RQ_BIT } else { 0 },
                status: if failed_before {
                    WcStatus::WrFlushErr
                } else {
                    WcStatus::Success
                },
                opcode: if rq { WcOpcode::Recv } else { WcOpcode::Send },
                qp_num: qpn,
                ..WorkCompletion::default()
            };
            if failed_before {
                self.stats.synthesized += 1;
            }
            self.retire_oldest(rq, &implied, out);
        }
        if wc.status != WcStatus::Success {
            self.ring(rq).err = true;
        }
        true
    }

    /// Completes every outstanding WR of both queues with a made-up flush
    /// (a close that could not get them from the device).
    fn synthesize_all(&mut self, epoch: u64, qpn: u32, out: &mut Vec<Done>) {
        for rq in [false, true] {
            while !self.ring(rq).is_empty() {
                let seq = self.ring(rq).head;
                self.stats.synthesized += 1;
                let wc = flush_wc(epoch | seq | if rq { RQ_BIT } else { 0 }, qpn, 0);
                self.retire_oldest(rq, &wc, out);
            }
        }
    }

    /// Posts one plain WR over one buffer ([`Chain::plain_one`]) for
    /// [`UlpQp::submit`]: the verbs WR is built straight from it, and no
    /// READ credit or backlog applies (it neither is a READ nor fenced).
    /// On success the slot is taken and the request counted; the caller
    /// puts the request in the ring's next slot (the WR's). On an error
    /// nothing was posted.
    #[inline]
    fn post_plain(&mut self, sh: &QpShared, w: &UlpWr, b: &LocalBuf, signaled: bool, reserved: u32) -> Result<()> {
        if self.closing {
            return Err(verr!(PostSend, InvalidArgument, "the QP is closing"));
        }
        let need = 1 - reserved.min(1);
        let free = self.sq_cap - self.sq_used;
        if need > free {
            let cap = self.sq_cap;
            return Err(verr!(
                PostSend,
                NoMemory,
                "a chain of 1 WRs (+0 for its invalidation) needs {need} send slots; {free} of {cap} free"
            ));
        }
        let sge = [b.sge()];
        let wr = w.send_wr(sh.epoch | self.sq.next, &sge, signaled);
        sh.qp.post_send(std::slice::from_ref(&wr)).map_err(|e| e.error)?;
        self.sq_used += need;
        self.stats.requests += 1;
        Ok(())
    }

    /// The request of the WR posted last (after a chain was posted only
    /// in part, its prefix holds the request).
    fn last_posted(&mut self) -> Option<&mut Req> {
        let last = self.sq.next.wrapping_sub(1);
        self.sq.slot(last).req.as_mut()
    }

    /// Posts `chain` of `req` now; the request goes in the slot of its
    /// last posted WR. On a rejected WR, the prefix before it stays
    /// tracked (the request with it); returns the error, and the request
    /// back if nothing was posted.
    fn post_now(&mut self, sh: &QpShared, mut req: Req, chain: Chain) -> std::result::Result<(), (Error, Option<Req>)> {
        let n = chain.len();
        let base = self.sq.next;
        let res = {
            let ws = chain.as_slice();
            let signaled = req.signaled;
            if n == 1 {
                // One WR (the common case): no list of lists, and a single
                // local entry stays on the stack.
                let w = &ws[0];
                let one;
                let many;
                let sges: &[Sge<'_>] = if w.frmr_sge.is_none() && w.inline.is_none() && w.sgl.len() == 1 {
                    one = [w.sgl[0].sge()];
                    &one
                } else {
                    many = w.sges();
                    &many
                };
                let wr = w.send_wr(sh.epoch | base, sges, signaled);
                sh.qp.post_send(std::slice::from_ref(&wr))
            } else {
                let sges: Vec<Vec<Sge<'_>>> = ws.iter().map(UlpWr::sges).collect();
                let wrs: Vec<SendWr<'_>> = ws
                    .iter()
                    .zip(&sges)
                    .enumerate()
                    .map(|(k, (w, s))| w.send_wr(sh.epoch | (base + k as u64), s, signaled && k + 1 == n))
                    .collect();
                sh.qp.post_send(&wrs)
            }
        };
        let posted = match &res {
            Ok(()) => n,
            Err(e) => e.index.min(n),
        };
        for (k, w) in chain.iter().enumerate().take(posted) {
            let rd = w.is_rd_atomic();
            self.sq.push(None, (posted - 1 - k) as u32, rd);
            if rd {
                self.rd_out += 1;
            }
        }
        self.rd_peak = self.rd_peak.max(self.rd_out);
        req.keep(chain);
        if posted > 0 {
            self.sq.slot(base + posted as u64 - 1).req = Some(req);
            match res {
                Ok(()) => Ok(()),
                Err(e) => {
                    self.sq_used -= (n - posted) as u32;
                    Err((e.error, None))
                }
            }
        } else {
            self.sq_used -= n as u32;
            let error = match res {
                Err(e) => e.error,
                Ok(()) => verr!(PostSend, InvalidArgument, "an empty chain"),
            };
            Err((error, Some(req)))
        }
    }

    /// Posts the LOCAL_INVs of lazily invalidated requests (signaled, no
    /// callback: their MRs go back to the pool when they retire). On a
    /// failed or closing QP the MRs, which may still be valid, are
    /// discarded instead.
    #[inline(never)]
    fn post_followups(&mut self, sh: &QpShared, out: &mut Vec<Done>) {
        for f in std::mem::take(&mut self.followups) {
            let Followup { key, mut req } = f;
            if self.sq.err || self.closing {
                self.sq_used -= 1;
                req.poison();
                out.push(Done::release(req));
                continue;
            }
            // A single WR is posted whole or not at all: on an error the
            // request comes back.
            if let Err((_, Some(mut req))) = self.post_now(sh, req, UlpWr::local_inv(key).into()) {
                req.poison();
                out.push(Done::release(req));
            }
        }
    }

    /// Posts queued requests while READ/atomic credits allow; on a failed
    /// queue (or a closing QP) completes them with a flush instead.
    #[inline(never)]
    fn pump(&mut self, sh: &QpShared, out: &mut Vec<Done>) {
        while let Some(q) = self.backlog.front() {
            let dead = self.sq.err || self.closing;
            if !dead && q.rd > 0 && self.rd_out > 0 && self.rd_out + q.rd > self.rd_depth.max(1) {
                break;
            }
            let q = self.backlog.pop_front().expect("front exists");
            if dead {
                self.flush_queued(sh, q, 0, out);
                continue;
            }
            if let Err((e, unposted)) = self.post_now(sh, q.req, q.chain) {
                // The request completes once with a flush carrying the
                // errno (after its posted prefix, if any, retires).
                let wc = flush_wc(sh.epoch | self.sq.next, sh.qpn, e.errno() as u32);
                match unposted {
                    Some(mut req) => {
                        req.rare().first_err.get_or_insert(wc);
                        self.stats.synthesized += 1;
                        self.finish(req, &wc, out);
                    }
                    None => {
                        if let Some(req) = self.last_posted() {
                            req.rare().first_err.get_or_insert(wc);
                        }
                    }
                }
            }
        }
    }

    fn flush_queued(&mut self, sh: &QpShared, q: Queued, vendor_err: u32, out: &mut Vec<Done>) {
        let Queued { mut req, chain, .. } = q;
        self.sq_used -= chain.len() as u32;
        self.stats.synthesized += 1;
        let wc = flush_wc(sh.epoch | self.sq.next, sh.qpn, vendor_err);
        req.keep(chain);
        self.finish(req, &wc, out);
    }
}

fn self_epoch_bits(wr_id: u64) -> u64 {
    wr_id & EPOCH_MASK
}

fn flush_wc(wr_id: u64, qpn: u32, vendor_err: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        vendor_err,
        qp_num: qpn,
        ..WorkCompletion::default()
    }
}

impl QpShared {
    #[inline]
    fn track(&self) -> MutexGuard<'_, Track> {
        lock(&self.track)
    }

    /// Retires `wc`, a poll's only completion, if it is the common case:
    /// the success of its queue's oldest WR, which holds a request without
    /// a rare part, with nothing queued behind READ credits and no
    /// invalidation to post. Returns the request's callback, whether it is
    /// to be called, and its MR, to be released outside every lock; `None`
    /// (and nothing changed) for anything else, which
    /// [`QpShared::retire_run`] handles.
    #[inline]
    pub(crate) fn retire_alone(&self, wc: &WorkCompletion) -> Option<Alone> {
        if wc.qp_num != self.qpn || wc.wr_id & EPOCH_MASK != self.epoch || wc.status != WcStatus::Success {
            return None;
        }
        let mut t = self.track();
        if !t.backlog.is_empty() || !t.followups.is_empty() {
            return None;
        }
        let rq = wc.wr_id & RQ_BIT != 0;
        let q = t.ring(rq);
        let seq = wc.wr_id & SEQ_MASK;
        if seq != q.head || q.is_empty() || q.slot(seq).req.as_ref().is_none_or(|r| r.rare.is_some()) {
            return None;
        }
        let Slot { req, rd, .. } = q.pop();
        let Req { cb, mr, signaled, .. } = req?;
        if rq {
            t.rq_used -= 1;
        } else {
            t.sq_used -= 1;
        }
        if rd {
            t.rd_out -= 1;
        }
        if cb.is_some() {
            if signaled {
                t.stats.callbacks += 1;
            } else {
                t.stats.silent += 1;
            }
        }
        Some(Alone { cb, call: signaled, mr })
    }

    /// Retires what the leading completions of `wcs` (read by the CQ under
    /// its poll lock) of this QP complete, under one lock of the QP.
    /// Returns how many it retired: it stops at the first completion of
    /// another QP, or one that names nothing of this QP (the caller counts
    /// that one as stray and goes on after it).
    pub(crate) fn retire_run(&self, wcs: &[WorkCompletion], out: &mut Vec<Done>) -> usize {
        let mut t = self.track();
        let mut sent = false;
        let mut n = 0;
        for wc in wcs {
            let rq = wc.wr_id & RQ_BIT != 0;
            if wc.qp_num != self.qpn || wc.wr_id & EPOCH_MASK != self.epoch || !t.retire(rq, wc, self.qpn, out) {
                break;
            }
            sent |= !rq;
            n += 1;
        }
        if sent && !t.backlog.is_empty() {
            t.pump(self, out);
        }
        if !t.followups.is_empty() {
            t.post_followups(self, out);
        }
        n
    }

    fn is_idle(&self) -> bool {
        let t = self.track();
        t.sq.is_empty() && t.rq.is_empty() && t.backlog.is_empty()
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
            self.qp.sh.track().sq_used -= self.slots;
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
        let sh = Arc::new(QpShared {
            qp,
            qpn,
            epoch,
            track: Mutex::new(Track::new(sq_need - 1, rq_need - 1)),
            send_cq: send_cq.inner.clone(),
            recv_cq: recv_cq.inner.clone(),
            budget: ctx_budget,
            qp_type: init.qp_type,
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
            self.sh.track().rd_depth = u32::from(attr.max_rd_atomic);
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        let t = self.sh.track();
        QpStats {
            rd_outstanding: t.rd_out,
            rd_peak: t.rd_peak,
            rd_depth: t.rd_depth,
            sq_used: t.sq_used,
            sq_cap: t.sq_cap,
            ..t.stats
        }
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
        let mut t = self.sh.track();
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
        Ok(SqReservation { qp: self, slots })
    }

    /// Posts a signaled request: the WRs of `chain` in one `post_send`,
    /// only the last one signaled; `cb` is called once with the last WR's
    /// completion, or with the first error or flush of any of them.
    ///
    /// READs and atomics beyond the QP's `max_rd_atomic` are queued in the
    /// layer and posted as earlier ones complete (a fenced request waits
    /// behind them too).
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the send queue has no room for the chain (see
    /// [`UlpQp::reserve`]), the post's own errors; the callback comes back
    /// in the error, uncalled.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(qp: &softverbs::ulp::UlpQp, buf: softverbs::ulp::LocalBuf) -> Result<(), softverbs::ulp::UlpPostError> {
    /// use softverbs::ulp::UlpWr;
    /// qp.post(vec![UlpWr::send(vec![buf])], |wc| println!("send done: {:?}", wc.status))?;
    /// # Ok(()) }
    /// ```
    pub fn post(
        &self,
        chain: impl Into<Chain>,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<(), UlpPostError> {
        self.submit(chain.into(), Some(Cb::new(cb)), true, 0, None, None)
    }

    /// Posts an unsignaled request: `cb` is called only if a WR of the
    /// chain fails or is flushed (once); on success it is dropped
    /// uncalled once a later completion of the queue proves the chain
    /// done.
    ///
    /// # Errors
    ///
    /// As [`UlpQp::post`].
    pub fn post_unsignaled(
        &self,
        chain: impl Into<Chain>,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<(), UlpPostError> {
        self.submit(chain.into(), Some(Cb::new(cb)), false, 0, None, None)
    }

    /// [`UlpQp::post`] (or, with `signaled` false,
    /// [`UlpQp::post_unsignaled`]) into slots reserved before: posting
    /// cannot fail for want of room if the chain fits the reservation.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the chain is longer than the reservation; the post's
    /// own errors.
    pub fn post_reserved(
        &self,
        mut res: SqReservation<'_>,
        chain: impl Into<Chain>,
        signaled: bool,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<(), UlpPostError> {
        let chain = chain.into();
        let cb = Cb::new(cb);
        if !std::ptr::eq(res.qp, self) || chain.len() as u32 > res.slots {
            return Err(UlpPostError {
                error: verr!(
                    PostSend,
                    InvalidArgument,
                    "a chain of {} WRs does not fit a reservation of {} slots of this QP",
                    chain.len(),
                    res.slots
                ),
                callback: Some(cb.into_boxed()),
            });
        }
        let slots = std::mem::take(&mut res.slots);
        // Slots the chain does not use go back now.
        let unused = slots - chain.len() as u32;
        if unused > 0 {
            self.sh.track().sq_used -= unused;
        }
        let n = chain.len() as u32;
        self.submit(chain, Some(cb), signaled, n, None, None)
    }

    #[inline]
    pub(crate) fn submit(
        &self,
        chain: Chain,
        cb: Option<Cb>,
        signaled: bool,
        reserved: u32,
        pooled: Option<PooledMr>,
        lazy_inv: Option<u32>,
    ) -> std::result::Result<(), UlpPostError> {
        if pooled.is_none() && lazy_inv.is_none() {
            if let Some((w, b)) = chain.plain_one() {
                let sh = &*self.sh;
                // The short path: post and track under one lock, the
                // request straight into its WR's slot of the ring.
                let mut t = sh.track();
                if let Err(error) = t.post_plain(sh, w, b, signaled, reserved) {
                    t.sq_used -= reserved;
                    drop(t);
                    // Nothing was posted; the chain (and its MR) drops
                    // here, outside the lock.
                    return Err(UlpPostError {
                        error,
                        callback: cb.map(Cb::into_boxed),
                    });
                }
                let req = Req {
                    cb,
                    mr: chain.into_plain_mr(),
                    rare: None,
                    signaled,
                };
                t.sq.push(Some(req), 0, false);
                return Ok(());
            }
        }
        self.submit_general(chain, cb, signaled, reserved, pooled, lazy_inv)
    }

    /// [`UlpQp::submit`] of anything but one plain WR over one buffer:
    /// READ credits, the backlog, chains, registrations.
    #[inline(never)]
    fn submit_general(
        &self,
        chain: Chain,
        cb: Option<Cb>,
        signaled: bool,
        reserved: u32,
        pooled: Option<PooledMr>,
        lazy_inv: Option<u32>,
    ) -> std::result::Result<(), UlpPostError> {
        let sh = &*self.sh;
        let ws = chain.as_slice();
        let n = ws.len() as u32;
        let (rd, fenced) = ws.iter().fold((0u32, false), |(rd, f), w| {
            (rd + u32::from(w.is_rd_atomic()), f || w.is_fenced())
        });
        let mut t = sh.track();
        let fail = |t: &mut Track, error: Error, cb: Option<Cb>| {
            t.sq_used -= reserved;
            Err(UlpPostError {
                error,
                callback: cb.map(Cb::into_boxed),
            })
        };
        if n == 0 {
            return fail(&mut t, verr!(PostSend, InvalidArgument, "an empty chain"), cb);
        }
        if t.closing {
            return fail(&mut t, verr!(PostSend, InvalidArgument, "the QP is closing"), cb);
        }
        // A lazily invalidated request also holds the slot of the
        // LOCAL_INV posted when it finishes.
        let extra = u32::from(lazy_inv.is_some());
        let need = n + extra - reserved.min(n + extra);
        let free = t.sq_cap - t.sq_used;
        if need > free {
            let cap = t.sq_cap;
            return fail(
                &mut t,
                verr!(
                    PostSend,
                    NoMemory,
                    "a chain of {n} WRs (+{extra} for its invalidation) needs {need} send slots; {free} of {cap} free"
                ),
                cb,
            );
        }
        t.sq_used += need;
        if rd > 0 && t.rd_depth == 0 {
            // The depth was not given through `modify`: ask the QP once.
            t.rd_depth = sh.qp.query().map(|a| u32::from(a.max_rd_atomic)).unwrap_or(0).max(1);
        }
        let mut req = Req::new(cb, signaled);
        if pooled.is_some() || lazy_inv.is_some() {
            let r = req.rare();
            r.pooled = pooled;
            r.lazy_inv = lazy_inv;
        }
        t.stats.requests += 1;
        let must_wait =
            (!t.backlog.is_empty() && (rd > 0 || fenced)) || (rd > 0 && t.rd_out > 0 && t.rd_out + rd > t.rd_depth);
        if must_wait {
            t.stats.queued_rd += 1;
            t.backlog.push_back(Queued { req, chain, rd });
            return Ok(());
        }
        match t.post_now(sh, req, chain) {
            Ok(()) => Ok(()),
            Err((error, unposted)) => {
                // Fast-registration MRs of a half-posted chain may be left
                // valid: never reuse them.
                let cb = match unposted {
                    Some(mut req) => {
                        // Nothing was posted: what the request kept is
                        // released outside the lock.
                        t.stats.requests -= 1;
                        t.sq_used -= extra;
                        drop(t);
                        req.poison();
                        req.cb.take()
                    }
                    // The posted prefix retires inside the layer, without
                    // the callback.
                    None => t.last_posted().and_then(|req| {
                        req.poison();
                        req.cb.take()
                    }),
                };
                Err(UlpPostError {
                    error,
                    callback: cb.map(Cb::into_boxed),
                })
            }
        }
    }

    /// Posts a receive of `sgl`; `cb` is called once with its completion
    /// (receives are always signaled), flush included.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the application's receive slots are all posted; the
    /// post's own errors. The callback comes back uncalled.
    pub fn post_recv(
        &self,
        sgl: impl Into<Sgl>,
        cb: impl FnOnce(&WorkCompletion) + Send + 'static,
    ) -> std::result::Result<(), UlpPostError> {
        let sgl = sgl.into();
        let cb = Cb::new(cb);
        let sh = &*self.sh;
        let mut t = sh.track();
        if t.closing {
            return Err(UlpPostError {
                error: verr!(PostRecv, InvalidArgument, "the QP is closing"),
                callback: Some(cb.into_boxed()),
            });
        }
        if t.rq_used >= t.rq_cap {
            return Err(UlpPostError {
                error: verr!(PostRecv, NoMemory, "all {} receive slots are posted", t.rq_cap),
                callback: Some(cb.into_boxed()),
            });
        }
        let seq = t.rq.next;
        // One buffer (the common case) stays on the stack.
        let one;
        let many: Vec<Sge<'_>>;
        let sges: &[Sge<'_>] = if sgl.len() == 1 {
            one = [sgl[0].sge()];
            &one
        } else {
            many = sgl.iter().map(LocalBuf::sge).collect();
            &many
        };
        if let Err(e) = sh.qp.post_recv(&[RecvWr::new(sh.epoch | RQ_BIT | seq, sges)]) {
            return Err(UlpPostError {
                error: e.error,
                callback: Some(cb.into_boxed()),
            });
        }
        let mut req = Req::new(Some(cb), true);
        req.keep(UlpWr::send(sgl).into());
        t.stats.requests += 1;
        t.rq_used += 1;
        t.rq.push(Some(req), 0, false);
        Ok(())
    }

    /// Moves the QP to ERR, flushes everything it has in flight (every
    /// callback runs, on this thread or a CQ's worker) and closes it. The
    /// same happens on drop; this returns how many completions the layer
    /// had to make up because the device gave none (a removed device).
    pub fn close(self) -> u64 {
        let before = self.sh.track().stats.synthesized;
        close_shared(&self.sh);
        let after = self.sh.track().stats.synthesized;
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
    {
        let mut t = sh.track();
        if t.closing {
            return;
        }
        t.closing = true;
        // Requests that never reached the device flush now.
        while let Some(q) = t.backlog.pop_front() {
            t.flush_queued(sh, q, 0, &mut out);
        }
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
    let mut markers = true;
    {
        let mut t = sh.track();
        if !t.sq.is_empty() && sh.qp_type != QpType::Ud {
            let seq = t.sq.next;
            let wr = SendWr::new(sh.epoch | seq, SendOp::Send, &[]).flags(crate::verbs::SendFlags::SIGNALED);
            if sh.qp.post_send(&[wr]).is_ok() {
                t.sq_used += 1;
                t.sq.push(None, 0, false);
            } else {
                markers = false;
            }
        }
        if !t.rq.is_empty() {
            let seq = t.rq.next;
            if sh.qp.post_recv(&[RecvWr::new(sh.epoch | RQ_BIT | seq, &[])]).is_ok() {
                t.rq_used += 1;
                t.rq.push(None, 0, false);
            } else {
                markers = false;
            }
        }
    }
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
    {
        let mut t = sh.track();
        t.synthesize_all(sh.epoch, sh.qpn, &mut out);
        t.post_followups(sh, &mut out);
    }
    for d in out.drain(..) {
        d.run();
    }
    sh.send_cq.detach(sh.qpn);
    let t = sh.track();
    let (sq, rq) = (t.sq_cap + 1, t.rq_cap + 1);
    drop(t);
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
        let wc = |seq: u64, status| WorkCompletion {
            wr_id: seq,
            status,
            qp_num: 7,
            ..WorkCompletion::default()
        };
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
        let wc = |seq: u64, status| WorkCompletion {
            wr_id: seq,
            status,
            qp_num: 7,
            ..WorkCompletion::default()
        };
        let mut out = Vec::new();
        assert!(t.retire(false, &wc(1, WcStatus::RemAccessErr), 7, &mut out));
        assert!(out.is_empty(), "the request has a WR left");
        assert!(t.retire(false, &wc(2, WcStatus::WrFlushErr), 7, &mut out));
        let calls: u32 = out.drain(..).map(|d| u32::from(d.run())).sum();
        assert_eq!((calls, log.lock().unwrap().clone()), (1, vec![WcStatus::RemAccessErr]));
        assert!(t.sq.is_empty() && t.sq_used == 0);
    }
}
