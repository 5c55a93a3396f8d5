//! Hostile network input: crafted UDP datagrams sent at a soft device from
//! a plain socket. Each is dropped and counted, and none writes outside
//! the memory a remote peer was granted.
//!
//! The victim QP is connected to the attacker's own socket (a malicious
//! peer that knows the QPN, PSN and rkey), so that packets also get past
//! the source check and reach the PSN, opcode, rkey and bounds checks;
//! spoofed sources are tried from other ports.

mod udp_common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::udp::addr;
use softverbs::soft::proto::Counters;
use softverbs::soft::wire::*;
use softverbs::soft::SoftDevice;
use softverbs::verbs::*;
use udp_common::*;

/// The first PSN the victim expects from the attacker (its `rq_psn`).
const PSN0: u32 = 0x3000;

struct Victim {
    dev: Arc<SoftDevice>,
    side: Side,
    /// Registered without remote access: must never change.
    private: Mr,
    ep: SocketAddr,
}

struct Attacker {
    sock: UdpSocket,
}

impl Attacker {
    fn new() -> Attacker {
        let sock = UdpSocket::bind((LO4, free_private_port(LO4))).unwrap();
        Attacker { sock }
    }

    fn gid(&self) -> Gid {
        addr::gid_of(self.sock.local_addr().unwrap())
    }

    /// Sends `h` + `payload` with a correct ICRC for this socket's headers.
    fn send(&self, to: SocketAddr, h: &PacketRepr, payload: &[u8]) {
        self.send_from(&self.sock, to, h, payload);
    }

    fn send_from(&self, sock: &UdpSocket, to: SocketAddr, h: &PacketRepr, payload: &[u8]) {
        let mut buf = vec![0u8; h.packet_len(payload.len())];
        h.emit(payload, &mut buf).unwrap();
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (sock.local_addr().unwrap().ip(), to.ip()) else {
            unreachable!()
        };
        let ip = IpPseudoHeader::V4 {
            src,
            dst,
            id: 0,
            dont_fragment: true,
        };
        let ports = UdpPorts {
            src: sock.local_addr().unwrap().port(),
            dst: to.port(),
        };
        fill_icrc(&ip, ports, &mut buf).unwrap();
        sock.send_to(&buf, to).unwrap();
    }

    fn raw(&self, to: SocketAddr, bytes: &[u8]) {
        self.sock.send_to(bytes, to).unwrap();
    }
}

fn victim(att: &Attacker) -> Victim {
    let dev = device(LO4, EngineMode::Inline);
    let side = side(&dev, 4096, 0x2000);
    let private = side.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    private.fill(0, 4096, 0xee).unwrap();
    side.mr.fill(0, 4096, 0x11).unwrap();
    connect_to(&side, att.gid(), 0x77, PSN0, Mtu::Mtu1024);
    // The victim's responder expects PSN0.
    let attr = side.qp.query().unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
    let ep = addr::endpoint_of(dev.gids()[0], None).unwrap();
    let _ = PSN0;
    Victim { dev, side, private, ep }
}

fn write_only(v: &Victim, psn: u32, va: u64, rkey: u32, len: u32) -> PacketRepr {
    let mut h = PacketRepr::new(BthRepr::new(
        Opcode::RcRdmaWriteOnly,
        Qpn::new(v.side.qp.qp_num()),
        Psn::new(psn),
    ));
    h.bth.ack_req = true;
    h.reth = Some(RethRepr { va, rkey, dma_len: len });
    h
}

/// Lets the victim's engine read and handle everything sent so far.
fn settle(v: &Victim) -> Counters {
    // Inline mode: polling is what reads the socket.
    let _ = collect(&v.side.scq, &[&v.side.rcq], Duration::from_millis(50));
    v.dev.shared().counters()
}

fn memory_intact(v: &Victim, written: Option<(usize, usize, u8)>) {
    let mine = v.side.mr.to_vec(0, 4096).unwrap();
    for (i, b) in mine.iter().enumerate() {
        let expect = match written {
            Some((off, len, byte)) if (off..off + len).contains(&i) => byte,
            _ => 0x11,
        };
        assert_eq!(*b, expect, "remote MR byte {i}");
    }
    assert_eq!(
        v.private.to_vec(0, 4096).unwrap(),
        vec![0xee; 4096],
        "private MR changed"
    );
}

#[test]
fn malformed_datagrams_are_dropped_and_counted() {
    let att = Attacker::new();
    let v = victim(&att);
    let before = settle(&v);
    // Truncated: shorter than a BTH + ICRC.
    att.raw(v.ep, &[0x0a; 10]);
    att.raw(v.ep, &[]);
    // Oversized: longer than any RoCEv2 packet at MTU 4096.
    att.raw(v.ep, &vec![0u8; 6000]);
    // A good packet with its ICRC broken.
    let h = write_only(&v, PSN0, v.side.mr.addr(), v.side.mr.rkey(), 16);
    let mut buf = vec![0u8; h.packet_len(16)];
    h.emit(&[0x42; 16], &mut buf).unwrap();
    att.raw(v.ep, &buf); // ICRC all zero
                         // Garbage with a valid length and a matching ICRC: fails the parse.
    let mut junk = vec![0xffu8; 64];
    let ip = IpPseudoHeader::V4 {
        src: std::net::Ipv4Addr::LOCALHOST,
        dst: std::net::Ipv4Addr::LOCALHOST,
        id: 0,
        dont_fragment: true,
    };
    let ports = UdpPorts {
        src: att.sock.local_addr().unwrap().port(),
        dst: v.ep.port(),
    };
    fill_icrc(&ip, ports, &mut junk).unwrap();
    att.raw(v.ep, &junk);
    let c = settle(&v);
    let stats = v.dev.shared().link_stats();
    let stat = |n: &str| stats.iter().find(|(k, _)| *k == n).unwrap().1;
    assert_eq!(stat("udp_rx_truncated"), 2, "{stats:?}");
    assert_eq!(stat("udp_rx_oversized"), 1, "{stats:?}");
    assert_eq!(stat("udp_rx_bad_icrc"), 1, "{stats:?}");
    assert_eq!(c.rx_bad_icrc - before.rx_bad_icrc, 1);
    assert!(c.rx_malformed - before.rx_malformed > 3, "{c:?}");
    assert_eq!(c.rx_packets - before.rx_packets, 5);
    memory_intact(&v, None);
    assert_eq!(v.side.qp.query().unwrap().qp_state, QpState::Rts);
}

#[test]
fn spoofed_sources_and_unknown_qps_are_dropped() {
    let att = Attacker::new();
    let v = victim(&att);
    let before = settle(&v);
    // Right QPN, PSN and rkey, but from another port (another private GID)
    // and from the entropy range (the standard GID of 127.0.0.1).
    let other = UdpSocket::bind((LO4, free_private_port(LO4))).unwrap();
    let entropy = (0xc000..=0xffffu16)
        .find_map(|p| UdpSocket::bind((LO4, p)).ok())
        .expect("an entropy-range port");
    let h = write_only(&v, PSN0, v.side.mr.addr(), v.side.mr.rkey(), 64);
    att.send_from(&other, v.ep, &h, &[0x42; 64]);
    att.send_from(&entropy, v.ep, &h, &[0x42; 64]);
    // Unknown destination QPs.
    let mut bad_qp = h;
    bad_qp.bth.dest_qpn = Qpn::new(0x00ab_cdef);
    att.send(v.ep, &bad_qp, &[0x42; 64]);
    bad_qp.bth.dest_qpn = Qpn::new(0);
    att.send(v.ep, &bad_qp, &[0x42; 64]);
    let c = settle(&v);
    assert_eq!(c.rx_bad_source - before.rx_bad_source, 2, "{c:?}");
    assert_eq!(c.rx_unknown_qp - before.rx_unknown_qp, 2, "{c:?}");
    memory_intact(&v, None);
    assert_eq!(v.side.qp.query().unwrap().qp_state, QpState::Rts);
}

#[test]
fn out_of_window_psns_do_not_write() {
    let att = Attacker::new();
    let v = victim(&att);
    let before = settle(&v);
    let (addr, rkey) = (v.side.mr.addr(), v.side.mr.rkey());
    // Ahead of the expected PSN (a gap): NAK sequence error, no write.
    att.send(v.ep, &write_only(&v, PSN0 + 5, addr, rkey, 32), &[0x42; 32]);
    // Far behind (outside the duplicate window) and just behind: not
    // executed again.
    att.send(
        v.ep,
        &write_only(&v, PSN0.wrapping_sub(0x40_0000) & PSN_MASK, addr, rkey, 32),
        &[0x43; 32],
    );
    att.send(v.ep, &write_only(&v, PSN0 - 1, addr, rkey, 32), &[0x44; 32]);
    let c = settle(&v);
    let dropped = (c.rx_out_of_sequence - before.rx_out_of_sequence) + (c.rx_duplicates - before.rx_duplicates);
    assert!(dropped >= 3, "{c:?}");
    memory_intact(&v, None);
    // The expected PSN still works: the one legitimate write lands.
    att.send(v.ep, &write_only(&v, PSN0, addr + 100, rkey, 8), &[0x99; 8]);
    let c2 = settle(&v);
    assert!(c2.tx_responses > c.tx_responses || c2.rx_packets > c.rx_packets);
    eventually("the in-window write", || {
        let _ = settle(&v);
        v.side.mr.to_vec(100, 8).unwrap() == vec![0x99; 8]
    });
    memory_intact(&v, Some((100, 8, 0x99)));
    // A middle packet without a first, at the expected PSN: an invalid
    // request (NAK, QP to ERR), never a write.
    let before = settle(&v);
    let mut mid = PacketRepr::new(BthRepr::new(
        Opcode::RcRdmaWriteMiddle,
        Qpn::new(v.side.qp.qp_num()),
        Psn::new(PSN0 + 1),
    ));
    mid.bth.ack_req = true;
    att.send(v.ep, &mid, &[0x45; 1024]);
    let c = settle(&v);
    assert_eq!(c.rx_bad_opcode_sequence - before.rx_bad_opcode_sequence, 1, "{c:?}");
    memory_intact(&v, Some((100, 8, 0x99)));
}

#[test]
fn bad_keys_and_bounds_never_write_outside_the_mr() {
    let att = Attacker::new();
    // Each attack kills its QP (IBTA: a NAK'd access error moves the
    // responder to ERR), so each gets a fresh victim.
    type Attack = fn(&Victim) -> (PacketRepr, Vec<u8>);
    let attacks: [(&str, Attack); 6] = [
        ("rkey of an MR without remote access", |v| {
            (
                write_only(v, PSN0, v.private.addr(), v.private.lkey(), 64),
                vec![0x42; 64],
            )
        }),
        ("unknown rkey", |v| {
            (
                write_only(v, PSN0, v.side.mr.addr(), v.side.mr.rkey() ^ 0x5500, 64),
                vec![0x42; 64],
            )
        }),
        ("past the end", |v| {
            (
                write_only(v, PSN0, v.side.mr.addr() + 4090, v.side.mr.rkey(), 16),
                vec![0x42; 16],
            )
        }),
        ("before the start", |v| {
            (
                write_only(v, PSN0, v.side.mr.addr() - 8, v.side.mr.rkey(), 16),
                vec![0x42; 16],
            )
        }),
        ("address wrap-around", |v| {
            (write_only(v, PSN0, u64::MAX - 3, v.side.mr.rkey(), 16), vec![0x42; 16])
        }),
        ("payload longer than the RETH length", |v| {
            (
                write_only(v, PSN0, v.side.mr.addr() + 4000, v.side.mr.rkey(), 8),
                vec![0x42; 512],
            )
        }),
    ];
    for (what, attack) in attacks {
        let v = victim(&att);
        let before = settle(&v);
        let (h, payload) = attack(&v);
        att.send(v.ep, &h, &payload);
        let c = settle(&v);
        let refused = (c.rx_bad_rkey - before.rx_bad_rkey)
            + (c.rx_rkey_access - before.rx_rkey_access)
            + (c.rx_rkey_bounds - before.rx_rkey_bounds)
            + (c.rx_bad_length - before.rx_bad_length)
            + (c.rx_malformed - before.rx_malformed);
        assert!(refused >= 1, "{what}: not counted: {c:?}");
        memory_intact(&v, None);
        // The attacker receives the NAK (the responder answers its peer).
        let mut buf = [0u8; 256];
        att.sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = att.sock.recv(&mut buf).expect("a NAK");
        let p = Packet::parse(&buf[..n]).expect("a parsable NAK");
        assert_eq!(p.headers.bth.opcode, Opcode::RcAcknowledge, "{what}");
    }
}
