//! The provider (`ibv_get_device_list`), devices (`struct ibv_device`) and
//! open contexts (`struct ibv_context`), with their async events.

use std::ffi::CStr;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_context, ibv_device, ibv_device_attr, ibv_gid, ibv_port_attr};

use super::convert::{self, EventSubject};
use super::device_life::{HwDeviceLife, Member, MemberKind};
use super::ffi::{self, zeroed, RawAsyncEvent, SendPtr};
use super::ibv_object::IbvObject;
use super::objects::HwPd;
use super::queue::{CqEvents, HwCompChannel, HwCq};
use super::wake::WakeFd;
use super::{check, ibv_error};
use crate::verbs::backend::*;
use crate::verbs::{
    verr, AsyncEvent, BackendKind, DeviceAttr, Error, ErrorKind, EventType, Gid, Guid, PortAttr, Result, Verb,
};

/// The hardware backend's [`Provider`]: every RDMA device libibverbs sees.
#[derive(Debug, Default)]
pub struct HwProvider {
    _private: (),
}

impl HwProvider {
    /// The provider.
    pub fn new() -> Self {
        HwProvider { _private: () }
    }
}

impl Provider for HwProvider {
    fn kind(&self) -> BackendKind {
        BackendKind::Hardware
    }

    /// `ibv_get_device_list`. A kernel without the RDMA subsystem makes it
    /// fail with `ENOSYS`: that is reported as `EOPNOTSUPP`-class
    /// ([`ErrorKind::NotSupported`]) with a sentence saying so; a kernel
    /// with the subsystem but no device gives an empty list.
    fn devices(&self) -> Result<Vec<Arc<dyn DeviceOps>>> {
        Ok(list_devices(None)?
            .into_iter()
            .map(|d| d as Arc<dyn DeviceOps>)
            .collect())
    }
}

/// `ibv_get_device_list`, in the network namespace at `netns` if given (a
/// device of another namespace can only be listed and opened from inside
/// it, in exclusive mode).
pub(crate) fn list_devices(netns: Option<&Path>) -> Result<Vec<Arc<HwDevice>>> {
    let list = match netns {
        None => DeviceList::get()?,
        Some(path) => super::netns::in_netns(path, DeviceList::get)
            .map_err(|e| verr!(GetDeviceList, Io, "cannot enter {}: {e}", path.display()))??,
    };
    let list = Arc::new(list);
    Ok((0..list.len)
        .map(|index| Arc::new(HwDevice::new(list.clone(), index, netns.map(Path::to_path_buf))))
        .collect())
}

/// The device named `name` (see [`list_devices`]).
///
/// # Errors
///
/// `ENODEV` if there is none; the listing's error.
pub(crate) fn find_device(name: &str, netns: Option<&Path>) -> Result<Arc<HwDevice>> {
    list_devices(netns)?
        .into_iter()
        .find(|d| d.name == name)
        .ok_or_else(|| {
            verr!(
                OpenDevice,
                NoDevice,
                "no RDMA device named '{name}' (ibv_get_device_list)"
            )
        })
}

/// The array `ibv_get_device_list` returns; freed when the last device
/// (and context opened from one) lets go of it, as `ibv_free_device_list(3)`
/// requires for unopened devices.
struct DeviceList {
    list: SendPtr<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        let mut n: i32 = 0;
        ffi::clear_errno();
        // SAFETY: n is a valid out-parameter; the returned array is freed
        // only by Drop below.
        let raw = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
        match SendPtr::new(raw) {
            Some(list) => Ok(DeviceList {
                list,
                len: usize::try_from(n).unwrap_or(0),
            }),
            None => {
                let errno = ffi::errno_or(libc::ENOSYS);
                Err(if errno == libc::ENOSYS {
                    Error::new(
                        Verb::GetDeviceList,
                        ErrorKind::NotSupported,
                        "no RDMA subsystem in this kernel (ibv_get_device_list: ENOSYS); load ib_uverbs and an RDMA driver (e.g. mlx5_ib, rdma_rxe)",
                    )
                } else {
                    ibv_error(Verb::GetDeviceList, "ibv_get_device_list", errno)
                })
            }
        }
    }

    fn device(&self, index: usize) -> *mut ibv_device {
        assert!(index < self.len);
        // SAFETY: the array has `len` valid entries while it is not freed.
        unsafe { *self.list.get().add(index) }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from ibv_get_device_list and is freed once.
        unsafe { rdma_sys::ibv_free_device_list(self.list.get()) };
    }
}

/// A device in the list (`struct ibv_device`).
pub struct HwDevice {
    list: Arc<DeviceList>,
    index: usize,
    name: String,
    /// The uverbs node's name (`uverbs0`), `ibv_device::dev_name`.
    uverbs: String,
    guid: Guid,
    life: Arc<HwDeviceLife>,
    /// The network namespace it was listed in, if not the caller's: opens
    /// happen there (the kernel checks the opener's namespace).
    netns: Option<PathBuf>,
}

impl HwDevice {
    fn new(list: Arc<DeviceList>, index: usize, netns: Option<PathBuf>) -> HwDevice {
        let dev = list.device(index);
        // SAFETY: dev is a valid device while the list is alive; the name
        // is a NUL-terminated string inside the device.
        let name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above; the GUID is read from sysfs, big-endian.
        let guid = convert::guid_from_raw(unsafe { rdma_sys::ibv_get_device_guid(dev) });
        // SAFETY: as above; dev_name is a NUL-terminated array inside it.
        let uverbs = unsafe { CStr::from_ptr((*dev).dev_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        HwDevice {
            life: HwDeviceLife::for_device(&name),
            list,
            index,
            name,
            uverbs,
            guid,
            netns,
        }
    }

    /// The name of the device's uverbs node (`uverbs0`): which kernel
    /// instance it is.
    pub(crate) fn uverbs_name(&self) -> &str {
        &self.uverbs
    }

    /// The device's life (shared by every entry of the same device).
    pub(crate) fn life(&self) -> &Arc<HwDeviceLife> {
        &self.life
    }

    /// Opens a context that is not counted as a consumer and whose async
    /// events are never held back (the event monitor's own).
    pub(crate) fn open_private(&self) -> Result<Arc<HwContext>> {
        self.open_context(false)
    }

    fn open_context(&self, accounted: bool) -> Result<Arc<HwContext>> {
        if accounted {
            self.life.check(Verb::OpenDevice)?;
        }
        let dev = SendPtr::new(self.list.device(self.index)).expect("list entries are not null");
        let open = move || {
            ffi::clear_errno();
            // SAFETY: dev is valid while the list lives (the caller holds it).
            let raw = unsafe { rdma_sys::ibv_open_device(dev.get()) };
            SendPtr::new(raw).ok_or_else(|| ffi::errno_or(libc::ENODEV))
        };
        let ptr = match &self.netns {
            None => open(),
            Some(path) => super::netns::in_netns(path, open)
                .map_err(|e| verr!(OpenDevice, Io, "cannot enter {}: {e}", path.display()))?,
        }
        .map_err(|e| ibv_error(Verb::OpenDevice, "ibv_open_device", e))?;
        // SAFETY: the context is open; async_fd is set once by libibverbs.
        let async_fd = unsafe { (*ptr.get()).async_fd };
        // SAFETY: ptr is a freshly opened context only HwContext closes.
        let ctx = unsafe { IbvObject::new(ptr, "device context") };
        // From here on, dropping `ctx` (or the context) closes the device.
        let wake = match ffi::set_nonblocking(async_fd) {
            0 => WakeFd::new(async_fd),
            e => Err(e),
        };
        let wake = match wake {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the context is open and closed exactly once here.
                let _ = ctx.destroy(|c| unsafe { rdma_sys::ibv_close_device(c) });
                return Err(ibv_error(Verb::OpenDevice, "async event descriptor setup", e));
            }
        };
        let context = Arc::new_cyclic(|this| HwContext {
            this: this.clone(),
            ctx,
            wake,
            name: self.name.clone(),
            life: self.life.clone(),
            accounted,
            fatal: AtomicU8::new(FATAL_NONE),
            _list: self.list.clone(),
        });
        if accounted {
            let member: Weak<dyn Member> = Arc::downgrade(&context) as Weak<HwContext>;
            self.life.register(MemberKind::Context, member);
        }
        Ok(context)
    }
}

impl DeviceOps for HwDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn node_guid(&self) -> Guid {
        self.guid
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Hardware
    }

    /// `ibv_open_device` (`ENODEV` once the device was removed); the
    /// context's async event descriptor is made non-blocking so that
    /// [`ContextOps::get_async_event`] can wait with a timeout.
    fn open(&self) -> Result<Arc<dyn ContextOps>> {
        Ok(self.open_context(true)?)
    }
}

/// No DEVICE_FATAL yet.
const FATAL_NONE: u8 = 0;
/// The kernel reported DEVICE_FATAL; held back until the subsystem's
/// removal reaches its step 5.
const FATAL_HELD: u8 = 1;
/// DEVICE_FATAL is to be delivered.
const FATAL_PENDING: u8 = 2;
/// DEVICE_FATAL was delivered: no event follows.
const FATAL_DELIVERED: u8 = 3;

/// The DEVICE_FATAL event.
const DEVICE_FATAL: AsyncEvent = AsyncEvent {
    event_type: EventType::DeviceFatal,
    element: AsyncElement::Device,
};

/// An open device (`struct ibv_context`), closed when the last object
/// using it is gone.
///
/// Its async events come from the kernel and, on removal, from the backend:
/// DEVICE_FATAL is always the last one (see `device_life.rs`).
pub struct HwContext {
    this: Weak<HwContext>,
    ctx: IbvObject<ibv_context>,
    wake: WakeFd,
    name: String,
    life: Arc<HwDeviceLife>,
    /// Counted as a consumer's context (the monitor's own is not).
    accounted: bool,
    fatal: AtomicU8,
    // Keeps the device list (and so this device) alive while open.
    _list: Arc<DeviceList>,
}

impl HwContext {
    /// This context as an `Arc` (every context lives in one).
    pub(crate) fn arc(&self) -> Arc<HwContext> {
        self.this.upgrade().expect("a live HwContext is always inside its Arc")
    }

    /// The `struct ibv_context` pointer, for interoperating with C
    /// (rdma_cm). It is valid as long as this object is alive; do not
    /// close it. Create CQs on it only through this backend: async CQ
    /// events are decoded through the `cq_context` this backend sets.
    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ctx.raw()
    }

    /// The context's ibverbs object.
    pub(crate) fn ctx_obj(&self) -> &IbvObject<ibv_context> {
        &self.ctx
    }

    /// The device's life.
    pub(crate) fn life(&self) -> &Arc<HwDeviceLife> {
        &self.life
    }

    /// Whether a kernel DEVICE_FATAL must wait for the removal's step 5.
    fn holds_fatal(&self) -> bool {
        self.accounted && self.life.holds_fatal()
    }

    /// The device is gone (the kernel said DEVICE_FATAL, or `EIO`): stop
    /// reading the kernel, and deliver DEVICE_FATAL now or when released.
    fn kernel_fatal(&self) {
        self.life.mark_gone();
        self.wake.detach_kernel();
        let next = if self.holds_fatal() { FATAL_HELD } else { FATAL_PENDING };
        let _ = self
            .fatal
            .compare_exchange(FATAL_NONE, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Enters the context for a call of `verb` (a context is only freed by
    /// its drop, so this never fails while `&self` exists).
    fn enter(&self, verb: Verb) -> Result<super::ibv_object::Entered<'_, ibv_context>> {
        self.ctx.enter(verb)
    }

    /// Reads one event: `Ok(None)` if another thread took it; `Err(None)`
    /// if the device is gone (`EIO`, `ENODEV`).
    fn async_event(&self, ctx: *mut ibv_context) -> std::result::Result<Option<AsyncEvent>, Option<Error>> {
        let mut ev: RawAsyncEvent = zeroed();
        ffi::clear_errno();
        // SAFETY: ctx is open (caller holds it entered); ev has the layout
        // of struct ibv_async_event (checked in ffi tests).
        let rc = unsafe { rdma_sys::ibv_get_async_event(ctx, (&mut ev as *mut RawAsyncEvent).cast()) };
        if rc != 0 {
            return match ffi::errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                libc::EIO | libc::ENODEV => Err(None),
                e => Err(Some(ibv_error(Verb::GetAsyncEvent, "ibv_get_async_event", e))),
            };
        }
        let converted = convert::event_from_raw(ev.event_type).map(|(event_type, subject)| {
            // SAFETY: the union member read is the one the event type names
            // (ibv_get_async_event(3)); the object it points to cannot be
            // destroyed before the event is acknowledged below.
            let element = unsafe {
                match subject {
                    EventSubject::Device | EventSubject::Wq => AsyncElement::Device,
                    EventSubject::Port => AsyncElement::Port(u8::try_from(ev.element.port_num).unwrap_or(0)),
                    EventSubject::Qp => AsyncElement::Qp((*ev.element.qp).qp_num),
                    EventSubject::Cq => AsyncElement::Cq(CqEvents::user_context_of(ev.element.cq)),
                    EventSubject::Srq => AsyncElement::Srq((*ev.element.srq).srq_context as u64),
                }
            };
            AsyncEvent { event_type, element }
        });
        // SAFETY: acknowledging the event we just got, exactly once.
        unsafe { rdma_sys::ibv_ack_async_event((&mut ev as *mut RawAsyncEvent).cast()) };
        match converted {
            Some(event) => Ok(Some(event)),
            None => Err(Some(verr!(
                GetAsyncEvent,
                Io,
                "the device reported async event type {}, unknown to this API (acknowledged)",
                ev.event_type
            ))),
        }
    }
}

impl Drop for HwContext {
    fn drop(&mut self) {
        // Every PD, CQ and channel holds an Arc to us: all are gone.
        // SAFETY: the context is open and closed exactly once here.
        let _ = self.ctx.destroy(|ctx| unsafe { rdma_sys::ibv_close_device(ctx) });
    }
}

impl ContextOps for HwContext {
    fn device_name(&self) -> &str {
        &self.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        self.life.check(Verb::QueryDevice)?;
        let ctx = self.enter(Verb::QueryDevice)?;
        let mut attr: ibv_device_attr = zeroed();
        // SAFETY: open context, valid out-parameter.
        let rc = unsafe { rdma_sys::ibv_query_device(ctx.ptr(), &mut attr) };
        check(Verb::QueryDevice, "ibv_query_device", rc)?;
        Ok(convert::device_attr_from_raw(&attr))
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.life.check(Verb::QueryPort)?;
        let ctx = self.enter(Verb::QueryPort)?;
        let mut attr: ibv_port_attr = zeroed();
        // SAFETY: open context, valid out-parameter.
        let rc = unsafe { ffi::query_port(ctx.ptr(), port, &mut attr) };
        check(Verb::QueryPort, "ibv_query_port", rc)?;
        convert::port_attr_from_raw(&attr)
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.life.check(Verb::QueryGid)?;
        let index =
            i32::try_from(index).map_err(|_| verr!(QueryGid, InvalidArgument, "GID index {index} out of range"))?;
        let ctx = self.enter(Verb::QueryGid)?;
        let mut gid: ibv_gid = zeroed();
        // On failure it returns -1 and may leave errno untouched.
        ffi::clear_errno();
        // SAFETY: open context, valid out-parameter.
        let rc = unsafe { rdma_sys::ibv_query_gid(ctx.ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(ibv_error(Verb::QueryGid, "ibv_query_gid", ffi::errno_or(libc::EINVAL)));
        }
        Ok(convert::gid_from_raw(&gid))
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.life.check(Verb::QueryPkey)?;
        let ctx = self.enter(Verb::QueryPkey)?;
        let mut pkey: u16 = 0;
        ffi::clear_errno();
        // SAFETY: open context, valid out-parameter.
        let rc = unsafe { rdma_sys::ibv_query_pkey(ctx.ptr(), port, i32::from(index), &mut pkey) };
        if rc != 0 {
            return Err(ibv_error(
                Verb::QueryPkey,
                "ibv_query_pkey",
                ffi::errno_or(libc::EINVAL),
            ));
        }
        Ok(u16::from_be(pkey))
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        self.life.check(Verb::AllocPd)?;
        let ctx = self.enter(Verb::AllocPd)?;
        ffi::clear_errno();
        // SAFETY: open context.
        let raw = unsafe { rdma_sys::ibv_alloc_pd(ctx.ptr()) };
        let ptr =
            SendPtr::new(raw).ok_or_else(|| ibv_error(Verb::AllocPd, "ibv_alloc_pd", ffi::errno_or(libc::ENOMEM)))?;
        // SAFETY: a fresh PD that only the HwPd frees.
        Ok(unsafe { HwPd::new(self.arc(), ptr) })
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>> {
        self.life.check(Verb::CreateCompChannel)?;
        let ctx = self.enter(Verb::CreateCompChannel)?;
        ffi::clear_errno();
        // SAFETY: open context.
        let raw = unsafe { rdma_sys::ibv_create_comp_channel(ctx.ptr()) };
        let ptr = SendPtr::new(raw).ok_or_else(|| {
            ibv_error(
                Verb::CreateCompChannel,
                "ibv_create_comp_channel",
                ffi::errno_or(libc::ENOMEM),
            )
        })?;
        // SAFETY: a fresh channel that only the HwCompChannel frees.
        let channel = unsafe { HwCompChannel::new(self.arc(), ptr) };
        Ok(channel?)
    }

    fn create_cq(
        &self,
        cqe: u32,
        context: u64,
        channel: Option<&Arc<dyn CompChannelOps>>,
        comp_vector: u32,
    ) -> Result<Arc<dyn CqOps>> {
        self.life.check(Verb::CreateCq)?;
        HwCq::create(self, cqe, context, channel, comp_vector).map(|cq| cq as Arc<dyn CqOps>)
    }

    /// Waits with poll(2) on the (non-blocking) async descriptor, then
    /// `ibv_get_async_event` + `ibv_ack_async_event`. QP events carry the QP
    /// number, CQ events the CQ's user context, SRQ events the SRQ's.
    ///
    /// DEVICE_FATAL is the last event: after it, this waits out the timeout
    /// and returns `Ok(None)`. A device that disappears (`EIO`) reports
    /// DEVICE_FATAL too. Under the subsystem, a DEVICE_FATAL from the
    /// kernel is held back until the removal's step 5.
    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let ctx = self.enter(Verb::GetAsyncEvent)?;
        loop {
            // Clear our wake-up before looking at the state, so that a
            // change made after the look wakes the wait below.
            self.wake.drain();
            match self.fatal.load(Ordering::Acquire) {
                FATAL_PENDING => {
                    if self
                        .fatal
                        .compare_exchange(FATAL_PENDING, FATAL_DELIVERED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return Ok(Some(DEVICE_FATAL));
                    }
                    continue;
                }
                FATAL_HELD if !self.holds_fatal() => {
                    let _ = self
                        .fatal
                        .compare_exchange(FATAL_HELD, FATAL_PENDING, Ordering::AcqRel, Ordering::Acquire);
                    continue;
                }
                _ => {}
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // With the kernel side detached (after DEVICE_FATAL) this only
            // waits for our own wake-up.
            let ready = self
                .wake
                .wait(left)
                .map_err(|e| ibv_error(Verb::GetAsyncEvent, "poll(async_fd)", e))?;
            if ready.kernel && self.fatal.load(Ordering::Acquire) == FATAL_NONE {
                match self.async_event(ctx.ptr()) {
                    Ok(Some(ev)) if ev.event_type == EventType::DeviceFatal => self.kernel_fatal(),
                    Ok(Some(ev)) => return Ok(Some(ev)),
                    // Another thread took the event: wait for the next one.
                    Ok(None) => {}
                    Err(None) => self.kernel_fatal(),
                    Err(Some(e)) => return Err(e),
                }
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// An epoll descriptor readable while an event is pending: the kernel's
    /// async descriptor joined with the backend's own (see `wake.rs`).
    fn async_fd(&self) -> Option<RawFd> {
        Some(self.wake.poll_fd())
    }
}

impl Member for HwContext {
    /// Nothing: the context's control verbs check the life themselves.
    fn revoke(&self, _life: &HwDeviceLife) {}

    /// DEVICE_FATAL: released if the kernel's was held back, raised
    /// otherwise (never twice).
    fn device_fatal(&self) {
        self.wake.detach_kernel();
        let mut s = self.fatal.load(Ordering::Acquire);
        while s == FATAL_NONE || s == FATAL_HELD {
            match self
                .fatal
                .compare_exchange(s, FATAL_PENDING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        self.wake.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{self, BackendKind};

    #[test]
    fn listing_devices_never_panics_and_explains_itself() {
        let p = provider_under_test();
        assert_eq!(p.kind(), BackendKind::Hardware);
        match p.devices() {
            Ok(devs) => {
                println!("{} RDMA device(s)", devs.len());
                for d in &devs {
                    assert_eq!(d.backend(), BackendKind::Hardware);
                    assert!(!d.name().is_empty());
                }
            }
            Err(e) => {
                println!("SKIP: no RDMA device ({e})");
                assert_eq!(e.verb(), Verb::GetDeviceList);
                assert!(!e.detail().is_empty());
            }
        }
        // With all backends, a failing hardware enumeration is not an error.
        assert!(verbs::devices(None).is_ok());
        // Asked for explicitly, the error (if any) comes back, one line.
        if let Err(e) = verbs::devices(Some(BackendKind::Hardware)) {
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }

    fn provider_under_test() -> Arc<dyn Provider> {
        super::super::provider()
    }

    #[test]
    fn open_query_and_async_poll() {
        super::super::tests::with_context("open_query_and_async_poll", |ctx| {
            let attr = ctx.query_device().expect("query_device");
            assert!(attr.phys_port_cnt >= 1);
            let port = ctx.query_port(1).expect("query_port");
            assert!(port.gid_tbl_len > 0 || port.link_layer == crate::verbs::LinkLayer::InfiniBand);
            let _ = ctx.query_gid(1, 0).expect("query_gid");
            let _ = ctx.query_pkey(1, 0).expect("query_pkey");
            assert!(ctx.query_port(attr.phys_port_cnt.saturating_add(1)).is_err());
            assert!(ctx.async_fd().is_some());
            assert!(ctx.get_async_event(Some(Duration::ZERO)).is_ok());
        });
    }
}
