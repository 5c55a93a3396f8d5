//! The registry: devices, clients, namespaces and the operations that change
//! them, with the upcall ordering rules of [`client`](super::client) and the
//! removal sequence of [`removal`](super::removal).
//!
//! Concurrency: one short-held state lock, never held across an upcall or a
//! backend call, and a *topology lock* that serializes operations that make
//! upcalls. The topology lock is reentrant, which is what lets an upcall
//! call back into the subsystem: a nested operation runs at once on the
//! upcalling thread, and every loop that makes upcalls re-reads the state
//! after each one (a nested operation may have changed anything).

mod topology;

use crate::sys::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::client::{Client, ClientId, ClientScope};
use super::device::{DeviceFactory, DeviceInfo, DeviceRecord, DeviceRef, DeviceState, Generation};
use super::error::{serr, Error, Op, Result};
use super::events::{AddressChange, CmHook, CmHookId, DeviceEvent, DeviceEventKind, EventReceiver};
use super::namespace::{NamespaceId, NetnsMode, NsLife, WeakNamespace};
use super::removal::{RemovalReason, RemovalReport, Straggler};
use topology::TopologyLock;

/// How a [`Subsystem`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// How long a removal waits for consumers to let go before it names them
    /// and makes their objects inert.
    pub removal_deadline: Duration,
    /// The namespace mode to start in.
    pub mode: NetnsMode,
}

impl Default for SubsystemConfig {
    fn default() -> Self {
        SubsystemConfig {
            removal_deadline: Duration::from_secs(2),
            mode: NetnsMode::Exclusive,
        }
    }
}

struct NsRec {
    name: String,
    life: Arc<NsLife>,
}

struct ClientRec {
    name: Arc<str>,
    scope: ClientScope,
    client: Arc<dyn Client>,
    /// Cleared when unregistration starts: no new `add` from then on.
    registered: bool,
    /// Upcalls of this client on the (single) upcalling thread's stack.
    depth: u32,
}

struct Slot {
    factory: Arc<dyn DeviceFactory>,
    rec: Arc<DeviceRecord>,
}

struct Subscriber {
    scope: ClientScope,
    tx: mpsc::Sender<DeviceEvent>,
}

struct State {
    mode: NetnsMode,
    next_ns: u32,
    namespaces: BTreeMap<NamespaceId, NsRec>,
    next_client: u64,
    clients: BTreeMap<ClientId, ClientRec>,
    next_generation: u64,
    /// Present devices (Live or Revoked), by name.
    devices: BTreeMap<String, Slot>,
    /// Which clients were added to which device instance.
    bindings: BTreeMap<Generation, BTreeSet<ClientId>>,
    next_hook: u64,
    cm_hooks: Vec<(CmHookId, Arc<dyn CmHook>)>,
    subscribers: Vec<Subscriber>,
}

impl State {
    fn ns_exists(&self, ns: NamespaceId) -> bool {
        self.namespaces.contains_key(&ns)
    }

    /// Whether something scoped to `scope` sees a device of namespace `ns`.
    fn visible(&self, scope: ClientScope, ns: NamespaceId) -> bool {
        match scope {
            ClientScope::All => true,
            ClientScope::Namespace(n) => self.ns_exists(n) && (self.mode == NetnsMode::Shared || n == ns),
        }
    }

    fn emit(&mut self, rec: &DeviceRecord, kind: DeviceEventKind) {
        let ev = DeviceEvent {
            namespace: rec.info.namespace,
            device: rec.info.name.clone(),
            generation: rec.info.generation,
            backend: rec.info.backend,
            kind,
        };
        let mode = self.mode;
        let namespaces = &self.namespaces;
        self.subscribers.retain(|s| {
            let sees = match s.scope {
                ClientScope::All => true,
                ClientScope::Namespace(n) => {
                    namespaces.contains_key(&n) && (mode == NetnsMode::Shared || n == ev.namespace)
                }
            };
            !sees || s.tx.send(ev.clone()).is_ok()
        });
    }

    fn bound(&self, g: Generation, c: ClientId) -> bool {
        self.bindings.get(&g).is_some_and(|s| s.contains(&c))
    }
}

/// The device registry over every backend: devices, clients, namespaces and
/// hotplug (docs/design.md §5). See the [module documentation](super) for the rules
/// and an example.
pub struct Subsystem {
    deadline_ns: AtomicU64,
    state: Mutex<State>,
    topology: TopologyLock,
}

impl std::fmt::Debug for Subsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("Subsystem")
            .field("mode", &st.mode)
            .field("namespaces", &st.namespaces.len())
            .field("clients", &st.clients.len())
            .field("devices", &st.devices.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Subsystem {
    /// A new, empty registry (the initial namespace only).
    pub fn new(config: SubsystemConfig) -> Subsystem {
        let mut namespaces = BTreeMap::new();
        namespaces.insert(
            NamespaceId::INIT,
            NsRec {
                name: "init".to_string(),
                life: NsLife::new(NamespaceId::INIT),
            },
        );
        Subsystem {
            deadline_ns: AtomicU64::new(config.removal_deadline.as_nanos().min(u128::from(u64::MAX)) as u64),
            state: Mutex::new(State {
                mode: config.mode,
                next_ns: 1,
                namespaces,
                next_client: 1,
                clients: BTreeMap::new(),
                next_generation: 1,
                devices: BTreeMap::new(),
                bindings: BTreeMap::new(),
                next_hook: 1,
                cm_hooks: Vec::new(),
                subscribers: Vec::new(),
            }),
            topology: TopologyLock::default(),
        }
    }

    /// The process-wide registry (default configuration), created on first
    /// use.
    pub fn global() -> Arc<Subsystem> {
        static G: OnceLock<Arc<Subsystem>> = OnceLock::new();
        G.get_or_init(|| Arc::new(Subsystem::new(SubsystemConfig::default())))
            .clone()
    }

    /// The removal deadline now in force.
    pub fn removal_deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline_ns.load(Ordering::Relaxed))
    }

    /// Changes the removal deadline (for removals that start later).
    pub fn set_removal_deadline(&self, deadline: Duration) {
        self.deadline_ns
            .store(deadline.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    // ----- lookups (state lock only; callable from anywhere) -----

    /// The live devices visible in `scope`, in generation order.
    pub fn devices(&self, scope: ClientScope) -> Vec<DeviceInfo> {
        let st = lock(&self.state);
        let mut v: Vec<DeviceInfo> = st
            .devices
            .values()
            .filter(|s| s.rec.state() == DeviceState::Live && st.visible(scope, s.rec.info.namespace))
            .map(|s| s.rec.info.clone())
            .collect();
        v.sort_by_key(|d| d.generation);
        v
    }

    /// The present device named `name`.
    ///
    /// # Errors
    ///
    /// `ENOENT` if there is none.
    pub fn device(&self, name: &str) -> Result<DeviceRef> {
        let st = lock(&self.state);
        st.devices
            .get(name)
            .map(|s| DeviceRef { rec: s.rec.clone() })
            .ok_or_else(|| serr!(OpenDevice, NotFound, "no device named '{name}'"))
    }

    /// Opens the device named `name` on behalf of `consumer`
    /// ([`DeviceRef::open`]).
    ///
    /// # Errors
    ///
    /// `ENOENT` if there is no such device; `ENODEV` if it is being removed;
    /// the backend's error.
    pub fn open(&self, name: &str, consumer: &str) -> Result<crate::verbs::Context> {
        self.device(name)?
            .open(consumer)
            .map_err(|e| Error::from_verbs(Op::OpenDevice, &e))
    }

    /// The namespace mode.
    pub fn mode(&self) -> NetnsMode {
        lock(&self.state).mode
    }

    /// Every namespace: (id, name), the initial one first.
    pub fn namespaces(&self) -> Vec<(NamespaceId, String)> {
        lock(&self.state)
            .namespaces
            .iter()
            .map(|(id, r)| (*id, r.name.clone()))
            .collect()
    }

    /// The namespace named `name`, if it exists.
    pub fn namespace_by_name(&self, name: &str) -> Option<NamespaceId> {
        lock(&self.state)
            .namespaces
            .iter()
            .find(|(_, r)| r.name == name)
            .map(|(id, _)| *id)
    }

    /// A weak reference to a namespace (what a listener holds).
    ///
    /// # Errors
    ///
    /// `ENOENT` if it does not exist.
    pub fn namespace_ref(&self, ns: NamespaceId) -> Result<WeakNamespace> {
        let st = lock(&self.state);
        let r = st
            .namespaces
            .get(&ns)
            .ok_or_else(|| serr!(LookupNamespace, NotFound, "no namespace {ns}"))?;
        Ok(if ns.is_init() {
            WeakNamespace::init(&r.life)
        } else {
            WeakNamespace::new(&r.life)
        })
    }

    /// Registered clients: (id, name, scope), in registration order.
    pub fn clients(&self) -> Vec<(ClientId, String, ClientScope)> {
        lock(&self.state)
            .clients
            .iter()
            .filter(|(_, c)| c.registered)
            .map(|(id, c)| (*id, c.name.to_string(), c.scope))
            .collect()
    }

    /// Receives every later device event visible in `scope`.
    pub fn subscribe(&self, scope: ClientScope) -> EventReceiver {
        let (tx, rx) = mpsc::channel();
        lock(&self.state).subscribers.push(Subscriber { scope, tx });
        EventReceiver { rx }
    }

    /// Installs a CM hook (step 3 of every later removal).
    pub fn add_cm_hook(&self, hook: Arc<dyn CmHook>) -> CmHookId {
        let mut st = lock(&self.state);
        let id = CmHookId(st.next_hook);
        st.next_hook += 1;
        st.cm_hooks.push((id, hook));
        id
    }

    /// Removes a CM hook; `false` if it was not installed.
    pub fn remove_cm_hook(&self, id: CmHookId) -> bool {
        let mut st = lock(&self.state);
        let before = st.cm_hooks.len();
        st.cm_hooks.retain(|(h, _)| *h != id);
        st.cm_hooks.len() != before
    }

    /// Reports that IP address `addr` was removed from (or added to) the
    /// network interface of device `name` (a namespace driver calls this on
    /// `ip addr del`/`add`, a bonding failover, ...). Every CM hook hears
    /// it ([`CmHook::address_change`]); the connection manager gives each
    /// id bound through `addr` on that device (or, for an address that
    /// moved here, on the device that had it) one ADDR_CHANGE. The device
    /// itself is not touched: its GID table is fixed for its life.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown device; `EBUSY` while it is being removed.
    pub fn address_change(&self, name: &str, addr: std::net::IpAddr, change: AddressChange) -> Result<()> {
        let rec = self.live_device(name, Op::AddressChange)?;
        {
            let mut w = lock(&rec.withdrawn);
            match change {
                AddressChange::Removed if !w.contains(&addr) => w.push(addr),
                AddressChange::Added => w.retain(|a| *a != addr),
                AddressChange::Removed => {}
            }
        }
        let hooks: Vec<Arc<dyn CmHook>> = lock(&self.state).cm_hooks.iter().map(|(_, h)| h.clone()).collect();
        let dref = DeviceRef { rec };
        for h in &hooks {
            let _ = catch_unwind(AssertUnwindSafe(|| h.address_change(&dref, addr, change)));
        }
        Ok(())
    }

    // ----- clients -----

    /// Registers a client for `scope`; it gets `add` for every device it can
    /// see now (before this returns) and for every later one.
    ///
    /// # Errors
    ///
    /// `ENOENT` if `scope` names a namespace that does not exist.
    pub fn register_client(&self, name: &str, scope: ClientScope, client: Arc<dyn Client>) -> Result<ClientId> {
        let _t = self.topology.acquire();
        let id = {
            let mut st = lock(&self.state);
            if let ClientScope::Namespace(ns) = scope {
                if !st.ns_exists(ns) {
                    return Err(serr!(RegisterClient, NotFound, "no namespace {ns}"));
                }
            }
            let id = ClientId(st.next_client);
            st.next_client += 1;
            st.clients.insert(
                id,
                ClientRec {
                    name: Arc::from(name),
                    scope,
                    client,
                    registered: true,
                    depth: 0,
                },
            );
            id
        };
        let mut after = Generation(0);
        loop {
            let next = {
                let st = lock(&self.state);
                let Some(c) = st.clients.get(&id).filter(|c| c.registered) else {
                    break;
                };
                st.devices
                    .values()
                    .filter(|s| {
                        s.rec.info.generation > after
                            && s.rec.state() == DeviceState::Live
                            && st.visible(c.scope, s.rec.info.namespace)
                            && !st.bound(s.rec.info.generation, id)
                    })
                    .min_by_key(|s| s.rec.info.generation)
                    .map(|s| s.rec.clone())
            };
            let Some(rec) = next else { break };
            after = rec.info.generation;
            self.upcall_add(id, &rec);
        }
        Ok(id)
    }

    /// Unregisters a client: it gets `remove` (reason
    /// [`RemovalReason::ClientUnregistered`]) for every device it was added
    /// to, and no upcall after this returns.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown client; `EBUSY` when called from inside one of
    /// that client's own upcalls.
    pub fn unregister_client(&self, id: ClientId) -> Result<()> {
        let _t = self.topology.acquire();
        {
            let mut st = lock(&self.state);
            let c = st
                .clients
                .get_mut(&id)
                .filter(|c| c.registered)
                .ok_or_else(|| serr!(UnregisterClient, NotFound, "no registered {id}"))?;
            if c.depth > 0 {
                return Err(serr!(
                    UnregisterClient,
                    Busy,
                    "{id} ({}) cannot unregister from inside its own upcall",
                    c.name
                ));
            }
            c.registered = false;
        }
        let mut below = Generation(u64::MAX);
        loop {
            let next = {
                let mut st = lock(&self.state);
                let g = st
                    .bindings
                    .iter()
                    .filter(|(g, set)| **g < below && set.contains(&id))
                    .map(|(g, _)| *g)
                    .max();
                g.and_then(|g| {
                    if let Some(set) = st.bindings.get_mut(&g) {
                        set.remove(&id);
                    }
                    st.devices
                        .values()
                        .find(|s| s.rec.info.generation == g)
                        .map(|s| s.rec.clone())
                        .map(|r| (g, r))
                })
            };
            let Some((g, rec)) = next else { break };
            below = g;
            self.upcall_remove(id, &rec, RemovalReason::ClientUnregistered);
        }
        lock(&self.state).clients.remove(&id);
        Ok(())
    }

    /// Runs `add` of client `id` for `rec` and records the binding if it
    /// succeeded. If the device was removed while the upcall ran (a nested
    /// removal), the client gets its `remove` at once, so that the pair
    /// stays balanced.
    fn upcall_add(&self, id: ClientId, rec: &Arc<DeviceRecord>) {
        let client = {
            let mut st = lock(&self.state);
            if rec.state() != DeviceState::Live || st.bound(rec.info.generation, id) {
                return;
            }
            let Some(c) = st.clients.get_mut(&id).filter(|c| c.registered) else {
                return;
            };
            c.depth += 1;
            c.client.clone()
        };
        let dref = DeviceRef { rec: rec.clone() };
        let ok = matches!(catch_unwind(AssertUnwindSafe(|| client.add(&dref))), Ok(Ok(())));
        let late_removal = {
            let mut st = lock(&self.state);
            if let Some(c) = st.clients.get_mut(&id) {
                c.depth -= 1;
            }
            if !ok {
                None
            } else if rec.state() == DeviceState::Live {
                st.bindings.entry(rec.info.generation).or_default().insert(id);
                None
            } else {
                Some(rec.removal_reason().unwrap_or(RemovalReason::Unplug))
            }
        };
        if let Some(reason) = late_removal {
            self.upcall_remove(id, rec, reason);
        }
    }

    /// Runs `remove` of client `id` for `rec` (the binding is already gone).
    /// Returns the client's name.
    fn upcall_remove(&self, id: ClientId, rec: &Arc<DeviceRecord>, reason: RemovalReason) -> Option<Arc<str>> {
        let (client, name) = {
            let mut st = lock(&self.state);
            let c = st.clients.get_mut(&id)?;
            c.depth += 1;
            (c.client.clone(), c.name.clone())
        };
        let dref = DeviceRef { rec: rec.clone() };
        let _ = catch_unwind(AssertUnwindSafe(|| client.remove(&dref, reason)));
        if let Some(c) = lock(&self.state).clients.get_mut(&id) {
            c.depth -= 1;
        }
        Some(name)
    }

    // ----- devices -----

    /// Adds a device (a new instance from `factory`) to namespace `ns`; every
    /// client that can see it gets `add`, in registration order, before this
    /// returns.
    ///
    /// # Errors
    ///
    /// `EBUSY` if a device of that name is present; `ENOENT` if `ns` does not
    /// exist; `EINVAL` for a namespace other than the initial one in shared
    /// mode; the backend's error from instantiating the device.
    pub fn add_device(&self, factory: Arc<dyn DeviceFactory>, ns: NamespaceId) -> Result<DeviceInfo> {
        let _t = self.topology.acquire();
        self.plug(factory, ns, Op::AddDevice)
    }

    fn plug(&self, factory: Arc<dyn DeviceFactory>, ns: NamespaceId, op: Op) -> Result<DeviceInfo> {
        let name = factory.name().to_string();
        let check = |st: &State| -> Result<()> {
            if st.devices.contains_key(&name) {
                return Err(Error::new(
                    op,
                    crate::verbs::ErrorKind::Busy,
                    format!("a device named '{name}' is present"),
                ));
            }
            if !st.ns_exists(ns) {
                return Err(Error::new(
                    op,
                    crate::verbs::ErrorKind::NotFound,
                    format!("no namespace {ns}"),
                ));
            }
            if st.mode == NetnsMode::Shared && !ns.is_init() {
                return Err(Error::new(
                    op,
                    crate::verbs::ErrorKind::InvalidArgument,
                    "in shared mode every device belongs to the initial namespace",
                ));
            }
            Ok(())
        };
        check(&lock(&self.state))?;
        let driver = factory.instantiate(ns).map_err(|e| Error::from_verbs(op, &e))?;
        let rec = {
            let mut st = lock(&self.state);
            if let Err(e) = check(&st) {
                drop(st);
                driver.revoke();
                driver.unlist();
                return Err(e);
            }
            let info = DeviceInfo {
                name: name.clone(),
                backend: factory.backend(),
                namespace: ns,
                generation: Generation(st.next_generation),
            };
            st.next_generation += 1;
            let rec = DeviceRecord::new(info, driver);
            st.devices.insert(
                name,
                Slot {
                    factory,
                    rec: rec.clone(),
                },
            );
            st.emit(&rec, DeviceEventKind::Added);
            rec
        };
        let mut after: Option<ClientId> = None;
        loop {
            let next = {
                let st = lock(&self.state);
                if rec.state() != DeviceState::Live {
                    break;
                }
                let lo = after.map_or(0, |a| a.0 + 1);
                st.clients
                    .range(ClientId(lo)..)
                    .find(|(id, c)| {
                        c.registered && st.visible(c.scope, rec.info.namespace) && !st.bound(rec.info.generation, **id)
                    })
                    .map(|(id, _)| *id)
            };
            let Some(id) = next else { break };
            after = Some(id);
            self.upcall_add(id, &rec);
        }
        Ok(rec.info.clone())
    }

    /// Removes the device named `name` (reason
    /// [`RemovalReason::Unplug`]), running the sequence of
    /// [`removal`](super::removal) with the configured deadline.
    ///
    /// # Errors
    ///
    /// `ENOENT` if no such device is present; `EBUSY` if its removal is
    /// already running (a nested call from one of its own upcalls).
    pub fn remove_device(&self, name: &str) -> Result<RemovalReport> {
        self.remove_device_within(name, self.removal_deadline())
    }

    /// [`Subsystem::remove_device`] with a deadline of its own.
    ///
    /// # Errors
    ///
    /// As [`Subsystem::remove_device`].
    pub fn remove_device_within(&self, name: &str, deadline: Duration) -> Result<RemovalReport> {
        let _t = self.topology.acquire();
        let rec = self.live_device(name, Op::RemoveDevice)?;
        let report = self.unplug(&rec, RemovalReason::Unplug, deadline);
        self.forget(&rec);
        Ok(report)
    }

    /// Moves a device to namespace `to` (exclusive mode): an unplug with
    /// reason [`RemovalReason::NetnsMove`] — the full removal sequence, every
    /// consumer of the old instance lets go — then a replug in `to` as a new
    /// generation.
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` in shared mode; `ENOENT` for an unknown device or
    /// namespace; `EINVAL` if the device is already in `to`; `EBUSY` while
    /// the device is being removed; the backend's error from the replug (the
    /// device is then gone, as after an unplug).
    pub fn move_device(&self, name: &str, to: NamespaceId) -> Result<(RemovalReport, DeviceInfo)> {
        let _t = self.topology.acquire();
        {
            let st = lock(&self.state);
            if st.mode == NetnsMode::Shared {
                return Err(serr!(
                    MoveDevice,
                    NotSupported,
                    "devices cannot move between namespaces in shared mode"
                ));
            }
            if !st.ns_exists(to) {
                return Err(serr!(MoveDevice, NotFound, "no namespace {to}"));
            }
        }
        let rec = self.live_device(name, Op::MoveDevice)?;
        let from = rec.info.namespace;
        if from == to {
            return Err(serr!(MoveDevice, InvalidArgument, "'{name}' is already in {to}"));
        }
        self.relocate(&rec, RemovalReason::NetnsMove { from, to })
    }

    /// Unplug + replug; the replug goes to the initial namespace if `to`
    /// vanished meanwhile (a nested namespace deletion).
    fn relocate(&self, rec: &Arc<DeviceRecord>, reason: RemovalReason) -> Result<(RemovalReport, DeviceInfo)> {
        let RemovalReason::NetnsMove { to, .. } = reason else {
            unreachable!("relocate is only called for moves")
        };
        let report = self.unplug(rec, reason, self.removal_deadline());
        let factory = self.forget(rec);
        let factory = factory.ok_or_else(|| serr!(MoveDevice, NoDevice, "'{}' vanished", rec.info.name))?;
        let target = if lock(&self.state).ns_exists(to) {
            to
        } else {
            NamespaceId::INIT
        };
        let info = self.plug(factory, target, Op::MoveDevice)?;
        Ok((report, info))
    }

    fn live_device(&self, name: &str, op: Op) -> Result<Arc<DeviceRecord>> {
        let st = lock(&self.state);
        let slot = st.devices.get(name).ok_or_else(|| {
            Error::new(
                op,
                crate::verbs::ErrorKind::NotFound,
                format!("no device named '{name}'"),
            )
        })?;
        if slot.rec.state() != DeviceState::Live {
            return Err(Error::new(
                op,
                crate::verbs::ErrorKind::Busy,
                format!("'{name}' is already being removed"),
            ));
        }
        Ok(slot.rec.clone())
    }

    /// Drops the registry's slot of a removed instance; returns its factory.
    fn forget(&self, rec: &Arc<DeviceRecord>) -> Option<Arc<dyn DeviceFactory>> {
        let mut st = lock(&self.state);
        let ours = st.devices.get(&rec.info.name).is_some_and(|s| Arc::ptr_eq(&s.rec, rec));
        if ours {
            st.devices.remove(&rec.info.name).map(|s| s.factory)
        } else {
            None
        }
    }

    /// The removal sequence (see [`removal`](super::removal)).
    fn unplug(&self, rec: &Arc<DeviceRecord>, reason: RemovalReason, deadline: Duration) -> RemovalReport {
        let start = Instant::now();
        // 1. Revoked: no new opens, not listed, not visible to new clients.
        let hooks = {
            let mut st = lock(&self.state);
            rec.set_revoked(reason);
            st.emit(rec, DeviceEventKind::Removing(reason));
            st.cm_hooks.iter().map(|(_, h)| h.clone()).collect::<Vec<_>>()
        };
        // 2. The backend: ENODEV, QPs to ERR, flush once, notifications.
        rec.driver.revoke();
        rec.driver.unlist();
        let dref = DeviceRef { rec: rec.clone() };
        // 3. CM ids: DEVICE_REMOVAL.
        for h in &hooks {
            let _ = catch_unwind(AssertUnwindSafe(|| h.device_removal(&dref, reason)));
        }
        // 4. Clients, in reverse registration order.
        let mut removed_clients = Vec::new();
        let mut below = ClientId(u64::MAX);
        loop {
            let next = {
                let mut st = lock(&self.state);
                let set = st.bindings.entry(rec.info.generation).or_default();
                let id = set.range(..below).next_back().copied();
                if let Some(id) = id {
                    set.remove(&id);
                }
                id
            };
            let Some(id) = next else { break };
            below = id;
            if let Some(name) = self.upcall_remove(id, rec, reason) {
                removed_clients.push(name.to_string());
            }
        }
        // 5. DEVICE_FATAL, the last async event.
        rec.driver.raise_device_fatal();
        // 6. Wait for consumers to let go.
        let stragglers = wait_for_consumers(rec, deadline);
        // 7. Close and drain the gate; make what is left inert.
        rec.gate.close();
        let drained = rec.gate.synchronize(deadline);
        let stuck_calls = if drained { 0 } else { rec.gate.inside() };
        if !stragglers.is_empty() || !drained {
            rec.driver.make_inert();
        }
        // 8. Dead.
        {
            let mut st = lock(&self.state);
            rec.set_dead();
            st.bindings.remove(&rec.info.generation);
            st.emit(
                rec,
                DeviceEventKind::Removed {
                    reason,
                    stragglers: stragglers.iter().map(|s| s.consumer.clone()).collect(),
                },
            );
        }
        RemovalReport {
            device: rec.info.clone(),
            reason,
            cm_hooks: hooks.len(),
            removed_clients,
            stragglers,
            stuck_calls,
            elapsed: start.elapsed(),
        }
    }

    // ----- namespaces -----

    /// Creates a namespace named `name`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an empty name; `EBUSY` if a namespace has that name.
    pub fn create_namespace(&self, name: &str) -> Result<NamespaceId> {
        let _t = self.topology.acquire();
        let mut st = lock(&self.state);
        if name.is_empty() {
            return Err(serr!(CreateNamespace, InvalidArgument, "a namespace needs a name"));
        }
        if st.namespaces.values().any(|r| r.name == name) {
            return Err(serr!(CreateNamespace, Busy, "a namespace named '{name}' exists"));
        }
        let id = NamespaceId::from_u32(st.next_ns);
        st.next_ns += 1;
        st.namespaces.insert(
            id,
            NsRec {
                name: name.to_string(),
                life: NsLife::new(id),
            },
        );
        Ok(id)
    }

    /// Deletes a namespace. Its weak references die and every watch gets one
    /// deletion event (nobody is waited for); in exclusive mode its devices
    /// return to the initial namespace (a move each); in shared mode the
    /// clients registered for it lose every device (reason
    /// [`RemovalReason::NamespaceDeleted`]). Clients registered for it stay
    /// registered and see nothing more.
    ///
    /// # Errors
    ///
    /// `EPERM` for the initial namespace; `ENOENT` if it does not exist.
    pub fn delete_namespace(&self, ns: NamespaceId) -> Result<()> {
        let _t = self.topology.acquire();
        let life = {
            let mut st = lock(&self.state);
            if ns.is_init() {
                return Err(serr!(DeleteNamespace, PermissionDenied, "the initial namespace stays"));
            }
            st.namespaces
                .remove(&ns)
                .ok_or_else(|| serr!(DeleteNamespace, NotFound, "no namespace {ns}"))?
                .life
        };
        // The table held the only strong reference: weak references die
        // here, then every watch gets its one event (nobody is waited for).
        NsLife::retire(life);
        loop {
            let next = {
                let st = lock(&self.state);
                st.devices
                    .values()
                    .filter(|s| s.rec.info.namespace == ns && s.rec.state() == DeviceState::Live)
                    .min_by_key(|s| s.rec.info.generation)
                    .map(|s| s.rec.clone())
            };
            let Some(rec) = next else { break };
            let reason = RemovalReason::NetnsMove {
                from: ns,
                to: NamespaceId::INIT,
            };
            // A replug failure leaves the device gone; deletion goes on.
            let _ = self.relocate(&rec, reason);
        }
        // Shared mode: the namespace's own clients lose every device.
        loop {
            let next = {
                let mut st = lock(&self.state);
                let ids: BTreeSet<ClientId> = st
                    .clients
                    .iter()
                    .filter(|(_, c)| c.scope == ClientScope::Namespace(ns))
                    .map(|(id, _)| *id)
                    .collect();
                let found = st
                    .bindings
                    .iter()
                    .find_map(|(g, set)| set.iter().rev().find(|c| ids.contains(c)).map(|c| (*g, *c)));
                found.and_then(|(g, c)| {
                    if let Some(set) = st.bindings.get_mut(&g) {
                        set.remove(&c);
                    }
                    st.devices
                        .values()
                        .find(|s| s.rec.info.generation == g)
                        .map(|s| (c, s.rec.clone()))
                })
            };
            let Some((c, rec)) = next else { break };
            self.upcall_remove(c, &rec, RemovalReason::NamespaceDeleted(ns));
        }
        Ok(())
    }

    /// Switches the namespace mode.
    ///
    /// # Errors
    ///
    /// `EBUSY` while namespaces other than the initial one exist.
    pub fn set_mode(&self, mode: NetnsMode) -> Result<()> {
        let _t = self.topology.acquire();
        let mut st = lock(&self.state);
        if st.mode == mode {
            return Ok(());
        }
        if st.namespaces.len() > 1 {
            return Err(serr!(
                SetMode,
                Busy,
                "{} namespace(s) other than the initial one exist",
                st.namespaces.len() - 1
            ));
        }
        // With only the initial namespace, every device is in it and every
        // client sees the same devices in either mode: no upcalls.
        st.mode = mode;
        Ok(())
    }

    /// Removes every device (reason [`RemovalReason::Shutdown`]), with the
    /// full sequence for each; returns the reports.
    pub fn shutdown(&self) -> Vec<RemovalReport> {
        let _t = self.topology.acquire();
        let mut reports = Vec::new();
        loop {
            let next = {
                let st = lock(&self.state);
                st.devices
                    .values()
                    .filter(|s| s.rec.state() == DeviceState::Live)
                    .max_by_key(|s| s.rec.info.generation)
                    .map(|s| s.rec.clone())
            };
            let Some(rec) = next else { break };
            reports.push(self.unplug(&rec, RemovalReason::Shutdown, self.removal_deadline()));
            self.forget(&rec);
        }
        reports
    }
}

impl Drop for Subsystem {
    /// Revokes and unlists every device left, without upcalls or waiting
    /// (call [`Subsystem::shutdown`] first for the full sequence).
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for slot in std::mem::take(&mut st.devices).into_values() {
            if slot.rec.state() == DeviceState::Live {
                slot.rec.set_revoked(RemovalReason::Shutdown);
                slot.rec.driver.revoke();
                slot.rec.driver.unlist();
                slot.rec.driver.raise_device_fatal();
                slot.rec.gate.close();
                slot.rec.set_dead();
            }
        }
    }
}

/// Step 6: polls the device's holders until none is left or `deadline`
/// passes; returns those left.
fn wait_for_consumers(rec: &DeviceRecord, deadline: Duration) -> Vec<Straggler> {
    let end = Instant::now() + deadline;
    let mut pause = Duration::from_micros(50);
    loop {
        let holders = rec.holders();
        if holders.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        if now >= end {
            return holders
                .into_iter()
                .map(|(consumer, contexts)| Straggler { consumer, contexts })
                .collect();
        }
        thread::sleep(pause.min(end - now));
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}
