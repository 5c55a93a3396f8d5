//! The receive fast path: the request packets of a ping-pong, decoded
//! straight from their bytes.
//!
//! An RC SEND ONLY (with or without immediate data) or RDMA WRITE ONLY
//! that arrives in order, from the QP's peer, on a QP in RTS (or an
//! established RTR/SQD/SQE) with no message in progress, whose receive
//! WQE (SEND, no SRQ) or remote range (WRITE) takes it as it is. For
//! those, [`Core::handle_datagram`] built a [`ParsedPacket`] of every
//! optional header, dispatched on the opcode table, and carried the
//! message through the responder's multi-packet state: about 220
//! instructions of a round trip's 4,600 on the client of `perf send_lat
//! --link shm -s 8` (callgrind). Here the fixed header layout of these
//! four opcodes is read in place and the message is placed, completed
//! and acknowledged with the responder's own helpers, in the order the
//! general path does it.
//!
//! Every check the general path makes on such a packet is made here, and
//! any that fails (or any packet of another kind) leaves the engine
//! untouched and returns `false`: the caller then runs the general path,
//! which counts, answers and reports the packet exactly as before (a
//! receive buffer that fails its key check may have been written in part
//! by both, with the same bytes). [`CoreConfig::fast_paths`] turns the
//! fast path off; the tests feed the same packets to an engine with and
//! without it and compare everything they produce.
//!
//! [`ParsedPacket`]: crate::soft::wire::ParsedPacket
//! [`CoreConfig::fast_paths`]: super::CoreConfig::fast_paths

use crate::soft::wire::{
    check_icrc, BthRepr, ImmDtRepr, IpPseudoHeader, Opcode, Pkey, RethRepr, Syndrome, UdpPorts, ICRC_LEN,
};
use crate::verbs::{AccessFlags, QpState, QpType, WcFlags, WcOpcode, WcStatus};

use super::qp::Qp;
use super::{Core, Datagram};

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
        if qp.srq.is_some() || qp.rq.front().is_none_or(|w| payload.len() as u64 > w.length) {
            return false;
        }
        let Some(wqe) = qp.rq.pop_front() else { return false };
        if self.check_and_place(qp, &wqe, payload).is_err() {
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
    fn fast_write(&mut self, qp: &Qp, payload: &[u8], reth: RethRepr) -> bool {
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
