//! Base Transport Header (IBTA Vol. 1 §9.2), 12 bytes, first in every
//! RoCEv2 UDP payload.
//!
//! ```text
//!  byte 0   OpCode
//!  byte 1   SE(7) M(6) PadCnt(5:4) TVer(3:0)
//!  2..4     P_Key
//!  byte 4   FECN(7) BECN(6) resv6(5:0)   (RoCEv2 annex: was resv8a)
//!  5..8     DestQP (24 bits)
//!  byte 8   AckReq(7) resv7(6:0)
//!  9..12    PSN (24 bits)
//! ```

use zerocopy::byteorder::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::view;
use super::{Opcode, Pkey, Psn, Qpn, WireError, PSN_MASK};

const SE_BIT: u8 = 0x80;
const MIG_REQ_BIT: u8 = 0x40;
const PAD_SHIFT: u32 = 4;
const PAD_MASK: u8 = 0x3;
const TVER_MASK: u8 = 0x0f;
const FECN_BIT: u32 = 1 << 31;
const BECN_BIT: u32 = 1 << 30;
const ACK_REQ_BIT: u32 = 1 << 31;

/// The BTH transport header version this implementation speaks.
pub const BTH_TVER: u8 = 0;

/// Zero-copy view of a BTH inside a packet buffer.
///
/// Obtained with [`Bth::new_checked`] (or `_mut`), which only checks the
/// length; every bit pattern is a valid view. Getters decode, setters
/// encode in place. Reserved bits are neither decoded nor touched.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Bth {
    opcode: u8,
    flags: u8,
    pkey: U16,
    fecn_becn_dest_qpn: U32,
    ack_req_psn: U32,
}

impl Bth {
    /// Length of a BTH in bytes.
    pub const LEN: usize = core::mem::size_of::<Bth>();

    /// Views the first [`Bth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than a BTH.
    pub fn new_checked(buf: &[u8]) -> Result<&Bth, WireError> {
        view::prefix(buf)
    }

    /// Mutably views the first [`Bth::LEN`] bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than a BTH.
    pub fn new_checked_mut(buf: &mut [u8]) -> Result<&mut Bth, WireError> {
        view::prefix_mut(buf)
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.opcode)
    }
    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.flags & SE_BIT != 0
    }
    /// MigReq (path migration state).
    pub fn mig_req(&self) -> bool {
        self.flags & MIG_REQ_BIT != 0
    }
    /// Pad count: bytes (0-3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.flags >> PAD_SHIFT) & PAD_MASK
    }
    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.flags & TVER_MASK
    }
    /// Partition key.
    pub fn pkey(&self) -> Pkey {
        Pkey::new(self.pkey.get())
    }
    /// Forward explicit congestion notification (RoCEv2).
    pub fn fecn(&self) -> bool {
        self.fecn_becn_dest_qpn.get() & FECN_BIT != 0
    }
    /// Backward explicit congestion notification (RoCEv2).
    pub fn becn(&self) -> bool {
        self.fecn_becn_dest_qpn.get() & BECN_BIT != 0
    }
    /// Destination QP.
    pub fn dest_qpn(&self) -> Qpn {
        Qpn::new(self.fecn_becn_dest_qpn.get())
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.ack_req_psn.get() & ACK_REQ_BIT != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(self.ack_req_psn.get())
    }

    /// Sets the OpCode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.opcode = u8::from(opcode);
    }
    /// Sets the solicited event bit.
    pub fn set_solicited(&mut self, on: bool) {
        set_bit_u8(&mut self.flags, SE_BIT, on);
    }
    /// Sets MigReq.
    pub fn set_mig_req(&mut self, on: bool) {
        set_bit_u8(&mut self.flags, MIG_REQ_BIT, on);
    }
    /// Sets the pad count (low 2 bits of `pad` used).
    pub fn set_pad_count(&mut self, pad: u8) {
        self.flags = (self.flags & !(PAD_MASK << PAD_SHIFT)) | ((pad & PAD_MASK) << PAD_SHIFT);
    }
    /// Sets TVer (low 4 bits of `tver` used).
    pub fn set_tver(&mut self, tver: u8) {
        self.flags = (self.flags & !TVER_MASK) | (tver & TVER_MASK);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, pkey: Pkey) {
        self.pkey.set(pkey.value());
    }
    /// Sets FECN.
    pub fn set_fecn(&mut self, on: bool) {
        set_bit_u32(&mut self.fecn_becn_dest_qpn, FECN_BIT, on);
    }
    /// Sets BECN.
    pub fn set_becn(&mut self, on: bool) {
        set_bit_u32(&mut self.fecn_becn_dest_qpn, BECN_BIT, on);
    }
    /// Sets the destination QP, keeping byte 4.
    pub fn set_dest_qpn(&mut self, qpn: Qpn) {
        let word = self.fecn_becn_dest_qpn.get();
        self.fecn_becn_dest_qpn.set((word & !PSN_MASK) | qpn.value());
    }
    /// Sets AckReq.
    pub fn set_ack_req(&mut self, on: bool) {
        set_bit_u32(&mut self.ack_req_psn, ACK_REQ_BIT, on);
    }
    /// Sets the PSN, keeping byte 8.
    pub fn set_psn(&mut self, psn: Psn) {
        let word = self.ack_req_psn.get();
        self.ack_req_psn.set((word & !PSN_MASK) | psn.value());
    }
}

fn set_bit_u8(byte: &mut u8, bit: u8, on: bool) {
    if on {
        *byte |= bit;
    } else {
        *byte &= !bit;
    }
}

fn set_bit_u32(word: &mut U32, bit: u32, on: bool) {
    let value = word.get();
    word.set(if on { value | bit } else { value & !bit });
}

/// A decoded BTH.
///
/// `parse` rejects a TVer other than 0 and ignores reserved bits; `emit`
/// writes TVer 0 and zero reserved bits (IBTA: reserved fields are sent as
/// zero and ignored on receipt). The opcode may be unknown here; whole
/// packet parsing is what rejects unknown opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq. rxe sends 0; many NICs send 1 (path migrated, no APM).
    pub mig_req: bool,
    /// Pad count, 0-3. Whole-packet emit overwrites it from the payload
    /// length.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: Pkey,
    /// Forward ECN (set by the network; a sender leaves it clear).
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qpn: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Length of a BTH in bytes.
    pub const LEN: usize = Bth::LEN;

    /// A BTH with the given opcode, destination and PSN, default P_Key and
    /// every flag clear.
    pub const fn new(opcode: Opcode, dest_qpn: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: Pkey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
        }
    }

    /// Decodes a view.
    ///
    /// # Errors
    ///
    /// [`WireError::BadVersion`] if TVer is not 0.
    pub fn from_view(bth: &Bth) -> Result<BthRepr, WireError> {
        let tver = bth.tver();
        if tver != BTH_TVER {
            return Err(WireError::BadVersion(tver));
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Decodes the BTH at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 12 bytes,
    /// [`WireError::BadVersion`] if TVer is not 0.
    pub fn parse(buf: &[u8]) -> Result<BthRepr, WireError> {
        BthRepr::from_view(Bth::new_checked(buf)?)
    }

    /// Encodes into the first 12 bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::BufferTooSmall`] if `buf` is shorter than 12 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let bth = Bth::new_checked_mut(buf).map_err(|_| WireError::BufferTooSmall)?;
        bth.opcode = u8::from(self.opcode);
        bth.flags = 0;
        bth.set_solicited(self.solicited);
        bth.set_mig_req(self.mig_req);
        bth.set_pad_count(self.pad_count);
        bth.set_tver(BTH_TVER);
        bth.set_pkey(self.pkey);
        bth.fecn_becn_dest_qpn.set(self.dest_qpn.value());
        bth.set_fecn(self.fecn);
        bth.set_becn(self.becn);
        bth.ack_req_psn.set(self.psn.value());
        bth.set_ack_req(self.ack_req);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RC SEND_ONLY, SE, M, pad 2, P_Key 0xffff, BECN, QP 0x123456,
    /// AckReq, PSN 0xabcdef.
    const SAMPLE: [u8; 12] = [0x04, 0xe0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef];

    fn sample_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RcSendOnly,
            solicited: true,
            mig_req: true,
            pad_count: 2,
            pkey: Pkey::DEFAULT,
            fecn: false,
            becn: true,
            dest_qpn: Qpn::new(0x12_3456),
            ack_req: true,
            psn: Psn::new(0xab_cdef),
        }
    }

    #[test]
    fn view_decodes_every_field() {
        let bth = Bth::new_checked(&SAMPLE).unwrap();
        assert_eq!(bth.opcode(), Opcode::RcSendOnly);
        assert!(bth.solicited() && bth.mig_req() && bth.ack_req() && bth.becn());
        assert!(!bth.fecn());
        assert_eq!(bth.pad_count(), 2);
        assert_eq!(bth.tver(), 0);
        assert_eq!(bth.pkey(), Pkey::DEFAULT);
        assert_eq!(bth.dest_qpn(), Qpn::new(0x12_3456));
        assert_eq!(bth.psn(), Psn::new(0xab_cdef));
    }

    #[test]
    fn parse_and_emit_round_trip() {
        let repr = BthRepr::parse(&SAMPLE).unwrap();
        assert_eq!(repr, sample_repr());
        let mut out = [0u8; 12];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, SAMPLE);
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut buf = SAMPLE;
        let bth = Bth::new_checked_mut(&mut buf).unwrap();
        bth.set_psn(Psn::new(1));
        bth.set_dest_qpn(Qpn::new(2));
        bth.set_pad_count(0);
        bth.set_fecn(true);
        bth.set_solicited(false);
        assert!(bth.ack_req() && bth.becn() && bth.mig_req());
        assert_eq!(
            buf,
            [0x04, 0x40, 0xff, 0xff, 0xc0, 0x00, 0x00, 0x02, 0x80, 0x00, 0x00, 0x01]
        );
    }

    #[test]
    fn reserved_bits_are_ignored_and_emitted_as_zero() {
        let mut buf = SAMPLE;
        buf[4] |= 0x3f;
        buf[8] |= 0x7f;
        let repr = BthRepr::parse(&buf).unwrap();
        assert_eq!(repr, sample_repr());
        let mut out = [0u8; 12];
        repr.emit(&mut out).unwrap();
        assert_eq!(out, SAMPLE);
    }

    #[test]
    fn nonzero_tver_is_rejected() {
        let mut buf = SAMPLE;
        buf[1] |= 0x01;
        assert_eq!(BthRepr::parse(&buf), Err(WireError::BadVersion(1)));
        assert_eq!(Bth::new_checked(&buf).unwrap().tver(), 1);
    }

    #[test]
    fn short_buffers_are_rejected() {
        for len in 0..Bth::LEN {
            assert_eq!(Bth::new_checked(&SAMPLE[..len]).err(), Some(WireError::Truncated));
            assert_eq!(BthRepr::parse(&SAMPLE[..len]), Err(WireError::Truncated));
            let mut out = vec![0u8; len];
            assert_eq!(sample_repr().emit(&mut out), Err(WireError::BufferTooSmall));
        }
        // Longer buffers are fine: the view covers the first 12 bytes.
        let mut long = SAMPLE.to_vec();
        long.extend_from_slice(&[0xaa; 5]);
        assert_eq!(BthRepr::parse(&long).unwrap(), sample_repr());
    }

    #[test]
    fn out_of_range_repr_values_are_masked() {
        let mut repr = sample_repr();
        repr.pad_count = 0xff;
        let mut out = [0u8; 12];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[1], 0xf0);
        assert_eq!(Bth::LEN, 12);
    }
}
