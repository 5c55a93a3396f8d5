//! Error timing in virtual time (docs/design.md §3.4, §3.7): a peer that is gone
//! gives RETRY_EXC_ERR after `retry_cnt` retransmission timeouts of
//! 4.096 µs·2^timeout; receivers not ready give RNR_RETRY_EXC_ERR after
//! `rnr_retry` waits of the responder's minimum RNR timer; only the
//! requester goes to ERR; the rest of its queue flushes.

use softverbs::soft::wire::rnr_timer_ns;
use softverbs::verbs::{QpState, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};
use softverbs_emulator::sim::{pair, Endpoint, Fabric, LinkConfig, QpOptions, SimError};

const MS: u64 = 1_000_000;

fn ack_timeout(exp: u8) -> u64 {
    4096 << exp
}

/// Posts `n` signaled 1 KiB writes from `a` to `b`.
fn post_writes(f: &mut Fabric, a: &Endpoint, b: &Endpoint, n: u64) {
    for i in 0..n {
        let sgl = [a.sge(0, 1024)];
        let wr = SendWr::new(i, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
        a.post_send(f, &[wr]).unwrap();
    }
}

/// Steps until `ep`'s send CQ has a completion; returns them with the time.
fn wait_send_cqe(f: &mut Fabric, ep: &Endpoint, max_steps: u64) -> (u64, Vec<WorkCompletion>) {
    let (node, cq) = (ep.node, ep.send_cq);
    f.run_while(max_steps, |f| f.core(node).cq_len(cq) == 0).unwrap();
    let t = f.now();
    (t, ep.poll_send(f))
}

#[test]
fn peer_gone_is_retry_exc_err_after_retry_cnt_timeouts() {
    // timeout 14: 4.096 µs · 2^14 ≈ 67.1 ms per try; retry_cnt 3: the
    // original transmission and three retries time out, then the error.
    let o = QpOptions {
        timeout: 14,
        retry_cnt: 3,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(11, LinkConfig::ideal(), &o, 4096).unwrap();
    f.isolate(b.node);
    let t0 = f.now();
    post_writes(&mut f, &a, &b, 3);
    let (t, wcs) = wait_send_cqe(&mut f, &a, 1_000);
    let expect = t0 + 4 * ack_timeout(14);
    assert!(
        (expect..expect + MS).contains(&t),
        "RETRY_EXC_ERR at {t} ns, expected ≈ {expect} ns (4 × 67.1 ms)"
    );
    assert_eq!(wcs[0].wr_id, 0);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    f.run_until_idle(1_000).unwrap();
    let rest: Vec<_> = wcs[1..]
        .iter()
        .chain(a.poll_send(&mut f).iter())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(rest, [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(a.state(&f), QpState::Err, "the requester is in ERR");
    assert_eq!(b.state(&f), QpState::Rts, "the responder is untouched");
    assert_eq!(f.core(a.node).counters().retransmit_timeouts, 4);
}

#[test]
fn retry_cnt_zero_fails_at_the_first_timeout() {
    let o = QpOptions {
        timeout: 10,
        retry_cnt: 0,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(12, LinkConfig::ideal(), &o, 4096).unwrap();
    f.isolate(b.node);
    post_writes(&mut f, &a, &b, 1);
    let (t, wcs) = wait_send_cqe(&mut f, &a, 1_000);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert!((ack_timeout(10)..ack_timeout(10) + MS).contains(&t), "error at {t} ns");
}

#[test]
fn timeout_zero_waits_forever() {
    let o = QpOptions {
        timeout: 0,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(13, LinkConfig::ideal(), &o, 4096).unwrap();
    f.isolate(b.node);
    post_writes(&mut f, &a, &b, 1);
    // No retransmission timer: the fabric goes idle with the WR outstanding.
    f.run_until_idle(1_000).unwrap();
    assert!(a.poll_send(&mut f).is_empty());
    assert_eq!(a.state(&f), QpState::Rts);
    assert_eq!(f.core(a.node).poll_timeout(), None);
}

#[test]
fn peer_qp_destroyed_is_retry_exc_err() {
    let o = QpOptions {
        timeout: 12,
        retry_cnt: 2,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(14, LinkConfig::ideal(), &o, 4096).unwrap();
    let qpn = b.qpn;
    f.with(b.node, |c, _| c.destroy_qp(qpn)).unwrap();
    post_writes(&mut f, &a, &b, 2);
    let (t, wcs) = wait_send_cqe(&mut f, &a, 1_000);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    let expect = 3 * ack_timeout(12);
    assert!(
        (expect..expect + MS).contains(&t),
        "error at {t} ns, expected ≈ {expect}"
    );
    assert!(f.core(b.node).counters().rx_unknown_qp >= 3);
}

#[test]
fn rnr_exhaustion_is_rnr_retry_exc_err() {
    // min_rnr_timer 14 = 1.28 ms; rnr_retry 3: four RNR NAKs, three waits.
    let o = QpOptions {
        rnr_retry: 3,
        min_rnr_timer: 14,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(15, LinkConfig::ideal(), &o, 4096).unwrap();
    let sgl = [a.sge(0, 16)];
    let wrs = [
        SendWr::new(1, SendOp::Send, &sgl).flags(SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Send, &sgl).flags(SendFlags::SIGNALED),
    ];
    let t0 = f.now();
    a.post_send(&mut f, &wrs).unwrap();
    let (t, wcs) = wait_send_cqe(&mut f, &a, 1_000);
    assert_eq!(wcs[0].wr_id, 1);
    assert_eq!(wcs[0].status, WcStatus::RnrRetryExcErr);
    let waits = 3 * rnr_timer_ns(14);
    assert!(
        (t0 + waits..t0 + waits + MS / 10).contains(&t),
        "RNR_RETRY_EXC_ERR at {t} ns, expected ≈ {} ns",
        t0 + waits
    );
    assert_eq!(f.core(b.node).counters().rnr_naks_sent, 4);
    f.run_until_idle(1_000).unwrap();
    let rest: Vec<_> = wcs[1..]
        .iter()
        .chain(a.poll_send(&mut f).iter())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(rest, [(2, WcStatus::WrFlushErr)]);
    assert_eq!(a.state(&f), QpState::Err);
    assert_eq!(b.state(&f), QpState::Rts, "an RNR NAK leaves the responder in RTS");
    assert!(b.poll_recv(&mut f).is_empty());
}

#[test]
fn infinite_rnr_retry_is_a_livelock_until_a_receive_is_posted() {
    // rnr_retry 7 retries forever: the run never goes idle, and the step
    // bound reports it; posting the receive ends it.
    let o = QpOptions {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(16, LinkConfig::ideal(), &o, 4096).unwrap();
    let sgl = [a.sge(0, 16)];
    a.post_send(&mut f, &[SendWr::new(1, SendOp::Send, &sgl).flags(SendFlags::SIGNALED)])
        .unwrap();
    let err = f.run_until_idle(5_000).unwrap_err();
    let SimError::Livelock { steps, .. } = &err;
    assert_eq!(*steps, 5_000);
    assert!(err.to_string().contains("livelock"), "{err}");
    let rsgl = [b.sge(0, 64)];
    b.post_recv(&mut f, &[softverbs::verbs::RecvWr::new(9, &rsgl)]).unwrap();
    f.run_until_idle(1_000).unwrap();
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
    assert_eq!(b.poll_recv(&mut f)[0].byte_len, 16);
}

#[test]
fn a_partition_shorter_than_the_retries_heals() {
    let o = QpOptions {
        timeout: 12,
        retry_cnt: 3,
        ..QpOptions::default()
    };
    let (mut f, a, b) = pair(17, LinkConfig::ideal(), &o, 4096).unwrap();
    let t = ack_timeout(12);
    f.add_partition(softverbs_emulator::sim::Partition {
        side: vec![a.node],
        start: 0,
        end: Some(5 * t / 2),
    });
    post_writes(&mut f, &a, &b, 2);
    f.run_until_idle(10_000).unwrap();
    let st: Vec<_> = a.poll_send(&mut f).iter().map(|w| w.status).collect();
    assert_eq!(st, [WcStatus::Success, WcStatus::Success]);
    assert_eq!(f.core(a.node).counters().retransmit_timeouts, 3);
}
