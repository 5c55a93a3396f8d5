//! The objects applications hold: thin, backend-neutral handles over the
//! [`backend`](super::backend) trait objects, so the backend is chosen at
//! run time.
//!
//! Handles are `Send + Sync` and not `Clone` (share one with `Arc` or by
//! reference). Dropping a handle releases the object as soon as nothing
//! depends on it; the explicit `destroy` methods report `EBUSY` the way
//! libibverbs does and give the handle back.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::attr::*;
use super::backend::*;
use super::error::{verr, Error, PostError, Result};
use super::memory::{MemorySource, MrMemory, RawRegion};
use super::types::*;
use super::wr::*;

/// A failed `destroy`: the error and the handle, still usable.
pub struct DestroyError<T> {
    /// The object that was not destroyed.
    pub object: T,
    /// Why (typically `EBUSY`).
    pub error: Error,
}

impl<T> fmt::Debug for DestroyError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestroyError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for DestroyError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> std::error::Error for DestroyError<T> {}

impl<T> From<DestroyError<T>> for Error {
    fn from(e: DestroyError<T>) -> Error {
        e.error
    }
}

macro_rules! handle {
    ($(#[$m:meta])* $name:ident, $ops:ident) => {
        $(#[$m])*
        pub struct $name {
            ops: Arc<dyn $ops>,
        }

        impl $name {
            /// Wraps a backend object.
            pub fn from_ops(ops: Arc<dyn $ops>) -> Self {
                $name { ops }
            }

            /// The backend object (for backends and the subsystem layer).
            pub fn ops(&self) -> &Arc<dyn $ops> {
                &self.ops
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name)).finish_non_exhaustive()
            }
        }
    };
}

/// Destroy-on-drop for handles whose backend destroy is idempotent; an
/// `EBUSY` on drop leaves the object to be freed with its last dependent.
macro_rules! destroy_on_drop {
    ($name:ident, $method:ident) => {
        impl Drop for $name {
            fn drop(&mut self) {
                let _ = self.ops.$method();
            }
        }

        impl $name {
            /// Destroys the object now.
            ///
            /// # Errors
            ///
            /// `EBUSY` while other objects depend on it (the handle comes
            /// back in the error); after hot-unplug it succeeds.
            pub fn destroy(self) -> std::result::Result<(), DestroyError<Self>> {
                match self.ops.$method() {
                    Ok(()) => Ok(()),
                    Err(error) => Err(DestroyError { object: self, error }),
                }
            }
        }
    };
}

handle!(
    /// A device in the device list (`struct ibv_device`). Cheap to clone.
    Device,
    DeviceOps
);

impl Clone for Device {
    fn clone(&self) -> Self {
        Device { ops: self.ops.clone() }
    }
}

impl Device {
    /// Device name.
    pub fn name(&self) -> &str {
        self.ops.name()
    }

    /// Node GUID.
    pub fn guid(&self) -> Guid {
        self.ops.node_guid()
    }

    /// Which backend implements it.
    pub fn backend(&self) -> BackendKind {
        self.ops.backend()
    }

    /// Opens the device (`ibv_open_device`).
    ///
    /// # Errors
    ///
    /// `ENODEV` if the device was removed.
    pub fn open(&self) -> Result<Context> {
        Ok(Context { ops: self.ops.open()? })
    }
}

handle!(
    /// An open device (`struct ibv_context`). Cheap to clone.
    Context,
    ContextOps
);

impl Clone for Context {
    fn clone(&self) -> Self {
        Context { ops: self.ops.clone() }
    }
}

impl Context {
    /// The device's name.
    pub fn device_name(&self) -> &str {
        self.ops.device_name()
    }

    /// Device attributes (`ibv_query_device`).
    ///
    /// # Errors
    ///
    /// `ENODEV` after removal.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        self.ops.query_device()
    }

    /// Port attributes (`ibv_query_port`); ports are numbered from 1.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a port that does not exist; `ENODEV` after removal.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.ops.query_port(port)
    }

    /// GID table entry (`ibv_query_gid`); unused entries are all-zero.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad port or an index beyond the table.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.ops.query_gid(port, index)
    }

    /// P_Key table entry (`ibv_query_pkey`).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad port or index.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.ops.query_pkey(port, index)
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    ///
    /// `ENOMEM` at the device's PD limit; `ENODEV` after removal.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            ops: self.ops.alloc_pd()?,
        })
    }

    /// Creates a completion event channel (`ibv_create_comp_channel`).
    ///
    /// # Errors
    ///
    /// `EMFILE`-class failures as `Other`; `ENODEV` after removal.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel {
            ops: self.ops.create_comp_channel()?,
        })
    }

    /// Creates a completion queue of at least `cqe` entries
    /// (`ibv_create_cq`). `context` identifies it in channel and async
    /// events.
    ///
    /// # Errors
    ///
    /// `EINVAL` if `cqe` is 0 or above the device's `max_cqe`; `ENOMEM` at
    /// the CQ limit; `ENODEV` after removal.
    pub fn create_cq(&self, cqe: u32, context: u64, channel: Option<&CompChannel>, comp_vector: u32) -> Result<Cq> {
        Ok(Cq {
            ops: self.ops.create_cq(cqe, context, channel.map(|c| &c.ops), comp_vector)?,
        })
    }

    /// A completion queue of at least `cqe` entries to create, with
    /// context 0, no channel and vector 0 unless set:
    /// `ctx.cq_builder(64).channel(&chan).create()`.
    pub fn cq_builder(&self, cqe: u32) -> CqBuilder<'_> {
        CqBuilder {
            ctx: self,
            cqe,
            context: 0,
            channel: None,
            comp_vector: 0,
        }
    }

    /// Waits up to `timeout` (`None`: forever) for the next async event.
    ///
    /// # Errors
    ///
    /// `EIO` if the event source failed.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        self.ops.get_async_event(timeout)
    }
}

impl std::os::fd::AsRawFd for Context {
    /// The async event descriptor (see [`AsFd`](std::os::fd::AsFd) for
    /// when it is readable), or -1 if the backend has none.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.ops.async_fd().unwrap_or(-1)
    }
}

impl std::os::fd::AsFd for Context {
    /// A descriptor readable whenever an async event is pending, whatever
    /// the backend, engine mode or link: register it with `epoll`/`mio`
    /// and call [`Context::get_async_event`] (with a zero timeout) when it
    /// is readable. It may also wake when no event results (a soft device
    /// in inline mode wakes for the datagrams it must read to find out);
    /// the call then returns `None`. A backend without one gives a
    /// descriptor that is never readable.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        borrow_or_never(self.ops.async_fd())
    }
}

/// `fd` borrowed for the lifetime of the handle that owns it, or a
/// process-wide eventfd nobody posts (never readable).
///
/// # Panics
///
/// Only for a backend without a descriptor, if the process cannot open
/// that one eventfd (out of descriptors).
fn borrow_or_never<'a>(fd: Option<std::os::fd::RawFd>) -> std::os::fd::BorrowedFd<'a> {
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    static NEVER: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    match fd {
        // SAFETY: the backend object owns this descriptor and keeps it open
        // for as long as it lives; the handle holds the object, and the
        // borrow is tied to the handle.
        Some(fd) if fd >= 0 => unsafe { BorrowedFd::borrow_raw(fd) },
        _ => NEVER
            .get_or_init(|| never_fd().expect("an eventfd for a backend without event descriptors"))
            .as_fd(),
    }
}

/// An eventfd nobody posts: never readable.
fn never_fd() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd has no memory-safety preconditions; a negative
    // return is an error.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    // SAFETY: a fresh descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// What [`Pd::create_qp`] needs (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue, if any.
    pub srq: Option<&'a Srq>,
    /// Requested capacities.
    pub cap: QpCap,
    /// Signal every send WR.
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// A QP of `qp_type` on these CQs with no SRQ, selective signaling
    /// and [`QpInitAttr::DEFAULT_CAP`]; change any field, or use the
    /// `with_*` methods.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq) -> QpInitAttr<'a> {
        QpInitAttr {
            qp_type,
            send_cq,
            recv_cq,
            srq: None,
            cap: Self::DEFAULT_CAP,
            sq_sig_all: false,
        }
    }

    /// The capacities [`QpInitAttr::new`] asks for: 64 send and 64
    /// receive WRs of one SGE each, no inline data.
    pub const DEFAULT_CAP: QpCap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };

    /// The same with capacities `cap`.
    #[must_use]
    pub fn with_cap(mut self, cap: QpCap) -> Self {
        self.cap = cap;
        self
    }

    /// The same receiving through `srq`.
    #[must_use]
    pub fn with_srq(mut self, srq: &'a Srq) -> Self {
        self.srq = Some(srq);
        self
    }

    /// The same signaling every send WR (`sq_sig_all`).
    #[must_use]
    pub fn with_sq_sig_all(mut self, all: bool) -> Self {
        self.sq_sig_all = all;
        self
    }
}

/// A completion queue to create ([`Context::cq_builder`]): `ibv_create_cq`
/// with named arguments.
#[derive(Debug, Clone, Copy)]
#[must_use = "call create() to make the CQ"]
pub struct CqBuilder<'a> {
    ctx: &'a Context,
    cqe: u32,
    context: u64,
    channel: Option<&'a CompChannel>,
    comp_vector: u32,
}

impl<'a> CqBuilder<'a> {
    /// The value that identifies the CQ in channel and async events
    /// (default 0).
    pub fn context(mut self, context: u64) -> Self {
        self.context = context;
        self
    }

    /// Reports completion events to `channel` (default: none).
    pub fn channel(mut self, channel: &'a CompChannel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// Completion vector (default 0).
    pub fn comp_vector(mut self, v: u32) -> Self {
        self.comp_vector = v;
        self
    }

    /// Creates the CQ.
    ///
    /// # Errors
    ///
    /// As [`Context::create_cq`].
    pub fn create(self) -> Result<Cq> {
        self.ctx
            .create_cq(self.cqe, self.context, self.channel, self.comp_vector)
    }
}

handle!(
    /// A protection domain (`struct ibv_pd`).
    Pd,
    PdOps
);
destroy_on_drop!(Pd, destroy);

impl Pd {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers
    /// it (the safe way to get registered memory). Use [`Mr::sge`] to post
    /// from it and [`Mr::read`]/[`Mr::write`] to access it.
    ///
    /// # Errors
    ///
    /// `EINVAL` for access flags that break the registration rule (remote
    /// write or atomic without local write); `ENOMEM` when out of memory or
    /// MRs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(pd: &softverbs::verbs::Pd) -> softverbs::verbs::Result<()> {
    /// use softverbs::verbs::AccessFlags;
    /// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// mr.write(0, b"hello")?;
    /// let sge = mr.sge(0, 5)?;
    /// # let _ = sge; Ok(()) }
    /// ```
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        let memory = MrMemory::new(len)?;
        Ok(Mr {
            ops: self.ops.reg_mr(MemorySource::Owned(memory), access)?,
        })
    }

    /// As [`Pd::alloc_mr`], with memory from the process heap that is
    /// never shareable with peers on this host ([`MrMemory::heap`]): what
    /// `ibv_reg_mr` of a C program's buffer gives, for measuring and
    /// testing the paths such memory takes.
    ///
    /// # Errors
    ///
    /// As [`Pd::alloc_mr`].
    pub fn alloc_mr_heap(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        Ok(Mr {
            ops: self.ops.reg_mr(MemorySource::Owned(MrMemory::heap(len)?), access)?,
        })
    }

    /// Registers caller-owned memory (`ibv_reg_mr`). The region's own
    /// `unsafe` constructor carries the caller's promise.
    ///
    /// # Errors
    ///
    /// As [`Pd::alloc_mr`].
    pub fn reg_mr_raw(&self, region: RawRegion, access: AccessFlags) -> Result<Mr> {
        Ok(Mr {
            ops: self.ops.reg_mr(MemorySource::Raw(region), access)?,
        })
    }

    /// Allocates a fast-registration MR with room for `max_pages` pages,
    /// unmapped and FREE.
    ///
    /// # Errors
    ///
    /// `EINVAL` beyond `max_fast_reg_page_list_len`; `EOPNOTSUPP` where the
    /// backend has no user-space fast registration (ibverbs).
    pub fn alloc_fast_reg_mr(&self, max_pages: u32) -> Result<Mr> {
        Ok(Mr {
            ops: self.ops.alloc_fast_reg_mr(max_pages)?,
        })
    }

    /// Allocates a memory window (`ibv_alloc_mw`).
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP`/`EINVAL` for a window type the device lacks.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        Ok(Mw {
            ops: self.ops.alloc_mw(mw_type)?,
        })
    }

    /// Creates a queue pair (`ibv_create_qp`); the granted capacities
    /// ([`Qp::cap`]) are at least those requested.
    ///
    /// # Errors
    ///
    /// `EINVAL` for capacities above the device limits, zero-depth queues
    /// where a queue is needed, or objects of another device; `ENOMEM` at
    /// the QP limit.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Qp> {
        let create = QpCreateAttr {
            qp_type: attr.qp_type,
            send_cq: attr.send_cq.ops.clone(),
            recv_cq: attr.recv_cq.ops.clone(),
            srq: attr.srq.map(|s| s.ops.clone()),
            cap: attr.cap,
            sq_sig_all: attr.sq_sig_all,
        };
        Ok(Qp {
            ops: self.ops.create_qp(&create)?,
        })
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    ///
    /// # Errors
    ///
    /// `EINVAL` beyond the device's SRQ limits.
    pub fn create_srq(&self, attr: SrqAttr, context: u64) -> Result<Srq> {
        Ok(Srq {
            ops: self.ops.create_srq(attr, context)?,
        })
    }

    /// Creates an address handle (`ibv_create_ah`).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad port or GID index, or a non-global AV on RoCE.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        Ok(Ah {
            ops: self.ops.create_ah(attr)?,
        })
    }
}

handle!(
    /// A memory region (`struct ibv_mr`). Every offset into it is a `u64`
    /// ([`Mr::sge`], [`Mr::remote`], [`Mr::read`], [`Mr::write`], …).
    Mr,
    MrOps
);
destroy_on_drop!(Mr, dereg);

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.ops.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.ops.rkey()
    }

    /// Start address (what a peer puts in `remote_addr`).
    pub fn addr(&self) -> u64 {
        self.ops.addr()
    }

    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.ops.length()
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.ops.access()
    }

    /// A scatter/gather entry for `len` bytes at `offset` in this MR.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is outside the MR or longer than 2^32-1.
    pub fn sge(&self, offset: u64, len: u32) -> Result<Sge<'_>> {
        let end = offset.checked_add(u64::from(len));
        match end {
            Some(end) if end <= self.length() => Ok(Sge::checked(self.addr() + offset, len, self.lkey())),
            _ => Err(verr!(
                MemoryAccess,
                InvalidArgument,
                "sge {offset}+{len} outside the {}-byte MR",
                self.length()
            )),
        }
    }

    /// Remote address of `offset` in this MR, for a peer's work request.
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr() + offset,
            rkey: self.rkey(),
        }
    }

    fn mem(&self) -> Result<Arc<MemorySource>> {
        self.ops.memory().ok_or_else(|| {
            verr!(
                MemoryAccess,
                InvalidArgument,
                "this MR has no directly accessible memory (fast-registration MR, or a backend that does not expose it)"
            )
        })
    }

    /// Copies bytes out of the MR at `offset`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if out of bounds or the MR has no accessible memory.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.mem()?.read_at(mem_offset(offset)?, dst)
    }

    /// Copies `src` into the MR at `offset`.
    ///
    /// # Errors
    ///
    /// As [`Mr::read`].
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.mem()?.write_at(mem_offset(offset)?, src)
    }

    /// Reads `len` bytes at `offset` into a new vector.
    ///
    /// # Errors
    ///
    /// As [`Mr::read`].
    pub fn to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Fills `len` bytes at `offset` with `byte`.
    ///
    /// # Errors
    ///
    /// As [`Mr::read`].
    pub fn fill(&self, offset: u64, len: usize, byte: u8) -> Result<()> {
        self.mem()?.fill_at(mem_offset(offset)?, len, byte)
    }

    /// Atomically loads the 8-byte word at `offset` (host byte order).
    ///
    /// # Errors
    ///
    /// `EINVAL` if misaligned, out of bounds or not accessible.
    pub fn load_u64(&self, offset: u64) -> Result<u64> {
        self.mem()?.load_u64(mem_offset(offset)?)
    }

    /// Atomically stores the 8-byte word at `offset` (host byte order).
    ///
    /// # Errors
    ///
    /// As [`Mr::load_u64`].
    pub fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.mem()?.store_u64(mem_offset(offset)?, value)
    }

    /// The key with its key byte incremented (`ibv_inc_rkey`): the key to
    /// give the next REG_MR of a fast-registration MR.
    pub fn next_key(&self) -> u32 {
        inc_key(self.lkey())
    }

    /// Re-registers (`ibv_rereg_mr`): new access, PD and/or translation.
    ///
    /// # Errors
    ///
    /// `EINVAL` for bad flags/access; `EBUSY` with bound windows.
    pub fn rereg(
        &self,
        flags: ReregFlags,
        pd: Option<&Pd>,
        memory: Option<MemorySource>,
        access: AccessFlags,
    ) -> Result<()> {
        self.ops.rereg(flags, pd.map(|p| &p.ops), memory, access)
    }

    /// Maps a scatter list onto this fast-registration MR with `page_size`
    /// pages; returns the number of entries mapped.
    ///
    /// # Errors
    ///
    /// `EINVAL` if this is not a fast-registration MR or it is VALID.
    pub fn map_pages(&self, sgl: &[Sge<'_>], page_size: u32) -> Result<usize> {
        self.ops.map_pages(sgl, page_size)
    }
}

/// An MR offset as an index into its memory (every offset of an MR is a
/// `u64`, like the addresses and lengths of work requests).
fn mem_offset(offset: u64) -> Result<usize> {
    usize::try_from(offset).map_err(|_| {
        verr!(
            MemoryAccess,
            InvalidArgument,
            "offset {offset} beyond the address space"
        )
    })
}

handle!(
    /// A memory window (`struct ibv_mw`).
    Mw,
    MwOps
);
destroy_on_drop!(Mw, dealloc);

/// A key with its low 8 bits (the key byte) incremented, the index kept
/// (`ibv_inc_rkey`).
pub fn inc_key(key: u32) -> u32 {
    (key & !0xff) | (key.wrapping_add(1) & 0xff)
}

impl Mw {
    /// The rkey with its key byte incremented: the rkey to give the next
    /// BIND_MW of a type 2 window.
    pub fn next_rkey(&self) -> u32 {
        inc_key(self.rkey())
    }

    /// Current rkey.
    pub fn rkey(&self) -> u32 {
        self.ops.rkey()
    }

    /// Window type.
    pub fn mw_type(&self) -> MwType {
        self.ops.mw_type()
    }
}

handle!(
    /// A completion event channel (`struct ibv_comp_channel`).
    CompChannel,
    CompChannelOps
);
destroy_on_drop!(CompChannel, destroy);

impl CompChannel {
    /// Waits up to `timeout` (`None`: forever) for a CQ event; returns the
    /// CQ's context. Each event must later be acknowledged with
    /// [`Cq::ack_events`].
    ///
    /// # Errors
    ///
    /// `EIO` if the channel failed.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u64>> {
        self.ops.get_cq_event(timeout)
    }
}

impl std::os::fd::AsRawFd for CompChannel {
    /// The channel's descriptor (see [`AsFd`](std::os::fd::AsFd) for when
    /// it is readable), or -1 if the backend has none.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.ops.fd().unwrap_or(-1)
    }
}

impl std::os::fd::AsFd for CompChannel {
    /// A descriptor readable whenever a completion event is pending,
    /// whatever the backend, engine mode or link: register it with
    /// `epoll`/`mio` and call [`CompChannel::get_cq_event`] (with a zero
    /// timeout) when it is readable. Nothing else needs registering: for a
    /// soft device in inline mode on a network link the descriptor also
    /// covers the link's sockets and the engine's timers, so it may wake
    /// without an event (the call then reads the link and returns `None`).
    /// A backend without one gives a descriptor that is never readable.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        borrow_or_never(self.ops.fd())
    }
}

handle!(
    /// A completion queue (`struct ibv_cq`).
    Cq,
    CqOps
);
destroy_on_drop!(Cq, destroy);

impl Cq {
    /// Polls up to `wc.len()` completions (`ibv_poll_cq`).
    ///
    /// # Errors
    ///
    /// `EIO` if the CQ overran (it is then unusable) or the device failed.
    #[inline]
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        self.ops.poll(wc)
    }

    /// Arms the one-shot notification (`ibv_req_notify_cq`).
    ///
    /// # Errors
    ///
    /// `ENODEV` after removal.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.ops.req_notify(solicited_only)
    }

    /// Resizes (`ibv_resize_cq`); returns the new capacity.
    ///
    /// # Errors
    ///
    /// `EINVAL` below the number of queued completions or above `max_cqe`.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        self.ops.resize(cqe)
    }

    /// Capacity.
    pub fn capacity(&self) -> u32 {
        self.ops.capacity()
    }

    /// Acknowledges `n` channel events (`ibv_ack_cq_events`).
    pub fn ack_events(&self, n: u32) {
        self.ops.ack_events(n)
    }

    /// The context given at creation.
    pub fn context(&self) -> u64 {
        self.ops.context()
    }
}

handle!(
    /// A queue pair (`struct ibv_qp`).
    Qp,
    QpOps
);
destroy_on_drop!(Qp, destroy);

impl Qp {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.ops.qp_num()
    }

    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.ops.qp_type()
    }

    /// Capacities granted at creation.
    pub fn cap(&self) -> QpCap {
        self.ops.cap()
    }

    /// Modifies attributes and/or state (`ibv_modify_qp`); see docs/design.md §3.2
    /// for the legal transitions and masks.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an illegal transition, a missing or extra mask bit, or
    /// an invalid attribute; nothing changes then.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.ops.modify(attr, mask)
    }

    /// Current attributes (`ibv_query_qp`).
    ///
    /// # Errors
    ///
    /// `ENODEV` after removal (the soft provider still answers).
    pub fn query(&self) -> Result<QpAttr> {
        self.ops.query()
    }

    /// Posts send work requests (`ibv_post_send`).
    ///
    /// # Errors
    ///
    /// The index of the first rejected WR and why: `EINVAL` (state, opcode,
    /// SGE count, inline size, misaligned atomic), `ENOMEM` (queue full).
    #[inline]
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.ops.post_send(wrs)
    }

    /// Posts send work requests whole or not at all, as `ibv_wr_complete`
    /// posts the batch built since `ibv_wr_start`: every WR is checked as
    /// [`Qp::post_send`] checks it, the send queue's room counting the
    /// batch's earlier WRs, before any is posted. On success they run in
    /// order, as a chain of [`Qp::post_send`] does.
    ///
    /// # Errors
    ///
    /// As [`Qp::post_send`], with nothing posted: the index is that of the
    /// refused WR. `NotSupported` on a backend that cannot check a batch
    /// before posting it (the hardware backend).
    #[inline]
    pub fn post_send_all(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.ops.post_send_all(wrs)
    }

    /// Posts receive work requests (`ibv_post_recv`).
    ///
    /// # Errors
    ///
    /// As [`Qp::post_send`]; `EINVAL` in RESET or with an SRQ.
    #[inline]
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.ops.post_recv(wrs)
    }

    /// Binds a type 1 memory window through this QP (`ibv_bind_mw`);
    /// returns the new rkey. A zero-length bind invalidates the window.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a type 2 window, an MR without `MW_BIND`, or a range
    /// outside the MR.
    pub fn bind_mw(&self, mw: &Mw, wr_id: u64, bind: &MwBindInfo<'_>, flags: SendFlags) -> Result<u32> {
        self.ops.bind_mw(&mw.ops, wr_id, bind, flags)
    }
}

handle!(
    /// A shared receive queue (`struct ibv_srq`).
    Srq,
    SrqOps
);
destroy_on_drop!(Srq, destroy);

impl Srq {
    /// Resizes or arms the limit (`ibv_modify_srq`).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a limit above the depth or an unsupported resize.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.ops.modify(attr, mask)
    }

    /// Current attributes (`ibv_query_srq`).
    ///
    /// # Errors
    ///
    /// `ENODEV` after removal.
    pub fn query(&self) -> Result<SrqAttr> {
        self.ops.query()
    }

    /// Posts receives (`ibv_post_srq_recv`).
    ///
    /// # Errors
    ///
    /// As [`Qp::post_recv`].
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.ops.post_recv(wrs)
    }
}

handle!(
    /// An address handle (`struct ibv_ah`).
    Ah,
    AhOps
);
destroy_on_drop!(Ah, destroy);

impl Ah {
    /// The attributes it was created with.
    pub fn attr(&self) -> AhAttr {
        self.ops.attr()
    }
}
