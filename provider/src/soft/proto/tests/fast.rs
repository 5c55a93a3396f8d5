//! The fast paths (`super::super::fast`) against the general paths: the
//! same packets and work requests go into four engines: one with
//! `fast_paths` off, and three with them on that post sends with
//! `post_send`, or with `post_send_eager` and an egress that takes every
//! packet or refuses every one. Everything they produce must be the same:
//! completions, packets sent (taken by the egress, then queued), memory,
//! counters (but `rx_fast`, `tx_fast` and `tx_eager`), the responder's and
//! the requester's state, the send queue and the timer. Each case also
//! says how many packets or WQEs the fast paths must have taken (and the
//! taking egress), so that a fast path that never runs fails too.

use super::*;
use crate::verbs::ErrorKind;

/// What an engine produced.
#[derive(Debug, PartialEq)]
struct Observed {
    wcs: Vec<WorkCompletion>,
    sent: Vec<(IpAddr, u16, Vec<u8>)>,
    mem: u64,
    counters: Counters,
    resp: String,
    req: String,
    sq: String,
    rq: usize,
    timer: (Option<Nanos>, Option<Nanos>),
    state: QpState,
}

/// Observes `n`; also returns how many packets and WQEs its receive and
/// send fast paths took, and how many packets its egress took.
fn observe(n: &mut Node) -> (Observed, [u64; 3]) {
    let mut wcs = Vec::new();
    loop {
        let got = n.cqes();
        if got.is_empty() {
            break;
        }
        wcs.extend(got);
    }
    // The egress takes a packet only when none is queued (tests do not
    // drain the queue before this): all it took went out first.
    let mut sent: Vec<_> = n.taken.drain(..).map(|t| (t.dst, t.src_port, t.data)).collect();
    while let Some(t) = n.core.poll_transmit() {
        sent.push((t.dst, t.src_port, t.data));
    }
    let mut bytes = vec![0; 8192];
    n.mem.read_at(0, &mut bytes).unwrap();
    // FNV-1a of the first 8 KiB: a difference shows without pages of bytes.
    let mem = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut counters = n.core.counters().clone();
    let fast = [
        std::mem::take(&mut counters.rx_fast),
        std::mem::take(&mut counters.tx_fast),
        std::mem::take(&mut counters.tx_eager),
    ];
    let timer = n.core.poll_timeout();
    let qp = n.core.qps.get(n.qpn - QPN_BASE).unwrap();
    // The send queue without local addresses (each engine has its own
    // memory).
    let sq = qp
        .sq
        .iter()
        .map(|w| {
            format!(
                "{} {:?} {:?} {} {:?} {} {} {} {} {:?} {:?} {} {}",
                w.wr_id,
                w.op,
                w.remote,
                w.imm,
                w.inline,
                w.length,
                w.signaled,
                w.fence,
                w.solicited,
                w.state,
                w.first_psn,
                w.npkts,
                w.resp_pkts
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let (resp, req, rq) = (format!("{:?}", qp.resp), format!("{:?}", qp.req), qp.rq.len());
    let timer = (qp.timer, timer);
    let state = n.state();
    (
        Observed {
            wcs,
            sent,
            mem,
            counters,
            resp,
            req,
            sq,
            rq,
            timer,
            state,
        },
        fast,
    )
}

/// Runs `script` on engines of a `qp_type` QP (configured by `tune`)
/// with the fast paths (posting without an egress, with one that takes
/// every packet, with one that refuses every one) and on one without,
/// checks that all produced the same, and returns how many packets and
/// WQEs the fast paths took and how many packets the taking egress took.
fn run_both(qp_type: QpType, tune: impl Fn(&mut CoreConfig), script: impl Fn(&mut Node)) -> [u64; 3] {
    let engine = |fast_paths: bool, eager: Option<bool>| {
        let mut n = node_cfg(qp_type, Mtu::Mtu1024, |c| {
            tune(c);
            c.fast_paths = fast_paths;
            // As on every link with an egress (the link computes the ICRC,
            // or needs none): the egress gets pieces only then.
            c.emit_icrc = false;
        });
        n.eager = eager;
        script(&mut n);
        observe(&mut n)
    };
    let (ob, fb) = engine(false, None);
    assert_eq!(fb, [0, 0, 0], "fast paths ran while off");
    let (oa, fa) = engine(true, Some(true));
    assert_eq!(
        oa, ob,
        "the fast paths (packets taken at once) and the general paths differ"
    );
    for eager in [None, Some(false)] {
        let (o, f) = engine(true, eager);
        assert_eq!(o, ob, "the fast paths (egress {eager:?}) and the general paths differ");
        assert_eq!(f, [fa[0], fa[1], 0], "fast paths with egress {eager:?}");
    }
    fa
}

/// [`run_both`] on an RC QP: the receive fast path took `fast` packets.
fn both(fast: u64, script: impl Fn(&mut Node)) {
    assert_eq!(
        run_both(QpType::Rc, |_| {}, script)[0],
        fast,
        "packets the fast path took"
    );
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
    reth_req(n, Opcode::RcRdmaWriteOnly, psn, off, dma_len, rkey)
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

/// WRITE ONLY trains (a message copied once from the sender's memory):
/// of one packet and of several, acknowledged or not, then the next
/// packet; and the trains the fast path leaves to the general one (a
/// duplicate, a gap, a bad rkey, a length that is not the DMA length, a
/// packet count that does not match the MTU, a SEND train).
#[test]
fn write_trains_match_the_general_path() {
    let src = super::trains::train_source(8192, 5);
    for (len, npkts) in [(1000u32, 1u32), (4000, 4), (8000, 8)] {
        for ack_req in [false, true] {
            both(2, |n| {
                let mut h = write_only(n, RQ_PSN, 100, len, n.rkey);
                h.bth.ack_req = ack_req;
                n.inject_train(0, &h, npkts, &src, len as usize);
                let h = write_only(n, RQ_PSN + npkts, 0, 8, n.rkey);
                n.inject(1, &h, &payload(8, 9));
            });
        }
    }
    // In order, then again (a duplicate), then past a gap.
    both(1, |n| {
        let h = write_only(n, RQ_PSN, 0, 2000, n.rkey);
        n.inject_train(0, &h, 2, &src, 2000);
        n.inject_train(1, &h, 2, &src, 2000);
        let h = write_only(n, RQ_PSN + 5, 0, 2000, n.rkey);
        n.inject_train(2, &h, 2, &src, 2000);
    });
    both(0, |n| {
        let h = write_only(n, RQ_PSN, 0, 2000, n.rkey ^ 0x80);
        n.inject_train(0, &h, 2, &src, 2000);
    });
    both(0, |n| {
        let h = write_only(n, RQ_PSN, 0, 2001, n.rkey);
        n.inject_train(0, &h, 2, &src, 2000);
    });
    both(0, |n| {
        let h = write_only(n, RQ_PSN, 0, 2000, n.rkey);
        n.inject_train(0, &h, 3, &src, 2000);
    });
    both(0, |n| {
        n.post_recv(1, 0, 4096);
        n.inject_train(0, &send_only(n, RQ_PSN, None, false, true), 2, &src, 2000);
    });
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
    // A receive SGE that runs past the end of its MR, the message short
    // enough to fit in the MR: every SGE is checked whole.
    both(0, |n| {
        let end = n.mem.addr() + n.mem.len() as u64;
        let sgl = [Sge::checked(end - 8, 16, n.lkey)];
        n.core.post_recv(n.qpn, &[RecvWr::new(7, &sgl)]).unwrap();
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
    // The packets beyond the gap are held (`recovery`), so the in-order
    // one behind them goes the general way: the fast path takes only the
    // first.
    both(1, |n| {
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

/// Posts an inline WR of `len` bytes.
fn post_inline(n: &mut Node, wr_id: u64, op: SendOp<'_>, len: usize, flags: SendFlags) {
    let data = payload(len, wr_id as u8);
    let sgl = [Sge::inline(&data)];
    let wr = SendWr::new(wr_id, op, &sgl).flags(flags | SendFlags::INLINE);
    n.post_wrs(0, &[wr]).unwrap();
}

/// A remote buffer (the same in both engines: it goes on the wire).
fn remote(_n: &Node) -> RemoteAddr {
    RemoteAddr {
        addr: 0x7f00_0000_1000,
        rkey: 0x4242,
    }
}

#[test]
fn lone_inline_sends_and_writes_match_the_requester() {
    for len in [0usize, 1, 3, 4, 8, 64] {
        for flags in [
            SendFlags::empty(),
            SendFlags::SIGNALED,
            SendFlags::SOLICITED,
            SendFlags::SIGNALED | SendFlags::SOLICITED,
        ] {
            let fast = run_both(
                QpType::Rc,
                |_| {},
                |n| {
                    let r = remote(n);
                    post_inline(n, 1, SendOp::Send, len, flags);
                    post_inline(n, 2, SendOp::SendWithImm { imm: 0x0102_0304 }, len, flags);
                    post_inline(n, 3, SendOp::Write { remote: r }, len, flags);
                    post_inline(n, 4, SendOp::WriteWithImm { remote: r, imm: 9 }, len, flags);
                    // The peer acknowledges the lot: the signaled ones complete.
                    n.inject(5, &ack(n.qpn, SQ_PSN + 3, Syndrome::ACK), &[]);
                },
            );
            assert_eq!(fast, [0, 4, 4]);
        }
    }
}

#[test]
fn the_ack_request_policy_and_the_window_match_the_requester() {
    // Unsignaled sends until the queue is half full and an eighth of it
    // went by without asking, and past `ack_every`.
    let fast = run_both(
        QpType::Rc,
        |c| c.ack_every = 5,
        |n| {
            for k in 0..24 {
                post_inline(n, k, SendOp::Send, 8, SendFlags::empty());
            }
            // Half of them acknowledged: the rest stay sent, waiting.
            n.inject(5, &ack(n.qpn, SQ_PSN + 11, Syndrome::ACK), &[]);
        },
    );
    assert_eq!(fast, [0, 24, 24]);
    // A window of three packets: the third closes it (and asks), the
    // fourth waits for the ACK, which sends it by the general path.
    let fast = run_both(
        QpType::Rc,
        |c| c.max_inflight_packets = 3,
        |n| {
            for k in 0..3 {
                post_inline(n, k, SendOp::Send, 8, SendFlags::empty());
            }
            post_inline(n, 3, SendOp::Send, 8, SendFlags::SIGNALED);
            n.inject(5, &ack(n.qpn, SQ_PSN + 2, Syndrome::ACK), &[]);
        },
    );
    assert_eq!(fast, [0, 3, 3]);
}

#[test]
fn other_work_requests_go_to_the_requester() {
    // Not inline; fenced (also behind a READ); two WRs in one post; after
    // an RNR NAK; on a UC QP.
    let fast = run_both(
        QpType::Rc,
        |_| {},
        |n| {
            n.post_send(0, 1, SendOp::Send, 0, 8);
            post_inline(n, 2, SendOp::Send, 8, SendFlags::FENCE | SendFlags::SIGNALED);
            let (a, b) = (payload(8, 1), payload(8, 2));
            let (sa, sb) = ([Sge::inline(&a)], [Sge::inline(&b)]);
            let wrs = [
                SendWr::new(3, SendOp::Send, &sa).flags(SendFlags::INLINE),
                SendWr::new(4, SendOp::Send, &sb).flags(SendFlags::INLINE | SendFlags::SIGNALED),
            ];
            n.post_wrs(0, &wrs).unwrap();
            let r = remote(n);
            n.post_send(0, 5, SendOp::Read { remote: r }, 512, 8);
            // A fenced SEND waits for the READ before it.
            post_inline(n, 6, SendOp::Send, 8, SendFlags::FENCE | SendFlags::SIGNALED);
        },
    );
    assert_eq!(fast, [0, 0, 0]);
    let fast = run_both(
        QpType::Rc,
        |_| {},
        |n| {
            post_inline(n, 1, SendOp::Send, 8, SendFlags::SIGNALED);
            n.inject(1, &ack(n.qpn, SQ_PSN, Syndrome::RnrNak { timer: 14 }), &[]);
            post_inline(n, 2, SendOp::Send, 8, SendFlags::SIGNALED);
        },
    );
    assert_eq!(fast, [0, 1, 1]);
    let fast = run_both(
        QpType::Uc,
        |_| {},
        |n| {
            post_inline(n, 1, SendOp::Send, 8, SendFlags::SIGNALED);
        },
    );
    assert_eq!(fast, [0, 0, 0]);
}

/// A packet queued before the fast path's (here the ACK a received SEND
/// asked for) keeps its place: the fast path's packet is queued behind it,
/// not handed to the egress.
#[test]
fn a_queued_packet_keeps_the_egress_waiting() {
    let fast = run_both(
        QpType::Rc,
        |_| {},
        |n| {
            n.post_recv(1, 0, 64);
            n.inject(0, &send_only(n, RQ_PSN, None, false, true), b"ask");
            post_inline(n, 2, SendOp::Send, 8, SendFlags::SIGNALED);
        },
    );
    assert_eq!(fast, [1, 1, 0]);
    // Alone, the same send is taken.
    let fast = run_both(
        QpType::Rc,
        |_| {},
        |n| post_inline(n, 2, SendOp::Send, 8, SendFlags::SIGNALED),
    );
    assert_eq!(fast, [0, 1, 1]);
}

/// The send fast path posts a lone WR before its WQE exists: it must take
/// inline bytes through an MR as `post_send` does, and leave every WR that
/// `post_send` rejects to it, sending nothing.
#[test]
fn inline_through_an_mr_and_rejected_posts_match_the_requester() {
    let fast = run_both(
        QpType::Rc,
        |_| {},
        |n| {
            // As perftest posts: the bytes are read through the MR.
            n.mem.write_at(256, &payload(8, 7)).unwrap();
            let sgl = [n.sge(256, 8)];
            let wr = SendWr::new(1, SendOp::Send, &sgl).flags(SendFlags::INLINE | SendFlags::SIGNALED);
            n.post_wrs(0, &[wr]).unwrap();
            let rejected = |n: &mut Node, wr: SendWr<'_>, kind: ErrorKind| {
                let e = n.post_wrs(0, &[wr]).unwrap_err();
                assert_eq!((e.index, e.error.kind()), (0, kind), "{e}");
            };
            // An SGE under a key that names no MR.
            let bad = [Sge::checked(n.mem.addr() + 256, 8, n.lkey ^ 0x100)];
            rejected(
                n,
                SendWr::new(2, SendOp::Send, &bad).flags(SendFlags::INLINE),
                ErrorKind::InvalidArgument,
            );
            // More than max_inline_data (64).
            let big = payload(65, 1);
            let sgl = [Sge::inline(&big)];
            rejected(
                n,
                SendWr::new(3, SendOp::Send, &sgl).flags(SendFlags::INLINE),
                ErrorKind::InvalidArgument,
            );
            // The send queue full (32 WRs, none acknowledged).
            for k in 0..31 {
                post_inline(n, 10 + k, SendOp::Send, 8, SendFlags::empty());
            }
            let sgl = [Sge::inline(&big[..8])];
            rejected(
                n,
                SendWr::new(50, SendOp::Send, &sgl).flags(SendFlags::INLINE),
                ErrorKind::NoMemory,
            );
        },
    );
    assert_eq!(fast, [0, 32, 32]);
}
