//! Posting: one plain WR over one buffer by the short path, anything
//! else (chains, READs and atomics, registrations, reservations) by the
//! general one, and receives.

use super::super::wr::Plain;
use super::*;
use smallvec::SmallVec;

impl Track {
    /// Posts one plain WR over one buffer ([`Chain::into_plain`]) for
    /// [`UlpQp::submit`]: the verbs WR is built straight from it, and no
    /// READ credit or backlog applies (it neither is a READ nor fenced).
    /// On success the slot is taken and the request counted; the caller
    /// puts the request in the ring's next slot (the WR's). On an error
    /// nothing was posted (the caller gives the reserved slots back).
    #[inline(always)]
    pub(super) fn post_plain(
        &mut self,
        sh: &QpShared,
        sec: &mut dyn DeviceSection,
        p: &Plain,
        signaled: bool,
        reserved: u32,
    ) -> Result<()> {
        if self.closing {
            return Err(closing());
        }
        let need = 1 - reserved.min(1);
        let free = self.sq_cap - self.sq_used;
        if need > free {
            return Err(no_room_for_one(need, free, self.sq_cap));
        }
        let sge = [p.sge()];
        let wr = p.send_wr(sh.epoch | self.sq.next, &sge, signaled);
        sec.post_send(sh.ops(), std::slice::from_ref(&wr))
            .map_err(|e| e.error)?;
        self.sq_used += need;
        self.stats.requests += 1;
        Ok(())
    }

    /// The request of the WR posted last (after a chain was posted only
    /// in part, its prefix holds the request).
    pub(super) fn last_posted(&mut self) -> Option<&mut Req> {
        let last = self.sq.next.wrapping_sub(1);
        self.sq.slot(last).req.as_mut()
    }

    /// Posts `chain` of `req` now; the request goes in the slot of its
    /// last posted WR. On a rejected WR, the prefix before it stays
    /// tracked (the request with it); returns the error, and the request
    /// back if nothing was posted.
    pub(super) fn post_now(
        &mut self,
        sh: &QpShared,
        sec: &mut dyn DeviceSection,
        mut req: Req,
        chain: Chain,
    ) -> std::result::Result<(), (Error, Option<Req>)> {
        let n = chain.len();
        let base = self.sq.next;
        let res = {
            let ws = chain.as_slice();
            let signaled = req.signaled;
            // The scatter entries of the chain, and its WRs, on the stack
            // for chains of a few WRs of a few entries each.
            let mut sges: SmallVec<[Sge<'_>; 8]> = SmallVec::new();
            let mut ends: SmallVec<[usize; 4]> = SmallVec::new();
            for w in ws {
                w.push_sges(&mut sges);
                ends.push(sges.len());
            }
            let mut start = 0;
            let wrs: SmallVec<[SendWr<'_>; 4]> = ws
                .iter()
                .zip(&ends)
                .enumerate()
                .map(|(k, (w, &end))| {
                    let wr = w.send_wr(sh.epoch | (base + k as u64), &sges[start..end], signaled && k + 1 == n);
                    start = end;
                    wr
                })
                .collect();
            sec.post_send(sh.ops(), &wrs)
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
}

impl UlpQp {
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
    #[inline(always)]
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
            self.sh.with_track(|t, _| t.sq_used -= unused);
        }
        let n = chain.len() as u32;
        self.submit(chain, Some(cb), signaled, n, None, None)
    }

    /// Posts `chain` as a request of `cb`: one plain WR over one buffer
    /// by the short path (in line in every caller: `post`'s constants fold
    /// into it), anything else by [`UlpQp::submit_general`].
    #[inline(always)]
    pub(crate) fn submit(
        &self,
        chain: Chain,
        cb: Option<Cb>,
        signaled: bool,
        reserved: u32,
        pooled: Option<PooledMr>,
        lazy_inv: Option<u32>,
    ) -> std::result::Result<(), UlpPostError> {
        // A request that keeps a pooled MR or invalidates lazily takes the
        // general path, however plain its WR.
        let chain = if pooled.is_none() && lazy_inv.is_none() {
            match chain.into_plain() {
                Ok((plain, mr)) => return self.submit_plain(plain, mr, cb, signaled, reserved),
                Err(chain) => chain,
            }
        } else {
            chain
        };
        self.submit_general(chain, cb, signaled, reserved, pooled, lazy_inv)
    }

    /// [`UlpQp::submit`] of one plain WR over one buffer, taken apart.
    #[inline(always)]
    fn submit_plain(
        &self,
        plain: Plain,
        mr: Option<Arc<Mr>>,
        cb: Option<Cb>,
        signaled: bool,
        reserved: u32,
    ) -> std::result::Result<(), UlpPostError> {
        let sh = &*self.sh;
        let (mut cb, mut mr) = (cb, mr);
        // The short path: post and track under one guard, the request
        // straight into its WR's slot of the ring.
        let r = sh.with_track(|t, sec| {
            if let Err(error) = t.post_plain(sh, sec, &plain, signaled, reserved) {
                t.sq_used -= reserved;
                return Err(error);
            }
            let req = Req {
                cb: cb.take(),
                mr: mr.take(),
                rare: None,
                signaled,
            };
            t.sq.push(Some(req), 0, false);
            Ok(())
        });
        r.map_err(|error| {
            // Nothing was posted; the MR is dropped outside the guard.
            drop(mr);
            refused(error, cb)
        })
    }

    /// [`UlpQp::submit`] of anything but one plain WR over one buffer:
    /// READ credits, the backlog, chains, registrations.
    #[inline(never)]
    pub(super) fn submit_general(
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
        // The READ depth, if not given through `modify`: asked of the QP
        // once, outside the tracker's guard (a verb).
        let depth = if rd > 0 { sh.rd_depth() } else { 0 };
        // What is refused or not posted is handed out of the guard, to be
        // released after it (an MR, a pooled MR, the callback's captures).
        let r = sh.with_track(move |t, sec| {
            let fail = |t: &mut Track, error: Error, cb: Option<Cb>, chain: Chain, pooled: Option<PooledMr>| {
                t.sq_used -= reserved;
                Err(Box::new(Refused {
                    error,
                    cb,
                    _chain: Some(chain),
                    _pooled: pooled,
                    _req: None,
                }))
            };
            if n == 0 {
                return fail(t, verr!(PostSend, InvalidArgument, "an empty chain"), cb, chain, pooled);
            }
            if t.closing {
                return fail(t, closing(), cb, chain, pooled);
            }
            // A lazily invalidated request also holds the slot of the
            // LOCAL_INV posted when it finishes.
            let extra = u32::from(lazy_inv.is_some());
            let need = n + extra - reserved.min(n + extra);
            let free = t.sq_cap - t.sq_used;
            if need > free {
                let cap = t.sq_cap;
                let error = verr!(
                    PostSend,
                    NoMemory,
                    "a chain of {n} WRs (+{extra} for its invalidation) needs {need} send slots; {free} of {cap} free"
                );
                return fail(t, error, cb, chain, pooled);
            }
            t.sq_used += need;
            let mut req = Req::new(cb, signaled);
            if pooled.is_some() || lazy_inv.is_some() {
                let r = req.rare();
                r.pooled = pooled;
                r.lazy_inv = lazy_inv;
            }
            t.stats.requests += 1;
            let must_wait = (!t.backlog.is_empty() && (rd > 0 || fenced))
                || (rd > 0 && t.rd_out > 0 && t.rd_out + rd > depth.max(1));
            if must_wait {
                t.stats.queued_rd += 1;
                t.backlog.push_back(Queued { req, chain, rd });
                return Ok(());
            }
            match t.post_now(sh, sec, req, chain) {
                Ok(()) => Ok(()),
                // Fast-registration MRs of a half-posted chain may be left
                // valid: never reuse them.
                Err((error, Some(mut req))) => {
                    // Nothing was posted: what the request kept is released
                    // outside the guard.
                    t.stats.requests -= 1;
                    t.sq_used -= extra;
                    req.poison();
                    Err(Box::new(Refused {
                        error,
                        cb: req.cb.take(),
                        _chain: None,
                        _pooled: None,
                        _req: Some(req),
                    }))
                }
                // The posted prefix retires inside the layer, without the
                // callback.
                Err((error, None)) => Err(Box::new(Refused {
                    error,
                    cb: t.last_posted().and_then(|req| {
                        req.poison();
                        req.cb.take()
                    }),
                    _chain: None,
                    _pooled: None,
                    _req: None,
                })),
            }
        });
        // The rest of what was refused (chain, pooled MR, request) drops
        // here, after the guard.
        r.map_err(|f| refused(f.error, f.cb))
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
        let r = sh.track.with_qp(true, move |t, sec| {
            if t.closing {
                let error = verr!(PostRecv, InvalidArgument, "the QP is closing");
                return Err((error, cb, sgl));
            }
            if t.rq_used >= t.rq_cap {
                let error = verr!(PostRecv, NoMemory, "all {} receive slots are posted", t.rq_cap);
                return Err((error, cb, sgl));
            }
            let seq = t.rq.next;
            let posted = {
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
                sec.post_recv(sh.ops(), &[RecvWr::new(sh.epoch | RQ_BIT | seq, sges)])
            };
            if let Err(e) = posted {
                return Err((e.error, cb, sgl));
            }
            let mut req = Req::new(Some(cb), true);
            req.keep(UlpWr::send(sgl).into());
            t.stats.requests += 1;
            t.rq_used += 1;
            t.rq.push(Some(req), 0, false);
            Ok(())
        });
        // A refused buffer (and its MR) is dropped outside the guard.
        r.map_err(|(error, cb, sgl)| {
            drop(sgl);
            UlpPostError {
                error,
                callback: Some(cb.into_boxed()),
            }
        })
    }
}

/// A post refused inside the tracker's guard, with what it had taken, to
/// release after the guard (the fields only kept to be dropped then are
/// never read).
struct Refused {
    error: Error,
    cb: Option<Cb>,
    _chain: Option<Chain>,
    _pooled: Option<PooledMr>,
    _req: Option<Req>,
}

/// The error of a post to a closing QP (out of line: the posting paths
/// stay short).
#[cold]
#[inline(never)]
fn closing() -> Error {
    verr!(PostSend, InvalidArgument, "the QP is closing")
}

/// The error of one WR that finds no free send slot.
#[cold]
#[inline(never)]
fn no_room_for_one(need: u32, free: u32, cap: u32) -> Error {
    verr!(
        PostSend,
        NoMemory,
        "a chain of 1 WRs (+0 for its invalidation) needs {need} send slots; {free} of {cap} free"
    )
}

/// A refused post: the error and the callback, uncalled, handed back.
#[cold]
#[inline(never)]
fn refused(error: Error, cb: Option<Cb>) -> UlpPostError {
    UlpPostError {
        error,
        callback: cb.map(Cb::into_boxed),
    }
}
