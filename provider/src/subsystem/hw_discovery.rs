//! Discovery of hardware devices (feature `hardware`): a scan, on demand or
//! periodic, that adds and removes hardware devices in a [`Subsystem`] as
//! the kernel shows them, and reads the kernel's netns mode.
//!
//! # What a scan reads
//!
//! A [`DeviceSource`] lists the devices of one network namespace with their
//! identity (node GUID, and the kernel's instance: the device index over
//! netlink, the uverbs node over sysfs) and whether user space can open
//! them (a device whose uverbs node is gone is being unregistered: it
//! counts as gone). [`AutoSource`] asks RDMA netlink (the `rdma dev`
//! dump, answered for the namespace the socket was created in) and falls
//! back to sysfs (`/sys/class/infiniband`, whose view is that of the
//! namespace sysfs was mounted in) where netlink is unavailable. Without an
//! RDMA core in the kernel it lists what libibverbs lists ([`VerbsSource`]):
//! the devices of a libibverbs that has its own, such as softverbs'
//! `libibverbs.so.1`.
//!
//! # Namespaces
//!
//! Each *view* pairs a subsystem namespace with a real network namespace:
//! [`NamespaceId::INIT`] with the caller's own, others added with
//! [`HwDiscovery::add_view`] (`/run/netns/<name>`, `/proc/<pid>/ns/net`;
//! two paths naming the same namespace — same nsfs inode — are one view).
//! A foreign view is listed from a thread that entered it (`setns(2)`,
//! `CAP_SYS_ADMIN`). In exclusive mode a device belongs to the view it is
//! seen in; a device seen in another view than before was moved
//! (`rdma dev set <dev> netns <ns>`) and becomes [`Subsystem::move_device`]:
//! an unplug with reason `NetnsMove` and a replug there. In shared mode
//! every device is in the initial namespace and only that view is read.
//!
//! The kernel's mode is read with [`read_netns_mode`]: RDMA netlink
//! (`RDMA_NLDEV_CMD_SYS_GET`, what `rdma system show` prints) and, where
//! that is unavailable, the `ib_core` module parameter `netns_mode` in sysfs,
//! which reflects the same kernel variable.
//!
//! # What a scan changes
//!
//! The scan keeps a ledger of the devices it added and compares it with
//! what it sees ([`diff`]): new devices are added, vanished ones removed, a
//! device whose identity changed (re-registered, replaced) is removed and
//! added again, a moved one is moved. A device the subsystem lost otherwise
//! (removed by its DEVICE_FATAL monitor, or by an administrator) is not
//! added again until it disappears from the scan or its identity changes —
//! a real replug. A view that could not be listed changes nothing.

use crate::sys::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::device::{DeviceFactory, DeviceInfo, DeviceState, Generation};
use super::error::{serr, Result};
use super::hw::{HwEventHub, HwFactory, NetnsBindings};
use super::namespace::{NamespaceId, NetnsMode};
use super::registry::Subsystem;
use super::removal::RemovalReport;
use crate::hw::netns::NetnsId;
use crate::hw::{netlink, sysfs};
use crate::verbs::backend::DeviceOps;
use crate::verbs::BackendKind;

/// Which instance of a device the kernel shows: a device whose identity
/// changed was replaced (or re-registered).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// Node GUID.
    pub node_guid: Option<u64>,
    /// The kernel's instance (`index 3` over netlink, `uverbs0` over sysfs).
    pub instance: Option<String>,
}

impl Identity {
    /// Whether both name the same instance (unknown parts match anything).
    pub fn same_as(&self, other: &Identity) -> bool {
        fn eq<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            match (a, b) {
                (Some(x), Some(y)) => x == y,
                _ => true,
            }
        }
        eq(&self.node_guid, &other.node_guid) && eq(&self.instance, &other.instance)
    }
}

/// A device a source lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresentDevice {
    /// Name.
    pub name: String,
    /// Which instance.
    pub identity: Identity,
    /// User space can open it (it has a uverbs node).
    pub openable: bool,
}

/// Lists the RDMA devices of a network namespace.
pub trait DeviceSource: Send + Sync {
    /// The devices present now.
    ///
    /// # Errors
    ///
    /// The source cannot list (a scan then changes nothing in its view).
    fn list(&self) -> io::Result<Vec<PresentDevice>>;

    /// Whether the answer depends on the calling thread's network namespace
    /// (netlink: a foreign view is then listed from inside it) rather than
    /// on something fixed (a sysfs mount).
    fn follows_netns(&self) -> bool {
        true
    }

    /// What it reads, for reports.
    fn describe(&self) -> String;
}

/// RDMA netlink: the device dump, and each device's uverbs node.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetlinkSource;

impl DeviceSource for NetlinkSource {
    fn list(&self) -> io::Result<Vec<PresentDevice>> {
        let mut out = Vec::new();
        for d in netlink::devices()? {
            let openable = match netlink::uverbs_chardev(d.index) {
                Ok(c) => c.is_some(),
                // A kernel that cannot say: assume it can be opened.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) => true,
                Err(e) => return Err(e),
            };
            out.push(PresentDevice {
                identity: Identity {
                    node_guid: d.node_guid,
                    instance: Some(format!("index {}", d.index)),
                },
                name: d.name,
                openable,
            });
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        "RDMA netlink".to_string()
    }
}

/// sysfs under `root` (normally `/sys`).
#[derive(Debug, Clone)]
pub struct SysfsSource {
    root: PathBuf,
}

impl SysfsSource {
    /// Reads `<root>/class/infiniband` and `<root>/class/infiniband_verbs`.
    pub fn new(root: &Path) -> SysfsSource {
        SysfsSource {
            root: root.to_path_buf(),
        }
    }
}

impl DeviceSource for SysfsSource {
    fn list(&self) -> io::Result<Vec<PresentDevice>> {
        Ok(sysfs::devices(&self.root)?
            .into_iter()
            .map(|d| PresentDevice {
                identity: Identity {
                    node_guid: d.node_guid,
                    instance: d.uverbs.clone(),
                },
                openable: d.uverbs.is_some(),
                name: d.name,
            })
            .collect())
    }

    fn follows_netns(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!("sysfs at {}", self.root.display())
    }
}

/// The devices libibverbs itself lists (`ibv_get_device_list`), with their
/// node GUID and uverbs node name as identity.
///
/// With rdma-core's library this is the sysfs view again (rdma-core reads
/// sysfs); it matters for a libibverbs whose devices the kernel does not
/// know, such as softverbs' own `libibverbs.so.1` (`emulator/ibverbs`),
/// which lists its soft devices and drops a device from the list when it
/// is unplugged. It answers for the namespace sysfs was mounted in (with
/// rdma-core) or for the process (without a kernel device), never for the
/// calling thread's.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerbsSource;

impl DeviceSource for VerbsSource {
    fn list(&self) -> io::Result<Vec<PresentDevice>> {
        let devices = crate::hw::list_devices(None).map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        Ok(devices
            .iter()
            .map(|d| PresentDevice {
                name: d.name().to_string(),
                identity: Identity {
                    node_guid: Some(d.node_guid().0),
                    instance: Some(d.uverbs_name().to_string()),
                },
                openable: true,
            })
            .collect())
    }

    fn follows_netns(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "ibv_get_device_list".to_string()
    }
}

/// RDMA netlink, falling back to sysfs (`/sys`) in the process's own
/// network namespace when netlink is unavailable; when that is because the
/// kernel has no RDMA core (sysfs shows no device either), the devices
/// libibverbs lists ([`VerbsSource`]: a libibverbs with devices of its own,
/// such as softverbs' library). A kernel with an RDMA core is the only
/// source of its devices: real NICs are listed as before.
#[derive(Debug, Clone)]
pub struct AutoSource {
    sysfs: SysfsSource,
}

impl Default for AutoSource {
    fn default() -> Self {
        AutoSource {
            sysfs: SysfsSource::new(Path::new("/sys")),
        }
    }
}

impl DeviceSource for AutoSource {
    fn list(&self) -> io::Result<Vec<PresentDevice>> {
        // sysfs and libibverbs show the namespace sysfs was mounted in (or
        // the process's own): only valid in the process's own.
        let own_netns = || {
            let own = NetnsId::of_path(Path::new("/proc/self/ns/net")).ok();
            own.is_some() && NetnsId::current().ok() == own
        };
        let kernel = match NetlinkSource.list() {
            // The kernel has an RDMA core: its answer, as always.
            Ok(v) => return Ok(v),
            Err(_) if own_netns() => self.sysfs.list()?,
            Err(e) => return Err(e),
        };
        if !kernel.is_empty() {
            return Ok(kernel);
        }
        // No RDMA core in the kernel, so no kernel device: a libibverbs with
        // devices of its own, or none.
        match VerbsSource.list() {
            Ok(v) => Ok(v),
            // No RDMA subsystem and no user-space device: nothing present.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::ENOSYS) => {
                Ok(kernel)
            }
            Err(e) => Err(e),
        }
    }

    fn describe(&self) -> String {
        "RDMA netlink, else sysfs; else ibv_get_device_list".to_string()
    }
}

/// Where the netns mode was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSource {
    /// RDMA netlink (`RDMA_NLDEV_CMD_SYS_GET`).
    Netlink,
    /// `/sys/module/ib_core/parameters/netns_mode`.
    Sysfs,
}

/// The kernel's RDMA netns mode, and where it was read.
///
/// # Errors
///
/// Neither netlink nor the `ib_core` parameter is available (no RDMA
/// subsystem): the netlink error.
pub fn read_netns_mode() -> io::Result<(NetnsMode, ModeSource)> {
    match netlink::netns_mode() {
        Ok(m) => Ok((m, ModeSource::Netlink)),
        Err(e) => match sysfs::netns_mode(Path::new("/sys")) {
            Ok(m) => Ok((m, ModeSource::Sysfs)),
            Err(_) => Err(e),
        },
    }
}

/// One change a scan makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new device, in `ns`.
    Add {
        /// Device.
        name: String,
        /// Where.
        ns: NamespaceId,
    },
    /// A device that vanished (or cannot be opened any more).
    Remove {
        /// Device.
        name: String,
    },
    /// A device whose identity changed: removed, then added in `ns`.
    Replace {
        /// Device.
        name: String,
        /// Where.
        ns: NamespaceId,
    },
    /// A device seen in another namespace's view than before.
    Move {
        /// Device.
        name: String,
        /// Its view before.
        from: NamespaceId,
        /// Its view now.
        to: NamespaceId,
    },
}

/// A device in a view: where, and which instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    /// The view's namespace.
    pub ns: NamespaceId,
    /// Which instance.
    pub identity: Identity,
}

/// What to change, from what was known (the ledger), what is seen now,
/// the devices not to add back (with the identity they were lost with) and
/// the views that could not be listed (their known devices stay).
pub fn diff(
    known: &BTreeMap<String, Sighting>,
    seen: &BTreeMap<String, Sighting>,
    ignored: &BTreeMap<String, Identity>,
    unlisted: &BTreeSet<NamespaceId>,
) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, k) in known {
        match seen.get(name) {
            None if unlisted.contains(&k.ns) => {}
            None => out.push(Change::Remove { name: name.clone() }),
            Some(s) if !s.identity.same_as(&k.identity) => out.push(Change::Replace {
                name: name.clone(),
                ns: s.ns,
            }),
            Some(s) if s.ns != k.ns => out.push(Change::Move {
                name: name.clone(),
                from: k.ns,
                to: s.ns,
            }),
            Some(_) => {}
        }
    }
    for (name, s) in seen {
        if known.contains_key(name) {
            continue;
        }
        if ignored.get(name).is_some_and(|id| id.same_as(&s.identity)) {
            continue;
        }
        out.push(Change::Add {
            name: name.clone(),
            ns: s.ns,
        });
    }
    out
}

/// What a scan did.
#[derive(Debug, Clone, Default)]
pub struct ScanReport {
    /// Devices seen (openable), over every view read.
    pub present: usize,
    /// The changes it decided.
    pub changes: Vec<Change>,
    /// Devices added (including the second half of replacements).
    pub added: Vec<DeviceInfo>,
    /// Removals it ran (including the first half of replacements).
    pub removed: Vec<RemovalReport>,
    /// Devices moved, as they are now.
    pub moved: Vec<DeviceInfo>,
    /// What failed (a view that could not be listed, a device that could
    /// not be added).
    pub errors: Vec<String>,
}

impl fmt::Display for ScanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} present, {} added, {} removed, {} moved",
            self.present,
            self.added.len(),
            self.removed.len(),
            self.moved.len()
        )?;
        for e in &self.errors {
            write!(f, "; {e}")?;
        }
        Ok(())
    }
}

/// A view: a subsystem namespace, the real network namespace behind it and
/// how to list it.
struct View {
    ns: NamespaceId,
    path: Option<PathBuf>,
    id: Option<NetnsId>,
    source: Arc<dyn DeviceSource>,
}

struct Known {
    sighting: Sighting,
    generation: Generation,
}

#[derive(Default)]
struct Ledger {
    known: BTreeMap<String, Known>,
    ignored: BTreeMap<String, Identity>,
}

/// Makes the factory of a discovered device.
pub type FactoryMaker = Box<dyn Fn(&str) -> Arc<dyn DeviceFactory> + Send + Sync>;

/// Adds and removes hardware devices in a subsystem as the kernel shows
/// them (see the module documentation).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use softverbs::subsystem::{HwDiscovery, Subsystem};
/// let sub = Subsystem::global();
/// let disc = HwDiscovery::new(&sub);
/// disc.sync_mode()?; // the subsystem follows `rdma system show`
/// println!("{}", disc.scan()?);
/// let _thread = disc.start(Duration::from_secs(1)); // and keeps following
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
pub struct HwDiscovery {
    sub: Arc<Subsystem>,
    views: Mutex<Vec<View>>,
    bindings: Arc<NetnsBindings>,
    hub: Arc<HwEventHub>,
    factory: FactoryMaker,
    ledger: Mutex<Ledger>,
    scanning: Mutex<()>,
}

impl fmt::Debug for HwDiscovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwDiscovery")
            .field("views", &lock(&self.views).iter().map(|v| v.ns).collect::<Vec<_>>())
            .field("known", &lock(&self.ledger).known.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl HwDiscovery {
    /// Discovery for `sub` over [`AutoSource`], making [`HwFactory`]s.
    pub fn new(sub: &Arc<Subsystem>) -> Arc<HwDiscovery> {
        let bindings = NetnsBindings::new();
        let hub = HwEventHub::new();
        let (s, b, h) = (Arc::downgrade(sub), bindings.clone(), hub.clone());
        let factory: FactoryMaker = Box::new(move |name| match s.upgrade() {
            Some(sub) => HwFactory::with(&sub, name, b.clone(), h.clone()) as Arc<dyn DeviceFactory>,
            None => Arc::new(Orphan(name.to_string())),
        });
        HwDiscovery::with_parts(sub, Arc::new(AutoSource::default()), bindings, hub, factory)
    }

    /// Discovery with its own source for the initial view and its own
    /// factories (tests; other device kinds).
    pub fn with_parts(
        sub: &Arc<Subsystem>,
        source: Arc<dyn DeviceSource>,
        bindings: Arc<NetnsBindings>,
        hub: Arc<HwEventHub>,
        factory: FactoryMaker,
    ) -> Arc<HwDiscovery> {
        Arc::new(HwDiscovery {
            sub: sub.clone(),
            views: Mutex::new(vec![View {
                ns: NamespaceId::INIT,
                path: None,
                id: NetnsId::current().ok(),
                source,
            }]),
            bindings,
            hub,
            factory,
            ledger: Mutex::default(),
            scanning: Mutex::new(()),
        })
    }

    /// The hardware device events (port changes, DEVICE_FATAL) of the
    /// devices this discovery added.
    pub fn events(&self) -> &Arc<HwEventHub> {
        &self.hub
    }

    /// Which real namespace stands behind which subsystem namespace.
    pub fn bindings(&self) -> &Arc<NetnsBindings> {
        &self.bindings
    }

    /// Reads the kernel's netns mode and switches the subsystem to it.
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` without an RDMA subsystem; `EBUSY` if the modes differ
    /// while the subsystem has namespaces other than the initial one.
    pub fn sync_mode(&self) -> Result<NetnsMode> {
        let (mode, _) =
            read_netns_mode().map_err(|e| serr!(SetMode, NotSupported, "cannot read the RDMA netns mode: {e}"))?;
        self.sub.set_mode(mode)?;
        Ok(mode)
    }

    /// Adds a view: subsystem namespace `ns` stands for the network
    /// namespace at `path`, listed with [`AutoSource`] from inside it.
    ///
    /// # Errors
    ///
    /// `ENOENT` if `path` names no namespace or `ns` does not exist;
    /// `EBUSY` if another view already reads that namespace.
    pub fn add_view(&self, ns: NamespaceId, path: &Path) -> Result<()> {
        self.add_view_with(ns, Some(path), Arc::new(AutoSource::default()))
    }

    /// Adds a view read by `source`; `path` (if any) is the namespace it is
    /// listed from (when the source follows the namespace) and where its
    /// devices are opened.
    ///
    /// # Errors
    ///
    /// As [`HwDiscovery::add_view`].
    pub fn add_view_with(&self, ns: NamespaceId, path: Option<&Path>, source: Arc<dyn DeviceSource>) -> Result<()> {
        if !self.sub.namespaces().iter().any(|(id, _)| *id == ns) {
            return Err(serr!(LookupNamespace, NotFound, "no namespace {ns}"));
        }
        let id = match path {
            Some(p) => Some(NetnsId::of_path(p).map_err(|e| serr!(LookupNamespace, NotFound, "{}: {e}", p.display()))?),
            None => None,
        };
        let mut views = lock(&self.views);
        if let Some(other) = views.iter().find(|v| v.ns != ns && id.is_some() && v.id == id) {
            return Err(serr!(
                LookupNamespace,
                Busy,
                "{} is already read as {}",
                path.map_or_else(String::new, |p| p.display().to_string()),
                other.ns
            ));
        }
        views.retain(|v| v.ns != ns);
        views.push(View {
            ns,
            path: path.map(Path::to_path_buf),
            id,
            source,
        });
        match path {
            Some(p) => self.bindings.bind(ns, p),
            None => self.bindings.unbind(ns),
        }
        Ok(())
    }

    /// Stops reading the view of `ns` (its devices stay until the next
    /// scan sees them elsewhere... or not at all: they are then removed).
    pub fn remove_view(&self, ns: NamespaceId) {
        lock(&self.views).retain(|v| v.ns != ns || ns.is_init());
        if !ns.is_init() {
            self.bindings.unbind(ns);
        }
    }

    /// One scan: read every view, change the subsystem to match.
    ///
    /// # Errors
    ///
    /// `EBUSY` if a scan is already running (e.g. called from an upcall of
    /// the running one). Per-device failures are in the report.
    pub fn scan(&self) -> Result<ScanReport> {
        let _one = match self.scanning.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(serr!(AddDevice, Busy, "a discovery scan is running")),
        };
        let mut report = ScanReport::default();
        let mode = self.sub.mode();
        // 1. What the kernel shows.
        let mut seen: BTreeMap<String, Sighting> = BTreeMap::new();
        let mut unlisted = BTreeSet::new();
        let views: Vec<(NamespaceId, Option<PathBuf>, Arc<dyn DeviceSource>)> = lock(&self.views)
            .iter()
            .filter(|v| mode == NetnsMode::Exclusive || v.ns.is_init())
            .map(|v| (v.ns, v.path.clone(), v.source.clone()))
            .collect();
        for (ns, path, source) in views {
            let listed = match (&path, source.follows_netns()) {
                (Some(p), true) => crate::hw::netns::in_netns(p, || source.list()).and_then(|r| r),
                _ => source.list(),
            };
            match listed {
                Ok(devs) => {
                    for d in devs.into_iter().filter(|d| d.openable) {
                        seen.entry(d.name).or_insert(Sighting {
                            ns,
                            identity: d.identity,
                        });
                    }
                }
                Err(e) => {
                    unlisted.insert(ns);
                    report.errors.push(format!("{ns} ({}): {e}", source.describe()));
                }
            }
        }
        report.present = seen.len();
        // 2. What the subsystem did meanwhile, and the diff.
        let changes = {
            let mut l = lock(&self.ledger);
            let Ledger { known, ignored } = &mut *l;
            known.retain(|name, k| match self.sub.device(name) {
                Ok(d) if d.state() == DeviceState::Live => {
                    // Possibly moved by the application (a new generation).
                    k.generation = d.generation();
                    true
                }
                _ => {
                    ignored.insert(name.clone(), k.sighting.identity.clone());
                    false
                }
            });
            ignored.retain(|name, id| seen.get(name).is_some_and(|s| s.identity.same_as(id)));
            let known_view: BTreeMap<String, Sighting> =
                known.iter().map(|(n, k)| (n.clone(), k.sighting.clone())).collect();
            diff(&known_view, &seen, ignored, &unlisted)
        };
        // 3. Apply, without the ledger held (upcalls may look at us).
        for c in &changes {
            match c {
                Change::Add { name, ns } => self.add(name, *ns, &seen, &mut report),
                Change::Remove { name } => self.remove(name, &mut report),
                Change::Replace { name, ns } => {
                    self.remove(name, &mut report);
                    self.add(name, *ns, &seen, &mut report);
                }
                Change::Move { name, to, .. } => match self.sub.move_device(name, *to) {
                    Ok((removed, info)) => {
                        if let Some(k) = lock(&self.ledger).known.get_mut(name) {
                            k.sighting.ns = *to;
                            k.generation = info.generation;
                        }
                        report.removed.push(removed);
                        report.moved.push(info);
                    }
                    Err(e) => {
                        report.errors.push(format!("move {name} to {to}: {e}"));
                        self.remove(name, &mut report);
                        self.add(name, *to, &seen, &mut report);
                    }
                },
            }
        }
        report.changes = changes;
        Ok(report)
    }

    fn add(&self, name: &str, ns: NamespaceId, seen: &BTreeMap<String, Sighting>, report: &mut ScanReport) {
        let Some(sighting) = seen.get(name).cloned() else {
            return;
        };
        let target = if self.sub.namespaces().iter().any(|(id, _)| *id == ns) {
            ns
        } else {
            NamespaceId::INIT
        };
        let generation = match self.sub.add_device((self.factory)(name), target) {
            Ok(info) => {
                let g = info.generation;
                report.added.push(info);
                g
            }
            Err(e) => match self.sub.device(name) {
                // Added by someone else already: adopt it.
                Ok(d) if d.backend() == BackendKind::Hardware && d.state() == DeviceState::Live => d.generation(),
                _ => {
                    report.errors.push(format!("add {name}: {e}"));
                    return;
                }
            },
        };
        lock(&self.ledger)
            .known
            .insert(name.to_string(), Known { sighting, generation });
    }

    fn remove(&self, name: &str, report: &mut ScanReport) {
        let Some(k) = lock(&self.ledger).known.remove(name) else {
            return;
        };
        match self.sub.device(name) {
            Ok(d) if d.generation() == k.generation && d.state() == DeviceState::Live => {
                match self.sub.remove_device(name) {
                    Ok(r) => report.removed.push(r),
                    Err(e) => report.errors.push(format!("remove {name}: {e}")),
                }
            }
            _ => {}
        }
    }

    /// The devices the discovery added and still follows: (name, the view's
    /// namespace, generation).
    pub fn known(&self) -> Vec<(String, NamespaceId, Generation)> {
        lock(&self.ledger)
            .known
            .iter()
            .map(|(n, k)| (n.clone(), k.sighting.ns, k.generation))
            .collect()
    }

    /// Scans every `period` on a thread of its own until the returned
    /// handle is dropped or stopped. Each scan's report goes to `on_scan`.
    pub fn start_with(
        self: &Arc<Self>,
        period: Duration,
        mut on_scan: impl FnMut(Result<ScanReport>) + Send + 'static,
    ) -> io::Result<DiscoveryThread> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (me, flag) = (self.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("hw-discovery".to_string())
            .spawn(move || loop {
                on_scan(me.scan());
                let (m, cv) = &*flag;
                let stopped = lock(m);
                let (stopped, _) = cv
                    .wait_timeout_while(stopped, period, |s| !*s)
                    .unwrap_or_else(|p| p.into_inner());
                if *stopped {
                    return;
                }
            })?;
        Ok(DiscoveryThread {
            stop,
            handle: Some(handle),
        })
    }

    /// [`HwDiscovery::start_with`], ignoring the reports.
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub fn start(self: &Arc<Self>, period: Duration) -> io::Result<DiscoveryThread> {
        self.start_with(period, |_| {})
    }
}

/// A factory for a device found after its subsystem was dropped.
struct Orphan(String);

impl DeviceFactory for Orphan {
    fn name(&self) -> &str {
        &self.0
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Hardware
    }

    fn instantiate(&self, _ns: NamespaceId) -> crate::verbs::Result<Arc<dyn super::HotplugDevice>> {
        Err(crate::verbs::Error::new(
            crate::verbs::Verb::OpenDevice,
            crate::verbs::ErrorKind::NoDevice,
            "the subsystem is gone",
        ))
    }
}

/// A periodic discovery; dropping it stops the scans (and waits for the
/// one running).
#[derive(Debug)]
pub struct DiscoveryThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl DiscoveryThread {
    /// Stops the scans and waits for the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let (m, cv) = &*self.stop;
        *lock(m) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for DiscoveryThread {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests;
