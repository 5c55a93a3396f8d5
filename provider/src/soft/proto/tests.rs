//! Scripted single-QP protocol tests (packet in → expected packets and
//! completions out) and the hostile packet corpus, on one `Core` whose peer
//! is played by the test.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::soft::device::SoftDevice;
use crate::soft::wire::{
    self, AethRepr, AtomicEthRepr, BthRepr, DethRepr, IpPseudoHeader, NakCode, Opcode, Packet, PacketRepr, Psn, Qpn,
    RethRepr, Syndrome, UdpPorts,
};
use crate::verbs::{
    AccessFlags, AhAttr, Gid, Guid, MemorySource, MrMemory, Mtu, PostError, QpAttr, QpAttrMask, QpCap, QpState, QpType,
    RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

use super::*;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1));
const REMOTE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2));
const REMOTE_QPN: u32 = 0x77;
const RQ_PSN: u32 = 100;
const SQ_PSN: u32 = 500;
const MEM: usize = 1 << 16;

struct Node {
    core: Core,
    cq: CqId,
    qpn: u32,
    mem: Arc<MemorySource>,
    lkey: u32,
    rkey: u32,
    /// How [`Node::post_wrs`] posts: `None` with `post_send`, `Some(take)`
    /// with `post_send_eager` and an egress that takes every packet (into
    /// `taken`) or refuses every one.
    eager: Option<bool>,
    taken: Vec<Transmit>,
}

fn node(qp_type: QpType, mtu: Mtu) -> Node {
    node_with(qp_type, mtu, true)
}

/// [`node`], with the fast paths on or off.
fn node_with(qp_type: QpType, mtu: Mtu, fast_paths: bool) -> Node {
    node_cfg(qp_type, mtu, |c| c.fast_paths = fast_paths)
}

/// [`node`], with its engine's configuration changed by `tune`.
fn node_cfg(qp_type: QpType, mtu: Mtu, tune: impl FnOnce(&mut CoreConfig)) -> Node {
    let mut cfg = CoreConfig::new(
        SoftDevice::default_attr(Guid(1)),
        SoftDevice::default_port_attr(),
        vec![Gid::from_ip(LOCAL)],
        7,
    );
    tune(&mut cfg);
    let mut core = Core::new(cfg);
    let pd = core.alloc_pd(1).unwrap();
    let (cq, _) = core.create_cq(256, 0, 1).unwrap();
    let mem = Arc::new(MemorySource::Owned(MrMemory::new(MEM).unwrap()));
    let all =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (lkey, rkey) = core.reg_mr(pd, mem.clone(), all).unwrap();
    let cap = QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let (qpn, _) = core
        .create_qp(&QpCreate {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
            owner: 1,
        })
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: 0x1234,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    mask |= if qp_type == QpType::Ud {
        QpAttrMask::QKEY
    } else {
        QpAttrMask::ACCESS_FLAGS
    };
    core.modify_qp(0, qpn, &init, mask).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: REMOTE_QPN,
        rq_psn: RQ_PSN,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr::roce(Gid::from_ip(REMOTE), 0, 1),
        ..QpAttr::default()
    };
    let mask = match qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
        QpType::Uc => {
            QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN
        }
        QpType::Ud => QpAttrMask::STATE,
    };
    core.modify_qp(0, qpn, &rtr, mask).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: SQ_PSN,
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 2,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    let mask = match qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    core.modify_qp(0, qpn, &rts, mask).unwrap();
    Node {
        core,
        cq,
        qpn,
        mem,
        lkey,
        rkey,
        eager: None,
        taken: Vec::new(),
    }
}

impl Node {
    fn sge(&self, off: u64, len: u32) -> Sge<'static> {
        Sge::checked(self.mem.addr() + off, len, self.lkey)
    }

    fn post_send(&mut self, now: Nanos, wr_id: u64, op: SendOp<'_>, off: u64, len: u32) {
        let sgl = [self.sge(off, len)];
        let wr = SendWr::new(wr_id, op, &sgl).flags(SendFlags::SIGNALED);
        self.post_wrs(now, &[wr]).unwrap();
    }

    /// Posts `wrs` as [`Node::eager`] says.
    fn post_wrs(&mut self, now: Nanos, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let Some(take) = self.eager else {
            return self.core.post_send(now, self.qpn, wrs);
        };
        let taken = &mut self.taken;
        let mut egress = |t: &Outgoing<'_>, _: &mut LinkHint| {
            if take {
                taken.push(t.to_transmit());
            }
            take
        };
        self.core.post_send_eager(now, self.qpn, wrs, Some(&mut egress))
    }

    fn post_recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sgl = [self.sge(off, len)];
        self.core.post_recv(self.qpn, &[RecvWr::new(wr_id, &sgl)]).unwrap();
    }

    /// Feeds a packet from the peer.
    fn inject(&mut self, now: Nanos, h: &PacketRepr, payload: &[u8]) {
        let bytes = emit(h, payload);
        self.inject_raw(now, &bytes);
    }

    fn inject_raw(&mut self, now: Nanos, bytes: &[u8]) {
        self.core.handle_datagram(
            now,
            Datagram {
                src: REMOTE,
                dst: LOCAL,
                src_port: 0xc001,
                dst_port: wire::ROCEV2_UDP_PORT,
                data: bytes,
                train: None,
            },
        );
    }

    /// Everything transmitted, parsed (and ICRC-checked).
    fn sent(&mut self) -> Vec<(PacketRepr, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(t) = self.core.poll_transmit() {
            assert_eq!((t.src, t.dst, t.dst_port), (LOCAL, REMOTE, wire::ROCEV2_UDP_PORT));
            let ip = IpPseudoHeader::between(t.src, t.dst).unwrap();
            let ports = UdpPorts {
                src: t.src_port,
                dst: t.dst_port,
            };
            assert!(wire::check_icrc(&ip, ports, &t.data), "emitted packet has a bad ICRC");
            let p = Packet::parse(&t.data).unwrap();
            out.push((p.headers, p.payload.to_vec()));
        }
        out
    }

    fn cqes(&mut self) -> Vec<WorkCompletion> {
        let mut wc = [WorkCompletion::default(); 64];
        let n = self.core.poll_cq(self.cq, &mut wc).unwrap();
        wc[..n].to_vec()
    }

    fn state(&self) -> QpState {
        self.core.query_qp(self.qpn).unwrap().qp_state
    }
}

fn emit(h: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; h.packet_len(payload.len())];
    h.emit(payload, &mut buf)
        .unwrap_or_else(|e| panic!("emit {:?}: {e:?}", h.bth.opcode));
    let ip = IpPseudoHeader::between(REMOTE, LOCAL).unwrap();
    let ports = UdpPorts {
        src: 0xc001,
        dst: wire::ROCEV2_UDP_PORT,
    };
    wire::fill_icrc(&ip, ports, &mut buf).unwrap();
    buf
}

fn req(opcode: Opcode, qpn: u32, psn: u32) -> PacketRepr {
    let mut b = BthRepr::new(opcode, Qpn::new(qpn), Psn::new(psn));
    b.ack_req = true;
    PacketRepr::new(b)
}

/// A request of `opcode` with a RETH to `n`'s QP: `len` bytes at `va_off`
/// of its MR, under `rkey`.
fn reth_req(n: &Node, opcode: Opcode, psn: u32, va_off: u64, len: u32, rkey: u32) -> PacketRepr {
    let mut h = req(opcode, n.qpn, psn);
    h.reth = Some(RethRepr {
        va: n.mem.addr() + va_off,
        rkey,
        dma_len: len,
    });
    h
}

/// A READ request to `n`'s QP for `len` bytes at `va_off` of its MR.
fn read_req(n: &Node, psn: u32, va_off: u64, len: u32) -> PacketRepr {
    reth_req(n, Opcode::RcRdmaReadRequest, psn, va_off, len, n.rkey)
}

fn ack(qpn: u32, psn: u32, syndrome: Syndrome) -> PacketRepr {
    let mut h = PacketRepr::new(BthRepr::new(Opcode::RcAcknowledge, Qpn::new(qpn), Psn::new(psn)));
    h.aeth = Some(AethRepr { syndrome, msn: 0 });
    h
}

fn aeth_of(h: &PacketRepr) -> Syndrome {
    h.aeth.expect("an AETH").syndrome
}

#[test]
fn requester_segments_at_the_mtu_and_completes_on_the_ack() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_send(0, 1, SendOp::Send, 0, 3000);
    let pkts = n.sent();
    let ops: Vec<_> = pkts.iter().map(|(h, _)| h.bth.opcode).collect();
    assert_eq!(ops, [Opcode::RcSendFirst, Opcode::RcSendMiddle, Opcode::RcSendLast]);
    let psns: Vec<_> = pkts.iter().map(|(h, _)| h.bth.psn.value()).collect();
    assert_eq!(psns, [SQ_PSN, SQ_PSN + 1, SQ_PSN + 2]);
    let lens: Vec<_> = pkts.iter().map(|(_, p)| p.len()).collect();
    assert_eq!(lens, [1024, 1024, 952]);
    assert!(pkts.iter().all(|(h, _)| h.bth.dest_qpn.value() == REMOTE_QPN));
    assert!(pkts[2].0.bth.ack_req);
    assert!(n.cqes().is_empty(), "no completion before the ACK");
    // An ACK for the middle packet completes nothing.
    n.inject(1, &ack(n.qpn, SQ_PSN + 1, Syndrome::ACK), &[]);
    assert!(n.cqes().is_empty());
    n.inject(2, &ack(n.qpn, SQ_PSN + 2, Syndrome::ACK), &[]);
    let wc = n.cqes();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (1, WcStatus::Success, 3000)
    );
}

#[test]
fn responder_rnr_naks_without_a_receive_then_accepts_and_reacks_duplicates() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let send = req(Opcode::RcSendOnly, n.qpn, RQ_PSN);
    n.inject(0, &send, b"hello");
    let out = n.sent();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.psn.value(), RQ_PSN);
    assert_eq!(aeth_of(&out[0].0), Syndrome::RnrNak { timer: 1 });
    assert_eq!(n.state(), QpState::Rts, "an RNR NAK leaves the responder in RTS");
    n.post_recv(9, 4096, 64);
    n.inject(1, &send, b"hello");
    let out = n.sent();
    assert_eq!(aeth_of(&out[0].0), Syndrome::ACK);
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].opcode, wc[0].byte_len), (9, WcOpcode::Recv, 5));
    let mut got = [0u8; 5];
    n.mem.read_at(4096, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    // The duplicate is re-acknowledged and completes nothing.
    n.inject(2, &send, b"hello");
    let out = n.sent();
    assert_eq!((out.len(), aeth_of(&out[0].0)), (1, Syndrome::ACK));
    assert!(n.cqes().is_empty());
    assert_eq!(n.core.counters().rx_duplicates, 1);
}

#[test]
fn a_send_only_is_placed_across_receive_sges() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let sgl = [n.sge(0, 4), n.sge(100, 12)];
    n.core.post_recv(n.qpn, &[RecvWr::new(5, &sgl)]).unwrap();
    n.inject(0, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN), b"0123456789");
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].status, wc[0].byte_len), (5, WcStatus::Success, 10));
    let (mut a, mut b) = ([0u8; 4], [0u8; 7]);
    n.mem.read_at(0, &mut a).unwrap();
    n.mem.read_at(100, &mut b).unwrap();
    assert_eq!(
        (&a, &b[..6], b[6]),
        (b"0123", &b"456789"[..], 0),
        "nothing past the payload"
    );
}

#[test]
fn a_bad_receive_sge_past_the_payload_still_fails_the_receive() {
    // The whole receive buffer is validated (docs/design.md §3.4), also the SGEs
    // a short message does not reach.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let sgl = [n.sge(0, 16), Sge::checked(n.mem.addr() + 64, 16, n.lkey ^ 0x80)];
    n.core.post_recv(n.qpn, &[RecvWr::new(6, &sgl)]).unwrap();
    n.inject(0, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN), b"short");
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].status), (6, WcStatus::LocProtErr));
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::Nak(NakCode::RemoteOperationalError));
}

#[test]
fn a_psn_gap_is_naked_once_with_the_expected_psn() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(1, 0, 64);
    n.inject(0, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 5), b"x");
    let out = n.sent();
    assert_eq!(out[0].0.bth.psn.value(), RQ_PSN);
    assert_eq!(aeth_of(&out[0].0), Syndrome::Nak(NakCode::PsnSequenceError));
    n.inject(1, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 6), b"x");
    assert!(n.sent().is_empty(), "one NAK per gap");
    n.inject(2, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN), b"x");
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
}

#[test]
fn a_bad_rkey_is_naked_and_moves_the_responder_to_err() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let mut h = req(Opcode::RcRdmaWriteOnly, n.qpn, RQ_PSN);
    h.reth = Some(RethRepr {
        va: n.mem.addr(),
        rkey: n.rkey ^ 0x80,
        dma_len: 4,
    });
    n.inject(0, &h, b"evil");
    let out = n.sent();
    assert_eq!(aeth_of(&out[0].0), Syndrome::Nak(NakCode::RemoteAccessError));
    assert_eq!(n.state(), QpState::Err);
    let mut got = [9u8; 4];
    n.mem.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0; 4], "nothing was written");
}

#[test]
fn reads_are_answered_in_mtu_packets_and_replayed_when_duplicated() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let data: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
    n.mem.write_at(8192, &data).unwrap();
    let h = read_req(&n, RQ_PSN, 8192, 2500);
    n.inject(0, &h, &[]);
    let out = n.sent();
    let ops: Vec<_> = out.iter().map(|(h, _)| h.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RcRdmaReadResponseFirst,
            Opcode::RcRdmaReadResponseMiddle,
            Opcode::RcRdmaReadResponseLast
        ]
    );
    assert!(out[0].0.aeth.is_some() && out[1].0.aeth.is_none() && out[2].0.aeth.is_some());
    let body: Vec<u8> = out.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(body, data);
    // A duplicate of the request is answered again from saved state.
    n.inject(1, &h, &[]);
    assert_eq!(n.sent().len(), 3);
    // The next request uses the PSN after the read's three.
    n.post_recv(3, 0, 16);
    n.inject(2, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 3), b"next");
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
}

#[test]
fn a_lost_read_response_re_asks_for_the_read_only_not_the_writes_acked_after_it() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let remote = RemoteAddr { addr: 0x9000, rkey: 7 };
    n.post_send(0, 1, SendOp::Read { remote }, 0, 3000);
    n.post_send(0, 2, SendOp::Write { remote }, 4096, 2000);
    let first: Vec<_> = n
        .sent()
        .iter()
        .map(|(h, _)| (h.bth.opcode, h.bth.psn.value()))
        .collect();
    assert_eq!(
        first,
        [
            (Opcode::RcRdmaReadRequest, SQ_PSN),
            (Opcode::RcRdmaWriteFirst, SQ_PSN + 3),
            (Opcode::RcRdmaWriteLast, SQ_PSN + 4),
        ]
    );
    // The first read response arrives, the second is lost, and the ACK of
    // the write (which the responder executed after the read) arrives.
    let mut r = ack(n.qpn, SQ_PSN, Syndrome::ACK);
    r.bth.opcode = Opcode::RcRdmaReadResponseFirst;
    n.inject(1, &r, &[0x11; 1024]);
    n.inject(2, &ack(n.qpn, SQ_PSN + 4, Syndrome::ACK), &[]);
    // Only the read's missing part is asked for again.
    let again = n.sent();
    let ops: Vec<_> = again.iter().map(|(h, _)| h.bth.opcode).collect();
    assert_eq!(ops, [Opcode::RcRdmaReadRequest], "the writes were acknowledged");
    assert_eq!(
        (again[0].0.bth.opcode, again[0].0.bth.psn.value()),
        (Opcode::RcRdmaReadRequest, SQ_PSN + 1)
    );
    assert_eq!(again[0].0.reth.unwrap().dma_len, 3000 - 1024);
    assert!(n.cqes().is_empty(), "completions stay in order behind the read");
    let mut m = PacketRepr::new(BthRepr::new(
        Opcode::RcRdmaReadResponseMiddle,
        Qpn::new(n.qpn),
        Psn::new(SQ_PSN + 1),
    ));
    n.inject(3, &m, &[0x22; 1024]);
    m.bth.opcode = Opcode::RcRdmaReadResponseLast;
    m.bth.psn = Psn::new(SQ_PSN + 2);
    m.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 0,
    });
    n.inject(4, &m, &[0x33; 952]);
    let wc = n.cqes();
    let got: Vec<_> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert!(n.sent().is_empty(), "the write was never sent again");
}

#[test]
fn a_duplicate_atomic_returns_the_saved_value_and_does_not_execute_twice() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.mem.store_u64(64, 40).unwrap();
    let mut h = req(Opcode::RcFetchAdd, n.qpn, RQ_PSN);
    h.atomic_eth = Some(AtomicEthRepr {
        va: n.mem.addr() + 64,
        rkey: n.rkey,
        swap_add: 2,
        compare: 0,
    });
    n.inject(0, &h, &[]);
    let out = n.sent();
    assert_eq!(out[0].0.bth.opcode, Opcode::RcAtomicAcknowledge);
    assert_eq!(out[0].0.atomic_ack_eth.unwrap().original_value, 40);
    n.inject(1, &h, &[]);
    let out = n.sent();
    assert_eq!(out[0].0.atomic_ack_eth.unwrap().original_value, 40);
    assert_eq!(n.mem.load_u64(64).unwrap(), 42, "executed once");
}

#[test]
fn a_misaligned_atomic_is_an_invalid_request() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let mut h = req(Opcode::RcCompareSwap, n.qpn, RQ_PSN);
    h.atomic_eth = Some(AtomicEthRepr {
        va: n.mem.addr() + 3,
        rkey: n.rkey,
        swap_add: 1,
        compare: 0,
    });
    n.inject(0, &h, &[]);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::Nak(NakCode::InvalidRequest));
    assert_eq!(n.state(), QpState::Err);
}

#[test]
fn retry_exhaustion_completes_with_retry_exc_err_in_virtual_time() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_send(0, 5, SendOp::Send, 0, 8);
    assert_eq!(n.sent().len(), 1);
    // timeout 10 → 4.096 µs · 2^10 ≈ 4.19 ms per try; retry_cnt 3.
    let per_try = 4096u64 << 10;
    let mut now = 0;
    let mut transmissions = 1;
    while n.cqes_peek_empty() {
        now = n.core.poll_timeout().expect("a retransmission timer is armed");
        n.core.handle_timeout(now);
        transmissions += n.sent().len();
    }
    assert_eq!(transmissions, 4, "the first try and three retries");
    assert_eq!(now, 4 * per_try);
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::RetryExcErr));
    assert_eq!(n.state(), QpState::Err);
}

#[test]
fn rnr_retry_exhaustion_completes_with_rnr_retry_exc_err() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_send(0, 6, SendOp::Send, 0, 8);
    n.sent();
    let mut now = 0;
    // rnr_retry 2: two retries after the first RNR NAK, then the error.
    for _ in 0..3 {
        n.inject(now, &ack(n.qpn, SQ_PSN, Syndrome::RnrNak { timer: 1 }), &[]);
        if !n.cqes_peek_empty() {
            break;
        }
        now = n.core.poll_timeout().unwrap();
        n.core.handle_timeout(now);
        assert_eq!(n.sent().len(), 1, "resent after the RNR timer");
    }
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].status), (6, WcStatus::RnrRetryExcErr));
}

#[test]
fn nak_sequence_error_goes_back_to_the_naked_psn() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_send(0, 1, SendOp::Send, 0, 3000);
    assert_eq!(n.sent().len(), 3);
    n.inject(
        1,
        &ack(n.qpn, SQ_PSN + 1, Syndrome::Nak(NakCode::PsnSequenceError)),
        &[],
    );
    let again = n.sent();
    let psns: Vec<_> = again.iter().map(|(h, _)| h.bth.psn.value()).collect();
    assert_eq!(psns, [SQ_PSN + 1, SQ_PSN + 2]);
    assert_eq!(again[0].0.bth.opcode, Opcode::RcSendMiddle);
    // A copy of the same NAK (the network duplicated it) before any
    // progress rewinds nothing: a second burst would only queue behind the
    // first.
    let nak = ack(n.qpn, SQ_PSN + 1, Syndrome::Nak(NakCode::PsnSequenceError));
    n.inject(2, &nak, &[]);
    assert!(n.sent().is_empty());
    assert_eq!(n.core.counters().seq_naks_duplicate, 1);
    // After progress, a NAK for a later PSN is a new loss and is acted on.
    n.inject(3, &ack(n.qpn, SQ_PSN + 1, Syndrome::ACK), &[]);
    n.inject(
        4,
        &ack(n.qpn, SQ_PSN + 2, Syndrome::Nak(NakCode::PsnSequenceError)),
        &[],
    );
    let psns: Vec<_> = n.sent().iter().map(|(h, _)| h.bth.psn.value()).collect();
    assert_eq!(psns, [SQ_PSN + 2]);
}

#[test]
fn uc_drops_a_message_with_a_gap_and_resynchronises() {
    let mut n = node(QpType::Uc, Mtu::Mtu1024);
    n.post_recv(1, 0, 4096);
    n.post_recv(2, 8192, 4096);
    let first = vec![1u8; 1024];
    n.inject(0, &req(Opcode::UcSendFirst, n.qpn, RQ_PSN), &first);
    // RQ_PSN + 1 is lost; the last packet arrives.
    n.inject(1, &req(Opcode::UcSendLast, n.qpn, RQ_PSN + 2), b"tail");
    assert!(n.cqes().is_empty(), "the message was dropped");
    n.inject(2, &req(Opcode::UcSendOnly, n.qpn, RQ_PSN + 3), b"whole");
    let wc = n.cqes();
    assert_eq!(
        (wc.len(), wc[0].wr_id, wc[0].byte_len),
        (1, 1, 5),
        "the first receive is reused"
    );
    assert!(n.sent().is_empty(), "UC never acknowledges");
}

#[test]
fn ud_receives_carry_a_grh_and_qkey_mismatches_are_dropped() {
    let mut n = node(QpType::Ud, Mtu::Mtu1024);
    n.post_recv(1, 0, 1024);
    let mut h = req(Opcode::UdSendOnly, n.qpn, 0);
    h.deth = Some(DethRepr {
        qkey: 0x9999,
        src_qpn: Qpn::new(0x42),
    });
    n.inject(0, &h, b"dropped");
    assert!(n.cqes().is_empty());
    assert_eq!(n.core.counters().rx_bad_qkey, 1);
    h.deth = Some(DethRepr {
        qkey: 0x1234,
        src_qpn: Qpn::new(0x42),
    });
    n.inject(1, &h, b"datagram");
    let wc = n.cqes();
    assert_eq!((wc[0].byte_len, wc[0].src_qp), (40 + 8, 0x42));
    assert!(wc[0].wc_flags.contains(crate::verbs::WcFlags::GRH));
    let mut grh = [0u8; 40];
    n.mem.read_at(0, &mut grh).unwrap();
    assert_eq!(&grh[..20], &[0; 20], "IPv4 GRH: 20 zero bytes then the IPv4 header");
    assert_eq!(grh[20] >> 4, 4);
    let mut body = [0u8; 8];
    n.mem.read_at(40, &mut body).unwrap();
    assert_eq!(&body, b"datagram");
}

#[test]
fn hostile_packets_are_dropped_or_naked_never_panic_and_never_write_outside_mrs() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    for i in 0..8 {
        n.post_recv(i, 0, 64);
    }
    let mut rng = SplitMix::new(99);
    let mut count = 0u64;
    for op in Opcode::ALL {
        for &qpn in &[n.qpn, n.qpn + 1, 0, 0xff_ffff] {
            for &psn in &[RQ_PSN, RQ_PSN + 1, RQ_PSN.wrapping_sub(1), RQ_PSN + (1 << 23)] {
                let mut h = req(op, qpn, psn);
                let Some(info) = op.info() else { continue };
                if info.headers.reth {
                    h.reth = Some(RethRepr {
                        va: rng.next_u64(),
                        rkey: rng.next_u64() as u32,
                        dma_len: rng.next_u64() as u32,
                    });
                }
                if info.headers.atomic_eth {
                    h.atomic_eth = Some(AtomicEthRepr {
                        va: rng.next_u64(),
                        rkey: n.rkey,
                        swap_add: 1,
                        compare: 1,
                    });
                }
                if info.headers.aeth {
                    h.aeth = Some(AethRepr {
                        syndrome: Syndrome::from(rng.next_u8()),
                        msn: 0,
                    });
                }
                if info.headers.atomic_ack_eth {
                    h.atomic_ack_eth = Some(wire::AtomicAckEthRepr {
                        original_value: rng.next_u64(),
                    });
                }
                if info.headers.deth {
                    h.deth = Some(DethRepr {
                        qkey: 1,
                        src_qpn: Qpn::new(1),
                    });
                }
                if info.headers.immdt {
                    h.immdt = Some(wire::ImmDtRepr::from_be_value(7));
                }
                if info.headers.ieth {
                    h.ieth = Some(wire::IethRepr {
                        rkey: rng.next_u64() as u32,
                    });
                }
                let payload = if info.has_payload {
                    vec![0xee; (rng.next_u64() % 2000) as usize]
                } else {
                    vec![]
                };
                let bytes = emit(&h, &payload);
                n.inject_raw(count, &bytes);
                // Truncations and bit flips of the same packet.
                for cut in [1usize, 4, 12, 13, bytes.len() / 2] {
                    n.inject_raw(count, &bytes[..bytes.len().saturating_sub(cut)]);
                }
                let mut flipped = bytes.clone();
                let bit = (rng.next_u64() as usize) % (flipped.len() * 8);
                flipped[bit / 8] ^= 1 << (bit % 8);
                n.inject_raw(count, &flipped);
                count += 1;
                let _ = n.sent();
                let _ = n.cqes();
            }
        }
    }
    for len in 0..200usize {
        let junk: Vec<u8> = (0..len).map(|_| rng.next_u8()).collect();
        n.inject_raw(count, &junk);
    }
    let c = n.core.counters();
    assert!(c.rx_malformed > 0 && c.rx_bad_icrc > 0 && c.rx_unknown_qp > 0);
    // Nothing outside the receive buffers' first 64 bytes changed: the MR
    // past them is still zero (every RETH named random addresses).
    let mut rest = vec![0u8; MEM - 64];
    n.mem.read_at(64, &mut rest).unwrap();
    assert!(
        rest.iter().all(|&b| b == 0),
        "a hostile packet wrote outside the receive buffers"
    );
}

#[test]
fn packets_from_another_source_are_dropped_for_connected_qps() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(1, 0, 64);
    let bytes = emit(&req(Opcode::RcSendOnly, n.qpn, RQ_PSN), b"spoof");
    n.core.handle_datagram(
        0,
        Datagram {
            src: IpAddr::V4(Ipv4Addr::new(10, 9, 0, 66)),
            dst: LOCAL,
            src_port: 0xc001,
            dst_port: wire::ROCEV2_UDP_PORT,
            data: &bytes,
            train: None,
        },
    );
    // The ICRC covers the source address, so a spoofed source fails it
    // first; either way the packet is dropped and counted.
    let c = n.core.counters();
    assert_eq!(c.rx_bad_icrc + c.rx_bad_source, 1);
    assert!(n.cqes().is_empty());
}

#[test]
fn zero_length_write_needs_no_valid_rkey() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let mut h = req(Opcode::RcRdmaWriteOnly, n.qpn, RQ_PSN);
    h.reth = Some(RethRepr {
        va: 0,
        rkey: 0xdead_beef,
        dma_len: 0,
    });
    n.inject(0, &h, &[]);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
    assert_eq!(n.state(), QpState::Rts);
}

#[test]
fn posting_before_rts_and_in_err() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let sgl = [n.sge(0, 8)];
    let remote = RemoteAddr { addr: 0, rkey: 0 };
    // Misaligned atomic: EINVAL at post, nothing posted.
    let wr = SendWr::new(
        1,
        SendOp::FetchAdd {
            remote: RemoteAddr { addr: 4, ..remote },
            add: 1,
        },
        &sgl,
    );
    let e = n.core.post_send(0, n.qpn, &[wr]).unwrap_err();
    assert_eq!((e.index, e.error.errno()), (0, libc::EINVAL));
    n.core
        .modify_qp(
            0,
            n.qpn,
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let wr = SendWr::new(2, SendOp::Write { remote }, &sgl);
    n.core.post_send(0, n.qpn, &[wr]).unwrap();
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::WrFlushErr));
}

impl Node {
    fn cqes_peek_empty(&self) -> bool {
        self.core.cq_len(self.cq) == 0
    }
}

#[test]
fn after_revoke_destroy_always_succeeds_and_nothing_follows_device_fatal() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(1, 0, 64);
    n.post_send(0, 2, SendOp::Send, 0, 8);
    n.sent();
    n.core.revoke();
    let wc = n.cqes();
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(2, WcStatus::WrFlushErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        n.core.alloc_pd(1).unwrap_err().kind(),
        crate::verbs::ErrorKind::NoDevice
    );
    n.core.device_fatal();
    // A CQ overrun after DEVICE_FATAL raises no further event.
    for _ in 0..300 {
        n.core.push_cqe(n.cq, WorkCompletion::default(), false);
    }
    let mut events = Vec::new();
    while let Some(e) = n.core.poll_event() {
        events.push(e);
    }
    let last = events.iter().rev().find_map(|e| match e {
        CoreEvent::Async { event, .. } => Some(event.event_type),
        _ => None,
    });
    assert_eq!(last, Some(crate::verbs::EventType::DeviceFatal));
    // Destroy in any order, twice, and after disassociate: all Ok.
    n.core.destroy_cq(n.cq).unwrap();
    n.core.disassociate();
    n.core.destroy_qp(n.qpn).unwrap();
    n.core.destroy_qp(n.qpn).unwrap();
    n.core.dereg_mr(n.lkey).unwrap();
    n.core.dealloc_pd(PdId(0)).unwrap();
}

#[test]
fn destroyed_qps_give_back_their_count_and_numbers_come_back_late() {
    // A device that allows 4 QPs lives through many more created and
    // destroyed in turn; a destroyed QP's number is not reused at once.
    let mut n = node_cfg(QpType::Rc, Mtu::Mtu1024, |c| c.attr.max_qp = 4);
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let create = |core: &mut Core| {
        core.create_qp(&QpCreate {
            qp_type: QpType::Rc,
            pd: PdId(0),
            send_cq: n.cq,
            recv_cq: n.cq,
            srq: None,
            cap,
            sq_sig_all: false,
            owner: 1,
        })
        .map(|(q, _)| q)
    };
    let first = create(&mut n.core).unwrap();
    n.core.destroy_qp(first).unwrap();
    let mut seen = std::collections::HashSet::new();
    for i in 0..3 * super::slab::REUSE_AFTER {
        let q = create(&mut n.core).unwrap_or_else(|e| panic!("create {i}: {e}"));
        if i < super::slab::REUSE_AFTER {
            assert_ne!(q, first, "QP number reused after {i} creations");
        }
        seen.insert(q);
        n.core.destroy_qp(q).unwrap();
    }
    assert!(seen.contains(&first), "numbers are reused in the end");
    // Three live beside the node's own: the limit still holds.
    let live: Vec<u32> = (0..3).map(|_| create(&mut n.core).unwrap()).collect();
    assert!(create(&mut n.core).is_err());
    for q in live {
        n.core.destroy_qp(q).unwrap();
    }
}

mod ack_req;
mod fast;
mod go_back;
mod keys;
mod modify;
mod sqe;
mod trains;
