//! Loss and reordering recovery beyond plain go-back-N
//! (docs/design.md §3.7 and §10).
//!
//! **Responder: a reordering buffer.** An RC request packet that arrives
//! beyond the expected PSN is kept (a copy of the datagram, up to
//! [`HOLD_MAX_PKTS`] packets and [`HOLD_MAX_BYTES`] bytes per QP) instead
//! of being dropped, and replayed through the ordinary in-order path once
//! the gap before it fills. Nothing is placed or executed out of order, so
//! every verbs guarantee (in-order placement, last byte last, RECV
//! consumption, READ/atomic execution, duplicate detection) is the one of
//! in-order arrival: the buffer only moves the moment a packet is
//! processed, as a longer path would.
//!
//! **Responder: when to NAK.** Until the path is known to reorder the gap
//! is NAK'd at once, as the standard says. The path is known to reorder
//! when a packet that filled a gap arrives a second time: two copies were
//! in flight, so the NAK was premature (the original was late, not lost).
//! From then on, toward a go-back-N requester, the NAK waits for a
//! reordering window (learned from the gaps that filled by themselves,
//! [`WINDOW_MIN_NS`] to [`WINDOW_MAX_NS`]); a standard requester only sees
//! a later NAK, as from a longer path. A selective-repeat requester gets
//! it at once: a premature one costs it one resent packet, not a window.
//!
//! **Selective repeat.** A soft device with [`Recovery::SelectiveRepeat`]
//! announces itself in its packets ([`crate::soft::wire::set_soft_cap`]).
//! A responder whose peer announced itself adds the held ranges to its
//! sequence NAK (a SACK, [`crate::soft::wire::Sack`]); a requester that
//! gets one resends only the missing packets of SENDs and WRITEs (a gap
//! that touches a READ or atomic, or that it cannot map, falls back to
//! go-back-N from the NAK's PSN). Gaps listed once are listed again only
//! after twice the measured time from a SACK to the fill of its first gap
//! (a resend or the SACK was lost).
//!
//! **Requester: RTT-adaptive probe.** Between soft devices the requester
//! measures the round trip (one sample at a time, never from a resent
//! packet) into SRTT/RTTVAR as RFC 6298 does, and when nothing was
//! acknowledged for `max(SRTT + 4·RTTVAR, PROBE_MIN_NS)` it resends the
//! oldest unacknowledged packet asking for an ACK (a tail-loss probe: the
//! answer is an ACK, or a NAK with the ranges held). Probes back off
//! exponentially, stay below the QP's IBTA timeout, and never consume
//! `retry_cnt`: only the IBTA timer does, so a dead peer still ends in
//! RETRY_EXC_ERR after `retry_cnt` timeouts of 4.096 µs·2^timeout.

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::soft::wire::{
    set_soft_cap, AethRepr, BthRepr, NakCode, Opcode, Packet, Psn, Qpn, Sack, SackRange, Syndrome, SACK_MAX_RANGES,
};
use crate::verbs::{QpState, QpType};

use super::completer::ack_timeout_ns;
use super::qp::{Qp, WqeOp, WqeState};
use super::requester::next_packet_psn;
use super::{Core, Nanos};

/// The recovery a soft device offers its peers.
///
/// Selective repeat is the default: it is used only with a peer that
/// offers it too, and falls back to go-back-N toward any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recovery {
    /// Standard go-back-N on the wire, toward every peer (the reordering
    /// buffer still works: it is local to the responder).
    GoBackN,
    /// Selective repeat and the adaptive probe with peers that announce
    /// it too; standard go-back-N toward any other.
    #[default]
    SelectiveRepeat,
}

/// Most out-of-order packets a responder QP holds.
pub const HOLD_MAX_PKTS: u32 = 1024;
/// Most bytes of out-of-order packets a responder QP holds.
pub const HOLD_MAX_BYTES: usize = 8 << 20;
/// Smallest reordering window once the path is known to reorder.
pub const WINDOW_MIN_NS: Nanos = 4_000;
/// Largest reordering window.
pub const WINDOW_MAX_NS: Nanos = 200_000;
/// Smallest interval of the requester's adaptive probe.
pub const PROBE_MIN_NS: Nanos = 20_000;
/// The probe interval before the first RTT sample (RFC 6298 starts at
/// 1 s; the IBTA timeout bounds it anyway).
pub const PROBE_INITIAL_NS: Nanos = 1_000_000;

/// Gap fillers remembered for reordering detection.
const FILLERS: usize = 8;

/// A held out-of-order request packet.
#[derive(Debug)]
pub(crate) struct Held {
    data: Vec<u8>,
    src: IpAddr,
    dst: IpAddr,
    at: Nanos,
}

/// The responder's reordering state, allocated at the first gap.
#[derive(Debug, Default)]
pub(crate) struct Reorder {
    /// Slot `i` holds PSN `base + i`.
    slots: VecDeque<Option<Held>>,
    base: Psn,
    count: u32,
    bytes: usize,
    /// When the current gap was first seen (NAK deadline base).
    gap_at: Option<Nanos>,
    /// The path was seen to reorder.
    pub(crate) tolerant: bool,
    /// The reordering window, once tolerant.
    pub(crate) window_ns: Nanos,
    /// The last packets that filled a gap, and when their gaps were seen.
    fillers: VecDeque<(Psn, Nanos)>,
    /// Every gap before this PSN was listed in a SACK already.
    requested_upto: Option<Psn>,
    /// When the last SACK left, until its first gap fills (a sample).
    sack_at: Option<Nanos>,
    /// When the last SACK left.
    listed_at: Option<Nanos>,
    /// Smoothed time from a SACK to the fill of its first gap: how long a
    /// selective resend takes to arrive. A gap listed and not filled after
    /// twice that is listed again (its resend was lost).
    fill_ns: Nanos,
}

impl Reorder {
    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Drops the slots before `epsn` (processed or now duplicates).
    fn advance_to(&mut self, epsn: Psn) {
        let d = self.base.distance(epsn);
        if d <= 0 {
            return;
        }
        for _ in 0..(d as usize).min(self.slots.len()) {
            if let Some(h) = self.slots.pop_front().flatten() {
                self.count -= 1;
                self.bytes -= h.data.len();
            }
        }
        self.base = epsn;
    }

    fn clear(&mut self, epsn: Psn) {
        self.slots.clear();
        self.count = 0;
        self.bytes = 0;
        self.base = epsn;
        self.gap_at = None;
        self.requested_upto = None;
    }

    /// The held PSN ranges, in order, at most [`SACK_MAX_RANGES`].
    fn ranges(&self) -> Vec<SackRange> {
        let mut out: Vec<SackRange> = Vec::new();
        let mut run: Option<SackRange> = None;
        for (i, s) in self.slots.iter().enumerate() {
            match (s.is_some(), run.as_mut()) {
                (true, Some(r)) => r.npkts += 1,
                (true, None) => {
                    run = Some(SackRange {
                        first: self.base.wrapping_add(i as u32),
                        npkts: 1,
                    })
                }
                (false, Some(_)) => {
                    out.extend(run.take());
                    if out.len() == SACK_MAX_RANGES {
                        return out;
                    }
                }
                (false, None) => {}
            }
        }
        out.extend(run);
        out
    }

    fn first_held_at(&self) -> Option<Nanos> {
        self.slots.iter().flatten().next().map(|h| h.at)
    }
}

/// SRTT/RTTVAR of one requester QP (RFC 6298), and its probe.
#[derive(Debug, Default, Clone)]
pub(crate) struct Rtt {
    srtt: Nanos,
    rttvar: Nanos,
    /// The packet being timed and when it left.
    sample: Option<(Psn, Nanos)>,
    /// When the probe fires.
    pub(crate) probe_at: Option<Nanos>,
    /// Probes sent since the last progress (each doubles the interval).
    backoff: u32,
    /// The PSN after the furthest packet sent: a packet before it is a
    /// resend, never timed (Karn).
    highest: Option<Psn>,
}

impl Rtt {
    fn add_sample(&mut self, r: Nanos) {
        if self.srtt == 0 {
            self.srtt = r.max(1);
            self.rttvar = r / 2;
        } else {
            let err = self.srtt.abs_diff(r);
            self.rttvar = (3 * self.rttvar + err) / 4;
            self.srtt = (7 * self.srtt + r) / 8;
        }
    }

    /// The probe interval: RTO = SRTT + 4·RTTVAR, at least
    /// [`PROBE_MIN_NS`], doubled per probe without progress.
    pub(crate) fn rto(&self) -> Nanos {
        let base = if self.srtt == 0 {
            PROBE_INITIAL_NS
        } else {
            (self.srtt + 4 * self.rttvar).max(PROBE_MIN_NS)
        };
        base.saturating_mul(1 << self.backoff.min(16))
    }
}

impl Core {
    /// Whether the QP does selective repeat with its peer as a requester.
    pub(crate) fn sr_requester(&self, qp: &Qp) -> bool {
        self.cfg.recovery == Recovery::SelectiveRepeat && qp.req.peer_sr && qp.qp_type == QpType::Rc
    }

    /// Whether the QP's request packets announce the capability.
    pub(crate) fn announces_sr(&self, qp: &Qp) -> bool {
        self.cfg.recovery == Recovery::SelectiveRepeat && qp.qp_type == QpType::Rc
    }

    /// Whether the QP's responses go to a peer that announced the capability.
    pub(crate) fn sr_responder(&self, qp: &Qp) -> bool {
        self.cfg.recovery == Recovery::SelectiveRepeat && qp.resp.peer_sr
    }

    // ---- responder ------------------------------------------------------

    /// An RC request packet `dist` PSNs beyond the expected one arrived:
    /// hold it if it fits, then NAK now or arm the NAK deadline.
    pub(crate) fn out_of_order(&mut self, qp: &mut Qp, now: Nanos, psn: Psn, raw: &[u8], src: IpAddr, dst: IpAddr) {
        let epsn = qp.resp.epsn;
        let dist = epsn.distance(psn);
        let o = qp.resp.ooo.get_or_insert_with(|| {
            Box::new(Reorder {
                base: epsn,
                ..Reorder::default()
            })
        });
        o.advance_to(epsn);
        let fits =
            dist > 0 && (dist as u32) < HOLD_MAX_PKTS && o.bytes + raw.len() <= HOLD_MAX_BYTES && !raw.is_empty();
        if fits {
            let i = dist as usize;
            if o.slots.len() <= i {
                o.slots.resize_with(i + 1, || None);
            }
            if o.slots[i].is_none() {
                let mut data = self.take_buffer(raw.len());
                data.extend_from_slice(raw);
                o.slots[i] = Some(Held {
                    data,
                    src,
                    dst,
                    at: now,
                });
                o.count += 1;
                o.bytes += raw.len();
                self.counters.rx_held += 1;
            } else {
                self.counters.rx_duplicates += 1;
            }
        }
        if o.gap_at.is_none() {
            o.gap_at = Some(now);
        }
        self.check_gap(qp, now);
    }

    /// Called before an in-order request is processed: if packets are
    /// held, this one fills a gap. Learns the reordering window from gaps
    /// that filled before their NAK.
    pub(crate) fn note_gap_fill(&mut self, qp: &mut Qp, now: Nanos, psn: Psn) {
        let nak_sent = qp.resp.nak_sent;
        let Some(o) = qp.resp.ooo.as_mut() else { return };
        if o.count == 0 {
            return;
        }
        let gap_at = o.gap_at.unwrap_or(now);
        if let (true, Some(t)) = (nak_sent, o.sack_at.take()) {
            let s = now.saturating_sub(t).max(1);
            o.fill_ns = if o.fill_ns == 0 { s } else { (7 * o.fill_ns + s) / 8 };
        }
        if o.fillers.len() == FILLERS {
            o.fillers.pop_front();
        }
        o.fillers.push_back((psn, gap_at));
        if o.tolerant && !nak_sent {
            let late = now.saturating_sub(gap_at);
            o.window_ns = o.window_ns.max(late + late / 4).clamp(WINDOW_MIN_NS, WINDOW_MAX_NS);
        }
    }

    /// A duplicate request arrived: if it is a second copy of the packet
    /// that filled the last gap, the path reorders.
    pub(crate) fn note_duplicate(&mut self, qp: &mut Qp, now: Nanos, psn: Psn) {
        let Some(o) = qp.resp.ooo.as_mut() else { return };
        if let Some(i) = o.fillers.iter().position(|&(p, _)| p == psn) {
            if let Some((_, gap_at)) = o.fillers.remove(i) {
                let late = now.saturating_sub(gap_at);
                if !o.tolerant {
                    self.counters.reorder_detected += 1;
                }
                o.tolerant = true;
                o.window_ns = o.window_ns.max(late + late / 4).clamp(WINDOW_MIN_NS, WINDOW_MAX_NS);
            }
        }
    }

    /// Replays the held packets that are now in order.
    pub(crate) fn drain_held(&mut self, qp: &mut Qp, now: Nanos) {
        loop {
            let epsn = qp.resp.epsn;
            let live = matches!(qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe);
            let Some(o) = qp.resp.ooo.as_mut() else { return };
            o.advance_to(epsn);
            if o.count == 0 {
                break;
            }
            if !live {
                o.clear(epsn);
                return;
            }
            let Some(Some(h)) = o.slots.front_mut().map(Option::take) else {
                break;
            };
            o.count -= 1;
            o.bytes -= h.data.len();
            match Packet::parse(&h.data) {
                Ok(pkt) => self.handle_request(qp, now, &pkt, h.src, h.dst, None, &h.data),
                Err(_) => self.counters.rx_malformed += 1,
            }
            self.recycle_buffer(h.data);
            if qp.resp.epsn == epsn {
                // Not processed (RNR, a fatal error): the requester resends.
                break;
            }
        }
        if let Some(o) = qp.resp.ooo.as_mut() {
            o.gap_at = o.first_held_at();
        }
        self.check_gap(qp, now);
    }

    /// Sends the sequence NAK of the current gap when it is due, else arms
    /// its deadline.
    pub(crate) fn check_gap(&mut self, qp: &mut Qp, now: Nanos) {
        qp.resp.nak_deadline = None;
        let epsn = qp.resp.epsn;
        if qp.resp.rnr_at == Some(epsn) && self.sr_responder(qp) {
            // The missing packet came and was refused for want of a
            // receive (RNR NAK): its retry follows the requester's RNR
            // timer. A SACK now would make the requester resend it early
            // and spend an RNR retry.
            return;
        }
        let Some(o) = qp.resp.ooo.as_mut() else { return };
        if o.count == 0 {
            o.gap_at = None;
            return;
        }
        let sr_peer = self.cfg.recovery == Recovery::SelectiveRepeat && qp.resp.peer_sr;
        if qp.resp.nak_sent || o.requested_upto.is_some_and(|r| epsn.is_before(r)) {
            // This gap was NAK'd or listed in a SACK: its resend is on the
            // way. A selective-repeat peer is told again once twice the
            // usual time for a resend went by (the resend or the SACK was
            // lost); otherwise the requester's timers cover it.
            let (Some(t), true) = (o.listed_at, sr_peer && o.fill_ns > 0) else {
                return;
            };
            let due = t + 2 * o.fill_ns.max(WINDOW_MIN_NS);
            if now < due {
                qp.resp.nak_deadline = Some(due);
                self.update_timer(qp);
                return;
            }
            self.counters.sacks_repeated += 1;
        }
        let Some(o) = qp.resp.ooo.as_mut() else { return };
        let gap_at = *o.gap_at.get_or_insert(now);
        // A selective-repeat peer resends only what a NAK lists, so a NAK
        // of a packet that was only late costs one packet: it gets the
        // NAK at once. A go-back-N peer would resend the whole window.
        let wait = o.tolerant && !(self.cfg.recovery == Recovery::SelectiveRepeat && qp.resp.peer_sr);
        let due = if wait { gap_at + o.window_ns } else { gap_at };
        if now < due {
            qp.resp.nak_deadline = Some(due);
            self.update_timer(qp);
            return;
        }
        qp.resp.nak_sent = true;
        self.counters.seq_naks_sent += 1;
        if self.sr_responder(qp) {
            let ranges = qp.resp.ooo.as_ref().map(|o| o.ranges()).unwrap_or_default();
            if let (Some(o), Some(last)) = (qp.resp.ooo.as_mut(), ranges.last()) {
                o.requested_upto = Some(last.end());
                o.sack_at = Some(now);
                o.listed_at = Some(now);
            }
            self.send_sack(qp, epsn, Sack { ranges });
        } else {
            self.send_ack(qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
        }
    }

    /// Forgets everything held (the QP was reset or re-targeted).
    pub(crate) fn reset_reorder(qp: &mut Qp) {
        qp.resp.ooo = None;
        qp.resp.nak_deadline = None;
    }

    /// A sequence NAK at `psn` with the SACK extension.
    fn send_sack(&mut self, qp: &mut Qp, psn: Psn, sack: Sack) {
        let bth = BthRepr::new(Opcode::RcAcknowledge, Qpn::new(qp.attr.dest_qp_num), psn);
        let aeth = AethRepr {
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn: qp.resp.msn,
        };
        let mut data = self.take_buffer(BthRepr::LEN + AethRepr::LEN + sack.len() + crate::soft::wire::ICRC_LEN);
        data.resize(BthRepr::LEN + AethRepr::LEN, 0);
        let (b, a) = data.split_at_mut(BthRepr::LEN);
        if bth.emit(b).is_err() || aeth.emit(a).is_err() || sack.emit(&mut data).is_err() {
            self.counters.tx_emit_errors += 1;
            return;
        }
        set_soft_cap(&mut data);
        let dst = qp.attr.ah_attr.grh.dgid.to_ip();
        let sgid = qp.attr.ah_attr.grh.sgid_index;
        self.counters.tx_responses += 1;
        self.counters.sacks_sent += 1;
        let payload = sack.len();
        self.queue_packet(qp.qpn, qp.attr.dest_qp_num, sgid, dst, payload, data);
    }

    // ---- requester ------------------------------------------------------

    /// A SACK NAK at `from`: resends the missing packets only. `false`
    /// when selective repeat cannot serve it (the caller goes back N).
    pub(crate) fn selective_resend(&mut self, qp: &mut Qp, now: Nanos, from: Psn, sack: &Sack) -> bool {
        let next = next_packet_psn(qp);
        let sent_end = match qp.req.go_back {
            Some(g) => g.end.later(next),
            None => next,
        };
        let mut holes: Vec<(Psn, Psn)> = Vec::new();
        let mut cur = from;
        for r in &sack.ranges {
            if cur.distance(r.first) <= 0 || r.end().is_after(sent_end) {
                return false;
            }
            holes.push((cur, r.first));
            cur = r.end();
        }
        // A held packet arrived: if it is the one being timed, the SACK
        // answers it (later than an ACK would by at most the reordering
        // window).
        if let Some(r) = qp.req.rtt.as_mut() {
            if let Some((p, t)) = r.sample {
                if sack
                    .ranges
                    .iter()
                    .any(|g| g.first.distance(p) >= 0 && p.is_before(g.end()))
                {
                    r.sample = None;
                    r.add_sample(now.saturating_sub(t));
                }
            }
        }
        let mut plan: Vec<(usize, Psn)> = Vec::new();
        for &(a, b) in &holes {
            let mut p = a;
            while p != b {
                let Some(idx) = self.wqe_with_psn(qp, p) else {
                    return false;
                };
                let w = &qp.sq[idx];
                if w.op.is_read_or_atomic() || w.op.is_local() {
                    return false;
                }
                match w.state {
                    WqeState::Sent => plan.push((idx, p)),
                    WqeState::Pending if !p.is_before(next) => {} // goes anyway
                    WqeState::Pending if idx == qp.req.send_next => plan.push((idx, p)),
                    WqeState::Done | WqeState::Failed(..) => {}
                    WqeState::Pending => return false,
                }
                p = p.next();
            }
        }
        let n = plan.len();
        for (i, &(idx, p)) in plan.iter().enumerate() {
            self.resend_packet(qp, idx, p, i + 1 == n);
        }
        Self::rtt_invalidate(qp);
        self.counters.retransmits += 1;
        self.counters.sr_resent_packets += n as u64;
        true
    }

    /// Resends the packet at `psn` of SEND/WRITE WQE `idx`, leaving the
    /// requester's position where it was.
    pub(crate) fn resend_packet(&mut self, qp: &mut Qp, idx: usize, psn: Psn, ack: bool) {
        let k = qp.sq[idx].first_psn.distance(psn).max(0) as u32;
        let saved = (qp.req.send_offset, qp.req.unasked_pkts, qp.req.unasked_wqes);
        qp.req.send_offset = k * qp.mtu();
        self.send_packet(qp, idx, u32::MAX, ack);
        (qp.req.send_offset, qp.req.unasked_pkts, qp.req.unasked_wqes) = saved;
    }

    /// The requester sent a packet at `psn` for the first time: time it if
    /// nothing is being timed.
    pub(crate) fn rtt_on_send(&mut self, qp: &mut Qp, now: Nanos, psn: Psn) {
        if !self.sr_requester(qp) || qp.req.go_back.is_some() {
            return;
        }
        let r = qp.req.rtt.get_or_insert_with(Box::default);
        if r.highest.is_some_and(|h| psn.is_before(h)) {
            return;
        }
        r.highest = Some(psn.next());
        if r.sample.is_none() {
            r.sample = Some((psn, now));
        }
    }

    /// Loss recovery started: the sample under way would measure the
    /// recovery, not the path (Karn; a sample that waited behind a
    /// repaired gap once put SRTT at the IBTA timeout and the probe out
    /// of play).
    pub(crate) fn rtt_invalidate(qp: &mut Qp) {
        if let Some(r) = qp.req.rtt.as_mut() {
            r.sample = None;
        }
    }

    /// Progress up to `acked` at `now`: takes an RTT sample and restarts
    /// the probe.
    pub(crate) fn rtt_on_ack(&mut self, qp: &mut Qp, now: Nanos, acked: Psn) {
        let Some(r) = qp.req.rtt.as_mut() else { return };
        if let Some((p, t)) = r.sample {
            if !p.is_after(acked) {
                r.sample = None;
                r.add_sample(now.saturating_sub(t));
            }
        }
        r.backoff = 0;
        r.probe_at = None;
    }

    /// Arms the probe while requests wait for an answer (between soft
    /// devices, below the IBTA timeout).
    pub(crate) fn arm_probe(&mut self, qp: &mut Qp, now: Nanos, waiting: bool) {
        if !self.sr_requester(qp) {
            return;
        }
        let cap = ack_timeout_ns(qp.attr.timeout);
        let rnr_wait = qp.req.rnr_wait.is_some();
        let Some(r) = qp.req.rtt.as_mut() else { return };
        // No probe during an RNR wait: the wait's end resends.
        if !waiting || rnr_wait {
            r.probe_at = None;
            return;
        }
        if r.probe_at.is_none() {
            let rto = r.rto();
            if cap.is_none_or(|c| rto < c) {
                r.probe_at = Some(now + rto);
            }
        }
    }

    /// The probe fired: resend the oldest unacknowledged packet asking for
    /// an ACK (a read or atomic is re-asked by going back to it).
    pub(crate) fn fire_probe(&mut self, qp: &mut Qp, now: Nanos) {
        let Some(r) = qp.req.rtt.as_mut() else { return };
        r.probe_at = None;
        r.backoff += 1;
        self.counters.probes += 1;
        r.sample = None;
        let oldest = qp.req.acked_psn.next();
        let Some(idx) = self.wqe_with_psn(qp, oldest) else {
            return;
        };
        let w = &qp.sq[idx];
        let sendable = !w.op.is_read_or_atomic()
            && !w.op.is_local()
            && (w.state == WqeState::Sent || (w.state == WqeState::Pending && oldest.is_before(next_packet_psn(qp))));
        if sendable {
            self.resend_packet(qp, idx, oldest, true);
        } else if matches!(w.op, WqeOp::Read | WqeOp::CompSwap | WqeOp::FetchAdd) && w.state == WqeState::Sent {
            self.rewind(qp, oldest);
            self.requester(qp, now);
        }
    }
}
