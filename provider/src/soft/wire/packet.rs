//! Whole RoCEv2 transport packets: what one UDP datagram to port 4791
//! carries.
//!
//! ```text
//!  BTH | extension headers (per opcode) | payload | pad (0-3) | ICRC (4)
//! ```
//!
//! [`Packet::parse`] validates an untrusted datagram against the opcode
//! table and returns the decoded headers and a borrowed payload;
//! [`PacketRepr::emit`] writes one. The ICRC depends on the IP and UDP
//! headers around the packet and lives in [`super::icrc`]: `emit` leaves it
//! zero, [`super::fill_icrc`] fills it.

use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, Bth, BthRepr, DethRepr, ExtHeaders, IethRepr, ImmDtRepr, Opcode,
    OpcodeInfo, RethRepr, WireError,
};

/// Length of the invariant CRC that ends every packet.
pub const ICRC_LEN: usize = 4;

/// The smallest possible packet: a BTH and the ICRC.
pub const MIN_PACKET_LEN: usize = Bth::LEN + ICRC_LEN;

/// Pad bytes after a payload of `payload_len` bytes so that payload plus
/// pad is a multiple of 4 (IBTA Vol. 1 §9.2, PadCnt).
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// The headers of one packet: a BTH and the extension headers its opcode
/// carries, each `Some` exactly when the opcode table lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// Datagram ETH (UD).
    pub deth: Option<DethRepr>,
    /// RDMA ETH (write first/only, read request).
    pub reth: Option<RethRepr>,
    /// Atomic ETH (compare-swap, fetch-add).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// ACK ETH (acks, read response first/last/only).
    pub aeth: Option<AethRepr>,
    /// Atomic ACK ETH (atomic acknowledge).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data (`..._WITH_IMMEDIATE`).
    pub immdt: Option<ImmDtRepr>,
    /// Invalidate ETH (`..._WITH_INVALIDATE`).
    pub ieth: Option<IethRepr>,
}

impl PacketRepr {
    /// Headers with only a BTH; set the extension headers the opcode needs.
    pub const fn new(bth: BthRepr) -> PacketRepr {
        PacketRepr {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
        }
    }

    /// The opcode table entry of the BTH opcode.
    pub const fn info(&self) -> Option<OpcodeInfo> {
        self.bth.opcode.info()
    }

    /// Which extension headers are present.
    pub const fn present_headers(&self) -> ExtHeaders {
        ExtHeaders {
            deth: self.deth.is_some(),
            reth: self.reth.is_some(),
            atomic_eth: self.atomic_eth.is_some(),
            aeth: self.aeth.is_some(),
            atomic_ack_eth: self.atomic_ack_eth.is_some(),
            immdt: self.immdt.is_some(),
            ieth: self.ieth.is_some(),
        }
    }

    /// BTH plus the extension headers present: the payload offset.
    pub const fn header_len(&self) -> usize {
        Bth::LEN + self.present_headers().byte_len()
    }

    /// Bytes the packet takes with a payload of `payload_len` bytes:
    /// headers, payload, pad and ICRC (saturating at `usize::MAX`, which no
    /// buffer can hold).
    pub const fn packet_len(&self, payload_len: usize) -> usize {
        self.header_len()
            .saturating_add(payload_len)
            .saturating_add(pad_len(payload_len))
            .saturating_add(ICRC_LEN)
    }

    /// Writes headers, `payload`, zero pad and a zero ICRC to the start of
    /// `buf` and returns the packet length. The BTH pad count is set from
    /// the payload length, whatever `self.bth.pad_count` says. Fill the ICRC
    /// afterwards with [`super::fill_icrc`].
    ///
    /// # Errors
    ///
    /// - [`WireError::UnknownOpcode`] / [`WireError::CongestionNotification`]
    ///   if the opcode has no table entry;
    /// - [`WireError::HeaderMismatch`] if the extension headers present are
    ///   not exactly those the opcode carries;
    /// - [`WireError::UnexpectedPayload`] for a non-empty payload on an
    ///   opcode without payload;
    /// - [`WireError::BufferTooSmall`] if `buf` is shorter than
    ///   [`PacketRepr::packet_len`].
    ///
    /// Nothing is written when an error is returned.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.packet_len(payload.len());
        let packet = buf.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        let header_len = self.emit_headers(payload.len(), packet)?;
        let mut cursor = Cursor::new(packet.get_mut(header_len..).ok_or(WireError::BufferTooSmall)?);
        cursor.take(payload.len())?.copy_from_slice(payload);
        cursor.take(pad_len(payload.len()) + ICRC_LEN)?.fill(0);
        Ok(len)
    }

    /// Writes only the headers, for a payload of `payload_len` bytes that
    /// the caller places right after them (so a payload gathered from
    /// memory is copied once), and returns the header length. The BTH pad
    /// count is set from `payload_len`; the caller appends payload, then
    /// [`pad_len`]`(payload_len)` zero bytes and the ICRC.
    ///
    /// # Errors
    ///
    /// As [`PacketRepr::emit`], with `BufferTooSmall` if `buf` cannot hold
    /// the headers.
    pub fn emit_headers(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize, WireError> {
        let info = table_entry(self.bth.opcode)?;
        if self.present_headers() != info.headers {
            return Err(WireError::HeaderMismatch);
        }
        if !info.has_payload && payload_len != 0 {
            return Err(WireError::UnexpectedPayload);
        }
        let header_len = self.header_len();
        let headers = buf.get_mut(..header_len).ok_or(WireError::BufferTooSmall)?;
        let pad = pad_len(payload_len);
        let mut bth = self.bth;
        // `pad` < 4, so the narrowing cannot lose bits.
        bth.pad_count = (pad & 3) as u8;
        let mut cursor = Cursor::new(headers);
        bth.emit(cursor.take(BthRepr::LEN)?)?;
        // Canonical wire order (IBTA Vol. 1 §9.2): DETH, RETH, AtomicETH,
        // AETH, AtomicAckETH, ImmDt, IETH.
        if let Some(deth) = &self.deth {
            deth.emit(cursor.take(DethRepr::LEN)?)?;
        }
        if let Some(reth) = &self.reth {
            reth.emit(cursor.take(RethRepr::LEN)?)?;
        }
        if let Some(atomic_eth) = &self.atomic_eth {
            atomic_eth.emit(cursor.take(AtomicEthRepr::LEN)?)?;
        }
        if let Some(aeth) = &self.aeth {
            aeth.emit(cursor.take(AethRepr::LEN)?)?;
        }
        if let Some(atomic_ack_eth) = &self.atomic_ack_eth {
            atomic_ack_eth.emit(cursor.take(AtomicAckEthRepr::LEN)?)?;
        }
        if let Some(immdt) = &self.immdt {
            immdt.emit(cursor.take(ImmDtRepr::LEN)?)?;
        }
        if let Some(ieth) = &self.ieth {
            ieth.emit(cursor.take(IethRepr::LEN)?)?;
        }
        Ok(header_len)
    }
}

/// The headers of a SEND or RDMA WRITE request packet (BTH, then the DETH,
/// RETH, ImmDt and IETH given, in wire order), written straight into a
/// small array: the requester's emitter for every data packet, where the
/// general [`PacketRepr::emit_headers`] (a struct of seven optional
/// headers, validated against the opcode table and measured three times)
/// cost ~250 instructions a packet. The caller chooses headers that match
/// the opcode, as [`Opcode::find`] gives it for the same message position;
/// the tests check every such combination against `PacketRepr`, byte for
/// byte.
#[derive(Debug, Clone, Copy)]
pub struct MessageHeaders {
    bytes: [u8; MessageHeaders::MAX_LEN],
    len: usize,
}

impl MessageHeaders {
    /// The longest combination: BTH, DETH, RETH and ImmDt.
    pub const MAX_LEN: usize = BthRepr::LEN + DethRepr::LEN + RethRepr::LEN + ImmDtRepr::LEN;

    /// Writes `bth` (its pad count set from `payload_len`, as
    /// [`PacketRepr::emit_headers`] does) and the extension headers given.
    /// An IETH and an ImmDt never go together (no opcode has both): given
    /// both, the IETH is dropped.
    pub fn new(
        bth: &BthRepr,
        payload_len: usize,
        deth: Option<&DethRepr>,
        reth: Option<&RethRepr>,
        immdt: Option<ImmDtRepr>,
        ieth: Option<IethRepr>,
    ) -> MessageHeaders {
        let mut h = MessageHeaders {
            bytes: [0; MessageHeaders::MAX_LEN],
            len: BthRepr::LEN,
        };
        let mut bth = *bth;
        // `pad_len` < 4: the narrowing cannot lose bits.
        bth.pad_count = (pad_len(payload_len) & 3) as u8;
        // Every write below stays inside `bytes`: MAX_LEN is the sum of
        // the longest combination, and IETH (4 bytes) only replaces ImmDt.
        let _ = bth.emit(&mut h.bytes[..BthRepr::LEN]);
        if let Some(d) = deth {
            let _ = d.emit(&mut h.bytes[h.len..h.len + DethRepr::LEN]);
            h.len += DethRepr::LEN;
        }
        if let Some(r) = reth {
            let _ = r.emit(&mut h.bytes[h.len..h.len + RethRepr::LEN]);
            h.len += RethRepr::LEN;
        }
        if let Some(i) = immdt {
            let _ = i.emit(&mut h.bytes[h.len..h.len + ImmDtRepr::LEN]);
            h.len += ImmDtRepr::LEN;
        } else if let Some(i) = ieth {
            let _ = i.emit(&mut h.bytes[h.len..h.len + IethRepr::LEN]);
            h.len += IethRepr::LEN;
        }
        h
    }

    /// The header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Sets the soft capability bit of the BTH ([`super::set_soft_cap`]).
    pub fn set_soft_cap(&mut self) {
        super::set_soft_cap(&mut self.bytes[..self.len]);
    }
}

/// Hands out consecutive sub-slices of an output buffer.
struct Cursor<'a> {
    rest: &'a mut [u8],
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a mut [u8]) -> Cursor<'a> {
        Cursor { rest: buf }
    }

    fn take(&mut self, len: usize) -> Result<&'a mut [u8], WireError> {
        let rest = core::mem::take(&mut self.rest);
        let (head, tail) = rest.split_at_mut_checked(len).ok_or(WireError::BufferTooSmall)?;
        self.rest = tail;
        Ok(head)
    }
}

/// The table entry of an opcode, or why there is none.
fn table_entry(opcode: Opcode) -> Result<OpcodeInfo, WireError> {
    match opcode {
        Opcode::Cnp => Err(WireError::CongestionNotification),
        other => other.info().ok_or_else(|| WireError::UnknownOpcode(u8::from(other))),
    }
}

/// A packet that passed [`Packet::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    /// The decoded headers; `headers.bth.pad_count` is the received pad.
    pub headers: PacketRepr,
    /// The opcode table entry (saves the caller a second lookup).
    pub info: OpcodeInfo,
    /// The payload, without pad and ICRC. Empty for opcodes without payload.
    pub payload: &'a [u8],
    /// The received ICRC, read little-endian from the last four bytes (the
    /// byte order rxe and ConnectX NICs write), so that it compares equal to
    /// [`super::compute_icrc`]. Not checked here: checking needs the IP and
    /// UDP headers, see [`super::check_icrc`].
    pub icrc: u32,
}

/// Whole-packet operations; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Packet;

impl Packet {
    /// Parses and validates an untrusted RoCEv2 packet (a UDP payload).
    ///
    /// Never panics, whatever `buf` holds. Checks, in order: at least BTH
    /// plus ICRC; TVer 0; a known opcode (CNP is reported separately); a
    /// length that is a multiple of 4; room for the extension headers the
    /// opcode carries; no payload bytes on opcodes without payload; a pad
    /// count that fits. Reserved bits and pad contents are ignored.
    ///
    /// # Errors
    ///
    /// The [`WireError`] of the first check that fails.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<ParsedPacket<'_>, WireError> {
        if buf.len() < MIN_PACKET_LEN {
            return Err(WireError::Truncated);
        }
        let bth = BthRepr::parse(buf)?;
        let info = table_entry(bth.opcode)?;
        if !buf.len().is_multiple_of(4) {
            return Err(WireError::BadLength);
        }
        let body_len = buf.len() - ICRC_LEN;
        let (body, icrc_bytes) = buf.split_at_checked(body_len).ok_or(WireError::Truncated)?;
        let icrc_bytes: [u8; ICRC_LEN] = icrc_bytes.try_into().map_err(|_| WireError::Truncated)?;

        let mut headers = PacketRepr::new(bth);
        let mut rest = body.get(BthRepr::LEN..).ok_or(WireError::Truncated)?;
        let want = info.headers;
        if want.deth {
            headers.deth = Some(DethRepr::parse(rest)?);
            rest = advance(rest, DethRepr::LEN)?;
        }
        if want.reth {
            headers.reth = Some(RethRepr::parse(rest)?);
            rest = advance(rest, RethRepr::LEN)?;
        }
        if want.atomic_eth {
            headers.atomic_eth = Some(AtomicEthRepr::parse(rest)?);
            rest = advance(rest, AtomicEthRepr::LEN)?;
        }
        if want.aeth {
            headers.aeth = Some(AethRepr::parse(rest)?);
            rest = advance(rest, AethRepr::LEN)?;
        }
        if want.atomic_ack_eth {
            headers.atomic_ack_eth = Some(AtomicAckEthRepr::parse(rest)?);
            rest = advance(rest, AtomicAckEthRepr::LEN)?;
        }
        if want.immdt {
            headers.immdt = Some(ImmDtRepr::parse(rest)?);
            rest = advance(rest, ImmDtRepr::LEN)?;
        }
        if want.ieth {
            headers.ieth = Some(IethRepr::parse(rest)?);
            rest = advance(rest, IethRepr::LEN)?;
        }

        // `rest` is payload plus pad.
        if !info.has_payload && !rest.is_empty() {
            return Err(WireError::UnexpectedPayload);
        }
        let payload_len = rest
            .len()
            .checked_sub(usize::from(bth.pad_count))
            .ok_or(WireError::BadPad)?;
        let payload = rest.get(..payload_len).ok_or(WireError::BadPad)?;

        Ok(ParsedPacket {
            headers,
            info,
            payload,
            icrc: u32::from_le_bytes(icrc_bytes),
        })
    }
}

/// `buf` without its first `len` bytes.
fn advance(buf: &[u8], len: usize) -> Result<&[u8], WireError> {
    buf.get(len..).ok_or(WireError::Truncated)
}
