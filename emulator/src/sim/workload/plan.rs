//! The reference model of a program: where every buffer lives, what every
//! WR must deliver, and both sides' memory if everything succeeds.

use super::{OpKind, Program, Side, COUNTERS};
use crate::sim::rng::SimRng;

/// A range of an endpoint's memory: (offset, length).
pub(super) type Piece = (u64, u32);

/// What the model says about one WR.
#[derive(Debug, Clone)]
pub(super) struct OpPlan {
    pub(super) side: Side,
    pub(super) kind: OpKind,
    pub(super) signaled: bool,
    pub(super) fence: bool,
    /// Local SGEs: the payload's source (sends, writes), the landing
    /// buffer (reads) or the 8-byte result (atomics).
    pub(super) local: Vec<Piece>,
    /// Write target, read source or atomic counter in the peer's memory.
    pub(super) remote_off: u64,
    /// Message length (atomics: 8).
    pub(super) len: u32,
    /// What must land: the payload (sends, writes), the data read, or the
    /// atomic's original value (8 bytes, host order).
    pub(super) payload: Vec<u8>,
    /// Index of the receive WQE (in the peer's receive list) it consumes.
    pub(super) recv: Option<usize>,
    pub(super) imm: u32,
    pub(super) compare: u64,
    pub(super) swap_add: u64,
    /// Atomics: the counter index.
    pub(super) counter: usize,
}

/// A receive WQE: its buffer and the message (op index) it is for.
#[derive(Debug, Clone)]
pub(super) struct RecvPlan {
    pub(super) sges: Vec<Piece>,
    pub(super) msg: Option<usize>,
}

/// Layout, expected results and expected final memory.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) src_len: usize,
    pub(super) counters_off: usize,
    pub(super) init: [Vec<u8>; 2],
    pub(super) expect: [Vec<u8>; 2],
    pub(super) ops: Vec<OpPlan>,
    /// Receives each side posts, in order.
    pub(super) recvs: [Vec<RecvPlan>; 2],
    pub(super) counter_init: [[u64; COUNTERS]; 2],
}

fn split(rng: &mut SimRng, total: u32, parts: usize) -> Vec<u32> {
    let parts = parts.max(1);
    let mut cuts: Vec<u32> = (1..parts).map(|_| rng.below(u64::from(total) + 1) as u32).collect();
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(parts);
    let mut prev = 0;
    for c in cuts {
        out.push(c - prev);
        prev = c;
    }
    out.push(total - prev);
    out
}

fn gather(mem: &[u8], pieces: &[Piece]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(off, len) in pieces {
        v.extend_from_slice(&mem[off as usize..off as usize + len as usize]);
    }
    v
}

pub(super) fn scatter(mem: &mut [u8], pieces: &[Piece], data: &[u8]) {
    let mut done = 0usize;
    for &(off, len) in pieces {
        if done == data.len() {
            break;
        }
        let n = (len as usize).min(data.len() - done);
        mem[off as usize..off as usize + n].copy_from_slice(&data[done..done + n]);
        done += n;
    }
}

impl Plan {
    pub(super) fn build(seed: u64, program: &Program) -> Plan {
        let mut rng = SimRng::derive(seed, 0x9a1);
        // The source region holds every send/write SGE and every read.
        let max_sge = program
            .ops
            .iter()
            .map(|o| match o.kind {
                OpKind::Read => o.sges.iter().sum(),
                _ => o.sges.iter().copied().max().unwrap_or(0),
            })
            .max()
            .unwrap_or(0) as usize;
        let src_len = max_sge.max(4096).div_ceil(8) * 8;
        let counters_off = src_len;
        let landing = counters_off + 8 * COUNTERS;
        let mut cursor = [landing, landing];
        let mut alloc = |side: usize, len: usize, align: usize| -> u64 {
            let at = cursor[side].div_ceil(align) * align;
            cursor[side] = at + len;
            at as u64
        };
        // Source regions and counters are known up front; landing areas are
        // filled once their size is known.
        let mut src = [vec![0u8; src_len], vec![0u8; src_len]];
        for s in &mut src {
            rng.fill(s);
        }
        let mut counter_init = [[0u64; COUNTERS]; 2];
        for side in &mut counter_init {
            for c in side.iter_mut() {
                // Small values half the time, so compare-and-swap misses and
                // fetch-and-add wrap both get exercised.
                *c = if rng.chance(0.5) {
                    rng.below(100)
                } else {
                    rng.next_u64()
                };
            }
        }
        let mut counters = counter_init;
        let mut ops = Vec::with_capacity(program.ops.len());
        let mut recvs: [Vec<RecvPlan>; 2] = [Vec::new(), Vec::new()];
        let mut last_read: [Option<usize>; 2] = [None, None];
        let last_of_side = [Side::A, Side::B].map(|s| program.ops.iter().rposition(|o| o.side == s));
        for (i, op) in program.ops.iter().enumerate() {
            let s = op.side.index();
            let p = op.side.peer().index();
            let mut plan = OpPlan {
                side: op.side,
                kind: op.kind,
                // The last WR of each side is signaled, so every success is
                // reported or implied.
                signaled: op.signaled || last_of_side[s] == Some(i),
                fence: op.fence,
                local: Vec::new(),
                remote_off: 0,
                len: 0,
                payload: Vec::new(),
                recv: None,
                imm: 0xa000_0000 | i as u32,
                compare: 0,
                swap_add: 0,
                counter: 0,
            };
            match op.kind {
                OpKind::Send | OpKind::SendImm | OpKind::Write | OpKind::WriteImm => {
                    match last_read[s].filter(|_| op.fence && op.from_read) {
                        Some(r) => {
                            let read: &OpPlan = &ops[r];
                            plan.local = read.local.clone();
                            plan.payload = read.payload.clone();
                        }
                        None => {
                            for &len in &op.sges {
                                let off = rng.below((src_len - len as usize) as u64 + 1);
                                plan.local.push((off, len));
                            }
                            plan.payload = gather(&src[s], &plan.local);
                        }
                    }
                    plan.len = plan.payload.len() as u32;
                    if matches!(op.kind, OpKind::Write | OpKind::WriteImm) {
                        plan.remote_off = alloc(p, plan.len as usize, 1);
                    }
                    if op.kind.consumes_recv() {
                        let room = if op.kind == OpKind::WriteImm {
                            u32::from(op.recv_slack)
                        } else {
                            plan.len + u32::from(op.recv_slack)
                        };
                        let parts = split(&mut rng, room, usize::from(op.recv_sges));
                        let sges = parts.iter().map(|&l| (alloc(p, l as usize, 1), l)).collect();
                        plan.recv = Some(recvs[p].len());
                        recvs[p].push(RecvPlan { sges, msg: Some(i) });
                    }
                }
                OpKind::Read => {
                    let len: u32 = op.sges.iter().sum();
                    plan.len = len;
                    plan.remote_off = rng.below((src_len - len as usize) as u64 + 1);
                    plan.payload = src[p][plan.remote_off as usize..plan.remote_off as usize + len as usize].to_vec();
                    for &l in &op.sges {
                        plan.local.push((alloc(s, l as usize, 1), l));
                    }
                    last_read[s] = Some(i);
                }
                OpKind::CompSwap | OpKind::FetchAdd => {
                    let k = usize::from(op.counter) % COUNTERS;
                    plan.counter = k;
                    plan.len = 8;
                    plan.remote_off = (counters_off + 8 * k) as u64;
                    plan.local.push((alloc(s, 8, 8), 8));
                    let orig = counters[p][k];
                    let new = if op.kind == OpKind::FetchAdd {
                        plan.swap_add = op.operand;
                        orig.wrapping_add(op.operand)
                    } else {
                        plan.swap_add = op.operand;
                        plan.compare = if op.cas_hit { orig } else { orig ^ (rng.next_u64() | 1) };
                        if plan.compare == orig {
                            op.operand
                        } else {
                            orig
                        }
                    };
                    counters[p][k] = new;
                    plan.payload = orig.to_ne_bytes().to_vec();
                }
            }
            ops.push(plan);
        }
        for (side, list) in recvs.iter_mut().enumerate() {
            for _ in 0..program.extra_recvs {
                let l = rng.range(0, 64) as u32;
                list.push(RecvPlan {
                    sges: vec![(alloc(side, l as usize, 1), l)],
                    msg: None,
                });
            }
        }
        let mut init = [Vec::new(), Vec::new()];
        for side in 0..2 {
            let len = cursor[side].div_ceil(8) * 8 + 8;
            let mut m = vec![0u8; len];
            rng.fill(&mut m);
            m[..src_len].copy_from_slice(&src[side]);
            for (k, c) in counter_init[side].iter().enumerate() {
                m[counters_off + 8 * k..counters_off + 8 * k + 8].copy_from_slice(&c.to_ne_bytes());
            }
            init[side] = m;
        }
        let mut expect = init.clone();
        for op in &ops {
            let s = op.side.index();
            let p = op.side.peer().index();
            match op.kind {
                OpKind::Write | OpKind::WriteImm => {
                    let at = op.remote_off as usize;
                    expect[p][at..at + op.payload.len()].copy_from_slice(&op.payload);
                }
                OpKind::Send | OpKind::SendImm => {
                    let r = &recvs[p][op.recv.expect("a send has a receive")];
                    scatter(&mut expect[p], &r.sges, &op.payload);
                }
                OpKind::Read | OpKind::CompSwap | OpKind::FetchAdd => {
                    scatter(&mut expect[s], &op.local, &op.payload);
                }
            }
        }
        for side in 0..2 {
            for (k, c) in counters[side].iter().enumerate() {
                expect[side][counters_off + 8 * k..counters_off + 8 * k + 8].copy_from_slice(&c.to_ne_bytes());
            }
        }
        Plan {
            src_len,
            counters_off,
            init,
            expect,
            ops,
            recvs,
            counter_init,
        }
    }

    /// The peer's counter `k` after the first `n` atomics that target it.
    pub(super) fn counter_after(&self, peer: usize, k: usize, n: usize) -> u64 {
        let mut v = self.counter_init[peer][k];
        for op in self
            .ops
            .iter()
            .filter(|o| o.side.peer().index() == peer && o.kind.is_atomic() && o.counter == k)
            .take(n)
        {
            v = if op.kind == OpKind::FetchAdd {
                v.wrapping_add(op.swap_add)
            } else if op.compare == v {
                op.swap_add
            } else {
                v
            };
        }
        v
    }

    /// Where offset `off` of `side`'s memory belongs, for reports.
    pub(super) fn describe_offset(&self, side: usize, off: usize) -> String {
        if off < self.src_len {
            return format!("source region (+{off})");
        }
        if off < self.counters_off + 8 * COUNTERS {
            return format!("atomic counter {}", (off - self.counters_off) / 8);
        }
        let hit = |pieces: &[Piece]| {
            pieces
                .iter()
                .any(|&(o, l)| (o as usize..o as usize + l as usize).contains(&off))
        };
        for (i, op) in self.ops.iter().enumerate() {
            let s = op.side.index();
            let in_remote = op.side.peer().index() == side
                && matches!(op.kind, OpKind::Write | OpKind::WriteImm)
                && (op.remote_off as usize..op.remote_off as usize + op.len as usize).contains(&off);
            let in_local = s == side && !op.kind.carries_payload() && hit(&op.local);
            if in_remote || in_local {
                return format!("target of op {i} ({:?} by {:?}, +{})", op.kind, op.side, off);
            }
        }
        for (k, r) in self.recvs[side].iter().enumerate() {
            if hit(&r.sges) {
                return format!("receive buffer {k} (for op {:?})", r.msg);
            }
        }
        format!("unallocated landing byte +{off}")
    }
}
