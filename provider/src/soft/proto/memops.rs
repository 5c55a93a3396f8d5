//! Memory management verbs and work requests: registration, re-registration,
//! fast registration (map + REG_MR), memory windows (type 1 by verb, type 2
//! by BIND_MW), and invalidation (LOCAL_INV, SEND_WITH_INV, dealloc)
//! (docs/design.md §3.1, §3.6; IBTA 10.6).

use std::sync::Arc;

use crate::soft::wire::Psn;
use crate::verbs::{verr, AccessFlags, MemorySource, MwType, QpState, QpType, RemoteAddr, Result, WcStatus};

use super::mr::{Backing, Binding, Mapping, Segment};
use super::qp::{LocalOp, Qp, SendWqe, WqeOp, WqeState};
use super::requester::vendor;
use super::{Core, Nanos, PdId};

/// Rights a window or fast registration may grant only if the underlying
/// MR allows local write (IBTA 10.6.3.2 / ibv_reg_mr(3)).
fn needs_local_write(access: AccessFlags) -> bool {
    access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
}

fn rkey_for(key: u32, access: AccessFlags) -> u32 {
    if access.intersects(AccessFlags::REMOTE) {
        key
    } else {
        0
    }
}

impl Core {
    /// `ibv_reg_mr`: returns `(lkey, rkey)`; the rkey is 0 without remote
    /// access (docs/design.md §3.1).
    ///
    /// # Errors
    ///
    /// `EINVAL` for access flags that break the registration rule or that
    /// the soft provider does not support (on-demand paging, zero-based);
    /// `ENOMEM` at `max_mr`.
    pub fn reg_mr(&mut self, pd: PdId, memory: Arc<MemorySource>, access: AccessFlags) -> Result<(u32, u32)> {
        self.live(crate::verbs::Verb::RegMr)?;
        self.check_pd(crate::verbs::Verb::RegMr, pd)?;
        Self::check_mr_access(crate::verbs::Verb::RegMr, access)?;
        if self.mrs.live() >= self.cfg.attr.max_mr {
            return Err(verr!(
                RegMr,
                NoMemory,
                "device limit of {} MRs reached",
                self.cfg.attr.max_mr
            ));
        }
        let iova = memory.addr();
        let len = memory.len() as u64;
        let key = self
            .mrs
            .insert(&mut self.rng, pd, access, iova, len, Backing::Plain(memory))
            .ok_or_else(|| verr!(RegMr, NoMemory, "MR key space exhausted"))?;
        Ok((key, rkey_for(key, access)))
    }

    fn check_mr_access(verb: crate::verbs::Verb, access: AccessFlags) -> Result<()> {
        if !access.is_valid_for_mr() {
            return Err(crate::verbs::Error::new(
                verb,
                crate::verbs::ErrorKind::InvalidArgument,
                "REMOTE_WRITE or REMOTE_ATOMIC requires LOCAL_WRITE (ibv_reg_mr(3))",
            ));
        }
        let unsupported = AccessFlags::ON_DEMAND | AccessFlags::ZERO_BASED | AccessFlags::HUGETLB;
        if access.intersects(unsupported) {
            return Err(crate::verbs::Error::new(
                verb,
                crate::verbs::ErrorKind::InvalidArgument,
                format!(
                    "access {:?} is not supported by the soft provider",
                    access & unsupported
                ),
            ));
        }
        Ok(())
    }

    /// `ibv_dereg_mr` (plain and fast-registration MRs). After it returns
    /// the engine never touches the memory.
    ///
    /// # Errors
    ///
    /// `EBUSY` while memory windows are bound to the MR; `EINVAL` for an
    /// unknown key or a window's key.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<()> {
        if self.revoked {
            // Destroy after removal always succeeds (docs/design.md §5).
            self.mrs.remove(lkey);
            return Ok(());
        }
        let e = self
            .mrs
            .get(lkey)
            .ok_or_else(|| verr!(DeregMr, InvalidArgument, "no MR with lkey {lkey:#x}"))?;
        if e.is_window() {
            return Err(verr!(DeregMr, InvalidArgument, "{lkey:#x} is a memory window"));
        }
        if e.windows > 0 && !self.revoked {
            return Err(verr!(
                DeregMr,
                Busy,
                "{} memory window(s) are bound to this MR",
                e.windows
            ));
        }
        self.mrs.remove(lkey);
        Ok(())
    }

    /// `ibv_rereg_mr`: new PD, access and/or translation (keys are kept).
    /// Traffic after the call sees the new rights. Returns `(lkey, rkey)`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an unknown key, bad access or a dead PD; `EBUSY` while
    /// windows are bound.
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdId>,
        access: Option<AccessFlags>,
        memory: Option<Arc<MemorySource>>,
    ) -> Result<(u32, u32)> {
        self.live(crate::verbs::Verb::ReregMr)?;
        if let Some(pd) = pd {
            self.check_pd(crate::verbs::Verb::ReregMr, pd)?;
        }
        if let Some(a) = access {
            Self::check_mr_access(crate::verbs::Verb::ReregMr, a)?;
        }
        let e = self
            .mrs
            .get_mut(lkey)
            .ok_or_else(|| verr!(ReregMr, InvalidArgument, "no MR with lkey {lkey:#x}"))?;
        if !matches!(e.backing, Backing::Plain(_)) {
            return Err(verr!(
                ReregMr,
                InvalidArgument,
                "only MRs from reg_mr can be re-registered"
            ));
        }
        if e.windows > 0 {
            return Err(verr!(
                ReregMr,
                Busy,
                "{} memory window(s) are bound to this MR",
                e.windows
            ));
        }
        if let Some(pd) = pd {
            e.pd = pd;
        }
        if let Some(a) = access {
            e.access = a;
        }
        if let Some(m) = memory {
            e.iova = m.addr();
            e.len = m.len() as u64;
            e.backing = Backing::Plain(m);
        }
        Ok((e.key, rkey_for(e.key, e.access)))
    }

    /// Allocates a FREE fast-registration MR able to map `max_pages` pages.
    /// Returns its key (lkey = rkey).
    ///
    /// # Errors
    ///
    /// `EINVAL` for 0 or more than `max_fast_reg_page_list_len` pages;
    /// `ENOMEM` at `max_mr`.
    pub fn alloc_fast_reg_mr(&mut self, pd: PdId, max_pages: u32) -> Result<u32> {
        self.live(crate::verbs::Verb::AllocMr)?;
        self.check_pd(crate::verbs::Verb::AllocMr, pd)?;
        let max = self.cfg.attr.max_fast_reg_page_list_len;
        if max_pages == 0 || max_pages > max {
            return Err(verr!(
                AllocMr,
                InvalidArgument,
                "max_pages {max_pages} not in 1..={max}"
            ));
        }
        if self.mrs.live() >= self.cfg.attr.max_mr {
            return Err(verr!(
                AllocMr,
                NoMemory,
                "device limit of {} MRs reached",
                self.cfg.attr.max_mr
            ));
        }
        let backing = Backing::FastReg {
            max_pages,
            valid: false,
            mapping: None,
        };
        self.mrs
            .insert(&mut self.rng, pd, AccessFlags::empty(), 0, 0, backing)
            .ok_or_else(|| verr!(AllocMr, NoMemory, "MR key space exhausted"))
    }

    /// Maps a scatter list (of `(addr, len, lkey)`) onto a FREE
    /// fast-registration MR in pages of `page_size`, as the kernel's
    /// `ib_map_mr_sg` does: the first entry may start inside a page, the
    /// last may end inside one, every boundary between entries must fall on
    /// a page boundary, and at most `max_pages` pages are mapped. Returns the
    /// iova, length and number of entries mapped (a short mapping maps a
    /// prefix).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the key is not a FREE fast-registration MR, the page size
    /// is not a power of two of at least 4 KiB, or an entry's lkey is not a
    /// valid MR of the same PD.
    pub fn map_mr_pages(&mut self, key: u32, sgl: &[(u64, u32, u32)], page_size: u32) -> Result<(u64, u64, usize)> {
        self.live(crate::verbs::Verb::MapMrPages)?;
        if !page_size.is_power_of_two() || page_size < 4096 {
            return Err(verr!(
                MapMrPages,
                InvalidArgument,
                "page size {page_size} must be a power of two ≥ 4096"
            ));
        }
        let (pd, max_pages) = match self.mrs.get(key) {
            Some(e) => match e.backing {
                Backing::FastReg {
                    valid: false,
                    max_pages,
                    ..
                } => (e.pd, max_pages),
                Backing::FastReg { valid: true, .. } => {
                    return Err(verr!(
                        MapMrPages,
                        InvalidArgument,
                        "the MR is VALID; invalidate it first"
                    ))
                }
                _ => return Err(verr!(MapMrPages, InvalidArgument, "not a fast-registration MR")),
            },
            None => return Err(verr!(MapMrPages, InvalidArgument, "no MR with key {key:#x}")),
        };
        let ps = u64::from(page_size);
        let mut segments = Vec::new();
        let mut pages = 0u64;
        let mut mapped = 0usize;
        let mut total = 0u64;
        let iova = sgl.first().map_or(0, |s| s.0);
        let mut prev_end_aligned = true;
        for (i, &(addr, len, lkey)) in sgl.iter().enumerate() {
            let len = u64::from(len);
            // Every boundary between entries must fall on a page boundary:
            // an entry after an unaligned end, or starting unaligned, ends
            // the mapping (the entries before it stay mapped).
            if i > 0 && (!prev_end_aligned || addr % ps != 0) {
                break;
            }
            prev_end_aligned = (addr + len) % ps == 0;
            let start_page = addr / ps;
            let end_page = (addr + len).div_ceil(ps);
            let n = end_page.saturating_sub(start_page).max(1);
            if pages + n > u64::from(max_pages) {
                break;
            }
            let e = self
                .mrs
                .get(lkey)
                .filter(|e| !e.is_window() && e.pd == pd)
                .ok_or_else(|| {
                    verr!(
                        MapMrPages,
                        InvalidArgument,
                        "entry {i}: lkey {lkey:#x} is not a valid MR of this PD"
                    )
                })?;
            let r = super::mr::MrTable::resolve(e, addr, len)
                .map_err(|_| verr!(MapMrPages, InvalidArgument, "entry {i} is outside its MR"))?;
            match r {
                super::mr::Resolved::One { memory, offset } => segments.push(Segment {
                    memory: memory.clone(),
                    offset,
                    len,
                }),
                super::mr::Resolved::Many(s) => segments.extend(s),
            }
            pages += n;
            total += len;
            mapped += 1;
        }
        if let Some(e) = self.mrs.get_mut(key) {
            e.iova = iova;
            e.len = total;
            e.backing = Backing::FastReg {
                max_pages,
                valid: false,
                mapping: Some(Mapping { segments }),
            };
        }
        Ok((iova, total, mapped))
    }

    /// `ibv_alloc_mw`: returns the window's rkey.
    ///
    /// # Errors
    ///
    /// `ENOMEM` at `max_mw`.
    pub fn alloc_mw(&mut self, pd: PdId, mw_type: MwType) -> Result<u32> {
        self.live(crate::verbs::Verb::AllocMw)?;
        self.check_pd(crate::verbs::Verb::AllocMw, pd)?;
        if self.mrs.live() >= self.cfg.attr.max_mr {
            return Err(verr!(AllocMw, NoMemory, "key space exhausted"));
        }
        let backing = Backing::Window { mw_type, binding: None };
        self.mrs
            .insert(&mut self.rng, pd, AccessFlags::empty(), 0, 0, backing)
            .ok_or_else(|| verr!(AllocMw, NoMemory, "key space exhausted"))
    }

    /// `ibv_dealloc_mw`: invalidates and frees the window.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an unknown window.
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<()> {
        if self.revoked {
            if let Some(key) = self.mrs.get_by_index_mut(rkey).filter(|e| e.is_window()).map(|e| e.key) {
                self.mrs.remove(key);
            }
            return Ok(());
        }
        let e = self
            .mrs
            .get_by_index_mut(rkey)
            .filter(|e| e.is_window())
            .ok_or_else(|| verr!(DeallocMw, InvalidArgument, "no memory window {rkey:#x}"))?;
        let key = e.key;
        self.unbind_window(key);
        self.mrs.remove(key);
        Ok(())
    }

    fn unbind_window(&mut self, key: u32) {
        let mr_key = match self.mrs.get_mut(key) {
            Some(e) => match &mut e.backing {
                Backing::Window { binding, .. } => binding.take().map(|b| b.mr_key),
                _ => None,
            },
            None => None,
        };
        if let Some(mr) = mr_key.and_then(|k| self.mrs.get_mut(k)) {
            mr.windows = mr.windows.saturating_sub(1);
        }
    }

    /// Executes the local operation at the head of the send queue (REG_MR,
    /// LOCAL_INV, BIND_MW); returns the status.
    pub(crate) fn execute_local_op(&mut self, qp: &Qp, op: &LocalOp) -> (WcStatus, u32) {
        let r = match *op {
            LocalOp::Inv { key } => self.invalidate(qp.pd, qp.qpn, key, false),
            LocalOp::Reg { mr_key, access } => self.fast_register(qp.pd, mr_key, access),
            LocalOp::Bind {
                mw_key,
                new_key,
                mr_key,
                addr,
                len,
                access,
                type1,
            } => self.bind(qp, mw_key, new_key, mr_key, addr, len, access, type1),
        };
        match r {
            Ok(()) => (WcStatus::Success, 0),
            Err(()) => (WcStatus::MwBindErr, vendor::MEM_OP),
        }
    }

    /// LOCAL_INV or remote invalidation (SEND_WITH_INV) of `key`: a VALID
    /// fast-registration MR becomes FREE; a bound type 2 window unbound.
    /// Type 1 windows and plain MRs cannot be invalidated.
    pub(crate) fn invalidate(&mut self, pd: PdId, qpn: u32, key: u32, remote: bool) -> std::result::Result<(), ()> {
        let e = self.mrs.get_mut(key).ok_or(())?;
        if e.pd != pd {
            return Err(());
        }
        match &mut e.backing {
            Backing::FastReg {
                valid,
                mapping,
                max_pages,
            } => {
                if !*valid {
                    return Err(());
                }
                let max_pages = *max_pages;
                let _ = mapping;
                e.backing = Backing::FastReg {
                    max_pages,
                    valid: false,
                    mapping: None,
                };
                e.access = AccessFlags::empty();
                Ok(())
            }
            Backing::Window {
                mw_type: MwType::Type2,
                binding: Some(b),
            } => {
                // A type 2B window may only be invalidated through the QP it
                // is bound to when done remotely.
                if remote && b.qpn.is_some_and(|q| q != qpn) {
                    return Err(());
                }
                self.unbind_window(key);
                Ok(())
            }
            _ => Err(()),
        }
    }

    /// REG_MR: makes a mapped, FREE fast-registration MR VALID under a key
    /// whose index is the MR's (only the key byte may change).
    fn fast_register(&mut self, pd: PdId, new_key: u32, access: AccessFlags) -> std::result::Result<(), ()> {
        if !access.is_valid_for_mr() {
            return Err(());
        }
        let e = self.mrs.get_by_index_mut(new_key).ok_or(())?;
        if e.pd != pd {
            return Err(());
        }
        match &mut e.backing {
            Backing::FastReg {
                valid: valid @ false,
                mapping: Some(_),
                ..
            } => {
                *valid = true;
                e.key = new_key;
                e.access = access;
                Ok(())
            }
            _ => Err(()),
        }
    }

    /// Binds a window (type 1 from `ibv_bind_mw`, type 2 from BIND_MW).
    #[allow(clippy::too_many_arguments)]
    fn bind(
        &mut self,
        qp: &Qp,
        mw_key: u32,
        new_key: u32,
        mr_key: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
        type1: bool,
    ) -> std::result::Result<(), ()> {
        // The window, named by its index (the key byte is being replaced).
        let (mw_type, bound, mw_pd) = match self.mrs.get_by_index_mut(mw_key) {
            Some(e) => match &e.backing {
                Backing::Window { mw_type, binding } => (*mw_type, binding.is_some(), e.pd),
                _ => return Err(()),
            },
            None => return Err(()),
        };
        if (mw_type == MwType::Type1) != type1 || mw_pd != qp.pd || (new_key >> 8) != (mw_key >> 8) {
            return Err(());
        }
        if mw_type == MwType::Type2 && bound {
            // A type 2 window must be invalidated before it is bound again.
            return Err(());
        }
        if type1 && len == 0 {
            // Zero-length bind of a type 1 window invalidates it.
            let old = self.mrs.get_by_index_mut(mw_key).map(|e| e.key).ok_or(())?;
            self.unbind_window(old);
            if let Some(e) = self.mrs.get_by_index_mut(mw_key) {
                e.key = new_key;
                e.access = AccessFlags::empty();
                e.iova = 0;
                e.len = 0;
            }
            return Ok(());
        }
        let mr = self.mrs.get(mr_key).ok_or(())?;
        if mr.is_window() || mr.pd != qp.pd || !mr.access.contains(AccessFlags::MW_BIND) {
            return Err(());
        }
        if needs_local_write(access) && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(());
        }
        let end = addr.checked_add(len).ok_or(())?;
        if addr < mr.iova || end > mr.iova + mr.len {
            return Err(());
        }
        if let Backing::FastReg { valid: false, .. } = mr.backing {
            return Err(());
        }
        let old = self.mrs.get_by_index_mut(mw_key).map(|e| e.key).ok_or(())?;
        self.unbind_window(old);
        if let Some(m) = self.mrs.get_mut(mr_key) {
            m.windows += 1;
        }
        let e = self.mrs.get_by_index_mut(mw_key).ok_or(())?;
        e.key = new_key;
        e.access = access & AccessFlags::REMOTE;
        e.iova = addr;
        e.len = len;
        e.backing = Backing::Window {
            mw_type,
            binding: Some(Binding {
                mr_key,
                qpn: (mw_type == MwType::Type2).then_some(qp.qpn),
            }),
        };
        Ok(())
    }
}

impl Core {
    /// `ibv_bind_mw` for a type 1 window: posts a bind WQE on the QP (it
    /// completes in order with opcode BIND_MW) and returns the window's new
    /// rkey (key byte incremented, as `ibv_inc_rkey`).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the QP is not RTS (or SQE or ERR, where it flushes), is UD, or
    /// the window is not type 1; `ENOMEM` if the send queue is full.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw_type1(
        &mut self,
        now: Nanos,
        qpn: u32,
        mw_key: u32,
        mr_key: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
        wr_id: u64,
        signaled: bool,
    ) -> Result<u32> {
        self.live(crate::verbs::Verb::BindMw)?;
        let is_type1 = self.mrs.get(mw_key).is_some_and(|e| {
            matches!(
                e.backing,
                super::mr::Backing::Window {
                    mw_type: crate::verbs::MwType::Type1,
                    ..
                }
            )
        });
        if !is_type1 {
            return Err(verr!(
                BindMw,
                InvalidArgument,
                "{mw_key:#x} is not a type 1 memory window"
            ));
        }
        let mut qp = self
            .take_qp(qpn)
            .ok_or_else(|| verr!(BindMw, InvalidArgument, "no QP {qpn:#x}"))?;
        let check = if qp.qp_type == QpType::Ud {
            Err(verr!(
                BindMw,
                InvalidArgument,
                "memory windows cannot be bound through a UD QP"
            ))
        } else if !matches!(qp.state(), QpState::Rts | QpState::Sqe | QpState::Err) {
            Err(verr!(BindMw, InvalidArgument, "the QP must be in RTS to bind a window"))
        } else if qp.sq.len() >= qp.cap.max_send_wr as usize {
            Err(verr!(BindMw, NoMemory, "send queue full"))
        } else {
            Ok(())
        };
        if let Err(e) = check {
            self.put_qp(qp);
            return Err(e);
        }
        let new_key = (mw_key & !0xff) | (mw_key.wrapping_add(1) & 0xff);
        let sgl = qp.take_vec();
        qp.sq.push_back(SendWqe {
            wr_id,
            op: WqeOp::BindMw,
            remote: RemoteAddr::default(),
            imm: 0,
            compare: 0,
            swap_add: 0,
            sgl,
            inline: None,
            length: 0,
            signaled: signaled || qp.sq_sig_all,
            fence: false,
            solicited: false,
            ud: None,
            local: Some(LocalOp::Bind {
                mw_key,
                new_key,
                mr_key,
                addr,
                len,
                access,
                type1: true,
            }),
            state: WqeState::Pending,
            first_psn: Psn::new(0),
            npkts: 0,
            resp_pkts: 0,
        });
        match qp.state() {
            QpState::Err => self.flush_qp(&mut qp),
            QpState::Sqe => self.flush_sq(&mut qp),
            _ => {}
        }
        self.put_qp(qp);
        self.run_requester(now, qpn);
        Ok(new_key)
    }
}
