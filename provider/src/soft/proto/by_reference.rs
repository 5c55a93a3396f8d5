//! Trains, messages sent by reference: a SEND or RDMA WRITE of at least [`TRAIN_MIN_LEN`] bytes sent
//! as one request whose payload stays in the sender's memory, for links whose receiver can read
//! that memory directly (the in-process link and the shared-memory link
//! for [`SharedMemory`] buffers; the shared-memory link also for any
//! registered memory where the receiver may read the sender's address
//! space, [`TrainCaps::process`]). The receiver copies the message once,
//! from the sender's registered memory into its own.
//!
//! A train is an ONLY packet (`SEND_ONLY[_IMM|_INV]`, `WRITE_ONLY[_IMM]`
//! with its RETH, ImmDt, IETH, solicited bit and AckReq) whose PSN is the
//! message's first and which stands for all `npkts` packets the message
//! takes at the path MTU: PSNs, the outstanding-packet window, ACK
//! coalescing, duplicate and sequence handling stay exactly those of the
//! packet-by-packet message, so the requester's completion and
//! retransmission logic is unchanged. A message of one packet goes as a
//! train only where the receiver said it takes such trains
//! ([`TrainCaps::one_packet`]; earlier receivers took trains of two
//! packets or more). The responder checks the train like
//! the packets it replaces (whole range up front, length against the DMA
//! length or the receive buffer, `npkts` against its own MTU), places the
//! payload piece by piece in order with the last bytes written last, and
//! acknowledges the train's last PSN.
//!
//! A train is only built from the first byte of a message (a resumed
//! message goes packet by packet), only towards destinations the link says
//! it can carry trains to ([`TrainRoute`](super::TrainRoute)), and only when every byte of
//! the message lies in memory the route can carry ([`TrainCaps`]): each
//! piece is either part of a [`SharedMemory`] buffer
//! ([`TrainPiece::Shared`]) or, if the route allows it, a range of this
//! process's address space ([`TrainPiece::Process`]) that the receiver
//! reads with cross-memory attach. A link that cannot deliver a train (the
//! route changed) drops it like a lost packet; the retransmission rebuilds
//! the message as packets.

use std::sync::Arc;

use crate::verbs::{MappedPiece, SharedMemory};

/// Messages shorter than this go packet by packet even where trains are
/// possible (a train costs a lookup per piece and, on the shared-memory
/// link, a mapping per buffer). Measured with `perf write_bw` on buffers
/// that can carry trains (MiB/s, trains against packets): cross-process on
/// the shared-memory link 14,947 against 5,844 at 8 KiB (MTU 4096), 5,918
/// against 1,655 at 4 KiB and 3,611 against 2,794 at 2 KiB (MTU 1024),
/// equal at 1 KiB (MTU 512); in one process 12,134 against 7,665 at 8 KiB.
/// Messages of one packet (MTU 4096; 6 alternating rounds of 1 s each,
/// per-round ratio): 1.64x at 4 KiB, 1.15x at 2 KiB, 0.93-0.95x at 1 and
/// 1.5 KiB (no gain there). In one process (`perf write_bw`, embedded)
/// trains of one packet gained nothing at 4 KiB (0.96x, 8 rounds): the
/// in-process link sends them only of several packets.
pub const TRAIN_MIN_LEN: u32 = 2 * 1024;

/// Messages shorter than this carry no [`TrainPiece::Process`] ranges (they
/// go packet by packet unless all their memory is shareable). Measured
/// cross-process on the shared-memory link (`perf write_bw`, one core
/// each, MiB/s), a `process_vm_readv` train against the ring's packets:
/// 6,708 against 7,166 at 64 KiB, 8,025 against 5,725 at 128 KiB, 10,000
/// against 7,800 at 1 MiB.
pub const TRAIN_PROCESS_MIN_LEN: u32 = 128 * 1024;

/// Most pieces (scatter/gather elements) a train carries.
pub const TRAIN_MAX_PIECES: usize = 16;

/// What memory a train to some destination may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrainCaps {
    /// Pieces of [`SharedMemory`] buffers ([`TrainPiece::Shared`]).
    pub shared: bool,
    /// Ranges of the sending process's address space
    /// ([`TrainPiece::Process`]): the receiver was verified to be able to
    /// read this process's memory.
    pub process: bool,
    /// Trains of one packet (messages that fit the path MTU, from
    /// [`TRAIN_MIN_LEN`] bytes): the receiver takes them. Without it only
    /// messages of several packets go as trains.
    pub one_packet: bool,
}

impl TrainCaps {
    /// No trains.
    pub const NONE: TrainCaps = TrainCaps {
        shared: false,
        process: false,
        one_packet: false,
    };
    /// Trains of shareable buffers only, of several packets.
    pub const SHARED: TrainCaps = TrainCaps {
        shared: true,
        process: false,
        one_packet: false,
    };
    /// Trains of shareable buffers and of any registered memory, of
    /// several packets.
    pub const ALL: TrainCaps = TrainCaps {
        shared: true,
        process: true,
        one_packet: false,
    };

    /// Whether any train can go.
    pub fn any(self) -> bool {
        self.shared || self.process
    }
}

/// A piece of an outgoing train's payload.
#[derive(Debug, Clone)]
pub enum TrainPiece {
    /// `len` bytes at `offset` of a shareable buffer.
    Shared {
        /// The buffer (kept alive while the train is in flight).
        mem: Arc<SharedMemory>,
        /// Offset in the buffer.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// `len` bytes at `addr` of this process's address space (registered
    /// memory, valid until the work request completes per the verbs
    /// contract), for a receiver in another process that reads it with
    /// cross-memory attach. Only built for routes that allow it
    /// ([`TrainCaps::process`]).
    Process {
        /// Virtual address in this process.
        addr: u64,
        /// Length.
        len: u32,
    },
}

impl TrainPiece {
    /// Length.
    pub fn len(&self) -> u32 {
        match self {
            TrainPiece::Shared { len, .. } | TrainPiece::Process { len, .. } => *len,
        }
    }

    /// Whether the piece is empty (never built so).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PartialEq for TrainPiece {
    fn eq(&self, other: &TrainPiece) -> bool {
        match (self, other) {
            (
                TrainPiece::Shared { mem, offset, len },
                TrainPiece::Shared {
                    mem: m2,
                    offset: o2,
                    len: l2,
                },
            ) => Arc::ptr_eq(mem, m2) && offset == o2 && len == l2,
            (TrainPiece::Process { addr, len }, TrainPiece::Process { addr: a2, len: l2 }) => addr == a2 && len == l2,
            _ => false,
        }
    }
}

impl Eq for TrainPiece {}

/// The payload description of an outgoing train, carried by its
/// [`Transmit`](super::Transmit).
#[derive(Debug, Clone)]
pub struct TrainOut {
    /// Packets (PSNs) the train stands for.
    pub npkts: u32,
    /// The pieces, in message order; their lengths add up to the message
    /// length.
    pub pieces: Vec<TrainPiece>,
}

impl PartialEq for TrainOut {
    fn eq(&self, other: &TrainOut) -> bool {
        self.npkts == other.npkts && self.pieces == other.pieces
    }
}

impl Eq for TrainOut {}

impl TrainOut {
    /// Total payload length.
    pub fn len(&self) -> u64 {
        self.pieces.iter().map(|p| u64::from(p.len())).sum()
    }

    /// Whether the train carries no payload (never built so).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces as readable ranges of this process, for a receiver in
    /// the same process: the buffers are mapped here, and `self` keeps
    /// them alive while the result is borrowed. `None` if a piece lies
    /// outside its buffer, or is a [`TrainPiece::Process`] range (never
    /// built for in-process routes: the receiver drops the train like a
    /// lost packet).
    pub fn local_pieces(&self) -> Option<Vec<MappedPiece<'_>>> {
        self.pieces
            .iter()
            .map(|p| match p {
                TrainPiece::Shared { mem, offset, len } => mem.piece(*offset, *len as usize),
                TrainPiece::Process { .. } => None,
            })
            .collect()
    }

    /// Whether a piece is a [`TrainPiece::Process`] range.
    pub fn has_process_pieces(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, TrainPiece::Process { .. }))
    }
}

/// A received train's payload: what [`Core::handle_datagram`](super::Core::handle_datagram)
/// reads the message from.
#[derive(Debug, Clone, Copy)]
pub struct TrainIn<'a> {
    npkts: u32,
    len: u32,
    pieces: &'a [MappedPiece<'a>],
}

impl<'a> TrainIn<'a> {
    /// A train of `npkts` packets whose payload is `pieces` in order.
    /// `None` if the total length does not fit a message (2^31 bytes) or
    /// `npkts` is zero.
    pub fn new(npkts: u32, pieces: &'a [MappedPiece<'a>]) -> Option<TrainIn<'a>> {
        let total: usize = pieces.iter().try_fold(0usize, |a, p| a.checked_add(p.len()))?;
        let len = u32::try_from(total).ok().filter(|&l| l <= 1 << 31)?;
        (npkts > 0).then_some(TrainIn { npkts, len, pieces })
    }

    /// Packets the train stands for.
    pub fn npkts(&self) -> u32 {
        self.npkts
    }

    /// Payload length.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the train's ONLY packet (with `payload_len` bytes of its
    /// own) can stand for the message at path MTU `mtu`: no payload in the
    /// packet, some in the train, and `npkts` the packets of its length.
    pub(crate) fn fits(&self, payload_len: usize, mtu: u32) -> bool {
        payload_len == 0 && !self.is_empty() && self.npkts == super::requester::packets_for(self.len, mtu)
    }

    /// The payload bytes `offset..offset+len` if they lie in one piece.
    pub(crate) fn contiguous(&self, offset: u64, len: usize) -> Option<MappedPiece<'a>> {
        let mut skip = offset;
        for p in self.pieces {
            let plen = p.len() as u64;
            if skip < plen {
                return p.sub(usize::try_from(skip).ok()?, len);
            }
            skip -= plen;
        }
        None
    }

    /// Calls `f(piece)` for the payload bytes `offset..offset+len`, in
    /// order, one call per contiguous range; stops at the first error.
    /// Errors if the payload is shorter than `offset + len`.
    pub(crate) fn for_each_range(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(MappedPiece<'a>) -> Result<(), ()>,
    ) -> Result<(), ()> {
        let mut skip = offset;
        let mut left = len;
        for p in self.pieces {
            if left == 0 {
                break;
            }
            let plen = p.len() as u64;
            if skip >= plen {
                skip -= plen;
                continue;
            }
            let n = (plen - skip).min(left);
            f(p.sub(skip as usize, n as usize).ok_or(())?)?;
            left -= n;
            skip = 0;
        }
        if left == 0 {
            Ok(())
        } else {
            Err(())
        }
    }
}
