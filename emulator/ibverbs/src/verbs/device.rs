//! Devices, contexts and their queries: the device list, open and close, query_device/port/gid/pkey.

use super::*;

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
pub(super) fn app_fd(fd: c_int) -> Result<c_int, c_int> {
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
pub(super) fn close_app_fd(fd: c_int) {
    // SAFETY: the library's own descriptor, closed once, by its owner.
    unsafe { libc::close(fd) };
}

pub(super) fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

pub(super) fn fill_device_attr(a: &softverbs::verbs::DeviceAttr, out: &mut ibv_device_attr) {
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

pub(super) fn fill_port_attr(p: &softverbs::verbs::PortAttr) -> ibv_port_attr {
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
