//! The ledgers of the hotplug stress test: per queue, what was posted and
//! not yet retired, checked against the verbs contract at every
//! completion (see the test's module docs), and the tally of a round.

use std::collections::VecDeque;

use softverbs::verbs::{Mr, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::{recv_slot, MSG, RECV_BIT};

/// The send queue of one QP: what was posted and not yet retired, in post
/// order, with whether it was signaled.
#[derive(Debug, Default)]
pub(super) struct SqLedger {
    pub(super) outstanding: VecDeque<(u64, bool)>,
    pub(super) next: u64,
    /// An error completion was seen: from now on only flushes, in order.
    pub(super) errored: bool,
    /// The highest sequence number that succeeded (explicitly or silently).
    pub(super) max_success: Option<u64>,
    pub(super) posted: u64,
    pub(super) completions: u64,
    pub(super) flushed: u64,
    pub(super) silent: u64,
}

/// The receive queue of one QP.
#[derive(Debug, Default)]
pub(super) struct RqLedger {
    pub(super) outstanding: VecDeque<u64>,
    pub(super) next: u64,
    pub(super) errored: bool,
    /// Messages delivered: the receives that succeeded carried the peer's
    /// send sequence numbers 0, 1, …, `delivered - 1`, in order.
    pub(super) delivered: u64,
    pub(super) posted: u64,
    pub(super) completions: u64,
    pub(super) flushed: u64,
}

/// What a round saw, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Tally {
    pub(super) posted: u64,
    pub(super) completions: u64,
    pub(super) flushed: u64,
    pub(super) silent: u64,
    pub(super) delivered: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.posted += o.posted;
        self.completions += o.completions;
        self.flushed += o.flushed;
        self.silent += o.silent;
        self.delivered += o.delivered;
    }
}

impl SqLedger {
    /// Takes one send completion. `removing`: a removal has begun.
    pub(super) fn complete(&mut self, wc: &WorkCompletion, removing: bool) -> Result<(), String> {
        self.completions += 1;
        let seq = wc.wr_id;
        let Some(pos) = self.outstanding.iter().position(|&(s, _)| s == seq) else {
            return Err(format!(
                "send wr {seq} completed ({}) but is not outstanding: a duplicate or never posted",
                wc.status
            ));
        };
        let signaled = self.outstanding[pos].1;
        if wc.status == WcStatus::Success {
            if self.errored {
                return Err(format!(
                    "send wr {seq} succeeded after an error completion on its queue"
                ));
            }
            if !signaled {
                return Err(format!("unsignaled send wr {seq} produced a success completion"));
            }
        } else {
            let allowed = wc.status == WcStatus::WrFlushErr || (!self.errored && wc.status == WcStatus::RetryExcErr);
            if !allowed {
                return Err(format!(
                    "send wr {seq} completed with {} (errored before: {})",
                    wc.status, self.errored
                ));
            }
            if !removing {
                return Err(format!(
                    "send wr {seq} completed with {} before any removal: {wc:?}",
                    wc.status
                ));
            }
            if self.errored && pos != 0 {
                return Err(format!(
                    "flushed send wr {seq} completed before {pos} earlier one(s) {:?}",
                    self.outstanding.iter().take(pos).collect::<Vec<_>>()
                ));
            }
            self.flushed += 1;
        }
        // Everything posted before it retired silently: it must have been
        // unsignaled (a signaled one owes a completion of its own) and it
        // succeeded.
        for _ in 0..pos {
            let (s, sig) = self.outstanding.pop_front().expect("pos < len");
            if sig {
                return Err(format!(
                    "signaled send wr {s} never completed, and wr {seq} after it did ({})",
                    wc.status
                ));
            }
            self.silent += 1;
            self.max_success = Some(s);
        }
        self.outstanding.pop_front();
        if wc.status == WcStatus::Success {
            self.max_success = Some(seq);
        } else {
            self.errored = true;
        }
        Ok(())
    }
}

impl RqLedger {
    /// Takes one receive completion; `mr` holds the receive slots.
    pub(super) fn complete(&mut self, wc: &WorkCompletion, removing: bool, mr: &Mr) -> Result<(), String> {
        self.completions += 1;
        let seq = wc.wr_id & !RECV_BIT;
        match self.outstanding.front() {
            Some(&s) if s == seq => {}
            _ => {
                return Err(match self.outstanding.iter().position(|&s| s == seq) {
                    Some(i) => format!("receive wr {seq} completed before {i} earlier one(s)"),
                    None => format!("receive wr {seq} completed twice or was never posted"),
                })
            }
        }
        self.outstanding.pop_front();
        match wc.status {
            WcStatus::Success => {
                if self.errored {
                    return Err(format!("receive wr {seq} succeeded after an error completion"));
                }
                if !wc.wc_flags.contains(WcFlags::WITH_IMM) {
                    return Err(format!("receive wr {seq} succeeded without immediate data: {wc:?}"));
                }
                let sent = u64::from(wc.imm_data);
                if sent != self.delivered {
                    return Err(format!(
                        "receive wr {seq} delivered the peer's send {sent}, expected {} (RC delivers in order, \
                         without gaps or repeats)",
                        self.delivered
                    ));
                }
                if wc.opcode == WcOpcode::Recv {
                    let got = mr.to_vec(recv_slot(seq), MSG as usize).map_err(|e| e.to_string())?;
                    if got != sent.to_le_bytes() {
                        return Err(format!("receive wr {seq} (peer's send {sent}) carried {got:?}"));
                    }
                } else if wc.opcode != WcOpcode::RecvRdmaWithImm {
                    return Err(format!("receive wr {seq} completed as {}", wc.opcode));
                }
                self.delivered += 1;
            }
            WcStatus::WrFlushErr if removing => {
                self.errored = true;
                self.flushed += 1;
            }
            s => {
                return Err(format!(
                    "receive wr {seq} completed with {s} (removal begun: {removing})"
                ))
            }
        }
        Ok(())
    }
}
