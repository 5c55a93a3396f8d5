//! The ring's checks of what the peer wrote, one rule at a time and at
//! its boundary: the region's seal, size and format; the consumer's tail
//! as the producer reads it; each slot kind's lengths and the flags; the
//! descriptor and forget-list limits on the encoding side. Each test was
//! written against a mutant of one of these checks that the other ring
//! tests let through (docs/testing.md, "Mutation testing").

use std::os::unix::fs::FileExt;

use super::*;

fn meta() -> SlotMeta {
    SlotMeta {
        src: "10.7.0.1".parse().unwrap(),
        dst: "10.7.0.2".parse().unwrap(),
        src_port: 0xc001,
        dst_port: 4791,
    }
}

fn refused(r: io::Result<Region>, why: &str) {
    let e = r.expect_err(why);
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{why}: {e}");
    assert!(e.to_string().contains(why), "{why}: {e}");
}

/// A memfd of `len` bytes holding a valid header, sealed against
/// shrinking if `sealed`.
fn region_file(len: u64, sealed: bool) -> File {
    let good = Region::create().unwrap();
    let mut header = [0u8; 20];
    good.file().read_exact_at(&mut header, 0).unwrap();
    let f = sys::memfd("softverbs-test").unwrap();
    f.set_len(len).unwrap();
    f.write_all_at(&header, 0).unwrap();
    if sealed {
        sys::seal_size(&f).unwrap();
    }
    f
}

#[test]
fn a_region_must_be_sealed_full_size_and_of_our_format() {
    let full = REGION_LEN as u64;
    assert!(Region::open(region_file(full, true)).is_ok());
    assert!(
        Region::open(region_file(full + 4096, true)).is_ok(),
        "longer is harmless"
    );
    refused(Region::open(region_file(full, false)), "not sealed");
    refused(Region::open(region_file(full - 1, true)), "too short");
    refused(Region::open(region_file(4096, true)), "too short");
    // Each header word in turn.
    for (off, bad) in [
        (0u64, &b"SVSHMRG2"[..]),
        (8, &4u32.to_ne_bytes()[..]),
        (12, &256u32.to_ne_bytes()[..]),
    ] {
        let f = region_file(full, true);
        f.write_all_at(bad, off).unwrap();
        refused(Region::open(f), "another format");
    }
    let f = region_file(full, true);
    f.write_all_at(&(SLOT_LEN as u32 + 64).to_ne_bytes(), 16).unwrap();
    refused(Region::open(f), "another format");
}

/// Writes the consumer's tail of ring `r` as a hostile peer would.
fn write_tail(region: &Region, r: usize, tail: u64) {
    region.file().write_all_at(&tail.to_ne_bytes(), tail_offset(r)).unwrap();
}

#[test]
fn a_tail_the_producer_never_filled_up_to_is_corrupt() {
    let r = Region::create().unwrap();
    let mut p = Producer::new(0);
    for _ in 0..4 {
        p.push(&r, &meta(), b"x").unwrap();
    }
    // Ahead of what was published.
    write_tail(&r, 0, 5);
    assert_eq!(p.room(&r, SLOTS), Err(PushError::Corrupt));
    assert_eq!(p.push(&r, &meta(), b"x").map(|_| ()), Ok(()), "room known: no re-read");
    // Every slot published; a tail more than a lap behind.
    let mut p = Producer::new(1);
    for _ in 0..SLOTS {
        p.push(&r, &meta(), b"x").unwrap();
    }
    write_tail(&r, 1, 0);
    assert_eq!(p.room(&r, 1), Ok(0), "a full ring");
    (p.head, p.tail) = (SLOTS + 1, 1);
    assert_eq!(p.room(&r, 1), Err(PushError::Corrupt), "more than a lap behind");
    // Exactly caught up is fine, and frees everything.
    let r = Region::create().unwrap();
    let mut p = Producer::new(0);
    for _ in 0..3 {
        p.push(&r, &meta(), b"x").unwrap();
    }
    write_tail(&r, 0, 3);
    assert_eq!(p.room(&r, SLOTS), Ok(SLOTS));
    assert_eq!(p.position(), (3, 3));
}

#[test]
fn room_reads_the_consumer_s_tail_only_when_it_knows_too_few_free() {
    let r = Region::create().unwrap();
    let mut p = Producer::new(0);
    for _ in 0..10 {
        p.push(&r, &meta(), b"x").unwrap();
    }
    write_tail(&r, 0, 10);
    // SLOTS - 10 known free: enough for want <= SLOTS - 10, so the tail
    // is not read (its cache line stays with the consumer).
    assert_eq!(p.room(&r, SLOTS - 10), Ok(SLOTS - 10));
    assert_eq!(p.room(&r, 1), Ok(SLOTS - 10));
    assert_eq!(p.position(), (10, 0));
    // One more than known: the tail is read.
    assert_eq!(p.room(&r, SLOTS - 9), Ok(SLOTS));
    assert_eq!(p.position(), (10, 10));
}

/// Writes slot `i` of ring 0 by hand: header, `seq` last.
fn hand_slot(file: &File, i: u64, len: u16, ext: u16, kind: u16, flags: u16) {
    let h = slot_header(i, len, ext, kind, flags, &meta());
    file.write_all_at(&h[4..], slot_offset(0, i) + 4).unwrap();
    file.write_all_at(&h[..4], slot_offset(0, i)).unwrap();
}

#[test]
fn each_slot_kind_takes_exactly_its_lengths() {
    let r = Region::create().unwrap();
    let f = r.file().try_clone().unwrap();
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    let max = MAX_PAYLOAD as u16;
    #[rustfmt::skip]
    let cases: &[(u16, u16, u16, u16, Slot)] = &[
        // (len, ext, kind, flags, expected)
        (10, 0, KIND_DATAGRAM, 0, Slot::Datagram(c_meta())),
        (10, 1, KIND_DATAGRAM, 0, Slot::Bad),
        (max, 0, KIND_DATAGRAM, 0, Slot::Datagram(c_meta())),
        (max + 1, 0, KIND_DATAGRAM, 0, Slot::Bad),
        (max - 8, 8, KIND_TRAIN, 0, Slot::Train(c_meta(), MAX_PAYLOAD - 8)),
        (max - 8, 9, KIND_TRAIN, 0, Slot::Bad),
        (0, 16, KIND_FORGET, 0, Slot::Forget),
        (1, 16, KIND_FORGET, 0, Slot::Bad),
        (0, 4, KIND_CAPS, 0, Slot::Caps),
        (1, 4, KIND_CAPS, 0, Slot::Bad),
        (0, 5, KIND_CAPS, 0, Slot::Bad),
        (0, 3, KIND_CAPS, 0, Slot::Bad),
        (8, 0, 4, 0, Slot::Bad),
        (8, 0, KIND_DATAGRAM, 2, Slot::Bad),
        (8, 0, KIND_DATAGRAM, FLAG_ADDRS | 4, Slot::Bad),
        (8, 0, KIND_DATAGRAM, 0, Slot::Datagram(c_meta())),
    ];
    for (i, &(len, ext, kind, flags, want)) in cases.iter().enumerate() {
        hand_slot(&f, i as u64, len, ext, kind, flags);
        let got = c.pop_slot(&r, &mut buf);
        assert_eq!(
            got,
            Ok(Some(want)),
            "case {i}: len {len} ext {ext} kind {kind} flags {flags}"
        );
        if want != Slot::Bad {
            assert_eq!(buf.len(), usize::from(len) + usize::from(ext), "case {i}");
        }
        // A bad slot is skipped and freed at once; the ring goes on.
        assert_eq!(c.position().0, i as u64 + 1);
        if want == Slot::Bad {
            assert_eq!(c.position().1, i as u64 + 1, "case {i}: freed");
        }
    }
    assert!(!c.is_broken());
}

/// The addresses a hand-written slot without FLAG_ADDRS inherits on a
/// fresh consumer: unspecified, with the ports of `meta()`.
fn c_meta() -> SlotMeta {
    SlotMeta {
        src: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        dst: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        ..meta()
    }
}

#[test]
fn the_encoding_side_keeps_to_the_limits_the_decoder_enforces() {
    let piece = DescPiece {
        token: 1,
        offset: 0,
        len: 64,
    };
    let d = |n: usize| TrainDesc {
        npkts: 1,
        pieces: vec![piece; n],
    };
    let mut out = Vec::new();
    assert!(d(0).encode(&mut out).is_none(), "no piece");
    assert!(d(TRAIN_MAX_PIECES + 1).encode(&mut out).is_none(), "too many pieces");
    assert!(out.is_empty());
    assert!(d(TRAIN_MAX_PIECES).encode(&mut out).is_some());
    assert_eq!(TrainDesc::decode(&out), Some(d(TRAIN_MAX_PIECES)));
    // A whole forget slot of tokens is one list; a token more is not.
    let full = vec![0xab; 8 * FORGET_MAX];
    assert_eq!(decode_forget(&full).map(|t| t.count()), Some(FORGET_MAX));
    assert!(decode_forget(&full[..8 * FORGET_MAX - 4]).is_none());
    let mut listed = Vec::new();
    encode_forget(&vec![7; FORGET_MAX + 3], &mut listed);
    assert_eq!(listed.len(), 8 * FORGET_MAX, "the rest is left out");
}

#[test]
fn finding_the_ring_empty_frees_what_was_read_and_only_then() {
    let r = Region::create().unwrap();
    let mut p = Producer::new(0);
    let mut c = Consumer::new(0);
    let mut buf = Vec::new();
    for _ in 0..3 {
        p.push(&r, &meta(), b"x").unwrap();
    }
    for _ in 0..3 {
        assert!(c.pop_slot(&r, &mut buf).unwrap().is_some());
    }
    assert_eq!(c.position(), (3, 0), "fewer than FREE_EVERY read: nothing freed yet");
    assert_eq!(c.pop_slot(&r, &mut buf), Ok(None));
    assert_eq!(c.position(), (3, 3), "freed on finding the ring empty");
    assert_eq!(p.room(&r, SLOTS), Ok(SLOTS));
}
