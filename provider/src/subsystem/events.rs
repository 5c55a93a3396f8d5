//! Device events (every one carries `{namespace, device, generation}`) and
//! the hook through which the connection manager hears of removals.

use std::net::IpAddr;
use std::sync::mpsc;
use std::time::Duration;

use super::device::{DeviceRef, Generation};
use super::namespace::NamespaceId;
use super::removal::RemovalReason;
use crate::verbs::BackendKind;

/// What happened to a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceEventKind {
    /// The device appeared (before its clients' `add` upcalls).
    Added,
    /// The device's removal started (before it is revoked).
    Removing(RemovalReason),
    /// The device's removal finished.
    Removed {
        /// Why.
        reason: RemovalReason,
        /// Consumers that did not let go in time (their objects were made
        /// inert).
        stragglers: Vec<String>,
    },
}

/// A device event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEvent {
    /// The namespace the device belongs to (in shared mode, the initial one).
    pub namespace: NamespaceId,
    /// The device's name.
    pub device: String,
    /// The device's generation (changes on every re-add).
    pub generation: Generation,
    /// The backend.
    pub backend: BackendKind,
    /// What happened.
    pub kind: DeviceEventKind,
}

/// Receives device events (from
/// [`Subsystem::subscribe`](super::Subsystem::subscribe)). Events are
/// queued without bound, in the order the subsystem made them; dropping the
/// receiver unsubscribes.
#[derive(Debug)]
pub struct EventReceiver {
    pub(crate) rx: mpsc::Receiver<DeviceEvent>,
}

impl EventReceiver {
    /// The next event if one is queued.
    pub fn try_next(&self) -> Option<DeviceEvent> {
        self.rx.try_recv().ok()
    }

    /// Waits up to `timeout` for the next event.
    pub fn next_timeout(&self, timeout: Duration) -> Option<DeviceEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Every event queued now.
    pub fn drain(&self) -> Vec<DeviceEvent> {
        self.rx.try_iter().collect()
    }
}

/// What happened to an IP address of a device's network interface
/// ([`Subsystem::address_change`](super::Subsystem::address_change)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressChange {
    /// The address was removed from the device's interface (`ip addr del`).
    Removed,
    /// The address was given to the device's interface (`ip addr add`); if
    /// another device of the namespace had it, it moved (bonding failover).
    Added,
}

/// The connection manager's hook into device removal (step 3 of the
/// sequence in [`removal`](super::removal)): every CM id bound to the device
/// gets DEVICE_REMOVAL; and into address changes, which give the ids bound
/// to the address ADDR_CHANGE.
///
/// Called on the removing thread, after the device was revoked and before
/// the clients' `remove` upcalls; it may call back into the subsystem like
/// an upcall.
pub trait CmHook: Send + Sync {
    /// `device` is being removed for `reason`.
    fn device_removal(&self, device: &DeviceRef, reason: RemovalReason);

    /// `addr` was removed from or added to `device`'s interface. Called on
    /// the thread that reported it, with no subsystem lock held. The
    /// default does nothing.
    fn address_change(&self, device: &DeviceRef, addr: IpAddr, change: AddressChange) {
        let _ = (device, addr, change);
    }
}

/// A registered [`CmHook`]'s identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmHookId(pub(crate) u64);
