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
use std::sync::atomic::Ordering;
use std::sync::Arc;
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
    let open = || Context::from_ops(dev.open().expect("open the device"));
    Some(connected(open(), open(), init, rd))
}

#[test]
fn signaled_success_calls_once_unsignaled_success_calls_nothing() {
    if let Some((a, b)) = hw_pair("callbacks", &UlpQpInit::default(), 4) {
        signaled_once_unsignaled_silent(&a, &b, true);
    }
}

/// Half the WRITEs through the one-plain-WR short path, half as chains.
#[test]
fn an_error_calls_every_request_it_completes_once_unsignaled_included() {
    if let Some((a, b)) = hw_pair("errors", &UlpQpInit::default(), 4) {
        errors_complete_once(&a, &b, |i| i % 3 == 0);
    }
}

/// Two posting threads and a polling worker on one QP, on the layer's own
/// mutexes (the hardware backend offers no engine lock).
#[test]
fn posters_on_two_threads_and_a_polling_worker_complete_every_request_once() {
    if let Some((a, b)) = hw_pair("threads", &threads_init(), 4) {
        posters_and_a_worker_complete_once(&a, &b, 30_000);
    }
}

#[test]
fn closing_a_qp_flushes_its_requests_before_their_captures_drop() {
    if let Some((a, b)) = hw_pair("close", &UlpQpInit::default(), 4) {
        close_flushes_before_captures_drop(a, b);
    }
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
        let posted = rw_write_pages((&a, &b), &locals, &remote, None, mode, (round * 16) as u8);
        assert!(!posted.fast_reg, "{mode:?}");
        assert_eq!(posted.wrs, 2, "four entries over WRs of two: {mode:?}");
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
    let (n, done) = counter();
    let posted = a
        .qp()
        .rw(RwDir::Read, sgl, remote.remote(4096), None, RwOptions::default(), done)
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
    let open = |who| sub.open(&name, who).unwrap();
    let (a, b) = connected(open("ulp_hw a"), open("ulp_hw b"), &UlpQpInit::default(), 4);
    removal_completes_once(a, b, || {
        let c = CString::new(name.as_str()).unwrap();
        // SAFETY: c is a NUL-terminated string that outlives the call.
        assert_eq!(unsafe { remove(c.as_ptr()) }, 0, "softverbs_remove_device({name})");
    });
}

/// How a case ends (the device's removal is the child-process test
/// above: the library removes its device for good).
#[derive(Debug, Clone, Copy)]
enum Ending {
    CloseRequester,
    CloseResponder,
    Nothing,
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
        let Some((a, b)) = hw_pair("every_request_resolves_exactly_once", &init, 4) else {
            return Ok(());
        };
        random_traffic_case(a, b, &steps, |a, b| match end {
            Ending::CloseRequester => drop(a.qp.take()),
            Ending::CloseResponder => drop(b.qp.take()),
            Ending::Nothing => {}
        })?;
    }
}
