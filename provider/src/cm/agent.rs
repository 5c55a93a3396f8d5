//! The connection manager's shared state, its agent thread, and the CM
//! protocol (IBTA ch. 12 state machine, as rdma_cm drives it).
//!
//! Locking: one mutex over every id ([`State`]). MADs are never sent with
//! it held: handlers collect them ([`Out`]) and the caller sends after
//! unlocking, because sending drives the receiving device (in-process
//! links), whose GSI sink queues the MAD for this agent ([`Inbox`], its own
//! lock). Events go into channels (their own locks) under the state lock.
//!
//! This file is the agent: the CM's shared state and handles ([`Inner`],
//! [`Shared`]), its thread and its turn (received MADs, timers, deleted
//! namespaces), and sending. The rest, by concern: `state` (ids, devices,
//! ports and comm IDs under the lock), `protocol` (the CM MADs' state
//! machine and the ids' timers), `devices` (devices and addresses as the
//! subsystem reports them) and `qp` (moving an id's QP through its states).

mod devices;
mod protocol;
mod qp;
mod state;

use devices::{CmClient, Hook};
pub(crate) use protocol::rtu;
#[cfg(feature = "hardware")]
pub(crate) use qp::ud_init_to_rts;
pub(crate) use qp::{connect_qp, init_attr, init_qp, qp_to_err, rtr_attr, rts_attr, st_sgid};
pub(crate) use state::{forget_id, Id, IdState, Out, State};

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use super::{CmConfig, CmCounters, CmEventKind, Error, EventChannel, FaultAction, PortSpace, Result};
use crate::soft::engine::DeviceShared;
use crate::soft::proto::gsi::{GsiMad, GsiSink};
use crate::subsystem::{ClientId, ClientScope, CmHookId, Generation, Subsystem, WeakNamespace};

/// How long the agent sleeps at most (namespace deletions are checked at
/// this pace).
const TICK: Duration = Duration::from_millis(20);
/// Most MADs queued for the agent; more are dropped (and counted), as a
/// full receive queue drops them.
const INBOX_CAP: usize = 4096;

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
                next_port: state::EPHEMERAL_FIRST + (seed % 20000) as u16,
                counters: CmCounters::default(),
                delayed: None,
                #[cfg(feature = "hardware")]
                hw_devices: HashMap::new(),
                gone: Vec::new(),
                held: None,
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

/// The CM's state, locked; what [`forget_id`] forgot under the lock is
/// dropped after it is released ([`State::gone`]).
pub(crate) struct StateGuard<'a>(Option<MutexGuard<'a, State>>);

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let gone = self.0.as_mut().map(|st| std::mem::take(&mut st.gone));
        drop(self.0.take());
        drop(gone);
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> StateGuard<'_> {
        StateGuard(Some(self.st.lock().unwrap_or_else(|p| p.into_inner())))
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

    pub(crate) fn remove_one(st: &mut State, key: u64) {
        let Some(id) = st.ids.get_mut(&key) else { return };
        if id.removed {
            return;
        }
        id.removed = true;
        id.timer = None;
        id.state = IdState::Removed;
        if id.destroyed {
            forget_id(st, key);
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
                self.handled(|| self.handle_mad(&dev, gen, &m));
            }
        }
        self.handled(|| self.timers());
        self.namespaces();
    }

    /// Runs `handle` (a received MAD's handling, or the due timers') with
    /// the events it raises held back, sends the MADs it returns, then
    /// posts the events: what the protocol owes the peer leaves before the
    /// application can see the event and exit.
    fn handled(&self, handle: impl FnOnce() -> Vec<Out>) {
        self.lock().held = Some((std::thread::current().id(), Vec::new()));
        let outs = handle();
        self.send(outs);
        let mut st = self.lock();
        for (key, ev) in st.held.take().map(|(_, v)| v).unwrap_or_default() {
            st.post(key, ev);
        }
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
}

#[cfg(test)]
mod tests;
