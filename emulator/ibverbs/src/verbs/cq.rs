//! Completion channels and completion queues, and CQ events.

use super::*;

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
pub(super) fn fd_nonblocking(fd: c_int) -> bool {
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
