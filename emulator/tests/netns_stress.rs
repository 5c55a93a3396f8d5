//! Many threads post and poll on a soft device while another thread removes
//! it: nothing crashes or deadlocks, every WR that was posted completes
//! exactly once, and a consumer that does not let go is named and cut off by
//! the removal gate. Time-bounded (each round a few tens of milliseconds;
//! every wait has a generous limit that only a hang would reach).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{DeviceRef, DeviceState, NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use softverbs::verbs::{
    AccessFlags, ErrorKind, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr,
    WcStatus, WorkCompletion,
};
use softverbs_emulator::netns::traffic::{Ledger, RcLoop, MSG_LEN};

/// Anything longer means a hang, not a slow machine.
const HANG: Duration = Duration::from_secs(20);
const ROUNDS: usize = 6;

fn live(d: &DeviceRef) -> bool {
    d.state() == DeviceState::Live
}

/// Own RC pair with a ledger; posts and polls until the device is gone,
/// then settles, checks and lets go.
fn ledger_thread(dev: DeviceRef, name: String, ready: Arc<Barrier>) -> thread::JoinHandle<Ledger> {
    thread::spawn(move || {
        let mut lp = RcLoop::new(dev.open(&name).unwrap(), 32).unwrap();
        lp.post(4);
        ready.wait();
        let t0 = Instant::now();
        while live(&dev) {
            lp.post(4);
            lp.poll();
            assert!(t0.elapsed() < HANG, "device never went away");
        }
        assert!(lp.settle(HANG), "{name}: {:?}", lp.ledger());
        let ledger = lp.ledger().clone();
        lp.destroy().unwrap();
        ledger
    })
}

#[test]
fn posting_and_polling_from_many_threads_while_the_device_is_removed() {
    let sub = Subsystem::new(SubsystemConfig {
        removal_deadline: Duration::from_millis(30),
        ..SubsystemConfig::default()
    });
    for round in 0..ROUNDS {
        let name = format!("stress{round}");
        let cfg = SoftDeviceConfig {
            link: Some(InprocFabric::new()),
            ..SoftDeviceConfig::new(&name, format!("10.63.0.{}", round + 1).parse().unwrap())
        };
        sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
        let dev = sub.device(&name).unwrap();

        // Every traffic thread has its objects before the removal starts.
        let ready = Arc::new(Barrier::new(4));
        let ledgers: Vec<_> = (0..2)
            .map(|i| ledger_thread(dev.clone(), format!("ledger{i}"), ready.clone()))
            .collect();

        // One QP shared by a posting thread and a polling thread.
        let shared = Arc::new(RcLoop::new(dev.open("shared").unwrap(), 64).unwrap());
        let posted = Arc::new(AtomicU64::new(0));
        let completed = Arc::new(AtomicU64::new(0));
        let stop_polling = Arc::new(AtomicBool::new(false));
        let poster = {
            let (lp, dev, posted, completed) = (shared.clone(), dev.clone(), posted.clone(), completed.clone());
            thread::spawn(move || {
                let sge = [lp.mr().sge(0, MSG_LEN).unwrap()];
                let mut id = 0u64;
                let t0 = Instant::now();
                while live(&dev) {
                    assert!(t0.elapsed() < HANG);
                    // Each message: a receive and a send; keep both queues
                    // under their depth.
                    if posted.load(Ordering::SeqCst) - completed.load(Ordering::SeqCst) >= 60 {
                        thread::yield_now();
                        continue;
                    }
                    id += 1;
                    if lp.receiver().post_recv(&[RecvWr::new(id, &sge)]).is_ok() {
                        posted.fetch_add(1, Ordering::SeqCst);
                    }
                    let wr = SendWr::new(id, SendOp::Send, &sge).flags(SendFlags::SIGNALED);
                    if lp.sender().post_send(&[wr]).is_ok() {
                        posted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let poller = {
            let (lp, completed, stop) = (shared.clone(), completed.clone(), stop_polling.clone());
            thread::spawn(move || {
                let seen = Mutex::new((HashSet::new(), HashSet::new()));
                let mut wc = vec![WorkCompletion::default(); 16];
                let t0 = Instant::now();
                loop {
                    let mut got = 0;
                    for (recv, cq) in [(false, lp.send_cq()), (true, lp.recv_cq())] {
                        let n = cq.poll(&mut wc).unwrap();
                        got += n;
                        let mut s = seen.lock().unwrap();
                        for w in &wc[..n] {
                            assert!(matches!(w.status, WcStatus::Success | WcStatus::WrFlushErr), "{w:?}");
                            let set = if recv { &mut s.1 } else { &mut s.0 };
                            assert!(set.insert(w.wr_id), "wr {} completed twice", w.wr_id);
                        }
                        completed.fetch_add(n as u64, Ordering::SeqCst);
                    }
                    if got == 0 && stop.load(Ordering::SeqCst) {
                        break;
                    }
                    assert!(t0.elapsed() < HANG);
                }
            })
        };

        // A consumer that does not let go until the gate shuts it out.
        let straggler = {
            let (dev, ready) = (dev.clone(), ready.clone());
            thread::spawn(move || straggle(dev, &ready))
        };
        ready.wait();

        thread::sleep(Duration::from_millis(15));
        let report = sub.remove_device(&name).unwrap();
        for l in ledgers {
            let ledger = l.join().unwrap();
            ledger.check().unwrap();
            assert!(ledger.posted > 0);
        }
        poster.join().unwrap();
        // Everything posted has completed (flushes included) by now; let the
        // poller read the rest.
        let t0 = Instant::now();
        while completed.load(Ordering::SeqCst) < posted.load(Ordering::SeqCst) {
            assert!(
                t0.elapsed() < HANG,
                "{} of {} completed",
                completed.load(Ordering::SeqCst),
                posted.load(Ordering::SeqCst)
            );
            thread::sleep(Duration::from_millis(1));
        }
        stop_polling.store(true, Ordering::SeqCst);
        poller.join().unwrap();
        assert_eq!(completed.load(Ordering::SeqCst), posted.load(Ordering::SeqCst));
        straggler.join().unwrap();
        assert!(report.stragglers.iter().any(|s| s.consumer == "straggler"), "{report}");
        drop(shared);
    }
}

/// Posts receives (flushed once the device is revoked) and polls through
/// the device's gate until the gate refuses; then checks, on the raw CQ,
/// that everything it posted completed exactly once, and lets go.
fn straggle(dev: DeviceRef, ready: &Barrier) {
    let ctx = dev.open("straggler").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = dev.guard_cq(ctx.create_cq(64, 0, None, 0).unwrap());
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq.cq(),
            recv_cq: cq.cq(),
            srq: None,
            cap,
            sq_sig_all: false,
        })
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let qp = dev.guard_qp(qp);
    let sge = [mr.sge(0, 64).unwrap()];
    ready.wait();
    let mut wc = vec![WorkCompletion::default(); 16];
    let (mut posted, mut completed, mut id) = (0u64, 0u64, 0u64);
    let mut seen = HashSet::new();
    let mut take = |wc: &[WorkCompletion], completed: &mut u64| {
        for w in wc {
            assert!(seen.insert(w.wr_id), "wr {} completed twice", w.wr_id);
            assert_eq!(w.status, WcStatus::WrFlushErr);
        }
        *completed += wc.len() as u64;
    };
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < HANG, "the gate never closed");
        id += 1;
        match qp.post_recv(&[RecvWr::new(id, &sge)]) {
            Ok(()) => posted += 1,
            Err(e) if e.error.kind() == ErrorKind::NoDevice => break,
            Err(e) if e.error.kind() == ErrorKind::NoMemory => thread::yield_now(), // queue full until revoked
            Err(e) => panic!("{e}"),
        }
        match cq.poll(&mut wc) {
            Ok(n) => take(&wc[..n], &mut completed),
            Err(e) if e.kind() == ErrorKind::NoDevice => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(dev.gate().is_closed());
    // Behind the gate, the raw CQ still holds the rest, exactly once.
    loop {
        let n = cq.cq().poll(&mut wc).unwrap();
        if n == 0 {
            break;
        }
        take(&wc[..n], &mut completed);
    }
    assert_eq!(completed, posted);
    qp.into_inner().destroy().unwrap();
    cq.into_inner().destroy().unwrap();
    mr.destroy().unwrap();
    pd.destroy().unwrap();
}
