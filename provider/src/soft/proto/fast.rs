//! Fast paths for the packets of a ping-pong: one-packet RC SENDs and
//! RDMA WRITEs, sent and received.
//!
//! **Receiving.** An RC SEND ONLY (with or without immediate data) or
//! RDMA WRITE ONLY that arrives in order, from the QP's peer, on a QP in
//! RTS (or an established RTR/SQD/SQE) with no message in progress, whose
//! receive WQE (SEND, no SRQ) or remote range (WRITE) takes it as it is.
//! For those, [`Core::handle_datagram`] built a [`ParsedPacket`] of every
//! optional header, dispatched on the opcode table, and carried the
//! message through the responder's multi-packet state: about 230
//! instructions of a round trip's 4,600 on the client of `perf send_lat
//! --link shm -s 8` (callgrind). Here the fixed header layout of these
//! opcodes is read in place and the message is placed, completed and
//! acknowledged with the responder's own helpers, in the order the
//! general path does it.
//!
//! **Sending.** The WQE `post_send` just queued on an RC QP in RTS, when
//! it is the only one waiting and an inline SEND or WRITE (with or
//! without immediate) of at most one MTU with no fence: the requester's
//! loop (state, fence, read/atomic and window checks for each WQE, the
//! segmentation and opcode-table lookups, a second turn to find nothing
//! more) becomes one straight pass that builds the ONLY packet with the
//! requester's own helpers. With an [`Egress`] (the engine's link, in
//! inline mode, when the link computes the ICRC or needs none) the packet
//! leaves as soon as its headers are built, in pieces (headers, the WQE's
//! inline bytes, pad): no buffer, no datagram, no transmit queue, no
//! general send path between (`tx_eager`), and the WQE's bookkeeping, the
//! retransmission timer and the verb's unwinding come after: the peer may
//! be reading it while this side finishes.
//!
//! Every check the general path makes is made here, and any that fails
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

use crate::soft::wire::{
    check_icrc, pad_len, BthRepr, ImmDtRepr, IpPseudoHeader, MessageHeaders, Opcode, Pkey, Qpn, RethRepr, Syndrome,
    UdpPorts, ICRC_LEN,
};
use crate::verbs::{AccessFlags, QpState, QpType, WcFlags, WcOpcode, WcStatus};

use super::qp::{Qp, WqeOp, WqeState};
use super::requester::asks_ack;
use super::{Core, Datagram, Egress, Nanos, Outgoing};

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
            && qp.resp.write.is_none();
        let done = ok
            && match kind {
                Kind::Send { imm } => self.fast_send(&mut qp, payload, imm, bth.solicited),
                Kind::Write { reth } => self.fast_write(&qp, payload, reth),
            };
        if done {
            self.counters.rx_packets += 1;
            self.counters.rx_fast += 1;
            // As `handle_request` after an in-order request that went
            // through.
            qp.resp.nak_sent = false;
            qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
            qp.resp.epsn = bth.psn.next();
            if bth.ack_req {
                self.send_ack(&mut qp, bth.psn, Syndrome::ACK);
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

    /// Writes a WRITE ONLY whose payload is its whole DMA length into
    /// memory the QP may write; `false` if the general path must.
    fn fast_write(&self, qp: &Qp, payload: &[u8], reth: RethRepr) -> bool {
        if !qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_WRITE)
            || payload.len() as u64 != u64::from(reth.dma_len)
        {
            return false;
        }
        match self.mrs.check_remote(
            reth.rkey,
            qp.pd,
            qp.qpn,
            reth.va,
            payload.len() as u64,
            AccessFlags::REMOTE_WRITE,
        ) {
            Ok(Some(r)) => r.write(payload).is_ok(),
            Ok(None) => true,
            Err(_) => false,
        }
    }
}

impl Core {
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
        // The opcode and extension headers of its ONLY packet, by the rules
        // of the requester's `message_headers` (written out: going through
        // it and the opcode table cost this path ~80 instructions; the tests
        // compare the bytes for every opcode and flag).
        let (opcode, write, imm) = match w.op {
            WqeOp::Send => (Opcode::RcSendOnly, false, false),
            WqeOp::SendImm => (Opcode::RcSendOnlyWithImmediate, false, true),
            WqeOp::Write => (Opcode::RcRdmaWriteOnly, true, false),
            WqeOp::WriteImm => (Opcode::RcRdmaWriteOnlyWithImmediate, true, true),
            _ => return false,
        };
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
        let room = self.window_room(qp);
        if room == 0 {
            return false;
        }
        // The packet, as `send_one_packet` builds an ONLY packet (its AckReq
        // bit below, once the policy has counted it).
        let psn = qp.req.next_psn;
        let dest_qpn = qp.attr.dest_qp_num;
        let mut bth = BthRepr::new(opcode, Qpn::new(dest_qpn), psn);
        bth.solicited = w.solicited && (!write || imm);
        let reth = write.then_some(RethRepr {
            va: w.remote.addr,
            rkey: w.remote.rkey,
            dma_len: w.length,
        });
        let immdt = imm.then_some(ImmDtRepr::from_be_value(w.imm));
        bth.ack_req = asks_ack(qp, idx, 1, true, room <= 1, self.cfg.ack_every);
        let headers = MessageHeaders::new(&bth, len, None, reth.as_ref(), immdt, None);
        let (dst, sgid_index) = (qp.attr.ah_attr.grh.dgid.to_ip(), qp.attr.ah_attr.grh.sgid_index);
        // Nothing queued before it: out now, in pieces, as `finish_packet`
        // would have built it (see `post_send_eager`). With an ICRC to
        // compute, or refused, it is built and queued.
        let mut sent = false;
        if let Some(send) = egress.filter(|_| self.tx.is_empty() && !self.cfg.emit_icrc) {
            if let Some((src, ports)) = self.packet_addr(qp.qpn, dest_qpn, sgid_index) {
                let tail = [0; 3 + ICRC_LEN];
                let out = Outgoing {
                    src,
                    dst,
                    src_port: ports.src,
                    dst_port: ports.dst,
                    parts: [
                        headers.as_bytes(),
                        qp.sq[idx].inline.as_deref().map_or(&[][..], |b| &b[..len]),
                        &tail[..pad_len(len) + ICRC_LEN],
                    ],
                };
                sent = send(&out, &mut qp.link_hint);
            }
        }
        if sent {
            self.counters.tx_packets += 1;
            self.counters.tx_eager += 1;
        } else {
            let mut data = self.message_packet(&headers, len);
            if let Some(b) = qp.sq[idx].inline.as_deref() {
                data.extend_from_slice(&b[..len]);
            }
            if let Some(t) = self.finish_packet(qp.qpn, dest_qpn, sgid_index, dst, len, data) {
                self.tx.push_back(t);
            }
        }
        let w = &mut qp.sq[idx];
        w.first_psn = psn;
        w.npkts = 1;
        w.state = WqeState::Sent;
        qp.req.next_psn = psn.next();
        qp.req.send_next = idx + 1;
        self.counters.tx_fast += 1;
        self.arm_retransmit(qp, now, true);
        true
    }
}
