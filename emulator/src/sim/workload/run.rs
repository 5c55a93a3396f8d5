//! Runs a [`Scenario`] on a fresh fabric and checks it against its plan.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

/// Most steps a run may take without virtual time moving.
const SAME_INSTANT_STEPS: u64 = 200_000;

use softverbs::soft::proto::{Counters, Nanos};
use softverbs::verbs::{QpState, RecvWr, SendFlags, SendOp, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::plan::{Plan, RecvPlan};
use super::{OpKind, Scenario, Violation, COUNTERS};
use crate::sim::conn::{connect, Endpoint};
use crate::sim::fabric::Verdict;
use crate::sim::fabric::{Fabric, FabricStats, NodeConfig, NodeId};
use crate::sim::link::Partition;
use crate::sim::trace::Trace;

/// What a successful run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Steps (events) taken.
    pub steps: u64,
    /// Virtual time at the end.
    pub end_ns: Nanos,
    /// Fabric counters.
    pub stats: FabricStats,
    /// Both engines' counters (A, B).
    pub engine: [Counters; 2],
    /// Per side, the WR (op index) that failed with RETRY_EXC_ERR, if any.
    pub failed: [Option<usize>; 2],
    /// Virtual time of each side's failure.
    pub failed_at: [Option<Nanos>; 2],
}

/// The responses each side sent, as (side, PSN) in send order.
type ResponseLog = Arc<Mutex<Vec<(usize, u32)>>>;

impl Scenario {
    /// Runs the scenario and checks every invariant (see the module docs).
    ///
    /// # Errors
    ///
    /// The first [`Violation`].
    pub fn run(&self) -> Result<Report, Violation> {
        self.run_with(None).0
    }

    /// Runs with the packet log on (keeping the last `limit` events); a
    /// violation then carries the end of the log.
    pub fn run_traced(&self, limit: Option<usize>) -> (Result<Report, Violation>, Option<Trace>) {
        self.run_with(Some(limit))
    }

    fn run_with(&self, trace: Option<Option<usize>>) -> (Result<Report, Violation>, Option<Trace>) {
        let mut r = match Runner::new(self, trace) {
            Ok(r) => r,
            Err(v) => return (Err(v), None),
        };
        let mut result = r.run();
        let tr = r.fabric.trace().cloned();
        if let (Err(v), Some(t)) = (&mut result, &tr) {
            v.trace_tail = Some(t.render(Some(80)));
        }
        (result, tr)
    }
}

struct Runner<'a> {
    sc: &'a Scenario,
    plan: Plan,
    fabric: Fabric,
    ep: [Endpoint; 2],
    /// Per side, global op indices in post order.
    order: [Vec<usize>; 2],
    /// Per op, its position in its side's order.
    pos: Vec<usize>,
    /// Per side, position of the first WR not known complete.
    send_next: [usize; 2],
    failed: [Option<usize>; 2],
    failed_at: [Option<Nanos>; 2],
    /// Per side, receives posted and receive CQEs seen (in order).
    recv_posted: [usize; 2],
    recv_done: [usize; 2],
    recv_flushing: [bool; 2],
    /// Per op, whether its receive CQE was seen.
    recv_seen: Vec<bool>,
    steps: u64,
    /// Steps taken since virtual time last moved, and when that was.
    same_instant: (u64, Nanos),
    error_mode: bool,
    responses: ResponseLog,
}

enum Action {
    Recv(usize),
    Op(usize),
}

impl<'a> Runner<'a> {
    fn new(sc: &'a Scenario, trace: Option<Option<usize>>) -> Result<Runner<'a>, Violation> {
        let plan = Plan::build(sc.seed, &sc.program);
        let mut fabric = Fabric::new(sc.seed, sc.link_ab);
        if let Some(limit) = trace {
            fabric.set_trace(limit);
        }
        let (ra, rb) = super::recoveries(sc.seed);
        let mut na = NodeConfig::new("a", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        na.recovery = ra;
        let mut nb = NodeConfig::new("b", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        nb.recovery = rb;
        if sc.seed & 8 != 0 {
            na.coalesce_acks = true;
            nb.coalesce_acks = true;
        }
        let a = fabric.add_node(na);
        let b = fabric.add_node(nb);
        if sc.seed & 1 == 1 {
            // Odd seeds: large messages from shareable buffers go as trains.
            fabric.enable_trains(a);
            fabric.enable_trains(b);
        }
        fabric.set_link(a, b, sc.link_ab);
        fabric.set_link(b, a, sc.link_ba);
        let responses = ResponseLog::default();
        let log = responses.clone();
        // The log of responses, for the order check of runs without faults.
        if sc.is_fault_free() {
            fabric.set_filter(Box::new(move |p| {
                let op = p.data.first().map(|&b| softverbs::soft::wire::Opcode::from(b));
                if let (Some(info), Some(psn)) = (op.and_then(|o| o.info()), p.data.get(9..12)) {
                    if !info.is_request() {
                        let psn = u32::from_be_bytes([0, psn[0], psn[1], psn[2]]);
                        log.lock().unwrap_or_else(|e| e.into_inner()).push((p.from.0, psn));
                    }
                }
                Verdict::Pass
            }));
        }
        for c in &sc.cuts {
            fabric.add_partition(Partition {
                side: vec![a],
                start: c.start,
                end: c.duration.map(|d| c.start + d),
            });
        }
        let (ea, eb) =
            connect(&mut fabric, a, b, plan.init[0].len(), plan.init[1].len(), &sc.qp).map_err(|e| Violation {
                seed: sc.seed,
                time: 0,
                what: format!("setting up the QP pair: {e}"),
                trace_tail: None,
            })?;
        ea.write(0, &plan.init[0]);
        eb.write(0, &plan.init[1]);
        let mut order = [Vec::new(), Vec::new()];
        let mut pos = Vec::with_capacity(plan.ops.len());
        for (i, op) in plan.ops.iter().enumerate() {
            let s = op.side.index();
            pos.push(order[s].len());
            order[s].push(i);
        }
        let n = plan.ops.len();
        Ok(Runner {
            sc,
            plan,
            fabric,
            ep: [ea, eb],
            order,
            pos,
            send_next: [0, 0],
            failed: [None, None],
            failed_at: [None, None],
            recv_posted: [0, 0],
            recv_done: [0, 0],
            recv_flushing: [false, false],
            recv_seen: vec![false; n],
            steps: 0,
            same_instant: (0, 0),
            error_mode: sc.has_permanent_cut(),
            responses,
        })
    }

    fn violation(&self, what: impl Into<String>) -> Violation {
        Violation {
            seed: self.sc.seed,
            time: self.fabric.now(),
            what: what.into(),
            trace_tail: None,
        }
    }

    fn schedule(&self) -> Vec<(Nanos, Action)> {
        let prog = &self.sc.program;
        let mut v = Vec::new();
        for side in 0..2 {
            for k in 0..self.plan.recvs[side].len() {
                let t = if (k as u32) < prog.prepost {
                    0
                } else {
                    (k as u64 + 1 - u64::from(prog.prepost)) * prog.recv_interval_ns
                };
                v.push((t, Action::Recv(side * 1_000_000 + k)));
            }
        }
        let mut t = 0;
        for (i, op) in prog.ops.iter().enumerate() {
            t += op.gap_ns;
            v.push((t, Action::Op(i)));
        }
        // Stable: at equal times receives (listed first) go before WRs.
        v.sort_by_key(|(t, _)| *t);
        v
    }

    fn run(&mut self) -> Result<Report, Violation> {
        for (t, action) in self.schedule() {
            while self.fabric.step_until(t) {
                self.after_step()?;
            }
            match action {
                Action::Recv(code) => self.post_recv(code / 1_000_000, code % 1_000_000)?,
                Action::Op(i) => self.post_op(i)?,
            }
            self.check_cqs()?;
        }
        while self.fabric.step() {
            self.after_step()?;
        }
        self.check_idle()?;
        self.check_response_order()?;
        // Teardown: both QPs to ERR; everything left flushes.
        for side in 0..2 {
            self.ep[side]
                .to_error(&mut self.fabric)
                .map_err(|e| self.violation(format!("modify to ERR: {e}")))?;
            self.recv_flushing[side] = true;
        }
        while self.fabric.step() {
            self.after_step()?;
        }
        self.check_cqs()?;
        self.check_teardown()?;
        Ok(Report {
            steps: self.steps,
            end_ns: self.fabric.now(),
            stats: self.fabric.stats().clone(),
            engine: [0, 1].map(|i| self.fabric.core(NodeId(i)).counters().clone()),
            failed: self.failed,
            failed_at: self.failed_at,
        })
    }

    fn after_step(&mut self) -> Result<(), Violation> {
        self.steps += 1;
        if self.steps > self.sc.max_steps {
            let e = self.fabric.livelock(self.steps);
            return Err(self.violation(e.to_string()));
        }
        // Virtual time that stops moving while events keep firing is a
        // livelock (a timer re-armed at the instant it fired), found here
        // long before the step bound.
        let now = self.fabric.now();
        if now == self.same_instant.1 {
            self.same_instant.0 += 1;
            if self.same_instant.0 > SAME_INSTANT_STEPS {
                let e = self.fabric.livelock(self.steps);
                return Err(self.violation(format!("{e} ({SAME_INSTANT_STEPS} steps at {now} ns)")));
            }
        } else {
            self.same_instant = (0, now);
        }
        self.check_cqs()
    }

    fn post_recv(&mut self, side: usize, k: usize) -> Result<(), Violation> {
        let r: &RecvPlan = &self.plan.recvs[side][k];
        let ep = &self.ep[side];
        let sgl: Vec<_> = r.sges.iter().map(|&(o, l)| ep.sge(o, l)).collect();
        let wr = RecvWr::new(k as u64, &sgl);
        let res = ep.post_recv(&mut self.fabric, &[wr]);
        if let Err(e) = res {
            // Posting to a QP in ERR succeeds (and flushes); any error is a bug.
            return Err(self.violation(format!("post_recv {k} on side {side}: {e:?}")));
        }
        self.recv_posted[side] += 1;
        Ok(())
    }

    fn post_op(&mut self, i: usize) -> Result<(), Violation> {
        let op = &self.plan.ops[i];
        let s = op.side.index();
        let (ep, peer) = (&self.ep[s], &self.ep[1 - s]);
        let sgl: Vec<_> = op.local.iter().map(|&(o, l)| ep.sge(o, l)).collect();
        let remote = peer.remote(op.remote_off);
        let sop = match op.kind {
            OpKind::Send => SendOp::Send,
            OpKind::SendImm => SendOp::SendWithImm { imm: op.imm },
            OpKind::Write => SendOp::Write { remote },
            OpKind::WriteImm => SendOp::WriteWithImm { remote, imm: op.imm },
            OpKind::Read => SendOp::Read { remote },
            OpKind::CompSwap => SendOp::CompareSwap {
                remote,
                compare: op.compare,
                swap: op.swap_add,
            },
            OpKind::FetchAdd => SendOp::FetchAdd {
                remote,
                add: op.swap_add,
            },
        };
        let mut flags = SendFlags::empty();
        if op.signaled {
            flags |= SendFlags::SIGNALED;
        }
        if op.fence {
            flags |= SendFlags::FENCE;
        }
        let wr = SendWr::new(i as u64, sop, &sgl).flags(flags);
        if let Err(e) = ep.post_send(&mut self.fabric, &[wr]) {
            return Err(self.violation(format!("post_send of op {i}: {e:?}")));
        }
        Ok(())
    }

    fn check_cqs(&mut self) -> Result<(), Violation> {
        // Receive CQs first: a send's receive CQE is produced before the
        // ACK that completes it leaves the responder.
        for side in 0..2 {
            let ep = &self.ep[side];
            if self.fabric.core(ep.node).cq_len(ep.recv_cq) > 0 {
                let wcs = self.ep[side].poll_recv(&mut self.fabric);
                for wc in wcs {
                    self.on_recv_cqe(side, &wc)?;
                }
            }
        }
        for side in 0..2 {
            let ep = &self.ep[side];
            if self.fabric.core(ep.node).cq_len(ep.send_cq) > 0 {
                let wcs = self.ep[side].poll_send(&mut self.fabric);
                for wc in wcs {
                    self.on_send_cqe(side, &wc)?;
                }
            }
        }
        Ok(())
    }

    fn expected_opcode(kind: OpKind) -> WcOpcode {
        match kind {
            OpKind::Send | OpKind::SendImm => WcOpcode::Send,
            OpKind::Write | OpKind::WriteImm => WcOpcode::RdmaWrite,
            OpKind::Read => WcOpcode::RdmaRead,
            OpKind::CompSwap => WcOpcode::CompSwap,
            OpKind::FetchAdd => WcOpcode::FetchAdd,
        }
    }

    fn on_send_cqe(&mut self, side: usize, wc: &WorkCompletion) -> Result<(), Violation> {
        let i = wc.wr_id as usize;
        let who = if side == 0 { "A" } else { "B" };
        let Some(op) = self.plan.ops.get(i).filter(|o| o.side.index() == side) else {
            return Err(self.violation(format!("side {who}: CQE with unknown wr_id {i}: {wc:?}")));
        };
        if wc.qp_num != self.ep[side].qpn {
            return Err(self.violation(format!("op {i}: CQE names QP {:#x}", wc.qp_num)));
        }
        let pos = self.pos[i];
        let next = self.send_next[side];
        if pos < next {
            return Err(self.violation(format!(
                "op {i} ({:?}) completed twice or out of order: {:?}",
                op.kind, wc.status
            )));
        }
        if let Some(f) = self.failed[side] {
            // After an error CQE everything flushes, each WR once, in order.
            if wc.status != WcStatus::WrFlushErr || pos != next {
                return Err(self.violation(format!(
                    "side {who}: after op {f} failed, op {i} completed with {:?} (expected the flush of op {})",
                    wc.status, self.order[side][next]
                )));
            }
            self.send_next[side] = pos + 1;
            return Ok(());
        }
        match wc.status {
            WcStatus::Success => {
                if !op.signaled {
                    return Err(self.violation(format!("unsignaled op {i} produced a success CQE")));
                }
                if wc.opcode != Self::expected_opcode(op.kind) {
                    return Err(self.violation(format!("op {i} ({:?}) completed with opcode {:?}", op.kind, wc.opcode)));
                }
                for p in next..=pos {
                    self.check_placed(self.order[side][p], i)?;
                }
                self.send_next[side] = pos + 1;
            }
            WcStatus::RetryExcErr if self.error_mode => {
                // Earlier WRs are implied successes.
                for p in next..pos {
                    self.check_placed(self.order[side][p], i)?;
                }
                self.failed[side] = Some(i);
                self.failed_at[side] = Some(self.fabric.now());
                self.send_next[side] = pos + 1;
            }
            st => {
                return Err(self.violation(format!(
                    "side {who}: op {i} ({:?}, {} bytes) completed with {st:?} (vendor_err {:#x}); \
                     the model expects {}",
                    op.kind,
                    op.len,
                    wc.vendor_err,
                    if self.error_mode {
                        "SUCCESS or RETRY_EXC_ERR"
                    } else {
                        "SUCCESS"
                    }
                )))
            }
        }
        Ok(())
    }

    /// Checks that op `i`'s data is in place (when the CQE of op `by` is
    /// polled).
    fn check_placed(&self, i: usize, by: usize) -> Result<(), Violation> {
        let op = &self.plan.ops[i];
        let s = op.side.index();
        let p = 1 - s;
        let got = match op.kind {
            OpKind::Write | OpKind::WriteImm => self.ep[p].read(op.remote_off as usize, op.len as usize),
            OpKind::Send | OpKind::SendImm => {
                let r = &self.plan.recvs[p][op.recv.expect("send has a receive")];
                gather_ep(&self.ep[p], &r.sges, op.payload.len())
            }
            OpKind::Read | OpKind::CompSwap | OpKind::FetchAdd => gather_ep(&self.ep[s], &op.local, op.payload.len()),
        };
        if got != op.payload {
            let at = got.iter().zip(&op.payload).position(|(a, b)| a != b).unwrap_or(0);
            return Err(self.violation(format!(
                "op {i} ({:?} by {:?}, {} bytes) is complete (CQE of op {by} polled) but its data is not in \
                 place: first wrong byte at +{at} ({:#04x}, expected {:#04x})",
                op.kind,
                op.side,
                op.len,
                got.get(at).copied().unwrap_or(0),
                op.payload.get(at).copied().unwrap_or(0)
            )));
        }
        if op.kind.consumes_recv() && !self.recv_seen[i] {
            return Err(self.violation(format!(
                "op {i} ({:?}) is complete (CQE of op {by} polled) but the peer has no receive completion for it",
                op.kind
            )));
        }
        Ok(())
    }

    fn on_recv_cqe(&mut self, side: usize, wc: &WorkCompletion) -> Result<(), Violation> {
        let k = self.recv_done[side];
        if wc.wr_id as usize != k {
            return Err(self.violation(format!(
                "side {side}: receive CQE for wr_id {} but receive {k} is next ({:?})",
                wc.wr_id, wc.status
            )));
        }
        self.recv_done[side] += 1;
        let r = &self.plan.recvs[side][k];
        if wc.status == WcStatus::WrFlushErr {
            let qp_err = self.ep[side].state(&self.fabric) == QpState::Err;
            if !(self.recv_flushing[side] || qp_err) {
                return Err(self.violation(format!("receive {k} flushed while the QP is not in ERR")));
            }
            return Ok(());
        }
        let Some(i) = r.msg else {
            return Err(self.violation(format!(
                "side {side}: spare receive {k} completed with {:?}: a message was delivered twice",
                wc.status
            )));
        };
        let op = &self.plan.ops[i];
        if wc.status != WcStatus::Success {
            return Err(self.violation(format!(
                "receive {k} (op {i}, {:?}) completed with {:?}",
                op.kind, wc.status
            )));
        }
        let (opcode, imm) = match op.kind {
            OpKind::Send => (WcOpcode::Recv, None),
            OpKind::SendImm => (WcOpcode::Recv, Some(op.imm)),
            _ => (WcOpcode::RecvRdmaWithImm, Some(op.imm)),
        };
        let got_imm = wc.wc_flags.contains(WcFlags::WITH_IMM).then_some(wc.imm_data);
        if wc.opcode != opcode || wc.byte_len != op.len || got_imm != imm {
            return Err(self.violation(format!(
                "receive {k} for op {i} ({:?}): opcode {:?} byte_len {} imm {:?}; expected {opcode:?} {} {imm:?}",
                op.kind, wc.opcode, wc.byte_len, got_imm, op.len
            )));
        }
        // The data must be in place when the receive completes.
        let got = if op.kind == OpKind::WriteImm {
            self.ep[side].read(op.remote_off as usize, op.len as usize)
        } else {
            gather_ep(&self.ep[side], &r.sges, op.payload.len())
        };
        if got != op.payload {
            return Err(self.violation(format!(
                "receive {k} for op {i} ({:?}, {} bytes) completed but the data is wrong",
                op.kind, op.len
            )));
        }
        self.recv_seen[i] = true;
        Ok(())
    }

    /// On a fabric without faults, where no request was sent twice (no
    /// RNR retry either), so that no response answers a duplicate: each
    /// side's responses leave in PSN order. An ACK, NAK or read response
    /// never overtakes an earlier one of the same QP (which ACK coalescing
    /// could make happen, holding some back).
    fn check_response_order(&self) -> Result<(), Violation> {
        let sc = self.sc;
        if !sc.is_fault_free() {
            return Ok(());
        }
        let resent = |i: usize| {
            let c = self.fabric.core(NodeId(i)).counters();
            c.retransmits > 0 || c.rx_duplicates > 0
        };
        if resent(0) || resent(1) {
            return Ok(());
        }
        let log = self.responses.lock().unwrap_or_else(|e| e.into_inner());
        // Side A responds in B's request PSNs, and B in A's.
        for (side, first) in [(0, sc.qp.psn_b), (1, sc.qp.psn_a)] {
            let mut last = 0;
            for (k, &(_, psn)) in log.iter().filter(|(s, _)| *s == side).enumerate() {
                let rel = psn.wrapping_sub(first) & 0xff_ffff;
                if rel < last {
                    return Err(self.violation(format!(
                        "side {side}'s response {k} (PSN {psn:#x}) left after one for a later PSN \
                         (offset {last} from the first PSN, this one {rel})"
                    )));
                }
                last = rel;
            }
        }
        Ok(())
    }

    fn check_idle(&mut self) -> Result<(), Violation> {
        for side in 0..2 {
            let state = self.ep[side].state(&self.fabric);
            let all = self.order[side].len();
            if self.failed[side].is_some() {
                if state != QpState::Err {
                    return Err(self.violation(format!("side {side} failed but its QP is {state}")));
                }
            } else if state != QpState::Rts {
                return Err(self.violation(format!(
                    "side {side} saw no error but its QP is {state} (only the requester that failed may leave RTS)"
                )));
            }
            if self.send_next[side] != all {
                let i = self.order[side][self.send_next[side]];
                let op = &self.plan.ops[i];
                return Err(self.violation(format!(
                    "idle, but side {side}'s op {i} ({:?}, {} bytes) never completed ({} of {all} done)",
                    op.kind, op.len, self.send_next[side]
                )));
            }
        }
        if !self.error_mode {
            for side in 0..2 {
                let msgs = self.plan.recvs[side].iter().filter(|r| r.msg.is_some()).count();
                if self.recv_done[side] != msgs {
                    return Err(self.violation(format!(
                        "idle, but side {side} has {} of {msgs} message receives completed",
                        self.recv_done[side]
                    )));
                }
                let got = self.ep[side].read(0, self.plan.expect[side].len());
                if got != self.plan.expect[side] {
                    let at = got
                        .iter()
                        .zip(&self.plan.expect[side])
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    return Err(self.violation(format!(
                        "final memory of side {side} differs from the model at +{at} ({}): {:#04x}, expected {:#04x}",
                        self.plan.describe_offset(side, at),
                        got[at],
                        self.plan.expect[side][at]
                    )));
                }
            }
        } else {
            self.check_error_mode_memory()?;
        }
        Ok(())
    }

    /// Under a permanent partition: the source regions are untouched and
    /// each counter holds the model's value after some prefix of its
    /// atomics, at least as long as the ones reported successful.
    fn check_error_mode_memory(&self) -> Result<(), Violation> {
        for side in 0..2 {
            let src = self.ep[side].read(0, self.plan.src_len);
            if src != self.plan.init[side][..self.plan.src_len] {
                return Err(self.violation(format!("side {side}'s source region changed")));
            }
            let peer = 1 - side;
            for k in 0..COUNTERS {
                let atomics: Vec<usize> = self
                    .plan
                    .ops
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| o.side.index() == peer && o.kind.is_atomic() && o.counter == k)
                    .map(|(i, _)| i)
                    .collect();
                let succeeded = |i: usize| {
                    self.pos[i] < self.send_next[peer] && self.failed[peer].is_none_or(|f| self.pos[i] < self.pos[f])
                };
                let done = atomics.iter().filter(|&&i| succeeded(i)).count();
                let actual = self.ep[side].load_u64(self.plan.counters_off + 8 * k);
                let ok = (done..=atomics.len()).any(|n| self.plan.counter_after(side, k, n) == actual);
                if !ok {
                    return Err(self.violation(format!(
                        "side {side}'s counter {k} is {actual:#x}, not the result of any prefix of its {} atomics \
                         (at least {done} of which succeeded)",
                        atomics.len()
                    )));
                }
            }
        }
        Ok(())
    }

    fn check_teardown(&self) -> Result<(), Violation> {
        for side in 0..2 {
            if self.send_next[side] != self.order[side].len() {
                return Err(self.violation(format!(
                    "after teardown side {side} has {} of {} WRs completed",
                    self.send_next[side],
                    self.order[side].len()
                )));
            }
            if self.recv_done[side] != self.recv_posted[side] {
                return Err(self.violation(format!(
                    "after teardown side {side} has {} of {} receives completed",
                    self.recv_done[side], self.recv_posted[side]
                )));
            }
        }
        Ok(())
    }
}

fn gather_ep(ep: &Endpoint, pieces: &[(u64, u32)], want: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(want);
    for &(off, len) in pieces {
        if v.len() >= want {
            break;
        }
        let n = (len as usize).min(want - v.len());
        v.extend_from_slice(&ep.read(off as usize, n));
    }
    v
}
