//! Send Queue Error (IBTA 10.3.1): a send that completes in error takes a
//! UC or UD QP to SQE, not ERR. The failing WR completes with its error,
//! the rest of the send queue flushes, the receive queue keeps working,
//! sends posted in SQE flush, and SQE→RTS resumes sending where the PSNs
//! left off. An RC QP goes to ERR and flushes both queues.

use super::*;

/// A send WR whose SGE names a key no MR has: a local protection error.
fn bad_sge(n: &Node) -> Sge<'static> {
    Sge::checked(n.mem.addr(), 16, n.lkey ^ 0x0100_0000)
}

fn statuses(wc: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wc.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn state(n: &Node) -> QpState {
    n.core.query_qp(n.qpn).unwrap().qp_state
}

#[test]
fn a_uc_send_error_enters_sqe_flushes_the_send_queue_and_keeps_receiving() {
    for fast_paths in [true, false] {
        let mut n = node_with(QpType::Uc, Mtu::Mtu1024, fast_paths);
        n.post_recv(100, 0, 1024);
        n.post_send(0, 1, SendOp::Send, 4096, 8);
        assert_eq!(n.sent().len(), 1);
        let (good, bad) = ([n.sge(4096, 8)], [bad_sge(&n)]);
        let wrs = [
            SendWr::new(2, SendOp::Send, &bad).flags(SendFlags::SIGNALED),
            SendWr::new(3, SendOp::Send, &good).flags(SendFlags::SIGNALED),
            // Unsignaled: a flush completes it all the same.
            SendWr::new(4, SendOp::Send, &good),
        ];
        n.post_wrs(0, &wrs).unwrap();
        let wc = n.cqes();
        assert!(
            wc.iter().all(|w| w.qp_num == n.qpn && w.opcode == WcOpcode::Send),
            "error and flush completions carry the QP number and the opcode: {wc:?}"
        );
        assert_eq!(
            statuses(&wc),
            vec![
                (1, WcStatus::Success),
                (2, WcStatus::LocProtErr),
                (3, WcStatus::WrFlushErr),
                (4, WcStatus::WrFlushErr),
            ],
            "fast paths {fast_paths}"
        );
        assert_eq!(state(&n), QpState::Sqe);
        assert!(n.sent().is_empty(), "nothing after the failed WR left");
        // A send posted in SQE is accepted and flushed, not sent.
        n.post_send(0, 5, SendOp::Send, 4096, 8);
        assert_eq!(statuses(&n.cqes()), vec![(5, WcStatus::WrFlushErr)]);
        assert!(n.sent().is_empty());
        // The receive queue keeps working: the posted receive was not
        // flushed and takes a message.
        n.inject(1, &req(Opcode::UcSendOnly, n.qpn, RQ_PSN), b"still here");
        let wc = n.cqes();
        assert_eq!(
            (wc.len(), wc[0].wr_id, wc[0].status, wc[0].byte_len),
            (1, 100, WcStatus::Success, 10)
        );
        n.post_recv(101, 1024, 1024);
        assert!(n.cqes().is_empty(), "a receive posted in SQE is not flushed");
        // SQE→RTS: sending resumes with the next PSN.
        let rts = QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Sqe,
            ..QpAttr::default()
        };
        n.core
            .modify_qp(2, n.qpn, &rts, QpAttrMask::STATE | QpAttrMask::CUR_STATE)
            .unwrap();
        assert_eq!(state(&n), QpState::Rts);
        n.post_send(3, 6, SendOp::Send, 4096, 8);
        let sent = n.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0.bth.psn.value(), SQ_PSN + 1);
        assert_eq!(statuses(&n.cqes()), vec![(6, WcStatus::Success)]);
        n.inject(4, &req(Opcode::UcSendOnly, n.qpn, RQ_PSN + 1), b"after");
        assert_eq!(statuses(&n.cqes()), vec![(101, WcStatus::Success)]);
    }
}

#[test]
fn a_failed_local_operation_on_uc_enters_sqe() {
    let mut n = node(QpType::Uc, Mtu::Mtu1024);
    n.post_recv(100, 0, 1024);
    // LOCAL_INV of a key that names nothing fails as a memory operation.
    let wr = SendWr::new(1, SendOp::LocalInv { key: 0x00ab_cd00 }, &[]).flags(SendFlags::SIGNALED);
    n.post_wrs(0, &[wr]).unwrap();
    let wc = n.cqes();
    assert_eq!(wc.len(), 1);
    assert_ne!(wc[0].status, WcStatus::Success);
    assert_ne!(wc[0].status, WcStatus::WrFlushErr);
    assert_eq!(state(&n), QpState::Sqe);
    // Only SQE→RTS (or RESET/ERR) leaves SQE.
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    assert!(n.core.modify_qp(1, n.qpn, &rtr, QpAttrMask::STATE).is_err());
    assert_eq!(state(&n), QpState::Sqe);
    // ERR from SQE flushes the receive queue too.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    n.core.modify_qp(1, n.qpn, &err, QpAttrMask::STATE).unwrap();
    assert_eq!(statuses(&n.cqes()), vec![(100, WcStatus::WrFlushErr)]);
}

#[test]
fn an_rc_send_error_goes_to_err_and_flushes_the_receive_queue() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(100, 0, 1024);
    let bad = [bad_sge(&n)];
    n.post_wrs(0, &[SendWr::new(1, SendOp::Send, &bad).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(
        statuses(&n.cqes()),
        vec![(1, WcStatus::LocProtErr), (100, WcStatus::WrFlushErr)]
    );
    assert_eq!(state(&n), QpState::Err);
}

#[test]
fn a_type1_bind_posted_in_sqe_or_err_is_accepted_and_flushed() {
    let mut n = node(QpType::Uc, Mtu::Mtu1024);
    let bad = [bad_sge(&n)];
    n.post_wrs(0, &[SendWr::new(1, SendOp::Send, &bad).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(statuses(&n.cqes()), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(state(&n), QpState::Sqe);
    let pd = n.core.alloc_pd(1).unwrap();
    let mw = n.core.alloc_mw(pd, crate::verbs::MwType::Type1).unwrap();
    let addr = n.mem.addr();
    let key = n
        .core
        .bind_mw_type1(1, n.qpn, mw, n.lkey, addr, 64, AccessFlags::REMOTE_READ, 9, true)
        .unwrap();
    assert_ne!(key, mw, "the bind returns the window's next key");
    let wc = n.cqes();
    assert_eq!(statuses(&wc), vec![(9, WcStatus::WrFlushErr)]);
    assert_eq!(wc[0].opcode, WcOpcode::BindMw);
    assert_eq!(state(&n), QpState::Sqe);
    assert!(n.sent().is_empty());
    // In ERR the same: accepted and flushed.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    n.core.modify_qp(2, n.qpn, &err, QpAttrMask::STATE).unwrap();
    n.core
        .bind_mw_type1(3, n.qpn, mw, n.lkey, addr, 64, AccessFlags::REMOTE_READ, 10, true)
        .unwrap();
    assert_eq!(statuses(&n.cqes()), vec![(10, WcStatus::WrFlushErr)]);
}
