//! The real-time driver of a soft device: the sans-IO [`Core`] behind a
//! lock, an inbox of received datagrams, and the loop that moves packets
//! between engines (DESIGN §2: drain input, transmit, arm the deadline).
//!
//! **Inline progress** (the default): there is no engine thread. Every verb
//! that can make progress (posting, polling a CQ, waiting on a channel)
//! drives the device, and an in-process link drives the receiving device
//! from the sender's thread, so a two-device ping-pong in one thread
//! completes inside `post_send`. No runnable thread is added beyond the
//! application's own, which matters on small machines where a third
//! busy-polling thread collapses a ping-pong pair.
//!
//! Locks: each device has one engine lock; the driver never holds two at
//! once (datagrams are delivered into inboxes after the lock is released),
//! so devices cannot deadlock on each other.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use crossbeam_queue::SegQueue;

use super::link::Link;
use super::proto::{Core, CoreEvent, CqId, Datagram, Nanos, Transmit};
use crate::verbs::AsyncEvent;

/// Receives what a device's engine reports outside itself: completion-channel
/// wake-ups and async events. Implemented by the objects layer.
pub(crate) trait EventSink: Send + Sync {
    /// An armed CQ fired.
    fn cq_notify(&self, cq: CqId);
    /// An async event for context `owner` (`None`: every context).
    fn async_event(&self, owner: Option<u32>, event: AsyncEvent);
}

/// A device's engine and its I/O state, shared by every object of the device.
pub struct DeviceShared {
    name: String,
    addrs: Vec<IpAddr>,
    core: Mutex<Core>,
    inbox: SegQueue<Transmit>,
    link: Arc<dyn Link>,
    epoch: Instant,
    sinks: Mutex<HashMap<u32, Weak<dyn EventSink>>>,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl DeviceShared {
    pub(crate) fn new(name: String, addrs: Vec<IpAddr>, core: Core, link: Arc<dyn Link>) -> Arc<DeviceShared> {
        let dev = Arc::new(DeviceShared {
            name,
            addrs,
            core: Mutex::new(core),
            inbox: SegQueue::new(),
            link,
            epoch: Instant::now(),
            sinks: Mutex::new(HashMap::new()),
        });
        dev.link.attach(&dev);
        dev
    }

    /// The device's addresses.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// The link's name.
    pub fn link_name(&self) -> &'static str {
        self.link.name()
    }

    /// Monotonic engine time.
    pub(crate) fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Queues a received datagram (called by links).
    pub(crate) fn deliver(&self, tx: Transmit) {
        self.inbox.push(tx);
    }

    /// Locks the engine. Poisoning is survivable: the engine's invariants
    /// are restored by every method before it can panic, and a panic there
    /// is a bug we would rather report than turn into a second panic.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register_sink(&self, id: u32, sink: Weak<dyn EventSink>) {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).insert(id, sink);
    }

    pub(crate) fn unregister_sink(&self, id: u32) {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// Runs `f` on the engine, then drives every device the work reached.
    pub(crate) fn with_core<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core, Nanos) -> R) -> R {
        let mut out = Vec::new();
        let mut events = Vec::new();
        let r = {
            let mut core = self.lock();
            let now = self.now();
            Self::progress_locked(&mut core, &self.inbox, now);
            let r = f(&mut core, now);
            Self::drain_locked(&mut core, &mut out, &mut events);
            r
        };
        self.dispatch_events(events);
        self.send_all(out);
        r
    }

    /// Makes progress on this device (and any device its packets reach).
    pub fn drive(self: &Arc<Self>) {
        self.with_core(|_, _| ());
    }

    /// Engine time of the next deadline, if any.
    pub(crate) fn next_deadline(&self) -> Option<Nanos> {
        self.lock().poll_timeout()
    }

    fn progress_locked(core: &mut Core, inbox: &SegQueue<Transmit>, now: Nanos) {
        while let Some(t) = inbox.pop() {
            core.handle_datagram(
                now,
                Datagram {
                    src: t.src,
                    dst: t.dst,
                    src_port: t.src_port,
                    dst_port: t.dst_port,
                    data: &t.data,
                },
            );
        }
        if core.poll_timeout().is_some_and(|t| t <= now) {
            core.handle_timeout(now);
        }
    }

    fn drain_locked(core: &mut Core, out: &mut Vec<Transmit>, events: &mut Vec<CoreEvent>) {
        while let Some(t) = core.poll_transmit() {
            out.push(t);
        }
        while let Some(e) = core.poll_event() {
            events.push(e);
        }
    }

    fn dispatch_events(&self, events: Vec<CoreEvent>) {
        if events.is_empty() {
            return;
        }
        let sinks: Vec<(u32, Arc<dyn EventSink>)> = self
            .sinks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(id, w)| w.upgrade().map(|s| (*id, s)))
            .collect();
        for e in events {
            match e {
                CoreEvent::CqNotify { cq } => {
                    for (_, s) in &sinks {
                        s.cq_notify(cq);
                    }
                }
                CoreEvent::Async { owner, event } => {
                    for (id, s) in &sinks {
                        if owner.is_none() || owner == Some(*id) {
                            s.async_event(owner, event);
                        }
                    }
                }
            }
        }
    }

    /// Sends datagrams and drives the in-process devices they reached,
    /// iteratively (a ping-pong of ACKs never grows the stack).
    fn send_all(self: &Arc<Self>, first: Vec<Transmit>) {
        if first.is_empty() {
            return;
        }
        let mut pending: Vec<Arc<DeviceShared>> = Vec::new();
        for t in first {
            if let Some(d) = self.link.send(t) {
                if !pending.iter().any(|p| Arc::ptr_eq(p, &d)) {
                    pending.push(d);
                }
            }
        }
        while let Some(dev) = pending.pop() {
            let mut out = Vec::new();
            let mut events = Vec::new();
            {
                let mut core = dev.lock();
                let now = dev.now();
                Self::progress_locked(&mut core, &dev.inbox, now);
                Self::drain_locked(&mut core, &mut out, &mut events);
            }
            dev.dispatch_events(events);
            for t in out {
                if let Some(d) = dev.link.send(t) {
                    if !pending.iter().any(|p| Arc::ptr_eq(p, &d)) {
                        pending.push(d);
                    }
                }
            }
        }
    }

    /// Hot-unplug, first part (DESIGN §5): control verbs fail with `ENODEV`,
    /// every QP goes to ERR, every outstanding WR completes once with
    /// WR_FLUSH_ERR, armed CQ notifications fire, and the device leaves its
    /// link. The caller then runs its clients' `remove` upcalls and finishes
    /// with [`DeviceShared::raise_device_fatal`].
    pub fn revoke(self: &Arc<Self>) {
        self.with_core(|c, _| c.revoke());
        self.detach();
    }

    /// Whether the device was revoked.
    pub fn is_revoked(&self) -> bool {
        self.lock().is_revoked()
    }

    /// Hot-unplug, last part: DEVICE_FATAL on every context.
    pub fn raise_device_fatal(self: &Arc<Self>) {
        self.with_core(|c, _| c.device_fatal());
    }

    /// How many contexts of this device are still open (every object keeps
    /// its context alive, so zero means every consumer let go). The
    /// subsystem waits for it during hot-unplug.
    pub fn open_contexts(&self) -> usize {
        let sinks = self.sinks.lock().unwrap_or_else(|p| p.into_inner());
        sinks.values().filter(|w| w.strong_count() > 0).count()
    }

    /// Detaches the device from its link.
    pub(crate) fn detach(&self) {
        self.link.detach(self);
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A snapshot of the engine's counters.
    pub fn counters(&self) -> super::proto::Counters {
        self.lock().counters().clone()
    }
}
