//! Events and event channels as librdmacm hands them out: a connection
//! manager event translated into an `rdma_cm_event` (with its private
//! data, path and UD parameters), read from a channel (blocking or not)
//! or waited for by a synchronous id, and the channels themselves (an
//! epoll descriptor the application can poll, over the CM's channel).

use std::ffi::c_void;
use std::os::raw::c_int;
use std::ptr::null_mut;
use std::sync::{Mutex, OnceLock};

use softverbs::cm::{CmEvent, CmEventKind, EventChannel};

use super::ffi::*;
use super::*;
use crate::ffi::*;
use crate::objects::{free_raw, into_raw};

pub(super) fn kind_to_c(k: CmEventKind) -> c_int {
    match k {
        CmEventKind::AddrResolved => RDMA_CM_EVENT_ADDR_RESOLVED,
        CmEventKind::RouteResolved => RDMA_CM_EVENT_ROUTE_RESOLVED,
        CmEventKind::ConnectRequest => RDMA_CM_EVENT_CONNECT_REQUEST,
        CmEventKind::ConnectResponse => RDMA_CM_EVENT_CONNECT_RESPONSE,
        CmEventKind::ConnectError => RDMA_CM_EVENT_CONNECT_ERROR,
        CmEventKind::Unreachable => RDMA_CM_EVENT_UNREACHABLE,
        CmEventKind::Rejected => RDMA_CM_EVENT_REJECTED,
        CmEventKind::Established => RDMA_CM_EVENT_ESTABLISHED,
        CmEventKind::Disconnected => RDMA_CM_EVENT_DISCONNECTED,
        CmEventKind::DeviceRemoval => RDMA_CM_EVENT_DEVICE_REMOVAL,
        CmEventKind::AddrChange => RDMA_CM_EVENT_ADDR_CHANGE,
        CmEventKind::TimewaitExit => RDMA_CM_EVENT_TIMEWAIT_EXIT,
    }
}

pub(super) fn ah_to_c(a: &softverbs::verbs::AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.grh.dgid.0 },
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// Turns a connection manager event into the application's, or `None`
/// for an event about an id already destroyed (dropped). A connection
/// request's new id is made here, on the listener's channel.
pub(super) fn translate(mut ev: CmEvent) -> Option<*mut SvEvent> {
    let (idp, listen) = if ev.kind == CmEventKind::ConnectRequest {
        let lp = ev.listener.map_or(null_mut(), lookup);
        if lp.is_null() {
            return None; // dropping the event rejects the request
        }
        let child = ev.take_id()?;
        // SAFETY: a registered id is alive (ids leave the map before
        // they are freed, under the application's rule that an id is not
        // destroyed while another thread uses it).
        let l = unsafe { &*lp };
        let c = new_id(child, l.id.channel as *mut SvChan, l.id.context, l.id.ps, l.id.qp_type);
        (c, lp)
    } else {
        let p = lookup(ev.id);
        if p.is_null() {
            return None;
        }
        (p, null_mut())
    };
    // SAFETY: registered, alive (see above).
    let sv = unsafe { &mut *idp };
    refresh(sv);
    let mut out = Box::new(SvEvent {
        // SAFETY: rdma_cm_event is plain data; all-zero is valid.
        ev: unsafe { std::mem::zeroed() },
        data: [0; 256],
    });
    let n = ev.private_data.len().min(255);
    out.data[..n].copy_from_slice(&ev.private_data[..n]);
    let data = if n == 0 {
        std::ptr::null()
    } else {
        out.data.as_ptr() as *const c_void
    };
    out.ev.id = idp as *mut rdma_cm_id;
    out.ev.listen_id = listen as *mut rdma_cm_id;
    out.ev.event = kind_to_c(ev.kind);
    out.ev.status = ev.status;
    if sv.id.ps == RDMA_PS_UDP {
        let ud = ev.ud.as_ref();
        out.ev.param.ud = rdma_ud_param {
            private_data: data,
            private_data_len: n as u8,
            ah_attr: ud.map(|u| ah_to_c(&u.ah_attr)).unwrap_or_default(),
            qp_num: ud.map_or(0, |u| u.qp_num),
            qkey: ud.map_or(0, |u| u.qkey),
        };
    } else {
        let c = ev.conn.clone().unwrap_or_default();
        out.ev.param.conn = rdma_conn_param {
            private_data: data,
            private_data_len: n as u8,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            flow_control: 1,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            srq: u8::from(c.srq),
            qp_num: c.qp_num,
        };
    }
    Some(Box::into_raw(out))
}

/// The next event of `ch`: waits unless `nonblock`.
pub(super) fn next_event(ch: &SvChan, nonblock: bool) -> Result<*mut SvEvent, c_int> {
    loop {
        let ev = if nonblock {
            ch.ev.try_get_event().ok_or(libc::EAGAIN)?
        } else {
            match ch.ev.get_event(None) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(e) => return Err(e.errno()),
            }
        };
        // The ids an event names stay alive while it is translated: a
        // thread destroying an id (another thread's rdma_destroy_id while
        // this one reads its events, as rping does) waits for that.
        let _alive = TRANSLATING.read().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = translate(ev) {
            return Ok(p);
        }
    }
}

/// Frees an event made by [`translate`].
///
/// # Safety
///
/// `ev` from `translate`, not freed yet.
pub(super) unsafe fn free_event(ev: *mut rdma_cm_event) {
    // SAFETY: the caller's promise; SvEvent starts with the C event.
    drop(unsafe { Box::from_raw(ev as *mut SvEvent) });
}

/// A synchronous id's wait for the event that completes its call
/// (`want`): kept in `id->event` (the previous one freed) so the caller
/// can read its parameters. An error event fails with librdmacm's errno.
pub(super) fn sync_wait(sv: &mut SvId, want: c_int) -> c_int {
    if sv.own_chan.is_null() {
        return 0;
    }
    // SAFETY: the id's own channel lives as long as the id.
    let ch = unsafe { &*sv.own_chan };
    let ev = match next_event(ch, false) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    if !sv.id.event.is_null() {
        // SAFETY: the previous event, ours to free.
        unsafe { free_event(sv.id.event) };
    }
    sv.id.event = ev as *mut rdma_cm_event;
    // SAFETY: just made.
    let e = unsafe { &(*ev).ev };
    if e.event == want {
        return 0;
    }
    let err = match (e.event, e.status) {
        (RDMA_CM_EVENT_REJECTED, _) => libc::ECONNREFUSED,
        (_, s) if s < 0 => -s,
        (_, s) if s > 0 => s,
        (RDMA_CM_EVENT_DEVICE_REMOVAL, _) => libc::ENODEV,
        _ => libc::EIO,
    };
    fail(err)
}

pub(super) fn app_fd(fd: c_int) -> Result<c_int, c_int> {
    // SAFETY: no memory is passed; a negative return is an error.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(errno());
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: `ev` is a live epoll_event; `ep` and `fd` are open.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        let e = errno();
        // SAFETY: our own descriptor.
        unsafe { libc::close(ep) };
        return Err(e);
    }
    Ok(ep)
}

/// The channels alive (addresses), so that a channel the application
/// already destroyed is refused (`EINVAL`; destroying it again does
/// nothing) instead of being read or freed twice.
pub(super) fn chans() -> std::sync::MutexGuard<'static, std::collections::HashSet<usize>> {
    static CHANS: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    CHANS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether `ch` is a channel of this library not yet destroyed.
pub(super) fn chan_live(ch: *mut rdma_event_channel) -> bool {
    chans().contains(&(ch as usize))
}

pub(super) fn make_chan() -> Result<*mut SvChan, c_int> {
    global()?;
    let ev = EventChannel::new().map_err(|e| e.errno())?;
    let fd = app_fd(std::os::fd::AsRawFd::as_raw_fd(&ev))?;
    let p = into_raw(SvChan {
        ch: rdma_event_channel { fd },
        ev,
    });
    chans().insert(p as usize);
    Ok(p)
}

/// Frees a channel made by [`make_chan`].
///
/// # Safety
///
/// `ch` from `make_chan`, no longer used.
pub(super) unsafe fn free_chan(ch: *mut SvChan) {
    if !chans().remove(&(ch as usize)) {
        return; // destroyed already
    }
    // SAFETY: the caller's promise.
    let fd = unsafe { (*ch).ch.fd };
    // SAFETY: our epoll descriptor.
    unsafe { libc::close(fd) };
    // SAFETY: the caller's promise.
    unsafe { free_raw(ch) };
}
