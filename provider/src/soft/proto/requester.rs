//! Requester: turns send-queue WQEs into request packets (IBTA 9.4, rxe's
//! rxe_req.c): segmentation at the path MTU, PSN assignment, the
//! outstanding read/atomic bound, fences, and local operations.

use std::net::IpAddr;

use crate::soft::wire::{
    pad_len, AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, IpPseudoHeader, MessageHeaders, OpKind, Opcode,
    PacketRepr, Pkey, Position, Psn, Qpn, RethRepr, Transport, UdpPorts, ICRC_LEN,
};
use crate::verbs::{AccessFlags, QpState, QpType, WcStatus};

use super::mr::KeyError;
use super::qp::{Qp, SendWqe, WqeOp, WqeState};
use super::train::{TrainOut, TrainPiece, TRAIN_MAX_PIECES, TRAIN_MIN_LEN, TRAIN_PROCESS_MIN_LEN};
use super::{Core, Nanos, Transmit};

/// Vendor error codes the soft provider reports in `vendor_err` (the table
/// on [`WorkCompletion`](crate::verbs::WorkCompletion) documents them for
/// users: keep the two in step).
pub(crate) mod vendor {
    /// Local key check failed.
    pub(crate) const LOCAL_KEY: u32 = 0x51;
    /// NAK received.
    pub(crate) const NAK: u32 = 0x53;
    /// Retries exhausted.
    pub(crate) const RETRY: u32 = 0x54;
    /// RNR retries exhausted.
    pub(crate) const RNR: u32 = 0x55;
    /// A memory management operation (REG_MR, LOCAL_INV, BIND_MW) failed.
    pub(crate) const MEM_OP: u32 = 0x56;
}

pub(crate) fn transport_of(t: QpType) -> Transport {
    match t {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
    }
}

/// Number of packets (and PSNs) a message of `len` bytes takes.
pub(crate) fn packets_for(len: u32, mtu: u32) -> u32 {
    if len == 0 {
        1
    } else {
        len.div_ceil(mtu)
    }
}

/// The UDP source port a QP uses: fixed per QP pair, for ECMP entropy.
pub(crate) fn entropy_port(a: u32, b: u32) -> u16 {
    0xc000 | (((a ^ b) ^ ((a ^ b) >> 14)) & 0x3fff) as u16
}

/// The AckReq policy of RC SEND and WRITE packets (reads and atomics always
/// ask: their responses are the answer). The responder acknowledges only the
/// packets that ask, and one ACK covers every packet before it (IBTA
/// 9.7.5.1.2), so a packet asks only when somebody is waiting for the answer:
/// - the last packet of a signaled WQE (its completion needs the ACK);
/// - any packet once `ack_every` packets went without asking (the window
///   and the responder's resources move on);
/// - the last packet of a WQE that leaves the send queue half full or
///   more, which frees slots for an application that signals rarely, once
///   an eighth of the queue went by without asking (an application that
///   keeps its queue full would otherwise have every message acknowledged,
///   an ACK to build, send, receive and process per message);
/// - the last packet while the QP drains (SQD waits for every ACK);
/// - the packet that fills the window (`closes`): nothing more goes until
///   an ACK frees room, and after a go-back-N the room may be smaller than
///   `ack_every` (see [`super::qp::GoBack`]).
///
/// Unsignaled messages behind which nothing asks are acknowledged by the
/// next packet that does, or else after the local ACK timeout by the
/// duplicate of the resent packet (duplicates are always answered), as with
/// hardware that coalesces ACK requests. This takes the ACK off the critical
/// path of a ping-pong that signals only every Nth send (perftest's
/// `ib_send_lat`): one datagram per message instead of two.
pub(super) fn asks_ack(qp: &mut Qp, idx: usize, pkts: u32, last: bool, closes: bool, ack_every: u32) -> bool {
    let signaled = last && qp.sq[idx].signaled;
    asks_ack_queued(qp, qp.sq.len(), signaled, pkts, last, closes, ack_every)
}

/// [`asks_ack`] for a WQE that is not in the send queue yet: `sq_len`
/// counts it, `signaled` is its own.
pub(super) fn asks_ack_queued(
    qp: &mut Qp,
    sq_len: usize,
    signaled: bool,
    pkts: u32,
    last: bool,
    closes: bool,
    ack_every: u32,
) -> bool {
    qp.req.unasked_pkts = qp.req.unasked_pkts.saturating_add(pkts);
    if last {
        qp.req.unasked_wqes = qp.req.unasked_wqes.saturating_add(1);
    }
    let max_wr = qp.cap.max_send_wr as usize;
    let frees_slots = 2 * sq_len >= max_wr && 8 * qp.req.unasked_wqes as usize >= max_wr;
    let ask =
        closes || qp.req.unasked_pkts >= ack_every || (last && (signaled || frees_slots || qp.state() == QpState::Sqd));
    if ask {
        qp.req.unasked_pkts = 0;
        qp.req.unasked_wqes = 0;
    }
    ask
}

impl Core {
    pub(crate) fn run_requester(&mut self, now: Nanos, qpn: u32) {
        if let Some(mut qp) = self.take_qp(qpn) {
            self.requester(&mut qp, now);
            self.put_qp(qp);
        }
    }

    /// Transmits as much of the send queue as the window, fences and the
    /// read/atomic bound allow.
    pub(crate) fn requester(&mut self, qp: &mut Qp, now: Nanos) {
        // Whether this run finished sending a WQE (for the timer below).
        let mut sent_last = false;
        loop {
            let state = qp.state();
            let mid_message = qp.req.send_offset > 0;
            // In SQD a message already started is finished; nothing new starts.
            if !(state == QpState::Rts || (state == QpState::Sqd && mid_message)) {
                break;
            }
            if qp.req.rnr_wait.is_some() {
                break;
            }
            let idx = qp.req.send_next;
            let Some(w) = qp.sq.get(idx) else { break };
            if w.state != WqeState::Pending {
                // Already transmitted (e.g. after go-back-N finished it). New
                // WQEs take their PSNs after it, never its own again.
                if w.npkts > 0 {
                    qp.req.next_psn = qp.req.next_psn.later(w.first_psn.wrapping_add(w.npkts));
                }
                qp.req.send_next += 1;
                continue;
            }
            if w.op.is_local() {
                // Local operations run in order once everything before them
                // completed (LOCAL_INV is always fenced, docs/design.md §3.5; REG_MR
                // and BIND_MW take effect before anything after them).
                if idx != 0 {
                    break;
                }
                self.execute_local(qp);
                continue;
            }
            if w.fence && qp.sq.iter().take(idx).any(|p| p.op.is_read_or_atomic()) {
                break;
            }
            if w.op.is_read_or_atomic() && qp.req.send_offset == 0 {
                let max = u32::from(qp.attr.max_rd_atomic).max(1);
                if qp.req.rd_atomic_inflight >= max {
                    break;
                }
            }
            let room = if qp.qp_type == QpType::Rc {
                self.window_room(qp)
            } else {
                u32::MAX
            };
            if room == 0 {
                break;
            }
            if qp.sq[idx].npkts == 0 {
                // First transmission of the WQE: validate the local side and
                // assign its PSNs (a retransmission reuses them).
                if let Err(status) = self.check_local_sgl(qp, idx) {
                    self.fail_wqe(qp, idx, status, vendor::LOCAL_KEY);
                    break;
                }
                let mtu = qp.mtu();
                let next = qp.req.next_psn;
                let w = &mut qp.sq[idx];
                w.first_psn = next;
                w.npkts = match w.op {
                    WqeOp::CompSwap | WqeOp::FetchAdd => 1,
                    _ => packets_for(w.length, mtu),
                };
            }
            let psn = next_packet_psn(qp);
            let done = self.send_one_packet(qp, idx, room);
            self.rtt_on_send(qp, now, psn);
            if done {
                // (An RC WQE stays Sent until an ACK, which this loop
                // does not take in.)
                sent_last = true;
                let w = &mut qp.sq[idx];
                w.state = WqeState::Sent;
                if w.op.is_read_or_atomic() {
                    qp.req.rd_atomic_inflight += 1;
                }
                qp.req.next_psn = w.first_psn.wrapping_add(w.npkts);
                qp.req.send_next += 1;
                qp.req.send_offset = 0;
                if qp.qp_type != QpType::Rc {
                    // UC and UD have no acknowledgements: a WQE is done once
                    // its last packet left (IBTA 9.8.3).
                    qp.sq[idx].state = WqeState::Done;
                    self.complete_done_prefix(qp);
                }
            }
        }
        if qp.qp_type == QpType::Rc {
            self.arm_retransmit(qp, now, sent_last);
        }
    }

    /// How many more packets (PSNs) the window lets an RC requester send:
    /// `max_inflight_packets` less the packets in flight, counted by
    /// transmission: from the oldest unacknowledged PSN to the next
    /// packet's, and during a go-back-N ([`super::qp::GoBack`]) the copies
    /// sent before it too. The resend of the packet the requester went back
    /// to always goes: the responder waits for it, and its ACK proves the
    /// copies before it gone.
    pub(super) fn window_room(&self, qp: &Qp) -> u32 {
        let next = next_packet_psn(qp);
        let oldest = window_start(qp);
        let inflight = match qp.req.go_back {
            None => oldest.distance(next),
            Some(g) if g.from == next => {
                let copies = oldest.distance(g.end).max(0) as u32;
                return self.cfg.max_inflight_packets.saturating_sub(copies).max(1);
            }
            // The copies (oldest to end) and the resends (from to next).
            Some(g) => oldest.distance(g.end).max(0) + g.from.distance(next).max(0),
        };
        // (An ACK may pass the next packet after a rewind: the copies it
        // resends arrived after all; nothing is in flight then.)
        self.cfg.max_inflight_packets.saturating_sub(inflight.max(0) as u32)
    }

    /// Checks every local SGE of WQE `idx` (keys, PD, bounds, and local
    /// write access where the device writes: read and atomic results).
    fn check_local_sgl(&self, qp: &Qp, idx: usize) -> Result<(), WcStatus> {
        let w = &qp.sq[idx];
        if w.inline.is_some() {
            return Ok(());
        }
        let need = if w.op.is_read_or_atomic() {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        for s in &w.sgl {
            match self.mrs.check(s.lkey, qp.pd, s.addr, u64::from(s.len), need) {
                Ok(_) => {}
                Err(KeyError::Access) if need.contains(AccessFlags::LOCAL_WRITE) => return Err(WcStatus::LocProtErr),
                Err(_) => return Err(WcStatus::LocProtErr),
            }
        }
        Ok(())
    }

    /// Marks WQE `idx` failed; its error completion is reported once every
    /// WQE before it completed (completions stay in order).
    pub(crate) fn fail_wqe(&mut self, qp: &mut Qp, idx: usize, status: WcStatus, vendor_err: u32) {
        let w = &mut qp.sq[idx];
        if w.state == WqeState::Sent && w.op.is_read_or_atomic() {
            qp.req.rd_atomic_inflight = qp.req.rd_atomic_inflight.saturating_sub(1);
        }
        w.state = WqeState::Failed(status, vendor_err);
        self.complete_done_prefix(qp);
    }

    /// Builds and queues the next packet of WQE `idx`, with `room` packets
    /// left in the window; returns whether it was the WQE's last.
    fn send_one_packet(&mut self, qp: &mut Qp, idx: usize, room: u32) -> bool {
        if qp.req.send_offset == 0 {
            if let Some(train) = self.train_for(qp, idx) {
                self.send_train(qp, idx, train, room);
                return true;
            }
        }
        self.send_packet(qp, idx, room, false)
    }

    /// [`Core::send_one_packet`] without trains; `force_ack` sets AckReq
    /// (a selective resend or a probe wants the answer).
    pub(crate) fn send_packet(&mut self, qp: &mut Qp, idx: usize, room: u32, force_ack: bool) -> bool {
        let mtu = qp.mtu();
        let transport = transport_of(qp.qp_type);
        let ack_every = self.cfg.ack_every;
        let w = &qp.sq[idx];
        let offset = match w.op {
            // A read resumed after lost responses asks for the missing part.
            WqeOp::Read => w.resp_pkts.saturating_mul(mtu).min(w.length),
            _ => qp.req.send_offset,
        };
        let psn = w.first_psn.wrapping_add(offset / mtu);
        let dest_qpn = match w.ud {
            Some(u) => u.qpn,
            None => qp.attr.dest_qp_num,
        };
        let mut bth = BthRepr::new(Opcode::Unknown(0), Qpn::new(dest_qpn), psn);
        bth.pkey = Pkey::DEFAULT;
        let built = match w.op {
            WqeOp::Read => {
                let mut h = PacketRepr::new(bth);
                let remaining = w.length - offset;
                h.bth
                    .bth_opcode(transport, OpKind::ReadRequest, Position::Only, false, false);
                h.reth = Some(RethRepr {
                    va: w.remote.addr.wrapping_add(u64::from(offset)),
                    rkey: w.remote.rkey,
                    dma_len: remaining,
                });
                h.bth.ack_req = true;
                self.new_packet(&h, 0).map(|d| (d, 0, true))
            }
            WqeOp::CompSwap | WqeOp::FetchAdd => {
                let mut h = PacketRepr::new(bth);
                let kind = if w.op == WqeOp::CompSwap {
                    OpKind::CompareSwap
                } else {
                    OpKind::FetchAdd
                };
                h.bth.bth_opcode(transport, kind, Position::Only, false, false);
                h.atomic_eth = Some(AtomicEthRepr {
                    va: w.remote.addr,
                    rkey: w.remote.rkey,
                    swap_add: w.swap_add,
                    compare: w.compare,
                });
                h.bth.ack_req = true;
                self.new_packet(&h, 0).map(|d| (d, 0, true))
            }
            _ => {
                let remaining = w.length - offset;
                let n = remaining.min(mtu);
                let first = offset == 0;
                let last = remaining <= mtu;
                let position = match (first, last) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, true) => Position::Last,
                    (false, false) => Position::Middle,
                };
                let m = message_headers(&mut bth, w, transport, position);
                let deth = w.ud.map(|u| DethRepr {
                    qkey: u.qkey,
                    src_qpn: Qpn::new(qp.qpn),
                });
                bth.ack_req =
                    transport == Transport::Rc && (asks_ack(qp, idx, 1, last, room <= 1, ack_every) || force_ack);
                if matches!(bth.opcode, Opcode::Unknown(_)) {
                    // No opcode for the combination (a bug: posting checks
                    // the operation against the QP type).
                    self.counters.tx_emit_errors += 1;
                    None
                } else {
                    let headers =
                        MessageHeaders::new(&bth, n as usize, deth.as_ref(), m.reth.as_ref(), m.immdt, m.ieth);
                    Some((self.message_packet(&headers, n as usize), n, last))
                }
            }
        };
        // The payload is gathered straight from local memory (one copy)
        // after the headers; `queue_packet` adds pad and ICRC.
        let Some((mut data, payload_len, last)) = built else {
            self.fail_wqe(qp, idx, WcStatus::LocQpOpErr, vendor::LOCAL_KEY);
            return false;
        };
        if payload_len > 0 {
            let w = &qp.sq[idx];
            if let Some(inline) = &w.inline {
                data.extend_from_slice(&inline[offset as usize..(offset + payload_len) as usize]);
            } else if self.gather(qp, idx, offset, payload_len as usize, &mut data).is_err() {
                // The MR vanished between check and use (dereg from another
                // thread is serialized with us, so only a bug gets here).
                self.fail_wqe(qp, idx, WcStatus::LocProtErr, vendor::LOCAL_KEY);
                return false;
            }
        }
        if self.announces_sr(qp) {
            crate::soft::wire::set_soft_cap(&mut data);
        }
        let (dst, sgid_index) = match qp.sq[idx].ud {
            Some(u) => (u.dst, u.sgid_index),
            None => (qp.attr.ah_attr.grh.dgid.to_ip(), qp.attr.ah_attr.grh.sgid_index),
        };
        self.queue_packet(qp.qpn, dest_qpn, sgid_index, dst, payload_len as usize, data);
        if !last {
            qp.req.send_offset += payload_len;
        }
        last
    }

    /// The train WQE `idx` can go as ([`super::train`]): an RC SEND or
    /// WRITE of at least [`TRAIN_MIN_LEN`] bytes, not inline, whose every
    /// byte lies in memory the route to the destination carries trains of
    /// ([`super::train::TrainCaps`]; process memory only from
    /// [`TRAIN_PROCESS_MIN_LEN`] bytes on; one packet only where the
    /// receiver takes that).
    fn train_for(&self, qp: &Qp, idx: usize) -> Option<TrainOut> {
        let w = &qp.sq[idx];
        if qp.qp_type != QpType::Rc
            || w.inline.is_some()
            || w.length < TRAIN_MIN_LEN
            || !matches!(
                w.op,
                WqeOp::Send | WqeOp::SendImm | WqeOp::SendInv | WqeOp::Write | WqeOp::WriteImm
            )
        {
            return None;
        }
        let caps = self.train_caps_to(qp, w.length, w.npkts)?;
        let mut pieces: Vec<TrainPiece> = Vec::new();
        self.mrs
            .for_each_piece(&w.sgl, qp.pd, 0, w.length as usize, AccessFlags::empty(), |r, _, n| {
                r.train_pieces(n, caps, &mut pieces)?;
                if pieces.len() > TRAIN_MAX_PIECES {
                    return Err(());
                }
                Ok(())
            })
            .ok()?;
        Some(TrainOut { npkts: w.npkts, pieces })
    }

    /// What a train of `len` bytes in `npkts` packets to `qp`'s peer may
    /// carry now; `None` if no train may go there (one of one packet only
    /// where the peer takes those).
    pub(crate) fn train_caps_to(&self, qp: &Qp, len: u32, npkts: u32) -> Option<super::train::TrainCaps> {
        let route = self.train_route.as_ref()?;
        if len < TRAIN_MIN_LEN {
            return None;
        }
        let mut caps = route.0.train_caps(qp.attr.ah_attr.grh.dgid.to_ip());
        caps.process &= len >= TRAIN_PROCESS_MIN_LEN;
        (caps.any() && (npkts > 1 || caps.one_packet)).then_some(caps)
    }

    /// Queues WQE `idx` as one train: its ONLY packet, without payload.
    fn send_train(&mut self, qp: &mut Qp, idx: usize, train: TrainOut, room: u32) {
        let w = &qp.sq[idx];
        let dest_qpn = qp.attr.dest_qp_num;
        let mut bth = BthRepr::new(Opcode::Unknown(0), Qpn::new(dest_qpn), w.first_psn);
        bth.pkey = Pkey::DEFAULT;
        let m = message_headers(&mut bth, w, Transport::Rc, Position::Only);
        let npkts = w.npkts;
        bth.ack_req = asks_ack(qp, idx, npkts, true, room <= npkts, self.cfg.ack_every);
        if matches!(bth.opcode, Opcode::Unknown(_)) {
            self.counters.tx_emit_errors += 1;
            self.fail_wqe(qp, idx, WcStatus::LocQpOpErr, vendor::LOCAL_KEY);
            return;
        }
        let headers = MessageHeaders::new(&bth, 0, None, m.reth.as_ref(), m.immdt, m.ieth);
        let mut data = self.message_packet(&headers, 0);
        if self.announces_sr(qp) {
            crate::soft::wire::set_soft_cap(&mut data);
        }
        let dst = qp.attr.ah_attr.grh.dgid.to_ip();
        let sgid_index = qp.attr.ah_attr.grh.sgid_index;
        self.counters.tx_trains += 1;
        self.queue_packet_with(qp.qpn, dest_qpn, sgid_index, dst, 0, data, Some(Box::new(train)));
    }

    /// Appends `len` bytes of WQE `idx`'s message at `offset`, read from
    /// local memory, to `out`.
    fn gather(&self, qp: &Qp, idx: usize, offset: u32, len: usize, out: &mut Vec<u8>) -> Result<(), ()> {
        let sgl = &qp.sq[idx].sgl;
        self.mrs
            .for_each_piece(sgl, qp.pd, offset.into(), len, AccessFlags::empty(), |r, _, n| {
                r.append_to(n, out)
            })
    }

    /// A buffer holding `h`'s headers for a payload of `payload_len` bytes,
    /// with room for the rest of the packet; the caller appends the payload
    /// and passes it to [`Core::queue_packet`].
    pub(crate) fn new_packet(&mut self, h: &PacketRepr, payload_len: usize) -> Option<Vec<u8>> {
        let mut data = self.take_buffer(h.packet_len(payload_len));
        data.resize(h.header_len(), 0);
        if h.emit_headers(payload_len, &mut data).is_err() {
            self.counters.tx_emit_errors += 1;
            return None;
        }
        Some(data)
    }

    /// [`Core::new_packet`] for the headers of a SEND or WRITE packet.
    pub(crate) fn message_packet(&mut self, h: &MessageHeaders, payload_len: usize) -> Vec<u8> {
        let headers = h.as_bytes();
        let mut data = self.take_buffer(headers.len() + payload_len + pad_len(payload_len) + ICRC_LEN);
        data.extend_from_slice(headers);
        data
    }

    /// Pads a packet built by [`Core::new_packet`] plus its payload, adds
    /// the ICRC and queues it.
    pub(crate) fn queue_packet(
        &mut self,
        local_qpn: u32,
        remote_qpn: u32,
        sgid_index: u8,
        dst: IpAddr,
        payload_len: usize,
        data: Vec<u8>,
    ) {
        self.queue_packet_with(local_qpn, remote_qpn, sgid_index, dst, payload_len, data, None);
    }

    /// [`Core::queue_packet`], for a train too.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_packet_with(
        &mut self,
        local_qpn: u32,
        remote_qpn: u32,
        sgid_index: u8,
        dst: IpAddr,
        payload_len: usize,
        data: Vec<u8>,
        train: Option<Box<TrainOut>>,
    ) {
        if let Some(mut t) = self.finish_packet(local_qpn, remote_qpn, sgid_index, dst, payload_len, data) {
            t.train = train;
            self.tx.push_back(t);
        }
    }

    /// The source address and UDP ports of a packet between QPs
    /// `local_qpn` and `remote_qpn` from source GID `sgid_index`; `None`
    /// without such a GID.
    #[inline(always)]
    pub(super) fn packet_addr(&self, local_qpn: u32, remote_qpn: u32, sgid_index: u8) -> Option<(IpAddr, UdpPorts)> {
        let src = self.cfg.gids.get(sgid_index as usize)?.to_ip();
        let ports = UdpPorts {
            src: entropy_port(local_qpn, remote_qpn),
            dst: self.cfg.udp_port,
        };
        Some((src, ports))
    }

    /// The datagram [`Core::queue_packet`] queues: `data` padded, with its
    /// ICRC, addressed, and counted; `None` (nothing counted) without a
    /// source GID at `sgid_index`.
    #[inline(always)]
    pub(super) fn finish_packet(
        &mut self,
        local_qpn: u32,
        remote_qpn: u32,
        sgid_index: u8,
        dst: IpAddr,
        payload_len: usize,
        mut data: Vec<u8>,
    ) -> Option<Transmit> {
        let (src, ports) = self.packet_addr(local_qpn, remote_qpn, sgid_index)?;
        // Pad (0-3 bytes) and the ICRC's place, zeroed by fixed-size
        // copies (`resize` called `memset`, ~30 instructions a packet).
        let pad = crate::soft::wire::pad_len(payload_len);
        if pad > 0 {
            data.extend_from_slice(&[0; 3][..pad]);
        }
        data.extend_from_slice(&[0; crate::soft::wire::ICRC_LEN]);
        if self.cfg.emit_icrc {
            if let Some(ip) = IpPseudoHeader::between(src, dst) {
                let _ = crate::soft::wire::fill_icrc(&ip, ports, &mut data);
            }
        }
        self.counters.tx_packets += 1;
        Some(Transmit {
            src,
            dst,
            src_port: ports.src,
            dst_port: ports.dst,
            data,
            train: None,
        })
    }

    /// Emits one packet with a payload given as a slice.
    pub(crate) fn transmit(
        &mut self,
        local_qpn: u32,
        remote_qpn: u32,
        sgid_index: u8,
        dst: IpAddr,
        h: &PacketRepr,
        payload: &[u8],
    ) {
        if let Some(mut data) = self.new_packet(h, payload.len()) {
            data.extend_from_slice(payload);
            self.queue_packet(local_qpn, remote_qpn, sgid_index, dst, payload.len(), data);
        }
    }

    /// Runs the local operation (LOCAL_INV, REG_MR, BIND_MW) at the head
    /// of the send queue.
    fn execute_local(&mut self, qp: &mut Qp) {
        let Some(op) = qp.sq[0].local else {
            self.fail_wqe(qp, 0, WcStatus::LocQpOpErr, vendor::MEM_OP);
            return;
        };
        match self.execute_local_op(qp, &op) {
            (WcStatus::Success, _) => {
                qp.sq[0].state = WqeState::Done;
                self.complete_done_prefix(qp);
            }
            (status, vendor_err) => self.fail_wqe(qp, 0, status, vendor_err),
        }
    }
}

/// The PSN of the next packet the requester sends: `next_psn` moves a
/// whole WQE at a time, this a packet at a time (a read or atomic request
/// stands for all its PSNs).
pub(crate) fn next_packet_psn(qp: &Qp) -> Psn {
    let next = qp.req.next_psn;
    let at = match qp.sq.get(qp.req.send_next) {
        Some(w) if w.npkts > 0 && w.state == WqeState::Pending => match w.op {
            WqeOp::Read => w.first_psn.wrapping_add(w.resp_pkts),
            WqeOp::CompSwap | WqeOp::FetchAdd => w.first_psn,
            _ => w.first_psn.wrapping_add(qp.req.send_offset / qp.mtu()),
        },
        _ => return next,
    };
    at.later(next)
}

/// The oldest PSN not yet acknowledged (or answered): after `acked_psn`,
/// which stops before a read or atomic whose response is missing, and at
/// or after the first WQE not yet retired (an ACK may have finished the
/// WQEs after such a read or atomic, and they retire with it).
pub(crate) fn window_start(qp: &Qp) -> Psn {
    let acked = qp.req.acked_psn.next();
    let front = match qp.sq.front() {
        Some(w) if w.npkts > 0 => match w.op {
            WqeOp::Read => w.first_psn.wrapping_add(w.resp_pkts),
            _ => w.first_psn,
        },
        // Nothing started: nothing in flight.
        _ => qp.req.next_psn,
    };
    front.later(acked)
}

/// Sets the opcode of a SEND or WRITE packet of `w` at `position` and the
/// headers the position carries: the RETH on a write's first packet, the
/// immediate data or the invalidated rkey and the solicited bit on the
/// last.
fn message_headers(bth: &mut BthRepr, w: &SendWqe, transport: Transport, position: Position) -> MessageExt {
    let first = matches!(position, Position::First | Position::Only);
    let last = matches!(position, Position::Last | Position::Only);
    let is_write = matches!(w.op, WqeOp::Write | WqeOp::WriteImm);
    let kind = if is_write { OpKind::Write } else { OpKind::Send };
    let imm = last && matches!(w.op, WqeOp::SendImm | WqeOp::WriteImm);
    let inv = last && w.op == WqeOp::SendInv;
    bth.bth_opcode(transport, kind, position, imm, inv);
    if last {
        bth.solicited = w.solicited && (!is_write || imm);
    }
    MessageExt {
        reth: (is_write && first).then_some(RethRepr {
            va: w.remote.addr,
            rkey: w.remote.rkey,
            dma_len: w.length,
        }),
        immdt: imm.then_some(ImmDtRepr::from_be_value(w.imm)),
        ieth: inv.then_some(IethRepr { rkey: w.imm }),
    }
}

/// The extension headers of a SEND or WRITE packet, besides a UD DETH.
struct MessageExt {
    reth: Option<RethRepr>,
    immdt: Option<ImmDtRepr>,
    ieth: Option<IethRepr>,
}

/// Sets a BTH's opcode from the table.
trait SetOpcode {
    fn bth_opcode(&mut self, t: Transport, k: OpKind, p: Position, imm: bool, inv: bool);
}

impl SetOpcode for BthRepr {
    fn bth_opcode(&mut self, t: Transport, k: OpKind, p: Position, imm: bool, inv: bool) {
        self.opcode = Opcode::find(t, k, p, imm, inv).unwrap_or(Opcode::Unknown(0xff));
    }
}
