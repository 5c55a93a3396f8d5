//! The BTH opcode and the table that drives parsing and the protocol engine.
//!
//! Like rxe's `rxe_opcode[]`, one table says, for every opcode, which
//! transport and operation it belongs to, where it sits in a message, and
//! which extension headers follow the BTH. Parsing, emitting and the
//! protocol engine all read this table instead of testing opcodes one by
//! one. Opcode values are those of IBTA Vol. 1 §9.2 (transport in the top
//! three bits, operation in the low five); CNP (0x81) is from the RoCEv2
//! annex (A17).

use core::fmt;

use super::aeth::Aeth;
use super::bth::Bth;
use super::ext::{AtomicAckEth, AtomicEth, Deth, Ieth, ImmDt, Reth};

/// The transport service an opcode belongs to (top 3 bits of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (opcodes 0x00-0x1f).
    Rc,
    /// Unreliable connected (0x20-0x3f).
    Uc,
    /// Unreliable datagram (0x60-0x7f).
    Ud,
}

/// The operation a packet is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Send, with or without immediate data or invalidate.
    Send,
    /// RDMA write, with or without immediate data.
    Write,
    /// RDMA read request.
    ReadRequest,
    /// RDMA read response data.
    ReadResponse,
    /// Acknowledge (ACK, NAK or RNR NAK, told apart by the AETH syndrome).
    Ack,
    /// Acknowledge of an atomic, carrying the original value.
    AtomicAck,
    /// Atomic compare and swap request.
    CompareSwap,
    /// Atomic fetch and add request.
    FetchAdd,
}

impl OpKind {
    /// Which side sends packets of this kind.
    pub const fn direction(self) -> Direction {
        match self {
            OpKind::Send | OpKind::Write | OpKind::ReadRequest | OpKind::CompareSwap | OpKind::FetchAdd => {
                Direction::Request
            }
            OpKind::ReadResponse | OpKind::Ack | OpKind::AtomicAck => Direction::Response,
        }
    }

    /// Whether packets of this kind may carry payload after the headers.
    pub const fn has_payload(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Write | OpKind::ReadResponse)
    }
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet (acks and atomics are always Only).
    Only,
}

impl Position {
    /// Whether the packet starts a message (First or Only).
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Whether the packet ends a message (Last or Only).
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Which way a packet travels on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Requester to responder.
    Request,
    /// Responder to requester.
    Response,
}

/// The set of extension headers that follow the BTH, in wire order
/// (IBTA Vol. 1 §9.2: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt,
/// IETH; no RoCE opcode carries more than two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// Datagram ETH (UD): Q_Key and source QPN.
    pub deth: bool,
    /// RDMA ETH: virtual address, R_Key, DMA length.
    pub reth: bool,
    /// Atomic ETH: address, R_Key, swap/add and compare operands.
    pub atomic_eth: bool,
    /// ACK ETH: syndrome and MSN.
    pub aeth: bool,
    /// Atomic ACK ETH: the original remote value.
    pub atomic_ack_eth: bool,
    /// Immediate data.
    pub immdt: bool,
    /// Invalidate ETH: the R_Key to invalidate.
    pub ieth: bool,
}

impl ExtHeaders {
    /// No extension headers.
    pub const NONE: ExtHeaders = ExtHeaders {
        deth: false,
        reth: false,
        atomic_eth: false,
        aeth: false,
        atomic_ack_eth: false,
        immdt: false,
        ieth: false,
    };

    /// Total length in bytes of the headers in the set.
    pub const fn byte_len(&self) -> usize {
        let mut len = 0;
        if self.deth {
            len += Deth::LEN;
        }
        if self.reth {
            len += Reth::LEN;
        }
        if self.atomic_eth {
            len += AtomicEth::LEN;
        }
        if self.aeth {
            len += Aeth::LEN;
        }
        if self.atomic_ack_eth {
            len += AtomicAckEth::LEN;
        }
        if self.immdt {
            len += ImmDt::LEN;
        }
        if self.ieth {
            len += Ieth::LEN;
        }
        len
    }
}

/// Everything the opcode table says about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub kind: OpKind,
    /// Place in the message.
    pub position: Position,
    /// Request or response (follows from `kind`).
    pub direction: Direction,
    /// Extension headers between the BTH and the payload.
    pub headers: ExtHeaders,
    /// Whether payload may follow the headers (follows from `kind`).
    pub has_payload: bool,
}

impl OpcodeInfo {
    /// Length of BTH plus extension headers: the offset of the payload.
    pub const fn header_len(&self) -> usize {
        Bth::LEN + self.headers.byte_len()
    }

    /// Whether the packet travels requester to responder.
    pub const fn is_request(&self) -> bool {
        matches!(self.direction, Direction::Request)
    }
}

/// A BTH opcode. Values the implementation does not speak are kept as
/// [`Opcode::Unknown`] so that `u8 -> Opcode -> u8` is lossless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// 0x00: RC_SEND_FIRST.
    RcSendFirst,
    /// 0x01: RC_SEND_MIDDLE.
    RcSendMiddle,
    /// 0x02: RC_SEND_LAST.
    RcSendLast,
    /// 0x03: RC_SEND_LAST_WITH_IMMEDIATE.
    RcSendLastWithImmediate,
    /// 0x04: RC_SEND_ONLY.
    RcSendOnly,
    /// 0x05: RC_SEND_ONLY_WITH_IMMEDIATE.
    RcSendOnlyWithImmediate,
    /// 0x06: RC_RDMA_WRITE_FIRST.
    RcRdmaWriteFirst,
    /// 0x07: RC_RDMA_WRITE_MIDDLE.
    RcRdmaWriteMiddle,
    /// 0x08: RC_RDMA_WRITE_LAST.
    RcRdmaWriteLast,
    /// 0x09: RC_RDMA_WRITE_LAST_WITH_IMMEDIATE.
    RcRdmaWriteLastWithImmediate,
    /// 0x0a: RC_RDMA_WRITE_ONLY.
    RcRdmaWriteOnly,
    /// 0x0b: RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.
    RcRdmaWriteOnlyWithImmediate,
    /// 0x0c: RC_RDMA_READ_REQUEST.
    RcRdmaReadRequest,
    /// 0x0d: RC_RDMA_READ_RESPONSE_FIRST.
    RcRdmaReadResponseFirst,
    /// 0x0e: RC_RDMA_READ_RESPONSE_MIDDLE.
    RcRdmaReadResponseMiddle,
    /// 0x0f: RC_RDMA_READ_RESPONSE_LAST.
    RcRdmaReadResponseLast,
    /// 0x10: RC_RDMA_READ_RESPONSE_ONLY.
    RcRdmaReadResponseOnly,
    /// 0x11: RC_ACKNOWLEDGE.
    RcAcknowledge,
    /// 0x12: RC_ATOMIC_ACKNOWLEDGE.
    RcAtomicAcknowledge,
    /// 0x13: RC_COMPARE_SWAP.
    RcCompareSwap,
    /// 0x14: RC_FETCH_ADD.
    RcFetchAdd,
    /// 0x16: RC_SEND_LAST_WITH_INVALIDATE.
    RcSendLastWithInvalidate,
    /// 0x17: RC_SEND_ONLY_WITH_INVALIDATE.
    RcSendOnlyWithInvalidate,
    /// 0x20: UC_SEND_FIRST.
    UcSendFirst,
    /// 0x21: UC_SEND_MIDDLE.
    UcSendMiddle,
    /// 0x22: UC_SEND_LAST.
    UcSendLast,
    /// 0x23: UC_SEND_LAST_WITH_IMMEDIATE.
    UcSendLastWithImmediate,
    /// 0x24: UC_SEND_ONLY.
    UcSendOnly,
    /// 0x25: UC_SEND_ONLY_WITH_IMMEDIATE.
    UcSendOnlyWithImmediate,
    /// 0x26: UC_RDMA_WRITE_FIRST.
    UcRdmaWriteFirst,
    /// 0x27: UC_RDMA_WRITE_MIDDLE.
    UcRdmaWriteMiddle,
    /// 0x28: UC_RDMA_WRITE_LAST.
    UcRdmaWriteLast,
    /// 0x29: UC_RDMA_WRITE_LAST_WITH_IMMEDIATE.
    UcRdmaWriteLastWithImmediate,
    /// 0x2a: UC_RDMA_WRITE_ONLY.
    UcRdmaWriteOnly,
    /// 0x2b: UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.
    UcRdmaWriteOnlyWithImmediate,
    /// 0x64: UD_SEND_ONLY.
    UdSendOnly,
    /// 0x65: UD_SEND_ONLY_WITH_IMMEDIATE.
    UdSendOnlyWithImmediate,
    /// RoCEv2 congestion notification packet (0x81): recognised so it can be
    /// counted and dropped, but not a transport opcode (no table entry).
    Cnp,
    /// Any other value (RD, XRC, reserved, manufacturer specific).
    Unknown(u8),
}

// Shorthands for the table below.
const NONE: ExtHeaders = ExtHeaders::NONE;
const IMMDT: ExtHeaders = ExtHeaders { immdt: true, ..NONE };
const IETH: ExtHeaders = ExtHeaders { ieth: true, ..NONE };
const RETH: ExtHeaders = ExtHeaders { reth: true, ..NONE };
const RETH_IMMDT: ExtHeaders = ExtHeaders {
    reth: true,
    immdt: true,
    ..NONE
};
const AETH: ExtHeaders = ExtHeaders { aeth: true, ..NONE };
const AETH_ATOMIC_ACK: ExtHeaders = ExtHeaders {
    aeth: true,
    atomic_ack_eth: true,
    ..NONE
};
const ATOMIC_ETH: ExtHeaders = ExtHeaders {
    atomic_eth: true,
    ..NONE
};
const DETH: ExtHeaders = ExtHeaders { deth: true, ..NONE };
const DETH_IMMDT: ExtHeaders = ExtHeaders {
    deth: true,
    immdt: true,
    ..NONE
};

/// One table row; direction and payload follow from the kind.
const fn row(transport: Transport, kind: OpKind, position: Position, headers: ExtHeaders) -> OpcodeInfo {
    OpcodeInfo {
        transport,
        kind,
        position,
        direction: kind.direction(),
        headers,
        has_payload: kind.has_payload(),
    }
}

/// Raw value of the RoCEv2 CNP opcode.
const CNP_CODE: u8 = 0x81;

impl Opcode {
    /// Every transport opcode in the table (not [`Opcode::Cnp`], not
    /// `Unknown`), in numeric order.
    pub const ALL: [Opcode; 37] = [
        Opcode::RcSendFirst,
        Opcode::RcSendMiddle,
        Opcode::RcSendLast,
        Opcode::RcSendLastWithImmediate,
        Opcode::RcSendOnly,
        Opcode::RcSendOnlyWithImmediate,
        Opcode::RcRdmaWriteFirst,
        Opcode::RcRdmaWriteMiddle,
        Opcode::RcRdmaWriteLast,
        Opcode::RcRdmaWriteLastWithImmediate,
        Opcode::RcRdmaWriteOnly,
        Opcode::RcRdmaWriteOnlyWithImmediate,
        Opcode::RcRdmaReadRequest,
        Opcode::RcRdmaReadResponseFirst,
        Opcode::RcRdmaReadResponseMiddle,
        Opcode::RcRdmaReadResponseLast,
        Opcode::RcRdmaReadResponseOnly,
        Opcode::RcAcknowledge,
        Opcode::RcAtomicAcknowledge,
        Opcode::RcCompareSwap,
        Opcode::RcFetchAdd,
        Opcode::RcSendLastWithInvalidate,
        Opcode::RcSendOnlyWithInvalidate,
        Opcode::UcSendFirst,
        Opcode::UcSendMiddle,
        Opcode::UcSendLast,
        Opcode::UcSendLastWithImmediate,
        Opcode::UcSendOnly,
        Opcode::UcSendOnlyWithImmediate,
        Opcode::UcRdmaWriteFirst,
        Opcode::UcRdmaWriteMiddle,
        Opcode::UcRdmaWriteLast,
        Opcode::UcRdmaWriteLastWithImmediate,
        Opcode::UcRdmaWriteOnly,
        Opcode::UcRdmaWriteOnlyWithImmediate,
        Opcode::UdSendOnly,
        Opcode::UdSendOnlyWithImmediate,
    ];

    /// The opcode table entry; `None` for [`Opcode::Cnp`] and
    /// [`Opcode::Unknown`].
    #[inline]
    pub const fn info(self) -> Option<OpcodeInfo> {
        match self {
            Opcode::Cnp | Opcode::Unknown(_) => None,
            // One load from a table built at compile time from
            // `info_by_name`: parsing, emitting and the engine ask for
            // every packet, and the match cost ~25 instructions a call.
            known => INFO_BY_BYTE[known.to_byte() as usize],
        }
    }

    /// [`Opcode::info`] by matching on the name (builds [`INFO_BY_BYTE`]).
    const fn info_by_name(self) -> Option<OpcodeInfo> {
        use OpKind::*;
        use Position::*;
        use Transport::*;
        let info = match self {
            Opcode::RcSendFirst => row(Rc, Send, First, NONE),
            Opcode::RcSendMiddle => row(Rc, Send, Middle, NONE),
            Opcode::RcSendLast => row(Rc, Send, Last, NONE),
            Opcode::RcSendLastWithImmediate => row(Rc, Send, Last, IMMDT),
            Opcode::RcSendOnly => row(Rc, Send, Only, NONE),
            Opcode::RcSendOnlyWithImmediate => row(Rc, Send, Only, IMMDT),
            Opcode::RcRdmaWriteFirst => row(Rc, Write, First, RETH),
            Opcode::RcRdmaWriteMiddle => row(Rc, Write, Middle, NONE),
            Opcode::RcRdmaWriteLast => row(Rc, Write, Last, NONE),
            Opcode::RcRdmaWriteLastWithImmediate => row(Rc, Write, Last, IMMDT),
            Opcode::RcRdmaWriteOnly => row(Rc, Write, Only, RETH),
            Opcode::RcRdmaWriteOnlyWithImmediate => row(Rc, Write, Only, RETH_IMMDT),
            Opcode::RcRdmaReadRequest => row(Rc, ReadRequest, Only, RETH),
            // Read response Middle packets carry no AETH; First, Last and Only
            // do (IBTA Vol. 1 §9.2, OpCode field table).
            Opcode::RcRdmaReadResponseFirst => row(Rc, ReadResponse, First, AETH),
            Opcode::RcRdmaReadResponseMiddle => row(Rc, ReadResponse, Middle, NONE),
            Opcode::RcRdmaReadResponseLast => row(Rc, ReadResponse, Last, AETH),
            Opcode::RcRdmaReadResponseOnly => row(Rc, ReadResponse, Only, AETH),
            Opcode::RcAcknowledge => row(Rc, Ack, Only, AETH),
            Opcode::RcAtomicAcknowledge => row(Rc, AtomicAck, Only, AETH_ATOMIC_ACK),
            Opcode::RcCompareSwap => row(Rc, CompareSwap, Only, ATOMIC_ETH),
            Opcode::RcFetchAdd => row(Rc, FetchAdd, Only, ATOMIC_ETH),
            Opcode::RcSendLastWithInvalidate => row(Rc, Send, Last, IETH),
            Opcode::RcSendOnlyWithInvalidate => row(Rc, Send, Only, IETH),
            Opcode::UcSendFirst => row(Uc, Send, First, NONE),
            Opcode::UcSendMiddle => row(Uc, Send, Middle, NONE),
            Opcode::UcSendLast => row(Uc, Send, Last, NONE),
            Opcode::UcSendLastWithImmediate => row(Uc, Send, Last, IMMDT),
            Opcode::UcSendOnly => row(Uc, Send, Only, NONE),
            Opcode::UcSendOnlyWithImmediate => row(Uc, Send, Only, IMMDT),
            Opcode::UcRdmaWriteFirst => row(Uc, Write, First, RETH),
            Opcode::UcRdmaWriteMiddle => row(Uc, Write, Middle, NONE),
            Opcode::UcRdmaWriteLast => row(Uc, Write, Last, NONE),
            Opcode::UcRdmaWriteLastWithImmediate => row(Uc, Write, Last, IMMDT),
            Opcode::UcRdmaWriteOnly => row(Uc, Write, Only, RETH),
            Opcode::UcRdmaWriteOnlyWithImmediate => row(Uc, Write, Only, RETH_IMMDT),
            Opcode::UdSendOnly => row(Ud, Send, Only, DETH),
            Opcode::UdSendOnlyWithImmediate => row(Ud, Send, Only, DETH_IMMDT),
            Opcode::Cnp | Opcode::Unknown(_) => return None,
        };
        Some(info)
    }

    /// BTH plus extension headers for this opcode; `None` where
    /// [`Opcode::info`] is `None`.
    pub const fn header_len(self) -> Option<usize> {
        match self.info() {
            Some(info) => Some(info.header_len()),
            None => None,
        }
    }

    /// Finds the opcode for a packet the requester or responder is about to
    /// build, e.g. `(Rc, Send, Last, immediate, no invalidate)` gives
    /// [`Opcode::RcSendLastWithImmediate`]. `None` if no such opcode exists
    /// (immediate on a read, invalidate on UC, anything but Only on UD, ...).
    pub fn find(
        transport: Transport,
        kind: OpKind,
        position: Position,
        with_immediate: bool,
        with_invalidate: bool,
    ) -> Option<Opcode> {
        // One load from a table built at compile time from the opcode
        // table itself (the requester asks for every packet; matching on
        // the combination and confirming it cost ~75 instructions).
        match FIND[find_index(transport, kind, position, with_immediate, with_invalidate)] {
            NO_OPCODE => None,
            b => Some(Opcode::from_byte(b)),
        }
    }

    /// The IBTA name, e.g. `"RC_SEND_FIRST"`; `"UNKNOWN"` for unknown values.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::RcSendFirst => "RC_SEND_FIRST",
            Opcode::RcSendMiddle => "RC_SEND_MIDDLE",
            Opcode::RcSendLast => "RC_SEND_LAST",
            Opcode::RcSendLastWithImmediate => "RC_SEND_LAST_WITH_IMMEDIATE",
            Opcode::RcSendOnly => "RC_SEND_ONLY",
            Opcode::RcSendOnlyWithImmediate => "RC_SEND_ONLY_WITH_IMMEDIATE",
            Opcode::RcRdmaWriteFirst => "RC_RDMA_WRITE_FIRST",
            Opcode::RcRdmaWriteMiddle => "RC_RDMA_WRITE_MIDDLE",
            Opcode::RcRdmaWriteLast => "RC_RDMA_WRITE_LAST",
            Opcode::RcRdmaWriteLastWithImmediate => "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Opcode::RcRdmaWriteOnly => "RC_RDMA_WRITE_ONLY",
            Opcode::RcRdmaWriteOnlyWithImmediate => "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Opcode::RcRdmaReadRequest => "RC_RDMA_READ_REQUEST",
            Opcode::RcRdmaReadResponseFirst => "RC_RDMA_READ_RESPONSE_FIRST",
            Opcode::RcRdmaReadResponseMiddle => "RC_RDMA_READ_RESPONSE_MIDDLE",
            Opcode::RcRdmaReadResponseLast => "RC_RDMA_READ_RESPONSE_LAST",
            Opcode::RcRdmaReadResponseOnly => "RC_RDMA_READ_RESPONSE_ONLY",
            Opcode::RcAcknowledge => "RC_ACKNOWLEDGE",
            Opcode::RcAtomicAcknowledge => "RC_ATOMIC_ACKNOWLEDGE",
            Opcode::RcCompareSwap => "RC_COMPARE_SWAP",
            Opcode::RcFetchAdd => "RC_FETCH_ADD",
            Opcode::RcSendLastWithInvalidate => "RC_SEND_LAST_WITH_INVALIDATE",
            Opcode::RcSendOnlyWithInvalidate => "RC_SEND_ONLY_WITH_INVALIDATE",
            Opcode::UcSendFirst => "UC_SEND_FIRST",
            Opcode::UcSendMiddle => "UC_SEND_MIDDLE",
            Opcode::UcSendLast => "UC_SEND_LAST",
            Opcode::UcSendLastWithImmediate => "UC_SEND_LAST_WITH_IMMEDIATE",
            Opcode::UcSendOnly => "UC_SEND_ONLY",
            Opcode::UcSendOnlyWithImmediate => "UC_SEND_ONLY_WITH_IMMEDIATE",
            Opcode::UcRdmaWriteFirst => "UC_RDMA_WRITE_FIRST",
            Opcode::UcRdmaWriteMiddle => "UC_RDMA_WRITE_MIDDLE",
            Opcode::UcRdmaWriteLast => "UC_RDMA_WRITE_LAST",
            Opcode::UcRdmaWriteLastWithImmediate => "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Opcode::UcRdmaWriteOnly => "UC_RDMA_WRITE_ONLY",
            Opcode::UcRdmaWriteOnlyWithImmediate => "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Opcode::UdSendOnly => "UD_SEND_ONLY",
            Opcode::UdSendOnlyWithImmediate => "UD_SEND_ONLY_WITH_IMMEDIATE",
            Opcode::Cnp => "CNP",
            Opcode::Unknown(_) => "UNKNOWN",
        }
    }
}

/// Index of a combination in [`FIND`].
const fn find_index(transport: Transport, kind: OpKind, position: Position, imm: bool, inv: bool) -> usize {
    ((((transport as usize * 8 + kind as usize) * 4 + position as usize) * 2 + imm as usize) * 2) + inv as usize
}

/// [`FIND`]'s mark for a combination no opcode has (0xff is no opcode's
/// byte: CNP is 0x81, and the rest of 0x80..=0xff is reserved).
const NO_OPCODE: u8 = 0xff;

/// [`Opcode::find`]: the opcode byte of every (transport, kind, position,
/// immediate, invalidate), built from [`INFO_BY_BYTE`].
const FIND: [u8; 3 * 8 * 4 * 2 * 2] = {
    let mut t = [NO_OPCODE; 3 * 8 * 4 * 2 * 2];
    let mut b = 0;
    while b < 256 {
        if let Some(i) = INFO_BY_BYTE[b] {
            t[find_index(i.transport, i.kind, i.position, i.headers.immdt, i.headers.ieth)] = b as u8;
        }
        b += 1;
    }
    t
};

/// [`Opcode::info`] of every opcode byte.
const INFO_BY_BYTE: [Option<OpcodeInfo>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = Opcode::from_byte(i as u8).info_by_name();
        i += 1;
    }
    t
};

impl From<u8> for Opcode {
    #[inline]
    fn from(code: u8) -> Opcode {
        Opcode::from_byte(code)
    }
}

impl Opcode {
    const fn from_byte(code: u8) -> Opcode {
        match code {
            0x00 => Opcode::RcSendFirst,
            0x01 => Opcode::RcSendMiddle,
            0x02 => Opcode::RcSendLast,
            0x03 => Opcode::RcSendLastWithImmediate,
            0x04 => Opcode::RcSendOnly,
            0x05 => Opcode::RcSendOnlyWithImmediate,
            0x06 => Opcode::RcRdmaWriteFirst,
            0x07 => Opcode::RcRdmaWriteMiddle,
            0x08 => Opcode::RcRdmaWriteLast,
            0x09 => Opcode::RcRdmaWriteLastWithImmediate,
            0x0a => Opcode::RcRdmaWriteOnly,
            0x0b => Opcode::RcRdmaWriteOnlyWithImmediate,
            0x0c => Opcode::RcRdmaReadRequest,
            0x0d => Opcode::RcRdmaReadResponseFirst,
            0x0e => Opcode::RcRdmaReadResponseMiddle,
            0x0f => Opcode::RcRdmaReadResponseLast,
            0x10 => Opcode::RcRdmaReadResponseOnly,
            0x11 => Opcode::RcAcknowledge,
            0x12 => Opcode::RcAtomicAcknowledge,
            0x13 => Opcode::RcCompareSwap,
            0x14 => Opcode::RcFetchAdd,
            // 0x15 is reserved.
            0x16 => Opcode::RcSendLastWithInvalidate,
            0x17 => Opcode::RcSendOnlyWithInvalidate,
            0x20 => Opcode::UcSendFirst,
            0x21 => Opcode::UcSendMiddle,
            0x22 => Opcode::UcSendLast,
            0x23 => Opcode::UcSendLastWithImmediate,
            0x24 => Opcode::UcSendOnly,
            0x25 => Opcode::UcSendOnlyWithImmediate,
            0x26 => Opcode::UcRdmaWriteFirst,
            0x27 => Opcode::UcRdmaWriteMiddle,
            0x28 => Opcode::UcRdmaWriteLast,
            0x29 => Opcode::UcRdmaWriteLastWithImmediate,
            0x2a => Opcode::UcRdmaWriteOnly,
            0x2b => Opcode::UcRdmaWriteOnlyWithImmediate,
            0x64 => Opcode::UdSendOnly,
            0x65 => Opcode::UdSendOnlyWithImmediate,
            CNP_CODE => Opcode::Cnp,
            other => Opcode::Unknown(other),
        }
    }
}

impl From<Opcode> for u8 {
    #[inline]
    fn from(opcode: Opcode) -> u8 {
        opcode.to_byte()
    }
}

impl Opcode {
    const fn to_byte(self) -> u8 {
        match self {
            Opcode::RcSendFirst => 0x00,
            Opcode::RcSendMiddle => 0x01,
            Opcode::RcSendLast => 0x02,
            Opcode::RcSendLastWithImmediate => 0x03,
            Opcode::RcSendOnly => 0x04,
            Opcode::RcSendOnlyWithImmediate => 0x05,
            Opcode::RcRdmaWriteFirst => 0x06,
            Opcode::RcRdmaWriteMiddle => 0x07,
            Opcode::RcRdmaWriteLast => 0x08,
            Opcode::RcRdmaWriteLastWithImmediate => 0x09,
            Opcode::RcRdmaWriteOnly => 0x0a,
            Opcode::RcRdmaWriteOnlyWithImmediate => 0x0b,
            Opcode::RcRdmaReadRequest => 0x0c,
            Opcode::RcRdmaReadResponseFirst => 0x0d,
            Opcode::RcRdmaReadResponseMiddle => 0x0e,
            Opcode::RcRdmaReadResponseLast => 0x0f,
            Opcode::RcRdmaReadResponseOnly => 0x10,
            Opcode::RcAcknowledge => 0x11,
            Opcode::RcAtomicAcknowledge => 0x12,
            Opcode::RcCompareSwap => 0x13,
            Opcode::RcFetchAdd => 0x14,
            Opcode::RcSendLastWithInvalidate => 0x16,
            Opcode::RcSendOnlyWithInvalidate => 0x17,
            Opcode::UcSendFirst => 0x20,
            Opcode::UcSendMiddle => 0x21,
            Opcode::UcSendLast => 0x22,
            Opcode::UcSendLastWithImmediate => 0x23,
            Opcode::UcSendOnly => 0x24,
            Opcode::UcSendOnlyWithImmediate => 0x25,
            Opcode::UcRdmaWriteFirst => 0x26,
            Opcode::UcRdmaWriteMiddle => 0x27,
            Opcode::UcRdmaWriteLast => 0x28,
            Opcode::UcRdmaWriteLastWithImmediate => 0x29,
            Opcode::UcRdmaWriteOnly => 0x2a,
            Opcode::UcRdmaWriteOnlyWithImmediate => 0x2b,
            Opcode::UdSendOnly => 0x64,
            Opcode::UdSendOnlyWithImmediate => 0x65,
            Opcode::Cnp => CNP_CODE,
            Opcode::Unknown(code) => code,
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(code) => write!(f, "UNKNOWN({code:#04x})"),
            known => f.write_str(known.name()),
        }
    }
}
