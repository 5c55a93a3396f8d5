//! The callback ledger of the ULP tests (which request was called, with
//! what, and when its captures went) and the exactly-once scenarios that
//! both backends run: `ulp_callbacks.rs` on soft devices, `ulp_hw.rs` on
//! the hardware backend over softverbs' libibverbs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use softverbs::ulp::{Chain, LocalBuf, UlpQp, UlpWr};
use softverbs::verbs::*;

use super::{poll_until, End};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ev {
    Called(usize, WcStatus),
    Dropped(usize),
}

/// The ledger the callbacks of a test write to.
pub(crate) type Log = Arc<Mutex<Vec<Ev>>>;

/// Records when the callback holding it is dropped.
pub(crate) struct Probe {
    pub(crate) id: usize,
    pub(crate) log: Log,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.log.lock().unwrap().push(Ev::Dropped(self.id));
    }
}

/// A callback logging its call, then (as its captures go) its drop.
pub(crate) fn cb(id: usize, log: &Log) -> impl FnOnce(&WorkCompletion) + Send + 'static {
    let probe = Probe { id, log: log.clone() };
    move |wc| {
        probe.log.lock().unwrap().push(Ev::Called(probe.id, wc.status));
    }
}

/// Per request: `(calls, status of the first call, drops, the call came
/// before the drop)`.
pub(crate) fn outcome(log: &[Ev], id: usize) -> (usize, Option<WcStatus>, usize, bool) {
    let calls: Vec<(usize, WcStatus)> = log
        .iter()
        .enumerate()
        .filter_map(|(k, e)| match e {
            Ev::Called(i, s) if *i == id => Some((k, *s)),
            _ => None,
        })
        .collect();
    let drops: Vec<usize> = log
        .iter()
        .enumerate()
        .filter_map(|(k, e)| matches!(e, Ev::Dropped(i) if *i == id).then_some(k))
        .collect();
    let ordered = match (calls.first(), drops.first()) {
        (Some((c, _)), Some(d)) => c < d,
        _ => true,
    };
    (calls.len(), calls.first().map(|c| c.1), drops.len(), ordered)
}

/// How many requests were resolved (their captures dropped).
pub(crate) fn count_resolved(log: &Log) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Ev::Dropped(_)))
        .count()
}

/// A callback that checks its completion succeeded and counts it.
pub(crate) fn counter() -> (Arc<AtomicU32>, impl FnOnce(&WorkCompletion) + Send + 'static) {
    let n = Arc::new(AtomicU32::new(0));
    let c = n.clone();
    (n, move |wc: &WorkCompletion| {
        assert!(wc.is_success(), "{wc:?}");
        c.fetch_add(1, Ordering::SeqCst);
    })
}

/// Moves the layer's QP to ERR: what is posted after is flushed at once.
pub(crate) fn to_err(qp: &UlpQp) {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
}

/// Eight SENDs from `a` to receives of `b`, the odd ones signaled: one
/// callback per signaled success, none for the unsignaled ones (the last
/// send is signaled, and its completion proves those before it done), one
/// per receive, the bytes delivered. `plain`: each WR and its buffer given
/// inline (the layer's short path), else as `Vec`s.
pub(crate) fn signaled_once_unsignaled_silent(a: &End, b: &End, plain: bool) {
    let log = Log::default();
    let src = a.mr(4096);
    let dst = b.mr(4096);
    src.write(0, b"sixteen bytes!!!").unwrap();
    for i in 0..8 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&dst, 64 * i as u64, 64).unwrap()], cb(100 + i, &log))
            .unwrap();
    }
    for i in 0..8 {
        let wr: Chain = if plain {
            UlpWr::send(LocalBuf::new(&src, 0, 16).unwrap()).into()
        } else {
            vec![UlpWr::send(vec![LocalBuf::new(&src, 0, 16).unwrap()])].into()
        };
        if i % 2 == 1 {
            a.qp().post(wr, cb(i, &log)).unwrap();
        } else {
            a.qp().post_unsignaled(wr, cb(i, &log)).unwrap();
        }
    }
    poll_until(&[&a.cq, &b.cq], "8 receives and the last send", || {
        count_resolved(&log) == 16
    });
    let log = log.lock().unwrap().clone();
    for i in 0..8 {
        let (calls, status, drops, ordered) = outcome(&log, i);
        assert_eq!(drops, 1, "request {i}: {log:?}");
        assert!(ordered);
        if i % 2 == 1 {
            assert_eq!((calls, status), (1, Some(WcStatus::Success)), "signaled send {i}");
        } else {
            assert_eq!(calls, 0, "unsignaled send {i} succeeded: no callback");
        }
        assert_eq!(
            outcome(&log, 100 + i),
            (1, Some(WcStatus::Success), 1, true),
            "receive {i}"
        );
        assert_eq!(dst.to_vec(64 * i as u64, 16).unwrap(), b"sixteen bytes!!!");
    }
    assert_eq!(a.qp().stats().silent, 4);
    assert_eq!((a.cq.stats().stray, b.cq.stats().stray), (0, 0));
}

/// Ten WRITEs from `a`, alternately unsignaled, the fifth (unsignaled)
/// with a bad rkey: the ones before it succeed (callbacks for the
/// signaled ones), it fails once with a remote access error, every one
/// after it is flushed once, and each callback's captures go after its
/// call. `plain(i)`: WRITE `i` given inline (the short path), else as
/// `Vec`s.
pub(crate) fn errors_complete_once(a: &End, b: &End, plain: impl Fn(usize) -> bool) {
    let log = Log::default();
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let good = dst.remote(0);
    let bad = RemoteAddr {
        addr: good.addr,
        rkey: good.rkey ^ 0x5500,
    };
    for i in 0..10 {
        let remote = if i == 4 { bad } else { good };
        let wr: Chain = if plain(i) {
            UlpWr::write(LocalBuf::new(&src, 0, 32).unwrap(), remote).into()
        } else {
            vec![UlpWr::write(vec![LocalBuf::new(&src, 0, 32).unwrap()], remote)].into()
        };
        if i % 2 == 0 {
            a.qp().post_unsignaled(wr, cb(i, &log)).unwrap();
        } else {
            a.qp().post(wr, cb(i, &log)).unwrap();
        }
    }
    poll_until(&[&a.cq, &b.cq], "all ten writes", || count_resolved(&log) == 10);
    let log = log.lock().unwrap().clone();
    for i in 0..4 {
        let want = if i % 2 == 0 {
            (0, None, 1, true)
        } else {
            (1, Some(WcStatus::Success), 1, true)
        };
        assert_eq!(outcome(&log, i), want, "write {i} before the error: {log:?}");
    }
    assert_eq!(
        outcome(&log, 4),
        (1, Some(WcStatus::RemAccessErr), 1, true),
        "the failing unsignaled write: {log:?}"
    );
    for i in 5..10 {
        assert_eq!(
            outcome(&log, i),
            (1, Some(WcStatus::WrFlushErr), 1, true),
            "flushed write {i}: {log:?}"
        );
    }
}

/// Sixteen receives posted on `b`, then its QP closed: each is flushed
/// once before its captures drop, by the device (the layer makes none of
/// the flushes up: it moved the QP to ERR), and the QP's CQ entries come
/// back.
pub(crate) fn close_flushes_before_captures_drop(a: End, mut b: End) {
    let log = Log::default();
    let dst = b.mr(4096);
    for i in 0..16 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&dst, 0, 64).unwrap()], cb(i, &log))
            .unwrap();
    }
    let made_up = b.qp.take().expect("the QP").close();
    assert_eq!(made_up, 0, "the device flushed every request");
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 32, "{log:?}");
    for i in 0..16 {
        assert_eq!(
            outcome(&log, i),
            (1, Some(WcStatus::WrFlushErr), 1, true),
            "receive {i}"
        );
    }
    assert_eq!(
        b.cq.free_entries(),
        b.cq.cq().capacity(),
        "the QP's CQ entries came back"
    );
    drop(a);
}

/// Eight receives waiting on `b` and four unsignaled SENDs from it
/// RNR-retried (its peer `a` has no receive) when `remove` takes `b`'s
/// device away: every callback runs once, with an error, before its
/// captures drop.
pub(crate) fn removal_completes_once(a: End, mut b: End, remove: impl FnOnce()) {
    let log = Log::default();
    let dst = b.mr(4096);
    let src = b.mr(4096);
    for i in 0..8 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&dst, 0, 64).unwrap()], cb(i, &log))
            .unwrap();
    }
    for i in 8..12 {
        b.qp()
            .post_unsignaled(vec![UlpWr::send(vec![LocalBuf::new(&src, 0, 8).unwrap()])], cb(i, &log))
            .unwrap();
    }
    remove();
    poll_until(&[&b.cq], "the flushes of the removed device", || {
        count_resolved(&log) == 12
    });
    drop(b.qp.take());
    let log = log.lock().unwrap().clone();
    for i in 0..12 {
        let (calls, status, drops, ordered) = outcome(&log, i);
        assert_eq!((calls, drops, ordered), (1, 1, true), "request {i}: {log:?}");
        assert_ne!(status, Some(WcStatus::Success), "request {i}");
    }
    drop(a);
}

/// One step of the random-traffic property.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// A WRITE, signaled or not, with a good or a bad rkey.
    Write { signaled: bool, bad: bool },
    /// A receive on the peer.
    Recv,
    /// A SEND to the peer (consumes a receive; RNR-waits without one).
    Send { signaled: bool },
    /// Poll both CQs a little.
    Poll,
}

pub(crate) fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<bool>(), prop::bool::weighted(0.1)).prop_map(|(signaled, bad)| Step::Write { signaled, bad }),
        2 => Just(Step::Recv),
        2 => any::<bool>().prop_map(|signaled| Step::Send { signaled }),
        1 => Just(Step::Poll),
    ]
}

/// One case of the random-traffic property, on either backend: `steps`
/// posted from `a` to `b`, then `end` (a QP closed, a device removed, or
/// nothing), then everything settled and checked ([`settle_and_check`]):
/// every request resolved exactly once.
pub(crate) fn random_traffic_case(
    mut a: End,
    mut b: End,
    steps: &[Step],
    end: impl FnOnce(&mut End, &mut End),
) -> std::result::Result<(), TestCaseError> {
    let log = Log::default();
    let (src, dst) = (a.mr(4096), b.mr(4096));
    let meta = post_steps((&a, &src), (&b, &dst), steps, &log);
    end(&mut a, &mut b);
    settle_and_check(&mut a, &mut b, &log, &meta)
}

/// Runs `steps` from `a` (its buffer `src`) to `b` (its buffer `dst`,
/// which the WRITEs target), each request's callback logging to `log`.
/// Returns per request (by id): whether it was signaled, and whether it
/// is on `a`'s send queue (else a receive of `b`).
fn post_steps((a, src): (&End, &Arc<Mr>), (b, dst): (&End, &Arc<Mr>), steps: &[Step], log: &Log) -> Vec<(bool, bool)> {
    let good = dst.remote(0);
    let mut meta = Vec::new();
    for s in steps {
        let id = meta.len();
        let post = |wr: Chain, signaled: bool| {
            let r = if signaled {
                a.qp().post(wr, cb(id, log))
            } else {
                a.qp().post_unsignaled(wr, cb(id, log))
            };
            r.map_err(|e| e.error).unwrap();
        };
        match *s {
            Step::Write { signaled, bad } => {
                let remote = if bad {
                    RemoteAddr {
                        addr: good.addr,
                        rkey: good.rkey ^ 0x3300,
                    }
                } else {
                    good
                };
                post(
                    vec![UlpWr::write(vec![LocalBuf::new(src, 0, 64).unwrap()], remote)].into(),
                    signaled,
                );
                meta.push((signaled, true));
            }
            Step::Send { signaled } => {
                post(
                    vec![UlpWr::send(vec![LocalBuf::new(src, 0, 8).unwrap()])].into(),
                    signaled,
                );
                meta.push((signaled, true));
            }
            Step::Recv => {
                b.qp()
                    .post_recv(vec![LocalBuf::new(dst, 1024, 64).unwrap()], cb(id, log))
                    .map_err(|e| e.error)
                    .unwrap();
                meta.push((true, false));
            }
            Step::Poll => {
                a.cq.poll(8).unwrap();
                b.cq.poll(8).unwrap();
            }
        }
    }
    meta
}

/// After a case's ending: polls both ends a while, drops both QPs, and
/// checks that every request of `meta` ([`post_steps`]) resolved exactly
/// once (called at most once, its captures dropped once, after the
/// call); only unsignaled requests may resolve without a call, and only
/// if nothing failed before them on their queue; a call with success only
/// for signaled requests.
fn settle_and_check(
    a: &mut End,
    b: &mut End,
    log: &Log,
    meta: &[(bool, bool)],
) -> std::result::Result<(), TestCaseError> {
    for _ in 0..50 {
        let _ = a.cq.poll(64);
        let _ = b.cq.poll(64);
    }
    drop(a.qp.take());
    drop(b.qp.take());
    let log = log.lock().unwrap().clone();
    let mut failed_before = false;
    for (id, (signaled, on_a)) in meta.iter().enumerate() {
        let (calls, status, drops, ordered) = outcome(&log, id);
        prop_assert_eq!(drops, 1, "request {} resolved {} times: {:?}", id, drops, log);
        prop_assert!(calls <= 1 && ordered, "request {}: {:?}", id, log);
        if calls == 0 {
            prop_assert!(!signaled, "signaled request {} never called", id);
            prop_assert!(
                !failed_before,
                "unsignaled request {} after a failure was not called",
                id
            );
        }
        if status == Some(WcStatus::Success) {
            prop_assert!(*signaled);
        }
        if *on_a && status.is_some_and(|s| s != WcStatus::Success) {
            failed_before = true;
        }
    }
    Ok(())
}

/// The QP shape of [`posters_and_a_worker_complete_once`]: a send queue
/// shallow enough that the posters find it full now and then.
pub(crate) fn threads_init() -> softverbs::ulp::UlpQpInit {
    softverbs::ulp::UlpQpInit {
        send_wr: 32,
        ..softverbs::ulp::UlpQpInit::default()
    }
}

/// Posters on two threads and a worker polling the CQ on a third share
/// one QP (of [`threads_init`]), `per_thread` requests each: every
/// request completes exactly once, its slot comes back, and the counters
/// agree. On soft devices the
/// layer's bookkeeping of the QP and of its CQ is guarded by the device's
/// engine lock; on the hardware backend by the layer's own mutexes (the
/// QP's, which a poll of its CQ takes to retire its requests).
pub(crate) fn posters_and_a_worker_complete_once(a: &End, b: &End, per_thread: u32) {
    // Every third request is unsignaled, never a thread's last (it would
    // wait for a later completion that never comes).
    assert!(per_thread % 3 != 2, "a thread's last request must be signaled");
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let remote = dst.remote(0);
    let worker = softverbs::ulp::CqWorker::spawn(&a.cq).unwrap();
    let done = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let qp = a.qp();
    std::thread::scope(|s| {
        for t in 0..2u32 {
            let (src, done) = (src.clone(), done.clone());
            s.spawn(move || {
                let mut k = 0;
                while k < per_thread {
                    let d = done.clone();
                    let buf = LocalBuf::new(&src, u64::from(t) * 64, 8).unwrap();
                    let signaled = k % 3 != 1;
                    let wr = UlpWr::write(buf, remote);
                    let cb = move |wc: &WorkCompletion| {
                        assert!(wc.is_success(), "{wc:?}");
                        d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    };
                    let r = if signaled {
                        qp.post(wr, cb)
                    } else {
                        qp.post_unsignaled(wr, cb)
                    };
                    match r {
                        Ok(()) => k += 1,
                        // The queue is full: the worker frees slots.
                        Err(e) if e.error.kind() == ErrorKind::NoMemory => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    let signaled = 2 * (0..per_thread).filter(|k| k % 3 != 1).count() as u32;
    // The last request of each thread is signaled, so every unsignaled one
    // retires (silently) before the counts settle.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while done.load(std::sync::atomic::Ordering::SeqCst) < signaled || qp.stats().sq_used > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "requests still outstanding: {:?}",
            qp.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(worker);
    let st = qp.stats();
    assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), signaled);
    assert_eq!(
        (st.requests, st.callbacks, st.silent, st.sq_used),
        (
            u64::from(2 * per_thread),
            u64::from(signaled),
            u64::from(2 * per_thread - signaled),
            0
        )
    );
    assert_eq!(a.cq.stats().callbacks, u64::from(signaled));
}
