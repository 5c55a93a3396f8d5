//! Completion queues: a bounded FIFO of work completions with overflow
//! detection and one-shot notification (docs/design.md §3.4).

use std::collections::VecDeque;

use crate::verbs::{WcStatus, WorkCompletion};

/// Armed notification state (`ibv_req_notify_cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    Disarmed,
    /// Fire on the next completion.
    Next,
    /// Fire on the next solicited receive completion or any error.
    Solicited,
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) capacity: u32,
    pub(crate) queue: VecDeque<WorkCompletion>,
    /// Set on overrun: the CQ is unusable (CQ_ERR was raised).
    pub(crate) overrun: bool,
    pub(crate) arm: Arm,
    pub(crate) context: u64,
    pub(crate) owner: u32,
    /// QPs using this CQ (for EBUSY on destroy).
    pub(crate) users: u32,
}

/// What pushing a completion caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PushOutcome {
    /// The armed notification fired.
    pub(crate) notify: bool,
    /// The CQ just overran.
    pub(crate) overrun: bool,
}

impl Cq {
    pub(crate) fn new(capacity: u32, context: u64, owner: u32) -> Cq {
        Cq {
            capacity,
            queue: VecDeque::with_capacity(capacity.min(4096) as usize),
            overrun: false,
            arm: Arm::Disarmed,
            context,
            owner,
            users: 0,
        }
    }

    /// Appends a completion. `solicited` marks a receive completion of a
    /// message with the solicited-event bit.
    pub(crate) fn push(&mut self, wc: WorkCompletion, solicited: bool) -> PushOutcome {
        let mut out = PushOutcome::default();
        if self.overrun {
            return out;
        }
        if self.queue.len() >= self.capacity as usize {
            // IBTA 11.4.2.1 / ibv_create_cq(3): overrun is a CQ error; the
            // completion is lost and the CQ unusable, reported by CQ_ERR.
            self.overrun = true;
            out.overrun = true;
            return out;
        }
        let fire = match self.arm {
            Arm::Disarmed => false,
            Arm::Next => true,
            Arm::Solicited => solicited || wc.status != WcStatus::Success,
        };
        self.queue.push_back(wc);
        if fire {
            self.arm = Arm::Disarmed;
            out.notify = true;
        }
        out
    }

    pub(crate) fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        // One `pop_front` per completion: a `drain` (its iterator and the
        // fix-up when it is dropped) cost ~30 instructions per poll, most
        // of them for a single completion.
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(wc) = self.queue.pop_front() else { break };
            *slot = wc;
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status,
            ..WorkCompletion::default()
        }
    }

    #[test]
    fn fifo_and_overrun() {
        let mut cq = Cq::new(2, 0, 0);
        assert_eq!(cq.push(wc(1, WcStatus::Success), false), PushOutcome::default());
        cq.push(wc(2, WcStatus::Success), false);
        assert!(cq.push(wc(3, WcStatus::Success), false).overrun);
        assert!(cq.overrun);
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
    }

    #[test]
    fn notification_is_one_shot_and_solicited_filters() {
        let mut cq = Cq::new(8, 0, 0);
        cq.arm = Arm::Solicited;
        assert!(!cq.push(wc(1, WcStatus::Success), false).notify);
        assert!(cq.push(wc(2, WcStatus::RemAccessErr), false).notify);
        assert!(!cq.push(wc(3, WcStatus::RemAccessErr), false).notify, "one-shot");
        cq.arm = Arm::Next;
        assert!(cq.push(wc(4, WcStatus::Success), false).notify);
        cq.arm = Arm::Solicited;
        assert!(cq.push(wc(5, WcStatus::Success), true).notify);
    }
}
