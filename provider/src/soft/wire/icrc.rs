//! The RoCEv2 invariant CRC (ICRC).
//!
//! A CRC-32 (the Ethernet polynomial, reflected, initial value all ones,
//! final complement; what `crc32fast` computes) over, in order (IBTA Vol. 1
//! §7.8.1 and the RoCEv2 annex A17):
//!
//! 1. 8 bytes of `0xff` standing in for the InfiniBand LRH;
//! 2. the IP header with its variant fields set to all ones: IPv4 TOS, TTL
//!    and header checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to all ones;
//! 5. the rest of the packet — extension headers, payload, pad — but not
//!    the ICRC itself.
//!
//! The result goes on the wire **little-endian**: rxe stores
//! `cpu_to_le32(~crc32_le(...))` (rxe_icrc.c) and Scapy packs it the same
//! way. The tests check this against a CNP captured from a ConnectX-4 Lx.

use super::ip::{ipv4_header, ipv6_header, udp_header};
use super::{Bth, IpPseudoHeader, IpVariantFields, UdpPorts, WireError, ICRC_LEN, MIN_PACKET_LEN};

/// What the ICRC puts in place of the LRH.
const LRH_STAND_IN: [u8; 8] = [0xff; 8];
/// Offset of the BTH byte holding FECN, BECN and the reserved bits.
const BTH_VARIANT_BYTE: usize = 4;
/// IPv4 variant fields and their offsets.
const IPV4_TOS: usize = 1;
const IPV4_TTL: usize = 8;
const IPV4_CHECKSUM: core::ops::Range<usize> = 10..12;
/// IPv6 variant fields: version stays, traffic class and flow label go
/// (the low nibble of byte 0 and bytes 1-3), hop limit is byte 7.
const IPV6_VERSION_NIBBLE: u8 = 0xf0;
const IPV6_HOP_LIMIT: usize = 7;

/// Packets up to this long (BTH through pad) are hashed from one masked
/// copy on the stack (a ping-pong's small messages).
const SMALL_PACKET: usize = 64;

/// Variant fields all ones, as the ICRC sees them.
const MASKED: IpVariantFields = IpVariantFields {
    traffic_class: 0xff,
    hop_limit: 0xff,
    flow_label: 0x000f_ffff,
};

/// Computes the ICRC of `packet_without_icrc` (BTH through pad, i.e. the UDP
/// payload minus its last four bytes) sent with the given IP and UDP
/// headers. Never panics, whatever the length of the input.
pub fn compute_icrc(ip: &IpPseudoHeader, ports: UdpPorts, packet_without_icrc: &[u8]) -> u32 {
    IcrcPrefix::default().compute(ip, ports, packet_without_icrc)
}

/// The part of an ICRC that depends only on the IP and UDP headers (the
/// LRH stand-in and the masked IP and UDP headers: 36 of the 56 bytes an
/// 8-byte IPv4 message hashes), kept for the next packet of the same flow
/// and length. A link keeps one per direction: in a ping-pong every packet
/// it sends (or receives) has the same addresses, ports and length, and the
/// ICRC then hashes only the BTH and what follows.
#[derive(Debug, Clone, Default)]
pub struct IcrcPrefix {
    /// The flow and RoCE length kept, and the CRC state after the LRH
    /// stand-in and the IP and UDP headers. Boxed: a link moves its
    /// receive-side prefix out of its buffers and back on every poll,
    /// empty ones included, and a pointer moves for free.
    kept: Option<Box<Kept>>,
}

/// What an [`IcrcPrefix`] keeps: the key (flow and RoCE length) and the
/// CRC state for it.
type Kept = ((IpPseudoHeader, UdpPorts, usize), crc32fast::Hasher);

impl IcrcPrefix {
    /// [`compute_icrc`], starting from the kept prefix state when the flow
    /// and length are those of the last call. The result is the same.
    pub fn compute(&mut self, ip: &IpPseudoHeader, ports: UdpPorts, packet_without_icrc: &[u8]) -> u32 {
        let roce_len = packet_without_icrc.len().saturating_add(ICRC_LEN);
        let key = (*ip, ports, roce_len);
        let mut hasher = match &mut self.kept {
            Some(kept) if kept.0 == key => kept.1.clone(),
            slot => {
                let state = Self::headers_state(ip, ports, roce_len);
                match slot {
                    Some(kept) => **kept = (key, state.clone()),
                    None => *slot = Some(Box::new((key, state.clone()))),
                }
                state
            }
        };
        // A small packet is hashed from one masked copy: each update of a
        // few bytes costs more than the bytes it hashes.
        let mut small = [0u8; SMALL_PACKET];
        if let Some(copy) = small.get_mut(..packet_without_icrc.len()) {
            copy.copy_from_slice(packet_without_icrc);
            if let Some(variant) = copy.get_mut(BTH_VARIANT_BYTE) {
                *variant = 0xff;
            }
            hasher.update(copy);
            return hasher.finalize();
        }
        let (bth, rest) = packet_without_icrc.split_at(Bth::LEN);
        let mut masked = [0u8; Bth::LEN];
        masked.copy_from_slice(bth);
        masked[BTH_VARIANT_BYTE] = 0xff;
        hasher.update(&masked);
        hasher.update(rest);
        hasher.finalize()
    }

    /// [`fill_icrc`] through [`IcrcPrefix::compute`].
    ///
    /// # Errors
    ///
    /// As [`fill_icrc`].
    pub fn fill(&mut self, ip: &IpPseudoHeader, ports: UdpPorts, packet: &mut [u8]) -> Result<(), WireError> {
        if packet.len() < MIN_PACKET_LEN {
            return Err(WireError::Truncated);
        }
        let body_len = packet.len() - ICRC_LEN;
        let (body, icrc) = packet.split_at_mut_checked(body_len).ok_or(WireError::Truncated)?;
        icrc.copy_from_slice(&self.compute(ip, ports, body).to_le_bytes());
        Ok(())
    }

    /// [`check_icrc`] through [`IcrcPrefix::compute`].
    pub fn check(&mut self, ip: &IpPseudoHeader, ports: UdpPorts, packet: &[u8]) -> bool {
        if packet.len() < MIN_PACKET_LEN {
            return false;
        }
        let Some((body, icrc)) = packet.split_at_checked(packet.len() - ICRC_LEN) else {
            return false;
        };
        let Ok(received) = <[u8; ICRC_LEN]>::try_from(icrc) else {
            return false;
        };
        self.compute(ip, ports, body) == u32::from_le_bytes(received)
    }

    /// The CRC state after the LRH stand-in and the masked IP and UDP
    /// headers of a RoCE packet of `roce_len` bytes (BTH through ICRC).
    fn headers_state(ip: &IpPseudoHeader, ports: UdpPorts, roce_len: usize) -> crc32fast::Hasher {
        // Assembled once and fed to the CRC in one update: many tiny
        // updates cost more than the bytes they hash.
        let mut prefix = [0u8; 8 + 40 + 8];
        let mut n = 0;
        let mut put = |bytes: &[u8], n: &mut usize| {
            if let Some(dst) = prefix.get_mut(*n..*n + bytes.len()) {
                dst.copy_from_slice(bytes);
                *n += bytes.len();
            }
        };
        put(&LRH_STAND_IN, &mut n);
        match *ip {
            IpPseudoHeader::V4 {
                src,
                dst,
                id,
                dont_fragment,
            } => {
                let mut header = ipv4_header(src, dst, id, dont_fragment, &MASKED, roce_len);
                header[IPV4_TOS] = 0xff;
                header[IPV4_TTL] = 0xff;
                header[IPV4_CHECKSUM].fill(0xff);
                put(&header, &mut n);
            }
            IpPseudoHeader::V6 { src, dst } => {
                let mut header = ipv6_header(src, dst, &MASKED, roce_len);
                header[0] |= !IPV6_VERSION_NIBBLE;
                header[1..4].fill(0xff);
                header[IPV6_HOP_LIMIT] = 0xff;
                put(&header, &mut n);
            }
        }
        put(&udp_header(ports, roce_len, 0xffff), &mut n);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(prefix.get(..n).unwrap_or(&[]));
        hasher
    }
}

/// Computes the ICRC of `packet` (BTH through ICRC) and writes it,
/// little-endian, into its last four bytes.
///
/// # Errors
///
/// [`WireError::Truncated`] if `packet` is shorter than a BTH plus ICRC;
/// nothing is written then.
pub fn fill_icrc(ip: &IpPseudoHeader, ports: UdpPorts, packet: &mut [u8]) -> Result<(), WireError> {
    IcrcPrefix::default().fill(ip, ports, packet)
}

/// Whether the last four bytes of `packet` (BTH through ICRC) are its
/// correct ICRC. `false` for anything shorter than a BTH plus ICRC.
pub fn check_icrc(ip: &IpPseudoHeader, ports: UdpPorts, packet: &[u8]) -> bool {
    IcrcPrefix::default().check(ip, ports, packet)
}
