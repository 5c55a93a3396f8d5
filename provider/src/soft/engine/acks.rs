//! ACK coalescing for inline devices on a network link.
//!
//! An RC responder acknowledges every message that asks for it. On a
//! network link each ACK is a datagram, and on loopback a datagram costs
//! about as much kernel time as the message itself: in a send/receive
//! ping-pong, ACKs in both directions nearly double the one-way latency.
//! IBTA lets a responder coalesce acknowledgements (an ACK for PSN n
//! acknowledges every earlier request), so when a poll hands completions
//! to the application (which is then likely to answer), an inline device
//! keeps the plain ACKs that poll produced back for up to
//! [`ACK_HOLD_NS`], keeping only the newest per QP, and sends them with the
//! first verb called after that.
//!
//! Why not send a held ACK in the same `sendmmsg` as the next request the
//! device sends (a ping-pong's reply)? Tried: it takes the ACK's system
//! call away (1.25 -> 1.0 `sendmmsg` per message), but puts the ACK on the
//! critical path, in the kernel with the reply and in the peer's engine
//! before the reply's completion: the UDP ping-pong's median got 0.1-0.3 µs
//! worse. A held ACK that waits for [`ACK_HOLD_NS`] mostly leaves from a
//! poll that found nothing, while the application waits anyway. ACKs produced while the application gets
//! no completion (the target of RDMA WRITEs) leave at once. Everything else
//! (requests, NAKs, read and atomic responses) leaves at once, and a
//! response that is not a plain ACK first flushes the held ACKs so that
//! responses of a QP never overtake each other.
//!
//! Off by default ([`super::DeviceShared::set_ack_coalescing`] turns it on):
//! the cost: a requester sees its send completions up to
//! [`ACK_HOLD_NS`] (plus the gap to the responder's next verb) later, and
//! an inline application that stops calling verbs altogether strands the
//! ACKs it holds (it strands everything else too: inline devices make
//! progress only inside verbs). Progress-thread devices do not coalesce.

use std::net::IpAddr;

use crate::soft::proto::{Nanos, Transmit};
use crate::soft::wire::Opcode;

/// How long an ACK may be held. Far below any retransmission timeout in
/// use (IBTA timeout 1 is 8 µs, the usual 14 is 67 ms), and longer than a
/// loopback round trip, so a ping-pong sends one ACK per several messages.
pub(crate) const ACK_HOLD_NS: Nanos = 50_000;

const OPCODE_RC_ACK: u8 = 0x11;
/// Offset of the AETH syndrome in an RC Acknowledge (right after the BTH).
const AETH_SYNDROME: usize = 12;

/// Plain ACKs held back, oldest first: (destination, QPN) → the newest ACK
/// and when the first of those it replaced was held.
#[derive(Debug, Default)]
pub(crate) struct HeldAcks {
    held: Vec<(IpAddr, [u8; 3], Transmit, Nanos)>,
}

/// An RC Acknowledge whose syndrome is ACK (not RNR NAK or NAK).
pub(crate) fn is_plain_ack(t: &Transmit) -> bool {
    t.data.len() > AETH_SYNDROME && t.data[0] == OPCODE_RC_ACK && t.data[AETH_SYNDROME] >> 5 == 0
}

/// A response (ACK, NAK, read or atomic response) rather than a request.
fn is_response(t: &Transmit) -> bool {
    t.data
        .first()
        .and_then(|&b| Opcode::from(b).info())
        .is_some_and(|i| !i.is_request())
}

fn dest_qpn(t: &Transmit) -> [u8; 3] {
    [t.data[5], t.data[6], t.data[7]]
}

/// Drops from `txs[from..]` (what one engine turn produced) every plain ACK
/// that a later plain ACK of the same QP supersedes: an ACK for PSN n
/// acknowledges every earlier request (IBTA 9.7.5.1.3), and the ACKs of one
/// turn leave together anyway. A responder that drained a ring of trains
/// or a socket of messages in one turn then sends one ACK per QP instead
/// of one per message. Everything else keeps its order.
pub(crate) fn collapse(txs: &mut Vec<Transmit>, from: usize) {
    let acks = txs[from..].iter().filter(|t| is_plain_ack(t)).count();
    if acks < 2 {
        return;
    }
    // Newest first: the first plain ACK met per (destination, QP) stays.
    let mut seen: Vec<(IpAddr, [u8; 3])> = Vec::new();
    let mut keep = vec![true; txs.len() - from];
    for (i, t) in txs[from..].iter().enumerate().rev() {
        if is_plain_ack(t) {
            let key = (t.dst, dest_qpn(t));
            if seen.contains(&key) {
                keep[i] = false;
            } else {
                seen.push(key);
            }
        }
    }
    let mut i = 0;
    txs.retain(|_| {
        let k = i < from || keep[i - from];
        i += 1;
        k
    });
}

impl HeldAcks {
    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Sorts what the engine produced at `now`: with `hold_new`, plain ACKs
    /// are held (the newest per QP; without, they go now and replace any
    /// held one of their QP), and `out` becomes what must be sent now, in
    /// order:
    /// held ACKs first if a response that is not a plain ACK follows,
    /// then the rest, then held ACKs that have waited [`ACK_HOLD_NS`]
    /// (all of them with `flush_all`). With nothing held and `hold_new`
    /// false it leaves `out` as it is, at once (the common case: ACK
    /// coalescing off, where walking `out` cost ~140 instructions per
    /// message).
    pub(crate) fn sort(&mut self, out: &mut Vec<Transmit>, now: Nanos, hold_new: bool, flush_all: bool) {
        if !hold_new && self.held.is_empty() {
            return;
        }
        // In place: this runs for every verb that sends, and a second
        // vector per call was an allocation per message.
        let mut responses = false;
        let mut i = 0;
        while i < out.len() {
            let t = &out[i];
            if is_plain_ack(t) {
                let key = (t.dst, dest_qpn(t));
                let slot = self.held.iter().position(|(d, q, _, _)| (*d, *q) == key);
                if hold_new {
                    let t = out.remove(i);
                    match slot {
                        Some(j) => self.held[j].2 = t,
                        None => self.held.push((key.0, key.1, t, now)),
                    }
                    continue;
                }
                if let Some(j) = slot {
                    self.held.remove(j); // superseded
                }
            } else {
                responses |= is_response(t);
            }
            i += 1;
        }
        if responses {
            out.splice(0..0, self.held.drain(..).map(|h| h.2));
            return;
        }
        if flush_all {
            out.extend(self.held.drain(..).map(|h| h.2));
            return;
        }
        let due = self
            .held
            .iter()
            .take_while(|h| now.saturating_sub(h.3) >= ACK_HOLD_NS)
            .count();
        out.extend(self.held.drain(..due).map(|h| h.2));
    }

    /// Everything held, for a final flush.
    pub(crate) fn take_all(&mut self) -> Vec<Transmit> {
        self.held.drain(..).map(|h| h.2).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(opcode: u8, qpn: u8, syndrome: u8, tag: u8) -> Transmit {
        let mut data = vec![0u8; 20];
        data[0] = opcode;
        data[7] = qpn;
        data[AETH_SYNDROME] = syndrome;
        data[19] = tag;
        Transmit {
            src: "127.0.0.1".parse().unwrap(),
            dst: "127.0.0.2".parse().unwrap(),
            src_port: 1,
            dst_port: 4791,
            data,
            train: None,
        }
    }

    #[test]
    fn acks_are_held_coalesced_and_released_when_due() {
        let mut h = HeldAcks::default();
        let mut out = vec![pkt(0x11, 1, 0x1f, 1), pkt(0x04, 1, 0, 2)];
        h.sort(&mut out, 0, true, false);
        assert_eq!(
            out.iter().map(|t| t.data[19]).collect::<Vec<_>>(),
            [2],
            "the request goes, the ACK waits"
        );
        let mut out = vec![pkt(0x11, 1, 0x1f, 3), pkt(0x11, 2, 0x1f, 4)];
        h.sort(&mut out, 1_000, true, false);
        assert!(out.is_empty());
        assert_eq!(h.held.len(), 2, "one per QP");
        let mut out = Vec::new();
        h.sort(&mut out, ACK_HOLD_NS, true, false);
        assert_eq!(
            out.iter().map(|t| t.data[19]).collect::<Vec<_>>(),
            [3],
            "QP 1's newest ACK is due"
        );
        let mut out = Vec::new();
        h.sort(&mut out, ACK_HOLD_NS + 500, true, true);
        assert_eq!(out.iter().map(|t| t.data[19]).collect::<Vec<_>>(), [4]);
        assert!(h.is_empty());
    }

    #[test]
    fn other_responses_flush_held_acks_first() {
        let mut h = HeldAcks::default();
        let mut out = vec![pkt(0x11, 1, 0x1f, 1)];
        h.sort(&mut out, 0, true, false);
        // A NAK (syndrome 0b011...) and a read response (0x10).
        let mut out = vec![pkt(0x11, 1, 0x60, 2), pkt(0x10, 1, 0, 3)];
        h.sort(&mut out, 10, true, false);
        assert_eq!(out.iter().map(|t| t.data[19]).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(h.is_empty());
    }

    #[test]
    fn with_nothing_held_and_nothing_to_hold_sorting_changes_nothing() {
        // What the engine relies on to skip the call (and the lock).
        let mut h = HeldAcks::default();
        let mut out = vec![
            pkt(0x04, 1, 0, 1),
            pkt(0x11, 1, 0x1f, 2),
            pkt(0x11, 1, 0x60, 3),
            pkt(0x10, 2, 0, 4),
            pkt(0x11, 2, 0x1f, 5),
        ];
        for flush_all in [false, true] {
            h.sort(&mut out, ACK_HOLD_NS * 3, false, flush_all);
            assert_eq!(out.iter().map(|t| t.data[19]).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
            assert!(h.is_empty());
        }
    }

    #[test]
    fn with_nothing_held_a_lone_datagram_that_is_no_plain_ack_stays() {
        // The engine sends a verb's lone datagram without sorting when
        // nothing is held and it is not a plain ACK to hold: a request, a
        // NAK, a read response each stay, and nothing gets held.
        for (opcode, syndrome) in [(0x04, 0), (0x11, 0x60), (0x10, 0)] {
            let mut h = HeldAcks::default();
            let mut out = vec![pkt(opcode, 1, syndrome, 7)];
            h.sort(&mut out, ACK_HOLD_NS * 3, true, false);
            assert_eq!(out.iter().map(|t| t.data[19]).collect::<Vec<_>>(), [7]);
            assert!(h.is_empty());
            assert!(!is_plain_ack(&out[0]));
        }
        // While a plain ACK is one to hold.
        let mut h = HeldAcks::default();
        let mut out = vec![pkt(0x11, 1, 0x1f, 8)];
        assert!(is_plain_ack(&out[0]));
        h.sort(&mut out, 0, true, false);
        assert!(out.is_empty() && !h.is_empty());
    }

    #[test]
    fn acks_not_held_go_now_and_supersede_held_ones() {
        let mut h = HeldAcks::default();
        let mut out = vec![pkt(0x11, 1, 0x1f, 1), pkt(0x11, 2, 0x1f, 2)];
        h.sort(&mut out, 0, true, false);
        let mut out = vec![pkt(0x11, 1, 0x1f, 3)];
        h.sort(&mut out, 10, false, false);
        assert_eq!(out.iter().map(|t| t.data[19]).collect::<Vec<_>>(), [3]);
        assert_eq!(h.held.len(), 1, "QP 2's ACK is still held");
    }

    #[test]
    fn a_turn_sends_only_the_newest_plain_ack_per_qp() {
        // Tags: what each datagram is. 0x11 with syndrome 0 is a plain ACK,
        // 0x11 with 0x60 a NAK, 0x04 a request.
        let mut out = vec![
            pkt(0x04, 9, 0, 0), // produced by an earlier turn: untouched
            pkt(0x11, 9, 0, 0),
            pkt(0x11, 1, 0, 1),
            pkt(0x11, 2, 0, 2),
            pkt(0x04, 1, 0, 3),
            pkt(0x11, 1, 0x60, 4),
            pkt(0x11, 1, 0, 5),
            pkt(0x11, 2, 0, 6),
            pkt(0x11, 3, 0, 7),
        ];
        collapse(&mut out, 2);
        let tags: Vec<_> = out.iter().map(|t| (t.data[7], t.data[19])).collect();
        assert_eq!(tags, [(9, 0), (9, 0), (1, 3), (1, 4), (1, 5), (2, 6), (3, 7)]);
        // A single ACK, or ACKs of different QPs, stay.
        let mut out = vec![pkt(0x11, 1, 0, 1), pkt(0x11, 2, 0, 2)];
        collapse(&mut out, 0);
        assert_eq!(out.len(), 2);
    }
}
