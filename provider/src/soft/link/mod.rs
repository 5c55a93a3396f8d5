//! Datagram links that carry RoCEv2 packets between soft devices.
//!
//! A link moves [`Transmit`]s from one device's engine to the inbox of the
//! device that owns the destination address. The in-process link
//! ([`inproc`]) joins devices of one process; later links (UDP,
//! shared memory) implement the same trait.

pub mod inproc;

use std::sync::Arc;

use super::engine::DeviceShared;
use super::proto::Transmit;

/// A way to send datagrams.
pub trait Link: Send + Sync + std::fmt::Debug {
    /// Sends one datagram. An in-process link delivers it into the
    /// destination device's inbox and returns that device, which the caller
    /// must then drive; a network link returns `None`.
    fn send(&self, tx: Transmit) -> Option<Arc<DeviceShared>>;

    /// Registers a device so datagrams to its addresses reach it.
    fn attach(&self, dev: &Arc<DeviceShared>);

    /// Unregisters a device.
    fn detach(&self, dev: &DeviceShared);

    /// Short name for `devinfo` (`inproc`, `udp`, `shm`).
    fn name(&self) -> &'static str;
}
