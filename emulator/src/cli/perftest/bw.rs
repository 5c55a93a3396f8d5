//! The bandwidth loops (perftest's `run_iter_bw` and `run_iter_bw_server`)
//! as non-blocking state machines: [`BwSender`] keeps up to `tx_depth` WRs
//! in flight per QP, signals every `cq_mod`-th (and the last), posts lists
//! of `post_list` WRs, and records post and completion times for the peak;
//! [`BwReceiver`] keeps the receive queues full for send tests.

use std::cell::Cell;
use std::rc::Rc;

use softverbs::verbs::{SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

use super::args::{AtomicType, Connection, Params, VerbKind};
use super::resources::{Dest, Side, DEF_QKEY};
use super::stats::{bw_result, BwResult, BwTimes};
use super::{Agent, Clock, PerfError, Step, VerbsContext};

/// Completions taken per poll (later perftest releases' `CQE Poll Batch`).
pub const POLL_BATCH: usize = 16;

/// How long a `-e` loop sleeps on the channel at most before looking
/// around again (the other end may need this thread in loopback).
pub const EVENT_WAIT_MS: u64 = 1;

/// The phases of a `-D` run: warm-up for `margin`, sample, cool down for
/// `margin`, as perftest's alarm states: the run lasts the whole duration.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    start: u64,
    end: u64,
    warm_end: u64,
    sample_end: u64,
    /// When sampling started.
    pub sample_start: Option<u64>,
    /// When sampling stopped.
    pub sample_stop: Option<u64>,
    /// The duration is over (the cool-down included).
    over: bool,
}

impl Phases {
    /// Phases of a `duration`-second run with `margin` seconds at each end,
    /// starting at `start`.
    pub fn new(start: u64, duration: u64, margin: f64) -> Phases {
        let m = (margin * 1e9) as u64;
        let d = duration * 1_000_000_000;
        Phases {
            start,
            end: start + d,
            warm_end: start + m,
            sample_end: start + d.saturating_sub(m).max(m + 1),
            sample_start: None,
            sample_stop: None,
            over: false,
        }
    }

    /// Advances to `now`; returns whether the run is sampling.
    pub fn at(&mut self, now: u64) -> bool {
        if self.sample_start.is_none() && now >= self.warm_end {
            self.sample_start = Some(now);
        }
        if self.sample_stop.is_none() && now >= self.sample_end {
            self.sample_stop = Some(now);
        }
        if now >= self.end {
            self.over = true;
        }
        self.sample_start.is_some() && self.sample_stop.is_none()
    }

    /// Whether the run is over: the sample window and the cool-down after
    /// it.
    pub fn ended(&self) -> bool {
        self.over
    }

    /// Fraction of the run done at `now`.
    pub fn fraction(&self, now: u64) -> f64 {
        now.saturating_sub(self.start) as f64 / self.end.saturating_sub(self.start).max(1) as f64
    }
}

/// Checks a completion's status.
pub(crate) fn check_wc(wc: &WorkCompletion, what: &str, posted: u64, completed: u64) -> Result<(), PerfError> {
    if wc.status == WcStatus::Success {
        return Ok(());
    }
    Err(PerfError::Failed(format!(
        "{what} completion with error: status {:?}, vendor_err {:#x}, wr_id {}, QPN {:#x} ({posted} posted, {completed} completed)",
        wc.status, wc.vendor_err, wc.wr_id, wc.qp_num
    )))
}

/// The send side of a bandwidth test.
pub struct BwSender<'a> {
    side: &'a Side,
    remote: &'a [Dest],
    p: &'a Params,
    size: u64,
    inline: bool,
    iters: u64,
    scnt: Vec<u64>,
    ccnt: Vec<u64>,
    totscnt: u64,
    totccnt: u64,
    tot_iters: u64,
    times: BwTimes,
    phases: Option<Phases>,
    sample_count: u64,
    wc: [WorkCompletion; POLL_BATCH],
    started: bool,
    done: bool,
    done_flag: Option<Rc<Cell<bool>>>,
    last_now: u64,
}

impl std::fmt::Debug for BwSender<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BwSender")
            .field("size", &self.size)
            .field("posted", &self.totscnt)
            .field("completed", &self.totccnt)
            .finish_non_exhaustive()
    }
}

impl<'a> BwSender<'a> {
    /// A sender of `size`-byte messages from `side` to the peer's QPs
    /// `remote`.
    pub fn new(side: &'a Side, remote: &'a [Dest], p: &'a Params, size: u64) -> BwSender<'a> {
        let n = side.qps.len();
        let iters = p.iters;
        let tot_iters = iters * n as u64;
        let peak = p.peak && p.duration.is_none();
        BwSender {
            side,
            remote,
            p,
            size,
            inline: p.inline_for(size) && size <= u64::from(side.inline_size),
            iters,
            scnt: vec![0; n],
            ccnt: vec![0; n],
            totscnt: 0,
            totccnt: 0,
            tot_iters,
            times: BwTimes {
                posted: if peak { vec![0; tot_iters as usize] } else { Vec::new() },
                completed: if peak { vec![0; tot_iters as usize] } else { Vec::new() },
                ..BwTimes::default()
            },
            phases: None,
            sample_count: 0,
            wc: [WorkCompletion::default(); POLL_BATCH],
            started: false,
            done: false,
            done_flag: None,
            last_now: 0,
        }
    }

    /// A flag this sender raises when it is done (for a receiver in the
    /// same thread that cannot count on every message arriving).
    pub fn done_flag(&mut self) -> Rc<Cell<bool>> {
        self.done_flag.get_or_insert_with(|| Rc::new(Cell::new(false))).clone()
    }

    fn op(&self, i: usize) -> SendOp<'static> {
        let remote = self.remote[i].remote();
        match self.p.verb {
            VerbKind::Write => SendOp::Write { remote },
            VerbKind::Read => SendOp::Read { remote },
            VerbKind::Send => SendOp::Send,
            VerbKind::Atomic => match self.p.atomic_type {
                AtomicType::FetchAndAdd => SendOp::FetchAdd { remote, add: 1 },
                AtomicType::CmpAndSwap => SendOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 0,
                },
            },
        }
    }

    fn signaled(&self, k: u64) -> bool {
        let m = u64::from(self.p.cq_mod);
        k % m == m - 1 || (self.phases.is_none() && k == self.iters - 1)
    }

    fn post(&mut self, i: usize, now: u64) -> Result<(), PerfError> {
        let side = self.side;
        let sge = [side.send_sge(i, self.size)?];
        let op = self.op(i);
        let l = u64::from(self.p.post_list);
        let base_flags = if self.inline {
            SendFlags::INLINE
        } else {
            SendFlags::empty()
        };
        let make = |k: u64| {
            let mut flags = base_flags;
            if self.signaled(k) {
                flags |= SendFlags::SIGNALED;
            }
            let wr = SendWr::new(i as u64, op, &sge).flags(flags);
            if self.p.connection == Connection::Ud {
                wr.ud(&side.ahs[i], self.remote[i].qpn, DEF_QKEY)
            } else {
                wr
            }
        };
        let k0 = self.scnt[i];
        if l == 1 {
            side.qps[i].post_send(&[make(k0)]).ctx("post_send")?;
        } else {
            let wrs: Vec<SendWr<'_>> = (k0..k0 + l).map(make).collect();
            side.qps[i].post_send(&wrs).ctx("post_send")?;
        }
        if !self.times.posted.is_empty() {
            for t in &mut self.times.posted[self.totscnt as usize..(self.totscnt + l) as usize] {
                *t = now;
            }
        }
        self.scnt[i] += l;
        self.totscnt += l;
        Ok(())
    }

    /// The result once done.
    pub fn result(&self) -> BwResult {
        match &self.phases {
            Some(ph) => {
                let t = BwTimes {
                    start: ph.sample_start.unwrap_or(0),
                    end: ph.sample_stop.unwrap_or(self.last_now),
                    count: self.sample_count,
                    ..BwTimes::default()
                };
                bw_result(self.size, &t, 1, 1)
            }
            None => bw_result(
                self.size,
                &self.times,
                u64::from(self.p.cq_mod),
                u64::from(self.p.post_list),
            ),
        }
    }
}

impl Agent for BwSender<'_> {
    fn step(&mut self, clock: &Clock) -> Result<Step, PerfError> {
        if self.done {
            return Ok(Step {
                done: true,
                progressed: false,
            });
        }
        let mut now = clock.now();
        if !self.started {
            self.started = true;
            self.times.start = now;
            if let Some(d) = self.p.duration {
                self.phases = Some(Phases::new(now, d, self.p.margin));
            }
        }
        let sampling = match &mut self.phases {
            Some(ph) => ph.at(now),
            None => false,
        };
        let ending = self.phases.as_ref().is_some_and(Phases::ended);
        let mut progressed = false;
        let tx = u64::from(self.p.tx_depth);
        let l = u64::from(self.p.post_list);
        let m = u64::from(self.p.cq_mod);
        for i in 0..self.side.qps.len() {
            loop {
                let s = self.scnt[i];
                let more = match &self.phases {
                    None => s < self.iters,
                    // Cooling down: only finish the current moderation
                    // group so that every posted WR completes.
                    Some(_) => !ending || !s.is_multiple_of(m),
                };
                if !more || s + l > tx + self.ccnt[i] {
                    break;
                }
                self.post(i, now)?;
                progressed = true;
            }
        }
        let outstanding = self.totccnt < self.totscnt;
        if outstanding {
            let side = self.side;
            let n = if self.p.events {
                side.poll_or_wait(&side.scq, &mut self.wc, EVENT_WAIT_MS)?
            } else {
                side.scq.poll(&mut self.wc).ctx("poll_cq")?
            };
            if n > 0 {
                now = clock.now();
                progressed = true;
            }
            for k in 0..n {
                let wc = self.wc[k];
                check_wc(&wc, "send", self.totscnt, self.totccnt)?;
                let qp = wc.wr_id as usize;
                let fill = match self.phases {
                    Some(_) => m,
                    None => m.min(self.iters - self.ccnt[qp]),
                };
                self.ccnt[qp] += fill;
                self.totccnt += fill;
                if sampling {
                    self.sample_count += fill;
                }
                if !self.times.completed.is_empty() {
                    let idx = self.totccnt.min(self.tot_iters) as usize - 1;
                    self.times.completed[idx] = now;
                }
            }
        }
        self.last_now = now;
        let finished = match &self.phases {
            None => self.totccnt >= self.tot_iters,
            Some(_) => ending && self.totccnt >= self.totscnt,
        };
        if finished {
            self.done = true;
            self.times.end = now;
            self.times.count = self.tot_iters;
            if let Some(f) = &self.done_flag {
                f.set(true);
            }
        }
        Ok(Step {
            done: self.done,
            progressed,
        })
    }

    fn progress(&self) -> f64 {
        match &self.phases {
            Some(ph) => ph.fraction(self.last_now),
            None => self.totccnt as f64 / self.tot_iters.max(1) as f64,
        }
    }
}

/// The receive side of a send bandwidth test.
pub struct BwReceiver<'a> {
    side: &'a Side,
    p: &'a Params,
    size: u64,
    rcnt: Vec<u64>,
    total: u64,
    tot_iters: u64,
    first: Option<u64>,
    last: u64,
    wc: [WorkCompletion; POLL_BATCH],
    peer_done: Option<Rc<Cell<bool>>>,
    phases: Option<Phases>,
    sample_count: u64,
    done: bool,
}

impl std::fmt::Debug for BwReceiver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BwReceiver")
            .field("size", &self.size)
            .field("received", &self.total)
            .finish_non_exhaustive()
    }
}

impl<'a> BwReceiver<'a> {
    /// A receiver on `side`; posts its receive queues full.
    ///
    /// # Errors
    ///
    /// The failing `post_recv`.
    pub fn new(side: &'a Side, p: &'a Params, size: u64) -> Result<BwReceiver<'a>, PerfError> {
        let n = side.qps.len();
        for i in 0..n {
            side.fill_recv(i)?;
        }
        Ok(BwReceiver {
            side,
            p,
            size,
            rcnt: vec![0; n],
            total: 0,
            tot_iters: p.iters * n as u64,
            first: None,
            last: 0,
            wc: [WorkCompletion::default(); POLL_BATCH],
            peer_done: None,
            phases: None,
            sample_count: 0,
            done: false,
        })
    }

    /// Makes the receiver stop once `flag` is raised and its CQ is empty
    /// (needed with `-D`, and on UC/UD where messages may be lost).
    pub fn until(mut self, flag: Rc<Cell<bool>>) -> Self {
        self.peer_done = Some(flag);
        self
    }

    /// Messages received.
    pub fn received(&self) -> u64 {
        self.total
    }

    /// The receive-side result (from the first to the last receive).
    pub fn result(&self) -> BwResult {
        let t = match &self.phases {
            Some(ph) => BwTimes {
                start: ph.sample_start.unwrap_or(0),
                end: ph.sample_stop.unwrap_or(self.last),
                count: self.sample_count,
                ..BwTimes::default()
            },
            None => BwTimes {
                start: self.first.unwrap_or(0),
                end: self.last,
                count: self.total,
                ..BwTimes::default()
            },
        };
        bw_result(self.size, &t, 1, 1)
    }
}

impl Agent for BwReceiver<'_> {
    fn step(&mut self, clock: &Clock) -> Result<Step, PerfError> {
        if self.done {
            return Ok(Step {
                done: true,
                progressed: false,
            });
        }
        let side = self.side;
        if self.phases.is_none() {
            if let Some(d) = self.p.duration {
                self.phases = Some(Phases::new(clock.now(), d, self.p.margin));
            }
        }
        let n = if self.p.events {
            side.poll_or_wait(&side.rcq, &mut self.wc, EVENT_WAIT_MS)?
        } else {
            side.rcq.poll(&mut self.wc).ctx("poll_cq")?
        };
        let now = if n > 0 || self.phases.is_some() {
            clock.now()
        } else {
            self.last
        };
        let sampling = match &mut self.phases {
            Some(ph) => ph.at(now),
            None => false,
        };
        for k in 0..n {
            let wc = self.wc[k];
            check_wc(&wc, "receive", self.total, self.total)?;
            let qp = wc.wr_id as usize;
            self.rcnt[qp] += 1;
            self.total += 1;
            if sampling {
                self.sample_count += 1;
            }
            let out = &side.recv_outstanding[qp];
            out.set(out.get().saturating_sub(1));
        }
        if n > 0 {
            self.first.get_or_insert(now);
            self.last = now;
            for i in 0..side.qps.len() {
                if side.recv_outstanding[i].get() < side.rx_depth {
                    side.fill_recv(i)?;
                }
            }
        }
        let reliable = self.p.connection == Connection::Rc && self.p.duration.is_none();
        let peer_done = self.peer_done.as_ref().is_some_and(|f| f.get());
        if (reliable && self.total >= self.tot_iters) || (peer_done && n == 0) {
            self.done = true;
        }
        Ok(Step {
            done: self.done,
            progressed: n > 0,
        })
    }

    fn progress(&self) -> f64 {
        self.total as f64 / self.tot_iters.max(1) as f64
    }
}
