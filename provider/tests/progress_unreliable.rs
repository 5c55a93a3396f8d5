//! UC sends with a progress thread that is awake (spinning) when the
//! application posts: the send completes when its packet is built, so by
//! the time the application can poll that completion the datagram must
//! have left the process. Before, a verb only flagged its datagrams for
//! the spinning thread's next turn; an application that exited right after
//! its last completion (`ibv_uc_pingpong`/`ibv_ud_pingpong` with the
//! provider's progress thread) took the datagram with it and its peer
//! waited forever.

mod udp_common;

use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::soft::SoftDevice;
use softverbs::verbs::*;
use udp_common::*;

/// A UC QP on `s`'s PD and CQs, in RESET.
fn uc_qp(s: &Side) -> Qp {
    s.pd.create_qp(&QpInitAttr {
        qp_type: QpType::Uc,
        send_cq: &s.scq,
        recv_cq: &s.rcq,
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .unwrap()
}

/// Moves UC QP `qp` of `s` to RTS towards QP `dest` of `peer` (PSNs 0).
fn connect_uc(s: &Side, qp: &Qp, peer: &Side, dest: &Qp) {
    let local = Endpoint::local(&s.ctx, qp, 1, 0).unwrap().with_psn(0);
    let remote = Endpoint::local(&peer.ctx, dest, 1, 0).unwrap().with_psn(0);
    Connect::new()
        .mtu(Mtu::Mtu1024)
        .apply(&s.ctx, qp, &local, Some(&remote))
        .unwrap();
}

fn tx_datagrams(d: &SoftDevice) -> u64 {
    let stats = d.shared().link_stats();
    stats
        .iter()
        .find(|(k, _)| *k == "udp_tx_datagrams")
        .map(|(_, v)| *v)
        .expect("udp_tx_datagrams")
}

#[test]
fn a_uc_send_has_left_when_its_completion_is_polled_with_a_spinning_progress_thread() {
    // A spins for far longer than the test: it is awake at every post.
    let spinning = EngineMode::ProgressThread {
        spin: Duration::from_secs(3600),
    };
    let (da, db) = (device(LO4, spinning), device(LO4, EngineMode::Inline));
    let (a, b) = (side(&da, 4096, 0), side(&db, 4096, 0));
    let (qa, qb) = (uc_qp(&a), uc_qp(&b));
    connect_uc(&a, &qa, &b, &qb);
    connect_uc(&b, &qb, &a, &qa);
    let rounds = 300u64;
    for i in 0..rounds {
        let rsge = [b.mr.sge(0, 64).unwrap()];
        qb.post_recv(&[RecvWr::new(i, &rsge)]).unwrap();
        let before = tx_datagrams(&da);
        let sge = [a.mr.sge(0, 8).unwrap()];
        qa.post_send(&[SendWr::new(i, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
            .unwrap();
        let wc = wait_one(&a.scq, &[]);
        // Read at once: the progress thread must not be what sends it.
        let after = tx_datagrams(&da);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        assert!(
            after > before,
            "round {i}: the send completed but its datagram had not left (tx {before} -> {after})"
        );
        let r = wait_one(&b.rcq, &[]);
        assert_eq!((r.wr_id, r.status, r.byte_len), (i, WcStatus::Success, 8));
    }
}
