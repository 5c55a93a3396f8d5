//! The send path of the shared-memory link: each datagram to the channel
//! of its destination (or to UDP when no channel serves it), then one
//! doorbell check per channel written.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::channel::{Channel, UP};
use super::ring::{self, Producer, SlotMeta};
use super::setup::{Route, Setup};
use super::stats::{bump, Stats};
use super::{sys, Link, ShmLink, ShmMode};
use crate::soft::proto::{LinkHint, Outgoing, Transmit};
use crate::sys::lock;

/// What only the send side of a [`ShmLink`] writes (the route table,
/// which the receive side writes too, stays in the link).
#[derive(Debug)]
pub(super) struct SendState {
    /// This link among all: what a QP's route hint names ([`RouteHint`]).
    pub(super) link_id: u64,
    /// Destinations the setup thread is to open channels to
    /// (`shm/setup.rs`).
    pub(super) setup: Mutex<Setup>,
    /// This link, for the setup thread ([`ShmLink::set_up_later`]).
    pub(super) me: Weak<ShmLink>,
}

impl SendState {
    pub(super) fn new(me: Weak<ShmLink>) -> SendState {
        SendState {
            link_id: next_link_id(),
            setup: Mutex::new(Setup::default()),
            me,
        }
    }
}

/// A QP's route on a shared-memory link, kept in its [`LinkHint`]: the
/// channel to `dst` (`None`: none, the datagram goes the usual way) as the
/// route table of link `link` had it at `version`. Holding the channel
/// keeps it (and its mapping) alive until the hint is replaced or the QP
/// destroyed; a channel that went down meanwhile refuses datagrams
/// (`Channel::send_now`), and its replacement changes the version.
pub(super) struct RouteHint {
    pub(super) link: u64,
    pub(super) version: u64,
    pub(super) dst: IpAddr,
    pub(super) chan: Option<Arc<Channel>>,
}

/// A number no other shared-memory link of this process has.
fn next_link_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Where [`ShmLink::route_one`] put a datagram.
enum Routed {
    /// Into this channel's ring or backlog; the channel is up and its
    /// reader may need waking.
    Kick(Arc<Channel>),
    /// No channel serves the destination: the datagram goes by UDP.
    Udp(Transmit),
    /// Handled (held for a channel not up yet, or dropped and counted).
    Done,
}

impl ShmLink {
    /// [`Link::send_batch`]: every datagram in order; each channel written
    /// is kicked once at the end, and the UDP ones leave in one batch.
    pub(super) fn send_list(&self, txs: &mut Vec<Transmit>, spent: &mut dyn FnMut(Vec<u8>)) {
        if self.detached.load(Ordering::Relaxed) {
            for t in txs.drain(..) {
                self.send_detached(t, spent);
            }
            return;
        }
        let mut udp_out: Vec<Transmit> = Vec::new();
        // Channels to kick once at the end; the first one without a heap
        // allocation (a batch nearly always goes to one peer).
        let mut kicked_first: Option<Arc<Channel>> = None;
        let mut kicked: Vec<Arc<Channel>> = Vec::new();
        for t in txs.drain(..) {
            match self.route_one(t, spent) {
                Routed::Kick(c) => {
                    let seen = |k: &Arc<Channel>| Arc::ptr_eq(k, &c);
                    if !kicked_first.as_ref().is_some_and(seen) && !kicked.iter().any(seen) {
                        if kicked_first.is_none() {
                            kicked_first = Some(c);
                        } else {
                            kicked.push(c);
                        }
                    }
                }
                Routed::Udp(t) => udp_out.push(t),
                Routed::Done => {}
            }
        }
        for c in kicked_first.into_iter().chain(kicked) {
            c.kick(&self.stats);
        }
        if !udp_out.is_empty() {
            self.udp.send_batch(&mut udp_out, spent);
        }
    }

    /// [`Link::send_one`]: the same as a list of one, without the list.
    pub(super) fn send_single(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) {
        if self.detached.load(Ordering::Relaxed) {
            self.send_detached(t, spent);
            return;
        }
        let Some(t) = self.send_if_up(t, spent, true) else {
            return;
        };
        match self.route_one(t, spent) {
            Routed::Kick(c) => c.kick(&self.stats),
            Routed::Udp(t) => self.udp.send_one(t, spent),
            Routed::Done => {}
        }
    }

    /// After the device detached: what it sends as it goes (the ACKs it
    /// held back) still reaches peers on channels that are up; nothing
    /// else.
    fn send_detached(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) {
        if let Some(t) = self.send_if_up(t, spent, false) {
            if t.train.is_some() {
                bump(&self.stats.tx_train_dropped);
            }
        }
    }

    /// Sends `t` on the channel serving its destination if that channel is
    /// up, and kicks it: the common case, done under the route table's read
    /// lock without taking a reference to the channel (two locked
    /// operations fewer per datagram). With `note_backlog`, a datagram left
    /// waiting in the channel's backlog marks the link for the receive
    /// path's retries. Gives `t` back when no channel is up. Always inlined:
    /// as a call (LLVM declined `#[inline]`) it cost `post_send` ~33
    /// instructions more per message (callgrind).
    #[inline(always)]
    fn send_if_up(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>), note_backlog: bool) -> Option<Transmit> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        match routes.get(&t.dst) {
            Some(Route::Chan(c)) if c.state() == UP => {
                if c.send(Some(t), &self.stats, spent).backlogged && note_backlog {
                    self.backlogged.store(true, Ordering::SeqCst);
                }
                c.kick(&self.stats);
                None
            }
            _ => Some(t),
        }
    }

    /// [`FastSend::send_now`]: `t` into the ring of its destination's channel
    /// if that channel is up and takes it now (nothing backlogged, room in
    /// the ring), and the peer's doorbell rung if it sleeps. A datagram
    /// for a peer without a channel, or any datagram after the device
    /// detached goes the usual way.
    ///
    /// The route comes from the QP's `hint` while it is good (same link,
    /// same destination, no route changed since: [`RouteHint`]), else from
    /// the route table, and is kept in the hint: a QP's datagrams skip the
    /// table's lock and lookup, two locked instructions and ~60 others
    /// per datagram.
    pub(super) fn send_at_once(&self, t: &Outgoing<'_>, hint: &mut LinkHint) -> bool {
        if self.detached.load(Ordering::Relaxed) {
            return false;
        }
        let (link, version) = (self.tx.link_id, &self.route_version);
        let chan = match hint.get::<RouteHint>() {
            Some(h) if h.link == link && h.dst == t.dst && h.version == version.load(Ordering::Acquire) => &h.chan,
            _ => {
                // Read before the table: a change after this read makes
                // the hint stale at once.
                let version = version.load(Ordering::Acquire);
                let chan = match self.routes.read().unwrap_or_else(|p| p.into_inner()).get(&t.dst) {
                    Some(Route::Chan(c)) => Some(c.clone()),
                    _ => None,
                };
                hint.set(RouteHint {
                    link,
                    version,
                    dst: t.dst,
                    chan,
                });
                match hint.get::<RouteHint>() {
                    Some(h) => &h.chan,
                    None => return false,
                }
            }
        };
        match chan {
            Some(c) if c.send_now(t, &self.stats) => {
                c.kick(&self.stats);
                true
            }
            _ => false,
        }
    }

    /// Puts `t` into its channel's ring (or backlog), or says it goes by
    /// UDP.
    fn route_one(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) -> Routed {
        match self.channel_for(t.dst) {
            Some(c) => {
                let up = c.state() == UP;
                let sent = c.send(Some(t), &self.stats, spent);
                if !up || sent.backlogged {
                    self.backlogged.store(true, Ordering::SeqCst);
                }
                if up {
                    Routed::Kick(c)
                } else {
                    Routed::Done
                }
            }
            // A train never goes by UDP: the receiver could not read its
            // payload. Dropped like a lost packet; the requester's
            // retransmission sends the message again.
            None if t.train.is_some() => {
                bump(&self.stats.tx_train_dropped);
                Routed::Done
            }
            None if self.mode == ShmMode::Only => {
                bump(&self.stats.tx_no_channel);
                Routed::Done
            }
            None => Routed::Udp(t),
        }
    }
}

impl Channel {
    /// Publishes datagram `t` now if the channel is up, nothing waits in
    /// its backlog and the ring has room (or drops it, counted, if it can
    /// never go, as [`Channel::send`] does); `false`: nothing was done.
    fn send_now(&self, t: &Outgoing<'_>, stats: &Stats) -> bool {
        let mut tx = lock(&self.tx);
        if self.state() != UP || !tx.backlog.is_empty() {
            return false;
        }
        let meta = SlotMeta {
            src: t.src,
            dst: t.dst,
            src_port: t.src_port,
            dst_port: t.dst_port,
        };
        let r = tx
            .prod
            .push_parts(&self.region, &meta, ring::KIND_DATAGRAM, &t.parts, &[]);
        self.pushed(r, stats).is_ok()
    }

    /// Rings the peer's doorbell if it sleeps.
    pub(super) fn kick(&self, stats: &Stats) {
        let Some(peer) = self.peer.get() else { return };
        let sleeping = Producer::consumer_sleeping(&self.region, Channel::rings(self.connector).0);
        if sleeping {
            bump(&stats.doorbells);
            // Never blocks (`sys::ring`); a full doorbell means the peer
            // has wake-ups waiting, or is dead.
            if !sys::ring(peer.doorbell.as_raw_fd()) {
                bump(&stats.doorbells_full);
            }
        }
    }
}
