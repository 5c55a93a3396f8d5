//! RoCEv2 wire format: headers, the opcode table, whole packets and the
//! invariant CRC.
//!
//! No I/O, no clock, no `unsafe`, and no panics on untrusted input: every
//! function that reads received bytes goes through a checked constructor
//! and reports a [`WireError`] instead. Modelled on smoltcp's wire layer.
//!
//! # Layers
//!
//! - **Numbers** ([`Psn`], [`Qpn`], [`Pkey`]): 24-bit wrapping sequence
//!   numbers with circular comparison, masked QPNs, partition keys.
//! - **Opcode table** ([`Opcode`], [`OpcodeInfo`]): for every RC, UC and UD
//!   opcode, its transport, operation, position in the message, direction,
//!   extension headers and whether it carries payload. Parsing, emitting
//!   and the protocol engine are driven by this table, as in rxe.
//! - **Headers**: for each of BTH, RETH, AETH, DETH, AtomicETH,
//!   AtomicAckETH, ImmDt and IETH, a zero-copy view over the buffer
//!   (`Bth::new_checked(&[u8])`, getters and setters; zerocopy structs of
//!   big-endian fields) and a plain `Repr` value (`BthRepr::parse`,
//!   `BthRepr::emit`, `BthRepr::LEN`).
//! - **Packets** ([`Packet::parse`], [`PacketRepr::emit`]): BTH, extension
//!   headers, payload, pad and ICRC, validated against the opcode table.
//! - **ICRC and IP** ([`compute_icrc`], [`fill_icrc`], [`check_icrc`],
//!   [`grh_bytes`]): the CRC over the packet and its (reconstructed) IP and
//!   UDP headers with variant fields masked, and the 40-byte GRH that UD
//!   receive buffers start with.
//!
//! # Examples
//!
//! ```
//! use std::net::Ipv4Addr;
//! use softverbs::soft::wire::*;
//!
//! let mut headers = PacketRepr::new(BthRepr::new(
//!     Opcode::RcSendOnlyWithImmediate,
//!     Qpn::new(0x11),
//!     Psn::new(42),
//! ));
//! headers.immdt = Some(ImmDtRepr::from_be_value(7));
//!
//! let ip = IpPseudoHeader::V4 {
//!     src: Ipv4Addr::new(10, 0, 0, 1),
//!     dst: Ipv4Addr::new(10, 0, 0, 2),
//!     id: 0,
//!     dont_fragment: true,
//! };
//! let ports = UdpPorts { src: 49152, dst: ROCEV2_UDP_PORT };
//!
//! let mut buf = [0u8; 64];
//! let len = headers.emit(b"hello", &mut buf).unwrap();
//! fill_icrc(&ip, ports, &mut buf[..len]).unwrap();
//!
//! let packet = Packet::parse(&buf[..len]).unwrap();
//! assert_eq!(packet.payload, b"hello");
//! assert_eq!(packet.headers.bth.pad_count, 3);
//! assert!(check_icrc(&ip, ports, &buf[..len]));
//! ```

#![deny(unsafe_code)]

mod aeth;
mod bth;
mod error;
mod ext;
mod icrc;
mod ip;
mod opcode;
mod packet;
mod psn;
mod sack;
mod view;

#[cfg(test)]
mod tests;

pub use aeth::{rnr_timer_ns, Aeth, AethRepr, NakCode, Syndrome};
pub use bth::{Bth, BthRepr, BTH_TVER};
pub use error::WireError;
pub use ext::{
    AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Deth, DethRepr, Ieth, IethRepr, ImmDt, ImmDtRepr, Reth,
    RethRepr,
};
pub use icrc::{check_icrc, compute_icrc, fill_icrc, IcrcPrefix};
pub use ip::{
    grh_bytes, IpPseudoHeader, IpVariantFields, UdpPorts, GRH_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN, ROCEV2_UDP_PORT,
    UDP_HEADER_LEN,
};
pub use opcode::{Direction, ExtHeaders, OpKind, Opcode, OpcodeInfo, Position, Transport};
pub use packet::{pad_len, MessageHeaders, Packet, PacketRepr, ParsedPacket, ICRC_LEN, MIN_PACKET_LEN};
pub use psn::{Pkey, Psn, Qpn, PSN_MASK};
pub use sack::{
    has_soft_cap, set_soft_cap, Sack, SackRange, SACK_MAGIC, SACK_MAX_RANGES, SACK_VERSION, SOFT_CAP_BIT, SOFT_CAP_BYTE,
};
