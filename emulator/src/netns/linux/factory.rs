//! The device factory of the Linux driver: it makes a soft device's UDP
//! sockets inside the namespace its interface is in when the device is
//! (re)instantiated.

use std::sync::{Arc, Mutex};

use softverbs::netns::in_netns_file;
use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::UdpConfig;
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::subsystem::{soft_plugged, DeviceFactory, HotplugDevice, NamespaceId};
use softverbs::verbs::{self, BackendKind, ErrorKind, Verb};

use super::{io_kind, lock, LState};

/// Instantiates a device on UDP sockets made inside the namespace its
/// interface is in now.
#[derive(Debug)]
pub(super) struct LinuxFactory {
    pub(super) name: String,
    pub(super) ifname: String,
    pub(super) state: Arc<Mutex<LState>>,
    pub(super) engine: EngineMode,
}

impl DeviceFactory for LinuxFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Soft
    }

    /// `ns` is the subsystem's namespace; the sockets go where the
    /// interface is (the same in exclusive mode; in shared mode every
    /// device is in the initial namespace wherever its interface is).
    fn instantiate(&self, _ns: NamespaceId) -> verbs::Result<Arc<dyn HotplugDevice>> {
        let (file, rtnl, where_) = {
            let st = lock(&self.state);
            let l = st.links.get(&self.ifname).ok_or_else(|| {
                verbs::Error::new(
                    Verb::OpenDevice,
                    ErrorKind::NotFound,
                    format!("interface '{}' is gone", self.ifname),
                )
            })?;
            let ns = st.ns(l.ns).ok_or_else(|| {
                verbs::Error::new(
                    Verb::OpenDevice,
                    ErrorKind::NotFound,
                    format!("the namespace of '{}' is gone", self.ifname),
                )
            })?;
            (ns.file.clone(), ns.rtnl.clone(), st.ns_name(l.ns))
        };
        let udp = UdpConfig::interface(&self.ifname);
        let mut cfg = in_netns_file(&file, || SoftDeviceConfig::udp(&self.name, udp)).map_err(|e| {
            verbs::Error::new(
                Verb::OpenDevice,
                io_kind(&e),
                format!("entering namespace '{where_}': {e}"),
            )
        })??;
        cfg.engine = self.engine;
        let dev = SoftDevice::create(cfg)?;
        // The new port starts in the interface's state now (and the driver
        // records it, so `sync` reports changes from here on).
        let up = match rtnl.link(&self.ifname) {
            Ok(Some(l)) => l.oper_up(),
            _ => lock(&self.state).links.get(&self.ifname).is_some_and(|l| l.port_active),
        };
        if let Some(l) = lock(&self.state).links.get_mut(&self.ifname) {
            l.port_active = up;
            // The new instance's GIDs are the addresses the interface has.
            l.missing.clear();
        }
        if !up {
            dev.set_port_active(false);
        }
        Ok(soft_plugged(dev))
    }
}
