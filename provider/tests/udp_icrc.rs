//! The ICRC of packets a UDP device emits, checked against an independent
//! computation (a bitwise CRC-32 over headers built here from the RoCEv2
//! annex, not the crate's `wire` module), for IPv4 and IPv6; and packets
//! whose ICRC was computed here are accepted by the device.

mod udp_common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::addr;
use softverbs::verbs::*;
use udp_common::*;

/// CRC-32 (IEEE 802.3, reflected, init and final XOR all ones), one bit at
/// a time.
fn crc32_bitwise(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The ICRC of `udp_payload` (BTH … ICRC) sent from `src` to `dst`, as
/// the RoCEv2 annex (A17.8) defines it: 8 bytes of ones for the LRH, the IP
/// header with its variant fields set to ones (IPv4 TOS, TTL, checksum;
/// IPv6 traffic class, flow label, hop limit), the UDP header with its
/// checksum set to ones, the BTH with its reserved byte 4 set to ones, and
/// the rest of the packet. IPv4 is the header an unconnected socket with
/// `IP_PMTUDISC_DO` sends: identification 0, DF.
fn independent_icrc(src: SocketAddr, dst: SocketAddr, udp_payload: &[u8]) -> u32 {
    let body = &udp_payload[..udp_payload.len() - 4];
    let udp_len = (8 + udp_payload.len()) as u16;
    let mut m = vec![0xffu8; 8];
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = 20 + udp_len;
            m.extend_from_slice(&[0x45, 0xff]);
            m.extend_from_slice(&total.to_be_bytes());
            m.extend_from_slice(&[0x00, 0x00, 0x40, 0x00, 0xff, 17, 0xff, 0xff]);
            m.extend_from_slice(&s.octets());
            m.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            m.extend_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
            m.extend_from_slice(&udp_len.to_be_bytes());
            m.extend_from_slice(&[17, 0xff]);
            m.extend_from_slice(&s.octets());
            m.extend_from_slice(&d.octets());
        }
        _ => unreachable!(),
    }
    m.extend_from_slice(&src.port().to_be_bytes());
    m.extend_from_slice(&dst.port().to_be_bytes());
    m.extend_from_slice(&udp_len.to_be_bytes());
    m.extend_from_slice(&[0xff, 0xff]);
    let mut bth = body[..12].to_vec();
    bth[4] = 0xff;
    m.extend_from_slice(&bth);
    m.extend_from_slice(&body[12..]);
    crc32_bitwise(&m)
}

fn check_emitted(ip: IpAddr) {
    let dev = device(ip, EngineMode::Inline);
    let peer = UdpSocket::bind((ip, free_private_port(ip))).unwrap();
    peer.set_read_timeout(Some(WAIT)).unwrap();
    let s = side(&dev, 8192, 0x100);
    connect_to(&s, addr::gid_of(peer.local_addr().unwrap()), 0x55, 0x200, Mtu::Mtu1024);
    let dev_ep = addr::endpoint_of(dev.gids()[0], Some(std::net::Ipv6Addr::LOCALHOST)).unwrap();
    // A send (one packet), an inline send, and a 3-packet RDMA write.
    s.mr.fill(0, 8192, 0xa5).unwrap();
    let sge = [s.mr.sge(0, 3000).unwrap()];
    let small = [s.mr.sge(0, 5).unwrap()];
    let remote = RemoteAddr {
        addr: 0x1000,
        rkey: 0x77,
    };
    s.qp.post_send(&[
        SendWr::new(1, SendOp::Send, &small),
        SendWr::new(2, SendOp::Send, &[Sge::inline(b"inline!")]).flags(SendFlags::INLINE),
        SendWr::new(3, SendOp::Write { remote }, &sge),
    ])
    .unwrap();
    let mut buf = [0u8; 9000];
    for i in 0..5 {
        let (n, from) = peer.recv_from(&mut buf).expect("a packet from the device");
        assert_eq!(from, dev_ep, "the source is the device's socket");
        let icrc = u32::from_le_bytes(buf[n - 4..n].try_into().unwrap());
        let want = independent_icrc(from, peer.local_addr().unwrap(), &buf[..n]);
        assert_eq!(
            icrc, want,
            "packet {i} ({n} bytes): ICRC {icrc:08x}, independent {want:08x}"
        );
    }
}

#[test]
fn emitted_icrc_matches_an_independent_computation_ipv4() {
    check_emitted(LO4);
}

#[test]
fn emitted_icrc_matches_an_independent_computation_ipv6() {
    check_emitted(LO6);
}

/// A packet built by hand, with the ICRC computed here, is accepted: the
/// RDMA WRITE lands.
#[test]
fn independently_checksummed_packets_are_accepted() {
    let dev = device(LO4, EngineMode::Inline);
    let peer = UdpSocket::bind((LO4, free_private_port(LO4))).unwrap();
    let s = side(&dev, 4096, 0x100);
    connect_to(&s, addr::gid_of(peer.local_addr().unwrap()), 0x55, 0x200, Mtu::Mtu1024);
    let dev_ep = addr::endpoint_of(dev.gids()[0], None).unwrap();
    // RC RDMA WRITE Only (opcode 0x0a): BTH, RETH, 8 bytes, ICRC.
    let qpn = s.qp.qp_num();
    let mut p = vec![0x0a, 0x00, 0xff, 0xff, 0x00];
    p.extend_from_slice(&qpn.to_be_bytes()[1..]);
    p.extend_from_slice(&[0x80, 0x00, 0x02, 0x00]); // ack request, PSN 0x200
    p.extend_from_slice(&(s.mr.addr() + 64).to_be_bytes());
    p.extend_from_slice(&s.mr.rkey().to_be_bytes());
    p.extend_from_slice(&8u32.to_be_bytes());
    p.extend_from_slice(b"handmade");
    p.extend_from_slice(&[0; 4]);
    let n = p.len();
    let icrc = independent_icrc(peer.local_addr().unwrap(), dev_ep, &p);
    p[n - 4..].copy_from_slice(&icrc.to_le_bytes());
    peer.send_to(&p, dev_ep).unwrap();
    eventually("the handmade write", || {
        let _ = s.scq.poll(&mut []);
        s.mr.to_vec(64, 8).unwrap() == b"handmade"
    });
    // And the device acknowledges it with a correct ICRC of its own.
    peer.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 256];
    let (n, from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(buf[0], 0x11, "RC Acknowledge");
    let icrc = u32::from_le_bytes(buf[n - 4..n].try_into().unwrap());
    assert_eq!(icrc, independent_icrc(from, peer.local_addr().unwrap(), &buf[..n]));
    assert_eq!(dev.shared().counters().rx_bad_icrc, 0);
}
