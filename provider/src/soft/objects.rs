//! The soft provider's verbs objects: the backend trait family of
//! [`crate::verbs::backend`] over a device engine.
//!
//! Each object holds `Arc`s to what it depends on (a QP its PD, CQs and
//! SRQ), so the engine object is destroyed only when nothing uses it; an
//! explicit destroy returns what the engine says (`EBUSY` while in use) and
//! is idempotent once it succeeded.

use crate::sys::lock;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::engine::{DeviceShared, EventSink};
use super::notify::EventFd;
use super::proto::{AhId, CqId, PdId, QpCreate, SrqId};

mod section;
use crate::verbs::backend::*;
use crate::verbs::{
    verr, AccessFlags, AhAttr, AsyncEvent, DeviceAttr, Error, Gid, MemorySource, MwBindInfo, MwType, PortAttr,
    PostError, QpAttr, QpAttrMask, QpCap, QpType, RecvWr, ReregFlags, Result, SendFlags, SendOp, SendWr, Sge, SrqAttr,
    SrqAttrMask, WorkCompletion,
};
pub(crate) use section::{in_section, SoftLock};

static NEXT_CONTEXT: AtomicU32 = AtomicU32::new(1);

/// An open soft device.
pub(crate) struct SoftContext {
    me: Weak<SoftContext>,
    dev: Arc<DeviceShared>,
    id: u32,
    attr: DeviceAttr,
    port: PortAttr,
    /// Whether port 1 is active (shared with the device; see
    /// `SoftDevice::set_port_active`).
    port_active: Arc<AtomicBool>,
    gids: Vec<Gid>,
    events: Mutex<VecDeque<AsyncEvent>>,
    event_fd: EventFd,
    /// The descriptor handed to the application (`event_fd`, or an epoll
    /// set of it and what the device needs watched), made on first use.
    poll_fd: OnceLock<RawFd>,
    poll_set: OnceLock<OwnedFd>,
    /// CQ id → (context, channel) for completion events.
    channels: Mutex<HashMap<u32, (u64, Arc<SoftCompChannel>)>>,
}

impl SoftContext {
    pub(crate) fn open(
        dev: Arc<DeviceShared>,
        attr: DeviceAttr,
        port: PortAttr,
        port_active: Arc<AtomicBool>,
        gids: Vec<Gid>,
    ) -> Result<Arc<SoftContext>> {
        let event_fd = EventFd::new().map_err(|e| verr!(OpenDevice, Io, "eventfd: {e}"))?;
        let ctx = Arc::new_cyclic(|me| SoftContext {
            me: me.clone(),
            dev,
            id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
            attr,
            port,
            port_active,
            gids,
            events: Mutex::new(VecDeque::new()),
            event_fd,
            poll_fd: OnceLock::new(),
            poll_set: OnceLock::new(),
            channels: Mutex::new(HashMap::new()),
        });
        let sink: Arc<dyn EventSink> = ctx.clone();
        ctx.dev.register_sink(ctx.id, Arc::downgrade(&sink));
        Ok(ctx)
    }

    fn check_port(&self, verb: crate::verbs::Verb, port: u8) -> Result<()> {
        if port == 0 || port > self.attr.phys_port_cnt {
            return Err(Error::new(
                verb,
                crate::verbs::ErrorKind::InvalidArgument,
                format!("port {port} does not exist (the device has port 1)"),
            ));
        }
        Ok(())
    }
}

impl Drop for SoftContext {
    fn drop(&mut self) {
        self.dev.unregister_sink(self.id);
    }
}

impl EventSink for SoftContext {
    fn cq_notify(&self, cq: CqId) {
        let found = lock(&self.channels).get(&cq.0).cloned();
        if let Some((context, ch)) = found {
            ch.post(cq.0, context);
        }
    }

    fn async_event(&self, _owner: Option<u32>, event: AsyncEvent) {
        lock(&self.events).push_back(event);
        self.event_fd.post();
    }
}

/// The descriptor an application registers for `fd`'s events: `fd`
/// itself, or (inline mode on a network link) an epoll set of `fd` and
/// what the device needs watched ([`DeviceShared::watched_fds`]), so that
/// it becomes readable whenever an event is pending. Made once, on first
/// use; if the set cannot be made, `fd` (with what the engine docs say
/// about inline mode) and a line on standard error.
fn pollable(dev: &DeviceShared, fd: &EventFd, raw: &OnceLock<RawFd>, set: &OnceLock<OwnedFd>) -> RawFd {
    *raw.get_or_init(|| {
        let made = dev.watched_fds().and_then(|extra| {
            if extra.is_empty() {
                return Ok(None);
            }
            let mut fds = vec![fd.raw()];
            fds.extend(extra);
            super::engine::epoll_of(&fds).map(Some)
        });
        match made {
            Ok(Some(ep)) => {
                let r = ep.as_raw_fd();
                let _ = set.set(ep);
                r
            }
            Ok(None) => fd.raw(),
            Err(e) => {
                eprintln!("softverbs: {}: no epoll set for an event descriptor: {e}", dev.name());
                fd.raw()
            }
        }
    })
}

/// Waits for `ready` on `fd` up to `timeout`, driving `dev` whenever its
/// engine has a deadline or (inline mode) its link has datagrams: timers
/// only run and sockets are only read when someone drives the device.
fn wait_driving(
    dev: &Arc<DeviceShared>,
    fd: &EventFd,
    timeout: Option<Duration>,
    mut ready: impl FnMut() -> bool,
) -> bool {
    let start = Instant::now();
    loop {
        dev.drive();
        if ready() {
            return true;
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        if left == Some(Duration::ZERO) {
            return false;
        }
        let until_deadline = dev
            .next_deadline()
            .map(|d| Duration::from_nanos(d.saturating_sub(dev.now())));
        let slice = match (left, until_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        dev.wait_readable(fd.raw(), slice);
    }
}

/// `attr` with the state of a port that is (or is not) active.
pub(crate) fn port_attr_in(mut attr: PortAttr, active: bool) -> PortAttr {
    if !active {
        attr.state = crate::verbs::PortState::Down;
        attr.phys_state = 3; // Disabled, as rxe reports a port whose netdev is down
    }
    attr
}

impl ContextOps for SoftContext {
    fn device_name(&self) -> &str {
        self.dev.name()
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(self.attr.clone())
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port(crate::verbs::Verb::QueryPort, port)?;
        Ok(port_attr_in(
            self.port.clone(),
            self.port_active.load(Ordering::Acquire),
        ))
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.check_port(crate::verbs::Verb::QueryGid, port)?;
        if index >= self.port.gid_tbl_len {
            return Err(verr!(
                QueryGid,
                InvalidArgument,
                "GID index {index} beyond the table of {}",
                self.port.gid_tbl_len
            ));
        }
        Ok(self.gids.get(index as usize).copied().unwrap_or(Gid::ZERO))
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.check_port(crate::verbs::Verb::QueryPkey, port)?;
        if index >= self.port.pkey_tbl_len {
            return Err(verr!(
                QueryPkey,
                InvalidArgument,
                "P_Key index {index} beyond the table"
            ));
        }
        Ok(0xffff)
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        let ctx = self.self_arc();
        let id = self.dev.with_core(|c, _| c.alloc_pd(self.id))?;
        Ok(Arc::new_cyclic(|me| SoftPd {
            me: me.clone(),
            ctx,
            id,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>> {
        Ok(Arc::new(SoftCompChannel {
            dev: self.dev.clone(),
            pending: Mutex::new(VecDeque::new()),
            unacked: Mutex::new(HashMap::new()),
            fd: EventFd::new().map_err(|e| verr!(CreateCompChannel, Io, "eventfd: {e}"))?,
            poll_fd: OnceLock::new(),
            poll_set: OnceLock::new(),
            users: AtomicU32::new(0),
        }))
    }

    fn create_cq(
        &self,
        cqe: u32,
        context: u64,
        channel: Option<&Arc<dyn CompChannelOps>>,
        _comp_vector: u32,
    ) -> Result<Arc<dyn CqOps>> {
        let channel = match channel {
            Some(c) => Some(c.clone().into_any_arc().downcast::<SoftCompChannel>().map_err(|_| {
                verr!(
                    CreateCq,
                    InvalidArgument,
                    "the completion channel belongs to another backend"
                )
            })?),
            None => None,
        };
        let (id, capacity) = self.dev.with_core(|c, _| c.create_cq(cqe, context, self.id))?;
        let unacked = Arc::new(AtomicU32::new(0));
        if let Some(ch) = &channel {
            ch.users.fetch_add(1, Ordering::Relaxed);
            lock(&ch.unacked).insert(id.0, unacked.clone());
            lock(&self.channels).insert(id.0, (context, ch.clone()));
        }
        Ok(Arc::new(SoftCq {
            ctx: self.self_arc(),
            id,
            capacity: AtomicU32::new(capacity),
            context,
            channel,
            unacked,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn get_async_event(&self, timeout: Option<Duration>) -> Result<Option<AsyncEvent>> {
        let got = wait_driving(&self.dev, &self.event_fd, timeout, || self.event_fd.try_take());
        Ok(if got { lock(&self.events).pop_front() } else { None })
    }

    fn async_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(pollable(&self.dev, &self.event_fd, &self.poll_fd, &self.poll_set))
    }
}

impl SoftContext {
    fn self_arc(&self) -> Arc<SoftContext> {
        // Only ever created inside an Arc, and `&self` proves it is alive.
        self.me.upgrade().expect("a context is alive while borrowed")
    }
}

fn soft_of<'a, T: 'static>(ops: &'a dyn AsAny, what: &str, verb: crate::verbs::Verb) -> Result<&'a T> {
    ops.as_any().downcast_ref::<T>().ok_or_else(|| {
        Error::new(
            verb,
            crate::verbs::ErrorKind::InvalidArgument,
            format!("the {what} belongs to another backend or device"),
        )
    })
}

/// A protection domain.
pub(crate) struct SoftPd {
    me: Weak<SoftPd>,
    ctx: Arc<SoftContext>,
    id: PdId,
    destroyed: AtomicBool,
}

impl Drop for SoftPd {
    fn drop(&mut self) {
        let _ = PdOps::destroy(self);
    }
}

impl PdOps for SoftPd {
    fn reg_mr(&self, memory: MemorySource, access: AccessFlags) -> Result<Arc<dyn MrOps>> {
        let memory = Arc::new(memory);
        let (lkey, rkey) = self
            .ctx
            .dev
            .with_core(|c, _| c.reg_mr(self.id, memory.clone(), access))?;
        Ok(Arc::new(SoftMr {
            dev: self.ctx.dev.clone(),
            pd: Mutex::new(self.self_arc()?),
            lkey: AtomicU32::new(lkey),
            rkey: AtomicU32::new(rkey),
            access: AtomicU32::new(access.bits()),
            iova: AtomicU64::new(memory.addr()),
            len: AtomicU64::new(memory.len() as u64),
            memory: Mutex::new(Some(memory)),
            fast_reg: false,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn alloc_fast_reg_mr(&self, max_pages: u32) -> Result<Arc<dyn MrOps>> {
        let key = self.ctx.dev.with_core(|c, _| c.alloc_fast_reg_mr(self.id, max_pages))?;
        Ok(Arc::new(SoftMr {
            dev: self.ctx.dev.clone(),
            pd: Mutex::new(self.self_arc()?),
            lkey: AtomicU32::new(key),
            rkey: AtomicU32::new(key),
            access: AtomicU32::new(0),
            iova: AtomicU64::new(0),
            len: AtomicU64::new(0),
            memory: Mutex::new(None),
            fast_reg: true,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn alloc_mw(&self, mw_type: MwType) -> Result<Arc<dyn MwOps>> {
        let key = self.ctx.dev.with_core(|c, _| c.alloc_mw(self.id, mw_type))?;
        Ok(Arc::new(SoftMw {
            pd: self.self_arc()?,
            key: AtomicU32::new(key),
            mw_type,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn create_qp(&self, attr: &QpCreateAttr) -> Result<Arc<dyn QpOps>> {
        let send_cq = soft_cq(&attr.send_cq)?;
        let recv_cq = soft_cq(&attr.recv_cq)?;
        if !Arc::ptr_eq(&send_cq.ctx.dev, &self.ctx.dev) || !Arc::ptr_eq(&recv_cq.ctx.dev, &self.ctx.dev) {
            return Err(verr!(CreateQp, InvalidArgument, "the CQs belong to another device"));
        }
        let srq = match &attr.srq {
            Some(s) => Some(soft_srq(s)?),
            None => None,
        };
        let create = QpCreate {
            qp_type: attr.qp_type,
            pd: self.id,
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
            srq: srq.as_ref().map(|s| s.id),
            cap: attr.cap,
            sq_sig_all: attr.sq_sig_all,
            owner: self.ctx.id,
        };
        let (qpn, cap) = self.ctx.dev.with_core(|c, _| c.create_qp(&create))?;
        Ok(Arc::new(SoftQp {
            pd: self.self_arc()?,
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            _srq: srq,
            qpn,
            qp_type: attr.qp_type,
            cap,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn create_srq(&self, attr: SrqAttr, context: u64) -> Result<Arc<dyn SrqOps>> {
        let (id, _granted) = self
            .ctx
            .dev
            .with_core(|c, _| c.create_srq(self.id, attr, context, self.ctx.id))?;
        Ok(Arc::new(SoftSrq {
            pd: self.self_arc()?,
            id,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<Arc<dyn AhOps>> {
        let id = self.ctx.dev.with_core(|c, _| c.create_ah(self.id, attr))?;
        Ok(Arc::new(SoftAh {
            pd: self.self_arc()?,
            id,
            attr: *attr,
            destroyed: AtomicBool::new(false),
        }))
    }

    fn destroy(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.ctx.dev.with_core(|c, _| c.dealloc_pd(self.id))?;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
}

impl SoftPd {
    fn self_arc(&self) -> Result<Arc<SoftPd>> {
        // Only ever created inside an Arc, and `&self` proves it is alive.
        self.me
            .upgrade()
            .ok_or_else(|| verr!(AllocPd, InvalidArgument, "the PD is being destroyed"))
    }
}

fn soft_cq(ops: &Arc<dyn CqOps>) -> Result<Arc<SoftCq>> {
    ops.clone()
        .into_any_arc()
        .downcast::<SoftCq>()
        .map_err(|_| verr!(CreateQp, InvalidArgument, "the CQ belongs to another backend"))
}

fn soft_srq(ops: &Arc<dyn SrqOps>) -> Result<Arc<SoftSrq>> {
    ops.clone()
        .into_any_arc()
        .downcast::<SoftSrq>()
        .map_err(|_| verr!(CreateQp, InvalidArgument, "the SRQ belongs to another backend"))
}

/// A memory region (plain or fast-registration).
pub(crate) struct SoftMr {
    dev: Arc<DeviceShared>,
    /// The PD (changes with CHANGE_PD; held so the PD outlives the MR).
    pd: Mutex<Arc<SoftPd>>,
    lkey: AtomicU32,
    rkey: AtomicU32,
    access: AtomicU32,
    iova: AtomicU64,
    len: AtomicU64,
    memory: Mutex<Option<Arc<MemorySource>>>,
    fast_reg: bool,
    destroyed: AtomicBool,
}

impl SoftMr {
    /// Records the key a posted REG_MR gives the MR (the handle follows the
    /// last posted registration, as `ib_update_fast_reg_key` would).
    pub(crate) fn set_key(&self, key: u32, access: AccessFlags) {
        self.lkey.store(key, Ordering::Release);
        self.rkey.store(key, Ordering::Release);
        self.access.store(access.bits(), Ordering::Release);
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        let _ = MrOps::dereg(self);
    }
}

impl MrOps for SoftMr {
    fn lkey(&self) -> u32 {
        self.lkey.load(Ordering::Acquire)
    }

    fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    fn addr(&self) -> u64 {
        self.iova.load(Ordering::Acquire)
    }

    fn length(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn access(&self) -> AccessFlags {
        AccessFlags::from_bits_retain(self.access.load(Ordering::Acquire))
    }

    fn memory(&self) -> Option<Arc<MemorySource>> {
        lock(&self.memory).clone()
    }

    fn rereg(
        &self,
        flags: ReregFlags,
        pd: Option<&Arc<dyn PdOps>>,
        memory: Option<MemorySource>,
        access: AccessFlags,
    ) -> Result<()> {
        if flags.is_empty() || !ReregFlags::all().contains(flags) {
            return Err(verr!(
                ReregMr,
                InvalidArgument,
                "rereg flags {flags:?} are empty or unknown"
            ));
        }
        if self.fast_reg {
            return Err(verr!(
                ReregMr,
                InvalidArgument,
                "fast-registration MRs cannot be re-registered"
            ));
        }
        let new_pd = if flags.contains(ReregFlags::CHANGE_PD) {
            let pd = pd.ok_or_else(|| verr!(ReregMr, InvalidArgument, "CHANGE_PD needs a PD"))?;
            let pd = pd
                .clone()
                .into_any_arc()
                .downcast::<SoftPd>()
                .map_err(|_| verr!(ReregMr, InvalidArgument, "the PD belongs to another backend"))?;
            if !Arc::ptr_eq(&pd.ctx.dev, &self.dev) {
                return Err(verr!(ReregMr, InvalidArgument, "the PD belongs to another device"));
            }
            Some(pd)
        } else {
            None
        };
        let new_memory = if flags.contains(ReregFlags::CHANGE_TRANSLATION) {
            let m = memory.ok_or_else(|| verr!(ReregMr, InvalidArgument, "CHANGE_TRANSLATION needs the new memory"))?;
            Some(Arc::new(m))
        } else {
            None
        };
        let new_access = flags.contains(ReregFlags::CHANGE_ACCESS).then_some(access);
        let lkey = self.lkey();
        let pd_id = new_pd.as_ref().map(|p| p.id);
        let mem = new_memory.clone();
        let (l, r) = self.dev.with_core(|c, _| c.rereg_mr(lkey, pd_id, new_access, mem))?;
        self.lkey.store(l, Ordering::Release);
        self.rkey.store(r, Ordering::Release);
        if let Some(a) = new_access {
            self.access.store(a.bits(), Ordering::Release);
        }
        if let Some(p) = new_pd {
            *lock(&self.pd) = p;
        }
        if let Some(m) = new_memory {
            self.iova.store(m.addr(), Ordering::Release);
            self.len.store(m.len() as u64, Ordering::Release);
            *lock(&self.memory) = Some(m);
        }
        Ok(())
    }

    fn map_pages(&self, sgl: &[Sge<'_>], page_size: u32) -> Result<usize> {
        if !self.fast_reg {
            return Err(verr!(MapMrPages, InvalidArgument, "not a fast-registration MR"));
        }
        let list: Vec<(u64, u32, u32)> = sgl.iter().map(|s| (s.addr(), s.length(), s.lkey())).collect();
        let key = self.lkey();
        let (iova, len, n) = self.dev.with_core(|c, _| c.map_mr_pages(key, &list, page_size))?;
        self.iova.store(iova, Ordering::Release);
        self.len.store(len, Ordering::Release);
        Ok(n)
    }

    fn dereg(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let lkey = self.lkey();
        self.dev.with_core(|c, _| c.dereg_mr(lkey))?;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
}

/// A memory window.
pub(crate) struct SoftMw {
    pd: Arc<SoftPd>,
    key: AtomicU32,
    mw_type: MwType,
    destroyed: AtomicBool,
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        let _ = MwOps::dealloc(self);
    }
}

impl MwOps for SoftMw {
    fn rkey(&self) -> u32 {
        self.key.load(Ordering::Acquire)
    }

    fn mw_type(&self) -> MwType {
        self.mw_type
    }

    fn dealloc(&self) -> Result<()> {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let key = self.rkey();
        self.pd.ctx.dev.with_core(|c, _| c.dealloc_mw(key))
    }
}

/// A completion event channel: an eventfd (semaphore mode) with one count
/// per pending event, and the queue of `(CQ id, CQ context)` behind it.
/// Each event handed out counts as unacknowledged on its CQ until
/// `ack_cq_events`; a CQ with unacknowledged events cannot be destroyed
/// (`EBUSY`), as `ibv_destroy_cq` would otherwise race with a consumer
/// still using the event.
pub(crate) struct SoftCompChannel {
    dev: Arc<DeviceShared>,
    pending: Mutex<VecDeque<(u32, u64)>>,
    /// CQ id → events handed out and not yet acknowledged.
    unacked: Mutex<HashMap<u32, Arc<AtomicU32>>>,
    fd: EventFd,
    /// What the application registers (see [`pollable`]).
    poll_fd: OnceLock<RawFd>,
    poll_set: OnceLock<OwnedFd>,
    users: AtomicU32,
}

impl SoftCompChannel {
    fn post(&self, cq: u32, context: u64) {
        lock(&self.pending).push_back((cq, context));
        self.fd.post();
    }

    /// Forgets a destroyed CQ: its undelivered events are dropped (with
    /// their eventfd counts, so the descriptor stays exact).
    fn forget(&self, cq: u32) {
        lock(&self.unacked).remove(&cq);
        let mut pending = lock(&self.pending);
        let before = pending.len();
        pending.retain(|&(id, _)| id != cq);
        for _ in pending.len()..before {
            self.fd.try_take();
        }
    }
}

impl CompChannelOps for SoftCompChannel {
    fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u64>> {
        let start = Instant::now();
        loop {
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let got = wait_driving(&self.dev, &self.fd, left, || self.fd.try_take());
            if !got {
                return Ok(None);
            }
            let Some((cq, context)) = lock(&self.pending).pop_front() else {
                continue;
            };
            if let Some(n) = lock(&self.unacked).get(&cq) {
                n.fetch_add(1, Ordering::AcqRel);
                return Ok(Some(context));
            }
        }
    }

    fn fd(&self) -> Option<std::os::fd::RawFd> {
        Some(pollable(&self.dev, &self.fd, &self.poll_fd, &self.poll_set))
    }

    fn destroy(&self) -> Result<()> {
        let n = self.users.load(Ordering::Acquire);
        if n > 0 {
            return Err(verr!(DestroyCompChannel, Busy, "{n} CQ(s) still use this channel"));
        }
        Ok(())
    }
}

/// A completion queue.
pub(crate) struct SoftCq {
    ctx: Arc<SoftContext>,
    id: CqId,
    capacity: AtomicU32,
    context: u64,
    channel: Option<Arc<SoftCompChannel>>,
    /// Channel events of this CQ handed out and not acknowledged.
    unacked: Arc<AtomicU32>,
    destroyed: AtomicBool,
}

impl Drop for SoftCq {
    fn drop(&mut self) {
        // The last reference is gone: nobody can acknowledge any more.
        let _ = self.destroy_inner(true);
    }
}

impl SoftCq {
    fn destroy_inner(&self, force: bool) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let unacked = self.unacked.load(Ordering::Acquire);
        if unacked > 0 && !force {
            return Err(verr!(
                DestroyCq,
                Busy,
                "{unacked} completion event(s) of this CQ were not acknowledged (ack_cq_events)"
            ));
        }
        self.ctx.dev.with_core(|c, _| c.destroy_cq(self.id))?;
        self.destroyed.store(true, Ordering::Release);
        if let Some(ch) = &self.channel {
            ch.users.fetch_sub(1, Ordering::AcqRel);
            lock(&self.ctx.channels).remove(&self.id.0);
            ch.forget(self.id.0);
        }
        Ok(())
    }
}

impl CqOps for SoftCq {
    #[inline]
    fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        // Inline mode: polling is what reads a network link.
        let r = self.ctx.dev.poll_with(|c, _| c.poll_cq(self.id, wc));
        if matches!(r, Ok(n) if n > 0) {
            crate::soft::probe::mark(crate::soft::probe::Point::PollHit);
        }
        r
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.ctx.dev.with_core(|c, _| c.req_notify_cq(self.id, solicited_only))
    }

    fn resize(&self, cqe: u32) -> Result<u32> {
        let n = self.ctx.dev.with_core(|c, _| c.resize_cq(self.id, cqe))?;
        self.capacity.store(n, Ordering::Release);
        Ok(n)
    }

    fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Acquire)
    }

    fn ack_events(&self, n: u32) {
        // Acknowledging more than was handed out is a caller bug that
        // libibverbs does not catch either; saturate rather than wrap.
        let _ = self
            .unacked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(n)));
    }

    fn context(&self) -> u64 {
        self.context
    }

    fn destroy(&self) -> Result<()> {
        self.destroy_inner(false)
    }
}

/// A queue pair.
pub(crate) struct SoftQp {
    pd: Arc<SoftPd>,
    _send_cq: Arc<SoftCq>,
    _recv_cq: Arc<SoftCq>,
    _srq: Option<Arc<SoftSrq>>,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    destroyed: AtomicBool,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let _ = QpOps::destroy(self);
    }
}

impl SoftQp {
    /// Handles follow posted registrations and binds (ibverbs providers
    /// update `mw->rkey` at post time): `posted` are WRs that were posted.
    #[inline]
    fn follow_keys(posted: &[SendWr<'_>]) {
        for wr in posted {
            match wr.op {
                SendOp::RegMr { mr, key, access } => {
                    if let Some(m) = mr.ops().as_ref().as_any().downcast_ref::<SoftMr>() {
                        m.set_key(key, access);
                    }
                }
                SendOp::BindMw { mw, rkey, .. } => {
                    if let Some(w) = mw.ops().as_ref().as_any().downcast_ref::<SoftMw>() {
                        w.key.store(rkey, Ordering::Release);
                    }
                }
                _ => {}
            }
        }
    }
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.pd
            .ctx
            .dev
            .with_core(|c, now| c.modify_qp(now, self.qpn, attr, mask))
    }

    fn query(&self) -> Result<QpAttr> {
        self.pd.ctx.dev.with_core(|c, _| c.query_qp(self.qpn))
    }

    #[inline]
    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        crate::soft::probe::mark(crate::soft::probe::Point::PostSend);
        let r = self
            .pd
            .ctx
            .dev
            .with_core_eager(|c, now, egress| c.post_send_eager(now, self.qpn, wrs, egress));
        let posted = match &r {
            Ok(()) => wrs.len(),
            Err(e) => e.index,
        };
        Self::follow_keys(&wrs[..posted]);
        r
    }

    fn post_send_all(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        crate::soft::probe::mark(crate::soft::probe::Point::PostSend);
        let r = self.pd.ctx.dev.with_core(|c, now| c.post_send_all(now, self.qpn, wrs));
        if r.is_ok() {
            Self::follow_keys(wrs);
        }
        r
    }

    #[inline]
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        crate::soft::probe::mark(crate::soft::probe::Point::PostRecv);
        self.pd.ctx.dev.post_recv(self.qpn, wrs)
    }

    fn bind_mw(&self, mw: &Arc<dyn MwOps>, wr_id: u64, bind: &MwBindInfo<'_>, flags: SendFlags) -> Result<u32> {
        let w = soft_of::<SoftMw>(mw.as_ref(), "memory window", crate::verbs::Verb::BindMw)?;
        if w.mw_type != MwType::Type1 {
            return Err(verr!(
                BindMw,
                InvalidArgument,
                "ibv_bind_mw binds type 1 windows; post BIND_MW for type 2"
            ));
        }
        let mw_key = w.rkey();
        let mr_key = bind.mr.lkey();
        let signaled = flags.contains(SendFlags::SIGNALED);
        let new = self.pd.ctx.dev.with_core(|c, now| {
            c.bind_mw_type1(
                now,
                self.qpn,
                mw_key,
                mr_key,
                bind.addr,
                bind.length,
                bind.access,
                wr_id,
                signaled,
            )
        })?;
        w.key.store(new, Ordering::Release);
        Ok(new)
    }

    fn destroy(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        // The ACKs this device holds back for coalescing (some may be the
        // last this QP owes its peer) leave now.
        self.pd.ctx.dev.with_core_flushing(|c, _| c.destroy_qp(self.qpn))?;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
}

/// A shared receive queue.
pub(crate) struct SoftSrq {
    pd: Arc<SoftPd>,
    id: SrqId,
    destroyed: AtomicBool,
}

impl Drop for SoftSrq {
    fn drop(&mut self) {
        let _ = SrqOps::destroy(self);
    }
}

impl SrqOps for SoftSrq {
    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.pd.ctx.dev.with_core(|c, _| c.modify_srq(self.id, attr, mask))
    }

    fn query(&self) -> Result<SrqAttr> {
        self.pd.ctx.dev.with_core(|c, _| c.query_srq(self.id))
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.pd.ctx.dev.with_core_local(|c| c.post_srq_recv(self.id, wrs))
    }

    fn destroy(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.pd.ctx.dev.with_core(|c, _| c.destroy_srq(self.id))?;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
}

/// An address handle.
pub(crate) struct SoftAh {
    pd: Arc<SoftPd>,
    id: AhId,
    attr: AhAttr,
    destroyed: AtomicBool,
}

impl Drop for SoftAh {
    fn drop(&mut self) {
        let _ = AhOps::destroy(self);
    }
}

impl AhOps for SoftAh {
    fn attr(&self) -> AhAttr {
        self.attr
    }

    fn destroy(&self) -> Result<()> {
        if self.destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.pd.ctx.dev.with_core(|c, _| c.destroy_ah(self.id))?;
        self.destroyed.store(true, Ordering::Release);
        Ok(())
    }
}
