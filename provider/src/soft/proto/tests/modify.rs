//! The soft provider's use of the QP state table (`Core::modify_qp`): the
//! limits it gives the table (the device's own GID table), and what each
//! transition does to the QP beside its attributes: RESET drops the queues
//! and the transport state, ERR flushes, RTS starts waiting sends, SQD
//! drains and says so when asked. Each test was written against a mutant
//! of `modify_qp` or `modify_limits` the rest of the suite let through
//! (docs/testing.md, "Mutation testing").

use crate::verbs::{ErrorKind, EventType};

use super::*;

fn async_events(n: &mut Node) -> Vec<EventType> {
    let mut out = Vec::new();
    while let Some(e) = n.core.poll_event() {
        if let CoreEvent::Async { event, .. } = e {
            out.push(event.event_type);
        }
    }
    out
}

fn modify(n: &mut Node, attr: &QpAttr, mask: QpAttrMask) -> crate::verbs::Result<()> {
    n.core.modify_qp(0, n.qpn, attr, mask)
}

/// Moves `n`'s QP RTS -> RESET -> INIT and returns the RTR attributes
/// and mask of `node`, with the source GID index `sgid`.
fn reset_to_init(n: &mut Node, sgid: u8) -> (QpAttr, QpAttrMask) {
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    modify(n, &reset, QpAttrMask::STATE).unwrap();
    let q = n.core.query_qp(n.qpn).unwrap();
    assert_eq!(
        (q.qp_state, q.cap.max_send_wr),
        (QpState::Reset, 32),
        "RESET keeps the capacities"
    );
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    modify(n, &init, mask).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: REMOTE_QPN,
        rq_psn: RQ_PSN,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr::roce(Gid::from_ip(REMOTE), sgid, 1),
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    (rtr, mask)
}

#[test]
fn the_state_table_sees_the_device_s_populated_gid_slots() {
    let second = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 9, 0, 11)));
    let fourth = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 9, 0, 13)));
    let gids = vec![Gid::from_ip(LOCAL), second, Gid::ZERO, fourth];
    for (sgid, ok) in [(1u8, true), (2, false), (3, true), (0, true)] {
        let mut n = node_cfg(QpType::Rc, Mtu::Mtu1024, |c| c.gids = gids.clone());
        let (rtr, mask) = reset_to_init(&mut n, sgid);
        match modify(&mut n, &rtr, mask) {
            Ok(()) => assert!(ok, "sgid {sgid}: an empty slot was taken"),
            Err(e) => {
                assert!(!ok, "sgid {sgid}: {e}");
                assert_eq!(e.kind(), ErrorKind::Other(libc::ENODATA), "sgid {sgid}: {e}");
            }
        }
    }
}

#[test]
fn the_path_mtu_is_the_one_asked_for_on_connected_qps_and_the_port_s_on_ud() {
    let n = node(QpType::Rc, Mtu::Mtu1024);
    assert_eq!(n.core.query_qp(n.qpn).unwrap().path_mtu, Mtu::Mtu1024);
    let n = node(QpType::Ud, Mtu::Mtu1024);
    let active = SoftDevice::default_port_attr().active_mtu;
    assert_eq!(n.core.query_qp(n.qpn).unwrap().path_mtu, active);
}

#[test]
fn reset_drops_the_queues_and_the_transport_state_without_completions() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(1, 0, 64);
    n.post_send(0, 2, SendOp::Send, 0, 8);
    n.sent();
    let (rtr, mask) = reset_to_init(&mut n, 0);
    let q = n.core.query_qp(n.qpn).unwrap();
    assert_eq!((q.sq_psn, q.rq_psn), (0, 0), "the PSNs start over");
    assert_eq!(q.cap.max_send_wr, 32, "the capacities stay");
    assert!(n.cqes().is_empty(), "RESET completes nothing");
    // The receive posted before the reset is gone: a send after the
    // reconnection finds no receive (RNR NAK).
    modify(&mut n, &rtr, mask).unwrap();
    n.inject(0, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN), b"x");
    assert!(matches!(aeth_of(&n.sent()[0].0), Syndrome::RnrNak { .. }));
}

#[test]
fn err_flushes_once_and_rts_starts_what_waited_in_sqd() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    // SQD without notification: no event; a send posted now waits.
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        ..QpAttr::default()
    };
    modify(&mut n, &sqd, QpAttrMask::STATE).unwrap();
    assert!(!async_events(&mut n).contains(&EventType::SqDrained));
    n.post_send(0, 1, SendOp::Send, 0, 8);
    assert!(n.sent().is_empty(), "nothing starts in SQD");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    modify(&mut n, &rts, QpAttrMask::STATE).unwrap();
    assert_eq!(n.sent().len(), 1, "RTS starts the waiting send at once");
    // ERR flushes what is outstanding, once.
    let remote = RemoteAddr {
        addr: 0x1000,
        rkey: 0x55,
    };
    n.post_send(0, 2, SendOp::Write { remote }, 0, 8);
    n.post_recv(7, 0, 64);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    modify(&mut n, &err, QpAttrMask::STATE).unwrap();
    let wc = n.cqes();
    let got: Vec<(u64, WcStatus, WcOpcode, u32)> = wc.iter().map(|w| (w.wr_id, w.status, w.opcode, w.qp_num)).collect();
    let flush = WcStatus::WrFlushErr;
    assert_eq!(
        got,
        [
            (1, flush, WcOpcode::Send, n.qpn),
            (2, flush, WcOpcode::RdmaWrite, n.qpn),
            (7, flush, WcOpcode::Recv, n.qpn)
        ]
    );
    modify(&mut n, &err, QpAttrMask::STATE).unwrap();
    assert!(n.cqes().is_empty(), "flushed once");
}

#[test]
fn sqd_with_notification_says_drained_when_nothing_is_in_flight() {
    let notify = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY;
    // Nothing in flight: drained at once.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    async_events(&mut n);
    modify(&mut n, &notify, mask).unwrap();
    assert_eq!(async_events(&mut n), [EventType::SqDrained]);
    assert!(!n.core.query_qp(n.qpn).unwrap().sq_draining);
    // The bit set but the value false: no notification.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    async_events(&mut n);
    let quiet = QpAttr {
        en_sqd_async_notify: false,
        ..notify
    };
    modify(&mut n, &quiet, mask).unwrap();
    assert!(async_events(&mut n).is_empty());
    // A send in flight: draining until its ACK.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_send(0, 1, SendOp::Send, 0, 8);
    assert_eq!(n.sent().len(), 1);
    async_events(&mut n);
    modify(&mut n, &notify, mask).unwrap();
    assert!(async_events(&mut n).is_empty(), "not drained while a send is in flight");
    assert!(n.core.query_qp(n.qpn).unwrap().sq_draining);
    n.inject(1, &ack(n.qpn, SQ_PSN, Syndrome::ACK), &[]);
    assert_eq!(async_events(&mut n), [EventType::SqDrained], "drained by the ACK");
    assert!(!n.core.query_qp(n.qpn).unwrap().sq_draining);
}

#[test]
fn a_new_qp_reports_its_capacities_and_ud_its_port_mtu_before_any_modify() {
    for qp_type in [QpType::Rc, QpType::Ud] {
        let mut n = node(qp_type, Mtu::Mtu1024);
        let pd = {
            let qp = n.core.take_qp(n.qpn).unwrap();
            let pd = qp.pd;
            n.core.put_qp(qp);
            pd
        };
        let want = QpCap {
            max_send_wr: 8,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let (qpn, granted) = n
            .core
            .create_qp(&QpCreate {
                qp_type,
                pd,
                send_cq: n.cq,
                recv_cq: n.cq,
                srq: None,
                cap: want,
                sq_sig_all: false,
                owner: 1,
            })
            .unwrap();
        let q = n.core.query_qp(qpn).unwrap();
        assert_eq!((q.qp_state, q.cap), (QpState::Reset, granted), "{qp_type}");
        if qp_type == QpType::Ud {
            assert_eq!(q.path_mtu, SoftDevice::default_port_attr().active_mtu);
        }
        // RESET -> RTR is illegal, and that is what the error says: the
        // QP is bound to no port yet, so no port check speaks first.
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr::roce(Gid::from_ip(REMOTE), 0, 1),
            ..QpAttr::default()
        };
        let e = n
            .core
            .modify_qp(0, qpn, &rtr, QpAttrMask::STATE | QpAttrMask::AV)
            .unwrap_err();
        assert!(e.detail().contains("illegal transition"), "{qp_type}: {e}");
    }
}

#[test]
fn a_send_error_completion_carries_opcode_qp_and_vendor_error() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let remote = RemoteAddr {
        addr: 0x1000,
        rkey: 0x55,
    };
    n.post_send(0, 5, SendOp::Write { remote }, 0, 8);
    assert_eq!(n.sent().len(), 1);
    n.inject(1, &ack(n.qpn, SQ_PSN, Syndrome::Nak(NakCode::RemoteAccessError)), &[]);
    let w = n.cqes()[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.qp_num, w.vendor_err),
        (
            5,
            WcStatus::RemAccessErr,
            WcOpcode::RdmaWrite,
            n.qpn,
            super::super::requester::vendor::NAK
        )
    );
}

#[test]
fn err_to_err_flushes_nothing_more_and_says_last_wqe_reached_once() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let pd = {
        let qp = n.core.take_qp(n.qpn).unwrap();
        let pd = qp.pd;
        n.core.put_qp(qp);
        pd
    };
    let srq_attr = crate::verbs::SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let (srq, _) = n.core.create_srq(pd, srq_attr, 0, 1).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let (qpn, _) = n
        .core
        .create_qp(&QpCreate {
            qp_type: QpType::Rc,
            pd,
            send_cq: n.cq,
            recv_cq: n.cq,
            srq: Some(srq),
            cap,
            sq_sig_all: false,
            owner: 1,
        })
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    n.core.modify_qp(0, qpn, &init, mask).unwrap();
    async_events(&mut n);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    n.core.modify_qp(0, qpn, &err, QpAttrMask::STATE).unwrap();
    assert_eq!(async_events(&mut n), [EventType::QpLastWqeReached]);
    n.core.modify_qp(0, qpn, &err, QpAttrMask::STATE).unwrap();
    assert!(
        async_events(&mut n).is_empty(),
        "ERR -> ERR: no second LAST_WQE_REACHED"
    );
}
