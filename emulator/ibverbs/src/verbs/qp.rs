//! Shared receive queues and queue pairs: create, modify, query, destroy.

use super::*;

/// `ibv_create_srq`.
///
/// # Safety
///
/// `pd` a live PD; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    null_check!(null_mut(); pd, attr);
    // SAFETY: readable per the contract.
    let a = unsafe { &mut *attr };
    let slot: Box<std::mem::MaybeUninit<SvSrq>> = Box::new(std::mem::MaybeUninit::uninit());
    let raw = Box::into_raw(slot) as *mut SvSrq;
    let sattr = SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    // SAFETY: a live PD of this library.
    match unsafe { &(*(pd as *mut SvPd)).h }.create_srq(sattr, raw as u64) {
        Ok(h) => {
            if let Ok(q) = h.query() {
                a.attr.max_wr = q.max_wr;
                a.attr.max_sge = q.max_sge;
            }
            // SAFETY: owned, uninitialised allocation of the right layout.
            unsafe {
                raw.write(SvSrq {
                    srq: ibv_srq {
                        context: (*pd).context,
                        srq_context: a.srq_context,
                        pd,
                        handle: 0,
                        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                        cond: libc::PTHREAD_COND_INITIALIZER,
                        events_completed: 0,
                    },
                    h,
                })
            };
            raw as *mut ibv_srq
        }
        Err(e) => {
            // SAFETY: nothing was written into it.
            drop(unsafe { Box::from_raw(raw as *mut std::mem::MaybeUninit<SvSrq>) });
            fail_null(e.errno())
        }
    }
}

/// `ibv_modify_srq`.
///
/// # Safety
///
/// `srq` a live SRQ; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    null_check!(libc::EINVAL; srq, attr);
    let Some(m) = SrqAttrMask::from_bits(mask as u32) else {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    };
    // SAFETY: readable per the contract.
    let a = unsafe { *attr };
    let sa = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    };
    // SAFETY: a live SRQ of this library.
    match unsafe { &(*(srq as *mut SvSrq)).h }.modify(&sa, m) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// `ibv_query_srq`.
///
/// # Safety
///
/// `srq` a live SRQ; `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    null_check!(libc::EINVAL; srq, attr);
    // SAFETY: a live SRQ of this library.
    match unsafe { &(*(srq as *mut SvSrq)).h }.query() {
        Ok(q) => {
            // SAFETY: writable per the contract.
            unsafe {
                *attr = ibv_srq_attr {
                    max_wr: q.max_wr,
                    max_sge: q.max_sge,
                    srq_limit: q.srq_limit,
                }
            };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_destroy_srq`: `EBUSY` while QPs use it.
///
/// # Safety
///
/// `srq` NULL or a live SRQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    null_check!(libc::EINVAL; srq);
    // SAFETY: a live SRQ of this library (made in ibv_create_srq).
    unsafe { destroy_then_free(srq as *mut SvSrq, |s| s.h.ops().destroy()) }
}

// ---------------------------------------------------------------- QP

pub(super) fn cap_from(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

pub(super) fn cap_to(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// Creates a QP (the legacy and the extended verb).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn create_qp_common(
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: &mut ibv_qp_cap,
    qp_type: c_uint,
    sq_sig_all: c_int,
) -> *mut SvQp {
    null_check!(null_mut(); pd, send_cq, recv_cq);
    let Some(ty) = QpType::from_raw(qp_type) else {
        // XRC, raw packet and driver QPs are not offered.
        return fail_null(libc::EOPNOTSUPP);
    };
    // SAFETY: live objects of this library, per the contract.
    let (scq, rcq) = unsafe { (SvCq::from_ibv(send_cq), SvCq::from_ibv(recv_cq)) };
    let s = if srq.is_null() {
        None
    } else {
        // SAFETY: a live SRQ.
        Some(unsafe { &(*(srq as *mut SvSrq)).h })
    };
    let init = QpInitAttr {
        qp_type: ty,
        send_cq: &scq.h,
        recv_cq: &rcq.h,
        srq: s,
        cap: cap_from(cap),
        sq_sig_all: sq_sig_all != 0,
    };
    // SAFETY: a live PD.
    let h = match unsafe { &(*(pd as *mut SvPd)).h }.create_qp(&init) {
        Ok(h) => h,
        Err(e) => return fail_null(e.errno()),
    };
    *cap = cap_to(&h.cap());
    // SAFETY: a live PD.
    let ctx = unsafe { (*pd).context };
    // SAFETY: ibv_qp_ex is plain data (mutex and cond set below).
    let mut q: ibv_qp_ex = unsafe { std::mem::zeroed() };
    q.qp_base = ibv_qp {
        context: ctx,
        qp_context,
        pd,
        send_cq,
        recv_cq,
        srq,
        handle: 0,
        qp_num: h.qp_num(),
        state: QpState::Reset.as_raw(),
        qp_type,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        events_completed: 0,
    };
    crate::ex::install_qp_ex_ops(&mut q);
    let qpn = h.qp_num();
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let p = into_raw(SvQp {
        qp: q,
        h,
        ctx: sv,
        sq_sig_all: sq_sig_all != 0,
        cap: *cap,
        batch: Mutex::new(Default::default()),
    });
    sv.qps.lock().unwrap_or_else(|e| e.into_inner()).insert(qpn, p as usize);
    p
}

/// `ibv_create_qp`.
///
/// # Safety
///
/// `pd` a live PD; `attr` readable and writable, its CQs/SRQ live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    null_check!(null_mut(); pd, attr);
    // SAFETY: per the contract.
    let a = unsafe { &mut *attr };
    // SAFETY: forwarded contract.
    unsafe {
        create_qp_common(
            pd,
            a.qp_context,
            a.send_cq,
            a.recv_cq,
            a.srq,
            &mut a.cap,
            a.qp_type,
            a.sq_sig_all,
        ) as *mut ibv_qp
    }
}

pub(super) fn ah_from(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: Gid(a.grh.dgid.raw),
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

pub(super) fn ah_to(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.grh.dgid.0 },
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// The softverbs attributes of a C `ibv_qp_attr`, for the fields `mask`
/// names (the others get valid placeholders the provider ignores).
pub(super) fn qp_attr_from(a: &ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr, c_int> {
    let state = |raw| QpState::from_raw(raw).ok_or(libc::EINVAL);
    let d = QpAttr::default();
    Ok(QpAttr {
        qp_state: if mask.contains(QpAttrMask::STATE) {
            state(a.qp_state)?
        } else {
            d.qp_state
        },
        cur_qp_state: if mask.contains(QpAttrMask::CUR_STATE) {
            state(a.cur_qp_state)?
        } else {
            d.cur_qp_state
        },
        path_mtu: if mask.contains(QpAttrMask::PATH_MTU) {
            Mtu::from_raw(a.path_mtu).ok_or(libc::EINVAL)?
        } else {
            d.path_mtu
        },
        path_mig_state: if mask.contains(QpAttrMask::PATH_MIG_STATE) {
            MigState::from_raw(a.path_mig_state).ok_or(libc::EINVAL)?
        } else {
            d.path_mig_state
        },
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            AccessFlags::from_bits(a.qp_access_flags).ok_or(libc::EINVAL)?
        } else {
            AccessFlags::empty()
        },
        cap: cap_from(&a.cap),
        ah_attr: ah_from(&a.ah_attr),
        alt_ah_attr: ah_from(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    })
}

/// `ibv_modify_qp`.
///
/// # Safety
///
/// `qp` a live QP; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    null_check!(libc::EINVAL; qp, attr);
    let Some(m) = QpAttrMask::from_bits(mask as u32) else {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    };
    // SAFETY: readable per the contract.
    let a = unsafe { &*attr };
    let ra = match qp_attr_from(a, m) {
        Ok(r) => r,
        Err(e) => {
            set_errno(e);
            return e;
        }
    };
    // SAFETY: a live QP of this library.
    let q = unsafe { SvQp::from_ibv(qp) };
    match q.h.modify(&ra, m) {
        Ok(()) => {
            if m.contains(QpAttrMask::STATE) {
                // SAFETY: the C view of the state, updated as libibverbs
                // does after a successful modify.
                unsafe { (*qp).state = a.qp_state };
            }
            0
        }
        Err(e) => fail(&e),
    }
}

/// The C `ibv_qp_attr` of softverbs attributes (every field).
pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state.as_raw(),
        cur_qp_state: a.cur_qp_state.as_raw(),
        path_mtu: a.path_mtu.as_raw(),
        path_mig_state: a.path_mig_state.as_raw(),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: cap_to(&a.cap),
        ah_attr: ah_to(&a.ah_attr),
        alt_ah_attr: ah_to(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

/// `ibv_query_qp`: every attribute (the mask is not needed to choose).
///
/// # Safety
///
/// `qp` a live QP; `attr` and `init` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    null_check!(libc::EINVAL; qp, attr, init);
    // SAFETY: a live QP of this library.
    let q = unsafe { SvQp::from_ibv(qp) };
    let a = match q.h.query() {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    let c = qp_attr_to_c(&a);
    // SAFETY: writable per the contract; the C QP fields are ours.
    unsafe {
        *attr = c;
        *init = ibv_qp_init_attr {
            qp_context: (*qp).qp_context,
            send_cq: (*qp).send_cq,
            recv_cq: (*qp).recv_cq,
            srq: (*qp).srq,
            cap: q.cap,
            qp_type: (*qp).qp_type,
            sq_sig_all: c_int::from(q.sq_sig_all),
        };
        (*qp).state = c.qp_state;
    }
    0
}

/// `ibv_query_qp_data_in_order`: 0 (no in-order data guarantee is
/// promised to the application).
///
/// # Safety
///
/// Any arguments.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_uint, _flags: u32) -> c_int {
    0
}

/// `ibv_destroy_qp`.
///
/// # Safety
///
/// `qp` NULL or a live QP.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    null_check!(libc::EINVAL; qp);
    // SAFETY: a live QP of this library.
    unsafe {
        destroy_then_free(qp as *mut SvQp, |p| {
            p.h.ops().destroy()?;
            // SAFETY: the QP's context is open while the QP exists.
            let ctx = &*p.ctx;
            ctx.qps.lock().unwrap_or_else(|e| e.into_inner()).remove(&(*qp).qp_num);
            Ok(())
        })
    }
}

/// `ibv_qp_to_qp_ex`: every QP of this library has the extended layout.
///
/// # Safety
///
/// `qp` a live QP.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    qp as *mut ibv_qp_ex
}
