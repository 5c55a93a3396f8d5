//! Hot-unplug of a soft device at the engine level: every posted WR
//! completes exactly once with WR_FLUSH_ERR (send queue first, in post
//! order), control verbs fail with ENODEV, destroy succeeds, DEVICE_FATAL is
//! the last async event.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;
use softverbs_conformance::harness::*;

#[test]
fn unplug_flushes_everything_once_and_fails_control_verbs() {
    let a = SoftDevice::create(SoftDeviceConfig::new(
        "unplug_a",
        IpAddr::V4(Ipv4Addr::new(127, 83, 90, 1)),
    ))
    .unwrap();
    let b = SoftDevice::create(SoftDeviceConfig::new(
        "unplug_b",
        IpAddr::V4(Ipv4Addr::new(127, 83, 90, 2)),
    ))
    .unwrap();
    let (ca, cb) = (a.open().unwrap(), b.open().unwrap());
    let p = Pair::new(&ca, &cb, PairConfig::default()).unwrap();
    // Receives on A that nothing will consume, and sends to B that will
    // not be answered once B is gone.
    for i in 0..5 {
        p.a.post_recv(100 + i, i * 64, 64).unwrap();
    }
    b.unplug();
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    for i in 0..3 {
        p.a.qp
            .post_send(&[SendWr::new(i, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
            .unwrap();
    }
    // A is still live: its sends go nowhere and time out later; unplug A.
    a.unplug();
    let sends = wait_n(&p.a.scq, 3, Duration::from_secs(5)).unwrap();
    assert_eq!(sends.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(sends.iter().all(|w| w.status == WcStatus::WrFlushErr));
    let recvs = wait_n(&p.a.rcq, 5, Duration::from_secs(5)).unwrap();
    assert_eq!(
        recvs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![100, 101, 102, 103, 104]
    );
    assert!(recvs.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert!(stays_empty(&p.a.scq, Duration::from_millis(20)).unwrap());
    // Posting after removal still completes exactly once, with a flush.
    p.a.qp.post_send(&[SendWr::new(9, SendOp::Send, &sge)]).unwrap();
    assert_eq!(
        wait_one(&p.a.scq, Duration::from_secs(5)).unwrap().status,
        WcStatus::WrFlushErr
    );
    // Control verbs fail with ENODEV.
    assert_eq!(ca.alloc_pd().unwrap_err().kind(), ErrorKind::NoDevice);
    assert_eq!(ca.create_cq(4, 0, None, 0).unwrap_err().kind(), ErrorKind::NoDevice);
    let attr = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    assert_eq!(
        p.a.qp.modify(&attr, QpAttrMask::STATE).unwrap_err().kind(),
        ErrorKind::NoDevice
    );
    // DEVICE_FATAL is delivered.
    let mut last = None;
    while let Some(e) = ca.get_async_event(Some(Duration::ZERO)).unwrap() {
        last = Some(e);
    }
    assert_eq!(last.map(|e| e.event_type), Some(EventType::DeviceFatal));
    // Destroying in any order succeeds after removal.
    let Pair { a: sa, b: sb, .. } = p;
    sa.scq.destroy().unwrap();
    sa.pd.destroy().unwrap();
    drop(sa.qp);
    drop(sb);
}
