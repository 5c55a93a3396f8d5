//! The ULP layer's poll contexts and MR pools as their users see them: a
//! CQ worker runs callbacks until it is dropped, and its drop waits for
//! the callback it is running; a CQ pool hands out a CQ only with the
//! entries asked; an MR pool's counters start where its MRs are.

mod ulp_common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::ulp::{CqPool, CqWorker, LocalBuf, MrPool, UlpQpInit, UlpWr};
use softverbs::verbs::*;
use ulp_common::*;

/// A worker runs the callbacks of its CQ; dropping it waits for the one
/// it is running (no callback runs after the drop returns) and stops it:
/// a later completion waits for the application's own poll.
#[test]
fn dropping_a_worker_waits_for_its_callback_and_stops_it() {
    let (_da, _db, a, b) = pair("worker", &UlpQpInit::default(), 1);
    let (src, dst) = (a.mr(64), b.mr(64));
    let worker = CqWorker::spawn(&a.cq).unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicU32::new(0));
    let (s, f) = (started.clone(), finished.clone());
    a.qp()
        .post(
            UlpWr::write(LocalBuf::new(&src, 0, 8).unwrap(), dst.remote(0)),
            move |wc| {
                assert!(wc.is_success(), "{wc:?}");
                s.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(300));
                f.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
    // Our poll of `b` drives the peer; the worker alone polls `a`.
    poll_until(&[&b.cq], "the worker to run the callback", || {
        started.load(Ordering::SeqCst)
    });
    assert_eq!(worker.errors(), 0);
    drop(worker);
    assert_eq!(
        finished.load(Ordering::SeqCst),
        1,
        "the drop returned while its callback still ran"
    );

    // Stopped: nothing runs this completion's callback but our own poll.
    let (n, done) = counter();
    a.qp()
        .post(UlpWr::write(LocalBuf::new(&src, 8, 8).unwrap(), dst.remote(8)), done)
        .unwrap();
    let quiet = Instant::now() + Duration::from_millis(200);
    while Instant::now() < quiet {
        b.cq.poll(16).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(n.load(Ordering::SeqCst), 0, "a dropped worker still ran a callback");
    poll_until(&[&a.cq, &b.cq], "our own poll to run it", || {
        n.load(Ordering::SeqCst) == 1
    });
}

/// A CQ pool has the CQs asked for, and hands one out only if it has the
/// entries: exactly as many as the freest CQ has works, one more is
/// refused, naming the most there is.
#[test]
fn a_cq_pool_gives_a_cq_up_to_its_free_entries() {
    let (da, _db) = ulp_common::devices("cqpool");
    let ctx = da.open().unwrap();
    let pool = CqPool::new(&ctx, 3, 128).unwrap();
    assert_eq!(pool.cqs().count(), 3);
    let most = pool.cqs().map(|cq| cq.free_entries()).max().unwrap();
    assert!(most >= 128, "{most}");
    assert_eq!(pool.get(most).unwrap().free_entries(), most);
    let e = pool.get(most + 1).unwrap_err();
    assert_eq!(e.errno(), libc::ENOMEM, "{e}");
    assert!(e.to_string().contains(&format!("has free is {most}")), "{e}");
    assert_eq!(CqPool::new(&ctx, 0, 128).unwrap_err().errno(), libc::EINVAL);
}

/// An MR pool's counters start at its MRs: all available, none
/// discarded; taking one and giving it back returns it.
#[test]
fn an_mr_pool_counts_its_mrs() {
    let (da, _db) = ulp_common::devices("mrpool");
    let ctx = da.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let pool = MrPool::plain(&pd, 3, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!((pool.total(), pool.available(), pool.discarded()), (3, 3, 0));
    let taken = pool.get().unwrap();
    assert_eq!(taken.mr().length(), 4096);
    assert_eq!((pool.total(), pool.available(), pool.discarded()), (3, 2, 0));
    drop(taken);
    assert_eq!((pool.total(), pool.available(), pool.discarded()), (3, 3, 0));
}
