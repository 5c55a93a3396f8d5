//! Trains: a packet's payload read from the sender's registered memory
//! (shared, or another process's through CMA) in order and bounded per
//! receive turn, the export table's bounds, and hostile train slots and
//! descriptors, dropped and counted.

use super::*;

fn content(mem: &SharedMemory, offset: u64, len: u32) -> Vec<u8> {
    let p = mem.piece(offset, len as usize).unwrap();
    let dst = MemorySource::Owned(MrMemory::new(len as usize).unwrap());
    dst.write_piece(0, p).unwrap();
    let mut v = vec![0; len as usize];
    dst.read_at(0, &mut v).unwrap();
    v
}

/// The test writing `a`'s ring towards `b` itself, as a hostile peer
/// would (`a` must not send meanwhile).
struct Forger {
    region: Region,
    p: Producer,
    meta: SlotMeta,
}

impl Forger {
    fn new(a: &ShmLink, b: &ShmLink) -> Forger {
        let region = Region::open(channel(a).region.file().try_clone().unwrap()).unwrap();
        let p = Producer::resume(&region, 0);
        let meta = SlotMeta {
            src: ip(a),
            dst: ip(b),
            src_port: 1,
            dst_port: 4791,
        };
        Forger { region, p, meta }
    }

    /// Publishes a train slot: packet `data`, descriptor bytes `desc`.
    fn train(&mut self, data: &[u8], desc: &[u8]) {
        self.p
            .push_ext(&self.region, &self.meta, ring::KIND_TRAIN, data, desc)
            .unwrap();
    }
}

/// The wire form of a descriptor of one packet over `pieces`, whether or
/// not `TrainDesc::decode` would accept it.
fn raw_desc(pieces: &[DescPiece]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for p in pieces {
        v.extend_from_slice(&p.token.to_le_bytes());
        v.extend_from_slice(&p.offset.to_le_bytes());
        v.extend_from_slice(&p.len.to_le_bytes());
    }
    v
}
#[test]
fn trains_carry_the_senders_memory_in_order() {
    let (a, b) = pair(true, true);
    assert!(a.train_caps(ip(&b)).any() && b.train_caps(ip(&a)).any());
    assert!(!a.train_caps("127.0.0.9".parse().unwrap()).any());
    let ((_m1, s1), (_m2, s2)) = (buffer(128 << 10, 1), buffer(64 << 10, 2));
    let t1 = train(18, &[(&s1, 1000, 70_000), (&s2, 5, 3000), (&s1, 0, 10)]);
    let expect: Vec<u8> = [content(&s1, 1000, 70_000), content(&s2, 5, 3000), content(&s1, 0, 10)].concat();
    // Datagrams and trains keep their order.
    let mut txs = vec![
        dgram(&a, &b, b"one", None),
        dgram(&a, &b, b"ONLY", Some(t1)),
        dgram(&a, &b, b"two", None),
        dgram(&a, &b, b"ONLY2", Some(train(1, &[(&s1, 65536, 4096)]))),
    ];
    a.send_batch(&mut txs, &mut drop);
    let got = pump_until(&a, &b, 4);
    assert_eq!(got.len(), 4, "{:?}", b.shm_stats());
    assert_eq!(
        got[0],
        Got {
            data: b"one".to_vec(),
            train: None
        }
    );
    assert_eq!(
        got[1],
        Got {
            data: b"ONLY".to_vec(),
            train: Some((18, expect))
        }
    );
    assert_eq!(
        got[2],
        Got {
            data: b"two".to_vec(),
            train: None
        }
    );
    assert_eq!(got[3].train, Some((1, content(&s1, 65536, 4096))));
    // Each buffer went over once.
    assert_eq!((stat(&a, "shm_tx_trains"), stat(&b, "shm_rx_trains")), (2, 2));
    assert_eq!((stat(&a, "shm_tx_exports"), stat(&b, "shm_rx_maps")), (2, 2));
    assert_eq!(stat(&b, "shm_rx_bad_train") + stat(&b, "shm_rx_bad_export"), 0);
    assert!(
        b.peer_lines()[0].contains(" trains exported 0 mapped 2"),
        "{:?}",
        b.peer_lines()
    );
    assert!(
        a.peer_lines()[0].contains(" trains exported 2 mapped 0"),
        "{:?}",
        a.peer_lines()
    );
    // The other way too.
    let (_m3, s3) = buffer(64 << 10, 3);
    b.send(dgram(&b, &a, b"back", Some(train(16, &[(&s3, 0, 64 << 10)]))));
    let got = pump_until(&b, &a, 1);
    assert_eq!(got[0].train, Some((16, content(&s3, 0, 64 << 10))));
    // Not offered any more: no trains, and one sent anyway is dropped.
    a.set_trains(false);
    assert!(!a.train_caps(ip(&b)).any());
    // No channel to there (and never UDP).
    let mut lost = dgram(&a, &b, b"x", Some(train(1, &[(&s1, 0, 1)])));
    lost.dst = "127.0.0.9".parse().unwrap();
    a.send(lost);
    assert_eq!(stat(&a, "shm_tx_train_dropped"), 1);
    assert_eq!(
        a.udp
            .stats()
            .iter()
            .find(|(k, _)| *k == "udp_tx_datagrams")
            .map_or(0, |s| s.1),
        0
    );
}

/// Sends `total` trains of `npkts` packets and `len` bytes from a linked
/// pair and returns how many trains each of the receiver's turns took
/// (each train checked against what was sent).
fn train_turns(len: u32, npkts: u32, total: usize, seed: u8) -> Vec<usize> {
    let (a, b) = pair(true, true);
    let (_m, s) = buffer(len as usize, seed);
    let mut txs: Vec<Transmit> = (0..total)
        .map(|_| dgram(&a, &b, b"T", Some(train(npkts, &[(&s, 0, len)]))))
        .collect();
    a.send_batch(&mut txs, &mut drop);
    let mut turns = Vec::new();
    let start = Instant::now();
    while turns.iter().sum::<usize>() < total && start.elapsed() < Duration::from_secs(10) {
        let mut got = Vec::new();
        pump(&b, &mut got);
        if !got.is_empty() {
            assert!(got.iter().all(|g| g.train == Some((npkts, content(&s, 0, len)))));
            turns.push(got.len());
        }
        a.flush();
    }
    assert_eq!(turns.iter().sum::<usize>(), total, "{:?}", b.shm_stats());
    turns
}

/// A receive turn stops after the train that reaches
/// `TURN_TRAIN_BYTES` of payload, however large its datagram budget, so
/// that the ACKs of what it copied leave before it copies more.
#[test]
fn a_receive_turn_copies_a_bounded_amount() {
    let len = 128u32 << 10;
    let per_turn = super::receive::TURN_TRAIN_BYTES.div_ceil(u64::from(len)) as usize;
    let turns = train_turns(len, 32, 2 * per_turn + 1, 9);
    assert!(turns.iter().all(|&n| n <= per_turn), "trains per turn: {turns:?}");
    assert_eq!(turns[0], per_turn, "trains per turn: {turns:?}");
}

/// One receive turn takes 16 trains of 64 KiB (`perf write_bw`'s
/// messages): half of a requester's window of 512 packets, so that a
/// turn's end (its ACK) comes once per 16 trains while the sender still
/// has the other half of its window to publish.
#[test]
fn a_receive_turn_takes_half_a_window_of_64k_trains() {
    let turns = train_turns(64 << 10, 16, 20, 13);
    assert_eq!(turns[0], 16, "trains per turn: {turns:?}");
}

/// A peer that published more trains than one turn takes, then went away:
/// every train is still read, over several turns, before the channel ends
/// (a turn stopped by the byte bound has not drained the ring).
#[test]
fn a_closing_channel_is_drained_across_bounded_turns() {
    let (a, b) = pair(true, true);
    let len = 128u32 << 10;
    let (_m, s) = buffer(len as usize, 11);
    let total = 3 * super::receive::TURN_TRAIN_BYTES.div_ceil(u64::from(len)) as usize;
    let mut txs: Vec<Transmit> = (0..total)
        .map(|_| dgram(&a, &b, b"T", Some(train(32, &[(&s, 0, len)]))))
        .collect();
    a.send_batch(&mut txs, &mut drop);
    drop(a);
    // Let `b` see the close before it reads anything: the channel is
    // closing, with the whole backlog of trains still in its ring.
    let start = Instant::now();
    while channel(&b).state() != CLOSING && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
        b.slow_path(process_now());
    }
    assert_eq!(channel(&b).state(), CLOSING, "{:?}", b.peer_lines());
    let mut got = Vec::new();
    let start = Instant::now();
    while (got.len() < total || !b.chans_r().is_empty()) && start.elapsed() < Duration::from_secs(10) {
        pump(&b, &mut got);
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(got.len(), total, "{:?}", b.shm_stats());
    assert!(got.iter().all(|g| g.train == Some((32, content(&s, 0, len)))));
    assert_eq!(stat(&b, "shm_peers_lost"), 1, "{:?}", b.shm_stats());
    assert!(b.chans_r().is_empty(), "the channel ended: {:?}", b.peer_lines());
}

/// Small buffers are ranges of a slab: the slab goes over once for all of
/// them, and descriptor offsets are offsets in it.
#[test]
fn small_buffers_travel_from_their_slab() {
    let (a, b) = pair(true, true);
    let bufs: Vec<_> = (0..3).map(|i| buffer((8 << 10) + 100 * i, 20 + i as u8)).collect();
    assert!(
        bufs.iter().any(|(_, s)| s.offset() > 0),
        "small buffers share slabs (not at offset 0 of a file of their own)"
    );
    let mut files: Vec<u64> = bufs.iter().map(|(_, s)| s.token()).collect();
    files.sort_unstable();
    files.dedup();
    let mut txs: Vec<Transmit> = bufs
        .iter()
        .map(|(_, s)| dgram(&a, &b, b"T", Some(train(2, &[(s, 7, 5000), (s, 0, 3)]))))
        .collect();
    a.send_batch(&mut txs, &mut drop);
    let got = pump_until(&a, &b, bufs.len());
    assert_eq!(got.len(), bufs.len(), "{:?}", b.shm_stats());
    for (g, (_, s)) in got.iter().zip(&bufs) {
        assert_eq!(g.train, Some((2, [content(s, 7, 5000), content(s, 0, 3)].concat())));
    }
    assert_eq!(stat(&a, "shm_tx_exports"), files.len() as u64);
    // A piece past its buffer is refused by the sender's own bounds: the
    // buffer is a page-rounded range, not the whole slab.
    assert!(bufs[0].1.piece(bufs[0].1.len() as u64 - 1, 2).is_none());
}

#[test]
fn trains_need_both_ends() {
    for (offer_a, offer_b) in [(true, false), (false, true)] {
        let (a, b) = pair(offer_a, offer_b);
        assert!(!a.train_caps(ip(&b)).any() && !b.train_caps(ip(&a)).any());
        let (_m, s) = buffer(64 << 10, 0);
        a.send(dgram(&a, &b, b"ONLY", Some(train(2, &[(&s, 0, 8192)]))));
        a.send(dgram(&a, &b, b"after", None));
        let got = pump_until(&a, &b, 1);
        assert_eq!(
            got,
            vec![Got {
                data: b"after".to_vec(),
                train: None
            }]
        );
        assert_eq!(stat(&a, "shm_tx_train_dropped"), 1);
        assert_eq!(stat(&a, "shm_tx_exports"), 0);
    }
}

/// More buffers than a channel keeps exported: the least recently used
/// are forgotten (and exported again when used again), freed ones are
/// forgotten too, and the receiver never maps more than the sender
/// keeps exported.
#[test]
fn exports_are_bounded_and_freed_buffers_forgotten() {
    // A process has only so many shareable buffers (SHARE_MAX_LIVE):
    // this channel keeps fewer exported.
    const CAP: usize = 16;
    let (a, b) = pair(true, true);
    lock(&channel(&a).tx).exports.cap = CAP;
    let bufs: Vec<_> = (0..CAP + 24).map(|i| buffer(64 << 10, i as u8)).collect();
    let mut sent = 0;
    for chunk in bufs.chunks(7) {
        let mut txs: Vec<Transmit> = chunk
            .iter()
            .map(|(_, s)| dgram(&a, &b, b"T", Some(train(1, &[(s, 8, 100)]))))
            .collect();
        sent += txs.len();
        a.send_batch(&mut txs, &mut drop);
        let got = pump_until(&a, &b, chunk.len());
        assert_eq!(got.len(), chunk.len(), "{:?} {:?}", a.shm_stats(), b.shm_stats());
        for (g, (_, s)) in got.iter().zip(chunk) {
            assert_eq!(g.train, Some((1, content(s, 8, 100))));
        }
        assert!(lock(&channel(&b).rx).maps.len() <= CAP);
        assert!(lock(&channel(&a).tx).exports.map.len() <= CAP);
    }
    assert_eq!(stat(&b, "shm_rx_trains"), sent as u64);
    assert_eq!(stat(&a, "shm_tx_forgets"), 24);
    // The first buffer was forgotten: used again, exported again.
    a.send(dgram(&a, &b, b"T", Some(train(1, &[(&bufs[0].1, 0, 64)]))));
    assert_eq!(pump_until(&a, &b, 1)[0].train, Some((1, content(&bufs[0].1, 0, 64))));
    assert_eq!(stat(&a, "shm_tx_exports"), sent as u64 + 1);
    assert_eq!(stat(&b, "shm_rx_bad_train"), 0);
    // Freed buffers are forgotten by the next prune, and unmapped by
    // the receiver when it reads the forget slot.
    assert_eq!(stat(&a, "shm_tx_forgets"), 25);
    let exported = lock(&channel(&a).tx).exports.map.len();
    assert_eq!(exported, CAP);
    drop(bufs);
    channel(&a).prune_exports(&a.stats);
    assert_eq!(stat(&a, "shm_tx_forgets"), 25 + exported as u64);
    assert!(lock(&channel(&a).tx).exports.map.is_empty());
    a.send(dgram(&a, &b, b"end", None));
    pump_until(&a, &b, 1);
    assert!(lock(&channel(&b).rx).maps.is_empty());
}

/// Plays a hostile sender: train slots whose descriptors name unknown
/// buffers, reach outside them or are garbage are dropped and counted;
/// the channel stays up and a good train still goes through.
#[test]
fn hostile_train_slots_are_dropped_and_counted() {
    let (a, b) = pair(true, true);
    let (_m, s) = buffer(64 << 10, 7);
    a.send(dgram(&a, &b, b"ONLY", Some(train(1, &[(&s, 0, 16)]))));
    assert!(pump_until(&a, &b, 1)[0].train.is_some());
    // From here on the test writes a's ring itself (a must not send).
    let mut f = Forger::new(&a, &b);
    let piece = |token: u64, offset: u64, len: u32| DescPiece { token, offset, len };
    let desc = |pieces: Vec<DescPiece>| raw_desc(&pieces);
    let len = s.len() as u64;
    let tok = s.token();
    let hostile: Vec<Vec<u8>> = vec![
        desc(vec![piece(tok + 1000, 0, 16)]),                      // never exported
        desc(vec![piece(tok, len - 8, 16)]),                       // past the end
        desc(vec![piece(tok, u64::MAX - 4, 16)]),                  // wraps
        desc(vec![piece(tok, 0, 16); ring::TRAIN_MAX_PIECES + 1]), // too many
        desc(vec![]),                                              // none
        desc(vec![piece(tok, 0, 1 << 31), piece(tok, 0, 1)]),      // too long
        vec![0xff; 7],                                             // garbage
    ];
    for (i, d) in hostile.iter().enumerate() {
        f.train(b"ONLY", d);
        let got = pump_nothing(&a, &b);
        assert!(got.is_empty(), "{i}: {got:?}");
        assert_eq!(stat(&b, "shm_rx_bad_train"), i as u64 + 1, "{i}");
    }
    // A forget slot that is not a list of tokens.
    f.p.push_ext(&f.region, &NO_META, ring::KIND_FORGET, &[], &[1; 7])
        .unwrap();
    // A train from a foreign address.
    let foreign = SlotMeta {
        src: "10.9.9.9".parse().unwrap(),
        ..f.meta
    };
    f.p.push_ext(
        &f.region,
        &foreign,
        ring::KIND_TRAIN,
        b"ONLY",
        &desc(vec![piece(tok, 0, 16)]),
    )
    .unwrap();
    // And a good one, over the buffer mapped before.
    f.train(b"GOOD", &desc(vec![piece(tok, len - 16, 16)]));
    let got = pump_until(&a, &b, 1);
    assert_eq!(
        got,
        vec![Got {
            data: b"GOOD".to_vec(),
            train: Some((1, content(&s, len - 16, 16)))
        }]
    );
    assert_eq!(stat(&b, "shm_rx_bad_train"), hostile.len() as u64 + 1);
    assert_eq!(stat(&b, "shm_rx_bad_addr"), 1);
    assert_eq!(stat(&b, "shm_rx_bad_export"), 0);
    assert!(b.is_shm_peer(a.gids[0]));
    let mut c = Counters::default();
    b.merge_counters(&mut c);
    assert!(c.rx_malformed >= hostile.len() as u64 + 2, "{c:?}");
}

/// The address check runs when a slot's addresses change, and its verdict
/// holds for the slots after it that carry none: a foreign source stays
/// dropped over its address-less followers, and a good source after it is
/// checked afresh.
#[test]
fn slot_addresses_are_checked_when_they_change() {
    let (a, b) = pair(false, false);
    a.send(dgram(&a, &b, b"hello", None));
    assert_eq!(pump_until(&a, &b, 1).len(), 1);
    let mut f = Forger::new(&a, &b);
    let foreign = SlotMeta {
        src: "10.9.9.9".parse().unwrap(),
        ..f.meta
    };
    let good = f.meta;
    let mut push = |m: &SlotMeta, data: &[u8]| {
        f.p.push_ext(&f.region, m, ring::KIND_DATAGRAM, data, &[]).unwrap();
    };
    // The producer writes addresses only when they differ from the
    // previous slot's: the second and third slots carry none.
    for (m, data) in [(&foreign, b"bad1"), (&foreign, b"bad2"), (&foreign, b"bad3")] {
        push(m, data);
    }
    for (m, data) in [
        (&good, b"ok-1"),
        (&good, b"ok-2"),
        (&foreign, b"bad4"),
        (&good, b"ok-3"),
    ] {
        push(m, data);
    }
    let got = pump_until(&a, &b, 3);
    let data: Vec<&[u8]> = got.iter().map(|g| g.data.as_slice()).collect();
    assert_eq!(data, [b"ok-1", b"ok-2", b"ok-3"]);
    assert_eq!(stat(&b, "shm_rx_bad_addr"), 4);
}

/// A train slot on a channel where the receiver did not offer trains
/// is dropped.
#[test]
fn train_slots_without_the_offer_are_dropped() {
    let (a, b) = pair(true, false);
    let mut f = Forger::new(&a, &b);
    f.train(
        b"ONLY",
        &raw_desc(&[DescPiece {
            token: 1,
            offset: 0,
            len: 1,
        }]),
    );
    assert!(pump_nothing(&a, &b).is_empty());
    assert_eq!(stat(&b, "shm_rx_bad_train"), 1);
}

/// Buffers a hostile sender passes that could fault the receiver
/// (not sealed, not a memfd, of another size) are refused, and the
/// channel ends.
#[test]
fn unsafe_exports_are_refused() {
    let sealed = |len: u64, seals: libc::c_int| {
        let f = sys::memfd("test").unwrap();
        f.set_len(len).unwrap();
        // SAFETY: fcntl on a live descriptor with an integer argument.
        assert!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) } >= 0);
        OwnedFd::from(f)
    };
    let both = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    assert_eq!(map_export(sealed(8192, both), 8192).unwrap().len(), 8192);
    assert!(map_export(sealed(8192, both), 4096).is_err());
    assert!(map_export(sealed(8192, both), 1 << 20).is_err());
    assert!(map_export(sealed(0, both), 0).is_err());
    assert!(map_export(sealed(8192, libc::F_SEAL_GROW), 8192).is_err());
    assert!(map_export(sealed(8192, libc::F_SEAL_SHRINK), 8192).is_err());
    assert!(map_export(sealed(8192, 0), 8192).is_err());
    let (sock, _other) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(map_export(OwnedFd::from(sock), 0).is_err());
    let dev_zero = std::fs::File::open("/dev/zero").unwrap();
    assert!(map_export(OwnedFd::from(dev_zero), 4096).is_err());
    // A memfd of the right kind is mapped read-only and shows the
    // sender's bytes, including what it writes later.
    let f = sys::memfd("test").unwrap();
    f.set_len(4096).unwrap();
    f.write_all_at(b"abc", 100).unwrap();
    sys::seal_size(&f).unwrap();
    let map = map_export(OwnedFd::from(f.try_clone().unwrap()), 4096).unwrap();
    f.write_all_at(b"xyz", 200).unwrap();
    let mut v = [0u8; 3];
    // SAFETY: in bounds of the 4096-byte mapping.
    unsafe {
        std::ptr::copy_nonoverlapping(map.as_ptr().add(100), v.as_mut_ptr(), 3);
        assert_eq!(&v, b"abc");
        std::ptr::copy_nonoverlapping(map.as_ptr().add(200), v.as_mut_ptr(), 3);
    }
    assert_eq!(&v, b"xyz");

    // Over a channel: an unsealed memfd, then a train naming it.
    let (a, b) = pair(true, true);
    let ca = channel(&a);
    let bad = sys::memfd("bad").unwrap();
    bad.set_len(65536).unwrap();
    let mut m = [0u8; EXPORT_LEN];
    m[..8].copy_from_slice(EXPORT);
    m[8..16].copy_from_slice(&77u64.to_le_bytes());
    m[16..24].copy_from_slice(&65536u64.to_le_bytes());
    sys::send_fds(ca.stream.as_raw_fd(), &m, &[bad.as_raw_fd()]).unwrap();
    Forger::new(&a, &b).train(
        b"ONLY",
        &raw_desc(&[DescPiece {
            token: 77,
            offset: 0,
            len: 16,
        }]),
    );
    assert!(pump_nothing(&a, &b).is_empty());
    assert_eq!(stat(&b, "shm_rx_bad_export"), 1);
    assert_eq!(stat(&b, "shm_rx_bad_train"), 1);
    assert!(!b.is_shm_peer(a.gids[0]));
}

/// Both ends verified with the probe that they can read each other (two
/// links of one process: always permitted), and say so.
#[test]
fn the_cma_probe_is_verified_both_ways() {
    let (a, b) = pair(true, true);
    let (ca, cb) = (channel(&a), channel(&b));
    // The acceptor learns from the connector's caps slot, read in the
    // first receive turn (pair() already pumped it).
    for c in [&ca, &cb] {
        assert!(c.cma_rx.load(Ordering::Relaxed) && c.cma_tx.load(Ordering::Relaxed));
    }
    let all = TrainCaps {
        one_packet: true,
        ..TrainCaps::ALL
    };
    assert_eq!(a.train_caps(ip(&b)), all);
    assert_eq!(b.train_caps(ip(&a)), all);
    a.set_force_cma(true);
    assert_eq!(a.train_caps(ip(&b)), TrainCaps { shared: false, ..all });
    assert!(a.peer_lines()[0].contains(" cma rx tx"), "{:?}", a.peer_lines());
    assert_eq!(stat(&a, "shm_cma_probe_failed") + stat(&b, "shm_cma_probe_failed"), 0);
    // The probe itself: right address and value only.
    let (addr, value) = hello::probe();
    let me = std::process::id();
    assert!(hello::read_probe(me, addr, value));
    assert!(!hello::read_probe(me, addr, value ^ 1));
    assert!(!hello::read_probe(me, 8, value));
    assert!(!hello::read_probe(me, u64::MAX - 3, value));
    // Without trains, no CMA either.
    let (a, b) = pair(true, false);
    assert!(!channel(&a).cma_tx.load(Ordering::Relaxed) && !channel(&b).cma_rx.load(Ordering::Relaxed));
    assert_eq!(a.train_caps(ip(&b)), TrainCaps::NONE);
}

/// Trains whose pieces are ranges of the sender's address space (token
/// 0) are read with process_vm_readv; mixed with shareable buffers too.
#[test]
fn process_memory_trains_are_read_across() {
    let (a, b) = pair(true, true);
    let heap: Vec<u8> = (0..200_000u32).map(|k| (k % 253) as u8).collect();
    let (_m, s) = buffer(64 << 10, 9);
    let t = TrainOut {
        npkts: 50,
        pieces: vec![
            TrainPiece::Process {
                addr: heap.as_ptr() as u64 + 7,
                len: 150_000,
            },
            TrainPiece::Shared {
                mem: s.clone(),
                offset: 100,
                len: 1000,
            },
            TrainPiece::Process {
                addr: heap.as_ptr() as u64,
                len: 3,
            },
        ],
    };
    a.send(dgram(&a, &b, b"ONLY", Some(t)));
    let got = pump_until(&a, &b, 1);
    let expect = [heap[7..150_007].to_vec(), content(&s, 100, 1000), heap[..3].to_vec()].concat();
    assert_eq!(got.len(), 1, "{:?}", b.shm_stats());
    assert_eq!(got[0].train, Some((50, expect)));
    assert_eq!((stat(&a, "shm_tx_trains_cma"), stat(&b, "shm_rx_trains_cma")), (1, 1));
    assert_eq!(stat(&a, "shm_tx_exports"), 1);
    // A receiver that did not verify the sender drops them; a sender the
    // peer did not verify does not send them.
    channel(&b).cma_rx.store(false, Ordering::Relaxed);
    let t = TrainOut {
        npkts: 1,
        pieces: vec![TrainPiece::Process {
            addr: heap.as_ptr() as u64,
            len: 16,
        }],
    };
    a.send(dgram(&a, &b, b"ONLY", Some(t.clone())));
    assert!(pump_nothing(&a, &b).is_empty());
    assert_eq!(stat(&b, "shm_rx_bad_train"), 1);
    channel(&a).cma_tx.store(false, Ordering::Relaxed);
    assert_eq!(
        a.train_caps(ip(&b)),
        TrainCaps {
            one_packet: true,
            ..TrainCaps::SHARED
        }
    );
    a.send(dgram(&a, &b, b"ONLY", Some(t)));
    assert_eq!(stat(&a, "shm_tx_train_dropped"), 1);
    drop(heap);
}

/// Hostile process-memory pieces: a range that wraps is refused when the
/// descriptor is parsed; one the sender does not have mapped reaches the
/// engine, whose copy fails (the kernel checks it) without touching
/// anything but the destination.
#[test]
fn hostile_process_pieces() {
    let (a, b) = pair(true, true);
    let mut f = Forger::new(&a, &b);
    let desc = |offset: u64, len: u32| {
        raw_desc(&[DescPiece {
            token: ring::PROCESS_TOKEN,
            offset,
            len,
        }])
    };
    assert!(TrainDesc::decode(&desc(u64::MAX - 4, 16)).is_none());
    f.train(b"ONLY", &desc(u64::MAX - 4, 16));
    assert!(pump_nothing(&a, &b).is_empty());
    assert_eq!(stat(&b, "shm_rx_bad_train"), 1);
    // Address 4096 is never mapped (mmap_min_addr).
    f.train(b"ONLY", &desc(4096, 64));
    let mut results = Vec::new();
    let start = Instant::now();
    while results.is_empty() && start.elapsed() < Duration::from_secs(10) {
        b.recv(64, &mut |d| {
            let t = d.train.expect("a train");
            let dst = MemorySource::Owned(MrMemory::new(64).unwrap());
            results.push(t.for_each_range(0, 64, |p| dst.write_piece(0, p).map_err(|_| ())));
        });
    }
    assert_eq!(results, vec![Err(())]);
    assert_eq!(stat(&b, "shm_rx_trains_cma"), 1);
}
