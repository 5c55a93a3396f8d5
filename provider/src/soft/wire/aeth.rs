//! ACK Extended Transport Header (IBTA Vol. 1 §9.3, AETH), its syndrome,
//! and the RNR timer table.
//!
//! ```text
//!  byte 0   Syndrome: resv(7) type(6:5) value(4:0)
//!  1..4     MSN (24 bits)
//! ```
//!
//! Syndrome types (IBTA Vol. 1 chapter 9, AETH syndrome encoding): `00` ACK with a credit count,
//! `01` RNR NAK with a timer code, `11` NAK with an error code; `10` is
//! reserved.

use zerocopy::byteorder::network_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::view;
use super::{WireError, PSN_MASK};

const SYNDROME_SHIFT: u32 = 24;
const TYPE_MASK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1f;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;

/// NAK error codes (the low 5 bits of a NAK syndrome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; the requester goes back to the NAK'd PSN.
    PsnSequenceError,
    /// 1: invalid request (e.g. send longer than the receive buffer,
    /// misaligned atomic).
    InvalidRequest,
    /// 2: remote access error (bad R_Key, range or permission).
    RemoteAccessError,
    /// 3: remote operational error (responder could not complete).
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// Any other (reserved) code.
    Unknown(u8),
}

impl From<u8> for NakCode {
    fn from(code: u8) -> NakCode {
        match code {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Unknown(other),
        }
    }
}

impl From<NakCode> for u8 {
    fn from(code: NakCode) -> u8 {
        match code {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(other) => other,
        }
    }
}

/// A decoded AETH syndrome byte.
///
/// `u8 -> Syndrome -> u8` is lossless for every byte; values that do not
/// fit a field (a credit code above 31, say) are masked on encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledge with a 5-bit end-to-end credit code;
    /// [`Syndrome::CREDITS_INVALID`] (31) means "no credit information",
    /// which is what rxe and most RoCE NICs send.
    Ack {
        /// Credit code, 0-31.
        credits: u8,
    },
    /// Receiver not ready: no receive WQE. `timer` is the responder's
    /// minimum RNR timer code, see [`rnr_timer_ns`].
    RnrNak {
        /// Timer code, 0-31.
        timer: u8,
    },
    /// Negative acknowledge.
    Nak(NakCode),
    /// Reserved type `10`, or the reserved top bit set: kept raw.
    Reserved(u8),
}

impl Syndrome {
    /// Credit code meaning "credit count invalid / unlimited" (rxe's
    /// `AETH_ACK_UNLIMITED`).
    pub const CREDITS_INVALID: u8 = 0x1f;

    /// An ACK without credit information.
    pub const ACK: Syndrome = Syndrome::Ack {
        credits: Syndrome::CREDITS_INVALID,
    };
}

impl From<u8> for Syndrome {
    fn from(byte: u8) -> Syndrome {
        if byte & !(TYPE_MASK | VALUE_MASK) != 0 {
            return Syndrome::Reserved(byte);
        }
        let value = byte & VALUE_MASK;
        match byte & TYPE_MASK {
            TYPE_ACK => Syndrome::Ack { credits: value },
            TYPE_RNR_NAK => Syndrome::RnrNak { timer: value },
            TYPE_NAK => Syndrome::Nak(NakCode::from(value)),
            _ => Syndrome::Reserved(byte),
        }
    }
}

impl From<Syndrome> for u8 {
    fn from(syndrome: Syndrome) -> u8 {
        match syndrome {
            Syndrome::Ack { credits } => TYPE_ACK | (credits & VALUE_MASK),
            Syndrome::RnrNak { timer } => TYPE_RNR_NAK | (timer & VALUE_MASK),
            Syndrome::Nak(code) => TYPE_NAK | (u8::from(code) & VALUE_MASK),
            Syndrome::Reserved(byte) => byte,
        }
    }
}

/// Zero-copy view of an AETH.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Aeth {
    syndrome_msn: U32,
}

impl Aeth {
    /// Length of an AETH in bytes.
    pub const LEN: usize = core::mem::size_of::<Aeth>();

    /// Views the first [`Aeth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked(buf: &[u8]) -> Result<&Aeth, WireError> {
        view::prefix(buf)
    }

    /// Mutably views the first [`Aeth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut Aeth, WireError> {
        view::prefix_mut(buf)
    }

    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.syndrome_msn.get().to_be_bytes()[0]
    }
    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from(self.syndrome_byte())
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        self.syndrome_msn.get() & PSN_MASK
    }
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, syndrome: Syndrome) {
        let byte = u32::from(u8::from(syndrome));
        self.syndrome_msn.set((byte << SYNDROME_SHIFT) | self.msn());
    }
    /// Sets the MSN (low 24 bits of `msn` used).
    pub fn set_msn(&mut self, msn: u32) {
        let word = self.syndrome_msn.get();
        self.syndrome_msn.set((word & !PSN_MASK) | (msn & PSN_MASK));
    }
}

/// A decoded AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number: 24 bits, higher bits are not sent.
    pub msn: u32,
}

impl AethRepr {
    /// Length of an AETH in bytes.
    pub const LEN: usize = Aeth::LEN;

    /// Decodes the AETH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is too short.
    pub fn parse(buf: &[u8]) -> Result<AethRepr, WireError> {
        let aeth = Aeth::new_checked(buf)?;
        Ok(AethRepr {
            syndrome: aeth.syndrome(),
            msn: aeth.msn(),
        })
    }

    /// Encodes into the first [`AethRepr::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let aeth = Aeth::new_checked_mut(buf).map_err(|_| WireError::BufferTooSmall)?;
        aeth.set_msn(self.msn);
        aeth.set_syndrome(self.syndrome);
        Ok(())
    }
}

/// Minimum RNR NAK timer values in microseconds, indexed by the 5-bit code
/// (the IBTA Vol. 1 RNR NAK timer encoding table; the same values are in
/// `ibv_modify_qp(3)` and the kernel's `enum ib_rnr_timeout`). rxe's
/// `rnrnak_usec[]` has 61410 for code 25, a typo for the specified
/// 61.44 ms; this table follows the specification.
const RNR_TIMER_MICROS: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

/// The minimum RNR timer for a 5-bit code, in nanoseconds: how long a
/// requester waits after an RNR NAK before retrying. Code 0 is the longest
/// (655.36 ms), not zero. Only the low 5 bits of `code` are used.
pub fn rnr_timer_ns(code: u8) -> u64 {
    let index = usize::from(code & VALUE_MASK);
    RNR_TIMER_MICROS
        .get(index)
        .map_or(0, |micros| micros.saturating_mul(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_byte_round_trips() {
        for byte in 0..=u8::MAX {
            assert_eq!(u8::from(Syndrome::from(byte)), byte, "{byte:#04x}");
        }
    }

    #[test]
    fn syndrome_decoding() {
        assert_eq!(Syndrome::from(0x1f), Syndrome::ACK);
        assert_eq!(Syndrome::from(0x00), Syndrome::Ack { credits: 0 });
        assert_eq!(Syndrome::from(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(Syndrome::from(0x60), Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(Syndrome::from(0x61), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(Syndrome::from(0x62), Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(Syndrome::from(0x63), Syndrome::Nak(NakCode::RemoteOperationalError));
        assert_eq!(Syndrome::from(0x64), Syndrome::Nak(NakCode::InvalidRdRequest));
        assert_eq!(Syndrome::from(0x65), Syndrome::Nak(NakCode::Unknown(5)));
        assert_eq!(Syndrome::from(0x41), Syndrome::Reserved(0x41));
        assert_eq!(Syndrome::from(0x80), Syndrome::Reserved(0x80));
    }

    #[test]
    fn nak_code_round_trips() {
        for code in 0..=u8::MAX {
            assert_eq!(u8::from(NakCode::from(code)), code);
        }
    }

    #[test]
    fn aeth_round_trip_on_fixed_bytes() {
        // RNR NAK, timer code 1 (0.01 ms), MSN 0x010203.
        let bytes = [0x21, 0x01, 0x02, 0x03];
        let repr = AethRepr::parse(&bytes).unwrap();
        assert_eq!(
            repr,
            AethRepr {
                syndrome: Syndrome::RnrNak { timer: 1 },
                msn: 0x01_0203
            }
        );
        let mut out = [0u8; 4];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        let view = Aeth::new_checked(&bytes).unwrap();
        assert_eq!(view.syndrome_byte(), 0x21);
        assert_eq!(view.msn(), 0x01_0203);
    }

    #[test]
    fn aeth_setters_and_masking() {
        let mut buf = [0xffu8; 4];
        let aeth = Aeth::new_checked_mut(&mut buf).unwrap();
        aeth.set_msn(0x1234_5678);
        assert_eq!(aeth.msn(), 0x34_5678);
        aeth.set_syndrome(Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(buf, [0x62, 0x34, 0x56, 0x78]);
        let repr = AethRepr {
            syndrome: Syndrome::Ack { credits: 0xff },
            msn: u32::MAX,
        };
        let mut out = [0u8; 4];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, [0x1f, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn aeth_short_buffers() {
        for len in 0..Aeth::LEN {
            let buf = vec![0u8; len];
            assert_eq!(AethRepr::parse(&buf), Err(WireError::Truncated));
            let mut out = vec![0u8; len];
            assert_eq!(
                AethRepr {
                    syndrome: Syndrome::ACK,
                    msn: 0
                }
                .emit(&mut out),
                Err(WireError::BufferTooSmall)
            );
        }
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(5), 60_000);
        assert_eq!(rnr_timer_ns(7), 120_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(25), 61_440_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        // Codes 1..=31 increase; the pattern from code 2 on is alternately
        // x1.5 and x1.333 (2, 3, 4, 6, 8, 12, ...).
        for code in 1..31u8 {
            assert!(rnr_timer_ns(code) < rnr_timer_ns(code + 1));
        }
        for code in 4..32u8 {
            assert_eq!(rnr_timer_ns(code), 2 * rnr_timer_ns(code - 2));
        }
        assert_eq!(rnr_timer_ns(32), rnr_timer_ns(0));
    }
}
