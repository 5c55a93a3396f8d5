//! Property test: connection-manager ids on the hardware backend (feature
//! `hardware`, librdmacm through `rdma-sys`) under a device removal at a
//! random point, on the device of softverbs' own `libibverbs.so.1` and
//! `librdmacm.so.1`.
//!
//! Each case builds a random population of ids (listeners on the device's
//! address, wildcard listeners, idle ids, resolved clients, connected
//! pairs with QPs and RECVs/SENDs posted, some awaited, some left in
//! flight, some pairs disconnected or destroyed, the device moved to
//! another subsystem namespace, ids made there, and the namespace
//! deleted), and unplugs the device from
//! outside with the library's `softverbs_remove_device` (found with
//! `dlsym`) at a random point among those steps. Then:
//!
//! - every id bound to the device (each instance of it: a namespace move
//!   is a removal too) gets `DeviceRemoval` exactly once, and nothing
//!   after it, although both the subsystem's removal and librdmacm report
//!   it; no other id (wildcard listeners, idle ids, ids destroyed before,
//!   ids made after) gets one; a wildcard listener of the initial
//!   namespace is not handed a request that came through the device while
//!   it was in another namespace;
//! - every posted work request completes exactly once: the awaited ones
//!   with success, the ones posted after a disconnect or removal (or never
//!   matched by a SEND) with a flush, those in flight at the removal with
//!   either; a post after the removal may instead fail with `ENODEV`;
//! - calls after the removal fail instead of hanging; destroying every QP,
//!   CQ, MR, PD and id afterwards succeeds and leaves no id in the CM;
//! - every wait is bounded and fails the case with a message.
//!
//! A process has one library device and a removed one does not come back,
//! so each case runs in a child process (this test binary, re-run with the
//! case in `SOFTVERBS_CM_HW_PROP_CASE`); proptest shrinks a failing case by
//! running the smaller ones the same way. The test prints `SKIP: ...`
//! without softverbs' libibverbs (rdma-core's, a real NIC) or without
//! `SOFTVERBS_CM_HW_ADDRS` (the device's address), as
//! `emulator/ibverbs/run_hw_tests.sh` sets it.
#![cfg(feature = "hardware")]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CString};
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

mod cm_hw_common;
use cm_hw_common::{hw_addr, hw_cm, loaded_symbol};
use softverbs::cm::*;
use softverbs::subsystem::{Generation, NamespaceId, Subsystem, SubsystemConfig};
use softverbs::verbs::{
    AccessFlags, Context, Cq, ErrorKind, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendOp, SendWr,
    WcStatus, WorkCompletion,
};

/// Set in a child process to the case it runs.
const CHILD_ENV: &str = "SOFTVERBS_CM_HW_PROP_CASE";
const TEST: &str = "hw_ids_under_random_removal";

/// How long anything that must happen may take (a loaded 2-core machine).
const GENEROUS: Duration = Duration::from_secs(30);
/// How long a whole case may take before the parent kills it as hung.
const CASE_LIMIT: Duration = Duration::from_secs(120);
/// How long nothing more may arrive once everything expected did: a
/// second DEVICE_REMOVAL would come from the other reporter by then.
const QUIET: Duration = Duration::from_millis(1000);

/// `softverbs_remove_device(const char *name)`.
type RemoveFn = unsafe extern "C" fn(*const c_char) -> c_int;

/// The library's removal control, if the loaded libibverbs is softverbs'.
fn remover() -> Option<RemoveFn> {
    let sym = loaded_symbol(c"softverbs_remove_device")?;
    // SAFETY: the library exports it with exactly this C signature.
    Some(unsafe { std::mem::transmute::<*mut c_void, RemoveFn>(sym) })
}

/// One step of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// A listener bound to the device's address.
    Listen,
    /// A wildcard listener (bound to no device).
    Wild,
    /// An id that is never bound.
    Idle,
    /// A client resolved toward the device (`route`: the route too).
    Resolve { route: bool },
    /// A connected pair through live listener `l` (modulo; a new one if
    /// there is none), with QPs.
    Connect { l: u8 },
    /// On pair `p` (a new one if there is none before the removal):
    /// `sends + recvs` RECVs on the receiver, then `sends` SENDs to it
    /// (`fwd`: client to server); `wait`: until they complete.
    Traffic {
        p: u8,
        recvs: u8,
        sends: u8,
        fwd: bool,
        wait: bool,
    },
    /// Pair `p` disconnects (`server`: from the server's side).
    Disconnect { p: u8, server: bool },
    /// Pair `p`'s QPs, CQs, MRs, PDs and ids are destroyed.
    DestroyPair { p: u8 },
    /// Single (non-pair) id `i` is destroyed.
    DestroyId { i: u8 },
    /// The device moves to a new subsystem namespace (a removal of the
    /// instance in the initial one), where a listener and a resolved
    /// client are made, and a client connects to a wildcard listener of
    /// the initial namespace (it must be rejected); the namespace is then
    /// deleted (a removal of the instance there, which comes back to the
    /// initial namespace).
    Move,
    /// `softverbs_remove_device`.
    Remove,
}

impl Op {
    fn encode(self) -> String {
        let b = |x: bool| u8::from(x);
        match self {
            Op::Listen => "L".into(),
            Op::Wild => "W".into(),
            Op::Idle => "I".into(),
            Op::Resolve { route } => format!("R{}", b(route)),
            Op::Connect { l } => format!("C{l}"),
            Op::Traffic {
                p,
                recvs,
                sends,
                fwd,
                wait,
            } => format!("T{p}.{recvs}.{sends}.{}.{}", b(fwd), b(wait)),
            Op::Disconnect { p, server } => format!("D{p}.{}", b(server)),
            Op::DestroyPair { p } => format!("X{p}"),
            Op::DestroyId { i } => format!("Y{i}"),
            Op::Move => "M".into(),
            Op::Remove => "!".into(),
        }
    }

    fn decode(s: &str) -> Op {
        let (tag, rest) = s.split_at(1);
        let n: Vec<u8> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('.').map(|x| x.parse().expect("a number")).collect()
        };
        match tag {
            "L" => Op::Listen,
            "W" => Op::Wild,
            "I" => Op::Idle,
            "R" => Op::Resolve { route: n[0] != 0 },
            "C" => Op::Connect { l: n[0] },
            "T" => Op::Traffic {
                p: n[0],
                recvs: n[1],
                sends: n[2],
                fwd: n[3] != 0,
                wait: n[4] != 0,
            },
            "D" => Op::Disconnect {
                p: n[0],
                server: n[1] != 0,
            },
            "X" => Op::DestroyPair { p: n[0] },
            "Y" => Op::DestroyId { i: n[0] },
            "M" => Op::Move,
            "!" => Op::Remove,
            _ => panic!("unknown op {s}"),
        }
    }
}

fn encode(ops: &[Op]) -> String {
    ops.iter().map(|o| o.encode()).collect::<Vec<_>>().join(",")
}

fn decode(s: &str) -> Vec<Op> {
    s.split(',').filter(|x| !x.is_empty()).map(Op::decode).collect()
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Listen),
        1 => Just(Op::Wild),
        1 => Just(Op::Idle),
        2 => any::<bool>().prop_map(|route| Op::Resolve { route }),
        4 => (0..4u8).prop_map(|l| Op::Connect { l }),
        6 => (0..4u8, 0..3u8, 0..5u8, any::<bool>(), any::<bool>())
            .prop_map(|(p, recvs, sends, fwd, wait)| Op::Traffic { p, recvs, sends, fwd, wait }),
        1 => (0..4u8, any::<bool>()).prop_map(|(p, server)| Op::Disconnect { p, server }),
        1 => (0..4u8).prop_map(|p| Op::DestroyPair { p }),
        1 => (0..8u8).prop_map(|i| Op::DestroyId { i }),
        1 => Just(Op::Move),
    ]
}

/// The steps of a case, with one `Remove` among them at a random point.
fn case() -> impl Strategy<Value = Vec<Op>> {
    (proptest::collection::vec(op(), 2..16), any::<proptest::sample::Index>()).prop_map(|(mut ops, at)| {
        let at = at.index(ops.len() + 1);
        ops.insert(at, Op::Remove);
        ops
    })
}

/// Which completion statuses a work request may end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    Success,
    Flush,
    Either,
}

impl Allowed {
    fn admits(self, s: WcStatus) -> bool {
        match self {
            Allowed::Success => s == WcStatus::Success,
            Allowed::Flush => s == WcStatus::WrFlushErr,
            Allowed::Either => matches!(s, WcStatus::Success | WcStatus::WrFlushErr),
        }
    }
}

/// Posted work requests of one CQ and their completions.
#[derive(Default)]
struct Ledger {
    allowed: HashMap<u64, Allowed>,
    seen: HashMap<u64, u32>,
    succeeded: u32,
    flushed: u32,
}

impl Ledger {
    /// Polls what is there; every completion must be of a posted WR, its
    /// first, with an allowed status.
    fn poll(&mut self, cq: &Cq, what: &str) {
        let mut wc = [WorkCompletion::default(); 32];
        loop {
            let n = cq.poll(&mut wc).unwrap_or_else(|e| panic!("{what}: poll: {e}"));
            for w in &wc[..n] {
                let a = self
                    .allowed
                    .get(&w.wr_id)
                    .unwrap_or_else(|| panic!("{what}: a completion of wr {} never posted", w.wr_id));
                assert!(
                    a.admits(w.status),
                    "{what}: wr {} completed with {:?}, expected {a:?}",
                    w.wr_id,
                    w.status
                );
                let c = self.seen.entry(w.wr_id).or_default();
                *c += 1;
                assert_eq!(*c, 1, "{what}: wr {} completed twice", w.wr_id);
                if w.status == WcStatus::Success {
                    self.succeeded += 1;
                } else {
                    self.flushed += 1;
                }
            }
            if n < wc.len() {
                return;
            }
        }
    }

    fn done(&self, ids: &[u64]) -> bool {
        ids.iter().all(|i| self.seen.contains_key(i))
    }

    fn pending(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .allowed
            .keys()
            .filter(|i| !self.seen.contains_key(i))
            .copied()
            .collect();
        v.sort_unstable();
        v
    }
}

/// One end of a pair: its verbs objects (the QP attached to the id).
struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    mr: Mr,
    qp: Qp,
    ledger: Ledger,
    /// RECVs posted while connected and not yet matched by a SEND, in
    /// order.
    rq: VecDeque<u64>,
}

impl Side {
    fn new(id: &CmId) -> Side {
        let ctx = id.verbs().expect("the id's verbs context");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(256, 0, None, 0).expect("cq");
        let mr = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).expect("mr");
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .expect("qp");
        id.attach_qp(&qp).expect("attach_qp (rdma_init_qp_attr)");
        Side {
            ctx,
            pd,
            cq,
            mr,
            qp,
            ledger: Ledger::default(),
            rq: VecDeque::new(),
        }
    }

    /// Destroys the verbs objects: every destroy must succeed.
    fn destroy(self, what: &str) {
        let Side {
            ctx, pd, cq, mr, qp, ..
        } = self;
        qp.destroy().unwrap_or_else(|e| panic!("{what}: destroy the QP: {e:?}"));
        mr.destroy().unwrap_or_else(|e| panic!("{what}: destroy the MR: {e:?}"));
        cq.destroy().unwrap_or_else(|e| panic!("{what}: destroy the CQ: {e:?}"));
        pd.destroy().unwrap_or_else(|e| panic!("{what}: destroy the PD: {e:?}"));
        drop(ctx);
    }
}

/// How far a pair's connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Connected on a live device: posts succeed and complete.
    Live,
    /// Disconnected (QPs in ERR): posts flush.
    Down,
    /// Its device instance is gone: posts flush or fail with ENODEV.
    Gone,
}

struct Pair {
    /// Indices of the client and server ids in `World::ids`.
    c: usize,
    s: usize,
    cs: Side,
    ss: Side,
    phase: Phase,
}

/// An id of the case and what is expected of it.
struct Tracked {
    id: Option<CmId>,
    /// The id's number (also once destroyed).
    key: u64,
    ch: EventChannel,
    what: String,
    /// The device instance it is bound to.
    gen: Option<Generation>,
    /// DEVICE_REMOVAL events it must get (0 or 1).
    removals: u32,
    /// Whether it is a listener (a candidate for connects).
    listener: bool,
}

struct World {
    sub: Arc<Subsystem>,
    cm: Cm,
    name: String,
    ip: IpAddr,
    remove: RemoveFn,
    ids: Vec<Tracked>,
    pairs: Vec<Option<Pair>>,
    /// Events seen, per id number.
    log: HashMap<u64, Vec<CmEventKind>>,
    next_wr: u64,
    /// Whether softverbs_remove_device ran.
    removed: bool,
    /// Ports already used by resolve-only clients.
    port: u16,
}

impl World {
    fn gen(&self) -> Option<Generation> {
        self.sub.device(&self.name).ok().map(|d| d.generation())
    }

    fn track(&mut self, id: CmId, ch: EventChannel, what: String, listener: bool) -> usize {
        let gen = id.device().map(|(n, g)| {
            assert_eq!(n, self.name, "{what}: bound to the library's device");
            g
        });
        self.ids.push(Tracked {
            key: id.id(),
            id: Some(id),
            ch,
            what,
            gen,
            removals: 0,
            listener,
        });
        self.ids.len() - 1
    }

    fn record(&mut self, ev: &CmEvent) {
        let l = self.log.entry(ev.id).or_default();
        assert!(
            !l.contains(&CmEventKind::DeviceRemoval),
            "id {}: {:?} after DEVICE_REMOVAL ({l:?})",
            ev.id,
            ev.kind
        );
        l.push(ev.kind);
    }

    /// Waits on `ch` for `kind` for id `id` (or, for a request, the
    /// listener `id`), recording every event read.
    fn wait(&mut self, ch: &EventChannel, id: u64, kind: CmEventKind, what: &str) -> CmEvent {
        let ev = ch
            .get_event(Some(GENEROUS))
            .expect("get_event")
            .unwrap_or_else(|| panic!("{what}: no {kind:?} within {GENEROUS:?}"));
        self.record(&ev);
        let mine = if kind == CmEventKind::ConnectRequest {
            ev.listener == Some(id)
        } else {
            ev.id == id
        };
        assert!(mine && ev.kind == kind, "{what}: {ev:?} while waiting for {kind:?}");
        ev
    }

    /// Reads every queued event of every channel.
    fn drain(&mut self) {
        let chans: Vec<EventChannel> = self.ids.iter().map(|t| t.ch.clone()).collect();
        for ch in chans {
            while let Some(ev) = ch.try_get_event() {
                self.record(&ev);
            }
        }
    }

    fn removals_of(&self, t: &Tracked) -> u32 {
        self.log.get(&t.key).map_or(0, |l| {
            l.iter().filter(|k| **k == CmEventKind::DeviceRemoval).count() as u32
        })
    }

    fn new_id(&self) -> (CmId, EventChannel) {
        let ch = EventChannel::new().expect("channel");
        let id = self.cm.create_id(&ch, PortSpace::Tcp, 0).expect("create_id");
        (id, ch)
    }

    fn live_listeners(&self) -> Vec<usize> {
        (0..self.ids.len())
            .filter(|&i| {
                let t = &self.ids[i];
                t.listener && t.id.is_some() && t.removals == 0
            })
            .collect()
    }

    fn singles(&self) -> Vec<usize> {
        let in_pairs: Vec<usize> = self.pairs.iter().flatten().flat_map(|p| [p.c, p.s]).collect();
        (0..self.ids.len())
            .filter(|i| self.ids[*i].id.is_some() && !in_pairs.contains(i))
            .collect()
    }

    /// Live wildcard listeners (of the initial namespace).
    fn wildcards(&self) -> Vec<usize> {
        (0..self.ids.len())
            .filter(|&i| {
                let t = &self.ids[i];
                t.listener && t.gen.is_none() && t.id.is_some()
            })
            .collect()
    }

    fn live_pairs(&self) -> Vec<usize> {
        (0..self.pairs.len()).filter(|i| self.pairs[*i].is_some()).collect()
    }

    /// A removal of the current device instance: every id bound to it
    /// must get one DEVICE_REMOVAL; pairs on it are gone.
    fn instance_removed(&mut self) {
        let gen = self.gen().expect("the device is there");
        for t in &mut self.ids {
            if t.id.is_some() && t.gen == Some(gen) && t.removals == 0 {
                t.removals = 1;
            }
        }
        for p in self.pairs.iter_mut().flatten() {
            p.phase = Phase::Gone;
            for s in [&mut p.cs, &mut p.ss] {
                // Unmatched RECVs flush.
                s.rq.clear();
            }
        }
    }

    fn run(&mut self, op: Op, step: usize) {
        let what = format!("step {step} {op:?}");
        match op {
            Op::Listen => {
                let (id, ch) = self.new_id();
                let r = id.bind_addr(SocketAddr::new(self.ip, 0));
                if self.removed {
                    assert!(r.is_err(), "{what}: bind after the removal: {r:?}");
                    self.track(id, ch, what, false);
                    return;
                }
                r.unwrap_or_else(|e| panic!("{what}: bind: {e}"));
                id.listen(8).unwrap_or_else(|e| panic!("{what}: listen: {e}"));
                let i = self.track(id, ch, what.clone(), true);
                assert!(self.ids[i].gen.is_some(), "{what}: a bound listener names its device");
            }
            Op::Wild => {
                let (id, ch) = self.new_id();
                id.bind_addr("0.0.0.0:0".parse().unwrap())
                    .unwrap_or_else(|e| panic!("{what}: wildcard bind: {e}"));
                let r = id.listen(8);
                if !self.removed {
                    r.unwrap_or_else(|e| panic!("{what}: wildcard listen: {e}"));
                }
                let i = self.track(id, ch, what, !self.removed);
                assert_eq!(self.ids[i].gen, None, "a wildcard listener is bound to no device");
            }
            Op::Idle => {
                let (id, ch) = self.new_id();
                self.track(id, ch, what, false);
            }
            Op::Resolve { route } => {
                let (id, ch) = self.new_id();
                self.port += 1;
                let dst = SocketAddr::new(self.ip, self.port);
                let r = id.resolve_addr(Some(self.ip), dst);
                if self.removed {
                    if r.is_ok() {
                        // An answer must come, and not a resolution.
                        let ev = ch
                            .get_event(Some(GENEROUS))
                            .expect("get_event")
                            .unwrap_or_else(|| panic!("{what}: no answer to resolve_addr after the removal"));
                        self.record(&ev);
                        assert!(
                            !matches!(ev.kind, CmEventKind::AddrResolved | CmEventKind::DeviceRemoval),
                            "{what}: after the removal: {ev:?}"
                        );
                    }
                    self.track(id, ch, what, false);
                    return;
                }
                r.unwrap_or_else(|e| panic!("{what}: resolve_addr: {e}"));
                let key = id.id();
                self.wait(&ch, key, CmEventKind::AddrResolved, &what);
                if route {
                    id.resolve_route()
                        .unwrap_or_else(|e| panic!("{what}: resolve_route: {e}"));
                    self.wait(&ch, key, CmEventKind::RouteResolved, &what);
                }
                let i = self.track(id, ch, what.clone(), false);
                assert!(self.ids[i].gen.is_some(), "{what}: a resolved id names its device");
            }
            Op::Connect { l } => {
                if self.removed {
                    return;
                }
                if self.live_listeners().is_empty() {
                    self.run(Op::Listen, step);
                }
                let ls = self.live_listeners();
                let li = ls[l as usize % ls.len()];
                let (lkey, port, lch) = {
                    let t = &self.ids[li];
                    let id = t.id.as_ref().unwrap();
                    (id.id(), id.local_addr().expect("bound").port(), t.ch.clone())
                };
                let (c, cch) = self.new_id();
                let ckey = c.id();
                c.resolve_addr(Some(self.ip), SocketAddr::new(self.ip, port))
                    .unwrap_or_else(|e| panic!("{what}: resolve_addr: {e}"));
                self.wait(&cch, ckey, CmEventKind::AddrResolved, &what);
                c.resolve_route()
                    .unwrap_or_else(|e| panic!("{what}: resolve_route: {e}"));
                self.wait(&cch, ckey, CmEventKind::RouteResolved, &what);
                let cs = Side::new(&c);
                c.connect(&ConnParam::default())
                    .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
                let mut req = self.wait(&lch, lkey, CmEventKind::ConnectRequest, &what);
                let s = req.take_id().expect("the new id");
                let sch = EventChannel::new().expect("channel");
                s.migrate(&sch).expect("migrate");
                let skey = s.id();
                let ss = Side::new(&s);
                s.accept(&ConnParam::default())
                    .unwrap_or_else(|e| panic!("{what}: accept: {e}"));
                self.wait(&cch, ckey, CmEventKind::Established, &what);
                self.wait(&sch, skey, CmEventKind::Established, &what);
                let ci = self.track(c, cch, format!("{what} client"), false);
                let si = self.track(s, sch, format!("{what} server"), false);
                assert!(self.ids[ci].gen.is_some() && self.ids[si].gen.is_some());
                self.pairs.push(Some(Pair {
                    c: ci,
                    s: si,
                    cs,
                    ss,
                    phase: Phase::Live,
                }));
            }
            Op::Traffic {
                p,
                recvs,
                sends,
                fwd,
                wait,
            } => {
                if self.live_pairs().is_empty() && !self.removed {
                    self.run(Op::Connect { l: 0 }, step);
                }
                let ps = self.live_pairs();
                if ps.is_empty() {
                    return;
                }
                let k = ps[p as usize % ps.len()];
                let removed = self.removed;
                let first = self.next_wr;
                let pair = self.pairs[k].as_mut().unwrap();
                let phase = pair.phase;
                let (tx, rx) = if fwd {
                    (&mut pair.cs, &mut pair.ss)
                } else {
                    (&mut pair.ss, &mut pair.cs)
                };
                let mut wr = first;
                let post_ok = |r: std::result::Result<(), softverbs::verbs::PostError>, w: &str| -> bool {
                    match r {
                        Ok(()) => true,
                        Err(e) if phase == Phase::Gone && e.error.kind() == ErrorKind::NoDevice => false,
                        Err(e) => panic!("{what}: {w} ({phase:?}, removed {removed}): {e}"),
                    }
                };
                for _ in 0..sends + recvs {
                    if rx.rq.len() >= 32 {
                        break;
                    }
                    wr += 1;
                    let sge = [rx.mr.sge(0, 64).unwrap()];
                    if post_ok(rx.qp.post_recv(&[RecvWr::new(wr, &sge)]), "post_recv") {
                        // Decided when a SEND matches it; else it flushes.
                        rx.ledger.allowed.insert(wr, Allowed::Flush);
                        if phase == Phase::Live {
                            rx.rq.push_back(wr);
                        }
                    }
                }
                let mut awaited_tx = Vec::new();
                let mut awaited_rx = Vec::new();
                for _ in 0..sends {
                    // A SEND without a RECV waiting would be an RNR error.
                    if phase == Phase::Live && rx.rq.is_empty() {
                        break;
                    }
                    wr += 1;
                    tx.mr.write(128, b"cm_hw_prop").unwrap();
                    let sge = [tx.mr.sge(128, 10).unwrap()];
                    let r = tx
                        .qp
                        .post_send(&[SendWr::new(wr, SendOp::Send, &sge).flags(SendFlags::SIGNALED)]);
                    if post_ok(r, "post_send") {
                        let a = match (phase, wait) {
                            (Phase::Live, true) => Allowed::Success,
                            (Phase::Live, false) => Allowed::Either,
                            _ => Allowed::Flush,
                        };
                        tx.ledger.allowed.insert(wr, a);
                        if phase == Phase::Live {
                            let r = rx.rq.pop_front().expect("a RECV waits");
                            rx.ledger.allowed.insert(r, a);
                            awaited_tx.push(wr);
                            awaited_rx.push(r);
                        }
                    }
                }
                if wait && phase == Phase::Live {
                    let deadline = Instant::now() + GENEROUS;
                    loop {
                        tx.ledger.poll(&tx.cq, &format!("{what} sender"));
                        rx.ledger.poll(&rx.cq, &format!("{what} receiver"));
                        if tx.ledger.done(&awaited_tx) && rx.ledger.done(&awaited_rx) {
                            break;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "{what}: SENDs {awaited_tx:?} / RECVs {awaited_rx:?} not complete within {GENEROUS:?}"
                        );
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                self.next_wr = wr;
            }
            Op::Disconnect { p, server } => {
                let ps = self.live_pairs();
                if ps.is_empty() {
                    return;
                }
                let k = ps[p as usize % ps.len()];
                let (ci, si, phase) = {
                    let pair = self.pairs[k].as_ref().unwrap();
                    (pair.c, pair.s, pair.phase)
                };
                let who = if server { si } else { ci };
                let r = self.ids[who].id.as_ref().unwrap().disconnect();
                if phase != Phase::Live {
                    // Any answer but a hang.
                    return;
                }
                r.unwrap_or_else(|e| panic!("{what}: disconnect: {e}"));
                for i in [ci, si] {
                    let (ch, key) = (self.ids[i].ch.clone(), self.ids[i].id.as_ref().unwrap().id());
                    self.wait(&ch, key, CmEventKind::Disconnected, &what);
                }
                let pair = self.pairs[k].as_mut().unwrap();
                pair.phase = Phase::Down;
                pair.cs.rq.clear();
                pair.ss.rq.clear();
            }
            Op::DestroyPair { p } => {
                let ps = self.live_pairs();
                if ps.is_empty() {
                    return;
                }
                let k = ps[p as usize % ps.len()];
                let pair = self.pairs[k].take().unwrap();
                // What completed so far was checked; a destroyed QP's
                // outstanding requests complete no more.
                let Pair {
                    c, s, mut cs, mut ss, ..
                } = pair;
                cs.ledger.poll(&cs.cq, &format!("{what} client"));
                ss.ledger.poll(&ss.cq, &format!("{what} server"));
                cs.destroy(&format!("{what} client"));
                ss.destroy(&format!("{what} server"));
                self.drain();
                for i in [c, s] {
                    self.ids[i].id.take().expect("alive").destroy();
                }
            }
            Op::DestroyId { i } => {
                let singles = self.singles();
                if singles.is_empty() {
                    return;
                }
                let j = singles[i as usize % singles.len()];
                self.drain();
                self.ids[j].id.take().expect("alive").destroy();
            }
            Op::Move => {
                if self.removed {
                    let ns = self.sub.create_namespace("cm_hw_prop_late").expect("namespace");
                    assert!(
                        self.sub.move_device(&self.name, ns).is_err(),
                        "{what}: moved a removed device"
                    );
                    self.sub.delete_namespace(ns).expect("delete namespace");
                    return;
                }
                self.instance_removed();
                let ns = self
                    .sub
                    .create_namespace(&format!("cm_hw_prop_{step}"))
                    .expect("namespace");
                self.sub
                    .move_device(&self.name, ns)
                    .unwrap_or_else(|e| panic!("{what}: move: {e}"));
                // Ids of the new namespace on the device there (librdmacm
                // itself knows no subsystem namespace): a listener on its
                // address and a client resolved to it.
                let ch = EventChannel::new().expect("channel");
                let l = self.cm.create_id_in(ns, &ch, PortSpace::Tcp, 0).expect("create_id_in");
                l.bind_addr(SocketAddr::new(self.ip, 0))
                    .unwrap_or_else(|e| panic!("{what}: bind in the new namespace: {e}"));
                l.listen(8)
                    .unwrap_or_else(|e| panic!("{what}: listen in the new namespace: {e}"));
                let dst = l.local_addr().expect("bound");
                let li = self.track(l, ch, format!("{what} listener in the namespace"), false);
                let ch = EventChannel::new().expect("channel");
                let c = self.cm.create_id_in(ns, &ch, PortSpace::Tcp, 0).expect("create_id_in");
                c.resolve_addr(Some(self.ip), dst)
                    .unwrap_or_else(|e| panic!("{what}: resolve_addr in the new namespace: {e}"));
                let key = c.id();
                self.wait(&ch, key, CmEventKind::AddrResolved, &what);
                let ci = self.track(c, ch, format!("{what} client in the namespace"), false);
                for i in [li, ci] {
                    assert_eq!(self.ids[i].gen, self.gen(), "{what}: bound to the moved instance");
                    assert_eq!(self.ids[i].id.as_ref().unwrap().namespace(), ns);
                }
                // librdmacm also listens for a wildcard listener of the
                // initial namespace (on every device of the process), but
                // a request through the moved device is not for it: the
                // client is rejected, the listener sees nothing.
                if let Some(wi) = self.wildcards().first().copied() {
                    let (wkey, wport, wch) = {
                        let t = &self.ids[wi];
                        let id = t.id.as_ref().unwrap();
                        (id.id(), id.local_addr().expect("bound").port(), t.ch.clone())
                    };
                    let ch = EventChannel::new().expect("channel");
                    let x = self.cm.create_id_in(ns, &ch, PortSpace::Tcp, 0).expect("create_id_in");
                    let key = x.id();
                    x.resolve_addr(Some(self.ip), SocketAddr::new(self.ip, wport))
                        .unwrap_or_else(|e| panic!("{what}: resolve_addr in the new namespace: {e}"));
                    self.wait(&ch, key, CmEventKind::AddrResolved, &what);
                    x.resolve_route()
                        .unwrap_or_else(|e| panic!("{what}: resolve_route in the new namespace: {e}"));
                    self.wait(&ch, key, CmEventKind::RouteResolved, &what);
                    x.connect(&ConnParam {
                        qp_num: 0x4242,
                        ..ConnParam::default()
                    })
                    .unwrap_or_else(|e| panic!("{what}: connect in the new namespace: {e}"));
                    self.wait(
                        &ch,
                        key,
                        CmEventKind::Rejected,
                        &format!("{what}: to the initial namespace's wildcard listener {wkey}"),
                    );
                    let leak = wch.try_get_event();
                    assert!(
                        leak.is_none(),
                        "{what}: the initial namespace's wildcard listener got {leak:?} through a device of another namespace"
                    );
                    self.track(x, ch, format!("{what} client rejected in the namespace"), false);
                }
                // Deleting the namespace: the device comes back (a removal
                // of the instance there), the namespace's ids end.
                self.instance_removed();
                self.sub.delete_namespace(ns).expect("delete namespace");
                let d = self.sub.device(&self.name).expect("the device is back");
                assert_eq!(
                    d.namespace(),
                    NamespaceId::INIT,
                    "{what}: back in the initial namespace"
                );
                // The subsystem's removal reported it synchronously.
                self.drain();
                self.removals_in(&what);
            }
            Op::Remove => {
                self.instance_removed();
                self.removed = true;
                let n = CString::new(self.name.clone()).unwrap();
                // SAFETY: a NUL-terminated string that outlives the call.
                let rc = unsafe { (self.remove)(n.as_ptr()) };
                assert_eq!(rc, 0, "softverbs_remove_device({})", self.name);
                // The subsystem's removal (its monitor saw DEVICE_FATAL)
                // reports to the CM before the device leaves it.
                let deadline = Instant::now() + GENEROUS;
                while self.sub.device(&self.name).is_ok() {
                    assert!(
                        Instant::now() < deadline,
                        "the subsystem still has the device {GENEROUS:?} after softverbs_remove_device"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.drain();
                self.removals_in(&what);
            }
        }
    }

    /// Every id the removal that just finished concerned has its
    /// DEVICE_REMOVAL queued already (the subsystem's removal reports it
    /// before it ends, whatever librdmacm does).
    fn removals_in(&self, what: &str) {
        for t in &self.ids {
            if t.id.is_some() && t.removals > 0 {
                assert_eq!(
                    self.removals_of(t),
                    1,
                    "{what}: {} (id {}) has no DEVICE_REMOVAL when the removal ended; its events: {:?}",
                    t.what,
                    t.key,
                    self.log.get(&t.key)
                );
            }
        }
    }

    /// Waits for every expected DEVICE_REMOVAL and completion, then for
    /// quiet, and checks the counts.
    fn check(&mut self) {
        let deadline = Instant::now() + GENEROUS;
        loop {
            self.drain();
            for p in self.pairs.iter_mut().flatten() {
                p.cs.ledger.poll(&p.cs.cq, "client");
                p.ss.ledger.poll(&p.ss.cq, "server");
            }
            let missing: Vec<&str> = self
                .ids
                .iter()
                .filter(|t| t.removals > 0 && self.removals_of(t) < t.removals)
                .map(|t| t.what.as_str())
                .collect();
            let pending: Vec<(usize, Vec<u64>, Vec<u64>)> = self
                .pairs
                .iter()
                .enumerate()
                .filter_map(|(k, p)| p.as_ref().map(|p| (k, p.cs.ledger.pending(), p.ss.ledger.pending())))
                .filter(|(_, a, b)| !a.is_empty() || !b.is_empty())
                .collect();
            if missing.is_empty() && pending.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "within {GENEROUS:?}: no DEVICE_REMOVAL for {missing:?}; WRs not completed (pair, client, server): {pending:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // A second report (the other of subsystem and librdmacm) or a
        // stray completion would come within this.
        let quiet = Instant::now() + QUIET;
        while Instant::now() < quiet {
            self.drain();
            for p in self.pairs.iter_mut().flatten() {
                p.cs.ledger.poll(&p.cs.cq, "client");
                p.ss.ledger.poll(&p.ss.cq, "server");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in &self.ids {
            assert_eq!(
                self.removals_of(t),
                t.removals,
                "{} (id {}{}): DEVICE_REMOVAL events; its events: {:?}",
                t.what,
                t.key,
                if t.id.is_some() { "" } else { ", destroyed" },
                self.log.get(&t.key)
            );
            // After DEVICE_REMOVAL only destroy is left.
            if let (Some(id), 1) = (&t.id, t.removals) {
                let r = id.verbs().map(|_| ());
                assert!(
                    matches!(r, Err(Error::DeviceRemoved | Error::NamespaceGone)),
                    "{}: a call after DEVICE_REMOVAL: {r:?}",
                    t.what
                );
            }
        }
    }

    /// Destroys everything: each destroy succeeds, no id is left.
    fn destroy_all(&mut self) {
        for k in 0..self.pairs.len() {
            let Some(Pair { c, s, cs, ss, .. }) = self.pairs[k].take() else {
                continue;
            };
            cs.destroy("client");
            ss.destroy("server");
            for i in [c, s] {
                self.ids[i].id.take().unwrap().destroy();
            }
        }
        for t in &mut self.ids {
            if let Some(id) = t.id.take() {
                id.destroy();
            }
        }
        let deadline = Instant::now() + GENEROUS;
        while self.cm.id_count() != 0 {
            assert!(
                Instant::now() < deadline,
                "ids left in the CM {GENEROUS:?} after all were destroyed: {:?}",
                self.cm.id_states()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs one case (in the child process).
fn run_case(ops: &[Op]) {
    let remove = remover().expect("softverbs' libibverbs is loaded");
    let devs = softverbs::hw::provider().devices().expect("ibv_get_device_list");
    let name = devs.first().expect("the library lists its device").name().to_string();
    let ip = hw_addr().expect("SOFTVERBS_CM_HW_ADDRS");
    let cfg = SubsystemConfig {
        removal_deadline: Duration::from_millis(200),
        ..SubsystemConfig::default()
    };
    let (sub, _, cm) = hw_cm(&name, cfg);
    let mut w = World {
        sub,
        cm,
        name,
        ip,
        remove,
        ids: Vec::new(),
        pairs: Vec::new(),
        log: HashMap::new(),
        next_wr: 0,
        removed: false,
        port: 7000,
    };
    for (step, op) in ops.iter().enumerate() {
        w.run(*op, step);
    }
    w.check();
    let (mut ok, mut flushed) = (0, 0);
    for p in w.pairs.iter().flatten() {
        for l in [&p.cs.ledger, &p.ss.ledger] {
            ok += l.succeeded;
            flushed += l.flushed;
        }
    }
    println!(
        "CASE [{}]: {} ids ({} with a DEVICE_REMOVAL), {} pairs at the end with {} WRs succeeded, {} flushed",
        encode(ops),
        w.ids.len(),
        w.ids.iter().filter(|t| t.removals > 0).count(),
        w.pairs.iter().flatten().count(),
        ok,
        flushed
    );
    w.destroy_all();
    assert!(w.sub.device(&w.name).is_err(), "the removed device is back");
}

/// Runs `ops` in a child process; the child's output on failure.
fn in_child(ops: &[Op]) -> std::result::Result<(), String> {
    let case = encode(ops);
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &case)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the case in a child process");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CASE_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (so, se) = (t_out.join().unwrap(), t_err.join().unwrap());
    match status {
        None => Err(format!("case [{case}] hung: killed after {CASE_LIMIT:?}\n{so}\n{se}")),
        Some(s) if s.success() && so.contains("1 passed") => {
            if let Some(l) = so.lines().find(|l| l.contains("CASE [")) {
                println!("{}", &l[l.find("CASE [").unwrap()..]);
            }
            Ok(())
        }
        Some(s) => Err(format!("case [{case}] failed ({s}):\n{so}\n{se}")),
    }
}

/// See the module's documentation.
#[test]
fn hw_ids_under_random_removal() {
    if let Ok(case) = std::env::var(CHILD_ENV) {
        // The child: the case it was given, once.
        run_case(&decode(&case));
        return;
    }
    if std::env::var_os("SOFTVERBS_CM_HW_ADDRS").is_none() {
        println!("SKIP {TEST}: set SOFTVERBS_CM_HW_ADDRS to the address of softverbs' libibverbs device (this test unplugs it)");
        return;
    }
    if remover().is_none() {
        println!("SKIP {TEST}: the loaded libibverbs is not softverbs' (no softverbs_remove_device): run with LD_LIBRARY_PATH at emulator/ibverbs/mklibdir.sh's directory");
        return;
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 12,
        // Each case is a process: keep a failure's shrinking short.
        max_shrink_iters: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let r = runner.run(&case(), |ops| {
        prop_assert_eq!(in_child(&ops), Ok(()));
        Ok(())
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}
