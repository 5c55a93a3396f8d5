//! Trains end to end on the in-process link: large RC WRITEs and SENDs
//! from shareable buffers travel as one request each and are copied once
//! (counted by both devices), as do the responses of large READs, land
//! byte for byte, complete exactly once,
//! survive an RNR retry, and interleave correctly with packet-by-packet
//! messages on the same QP.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;

struct Side {
    dev: Arc<SoftDevice>,
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

const MR_LEN: usize = 2 << 20;

fn side(fabric: &Arc<InprocFabric>, name: &str, last: u8) -> Side {
    let mut cfg = SoftDeviceConfig::new(name, IpAddr::V4(Ipv4Addr::new(10, 88, 0, last)));
    cfg.link = Some(fabric.clone());
    let dev = SoftDevice::create(cfg).unwrap();
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, 0, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })
        .unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.alloc_mr(MR_LEN, access).unwrap();
    Side {
        dev,
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn pair(tag: u8) -> (Side, Side) {
    let fabric = InprocFabric::new();
    let a = side(&fabric, &format!("train{tag}a"), 1);
    let b = side(&fabric, &format!("train{tag}b"), 2);
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0).unwrap().with_psn(0);
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0).unwrap().with_psn(0);
    let opts = Connect::new()
        .mtu(Mtu::Mtu4096)
        .min_rnr_timer(1)
        .max_rd_atomic(1)
        .max_dest_rd_atomic(1);
    opts.apply(&a.ctx, &a.qp, &ea, Some(&eb)).unwrap();
    opts.apply(&b.ctx, &b.qp, &eb, Some(&ea)).unwrap();
    (a, b)
}

/// Polls both CQs until `want` completions arrived (10 s bound).
fn collect(a: &Side, b: &Side, want: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    let until = Instant::now() + Duration::from_secs(10);
    while out.len() < want && Instant::now() < until {
        for s in [a, b] {
            let n = s.cq.poll(&mut wc).unwrap();
            out.extend_from_slice(&wc[..n]);
        }
    }
    // Nothing more arrives: each WR completed exactly once.
    for s in [a, b] {
        assert_eq!(s.cq.poll(&mut wc).unwrap(), 0, "a surplus completion");
    }
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7) as u8) ^ seed.wrapping_add((i >> 12) as u8))
        .collect()
}

fn read(mr: &Mr, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mr.read(off, &mut v).unwrap();
    v
}

fn counters(s: &Side) -> (u64, u64) {
    let c = s.dev.shared().counters();
    (c.tx_trains, c.rx_trains)
}

#[test]
fn large_writes_and_sends_travel_as_trains_and_land_exactly() {
    let (a, b) = pair(1);
    let data = pattern(MR_LEN, 5);
    a.mr.write(0, &data).unwrap();

    // 1 MiB WRITE; a WRITE_WITH_IMM of 300 KiB gathered from two SGEs; a
    // SEND of 200 KiB + 3 bytes scattered over three receive SGEs.
    let w1 = [a.mr.sge(0, 1 << 20).unwrap()];
    let w2 = [a.mr.sge(1 << 20, 100 << 10).unwrap(), a.mr.sge(5, 200 << 10).unwrap()];
    let s1 = [a.mr.sge(1_500_000, (200 << 10) + 3).unwrap()];
    let r1 = [
        b.mr.sge(1_200_000, 4096).unwrap(),
        b.mr.sge(1_300_000, 100_000).unwrap(),
    ];
    let r2 = [
        b.mr.sge(1_500_000, 50_000).unwrap(),
        b.mr.sge(1_600_000, 60_000).unwrap(),
        b.mr.sge(1_700_000, 200_000).unwrap(),
    ];
    b.qp.post_recv(&[RecvWr::new(21, &r1), RecvWr::new(22, &r2)]).unwrap();
    let wrs = [
        SendWr::new(1, SendOp::Write { remote: b.mr.remote(0) }, &w1),
        SendWr::new(
            2,
            SendOp::WriteWithImm {
                remote: b.mr.remote(1 << 20),
                imm: 0xabcd,
            },
            &w2,
        ),
        SendWr::new(3, SendOp::SendWithImm { imm: 7 }, &s1),
    ];
    a.qp.post_send(&wrs).unwrap();
    let wcs = collect(&a, &b, 5);
    assert_eq!(wcs.len(), 5, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut ids: Vec<_> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 21, 22]);
    let imm = wcs.iter().find(|w| w.wr_id == 21).unwrap();
    assert_eq!(
        (imm.opcode, imm.imm_data, imm.byte_len),
        (WcOpcode::RecvRdmaWithImm, 0xabcd, 300 << 10)
    );
    let recv = wcs.iter().find(|w| w.wr_id == 22).unwrap();
    assert_eq!((recv.opcode, recv.byte_len), (WcOpcode::Recv, (200 << 10) + 3));

    assert_eq!(read(&b.mr, 0, 1 << 20), data[..1 << 20]);
    let mut gathered = data[1 << 20..(1 << 20) + (100 << 10)].to_vec();
    gathered.extend_from_slice(&data[5..5 + (200 << 10)]);
    assert_eq!(read(&b.mr, 1 << 20, 300 << 10), gathered);
    let sent = &data[1_500_000..1_500_000 + (200 << 10) + 3];
    let mut scattered = read(&b.mr, 1_500_000, 50_000);
    scattered.extend(read(&b.mr, 1_600_000, 60_000));
    scattered.extend(read(&b.mr, 1_700_000, sent.len() - 110_000));
    assert_eq!(scattered, sent);
    assert_eq!(
        read(&b.mr, 1_700_000 + sent.len() as u64 - 110_000, 8),
        [0; 8],
        "nothing past the message"
    );

    assert_eq!(counters(&a), (3, 0));
    assert_eq!(counters(&b), (0, 3));
}

/// Buffers far smaller than the shareable-file threshold come from shared
/// slabs, so their messages of a few packets travel as trains too.
#[test]
fn small_buffers_carry_trains_too() {
    let (a, b) = pair(5);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let src = a._pd.alloc_mr(16 << 10, access).unwrap();
    let dst = b._pd.alloc_mr(16 << 10, access).unwrap();
    let data = pattern(16 << 10, 3);
    src.write(0, &data).unwrap();
    let s = [src.sge(100, 8 << 10).unwrap()];
    a.qp.post_send(&[SendWr::new(1, SendOp::Write { remote: dst.remote(50) }, &s)])
        .unwrap();
    let wcs = collect(&a, &b, 1);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert_eq!(read(&dst, 50, 8 << 10), data[100..100 + (8 << 10)]);
    assert_eq!(read(&dst, 0, 50), vec![0; 50], "nothing before the target");
    assert_eq!((counters(&a).0, counters(&b).1), (1, 1));
}

#[test]
fn a_send_train_without_a_receive_is_retried_after_the_rnr_nak() {
    let (a, b) = pair(2);
    let data = pattern(64 << 10, 9);
    a.mr.write(0, &data).unwrap();
    let s = [a.mr.sge(0, 64 << 10).unwrap()];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &s)]).unwrap();
    // Let the RNR NAK happen, then post the receive.
    let mut wc = [WorkCompletion::default(); 4];
    let until = Instant::now() + Duration::from_millis(20);
    while Instant::now() < until {
        assert_eq!(a.cq.poll(&mut wc).unwrap() + b.cq.poll(&mut wc).unwrap(), 0);
    }
    assert!(b.dev.shared().counters().rnr_naks_sent >= 1);
    let r = [b.mr.sge(0, 64 << 10).unwrap()];
    b.qp.post_recv(&[RecvWr::new(2, &r)]).unwrap();
    let wcs = collect(&a, &b, 2);
    assert_eq!(wcs.len(), 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(read(&b.mr, 0, 64 << 10), data);
    assert!(counters(&a).0 >= 2, "the retry went as a train too");
}

#[test]
fn trains_and_packets_interleave_in_order_on_one_qp() {
    let (a, b) = pair(3);
    let data = pattern(MR_LEN, 77);
    a.mr.write(0, &data).unwrap();
    // Alternate small (packets) and large (trains) writes to overlapping
    // places, then a send: the final memory is the last writer's, and the
    // send's completion comes after every write landed.
    let mut wrs_sges = Vec::new();
    for i in 0..8u64 {
        let len = if i % 2 == 0 { 1 << 10 } else { 128 << 10 };
        wrs_sges.push((i, [a.mr.sge(i * 4096, len).unwrap()]));
    }
    let wrs: Vec<SendWr<'_>> = wrs_sges
        .iter()
        .map(|(i, s)| SendWr::new(*i, SendOp::Write { remote: b.mr.remote(0) }, s))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let wcs = collect(&a, &b, 8);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    // The last write (i = 7, 128 KiB from 7 * 4096) wins everywhere it
    // reached.
    assert_eq!(read(&b.mr, 0, 128 << 10), data[7 * 4096..7 * 4096 + (128 << 10)]);
    assert_eq!(counters(&a).0, 4);
}

#[test]
fn large_read_responses_travel_as_one_train() {
    let (a, b) = pair(4);
    let data = pattern(MR_LEN, 31);
    b.mr.write(0, &data).unwrap();
    // A 1 MiB read into two local SGEs, then a 300 KiB read.
    let s1 = [a.mr.sge(0, 512 << 10).unwrap(), a.mr.sge(1 << 20, 512 << 10).unwrap()];
    let s2 = [a.mr.sge(1_600_000, 300 << 10).unwrap()];
    let wrs = [
        SendWr::new(
            1,
            SendOp::Read {
                remote: b.mr.remote(4096),
            },
            &s1,
        ),
        SendWr::new(
            2,
            SendOp::Read {
                remote: b.mr.remote(1_100_000),
            },
            &s2,
        ),
    ];
    a.qp.post_send(&wrs).unwrap();
    let wcs = collect(&a, &b, 2);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
    let mut first = read(&a.mr, 0, 512 << 10);
    first.extend(read(&a.mr, 1 << 20, 512 << 10));
    assert_eq!(first, data[4096..4096 + (1 << 20)]);
    assert_eq!(
        read(&a.mr, 1_600_000, 300 << 10),
        data[1_100_000..1_100_000 + (300 << 10)]
    );
    // The responder sent two trains, the requester received them.
    assert_eq!(counters(&b).0, 2);
    assert_eq!(counters(&a).1, 2);
}
