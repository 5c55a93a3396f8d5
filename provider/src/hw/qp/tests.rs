//! Tests that need an RDMA device (mlx5, rxe, siw, …). Without one each
//! prints `SKIP <name>: no RDMA device` and passes.

use std::sync::Arc;
use std::time::Duration;

use super::super::tests::with_context;
use crate::verbs::backend::*;
use crate::verbs::*;

/// A port-1 GID usable for loopback: the first non-zero entry.
fn local_gid(ctx: &Arc<dyn ContextOps>) -> Option<(u8, Gid)> {
    let port = ctx.query_port(1).ok()?;
    (0..port.gid_tbl_len.min(256))
        .filter_map(|i| ctx.query_gid(1, i).ok().map(|g| (i as u8, g)))
        .find(|(_, g)| !g.is_zero())
}

/// Creates an RC QP and connects it to itself.
fn loopback_rc(ctx: &Arc<dyn ContextOps>, pd: &Arc<dyn PdOps>, cq: &Arc<dyn CqOps>) -> Arc<dyn QpOps> {
    let qp = pd
        .create_qp(&QpCreateAttr {
            qp_type: QpType::Rc,
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .expect("create_qp");
    let port = ctx.query_port(1).expect("query_port");
    let (sgid_index, gid) = local_gid(ctx).expect("a GID");
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    };
    qp.modify(
        &a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .expect("RESET->INIT");
    a.qp_state = QpState::Rtr;
    a.path_mtu = port.active_mtu;
    a.dest_qp_num = qp.qp_num();
    a.rq_psn = 0x123;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr = AhAttr {
        dlid: port.lid,
        ..AhAttr::roce(gid, sgid_index, 1)
    };
    a.ah_attr.is_global = port.link_layer == LinkLayer::Ethernet || port.lid == 0;
    qp.modify(
        &a,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .expect("INIT->RTR");
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x123;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    qp.modify(
        &a,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .expect("RTR->RTS");
    assert_eq!(qp.query().expect("query_qp").qp_state, QpState::Rts);
    qp
}

fn poll_one(cq: &Arc<dyn CqOps>) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    for _ in 0..1_000_000 {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

#[test]
fn cq_channel_and_events() {
    with_context("cq_channel_and_events", |ctx| {
        let ch = ctx.create_comp_channel().expect("create_comp_channel");
        assert!(ch.fd().is_some());
        let cq = ctx.create_cq(16, 0xfeed, Some(&ch), 0).expect("create_cq");
        assert!(cq.capacity() >= 16);
        assert_eq!(cq.context(), 0xfeed);
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut wc).expect("poll"), 0);
        cq.req_notify(false).expect("req_notify");
        assert_eq!(ch.get_cq_event(Some(Duration::from_millis(10))).expect("wait"), None);
        assert!(
            cq.resize(64).map(|n| n >= 64).unwrap_or(true),
            "resize grants at least the request"
        );
        cq.ack_events(5); // nothing delivered: ignored, destroy cannot hang
        assert_eq!(ch.destroy().unwrap_err().kind(), ErrorKind::Busy);
        cq.destroy().expect("destroy_cq");
        cq.destroy().expect("idempotent");
        assert_eq!(cq.poll(&mut wc).unwrap_err().kind(), ErrorKind::InvalidArgument);
        ch.destroy().expect("destroy channel");
        assert!(ch.fd().is_none());
    });
}

#[test]
fn rc_loopback_send_imm_inline_and_write() {
    with_context("rc_loopback_send_imm_inline_and_write", |ctx| {
        if local_gid(ctx).is_none() {
            println!("SKIP rc_loopback: port 1 has no GID");
            return;
        }
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(64, 42, Some(&ch), 0).unwrap();
        let qp = loopback_rc(ctx, &pd, &cq);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = Mr::from_ops(
            pd.reg_mr(MemorySource::Owned(MrMemory::new(4096).unwrap()), access)
                .unwrap(),
        );

        // Busy objects: EBUSY passes through.
        assert_eq!(cq.destroy().unwrap_err().kind(), ErrorKind::Busy);

        let rsge = [mr.sge(0, 64).unwrap()];
        qp.post_recv(&[RecvWr::new(1, &rsge)]).expect("post_recv");
        cq.req_notify(false).unwrap();
        let data = *b"hello, hardware!";
        let inline = [Sge::inline(&data)];
        let wr = SendWr::new(2, SendOp::SendWithImm { imm: 0x0102_0304 }, &inline)
            .flags(SendFlags::SIGNALED | SendFlags::INLINE);
        qp.post_send(&[wr]).expect("post_send inline");
        assert_eq!(ch.get_cq_event(Some(Duration::from_secs(5))).unwrap(), Some(42));
        cq.ack_events(1);
        let mut seen = [poll_one(&cq), poll_one(&cq)];
        seen.sort_by_key(|w| w.wr_id);
        assert!(seen.iter().all(WorkCompletion::is_success), "{seen:?}");
        assert_eq!(seen[0].opcode, WcOpcode::Recv);
        assert_eq!(seen[0].imm(), Some(0x0102_0304), "host order both ways");
        assert_eq!(seen[0].byte_len, data.len() as u32);
        assert_eq!(seen[1].opcode, WcOpcode::Send);
        assert_eq!(mr.to_vec(0, data.len()).unwrap(), data);

        // RDMA write from the MR to itself.
        let src = [mr.sge(0, 16).unwrap()];
        let wr = SendWr::new(
            3,
            SendOp::Write {
                remote: mr.remote(1024),
            },
            &src,
        )
        .flags(SendFlags::SIGNALED);
        qp.post_send(&[wr]).unwrap();
        let wc = poll_one(&cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (3, WcStatus::Success, WcOpcode::RdmaWrite)
        );
        assert_eq!(mr.to_vec(1024, 16).unwrap(), data);

        // Checks made before ibverbs: the bad WR index comes back and the
        // WRs before it are posted.
        let ok = SendWr::new(4, SendOp::Send, &src).flags(SendFlags::SIGNALED);
        let no_inline_flag = SendWr::new(5, SendOp::Send, &inline);
        let err = qp.post_send(&[ok, no_inline_flag]).unwrap_err();
        assert_eq!((err.index, err.error.kind()), (1, ErrorKind::InvalidArgument));
        let reg = SendWr::new(
            6,
            SendOp::RegMr {
                mr: &mr,
                key: 0,
                access,
            },
            &[],
        );
        let err = qp.post_send(&[reg]).unwrap_err();
        assert_eq!((err.index, err.error.kind()), (0, ErrorKind::NotSupported));
        assert!(err.error.detail().contains("REG_MR"));
        qp.post_recv(&[RecvWr::new(7, &rsge)]).unwrap();
        let mut ids = [poll_one(&cq).wr_id, poll_one(&cq).wr_id];
        ids.sort_unstable();
        assert_eq!(ids, [4, 7], "the send posted before the rejected WR landed");

        qp.destroy().expect("destroy_qp");
        qp.destroy().expect("idempotent");
        assert_eq!(
            qp.post_send(&[ok]).unwrap_err().error.kind(),
            ErrorKind::InvalidArgument
        );
        drop(mr);
        cq.destroy().expect("CQ free once its QP is gone");
        pd.destroy().expect("PD free");
    });
}

#[test]
fn srq_and_async_events() {
    with_context("srq_and_async_events", |ctx| {
        let pd = ctx.alloc_pd().unwrap();
        let srq = match pd.create_srq(
            SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
            0xabc,
        ) {
            Ok(s) => s,
            Err(e) => {
                println!("SKIP srq_and_async_events: device has no SRQ ({e})");
                return;
            }
        };
        let mr = Mr::from_ops(
            pd.reg_mr(
                MemorySource::Owned(MrMemory::new(4096).unwrap()),
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap(),
        );
        let sge = [mr.sge(0, 64).unwrap()];
        let wrs: Vec<RecvWr<'_>> = (0..8).map(|i| RecvWr::new(i, &sge)).collect();
        srq.post_recv(&wrs).expect("post_srq_recv");
        let attr = srq.query().expect("query_srq");
        assert!(attr.max_wr >= 16);
        // Arm the limit above what is posted: SRQ_LIMIT_REACHED fires as
        // soon as a receive is consumed; here we only check arming works.
        srq.modify(&SrqAttr { srq_limit: 4, ..attr }, SrqAttrMask::LIMIT)
            .expect("modify_srq");
        assert!(ctx.get_async_event(Some(Duration::from_millis(10))).is_ok());
        srq.destroy().expect("destroy_srq");
    });
}
