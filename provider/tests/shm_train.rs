//! Trains on the shared-memory link: large RC SENDs and RDMA WRITEs from
//! memfd-backed buffers go as one slot each, the receiver copying the
//! payload once out of its mapping of the sender's buffer (or, for other
//! registered memory, with cross-memory attach). Two devices of
//! one process, each on its own link, exactly as two processes would be.

mod udp_common;

use std::sync::Arc;
use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::shm::{ShmLink, ShmMode};
use softverbs::soft::link::udp::{UdpConfig, UdpLink, UdpPort};
use softverbs::soft::link::{Diagnostics, Link, Trains};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;
use udp_common::*;

const MIB: u32 = 1 << 20;

fn shm_device(engine: EngineMode, trains: bool) -> (Arc<SoftDevice>, Arc<ShmLink>) {
    let mut udp = UdpConfig::new(LO4);
    udp.port = UdpPort::Fixed(free_private_port(LO4));
    let udp = UdpLink::bind(&udp).expect("bind");
    let addrs = udp.gids().iter().map(|g| g.to_ip()).collect();
    let link = ShmLink::new(udp, ShmMode::Only).expect("shm link");
    link.set_trains(trains);
    let cfg = SoftDeviceConfig {
        addrs,
        link: Some(link.clone() as Arc<dyn Link>),
        engine,
        ..SoftDeviceConfig::new(&unique("shmtrain"), LO4)
    };
    (SoftDevice::create(cfg).expect("create"), link)
}

/// Local ACK timeout of the QPs of these tests: 4.096 µs · 2^21 ≈ 8.6 s.
/// The tests count trains, and a retransmitted message goes as a train
/// again: with the usual 67 ms (14), a receiver whose thread waits that
/// long for a CPU (a loaded machine) gets the message twice, which is
/// correct RC behaviour but not what these tests count. The shared-memory
/// path loses nothing, so with this timeout a retransmission means a
/// receiver stalled for seconds (and the test fails, as it should).
const PATIENT: u8 = 21;

/// Connects `a` and `b` with the [`PATIENT`] ACK timeout.
fn connect_patient(a: &Side, b: &Side, mtu: Mtu) {
    connect_to_timeout(a, b.gid, b.qp.qp_num(), b.psn, mtu, PATIENT);
    connect_to_timeout(b, a.gid, a.qp.qp_num(), a.psn, mtu, PATIENT);
}

/// No retransmission happened on either device: every train counted was
/// sent once.
fn no_retransmission(da: &SoftDevice, db: &SoftDevice) {
    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(
        (ca.retransmit_timeouts, cb.retransmit_timeouts),
        (0, 0),
        "a message was retransmitted (a lost train, or a receiver stalled for seconds): {ca:?} {cb:?}"
    );
}

fn stat(link: &ShmLink, name: &str) -> u64 {
    link.stats().into_iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| v)
}

fn pattern(len: u32, seed: u8) -> Vec<u8> {
    (0..len).map(|k| ((k % 251) as u8) ^ seed).collect()
}

/// Nothing more arrives on either CQ for a while.
/// Posts a signaled RDMA WRITE of `sge` from `a` to offset `b_off` of
/// `b`'s MR and waits for its successful completion.
fn write_to(a: &Side, b: &Side, wr_id: u64, sge: &[Sge<'_>], b_off: u64) {
    let remote = RemoteAddr {
        addr: b.mr.addr() + b_off,
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&[SendWr::new(wr_id, SendOp::Write { remote }, sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (wr_id, WcStatus::Success));
}

fn quiet(a: &Side, b: &Side) {
    let more = collect(&a.scq, &[&b.rcq], Duration::from_millis(50));
    assert!(more.is_empty(), "{more:?}");
    let more = collect(&b.rcq, &[&a.scq], Duration::from_millis(50));
    assert!(more.is_empty(), "{more:?}");
}

/// Sends `b` a first message from `a`, which opens the channel (and goes
/// as a packet), and waits for both completions.
fn open_channel(a: &Side, b: &Side) {
    let sge = [b.mr.sge(0, 64).unwrap()];
    b.qp.post_recv(&[RecvWr::new(1, &sge)]).unwrap();
    let sge = [a.mr.sge(0, 64).unwrap()];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(wait_one(&b.rcq, &[&a.scq]).status, WcStatus::Success);
    assert_eq!(wait_one(&a.scq, &[&b.rcq]).status, WcStatus::Success);
}

/// A 1 MiB RDMA WRITE, a 1 MiB SEND and a SEND of two pieces from `a` to
/// `b` (4 KiB MTU), each checked for its data and for exactly one
/// completion; returns the links.
fn large_messages(engine: EngineMode, trains: bool) -> (Arc<ShmLink>, Arc<ShmLink>) {
    let ((da, la), (db, lb)) = (shm_device(engine, trains), shm_device(engine, trains));
    let (a, b) = (side(&da, 4 << 20, 100), side(&db, 4 << 20, 9000));
    connect_patient(&a, &b, Mtu::Mtu4096);
    open_channel(&a, &b);
    assert_eq!(la.train_caps(b.gid.to_ip()).any(), trains);

    // RDMA WRITE of 1 MiB at offset 4096 of a, to offset 8192 of b.
    let data = pattern(MIB, 0x11);
    a.mr.write(4096, &data).unwrap();
    write_to(&a, &b, 2, &[a.mr.sge(4096, MIB).unwrap()], 8192);
    assert_eq!(b.mr.to_vec(8192, MIB as usize).unwrap(), data);
    assert_eq!(b.mr.to_vec(8192 + u64::from(MIB), 16).unwrap(), vec![0; 16]);
    quiet(&a, &b);

    // SEND of 1 MiB into a receive buffer at 2 MiB of b.
    let data = pattern(MIB, 0x22);
    a.mr.write(0, &data).unwrap();
    let sge = [b.mr.sge(2 * MIB as u64, 2 * MIB).unwrap()];
    b.qp.post_recv(&[RecvWr::new(3, &sge)]).unwrap();
    let sge = [a.mr.sge(0, MIB).unwrap()];
    a.qp.post_send(&[SendWr::new(3, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (3, WcStatus::Success, MIB));
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (3, WcStatus::Success));
    assert_eq!(b.mr.to_vec(2 * u64::from(MIB), MIB as usize).unwrap(), data);
    quiet(&a, &b);

    // SEND of two pieces (300 KiB + 200 KiB, unaligned) of a.
    let (p1, p2) = (pattern(300 << 10, 0x33), pattern(200 << 10, 0x44));
    a.mr.write(5, &p1).unwrap();
    a.mr.write(3 * u64::from(MIB) + 1, &p2).unwrap();
    let sge = [b.mr.sge(0, MIB).unwrap()];
    b.qp.post_recv(&[RecvWr::new(4, &sge)]).unwrap();
    let sge = [
        a.mr.sge(5, 300 << 10).unwrap(),
        a.mr.sge(3 * MIB as u64 + 1, 200 << 10).unwrap(),
    ];
    a.qp.post_send(&[SendWr::new(4, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (4, WcStatus::Success, 500 << 10));
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (4, WcStatus::Success));
    assert_eq!(b.mr.to_vec(0, 500 << 10).unwrap(), [p1, p2].concat());
    quiet(&a, &b);

    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(ca.rx_dropped() + cb.rx_dropped(), 0, "{ca:?} {cb:?}");
    no_retransmission(&da, &db);
    for l in [&la, &lb] {
        assert_eq!(
            stat(l, "shm_rx_bad_train") + stat(l, "shm_rx_bad_export") + stat(l, "shm_tx_train_dropped"),
            0,
            "{:?}",
            l.stats()
        );
    }
    drop((a, b));
    da.remove();
    db.remove();
    (la, lb)
}

#[test]
fn large_messages_go_as_trains_inline() {
    let (la, lb) = large_messages(EngineMode::Inline, true);
    assert_eq!(stat(&la, "shm_tx_trains"), 3, "{:?}", la.stats());
    assert_eq!(stat(&lb, "shm_rx_trains"), 3, "{:?}", lb.stats());
    // One buffer (the MR), passed and mapped once.
    assert_eq!((stat(&la, "shm_tx_exports"), stat(&lb, "shm_rx_maps")), (1, 1));
    // A train stands for 256 packets: far fewer slots than packets.
    assert!(stat(&la, "shm_tx_datagrams") < 64, "{:?}", la.stats());
}

#[test]
fn large_messages_go_as_trains_with_sleeping_progress_threads() {
    let sleepy = EngineMode::ProgressThread { spin: Duration::ZERO };
    let (la, lb) = large_messages(sleepy, true);
    assert_eq!(stat(&la, "shm_tx_trains"), 3, "{:?}", la.stats());
    assert_eq!(stat(&lb, "shm_rx_trains"), 3, "{:?}", lb.stats());
}

#[test]
fn without_trains_large_messages_go_as_packets() {
    let (la, lb) = large_messages(EngineMode::Inline, false);
    assert_eq!(stat(&la, "shm_tx_trains") + stat(&lb, "shm_rx_trains"), 0);
    // 256 + 256 + 125 packets at 4 KiB, and the first message.
    assert!(stat(&la, "shm_tx_datagrams") > 637, "{:?}", la.stats());
}

/// An RDMA WRITE and a SEND of 512 KiB each from caller-owned memory
/// (`Pd::reg_mr_raw`, not shareable) between devices on two links: where
/// each side verified with the probe that it may read the other's memory
/// (always, for two links of one process, unless the system forbids
/// `process_vm_readv` on ourselves), they go as trains the receiver copies
/// with cross-memory attach, else as packets. Data, one completion each.
#[test]
fn raw_memory_goes_as_cma_trains() {
    const LEN: u32 = 512 << 10;
    let engine = EngineMode::Inline;
    let ((da, la), (db, lb)) = (shm_device(engine, true), shm_device(engine, true));
    let (a, b) = (side(&da, 1 << 20, 100), side(&db, 2 << 20, 9000));
    connect_patient(&a, &b, Mtu::Mtu4096);
    // Caller-owned source, kept alive (and not touched) until dereg.
    let mut raw: Box<[u8]> = pattern(LEN + 100, 0x5a).into_boxed_slice();
    // SAFETY: `raw` lives until the end of the test, after `raw_mr` is
    // dropped (deregistered), and is not accessed while registered.
    let region = unsafe { RawRegion::new(raw.as_mut_ptr(), raw.len()) };
    let raw_mr = a.pd.reg_mr_raw(region, AccessFlags::LOCAL_WRITE).unwrap();
    let src = pattern(LEN + 100, 0x5a);
    let data = src[..LEN as usize].to_vec();

    // The first message opens the channel (and goes as packets).
    let sge = [b.mr.sge(0, 64).unwrap()];
    b.qp.post_recv(&[RecvWr::new(1, &sge)]).unwrap();
    let sge = [a.mr.sge(0, 64).unwrap()];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(wait_one(&b.rcq, &[&a.scq]).status, WcStatus::Success);
    assert_eq!(wait_one(&a.scq, &[&b.rcq]).status, WcStatus::Success);
    let cma = la.train_caps(b.gid.to_ip()).process;
    if !cma {
        println!(
            "CMA not available here (process_vm_readv probe failed): raw memory goes as packets; {:?}",
            la.peers()
        );
    }

    // RDMA WRITE of 512 KiB from offset 100 of the raw region.
    write_to(&a, &b, 2, &[raw_mr.sge(100, LEN).unwrap()], 4096);
    assert_eq!(b.mr.to_vec(4096, LEN as usize).unwrap(), src[100..].to_vec());
    quiet(&a, &b);

    // SEND of 512 KiB from the start of the raw region.
    let sge = [b.mr.sge(1 << 20, LEN + 4096).unwrap()];
    b.qp.post_recv(&[RecvWr::new(3, &sge)]).unwrap();
    let sge = [raw_mr.sge(0, LEN).unwrap()];
    a.qp.post_send(&[SendWr::new(3, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (3, WcStatus::Success, LEN));
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status), (3, WcStatus::Success));
    assert_eq!(b.mr.to_vec(1 << 20, LEN as usize).unwrap(), data);
    quiet(&a, &b);

    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(ca.rx_dropped() + cb.rx_dropped(), 0, "{ca:?} {cb:?}");
    no_retransmission(&da, &db);
    if cma {
        assert_eq!(
            stat(&la, "shm_tx_trains_cma"),
            2,
            "the link allows CMA trains but none went: the engine's TrainRoute must forward \
             Link::train_caps; {:?}",
            la.stats()
        );
        assert_eq!(stat(&lb, "shm_rx_trains_cma"), 2, "{:?}", lb.stats());
        // Nothing exported: the pieces are process memory.
        assert_eq!(stat(&la, "shm_tx_exports"), 0);
        assert!(stat(&la, "shm_tx_datagrams") < 16, "{:?}", la.stats());
    } else {
        assert_eq!(stat(&la, "shm_tx_trains") + stat(&lb, "shm_rx_trains"), 0);
        assert!(stat(&la, "shm_tx_datagrams") > 256, "{:?}", la.stats());
    }
    for l in [&la, &lb] {
        assert_eq!(
            stat(l, "shm_rx_bad_train") + stat(l, "shm_rx_bad_export") + stat(l, "shm_tx_train_dropped"),
            0,
            "{:?}",
            l.stats()
        );
    }
    drop(raw_mr);
    drop(raw);
    drop((a, b));
    da.remove();
    db.remove();
}

/// A 64 KiB WRITE from heap memory (`Pd::alloc_mr_heap`, what a C
/// program's `ibv_reg_mr` gives) goes packet by packet, below the size
/// where cross-memory attach pays; the same from the provider's own
/// memory (`Pd::alloc_mr`) goes as one train. Data arrives either way.
#[test]
fn heap_memory_goes_as_packets_and_provider_memory_as_a_train() {
    const LEN: u32 = 64 << 10;
    let engine = EngineMode::Inline;
    let ((da, la), (db, _lb)) = (shm_device(engine, true), shm_device(engine, true));
    let (a, b) = (side(&da, 1 << 20, 100), side(&db, 1 << 20, 9000));
    connect_patient(&a, &b, Mtu::Mtu4096);
    open_channel(&a, &b);
    let heap = a.pd.alloc_mr_heap(LEN as usize, AccessFlags::LOCAL_WRITE).unwrap();
    let data = pattern(LEN, 0x33);
    heap.write(0, &data).unwrap();
    let (trains, datagrams) = (stat(&la, "shm_tx_trains"), stat(&la, "shm_tx_datagrams"));
    write_to(&a, &b, 2, &[heap.sge(0, LEN).unwrap()], 0);
    assert_eq!(b.mr.to_vec(0, LEN as usize).unwrap(), data);
    quiet(&a, &b);
    assert_eq!(stat(&la, "shm_tx_trains"), trains, "{:?}", la.stats());
    assert!(stat(&la, "shm_tx_datagrams") - datagrams >= 16, "{:?}", la.stats());

    let data = pattern(LEN, 0x44);
    a.mr.write(0, &data).unwrap();
    write_to(&a, &b, 3, &[a.mr.sge(0, LEN).unwrap()], 0);
    assert_eq!(b.mr.to_vec(0, LEN as usize).unwrap(), data);
    quiet(&a, &b);
    assert_eq!(stat(&la, "shm_tx_trains"), trains + 1, "{:?}", la.stats());
    no_retransmission(&da, &db);
    drop(heap);
    drop((a, b));
    da.remove();
    db.remove();
}

/// At MTU 4096, messages of one packet from 2 KiB (a 4 KiB WRITE, a
/// 3,000-byte SEND, a 2,500-byte READ's response) go as trains between
/// two shared-memory links that both take them; a 2,047-byte WRITE goes as
/// a packet. Data and one completion each.
#[test]
fn messages_of_one_packet_go_as_trains() {
    let ((da, la), (db, lb)) = (
        shm_device(EngineMode::Inline, true),
        shm_device(EngineMode::Inline, true),
    );
    let (a, b) = (side(&da, 1 << 20, 100), side(&db, 1 << 20, 9000));
    connect_patient(&a, &b, Mtu::Mtu4096);
    open_channel(&a, &b);
    let caps = la.train_caps(b.gid.to_ip());
    assert!(caps.shared && caps.one_packet, "{caps:?}");
    let trains = |l: &ShmLink| (stat(l, "shm_tx_trains"), stat(l, "shm_rx_trains"));

    // WRITE of 4 KiB, then of 2,047 bytes (below the threshold).
    let data = pattern(4096, 0x51);
    a.mr.write(8192, &data).unwrap();
    write_to(&a, &b, 2, &[a.mr.sge(8192, 4096).unwrap()], 4096);
    assert_eq!(b.mr.to_vec(4096, 4096).unwrap(), data);
    assert_eq!((trains(&la), trains(&lb)), ((1, 0), (0, 1)));
    write_to(&a, &b, 3, &[a.mr.sge(8192, 2047).unwrap()], 65536);
    assert_eq!(b.mr.to_vec(65536, 2047).unwrap(), data[..2047].to_vec());
    assert_eq!((trains(&la), trains(&lb)), ((1, 0), (0, 1)));

    // SEND of 3,000 bytes into an 8 KiB receive buffer.
    let data = pattern(3000, 0x62);
    a.mr.write(16384, &data).unwrap();
    let sge = [b.mr.sge(131072, 8192).unwrap()];
    b.qp.post_recv(&[RecvWr::new(4, &sge)]).unwrap();
    let sge = [a.mr.sge(16384, 3000).unwrap()];
    a.qp.post_send(&[SendWr::new(4, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let r = wait_one(&b.rcq, &[&a.scq]);
    assert_eq!((r.wr_id, r.status, r.byte_len), (4, WcStatus::Success, 3000));
    assert_eq!(wait_one(&a.scq, &[&b.rcq]).status, WcStatus::Success);
    assert_eq!(b.mr.to_vec(131072, 3000).unwrap(), data);
    assert_eq!((trains(&la), trains(&lb)), ((2, 0), (0, 2)));

    // READ of 2,500 bytes of b: its response is b's train.
    let data = pattern(2500, 0x73);
    b.mr.write(200_000, &data).unwrap();
    let remote = RemoteAddr {
        addr: b.mr.addr() + 200_000,
        rkey: b.mr.rkey(),
    };
    let sge = [a.mr.sge(300_000, 2500).unwrap()];
    a.qp.post_send(&[SendWr::new(5, SendOp::Read { remote }, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let s = wait_one(&a.scq, &[&b.rcq]);
    assert_eq!((s.wr_id, s.status, s.byte_len), (5, WcStatus::Success, 2500));
    assert_eq!(a.mr.to_vec(300_000, 2500).unwrap(), data);
    assert_eq!((trains(&la), trains(&lb)), ((2, 1), (1, 2)));
    quiet(&a, &b);

    let (ca, cb) = (da.shared().counters(), db.shared().counters());
    assert_eq!(ca.rx_dropped() + cb.rx_dropped(), 0, "{ca:?} {cb:?}");
    no_retransmission(&da, &db);
    drop((a, b));
    da.remove();
    db.remove();
}
