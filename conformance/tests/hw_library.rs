//! Hotplug and namespace properties of the hardware backend, run for real
//! on the devices of softverbs' own `libibverbs.so.1` (`emulator/ibverbs`),
//! which the backend reaches through `rdma-sys` like any libibverbs.
//!
//! Run with the library first on the search path (`emulator/ibverbs/
//! run_hw_tests.sh` does this):
//!
//! ```text
//! emulator/ibverbs/mklibdir.sh /tmp/sv
//! LD_LIBRARY_PATH=/tmp/sv cargo test -p softverbs-conformance --features hardware --test hw_library
//! ```
//!
//! The library removes a device from outside the application with its
//! exported `softverbs_remove_device` (found here with `dlsym`): every open
//! context gets `IBV_EVENT_DEVICE_FATAL` and the device leaves the list, as
//! when the kernel disassociates a device. So the backend's event monitor,
//! the subsystem's removal sequence and the backend's synthesized flushes
//! run on a real libibverbs. A process has one library device and a
//! removed device does not come back, so each removal runs in a child
//! process of its own (this test binary, re-run with one test selected).
//! Without the library (rdma-core's, with or without a NIC) every test
//! prints a `SKIP:` line.
#![cfg(feature = "hardware")]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softverbs::hw::HwEvent;
use softverbs::subsystem::{
    Client, ClientScope, DeviceRef, HwDiscovery, HwFactory, NamespaceId, RemovalReason, Subsystem, SubsystemConfig,
};
use softverbs::verbs::*;
use softverbs_conformance::harness::*;

/// Set in a child process to the scenario it runs.
const CHILD_ENV: &str = "SOFTVERBS_HW_LIBRARY_SCENARIO";

/// How long anything that must happen may take (a loaded 2-core machine).
const GENEROUS: Duration = Duration::from_secs(20);

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// `softverbs_remove_device(const char *name)`.
type RemoveFn = unsafe extern "C" fn(*const c_char) -> c_int;

/// The library's removal control, if the libibverbs this process loaded is
/// softverbs' (rdma-sys links libibverbs, so it is loaded at start).
fn remover() -> Option<RemoveFn> {
    // SAFETY: RTLD_DEFAULT (a null handle on glibc) searches the loaded
    // objects; the name is NUL-terminated.
    let sym = unsafe { dlsym(std::ptr::null_mut(), c"softverbs_remove_device".as_ptr()) };
    if sym.is_null() {
        None
    } else {
        // SAFETY: the library exports it with exactly this C signature.
        Some(unsafe { std::mem::transmute::<*mut c_void, RemoveFn>(sym) })
    }
}

/// Why the tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    if remover().is_none() {
        return Some(
            "the loaded libibverbs is not softverbs' (no softverbs_remove_device): run with LD_LIBRARY_PATH at emulator/ibverbs/mklibdir.sh's directory".into(),
        );
    }
    None
}

/// The library's device (its name) and its removal control.
fn library_device() -> (String, RemoveFn) {
    let remove = remover().expect("softverbs' libibverbs is loaded");
    let devs = devices(Some(BackendKind::Hardware)).expect("ibv_get_device_list through rdma-sys");
    let dev = devs.first().expect("the library lists its device");
    (dev.name().to_string(), remove)
}

/// Unplugs `name` through the library, as a test harness would.
fn unplug(remove: RemoveFn, name: &str) {
    let c = CString::new(name).expect("device name");
    // SAFETY: c is a NUL-terminated string that outlives the call.
    let rc = unsafe { remove(c.as_ptr()) };
    assert_eq!(rc, 0, "softverbs_remove_device({name})");
}

/// Runs `body` in a child process (`scenario` selects it there), or, in
/// the child, runs it.
fn isolated(test: &str, scenario: &str, body: impl FnOnce()) {
    if let Ok(s) = std::env::var(CHILD_ENV) {
        if s == scenario {
            body();
        }
        return;
    }
    if let Some(why) = skip_reason() {
        println!("SKIP {test}: {why}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .output()
        .expect("run the scenario in a child process");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "scenario {scenario} failed ({}):\n{so}\n{se}",
        out.status
    );
    assert!(
        so.contains("1 passed"),
        "scenario {scenario}: the child ran no test:\n{so}\n{se}"
    );
}

/// A subsystem with the library's device under it through [`HwFactory`]
/// (a monitor thread included), and the device's hardware events.
fn rig(
    name: &str,
) -> (
    Arc<Subsystem>,
    std::sync::mpsc::Receiver<softverbs::subsystem::HwDeviceEvent>,
) {
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    }));
    let factory = HwFactory::new(&sub, name);
    let events = factory.hub().subscribe();
    let info = sub
        .add_device(factory, NamespaceId::INIT)
        .expect("add the library's device");
    assert_eq!(info.backend, BackendKind::Hardware);
    (sub, events)
}

/// Counts completions per wr_id of one CQ.
#[derive(Default)]
struct Ledger {
    posted: Vec<u64>,
    seen: HashMap<u64, u32>,
    statuses: Vec<WcStatus>,
}

impl Ledger {
    /// Polls until every posted WR completed, then checks each did exactly
    /// once (success or flush) and that nothing else arrives.
    fn drain(&mut self, cq: &Cq, what: &str) {
        let start = Instant::now();
        let mut wc = [WorkCompletion::default(); 32];
        while self.seen.values().sum::<u32>() < self.posted.len() as u32 {
            let n = cq
                .poll(&mut wc)
                .unwrap_or_else(|e| panic!("{what}: poll after removal: {e}"));
            for w in &wc[..n] {
                assert!(
                    matches!(w.status, WcStatus::Success | WcStatus::WrFlushErr),
                    "{what}: wr {} completed with {:?}",
                    w.wr_id,
                    w.status
                );
                *self.seen.entry(w.wr_id).or_default() += 1;
                self.statuses.push(w.status);
            }
            assert!(
                start.elapsed() < GENEROUS,
                "{what}: {} of {} posted WRs completed within {GENEROUS:?}",
                self.seen.values().sum::<u32>(),
                self.posted.len()
            );
            if n == 0 {
                std::thread::yield_now();
            }
        }
        for id in &self.posted {
            assert_eq!(
                self.seen.get(id).copied().unwrap_or(0),
                1,
                "{what}: completions of wr {id}"
            );
        }
        assert!(
            stays_empty(cq, Duration::from_millis(50)).expect("poll"),
            "{what}: a completion arrived for a WR never posted"
        );
    }
}

/// Waits for the backend's monitor to report DEVICE_FATAL.
fn wait_fatal(events: &std::sync::mpsc::Receiver<softverbs::subsystem::HwDeviceEvent>, name: &str) {
    let deadline = Instant::now() + GENEROUS;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(e) if e.event == HwEvent::DeviceFatal => {
                assert_eq!(e.device, name);
                return;
            }
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => panic!("the monitor reported no DEVICE_FATAL within {GENEROUS:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the monitor's event hub went away without DEVICE_FATAL"),
        }
    }
}

/// Waits until the subsystem no longer has `name` (the removal sequence ran).
fn wait_removed(sub: &Subsystem, name: &str) {
    let deadline = Instant::now() + GENEROUS;
    while sub.device(name).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the subsystem still has {name} {GENEROUS:?} after DEVICE_FATAL"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// DEVICE_FATAL is the last async event of `ctx`.
fn fatal_is_last(ctx: &Context) {
    let deadline = Instant::now() + GENEROUS;
    let mut last = None;
    while last != Some(EventType::DeviceFatal) {
        match ctx
            .get_async_event(Some(Duration::from_millis(50)))
            .expect("get_async_event")
        {
            Some(e) => last = Some(e.event_type),
            None => assert!(Instant::now() < deadline, "no DEVICE_FATAL on the context"),
        }
    }
    assert!(
        ctx.get_async_event(Some(Duration::from_millis(50)))
            .expect("get_async_event")
            .is_none(),
        "an async event after DEVICE_FATAL"
    );
}

fn removal_mid_traffic_scenario() {
    let (name, remove) = library_device();
    let (sub, events) = rig(&name);
    let ca = sub.open(&name, "hw_library").expect("open A");
    let cb = sub.open(&name, "hw_library").expect("open B");
    let cfg = PairConfig {
        cq_depth: 1024,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..PairConfig::default()
    };
    let p = Pair::new(&ca, &cb, cfg).expect("an RC pair on the library's device");
    // Traffic works before the removal (a real run, not only flushes).
    let sge = [p.a.mr.sge(0, 64).expect("sge")];
    p.b.post_recv(1, 0, 64).expect("post_recv");
    p.a.qp
        .post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .expect("post_send");
    assert_eq!(
        p.a.wait_send(GENEROUS).expect("send completion").status,
        WcStatus::Success
    );
    assert_eq!(
        p.b.wait_recv(GENEROUS).expect("recv completion").status,
        WcStatus::Success
    );

    let (mut a_send, mut a_recv, mut b_recv) = (Ledger::default(), Ledger::default(), Ledger::default());
    for i in 0..32 {
        p.b.post_recv(1000 + i, 0, 64).expect("post_recv B");
        b_recv.posted.push(1000 + i);
    }
    for i in 0..16 {
        p.a.post_recv(2000 + i, 4096, 64).expect("post_recv A");
        a_recv.posted.push(2000 + i);
    }
    let post_some = |from: u64, to: u64, ledger: &mut Ledger| {
        for i in from..to {
            let op = if i % 2 == 0 {
                SendOp::Send
            } else {
                SendOp::Write {
                    remote: p.b.mr.remote(0),
                }
            };
            match p.a.qp.post_send(&[SendWr::new(i, op, &sge).flags(SendFlags::SIGNALED)]) {
                Ok(()) => ledger.posted.push(i),
                Err(e) => assert!(
                    matches!(e.error.kind(), ErrorKind::NoDevice | ErrorKind::NoMemory),
                    "post during removal failed with {}",
                    e.error
                ),
            }
        }
    };
    post_some(10, 50, &mut a_send);
    unplug(remove, &name);
    // Posts after the removal still complete exactly once (with a flush),
    // or fail at once.
    post_some(50, 70, &mut a_send);

    wait_fatal(&events, &name);
    a_send.drain(&p.a.scq, "A's sends");
    a_recv.drain(&p.a.rcq, "A's receives");
    b_recv.drain(&p.b.rcq, "B's receives");
    assert!(
        a_recv.statuses.iter().all(|s| *s == WcStatus::WrFlushErr),
        "A's receives had no sender: {:?}",
        a_recv.statuses
    );
    println!(
        "A's sends: {} posted, {} flushed",
        a_send.posted.len(),
        a_send.statuses.iter().filter(|s| **s == WcStatus::WrFlushErr).count()
    );
    wait_removed(&sub, &name);
    // The removal ran: a post is either taken by the backend's shadow rings
    // only and completed by the backend itself (a synthesized
    // WR_FLUSH_ERR), once, or — once the device went inert after the
    // removal deadline — refused with ENODEV.
    let (mut late_send, mut late_recv) = (Ledger::default(), Ledger::default());
    match p
        .a
        .qp
        .post_send(&[SendWr::new(90, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
    {
        Ok(()) => late_send.posted.push(90),
        Err(e) => assert_eq!(e.error.kind(), ErrorKind::NoDevice, "a post after the removal: {e}"),
    }
    match p.b.post_recv(91, 0, 64) {
        Ok(()) => late_recv.posted.push(91),
        Err(e) => assert_eq!(e.kind(), ErrorKind::NoDevice, "a receive after the removal: {e}"),
    }
    late_send.drain(&p.a.scq, "A's send after the removal");
    late_recv.drain(&p.b.rcq, "B's receive after the removal");
    assert!(late_send.statuses.iter().all(|s| *s == WcStatus::WrFlushErr));
    assert!(late_recv.statuses.iter().all(|s| *s == WcStatus::WrFlushErr));
    // Control verbs fail with ENODEV; DEVICE_FATAL is the last async event.
    assert_eq!(ca.alloc_pd().map(|_| ()).unwrap_err().kind(), ErrorKind::NoDevice);
    assert_eq!(
        cb.create_cq(4, 0, None, 0).map(|_| ()).unwrap_err().kind(),
        ErrorKind::NoDevice
    );
    fatal_is_last(&ca);
    fatal_is_last(&cb);
    // Destroys succeed after the removal.
    let Pair { a, b, .. } = p;
    for side in [a, b] {
        side.qp.destroy().expect("destroy a QP of a removed device");
        side.mr.destroy().expect("destroy an MR of a removed device");
        side.scq.destroy().expect("destroy a CQ of a removed device");
        side.rcq.destroy().expect("destroy a CQ of a removed device");
        side.pd.destroy().expect("destroy a PD of a removed device");
    }
    // The library no longer lists the device.
    assert!(
        devices(Some(BackendKind::Hardware))
            .map(|d| d.is_empty())
            .unwrap_or(true),
        "the removed device is still listed"
    );
}

/// The library unplugs the device between posts on queues of the hardware
/// backend (with sends, writes and receives outstanding): the backend's
/// monitor sees DEVICE_FATAL, the subsystem runs the removal, and every WR
/// completes exactly once.
#[test]
fn removal_mid_traffic_completes_every_wr_once() {
    isolated(
        "removal_mid_traffic_completes_every_wr_once",
        "mid_traffic",
        removal_mid_traffic_scenario,
    );
}

fn random_point_scenario(seed: u64) {
    let (name, remove) = library_device();
    let (sub, events) = rig(&name);
    let ca = sub.open(&name, "hw_library").expect("open A");
    let cb = sub.open(&name, "hw_library").expect("open B");
    let cfg = PairConfig {
        cq_depth: 1024,
        ..PairConfig::default()
    };
    let p = Pair::new(&ca, &cb, cfg).expect("an RC pair");
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut a_send, mut a_recv, mut b_recv) = (Ledger::default(), Ledger::default(), Ledger::default());
    let before = next() % 40;
    let sge = [p.a.mr.sge(0, 32).expect("sge")];
    for i in 0..before + 20 {
        if i == before {
            unplug(remove, &name);
        }
        match next() % 3 {
            0 => {
                if p.b.post_recv(1000 + i, 0, 64).is_ok() {
                    b_recv.posted.push(1000 + i);
                }
            }
            1 => {
                if p.a.post_recv(2000 + i, 4096, 64).is_ok() {
                    a_recv.posted.push(2000 + i);
                }
            }
            _ => {
                let wr = SendWr::new(
                    i,
                    SendOp::Write {
                        remote: p.b.mr.remote(0),
                    },
                    &sge,
                )
                .flags(SendFlags::SIGNALED);
                if p.a.qp.post_send(&[wr]).is_ok() {
                    a_send.posted.push(i);
                }
            }
        }
    }
    wait_fatal(&events, &name);
    a_send.drain(&p.a.scq, "A's writes");
    a_recv.drain(&p.a.rcq, "A's receives");
    b_recv.drain(&p.b.rcq, "B's receives");
    wait_removed(&sub, &name);
    fatal_is_last(&ca);
}

/// Seeded programs of receives and writes, the device unplugged through
/// the library at a random point: every WR completes exactly once.
#[test]
fn random_removal_points_complete_every_wr_once() {
    let test = "random_removal_points_complete_every_wr_once";
    if let Ok(s) = std::env::var(CHILD_ENV) {
        if let Some(seed) = s.strip_prefix("random:") {
            random_point_scenario(seed.parse().expect("seed"));
        }
        return;
    }
    for seed in 1..=6u64 {
        isolated(test, &format!("random:{seed}"), || {});
    }
}

/// One upcall: `(is_add, device, namespace, generation, removal reason)`.
type Upcall = (bool, String, NamespaceId, u64, Option<RemovalReason>);

/// Records upcalls.
#[derive(Default)]
struct Log(Mutex<Vec<Upcall>>);

impl Client for Log {
    fn add(&self, d: &DeviceRef) -> Result<()> {
        self.0
            .lock()
            .unwrap()
            .push((true, d.name().to_string(), d.namespace(), d.generation().as_u64(), None));
        Ok(())
    }

    fn remove(&self, d: &DeviceRef, why: RemovalReason) {
        self.0.lock().unwrap().push((
            false,
            d.name().to_string(),
            d.namespace(),
            d.generation().as_u64(),
            Some(why),
        ));
    }
}

fn netns_move_scenario() {
    let (name, _) = library_device();
    let (sub, _events) = rig(&name);
    let blue = sub.create_namespace("hw_blue").expect("namespace");
    let (init_log, blue_log) = (Arc::new(Log::default()), Arc::new(Log::default()));
    sub.register_client("init", ClientScope::Namespace(NamespaceId::INIT), init_log.clone())
        .expect("client");
    sub.register_client("blue", ClientScope::Namespace(blue), blue_log.clone())
        .expect("client");
    let gen_before = sub.device(&name).expect("device").generation().as_u64();
    let (ca, cb) = (
        sub.open(&name, "hw_library").expect("open"),
        sub.open(&name, "hw_library").expect("open"),
    );
    let p = Pair::new(&ca, &cb, PairConfig::default()).expect("an RC pair");
    let mut recvs = Ledger::default();
    for i in 0..8 {
        p.a.post_recv(i, 0, 64).expect("post_recv");
        recvs.posted.push(i);
    }
    // The move unplugs the instance in the initial namespace (the hardware
    // backend's revoke on a device libibverbs still lists) and plugs a new
    // one in blue.
    let (_report, moved) = sub.move_device(&name, blue).expect("move");
    assert_eq!(moved.namespace, blue);
    let gen_after = sub.device(&name).expect("device").generation().as_u64();
    assert_ne!(gen_after, gen_before, "the replug is a new generation");
    recvs.drain(&p.a.rcq, "receives of the moved instance");
    assert!(recvs.statuses.iter().all(|s| *s == WcStatus::WrFlushErr));
    assert_eq!(ca.alloc_pd().map(|_| ()).unwrap_err().kind(), ErrorKind::NoDevice);
    fatal_is_last(&ca);
    let last = init_log.0.lock().unwrap().last().cloned();
    assert!(
        matches!(last, Some((false, _, ns, g, Some(RemovalReason::NetnsMove { .. }))) if ns == NamespaceId::INIT && g == gen_before),
        "the initial namespace's client got {last:?}"
    );
    let blue_events = blue_log.0.lock().unwrap().clone();
    assert!(
        matches!(blue_events.as_slice(), [(true, _, ns, g, None)] if *ns == blue && *g == gen_after),
        "the blue namespace's client got {blue_events:?}"
    );
    drop(p);
    // The new instance works: traffic on contexts opened after the move.
    let (na, nb) = (
        sub.open(&name, "hw_library").expect("open after the move"),
        sub.open(&name, "hw_library").expect("open after the move"),
    );
    let q = Pair::new(&na, &nb, PairConfig::default()).expect("a pair after the move");
    let sge = [q.a.mr.sge(0, 16).expect("sge")];
    q.b.post_recv(7, 0, 64).expect("post_recv");
    q.a.qp
        .post_send(&[SendWr::new(7, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .expect("post_send");
    assert_eq!(q.b.wait_recv(GENEROUS).expect("recv").status, WcStatus::Success);
    drop(q);
    sub.delete_namespace(blue).expect("delete blue");
    assert_eq!(sub.device(&name).expect("device").namespace(), NamespaceId::INIT);
}

/// Moving the library's device between subsystem namespaces: the old
/// instance's work flushes once, its clients see a NetnsMove removal, the
/// new instance works.
#[test]
fn netns_move_revokes_then_replugs() {
    isolated("netns_move_revokes_then_replugs", "netns_move", netns_move_scenario);
}

fn discovery_scenario() {
    let (name, remove) = library_device();
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    }));
    let disc = HwDiscovery::new(&sub);
    let events = disc.events().subscribe();
    let report = disc.scan().expect("scan");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        report.added.iter().any(|d| d.name == name),
        "the scan did not add the library's device: {report:?}"
    );
    let ctx = sub.open(&name, "hw_library").expect("open");
    unplug(remove, &name);
    wait_fatal(&events, &name);
    wait_removed(&sub, &name);
    fatal_is_last(&ctx);
    // A later scan does not bring it back: the library no longer lists it.
    let report = disc.scan().expect("scan");
    assert!(report.added.is_empty(), "{report:?}");
    assert!(disc.known().is_empty(), "{:?}", disc.known());
}

/// Discovery finds the library's device (ibv_get_device_list, there being
/// no kernel RDMA device) and does not add it back once it was unplugged.
#[test]
fn discovery_sees_the_library_device_come_and_go() {
    isolated(
        "discovery_sees_the_library_device_come_and_go",
        "discovery",
        discovery_scenario,
    );
}
