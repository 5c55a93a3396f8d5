//! Shared receive queues, with the limit event (`ibv_modify_srq(3)`).

use std::collections::VecDeque;

use crate::verbs::{verr, Result, SrqAttr, SrqAttrMask};

use super::qp::RecvWqe;
use super::{Core, PdId};

/// A shared receive queue id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pd: PdId,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    /// Armed limit (0 = disarmed).
    pub(crate) limit: u32,
    pub(crate) queue: VecDeque<RecvWqe>,
    pub(crate) users: u32,
    pub(crate) context: u64,
    pub(crate) owner: u32,
}

impl Srq {
    pub(crate) fn new(pd: PdId, attr: SrqAttr, context: u64, owner: u32) -> Srq {
        Srq {
            pd,
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
            queue: VecDeque::new(),
            users: 0,
            context,
            owner,
        }
    }

    pub(crate) fn attr(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.limit,
        }
    }

    pub(crate) fn modify(&mut self, attr: &SrqAttr, mask: SrqAttrMask, max_srq_wr: u32) -> Result<()> {
        // Check everything first: an invalid modify changes nothing.
        let new_max = if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr == 0 || attr.max_wr > max_srq_wr || (attr.max_wr as usize) < self.queue.len() {
                return Err(verr!(
                    ModifySrq,
                    InvalidArgument,
                    "max_wr {} must be in 1..={max_srq_wr} and hold the {} posted WRs",
                    attr.max_wr,
                    self.queue.len()
                ));
            }
            attr.max_wr
        } else {
            self.max_wr
        };
        if mask.contains(SrqAttrMask::LIMIT) && attr.srq_limit > new_max {
            return Err(verr!(
                ModifySrq,
                InvalidArgument,
                "srq_limit {} above max_wr {new_max}",
                attr.srq_limit
            ));
        }
        self.max_wr = new_max;
        if mask.contains(SrqAttrMask::LIMIT) {
            self.limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Takes the next receive; returns it and whether the limit event fires
    /// (the count dropped below an armed limit, which disarms it).
    pub(crate) fn pop(&mut self) -> Option<(RecvWqe, bool)> {
        let w = self.queue.pop_front()?;
        let fire = self.limit > 0 && (self.queue.len() as u32) < self.limit;
        if fire {
            self.limit = 0;
        }
        Some((w, fire))
    }
}

impl Core {
    /// `ibv_create_srq`: returns the id and the granted attributes.
    ///
    /// # Errors
    ///
    /// `EINVAL` beyond `max_srq_wr`/`max_srq_sge` or a limit above the
    /// depth; `ENOMEM` at `max_srq`.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr, context: u64, owner: u32) -> Result<(SrqId, SrqAttr)> {
        self.live(crate::verbs::Verb::CreateSrq)?;
        self.check_pd(crate::verbs::Verb::CreateSrq, pd)?;
        let a = &self.cfg.attr;
        if attr.max_wr == 0 || attr.max_wr > a.max_srq_wr || attr.max_sge == 0 || attr.max_sge > a.max_srq_sge {
            return Err(verr!(
                CreateSrq,
                InvalidArgument,
                "max_wr {} / max_sge {} outside 1..={} / 1..={}",
                attr.max_wr,
                attr.max_sge,
                a.max_srq_wr,
                a.max_srq_sge
            ));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(verr!(CreateSrq, InvalidArgument, "srq_limit above max_wr"));
        }
        if self.srqs.live() >= a.max_srq {
            return Err(verr!(CreateSrq, NoMemory, "device limit of {} SRQs reached", a.max_srq));
        }
        let srq = Srq::new(pd, attr, context, owner);
        let granted = srq.attr();
        Ok((SrqId(self.srqs.insert(srq)), granted))
    }

    /// `ibv_modify_srq`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a limit above the depth, a resize below the queued
    /// count or above `max_srq_wr`.
    pub fn modify_srq(&mut self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.live(crate::verbs::Verb::ModifySrq)?;
        let max = self.cfg.attr.max_srq_wr;
        let s = self
            .srqs
            .get_mut(srq.0)
            .ok_or_else(|| verr!(ModifySrq, InvalidArgument, "no such SRQ"))?;
        s.modify(attr, mask, max)
    }

    /// `ibv_query_srq`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if unknown.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr> {
        self.srqs
            .get(srq.0)
            .map(|s| s.attr())
            .ok_or_else(|| verr!(QuerySrq, InvalidArgument, "no such SRQ"))
    }

    /// `ibv_destroy_srq`.
    ///
    /// # Errors
    ///
    /// `EBUSY` while QPs use it.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        if self.revoked {
            self.srqs.remove(srq.0);
            return Ok(());
        }
        match self.srqs.get(srq.0) {
            None => Err(verr!(DestroySrq, InvalidArgument, "no such SRQ")),
            Some(s) if s.users > 0 && !self.revoked => {
                Err(verr!(DestroySrq, Busy, "{} QP(s) still use this SRQ", s.users))
            }
            Some(_) => {
                self.srqs.remove(srq.0);
                Ok(())
            }
        }
    }

    /// `ibv_post_srq_recv`.
    ///
    /// # Errors
    ///
    /// The first rejected WR: `EINVAL` for too many SGEs or an inline-only
    /// SGE, `ENOMEM` when the SRQ is full.
    pub fn post_srq_recv(
        &mut self,
        srq: super::SrqId,
        wrs: &[crate::verbs::RecvWr<'_>],
    ) -> std::result::Result<(), crate::verbs::PostError> {
        use crate::verbs::{Error, ErrorKind, PostError, Verb};
        let Some(s) = self.srqs.get_mut(srq.0) else {
            return Err(PostError {
                index: 0,
                error: Error::new(Verb::PostSrqRecv, ErrorKind::InvalidArgument, "no such SRQ"),
            });
        };
        for (i, wr) in wrs.iter().enumerate() {
            let bad = |kind, detail: String| PostError {
                index: i,
                error: Error::new(Verb::PostSrqRecv, kind, detail),
            };
            if wr.sg_list.len() > s.max_sge as usize {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    format!("{} SGEs exceed max_sge {}", wr.sg_list.len(), s.max_sge),
                ));
            }
            if wr.sg_list.iter().any(|e| e.is_inline_only()) {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    "a receive cannot use an inline-only SGE".into(),
                ));
            }
            if s.queue.len() >= s.max_wr as usize {
                return Err(bad(ErrorKind::NoMemory, format!("SRQ full ({} WRs)", s.max_wr)));
            }
            s.queue.push_back(RecvWqe::new(wr, Vec::new()));
        }
        Ok(())
    }
}
