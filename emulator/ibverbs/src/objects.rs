//! The objects handed to C: each is a Rust struct whose first field is the
//! C struct the application sees (so a pointer to one is a pointer to the
//! other), followed by the softverbs handle that implements it.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use softverbs::verbs::{Ah, CompChannel, Context, Cq, Mr, Mw, Pd, Qp, Srq, WorkCompletion};

use crate::ffi::*;
use crate::state::SvDevice;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// An open device: `verbs_context` (which ends with the application's
/// `ibv_context`) first.
#[repr(C)]
pub(crate) struct SvContext {
    pub(crate) vctx: verbs_context,
    pub(crate) ctx: Context,
    pub(crate) dev: &'static SvDevice,
    /// QP number → the QP's C object, for QP async events.
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
}

impl SvContext {
    /// The context of an application's `ibv_context` pointer.
    ///
    /// # Safety
    ///
    /// `ctx` must be non-null and come from `ibv_open_device` of this
    /// library, not yet closed.
    pub(crate) unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> &'a SvContext {
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: every ibv_context this library hands out is the
        // `context` field of the `verbs_context` at the start of an
        // SvContext (repr(C)), so stepping back by the field offset gives
        // the SvContext, alive while the context is open.
        unsafe { &*((ctx as *mut u8).sub(off) as *const SvContext) }
    }
}

/// A protection domain.
#[repr(C)]
pub(crate) struct SvPd {
    pub(crate) pd: ibv_pd,
    pub(crate) h: Pd,
}

/// A memory region.
#[repr(C)]
pub(crate) struct SvMr {
    pub(crate) mr: ibv_mr,
    pub(crate) h: Mr,
}

/// A memory window.
#[repr(C)]
pub(crate) struct SvMw {
    pub(crate) mw: ibv_mw,
    pub(crate) h: Mw,
}

/// A completion channel.
#[repr(C)]
pub(crate) struct SvChannel {
    pub(crate) ch: ibv_comp_channel,
    pub(crate) h: CompChannel,
    /// CQs using it.
    pub(crate) users: AtomicUsize,
}

/// How many completions `ibv_start_poll` fetches at once.
pub(crate) const EX_BATCH: usize = 16;

/// The state of an `ibv_start_poll` … `ibv_end_poll` sequence (only one
/// thread polls an extended CQ at a time, as with rdma-core).
pub(crate) struct ExPoll {
    pub(crate) wc: [WorkCompletion; EX_BATCH],
    pub(crate) n: usize,
    pub(crate) i: usize,
}

/// A completion queue (always allocated with the extended layout).
#[repr(C)]
pub(crate) struct SvCq {
    pub(crate) cq: ibv_cq_ex,
    pub(crate) h: Cq,
    pub(crate) channel: *mut SvChannel,
    pub(crate) ex: Mutex<ExPoll>,
}

impl SvCq {
    /// # Safety
    ///
    /// `cq` must be a live CQ of this library.
    pub(crate) unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> &'a SvCq {
        // SAFETY: every ibv_cq (and ibv_cq_ex) this library hands out is
        // the first field of an SvCq.
        unsafe { &*(cq as *const SvCq) }
    }
}

/// A shared receive queue.
#[repr(C)]
pub(crate) struct SvSrq {
    pub(crate) srq: ibv_srq,
    pub(crate) h: Srq,
}

/// An address handle.
#[repr(C)]
pub(crate) struct SvAh {
    pub(crate) ah: ibv_ah,
    pub(crate) h: Ah,
}

/// One work request under construction with the `ibv_wr_*` API.
#[derive(Clone, Copy)]
pub(crate) struct ExWr {
    pub(crate) wr_id: u64,
    pub(crate) flags: u32,
    pub(crate) opcode: u32,
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) ah: *mut ibv_ah,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_qkey: u32,
    pub(crate) mw: *mut ibv_mw,
    pub(crate) bind: Option<ibv_mw_bind_info>,
    /// Index of its first scatter/gather entry in `ExBatch::sges`.
    pub(crate) sge_start: usize,
    pub(crate) sge_len: usize,
    /// Whether its data is inline (copied into `ExBatch::inline`).
    pub(crate) inline: bool,
}

/// The work requests between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Default)]
pub(crate) struct ExBatch {
    pub(crate) wrs: Vec<ExWr>,
    pub(crate) sges: Vec<ibv_sge>,
    /// Inline data, copied at `wr_set_inline_data*` time as the API
    /// requires (the buffer may be reused before `wr_complete`).
    pub(crate) inline: Vec<Vec<u8>>,
    /// Set by a builder call that could not be honoured (unsupported
    /// opcode, missing WR): `wr_complete` fails with it.
    pub(crate) error: i32,
}

/// A queue pair (always allocated with the extended layout).
#[repr(C)]
pub(crate) struct SvQp {
    pub(crate) qp: ibv_qp_ex,
    pub(crate) h: Qp,
    pub(crate) ctx: *const SvContext,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) batch: Mutex<ExBatch>,
}

impl SvQp {
    /// # Safety
    ///
    /// `qp` must be a live QP of this library.
    pub(crate) unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> &'a SvQp {
        // SAFETY: every ibv_qp (and ibv_qp_ex) this library hands out is
        // the first field of an SvQp.
        unsafe { &*(qp as *const SvQp) }
    }
}

/// Boxes `v` and returns the raw pointer handed to C.
pub(crate) fn into_raw<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees what [`into_raw`] made.
///
/// # Safety
///
/// `p` must come from [`into_raw`] with the same `T`, not freed yet, and
/// no longer used by anyone.
pub(crate) unsafe fn free_raw<T>(p: *mut T) {
    // SAFETY: the caller's promise.
    drop(unsafe { Box::from_raw(p) });
}
