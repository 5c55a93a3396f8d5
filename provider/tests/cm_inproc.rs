//! The connection manager between in-process soft devices: connect,
//! accept, data over the connected QPs, disconnect and time-wait; rejects
//! with private data; REJ for a port nobody listens on; private-data
//! limits; SIDR for UD ids.

mod cm_common;

use cm_common::*;
use softverbs::cm::*;
use softverbs::verbs::{AccessFlags, RecvWr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

fn poll_one(cq: &softverbs::verbs::Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return wc[0];
        }
        assert!(std::time::Instant::now() < deadline, "no completion");
        std::thread::yield_now();
    }
}

#[test]
fn connect_accept_send_disconnect_timewait() {
    let w = world(81, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, sa(81, 2, 7000));
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(81, 1), sa(81, 2, 7000));
    assert_eq!(c.device().unwrap().0, w.names[0]);
    let cres = with_qp(&c);
    c.connect(&ConnParam {
        private_data: b"hello server".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();

    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..12], b"hello server");
    assert_eq!(req.listener, Some(l.id()));
    assert_eq!(req.context, 99);
    assert_eq!(req.device.as_deref(), Some(w.names[1].as_str()));
    assert!(req.generation.is_some());
    assert_eq!(req.peer, c.local_addr());
    let s = req.take_id().unwrap();
    assert_eq!(s.local_addr(), Some(sa(81, 2, 7000)));
    let sres = with_qp(&s);
    // The passive QP is in INIT until accept.
    assert_eq!(
        s.qp().unwrap().query().unwrap().qp_state,
        softverbs::verbs::QpState::Init
    );
    // A receive for the client's message.
    let smr = sres.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp()
        .unwrap()
        .post_recv(&[RecvWr::new(1, &[smr.sge(0, 64).unwrap()])])
        .unwrap();
    s.accept(&ConnParam {
        private_data: vec![0xab; 196],
        ..ConnParam::default()
    })
    .unwrap();
    let est = expect(&ch, CmEventKind::Established);
    assert_eq!(est.private_data, vec![0xab; 196]);
    assert_eq!(est.conn.as_ref().unwrap().qp_num, s.qp().unwrap().qp_num());
    expect(&sch, CmEventKind::Established);
    assert_eq!(c.state(), "ESTABLISHED");

    // The QPs really are connected: a SEND crosses.
    let cmr = cres.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, b"over the cm").unwrap();
    c.qp()
        .unwrap()
        .post_send(&[SendWr::new(2, SendOp::Send, &[cmr.sge(0, 11).unwrap()]).flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = poll_one(&cres.cq);
    assert_eq!(wc.status, WcStatus::Success);
    let wc = poll_one(&sres.cq);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(smr.to_vec(0, 11).unwrap(), b"over the cm");

    c.disconnect().unwrap();
    expect(&ch, CmEventKind::Disconnected);
    expect(&sch, CmEventKind::Disconnected);
    assert_eq!(
        c.qp().unwrap().query().unwrap().qp_state,
        softverbs::verbs::QpState::Err
    );
    expect(&ch, CmEventKind::TimewaitExit);
    expect(&sch, CmEventKind::TimewaitExit);
    drop((c, s, l));
    assert!(w.cm.counters().tx_mads >= 5, "{:?}", w.cm.counters()); // REQ REP RTU DREQ DREP
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let w = world(82, 2, fast_config());
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(82, 1), sa(82, 2, 4444));
    let _r = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&ch, CmEventKind::Rejected);
    assert_eq!(ev.status, 8);
    assert_eq!(
        c.qp().unwrap().query().unwrap().qp_state,
        softverbs::verbs::QpState::Err
    );
}

#[test]
fn reject_carries_private_data() {
    let w = world(83, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(
        &w.cm,
        &sch,
        PortSpace::Tcp,
        sa(83, 0, 0).ip().to_canonical().into_wild(9000),
    );
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(83, 1), sa(83, 2, 9000));
    let _r = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    assert_eq!(
        s.reject(&[1; 149]),
        Err(Error::PrivateDataTooLong { len: 149, max: 148 })
    );
    s.reject(b"go away").unwrap();
    let ev = expect(&ch, CmEventKind::Rejected);
    assert_eq!(ev.status, 28);
    assert_eq!(&ev.private_data[..7], b"go away");
    assert_eq!(ev.private_data.len(), 148);
}

trait Wild {
    fn into_wild(self, port: u16) -> std::net::SocketAddr;
}
impl Wild for std::net::IpAddr {
    fn into_wild(self, port: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port)
    }
}

#[test]
fn private_data_limits_are_rdma_cm_s() {
    let w = world(84, 2, fast_config());
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(84, 1), sa(84, 2, 1));
    let _r = with_qp(&c);
    let too_long = ConnParam {
        private_data: vec![0; 57],
        ..ConnParam::default()
    };
    assert_eq!(
        c.connect(&too_long),
        Err(Error::PrivateDataTooLong { len: 57, max: 56 })
    );
    let u = resolved(&w.cm, &ch, PortSpace::Udp, ip(84, 1), sa(84, 2, 1));
    let _ur = with_qp(&u);
    let too_long = ConnParam {
        private_data: vec![0; 181],
        ..ConnParam::default()
    };
    assert_eq!(
        u.connect(&too_long),
        Err(Error::PrivateDataTooLong { len: 181, max: 180 })
    );
}

#[test]
fn bind_conflicts_and_states() {
    let w = world(85, 1, fast_config());
    let ch = EventChannel::new().unwrap();
    let a = w.cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    a.bind_addr(sa(85, 1, 5000)).unwrap();
    let b = w.cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    assert!(matches!(b.bind_addr(sa(85, 1, 5000)), Err(Error::AddrInUse(_))));
    assert!(matches!(
        b.bind_addr("0.0.0.0:5000".parse().unwrap()),
        Err(Error::AddrInUse(_))
    ));
    // Another port space is another port range.
    let u = w.cm.create_id(&ch, PortSpace::Udp, 0).unwrap();
    u.bind_addr(sa(85, 1, 5000)).unwrap();
    assert!(matches!(b.bind_addr(sa(85, 9, 1)), Err(Error::NoDevice(_))));
    assert!(matches!(
        b.accept(&ConnParam::default()),
        Err(Error::InvalidState { .. })
    ));
    assert!(matches!(b.resolve_route(), Err(Error::InvalidState { .. })));
    drop(a);
    b.bind_addr(sa(85, 1, 5000)).unwrap();
}

#[test]
fn ud_ids_resolve_qpn_and_qkey_by_sidr() {
    let w = world(86, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Udp, "0.0.0.0:6000".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Udp, ip(86, 1), sa(86, 2, 6000));
    let _cr = with_qp(&c);
    assert_eq!(
        c.qp().unwrap().query().unwrap().qp_state,
        softverbs::verbs::QpState::Rts
    );
    c.connect(&ConnParam {
        private_data: b"ud".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data[..2], b"ud");
    let s = req.take_id().unwrap();
    let _sr = with_qp(&s);
    s.accept(&ConnParam {
        private_data: b"sidr rep".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let ev = expect(&ch, CmEventKind::Established);
    let ud = ev.ud.unwrap();
    assert_eq!(ud.qp_num, s.qp().unwrap().qp_num());
    assert_eq!(ud.qkey, UDP_QKEY);
    assert_eq!(&ev.private_data[..8], b"sidr rep");

    // Nobody on that UDP port: unreachable.
    let c2 = resolved(&w.cm, &ch, PortSpace::Udp, ip(86, 1), sa(86, 2, 6001));
    let _c2r = with_qp(&c2);
    c2.connect(&ConnParam::default()).unwrap();
    let ev = expect(&ch, CmEventKind::Unreachable);
    assert_eq!(ev.status, 1);
}

#[test]
fn event_channel_fd_is_readable_while_events_wait() {
    let w = world(87, 2, fast_config());
    let ch = EventChannel::new().unwrap();
    let readable = |fd| {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    };
    assert!(!readable(ch.fd()));
    let id = w.cm.create_id(&ch, PortSpace::Tcp, 0).unwrap();
    id.resolve_addr(None, sa(87, 2, 1)).unwrap();
    assert!(readable(ch.fd()));
    assert_eq!(ch.try_get_event().unwrap().kind, CmEventKind::AddrResolved);
    assert!(!readable(ch.fd()));
    // Without a source address the device that has the destination is
    // chosen (loopback, as the kernel's routing would).
    assert_eq!(id.device().unwrap().0, w.names[1]);
}

#[test]
fn connect_without_an_id_qp_gets_connect_response_then_establish() {
    let w = world(88, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Tcp, sa(88, 2, 7800));
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(88, 1), sa(88, 2, 7800));
    // Without a QP or qp_num, connect is refused.
    assert!(matches!(
        c.connect(&ConnParam::default()),
        Err(Error::InvalidState { .. })
    ));
    c.connect(&ConnParam {
        qp_num: 0x42,
        ..ConnParam::default()
    })
    .unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    assert_eq!(req.conn.as_ref().unwrap().qp_num, 0x42);
    let s = req.take_id().unwrap();
    let _sr = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    let resp = expect(&ch, CmEventKind::ConnectResponse);
    assert_eq!(resp.conn.as_ref().unwrap().qp_num, s.qp().unwrap().qp_num());
    let (peer_qpn, _, _) = c.path().unwrap();
    assert_eq!(peer_qpn, s.qp().unwrap().qp_num());
    // The server waits for the RTU.
    assert!(sch
        .get_event(Some(std::time::Duration::from_millis(50)))
        .unwrap()
        .is_none());
    c.establish().unwrap();
    expect(&sch, CmEventKind::Established);
    assert!(matches!(c.establish(), Err(Error::InvalidState { .. })));
}

#[test]
fn a_listener_dropped_with_untaken_requests_rejects_them() {
    let w = world(89, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, sa(89, 2, 7900));
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(89, 1), sa(89, 2, 7900));
    let _r = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    // The request is queued on the server's channel; nobody takes it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while sch.pending() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let before = w.cm.id_count();
    drop(l);
    let ev = expect(&ch, CmEventKind::Rejected);
    assert_eq!(ev.status, 28);
    // The listener and its child are gone; only the client is left.
    assert_eq!(w.cm.id_count(), before - 2);
    drop(sch); // the queued event's id is gone: dropping it is harmless
}

/// A host whose device runs no CM (an application that has not started
/// its own yet) answers at once, as a kernel CM does for a service nobody
/// listens on: a connect is rejected (invalid service ID) and a UD
/// resolution is refused, instead of the REQ being lost and sent again
/// until the client gives up. The response timeout is long (~68 s), so
/// only an answer can end either wait in time.
#[test]
fn a_host_without_a_cm_refuses_at_once() {
    let w = world(
        88,
        1,
        CmConfig {
            response_timeout: 24,
            ..fast_config()
        },
    );
    let bare = softverbs::subsystem::Subsystem::new(softverbs::subsystem::SubsystemConfig::default());
    add_device(&bare, &w.fabric, 88, 2, softverbs::subsystem::NamespaceId::INIT);
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(88, 1), sa(88, 2, 4444));
    let _r = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&ch, CmEventKind::Rejected);
    assert_eq!(ev.status, 8);
    let u = resolved(&w.cm, &ch, PortSpace::Udp, ip(88, 1), sa(88, 2, 4444));
    let _ur = with_qp(&u);
    u.connect(&ConnParam::default()).unwrap();
    let ev = expect(&ch, CmEventKind::Unreachable);
    assert_eq!(ev.status, 1);
}
