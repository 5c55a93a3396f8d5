//! The latency loops (perftest's `run_iter_lat_write`, `run_iter_lat_send`
//! and `run_iter_lat`) as non-blocking state machines.
//!
//! - write_lat: a ping-pong in which each end writes into the other's buffer
//!   and polls the last byte of its own (RC writes land in order, so the
//!   last byte lands last); every write is signaled.
//! - send_lat: a ping-pong of sends, each end waiting for a receive
//!   completion before answering; as in perftest, only every `cq_mod`-th
//!   send (default 100) and the last are signaled, and an end waits for
//!   that send's completion before it goes on.
//! - read_lat, atomic_lat: the client posts one read or atomic at a time and
//!   waits for its completion; the server is passive.
//!
//! The post time of every iteration is recorded; consecutive posts are one
//! round trip apart (see [`super::stats::lat_result`]).

use std::cell::Cell;
use std::rc::Rc;

use softverbs::verbs::{SendFlags, SendOp, SendWr, Sge, WorkCompletion};

use super::args::{AtomicType, Connection, Params, VerbKind};
use super::bw::{check_wc, Phases, EVENT_WAIT_MS};
use super::resources::{Dest, Side, DEF_QKEY};
use super::stats::{ab_medians, lat_dur_result, lat_result, LatDurResult, LatResult};
use super::{Agent, Clock, PerfError, Step, VerbsContext};

/// A latency result of either kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatOutcome {
    /// Iterations mode.
    Iters(LatResult),
    /// `-D` mode.
    Duration(LatDurResult),
}

/// Readies one end for `size`-byte messages before the peer may start:
/// clears the ping-pong markers (a stale marker would look like an answer)
/// and fills the receive queues of send tests (so the first message does not
/// meet an RNR NAK).
///
/// # Errors
///
/// The failing `post_recv`.
pub fn prepare(side: &Side, p: &Params, size: u64) -> Result<(), PerfError> {
    for i in 0..side.qps.len() {
        if p.verb == VerbKind::Write && !p.bw {
            side.clear_markers(i, size)?;
        }
        if p.verb == VerbKind::Send {
            side.fill_recv(i)?;
        }
    }
    Ok(())
}

/// One end of a latency test.
pub struct LatAgent<'a> {
    side: &'a Side,
    remote: &'a [Dest],
    p: &'a Params,
    size: u64,
    client: bool,
    inline: bool,
    iters: u64,
    scnt: u64,
    ccnt: u64,
    rcnt: u64,
    waiting_recv: bool,
    posted: Vec<u64>,
    phases: Option<Phases>,
    sample_count: u64,
    started: bool,
    done: bool,
    stop: Option<Rc<Cell<bool>>>,
    done_flag: Option<Rc<Cell<bool>>>,
    /// Polls of the receive CQ per step while waiting for an answer.
    recv_spin: u32,
    /// The SGEs of every send and of every receive refill, made once (as
    /// perftest prepares its WRs once and posts them again).
    send_sge: Sge<'a>,
    recv_sge: Sge<'a>,
    wc: [WorkCompletion; 4],
    marker_word: usize,
    marker_shift: u32,
    last_now: u64,
}

impl std::fmt::Debug for LatAgent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatAgent")
            .field("client", &self.client)
            .field("scnt", &self.scnt)
            .field("rcnt", &self.rcnt)
            .field("ccnt", &self.ccnt)
            .finish_non_exhaustive()
    }
}

impl<'a> LatAgent<'a> {
    /// One end: the `client` starts the ping-pong (and is the only end that
    /// acts in read and atomic tests). For send tests, fills the receive
    /// queue. Call [`prepare`] on both ends before either starts.
    ///
    /// # Errors
    ///
    /// The failing `post_recv`.
    pub fn new(
        side: &'a Side,
        remote: &'a [Dest],
        p: &'a Params,
        size: u64,
        client: bool,
    ) -> Result<LatAgent<'a>, PerfError> {
        if p.verb == VerbKind::Send {
            side.fill_recv(0)?;
        }
        let marker = (side.recv_off(0) + size - 1) as usize;
        let word = marker & !7;
        let iters = if p.duration.is_some() { u64::MAX } else { p.iters };
        Ok(LatAgent {
            side,
            remote,
            p,
            size,
            client,
            inline: p.inline_for(size) && size <= u64::from(side.inline_size),
            iters,
            scnt: 0,
            ccnt: 0,
            rcnt: 0,
            waiting_recv: !client,
            posted: if p.duration.is_some() {
                Vec::new()
            } else {
                vec![0; p.iters as usize]
            },
            phases: None,
            sample_count: 0,
            started: false,
            done: false,
            stop: None,
            done_flag: None,
            recv_spin: 1,
            send_sge: side.send_sge(0, size)?,
            recv_sge: side.recv_sge(0)?,
            wc: [WorkCompletion::default(); 4],
            marker_word: word,
            // The MR is page aligned, so its words are in memory order.
            marker_shift: 8 * (marker - word) as u32,
            last_now: 0,
        })
    }

    /// Whether this end takes part actively (read and atomic servers do
    /// not: the device answers for them).
    pub fn is_active(p: &Params, client: bool) -> bool {
        client || matches!(p.verb, VerbKind::Write | VerbKind::Send)
    }

    /// A flag this end raises when done.
    pub fn done_flag(&mut self) -> Rc<Cell<bool>> {
        self.done_flag.get_or_insert_with(|| Rc::new(Cell::new(false))).clone()
    }

    /// With `-D`, the server stops when `flag` is raised (the client is
    /// done).
    pub fn until(mut self, flag: Rc<Cell<bool>>) -> Self {
        self.stop = Some(flag);
        self
    }

    /// Waits for a SEND's answer in a tight loop of up to `n` receive-CQ
    /// polls per step, as perftest's `ibv_poll_cq` loop, instead of one
    /// poll between the rest of a step's bookkeeping (which lengthens the
    /// time to see the answer). Only for an end alone in its thread: two
    /// ends of one process take turns, and one spinning would keep the
    /// other from answering.
    pub fn spinning(mut self, n: u32) -> Self {
        self.recv_spin = n.max(1);
        self
    }

    fn rtt_factor(&self) -> f64 {
        if self.p.verb.is_round_trip() {
            1.0
        } else {
            2.0
        }
    }

    /// The client's result once done.
    pub fn result(&self) -> Option<LatOutcome> {
        match &self.phases {
            Some(ph) => {
                let start = ph.sample_start?;
                let stop = ph.sample_stop.unwrap_or(self.last_now);
                Some(LatOutcome::Duration(lat_dur_result(
                    self.size,
                    self.sample_count,
                    stop.saturating_sub(start),
                    self.rtt_factor(),
                )))
            }
            None => {
                if let Some(b) = self.p.ab {
                    if let Some((on, off)) = ab_medians(&self.posted, self.rtt_factor(), b) {
                        eprintln!(
                            "ab: blocks of {b}: on {on:.4} µs, off {off:.4} µs, on/off {:.4}",
                            on / off
                        );
                    }
                }
                lat_result(self.size, &self.posted, self.rtt_factor()).map(LatOutcome::Iters)
            }
        }
    }

    fn marker(&self) -> Result<u8, PerfError> {
        let w = self.side.mr.load_u64(self.marker_word as u64).ctx("poll marker")?;
        Ok((w >> self.marker_shift) as u8)
    }

    fn post(&mut self, now: u64) -> Result<(), PerfError> {
        let side = self.side;
        if let Some(t) = self.posted.get_mut(self.scnt as usize) {
            *t = now;
        }
        let seq = self.scnt + 1;
        if self.p.verb == VerbKind::Write {
            let last = side.send_off(0) + self.size - 1;
            side.mr.write(last, &[seq as u8]).ctx("set marker")?;
        }
        let remote = self.remote[0].remote();
        let op = match self.p.verb {
            VerbKind::Write => SendOp::Write { remote },
            VerbKind::Send => SendOp::Send,
            VerbKind::Read => SendOp::Read { remote },
            VerbKind::Atomic => match self.p.atomic_type {
                AtomicType::FetchAndAdd => SendOp::FetchAdd { remote, add: 1 },
                AtomicType::CmpAndSwap => SendOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 0,
                },
            },
        };
        let sge = [self.send_sge];
        // Like perftest's send_lat, a ping-pong of sends signals every
        // cq_mod-th send and the last (1 for the other tests); an
        // unsignaled send counts as completed once posted.
        let last = self.p.duration.is_none() && seq == self.iters;
        let unsignaled = !seq.is_multiple_of(u64::from(self.p.cq_mod)) && !last;
        let mut flags = if unsignaled {
            SendFlags::empty()
        } else {
            SendFlags::SIGNALED
        };
        if self.inline {
            flags |= SendFlags::INLINE;
        }
        let mut wr = SendWr::new(0, op, &sge).flags(flags);
        if self.p.connection == Connection::Ud {
            wr = wr.ud(&side.ahs[0], self.remote[0].qpn, DEF_QKEY);
        }
        side.qps[0].post_send(&[wr]).ctx("post_send")?;
        self.scnt += 1;
        if unsignaled {
            self.ccnt += 1;
        }
        Ok(())
    }

    fn poll_send(&mut self) -> Result<usize, PerfError> {
        if self.ccnt >= self.scnt {
            return Ok(0);
        }
        self.reap_sends()
    }

    /// Polls the send CQ once (or waits on its channel with `-e`) and
    /// counts what it found. Also called with no send outstanding: an
    /// inline soft device reads its link only inside verbs, and a side
    /// waiting for the peer's WRITE in its memory calls no other verb.
    fn reap_sends(&mut self) -> Result<usize, PerfError> {
        let side = self.side;
        let n = if self.p.events {
            side.poll_or_wait(&side.scq, &mut self.wc, EVENT_WAIT_MS)?
        } else {
            side.scq.poll(&mut self.wc).ctx("poll_cq")?
        };
        for k in 0..n {
            check_wc(&self.wc[k], "send", self.scnt, self.ccnt)?;
        }
        self.ccnt += n as u64;
        Ok(n)
    }

    fn try_receive(&mut self) -> Result<bool, PerfError> {
        match self.p.verb {
            VerbKind::Write => {
                let want = (self.rcnt + 1) as u8;
                if self.marker()? == want {
                    return Ok(true);
                }
                // Nothing yet: let an inline device take the WRITE in (see
                // `reap_sends`; write_lat runs without -e), then look again.
                self.reap_sends()?;
                Ok(self.marker()? == want)
            }
            VerbKind::Send => {
                let side = self.side;
                let mut wc = [WorkCompletion::default()];
                let n = if self.p.events {
                    side.poll_or_wait(&side.rcq, &mut wc, EVENT_WAIT_MS)?
                } else {
                    // See `spinning`: bounded, so that the caller still
                    // looks at its control connection and stall timer.
                    let mut n = 0;
                    for _ in 0..self.recv_spin {
                        n = side.rcq.poll(&mut wc).ctx("poll_cq")?;
                        if n > 0 {
                            break;
                        }
                    }
                    n
                };
                if n == 0 {
                    return Ok(false);
                }
                check_wc(&wc[0], "receive", self.rcnt, self.rcnt)?;
                let out = &side.recv_outstanding[0];
                out.set(out.get().saturating_sub(1));
                side.fill_recv_with(0, self.recv_sge)?;
                Ok(true)
            }
            // The answer of a read or atomic is its completion.
            VerbKind::Read | VerbKind::Atomic => Ok(true),
        }
    }

    fn finish(&mut self, now: u64) {
        self.done = true;
        self.last_now = now;
        if let Some(f) = &self.done_flag {
            f.set(true);
        }
    }
}

impl Agent for LatAgent<'_> {
    fn step(&mut self, clock: &Clock) -> Result<Step, PerfError> {
        if self.done {
            return Ok(Step {
                done: true,
                progressed: false,
            });
        }
        // The clock is read where it is needed: a poll that finds nothing
        // reads it only in a -D run (its phases), so the polling loop
        // stays as short as perftest's.
        let mut now = if self.phases.is_some() || !self.started {
            clock.now()
        } else {
            self.last_now
        };
        if !self.started {
            self.started = true;
            if let Some(d) = self.p.duration {
                self.phases = Some(Phases::new(now, d, self.p.margin));
            }
        }
        let sampling = match &mut self.phases {
            Some(ph) => ph.at(now),
            None => false,
        };
        // Only the client ends a `-D` run; the server answers until told,
        // or a ping sent just before the client's end would go unanswered.
        let ending = self.client && self.phases.as_ref().is_some_and(Phases::ended);
        let stopped = self.stop.as_ref().is_some_and(|f| f.get());
        let mut progressed = false;
        let round_trip = self.p.verb.is_round_trip();

        if round_trip {
            // Read/atomic: one outstanding operation; its completion is the
            // answer.
            if !self.client {
                let done = self.p.duration.is_none() || stopped;
                if done {
                    self.finish(now);
                }
                return Ok(Step {
                    done,
                    progressed: false,
                });
            }
            if let Some(b) = self.p.ab {
                softverbs::soft::experiment::set((self.scnt / b).is_multiple_of(2));
            }
            let got = self.poll_send()?;
            if got > 0 {
                progressed = true;
                if sampling {
                    self.sample_count += got as u64;
                }
            }
            if self.ccnt == self.scnt {
                if self.scnt < self.iters && !ending {
                    now = clock.now();
                    self.post(now)?;
                    progressed = true;
                } else {
                    self.finish(now);
                }
            }
            return Ok(Step {
                done: self.done,
                progressed,
            });
        }

        // Write/send ping-pong.
        if let Some(b) = self.p.ab {
            // The arm of the round trip under way: the receive it waits
            // for, the answer's post_recv and post_send (`--ab`).
            softverbs::soft::experiment::set((self.rcnt / b).is_multiple_of(2));
        }
        if self.waiting_recv && self.try_receive()? {
            self.rcnt += 1;
            self.waiting_recv = false;
            progressed = true;
            if self.client && sampling {
                self.sample_count += 1;
            }
        }
        let tx = u64::from(self.p.tx_depth);
        if !self.waiting_recv && self.scnt < self.iters && self.scnt - self.ccnt < tx && !ending && !stopped {
            now = clock.now();
            self.post(now)?;
            self.waiting_recv = true;
            progressed = true;
        }
        if self.poll_send()? > 0 {
            progressed = true;
        }
        let finished = if self.p.duration.is_some() {
            // The client stops after its last answer; the server when told.
            ((self.client && ending && !self.waiting_recv) || (!self.client && stopped)) && self.ccnt == self.scnt
        } else {
            self.scnt == self.iters && self.rcnt == self.iters && self.ccnt == self.scnt
        };
        if finished {
            self.finish(now);
        }
        Ok(Step {
            done: self.done,
            progressed,
        })
    }

    fn progress(&self) -> f64 {
        match &self.phases {
            Some(ph) => ph.fraction(self.last_now),
            None => self.scnt as f64 / self.iters.max(1) as f64,
        }
    }
}
