//! The IP and UDP headers around a RoCEv2 packet, rebuilt from what a UDP
//! socket tells us.
//!
//! The soft provider sends and receives through the kernel's UDP stack, so
//! it never sees the real IP header. The ICRC and the UD receive GRH both
//! need one, so they are reconstructed here from addresses, ports and the
//! packet length: IPv4 without options (20 bytes) or IPv6 without
//! extension headers (40 bytes), protocol / next header UDP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The RoCEv2 UDP destination port (IANA 4791).
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of an IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Length of the global route header a UD receive buffer starts with.
pub const GRH_LEN: usize = 40;

const IP_PROTO_UDP: u8 = 17;
const IPV4_VERSION_IHL: u8 = 0x45;
const IPV4_DONT_FRAGMENT: u16 = 0x4000;
const IPV6_VERSION: u32 = 6 << 28;
const IPV6_FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// The invariant parts of the IP header of a RoCEv2 packet: everything the
/// ICRC covers. Lengths are derived from the packet; the variant fields
/// (TOS/traffic class, TTL/hop limit, flow label, IPv4 checksum) are masked
/// by the ICRC and supplied separately for the GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpPseudoHeader {
    /// IPv4, protocol UDP, no options.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification field. Covered by the ICRC, so both ends must agree
        /// on it; a kernel UDP socket does not reveal the one it used.
        id: u16,
        /// The DF flag (rxe and RoCE NICs set it).
        dont_fragment: bool,
    },
    /// IPv6, next header UDP, no extension headers.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

impl IpPseudoHeader {
    /// The header both ends of a soft link assume for the ICRC between
    /// `src` and `dst`: DF set and id 0 for IPv4 (what an unconnected UDP
    /// socket with DF sends). `None` for mixed families.
    pub fn between(src: IpAddr, dst: IpAddr) -> Option<IpPseudoHeader> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Some(IpPseudoHeader::V4 {
                src,
                dst,
                id: 0,
                dont_fragment: true,
            }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Some(IpPseudoHeader::V6 { src, dst }),
            _ => None,
        }
    }

    /// Length of the IP header: 20 for IPv4, 40 for IPv6.
    pub const fn header_len(&self) -> usize {
        match self {
            IpPseudoHeader::V4 { .. } => IPV4_HEADER_LEN,
            IpPseudoHeader::V6 { .. } => IPV6_HEADER_LEN,
        }
    }
}

/// UDP source and destination ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpPorts {
    /// Source port (RoCE NICs vary it per QP for ECMP entropy).
    pub src: u16,
    /// Destination port, normally [`ROCEV2_UDP_PORT`].
    pub dst: u16,
}

/// The IP header fields the ICRC masks, needed only to build a GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpVariantFields {
    /// IPv4 TOS or IPv6 traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits; ignored for IPv4).
    pub flow_label: u32,
}

impl Default for IpVariantFields {
    /// Traffic class 0, hop limit 64, flow label 0.
    fn default() -> IpVariantFields {
        IpVariantFields {
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }
    }
}

/// `base + roce_len` as a 16-bit length field. A length that does not fit
/// cannot be on the wire; it saturates so that callers never panic.
fn length_field(base: usize, roce_len: usize) -> u16 {
    u16::try_from(base.saturating_add(roce_len)).unwrap_or(u16::MAX)
}

/// The RFC 1071 Internet checksum of an IPv4 header whose checksum field
/// is zero.
fn ipv4_checksum(header: &[u8; IPV4_HEADER_LEN]) -> u16 {
    let mut sum: u32 = header
        .chunks_exact(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves `sum` <= 0xffff.
    !(sum as u16)
}

/// Builds the IPv4 header of a datagram whose UDP payload (the RoCE packet,
/// ICRC included) is `roce_len` bytes, with a valid checksum.
pub(super) fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    dont_fragment: bool,
    variant: &IpVariantFields,
    roce_len: usize,
) -> [u8; IPV4_HEADER_LEN] {
    let total_len = length_field(IPV4_HEADER_LEN + UDP_HEADER_LEN, roce_len);
    let flags = if dont_fragment { IPV4_DONT_FRAGMENT } else { 0 };
    let [len_hi, len_lo] = total_len.to_be_bytes();
    let [id_hi, id_lo] = id.to_be_bytes();
    let [flags_hi, flags_lo] = flags.to_be_bytes();
    let [s0, s1, s2, s3] = src.octets();
    let [d0, d1, d2, d3] = dst.octets();
    let mut header = [
        IPV4_VERSION_IHL,
        variant.traffic_class,
        len_hi,
        len_lo,
        id_hi,
        id_lo,
        flags_hi,
        flags_lo,
        variant.hop_limit,
        IP_PROTO_UDP,
        0,
        0,
        s0,
        s1,
        s2,
        s3,
        d0,
        d1,
        d2,
        d3,
    ];
    let [sum_hi, sum_lo] = ipv4_checksum(&header).to_be_bytes();
    header[10] = sum_hi;
    header[11] = sum_lo;
    header
}

/// Builds the IPv6 header of a datagram whose UDP payload is `roce_len`
/// bytes.
pub(super) fn ipv6_header(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    variant: &IpVariantFields,
    roce_len: usize,
) -> [u8; IPV6_HEADER_LEN] {
    let first_word =
        IPV6_VERSION | (u32::from(variant.traffic_class) << 20) | (variant.flow_label & IPV6_FLOW_LABEL_MASK);
    let payload_len = length_field(UDP_HEADER_LEN, roce_len);
    let mut header = [0u8; IPV6_HEADER_LEN];
    let (word, rest) = header.split_at_mut(4);
    word.copy_from_slice(&first_word.to_be_bytes());
    let (len, rest) = rest.split_at_mut(2);
    len.copy_from_slice(&payload_len.to_be_bytes());
    let (next_hop, addrs) = rest.split_at_mut(2);
    next_hop.copy_from_slice(&[IP_PROTO_UDP, variant.hop_limit]);
    let (src_bytes, dst_bytes) = addrs.split_at_mut(16);
    src_bytes.copy_from_slice(&src.octets());
    dst_bytes.copy_from_slice(&dst.octets());
    header
}

/// Builds the UDP header of a datagram carrying `roce_len` bytes, with the
/// given checksum value.
pub(super) fn udp_header(ports: UdpPorts, roce_len: usize, checksum: u16) -> [u8; UDP_HEADER_LEN] {
    let [s0, s1] = ports.src.to_be_bytes();
    let [d0, d1] = ports.dst.to_be_bytes();
    let [l0, l1] = length_field(UDP_HEADER_LEN, roce_len).to_be_bytes();
    let [c0, c1] = checksum.to_be_bytes();
    [s0, s1, d0, d1, l0, l1, c0, c1]
}

/// The 40 bytes a UD receive buffer starts with, for a packet of
/// `roce_len` bytes (BTH through ICRC) that arrived with `ip` and
/// `variant`.
///
/// As rxe and mlx5 deliver it: for IPv6 the IPv6 header; for IPv4, 20 zero
/// bytes then the IPv4 header. The IPv4 checksum is valid, because
/// `ibv_init_ah_from_wc` (and the kernel's `ib_get_rdma_header_version`)
/// tell IPv4 from IPv6 by checking it.
pub fn grh_bytes(ip: &IpPseudoHeader, variant: &IpVariantFields, roce_len: usize) -> [u8; GRH_LEN] {
    match *ip {
        IpPseudoHeader::V4 {
            src,
            dst,
            id,
            dont_fragment,
        } => {
            let mut grh = [0u8; GRH_LEN];
            let header = ipv4_header(src, dst, id, dont_fragment, variant, roce_len);
            grh[GRH_LEN - IPV4_HEADER_LEN..].copy_from_slice(&header);
            grh
        }
        IpPseudoHeader::V6 { src, dst } => ipv6_header(src, dst, variant, roce_len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_matches_a_captured_one() {
        // IPv4 header of a RoCEv2 CNP captured on a ConnectX-4 Lx (the
        // frame is in icrc.rs's tests): TOS 0xc2, id 0x718c, DF, TTL 64,
        // 10.0.17.1 -> 10.0.18.1, total length 60, checksum 0x9161.
        let expected = [
            0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00,
            0x12, 0x01,
        ];
        let variant = IpVariantFields {
            traffic_class: 0xc2,
            hop_limit: 64,
            flow_label: 0,
        };
        let header = ipv4_header(
            Ipv4Addr::new(10, 0, 17, 1),
            Ipv4Addr::new(10, 0, 18, 1),
            0x718c,
            true,
            &variant,
            32,
        );
        assert_eq!(header, expected);
    }

    #[test]
    fn grh_v4_is_zeros_then_ipv4_header() {
        let ip = IpPseudoHeader::V4 {
            src: Ipv4Addr::new(192, 168, 0, 1),
            dst: Ipv4Addr::new(192, 168, 0, 2),
            id: 7,
            dont_fragment: true,
        };
        let grh = grh_bytes(&ip, &IpVariantFields::default(), 100);
        assert_eq!(&grh[..20], &[0u8; 20]);
        assert_eq!(grh[20], 0x45);
        assert_eq!(u16::from_be_bytes([grh[22], grh[23]]), 128);
        // A valid header sums to 0xffff (checksum field included).
        let header: [u8; 20] = grh[20..].try_into().unwrap();
        assert_eq!(ipv4_checksum(&header), 0);
    }

    #[test]
    fn grh_v6_is_the_ipv6_header() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::2".parse().unwrap();
        let variant = IpVariantFields {
            traffic_class: 0xab,
            hop_limit: 3,
            flow_label: 0x12345,
        };
        let grh = grh_bytes(&IpPseudoHeader::V6 { src, dst }, &variant, 32);
        assert_eq!(&grh[..4], &[0x6a, 0xb1, 0x23, 0x45]);
        assert_eq!(&grh[4..8], &[0, 40, 17, 3]);
        assert_eq!(&grh[8..24], &src.octets());
        assert_eq!(&grh[24..], &dst.octets());
    }

    #[test]
    fn oversized_lengths_saturate() {
        let ip = IpPseudoHeader::V4 {
            src: Ipv4Addr::LOCALHOST,
            dst: Ipv4Addr::LOCALHOST,
            id: 0,
            dont_fragment: false,
        };
        let grh = grh_bytes(&ip, &IpVariantFields::default(), usize::MAX);
        assert_eq!(&grh[22..24], &[0xff, 0xff]);
        assert_eq!(udp_header(UdpPorts { src: 1, dst: 2 }, 70_000, 0)[4..6], [0xff, 0xff]);
        assert_eq!(ip.header_len(), 20);
    }
}
