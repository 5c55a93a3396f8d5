//! Scripted train tests (`super::super::by_reference`): the responder's checks
//! and placement, the requester's choice, READ response trains.

use super::*;

/// A train route that gives every destination the same capabilities.
struct Route(by_reference::TrainCaps);

impl TrainRoute for Route {
    fn train_caps(&self, _dst: IpAddr) -> by_reference::TrainCaps {
        self.0
    }
}

/// Shareable buffers, trains of one packet too (a shared-memory peer
/// that takes them).
const ONE_TOO: by_reference::TrainCaps = by_reference::TrainCaps {
    one_packet: true,
    ..by_reference::TrainCaps::SHARED
};

/// A shareable source buffer holding `len` bytes of a pattern.
pub(super) fn train_source(len: usize, seed: u8) -> MrMemory {
    let m = MrMemory::new(len.max(crate::verbs::SHARE_MIN)).unwrap();
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    m.write(0, &bytes).unwrap();
    assert!(m.shared().is_some(), "large buffers are shareable here");
    m
}

impl Node {
    /// Feeds a train from the peer: `h` is its ONLY packet, `src` holds
    /// the payload.
    pub(super) fn inject_train(&mut self, now: Nanos, h: &PacketRepr, npkts: u32, src: &MrMemory, len: usize) {
        self.inject_train_of(now, h, npkts, &[(src, len)]);
    }

    /// Like `inject_train`, with the payload in several pieces: the first
    /// `len` bytes of each source, in order.
    fn inject_train_of(&mut self, now: Nanos, h: &PacketRepr, npkts: u32, srcs: &[(&MrMemory, usize)]) {
        let bytes = emit(h, &[]);
        let pieces: Vec<_> = srcs
            .iter()
            .map(|(m, len)| m.shared().unwrap().piece(0, *len).unwrap())
            .collect();
        let t = by_reference::TrainIn::new(npkts, &pieces).unwrap();
        self.core.handle_datagram(
            now,
            Datagram {
                src: REMOTE,
                dst: LOCAL,
                src_port: 0xc001,
                dst_port: wire::ROCEV2_UDP_PORT,
                data: &bytes,
                train: Some(t),
            },
        );
    }

    fn read_mem(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_at(off, &mut v).unwrap();
        v
    }
}

/// Posts a READ of `len` bytes at `n` and answers it with one train of
/// `npkts` packets from a fresh source: it completes once, with the
/// data. Returns the node, the train's packet and its source.
fn read_done_by_train(mtu: Mtu, len: u32, npkts: u32, seed: u8) -> (Node, PacketRepr, MrMemory) {
    let mut n = node(QpType::Rc, mtu);
    let remote = RemoteAddr { addr: 0x9000, rkey: 7 };
    n.post_send(0, 1, SendOp::Read { remote }, 200, len);
    assert_eq!(n.sent().len(), 1);
    let src = train_source(len as usize, seed);
    let mut r = ack(n.qpn, SQ_PSN, Syndrome::ACK);
    r.bth.opcode = Opcode::RcRdmaReadResponseOnly;
    n.inject_train(1, &r, npkts, &src, len as usize);
    let wc = n.cqes();
    assert_eq!((wc.len(), wc[0].status, wc[0].byte_len), (1, WcStatus::Success, len));
    assert_landed(&n, &src, 200, len as usize);
    (n, r, src)
}

fn write_only(n: &Node, psn: u32, va_off: u64, len: u32) -> PacketRepr {
    reth_req(n, Opcode::RcRdmaWriteOnly, psn, va_off, len, n.rkey)
}

/// The first `len` bytes of `src` are in `n`'s MR at `mem_off`.
fn assert_landed(n: &Node, src: &MrMemory, mem_off: usize, len: usize) {
    let mut want = vec![0u8; len];
    src.read(0, &mut want).unwrap();
    assert_eq!(n.read_mem(mem_off, len), want);
}

#[test]
fn a_write_train_lands_once_takes_its_psns_and_acks_its_last() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let src = train_source(20_000, 3);
    n.inject_train(0, &write_only(&n, RQ_PSN, 100, 20_000), 20, &src, 20_000);
    assert_landed(&n, &src, 100, 20_000);
    let acks = n.sent();
    assert_eq!(acks.len(), 1);
    assert_eq!(
        (acks[0].0.bth.psn.value(), aeth_of(&acks[0].0)),
        (RQ_PSN + 19, Syndrome::ACK)
    );
    assert_eq!(n.core.counters().rx_trains, 1);
    // The next message starts after the train's 20 PSNs.
    n.post_recv(1, 30_000, 64);
    n.inject(1, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 20), b"next");
    let wc = n.cqes();
    assert_eq!((wc.len(), wc[0].status, wc[0].byte_len), (1, WcStatus::Success, 4));
    // The train again (a retransmission) is a duplicate: re-ACKed, not
    // written again.
    n.mem.write_at(100, &[0xee; 16]).unwrap();
    n.sent();
    n.inject_train(2, &write_only(&n, RQ_PSN, 100, 20_000), 20, &src, 20_000);
    assert_eq!(n.read_mem(100, 16), [0xee; 16]);
    assert_eq!(n.core.counters().rx_duplicates, 1);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
}

#[test]
fn a_train_of_several_pieces_lands_whole_in_order() {
    // Pieces of 3000, 100 and 6900 bytes: the WRITE's range and the SEND's
    // receive buffers each take bytes from more than one piece, and the
    // last 64 bytes (written last) straddle two.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let (a, b, c) = (train_source(3000, 1), train_source(100, 2), train_source(6900, 3));
    let srcs = [(&a, 3000), (&b, 100), (&c, 6900)];
    let mut want = Vec::new();
    for (m, len) in srcs {
        let mut v = vec![0u8; len];
        m.read(0, &mut v).unwrap();
        want.extend(v);
    }
    n.inject_train_of(0, &write_only(&n, RQ_PSN, 50, 10_000), 10, &srcs);
    assert_eq!(n.read_mem(50, 10_000), want);
    assert_eq!(n.core.counters().rx_trains, 1);
    let srcs = [(&a, 3000), (&b, 100), (&c, 36)];
    let sgl = [n.sge(20_000, 3050), n.sge(30_000, 4000)];
    n.core.post_recv(n.qpn, &[RecvWr::new(9, &sgl)]).unwrap();
    n.inject_train_of(1, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 10), 4, &srcs);
    let wc = n.cqes();
    assert_eq!((wc.len(), wc[0].status, wc[0].byte_len), (1, WcStatus::Success, 3136));
    assert_eq!(n.read_mem(20_000, 3050), want[..3050]);
    assert_eq!(n.read_mem(30_000, 86), want[3050..3136]);
}

#[test]
fn a_send_train_scatters_into_the_receive_buffer_and_completes_once() {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let src = train_source(5000, 9);
    // Two receive SGEs: 3000 bytes at 0, 4000 at 10_000.
    let sgl = [n.sge(0, 3000), n.sge(10_000, 4000)];
    n.core.post_recv(n.qpn, &[RecvWr::new(7, &sgl)]).unwrap();
    let mut h = req(Opcode::RcSendOnlyWithImmediate, n.qpn, RQ_PSN);
    h.immdt = Some(wire::ImmDtRepr::from_be_value(0x1234_5678));
    n.inject_train(0, &h, 5, &src, 5000);
    let wc = n.cqes();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len, wc[0].opcode, wc[0].imm_data),
        (7, WcStatus::Success, 5000, WcOpcode::Recv, 0x1234_5678)
    );
    let mut want = vec![0u8; 5000];
    src.read(0, &mut want).unwrap();
    assert_eq!(n.read_mem(0, 3000), want[..3000]);
    assert_eq!(n.read_mem(10_000, 2000), want[3000..]);
    assert_eq!(n.read_mem(12_000, 16), [0; 16], "nothing past the message");
}

#[test]
fn malformed_trains_are_dropped_and_counted_without_touching_memory() {
    let src = train_source(8192, 1);
    // (transport, header, npkts, len): every one wrong in one way.
    type Header = Box<dyn Fn(&Node) -> PacketRepr>;
    let mut bad: Vec<(QpType, Header, u32, usize)> = Vec::new();
    // npkts does not match the length at the MTU.
    bad.push((QpType::Rc, Box::new(|n| write_only(n, RQ_PSN, 0, 8192)), 7, 8192));
    // A train without payload (one packet at any MTU).
    bad.push((QpType::Rc, Box::new(|n| write_only(n, RQ_PSN, 0, 0)), 1, 0));
    // Not an ONLY packet.
    bad.push((
        QpType::Rc,
        Box::new(|n| {
            let mut h = write_only(n, RQ_PSN, 0, 8192);
            h.bth.opcode = Opcode::RcRdmaWriteFirst;
            h
        }),
        8,
        8192,
    ));
    // A read request.
    bad.push((
        QpType::Rc,
        Box::new(|n| {
            let mut h = write_only(n, RQ_PSN, 0, 8192);
            h.bth.opcode = Opcode::RcRdmaReadRequest;
            h
        }),
        8,
        8192,
    ));
    // UC.
    bad.push((
        QpType::Uc,
        Box::new(|n| {
            let mut h = write_only(n, RQ_PSN, 0, 8192);
            h.bth.opcode = Opcode::UcRdmaWriteOnly;
            h
        }),
        8,
        8192,
    ));
    for (i, (qp_type, h, npkts, len)) in bad.iter().enumerate() {
        let mut n = node(*qp_type, Mtu::Mtu1024);
        let h = h(&n);
        n.inject_train(0, &h, *npkts, &src, *len);
        assert_eq!(n.core.counters().rx_bad_train, 1, "case {i}");
        assert!(n.sent().is_empty(), "case {i}: no ACK or NAK");
        assert_eq!(n.read_mem(0, 8192), vec![0u8; 8192], "case {i}: memory untouched");
    }
    // A train whose length differs from its RETH: an invalid request, as
    // for packets, and nothing written.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.inject_train(0, &write_only(&n, RQ_PSN, 0, 8000), 8, &src, 8192);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::Nak(NakCode::InvalidRequest));
    assert_eq!(n.read_mem(0, 8192), vec![0u8; 8192]);
}

#[test]
fn the_requester_sends_a_train_only_where_the_route_allows() {
    for route in [true, false] {
        let mut n = node(QpType::Rc, Mtu::Mtu1024);
        let caps = if route {
            by_reference::TrainCaps::SHARED
        } else {
            by_reference::TrainCaps::NONE
        };
        n.core.set_train_route(Arc::new(Route(caps)));
        n.post_send(
            0,
            1,
            SendOp::Write {
                remote: RemoteAddr { addr: 0x1000, rkey: 9 },
            },
            0,
            40_000,
        );
        let mut txs = Vec::new();
        while let Some(t) = n.core.poll_transmit() {
            txs.push(t);
        }
        if route {
            assert_eq!(txs.len(), 1);
            let t = txs[0].train.as_ref().expect("a train");
            assert_eq!((t.npkts, t.len()), (40, 40_000));
            let p = Packet::parse(&txs[0].data).unwrap();
            assert_eq!(p.headers.bth.opcode, Opcode::RcRdmaWriteOnly);
            assert_eq!(p.headers.reth.unwrap().dma_len, 40_000);
            assert!(p.payload.is_empty());
        } else {
            assert_eq!(txs.len(), 40);
            assert!(txs.iter().all(|t| t.train.is_none()));
        }
        // Either way the ACK of the last PSN completes the WR once.
        n.inject(1, &ack(n.qpn, SQ_PSN + 39, Syndrome::ACK), &[]);
        let wc = n.cqes();
        assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
        // Short messages never go as trains: below the threshold (two
        // packets at this MTU).
        n.post_send(2, 2, SendOp::Send, 0, by_reference::TRAIN_MIN_LEN - 1);
        assert!(n.core.poll_transmit().is_some_and(|t| t.train.is_none()));
        assert!(n.core.poll_transmit().is_some_and(|t| t.train.is_none()));
        n.post_send(3, 3, SendOp::Send, 0, 1024);
        assert!(n.core.poll_transmit().is_some_and(|t| t.train.is_none()));
    }
}

/// A message of one packet from [`by_reference::TRAIN_MIN_LEN`] bytes (4 KiB at
/// MTU 4096, the usual storage I/O) goes as a train where the receiver
/// takes trains of one packet, as a packet where it does not; the
/// receiver places it once and ACKs its PSN, and answers a one-packet
/// READ with a train the same way.
#[test]
fn one_packet_messages_go_as_trains_where_the_receiver_takes_them() {
    for caps in [ONE_TOO, by_reference::TrainCaps::SHARED] {
        let mut n = node(QpType::Rc, Mtu::Mtu4096);
        n.core.set_train_route(Arc::new(Route(caps)));
        let remote = RemoteAddr { addr: 0x1000, rkey: 9 };
        n.post_send(0, 1, SendOp::Write { remote }, 0, 4096);
        let t = n.core.poll_transmit().expect("a packet");
        assert!(n.core.poll_transmit().is_none());
        let p = Packet::parse(&t.data).unwrap();
        assert_eq!(p.headers.bth.opcode, Opcode::RcRdmaWriteOnly);
        if caps.one_packet {
            let tr = t.train.as_ref().expect("a train");
            assert_eq!((tr.npkts, tr.len()), (1, 4096));
            assert!(p.payload.is_empty());
        } else {
            assert!(t.train.is_none());
            assert_eq!(p.payload.len(), 4096);
        }
        n.inject(1, &ack(n.qpn, SQ_PSN, Syndrome::ACK), &[]);
        let wc = n.cqes();
        assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
        // Below the threshold, one packet goes as a packet either way.
        n.post_send(2, 2, SendOp::Send, 0, by_reference::TRAIN_MIN_LEN - 1);
        assert!(n.core.poll_transmit().is_some_and(|t| t.train.is_none()));

        // Responder: a one-packet READ of shareable memory.
        let mut n = node(QpType::Rc, Mtu::Mtu4096);
        n.core.set_train_route(Arc::new(Route(caps)));
        n.inject(0, &read_req(&n, RQ_PSN, 8, 3000), &[]);
        let t = n.core.poll_transmit().expect("a response");
        assert!(n.core.poll_transmit().is_none());
        let p = Packet::parse(&t.data).unwrap();
        assert_eq!(p.headers.bth.opcode, Opcode::RcRdmaReadResponseOnly);
        match &t.train {
            Some(tr) => {
                assert!(caps.one_packet);
                assert_eq!((tr.npkts, tr.len(), p.payload.len()), (1, 3000, 0));
            }
            None => assert!(!caps.one_packet && p.payload.len() == 3000),
        }
    }

    // The receiving end: a WRITE train of one packet lands once and is
    // ACKed at its PSN; the next PSN follows it; its retransmission is a
    // duplicate.
    let mut n = node(QpType::Rc, Mtu::Mtu4096);
    let src = train_source(4096, 7);
    n.inject_train(0, &write_only(&n, RQ_PSN, 64, 4096), 1, &src, 4096);
    assert_landed(&n, &src, 64, 4096);
    let acks = n.sent();
    assert_eq!(
        (acks.len(), acks[0].0.bth.psn.value(), aeth_of(&acks[0].0)),
        (1, RQ_PSN, Syndrome::ACK)
    );
    assert_eq!((n.core.counters().rx_trains, n.core.counters().rx_bad_train), (1, 0));
    n.post_recv(1, 30_000, 64);
    n.inject(1, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 1), b"next");
    assert_eq!(n.cqes().len(), 1);
    n.mem.write_at(64, &[0xee; 8]).unwrap();
    n.sent();
    n.inject_train(2, &write_only(&n, RQ_PSN, 64, 4096), 1, &src, 4096);
    assert_eq!(n.read_mem(64, 8), [0xee; 8]);
    assert_eq!(n.core.counters().rx_duplicates, 1);

    // A READ's one-packet response train completes it once, with its data.
    read_done_by_train(Mtu::Mtu4096, 3000, 1, 9);
}

#[test]
fn read_responses_go_as_one_train_where_the_route_allows_and_land_once() {
    // Responder side: a 40,000-byte read of shareable memory (the node's
    // 64 KiB MR) is answered by one READ_RESPONSE_ONLY train.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.core.set_train_route(Arc::new(Route(by_reference::TrainCaps::SHARED)));
    n.inject(0, &read_req(&n, RQ_PSN, 100, 40_000), &[]);
    let mut txs = Vec::new();
    while let Some(t) = n.core.poll_transmit() {
        txs.push(t);
    }
    assert_eq!(txs.len(), 1);
    let t = txs[0].train.as_ref().expect("a train");
    assert_eq!((t.npkts, t.len()), (40, 40_000));
    let p = Packet::parse(&txs[0].data).unwrap();
    assert_eq!(
        (p.headers.bth.opcode, p.headers.bth.psn.value()),
        (Opcode::RcRdmaReadResponseOnly, RQ_PSN)
    );
    assert!(p.headers.aeth.is_some());
    // A duplicate request for the rest (from the 11th packet) is answered
    // from saved state by a train of the remaining 30 packets.
    n.inject(1, &read_req(&n, RQ_PSN + 10, 100 + 10_240, 40_000 - 10_240), &[]);
    let t = n.core.poll_transmit().unwrap();
    assert_eq!(t.train.as_ref().map(|t| t.npkts), Some(30));
    assert_eq!(Packet::parse(&t.data).unwrap().headers.bth.psn.value(), RQ_PSN + 10);

    // Requester side: the train completes the read once, with its data.
    let (mut n, r, src) = read_done_by_train(Mtu::Mtu1024, 40_000, 40, 5);
    // The same train again is stale: nothing more completes.
    n.inject_train(2, &r, 40, &src, 40_000);
    assert!(n.cqes().is_empty());

    // A train that does not cover the rest of the read is a bad response.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let remote = RemoteAddr { addr: 0x9000, rkey: 7 };
    n.post_send(0, 1, SendOp::Read { remote }, 200, 40_000);
    n.sent();
    n.inject_train(1, &r, 39, &src, 39_000);
    let wc = n.cqes();
    assert_eq!(wc[0].status, WcStatus::BadRespErr);
}
