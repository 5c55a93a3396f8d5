//! Extensions between soft devices: the capability bit and the selective
//! acknowledgement (docs/design.md §10).
//!
//! **Capability bit.** A soft device that does selective repeat sets bit 6
//! of BTH byte 8 (the most significant bit of the 7-bit field `resv7`,
//! right after AckReq) in the packets it sends on a connection. IBTA
//! receivers ignore reserved fields, and the ICRC covers the bit like any
//! other invariant one, so a standard peer (rxe, a NIC) sees an ordinary
//! packet and answers as usual, without the bit. A soft device latches the
//! peer's capability per QP from the bit.
//!
//! **Selective acknowledgement (SACK).** Only to a peer that set the bit,
//! a responder's sequence NAK (RC ACKNOWLEDGE, AETH syndrome NAK
//! PSN-sequence-error, BTH PSN = the expected PSN, exactly the standard
//! packet) carries a payload that lists the PSN ranges the responder holds
//! beyond the gap:
//!
//! ```text
//!  0..2   magic 0x5352 ("SR")
//!  2      version (1)
//!  3      count of ranges (1..=8)
//!  4..    count × { first PSN (u32, 24 bits used), packets (u32) }
//! ```
//!
//! all big-endian, a multiple of 4 bytes so the pad count stays 0. The
//! packet is BTH + AETH + this + ICRC: tshark decodes it as an RC
//! Acknowledge (NAK, PSN sequence error) without a malformed-packet
//! warning, and does not show the extension. rxe and NICs never receive
//! one.

use super::{Psn, WireError, PSN_MASK};

/// The BTH byte that holds the capability bit (AckReq and `resv7`).
pub const SOFT_CAP_BYTE: usize = 8;
/// The capability bit in [`SOFT_CAP_BYTE`].
pub const SOFT_CAP_BIT: u8 = 0x40;

/// Whether the packet (BTH first) carries the soft capability bit.
pub fn has_soft_cap(packet: &[u8]) -> bool {
    packet.get(SOFT_CAP_BYTE).is_some_and(|b| b & SOFT_CAP_BIT != 0)
}

/// Sets the soft capability bit in a packet (BTH first), before its ICRC
/// is computed.
pub fn set_soft_cap(packet: &mut [u8]) {
    if let Some(b) = packet.get_mut(SOFT_CAP_BYTE) {
        *b |= SOFT_CAP_BIT;
    }
}

/// Magic number that opens a SACK extension.
pub const SACK_MAGIC: u16 = 0x5352;
/// Version of the SACK extension.
pub const SACK_VERSION: u8 = 1;
/// Most ranges one SACK carries.
pub const SACK_MAX_RANGES: usize = 8;

/// A range of PSNs held by the responder: `first` and the `npkts - 1`
/// after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SackRange {
    /// First PSN held.
    pub first: Psn,
    /// Number of consecutive PSNs held (at least 1).
    pub npkts: u32,
}

impl SackRange {
    /// The PSN after the range.
    pub fn end(&self) -> Psn {
        self.first.wrapping_add(self.npkts)
    }
}

/// The ranges of a SACK extension, in PSN order after the NAK's PSN.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sack {
    /// The ranges (at most [`SACK_MAX_RANGES`]).
    pub ranges: Vec<SackRange>,
}

impl Sack {
    /// Bytes the extension takes.
    pub fn len(&self) -> usize {
        4 + 8 * self.ranges.len()
    }

    /// Whether it lists no range.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Appends the extension to `out`.
    ///
    /// # Errors
    ///
    /// [`WireError::BadLength`] for no range, more than
    /// [`SACK_MAX_RANGES`], or a range of 0 packets or more than a PSN
    /// space's half.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        if self.ranges.is_empty()
            || self.ranges.len() > SACK_MAX_RANGES
            || self.ranges.iter().any(|r| r.npkts == 0 || r.npkts > PSN_MASK / 2)
        {
            return Err(WireError::BadLength);
        }
        out.extend_from_slice(&SACK_MAGIC.to_be_bytes());
        out.push(SACK_VERSION);
        out.push(self.ranges.len() as u8);
        for r in &self.ranges {
            out.extend_from_slice(&r.first.value().to_be_bytes());
            out.extend_from_slice(&r.npkts.to_be_bytes());
        }
        Ok(())
    }

    /// Parses the extension from `buf` (exactly its bytes).
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] or [`WireError::BadLength`] for a size
    /// that does not match the count, [`WireError::BadExtension`] for a bad
    /// magic, version, count, PSN or range length.
    pub fn parse(buf: &[u8]) -> Result<Sack, WireError> {
        let head = buf.get(..4).ok_or(WireError::Truncated)?;
        if u16::from_be_bytes([head[0], head[1]]) != SACK_MAGIC || head[2] != SACK_VERSION {
            return Err(WireError::BadExtension);
        }
        let count = head[3] as usize;
        if count == 0 || count > SACK_MAX_RANGES {
            return Err(WireError::BadExtension);
        }
        if buf.len() != 4 + 8 * count {
            return Err(WireError::BadLength);
        }
        let mut ranges = Vec::with_capacity(count);
        for c in buf[4..].chunks_exact(8) {
            let first = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
            let npkts = u32::from_be_bytes([c[4], c[5], c[6], c[7]]);
            if first > PSN_MASK || npkts == 0 || npkts > PSN_MASK / 2 {
                return Err(WireError::BadExtension);
            }
            ranges.push(SackRange {
                first: Psn::new(first),
                npkts,
            });
        }
        Ok(Sack { ranges })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sack_round_trips_and_rejects_garbage() {
        let s = Sack {
            ranges: vec![
                SackRange {
                    first: Psn::new(PSN_MASK - 1),
                    npkts: 3,
                },
                SackRange {
                    first: Psn::new(7),
                    npkts: 1,
                },
            ],
        };
        let mut b = Vec::new();
        s.emit(&mut b).unwrap();
        assert_eq!(b.len(), s.len());
        assert_eq!(b.len() % 4, 0);
        assert_eq!(Sack::parse(&b).unwrap(), s);
        assert_eq!(s.ranges[0].end(), Psn::new(1));
        // Every truncation and a wrong magic, version, count or range fail.
        for n in 0..b.len() {
            assert!(Sack::parse(&b[..n]).is_err(), "truncated at {n}");
        }
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(Sack::parse(&bad), Err(WireError::BadExtension));
        let mut bad = b.clone();
        bad[2] = 2;
        assert_eq!(Sack::parse(&bad), Err(WireError::BadExtension));
        let mut bad = b.clone();
        bad[3] = 0;
        assert_eq!(Sack::parse(&bad), Err(WireError::BadExtension));
        let mut bad = b.clone();
        bad[11] = 0; // npkts of the first range: 0
        assert_eq!(Sack::parse(&bad), Err(WireError::BadExtension));
        let mut bad = b.clone();
        bad[4] = 1; // PSN beyond 24 bits
        assert_eq!(Sack::parse(&bad), Err(WireError::BadExtension));
        assert!(Sack::default().emit(&mut Vec::new()).is_err());
    }

    #[test]
    fn capability_bit_is_a_reserved_bth_bit() {
        let mut p = [0u8; 12];
        p[8] = 0x80; // AckReq
        assert!(!has_soft_cap(&p));
        set_soft_cap(&mut p);
        assert!(has_soft_cap(&p));
        assert_eq!(p[8], 0xc0);
        // The standard parse ignores it.
        let bth = crate::soft::wire::BthRepr::parse(&p).unwrap();
        assert!(bth.ack_req);
        assert!(!has_soft_cap(&[0u8; 4]));
    }
}
