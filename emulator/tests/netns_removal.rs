//! The removal sequence of docs/design.md §5, step by step, on a soft device with
//! work in flight: ENODEV, QPs to ERR, every WR flushed exactly once (send
//! queue before receive queue, post order), CQ notifications, CM
//! DEVICE_REMOVAL, clients' `remove` in reverse order, DEVICE_FATAL last;
//! destroy after removal; the deadline, the stragglers and the gate.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{
    Client, ClientScope, CmHook, DeviceEventKind, DeviceRef, DeviceState, NamespaceId, RemovalReason, SoftFactory,
    Straggler, Subsystem, SubsystemConfig, UNATTRIBUTED,
};
use softverbs::verbs::*;
use softverbs_emulator::netns::traffic::{connect_rc, first_gid, RcLoop};

type Log = Arc<Mutex<Vec<String>>>;

fn soft(name: &str, last: u8) -> Arc<SoftFactory> {
    SoftFactory::new(SoftDeviceConfig {
        link: Some(InprocFabric::new()),
        ..SoftDeviceConfig::new(name, format!("10.62.0.{last}").parse().unwrap())
    })
}

fn push(log: &Log, s: impl Into<String>) {
    log.lock().unwrap().push(s.into());
}

/// The application's objects: one RC QP whose send and receive queues
/// complete on the same CQ (so the flush order between them is visible),
/// connected to a peer QP that never posts a receive (sends wait in RNR).
struct App {
    qp: Qp,
    peer: Qp,
    cq: Cq,
    peer_cq: Cq,
    channel: CompChannel,
    mr: Mr,
    pd: Pd,
    ctx: Context,
}

fn app(dev: &DeviceRef) -> App {
    let ctx = dev.open("app").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(64, 77, Some(&channel), 0).unwrap();
    let peer_cq = ctx.create_cq(64, 78, None, 0).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mk = |scq: &Cq| {
        pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: scq,
            recv_cq: scq,
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .unwrap()
    };
    let qp = mk(&cq);
    let peer = mk(&peer_cq);
    let gid = first_gid(&ctx).unwrap();
    connect_rc(&qp, gid, peer.qp_num(), 10, 20).unwrap();
    connect_rc(&peer, gid, qp.qp_num(), 20, 10).unwrap();
    App {
        qp,
        peer,
        cq,
        peer_cq,
        channel,
        mr,
        pd,
        ctx,
    }
}

struct Named(&'static str, Log);

impl Client for Named {
    fn add(&self, d: &DeviceRef) -> Result<()> {
        push(&self.1, format!("{} add {}", self.0, d.generation()));
        Ok(())
    }

    fn remove(&self, d: &DeviceRef, why: RemovalReason) {
        push(&self.1, format!("{} remove ({why}) {:?}", self.0, d.state()));
    }
}

/// The CM hook checks, when it runs, that the engine part of the sequence
/// already happened: control verbs fail, every WR is flushed, the armed CQ
/// fired.
struct CmCheck {
    log: Log,
    app: Arc<Mutex<Option<App>>>,
}

impl CmHook for CmCheck {
    fn device_removal(&self, d: &DeviceRef, why: RemovalReason) {
        let app = self.app.lock().unwrap();
        let app = app.as_ref().unwrap();
        assert_eq!(d.state(), DeviceState::Revoked);
        assert_eq!(app.ctx.alloc_pd().unwrap_err().kind(), ErrorKind::NoDevice);
        assert_eq!(
            app.ctx.create_cq(4, 0, None, 0).unwrap_err().kind(),
            ErrorKind::NoDevice
        );
        let mut wc = vec![WorkCompletion::default(); 32];
        let n = app.cq.poll(&mut wc).unwrap();
        let got: Vec<(u64, WcStatus)> = wc[..n].iter().map(|w| (w.wr_id, w.status)).collect();
        let f = WcStatus::WrFlushErr;
        assert_eq!(
            got,
            [(100, f), (101, f), (102, f), (200, f), (201, f)],
            "send queue first, post order"
        );
        assert_eq!(app.cq.poll(&mut wc).unwrap(), 0, "exactly once");
        assert_eq!(app.channel.get_cq_event(Some(Duration::ZERO)).unwrap(), Some(77));
        app.cq.ack_events(1);
        push(&self.log, format!("cm DEVICE_REMOVAL ({why})"));
    }
}

#[test]
fn removal_runs_the_design_sequence_in_order() {
    let sub = Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(100),
        ..SubsystemConfig::default()
    });
    let log = Log::default();
    sub.register_client("first", ClientScope::All, Arc::new(Named("first", log.clone())))
        .unwrap();
    sub.register_client("second", ClientScope::All, Arc::new(Named("second", log.clone())))
        .unwrap();
    sub.add_device(soft("rm_seq0", 1), NamespaceId::INIT).unwrap();
    let dev = sub.device("rm_seq0").unwrap();
    let shared_app = Arc::new(Mutex::new(Some(app(&dev))));
    sub.add_cm_hook(Arc::new(CmCheck {
        log: log.clone(),
        app: shared_app.clone(),
    }));
    {
        let g = shared_app.lock().unwrap();
        let a = g.as_ref().unwrap();
        let sge = [a.mr.sge(0, 64).unwrap()];
        // Sends the peer cannot take (no receive: RNR, retried forever) and
        // receives nobody sends to.
        for id in 100..103 {
            a.qp.post_send(&[SendWr::new(id, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
                .unwrap();
        }
        for id in 200..202 {
            a.qp.post_recv(&[RecvWr::new(id, &sge)]).unwrap();
        }
        a.cq.req_notify(false).unwrap();
        assert_eq!(a.cq.poll(&mut [WorkCompletion::default(); 4]).unwrap(), 0);
    }
    let events = sub.subscribe(ClientScope::All);
    let report = sub.remove_device("rm_seq0").unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "first add gen 1",
            "second add gen 1",
            "cm DEVICE_REMOVAL (unplug)",
            "second remove (unplug) Revoked",
            "first remove (unplug) Revoked",
        ]
    );
    assert_eq!(report.cm_hooks, 1);
    assert_eq!(report.removed_clients, ["second", "first"]);
    // The application held its context past the deadline: named, inert.
    assert_eq!(
        report.stragglers,
        [Straggler {
            consumer: "app".into(),
            contexts: 1
        }]
    );
    assert!(report.elapsed >= Duration::from_millis(100));
    assert_eq!(dev.state(), DeviceState::Dead);
    let kinds: Vec<DeviceEventKind> = events.drain().into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            DeviceEventKind::Removing(RemovalReason::Unplug),
            DeviceEventKind::Removed {
                reason: RemovalReason::Unplug,
                stragglers: vec!["app".into()]
            }
        ]
    );
    let a = shared_app.lock().unwrap().take().unwrap();
    // DEVICE_FATAL is the last async event.
    let mut last = None;
    while let Some(e) = a.ctx.get_async_event(Some(Duration::ZERO)).unwrap() {
        last = Some(e.event_type);
    }
    assert_eq!(last, Some(EventType::DeviceFatal));
    // Posting after removal: an error or a flush, never a crash; nothing
    // reaches the wire.
    let sge = [a.mr.sge(0, 64).unwrap()];
    a.qp.post_send(&[SendWr::new(300, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (300, WcStatus::WrFlushErr));
    // Destroy after removal succeeds, in any order, and is idempotent.
    a.pd.ops().destroy().unwrap();
    a.pd.ops().destroy().unwrap();
    a.cq.ops().destroy().unwrap();
    a.cq.ops().destroy().unwrap();
    a.qp.ops().destroy().unwrap();
    a.qp.ops().destroy().unwrap();
    let App {
        qp,
        peer,
        cq,
        peer_cq,
        channel,
        mr,
        pd,
        ctx,
    } = a;
    peer_cq.destroy().unwrap();
    mr.destroy().unwrap();
    peer.destroy().unwrap();
    qp.destroy().unwrap();
    cq.destroy().unwrap();
    pd.destroy().unwrap();
    channel.destroy().unwrap();
    drop(ctx);
}

#[test]
fn stragglers_are_named_and_made_inert_after_the_deadline() {
    let sub = Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(60),
        ..SubsystemConfig::default()
    });
    sub.add_device(soft("rm_late0", 2), NamespaceId::INIT).unwrap();
    let dev = sub.device("rm_late0").unwrap();
    // A consumer that never lets go, one that lets go in time (from another
    // thread), and a context opened straight from the device list.
    let mut keeper = RcLoop::new(dev.open("keeper").unwrap(), 8).unwrap();
    let polite = RcLoop::new(dev.open("polite").unwrap(), 8).unwrap();
    let anonymous = dev.device().open().unwrap();
    keeper.post(4);
    // A QP and a CQ of the keeper's behind the device's gate.
    let kctx = dev.open("keeper").unwrap();
    let kpd = kctx.alloc_pd().unwrap();
    let kcq = dev.guard_cq(kctx.create_cq(8, 0, None, 0).unwrap());
    let kqp = dev.guard_qp(
        kpd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: kcq.cq(),
            recv_cq: kcq.cq(),
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap(),
    );
    let mut wc = [WorkCompletion::default(); 4];
    // Before removal the gate is open: the backend answers (RESET: EINVAL).
    let e = kqp.post_send(&[SendWr::new(1, SendOp::Send, &[])]).unwrap_err();
    assert_eq!(e.error.kind(), ErrorKind::InvalidArgument);
    assert_eq!(kcq.poll(&mut wc).unwrap(), 0);
    let letting_go = thread::spawn(move || {
        thread::sleep(Duration::from_millis(10));
        drop(polite);
    });
    let t0 = Instant::now();
    let report = sub.remove_device("rm_late0").unwrap();
    letting_go.join().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(60));
    let mut names: Vec<(String, usize)> = report
        .stragglers
        .iter()
        .map(|s| (s.consumer.clone(), s.contexts))
        .collect();
    names.sort();
    assert_eq!(names, [(UNATTRIBUTED.to_string(), 1), ("keeper".to_string(), 2)]);
    assert!(report.to_string().contains("did not let go: keeper"));
    // The keeper's objects are inert: what was posted completed once, the
    // gate is closed.
    assert!(keeper.settle(Duration::from_secs(1)));
    keeper.ledger().check().unwrap();
    assert!(dev.gate().is_closed());
    let e = kqp.post_send(&[SendWr::new(2, SendOp::Send, &[])]).unwrap_err();
    assert_eq!((e.index, e.error.kind()), (0, ErrorKind::NoDevice));
    assert_eq!(kcq.poll(&mut wc).unwrap_err().kind(), ErrorKind::NoDevice);
    keeper.destroy().unwrap();
    kqp.into_inner().destroy().unwrap();
    kcq.into_inner().destroy().unwrap();
    kpd.destroy().unwrap();
    drop(kctx);
    drop(anonymous);
}
