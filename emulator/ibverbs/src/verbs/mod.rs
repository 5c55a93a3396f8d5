//! The control verbs: devices, contexts, PDs, MRs, MWs, channels, CQs,
//! QPs, SRQs, AHs and async events, one file per family of objects.
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

mod ah;
mod cq;
mod device;
mod events;
mod memory;
mod qp;

pub(crate) use qp::qp_attr_to_c;

pub(crate) use cq::*;
pub(crate) use device::*;
pub(crate) use memory::*;
pub(crate) use qp::*;
