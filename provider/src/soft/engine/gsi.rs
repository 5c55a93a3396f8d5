//! The driver's side of the GSI (QP1) path: installing the MAD sink and
//! sending MADs (see [`crate::soft::proto::gsi`]).

use std::net::IpAddr;
use std::sync::Arc;

use super::DeviceShared;
use crate::soft::proto::gsi::{GsiSink, MAD_LEN};

impl DeviceShared {
    /// Installs `sink` as the receiver of this device's QP1 MADs, or with
    /// `None` removes it. Returns `false` (and changes nothing) when a
    /// sink is installed already and `sink` is `Some`: one agent owns a
    /// device's GSI.
    pub fn set_gsi_sink(&self, sink: Option<Arc<dyn GsiSink>>) -> bool {
        let mut core = self.lock();
        if sink.is_some() && core.has_gsi_sink() {
            return false;
        }
        core.set_gsi_sink(sink);
        true
    }

    /// Sends `mad` from this device's QP1 (source address: GID
    /// `sgid_index`) to the QP1 at `dst`, and drives the devices it
    /// reached. Returns `false` if nothing was sent (no such GID, or the
    /// device is revoked).
    pub fn gsi_send(self: &Arc<Self>, sgid_index: u8, dst: IpAddr, mad: &[u8; MAD_LEN]) -> bool {
        self.with_core(|core, _| core.gsi_send(sgid_index, dst, mad))
    }
}
