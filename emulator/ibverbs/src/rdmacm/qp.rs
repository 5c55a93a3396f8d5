//! The QP of an id: `rdma_create_qp`/`rdma_create_qp_ex` (with the CQs and
//! completion channels librdmacm makes when the application gives none)
//! and `rdma_destroy_qp`.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Creates the id's CQs (each with its completion channel, the id as CQ
/// context, as librdmacm does) when the application gives none.
pub(super) fn make_cqs(sv: &mut SvId, send: c_int, recv: c_int) -> Result<(), c_int> {
    let ctx = sv.id.verbs;
    let me = sv as *mut SvId as *mut c_void;
    for (size, chan, cq) in [
        (send, &mut sv.id.send_cq_channel, &mut sv.id.send_cq),
        (recv, &mut sv.id.recv_cq_channel, &mut sv.id.recv_cq),
    ] {
        if !cq.is_null() {
            continue;
        }
        // SAFETY: the id's device context.
        let ch = unsafe { __softverbs_ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(errno());
        }
        // SAFETY: as above; `ch` just made on it.
        let c = unsafe { __softverbs_ibv_create_cq(ctx, size.max(1), me, ch, 0) };
        if c.is_null() {
            let e = errno();
            // SAFETY: unused.
            unsafe { __softverbs_ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        *chan = ch;
        *cq = c;
        sv.own_cqs = true;
    }
    Ok(())
}

pub(super) fn destroy_cqs(sv: &mut SvId) {
    if !sv.own_cqs {
        return;
    }
    for (chan, cq) in [
        (&mut sv.id.send_cq_channel, &mut sv.id.send_cq),
        (&mut sv.id.recv_cq_channel, &mut sv.id.recv_cq),
    ] {
        if !cq.is_null() {
            // SAFETY: made by make_cqs; the QP using it is gone.
            unsafe { __softverbs_ibv_destroy_cq(*cq) };
            *cq = null_mut();
        }
        if !chan.is_null() {
            // SAFETY: as above.
            unsafe { __softverbs_ibv_destroy_comp_channel(*chan) };
            *chan = null_mut();
        }
    }
    sv.own_cqs = false;
}

/// A copy of QP creation attributes (plain data).
pub(super) fn copy_attr(a: &ibv_qp_init_attr) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    }
}

/// `rdma_create_qp`.
///
/// # Safety
///
/// `id` live; `pd` NULL or a PD of the id's context; `attr` readable and
/// writable (its capabilities are updated), its CQs NULL or live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    let sv = id_or!(id);
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: readable and writable per the contract.
    let a = unsafe { &mut *attr };
    // SAFETY: forwarded.
    unsafe { create_qp(sv, pd, a) }
}

/// # Safety
///
/// As `rdma_create_qp`.
pub(super) unsafe fn create_qp(sv: &mut SvId, pd: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> c_int {
    refresh(sv);
    if !sv.id.qp.is_null() || sv.id.verbs.is_null() {
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() { sv.id.pd } else { pd };
    // SAFETY: a live PD.
    if pd.is_null() || unsafe { (*pd).context } != sv.id.verbs {
        return fail(libc::EINVAL);
    }
    let mut attr = copy_attr(a);
    if attr.qp_type == 0 {
        // rdma_create_ep's callers leave the type to the address info.
        attr.qp_type = sv.id.qp_type as u32;
    }
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        let send = if attr.send_cq.is_null() {
            attr.cap.max_send_wr as c_int
        } else {
            0
        };
        let recv = if attr.recv_cq.is_null() {
            attr.cap.max_recv_wr as c_int
        } else {
            0
        };
        if let Err(e) = make_cqs(sv, send, recv) {
            destroy_cqs(sv);
            return fail(e);
        }
        if attr.send_cq.is_null() {
            attr.send_cq = sv.id.send_cq;
        }
        if attr.recv_cq.is_null() {
            attr.recv_cq = sv.id.recv_cq;
        }
    }
    if attr.srq.is_null() {
        attr.srq = sv.id.srq;
    }
    // SAFETY: live objects per the contract.
    let qp = unsafe { __softverbs_ibv_create_qp(pd, &mut attr) };
    if qp.is_null() {
        let e = errno();
        destroy_cqs(sv);
        return fail(e);
    }
    // SAFETY: a QP this library just made.
    if let Err(e) = sv.cm.attach_qp(&unsafe { SvQp::from_ibv(qp) }.h) {
        // SAFETY: just made, unused.
        unsafe { __softverbs_ibv_destroy_qp(qp) };
        destroy_cqs(sv);
        return fail(e.errno());
    }
    a.cap = attr.cap;
    sv.id.qp = qp;
    refresh(sv);
    sv.id.pd = pd;
    if sv.id.send_cq.is_null() {
        sv.id.send_cq = attr.send_cq;
    }
    if sv.id.recv_cq.is_null() {
        sv.id.recv_cq = attr.recv_cq;
    }
    0
}

/// `rdma_create_qp_ex`: the extended attributes' PD, CQs, SRQ, type and
/// capabilities (other extensions are refused with `EOPNOTSUPP`).
///
/// # Safety
///
/// As `rdma_create_qp`, for `attr`.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    let sv = id_or!(id);
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: readable and writable per the contract.
    let x = unsafe { &mut *attr };
    if x.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    let mut a = ibv_qp_init_attr {
        qp_context: x.qp_context,
        send_cq: x.send_cq,
        recv_cq: x.recv_cq,
        srq: x.srq,
        cap: x.cap,
        qp_type: x.qp_type,
        sq_sig_all: x.sq_sig_all,
    };
    let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        x.pd
    } else {
        null_mut()
    };
    // SAFETY: forwarded.
    let r = unsafe { create_qp(sv, pd, &mut a) };
    if r == 0 {
        x.cap = a.cap;
    }
    r
}

/// `rdma_destroy_qp`: destroys the QP and the CQs `rdma_create_qp` made.
///
/// # Safety
///
/// `id` live; its QP no longer used.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_destroy_qp(id: *mut rdma_cm_id) {
    if id.is_null() || !is_live(id) {
        return;
    }
    // SAFETY: a live id.
    let sv = unsafe { &mut *(id as *mut SvId) };
    if !sv.id.qp.is_null() {
        // SAFETY: the id's QP.
        unsafe { __softverbs_ibv_destroy_qp(sv.id.qp) };
        sv.id.qp = null_mut();
    }
    sv.cm.destroy_qp();
    destroy_cqs(sv);
}
