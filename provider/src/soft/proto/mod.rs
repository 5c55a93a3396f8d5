//! The sans-IO soft RoCE engine of one device.
//!
//! [`Core`] holds every object of a device (PDs, MRs, CQs, SRQs, AHs, QPs)
//! and runs the RC/UC/UD transport. It never reads a clock, owns a socket or
//! spawns a thread: the caller passes `now` (nanoseconds on any monotonic
//! scale) to each input, and drains the outputs:
//!
//! - inputs: the verbs ([`Core::post_send`], [`Core::modify_qp`], …),
//!   [`Core::handle_datagram`] for each received UDP payload, and
//!   [`Core::handle_timeout`] when [`Core::poll_timeout`]'s deadline passes;
//! - outputs: [`Core::poll_transmit`] (datagrams to send),
//!   [`Core::poll_event`] (CQ notifications and async events), and the
//!   completions read with [`Core::poll_cq`].
//!
//! The call order after any input is: drain `poll_transmit`, drain
//! `poll_event`, then re-arm the timer from `poll_timeout`. This is what
//! lets the simulated fabric replay any run from its seed (docs/design.md §2).
//!
//! Files follow the directions of traffic, as rxe does: `qp` (objects,
//! state changes, flushing), `post` (posting), `requester` (WQEs → request packets),
//! `responder` (request packets → memory, receive completions, responses),
//! `completer` (responses → send completions, retransmission) and `recv`
//! (header checks and dispatch).

#![deny(unsafe_code)]

mod completer;
mod cq;
mod fast;
pub mod gsi;
mod memops;
mod mr;
mod post;
mod qp;
mod recovery;
mod recv;
mod requester;
mod responder;
mod slab;
mod srq;
#[cfg(test)]
mod tests;
mod timers;
pub mod train;

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::verbs::{
    verr, AhAttr, AsyncElement, AsyncEvent, DeviceAttr, EventType, Gid, PortAttr, Result, SrqAttr, SrqAttrMask,
    WorkCompletion,
};

pub use qp::QpCreate;
pub use recovery::{
    Recovery, HOLD_MAX_BYTES, HOLD_MAX_PKTS, PROBE_INITIAL_NS, PROBE_MIN_NS, WINDOW_MAX_NS, WINDOW_MIN_NS,
};
pub use recv::Counters;

use cq::Cq;
use mr::MrTable;
use qp::Qp;
use slab::Slab;
use srq::Srq;

/// Most packet buffers [`Core::recycle_buffer`] keeps for reuse: one
/// window of a network QP (an ACK that opens the window lets the requester
/// build that many packets in one verb), ~2 MiB at a 4 KiB MTU.
pub const SPARE_BUFS: usize = 512;

/// Time in nanoseconds on the caller's monotonic scale.
pub type Nanos = u64;

/// A protection domain id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);
/// A completion queue id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);
/// A shared receive queue id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);
/// An address handle id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhId(pub u32);

/// QP numbers start here (0 and 1 are the special QPs of IBTA).
pub const QPN_BASE: u32 = 0x11;

/// Static configuration of a device engine.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Device attributes (limits are enforced from here).
    pub attr: DeviceAttr,
    /// Port 1 attributes.
    pub port: PortAttr,
    /// GID table (index order).
    pub gids: Vec<Gid>,
    /// Seed for key bytes and any other random choice.
    pub seed: u64,
    /// Request an ACK at least every this many packets, across messages
    /// (see `requester`'s AckReq policy).
    pub ack_every: u32,
    /// Most unacknowledged request packets a QP keeps in flight.
    pub max_inflight_packets: u32,
    /// Whether to verify the ICRC of received packets.
    pub check_icrc: bool,
    /// Whether to compute the ICRC of sent packets (else it is zero).
    pub emit_icrc: bool,
    /// UDP destination port of RoCEv2 (4791).
    pub udp_port: u16,
    /// Whether one-packet RC SENDs and WRITEs take the fast paths
    /// (`proto/fast.rs`): received in order, or posted inline alone. They
    /// do what the general paths do, a little sooner; off, everything goes
    /// the general way (the tests compare the two).
    pub fast_paths: bool,
    /// The loss recovery offered to peers that announce it too
    /// ([`Recovery`]); any other peer gets standard go-back-N.
    pub recovery: Recovery,
}

impl CoreConfig {
    /// A configuration with the given attributes and defaults for the rest.
    pub fn new(attr: DeviceAttr, port: PortAttr, gids: Vec<Gid>, seed: u64) -> CoreConfig {
        CoreConfig {
            attr,
            port,
            gids,
            seed,
            ack_every: 64,
            max_inflight_packets: 1024,
            check_icrc: true,
            emit_icrc: true,
            udp_port: crate::soft::wire::ROCEV2_UDP_PORT,
            fast_paths: true,
            recovery: Recovery::SelectiveRepeat,
        }
    }
}

/// A datagram to send: a RoCEv2 UDP payload (BTH … ICRC) and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Source address (from the QP's source GID).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port (per-QP entropy, as RoCE NICs do).
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The UDP payload.
    pub data: Vec<u8>,
    /// Set for a train ([`train`]): `data` is its ONLY packet, without
    /// payload, and this says where the payload is. Only links that can
    /// carry trains ([`train::TrainRoute`]) ever get one.
    pub train: Option<Box<train::TrainOut>>,
}

/// The hook by which [`Core::post_send_eager`] hands a datagram to the
/// driver's link the moment the send fast path has its pieces, before
/// any buffer holds it: it sends the datagram and returns `true`, or does
/// nothing and returns `false` (the datagram is then built and queued as
/// usual). The [`LinkHint`] is the sending QP's.
pub type Egress<'a> = &'a mut dyn FnMut(&Outgoing<'_>, &mut LinkHint) -> bool;

/// A datagram in pieces, as the send fast path hands it to an [`Egress`]:
/// its UDP payload is `parts` one after the other (headers, payload, then
/// the pad and the ICRC's place). It carries no train.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The UDP payload, in order.
    pub parts: [&'a [u8]; 3],
}

impl<'a> Outgoing<'a> {
    /// `t` as one piece (`t` must carry no train: the pieces cannot).
    pub fn whole(t: &'a Transmit) -> Outgoing<'a> {
        Outgoing {
            src: t.src,
            dst: t.dst,
            src_port: t.src_port,
            dst_port: t.dst_port,
            parts: [&t.data, &[], &[]],
        }
    }

    /// The same datagram in one buffer.
    pub fn to_transmit(&self) -> Transmit {
        Transmit {
            src: self.src,
            dst: self.dst,
            src_port: self.src_port,
            dst_port: self.dst_port,
            data: self.parts.concat(),
            train: None,
        }
    }
}

/// What a link remembers about where a QP's datagrams go, kept with the QP
/// and handed back with each of its datagrams on the send fast path
/// ([`Egress`]), so that the link need not look the route up again (the
/// shared-memory link keeps the peer's channel here). Opaque to the
/// engine; the link checks it is still good before it uses it, and
/// replaces it when not.
#[derive(Default)]
pub struct LinkHint(Option<Box<dyn std::any::Any + Send>>);

impl LinkHint {
    /// The hint, if one of type `T` is set.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.0.as_deref().and_then(|h| h.downcast_ref())
    }

    /// Replaces the hint.
    pub fn set<T: Send + 'static>(&mut self, hint: T) {
        self.0 = Some(Box::new(hint));
    }
}

impl std::fmt::Debug for LinkHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "LinkHint(set)"
        } else {
            "LinkHint(none)"
        })
    }
}

/// Its UDP payload (links hand `Transmit`s to the kernel as they are).
impl AsRef<[u8]> for Transmit {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// A received datagram.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The UDP payload.
    pub data: &'a [u8],
    /// Set for a train ([`train`]): `data` is its ONLY packet, without
    /// payload, and this is the payload.
    pub train: Option<train::TrainIn<'a>>,
}

/// Something the driver must deliver outside the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreEvent {
    /// An armed CQ fired: signal its completion channel.
    CqNotify {
        /// The CQ.
        cq: CqId,
    },
    /// An asynchronous event for the context `owner` (or every context of
    /// the device when `None`).
    Async {
        /// Owning context id, as given at object creation.
        owner: Option<u32>,
        /// The event.
        event: AsyncEvent,
    },
}

/// Deterministic generator for key bytes (SplitMix64).
#[derive(Debug, Clone)]
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn next_u8(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

/// A protection domain; `owner` is the context that allocated it.
#[derive(Debug, Default)]
struct PdEntry {
    #[allow(dead_code)] // kept for hotplug: objects are reported per context
    owner: u32,
}

#[derive(Debug)]
struct AhEntry {
    pd: PdId,
}

/// The engine of one soft device. See the module docs for the call order.
#[derive(Debug)]
pub struct Core {
    cfg: CoreConfig,
    rng: SplitMix,
    pds: Slab<PdEntry>,
    mrs: MrTable,
    cqs: Slab<Cq>,
    srqs: Slab<Srq>,
    ahs: Slab<AhEntry>,
    qps: Slab<Box<Qp>>,
    tx: VecDeque<Transmit>,
    /// Packet buffers handed back by the driver ([`Core::recycle_buffer`]),
    /// reused for the next packets so that a packet costs no allocation.
    spare_bufs: Vec<Vec<u8>>,
    /// A transmit list for the driver to move datagrams through, kept
    /// here with its capacity between verbs ([`Core::take_tx_list`]).
    spare_tx_list: Vec<Transmit>,
    events: VecDeque<CoreEvent>,
    /// (deadline, qpn) of every QP with an armed timer.
    timers: timers::Timers,
    counters: Counters,
    /// Set by [`Core::revoke`] (hot-unplug).
    revoked: bool,
    /// Set once DEVICE_FATAL was raised: no async event follows it.
    fatal: bool,
    /// Where trains may go; none without a route.
    train_route: Option<TrainRouteRef>,
    /// Where QP1 (GSI) MADs go ([`gsi`]); none: QP1 is unknown.
    gsi_sink: Option<std::sync::Arc<dyn gsi::GsiSink>>,
    /// The SACK extension of the datagram being handled (`recovery`).
    rx_sack: Option<crate::soft::wire::Sack>,
}

/// The requester's view of the link for trains.
#[derive(Clone)]
struct TrainRouteRef(std::sync::Arc<dyn train::TrainRoute>);

impl std::fmt::Debug for TrainRouteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrainRoute")
    }
}

impl Core {
    /// A device engine with no objects.
    pub fn new(cfg: CoreConfig) -> Core {
        let rng = SplitMix::new(cfg.seed ^ 0x736f_6674_7665_7262);
        Core {
            cfg,
            rng,
            pds: Slab::default(),
            mrs: MrTable::default(),
            cqs: Slab::default(),
            srqs: Slab::default(),
            ahs: Slab::default(),
            qps: Slab::default(),
            tx: VecDeque::new(),
            spare_bufs: Vec::new(),
            spare_tx_list: Vec::new(),
            events: VecDeque::new(),
            timers: timers::Timers::default(),
            counters: Counters::default(),
            revoked: false,
            fatal: false,
            train_route: None,
            gsi_sink: None,
            rx_sack: None,
        }
    }

    /// Lets the requester send multi-packet SENDs and WRITEs from
    /// shareable memory as trains ([`train`]) to the destinations `route`
    /// accepts.
    pub fn set_train_route(&mut self, route: std::sync::Arc<dyn train::TrainRoute>) {
        self.train_route = Some(TrainRouteRef(route));
    }

    /// `ENODEV` once the device was revoked (hot-unplug).
    pub(crate) fn live(&self, verb: crate::verbs::Verb) -> Result<()> {
        if self.revoked {
            return Err(crate::verbs::Error::new(
                verb,
                crate::verbs::ErrorKind::NoDevice,
                "the device was removed",
            ));
        }
        Ok(())
    }

    /// Whether [`Core::revoke`] ran.
    pub fn is_revoked(&self) -> bool {
        self.revoked
    }

    /// Hot-unplug, engine part (docs/design.md §5): control verbs fail with
    /// `ENODEV` from now on; every QP moves to ERR and every posted,
    /// uncompleted WR completes exactly once with WR_FLUSH_ERR (send queue
    /// before receive queue, in post order); every armed CQ notification
    /// fires so blocked waiters wake; timers stop and nothing more is
    /// transmitted. DEVICE_FATAL is left to [`Core::device_fatal`], which the
    /// caller raises last, after its clients' `remove` upcalls.
    pub fn revoke(&mut self) {
        if self.revoked {
            return;
        }
        self.revoked = true;
        for id in self.qp_ids() {
            if let Some(mut qp) = self.take_qp(id) {
                self.flush_qp(&mut qp);
                self.put_qp(qp);
            }
        }
        for (id, cq) in self.cqs.iter_mut() {
            if cq.arm != cq::Arm::Disarmed {
                cq.arm = cq::Arm::Disarmed;
                self.events.push_back(CoreEvent::CqNotify { cq: CqId(id) });
            }
        }
        self.tx.clear();
        self.timers.clear();
    }

    /// Raises DEVICE_FATAL on every context: the last event of a removed
    /// device.
    pub fn device_fatal(&mut self) {
        if self.fatal {
            return;
        }
        self.push_async(
            None,
            AsyncEvent {
                event_type: EventType::DeviceFatal,
                element: AsyncElement::Device,
            },
        );
        self.fatal = true;
    }

    /// Queues an async event; after DEVICE_FATAL none follows (it is the
    /// last event of a device, docs/design.md §5).
    pub(crate) fn push_async(&mut self, owner: Option<u32>, event: AsyncEvent) {
        if !self.fatal {
            self.events.push_back(CoreEvent::Async { owner, event });
        }
    }

    /// Frees everything the engine still holds after [`Core::revoke`]:
    /// queues, CQs, SRQs, address handles, PDs and every reference to
    /// registered memory (the memory of consumers that did not let go is
    /// released now). Destroy calls after it still succeed.
    pub fn disassociate(&mut self) {
        if !self.revoked {
            return;
        }
        self.qps = Slab::default();
        self.cqs = Slab::default();
        self.srqs = Slab::default();
        self.ahs = Slab::default();
        self.pds = Slab::default();
        self.mrs = MrTable::default();
        self.tx.clear();
        self.timers.clear();
    }

    fn qp_ids(&self) -> Vec<u32> {
        self.qps.iter().map(|(id, _)| id + QPN_BASE).collect()
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// Packet and error counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// Hands back the buffer of a datagram the driver is done with (one it
    /// sent, or one it received and passed to [`Core::handle_datagram`]):
    /// the engine builds later packets in it instead of allocating. Optional;
    /// at most [`SPARE_BUFS`] buffers are kept.
    #[inline]
    pub fn recycle_buffer(&mut self, buf: Vec<u8>) {
        if self.spare_bufs.len() < SPARE_BUFS && buf.capacity() > 0 {
            self.spare_bufs.push(buf);
        }
    }

    /// An empty list for the driver to move datagrams through: the one it
    /// last gave back with [`Core::give_tx_list`] (under the engine lock,
    /// so no thread-local pool), or a new one.
    #[inline]
    pub(crate) fn take_tx_list(&mut self) -> Vec<Transmit> {
        std::mem::take(&mut self.spare_tx_list)
    }

    /// Keeps an emptied transmit list for [`Core::take_tx_list`].
    #[inline]
    pub(crate) fn give_tx_list(&mut self, mut v: Vec<Transmit>) {
        if self.spare_tx_list.capacity() == 0 {
            v.clear();
            self.spare_tx_list = v;
        }
    }

    /// An empty buffer with room for `len` bytes (a spare one if any).
    #[inline]
    pub(crate) fn take_buffer(&mut self, len: usize) -> Vec<u8> {
        match self.spare_bufs.pop() {
            Some(mut b) => {
                b.clear();
                b.reserve(len);
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Whether datagrams are waiting in [`Core::poll_transmit`].
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The next datagram to send, left in place.
    pub(crate) fn peek_transmit(&self) -> Option<&Transmit> {
        self.tx.front()
    }

    /// Whether at most one datagram and no event wait: what nearly every
    /// verb of a ping-pong leaves, which the driver may hand to its link as
    /// it is.
    pub(crate) fn at_most_one_transmit(&self) -> bool {
        self.tx.len() <= 1 && self.events.is_empty()
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<CoreEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline at which [`Core::handle_timeout`] must run.
    /// It may be early (a timer whose deadline moved out or went away
    /// still wakes once, and finds nothing to do), never late.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.timers.first_deadline()
    }

    /// Runs every timer due at `now` (retransmission, RNR retry).
    pub fn handle_timeout(&mut self, now: Nanos) {
        while let Some((t, qpn)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(mut qp) = self.take_qp(qpn) {
                if qp.timer == Some(t) {
                    qp.timer = None;
                    self.on_qp_timer(&mut qp, now);
                }
                self.put_qp(qp);
            }
        }
    }

    // ---- protection domains -------------------------------------------

    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    ///
    /// `ENOMEM` at `max_pd`.
    pub fn alloc_pd(&mut self, owner: u32) -> Result<PdId> {
        self.live(crate::verbs::Verb::AllocPd)?;
        if self.pds.live() >= self.cfg.attr.max_pd {
            return Err(verr!(
                AllocPd,
                NoMemory,
                "device limit of {} PDs reached",
                self.cfg.attr.max_pd
            ));
        }
        Ok(PdId(self.pds.insert(PdEntry { owner })))
    }

    /// `ibv_dealloc_pd`.
    ///
    /// # Errors
    ///
    /// `EBUSY` while MRs, QPs, SRQs or AHs use the PD; `EINVAL` if unknown.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        if self.revoked {
            // Destroy after removal always succeeds (docs/design.md §5).
            self.pds.remove(pd.0);
            return Ok(());
        }
        if self.pds.get(pd.0).is_none() {
            return Err(verr!(DeallocPd, InvalidArgument, "no such PD"));
        }
        let in_use = self.mrs.uses_pd(pd)
            || self.qps.iter().any(|(_, q)| q.pd == pd)
            || self.srqs.iter().any(|(_, s)| s.pd == pd)
            || self.ahs.iter().any(|(_, a)| a.pd == pd);
        if in_use && !self.revoked {
            return Err(verr!(DeallocPd, Busy, "the PD still has MRs, QPs, SRQs or AHs"));
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    fn check_pd(&self, verb: crate::verbs::Verb, pd: PdId) -> Result<()> {
        match self.pds.get(pd.0) {
            Some(_) => Ok(()),
            None => Err(crate::verbs::Error::new(
                verb,
                crate::verbs::ErrorKind::InvalidArgument,
                "the PD was deallocated",
            )),
        }
    }

    // ---- completion queues --------------------------------------------

    /// `ibv_create_cq`: returns the id and the granted capacity.
    ///
    /// # Errors
    ///
    /// `EINVAL` for 0 or more than `max_cqe` entries; `ENOMEM` at `max_cq`.
    pub fn create_cq(&mut self, cqe: u32, context: u64, owner: u32) -> Result<(CqId, u32)> {
        self.live(crate::verbs::Verb::CreateCq)?;
        if cqe == 0 || cqe > self.cfg.attr.max_cqe {
            return Err(verr!(
                CreateCq,
                InvalidArgument,
                "cqe {cqe} not in 1..={}",
                self.cfg.attr.max_cqe
            ));
        }
        if self.cqs.live() >= self.cfg.attr.max_cq {
            return Err(verr!(
                CreateCq,
                NoMemory,
                "device limit of {} CQs reached",
                self.cfg.attr.max_cq
            ));
        }
        Ok((CqId(self.cqs.insert(Cq::new(cqe, context, owner))), cqe))
    }

    /// `ibv_destroy_cq`.
    ///
    /// # Errors
    ///
    /// `EBUSY` while a QP uses the CQ; `EINVAL` if unknown.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        if self.revoked {
            self.cqs.remove(cq.0);
            return Ok(());
        }
        match self.cqs.get(cq.0) {
            None => Err(verr!(DestroyCq, InvalidArgument, "no such CQ")),
            Some(c) if c.users > 0 && !self.revoked => {
                Err(verr!(DestroyCq, Busy, "{} QP(s) still use this CQ", c.users))
            }
            Some(_) => {
                self.cqs.remove(cq.0);
                Ok(())
            }
        }
    }

    /// `ibv_poll_cq`.
    ///
    /// # Errors
    ///
    /// `EIO` once the CQ overran; `EINVAL` if unknown.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [WorkCompletion]) -> Result<usize> {
        let c = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| verr!(PollCq, InvalidArgument, "no such CQ"))?;
        if c.overrun {
            return Err(verr!(
                PollCq,
                Io,
                "the CQ overran and is unusable (CQ_ERR was reported)"
            ));
        }
        Ok(c.poll(out))
    }

    /// Number of completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqId) -> usize {
        self.cqs.get(cq.0).map_or(0, |c| c.queue.len())
    }

    /// `ibv_req_notify_cq`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if unknown.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<()> {
        self.live(crate::verbs::Verb::ReqNotifyCq)?;
        let c = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| verr!(ReqNotifyCq, InvalidArgument, "no such CQ"))?;
        c.arm = if solicited_only {
            cq::Arm::Solicited
        } else {
            cq::Arm::Next
        };
        Ok(())
    }

    /// `ibv_resize_cq`: returns the new capacity.
    ///
    /// # Errors
    ///
    /// `EINVAL` below the number of queued completions, 0, or above
    /// `max_cqe`.
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32) -> Result<u32> {
        self.live(crate::verbs::Verb::ResizeCq)?;
        let max = self.cfg.attr.max_cqe;
        let c = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| verr!(ResizeCq, InvalidArgument, "no such CQ"))?;
        if cqe == 0 || cqe > max || (cqe as usize) < c.queue.len() {
            return Err(verr!(
                ResizeCq,
                InvalidArgument,
                "cqe {cqe} must be in 1..={max} and hold the {} queued completions",
                c.queue.len()
            ));
        }
        c.capacity = cqe;
        Ok(cqe)
    }

    pub(crate) fn push_cqe(&mut self, cq: CqId, wc: WorkCompletion, solicited: bool) {
        let Some(c) = self.cqs.get_mut(cq.0) else { return };
        let out = c.push(wc, solicited);
        let (context, owner) = (c.context, c.owner);
        if out.notify {
            self.events.push_back(CoreEvent::CqNotify { cq });
        }
        if out.overrun {
            self.counters.cq_overruns += 1;
            self.push_async(
                Some(owner),
                AsyncEvent {
                    event_type: EventType::CqErr,
                    element: AsyncElement::Cq(context),
                },
            );
        }
    }

    pub(crate) fn qp_event(&mut self, qp: &Qp, event_type: EventType) {
        self.push_async(
            Some(qp.owner),
            AsyncEvent {
                event_type,
                element: AsyncElement::Qp(qp.qpn),
            },
        );
    }

    // ---- shared receive queues ----------------------------------------

    /// `ibv_create_srq`: returns the id and the granted attributes.
    ///
    /// # Errors
    ///
    /// `EINVAL` beyond `max_srq_wr`/`max_srq_sge` or a limit above the
    /// depth; `ENOMEM` at `max_srq`.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr, context: u64, owner: u32) -> Result<(SrqId, SrqAttr)> {
        self.live(crate::verbs::Verb::CreateSrq)?;
        self.check_pd(crate::verbs::Verb::CreateSrq, pd)?;
        let a = &self.cfg.attr;
        if attr.max_wr == 0 || attr.max_wr > a.max_srq_wr || attr.max_sge == 0 || attr.max_sge > a.max_srq_sge {
            return Err(verr!(
                CreateSrq,
                InvalidArgument,
                "max_wr {} / max_sge {} outside 1..={} / 1..={}",
                attr.max_wr,
                attr.max_sge,
                a.max_srq_wr,
                a.max_srq_sge
            ));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(verr!(CreateSrq, InvalidArgument, "srq_limit above max_wr"));
        }
        if self.srqs.live() >= a.max_srq {
            return Err(verr!(CreateSrq, NoMemory, "device limit of {} SRQs reached", a.max_srq));
        }
        let srq = Srq::new(pd, attr, context, owner);
        let granted = srq.attr();
        Ok((SrqId(self.srqs.insert(srq)), granted))
    }

    /// `ibv_modify_srq`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a limit above the depth, a resize below the queued
    /// count or above `max_srq_wr`.
    pub fn modify_srq(&mut self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.live(crate::verbs::Verb::ModifySrq)?;
        let max = self.cfg.attr.max_srq_wr;
        let s = self
            .srqs
            .get_mut(srq.0)
            .ok_or_else(|| verr!(ModifySrq, InvalidArgument, "no such SRQ"))?;
        s.modify(attr, mask, max)
    }

    /// `ibv_query_srq`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if unknown.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr> {
        self.srqs
            .get(srq.0)
            .map(|s| s.attr())
            .ok_or_else(|| verr!(QuerySrq, InvalidArgument, "no such SRQ"))
    }

    /// `ibv_destroy_srq`.
    ///
    /// # Errors
    ///
    /// `EBUSY` while QPs use it.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        if self.revoked {
            self.srqs.remove(srq.0);
            return Ok(());
        }
        match self.srqs.get(srq.0) {
            None => Err(verr!(DestroySrq, InvalidArgument, "no such SRQ")),
            Some(s) if s.users > 0 && !self.revoked => {
                Err(verr!(DestroySrq, Busy, "{} QP(s) still use this SRQ", s.users))
            }
            Some(_) => {
                self.srqs.remove(srq.0);
                Ok(())
            }
        }
    }

    // ---- address handles ----------------------------------------------

    /// `ibv_create_ah`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad port, a non-global AV (RoCE needs a GRH) or an
    /// unpopulated source GID; `ENOMEM` at `max_ah`.
    pub fn create_ah(&mut self, pd: PdId, attr: &AhAttr) -> Result<AhId> {
        self.live(crate::verbs::Verb::CreateAh)?;
        self.check_pd(crate::verbs::Verb::CreateAh, pd)?;
        self.check_av(attr)
            .map_err(|e| e.with_verb(crate::verbs::Verb::CreateAh))?;
        if self.ahs.live() >= self.cfg.attr.max_ah {
            return Err(verr!(
                CreateAh,
                NoMemory,
                "device limit of {} AHs reached",
                self.cfg.attr.max_ah
            ));
        }
        Ok(AhId(self.ahs.insert(AhEntry { pd })))
    }

    /// `ibv_destroy_ah`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if unknown.
    pub fn destroy_ah(&mut self, ah: AhId) -> Result<()> {
        if self.revoked {
            self.ahs.remove(ah.0);
            return Ok(());
        }
        self.ahs
            .remove(ah.0)
            .map(|_| ())
            .ok_or_else(|| verr!(DestroyAh, InvalidArgument, "no such AH"))
    }

    pub(crate) fn check_av(&self, av: &AhAttr) -> Result<()> {
        if av.port_num != 1 {
            return Err(verr!(
                ModifyQp,
                InvalidArgument,
                "address vector port {} does not exist",
                av.port_num
            ));
        }
        if !av.is_global {
            return Err(verr!(
                ModifyQp,
                InvalidArgument,
                "RoCE address vectors need a GRH (is_global)"
            ));
        }
        let sgid = self
            .cfg
            .gids
            .get(av.grh.sgid_index as usize)
            .copied()
            .unwrap_or(Gid::ZERO);
        if sgid.is_zero() {
            return Err(verr!(
                ModifyQp,
                InvalidArgument,
                "source GID index {} is not populated",
                av.grh.sgid_index
            ));
        }
        if av.grh.dgid.is_zero() {
            return Err(verr!(ModifyQp, InvalidArgument, "destination GID is zero"));
        }
        Ok(())
    }

    // ---- timers -------------------------------------------------------

    /// Arms (or disarms with `None`) the single timer of a QP.
    pub(crate) fn set_timer(&mut self, qp: &mut Qp, deadline: Option<Nanos>) {
        if let Some(old) = qp.timer.take() {
            self.timers.remove(old, qp.qpn);
        }
        if let Some(t) = deadline {
            self.timers.insert(t, qp.qpn);
            qp.timer = Some(t);
        }
    }

    pub(crate) fn take_qp(&mut self, qpn: u32) -> Option<Box<Qp>> {
        self.qps.take(qpn.checked_sub(QPN_BASE)?)
    }

    pub(crate) fn put_qp(&mut self, qp: Box<Qp>) {
        let id = qp.qpn - QPN_BASE;
        self.qps.put(id, qp);
    }
}
