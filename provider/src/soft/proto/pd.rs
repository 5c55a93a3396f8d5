//! Protection domains and address handles (`ibv_alloc_pd`, `ibv_create_ah`),
//! and the address-vector checks that QPs share with address handles.

use crate::verbs::{verr, AhAttr, Gid, Result};

use super::Core;

/// A protection domain id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);
/// An address handle id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhId(pub u32);

/// A protection domain; `owner` is the context that allocated it.
#[derive(Debug, Default)]
pub(super) struct PdEntry {
    #[allow(dead_code)] // kept for hotplug: objects are reported per context
    owner: u32,
}

#[derive(Debug)]
pub(super) struct AhEntry {
    pd: PdId,
}

impl Core {
    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    ///
    /// `ENOMEM` at `max_pd`.
    pub fn alloc_pd(&mut self, owner: u32) -> Result<PdId> {
        self.live(crate::verbs::Verb::AllocPd)?;
        if self.pds.live() >= self.cfg.attr.max_pd {
            return Err(verr!(
                AllocPd,
                NoMemory,
                "device limit of {} PDs reached",
                self.cfg.attr.max_pd
            ));
        }
        Ok(PdId(self.pds.insert(PdEntry { owner })))
    }

    /// `ibv_dealloc_pd`.
    ///
    /// # Errors
    ///
    /// `EBUSY` while MRs, QPs, SRQs or AHs use the PD; `EINVAL` if unknown.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        if self.revoked {
            // Destroy after removal always succeeds (docs/design.md §5).
            self.pds.remove(pd.0);
            return Ok(());
        }
        if self.pds.get(pd.0).is_none() {
            return Err(verr!(DeallocPd, InvalidArgument, "no such PD"));
        }
        let in_use = self.mrs.uses_pd(pd)
            || self.qps.iter().any(|(_, q)| q.pd == pd)
            || self.srqs.iter().any(|(_, s)| s.pd == pd)
            || self.ahs.iter().any(|(_, a)| a.pd == pd);
        if in_use && !self.revoked {
            return Err(verr!(DeallocPd, Busy, "the PD still has MRs, QPs, SRQs or AHs"));
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    pub(super) fn check_pd(&self, verb: crate::verbs::Verb, pd: PdId) -> Result<()> {
        match self.pds.get(pd.0) {
            Some(_) => Ok(()),
            None => Err(crate::verbs::Error::new(
                verb,
                crate::verbs::ErrorKind::InvalidArgument,
                "the PD was deallocated",
            )),
        }
    }

    /// `ibv_create_ah`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad port, a non-global AV (RoCE needs a GRH) or an
    /// unpopulated source GID; `ENOMEM` at `max_ah`.
    pub fn create_ah(&mut self, pd: PdId, attr: &AhAttr) -> Result<AhId> {
        self.live(crate::verbs::Verb::CreateAh)?;
        self.check_pd(crate::verbs::Verb::CreateAh, pd)?;
        self.check_av(attr)
            .map_err(|e| e.with_verb(crate::verbs::Verb::CreateAh))?;
        if self.ahs.live() >= self.cfg.attr.max_ah {
            return Err(verr!(
                CreateAh,
                NoMemory,
                "device limit of {} AHs reached",
                self.cfg.attr.max_ah
            ));
        }
        Ok(AhId(self.ahs.insert(AhEntry { pd })))
    }

    /// `ibv_destroy_ah`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if unknown.
    pub fn destroy_ah(&mut self, ah: AhId) -> Result<()> {
        if self.revoked {
            self.ahs.remove(ah.0);
            return Ok(());
        }
        self.ahs
            .remove(ah.0)
            .map(|_| ())
            .ok_or_else(|| verr!(DestroyAh, InvalidArgument, "no such AH"))
    }

    pub(crate) fn check_av(&self, av: &AhAttr) -> Result<()> {
        if av.port_num != 1 {
            return Err(verr!(
                ModifyQp,
                InvalidArgument,
                "address vector port {} does not exist",
                av.port_num
            ));
        }
        if !av.is_global {
            return Err(verr!(
                ModifyQp,
                InvalidArgument,
                "RoCE address vectors need a GRH (is_global)"
            ));
        }
        let sgid = self
            .cfg
            .gids
            .get(av.grh.sgid_index as usize)
            .copied()
            .unwrap_or(Gid::ZERO);
        if sgid.is_zero() {
            return Err(verr!(
                ModifyQp,
                InvalidArgument,
                "source GID index {} is not populated",
                av.grh.sgid_index
            ));
        }
        if av.grh.dgid.is_zero() {
            return Err(verr!(ModifyQp, InvalidArgument, "destination GID is zero"));
        }
        Ok(())
    }
}
