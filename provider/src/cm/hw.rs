//! The hardware backend of the CM: ids on hardware devices run on
//! librdmacm (through `rdma-sys`), because on a real NIC the kernel's
//! rdma_cm owns QP1.
//!
//! - [`HwCm`]: one librdmacm event channel per [`Cm`](super::Cm), started
//!   the first time an id goes to a hardware device, and one thread that
//!   reads it: each `rdma_cm_event` is copied, acknowledged at once (so
//!   `rdma_destroy_id` never waits for the application), then translated
//!   ([`super::hwmap`]) into a [`CmEvent`] with the id's namespace, device
//!   and generation, and queued on the id's [`EventChannel`](super::EventChannel) like a soft
//!   id's events.
//! - [`HwId`]: one `rdma_cm_id`, owned by the CM's id; its `context` is the
//!   id's number, which is how events find their id.
//! - The QP: created by the application through the ordinary verbs API on
//!   the context [`CmId::verbs`](super::CmId::verbs) gives (the subsystem's
//!   hardware device of the same name, so hotplug removal flushes it like
//!   any other QP), and moved through its states with the attributes
//!   `rdma_init_qp_attr` gives: INIT at creation (UD through to RTS),
//!   RTR/RTS at accept or on the REP (then `rdma_establish`), ERR at
//!   disconnect. `rdma_connect` and `rdma_accept` carry its number.
//!
//! Locking: librdmacm is never called with the CM's state lock held,
//! except `rdma_destroy_id` when an id is forgotten; that is safe because
//! the event thread acknowledges every event before it takes the lock, so
//! the wait inside `rdma_destroy_id` (for the id's unacknowledged events)
//! never waits for a thread that waits for the lock.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{JoinHandle, ThreadId};

use rdma_sys::{
    ibv_qp_attr, rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel, rdma_port_space, rdma_ud_param,
};

use super::agent::{qp_to_err, Id, IdState, Inner, State};
use super::hwmap::{self, Action};
use super::{CmEventKind, ConnParam, Error, PortSpace, Result, UdParam};
use crate::verbs::{AhAttr, Gid, GlobalRoute, Qp, QpAttr, QpAttrMask, QpState, QpType};

/// A librdmacm object pointer that may cross threads.
struct Ptr<T>(NonNull<T>);

// SAFETY: librdmacm's calls are thread safe; each pointer is dereferenced
// only under the ownership rules of its holder (HwChan, HwId).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as for Send; the pointer itself never changes.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    fn get(&self) -> *mut T {
        self.0.as_ptr()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// The error of a failed librdmacm call (-1 and `errno`).
fn cm_error(call: &'static str) -> Error {
    match errno() {
        libc::EADDRINUSE => Error::Io(std::io::ErrorKind::AddrInUse),
        libc::ENODEV | libc::ENXIO => Error::DeviceRemoved,
        libc::EINVAL => Error::InvalidArgument(call),
        libc::EOPNOTSUPP => Error::Unsupported(call),
        e => Error::Io(std::io::Error::from_raw_os_error(e).kind()),
    }
}

fn check(rc: i32, call: &'static str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(cm_error(call))
    }
}

/// librdmacm's event channel, destroyed after the last id on it.
struct HwChan(Ptr<rdma_event_channel>);

impl HwChan {
    fn fd(&self) -> i32 {
        // SAFETY: the channel is live while self is.
        unsafe { (*self.0.get()).fd }
    }
}

impl Drop for HwChan {
    fn drop(&mut self) {
        // SAFETY: every HwId holds an Arc of this channel, so no id is left
        // on it; the event thread, which holds one too, has ended.
        unsafe { rdma_sys::rdma_destroy_event_channel(self.0.get()) };
    }
}

/// One `rdma_cm_id`, destroyed (`rdma_destroy_id`) when dropped.
pub(crate) struct HwId {
    id: Ptr<rdma_cm_id>,
    _chan: Arc<HwChan>,
}

impl std::fmt::Debug for HwId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwId").field("id", &self.id.get()).finish()
    }
}

impl Drop for HwId {
    fn drop(&mut self) {
        // SAFETY: the id is ours; its QP (if any) is the application's,
        // created outside librdmacm, so the id's `qp` field is NULL.
        unsafe { rdma_sys::rdma_destroy_id(self.id.get()) };
    }
}

/// A socket address as C wants it.
fn to_sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data, valid when zeroed.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for any
            // sockaddr.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address in a `sockaddr_storage`, if it is IPv4 or IPv6 and set.
pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read((ss as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 = unsafe { std::ptr::read((ss as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// What an `rdma_cm_id` says about itself: its device's name and its
/// addresses.
#[derive(Debug, Clone, Default)]
struct IdInfo {
    device: Option<String>,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
}

/// Reads `id`'s device and addresses.
///
/// # Safety
///
/// `id` must be a live `rdma_cm_id` nobody destroys during the call.
unsafe fn id_info(id: *mut rdma_cm_id) -> IdInfo {
    // SAFETY: the caller guarantees `id` is live; `verbs` is NULL or a
    // context librdmacm keeps open while the id exists.
    unsafe {
        let verbs = (*id).verbs;
        let device = if verbs.is_null() || (*verbs).device.is_null() {
            None
        } else {
            let name = rdma_sys::ibv_get_device_name((*verbs).device);
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
        };
        let addr = &(*id).route.addr;
        IdInfo {
            device,
            src: from_sockaddr(&addr.src_addr_union.src_storage),
            dst: from_sockaddr(&addr.dst_addr_union.dst_storage),
        }
    }
}

impl HwId {
    fn raw(&self) -> *mut rdma_cm_id {
        self.id.get()
    }

    fn info(&self) -> IdInfo {
        // SAFETY: the id lives as long as self.
        unsafe { id_info(self.raw()) }
    }

    fn set_key(&self, key: u64) {
        // SAFETY: `context` is the application's field of the id; the
        // event thread reads it only from events, which copy it at
        // creation of the event, and events of a new id come only after
        // its number is set (before accept/reject).
        unsafe { (*self.raw()).context = key as usize as *mut libc::c_void };
    }

    fn bind(&self, addr: SocketAddr) -> Result<()> {
        let (mut ss, _) = to_sockaddr(addr);
        // SAFETY: live id; the address is a valid sockaddr for the call.
        check(
            unsafe { rdma_sys::rdma_bind_addr(self.raw(), (&mut ss as *mut libc::sockaddr_storage).cast()) },
            "rdma_bind_addr",
        )
    }

    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, timeout_ms: i32) -> Result<()> {
        let mut s = src.map(|a| to_sockaddr(a).0);
        let (mut d, _) = to_sockaddr(dst);
        let sp = s
            .as_mut()
            .map_or(null_mut(), |s| (s as *mut libc::sockaddr_storage).cast());
        // SAFETY: live id; both addresses live for the call.
        check(
            unsafe {
                rdma_sys::rdma_resolve_addr(
                    self.raw(),
                    sp,
                    (&mut d as *mut libc::sockaddr_storage).cast(),
                    timeout_ms,
                )
            },
            "rdma_resolve_addr",
        )
    }

    fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        // SAFETY: live id.
        check(
            unsafe { rdma_sys::rdma_resolve_route(self.raw(), timeout_ms) },
            "rdma_resolve_route",
        )
    }

    fn listen(&self, backlog: u32) -> Result<()> {
        // SAFETY: live id.
        check(
            unsafe { rdma_sys::rdma_listen(self.raw(), backlog.min(i32::MAX as u32) as i32) },
            "rdma_listen",
        )
    }

    fn conn_param(p: &ConnParam, qp_num: u32) -> rdma_conn_param {
        rdma_conn_param {
            private_data: if p.private_data.is_empty() {
                std::ptr::null()
            } else {
                p.private_data.as_ptr().cast()
            },
            private_data_len: p.private_data.len().min(255) as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 1,
            retry_count: p.retry_count.min(7),
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq as u8,
            qp_num,
        }
    }

    fn connect(&self, p: &ConnParam, qp_num: u32) -> Result<()> {
        let mut cp = Self::conn_param(p, qp_num);
        // SAFETY: live id; `cp` and the private data it points to live for
        // the call (librdmacm copies them).
        check(unsafe { rdma_sys::rdma_connect(self.raw(), &mut cp) }, "rdma_connect")
    }

    fn accept(&self, p: &ConnParam, qp_num: u32) -> Result<()> {
        let mut cp = Self::conn_param(p, qp_num);
        // SAFETY: as for connect.
        check(unsafe { rdma_sys::rdma_accept(self.raw(), &mut cp) }, "rdma_accept")
    }

    fn reject(&self, pd: &[u8]) -> Result<()> {
        let ptr = if pd.is_empty() {
            std::ptr::null()
        } else {
            pd.as_ptr().cast()
        };
        // SAFETY: live id; the private data lives for the call.
        check(
            unsafe { rdma_sys::rdma_reject(self.raw(), ptr, pd.len().min(255) as u8) },
            "rdma_reject",
        )
    }

    fn establish(&self) -> Result<()> {
        // SAFETY: live id.
        check(unsafe { rdma_sys::rdma_establish(self.raw()) }, "rdma_establish")
    }

    fn disconnect(&self) -> Result<()> {
        // SAFETY: live id.
        check(unsafe { rdma_sys::rdma_disconnect(self.raw()) }, "rdma_disconnect")
    }

    /// `rdma_init_qp_attr` for `state`: what a QP of this id needs there.
    fn qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        // SAFETY: ibv_qp_attr is plain old data, valid when zeroed.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state.as_raw();
        let mut mask: i32 = 0;
        // SAFETY: live id; `a` and `mask` are live outputs.
        let rc = unsafe { rdma_sys::rdma_init_qp_attr(self.raw(), &mut a, &mut mask) };
        check(rc, "rdma_init_qp_attr")?;
        let attr = crate::hw::convert::qp_attr_from_raw(&a)?;
        Ok((attr, hwmap::qp_mask(mask)))
    }

    /// Moves `qp` to `state` with the attributes librdmacm gives.
    fn move_qp(&self, qp: &Qp, state: QpState) -> Result<()> {
        let (attr, mask) = self.qp_attr(state)?;
        qp.modify(&attr, mask | QpAttrMask::STATE)?;
        Ok(())
    }
}

/// One CM's librdmacm event channel and the thread reading it.
pub(crate) struct HwCm {
    chan: Arc<HwChan>,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Option<ThreadId>,
}

impl std::fmt::Debug for HwCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwCm").field("fd", &self.chan.fd()).finish()
    }
}

impl Drop for HwCm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        wake(&self.wake);
        let h = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            if self.thread_id != Some(std::thread::current().id()) {
                let _ = h.join();
            }
        }
    }
}

fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// How long librdmacm may take to resolve an address or a route.
const RESOLVE_MS: i32 = 2000;

impl HwCm {
    /// Opens librdmacm's event channel and starts the thread reading it.
    fn start(inner: Weak<Inner>) -> Result<Arc<HwCm>> {
        // SAFETY: no arguments; NULL with errno on failure.
        let ch = unsafe { rdma_sys::rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(|| cm_error("rdma_create_event_channel"))?;
        let chan = Arc::new(HwChan(Ptr(ch)));
        let fd = chan.fd();
        // SAFETY: fcntl on the channel's own descriptor.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let wake = Arc::new(crate::sys::eventfd(libc::EFD_NONBLOCK).map_err(|e| Error::Io(e.kind()))?);
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, w) = (chan.clone(), stop.clone(), wake.clone());
        let thread = std::thread::Builder::new()
            .name("softverbs-cm-hw".into())
            .spawn(move || run(inner, c, s, w))
            .map_err(|e| Error::Io(e.kind()))?;
        Ok(Arc::new(HwCm {
            chan,
            stop,
            wake,
            thread_id: Some(thread.thread().id()),
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// A new `rdma_cm_id` for the CM's id `key`.
    fn create_id(&self, key: u64, ps: PortSpace) -> Result<Arc<HwId>> {
        let mut id: *mut rdma_cm_id = null_mut();
        let ps = match ps {
            PortSpace::Tcp => rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => rdma_port_space::RDMA_PS_UDP,
        };
        let ctx = key as usize as *mut libc::c_void;
        // SAFETY: live channel; `id` is a live output.
        let rc = unsafe { rdma_sys::rdma_create_id(self.chan.0.get(), &mut id, ctx, ps) };
        check(rc, "rdma_create_id")?;
        let id = NonNull::new(id).ok_or(Error::Io(std::io::ErrorKind::Other))?;
        Ok(Arc::new(HwId {
            id: Ptr(id),
            _chan: self.chan.clone(),
        }))
    }
}

/// The CM's librdmacm channel, started on first use.
fn hw_cm(inner: &Arc<Inner>) -> Result<Arc<HwCm>> {
    let mut slot = inner.hw.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = &*slot {
        return Ok(h.clone());
    }
    let h = HwCm::start(Arc::downgrade(inner))?;
    *slot = Some(h.clone());
    Ok(h)
}

/// Whether the subsystem has a hardware device visible from `ns`: only
/// then do ids go to librdmacm.
pub(crate) fn has_hw(st: &State, ns: crate::subsystem::NamespaceId, shared_mode: bool) -> bool {
    st.hw_devices.values().any(|d| shared_mode || d.namespace() == ns)
}

/// The id's librdmacm id, if it has one.
pub(crate) fn hw_of(st: &State, key: u64) -> Option<Arc<HwId>> {
    st.ids.get(&key)?.hw.clone()
}

/// The subsystem's hardware device `name`, as `(name, generation)`.
fn dev_named(st: &State, name: &Option<String>) -> Option<(String, crate::subsystem::Generation)> {
    let d = st.hw_devices.get(name.as_ref()?)?;
    Some((d.name().to_string(), d.generation()))
}

fn ensure_hw(inner: &Arc<Inner>, key: u64) -> Result<Arc<HwId>> {
    let (existing, ps) = {
        let st = inner.lock();
        let id = st.ids.get(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
        (id.hw.clone(), id.ps)
    };
    if let Some(h) = existing {
        return Ok(h);
    }
    let h = hw_cm(inner)?.create_id(key, ps)?;
    let mut st = inner.lock();
    let id = st.ids.get_mut(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
    id.hw = Some(h.clone());
    Ok(h)
}

/// `bind_addr` of an id going to a hardware device.
pub(crate) fn bind_addr(inner: &Arc<Inner>, key: u64, addr: SocketAddr) -> Result<()> {
    let h = ensure_hw(inner, key)?;
    h.bind(addr).map_err(|e| match e {
        Error::Io(std::io::ErrorKind::AddrInUse) => Error::AddrInUse(addr),
        Error::Io(std::io::ErrorKind::AddrNotAvailable) => Error::NoDevice(addr.ip()),
        Error::InvalidArgument(_) if !addr.ip().is_unspecified() => Error::NoDevice(addr.ip()),
        e => e,
    })?;
    let info = h.info();
    let mut st = inner.lock();
    let dev = dev_named(&st, &info.device);
    let id = st.ids.get_mut(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
    id.src = info.src.or(Some(addr));
    id.dev = dev;
    id.state = IdState::AddrBound;
    Ok(())
}

/// `resolve_addr` of an id going to a hardware device; `AddrResolved`
/// (or `Unreachable`) follows from the event thread.
pub(crate) fn resolve_addr(inner: &Arc<Inner>, key: u64, src: Option<IpAddr>, dst: SocketAddr) -> Result<()> {
    let (fresh, bound) = {
        let st = inner.lock();
        let id = st.ids.get(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
        (id.hw.is_none(), id.src)
    };
    let h = ensure_hw(inner, key)?;
    // An id librdmacm bound keeps its binding (the kernel ignores a source
    // then); one bound only here (a wildcard `bind_addr`) takes its port
    // along to librdmacm.
    let port = if fresh { bound.map_or(0, |b| b.port()) } else { 0 };
    let any = if dst.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let src_sa = match (src, port) {
        (Some(ip), p) => Some(SocketAddr::new(ip, p)),
        (None, 0) => None,
        (None, p) => Some(SocketAddr::new(any, p)),
    };
    {
        let mut st = inner.lock();
        let id = st.ids.get_mut(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
        id.dst = Some(dst);
        id.peer = Some(dst.ip());
    }
    h.resolve_addr(src_sa, dst, RESOLVE_MS).map_err(|e| match e {
        Error::InvalidArgument(_) => Error::NoDevice(src.unwrap_or(dst.ip())),
        e => e,
    })
}

/// `resolve_route` on librdmacm; `RouteResolved` follows.
pub(crate) fn resolve_route(h: &HwId) -> Result<()> {
    h.resolve_route(RESOLVE_MS)
}

/// `listen` on librdmacm: the id's own address (a hardware device's), or,
/// for a wildcard soft listener in a namespace with hardware devices,
/// the same wildcard address and port (the kernel then listens on every
/// RDMA device, present and future).
pub(crate) fn listen(inner: &Arc<Inner>, key: u64, backlog: u32) -> Result<()> {
    let (h, src) = {
        let st = inner.lock();
        let id = st.ids.get(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
        (id.hw.clone(), id.src)
    };
    let h = match h {
        Some(h) => h,
        None => {
            let h = ensure_hw(inner, key)?;
            let addr = src.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
            if let Err(e) = h.bind(addr) {
                if let Some(id) = inner.lock().ids.get_mut(&key) {
                    id.hw = None;
                }
                return Err(match e {
                    Error::Io(std::io::ErrorKind::AddrInUse) => Error::AddrInUse(addr),
                    e => e,
                });
            }
            h
        }
    };
    h.listen(backlog)
}

/// Moves a new QP of a hardware id to INIT (UD: to RTS), as librdmacm's
/// `rdma_create_qp` does.
pub(crate) fn init_qp(h: &HwId, qp: &Qp) -> Result<()> {
    h.move_qp(qp, QpState::Init)?;
    if qp.qp_type() == QpType::Ud {
        qp.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )?;
        qp.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                sq_psn: 0,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        )?;
    }
    Ok(())
}

fn set_state(inner: &Inner, key: u64, s: IdState) {
    if let Some(id) = inner.lock().ids.get_mut(&key) {
        id.state = s;
    }
}

/// `connect` on librdmacm with the id's QP's number (or `param.qp_num`).
pub(crate) fn connect(inner: &Inner, key: u64, h: &HwId, param: &ConnParam, qpn: u32, udp: bool) -> Result<()> {
    set_state(inner, key, if udp { IdState::SidrReqSent } else { IdState::ReqSent });
    let r = h.connect(param, qpn);
    if r.is_err() {
        set_state(inner, key, IdState::RouteResolved);
    }
    r
}

/// `accept` on librdmacm: the QP to RTR and RTS first (TCP), then the REP
/// (or SIDR_REP) with its number.
pub(crate) fn accept(inner: &Inner, key: u64, h: &HwId, qp: &Qp, param: &ConnParam, udp: bool) -> Result<()> {
    if !udp {
        if let Err(e) = h.move_qp(qp, QpState::Rtr).and_then(|_| h.move_qp(qp, QpState::Rts)) {
            let _ = qp.modify(
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            );
            let _ = h.reject(&[]);
            set_state(inner, key, IdState::Done);
            return Err(e);
        }
    }
    set_state(inner, key, if udp { IdState::Established } else { IdState::RepSent });
    h.accept(param, qp.qp_num())
}

/// `reject` on librdmacm.
pub(crate) fn reject(inner: &Inner, key: u64, h: &HwId, pd: &[u8]) -> Result<()> {
    h.reject(pd)?;
    set_state(inner, key, IdState::Done);
    Ok(())
}

/// `establish` after `ConnectResponse`: the QP (if the id has one now) to
/// RTR and RTS, then the RTU.
pub(crate) fn establish(inner: &Inner, key: u64, h: &HwId, qp: Option<&Qp>) -> Result<()> {
    if let Some(qp) = qp {
        h.move_qp(qp, QpState::Rtr)?;
        h.move_qp(qp, QpState::Rts)?;
    }
    h.establish()?;
    set_state(inner, key, IdState::Established);
    Ok(())
}

/// `rdma_init_qp_attr` for the application's own QP.
pub(crate) fn init_qp_attr(h: &HwId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
    let (attr, mask) = h.qp_attr(state)?;
    Ok((attr, mask | QpAttrMask::STATE))
}

/// `disconnect` on librdmacm (the QP went to ERR already).
pub(crate) fn disconnect(h: &HwId) -> Result<()> {
    h.disconnect()
}

/// One event, copied out of librdmacm before it is acknowledged.
struct RawEvent {
    event: u32,
    status: i32,
    /// The id's number (its `context`).
    key: u64,
    /// `CONNECT_REQUEST`: the new `rdma_cm_id`, now ours.
    new_id: Option<Ptr<rdma_cm_id>>,
    info: IdInfo,
    udp: bool,
    private_data: Vec<u8>,
    conn: Option<ConnParam>,
    ud: Option<UdParam>,
}

/// Copies what `ev` says.
///
/// # Safety
///
/// `ev` must be an event from `rdma_get_cm_event`, not yet acknowledged.
unsafe fn copy_event(ev: *mut rdma_cm_event) -> RawEvent {
    // SAFETY: the caller guarantees a live event; its ids live until it is
    // acknowledged; the union member read is the one librdmacm fills for
    // the id's port space; private data is `private_data_len` bytes.
    unsafe {
        let e = &*ev;
        let id = e.id;
        let udp = !id.is_null() && (*id).ps == rdma_port_space::RDMA_PS_UDP;
        let (pd_ptr, pd_len) = if udp {
            (e.param.ud.private_data, e.param.ud.private_data_len)
        } else {
            (e.param.conn.private_data, e.param.conn.private_data_len)
        };
        let private_data = if pd_ptr.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(pd_ptr.cast::<u8>(), pd_len as usize).to_vec()
        };
        let event = e.event;
        // A new id's context is its listener's until we set ours.
        let key_of = |p: *mut rdma_cm_id| if p.is_null() { 0 } else { (*p).context as usize as u64 };
        let (key, new_id) = if event == hwmap::CONNECT_REQUEST {
            (key_of(e.listen_id), NonNull::new(id).map(Ptr))
        } else {
            (key_of(id), None)
        };
        let conn = (!udp).then(|| {
            let c = &e.param.conn;
            ConnParam {
                private_data: Vec::new(),
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                qp_num: c.qp_num,
                srq: c.srq != 0,
            }
        });
        let ud = udp.then(|| ud_param(&e.param.ud));
        RawEvent {
            event,
            status: e.status,
            key,
            new_id,
            info: if id.is_null() { IdInfo::default() } else { id_info(id) },
            udp,
            private_data,
            conn,
            ud,
        }
    }
}

fn ud_param(u: &rdma_ud_param) -> UdParam {
    let h = &u.ah_attr;
    UdParam {
        qp_num: u.qp_num,
        qkey: u.qkey,
        ah_attr: AhAttr {
            grh: GlobalRoute {
                // SAFETY: every bit pattern of the union is a valid array.
                dgid: Gid(unsafe { h.grh.dgid.raw }),
                flow_label: h.grh.flow_label,
                sgid_index: h.grh.sgid_index,
                hop_limit: h.grh.hop_limit,
                traffic_class: h.grh.traffic_class,
            },
            dlid: h.dlid,
            sl: h.sl,
            src_path_bits: h.src_path_bits,
            static_rate: h.static_rate,
            is_global: h.is_global != 0,
            port_num: h.port_num,
        },
    }
}

/// The event thread: waits on the channel and the wake-up descriptor,
/// takes every queued event, copies and acknowledges it, then hands it to
/// the CM.
fn run(inner: Weak<Inner>, chan: Arc<HwChan>, stop: Arc<AtomicBool>, wakefd: Arc<OwnedFd>) {
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [
            libc::pollfd {
                fd: chan.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wakefd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: a live array of two pollfds. The bounded wait re-checks
        // `stop` even if a wake-up is lost.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, 500) };
        if fds[1].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
            unsafe { libc::read(wakefd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
        loop {
            let mut ev: *mut rdma_cm_event = null_mut();
            // SAFETY: live channel (non-blocking); `ev` is a live output.
            if unsafe { rdma_sys::rdma_get_cm_event(chan.0.get(), &mut ev) } != 0 || ev.is_null() {
                break;
            }
            // SAFETY: `ev` came from rdma_get_cm_event and is acknowledged
            // right after it is copied.
            let raw = unsafe { copy_event(ev) };
            // SAFETY: as above; acknowledged once.
            unsafe { rdma_sys::rdma_ack_cm_event(ev) };
            match inner.upgrade() {
                Some(i) => handle(&i, raw),
                None => drop_raw(raw),
            }
        }
    }
}

/// An event nobody takes: a new id from a request is refused and destroyed.
fn drop_raw(raw: RawEvent) {
    if let Some(p) = raw.new_id {
        // SAFETY: the new id is ours since its event; reject then destroy
        // it once.
        unsafe {
            rdma_sys::rdma_reject(p.get(), std::ptr::null(), 0);
            rdma_sys::rdma_destroy_id(p.get());
        }
    }
}

/// Applies one event to the CM ([`hwmap::action`]).
fn handle(inner: &Arc<Inner>, raw: RawEvent) {
    let mut st = inner.lock();
    let Some(id) = st.ids.get(&raw.key) else {
        st.counters.rx_dropped += 1;
        drop(st);
        return drop_raw(raw);
    };
    if id.destroyed || (id.removed && raw.new_id.is_some()) {
        drop(st);
        return drop_raw(raw);
    }
    let action = hwmap::action(raw.event, id.state, id.qp.is_some(), raw.udp);
    match action {
        Action::Drop => st.counters.rx_dropped += 1,
        // A wildcard listener is bound to no device and never sees a
        // device's removal (librdmacm may still report it there).
        Action::Removal if id.dev.is_none() && id.state == IdState::Listen => st.counters.rx_dropped += 1,
        Action::Removal => super::agent::Inner::remove_one(&mut st, raw.key),
        Action::NewRequest => new_request(inner, st, raw),
        Action::Deliver { kind, next } => {
            let removed = id.removed;
            if removed {
                // After DEVICE_REMOVAL only destroy is left.
                return;
            }
            let dev = dev_named(&st, &raw.info.device);
            let id = st.ids.get_mut(&raw.key).expect("looked up");
            if let Some(n) = next {
                id.state = n;
            }
            if kind == CmEventKind::AddrResolved {
                id.src = raw.info.src.or(id.src);
                id.dev = dev;
            }
            if kind == CmEventKind::Established && raw.udp {
                if let Some(u) = raw.ud {
                    id.remote_qpn = u.qp_num;
                    id.remote_qkey = u.qkey;
                }
            }
            if let Some(c) = &raw.conn {
                if matches!(kind, CmEventKind::ConnectResponse | CmEventKind::Established) && c.qp_num != 0 {
                    id.remote_qpn = c.qp_num;
                }
            }
            if kind == CmEventKind::Disconnected {
                qp_to_err(id);
            }
            deliver(&st, raw.key, kind, raw.status, raw.private_data, raw.conn, raw.ud);
        }
        Action::EstablishQp => {
            let (h, qp) = (id.hw.clone(), id.qp.clone());
            drop(st);
            let r = match (&h, &qp) {
                (Some(h), Some(qp)) => h
                    .move_qp(qp, QpState::Rtr)
                    .and_then(|_| h.move_qp(qp, QpState::Rts))
                    .and_then(|_| h.establish()),
                _ => Err(Error::InvalidArgument("no QP")),
            };
            if r.is_err() {
                // As librdmacm does when it cannot move the QP: refuse the
                // connection and report CONNECT_ERROR.
                if let Some(h) = &h {
                    let _ = h.reject(&[]);
                }
            }
            let mut st = inner.lock();
            let Some(id) = st.ids.get_mut(&raw.key) else { return };
            if id.removed || id.destroyed {
                return;
            }
            let kind = if r.is_ok() {
                if let Some(c) = &raw.conn {
                    id.remote_qpn = c.qp_num;
                }
                id.state = IdState::Established;
                CmEventKind::Established
            } else {
                qp_to_err(id);
                id.state = IdState::Done;
                CmEventKind::ConnectError
            };
            let status = match &r {
                Ok(()) => raw.status,
                Err(e) => -e.errno(),
            };
            deliver(&st, raw.key, kind, status, raw.private_data, raw.conn, raw.ud);
        }
    }
}

fn deliver(
    st: &State,
    key: u64,
    kind: CmEventKind,
    status: i32,
    private_data: Vec<u8>,
    conn: Option<ConnParam>,
    ud: Option<UdParam>,
) {
    if let Some(mut ev) = st.event(key, kind) {
        ev.status = status;
        ev.private_data = private_data;
        ev.conn = conn;
        ev.ud = ud;
        st.post(key, ev);
    }
}

/// A request on a listener: a new id, owned by the CM, delivered with
/// `ConnectRequest` on the listener's channel.
fn new_request(inner: &Arc<Inner>, mut st: std::sync::MutexGuard<'_, State>, raw: RawEvent) {
    let Some(p) = raw.new_id else { return };
    let Some(owner) = inner.owner.get().cloned() else {
        drop(st);
        return drop_raw(RawEvent { new_id: Some(p), ..raw });
    };
    let chan = match st.hw_chan_of(raw.key) {
        Some(c) => c,
        None => {
            drop(st);
            return drop_raw(RawEvent { new_id: Some(p), ..raw });
        }
    };
    let lkey = raw.key;
    let l = &st.ids[&lkey];
    // librdmacm listens in the process's network namespace, on every
    // device: a request that came through a device the listener's
    // namespace does not see (it was moved to another) is not its.
    let foreign = raw
        .info
        .device
        .as_ref()
        .and_then(|n| st.hw_devices.get(n))
        .is_some_and(|d| inner.sub.mode() != crate::subsystem::NetnsMode::Shared && d.namespace() != l.ns.id());
    if foreign {
        st.counters.rx_dropped += 1;
        drop(st);
        return drop_raw(RawEvent { new_id: Some(p), ..raw });
    }
    let mut id = Id::new(l.ns.clone(), l.chan.clone(), l.ps, l.context);
    id.listener = Some(lkey);
    id.state = hwmap::request_state(raw.udp);
    id.src = raw.info.src;
    id.dst = raw.info.dst;
    id.peer = raw.info.dst.map(|d| d.ip());
    id.dev = dev_named(&st, &raw.info.device);
    if let Some(c) = &raw.conn {
        id.param = c.clone();
        id.remote_qpn = c.qp_num;
    }
    let h = Arc::new(HwId { id: p, _chan: chan });
    let key = st.next_key;
    st.next_key += 1;
    h.set_key(key);
    id.hw = Some(h);
    st.ids.insert(key, id);
    if let Some(mut ev) = st.event(key, CmEventKind::ConnectRequest) {
        ev.status = raw.status;
        ev.private_data = raw.private_data;
        ev.conn = raw.conn;
        ev.ud = raw.ud;
        ev.new_id = Some((key, owner));
        st.post(key, ev);
    }
}

impl State {
    /// The librdmacm channel the listener `key` is on.
    fn hw_chan_of(&self, key: u64) -> Option<Arc<HwChan>> {
        self.ids.get(&key)?.hw.as_ref().map(|h| h._chan.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Mtu;

    #[test]
    fn socket_addresses_round_trip() {
        for a in ["10.1.2.3:4791", "[fe80::1]:18515", "0.0.0.0:0", "[::]:7471"] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, len) = to_sockaddr(a);
            assert!(len as usize <= std::mem::size_of::<libc::sockaddr_storage>());
            assert_eq!(from_sockaddr(&ss), Some(a));
        }
        // SAFETY: plain old data.
        let ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_sockaddr(&ss), None, "AF_UNSPEC is no address");
    }

    #[test]
    fn init_qp_attr_output_converts() {
        // SAFETY: plain old data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = 2;
        a.path_mtu = 5;
        a.dest_qp_num = 0x1234;
        a.rq_psn = 0xabcdef;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.sgid_index = 3;
        a.ah_attr.grh.dgid.raw = Gid::from_ip("10.0.0.2".parse().unwrap()).0;
        let q = crate::hw::convert::qp_attr_from_raw(&a).unwrap();
        assert_eq!(q.qp_state, QpState::Rtr);
        assert_eq!(q.path_mtu, Mtu::Mtu4096);
        assert_eq!((q.dest_qp_num, q.rq_psn), (0x1234, 0xabcdef));
        assert_eq!((q.max_dest_rd_atomic, q.min_rnr_timer), (4, 12));
        assert!(q.ah_attr.is_global);
        assert_eq!(q.ah_attr.grh.dgid.to_ip(), "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((q.ah_attr.grh.sgid_index, q.ah_attr.grh.hop_limit), (3, 64));
        // A state number from a newer verbs.h is an error, not UB.
        a.qp_state = 99;
        assert!(crate::hw::convert::qp_attr_from_raw(&a).is_err());
    }
}
