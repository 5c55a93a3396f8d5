//! The trait family a backend implements. Applications use the handles in
//! [`super::handle`]; these traits are for backend authors (the soft
//! provider, the hardware backend over rdma-sys, and test doubles).
//!
//! Every method mirrors one libibverbs call and keeps its semantics (see the
//! rdma-core man pages); each returns the errno class that call returns.
//! Objects are reference counted: a backend object holds `Arc`s to the
//! objects it depends on (a QP holds its PD, CQs and SRQ), so an object is
//! freed only when nothing uses it; the explicit `destroy` methods fail with
//! `EBUSY` while dependents exist, and are idempotent once they succeed.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::attr::*;
use super::error::{PostError, Result};
use super::memory::MemorySource;
use super::types::*;
use super::wr::*;

/// Which implementation a device belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The soft provider (pure Rust RoCEv2).
    Soft,
    /// Real ibverbs through rdma-sys.
    Hardware,
}

impl BackendKind {
    /// Lower-case name used on the command line (`soft`, `hw`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Soft => "soft",
            BackendKind::Hardware => "hw",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "soft" => Ok(BackendKind::Soft),
            "hw" | "hardware" => Ok(BackendKind::Hardware),
            other => Err(format!("unknown backend '{other}' (expected soft or hw)")),
        }
    }
}

/// Lets a backend recover its concrete type from a trait object (to accept
/// only its own CQs when creating a QP, for example).
///
/// Call it on the trait object, not on the `Arc` holding it:
/// `handle.ops().as_ref().as_any()` — `Arc<dyn CqOps>` is itself `Any`, so
/// `handle.ops().as_any()` would name the `Arc` and never downcast.
pub trait AsAny: Any + Send + Sync {
    /// `self` as `&dyn Any`.
    fn as_any(&self) -> &dyn Any;
    /// `self` as `Arc<dyn Any>`, for `Arc::downcast`.
    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<T: Any + Send + Sync> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// Downcasts the object inside an `Arc<dyn …Ops>` to a backend's concrete
/// type (the safe way around the [`AsAny`] pitfall).
pub fn downcast<T: 'static, O: ?Sized + AsAny>(ops: &Arc<O>) -> Option<&T> {
    (**ops).as_any().downcast_ref::<T>()
}

/// A source of devices (`ibv_get_device_list` for one backend).
pub trait Provider: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The devices present now.
    ///
    /// # Errors
    ///
    /// `ENOSYS`/`EOPNOTSUPP` when the backend cannot enumerate at all (e.g.
    /// no kernel support); an empty list when it can but there are none.
    fn devices(&self) -> Result<Vec<Arc<dyn DeviceOps>>>;
}

/// A device in a device list (`struct ibv_device`).
pub trait DeviceOps: AsAny {
    /// Kernel-style device name (`mlx5_0`, `rxe0`, `softverbs_0`).
    fn name(&self) -> &str;
    /// Node GUID.
    fn node_guid(&self) -> Guid;
    /// Backend.
    fn backend(&self) -> BackendKind;
    /// Opens the device (`ibv_open_device`).
    fn open(&self) -> Result<Arc<dyn ContextOps>>;
}

/// An open device (`struct ibv_context`).
pub trait ContextOps: AsAny {
    /// The device's name.
    fn device_name(&self) -> &str;
    /// `ibv_query_device`.
    fn query_device(&self) -> Result<DeviceAttr>;
    /// `ibv_query_port` (ports are 1-based).
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// `ibv_query_gid`.
    fn query_gid(&self, port: u8, index: u32) -> Result<Gid>;
    /// `ibv_query_pkey`.
    fn query_pkey(&self, port: u8, index: u16) -> Result<u16>;
    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>>;
    /// `ibv_create_comp_channel`.
    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>>;
    /// `ibv_create_cq`: at least `cqe` entries; `context` is returned by the
    /// completion channel with each event (`cq_context`).
    fn create_cq(
        &self,
        cqe: u32,
        context: u64,
        channel: Option<&Arc<dyn CompChannelOps>>,
        comp_vector: u32,
    ) -> Result<Arc<dyn CqOps>>;
    /// `ibv_get_async_event` with a timeout (`None` waits forever,
    /// `Some(ZERO)` polls). `Ok(None)` when the timeout passed.
    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>>;
    /// The file descriptor that becomes readable when an async event is
    /// pending (for poll/epoll), if the backend has one.
    fn async_fd(&self) -> Option<std::os::fd::RawFd>;
}

/// A protection domain (`struct ibv_pd`).
pub trait PdOps: AsAny {
    /// `ibv_reg_mr` over `memory` (which the MR owns if it is
    /// [`MemorySource::Owned`]).
    fn reg_mr(&self, memory: MemorySource, access: AccessFlags) -> Result<Arc<dyn MrOps>>;
    /// Allocates an unmapped (FREE) fast-registration MR able to map
    /// `max_pages` pages (kernel `ib_alloc_mr(IB_MR_TYPE_MEM_REG)`).
    fn alloc_fast_reg_mr(&self, max_pages: u32) -> Result<Arc<dyn MrOps>>;
    /// `ibv_alloc_mw`.
    fn alloc_mw(&self, mw_type: MwType) -> Result<Arc<dyn MwOps>>;
    /// `ibv_create_qp`.
    fn create_qp(&self, attr: &QpCreateAttr) -> Result<Arc<dyn QpOps>>;
    /// `ibv_create_srq`; `context` is reported with SRQ async events.
    fn create_srq(&self, attr: SrqAttr, context: u64) -> Result<Arc<dyn SrqOps>>;
    /// `ibv_create_ah`.
    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AhOps>>;
    /// `ibv_dealloc_pd`: `EBUSY` while objects use the PD.
    fn destroy(&self) -> Result<()>;
}

/// What `create_qp` needs (`struct ibv_qp_init_attr`).
#[derive(Clone)]
pub struct QpCreateAttr {
    /// Transport.
    pub qp_type: QpType,
    /// Completion queue for the send queue.
    pub send_cq: Arc<dyn CqOps>,
    /// Completion queue for the receive queue.
    pub recv_cq: Arc<dyn CqOps>,
    /// Shared receive queue, if any.
    pub srq: Option<Arc<dyn SrqOps>>,
    /// Requested capacities.
    pub cap: QpCap,
    /// Signal every send WR regardless of `SIGNALED`.
    pub sq_sig_all: bool,
}

/// A memory region (`struct ibv_mr`), including fast-registration MRs.
pub trait MrOps: AsAny {
    /// Local key.
    fn lkey(&self) -> u32;
    /// Remote key (0 when the MR grants no remote access).
    fn rkey(&self) -> u32;
    /// Start address (iova).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn length(&self) -> u64;
    /// Access rights.
    fn access(&self) -> AccessFlags;
    /// The memory behind the MR (library-owned or a raw region), if the
    /// backend exposes it; `None` for fast-registration MRs.
    fn memory(&self) -> Option<Arc<MemorySource>>;
    /// `ibv_rereg_mr`: change translation, PD and/or access.
    fn rereg(
        &self,
        flags: ReregFlags,
        pd: Option<&Arc<dyn PdOps>>,
        memory: Option<MemorySource>,
        access: AccessFlags,
    ) -> Result<()>;
    /// Maps a scatter list onto a fast-registration MR with pages of
    /// `page_size` bytes (kernel `ib_map_mr_sg`); returns how many entries
    /// were mapped (fewer than `sgl.len()` is a short mapping).
    fn map_pages(&self, sgl: &[Sge<'_>], page_size: u32) -> Result<usize>;
    /// `ibv_dereg_mr`: `EBUSY` while memory windows are bound to it.
    fn dereg(&self) -> Result<()>;
}

/// A memory window (`struct ibv_mw`).
pub trait MwOps: AsAny {
    /// Current rkey.
    fn rkey(&self) -> u32;
    /// Window type.
    fn mw_type(&self) -> MwType;
    /// `ibv_dealloc_mw` (invalidates a bound window).
    fn dealloc(&self) -> Result<()>;
}

/// A completion event channel (`struct ibv_comp_channel`).
pub trait CompChannelOps: AsAny {
    /// `ibv_get_cq_event` with a timeout: the `context` of the CQ that
    /// fired, or `Ok(None)` when the timeout passed.
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u64>>;
    /// File descriptor readable while an event is pending.
    fn fd(&self) -> Option<std::os::fd::RawFd>;
    /// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
    fn destroy(&self) -> Result<()>;
}

/// What may be done while a device's own lock is held: posting to and
/// polling the objects of that device. The ULP layer keeps its
/// per-request state of soft QPs and CQs under the soft engine's lock
/// (`soft::SoftLock`), which every post and poll takes anyway, so it adds
/// no lock of its own to either; on other backends its sections are
/// `ulp::guard::Direct`, the verbs themselves under the layer's mutex.
///
/// Nothing else of the device may be called while a section runs (any
/// other verb of it takes the lock again): the section's own methods are
/// the only way in.
pub(crate) trait DeviceSection {
    /// `ibv_post_send` on `qp`, which must belong to the section's device.
    ///
    /// # Errors
    ///
    /// Those of [`QpOps::post_send`]; `EINVAL` if `qp` is of another
    /// device.
    fn post_send(&mut self, qp: &dyn QpOps, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError>;
    /// `ibv_post_recv` on `qp`, which must belong to the section's device.
    ///
    /// # Errors
    ///
    /// Those of [`QpOps::post_recv`]; `EINVAL` if `qp` is of another
    /// device.
    fn post_recv(&mut self, qp: &dyn QpOps, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError>;
    /// `ibv_poll_cq` on `cq`, which must belong to the section's device.
    ///
    /// # Errors
    ///
    /// Those of [`CqOps::poll`]; `EINVAL` if `cq` is of another device.
    fn poll(&mut self, cq: &dyn CqOps, wc: &mut [WorkCompletion]) -> Result<usize>;
}

/// A completion queue (`struct ibv_cq`).
pub trait CqOps: AsAny {
    /// `ibv_poll_cq`: fills up to `wc.len()` completions, returns how many.
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize>;
    /// `ibv_req_notify_cq`: arm the one-shot notification.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;
    /// `ibv_resize_cq`: returns the new capacity.
    fn resize(&self, cqe: u32) -> Result<u32>;
    /// Capacity (`cq->cqe`).
    fn capacity(&self) -> u32;
    /// `ibv_ack_cq_events`.
    fn ack_events(&self, n: u32);
    /// The user context given at creation.
    fn context(&self) -> u64;
    /// `ibv_destroy_cq`: `EBUSY` while QPs use it.
    fn destroy(&self) -> Result<()>;
}

/// A queue pair (`struct ibv_qp`).
pub trait QpOps: AsAny {
    /// QP number.
    fn qp_num(&self) -> u32;
    /// Transport.
    fn qp_type(&self) -> QpType;
    /// Capacities granted at creation.
    fn cap(&self) -> QpCap;
    /// `ibv_modify_qp`: check-then-apply; on error nothing changed.
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;
    /// `ibv_query_qp`: the current attributes (all fields filled).
    fn query(&self) -> Result<QpAttr>;
    /// `ibv_post_send`.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError>;
    /// Posts `wrs` whole or not at all (`ibv_wr_complete`): every WR is
    /// checked before any is posted. The default, for a backend that
    /// cannot check a batch before posting it, refuses with
    /// `NotSupported` and posts nothing.
    fn post_send_all(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let _ = wrs;
        Err(PostError {
            index: 0,
            error: super::error::verr!(
                PostSend,
                NotSupported,
                "this backend cannot post a batch all or nothing"
            ),
        })
    }
    /// `ibv_post_recv`.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError>;
    /// `ibv_bind_mw` for a type 1 window: posts a bind on this QP and
    /// returns the window's new rkey.
    fn bind_mw(&self, mw: &Arc<dyn MwOps>, wr_id: u64, bind: &MwBindInfo<'_>, flags: SendFlags) -> Result<u32>;
    /// `ibv_destroy_qp`.
    fn destroy(&self) -> Result<()>;
}

/// A shared receive queue (`struct ibv_srq`).
pub trait SrqOps: AsAny {
    /// `ibv_modify_srq`.
    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()>;
    /// `ibv_query_srq`.
    fn query(&self) -> Result<SrqAttr>;
    /// `ibv_post_srq_recv`.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError>;
    /// `ibv_destroy_srq`: `EBUSY` while QPs use it.
    fn destroy(&self) -> Result<()>;
}

/// An address handle (`struct ibv_ah`).
pub trait AhOps: AsAny {
    /// The attributes it was created with.
    fn attr(&self) -> AhAttr;
    /// `ibv_destroy_ah`.
    fn destroy(&self) -> Result<()>;
}

/// What an async event concerns (`union element` of `struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// The device as a whole.
    Device,
    /// A port (1-based).
    Port(u8),
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by its user context.
    Cq(u64),
    /// An SRQ, by its user context.
    Srq(u64),
}

/// An asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: EventType,
    /// To what.
    pub element: AsyncElement,
}
