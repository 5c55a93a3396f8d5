//! The fast-path cost of hotplug safety.
//!
//! Message rate of a post_send + poll_cq loop on a soft device (an RC pair
//! on one device: post receive, post signaled send, poll both CQs) through
//! the plain verbs handles and through the subsystem's guarded handles
//! (`GuardedQp`/`GuardedCq`: one removal-gate enter/exit per call), for one
//! thread and for two threads (on two devices, and on one device). The
//! plain handles are the same loop with the guard compiled out: the soft
//! provider's own hotplug safety adds nothing to post/poll (revocation
//! moves QPs to ERR, a state the post path checks anyway; the `revoked`
//! flag is read by control verbs only). Two references frame it: the same
//! loop on the sans-IO engine with no handles, no lock and no driver
//! (`raw core`), and the cost of the gate alone against the shared
//! reference count that the seed debate feared.
//!
//! `cargo bench -p softverbs-emulator --bench guard_cost [-- --window-ms N --reps N --json]`

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::proto::{Core, CoreConfig, CqId, Datagram, QpCreate};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::subsystem::{
    DeviceRef, GuardedCq, GuardedQp, NamespaceId, RemovalGate, SoftFactory, Subsystem, SubsystemConfig,
};
use softverbs::verbs::{
    AccessFlags, Context, MemorySource, Mr, MrMemory, Pd, PostError, QpCap, QpInitAttr, QpType, RecvWr, SendFlags,
    SendOp, SendWr, Sge, WorkCompletion,
};
use softverbs_emulator::netns::traffic::{connect_rc, first_gid};

const MSG: u32 = 64;
const DEPTH: u32 = 64;

/// The four fast-path calls, with or without the gate.
trait FastPath: Send + Sync {
    fn post_send(&self, wr: &[SendWr<'_>]) -> Result<(), PostError>;
    fn post_recv(&self, wr: &[RecvWr<'_>]) -> Result<(), PostError>;
    fn poll_send(&self, wc: &mut [WorkCompletion]) -> usize;
    fn poll_recv(&self, wc: &mut [WorkCompletion]) -> usize;
    fn mr(&self) -> &Mr;
}

/// The objects of one RC loop (sender -> receiver on one device), behind
/// the device's removal gate. The plain, gated and locked-RMW variants all
/// run on the same objects (so object placement cannot bias the
/// comparison); only the path into them differs.
struct Rig {
    sender: GuardedQp,
    receiver: GuardedQp,
    scq: GuardedCq,
    rcq: GuardedCq,
    mr: Mr,
    rmw: RmwGate,
    _pd: Pd,
    _ctx: Context,
}

fn rig(dev: &DeviceRef) -> Arc<Rig> {
    let ctx = dev.open("guard_cost").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let scq = ctx.create_cq(DEPTH * 2, 0, None, 0).unwrap();
    let rcq = ctx.create_cq(DEPTH * 2, 0, None, 0).unwrap();
    let attr = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &scq,
        recv_cq: &rcq,
        srq: None,
        cap: QpCap {
            max_send_wr: DEPTH,
            max_recv_wr: DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        sq_sig_all: false,
    };
    let sender = pd.create_qp(&attr).unwrap();
    let receiver = pd.create_qp(&attr).unwrap();
    let gid = first_gid(&ctx).unwrap();
    connect_rc(&sender, gid, receiver.qp_num(), 0x200, 0x100).unwrap();
    connect_rc(&receiver, gid, sender.qp_num(), 0x100, 0x200).unwrap();
    Arc::new(Rig {
        sender: dev.guard_qp(sender),
        receiver: dev.guard_qp(receiver),
        scq: dev.guard_cq(scq),
        rcq: dev.guard_cq(rcq),
        mr,
        rmw: RmwGate {
            closed: AtomicBool::new(false),
            slots: Default::default(),
        },
        _pd: pd,
        _ctx: ctx,
    })
}

/// The guard compiled out: straight to the verbs handles.
struct Plain(Arc<Rig>);

impl FastPath for Plain {
    #[inline]
    fn post_send(&self, wr: &[SendWr<'_>]) -> Result<(), PostError> {
        self.0.sender.qp().post_send(wr)
    }
    #[inline]
    fn post_recv(&self, wr: &[RecvWr<'_>]) -> Result<(), PostError> {
        self.0.receiver.qp().post_recv(wr)
    }
    #[inline]
    fn poll_send(&self, wc: &mut [WorkCompletion]) -> usize {
        self.0.scq.cq().poll(wc).unwrap()
    }
    #[inline]
    fn poll_recv(&self, wc: &mut [WorkCompletion]) -> usize {
        self.0.rcq.cq().poll(wc).unwrap()
    }
    fn mr(&self) -> &Mr {
        &self.0.mr
    }
}

/// Through the subsystem's guarded handles (the removal gate).
struct Gated(Arc<Rig>);

impl FastPath for Gated {
    #[inline]
    fn post_send(&self, wr: &[SendWr<'_>]) -> Result<(), PostError> {
        self.0.sender.post_send(wr)
    }
    #[inline]
    fn post_recv(&self, wr: &[RecvWr<'_>]) -> Result<(), PostError> {
        self.0.receiver.post_recv(wr)
    }
    #[inline]
    fn poll_send(&self, wc: &mut [WorkCompletion]) -> usize {
        self.0.scq.poll(wc).unwrap()
    }
    #[inline]
    fn poll_recv(&self, wc: &mut [WorkCompletion]) -> usize {
        self.0.rcq.poll(wc).unwrap()
    }
    fn mr(&self) -> &Mr {
        &self.0.mr
    }
}

/// The first design of the gate, kept for comparison: a per-device counter
/// sharded over 16 cache lines, entered with a locked increment and left
/// with a locked decrement (what a reference-counted handle costs when the
/// count is not shared by every thread).
struct RmwGate {
    closed: AtomicBool,
    slots: [RmwSlot; 16],
}

#[repr(align(128))]
#[derive(Default)]
struct RmwSlot(AtomicUsize);

thread_local! {
    static RMW_SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

impl RmwGate {
    #[inline]
    fn with<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let i = RMW_SLOT.with(|c| {
            if c.get() == usize::MAX {
                c.set(NEXT.fetch_add(1, Ordering::Relaxed) % 16);
            }
            c.get()
        });
        let slot = &self.slots[i].0;
        slot.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            slot.fetch_sub(1, Ordering::Release);
            return None;
        }
        let r = f();
        slot.fetch_sub(1, Ordering::Release);
        Some(r)
    }
}

/// Through the locked-RMW gate.
struct RmwGated(Arc<Rig>);

impl FastPath for RmwGated {
    #[inline]
    fn post_send(&self, wr: &[SendWr<'_>]) -> Result<(), PostError> {
        let r = &self.0;
        r.rmw.with(|| r.sender.qp().post_send(wr)).unwrap()
    }
    #[inline]
    fn post_recv(&self, wr: &[RecvWr<'_>]) -> Result<(), PostError> {
        let r = &self.0;
        r.rmw.with(|| r.receiver.qp().post_recv(wr)).unwrap()
    }
    #[inline]
    fn poll_send(&self, wc: &mut [WorkCompletion]) -> usize {
        let r = &self.0;
        r.rmw.with(|| r.scq.cq().poll(wc).unwrap()).unwrap()
    }
    #[inline]
    fn poll_recv(&self, wc: &mut [WorkCompletion]) -> usize {
        let r = &self.0;
        r.rmw.with(|| r.rcq.cq().poll(wc).unwrap()).unwrap()
    }
    fn mr(&self) -> &Mr {
        &self.0.mr
    }
}

/// Runs the message loop for `window`: `batch` receives, `batch` signaled
/// sends (one WR per call, like perftest's default), then poll both CQs to
/// empty. Returns messages completed.
fn message_loop<F: FastPath>(f: &F, batch: usize, window: Duration) -> (u64, Duration) {
    let sgl = [f.mr().sge(0, MSG).unwrap()];
    let mut wc = [WorkCompletion::default(); 16];
    let mut msgs = 0u64;
    let mut id = 0u64;
    let start = Instant::now();
    loop {
        for _ in 0..batch {
            f.post_recv(&[RecvWr::new(id, &sgl)]).unwrap();
            id += 1;
        }
        for i in 0..batch {
            let wr = SendWr::new(id + i as u64, SendOp::Send, &sgl).flags(SendFlags::SIGNALED);
            f.post_send(&[wr]).unwrap();
        }
        let (mut s, mut r) = (0, 0);
        while s < batch || r < batch {
            s += f.poll_send(&mut wc);
            r += f.poll_recv(&mut wc);
        }
        msgs += batch as u64;
        // Check the clock every 64 messages or so.
        if msgs % 64 < batch as u64 && start.elapsed() >= window {
            return (msgs, start.elapsed());
        }
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own; the clock id is a
    // constant every Linux kernel supports.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One slice of one thread: messages, CPU time, wall time.
#[derive(Debug, Clone, Copy, Default)]
struct Slice {
    msgs: u64,
    cpu: Duration,
    wall: Duration,
}

impl std::ops::AddAssign for Slice {
    fn add_assign(&mut self, o: Slice) {
        self.msgs += o.msgs;
        self.cpu += o.cpu;
        self.wall = self.wall.max(o.wall);
    }
}

fn slice<F: FastPath>(f: &F, batch: usize, window: Duration) -> Slice {
    let cpu = thread_cpu();
    let (msgs, wall) = message_loop(f, batch, window);
    Slice {
        msgs,
        cpu: thread_cpu() - cpu,
        wall,
    }
}

/// Runs `pairs` pairs of slices (plain then gated, or gated then plain,
/// alternately) on every worker at once; each worker has its own rigs.
/// Returns, per pair, the (plain, gated) slices summed over workers.
fn paired<A: FastPath + 'static, B: FastPath + 'static>(
    workers: &[(Arc<A>, Arc<B>)],
    batch: usize,
    window: Duration,
    pairs: usize,
) -> Vec<(Slice, Slice)> {
    let barrier = Arc::new(Barrier::new(workers.len()));
    let handles: Vec<_> = workers
        .iter()
        .map(|(p, g)| {
            let (p, g, b) = (p.clone(), g.clone(), barrier.clone());
            thread::spawn(move || {
                // Warm-up.
                b.wait();
                slice(&*p, batch, window / 2);
                slice(&*g, batch, window / 2);
                let mut out = Vec::with_capacity(pairs);
                for i in 0..pairs {
                    let mut pair = (Slice::default(), Slice::default());
                    for plain_first in [i % 2 == 0, i % 2 != 0] {
                        b.wait();
                        if plain_first {
                            pair.0 = slice(&*p, batch, window);
                        } else {
                            pair.1 = slice(&*g, batch, window);
                        }
                    }
                    out.push(pair);
                }
                out
            })
        })
        .collect();
    let per_worker: Vec<Vec<(Slice, Slice)>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (0..pairs)
        .map(|i| {
            let mut sum = (Slice::default(), Slice::default());
            for w in &per_worker {
                sum.0 += w[i].0;
                sum.1 += w[i].1;
            }
            sum
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn quartiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 4], v[v.len() * 3 / 4])
}

struct Row {
    case: String,
    /// Median message rate (wall clock, all threads), Mmsg/s.
    plain_rate: f64,
    gated_rate: f64,
    /// Median CPU ns per message.
    plain_ns: f64,
    gated_ns: f64,
    /// Median and interquartile range of the per-pair CPU-cost overhead, %.
    overhead: f64,
    iqr: (f64, f64),
}

fn compare<A: FastPath + 'static, B: FastPath + 'static>(
    case: &str,
    workers: &[(Arc<A>, Arc<B>)],
    batch: usize,
    window: Duration,
    pairs: usize,
) -> Row {
    let v = paired(workers, batch, window, pairs);
    let ns = |s: &Slice| s.cpu.as_nanos() as f64 / s.msgs as f64;
    let rate = |s: &Slice| s.msgs as f64 / s.wall.as_secs_f64() / 1e6;
    let mut over: Vec<f64> = v.iter().map(|(p, g)| (ns(g) / ns(p) - 1.0) * 100.0).collect();
    let overhead = median(&mut over);
    let iqr = quartiles(&mut over);
    Row {
        case: format!("{case}, batch {batch}"),
        plain_rate: median(&mut v.iter().map(|(p, _)| rate(p)).collect::<Vec<_>>()),
        gated_rate: median(&mut v.iter().map(|(_, g)| rate(g)).collect::<Vec<_>>()),
        plain_ns: median(&mut v.iter().map(|(p, _)| ns(p)).collect::<Vec<_>>()),
        gated_ns: median(&mut v.iter().map(|(_, g)| ns(g)).collect::<Vec<_>>()),
        overhead,
        iqr,
    }
}

/// The same loop on the sans-IO engine: no handles, no lock, no driver.
/// Returns CPU ns per message.
fn raw_core(batch: usize, window: Duration) -> f64 {
    let probe = SoftDevice::create(SoftDeviceConfig {
        link: Some(InprocFabric::new()),
        ..SoftDeviceConfig::new("guard_cost_probe", "10.99.0.1".parse().unwrap())
    })
    .unwrap();
    let (attr, port, gids) = (probe.attr(), probe.port_attr(), probe.gids().to_vec());
    probe.unplug();
    let mut core = Core::new(CoreConfig::new(attr, port, gids.clone(), 7));
    let mem = Arc::new(MemorySource::Owned(MrMemory::new(4096).unwrap()));
    let pd = core.alloc_pd(0).unwrap();
    let (lkey, _) = core.reg_mr(pd, mem.clone(), AccessFlags::LOCAL_WRITE).unwrap();
    let (scq, _) = core.create_cq(DEPTH * 2, 0, 0).unwrap();
    let (rcq, _) = core.create_cq(DEPTH * 2, 0, 0).unwrap();
    let create = QpCreate {
        qp_type: QpType::Rc,
        pd,
        send_cq: scq,
        recv_cq: rcq,
        srq: None,
        cap: QpCap {
            max_send_wr: DEPTH,
            max_recv_wr: DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        sq_sig_all: false,
        owner: 0,
    };
    let (sender, _) = core.create_qp(&create).unwrap();
    let (receiver, _) = core.create_qp(&create).unwrap();
    let epoch = Instant::now();
    let now = || epoch.elapsed().as_nanos() as u64;
    raw_connect(&mut core, sender, receiver, gids[0], now());
    // SAFETY: the range is the first MSG bytes of `mem`, registered under
    // `lkey` and alive (held by `mem` and the engine) for the whole run.
    let sge = unsafe { Sge::from_raw(mem.addr(), MSG, lkey) };
    let sgl = [sge];
    let mut wc = [WorkCompletion::default(); 16];
    let pump = |core: &mut Core, t: u64| {
        while let Some(tx) = core.poll_transmit() {
            let d = Datagram {
                src: tx.src,
                dst: tx.dst,
                src_port: tx.src_port,
                dst_port: tx.dst_port,
                data: &tx.data,
                train: None,
            };
            core.handle_datagram(t, d);
        }
    };
    let poll = |core: &mut Core, cq: CqId, wc: &mut [WorkCompletion]| core.poll_cq(cq, wc).unwrap();
    let (mut msgs, mut id) = (0u64, 0u64);
    let start = Instant::now();
    let cpu = thread_cpu();
    loop {
        for _ in 0..batch {
            core.post_recv(receiver, &[RecvWr::new(id, &sgl)]).unwrap();
            id += 1;
        }
        for i in 0..batch {
            let t = now();
            let wr = SendWr::new(id + i as u64, SendOp::Send, &sgl).flags(SendFlags::SIGNALED);
            core.post_send(t, sender, &[wr]).unwrap();
            pump(&mut core, t);
        }
        let (mut s, mut r) = (0, 0);
        while s < batch || r < batch {
            pump(&mut core, now());
            s += poll(&mut core, scq, &mut wc);
            r += poll(&mut core, rcq, &mut wc);
        }
        msgs += batch as u64;
        if msgs % 64 < batch as u64 && start.elapsed() >= window {
            return (thread_cpu() - cpu).as_nanos() as f64 / msgs as f64;
        }
    }
}

fn raw_connect(core: &mut Core, a: u32, b: u32, gid: softverbs::verbs::Gid, now: u64) {
    use softverbs::verbs::{AccessFlags, AhAttr, Mtu, QpModify, QpState};
    for (qp, dest, rq, sq) in [(a, b, 0x200, 0x100), (b, a, 0x100, 0x200)] {
        let init = QpModify::new()
            .with_state(QpState::Init)
            .with_pkey_index(0)
            .with_port_num(1);
        let rtr = QpModify::new().with_state(QpState::Rtr).with_path_mtu(Mtu::Mtu1024);
        let rtr = rtr
            .with_dest_qp_num(dest)
            .with_rq_psn(rq)
            .with_ah_attr(AhAttr::roce(gid, 0, 1));
        let rts = QpModify::new()
            .with_state(QpState::Rts)
            .with_sq_psn(sq)
            .with_timeout(14);
        for m in [
            init.with_access_flags(AccessFlags::empty()),
            rtr.with_max_dest_rd_atomic(1).with_min_rnr_timer(1),
            rts.with_retry_cnt(7).with_rnr_retry(7).with_max_rd_atomic(1),
        ] {
            core.modify_qp(now, qp, &m.attr, m.mask).unwrap();
        }
    }
}

/// CPU ns per enter+exit of the gate, on `threads` threads sharing one gate.
fn gate_ns(threads: usize, iters: u64) -> f64 {
    let gate = Arc::new(RemovalGate::new());
    per_op_ns(threads, iters, move || {
        let g = gate.clone();
        move || {
            let guard = g.enter();
            black_box(&guard);
        }
    })
}

/// CPU ns per increment+decrement of one shared counter (an `Arc`-style
/// reference count taken per call), on `threads` threads.
fn refcount_ns(threads: usize, iters: u64) -> f64 {
    let count = Arc::new(AtomicUsize::new(1));
    per_op_ns(threads, iters, move || {
        let c = count.clone();
        move || {
            c.fetch_add(1, Ordering::Acquire);
            black_box(&c);
            c.fetch_sub(1, Ordering::Release);
        }
    })
}

fn per_op_ns<M, F>(threads: usize, iters: u64, make: M) -> f64
where
    M: Fn() -> F,
    F: FnMut() + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let mut op = make();
            let b = barrier.clone();
            thread::spawn(move || {
                b.wait();
                let t = thread_cpu();
                for _ in 0..iters {
                    op();
                }
                (thread_cpu() - t).as_nanos() as f64 / iters as f64
            })
        })
        .collect();
    let v: Vec<f64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    v.iter().sum::<f64>() / v.len() as f64
}

fn device(sub: &Subsystem, name: &str, addr: &str) -> DeviceRef {
    let cfg = SoftDeviceConfig {
        link: Some(InprocFabric::new()),
        ..SoftDeviceConfig::new(name, addr.parse::<IpAddr>().unwrap())
    };
    sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
    sub.device(name).unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let window = Duration::from_millis(arg("--window-ms", 20));
    let pairs = arg("--pairs", 41) as usize;
    let json = args.iter().any(|a| a == "--json");

    let sub = Subsystem::new(SubsystemConfig::default());
    let d0 = device(&sub, "guard_cost0", "10.98.0.1");
    let d1 = device(&sub, "guard_cost1", "10.98.0.2");
    let (r0, r1, r2) = (rig(&d0), rig(&d1), rig(&d0));
    let pg = |r: &Arc<Rig>| (Arc::new(Plain(r.clone())), Arc::new(Gated(r.clone())));
    let one = [pg(&r0)];
    let two_devices = [pg(&r0), pg(&r1)];
    let one_device = [pg(&r0), pg(&r2)];
    let rmw = [(Arc::new(Plain(r0.clone())), Arc::new(RmwGated(r0.clone())))];
    let mut rows = Vec::new();
    for batch in [1, 16] {
        rows.push(compare("1 thread, locked-RMW gate", &rmw, batch, window, pairs));
        rows.push(compare("1 thread", &one, batch, window, pairs));
        rows.push(compare("2 threads, 2 devices", &two_devices, batch, window, pairs));
        rows.push(compare("2 threads, 1 device", &one_device, batch, window, pairs));
    }
    let raw: Vec<f64> = [1, 16].iter().map(|&b| raw_core(b, window * 20)).collect();
    let iters = 20_000_000;
    let micro = [
        ("gate enter+exit, 1 thread", gate_ns(1, iters)),
        ("gate enter+exit, 2 threads, one gate", gate_ns(2, iters)),
        ("shared refcount inc+dec, 1 thread", refcount_ns(1, iters)),
        ("shared refcount inc+dec, 2 threads, one count", refcount_ns(2, iters)),
    ];

    if json {
        let rows_json: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"case\":\"{}\",\"plain_mmsg_s\":{:.4},\"guarded_mmsg_s\":{:.4},\"plain_cpu_ns_per_msg\":{:.1},\"guarded_cpu_ns_per_msg\":{:.1},\"overhead_pct\":{:.2},\"overhead_iqr_pct\":[{:.2},{:.2}]}}",
                    r.case, r.plain_rate, r.gated_rate, r.plain_ns, r.gated_ns, r.overhead, r.iqr.0, r.iqr.1
                )
            })
            .collect();
        let micro_json: Vec<String> = micro
            .iter()
            .map(|(n, v)| format!("{{\"what\":\"{n}\",\"ns\":{v:.2}}}"))
            .collect();
        println!(
            "{{\"gate_expedited\":{},\"window_ms\":{},\"pairs\":{pairs},\"loops\":[{}],\"raw_core_cpu_ns_per_msg\":{{\"batch1\":{:.1},\"batch16\":{:.1}}},\"micro\":[{}]}}",
            RemovalGate::new().is_expedited(),
            window.as_millis(),
            rows_json.join(","),
            raw[0],
            raw[1],
            micro_json.join(",")
        );
        return;
    }
    println!(
        "removal gate: {} fast path",
        if RemovalGate::new().is_expedited() {
            "fence-free (membarrier)"
        } else {
            "full-fence (no membarrier)"
        }
    );
    println!(
        "post_send + poll_cq on an RC loop of a soft device: plain handles vs guarded handles (removal gate)\n\
         {pairs} interleaved pairs of {} ms slices; cost = thread CPU time per message; medians",
        window.as_millis()
    );
    println!(
        "{:<32} {:>9} {:>9} {:>10} {:>10} {:>9} {:>17}",
        "case", "plain", "gated", "plain", "gated", "overhead", "overhead IQR"
    );
    println!(
        "{:<32} {:>9} {:>9} {:>10} {:>10} {:>9} {:>17}",
        "", "Mmsg/s", "Mmsg/s", "ns/msg", "ns/msg", "(CPU)", ""
    );
    for r in &rows {
        println!(
            "{:<32} {:>9.4} {:>9.4} {:>10.0} {:>10.0} {:>8.2}% {:>7.2}% .. {:>5.2}%",
            r.case, r.plain_rate, r.gated_rate, r.plain_ns, r.gated_ns, r.overhead, r.iqr.0, r.iqr.1
        );
    }
    println!(
        "raw core (sans-IO engine, no handles, no lock, no driver), 1 thread: {:.0} ns/msg (batch 1), {:.0} ns/msg (batch 16)",
        raw[0], raw[1]
    );
    println!();
    for (n, v) in &micro {
        println!("{n:<48} {v:>8.2} ns");
    }
    println!(
        "\nbatch 1 makes 4 gated calls per message: {:.1} ns of {:.0} ns = {:.2}% by the micro figure",
        4.0 * micro[0].1,
        rows[0].plain_ns,
        4.0 * micro[0].1 / rows[0].plain_ns * 100.0
    );
}
