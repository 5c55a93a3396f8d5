//! Completion queues: a bounded FIFO of work completions with overflow
//! detection and one-shot notification (docs/design.md §3.4).

use std::collections::VecDeque;

use crate::verbs::{verr, AsyncElement, AsyncEvent, EventType, Result, WcStatus, WorkCompletion};

use super::{Core, CoreEvent};

/// A completion queue id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

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

impl Core {
    /// `ibv_create_cq`: returns the id and the granted capacity.
    ///
    /// # Errors
    ///
    /// `EINVAL` for 0 or more than `max_cqe` entries; `ENOMEM` at `max_cq`.
    pub fn create_cq(&mut self, cqe: u32, context: u64, owner: u32) -> Result<(CqId, u32)> {
        self.live(crate::verbs::Verb::CreateCq)?;
        if cqe == 0 || cqe > self.cfg.attr.max_cqe {
            return Err(verr!(
                CreateCq,
                InvalidArgument,
                "cqe {cqe} not in 1..={}",
                self.cfg.attr.max_cqe
            ));
        }
        if self.cqs.live() >= self.cfg.attr.max_cq {
            return Err(verr!(
                CreateCq,
                NoMemory,
                "device limit of {} CQs reached",
                self.cfg.attr.max_cq
            ));
        }
        Ok((CqId(self.cqs.insert(Cq::new(cqe, context, owner))), cqe))
    }

    /// `ibv_destroy_cq`.
    ///
    /// # Errors
    ///
    /// `EBUSY` while a QP uses the CQ; `EINVAL` if unknown.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        if self.revoked {
            self.cqs.remove(cq.0);
            return Ok(());
        }
        match self.cqs.get(cq.0) {
            None => Err(verr!(DestroyCq, InvalidArgument, "no such CQ")),
            Some(c) if c.users > 0 && !self.revoked => {
                Err(verr!(DestroyCq, Busy, "{} QP(s) still use this CQ", c.users))
            }
            Some(_) => {
                self.cqs.remove(cq.0);
                Ok(())
            }
        }
    }

    /// `ibv_poll_cq`. Handing completions out lets the plain ACKs of the
    /// output now waiting be held back, with ACK coalescing on
    /// ([`Core::set_ack_coalescing`]).
    ///
    /// # Errors
    ///
    /// `EIO` once the CQ overran; `EINVAL` if unknown.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| verr!(PollCq, InvalidArgument, "no such CQ"))?;
        if c.overrun {
            return Err(verr!(
                PollCq,
                Io,
                "the CQ overran and is unusable (CQ_ERR was reported)"
            ));
        }
        let n = c.poll(out);
        if n > 0 {
            self.completions_handed_out();
        }
        Ok(n)
    }

    /// Number of completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqId) -> usize {
        self.cqs.get(cq.0).map_or(0, |c| c.queue.len())
    }

    /// `ibv_req_notify_cq`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if unknown.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<()> {
        self.live(crate::verbs::Verb::ReqNotifyCq)?;
        let c = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| verr!(ReqNotifyCq, InvalidArgument, "no such CQ"))?;
        c.arm = if solicited_only { Arm::Solicited } else { Arm::Next };
        Ok(())
    }

    /// `ibv_resize_cq`: returns the new capacity.
    ///
    /// # Errors
    ///
    /// `EINVAL` below the number of queued completions, 0, or above
    /// `max_cqe`.
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32) -> Result<u32> {
        self.live(crate::verbs::Verb::ResizeCq)?;
        let max = self.cfg.attr.max_cqe;
        let c = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| verr!(ResizeCq, InvalidArgument, "no such CQ"))?;
        if cqe == 0 || cqe > max || (cqe as usize) < c.queue.len() {
            return Err(verr!(
                ResizeCq,
                InvalidArgument,
                "cqe {cqe} must be in 1..={max} and hold the {} queued completions",
                c.queue.len()
            ));
        }
        c.capacity = cqe;
        Ok(cqe)
    }

    pub(crate) fn push_cqe(&mut self, cq: CqId, wc: WorkCompletion, solicited: bool) {
        let Some(c) = self.cqs.get_mut(cq.0) else { return };
        let out = c.push(wc, solicited);
        let (context, owner) = (c.context, c.owner);
        if out.notify {
            self.events.push_back(CoreEvent::CqNotify { cq });
        }
        if out.overrun {
            self.counters.cq_overruns += 1;
            self.push_async(
                Some(owner),
                AsyncEvent {
                    event_type: EventType::CqErr,
                    element: AsyncElement::Cq(context),
                },
            );
        }
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
