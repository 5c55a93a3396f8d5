//! The receive fast path (`super::super::fast`) against the general path:
//! the same packets go into two engines, one with `fast_paths` off, and
//! everything the two produce must be the same: completions, packets
//! sent, memory, counters (but `rx_fast`) and the responder's state. Each
//! case also says how many packets the fast path must have taken, so that
//! a fast path that never runs fails too.

use super::*;

/// What an engine produced.
#[derive(Debug, PartialEq)]
struct Observed {
    wcs: Vec<WorkCompletion>,
    sent: Vec<(IpAddr, Vec<u8>)>,
    mem: Vec<u8>,
    counters: Counters,
    resp: String,
    rq: usize,
    state: QpState,
}

/// Observes `n`; also returns how many packets its fast path took.
fn observe(n: &mut Node) -> (Observed, u64) {
    let mut wcs = Vec::new();
    loop {
        let got = n.cqes();
        if got.is_empty() {
            break;
        }
        wcs.extend(got);
    }
    let mut sent = Vec::new();
    while let Some(t) = n.core.poll_transmit() {
        sent.push((t.dst, t.data));
    }
    let mut mem = vec![0; 8192];
    n.mem.read_at(0, &mut mem).unwrap();
    let mut counters = n.core.counters().clone();
    let fast = std::mem::take(&mut counters.rx_fast);
    let qp = n.core.qps.get(n.qpn - QPN_BASE).unwrap();
    let (resp, rq) = (format!("{:?}", qp.resp), qp.rq.len());
    let state = n.state();
    (
        Observed {
            wcs,
            sent,
            mem,
            counters,
            resp,
            rq,
            state,
        },
        fast,
    )
}

/// Runs `script` on an engine with the fast path and on one without,
/// checks that both produced the same, and that the fast path took
/// `fast` packets.
fn both(fast: u64, script: impl Fn(&mut Node)) {
    let mut a = node_with(QpType::Rc, Mtu::Mtu1024, true);
    let mut b = node_with(QpType::Rc, Mtu::Mtu1024, false);
    script(&mut a);
    script(&mut b);
    let (oa, fa) = observe(&mut a);
    let (ob, fb) = observe(&mut b);
    assert_eq!(oa, ob, "the fast path and the general path differ");
    assert_eq!((fa, fb), (fast, 0), "packets the fast path took");
}

fn send_only(n: &Node, psn: u32, imm: Option<u32>, solicited: bool, ack_req: bool) -> PacketRepr {
    let op = if imm.is_some() {
        Opcode::RcSendOnlyWithImmediate
    } else {
        Opcode::RcSendOnly
    };
    let mut h = req(op, n.qpn, psn);
    h.bth.solicited = solicited;
    h.bth.ack_req = ack_req;
    h.immdt = imm.map(wire::ImmDtRepr::from_be_value);
    h
}

fn write_only(n: &Node, psn: u32, off: u64, dma_len: u32, rkey: u32) -> PacketRepr {
    let mut h = req(Opcode::RcRdmaWriteOnly, n.qpn, psn);
    h.reth = Some(RethRepr {
        va: n.mem.addr() + off,
        rkey,
        dma_len,
    });
    h
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

fn inject_from(n: &mut Node, src: IpAddr, bytes: &[u8]) {
    n.core.handle_datagram(
        0,
        Datagram {
            src,
            dst: LOCAL,
            src_port: 0xc001,
            dst_port: wire::ROCEV2_UDP_PORT,
            data: bytes,
            train: None,
        },
    );
}

#[test]
fn sends_of_every_pad_with_and_without_immediate_data_match_the_general_path() {
    for len in [0usize, 1, 2, 3, 4, 5, 8, 63, 64] {
        for solicited in [false, true] {
            for ack_req in [false, true] {
                both(2, |n| {
                    n.post_recv(1, 0, 64);
                    n.post_recv(2, 128, 64);
                    n.inject(0, &send_only(n, RQ_PSN, None, solicited, ack_req), &payload(len, 1));
                    let h = send_only(n, RQ_PSN + 1, Some(0xdead_beef), solicited, ack_req);
                    n.inject(0, &h, &payload(len, 7));
                });
            }
        }
    }
}

#[test]
fn writes_match_the_general_path() {
    for len in [0u32, 1, 3, 8, 100, 1024] {
        for ack_req in [false, true] {
            both(1, |n| {
                let mut h = write_only(n, RQ_PSN, 1000, len, n.rkey);
                h.bth.ack_req = ack_req;
                n.inject(0, &h, &payload(len as usize, 3));
            });
        }
    }
}

#[test]
fn receive_errors_go_the_general_way() {
    // No receive WQE (RNR NAK), then the retry once one is posted.
    both(1, |n| {
        let h = send_only(n, RQ_PSN, None, false, true);
        n.inject(0, &h, b"hello");
        n.post_recv(1, 0, 64);
        n.inject(1, &h, b"hello");
    });
    // A receive buffer too small, and one whose second SGE has a bad key.
    both(0, |n| {
        n.post_recv(1, 0, 4);
        n.inject(0, &send_only(n, RQ_PSN, None, false, true), b"hello");
    });
    both(0, |n| {
        let sgl = [n.sge(0, 16), Sge::checked(n.mem.addr() + 64, 16, n.lkey ^ 0x80)];
        n.core.post_recv(n.qpn, &[RecvWr::new(6, &sgl)]).unwrap();
        n.inject(0, &send_only(n, RQ_PSN, None, false, true), b"short");
    });
    // An SRQ-less QP whose message is in progress: a SEND ONLY inside a
    // multi-packet SEND is an opcode sequence error.
    both(0, |n| {
        n.post_recv(1, 0, 4096);
        n.post_recv(2, 4096, 64);
        n.inject(0, &req(Opcode::RcSendFirst, n.qpn, RQ_PSN), &payload(1024, 0));
        n.inject(0, &send_only(n, RQ_PSN + 1, None, false, true), b"x");
    });
}

#[test]
fn psn_and_write_errors_go_the_general_way() {
    // A duplicate is re-acknowledged, a gap NAKed once until an in-order
    // packet arrives, and again after it (receive WQEs wait meanwhile).
    both(2, |n| {
        for k in 0..4 {
            n.post_recv(k, 64 * k, 64);
        }
        let h = send_only(n, RQ_PSN, None, false, true);
        n.inject(0, &h, b"once");
        n.inject(1, &h, b"once");
        n.inject(2, &send_only(n, RQ_PSN + 3, None, false, true), b"gap");
        n.inject(2, &send_only(n, RQ_PSN + 4, None, false, true), b"gap");
        n.inject(3, &send_only(n, RQ_PSN + 1, None, false, true), b"next");
        n.inject(4, &send_only(n, RQ_PSN + 4, None, false, true), b"gap");
    });
    // A bad rkey, a range past the MR, a length that is not the DMA length.
    both(0, |n| {
        let h = write_only(n, RQ_PSN, 0, 8, n.rkey ^ 0x80);
        n.inject(0, &h, &payload(8, 0));
    });
    both(0, |n| {
        let h = write_only(n, RQ_PSN, MEM as u64 - 4, 8, n.rkey);
        n.inject(0, &h, &payload(8, 0));
    });
    both(0, |n| {
        let h = write_only(n, RQ_PSN, 0, 9, n.rkey);
        n.inject(0, &h, &payload(8, 0));
    });
    // A QP that does not grant remote writes.
    both(0, |n| {
        let rts = QpAttr {
            qp_state: QpState::Rts,
            qp_access_flags: AccessFlags::REMOTE_READ,
            ..QpAttr::default()
        };
        n.core
            .modify_qp(0, n.qpn, &rts, QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)
            .unwrap();
        let h = write_only(n, RQ_PSN, 0, 8, n.rkey);
        n.inject(0, &h, &payload(8, 0));
    });
}

#[test]
fn hostile_packets_go_the_general_way() {
    // A bad ICRC, a stranger's address, an unknown QP, another partition,
    // a truncated packet, a pad longer than the payload.
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let mut bytes = emit(&send_only(n, RQ_PSN, None, false, true), b"data");
        bytes[13] ^= 1;
        n.inject_raw(0, &bytes);
    });
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let stranger = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 66));
        let h = send_only(n, RQ_PSN, None, false, true);
        let mut bytes = vec![0; h.packet_len(4)];
        h.emit(b"data", &mut bytes).unwrap();
        let ip = IpPseudoHeader::between(stranger, LOCAL).unwrap();
        let ports = UdpPorts {
            src: 0xc001,
            dst: wire::ROCEV2_UDP_PORT,
        };
        wire::fill_icrc(&ip, ports, &mut bytes).unwrap();
        inject_from(n, stranger, &bytes);
    });
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let mut h = send_only(n, RQ_PSN, None, false, true);
        h.bth.dest_qpn = Qpn::new(n.qpn + 1);
        n.inject(0, &h, b"data");
    });
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let mut h = send_only(n, RQ_PSN, None, false, true);
        h.bth.pkey = wire::Pkey::new(0x8001);
        n.inject(0, &h, b"data");
    });
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let bytes = emit(&send_only(n, RQ_PSN, None, false, true), b"data");
        n.inject_raw(0, &bytes[..14]);
    });
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let mut bytes = emit(&send_only(n, RQ_PSN, None, false, true), b"");
        bytes[1] |= 0x30;
        n.inject_raw(0, &bytes);
    });
}

#[test]
fn a_qp_in_error_goes_the_general_way() {
    both(0, |n| {
        n.post_recv(1, 0, 64);
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        n.core.modify_qp(0, n.qpn, &err, QpAttrMask::STATE).unwrap();
        n.inject(0, &send_only(n, RQ_PSN, None, false, true), b"late");
        n.inject(0, &write_only(n, RQ_PSN, 0, 4, n.rkey), b"late");
    });
}
