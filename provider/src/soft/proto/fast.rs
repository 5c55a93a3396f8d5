//! Fast paths for the packets of a ping-pong: one-packet RC SENDs and
//! RDMA WRITEs, sent and received.
//!
//! **Receiving.** An RC SEND ONLY (with or without immediate data) or
//! RDMA WRITE ONLY that arrives in order, from the QP's peer, on a QP in
//! RTS (or an established RTR/SQD/SQE) with no message in progress, whose
//! receive WQE (SEND, no SRQ) or remote range (WRITE) takes it as it is.
//! The same holds for a WRITE ONLY train (a message of any length, copied
//! once from the sender's memory: `super::train`), which `perf write_bw`
//! over the shared-memory link receives once per message. For those,
//! [`Core::handle_datagram`] built a [`ParsedPacket`] of every optional
//! header, dispatched on the opcode table, and carried the
//! message through the responder's multi-packet state: about 230
//! instructions of a round trip's 4,600 on the client of `perf send_lat
//! --link shm -s 8` (callgrind). Here the fixed header layout of these
//! opcodes is read in place and the message is placed, completed and
//! acknowledged with the responder's own helpers, in the order the
//! general path does it.
//!
//! **Sending.** A lone inline SEND or WRITE (with or without immediate)
//! of at most one MTU with no fence, posted on an RC QP in RTS whose send
//! queue has nothing else waiting: the requester's loop (state, fence,
//! read/atomic and window checks for each WQE, the segmentation and
//! opcode-table lookups, a second turn to find nothing more) becomes one
//! straight pass that builds the ONLY packet with the requester's own
//! helpers. With an [`Egress`] (the engine's link, in inline mode, when
//! the link computes the ICRC or needs none) the packet leaves as soon as
//! its headers are built, in pieces (headers, the inline bytes, pad): no
//! buffer, no datagram, no transmit queue, no general send path between
//! (`tx_eager`). It leaves before the WQE exists, straight from the WR's
//! checks ([`Core::fast_post_direct`]): the WQE (queued already sent),
//! the retransmission timer and the verb's unwinding come after, while the
//! peer may be reading it. Posted without an egress, or refused by it, the
//! WQE is queued first and [`Core::fast_send_wqe`] sends it.
//!
//! Every check the general path makes is made here (a send WR passes the
//! same [`Core::check_send_wr`]), and any that fails
//! (or any packet or WQE of another kind) leaves the engine untouched and
//! returns `false`: the caller then runs the general path, which counts,
//! answers and reports as before (a receive buffer that fails its key
//! check may have been written in part by both, with the same bytes).
//! [`CoreConfig::fast_paths`] turns both off; the tests run the same
//! packets and work requests through an engine with and without them and
//! compare everything they produce.
//!
//! [`ParsedPacket`]: crate::soft::wire::ParsedPacket
//! [`CoreConfig::fast_paths`]: super::CoreConfig::fast_paths

use crate::soft::wire::Psn;
use crate::soft::wire::{
    check_icrc, pad_len, BthRepr, ImmDtRepr, IpPseudoHeader, MessageHeaders, Opcode, Pkey, Qpn, RethRepr, Syndrome,
    UdpPorts, ICRC_LEN,
};
use crate::verbs::{AccessFlags, QpAttr, QpState, QpType, RemoteAddr, SendFlags, SendWr, WcFlags, WcOpcode, WcStatus};

use super::by_reference::TrainIn;
use super::qp::{Qp, WqeOp, WqeState};
use super::requester::{asks_ack, asks_ack_queued};
use super::{Core, Datagram, Egress, LinkHint, Nanos, Outgoing};

/// The request kinds the fast path takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send { imm: Option<u32> },
    Write { reth: RethRepr },
}

impl Core {
    /// Handles `d` if it is a request the fast path takes (see the module
    /// docs); `false`: the engine is as it was, run the general path.
    pub(super) fn fast_request(&mut self, d: &Datagram<'_>) -> bool {
        let b = d.data;
        // What `Packet::parse` checks: room for BTH and ICRC, TVer 0, a
        // length in whole words, the extension headers and the pad.
        if b.len() < BthRepr::LEN + ICRC_LEN || !b.len().is_multiple_of(4) {
            return false;
        }
        let Ok(bth) = BthRepr::parse(b) else { return false };
        let body = &b[BthRepr::LEN..b.len() - ICRC_LEN];
        let (kind, rest) = match bth.opcode {
            Opcode::RcSendOnly => (Kind::Send { imm: None }, body),
            Opcode::RcSendOnlyWithImmediate => {
                let Ok(i) = ImmDtRepr::parse(body) else { return false };
                (
                    Kind::Send {
                        imm: Some(i.be_value()),
                    },
                    &body[ImmDtRepr::LEN..],
                )
            }
            Opcode::RcRdmaWriteOnly => {
                let Ok(reth) = RethRepr::parse(body) else { return false };
                (Kind::Write { reth }, &body[RethRepr::LEN..])
            }
            _ => return false,
        };
        let Some(payload) = rest.get(..rest.len().wrapping_sub(usize::from(bth.pad_count))) else {
            return false;
        };
        // Of trains, WRITE ONLY packets only: SEND trains go the general
        // way.
        let train = d.train.as_ref();
        if train.is_some() && !matches!(kind, Kind::Write { .. }) {
            return false;
        }
        if !bth.pkey.matches(Pkey::DEFAULT) {
            return false;
        }
        if self.cfg.check_icrc {
            let ports = UdpPorts {
                src: d.src_port,
                dst: d.dst_port,
            };
            if !IpPseudoHeader::between(d.src, d.dst).is_some_and(|ip| check_icrc(&ip, ports, b)) {
                return false;
            }
        }
        let Some(mut qp) = self.take_qp(bth.dest_qpn.value()) else {
            return false;
        };
        let state = qp.state();
        let ok = qp.qp_type == QpType::Rc
            && (matches!(state, QpState::Rts | QpState::Sqd | QpState::Sqe)
                || (state == QpState::Rtr && qp.resp.established))
            && d.src == qp.attr.ah_attr.grh.dgid.to_ip()
            && qp.resp.epsn == bth.psn
            && qp.resp.recv.is_none()
            && qp.resp.write.is_none()
            // Held packets wait behind this one (`recovery`).
            && qp.resp.ooo.as_ref().is_none_or(|o| o.is_empty())
            // What `dispatch` checks of a train.
            && train.is_none_or(|t| t.fits(payload.len(), qp.mtu()));
        let done = ok
            && match kind {
                Kind::Send { imm } => self.fast_send(&mut qp, payload, imm, bth.solicited),
                Kind::Write { reth } => self.fast_write(&qp, payload, train, reth),
            };
        if done {
            self.counters.rx_packets += 1;
            self.counters.rx_fast += 1;
            if train.is_some() {
                self.counters.rx_trains += 1;
            }
            // As `handle_request` after an in-order request that went
            // through (a train takes its packets' PSNs and is
            // acknowledged at its last).
            let last = bth.psn.wrapping_add(train.map_or(1, |t| t.npkts()) - 1);
            qp.resp.nak_sent = false;
            qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
            qp.resp.epsn = last.next();
            if bth.ack_req {
                self.send_ack(&mut qp, last, Syndrome::ACK);
            }
        }
        self.put_qp(qp);
        done
    }

    /// Places a SEND ONLY in the next receive WQE and completes it; `false`
    /// (the WQE back at the head of the queue) if the general path must.
    fn fast_send(&mut self, qp: &mut Qp, payload: &[u8], imm: Option<u32>, solicited: bool) -> bool {
        if qp.srq.is_some() {
            return false;
        }
        let Some(wqe) = qp.rq.pop_front() else { return false };
        if payload.len() as u64 > wqe.length || self.check_and_place(qp, &wqe, payload).is_err() {
            qp.rq.push_front(wqe);
            return false;
        }
        let (flags, imm) = match imm {
            Some(i) => (WcFlags::WITH_IMM, i),
            None => (WcFlags::empty(), 0),
        };
        self.complete_recv(
            qp,
            &wqe,
            WcStatus::Success,
            payload.len() as u32,
            Some(WcOpcode::Recv),
            flags,
            imm,
            solicited,
        );
        qp.recycle(wqe.sgl);
        true
    }

    /// Writes a WRITE ONLY whose payload (or `train`, for a train) is its
    /// whole DMA length into memory the QP may write; `false` if the
    /// general path must.
    fn fast_write(&self, qp: &Qp, payload: &[u8], train: Option<&TrainIn<'_>>, reth: RethRepr) -> bool {
        let len = train.map_or(payload.len() as u64, |t| u64::from(t.len()));
        if !qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_WRITE) || len != u64::from(reth.dma_len) {
            return false;
        }
        match self
            .mrs
            .check_remote(reth.rkey, qp.pd, qp.qpn, reth.va, len, AccessFlags::REMOTE_WRITE)
        {
            Ok(Some(r)) => match train {
                Some(t) => r.write_train(t, 0, len as usize).is_ok(),
                None => r.write(payload).is_ok(),
            },
            Ok(None) => true,
            Err(_) => false,
        }
    }
}

/// The ONLY packet of a one-packet SEND or WRITE, by the rules of the
/// requester's `message_headers` (written out: going through it and the
/// opcode table cost this path ~80 instructions; the tests compare the
/// bytes for every opcode and flag).
struct Only {
    opcode: Opcode,
    write: bool,
    imm: Option<u32>,
    solicited: bool,
    remote: RemoteAddr,
    len: u32,
}

impl Only {
    /// The packet of a WQE of `op`, or `None` for an operation the fast
    /// path leaves to the requester.
    fn of(op: WqeOp, imm: u32, solicited: bool, remote: RemoteAddr, len: u32) -> Option<Only> {
        let (opcode, write, with_imm) = match op {
            WqeOp::Send => (Opcode::RcSendOnly, false, false),
            WqeOp::SendImm => (Opcode::RcSendOnlyWithImmediate, false, true),
            WqeOp::Write => (Opcode::RcRdmaWriteOnly, true, false),
            WqeOp::WriteImm => (Opcode::RcRdmaWriteOnlyWithImmediate, true, true),
            _ => return None,
        };
        Some(Only {
            opcode,
            write,
            imm: with_imm.then_some(imm),
            solicited,
            remote,
            len,
        })
    }

    /// Its headers, as `send_one_packet` builds them.
    fn headers(&self, dest_qpn: u32, psn: Psn, ack_req: bool) -> MessageHeaders {
        let mut bth = BthRepr::new(self.opcode, Qpn::new(dest_qpn), psn);
        bth.solicited = self.solicited && (!self.write || self.imm.is_some());
        bth.ack_req = ack_req;
        let reth = self.write.then_some(RethRepr {
            va: self.remote.addr,
            rkey: self.remote.rkey,
            dma_len: self.len,
        });
        let immdt = self.imm.map(ImmDtRepr::from_be_value);
        MessageHeaders::new(&bth, self.len as usize, None, reth.as_ref(), immdt, None)
    }
}

impl Core {
    /// Posts `wr` by the send fast path before any WQE is built, when the
    /// send fast path would take it and `send` takes its packet: the
    /// packet leaves, in pieces, straight from the checks, and the WQE is
    /// queued after, already sent. `false`: nothing was changed (the
    /// inline buffer taken is given back), post it the usual way.
    ///
    /// The WR passes [`Core::check_send_wr`], the checks of the general
    /// path, so that the WR it leaves would have been posted; the WQE is
    /// the one those checks' fields make, with the state
    /// [`Core::fast_send_wqe`] gives it. The ACK-request policy and the
    /// window see the queue as they would with the WQE in it (the window
    /// does not count a WQE not yet started; the policy is told the
    /// queue's length).
    pub(super) fn fast_post_direct(&mut self, qp: &mut Qp, now: Nanos, wr: &SendWr<'_>, send: Egress<'_>) -> bool {
        let idx = qp.sq.len();
        let flags = wr.send_flags;
        // What the fast path takes beyond a WR that may be posted: an
        // inline, unfenced WR on an RC QP in RTS whose requester waits
        // for nothing, with nothing queued for the link before it.
        if qp.qp_type != QpType::Rc
            || qp.state() != QpState::Rts
            || !flags.contains(SendFlags::INLINE)
            || flags.contains(SendFlags::FENCE)
            || qp.req.rnr_wait.is_some()
            || qp.req.send_offset != 0
            || qp.req.send_next != idx
            || !self.tx.is_empty()
            || self.cfg.emit_icrc
        {
            return false;
        }
        let [sge] = wr.sg_list else { return false };
        // The WR's checks are those of the general path; a refused WR goes
        // that way, which reports it.
        let Ok(f) = self.check_send_wr(qp, wr) else {
            return false;
        };
        let len = f.length;
        if len > qp.mtu() {
            return false;
        }
        // (`Only::of` takes SENDs and WRITEs, with or without immediate
        // data, and nothing else.)
        let Some(only) = Only::of(f.op, f.imm, f.solicited, f.remote, len) else {
            return false;
        };
        let room = self.window_room(qp);
        if room == 0 {
            return false;
        }
        let mut data = qp.take_inline(len as usize);
        if !sge.append_direct(&mut data) && !self.append_from_mr(sge, &mut data) {
            qp.recycle_inline(Some(data));
            return false;
        }
        let unasked = (qp.req.unasked_pkts, qp.req.unasked_wqes);
        let ack_req = asks_ack_queued(qp, idx + 1, f.signaled, 1, true, room <= 1, self.cfg.ack_every);
        let psn = qp.req.next_psn;
        let mut headers = only.headers(qp.attr.dest_qp_num, psn, ack_req);
        if self.announces_sr(qp) {
            // As `send_packet` does (`recovery`).
            headers.set_soft_cap();
        }
        if !self.egress_only(qp.qpn, &qp.attr, &mut qp.link_hint, [headers.as_bytes(), &data], send) {
            (qp.req.unasked_pkts, qp.req.unasked_wqes) = unasked;
            qp.recycle_inline(Some(data));
            return false;
        }
        let sgl = qp.take_vec();
        let mut wqe = f.into_wqe(sgl, Some(data));
        wqe.state = WqeState::Sent;
        wqe.first_psn = psn;
        wqe.npkts = 1;
        qp.sq.push_back(wqe);
        self.counters.tx_packets += 1;
        self.counters.tx_eager += 1;
        self.fast_sent(qp, now, psn);
        true
    }

    /// Hands the ONLY packet (`pieces`: its headers and payload) to `send`,
    /// with the pad and the ICRC's place, addressed as `finish_packet`
    /// addresses it; `false`: not sent.
    fn egress_only(&self, qpn: u32, attr: &QpAttr, hint: &mut LinkHint, pieces: [&[u8]; 2], send: Egress<'_>) -> bool {
        let dest_qpn = attr.dest_qp_num;
        let Some((src, ports)) = self.packet_addr(qpn, dest_qpn, attr.ah_attr.grh.sgid_index) else {
            return false;
        };
        let tail = [0; 3 + ICRC_LEN];
        let out = Outgoing {
            src,
            dst: attr.ah_attr.grh.dgid.to_ip(),
            src_port: ports.src,
            dst_port: ports.dst,
            parts: [pieces[0], pieces[1], &tail[..pad_len(pieces[1].len()) + ICRC_LEN]],
        };
        send(&out, hint)
    }

    /// The requester's state after the fast path sent the ONLY packet of
    /// the WQE at `send_next`, with PSN `psn`.
    fn fast_sent(&mut self, qp: &mut Qp, now: Nanos, psn: Psn) {
        qp.req.next_psn = psn.next();
        qp.req.send_next += 1;
        self.counters.tx_fast += 1;
        self.arm_retransmit(qp, now, true);
    }

    /// Sends the WQE `post_send` just queued if it is the only one waiting
    /// on `qp` (in RTS) and the send fast path takes it (see the module
    /// docs), as one turn of the requester would; `false`: nothing was
    /// changed, run the requester.
    pub(super) fn fast_send_wqe(&mut self, qp: &mut Qp, now: Nanos, egress: Option<Egress<'_>>) -> bool {
        let idx = qp.req.send_next;
        // (An RNR wait rewinds `send_next` to the WQE it stopped, so a new
        // WQE is never alone then; checked first anyway, as the requester
        // does.)
        if qp.qp_type != QpType::Rc || qp.req.rnr_wait.is_some() || qp.req.send_offset != 0 || qp.sq.len() != idx + 1 {
            return false;
        }
        let w = &qp.sq[idx];
        let len = w.length as usize;
        if w.inline.as_deref().is_none_or(|b| b.len() < len)
            || w.state != WqeState::Pending
            || w.npkts != 0
            || w.fence
            || w.ud.is_some()
            || w.length > qp.mtu()
        {
            return false;
        }
        let Some(only) = Only::of(w.op, w.imm, w.solicited, w.remote, w.length) else {
            return false;
        };
        let room = self.window_room(qp);
        if room == 0 {
            return false;
        }
        // The packet, as `send_one_packet` builds an ONLY packet (its AckReq
        // bit once the policy has counted it).
        let psn = qp.req.next_psn;
        let ack_req = asks_ack(qp, idx, 1, true, room <= 1, self.cfg.ack_every);
        let mut headers = only.headers(qp.attr.dest_qp_num, psn, ack_req);
        if self.announces_sr(qp) {
            // As `send_packet` does (`recovery`).
            headers.set_soft_cap();
        }
        // Nothing queued before it: out now, in pieces, as `finish_packet`
        // would have built it (see `post_send_eager`). With an ICRC to
        // compute, or refused, it is built and queued.
        let inline = qp.sq[idx].inline.as_deref().map_or(&[][..], |b| &b[..len]);
        let sent = match egress.filter(|_| self.tx.is_empty() && !self.cfg.emit_icrc) {
            Some(send) => self.egress_only(qp.qpn, &qp.attr, &mut qp.link_hint, [headers.as_bytes(), inline], send),
            None => false,
        };
        if sent {
            self.counters.tx_packets += 1;
            self.counters.tx_eager += 1;
        } else {
            let mut data = self.message_packet(&headers, len);
            if let Some(b) = qp.sq[idx].inline.as_deref() {
                data.extend_from_slice(&b[..len]);
            }
            let grh = &qp.attr.ah_attr.grh;
            let (dest_qpn, dst, sgid_index) = (qp.attr.dest_qp_num, grh.dgid.to_ip(), grh.sgid_index);
            if let Some(t) = self.finish_packet(qp.qpn, dest_qpn, sgid_index, dst, len, data) {
                self.tx.push_back(t);
            }
        }
        let w = &mut qp.sq[idx];
        w.first_psn = psn;
        w.npkts = 1;
        w.state = WqeState::Sent;
        self.fast_sent(qp, now, psn);
        true
    }
}
