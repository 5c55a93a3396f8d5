//! Why a device goes away, and what its removal reports.
//!
//! The removal sequence itself (DESIGN §5) runs in
//! [`Subsystem::remove_device`](super::Subsystem::remove_device); its steps,
//! in order:
//!
//! 1. The registry marks the device Revoking: [`DeviceRef::open`] fails with
//!    `ENODEV` and the device is no longer listed or visible to new clients.
//! 2. The backend revokes it ([`HotplugDevice::revoke`]): control verbs fail
//!    with `ENODEV`, every QP moves to ERR, every posted, uncompleted WR
//!    completes exactly once with WR_FLUSH_ERR (send queue before receive
//!    queue, post order), armed CQ notifications fire; the device leaves
//!    the backend's device list.
//! 3. Every CM hook hears DEVICE_REMOVAL for the device ([`CmHook`]).
//! 4. Clients' `remove` upcalls run in reverse registration order.
//! 5. DEVICE_FATAL is raised on every context: the last async event.
//! 6. The removal waits, up to its deadline, for every consumer to let go
//!    (close every context it opened on the device, with every object).
//!    Consumers that did not are named in the [`RemovalReport`] as
//!    [`Straggler`]s.
//! 7. The device's [`RemovalGate`] closes and drains: guarded fast-path
//!    handles fail with `ENODEV` from now on, and the backend makes the
//!    stragglers' objects inert ([`HotplugDevice::make_inert`]).
//! 8. The device is Dead; the `Removed` event carries the stragglers' names.
//!
//! Destroying objects of a removed device succeeds and is idempotent.
//!
//! [`DeviceRef::open`]: super::DeviceRef::open
//! [`HotplugDevice::revoke`]: super::HotplugDevice::revoke
//! [`HotplugDevice::make_inert`]: super::HotplugDevice::make_inert
//! [`CmHook`]: super::CmHook
//! [`RemovalGate`]: super::RemovalGate

use std::fmt;
use std::time::Duration;

use super::device::DeviceInfo;
use super::namespace::NamespaceId;

/// Why a client loses a device (the argument of its `remove` upcall) or why
/// a device is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemovalReason {
    /// The device was unplugged ([`Subsystem::remove_device`]).
    ///
    /// [`Subsystem::remove_device`]: super::Subsystem::remove_device
    Unplug,
    /// The device moves between namespaces: it is unplugged here and
    /// replugged in `to` as a new generation (also when namespace `from` is
    /// deleted: its devices return to the initial namespace).
    NetnsMove {
        /// The namespace it leaves.
        from: NamespaceId,
        /// The namespace it joins.
        to: NamespaceId,
    },
    /// The subsystem is being dropped.
    Shutdown,
    /// Not a device removal: the client unregistered (the device lives on).
    ClientUnregistered,
    /// Not a device removal: the client's namespace was deleted in shared
    /// mode, where devices stay in the initial namespace (the device lives
    /// on).
    NamespaceDeleted(NamespaceId),
}

impl RemovalReason {
    /// Whether the device itself is removed (revoked), as opposed to only
    /// leaving one client's sight.
    pub fn is_device_removal(self) -> bool {
        matches!(
            self,
            RemovalReason::Unplug | RemovalReason::NetnsMove { .. } | RemovalReason::Shutdown
        )
    }
}

impl fmt::Display for RemovalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemovalReason::Unplug => f.write_str("unplug"),
            RemovalReason::NetnsMove { from, to } => write!(f, "move {from} -> {to}"),
            RemovalReason::Shutdown => f.write_str("shutdown"),
            RemovalReason::ClientUnregistered => f.write_str("client unregistered"),
            RemovalReason::NamespaceDeleted(ns) => write!(f, "{ns} deleted"),
        }
    }
}

/// The name under which contexts opened outside the subsystem (straight
/// from the backend's device list) are reported.
pub const UNATTRIBUTED: &str = "<opened outside the subsystem>";

/// A consumer that still held the device when the removal deadline passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Straggler {
    /// The consumer's name (given to [`DeviceRef::open`]), or
    /// [`UNATTRIBUTED`].
    ///
    /// [`DeviceRef::open`]: super::DeviceRef::open
    pub consumer: String,
    /// How many of its contexts were still open.
    pub contexts: usize,
}

impl fmt::Display for Straggler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} context(s))", self.consumer, self.contexts)
    }
}

/// What a removal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovalReport {
    /// The device (its generation and namespace before removal).
    pub device: DeviceInfo,
    /// Why.
    pub reason: RemovalReason,
    /// CM hooks that heard DEVICE_REMOVAL.
    pub cm_hooks: usize,
    /// Clients whose `remove` upcall ran, in the order they ran.
    pub removed_clients: Vec<String>,
    /// Consumers that did not let go within the deadline; their objects
    /// were made inert.
    pub stragglers: Vec<Straggler>,
    /// Guarded calls still inside the device's gate when waiting for them
    /// ran out of time (normally 0).
    pub stuck_calls: usize,
    /// How long the removal took.
    pub elapsed: Duration,
}

impl RemovalReport {
    /// Whether every consumer let go in time.
    pub fn is_clean(&self) -> bool {
        self.stragglers.is_empty() && self.stuck_calls == 0
    }
}

impl fmt::Display for RemovalReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, {}) removed ({}) in {:?}",
            self.device.name, self.device.namespace, self.device.generation, self.reason, self.elapsed
        )?;
        if !self.stragglers.is_empty() {
            f.write_str("; did not let go: ")?;
            for (i, s) in self.stragglers.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                s.fmt(f)?;
            }
        }
        Ok(())
    }
}
