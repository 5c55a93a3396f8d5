//! Tests of the rings: push and pop across the wrap, the sleep-flag
//! handshake, train and forget slots, hostile descriptors and slot
//! headers, and two threads sharing a region (a correct pair, and a
//! hostile peer writing what the other side reads or writes).
//!
//! They also run under Miri (`docs/testing.md`), which checks every
//! access to the region for data races and bounds: there the region is
//! private memory ([`Region::in_heap`]; Miri cannot map a memfd), and a
//! peer's writes are atomic stores of the layout's word sizes, as the
//! ring's own accesses are.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

// Every test there maps a memfd, which Miri cannot make.
#[cfg(not(miri))]
mod mutants;

/// How long a test waits for the other side (a peer thread, or the ring
/// itself) before it fails: generous, for a loaded machine (and far more
/// under Miri, whose interpreted clock runs slow).
fn bound() -> Duration {
    Duration::from_secs(if cfg!(miri) { 3600 } else { 60 })
}

/// A deadline of [`bound`] from now: [`Deadline::check`] fails the test
/// once it passed, instead of letting a loop wait forever for a ring that
/// never delivers (or never empties).
struct Deadline(Instant);

impl Deadline {
    fn new() -> Deadline {
        Deadline(Instant::now())
    }

    /// Fails the test, saying `what` did not happen, if the deadline passed.
    fn check(&self, what: impl FnOnce() -> String) {
        assert!(self.0.elapsed() < bound(), "after {:?}: {}", bound(), what());
    }
}

/// The region of a test: a memfd mapping, or private memory under Miri.
fn region() -> Region {
    if cfg!(miri) {
        Region::in_heap()
    } else {
        Region::create().unwrap()
    }
}

/// Stores `v` at byte `off` of the region as a peer would, releasing
/// what it wrote before.
fn poke32(r: &Region, off: u64, v: u32) {
    // SAFETY: the tests pass 4-aligned offsets inside the region, which
    // outlives the call.
    unsafe { at32(r.base().add(off as usize)) }.store(v, Ordering::Release);
}

/// [`poke32`] for a u64 word.
fn poke64(r: &Region, off: u64, v: u64) {
    // SAFETY: 8-aligned offsets inside the region, as in `poke32`.
    unsafe { at64(r.base().add(off as usize)) }.store(v, Ordering::Release);
}

/// The u64 word at byte `off` of the region.
fn peek64(r: &Region, off: u64) -> u64 {
    // SAFETY: as in `poke64`.
    unsafe { at64(r.base().add(off as usize)) }.load(Ordering::Acquire)
}

/// Writes the 16-byte slot header `h` at `slot` as a producer does:
/// everything but the `seq` word, then the `seq` word.
fn write_header(r: &Region, slot: u64, h: &[u8; SLOT_HDR]) {
    poke32(r, slot + 4, u32::from_ne_bytes(h[4..8].try_into().unwrap()));
    poke64(r, slot + 8, u64::from_ne_bytes(h[8..16].try_into().unwrap()));
    poke32(r, slot, u32::from_ne_bytes(h[..4].try_into().unwrap()));
}

/// A xorshift generator for the randomized tests (reproducible).
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

fn meta() -> SlotMeta {
    SlotMeta {
        src: "fd73:7665:7262:4::1".parse().unwrap(),
        dst: "127.0.0.1".parse().unwrap(),
        src_port: 0xc001,
        dst_port: 4791,
    }
}

#[test]
fn push_pop_wraps_and_fills() {
    let r = region();
    let r2 = r.alias();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    // Two laps at least (Miri runs the fewest that show the wrap).
    for round in 0..if cfg!(miri) { 2u64 } else { 3 } {
        for i in 0..SLOTS {
            let data = vec![(i + round) as u8; (i as usize * 7) % 300 + 1];
            p.push(&r, &meta(), &data).unwrap();
        }
        assert_eq!(p.push(&r, &meta(), b"x"), Err(PushError::Full));
        for i in 0..SLOTS {
            let got = c.pop(&r2, &mut buf).unwrap().unwrap();
            assert_eq!(got, Popped::Datagram(meta()));
            assert_eq!(buf, vec![(i + round) as u8; (i as usize * 7) % 300 + 1]);
        }
        assert_eq!(c.pop(&r2, &mut buf), Ok(None));
    }
    assert_eq!(p.push(&r, &meta(), &vec![0; MAX_PAYLOAD + 1]), Err(PushError::TooLong));
    p.push(&r, &meta(), &vec![9; MAX_PAYLOAD]).unwrap();
    assert!(matches!(c.pop(&r2, &mut buf), Ok(Some(Popped::Datagram(_)))));
    assert_eq!(buf.len(), MAX_PAYLOAD);
}

#[test]
fn sleep_flag_handshake() {
    let r = region();
    let mut p = Producer::new(1);
    let mut c = Consumer::new(1);
    assert!(!Producer::consumer_sleeping(&r, 1));
    assert!(c.prepare_sleep(&r));
    p.push(&r, &meta(), b"hello").unwrap();
    assert!(Producer::consumer_sleeping(&r, 1));
    assert!(!c.prepare_sleep(&r));
    c.wake(&r);
    assert!(!Producer::consumer_sleeping(&r, 1));
}

fn desc(n: usize) -> TrainDesc {
    TrainDesc {
        npkts: 3,
        pieces: (0..n as u64)
            .map(|i| DescPiece {
                token: 0x1000 + i,
                offset: i * 4096,
                len: 1000 + i as u32,
            })
            .collect(),
    }
}

#[test]
fn train_and_forget_slots_round_trip() {
    let r = region();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let packet = [7u8; 40];
    for n in [1, 2, TRAIN_MAX_PIECES] {
        let d = desc(n);
        let mut ext = Vec::new();
        d.encode(&mut ext).unwrap();
        assert_eq!(ext.len(), d.encoded_len());
        p.push_ext(&r, &meta(), KIND_TRAIN, &packet, &ext).unwrap();
        assert_eq!(c.pop_slot(&r, &mut buf), Ok(Some(Slot::Train(meta(), 40))));
        assert_eq!(&buf[..40], &packet);
        assert_eq!(TrainDesc::decode(&buf[40..]), Some(d));
    }
    let mut ext = Vec::new();
    encode_forget(&[1, 2, u64::MAX], &mut ext);
    p.push_ext(&r, &meta(), KIND_FORGET, &[], &ext).unwrap();
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(Some(Slot::Forget)));
    assert_eq!(decode_forget(&buf).unwrap().collect::<Vec<_>>(), vec![1, 2, u64::MAX]);
    // A datagram reader skips what it does not know.
    p.push_ext(&r, &meta(), KIND_TRAIN, &packet, &ext).unwrap();
    assert_eq!(c.pop(&r, &mut buf), Ok(Some(Popped::BadLength)));
    p.push(&r, &meta(), b"plain").unwrap();
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(Some(Slot::Datagram(meta()))));
    assert_eq!(buf, b"plain");
    // Lengths add up against the slot.
    let big = vec![0; MAX_PAYLOAD - 10];
    assert_eq!(
        p.push_ext(&r, &meta(), KIND_TRAIN, &big, &[0; 11]),
        Err(PushError::TooLong)
    );
    p.push_ext(&r, &meta(), KIND_TRAIN, &big, &[0; 10]).unwrap();
    assert_eq!(
        c.pop_slot(&r, &mut buf),
        Ok(Some(Slot::Train(meta(), MAX_PAYLOAD - 10)))
    );
    assert_eq!(buf.len(), MAX_PAYLOAD);
}

#[test]
fn room_counts_free_slots() {
    let r = region();
    let mut p = Producer::new(1);
    let mut c = Consumer::new(1);
    let mut buf = Vec::new();
    assert_eq!(p.room(&r, 1), Ok(SLOTS));
    for _ in 0..SLOTS - 1 {
        p.push(&r, &meta(), b"x").unwrap();
    }
    assert_eq!(p.room(&r, 2), Ok(1));
    p.push(&r, &meta(), b"x").unwrap();
    assert_eq!(p.room(&r, 1), Ok(0));
    c.pop_slot(&r, &mut buf).unwrap().unwrap();
    // The consumer frees slots when it has read all it saw.
    let deadline = Deadline::new();
    while c.pop_slot(&r, &mut buf).unwrap().is_some() {
        deadline.check(|| "the ring never ran empty".into());
    }
    assert_eq!(p.room(&r, 1), Ok(SLOTS));
    let mut q = Producer::resume(&r, 1);
    assert_eq!(q.position(), (SLOTS, SLOTS));
    q.push(&r, &meta(), b"y").unwrap();
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(Some(Slot::Datagram(meta()))));
    assert_eq!(buf, b"y");
}

#[test]
fn hostile_descriptors_are_refused() {
    let ok = {
        let mut v = Vec::new();
        desc(2).encode(&mut v).unwrap();
        v
    };
    assert!(TrainDesc::decode(&ok).is_some());
    // Truncated, padded, empty.
    assert!(TrainDesc::decode(&ok[..ok.len() - 1]).is_none());
    assert!(TrainDesc::decode(&[ok.as_slice(), &[0]].concat()).is_none());
    assert!(TrainDesc::decode(&[]).is_none());
    // No packet.
    let mut v = ok.clone();
    v[..4].copy_from_slice(&0u32.to_le_bytes());
    assert!(TrainDesc::decode(&v).is_none());
    // Piece counts: none, too many (with the length to match), huge.
    for count in [0u32, TRAIN_MAX_PIECES as u32 + 1, u32::MAX] {
        let mut v = vec![0u8; DESC_HDR + DESC_PIECE * (count as usize).min(64)];
        v[..4].copy_from_slice(&1u32.to_le_bytes());
        v[4..8].copy_from_slice(&count.to_le_bytes());
        assert!(TrainDesc::decode(&v).is_none(), "{count}");
    }
    // Lengths beyond a message, offsets that wrap.
    let mut d = desc(TRAIN_MAX_PIECES);
    for p in &mut d.pieces {
        p.len = u32::MAX;
    }
    assert!(d.encode(&mut Vec::new()).is_none());
    let mut v = ok.clone();
    for i in 0..2 {
        v[DESC_HDR + DESC_PIECE * i + 16..DESC_HDR + DESC_PIECE * i + 20].copy_from_slice(&(1u32 << 30).to_le_bytes());
    }
    assert!(TrainDesc::decode(&v).is_some(), "exactly 2^31 bytes is a message");
    v[DESC_HDR + 16] = 1;
    assert!(TrainDesc::decode(&v).is_none(), "2^31 + 1 bytes is not");
    let mut v = ok.clone();
    v[DESC_HDR + 8..DESC_HDR + 16].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
    assert!(TrainDesc::decode(&v).is_none());
    // Forget lists: whole tokens only, bounded.
    assert!(decode_forget(&[0; 7]).is_none());
    assert!(decode_forget(&vec![0; 8 * (FORGET_MAX + 1)]).is_none());
    assert_eq!(decode_forget(&[]).unwrap().count(), 0);
}

/// Random bytes as descriptors, some with a plausible header: never a
/// panic, and whatever is accepted is within the limits and encodes
/// back to the same bytes.
#[test]
fn random_descriptors_never_panic() {
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
    let mut accepted = 0;
    let rounds = if cfg!(miri) { 2_000 } else { 20_000 };
    for i in 0..rounds {
        let count = rnd() % (TRAIN_MAX_PIECES as u64 + 3);
        let len = if i % 2 == 0 {
            DESC_HDR + DESC_PIECE * count as usize
        } else {
            (rnd() % (DESC_MAX as u64 + 64)) as usize
        };
        let mut v: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        if v.len() >= 8 && i % 4 < 2 {
            v[4..8].copy_from_slice(&(count as u32).to_le_bytes());
            // Small lengths and offsets now and then.
            for k in 0..count as usize {
                let o = DESC_HDR + DESC_PIECE * k;
                if o + 20 <= v.len() && rnd().is_multiple_of(2) {
                    v[o + 8..o + 16].copy_from_slice(&(rnd() % (1 << 20)).to_le_bytes());
                    v[o + 16..o + 20].copy_from_slice(&((rnd() % (1 << 20)) as u32).to_le_bytes());
                }
            }
        }
        if let Some(d) = TrainDesc::decode(&v) {
            accepted += 1;
            assert!(d.npkts > 0 && !d.pieces.is_empty() && d.pieces.len() <= TRAIN_MAX_PIECES);
            assert!(d.pieces.iter().map(|p| u64::from(p.len)).sum::<u64>() <= 1 << 31);
            let mut back = Vec::new();
            d.encode(&mut back).unwrap();
            assert_eq!(back, v);
        }
        let _ = decode_forget(&v).map(|t| t.count());
    }
    assert!(accepted > rounds / 200, "{accepted}");
}

/// A peer scribbling kind, flag and length words: the consumer never
/// hands out more than a slot holds, nor a train whose packet is longer
/// than what it copied.
#[test]
fn hostile_slot_headers_stay_in_the_slot() {
    let r = region();
    let peer = r.alias();
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let (mut trains, mut bad) = (0u32, 0u32);
    for i in 0..if cfg!(miri) { SLOTS + 64 } else { 4 * SLOTS } {
        let slot = slot_offset(0, i);
        let pick = |v: u64| match v % 4 {
            0 => 0,
            1 => (v >> 8) % 64,
            2 => (v >> 8) % (MAX_PAYLOAD as u64 + 2),
            _ => v >> 32,
        } as u32;
        let (len, kind, ext) = (pick(rnd()) as u16, (rnd() % 5) as u16, pick(rnd()) as u16);
        let flags = (rnd() % 3) as u16;
        // Everything but the `seq` first, then `seq`, as a producer would.
        write_header(&peer, slot, &slot_header(i, len, ext, kind, flags, &meta()));
        match c.pop_slot(&r, &mut buf) {
            Ok(Some(Slot::Train(_, n))) => {
                trains += 1;
                assert!(n <= buf.len() && buf.len() <= MAX_PAYLOAD);
                let _ = TrainDesc::decode(&buf[n..]);
            }
            Ok(Some(Slot::Datagram(_))) | Ok(Some(Slot::Forget)) => assert!(buf.len() <= MAX_PAYLOAD),
            Ok(Some(Slot::Bad)) => bad += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(trains > 0 && bad > 0, "{trains} {bad}");
}

/// Both ends map the region prefaulted: no page fault on the first lap of
/// a ring (before, each of the first 512 messages each way took one per
/// side: a ping-pong's median over its first 600 round trips was 5.9 µs
/// instead of 0.85).
#[test]
#[cfg_attr(miri, ignore = "maps a memfd")]
fn both_ends_map_the_region_prefaulted() {
    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD counts this thread only.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }
    /// Minor faults taken reading one byte of every page of `r`.
    fn faults_reading(r: &Region) -> i64 {
        let before = minor_faults();
        for off in (0..REGION_LEN).step_by(4096) {
            // SAFETY: `off` is inside the mapping, alive for the call.
            unsafe { std::ptr::read_volatile(r.base().add(off)) };
        }
        minor_faults() - before
    }
    let r = Region::create().unwrap();
    let peer = Region::open(r.file().try_clone().unwrap()).unwrap();
    // A few faults may come from elsewhere in the thread (the harness);
    // a region not prefaulted takes one per page (over 1,000).
    assert!(faults_reading(&r) < 16, "the creator's mapping faults");
    assert!(faults_reading(&peer) < 16, "the peer's mapping faults");
}

/// A slot carries its addresses only when they differ from the previous
/// slot's; a small datagram then lies in the slot's first cache line,
/// with its header. Whatever the sequence of addresses, each datagram
/// comes out with its own.
#[test]
fn addresses_go_only_when_they_change() {
    let r = region();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let other = SlotMeta {
        src: "10.1.2.3".parse().unwrap(),
        dst: "fd73:7665:7262:4::9".parse().unwrap(),
        src_port: 7,
        dst_port: 4791,
    };
    let flags_of = |i: u64| {
        u16::from_ne_bytes(
            peek64(&r, slot_offset(0, i) + 8).to_ne_bytes()[2..4]
                .try_into()
                .unwrap(),
        )
    };
    let metas = [meta(), meta(), other, other, meta(), other, meta(), meta()];
    for (i, m) in metas.iter().enumerate() {
        let data = [i as u8; 24];
        p.push(&r, m, &data).unwrap();
        let carries = i == 0 || metas[i - 1] != *m;
        assert_eq!(flags_of(i as u64) & FLAG_ADDRS != 0, carries, "slot {i}");
        if !carries {
            let line: Vec<u8> = (0..8)
                .flat_map(|k| peek64(&r, slot_offset(0, i as u64) + 8 * k).to_ne_bytes())
                .collect();
            assert_eq!(&line[SLOT_HDR..SLOT_HDR + 24], &data, "slot {i}: in the first line");
        }
        assert_eq!(c.pop_slot(&r, &mut buf), Ok(Some(Slot::Datagram(*m))), "slot {i}");
        assert_eq!(buf, data);
    }
}

/// The `seq` word decides: a slot still holding the previous lap's is
/// not ready yet; one that no correct producer writes breaks the ring
/// for good (the link then gives the channel up).
#[test]
fn an_impossible_seq_breaks_the_ring() {
    let r = region();
    let peer = r.alias();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    // Two laps: afterwards each slot holds the second lap's `seq`.
    for _ in 0..2 * SLOTS {
        p.push(&r, &meta(), b"x").unwrap();
        assert!(c.pop_slot(&r, &mut buf).unwrap().is_some());
    }
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(None));
    assert!(!c.is_broken());
    assert_eq!(c.position(), (2 * SLOTS, 2 * SLOTS), "freed on finding the ring empty");
    // The next slot's `seq` says "two laps ago": impossible.
    let i = 2 * SLOTS;
    poke32(&peer, slot_offset(0, i), (i + 1 - 2 * SLOTS) as u32);
    assert_eq!(c.pop_slot(&r, &mut buf), Err(()));
    assert!(c.is_broken());
    assert!(c.has_data(&r), "a broken ring is not idle");
    // A fresh consumer on the first lap: 0 means not yet, anything else
    // but the expected `seq` is broken.
    let r = region();
    let peer = r.alias();
    let mut c = Consumer::new(1);
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(None));
    poke32(&peer, slot_offset(1, 0), 7);
    assert_eq!(c.pop_slot(&r, &mut buf), Err(()));
}

/// The consumer frees slots while a stream goes on, not only when it
/// finds the ring empty: a producer that keeps it busy never stalls.
#[test]
fn the_consumer_frees_as_it_reads() {
    let r = region();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    for _ in 0..SLOTS {
        p.push(&r, &meta(), b"x").unwrap();
    }
    for _ in 0..FREE_EVERY {
        assert!(c.pop_slot(&r, &mut buf).unwrap().is_some());
    }
    assert_eq!(c.position(), (FREE_EVERY, FREE_EVERY));
    assert_eq!(p.room(&r, 1), Ok(FREE_EVERY));
}

/// The `seq` words are the slot counts mod 2^32: a ring that has carried
/// 2^32 messages (minutes of a small-message stream) goes on across the
/// wrap, and tells "not yet" from "broken" there as anywhere.
#[test]
fn the_seq_words_wrap() {
    let r = region();
    let peer = r.alias();
    // Both ends as they stand after (2^32 - 300) messages: every slot holds
    // what the lap before left there.
    let start = (1u64 << 32) - 300;
    for i in start - SLOTS..start {
        poke32(&peer, slot_offset(0, i), seq_of(i));
    }
    let mut p = Producer {
        head: start,
        tail: start,
        ..Producer::new(0)
    };
    let mut c = Consumer {
        tail: start,
        freed: start,
        ..Consumer::new(0)
    };
    let mut buf = Vec::new();
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(None));
    for k in 0..if cfg!(miri) { SLOTS + 64 } else { 3 * SLOTS } {
        let data = (start + k).to_le_bytes();
        p.push(&r, &meta(), &data).unwrap();
        assert_eq!(
            c.pop_slot(&r, &mut buf),
            Ok(Some(Slot::Datagram(meta()))),
            "message {k}"
        );
        assert_eq!(buf, data);
        assert_eq!(c.pop_slot(&r, &mut buf), Ok(None), "message {k}: nothing more yet");
    }
    assert!(c.position().0 > 1 << 32 && !c.is_broken());
}

/// Retries a push while the ring is full.
fn push_all(p: &mut Producer, r: &Region, m: &SlotMeta, data: &[u8]) {
    let deadline = Deadline::new();
    loop {
        match p.push(r, m, data) {
            Ok(()) => return,
            Err(PushError::Full) => {
                deadline.check(|| format!("the ring stayed full at {:?}", p.position()));
                std::thread::yield_now();
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A peer writing a random word of the slot at `slot` (any but the
/// `seq` word), with the word size the layout gives it.
fn scribble(r: &Region, slot: u64, rnd: &mut impl FnMut() -> u64) {
    match rnd() % (SLOT_LEN as u64 / 8) {
        0 => poke32(r, slot + 4, rnd() as u32),
        word => poke64(r, slot + 8 * word, rnd()),
    }
}

/// The datagram number `i` of the threaded tests: lengths that are and
/// are not whole words, up to the largest.
fn datagram(i: u64) -> Vec<u8> {
    // Under Miri the largest ones are rarer (each costs ~4,000 byte
    // steps to build and compare, interpreted).
    let large = if cfg!(miri) { 64 } else { 5 };
    let len = match i % large {
        0 => MAX_PAYLOAD - (i as usize % 8),
        _ => 1 + (i as usize * 13) % 200,
    };
    (0..len)
        .map(|k| (i as u8).wrapping_mul(31).wrapping_add(k as u8))
        .collect()
}

/// A producer and a consumer in two threads, laps around the ring with
/// the addresses changing now and then: every datagram arrives whole, in
/// order, with its addresses. Under Miri this checks the publication
/// protocol (release `seq`, acquire, release `tail`) for data races.
#[test]
fn two_threads_stream_through_the_wrap() {
    let n = if cfg!(miri) { SLOTS + 16 } else { 8 * SLOTS };
    let r = Arc::new(region());
    let other = SlotMeta {
        src: "10.1.2.3".parse().unwrap(),
        ..meta()
    };
    let meta_of = move |i: u64| if (i / 7).is_multiple_of(2) { meta() } else { other };
    let producer = {
        let r = Arc::clone(&r);
        std::thread::spawn(move || {
            let mut p = Producer::new(0);
            for i in 0..n {
                push_all(&mut p, &r, &meta_of(i), &datagram(i));
            }
        })
    };
    let peer = r.alias();
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let mut i = 0;
    let deadline = Deadline::new();
    while i < n {
        deadline.check(|| format!("datagram {i} of {n} never arrived"));
        match c.pop_slot(&peer, &mut buf) {
            Ok(Some(slot)) => {
                assert_eq!(slot, Slot::Datagram(meta_of(i)), "datagram {i}");
                assert!(buf == datagram(i), "datagram {i}: other bytes");
                i += 1;
            }
            Ok(None) => std::thread::yield_now(),
            Err(()) => panic!("broken at {i}"),
        }
    }
    producer.join().unwrap();
    assert_eq!(c.pop_slot(&peer, &mut buf), Ok(None));
}

/// A peer that keeps writing a slot's header and bytes after publishing
/// it, while the consumer copies the slot out: whatever the consumer hands
/// out stays within the slot's bounds (checked on its private copy), and
/// under Miri no access of ours races with the peer's (the copies out of
/// the slot are atomic loads; a plain or volatile copy is a data race).
#[test]
fn a_peer_scribbling_slots_while_we_read_them() {
    let n = if cfg!(miri) { 40 } else { 4 * SLOTS };
    let r = Arc::new(region());
    let done = Arc::new(AtomicBool::new(false));
    let peer = {
        let (r, done) = (Arc::clone(&r), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut rnd = xorshift(0x51_7cc1_b727_220a);
            for i in 0..n {
                // Stay within a lap of the consumer, so that it keeps
                // reading rather than finding an impossible `seq`.
                while i >= peek64(&r, tail_offset(0)) + SLOTS / 2 && !done.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                }
                let slot = slot_offset(0, i);
                let len = (rnd() % (MAX_PAYLOAD as u64 + 1)) as u16;
                let kind = (rnd() % 2) as u16;
                let ext = if kind == KIND_TRAIN { (rnd() % 64) as u16 } else { 0 };
                let len = len.min((MAX_PAYLOAD - usize::from(ext)) as u16);
                write_header(&r, slot, &slot_header(i, len, ext, kind, FLAG_ADDRS, &meta()));
                // Published: now scribble over what the consumer reads.
                for _ in 0..if cfg!(miri) { 4 } else { 64 } {
                    scribble(&r, slot, &mut rnd);
                }
                // The words right after the addresses: the datagram's
                // first bytes, always read.
                poke64(&r, slot + SLOT_DATA_ADDRS as u64, rnd());
            }
        })
    };
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let mut read = 0;
    let deadline = Deadline::new();
    while read < n && !c.is_broken() {
        deadline.check(|| format!("slot {read} of {n} never arrived"));
        match c.pop_slot(&r, &mut buf) {
            Ok(Some(Slot::Train(_, len))) => assert!(len <= buf.len() && buf.len() <= MAX_PAYLOAD),
            Ok(Some(Slot::Datagram(_) | Slot::Forget | Slot::Caps | Slot::Bad)) => assert!(buf.len() <= MAX_PAYLOAD),
            Ok(None) => {
                std::thread::yield_now();
                continue;
            }
            Err(()) => break,
        }
        read += 1;
    }
    done.store(true, Ordering::Relaxed);
    peer.join().unwrap();
    assert!(read > 0);
}

/// A peer that writes into the slots we are filling (the consumer's
/// side of the ring is its memory too): the producer's copies into the
/// slot are atomic stores, so under Miri nothing races; the producer goes
/// on regardless.
#[test]
fn a_peer_scribbling_slots_while_we_write_them() {
    let n = if cfg!(miri) { 40 } else { 4 * SLOTS };
    let r = Arc::new(region());
    let done = Arc::new(AtomicBool::new(false));
    let peer = {
        let (r, done) = (Arc::clone(&r), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut rnd = xorshift(0x2d35_8dcc_aa6c_78a5);
            let mut t = 0u64;
            while !done.load(Ordering::Relaxed) {
                // SAFETY: the seq word of slot `t` lies in the region.
                let seq = unsafe { at32(r.base().add(slot_offset(0, t) as usize)) }.load(Ordering::Acquire);
                if seq == seq_of(t) {
                    t += 1;
                    // Free it, then scribble over the slot the producer
                    // fills next (and the one it just filled).
                    poke64(&r, tail_offset(0), t);
                }
                for s in [t, t.wrapping_sub(1)] {
                    scribble(&r, slot_offset(0, s), &mut rnd);
                }
                std::thread::yield_now();
            }
        })
    };
    let mut p = Producer::new(0);
    for i in 0..n {
        push_all(&mut p, &r, &meta(), &datagram(i));
    }
    done.store(true, Ordering::Relaxed);
    peer.join().unwrap();
    assert_eq!(p.position().0, n);
}

/// A slot's bytes go in as whole words assembled across the parts and
/// the extension, whatever their lengths, and come out as they went in;
/// the last word's bytes past the end are zeros, not stale bytes of an
/// earlier lap.
#[test]
fn parts_of_any_length_arrive_whole() {
    let r = region();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let lens = [0usize, 1, 3, 7, 8, 9, 15, 17];
    let mut rnd = xorshift(0x6a09_e667_f3bc_c908);
    // Dirty every slot first, so that padding is visibly rewritten.
    for _ in 0..SLOTS {
        p.push(&r, &meta(), &[0xee; 64]).unwrap();
        c.pop_slot(&r, &mut buf).unwrap().unwrap();
    }
    for n in 0..if cfg!(miri) { 40 } else { 400 } {
        let parts: Vec<Vec<u8>> = (0..1 + rnd() % 4)
            .map(|_| (0..lens[(rnd() % 8) as usize]).map(|_| rnd() as u8).collect())
            .collect();
        let ext: Vec<u8> = (0..lens[(rnd() % 8) as usize]).map(|_| rnd() as u8).collect();
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let i = p.position().0;
        p.push_parts(&r, &meta(), KIND_TRAIN, &refs, &ext).unwrap();
        let len: usize = parts.iter().map(Vec::len).sum();
        let want: Vec<u8> = parts.concat().into_iter().chain(ext.iter().copied()).collect();
        assert_eq!(c.pop_slot(&r, &mut buf), Ok(Some(Slot::Train(meta(), len))), "slot {n}");
        assert_eq!(
            buf,
            want,
            "slot {n}: {:?} + {} bytes",
            parts.iter().map(Vec::len).collect::<Vec<_>>(),
            ext.len()
        );
        if !want.len().is_multiple_of(8) {
            let at = slot_offset(0, i) + SLOT_HDR as u64 + (want.len() / 8 * 8) as u64;
            let last = peek64(&r, at).to_ne_bytes();
            assert!(
                last[want.len() % 8..].iter().all(|&b| b == 0),
                "slot {n}: padding {last:?}"
            );
        }
    }
}
