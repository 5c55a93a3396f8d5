//! ICRC against captured packets, other implementations and the bitwise
//! reference; masking and single-bit sensitivity.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::super::*;
use super::reference::{datagram_v4, datagram_v6, reference_icrc, Variant, PLAIN};

const ETHERNET_HEADER_LEN: usize = 14;

/// A RoCEv2 CNP as captured on a Mellanox ConnectX-4 Lx, Ethernet header
/// included: the ICRC (last four bytes) was computed by the NIC. Published
/// in Scapy's test suite (test/contrib/roce.uts, "RoCE CNP captured on
/// ConnectX-4 Lx").
const CONNECTX4_CNP_FRAME: [u8; 74] = [
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, // eth
    0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12,
    0x01, // IPv4, TOS 0xc2 (ECN CE), id 0x718c, DF
    0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // UDP 0 -> 4791
    0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, // BTH, BECN
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, // CNP reserved
    0x82, 0xfd, 0x00, 0x2a, // ICRC
];

#[test]
fn matches_a_connectx4_captured_cnp() {
    let datagram = &CONNECTX4_CNP_FRAME[ETHERNET_HEADER_LEN..];
    let roce = &datagram[IPV4_HEADER_LEN + UDP_HEADER_LEN..];
    let expected = u32::from_le_bytes([0x82, 0xfd, 0x00, 0x2a]);
    assert_eq!(reference_icrc(datagram), expected);

    let ip = IpPseudoHeader::V4 {
        src: Ipv4Addr::new(10, 0, 17, 1),
        dst: Ipv4Addr::new(10, 0, 18, 1),
        id: 0x718c,
        dont_fragment: true,
    };
    let ports = UdpPorts {
        src: 0,
        dst: ROCEV2_UDP_PORT,
    };
    assert_eq!(compute_icrc(&ip, ports, &roce[..roce.len() - 4]), expected);
    assert!(check_icrc(&ip, ports, roce));
    let mut refilled = roce.to_vec();
    refilled[28..].fill(0);
    fill_icrc(&ip, ports, &mut refilled).unwrap();
    assert_eq!(refilled, roce);
    assert_eq!(Packet::parse(roce).err(), Some(WireError::CongestionNotification));
}

/// UC SEND_ONLY from Scapy's RoCE tests (test/contrib/roce.uts, "RoCE
/// layer"): M set, pad count 2, QP 211, PSN 13571856; ICRC computed by
/// Scapy's implementation (an independent one, not hardware).
const SCAPY_UC_SEND_ONLY: [u8; 64] = [
    0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00, 0x07, 0xc0, 0xa8, 0x00,
    0x07, // IPv4
    0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2, // UDP 49152 -> 4791
    0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10, // BTH
    0x46, 0x30, 0x81, 0x8b, 0xe2, 0x89, 0x35, 0xd9, 0x0e, 0x9a, 0x95, 0x50, 0x54, 0x01, 0xbe, 0x88, 0x5e,
    0x50, // payload (18 bytes)
    0x00, 0x00, // pad
    0x78, 0xf3, 0x53, 0xf3, // ICRC
];

#[test]
fn matches_scapy_uc_send_only() {
    let datagram = &SCAPY_UC_SEND_ONLY;
    let roce = &datagram[28..];
    let ip = IpPseudoHeader::V4 {
        src: Ipv4Addr::new(192, 168, 0, 7),
        dst: Ipv4Addr::new(192, 168, 0, 7),
        id: 1144,
        dont_fragment: true,
    };
    let ports = UdpPorts {
        src: 49152,
        dst: ROCEV2_UDP_PORT,
    };
    assert!(check_icrc(&ip, ports, roce));
    assert_eq!(reference_icrc(datagram), u32::from_le_bytes([0x78, 0xf3, 0x53, 0xf3]));

    let packet = Packet::parse(roce).unwrap();
    let bth = packet.headers.bth;
    assert_eq!(bth.opcode, Opcode::UcSendOnly);
    assert!(bth.mig_req && !bth.solicited && !bth.ack_req);
    assert_eq!(bth.pad_count, 2);
    assert_eq!(bth.dest_qpn, Qpn::new(211));
    assert_eq!(bth.psn, Psn::new(13_571_856));
    assert_eq!(packet.payload, &roce[12..30]);
    assert_eq!(packet.icrc, compute_icrc(&ip, ports, &roce[..roce.len() - 4]));

    let mut out = [0u8; 36];
    assert_eq!(packet.headers.emit(packet.payload, &mut out), Ok(36));
    fill_icrc(&ip, ports, &mut out).unwrap();
    assert_eq!(&out[..], roce);

    // Our IPv4 header builder reproduces Scapy's, checksum included.
    let variant = IpVariantFields {
        traffic_class: 1,
        hop_limit: 64,
        flow_label: 0,
    };
    assert_eq!(grh_bytes(&ip, &variant, roce.len())[20..], datagram[..20]);
}

/// RC RDMA_WRITE_ONLY of 128 bytes of 0xff from open-rdma's driver tests
/// (datenlord/open-rdma-driver, `test_icrc_computing`): no DF, P_Key 0;
/// ICRC from that project's own implementation.
#[test]
fn matches_open_rdma_write_only() {
    let mut roce = vec![
        0x0a, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x80, 0x00, 0x00, 0x00, // BTH
        0x00, 0x00, 0x7f, 0x7e, 0x91, 0x00, 0x00, 0x00, 0x01, 0x70, 0x9a, 0x33, 0x00, 0x00, 0x00, 0x80, // RETH
    ];
    roce.extend_from_slice(&[0xff; 128]);
    roce.extend_from_slice(&[0xc6, 0x87, 0x22, 0x98]);
    let ip = IpPseudoHeader::V4 {
        src: Ipv4Addr::new(192, 168, 0, 2),
        dst: Ipv4Addr::new(192, 168, 0, 3),
        id: 1,
        dont_fragment: false,
    };
    let ports = UdpPorts {
        src: ROCEV2_UDP_PORT,
        dst: ROCEV2_UDP_PORT,
    };
    assert!(check_icrc(&ip, ports, &roce));
    let packet = Packet::parse(&roce).unwrap();
    assert_eq!(packet.headers.bth.opcode, Opcode::RcRdmaWriteOnly);
    assert_eq!(packet.headers.bth.pkey, Pkey::new(0));
    assert_eq!(packet.headers.reth.unwrap().dma_len, 128);
    assert_eq!(packet.payload.len(), 128);
}

fn sample_packet() -> Vec<u8> {
    let mut headers = PacketRepr::new(BthRepr::new(
        Opcode::RcRdmaWriteOnlyWithImmediate,
        Qpn::new(0x00_1234),
        Psn::new(0x00_abcd),
    ));
    headers.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x0102_0304,
        dma_len: 9,
    });
    headers.immdt = Some(ImmDtRepr::from_be_value(0xcafe_babe));
    let mut buf = vec![0u8; 64];
    let len = headers.emit(b"abcdefghi", &mut buf).unwrap();
    buf.truncate(len);
    buf
}

fn v4() -> IpPseudoHeader {
    IpPseudoHeader::V4 {
        src: Ipv4Addr::new(10, 1, 2, 3),
        dst: Ipv4Addr::new(10, 4, 5, 6),
        id: 0x5a5a,
        dont_fragment: true,
    }
}

fn v6() -> IpPseudoHeader {
    IpPseudoHeader::V6 {
        src: "2001:db8::1".parse().unwrap(),
        dst: "2001:db8::2".parse().unwrap(),
    }
}

const PORTS: UdpPorts = UdpPorts {
    src: 0xc123,
    dst: ROCEV2_UDP_PORT,
};

#[test]
fn agrees_with_the_reference_on_both_ip_versions_whatever_the_variant_fields() {
    let mut roce = sample_packet();
    fill_icrc(&v4(), PORTS, &mut roce).unwrap();
    let v6_src: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let v6_dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
    let variants = [
        PLAIN,
        Variant {
            tos: 0xff,
            ttl: 1,
            flow_label: 0xf_ffff,
            ip_checksum: 0xbeef,
            udp_checksum: 0x1234,
        },
        Variant {
            tos: 0x03,
            ttl: 255,
            flow_label: 0x1_2345,
            ip_checksum: 0xffff,
            udp_checksum: 0xffff,
        },
    ];
    let expect_v4 = compute_icrc(&v4(), PORTS, &roce[..roce.len() - 4]);
    let expect_v6 = compute_icrc(&v6(), PORTS, &roce[..roce.len() - 4]);
    assert_ne!(expect_v4, expect_v6);
    for variant in variants {
        let d4 = datagram_v4(
            [10, 1, 2, 3],
            [10, 4, 5, 6],
            0x5a5a,
            true,
            (PORTS.src, PORTS.dst),
            variant,
            &roce,
        );
        assert_eq!(reference_icrc(&d4), expect_v4);
        for hop_limit in [0, 1, 64, 255] {
            let d6 = datagram_v6(
                v6_src.octets(),
                v6_dst.octets(),
                (PORTS.src, PORTS.dst),
                variant,
                hop_limit,
                &roce,
            );
            assert_eq!(reference_icrc(&d6), expect_v6);
        }
    }
    // FECN / BECN / reserved bits of BTH byte 4 are masked too.
    let mut roce6 = roce.clone();
    fill_icrc(&v6(), PORTS, &mut roce6).unwrap();
    for byte4 in [0x00, 0x80, 0x40, 0x3f, 0xff] {
        let mut marked = roce.clone();
        marked[4] = byte4;
        assert!(check_icrc(&v4(), PORTS, &marked));
        let mut marked6 = roce6.clone();
        marked6[4] = byte4;
        assert!(check_icrc(&v6(), PORTS, &marked6));
        assert!(!check_icrc(&v6(), PORTS, &marked));
    }
}

#[test]
fn every_single_bit_flip_outside_masked_bits_changes_the_icrc() {
    let roce = sample_packet();
    for ip in [v4(), v6()] {
        let body = &roce[..roce.len() - 4];
        let base = compute_icrc(&ip, PORTS, body);
        for byte in 0..body.len() {
            for bit in 0..8 {
                let mut flipped = body.to_vec();
                flipped[byte] ^= 1 << bit;
                let changed = compute_icrc(&ip, PORTS, &flipped) != base;
                assert_eq!(changed, byte != 4, "byte {byte} bit {bit}");
            }
        }
    }
}

#[test]
fn addresses_ports_and_ipv4_id_are_covered() {
    let body = sample_packet();
    let body = &body[..body.len() - 4];
    let base = compute_icrc(&v4(), PORTS, body);
    let IpPseudoHeader::V4 { src, dst, id, .. } = v4() else {
        unreachable!()
    };
    for bit in 0..32 {
        let other_src = Ipv4Addr::from(u32::from(src) ^ (1 << bit));
        let ip = IpPseudoHeader::V4 {
            src: other_src,
            dst,
            id,
            dont_fragment: true,
        };
        assert_ne!(compute_icrc(&ip, PORTS, body), base);
    }
    for bit in 0..16 {
        let ip = IpPseudoHeader::V4 {
            src,
            dst,
            id: id ^ (1 << bit),
            dont_fragment: true,
        };
        assert_ne!(compute_icrc(&ip, PORTS, body), base);
        let ports = UdpPorts {
            src: PORTS.src ^ (1 << bit),
            dst: PORTS.dst,
        };
        assert_ne!(compute_icrc(&v4(), ports, body), base);
    }
    let no_df = IpPseudoHeader::V4 {
        src,
        dst,
        id,
        dont_fragment: false,
    };
    assert_ne!(compute_icrc(&no_df, PORTS, body), base);
    let base6 = compute_icrc(&v6(), PORTS, body);
    let IpPseudoHeader::V6 { src, dst } = v6() else {
        unreachable!()
    };
    for bit in 0..128 {
        let ip = IpPseudoHeader::V6 {
            src,
            dst: Ipv6Addr::from(u128::from(dst) ^ (1 << bit)),
        };
        assert_ne!(compute_icrc(&ip, PORTS, body), base6);
    }
}

#[test]
fn short_inputs_never_panic() {
    for len in 0..MIN_PACKET_LEN {
        let mut buf = vec![0xa5u8; len];
        assert_eq!(fill_icrc(&v4(), PORTS, &mut buf), Err(WireError::Truncated));
        assert_eq!(buf, vec![0xa5u8; len]);
        assert!(!check_icrc(&v6(), PORTS, &buf));
        // compute_icrc accepts anything, even a partial BTH.
        let _ = compute_icrc(&v4(), PORTS, &buf);
    }
}

/// One `IcrcPrefix` kept across a sequence of packets of changing flows,
/// ports and lengths (and repeating ones, which start from the kept
/// state) gives exactly `compute_icrc` for each, and `fill`/`check` agree
/// with `fill_icrc`/`check_icrc`.
#[test]
fn a_kept_prefix_gives_the_same_icrc() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let flow = (0u8..4, any::<bool>(), 0u16..3, 0usize..80, any::<u64>());
    let mut runner = TestRunner::new(Config::with_cases(64));
    runner
        .run(&proptest::collection::vec(flow, 1..40), |packets| {
            let mut kept = IcrcPrefix::default();
            for (host, v6, port, len, seed) in packets {
                let ip = if v6 {
                    IpPseudoHeader::V6 {
                        src: Ipv6Addr::LOCALHOST,
                        dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(host)),
                    }
                } else {
                    IpPseudoHeader::V4 {
                        src: Ipv4Addr::new(127, 0, 0, 1),
                        dst: Ipv4Addr::new(127, 0, 0, host),
                        id: 0,
                        dont_fragment: true,
                    }
                };
                let ports = UdpPorts {
                    src: 0xc000 + port,
                    dst: ROCEV2_UDP_PORT,
                };
                // Twice per flow and length, with other bytes: the second
                // starts from the kept state.
                for round in 0..2u8 {
                    let body: Vec<u8> = (0..len).map(|k| (seed >> (k % 57)) as u8 ^ k as u8 ^ round).collect();
                    prop_assert_eq!(kept.compute(&ip, ports, &body), compute_icrc(&ip, ports, &body));
                }
                let body: Vec<u8> = (0..len).map(|k| (seed >> (k % 57)) as u8 ^ k as u8).collect();
                let mut packet = body.clone();
                packet.extend_from_slice(&[0; ICRC_LEN]);
                let mut expected = packet.clone();
                let filled = kept.fill(&ip, ports, &mut packet).is_ok();
                prop_assert_eq!(filled, fill_icrc(&ip, ports, &mut expected).is_ok());
                prop_assert_eq!(&packet, &expected);
                prop_assert_eq!(kept.check(&ip, ports, &packet), check_icrc(&ip, ports, &packet));
                prop_assert_eq!(kept.check(&ip, ports, &packet), filled);
            }
            Ok(())
        })
        .unwrap();
}
