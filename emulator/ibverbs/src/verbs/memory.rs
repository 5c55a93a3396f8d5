//! Protection domains, memory regions and memory windows.

use super::*;

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

pub(super) fn mr_access(access: u32) -> Result<AccessFlags, c_int> {
    let a = access & !OPTIONAL_RANGE;
    let f = AccessFlags::from_bits(a).ok_or(libc::EINVAL)?;
    if f.intersects(AccessFlags::ON_DEMAND | AccessFlags::HUGETLB) {
        // On-demand paging is not offered (query_device reports no ODP).
        return Err(libc::EOPNOTSUPP);
    }
    Ok(f)
}

pub(super) unsafe fn reg_mr_common(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
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
