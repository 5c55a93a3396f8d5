//! Why a device goes away, and what its removal reports.
//!
//! The removal sequence itself (docs/design.md §5) runs in
//! [`Subsystem::remove_device`](super::Subsystem::remove_device); its steps,
//! in order:
//!
//! 1. The registry marks the device Revoked: [`DeviceRef::open`] fails with
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

#[cfg(test)]
mod tests {
    //! The order of the removal sequence as consumers see it: the CM hooks
    //! (step 3) before the clients' `remove` upcalls (step 4, reverse
    //! registration order), DEVICE_FATAL (step 5) after both, and the
    //! backend's revocation (step 2) before all of them. Each callback
    //! records itself and whatever async events the consumer's context has
    //! received so far, so an event raised earlier than documented shows up
    //! in the log at the callback that saw it.

    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::Duration;

    use crate::soft::SoftDeviceConfig;
    use crate::subsystem::{
        Client, ClientScope, CmHook, DeviceRef, NamespaceId, RemovalReason, SoftFactory, Subsystem, SubsystemConfig,
    };
    use crate::verbs::{Context, ErrorKind, EventType};

    /// What the callbacks share: the log and the consumer's context.
    #[derive(Default)]
    struct Shared {
        log: Mutex<Vec<String>>,
        ctx: Mutex<Option<Context>>,
        waiter: Mutex<Option<JoinHandle<()>>>,
    }

    impl Shared {
        fn push(&self, s: impl Into<String>) {
            self.log.lock().unwrap().push(s.into());
        }

        /// Logs `who`, then every DEVICE_FATAL the context already holds,
        /// and whether control verbs already fail with ENODEV.
        fn callback(&self, who: &str) {
            let ctx = self.ctx.lock().unwrap();
            let Some(ctx) = ctx.as_ref() else {
                self.push(format!("{who}: the context is gone"));
                return;
            };
            let revoked = matches!(ctx.alloc_pd(), Err(e) if e.kind() == ErrorKind::NoDevice);
            self.push(format!(
                "{who}{}",
                if revoked { "" } else { " (before the revocation)" }
            ));
            while let Ok(Some(e)) = ctx.get_async_event(Some(Duration::ZERO)) {
                if e.event_type == EventType::DeviceFatal {
                    self.push(format!("DEVICE_FATAL (already there at {who})"));
                }
            }
        }
    }

    struct Hook(Arc<Shared>);

    impl CmHook for Hook {
        fn device_removal(&self, _device: &DeviceRef, _reason: RemovalReason) {
            self.0.callback("cm_hook");
        }
    }

    struct Probe {
        name: &'static str,
        shared: Arc<Shared>,
        /// The last client to hear of the removal hands the context to a
        /// consumer thread that waits for DEVICE_FATAL and then lets go.
        hands_over: bool,
    }

    impl Client for Probe {
        fn add(&self, _device: &DeviceRef) -> crate::verbs::Result<()> {
            Ok(())
        }

        fn remove(&self, _device: &DeviceRef, _reason: RemovalReason) {
            self.shared.callback(&format!("remove {}", self.name));
            if !self.hands_over {
                return;
            }
            let Some(ctx) = self.shared.ctx.lock().unwrap().take() else {
                return;
            };
            let shared = self.shared.clone();
            let waiter = std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while std::time::Instant::now() < deadline {
                    match ctx.get_async_event(Some(Duration::from_millis(100))) {
                        Ok(Some(e)) if e.event_type == EventType::DeviceFatal => {
                            shared.push("DEVICE_FATAL");
                            return;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            shared.push(format!("get_async_event failed: {e}"));
                            return;
                        }
                    }
                }
                shared.push("no DEVICE_FATAL within 20 s");
            });
            *self.shared.waiter.lock().unwrap() = Some(waiter);
        }
    }

    #[test]
    fn cm_hooks_then_clients_in_reverse_then_device_fatal() {
        let sub = Subsystem::new(SubsystemConfig::default());
        let shared = Arc::new(Shared::default());
        for (name, hands_over) in [("first", true), ("second", false)] {
            let probe = Probe {
                name,
                shared: shared.clone(),
                hands_over,
            };
            sub.register_client(name, ClientScope::All, Arc::new(probe)).unwrap();
        }
        sub.add_cm_hook(Arc::new(Hook(shared.clone())));
        let cfg = SoftDeviceConfig::new("removal_order0", "127.83.207.1".parse().unwrap());
        sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT).unwrap();
        let ctx = sub.device("removal_order0").unwrap().open("order consumer").unwrap();
        *shared.ctx.lock().unwrap() = Some(ctx);
        let report = sub.remove_device("removal_order0").unwrap();
        let waiter = shared
            .waiter
            .lock()
            .unwrap()
            .take()
            .expect("the last client started the waiter");
        waiter.join().unwrap();
        assert_eq!(
            *shared.log.lock().unwrap(),
            ["cm_hook", "remove second", "remove first", "DEVICE_FATAL"],
            "the removal sequence as consumers see it"
        );
        assert_eq!(report.cm_hooks, 1);
        assert_eq!(report.removed_clients, ["second", "first"]);
        assert!(report.is_clean(), "{report}");
    }
}
