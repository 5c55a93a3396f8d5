//! Loss recovery on the simulated fabric: selective repeat, the
//! reordering buffer and the adaptive probe (provider `soft::proto::recovery`).
//!
//! - a property: random bulk WRITEs, SENDs and READs over random loss,
//!   reordering and duplication, with every pair of recoveries (selective
//!   repeat or go-back-N on each side), complete exactly once, in order,
//!   with the bytes of a reference model, and never deadlock;
//! - the negotiation: a go-back-N side never sends or gets a SACK;
//! - a dead peer still ends in RETRY_EXC_ERR after `retry_cnt` IBTA
//!   timeouts (the probe does not consume retries), and a peer that only
//!   stops for a while (a descheduled process) shorter than that does not;
//! - the goals of `softverbs sim bench` at 1 % loss (virtual time: exact).
//!
//! The other properties of `sim_props` run over all four pairs of
//! recoveries too (`workload::recoveries` picks them from the seed).

use proptest::prelude::*;
use softverbs::soft::proto::Recovery;
use softverbs::verbs::{Mtu, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus};
use softverbs_emulator::sim::bench::{run_one, BenchConfig, BenchOp};
use softverbs_emulator::sim::conn::pair_with;
use softverbs_emulator::sim::{FaultModel, LinkConfig, QpOptions};

/// Cases per property: `PROPTEST_CASES` if set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Bytes a message may take; each op has a slot of this size.
const SLOT: usize = 40_000;

#[derive(Debug, Clone, Copy)]
enum Bulk {
    Write(u32),
    Send(u32),
    Read(u32),
}

fn bulk_strategy() -> impl Strategy<Value = Bulk> {
    let len = prop_oneof![1u32..=64, 65u32..=4096, 4097u32..=SLOT as u32];
    (0u8..10, len).prop_map(|(k, n)| match k {
        0..=5 => Bulk::Write(n),
        6..=8 => Bulk::Send(n),
        _ => Bulk::Read(n),
    })
}

fn recovery_strategy() -> impl Strategy<Value = (Recovery, Recovery)> {
    use Recovery::{GoBackN, SelectiveRepeat};
    prop::sample::select(vec![
        (SelectiveRepeat, SelectiveRepeat),
        (GoBackN, GoBackN),
        (SelectiveRepeat, GoBackN),
        (GoBackN, SelectiveRepeat),
    ])
}

fn pattern(seed: u64, op: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize ^ (op * 131) ^ (i * 7) ^ (i >> 8)) as u8)
        .collect()
}

/// Runs `ops` from A to B and checks completions and memory against the
/// model.
fn check_bulk(
    seed: u64,
    ops: &[Bulk],
    faults: FaultModel,
    recovery: (Recovery, Recovery),
    window: usize,
) -> Result<(), TestCaseError> {
    let link = LinkConfig {
        latency_ns: 2_000,
        bandwidth_bps: 25_000_000_000,
        faults,
        ..LinkConfig::ideal()
    };
    let qp = QpOptions {
        path_mtu: Mtu::Mtu1024,
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpOptions::default()
    };
    let n = ops.len();
    // A: one source slot per op (reads land there). B: one target slot
    // per op (writes and sends land there, reads come from there).
    let (mut f, a, b) =
        pair_with(seed, link, &qp, n * SLOT, recovery).map_err(|e| TestCaseError::fail(format!("setup: {e}")))?;
    let mut want_b = vec![0u8; n * SLOT];
    let mut want_a = vec![0u8; n * SLOT];
    for (i, op) in ops.iter().enumerate() {
        let off = i * SLOT;
        match *op {
            Bulk::Write(len) | Bulk::Send(len) => {
                let p = pattern(seed, i, len as usize);
                a.write(off, &p);
                want_a[off..off + p.len()].copy_from_slice(&p);
                want_b[off..off + p.len()].copy_from_slice(&p);
            }
            Bulk::Read(len) => {
                let p = pattern(!seed, i, len as usize);
                b.write(off, &p);
                want_b[off..off + p.len()].copy_from_slice(&p);
                want_a[off..off + p.len()].copy_from_slice(&p);
            }
        }
        if let Bulk::Send(len) = *op {
            let sgl = [b.sge(off as u64, len)];
            b.post_recv(&mut f, &[RecvWr::new(i as u64, &sgl)])
                .map_err(|e| TestCaseError::fail(format!("post_recv: {e:?}")))?;
        }
    }
    let mut posted = 0usize;
    let mut done = Vec::new();
    let mut recvs = Vec::new();
    let mut steps = 0u64;
    while done.len() < n {
        while posted < n && posted - done.len() < window {
            let off = (posted * SLOT) as u64;
            let (sop, len) = match ops[posted] {
                Bulk::Write(len) => (SendOp::Write { remote: b.remote(off) }, len),
                Bulk::Send(len) => (SendOp::Send, len),
                Bulk::Read(len) => (SendOp::Read { remote: b.remote(off) }, len),
            };
            let sgl = [a.sge(off, len)];
            let wr = SendWr::new(posted as u64, sop, &sgl).flags(SendFlags::SIGNALED);
            a.post_send(&mut f, &[wr])
                .map_err(|e| TestCaseError::fail(format!("post_send: {e:?}")))?;
            posted += 1;
        }
        prop_assert!(f.step(), "idle with {} of {} done: deadlock", done.len(), n);
        steps += 1;
        prop_assert!(steps < 5_000_000, "livelock: {}", f.livelock(steps));
        for wc in a.poll_send(&mut f) {
            prop_assert_eq!(wc.status, WcStatus::Success, "wr {}", wc.wr_id);
            done.push(wc.wr_id);
        }
        recvs.extend(b.poll_recv(&mut f));
    }
    // Exactly once, in post order.
    prop_assert_eq!(&done, &(0..n as u64).collect::<Vec<_>>());
    // Let the last answers settle, then nothing more may complete.
    f.run_until_idle(1_000_000)
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    prop_assert!(a.poll_send(&mut f).is_empty(), "a completion after the last");
    recvs.extend(b.poll_recv(&mut f));
    let sends: Vec<(u64, u32)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match *op {
            Bulk::Send(len) => Some((i as u64, len)),
            _ => None,
        })
        .collect();
    prop_assert_eq!(recvs.len(), sends.len(), "receive completions");
    for (wc, &(id, len)) in recvs.iter().zip(&sends) {
        prop_assert_eq!(wc.status, WcStatus::Success);
        prop_assert_eq!(wc.opcode, WcOpcode::Recv);
        prop_assert_eq!((wc.wr_id, wc.byte_len), (id, len), "receives in order");
    }
    prop_assert!(b.read(0, n * SLOT) == want_b, "B's memory differs from the model");
    prop_assert!(a.read(0, n * SLOT) == want_a, "A's memory differs from the model");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(24), ..ProptestConfig::default() })]

    /// Any loss, reordering and duplication, any pair of recoveries.
    #[test]
    fn bulk_traffic_matches_the_model_under_any_faults(
        seed in any::<u64>(),
        ops in prop::collection::vec(bulk_strategy(), 1..24),
        loss in prop_oneof![Just(0.0), 0.0..0.08f64],
        reorder in prop_oneof![Just(0.0), 0.0..0.3f64],
        duplicate in prop_oneof![Just(0.0), 0.0..0.03f64],
        reorder_ns in 1u64..40_000,
        recovery in recovery_strategy(),
        window in 1usize..8,
    ) {
        let faults = FaultModel { loss, reorder, reorder_ns, duplicate, ..FaultModel::NONE };
        check_bulk(seed, &ops, faults, recovery, window)?;
    }
}

/// Heavy loss and reordering, both pairs of one kind and both mixed ones,
/// on fixed seeds (the property's cases are random; these always run).
#[test]
fn heavy_faults_every_pair() {
    use Recovery::{GoBackN, SelectiveRepeat};
    let ops: Vec<Bulk> = (0..12)
        .map(|i| match i % 4 {
            0 | 1 => Bulk::Write(30_000 + i),
            2 => Bulk::Send(9_000 + i),
            _ => Bulk::Read(20_000 + i),
        })
        .collect();
    let faults = FaultModel {
        loss: 0.05,
        reorder: 0.1,
        reorder_ns: 20_000,
        duplicate: 0.01,
        ..FaultModel::NONE
    };
    for r in [
        (SelectiveRepeat, SelectiveRepeat),
        (GoBackN, GoBackN),
        (SelectiveRepeat, GoBackN),
        (GoBackN, SelectiveRepeat),
    ] {
        for seed in 1..4 {
            check_bulk(seed, &ops, faults, r, 6).unwrap_or_else(|e| panic!("{r:?} seed {seed}: {e}"));
        }
    }
}

fn lossy_pair(recovery: (Recovery, Recovery)) -> (u64, u64, u64, u64, u64) {
    let link = LinkConfig {
        latency_ns: 2_000,
        bandwidth_bps: 25_000_000_000,
        faults: FaultModel {
            loss: 0.03,
            ..FaultModel::NONE
        },
        ..LinkConfig::ideal()
    };
    let (mut f, a, b) = pair_with(7, link, &QpOptions::default(), 1 << 20, recovery).unwrap();
    for i in 0..8u64 {
        let sgl = [a.sge(i * 65536, 65536)];
        let wr = SendWr::new(
            i,
            SendOp::Write {
                remote: b.remote(i * 65536),
            },
            &sgl,
        )
        .flags(SendFlags::SIGNALED);
        a.post_send(&mut f, &[wr]).unwrap();
    }
    f.run_until_idle(5_000_000).unwrap();
    let wcs = a.poll_send(&mut f);
    assert_eq!(wcs.len(), 8);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let (ca, cb) = (f.core(a.node).counters(), f.core(b.node).counters());
    (
        cb.sacks_sent,
        ca.sacks_received,
        ca.sr_resent_packets,
        ca.probes + cb.probes,
        cb.seq_naks_sent,
    )
}

/// Selective repeat only between two nodes that both offer it; a
/// go-back-N side never sends a SACK nor gets one, and the SR side falls
/// back to go-back-N against it.
#[test]
fn selective_repeat_is_negotiated() {
    use Recovery::{GoBackN, SelectiveRepeat};
    let (sent, got, resent, _, naks) = lossy_pair((SelectiveRepeat, SelectiveRepeat));
    assert!(sent > 0 && got > 0 && resent > 0, "SR pair: {sent} {got} {resent}");
    assert!(naks >= sent);
    for r in [
        (GoBackN, GoBackN),
        (SelectiveRepeat, GoBackN),
        (GoBackN, SelectiveRepeat),
    ] {
        let (sent, got, resent, probes, naks) = lossy_pair(r);
        assert_eq!((sent, got, resent, probes), (0, 0, 0, 0), "{r:?}");
        assert!(naks > 0, "{r:?}: go-back-N NAKs expected");
    }
}

/// A peer that is gone: the adaptive probe fires but never consumes a
/// retry; RETRY_EXC_ERR comes after `retry_cnt` + 1 IBTA timeouts, as
/// without it.
#[test]
fn a_dead_peer_still_exhausts_the_retries_on_the_ibta_timer() {
    for r in [Recovery::SelectiveRepeat, Recovery::GoBackN] {
        let qp = QpOptions {
            timeout: 10,
            retry_cnt: 3,
            ..QpOptions::default()
        };
        let (mut f, a, b) = pair_with(3, LinkConfig::ideal(), &qp, 1 << 16, (r, r)).unwrap();
        // Teach the requester the peer and its RTT first.
        let sgl = [a.sge(0, 4096)];
        let wr = SendWr::new(1, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
        a.post_send(&mut f, &[wr]).unwrap();
        f.run_until_idle(100_000).unwrap();
        assert_eq!(a.poll_send(&mut f)[0].status, WcStatus::Success);
        f.isolate(b.node);
        let start = f.now();
        let sgl = [a.sge(0, 8192)];
        let wr = SendWr::new(2, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
        a.post_send(&mut f, &[wr]).unwrap();
        f.run_until_idle(1_000_000).unwrap();
        let wcs = a.poll_send(&mut f);
        assert_eq!(wcs.len(), 1, "{r:?}");
        assert_eq!(wcs[0].status, WcStatus::RetryExcErr, "{r:?}");
        let timeout = 4096u64 << 10;
        assert!(
            f.now() - start >= 4 * timeout,
            "{r:?}: failed after {} ns, before 4 timeouts",
            f.now() - start
        );
        let c = f.core(a.node).counters();
        assert_eq!(c.retransmit_timeouts, 4, "{r:?}");
        if r == Recovery::SelectiveRepeat {
            assert!(c.probes > 0, "the probe fired");
        } else {
            assert_eq!(c.probes, 0);
        }
    }
}

/// The goals of `softverbs sim bench` (virtual time, exact): at 1 % loss
/// selective repeat at least 60 % of the link with p99 under 1 ms, at 5 %
/// at least 30 %, and go-back-N with the reordering buffer no worse than
/// before it (2.91 and 0.27 Gb/s with 400 messages).
#[test]
fn bench_goals() {
    let cfg = BenchConfig {
        reorder: 0.0,
        messages: 200,
        ..BenchConfig::default()
    };
    let sr = run_one(&cfg, BenchOp::Write, 0.01, Recovery::SelectiveRepeat).unwrap();
    assert!(sr.goodput_gbps >= 15.0, "sr: {sr:?}");
    assert!(sr.lat_p99_ns < 1_000_000, "sr: {sr:?}");
    let gbn = run_one(&cfg, BenchOp::Write, 0.01, Recovery::GoBackN).unwrap();
    assert!(gbn.goodput_gbps >= 2.9, "gbn: {gbn:?}");
    // 5 % loss: at least 30 % of the link (go-back-N: 0.27 Gb/s before).
    let sr = run_one(&cfg, BenchOp::Write, 0.05, Recovery::SelectiveRepeat).unwrap();
    assert!(sr.goodput_gbps >= 7.5, "sr: {sr:?}");
    let gbn = run_one(&cfg, BenchOp::Write, 0.05, Recovery::GoBackN).unwrap();
    assert!(gbn.goodput_gbps >= 0.27, "gbn: {gbn:?}");
    // With 1 % reordering and no loss both stay near the link rate.
    let cfg = BenchConfig {
        reorder: 0.01,
        messages: 200,
        ..BenchConfig::default()
    };
    for r in [Recovery::SelectiveRepeat, Recovery::GoBackN] {
        let row = run_one(&cfg, BenchOp::Write, 0.0, r).unwrap();
        assert!(row.goodput_gbps >= 22.5, "{r:?}: {row:?}");
    }
}

/// Hostile SACKs: a malformed extension is dropped and counted; ranges
/// that name PSNs never sent make the requester go back N, never panic
/// or resend what it never sent; the transfer still completes.
#[test]
fn hostile_sacks_are_dropped_or_fall_back() {
    use softverbs::soft::proto::Datagram;
    use softverbs::soft::wire::{
        fill_icrc, set_soft_cap, AethRepr, BthRepr, IpPseudoHeader, NakCode, Opcode, Psn, Qpn, Sack, SackRange,
        Syndrome, UdpPorts, ROCEV2_UDP_PORT,
    };
    let r = Recovery::SelectiveRepeat;
    let qp = QpOptions::default();
    let (mut f, a, b) = pair_with(5, LinkConfig::ideal(), &qp, 1 << 20, (r, r)).unwrap();
    // Learn the peer, then leave a write outstanding (B cut off for now).
    let sgl = [a.sge(0, 4096)];
    let wr = SendWr::new(0, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    f.run_until_idle(100_000).unwrap();
    assert_eq!(a.poll_send(&mut f).len(), 1);
    let (src, dst) = (f.addr(b.node), f.addr(a.node));
    let ports = UdpPorts {
        src: 0xc123,
        dst: ROCEV2_UDP_PORT,
    };
    let psn_b = QpOptions::default().psn_a;
    let build = |ext: &[u8], psn: u32| -> Vec<u8> {
        let mut p = vec![0u8; BthRepr::LEN + AethRepr::LEN];
        BthRepr::new(Opcode::RcAcknowledge, Qpn::new(a.qpn), Psn::new(psn))
            .emit(&mut p[..BthRepr::LEN])
            .unwrap();
        AethRepr {
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn: 0,
        }
        .emit(&mut p[BthRepr::LEN..])
        .unwrap();
        p.extend_from_slice(ext);
        p.extend_from_slice(&[0; 4]);
        set_soft_cap(&mut p);
        fill_icrc(&IpPseudoHeader::between(src, dst).unwrap(), ports, &mut p).unwrap();
        p
    };
    let inject = |f: &mut softverbs_emulator::sim::Fabric, data: &[u8]| {
        f.with(a.node, |core, now| {
            core.handle_datagram(
                now,
                Datagram {
                    src,
                    dst,
                    src_port: ports.src,
                    dst_port: ports.dst,
                    data,
                    train: None,
                },
            )
        });
    };
    let before = f.core(a.node).counters().rx_malformed;
    inject(&mut f, &build(&[0x53, 0x52, 9, 1, 0, 0, 0, 1, 0, 0, 0, 1], psn_b));
    inject(&mut f, &build(&[0xde, 0xad, 1, 0], psn_b));
    assert_eq!(f.core(a.node).counters().rx_malformed, before + 2);
    // A well-formed SACK far beyond anything sent, while a write is out.
    f.isolate(b.node);
    let sgl = [a.sge(0, 65536)];
    let wr = SendWr::new(1, SendOp::Write { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    let next = psn_b + 4; // the write's first PSN (4 packets of 1 KiB before)
    let mut ext = Vec::new();
    Sack {
        ranges: vec![SackRange {
            first: Psn::new(next + 100_000),
            npkts: 5,
        }],
    }
    .emit(&mut ext)
    .unwrap();
    inject(&mut f, &build(&ext, next));
    assert_eq!(f.core(a.node).counters().sr_resent_packets, 0);
    f.heal();
    f.run_until_idle(1_000_000).unwrap();
    let wcs = a.poll_send(&mut f);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
}

/// 64 KiB WRITEs from A to B under 1 % loss, 32 outstanding, while B stops
/// (a descheduled process) for `pause_ns` every ~10 ms of virtual time:
/// what B would receive or send meanwhile waits for the pause's end.
/// Returns the first error status (or success), the WRITEs completed and
/// A's retransmission timeouts.
fn paused_responder(recovery: Recovery, seed: u64, pause_ns: u64, n: usize) -> (WcStatus, usize, u64) {
    use softverbs_emulator::sim::{FilterPacket, Verdict};
    let link = LinkConfig {
        latency_ns: 20_000,
        bandwidth_bps: 10_000_000_000,
        faults: FaultModel::lossy(0.01),
        ..LinkConfig::ideal()
    };
    // The IBTA timeout is 67 ms (14), retry_cnt 7: B is dead to A after
    // 8 timeouts without an answer, 537 ms.
    let qp = QpOptions::default();
    let slots = 32;
    let (mut f, a, b) = pair_with(seed, link, &qp, slots * 65536, (recovery, recovery)).unwrap();
    let bnode = b.node;
    let mut rng = softverbs_emulator::sim::SimRng::derive(seed, 77);
    let mut pauses: Vec<(u64, u64)> = Vec::new();
    let mut t = 2_000_000u64;
    for _ in 0..200 {
        pauses.push((t, t + pause_ns));
        t += pause_ns + rng.range(1_000_000, 20_000_000);
    }
    f.set_filter(Box::new(move |p: &FilterPacket<'_>| {
        if p.to != bnode && p.from != bnode {
            return Verdict::Pass;
        }
        match pauses.iter().find(|&&(s, e)| p.time >= s && p.time < e) {
            Some(&(_, e)) => Verdict::Delay(e - p.time),
            None => Verdict::Pass,
        }
    }));
    let (mut posted, mut done, mut steps) = (0usize, 0usize, 0u64);
    while done < n {
        while posted < n && posted - done < slots {
            let off = ((posted % slots) * 65536) as u64;
            let sgl = [a.sge(off, 65536)];
            let wr =
                SendWr::new(posted as u64, SendOp::Write { remote: b.remote(off) }, &sgl).flags(SendFlags::SIGNALED);
            a.post_send(&mut f, &[wr]).unwrap();
            posted += 1;
        }
        assert!(f.step(), "{recovery:?}: idle with {done} of {n} done");
        steps += 1;
        assert!(steps < 20_000_000, "{recovery:?}: {}", f.livelock(steps));
        for wc in a.poll_send(&mut f) {
            if wc.status != WcStatus::Success {
                return (wc.status, done, f.core(a.node).counters().retransmit_timeouts);
            }
            done += 1;
        }
    }
    (WcStatus::Success, done, f.core(a.node).counters().retransmit_timeouts)
}

/// A live peer that stops answering for a while (a descheduled process)
/// is not a dead one: with stops of 6 IBTA timeouts under 1 % loss, in
/// both recoveries, every WRITE completes (the IBTA timer fires during
/// each stop; the probe, at its shorter period, spends no retry). A stop
/// longer than `retry_cnt` + 1 timeouts ends in RETRY_EXC_ERR, in both.
#[test]
fn a_paused_peer_is_not_a_dead_one() {
    let timeout = 4096u64 << 14;
    for r in [Recovery::SelectiveRepeat, Recovery::GoBackN] {
        let (status, done, rtos) = paused_responder(r, 11, 6 * timeout, 150);
        assert_eq!((status, done), (WcStatus::Success, 150), "{r:?}");
        assert!(rtos >= 6, "{r:?}: the stops fired the IBTA timer ({rtos} timeouts)");
        let (status, done, _) = paused_responder(r, 11, 9 * timeout, 150);
        assert_eq!(
            status,
            WcStatus::RetryExcErr,
            "{r:?}: a stop of 9 timeouts ({done} done)"
        );
    }
}
