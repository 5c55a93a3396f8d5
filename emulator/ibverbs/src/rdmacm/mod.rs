//! rdma_cm for C programs: the `rdma_*` calls of rdma-core's librdmacm,
//! implemented here (inside the library that owns the devices and the
//! verbs objects) over the soft provider's connection manager
//! ([`softverbs::cm`]: IBTA CM MADs on QP1 between soft devices).
//!
//! The functions are exported under private names (`__softverbs_rdma_*`);
//! the drop-in `librdmacm.so.1` (crate `softverbs-rdmacm`) gives them
//! rdma-core's names and symbol versions and forwards to them. They live
//! in this library because an id's `verbs`, `pd`, `qp` and CQs must be
//! this library's own objects: a second library would have its own
//! devices.
//!
//! What an id holds is what librdmacm gives: `verbs` is one context per
//! device opened by this module (shared by every id on the device, as
//! librdmacm does), `pd` that context's shared PD unless the application
//! gives one, `rdma_create_qp` creates the QP (and the CQs and completion
//! channels it is not given) with the ordinary verbs and lets the
//! connection manager move it: INIT at creation (UD: through to RTS with
//! rdma_cm's Q_Key), RTR and RTS at accept or on the REP, ERR at
//! disconnect. Ids created without an event channel are synchronous, as
//! with librdmacm (`rdma_create_ep`, `rdma_get_request`): each call waits
//! for its own event. The event channel's descriptor is readable while an
//! event is queued (`poll`/`epoll`); with `O_NONBLOCK` set on it,
//! `rdma_get_cm_event` fails with `EAGAIN` when none is.
//!
//! Files: this one holds the ids and the `rdma_*` entry points; `events`
//! translates the connection manager's events into `rdma_cm_event`s and
//! keeps the event channels; `global` is the process's connection manager
//! and what the library tells it of its device; `ep` and `qp` are the
//! endpoint (`rdma_create_ep`, ...) and QP calls.
//!
//! Not supported (-1 with `errno` `EOPNOTSUPP`): multicast, ECE, the IB
//! port spaces (`RDMA_PS_IB`, `RDMA_PS_IPOIB`) and `AF_IB` addresses,
//! SRQs made by the CM (`rdma_create_srq`); the
//! route options of `rdma_set_option` (the id options are accepted and
//! have no effect on soft devices).

mod events;
pub mod ffi;
mod global;

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::raw::{c_char, c_int};
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};

use softverbs::cm::{CmId, ConnParam, EventChannel, PortSpace};
use softverbs::verbs::Gid;

use self::ffi::*;
use crate::ffi::*;
use crate::objects::{free_raw, into_raw, set_errno, SvQp};

use self::events::*;
pub(crate) use self::global::device_removed;
use self::global::global;
pub use self::global::softverbs_remove_addr;

// The verbs this module calls: the library's own exported functions.
extern "C" {
    fn __softverbs_ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context;
    fn __softverbs_ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd;
    fn __softverbs_ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel;
    fn __softverbs_ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int;
    fn __softverbs_ibv_create_cq(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    fn __softverbs_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn __softverbs_ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn __softverbs_ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// -1 with `errno` = `e`.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn fail_null<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

/// An event channel: the C struct first. `ch.fd` is the application's
/// descriptor: an epoll instance over the channel's eventfd, readable
/// exactly when the channel is, and blocking unless the application sets
/// `O_NONBLOCK` on it (which is then how `rdma_get_cm_event` decides
/// between waiting and `EAGAIN`).
#[repr(C)]
struct SvChan {
    ch: rdma_event_channel,
    ev: EventChannel,
}

/// An id: the C struct first, so the application's `rdma_cm_id *` is a
/// pointer to this.
#[repr(C)]
struct SvId {
    id: rdma_cm_id,
    cm: CmId,
    /// The private channel of a synchronous id (owned by it).
    own_chan: *mut SvChan,
    /// What `rdma_create_ep` was given for the QPs of a passive id's
    /// requests (`rdma_get_request` creates them).
    ep_qp: Option<ibv_qp_init_attr>,
    /// Whether `rdma_create_qp` made the id's CQs (and destroys them).
    own_cqs: bool,
    path: ibv_sa_path_rec,
}

/// An event handed to the application: the C struct, then the private
/// data it points at.
#[repr(C)]
struct SvEvent {
    ev: rdma_cm_event,
    data: [u8; 256],
}

/// The ids alive: CM id number → its `SvId` (as an address), and the
/// addresses themselves, so that a call on an id the application already
/// destroyed fails with `EINVAL` instead of reading freed memory.
#[derive(Default)]
struct Ids {
    by_key: HashMap<u64, usize>,
    live: std::collections::HashSet<usize>,
}

fn ids() -> std::sync::MutexGuard<'static, Ids> {
    static IDS: OnceLock<Mutex<Ids>> = OnceLock::new();
    IDS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn lookup(key: u64) -> *mut SvId {
    ids().by_key.get(&key).map_or(null_mut(), |&p| p as *mut SvId)
}

/// Held (shared) while an event is turned into the application's, and
/// (exclusive) while an id is freed.
static TRANSLATING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Whether `p` is an id of this library not yet destroyed.
fn is_live(p: *mut rdma_cm_id) -> bool {
    ids().live.contains(&(p as usize))
}

/// A socket address from C, or `EAFNOSUPPORT`/`EINVAL`.
///
/// # Safety
///
/// `sa` NULL or readable for its family's size.
unsafe fn sock_from(sa: *const libc::sockaddr) -> Result<Option<SocketAddr>, c_int> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise: at least the family is readable.
    let family = unsafe { std::ptr::read_unaligned(std::ptr::addr_of!((*sa).sa_family)) };
    match c_int::from(family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in (read
            // unaligned: callers pass addresses inside byte buffers).
            let s = unsafe { std::ptr::read_unaligned(sa as *const libc::sockaddr_in) };
            Ok(Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6 (read
            // unaligned, as above).
            let s = unsafe { std::ptr::read_unaligned(sa as *const libc::sockaddr_in6) };
            Ok(Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                u16::from_be(s.sin6_port),
            )))
        }
        libc::AF_UNSPEC => Ok(None),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// Writes `a` into a `sockaddr_storage`; returns the length used.
fn sock_to(a: Option<SocketAddr>, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    match a {
        None => 0,
        Some(SocketAddr::V4(v)) => {
            // SAFETY: a sockaddr_storage is large and aligned enough for
            // a sockaddr_in.
            let s = unsafe { &mut *(out as *mut libc::sockaddr_storage as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v.port().to_be();
            s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        Some(SocketAddr::V6(v)) => {
            // SAFETY: as above, for a sockaddr_in6.
            let s = unsafe { &mut *(out as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v.port().to_be();
            s.sin6_addr.s6_addr = v.ip().octets();
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

fn port_space(ps: c_int) -> Result<PortSpace, c_int> {
    match ps {
        RDMA_PS_TCP => Ok(PortSpace::Tcp),
        RDMA_PS_UDP => Ok(PortSpace::Udp),
        RDMA_PS_IB | RDMA_PS_IPOIB => Err(libc::EOPNOTSUPP),
        _ => Err(libc::EINVAL),
    }
}

/// Brings the C view of an id up to date with the connection manager's:
/// its device (`verbs`, `pd`), addresses, GIDs and path record, and its
/// QP's `state` field (the connection manager moves the QP; libibverbs'
/// `ibv_modify_qp` keeps that field as librdmacm's moves do).
fn refresh(sv: &mut SvId) {
    if !sv.id.qp.is_null() {
        // SAFETY: the id's QP, made by this library and alive while the
        // id has it.
        let q = unsafe { SvQp::from_ibv(sv.id.qp) };
        if let Ok(a) = q.h.query() {
            // SAFETY: as above; the C struct is the application's view.
            unsafe { (*sv.id.qp).state = a.qp_state.as_raw() };
        }
    }
    if sv.id.verbs.is_null() && sv.cm.device().is_some() {
        if let Ok(g) = global() {
            sv.id.verbs = g.ctx as *mut ibv_context;
            if sv.id.pd.is_null() {
                sv.id.pd = g.pd as *mut ibv_pd;
            }
        }
    }
    let (src, dst) = (sv.cm.local_addr(), sv.cm.peer_addr());
    sock_to(src, &mut sv.id.route.addr.src_storage);
    sock_to(dst, &mut sv.id.route.addr.dst_storage);
    if let Some(s) = src {
        sv.id.route.addr.ibaddr.sgid = ibv_gid {
            raw: Gid::from_ip(s.ip()).0,
        };
        sv.path.sgid = sv.id.route.addr.ibaddr.sgid;
    }
    sv.id.route.addr.ibaddr.pkey = 0xffff;
    if let Some(d) = dst {
        sv.id.route.addr.ibaddr.dgid = ibv_gid {
            raw: Gid::from_ip(d.ip()).0,
        };
        sv.path.dgid = sv.id.route.addr.ibaddr.dgid;
    }
    if !sv.id.verbs.is_null() && dst.is_some() {
        sv.path.pkey = 0xffff_u16.to_be();
        sv.path.numb_path = 1;
        sv.path.hop_limit = 64;
        sv.path.reversible = 1;
        sv.path.mtu_selector = 2;
        sv.path.mtu = global().map_or(3, |g| g.mtu);
        sv.path.rate_selector = 2;
        sv.path.packet_life_time_selector = 2;
        sv.id.route.path_rec = &mut sv.path;
        sv.id.route.num_paths = 1;
    }
}

/// A new `SvId` for `cm`, registered.
fn new_id(cm: CmId, chan: *mut SvChan, context: *mut c_void, ps: c_int, qp_type: c_int) -> *mut SvId {
    let key = cm.id();
    // SAFETY: rdma_cm_id is plain data (pointers, integers, addresses):
    // all-zero is valid.
    let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
    id.channel = if chan.is_null() {
        null_mut()
    } else {
        chan as *mut rdma_event_channel
    };
    id.context = context;
    id.ps = ps;
    id.port_num = 1;
    id.qp_type = qp_type;
    let p = into_raw(SvId {
        id,
        cm,
        own_chan: null_mut(),
        ep_qp: None,
        own_cqs: false,
        path: ibv_sa_path_rec::default(),
    });
    // SAFETY: just made.
    refresh(unsafe { &mut *p });
    let mut reg = ids();
    reg.by_key.insert(key, p as usize);
    reg.live.insert(p as usize);
    drop(reg);
    p
}

/// Maps a connection manager result to the C convention.
fn ret(r: softverbs::cm::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e.errno()),
    }
}

macro_rules! id_or {
    ($id:expr) => {{
        if $id.is_null() || !is_live($id) {
            return fail(libc::EINVAL);
        }
        // SAFETY: a live id of this library (checked above; the
        // application does not destroy an id while it uses it).
        unsafe { &mut *($id as *mut SvId) }
    }};
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn __softverbs_rdma_create_event_channel() -> *mut rdma_event_channel {
    match make_chan() {
        Ok(c) => c as *mut rdma_event_channel,
        Err(e) => fail_null(e),
    }
}

/// `rdma_destroy_event_channel`.
///
/// # Safety
///
/// `channel` NULL or a channel of this library with no ids left (one
/// already destroyed is ignored).
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if !channel.is_null() {
        // SAFETY: the caller's promise.
        unsafe { free_chan(channel as *mut SvChan) };
    }
}

/// `rdma_create_id`: a NULL `channel` makes a synchronous id.
///
/// # Safety
///
/// `channel` NULL or live; `id` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let qp_type = if ps == RDMA_PS_UDP { IBV_QPT_UD } else { IBV_QPT_RC };
    // SAFETY: forwarded.
    match unsafe { create_id(channel as *mut SvChan, context, ps, qp_type) } {
        Ok(p) => {
            // SAFETY: writable per the contract.
            unsafe { *id = p as *mut rdma_cm_id };
            0
        }
        Err(e) => fail(e),
    }
}

/// # Safety
///
/// `channel` NULL or live.
unsafe fn create_id(channel: *mut SvChan, context: *mut c_void, ps: c_int, qp_type: c_int) -> Result<*mut SvId, c_int> {
    let g = global()?;
    let space = port_space(ps)?;
    if !channel.is_null() && !chan_live(channel as *mut rdma_event_channel) {
        return Err(libc::EINVAL);
    }
    let (chan, own) = if channel.is_null() {
        let c = make_chan()?;
        (c, c)
    } else {
        (channel, null_mut())
    };
    // SAFETY: live (the caller's, or just made).
    let ev = unsafe { &(*chan).ev };
    let cm = match g.cm.create_id(ev, space, 0) {
        Ok(c) => c,
        Err(e) => {
            if !own.is_null() {
                // SAFETY: just made, unused.
                unsafe { free_chan(own) };
            }
            return Err(e.errno());
        }
    };
    let p = new_id(cm, chan, context, ps, qp_type);
    // SAFETY: just made.
    unsafe { (*p).own_chan = own };
    Ok(p)
}

/// `rdma_destroy_id`.
///
/// # Safety
///
/// `id` a live id; the application no longer uses it.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    let sv = id_or!(id);
    let _free = TRANSLATING.write().unwrap_or_else(|p| p.into_inner());
    let mut reg = ids();
    reg.by_key.remove(&sv.cm.id());
    reg.live.remove(&(id as usize));
    drop(reg);
    if !sv.id.event.is_null() {
        // SAFETY: the id's kept event.
        unsafe { free_event(sv.id.event) };
    }
    let own = sv.own_chan;
    // SAFETY: made by into_raw in new_id; unregistered above.
    unsafe { free_raw(id as *mut SvId) };
    if !own.is_null() {
        // SAFETY: the id's private channel, unused now.
        unsafe { free_chan(own) };
    }
    0
}

/// `rdma_bind_addr`.
///
/// # Safety
///
/// `id` live; `addr` readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    let sv = id_or!(id);
    // SAFETY: readable per the contract.
    let a = match unsafe { sock_from(addr) } {
        Ok(Some(a)) => a,
        Ok(None) => return fail(libc::EINVAL),
        Err(e) => return fail(e),
    };
    let r = ret(sv.cm.bind_addr(a));
    refresh(sv);
    r
}

/// `rdma_resolve_addr`.
///
/// # Safety
///
/// `id` live; the addresses NULL (source only) or readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    let sv = id_or!(id);
    // SAFETY: readable per the contract.
    let (src, dst) = match unsafe { (sock_from(src_addr), sock_from(dst_addr)) } {
        (Ok(s), Ok(Some(d))) => (s, d),
        (Err(e), _) | (_, Err(e)) => return fail(e),
        _ => return fail(libc::EINVAL),
    };
    if let Some(s) = src.filter(|s| s.port() != 0 || !s.ip().is_unspecified()) {
        if sv.cm.local_addr().is_none() {
            if let Err(e) = sv.cm.bind_addr(s) {
                return fail(e.errno());
            }
        }
    }
    let src_ip = src.map(|s| s.ip()).filter(|ip| !ip.is_unspecified());
    let r = ret(sv.cm.resolve_addr(src_ip, dst));
    refresh(sv);
    if r != 0 {
        return r;
    }
    sync_wait(sv, RDMA_CM_EVENT_ADDR_RESOLVED)
}

/// `rdma_resolve_route`.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    let sv = id_or!(id);
    let r = ret(sv.cm.resolve_route());
    refresh(sv);
    if r != 0 {
        return r;
    }
    sync_wait(sv, RDMA_CM_EVENT_ROUTE_RESOLVED)
}

/// `rdma_listen`.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    let sv = id_or!(id);
    if sv.cm.local_addr().is_none() {
        // librdmacm binds an unbound listener to the wildcard address.
        if let Err(e) = sv.cm.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)) {
            return fail(e.errno());
        }
    }
    let backlog = if backlog <= 0 { 1024 } else { backlog as u32 };
    let r = ret(sv.cm.listen(backlog));
    refresh(sv);
    r
}

/// The connection parameters of a C `rdma_conn_param` (NULL: defaults).
///
/// # Safety
///
/// `p` NULL or readable, its private data readable for its length.
unsafe fn conn_param(p: *const rdma_conn_param) -> ConnParam {
    if p.is_null() {
        return ConnParam::default();
    }
    // SAFETY: readable per the contract.
    let p = unsafe { &*p };
    let data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: readable for its length per the contract.
        unsafe { std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize) }.to_vec()
    };
    ConnParam {
        private_data: data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        qp_num: p.qp_num,
        srq: p.srq != 0,
    }
}

/// `rdma_connect`.
///
/// # Safety
///
/// `id` live; `conn_param` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    let sv = id_or!(id);
    // SAFETY: forwarded.
    let mut p = unsafe { self::conn_param(conn_param) };
    if !sv.id.qp.is_null() {
        p.qp_num = 0;
    }
    let r = ret(sv.cm.connect(&p));
    if r != 0 {
        return r;
    }
    sync_wait(sv, RDMA_CM_EVENT_ESTABLISHED)
}

/// `rdma_accept`.
///
/// # Safety
///
/// `id` live; `conn_param` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    let sv = id_or!(id);
    // SAFETY: forwarded.
    let p = unsafe { self::conn_param(conn_param) };
    let r = ret(sv.cm.accept(&p));
    if r != 0 || sv.id.ps == RDMA_PS_UDP {
        return r;
    }
    sync_wait(sv, RDMA_CM_EVENT_ESTABLISHED)
}

/// `rdma_reject`.
///
/// # Safety
///
/// `id` live; `private_data` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {
    let sv = id_or!(id);
    let data = if private_data.is_null() || len == 0 {
        &[][..]
    } else {
        // SAFETY: readable per the contract.
        unsafe { std::slice::from_raw_parts(private_data as *const u8, len as usize) }
    };
    ret(sv.cm.reject(data))
}

/// `rdma_reject_ece`: ECE is not negotiated; an ordinary reject.
///
/// # Safety
///
/// As `rdma_reject`.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { __softverbs_rdma_reject(id, private_data, len) }
}

/// `rdma_establish`.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    let sv = id_or!(id);
    ret(sv.cm.establish())
}

/// `rdma_disconnect`.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    let sv = id_or!(id);
    match sv.cm.disconnect() {
        // As the kernel's rdma_cm: disconnecting a connection that is
        // already going or gone (the peer's DREQ came first) succeeds.
        Err(softverbs::cm::Error::InvalidState { .. })
            if matches!(sv.cm.state(), "DREQ_SENT" | "TIMEWAIT" | "DONE") =>
        {
            0
        }
        r => ret(r),
    }
}

/// `rdma_notify`: nothing to do (the connection manager sees the first
/// receive itself).
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    let _ = id_or!(id);
    0
}

/// `rdma_get_cm_event`.
///
/// # Safety
///
/// `channel` live; `event` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if channel.is_null() || event.is_null() || !chan_live(channel) {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live channel of this library.
    let ch = unsafe { &*(channel as *mut SvChan) };
    // SAFETY: fcntl on the channel's own descriptor.
    let fl = unsafe { libc::fcntl(ch.ch.fd, libc::F_GETFL) };
    let nonblock = fl >= 0 && fl & libc::O_NONBLOCK != 0;
    match next_event(ch, nonblock) {
        Ok(e) => {
            // SAFETY: writable per the contract.
            unsafe { *event = e as *mut rdma_cm_event };
            0
        }
        Err(e) => fail(e),
    }
}

/// `rdma_ack_cm_event`.
///
/// # Safety
///
/// `event` from `rdma_get_cm_event`, not acknowledged yet.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    unsafe { free_event(event) };
    0
}

/// `rdma_event_str`.
#[no_mangle]
pub extern "C" fn __softverbs_rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

/// `rdma_migrate_id`.
///
/// # Safety
///
/// `id` live; `channel` live (NULL makes the id synchronous).
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    let sv = id_or!(id);
    let (chan, own) = if channel.is_null() {
        match make_chan() {
            Ok(c) => (c, c),
            Err(e) => return fail(e),
        }
    } else if chan_live(channel) {
        (channel as *mut SvChan, null_mut())
    } else {
        return fail(libc::EINVAL);
    };
    // SAFETY: live channel.
    if let Err(e) = sv.cm.migrate(unsafe { &(*chan).ev }) {
        return fail(e.errno());
    }
    if !sv.own_chan.is_null() {
        // SAFETY: the id's previous private channel, unused now.
        unsafe { free_chan(sv.own_chan) };
    }
    sv.own_chan = own;
    sv.id.channel = chan as *mut rdma_event_channel;
    0
}

/// `rdma_get_devices`: the contexts the ids use, NULL-terminated.
///
/// # Safety
///
/// `num_devices` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let list: Vec<*mut ibv_context> = match global() {
        Ok(g) => vec![g.ctx as *mut ibv_context, null_mut()],
        Err(_) => vec![null_mut()],
    };
    if !num_devices.is_null() {
        // SAFETY: writable per the contract.
        unsafe { *num_devices = list.len() as c_int - 1 };
    }
    Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_context
}

/// `rdma_free_devices`.
///
/// # Safety
///
/// `list` from `rdma_get_devices`, not freed yet.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_free_devices(list: *mut *mut ibv_context) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: a NULL-terminated list we made.
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: the boxed slice of n + 1 entries made by rdma_get_devices.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

fn port_of(s: &libc::sockaddr_storage) -> u16 {
    match c_int::from(s.ss_family) {
        // SAFETY: the family says which struct it is.
        libc::AF_INET => unsafe { (*(s as *const _ as *const libc::sockaddr_in)).sin_port },
        // SAFETY: as above.
        libc::AF_INET6 => unsafe { (*(s as *const _ as *const libc::sockaddr_in6)).sin6_port },
        _ => 0,
    }
}

/// `rdma_get_src_port`: the local port, network byte order.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() || !is_live(id) {
        return 0;
    }
    // SAFETY: a live id.
    port_of(unsafe { &(*id).route.addr.src_storage })
}

/// `rdma_get_dst_port`: the peer's port, network byte order.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if id.is_null() || !is_live(id) {
        return 0;
    }
    // SAFETY: a live id.
    port_of(unsafe { &(*id).route.addr.dst_storage })
}

/// `rdma_set_option`: the id options (`RDMA_OPTION_ID_TOS`, `_REUSEADDR`,
/// `_AFONLY`, `_ACK_TIMEOUT`) are accepted and change nothing on soft
/// devices; route options (`RDMA_OPTION_IB_PATH`) fail with `EOPNOTSUPP`.
///
/// # Safety
///
/// `id` live.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    let _ = id_or!(id);
    match (level, optname) {
        (0, 0..=3) => 0,
        _ => fail(libc::EOPNOTSUPP),
    }
}

/// `rdma_init_qp_attr`: the attributes and mask that move the id's QP to
/// `attr->qp_state` (INIT, RTR or RTS), for an application that drives
/// its own QP and passes its number in `rdma_conn_param.qp_num`.
///
/// # Safety
///
/// `id` live; `attr` and `mask` writable (or NULL: `EINVAL`).
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    let sv = id_or!(id);
    if attr.is_null() || mask.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: readable per the contract (checked not NULL).
    let Some(state) = softverbs::verbs::QpState::from_raw(unsafe { (*attr).qp_state }) else {
        return fail(libc::EINVAL);
    };
    match sv.cm.init_qp_attr(state) {
        Ok((a, m)) => {
            // SAFETY: writable per the contract (checked not NULL).
            unsafe {
                *attr = crate::verbs::qp_attr_to_c(&a);
                *mask = m.bits() as c_int;
            }
            0
        }
        Err(e) => fail(e.errno()),
    }
}

/// The calls soft devices do not support: -1 with `errno` `EOPNOTSUPP`
/// (multicast, ECE, SRQs made by the CM).
#[no_mangle]
pub extern "C" fn __softverbs_rdma_unsupported() -> c_int {
    fail(libc::EOPNOTSUPP)
}

// After `id_or!`, which they use.
mod ep;
mod qp;
