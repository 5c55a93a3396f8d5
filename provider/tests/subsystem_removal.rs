//! The removal sequence of the device subsystem, step by step: the order in
//! which the backend, the CM hooks, the clients and DEVICE_FATAL hear of a
//! removal, the flush it causes, the wait for consumers (who lets go in
//! time and who is named a straggler), the gate, the state of the device
//! along the way, shutdown and drop. A traced backend (a soft device whose
//! hotplug calls are logged) shows the order; the soft device underneath
//! shows the effects.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::subsystem::*;
use softverbs::verbs::{self, *};

type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, what: impl Into<String>) {
    log.lock().unwrap().push(what.into());
}

fn take(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

/// A soft device whose hotplug calls are logged before they run.
struct Traced {
    inner: Arc<dyn HotplugDevice>,
    log: Log,
}

impl HotplugDevice for Traced {
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn revoke(&self) {
        push(&self.log, "revoke");
        self.inner.revoke();
    }
    fn unlist(&self) {
        push(&self.log, "unlist");
        self.inner.unlist();
    }
    fn raise_device_fatal(&self) {
        push(&self.log, "fatal");
        self.inner.raise_device_fatal();
    }
    fn open_contexts(&self) -> Option<usize> {
        self.inner.open_contexts()
    }
    fn make_inert(&self) {
        push(&self.log, "inert");
        self.inner.make_inert();
    }
}

struct TracedFactory {
    name: String,
    ip: std::net::IpAddr,
    log: Log,
}

impl DeviceFactory for TracedFactory {
    fn name(&self) -> &str {
        &self.name
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }
    fn instantiate(&self, _ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>> {
        let cfg = SoftDeviceConfig {
            link: Some(InprocFabric::new()),
            ..SoftDeviceConfig::new(&self.name, self.ip)
        };
        Ok(Arc::new(Traced {
            inner: soft_plugged(SoftDevice::create(cfg)?),
            log: self.log.clone(),
        }))
    }
}

fn traced(name: &str, last: u8, log: &Log) -> Arc<TracedFactory> {
    Arc::new(TracedFactory {
        name: name.to_string(),
        ip: format!("10.62.0.{last}").parse().unwrap(),
        log: log.clone(),
    })
}

fn sub(deadline: Duration) -> Arc<Subsystem> {
    Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: deadline,
        ..SubsystemConfig::default()
    }))
}

/// Logs its `remove` upcalls with the device's state and removal reason at
/// that moment, and runs a hook.
struct LogClient {
    name: &'static str,
    log: Log,
    on_remove: Box<dyn Fn() + Send + Sync>,
}

impl Client for LogClient {
    fn add(&self, _d: &DeviceRef) -> verbs::Result<()> {
        Ok(())
    }
    fn remove(&self, d: &DeviceRef, why: RemovalReason) {
        let opens = d.open("late").map(|_| ()).map_err(|e| e.kind());
        push(
            &self.log,
            format!("{} {:?} {why} {:?} {opens:?}", self.name, d.state(), d.removal_reason()),
        );
        (self.on_remove)();
    }
}

fn client(name: &'static str, log: &Log, on_remove: impl Fn() + Send + Sync + 'static) -> Arc<LogClient> {
    Arc::new(LogClient {
        name,
        log: log.clone(),
        on_remove: Box::new(on_remove),
    })
}

struct LogHook(Log);

impl CmHook for LogHook {
    fn device_removal(&self, d: &DeviceRef, why: RemovalReason) {
        push(&self.0, format!("cm {:?} {why}", d.state()));
    }
}

/// A consumer's objects: a QP in INIT with receives posted, its CQ, PD, MR.
struct App {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    _mr: Mr,
}

fn app(ctx: Context, recvs: u64) -> App {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    qp.modify(&init, mask).unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..recvs {
        let sge = [mr.sge(i * 64, 64).unwrap()];
        qp.post_recv(&[RecvWr::new(100 + i, &sge)]).unwrap();
    }
    App {
        ctx,
        _pd: pd,
        cq,
        qp,
        _mr: mr,
    }
}

/// Polls `cq` until `n` completions arrived (or 10 s passed) and returns
/// them, then checks that no more come.
fn completions(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let end = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    while out.len() < n && Instant::now() < end {
        let k = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(cq.poll(&mut wc).unwrap(), 0, "more completions than WRs");
    out
}

fn async_events(ctx: &Context) -> Vec<EventType> {
    let mut out = Vec::new();
    while let Some(e) = ctx.get_async_event(Some(Duration::ZERO)).unwrap() {
        out.push(e.event_type);
    }
    out
}

fn soft_listed(name: &str) -> bool {
    devices(Some(BackendKind::Soft))
        .unwrap()
        .iter()
        .any(|d| d.name() == name)
}

/// What the application saw when its client heard of the removal.
#[derive(Debug, Default)]
struct Seen {
    completions: Vec<(u64, WcStatus)>,
    events: Vec<EventType>,
    alloc_pd: Option<ErrorKind>,
}

#[test]
fn the_steps_run_in_order_and_each_has_its_effect() {
    let log: Log = Arc::default();
    let s = sub(Duration::from_secs(10));
    let events = s.subscribe(ClientScope::All);
    s.add_device(traced("rm_order0", 1, &log), NamespaceId::INIT).unwrap();
    let d = s.device("rm_order0").unwrap();
    assert!(soft_listed("rm_order0"));
    let held: Arc<Mutex<Option<App>>> = Arc::new(Mutex::new(Some(app(d.open("app").unwrap(), 3))));
    let seen: Arc<Mutex<Seen>> = Arc::default();
    // The application looks at its objects when its client hears of the
    // removal, then lets go, as a ULP does: no straggler then.
    let (h, sn) = (held.clone(), seen.clone());
    let first = client("first", &log, move || {
        // Only the removal's upcall finds the application (not the one of
        // the unregistration at the end).
        let Some(a) = h.lock().unwrap().take() else { return };
        let mut wc = [WorkCompletion::default(); 8];
        let n = a.cq.poll(&mut wc).unwrap();
        let mut seen = sn.lock().unwrap();
        seen.completions = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        seen.events = async_events(&a.ctx);
        seen.alloc_pd = a.ctx.alloc_pd().err().map(|e| e.kind());
    });
    let first_id = s.register_client("first", ClientScope::All, first).unwrap();
    s.register_client("second", ClientScope::All, client("second", &log, || {}))
        .unwrap();
    s.add_cm_hook(Arc::new(LogHook(log.clone())));
    take(&log);
    let _ = events.drain();

    let r = s.remove_device("rm_order0").unwrap();
    let revoked = "Revoked unplug Some(Unplug) Err(NoDevice)";
    assert_eq!(
        take(&log),
        [
            "revoke".to_string(),
            "unlist".to_string(),
            "cm Revoked unplug".to_string(),
            format!("second {revoked}"),
            format!("first {revoked}"),
            "fatal".to_string(),
        ],
        "backend, CM hooks, clients in reverse registration order, DEVICE_FATAL; nothing made inert"
    );
    assert_eq!(r.reason, RemovalReason::Unplug);
    assert_eq!(
        (r.cm_hooks, r.removed_clients.clone()),
        (1, vec!["second".to_string(), "first".to_string()])
    );
    assert!(r.stragglers.is_empty() && r.stuck_calls == 0 && r.is_clean(), "{r}");
    assert_eq!(r.device.name, "rm_order0");
    // By the time clients hear of it the device is revoked: every posted
    // receive completed once, in post order, with WR_FLUSH_ERR, and control
    // verbs fail with ENODEV.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let flushed: Vec<(u64, WcStatus)> = (100..103).map(|i| (i, WcStatus::WrFlushErr)).collect();
    assert_eq!(seen.completions, flushed);
    assert_eq!(seen.alloc_pd, Some(ErrorKind::NoDevice));
    assert!(!seen.events.contains(&EventType::DeviceFatal), "{:?}", seen.events);
    assert!(!soft_listed("rm_order0"), "unlisted");
    // Dead, forgotten, and said so.
    assert_eq!(d.state(), DeviceState::Dead);
    assert_eq!(d.removal_reason(), Some(RemovalReason::Unplug));
    assert_eq!(s.device("rm_order0").unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(s.remove_device("rm_order0").unwrap_err().kind(), ErrorKind::NotFound);
    let kinds: Vec<DeviceEventKind> = events.drain().into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            DeviceEventKind::Removing(RemovalReason::Unplug),
            DeviceEventKind::Removed {
                reason: RemovalReason::Unplug,
                stragglers: vec![]
            }
        ]
    );
    // The name is free for a new instance.
    s.add_device(traced("rm_order0", 1, &log), NamespaceId::INIT).unwrap();
    assert_eq!(s.device("rm_order0").unwrap().state(), DeviceState::Live);
    // The remove upcall is over: the client may unregister (it is not
    // inside one of its upcalls any more).
    s.unregister_client(first_id).unwrap();
}

#[test]
fn consumers_that_hold_on_are_named_and_made_inert_after_the_deadline() {
    let log: Log = Arc::default();
    let s = sub(Duration::from_millis(50));
    s.add_device(traced("rm_strag0", 2, &log), NamespaceId::INIT).unwrap();
    let d = s.device("rm_strag0").unwrap();
    // Two contexts of one consumer, one of another, one opened around the
    // subsystem, and one that was closed before the removal.
    let slow = (d.open("slow").unwrap(), d.open("slow").unwrap());
    let App {
        ctx: other,
        _pd: pd,
        cq,
        qp,
        _mr: mr,
    } = app(d.open("other").unwrap(), 1);
    let raw = (d.device().open().unwrap(), d.device().open().unwrap());
    drop(d.open("gone").unwrap());
    assert_eq!(d.consumers(), [("slow".to_string(), 2), ("other".to_string(), 1)]);
    let qp = d.guard_qp(qp);
    let cq = d.guard_cq(cq);
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc).unwrap(), 0, "the gate is open before the removal");
    assert!(!d.gate().is_closed());
    take(&log);

    let r = s.remove_device("rm_strag0").unwrap();
    assert_eq!(take(&log), ["revoke", "unlist", "fatal", "inert"]);
    assert_eq!(
        r.stragglers,
        [
            Straggler {
                consumer: "slow".into(),
                contexts: 2
            },
            Straggler {
                consumer: "other".into(),
                contexts: 1
            },
            Straggler {
                consumer: UNATTRIBUTED.into(),
                contexts: 2
            },
        ]
    );
    assert!(!r.is_clean());
    assert!(r.to_string().contains("did not let go: slow (2 context(s))"), "{r}");
    // The gate is closed: guarded fast paths fail with ENODEV.
    assert!(d.gate().is_closed());
    assert_eq!(d.gate().inside(), 0);
    assert_eq!(cq.poll(&mut wc).unwrap_err().kind(), ErrorKind::NoDevice);
    let sge: [Sge<'_>; 0] = [];
    let e = qp.post_recv(&[RecvWr::new(7, &sge)]).unwrap_err();
    assert_eq!(e.error.kind(), ErrorKind::NoDevice);
    let e = qp.post_send(&[SendWr::new(8, SendOp::Send, &sge)]).unwrap_err();
    assert_eq!(e.error.kind(), ErrorKind::NoDevice);
    assert!(async_events(&slow.0).contains(&EventType::DeviceFatal));
    assert!(async_events(&raw.0).contains(&EventType::DeviceFatal));
    // Destroying after the removal succeeds.
    drop((qp.into_inner(), cq.into_inner(), mr, pd));
    drop((slow, other, raw));
}

#[test]
fn a_consumer_that_lets_go_before_the_deadline_is_waited_for_not_named() {
    let log: Log = Arc::default();
    let s = sub(Duration::from_secs(30));
    s.add_device(traced("rm_wait0", 3, &log), NamespaceId::INIT).unwrap();
    let d = s.device("rm_wait0").unwrap();
    let ctx = d.open("late").unwrap();
    // Lets go only once the removal is under way, after DEVICE_FATAL.
    let dd = d.clone();
    let t = thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(10);
        let mut fatal = false;
        while !fatal && Instant::now() < end {
            fatal = async_events(&ctx).contains(&EventType::DeviceFatal);
            thread::sleep(Duration::from_millis(1));
        }
        assert!(fatal, "DEVICE_FATAL comes before the wait for consumers");
        assert_eq!(dd.state(), DeviceState::Revoked);
        thread::sleep(Duration::from_millis(20));
        drop(ctx);
    });
    let r = s.remove_device("rm_wait0").unwrap();
    t.join().unwrap();
    assert!(r.is_clean(), "{r}");
    assert_eq!(take(&log), ["revoke", "unlist", "fatal"]);
}

#[test]
fn shutdown_removes_every_device_newest_first_and_drop_revokes_what_is_left() {
    let log: Log = Arc::default();
    let s = sub(Duration::from_secs(10));
    s.add_device(traced("rm_shut0", 4, &log), NamespaceId::INIT).unwrap();
    s.add_device(traced("rm_shut1", 5, &log), NamespaceId::INIT).unwrap();
    let reports = s.shutdown();
    let names: Vec<(&str, RemovalReason)> = reports.iter().map(|r| (r.device.name.as_str(), r.reason)).collect();
    assert_eq!(
        names,
        [
            ("rm_shut1", RemovalReason::Shutdown),
            ("rm_shut0", RemovalReason::Shutdown)
        ]
    );
    assert!(s.devices(ClientScope::All).is_empty());
    assert_eq!(s.shutdown(), []);

    // Dropping the subsystem revokes, unlists and kills what is left,
    // without upcalls or waiting; the gate closes.
    let s = sub(Duration::from_secs(10));
    s.register_client("c", ClientScope::All, client("c", &log, || {}))
        .unwrap();
    s.add_device(traced("rm_drop0", 6, &log), NamespaceId::INIT).unwrap();
    let d = s.device("rm_drop0").unwrap();
    let a = app(d.open("app").unwrap(), 2);
    take(&log);
    drop(s);
    assert_eq!(take(&log), ["revoke", "unlist", "fatal"]);
    assert_eq!(d.state(), DeviceState::Dead);
    assert_eq!(d.removal_reason(), Some(RemovalReason::Shutdown));
    assert!(d.gate().is_closed());
    assert!(!soft_listed("rm_drop0"));
    let wcs = completions(&a.cq, 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushErr), "{wcs:?}");
    assert_eq!(async_events(&a.ctx).last(), Some(&EventType::DeviceFatal));
}

#[test]
fn which_reasons_remove_the_device() {
    let ns = NamespaceId::INIT;
    for (why, device_goes) in [
        (RemovalReason::Unplug, true),
        (RemovalReason::NetnsMove { from: ns, to: ns }, true),
        (RemovalReason::Shutdown, true),
        (RemovalReason::ClientUnregistered, false),
        (RemovalReason::NamespaceDeleted(ns), false),
    ] {
        assert_eq!(why.is_device_removal(), device_goes, "{why}");
    }
}

#[test]
fn a_call_inside_the_gate_is_waited_for_and_not_reported_stuck() {
    let log: Log = Arc::default();
    let s = sub(Duration::from_secs(30));
    s.add_device(traced("rm_gate0", 7, &log), NamespaceId::INIT).unwrap();
    let gate = s.device("rm_gate0").unwrap().gate().clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // A fast-path call that is inside the gate when the removal closes it,
    // and leaves a little later.
    let t = thread::spawn(move || {
        let inside = gate.enter().expect("the gate is open");
        tx.send(()).unwrap();
        thread::sleep(Duration::from_millis(50));
        drop(inside);
    });
    rx.recv().unwrap();
    let r = s.remove_device("rm_gate0").unwrap();
    t.join().unwrap();
    assert_eq!(r.stuck_calls, 0, "{r}");
    assert!(r.is_clean(), "{r}");
    assert!(!take(&log).contains(&"inert".to_string()));
}

/// A backend that cannot count its contexts (the trait's default
/// `open_contexts`): only consumers that opened through the subsystem
/// can be waited for and named.
struct Uncounted(Arc<dyn HotplugDevice>);

impl HotplugDevice for Uncounted {
    fn device(&self) -> Device {
        self.0.device()
    }
    fn revoke(&self) {
        self.0.revoke();
    }
    fn unlist(&self) {
        self.0.unlist();
    }
    fn raise_device_fatal(&self) {
        self.0.raise_device_fatal();
    }
}

struct UncountedFactory(Arc<TracedFactory>);

impl DeviceFactory for UncountedFactory {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }
    fn instantiate(&self, ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>> {
        Ok(Arc::new(Uncounted(self.0.instantiate(ns)?)))
    }
}

#[test]
fn a_backend_that_cannot_count_contexts_has_only_named_stragglers() {
    let log: Log = Arc::default();
    let s = sub(Duration::from_millis(50));
    let f = Arc::new(UncountedFactory(traced("rm_uncnt0", 8, &log)));
    s.add_device(f.clone(), NamespaceId::INIT).unwrap();
    let r = s.remove_device("rm_uncnt0").unwrap();
    assert!(r.is_clean(), "nobody opened it: {r}");
    s.add_device(f, NamespaceId::INIT).unwrap();
    let d = s.device("rm_uncnt0").unwrap();
    let named = d.open("named").unwrap();
    let unseen = d.device().open().unwrap();
    let r = s.remove_device("rm_uncnt0").unwrap();
    let names: Vec<&str> = r.stragglers.iter().map(|s| s.consumer.as_str()).collect();
    assert_eq!(names, ["named"], "a context opened around the subsystem cannot be seen");
    drop((named, unseen));
}
