//! `Qp::post_send_all` (what `ibv_wr_complete` needs): a batch is checked
//! whole before any of it is posted. A bad WR anywhere in it, including
//! one that only the engine can judge (no room left in a send queue that
//! holds outstanding work), posts nothing; a good batch posts every WR, in
//! order; in ERR the good batch is flushed in order and a refused one
//! leaves no flushed completion behind.

mod udp_common;

use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::verbs::*;
use udp_common::*;

/// Two connected inline devices on loopback (nothing progresses on `b`
/// until it is polled, so `a`'s WRs stay outstanding meanwhile).
fn pair() -> (Side, Side) {
    let (da, db) = (device(LO4, EngineMode::Inline), device(LO4, EngineMode::Inline));
    let (a, b) = (side(&da, 1 << 16, 100), side(&db, 1 << 16, 9000));
    connect(&a, &b, Mtu::Mtu1024);
    (a, b)
}

/// Completions of `s`'s send CQ within a short while (driving `b`).
fn drain(a: &Side, b: &Side) -> Vec<(u64, WcStatus)> {
    collect(&a.scq, &[&b.rcq], Duration::from_millis(200))
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect()
}

#[test]
fn a_bad_wr_at_the_end_posts_nothing_and_a_good_batch_posts_all_in_order() {
    let (a, b) = pair();
    a.mr.write(0, b"abcdefgh").unwrap();
    let one = [a.mr.sge(0, 8).unwrap()];
    // One SGE more than max_send_sge (2).
    let three = [
        a.mr.sge(0, 1).unwrap(),
        a.mr.sge(1, 1).unwrap(),
        a.mr.sge(2, 1).unwrap(),
    ];
    let write = |id: u64, off: u64, sgl| {
        SendWr::new(
            id,
            SendOp::Write {
                remote: b.mr.remote(off),
            },
            sgl,
        )
        .flags(SendFlags::SIGNALED)
    };
    let bad = [
        write(1, 1000, &one[..]),
        write(2, 2000, &one[..]),
        write(3, 3000, &three[..]),
    ];
    let e = a.qp.post_send_all(&bad).unwrap_err();
    assert_eq!((e.index, e.error.kind()), (2, ErrorKind::InvalidArgument), "{e}");
    assert_eq!(drain(&a, &b), vec![], "nothing of the refused batch ran");
    for off in [1000, 2000, 3000] {
        assert_eq!(b.mr.to_vec(off, 8).unwrap(), vec![0; 8], "offset {off} was written");
    }

    let good = [
        write(10, 1000, &one[..]),
        write(11, 2000, &one[..]),
        write(12, 3000, &one[..]),
    ];
    a.qp.post_send_all(&good).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        let w = wait_one(&a.scq, &[&b.rcq]);
        got.push((w.wr_id, w.status));
    }
    assert_eq!(
        got,
        vec![
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success)
        ]
    );
    for off in [1000, 2000, 3000] {
        assert_eq!(b.mr.to_vec(off, 8).unwrap(), b"abcdefgh", "offset {off}");
    }
}

#[test]
fn a_batch_without_room_in_the_send_queue_posts_nothing() {
    let (a, b) = pair();
    let cap = a.qp.cap().max_send_wr as u64;
    let one = [a.mr.sge(0, 8).unwrap()];
    let write = |id: u64| {
        SendWr::new(
            id,
            SendOp::Write {
                remote: b.mr.remote(4096),
            },
            &one[..],
        )
    };
    // Outstanding work: `b` is not polled, so none of it is acknowledged
    // and the queue keeps all but four free slots taken.
    let fill: Vec<SendWr<'_>> = (0..cap - 4).map(write).collect();
    a.qp.post_send(&fill).unwrap();
    // Six WRs, room for four: only the engine knows, and it posts none.
    let over: Vec<SendWr<'_>> = (1000..1006).map(|id| write(id).flags(SendFlags::SIGNALED)).collect();
    let e = a.qp.post_send_all(&over).unwrap_err();
    assert_eq!((e.index, e.error.kind()), (4, ErrorKind::NoMemory), "{e}");
    // Four fit, and go.
    a.qp.post_send_all(&over[..4]).unwrap();
    let mut got = Vec::new();
    while got.len() < 4 {
        got.push(wait_one(&a.scq, &[&b.rcq]).wr_id);
    }
    assert_eq!(
        got,
        vec![1000, 1001, 1002, 1003],
        "the refused batch left nothing in the queue"
    );
    assert_eq!(drain(&a, &b), vec![]);
}

#[test]
fn in_err_a_refused_batch_flushes_nothing_and_a_good_one_flushes_in_order() {
    let (a, b) = pair();
    a.qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    let one = [a.mr.sge(0, 8).unwrap()];
    let three = [
        a.mr.sge(0, 1).unwrap(),
        a.mr.sge(1, 1).unwrap(),
        a.mr.sge(2, 1).unwrap(),
    ];
    let send = |id: u64, sgl| SendWr::new(id, SendOp::Send, sgl).flags(SendFlags::SIGNALED);
    let e =
        a.qp.post_send_all(&[send(1, &one[..]), send(2, &three[..])])
            .unwrap_err();
    assert_eq!(e.index, 1, "{e}");
    assert_eq!(drain(&a, &b), vec![], "a refused batch is not flushed either");
    a.qp.post_send_all(&[send(3, &one[..]), send(4, &one[..]), send(5, &one[..])])
        .unwrap();
    let flushed = WcStatus::WrFlushErr;
    assert_eq!(drain(&a, &b), vec![(3, flushed), (4, flushed), (5, flushed)]);
}
