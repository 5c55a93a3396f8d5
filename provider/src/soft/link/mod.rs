//! Datagram links that carry RoCEv2 packets between soft devices.
//!
//! A link moves [`Transmit`]s from one device's engine to the device that
//! owns the destination address. The in-process link ([`inproc`]) joins
//! devices of one process through their inboxes; the UDP link ([`udp`])
//! joins processes and hosts through the kernel's UDP stack; the
//! shared-memory link ([`shm`]) joins processes of one host through rings
//! in shared memory and falls back to UDP for everyone else.
//!
//! The engine calls a link in this order (see [`crate::soft::engine`]):
//! [`Link::recv`] to feed received datagrams to the engine (network links;
//! bounded by a budget), then, after the engine ran, [`Link::send_batch`]
//! with everything it produced. A progress thread sleeps on
//! [`Link::poll_fds`].

pub mod inproc;
mod iphash;
pub mod shm;
pub mod udp;

use std::any::Any;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::proto::{Counters, Datagram, Nanos, Transmit};

/// What a link sees of a device attached to it: its addresses, and the
/// few things an in-process link does to it (the engine's device
/// implements it). A link never drives a device itself: it hands devices
/// back to its caller (from [`InProcess::route`], [`InProcess::send`],
/// [`InProcess::take_due`]), which drives them.
pub trait Endpoint: Any + Send + Sync + std::fmt::Debug {
    /// The device's addresses (those datagrams reach it at).
    fn addrs(&self) -> &[IpAddr];

    /// Queues a received datagram in the device's inbox, for its engine to
    /// handle the next time it runs.
    fn deliver(&self, tx: Transmit);

    /// The device's earliest timer deadline (process time), if any.
    fn next_deadline(&self) -> Option<Nanos>;

    /// Makes progress on the device (reads its inbox, runs due timers,
    /// sends); returns how many datagrams it read from its link.
    fn drive(self: Arc<Self>) -> usize;
}

/// A way to send datagrams: what every link does (send, receive, the
/// descriptors to wait on, attach and detach devices, a name). What only
/// some links do is behind the capability accessors ([`Link::in_process`],
/// [`Link::fast_send`], [`Link::wakeups`], [`Link::trains`],
/// [`Link::diagnostics`]), `None` for a link without it.
pub trait Link: Send + Sync + std::fmt::Debug {
    /// Sends every datagram of `txs` in order (leaving `txs` empty).
    /// Network links batch the system calls, and put the buffers of the
    /// datagrams that left (copied into a socket or a ring) to `spent`, for
    /// the engine to build its next packets in: allocating and freeing one
    /// per packet cost a stream ~10 % in page faults whenever `malloc`
    /// trimmed its heap between them. An in-process link moves the
    /// datagrams into the receivers' inboxes (whose engines recycle them).
    fn send_batch(&self, txs: &mut Vec<Transmit>, spent: &mut dyn FnMut(Vec<u8>));

    /// Sends one datagram: [`Link::send_batch`] with a list of one (most
    /// verbs of a ping-pong send one packet), which a link may do without
    /// the list. (The engine sends one datagram this way on network links
    /// only, which override it; this default allocates the list.)
    fn send_one(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) {
        let mut txs = vec![t];
        self.send_batch(&mut txs, spent);
    }

    /// Retries datagrams the link could not send earlier (a full socket
    /// buffer); returns whether none is left waiting.
    fn flush(&self) -> bool {
        true
    }

    /// Hands up to about `budget` received datagrams to `f`, without
    /// blocking; returns how many were read. Only network links receive
    /// (an in-process link delivers into inboxes instead).
    fn recv(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        let _ = (budget, f);
        0
    }

    /// Descriptors that become readable when [`Link::recv`] has work: what
    /// a progress thread (or an application's event loop) waits on.
    fn poll_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Whether the engine must compute the ICRC of the packets it sends and
    /// check it on those it receives. `false` for a link whose packets
    /// cannot be corrupted or forged (in-process), and for a link that
    /// computes and checks the ICRC itself against the real IP and UDP
    /// headers (UDP: the engine's view of addresses and source ports is
    /// not what goes on the wire).
    fn needs_icrc(&self) -> bool {
        true
    }

    /// Registers a device so datagrams to its addresses reach it.
    fn attach(&self, dev: &Arc<dyn Endpoint>);

    /// Unregisters a device.
    fn detach(&self, dev: &dyn Endpoint);

    /// Short name for `devinfo` (`inproc`, `udp`, `shm`).
    fn name(&self) -> &'static str;

    /// Delivery to devices of this process, and their timers
    /// ([`InProcess`]).
    fn in_process(&self) -> Option<&dyn InProcess> {
        None
    }

    /// Sending from inside a verb, without queueing ([`FastSend`]).
    fn fast_send(&self) -> Option<&dyn FastSend> {
        None
    }

    /// Peers that signal only sleeping readers ([`Wakeups`]).
    fn wakeups(&self) -> Option<&dyn Wakeups> {
        None
    }

    /// Whole messages as one train ([`Trains`]).
    fn trains(&self) -> Option<&dyn Trains> {
        None
    }

    /// Counters and peers for `devinfo` ([`Diagnostics`]).
    fn diagnostics(&self) -> Option<&dyn Diagnostics> {
        None
    }
}

/// A link whose devices are all in this process ([`Link::in_process`]):
/// it delivers into their inboxes, hands the caller the device a datagram
/// is for, and keeps their timers running while the application calls
/// into other devices.
pub trait InProcess: Send + Sync {
    /// The attached device that owns `dst`, to which the caller hands
    /// datagrams directly (under that device's engine lock, with no queue
    /// in between); `None` if no device owns `dst` (then
    /// [`InProcess::send`] counts it).
    fn route(&self, dst: IpAddr) -> Option<Arc<dyn Endpoint>>;

    /// Sends one datagram: delivers it into the destination device's inbox
    /// and returns that device, which the caller must then drive; `None`
    /// (and counted) if no device owns its destination.
    fn send(&self, tx: Transmit) -> Option<Arc<dyn Endpoint>>;

    /// Records that a device's earliest timer is now `deadline` (process
    /// time, [`crate::soft::engine::process_now`]), so that timers of
    /// devices nobody is calling into still run.
    fn note_deadline(&self, deadline: Option<Nanos>);

    /// The attached devices whose timers are due at `now` (process time),
    /// for the caller to drive. Cheap when none is due.
    fn take_due(&self, now: Nanos) -> Vec<Arc<dyn Endpoint>>;
}

/// A link that can send from inside a verb ([`Link::fast_send`]).
pub trait FastSend: Send + Sync {
    /// Sends `t` at once, if this link can without queueing it anywhere
    /// (the send fast path's [`Egress`](crate::soft::proto::Egress)), and
    /// returns `true`; otherwise does nothing and returns `false`, and the
    /// caller sends it the usual way. `hint` is the sending QP's, for the
    /// link to keep its route in ([`LinkHint`](crate::soft::proto::LinkHint)).
    fn send_now(&self, t: &super::proto::Outgoing<'_>, hint: &mut super::proto::LinkHint) -> bool;
}

/// A link whose peers (or sockets) signal a reader only once it announced
/// that it sleeps ([`Link::wakeups`]): shared memory, and UDP for the
/// sockets it polls only now and then.
pub trait Wakeups: Send + Sync {
    /// Called right before the caller blocks on [`Link::poll_fds`]: a
    /// link whose peers only signal sleeping readers tells them now.
    /// Returns `false` if work already arrived (do not sleep).
    fn prepare_sleep(&self) -> bool {
        true
    }

    /// An application now sleeps on [`Link::poll_fds`] in its own poller,
    /// at moments the engine does not see (a completion channel's
    /// descriptor in inline mode): a link whose peers only signal readers
    /// that announced sleep must keep them signalling from now on.
    fn set_watched(&self, _watched: bool) {}

    /// The caller's own poller reported one of [`Link::poll_fds`]
    /// readable without [`Wakeups::prepare_sleep`] (an application's event
    /// loop calling [`DeviceShared::drive`](crate::soft::DeviceShared::drive)):
    /// the next [`Link::recv`] must look at every source. A link that polls
    /// some of them only now and then (shared memory: the UDP socket, the
    /// listeners) does so then; the poller may be edge-triggered and not
    /// report them again.
    fn woken(&self) {}
}

/// A link that can carry a whole message as one train
/// ([`crate::soft::proto::train`]; [`Link::trains`]).
pub trait Trains: Send + Sync {
    /// What memory a train sent to `dst` now may carry
    /// ([`TrainCaps`](crate::soft::proto::train::TrainCaps)). A link that
    /// allows any must carry a [`Transmit`] with such a train to a receiver
    /// able to read that memory and hand it over as a [`Datagram`] with the
    /// train's payload, or drop it (like a lost packet) if the route
    /// changed meanwhile.
    fn train_caps(&self, dst: IpAddr) -> super::proto::train::TrainCaps;
}

/// A link's own counters and peers ([`Link::diagnostics`]).
pub trait Diagnostics: Send + Sync {
    /// Adds what the link dropped before the engine saw it to the engine's
    /// counters (`rx_packets`, `rx_bad_icrc`, `rx_malformed`).
    fn merge_counters(&self, counters: &mut Counters) {
        let _ = counters;
    }

    /// The link's own counters, `(name, value)`, for `devinfo -v`.
    fn stats(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// One line per known peer, for `devinfo` (how it is reached).
    fn peers(&self) -> Vec<String> {
        Vec::new()
    }
}
