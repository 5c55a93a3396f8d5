//! The sockets-like API: connect/accept and data; a device removal under
//! a connection ends in its completions (every WR exactly once, flushed)
//! followed by one typed error, with no straggler; a wildcard listener
//! accepts on a device plugged after it started; with a reconnection
//! policy, a removal ends in the flushes and one `Reconnected`, and the
//! connection goes on through another device.

mod cm_common;

use std::time::Duration;

use cm_common::*;
use softverbs::cm::*;
use softverbs::subsystem::NamespaceId;
use softverbs::verbs::{AccessFlags, RecvWr, SendOp, SendWr, WcStatus, WorkCompletion};

fn pair(w: &World, net: u8, host: u8, port: u16) -> (Connection, Connection) {
    let l = Listener::bind(&w.cm, NamespaceId::INIT, format!("0.0.0.0:{port}").parse().unwrap(), 4).unwrap();
    let t = std::thread::spawn(move || l.accept(&ConnOptions::default(), WAIT).unwrap().unwrap());
    let c = Connection::connect(
        &w.cm,
        NamespaceId::INIT,
        Some(ip(net, 1)),
        sa(net, host, port),
        &ConnOptions::default(),
        WAIT,
    )
    .unwrap();
    (c, t.join().unwrap())
}

fn drain(conn: &Connection) -> (Vec<(u64, WcStatus)>, ConnectionError) {
    let mut got = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match conn.poll(&mut wc) {
            Ok(n) => got.extend(wc[..n].iter().map(|w| (w.wr_id, w.status))),
            Err(e) => return (got, e),
        }
        assert!(std::time::Instant::now() < deadline, "no end: {got:?}");
        std::thread::yield_now();
    }
}

#[test]
fn data_flows_and_close_ends_the_peer_once() {
    let w = world(121, 2, fast_config());
    let (c, s) = pair(&w, 121, 2, 9100);
    let spd = s.pd().unwrap();
    let smr = spd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    s.post_recv(&[RecvWr::new(10, &[smr.sge(0, 64).unwrap()])]).unwrap();
    s.post_recv(&[RecvWr::new(11, &[smr.sge(0, 64).unwrap()])]).unwrap();
    let cpd = c.pd().unwrap();
    let cmr = cpd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, b"sock").unwrap();
    c.post_send(&[SendWr::new(1, SendOp::Send, &[cmr.sge(0, 4).unwrap()])])
        .unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while seen == 0 {
        seen = s.poll(&mut wc).unwrap();
        let _ = c.poll(&mut [WorkCompletion::default(); 4]);
        assert!(std::time::Instant::now() < deadline);
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (10, WcStatus::Success));
    assert_eq!(smr.to_vec(0, 4).unwrap(), b"sock");
    drop((cmr, cpd));
    c.close();
    // The server sees its other receive flushed, then one Disconnected.
    let (got, end) = drain(&s);
    assert_eq!(got, vec![(11, WcStatus::WrFlushErr)]);
    assert_eq!(end, ConnectionError::Disconnected);
    assert_eq!(s.poll(&mut wc), Err(ConnectionError::Closed));
    assert_eq!(s.inflight(), 0);
    drop((smr, spd));
}

#[test]
fn removal_completes_every_wr_then_one_error_and_no_straggler() {
    let w = world(122, 2, fast_config());
    let (c, s) = pair(&w, 122, 2, 9200);
    let spd = s.pd().unwrap();
    let smr = spd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        s.post_recv(&[RecvWr::new(i, &[smr.sge(0, 64).unwrap()])]).unwrap();
    }
    assert_eq!(s.inflight(), 8);
    let sub = w.sub.clone();
    let name = w.names[1].clone();
    let remover = std::thread::spawn(move || sub.remove_device(&name).unwrap());
    let (got, end) = drain(&s);
    let mut ids: Vec<u64> = got.iter().map(|g| g.0).collect();
    ids.sort();
    assert_eq!(ids, (0..8).collect::<Vec<_>>(), "each WR exactly once");
    assert!(got.iter().all(|g| g.1 == WcStatus::WrFlushErr));
    assert_eq!(end, ConnectionError::DeviceRemoved);
    assert!(matches!(
        s.post_recv(&[RecvWr::new(99, &[])]),
        Err(ConnectionError::Closed)
    ));
    drop((smr, spd));
    let report = remover.join().unwrap();
    assert!(report.stragglers.is_empty(), "{report:?}");
    drop((c, s));
}

#[test]
fn with_a_policy_a_removal_reconnects_through_another_device() {
    let w = world(125, 3, fast_config());
    // Devices: .1 and .3 on the client's side, .2 the server's.
    let l = Listener::bind(&w.cm, NamespaceId::INIT, "0.0.0.0:9500".parse().unwrap(), 4).unwrap();
    let server = std::thread::spawn(move || {
        let first = l.accept(&ConnOptions::default(), WAIT).unwrap().unwrap();
        let second = l.accept(&ConnOptions::default(), WAIT).unwrap().unwrap();
        (first, second)
    });
    let opts = ConnOptions {
        reconnect: Some(Reconnect {
            // The removed device first: its attempt fails, the next wins.
            sources: vec![ip(125, 1), ip(125, 3)],
            timeout: Duration::from_secs(20),
        }),
        ..ConnOptions::default()
    };
    let c = Connection::connect(
        &w.cm,
        NamespaceId::INIT,
        Some(ip(125, 1)),
        sa(125, 2, 9500),
        &opts,
        WAIT,
    )
    .unwrap();
    assert_eq!(c.device().unwrap().0, w.names[0]);
    let old_pd = c.pd().unwrap();
    let old_mr = old_pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..4u64 {
        c.post_recv(&[RecvWr::new(i, &[old_mr.sge(0, 64).unwrap()])]).unwrap();
    }
    drop((old_mr, old_pd));

    let sub = w.sub.clone();
    let name = w.names[0].clone();
    let remover = std::thread::spawn(move || sub.remove_device(&name).unwrap());
    // Every WR in flight completes once, flushed; then the reconnection.
    let (got, end) = drain(&c);
    let mut ids: Vec<u64> = got.iter().map(|g| g.0).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    assert!(got.iter().all(|g| g.1 == WcStatus::WrFlushErr), "{got:?}");
    assert_eq!(end, ConnectionError::Reconnected);
    let report = remover.join().unwrap();
    assert!(report.stragglers.is_empty(), "{report:?}");
    assert_eq!(c.device().unwrap().0, w.names[2]);
    assert_eq!(c.local_addr().unwrap().ip(), ip(125, 3));
    assert_eq!(c.inflight(), 0);

    // The connection goes on: the server's listener took the new one, and
    // data crosses after registering again with the new PD.
    let (_first, s) = server.join().unwrap();
    assert_eq!(s.peer_addr(), c.local_addr());
    let spd = s.pd().unwrap();
    let smr = spd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    s.post_recv(&[RecvWr::new(50, &[smr.sge(0, 64).unwrap()])]).unwrap();
    let cpd = c.pd().unwrap();
    let cmr = cpd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, b"again").unwrap();
    c.post_send(&[SendWr::new(60, SendOp::Send, &[cmr.sge(0, 5).unwrap()])])
        .unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (mut sent, mut received) = (false, false);
    while !(sent && received) {
        if let Ok(n) = c.poll(&mut wc) {
            sent |= wc[..n].iter().any(|w| (w.wr_id, w.status) == (60, WcStatus::Success));
        }
        if let Ok(n) = s.poll(&mut wc) {
            received |= wc[..n].iter().any(|w| (w.wr_id, w.status) == (50, WcStatus::Success));
        }
        assert!(std::time::Instant::now() < deadline, "sent {sent}, received {received}");
    }
    assert_eq!(smr.to_vec(0, 5).unwrap(), b"again");
    drop((cmr, cpd, smr, spd));
}

#[test]
fn without_a_policy_the_active_side_ends_on_removal() {
    let w = world(126, 3, fast_config());
    let (c, _s) = pair(&w, 126, 2, 9600);
    let sub = w.sub.clone();
    let name = w.names[0].clone();
    let remover = std::thread::spawn(move || sub.remove_device(&name).unwrap());
    let (got, end) = drain(&c);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(end, ConnectionError::DeviceRemoved);
    assert_eq!(c.device(), None);
    remover.join().unwrap();
}

#[test]
fn wildcard_listener_accepts_on_a_device_plugged_later() {
    let w = world(123, 1, fast_config());
    let l = Listener::bind(&w.cm, NamespaceId::INIT, "0.0.0.0:9300".parse().unwrap(), 4).unwrap();
    let name = add_device(&w.sub, &w.fabric, 123, 7, NamespaceId::INIT);
    let t = std::thread::spawn(move || l.accept(&ConnOptions::default(), WAIT).unwrap().unwrap());
    let c = Connection::connect(
        &w.cm,
        NamespaceId::INIT,
        Some(ip(123, 1)),
        sa(123, 7, 9300),
        &ConnOptions::default(),
        WAIT,
    )
    .unwrap();
    let s = t.join().unwrap();
    assert_eq!(s.local_addr(), Some(sa(123, 7, 9300)));
    drop((c, s));
    let _ = name;
}

#[test]
fn refused_and_unreachable_are_typed() {
    let w = world(124, 2, fast_config());
    let e = Connection::connect(
        &w.cm,
        NamespaceId::INIT,
        Some(ip(124, 1)),
        sa(124, 2, 1),
        &ConnOptions::default(),
        WAIT,
    )
    .unwrap_err();
    assert_eq!(e, ConnectionError::Rejected(8, vec![0; 148]));
    // Nobody at that address at all: the REQ goes nowhere.
    let e = Connection::connect(
        &w.cm,
        NamespaceId::INIT,
        Some(ip(124, 1)),
        sa(124, 66, 1),
        &ConnOptions::default(),
        WAIT,
    )
    .unwrap_err();
    assert_eq!(e, ConnectionError::Unreachable);
}
