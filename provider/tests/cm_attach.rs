//! The two hooks the C library (softverbs-ibverbs' librdmacm) uses:
//! [`CmId::attach_qp`] (a QP created outside the CM, then moved by it as
//! rdma_cm moves its own) and [`Cm::limit_mtu`] (a device whose link
//! carries less than its port reports), and the path MTU both sides of a
//! connection agree on.

mod cm_common;

use cm_common::*;
use softverbs::cm::*;
use softverbs::verbs::{Mtu, Pd, Qp, QpCap, QpInitAttr, QpState, QpType};

fn qp_on(pd: &Pd, cq: &softverbs::verbs::Cq, qp_type: QpType) -> Qp {
    pd.create_qp(&QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .expect("create_qp")
}

#[test]
fn attached_qps_follow_the_connection_and_the_mtu_limit() {
    let w = world(61, 2, fast_config());
    // The active side's device: its REQ carries the path MTU.
    assert!(w.cm.limit_mtu(&w.names[0], Mtu::Mtu1024), "the CM has the device");
    assert!(!w.cm.limit_mtu("no-such-device", Mtu::Mtu1024));
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Tcp, sa(61, 2, 7000));
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(61, 1), sa(61, 2, 7000));

    let ctx = c.verbs().unwrap();
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(8, 0, None, 0).unwrap());
    // A QP of the wrong type for the port space is refused, untouched.
    let ud = qp_on(&pd, &cq, QpType::Ud);
    assert!(matches!(c.attach_qp(&ud), Err(Error::InvalidArgument(_))));
    assert_eq!(ud.query().unwrap().qp_state, QpState::Reset);
    let qp = qp_on(&pd, &cq, QpType::Rc);
    c.attach_qp(&qp).unwrap();
    assert_eq!(qp.query().unwrap().qp_state, QpState::Init, "attach moves it to INIT");
    // A second QP is refused, and the first one stays usable.
    assert!(matches!(c.attach_qp(&ud), Err(Error::InvalidState { .. })));
    c.connect(&ConnParam::default()).unwrap();

    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    let sctx = s.verbs().unwrap();
    let (spd, scq) = (sctx.alloc_pd().unwrap(), sctx.create_cq(8, 0, None, 0).unwrap());
    let sqp = qp_on(&spd, &scq, QpType::Rc);
    s.attach_qp(&sqp).unwrap();
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);
    for q in [&qp, &sqp] {
        let a = q.query().unwrap();
        assert_eq!(a.qp_state, QpState::Rts, "the CM moved the attached QP");
        // The client's device is limited to 1024: its REQ asks for that
        // path MTU and the server takes the smaller of the two.
        assert_eq!(a.path_mtu, Mtu::Mtu1024);
    }
    assert_eq!(qp.query().unwrap().dest_qp_num, sqp.qp_num());

    c.disconnect().unwrap();
    expect(&ch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
    assert_eq!(qp.query().unwrap().qp_state, QpState::Err);
    // The C library destroys its QP first, then drops the id's handle:
    // destroying the same QP twice is harmless.
    qp.destroy().unwrap();
    c.destroy_qp();
}

#[test]
fn both_sides_use_the_path_mtu_of_the_req() {
    // No limit: the REQ carries the device's 4096 and the passive side
    // takes it as it is (its encoding is `enum ibv_mtu`'s number).
    let w = world(62, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Tcp, sa(62, 2, 7001));
    let ch = EventChannel::new().unwrap();
    let (c, _cres, s, _sres) = connected(&w, 62, 7001, &sch, &ch);
    for id in [&c, &s] {
        assert_eq!(id.qp().unwrap().query().unwrap().path_mtu, Mtu::Mtu4096);
    }
}
