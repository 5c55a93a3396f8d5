//! Scripted RC/UC reliability on the simulated fabric (docs/design.md §3.7): each
//! test stages one mechanism with a packet filter and checks the wire (the
//! packet log) and the outcome.

use std::sync::{Arc, Mutex};

use softverbs::soft::proto::Recovery;
use softverbs::soft::wire::{Opcode, Packet};
use softverbs::verbs::{Mtu, QpType, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus};
use softverbs_emulator::sim::conn::pair_with;
use softverbs_emulator::sim::trace::TraceKind;
use softverbs_emulator::sim::{pair, FaultModel, FilterPacket, LinkConfig, NodeId, QpOptions, Verdict};

const A: NodeId = NodeId(0);
const B: NodeId = NodeId(1);

fn opts() -> QpOptions {
    QpOptions {
        timeout: 10,
        path_mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    }
}

fn parse(p: &FilterPacket<'_>) -> (Opcode, u32) {
    let pk = Packet::parse(p.data).expect("engines send valid packets");
    (pk.headers.bth.opcode, pk.headers.bth.psn.value())
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Drops the `nth` (0-based) packet from `from` whose opcode is `op`.
fn drop_nth(from: NodeId, op: Opcode, nth: usize) -> softverbs_emulator::sim::PacketFilter {
    let mut seen = 0;
    Box::new(move |p| {
        if p.from == from && parse(p).0 == op {
            seen += 1;
            if seen == nth + 1 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    })
}

#[test]
fn nak_sequence_error_goes_back_n() {
    // Go-back-N (standard peers), and selective repeat between soft
    // devices: the NAK lists the 12 packets held after the gap and only
    // the lost one is resent.
    for (r, resent) in [(Recovery::GoBackN, 13), (Recovery::SelectiveRepeat, 1)] {
        let (mut f, a, b) = pair_with(21, LinkConfig::ideal(), &opts(), 1 << 16, (r, r)).unwrap();
        f.set_trace(None);
        // A 16-packet write; the 4th packet (3rd middle) is lost.
        f.set_filter(drop_nth(A, Opcode::RcRdmaWriteMiddle, 2));
        let data = pattern(16 * 1024, 1);
        a.write(0, &data);
        let sgl = [a.sge(0, 16 * 1024)];
        let wr = SendWr::new(1, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
        a.post_send(&mut f, &[wr]).unwrap();
        f.run_until_idle(10_000).unwrap();
        assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
        assert_eq!(b.read(0, data.len()), data);
        let cb = f.core(B).counters();
        assert_eq!(cb.seq_naks_sent, 1, "one NAK per gap");
        assert_eq!(cb.rx_out_of_sequence, 12, "packets after the gap are held");
        assert_eq!(cb.rx_held, 12);
        let ca = f.core(A).counters();
        assert_eq!(ca.seq_naks_received, 1);
        assert_eq!(ca.retransmit_timeouts, 0, "the NAK, not the timer, recovers");
        assert_eq!(ca.sacks_received, u64::from(r == Recovery::SelectiveRepeat));
        // Go-back-N resends from the lost PSN: 16 + 13 request packets in
        // all; selective repeat 16 + 1.
        let sent = f
            .trace()
            .unwrap()
            .events()
            .filter(|e| e.from == A && matches!(e.kind, TraceKind::Send { .. } | TraceKind::Drop(_)))
            .count();
        assert_eq!(sent, 16 + resent, "{r:?}");
    }
}

#[test]
fn acks_are_coalesced_and_one_ack_completes_many() {
    // ack_every 64: a 200-packet write asks for an ACK at packets 64, 128,
    // 192 and the last.
    let (mut f, a, b) = pair(22, LinkConfig::ideal(), &opts(), 200 * 1024).unwrap();
    let sgl = [a.sge(0, 200 * 1024)];
    let wr = SendWr::new(1, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    f.run_until_idle(10_000).unwrap();
    assert_eq!(f.core(B).counters().tx_responses, 4);
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);

    // Ten sends, the first nine ACKs lost: the tenth ACK completes them all
    // (an ACK acknowledges every PSN up to its own), with no retransmission.
    let mut n = 0;
    f.set_filter(Box::new(move |p| {
        if p.from == B && parse(p).0 == Opcode::RcAcknowledge {
            n += 1;
            if n <= 9 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    }));
    let rsgl = [b.sge(0, 64)];
    for i in 0..10 {
        b.post_recv(&mut f, &[RecvWr::new(i, &rsgl)]).unwrap();
    }
    let sgl = [a.sge(0, 64)];
    let wrs: Vec<_> = (0..10)
        .map(|i| SendWr::new(i, SendOp::Send, &sgl).flags(SendFlags::SIGNALED))
        .collect();
    a.post_send(&mut f, &wrs).unwrap();
    f.run_until_idle(10_000).unwrap();
    let ids: Vec<_> = a.poll_send(&mut f).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(ids, (0..10).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    assert_eq!(f.core(A).counters().retransmits, 0);
    assert_eq!(b.poll_recv(&mut f).len(), 10);
}

#[test]
fn duplicate_send_is_reacked_not_redelivered() {
    let (mut f, a, b) = pair(23, LinkConfig::ideal(), &opts(), 4096).unwrap();
    f.set_filter(drop_nth(B, Opcode::RcAcknowledge, 0));
    let rsgl = [b.sge(0, 64), b.sge(64, 64)];
    b.post_recv(&mut f, &[RecvWr::new(1, &rsgl[..1]), RecvWr::new(2, &rsgl[1..])])
        .unwrap();
    a.write(1000, b"once");
    let sgl = [a.sge(1000, 4)];
    a.post_send(&mut f, &[SendWr::new(1, SendOp::Send, &sgl).flags(SendFlags::SIGNALED)])
        .unwrap();
    f.run_until_idle(10_000).unwrap();
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
    let r = b.poll_recv(&mut f);
    assert_eq!(r.len(), 1, "the retransmission is not delivered again");
    assert_eq!(f.core(B).counters().rx_duplicates, 1);
    assert_eq!(f.core(A).counters().retransmit_timeouts, 1);
}

#[test]
fn duplicate_atomic_is_replayed_never_reexecuted() {
    let (mut f, a, b) = pair(24, LinkConfig::ideal(), &opts(), 4096).unwrap();
    // Lose both the first atomic ACK and the replay of the second try.
    let mut n = 0;
    f.set_filter(Box::new(move |p| {
        if p.from == B && parse(p).0 == Opcode::RcAtomicAcknowledge {
            n += 1;
            if n <= 2 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    }));
    b.write(8, &100u64.to_ne_bytes());
    let res = [a.sge(0, 8)];
    let cas = [a.sge(16, 8)];
    let wrs = [
        SendWr::new(
            1,
            SendOp::FetchAdd {
                remote: b.remote(8),
                add: 5,
            },
            &res,
        )
        .flags(SendFlags::SIGNALED),
        SendWr::new(
            2,
            SendOp::CompareSwap {
                remote: b.remote(8),
                compare: 105,
                swap: 7,
            },
            &cas,
        )
        .flags(SendFlags::SIGNALED),
    ];
    a.post_send(&mut f, &wrs).unwrap();
    f.run_until_idle(10_000).unwrap();
    let st: Vec<_> = a.poll_send(&mut f).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(a.load_u64(0), 100, "FAA result from the saved state");
    assert_eq!(a.load_u64(16), 105, "CAS saw the FAA exactly once");
    assert_eq!(b.load_u64(8), 7);
    assert!(f.core(B).counters().rx_duplicates >= 2);
}

#[test]
fn lost_read_response_is_reread_from_the_missing_part() {
    let (mut f, a, b) = pair(25, LinkConfig::ideal(), &opts(), 1 << 16).unwrap();
    // Lose the 5th of 8 response packets; record the read requests.
    let requests = Arc::new(Mutex::new(Vec::new()));
    let req = requests.clone();
    let mut resp = 0;
    f.set_filter(Box::new(move |p| {
        let pk = Packet::parse(p.data).unwrap();
        match pk.headers.bth.opcode {
            Opcode::RcRdmaReadRequest => {
                let r = pk.headers.reth.unwrap();
                req.lock().unwrap().push((pk.headers.bth.psn.value(), r.va, r.dma_len));
            }
            Opcode::RcRdmaReadResponseMiddle => {
                resp += 1;
                if resp == 4 {
                    return Verdict::Drop;
                }
            }
            _ => {}
        }
        Verdict::Pass
    }));
    let data = pattern(8 * 1024, 9);
    b.write(0, &data);
    // Scatter into three SGEs of odd sizes.
    let sgl = [a.sge(0, 1000), a.sge(5000, 3000), a.sge(20_000, 8 * 1024 - 4000)];
    let wr = SendWr::new(1, SendOp::Read { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    f.run_until_idle(10_000).unwrap();
    let wc = &a.poll_send(&mut f)[0];
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 8192)
    );
    let mut got = a.read(0, 1000);
    got.extend(a.read(5000, 3000));
    got.extend(a.read(20_000, 8 * 1024 - 4000));
    assert_eq!(got, data);
    let reqs = requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2, "{reqs:x?}");
    let (psn0, va0, len0) = reqs[0];
    assert_eq!((len0, reqs[1].0), (8192, (psn0 + 4) & 0xff_ffff));
    assert_eq!(reqs[1].1, va0 + 4 * 1024, "the new request starts at the missing part");
    assert_eq!(reqs[1].2, 4 * 1024);
}

#[test]
fn outstanding_reads_are_bounded_by_max_rd_atomic() {
    let o = QpOptions {
        max_rd_atomic: 2,
        max_dest_rd_atomic: 2,
        ..opts()
    };
    let (mut f, a, b) = pair(26, LinkConfig::ideal(), &o, 1 << 16).unwrap();
    f.set_trace(None);
    let sgls: Vec<_> = (0..6).map(|i| [a.sge(i * 2048, 2048)]).collect();
    let wrs: Vec<_> = sgls
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr::new(i as u64, SendOp::Read { remote: b.remote(0) }, s).flags(SendFlags::SIGNALED))
        .collect();
    a.post_send(&mut f, &wrs).unwrap();
    f.run_until_idle(10_000).unwrap();
    assert_eq!(a.poll_send(&mut f).len(), 6);
    let (mut out, mut max) = (0i32, 0);
    for e in f.trace().unwrap().events() {
        let sent = e.from == A && matches!(e.kind, TraceKind::Send { .. });
        let done = e.to == Some(A) && e.kind == TraceKind::Deliver;
        if sent && e.packet.starts_with("RC_RDMA_READ_REQUEST") {
            out += 1;
            max = max.max(out);
        }
        if done && e.packet.starts_with("RC_RDMA_READ_RESPONSE_LAST") {
            out -= 1;
        }
    }
    assert_eq!(max, 2);
}

#[test]
fn fence_holds_a_send_until_the_read_it_forwards_is_done() {
    let (mut f, a, b) = pair(27, LinkConfig::ideal(), &opts(), 1 << 16).unwrap();
    // Delay read responses: without the fence the send would carry stale
    // bytes.
    f.set_filter(Box::new(|p| {
        if parse(p).0 == Opcode::RcRdmaReadResponseOnly {
            Verdict::Delay(5_000_000)
        } else {
            Verdict::Pass
        }
    }));
    let data = pattern(512, 3);
    b.write(0, &data);
    let rsgl = [b.sge(4096, 512)];
    b.post_recv(&mut f, &[RecvWr::new(1, &rsgl)]).unwrap();
    let land = [a.sge(0, 512)];
    let wrs = [
        SendWr::new(1, SendOp::Read { remote: b.remote(0) }, &land),
        SendWr::new(2, SendOp::Send, &land).flags(SendFlags::SIGNALED | SendFlags::FENCE),
    ];
    a.post_send(&mut f, &wrs).unwrap();
    f.run_until_idle(10_000).unwrap();
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
    assert_eq!(b.poll_recv(&mut f)[0].byte_len, 512);
    assert_eq!(b.read(4096, 512), data);
}

#[test]
fn corrupted_packets_are_caught_by_the_icrc() {
    let link = LinkConfig {
        faults: FaultModel {
            corrupt: 0.2,
            ..FaultModel::NONE
        },
        ..LinkConfig::ideal()
    };
    let (mut f, a, b) = pair(28, link, &opts(), 1 << 17).unwrap();
    let data = pattern(100 * 1024, 5);
    a.write(0, &data);
    let sgl = [a.sge(0, data.len() as u32)];
    let wr = SendWr::new(1, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    f.run_until_idle(100_000).unwrap();
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
    assert_eq!(b.read(0, data.len()), data);
    assert!(f.stats().corrupted > 10);
    let caught = f.core(A).counters().rx_bad_icrc + f.core(B).counters().rx_bad_icrc;
    assert_eq!(caught, f.stats().corrupted, "every flipped bit is caught");
}

#[test]
fn psns_wrap_around() {
    let o = QpOptions {
        psn_a: 0xff_fff0,
        psn_b: 0xff_fffe,
        ..opts()
    };
    let link = LinkConfig {
        faults: FaultModel::lossy(0.05),
        ..LinkConfig::ideal()
    };
    let (mut f, a, b) = pair(29, link, &o, 1 << 17).unwrap();
    let data = pattern(40 * 1024, 7);
    a.write(0, &data);
    let sa = [a.sge(0, data.len() as u32)];
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote: b.remote(45_000),
        },
        &sa,
    )
    .flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    let rd = [b.sge(0, 100)];
    let wr = SendWr::new(2, SendOp::Read { remote: a.remote(0) }, &rd).flags(SendFlags::SIGNALED);
    b.post_send(&mut f, &[wr]).unwrap();
    f.run_until_idle(100_000).unwrap();
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
    assert_eq!(b.poll_send(&mut f)[0].status, WcStatus::Success);
    assert_eq!(b.read(45_000, data.len()), data);
    assert_eq!(b.read(0, 100), data[..100]);
    assert!(
        f.core(A).query_qp(a.qpn).unwrap().sq_psn < 0x100,
        "the send PSN wrapped"
    );
}

#[test]
fn uc_drops_whole_messages_on_loss() {
    let o = QpOptions {
        qp_type: QpType::Uc,
        ..opts()
    };
    let (mut f, a, b) = pair(30, LinkConfig::ideal(), &o, 1 << 16).unwrap();
    // Lose the middle packet of the second of three 3-packet sends.
    f.set_filter(drop_nth(A, Opcode::UcSendMiddle, 1));
    let rsgl: Vec<_> = (0..3).map(|i| [b.sge(i * 4096, 4096)]).collect();
    for (i, s) in rsgl.iter().enumerate() {
        b.post_recv(&mut f, &[RecvWr::new(i as u64, s)]).unwrap();
    }
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| pattern(3000, i as u8)).collect();
    for (i, m) in msgs.iter().enumerate() {
        a.write(i * 4096, m);
    }
    let sgls: Vec<_> = (0..3).map(|i| [a.sge(i * 4096, 3000)]).collect();
    let wrs: Vec<_> = sgls
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr::new(i as u64, SendOp::Send, s).flags(SendFlags::SIGNALED))
        .collect();
    a.post_send(&mut f, &wrs).unwrap();
    f.run_until_idle(10_000).unwrap();
    // UC completes every send at the requester...
    let st: Vec<_> = a.poll_send(&mut f).iter().map(|w| w.status).collect();
    assert_eq!(st, [WcStatus::Success; 3]);
    // ...the receiver gets messages 0 and 2 whole, in receives 0 and 1;
    // receive 1 was reused after the broken message.
    let r = b.poll_recv(&mut f);
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].wr_id, r[0].byte_len), (0, 3000));
    assert_eq!((r[1].wr_id, r[1].byte_len), (1, 3000));
    assert_eq!(b.read(0, 3000), msgs[0]);
    assert_eq!(b.read(4096, 3000), msgs[2]);
    assert_eq!(f.core(B).counters().uc_dropped_messages, 1);
}

#[test]
fn rnr_nak_waits_then_delivers() {
    let o = QpOptions {
        min_rnr_timer: 10, // 320 µs
        ..opts()
    };
    let (mut f, a, b) = pair(31, LinkConfig::ideal(), &o, 4096).unwrap();
    let sgl = [a.sge(0, 100)];
    a.post_send(&mut f, &[SendWr::new(1, SendOp::Send, &sgl).flags(SendFlags::SIGNALED)])
        .unwrap();
    f.run_until(1_000_000, 10_000).unwrap();
    let naks = f.core(B).counters().rnr_naks_sent;
    assert!((3..=4).contains(&naks), "one RNR NAK per 320 µs wait: {naks}");
    let rsgl = [b.sge(0, 128)];
    b.post_recv(&mut f, &[RecvWr::new(1, &rsgl)]).unwrap();
    f.run_until_idle(10_000).unwrap();
    assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
    assert_eq!(b.poll_recv(&mut f)[0].byte_len, 100);
}
