//! Resource leaks of the connection manager: 200+ connect/disconnect
//! cycles leave no descriptor, thread or id behind, and dropping the CM
//! stops its thread and frees the devices' QP1. One test in its own
//! binary, so that no other test's threads or descriptors are counted.

mod cm_common;

use std::time::Duration;

use cm_common::*;
use softverbs::cm::*;

#[test]
fn no_leaks() {
    cycles_leak_no_fd_or_thread();
    dropping_the_cm_stops_its_thread_and_frees_qp1();
}

fn connected(w: &World, net: u8, port: u16, sch: &EventChannel, ch: &EventChannel) -> (CmId, Res, CmId, Res) {
    let c = resolved(&w.cm, ch, PortSpace::Tcp, ip(net, 1), sa(net, 2, port));
    let cres = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    let sres = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(ch, CmEventKind::Established);
    expect(sch, CmEventKind::Established);
    (c, cres, s, sres)
}

fn cycles_leak_no_fd_or_thread() {
    let w = world(106, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:7600".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    let cycle = |w: &World| {
        let (c, cr, s, sr) = connected(w, 106, 7600, &sch, &ch);
        c.disconnect().unwrap();
        expect(&ch, CmEventKind::Disconnected);
        expect(&sch, CmEventKind::Disconnected);
        drop((c, cr, s, sr));
    };
    for _ in 0..10 {
        cycle(&w);
    }
    let (fds, threads) = (fd_count(), thread_count());
    for _ in 0..200 {
        cycle(&w);
    }
    // Destroyed ids linger only for time-wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while w.cm.id_count() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(w.cm.id_count(), 1, "only the listener is left");
    assert_eq!(fd_count(), fds);
    assert_eq!(thread_count(), threads);
    drop(l);
}

fn dropping_the_cm_stops_its_thread_and_frees_qp1() {
    let before = thread_count();
    let w = world(107, 2, fast_config());
    assert_eq!(thread_count(), before + 1);
    let World { sub, cm, names, .. } = w;
    drop(cm);
    assert_eq!(thread_count(), before);
    // A second CM can take the devices' QP1 now and connect.
    let cm = Cm::new(sub.clone(), fast_config()).unwrap();
    let sch = EventChannel::new().unwrap();
    let _l = listener(&cm, &sch, PortSpace::Tcp, sa(107, 2, 7700));
    let ch = EventChannel::new().unwrap();
    let c = resolved(&cm, &ch, PortSpace::Tcp, ip(107, 1), sa(107, 2, 7700));
    let _cr = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    expect(&sch, CmEventKind::ConnectRequest);
    let _ = names;
}
