//! Completion channels, completion queues and shared receive queues.

use crate::sys::lock;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use super::convert;
use super::device::HwContext;
use super::device_life::{HwDeviceLife, Member, MemberKind};
use super::ffi::{self, zeroed, PollCqFn, PostSrqRecvFn, ReqNotifyCqFn, SendPtr};
use super::ibv_object::IbvObject;
use super::objects::HwPd;
use super::post;
use super::shadow::CqShadow;
use super::wake::WakeFd;
use super::{check, ibv_error};
use crate::verbs::backend::*;
use crate::verbs::{verr, PostError, RecvWr, Result, SrqAttr, SrqAttrMask, Verb, WorkCompletion};

/// Longest a waiter stays inside a channel at once, so that a concurrent
/// destroy is never held up for longer.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// A completion event channel (`struct ibv_comp_channel`).
///
/// Besides the kernel's notifications it delivers those a removal raises
/// for armed CQs (see `device_life.rs`); [`CompChannelOps::fd`] is readable for
/// both (see `wake.rs`).
pub struct HwCompChannel {
    ch: IbvObject<ibv_comp_channel>,
    wake: WakeFd,
    /// Notifications raised by the backend: CQ user contexts.
    raised: Mutex<VecDeque<u64>>,
    ctx: Arc<HwContext>,
}

impl HwCompChannel {
    /// Wraps a fresh channel and makes its descriptor non-blocking.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live channel of `ctx` that nothing else frees.
    pub(crate) unsafe fn new(ctx: Arc<HwContext>, ptr: SendPtr<ibv_comp_channel>) -> Result<Arc<HwCompChannel>> {
        // SAFETY: a live channel; fd is set once at creation.
        let fd = unsafe { (*ptr.get()).fd };
        let wake = match ffi::set_nonblocking(fd) {
            0 => WakeFd::new(fd),
            e => Err(e),
        };
        let wake = match wake {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the caller's fresh channel, freed once, here.
                unsafe { rdma_sys::ibv_destroy_comp_channel(ptr.get()) };
                return Err(ibv_error(Verb::CreateCompChannel, "channel descriptor setup", e));
            }
        };
        Ok(Arc::new(HwCompChannel {
            // SAFETY: forwarded from the caller.
            ch: unsafe { IbvObject::new(ptr, "completion channel") },
            wake,
            raised: Mutex::new(VecDeque::new()),
            ctx,
        }))
    }

    /// Raises a notification for the CQ whose user context is `cq_context`.
    pub(crate) fn raise(&self, cq_context: u64) {
        lock(&self.raised).push_back(cq_context);
        self.wake.wake();
    }

    fn take_raised(&self) -> Option<u64> {
        let mut r = lock(&self.raised);
        let got = r.pop_front();
        if !r.is_empty() {
            // Keep the descriptor readable for the rest.
            self.wake.wake();
        }
        got
    }

    /// The channel's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_comp_channel> {
        &self.ch
    }

    fn free(&self) -> std::result::Result<(), i32> {
        let life = self.ctx.life();
        // SAFETY: the channel is destroyed at most once (lifecycle).
        self.ch
            .destroy(|ch| life.destroy_rc(unsafe { rdma_sys::ibv_destroy_comp_channel(ch) }))
    }
}

impl Drop for HwCompChannel {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

impl CompChannelOps for HwCompChannel {
    /// poll(2) on the channel descriptor, then `ibv_get_cq_event`; returns
    /// the CQ's user context. Each event must be acknowledged with
    /// [`CqOps::ack_events`] on that CQ. Notifications a removal raised come
    /// first; once the device is gone (`EIO`) only those remain.
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u64>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ch = self.ch.enter(Verb::GetCqEvent)?;
            // Clear our wake-up before looking, so that a later raise
            // wakes the wait below.
            self.wake.drain();
            if let Some(c) = self.take_raised() {
                return Ok(Some(c));
            }
            let slice = match deadline {
                None => WAIT_SLICE,
                Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_SLICE),
            };
            let ready = self
                .wake
                .wait(Some(slice))
                .map_err(|e| ibv_error(Verb::GetCqEvent, "poll(channel fd)", e))?;
            if ready.kernel {
                let mut cq: *mut ibv_cq = std::ptr::null_mut();
                let mut cq_context: *mut c_void = std::ptr::null_mut();
                // SAFETY: a live channel and valid out-parameters.
                let rc = unsafe { rdma_sys::ibv_get_cq_event(ch.ptr(), &mut cq, &mut cq_context) };
                if rc == 0 {
                    // SAFETY: every CQ on our channels was created by
                    // HwCq::create with cq_context pointing at its CqEvents,
                    // which lives until the CQ is destroyed, and the CQ
                    // cannot be destroyed before this event is acknowledged.
                    let events = unsafe { &*(cq_context as *const CqEvents) };
                    events.delivered.fetch_add(1, Ordering::AcqRel);
                    events.armed.store(false, Ordering::Release);
                    return Ok(Some(events.user_context));
                }
                match ffi::errno() {
                    // Another waiter took it.
                    libc::EAGAIN | libc::EINTR => {}
                    // The device is gone: only raised notifications remain.
                    libc::EIO | libc::ENODEV => {
                        self.ctx.life().mark_gone();
                        self.wake.detach_kernel();
                    }
                    e => return Err(ibv_error(Verb::GetCqEvent, "ibv_get_cq_event", e)),
                }
            }
            drop(ch);
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// An epoll descriptor readable while a notification is pending (the
    /// kernel's channel descriptor joined with the backend's own).
    fn fd(&self) -> Option<RawFd> {
        (!self.ch.is_destroyed()).then_some(self.wake.poll_fd())
    }

    /// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
    fn destroy(&self) -> Result<()> {
        self.free()
            .map_err(|e| ibv_error(Verb::DestroyCompChannel, "ibv_destroy_comp_channel", e))
    }
}

/// What `cq_context` of every CQ points to: the user's context and the
/// number of channel events delivered for the CQ.
pub(crate) struct CqEvents {
    user_context: u64,
    delivered: AtomicU64,
    /// Notification requested and not yet delivered.
    armed: AtomicBool,
}

impl CqEvents {
    /// The user context of a CQ this backend created.
    ///
    /// # Safety
    ///
    /// `cq` must be a live CQ created by [`HwCq::create`].
    pub(crate) unsafe fn user_context_of(cq: *mut ibv_cq) -> u64 {
        // SAFETY: the caller guarantees cq is ours: cq_context points to
        // its CqEvents, alive as long as the CQ.
        unsafe { (*((*cq).cq_context as *const CqEvents)).user_context }
    }
}

/// Channel events acknowledged so far, and whether the CQ is freed.
struct AckState {
    acked: u64,
    freed: bool,
}

/// A completion queue (`struct ibv_cq`).
///
/// `ibv_destroy_cq` waits until every channel event of the CQ has been
/// acknowledged; to keep that from hanging forever when an application
/// forgot, `destroy` first acknowledges the events it delivered that are
/// still unacknowledged (and later acknowledgements of those are ignored).
pub struct HwCq {
    cq: IbvObject<ibv_cq>,
    poll: Option<PollCqFn>,
    notify: Option<ReqNotifyCqFn>,
    capacity: AtomicU32,
    events: Arc<CqEvents>,
    acks: Mutex<AckState>,
    resize: Mutex<()>,
    shadow: CqShadow,
    life: Arc<HwDeviceLife>,
    channel: Option<Arc<dyn CompChannelOps>>,
    _ctx: Arc<HwContext>,
}

impl HwCq {
    /// `ibv_create_cq` on `ctx`.
    pub(crate) fn create(
        ctx: &HwContext,
        cqe: u32,
        context: u64,
        channel: Option<&Arc<dyn CompChannelOps>>,
        comp_vector: u32,
    ) -> Result<Arc<HwCq>> {
        let cqe_raw =
            i32::try_from(cqe).map_err(|_| verr!(CreateCq, InvalidArgument, "{cqe} CQ entries is too many"))?;
        let vector = i32::try_from(comp_vector)
            .map_err(|_| verr!(CreateCq, InvalidArgument, "bad completion vector {comp_vector}"))?;
        let hw_channel = channel
            .map(|c| {
                super::downcast::<HwCompChannel, _>(c).ok_or_else(|| {
                    verr!(
                        CreateCq,
                        InvalidArgument,
                        "the completion channel belongs to another backend"
                    )
                })
            })
            .transpose()?;
        let ch_guard = hw_channel.map(|c| c.obj().enter(Verb::CreateCq)).transpose()?;
        let ctx_guard = ctx.ctx_obj().enter(Verb::CreateCq)?;
        let events = Arc::new(CqEvents {
            user_context: context,
            delivered: AtomicU64::new(0),
            armed: AtomicBool::new(false),
        });
        ffi::clear_errno();
        // SAFETY: an open context, a live channel (entered) or null; the
        // cq_context points to `events`, which the CQ keeps alive.
        let raw = unsafe {
            rdma_sys::ibv_create_cq(
                ctx_guard.ptr(),
                cqe_raw,
                Arc::as_ptr(&events) as *mut c_void,
                ch_guard.as_ref().map_or(std::ptr::null_mut(), |g| g.ptr()),
                vector,
            )
        };
        let ptr =
            SendPtr::new(raw).ok_or_else(|| ibv_error(Verb::CreateCq, "ibv_create_cq", ffi::errno_or(libc::ENOMEM)))?;
        // SAFETY: a live CQ; its context's ops table lives as long.
        let (capacity, ops) = unsafe { ((*raw).cqe, ffi::ops((*raw).context)) };
        let cq = Arc::new(HwCq {
            // SAFETY: a fresh CQ only the HwCq frees.
            cq: unsafe { IbvObject::new(ptr, "completion queue") },
            poll: ops.poll_cq,
            notify: ops.req_notify_cq,
            capacity: AtomicU32::new(u32::try_from(capacity).unwrap_or(0)),
            events,
            acks: Mutex::new(AckState { acked: 0, freed: false }),
            resize: Mutex::new(()),
            shadow: CqShadow::new(),
            life: ctx.life().clone(),
            channel: channel.cloned(),
            _ctx: ctx.arc(),
        });
        let member: Weak<dyn Member> = Arc::downgrade(&cq) as Weak<HwCq>;
        cq.life.register(MemberKind::Cq, member);
        Ok(cq)
    }

    /// The CQ's side of the work request shadow.
    pub(crate) fn shadow(&self) -> &CqShadow {
        &self.shadow
    }

    /// The CQ's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_cq> {
        &self.cq
    }

    /// The `struct ibv_cq` pointer, for interoperating with C (rdma_cm).
    /// Valid until this CQ is destroyed; do not free it.
    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.raw()
    }

    fn acks(&self) -> MutexGuard<'_, AckState> {
        self.acks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn free(&self) -> std::result::Result<(), i32> {
        self.cq.destroy(|cq| {
            {
                let mut acks = self.acks();
                let delivered = self.events.delivered.load(Ordering::Acquire);
                let pending = delivered - acks.acked;
                if pending > 0 {
                    acks.acked = delivered;
                    // SAFETY: a live CQ; these events were delivered and
                    // never acknowledged.
                    unsafe { rdma_sys::ibv_ack_cq_events(cq, u32::try_from(pending).unwrap_or(u32::MAX)) };
                }
            }
            // SAFETY: the CQ is destroyed at most once (lifecycle).
            let rc = self.life.destroy_rc(unsafe { rdma_sys::ibv_destroy_cq(cq) });
            if rc == 0 {
                self.acks().freed = true;
            }
            rc
        })
    }
}

impl Drop for HwCq {
    fn drop(&mut self) {
        if self.free().is_err() {
            // The CQ lives on, its cq_context pointing at `events`.
            std::mem::forget(self.events.clone());
        }
    }
}

impl CqOps for HwCq {
    /// `ibv_poll_cq` through the provider's entry point, in batches of 16
    /// on the stack, retiring the shadowed work requests completed (see
    /// `shadow.rs`). If the CQ fails after some completions were taken,
    /// those are returned and the error comes with the next call. After a
    /// removal, the work requests the device will not complete come back
    /// as `WR_FLUSH_ERR` once the real completions are drained.
    #[inline]
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let cq = self.cq.enter(Verb::PollCq)?;
        let Some(poll) = self.poll else {
            return Err(verr!(PollCq, NotSupported, "the provider has no poll_cq"));
        };
        let ptr = cq.ptr();
        self.shadow
            .poll(wc, self.life.poll_mode(), |buf| {
                // SAFETY: a live CQ (entered above); the buffer has room for
                // buf.len() (at most 16) entries.
                unsafe { poll(ptr, buf.len() as i32, buf.as_mut_ptr().cast()) }
            })
            .map_err(|n| verr!(PollCq, Io, "ibv_poll_cq failed ({n}): CQ overrun or device error"))
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let cq = self.cq.enter(Verb::ReqNotifyCq)?;
        self.life.check(Verb::ReqNotifyCq)?;
        let Some(notify) = self.notify else {
            return Err(verr!(ReqNotifyCq, NotSupported, "the provider has no req_notify_cq"));
        };
        self.events.armed.store(true, Ordering::Release);
        // SAFETY: a live CQ, through the provider's entry point.
        let rc = unsafe { notify(cq.ptr(), i32::from(solicited_only)) };
        check(Verb::ReqNotifyCq, "ibv_req_notify_cq", rc)
    }

    fn resize(&self, cqe: u32) -> Result<u32> {
        self.life.check(Verb::ResizeCq)?;
        let cqe = i32::try_from(cqe).map_err(|_| verr!(ResizeCq, InvalidArgument, "{cqe} CQ entries is too many"))?;
        let _serial = self.resize.lock().unwrap_or_else(|e| e.into_inner());
        let cq = self.cq.enter(Verb::ResizeCq)?;
        // SAFETY: a live CQ.
        let rc = unsafe { rdma_sys::ibv_resize_cq(cq.ptr(), cqe) };
        check(Verb::ResizeCq, "ibv_resize_cq", rc)?;
        // SAFETY: a live CQ; only resize (serialised above) writes cqe.
        let granted = u32::try_from(unsafe { (*cq.ptr()).cqe }).unwrap_or(0);
        self.capacity.store(granted, Ordering::Release);
        Ok(granted)
    }

    fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Acquire)
    }

    /// `ibv_ack_cq_events`, for at most the events delivered and not yet
    /// acknowledged (more would make `ibv_destroy_cq` wait forever).
    fn ack_events(&self, n: u32) {
        let mut acks = self.acks();
        if acks.freed {
            return;
        }
        let delivered = self.events.delivered.load(Ordering::Acquire);
        let k = u64::from(n).min(delivered - acks.acked);
        if k == 0 {
            return;
        }
        acks.acked += k;
        // SAFETY: the CQ is not freed: `freed` is set (under this lock)
        // right after a successful destroy, and a destroy cannot succeed
        // while the k events counted here are unacknowledged.
        unsafe { rdma_sys::ibv_ack_cq_events(self.cq.raw(), k as u32) };
    }

    fn context(&self) -> u64 {
        self.events.user_context
    }

    /// `ibv_destroy_cq`: `EBUSY` while QPs use it.
    fn destroy(&self) -> Result<()> {
        self.free().map_err(|e| ibv_error(Verb::DestroyCq, "ibv_destroy_cq", e))
    }
}

impl Member for HwCq {
    /// An armed notification fires (the removal's step 2).
    fn revoke(&self, _life: &HwDeviceLife) {
        if self.events.armed.swap(false, Ordering::AcqRel) {
            if let Some(ch) = self.channel.as_ref().and_then(super::downcast::<HwCompChannel, _>) {
                ch.raise(self.events.user_context);
            }
        }
    }
}

/// A shared receive queue (`struct ibv_srq`).
///
/// Its receives are not shadowed: after a removal they stay in the SRQ,
/// as with the soft provider, and posting fails with `ENODEV`.
pub struct HwSrq {
    srq: IbvObject<ibv_srq>,
    post: Option<PostSrqRecvFn>,
    max_sge: u32,
    life: Arc<HwDeviceLife>,
    _pd: Arc<HwPd>,
}

impl HwSrq {
    /// `ibv_create_srq` on `pd`; `context` becomes `srq_context` and is
    /// reported with the SRQ's async events.
    pub(crate) fn create(pd: &HwPd, attr: SrqAttr, context: u64) -> Result<Arc<HwSrq>> {
        let pd_guard = pd.obj().enter(Verb::CreateSrq)?;
        let mut init: ibv_srq_init_attr = zeroed();
        init.srq_context = context as *mut c_void;
        init.attr = convert::srq_attr_to_raw(&attr);
        ffi::clear_errno();
        // SAFETY: a live PD and a valid attribute struct.
        let raw = unsafe { rdma_sys::ibv_create_srq(pd_guard.ptr(), &mut init) };
        let ptr = SendPtr::new(raw)
            .ok_or_else(|| ibv_error(Verb::CreateSrq, "ibv_create_srq", ffi::errno_or(libc::ENOMEM)))?;
        // SAFETY: a live SRQ; its context's ops table lives as long.
        let post = unsafe { ffi::ops((*raw).context).post_srq_recv };
        Ok(Arc::new(HwSrq {
            // SAFETY: a fresh SRQ only the HwSrq frees.
            srq: unsafe { IbvObject::new(ptr, "shared receive queue") },
            post,
            // ibv_create_srq wrote back what it granted.
            max_sge: init.attr.max_sge,
            life: pd.life().clone(),
            _pd: pd.arc(),
        }))
    }

    /// The SRQ's ibverbs object.
    pub(crate) fn obj(&self) -> &IbvObject<ibv_srq> {
        &self.srq
    }

    /// The `struct ibv_srq` pointer, for interoperating with C (rdma_cm).
    /// Valid until this SRQ is destroyed; do not free it.
    pub fn as_ptr(&self) -> *mut ibv_srq {
        self.srq.raw()
    }

    fn free(&self) -> std::result::Result<(), i32> {
        // SAFETY: the SRQ is destroyed at most once (lifecycle).
        self.srq
            .destroy(|srq| self.life.destroy_rc(unsafe { rdma_sys::ibv_destroy_srq(srq) }))
    }
}

impl Drop for HwSrq {
    fn drop(&mut self) {
        let _ = self.free();
    }
}

impl SrqOps for HwSrq {
    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let srq = self.srq.enter(Verb::ModifySrq)?;
        self.life.check(Verb::ModifySrq)?;
        let mut raw = convert::srq_attr_to_raw(attr);
        // SAFETY: a live SRQ and a valid attribute struct.
        let rc = unsafe { rdma_sys::ibv_modify_srq(srq.ptr(), &mut raw, convert::srq_attr_mask_to_raw(mask)) };
        check(Verb::ModifySrq, "ibv_modify_srq", rc)
    }

    fn query(&self) -> Result<SrqAttr> {
        let srq = self.srq.enter(Verb::QuerySrq)?;
        self.life.check(Verb::QuerySrq)?;
        let mut raw: ibv_srq_attr = zeroed();
        // SAFETY: a live SRQ and a valid out-parameter.
        let rc = unsafe { rdma_sys::ibv_query_srq(srq.ptr(), &mut raw) };
        check(Verb::QuerySrq, "ibv_query_srq", rc)?;
        Ok(convert::srq_attr_from_raw(&raw))
    }

    /// `ibv_post_srq_recv` through the provider's entry point, with the
    /// work requests built on the stack.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let srq = self
            .srq
            .enter(Verb::PostSrqRecv)
            .map_err(|error| PostError { index: 0, error })?;
        self.life
            .check(Verb::PostSrqRecv)
            .map_err(|error| PostError { index: 0, error })?;
        let Some(post_fn) = self.post else {
            return Err(PostError {
                index: 0,
                error: verr!(PostSrqRecv, NotSupported, "the provider has no post_srq_recv"),
            });
        };
        post::post_recv(
            wrs,
            self.max_sge,
            Verb::PostSrqRecv,
            "ibv_post_srq_recv",
            None,
            |wr, bad| {
                // SAFETY: a live SRQ (entered above) and a linked chain of
                // valid work requests (post.rs).
                unsafe { post_fn(srq.ptr(), wr, bad) }
            },
        )
    }

    /// `ibv_destroy_srq`: `EBUSY` while QPs use it.
    fn destroy(&self) -> Result<()> {
        self.free()
            .map_err(|e| ibv_error(Verb::DestroySrq, "ibv_destroy_srq", e))
    }
}
