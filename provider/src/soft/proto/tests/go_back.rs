//! The requester's window under go-back-N (`qp::GoBack`): it counts
//! packets, within a message too, and after a rewind it counts the copies
//! sent before, which are still on the link, until an ACK for the resend
//! proves them gone or a timeout declares them lost. Without that, every
//! NAK could put another window's worth of packets behind the copies on the
//! link (congestion collapse: sim_regressions,
//! go_back_n_does_not_flood_the_link_with_copies).

use super::*;

/// A window of this many packets, small enough to script.
const WINDOW: u32 = 16;

/// An RC node with MTU 256 and a window of [`WINDOW`] packets, with one
/// signaled 40-packet SEND posted.
fn sending_40_packets() -> Node {
    let mut n = node(QpType::Rc, Mtu::Mtu256);
    n.core.cfg.max_inflight_packets = WINDOW;
    n.post_send(0, 1, SendOp::Send, 0, 40 * 256);
    n
}

/// What the requester sent: (PSN offset from SQ_PSN, AckReq) per packet.
fn sent_psns(n: &mut Node) -> Vec<(u32, bool)> {
    n.sent()
        .iter()
        .map(|(h, _)| (h.bth.psn.value() - SQ_PSN, h.bth.ack_req))
        .collect()
}

/// Packets `from..to` (PSN offsets), the last asking for an ACK.
fn run(from: u32, to: u32) -> Vec<(u32, bool)> {
    (from..to).map(|k| (k, k + 1 == to)).collect()
}

fn nak(n: &mut Node, now: Nanos, psn_offset: u32) {
    let h = ack(n.qpn, SQ_PSN + psn_offset, Syndrome::Nak(NakCode::PsnSequenceError));
    n.inject(now, &h, &[]);
}

fn ack_to(n: &mut Node, now: Nanos, psn_offset: u32) {
    n.inject(now, &ack(n.qpn, SQ_PSN + psn_offset, Syndrome::ACK), &[]);
}

#[test]
fn the_window_counts_packets_within_a_message_and_its_last_packet_asks() {
    let mut n = sending_40_packets();
    // One message, but only a window of it: the packet that fills the
    // window asks for the ACK that opens it again.
    assert_eq!(sent_psns(&mut n), run(0, WINDOW));
    ack_to(&mut n, 1, 9);
    assert_eq!(sent_psns(&mut n), run(WINDOW, WINDOW + 10));
}

#[test]
fn a_nak_resends_only_what_the_window_holds_beside_the_copies_on_the_link() {
    let mut n = sending_40_packets();
    assert_eq!(sent_psns(&mut n).len(), WINDOW as usize);
    // Packet 4 was lost: the NAK acknowledges 0..4. The copies of 5..16
    // are still on the link (the responder drops them), so the window has
    // room for 4 packets: 4..8, and the last asks.
    nak(&mut n, 1, 4);
    assert_eq!(sent_psns(&mut n), run(4, 8), "a go-back-N within the window");
    // A copy of the NAK changes nothing.
    nak(&mut n, 2, 4);
    assert!(n.sent().is_empty());
    // The ACK of the resent packets arrived after the old copies: they are
    // gone, the whole window is free.
    ack_to(&mut n, 3, 7);
    assert_eq!(sent_psns(&mut n), run(8, 8 + WINDOW));
    ack_to(&mut n, 4, 8 + WINDOW - 1);
    let rest = sent_psns(&mut n);
    assert_eq!(rest.first().map(|p| p.0), Some(8 + WINDOW));
    assert_eq!(rest.last(), Some(&(39, true)), "the message's last packet asks");
    ack_to(&mut n, 5, 39);
    let wc = n.cqes();
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );
}

#[test]
fn the_copies_of_one_packet_messages_count_after_a_nak_too() {
    let mut n = node(QpType::Rc, Mtu::Mtu256);
    n.core.cfg.max_inflight_packets = WINDOW;
    for i in 0..24 {
        n.post_send(0, i, SendOp::Send, 0, 200);
    }
    let psns = |n: &mut Node| -> Vec<u32> { sent_psns(n).iter().map(|p| p.0).collect() };
    assert_eq!(psns(&mut n), (0..WINDOW).collect::<Vec<_>>());
    // The NAK for 4 acknowledges 0..4; the copies of 4..16 are on the link.
    nak(&mut n, 1, 4);
    assert_eq!(psns(&mut n), [4, 5, 6, 7]);
    ack_to(&mut n, 2, 7);
    assert_eq!(psns(&mut n), (8..24).collect::<Vec<_>>());
    ack_to(&mut n, 3, 23);
    assert_eq!(n.cqes().len(), 24, "every send completes once");
}

#[test]
fn with_a_full_window_a_nak_resends_the_missing_packet_alone() {
    let mut n = sending_40_packets();
    assert_eq!(sent_psns(&mut n).len(), WINDOW as usize);
    // The first packet was lost: the NAK acknowledges nothing and the
    // window is full of copies, but the packet the responder waits for
    // goes, and asks.
    nak(&mut n, 1, 0);
    assert_eq!(sent_psns(&mut n), run(0, 1));
    ack_to(&mut n, 2, 0);
    assert_eq!(sent_psns(&mut n), run(1, 1 + WINDOW));
}

#[test]
fn a_timeout_declares_the_copies_lost() {
    let mut n = sending_40_packets();
    assert_eq!(sent_psns(&mut n).len(), WINDOW as usize);
    nak(&mut n, 1, 4);
    assert_eq!(sent_psns(&mut n), run(4, 8));
    // The resent packets are lost too; nothing answers until the timer.
    // (An armed wake-up may come early, find nothing due and re-arm.)
    let mut resent = Vec::new();
    for _ in 0..3 {
        let t = n.core.poll_timeout().expect("the retransmission timer is armed");
        n.core.handle_timeout(t);
        resent = sent_psns(&mut n);
        if !resent.is_empty() {
            break;
        }
    }
    assert_eq!(resent, run(4, 4 + WINDOW), "a whole window");
}

#[test]
fn an_rnr_nak_counts_the_copies_behind_the_refused_packet() {
    let mut n = sending_40_packets();
    assert_eq!(sent_psns(&mut n).len(), WINDOW as usize);
    // The responder refused the message (RNR NAK at its first packet) and
    // drops the rest; after the RNR wait the first packet goes, alone: the
    // copies of the others may still be on their way.
    n.inject(1, &ack(n.qpn, SQ_PSN, Syndrome::RnrNak { timer: 1 }), &[]);
    assert!(n.sent().is_empty(), "nothing before the RNR timer");
    let t = n.core.poll_timeout().expect("the RNR timer is armed");
    n.core.handle_timeout(t);
    assert_eq!(sent_psns(&mut n), run(0, 1));
    ack_to(&mut n, t + 1, 0);
    assert_eq!(sent_psns(&mut n), run(1, 1 + WINDOW));
}
