//! librdmacm's synchronous endpoint calls (`rdma_verbs.h`'s side of
//! `rdma_cma.h`): `rdma_create_ep`, `rdma_get_request`, `rdma_destroy_ep`,
//! and the address information they take (`rdma_getaddrinfo`,
//! `rdma_freeaddrinfo`).

use super::qp::{__softverbs_rdma_create_qp, __softverbs_rdma_destroy_qp, copy_attr, create_qp};
#[allow(clippy::wildcard_imports)]
use super::*;

/// `rdma_get_request`: the next connection request of a synchronous
/// listener, as a synchronous id (with a QP if `rdma_create_ep` was given
/// QP attributes).
///
/// # Safety
///
/// `listen` a live listening id; `id` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    let l = id_or!(listen);
    if id.is_null() || l.own_chan.is_null() {
        return fail(libc::EINVAL);
    }
    loop {
        // SAFETY: the listener's own channel.
        let ev = match next_event(unsafe { &*l.own_chan }, false) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        // SAFETY: just made.
        let e = unsafe { &mut (*ev).ev };
        if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            // SAFETY: ours.
            unsafe { free_event(ev as *mut rdma_cm_event) };
            continue;
        }
        // SAFETY: the new id, registered by translate.
        let c = unsafe { &mut *(e.id as *mut SvId) };
        let chan = match make_chan() {
            Ok(ch) => ch,
            Err(err) => {
                // SAFETY: forwarded.
                unsafe {
                    __softverbs_rdma_reject(e.id, std::ptr::null(), 0);
                    __softverbs_rdma_destroy_id(e.id);
                    free_event(ev as *mut rdma_cm_event);
                }
                return fail(err);
            }
        };
        // SAFETY: live.
        let _ = c.cm.migrate(unsafe { &(*chan).ev });
        c.own_chan = chan;
        c.id.channel = chan as *mut rdma_event_channel;
        if let Some(mut qa) = l.ep_qp.as_ref().map(copy_attr) {
            if !l.id.pd.is_null() {
                c.id.pd = l.id.pd;
            }
            // SAFETY: the listener's PD (or the shared one) and the
            // attributes rdma_create_ep copied.
            if unsafe { create_qp(c, null_mut(), &mut qa) } != 0 {
                let err = errno();
                // SAFETY: forwarded.
                unsafe {
                    __softverbs_rdma_reject(e.id, std::ptr::null(), 0);
                    __softverbs_rdma_destroy_id(e.id);
                    free_event(ev as *mut rdma_cm_event);
                }
                return fail(err);
            }
        }
        c.id.event = ev as *mut rdma_cm_event;
        // SAFETY: writable per the contract.
        unsafe { *id = e.id };
        return 0;
    }
}

/// `rdma_create_ep`: a synchronous id for `res` (passive: bound; active:
/// address and route resolved), with a QP if `qp_init_attr` is given
/// (passive: for each request).
///
/// # Safety
///
/// `id` writable; `res` a live `rdma_addrinfo`; `pd` NULL or live;
/// `qp_init_attr` NULL or readable and writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: live per the contract.
    let r = unsafe { &*res };
    let qp_type = if r.ai_qp_type != 0 {
        r.ai_qp_type
    } else if r.ai_port_space == RDMA_PS_UDP {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    // SAFETY: no channel.
    let p = match unsafe { create_id(null_mut(), null_mut(), r.ai_port_space, qp_type) } {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let idp = p as *mut rdma_cm_id;
    // SAFETY: just made.
    let sv = unsafe { &mut *p };
    if !pd.is_null() {
        sv.id.pd = pd;
    }
    let rc = if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: the addrinfo's addresses.
        let rc = unsafe { __softverbs_rdma_bind_addr(idp, r.ai_src_addr) };
        if rc == 0 && !qp_init_attr.is_null() {
            // SAFETY: readable per the contract.
            sv.ep_qp = Some(copy_attr(unsafe { &*qp_init_attr }));
        }
        rc
    } else {
        // SAFETY: the addrinfo's addresses.
        let mut rc = unsafe { __softverbs_rdma_resolve_addr(idp, r.ai_src_addr, r.ai_dst_addr, 2000) };
        if rc == 0 {
            // SAFETY: live.
            rc = unsafe { __softverbs_rdma_resolve_route(idp, 2000) };
        }
        if rc == 0 && !qp_init_attr.is_null() {
            // SAFETY: forwarded.
            rc = unsafe { __softverbs_rdma_create_qp(idp, pd, qp_init_attr) };
        }
        rc
    };
    if rc != 0 {
        let e = errno();
        // SAFETY: ours, unused.
        unsafe { __softverbs_rdma_destroy_id(idp) };
        return fail(e);
    }
    // SAFETY: writable per the contract.
    unsafe { *id = idp };
    0
}

/// `rdma_destroy_ep`: destroys the id's QP (and the CQs made for it) and
/// the id.
///
/// # Safety
///
/// `id` live, no longer used.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_destroy_ep(id: *mut rdma_cm_id) {
    if id.is_null() {
        return;
    }
    // SAFETY: forwarded.
    unsafe {
        __softverbs_rdma_destroy_qp(id);
        __softverbs_rdma_destroy_id(id);
    }
}

/// Copies `a` into a `malloc`ed sockaddr.
fn malloc_sock(a: SocketAddr) -> (*mut libc::sockaddr, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = sock_to(Some(a), &mut st);
    // SAFETY: malloc of a fixed size; checked below.
    let p = unsafe { libc::malloc(std::mem::size_of::<libc::sockaddr_storage>()) } as *mut libc::sockaddr_storage;
    if p.is_null() {
        return (null_mut(), 0);
    }
    // SAFETY: `p` is a fresh allocation of the right size.
    unsafe { p.write(st) };
    (p as *mut libc::sockaddr, len)
}

/// `rdma_getaddrinfo`: numeric or resolvable IPv4/IPv6 addresses (the
/// first one), in the TCP or UDP port space.
///
/// # Safety
///
/// `node`, `service` NULL or strings; `hints` NULL or readable; `res`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        return fail(libc::EINVAL);
    }
    // SAFETY: strings per the contract.
    let node = (!node.is_null()).then(|| unsafe { CStr::from_ptr(node) }.to_string_lossy().into_owned());
    // SAFETY: as above.
    let service = (!service.is_null()).then(|| unsafe { CStr::from_ptr(service) }.to_string_lossy().into_owned());
    // SAFETY: readable per the contract.
    let h = (!hints.is_null()).then(|| unsafe { &*hints });
    let flags = h.map_or(0, |h| h.ai_flags);
    let ps = match h.map_or(0, |h| h.ai_port_space) {
        0 => {
            if h.map_or(0, |h| h.ai_qp_type) == IBV_QPT_UD {
                RDMA_PS_UDP
            } else {
                RDMA_PS_TCP
            }
        }
        p => p,
    };
    if port_space(ps).is_err() {
        return fail(libc::EOPNOTSUPP);
    }
    let port: u16 = match service.as_deref() {
        None => 0,
        Some(s) => match s.parse() {
            Ok(p) => p,
            Err(_) => return fail(libc::EINVAL),
        },
    };
    let family = h.map_or(0, |h| h.ai_family);
    let pick = |addrs: Vec<SocketAddr>| {
        addrs
            .into_iter()
            .find(|a| match family {
                libc::AF_INET => a.is_ipv4(),
                libc::AF_INET6 => a.is_ipv6(),
                _ => true,
            })
            .ok_or(libc::EADDRNOTAVAIL)
    };
    let addr = match node.as_deref() {
        None if flags & RAI_PASSIVE != 0 => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)),
        None => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
        Some(n) => match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SocketAddr::new(ip, port)),
            Err(_) if flags & RAI_NUMERICHOST != 0 => Err(libc::EINVAL),
            Err(_) => (n, port)
                .to_socket_addrs()
                .map_err(|_| libc::EADDRNOTAVAIL)
                .and_then(|a| pick(a.collect())),
        },
    };
    let addr = match addr {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    // SAFETY: calloc of a fixed size; checked below.
    let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
    if ai.is_null() {
        return fail(libc::ENOMEM);
    }
    // SAFETY: a fresh zeroed allocation of the right size.
    let r = unsafe { &mut *ai };
    r.ai_flags = flags;
    r.ai_family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    r.ai_port_space = ps;
    r.ai_qp_type = if ps == RDMA_PS_UDP { IBV_QPT_UD } else { IBV_QPT_RC };
    let (sa, len) = malloc_sock(addr);
    if sa.is_null() {
        // SAFETY: ours.
        unsafe { libc::free(ai as *mut c_void) };
        return fail(libc::ENOMEM);
    }
    if flags & RAI_PASSIVE != 0 {
        r.ai_src_addr = sa;
        r.ai_src_len = len;
    } else {
        r.ai_dst_addr = sa;
        r.ai_dst_len = len;
        if let Some(src) = h.filter(|h| !h.ai_src_addr.is_null()) {
            // SAFETY: the hints' source address, readable per the contract.
            if let Ok(Some(s)) = unsafe { sock_from(src.ai_src_addr) } {
                let (sa, len) = malloc_sock(s);
                r.ai_src_addr = sa;
                r.ai_src_len = if sa.is_null() { 0 } else { len };
            }
        }
    }
    // SAFETY: writable per the contract.
    unsafe { *res = ai };
    0
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
///
/// `res` NULL or from `rdma_getaddrinfo`, not freed yet.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a node of our list; its pointers are ours (malloc) or NULL.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr as *mut c_void);
            libc::free((*p).ai_dst_addr as *mut c_void);
            libc::free((*p).ai_src_canonname as *mut c_void);
            libc::free((*p).ai_dst_canonname as *mut c_void);
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p as *mut c_void);
            p = next;
        }
    }
}
