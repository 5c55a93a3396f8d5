//! Hardware devices under the subsystem (feature `hardware`): the hardware
//! backend's half of hotplug.
//!
//! - [`HwFactory`] ([`DeviceFactory`]): brings a kernel RDMA device, by
//!   name, under a [`Subsystem`] — opened in the real network namespace
//!   bound to the subsystem namespace it joins (see [`NetnsBindings`]), or
//!   in the caller's.
//! - [`HwPlugged`] ([`HotplugDevice`]): one instance of it. Its revoke,
//!   DEVICE_FATAL and inert steps act on every context and object of the
//!   device (`hw::device_life`); its monitor thread reads the device's async
//!   events on a context of its own.
//!
//! # The hotplug path on hardware
//!
//! 1. The kernel reports the device gone: DEVICE_FATAL on every open
//!    context (a driver that can disassociate user contexts — mlx5 — does
//!    so right away; one that cannot — rxe, siw — first removes the uverbs
//!    node and then waits for every context to close), or the discovery
//!    scan ([`HwDiscovery`](super::hw_discovery::HwDiscovery)) sees it
//!    vanish or move to another network namespace.
//! 2. The monitor closes its own context (so that the kernel is not kept
//!    waiting by it), marks the device gone and calls
//!    [`Subsystem::remove_device`] for this instance. (The discovery scan
//!    calls it, or [`Subsystem::move_device`], for a vanished or moved
//!    device.) Applications' contexts hold the kernel's DEVICE_FATAL back.
//! 3. The subsystem's sequence runs ([`removal`](super::removal)): Revoked;
//!    [`HotplugDevice::revoke`] — control verbs fail with `ENODEV`, QPs go
//!    to ERR, posts go to the shadow rings only, CQ polls return the real
//!    completions and then `WR_FLUSH_ERR` for every work request left, in
//!    post order, send queue first; armed CQ notifications fire — CM
//!    hooks, clients' `remove`; DEVICE_FATAL released on every context (the
//!    last async event); consumers given the deadline to close; then inert.
//! 4. A device that comes back (re-registered, replugged, moved back) is a
//!    new instance: a new generation, a new life, fresh objects.

use crate::sys::lock;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use super::device::{DeviceFactory, DeviceRef, Generation, HotplugDevice};
use super::namespace::NamespaceId;
use super::registry::Subsystem;
use crate::hw::device_life::HwDeviceLife;
use crate::hw::monitor::Monitor;
use crate::hw::{HwDevice, HwEvent};
use crate::verbs::backend::DeviceOps;
use crate::verbs::{self, BackendKind, Device, Guid};

/// Which real network namespace (a path such as `/run/netns/blue` or
/// `/proc/<pid>/ns/net`) stands behind which subsystem namespace. A
/// namespace with no binding is the caller's own (so is
/// [`NamespaceId::INIT`] unless bound). Shared by a discovery and the
/// factories it makes.
#[derive(Debug, Default)]
pub struct NetnsBindings {
    map: RwLock<BTreeMap<NamespaceId, PathBuf>>,
}

impl NetnsBindings {
    /// No bindings.
    pub fn new() -> Arc<NetnsBindings> {
        Arc::new(NetnsBindings::default())
    }

    /// Binds `ns` to the network namespace at `path`.
    pub fn bind(&self, ns: NamespaceId, path: &Path) {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ns, path.to_path_buf());
    }

    /// Removes the binding of `ns`.
    pub fn unbind(&self, ns: NamespaceId) {
        self.map.write().unwrap_or_else(|p| p.into_inner()).remove(&ns);
    }

    /// The network namespace behind `ns` (`None`: the caller's).
    pub fn path(&self, ns: NamespaceId) -> Option<PathBuf> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).get(&ns).cloned()
    }

    /// Every binding.
    pub fn all(&self) -> Vec<(NamespaceId, PathBuf)> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, p)| (*n, p.clone()))
            .collect()
    }
}

/// A device-wide event of a hardware device under the subsystem, with the
/// identity every device event carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HwDeviceEvent {
    /// The device's namespace (`None` if the instance was no longer
    /// registered when the event came).
    pub namespace: Option<NamespaceId>,
    /// The device's name.
    pub device: String,
    /// The instance's generation (`None` as for `namespace`).
    pub generation: Option<Generation>,
    /// What happened.
    pub event: HwEvent,
}

/// Fans hardware device events out to subscribers.
#[derive(Debug, Default)]
pub struct HwEventHub {
    subs: Mutex<Vec<mpsc::Sender<HwDeviceEvent>>>,
}

impl HwEventHub {
    /// A hub without subscribers.
    pub fn new() -> Arc<HwEventHub> {
        Arc::new(HwEventHub::default())
    }

    /// Receives every later event (port changes, DEVICE_FATAL, …).
    pub fn subscribe(&self) -> mpsc::Receiver<HwDeviceEvent> {
        let (tx, rx) = mpsc::channel();
        lock(&self.subs).push(tx);
        rx
    }

    pub(crate) fn emit(&self, ev: &HwDeviceEvent) {
        lock(&self.subs).retain(|s| s.send(ev.clone()).is_ok());
    }
}

/// Brings a hardware device, by name, under a subsystem (see the module
/// documentation).
///
/// # Examples
///
/// ```no_run
/// use softverbs::subsystem::{HwFactory, NamespaceId, Subsystem};
/// let sub = Subsystem::global();
/// let info = sub.add_device(HwFactory::new(&sub, "mlx5_0"), NamespaceId::INIT)?;
/// println!("{} is {}", info.name, info.generation);
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
pub struct HwFactory {
    name: String,
    sub: Weak<Subsystem>,
    bindings: Arc<NetnsBindings>,
    hub: Arc<HwEventHub>,
    monitor: bool,
}

impl fmt::Debug for HwFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwFactory")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl HwFactory {
    /// A factory for the device named `name` under `sub`, in the caller's
    /// network namespace, with an event monitor.
    pub fn new(sub: &Arc<Subsystem>, name: &str) -> Arc<HwFactory> {
        HwFactory::with(sub, name, NetnsBindings::new(), HwEventHub::new())
    }

    /// A factory that opens the device in the network namespace bound to
    /// the subsystem namespace it joins, and reports device events to `hub`.
    pub fn with(
        sub: &Arc<Subsystem>,
        name: &str,
        bindings: Arc<NetnsBindings>,
        hub: Arc<HwEventHub>,
    ) -> Arc<HwFactory> {
        Arc::new(HwFactory {
            name: name.to_string(),
            sub: Arc::downgrade(sub),
            bindings,
            hub,
            monitor: true,
        })
    }

    /// Where this factory's events go.
    pub fn hub(&self) -> &Arc<HwEventHub> {
        &self.hub
    }
}

impl DeviceFactory for HwFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Hardware
    }

    /// Lists the device (`ibv_get_device_list`, inside the bound network
    /// namespace if any), puts its life under the subsystem and starts its
    /// event monitor.
    ///
    /// # Errors
    ///
    /// `ENODEV` if the device is not there; the monitor's context could not
    /// be opened (the device cannot be opened at all).
    fn instantiate(&self, ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>> {
        let path = self.bindings.path(ns);
        let dev = crate::hw::find_device(&self.name, path.as_deref())?;
        let plugged = HwPlugged::plug(dev, self.sub.clone(), self.hub.clone(), self.monitor)?;
        Ok(plugged)
    }
}

/// One instance of a hardware device under the subsystem.
pub struct HwPlugged {
    dev: Arc<HwDevice>,
    life: Arc<HwDeviceLife>,
    monitor: Mutex<Option<Monitor>>,
    ports: Arc<Mutex<BTreeMap<u8, bool>>>,
}

impl fmt::Debug for HwPlugged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwPlugged")
            .field("name", &self.dev.name())
            .field("life", &self.life)
            .finish_non_exhaustive()
    }
}

impl HwPlugged {
    fn plug(
        dev: Arc<HwDevice>,
        sub: Weak<Subsystem>,
        hub: Arc<HwEventHub>,
        monitor: bool,
    ) -> verbs::Result<Arc<HwPlugged>> {
        let life = dev.life().clone();
        life.set_managed(true);
        let plugged = Arc::new(HwPlugged {
            dev: dev.clone(),
            life: life.clone(),
            monitor: Mutex::new(None),
            ports: Arc::new(Mutex::new(BTreeMap::new())),
        });
        if monitor {
            let ctx = dev.open_private()?;
            let handler = fatal_handler(
                dev.name().to_string(),
                Arc::downgrade(&life),
                sub,
                hub,
                plugged.ports.clone(),
            );
            let m = Monitor::spawn(dev.name(), ctx, handler).map_err(|e| {
                verbs::Error::new(
                    verbs::Verb::OpenDevice,
                    verbs::ErrorKind::NoMemory,
                    format!("cannot start the event monitor: {e}"),
                )
            })?;
            *lock(&plugged.monitor) = Some(m);
        }
        Ok(plugged)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        self.dev.name()
    }

    /// The device's node GUID.
    pub fn node_guid(&self) -> Guid {
        self.dev.node_guid()
    }

    /// Whether the kernel reported the device gone (DEVICE_FATAL, `EIO`).
    pub fn is_gone(&self) -> bool {
        self.life.is_gone()
    }

    /// The last port event seen for `port`: `Some(true)` after PORT_ACTIVE,
    /// `Some(false)` after PORT_ERR, `None` before either.
    pub fn port_active(&self, port: u8) -> Option<bool> {
        lock(&self.ports).get(&port).copied()
    }

    /// Whether `life` is this instance's.
    pub(crate) fn has_life(&self, life: &Arc<HwDeviceLife>) -> bool {
        Arc::ptr_eq(&self.life, life)
    }
}

/// The hardware instance behind a subsystem device, if it is one.
pub(crate) fn plugged_of(d: &DeviceRef) -> Option<&HwPlugged> {
    d.rec.driver.as_ref().as_any().downcast_ref::<HwPlugged>()
}

/// The monitor's handler: port state, events to the hub, and on
/// DEVICE_FATAL the removal of this very instance.
fn fatal_handler(
    name: String,
    life: Weak<HwDeviceLife>,
    sub: Weak<Subsystem>,
    hub: Arc<HwEventHub>,
    ports: Arc<Mutex<BTreeMap<u8, bool>>>,
) -> impl FnMut(HwEvent) + Send + 'static {
    move |event| {
        let Some(life) = life.upgrade() else {
            return;
        };
        match event {
            HwEvent::PortActive(p) => {
                lock(&ports).insert(p, true);
            }
            HwEvent::PortErr(p) => {
                lock(&ports).insert(p, false);
            }
            HwEvent::DeviceFatal => life.mark_gone(),
            HwEvent::Other(_) | HwEvent::Failing(_) => {}
        }
        let sub = sub.upgrade();
        // The instance may not be registered yet (an event right after
        // instantiation): give the registry a moment.
        let mut current = None;
        if let Some(sub) = &sub {
            for _ in 0..20 {
                current = sub
                    .device(&name)
                    .ok()
                    .filter(|d| plugged_of(d).is_some_and(|p| p.has_life(&life)));
                if current.is_some() || event != HwEvent::DeviceFatal {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        hub.emit(&HwDeviceEvent {
            namespace: current.as_ref().map(DeviceRef::namespace),
            device: name.clone(),
            generation: current.as_ref().map(DeviceRef::generation),
            event: event.clone(),
        });
        if event == HwEvent::DeviceFatal {
            match (&sub, &current) {
                (Some(sub), Some(_)) => {
                    // Busy: a removal of it is already running.
                    let _ = sub.remove_device(&name);
                }
                _ => {
                    // Not (or no longer) under a subsystem: keep the
                    // promises anyway.
                    life.revoke();
                    life.raise_fatal();
                }
            }
        }
    }
}

impl HotplugDevice for HwPlugged {
    fn device(&self) -> Device {
        Device::from_ops(self.dev.clone() as Arc<dyn DeviceOps>)
    }

    fn revoke(&self) {
        self.life.revoke();
    }

    /// Stops the monitor and lets the next listing of the name start a new
    /// life.
    fn unlist(&self) {
        if let Some(m) = lock(&self.monitor).as_ref() {
            m.stop();
        }
        self.life.unlist();
    }

    fn raise_device_fatal(&self) {
        self.life.raise_fatal();
    }

    fn open_contexts(&self) -> Option<usize> {
        Some(self.life.open_contexts())
    }

    fn make_inert(&self) {
        self.life.make_inert();
    }
}

impl Drop for HwPlugged {
    fn drop(&mut self) {
        if let Some(m) = lock(&self.monitor).take() {
            m.join();
        }
        self.life.set_managed(false);
        if self.life.is_gone() {
            // Release a DEVICE_FATAL a context may be holding back.
            self.life.raise_fatal();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subsystem::{NetnsMode, SubsystemConfig};

    #[test]
    fn bindings_and_hub() {
        let b = NetnsBindings::new();
        assert_eq!(b.path(NamespaceId::INIT), None);
        b.bind(NamespaceId::from_u32(3), Path::new("/run/netns/blue"));
        assert_eq!(b.path(NamespaceId::from_u32(3)).unwrap(), Path::new("/run/netns/blue"));
        assert_eq!(b.all().len(), 1);
        b.unbind(NamespaceId::from_u32(3));
        assert!(b.all().is_empty());

        let hub = HwEventHub::new();
        let rx = hub.subscribe();
        let dropped = hub.subscribe();
        drop(dropped);
        let ev = HwDeviceEvent {
            namespace: None,
            device: "mlx5_0".into(),
            generation: None,
            event: HwEvent::PortErr(1),
        };
        hub.emit(&ev);
        assert_eq!(rx.try_recv().unwrap(), ev);
        assert_eq!(lock(&hub.subs).len(), 1, "a dropped subscriber is forgotten");
    }

    /// The monitor's handler: port state and events for the hub; a
    /// DEVICE_FATAL for an instance the subsystem does not hold still
    /// revokes it and releases DEVICE_FATAL.
    #[test]
    fn the_monitor_handler_tracks_ports_and_handles_fatal() {
        use crate::hw::device_life::Phase;
        let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
        let life = HwDeviceLife::unlisted("hwh_0");
        life.set_managed(true);
        let hub = HwEventHub::new();
        let rx = hub.subscribe();
        let ports = Arc::new(Mutex::new(BTreeMap::new()));
        let mut h = fatal_handler(
            "hwh_0".into(),
            Arc::downgrade(&life),
            Arc::downgrade(&sub),
            hub.clone(),
            ports.clone(),
        );
        h(HwEvent::PortErr(1));
        h(HwEvent::PortActive(2));
        h(HwEvent::PortActive(1));
        assert_eq!(*lock(&ports), BTreeMap::from([(1, true), (2, true)]));
        let got: Vec<HwDeviceEvent> = rx.try_iter().collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].device.as_str(), got[0].namespace, got[0].generation),
            ("hwh_0", None, None)
        );
        assert_eq!(got[0].event, HwEvent::PortErr(1));
        assert!(life.holds_fatal());
        h(HwEvent::DeviceFatal);
        assert_eq!(life.phase(), Phase::Revoked);
        assert!(life.is_gone());
        assert!(!life.holds_fatal(), "DEVICE_FATAL released");
        assert_eq!(rx.try_recv().unwrap().event, HwEvent::DeviceFatal);
        // A life nobody holds any more: nothing happens.
        let mut h = fatal_handler("hwh_1".into(), Weak::new(), Arc::downgrade(&sub), hub, ports);
        h(HwEvent::DeviceFatal);
        assert!(rx.try_recv().is_err());
    }

    /// Without a device the factory fails cleanly and leaves nothing behind.
    #[test]
    fn a_missing_device_is_enodev() {
        let sub = Arc::new(Subsystem::new(SubsystemConfig {
            mode: NetnsMode::Exclusive,
            ..SubsystemConfig::default()
        }));
        let f = HwFactory::new(&sub, "no_such_hca0");
        assert_eq!(f.backend(), BackendKind::Hardware);
        let e = sub.add_device(f, NamespaceId::INIT).unwrap_err();
        println!("add_device(no_such_hca0): {e}");
        assert!(sub.devices(crate::subsystem::ClientScope::All).is_empty());
    }

    /// With a device: plug it, post work, remove it, and see every work
    /// request complete exactly once. Skips without one.
    #[test]
    fn device_removal_flushes_every_posted_request() {
        let devs = match crate::hw::list_devices(None) {
            Ok(d) if !d.is_empty() => d,
            Ok(_) => return println!("SKIP device_removal_flushes_every_posted_request: no RDMA device"),
            Err(e) => return println!("SKIP device_removal_flushes_every_posted_request: no RDMA device ({e})"),
        };
        let name = devs[0].name().to_string();
        drop(devs);
        let sub = Arc::new(Subsystem::new(SubsystemConfig {
            removal_deadline: Duration::from_millis(200),
            ..SubsystemConfig::default()
        }));
        let info = sub
            .add_device(HwFactory::new(&sub, &name), NamespaceId::INIT)
            .expect("plug");
        let dref = sub.device(&name).unwrap();
        assert!(plugged_of(&dref).is_some());
        let ctx = dref.open("test").expect("open");
        let pd = ctx.alloc_pd().expect("pd");
        let ch = ctx.create_comp_channel().expect("channel");
        let cq = ctx.create_cq(64, 1, Some(&ch), 0).expect("cq");
        let qp = pd
            .create_qp(&crate::verbs::QpInitAttr {
                qp_type: crate::verbs::QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: crate::verbs::QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .expect("qp");
        let mr = pd.alloc_mr(4096, crate::verbs::AccessFlags::LOCAL_WRITE).expect("mr");
        let sge = [mr.sge(0, 64).unwrap()];
        // Receives can be posted from INIT on (a RESET QP rejects them
        // with EINVAL, as rxe and the IB spec do).
        let init = crate::verbs::QpAttr {
            qp_state: crate::verbs::QpState::Init,
            pkey_index: 0,
            port_num: 1,
            ..crate::verbs::QpAttr::default()
        };
        use crate::verbs::QpAttrMask as M;
        qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            .expect("RESET -> INIT");
        let wrs: Vec<_> = (0..8).map(|i| crate::verbs::RecvWr::new(i, &sge)).collect();
        qp.post_recv(&wrs).expect("post_recv");
        cq.req_notify(false).expect("arm");
        let report = sub.remove_device(&name).expect("remove");
        println!("{report}");
        // Control verbs fail, the armed CQ was notified, DEVICE_FATAL is the
        // last async event.
        let e = pd.alloc_mr(4096, crate::verbs::AccessFlags::LOCAL_WRITE).unwrap_err();
        assert_eq!(e.kind(), crate::verbs::ErrorKind::NoDevice);
        assert_eq!(
            ch.get_cq_event(Some(Duration::from_secs(2))).expect("cq event"),
            Some(1)
        );
        cq.ack_events(1);
        let mut last = None;
        while let Some(ev) = ctx
            .get_async_event(Some(Duration::from_millis(100)))
            .expect("async event")
        {
            last = Some(ev.event_type);
        }
        assert_eq!(last, Some(crate::verbs::EventType::DeviceFatal));
        let mut wc = [crate::verbs::WorkCompletion::default(); 16];
        let mut seen = Vec::new();
        for _ in 0..1000 {
            let n = cq.poll(&mut wc).expect("poll after removal");
            seen.extend(wc[..n].iter().map(|w| (w.wr_id, w.status)));
            if seen.len() >= 8 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen.len(), 8, "{seen:?}");
        assert!(seen.iter().all(|(_, s)| *s == crate::verbs::WcStatus::WrFlushErr));
        assert_eq!(cq.poll(&mut wc).unwrap(), 0, "exactly once");
        assert_eq!(info.backend, BackendKind::Hardware);
    }
}
