//! The connection manager under hotplug and namespaces: DEVICE_REMOVAL
//! exactly once with the QP's work flushed exactly once, destroy after
//! removal, a wildcard listener that outlives its devices, namespace
//! deletion, and events that say where they come from.

mod cm_common;

use std::time::Duration;

use cm_common::*;
use softverbs::cm::*;
use softverbs::subsystem::NamespaceId;
use softverbs::verbs::{AccessFlags, RecvWr, WcStatus, WorkCompletion};

#[test]
fn removal_delivers_device_removal_once_and_flushes_every_wr_once() {
    let w = world(101, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:7100".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    let (c, cres, s, sres) = connected(&w, 101, 7100, &sch, &ch);
    // Receives posted on the server QP, none of which will be consumed.
    let mr = sres.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = s.qp().unwrap();
    for i in 0..5u64 {
        qp.post_recv(&[RecvWr::new(100 + i, &[mr.sge(0, 64).unwrap()])])
            .unwrap();
    }
    drop(qp);
    let server_dev = w.names[1].clone();
    let sub = w.sub.clone();
    // The removal waits for consumers to let go: destroy everything on the
    // server device when DEVICE_REMOVAL comes, from another thread.
    let remover = std::thread::spawn(move || sub.remove_device(&server_dev).unwrap());
    let ev = expect(&sch, CmEventKind::DeviceRemoval);
    assert_eq!(ev.id, s.id());
    assert_eq!(ev.device.as_deref(), Some(w.names[1].as_str()));
    assert_eq!(ev.listener, Some(l.id()));
    // Every posted receive completed exactly once, with a flush.
    let mut wc = [WorkCompletion::default(); 16];
    let mut seen = Vec::new();
    for _ in 0..3 {
        let n = sres.cq.poll(&mut wc).unwrap_or(0);
        seen.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
    }
    seen.sort_by_key(|x| x.0);
    assert_eq!(seen, (100..105).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>());
    assert!(matches!(s.disconnect(), Err(Error::DeviceRemoved)));
    drop(mr);
    drop(s); // destroy after removal succeeds
    drop(sres);
    let report = remover.join().unwrap();
    assert!(report.stragglers.is_empty(), "{report:?}");
    // Exactly once: nothing more on the server channel; the wildcard
    // listener saw nothing of the removal.
    assert!(sch.get_event(Some(Duration::from_millis(200))).unwrap().is_none());
    // The client is untouched by the server's removal (its peer is gone:
    // a disconnect runs out of DREQ retries and still completes).
    c.disconnect().unwrap();
    expect(&ch, CmEventKind::Disconnected);
    drop((c, cres, l));
}

#[test]
fn wildcard_listener_keeps_accepting_across_devices_that_come_and_go() {
    let w = world(102, 1, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:7200".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    for round in 0..4u8 {
        // A new server device each round; the old one is removed.
        let host = 10 + round;
        let name = add_device(&w.sub, &w.fabric, 102, host, NamespaceId::INIT);
        let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(102, 1), sa(102, host, 7200));
        let _cr = with_qp(&c);
        c.connect(&ConnParam::default()).unwrap();
        let mut req = expect(&sch, CmEventKind::ConnectRequest);
        assert_eq!(req.device.as_deref(), Some(name.as_str()));
        assert_eq!(req.listener, Some(l.id()));
        let s = req.take_id().unwrap();
        let _sr = with_qp(&s);
        s.accept(&ConnParam::default()).unwrap();
        expect(&ch, CmEventKind::Established);
        expect(&sch, CmEventKind::Established);
        drop((s, _sr));
        let _ = expect(&ch, CmEventKind::Disconnected); // the server's destroy sent a DREQ
        drop((c, _cr));
        w.sub.remove_device(&name).unwrap();
    }
    // The listener never saw a removal.
    while let Some(ev) = sch.try_get_event() {
        assert_ne!(ev.kind, CmEventKind::DeviceRemoval, "{ev:?}");
        assert_ne!(ev.id, l.id(), "{ev:?}");
    }
    assert_eq!(l.state(), "LISTEN");
}

#[test]
fn listener_bound_to_a_device_address_gets_removal_once() {
    let w = world(103, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, sa(103, 2, 7300));
    w.sub.remove_device(&w.names[1]).unwrap();
    let ev = expect(&sch, CmEventKind::DeviceRemoval);
    assert_eq!(ev.id, l.id());
    assert!(sch.get_event(Some(Duration::from_millis(100))).unwrap().is_none());
    drop(l);
}

#[test]
fn namespace_deletion_removes_each_id_once_and_never_waits() {
    let w = world(104, 0, fast_config());
    let ns = w.sub.create_namespace(&unique("cmns")).unwrap();
    let a = add_device(&w.sub, &w.fabric, 104, 1, ns);
    let _b = add_device(&w.sub, &w.fabric, 104, 2, ns);
    let ch = EventChannel::new().unwrap();
    let wild = w.cm.create_id_in(ns, &ch, PortSpace::Tcp, 1).unwrap();
    wild.bind_addr("0.0.0.0:7400".parse().unwrap()).unwrap();
    wild.listen(4).unwrap();
    let bound = w.cm.create_id_in(ns, &ch, PortSpace::Tcp, 2).unwrap();
    bound.resolve_addr(Some(ip(104, 1)), sa(104, 2, 7400)).unwrap();
    let ev = expect(&ch, CmEventKind::AddrResolved);
    assert_eq!(ev.namespace, ns);
    assert_eq!(ev.device.as_deref(), Some(a.as_str()));
    // An id in the initial namespace does not see the other one's devices.
    let other = w.cm.create_id(&ch, PortSpace::Tcp, 3).unwrap();
    assert!(matches!(
        other.resolve_addr(Some(ip(104, 1)), sa(104, 2, 1)),
        Err(Error::NoDevice(_))
    ));
    // Deleting the namespace does not wait for the ids.
    w.sub.delete_namespace(ns).unwrap();
    let mut removed = Vec::new();
    while let Some(ev) = ch.get_event(Some(Duration::from_secs(2))).unwrap() {
        assert_eq!(ev.kind, CmEventKind::DeviceRemoval);
        assert_eq!(ev.namespace, ns);
        removed.push(ev.id);
        assert!(removed.len() <= 2, "more than one removal per id: {removed:?}");
    }
    removed.sort();
    assert_eq!(removed, vec![wild.id(), bound.id()]);
    assert!(matches!(wild.listen(1), Err(Error::NamespaceGone)));
    drop((wild, bound, other));
    assert!(w.cm.create_id_in(ns, &ch, PortSpace::Tcp, 0).is_err());
}

#[test]
fn peer_dying_mid_handshake_ends_in_unreachable() {
    let w = world(105, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:7500".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(105, 1), sa(105, 2, 7500));
    let _cr = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    let s = req.take_id().unwrap();
    // The server's device dies before it answers.
    let sub = w.sub.clone();
    let name = w.names[1].clone();
    let t = std::thread::spawn(move || sub.remove_device(&name).unwrap());
    expect(&sch, CmEventKind::DeviceRemoval);
    drop(s);
    t.join().unwrap();
    // The client's REQ retries run out.
    let ev = expect(&ch, CmEventKind::Unreachable);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    assert!(w.cm.counters().retransmits >= 4);
}
