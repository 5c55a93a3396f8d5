//! Completer: acknowledgements, NAKs, read responses and atomic
//! acknowledgements → send completions; retransmission (go-back-N), the
//! retry and RNR-retry counters and their timers (docs/design.md §3.7, rxe's
//! rxe_comp.c).

use crate::soft::wire::{rnr_timer_ns, NakCode, OpKind, ParsedPacket, Position, Psn, Syndrome};
use crate::verbs::{AccessFlags, EventType, QpState, QpType, WcStatus, WorkCompletion};

use super::qp::{GoBack, Qp, WqeOp, WqeState};
use super::requester::{next_packet_psn, vendor, window_start};
use super::train::TrainIn;
use super::{Core, Nanos};

/// 4.096 µs · 2^timeout, the IBTA local ACK timeout (timeout 0 = infinite).
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<Nanos> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << timeout.min(31))
    }
}

impl Core {
    /// Retires completed WQEs from the front of the send queue, in order:
    /// successes produce a CQE when signaled; a failed WQE produces its
    /// error CQE and flushes everything after it.
    pub(crate) fn complete_done_prefix(&mut self, qp: &mut Qp) {
        while let Some(state) = qp.sq.front().map(|w| w.state) {
            match state {
                WqeState::Done => {
                    let w = qp.sq.pop_front().expect("front exists");
                    qp.req.send_next = qp.req.send_next.saturating_sub(1);
                    if w.signaled {
                        let byte_len = match w.op {
                            WqeOp::CompSwap | WqeOp::FetchAdd => 8,
                            _ => w.length,
                        };
                        let wc = WorkCompletion {
                            wr_id: w.wr_id,
                            status: WcStatus::Success,
                            opcode: w.op.wc_opcode(),
                            byte_len,
                            qp_num: qp.qpn,
                            ..WorkCompletion::default()
                        };
                        self.push_cqe(qp.send_cq, wc, false);
                    }
                    qp.recycle(w.sgl);
                    qp.recycle_inline(w.inline);
                }
                WqeState::Failed(status, vendor_err) => {
                    self.complete_send_error(qp, status, vendor_err);
                    return;
                }
                _ => break,
            }
        }
        if qp.attr.sq_draining && !qp.sq.iter().any(|w| w.state == WqeState::Sent) {
            qp.attr.sq_draining = false;
            self.qp_event(qp, EventType::SqDrained);
        }
    }

    /// Sets or clears the retransmission timer after any change.
    /// `known_waiting`: the caller just sent a WQE's last packet, so one
    /// waits for its ACK (the requester, on every post: the scan of the
    /// send queue it saves was ~30 instructions).
    pub(crate) fn arm_retransmit(&mut self, qp: &mut Qp, now: Nanos, known_waiting: bool) {
        let waiting = known_waiting || qp.sq.iter().any(|w| w.state == WqeState::Sent) || qp.req.send_offset > 0;
        if !waiting || qp.state() == QpState::Err {
            qp.req.retrans_at = None;
        } else if qp.req.retrans_at.is_none() {
            qp.req.retrans_at = ack_timeout_ns(qp.attr.timeout).map(|t| now + t);
        }
        self.arm_probe(qp, now, waiting && qp.state() != QpState::Err);
        self.update_timer(qp);
    }

    /// The QP's one timer is the earlier of the RNR wait and retransmission.
    ///
    /// The armed wake-up may be earlier than that, never later: when the
    /// deadline moves out or goes away (every ACK does one or the other)
    /// the armed entry stays, fires early, finds nothing due and re-arms
    /// from the real deadlines ([`Core::on_qp_timer`]). That keeps the
    /// timer table out of the per-message path (two B-tree updates per
    /// message before); a QP that goes idle costs one spurious wake-up.
    pub(crate) fn update_timer(&mut self, qp: &mut Qp) {
        let probe = qp.req.rtt.as_ref().and_then(|r| r.probe_at);
        let t = [qp.req.rnr_wait, qp.req.retrans_at, qp.resp.nak_deadline, probe]
            .into_iter()
            .flatten()
            .min();
        match (t, qp.timer) {
            (None, _) => {}
            (Some(want), Some(armed)) if armed <= want => {}
            (Some(_), _) => self.set_timer(qp, t),
        }
    }

    pub(crate) fn on_qp_timer(&mut self, qp: &mut Qp, now: Nanos) {
        if qp.state() == QpState::Err || qp.state() == QpState::Reset {
            return;
        }
        if qp.resp.nak_deadline.is_some_and(|t| t <= now) {
            self.check_gap(qp, now);
        }
        if qp.req.rtt.as_ref().and_then(|r| r.probe_at).is_some_and(|t| t <= now) {
            if qp.req.rnr_wait.is_none() && qp.req.retrans_at.is_none_or(|t| t > now) {
                self.fire_probe(qp, now);
            } else if let Some(r) = qp.req.rtt.as_mut() {
                // Not now (an RNR wait or the retransmission rules): the
                // probe is re-armed from now when one is still waited for
                // (`arm_retransmit`). Left due, it would keep the QP's
                // timer firing at this instant.
                r.probe_at = None;
            }
        }
        if qp.req.rnr_wait.is_some_and(|t| t <= now) {
            qp.req.rnr_wait = None;
            qp.req.retrans_at = None;
            self.requester(qp, now);
        }
        if qp.req.retrans_at.is_some_and(|t| t <= now) {
            qp.req.retrans_at = None;
            self.counters.retransmit_timeouts += 1;
            if qp.req.retry_left == 0 {
                // docs/design.md §3.4: after retry_cnt timeouts the oldest
                // outstanding WQE fails with RETRY_EXC_ERR.
                if let Some(idx) = self.oldest_unacked(qp) {
                    self.fail_wqe(qp, idx, WcStatus::RetryExcErr, vendor::RETRY);
                }
            } else {
                qp.req.retry_left -= 1;
                let from = qp.req.acked_psn.next();
                self.rewind(qp, from);
                // A timeout declares every copy on the link lost: the
                // resend has the whole window.
                qp.req.go_back = None;
                self.requester(qp, now);
            }
        }
        self.arm_retransmit(qp, now, false);
    }

    fn oldest_unacked(&self, qp: &Qp) -> Option<usize> {
        qp.sq
            .iter()
            .position(|w| w.npkts > 0 && !matches!(w.state, WqeState::Done | WqeState::Failed(..)))
    }

    /// Go-back-N: make the requester resend from `psn`.
    pub(crate) fn rewind(&mut self, qp: &mut Qp, psn: Psn) {
        Self::rtt_invalidate(qp);
        let mtu = qp.mtu();
        let mut target = None;
        for (i, w) in qp.sq.iter().enumerate() {
            if w.npkts == 0 || matches!(w.state, WqeState::Done | WqeState::Failed(..)) {
                continue;
            }
            let d = w.first_psn.distance(psn);
            if d >= 0 && (d as u32) < w.npkts {
                target = Some((i, d as u32));
                break;
            }
            if d < 0 {
                // psn precedes this WQE: resend it whole.
                target = Some((i, 0));
                break;
            }
        }
        let Some((idx, pkt)) = target else { return };
        // The copies sent so far stay on the link for a while (GoBack).
        let sent_end = next_packet_psn(qp);
        // Go-back-N only goes back: a target at or after the packet the
        // requester sends next (a late NAK or RNR NAK after an earlier
        // rewind) would skip the WQEs in between, which then never complete
        // (sim_regressions, seed 622).
        if idx > qp.req.send_next || (idx == qp.req.send_next && pkt * mtu >= qp.req.send_offset) {
            let w = &qp.sq[idx];
            if w.state == WqeState::Pending {
                return;
            }
        }
        for w in qp.sq.iter_mut().skip(idx) {
            if w.state == WqeState::Sent {
                if w.op.is_read_or_atomic() {
                    qp.req.rd_atomic_inflight = qp.req.rd_atomic_inflight.saturating_sub(1);
                }
                w.state = WqeState::Pending;
            }
        }
        self.counters.retransmits += 1;
        let w = &qp.sq[idx];
        qp.req.send_next = idx;
        qp.req.send_offset = match w.op {
            WqeOp::Read | WqeOp::CompSwap | WqeOp::FetchAdd => 0,
            _ => (pkt * mtu).min(w.length),
        };
        qp.req.next_psn = w.first_psn.wrapping_add(pkt);
        let end = match qp.req.go_back {
            // Copies of an earlier go-back-N not yet known gone.
            Some(g) if !g.from.is_before(window_start(qp)) && g.end.is_after(sent_end) => g.end,
            _ => sent_end,
        };
        qp.req.go_back = Some(GoBack {
            from: next_packet_psn(qp),
            end,
        });
    }

    /// Marks send/write WQEs up to `psn` acknowledged. A read or atomic
    /// covered by the ACK whose response is missing means the responses were
    /// lost: the requester re-asks for the missing part (implied NAK).
    fn ack_up_to(&mut self, qp: &mut Qp, psn: Psn) -> bool {
        let mut progressed = false;
        let mut resend_from = None;
        let send_next = qp.req.send_next;
        let mut finished_current = false;
        let mut finished_end = None;
        for (i, w) in qp.sq.iter_mut().enumerate() {
            if w.npkts == 0 {
                break;
            }
            let last = w.first_psn.wrapping_add(w.npkts - 1);
            if last.is_after(psn) {
                break;
            }
            match w.state {
                WqeState::Sent if !w.op.is_read_or_atomic() => {
                    w.state = WqeState::Done;
                    progressed = true;
                }
                // A send or write that a rewind (RNR NAK, NAK, timeout) reset
                // to Pending, but that the ACK covers, arrived whole: it is
                // done. Left Pending, acked_psn would pass it, and its resend
                // would be re-ACKed outside the response window and never
                // complete (sim_regressions, seed 0x34459e35fd4b6e54).
                WqeState::Pending if !w.op.is_read_or_atomic() => {
                    w.state = WqeState::Done;
                    progressed = true;
                    finished_current |= i == send_next;
                    finished_end = Some(w.first_psn.wrapping_add(w.npkts));
                }
                // A plain ACK never carries a read's data or an atomic's
                // result, also when a rewind already reset the WQE to
                // Pending: acknowledging past it would lose its response
                // (sim_regressions, seed 663). The requester re-asks from
                // the first such one; sends and writes after it that the
                // ACK covers did arrive (the responder executes in order)
                // and are done, so the rewind does not send them again (a
                // resend per lost read response put a large write behind
                // every re-read: sim_regressions, large_messages).
                WqeState::Sent | WqeState::Pending if w.op.is_read_or_atomic() => {
                    if resend_from.is_none() {
                        resend_from = Some(w.first_psn.wrapping_add(w.resp_pkts));
                    }
                }
                WqeState::Pending | WqeState::Sent | WqeState::Done | WqeState::Failed(..) => {}
            }
        }
        if finished_current {
            // It may have been part-way through its resend.
            qp.req.send_offset = 0;
        }
        if let Some(end) = finished_end {
            // A rewind moved next_psn back into these WQEs; they may now be
            // retired before the requester steps over them, and new WQEs must
            // not reuse their PSNs (sim_regressions, seed 0x929).
            qp.req.next_psn = qp.req.next_psn.later(end);
        }
        // acked_psn means "every PSN up to here is done": it must not pass a
        // read or atomic whose response is missing, or that response (and
        // the duplicate the responder replays) would fall outside the
        // response window and be dropped as stale until the retries run
        // out. Found by the simulated fabric (sim_regressions, seed 43).
        let upto = resend_from.map_or(psn, |p| p.wrapping_sub(1));
        if upto.is_after(qp.req.acked_psn) {
            qp.req.acked_psn = upto;
            progressed = true;
        }
        if progressed {
            qp.req.retry_left = qp.attr.retry_cnt;
            qp.req.retrans_at = None;
        }
        if let Some(p) = resend_from {
            self.rewind(qp, p);
        }
        progressed
    }

    /// Handles a response packet (RC requester side).
    /// `train`: the payload of a read response train (checked by the
    /// caller: a READ_RESPONSE_ONLY standing for `train.npkts()` PSNs).
    pub(crate) fn handle_response(
        &mut self,
        qp: &mut Qp,
        now: Nanos,
        pkt: &ParsedPacket<'_>,
        train: Option<&TrainIn<'_>>,
    ) {
        let psn = pkt.headers.bth.psn;
        let acked_before = qp.req.acked_psn;
        // A response must be for a PSN we sent and have not seen acknowledged.
        let oldest = qp.req.acked_psn.next();
        let in_window = oldest.distance(psn) >= 0 && psn.is_before(qp.req.next_psn.max_with(qp));
        if !in_window {
            self.counters.rx_stale_responses += 1;
            return;
        }
        match pkt.info.kind {
            OpKind::Ack => {
                let Some(aeth) = pkt.headers.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.ack_up_to(qp, psn);
                    }
                    Syndrome::RnrNak { timer } => {
                        self.counters.rnr_naks_received += 1;
                        self.ack_up_to(qp, psn.wrapping_sub(1));
                        if qp.req.rnr_left == 0 {
                            if let Some(idx) = self.wqe_with_psn(qp, psn) {
                                self.fail_wqe(qp, idx, WcStatus::RnrRetryExcErr, vendor::RNR);
                            }
                        } else {
                            // rnr_retry 7 means retry forever (IBTA 9.7.5.2.8).
                            if qp.attr.rnr_retry != 7 {
                                qp.req.rnr_left -= 1;
                            }
                            self.rewind(qp, psn);
                            qp.req.rnr_wait = Some(now + rnr_timer_ns(timer));
                            qp.req.retrans_at = None;
                        }
                    }
                    Syndrome::Nak(code) => {
                        self.ack_up_to(qp, psn.wrapping_sub(1));
                        let status = match code {
                            NakCode::PsnSequenceError => {
                                self.counters.seq_naks_received += 1;
                                let at = (psn, qp.req.acked_psn);
                                // A SACK NAK again at the same place lists
                                // gaps whose resends were lost: not a copy.
                                let sack = self.rx_sack.is_some() && self.sr_requester(qp);
                                if qp.req.last_nak == Some(at) && !sack {
                                    self.counters.seq_naks_duplicate += 1;
                                } else {
                                    qp.req.last_nak = Some(at);
                                    let sack = self.rx_sack.take();
                                    if sack.is_some() {
                                        self.counters.sacks_received += 1;
                                    }
                                    // During an RNR wait nothing is resent before
                                    // the wait ends (the responder has no
                                    // receive yet: an early resend would use
                                    // up an RNR retry); going back is what the
                                    // wait's end does anyway.
                                    let selective = qp.req.rnr_wait.is_none()
                                        && self.sr_requester(qp)
                                        && sack.is_some_and(|s| self.selective_resend(qp, now, psn, &s));
                                    if !selective {
                                        self.rewind(qp, psn);
                                    }
                                }
                                None
                            }
                            NakCode::InvalidRequest => Some(WcStatus::RemInvReqErr),
                            NakCode::RemoteAccessError => Some(WcStatus::RemAccessErr),
                            NakCode::RemoteOperationalError => Some(WcStatus::RemOpErr),
                            NakCode::InvalidRdRequest => Some(WcStatus::RemInvRdReqErr),
                            NakCode::Unknown(_) => Some(WcStatus::BadRespErr),
                        };
                        if let Some(st) = status {
                            if let Some(idx) = self.wqe_with_psn(qp, psn) {
                                self.fail_wqe(qp, idx, st, vendor::NAK);
                            }
                        }
                    }
                    Syndrome::Reserved(_) => {
                        self.counters.rx_malformed += 1;
                    }
                }
            }
            OpKind::ReadResponse => self.handle_read_response(qp, pkt, train),
            OpKind::AtomicAck => self.handle_atomic_ack(qp, pkt),
            _ => {}
        }
        if qp.req.acked_psn.is_after(acked_before) {
            let acked = qp.req.acked_psn;
            self.rtt_on_ack(qp, now, acked);
        }
        self.complete_done_prefix(qp);
        if qp.req.go_back.is_some_and(|g| g.from.is_before(window_start(qp))) {
            // The responder has the resent packet: the copies sent before
            // it have left the link.
            qp.req.go_back = None;
        }
        // Transmits what the ACK opened up and re-arms the retransmission
        // timer (in ERR it only clears it).
        self.requester(qp, now);
    }

    pub(crate) fn wqe_with_psn(&self, qp: &Qp, psn: Psn) -> Option<usize> {
        qp.sq.iter().position(|w| {
            w.npkts > 0 && {
                let d = w.first_psn.distance(psn);
                d >= 0 && (d as u32) < w.npkts
            }
        })
    }

    fn handle_read_response(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>, train: Option<&TrainIn<'_>>) {
        let psn = pkt.headers.bth.psn;
        let Some(idx) = self.wqe_with_psn(qp, psn) else { return };
        let mtu = qp.mtu();
        {
            let w = &qp.sq[idx];
            if w.op != WqeOp::Read || w.state != WqeState::Sent {
                self.counters.rx_stale_responses += 1;
                return;
            }
            // Responses arrive in order; anything else is a duplicate or a
            // gap that the ACK/timeout logic recovers.
            if w.first_psn.wrapping_add(w.resp_pkts) != psn {
                self.counters.rx_stale_responses += 1;
                return;
            }
        }
        // Everything before the read is implicitly acknowledged.
        if pkt.headers.aeth.is_some() || pkt.info.position == Position::Middle {
            self.ack_up_to(qp, qp.sq[idx].first_psn.wrapping_sub(1));
        }
        let Some(idx) = self.wqe_with_psn(qp, psn) else { return };
        if qp.sq[idx].state != WqeState::Sent {
            // As for atomics: an earlier read or atomic lacks its response
            // and the requester went back to it; this read is resent
            // (sim_regressions, seed 559).
            self.counters.rx_stale_responses += 1;
            return;
        }
        let (offset, length, ends) = {
            let w = &qp.sq[idx];
            (w.resp_pkts * mtu, w.length, pkt.info.position.ends_message())
        };
        // A train carries the rest of the read: every remaining packet.
        let remaining = length - offset.min(length);
        let (expect, got, pkts) = match train {
            Some(t) => (remaining as usize, t.len() as usize, t.npkts()),
            None => (remaining.min(mtu) as usize, pkt.payload.len(), 1),
        };
        let last_expected = offset as u64 + expect as u64 >= u64::from(length);
        let pkts_ok = train.is_none_or(|_| qp.sq[idx].resp_pkts + pkts == qp.sq[idx].npkts);
        if got != expect || ends != last_expected || !pkts_ok {
            // A response of the wrong size is a bad response (IBTA 9.9.3).
            self.fail_wqe(qp, idx, WcStatus::BadRespErr, vendor::NAK);
            return;
        }
        let placed = match train {
            Some(t) => self.scatter_train_to_send_wqe(qp, idx, offset, t),
            None => self.scatter_send_wqe(qp, idx, offset, pkt.payload),
        };
        if placed.is_err() {
            self.fail_wqe(qp, idx, WcStatus::LocProtErr, vendor::LOCAL_KEY);
            return;
        }
        let w = &mut qp.sq[idx];
        w.resp_pkts += pkts;
        // Every in-order response is progress: the retry budget and the
        // timer restart (as rxe does on each response). Resetting only at the
        // end let a long read lose its retries while it was still
        // progressing, one lost response per timeout. Found by the simulated
        // fabric (sim_regressions, seed 23).
        qp.req.retry_left = qp.attr.retry_cnt;
        qp.req.retrans_at = None;
        // The PSNs answered are acknowledged (everything before the read
        // is, see above): they leave the window, so a read longer than it
        // does not hold the window shut once resumed, and a resumed read's
        // first response proves a go-back-N's copies gone.
        qp.req.acked_psn = qp.req.acked_psn.later(w.first_psn.wrapping_add(w.resp_pkts - 1));
        if ends {
            w.state = WqeState::Done;
            qp.req.rd_atomic_inflight = qp.req.rd_atomic_inflight.saturating_sub(1);
        }
    }

    fn handle_atomic_ack(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>) {
        let psn = pkt.headers.bth.psn;
        let Some(idx) = self.wqe_with_psn(qp, psn) else { return };
        if !qp.sq[idx].op.is_atomic() || qp.sq[idx].state != WqeState::Sent {
            self.counters.rx_stale_responses += 1;
            return;
        }
        self.ack_up_to(qp, psn.wrapping_sub(1));
        if qp.sq[idx].state != WqeState::Sent {
            // The ACK implied by this response found an earlier read or
            // atomic without its response and went back to it (go-back-N);
            // this WQE is resent too and completes from the replayed
            // response, in order, as in rxe (sim_regressions, seed 559).
            self.counters.rx_stale_responses += 1;
            return;
        }
        let Some(orig) = pkt.headers.atomic_ack_eth.map(|a| a.original_value) else {
            return;
        };
        // The original value lands in local memory in host byte order, as
        // rxe and mlx5 deliver it.
        if self.scatter_send_wqe(qp, idx, 0, &orig.to_ne_bytes()).is_err() {
            self.fail_wqe(qp, idx, WcStatus::LocProtErr, vendor::LOCAL_KEY);
            return;
        }
        let w = &mut qp.sq[idx];
        w.state = WqeState::Done;
        qp.req.rd_atomic_inflight = qp.req.rd_atomic_inflight.saturating_sub(1);
        qp.req.acked_psn = qp.req.acked_psn.later(psn);
        qp.req.retry_left = qp.attr.retry_cnt;
        qp.req.retrans_at = None;
    }

    /// Writes a read response train into WQE `idx`'s local scatter list
    /// from `offset` on.
    fn scatter_train_to_send_wqe(&self, qp: &Qp, idx: usize, offset: u32, t: &TrainIn<'_>) -> Result<(), ()> {
        let sgl = &qp.sq[idx].sgl;
        self.mrs.for_each_piece(
            sgl,
            qp.pd,
            offset.into(),
            t.len() as usize,
            AccessFlags::LOCAL_WRITE,
            |r, at, n| r.write_train(t, at as u64, n),
        )
    }

    /// Writes `data` into WQE `idx`'s local scatter list at `offset`.
    fn scatter_send_wqe(&self, qp: &Qp, idx: usize, offset: u32, data: &[u8]) -> Result<(), ()> {
        let sgl = &qp.sq[idx].sgl;
        self.mrs.for_each_piece(
            sgl,
            qp.pd,
            offset.into(),
            data.len(),
            AccessFlags::LOCAL_WRITE,
            |r, at, n| r.write(&data[at..at + n]),
        )
    }
}

/// The end of the response window: responses may name any PSN up to the
/// last one transmitted.
trait WindowEnd {
    fn max_with(self, qp: &Qp) -> Psn;
}

impl WindowEnd for Psn {
    fn max_with(self, qp: &Qp) -> Psn {
        // After a rewind next_psn moved back; responses up to the furthest
        // PSN ever sent (the end of the last started WQE) are still valid.
        let furthest = qp
            .sq
            .iter()
            .rev()
            .find(|w| w.npkts > 0)
            .map(|w| w.first_psn.wrapping_add(w.npkts));
        furthest.map_or(self, |f| f.later(self))
    }
}

#[allow(dead_code)]
fn _types(_: QpType) {}
