//! Read/write contexts, fast-registration key rotation, send-queue
//! budgets and reservations, the READ depth cap under a slow peer, and
//! the thread poll contexts with futures.

mod ulp_common;

use std::collections::VecDeque;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskCx, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::{Endpoint, InProcess, Link};
use softverbs::soft::proto::{Nanos, Transmit};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::ulp::*;
use softverbs::verbs::*;
use ulp_common::*;

type StatusLog = Arc<Mutex<Vec<WcStatus>>>;

/// A log of completion statuses and a maker of callbacks that append to it.
fn statuses() -> (StatusLog, impl Fn() -> Callback) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (log, move || {
        let l = l.clone();
        Box::new(move |wc: &WorkCompletion| l.lock().unwrap().push(wc.status)) as Callback
    })
}

fn rw_init() -> UlpQpInit {
    UlpQpInit {
        send_wr: 32,
        recv_wr: 32,
        max_send_sge: 2,
        rw_ctxs: 16,
        rw_max_sges: 8,
        rw_fast_reg: true,
        ..UlpQpInit::default()
    }
}

/// WRITE and READ contexts move the right bytes, with plain SGEs (one or
/// several WRs) and with fast registration, and each fast registration
/// uses a new key.
#[test]
fn read_write_contexts_move_the_bytes_with_and_without_fast_registration() {
    let (_da, _db, a, b) = pair("rw", &rw_init(), 4);
    let caps = RwCaps::probe(&a.ctx, &a.pd).unwrap();
    assert!(caps.fast_reg);
    let pool = MrPool::fast_reg(&a.pd, 4, 16).unwrap();
    let remote = b.mr(8 * 4096);
    // Four page-sized local buffers: more entries than max_send_sge (2).
    let locals: Vec<Arc<Mr>> = (0..4).map(|_| a.mr(4096)).collect();
    let mut keys = Vec::new();
    for (round, mode) in [RegMode::Plain, RegMode::Auto, RegMode::FastReg, RegMode::FastReg]
        .into_iter()
        .enumerate()
    {
        let posted = rw_write_pages((&a, &b), &locals, &remote, Some(&pool), mode, (round * 10) as u8);
        assert_eq!(posted.fast_reg, mode != RegMode::Plain, "{mode:?}");
        assert_eq!(posted.wrs, if posted.fast_reg { 3 } else { 2 });
        keys.extend(posted.key);
        assert_eq!(pool.available(), 4, "the MR is back once the callback ran");
    }
    // Keys rotate at every use, even on the same MR.
    let mut uniq = keys.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), keys.len(), "{keys:x?}");
    // READ back into fresh buffers through a fast registration.
    fill(&remote, 99);
    let sinks: Vec<Arc<Mr>> = (0..4).map(|_| a.mr(4096)).collect();
    let sgl: Vec<LocalBuf> = sinks.iter().map(|m| LocalBuf::whole(m).unwrap()).collect();
    let (n, done) = counter();
    let posted = a
        .qp()
        .rw(
            RwDir::Read,
            sgl,
            remote.remote(4096),
            Some(&pool),
            RwOptions::default(),
            done,
        )
        .unwrap();
    assert!(posted.fast_reg);
    poll_until(&[&a.cq, &b.cq], "the read context", || n.load(Ordering::SeqCst) == 1);
    for (k, m) in sinks.iter().enumerate() {
        assert_eq!(
            m.to_vec(0, 4096).unwrap(),
            remote.to_vec((k as u64 + 1) * 4096, 4096).unwrap()
        );
    }
    assert_eq!(a.cq.stats().stray, 0);
}

/// A range exposed to the peer gets a new rkey each time; the peer's
/// access with the previous, invalidated rkey is rejected.
#[test]
fn exposed_keys_rotate_and_a_stale_rkey_is_rejected_by_the_peer() {
    let (_da, _db, a, b) = pair("rot", &rw_init(), 4);
    let pool = MrPool::fast_reg(&b.pd, 1, 4).unwrap();
    let target = b.mr(8192);
    let src = a.mr(4096);
    fill(&src, 7);
    let (n, done) = counter();
    let ex = b
        .qp()
        .expose(
            &pool,
            vec![LocalBuf::whole(&target).unwrap()],
            AccessFlags::REMOTE_WRITE,
            done,
        )
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "the registration", || n.load(Ordering::SeqCst) == 1);
    let first = ex.remote();
    let (n, done) = counter();
    a.qp()
        .post(
            vec![UlpWr::write(vec![LocalBuf::new(&src, 0, 256).unwrap()], first)],
            done,
        )
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "the write with the first key", || {
        n.load(Ordering::SeqCst) == 1
    });
    assert_eq!(target.to_vec(0, 256).unwrap(), src.to_vec(0, 256).unwrap());
    let (n, done) = counter();
    b.qp().invalidate(ex, done).unwrap();
    poll_until(&[&a.cq, &b.cq], "the invalidation", || n.load(Ordering::SeqCst) == 1);
    assert_eq!(pool.available(), 1);
    // Same (only) MR again: a new key.
    let (n, done) = counter();
    let ex2 = b
        .qp()
        .expose(
            &pool,
            vec![LocalBuf::whole(&target).unwrap()],
            AccessFlags::REMOTE_WRITE,
            done,
        )
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "the second registration", || {
        n.load(Ordering::SeqCst) == 1
    });
    let second = ex2.remote();
    assert_ne!(first.rkey, second.rkey);
    assert_eq!(first.rkey >> 8, second.rkey >> 8, "same MR, new key byte");
    let (log, mk) = statuses();
    a.qp()
        .post(
            vec![UlpWr::write(vec![LocalBuf::new(&src, 0, 256).unwrap()], first)],
            mk(),
        )
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "the write with the stale key", || {
        !log.lock().unwrap().is_empty()
    });
    assert_eq!(*log.lock().unwrap(), vec![WcStatus::RemAccessErr]);
    drop(ex2);
    assert_eq!(pool.discarded(), 1, "dropped while valid: deregistered, not reused");
}

/// Budgets are exact and never clamped; reservations guarantee room and
/// a post without room fails with the callback back.
#[test]
fn budgets_and_reservations() {
    let ctx = softverbs::soft::embedded_default().unwrap()[0].open().unwrap();
    let attr = ctx.query_device().unwrap();
    let init = UlpQpInit {
        send_wr: 5,
        recv_wr: 3,
        rw_ctxs: 2,
        rw_max_sges: 9,
        max_send_sge: 4,
        ..UlpQpInit::default()
    };
    let b = SqBudget::of(&ctx, &init).unwrap();
    assert_eq!(
        (b.mr_factor, b.total, b.recv_total),
        (3, 5 + 2 * 3 + 1, 4),
        "9 sges over 4-entry WRs"
    );
    let fr = SqBudget::of(
        &ctx,
        &UlpQpInit {
            rw_max_sges: 2,
            rw_fast_reg: true,
            ..init
        },
    )
    .unwrap();
    assert_eq!(fr.mr_factor, 3, "REG_MR + op + LOCAL_INV");
    let too_big = UlpQpInit {
        send_wr: attr.max_qp_wr,
        ..init
    };
    let e = SqBudget::of(&ctx, &too_big).unwrap_err();
    assert!(e.to_string().contains(&format!("at most {}", attr.max_qp_wr)), "{e}");
    let pd = ctx.alloc_pd().unwrap();
    // A CQ too small for the queues: an error, not an overrun later.
    let small = UlpCq::new(&ctx, 8).unwrap();
    let e = UlpQp::create(&pd, &small, &small, &init).unwrap_err();
    assert!(e.to_string().contains("entries free"), "{e}");
    let cq = UlpCq::new(&ctx, 64).unwrap();
    let qp = UlpQp::create(&pd, &cq, &cq, &init).unwrap();
    assert!(qp.qp().cap().max_send_wr >= b.total);
    let cap = qp.stats().sq_cap;
    assert_eq!(cap, b.total - 1);
    let r = qp.reserve(cap - 1).unwrap();
    let e = qp.reserve(2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoMemory);
    assert!(e.to_string().contains("1 of"), "{e}");
    // No room for a two-WR chain: the callback comes back uncalled.
    let called = Arc::new(AtomicU32::new(0));
    let c = called.clone();
    let chain = vec![UlpWr::send_inline(b"a"), UlpWr::send_inline(b"b")];
    let e = qp.post(chain, move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    let e = e.unwrap_err();
    assert_eq!(e.error.kind(), ErrorKind::NoMemory);
    assert!(e.callback.is_some());
    // Nor for one plain WR over one buffer (the layer's short path).
    let mr = Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    let last = qp.reserve(1).unwrap();
    let c = called.clone();
    let e = qp
        .post(UlpWr::send(LocalBuf::new(&mr, 0, 8).unwrap()), move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap_err();
    assert_eq!(e.error.kind(), ErrorKind::NoMemory);
    assert!(e.callback.is_some());
    assert_eq!(qp.stats().sq_used, cap, "a refused post takes no slot");
    drop(last);
    drop(r);
    assert_eq!(qp.stats().sq_used, 0, "slots back on drop");
    assert_eq!(called.load(Ordering::SeqCst), 0);
    // A plain WR into a larger reservation gives the unused slots back;
    // on a QP not yet connected the device refuses it: the callback comes
    // back, uncalled, and the reserved slot is returned.
    let r = qp.reserve(3).unwrap();
    let e = qp
        .post_reserved(r, UlpWr::send(LocalBuf::new(&mr, 0, 8).unwrap()), true, |_| {})
        .unwrap_err();
    assert!(e.callback.is_some(), "{e}");
    assert_eq!(qp.stats().sq_used, 0, "reserved slots back after a refused post");
    assert_eq!(qp.stats().requests, 0);
}

/// A link that holds every datagram to one address until the test
/// releases it: a peer exactly as slow as the test wants.
#[derive(Debug)]
struct GateLink {
    inner: Arc<InprocFabric>,
    slow: IpAddr,
    held: Mutex<VecDeque<Transmit>>,
}

impl Link for GateLink {
    fn send_batch(&self, txs: &mut Vec<Transmit>, _spent: &mut dyn FnMut(Vec<u8>)) {
        for t in txs.drain(..) {
            let _ = InProcess::send(self, t);
        }
    }
    fn attach(&self, dev: &Arc<dyn Endpoint>) {
        self.inner.attach(dev)
    }
    fn detach(&self, dev: &dyn Endpoint) {
        self.inner.detach(dev)
    }
    fn name(&self) -> &'static str {
        "gate"
    }
    fn in_process(&self) -> Option<&dyn InProcess> {
        Some(self)
    }
}

impl InProcess for GateLink {
    fn route(&self, _dst: IpAddr) -> Option<Arc<dyn Endpoint>> {
        // Every datagram goes through `send`, to be held or delivered.
        None
    }
    fn send(&self, tx: Transmit) -> Option<Arc<dyn Endpoint>> {
        if tx.dst == self.slow {
            self.held.lock().unwrap().push_back(tx);
            None
        } else {
            self.inner.send(tx)
        }
    }
    fn note_deadline(&self, d: Option<Nanos>) {
        self.inner.note_deadline(d)
    }
    fn take_due(&self, now: Nanos) -> Vec<Arc<dyn Endpoint>> {
        self.inner.take_due(now)
    }
}

impl GateLink {
    /// Delivers what is held (to the slow peer) and lets it run.
    fn release(&self) -> usize {
        let held: Vec<Transmit> = self.held.lock().unwrap().drain(..).collect();
        let n = held.len();
        for tx in held {
            if let Some(dev) = self.inner.send(tx) {
                dev.drive();
            }
        }
        n
    }
}

/// Two devices on a [`GateLink`] whose second (`b`) is the slow peer,
/// with one connected layer QP each, `depth` READ credits each way.
struct Gated {
    gate: Arc<GateLink>,
    devs: [Arc<SoftDevice>; 2],
    a: End,
    b: End,
}

impl Gated {
    fn new(tag: &str, init: &UlpQpInit, depth: u8) -> Gated {
        let pid = std::process::id() as u8;
        // A network of its own for each pair of this process.
        static NEXT_NET: AtomicU8 = AtomicU8::new(161);
        let net = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let (fast_ip, slow_ip): (IpAddr, IpAddr) = (
            format!("127.{net}.{pid}.1").parse().unwrap(),
            format!("127.{net}.{pid}.2").parse().unwrap(),
        );
        let gate = Arc::new(GateLink {
            inner: InprocFabric::new(),
            slow: slow_ip,
            held: Mutex::new(VecDeque::new()),
        });
        let mk = |name: &str, ip| {
            SoftDevice::create(SoftDeviceConfig {
                link: Some(gate.clone() as Arc<dyn Link>),
                ..SoftDeviceConfig::new(&format!("ulp_gate_{tag}_{name}_{pid}"), ip)
            })
            .unwrap()
        };
        let devs = [mk("fast", fast_ip), mk("slow", slow_ip)];
        let a = End::new(&devs[0], init, 512);
        let b = End::new(&devs[1], init, 512);
        connect_one(&a, &b, depth, 7);
        connect_one(&b, &a, depth, 7);
        Gated { gate, devs, a, b }
    }

    /// Lets the slow peer answer and polls `a`'s CQ (at most `batch`
    /// completions per poll) until `done()`, bounded.
    fn run_until(&self, batch: usize, what: &str, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !done() {
            self.gate.release();
            self.a.cq.poll(batch).unwrap();
            self.b.cq.poll(16).unwrap();
            assert!(
                Instant::now() < until,
                "stuck waiting for {what}: {:?}",
                self.a.qp().stats()
            );
            std::thread::sleep(Duration::from_micros(300));
        }
    }

    /// Goes on letting the peer answer and polling `a`'s CQ for a while:
    /// whatever was still to come has come.
    fn settle(&self) {
        for _ in 0..50 {
            self.gate.release();
            self.a.cq.poll(16).unwrap();
        }
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        drop(self.a.qp.take());
        drop(self.b.qp.take());
        for d in &self.devs {
            d.remove();
        }
    }
}

/// A READ of 4 KiB from `remote` at page `k` into `sink` at page `k`.
fn read_page(sink: &Arc<Mr>, remote: RemoteAddr, k: u64) -> UlpWr {
    UlpWr::read(LocalBuf::new(sink, k * 4096, 4096).unwrap(), remote)
}

/// READs beyond `max_rd_atomic` wait in the layer and go out as earlier
/// ones complete; a SEND posted behind them is not held up; everything
/// completes with a peer that answers only when the test lets it.
#[test]
fn read_depth_is_capped_under_a_slow_peer() {
    const DEPTH: u8 = 2;
    let g = Gated::new("cap", &UlpQpInit::default(), DEPTH);
    let (a, b, gate) = (&g.a, &g.b, &g.gate);
    let remote = b.mr(16 * 4096);
    fill(&remote, 3);
    let sink = a.mr(16 * 4096);
    let done = Arc::new(AtomicU32::new(0));
    const READS: u32 = 12;
    for k in 0..READS {
        let d = done.clone();
        a.qp()
            .post(
                vec![read_page(&sink, remote.remote(u64::from(k) * 4096), u64::from(k))],
                move |wc| {
                    assert!(wc.is_success(), "{wc:?}");
                    d.fetch_add(1, Ordering::SeqCst);
                },
            )
            .unwrap();
    }
    let s = a.qp().stats();
    assert_eq!((s.rd_outstanding, s.rd_depth), (u32::from(DEPTH), u32::from(DEPTH)));
    assert_eq!(s.queued_rd, u64::from(READS - u32::from(DEPTH)));
    // A SEND behind the queued READs goes to the device at once.
    let rbuf = b.mr(64);
    let (rn, rdone) = counter();
    b.qp().post_recv(vec![LocalBuf::whole(&rbuf).unwrap()], rdone).unwrap();
    let (sn, sdone) = counter();
    a.qp()
        .post(vec![UlpWr::send_inline(b"not behind the reads")], sdone)
        .unwrap();
    assert_eq!(a.qp().stats().queued_rd, u64::from(READS - u32::from(DEPTH)));
    let until = Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::SeqCst) < READS || sn.load(Ordering::SeqCst) == 0 {
        assert!(a.qp().stats().rd_outstanding <= u32::from(DEPTH));
        gate.release();
        a.cq.poll(16).unwrap();
        b.cq.poll(16).unwrap();
        assert!(Instant::now() < until, "stuck: {:?}", a.qp().stats());
        std::thread::sleep(Duration::from_micros(300));
    }
    let s = a.qp().stats();
    assert_eq!((s.rd_peak, s.rd_outstanding), (u32::from(DEPTH), 0), "{s:?}");
    assert_eq!(
        sink.to_vec(0, 16 * 4096).unwrap()[..READS as usize * 4096],
        remote.to_vec(0, READS as usize * 4096).unwrap()
    );
    poll_until(&[&b.cq], "the receive", || {
        gate.release();
        rn.load(Ordering::SeqCst) == 1
    });
}

/// Each READ that retires lets one queued READ out at once: the depth
/// stays full while READs wait (a queued READ that waited for the whole
/// depth to drain would halve the pipeline).
#[test]
fn a_retired_read_lets_the_next_queued_one_out_at_once() {
    const DEPTH: u8 = 2;
    let g = Gated::new("refill", &UlpQpInit::default(), DEPTH);
    let remote = g.b.mr(4 * 4096);
    fill(&remote, 5);
    let sink = g.a.mr(4 * 4096);
    // Callbacks that log rather than assert: a failure of the test must
    // not panic again in the flushes of its teardown.
    let (log, cb) = statuses();
    for k in 0..4u64 {
        g.a.qp()
            .post(read_page(&sink, remote.remote(k * 4096), k), cb())
            .unwrap();
    }
    let s = g.a.qp().stats();
    assert_eq!((s.rd_outstanding, s.queued_rd), (2, 2), "{s:?}");
    let retired = || log.lock().unwrap().len();
    g.run_until(1, "the first READ", || retired() >= 1);
    // One retired (one completion per poll): the next went out in its place.
    assert_eq!(retired(), 1);
    assert_eq!(g.a.qp().stats().rd_outstanding, 2, "{:?}", g.a.qp().stats());
    g.run_until(1, "every READ", || retired() == 4);
    assert_eq!(*log.lock().unwrap(), [WcStatus::Success; 4]);
    let s = g.a.qp().stats();
    assert_eq!((s.rd_outstanding, s.rd_peak, s.sq_used), (0, 2, 0), "{s:?}");
    assert_eq!(sink.to_vec(0, 4 * 4096).unwrap(), remote.to_vec(0, 4 * 4096).unwrap());
}

/// A request of more READs than the depth never fits beside another
/// READ: once it waited, it goes out when nothing is outstanding, rather
/// than waiting for ever.
#[test]
fn a_chain_of_more_reads_than_the_depth_goes_out_when_nothing_is_outstanding() {
    const DEPTH: u8 = 2;
    let init = UlpQpInit {
        send_wr: 16,
        ..UlpQpInit::default()
    };
    let g = Gated::new("chain", &init, DEPTH);
    let remote = g.b.mr(4 * 4096);
    fill(&remote, 9);
    let sink = g.a.mr(4 * 4096);
    let (log, cb) = statuses();
    g.a.qp().post(read_page(&sink, remote.remote(0), 0), cb()).unwrap();
    let chain: Vec<UlpWr> = (1..4u64)
        .map(|k| read_page(&sink, remote.remote(k * 4096), k))
        .collect();
    g.a.qp().post(chain, cb()).unwrap();
    assert_eq!(g.a.qp().stats().queued_rd, 1);
    g.run_until(1, "the chain", || log.lock().unwrap().len() == 2);
    assert_eq!(*log.lock().unwrap(), [WcStatus::Success; 2]);
    assert_eq!(g.a.qp().stats().rd_outstanding, 0);
    assert_eq!(sink.to_vec(0, 4 * 4096).unwrap(), remote.to_vec(0, 4 * 4096).unwrap());
}

/// When the send queue fails with READs still waiting in the layer, the
/// layer completes each of them once with a flush (they never reached
/// the device, so nothing else would), counts them as made up, and gives
/// their send slots back.
#[test]
fn reads_waiting_in_the_layer_flush_once_when_the_queue_fails() {
    const DEPTH: u8 = 2;
    let g = Gated::new("fail", &UlpQpInit::default(), DEPTH);
    let remote = g.b.mr(4 * 4096);
    let sink = g.a.mr(4 * 4096);
    let (log, cb) = statuses();
    // The first READ names a key the peer does not have: it fails, and
    // the queue with it.
    let bad = RemoteAddr {
        rkey: remote.rkey() ^ 0x5a5a_0000,
        ..remote.remote(0)
    };
    g.a.qp().post(read_page(&sink, bad, 0), cb()).unwrap();
    for k in 1..4u64 {
        g.a.qp()
            .post(read_page(&sink, remote.remote(k * 4096), k), cb())
            .unwrap();
    }
    assert_eq!(g.a.qp().stats().queued_rd, 2);
    g.run_until(1, "every callback", || log.lock().unwrap().len() >= 4);
    // Nothing more comes.
    g.settle();
    let got = log.lock().unwrap().clone();
    assert_eq!(got[0], WcStatus::RemAccessErr, "{got:?}");
    assert_eq!(got[1..], [WcStatus::WrFlushErr; 3], "{got:?}");
    let s = g.a.qp().stats();
    assert_eq!((s.synthesized, s.sq_used, s.rd_outstanding), (2, 0, 0), "{s:?}");
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: parks the thread until the future's waker fires
/// (no busy loop; a bounded wait so a lost wake-up fails the test).
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = TaskCx::from_waker(&waker);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(Instant::now() < until, "no wake-up");
        std::thread::park_timeout(Duration::from_secs(1));
    }
}

/// Futures resolve through CQs driven by worker threads (a pool shared
/// by several QPs): sends and receives of many QP pairs.
#[test]
fn futures_over_a_cq_pool() {
    let (da, db) = ulp_common::devices("fut");
    let (ca, cb) = (da.open().unwrap(), db.open().unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let pool_a = CqPool::new(&ca, 2, 1024).unwrap();
    let pool_b = CqPool::new(&cb, 2, 1024).unwrap();
    let init = UlpQpInit {
        send_wr: 16,
        recv_wr: 16,
        ..UlpQpInit::default()
    };
    let need = SqBudget::of(&ca, &init).map(|b| b.total + b.recv_total).unwrap();
    let mut ends = Vec::new();
    for _ in 0..4 {
        let (qa, qb) = (pool_a.get(need).unwrap(), pool_b.get(need).unwrap());
        let a = End {
            qp: Some(UlpQp::create(&pa, &qa, &qa, &init).unwrap()),
            cq: qa,
            gid: ca.query_gid(1, 0).unwrap(),
            ctx: ca.clone(),
            pd: ca.alloc_pd().unwrap(),
        };
        let b = End {
            qp: Some(UlpQp::create(&pb, &qb, &qb, &init).unwrap()),
            cq: qb,
            gid: cb.query_gid(1, 0).unwrap(),
            ctx: cb.clone(),
            pd: cb.alloc_pd().unwrap(),
        };
        connect_one(&a, &b, 1, 7);
        connect_one(&b, &a, 1, 7);
        ends.push((a, b));
    }
    // The pool spread the QPs over its CQs.
    assert!(pool_a.cqs().all(|c| c.free_entries() < 1024));
    let buf = Arc::new(pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    for round in 0..20u32 {
        let mut recvs = Vec::new();
        let mut sends = Vec::new();
        for (k, (a, b)) in ends.iter().enumerate() {
            recvs.push(
                b.qp()
                    .recv_async(vec![LocalBuf::new(&buf, k as u64 * 64, 64).unwrap()])
                    .unwrap(),
            );
            let msg = format!("round {round} qp {k}");
            sends.push(a.qp().post_async(vec![UlpWr::send_inline(msg.as_bytes())]).unwrap());
        }
        for f in sends.into_iter().chain(recvs) {
            let wc = block_on(f);
            assert!(wc.is_success(), "{wc:?}");
        }
    }
    let mut got = vec![0u8; 12];
    buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"round 19 qp ");
    drop(ends);
    for c in pool_a.cqs().chain(pool_b.cqs()) {
        assert_eq!(c.free_entries(), 1024, "closed QPs gave their entries back");
        assert_eq!(c.stats().stray, 0);
    }
}

/// Lazy invalidation: the callback runs when the op is done, before the
/// LOCAL_INV; the MR returns to the pool once that has completed, free
/// (a reuse maps it again, which a still valid MR would refuse) and with
/// a new key.
#[test]
fn lazy_invalidation_runs_the_callback_first_and_frees_the_mr_after() {
    let (_da, _db, a, b) = pair("lazy", &rw_init(), 4);
    let pool = MrPool::fast_reg(&a.pd, 1, 16).unwrap();
    let remote = b.mr(4 * 4096);
    let locals: Vec<Arc<Mr>> = (0..4).map(|_| a.mr(4096)).collect();
    let mut keys = Vec::new();
    for round in 0..3u8 {
        for (k, m) in locals.iter().enumerate() {
            fill(m, round * 16 + k as u8);
        }
        let sgl: Vec<LocalBuf> = locals.iter().map(|m| LocalBuf::whole(m).unwrap()).collect();
        let seen = Arc::new(Mutex::new(None));
        let (s, p) = (seen.clone(), pool.clone());
        let opts = RwOptions {
            mode: RegMode::FastReg,
            lazy_invalidate: true,
            ..RwOptions::default()
        };
        let posted = a
            .qp()
            .rw(RwDir::Write, sgl, remote.remote(0), Some(&pool), opts, move |wc| {
                *s.lock().unwrap() = Some((wc.status, p.available()));
            })
            .unwrap();
        keys.push(posted.key.unwrap());
        poll_until(&[&a.cq, &b.cq], "the lazily invalidated write", || {
            seen.lock().unwrap().is_some() && pool.available() == 1
        });
        assert_eq!(
            *seen.lock().unwrap(),
            Some((WcStatus::Success, 0)),
            "the callback ran before the invalidation gave the MR back"
        );
        for (k, m) in locals.iter().enumerate() {
            assert_eq!(
                remote.to_vec(k as u64 * 4096, 4096).unwrap(),
                m.to_vec(0, 4096).unwrap()
            );
        }
        assert_eq!(a.qp().stats().sq_used, 0);
    }
    assert!(keys[0] != keys[1] && keys[1] != keys[2], "{keys:x?}");
}

/// A lazily invalidated request that succeeds in the same poll as a
/// later WR fails: its LOCAL_INV cannot go to the failed queue, so its
/// MR, whose key may still be valid, is discarded rather than given back
/// to the pool, and its send slot is given back.
#[test]
fn a_lazy_invalidation_behind_a_failure_discards_its_mr() {
    let g = Gated::new("lazyfail", &rw_init(), 2);
    let pool = MrPool::fast_reg(&g.a.pd, 1, 16).unwrap();
    let remote = g.b.mr(4 * 4096);
    let local = g.a.mr(4096);
    let (log, cb) = statuses();
    let opts = RwOptions {
        mode: RegMode::FastReg,
        lazy_invalidate: true,
        ..RwOptions::default()
    };
    g.a.qp()
        .rw(
            RwDir::Write,
            LocalBuf::whole(&local).unwrap(),
            remote.remote(0),
            Some(&pool),
            opts,
            cb(),
        )
        .unwrap();
    let bad = RemoteAddr {
        rkey: remote.rkey() ^ 0x5a5a_0000,
        ..remote.remote(4096)
    };
    g.a.qp().post(read_page(&local, bad, 0), cb()).unwrap();
    // Both answers come back together: one poll sees the WRITE's success
    // and the READ's failure.
    g.run_until(16, "both callbacks", || log.lock().unwrap().len() >= 2);
    g.settle();
    assert_eq!(*log.lock().unwrap(), [WcStatus::Success, WcStatus::RemAccessErr]);
    assert_eq!((pool.available(), pool.discarded()), (0, 1));
    assert_eq!(g.a.qp().stats().sq_used, 0, "{:?}", g.a.qp().stats());
}

/// A range exposed with `expose_wr` and registered in front of the SEND
/// that carries its key (one chain, as NVMe-oF hosts post it) is valid
/// when the peer gets the SEND, and costs no completion of its own: the
/// chain's callback runs once. The REG_MR carries no scatter entries of
/// its own, so a list longer than the QP's `max_send_sge` exposes (with
/// `expose` too). An exposure whose WR is never posted is discarded.
#[test]
fn an_exposure_chained_in_front_of_its_send_completes_once() {
    let (_da, _db, a, b) = pair("xwr", &rw_init(), 4);
    let pool = MrPool::fast_reg(&b.pd, 2, 16).unwrap();
    // Four page-sized buffers: more entries than max_send_sge (2).
    let targets: Vec<Arc<Mr>> = (0..4).map(|_| b.mr(4096)).collect();
    let sgl = || -> Vec<LocalBuf> { targets.iter().map(|m| LocalBuf::whole(m).unwrap()).collect() };
    let msg = a.mr(64);
    let (got, on_recv) = counter();
    a.qp().post_recv(LocalBuf::whole(&msg).unwrap(), on_recv).unwrap();
    let (ex, reg) = b.qp().expose_wr(&pool, sgl(), AccessFlags::REMOTE_WRITE).unwrap();
    let r = ex.remote();
    let mut cmd = r.addr.to_le_bytes().to_vec();
    cmd.extend_from_slice(&r.rkey.to_le_bytes());
    let (log, mk) = statuses();
    b.qp().post(vec![reg, UlpWr::send_inline(&cmd)], mk()).unwrap();
    poll_until(&[&a.cq, &b.cq], "the command", || {
        got.load(Ordering::SeqCst) == 1 && !log.lock().unwrap().is_empty()
    });
    assert_eq!(
        *log.lock().unwrap(),
        vec![WcStatus::Success],
        "one callback for the chain"
    );
    // The peer writes through the key it was sent.
    let bytes = msg.to_vec(0, 12).unwrap();
    let remote = RemoteAddr {
        addr: u64::from_le_bytes(bytes[..8].try_into().unwrap()),
        rkey: u32::from_le_bytes(bytes[8..].try_into().unwrap()),
    };
    assert_eq!(remote, r);
    let src = a.mr(4 * 4096);
    fill(&src, 42);
    let (n, done) = counter();
    a.qp()
        .post(UlpWr::write(LocalBuf::whole(&src).unwrap(), remote), done)
        .unwrap();
    poll_until(&[&a.cq, &b.cq], "the write through the exposed key", || {
        n.load(Ordering::SeqCst) == 1
    });
    for (k, m) in targets.iter().enumerate() {
        assert_eq!(m.to_vec(0, 4096).unwrap(), src.to_vec(k as u64 * 4096, 4096).unwrap());
    }
    let (n, done) = counter();
    b.qp().invalidate(ex, done).unwrap();
    poll_until(&[&a.cq, &b.cq], "the invalidation", || n.load(Ordering::SeqCst) == 1);
    assert_eq!(pool.available(), 2);
    // `expose` of the same list posts it alone.
    let (n, done) = counter();
    let ex = b.qp().expose(&pool, sgl(), AccessFlags::REMOTE_WRITE, done).unwrap();
    poll_until(&[&a.cq, &b.cq], "the registration", || n.load(Ordering::SeqCst) == 1);
    let (n, done) = counter();
    b.qp().invalidate(ex, done).unwrap();
    poll_until(&[&a.cq, &b.cq], "the second invalidation", || {
        n.load(Ordering::SeqCst) == 1
    });
    // Never posted: dropped with the exposure, not reused.
    let (ex, reg) = b.qp().expose_wr(&pool, sgl(), AccessFlags::REMOTE_WRITE).unwrap();
    drop((reg, ex));
    assert_eq!((pool.available(), pool.discarded()), (1, 1));
    assert_eq!((a.cq.stats().stray, b.cq.stats().stray), (0, 0));
    assert_eq!(b.qp().stats().sq_used, 0);
}

/// A read/write context over one buffer given as it is (no list) moves
/// the bytes in one WR, either way.
#[test]
fn a_context_over_one_buffer_is_one_plain_wr() {
    let (_da, _db, a, b) = pair("rw1", &rw_init(), 4);
    let (local, remote) = (a.mr(4096), b.mr(4096));
    fill(&local, 5);
    for dir in [RwDir::Write, RwDir::Read] {
        if dir == RwDir::Read {
            fill(&remote, 77);
        }
        let (n, done) = counter();
        let posted = a
            .qp()
            .rw(
                dir,
                LocalBuf::whole(&local).unwrap(),
                remote.remote(0),
                None,
                RwOptions::default(),
                done,
            )
            .unwrap();
        assert_eq!((posted.wrs, posted.fast_reg), (1, false));
        poll_until(&[&a.cq, &b.cq], "the context", || n.load(Ordering::SeqCst) == 1);
        assert_eq!(
            local.to_vec(0, 4096).unwrap(),
            remote.to_vec(0, 4096).unwrap(),
            "{dir:?}"
        );
    }
}

/// READs beyond the QP's depth (1) go out as earlier ones complete, also
/// when each completion is polled alone (the poll's short path must give
/// the READ credit back and post what waits for it).
#[test]
fn reads_beyond_the_depth_go_out_as_lone_completions_come_back() {
    let (_da, _db, a, b) = pair("rd1", &rw_init(), 1);
    let (local, remote) = (a.mr(4096), b.mr(4096));
    fill(&remote, 31);
    let read = |k: u64, done| {
        a.qp()
            .post(
                UlpWr::read(LocalBuf::new(&local, 512 * k, 512).unwrap(), remote.remote(512 * k)),
                done,
            )
            .unwrap();
    };
    // One after another, more than the depth in all (the first also
    // makes the CQ's poll know the QP: later completions can be lone).
    for k in 2..8 {
        let (n, done) = counter();
        read(k, done);
        poll_until(&[&a.cq, &b.cq], "a READ", || n.load(Ordering::SeqCst) == 1);
    }
    // Then two at once: the second waits in the layer for the first's
    // credit, and the first's completion comes back alone.
    let (n, done) = counter();
    read(0, done);
    let (m, done) = counter();
    read(1, done);
    assert_eq!(a.qp().stats().queued_rd, 1);
    let until = Instant::now() + Duration::from_secs(60);
    while n.load(Ordering::SeqCst) + m.load(Ordering::SeqCst) < 2 {
        // One completion per poll: each is retired alone.
        a.cq.poll(1).unwrap();
        b.cq.poll(1).unwrap();
        assert!(Instant::now() < until, "the queued READ never went out");
    }
    assert_eq!(local.to_vec(0, 4096).unwrap(), remote.to_vec(0, 4096).unwrap());
    let st = a.qp().stats();
    assert_eq!((st.rd_outstanding, st.rd_peak, st.sq_used), (0, 1, 0));
}
