//! The send fast path's egress (`ShmLink::send_now`) and the QP route
//! hints it keeps.

use super::super::send::RouteHint;
use super::*;

impl ShmLink {
    /// `send_now` of `t` in pieces (its bytes split in three), with the
    /// QP route hint `hint`.
    fn send_now_hinted(&self, t: &Transmit, hint: &mut LinkHint) -> bool {
        let (head, rest) = t.data.split_at(t.data.len().min(3));
        let (mid, tail) = rest.split_at(rest.len() / 2);
        let out = Outgoing {
            parts: [head, mid, tail],
            ..Outgoing::whole(t)
        };
        self.send_now(&out, hint)
    }

    /// `send_now` with a hint of its own, as for a QP's first datagram.
    fn send_now_fresh(&self, t: &Transmit) -> bool {
        self.send_now_hinted(t, &mut LinkHint::default())
    }
}

/// `send_now` (the send fast path's egress) publishes a datagram on a
/// channel that is up and takes it at once, and leaves everything else to
/// the usual path, doing nothing: no channel, a backlog (which
/// the datagram would overtake), a detached device.
#[test]
fn send_now_takes_only_what_can_go_at_once() {
    let (a, b) = pair(true, true);
    assert!(a.fast_send().is_some());
    let before = stat(&a, "shm_tx_datagrams");
    assert!(a.send_now_fresh(&dgram(&a, &b, b"at once", None)));
    let got = pump_until(&a, &b, 1);
    assert_eq!(got.iter().map(|g| g.data.as_slice()).collect::<Vec<_>>(), [b"at once"]);
    assert_eq!(stat(&a, "shm_tx_datagrams"), before + 1);
    // No channel: nothing done, nothing counted.
    let mut t = dgram(&a, &b, b"nowhere", None);
    t.dst = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    assert!(!a.send_now_fresh(&t));
    assert_eq!(stat(&a, "shm_tx_no_channel"), 0);
    // Fill the ring until the usual path backlogs: then `send_now` must
    // not overtake what waits.
    let mut queued = 0;
    let backlogged = stat(&a, "shm_tx_backlogged");
    while stat(&a, "shm_tx_backlogged") == backlogged {
        a.send_one(dgram(&a, &b, b"fill", None), &mut drop);
        queued += 1;
        assert!(queued < 1_000_000, "the ring never filled");
    }
    let published = stat(&a, "shm_tx_datagrams");
    assert!(!a.send_now_fresh(&dgram(&a, &b, b"late", None)));
    // `b` reads, and `a` has not retried its backlog yet: the ring has
    // room now, but what waits goes first.
    let mut got = Vec::new();
    let start = Instant::now();
    while got.is_empty() && start.elapsed() < Duration::from_secs(10) {
        pump(&b, &mut got);
    }
    assert!(!got.is_empty());
    assert!(!a.send_now_fresh(&dgram(&a, &b, b"late", None)));
    assert_eq!(stat(&a, "shm_tx_datagrams"), published);
    // Once the backlog went, it goes at once again.
    got.extend(pump_until(&a, &b, queued - got.len()));
    assert_eq!(got.len(), queued);
    assert!(got.iter().all(|g| g.data == b"fill"));
    assert!(a.send_now_fresh(&dgram(&a, &b, b"again", None)));
    let got = pump_until(&a, &b, 1);
    assert_eq!(got.iter().map(|g| g.data.as_slice()).collect::<Vec<_>>(), [b"again"]);
    // After the device detached, nothing goes at once.
    a.detached.store(true, Ordering::Relaxed);
    assert!(!a.send_now_fresh(&dgram(&a, &b, b"gone", None)));
}

/// A QP's route hint serves its datagrams while it is good, without the
/// route table: it goes stale when any route changes, for another
/// destination and on another link, and a channel that went down refuses
/// datagrams, hinted or not.
#[test]
fn a_route_hint_serves_while_it_is_good() {
    let (a, b) = pair(true, true);
    let dst = ip(&b);
    let mut h = LinkHint::default();
    assert!(a.send_now_hinted(&dgram(&a, &b, b"first", None), &mut h));
    let kept = h
        .get::<RouteHint>()
        .and_then(|r| r.chan.clone())
        .expect("the hint keeps the channel");
    assert!(Arc::ptr_eq(&kept, &channel(&a)));
    // The route leaves the table behind the hint's back (no new version):
    // the hint still serves, a fresh lookup finds nothing.
    let route = a.routes.write().unwrap().remove(&dst).expect("a route to b");
    assert!(a.send_now_hinted(&dgram(&a, &b, b"hinted", None), &mut h));
    assert!(!a.send_now_fresh(&dgram(&a, &b, b"no route", None)));
    // Any change of the table makes the hint stale: looked up again.
    a.routes_w().remove(&IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)));
    assert!(!a.send_now_hinted(&dgram(&a, &b, b"stale", None), &mut h));
    assert!(h.get::<RouteHint>().is_some_and(|r| r.chan.is_none()));
    a.routes_w().insert(dst, route);
    assert!(a.send_now_hinted(&dgram(&a, &b, b"again", None), &mut h));
    // Another destination: looked up (no channel), and the hint now names
    // it; the next datagram to `b` looks up again.
    let mut t = dgram(&a, &b, b"nowhere", None);
    t.dst = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    assert!(!a.send_now_hinted(&t, &mut h));
    assert!(a.send_now_hinted(&dgram(&a, &b, b"back", None), &mut h));
    let got = pump_until(&a, &b, 4);
    let data: Vec<&[u8]> = got.iter().map(|g| g.data.as_slice()).collect();
    assert_eq!(data, [&b"first"[..], b"hinted", b"again", b"back"]);
    // `a`'s hint on another link to `b`: that link looks its own route up
    // and keeps it.
    let c = link_in(ShmMode::Only);
    c.send(dgram(&c, &b, b"hello", None));
    assert_eq!(pump_until(&c, &b, 1).len(), 1);
    // (Its routes at the same version as `a`'s, as may happen.)
    c.route_version
        .store(a.route_version.load(Ordering::Relaxed), Ordering::Relaxed);
    assert!(c.send_now_hinted(&dgram(&c, &b, b"from c", None), &mut h));
    assert!(h
        .get::<RouteHint>()
        .is_some_and(|r| r.chan.as_ref().is_some_and(|ch| Arc::ptr_eq(ch, &channel(&c)))));
    let got = pump_until(&c, &b, 1);
    assert_eq!(got.iter().map(|g| g.data.as_slice()).collect::<Vec<_>>(), [b"from c"]);
    // A channel that went down refuses, though the hint still names it.
    let mut h = LinkHint::default();
    assert!(a.send_now_hinted(&dgram(&a, &b, b"last", None), &mut h));
    kept.kill();
    assert!(!a.send_now_hinted(&dgram(&a, &b, b"dead", None), &mut h));
}

/// `send_one` (a verb's single datagram) takes the same ways as a batch:
/// through the ring to a peer with a channel (the buffer coming back for
/// reuse), and in `Only` mode nowhere else: a destination without a
/// channel is dropped and counted.
#[test]
fn send_one_goes_through_the_ring_or_is_counted() {
    let (a, b) = pair(false, false);
    let before = stat(&a, "shm_tx_datagrams");
    let t = dgram(&a, &b, b"one datagram", None);
    let sent = t.data.as_ptr();
    let mut spent = Vec::new();
    a.send_one(t, &mut |buf| spent.push(buf));
    assert_eq!(spent.iter().map(|b| b.as_ptr()).collect::<Vec<_>>(), [sent]);
    let got = pump_until(&a, &b, 1);
    assert_eq!(
        got,
        [Got {
            data: b"one datagram".to_vec(),
            train: None
        }]
    );
    assert_eq!(stat(&a, "shm_tx_datagrams"), before + 1);
    // 127.0.0.2 has no softverbs device: no channel, and no UDP in Only.
    let mut t = dgram(&a, &b, b"nowhere", None);
    t.dst = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    a.send_one(t, &mut drop);
    assert_eq!(stat(&a, "shm_tx_no_channel"), 1);
    assert_eq!(stat(&a, "shm_tx_datagrams"), before + 1);
}
