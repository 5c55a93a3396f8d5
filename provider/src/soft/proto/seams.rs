//! The seams between the sans-IO transport and the links that carry its
//! datagrams.
//!
//! [`Core`] does no I/O: it takes datagrams in and hands datagrams out
//! (`proto`'s module docs). Three things cross that line anyway, each
//! listed among the known exceptions of docs/architecture.md; they are
//! together here so that the line is drawn in one place, and a new one
//! is not added without a reason written next to it:
//!
//! - [`Egress`] (a datagram as [`Outgoing`] pieces): the send fast path
//!   hands its one packet to the driver's link from inside the verb,
//!   before the WQE is built and without a buffer. A lone one-packet SEND
//!   or WRITE leaving the process before its bookkeeping is most of a
//!   ping-pong's latency.
//! - [`TrainRoute`]: the requester asks the link whether a whole message
//!   may travel as one train (`by_reference`). That depends on the peer
//!   the link reaches (another process that maps the same shared memory,
//!   or may read this process's memory), which only the link knows.
//! - [`LinkHint`]: each QP keeps a link's private route to its peer (the
//!   shared-memory link keeps the peer's ring), handed back with each
//!   datagram through the [`Egress`], so the fast path does not look the
//!   route up per packet.
//!
//! [`Core`]: super::Core

use std::net::IpAddr;

use super::by_reference::TrainCaps;
use super::Transmit;

/// The hook by which [`Core::post_send_eager`](super::Core::post_send_eager) hands a datagram to the
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

/// Tells the requester where trains can go. Implemented for the link by
/// the engine.
pub trait TrainRoute: Send + Sync {
    /// What memory a train sent to `dst` now may carry
    /// ([`TrainCaps::NONE`]: no train may go there).
    fn train_caps(&self, dst: IpAddr) -> TrainCaps;
}

/// The requester's view of the link for trains.
#[derive(Clone)]
pub(super) struct TrainRouteRef(pub(super) std::sync::Arc<dyn TrainRoute>);

impl std::fmt::Debug for TrainRouteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrainRoute")
    }
}
