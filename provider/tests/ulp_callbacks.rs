//! Completion callbacks of the ULP layer: once per signaled success,
//! never for an unsignaled success, exactly once for every error and
//! flush (unsignaled requests included), and before the callback's
//! captures are dropped when a QP closes or its device goes away.

mod ulp_common;

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use softverbs::ulp::{LocalBuf, UlpQpInit, UlpWr};
use softverbs::verbs::*;
use ulp_common::*;

#[test]
fn signaled_success_calls_once_unsignaled_success_calls_nothing() {
    let (_da, _db, a, b) = pair("once", &UlpQpInit::default(), 4);
    signaled_once_unsignaled_silent(&a, &b, false);
}

#[test]
fn an_error_calls_every_request_it_completes_once_unsignaled_included() {
    error_calls_every_request_once(false);
}

/// The same with each WR and its buffer given inline (the layer's short
/// path for one plain WR over one buffer).
#[test]
fn an_error_calls_every_plain_request_it_completes_once_unsignaled_included() {
    error_calls_every_request_once(true);
}

fn error_calls_every_request_once(plain: bool) {
    let (_da, _db, a, b) = pair(if plain { "errp" } else { "err" }, &UlpQpInit::default(), 4);
    errors_complete_once(&a, &b, |_| plain);
}

#[test]
fn closing_a_qp_flushes_its_requests_before_their_captures_drop() {
    let (_da, _db, a, b) = pair("close", &UlpQpInit::default(), 4);
    close_flushes_before_captures_drop(a, b);
}

#[test]
fn device_removal_completes_every_request_once() {
    let (_da, db, a, b) = pair("unplug", &UlpQpInit::default(), 4);
    removal_completes_once(a, b, || db.unplug());
}

#[derive(Debug, Clone, Copy)]
enum Ending {
    CloseRequester,
    CloseResponder,
    UnplugRequester,
    UnplugResponder,
    Nothing,
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        Just(Ending::CloseRequester),
        Just(Ending::CloseResponder),
        Just(Ending::UnplugRequester),
        Just(Ending::UnplugResponder),
        Just(Ending::Nothing),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, .. ProptestConfig::default() })]

    /// Random traffic with random errors, then a random ending (a QP
    /// closed, a device removed, or nothing), then everything dropped:
    /// every request is resolved exactly once (called at most once, its
    /// captures dropped once, after the call); only unsignaled requests
    /// may resolve without a call, and only if nothing failed before them
    /// on their queue; a call with success only for signaled requests.
    #[test]
    fn every_request_resolves_exactly_once(steps in prop::collection::vec(step(), 1..60), end in ending()) {
        let init = UlpQpInit { send_wr: 128, recv_wr: 128, ..UlpQpInit::default() };
        let (da, db, a, b) = pair("prop", &init, 4);
        random_traffic_case(a, b, &steps, |a, b| match end {
            Ending::CloseRequester => drop(a.qp.take()),
            Ending::CloseResponder => drop(b.qp.take()),
            Ending::UnplugRequester => da.unplug(),
            Ending::UnplugResponder => db.unplug(),
            Ending::Nothing => {}
        })?;
        drop(da);
        drop(db);
    }
}

/// A failing WR the layer did not post (no callback anywhere) is counted
/// and handed to the CQ's stray sink, never dropped silently.
#[test]
fn a_failed_wr_without_a_callback_is_counted_and_reported() {
    let (_da, _db, a, b) = pair("stray", &UlpQpInit::default(), 4);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    a.cq.set_stray_sink(move |wc| s.lock().unwrap().push((wc.wr_id, wc.status)));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let bad = RemoteAddr {
        addr: dst.addr(),
        rkey: dst.rkey() ^ 0x7700,
    };
    let sge = [src.sge(0, 8).unwrap()];
    let wr = SendWr::new(0xdead, SendOp::Write { remote: bad }, &sge);
    a.qp().qp().post_send(&[wr]).unwrap();
    poll_until(&[&a.cq, &b.cq], "the stray error", || !seen.lock().unwrap().is_empty());
    assert_eq!(*seen.lock().unwrap(), vec![(0xdead, WcStatus::RemAccessErr)]);
    let st = a.cq.stats();
    assert_eq!((st.stray, st.stray_errors), (1, 1));
}

/// Completions of one QP are retired a run at a time: a stray in the
/// middle of the run (a WR posted on the verbs QP directly) is counted,
/// and the requests before and after it each call their callback once.
#[test]
fn a_stray_within_a_run_of_one_qps_completions_is_counted_and_the_rest_retire() {
    let (_da, _db, a, b) = pair("run", &UlpQpInit::default(), 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let write = |i: usize| {
        let wr = UlpWr::write(LocalBuf::new(&src, 0, 16).unwrap(), dst.remote(64 * i as u64));
        a.qp().post(wr, cb(i, &log)).unwrap();
    };
    write(0);
    write(1);
    let sge = [src.sge(0, 8).unwrap()];
    let raw = SendWr::new(
        0xbeef,
        SendOp::Write {
            remote: dst.remote(1024),
        },
        &sge,
    )
    .flags(SendFlags::SIGNALED);
    a.qp().qp().post_send(&[raw]).unwrap();
    write(2);
    write(3);
    poll_until(&[&a.cq, &b.cq], "four writes", || count_resolved(&log) == 4);
    let log = log.lock().unwrap().clone();
    for i in 0..4 {
        assert_eq!(outcome(&log, i), (1, Some(WcStatus::Success), 1, true), "write {i}");
    }
    let st = a.cq.stats();
    assert_eq!((st.stray, st.stray_errors, st.callbacks), (1, 0, 4));
}

/// A buffer keeps the entry its MR gave when it was made: posting it after
/// the MR was re-registered smaller goes to the device with the old
/// address, which refuses it; the request completes once, with the error
/// (the layer does not panic).
#[test]
fn a_buffer_made_before_its_mr_shrank_completes_once_with_an_error() {
    let (_da, _db, a, b) = pair("rereg", &UlpQpInit::default(), 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let buf = LocalBuf::new(&src, 2048, 1024).unwrap();
    src.rereg(
        ReregFlags::CHANGE_TRANSLATION,
        None,
        Some(MemorySource::Owned(MrMemory::new(256).unwrap())),
        src.access(),
    )
    .unwrap();
    a.qp().post(UlpWr::write(buf, dst.remote(0)), cb(0, &log)).unwrap();
    poll_until(&[&a.cq, &b.cq], "the write", || count_resolved(&log) == 1);
    let (calls, status, drops, ordered) = outcome(&log.lock().unwrap(), 0);
    assert_eq!((calls, drops, ordered), (1, 1, true));
    assert_ne!(status, Some(WcStatus::Success));
}

/// A callback that panics unwinds out of the poll; the requests that poll
/// finished after it stay with the polling thread, and their callbacks
/// run, once, at its next poll (they are not dropped uncalled).
#[test]
fn after_a_panicking_callback_the_rest_of_its_poll_runs_at_the_next_one() {
    let (_da, _db, a, b) = pair("panic", &UlpQpInit::default(), 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    // A post to a QP in ERR is flushed at once: both completions are in
    // the CQ before the poll, which reads them together.
    to_err(a.qp());
    let wr = || UlpWr::write(LocalBuf::new(&src, 0, 8).unwrap(), dst.remote(0));
    a.qp().post(wr(), |_| panic!("the first callback panics")).unwrap();
    a.qp().post(wr(), cb(1, &log)).unwrap();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.cq.poll(16)));
    assert!(first.is_err(), "the panic unwinds out of the poll");
    a.cq.poll(16).unwrap();
    assert_eq!(
        outcome(&log.lock().unwrap(), 1),
        (1, Some(WcStatus::WrFlushErr), 1, true)
    );
}

/// Completions read one at a time (each the success of its queue's oldest
/// request, which the layer retires without its list of finished
/// requests) give their queue slots back and count their callbacks: more
/// round trips than either queue holds go through.
#[test]
fn lone_completions_give_their_slots_back_and_count_their_callbacks() {
    let init = UlpQpInit {
        send_wr: 2,
        recv_wr: 2,
        ..UlpQpInit::default()
    };
    let (_da, _db, a, b) = pair("alone_slots", &init, 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = b.mr(4096);
    let dst = a.mr(4096);
    for i in 0..6 {
        a.qp()
            .post_recv(vec![LocalBuf::new(&dst, 0, 64).unwrap()], cb(100 + i, &log))
            .unwrap();
        b.qp()
            .post(
                vec![UlpWr::send(vec![LocalBuf::new(&src, 0, 16).unwrap()])],
                cb(i, &log),
            )
            .unwrap();
        poll_until(&[&b.cq, &a.cq], "a round trip", || count_resolved(&log) == 2 * (i + 1));
    }
    for (end, what) in [(&a, "receiver"), (&b, "sender")] {
        let st = end.qp().stats();
        assert_eq!((st.callbacks, st.sq_used), (6, 0), "{what}");
        assert_eq!(end.cq.stats().callbacks, 6, "{what}");
    }
}

/// A poll that reads a single completion of the common case (the success
/// of its queue's oldest request, which the layer retires without its list
/// of finished requests) still runs first what a panicking callback left
/// in the thread's list, in order.
#[test]
fn a_lone_completion_after_a_panicking_callback_runs_after_the_requests_left_before_it() {
    let (_da, _db, a, b) = pair("panic_alone", &UlpQpInit::default(), 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let recv = || vec![LocalBuf::new(&dst, 0, 64).unwrap()];
    let send = || vec![UlpWr::send(vec![LocalBuf::new(&src, 0, 16).unwrap()])];
    for id in [10, 11] {
        b.qp().post_recv(recv(), cb(id, &log)).unwrap();
    }
    a.qp().post(send(), |_| panic!("the first callback panics")).unwrap();
    a.qp().post(send(), cb(1, &log)).unwrap();
    // Both received (b drives its device; a's does not run until a
    // polls): a's next poll reads both completions together.
    poll_until(&[&b.cq], "the two receives", || count_resolved(&log) == 2);
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.cq.poll(16)));
    assert!(first.is_err(), "the panic unwinds out of the poll");
    assert_eq!(
        a.cq.stats().polled,
        2,
        "both completions read by the poll that panicked"
    );
    assert_eq!(outcome(&log.lock().unwrap(), 1).0, 0, "left in the list");
    // A send from b to a receive of a: a's next poll takes it in and
    // reads its completion alone.
    let back = b.mr(4096);
    a.qp()
        .post_recv(vec![LocalBuf::new(&src, 0, 64).unwrap()], cb(2, &log))
        .unwrap();
    b.qp()
        .post(vec![UlpWr::send(vec![LocalBuf::new(&back, 0, 16).unwrap()])], |_| {})
        .unwrap();
    a.cq.poll(16).unwrap();
    assert_eq!(a.cq.stats().polled, 3, "the receive read alone");
    let log = log.lock().unwrap().clone();
    for id in [1, 2] {
        assert_eq!(outcome(&log, id), (1, Some(WcStatus::Success), 1, true), "request {id}");
    }
    let at = |id| log.iter().position(|e| *e == Ev::Called(id, WcStatus::Success));
    assert!(at(1) < at(2), "the one left runs first: {log:?}");
}

/// The callback of a completion read alone is called where it lies, in
/// the poller's frame, not moved out first. If it panics, its captures
/// are dropped once (by the unwinding, never again by the layer), the
/// request's MR is released, the counters say one callback, and the QP
/// goes on: the next lone completion calls its callback once.
#[test]
fn a_panicking_lone_callback_drops_its_captures_once_and_releases_its_mr() {
    let (_da, _db, a, b) = pair("panic_lone", &UlpQpInit::default(), 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let wr = || UlpWr::write(LocalBuf::new(&src, 0, 8).unwrap(), dst.remote(0));
    // A first WRITE: the CQ then knows the QP of its last completion,
    // which a completion read alone must be of.
    a.qp().post(wr(), cb(1, &log)).unwrap();
    poll_until(&[&a.cq, &b.cq], "the first WRITE", || count_resolved(&log) == 1);
    let probe = Probe {
        id: 0,
        log: log.clone(),
    };
    a.qp()
        .post(wr(), move |_| {
            let _keep = &probe;
            panic!("the lone callback panics");
        })
        .unwrap();
    assert_eq!(Arc::strong_count(&src), 2, "the request keeps its buffer's MR");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // Only a's CQ holds a completion of this WRITE; b's has none.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.cq.poll(1)));
        match r {
            Err(_) => break,
            Ok(n) => assert_eq!(n.unwrap(), 0, "the only completion panics"),
        }
        b.cq.poll(16).unwrap();
        assert!(std::time::Instant::now() < until, "timed out waiting for the WRITE");
        std::thread::yield_now();
    }
    assert_eq!(a.cq.stats().polled, 2, "read alone");
    assert_eq!(log.lock().unwrap()[2..], [Ev::Dropped(0)], "captures dropped once");
    assert_eq!(Arc::strong_count(&src), 1, "the MR was released");
    let st = a.qp().stats();
    assert_eq!((st.callbacks, st.sq_used), (2, 0));
    a.qp().post(wr(), cb(2, &log)).unwrap();
    poll_until(&[&a.cq, &b.cq], "the third WRITE", || count_resolved(&log) == 3);
    let log = log.lock().unwrap().clone();
    for id in [1, 2] {
        assert_eq!(outcome(&log, id), (1, Some(WcStatus::Success), 1, true), "WRITE {id}");
    }
    assert_eq!(log.iter().filter(|e| **e == Ev::Dropped(0)).count(), 1, "{log:?}");
    assert_eq!(Arc::strong_count(&src), 1);
}

/// A callback that polls its own CQ while the poll that called it is
/// still running its list: the inner poll reads what is left with a list
/// of its own and runs those callbacks at once; every callback runs
/// once, the outer poll's rest after the inner poll.
#[test]
fn a_callback_that_polls_its_cq_runs_the_rest_once() {
    let (_da, _db, a, b) = pair("nested", &UlpQpInit::default(), 4);
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let wr = || UlpWr::write(LocalBuf::new(&src, 0, 8).unwrap(), dst.remote(0));
    // A first WRITE: the CQ knows the QP of its last completion.
    a.qp().post(wr(), cb(9, &log)).unwrap();
    poll_until(&[&a.cq, &b.cq], "the first WRITE", || count_resolved(&log) == 1);
    // Three WRITEs flushed at once by a QP in ERR: three completions
    // wait in the CQ.
    to_err(a.qp());
    let inner = Arc::new(Mutex::new(None));
    let (cq, l, got) = (a.cq.clone(), log.clone(), inner.clone());
    let first = cb(0, &log);
    a.qp()
        .post(wr(), move |wc| {
            first(wc);
            // The outer poll holds this thread's list.
            *got.lock().unwrap() = Some(cq.poll(16).unwrap());
            drop(l);
        })
        .unwrap();
    a.qp().post(wr(), cb(1, &log)).unwrap();
    a.qp().post(wr(), cb(2, &log)).unwrap();
    assert_eq!(a.cq.poll(2).unwrap(), 2, "the outer poll reads two");
    assert_eq!(*inner.lock().unwrap(), Some(1), "the inner poll reads the third");
    let log = log.lock().unwrap().clone();
    for id in [0, 1, 2] {
        assert_eq!(
            outcome(&log, id),
            (1, Some(WcStatus::WrFlushErr), 1, true),
            "WRITE {id}"
        );
    }
    let at = |id| log.iter().position(|e| *e == Ev::Called(id, WcStatus::WrFlushErr));
    assert!(
        at(0) < at(2) && at(2) < at(1),
        "the inner poll's callback in between: {log:?}"
    );
    assert_eq!(a.cq.poll(16).unwrap(), 0);
    assert_eq!(a.qp().stats().sq_used, 0);
}

/// Posters on two threads and a worker polling the CQ on a third share one
/// QP: every request completes exactly once, its slot comes back, and the
/// counters agree. (The layer's bookkeeping of the QP and of the CQ is
/// guarded by one lock, the soft device's own, which posts and polls take
/// from any thread.)
#[test]
fn posters_on_two_threads_and_a_polling_worker_complete_every_request_once() {
    let (_da, _db, a, b) = pair("threads", &threads_init(), 4);
    posters_and_a_worker_complete_once(&a, &b, 400);
}

/// A buffer of a `'static` MR (no reference count per request) posts like
/// any other: its WRITE lands and its callback runs once; the same over a
/// SEND received into a `'static` MR, and a range outside the MR is
/// refused when the buffer is made.
#[test]
fn buffers_of_a_static_mr_post_and_complete_like_any_other() {
    let (_da, _db, a, b) = pair("static_mr", &UlpQpInit::default(), 4);
    let leak = |end: &End| -> &'static Mr {
        Box::leak(Box::new(
            end.pd
                .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                .unwrap(),
        ))
    };
    let (src, dst) = (leak(&a), leak(&b));
    src.write(0, b"statically").unwrap();
    assert!(LocalBuf::from_static(src, 4090, 16).is_err());
    let log = Arc::new(Mutex::new(Vec::new()));
    a.qp()
        .post(
            UlpWr::write(LocalBuf::from_static(src, 0, 10).unwrap(), dst.remote(100)),
            cb(1, &log),
        )
        .unwrap();
    b.qp()
        .post_recv(vec![LocalBuf::from_static(dst, 200, 64).unwrap()], cb(2, &log))
        .unwrap();
    a.qp()
        .post(
            vec![UlpWr::send(vec![LocalBuf::from_static(src, 0, 6).unwrap()])],
            cb(3, &log),
        )
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "three requests", || count_resolved(&log) == 3);
    let mut got = [0u8; 10];
    dst.read(100, &mut got).unwrap();
    assert_eq!(&got, b"statically");
    dst.read(200, &mut got[..6]).unwrap();
    assert_eq!(&got[..6], b"static");
    let st = a.qp().stats();
    assert_eq!((st.callbacks, st.sq_used), (2, 0));
}

/// Two WRITEs from `src` into `dst` (slot `k` of 128 bytes) as one chain.
fn write_chain(src: &Arc<Mr>, dst: &Arc<Mr>, k: u64, rkey_first: Option<u32>) -> Vec<UlpWr> {
    (0..2u64)
        .map(|i| {
            let mut remote = dst.remote(128 * k + 64 * i);
            if i == 0 {
                remote.rkey = rkey_first.unwrap_or(remote.rkey);
            }
            UlpWr::write(LocalBuf::new(src, 64 * i, 64).unwrap(), remote)
        })
        .collect()
}

/// Chains (requests of several WRs, retired through their less common
/// part): a signaled one calls once with success, an unsignaled one calls
/// nothing and is counted silent; each is dropped once.
#[test]
fn chains_call_once_when_signaled_and_nothing_when_not() {
    let (_da, _db, a, b) = pair("chains", &UlpQpInit::default(), 4);
    let log = Log::default();
    let (src, dst) = (a.mr(4096), b.mr(4096));
    a.qp()
        .post_unsignaled(write_chain(&src, &dst, 0, None), cb(0, &log))
        .unwrap();
    a.qp().post(write_chain(&src, &dst, 1, None), cb(1, &log)).unwrap();
    poll_until(&[&a.cq, &b.cq], "both chains", || count_resolved(&log) == 2);
    let log = log.lock().unwrap().clone();
    assert_eq!(outcome(&log, 0), (0, None, 1, true), "unsignaled chain: {log:?}");
    assert_eq!(
        outcome(&log, 1),
        (1, Some(WcStatus::Success), 1, true),
        "signaled chain"
    );
    let st = a.qp().stats();
    assert_eq!((st.callbacks, st.silent, st.sq_used), (1, 1, 0));
    assert_eq!(dst.to_vec(0, 256).unwrap()[..64], src.to_vec(0, 64).unwrap()[..]);
}

/// A chain whose first WR fails completes once, with that WR's error
/// (the first error of its WRs), not with the flush of its last WR.
#[test]
fn a_chain_whose_first_wr_fails_reports_that_error_once() {
    let (_da, _db, a, b) = pair("chainerr", &UlpQpInit::default(), 4);
    let log = Log::default();
    let (src, dst) = (a.mr(4096), b.mr(4096));
    let bad = dst.remote(0).rkey ^ 0x3300;
    a.qp().post(write_chain(&src, &dst, 0, Some(bad)), cb(0, &log)).unwrap();
    poll_until(&[&a.cq, &b.cq], "the failed chain", || count_resolved(&log) == 1);
    let log = log.lock().unwrap().clone();
    assert_eq!(outcome(&log, 0), (1, Some(WcStatus::RemAccessErr), 1, true), "{log:?}");
    let st = a.qp().stats();
    assert_eq!((st.callbacks, st.sq_used), (1, 0));
}
