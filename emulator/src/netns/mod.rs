//! Namespace drivers: what turns network-namespace changes — a namespace
//! created or deleted, a network interface moved with `ip link set IF netns
//! NS` — into calls on the device subsystem
//! ([`softverbs::subsystem::Subsystem`]), so that a soft device bound to an
//! interface follows it from namespace to namespace (docs/design.md §5).
//!
//! - [`NetnsDriver`]: the driver interface.
//! - [`VirtualNetns`]: the virtual driver — portable, no privileges, used by
//!   default ([`default_driver`]) and by the property tests. Each namespace
//!   is an isolated in-process network (its own in-process fabric), and
//!   interfaces are records in the driver.
//! - [`LinuxNetns`] (Linux, root): the real driver — namespaces are network
//!   namespaces (`/run/netns/NAME`, shared with `ip netns`), interfaces are
//!   real interfaces (veth pairs it creates, or existing ones it adopts), and
//!   a soft device runs on a UDP link whose sockets are created inside the
//!   namespace its interface is in (`setns` on a short-lived thread; a
//!   socket stays in the namespace it was created in), with GIDs from the
//!   interface's addresses there. Moving the interface (through the driver,
//!   or with `ip link set … netns …` followed by [`NetnsDriver::sync`])
//!   unplugs the device and replugs it in the new namespace (reason
//!   `NetnsMove`); the interface disappearing is a hot-unplug; link down
//!   and up are PORT_ERR and PORT_ACTIVE events on the device. See its docs
//!   for what each operation does on the host.
//! - [`traffic`]: a connected RC pair with a ledger of every posted work
//!   request, to check "every WR completes exactly once" across hotplug.
//!
//! Both drivers implement [`NetnsDriver`] and are interchangeable behind
//! `Box<dyn NetnsDriver>`: a namespace is a subsystem
//! [`NamespaceId`] of the same name, a device's factory
//! ([`DeviceFactory`](softverbs::subsystem::DeviceFactory)) instantiates it
//! for the namespace it lands in, and moves go through
//! [`Subsystem::move_device`].

#[cfg(target_os = "linux")]
mod linux;
pub mod traffic;
mod virtual_netns;

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use softverbs::subsystem::{DeviceInfo, Error, NamespaceId, NetnsMode, Op, RemovalReport, Result, Subsystem};
use softverbs::verbs::ErrorKind;

#[cfg(target_os = "linux")]
pub use linux::LinuxNetns;
pub use virtual_netns::VirtualNetns;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn err(kind: ErrorKind, detail: impl Into<String>) -> Error {
    Error::new(Op::Driver, kind, detail)
}

/// The namespace a device bound to an interface in `ns` belongs to: that
/// one in exclusive mode, the initial one in shared mode.
fn device_namespace(sub: &Subsystem, ns: NamespaceId) -> NamespaceId {
    if sub.mode() == NetnsMode::Shared {
        NamespaceId::INIT
    } else {
        ns
    }
}

/// The name by which drivers know the initial namespace.
pub const INIT_NETNS: &str = "init";

/// A namespace driver: the environment side of namespaces and interfaces,
/// feeding a [`Subsystem`].
///
/// Methods take `&self` (drivers lock internally) and never hold a lock of
/// their own while calling into the subsystem, so clients' upcalls may call
/// back into the driver.
pub trait NetnsDriver: Send + Sync {
    /// Short name (`virtual`, `linux`).
    fn kind(&self) -> &'static str;

    /// The subsystem the driver feeds.
    fn subsystem(&self) -> &Arc<Subsystem>;

    /// Creates a namespace (`ip netns add NAME`).
    ///
    /// # Errors
    ///
    /// `EBUSY` if one has that name; the environment's error.
    fn add_netns(&self, name: &str) -> Result<NamespaceId>;

    /// Deletes a namespace (`ip netns del NAME`): its interfaces return to
    /// the initial namespace and so do the devices bound to them.
    ///
    /// # Errors
    ///
    /// `ENOENT` if there is none; `EPERM` for the initial namespace.
    fn del_netns(&self, name: &str) -> Result<()>;

    /// The namespace named `name` ([`INIT_NETNS`] for the initial one).
    fn netns(&self, name: &str) -> Option<NamespaceId>;

    /// Creates a network interface owning `addr`, in the initial namespace.
    ///
    /// # Errors
    ///
    /// `EBUSY` if the name or the address is taken.
    fn add_link(&self, ifname: &str, addr: IpAddr) -> Result<()>;

    /// Moves an interface to another namespace (`ip link set IF netns NS`);
    /// in exclusive mode the device bound to it follows (an unplug and a
    /// replug, reason `NetnsMove`). Moving to the namespace it is in does
    /// nothing.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown interface or namespace; the subsystem's error
    /// from moving the device.
    fn link_set_netns(&self, ifname: &str, netns: &str) -> Result<()>;

    /// The namespace an interface is in.
    fn link_netns(&self, ifname: &str) -> Option<NamespaceId>;

    /// Creates a soft RDMA device bound to an interface (`rdma link add NAME
    /// type rxe netdev IF`), in the interface's namespace (the initial one in
    /// shared mode).
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown interface; `EBUSY` if the interface already
    /// has a device or the name is taken.
    fn add_device(&self, name: &str, ifname: &str) -> Result<DeviceInfo>;

    /// Removes a device (`rdma link delete NAME`).
    ///
    /// # Errors
    ///
    /// As [`Subsystem::remove_device`].
    fn del_device(&self, name: &str) -> Result<RemovalReport>;

    /// Removes an address from an interface (`ip addr del ADDR dev IF`):
    /// the subsystem hears of it
    /// ([`Subsystem::address_change`]), so the connection manager's ids
    /// bound through it on the interface's device get ADDR_CHANGE. The
    /// device keeps its GIDs until it is re-made (a move).
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown interface; `EADDRNOTAVAIL` if it lacks the
    /// address; `EOPNOTSUPP` from a driver that does not manage addresses.
    fn del_addr(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let _ = (ifname, addr);
        Err(err(
            ErrorKind::NotSupported,
            format!("the {} driver does not manage addresses", self.kind()),
        ))
    }

    /// Gives an interface an address (`ip addr add ADDR dev IF`); if
    /// another interface has it, it moves (as in a bonding failover) and
    /// the ids bound through it there get ADDR_CHANGE. The interface's
    /// device uses the address once it has a GID for it (from its next
    /// instance, after a move).
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown interface; `EOPNOTSUPP` from a driver that
    /// does not manage addresses.
    fn add_addr(&self, ifname: &str, addr: IpAddr) -> Result<()> {
        let _ = (ifname, addr);
        Err(err(
            ErrorKind::NotSupported,
            format!("the {} driver does not manage addresses", self.kind()),
        ))
    }

    /// Switches the subsystem's namespace mode (`rdma system set netns`).
    ///
    /// # Errors
    ///
    /// As [`Subsystem::set_mode`].
    fn set_mode(&self, mode: NetnsMode) -> Result<()> {
        self.subsystem().set_mode(mode)
    }

    /// Applies changes made outside the driver since the last call; returns
    /// how many. The virtual driver has none; the Linux driver follows
    /// interfaces moved, deleted, or brought down and up with `ip`, and
    /// namespaces deleted with `ip netns del`.
    ///
    /// # Errors
    ///
    /// The environment's error.
    fn sync(&self) -> Result<usize> {
        Ok(0)
    }
}

/// The driver to use by default: the virtual one.
pub fn default_driver(subsystem: Arc<Subsystem>) -> Box<dyn NetnsDriver> {
    Box::new(VirtualNetns::new(subsystem))
}
