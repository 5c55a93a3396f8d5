//! The connection manager's shared state, its agent thread, and the CM
//! protocol (IBTA ch. 12 state machine, as rdma_cm drives it).
//!
//! Locking: one mutex over every id ([`State`]). MADs are never sent with
//! it held: handlers collect them ([`Out`]) and the caller sends after
//! unlocking, because sending drives the receiving device (in-process
//! links), whose GSI sink queues the MAD for this agent ([`Inbox`], its own
//! lock). Events go into channels (their own locks) under the state lock.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use super::channel::ChannelInner;
use super::mad::{self, rej, CmMsg, CmaHdr, Ids, MsgRef};
use super::{
    gid_of, CmConfig, CmCounters, CmEvent, CmEventKind, ConnParam, Error, EventChannel, FaultAction, PortSpace, Result,
    UdParam, UDP_QKEY,
};
use crate::soft::engine::DeviceShared;
use crate::soft::engine::EngineMode;
use crate::soft::proto::gsi::{GsiMad, GsiSink, MAD_LEN};
use crate::subsystem::{
    AddressChange, Client, ClientId, ClientScope, CmHook, CmHookId, DeviceRef, Generation, NamespaceId, NetnsMode,
    RemovalReason, Subsystem, WeakNamespace,
};
use crate::verbs::{AccessFlags, AhAttr, Context, Mtu, Qp, QpAttr, QpAttrMask, QpState, QpType};

/// First port handed out to ids that bind port 0.
const EPHEMERAL_FIRST: u16 = 32768;
/// Last such port.
const EPHEMERAL_LAST: u16 = 60999;
/// How long the agent sleeps at most (namespace deletions are checked at
/// this pace).
const TICK: Duration = Duration::from_millis(20);
/// Most MADs queued for the agent; more are dropped (and counted), as a
/// full receive queue drops them.
const INBOX_CAP: usize = 4096;

/// An id's state (rdma_cm's and the IBTA CM's, merged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdState {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active: REQ sent (MRA may have extended the wait).
    ReqSent,
    /// Active: REP came to an id without a QP; waiting for `establish`.
    RepRcvd,
    /// Passive: REQ delivered, waiting for accept/reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    TimeWait,
    /// After time-wait, a reject or an error: only destroy is left.
    Done,
    SidrReqSent,
    SidrReqRcvd,
    Removed,
}

impl IdState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            IdState::Idle => "IDLE",
            IdState::AddrBound => "ADDR_BOUND",
            IdState::AddrResolved => "ADDR_RESOLVED",
            IdState::RouteResolved => "ROUTE_RESOLVED",
            IdState::Listen => "LISTEN",
            IdState::ReqSent => "REQ_SENT",
            IdState::RepRcvd => "REP_RCVD",
            IdState::ReqRcvd => "REQ_RCVD",
            IdState::RepSent => "REP_SENT",
            IdState::Established => "ESTABLISHED",
            IdState::DreqSent => "DREQ_SENT",
            IdState::TimeWait => "TIMEWAIT",
            IdState::Done => "DONE",
            IdState::SidrReqSent => "SIDR_REQ_SENT",
            IdState::SidrReqRcvd => "SIDR_REQ_RCVD",
            IdState::Removed => "DEVICE_REMOVED",
        }
    }
}

/// A device this CM can use.
pub(crate) struct Dev {
    pub(crate) dref: DeviceRef,
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) guid: u64,
    pub(crate) mtu: Mtu,
    /// Inline engine on a network link: the agent reads its link.
    pub(crate) drive: bool,
}

impl Dev {
    fn sgid_index(&self, ip: IpAddr) -> Option<u8> {
        let g = gid_of(ip);
        let soft = self.dref.soft_device()?;
        soft.gids().iter().position(|x| *x == g).map(|i| i as u8)
    }
}

/// A MAD to send once the state lock is released.
pub(crate) struct Out {
    shared: Arc<DeviceShared>,
    sgid: u8,
    dst: IpAddr,
    msg: CmMsg,
    mad: [u8; MAD_LEN],
}

/// One id.
pub(crate) struct Id {
    pub(crate) context: u64,
    pub(crate) chan: Arc<ChannelInner>,
    pub(crate) ps: PortSpace,
    pub(crate) ns: WeakNamespace,
    pub(crate) state: IdState,
    /// Local address and port (port 0: none yet).
    pub(crate) src: Option<SocketAddr>,
    /// Remote address and port.
    pub(crate) dst: Option<SocketAddr>,
    /// The device (name, generation) the id is bound to.
    pub(crate) dev: Option<(String, Generation)>,
    /// The listener a passive id came from.
    pub(crate) listener: Option<u64>,
    pub(crate) backlog: u32,
    pub(crate) qp: Option<Arc<Qp>>,
    pub(crate) ctx: Option<Context>,
    pub(crate) local_comm_id: u32,
    pub(crate) remote_comm_id: u32,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_psn: u32,
    pub(crate) local_psn: u32,
    /// The peer's address on the wire (its GID).
    pub(crate) peer: Option<IpAddr>,
    pub(crate) mtu: Mtu,
    /// The parameters of the request (passive) or of `connect` (active).
    pub(crate) param: ConnParam,
    pub(crate) remote_qkey: u32,
    /// Retransmission: when, how many left, what.
    pub(crate) timer: Option<Instant>,
    pub(crate) retries_left: u8,
    pub(crate) last_sent: Option<CmMsg>,
    pub(crate) tid: u64,
    /// DEVICE_REMOVAL was delivered.
    pub(crate) removed: bool,
    /// The application destroyed it; it lingers for time-wait only.
    pub(crate) destroyed: bool,
    /// On a hardware device: the librdmacm id that does the work.
    #[cfg(feature = "hardware")]
    pub(crate) hw: Option<Arc<super::hw::HwId>>,
}

impl Id {
    pub(crate) fn new(ns: WeakNamespace, chan: Arc<ChannelInner>, ps: PortSpace, context: u64) -> Id {
        Id {
            context,
            chan,
            ps,
            ns,
            state: IdState::Idle,
            src: None,
            dst: None,
            dev: None,
            listener: None,
            backlog: 0,
            qp: None,
            ctx: None,
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: 0,
            remote_psn: 0,
            local_psn: 0,
            peer: None,
            mtu: Mtu::Mtu1024,
            param: ConnParam::default(),
            remote_qkey: 0,
            timer: None,
            retries_left: 0,
            last_sent: None,
            tid: 0,
            removed: false,
            destroyed: false,
            #[cfg(feature = "hardware")]
            hw: None,
        }
    }
}

/// Everything under the state lock.
pub(crate) struct State {
    pub(crate) ids: HashMap<u64, Id>,
    pub(crate) next_key: u64,
    pub(crate) devices: HashMap<String, Dev>,
    pub(crate) by_comm: HashMap<u32, u64>,
    pub(crate) rng: u64,
    pub(crate) next_port: u16,
    pub(crate) counters: CmCounters,
    /// A MAD the fault injector holds back (reordering).
    pub(crate) delayed: Option<Out>,
    /// The subsystem's hardware devices (their ids run on librdmacm).
    #[cfg(feature = "hardware")]
    pub(crate) hw_devices: HashMap<String, DeviceRef>,
}

impl State {
    pub(crate) fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A fresh, nonzero local communication ID, registered for `key`.
    pub(crate) fn new_comm_id(&mut self, key: u64) -> u32 {
        loop {
            let c = self.random() as u32;
            if c != 0 && !self.by_comm.contains_key(&c) {
                self.by_comm.insert(c, key);
                return c;
            }
        }
    }

    /// Whether `addr` is free in `ns`/`ps` (a wildcard conflicts with
    /// everything on its port).
    pub(crate) fn port_free(&self, ns: NamespaceId, ps: PortSpace, addr: SocketAddr, except: u64) -> bool {
        !self.ids.iter().any(|(k, id)| {
            *k != except
                && !id.destroyed
                && id.ps == ps
                && id.ns.id() == ns
                && id.listener.is_none()
                && id.src.is_some_and(|s| {
                    s.port() == addr.port()
                        && (s.ip() == addr.ip() || s.ip().is_unspecified() || addr.ip().is_unspecified())
                })
        })
    }

    /// An unused ephemeral port in `ns`/`ps` for `ip`.
    pub(crate) fn ephemeral(&mut self, ns: NamespaceId, ps: PortSpace, ip: IpAddr, except: u64) -> Option<u16> {
        for _ in 0..=(EPHEMERAL_LAST - EPHEMERAL_FIRST) {
            let p = self.next_port;
            self.next_port = if p >= EPHEMERAL_LAST { EPHEMERAL_FIRST } else { p + 1 };
            if self.port_free(ns, ps, SocketAddr::new(ip, p), except) {
                return Some(p);
            }
        }
        None
    }

    fn dev_of(&self, id: &Id) -> Option<&Dev> {
        let (name, gen) = id.dev.as_ref()?;
        self.devices.get(name).filter(|d| d.dref.generation() == *gen)
    }

    /// Builds a MAD to the id's peer from its device.
    pub(crate) fn out_for(&self, key: u64, msg: CmMsg) -> Option<Out> {
        let id = self.ids.get(&key)?;
        let dev = self.dev_of(id)?;
        let src = id.src?.ip();
        let peer = id.peer?;
        let sgid = dev.sgid_index(src)?;
        Some(Out {
            shared: dev.shared.clone(),
            sgid,
            dst: peer,
            mad: msg.encode(id.tid),
            msg,
        })
    }

    /// An event about id `key`.
    pub(crate) fn event(&self, key: u64, kind: CmEventKind) -> Option<CmEvent> {
        let id = self.ids.get(&key)?;
        Some(CmEvent {
            kind,
            id: key,
            context: id.context,
            listener: if id.state == IdState::Listen {
                Some(key)
            } else {
                id.listener
            },
            status: 0,
            private_data: Vec::new(),
            conn: None,
            ud: None,
            namespace: id.ns.id(),
            device: id.dev.as_ref().map(|d| d.0.clone()),
            generation: id.dev.as_ref().map(|d| d.1),
            peer: id.dst,
            new_id: None,
        })
    }

    pub(crate) fn post(&self, key: u64, ev: CmEvent) {
        if let Some(id) = self.ids.get(&key) {
            if !id.destroyed {
                id.chan.push(ev);
                return;
            }
        }
        // Nobody to tell (a destroyed id). An event carrying a new id
        // would reject it in its drop, which takes the state lock held
        // here: forget the id instead (the listener is gone, so no such
        // event is ever made; this is a guard) and drop the rest.
        let mut ev = ev;
        ev.new_id = None;
        drop(ev);
    }

    pub(crate) fn post_kind(&self, key: u64, kind: CmEventKind) {
        if let Some(ev) = self.event(key, kind) {
            self.post(key, ev);
        }
    }

    /// Arms the id's retransmission timer for `msg`, already sent once.
    pub(crate) fn arm(&mut self, key: u64, msg: CmMsg, wait: Duration, retries: u8) {
        if let Some(id) = self.ids.get_mut(&key) {
            id.last_sent = Some(msg);
            id.timer = Some(Instant::now() + wait);
            id.retries_left = retries;
        }
    }
}

/// MADs the devices' GSI sinks handed over, for the agent.
#[derive(Debug, Default)]
struct Inbox {
    q: Mutex<VecDeque<(String, Generation, GsiMad)>>,
    dropped: std::sync::atomic::AtomicU64,
}

/// The state of one CM, shared by its handles, ids, agent, hook and client.
pub(crate) struct Inner {
    pub(crate) sub: Arc<Subsystem>,
    pub(crate) cfg: CmConfig,
    st: Mutex<State>,
    inbox: Inbox,
    wake: OwnedFd,
    stop: AtomicBool,
    /// The handles' owner, for the new ids of connection requests.
    pub(crate) owner: OnceLock<Weak<Shared>>,
    /// librdmacm's event channel and thread, once an id needed them.
    #[cfg(feature = "hardware")]
    pub(crate) hw: Mutex<Option<Arc<super::hw::HwCm>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cm").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// What `Cm` handles and ids hold: dropping the last one stops the agent.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) inner: Arc<Inner>,
    agent: Mutex<Option<JoinHandle<()>>>,
    agent_id: OnceLock<ThreadId>,
    client: Option<ClientId>,
    hook: CmHookId,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake();
        if let Some(c) = self.client {
            let _ = self.inner.sub.unregister_client(c);
        }
        self.inner.sub.remove_cm_hook(self.hook);
        let handle = self.agent.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if self.agent_id.get() != Some(&std::thread::current().id()) {
                let _ = h.join();
            }
        }
        // Every device's QP1 goes back to "unknown QP".
        let devs: Vec<Arc<DeviceShared>> = self.inner.lock().devices.drain().map(|(_, d)| d.shared).collect();
        for d in devs {
            d.set_gsi_sink(None);
        }
        // Ids and events in channels may refer to this CM's state; dropping
        // them now breaks the channel -> event -> id cycle.
        let ids: Vec<Id> = self.inner.lock().ids.drain().map(|(_, id)| id).collect();
        drop(ids);
    }
}

#[derive(Debug)]
struct Sink {
    inner: Weak<Inner>,
    dev: String,
    gen: Generation,
}

impl GsiSink for Sink {
    fn receive(&self, mad: GsiMad) {
        let Some(inner) = self.inner.upgrade() else { return };
        {
            let mut q = inner.inbox.q.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() >= INBOX_CAP {
                inner.inbox.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            q.push_back((self.dev.clone(), self.gen, mad));
        }
        inner.wake();
    }
}

struct CmClient(Weak<Inner>);

impl Client for CmClient {
    fn add(&self, d: &DeviceRef) -> crate::verbs::Result<()> {
        if let Some(inner) = self.0.upgrade() {
            inner.add_device(d);
        }
        Ok(())
    }

    fn remove(&self, d: &DeviceRef, _why: RemovalReason) {
        if let Some(inner) = self.0.upgrade() {
            inner.remove_device(d);
        }
    }
}

struct Hook(Weak<Inner>);

impl CmHook for Hook {
    fn device_removal(&self, d: &DeviceRef, _why: RemovalReason) {
        if let Some(inner) = self.0.upgrade() {
            inner.device_removal(d.name(), d.generation());
        }
    }

    fn address_change(&self, d: &DeviceRef, addr: IpAddr, change: AddressChange) {
        if let Some(inner) = self.0.upgrade() {
            inner.address_change(d, addr, change);
        }
    }
}

impl Shared {
    pub(crate) fn start(sub: Arc<Subsystem>, cfg: CmConfig) -> Result<Arc<Shared>> {
        let wake = crate::sys::eventfd(libc::EFD_NONBLOCK).map_err(|e| Error::Io(e.kind()))?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (std::process::id() as u64) << 32;
        let inner = Arc::new(Inner {
            sub: sub.clone(),
            cfg,
            st: Mutex::new(State {
                ids: HashMap::new(),
                next_key: 1,
                devices: HashMap::new(),
                by_comm: HashMap::new(),
                rng: seed,
                next_port: EPHEMERAL_FIRST + (seed % 20000) as u16,
                counters: CmCounters::default(),
                delayed: None,
                #[cfg(feature = "hardware")]
                hw_devices: HashMap::new(),
            }),
            inbox: Inbox::default(),
            wake,
            stop: AtomicBool::new(false),
            owner: OnceLock::new(),
            #[cfg(feature = "hardware")]
            hw: Mutex::new(None),
        });
        let hook = sub.add_cm_hook(Arc::new(Hook(Arc::downgrade(&inner))));
        let client = match sub.register_client(
            "softverbs-cm",
            ClientScope::All,
            Arc::new(CmClient(Arc::downgrade(&inner))),
        ) {
            Ok(c) => c,
            Err(e) => {
                sub.remove_cm_hook(hook);
                return Err(e.into());
            }
        };
        let agent_inner = inner.clone();
        let handle = std::thread::Builder::new()
            .name("softverbs-cm".into())
            .spawn(move || agent_inner.run())
            .map_err(|e| Error::Io(e.kind()));
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                let _ = sub.unregister_client(client);
                sub.remove_cm_hook(hook);
                return Err(e);
            }
        };
        let agent_id = OnceLock::new();
        let _ = agent_id.set(handle.thread().id());
        let shared = Arc::new(Shared {
            inner,
            agent: Mutex::new(Some(handle)),
            agent_id,
            client: Some(client),
            hook,
        });
        let _ = shared.inner.owner.set(Arc::downgrade(&shared));
        Ok(shared)
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    pub(crate) fn counters(&self) -> CmCounters {
        let mut c = self.lock().counters;
        c.rx_dropped += self.inbox.dropped.load(Ordering::Relaxed);
        c
    }

    pub(crate) fn id_states(&self) -> Vec<(u64, &'static str)> {
        let st = self.lock();
        let mut v: Vec<_> = st.ids.iter().map(|(k, id)| (*k, id.state.name())).collect();
        v.sort();
        v
    }

    pub(crate) fn id_count(&self) -> usize {
        self.lock().ids.len()
    }

    pub(crate) fn create_id(&self, ns: WeakNamespace, chan: &EventChannel, ps: PortSpace, context: u64) -> u64 {
        let mut st = self.lock();
        let key = st.next_key;
        st.next_key += 1;
        st.ids.insert(key, Id::new(ns, chan.inner.clone(), ps, context));
        key
    }

    fn add_device(self: &Arc<Self>, d: &DeviceRef) {
        let Some(soft) = d.soft_device() else {
            // A hardware device: the kernel's rdma_cm owns its QP1; ids on
            // it run on librdmacm.
            #[cfg(feature = "hardware")]
            self.lock().hw_devices.insert(d.name().to_string(), d.clone());
            return;
        };
        let shared = soft.shared().clone();
        let sink = Arc::new(Sink {
            inner: Arc::downgrade(self),
            dev: d.name().to_string(),
            gen: d.generation(),
        });
        if !shared.set_gsi_sink(Some(sink)) {
            // Another CM owns this device's QP1.
            return;
        }
        let withdrawn = d.withdrawn_addrs();
        let dev = Dev {
            dref: d.clone(),
            addrs: shared
                .addrs()
                .iter()
                .filter(|a| !withdrawn.contains(a))
                .copied()
                .collect(),
            guid: soft.attr().node_guid.0,
            mtu: soft.port_attr().active_mtu,
            drive: matches!(shared.mode(), EngineMode::Inline) && !shared.poll_fds().is_empty(),
            shared,
        };
        self.lock().devices.insert(d.name().to_string(), dev);
        self.wake();
    }

    fn remove_device(&self, d: &DeviceRef) {
        let gone = {
            let mut st = self.lock();
            #[cfg(feature = "hardware")]
            if st.hw_devices.get(d.name()).is_some_and(|x| x.same_instance(d)) {
                st.hw_devices.remove(d.name());
            }
            match st.devices.get(d.name()) {
                Some(x) if x.dref.same_instance(d) => st.devices.remove(d.name()),
                _ => None,
            }
        };
        if let Some(dev) = gone {
            dev.shared.set_gsi_sink(None);
        }
    }

    /// The subsystem's CM hook: every id on the device gets DEVICE_REMOVAL
    /// once; its timers stop; nothing more is sent for it.
    pub(crate) fn device_removal(&self, name: &str, gen: Generation) {
        let mut st = self.lock();
        let keys: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| id.dev.as_ref().is_some_and(|(n, g)| n == name && *g == gen))
            .map(|(k, _)| *k)
            .collect();
        let mut contexts = Vec::new();
        for key in keys {
            Self::remove_one(&mut st, key);
            // The id's own handle on the device's context goes now, so the
            // removal waits only for what the application holds.
            contexts.extend(st.ids.get_mut(&key).and_then(|id| id.ctx.take()));
        }
        drop(st);
        drop(contexts);
    }

    /// The subsystem's CM hook for addresses: `addr` left device `d` (or
    /// came to it, leaving any other device of its namespace that had it).
    /// The CM's address table follows, so later binds and resolutions see
    /// the change, and every id bound through `addr` on a device that lost
    /// it gets one ADDR_CHANGE. A report that changes nothing (the address
    /// was already gone) delivers nothing.
    pub(crate) fn address_change(&self, d: &DeviceRef, addr: IpAddr, change: AddressChange) {
        let shared_mode = self.sub.mode() == NetnsMode::Shared;
        let mut st = self.lock();
        let mut lost: Vec<(String, Generation)> = Vec::new();
        for (name, dev) in st.devices.iter_mut() {
            let this = dev.dref.same_instance(d);
            let affected = match change {
                AddressChange::Removed => this,
                AddressChange::Added => !this && (shared_mode || dev.dref.namespace() == d.namespace()),
            };
            if affected && dev.addrs.contains(&addr) {
                dev.addrs.retain(|a| *a != addr);
                lost.push((name.clone(), dev.dref.generation()));
            }
        }
        if change == AddressChange::Added {
            // Usable here only through a GID the device has: a soft
            // device's GID table is fixed for its life.
            if let Some(dev) = st.devices.get_mut(d.name()).filter(|x| x.dref.same_instance(d)) {
                if !dev.addrs.contains(&addr) && dev.sgid_index(addr).is_some() {
                    dev.addrs.push(addr);
                }
            }
        }
        if lost.is_empty() {
            return;
        }
        let mut keys: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| {
                !id.removed
                    && !id.destroyed
                    && id.src.is_some_and(|s| s.ip() == addr)
                    && id.dev.as_ref().is_some_and(|d| lost.contains(d))
            })
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        for k in keys {
            st.post_kind(k, CmEventKind::AddrChange);
        }
    }

    pub(crate) fn remove_one(st: &mut State, key: u64) {
        let Some(id) = st.ids.get_mut(&key) else { return };
        if id.removed {
            return;
        }
        id.removed = true;
        id.timer = None;
        id.state = IdState::Removed;
        if id.destroyed {
            let c = id.local_comm_id;
            st.ids.remove(&key);
            st.by_comm.remove(&c);
            return;
        }
        st.post_kind(key, CmEventKind::DeviceRemoval);
    }

    /// Sends MADs (outside the state lock), through the fault injector.
    pub(crate) fn send(&self, outs: Vec<Out>) {
        for o in outs {
            let action = match &self.cfg.fault {
                Some(f) => f.outgoing(&o.msg, o.dst),
                None => FaultAction::Pass,
            };
            match action {
                FaultAction::Pass => self.send_one(&o, 1),
                FaultAction::Duplicate => self.send_one(&o, 2),
                FaultAction::Drop => self.lock().counters.fault_drops += 1,
                FaultAction::Delay => {
                    let prev = self.lock().delayed.replace(o);
                    if let Some(p) = prev {
                        self.send_one(&p, 1);
                    }
                }
            }
        }
    }

    fn send_one(&self, o: &Out, copies: usize) {
        for _ in 0..copies {
            if o.shared.gsi_send(o.sgid, o.dst, &o.mad) {
                self.lock().counters.tx_mads += 1;
            }
        }
        let held = {
            let mut st = self.lock();
            if st.delayed.as_ref().is_some_and(|d| !std::ptr::eq(d, o)) {
                st.delayed.take()
            } else {
                None
            }
        };
        if let Some(h) = held {
            if h.shared.gsi_send(h.sgid, h.dst, &h.mad) {
                self.lock().counters.tx_mads += 1;
            }
        }
    }

    /// The agent thread.
    fn run(self: Arc<Self>) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !self.stop.load(Ordering::SeqCst) {
            // What to wait on: the wake-up descriptor and the links of
            // inline devices (nobody else reads them while the application
            // is not in a verb).
            let (timeout, drive) = {
                let st = self.lock();
                let now = Instant::now();
                let next = st.ids.values().filter_map(|i| i.timer).min();
                let t = next.map_or(TICK, |n| n.saturating_duration_since(now).min(TICK));
                let drive: Vec<Arc<DeviceShared>> = st
                    .devices
                    .values()
                    .filter(|d| d.drive)
                    .map(|d| d.shared.clone())
                    .collect();
                (t, drive)
            };
            fds.clear();
            fds.push(libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            for d in &drive {
                for fd in d.poll_fds() {
                    fds.push(libc::pollfd {
                        fd: *fd,
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
            }
            let ms = timeout.as_millis().clamp(0, 1000) as i32;
            // SAFETY: `fds` is a live array of `fds.len()` pollfds.
            unsafe {
                libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms.max(1));
            }
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 from our own
            // non-blocking eventfd.
            unsafe {
                libc::read(self.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
            }
            if fds[1..].iter().any(|p| p.revents != 0) {
                for d in &drive {
                    d.drive();
                }
            }
            drop(drive);
            self.turn();
        }
    }

    /// One turn: received MADs, due timers, deleted namespaces.
    pub(crate) fn turn(&self) {
        loop {
            let batch: Vec<(String, Generation, GsiMad)> = {
                let mut q = self.inbox.q.lock().unwrap_or_else(|p| p.into_inner());
                q.drain(..).collect()
            };
            if batch.is_empty() {
                break;
            }
            for (dev, gen, m) in batch {
                let outs = self.handle_mad(&dev, gen, &m);
                self.send(outs);
            }
        }
        let outs = self.timers();
        self.send(outs);
        self.namespaces();
    }

    fn namespaces(&self) {
        let mut st = self.lock();
        let keys: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| !id.removed && !id.ns.is_alive())
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            Self::remove_one(&mut st, k);
        }
    }

    fn timers(&self) -> Vec<Out> {
        let mut st = self.lock();
        let now = Instant::now();
        let due: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| id.timer.is_some_and(|t| t <= now))
            .map(|(k, _)| *k)
            .collect();
        let mut outs = Vec::new();
        let wait = self.cfg.response_duration();
        for key in due {
            let Some(id) = st.ids.get_mut(&key) else { continue };
            id.timer = None;
            let state = id.state;
            if state == IdState::TimeWait {
                id.state = IdState::Done;
                if id.destroyed {
                    let c = id.local_comm_id;
                    st.ids.remove(&key);
                    st.by_comm.remove(&c);
                } else {
                    st.post_kind(key, CmEventKind::TimewaitExit);
                }
                continue;
            }
            if id.retries_left > 0 {
                id.retries_left -= 1;
                id.timer = Some(now + wait);
                if let Some(msg) = id.last_sent.clone() {
                    st.counters.retransmits += 1;
                    outs.extend(st.out_for(key, msg));
                }
                continue;
            }
            // Out of retries.
            match state {
                IdState::ReqSent | IdState::RepSent | IdState::SidrReqSent => {
                    if state != IdState::SidrReqSent {
                        let (l, r) = (id.local_comm_id, id.remote_comm_id);
                        let msg = CmMsg::Rej(mad::Rej {
                            local_comm_id: l,
                            remote_comm_id: r,
                            message_rejected: if state == IdState::ReqSent {
                                MsgRef::Req
                            } else {
                                MsgRef::Rep
                            },
                            reason: rej::TIMEOUT,
                            private_data: Vec::new(),
                        });
                        outs.extend(st.out_for(key, msg));
                    }
                    let id = st.ids.get_mut(&key).expect("present");
                    id.state = IdState::Done;
                    qp_to_err(id);
                    if let Some(mut ev) = st.event(key, CmEventKind::Unreachable) {
                        ev.status = -libc::ETIMEDOUT;
                        st.post(key, ev);
                    }
                    if st.ids.get(&key).is_some_and(|i| i.destroyed) {
                        forget_id(&mut st, key);
                    }
                }
                IdState::DreqSent => {
                    // No DREP: the connection is down all the same.
                    enter_timewait(&mut st, key, self.cfg.timewait);
                    st.post_kind(key, CmEventKind::Disconnected);
                }
                _ => {}
            }
        }
        outs
    }

    /// Handles one received MAD; returns what to send.
    fn handle_mad(&self, dev: &str, gen: Generation, m: &GsiMad) -> Vec<Out> {
        let mut st = self.lock();
        st.counters.rx_mads += 1;
        let Ok((tid, msg)) = CmMsg::decode(&m.mad) else {
            st.counters.rx_dropped += 1;
            return Vec::new();
        };
        let Some(d) = st.devices.get(dev).filter(|d| d.dref.generation() == gen) else {
            st.counters.rx_dropped += 1;
            return Vec::new();
        };
        let ctx = Rx {
            dev: dev.to_string(),
            gen,
            ns: d.dref.namespace(),
            src: m.src,
            dst: m.dst,
            tid,
        };
        let mut outs = Vec::new();
        match msg {
            CmMsg::Req(r) => self.on_req(&mut st, &ctx, r, &mut outs),
            CmMsg::Rep(r) => self.on_rep(&mut st, &ctx, r, &mut outs),
            CmMsg::Rtu(r) => on_rtu(&mut st, &ctx, r),
            CmMsg::Rej(r) => on_rej(&mut st, &ctx, r),
            CmMsg::Mra(r) => self.on_mra(&mut st, &ctx, r),
            CmMsg::Dreq(r) => self.on_dreq(&mut st, &ctx, r, &mut outs),
            CmMsg::Drep(r) => self.on_drep(&mut st, &ctx, r),
            CmMsg::SidrReq(r) => self.on_sidr_req(&mut st, &ctx, r, &mut outs),
            CmMsg::SidrRep(r) => on_sidr_rep(&mut st, &ctx, r),
        }
        outs
    }

    /// A reply straight to the sender of a received MAD (REJ, DREP, MRA,
    /// SIDR_REP for which no id exists or is needed).
    fn reply(st: &State, rx: &Rx, msg: CmMsg) -> Option<Out> {
        let dev = st.devices.get(&rx.dev)?;
        let sgid = dev.sgid_index(rx.dst)?;
        Some(Out {
            shared: dev.shared.clone(),
            sgid,
            dst: rx.src,
            mad: msg.encode(rx.tid),
            msg,
        })
    }

    fn on_req(&self, st: &mut State, rx: &Rx, r: mad::Req, outs: &mut Vec<Out>) {
        // Duplicate: an id already has this (peer, remote comm ID).
        let dup = st
            .ids
            .iter()
            .find(|(_, id)| id.peer == Some(rx.src) && id.remote_comm_id == r.local_comm_id && id.listener.is_some())
            .map(|(k, id)| (*k, id.state));
        if let Some((key, state)) = dup {
            st.counters.dup_reqs += 1;
            let (l, rc) = {
                let id = &st.ids[&key];
                (id.local_comm_id, id.remote_comm_id)
            };
            match state {
                IdState::ReqRcvd => {
                    // The application has not answered yet: ask the peer
                    // to wait (MRA) instead of letting it give up.
                    let msg = CmMsg::Mra(mad::Mra {
                        local_comm_id: l,
                        remote_comm_id: rc,
                        message_mraed: MsgRef::Req,
                        service_timeout: self.cfg.response_timeout.saturating_add(2).min(31),
                    });
                    outs.extend(st.out_for(key, msg));
                }
                IdState::RepSent => {
                    if let Some(msg) = st.ids[&key].last_sent.clone() {
                        outs.extend(st.out_for(key, msg));
                    }
                }
                IdState::TimeWait => {
                    st.counters.stale_rejects += 1;
                    let msg = stale_rej(l, r.local_comm_id);
                    outs.extend(Self::reply(st, rx, msg));
                }
                _ => {}
            }
            return;
        }
        // Stale: a connection with this peer QP is up or in time-wait.
        let stale = st.ids.values().any(|id| {
            id.peer == Some(rx.src)
                && id.remote_qpn == r.local_qpn
                && matches!(id.state, IdState::Established | IdState::TimeWait | IdState::DreqSent)
        });
        if stale {
            st.counters.stale_rejects += 1;
            outs.extend(Self::reply(st, rx, stale_rej(0, r.local_comm_id)));
            return;
        }
        let reject = |reason: u16| {
            CmMsg::Rej(mad::Rej {
                local_comm_id: 0,
                remote_comm_id: r.local_comm_id,
                message_rejected: MsgRef::Req,
                reason,
                private_data: Vec::new(),
            })
        };
        let Some((ps, port)) = mad::split_service_id(r.service_id) else {
            outs.extend(Self::reply(st, rx, reject(rej::INVALID_SERVICE_ID)));
            return;
        };
        if PortSpace::from_number(ps) != Some(PortSpace::Tcp) {
            outs.extend(Self::reply(st, rx, reject(rej::INVALID_SERVICE_ID)));
            return;
        }
        let Some((hdr, user)) = CmaHdr::parse(&r.private_data) else {
            outs.extend(Self::reply(st, rx, reject(rej::INVALID_SERVICE_ID)));
            return;
        };
        let shared_mode = self.sub.mode() == NetnsMode::Shared;
        let Some(lkey) = find_listener(st, rx, PortSpace::Tcp, port, hdr.dst, shared_mode) else {
            outs.extend(Self::reply(st, rx, reject(rej::INVALID_SERVICE_ID)));
            return;
        };
        let pending = st
            .ids
            .values()
            .filter(|i| i.listener == Some(lkey) && i.state == IdState::ReqRcvd && !i.destroyed)
            .count();
        if pending >= st.ids[&lkey].backlog.max(1) as usize {
            // As a full SYN queue: drop; the peer sends the REQ again.
            st.counters.backlog_drops += 1;
            return;
        }
        let l = &st.ids[&lkey];
        let mut child = Id::new(l.ns.clone(), l.chan.clone(), PortSpace::Tcp, l.context);
        let local_mtu = st.devices.get(&rx.dev).map_or(Mtu::Mtu1024, |d| d.mtu);
        child.state = IdState::ReqRcvd;
        child.listener = Some(lkey);
        child.dev = Some((rx.dev.clone(), rx.gen));
        child.src = Some(SocketAddr::new(rx.dst, port));
        child.dst = Some(SocketAddr::new(hdr.src, hdr.src_port));
        child.peer = Some(rx.src);
        child.remote_comm_id = r.local_comm_id;
        child.remote_qpn = r.local_qpn;
        child.remote_psn = r.starting_psn;
        // This side's starting PSN, chosen now (as rdma_cm does at id
        // creation) so that `init_qp_attr` can give RTS before accept.
        child.local_psn = (st.random() as u32) & 0xff_ffff;
        child.tid = rx.tid;
        child.mtu = min_mtu(local_mtu, r.mtu);
        child.param = ConnParam {
            private_data: Vec::new(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            qp_num: r.local_qpn,
            srq: r.srq,
        };
        let key = st.next_key;
        st.next_key += 1;
        st.ids.insert(key, child);
        let c = st.new_comm_id(key);
        st.ids.get_mut(&key).expect("inserted").local_comm_id = c;
        if let Some(mut ev) = st.event(key, CmEventKind::ConnectRequest) {
            ev.listener = Some(lkey);
            ev.private_data = user.to_vec();
            ev.conn = Some(st.ids[&key].param.clone());
            ev.new_id = self.owner.get().map(|o| (key, o.clone()));
            st.post(lkey, ev);
        }
    }

    fn on_sidr_req(&self, st: &mut State, rx: &Rx, r: mad::SidrReq, outs: &mut Vec<Out>) {
        let dup = st
            .ids
            .iter()
            .find(|(_, id)| id.peer == Some(rx.src) && id.remote_comm_id == r.request_id && id.listener.is_some())
            .map(|(k, _)| *k);
        if let Some(key) = dup {
            st.counters.dup_reqs += 1;
            if let Some(msg) = st.ids[&key].last_sent.clone() {
                outs.extend(st.out_for(key, msg));
            }
            return;
        }
        let refuse = |status: u8| {
            CmMsg::SidrRep(mad::SidrRep {
                request_id: r.request_id,
                status,
                qpn: 0,
                service_id: r.service_id,
                qkey: 0,
                private_data: Vec::new(),
            })
        };
        let parsed = mad::split_service_id(r.service_id)
            .filter(|(ps, _)| PortSpace::from_number(*ps) == Some(PortSpace::Udp))
            .zip(CmaHdr::parse(&r.private_data));
        let Some(((_, port), (hdr, user))) = parsed else {
            outs.extend(Self::reply(st, rx, refuse(1)));
            return;
        };
        let shared_mode = self.sub.mode() == NetnsMode::Shared;
        let Some(lkey) = find_listener(st, rx, PortSpace::Udp, port, hdr.dst, shared_mode) else {
            outs.extend(Self::reply(st, rx, refuse(1)));
            return;
        };
        let l = &st.ids[&lkey];
        let mut child = Id::new(l.ns.clone(), l.chan.clone(), PortSpace::Udp, l.context);
        child.state = IdState::SidrReqRcvd;
        child.listener = Some(lkey);
        child.dev = Some((rx.dev.clone(), rx.gen));
        child.src = Some(SocketAddr::new(rx.dst, port));
        child.dst = Some(SocketAddr::new(hdr.src, hdr.src_port));
        child.peer = Some(rx.src);
        child.remote_comm_id = r.request_id;
        child.tid = rx.tid;
        let key = st.next_key;
        st.next_key += 1;
        st.ids.insert(key, child);
        if let Some(mut ev) = st.event(key, CmEventKind::ConnectRequest) {
            ev.listener = Some(lkey);
            ev.private_data = user.to_vec();
            ev.new_id = self.owner.get().map(|o| (key, o.clone()));
            st.post(lkey, ev);
        }
    }

    fn on_rep(&self, st: &mut State, rx: &Rx, r: mad::Rep, outs: &mut Vec<Out>) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            st.counters.rx_dropped += 1;
            return;
        };
        let state = st.ids[&key].state;
        match state {
            IdState::ReqSent => {}
            IdState::Established => {
                // Our RTU was lost: send it again.
                if let Some(msg) = st.ids[&key].last_sent.clone() {
                    outs.extend(st.out_for(key, msg));
                }
                return;
            }
            _ => return,
        }
        let id = st.ids.get_mut(&key).expect("found");
        id.timer = None;
        id.remote_comm_id = r.local_comm_id;
        id.remote_qpn = r.local_qpn;
        id.remote_psn = r.starting_psn;
        let conn = ConnParam {
            private_data: r.private_data.clone(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: id.param.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            qp_num: r.local_qpn,
            srq: r.srq,
        };
        if id.qp.is_none() {
            id.state = IdState::RepRcvd;
            if let Some(mut ev) = st.event(key, CmEventKind::ConnectResponse) {
                ev.private_data = r.private_data;
                ev.conn = Some(conn);
                st.post(key, ev);
            }
            return;
        }
        match connect_qp(id, st_sgid(&st.devices, id)) {
            Ok(()) => {
                let id = st.ids.get_mut(&key).expect("found");
                id.state = IdState::Established;
                let msg = rtu(id);
                id.last_sent = Some(msg.clone());
                outs.extend(st.out_for(key, msg));
                if let Some(mut ev) = st.event(key, CmEventKind::Established) {
                    ev.private_data = r.private_data;
                    ev.conn = Some(conn);
                    st.post(key, ev);
                }
            }
            Err(_) => {
                let id = st.ids.get_mut(&key).expect("found");
                id.state = IdState::Done;
                qp_to_err(id);
                let msg = CmMsg::Rej(mad::Rej {
                    local_comm_id: id.local_comm_id,
                    remote_comm_id: id.remote_comm_id,
                    message_rejected: MsgRef::Rep,
                    reason: rej::CONSUMER_REJECT,
                    private_data: Vec::new(),
                });
                outs.extend(st.out_for(key, msg));
                st.post_kind(key, CmEventKind::ConnectError);
            }
        }
    }

    fn on_mra(&self, st: &mut State, rx: &Rx, r: mad::Mra) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            return;
        };
        let wait = self.cfg.response_duration() + super::timeout_duration(r.service_timeout);
        let retries = self.cfg.max_retries;
        let id = st.ids.get_mut(&key).expect("found");
        if matches!(id.state, IdState::ReqSent | IdState::RepSent) {
            id.timer = Some(Instant::now() + wait);
            id.retries_left = retries;
        }
    }

    fn on_dreq(&self, st: &mut State, rx: &Rx, r: Ids, outs: &mut Vec<Out>) {
        let drep = |l: u32| {
            CmMsg::Drep(Ids {
                local_comm_id: l,
                remote_comm_id: r.local_comm_id,
                remote_qpn: 0,
                private_data: Vec::new(),
            })
        };
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            // No such connection (any more): answer so the peer can finish.
            outs.extend(Self::reply(st, rx, drep(r.remote_comm_id)));
            return;
        };
        let (state, l) = {
            let id = &st.ids[&key];
            (id.state, id.local_comm_id)
        };
        match state {
            IdState::Established | IdState::RepSent | IdState::DreqSent | IdState::RepRcvd => {
                let id = st.ids.get_mut(&key).expect("found");
                qp_to_err(id);
                outs.extend(st.out_for(key, drep(l)));
                enter_timewait(st, key, self.cfg.timewait);
                st.post_kind(key, CmEventKind::Disconnected);
            }
            IdState::TimeWait | IdState::Done => outs.extend(st.out_for(key, drep(l))),
            _ => {}
        }
    }

    fn on_drep(&self, st: &mut State, rx: &Rx, r: Ids) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            return;
        };
        if st.ids[&key].state == IdState::DreqSent {
            enter_timewait(st, key, self.cfg.timewait);
            st.post_kind(key, CmEventKind::Disconnected);
        }
    }
}

/// Where a received MAD came from.
struct Rx {
    dev: String,
    gen: Generation,
    ns: NamespaceId,
    src: IpAddr,
    dst: IpAddr,
    tid: u64,
}

fn stale_rej(local: u32, remote: u32) -> CmMsg {
    CmMsg::Rej(mad::Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: MsgRef::Req,
        reason: rej::STALE_CONN,
        private_data: Vec::new(),
    })
}

pub(crate) fn rtu(id: &Id) -> CmMsg {
    CmMsg::Rtu(Ids {
        local_comm_id: id.local_comm_id,
        remote_comm_id: id.remote_comm_id,
        remote_qpn: 0,
        private_data: Vec::new(),
    })
}

/// The id whose local comm ID is `comm`, if its peer is the sender.
fn find_comm(st: &State, rx: &Rx, comm: u32) -> Option<u64> {
    let key = *st.by_comm.get(&comm)?;
    let id = st.ids.get(&key)?;
    (id.peer == Some(rx.src) && !id.removed).then_some(key)
}

fn find_listener(st: &State, rx: &Rx, ps: PortSpace, port: u16, dst: IpAddr, shared_mode: bool) -> Option<u64> {
    st.ids
        .iter()
        .filter(|(_, id)| {
            id.state == IdState::Listen
                && !id.destroyed
                && id.ps == ps
                && (id.ns.id() == rx.ns || shared_mode)
                && id
                    .src
                    .is_some_and(|s| s.port() == port && (s.ip().is_unspecified() || s.ip() == dst || s.ip() == rx.dst))
        })
        // A listener on the exact address wins over a wildcard one.
        .min_by_key(|(_, id)| id.src.is_some_and(|s| s.ip().is_unspecified()))
        .map(|(k, _)| *k)
}

fn min_mtu(local: Mtu, remote: u8) -> Mtu {
    let r = match remote {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    };
    if r.as_raw() < local.as_raw() {
        r
    } else {
        local
    }
}

pub(crate) fn st_sgid(devices: &HashMap<String, Dev>, id: &Id) -> u8 {
    let Some((name, _)) = &id.dev else { return 0 };
    let Some(src) = id.src else { return 0 };
    devices.get(name).and_then(|d| d.sgid_index(src.ip())).unwrap_or(0)
}

/// The attributes that move a QP of the id to RTR for its peer (rdma_cm's
/// `cma_modify_qp_rtr`).
pub(crate) fn rtr_attr(id: &Id, sgid: u8) -> (QpAttr, QpAttrMask) {
    let peer = id.peer.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: id.mtu,
        dest_qp_num: id.remote_qpn,
        rq_psn: id.remote_psn,
        ah_attr: AhAttr::roce(gid_of(peer), sgid, 1),
        max_dest_rd_atomic: id.param.responder_resources.max(1),
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    (rtr, mask)
}

/// The attributes that move a QP of the id from RTR to RTS
/// (`cma_modify_qp_rts`).
pub(crate) fn rts_attr(id: &Id) -> (QpAttr, QpAttrMask) {
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: id.local_psn,
        timeout: 14,
        retry_cnt: id.param.retry_count.min(7),
        rnr_retry: id.param.rnr_retry_count.min(7),
        max_rd_atomic: id.param.initiator_depth.max(1),
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    (rts, mask)
}

/// The attributes that move a new QP of type `t` to INIT (rdma_cm's
/// `cma_init_conn_qp` / `cma_init_ud_qp`).
pub(crate) fn init_attr(t: QpType) -> (QpAttr, QpAttrMask) {
    match t {
        QpType::Ud => (
            QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qkey: UDP_QKEY,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        ),
        _ => (
            QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
        ),
    }
}

/// Moves the id's QP to RTR then RTS for its peer.
pub(crate) fn connect_qp(id: &Id, sgid: u8) -> crate::verbs::Result<()> {
    let Some(qp) = &id.qp else { return Ok(()) };
    let (rtr, mask) = rtr_attr(id, sgid);
    qp.modify(&rtr, mask)?;
    let (rts, mask) = rts_attr(id);
    qp.modify(&rts, mask)
}

/// Moves a new QP to INIT (RC) or through to RTS (UD), as rdma_cm does at
/// `rdma_create_qp`.
pub(crate) fn init_qp(qp: &Qp) -> crate::verbs::Result<()> {
    let (init, mask) = init_attr(qp.qp_type());
    qp.modify(&init, mask)?;
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

/// Moves the id's QP to ERR (flushing its work), as rdma_cm does on
/// disconnect and reject.
pub(crate) fn qp_to_err(id: &Id) {
    if let Some(qp) = &id.qp {
        let _ = qp.modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        );
    }
}

pub(crate) fn enter_timewait(st: &mut State, key: u64, wait: Duration) {
    if let Some(id) = st.ids.get_mut(&key) {
        id.state = IdState::TimeWait;
        id.timer = Some(Instant::now() + wait);
        id.retries_left = 0;
    }
}

/// Drops a destroyed id that has nothing left to wait for.
pub(crate) fn forget_id(st: &mut State, key: u64) {
    if let Some(id) = st.ids.remove(&key) {
        st.by_comm.remove(&id.local_comm_id);
    }
}

fn on_rtu(st: &mut State, rx: &Rx, r: Ids) {
    let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
        return;
    };
    let id = st.ids.get_mut(&key).expect("found");
    if id.state == IdState::RepSent {
        id.state = IdState::Established;
        id.timer = None;
        st.post_kind(key, CmEventKind::Established);
    }
}

fn on_rej(st: &mut State, rx: &Rx, r: mad::Rej) {
    let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
        st.counters.rx_dropped += 1;
        return;
    };
    let id = st.ids.get_mut(&key).expect("found");
    if !matches!(id.state, IdState::ReqSent | IdState::RepSent | IdState::RepRcvd) {
        return;
    }
    id.state = IdState::Done;
    id.timer = None;
    qp_to_err(id);
    let destroyed = id.destroyed;
    if let Some(mut ev) = st.event(key, CmEventKind::Rejected) {
        ev.status = i32::from(r.reason);
        ev.private_data = r.private_data;
        st.post(key, ev);
    }
    if destroyed {
        forget_id(st, key);
    }
}

fn on_sidr_rep(st: &mut State, rx: &Rx, r: mad::SidrRep) {
    let Some(key) = find_comm(st, rx, r.request_id) else {
        return;
    };
    let id = st.ids.get_mut(&key).expect("found");
    if id.state != IdState::SidrReqSent {
        return;
    }
    id.timer = None;
    let sgid = st_sgid(&st.devices, &st.ids[&key]);
    let id = st.ids.get_mut(&key).expect("found");
    if r.status == 0 {
        id.state = IdState::Established;
        id.remote_qpn = r.qpn;
        id.remote_qkey = r.qkey;
        let peer = id.peer.unwrap_or(rx.src);
        if let Some(mut ev) = st.event(key, CmEventKind::Established) {
            ev.private_data = r.private_data;
            ev.ud = Some(UdParam {
                qp_num: r.qpn,
                qkey: r.qkey,
                ah_attr: AhAttr::roce(gid_of(peer), sgid, 1),
            });
            st.post(key, ev);
        }
    } else {
        id.state = IdState::Done;
        if let Some(mut ev) = st.event(key, CmEventKind::Unreachable) {
            ev.status = i32::from(r.status);
            ev.private_data = r.private_data;
            st.post(key, ev);
        }
    }
}
