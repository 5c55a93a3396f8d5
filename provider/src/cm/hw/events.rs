//! [`HwCm`]: one CM's librdmacm event channel and the thread that reads
//! it. Each `rdma_cm_event` is copied, acknowledged at once (so
//! `rdma_destroy_id` never waits for the application), then translated
//! (`hwmap`) into a [`CmEvent`](crate::cm::CmEvent) with the id's
//! namespace, device and generation, and queued on the id's event
//! channel like a soft id's events; a connection request becomes a new
//! id on the listener's channel.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{JoinHandle, ThreadId};

use rdma_sys::{rdma_cm_event, rdma_cm_id, rdma_port_space, rdma_ud_param};

use crate::cm::agent::{qp_to_err, Id, IdState, Inner, StateGuard};
use crate::cm::hwmap::{self, Action};
use crate::cm::{CmEventKind, ConnParam, Error, PortSpace, Result, UdParam};
use crate::verbs::{AhAttr, Gid, GlobalRoute, QpState};

use super::*;

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

impl HwCm {
    /// Opens librdmacm's event channel and starts the thread reading it.
    pub(super) fn start(inner: Weak<Inner>) -> Result<Arc<HwCm>> {
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
    pub(super) fn create_id(&self, key: u64, ps: PortSpace) -> Result<Arc<HwId>> {
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
        Action::Removal => crate::cm::agent::Inner::remove_one(&mut st, raw.key),
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
            deliver(&mut st, raw.key, kind, raw.status, raw.private_data, raw.conn, raw.ud);
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
            deliver(&mut st, raw.key, kind, status, raw.private_data, raw.conn, raw.ud);
        }
    }
}

fn deliver(
    st: &mut State,
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
fn new_request(inner: &Arc<Inner>, mut st: StateGuard<'_>, raw: RawEvent) {
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
