//! Queue pairs (`struct ibv_qp`): creation, state changes, queries, type 1
//! window binds; posting is in `post.rs`, the shadow of what was posted in
//! `shadow.rs`.

use std::sync::{Arc, Weak};

use rdma_sys::{ibv_mw_bind, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_srq};

use super::convert;
use super::device_life::{HwDeviceLife, Member, MemberKind, PostMode};
use super::ffi::{self, zeroed, PostRecvFn, PostSendFn, SendPtr};
use super::ibv_object::{Entered, IbvObject};
use super::objects::{HwMr, HwMw, HwPd};
use super::post::{self, SendTarget};
use super::queue::{HwCq, HwSrq};
use super::shadow::QpShadow;
use super::{check, ibv_error};
use crate::verbs::backend::*;
use crate::verbs::{
    verr, MwBindInfo, MwType, PostError, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, Result, SendFlags, SendWr,
    Verb, WcOpcode,
};

/// A queue pair (`struct ibv_qp`). It holds its PD, CQs and SRQ, so they
/// outlive it.
///
/// Every work request posted is recorded in the QP's shadow until its
/// completion is polled, so that a removal can flush it (see `shadow.rs`).
pub struct HwQp {
    qp: IbvObject<ibv_qp>,
    post_send: Option<PostSendFn>,
    post_recv: Option<PostRecvFn>,
    qp_num: u32,
    qp_type: QpType,
    cap: QpCap,
    target: SendTarget,
    shadow: Arc<QpShadow>,
    life: Arc<HwDeviceLife>,
    srq: Option<Arc<dyn SrqOps>>,
    recv_cq: Arc<dyn CqOps>,
    send_cq: Arc<dyn CqOps>,
    _pd: Arc<HwPd>,
}

/// The hardware CQ behind a CQ trait object.
fn hw_cq(cq: &Arc<dyn CqOps>) -> Result<&HwCq> {
    super::downcast::<HwCq, _>(cq).ok_or_else(|| verr!(CreateQp, InvalidArgument, "the CQ belongs to another backend"))
}

impl HwQp {
    /// `ibv_create_qp` on `pd`. The capacities granted (at least those
    /// asked for) are kept for [`QpOps::cap`] and for checking scatter
    /// lengths when posting.
    pub(crate) fn create(pd: &HwPd, attr: &QpCreateAttr) -> Result<Arc<HwQp>> {
        let send_cq = hw_cq(&attr.send_cq)?;
        let recv_cq = hw_cq(&attr.recv_cq)?;
        let srq = attr
            .srq
            .as_ref()
            .map(|s| {
                super::downcast::<HwSrq, _>(s)
                    .ok_or_else(|| verr!(CreateQp, InvalidArgument, "the SRQ belongs to another backend"))
            })
            .transpose()?;
        // Keep every object named entered, so none is destroyed mid-call.
        let pd_guard = pd.obj().enter(Verb::CreateQp)?;
        let send_guard = send_cq.obj().enter(Verb::CreateQp)?;
        let recv_guard = recv_cq.obj().enter(Verb::CreateQp)?;
        let srq_guard: Option<Entered<'_, ibv_srq>> = srq.map(|s| s.obj().enter(Verb::CreateQp)).transpose()?;
        let mut init: ibv_qp_init_attr = zeroed();
        init.send_cq = send_guard.ptr();
        init.recv_cq = recv_guard.ptr();
        init.srq = srq_guard.as_ref().map_or(std::ptr::null_mut(), |g| g.ptr());
        init.cap = convert::qp_cap_to_raw(&attr.cap);
        init.qp_type = attr.qp_type.as_raw();
        init.sq_sig_all = i32::from(attr.sq_sig_all);
        ffi::clear_errno();
        // SAFETY: a live PD, CQs and SRQ (entered) and a valid init struct.
        let raw = unsafe { rdma_sys::ibv_create_qp(pd_guard.ptr(), &mut init) };
        let ptr =
            SendPtr::new(raw).ok_or_else(|| ibv_error(Verb::CreateQp, "ibv_create_qp", ffi::errno_or(libc::ENOMEM)))?;
        // SAFETY: a live QP; its context's ops table lives as long.
        let (qp_num, ops) = unsafe { ((*raw).qp_num, ffi::ops((*raw).context)) };
        let mut cap = convert::qp_cap_from_raw(&init.cap);
        if attr.srq.is_some() {
            // The receive queue is the SRQ's.
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let life = pd.life().clone();
        let shadow = QpShadow::new(
            qp_num,
            life.next_seq(),
            cap.max_send_wr,
            attr.srq.is_none().then_some(cap.max_recv_wr),
        );
        send_cq.shadow().attach(&shadow, true, false);
        recv_cq.shadow().attach(&shadow, false, true);
        let qp = Arc::new(HwQp {
            // SAFETY: a fresh QP only the HwQp frees.
            qp: unsafe { IbvObject::new(ptr, "queue pair") },
            post_send: ops.post_send,
            post_recv: ops.post_recv,
            qp_num,
            qp_type: attr.qp_type,
            cap,
            target: SendTarget {
                qp_type: attr.qp_type,
                max_send_sge: cap.max_send_sge,
                max_inline_data: cap.max_inline_data,
                sig_all: attr.sq_sig_all,
            },
            shadow,
            life,
            srq: attr.srq.clone(),
            recv_cq: attr.recv_cq.clone(),
            send_cq: attr.send_cq.clone(),
            _pd: pd.arc(),
        });
        let member: Weak<dyn Member> = Arc::downgrade(&qp) as Weak<HwQp>;
        qp.life.register(MemberKind::Qp, member);
        Ok(qp)
    }

    /// The CQ shadows this QP's queues complete on.
    fn cq_shadows(&self) -> (Option<&HwCq>, Option<&HwCq>) {
        (
            super::downcast::<HwCq, _>(&self.send_cq),
            super::downcast::<HwCq, _>(&self.recv_cq),
        )
    }

    /// After a move to RESET the device forgets every outstanding work
    /// request (no completion will come): so does the shadow.
    fn forget_posted(&self) {
        let (send_cq, recv_cq) = self.cq_shadows();
        if let Some(cq) = send_cq {
            self.shadow.send().reset(cq.shadow());
        }
        if let (Some(q), Some(cq)) = (self.shadow.recv(), recv_cq) {
            q.reset(cq.shadow());
        }
    }

    /// The `struct ibv_qp` pointer, for interoperating with C (rdma_cm).
    /// Valid until this QP is destroyed; do not free it.
    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.qp.raw()
    }

    fn free(&self) -> std::result::Result<(), i32> {
        // SAFETY: the QP is destroyed at most once (lifecycle).
        let freed = self
            .qp
            .destroy(|qp| self.life.destroy_rc(unsafe { rdma_sys::ibv_destroy_qp(qp) }));
        if freed.is_ok() {
            // Its completions are gone with it (as ibv_destroy_qp discards
            // them): no flush either.
            let (send_cq, recv_cq) = self.cq_shadows();
            for cq in [send_cq, recv_cq].into_iter().flatten() {
                cq.shadow().detach(self.qp_num);
            }
        }
        freed
    }
}

impl Member for HwQp {
    /// The removal's step 2: the QP moves to ERR (a present device then
    /// flushes its work requests itself; one that is gone answers `EIO`).
    fn revoke(&self, life: &HwDeviceLife) {
        let Ok(qp) = self.qp.enter(Verb::ModifyQp) else {
            return;
        };
        let mut attr: ibv_qp_attr = zeroed();
        attr.qp_state = QpState::Err.as_raw();
        // SAFETY: a live QP (entered) and a valid attribute struct.
        let rc = unsafe {
            rdma_sys::ibv_modify_qp(
                qp.ptr(),
                &mut attr,
                convert::qp_attr_mask_to_raw(QpAttrMask::STATE) as i32,
            )
        };
        if rc.abs() == libc::EIO {
            life.mark_gone();
        }
    }
}

impl Drop for HwQp {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

/// Every attribute mask bit, for `ibv_query_qp`.
const QUERY_ALL: QpAttrMask = QpAttrMask::all();

impl QpOps for HwQp {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    /// `ibv_modify_qp`: the kernel checks the transition and the mask and
    /// changes nothing on error.
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let qp = self.qp.enter(Verb::ModifyQp)?;
        self.life.check(Verb::ModifyQp)?;
        let mut raw = convert::qp_attr_to_raw(attr);
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { rdma_sys::ibv_modify_qp(qp.ptr(), &mut raw, convert::qp_attr_mask_to_raw(mask)) };
        check(Verb::ModifyQp, "ibv_modify_qp", rc)?;
        if mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset {
            self.forget_posted();
        }
        Ok(())
    }

    fn query(&self) -> Result<QpAttr> {
        let qp = self.qp.enter(Verb::QueryQp)?;
        self.life.check(Verb::QueryQp)?;
        let mut raw: ibv_qp_attr = zeroed();
        let mut init: ibv_qp_init_attr = zeroed();
        // SAFETY: a live QP and valid out-parameters.
        let rc =
            unsafe { rdma_sys::ibv_query_qp(qp.ptr(), &mut raw, convert::qp_attr_mask_to_raw(QUERY_ALL), &mut init) };
        check(Verb::QueryQp, "ibv_query_qp", rc)?;
        convert::qp_attr_from_raw(&raw)
    }

    /// `ibv_post_send` through the provider's entry point (see `post.rs`),
    /// recorded in the send queue's shadow. After a removal the work
    /// requests go to the shadow only (to complete with `WR_FLUSH_ERR`);
    /// once the device's objects are inert, posting fails with `ENODEV`.
    #[inline]
    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let qp = self
            .qp
            .enter(Verb::PostSend)
            .map_err(|error| PostError { index: 0, error })?;
        let Some(post_fn) = self.post_send else {
            return Err(PostError {
                index: 0,
                error: verr!(PostSend, NotSupported, "the provider has no post_send"),
            });
        };
        if self.life.post_mode() == PostMode::Refuse {
            return Err(PostError {
                index: 0,
                error: self.life.gone(Verb::PostSend),
            });
        }
        let ptr = qp.ptr();
        let mut ring = self.shadow.send().producer();
        post::post_send(&self.target, Some(&mut ring), wrs, |head, bad| {
            if self.life.post_mode() != PostMode::Device {
                return 0;
            }
            // SAFETY: a live QP (entered above) and a linked chain of valid
            // work requests (post.rs).
            unsafe { post_fn(ptr, head, bad) }
        })
    }

    /// `ibv_post_recv` through the provider's entry point (see `post.rs`).
    /// `EINVAL` on a QP that receives through an SRQ.
    #[inline]
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let qp = self
            .qp
            .enter(Verb::PostRecv)
            .map_err(|error| PostError { index: 0, error })?;
        if self.srq.is_some() {
            return Err(PostError {
                index: 0,
                error: verr!(
                    PostRecv,
                    InvalidArgument,
                    "this QP receives through its SRQ: post there"
                ),
            });
        }
        let Some(post_fn) = self.post_recv else {
            return Err(PostError {
                index: 0,
                error: verr!(PostRecv, NotSupported, "the provider has no post_recv"),
            });
        };
        if self.life.post_mode() == PostMode::Refuse {
            return Err(PostError {
                index: 0,
                error: self.life.gone(Verb::PostRecv),
            });
        }
        let mut ring = self.shadow.recv().map(|q| q.producer());
        post::post_recv(
            wrs,
            self.cap.max_recv_sge,
            Verb::PostRecv,
            "ibv_post_recv",
            ring.as_mut(),
            |wr, bad| {
                if self.life.post_mode() != PostMode::Device {
                    return 0;
                }
                // SAFETY: a live QP (entered above) and a linked chain of valid
                // work requests (post.rs).
                unsafe { post_fn(qp.ptr(), wr, bad) }
            },
        )
    }

    /// `ibv_bind_mw` for a type 1 window, with `verbs.h`'s checks (`EINVAL`
    /// for a type 2 window, `EPERM` for an MR of another PD); returns the
    /// window's new rkey.
    fn bind_mw(&self, mw: &Arc<dyn MwOps>, wr_id: u64, bind: &MwBindInfo<'_>, flags: SendFlags) -> Result<u32> {
        let hw_mw = super::downcast::<HwMw, _>(mw)
            .ok_or_else(|| verr!(BindMw, InvalidArgument, "the memory window belongs to another backend"))?;
        if hw_mw.mw_type() != MwType::Type1 {
            return Err(verr!(
                BindMw,
                InvalidArgument,
                "only type 1 windows are bound by the verb; post a BIND_MW work request for type 2"
            ));
        }
        let hw_mr = super::downcast::<HwMr, _>(bind.mr.ops())
            .ok_or_else(|| verr!(BindMw, InvalidArgument, "the MR belongs to another backend"))?;
        let qp = self.qp.enter(Verb::BindMw)?;
        self.life.check(Verb::BindMw)?;
        let mw_guard = hw_mw.obj().enter(Verb::BindMw)?;
        let mr_guard = hw_mr.obj().enter(Verb::BindMw)?;
        let mut raw: ibv_mw_bind = zeroed();
        raw.wr_id = wr_id;
        raw.send_flags = convert::send_flags_to_raw(flags);
        raw.bind_info.mr = mr_guard.ptr();
        raw.bind_info.addr = bind.addr;
        raw.bind_info.length = bind.length;
        raw.bind_info.mw_access_flags = convert::access_to_raw(bind.access);
        // The bind is a work request on the send queue: shadow it.
        let mut ring = self.shadow.send().producer();
        if ring.room() == 0 {
            return Err(verr!(
                BindMw,
                NoMemory,
                "the send queue is full ({} work requests outstanding)",
                ring.capacity()
            ));
        }
        let signaled = self.target.sig_all || flags.contains(SendFlags::SIGNALED);
        ring.push(wr_id, WcOpcode::BindMw, signaled);
        ring.publish();
        // SAFETY: a live QP, window and MR (entered) and a valid bind struct.
        let rc = unsafe { ffi::bind_mw(qp.ptr(), mw_guard.ptr(), &mut raw) };
        ring.settle(usize::from(rc == 0));
        drop(ring);
        check(Verb::BindMw, "ibv_bind_mw", rc)?;
        // SAFETY: a live window; the provider stored the new rkey in it.
        let rkey = unsafe { (*mw_guard.ptr()).rkey };
        hw_mw.set_rkey(rkey);
        Ok(rkey)
    }

    /// `ibv_destroy_qp`.
    fn destroy(&self) -> Result<()> {
        self.free().map_err(|e| ibv_error(Verb::DestroyQp, "ibv_destroy_qp", e))
    }
}

#[cfg(test)]
mod tests;
