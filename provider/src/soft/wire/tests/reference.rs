//! Independent reference implementations used to cross-check the wire code:
//! a bit-at-a-time CRC-32 and an ICRC computed from a whole IP datagram the
//! way rxe_icrc.c does (copy the headers, overwrite the variant fields).

/// CRC-32 (IEEE 802.3, reflected, init and final XOR all ones), one bit at a
/// time: slow, obviously correct, and shares no code with crc32fast.
pub(super) fn crc32_bitwise(data: &[u8]) -> u32 {
    const POLY_REFLECTED: u32 = 0xedb8_8320;
    let mut crc = u32::MAX;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The ICRC of a datagram that starts with its IP header (IPv4 without
/// options, or IPv6) and ends with the ICRC, computed from the datagram's
/// own header bytes.
pub(super) fn reference_icrc(datagram: &[u8]) -> u32 {
    let ip_len = if datagram[0] >> 4 == 6 { 40 } else { 20 };
    let mut data = vec![0xffu8; 8];
    let mut ip = datagram[..ip_len].to_vec();
    if ip_len == 40 {
        ip[0] |= 0x0f; // traffic class, high nibble
        ip[1] = 0xff; // traffic class, low nibble, and flow label
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff; // hop limit
    } else {
        ip[1] = 0xff; // TOS
        ip[8] = 0xff; // TTL
        ip[10] = 0xff; // header checksum
        ip[11] = 0xff;
    }
    data.extend_from_slice(&ip);
    let mut udp = datagram[ip_len..ip_len + 8].to_vec();
    udp[6] = 0xff;
    udp[7] = 0xff;
    data.extend_from_slice(&udp);
    let mut transport = datagram[ip_len + 8..datagram.len() - 4].to_vec();
    transport[4] = 0xff; // FECN, BECN, resv6
    data.extend_from_slice(&transport);
    crc32_bitwise(&data)
}

/// Variant IP fields a reference datagram is built with.
#[derive(Clone, Copy)]
pub(super) struct Variant {
    pub(super) tos: u8,
    pub(super) ttl: u8,
    pub(super) flow_label: u32,
    pub(super) ip_checksum: u16,
    pub(super) udp_checksum: u16,
}

pub(super) const PLAIN: Variant = Variant {
    tos: 0,
    ttl: 64,
    flow_label: 0,
    ip_checksum: 0,
    udp_checksum: 0,
};

/// An IPv4 + UDP datagram around `roce` (BTH through ICRC), built byte by
/// byte without the code under test. The IP checksum is whatever `variant`
/// says (the ICRC masks it).
pub(super) fn datagram_v4(
    src: [u8; 4],
    dst: [u8; 4],
    id: u16,
    dont_fragment: bool,
    ports: (u16, u16),
    variant: Variant,
    roce: &[u8],
) -> Vec<u8> {
    let total = (20 + 8 + roce.len()) as u16;
    let mut d = vec![0x45, variant.tos];
    d.extend_from_slice(&total.to_be_bytes());
    d.extend_from_slice(&id.to_be_bytes());
    d.extend_from_slice(&(if dont_fragment { 0x4000u16 } else { 0 }).to_be_bytes());
    d.extend_from_slice(&[variant.ttl, 17]);
    d.extend_from_slice(&variant.ip_checksum.to_be_bytes());
    d.extend_from_slice(&src);
    d.extend_from_slice(&dst);
    push_udp(&mut d, ports, variant, roce);
    d
}

/// An IPv6 + UDP datagram around `roce`, built byte by byte.
pub(super) fn datagram_v6(
    src: [u8; 16],
    dst: [u8; 16],
    ports: (u16, u16),
    variant: Variant,
    hop_limit: u8,
    roce: &[u8],
) -> Vec<u8> {
    let word = (6u32 << 28) | (u32::from(variant.tos) << 20) | (variant.flow_label & 0xf_ffff);
    let mut d = word.to_be_bytes().to_vec();
    d.extend_from_slice(&((8 + roce.len()) as u16).to_be_bytes());
    d.extend_from_slice(&[17, hop_limit]);
    d.extend_from_slice(&src);
    d.extend_from_slice(&dst);
    push_udp(&mut d, ports, variant, roce);
    d
}

fn push_udp(d: &mut Vec<u8>, ports: (u16, u16), variant: Variant, roce: &[u8]) {
    d.extend_from_slice(&ports.0.to_be_bytes());
    d.extend_from_slice(&ports.1.to_be_bytes());
    d.extend_from_slice(&((8 + roce.len()) as u16).to_be_bytes());
    d.extend_from_slice(&variant.udp_checksum.to_be_bytes());
    d.extend_from_slice(roce);
}

#[test]
fn bitwise_crc_matches_the_standard_check_value_and_crc32fast() {
    assert_eq!(crc32_bitwise(b"123456789"), 0xcbf4_3926);
    let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    for len in [0, 1, 7, 8, 9, 63, 64, 65, 1000] {
        assert_eq!(crc32_bitwise(&data[..len]), crc32fast::hash(&data[..len]));
    }
}
