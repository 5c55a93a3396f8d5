//! The real-time driver of a soft device: the sans-IO [`Core`] behind a
//! lock, an inbox of received datagrams, and the loop that moves packets
//! between engines (docs/design.md §2: drain input, transmit, arm the deadline).
//!
//! **Inline progress** (the default): there is no engine thread. Every verb
//! that can make progress (posting a send, polling a CQ, waiting on a
//! channel) drives the device (posting a receive only queues it), and an
//! in-process link drives the receiving device from the sender's thread,
//! so a two-device ping-pong in one thread completes inside `post_send`.
//! No runnable thread is added beyond the application's own, which matters
//! on small machines where a third busy-polling thread collapses a
//! ping-pong pair.
//!
//! Locks: each device has one engine lock; the driver never holds two at
//! once (datagrams are delivered into inboxes after the lock is released),
//! so devices cannot deadlock on each other. A network link sends while
//! the lock is held (it takes no other engine's lock), which keeps the
//! datagrams of concurrent verbs in the order the engine produced them.
//!
//! # Engine modes, and when to use which
//!
//! [`EngineMode::Inline`] (the default) adds no thread. Posting a send runs
//! the engine and sends what it produced; polling a CQ (and waiting on a
//! completion channel or the async event queue) also reads the device's
//! link, with a budget of [`udp::RX_BATCH`](super::link::udp::RX_BATCH)
//! datagrams per poll (one `recvmmsg`). Use it when the application polls
//! its CQs: latency benchmarks, RPC loops, anything that busy-polls. It is
//! the only mode that keeps a busy-polling pair at its best on a small
//! machine: on these 2-core hosts a blocking wake-up costs ~44–55 µs, and a
//! third runnable thread collapses two busy-polling processes.
//!
//! Its limit: nothing happens while no application thread is in a verb.
//! The passive side of RDMA WRITE/READ that never polls would not answer,
//! and retransmission timers only fire when someone calls a verb. An
//! application that sleeps in its own `epoll` on a completion channel's
//! or a context's descriptor is still woken: on a network link that
//! descriptor is an epoll set of the event queue, the link's descriptors
//! and a timer armed to the engine's next deadline, and the
//! `get_cq_event`/`get_async_event` it then calls drive the device (the
//! shared-memory link's peers then ring its doorbell for every datagram).
//! A passive target that never calls a verb can add
//! [`DeviceShared::poll_fds`] to its event loop and call
//! [`DeviceShared::drive`] when they are readable, or use:
//!
//! On a network link an inline device may coalesce the ACKs it owes while
//! the application is busy with the completions it just polled (sending the
//! newest per QP after at most 50 µs, with the next verb), which IBTA allows and
//! which takes one datagram per message off a send/receive ping-pong
//! ([`DeviceShared::set_ack_coalescing`]; the rule is `Core`'s).
//!
//! [`EngineMode::ProgressThread`]: one thread per device reads the link,
//! runs timers and sends, busy-polling for `spin` after the last work and
//! then sleeping on a `mio` poller. Use it for targets of one-sided
//! operations, applications that block (completion channels, `epoll`,
//! async runtimes) and background progress in general. The posting thread
//! sends what its verb produced itself, whether the progress thread spins
//! or sleeps: a UC or UD send completes when its packet is built, and the
//! packet must have left by the time that completion can be polled. Each
//! wake-up of a sleeping thread costs
//! a context switch (~50 µs here), and a spinning thread is one more
//! runnable thread: set `spin` to zero on a machine with fewer cores than
//! busy threads.

mod gsi;
mod progress;
mod watch;

#[cfg(test)]
mod tests;

pub(crate) use watch::epoll_of;

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crossbeam_queue::SegQueue;

use super::link::{Endpoint, Link};
use super::proto::train::{TrainIn, TrainRoute};
use super::proto::{Core, CoreEvent, CqId, Datagram, Egress, LinkHint, Nanos, Outgoing, Transmit};
use crate::sys::try_lock;
use crate::verbs::{AsyncEvent, PostError, RecvWr};

pub use super::clock::process_now;
pub use progress::EngineMode;

/// Batches [`DeviceShared::drive`] reads at most before it returns (the
/// rest waits for the next call, as under any engine-turn budget).
const DRIVE_TURNS: usize = 64;

/// The requester's view of a device's link for trains (weak: the link
/// owns the device's shared state, not the other way round).
struct LinkRoute(Weak<dyn Link>);

impl TrainRoute for LinkRoute {
    fn train_caps(&self, dst: IpAddr) -> super::proto::train::TrainCaps {
        self.0
            .upgrade()
            .and_then(|l| l.trains().map(|t| t.train_caps(dst)))
            .unwrap_or(super::proto::train::TrainCaps::NONE)
    }
}

thread_local! {
    /// Spare `Vec<Transmit>`s of this thread: the engine loop moves
    /// datagrams through them once or twice per verb, and allocating them
    /// each time showed in the profile.
    static SCRATCH: std::cell::RefCell<Vec<Vec<Transmit>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Per-device batches of [`DeviceShared::send_all`].
type Work = Vec<(Arc<DeviceShared>, Vec<Transmit>)>;

thread_local! {
    /// The (empty) work list of `send_all`, kept for its capacity.
    static WORK: std::cell::RefCell<Work> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty `Vec<Transmit>`, with capacity if this thread has a spare one.
fn take_scratch() -> Vec<Transmit> {
    SCRATCH
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives an emptied `Vec<Transmit>` back for reuse.
fn put_scratch(mut v: Vec<Transmit>) {
    if v.capacity() == 0 {
        return;
    }
    v.clear();
    let _ = SCRATCH.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < 8 {
            s.push(v);
        }
    });
}

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
    sinks: Mutex<HashMap<u32, Weak<dyn EventSink>>>,
    /// Whether the link has its own receive path (sockets).
    network: bool,
    /// Whether the link takes the send fast path's packets at once
    /// ([`FastSend::send_now`](super::link::FastSend::send_now)).
    sends_now: bool,
    /// The link's descriptors.
    link_fds: Vec<RawFd>,
    progress: progress::Progress,
    /// Inline mode on a network link, once an application took a
    /// descriptor to sleep on: the timer that makes it readable when an
    /// engine deadline passes (see `watch`).
    watch: std::sync::OnceLock<watch::Watch>,
    /// A thread outside the provider drives this device in inline mode
    /// (see [`DeviceShared::set_driven_externally`]).
    driven_externally: AtomicBool,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        // A progress thread asleep without a deadline would never notice.
        self.progress.stop();
        // ACKs still held for coalescing leave now.
        let core = self.core.get_mut().unwrap_or_else(|p| p.into_inner());
        if core.holds_acks() {
            core.flush_acks();
            let mut held = Vec::new();
            while let Some(t) = core.poll_transmit() {
                held.push(t);
            }
            self.link.send_batch(&mut held, &mut drop);
        }
    }
}

impl DeviceShared {
    pub(crate) fn new(name: String, addrs: Vec<IpAddr>, mut core: Core, link: Arc<dyn Link>) -> Arc<DeviceShared> {
        let link_fds = link.poll_fds();
        let sends_now = !link_fds.is_empty() && link.fast_send().is_some();
        core.set_train_route(Arc::new(LinkRoute(Arc::downgrade(&link))));
        let dev = Arc::new(DeviceShared {
            name,
            addrs,
            core: Mutex::new(core),
            inbox: SegQueue::new(),
            link,
            sinks: Mutex::new(HashMap::new()),
            network: !link_fds.is_empty(),
            sends_now,
            link_fds,
            progress: progress::Progress::new(),
            watch: std::sync::OnceLock::new(),
            driven_externally: AtomicBool::new(false),
        });
        let ep: Arc<dyn Endpoint> = dev.clone();
        dev.link.attach(&ep);
        dev
    }

    /// The device behind an endpoint a link handed back (every endpoint
    /// the engine attaches is a device; `None` for any other).
    fn of(ep: Arc<dyn Endpoint>) -> Option<Arc<DeviceShared>> {
        let any: Arc<dyn std::any::Any + Send + Sync> = ep;
        any.downcast().ok()
    }

    /// Lets inline polls hold plain ACKs back for coalescing
    /// ([`Core::set_ack_coalescing`]): a latency gain on network links for
    /// applications that keep calling verbs, such as ping-pong loops. Off
    /// by default: an application that stops calling verbs strands what
    /// is held (unless it sleeps on the device's descriptors, whose timer
    /// wakes it for the held ACKs' bound), and its peer's last sends may
    /// end in RETRY_EXC_ERR. Only inline devices on a network link hold
    /// ACKs; for any other this changes nothing. Call it after the device
    /// started (its engine mode is known).
    pub fn set_ack_coalescing(&self, on: bool) {
        let inline_network = self.network && !self.progress.threaded();
        self.lock().set_ack_coalescing(on && inline_network);
    }

    /// The device's addresses.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    /// The link's name.
    pub fn link_name(&self) -> &'static str {
        self.link.name()
    }

    /// Monotonic engine time: process time, shared by every device so
    /// that deadlines compare across devices.
    pub(crate) fn now(&self) -> Nanos {
        process_now()
    }

    /// Queues a received datagram (called by links).
    pub(crate) fn deliver(&self, tx: Transmit) {
        self.inbox.push(tx);
    }

    /// The UDP port the device takes RoCEv2 packets on (4791 unless
    /// configured otherwise), as it enters the ICRC of packets to it.
    pub fn roce_port(&self) -> u16 {
        self.lock().config().udp_port
    }

    /// Hands the device one datagram as if its link had received it from
    /// `src` (UDP source port `src_port`), addressed to the device's first
    /// address and [`Self::roce_port`], and processes it now with whatever
    /// it causes (answers are sent, completions and async events
    /// delivered).
    ///
    /// `data` is the UDP payload: a RoCEv2 packet (BTH onwards, ICRC
    /// last, computed over those addresses and ports). It goes through every check a datagram from the link goes
    /// through (parsing, ICRC when the device checks it, QP, P_Key, Q_Key,
    /// source address, PSN, keys), so a malformed one is dropped and
    /// counted, never trusted. This is for tests that must put on the wire
    /// what the verbs API cannot produce (the conformance suite's
    /// responder-side checks, such as a misaligned atomic); anything that
    /// can reach the device's link can send the same bytes.
    pub fn inject_datagram(self: &Arc<Self>, src: IpAddr, src_port: u16, data: Vec<u8>) {
        let dst_port = self.roce_port();
        let Some(&dst) = self.addrs.first() else { return };
        self.deliver(Transmit {
            src,
            dst,
            src_port,
            dst_port,
            data,
            train: None,
        });
        // A verb with no work of its own: it takes in the inbox, sends
        // what the packet caused and dispatches its events.
        self.with_core(|_, _| ());
    }

    /// Locks the engine. Poisoning is survivable: the engine's invariants
    /// are restored by every method before it can panic, and a panic there
    /// is a bug we would rather report than turn into a second panic.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        // A verb called from a device section would wait for the lock its
        // own thread holds.
        debug_assert!(
            !super::objects::in_section(),
            "a verb was called inside a device section (the engine is locked by this thread)"
        );
        crate::sys::lock(&self.core)
    }

    pub(crate) fn register_sink(&self, id: u32, sink: Weak<dyn EventSink>) {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).insert(id, sink);
    }

    pub(crate) fn unregister_sink(&self, id: u32) {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// Runs `f` on the engine, then drives every device the work reached.
    pub(crate) fn with_core<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core, Nanos) -> R) -> R {
        self.run_verb(false, f).0
    }

    /// [`Self::with_core`] for posting sends: in inline mode, on a link
    /// that takes packets at once and with no ACK held back, `f` gets an
    /// [`Egress`] to that link, by which the send fast path's packet
    /// leaves before the rest of the verb runs
    /// ([`Core::post_send_eager`]).
    pub(crate) fn with_core_eager<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core, Nanos, Option<Egress<'_>>) -> R) -> R {
        let eager = self.sends_now && !self.progress.threaded();
        let link = &self.link;
        self.run_verb(false, |c, now| {
            // The packet would overtake held ACKs; the general turn
            // sends them in order.
            if eager && !c.holds_acks() {
                f(
                    c,
                    now,
                    Some(&mut |t: &Outgoing<'_>, hint: &mut LinkHint| {
                        link.fast_send().is_some_and(|f| f.send_now(t, hint))
                    }),
                )
            } else {
                f(c, now, None)
            }
        })
        .0
    }

    /// Runs a verb that only changes the engine's local state and sends
    /// nothing (posting a receive): no clock read, no link I/O, no timers;
    /// the events it raises (completions flushed on a QP in ERR fire an
    /// armed CQ) are dispatched. Should `f` leave datagrams to send after
    /// all, the full path sends them.
    pub(crate) fn with_core_local<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut events = Vec::new();
        let (r, transmit) = {
            let mut core = self.lock();
            let r = f(&mut core);
            while let Some(e) = core.poll_event() {
                events.push(e);
            }
            (r, core.has_transmit())
        };
        self.dispatch_events(events);
        if transmit {
            self.with_core(|_, _| ());
        }
        r
    }

    /// `ibv_post_recv`: a lone WR that needs nothing but queueing
    /// ([`Core::post_recv_one`]) takes the lock and nothing else; the rest
    /// goes by [`Self::with_core_local`].
    pub(crate) fn post_recv(self: &Arc<Self>, qpn: u32, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        if let [wr] = wrs {
            if self.lock().post_recv_one(qpn, wr) {
                return Ok(());
            }
        }
        self.with_core_local(|c| c.post_recv_general(qpn, wrs))
    }

    /// Like [`Self::with_core`], and sends every ACK held back for
    /// coalescing: for verbs after which the application may stop calling
    /// (destroying a QP), so that its peer's last sends still complete.
    pub(crate) fn with_core_flushing<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core, Nanos) -> R) -> R {
        self.run_verb(false, |c, now| {
            let r = f(c, now);
            c.flush_acks();
            r
        })
        .0
    }

    /// Runs `f`, a poll of a CQ (or a section opened for one), as a poll
    /// runs: in inline mode the link is read first, and when completions
    /// go to the application the ACKs produced meanwhile may be held back
    /// for coalescing (by `Core::poll_cq`, see
    /// [`Self::set_ack_coalescing`]).
    pub(crate) fn poll_with<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core, Nanos) -> R) -> R {
        self.run_verb(true, f).0
    }

    /// Runs verb `f` on the engine (in inline mode reading the link first
    /// if `rx`), sends what it produced and drives the devices it reached;
    /// returns `f`'s result and how many datagrams it read from the link.
    fn run_verb<R>(self: &Arc<Self>, rx: bool, f: impl FnOnce(&mut Core, Nanos) -> R) -> (R, usize) {
        // One clock read per verb: everything this verb does (including
        // driving the in-process devices its packets reach) happens "now".
        let now = self.now();
        let core = self.lock();
        self.run_verb_locked(core, now, rx, f)
    }

    /// [`DeviceShared::run_verb`] with the engine already locked at `now`.
    fn run_verb_locked<R>(
        self: &Arc<Self>,
        mut core: MutexGuard<'_, Core>,
        now: Nanos,
        rx: bool,
        f: impl FnOnce(&mut Core, Nanos) -> R,
    ) -> (R, usize) {
        let mut received = 0;
        let threaded = self.progress.threaded();
        // Inline mode reads the link when polling, and before any due
        // transport timer runs: an ACK waiting in the socket must not let a
        // retransmission timer expire. (A held ACK's bound needs no read.)
        if self.network && !threaded && (rx || core.transport_timeout().is_some_and(|t| t <= now)) {
            let c = &mut *core;
            received = self
                .link
                .recv(super::link::udp::RX_BATCH, &mut |d| c.handle_datagram(now, d));
        }
        Self::progress_locked(&mut core, &self.inbox, now);
        let r = f(&mut core, now);
        if !threaded {
            if let Some(w) = self.watch.get() {
                w.note(core.poll_timeout(), now);
            }
        }
        if !threaded && self.network && core.at_most_one_transmit() {
            // At most one datagram and no event (nearly every verb of
            // a ping-pong), and no ACK held or to hold: straight to the
            // link, without the transmit list and the event dispatch
            // that a verb producing more needs. (Network links have no
            // timers of other devices to run: see `drive_due`.)
            if let Some(t) = core.poll_transmit() {
                self.link.send_one(t, &mut |b| core.recycle_buffer(b));
            }
            return (r, received);
        }
        self.finish_verb(core, now, threaded);
        (r, received)
    }

    /// The rest of [`Self::run_verb`] for a verb that produced more than
    /// one datagram, events, or ACKs to hold or let go: sends what the
    /// engine produced, dispatches the events,
    /// and drives the devices its packets reached. Kept out of line: every
    /// verb inlines `run_verb`, and this part, which a ping-pong's verbs
    /// rarely run, made each of them too large for LLVM to inline the
    /// per-message helpers they call.
    #[inline(never)]
    fn finish_verb(self: &Arc<Self>, mut core: MutexGuard<'_, Core>, now: Nanos, threaded: bool) {
        // A spare Vec only once there is something to send (most verbs,
        // posting a receive or an empty poll, send nothing).
        let mut out = Vec::new();
        let mut events = Vec::new();
        // Whatever the verb produced leaves now, from this thread, even
        // while a progress thread spins: a UC or UD send completes when
        // its last packet is built, so a completion the application can
        // poll must never stand for a datagram still waiting for another
        // thread's turn (an application that exits after its last
        // completion would lose it, and its peer would wait forever).
        Self::drain_locked(&mut core, &mut out, &mut events);
        if threaded {
            let deadline = core.poll_timeout();
            self.progress.set_deadline(deadline);
            if !self.progress.awake.load(Ordering::SeqCst) {
                self.progress.wake_for(deadline);
            }
        }
        if self.network && !out.is_empty() {
            Self::send_recycling(&self.link, &mut core, &mut out);
        }
        if out.is_empty() && out.capacity() > 0 {
            // Everything left: the list goes back to the engine.
            core.give_tx_list(std::mem::take(&mut out));
        }
        if !threaded {
            if let Some(p) = self.link.in_process() {
                p.note_deadline(core.poll_timeout());
            }
        }
        drop(core);
        self.dispatch_events(events);
        self.send_all(out, now);
        if !threaded && !self.network {
            self.drive_due(now);
        }
    }

    /// Drives the other devices of this link whose timers are due and that
    /// nobody drives (inline mode on the in-process link: the devices of a
    /// network link each run their own timers in their own verbs, and its
    /// `take_due` finds none).
    fn drive_due(&self, now: Nanos) {
        let Some(p) = self.link.in_process() else { return };
        let due = p.take_due(now);
        if !due.is_empty() {
            for dev in due {
                dev.drive();
            }
        }
    }

    /// Sends `out` on a network link, and gives the engine back the buffers
    /// of what left, for the packets it builds next.
    fn send_recycling(link: &Arc<dyn Link>, core: &mut Core, out: &mut Vec<Transmit>) {
        link.send_batch(out, &mut |b| core.recycle_buffer(b));
    }

    /// Makes progress on this device (and any device its packets reach):
    /// in inline mode reads the link, runs due timers and sends. It reads
    /// until the link has nothing more (up to `DRIVE_TURNS` (64) batches), so
    /// that an edge-triggered poller (mio, `EPOLLET`), which reports a
    /// readable socket once, may call it once per readiness event.
    /// Returns how many datagrams it read (a poller adapting its pace to
    /// the traffic uses it).
    pub fn drive(self: &Arc<Self>) -> usize {
        self.drive_turns(true).unwrap_or(0)
    }

    /// As [`DeviceShared::drive`], for a thread that drives the device
    /// from outside ([`DeviceShared::set_driven_externally`]) and shares a
    /// core with the application: `None` at once if a verb holds the
    /// engine. That verb progresses the device itself, and waiting for
    /// its lock would put this thread to sleep on it, so that the
    /// application's unlock wakes it back, a context switch each way on a
    /// shared core, for nothing.
    pub fn try_drive(self: &Arc<Self>) -> Option<usize> {
        self.drive_turns(false)
    }

    /// The body of [`DeviceShared::drive`] (`wait`: for the engine's lock)
    /// and [`DeviceShared::try_drive`].
    fn drive_turns(self: &Arc<Self>, wait: bool) -> Option<usize> {
        if let Some(w) = self.link.wakeups() {
            w.woken();
        }
        if let Some(w) = self.watch.get() {
            // The verbs below re-arm it for the next deadline.
            w.reset();
        }
        let mut total = 0;
        for turn in 0..DRIVE_TURNS {
            let Some(core) = (if wait { Some(self.lock()) } else { try_lock(&self.core) }) else {
                // Another verb holds the engine (and reads the link).
                return (turn > 0).then_some(total);
            };
            let ((), received) = self.run_verb_locked(core, self.now(), true, |c, _| c.flush_acks());
            total += received;
            if received == 0 {
                break;
            }
        }
        Some(total)
    }

    /// What an application's poller must watch, besides an object's own
    /// eventfd, for that object's descriptor to become readable whenever
    /// an event is pending: in inline mode on a network link the link's
    /// descriptors and the device's deadline timer (from the first call
    /// on, the link keeps its peers signalling and every verb keeps the
    /// timer armed); nothing otherwise (a progress thread, or in-process
    /// peers, drive the device).
    ///
    /// # Errors
    ///
    /// The timer cannot be created (out of descriptors).
    pub(crate) fn watched_fds(&self) -> std::io::Result<Vec<RawFd>> {
        if self.someone_drives() || !self.network {
            return Ok(Vec::new());
        }
        let w = match self.watch.get() {
            Some(w) => w,
            None => {
                let _ = self.watch.set(watch::Watch::new()?);
                if let Some(w) = self.link.wakeups() {
                    w.set_watched(true);
                }
                let w = self.watch.get().expect("just set");
                // Deadlines armed before the watch existed, and data
                // already waiting: the first drive looks.
                w.kick();
                w
            }
        };
        let mut fds = self.link_fds.clone();
        fds.push(w.timer_fd());
        Ok(fds)
    }

    /// Declares that a thread outside the provider drives this device in
    /// [`EngineMode::Inline`]: it waits on [`DeviceShared::poll_fds`] (after
    /// [`Wakeups::prepare_sleep`](super::link::Wakeups::prepare_sleep)) and calls [`DeviceShared::drive`] when they
    /// are readable and when the engine's deadline passes, as a library
    /// that embeds the provider runs its own progress thread. Event
    /// descriptors handed to applications (a context's async events, a
    /// completion channel) then wait on their own eventfd alone, and the
    /// link is never put in the mode where peers signal every datagram
    /// (which an application sleeping on the link's descriptors needs,
    /// and which costs a busy-polling peer a system call per message).
    ///
    /// Call it before the first descriptor is handed out; it cannot be
    /// undone.
    pub fn set_driven_externally(&self) {
        self.driven_externally.store(true, Ordering::Release);
    }

    /// Whether a thread other than the application's drives the engine.
    fn someone_drives(&self) -> bool {
        self.progress.threaded() || self.driven_externally.load(Ordering::Acquire)
    }

    /// One turn of [`DeviceShared::drive`] without the link's slow path
    /// (draining doorbells, rendezvous, every socket): reads what the
    /// link's fast path holds, runs due timers and sends; returns how many
    /// datagrams it read, or `None` at once if a verb holds the engine (as
    /// [`DeviceShared::try_drive`]). For a thread that drives the device
    /// from outside and keeps reading for a while after traffic
    /// ([`DeviceShared::set_driven_externally`]); a turn that finds
    /// nothing costs no system call on the shared-memory link.
    pub fn poll_link(self: &Arc<Self>) -> Option<usize> {
        let core = try_lock(&self.core)?;
        Some(self.run_verb_locked(core, self.now(), true, |c, _| c.flush_acks()).1)
    }

    /// The engine mode.
    pub fn mode(&self) -> EngineMode {
        self.progress.mode()
    }

    /// The descriptors an application running in [`EngineMode::Inline`]
    /// can add to its own event loop: when one is readable, call
    /// [`DeviceShared::drive`]. Empty for in-process links.
    pub fn poll_fds(&self) -> &[RawFd] {
        &self.link_fds
    }

    /// Waits until `fd` is readable or `timeout` passes; in inline mode
    /// also wakes when the link has datagrams (the caller then drives).
    pub(crate) fn wait_readable(&self, fd: RawFd, timeout: Option<Duration>) -> bool {
        if self.someone_drives() || self.link_fds.is_empty() {
            return super::notify::poll_readable(&[fd], timeout);
        }
        if !self.link.wakeups().is_none_or(|w| w.prepare_sleep()) {
            return true;
        }
        let mut fds = Vec::with_capacity(1 + self.link_fds.len());
        fds.push(fd);
        fds.extend_from_slice(&self.link_fds);
        super::notify::poll_readable(&fds, timeout)
    }

    /// Engine time of the next deadline, if any.
    pub(crate) fn next_deadline(&self) -> Option<Nanos> {
        self.lock().poll_timeout()
    }

    /// How long until the engine's next deadline (zero if it passed), if
    /// it has one: a thread driving the device from outside
    /// ([`DeviceShared::set_driven_externally`]) sleeps no longer.
    /// `None` also when a verb holds the engine (that verb runs its
    /// timers): this never waits for the engine's lock.
    pub fn until_deadline(&self) -> Option<Duration> {
        let d = try_lock(&self.core)?.poll_timeout()?;
        Some(Duration::from_nanos(d.saturating_sub(self.now())))
    }

    fn progress_locked(core: &mut Core, inbox: &SegQueue<Transmit>, now: Nanos) {
        // `is_empty` is two loads; a `pop` on an empty queue cost ~80
        // instructions, on every verb.
        while let Some(t) = if inbox.is_empty() { None } else { inbox.pop() } {
            Self::handle_owned(core, now, t);
        }
        if core.poll_timeout().is_some_and(|t| t <= now) {
            core.handle_timeout(now);
        }
    }

    fn drain_locked(core: &mut Core, out: &mut Vec<Transmit>, events: &mut Vec<CoreEvent>) {
        if out.capacity() == 0 && core.has_transmit() {
            // The list a network verb gave back to this engine; else one
            // from this thread's pool, where in-process deliveries leave
            // theirs (the lists travel with the datagrams between devices).
            *out = core.take_tx_list();
            if out.capacity() == 0 {
                *out = take_scratch();
            }
        }
        while let Some(t) = core.poll_transmit() {
            out.push(t);
        }
        while let Some(e) = core.poll_event() {
            events.push(e);
        }
    }

    #[inline]
    fn dispatch_events(&self, events: Vec<CoreEvent>) {
        if !events.is_empty() {
            self.dispatch_events_slow(events);
        }
    }

    fn dispatch_events_slow(&self, events: Vec<CoreEvent>) {
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
    /// iteratively (a ping-pong of ACKs never grows the stack). A datagram
    /// for an in-process device is handed to its engine directly, under its
    /// lock (after anything already in its inbox), and its buffer is
    /// recycled there for the packets that device builds next.
    pub(crate) fn send_all(self: &Arc<Self>, first: Vec<Transmit>, now: Nanos) {
        if first.is_empty() {
            if first.capacity() > 0 {
                put_scratch(first);
            }
            return;
        }
        // Batches to hand over, each to one device; in a ping-pong there is
        // one at a time, and its Vec is reused for what that device answers.
        let mut work = WORK
            .try_with(|w| std::mem::take(&mut *w.borrow_mut()))
            .unwrap_or_default();
        self.route_into(first, &mut work);
        while let Some((dev, mut txs)) = work.pop() {
            let mut events = Vec::new();
            {
                let mut core = dev.lock();
                while let Some(t) = if dev.inbox.is_empty() { None } else { dev.inbox.pop() } {
                    Self::handle_owned(&mut core, now, t);
                }
                for t in txs.drain(..) {
                    Self::handle_owned(&mut core, now, t);
                }
                if core.poll_timeout().is_some_and(|t| t <= now) {
                    core.handle_timeout(now);
                }
                Self::drain_locked(&mut core, &mut txs, &mut events);
                if let Some(p) = dev.link.in_process() {
                    p.note_deadline(core.poll_timeout());
                }
            }
            dev.dispatch_events(events);
            dev.route_into(txs, &mut work);
        }
        // Keep the (empty) list's capacity for the next call on this thread.
        let _ = WORK.try_with(|w| {
            let mut w = w.borrow_mut();
            if w.capacity() == 0 {
                *w = work;
            }
        });
    }

    /// Hands a received datagram to the engine and recycles its buffer.
    #[inline]
    fn handle_owned(core: &mut Core, now: Nanos, t: Transmit) {
        // A train from a device of this process: its buffers are mapped
        // here, and `t` keeps them alive while the engine copies.
        let pieces = t.train.as_ref().map(|tr| (tr.npkts, tr.local_pieces()));
        let train = match &pieces {
            None => None,
            Some((npkts, Some(p))) => TrainIn::new(*npkts, p),
            // Out of bounds (a bug): dropped like a lost packet.
            Some((_, None)) => None,
        };
        if pieces.is_none() || train.is_some() {
            core.handle_datagram(
                now,
                Datagram {
                    src: t.src,
                    dst: t.dst,
                    src_port: t.src_port,
                    dst_port: t.dst_port,
                    data: &t.data,
                    train,
                },
            );
        }
        drop(pieces);
        core.recycle_buffer(t.data);
    }

    /// The device of this process that owns `dst`, on an in-process link.
    fn route(&self, dst: IpAddr) -> Option<Arc<DeviceShared>> {
        self.link.in_process()?.route(dst).and_then(Self::of)
    }

    /// Sends a datagram no device of this process owns: an in-process
    /// link counts it, a network link sends it.
    fn send_unrouted(&self, t: Transmit) {
        match self.link.in_process() {
            Some(p) => {
                let _ = p.send(t);
            }
            None => self.link.send_batch(&mut vec![t], &mut drop),
        }
    }

    /// Sorts datagrams this device sends: those for in-process devices are
    /// added to `work` (per device, in order), the rest go to the link.
    fn route_into(&self, mut txs: Vec<Transmit>, work: &mut Work) {
        if txs.is_empty() {
            put_scratch(txs);
            return;
        }
        if txs.len() == 1 {
            // The common case: the whole Vec moves on, no allocation.
            match self.route(txs[0].dst) {
                Some(d) => match work.iter_mut().find(|(w, _)| Arc::ptr_eq(w, &d)) {
                    Some((_, v)) => {
                        v.append(&mut txs);
                        put_scratch(txs);
                    }
                    None => work.push((d, txs)),
                },
                None => {
                    for t in txs.drain(..) {
                        self.send_unrouted(t);
                    }
                    put_scratch(txs);
                }
            }
            return;
        }
        for t in txs.drain(..) {
            match self.route(t.dst) {
                Some(d) => match work.iter_mut().find(|(w, _)| Arc::ptr_eq(w, &d)) {
                    Some((_, v)) => v.push(t),
                    None => {
                        let mut v = take_scratch();
                        v.push(t);
                        work.push((d, v));
                    }
                },
                None => {
                    // A network link (or nobody owns the address: the link
                    // counts it).
                    self.send_unrouted(t);
                }
            }
        }
        put_scratch(txs);
    }

    /// Hot-unplug, first part (docs/design.md §5): control verbs fail with `ENODEV`,
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

    /// Detaches the device from its link (and stops its progress thread).
    pub(crate) fn detach(&self) {
        self.progress.stop();
        self.link.detach(self);
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A snapshot of the engine's counters, with what the link dropped
    /// before the engine saw it (bad ICRC, truncated, oversized) added in.
    pub fn counters(&self) -> super::proto::Counters {
        let mut c = self.lock().counters().clone();
        if let Some(d) = self.link.diagnostics() {
            d.merge_counters(&mut c);
        }
        c
    }

    /// How the link reaches each peer it knows, for `devinfo`.
    pub fn link_peers(&self) -> Vec<String> {
        self.link.diagnostics().map_or_else(Vec::new, |d| d.peers())
    }

    /// The link's own counters (`udp_tx_datagrams`, …), for `devinfo -v`.
    pub fn link_stats(&self) -> Vec<(&'static str, u64)> {
        self.link.diagnostics().map_or_else(Vec::new, |d| d.stats())
    }
}

impl Endpoint for DeviceShared {
    fn addrs(&self) -> &[IpAddr] {
        &self.addrs
    }

    fn deliver(&self, tx: Transmit) {
        DeviceShared::deliver(self, tx);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        DeviceShared::next_deadline(self)
    }

    fn drive(self: Arc<Self>) -> usize {
        DeviceShared::drive(&self)
    }
}
