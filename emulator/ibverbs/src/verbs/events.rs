//! Async events of a context.

use super::*;

/// `ibv_get_async_event`: blocks until the device reports an event; on a
/// removed device whose events were all read, -1 with `EIO`. With
/// `O_NONBLOCK` set on the context's `async_fd`, returns -1 with `EAGAIN`
/// at once when no event is pending.
///
/// # Safety
///
/// `ctx` an open context; `event` writable.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    null_check!(-1; ctx, event);
    // SAFETY: an open context of this library.
    let sv = unsafe { SvContext::from_ibv(ctx) };
    // SAFETY: as above.
    let async_fd = unsafe { (*ctx).async_fd };
    loop {
        // After a removal, once its events are consumed, the event file
        // reports EIO, as the kernel's does for a disassociated device;
        // until then wait in slices to notice a removal.
        let removed = sv.dev.removed();
        let nonblocking = fd_nonblocking(async_fd);
        let wait = if removed || nonblocking {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        let ev = match sv.ctx.get_async_event(Some(wait)) {
            Ok(Some(ev)) => ev,
            Ok(None) if removed => {
                set_errno(libc::EIO);
                return -1;
            }
            Ok(None) if nonblocking => {
                set_errno(libc::EAGAIN);
                return -1;
            }
            Ok(None) => continue,
            Err(e) => {
                fail(&e);
                return -1;
            }
        };
        let element = match ev.element {
            AsyncElement::Device => async_element { port_num: 0 },
            AsyncElement::Port(p) => async_element {
                port_num: c_int::from(p),
            },
            AsyncElement::Cq(c) => async_element { cq: c as *mut ibv_cq },
            AsyncElement::Srq(s) => async_element { srq: s as *mut ibv_srq },
            AsyncElement::Qp(n) => {
                let found = sv.qps.lock().unwrap_or_else(|e| e.into_inner()).get(&n).copied();
                match found {
                    Some(p) => async_element { qp: p as *mut ibv_qp },
                    // The QP was destroyed while its event was queued.
                    None => continue,
                }
            }
        };
        // SAFETY: writable per the contract.
        unsafe {
            *event = ibv_async_event {
                element,
                event_type: ev.event_type.as_raw(),
            }
        };
        return 0;
    }
}

/// `ibv_ack_async_event`: counts the event on its object (destroys do not
/// wait for acknowledgements here).
///
/// # Safety
///
/// `event` NULL or filled by `ibv_get_async_event`, its object alive.
#[no_mangle]
pub unsafe extern "C" fn __softverbs_ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: an event this library filled in; its object is alive.
    unsafe {
        let e = &*event;
        match e.event_type {
            0 => {
                let cq = e.element.cq;
                (*cq).async_events_completed = (*cq).async_events_completed.wrapping_add(1);
            }
            1..=7 | 16 => {
                let qp = e.element.qp;
                (*qp).events_completed = (*qp).events_completed.wrapping_add(1);
            }
            14 | 15 => {
                let srq = e.element.srq;
                (*srq).events_completed = (*srq).events_completed.wrapping_add(1);
            }
            _ => {}
        }
    }
}
