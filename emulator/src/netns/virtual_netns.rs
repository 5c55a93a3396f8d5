//! The virtual namespace driver.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::Link;
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::subsystem::{
    soft_plugged, AddressChange, DeviceFactory, DeviceInfo, HotplugDevice, NamespaceId, NetnsMode, RemovalReport,
    Result, Subsystem,
};
use softverbs::verbs::{self, BackendKind, ErrorKind};

use super::{device_namespace, err, lock, NetnsDriver, INIT_NETNS};

#[derive(Debug)]
struct VLink {
    /// Its addresses, first the one it was made with.
    addrs: Vec<IpAddr>,
    ns: NamespaceId,
    device: Option<String>,
}

#[derive(Debug, Default)]
struct VState {
    netns: BTreeMap<String, NamespaceId>,
    /// One isolated network per namespace.
    fabrics: HashMap<NamespaceId, Arc<InprocFabric>>,
    links: BTreeMap<String, VLink>,
}

impl VState {
    fn fabric(&mut self, ns: NamespaceId) -> Arc<InprocFabric> {
        self.fabrics.entry(ns).or_default().clone()
    }
}

/// A portable, unprivileged namespace driver: namespaces, interfaces and the
/// devices bound to them are records in this process; each namespace is an
/// isolated in-process network, so devices reach each other only while
/// they share a namespace.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use softverbs::subsystem::{NamespaceId, Subsystem, SubsystemConfig};
/// use softverbs_emulator::netns::{NetnsDriver, VirtualNetns};
///
/// let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
/// let drv = VirtualNetns::new(sub.clone());
/// drv.add_link("veth0", "10.9.0.1".parse().unwrap())?;
/// let dev = drv.add_device("doc_vrxe0", "veth0")?;
/// assert_eq!(dev.namespace, NamespaceId::INIT);
/// let blue = drv.add_netns("blue")?;
/// drv.link_set_netns("veth0", "blue")?; // the device follows its interface
/// assert_eq!(sub.device("doc_vrxe0")?.namespace(), blue);
/// drv.del_netns("blue")?; // and comes back when the namespace goes
/// assert_eq!(sub.device("doc_vrxe0")?.namespace(), NamespaceId::INIT);
/// drv.del_device("doc_vrxe0")?;
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
#[derive(Debug)]
pub struct VirtualNetns {
    sub: Arc<Subsystem>,
    state: Arc<Mutex<VState>>,
    /// How the engines of the devices it creates make progress.
    engine: EngineMode,
}

impl VirtualNetns {
    /// A driver feeding `subsystem`, with only the initial namespace.
    pub fn new(subsystem: Arc<Subsystem>) -> VirtualNetns {
        VirtualNetns::with_engine(subsystem, EngineMode::Inline)
    }

    /// A driver feeding `subsystem` whose devices (and every instance a
    /// move brings up) run their engines in `engine` mode.
    pub fn with_engine(subsystem: Arc<Subsystem>, engine: EngineMode) -> VirtualNetns {
        let mut st = VState::default();
        st.netns.insert(INIT_NETNS.to_string(), NamespaceId::INIT);
        VirtualNetns {
            sub: subsystem,
            state: Arc::new(Mutex::new(st)),
            engine,
        }
    }

    /// The in-process network of a namespace (created on first use).
    pub fn fabric(&self, ns: NamespaceId) -> Arc<InprocFabric> {
        lock(&self.state).fabric(ns)
    }

    /// The interface a device is bound to.
    pub fn device_link(&self, device: &str) -> Option<String> {
        lock(&self.state)
            .links
            .iter()
            .find(|(_, l)| l.device.as_deref() == Some(device))
            .map(|(n, _)| n.clone())
    }
}

impl NetnsDriver for VirtualNetns {
    fn kind(&self) -> &'static str {
        "virtual"
    }

    fn subsystem(&self) -> &Arc<Subsystem> {
        &self.sub
    }

    fn add_netns(&self, name: &str) -> Result<NamespaceId> {
        if lock(&self.state).netns.contains_key(name) {
            return Err(err(ErrorKind::Busy, format!("a namespace named '{name}' exists")));
        }
        let id = self.sub.create_namespace(name)?;
        lock(&self.state).netns.insert(name.to_string(), id);
        Ok(id)
    }

    fn del_netns(&self, name: &str) -> Result<()> {
        if name == INIT_NETNS {
            return Err(err(ErrorKind::PermissionDenied, "the initial namespace stays"));
        }
        let id = {
            let mut st = lock(&self.state);
            let id = st
                .netns
                .remove(name)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no namespace '{name}'")))?;
            // Like physical interfaces in Linux, ours return to the initial
            // namespace; the subsystem moves their devices along.
            for l in st.links.values_mut().filter(|l| l.ns == id) {
                l.ns = NamespaceId::INIT;
            }
            id
        };
        let r = self.sub.delete_namespace(id);
        lock(&self.state).fabrics.remove(&id);
        r
    }

    fn netns(&self, name: &str) -> Option<NamespaceId> {
        lock(&self.state).netns.get(name).copied()
    }

    fn add_link(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let mut st = lock(&self.state);
        if st.links.contains_key(ifname) || st.links.values().any(|l| l.addrs.contains(&addr)) {
            return Err(err(
                ErrorKind::Busy,
                format!("interface '{ifname}' or address {addr} exists"),
            ));
        }
        st.links.insert(
            ifname.to_string(),
            VLink {
                addrs: vec![addr],
                ns: NamespaceId::INIT,
                device: None,
            },
        );
        Ok(())
    }

    fn link_set_netns(&self, ifname: &str, netns: &str) -> Result<()> {
        let (device, to) = {
            let mut st = lock(&self.state);
            let to = *st
                .netns
                .get(netns)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no namespace '{netns}'")))?;
            let l = st
                .links
                .get_mut(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no interface '{ifname}'")))?;
            if l.ns == to {
                return Ok(());
            }
            l.ns = to;
            (l.device.clone(), to)
        };
        // The device follows in exclusive mode; in shared mode every device
        // stays in the initial namespace.
        if let Some(dev) = device {
            if self.sub.mode() == NetnsMode::Exclusive {
                let here = self.sub.device(&dev).map(|d| d.namespace()).ok();
                if here.is_some_and(|h| h != to) {
                    self.sub.move_device(&dev, to)?;
                }
            }
        }
        Ok(())
    }

    fn link_netns(&self, ifname: &str) -> Option<NamespaceId> {
        lock(&self.state).links.get(ifname).map(|l| l.ns)
    }

    fn add_device(&self, name: &str, ifname: &str) -> Result<DeviceInfo> {
        let (addrs, ns) = {
            let st = lock(&self.state);
            let l = st
                .links
                .get(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no interface '{ifname}'")))?;
            if let Some(d) = &l.device {
                return Err(err(ErrorKind::Busy, format!("'{ifname}' already has device '{d}'")));
            }
            (l.addrs.clone(), l.ns)
        };
        let Some(&first) = addrs.first() else {
            return Err(err(ErrorKind::InvalidArgument, format!("'{ifname}' has no address")));
        };
        let ns = device_namespace(&self.sub, ns);
        let factory = Arc::new(VirtualFactory {
            config: SoftDeviceConfig {
                engine: self.engine,
                addrs,
                ..SoftDeviceConfig::new(name, first)
            },
            ifname: ifname.to_string(),
            state: self.state.clone(),
        });
        let info = self.sub.add_device(factory, ns)?;
        if let Some(l) = lock(&self.state).links.get_mut(ifname) {
            l.device = Some(name.to_string());
        }
        Ok(info)
    }

    fn del_device(&self, name: &str) -> Result<RemovalReport> {
        let report = self.sub.remove_device(name)?;
        for l in lock(&self.state).links.values_mut() {
            if l.device.as_deref() == Some(name) {
                l.device = None;
            }
        }
        Ok(report)
    }

    fn del_addr(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let device = {
            let mut st = lock(&self.state);
            let l = st
                .links
                .get_mut(ifname)
                .ok_or_else(|| err(ErrorKind::NotFound, format!("no interface '{ifname}'")))?;
            if !l.addrs.contains(&addr) {
                return Err(err(
                    ErrorKind::Other(libc::EADDRNOTAVAIL),
                    format!("'{ifname}' does not have {addr}"),
                ));
            }
            l.addrs.retain(|a| *a != addr);
            l.device.clone()
        };
        match device {
            Some(dev) => self.sub.address_change(&dev, addr, AddressChange::Removed),
            None => Ok(()),
        }
    }

    fn add_addr(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let (from, to) = {
            let mut st = lock(&self.state);
            if !st.links.contains_key(ifname) {
                return Err(err(ErrorKind::NotFound, format!("no interface '{ifname}'")));
            }
            let mut from = None;
            for (n, l) in st.links.iter_mut() {
                if n != ifname && l.addrs.contains(&addr) {
                    l.addrs.retain(|a| *a != addr);
                    from = Some(l.device.clone());
                }
            }
            let l = st.links.get_mut(ifname).expect("checked");
            if l.addrs.contains(&addr) {
                return Ok(());
            }
            l.addrs.push(addr);
            (from.flatten(), l.device.clone())
        };
        if let Some(dev) = from {
            self.sub.address_change(&dev, addr, AddressChange::Removed)?;
        }
        match to {
            Some(dev) => self.sub.address_change(&dev, addr, AddressChange::Added),
            None => Ok(()),
        }
    }
}

/// Instantiates a device on the network of the namespace it lands in, with
/// the addresses its interface has then.
#[derive(Debug)]
struct VirtualFactory {
    config: SoftDeviceConfig,
    ifname: String,
    state: Arc<Mutex<VState>>,
}

impl DeviceFactory for VirtualFactory {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }

    fn instantiate(&self, ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>> {
        let (fabric, addrs) = {
            let mut st = lock(&self.state);
            let addrs = st.links.get(&self.ifname).map(|l| l.addrs.clone()).unwrap_or_default();
            (st.fabric(ns), addrs)
        };
        // A device needs an address: one whose interface has none keeps
        // the ones it was made with.
        let addrs = if addrs.is_empty() {
            self.config.addrs.clone()
        } else {
            addrs
        };
        let dev = SoftDevice::create(SoftDeviceConfig {
            link: Some(fabric as Arc<dyn Link>),
            addrs,
            ..self.config.clone()
        })?;
        Ok(soft_plugged(dev))
    }
}
