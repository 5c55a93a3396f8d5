//! The `IBVERBS_1.0` compatibility ABI: the verbs of libibverbs before
//! 1.1 (2006), whose objects were smaller structures than today's. rdma-core
//! still exports them as the non-default version `IBVERBS_1.0` of 33 names
//! (`ibv_get_device_list@IBVERBS_1.0`, `ibv_create_qp@IBVERBS_1.0`, …), so
//! a binary linked against a libibverbs of that time binds them; a binary
//! linked today binds the `IBVERBS_1.1` defaults and never sees these.
//!
//! As in rdma-core, each 1.0 object is a wrapper of its own layout around a
//! current object (`real_*`, its last field), made by the 1.0 verbs, which
//! call the current ones: the 1.0 context's operation table holds the five
//! data-path operations the 1.0 inlines call (`poll_cq`, `req_notify_cq`,
//! `post_send`, `post_recv`, `post_srq_recv`), each translating its
//! arguments; the current CQ, QP and SRQ carry their wrapper as their
//! `cq_context`/`qp_context`/`srq_context`, which is how completion-channel
//! and async events are mapped back to the wrappers the application knows.
//! Where rdma-core leaves a field of a wrapper uninitialized (the 1.0
//! context's other operations and descriptors) this library sets it: the
//! other operations are NULL, and `cmd_fd`, `async_fd` and
//! `num_comp_vectors` are those of the current context. Where rdma-core
//! dereferences a NULL (`ibv_query_qp` of a QP without an SRQ) this
//! library reports NULL.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int, c_uint};
use std::ptr::null_mut;

use crate::ffi::*;
use crate::objects::set_errno;

// The current verbs, by their exported implementation names (see
// `symbols.txt`): the 1.0 verbs are wrappers around them, as in rdma-core.
extern "C" {
    fn __softverbs_ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    fn __softverbs_ibv_free_device_list(list: *mut *mut ibv_device);
    fn __softverbs_ibv_get_device_name(dev: *mut ibv_device) -> *const c_char;
    fn __softverbs_ibv_get_device_guid(dev: *mut ibv_device) -> u64;
    fn __softverbs_ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context;
    fn __softverbs_ibv_close_device(ctx: *mut ibv_context) -> c_int;
    fn __softverbs_ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int;
    fn __softverbs_ibv_ack_async_event(event: *mut ibv_async_event);
    fn __softverbs_ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    fn __softverbs_ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int;
    fn __softverbs_ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
    fn __softverbs_ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int;
    fn __softverbs_ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd;
    fn __softverbs_ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    fn __softverbs_ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr;
    fn __softverbs_ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn __softverbs_ibv_create_cq(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        vector: c_int,
    ) -> *mut ibv_cq;
    fn __softverbs_ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int;
    fn __softverbs_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn __softverbs_ibv_get_cq_event(
        ch: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    fn __softverbs_ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint);
    fn __softverbs_ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    fn __softverbs_ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int;
    fn __softverbs_ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int;
    fn __softverbs_ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
    fn __softverbs_ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn __softverbs_ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        mask: c_int,
        init: *mut ibv_qp_init_attr,
    ) -> c_int;
    fn __softverbs_ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    fn __softverbs_ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    fn __softverbs_ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
    fn __softverbs_ibv_destroy_ah(ah: *mut ibv_ah) -> c_int;
    fn __softverbs_ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    fn __softverbs_ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
}

/// `struct ibv_device_1_0`.
#[repr(C)]
pub struct ibv_device_1_0 {
    obsolete_sysfs_dev: *mut c_void,
    obsolete_sysfs_ibdev: *mut c_void,
    /// The current device.
    pub real_device: *mut ibv_device,
    _ops: _ibv_device_ops,
}

type AnyFn = Option<unsafe extern "C" fn()>;

/// `struct ibv_context_ops_1_0`: only the five data-path operations are
/// set (see the module docs).
#[repr(C)]
pub struct ibv_context_ops_1_0 {
    query_device: AnyFn,
    query_port: AnyFn,
    alloc_pd: AnyFn,
    dealloc_pd: AnyFn,
    reg_mr: AnyFn,
    dereg_mr: AnyFn,
    create_cq: AnyFn,
    /// `poll_cq` on a 1.0 CQ.
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq_1_0, c_int, *mut ibv_wc) -> c_int>,
    /// `req_notify_cq` on a 1.0 CQ.
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq_1_0, c_int) -> c_int>,
    cq_event: AnyFn,
    resize_cq: AnyFn,
    destroy_cq: AnyFn,
    create_srq: AnyFn,
    modify_srq: AnyFn,
    query_srq: AnyFn,
    destroy_srq: AnyFn,
    /// `post_srq_recv` on a 1.0 SRQ.
    pub post_srq_recv:
        Option<unsafe extern "C" fn(*mut ibv_srq_1_0, *mut ibv_recv_wr_1_0, *mut *mut ibv_recv_wr_1_0) -> c_int>,
    create_qp: AnyFn,
    query_qp: AnyFn,
    modify_qp: AnyFn,
    destroy_qp: AnyFn,
    /// `post_send` on a 1.0 QP.
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp_1_0, *mut ibv_send_wr_1_0, *mut *mut ibv_send_wr_1_0) -> c_int>,
    /// `post_recv` on a 1.0 QP.
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp_1_0, *mut ibv_recv_wr_1_0, *mut *mut ibv_recv_wr_1_0) -> c_int>,
    create_ah: AnyFn,
    destroy_ah: AnyFn,
    attach_mcast: AnyFn,
    detach_mcast: AnyFn,
}

/// `struct ibv_context_1_0`.
#[repr(C)]
pub struct ibv_context_1_0 {
    /// The 1.0 device it was opened on.
    pub device: *mut ibv_device_1_0,
    /// The operations the 1.0 inlines call.
    pub ops: ibv_context_ops_1_0,
    /// As the current context's.
    pub cmd_fd: c_int,
    /// As the current context's.
    pub async_fd: c_int,
    /// As the current context's.
    pub num_comp_vectors: c_int,
    /// The current context.
    pub real_context: *mut ibv_context,
}

/// `struct ibv_pd_1_0`.
#[repr(C)]
pub struct ibv_pd_1_0 {
    context: *mut ibv_context_1_0,
    handle: u32,
    real_pd: *mut ibv_pd,
}

/// `struct ibv_mr_1_0`.
#[repr(C)]
pub struct ibv_mr_1_0 {
    context: *mut ibv_context_1_0,
    pd: *mut ibv_pd_1_0,
    handle: u32,
    /// The local key.
    pub lkey: u32,
    /// The remote key.
    pub rkey: u32,
    real_mr: *mut ibv_mr,
}

/// `struct ibv_srq_1_0`.
#[repr(C)]
pub struct ibv_srq_1_0 {
    context: *mut ibv_context_1_0,
    srq_context: *mut c_void,
    pd: *mut ibv_pd_1_0,
    handle: u32,
    mutex: libc::pthread_mutex_t,
    cond: libc::pthread_cond_t,
    events_completed: u32,
    real_srq: *mut ibv_srq,
}

/// `struct ibv_qp_init_attr_1_0`.
#[repr(C)]
pub struct ibv_qp_init_attr_1_0 {
    /// The application's context for the QP.
    pub qp_context: *mut c_void,
    /// 1.0 CQs.
    pub send_cq: *mut ibv_cq_1_0,
    /// 1.0 CQs.
    pub recv_cq: *mut ibv_cq_1_0,
    /// A 1.0 SRQ or NULL.
    pub srq: *mut ibv_srq_1_0,
    /// Capacities (updated to those granted).
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_uint,
    /// Signal every send.
    pub sq_sig_all: c_int,
}

/// The `wr` union of `struct ibv_send_wr_1_0` (its UD AH is a 1.0 AH).
#[repr(C)]
#[derive(Clone, Copy)]
pub union send_wr_wr_1_0 {
    /// RDMA operations.
    pub rdma: wr_rdma,
    /// Atomics.
    pub atomic: wr_atomic,
    /// UD sends.
    pub ud: wr_ud_1_0,
}

/// `wr.ud` of `struct ibv_send_wr_1_0`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_ud_1_0 {
    /// A 1.0 AH.
    pub ah: *mut ibv_ah_1_0,
    /// Destination QP.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
}

/// `struct ibv_send_wr_1_0`: `next` before `wr_id`, no XRC or bind fields.
#[repr(C)]
pub struct ibv_send_wr_1_0 {
    /// The next WR of the chain.
    pub next: *mut ibv_send_wr_1_0,
    /// The application's id.
    pub wr_id: u64,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: c_uint,
    /// `enum ibv_send_flags`.
    pub send_flags: c_int,
    /// Big-endian immediate data.
    pub imm_data: u32,
    /// Per-operation fields.
    pub wr: send_wr_wr_1_0,
}

const _: () = assert!(std::mem::size_of::<send_wr_wr_1_0>() == std::mem::size_of::<send_wr_wr>());

/// `struct ibv_recv_wr_1_0`: `next` before `wr_id`.
#[repr(C)]
pub struct ibv_recv_wr_1_0 {
    /// The next WR of the chain.
    pub next: *mut ibv_recv_wr_1_0,
    /// The application's id.
    pub wr_id: u64,
    /// Scatter/gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
}

/// `struct ibv_qp_1_0`.
#[repr(C)]
pub struct ibv_qp_1_0 {
    /// The 1.0 context.
    pub context: *mut ibv_context_1_0,
    /// The application's context.
    pub qp_context: *mut c_void,
    pd: *mut ibv_pd_1_0,
    send_cq: *mut ibv_cq_1_0,
    recv_cq: *mut ibv_cq_1_0,
    srq: *mut ibv_srq_1_0,
    handle: u32,
    /// The QP number.
    pub qp_num: u32,
    state: c_uint,
    /// `enum ibv_qp_type`.
    pub qp_type: c_uint,
    mutex: libc::pthread_mutex_t,
    cond: libc::pthread_cond_t,
    events_completed: u32,
    real_qp: *mut ibv_qp,
}

/// `struct ibv_cq_1_0`.
#[repr(C)]
pub struct ibv_cq_1_0 {
    /// The 1.0 context.
    pub context: *mut ibv_context_1_0,
    /// The application's context.
    pub cq_context: *mut c_void,
    handle: u32,
    /// The number of entries asked for.
    pub cqe: c_int,
    mutex: libc::pthread_mutex_t,
    cond: libc::pthread_cond_t,
    comp_events_completed: u32,
    async_events_completed: u32,
    real_cq: *mut ibv_cq,
}

/// `struct ibv_ah_1_0`.
#[repr(C)]
pub struct ibv_ah_1_0 {
    context: *mut ibv_context_1_0,
    pd: *mut ibv_pd_1_0,
    handle: u32,
    real_ah: *mut ibv_ah,
}

/// A zeroed `T` from `calloc` (NULL with `errno` = `ENOMEM` if none).
fn zalloc<T>() -> *mut T {
    // SAFETY: plain allocation; calloc sets errno on failure.
    unsafe { libc::calloc(1, std::mem::size_of::<T>()) as *mut T }
}

/// Frees what [`zalloc`] (or `calloc`) returned.
///
/// # Safety
///
/// `p` from `calloc`, not used after.
unsafe fn release<T>(p: *mut T) {
    // SAFETY: the caller's promise.
    unsafe { libc::free(p as *mut c_void) }
}

/// `EINVAL` and `ret` for a NULL object.
macro_rules! need {
    ($ret:expr; $($p:expr),+) => {
        if $($p.is_null())||+ {
            set_errno(libc::EINVAL);
            return $ret;
        }
    };
}

// Declared after `need!`, which its verbs use (a macro is in scope from
// its definition on).
mod queues;

/// `ibv_get_device_list@IBVERBS_1.0`: 1.0 devices around the current
/// list (kept in front of the returned array, for the free).
///
/// # Safety
///
/// `num` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_list_1_0(num: *mut c_int) -> *mut *mut ibv_device_1_0 {
    let mut n = 0;
    // SAFETY: `n` writable.
    let real = unsafe { __softverbs_ibv_get_device_list(&mut n) };
    if real.is_null() {
        return null_mut();
    }
    let count = usize::try_from(n).unwrap_or(0);
    // SAFETY: plain allocation of count + 2 pointers (the current list, the
    // devices, the NULL end).
    let l = unsafe { libc::calloc(count + 2, std::mem::size_of::<*mut c_void>()) as *mut *mut ibv_device_1_0 };
    if l.is_null() {
        // SAFETY: the list just returned.
        unsafe { __softverbs_ibv_free_device_list(real) };
        return null_mut();
    }
    // SAFETY: `l` has count + 2 zeroed slots; `real` count entries.
    unsafe {
        *l = real as *mut ibv_device_1_0;
        for i in 0..count {
            let d = zalloc::<ibv_device_1_0>();
            if d.is_null() {
                for k in 1..=count {
                    release(*l.add(k));
                }
                release(l);
                __softverbs_ibv_free_device_list(real);
                return null_mut();
            }
            (*d).real_device = *real.add(i);
            *l.add(i + 1) = d;
        }
        if !num.is_null() {
            *num = n;
        }
        l.add(1)
    }
}

/// `ibv_free_device_list@IBVERBS_1.0`.
///
/// # Safety
///
/// `list` NULL or from `ibv_get_device_list@IBVERBS_1.0`, not used after.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_free_device_list_1_0(list: *mut *mut ibv_device_1_0) {
    if list.is_null() {
        return;
    }
    // SAFETY: the array this module made: NULL-terminated, the current
    // list in the slot before it.
    unsafe {
        let mut p = list;
        while !(*p).is_null() {
            release(*p);
            p = p.add(1);
        }
        __softverbs_ibv_free_device_list(*list.sub(1) as *mut *mut ibv_device);
        release(list.sub(1));
    }
}

/// `ibv_get_device_name@IBVERBS_1.0`.
///
/// # Safety
///
/// `dev` NULL or a 1.0 device.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_name_1_0(dev: *mut ibv_device_1_0) -> *const c_char {
    need!(std::ptr::null(); dev);
    // SAFETY: a 1.0 device of this module.
    unsafe { __softverbs_ibv_get_device_name((*dev).real_device) }
}

/// `ibv_get_device_guid@IBVERBS_1.0`.
///
/// # Safety
///
/// `dev` NULL or a 1.0 device.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_guid_1_0(dev: *mut ibv_device_1_0) -> u64 {
    need!(0; dev);
    // SAFETY: a 1.0 device of this module.
    unsafe { __softverbs_ibv_get_device_guid((*dev).real_device) }
}

unsafe extern "C" fn poll_cq_1_0(cq: *mut ibv_cq_1_0, n: c_int, wc: *mut ibv_wc) -> c_int {
    need!(-libc::EINVAL; cq);
    // SAFETY: a 1.0 CQ of this module, its context open.
    unsafe {
        let real = (*cq).real_cq;
        match (*(*real).context).ops.poll_cq {
            Some(f) => f(real, n, wc),
            None => -libc::EOPNOTSUPP,
        }
    }
}

unsafe extern "C" fn req_notify_cq_1_0(cq: *mut ibv_cq_1_0, solicited: c_int) -> c_int {
    need!(libc::EINVAL; cq);
    // SAFETY: as in poll_cq_1_0.
    unsafe {
        let real = (*cq).real_cq;
        match (*(*real).context).ops.req_notify_cq {
            Some(f) => f(real, solicited),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Converts a 1.0 receive chain into current WRs (`out`, linked), for one
/// post.
///
/// # Safety
///
/// `wr` a readable chain; `out` is not moved until the post returns.
unsafe fn recv_chain(wr: *mut ibv_recv_wr_1_0, out: &mut Vec<ibv_recv_wr>) -> Vec<*mut ibv_recv_wr_1_0> {
    let mut src = Vec::new();
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: the chain is readable (the post's contract).
        unsafe {
            out.push(ibv_recv_wr {
                wr_id: (*w).wr_id,
                next: null_mut(),
                sg_list: (*w).sg_list,
                num_sge: (*w).num_sge,
            });
            src.push(w);
            w = (*w).next;
        }
    }
    let base = out.as_mut_ptr();
    for i in 1..out.len() {
        // SAFETY: in bounds; `out` no longer grows.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    src
}

/// Maps the current `bad` WR back to its 1.0 original.
///
/// # Safety
///
/// `bad_wr` NULL or writable.
unsafe fn map_bad<C, R>(ret: c_int, bad: *mut C, conv: &[C], src: &[*mut R], bad_wr: *mut *mut R) -> c_int {
    if ret != 0 && !bad_wr.is_null() {
        if let Some(i) = conv.iter().position(|c| std::ptr::eq(c, bad)) {
            // SAFETY: writable per the contract.
            unsafe { *bad_wr = src[i] };
        }
    }
    ret
}

unsafe extern "C" fn post_recv_1_0(
    qp: *mut ibv_qp_1_0,
    wr: *mut ibv_recv_wr_1_0,
    bad_wr: *mut *mut ibv_recv_wr_1_0,
) -> c_int {
    need!(libc::EINVAL; qp);
    let mut conv = Vec::new();
    // SAFETY: the post's contract.
    let src = unsafe { recv_chain(wr, &mut conv) };
    let mut bad = null_mut();
    // SAFETY: a 1.0 QP of this module; a linked chain that lives across
    // the call.
    let ret = unsafe {
        let real = (*qp).real_qp;
        let head = conv.first_mut().map_or(null_mut(), |w| w as *mut ibv_recv_wr);
        match (*(*real).context).ops.post_recv {
            Some(f) => f(real, head, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    };
    // SAFETY: as above.
    unsafe { map_bad(ret, bad, &conv, &src, bad_wr) }
}

unsafe extern "C" fn post_srq_recv_1_0(
    srq: *mut ibv_srq_1_0,
    wr: *mut ibv_recv_wr_1_0,
    bad_wr: *mut *mut ibv_recv_wr_1_0,
) -> c_int {
    need!(libc::EINVAL; srq);
    let mut conv = Vec::new();
    // SAFETY: the post's contract.
    let src = unsafe { recv_chain(wr, &mut conv) };
    let mut bad = null_mut();
    // SAFETY: a 1.0 SRQ of this module; a linked chain that lives across
    // the call.
    let ret = unsafe {
        let real = (*srq).real_srq;
        let head = conv.first_mut().map_or(null_mut(), |w| w as *mut ibv_recv_wr);
        match (*(*real).context).ops.post_srq_recv {
            Some(f) => f(real, head, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    };
    // SAFETY: as above.
    unsafe { map_bad(ret, bad, &conv, &src, bad_wr) }
}

unsafe extern "C" fn post_send_1_0(
    qp: *mut ibv_qp_1_0,
    wr: *mut ibv_send_wr_1_0,
    bad_wr: *mut *mut ibv_send_wr_1_0,
) -> c_int {
    need!(libc::EINVAL; qp);
    let mut conv: Vec<ibv_send_wr> = Vec::new();
    let mut src = Vec::new();
    // SAFETY: a 1.0 QP of this module.
    let ud = unsafe { (*qp).qp_type } == 4;
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: the chain is readable (the post's contract); all-zero is
        // a valid `ibv_send_wr`; a UD WR names a live 1.0 AH.
        unsafe {
            let mut c: ibv_send_wr = std::mem::zeroed();
            c.wr_id = (*w).wr_id;
            c.sg_list = (*w).sg_list;
            c.num_sge = (*w).num_sge;
            c.opcode = (*w).opcode;
            c.send_flags = (*w).send_flags as c_uint;
            c.imm_data = (*w).imm_data;
            c.wr = if ud {
                let u = (*w).wr.ud;
                send_wr_wr {
                    ud: wr_ud {
                        ah: if u.ah.is_null() { null_mut() } else { (*u.ah).real_ah },
                        remote_qpn: u.remote_qpn,
                        remote_qkey: u.remote_qkey,
                    },
                }
            } else {
                // The union as it is, bytes the application left unset
                // included (the two unions have the same layout then).
                let mut u: send_wr_wr = std::mem::zeroed();
                std::ptr::copy_nonoverlapping(
                    std::ptr::addr_of!((*w).wr) as *const u8,
                    std::ptr::addr_of_mut!(u) as *mut u8,
                    std::mem::size_of::<send_wr_wr>(),
                );
                u
            };
            conv.push(c);
            src.push(w);
            w = (*w).next;
        }
    }
    let base = conv.as_mut_ptr();
    for i in 1..conv.len() {
        // SAFETY: in bounds; `conv` no longer grows.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    let mut bad = null_mut();
    // SAFETY: a 1.0 QP of this module; a linked chain that lives across
    // the call.
    let ret = unsafe {
        let real = (*qp).real_qp;
        let head = conv.first_mut().map_or(null_mut(), |w| w as *mut ibv_send_wr);
        match (*(*real).context).ops.post_send {
            Some(f) => f(real, head, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    };
    // SAFETY: as above.
    unsafe { map_bad(ret, bad, &conv, &src, bad_wr) }
}

/// `ibv_open_device@IBVERBS_1.0`.
///
/// # Safety
///
/// `dev` NULL or a 1.0 device.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_open_device_1_0(dev: *mut ibv_device_1_0) -> *mut ibv_context_1_0 {
    need!(null_mut(); dev);
    let ctx = zalloc::<ibv_context_1_0>();
    if ctx.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 device of this module; `ctx` zeroed and ours.
    unsafe {
        let real = __softverbs_ibv_open_device((*dev).real_device);
        if real.is_null() {
            release(ctx);
            return null_mut();
        }
        (*ctx).device = dev;
        (*ctx).real_context = real;
        (*ctx).cmd_fd = (*real).cmd_fd;
        (*ctx).async_fd = (*real).async_fd;
        (*ctx).num_comp_vectors = (*real).num_comp_vectors;
        (*ctx).ops.poll_cq = Some(poll_cq_1_0);
        (*ctx).ops.req_notify_cq = Some(req_notify_cq_1_0);
        (*ctx).ops.post_send = Some(post_send_1_0);
        (*ctx).ops.post_recv = Some(post_recv_1_0);
        (*ctx).ops.post_srq_recv = Some(post_srq_recv_1_0);
    }
    ctx
}

/// `ibv_close_device@IBVERBS_1.0`.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_close_device_1_0(ctx: *mut ibv_context_1_0) -> c_int {
    need!(libc::EINVAL; ctx);
    // SAFETY: a 1.0 context of this module.
    let ret = unsafe { __softverbs_ibv_close_device((*ctx).real_context) };
    if ret == 0 {
        // SAFETY: ours, closed.
        unsafe { release(ctx) };
    }
    ret
}

/// The event types whose element is a CQ, a QP or an SRQ.
fn element_kind(event_type: c_uint) -> Option<u8> {
    match event_type {
        0 => Some(b'c'),
        1..=7 | 16 => Some(b'q'),
        14 | 15 => Some(b's'),
        _ => None,
    }
}

/// `ibv_get_async_event@IBVERBS_1.0`: the element is the 1.0 object.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context; `event` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_async_event_1_0(
    ctx: *mut ibv_context_1_0,
    event: *mut ibv_async_event,
) -> c_int {
    need!(-1; ctx, event);
    // SAFETY: a 1.0 context; `event` writable; the objects of the
    // context's events are live current objects whose application
    // context is their 1.0 wrapper (this module made them).
    unsafe {
        let ret = __softverbs_ibv_get_async_event((*ctx).real_context, event);
        if ret != 0 {
            return ret;
        }
        let e = &mut *event;
        match element_kind(e.event_type) {
            Some(b'c') => e.element.cq = (*e.element.cq).cq_context as *mut ibv_cq,
            Some(b'q') => e.element.qp = (*e.element.qp).qp_context as *mut ibv_qp,
            Some(b's') => e.element.srq = (*e.element.srq).srq_context as *mut ibv_srq,
            _ => {}
        }
        0
    }
}

/// `ibv_ack_async_event@IBVERBS_1.0`.
///
/// # Safety
///
/// `event` NULL or filled by `ibv_get_async_event@IBVERBS_1.0`.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_ack_async_event_1_0(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: an event of the 1.0 verb: its element is a live 1.0 object.
    unsafe {
        let mut real = ibv_async_event {
            element: (*event).element,
            event_type: (*event).event_type,
        };
        match element_kind(real.event_type) {
            Some(b'c') => real.element.cq = (*(real.element.cq as *mut ibv_cq_1_0)).real_cq,
            Some(b'q') => real.element.qp = (*(real.element.qp as *mut ibv_qp_1_0)).real_qp,
            Some(b's') => real.element.srq = (*(real.element.srq as *mut ibv_srq_1_0)).real_srq,
            _ => {}
        }
        __softverbs_ibv_ack_async_event(&mut real);
    }
}

/// `ibv_query_device@IBVERBS_1.0`.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context; `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_device_1_0(
    ctx: *mut ibv_context_1_0,
    attr: *mut ibv_device_attr,
) -> c_int {
    need!(libc::EINVAL; ctx);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_query_device((*ctx).real_context, attr) }
}

/// `ibv_query_port@IBVERBS_1.0`.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context; `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_port_1_0(
    ctx: *mut ibv_context_1_0,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    need!(libc::EINVAL; ctx);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_query_port((*ctx).real_context, port, attr) }
}

/// `ibv_query_gid@IBVERBS_1.0`.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context; `gid` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_gid_1_0(
    ctx: *mut ibv_context_1_0,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    need!(-1; ctx);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_query_gid((*ctx).real_context, port, index, gid) }
}

/// `ibv_query_pkey@IBVERBS_1.0`.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context; `pkey` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_pkey_1_0(
    ctx: *mut ibv_context_1_0,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    need!(-1; ctx);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_query_pkey((*ctx).real_context, port, index, pkey) }
}

/// `ibv_alloc_pd@IBVERBS_1.0`.
///
/// # Safety
///
/// `ctx` NULL or a 1.0 context.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_alloc_pd_1_0(ctx: *mut ibv_context_1_0) -> *mut ibv_pd_1_0 {
    need!(null_mut(); ctx);
    let pd = zalloc::<ibv_pd_1_0>();
    if pd.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 context; `pd` zeroed and ours.
    unsafe {
        let real = __softverbs_ibv_alloc_pd((*ctx).real_context);
        if real.is_null() {
            release(pd);
            return null_mut();
        }
        (*pd).context = ctx;
        (*pd).handle = (*real).handle;
        (*pd).real_pd = real;
    }
    pd
}

/// `ibv_dealloc_pd@IBVERBS_1.0`.
///
/// # Safety
///
/// `pd` NULL or a 1.0 PD.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_dealloc_pd_1_0(pd: *mut ibv_pd_1_0) -> c_int {
    need!(libc::EINVAL; pd);
    // SAFETY: a 1.0 PD of this module.
    let ret = unsafe { __softverbs_ibv_dealloc_pd((*pd).real_pd) };
    if ret == 0 {
        // SAFETY: ours, its PD gone.
        unsafe { release(pd) };
    }
    ret
}

/// `ibv_reg_mr@IBVERBS_1.0`.
///
/// # Safety
///
/// `pd` NULL or a 1.0 PD; the memory as `ibv_reg_mr` requires.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_reg_mr_1_0(
    pd: *mut ibv_pd_1_0,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr_1_0 {
    need!(null_mut(); pd);
    let mr = zalloc::<ibv_mr_1_0>();
    if mr.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 PD; `mr` zeroed and ours.
    unsafe {
        let real = __softverbs_ibv_reg_mr((*pd).real_pd, addr, len, access);
        if real.is_null() {
            release(mr);
            return null_mut();
        }
        (*mr).context = (*pd).context;
        (*mr).pd = pd;
        (*mr).handle = (*real).handle;
        (*mr).lkey = (*real).lkey;
        (*mr).rkey = (*real).rkey;
        (*mr).real_mr = real;
    }
    mr
}

/// `ibv_dereg_mr@IBVERBS_1.0`.
///
/// # Safety
///
/// `mr` NULL or a 1.0 MR.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_dereg_mr_1_0(mr: *mut ibv_mr_1_0) -> c_int {
    need!(libc::EINVAL; mr);
    // SAFETY: a 1.0 MR of this module.
    let ret = unsafe { __softverbs_ibv_dereg_mr((*mr).real_mr) };
    if ret == 0 {
        // SAFETY: ours, its MR gone.
        unsafe { release(mr) };
    }
    ret
}

/// `ibv_create_ah@IBVERBS_1.0`.
///
/// # Safety
///
/// `pd` NULL or a 1.0 PD; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_ah_1_0(pd: *mut ibv_pd_1_0, attr: *mut ibv_ah_attr) -> *mut ibv_ah_1_0 {
    need!(null_mut(); pd);
    let ah = zalloc::<ibv_ah_1_0>();
    if ah.is_null() {
        return null_mut();
    }
    // SAFETY: a 1.0 PD; `ah` zeroed and ours.
    unsafe {
        let real = __softverbs_ibv_create_ah((*pd).real_pd, attr);
        if real.is_null() {
            release(ah);
            return null_mut();
        }
        (*ah).context = (*pd).context;
        (*ah).pd = pd;
        (*ah).handle = (*real).handle;
        (*ah).real_ah = real;
    }
    ah
}

/// `ibv_destroy_ah@IBVERBS_1.0`.
///
/// # Safety
///
/// `ah` NULL or a 1.0 AH.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_ah_1_0(ah: *mut ibv_ah_1_0) -> c_int {
    need!(libc::EINVAL; ah);
    // SAFETY: a 1.0 AH of this module.
    let ret = unsafe { __softverbs_ibv_destroy_ah((*ah).real_ah) };
    if ret == 0 {
        // SAFETY: ours, its AH gone.
        unsafe { release(ah) };
    }
    ret
}

/// `ibv_attach_mcast@IBVERBS_1.0` (multicast is not offered: as the
/// current verb, `EOPNOTSUPP`).
///
/// # Safety
///
/// `qp` NULL or a 1.0 QP.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_attach_mcast_1_0(qp: *mut ibv_qp_1_0, gid: *const ibv_gid, lid: u16) -> c_int {
    need!(libc::EINVAL; qp);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_attach_mcast((*qp).real_qp, gid, lid) }
}

/// `ibv_detach_mcast@IBVERBS_1.0` (as the current verb, `EOPNOTSUPP`).
///
/// # Safety
///
/// `qp` NULL or a 1.0 QP.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_detach_mcast_1_0(qp: *mut ibv_qp_1_0, gid: *const ibv_gid, lid: u16) -> c_int {
    need!(libc::EINVAL; qp);
    // SAFETY: forwarded.
    unsafe { __softverbs_ibv_detach_mcast((*qp).real_qp, gid, lid) }
}
