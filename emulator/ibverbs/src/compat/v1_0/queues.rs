//! The 1.0 verbs of the queues: CQs (with their completion events), SRQs
//! and QPs. Each current CQ, SRQ and QP carries its 1.0 wrapper as its
//! `cq_context`, `srq_context` or `qp_context` (see the module docs of
//! `v1_0`).

use std::ffi::c_void;
use std::os::raw::{c_int, c_uint};
use std::ptr::null_mut;

use super::{
    __softverbs_ibv_ack_cq_events, __softverbs_ibv_create_cq, __softverbs_ibv_create_qp, __softverbs_ibv_create_srq,
    __softverbs_ibv_destroy_cq, __softverbs_ibv_destroy_qp, __softverbs_ibv_destroy_srq, __softverbs_ibv_get_cq_event,
    __softverbs_ibv_modify_qp, __softverbs_ibv_modify_srq, __softverbs_ibv_query_qp, __softverbs_ibv_query_srq,
    __softverbs_ibv_resize_cq, ibv_context_1_0, ibv_cq_1_0, ibv_pd_1_0, ibv_qp_1_0, ibv_qp_init_attr_1_0, ibv_srq_1_0,
    release, zalloc,
};
use crate::ffi::*;
use crate::objects::set_errno;

/// `ibv_create_cq@IBVERBS_1.0`: the current CQ's `cq_context` is the 1.0
/// CQ (completion events map back to it).
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context; `channel` NULL or a channel of it.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_cq_1_0(
    ctx: *mut ibv_context_1_0,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    vector: c_int,
) -> *mut ibv_cq_1_0 {
    need!(null_mut(); ctx);
    let cq = zalloc::<ibv_cq_1_0>();
    if cq.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 context; `cq` zeroed and ours (an all-zero mutex and
    // condition variable are their static initializers on Linux).
    unsafe {
        let real = __softverbs_ibv_create_cq((*ctx).real_context, cqe, cq_context, channel, vector);
        if real.is_null() {
            release(cq);
            return null_mut();
        }
        (*cq).context = ctx;
        (*cq).cq_context = cq_context;
        (*cq).handle = (*real).handle;
        (*cq).cqe = cqe;
        (*cq).real_cq = real;
        (*real).cq_context = cq as *mut c_void;
    }
    cq
}

/// `ibv_resize_cq@IBVERBS_1.0`.
///
/// # Safety
///
/// `cq` NULL or a 1.0 CQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_resize_cq_1_0(cq: *mut ibv_cq_1_0, cqe: c_int) -> c_int {
    need!(libc::EINVAL; cq);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_resize_cq((*cq).real_cq, cqe) }
}

/// `ibv_destroy_cq@IBVERBS_1.0`.
///
/// # Safety
///
/// `cq` NULL or a 1.0 CQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_cq_1_0(cq: *mut ibv_cq_1_0) -> c_int {
    need!(libc::EINVAL; cq);
    // SAFETY: a 1.0 CQ of this module.
    let ret = unsafe { __softverbs_ibv_destroy_cq((*cq).real_cq) };
    if ret == 0 {
        // SAFETY: ours, its CQ gone.
        unsafe { release(cq) };
    }
    ret
}

/// `ibv_get_cq_event@IBVERBS_1.0`: the CQ is the 1.0 CQ.
///
/// # Safety
///
/// `ch` NULL or a channel; `cq`, `cq_context` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_cq_event_1_0(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq_1_0,
    cq_context: *mut *mut c_void,
) -> c_int {
    need!(-1; ch, cq, cq_context);
    let mut real = null_mut();
    let mut wrapper = null_mut();
    // SAFETY: forwarded; the channel's CQs were made by the 1.0 verb, so
    // their context is their 1.0 CQ.
    unsafe {
        let ret = __softverbs_ibv_get_cq_event(ch, &mut real, &mut wrapper);
        if ret != 0 {
            return ret;
        }
        let c = wrapper as *mut ibv_cq_1_0;
        *cq = c;
        *cq_context = (*c).cq_context;
    }
    0
}

/// `ibv_ack_cq_events@IBVERBS_1.0`.
///
/// # Safety
///
/// `cq` NULL or a 1.0 CQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_ack_cq_events_1_0(cq: *mut ibv_cq_1_0, n: c_uint) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a 1.0 CQ of this module.
    unsafe {
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n);
        __softverbs_ibv_ack_cq_events((*cq).real_cq, n);
    }
}

/// `ibv_create_srq@IBVERBS_1.0`: the current SRQ's `srq_context` is the
/// 1.0 SRQ.
///
/// # Safety
///
/// `pd` NULL or a 1.0 PD; `attr` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_srq_1_0(
    pd: *mut ibv_pd_1_0,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq_1_0 {
    need!(null_mut(); pd, attr);
    let srq = zalloc::<ibv_srq_1_0>();
    if srq.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 PD; `srq` zeroed and ours.
    unsafe {
        let real = __softverbs_ibv_create_srq((*pd).real_pd, attr);
        if real.is_null() {
            release(srq);
            return null_mut();
        }
        (*srq).context = (*pd).context;
        (*srq).srq_context = (*attr).srq_context;
        (*srq).pd = pd;
        (*srq).handle = (*real).handle;
        (*srq).real_srq = real;
        (*real).srq_context = srq as *mut c_void;
    }
    srq
}

/// `ibv_modify_srq@IBVERBS_1.0`.
///
/// # Safety
///
/// `srq` NULL or a 1.0 SRQ; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_modify_srq_1_0(
    srq: *mut ibv_srq_1_0,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    need!(libc::EINVAL; srq);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_modify_srq((*srq).real_srq, attr, mask) }
}

/// `ibv_query_srq@IBVERBS_1.0`.
///
/// # Safety
///
/// `srq` NULL or a 1.0 SRQ; `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_srq_1_0(srq: *mut ibv_srq_1_0, attr: *mut ibv_srq_attr) -> c_int {
    need!(libc::EINVAL; srq);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_query_srq((*srq).real_srq, attr) }
}

/// `ibv_destroy_srq@IBVERBS_1.0`.
///
/// # Safety
///
/// `srq` NULL or a 1.0 SRQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_srq_1_0(srq: *mut ibv_srq_1_0) -> c_int {
    need!(libc::EINVAL; srq);
    // SAFETY: a 1.0 SRQ of this module.
    let ret = unsafe { __softverbs_ibv_destroy_srq((*srq).real_srq) };
    if ret == 0 {
        // SAFETY: ours, its SRQ gone.
        unsafe { release(srq) };
    }
    ret
}

/// `ibv_create_qp@IBVERBS_1.0`: the current QP's `qp_context` is the 1.0
/// QP; `attr.cap` gets the capacities granted.
///
/// # Safety
///
/// `pd` NULL or a 1.0 PD; `attr` readable and writable, its CQs (and
/// SRQ) 1.0 objects of the same context.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_qp_1_0(
    pd: *mut ibv_pd_1_0,
    attr: *mut ibv_qp_init_attr_1_0,
) -> *mut ibv_qp_1_0 {
    need!(null_mut(); pd, attr);
    // SAFETY: readable per the contract.
    let a = unsafe { &mut *attr };
    need!(null_mut(); a.send_cq, a.recv_cq);
    let qp = zalloc::<ibv_qp_1_0>();
    if qp.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 PD and 1.0 CQs/SRQ; `qp` zeroed and ours.
    unsafe {
        let mut real_attr = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: (*a.send_cq).real_cq,
            recv_cq: (*a.recv_cq).real_cq,
            srq: if a.srq.is_null() { null_mut() } else { (*a.srq).real_srq },
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let real = __softverbs_ibv_create_qp((*pd).real_pd, &mut real_attr);
        if real.is_null() {
            release(qp);
            return null_mut();
        }
        (*qp).context = (*pd).context;
        (*qp).qp_context = a.qp_context;
        (*qp).pd = pd;
        (*qp).send_cq = a.send_cq;
        (*qp).recv_cq = a.recv_cq;
        (*qp).srq = a.srq;
        (*qp).handle = (*real).handle;
        (*qp).qp_num = (*real).qp_num;
        (*qp).state = (*real).state;
        (*qp).qp_type = a.qp_type;
        (*qp).real_qp = real;
        a.cap = real_attr.cap;
        (*real).qp_context = qp as *mut c_void;
    }
    qp
}

/// `ibv_query_qp@IBVERBS_1.0`: the CQs and SRQ of `init` are the 1.0
/// objects (a QP without an SRQ gets NULL).
///
/// # Safety
///
/// `qp` NULL or a 1.0 QP; `attr`, `init` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_qp_1_0(
    qp: *mut ibv_qp_1_0,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr_1_0,
) -> c_int {
    need!(libc::EINVAL; qp, init);
    // SAFETY: all-zero is a valid init attribute; a 1.0 QP whose current
    // CQs and SRQ carry their 1.0 wrappers as their contexts.
    unsafe {
        let mut real: ibv_qp_init_attr = std::mem::zeroed();
        let ret = __softverbs_ibv_query_qp((*qp).real_qp, attr, mask, &mut real);
        if ret != 0 {
            return ret;
        }
        let back = |cq: *mut ibv_cq| {
            if cq.is_null() {
                null_mut()
            } else {
                (*cq).cq_context as *mut ibv_cq_1_0
            }
        };
        *init = ibv_qp_init_attr_1_0 {
            qp_context: (*qp).qp_context,
            send_cq: back(real.send_cq),
            recv_cq: back(real.recv_cq),
            srq: if real.srq.is_null() {
                null_mut()
            } else {
                (*real.srq).srq_context as *mut ibv_srq_1_0
            },
            cap: real.cap,
            qp_type: real.qp_type,
            sq_sig_all: real.sq_sig_all,
        };
    }
    0
}

/// `ibv_modify_qp@IBVERBS_1.0`.
///
/// # Safety
///
/// `qp` NULL or a 1.0 QP; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_modify_qp_1_0(
    qp: *mut ibv_qp_1_0,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    need!(libc::EINVAL; qp);
    // SAFETY: forwarded; the 1.0 QP mirrors the state.
    unsafe {
        let ret = __softverbs_ibv_modify_qp((*qp).real_qp, attr, mask);
        (*qp).state = (*(*qp).real_qp).state;
        ret
    }
}

/// `ibv_destroy_qp@IBVERBS_1.0`.
///
/// # Safety
///
/// `qp` NULL or a 1.0 QP.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_qp_1_0(qp: *mut ibv_qp_1_0) -> c_int {
    need!(libc::EINVAL; qp);
    // SAFETY: a 1.0 QP of this module.
    let ret = unsafe { __softverbs_ibv_destroy_qp((*qp).real_qp) };
    if ret == 0 {
        // SAFETY: ours, its QP gone.
        unsafe { release(qp) };
    }
    ret
}
