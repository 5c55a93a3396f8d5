//! Where the shared-memory link sends each destination's datagrams: the
//! route table, the channel a datagram to a destination goes on, and the
//! setup thread that opens channels in [`ShmMode::Auto`] (see the parent
//! module's "Rendezvous").

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::channel::{Channel, PENDING, UP};
use super::hello::Connecting;
use super::stats::bump;
use super::{ShmLink, ShmMode, RETRY_NS};
use crate::soft::clock::process_now;
use crate::soft::link::iphash::IpHash;
use crate::soft::proto::Nanos;
use crate::sys::lock;
use crate::verbs::Gid;

/// A destination waits this long at most for the setup thread to open
/// its channel ([`Route::Setup`]); then the next datagram to it asks
/// again.
const SETUP_NS: Nanos = 2_000_000_000;
/// How long the setup thread of the device with the greater address
/// waits for the peer's hello before it opens a channel itself (see
/// [`ShmLink::set_up_later`]).
const YIELD_NS: Nanos = 200_000_000;

#[derive(Debug)]
pub(super) enum Route {
    Chan(Arc<Channel>),
    /// [`ShmMode::Auto`]: the setup thread opens a channel to this
    /// destination (since then); datagrams go by UDP meanwhile.
    Setup(Nanos),
    /// No shared memory to this destination until then; `true`: a
    /// connect found no device to make a channel with (it is a UDP peer
    /// now), `false`: its channel ended.
    Udp(Nanos, bool),
}

/// The work of a link's setup thread ([`ShmLink::set_up_later`]).
#[derive(Debug, Default)]
pub(super) struct Setup {
    /// Each destination, and when the thread may open its channel.
    queue: VecDeque<(IpAddr, Nanos)>,
    /// The process in which a setup thread runs (it exits once the queue
    /// is empty). A child forked meanwhile inherits the link but not the
    /// thread: it sees another process here and starts its own.
    pub(super) running: Option<u32>,
}

impl ShmLink {
    pub(super) fn routes_w(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<IpAddr, Route, IpHash>> {
        let routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        // Every QP's route hint is stale from now on (`send.rs`).
        self.route_version.fetch_add(1, Ordering::AcqRel);
        routes
    }

    /// The channel datagrams to `dst` go on (`None`: UDP, or nothing in
    /// [`ShmMode::Only`]).
    pub(super) fn channel_for(&self, dst: IpAddr) -> Option<Arc<Channel>> {
        let pick = |c: &Arc<Channel>| match c.state() {
            UP => Some(Some(c.clone())),
            PENDING => Some((self.mode == ShmMode::Only).then(|| c.clone())),
            _ => None,
        };
        let now;
        {
            let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
            match routes.get(&dst) {
                Some(Route::Chan(c)) => {
                    if let Some(r) = pick(c) {
                        return r;
                    }
                    now = process_now();
                }
                Some(Route::Udp(until, _)) => {
                    now = process_now();
                    if now < *until {
                        return None;
                    }
                }
                Some(Route::Setup(since)) => {
                    now = process_now();
                    if now.saturating_sub(*since) < SETUP_NS {
                        return None;
                    }
                }
                None => now = process_now(),
            }
        }
        if self.ips.contains(&dst) {
            self.routes_w().insert(dst, Route::Udp(Nanos::MAX, false));
            return None;
        }
        let mut routes = self.routes_w();
        match routes.get(&dst) {
            Some(Route::Chan(c)) => {
                if let Some(r) = pick(c) {
                    return r;
                }
            }
            Some(Route::Udp(until, _)) if now < *until => return None,
            Some(Route::Setup(since)) if now.saturating_sub(*since) < SETUP_NS => return None,
            _ => {}
        }
        if self.mode == ShmMode::Auto && self.set_up_later(dst, now) {
            routes.insert(dst, Route::Setup(now));
            return None;
        }
        let connecting = match self.connect_to(Gid::from_ip(dst)) {
            Ok(c) => c,
            Err(_) => {
                bump(&self.stats.connect_failed);
                routes.insert(dst, Route::Udp(now.saturating_add(RETRY_NS), true));
                return None;
            }
        };
        let c = connecting.chan.clone();
        routes.insert(dst, Route::Chan(c.clone()));
        // The hello leaves without the table's lock: the receive turn
        // that reads the answer needs it.
        drop(routes);
        if !self.greet(dst, connecting, now) {
            return None;
        }
        pick(&c).flatten()
    }

    /// Has the setup thread open the channel to `dst` ([`ShmMode::Auto`],
    /// which sends by UDP meanwhile), starting the thread if none runs;
    /// `false` if it cannot start (the caller opens the channel itself).
    ///
    /// Opening a channel creates its region: a 4.5 MB memfd mapped and
    /// populated, ~2 ms, which on the sending thread delayed a first
    /// datagram to a new peer by as much (a connection manager's first
    /// REQ or REP). Populated in advance, the rings cost the data path no
    /// page fault. The thread exits once no destination waits.
    ///
    /// The first datagram now arrives before the hello, and the peer's
    /// answer to it would open a second channel between the two (each end
    /// then reads two rings for good). So of two devices the one with the
    /// greater address waits up to [`YIELD_NS`] for the other's hello,
    /// which its answer brings, before it opens a channel itself.
    fn set_up_later(&self, dst: IpAddr, now: Nanos) -> bool {
        let mut setup = lock(&self.tx.setup);
        if setup.running != Some(std::process::id()) {
            let me = self.tx.me.clone();
            let started = std::thread::Builder::new()
                .name("softverbs-shm-setup".into())
                .spawn(move || Self::setup_thread(&me));
            if started.is_err() {
                return false;
            }
            setup.running = Some(std::process::id());
        }
        let yields = self.ips.first().is_some_and(|me| *me > dst);
        setup
            .queue
            .push_back((dst, if yields { now.saturating_add(YIELD_NS) } else { now }));
        true
    }

    /// The setup thread: opens the channels [`Self::set_up_later`] asked
    /// for, while the link lives.
    fn setup_thread(me: &Weak<ShmLink>) {
        loop {
            let Some(link) = me.upgrade() else { return };
            let next = {
                let mut setup = lock(&link.tx.setup);
                let next = setup.queue.pop_front();
                if next.is_none() {
                    setup.running = None;
                }
                next
            };
            let Some((dst, due)) = next else { return };
            if process_now() < due && link.setting_up(dst) {
                // Waiting for the peer's hello: the others first.
                lock(&link.tx.setup).queue.push_back((dst, due));
                drop(link);
                std::thread::sleep(std::time::Duration::from_micros(500));
                continue;
            }
            link.set_up(dst);
        }
    }

    /// Opens a channel to `dst` for the setup thread, unless its route
    /// changed meanwhile (a channel the peer opened to us, accepted by a
    /// receive turn, serves it now); routes `dst` by UDP for [`RETRY_NS`]
    /// if no channel can be made.
    fn set_up(&self, dst: IpAddr) {
        let still = |routes: &HashMap<IpAddr, Route, IpHash>| matches!(routes.get(&dst), Some(Route::Setup(_)));
        if self.detached.load(Ordering::Relaxed) || !self.setting_up(dst) {
            return;
        }
        // Without the route table's lock: senders to other peers go on.
        let connecting = self.connect_to(Gid::from_ip(dst));
        let now = process_now();
        let mut routes = self.routes_w();
        let connecting = match connecting {
            Ok(c) => c,
            Err(_) => {
                bump(&self.stats.connect_failed);
                if still(&routes) {
                    routes.insert(dst, Route::Udp(now.saturating_add(RETRY_NS), true));
                }
                return;
            }
        };
        if still(&routes) {
            routes.insert(dst, Route::Chan(connecting.chan.clone()));
        }
        drop(routes);
        self.greet(dst, connecting, now);
    }

    /// Sends the hello of a channel being opened to `dst` (its route
    /// already set, the table's lock released). If it cannot leave, `dst`
    /// goes by UDP for [`RETRY_NS`], unless another channel serves it
    /// meanwhile. Whether it left.
    fn greet(&self, dst: IpAddr, connecting: Connecting, now: Nanos) -> bool {
        let c = connecting.chan.clone();
        if self.send_hello(connecting).is_err() {
            bump(&self.stats.connect_failed);
            let mut routes = self.routes_w();
            if matches!(routes.get(&dst), Some(Route::Chan(o)) if Arc::ptr_eq(o, &c)) {
                routes.insert(dst, Route::Udp(now.saturating_add(RETRY_NS), true));
            }
            return false;
        }
        bump(&self.stats.opened);
        true
    }

    /// Whether `dst` still waits for the setup thread (no channel the
    /// peer opened serves it meanwhile).
    fn setting_up(&self, dst: IpAddr) -> bool {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        matches!(routes.get(&dst), Some(Route::Setup(_)))
    }

    /// Waits (boundedly) until the setup thread has nothing left to do.
    #[cfg(test)]
    pub(super) fn setup_settled(&self) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(20) {
            if lock(&self.tx.setup).running.is_none() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }
}
