//! The device subsystem: a registry of devices of every backend, clients
//! that hear about them, namespaces, and hotplug (docs/design.md §5) — the layer
//! the kernel has (`ib_register_client`, device removal, `rdma_dev_change_netns`)
//! and user space never got.
//!
//! - [`Subsystem`]: the registry. Devices are added from a
//!   [`DeviceFactory`] (the soft provider's is [`SoftFactory`]) and removed at
//!   run time; each has a name, a backend, a [`NamespaceId`] and a
//!   [`Generation`] that changes on every re-add. Lookups and opens
//!   ([`DeviceRef::open`], which names the consumer) work from any thread.
//! - [`client`]: [`Client`]s register for all namespaces or one and get
//!   `add`/`remove` upcalls (registration order / reverse; a failed `add`
//!   gets no `remove`; unregister is a fence; upcalls may call back in).
//! - [`removal`]: the removal sequence (Live → Revoked → Dead; `ENODEV`;
//!   QPs to ERR; every WR flushed exactly once; notifications; CM
//!   DEVICE_REMOVAL through [`CmHook`]; clients' `remove`; DEVICE_FATAL
//!   last; a deadline for consumers, after which the stragglers are named
//!   and their objects made inert).
//! - [`namespace`]: exclusive and shared modes, creation and deletion,
//!   moves (unplug + replug with reason [`RemovalReason::NetnsMove`]), and
//!   the [`WeakNamespace`] a listener holds.
//! - [`gate`]: the per-call guard ([`RemovalGate`]) and the guarded
//!   fast-path handles ([`GuardedQp`], [`GuardedCq`]).
//! - [`events`]: [`DeviceEvent`]s, each carrying `{namespace, device,
//!   generation}`, and the [`CmHook`] through which the connection manager
//!   hears of removals and of address changes
//!   ([`Subsystem::address_change`], reported by the drivers).
//!
//! Namespace and hotplug *drivers* — what turns `ip netns add`, `ip link
//! set … netns …` or a virtual equivalent into these calls — live in the
//! emulator crate (`softverbs_emulator::netns`).
//!
//! # Examples
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use softverbs::soft::SoftDeviceConfig;
//! use softverbs::subsystem::*;
//!
//! struct Log(Mutex<Vec<String>>);
//! impl Client for Log {
//!     fn add(&self, d: &DeviceRef) -> softverbs::verbs::Result<()> {
//!         self.0.lock().unwrap().push(format!("add {} {}", d.name(), d.namespace()));
//!         Ok(())
//!     }
//!     fn remove(&self, d: &DeviceRef, why: RemovalReason) {
//!         self.0.lock().unwrap().push(format!("remove {} ({why})", d.name()));
//!     }
//! }
//!
//! let sub = Subsystem::new(SubsystemConfig::default());
//! let log = Arc::new(Log(Mutex::new(Vec::new())));
//! sub.register_client("log", ClientScope::All, log.clone())?;
//! let cfg = SoftDeviceConfig::new("doc_mod0", "127.83.201.1".parse().unwrap());
//! sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT)?;
//! let blue = sub.create_namespace("blue")?;
//! let (_report, moved) = sub.move_device("doc_mod0", blue)?; // unplug + replug
//! assert_eq!(moved.namespace, blue);
//! sub.delete_namespace(blue)?; // the device returns to the initial namespace
//! assert_eq!(sub.device("doc_mod0")?.namespace(), NamespaceId::INIT);
//! sub.remove_device("doc_mod0")?;
//! assert_eq!(
//!     *log.0.lock().unwrap(),
//!     [
//!         "add doc_mod0 ns:init",
//!         "remove doc_mod0 (move ns:init -> ns:1)",
//!         "add doc_mod0 ns:1",
//!         "remove doc_mod0 (move ns:1 -> ns:init)",
//!         "add doc_mod0 ns:init",
//!         "remove doc_mod0 (unplug)",
//!     ]
//! );
//! # Ok::<(), softverbs::subsystem::Error>(())
//! ```

pub mod client;
pub mod device;
pub mod error;
pub mod events;
pub mod gate;
#[cfg(feature = "hardware")]
pub mod hw;
#[cfg(feature = "hardware")]
pub mod hw_discovery;
pub mod namespace;
mod registry;
pub mod removal;

pub use client::{Client, ClientId, ClientScope};
pub use device::{
    soft_plugged, DeviceFactory, DeviceInfo, DeviceRef, DeviceState, Generation, HotplugDevice, SoftFactory,
};
pub use error::{Error, Op, Result};
pub use events::{AddressChange, CmHook, CmHookId, DeviceEvent, DeviceEventKind, EventReceiver};
pub use gate::{GateGuard, Gated, GuardedCq, GuardedQp, RemovalGate};
#[cfg(feature = "hardware")]
pub use hw::{HwDeviceEvent, HwEventHub, HwFactory, HwPlugged, NetnsBindings};
#[cfg(feature = "hardware")]
pub use hw_discovery::{read_netns_mode, DiscoveryThread, HwDiscovery, ScanReport};
pub use namespace::{NamespaceEvent, NamespaceId, NamespaceWatch, NetnsMode, WeakNamespace};
pub use registry::{Subsystem, SubsystemConfig};
pub use removal::{RemovalReason, RemovalReport, Straggler, UNATTRIBUTED};
