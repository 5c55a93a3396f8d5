//! Devices as the registry holds them: the backend's half of hotplug
//! ([`HotplugDevice`], [`DeviceFactory`]), the soft provider's
//! implementation ([`SoftFactory`]), and the handle upcalls and lookups
//! give out ([`DeviceRef`]).

use crate::sys::lock;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::gate::{GuardedCq, GuardedQp, RemovalGate};
use super::namespace::NamespaceId;
use super::removal::{RemovalReason, UNATTRIBUTED};
use crate::soft::{SoftDevice, SoftDeviceConfig};
use crate::verbs::backend::{AsAny, ContextOps};
use crate::verbs::{self, BackendKind, Context, Cq, Device, ErrorKind, Qp, Verb};

/// A device's generation: a number that changes every time a device is
/// (re-)added, so a handle or event of an earlier life never names the
/// current one. Generations of one subsystem increase and are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub(crate) u64);

impl Generation {
    /// The generation as a number.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gen {}", self.0)
    }
}

/// A device's life (docs/design.md §5): Live → Revoked → Dead.
///
/// The backends use the same words for their side of a removal (the
/// hardware backend's device life is Live → Revoked, then Inert for what
/// stragglers still hold); Dead is the subsystem's alone: the removal
/// sequence is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceState {
    /// Usable.
    Live,
    /// Revoked, the removal sequence under way: no new opens, control verbs
    /// fail with `ENODEV`, work flushes.
    Revoked,
    /// Removed: the removal sequence is over.
    Dead,
}

impl DeviceState {
    fn from_u8(v: u8) -> DeviceState {
        match v {
            0 => DeviceState::Live,
            1 => DeviceState::Revoked,
            _ => DeviceState::Dead,
        }
    }
}

/// A registered device's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceInfo {
    /// Name (unique in the subsystem).
    pub name: String,
    /// Backend.
    pub backend: BackendKind,
    /// The namespace it belongs to (the initial one in shared mode).
    pub namespace: NamespaceId,
    /// Its generation.
    pub generation: Generation,
}

/// The backend's half of hotplug for one instance of a device.
///
/// The soft provider implements it over [`SoftDevice`] (see
/// [`SoftFactory`]); the hardware backend will implement it over a kernel
/// device (there removal is started by the kernel: the backend turns the
/// kernel's DEVICE_FATAL into a call to
/// [`Subsystem::remove_device`](super::Subsystem::remove_device)).
pub trait HotplugDevice: AsAny {
    /// The device as a device-list entry (what consumers open).
    fn device(&self) -> Device;

    /// Revokes the device (docs/design.md §5, first steps): new control verbs fail
    /// with `ENODEV`; every QP moves to ERR; every posted, uncompleted WR
    /// completes exactly once with WR_FLUSH_ERR, send queue before receive
    /// queue, in post order; armed CQ notifications fire. Idempotent.
    fn revoke(&self);

    /// Takes the device out of the backend's device list (so its name can be
    /// used by a new instance). Idempotent.
    fn unlist(&self);

    /// Raises DEVICE_FATAL on every context of the device: its last async
    /// event.
    fn raise_device_fatal(&self);

    /// How many contexts are open on the device, by anyone (including
    /// contexts opened outside the subsystem), if the backend knows.
    fn open_contexts(&self) -> Option<usize> {
        None
    }

    /// Makes the objects still open on the revoked device inert after the
    /// removal deadline: they must never again reach the device, deliver
    /// events, or block anything. Called after the device's
    /// [`RemovalGate`] closed and drained.
    fn make_inert(&self) {}
}

/// Brings a device to life: the first time it is added and every time it is
/// replugged (a namespace move is an unplug and a replug).
pub trait DeviceFactory: Send + Sync {
    /// The device's name.
    fn name(&self) -> &str;

    /// Its backend.
    fn backend(&self) -> BackendKind;

    /// A new instance of the device, to live in namespace `ns` (a factory
    /// may give each namespace its own network, as a network namespace has
    /// its own stack).
    ///
    /// # Errors
    ///
    /// The backend's error (e.g. `EBUSY` if an instance of that name still
    /// exists).
    fn instantiate(&self, ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>>;
}

/// Makes soft devices from a [`SoftDeviceConfig`] (each instance is a new
/// engine: a replugged soft device starts with no objects, like a
/// hot-replugged card). Every instance uses the configured link, whatever
/// its namespace.
///
/// # Examples
///
/// ```
/// use softverbs::soft::SoftDeviceConfig;
/// use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
/// let sub = Subsystem::new(SubsystemConfig::default());
/// let cfg = SoftDeviceConfig::new("doc_factory0", "127.83.200.1".parse().unwrap());
/// let info = sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT)?;
/// assert_eq!(info.name, "doc_factory0");
/// let report = sub.remove_device("doc_factory0")?;
/// assert!(report.is_clean());
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SoftFactory {
    config: SoftDeviceConfig,
}

impl SoftFactory {
    /// A factory for soft devices made from `config`.
    pub fn new(config: SoftDeviceConfig) -> Arc<SoftFactory> {
        Arc::new(SoftFactory { config })
    }

    /// The configuration each instance is made from.
    pub fn config(&self) -> &SoftDeviceConfig {
        &self.config
    }
}

impl DeviceFactory for SoftFactory {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }

    fn instantiate(&self, _ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>> {
        Ok(soft_plugged(SoftDevice::create(self.config.clone())?))
    }
}

/// Puts a soft device under the subsystem (for factories of other shapes,
/// such as the emulator's namespace drivers, which pick a link per
/// namespace).
pub fn soft_plugged(dev: Arc<SoftDevice>) -> Arc<dyn HotplugDevice> {
    Arc::new(SoftPlugged { dev })
}

/// One instance of a soft device under the subsystem.
#[derive(Debug)]
pub(crate) struct SoftPlugged {
    dev: Arc<SoftDevice>,
}

impl HotplugDevice for SoftPlugged {
    fn device(&self) -> Device {
        self.dev.device()
    }

    fn revoke(&self) {
        self.dev.shared().revoke();
    }

    fn unlist(&self) {
        self.dev.remove();
    }

    fn raise_device_fatal(&self) {
        self.dev.shared().raise_device_fatal();
    }

    fn open_contexts(&self) -> Option<usize> {
        Some(self.dev.shared().open_contexts())
    }

    // make_inert: after `revoke` the soft engine is already inert towards
    // the world (it is off its link, control verbs fail, posts flush, no
    // timer runs); the straggler's objects only keep their own memory.
}

/// A consumer's context, held weakly: the registry never keeps a device in
/// use.
#[derive(Debug)]
struct ConsumerRec {
    name: String,
    ctx: Weak<dyn ContextOps>,
}

/// A device instance in the registry.
pub(crate) struct DeviceRecord {
    pub(crate) info: DeviceInfo,
    pub(crate) driver: Arc<dyn HotplugDevice>,
    state: AtomicU8,
    pub(crate) gate: Arc<RemovalGate>,
    consumers: Mutex<Vec<ConsumerRec>>,
    reason: Mutex<Option<RemovalReason>>,
    /// Addresses removed from the device's interface since it was plugged
    /// ([`Subsystem::address_change`](super::Subsystem::address_change)).
    pub(crate) withdrawn: Mutex<Vec<std::net::IpAddr>>,
}

impl fmt::Debug for DeviceRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRecord")
            .field("info", &self.info)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl DeviceRecord {
    pub(crate) fn new(info: DeviceInfo, driver: Arc<dyn HotplugDevice>) -> Arc<DeviceRecord> {
        Arc::new(DeviceRecord {
            info,
            driver,
            state: AtomicU8::new(0),
            gate: Arc::new(RemovalGate::new()),
            consumers: Mutex::new(Vec::new()),
            reason: Mutex::new(None),
            withdrawn: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn state(&self) -> DeviceState {
        DeviceState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Live → Revoked, ordered with [`DeviceRef::open`] (which records its
    /// consumer under the same lock): every open either finished and was
    /// recorded, or fails.
    pub(crate) fn set_revoked(&self, reason: RemovalReason) {
        let _c = lock(&self.consumers);
        *lock(&self.reason) = Some(reason);
        self.state.store(1, Ordering::Release);
    }

    /// Why the device is being (or was) removed.
    pub(crate) fn removal_reason(&self) -> Option<RemovalReason> {
        *lock(&self.reason)
    }

    pub(crate) fn set_dead(&self) {
        self.state.store(2, Ordering::Release);
    }

    /// Consumers with open contexts: (name, how many), in first-open order.
    pub(crate) fn live_consumers(&self) -> Vec<(String, usize)> {
        let mut c = lock(&self.consumers);
        c.retain(|r| r.ctx.strong_count() > 0);
        let mut out: Vec<(String, usize)> = Vec::new();
        for r in c.iter() {
            match out.iter_mut().find(|(n, _)| *n == r.name) {
                Some((_, k)) => *k += 1,
                None => out.push((r.name.clone(), 1)),
            }
        }
        out
    }

    /// Consumers still holding the device: the attributed ones, plus
    /// contexts the backend counts that nobody opened through the subsystem.
    pub(crate) fn holders(&self) -> Vec<(String, usize)> {
        let mut named = self.live_consumers();
        let attributed: usize = named.iter().map(|(_, k)| k).sum();
        if let Some(total) = self.driver.open_contexts() {
            if total > attributed {
                named.push((UNATTRIBUTED.to_string(), total - attributed));
            }
        }
        named
    }
}

/// A device of the registry, as upcalls and lookups give it out. Cheap to
/// clone; holding one does not keep the device in use (only contexts do).
#[derive(Clone)]
pub struct DeviceRef {
    pub(crate) rec: Arc<DeviceRecord>,
}

impl fmt::Debug for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rec.fmt(f)
    }
}

impl DeviceRef {
    /// Identity: name, backend, namespace, generation.
    pub fn info(&self) -> &DeviceInfo {
        &self.rec.info
    }

    /// Name.
    pub fn name(&self) -> &str {
        &self.rec.info.name
    }

    /// Namespace.
    pub fn namespace(&self) -> NamespaceId {
        self.rec.info.namespace
    }

    /// Generation.
    pub fn generation(&self) -> Generation {
        self.rec.info.generation
    }

    /// Backend.
    pub fn backend(&self) -> BackendKind {
        self.rec.info.backend
    }

    /// Where the device is in its life.
    pub fn state(&self) -> DeviceState {
        self.rec.state()
    }

    /// Why the device is being (or was) removed; `None` while it is live.
    pub fn removal_reason(&self) -> Option<RemovalReason> {
        self.rec.removal_reason()
    }

    /// The device-list entry of this instance.
    pub fn device(&self) -> Device {
        self.rec.driver.device()
    }

    /// Opens the device (`ibv_open_device`) on behalf of `consumer`, the
    /// name a removal reports if the consumer does not let go in time.
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device's removal started; the backend's error.
    pub fn open(&self, consumer: &str) -> verbs::Result<Context> {
        let mut c = lock(&self.rec.consumers);
        if self.rec.state() != DeviceState::Live {
            return Err(verbs::Error::new(
                Verb::OpenDevice,
                ErrorKind::NoDevice,
                format!("{} ({}) was removed", self.name(), self.generation()),
            ));
        }
        let ctx = self.rec.driver.device().open()?;
        c.retain(|r| r.ctx.strong_count() > 0);
        c.push(ConsumerRec {
            name: consumer.to_string(),
            ctx: Arc::downgrade(ctx.ops()),
        });
        Ok(ctx)
    }

    /// Consumers that opened the device through [`DeviceRef::open`] and still
    /// have contexts open: (name, number of contexts).
    pub fn consumers(&self) -> Vec<(String, usize)> {
        self.rec.live_consumers()
    }

    /// The device's removal gate.
    pub fn gate(&self) -> &Arc<RemovalGate> {
        &self.rec.gate
    }

    /// Wraps a QP of this device so that its fast path passes the device's
    /// removal gate (and fails with `ENODEV` once removal made it inert).
    pub fn guard_qp(&self, qp: Qp) -> GuardedQp {
        GuardedQp::new(qp, self.rec.gate.clone())
    }

    /// Wraps a CQ of this device likewise.
    pub fn guard_cq(&self, cq: Cq) -> GuardedCq {
        GuardedCq::new(cq, self.rec.gate.clone())
    }

    /// The soft device behind this entry, if it is one.
    pub fn soft_device(&self) -> Option<Arc<SoftDevice>> {
        self.rec
            .driver
            .as_ref()
            .as_any()
            .downcast_ref::<SoftPlugged>()
            .map(|p| p.dev.clone())
    }

    /// The addresses removed from this instance's interface since it was
    /// plugged (and not given back): its GIDs for them stay, but nothing
    /// should bind through them.
    pub fn withdrawn_addrs(&self) -> Vec<std::net::IpAddr> {
        lock(&self.rec.withdrawn).clone()
    }

    /// Whether two references name the same device instance.
    pub fn same_instance(&self, other: &DeviceRef) -> bool {
        Arc::ptr_eq(&self.rec, &other.rec)
    }
}
