//! The ULP layer over the hardware backend, run for real on the device of
//! softverbs' own `libibverbs.so.1` (`emulator/ibverbs`), which the
//! backend reaches through `rdma-sys` like any libibverbs: completion
//! callbacks exactly once for successes, errors and flushes (unsignaled
//! requests included), a closing QP flushing before captures drop, and
//! read/write contexts falling back to plain SGEs where user-space verbs
//! have no REG_MR work request.
//!
//! Run with the library first on the search path (`emulator/ibverbs/
//! run_hw_tests.sh` does this):
//!
//! ```text
//! emulator/ibverbs/mklibdir.sh /tmp/sv
//! LD_LIBRARY_PATH=/tmp/sv cargo test -p softverbs --features hardware --test ulp_hw
//! ```
//!
//! Both ends are QPs of the one device the library gives a process,
//! connected to each other. Where libibverbs lists no device (rdma-core's
//! without a NIC), every test prints a `SKIP:` line. The device removal
//! runs in a child process (this test binary, re-run with that test
//! selected): the library removes its device for good, through its
//! exported `softverbs_remove_device`, as when the kernel disassociates a
//! device.
#![cfg(feature = "hardware")]

mod ulp_common;

use std::ffi::{c_char, c_int, CString};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use softverbs::subsystem::{HwFactory, NamespaceId, Subsystem, SubsystemConfig};
use softverbs::ulp::*;
use softverbs::verbs::*;
use ulp_common::*;

/// Set in the child process that runs the device removal.
const CHILD_ENV: &str = "SOFTVERBS_ULP_HW_CHILD";

/// `softverbs_remove_device(const char *name)`.
type RemoveFn = unsafe extern "C" fn(*const c_char) -> c_int;

/// The library's removal control, if the libibverbs this process loaded
/// is softverbs'.
fn remover() -> Option<RemoveFn> {
    // SAFETY: RTLD_DEFAULT searches the objects already loaded; the name
    // is NUL-terminated.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"softverbs_remove_device".as_ptr()) };
    // SAFETY: the library exports it with exactly this C signature.
    (!sym.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RemoveFn>(sym) })
}

/// Two ends on the first hardware device, connected (`rd` READ credits
/// each way); `None` (after a `SKIP:` line) without one.
fn hw_pair(test: &str, init: &UlpQpInit, rd: u8) -> Option<(End, End)> {
    let dev = match softverbs::hw::provider().devices() {
        Ok(devs) if !devs.is_empty() => devs.into_iter().next().unwrap(),
        Ok(_) => {
            println!("SKIP: {test}: libibverbs lists no RDMA device");
            return None;
        }
        Err(e) => {
            println!("SKIP: {test}: no RDMA support ({e})");
            return None;
        }
    };
    println!("{test}: on {}", dev.name());
    let a = End::from_ctx(Context::from_ops(dev.open().expect("open the device")), init, 1024);
    let b = End::from_ctx(
        Context::from_ops(dev.open().expect("open the device again")),
        init,
        1024,
    );
    connect_one(&a, &b, rd, 7);
    connect_one(&b, &a, rd, 7);
    Some((a, b))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Called(usize, WcStatus),
    Dropped(usize),
}

/// Records when the callback holding it is dropped.
struct Probe {
    id: usize,
    log: Arc<Mutex<Vec<Ev>>>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.log.lock().unwrap().push(Ev::Dropped(self.id));
    }
}

/// A callback logging its call, then (as its captures go) its drop.
fn cb(id: usize, log: &Arc<Mutex<Vec<Ev>>>) -> impl FnOnce(&WorkCompletion) + Send + 'static {
    let probe = Probe { id, log: log.clone() };
    move |wc| {
        probe.log.lock().unwrap().push(Ev::Called(probe.id, wc.status));
    }
}

/// Per request: `(calls, status of the first call, drops, the call came
/// before the drop)`.
fn outcome(log: &[Ev], id: usize) -> (usize, Option<WcStatus>, usize, bool) {
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

fn resolved(log: &Arc<Mutex<Vec<Ev>>>) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Ev::Dropped(_)))
        .count()
}

#[test]
fn signaled_success_calls_once_unsignaled_success_calls_nothing() {
    let Some((a, b)) = hw_pair("callbacks", &UlpQpInit::default(), 4) else {
        return;
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    src.write(0, b"sixteen bytes!!!").unwrap();
    for i in 0..8 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&dst, 64 * i as u64, 64).unwrap()], cb(100 + i, &log))
            .unwrap();
    }
    for i in 0..8 {
        let wr = UlpWr::send(LocalBuf::new(&src, 0, 16).unwrap());
        if i % 2 == 1 {
            a.qp().post(wr, cb(i, &log)).unwrap();
        } else {
            a.qp().post_unsignaled(wr, cb(i, &log)).unwrap();
        }
    }
    poll_until(&[&a.cq, &b.cq], "8 receives and the last send", || resolved(&log) == 16);
    let log = log.lock().unwrap().clone();
    for i in 0..8 {
        let (calls, status, drops, ordered) = outcome(&log, i);
        assert_eq!((drops, ordered), (1, true), "send {i}: {log:?}");
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

/// A WRITE with a bad rkey in the middle of signaled and unsignaled
/// ones: the requests before it succeed (callbacks for the signaled
/// ones), it fails once with a remote access error, every request after
/// it is flushed once, and each callback's captures go after its call.
#[test]
fn an_error_calls_every_request_it_completes_once_unsignaled_included() {
    let Some((a, b)) = hw_pair("errors", &UlpQpInit::default(), 4) else {
        return;
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = a.mr(4096);
    let dst = b.mr(4096);
    let good = dst.remote(0);
    let bad = RemoteAddr {
        addr: good.addr,
        rkey: good.rkey ^ 0x5500,
    };
    for i in 0..10 {
        let remote = if i == 4 { bad } else { good };
        // Half through the one-plain-WR short path, half as chains.
        let wr: Chain = if i % 3 == 0 {
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
    poll_until(&[&a.cq, &b.cq], "all ten writes", || resolved(&log) == 10);
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

#[test]
fn closing_a_qp_flushes_its_requests_before_their_captures_drop() {
    let Some((a, mut b)) = hw_pair("close", &UlpQpInit::default(), 4) else {
        return;
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let dst = b.mr(4096);
    for i in 0..16 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&dst, 0, 64).unwrap()], cb(i, &log))
            .unwrap();
    }
    drop(b.qp.take());
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

/// Read/write contexts on a device without REG_MR work requests: the
/// probe says so, `Auto` and `Plain` split a scatter list longer than
/// `max_send_sge` over several plain WRs, asking for fast registration
/// is refused with the callback handed back uncalled, and the bytes move
/// both ways.
#[test]
fn read_write_contexts_fall_back_to_plain_sges() {
    let init = UlpQpInit {
        send_wr: 32,
        recv_wr: 32,
        max_send_sge: 2,
        rw_ctxs: 8,
        rw_max_sges: 8,
        ..UlpQpInit::default()
    };
    let Some((a, b)) = hw_pair("rw", &init, 4) else {
        return;
    };
    let caps = RwCaps::probe(&a.ctx, &a.pd).unwrap();
    assert!(!caps.fast_reg, "user-space verbs have no REG_MR WR: {caps:?}");
    assert_eq!(caps.max_fast_reg_pages, 0);
    let remote = b.mr(8 * 4096);
    let locals: Vec<Arc<Mr>> = (0..4).map(|_| a.mr(4096)).collect();
    for (round, mode) in [RegMode::Auto, RegMode::Plain].into_iter().enumerate() {
        for (k, m) in locals.iter().enumerate() {
            let v: Vec<u8> = (0..4096u32).map(|x| (x as u8) ^ (round * 16 + k) as u8).collect();
            m.write(0, &v).unwrap();
        }
        let sgl: Vec<LocalBuf> = locals.iter().map(|m| LocalBuf::whole(m).unwrap()).collect();
        let n = Arc::new(AtomicU32::new(0));
        let c = n.clone();
        let posted = a
            .qp()
            .rw(
                RwDir::Write,
                sgl,
                remote.remote(0),
                None,
                RwOptions {
                    mode,
                    ..RwOptions::default()
                },
                move |wc| {
                    assert!(wc.is_success(), "{wc:?}");
                    c.fetch_add(1, Ordering::SeqCst);
                },
            )
            .unwrap();
        assert!(!posted.fast_reg, "{mode:?}");
        assert_eq!(posted.wrs, 2, "four entries over WRs of two: {mode:?}");
        poll_until(&[&a.cq, &b.cq], "the write context", || n.load(Ordering::SeqCst) == 1);
        for (k, m) in locals.iter().enumerate() {
            assert_eq!(
                remote.to_vec(k as u64 * 4096, 4096).unwrap(),
                m.to_vec(0, 4096).unwrap(),
                "{mode:?} page {k}"
            );
        }
    }
    // Fast registration asked for: refused, the callback comes back.
    let sgl = vec![LocalBuf::whole(&locals[0]).unwrap()];
    let refused = a.qp().rw(
        RwDir::Write,
        sgl,
        remote.remote(0),
        None,
        RwOptions {
            mode: RegMode::FastReg,
            ..RwOptions::default()
        },
        |_| panic!("a refused context's callback must not run"),
    );
    assert!(refused.is_err());
    // READ back into fresh buffers with plain SGEs.
    let v: Vec<u8> = (0..8 * 4096u32).map(|x| (x % 251) as u8).collect();
    remote.write(0, &v).unwrap();
    let sinks: Vec<Arc<Mr>> = (0..4).map(|_| a.mr(4096)).collect();
    let sgl: Vec<LocalBuf> = sinks.iter().map(|m| LocalBuf::whole(m).unwrap()).collect();
    let n = Arc::new(AtomicU32::new(0));
    let c = n.clone();
    let posted = a
        .qp()
        .rw(
            RwDir::Read,
            sgl,
            remote.remote(4096),
            None,
            RwOptions::default(),
            move |wc| {
                assert!(wc.is_success(), "{wc:?}");
                c.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
    assert!(!posted.fast_reg);
    poll_until(&[&a.cq, &b.cq], "the read context", || n.load(Ordering::SeqCst) == 1);
    for (k, m) in sinks.iter().enumerate() {
        assert_eq!(
            m.to_vec(0, 4096).unwrap(),
            remote.to_vec((k as u64 + 1) * 4096, 4096).unwrap(),
            "page {k}"
        );
    }
    assert_eq!((a.cq.stats().stray, b.cq.stats().stray), (0, 0));
}

/// The device goes away (removed through the library) while receives wait
/// and unsignaled SENDs are RNR-retried (the peer has no receive): under
/// the subsystem, whose removal sequence flushes what the device no longer
/// will, every request's callback runs exactly once, with an error, before
/// its captures drop.
#[test]
fn device_removal_completes_every_request_once() {
    const TEST: &str = "device_removal_completes_every_request_once";
    if std::env::var_os(CHILD_ENV).is_none() {
        if remover().is_none() {
            println!("SKIP: {TEST}: the loaded libibverbs is not softverbs' (no softverbs_remove_device)");
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let out = Command::new(exe)
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .output()
            .expect("run the removal in a child process");
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "the child failed ({}):\n{so}\n{se}", out.status);
        assert!(so.contains("1 passed"), "the child ran no test:\n{so}\n{se}");
        return;
    }
    let remove = remover().expect("softverbs' libibverbs is loaded");
    let devs = softverbs::hw::provider().devices().expect("the library's device list");
    let name = devs.first().expect("the library lists its device").name().to_string();
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    }));
    sub.add_device(HwFactory::new(&sub, &name), NamespaceId::INIT)
        .expect("add the library's device");
    let init = UlpQpInit::default();
    let a = End::from_ctx(sub.open(&name, "ulp_hw a").unwrap(), &init, 256);
    let mut b = End::from_ctx(sub.open(&name, "ulp_hw b").unwrap(), &init, 256);
    connect_one(&a, &b, 4, 7);
    connect_one(&b, &a, 4, 7);
    let log = Arc::new(Mutex::new(Vec::new()));
    let dst = b.mr(4096);
    let src = b.mr(4096);
    for i in 0..8 {
        b.qp()
            .post_recv(vec![LocalBuf::new(&dst, 0, 64).unwrap()], cb(i, &log))
            .unwrap();
    }
    for i in 8..12 {
        b.qp()
            .post_unsignaled(UlpWr::send(LocalBuf::new(&src, 0, 8).unwrap()), cb(i, &log))
            .unwrap();
    }
    let c = CString::new(name.as_str()).unwrap();
    // SAFETY: c is a NUL-terminated string that outlives the call.
    assert_eq!(unsafe { remove(c.as_ptr()) }, 0, "softverbs_remove_device({name})");
    poll_until(&[&b.cq], "the flushes of the removed device", || resolved(&log) == 12);
    drop(b.qp.take());
    let log = log.lock().unwrap().clone();
    for i in 0..12 {
        let (calls, status, drops, ordered) = outcome(&log, i);
        assert_eq!((calls, drops, ordered), (1, 1, true), "request {i}: {log:?}");
        assert_ne!(status, Some(WcStatus::Success), "request {i}");
    }
    drop(a);
}

#[derive(Debug, Clone)]
enum Step {
    /// A WRITE, signaled or not, with a good or a bad rkey.
    Write { signaled: bool, bad: bool },
    /// A receive on the peer.
    Recv,
    /// A SEND to the peer (consumes a receive; RNR-waits without one).
    Send { signaled: bool },
    /// Poll both CQs a little.
    Poll,
}

/// How a case ends (the device's removal is the child-process test
/// above: the library removes its device for good).
#[derive(Debug, Clone, Copy)]
enum Ending {
    CloseRequester,
    CloseResponder,
    Nothing,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<bool>(), prop::bool::weighted(0.1)).prop_map(|(signaled, bad)| Step::Write { signaled, bad }),
        2 => Just(Step::Recv),
        2 => any::<bool>().prop_map(|signaled| Step::Send { signaled }),
        1 => Just(Step::Poll),
    ]
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        Just(Ending::CloseRequester),
        Just(Ending::CloseResponder),
        Just(Ending::Nothing),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, .. ProptestConfig::default() })]

    /// Random traffic with random errors on the hardware backend, then a
    /// random ending (a QP closed, or nothing), then everything dropped:
    /// every request is resolved exactly once (called at most once, its
    /// captures dropped once, after the call); only unsignaled requests
    /// may resolve without a call, and only if nothing failed before them
    /// on their queue; a call with success only for signaled requests.
    #[test]
    fn every_request_resolves_exactly_once(steps in prop::collection::vec(step(), 1..60), end in ending()) {
        let init = UlpQpInit { send_wr: 128, recv_wr: 128, ..UlpQpInit::default() };
        let Some((mut a, mut b)) = hw_pair("every_request_resolves_exactly_once", &init, 4) else {
            return Ok(());
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let src = a.mr(4096);
        let dst = b.mr(4096);
        let good = dst.remote(0);
        // id -> (signaled, on a's send queue)
        let mut meta: Vec<(bool, bool)> = Vec::new();
        for s in &steps {
            let id = meta.len();
            match *s {
                Step::Write { signaled, bad } => {
                    let remote = if bad { RemoteAddr { addr: good.addr, rkey: good.rkey ^ 0x3300 } } else { good };
                    let wr = UlpWr::write(LocalBuf::new(&src, 0, 64).unwrap(), remote);
                    let r = if signaled { a.qp().post(wr, cb(id, &log)) } else { a.qp().post_unsignaled(wr, cb(id, &log)) };
                    r.map_err(|e| e.error).unwrap();
                    meta.push((signaled, true));
                }
                Step::Send { signaled } => {
                    let wr = vec![UlpWr::send(vec![LocalBuf::new(&src, 0, 8).unwrap()])];
                    let r = if signaled { a.qp().post(wr, cb(id, &log)) } else { a.qp().post_unsignaled(wr, cb(id, &log)) };
                    r.map_err(|e| e.error).unwrap();
                    meta.push((signaled, true));
                }
                Step::Recv => {
                    b.qp().post_recv(vec![LocalBuf::new(&dst, 1024, 64).unwrap()], cb(id, &log)).map_err(|e| e.error).unwrap();
                    meta.push((true, false));
                }
                Step::Poll => {
                    a.cq.poll(8).unwrap();
                    b.cq.poll(8).unwrap();
                }
            }
        }
        match end {
            Ending::CloseRequester => drop(a.qp.take()),
            Ending::CloseResponder => drop(b.qp.take()),
            Ending::Nothing => {}
        }
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
                prop_assert!(!failed_before, "unsignaled request {} after a failure was not called", id);
            }
            if status == Some(WcStatus::Success) {
                prop_assert!(*signaled);
            }
            if *on_a && status.is_some_and(|s| s != WcStatus::Success) {
                failed_before = true;
            }
        }
    }
}
