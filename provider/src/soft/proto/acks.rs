//! ACK coalescing: which acknowledgements leave, and when.
//!
//! Two rules, both allowed by IBTA (an ACK for PSN n acknowledges every
//! earlier request, 9.7.5.1.3):
//!
//! - **In the output**, a plain ACK that a later plain ACK of the same QP
//!   supersedes never leaves: the responder takes it out when it queues
//!   the newer one ([`Core::drop_superseded_ack`], through
//!   [`take_superseded`]), and keeps its buffer for the next packet. The
//!   rule is applied once, at that one place, whether or not a drain of
//!   the output has begun, so the output never holds two plain ACKs of a
//!   QP: a responder that handled a ring of trains or a socket of
//!   messages before its output was drained sends one ACK per QP instead
//!   of one per message. Always on.
//! - **Across drains**, with [`Core::set_ack_coalescing`] on, the plain
//!   ACKs of an output in which [`Core::poll_cq`] handed completions to
//!   the application (which is then likely to answer) are held back, the
//!   newest per QP, for up to [`ACK_HOLD_NS`].
//!
//! On a network link each ACK is a datagram, and on loopback a datagram
//! costs about as much kernel time as the message itself: in a
//! send/receive ping-pong, ACKs in both directions nearly double the
//! one-way latency. A held ACK leaves with the first drain of the output
//! ([`Core::poll_transmit`]) after its hold: [`Core::poll_timeout`]
//! includes that bound and [`Core::handle_timeout`] releases it, to leave
//! after whatever the same turn produced. A busy-polling driver thus sends
//! it with the first verb past the bound, as before, and a driver that
//! only wakes for deadlines (the simulated fabric) sends it at the bound.
//! ACKs produced while the application gets no completion (the target of
//! RDMA WRITEs) are not held. Everything else (requests, NAKs, read and
//! atomic responses) leaves at once; a response that is not a plain ACK
//! takes the held ACKs out ahead of it, so that responses of a QP never
//! overtake each other; and a plain ACK that is not held replaces any held
//! one of its QP. [`Core::flush_acks`] lets every held ACK go with the
//! next drain.
//!
//! Why not send a held ACK with the next request the device sends (a
//! ping-pong's reply)? Tried: it takes the ACK's system call away (1.25 ->
//! 1.0 `sendmmsg` per message), but puts the ACK on the critical path, in
//! the kernel with the reply and in the peer's engine before the reply's
//! completion: the UDP ping-pong's median got 0.1-0.3 µs worse. A held ACK
//! that waits for [`ACK_HOLD_NS`] mostly leaves from a poll that found
//! nothing, while the application waits anyway.
//!
//! Off by default: a requester sees its send completions up to
//! [`ACK_HOLD_NS`] (plus the gap to the responder's next drain) later, and
//! a driver that stops draining strands what is held (the real-time
//! engine turns it on only for inline devices on a network link, when the
//! application asks).

use std::collections::VecDeque;
use std::net::IpAddr;

use super::{Core, Nanos, Transmit};
use crate::soft::wire::Opcode;

/// How long an ACK may be held. Far below any retransmission timeout in
/// use (IBTA timeout 1 is 8 µs, the usual 14 is 67 ms), and longer than a
/// loopback round trip, so a ping-pong sends one ACK per several messages.
pub const ACK_HOLD_NS: Nanos = 50_000;

const OPCODE_RC_ACK: u8 = 0x11;
/// Offset of the AETH syndrome in an RC Acknowledge (right after the BTH).
const AETH_SYNDROME: usize = 12;

/// A held ACK: the newest plain ACK to (destination, QPN), and when the
/// first of those it replaced was held.
#[derive(Debug)]
struct Held {
    dst: IpAddr,
    qpn: [u8; 3],
    ack: Transmit,
    since: Nanos,
}

/// The coalescing state of a [`Core`].
#[derive(Debug, Default)]
pub(crate) struct Acks {
    /// Whether outputs in which completions were handed out hold their
    /// plain ACKs ([`Core::set_ack_coalescing`]).
    on: bool,
    /// Held ACKs, oldest first.
    held: Vec<Held>,
    /// How many of `held` (a prefix: the oldest) were released, by
    /// [`Core::handle_timeout`] or [`Core::flush_acks`]: they leave with
    /// the next drain.
    due: usize,
    /// The output now waiting holds its plain ACKs ([`Core::poll_cq`]
    /// handed completions out since the last drain).
    hold_turn: bool,
    /// The output now waiting was sorted; cleared when it is drained.
    sorted: bool,
    /// When the last datagram was handled: the time of a plain ACK held
    /// from the output waiting.
    now: Nanos,
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

/// The destination QP number in a packet's BTH, as on the wire.
pub(crate) fn dest_qpn(t: &Transmit) -> [u8; 3] {
    [t.data[5], t.data[6], t.data[7]]
}

/// Takes out of `txs` (the output waiting, whose last datagram was just
/// queued) the plain ACK that the last one supersedes: the newest earlier
/// plain ACK to the same destination and QP. Everything else keeps its
/// order. As every plain ACK passes here when queued, `txs` holds at most
/// one per QP, so one is the most there is to take.
pub(crate) fn take_superseded(txs: &mut VecDeque<Transmit>) -> Option<Transmit> {
    let n = txs.len().checked_sub(1).filter(|&n| n > 0)?;
    let last = txs.back().filter(|t| is_plain_ack(t))?;
    let key = (last.dst, dest_qpn(last));
    let i = txs
        .iter()
        .take(n)
        .rposition(|t| is_plain_ack(t) && (t.dst, dest_qpn(t)) == key)?;
    txs.remove(i)
}

impl Acks {
    /// Whether the output needs sorting before it leaves: something is
    /// held, or this output holds its ACKs.
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.hold_turn || self.sorted || !self.held.is_empty()
    }

    /// Records when the datagram being handled arrived.
    #[inline]
    pub(crate) fn note_time(&mut self, now: Nanos) {
        self.now = now;
    }

    /// Drops everything held (a revoked device transmits nothing more).
    pub(crate) fn clear(&mut self) {
        *self = Acks {
            on: self.on,
            ..Acks::default()
        };
    }

    /// Whether ACKs are held (released or not).
    #[inline]
    pub(crate) fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether released ACKs wait for the next drain.
    #[inline]
    pub(crate) fn due(&self) -> bool {
        self.due > 0
    }

    /// Whether the output waiting (`tx`, undrained) makes the driver's
    /// shortcut for a lone datagram wrong: ACKs are held, or the lone
    /// datagram is a plain ACK to hold.
    #[inline]
    pub(crate) fn needs_sorting(&self, tx: &VecDeque<Transmit>) -> bool {
        !self.held.is_empty() || (self.hold_turn && tx.front().is_some_and(is_plain_ack))
    }

    /// The deadline of the oldest ACK held and not yet released.
    #[inline]
    pub(crate) fn deadline(&self) -> Option<Nanos> {
        self.held.get(self.due).map(|h| h.since.saturating_add(ACK_HOLD_NS))
    }

    /// Releases the ACKs held for [`ACK_HOLD_NS`] by `now`.
    pub(crate) fn release(&mut self, now: Nanos) {
        self.due += self.held[self.due..]
            .iter()
            .take_while(|h| now.saturating_sub(h.since) >= ACK_HOLD_NS)
            .count();
    }

    /// Sorts one drain's output `out`: plain ACKs are held if this output
    /// holds its ACKs (else they replace any held one of their QP); then
    /// held ACKs go first if a response that is not a plain ACK follows,
    /// else the released ones go last. Returns how many ACKs it held.
    fn sort(&mut self, out: &mut VecDeque<Transmit>) -> u64 {
        let hold_new = std::mem::take(&mut self.hold_turn);
        if !hold_new && self.held.is_empty() {
            return 0;
        }
        let mut held = 0;
        let mut responses = false;
        let mut i = 0;
        while i < out.len() {
            let t = &out[i];
            if is_plain_ack(t) {
                let (dst, qpn) = (t.dst, dest_qpn(t));
                let slot = self.held.iter().position(|h| (h.dst, h.qpn) == (dst, qpn));
                if hold_new {
                    let ack = out.remove(i).expect("in bounds");
                    held += 1;
                    match slot {
                        Some(j) => self.held[j].ack = ack,
                        None => self.held.push(Held {
                            dst,
                            qpn,
                            ack,
                            since: self.now,
                        }),
                    }
                    continue;
                }
                if let Some(j) = slot {
                    self.held.remove(j); // superseded
                    if j < self.due {
                        self.due -= 1;
                    }
                }
            } else {
                responses |= is_response(t);
            }
            i += 1;
        }
        if responses {
            for h in self.held.drain(..).rev() {
                out.push_front(h.ack);
            }
            self.due = 0;
            return held;
        }
        out.extend(self.held.drain(..self.due).map(|h| h.ack));
        self.due = 0;
        held
    }
}

impl Core {
    /// Turns holding ACKs back on or off (see the [module docs](self));
    /// off, whatever is held is released to the next drain.
    pub fn set_ack_coalescing(&mut self, on: bool) {
        self.acks.on = on;
        if !on {
            self.flush_acks();
        }
    }

    /// Releases every held ACK: they leave with the next drain of the
    /// output. For a driver about to stop draining (a QP destroyed, a
    /// device dropped), so that its peer's last sends still complete.
    pub fn flush_acks(&mut self) {
        self.acks.due = self.acks.held.len();
    }

    /// Whether ACKs are held back (the send fast path, which would
    /// overtake them, then stays off).
    #[inline]
    pub fn holds_acks(&self) -> bool {
        self.acks.holding()
    }

    /// [`Core::poll_cq`] handed completions out: with coalescing on, the
    /// output now waiting holds its plain ACKs.
    #[inline]
    pub(crate) fn completions_handed_out(&mut self) {
        if self.acks.on {
            self.acks.hold_turn = true;
        }
    }

    /// Takes out of the output waiting the plain ACK that the one just
    /// queued (the last datagram, if a plain ACK) supersedes
    /// ([`take_superseded`]), and keeps its buffer for the next packet: a
    /// responder handling a ring of trains that ask for ACKs then neither
    /// allocates nor frees one per ACK request, and no drain has to look
    /// for superseded ACKs. Also once a drain has begun: what is left of
    /// the output is still waiting, and the newer ACK leaves after it.
    #[inline]
    pub(crate) fn drop_superseded_ack(&mut self) {
        if let Some(t) = take_superseded(&mut self.tx) {
            self.recycle_buffer(t.data);
        }
    }

    /// [`Core::poll_transmit`] when ACKs are held or to hold: the output
    /// is sorted once per drain.
    #[inline(never)]
    pub(crate) fn poll_transmit_sorted(&mut self) -> Option<Transmit> {
        if !self.acks.sorted {
            self.counters.tx_acks_held += self.acks.sort(&mut self.tx);
            self.acks.sorted = true;
        }
        let t = self.tx.pop_front();
        if self.tx.is_empty() {
            self.acks.sorted = false;
        }
        t
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

    /// One turn as a [`Core`] runs it at `now`: due ACKs released (as
    /// `handle_timeout` does when the deadline passed), `flush` as
    /// [`Core::flush_acks`], `hold` as a poll that handed completions
    /// out, then the drain's sort. Returns the tags of what leaves.
    fn turn(a: &mut Acks, out: Vec<Transmit>, now: Nanos, hold: bool, flush: bool) -> Vec<u8> {
        a.now = now;
        if a.deadline().is_some_and(|d| d <= now) {
            a.release(now);
        }
        if flush {
            a.due = a.held.len();
        }
        a.hold_turn = hold;
        let mut out = VecDeque::from(out);
        let _ = a.sort(&mut out);
        out.iter().map(|t| t.data[19]).collect()
    }

    #[test]
    fn acks_are_held_coalesced_and_released_when_due() {
        let mut h = Acks::default();
        let out = turn(&mut h, vec![pkt(0x11, 1, 0x1f, 1), pkt(0x04, 1, 0, 2)], 0, true, false);
        assert_eq!(out, [2], "the request goes, the ACK waits");
        assert_eq!(h.deadline(), Some(ACK_HOLD_NS));
        let out = turn(
            &mut h,
            vec![pkt(0x11, 1, 0x1f, 3), pkt(0x11, 2, 0x1f, 4)],
            1_000,
            true,
            false,
        );
        assert!(out.is_empty());
        assert_eq!(h.held.len(), 2, "one per QP");
        assert_eq!(h.deadline(), Some(ACK_HOLD_NS), "the first hold sets the bound");
        let out = turn(&mut h, Vec::new(), ACK_HOLD_NS, true, false);
        assert_eq!(out, [3], "QP 1's newest ACK is due");
        assert_eq!(h.deadline(), Some(1_000 + ACK_HOLD_NS));
        let out = turn(&mut h, Vec::new(), ACK_HOLD_NS + 500, true, true);
        assert_eq!(out, [4]);
        assert!(!h.holding() && h.deadline().is_none());
    }

    #[test]
    fn released_acks_leave_after_the_output_of_their_turn() {
        let mut h = Acks::default();
        turn(&mut h, vec![pkt(0x11, 1, 0x1f, 1)], 0, true, false);
        let out = turn(&mut h, vec![pkt(0x04, 2, 0, 2)], ACK_HOLD_NS, false, false);
        assert_eq!(out, [2, 1]);
        assert!(!h.holding());
    }

    #[test]
    fn other_responses_flush_held_acks_first() {
        let mut h = Acks::default();
        turn(&mut h, vec![pkt(0x11, 1, 0x1f, 1)], 0, true, false);
        // A NAK (syndrome 0b011...) and a read response (0x10).
        let out = turn(&mut h, vec![pkt(0x11, 1, 0x60, 2), pkt(0x10, 1, 0, 3)], 10, true, false);
        assert_eq!(out, [1, 2, 3]);
        assert!(!h.holding());
    }

    #[test]
    fn with_nothing_held_and_nothing_to_hold_sorting_changes_nothing() {
        let mut h = Acks::default();
        let all = || {
            vec![
                pkt(0x04, 1, 0, 1),
                pkt(0x11, 1, 0x1f, 2),
                pkt(0x11, 1, 0x60, 3),
                pkt(0x10, 2, 0, 4),
                pkt(0x11, 2, 0x1f, 5),
            ]
        };
        for flush in [false, true] {
            assert_eq!(turn(&mut h, all(), ACK_HOLD_NS * 3, false, flush), [1, 2, 3, 4, 5]);
            assert!(!h.holding());
        }
    }

    #[test]
    fn with_nothing_held_a_lone_datagram_that_is_no_plain_ack_stays() {
        // A request, a NAK, a read response each stay, and nothing gets
        // held: the driver may send such a lone datagram without sorting.
        for (opcode, syndrome) in [(0x04, 0), (0x11, 0x60), (0x10, 0)] {
            let mut h = Acks::default();
            assert_eq!(
                turn(&mut h, vec![pkt(opcode, 1, syndrome, 7)], ACK_HOLD_NS * 3, true, false),
                [7]
            );
            assert!(!h.holding());
            h.hold_turn = true;
            assert!(!h.needs_sorting(&VecDeque::from(vec![pkt(opcode, 1, syndrome, 7)])));
        }
        // While a plain ACK is one to hold.
        let mut h = Acks {
            hold_turn: true,
            ..Acks::default()
        };
        assert!(h.needs_sorting(&VecDeque::from(vec![pkt(0x11, 1, 0x1f, 8)])));
        assert!(turn(&mut h, vec![pkt(0x11, 1, 0x1f, 8)], 0, true, false).is_empty());
        assert!(h.holding());
    }

    #[test]
    fn acks_not_held_go_now_and_supersede_held_ones() {
        let mut h = Acks::default();
        turn(
            &mut h,
            vec![pkt(0x11, 1, 0x1f, 1), pkt(0x11, 2, 0x1f, 2)],
            0,
            true,
            false,
        );
        assert_eq!(turn(&mut h, vec![pkt(0x11, 1, 0x1f, 3)], 10, false, false), [3]);
        assert_eq!(h.held.len(), 1, "QP 2's ACK is still held");
        // A released ACK superseded before its drain: the count follows.
        h.release(ACK_HOLD_NS);
        assert_eq!(h.due, 1);
        assert_eq!(
            turn(&mut h, vec![pkt(0x11, 2, 0x1f, 4)], ACK_HOLD_NS, false, false),
            [4]
        );
        assert_eq!((h.held.len(), h.due), (0, 0));
    }

    #[test]
    fn a_queued_plain_ack_takes_out_the_one_it_supersedes() {
        // Tags: what each datagram is. 0x11 with syndrome 0 is a plain ACK,
        // 0x11 with 0x60 a NAK, 0x04 a request. Queued one by one, as the
        // responder queues them.
        let mut out = VecDeque::new();
        let mut taken = Vec::new();
        for t in [
            pkt(0x04, 9, 0, 0),
            pkt(0x11, 1, 0, 1),
            pkt(0x11, 2, 0, 2),
            pkt(0x04, 1, 0, 3),
            pkt(0x11, 1, 0x60, 4),
            pkt(0x11, 1, 0, 5),
            pkt(0x11, 2, 0, 6),
            pkt(0x11, 3, 0, 7),
            pkt(0x11, 1, 0, 8),
        ] {
            out.push_back(t);
            taken.extend(take_superseded(&mut out).map(|t| t.data[19]));
        }
        let tags: Vec<_> = out.iter().map(|t| (t.data[7], t.data[19])).collect();
        assert_eq!(tags, [(9, 0), (1, 3), (1, 4), (2, 6), (3, 7), (1, 8)]);
        assert_eq!(taken, [1, 2, 5]);
        // A single ACK, or ACKs of different QPs, or of one QP to two
        // destinations, stay.
        let mut out = VecDeque::from(vec![pkt(0x11, 1, 0, 1), pkt(0x11, 2, 0, 2)]);
        assert!(take_superseded(&mut out).is_none());
        let mut other = pkt(0x11, 1, 0, 3);
        other.dst = "127.0.0.3".parse().unwrap();
        out.push_back(other);
        assert!(take_superseded(&mut out).is_none());
        assert_eq!(out.len(), 3);
        // A NAK last takes nothing out.
        out.push_back(pkt(0x11, 1, 0x60, 4));
        assert!(take_superseded(&mut out).is_none());
    }
}
