//! The hardware backend of the CM: ids on hardware devices run on
//! librdmacm (through `rdma-sys`), because on a real NIC the kernel's
//! rdma_cm owns QP1.
//!
//! - [`HwCm`] (in `events`): one librdmacm event channel per [`Cm`](super::Cm), started
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
use std::ptr::{null_mut, NonNull};
use std::sync::Arc;

use rdma_sys::{ibv_qp_attr, rdma_cm_id, rdma_conn_param, rdma_event_channel};

use super::agent::{IdState, Inner, State};
use super::hwmap::{self};
use super::{ConnParam, Error, Result};
use crate::verbs::{Qp, QpAttr, QpAttrMask, QpState, QpType};

mod events;

pub(crate) use events::HwCm;

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

/// How long librdmacm may take to resolve an address or a route.
const RESOLVE_MS: i32 = 2000;

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
        super::agent::ud_init_to_rts(qp)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{Gid, Mtu};

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
