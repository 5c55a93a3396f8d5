//! Random verbs programs on a two-node fabric, run against a reference
//! model.
//!
//! A [`Scenario`] is a seed, a [`Program`] (work requests of mixed opcodes
//! posted by either side of one connected QP pair, at given times), the QP
//! options, the two link directions and their faults, and partitions. It
//! runs to idle and checks, as it goes and at the end:
//!
//! - **memory**: both sides' final memory equals the reference model's
//!   (writes, sends, reads and atomic results land where and as the model
//!   says, and nothing else changes);
//! - **exactly once**: every posted WR completes exactly once: a CQE when
//!   signaled or failed, an unsignaled success implied by a later CQE;
//!   receives too, after a teardown that flushes;
//! - **statuses**: with healing faults everything succeeds; under a
//!   permanent partition a side's CQEs are successes, one RETRY_EXC_ERR,
//!   then WR_FLUSH_ERR, and a side without a failure stays in RTS;
//! - **atomics** are linearizable: each one returns the value the sequential
//!   model (post order) predicts and the counters end at the model's values
//!   (so a re-executed duplicate shows up);
//! - **placement before completion**: when a requester CQE is polled, the
//!   data of that WR and every earlier one is already in the target memory
//!   (and a send's receive CQE exists); when a write-with-immediate's
//!   receive CQE is polled, its data is in place.
//! - **response order**: without faults and retransmissions, each side's
//!   responses (ACKs, NAKs, read and atomic responses) leave in PSN order.

mod plan;
mod random;
mod run;

use softverbs::soft::proto::Nanos;
use std::fmt;

pub use random::GenLimits;
pub use run::Report;

use super::conn::QpOptions;
use super::link::LinkConfig;

/// The side of the QP pair that posts a WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Node 0.
    A,
    /// Node 1.
    B,
}

impl Side {
    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    /// 0 for A, 1 for B.
    pub fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
}

/// The operation of a WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Send.
    Send,
    /// Send with immediate.
    SendImm,
    /// RDMA write.
    Write,
    /// RDMA write with immediate.
    WriteImm,
    /// RDMA read.
    Read,
    /// Atomic compare and swap.
    CompSwap,
    /// Atomic fetch and add.
    FetchAdd,
}

impl OpKind {
    /// Every kind.
    pub const ALL: [OpKind; 7] = [
        OpKind::Send,
        OpKind::SendImm,
        OpKind::Write,
        OpKind::WriteImm,
        OpKind::Read,
        OpKind::CompSwap,
        OpKind::FetchAdd,
    ];

    /// Whether the WR consumes a receive WQE at the peer.
    pub fn consumes_recv(self) -> bool {
        matches!(self, OpKind::Send | OpKind::SendImm | OpKind::WriteImm)
    }

    /// Whether the WR is an atomic.
    pub fn is_atomic(self) -> bool {
        matches!(self, OpKind::CompSwap | OpKind::FetchAdd)
    }

    /// Whether the WR carries its payload to the peer (send or write).
    pub fn carries_payload(self) -> bool {
        matches!(self, OpKind::Send | OpKind::SendImm | OpKind::Write | OpKind::WriteImm)
    }
}

/// Atomic counters each side exposes to its peer.
pub const COUNTERS: usize = 4;

/// One work request of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Who posts it.
    pub side: Side,
    /// What it does.
    pub kind: OpKind,
    /// Lengths of the local SGEs (the message length is their sum; atomics
    /// use one 8-byte SGE instead).
    pub sges: Vec<u32>,
    /// Signaled.
    pub signaled: bool,
    /// IBV_SEND_FENCE.
    pub fence: bool,
    /// For a fenced send or write: send the buffer the most recent earlier
    /// read (of this side) landed in, instead of `sges`. The fence is what
    /// makes that buffer hold the read's data when the WR starts.
    pub from_read: bool,
    /// Sends: the receive buffer is split into this many SGEs (at least 1).
    pub recv_sges: u8,
    /// Sends: bytes of room beyond the message in the receive buffer.
    pub recv_slack: u16,
    /// Atomics: which of the peer's [`COUNTERS`].
    pub counter: u8,
    /// Fetch-and-add: the addend; compare-and-swap: the swap value.
    pub operand: u64,
    /// Compare-and-swap: compare with the counter's current (model) value,
    /// so the swap happens; otherwise with a different value.
    pub cas_hit: bool,
    /// Post this long after the previous WR (0: at the same time).
    pub gap_ns: Nanos,
}

impl Op {
    /// A signaled, unfenced WR of `kind` by `side` with one SGE of `len`
    /// bytes, posted with the previous one.
    pub fn new(side: Side, kind: OpKind, len: u32) -> Op {
        Op {
            side,
            kind,
            sges: vec![len],
            signaled: true,
            fence: false,
            from_read: false,
            recv_sges: 1,
            recv_slack: 0,
            counter: 0,
            operand: 1,
            cas_hit: true,
            gap_ns: 0,
        }
    }
}

/// A program: WRs in post order, and how receives are posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The WRs, in post order.
    pub ops: Vec<Op>,
    /// Receives each side posts before anything is sent; the rest follow
    /// one every `recv_interval_ns` (so sends meet RNR NAKs meanwhile).
    pub prepost: u32,
    /// Interval of the late receives.
    pub recv_interval_ns: Nanos,
    /// Receives each side posts beyond what the peer's messages consume
    /// (flushed at teardown).
    pub extra_recvs: u8,
}

/// A partition between the two nodes: from `start` for `duration` (`None`:
/// for good, the peer is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// When it starts.
    pub start: Nanos,
    /// How long it lasts.
    pub duration: Option<Nanos>,
}

/// A complete, reproducible run: see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Seed of the fabric (faults, engine key bytes, memory contents).
    /// With an odd seed both nodes send large messages from shareable
    /// buffers as trains; bits 1 and 2 choose each node's loss recovery
    /// ([`recoveries`]); with bit 3 set both nodes coalesce ACKs
    /// (`NodeConfig::coalesce_acks`).
    pub seed: u64,
    /// The program.
    pub program: Program,
    /// QP options (both sides).
    pub qp: QpOptions,
    /// Link A → B.
    pub link_ab: LinkConfig,
    /// Link B → A.
    pub link_ba: LinkConfig,
    /// Partitions.
    pub cuts: Vec<Cut>,
    /// Step bound (livelock detection).
    pub max_steps: u64,
}

impl Scenario {
    /// Whether a partition never heals (errors are then expected).
    pub fn has_permanent_cut(&self) -> bool {
        self.cuts.iter().any(|c| c.duration.is_none())
    }

    /// Whether neither link has faults and no partition cuts them.
    pub fn is_fault_free(&self) -> bool {
        use super::link::FaultModel;
        self.link_ab.faults == FaultModel::NONE && self.link_ba.faults == FaultModel::NONE && self.cuts.is_empty()
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The scenario's seed.
    pub seed: u64,
    /// Virtual time of the check that failed.
    pub time: Nanos,
    /// What is wrong.
    pub what: String,
    /// The end of the packet log, if the run was traced.
    pub trace_tail: Option<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {:#x}, at {}: {}",
            self.seed,
            super::trace::fmt_time(self.time),
            self.what
        )?;
        if let Some(t) = &self.trace_tail {
            write!(f, "\npacket log (end):\n{t}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

/// The loss recovery of nodes a and b in a scenario with this seed: bits
/// 1 and 2 pick selective repeat on both, go-back-N on both, or one of
/// each (a selective-repeat node against a go-back-N one), so that every
/// property runs over all four pairs.
pub fn recoveries(seed: u64) -> (softverbs::soft::proto::Recovery, softverbs::soft::proto::Recovery) {
    use softverbs::soft::proto::Recovery::{GoBackN, SelectiveRepeat};
    match (seed >> 1) & 3 {
        0 => (SelectiveRepeat, SelectiveRepeat),
        1 => (GoBackN, GoBackN),
        2 => (SelectiveRepeat, GoBackN),
        _ => (GoBackN, SelectiveRepeat),
    }
}
