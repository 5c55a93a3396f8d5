//! The provider (`ibv_get_device_list`), devices (`struct ibv_device`) and
//! open contexts (`struct ibv_context`), with their async events.

use std::ffi::CStr;
use std::os::fd::RawFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_context, ibv_device, ibv_device_attr, ibv_gid, ibv_port_attr};

use super::convert::{self, EventSubject};
use super::ffi::{self, zeroed, RawAsyncEvent, SendPtr};
use super::lifecycle::IbvObject;
use super::objects::HwPd;
use super::queue::{CqEvents, HwCompChannel, HwCq};
use super::{check, ibv_error};
use crate::verbs::backend::*;
use crate::verbs::{verr, AsyncEvent, BackendKind, DeviceAttr, Error, ErrorKind, Gid, Guid, PortAttr, Result, Verb};

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
        let list = DeviceList::get()?;
        let list = Arc::new(list);
        let mut out: Vec<Arc<dyn DeviceOps>> = Vec::with_capacity(list.len);
        for index in 0..list.len {
            out.push(Arc::new(HwDevice::new(list.clone(), index)));
        }
        Ok(out)
    }
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
    guid: Guid,
}

impl HwDevice {
    fn new(list: Arc<DeviceList>, index: usize) -> HwDevice {
        let dev = list.device(index);
        // SAFETY: dev is a valid device while the list is alive; the name
        // is a NUL-terminated string inside the device.
        let name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above; the GUID is read from sysfs, big-endian.
        let guid = convert::guid_from_raw(unsafe { rdma_sys::ibv_get_device_guid(dev) });
        HwDevice {
            list,
            index,
            name,
            guid,
        }
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

    /// `ibv_open_device`; the context's async event descriptor is made
    /// non-blocking so that [`ContextOps::get_async_event`] can wait with a
    /// timeout.
    fn open(&self) -> Result<Arc<dyn ContextOps>> {
        let dev = self.list.device(self.index);
        ffi::clear_errno();
        // SAFETY: dev is valid while the list lives (we hold it).
        let raw = unsafe { rdma_sys::ibv_open_device(dev) };
        let ptr = SendPtr::new(raw)
            .ok_or_else(|| ibv_error(Verb::OpenDevice, "ibv_open_device", ffi::errno_or(libc::ENODEV)))?;
        // SAFETY: the context is open; async_fd is set once by libibverbs.
        let async_fd = unsafe { (*raw).async_fd };
        // SAFETY: ptr is a freshly opened context only HwContext closes.
        let ctx = unsafe { IbvObject::new(ptr, "device context") };
        let context = Arc::new_cyclic(|this| HwContext {
            this: this.clone(),
            ctx,
            async_fd,
            name: self.name.clone(),
            _list: self.list.clone(),
        });
        match ffi::set_nonblocking(async_fd) {
            0 => Ok(context),
            e => Err(ibv_error(Verb::OpenDevice, "fcntl(async_fd, O_NONBLOCK)", e)),
        }
    }
}

/// An open device (`struct ibv_context`), closed when the last object
/// using it is gone.
pub struct HwContext {
    this: Weak<HwContext>,
    ctx: IbvObject<ibv_context>,
    async_fd: RawFd,
    name: String,
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

    /// Enters the context for a call of `verb` (a context is only freed by
    /// its drop, so this never fails while `&self` exists).
    fn enter(&self, verb: Verb) -> Result<super::lifecycle::Entered<'_, ibv_context>> {
        self.ctx.enter(verb)
    }

    fn async_event(&self, ctx: *mut ibv_context) -> std::result::Result<Option<AsyncEvent>, Error> {
        let mut ev: RawAsyncEvent = zeroed();
        ffi::clear_errno();
        // SAFETY: ctx is open (caller holds it entered); ev has the layout
        // of struct ibv_async_event (checked in ffi tests).
        let rc = unsafe { rdma_sys::ibv_get_async_event(ctx, (&mut ev as *mut RawAsyncEvent).cast()) };
        if rc != 0 {
            return match ffi::errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                e => Err(ibv_error(Verb::GetAsyncEvent, "ibv_get_async_event", e)),
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
            None => Err(verr!(
                GetAsyncEvent,
                Io,
                "the device reported async event type {}, unknown to this API (acknowledged)",
                ev.event_type
            )),
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
        let ctx = self.enter(Verb::QueryDevice)?;
        let mut attr: ibv_device_attr = zeroed();
        // SAFETY: open context, valid out-parameter.
        let rc = unsafe { rdma_sys::ibv_query_device(ctx.ptr(), &mut attr) };
        check(Verb::QueryDevice, "ibv_query_device", rc)?;
        Ok(convert::device_attr_from_raw(&attr))
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let ctx = self.enter(Verb::QueryPort)?;
        let mut attr: ibv_port_attr = zeroed();
        // SAFETY: open context, valid out-parameter.
        let rc = unsafe { ffi::query_port(ctx.ptr(), port, &mut attr) };
        check(Verb::QueryPort, "ibv_query_port", rc)?;
        convert::port_attr_from_raw(&attr)
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
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
        HwCq::create(self, cqe, context, channel, comp_vector).map(|cq| cq as Arc<dyn CqOps>)
    }

    /// Waits with poll(2) on the (non-blocking) async descriptor, then
    /// `ibv_get_async_event` + `ibv_ack_async_event`. QP events carry the QP
    /// number, CQ events the CQ's user context, SRQ events the SRQ's.
    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let ctx = self.enter(Verb::GetAsyncEvent)?;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let ready = ffi::wait_readable(self.async_fd, left)
                .map_err(|e| ibv_error(Verb::GetAsyncEvent, "poll(async_fd)", e))?;
            if ready {
                if let Some(event) = self.async_event(ctx.ptr())? {
                    return Ok(Some(event));
                }
                // Another thread took the event: wait for the next one.
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    fn async_fd(&self) -> Option<RawFd> {
        Some(self.async_fd)
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
