//! Responder: request packets → memory, receive completions, ACKs, NAKs,
//! read responses and atomic acknowledgements (IBTA 9.7, rxe's
//! rxe_resp.c). Duplicates are re-acknowledged; duplicate reads and atomics
//! are answered from saved state, never executed twice.

use std::net::IpAddr;

use crate::soft::wire::{
    grh_bytes, AethRepr, AtomicAckEthRepr, BthRepr, IpPseudoHeader, IpVariantFields, NakCode, OpKind, Opcode,
    PacketRepr, ParsedPacket, Position, Psn, Qpn, Syndrome, Transport, GRH_LEN,
};
use crate::verbs::{AccessFlags, EventType, QpState, QpType, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::mr::KeyError;
use super::qp::{Qp, RdAtomicRes, RecvProgress, RecvWqe, WriteProgress};
use super::requester::transport_of;
use super::train::{TrainIn, TrainOut, TRAIN_MAX_PIECES};
use super::{Core, Transmit};

/// The length of an ACK/NAK's headers (BTH and AETH).
const ACK_LEN: usize = BthRepr::LEN + AethRepr::LEN;

/// How the responder answers a request.
enum Outcome {
    /// Processed; ACK if the requester asked.
    Ok,
    /// Processed and answered already (read/atomic responses).
    Answered,
    /// Dropped silently.
    Drop,
    /// No receive WQE: RNR NAK (RC) or drop (UC/UD).
    Rnr,
    /// A fatal error: NAK with this code, the responder QP goes to ERR.
    Fatal(NakCode, EventType),
}

impl Core {
    /// Handles a request packet (responder side). `src` is the sender's
    /// address (for UD GRHs and responses).
    /// `train`: the payload of a train (the packet is then its ONLY
    /// packet standing for `train.npkts()` PSNs; checked by the caller).
    /// `raw` is the datagram (kept when the packet arrives out of order,
    /// [`super::recovery`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn handle_request(
        &mut self,
        qp: &mut Qp,
        now: super::Nanos,
        pkt: &ParsedPacket<'_>,
        src: IpAddr,
        dst: IpAddr,
        train: Option<&TrainIn<'_>>,
        raw: &[u8],
    ) {
        if qp.state() == QpState::Rtr && !qp.resp.established {
            qp.resp.established = true;
            self.qp_event(qp, EventType::CommEst);
        }
        if qp.qp_type == QpType::Ud {
            self.handle_ud(qp, pkt, src, dst);
            return;
        }
        let psn = pkt.headers.bth.psn;
        let d = qp.resp.epsn.distance(psn);
        if qp.qp_type == QpType::Uc {
            if d != 0 {
                // UC: a gap loses the message in progress; resynchronise at
                // the next first/only packet (IBTA 9.8.3).
                self.counters.uc_dropped_messages += u64::from(qp.resp.recv.is_some() || qp.resp.write.is_some());
                self.uc_abort(qp);
                if !pkt.info.position.starts_message() {
                    return;
                }
            }
            qp.resp.epsn = psn;
        } else if d < 0 {
            self.counters.rx_duplicates += 1;
            self.note_duplicate(qp, now, psn);
            self.handle_duplicate(qp, pkt);
            return;
        } else if d > 0 {
            // A gap: the packet is held for replay (a train is not: its
            // payload is not ours to keep) and the gap NAK'd once with the
            // PSN we expect, at once or after the reordering window
            // (`recovery`).
            self.counters.rx_out_of_sequence += 1;
            let keep = if train.is_some() { &[][..] } else { raw };
            self.out_of_order(qp, now, psn, keep, src, dst);
            return;
        } else {
            self.note_gap_fill(qp, now, psn);
        }
        qp.resp.nak_sent = false;
        let outcome = self.execute_request(qp, pkt, train);
        let rc = qp.qp_type == QpType::Rc;
        match outcome {
            Outcome::Ok => {
                let last = psn.wrapping_add(train.map_or(1, |t| t.npkts()) - 1);
                qp.resp.epsn = last.next();
                if rc && pkt.headers.bth.ack_req {
                    self.send_ack(qp, last, Syndrome::ACK);
                }
            }
            Outcome::Answered => {}
            Outcome::Drop => {
                if !rc {
                    self.uc_abort(qp);
                }
            }
            Outcome::Rnr => {
                if rc {
                    self.counters.rnr_naks_sent += 1;
                    qp.resp.rnr_at = Some(psn);
                    let timer = qp.attr.min_rnr_timer;
                    self.send_ack(qp, psn, Syndrome::RnrNak { timer });
                } else {
                    self.counters.rx_no_recv_wqe += 1;
                    self.uc_abort(qp);
                }
            }
            Outcome::Fatal(code, event) => {
                if rc {
                    self.send_ack(qp, psn, Syndrome::Nak(code));
                    self.qp_event(qp, event);
                    self.flush_qp(qp);
                } else {
                    self.uc_abort(qp);
                }
            }
        }
    }

    fn uc_abort(&mut self, qp: &mut Qp) {
        if let Some(p) = qp.resp.recv.take() {
            // The receive WQE is reused for the next message.
            qp.rq.push_front(p.wqe);
        }
        qp.resp.write = None;
    }

    fn execute_request(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>, train: Option<&TrainIn<'_>>) -> Outcome {
        let info = pkt.info;
        // Opcode sequence (IBTA 9.7.5.1.4): a message in progress must be
        // continued by the same kind; a new one must start with first/only.
        let in_send = qp.resp.recv.is_some();
        let in_write = qp.resp.write.is_some();
        let continues = !info.position.starts_message();
        let ok_seq = match info.kind {
            OpKind::Send => continues == in_send && !in_write,
            OpKind::Write => continues == in_write && !in_send,
            _ => !in_send && !in_write,
        };
        if !ok_seq {
            self.counters.rx_bad_opcode_sequence += 1;
            return Outcome::Fatal(NakCode::InvalidRequest, EventType::QpReqErr);
        }
        match info.kind {
            OpKind::Send => self.recv_send(qp, pkt, train),
            OpKind::Write => self.recv_write(qp, pkt, train),
            OpKind::ReadRequest => self.recv_read(qp, pkt),
            OpKind::CompareSwap | OpKind::FetchAdd => self.recv_atomic(qp, pkt),
            _ => Outcome::Drop,
        }
    }

    /// Takes the next receive WQE (from the SRQ if the QP has one).
    fn next_recv(&mut self, qp: &mut Qp) -> Option<RecvWqe> {
        match qp.srq {
            None => qp.rq.pop_front(),
            Some(srq) => {
                let s = self.srqs.get_mut(srq.0)?;
                let (w, fire) = s.pop()?;
                if fire {
                    let (context, owner) = (s.context, s.owner);
                    self.push_async(
                        Some(owner),
                        crate::verbs::AsyncEvent {
                            event_type: EventType::SrqLimitReached,
                            element: crate::verbs::AsyncElement::Srq(context),
                        },
                    );
                }
                Some(w)
            }
        }
    }

    fn recv_send(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>, train: Option<&TrainIn<'_>>) -> Outcome {
        // The payload is already in the receive buffer (an ONLY packet
        // placed while its buffer was validated).
        let mut placed_already = false;
        if pkt.info.position.starts_message() {
            let Some(wqe) = self.next_recv(qp) else {
                return Outcome::Rnr;
            };
            // Validate the whole receive buffer once (docs/design.md §3.4: a bad
            // lkey in the receive WQE is LOC_PROT_ERR here, REM_OP_ERR there).
            // A message of one packet that fits is placed in the same pass:
            // nothing can change the MRs in between, and each SGE is
            // resolved once instead of twice.
            let only = pkt.info.position.ends_message() && train.is_none();
            let fits = (pkt.payload.len() as u64) <= wqe.length;
            let ok = if only && fits {
                placed_already = true;
                self.check_and_place(qp, &wqe, pkt.payload).is_ok()
            } else {
                self.recv_sgl_ok(qp, &wqe)
            };
            if !ok {
                self.complete_recv(qp, &wqe, WcStatus::LocProtErr, 0, None, WcFlags::empty(), 0, false);
                qp.recycle(wqe.sgl);
                return Outcome::Fatal(NakCode::RemoteOperationalError, EventType::QpAccessErr);
            }
            qp.resp.recv = Some(RecvProgress { wqe, offset: 0 });
        }
        let Some(mut prog) = qp.resp.recv.take() else {
            return Outcome::Drop;
        };
        let n = train.map_or(pkt.payload.len() as u64, |t| u64::from(t.len()));
        let end = prog.offset + n;
        if end > prog.wqe.length {
            self.counters.rx_recv_too_long += 1;
            self.complete_recv(qp, &prog.wqe, WcStatus::LocLenErr, 0, None, WcFlags::empty(), 0, false);
            qp.recycle(prog.wqe.sgl);
            if qp.qp_type == QpType::Uc {
                return Outcome::Drop;
            }
            return Outcome::Fatal(NakCode::InvalidRequest, EventType::QpReqErr);
        }
        let placed = match train {
            _ if placed_already => Ok(()),
            Some(t) => self.scatter_train(qp, &prog.wqe, t),
            None => self.scatter_recv(qp, &prog.wqe, prog.offset, pkt.payload),
        };
        if placed.is_err() {
            self.complete_recv(qp, &prog.wqe, WcStatus::LocProtErr, 0, None, WcFlags::empty(), 0, false);
            qp.recycle(prog.wqe.sgl);
            return Outcome::Fatal(NakCode::RemoteOperationalError, EventType::QpAccessErr);
        }
        prog.offset = end;
        if !pkt.info.position.ends_message() {
            qp.resp.recv = Some(prog);
            return Outcome::Ok;
        }
        let mut flags = WcFlags::empty();
        let mut imm = 0;
        if let Some(i) = pkt.headers.immdt {
            flags |= WcFlags::WITH_IMM;
            imm = i.be_value();
        }
        if let Some(ieth) = pkt.headers.ieth {
            // Send with invalidate (IBTA 10.6.7.2): a VALID fast-registration
            // MR or a bound type 2 window of this PD becomes invalid; a
            // failed invalidation is an invalid request and the QP goes to
            // ERR.
            if self.invalidate(qp.pd, qp.qpn, ieth.rkey, true).is_err() {
                self.complete_recv(
                    qp,
                    &prog.wqe,
                    WcStatus::RemInvReqErr,
                    0,
                    None,
                    WcFlags::empty(),
                    0,
                    false,
                );
                qp.recycle(prog.wqe.sgl);
                return Outcome::Fatal(NakCode::InvalidRequest, EventType::QpReqErr);
            }
            flags |= WcFlags::WITH_INV;
            imm = ieth.rkey;
        }
        qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
        let solicited = pkt.headers.bth.solicited;
        self.complete_recv(
            qp,
            &prog.wqe,
            WcStatus::Success,
            end as u32,
            Some(WcOpcode::Recv),
            flags,
            imm,
            solicited,
        );
        qp.recycle(prog.wqe.sgl);
        Outcome::Ok
    }

    fn recv_write(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>, train: Option<&TrainIn<'_>>) -> Outcome {
        let access_ok = qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_WRITE);
        if pkt.info.position.starts_message() {
            let Some(reth) = pkt.headers.reth else {
                return Outcome::Drop;
            };
            if !access_ok && reth.dma_len > 0 {
                return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
            }
            // The whole range is checked up front (IBTA 9.7.5.1.3).
            if let Err(e) = self.mrs.check_remote(
                reth.rkey,
                qp.pd,
                qp.qpn,
                reth.va,
                u64::from(reth.dma_len),
                AccessFlags::REMOTE_WRITE,
            ) {
                self.count_key_error(e);
                return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
            }
            qp.resp.write = Some(WriteProgress {
                rkey: reth.rkey,
                va: reth.va,
                remaining: u64::from(reth.dma_len),
                total: reth.dma_len,
            });
        }
        let Some(mut w) = qp.resp.write.take() else {
            return Outcome::Drop;
        };
        let n = train.map_or(pkt.payload.len() as u64, |t| u64::from(t.len()));
        let ends = pkt.info.position.ends_message();
        // Payload must fill MTU-sized packets exactly and end with the DMA
        // length (IBTA 9.7.5.1.5: length errors are invalid requests).
        let mtu = u64::from(qp.mtu());
        let bad_len = n > w.remaining || (!ends && n != mtu) || (ends && n != w.remaining);
        if bad_len {
            self.counters.rx_bad_length += 1;
            return Outcome::Fatal(NakCode::InvalidRequest, EventType::QpReqErr);
        }
        // Write-with-immediate needs a receive WQE, checked before any byte
        // is placed so an RNR retry finds memory untouched.
        let needs_recv = pkt.headers.immdt.is_some();
        let recv = if needs_recv {
            match self.next_recv(qp) {
                Some(r) => Some(r),
                None => {
                    // A multi-packet write resumes at this (last) packet, so
                    // its progress is put back. A write-only-with-immediate
                    // is retried from its start and sets the progress up
                    // again from its RETH: keeping it here would make the
                    // retry look like a new message inside an unfinished one
                    // (an opcode sequence error, NAK invalid request).
                    // Found by the simulated fabric (sim_regressions).
                    if !pkt.info.position.starts_message() {
                        qp.resp.write = Some(w);
                    }
                    return Outcome::Rnr;
                }
            }
        } else {
            None
        };
        if n > 0 {
            match self
                .mrs
                .check_remote(w.rkey, qp.pd, qp.qpn, w.va, n, AccessFlags::REMOTE_WRITE)
            {
                Ok(Some(r)) => {
                    let written = match train {
                        Some(t) => r.write_train(t, 0, n as usize),
                        None => r.write(pkt.payload),
                    };
                    if written.is_err() {
                        return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    self.count_key_error(e);
                    return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
                }
            }
        }
        w.va += n;
        w.remaining -= n;
        if !ends {
            qp.resp.write = Some(w);
            return Outcome::Ok;
        }
        qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
        if let (Some(r), Some(imm)) = (recv, pkt.headers.immdt) {
            let total = w.total;
            let solicited = pkt.headers.bth.solicited;
            self.complete_recv(
                qp,
                &r,
                WcStatus::Success,
                total,
                Some(WcOpcode::RecvRdmaWithImm),
                WcFlags::WITH_IMM,
                imm.be_value(),
                solicited,
            );
            qp.recycle(r.sgl);
        }
        Outcome::Ok
    }

    fn recv_read(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>) -> Outcome {
        let Some(reth) = pkt.headers.reth else {
            return Outcome::Drop;
        };
        if !qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_READ) && reth.dma_len > 0 {
            return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
        }
        if let Err(e) = self.mrs.check_remote(
            reth.rkey,
            qp.pd,
            qp.qpn,
            reth.va,
            u64::from(reth.dma_len),
            AccessFlags::REMOTE_READ,
        ) {
            self.count_key_error(e);
            return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
        }
        let max = usize::from(qp.attr.max_dest_rd_atomic).max(1);
        if qp.resp.rd_atomic.len() >= max {
            qp.resp.rd_atomic.pop_front();
        }
        let psn = pkt.headers.bth.psn;
        let npkts = super::requester::packets_for(reth.dma_len, qp.mtu());
        qp.resp.rd_atomic.push_back(RdAtomicRes::Read {
            first_psn: psn,
            npkts,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.dma_len,
        });
        if !self.send_read_responses(qp, psn, reth.va, reth.rkey, reth.dma_len) {
            return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
        }
        qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
        qp.resp.epsn = psn.wrapping_add(npkts);
        Outcome::Answered
    }

    /// Sends the read responses for `len` bytes at `va`, PSNs from `psn`.
    fn send_read_responses(&mut self, qp: &mut Qp, psn: Psn, va: u64, rkey: u32, len: u32) -> bool {
        let mtu = qp.mtu();
        let npkts = super::requester::packets_for(len, mtu);
        if self.send_read_train(qp, psn, va, rkey, len, npkts) {
            return true;
        }
        for i in 0..npkts {
            let off = i * mtu;
            let n = (len - off.min(len)).min(mtu);
            let position = match (i == 0, i + 1 == npkts) {
                (true, true) => Position::Only,
                (true, false) => Position::First,
                (false, true) => Position::Last,
                (false, false) => Position::Middle,
            };
            let opcode = Opcode::find(Transport::Rc, OpKind::ReadResponse, position, false, false)
                .unwrap_or(Opcode::Unknown(0xff));
            let mut h = PacketRepr::new(BthRepr::new(opcode, Qpn::new(qp.attr.dest_qp_num), psn.wrapping_add(i)));
            if position != Position::Middle {
                h.aeth = Some(AethRepr {
                    syndrome: Syndrome::ACK,
                    msn: (qp.resp.msn + 1) & 0x00ff_ffff,
                });
            }
            // Build in place: the payload is read from memory straight into
            // the packet.
            let Some(mut data) = self.new_packet(&h, n as usize) else {
                return false;
            };
            if n > 0 {
                let r = self.mrs.check_remote(
                    rkey,
                    qp.pd,
                    qp.qpn,
                    va + u64::from(off),
                    u64::from(n),
                    AccessFlags::REMOTE_READ,
                );
                match r {
                    Ok(Some(r)) if r.append_to(n as usize, &mut data).is_ok() => {}
                    Ok(None) => {}
                    _ => return false,
                }
            }
            let dst = qp.attr.ah_attr.grh.dgid.to_ip();
            let sgid = qp.attr.ah_attr.grh.sgid_index;
            self.counters.tx_responses += 1;
            self.queue_packet(qp.qpn, qp.attr.dest_qp_num, sgid, dst, n as usize, data);
        }
        true
    }

    /// Sends the responses of a read as one train (a READ_RESPONSE_ONLY
    /// standing for `npkts` PSNs from `psn`) when the requester can read
    /// this memory (and takes a train of one packet, if `npkts` is 1);
    /// `false` to send packets instead.
    fn send_read_train(&mut self, qp: &mut Qp, psn: Psn, va: u64, rkey: u32, len: u32, npkts: u32) -> bool {
        let Some(caps) = self.train_caps_to(qp, len, npkts) else {
            return false;
        };
        let Ok(Some(r)) = self
            .mrs
            .check_remote(rkey, qp.pd, qp.qpn, va, u64::from(len), AccessFlags::REMOTE_READ)
        else {
            return false;
        };
        let mut pieces = Vec::new();
        if r.train_pieces(len as usize, caps, &mut pieces).is_err() || pieces.len() > TRAIN_MAX_PIECES {
            return false;
        }
        let opcode = Opcode::find(Transport::Rc, OpKind::ReadResponse, Position::Only, false, false)
            .unwrap_or(Opcode::Unknown(0xff));
        let mut h = PacketRepr::new(BthRepr::new(opcode, Qpn::new(qp.attr.dest_qp_num), psn));
        h.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: (qp.resp.msn + 1) & 0x00ff_ffff,
        });
        let Some(data) = self.new_packet(&h, 0) else {
            return false;
        };
        let dst = qp.attr.ah_attr.grh.dgid.to_ip();
        let sgid = qp.attr.ah_attr.grh.sgid_index;
        self.counters.tx_responses += 1;
        self.counters.tx_trains += 1;
        let train = Box::new(TrainOut { npkts, pieces });
        self.queue_packet_with(qp.qpn, qp.attr.dest_qp_num, sgid, dst, 0, data, Some(train));
        true
    }

    fn recv_atomic(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>) -> Outcome {
        let Some(a) = pkt.headers.atomic_eth else {
            return Outcome::Drop;
        };
        if a.va % 8 != 0 {
            self.counters.rx_misaligned_atomics += 1;
            return Outcome::Fatal(NakCode::InvalidRequest, EventType::QpReqErr);
        }
        if !qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_ATOMIC) {
            return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
        }
        let r = match self
            .mrs
            .check_remote(a.rkey, qp.pd, qp.qpn, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        {
            Ok(Some(r)) => r,
            Ok(None) => return Outcome::Drop,
            Err(e) => {
                self.count_key_error(e);
                return Outcome::Fatal(NakCode::RemoteAccessError, EventType::QpAccessErr);
            }
        };
        // Atomic with respect to every other atomic of this device: the
        // engine is single-threaded per device and the memory operation is a
        // CPU atomic, so CPU atomics on the same word are also coherent.
        let orig = if pkt.info.kind == OpKind::CompareSwap {
            r.compare_swap_u64(a.compare, a.swap_add)
        } else {
            r.fetch_add_u64(a.swap_add)
        };
        let Ok(orig) = orig else {
            return Outcome::Fatal(NakCode::InvalidRequest, EventType::QpReqErr);
        };
        let psn = pkt.headers.bth.psn;
        let max = usize::from(qp.attr.max_dest_rd_atomic).max(1);
        if qp.resp.rd_atomic.len() >= max {
            qp.resp.rd_atomic.pop_front();
        }
        qp.resp.rd_atomic.push_back(RdAtomicRes::Atomic { psn, orig });
        qp.resp.msn = (qp.resp.msn + 1) & 0x00ff_ffff;
        qp.resp.epsn = psn.next();
        self.send_atomic_ack(qp, psn, orig);
        Outcome::Answered
    }

    fn send_atomic_ack(&mut self, qp: &mut Qp, psn: Psn, orig: u64) {
        let mut h = PacketRepr::new(BthRepr::new(
            Opcode::RcAtomicAcknowledge,
            Qpn::new(qp.attr.dest_qp_num),
            psn,
        ));
        h.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: qp.resp.msn,
        });
        h.atomic_ack_eth = Some(AtomicAckEthRepr { original_value: orig });
        self.transmit_reply(qp, &h, &[]);
    }

    /// Duplicate requests: sends and writes are re-acknowledged; reads are
    /// answered again from the saved request; atomics resend the saved
    /// original value (never executed twice).
    fn handle_duplicate(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>) {
        let psn = pkt.headers.bth.psn;
        match pkt.info.kind {
            OpKind::ReadRequest => {
                let found = qp.resp.rd_atomic.iter().find_map(|r| match *r {
                    RdAtomicRes::Read {
                        first_psn,
                        npkts,
                        va,
                        rkey,
                        len,
                    } => {
                        let d = first_psn.distance(psn);
                        (d >= 0 && (d as u32) < npkts).then_some((d as u32, va, rkey, len))
                    }
                    _ => None,
                });
                if let Some((k, va, rkey, len)) = found {
                    let off = (k * qp.mtu()).min(len);
                    let _ = self.send_read_responses(qp, psn, va + u64::from(off), rkey, len - off);
                }
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let saved = qp.resp.rd_atomic.iter().find_map(|r| match *r {
                    RdAtomicRes::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = saved {
                    self.send_atomic_ack(qp, psn, orig);
                }
            }
            _ => {
                if pkt.headers.bth.ack_req || pkt.info.position.ends_message() {
                    let last = qp.resp.epsn.wrapping_sub(1);
                    self.send_ack(qp, last, Syndrome::ACK);
                }
            }
        }
    }

    fn handle_ud(&mut self, qp: &mut Qp, pkt: &ParsedPacket<'_>, src: IpAddr, dst: IpAddr) {
        let Some(deth) = pkt.headers.deth else { return };
        if deth.qkey != qp.attr.qkey {
            self.counters.rx_bad_qkey += 1;
            return;
        }
        let Some(wqe) = self.next_recv(qp) else {
            self.counters.rx_no_recv_wqe += 1;
            return;
        };
        let total = GRH_LEN as u64 + pkt.payload.len() as u64;
        if total > wqe.length {
            self.counters.rx_recv_too_long += 1;
            self.complete_recv(qp, &wqe, WcStatus::LocLenErr, 0, None, WcFlags::empty(), 0, false);
            qp.recycle(wqe.sgl);
            return;
        }
        if !self.recv_sgl_ok(qp, &wqe) {
            self.complete_recv(qp, &wqe, WcStatus::LocProtErr, 0, None, WcFlags::empty(), 0, false);
            qp.recycle(wqe.sgl);
            return;
        }
        let grh = IpPseudoHeader::between(src, dst).map(|ip| {
            let roce_len =
                pkt.headers.header_len() + pkt.payload.len() + crate::soft::wire::pad_len(pkt.payload.len()) + 4;
            grh_bytes(&ip, &IpVariantFields::default(), roce_len)
        });
        let grh = grh.unwrap_or([0; GRH_LEN]);
        if self.scatter_recv(qp, &wqe, 0, &grh).is_err()
            || self.scatter_recv(qp, &wqe, GRH_LEN as u64, pkt.payload).is_err()
        {
            self.complete_recv(qp, &wqe, WcStatus::LocProtErr, 0, None, WcFlags::empty(), 0, false);
            qp.recycle(wqe.sgl);
            return;
        }
        let mut flags = WcFlags::GRH;
        let mut imm = 0;
        if let Some(i) = pkt.headers.immdt {
            flags |= WcFlags::WITH_IMM;
            imm = i.be_value();
        }
        let solicited = pkt.headers.bth.solicited;
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            imm_data: imm,
            qp_num: qp.qpn,
            src_qp: deth.src_qpn.value(),
            wc_flags: flags,
            ..WorkCompletion::default()
        };
        self.push_cqe(qp.recv_cq, wc, solicited);
        qp.recycle(wqe.sgl);
    }

    fn recv_sgl_ok(&self, qp: &Qp, wqe: &RecvWqe) -> bool {
        wqe.sgl.iter().all(|s| {
            self.mrs
                .check(s.lkey, qp.pd, s.addr, u64::from(s.len), AccessFlags::LOCAL_WRITE)
                .is_ok()
        })
    }

    /// [`Self::recv_sgl_ok`] and [`Self::scatter_recv`] of `data` at
    /// offset 0 in one pass over the SGEs (`data` no longer than the
    /// buffer): every SGE is checked whole, and the payload is written
    /// into the ranges the checks resolved. On an error nothing may have
    /// been written past a bad SGE, as with the two passes.
    pub(super) fn check_and_place(&self, qp: &Qp, wqe: &RecvWqe, data: &[u8]) -> Result<(), ()> {
        // One SGE of a plain MR, the usual receive: in one step.
        if let [s] = wqe.sgl.as_slice() {
            if s.len > 0
                && data.len() <= s.len as usize
                && self
                    .mrs
                    .write_plain(s.lkey, qp.pd, s.addr, u64::from(s.len), AccessFlags::LOCAL_WRITE, data)
                    .is_some()
            {
                return Ok(());
            }
        }
        let mut done = 0;
        for s in &wqe.sgl {
            let r = self
                .mrs
                .check(s.lkey, qp.pd, s.addr, u64::from(s.len), AccessFlags::LOCAL_WRITE)
                .map_err(|_| ())?;
            let n = (s.len as usize).min(data.len() - done);
            if let Some(r) = r.filter(|_| n > 0) {
                r.write(&data[done..done + n])?;
            }
            done += n;
        }
        if done == data.len() {
            Ok(())
        } else {
            Err(())
        }
    }

    fn scatter_recv(&self, qp: &Qp, wqe: &RecvWqe, offset: u64, data: &[u8]) -> Result<(), ()> {
        self.mrs.for_each_piece(
            &wqe.sgl,
            qp.pd,
            offset,
            data.len(),
            AccessFlags::LOCAL_WRITE,
            |r, at, n| r.write(&data[at..at + n]),
        )
    }

    /// Places a whole train's payload in a receive buffer.
    fn scatter_train(&self, qp: &Qp, wqe: &RecvWqe, t: &TrainIn<'_>) -> Result<(), ()> {
        self.mrs.for_each_piece(
            &wqe.sgl,
            qp.pd,
            0,
            t.len() as usize,
            AccessFlags::LOCAL_WRITE,
            |r, at, n| r.write_train(t, at as u64, n),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn complete_recv(
        &mut self,
        qp: &Qp,
        wqe: &RecvWqe,
        status: WcStatus,
        byte_len: u32,
        opcode: Option<WcOpcode>,
        flags: WcFlags,
        imm: u32,
        solicited: bool,
    ) {
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode: opcode.unwrap_or(WcOpcode::Recv),
            byte_len,
            imm_data: imm,
            qp_num: qp.qpn,
            src_qp: qp.attr.dest_qp_num,
            wc_flags: flags,
            ..WorkCompletion::default()
        };
        self.push_cqe(qp.recv_cq, wc, solicited);
    }

    fn count_key_error(&mut self, e: KeyError) {
        match e {
            KeyError::BadKey => self.counters.rx_bad_rkey += 1,
            KeyError::WrongPd | KeyError::Access => self.counters.rx_rkey_access += 1,
            KeyError::Bounds => self.counters.rx_rkey_bounds += 1,
        }
    }

    /// Sends an ACK/NAK for `psn`.
    pub(crate) fn send_ack(&mut self, qp: &mut Qp, psn: Psn, syndrome: Syndrome) {
        let Some(headers) = self.ack_headers(qp, psn, syndrome) else {
            self.counters.tx_emit_errors += 1;
            return;
        };
        let dst = qp.attr.ah_attr.grh.dgid.to_ip();
        let sgid = qp.attr.ah_attr.grh.sgid_index;
        self.counters.tx_responses += 1;
        let plain = matches!(syndrome, Syndrome::Ack { .. });
        if plain && self.rewrite_last_ack(qp, &headers, dst, sgid) {
            self.counters.tx_packets += 1;
            return;
        }
        let mut data = self.take_buffer(ACK_LEN + crate::soft::wire::ICRC_LEN);
        data.extend_from_slice(&headers);
        self.queue_packet(qp.qpn, qp.attr.dest_qp_num, sgid, dst, 0, data);
        if plain {
            self.drop_superseded_ack();
        }
    }

    /// The BTH and AETH of an ACK/NAK of `qp` for `psn` (the soft
    /// capability bit set where selective repeat was negotiated); `None`
    /// if they cannot be emitted.
    ///
    /// The most frequent packet: its headers are written straight; the
    /// generic path (check the header set against the opcode table, then
    /// a cursor over every optional header) cost three times as much.
    /// Debug builds check that the bytes are the same.
    fn ack_headers(&self, qp: &Qp, psn: Psn, syndrome: Syndrome) -> Option<[u8; ACK_LEN]> {
        let bth = BthRepr::new(Opcode::RcAcknowledge, Qpn::new(qp.attr.dest_qp_num), psn);
        let aeth = AethRepr {
            syndrome,
            msn: qp.resp.msn,
        };
        let mut headers = [0u8; ACK_LEN];
        let (b, a) = headers.split_at_mut(BthRepr::LEN);
        bth.emit(b).ok()?;
        aeth.emit(a).ok()?;
        #[cfg(debug_assertions)]
        {
            let mut h = PacketRepr::new(bth);
            h.aeth = Some(aeth);
            let mut generic = [0u8; ACK_LEN];
            debug_assert_eq!(h.emit_headers(0, &mut generic), Ok(ACK_LEN));
            debug_assert_eq!(generic, headers);
        }
        if self.sr_responder(qp) {
            crate::soft::wire::set_soft_cap(&mut headers);
        }
        Some(headers)
    }

    /// A plain ACK of `qp` (its `headers`) written over the last datagram
    /// of the output when that one is the plain ACK it supersedes, of the
    /// same QP, source and destination: what building a new one, queueing
    /// it and taking the old one out ([`Core::drop_superseded_ack`]) would
    /// leave, in its place, for a few stores (and the ICRC computed again,
    /// if packets carry one). A responder handling a turn of trains or
    /// messages that ask for ACKs rewrites one ACK instead of building one
    /// per request. `false` (nothing changed) when the output ends
    /// otherwise; an empty output (a ping-pong's every ACK) is found out
    /// first, before the packet's addresses are looked up.
    fn rewrite_last_ack(&mut self, qp: &Qp, headers: &[u8; ACK_LEN], dst: IpAddr, sgid: u8) -> bool {
        let superseded = |t: &Transmit| {
            super::acks::is_plain_ack(t)
                && t.train.is_none()
                && t.data.len() == ACK_LEN + crate::soft::wire::ICRC_LEN
                && t.dst == dst
                && super::acks::dest_qpn(t)[..] == qp.attr.dest_qp_num.to_be_bytes()[1..]
        };
        if !self.tx.back().is_some_and(superseded) {
            return false;
        }
        let Some((src, ports)) = self.packet_addr(qp.qpn, qp.attr.dest_qp_num, sgid) else {
            return false;
        };
        let emit_icrc = self.cfg.emit_icrc;
        let Some(last) = self.tx.back_mut() else {
            return false;
        };
        if (last.src, last.src_port, last.dst_port) != (src, ports.src, ports.dst) {
            return false;
        }
        last.data[..ACK_LEN].copy_from_slice(headers);
        if emit_icrc {
            last.data[ACK_LEN..].fill(0);
            if let Some(ip) = crate::soft::wire::IpPseudoHeader::between(src, dst) {
                let _ = crate::soft::wire::fill_icrc(&ip, ports, &mut last.data);
            }
        }
        true
    }

    fn transmit_reply(&mut self, qp: &Qp, h: &PacketRepr, payload: &[u8]) {
        debug_assert_eq!(transport_of(qp.qp_type), Transport::Rc);
        let dst = qp.attr.ah_attr.grh.dgid.to_ip();
        let sgid = qp.attr.ah_attr.grh.sgid_index;
        self.counters.tx_responses += 1;
        self.transmit(qp.qpn, qp.attr.dest_qp_num, sgid, dst, h, payload);
    }
}
