//! The in-process link: devices of one process exchange datagrams through
//! each other's inboxes, with no system call.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};

use super::Link;
use crate::soft::engine::DeviceShared;
use crate::soft::proto::Transmit;

/// A set of devices that reach each other by address, in one process.
#[derive(Debug, Default)]
pub struct InprocFabric {
    devices: RwLock<HashMap<IpAddr, Weak<DeviceShared>>>,
    /// Datagrams to an address no device owns.
    unroutable: AtomicU64,
}

impl InprocFabric {
    /// A new, empty fabric.
    pub fn new() -> Arc<InprocFabric> {
        Arc::new(InprocFabric::default())
    }

    /// The process-wide fabric the embedded default devices use.
    pub fn global() -> Arc<InprocFabric> {
        static G: OnceLock<Arc<InprocFabric>> = OnceLock::new();
        G.get_or_init(InprocFabric::new).clone()
    }

    /// Datagrams dropped because no device owned their destination.
    pub fn unroutable(&self) -> u64 {
        self.unroutable.load(Ordering::Relaxed)
    }
}

impl Link for InprocFabric {
    fn send(&self, tx: Transmit) -> Option<Arc<DeviceShared>> {
        let dst = {
            let map = self.devices.read().expect("fabric map poisoned");
            map.get(&tx.dst).and_then(Weak::upgrade)
        };
        match dst {
            Some(dev) => {
                dev.deliver(tx);
                Some(dev)
            }
            None => {
                self.unroutable.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn attach(&self, dev: &Arc<DeviceShared>) {
        let mut map = self.devices.write().expect("fabric map poisoned");
        for ip in dev.addrs() {
            map.insert(*ip, Arc::downgrade(dev));
        }
    }

    fn detach(&self, dev: &DeviceShared) {
        let mut map = self.devices.write().expect("fabric map poisoned");
        for ip in dev.addrs() {
            map.remove(ip);
        }
    }

    fn name(&self) -> &'static str {
        "inproc"
    }

    fn needs_icrc(&self) -> bool {
        // Packets never leave this process's memory: nothing can flip a bit
        // or forge a source, so the CRC would only cost time.
        false
    }
}
