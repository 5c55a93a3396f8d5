//! The connected twin of each bound socket (see "Connected sockets" in
//! the module docs): how it is made beside the bound socket, and when the
//! send path moves a destination's single datagrams to it.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;

use super::{bump_held, sys, TxFlow, UdpLink};

/// Single datagrams in a row to one destination after which the twin of
/// the socket they leave by connects to it.
pub const CONNECT_AFTER: u32 = 16;

impl UdpLink {
    /// The connected twin of `sock`, bound to `local` too (see the module
    /// docs), parked: connected to `local` itself. `None` if the kernel
    /// refuses a step; the device then sends everything by `sock`.
    pub(super) fn twin_of(sock: &UdpSocket, local: SocketAddr, buffer: i32) -> Option<UdpSocket> {
        let fd = sock.as_raw_fd();
        sys::set_reuse_port(fd, true).ok()?;
        let twin = sys::bind_beside(local);
        // Cleared at once on both: a third socket must not bind here
        // (binding checks every socket on the port for the option).
        let cleared = sys::set_reuse_port(fd, false);
        let twin = twin.ok()?;
        let tfd = twin.as_raw_fd();
        if cleared.is_err() || sys::set_reuse_port(tfd, false).is_err() {
            return None;
        }
        // Until parked the twin takes a share of what arrives; should
        // anything have come then, `twin_live` starts set.
        twin.connect(local).ok()?;
        sys::set_dont_fragment(tfd, local.is_ipv6()).ok()?;
        sys::set_buffer(tfd, true, buffer);
        sys::set_buffer(tfd, false, buffer);
        Some(twin)
    }

    /// The connected twin that the single datagram just routed (`flow`'s
    /// last destination) goes by, if it goes by one: connecting it there
    /// once [`CONNECT_AFTER`] went there in a row.
    pub(super) fn twin_for(&self, flow: &mut TxFlow) -> Option<RawFd> {
        let r = flow.last.as_mut()?;
        let s = &self.socks[r.sock];
        let twin = s.twin.as_ref()?;
        if flow.peers[r.sock] == Some(r.to) {
            return Some(twin.as_raw_fd());
        }
        if !r.connectable {
            return None;
        }
        r.streak += 1;
        if r.streak < CONNECT_AFTER {
            return None;
        }
        r.streak = 0;
        // Read from now on: the peer's datagrams come to the twin.
        s.twin_live.store(true, Ordering::Release);
        bump_held(&self.stats.tx_connects, 1);
        if twin.connect(r.to).is_err() {
            // Park it again (what it was connected to may be lost); its
            // peer's datagrams come to the bound socket.
            let _ = twin.connect(s.local);
            flow.peers[r.sock] = None;
            return None;
        }
        flow.peers[r.sock] = Some(r.to);
        Some(twin.as_raw_fd())
    }
}
