//! The shadow rings and flush synthesis against a fake provider: the real
//! post path (`post.rs`) and the CQ's poll loop, with the provider's
//! `post_send`/`post_recv`/`poll_cq` entry points replaced by a model of a
//! device's queues (as the post tests replace them with closures).
//!
//! `shadow_fast_path_cost` (ignored; run it with `--release -- --ignored
//! --nocapture`) measures what the shadow adds to post + poll.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use rdma_sys::{ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_wc, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode};

use super::super::ffi::zeroed;
use super::super::post::{self, SendTarget};
use super::*;
use crate::verbs::{ErrorKind, PostError, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, Verb};

const TARGET: SendTarget = SendTarget {
    qp_type: QpType::Rc,
    max_send_sge: 4,
    max_inline_data: 64,
    sig_all: false,
};

/// An opcode the provider leaves in an error completion (undefined).
const GARBAGE_OPCODE: u32 = 0xdead;

/// A device's queues and CQ, as a provider sees them: work requests
/// complete in order per queue; an unsignaled send completes silently; a
/// QP in error reports the failing send and flushes everything else; a dead
/// device completes nothing.
#[derive(Default)]
struct FakeHca {
    /// Per QP: send queue (wr_id, wc opcode, signaled) and receive queue.
    sq: BTreeMap<u32, VecDeque<(u64, u32, bool)>>,
    rq: BTreeMap<u32, VecDeque<u64>>,
    cq: VecDeque<ibv_wc>,
    /// Reject the WR at this position of the next post call (ENOMEM).
    reject_at: Option<usize>,
    dead: bool,
    calls: usize,
}

fn wc(qpn: u32, wr_id: u64, opcode: u32, status: u32) -> ibv_wc {
    let mut w: ibv_wc = zeroed();
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.status = status;
    w.qp_num = qpn;
    w
}

fn wc_opcode_of(wr: u32) -> u32 {
    match wr {
        ibv_wr_opcode::IBV_WR_RDMA_WRITE | ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM => {
            ibv_wc_opcode::IBV_WC_RDMA_WRITE
        }
        ibv_wr_opcode::IBV_WR_RDMA_READ => ibv_wc_opcode::IBV_WC_RDMA_READ,
        _ => ibv_wc_opcode::IBV_WC_SEND,
    }
}

impl FakeHca {
    fn post_send(&mut self, qpn: u32, head: *mut ibv_send_wr, bad: *mut *mut ibv_send_wr) -> i32 {
        self.calls += 1;
        let reject = self.reject_at.take();
        let mut p = head;
        let mut i = 0;
        while !p.is_null() {
            if reject == Some(i) {
                // SAFETY: bad is the provider's out-parameter.
                unsafe { *bad = p };
                return libc::ENOMEM;
            }
            // SAFETY: the chain post.rs built, valid for this call.
            let w = unsafe { &*p };
            let signaled = w.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            self.sq
                .entry(qpn)
                .or_default()
                .push_back((w.wr_id, wc_opcode_of(w.opcode), signaled));
            p = w.next;
            i += 1;
        }
        0
    }

    fn post_recv(&mut self, qpn: u32, head: *mut ibv_recv_wr, bad: *mut *mut ibv_recv_wr) -> i32 {
        self.calls += 1;
        let reject = self.reject_at.take();
        let mut p = head;
        let mut i = 0;
        while !p.is_null() {
            if reject == Some(i) {
                // SAFETY: bad is the provider's out-parameter.
                unsafe { *bad = p };
                return libc::ENOMEM;
            }
            // SAFETY: as above.
            let w = unsafe { &*p };
            self.rq.entry(qpn).or_default().push_back(w.wr_id);
            p = w.next;
            i += 1;
        }
        0
    }

    /// The device executes the `n` oldest sends of QP `qpn` successfully.
    fn complete_sends(&mut self, qpn: u32, n: usize) {
        for _ in 0..n {
            let Some((id, op, signaled)) = self.sq.entry(qpn).or_default().pop_front() else {
                return;
            };
            if signaled {
                self.cq.push_back(wc(qpn, id, op, ibv_wc_status::IBV_WC_SUCCESS));
            }
        }
    }

    /// The `n` oldest receives of QP `qpn` consume incoming sends.
    fn complete_recvs(&mut self, qpn: u32, n: usize) {
        for _ in 0..n {
            let Some(id) = self.rq.entry(qpn).or_default().pop_front() else {
                return;
            };
            self.cq
                .push_back(wc(qpn, id, ibv_wc_opcode::IBV_WC_RECV, ibv_wc_status::IBV_WC_SUCCESS));
        }
    }

    /// QP `qpn` goes to ERR: its oldest send fails (if `failing`), all the
    /// rest is flushed, sends first — with undefined opcodes.
    fn error(&mut self, qpn: u32, failing: bool) {
        let mut first = failing;
        for (id, _, _) in self.sq.entry(qpn).or_default().drain(..) {
            let status = if std::mem::take(&mut first) {
                ibv_wc_status::IBV_WC_RETRY_EXC_ERR
            } else {
                ibv_wc_status::IBV_WC_WR_FLUSH_ERR
            };
            self.cq.push_back(wc(qpn, id, GARBAGE_OPCODE, status));
        }
        for id in self.rq.entry(qpn).or_default().drain(..) {
            self.cq
                .push_back(wc(qpn, id, GARBAGE_OPCODE, ibv_wc_status::IBV_WC_WR_FLUSH_ERR));
        }
    }

    fn poll(&mut self, buf: &mut [MaybeUninit<ibv_wc>]) -> i32 {
        if self.dead {
            return 0;
        }
        let mut n = 0;
        while n < buf.len() {
            let Some(w) = self.cq.pop_front() else { break };
            buf[n].write(w);
            n += 1;
        }
        n as i32
    }
}

fn sges() -> [Sge<'static>; 1] {
    // SAFETY: never dereferenced: the fake provider only reads numbers.
    [unsafe { Sge::from_raw(0x1000, 64, 7) }]
}

/// A QP on the fake device: its shadow, attached to `cq`.
fn qp(qpn: u32, seq: u64, cq: &CqShadow, send_cap: u32, recv_cap: u32) -> Arc<QpShadow> {
    let s = QpShadow::new(qpn, seq, send_cap, Some(recv_cap));
    cq.attach(&s, true, false);
    cq.attach(&s, false, true);
    s
}

/// Posts sends through the real post path; `reach`: the device is called.
fn post_sends(q: &QpShadow, hca: &RefCell<FakeHca>, wrs: &[SendWr<'_>], reach: bool) -> Result<(), PostError> {
    let mut p = q.send().producer();
    post::post_send(&TARGET, Some(&mut p), wrs, |h, b| {
        if reach {
            hca.borrow_mut().post_send(q.qpn(), h, b)
        } else {
            0
        }
    })
}

fn post_recvs(q: &QpShadow, hca: &RefCell<FakeHca>, wrs: &[RecvWr<'_>], reach: bool) -> Result<(), PostError> {
    let mut p = q.recv().unwrap().producer();
    post::post_recv(wrs, 4, Verb::PostRecv, "fake", Some(&mut p), |h, b| {
        if reach {
            hca.borrow_mut().post_recv(q.qpn(), h, b)
        } else {
            0
        }
    })
}

/// Sends with ids `ids`, signaled where `signaled(id)`.
fn sends<'a>(
    ids: impl IntoIterator<Item = u64>,
    sgl: &'a [Sge<'a>],
    signaled: impl Fn(u64) -> bool,
) -> Vec<SendWr<'a>> {
    ids.into_iter()
        .map(|i| {
            let w = SendWr::new(i, SendOp::Send, sgl);
            if signaled(i) {
                w.flags(SendFlags::SIGNALED)
            } else {
                w
            }
        })
        .collect()
}

fn recvs<'a>(ids: impl IntoIterator<Item = u64>, sgl: &'a [Sge<'a>]) -> Vec<RecvWr<'a>> {
    ids.into_iter().map(|i| RecvWr::new(i, sgl)).collect()
}

/// Polls until empty, `batch` at a time.
fn drain(cq: &CqShadow, hca: &RefCell<FakeHca>, mode: PollMode, batch: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = vec![WorkCompletion::default(); batch];
    loop {
        let n = cq.poll(&mut wc, mode, |buf| hca.borrow_mut().poll(buf)).unwrap();
        out.extend_from_slice(&wc[..n]);
        if n == 0 {
            return out;
        }
    }
}

const DEAD: PollMode = PollMode {
    reach_device: true,
    revoked: true,
    flush: true,
};
const REVOKED_GRACE: PollMode = PollMode {
    reach_device: true,
    revoked: true,
    flush: false,
};
const INERT: PollMode = PollMode {
    reach_device: false,
    revoked: true,
    flush: true,
};

fn ids_status(v: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    v.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn opcodes_round_trip_through_a_slot() {
    for op in WcOpcode::ALL {
        assert_eq!(op_of(op_code(*op)), *op);
        assert_eq!(op_code(*op) & !OP, 0);
    }
}

#[test]
fn ring_retires_signaled_sends_and_skips_void_entries() {
    let q = QueueShadow::new(5);
    assert_eq!(q.ring().capacity(), 8);
    let mut p = q.producer();
    assert_eq!(p.room(), 8);
    for (id, sig) in [(1, false), (2, true), (3, false), (4, true), (5, true)] {
        p.push(id, WcOpcode::Send, sig);
    }
    p.publish();
    // The provider took the first three only.
    p.settle(3);
    assert_eq!(p.room(), 3);
    drop(p);
    let r = q.ring();
    // A success completes the first *signaled* entry with its id.
    assert!(!r.retire(1, true), "1 is unsignaled: no completion of its own");
    assert!(r.retire(2, true));
    assert_eq!(r.outstanding(), 3, "1 and 2 retired");
    // Void entries never match nor flush.
    assert!(!r.retire(4, false));
    let mut out = [WorkCompletion::default(); 8];
    assert_eq!(r.flush_into(9, &mut out), 1);
    assert_eq!(
        (out[0].wr_id, out[0].status, out[0].qp_num),
        (3, WcStatus::WrFlushErr, 9)
    );
    assert_eq!(r.outstanding(), 0);
    // Wrapping around many times.
    for round in 0..100u64 {
        let mut p = q.producer();
        for k in 0..8 {
            p.push(round * 8 + k, WcOpcode::RdmaWrite, k == 7);
        }
        assert_eq!(p.room(), 0);
        p.publish();
        p.settle(8);
        drop(p);
        assert!(r.retire(round * 8 + 7, true));
        assert_eq!(r.outstanding(), 0);
    }
}

#[test]
fn live_completions_retire_their_work_requests() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(10, 0, &cq, 16, 16);
    let sgl = sges();
    post_sends(&q, &hca, &sends(0..10, &sgl, |i| i % 4 == 3), true).unwrap();
    post_recvs(&q, &hca, &recvs(100..105, &sgl), true).unwrap();
    assert_eq!(q.send().ring().outstanding(), 10);
    hca.borrow_mut().complete_sends(10, 8);
    hca.borrow_mut().complete_recvs(10, 3);
    let got = drain(&cq, &hca, PollMode::LIVE, 4);
    assert_eq!(
        ids_status(&got),
        [
            (3, WcStatus::Success),
            (7, WcStatus::Success),
            (100, WcStatus::Success),
            (101, WcStatus::Success),
            (102, WcStatus::Success)
        ]
    );
    assert_eq!(got[2].opcode, WcOpcode::Recv);
    assert_eq!(q.send().ring().outstanding(), 2, "8 and 9 are still on the device");
    assert_eq!(q.recv().unwrap().ring().outstanding(), 2);
    assert_eq!(cq.pending_flushes(), 4);
}

/// A dead device: the real completions come first, then every work request
/// left as WR_FLUSH_ERR, send queue before receive queue, in post order —
/// each exactly once.
#[test]
fn a_dead_device_flushes_what_is_left_in_post_order() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(11, 0, &cq, 32, 32);
    let sgl = sges();
    post_sends(&q, &hca, &sends(0..12, &sgl, |i| i % 2 == 1), true).unwrap();
    post_recvs(&q, &hca, &recvs(100..106, &sgl), true).unwrap();
    hca.borrow_mut().complete_sends(11, 6); // 1, 3, 5 complete
    hca.borrow_mut().complete_recvs(11, 2); // 100, 101
                                            // The device dies with those completions still in its CQ; the poll
                                            // drains them, then flushes.
    assert_eq!(hca.borrow().cq.len(), 5);
    let got = drain(&cq, &hca, DEAD, 3);
    let mut expect: Vec<(u64, WcStatus)> = vec![
        (1, WcStatus::Success),
        (3, WcStatus::Success),
        (5, WcStatus::Success),
        (100, WcStatus::Success),
        (101, WcStatus::Success),
    ];
    expect.extend((6..12).map(|i| (i, WcStatus::WrFlushErr)));
    expect.extend((102..106).map(|i| (i, WcStatus::WrFlushErr)));
    assert_eq!(ids_status(&got), expect);
    assert!(got[5..11].iter().all(|w| w.opcode == WcOpcode::Send && w.qp_num == 11));
    assert!(got[11..].iter().all(|w| w.opcode == WcOpcode::Recv));
    assert!(drain(&cq, &hca, DEAD, 8).is_empty(), "exactly once");
}

/// A device still present after the revoke flushes its queues itself: the
/// shadow adds nothing, and a hardware flush arriving after the shadow's
/// (past the grace period) is dropped.
#[test]
fn hardware_flushes_count_and_late_ones_are_dropped() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(12, 0, &cq, 16, 16);
    let sgl = sges();
    post_sends(&q, &hca, &sends(0..4, &sgl, |_| true), true).unwrap();
    post_recvs(&q, &hca, &recvs(100..103, &sgl), true).unwrap();
    // The QP went to ERR in time: hardware flushes everything.
    hca.borrow_mut().error(12, false);
    let got = drain(&cq, &hca, REVOKED_GRACE, 16);
    assert_eq!(got.len(), 7);
    assert!(got.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert!(drain(&cq, &hca, DEAD, 16).is_empty(), "nothing left to synthesize");

    // Now the other way round: the shadow flushes first, the hardware later.
    post_sends(&q, &hca, &sends(20..23, &sgl, |_| true), true).unwrap();
    post_recvs(&q, &hca, &recvs(200..202, &sgl), true).unwrap();
    let got = drain(&cq, &hca, DEAD, 16);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [20, 21, 22, 200, 201]);
    hca.borrow_mut().error(12, false);
    assert!(
        drain(&cq, &hca, DEAD, 16).is_empty(),
        "late hardware flushes are dropped"
    );
}

/// An error completion on a CQ shared by both queues (its opcode is
/// undefined) retires the right queue's work request; the QP's remaining
/// work then flushes in order.
#[test]
fn error_completions_find_their_queue() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(13, 0, &cq, 16, 16);
    let sgl = sges();
    // The same wr_ids on both queues, as applications often do.
    post_sends(&q, &hca, &sends(0..3, &sgl, |_| false), true).unwrap();
    post_recvs(&q, &hca, &recvs(0..3, &sgl), true).unwrap();
    hca.borrow_mut().error(13, true);
    // Before the revoke: the failing send, then flushes of the rest.
    let got = drain(&cq, &hca, PollMode::LIVE, 16);
    assert_eq!(got.len(), 6);
    assert_eq!(got[0].status, WcStatus::RetryExcErr);
    assert_eq!(q.send().ring().outstanding(), 0);
    assert_eq!(q.recv().unwrap().ring().outstanding(), 0);
    assert!(drain(&cq, &hca, DEAD, 16).is_empty());
}

/// Work requests the provider refused are reported by the post's error
/// and never flushed; posts after the revoke (not reaching the device) are.
#[test]
fn refused_posts_never_flush_and_revoked_posts_do() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(14, 0, &cq, 64, 64);
    let sgl = sges();
    hca.borrow_mut().reject_at = Some(2);
    let e = post_sends(&q, &hca, &sends(0..5, &sgl, |_| true), true).unwrap_err();
    assert_eq!((e.index, e.error.kind()), (2, ErrorKind::NoMemory));
    hca.borrow_mut().reject_at = Some(0);
    let e = post_recvs(&q, &hca, &recvs(50..52, &sgl), true).unwrap_err();
    assert_eq!(e.index, 0);
    // After the revoke: posting succeeds and completes with a flush.
    post_sends(&q, &hca, &sends(5..7, &sgl, |_| false), false).unwrap();
    post_recvs(&q, &hca, &recvs(60..61, &sgl), false).unwrap();
    let got = drain(&cq, &hca, DEAD, 16);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 5, 6, 60]);
    assert!(got.iter().all(|w| w.status == WcStatus::WrFlushErr));
}

#[test]
fn a_full_queue_refuses_with_enomem() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(15, 0, &cq, 4, 2);
    let sgl = sges();
    let e = post_sends(&q, &hca, &sends(0..6, &sgl, |_| true), true).unwrap_err();
    assert_eq!((e.index, e.error.kind()), (4, ErrorKind::NoMemory));
    assert!(e.error.detail().contains("send queue is full"), "{}", e.error.detail());
    assert_eq!(hca.borrow().sq[&15].len(), 4, "the four that fit were posted");
    let e = post_recvs(&q, &hca, &recvs(0..3, &sgl), true).unwrap_err();
    assert_eq!(e.index, 2);
    // Completing frees room again.
    hca.borrow_mut().complete_sends(15, 2);
    assert_eq!(drain(&cq, &hca, PollMode::LIVE, 8).len(), 2);
    post_sends(&q, &hca, &sends(6..8, &sgl, |_| true), true).unwrap();
}

/// Flushes spread over polls with small buffers, QP by QP in creation
/// order; an inert CQ never calls the provider.
#[test]
fn flushes_follow_qp_creation_order_across_small_polls() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    // Created in the order b (seq 0), a (seq 1); QP numbers the other way.
    let b = qp(30, 0, &cq, 8, 8);
    let a = qp(20, 1, &cq, 8, 8);
    let sgl = sges();
    post_recvs(&a, &hca, &recvs(10..12, &sgl), true).unwrap();
    post_sends(&a, &hca, &sends(1..3, &sgl, |_| true), true).unwrap();
    post_sends(&b, &hca, &sends(5..8, &sgl, |_| false), true).unwrap();
    post_recvs(&b, &hca, &recvs(50..51, &sgl), true).unwrap();
    hca.borrow_mut().cq.push_back(wc(20, 999, 0, 0)); // never polled: inert
    let got = drain(&cq, &hca, INERT, 2);
    let order: Vec<(u32, u64)> = got.iter().map(|w| (w.qp_num, w.wr_id)).collect();
    assert_eq!(
        order,
        [
            (30, 5),
            (30, 6),
            (30, 7),
            (30, 50),
            (20, 1),
            (20, 2),
            (20, 10),
            (20, 11)
        ]
    );
    assert_eq!(hca.borrow().cq.len(), 1, "an inert CQ does not reach the device");
    // A destroyed QP's work is gone with it.
    post_sends(&a, &hca, &sends(3..4, &sgl, |_| true), false).unwrap();
    cq.detach(20);
    assert!(drain(&cq, &hca, INERT, 2).is_empty());
}

#[test]
fn reset_forgets_and_srq_receives_pass_through() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(40, 0, &cq, 8, 8);
    let sgl = sges();
    post_sends(&q, &hca, &sends(0..3, &sgl, |_| true), true).unwrap();
    q.send().reset(&cq);
    assert_eq!(q.send().ring().outstanding(), 0);
    // A QP on an SRQ: its receive completions are not shadowed and always
    // delivered, even after the revoke.
    let srq_qp = QpShadow::new(41, 1, 8, None);
    cq.attach(&srq_qp, true, true);
    hca.borrow_mut()
        .cq
        .push_back(wc(41, 77, ibv_wc_opcode::IBV_WC_RECV, ibv_wc_status::IBV_WC_SUCCESS));
    hca.borrow_mut()
        .cq
        .push_back(wc(41, 78, GARBAGE_OPCODE, ibv_wc_status::IBV_WC_LOC_LEN_ERR));
    // And a QP unknown to the shadow (created outside this backend).
    hca.borrow_mut()
        .cq
        .push_back(wc(99, 5, ibv_wc_opcode::IBV_WC_SEND, ibv_wc_status::IBV_WC_SUCCESS));
    let got = drain(&cq, &hca, DEAD, 8);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [77, 78, 5]);
}

/// The documented limit: an unsignaled send that completed after the last
/// signaled completion polled cannot be told from one still queued.
#[test]
fn unsignaled_work_after_the_last_signaled_completion_is_flushed() {
    let hca = RefCell::new(FakeHca::default());
    let cq = CqShadow::new();
    let q = qp(50, 0, &cq, 8, 8);
    let sgl = sges();
    post_sends(&q, &hca, &sends(0..3, &sgl, |i| i == 0), true).unwrap();
    hca.borrow_mut().complete_sends(50, 3);
    let got = drain(&cq, &hca, DEAD, 8);
    assert_eq!(
        ids_status(&got),
        [
            (0, WcStatus::Success),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
}

/// Posters and a poller on other threads, a device that completes
/// everything, then dies: every signaled work request is reported exactly
/// once, and the rings end empty.
#[test]
fn concurrent_posters_and_poller_report_each_request_once() {
    const THREADS: u64 = 3;
    const PER: u64 = 3000;
    let hca = Arc::new(Mutex::new(FakeHca::default()));
    let cq = Arc::new(CqShadow::new());
    let q = qp(60, 0, &cq, 64, 64);
    let sgl = sges();
    let seen = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (hca, q) = (hca.clone(), q.clone());
            s.spawn(move || {
                let mut next = 0;
                while next < PER {
                    let id = t * PER + next;
                    let wr = [SendWr::new(id, SendOp::Send, &sgl).flags(SendFlags::SIGNALED)];
                    let mut p = q.send().producer();
                    let r = post::post_send(&TARGET, Some(&mut p), &wr, |h, b| {
                        let mut d = hca.lock().unwrap();
                        let rc = d.post_send(60, h, b);
                        // The device completes it at once, sometimes.
                        if !id.is_multiple_of(3) {
                            d.complete_sends(60, 1);
                        }
                        rc
                    });
                    drop(p);
                    match r {
                        Ok(()) => next += 1,
                        Err(e) => {
                            assert_eq!(e.error.kind(), ErrorKind::NoMemory);
                            hca.lock().unwrap().complete_sends(60, 8);
                            std::thread::yield_now();
                        }
                    }
                }
            });
        }
        let (hca, cq, seen) = (hca.clone(), cq.clone(), seen.clone());
        s.spawn(move || {
            let mut wc = [WorkCompletion::default(); 7];
            while seen.lock().unwrap().len() < (THREADS * PER) as usize {
                let n = cq
                    .poll(&mut wc, PollMode::LIVE, |buf| hca.lock().unwrap().poll(buf))
                    .unwrap();
                seen.lock().unwrap().extend(wc[..n].iter().map(|w| w.wr_id));
                if n == 0 {
                    hca.lock().unwrap().complete_sends(60, 5);
                }
            }
        });
    });
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..THREADS * PER).collect::<Vec<_>>());
    assert_eq!(q.send().ring().outstanding(), 0);
    let hca = RefCell::new(std::mem::take(&mut *hca.lock().unwrap()));
    assert!(drain(&cq, &hca, DEAD, 8).is_empty());
}

/// What the shadow adds to the fast path: post one signaled send and poll
/// its completion, through a fake provider that completes it at once; with
/// the shadow (post lock, ring, CQ lock, retirement) and without (the path
/// before it). Run: `cargo test -p softverbs --features hardware --release
/// -- --ignored --nocapture shadow_fast_path_cost`.
#[test]
#[ignore = "benchmark: run explicitly in release mode"]
fn shadow_fast_path_cost() {
    use std::hint::black_box;
    use std::time::Instant;

    /// The fake device: one QP, completes each send immediately, no heap.
    struct Dev {
        cq: [u64; 64],
        head: usize,
        tail: usize,
    }
    impl Dev {
        fn post(&mut self, head: *mut ibv_send_wr) -> i32 {
            let mut p = head;
            while !p.is_null() {
                // SAFETY: the chain post.rs built.
                let w = unsafe { &*p };
                self.cq[self.tail % 64] = w.wr_id;
                self.tail += 1;
                p = w.next;
            }
            0
        }
        fn poll(&mut self, buf: &mut [MaybeUninit<ibv_wc>]) -> i32 {
            let mut n = 0;
            while n < buf.len() && self.head < self.tail {
                buf[n].write(wc(7, self.cq[self.head % 64], ibv_wc_opcode::IBV_WC_SEND, 0));
                self.head += 1;
                n += 1;
            }
            n as i32
        }
    }
    /// The poll loop as it was before the shadow.
    fn poll_plain(wc: &mut [WorkCompletion], mut real: impl FnMut(&mut [MaybeUninit<ibv_wc>]) -> i32) -> usize {
        let mut buf: [MaybeUninit<ibv_wc>; POLL_CHUNK] = [const { MaybeUninit::uninit() }; POLL_CHUNK];
        let mut done = 0;
        while done < wc.len() {
            let want = (wc.len() - done).min(POLL_CHUNK);
            let n = real(&mut buf[..want]);
            let n = (n.max(0) as usize).min(want);
            for (dst, src) in wc[done..done + n].iter_mut().zip(&buf[..n]) {
                // SAFETY: the fake initialised the first n entries.
                *dst = convert::wc_from_raw(unsafe { src.assume_init_ref() });
            }
            done += n;
            if n < want {
                break;
            }
        }
        done
    }

    let dev = RefCell::new(Dev {
        cq: [0; 64],
        head: 0,
        tail: 0,
    });
    let cq = CqShadow::new();
    let q = QpShadow::new(7, 0, 128, Some(128));
    cq.attach(&q, true, true);
    let sgl = sges();
    // SHADOW_BENCH_ITERS shortens the run (e.g. under valgrind, which counts
    // instructions where the machine is too noisy to time).
    let n_total: u64 = std::env::var("SHADOW_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rounds = if n_total < 1_000_000 { 1 } else { 7 };
    let only = std::env::var("SHADOW_BENCH_ONLY").unwrap_or_default();
    let mut results = Vec::new();
    let batches: Vec<usize> = match std::env::var("SHADOW_BENCH_BATCH").ok().and_then(|v| v.parse().ok()) {
        Some(b) => vec![b],
        None => vec![1, 16],
    };
    for batch in batches {
        let wrs: Vec<SendWr<'_>> = (0..batch as u64)
            .map(|i| SendWr::new(i, SendOp::Send, &sgl).flags(SendFlags::SIGNALED))
            .collect();
        let mut wc = vec![WorkCompletion::default(); batch];
        let iters = n_total / batch as u64;
        let per_wr = (iters * batch as u64) as f64;
        // Alternate the two loops and keep the best of several rounds of
        // each: the machine's noise only ever adds time.
        let (mut plain, mut shadow) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..iters {
                if only == "shadow" {
                    break;
                }
                post::post_send(&TARGET, None, black_box(&wrs), |h, _| dev.borrow_mut().post(h)).unwrap();
                let n = poll_plain(&mut wc, |b| dev.borrow_mut().poll(b));
                assert_eq!(n, batch);
            }
            plain = plain.min(t.elapsed().as_nanos() as f64 / per_wr);
            let t = Instant::now();
            for _ in 0..iters {
                if only == "plain" {
                    break;
                }
                let mut p = q.send().producer();
                post::post_send(&TARGET, Some(&mut p), black_box(&wrs), |h, _| dev.borrow_mut().post(h)).unwrap();
                drop(p);
                let n = cq.poll(&mut wc, PollMode::LIVE, |b| dev.borrow_mut().poll(b)).unwrap();
                assert_eq!(n, batch);
            }
            shadow = shadow.min(t.elapsed().as_nanos() as f64 / per_wr);
        }
        results.push((batch, plain, shadow));
    }
    for (batch, plain, shadow) in results {
        println!(
            "batch {batch:2}: post+poll per WR {plain:6.1} ns without the shadow, {shadow:6.1} ns with it: +{:.1} ns/WR",
            shadow - plain
        );
    }
    assert_eq!(q.send().ring().outstanding(), 0);
}
