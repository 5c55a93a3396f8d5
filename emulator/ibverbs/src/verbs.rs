//! The control verbs: devices, contexts, PDs, MRs, MWs, channels, CQs,
//! QPs, SRQs, AHs and async events.
//!
//! Every function is `extern "C"` with the signature of its `verbs.h`
//! declaration. Pointers that libibverbs documents as required are
//! checked for NULL (`EINVAL`); beyond that, as with libibverbs, the
//! caller must pass objects of this library that are still alive.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int, c_uint};
use std::ptr::null_mut;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use softverbs::verbs::{
    AccessFlags, AhAttr, AsyncElement, Error, Gid, GlobalRoute, MemorySource, MigState, Mtu, MwType, QpAttr,
    QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RawRegion, ReregFlags, SrqAttr, SrqAttrMask,
};

use crate::ffi::*;
use crate::objects::*;
use crate::state;

/// Sets errno from a softverbs error and returns it (for verbs that
/// return the error number).
fn fail(e: &Error) -> c_int {
    let n = e.errno();
    set_errno(n);
    n
}

/// The shape of every `ibv_destroy_*`, `ibv_dealloc_*` and `ibv_dereg_mr`:
/// `destroy` releases the backend object (and does the object's own
/// bookkeeping); only if it succeeds is the library's object freed.
/// Returns 0, or the errno of the failure (also in `errno`), the object
/// kept.
///
/// # Safety
///
/// `p` is a live object of this library made by [`into_raw`] as a `T`,
/// which the application no longer uses once this returns 0.
unsafe fn destroy_then_free<T>(p: *mut T, destroy: impl FnOnce(&T) -> softverbs::verbs::Result<()>) -> c_int {
    // SAFETY: live, by the caller's promise.
    match destroy(unsafe { &*p }) {
        Ok(()) => {
            // SAFETY: made by into_raw as a T; released, the application
            // lets go.
            unsafe { free_raw(p) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// Sets errno and returns NULL (for verbs that return an object).
fn fail_null<T>(n: c_int) -> *mut T {
    set_errno(n);
    null_mut()
}

macro_rules! null_check {
    ($ret:expr; $($p:expr),+) => {
        if $($p.is_null())||+ {
            set_errno(libc::EINVAL);
            return $ret;
        }
    };
}

// ---------------------------------------------------------------- devices

/// `ibv_get_device_list`.
///
/// # Safety
///
/// `num` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let devs = state::present_devices();
    let mut v: Vec<*mut ibv_device> = devs.iter().map(|d| &d.dev as *const ibv_device as *mut _).collect();
    if !num.is_null() {
        // SAFETY: the caller passes a writable int or NULL.
        unsafe { *num = v.len() as c_int };
    }
    v.push(null_mut());
    // The list is freed by ibv_free_device_list, which needs its length:
    // a boxed slice of len+1 entries, the last NULL.
    let b = v.into_boxed_slice();
    Box::into_raw(b) as *mut *mut ibv_device
}

/// `ibv_free_device_list`.
///
/// # Safety
///
/// `list` is NULL or came from `ibv_get_device_list`, not freed yet.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated (we built it so).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: rebuilds the boxed slice of n+1 entries made above.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// `ibv_get_device_name`.
///
/// # Safety
///
/// `dev` is NULL or a device of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    null_check!(std::ptr::null(); dev);
    // SAFETY: a device of this library; the name array is NUL-terminated.
    unsafe { (*dev).name.as_ptr() }
}

/// `ibv_get_device_guid`: the node GUID in network byte order.
///
/// # Safety
///
/// `dev` is NULL or a device of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    match state::is_known(dev) {
        Some(d) => d.guid.to_be(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    }
}

/// `ibv_get_device_index`: -1 (the soft devices have no kernel index).
///
/// # Safety
///
/// Any pointer.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_device_index(_dev: *mut ibv_device) -> c_int {
    -1
}

/// `ibv_open_device`.
///
/// # Safety
///
/// `dev` is NULL or a device of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let Some(d) = state::is_known(dev) else {
        return fail_null(libc::EINVAL);
    };
    if d.removed() {
        // A device pointer kept from a list taken before the removal.
        return fail_null(libc::ENODEV);
    }
    let ctx = match d.device.open() {
        Ok(c) => c,
        Err(e) => return fail_null(e.errno()),
    };
    let async_fd = match app_fd(std::os::fd::AsRawFd::as_raw_fd(&ctx)) {
        Ok(fd) => fd,
        Err(e) => return fail_null(e),
    };
    // SAFETY: verbs_context is plain data (nullable function pointers,
    // integers, pointers and a pthread mutex, for which all-zero bytes are
    // valid; the mutex is initialised right after).
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.sz = std::mem::size_of::<verbs_context>();
    vctx.query_port = Some(crate::verbs::query_port_ex);
    vctx.query_device_ex = Some(crate::verbs::query_device_ex);
    vctx.create_cq_ex = Some(crate::ex::create_cq_ex);
    vctx.create_qp_ex = Some(crate::ex::create_qp_ex);
    let c = &mut vctx.context;
    c.device = dev;
    c.cmd_fd = -1;
    c.async_fd = async_fd;
    c.num_comp_vectors = 1;
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.ops.alloc_mw = Some(alloc_mw);
    c.ops.bind_mw = Some(crate::data::bind_mw);
    c.ops.dealloc_mw = Some(dealloc_mw);
    c.ops.poll_cq = Some(crate::data::poll_cq);
    c.ops.req_notify_cq = Some(crate::data::req_notify_cq);
    c.ops.post_srq_recv = Some(crate::data::post_srq_recv);
    c.ops.post_send = Some(crate::data::post_send);
    c.ops.post_recv = Some(crate::data::post_recv);
    let sv = into_raw(SvContext {
        vctx,
        ctx,
        dev: d,
        qps: Mutex::new(Default::default()),
    });
    // SAFETY: just allocated; the application gets the embedded context.
    unsafe { &mut (*sv).vctx.context }
}

/// `ibv_close_device`.
///
/// # Safety
///
/// `ctx` is NULL or an open context of this library; none of its objects
/// may be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_close_device(ctx: *mut ibv_context) -> c_int {
    null_check!(libc::EINVAL; ctx);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) } as *const SvContext as *mut SvContext;
    // SAFETY: as above.
    let async_fd = unsafe { (*ctx).async_fd };
    // SAFETY: made by into_raw in ibv_open_device; the application gives
    // it up here. Objects still alive keep the device engine alive
    // through their own references.
    unsafe { free_raw(sv) };
    close_app_fd(async_fd);
    0
}

/// The descriptor the application gets for the provider's event
/// descriptor `fd` (a completion channel's, a context's async events'):
/// an epoll instance watching `fd`, level-triggered, so it is readable
/// exactly when `fd` is, for `poll`/`epoll`/`select`. It is a file of its
/// own because the provider's descriptor is non-blocking for its own reads
/// while the application's starts blocking, as the kernel's does: an
/// application that sets `O_NONBLOCK` on it (`fcntl`) changes only this
/// one, and the library reads that flag to choose between waiting and
/// `EAGAIN`.
///
/// # Errors
///
/// The errno of `epoll_create1`/`epoll_ctl` (`EMFILE`, `ENOMEM`).
fn app_fd(fd: c_int) -> Result<c_int, c_int> {
    // SAFETY: no memory is passed; a negative return is an error.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(errno());
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: `ev` is a live epoll_event; `ep` and `fd` are open.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        let e = errno();
        close_app_fd(ep);
        return Err(e);
    }
    Ok(ep)
}

/// Closes a descriptor made by [`app_fd`].
fn close_app_fd(fd: c_int) {
    // SAFETY: the library's own descriptor, closed once, by its owner.
    unsafe { libc::close(fd) };
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn fill_device_attr(a: &softverbs::verbs::DeviceAttr, out: &mut ibv_device_attr) {
    // SAFETY: ibv_device_attr is plain data.
    *out = unsafe { std::mem::zeroed() };
    for (d, b) in out.fw_ver.iter_mut().zip(a.fw_ver.bytes().take(63)) {
        *d = b as c_char;
    }
    out.node_guid = a.node_guid.0.to_be();
    out.sys_image_guid = a.sys_image_guid.0.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = a.page_size_cap;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    out.max_qp = i(a.max_qp);
    out.max_qp_wr = i(a.max_qp_wr);
    out.device_cap_flags = a.device_cap_flags.bits() as c_uint;
    out.max_sge = i(a.max_sge);
    out.max_sge_rd = i(a.max_sge_rd);
    out.max_cq = i(a.max_cq);
    out.max_cqe = i(a.max_cqe);
    out.max_mr = i(a.max_mr);
    out.max_pd = i(a.max_pd);
    out.max_qp_rd_atom = i(a.max_qp_rd_atom);
    out.max_res_rd_atom = i(a.max_res_rd_atom);
    out.max_qp_init_rd_atom = i(a.max_qp_init_rd_atom);
    out.atomic_cap = a.atomic_cap.map_or(0, |c| c.as_raw());
    out.max_mw = i(a.max_mw);
    out.max_ah = i(a.max_ah);
    out.max_srq = i(a.max_srq);
    out.max_srq_wr = i(a.max_srq_wr);
    out.max_srq_sge = i(a.max_srq_sge);
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = a.local_ca_ack_delay;
    out.phys_port_cnt = a.phys_port_cnt;
}

/// `ibv_query_device`.
///
/// # Safety
///
/// `ctx` an open context, `attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    null_check!(libc::EINVAL; ctx, attr);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.query_device() {
        Ok(a) => {
            // SAFETY: the caller passes a writable ibv_device_attr.
            fill_device_attr(&a, unsafe { &mut *attr });
            0
        }
        Err(e) => fail(&e),
    }
}

/// `verbs_context::query_device_ex` (what the static inline
/// `ibv_query_device_ex` calls).
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    null_check!(libc::EINVAL; ctx, attr);
    // SAFETY: `input` is NULL or readable, per the verb's contract.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    let min = std::mem::offset_of!(ibv_device_attr_ex, comp_mask);
    if attr_size < min {
        return libc::EINVAL;
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let a = match sv.ctx.query_device() {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    // SAFETY: plain data, all-zero is valid.
    let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    fill_device_attr(&a, &mut ex.orig_attr);
    ex.phys_port_cnt_ex = u32::from(a.phys_port_cnt);
    ex.device_cap_flags_ex = a.device_cap_flags.bits();
    let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's buffer holds `attr_size` bytes; n ≤ both sizes.
    unsafe { std::ptr::copy_nonoverlapping(&ex as *const _ as *const u8, attr as *mut u8, n) };
    0
}

fn fill_port_attr(p: &softverbs::verbs::PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state.as_raw(),
        max_mtu: p.max_mtu.as_raw(),
        active_mtu: p.active_mtu.as_raw(),
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer.as_raw(),
        flags: 0,
        port_cap_flags2: 0,
    }
}

/// `verbs_context::query_port` (what the static inline `ibv_query_port`
/// calls): fills `len` bytes of the port attributes.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    null_check!(libc::EINVAL; ctx, attr);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.query_port(port) {
        Ok(p) => {
            let mut a = fill_port_attr(&p);
            if let Some(cap) = sv.dev.mtu_cap {
                a.active_mtu = a.active_mtu.min(cap);
            }
            let n = len.min(std::mem::size_of::<ibv_port_attr>());
            // SAFETY: the caller's buffer holds `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_query_port` (the exported symbol, which programs built against
/// headers older than `verbs_context::query_port` call with the smaller
/// `struct _compat_ibv_port_attr`): fills the fields up to `link_layer`
/// and the byte after it, the layout every version of the struct shares.
///
/// # Safety
///
/// `ctx` an open context, `attr` a writable port attribute struct of any
/// rdma-core version.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    let len = std::mem::offset_of!(ibv_port_attr, flags) + 1;
    // SAFETY: forwarded contract; `len` bytes fit every version.
    unsafe { query_port_ex(ctx, port, attr, len) }
}

/// `ibv_query_gid`.
///
/// # Safety
///
/// `ctx` an open context, `gid` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    null_check!(-1; ctx, gid);
    if index < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.query_gid(port, index as u32) {
        Ok(g) => {
            // SAFETY: writable per the contract.
            unsafe { (*gid).raw = g.0 };
            0
        }
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// `_ibv_query_gid_ex` (behind the static inline `ibv_query_gid_ex`).
///
/// # Safety
///
/// `ctx` an open context, `entry` writable for `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    null_check!(libc::EINVAL; ctx, entry);
    if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() || port > 255 {
        return libc::EINVAL;
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.query_gid(port as u8, index) {
        Ok(g) if g.is_zero() => libc::ENODATA,
        Ok(g) => {
            // SAFETY: writable per the contract.
            unsafe {
                *entry = ibv_gid_entry {
                    gid: ibv_gid { raw: g.0 },
                    gid_index: index,
                    port_num: port,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                }
            };
            0
        }
        Err(e) => e.errno(),
    }
}

/// `_ibv_query_gid_table`: the non-empty GID entries of every port.
///
/// # Safety
///
/// `ctx` an open context, `entries` writable for `max_entries` entries of
/// `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if ctx.is_null() || entries.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let len = match sv.ctx.query_port(1) {
        Ok(p) => p.gid_tbl_len,
        Err(e) => return -(e.errno() as isize),
    };
    let mut n = 0usize;
    for i in 0..len {
        let Ok(g) = sv.ctx.query_gid(1, i) else { break };
        if g.is_zero() {
            continue;
        }
        if n == max_entries {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: entry n < max_entries of entry_size bytes each.
        unsafe {
            let e = (entries as *mut u8).add(n * entry_size) as *mut ibv_gid_entry;
            *e = ibv_gid_entry {
                gid: ibv_gid { raw: g.0 },
                gid_index: i,
                port_num: 1,
                gid_type: IBV_GID_TYPE_ROCE_V2,
                ndev_ifindex: 0,
            };
        }
        n += 1;
    }
    n as isize
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by perftest): every
/// GID of a soft device is a RoCE v2 GID.
///
/// # Safety
///
/// `ctx` an open context, `ty` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut c_uint,
) -> c_int {
    null_check!(-1; ctx, ty);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.query_gid(port, index) {
        Ok(_) => {
            // SAFETY: writable per the contract.
            unsafe { *ty = IBV_GID_TYPE_SYSFS_ROCE_V2 };
            0
        }
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// `ibv_query_pkey`: the P_Key in network byte order.
///
/// # Safety
///
/// `ctx` an open context, `pkey` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    null_check!(-1; ctx, pkey);
    if !(0..=0xffff).contains(&index) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.query_pkey(port, index as u16) {
        Ok(p) => {
            // SAFETY: writable per the contract.
            unsafe { *pkey = p.to_be() };
            0
        }
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order), or -1.
///
/// # Safety
///
/// `ctx` an open context.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    null_check!(-1; ctx);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let len = match sv.ctx.query_port(port) {
        Ok(p) => p.pkey_tbl_len,
        Err(e) => {
            fail(&e);
            return -1;
        }
    };
    for i in 0..len {
        if sv.ctx.query_pkey(port, i).ok().map(u16::to_be) == Some(pkey) {
            return c_int::from(i);
        }
    }
    set_errno(libc::ENOENT);
    -1
}

// ---------------------------------------------------------------- PD, MR, MW

/// `ibv_alloc_pd`.
///
/// # Safety
///
/// `ctx` NULL or an open context.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    null_check!(null_mut(); ctx);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.alloc_pd() {
        Ok(h) => {
            let p = into_raw(SvPd {
                pd: ibv_pd {
                    context: ctx,
                    handle: 0,
                },
                h,
            });
            // SAFETY: just allocated.
            unsafe { &mut (*p).pd }
        }
        Err(e) => fail_null(e.errno()),
    }
}

/// `ibv_dealloc_pd`: `EBUSY` while objects use it.
///
/// # Safety
///
/// `pd` NULL or a live PD of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    null_check!(libc::EINVAL; pd);
    // SAFETY: a live PD of this library (the first field of an SvPd).
    unsafe { destroy_then_free(pd as *mut SvPd, |p| p.h.ops().destroy()) }
}

/// Access bits `ibv_reg_mr` accepts: the defined ones; the optional
/// range (`IBV_ACCESS_OPTIONAL_RANGE`, bits 20–29) is ignored as the
/// hints it is.
const OPTIONAL_RANGE: u32 = 0x3ff0_0000;

fn mr_access(access: u32) -> Result<AccessFlags, c_int> {
    let a = access & !OPTIONAL_RANGE;
    let f = AccessFlags::from_bits(a).ok_or(libc::EINVAL)?;
    if f.intersects(AccessFlags::ON_DEMAND | AccessFlags::HUGETLB) {
        // On-demand paging is not offered (query_device reports no ODP).
        return Err(libc::EOPNOTSUPP);
    }
    Ok(f)
}

unsafe fn reg_mr_common(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: u32) -> *mut ibv_mr {
    null_check!(null_mut(); pd);
    if iova != addr as u64 {
        // The soft provider's MRs are addressed by virtual address.
        return fail_null(libc::EOPNOTSUPP);
    }
    let access = match mr_access(access) {
        Ok(a) => a,
        Err(e) => return fail_null(e),
    };
    if addr.is_null() && len != 0 {
        return fail_null(libc::EINVAL);
    }
    let p = pd as *mut SvPd;
    // SAFETY: ibv_reg_mr's contract: the range is the caller's memory and
    // stays valid until ibv_dereg_mr; the provider reads and writes it
    // only through the registration.
    let region = unsafe { RawRegion::new(addr as *mut u8, len) };
    // SAFETY: a live PD of this library.
    let h = match unsafe { &(*p).h }.reg_mr_raw(region, access) {
        Ok(h) => h,
        Err(e) => return fail_null(e.errno()),
    };
    let m = into_raw(SvMr {
        mr: ibv_mr {
            // SAFETY: a live PD.
            context: unsafe { (*pd).context },
            pd,
            addr,
            length: len,
            handle: 0,
            lkey: h.lkey(),
            rkey: h.rkey(),
        },
        h,
    });
    // SAFETY: just allocated.
    unsafe { &mut (*m).mr }
}

/// `ibv_reg_mr`.
///
/// # Safety
///
/// `pd` NULL or a live PD; `addr..addr+len` memory of the caller that
/// stays valid until `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr_common(pd, addr, len, addr as u64, access as u32) }
}

/// `ibv_reg_mr_iova`: only `iova == addr` is supported (`EOPNOTSUPP`
/// otherwise).
///
/// # Safety
///
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr_common(pd, addr, len, iova, access as u32) }
}

/// `ibv_reg_mr_iova2` (what the `ibv_reg_mr` macro of rdma-core 44 calls
/// for non-constant access flags).
///
/// # Safety
///
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr_common(pd, addr, len, iova, access) }
}

/// `ibv_reg_dmabuf_mr`: `EOPNOTSUPP` (no dma-buf import in user space).
///
/// # Safety
///
/// Any arguments.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _len: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    fail_null(libc::EOPNOTSUPP)
}

/// `ibv_dereg_mr`: `EBUSY` while memory windows are bound to it.
///
/// # Safety
///
/// `mr` NULL or a live MR of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    null_check!(libc::EINVAL; mr);
    // SAFETY: a live MR of this library.
    unsafe { destroy_then_free(mr as *mut SvMr, |m| m.h.ops().dereg()) }
}

/// `ibv_rereg_mr`: changes translation, PD and/or access. Returns 0 or
/// an `IBV_REREG_MR_ERR_*` code (with errno set).
///
/// # Safety
///
/// `mr` a live MR; with `IBV_REREG_MR_CHANGE_TRANSLATION`, `addr..+len`
/// as for `ibv_reg_mr`; with `CHANGE_PD`, `pd` a live PD.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    // enum ibv_rereg_mr_err_code
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    if mr.is_null() || flags <= 0 {
        set_errno(libc::EINVAL);
        return ERR_INPUT;
    }
    let Some(fl) = ReregFlags::from_bits(flags as u32) else {
        set_errno(libc::EINVAL);
        return ERR_INPUT;
    };
    let acc = if fl.contains(ReregFlags::CHANGE_ACCESS) {
        match mr_access(access as u32) {
            Ok(a) => a,
            Err(e) => {
                set_errno(e);
                return ERR_INPUT;
            }
        }
    } else {
        // SAFETY: a live MR of this library.
        unsafe { (*(mr as *mut SvMr)).h.access() }
    };
    if fl.contains(ReregFlags::CHANGE_PD) && pd.is_null() {
        set_errno(libc::EINVAL);
        return ERR_INPUT;
    }
    let m = mr as *mut SvMr;
    let memory = if fl.contains(ReregFlags::CHANGE_TRANSLATION) {
        if addr.is_null() && len != 0 {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        }
        // SAFETY: the caller's promise, as for ibv_reg_mr.
        Some(MemorySource::Raw(unsafe { RawRegion::new(addr as *mut u8, len) }))
    } else {
        None
    };
    let new_pd = if fl.contains(ReregFlags::CHANGE_PD) {
        // SAFETY: a live PD of this library.
        Some(unsafe { &(*(pd as *mut SvPd)).h })
    } else {
        None
    };
    // SAFETY: a live MR of this library; the C fields are updated by this
    // call only (the application must not use the MR concurrently).
    unsafe {
        match (*m).h.rereg(fl, new_pd, memory, acc) {
            Ok(()) => {
                let mm = &mut (*m).mr;
                mm.lkey = (*m).h.lkey();
                mm.rkey = (*m).h.rkey();
                if fl.contains(ReregFlags::CHANGE_TRANSLATION) {
                    mm.addr = addr;
                    mm.length = len;
                }
                if fl.contains(ReregFlags::CHANGE_PD) {
                    mm.pd = pd;
                }
                0
            }
            Err(e) => {
                fail(&e);
                ERR_CMD
            }
        }
    }
}

/// `ibv_context_ops::alloc_mw`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: c_uint) -> *mut ibv_mw {
    null_check!(null_mut(); pd);
    let Some(t) = MwType::from_raw(ty) else {
        return fail_null(libc::EINVAL);
    };
    // SAFETY: a live PD of this library.
    match unsafe { &(*(pd as *mut SvPd)).h }.alloc_mw(t) {
        Ok(h) => {
            let w = into_raw(SvMw {
                mw: ibv_mw {
                    // SAFETY: a live PD.
                    context: unsafe { (*pd).context },
                    pd,
                    rkey: h.rkey(),
                    handle: 0,
                    type_: ty,
                },
                h,
            });
            // SAFETY: just allocated.
            unsafe { &mut (*w).mw }
        }
        Err(e) => fail_null(e.errno()),
    }
}

/// `ibv_context_ops::dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    null_check!(libc::EINVAL; mw);
    // SAFETY: a live MW of this library.
    unsafe { destroy_then_free(mw as *mut SvMw, |w| w.h.ops().dealloc()) }
}

// ---------------------------------------------------------------- channels and CQs

/// `ibv_create_comp_channel`: its `fd` is readable while a CQ event is
/// pending (poll/epoll work on it).
///
/// # Safety
///
/// `ctx` NULL or an open context.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    null_check!(null_mut(); ctx);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    match sv.ctx.create_comp_channel() {
        Ok(h) => {
            let fd = match app_fd(std::os::fd::AsRawFd::as_raw_fd(&h)) {
                Ok(fd) => fd,
                Err(e) => return fail_null(e),
            };
            let c = into_raw(SvChannel {
                ch: ibv_comp_channel {
                    context: ctx,
                    fd,
                    refcnt: 0,
                },
                h,
                users: Default::default(),
            });
            // SAFETY: just allocated.
            unsafe { &mut (*c).ch }
        }
        Err(e) => fail_null(e.errno()),
    }
}

/// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
///
/// # Safety
///
/// `ch` NULL or a live channel of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    null_check!(libc::EINVAL; ch);
    let c = ch as *mut SvChannel;
    // SAFETY: a live channel of this library.
    if unsafe { (*c).users.load(Ordering::Acquire) } != 0 {
        set_errno(libc::EBUSY);
        return libc::EBUSY;
    }
    // SAFETY: as above.
    match unsafe { (*c).h.ops().destroy() } {
        Ok(()) => {
            // SAFETY: as above.
            let fd = unsafe { (*ch).fd };
            // SAFETY: made by into_raw.
            unsafe { free_raw(c) };
            close_app_fd(fd);
            0
        }
        Err(e) => fail(&e),
    }
}

/// Creates a CQ (the legacy and the extended verb).
pub(crate) unsafe fn create_cq_common(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut SvCq {
    null_check!(null_mut(); ctx);
    if cqe <= 0 || comp_vector < 0 {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let ch = channel as *mut SvChannel;
    // The CQ object's own address is the provider-side context, so that
    // channel and async events lead back to it; allocate first.
    // SAFETY: ibv_cq_ex is plain data (the mutex and cond are set below).
    let mut c: ibv_cq_ex = unsafe { std::mem::zeroed() };
    c.context = ctx;
    c.channel = channel;
    c.cq_context = cq_context;
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.cond = libc::PTHREAD_COND_INITIALIZER;
    crate::ex::install_cq_ex_ops(&mut c);
    let slot: Box<std::mem::MaybeUninit<SvCq>> = Box::new(std::mem::MaybeUninit::uninit());
    let raw = Box::into_raw(slot) as *mut SvCq;
    let chan = if ch.is_null() {
        None
    } else {
        // SAFETY: a live channel of this library.
        Some(unsafe { &(*ch).h })
    };
    match sv.ctx.create_cq(cqe as u32, raw as u64, chan, comp_vector as u32) {
        Ok(h) => {
            c.cqe = h.capacity().min(i32::MAX as u32) as c_int;
            if !ch.is_null() {
                // SAFETY: as above.
                unsafe { (*ch).users.fetch_add(1, Ordering::AcqRel) };
            }
            // SAFETY: `raw` is an uninitialised, owned allocation of the
            // right layout.
            unsafe {
                raw.write(SvCq {
                    cq: c,
                    h,
                    channel: ch,
                    ex: Mutex::new(ExPoll {
                        wc: [Default::default(); EX_BATCH],
                        n: 0,
                        i: 0,
                    }),
                })
            };
            raw
        }
        Err(e) => {
            // SAFETY: nothing was written into it.
            drop(unsafe { Box::from_raw(raw as *mut std::mem::MaybeUninit<SvCq>) });
            fail_null(e.errno())
        }
    }
}

/// `ibv_create_cq`.
///
/// # Safety
///
/// `ctx` NULL or an open context; `channel` NULL or a live channel of it.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded contract.
    unsafe { create_cq_common(ctx, cqe, cq_context, channel, comp_vector) as *mut ibv_cq }
}

/// `ibv_destroy_cq`: `EBUSY` while QPs use it.
///
/// # Safety
///
/// `cq` NULL or a live CQ of this library.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    null_check!(libc::EINVAL; cq);
    // SAFETY: a live CQ of this library (made in create_cq_common).
    unsafe {
        destroy_then_free(cq as *mut SvCq, |c| {
            c.h.ops().destroy()?;
            if !c.channel.is_null() {
                // SAFETY: a channel outlives its CQs (destroy_comp_channel
                // refuses while they exist).
                (*c.channel).users.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(())
        })
    }
}

/// `ibv_resize_cq`.
///
/// # Safety
///
/// `cq` NULL or a live CQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    null_check!(libc::EINVAL; cq);
    if cqe <= 0 {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    let c = cq as *mut SvCq;
    // SAFETY: a live CQ of this library.
    match unsafe { (*c).h.resize(cqe as u32) } {
        Ok(n) => {
            // SAFETY: as above; `cqe` is the application-visible capacity.
            unsafe { (*c).cq.cqe = n.min(i32::MAX as u32) as c_int };
            0
        }
        Err(e) => fail(&e),
    }
}

/// Whether the application set `O_NONBLOCK` on `fd` (read on every call:
/// it may change it with `fcntl` at any time).
fn fd_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags; a bad descriptor
    // gives -1, taken as blocking.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl != -1 && fl & libc::O_NONBLOCK != 0
}

/// `ibv_get_cq_event`: blocks until a CQ of the channel fires; with
/// `O_NONBLOCK` set on the channel's `fd`, returns -1 with `EAGAIN` at
/// once when no event is pending.
///
/// # Safety
///
/// `ch` a live channel; `cq`, `cq_context` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    null_check!(-1; ch, cq, cq_context);
    let c = ch as *mut SvChannel;
    // SAFETY: a live channel of this library.
    let fd = unsafe { (*ch).fd };
    let wait = if fd_nonblocking(fd) { Some(Duration::ZERO) } else { None };
    // SAFETY: as above.
    match unsafe { (*c).h.get_cq_event(wait) } {
        Ok(Some(ptr)) => {
            let svcq = ptr as *mut SvCq;
            // SAFETY: the provider context of every CQ is its SvCq, alive
            // until destroyed (which the application does only after
            // acknowledging its events).
            unsafe {
                *cq = svcq as *mut ibv_cq;
                *cq_context = (*svcq).cq.cq_context;
            }
            0
        }
        Ok(None) => {
            set_errno(libc::EAGAIN);
            -1
        }
        Err(e) => {
            fail(&e);
            -1
        }
    }
}

/// `ibv_ack_cq_events`.
///
/// # Safety
///
/// `cq` a live CQ.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
    if cq.is_null() {
        return;
    }
    let c = cq as *mut SvCq;
    // SAFETY: a live CQ of this library; the counter is only informative.
    unsafe {
        (*c).h.ack_events(n);
        (*c).cq.comp_events_completed = (*c).cq.comp_events_completed.wrapping_add(n);
    }
}

// ---------------------------------------------------------------- SRQ

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

fn cap_from(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_to(c: &QpCap) -> ibv_qp_cap {
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

fn ah_from(a: &ibv_ah_attr) -> AhAttr {
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

fn ah_to(a: &AhAttr) -> ibv_ah_attr {
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
fn qp_attr_from(a: &ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr, c_int> {
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
    let c = ibv_qp_attr {
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
    };
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

// ---------------------------------------------------------------- AH

/// `ibv_create_ah`.
///
/// # Safety
///
/// `pd` a live PD; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    null_check!(null_mut(); pd, attr);
    // SAFETY: readable per the contract.
    let a = ah_from(unsafe { &*attr });
    // SAFETY: a live PD.
    match unsafe { &(*(pd as *mut SvPd)).h }.create_ah(&a) {
        Ok(h) => {
            let p = into_raw(SvAh {
                ah: ibv_ah {
                    // SAFETY: a live PD.
                    context: unsafe { (*pd).context },
                    pd,
                    handle: 0,
                },
                h,
            });
            // SAFETY: just allocated.
            unsafe { &mut (*p).ah }
        }
        Err(e) => fail_null(e.errno()),
    }
}

/// `ibv_destroy_ah`.
///
/// # Safety
///
/// `ah` NULL or a live AH.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    null_check!(libc::EINVAL; ah);
    // SAFETY: a live AH of this library.
    unsafe { destroy_then_free(ah as *mut SvAh, |a| a.h.ops().destroy()) }
}

/// `struct ibv_grh` (40 bytes in front of a UD receive).
#[repr(C)]
struct IbvGrh {
    version_tclass_flow: u32,
    paylen: u16,
    next_hdr: u8,
    hop_limit: u8,
    sgid: [u8; 16],
    dgid: [u8; 16],
}

/// `ibv_init_ah_from_wc`: the address vector that answers a UD receive
/// (its GRH gives the peer's GID on RoCE).
///
/// # Safety
///
/// `ctx` an open context; `wc` readable; `grh` readable for 40 bytes when
/// the completion has `IBV_WC_GRH`; `ah_attr` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    null_check!(-1; ctx, wc, ah_attr);
    // SAFETY: per the contract.
    let (w, out) = unsafe { (&*wc, &mut *ah_attr) };
    *out = ibv_ah_attr::default();
    out.dlid = w.slid;
    out.sl = w.sl;
    out.src_path_bits = w.dlid_path_bits;
    out.port_num = port;
    if w.wc_flags & 1 == 0 || grh.is_null() {
        // RoCE needs the GRH to answer.
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: 40 readable bytes per the contract (read unaligned).
    let g: IbvGrh = unsafe { std::ptr::read_unaligned(grh as *const IbvGrh) };
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    let len = sv.ctx.query_port(port).map(|p| p.gid_tbl_len).unwrap_or(0);
    let Some(idx) = (0..len).find(|&i| sv.ctx.query_gid(port, i).ok() == Some(Gid(g.dgid))) else {
        set_errno(libc::ENOENT);
        return -1;
    };
    let flow = u32::from_be(g.version_tclass_flow);
    out.is_global = 1;
    out.grh.dgid = ibv_gid { raw: g.sgid };
    out.grh.sgid_index = idx as u8;
    out.grh.flow_label = flow & 0xfffff;
    out.grh.hop_limit = 0xff;
    out.grh.traffic_class = ((flow >> 20) & 0xff) as u8;
    0
}

/// `ibv_create_ah_from_wc`.
///
/// # Safety
///
/// As `ibv_init_ah_from_wc`, and `pd` a live PD.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port: u8,
) -> *mut ibv_ah {
    null_check!(null_mut(); pd);
    let mut a = ibv_ah_attr::default();
    // SAFETY: forwarded contract.
    if unsafe { __softverbs_ibv_init_ah_from_wc((*pd).context, port, wc, grh, &mut a) } != 0 {
        return null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { __softverbs_ibv_create_ah(pd, &mut a) }
}

// ---------------------------------------------------------------- async events

/// `ibv_get_async_event`: blocks until the device reports an event; on a
/// removed device whose events were all read, -1 with `EIO`. With
/// `O_NONBLOCK` set on the context's `async_fd`, returns -1 with `EAGAIN`
/// at once when no event is pending.
///
/// # Safety
///
/// `ctx` an open context; `event` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    null_check!(-1; ctx, event);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    // SAFETY: as above.
    let async_fd = unsafe { (*ctx).async_fd };
    loop {
        // After a removal, once its events are consumed, the event file
        // reports EIO, as the kernel's does for a disassociated device;
        // until then wait in slices to notice a removal.
        let removed = sv.dev.removed();
        let nonblocking = fd_nonblocking(async_fd);
        let wait = if removed || nonblocking {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        let ev = match sv.ctx.get_async_event(Some(wait)) {
            Ok(Some(ev)) => ev,
            Ok(None) if removed => {
                set_errno(libc::EIO);
                return -1;
            }
            Ok(None) if nonblocking => {
                set_errno(libc::EAGAIN);
                return -1;
            }
            Ok(None) => continue,
            Err(e) => {
                fail(&e);
                return -1;
            }
        };
        let element = match ev.element {
            AsyncElement::Device => async_element { port_num: 0 },
            AsyncElement::Port(p) => async_element {
                port_num: c_int::from(p),
            },
            AsyncElement::Cq(c) => async_element { cq: c as *mut ibv_cq },
            AsyncElement::Srq(s) => async_element { srq: s as *mut ibv_srq },
            AsyncElement::Qp(n) => {
                let found = sv.qps.lock().unwrap_or_else(|e| e.into_inner()).get(&n).copied();
                match found {
                    Some(p) => async_element { qp: p as *mut ibv_qp },
                    // The QP was destroyed while its event was queued.
                    None => continue,
                }
            }
        };
        // SAFETY: writable per the contract.
        unsafe {
            *event = ibv_async_event {
                element,
                event_type: ev.event_type.as_raw(),
            }
        };
        return 0;
    }
}

/// `ibv_ack_async_event`: counts the event on its object (destroys do not
/// wait for acknowledgements here).
///
/// # Safety
///
/// `event` NULL or filled by `ibv_get_async_event`, its object alive.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: an event this library filled in; its object is alive.
    unsafe {
        let e = &*event;
        match e.event_type {
            0 => {
                let cq = e.element.cq;
                (*cq).async_events_completed = (*cq).async_events_completed.wrapping_add(1);
            }
            1..=7 | 16 => {
                let qp = e.element.qp;
                (*qp).events_completed = (*qp).events_completed.wrapping_add(1);
            }
            14 | 15 => {
                let srq = e.element.srq;
                (*srq).events_completed = (*srq).events_completed.wrapping_add(1);
            }
            _ => {}
        }
    }
}
