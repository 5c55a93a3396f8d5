//! Hotplug stress that looks like real use: two soft devices, RC traffic in
//! both directions from several threads (each thread one QP on each device,
//! connected to each other), selective signaling (most sends unsignaled,
//! posted in chains), SEND and RDMA WRITE with immediate data, every engine
//! mode, over the in-process, UDP and shared-memory links, and devices that
//! go away at random times: removed, or moved to another namespace through
//! the virtual namespace driver (and, after the move, traffic on the new
//! instances until a second removal or namespace deletion takes them). A
//! second test does the same with UDP devices on a veth pair moved between
//! real network namespaces by the Linux driver (root only; it prints a
//! `SKIP:` line otherwise).
//!
//! For every queue the test keeps a ledger and checks the verbs contract:
//!
//! - each work request completes exactly once (a duplicate or an unknown
//!   completion is a violation; at the end nothing is outstanding);
//! - in order: on a send queue a signaled success retires the unsignaled
//!   requests posted before it, an error completion may only be preceded by
//!   unsignaled requests that succeeded, and once one completion is an
//!   error every later one is a flush, in post order; a receive queue
//!   completes strictly in post order;
//! - with an allowed status: success, and only once a removal began,
//!   WR_FLUSH_ERR (or, for the first error of a send queue, transport retry
//!   exceeded, when the peer went away long before);
//! - against the other side: the receives that succeeded carry, in their
//!   immediate data, exactly the first N requests of the peer's send queue
//!   in order (RC delivers a prefix), and every send that succeeded —
//!   explicitly or silently as an unsignaled request retired by a later
//!   completion — is in that prefix. So a flush completion that goes
//!   missing is caught even for an unsignaled request: it is taken for a
//!   silent success, and it was never delivered.
//! - after removal a post still completes once (a flush), and destroying
//!   every object succeeds; the removal reports no straggler, because every
//!   thread let go of its objects when it saw its device go; at the end no
//!   progress thread of a removed device is left.
//!
//! (The ledger of `softverbs_emulator::netns::traffic` assumes every request
//! is signaled; selective signaling needs the one here, which also takes
//! the peer's deliveries as evidence.)
//!
//! Each round picks its link, engine and removal kind in turn (so a few
//! rounds cover every combination) and its thread count, signaling rates,
//! chains and removal delays from a seeded RNG. The seed is printed at the
//! start and in every failure; `SOFTVERBS_STRESS_SEED=<seed>` replays the
//! same choices (thread interleavings are the machine's),
//! `SOFTVERBS_STRESS_ROUNDS=<n>` runs more rounds (default 96, a few
//! seconds; hundreds on demand).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::shm::{ShmLink, ShmMode};
use softverbs::soft::link::udp::{UdpConfig, UdpLink, UdpPort};
use softverbs::soft::link::Link;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{DeviceRef, DeviceState, NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use softverbs::verbs::{
    AccessFlags, Context, Cq, EventType, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RecvWr, RemoteAddr, SendFlags, SendOp,
    SendWr, Sge, WorkCompletion,
};
use softverbs_emulator::netns::traffic::{connect_rc, first_gid};
use softverbs_emulator::netns::{NetnsDriver, VirtualNetns};

#[path = "hotplug_stress/ledger.rs"]
mod ledger;
use ledger::{RqLedger, SqLedger, Tally};

/// Anything longer means a hang, not a slow machine.
const HANG: Duration = Duration::from_secs(20);
/// Rounds when `SOFTVERBS_STRESS_ROUNDS` is not set: eight per combination.
const DEFAULT_ROUNDS: usize = 96;
/// Send queue depth (the window of requests not yet retired).
const SQ_DEPTH: u32 = 16;
/// Receive queue depth.
const RQ_DEPTH: u32 = 32;
/// Bytes per message.
const MSG: u32 = 8;
/// Receive completions have this bit set in their `wr_id`.
const RECV_BIT: u64 = 1 << 63;
/// Removal delays are drawn from 0 to this many microseconds after the
/// traffic starts.
const MAX_DELAY_US: u64 = 25_000;

/// SplitMix64: small, seedable, good enough to pick delays and patterns.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkKind {
    Inproc,
    Udp,
    Shm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RemovalKind {
    /// Both devices are removed (`remove_device`), each at its own time.
    Unplug,
    /// Both devices' interfaces move to another namespace (the devices are
    /// unplugged and replugged there), each at its own time; then traffic
    /// on the new instances until the namespace is deleted (both move
    /// back) or both are removed.
    NetnsMove,
}

#[derive(Debug, Clone, Copy)]
struct Cell {
    link: LinkKind,
    engine: EngineMode,
    removal: RemovalKind,
}

fn cells() -> Vec<Cell> {
    let engines = [
        EngineMode::Inline,
        EngineMode::ProgressThread { spin: Duration::ZERO },
        EngineMode::progress_thread(),
    ];
    let mut v = Vec::new();
    for engine in engines {
        for link in [LinkKind::Inproc, LinkKind::Udp, LinkKind::Shm] {
            v.push(Cell {
                link,
                engine,
                removal: RemovalKind::Unplug,
            });
        }
        // The virtual namespace driver gives each namespace its own
        // in-process network.
        v.push(Cell {
            link: LinkKind::Inproc,
            engine,
            removal: RemovalKind::NetnsMove,
        });
    }
    v
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

/// A unique device name (the soft provider's device list is per process).
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}_{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits (a bounded time) until this process has no progress thread left
/// of a device whose name starts with `prefix` (threads are named
/// `softverbs-<device>`, cut to 15 bytes by the kernel); returns how many
/// are left. Every device of a test is gone by its end, so none may be.
fn progress_threads_left(prefix: &str) -> usize {
    let want = format!("softverbs-{prefix}");
    let count = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.filter_map(|t| t.ok())
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .filter(|c| c.starts_with(&want))
                    .count()
            })
            .unwrap_or(0)
    };
    let t0 = Instant::now();
    while count() > 0 && t0.elapsed() < HANG {
        thread::sleep(Duration::from_millis(10));
    }
    count()
}

// ---------------------------------------------------------------------------
// One QP of a thread on one device.

fn send_slot(seq: u64) -> u64 {
    (seq % u64::from(SQ_DEPTH)) * u64::from(MSG)
}

fn recv_slot(seq: u64) -> u64 {
    (u64::from(SQ_DEPTH) + seq % u64::from(RQ_DEPTH)) * u64::from(MSG)
}

fn write_slot(seq: u64) -> u64 {
    u64::from(SQ_DEPTH + RQ_DEPTH) * u64::from(MSG) + send_slot(seq)
}

const MR_LEN: usize = ((2 * SQ_DEPTH + RQ_DEPTH) * MSG) as usize;

struct Objects {
    // Destroyed explicitly, in this order.
    qp: Qp,
    cq: Cq,
    mr: Mr,
    pd: Pd,
    ctx: Context,
}

/// One side of a thread's connection.
struct End {
    dev: DeviceRef,
    label: String,
    objs: Option<Objects>,
    qpn: u32,
    /// Where the peer's WRITE_WITH_IMMs may land.
    peer: RemoteAddr,
    sq: SqLedger,
    rq: RqLedger,
    /// Sends are signaled one time in `signal_every` (and always when the
    /// window fills).
    signal_every: u64,
    /// The first PSN of this end's sends.
    psn: u32,
    wc: Vec<WorkCompletion>,
}

impl End {
    fn new(dev: &DeviceRef, label: String, rng: &mut Rng) -> Result<End, String> {
        let e = |what: &str, err: &dyn std::fmt::Display| format!("{label}: {what}: {err}");
        let ctx = dev.open(&label).map_err(|x| e("open", &x))?;
        let pd = ctx.alloc_pd().map_err(|x| e("alloc_pd", &x))?;
        let mr = pd
            .alloc_mr(MR_LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .map_err(|x| e("alloc_mr", &x))?;
        let cq = ctx
            .create_cq(2 * (SQ_DEPTH + RQ_DEPTH), 0, None, 0)
            .map_err(|x| e("create_cq", &x))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: SQ_DEPTH,
                    max_recv_wr: RQ_DEPTH,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            })
            .map_err(|x| e("create_qp", &x))?;
        let qpn = qp.qp_num();
        Ok(End {
            dev: dev.clone(),
            label,
            objs: Some(Objects { qp, cq, mr, pd, ctx }),
            qpn,
            peer: RemoteAddr { addr: 0, rkey: 0 },
            sq: SqLedger::default(),
            rq: RqLedger::default(),
            signal_every: [1, 2, 4, 8, 16][rng.below(5) as usize],
            psn: rng.below(1 << 24) as u32,
            wc: vec![WorkCompletion::default(); 16],
        })
    }

    fn objs(&self) -> &Objects {
        self.objs.as_ref().expect("objects live until close")
    }

    /// Connects this end's QP to `peer`'s.
    fn connect(&mut self, peer: &End) -> Result<(), String> {
        let gid = first_gid(&peer.objs().ctx).map_err(|e| format!("{}: peer gid: {e}", self.label))?;
        let pm = &peer.objs().mr;
        self.peer = RemoteAddr {
            addr: pm.addr(),
            rkey: pm.rkey(),
        };
        // Random first PSNs, as applications pick them: a late packet of an
        // earlier connection to the same address and QP number (a device
        // of an earlier round, on the same interface) then falls outside
        // the window instead of landing in it.
        connect_rc(&self.objs().qp, gid, peer.qpn, peer.psn, self.psn)
            .map_err(|e| format!("{}: connect: {e}", self.label))
    }

    fn live(&self) -> bool {
        self.dev.state() == DeviceState::Live
    }

    /// Keeps the receive queue full.
    fn post_recvs(&mut self) -> Result<(), String> {
        let objs = self.objs.as_ref().expect("live");
        while self.rq.outstanding.len() < RQ_DEPTH as usize {
            let seq = self.rq.next;
            let sge = [objs.mr.sge(recv_slot(seq), MSG).map_err(|e| e.to_string())?];
            match objs.qp.post_recv(&[RecvWr::new(seq | RECV_BIT, &sge)]) {
                Ok(()) => {
                    self.rq.next += 1;
                    self.rq.posted += 1;
                    self.rq.outstanding.push_back(seq);
                }
                // The device is going: stop posting; `close` takes over.
                Err(_) if !self.live() => return Ok(()),
                Err(e) => return Err(format!("{}: post_recv {seq}: {e}", self.label)),
            }
        }
        Ok(())
    }

    /// Posts a chain of 1 to 4 sends (as the window allows): SEND or
    /// RDMA WRITE with the sequence number as immediate data, some inline,
    /// most unsignaled.
    fn post_sends(&mut self, rng: &mut Rng) -> Result<(), String> {
        let room = SQ_DEPTH as usize - self.sq.outstanding.len();
        if room == 0 {
            return Ok(());
        }
        let n = (1 + rng.below(4) as usize).min(room);
        let objs = self.objs.as_ref().expect("live");
        let first = self.sq.next;
        let payloads: Vec<[u8; 8]> = (0..n as u64).map(|i| (first + i).to_le_bytes()).collect();
        let mut plan = Vec::with_capacity(n);
        for (i, p) in payloads.iter().enumerate() {
            let seq = first + i as u64;
            let window_full = self.sq.outstanding.len() + i + 1 == SQ_DEPTH as usize;
            let signaled = window_full || rng.below(self.signal_every) == 0;
            let inline = rng.below(4) == 0;
            let write = rng.below(3) == 0;
            if !inline {
                objs.mr.write(send_slot(seq), p).map_err(|e| e.to_string())?;
            }
            plan.push((seq, signaled, inline, write));
        }
        let sgls: Vec<[Sge<'_>; 1]> = plan
            .iter()
            .zip(&payloads)
            .map(|(&(seq, _, inline, _), p)| {
                Ok([if inline {
                    Sge::inline(p)
                } else {
                    objs.mr.sge(send_slot(seq), MSG).map_err(|e| e.to_string())?
                }])
            })
            .collect::<Result<_, String>>()?;
        let wrs: Vec<SendWr<'_>> = plan
            .iter()
            .zip(&sgls)
            .map(|(&(seq, signaled, inline, write), sgl)| {
                let imm = seq as u32;
                let op = if write {
                    SendOp::WriteWithImm {
                        remote: RemoteAddr {
                            addr: self.peer.addr + write_slot(seq),
                            rkey: self.peer.rkey,
                        },
                        imm,
                    }
                } else {
                    SendOp::SendWithImm { imm }
                };
                let mut flags = SendFlags::empty();
                if signaled {
                    flags |= SendFlags::SIGNALED;
                }
                if inline {
                    flags |= SendFlags::INLINE;
                }
                SendWr::new(seq, op, sgl).flags(flags)
            })
            .collect();
        let accepted = match objs.qp.post_send(&wrs) {
            Ok(()) => n,
            Err(e) if !self.live() => e.index,
            Err(e) => return Err(format!("{}: post_send of {n} from {first}: {e}", self.label)),
        };
        for &(seq, signaled, _, _) in &plan[..accepted] {
            self.sq.outstanding.push_back((seq, signaled));
        }
        self.sq.next += accepted as u64;
        self.sq.posted += accepted as u64;
        Ok(())
    }

    /// Polls the CQ until it is empty; returns how many it took.
    /// `removing` is read after the CQ answered: a flush polled now was
    /// made by a revoke that began after the flag was set.
    fn poll(&mut self, removing: &AtomicBool) -> Result<usize, String> {
        let objs = self.objs.as_ref().expect("live");
        let mut total = 0;
        loop {
            let n = objs
                .cq
                .poll(&mut self.wc)
                .map_err(|e| format!("{}: poll: {e}", self.label))?;
            let removing = removing.load(Ordering::SeqCst);
            for wc in &self.wc[..n] {
                if wc.qp_num != self.qpn {
                    return Err(format!(
                        "{}: completion of QP {:#x} on our CQ: {wc:?}",
                        self.label, wc.qp_num
                    ));
                }
                let r = if wc.wr_id & RECV_BIT != 0 {
                    self.rq.complete(wc, removing, &objs.mr)
                } else {
                    self.sq.complete(wc, removing)
                };
                if let Err(e) = r {
                    // What the device said about it, for the report.
                    let mut events = Vec::new();
                    while let Ok(Some(ev)) = objs.ctx.get_async_event(Some(Duration::ZERO)) {
                        events.push(format!("{:?} on {:?}", ev.event_type, ev.element));
                    }
                    let counters = self.dev.soft_device().map(|d| format!("{:?}", d.shared().counters()));
                    return Err(format!(
                        "{}: {e}\n  async events: {events:?}\n  device counters: {}",
                        self.label,
                        counters.unwrap_or_default()
                    ));
                }
            }
            total += n;
            if n < self.wc.len() {
                return Ok(total);
            }
        }
    }

    /// The device is going or gone: post once more on each queue (which
    /// must complete, with a flush, once the device is revoked), poll until
    /// nothing is outstanding, and destroy every object (which must
    /// succeed).
    fn close(&mut self, removing: &AtomicBool) -> Result<(), String> {
        // As an application would: keep polling until DEVICE_FATAL (the
        // last async event of a removal, after the revoke), then clean up.
        let t0 = Instant::now();
        loop {
            self.poll(removing)?;
            let ev = self
                .objs()
                .ctx
                .get_async_event(Some(Duration::from_millis(1)))
                .map_err(|e| format!("{}: get_async_event: {e}", self.label))?;
            if ev.is_some_and(|e| e.event_type == EventType::DeviceFatal) {
                break;
            }
            if t0.elapsed() > HANG {
                return Err(format!("{}: no DEVICE_FATAL after the device left Live", self.label));
            }
        }
        let objs = self.objs.as_ref().expect("closed once");
        let seq = self.sq.next;
        let sge = [objs.mr.sge(send_slot(seq), MSG).map_err(|e| e.to_string())?];
        let wr = SendWr::new(seq, SendOp::SendWithImm { imm: seq as u32 }, &sge).flags(SendFlags::SIGNALED);
        objs.qp
            .post_send(&[wr])
            .map_err(|e| format!("{}: post_send after removal: {e}", self.label))?;
        self.sq.outstanding.push_back((seq, true));
        self.sq.next += 1;
        self.sq.posted += 1;
        let rseq = self.rq.next;
        let sge = [objs.mr.sge(recv_slot(rseq), MSG).map_err(|e| e.to_string())?];
        objs.qp
            .post_recv(&[RecvWr::new(rseq | RECV_BIT, &sge)])
            .map_err(|e| format!("{}: post_recv after removal: {e}", self.label))?;
        self.rq.outstanding.push_back(rseq);
        self.rq.next += 1;
        self.rq.posted += 1;
        let t0 = Instant::now();
        while !self.sq.outstanding.is_empty() || !self.rq.outstanding.is_empty() {
            if self.poll(removing)? == 0 {
                if t0.elapsed() > HANG {
                    return Err(format!(
                        "{}: after removal, {} send and {} receive WR(s) never completed (first {:?} / {:?})",
                        self.label,
                        self.sq.outstanding.len(),
                        self.rq.outstanding.len(),
                        self.sq.outstanding.front(),
                        self.rq.outstanding.front()
                    ));
                }
                thread::yield_now();
            }
        }
        if !self.sq.errored || !self.rq.errored {
            return Err(format!("{}: the post after removal did not end in a flush", self.label));
        }
        // Nothing more may arrive.
        if self.poll(removing)? != 0 {
            return Err(format!("{}: completions after the queues were settled", self.label));
        }
        let Objects { qp, cq, mr, pd, ctx } = self.objs.take().expect("checked");
        let label = &self.label;
        let d = |what: &str, e: &dyn std::fmt::Display| format!("{label}: destroy {what} after removal: {e}");
        qp.destroy().map_err(|e| d("qp", &e))?;
        cq.destroy().map_err(|e| d("cq", &e))?;
        mr.destroy().map_err(|e| d("mr", &e))?;
        pd.destroy().map_err(|e| d("pd", &e))?;
        drop(ctx);
        Ok(())
    }

    fn tally(&self) -> Tally {
        Tally {
            posted: self.sq.posted + self.rq.posted,
            completions: self.sq.completions + self.rq.completions,
            flushed: self.sq.flushed + self.rq.flushed,
            silent: self.sq.silent,
            delivered: self.rq.delivered,
        }
    }
}

/// Every send that succeeded at `from` was delivered at `to`.
fn check_delivered(from: &End, to: &End) -> Result<(), String> {
    match from.sq.max_success {
        Some(s) if s >= to.rq.delivered => Err(format!(
            "{}: send {s} succeeded (explicitly or silently) but {} received only {} message(s)",
            from.label, to.label, to.rq.delivered
        )),
        _ => Ok(()),
    }
}

/// One traffic thread: a QP on each device, connected to each other,
/// traffic both ways until both devices went; each side closes as soon as
/// its device goes.
fn traffic(
    mut ends: [End; 2],
    mut rng: Rng,
    start: &Barrier,
    removing: &AtomicBool,
    failed: &AtomicBool,
) -> Result<Tally, String> {
    start.wait();
    let t0 = Instant::now();
    loop {
        let mut open = 0;
        for e in ends.iter_mut() {
            if e.objs.is_none() {
                continue;
            }
            if e.live() {
                open += 1;
                e.post_recvs()?;
                e.post_sends(&mut rng)?;
                e.poll(removing)?;
            } else {
                e.close(removing)?;
            }
        }
        if open == 0 && ends.iter().all(|e| e.objs.is_none()) {
            break;
        }
        if failed.load(Ordering::SeqCst) {
            // A removal or move failed: the device stays; stop here.
            return Err("stopped: a removal failed".into());
        }
        if t0.elapsed() > HANG {
            return Err("the devices never went away".into());
        }
    }
    let [a, b] = &ends;
    check_delivered(a, b)?;
    check_delivered(b, a)?;
    let mut t = a.tally();
    t += b.tally();
    Ok(t)
}

// ---------------------------------------------------------------------------
// Rounds.

/// What happens to the devices in one traffic phase.
type Action = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// Runs a traffic phase on the current instances of devices `a` and `b`:
/// 1 to 3 threads, each with a QP on each device; `actions` run on their
/// own threads, each after a random delay (a flag tells the ledgers that a
/// removal began just before the first one starts).
fn phase(sub: &Subsystem, a: &str, b: &str, actions: Vec<Action>, rng: &mut Rng) -> Result<Tally, String> {
    let (da, db) = (
        sub.device(a).map_err(|e| e.to_string())?,
        sub.device(b).map_err(|e| e.to_string())?,
    );
    let threads = 1 + rng.below(3) as usize;
    let start = Arc::new(Barrier::new(threads + actions.len()));
    let removing = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicBool::new(false));
    // Every thread's objects exist before anything starts.
    let mut pairs = Vec::new();
    for t in 0..threads {
        let mut ea = End::new(&da, format!("t{t}@{a}"), rng)?;
        let mut eb = End::new(&db, format!("t{t}@{b}"), rng)?;
        ea.connect(&eb)?;
        eb.connect(&ea)?;
        pairs.push([ea, eb]);
    }
    let workers: Vec<_> = pairs
        .into_iter()
        .map(|ends| {
            let (trng, start, removing, failed) = (rng.fork(), start.clone(), removing.clone(), failed.clone());
            thread::spawn(move || traffic(ends, trng, &start, &removing, &failed))
        })
        .collect();
    let removers: Vec<_> = actions
        .into_iter()
        .map(|act| {
            let delay = Duration::from_micros(rng.below(MAX_DELAY_US));
            let (start, removing, failed) = (start.clone(), removing.clone(), failed.clone());
            thread::spawn(move || {
                start.wait();
                thread::sleep(delay);
                removing.store(true, Ordering::SeqCst);
                let r = act();
                if r.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
                r
            })
        })
        .collect();
    let mut errors = Vec::new();
    let mut tally = Tally::default();
    for w in workers {
        match w.join() {
            Ok(Ok(t)) => tally += t,
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a traffic thread panicked".into()),
        }
    }
    for r in removers {
        match r.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a removal thread panicked".into()),
        }
    }
    for d in [&da, &db] {
        if d.state() != DeviceState::Dead {
            errors.push(format!("{} is {:?} after its removal", d.name(), d.state()));
        }
    }
    if errors.is_empty() {
        Ok(tally)
    } else {
        Err(errors.join("\n"))
    }
}

/// Removes a device; its consumers (the traffic threads) let go on their
/// own, so nobody may be left behind.
fn remove(sub: &Arc<Subsystem>, name: &str) -> Action {
    let (sub, name) = (sub.clone(), name.to_string());
    Box::new(move || {
        let report = sub.remove_device(&name).map_err(|e| format!("remove {name}: {e}"))?;
        if report.stragglers.is_empty() {
            Ok(())
        } else {
            Err(format!("removing {name}: {report}"))
        }
    })
}

/// A soft device's configuration on `link`.
fn config(
    link: LinkKind,
    engine: EngineMode,
    fabric: &Arc<InprocFabric>,
    rng: &mut Rng,
) -> Result<SoftDeviceConfig, String> {
    let name = unique("hs");
    let cfg = match link {
        LinkKind::Inproc => {
            static HOST: AtomicU32 = AtomicU32::new(1);
            let h = HOST.fetch_add(1, Ordering::Relaxed);
            let addr = IpAddr::V4(Ipv4Addr::new(10, 64, (h >> 8) as u8, h as u8));
            SoftDeviceConfig {
                link: Some(fabric.clone() as Arc<dyn Link>),
                ..SoftDeviceConfig::new(&name, addr)
            }
        }
        LinkKind::Udp | LinkKind::Shm => {
            let udp = bind_udp()?;
            let addrs = udp.gids().iter().map(|g| g.to_ip()).collect();
            let link: Arc<dyn Link> = if link == LinkKind::Shm {
                let mode = if rng.below(2) == 0 {
                    ShmMode::Only
                } else {
                    ShmMode::Auto
                };
                ShmLink::new(udp, mode).map_err(|e| format!("shm link: {e}"))?
            } else {
                udp
            };
            SoftDeviceConfig {
                addrs,
                link: Some(link),
                ..SoftDeviceConfig::new(&name, IpAddr::V4(Ipv4Addr::LOCALHOST))
            }
        }
    };
    Ok(SoftDeviceConfig { engine, ..cfg })
}

/// A UDP link on loopback at a private port (never 4791, which other tests
/// and programs on this host may want).
fn bind_udp() -> Result<Arc<UdpLink>, String> {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    for _ in 0..100 {
        let s = std::net::UdpSocket::bind((lo, 0)).map_err(|e| e.to_string())?;
        let port = s.local_addr().map_err(|e| e.to_string())?.port();
        if !(0x8000..0xc000).contains(&port) {
            continue;
        }
        drop(s);
        let mut cfg = UdpConfig::new(lo);
        cfg.port = UdpPort::Fixed(port);
        match UdpLink::bind(&cfg) {
            Ok(l) => return Ok(l),
            // Taken between the probe and the bind: try another.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(format!("bind UDP {port}: {e}")),
        }
    }
    Err("no free private UDP port on loopback".into())
}

fn unplug_round(sub: &Arc<Subsystem>, cell: Cell, rng: &mut Rng) -> Result<Tally, String> {
    let fabric = InprocFabric::new();
    let names: Vec<String> = (0..2)
        .map(|_| {
            let cfg = config(cell.link, cell.engine, &fabric, rng)?;
            let name = cfg.name.clone();
            sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT)
                .map_err(|e| format!("add {name}: {e}"))?;
            Ok(name)
        })
        .collect::<Result<_, String>>()?;
    let actions = vec![remove(sub, &names[0]), remove(sub, &names[1])];
    phase(sub, &names[0], &names[1], actions, rng)
}

fn move_round(cell: Cell, rng: &mut Rng) -> Result<Tally, String> {
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: HANG,
        ..SubsystemConfig::default()
    }));
    let drv = Arc::new(VirtualNetns::with_engine(sub.clone(), cell.engine));
    let e = |x: softverbs::subsystem::Error| x.to_string();
    let (a, b) = (unique("hsm"), unique("hsm"));
    drv.add_link("ifa", "10.65.0.1".parse().unwrap()).map_err(e)?;
    drv.add_link("ifb", "10.65.0.2".parse().unwrap()).map_err(e)?;
    drv.add_device(&a, "ifa").map_err(e)?;
    drv.add_device(&b, "ifb").map_err(e)?;
    drv.add_netns("blue").map_err(e)?;
    // Phase 1: each interface moves to `blue`, at its own time; in between
    // the two devices are in different namespaces (different networks).
    let mv = |ifname: &'static str| -> Action {
        let drv = drv.clone();
        Box::new(move || {
            drv.link_set_netns(ifname, "blue")
                .map_err(|e| format!("move {ifname}: {e}"))
        })
    };
    let mut tally = phase(&sub, &a, &b, vec![mv("ifa"), mv("ifb")], rng).map_err(|e| format!("phase 1: {e}"))?;
    let blue = drv.netns("blue").expect("created");
    for d in [&a, &b] {
        let ns = sub.device(d).map_err(e)?.namespace();
        if ns != blue {
            return Err(format!("{d} is in {ns} after its interface moved to blue"));
        }
    }
    // Phase 2: traffic on the new instances in `blue`, until the namespace
    // is deleted (both move back) or each is removed at its own time.
    let del_ns = rng.below(2) == 0;
    let actions: Vec<Action> = if del_ns {
        let drv = drv.clone();
        vec![Box::new(move || {
            drv.del_netns("blue").map_err(|e| format!("del_netns blue: {e}"))
        })]
    } else {
        vec![remove(&sub, &a), remove(&sub, &b)]
    };
    tally += phase(&sub, &a, &b, actions, rng).map_err(|e| format!("phase 2: {e}"))?;
    // After the namespace's deletion both devices are back home; after
    // their removal, neither is left.
    for d in [&a, &b] {
        match (del_ns, sub.device(d)) {
            (true, Ok(dev)) if dev.namespace() == NamespaceId::INIT && dev.state() == DeviceState::Live => {
                drv.del_device(d).map_err(e)?;
            }
            (true, Ok(dev)) => {
                return Err(format!(
                    "{d} is {:?} in {} after blue was deleted",
                    dev.state(),
                    dev.namespace()
                ))
            }
            (true, Err(x)) => return Err(format!("{d} did not come back when blue was deleted: {x}")),
            (false, Ok(dev)) => return Err(format!("{d} is still there ({:?}) after its removal", dev.state())),
            (false, Err(_)) => {}
        }
    }
    Ok(tally)
}

#[test]
fn every_wr_completes_once_in_order_across_randomized_hotplug() {
    let rounds = env_u64("SOFTVERBS_STRESS_ROUNDS").map_or(DEFAULT_ROUNDS, |n| n as usize);
    let seed = env_u64("SOFTVERBS_STRESS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    eprintln!("hotplug stress: {rounds} round(s), seed {seed} (replay: SOFTVERBS_STRESS_SEED={seed})");
    let sub = Arc::new(Subsystem::new(SubsystemConfig {
        removal_deadline: HANG,
        ..SubsystemConfig::default()
    }));
    let cells = cells();
    let mut rng = Rng(seed);
    let mut total = Tally::default();
    let mut per_cell = vec![Tally::default(); cells.len()];
    let t0 = Instant::now();
    for round in 0..rounds {
        let cell = cells[round % cells.len()];
        let mut rrng = rng.fork();
        let r = match cell.removal {
            RemovalKind::Unplug => unplug_round(&sub, cell, &mut rrng),
            RemovalKind::NetnsMove => move_round(cell, &mut rrng),
        };
        match r {
            Ok(t) => {
                total += t;
                per_cell[round % cells.len()] += t;
            }
            Err(e) => panic!(
                "round {round} ({:?} link, {:?} engine, {:?}) failed; replay with SOFTVERBS_STRESS_SEED={seed}:\n{e}",
                cell.link, cell.engine, cell.removal
            ),
        }
    }
    eprintln!(
        "hotplug stress: {rounds} round(s) in {:?}: {} WRs posted, {} completions ({} flushed), {} unsignaled \
         retired silently, {} messages delivered",
        t0.elapsed(),
        total.posted,
        total.completions,
        total.flushed,
        total.silent,
        total.delivered
    );
    for (c, t) in cells.iter().zip(&per_cell) {
        eprintln!(
            "  {:?} link, {:?} engine, {:?}: {} WRs posted, {} flushed, {} delivered",
            c.link, c.engine, c.removal, t.posted, t.flushed, t.delivered
        );
    }
    // Every device went, and so did its progress thread (devices here are
    // named hs…, those of the real-namespace test hl…).
    assert_eq!(
        progress_threads_left("hs"),
        0,
        "progress threads of removed devices remain"
    );
    // The rounds did what they are for: traffic flowed, and removals cut
    // into it.
    assert!(
        total.delivered > 0 && total.flushed > 0 && total.silent > 0,
        "{total:?}"
    );
}

// ---------------------------------------------------------------------------
// Real network namespaces: UDP devices on a veth pair, moved between
// namespaces with the Linux driver (needs root).

/// What one test made on the host, removed on every path.
#[cfg(target_os = "linux")]
struct HostCleanup {
    drv: Arc<softverbs_emulator::netns::LinuxNetns>,
    link: String,
    netns: Vec<String>,
}

#[cfg(target_os = "linux")]
impl Drop for HostCleanup {
    fn drop(&mut self) {
        // Deleting one veth end deletes both (and unplugs their devices);
        // namespaces last, once nothing of ours is in them.
        let _ = self.drv.del_link(&self.link);
        for n in &self.netns {
            let _ = self.drv.del_netns(n);
        }
    }
}

/// One round over real namespaces: devices on both veth ends, traffic, then
/// each device's interface moves to another namespace or the device is
/// removed, at its own time; where both moved, traffic again on the new
/// instances (across namespaces, over the veth) until each is moved or
/// removed once more; then the devices that are left are removed.
#[cfg(target_os = "linux")]
fn linux_round(
    drv: &Arc<softverbs_emulator::netns::LinuxNetns>,
    ifs: [&str; 2],
    netns: &[String],
    rng: &mut Rng,
) -> Result<Tally, String> {
    let sub = drv.subsystem().clone();
    let names = [unique("hl"), unique("hl")];
    for (n, i) in names.iter().zip(ifs) {
        drv.add_device(n, i).map_err(|e| format!("add {n} on {i}: {e}"))?;
    }
    let act = |dev: &str, ifname: &str, rng: &mut Rng| -> Action {
        let (drv, dev, ifname) = (drv.clone(), dev.to_string(), ifname.to_string());
        if rng.below(3) == 0 {
            return Box::new(move || {
                let r = drv.del_device(&dev).map_err(|e| format!("remove {dev}: {e}"))?;
                if r.stragglers.is_empty() {
                    Ok(())
                } else {
                    Err(format!("removing {dev}: {r}"))
                }
            });
        }
        // Another namespace than the one the interface is in now.
        let here = drv.link_netns(&ifname);
        let others: Vec<&String> = netns.iter().filter(|n| drv.netns(n) != here).collect();
        let to = others[rng.below(others.len() as u64) as usize].clone();
        Box::new(move || {
            drv.link_set_netns(&ifname, &to)
                .map_err(|e| format!("move {ifname} ({dev}) to {to}: {e}"))
        })
    };
    let mut tally = Tally::default();
    for phase_no in 1..=2 {
        if names.iter().any(|n| sub.device(n).is_err()) {
            break;
        }
        let actions = vec![act(&names[0], ifs[0], rng), act(&names[1], ifs[1], rng)];
        tally += phase(&sub, &names[0], &names[1], actions, rng).map_err(|e| format!("phase {phase_no}: {e}"))?;
    }
    for n in &names {
        if sub.device(n).is_ok() {
            drv.del_device(n).map_err(|e| format!("remove {n}: {e}"))?;
        }
    }
    Ok(tally)
}

#[cfg(target_os = "linux")]
#[test]
fn every_wr_completes_once_across_real_namespace_moves() {
    use softverbs_emulator::netns::LinuxNetns;

    if let Err(why) = LinuxNetns::check_privileges() {
        println!("SKIP: hotplug stress over real namespaces needs root ({why})");
        return;
    }
    // Each round builds UDP devices inside real namespaces: a quarter of
    // the rounds of the other test, at least two per engine mode.
    let rounds = env_u64("SOFTVERBS_STRESS_ROUNDS").map_or(6, |n| (n as usize).div_ceil(4).max(3));
    let seed = env_u64("SOFTVERBS_STRESS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    eprintln!(
        "hotplug stress over real namespaces: {rounds} round(s), seed {seed} (replay: SOFTVERBS_STRESS_SEED={seed})"
    );
    let engines = [
        EngineMode::Inline,
        EngineMode::ProgressThread { spin: Duration::ZERO },
        EngineMode::progress_thread(),
    ];
    let pid = std::process::id() % 100_000;
    // Not the same stream as the other test's for the same seed.
    let mut rng = Rng(seed ^ 0x006c_696e_7578);
    let mut total = Tally::default();
    let t0 = Instant::now();
    for (e, engine) in engines.into_iter().enumerate() {
        let sub = Arc::new(Subsystem::new(SubsystemConfig {
            removal_deadline: HANG,
            ..SubsystemConfig::default()
        }));
        let drv = Arc::new(LinuxNetns::with_engine(sub, engine).expect("linux namespace driver"));
        let (a, b) = (format!("hs{pid}{e}a"), format!("hs{pid}{e}b"));
        let netns: Vec<String> = (1..=2).map(|i| format!("hsn{pid}{e}{i}")).collect();
        let _cleanup = HostCleanup {
            drv: drv.clone(),
            link: a.clone(),
            netns: netns.clone(),
        };
        for n in &netns {
            drv.add_netns(n).unwrap_or_else(|e| panic!("add netns {n}: {e}"));
        }
        let third = (pid % 250) as u8 + 1;
        let (addr_a, addr_b) = (
            IpAddr::from([10, 66 + e as u8, third, 1]),
            IpAddr::from([10, 66 + e as u8, third, 2]),
        );
        drv.add_veth(&a, addr_a, &b, addr_b)
            .unwrap_or_else(|err| panic!("veth {a} <-> {b}: {err}"));
        let mut all = vec![softverbs_emulator::netns::INIT_NETNS.to_string()];
        all.extend(netns.iter().cloned());
        for round in (e..rounds).step_by(engines.len()) {
            let mut rrng = rng.fork();
            match linux_round(&drv, [&a, &b], &all, &mut rrng) {
                Ok(t) => total += t,
                Err(err) => panic!(
                    "round {round} ({engine:?} engine, UDP over veth, real namespaces) failed; replay with \
                     SOFTVERBS_STRESS_SEED={seed}:\n{err}"
                ),
            }
        }
    }
    eprintln!(
        "hotplug stress over real namespaces: {rounds} round(s) in {:?}: {} WRs posted, {} completions ({} \
         flushed), {} unsignaled retired silently, {} messages delivered",
        t0.elapsed(),
        total.posted,
        total.completions,
        total.flushed,
        total.silent,
        total.delivered
    );
    assert_eq!(
        progress_threads_left("hl"),
        0,
        "progress threads of removed devices remain"
    );
    assert!(total.delivered > 0 && total.flushed > 0, "{total:?}");
}
