//! The byte formats of the shared-memory link's rendezvous stream, as
//! checked views in the manner of [`crate::soft::wire`]: a `#[repr(C)]`
//! struct of little-endian fields with alignment 1 over the bytes (so the
//! only check is the length, which zerocopy makes without panicking), with
//! accessors, and a `Repr` that parses and emits the whole message.
//!
//! - [`Hello`]: the hello a connector sends and the acceptor's answer
//!   (`hello.rs` has the protocol).
//! - [`Export`]: an exported buffer's announcement (`trains.rs`).
//! - [`SlotHeader`]: the header of a ring slot (`ring.rs`, which has the
//!   region's layout and the rules for reading shared memory: the header
//!   travels as two atomic words, and this view decodes the private copy).
//!
//! Everything read from a peer is untrusted: the accessors only decode,
//! the callers check.

use std::net::IpAddr;

use zerocopy::byteorder::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::verbs::Gid;

/// GIDs a hello or answer names at most.
pub(super) const MAX_GIDS: usize = 16;
/// Socket descriptors a hello or answer names per GID (a device has two:
/// its bound socket and its twin, `udp.rs`).
pub(super) const FDS_PER_GID: usize = 4;
/// No descriptor.
pub(super) const NO_FD: u32 = u32::MAX;
/// 2: the capability word; ring version 2 (slot kinds). 3: the probe,
/// caps slots, process-memory pieces. 4: ring version 3 (a sequence word
/// per slot, 16-byte slot headers). 5: doorbells are unix datagram
/// sockets (an eventfd could block the peer that rings it).
pub(super) const HELLO: &[u8; 8] = b"SVSHMHI5";
/// The answer's magic (same version as [`HELLO`]).
pub(super) const ANSWER: &[u8; 8] = b"SVSHMOK5";
/// Capability: this end sends and receives trains.
pub(super) const CAP_TRAINS: u32 = 1;
/// Capability: this end sends trains of its process memory; the probe is
/// valid.
pub(super) const CAP_CMA: u32 = 2;
/// Capability: this end read the peer's probe and accepts trains of the
/// peer's process memory.
pub(super) const CAP_CMA_READ: u32 = 4;
/// Capability: this end takes trains of one packet (earlier versions took
/// trains of two packets or more and drop one of one as malformed).
pub(super) const CAP_TRAINS1: u32 = 8;

/// A hello or an answer ([`MSG_LEN`] bytes).
///
/// ```text
///    0  magic              8 bytes (HELLO or ANSWER)
///    8  target GID        16 bytes
///   24  GID count          1 byte (more than MAX_GIDS reads as MAX_GIDS)
///   25  GIDs              16 × 16 bytes
///  281  (zero)             3 bytes
///  284  capabilities       u32 LE (CAP_*)
///  288  probe address      u64 LE
///  296  probe value        u64 LE
///  304  descriptors        16 × 4 u32 LE per GID, in the GIDs' order
///                          (NO_FD where there are fewer)
/// ```
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct Hello {
    magic: [u8; 8],
    target: [u8; 16],
    count: u8,
    gids: [[u8; 16]; MAX_GIDS],
    _zero: [u8; 3],
    caps: U32,
    probe_addr: U64,
    probe_value: U64,
    fds: [[U32; FDS_PER_GID]; MAX_GIDS],
}

/// Length of the hello and answer messages.
pub(super) const MSG_LEN: usize = std::mem::size_of::<Hello>();
const _: () = assert!(MSG_LEN == 560);
const _: () = assert!(std::mem::offset_of!(Hello, caps) == 284);
const _: () = assert!(std::mem::offset_of!(Hello, probe_addr) == 288);
const _: () = assert!(std::mem::offset_of!(Hello, fds) == 304);

impl Hello {
    /// Views a message buffer (infallible: it has the length).
    pub(super) fn of(m: &[u8; MSG_LEN]) -> &Hello {
        Hello::ref_from_bytes(m).expect("MSG_LEN bytes are a hello")
    }

    /// Mutably views a message buffer.
    pub(super) fn of_mut(m: &mut [u8; MSG_LEN]) -> &mut Hello {
        Hello::mut_from_bytes(m).expect("MSG_LEN bytes are a hello")
    }

    /// The magic ([`HELLO`] or [`ANSWER`] from a peer of this version).
    pub(super) fn magic(&self) -> &[u8; 8] {
        &self.magic
    }

    /// The GID the message is for.
    pub(super) fn target(&self) -> Gid {
        Gid(self.target)
    }

    /// The capability word.
    pub(super) fn caps(&self) -> u32 {
        self.caps.get()
    }

    /// The probe: address and value of a word of the sender's memory.
    pub(super) fn probe(&self) -> (u64, u64) {
        (self.probe_addr.get(), self.probe_value.get())
    }

    /// The number of GIDs named (at most [`MAX_GIDS`]).
    pub(super) fn gid_count(&self) -> usize {
        usize::from(self.count).min(MAX_GIDS)
    }

    /// The descriptors named for GID number `i` (< [`MAX_GIDS`]), without
    /// the [`NO_FD`] fillers.
    pub(super) fn fds(&self, i: usize) -> Vec<u32> {
        self.fds[i].iter().map(|f| f.get()).filter(|f| *f != NO_FD).collect()
    }

    /// The GIDs named, as addresses, each with the descriptors named for
    /// it; unspecified addresses left out.
    pub(super) fn claims(&self) -> Vec<(IpAddr, Vec<u32>)> {
        (0..self.gid_count())
            .map(|i| (Gid(self.gids[i]).to_ip(), self.fds(i)))
            .filter(|(ip, _)| !ip.is_unspecified())
            .collect()
    }

    /// Names `fds` (at most [`FDS_PER_GID`]; the rest are [`NO_FD`]) as
    /// the sockets of GID number `i` (< [`MAX_GIDS`]).
    pub(super) fn set_fds(&mut self, i: usize, fds: &[u32]) {
        for (k, f) in self.fds[i].iter_mut().enumerate() {
            f.set(fds.get(k).copied().unwrap_or(NO_FD));
        }
    }
}

/// A hello or answer, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HelloRepr {
    /// [`HELLO`] or [`ANSWER`].
    pub(super) magic: [u8; 8],
    /// The GID the message is for.
    pub(super) target: Gid,
    /// The capability word.
    pub(super) caps: u32,
    /// The probe (address, value); zeros when not offered.
    pub(super) probe: (u64, u64),
    /// The sender's GIDs (at most [`MAX_GIDS`] are emitted), each with its
    /// socket descriptors (at most [`FDS_PER_GID`]).
    pub(super) gids: Vec<(Gid, Vec<u32>)>,
}

impl HelloRepr {
    /// Decodes a hello or answer (every field, unchecked). (The link
    /// reads the fields it needs through the view.)
    #[cfg(test)]
    pub(super) fn parse(h: &Hello) -> HelloRepr {
        HelloRepr {
            magic: h.magic,
            target: h.target(),
            caps: h.caps(),
            probe: h.probe(),
            gids: (0..h.gid_count()).map(|i| (Gid(h.gids[i]), h.fds(i))).collect(),
        }
    }

    /// Encodes the message.
    pub(super) fn emit(&self) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        let h = Hello::of_mut(&mut m);
        h.magic = self.magic;
        h.target = self.target.0;
        h.caps.set(self.caps);
        h.probe_addr.set(self.probe.0);
        h.probe_value.set(self.probe.1);
        let n = self.gids.len().min(MAX_GIDS);
        h.count = n as u8;
        for (i, (g, fds)) in self.gids.iter().take(n).enumerate() {
            h.gids[i] = g.0;
            h.set_fds(i, fds);
        }
        m
    }
}

/// An exported buffer's announcement ([`EXPORT_LEN`] bytes; its memfd
/// rides along with SCM_RIGHTS).
///
/// ```text
///    0  magic   8 bytes (EXPORT)
///    8  token   u64 LE
///   16  length  u64 LE
///   24  (zero)  8 bytes
/// ```
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct Export {
    magic: [u8; 8],
    token: U64,
    len: U64,
    _zero: [u8; 8],
}

/// The magic of an [`Export`].
pub(super) const EXPORT: &[u8; 8] = b"SVSHMFD1";
/// Length of an [`Export`].
pub(super) const EXPORT_LEN: usize = std::mem::size_of::<Export>();
const _: () = assert!(EXPORT_LEN == 32);

/// An export, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ExportRepr {
    /// The buffer's token (what train pieces name it by).
    pub(super) token: u64,
    /// The buffer's length.
    pub(super) len: u64,
}

impl ExportRepr {
    /// Decodes an export; `None` unless `m` is [`EXPORT_LEN`] bytes with
    /// the [`EXPORT`] magic.
    pub(super) fn parse(m: &[u8]) -> Option<ExportRepr> {
        let e = Export::ref_from_bytes(m).ok()?;
        (&e.magic == EXPORT).then(|| ExportRepr {
            token: e.token.get(),
            len: e.len.get(),
        })
    }

    /// Encodes the export.
    pub(super) fn emit(&self) -> [u8; EXPORT_LEN] {
        let mut m = [0u8; EXPORT_LEN];
        let e = Export::mut_from_bytes(&mut m[..]).expect("EXPORT_LEN bytes are an export");
        e.magic = *EXPORT;
        e.token.set(self.token);
        e.len.set(self.len);
        m
    }
}

/// The header of a ring slot, its first [`SlotHeader::LEN`] bytes, in
/// the host's byte order (both ends share one host's memory).
///
/// ```text
///    0  seq       u32 (publication: the slot's count + 1, mod 2^32)
///    4  len       u16 (datagram bytes)
///    6  ext       u16 (extension bytes)
///    8  kind      u16 (KIND_*)
///   10  flags     u16 (FLAG_*)
///   12  src_port  u16
///   14  dst_port  u16
/// ```
///
/// Written and read as three aligned words: `seq` (u32 at 0), `len`/`ext`
/// (u32 at [`SlotHeader::LENS`]) and `kind`..`dst_port` (u64 at
/// [`SlotHeader::REST`]); [`SlotHeader::words`] and
/// [`SlotHeader::from_words`] convert. Any bytes are a header: the reader
/// checks the fields.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(super) struct SlotHeader {
    pub(super) seq: u32,
    pub(super) len: u16,
    pub(super) ext: u16,
    pub(super) kind: u16,
    pub(super) flags: u16,
    pub(super) src_port: u16,
    pub(super) dst_port: u16,
}

impl SlotHeader {
    /// Bytes of a slot header.
    pub(super) const LEN: usize = std::mem::size_of::<SlotHeader>();
    /// Offset of the `len`/`ext` word (u32).
    pub(super) const LENS: usize = std::mem::offset_of!(SlotHeader, len);
    /// Offset of the `kind`/`flags`/ports word (u64).
    pub(super) const REST: usize = std::mem::offset_of!(SlotHeader, kind);

    /// The header's words after `seq`: `len`/`ext` (u32 at
    /// [`Self::LENS`]) and the rest (u64 at [`Self::REST`]). Field by
    /// field, in the layout's order (which the asserts below pin), so
    /// that it compiles to a few shifts on the per-datagram path.
    #[inline]
    pub(super) fn words(&self) -> (u32, u64) {
        let [l0, l1] = self.len.to_ne_bytes();
        let [e0, e1] = self.ext.to_ne_bytes();
        let [k0, k1] = self.kind.to_ne_bytes();
        let [f0, f1] = self.flags.to_ne_bytes();
        let [s0, s1] = self.src_port.to_ne_bytes();
        let [d0, d1] = self.dst_port.to_ne_bytes();
        (
            u32::from_ne_bytes([l0, l1, e0, e1]),
            u64::from_ne_bytes([k0, k1, f0, f1, s0, s1, d0, d1]),
        )
    }

    /// The header whose words are `seq`, `lens` and `rest` (as read).
    #[inline]
    pub(super) fn from_words(seq: u32, lens: u32, rest: u64) -> SlotHeader {
        let [l0, l1, e0, e1] = lens.to_ne_bytes();
        let [k0, k1, f0, f1, s0, s1, d0, d1] = rest.to_ne_bytes();
        SlotHeader {
            seq,
            len: u16::from_ne_bytes([l0, l1]),
            ext: u16::from_ne_bytes([e0, e1]),
            kind: u16::from_ne_bytes([k0, k1]),
            flags: u16::from_ne_bytes([f0, f1]),
            src_port: u16::from_ne_bytes([s0, s1]),
            dst_port: u16::from_ne_bytes([d0, d1]),
        }
    }
}

const _: () = assert!(SlotHeader::LEN == 16 && SlotHeader::LENS == 4 && SlotHeader::REST == 8);
const _: () = assert!(std::mem::offset_of!(SlotHeader, ext) == 6);
const _: () = assert!(std::mem::offset_of!(SlotHeader, flags) == 10);
const _: () = assert!(std::mem::offset_of!(SlotHeader, src_port) == 12);
const _: () = assert!(std::mem::offset_of!(SlotHeader, dst_port) == 14);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_at_its_offsets() {
        let r = HelloRepr {
            magic: *ANSWER,
            target: Gid([7; 16]),
            caps: CAP_TRAINS | CAP_CMA,
            probe: (0x1122_3344_5566_7788, 0x99),
            gids: vec![(Gid([1; 16]), vec![3, 4]), (Gid([2; 16]), vec![])],
        };
        let m = r.emit();
        assert_eq!(&m[..8], ANSWER);
        assert_eq!(&m[8..24], &[7; 16]);
        assert_eq!(m[24], 2);
        assert_eq!(&m[25..41], &[1; 16]);
        assert_eq!(&m[284..288], &(CAP_TRAINS | CAP_CMA).to_le_bytes());
        assert_eq!(&m[288..296], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&m[304..308], &3u32.to_le_bytes());
        assert_eq!(&m[312..316], &NO_FD.to_le_bytes());
        assert_eq!(HelloRepr::parse(Hello::of(&m)), r);
        assert!(Hello::ref_from_bytes(&m[..MSG_LEN - 1]).is_err());
    }

    #[test]
    fn a_hostile_gid_count_reads_as_the_most() {
        let mut m = HelloRepr {
            magic: *HELLO,
            target: Gid([0; 16]),
            caps: 0,
            probe: (0, 0),
            gids: vec![],
        }
        .emit();
        m[24] = 255;
        assert_eq!(Hello::of(&m).gid_count(), MAX_GIDS);
        // All zero GIDs: unspecified, so no claims.
        assert!(Hello::of(&m).claims().is_empty());
    }

    #[test]
    fn slot_headers_travel_as_their_words() {
        let h = SlotHeader {
            seq: 0x0102_0304,
            len: 24,
            ext: 8,
            kind: 1,
            flags: 1,
            src_port: 0xc000,
            dst_port: 4791,
        };
        let (lens, rest) = h.words();
        assert_eq!(SlotHeader::from_words(h.seq, lens, rest), h);
        let b = h.as_bytes();
        // The words are the layout's bytes at LENS and REST.
        assert_eq!(&b[SlotHeader::LENS..SlotHeader::REST], &lens.to_ne_bytes());
        assert_eq!(&b[SlotHeader::REST..], &rest.to_ne_bytes());
        assert_eq!(&b[4..6], &24u16.to_ne_bytes());
        assert_eq!(&b[14..16], &4791u16.to_ne_bytes());
    }

    #[test]
    fn export_round_trips() {
        let r = ExportRepr { token: 77, len: 4096 };
        let m = r.emit();
        assert_eq!(&m[..8], EXPORT);
        assert_eq!(&m[8..16], &77u64.to_le_bytes());
        assert_eq!(ExportRepr::parse(&m), Some(r));
        let mut bad = m;
        bad[0] ^= 1;
        assert_eq!(ExportRepr::parse(&bad), None);
        assert_eq!(ExportRepr::parse(&m[..31]), None);
    }
}
