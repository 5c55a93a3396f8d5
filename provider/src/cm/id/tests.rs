//! Unit tests of the CM id: its API and its destruction on a soft device.

use std::sync::Arc;
use std::time::Duration;

use super::super::{Cm, CmConfig, CmEventKind, ConnParam, Error, EventChannel, PortSpace};
use crate::soft::{link::inproc::InprocFabric, SoftDeviceConfig};
use crate::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use crate::verbs::{
    AccessFlags, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion,
};

/// An application that drives its own QP (connect with `qp_num`) moves
/// it with `init_qp_attr` alone, and data then crosses: the attributes
/// are the ones the CM's own QPs get.
#[test]
fn init_qp_attr_moves_an_application_qp() {
    let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
    let fabric = InprocFabric::new();
    for (name, ip) in [("qpattr_a", "10.78.0.1"), ("qpattr_b", "10.78.0.2")] {
        let cfg = SoftDeviceConfig {
            link: Some(fabric.clone()),
            ..SoftDeviceConfig::new(name, ip.parse().unwrap())
        };
        sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
    }
    let cm = Cm::new(sub, CmConfig::default()).unwrap();
    let t = Some(Duration::from_secs(20));
    let sch = EventChannel::new().unwrap();
    let l = cm.create_id(&sch, PortSpace::Tcp, 0).unwrap();
    l.bind_addr("10.78.0.2:7500".parse().unwrap()).unwrap();
    l.listen(4).unwrap();
    let ch = EventChannel::new().unwrap();
    let c = cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    assert!(matches!(c.init_qp_attr(QpState::Init), Err(Error::InvalidState { .. })));
    c.resolve_addr(Some("10.78.0.1".parse().unwrap()), "10.78.0.2:7500".parse().unwrap())
        .unwrap();
    assert_eq!(ch.get_event(t).unwrap().unwrap().kind, CmEventKind::AddrResolved);
    c.resolve_route().unwrap();
    assert_eq!(ch.get_event(t).unwrap().unwrap().kind, CmEventKind::RouteResolved);
    assert!(matches!(c.init_qp_attr(QpState::Err), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.init_qp_attr(QpState::Rtr), Err(Error::InvalidState { .. })));

    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // The client's own QP, not the id's.
    let ctx = c.verbs().unwrap();
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(16, 0, None, 0).unwrap());
    let attr = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap,
        sq_sig_all: false,
    };
    let qp = pd.create_qp(&attr(&cq)).unwrap();
    let (a, m) = c.init_qp_attr(QpState::Init).unwrap();
    qp.modify(&a, m).unwrap();
    c.connect(&ConnParam {
        qp_num: qp.qp_num(),
        ..ConnParam::default()
    })
    .unwrap();

    let mut req = sch.get_event(t).unwrap().unwrap();
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    // The passive side drives its own QP too: the request gave the
    // peer's QPN and PSN, and this side's PSN is chosen with it, so
    // RTR and RTS are known before accept (as librdmacm's accept
    // needs them).
    let sctx = s.verbs().unwrap();
    let (spd, scq) = (sctx.alloc_pd().unwrap(), sctx.create_cq(16, 0, None, 0).unwrap());
    let sqp = spd.create_qp(&attr(&scq)).unwrap();
    let smr = spd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let (a, m) = s.init_qp_attr(QpState::Init).unwrap();
    sqp.modify(&a, m).unwrap();
    sqp.post_recv(&[RecvWr::new(1, &[smr.sge(0, 64).unwrap()])]).unwrap();
    for st in [QpState::Rtr, QpState::Rts] {
        let (a, m) = s.init_qp_attr(st).unwrap();
        assert_eq!(a.qp_state, st);
        sqp.modify(&a, m).unwrap();
    }
    assert!(matches!(
        s.accept(&ConnParam::default()),
        Err(Error::InvalidState { .. })
    ));
    s.accept(&ConnParam {
        qp_num: sqp.qp_num(),
        ..ConnParam::default()
    })
    .unwrap();

    assert_eq!(ch.get_event(t).unwrap().unwrap().kind, CmEventKind::ConnectResponse);
    for st in [QpState::Rtr, QpState::Rts] {
        let (a, m) = c.init_qp_attr(st).unwrap();
        assert_eq!(a.qp_state, st);
        qp.modify(&a, m).unwrap();
    }
    c.establish().unwrap();
    assert_eq!(sch.get_event(t).unwrap().unwrap().kind, CmEventKind::Established);

    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write(0, b"own qp").unwrap();
    qp.post_send(&[SendWr::new(2, SendOp::Send, &[mr.sge(0, 6).unwrap()]).flags(SendFlags::SIGNALED)])
        .unwrap();
    let poll = |cq: &crate::verbs::Cq| {
        let mut wc = [WorkCompletion::default()];
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if cq.poll(&mut wc).unwrap() == 1 {
                return wc[0];
            }
            assert!(std::time::Instant::now() < deadline, "no completion");
            std::thread::yield_now();
        }
    };
    assert_eq!(poll(&cq).status, WcStatus::Success);
    assert_eq!(poll(&scq).status, WcStatus::Success);
    assert_eq!(smr.to_vec(0, 6).unwrap(), b"own qp");
    // The applications' QPs: the ids' paths are there too on soft ids.
    assert_eq!(c.path().map(|p| p.0), Some(sqp.qp_num()));
    assert_eq!(s.path().map(|p| p.0), Some(qp.qp_num()));
}
