//! The parts of `verbs.h` that need care from Rust.
//!
//! Several verbs are `static inline` in `verbs.h` and dispatch through the
//! context's ops table (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_alloc_mw`,
//! `ibv_dealloc_mw`, `ibv_bind_mw`). `rdma-sys` 0.3 re-implements them as
//! Rust functions that `unwrap()` the table entry (a panic where C would
//! crash) and whose `ibv_bind_mw` lacks the MR/PD checks of rdma-core's.
//! This backend instead reads each entry once, when the object is created,
//! keeps the function pointer, and returns `EOPNOTSUPP` if the provider
//! left it empty.
//!
//! Two other `rdma-sys` choices are avoided here:
//! - its `verbs_get_ctx` compares `abi_compat` with `u32::MAX` where
//!   rdma-core uses `UINTPTR_MAX`, so on 64-bit hosts the extended ops are
//!   never found; `query_port` therefore calls the exported compat
//!   `ibv_query_port` exactly as `verbs.h` does when there is no extended
//!   op (zeroed attributes, all fields but `port_cap_flags2` filled);
//! - its `ibv_async_event` declares `event_type` as a Rust enum, so an event
//!   number newer than the bindings would be undefined behaviour; events
//!   are read into [`RawAsyncEvent`], which has the same layout with a
//!   plain `u32`.

use std::os::fd::RawFd;
use std::ptr::NonNull;
#[cfg(test)]
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_ah_attr, ibv_context, ibv_cq, ibv_device_attr, ibv_mw, ibv_mw_bind, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr,
    ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_attr, ibv_srq_init_attr, ibv_wc,
};

/// `IBV_LINK_LAYER_UNSPECIFIED` (an anonymous enum in `verbs.h`, not bound).
pub(crate) const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// A pointer to an ibverbs object that may cross threads.
pub(crate) struct SendPtr<T>(NonNull<T>);

// SAFETY: libibverbs is thread safe ("all verbs are thread safe", ibv_*
// man pages): its objects may be used from any thread. What a SendPtr points
// to is only dereferenced under the rules of its owner (see ibv_object.rs).
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as for Send; the pointer itself is immutable.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// Wraps a non-null pointer; `None` for null.
    pub(crate) fn new(ptr: *mut T) -> Option<Self> {
        NonNull::new(ptr).map(SendPtr)
    }

    /// The raw pointer.
    pub(crate) fn get(&self) -> *mut T {
        self.0.as_ptr()
    }
}

/// Plain C structs of `verbs.h` for which all-zero bytes is a valid value
/// (integers, raw pointers, `Option` of function pointers, unions of those).
///
/// # Safety
///
/// Implement only for `repr(C)` types every field of which is valid when
/// zeroed.
pub(crate) unsafe trait PodZero: Sized {}

macro_rules! pod_zero {
    ($($t:ty),+ $(,)?) => {
        $(
            // SAFETY: a repr(C) verbs.h struct of integers, raw pointers and
            // unions of those; zero is valid for each field.
            unsafe impl PodZero for $t {}
        )+
    };
}

pod_zero!(
    ibv_device_attr,
    ibv_port_attr,
    ibv_qp_attr,
    ibv_qp_init_attr,
    ibv_srq_attr,
    ibv_srq_init_attr,
    ibv_ah_attr,
    ibv_send_wr,
    ibv_recv_wr,
    ibv_sge,
    ibv_wc,
    ibv_mw_bind,
    RawAsyncEvent,
    rdma_sys::ibv_gid,
);

/// An all-zero value of a plain `verbs.h` struct (C's `= {}`).
pub(crate) fn zeroed<T: PodZero>() -> T {
    // SAFETY: PodZero guarantees that all-zero bytes are a valid T.
    unsafe { std::mem::zeroed() }
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Clears `errno`, so that a provider returning NULL without setting it is
/// told apart from one that did.
pub(crate) fn clear_errno() {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // which is always valid to write.
    unsafe { *libc::__errno_location() = 0 };
}

/// `errno`, or `default` if the failed call left it at 0.
pub(crate) fn errno_or(default: i32) -> i32 {
    match errno() {
        0 => default,
        e => e,
    }
}

/// `struct ibv_async_event` with the event type as a plain number.
#[repr(C)]
pub(crate) struct RawAsyncEvent {
    /// What the event concerns (`union { cq, qp, srq, wq, port_num }`).
    pub(crate) element: rdma_sys::ibv_async_event_element_t,
    /// `enum ibv_event_type`, unchecked.
    pub(crate) event_type: u32,
}

/// `ibv_post_send` as found in the ops table.
pub(crate) type PostSendFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32;
/// `ibv_post_recv` as found in the ops table.
pub(crate) type PostRecvFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;
/// `ibv_post_srq_recv` as found in the ops table.
pub(crate) type PostSrqRecvFn = unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;
/// `ibv_poll_cq` as found in the ops table.
pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, i32, *mut ibv_wc) -> i32;
/// `ibv_req_notify_cq` as found in the ops table.
pub(crate) type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, i32) -> i32;
/// `ibv_dealloc_mw` as found in the ops table.
pub(crate) type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> i32;

/// The legacy ops table of a context, where `verbs.h` finds the inline
/// verbs.
///
/// # Safety
///
/// `ctx` must be an open context; the table lives as long as it.
pub(crate) unsafe fn ops<'a>(ctx: *mut ibv_context) -> &'a rdma_sys::ibv_context_ops {
    // SAFETY: the caller guarantees ctx is an open context; `ops` is an
    // inline member written once by ibv_open_device.
    unsafe { &(*ctx).ops }
}

/// `ibv_query_port` as `verbs.h` performs it for a context without the
/// extended op: zeroed attributes, then the exported compat entry point,
/// which fills every field of the compat layout (all but
/// `port_cap_flags2`). Returns 0 or an errno.
///
/// # Safety
///
/// `ctx` must be an open context.
pub(crate) unsafe fn query_port(ctx: *mut ibv_context, port: u8, attr: &mut ibv_port_attr) -> i32 {
    *attr = zeroed();
    let compat = (attr as *mut ibv_port_attr).cast::<rdma_sys::_compat_ibv_port_attr>();
    // SAFETY: ctx is open (caller); the compat layout is a prefix of
    // ibv_port_attr, which is what verbs.h passes too.
    unsafe { rdma_sys::ibv_query_port(ctx, port, compat) }
}

/// `ibv_alloc_mw` (inline in `verbs.h`): NULL with `errno` set on failure.
///
/// # Safety
///
/// `pd` must be a live PD.
pub(crate) unsafe fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    // SAFETY: pd is live (caller), so pd->context is an open context.
    let ops = unsafe { ops((*pd).context) };
    match ops.alloc_mw {
        // SAFETY: the provider's own entry point, called as verbs.h does.
        Some(f) => unsafe { f(pd, mw_type) },
        None => {
            // SAFETY: writing the calling thread's errno slot.
            unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
            std::ptr::null_mut()
        }
    }
}

/// `ibv_bind_mw` (inline in `verbs.h`, rdma-core 44), including its checks:
/// type 1 only (`EINVAL`), no range without an MR (`EINVAL`), the MR in the
/// window's PD (`EPERM`). Returns 0 or an errno.
///
/// # Safety
///
/// `qp`, `mw` and, if non-null, `bind.bind_info.mr` must be live.
pub(crate) unsafe fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: &mut ibv_mw_bind) -> i32 {
    let info = bind.bind_info;
    // SAFETY: mw is live (caller).
    let (mw_type, mw_pd, ctx) = unsafe { ((*mw).type_, (*mw).pd, (*mw).context) };
    if mw_type != rdma_sys::ibv_mw_type::IBV_MW_TYPE_1 {
        return libc::EINVAL;
    }
    if info.mr.is_null() && (info.addr != 0 || info.length != 0) {
        return libc::EINVAL;
    }
    // SAFETY: a non-null MR is live (caller).
    if !info.mr.is_null() && unsafe { (*info.mr).pd } != mw_pd {
        return libc::EPERM;
    }
    // SAFETY: ctx is the window's open context.
    match unsafe { ops(ctx) }.bind_mw {
        // SAFETY: the provider's entry point with live arguments.
        Some(f) => unsafe { f(qp, mw, bind) },
        None => libc::EOPNOTSUPP,
    }
}

/// Makes `fd` non-blocking (as the `ibv_get_async_event(3)` man page
/// suggests for polling). Returns 0 or an errno.
pub(crate) fn set_nonblocking(fd: RawFd) -> i32 {
    // SAFETY: fcntl on a descriptor we were given; F_GETFL/F_SETFL do not
    // touch memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return errno();
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return errno();
    }
    0
}

/// Waits with poll(2) until `fd` is readable or `timeout` passes (`None`:
/// forever). `Ok(true)` when readable, `Ok(false)` on timeout, `Err(errno)`
/// on failure. Restarts after signals with the time that remains.
#[cfg(test)]
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> Result<bool, i32> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms: libc::c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a short wait does not become a busy poll.
                let ms = left.as_nanos().div_ceil(1_000_000);
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            }
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack, count 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        match n {
            n if n > 0 => return Ok(true),
            0 => return Ok(false),
            _ => match errno() {
                libc::EINTR => continue,
                e => return Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The manually declared structs of rdma-sys must match rdma-core's
    /// x86-64/aarch64 layout, or posting would hand the provider garbage.
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
        assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
        assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
        assert_eq!(offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union), 36);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(offset_of!(ibv_send_wr, bind_mw_tso_union), 80);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, imm_data_invalidated_rkey_union), 24);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(offset_of!(ibv_wc, dlid_path_bits), 45);
        assert_eq!(size_of::<rdma_sys::ibv_global_route>(), 24);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(size_of::<ibv_mw_bind>(), 48);
        assert_eq!(size_of::<RawAsyncEvent>(), size_of::<rdma_sys::ibv_async_event>());
        assert_eq!(
            offset_of!(RawAsyncEvent, event_type),
            offset_of!(rdma_sys::ibv_async_event, event_type)
        );
    }

    #[test]
    fn poll_on_a_pipe() {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        assert_eq!(set_nonblocking(fds[0]), 0);
        assert_eq!(wait_readable(fds[0], Some(Duration::ZERO)), Ok(false));
        assert_eq!(wait_readable(fds[0], Some(Duration::from_millis(5))), Ok(false));
        // SAFETY: writing one byte from a valid buffer to our pipe.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        assert_eq!(wait_readable(fds[0], None), Ok(true));
        let mut b = [0u8; 2];
        // SAFETY: reading into a valid buffer from our pipe.
        assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 2) }, 1);
        // Non-blocking: an empty pipe reads EAGAIN instead of hanging.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 2) }, -1);
        assert_eq!(errno(), libc::EAGAIN);
        clear_errno();
        assert_eq!(errno_or(libc::ENOMEM), libc::ENOMEM);
        // SAFETY: closing the descriptors we opened.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(wait_readable(-1, Some(Duration::ZERO)), Ok(false));
    }
}
