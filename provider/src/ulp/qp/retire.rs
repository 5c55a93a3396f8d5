//! Retiring completions: a completion finds its WR by the sequence
//! number its `wr_id` carries, retires it and the WRs before it, and
//! hands the finished requests to the poller (the list of [`Done`], or
//! one [`Alone`]) to run outside every lock.

use super::*;
use std::mem::MaybeUninit;

impl Done {
    /// A request whose resources are released without a callback.
    pub(super) fn release(req: Req) -> Done {
        Done {
            req,
            wc: WorkCompletion::default(),
            call: false,
        }
    }

    /// Calls the callback if it is to be called ([`Done::will_call`]),
    /// taking it (it runs at most once); what the request keeps goes when
    /// the `Done` is dropped.
    #[inline]
    pub(crate) fn call_back(&mut self) {
        if let Some(cb) = self.req.cb.take_if(|_| self.call) {
            cb.call(&self.wc);
        }
    }

    /// Whether [`Done::call_back`] will call a callback.
    #[inline]
    pub(crate) fn will_call(&self) -> bool {
        self.call && self.req.cb.is_some()
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

impl Alone {
    /// Whether [`Alone::run`] will call the callback.
    #[inline]
    pub(crate) fn will_call(&self) -> bool {
        self.call && self.cb.is_some()
    }

    /// Calls the callback with the completion if it is to be called (in
    /// place, without moving it out), or drops it uncalled. What the
    /// request kept (its MR) goes when the `Alone` is dropped, after.
    /// The field is emptied after, so a second `run` does nothing.
    #[inline]
    pub(crate) fn run(&mut self) {
        let call = self.call;
        match &mut *self.cb {
            Some(cb) if call => {
                // SAFETY: the callback is consumed here, also by a panic:
                // on return the field is emptied below, and on unwinding
                // the `Alone` is dropped without its `ManuallyDrop` field,
                // so it is never called or dropped again.
                unsafe { cb.call_in_place(&self.wc) };
            }
            Some(_) => {
                // SAFETY: dropped once, here; the field is emptied below.
                unsafe { std::mem::ManuallyDrop::drop(&mut self.cb) };
            }
            None => {}
        }
        // Overwrites without dropping (a `ManuallyDrop`): what was there
        // was consumed above.
        self.cb = std::mem::ManuallyDrop::new(None);
    }
}

impl Track {
    /// Request `req` finished: `wc` is its last WR's completion (or the
    /// first error of any of its WRs, kept in it). It goes to `out`, to
    /// run outside the lock.
    #[inline]
    pub(super) fn finish(&mut self, req: Req, wc: &WorkCompletion, out: &mut Vec<Done>) {
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
    pub(super) fn finish_rare(&mut self, mut req: Req, wc: &WorkCompletion, out: &mut Vec<Done>) {
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
    pub(super) fn retire_oldest(&mut self, rq: bool, wc: &WorkCompletion, out: &mut Vec<Done>) {
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
    pub(super) fn retire(&mut self, rq: bool, wc: &WorkCompletion, qpn: u32, out: &mut Vec<Done>) -> bool {
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
    pub(super) fn retire_walk(&mut self, rq: bool, wc: &WorkCompletion, qpn: u32, out: &mut Vec<Done>) -> bool {
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
    pub(super) fn synthesize_all(&mut self, epoch: u64, qpn: u32, out: &mut Vec<Done>) {
        for rq in [false, true] {
            while !self.ring(rq).is_empty() {
                let seq = self.ring(rq).head;
                self.stats.synthesized += 1;
                let wc = flush_wc(epoch | seq | if rq { RQ_BIT } else { 0 }, qpn, 0);
                self.retire_oldest(rq, &wc, out);
            }
        }
    }
}

impl QpShared {
    /// Retires `wc`, a poll's only completion, if it is the common case:
    /// the success of its queue's oldest WR, which holds a request without
    /// a rare part, with nothing queued behind READ credits and no
    /// invalidation to post. Returns the request's callback, whether it is
    /// to be called, its MR and the completion, to be run outside every
    /// lock (returned by value: the poller's frame holds it, no earlier
    /// value to drop); `None`, and nothing changed, for anything else,
    /// which [`QpShared::retire_run`] handles.
    ///
    /// # Safety
    ///
    /// As [`QpShared::with_track_in`]: if the device's lock guards the
    /// tracker, the caller runs inside a section of the device and holds
    /// no other reference to this QP's tracker.
    ///
    /// The request is written to `slot` (returns true), where the poller
    /// runs it: nothing is moved on the way.
    #[inline(always)]
    pub(crate) unsafe fn retire_alone(&self, wc: &WorkCompletion, slot: &mut MaybeUninit<Alone>) -> bool {
        if wc.qp_num != self.qpn || wc.wr_id & EPOCH_MASK != self.epoch || wc.status != WcStatus::Success {
            return false;
        }
        // SAFETY: the caller's contract.
        unsafe { self.with_track_in(|t| Self::retire_alone_in(t, wc, slot)) }
    }

    #[inline(always)]
    fn retire_alone_in(t: &mut Track, wc: &WorkCompletion, slot: &mut MaybeUninit<Alone>) -> bool {
        if !t.backlog.is_empty() || !t.followups.is_empty() {
            return false;
        }
        let rq = wc.wr_id & RQ_BIT != 0;
        let q = t.ring(rq);
        let seq = wc.wr_id & SEQ_MASK;
        if seq != q.head || q.is_empty() {
            return false;
        }
        let s = q.slot(seq);
        if s.req.as_ref().is_none_or(|req| req.rare.is_some()) {
            return false;
        }
        let rd = s.rd;
        let Some(Req { cb, mr, signaled, .. }) = s.req.take() else {
            return false;
        };
        q.head = seq + 1;
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
        slot.write(Alone {
            cb: std::mem::ManuallyDrop::new(cb),
            call: signaled,
            _mr: mr,
            wc: *wc,
        });
        true
    }

    /// Retires what the leading completions of `wcs` (read by the CQ under
    /// its poll lock) of this QP complete, under one lock of the QP.
    /// Returns how many it retired: it stops at the first completion of
    /// another QP, or one that names nothing of this QP (the caller counts
    /// that one as stray and goes on after it). Requests that wait for
    /// READ credits and invalidations go out through `sec`.
    ///
    /// # Safety
    ///
    /// As [`QpShared::retire_alone`]; `sec` is the section the caller runs
    /// in (or [`Direct`] if the QP's own mutex guards its tracker).
    pub(crate) unsafe fn retire_run(
        &self,
        wcs: &[WorkCompletion],
        sec: &mut dyn DeviceSection,
        out: &mut Vec<Done>,
    ) -> usize {
        // SAFETY: the caller's contract.
        unsafe { self.with_track_in(|t| self.retire_run_in(t, wcs, sec, out)) }
    }

    fn retire_run_in(
        &self,
        t: &mut Track,
        wcs: &[WorkCompletion],
        sec: &mut dyn DeviceSection,
        out: &mut Vec<Done>,
    ) -> usize {
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
            t.pump(self, sec, out);
        }
        if !t.followups.is_empty() {
            t.post_followups(self, sec, out);
        }
        n
    }
}

pub(super) fn self_epoch_bits(wr_id: u64) -> u64 {
    wr_id & EPOCH_MASK
}

pub(super) fn flush_wc(wr_id: u64, qpn: u32, vendor_err: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        vendor_err,
        qp_num: qpn,
        ..WorkCompletion::default()
    }
}
