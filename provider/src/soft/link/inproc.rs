//! The in-process link: devices of one process exchange datagrams through
//! each other's inboxes, with no system call.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};

use super::{Endpoint, InProcess, Link, Trains};
use crate::soft::proto::train::TrainCaps;
use crate::soft::proto::{Nanos, Transmit};

/// A set of devices that reach each other by address, in one process.
///
/// Timers: the devices share the application's threads (inline progress), so
/// a device's retransmission or RNR timer must run even when the
/// application only calls into another device (a NIC retries on its own).
/// The fabric keeps the earliest deadline of its devices; any verb on any of
/// them checks it with one atomic load and drives the devices that are due.
#[derive(Debug)]
pub struct InprocFabric {
    /// Address → device. A list, not a hash map: a fabric joins a handful
    /// of devices and this lookup runs for every packet (SipHash of an
    /// `IpAddr` cost more than the scan).
    devices: RwLock<Vec<(IpAddr, Weak<dyn Endpoint>)>>,
    /// Datagrams to an address no device owns.
    unroutable: AtomicU64,
    /// Earliest timer deadline of any device (process time; `u64::MAX`:
    /// none). May be early (a timer was since cancelled), never late.
    earliest: AtomicU64,
}

impl Default for InprocFabric {
    fn default() -> Self {
        InprocFabric {
            devices: RwLock::default(),
            unroutable: AtomicU64::new(0),
            earliest: AtomicU64::new(u64::MAX),
        }
    }
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

impl InprocFabric {
    fn lookup(&self, dst: IpAddr) -> Option<Arc<dyn Endpoint>> {
        let map = self.devices.read().expect("fabric map poisoned");
        map.iter().find(|(ip, _)| *ip == dst).and_then(|(_, w)| w.upgrade())
    }
}

impl Link for InprocFabric {
    fn send_batch(&self, txs: &mut Vec<Transmit>, _spent: &mut dyn FnMut(Vec<u8>)) {
        for t in txs.drain(..) {
            let _ = InProcess::send(self, t);
        }
    }

    fn attach(&self, dev: &Arc<dyn Endpoint>) {
        let mut map = self.devices.write().expect("fabric map poisoned");
        for ip in dev.addrs() {
            map.retain(|(a, _)| a != ip);
            map.push((*ip, Arc::downgrade(dev)));
        }
    }

    fn detach(&self, dev: &dyn Endpoint) {
        let mut map = self.devices.write().expect("fabric map poisoned");
        map.retain(|(a, _)| !dev.addrs().contains(a));
    }

    fn name(&self) -> &'static str {
        "inproc"
    }

    fn needs_icrc(&self) -> bool {
        // Packets never leave this process's memory: nothing can flip a bit
        // or forge a source, so the CRC would only cost time.
        false
    }

    fn in_process(&self) -> Option<&dyn InProcess> {
        Some(self)
    }

    fn trains(&self) -> Option<&dyn Trains> {
        Some(self)
    }
}

impl InProcess for InprocFabric {
    fn route(&self, dst: IpAddr) -> Option<Arc<dyn Endpoint>> {
        self.lookup(dst)
    }

    fn send(&self, tx: Transmit) -> Option<Arc<dyn Endpoint>> {
        match self.lookup(tx.dst) {
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

    fn note_deadline(&self, deadline: Option<Nanos>) {
        // A load first: the deadline rarely moves earlier, and a locked
        // read-modify-write on every verb showed in the profile.
        if let Some(d) = deadline {
            if d < self.earliest.load(Ordering::Acquire) {
                self.earliest.fetch_min(d, Ordering::AcqRel);
            }
        }
    }

    fn take_due(&self, now: Nanos) -> Vec<Arc<dyn Endpoint>> {
        if self.earliest.load(Ordering::Acquire) > now {
            return Vec::new();
        }
        // Something may be due: recompute the earliest deadline from the
        // devices themselves and hand back those that are due. Those are
        // driven next and note their new deadlines then.
        self.earliest.store(u64::MAX, Ordering::Release);
        let devices: Vec<Arc<dyn Endpoint>> = {
            let map = self.devices.read().expect("fabric map poisoned");
            map.iter().filter_map(|(_, w)| w.upgrade()).collect()
        };
        let mut due: Vec<Arc<dyn Endpoint>> = Vec::new();
        for dev in devices {
            if due.iter().any(|d| Arc::ptr_eq(d, &dev)) {
                continue; // a device with several addresses
            }
            match dev.next_deadline() {
                Some(t) if t <= now => due.push(dev),
                Some(t) => {
                    self.earliest.fetch_min(t, Ordering::AcqRel);
                }
                None => {}
            }
        }
        due
    }
}

impl Trains for InprocFabric {
    /// Every device of the fabric is in this process: trains reach any
    /// attached one.
    fn train_caps(&self, dst: IpAddr) -> TrainCaps {
        let map = self.devices.read().expect("fabric map poisoned");
        if map.iter().any(|(ip, w)| *ip == dst && w.strong_count() > 0) {
            TrainCaps::SHARED
        } else {
            TrainCaps::NONE
        }
    }
}
