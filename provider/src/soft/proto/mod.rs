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
//! This file holds [`Core`] and its I/O surface alone. The verbs live
//! with their object family: `pd` (protection domains, address handles),
//! `cq` (completion queues), `srq` (shared receive queues and their
//! posting), `qp` (QPs: creation, state changes, queries, flushing), `mr`
//! (the key table and placement through it) and `memops` (the MR and MW
//! verbs and the memory work requests). Posting is `post`; the transport
//! follows the
//! directions of traffic, as rxe does: `requester` (WQEs → request
//! packets), `responder` (request packets → memory, receive completions,
//! responses), `completer` (responses → send completions,
//! retransmission), `recv` (header checks and dispatch), with `fast` the
//! one-packet fast paths of both directions, `recovery` and `timers`;
//! `acks` decides which acknowledgements leave, and when (coalescing).
//! Messages sent by reference are `by_reference`; what the transport
//! asks of or hands to a link directly is `seams`.

#![deny(unsafe_code)]

mod acks;
pub mod by_reference;
mod completer;
mod cq;
mod fast;
pub mod gsi;
mod memops;
mod mr;
mod pd;
mod post;
mod qp;
mod recovery;
mod recv;
mod requester;
mod responder;
pub mod seams;
mod slab;
mod srq;
#[cfg(test)]
mod tests;
mod timers;

/// The trains' types and their route ([`by_reference`], [`TrainRoute`])
/// under the path the links and the engine name them by.
pub mod train {
    pub use super::by_reference::*;
    pub use super::seams::TrainRoute;
}

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::verbs::{AsyncElement, AsyncEvent, DeviceAttr, EventType, Gid, PortAttr, Result};

pub use acks::ACK_HOLD_NS;
pub use cq::CqId;
pub use pd::{AhId, PdId};
pub use qp::QpCreate;
pub use recovery::{
    Recovery, HOLD_MAX_BYTES, HOLD_MAX_PKTS, PROBE_INITIAL_NS, PROBE_MIN_NS, WINDOW_MAX_NS, WINDOW_MIN_NS,
};
pub use recv::Counters;
pub use seams::{Egress, LinkHint, Outgoing, TrainRoute};
pub use srq::SrqId;

use cq::Cq;
use mr::MrTable;
use pd::{AhEntry, PdEntry};
use qp::Qp;
use seams::TrainRouteRef;
use slab::Slab;
use srq::Srq;

/// Most packet buffers [`Core::recycle_buffer`] keeps for reuse: one
/// window of a network QP (an ACK that opens the window lets the requester
/// build that many packets in one verb), ~2 MiB at a 4 KiB MTU.
pub const SPARE_BUFS: usize = 512;

/// Time in nanoseconds on the caller's monotonic scale.
pub type Nanos = u64;

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
    /// Set for a train ([`by_reference`]): `data` is its ONLY packet, without
    /// payload, and this says where the payload is. Only links that can
    /// carry trains ([`TrainRoute`]) ever get one.
    pub train: Option<Box<by_reference::TrainOut>>,
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
    /// Set for a train ([`by_reference`]): `data` is its ONLY packet, without
    /// payload, and this is the payload.
    pub train: Option<by_reference::TrainIn<'a>>,
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
    /// ACK coalescing ([`acks`]).
    acks: acks::Acks,
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
            acks: acks::Acks::default(),
        }
    }

    /// Lets the requester send multi-packet SENDs and WRITEs from
    /// shareable memory as trains ([`by_reference`]) to the destinations `route`
    /// accepts.
    pub fn set_train_route(&mut self, route: std::sync::Arc<dyn TrainRoute>) {
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
        self.acks.clear();
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
        self.acks.clear();
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

    /// Next datagram to send. The output of a turn leaves as the turn
    /// produced it, except for acknowledgements (see [`acks`]): a plain
    /// ACK that a later one of the same QP superseded was taken out when
    /// that one was queued, and the first call of a drain holds ACKs back
    /// or lets held ones go.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.acks.busy() {
            return self.poll_transmit_sorted();
        }
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
        !self.tx.is_empty() || self.acks.due()
    }

    /// Whether at most one datagram and no event wait, and no
    /// acknowledgement is held or to hold: what nearly every verb of a
    /// ping-pong leaves, which the driver may hand to its link as it is
    /// (by one [`Core::poll_transmit`]).
    #[inline]
    pub(crate) fn at_most_one_transmit(&self) -> bool {
        self.tx.len() <= 1 && self.events.is_empty() && !self.acks.needs_sorting(&self.tx)
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<CoreEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline at which [`Core::handle_timeout`] must run.
    /// It may be early (a timer whose deadline moved out or went away
    /// still wakes once, and finds nothing to do), never late. It
    /// includes the bound of a held ACK ([`ACK_HOLD_NS`]).
    #[inline]
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let t = self.timers.first_deadline();
        if !self.acks.holding() {
            return t;
        }
        match (t, self.acks.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest deadline of the transport's timers (retransmission,
    /// RNR retry), without held ACKs: a driver that reads its link before
    /// a due timer, so that an ACK waiting there stops a retransmission,
    /// need not read it for a held ACK's bound.
    #[inline]
    pub fn transport_timeout(&self) -> Option<Nanos> {
        self.timers.first_deadline()
    }

    /// Runs every timer due at `now` (retransmission, RNR retry), and
    /// releases the held ACKs whose bound passed: they leave with the next
    /// drain, after what this turn produces.
    pub fn handle_timeout(&mut self, now: Nanos) {
        if self.acks.deadline().is_some_and(|d| d <= now) {
            self.acks.release(now);
        }
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

    pub(crate) fn qp_event(&mut self, qp: &Qp, event_type: EventType) {
        self.push_async(
            Some(qp.owner),
            AsyncEvent {
                event_type,
                element: AsyncElement::Qp(qp.qpn),
            },
        );
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
}
