//! The requester's AckReq policy (`requester::asks_ack`) and the
//! responder's side of it: only packets that ask are acknowledged, one ACK
//! covers everything before it, and a duplicate is always answered.

use super::*;

impl Node {
    fn post_unsignaled(&mut self, now: Nanos, wr_id: u64, off: u64, len: u32) {
        let sgl = [self.sge(off, len)];
        let wr = SendWr::new(wr_id, SendOp::Send, &sgl);
        self.core.post_send(now, self.qpn, &[wr]).unwrap();
    }
}

/// Runs the QP's timer (if any) and checks that nothing is resent: every
/// request is acknowledged. (An armed timer may stay and fire early,
/// finding nothing due.)
fn assert_all_acknowledged(n: &mut Node) {
    if let Some(t) = n.core.poll_timeout() {
        n.core.handle_timeout(t + (4096u64 << 10));
    }
    assert!(n.sent().is_empty(), "nothing to retransmit");
}

/// What the requester sent: (PSN, AckReq) per packet.
fn asks(pkts: &[(PacketRepr, Vec<u8>)]) -> Vec<(u32, bool)> {
    pkts.iter().map(|(h, _)| (h.bth.psn.value(), h.bth.ack_req)).collect()
}

#[test]
fn only_signaled_sends_ask_for_an_ack_and_one_ack_retires_the_unsignaled() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_unsignaled(0, 1, 0, 8);
    n.post_unsignaled(0, 2, 0, 3000);
    n.post_send(0, 3, SendOp::Send, 0, 8);
    let pkts = n.sent();
    assert_eq!(
        asks(&pkts),
        [
            (SQ_PSN, false),
            (SQ_PSN + 1, false),
            (SQ_PSN + 2, false),
            (SQ_PSN + 3, false),
            (SQ_PSN + 4, true)
        ]
    );
    // The ACK of the signaled send covers the unsignaled ones: one
    // completion, and the send queue is empty again.
    n.inject(1, &ack(n.qpn, SQ_PSN + 4, Syndrome::ACK), &[]);
    let wc = n.cqes();
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(3, WcStatus::Success)]
    );
    assert_all_acknowledged(&mut n);
}

#[test]
fn a_long_run_of_unsignaled_packets_asks_every_ack_every_packets() {
    let mut n = node(QpType::Rc, Mtu::Mtu256);
    let every = n.core.cfg.ack_every;
    // Messages of 16 packets: 3 * every packets in all.
    for i in 0..3 * every / 16 {
        n.post_unsignaled(0, u64::from(i), 0, 16 * 256 - 100);
        let pkts = n.sent();
        // Let the ACKs the requester asks for arrive (the send queue holds
        // 32 WQEs; unacknowledged ones keep their slots).
        if let Some((h, _)) = pkts.iter().rev().find(|(h, _)| h.bth.ack_req) {
            n.inject(0, &ack(n.qpn, h.bth.psn.value(), Syndrome::ACK), &[]);
        }
        for (h, _) in &pkts {
            let k = h.bth.psn.value() - SQ_PSN + 1;
            // (The last packet of a WQE that leaves the send queue half full
            // would ask too; with an ACK per ask, at most 4 are outstanding.)
            assert_eq!(h.bth.ack_req, k.is_multiple_of(every), "packet {k}");
        }
    }
    assert!(n.cqes().is_empty(), "unsignaled sends complete silently");
}

#[test]
fn a_send_queue_half_full_of_unsignaled_sends_asks() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    // max_send_wr 32: the 16th outstanding WQE asks.
    let mut asked = Vec::new();
    for i in 0..20 {
        n.post_unsignaled(0, i, 0, 8);
        asked.extend(n.sent().iter().map(|(h, _)| h.bth.ack_req));
    }
    let first = asked.iter().position(|&a| a).expect("an ask");
    assert_eq!(first, 15);
    // An ACK for it frees the slots.
    n.inject(0, &ack(n.qpn, SQ_PSN + 15, Syndrome::ACK), &[]);
    for i in 20..30 {
        n.post_unsignaled(0, i, 0, 8);
    }
    assert!(
        n.sent().iter().all(|(h, _)| !h.bth.ack_req),
        "4 + 10 outstanding: no ask"
    );
}

#[test]
fn a_send_queue_kept_full_asks_once_per_eighth_of_it() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    // max_send_wr 32, nothing acknowledged: the 16th WQE asks (half full),
    // then every 4th (an eighth of the queue), not every one.
    let mut asked = Vec::new();
    for i in 0..32 {
        n.post_unsignaled(0, i, 0, 8);
        asked.extend(n.sent().iter().map(|(h, _)| h.bth.ack_req));
    }
    let at: Vec<usize> = asked.iter().enumerate().filter(|(_, &a)| a).map(|(i, _)| i).collect();
    assert_eq!(at, [15, 19, 23, 27, 31]);
    // One ACK retires them all.
    n.inject(0, &ack(n.qpn, SQ_PSN + 31, Syndrome::ACK), &[]);
    assert!(n.cqes().is_empty(), "unsignaled sends complete silently");
    assert_all_acknowledged(&mut n);
}

#[test]
fn a_trailing_unsignaled_send_is_acknowledged_by_its_resent_duplicate() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_unsignaled(0, 1, 0, 8);
    let pkts = n.sent();
    assert_eq!(asks(&pkts), [(SQ_PSN, false)]);
    // Nothing asks: the peer keeps quiet, the ACK timer resends.
    let now = n.core.poll_timeout().expect("the retransmission timer is armed");
    n.core.handle_timeout(now);
    assert_eq!(n.sent().len(), 1, "resent after the ACK timeout");
    n.inject(now, &ack(n.qpn, SQ_PSN, Syndrome::ACK), &[]);
    assert!(n.cqes().is_empty());
    assert_all_acknowledged(&mut n);
}

#[test]
fn the_responder_acknowledges_only_what_asks_and_every_duplicate() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    for i in 0..3 {
        n.post_recv(i, 0, 64);
    }
    let mut h = req(Opcode::RcSendOnly, n.qpn, RQ_PSN);
    h.bth.ack_req = false;
    n.inject(0, &h, b"one");
    assert!(n.sent().is_empty(), "no ACK unasked");
    let mut h2 = req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 1);
    h2.bth.ack_req = true;
    n.inject(0, &h2, b"two");
    let acks = n.sent();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].0.bth.psn.value(), RQ_PSN + 1, "one ACK covers both");
    // A duplicate that did not ask is answered all the same: it is how a
    // requester that heard nothing learns where the responder is.
    n.inject(0, &h, b"one");
    let acks = n.sent();
    assert_eq!(acks.len(), 1);
    assert_eq!(aeth_of(&acks[0].0), Syndrome::ACK);
    assert_eq!(acks[0].0.bth.psn.value(), RQ_PSN + 1);
    assert_eq!(n.cqes().len(), 2, "each message delivered once");
}

/// WQEs that retire together give back every SGE vector and inline buffer
/// for the next posts (with a CQE every 30th send, 30 retire at once; a
/// pool smaller than the queue freed most of them only to allocate them
/// again on the next posts).
#[test]
fn a_batch_of_retired_wqes_refills_the_pools_whole() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let sgl = [n.sge(0, 8)];
    for i in 0..30u64 {
        let flags = if i == 29 {
            SendFlags::INLINE | SendFlags::SIGNALED
        } else {
            SendFlags::INLINE
        };
        let wr = SendWr::new(i, SendOp::Send, &sgl).flags(flags);
        n.core.post_send(0, n.qpn, &[wr]).unwrap();
    }
    let last = n.sent().last().map(|(h, _)| h.bth.psn.value()).unwrap();
    n.inject(1, &ack(n.qpn, last, Syndrome::ACK), &[]);
    assert_eq!(n.cqes().len(), 1);
    let qp = n.core.take_qp(n.qpn).unwrap();
    let (vecs, inline) = (qp.spare.len(), qp.spare_inline.len());
    n.core.put_qp(qp);
    assert!(vecs >= 30, "{vecs} SGE vectors kept");
    assert_eq!(inline, 30, "inline buffers kept");
}

/// A plain ACK that a newer one of its QP supersedes in the same output
/// never leaves: while it is the output's last datagram, the newer one is
/// written over it (no buffer taken, the same bytes as one built anew),
/// and else it is taken out when the newer one is queued (its buffer kept
/// for the next packet), not built, queued and dropped at the drain: a
/// NAK between stays ahead of the newest ACK, and once a drain has begun,
/// an ACK queued meanwhile still takes out the one waiting.
#[test]
fn a_superseded_ack_is_taken_out_when_the_newer_one_is_queued() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    for i in 0..8 {
        n.post_recv(i, 0, 64);
    }
    let asking = |n: &Node, psn: u32| {
        let mut h = req(Opcode::RcSendOnly, n.qpn, psn);
        h.bth.ack_req = true;
        h
    };
    n.inject(0, &asking(&n, RQ_PSN), b"x");
    let spare = n.core.spare_bufs.len();
    for k in 1..3 {
        n.inject(0, &asking(&n, RQ_PSN + k), b"x");
        assert_eq!(n.core.tx.len(), 1, "one ACK waits");
    }
    assert_eq!(n.core.spare_bufs.len(), spare, "the ACK is rewritten, no buffer taken");
    let rewritten = n.core.tx.back().unwrap().data.clone();
    let acks = n.sent();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].0.bth.psn.value(), RQ_PSN + 2);
    // The same three with the output drained after each: the last ACK,
    // built anew, is the rewritten one byte for byte (ICRC included).
    let mut fresh = node(QpType::Rc, Mtu::Mtu1024);
    for i in 0..8 {
        fresh.post_recv(i, 0, 64);
    }
    let mut built = Vec::new();
    for k in 0..3 {
        fresh.inject(0, &asking(&fresh, RQ_PSN + k), b"x");
        built = fresh.core.tx.back().unwrap().data.clone();
        assert_eq!(fresh.sent().len(), 1);
    }
    assert_eq!(rewritten, built);

    // ACK, NAK (a gap), ACK: the NAK stays ahead of the newest ACK, the
    // only plain one to leave.
    n.inject(0, &asking(&n, RQ_PSN + 3), b"x");
    n.inject(0, &asking(&n, RQ_PSN + 9), b"x");
    n.inject(0, &asking(&n, RQ_PSN + 4), b"x");
    let out = responses(&mut n);
    assert_eq!(out[0], (Syndrome::Nak(NakCode::PsnSequenceError), RQ_PSN + 4));
    assert_eq!(plain_acks(&out), [RQ_PSN + 4]);

    // A drain begun: an ACK queued before it ends takes out the one still
    // waiting, and leaves in its place.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    for i in 0..4 {
        n.post_recv(i, 0, 64);
    }
    n.inject(0, &asking(&n, RQ_PSN + 5), b"x");
    n.inject(0, &asking(&n, RQ_PSN), b"x");
    let nak = n.core.poll_transmit().expect("the NAK");
    assert!(!super::super::acks::is_plain_ack(&nak));
    n.inject(0, &asking(&n, RQ_PSN + 1), b"x");
    assert_eq!(plain_acks(&responses(&mut n)), [RQ_PSN + 1]);
}

/// What [`Node::sent`] sent: syndromes and PSNs.
fn responses(n: &mut Node) -> Vec<(Syndrome, u32)> {
    n.sent().iter().map(|(h, _)| (aeth_of(h), h.bth.psn.value())).collect()
}

fn plain_acks(out: &[(Syndrome, u32)]) -> Vec<u32> {
    out.iter()
        .filter(|(s, _)| matches!(s, Syndrome::Ack { .. }))
        .map(|&(_, psn)| psn)
        .collect()
}
