//! Lost, duplicated and reordered CM messages (a fault injector on the
//! CM's outgoing MADs), duplicate REQs answered with MRA while the
//! application thinks, and stale REQs refused.

mod cm_common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm_common::*;
use softverbs::cm::mad::{self, CmMsg};
use softverbs::cm::*;

/// Applies `plan` to the n-th MAD of each attribute (`(attr, n, action)`),
/// passes the rest; counts what it saw.
#[derive(Debug, Default)]
struct Script {
    plan: Vec<(u16, usize, FaultAction)>,
    seen: Mutex<Vec<u16>>,
}

impl MadFault for Script {
    fn outgoing(&self, msg: &CmMsg, _dst: IpAddr) -> FaultAction {
        let mut seen = self.seen.lock().unwrap();
        let attr = msg.attr_id();
        let n = seen.iter().filter(|a| **a == attr).count();
        seen.push(attr);
        self.plan
            .iter()
            .find(|(a, k, _)| *a == attr && *k == n)
            .map_or(FaultAction::Pass, |p| p.2)
    }
}

/// A connection set up between the two devices of a world on `net`
/// (client on the first, a listener on `port` of the second), both sides
/// past ESTABLISHED; what it holds keeps it up (bind it whole: a
/// destructuring `..` would drop the rest at once).
struct Up {
    w: World,
    sch: EventChannel,
    ch: EventChannel,
    c: CmId,
    s: CmId,
    _l: CmId,
    _res: (Res, Res),
}

fn established(net: u8, cfg: CmConfig, port: u16) -> Up {
    let w = world(net, 2, cfg);
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, SocketAddr::from(([0, 0, 0, 0], port)));
    let ch = EventChannel::new().unwrap();
    let (c, cr, s, sr) = connected(&w, net, port, &sch, &ch);
    Up {
        w,
        sch,
        ch,
        c,
        s,
        _l: l,
        _res: (cr, sr),
    }
}

/// A full connect/accept/disconnect with `plan` applied; checks each side
/// sees each event exactly once.
fn handshake_with(net: u8, plan: Vec<(u16, usize, FaultAction)>) -> (CmCounters, Vec<u16>) {
    let script = Arc::new(Script {
        plan,
        ..Script::default()
    });
    let cfg = CmConfig {
        fault: Some(script.clone()),
        ..fast_config()
    };
    let up = established(net, cfg, 8000);
    let (w, sch, ch, c) = (&up.w, &up.sch, &up.ch, &up.c);
    c.disconnect().unwrap();
    expect(ch, CmEventKind::Disconnected);
    expect(sch, CmEventKind::Disconnected);
    expect(ch, CmEventKind::TimewaitExit);
    expect(sch, CmEventKind::TimewaitExit);
    // Exactly once: nothing else comes (duplicates answered, not
    // re-delivered).
    std::thread::sleep(Duration::from_millis(300));
    let mut extra: Vec<_> = std::iter::from_fn(|| sch.try_get_event()).map(|e| e.kind).collect();
    extra.extend(std::iter::from_fn(|| ch.try_get_event()).map(|e| e.kind));
    assert!(extra.is_empty(), "extra events {extra:?}");
    let seen = script.seen.lock().unwrap().clone();
    (w.cm.counters(), seen)
}

#[test]
fn lost_req_is_sent_again() {
    let (c, seen) = handshake_with(111, vec![(mad::attr::REQ, 0, FaultAction::Drop)]);
    assert_eq!(c.fault_drops, 1);
    assert!(c.retransmits >= 1);
    assert!(seen.iter().filter(|a| **a == mad::attr::REQ).count() >= 2);
}

#[test]
fn lost_rep_is_sent_again() {
    let (c, _) = handshake_with(112, vec![(mad::attr::REP, 0, FaultAction::Drop)]);
    assert!(c.retransmits >= 1, "{c:?}");
}

#[test]
fn lost_rtu_makes_the_rep_come_again_and_the_rtu_answer_it() {
    let (c, seen) = handshake_with(113, vec![(mad::attr::RTU, 0, FaultAction::Drop)]);
    assert!(c.retransmits >= 1, "{c:?}");
    assert!(seen.iter().filter(|a| **a == mad::attr::RTU).count() >= 2, "{seen:?}");
}

#[test]
fn lost_dreq_and_drep_are_recovered() {
    handshake_with(114, vec![(mad::attr::DREQ, 0, FaultAction::Drop)]);
    let (c, _) = handshake_with(115, vec![(mad::attr::DREP, 0, FaultAction::Drop)]);
    assert!(c.retransmits >= 1, "{c:?}");
}

/// Holds every DREP back for a while before it leaves, and says when it
/// has.
#[derive(Debug, Default)]
struct SlowDrep(AtomicBool);

impl MadFault for SlowDrep {
    fn outgoing(&self, msg: &CmMsg, _dst: IpAddr) -> FaultAction {
        if msg.attr_id() == mad::attr::DREP {
            std::thread::sleep(Duration::from_millis(300));
            self.0.store(true, Ordering::SeqCst);
        }
        FaultAction::Pass
    }
}

/// The passive side's DREP leaves before its application hears of the
/// disconnection: a program may exit as soon as it sees DISCONNECTED,
/// and a DREP still queued in it would never leave (its peer would wait
/// out the DREQ's retransmissions before its own DISCONNECTED).
#[test]
fn the_drep_leaves_before_the_disconnected_event() {
    let slow = Arc::new(SlowDrep::default());
    let cfg = CmConfig {
        fault: Some(slow.clone()),
        ..fast_config()
    };
    let up = established(126, cfg, 8000);
    let (sch, ch, c) = (&up.sch, &up.ch, &up.c);
    c.disconnect().unwrap();
    expect(sch, CmEventKind::Disconnected);
    assert!(
        slow.0.load(Ordering::SeqCst),
        "DISCONNECTED reached the application before its DREP left"
    );
    expect(ch, CmEventKind::Disconnected);
}

#[test]
fn duplicated_messages_change_nothing() {
    let plan = [
        mad::attr::REQ,
        mad::attr::REP,
        mad::attr::RTU,
        mad::attr::DREQ,
        mad::attr::DREP,
    ]
    .into_iter()
    .map(|a| (a, 0, FaultAction::Duplicate))
    .collect();
    let (c, _) = handshake_with(116, plan);
    assert!(c.dup_reqs >= 1, "{c:?}");
}

#[test]
fn reordered_messages_are_handled() {
    // The REP is held back until the next MAD leaves (the client's REQ
    // retransmission): it arrives after a duplicate REQ.
    let (c, _) = handshake_with(117, vec![(mad::attr::REP, 0, FaultAction::Delay)]);
    assert!(c.retransmits >= 1, "{c:?}");
}

#[test]
fn a_slow_acceptor_gets_mra_instead_of_losing_the_request() {
    let w = world(118, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:8100".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(118, 1), sa(118, 2, 8100));
    let _cr = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    let mut req = expect(&sch, CmEventKind::ConnectRequest);
    // Think longer than the client's retries would last without MRA
    // (4 retries × ~134 ms).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while w.cm.counters().dup_reqs < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(900));
    let s = req.take_id().unwrap();
    let _sr = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    expect(&sch, CmEventKind::Established);
    assert!(sch.try_get_event().is_none(), "one request, delivered once");
}

#[test]
fn a_stale_req_is_rejected() {
    let up = established(119, fast_config(), 8200);
    let (w, sch, c, s) = (&up.w, &up.sch, &up.c, &up.s);
    // A REQ from the same peer QP under a new communication ID (as after
    // a peer reboot that forgot the connection).
    let hdr = mad::CmaHdr {
        src: ip(119, 1),
        src_port: 40000,
        dst: ip(119, 2),
    };
    let stale = CmMsg::Req(mad::Req {
        local_comm_id: 0x5a5a_5a5a,
        service_id: mad::service_id(0x0106, 8200),
        local_ca_guid: 1,
        local_qkey: 0,
        local_qpn: c.qp().unwrap().qp_num(),
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 15,
        transport: 0,
        starting_psn: 1,
        local_cm_response_timeout: 15,
        retry_count: 7,
        mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 4,
        srq: false,
        local_gid: softverbs::verbs::Gid::from_ip(ip(119, 1)),
        remote_gid: softverbs::verbs::Gid::from_ip(ip(119, 2)),
        hop_limit: 64,
        local_ack_timeout: 14,
        private_data: hdr.prepend(&[]),
    });
    let client_dev = w.sub.device(&w.names[0]).unwrap().soft_device().unwrap();
    assert!(client_dev.shared().gsi_send(0, ip(119, 2), &stale.encode(77)));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while w.cm.counters().stale_rejects < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(w.cm.counters().stale_rejects, 1);
    assert!(sch.try_get_event().is_none(), "no request for a stale REQ");
    assert_eq!(s.state(), "ESTABLISHED");
    let _ = AtomicUsize::new(0).load(Ordering::Relaxed);
}

#[test]
fn malformed_mads_on_qp1_are_dropped_and_counted() {
    let w = world(120, 2, fast_config());
    let dev = w.sub.device(&w.names[0]).unwrap().soft_device().unwrap();
    let mut junk = [0u8; 256];
    junk[0] = 1;
    junk[1] = 0x07;
    junk[2] = 2;
    junk[3] = 3;
    junk[16] = 0x00;
    junk[17] = 0x19; // LAP: not handled
    assert!(dev.shared().gsi_send(0, ip(120, 2), &junk));
    junk[1] = 0x81; // not the CM class at all
    assert!(dev.shared().gsi_send(0, ip(120, 2), &junk));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while w.cm.counters().rx_dropped < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(w.cm.counters().rx_dropped, 2);
}

#[test]
fn hostile_mads_never_break_the_cm() {
    let w = world(125, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let _l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:8300".parse().unwrap());
    let dev = w.sub.device(&w.names[0]).unwrap().soft_device().unwrap();
    // Valid CM headers, every handled attribute, random bodies (a fixed
    // generator: reproducible).
    let mut x: u64 = 0x1234_5678_9abc_def0;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..400u32 {
        let mut m = [0u8; 256];
        for b in m.iter_mut() {
            *b = next() as u8;
        }
        m[..4].copy_from_slice(&[1, 0x07, 2, 3]);
        m[16] = 0;
        m[17] = 0x10 + (i % 9) as u8;
        if i % 3 == 0 {
            // A REQ to the listener's service with a plausible header.
            m[17] = 0x10;
            m[24 + 8..24 + 16].copy_from_slice(&mad::service_id(0x0106, 8300).to_be_bytes());
            m[24 + 140] = 0;
            m[24 + 141] = 0x40;
        }
        assert!(dev.shared().gsi_send(0, ip(125, 2), &m));
    }
    // Requests may have reached the listener (bounded by its backlog);
    // reject them all, then a real connection still works.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while w.cm.counters().rx_mads < 400 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    while let Some(mut ev) = sch.try_get_event() {
        if let Some(id) = ev.take_id() {
            let _ = id.reject(&[]);
        }
    }
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(125, 1), sa(125, 2, 8300));
    let _cr = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    // Late hostile requests may still come first: reject those.
    let s = loop {
        let mut req = expect(&sch, CmEventKind::ConnectRequest);
        let id = req.take_id().unwrap();
        if req.peer == c.local_addr() {
            break id;
        }
        let _ = id.reject(&[]);
    };
    let _sr = with_qp(&s);
    s.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventKind::Established);
    assert!(w.cm.counters().backlog_drops + w.cm.counters().rx_dropped > 0);
}
