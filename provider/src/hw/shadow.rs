//! The shadow of posted work requests: what the device still owes a
//! completion for, so that when a device goes away every posted work
//! request still completes exactly once (docs/design.md §5).
//!
//! A removed device completes nothing more: its queues are gone with it.
//! So each QP keeps, per queue, a ring of the work requests posted and not
//! yet completed — `(wr_id, opcode, signaled)`; the queue is the ring's —
//! maintained on the post path and retired as real completions are polled.
//! Once the device is revoked, a CQ's poll returns the real completions
//! first and then, when the CQ has none left, what the rings still hold as
//! `WR_FLUSH_ERR`, in post order, send queue before receive queue, QP by QP
//! in creation order. A real completion that arrives for a work request
//! already flushed (a late hardware flush) is dropped, so nothing completes
//! twice.
//!
//! # The ring
//!
//! One single-producer single-consumer ring per queue, sized to the QP's
//! granted capacity rounded up to a power of two (so it is full exactly when
//! the provider's queue would be; posting beyond it fails with `ENOMEM`, as
//! the provider would). Slots are two arrays of atomics (`wr_id`, and one
//! byte of opcode and flags), so there is no `unsafe` and nothing is
//! allocated after creation.
//!
//! - **Producer**: posting, serialised by the queue's post lock (which also
//!   keeps the ring in the order the provider received the work requests,
//!   when several threads post to one QP). Per chunk of work requests it
//!   writes the slots, *publishes* `tail` before calling the provider (a
//!   completion can be polled before the call returns, and must find its
//!   entry), and *settles* after it: entries the provider refused become
//!   void, and `committed` moves to `tail` — flushing only ever takes
//!   committed entries, so a work request whose post failed is never
//!   flushed too.
//! - **Consumer**: polling, under the lock of the CQ the queue completes on
//!   (one CQ per queue, so one consumer at a time). A completion retires its
//!   entry and every entry before it: for the send queue the first entry
//!   from `head` with the completion's `wr_id` that is signaled (a success;
//!   unsignaled work requests before it completed silently) or any (an
//!   error, which is reported whatever the flag); for the receive queue the
//!   first with that `wr_id` (normally `head` itself).
//!
//! Which queue a completion belongs to: its opcode for a success; for an
//! error (whose opcode is undefined) the queue whose CQ this is if the QP's
//! queues use different CQs, otherwise the receive queue if its oldest entry
//! has that `wr_id`, else the send queue. With both queues on one CQ and the
//! same `wr_id` in both this can pick the wrong one; the `wr_id`s reported
//! are the same either way.
//!
//! The locks are spin locks (one atomic exchange to take, a plain store to
//! release), held around the provider call like the provider's own.
//!
//! The cost on the fast path — one lock per post call and per poll call,
//! two stores per work request, a lookup and a short scan per completion —
//! is measured by the `shadow_fast_path_cost` benchmark (`shadow/tests.rs`)
//! against a fake provider that completes every send at once: on the
//! development VM, one signaled send posted and polled costs 30.3 ns without
//! the shadow and 38.7 ns with it (+8.4 ns); in batches of 16, 19.3 ns and
//! 23.7 ns per work request (+4.4 ns). Counted by valgrind, +117 and +83
//! instructions per work request. A real device's post (with its doorbell
//! write) and poll cost several times the fake's.
//!
//! # Limits
//!
//! - Completions must be polled through this backend (a CQ polled directly
//!   through its C pointer leaves the rings behind).
//! - Receives of an SRQ are not shadowed: like the soft provider, a removal
//!   leaves them in the SRQ.
//! - An unsignaled send that completed after the last signaled completion
//!   polled cannot be told from one still queued: a removal reports it
//!   flushed (its success was never visible to the application either).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use rdma_sys::ibv_wc;

use super::convert;
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion};

/// Completions fetched per provider poll call (an array of this many
/// `ibv_wc` lives on the stack: 768 bytes).
pub(crate) const POLL_CHUNK: usize = 16;

/// Slot flag: the work request asked for a completion (receives always do).
const SIGNALED: u8 = 0x80;
/// Slot flag: the provider refused the work request; skip it.
const VOID: u8 = 0x40;
/// Slot bits holding the opcode.
const OP: u8 = 0x0f;

/// A spin lock: one atomic exchange to take, one plain release store to
/// give back (a `Mutex` pays a second atomic read-modify-write on unlock).
/// Held only around a provider call and some ring updates; a waiter spins
/// briefly, then yields.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, and one guard exists
// at a time (the `locked` flag, taken with Acquire and given back with
// Release, orders every access): like Mutex<T>, Sync if T is Send.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.swap(true, Ordering::Acquire) {
            self.lock_slow();
        }
        SpinGuard { lock: self }
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 128 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if !self.locked.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

/// A held [`SpinLock`].
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard is the one holder of the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the one holder of the lock.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// The 4-bit code of a completion opcode in a slot.
#[inline]
const fn op_code(op: WcOpcode) -> u8 {
    match op {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        WcOpcode::RegMr => 7,
        WcOpcode::Recv => 8,
        WcOpcode::RecvRdmaWithImm => 9,
    }
}

/// The opcode a slot records.
fn op_of(meta: u8) -> WcOpcode {
    match meta & OP {
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        3 => WcOpcode::CompSwap,
        4 => WcOpcode::FetchAdd,
        5 => WcOpcode::BindMw,
        6 => WcOpcode::LocalInv,
        7 => WcOpcode::RegMr,
        8 => WcOpcode::Recv,
        9 => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

/// The posted, uncompleted work requests of one queue (see the module
/// documentation for who may call what).
pub(crate) struct Ring {
    ids: Box<[AtomicU64]>,
    meta: Box<[AtomicU8]>,
    mask: u64,
    /// First entry not retired (consumer).
    head: AtomicU64,
    /// One past the last entry written (producer; published before the
    /// provider is called).
    tail: AtomicU64,
    /// One past the last entry whose post outcome is known (producer).
    committed: AtomicU64,
}

impl Ring {
    /// A ring for at least `capacity` outstanding work requests.
    pub(crate) fn new(capacity: u32) -> Ring {
        let cap = u64::from(capacity.max(1)).next_power_of_two();
        Ring {
            ids: (0..cap).map(|_| AtomicU64::new(0)).collect(),
            meta: (0..cap).map(|_| AtomicU8::new(0)).collect(),
            mask: cap - 1,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            committed: AtomicU64::new(0),
        }
    }

    /// How many entries it holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Entries posted (or being posted) and not retired, void ones included.
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        tail.saturating_sub(self.head.load(Ordering::Acquire)) as usize
    }

    #[inline]
    fn slot(&self, pos: u64) -> usize {
        (pos & self.mask) as usize
    }

    // ----- consumer side (under the lock of the queue's CQ) -----

    /// Retires through the first live entry from `head` that has `wr_id`
    /// (and is signaled, if `need_signaled`). `false` if there is none.
    #[inline(always)]
    fn retire(&self, wr_id: u64, need_signaled: bool) -> bool {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        // The common case: the oldest entry.
        if head < tail {
            let i = self.slot(head);
            let m = self.meta[i].load(Ordering::Relaxed);
            if m & VOID == 0 && self.ids[i].load(Ordering::Relaxed) == wr_id && (!need_signaled || m & SIGNALED != 0) {
                self.head.store(head + 1, Ordering::Release);
                return true;
            }
        }
        self.retire_scan(head + 1, tail, wr_id, need_signaled)
    }

    /// [`Ring::retire`] past the oldest entry (unsignaled work requests
    /// before a signaled one).
    #[inline(never)]
    fn retire_scan(&self, from: u64, tail: u64, wr_id: u64, need_signaled: bool) -> bool {
        let mut pos = from;
        while pos < tail {
            let i = self.slot(pos);
            let m = self.meta[i].load(Ordering::Relaxed);
            if m & VOID == 0 && self.ids[i].load(Ordering::Relaxed) == wr_id && (!need_signaled || m & SIGNALED != 0) {
                self.head.store(pos + 1, Ordering::Release);
                return true;
            }
            pos += 1;
        }
        false
    }

    /// Whether the oldest live entry has `wr_id`.
    fn oldest_is(&self, wr_id: u64) -> bool {
        let tail = self.tail.load(Ordering::Acquire);
        let mut pos = self.head.load(Ordering::Relaxed);
        while pos < tail {
            let i = self.slot(pos);
            if self.meta[i].load(Ordering::Relaxed) & VOID == 0 {
                return self.ids[i].load(Ordering::Relaxed) == wr_id;
            }
            pos += 1;
        }
        false
    }

    /// Retires committed entries into `out` as `WR_FLUSH_ERR` completions
    /// of QP `qpn`, oldest first; returns how many were written.
    fn flush_into(&self, qpn: u32, out: &mut [WorkCompletion]) -> usize {
        let end = self.committed.load(Ordering::Acquire);
        let mut pos = self.head.load(Ordering::Relaxed);
        let mut n = 0;
        while pos < end && n < out.len() {
            let i = self.slot(pos);
            let m = self.meta[i].load(Ordering::Relaxed);
            if m & VOID == 0 {
                out[n] = WorkCompletion {
                    wr_id: self.ids[i].load(Ordering::Relaxed),
                    status: WcStatus::WrFlushErr,
                    opcode: op_of(m),
                    qp_num: qpn,
                    ..WorkCompletion::default()
                };
                n += 1;
            }
            pos += 1;
        }
        if pos > self.head.load(Ordering::Relaxed) {
            self.head.store(pos, Ordering::Release);
        }
        n
    }

    /// Live committed entries not retired (what a flush would return).
    #[cfg(test)]
    fn pending(&self) -> usize {
        let end = self.committed.load(Ordering::Acquire);
        let mut pos = self.head.load(Ordering::Relaxed);
        let mut n = 0;
        while pos < end {
            if self.meta[self.slot(pos)].load(Ordering::Relaxed) & VOID == 0 {
                n += 1;
            }
            pos += 1;
        }
        n
    }
}

/// One queue (send or receive) of a QP: its post lock and its ring.
pub(crate) struct QueueShadow {
    post: SpinLock<()>,
    ring: Ring,
}

impl QueueShadow {
    fn new(capacity: u32) -> QueueShadow {
        QueueShadow {
            post: SpinLock::new(()),
            ring: Ring::new(capacity),
        }
    }

    /// Takes the post lock: the one producer of the ring.
    #[inline]
    pub(crate) fn producer(&self) -> Producer<'_> {
        let guard = self.post.lock();
        let tail = self.ring.tail.load(Ordering::Relaxed);
        Producer {
            ring: &self.ring,
            _lock: guard,
            tail,
            batch: tail,
        }
    }

    /// The ring (for inspection).
    #[cfg(test)]
    pub(crate) fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Forgets every entry (the QP went to RESET, where the device forgets
    /// them too): under the post lock and the consumer side of `cq`, the CQ
    /// this queue completes on.
    pub(crate) fn reset(&self, cq: &CqShadow) {
        let _post = self.post.lock();
        let tail = self.ring.tail.load(Ordering::Relaxed);
        cq.with_consumer(|| {
            self.ring.committed.store(tail, Ordering::Release);
            self.ring.head.store(tail, Ordering::Release);
        });
    }
}

/// The producer of a ring: holds the queue's post lock.
pub(crate) struct Producer<'a> {
    ring: &'a Ring,
    _lock: SpinGuard<'a, ()>,
    /// Next position to write.
    tail: u64,
    /// First position of the batch not yet settled.
    batch: u64,
}

impl Producer<'_> {
    /// How many entries the ring holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// How many more entries fit.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        let head = self.ring.head.load(Ordering::Acquire);
        self.ring.capacity() - (self.tail - head.min(self.tail)) as usize
    }

    /// Records a work request of the current batch (not visible to pollers
    /// until [`Producer::publish`]). The caller checked [`Producer::room`].
    #[inline]
    pub(crate) fn push(&mut self, wr_id: u64, op: WcOpcode, signaled: bool) {
        debug_assert!(self.room() > 0, "push into a full ring");
        let i = self.ring.slot(self.tail);
        self.ring.ids[i].store(wr_id, Ordering::Relaxed);
        let flags = if signaled { SIGNALED } else { 0 };
        self.ring.meta[i].store(op_code(op) | flags, Ordering::Relaxed);
        self.tail += 1;
    }

    /// Makes the batch visible to completions, before the provider call.
    #[inline]
    pub(crate) fn publish(&self) {
        self.ring.tail.store(self.tail, Ordering::Release);
    }

    /// After the provider call: the first `posted` entries of the batch were
    /// posted, the rest are void; the whole batch becomes flushable.
    #[inline]
    pub(crate) fn settle(&mut self, posted: usize) {
        let mut pos = self.batch + posted as u64;
        while pos < self.tail {
            self.ring.meta[self.ring.slot(pos)].store(VOID, Ordering::Relaxed);
            pos += 1;
        }
        self.ring.tail.store(self.tail, Ordering::Release);
        self.ring.committed.store(self.tail, Ordering::Release);
        self.batch = self.tail;
    }
}

impl Drop for Producer<'_> {
    fn drop(&mut self) {
        if self.batch != self.tail {
            // Not settled (a bug upstream): count the batch as posted, so
            // that it is flushed rather than lost.
            self.settle((self.tail - self.batch) as usize);
        }
    }
}

/// The shadow of one QP: its send ring and (without an SRQ) its receive
/// ring.
pub(crate) struct QpShadow {
    qpn: u32,
    seq: u64,
    send: QueueShadow,
    recv: Option<QueueShadow>,
}

impl QpShadow {
    /// The shadow of QP `qpn` (the `seq`-th of its device), with rings for
    /// `max_send_wr` and `max_recv_wr` (`None`: it receives through an SRQ).
    pub(crate) fn new(qpn: u32, seq: u64, max_send_wr: u32, max_recv_wr: Option<u32>) -> Arc<QpShadow> {
        Arc::new(QpShadow {
            qpn,
            seq,
            send: QueueShadow::new(max_send_wr),
            recv: max_recv_wr.map(QueueShadow::new),
        })
    }

    /// The QP number.
    #[cfg(test)]
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The send queue.
    pub(crate) fn send(&self) -> &QueueShadow {
        &self.send
    }

    /// The receive queue (`None` with an SRQ).
    pub(crate) fn recv(&self) -> Option<&QueueShadow> {
        self.recv.as_ref()
    }
}

/// How a CQ polls now (from the device's state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PollMode {
    /// Call the provider (false once the device's objects are inert).
    pub(crate) reach_device: bool,
    /// The device was revoked: drop real completions already flushed.
    pub(crate) revoked: bool,
    /// Flush what the rings hold once the real completions are drained.
    pub(crate) flush: bool,
}

impl PollMode {
    /// A live device.
    pub(crate) const LIVE: PollMode = PollMode {
        reach_device: true,
        revoked: false,
        flush: false,
    };
}

/// A QP queue completing on a CQ.
struct Attached {
    qp: Arc<QpShadow>,
    /// This CQ is the QP's send CQ.
    send: bool,
    /// This CQ is the QP's receive CQ (and the QP has a receive ring).
    recv: bool,
    /// This CQ is the receive CQ of a QP that receives through an SRQ.
    srq_recv: bool,
}

/// What retiring a real completion found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retired {
    /// It completed a shadowed work request.
    Matched,
    /// No shadowed work request matches (already flushed, or not ours).
    Unmatched,
    /// Not shadowed at all (an unknown QP, an SRQ receive).
    Untracked,
}

/// The QPs whose queues complete on one CQ.
#[derive(Default)]
struct Track {
    /// Sorted by QP number (a binary search per poll call: QPs come and
    /// go rarely, completions often).
    qps: Vec<Attached>,
}

impl Track {
    #[inline]
    fn get(&self, qpn: u32) -> Option<&Attached> {
        self.qps
            .binary_search_by_key(&qpn, |a| a.qp.qpn)
            .ok()
            .map(|i| &self.qps[i])
    }

    /// Retires the work request `w` completes; `a` is its QP's entry.
    #[inline(always)]
    fn retire(a: Option<&Attached>, w: &WorkCompletion) -> Retired {
        let Some(a) = a else {
            return Retired::Untracked;
        };
        let matched = if w.status != WcStatus::Success {
            return Track::retire_error(a, w);
        } else if matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            match (&a.qp.recv, a.recv) {
                (Some(q), true) => q.ring.retire(w.wr_id, false),
                _ => return Retired::Untracked,
            }
        } else {
            a.send && a.qp.send.ring.retire(w.wr_id, true)
        };
        if matched {
            Retired::Matched
        } else {
            Retired::Unmatched
        }
    }

    /// [`Track::retire`] for an error completion, whose opcode is undefined.
    #[cold]
    fn retire_error(a: &Attached, w: &WorkCompletion) -> Retired {
        let qp = &a.qp;
        let recv = qp.recv.as_ref().filter(|_| a.recv).map(|q| &q.ring);
        let send = a.send.then_some(&qp.send.ring);
        let matched = match (send, recv) {
            (Some(s), None) => s.retire(w.wr_id, false),
            (None, Some(r)) => r.retire(w.wr_id, false),
            (Some(s), Some(r)) => {
                if r.oldest_is(w.wr_id) {
                    r.retire(w.wr_id, false)
                } else {
                    s.retire(w.wr_id, false) || r.retire(w.wr_id, false)
                }
            }
            (None, None) => false,
        };
        if matched {
            Retired::Matched
        } else if a.srq_recv || (send.is_none() && recv.is_none()) {
            // Possibly an SRQ receive's error, which no ring holds.
            Retired::Untracked
        } else {
            Retired::Unmatched
        }
    }

    /// Fills `out` with flushes: QP by QP in creation order, send queue
    /// then receive queue, each in post order.
    fn flush_into(&self, out: &mut [WorkCompletion]) -> usize {
        let mut order: Vec<&Attached> = self.qps.iter().collect();
        order.sort_by_key(|a| a.qp.seq);
        let mut n = 0;
        for a in order {
            if n == out.len() {
                break;
            }
            if a.send {
                n += a.qp.send.ring.flush_into(a.qp.qpn, &mut out[n..]);
            }
            if a.recv {
                if let Some(r) = &a.qp.recv {
                    n += r.ring.flush_into(a.qp.qpn, &mut out[n..]);
                }
            }
        }
        n
    }
}

/// The CQ's side of the shadow: which QP queues complete on it, and its
/// poll loop.
#[derive(Default)]
pub(crate) struct CqShadow {
    track: SpinLock<Track>,
}

impl CqShadow {
    /// A CQ with no QPs.
    pub(crate) fn new() -> CqShadow {
        CqShadow::default()
    }

    /// `qp`'s send queue (`send`) and/or receive queue (`recv`) complete on
    /// this CQ.
    pub(crate) fn attach(&self, qp: &Arc<QpShadow>, send: bool, recv: bool) {
        let srq_recv = recv && qp.recv.is_none();
        let recv = recv && qp.recv.is_some();
        let mut t = self.track.lock();
        let i = match t.qps.binary_search_by_key(&qp.qpn, |a| a.qp.qpn) {
            Ok(i) => i,
            Err(i) => {
                t.qps.insert(
                    i,
                    Attached {
                        qp: qp.clone(),
                        send: false,
                        recv: false,
                        srq_recv: false,
                    },
                );
                i
            }
        };
        let a = &mut t.qps[i];
        a.qp = qp.clone();
        a.send |= send;
        a.recv |= recv;
        a.srq_recv |= srq_recv;
    }

    /// QP `qpn` is gone (destroyed): its queues no longer complete here.
    pub(crate) fn detach(&self, qpn: u32) {
        let mut t = self.track.lock();
        if let Ok(i) = t.qps.binary_search_by_key(&qpn, |a| a.qp.qpn) {
            t.qps.remove(i);
        }
    }

    /// Runs `f` with the consumer side held (nothing retires meanwhile).
    pub(crate) fn with_consumer<R>(&self, f: impl FnOnce() -> R) -> R {
        let _t = self.track.lock();
        f()
    }

    /// Work requests a flush of this CQ would return now.
    #[cfg(test)]
    pub(crate) fn pending_flushes(&self) -> usize {
        let t = self.track.lock();
        t.qps
            .iter()
            .map(|a| {
                let s = if a.send { a.qp.send.ring.pending() } else { 0 };
                let r = match (&a.qp.recv, a.recv) {
                    (Some(q), true) => q.ring.pending(),
                    _ => 0,
                };
                s + r
            })
            .sum()
    }

    /// `ibv_poll_cq` with the shadow: `real` is the provider's poll (fills
    /// the first entries of the buffer it is given and returns how many, or
    /// a negative value on error). Real completions retire their work
    /// requests; once the device is revoked, real completions nobody is
    /// waiting for are dropped and (`mode.flush`) the rings are flushed when
    /// the provider has nothing left. `Err(rc)` only if the very first
    /// provider call failed.
    #[inline]
    pub(crate) fn poll(
        &self,
        wc: &mut [WorkCompletion],
        mode: PollMode,
        mut real: impl FnMut(&mut [MaybeUninit<ibv_wc>]) -> i32,
    ) -> Result<usize, i32> {
        let track = self.track.lock();
        let mut done = 0;
        let mut drained = !mode.reach_device;
        if mode.reach_device {
            let mut buf: [MaybeUninit<ibv_wc>; POLL_CHUNK] = [const { MaybeUninit::uninit() }; POLL_CHUNK];
            let mut last: Option<(u32, Option<&Attached>)> = None;
            while done < wc.len() {
                let want = (wc.len() - done).min(POLL_CHUNK);
                let n = real(&mut buf[..want]);
                if n < 0 {
                    if done > 0 {
                        break;
                    }
                    return Err(n);
                }
                let n = (n as usize).min(want);
                for raw in &buf[..n] {
                    // SAFETY: the provider initialised the first n entries.
                    wc[done] = convert::wc_from_raw(unsafe { raw.assume_init_ref() });
                    let w = &wc[done];
                    // Completions of one QP tend to come together.
                    let a = match last {
                        Some((qpn, a)) if qpn == w.qp_num => a,
                        _ => {
                            let a = track.get(w.qp_num);
                            last = Some((w.qp_num, a));
                            a
                        }
                    };
                    let keep = match Track::retire(a, w) {
                        Retired::Matched | Retired::Untracked => true,
                        Retired::Unmatched => !mode.revoked,
                    };
                    // A dropped completion's slot is overwritten by the next.
                    done += usize::from(keep);
                }
                if n < want {
                    drained = true;
                    break;
                }
            }
        }
        if mode.flush && drained && done < wc.len() {
            done += track.flush_into(&mut wc[done..]);
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests;
