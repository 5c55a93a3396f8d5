//! Clients: the code that wants to hear about devices (a ULP, the CM, an
//! application's device manager), in the shape of the kernel's `ib_client`.
//!
//! A client registers for every namespace or for one. It gets an `add`
//! upcall for every device it can see — the devices present when it
//! registers, then each device that appears — and a `remove` upcall when a
//! device it was added to goes away (unplugged, moved out of its sight, its
//! namespace deleted) or when it unregisters. Rules:
//!
//! - For one device, `add` upcalls run in client registration order and
//!   `remove` upcalls in the reverse order.
//! - A failing (or panicking) `add` means the client holds nothing for that
//!   device: it gets no `remove` for it.
//! - For each client and device, upcalls alternate `add`, `remove`, `add`,
//!   … starting with `add`; a re-added device is a new generation.
//! - [`Subsystem::unregister_client`](super::Subsystem::unregister_client)
//!   is a fence: when it returns, the client got `remove` for every device
//!   it was added to and gets no upcall ever again.
//! - Upcalls run on the thread that changed the topology, one at a time.
//!   They may call back into the subsystem (look devices up, open them,
//!   register or unregister other clients, add, remove or move devices,
//!   create or delete namespaces): nested operations run at once, on the
//!   same thread. A client cannot unregister itself from inside one of its
//!   own upcalls (`EBUSY`: that would be a fence waiting for itself).
//! - An upcall must not wait for *another thread* that changes the topology
//!   (that thread waits for this upcall to finish): the same rule as the
//!   kernel's client callbacks.

use std::fmt;

use super::device::DeviceRef;
use super::namespace::NamespaceId;
use super::removal::RemovalReason;
use crate::verbs;

/// Which devices a client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientScope {
    /// Every device of every namespace.
    All,
    /// The devices visible in one namespace: those that belong to it in
    /// exclusive mode, every device in shared mode.
    Namespace(NamespaceId),
}

impl fmt::Display for ClientScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientScope::All => f.write_str("all namespaces"),
            ClientScope::Namespace(ns) => ns.fmt(f),
        }
    }
}

/// A registered client's identifier (registration order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub(crate) u64);

impl ClientId {
    /// The identifier as a number.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client#{}", self.0)
    }
}

/// The upcalls of a client.
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use softverbs::subsystem::{Client, ClientScope, DeviceRef, RemovalReason, Subsystem, SubsystemConfig};
/// use softverbs::verbs::{Context, Result};
///
/// /// Opens every device it is given and keeps the context until removal.
/// #[derive(Default)]
/// struct Opener(Mutex<Vec<(String, Context)>>);
///
/// impl Client for Opener {
///     fn add(&self, dev: &DeviceRef) -> Result<()> {
///         let ctx = dev.open("opener")?;
///         self.0.lock().unwrap().push((dev.name().to_string(), ctx));
///         Ok(())
///     }
///     fn remove(&self, dev: &DeviceRef, _why: RemovalReason) {
///         // Let go: the removal waits (up to its deadline) for this.
///         self.0.lock().unwrap().retain(|(n, _)| n != dev.name());
///     }
/// }
///
/// let sub = Subsystem::new(SubsystemConfig::default());
/// let id = sub.register_client("opener", ClientScope::All, Arc::new(Opener::default()))?;
/// sub.unregister_client(id)?; // a fence: no upcall after this
/// # Ok::<(), softverbs::subsystem::Error>(())
/// ```
pub trait Client: Send + Sync {
    /// A device became visible to this client.
    ///
    /// # Errors
    ///
    /// Any error: the client then holds nothing for the device and gets no
    /// [`Client::remove`] for it.
    fn add(&self, device: &DeviceRef) -> verbs::Result<()>;

    /// A device this client was added to is going away for it; `reason`
    /// says why. When the device itself is being removed, by now its
    /// control verbs fail with `ENODEV`, its QPs are in ERR and every posted
    /// WR has completed with a flush; the client should drop every object it
    /// holds on it (the removal waits for that, up to its deadline).
    fn remove(&self, device: &DeviceRef, reason: RemovalReason);
}
