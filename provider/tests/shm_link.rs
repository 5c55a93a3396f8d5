//! The shared-memory link between soft devices (here of one process, each
//! with its own link, exactly as two processes would be): RC traffic over
//! the rings, the doorbell of sleeping progress threads, and a peer that
//! scribbles on the rings.

mod udp_common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::shm::ring::{self, Consumer, Popped, Producer, PushError, Region, SlotMeta};
use softverbs::soft::link::shm::{ShmLink, ShmMode};
use softverbs::soft::link::udp::{UdpConfig, UdpLink, UdpPort};
use softverbs::soft::link::{Diagnostics, Link};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;
use udp_common::*;

fn shm_device(mode: ShmMode, engine: EngineMode) -> (Arc<SoftDevice>, Arc<ShmLink>) {
    let mut udp = UdpConfig::new(LO4);
    udp.port = UdpPort::Fixed(free_private_port(LO4));
    let udp = UdpLink::bind(&udp).expect("bind");
    let addrs = udp.gids().iter().map(|g| g.to_ip()).collect();
    let link = ShmLink::new(udp, mode).expect("shm link");
    // These tests cover the packet path through the rings (trains, which
    // would carry the large messages, are tested in shm_train.rs).
    link.set_trains(false);
    let cfg = SoftDeviceConfig {
        addrs,
        link: Some(link.clone() as Arc<dyn Link>),
        engine,
        ..SoftDeviceConfig::new(&unique("shm"), LO4)
    };
    (SoftDevice::create(cfg).expect("create"), link)
}

fn stat(link: &ShmLink, name: &str) -> u64 {
    link.stats().into_iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| v)
}

fn send_one(a: &Side, b: &Side, i: u64, len: u32) {
    let sge = [b.mr.sge(0, 8192).unwrap()];
    b.qp.post_recv(&[RecvWr::new(100 + i, &sge)]).unwrap();
    let payload: Vec<u8> = (0..len).map(|k| (k as u8) ^ (i as u8) ^ 0x5a).collect();
    a.mr.write(0, &payload).unwrap();
    let sge = [a.mr.sge(0, len).unwrap()];
    a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (100 + i, WcStatus::Success, len));
    assert_eq!(b.mr.to_vec(0, len as usize).unwrap(), payload);
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (i, WcStatus::Success));
}

/// An 8-byte inline SEND from `a` to `b`: a lone one-packet message,
/// which the send fast path takes (and in inline mode hands to the link
/// at once).
fn send_inline(a: &Side, b: &Side, i: u64) {
    let sge = [b.mr.sge(0, 64).unwrap()];
    b.qp.post_recv(&[RecvWr::new(200 + i, &sge)]).unwrap();
    let payload = (i ^ 0x1234_5678_9abc_def0).to_le_bytes();
    let sge = [Sge::inline(&payload)];
    a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge).flags(SendFlags::SIGNALED | SendFlags::INLINE)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (200 + i, WcStatus::Success, 8));
    assert_eq!(b.mr.to_vec(0, 8).unwrap(), payload);
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (i, WcStatus::Success));
}

fn traffic(engine_a: EngineMode, engine_b: EngineMode, mode: ShmMode) -> (Arc<ShmLink>, Arc<ShmLink>) {
    let ((da, la), (db, lb)) = (shm_device(mode, engine_a), shm_device(mode, engine_b));
    let (a, b) = (side(&da, 1 << 20, 100), side(&db, 1 << 20, 9000));
    connect(&a, &b, Mtu::Mtu4096);
    for (i, len) in [8u32, 1000, 5000, 1, 8192].into_iter().enumerate() {
        send_one(&a, &b, i as u64, len);
        send_one(&b, &a, 50 + i as u64, len);
    }
    if mode == ShmMode::Auto {
        // `Auto` sends by UDP while the link's setup thread opens the
        // channel; the inline SENDs below are to take it.
        let up = |l: &ShmLink| l.peer_lines().iter().any(|p| p.contains(" shm up "));
        let start = std::time::Instant::now();
        let mut i = 0;
        while !(up(&la) && up(&lb)) && start.elapsed() < Duration::from_secs(60) {
            send_one(&a, &b, 1000 + i, 8);
            i += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for i in 0..3 {
        send_inline(&a, &b, 20 + i);
        send_inline(&b, &a, 70 + i);
    }
    // Their packets left at once from an inline engine, never from a
    // progress thread's (which sends them itself).
    for (d, engine) in [(&da, engine_a), (&db, engine_b)] {
        let c = d.shared().counters();
        let expected = if engine == EngineMode::Inline { 3 } else { 0 };
        assert_eq!((c.tx_fast, c.tx_eager), (3, expected), "{engine:?} {c:?}");
    }
    // A 1 MiB RDMA WRITE: 256 packets in a 512-slot ring.
    let data: Vec<u8> = (0..1 << 20).map(|k: u32| (k % 251) as u8).collect();
    a.mr.write(0, &data).unwrap();
    let sge = [a.mr.sge(0, 1 << 20).unwrap()];
    let remote = RemoteAddr {
        addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&[SendWr::new(7, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (7, WcStatus::Success));
    assert_eq!(b.mr.to_vec(0, 1 << 20).unwrap(), data);
    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(ca.rx_dropped() + cb.rx_dropped(), 0, "{ca:?} {cb:?}");
    assert!(stat(&la, "shm_tx_datagrams") > 256, "{:?}", la.stats());
    assert!(stat(&lb, "shm_rx_datagrams") > 256, "{:?}", lb.stats());
    let peers = la.peer_lines();
    assert!(peers.iter().any(|p| p.contains(" shm up pid ")), "{peers:?}");
    assert!(da.shared().link_peers().iter().any(|p| p.contains(" shm up ")));
    if mode == ShmMode::Only {
        assert_eq!(stat(&la, "udp_tx_datagrams") + stat(&lb, "udp_tx_datagrams"), 0);
    }
    drop((a, b));
    da.remove();
    db.remove();
    (la, lb)
}

/// Doorbells `a` rang while 100 inline SENDs went each way between two
/// busy-polling inline devices, after `b`'s application took its
/// context's event descriptor (`b` driven by a thread of the caller's
/// own if `external`).
fn doorbells_with_a_watched_descriptor(external: bool) -> u64 {
    use std::os::fd::AsFd;
    let ((da, la), (db, _lb)) = (
        shm_device(ShmMode::Only, EngineMode::Inline),
        shm_device(ShmMode::Only, EngineMode::Inline),
    );
    if external {
        db.shared().set_driven_externally();
    }
    let (a, b) = (side(&da, 1 << 16, 100), side(&db, 1 << 16, 9000));
    connect(&a, &b, Mtu::Mtu4096);
    let _fd = b.ctx.as_fd();
    send_inline(&a, &b, 0);
    let before = stat(&la, "shm_doorbells");
    for i in 1..=100 {
        send_inline(&a, &b, i);
        send_inline(&b, &a, 1000 + i);
    }
    let rung = stat(&la, "shm_doorbells") - before;
    drop((a, b));
    da.remove();
    db.remove();
    rung
}

#[test]
fn a_device_driven_by_its_own_thread_keeps_busy_peers_off_the_doorbell() {
    // Inline mode on a network link: an application that may sleep on the
    // context's descriptor needs every datagram signalled, so taking the
    // descriptor makes peers ring the doorbell for each one.
    let watched = doorbells_with_a_watched_descriptor(false);
    assert!(watched >= 100, "a watched link was rung only {watched} times");
    // With a thread of the embedding library driving the device (as the
    // C library's progress thread does), the descriptor is the eventfd
    // alone, and a busy-polling peer makes no system call per message.
    let driven = doorbells_with_a_watched_descriptor(true);
    assert!(driven < 10, "a link driven by its own thread was rung {driven} times");
}

#[test]
fn rc_send_and_write_over_shared_memory_inline() {
    traffic(EngineMode::Inline, EngineMode::Inline, ShmMode::Only);
}

#[test]
fn auto_mode_switches_to_shared_memory() {
    let (la, _) = traffic(EngineMode::Inline, EngineMode::Inline, ShmMode::Auto);
    assert_eq!(la.mode(), ShmMode::Auto);
}

#[test]
fn sleeping_progress_threads_are_woken_by_the_doorbell() {
    let sleepy = EngineMode::ProgressThread { spin: Duration::ZERO };
    let (la, lb) = traffic(sleepy, sleepy, ShmMode::Only);
    assert!(
        stat(&la, "shm_doorbells") + stat(&lb, "shm_doorbells") > 0,
        "{:?} {:?}",
        la.stats(),
        lb.stats()
    );
}

/// Device `a` (`Auto`, engine `engine`) with a shared-memory channel up
/// to `b`, and a second QP `a2` on it connected to `c` on a UDP-only
/// device, whose local ACK timeout is `c_timeout`.
struct BesideChannel {
    da: Arc<SoftDevice>,
    la: Arc<ShmLink>,
    devs: [Arc<SoftDevice>; 2],
    sides: [Side; 2],
    a2: Side,
    c: Side,
}

fn udp_peer_beside_channel(engine: EngineMode, c_timeout: u8) -> BesideChannel {
    let ((da, la), (db, _lb)) = (
        shm_device(ShmMode::Auto, engine),
        shm_device(ShmMode::Auto, EngineMode::Inline),
    );
    let dc = device(LO4, EngineMode::Inline);
    let (a, b) = (side(&da, 1 << 16, 100), side(&db, 1 << 16, 200));
    connect(&a, &b, Mtu::Mtu1024);
    // Traffic until the channel between a and b is up (Auto sends by UDP
    // while it is not).
    let mut i = 0;
    eventually("a shared-memory channel", || {
        send_one(&b, &a, i, 8);
        i += 1;
        la.peer_lines().iter().any(|p| p.contains(" shm up "))
    });
    let (a2, c) = (side(&da, 1 << 16, 300), side(&dc, 1 << 16, 400));
    connect_to(&a2, c.gid, c.qp.qp_num(), c.psn, Mtu::Mtu1024);
    connect_to_timeout(&c, a2.gid, a2.qp.qp_num(), a2.psn, Mtu::Mtu1024, c_timeout);
    BesideChannel {
        da,
        la,
        devs: [db, dc],
        sides: [a, b],
        a2,
        c,
    }
}

impl BesideChannel {
    fn remove(self) {
        let BesideChannel {
            da, devs, sides, a2, c, ..
        } = self;
        drop((sides, a2, c));
        da.remove();
        for d in devs {
            d.remove();
        }
    }
}

/// A device in `Auto` mode whose progress thread sleeps (no spin), with
/// a shared-memory channel up, must still hear a peer it reaches by UDP
/// only: its poller is edge-triggered, so the turn it wakes for must read
/// the socket. The UDP peer's retransmission timeout (4.3 s) is far above
/// the wait allowed, so a datagram left in the socket fails the test.
#[test]
fn a_sleeping_auto_device_hears_a_udp_only_peer() {
    let t = udp_peer_beside_channel(EngineMode::ProgressThread { spin: Duration::ZERO }, 20);
    let (a2, c, la) = (&t.a2, &t.c, &t.la);
    for k in 0..4u64 {
        let sge = [a2.mr.sge(0, 64).unwrap()];
        a2.qp.post_recv(&[RecvWr::new(k, &sge)]).unwrap();
        // Long enough for a's thread to fall asleep again.
        std::thread::sleep(Duration::from_millis(20));
        let sge = [c.mr.sge(0, 8).unwrap()];
        c.qp.post_send(&[SendWr::new(k, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
            .unwrap();
        let start = Instant::now();
        let mut wc = [WorkCompletion::default()];
        while a2.rcq.poll(&mut wc).unwrap() == 0 {
            let _ = c.scq.poll(&mut []);
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "message {k} from the UDP peer not received: {:?}",
                la.udp().stats()
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (k, WcStatus::Success));
        let s = wait_one(&c.scq, &[]);
        assert_eq!((s.wr_id, s.status), (k, WcStatus::Success));
    }
    assert!(la.peer_lines().iter().any(|p| p.contains(" shm up ")));
    t.remove();
}

/// An inline application's own event loop calls `drive` once per
/// readiness event of the link's descriptors (its poller may be
/// edge-triggered): with a shared-memory channel up, that one call must
/// read what a UDP-only peer sent, as on a plain UDP device (`udp_link.rs`).
#[test]
fn one_drive_reads_a_udp_only_peer_beside_a_channel() {
    let t = udp_peer_beside_channel(EngineMode::Inline, 14);
    let (a2, c, la) = (&t.a2, &t.c, &t.la);
    let udp_rx = || stat(la, "udp_rx_datagrams");
    for round in 0..3u64 {
        for k in 0..5u64 {
            let sge = [a2.mr.sge(64 * k, 64).unwrap()];
            a2.qp.post_recv(&[RecvWr::new(k, &sge)]).unwrap();
        }
        let before = udp_rx();
        for k in 0..5u64 {
            let sge = [c.mr.sge(0, 8).unwrap()];
            // The last one signaled: it asks for the ACK that covers all.
            let flags = if k == 4 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            c.qp.post_send(&[SendWr::new(k, SendOp::Send, &sge).flags(flags)])
                .unwrap();
        }
        // Posting on an inline device sends at once; let the datagrams land.
        std::thread::sleep(Duration::from_millis(50));
        t.da.shared().drive();
        assert_eq!(udp_rx() - before, 5, "round {round}: one drive read all five");
        let got = collect(&a2.rcq, &[], Duration::from_millis(20));
        assert_eq!(got.len(), 5, "round {round}");
        assert!(got.iter().all(|w| w.status == WcStatus::Success));
        // c has its ACK before the next round (no retransmission then).
        let s = wait_one(&c.scq, &[&a2.rcq]);
        assert_eq!((s.wr_id, s.status), (4, WcStatus::Success));
    }
    t.remove();
}

/// Plays a broken or hostile peer: writes into the ring the other device
/// reads, through the memfd. The reader must drop and count, never panic
/// or read outside the mapping.
#[test]
fn garbage_in_the_ring_is_dropped_and_counted() {
    let ((da, la), (db, lb)) = (
        shm_device(ShmMode::Only, EngineMode::Inline),
        shm_device(ShmMode::Only, EngineMode::Inline),
    );
    let (a, b) = (side(&da, 1 << 16, 100), side(&db, 1 << 16, 9000));
    connect(&a, &b, Mtu::Mtu1024);
    send_one(&a, &b, 1, 100); // a connects: it writes ring 0, b reads it
    let files = la.channel_files();
    assert_eq!(files.len(), 1);
    let (f, connector) = &files[0];
    assert!(connector);
    let drive_b = || {
        let mut wc = [WorkCompletion::default(); 4];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            let _ = b.rcq.poll(&mut wc);
        }
    };
    // The next slot b will read (a sends nothing meanwhile).
    let region = Region::open(f.try_clone().unwrap()).unwrap();
    let h = Producer::resume(&region, 0).position().0;
    let no_meta = SlotMeta {
        src: "::".parse().unwrap(),
        dst: "::".parse().unwrap(),
        src_port: 1,
        dst_port: 4791,
    };
    // Writes slot `i`'s header (`seq` last, as a producer does).
    let forge = |i: u64, len: u16, flags: u16| {
        let hdr = ring::slot_header(i, len, 0, ring::KIND_DATAGRAM, flags, &no_meta);
        let slot = ring::slot_offset(0, i);
        f.write_all_at(&hdr[4..], slot + 4).unwrap();
        f.write_all_at(&hdr[..4], slot).unwrap();
    };
    // An impossible length.
    forge(h, 0xfff0, 0);
    drive_b();
    assert_eq!(stat(&lb, "shm_rx_bad_len"), 1, "{:?}", lb.stats());
    // A plausible datagram from an address that is not the peer's.
    f.write_all_at(&[1u8; 32], ring::slot_offset(0, h + 1) + 16).unwrap();
    forge(h + 1, 100, ring::FLAG_ADDRS);
    drive_b();
    assert_eq!(stat(&lb, "shm_rx_bad_addr"), 1, "{:?}", lb.stats());
    // An impossible `seq`: the channel is given up.
    f.write_all_at(&0x00de_ad00u32.to_ne_bytes(), ring::slot_offset(0, h + 2))
        .unwrap();
    drive_b();
    assert_eq!(stat(&lb, "shm_rx_bad_index"), 1, "{:?}", lb.stats());
    assert!(
        !lb.peer_lines().iter().any(|p| p.contains(" shm up ")),
        "{:?}",
        lb.peer_lines()
    );
    let c = db.shared().counters();
    assert!(c.rx_malformed >= 2, "{c:?}");
    drop((a, b));
    da.remove();
    db.remove();
}

/// Random bytes over a ring's control block and slots, again and again:
/// the consumer never panics and never hands out more than a slot holds; a
/// producer facing an impossible consumer index refuses to write.
#[test]
fn ring_survives_random_scribbles() {
    let region = Region::create().unwrap();
    let peer = region.file().try_clone().unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut buf = Vec::new();
    let mut seen = 0;
    for round in 0..200 {
        let mut c = Consumer::new(0);
        for _ in 0..64 {
            let what = rnd() % 4;
            let k = rnd() % 4;
            let off = match what {
                // A plausible publication of one of the first slots: the
                // `seq` a reader expects there, random lengths beside it.
                0 => ring::slot_offset(0, k),
                1 => ring::slot_offset(0, rnd()) + rnd() % 64,
                2 => ring::slot_offset(0, rnd()) + rnd() % ring::SLOT_LEN as u64,
                _ => ring::tail_offset(0) + rnd() % ring::RING_LEN as u64,
            };
            let v = if what == 0 {
                (k + 1) | (rnd() % (1 << 14)) << 32
            } else if round % 2 == 0 {
                rnd() % (2 * ring::SLOTS)
            } else {
                rnd()
            };
            peer.write_all_at(&v.to_ne_bytes(), off.min((ring::REGION_LEN - 8) as u64))
                .unwrap();
        }
        for _ in 0..2 * ring::SLOTS {
            match c.pop(&region, &mut buf) {
                Ok(Some(Popped::Datagram(_))) => {
                    assert!(buf.len() <= ring::MAX_PAYLOAD);
                    seen += 1;
                }
                Ok(Some(Popped::BadLength)) => {}
                Ok(None) | Err(()) => break,
            }
        }
    }
    assert!(seen > 0, "some scribbles look like datagrams");
    // A consumer index beyond what was produced.
    let mut p = Producer::new(1);
    let meta = SlotMeta {
        src: LO4,
        dst: LO4,
        src_port: 1,
        dst_port: 2,
    };
    for _ in 0..ring::SLOTS {
        p.push(&region, &meta, b"x").unwrap();
    }
    peer.write_all_at(&u64::MAX.to_ne_bytes(), ring::tail_offset(1))
        .unwrap();
    assert_eq!(p.push(&region, &meta, b"x"), Err(PushError::Corrupt));
    // A region that is not sealed is refused.
    let f = tempfile_like();
    f.set_len(ring::REGION_LEN as u64).unwrap();
    assert!(Region::open(f).is_err());
}

fn tempfile_like() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("softverbs-shm-test-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    f
}
