//! Regression tests for bugs the simulated fabric found in the soft
//! provider's protocol engine. Each bug has its recorded seed (a scenario of
//! `Scenario::random`, whose generator is frozen for this reason) and, where
//! the mechanism is simple to stage, a scripted test that does not depend on
//! the generator.

use softverbs::soft::wire::{Opcode, Packet};
use softverbs::verbs::{Mtu, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus};
use softverbs_emulator::sim::workload::{Cut, GenLimits, Op, OpKind, Program, Side};
use softverbs_emulator::sim::{pair, FaultModel, FilterPacket, LinkConfig, NodeId, QpOptions, Scenario, Verdict};

/// Runs `sc`; on a violation, replays it traced (the last `trace` events)
/// and fails with the explanation. With `all_succeed`, also fails unless
/// every operation on both sides succeeded.
fn run_explained(sc: &Scenario, trace: usize, all_succeed: bool) {
    match sc.run() {
        Ok(r) => {
            if all_succeed {
                assert_eq!(r.failed, [None, None]);
            }
        }
        Err(v) => {
            let (r, _) = sc.run_traced(Some(trace));
            panic!("{}", r.err().unwrap_or(v));
        }
    }
}

/// Runs `Scenario::random(seed, limits)` and fails with the violation.
fn replay(seed: u64, limits: GenLimits, expect_ops: usize) {
    let sc = Scenario::random(seed, &limits);
    // Guards the generator: if it changed, the seed no longer names the
    // scenario that found the bug.
    assert_eq!(
        sc.program.ops.len(),
        expect_ops,
        "Scenario::random changed (seed {seed}); re-record the seeds"
    );
    run_explained(&sc, 120, false);
}

fn faulty() -> GenLimits {
    GenLimits::default()
}

fn opcode(p: &FilterPacket<'_>) -> Option<Opcode> {
    Packet::parse(p.data).ok().map(|pk| pk.headers.bth.opcode)
}

// ---- recorded seeds ---------------------------------------------------

/// responder `recv_write`: an RNR NAK on a write-only-with-immediate kept the
/// write's progress, so the retry looked like a new message inside an
/// unfinished one: NAK invalid request, both QPs to ERR.
#[test]
fn seed_130_write_imm_retried_after_rnr() {
    replay(
        130,
        GenLimits {
            faults: false,
            ..GenLimits::default()
        },
        5,
    );
}

/// completer `ack_up_to`: a coalesced ACK covering an atomic whose response
/// was lost moved `acked_psn` past the atomic; its replayed response was then
/// dropped as stale until RETRY_EXC_ERR.
#[test]
fn seed_43_ack_does_not_pass_a_missing_atomic_response() {
    replay(43, faulty(), 17);
}

/// completer `handle_read_response`: only the last response of a read reset
/// the retry counter, so a long read over a lossy path ran out of retries
/// while still progressing.
#[test]
fn seed_23_read_progress_resets_the_retry_counter() {
    replay(23, faulty(), 20);
}

/// completer `ack_up_to`: a plain (re-)ACK covering an atomic already reset
/// to Pending by a rewind moved `acked_psn` past it: a retransmission storm
/// (livelock) and no completion.
#[test]
fn seed_663_ack_does_not_pass_a_pending_atomic() {
    replay(663, faulty(), 17);
}

/// completer `rewind`: a late NAK/RNR NAK for a PSN beyond the requester's
/// position moved it forward, skipping WQEs that then never completed.
#[test]
fn seed_622_rewind_never_moves_forward() {
    replay(622, faulty(), 10);
}

/// completer `handle_atomic_ack` / `handle_read_response`: a response whose
/// implied ACK made the requester go back to an earlier read or atomic was
/// still accepted, completing WQEs out of order (RETRY_EXC_ERR, wrong data).
#[test]
fn seed_559_response_after_implied_rewind_is_not_accepted() {
    replay(559, faulty(), 14);
}

/// completer `ack_up_to`: completing a send/write that a rewind had reset to
/// Pending (the fix of `ack_during_rnr_wait_completes_the_reset_send`) let
/// it be retired before the requester stepped over it, leaving `next_psn`
/// inside its PSNs: the next new WQE reused them (a CAS with the PSN of an
/// earlier write; the responder had no saved result for it).
#[test]
fn seed_0x929_new_wqes_never_reuse_psns() {
    replay(0x929, faulty(), 22);
    replay(0x2885, faulty(), 14);
}

// ---- scripted ---------------------------------------------------------

fn opts() -> QpOptions {
    QpOptions {
        timeout: 10,
        ..QpOptions::default()
    }
}

/// The seed-130 bug, staged: write-only-with-immediate with no receive
/// posted, then the receive arrives.
#[test]
fn write_only_with_imm_succeeds_after_rnr() {
    let (mut f, a, b) = pair(
        1,
        LinkConfig::ideal(),
        &QpOptions {
            min_rnr_timer: 1,
            ..opts()
        },
        4096,
    )
    .unwrap();
    a.write(0, b"immediate!");
    let sgl = [a.sge(0, 10)];
    let wr = SendWr::new(
        7,
        SendOp::WriteWithImm {
            remote: b.remote(100),
            imm: 0x1234,
        },
        &sgl,
    )
    .flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    f.run_until(f.now() + 200_000, 100_000).unwrap();
    assert!(f.core(b.node).counters().rnr_naks_sent > 0);
    b.post_recv(&mut f, &[RecvWr::new(1, &[])]).unwrap();
    f.run_until_idle(100_000).unwrap();
    let wcs = a.poll_send(&mut f);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    let rc = b.poll_recv(&mut f);
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(rc[0].imm_data, 0x1234);
    assert_eq!(b.read(100, 10), b"immediate!");
    assert_eq!(a.state(&f), QpState::Rts);
    assert_eq!(b.state(&f), QpState::Rts);
}

/// The seed-43 bug, staged: the atomic ACK of a fetch-and-add is lost and
/// the ACK of the write after it arrives. The FAA must be resent, replayed
/// from the responder's saved result (not executed twice) and complete.
#[test]
fn lost_atomic_ack_then_later_ack() {
    let (mut f, a, b) = pair(2, LinkConfig::ideal(), &opts(), 4096).unwrap();
    let mut dropped = false;
    f.set_filter(Box::new(move |p| {
        if !dropped && opcode(p) == Some(Opcode::RcAtomicAcknowledge) {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Pass
    }));
    b.write(64, &5u64.to_ne_bytes());
    a.write(200, b"payload");
    let res = [a.sge(0, 8)];
    let data = [a.sge(200, 7)];
    let wrs = [
        SendWr::new(
            1,
            SendOp::FetchAdd {
                remote: b.remote(64),
                add: 10,
            },
            &res,
        )
        .flags(SendFlags::SIGNALED),
        SendWr::new(2, SendOp::Write { remote: b.remote(300) }, &data).flags(SendFlags::SIGNALED),
    ];
    a.post_send(&mut f, &wrs).unwrap();
    f.run_until_idle(100_000).unwrap();
    let wcs = a.poll_send(&mut f);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(a.load_u64(0), 5, "the FAA returns the original value");
    assert_eq!(b.load_u64(64), 15, "the FAA ran exactly once");
    assert_eq!(
        f.core(NodeId(0)).counters().retransmit_timeouts,
        0,
        "recovered without a timeout"
    );
}

/// The seed-23 bug, staged: a 256-packet read with every 40th response lost
/// and `retry_cnt` 1 still completes, since each timeout round progresses.
#[test]
fn long_lossy_read_completes_with_one_retry() {
    let o = QpOptions {
        path_mtu: softverbs::verbs::Mtu::Mtu256,
        retry_cnt: 1,
        ..opts()
    };
    let (mut f, a, b) = pair(3, LinkConfig::ideal(), &o, 70_000).unwrap();
    let mut n = 0u32;
    f.set_filter(Box::new(move |p| {
        if p.from == NodeId(1) {
            n += 1;
            if n.is_multiple_of(40) {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    }));
    let pattern: Vec<u8> = (0..65_536u32).map(|i| (i * 7 + 3) as u8).collect();
    b.write(0, &pattern);
    let sgl = [a.sge(0, 65_536)];
    let wr = SendWr::new(1, SendOp::Read { remote: b.remote(0) }, &sgl).flags(SendFlags::SIGNALED);
    a.post_send(&mut f, &[wr]).unwrap();
    f.run_until_idle(1_000_000).unwrap();
    let wcs = a.poll_send(&mut f);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(a.read(0, 65_536), pattern);
}

/// completer `ack_up_to` (found by the soak run, proptest seeds
/// 0x34459e35fd4b6e54 and 0x683362e9cfc822e0, kept in
/// `sim_props.proptest-regressions`): an RNR NAK resets a send to Pending;
/// during the RNR wait the ACK of an earlier copy that the responder
/// executed arrives. It moved `acked_psn` past the Pending send without
/// completing it; the resend's re-ACK was then outside the response window
/// and the timer rewound past it: RETRY_EXC_ERR. Staged: the first send is
/// duplicated, the copy arriving after the receive is posted.
#[test]
fn ack_during_rnr_wait_completes_the_reset_send() {
    let link = LinkConfig {
        latency_ns: 10_000,
        ..LinkConfig::ideal()
    };
    let o = QpOptions {
        min_rnr_timer: 14, // 1.28 ms
        ..opts()
    };
    let (mut f, a, b) = pair(4, link, &o, 4096).unwrap();
    let mut first = true;
    f.set_filter(Box::new(move |p| {
        if first && p.from == NodeId(0) {
            first = false;
            return Verdict::DuplicateAfter(500_000);
        }
        Verdict::Pass
    }));
    let sgl = [a.sge(0, 100)];
    a.post_send(&mut f, &[SendWr::new(1, SendOp::Send, &sgl).flags(SendFlags::SIGNALED)])
        .unwrap();
    f.run_until(100_000, 10_000).unwrap();
    assert_eq!(f.core(b.node).counters().rnr_naks_sent, 1);
    let rsgl = [b.sge(0, 128)];
    b.post_recv(&mut f, &[RecvWr::new(1, &rsgl), RecvWr::new(2, &rsgl)])
        .unwrap();
    f.run_until_idle(10_000).unwrap();
    let wcs = a.poll_send(&mut f);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(b.poll_recv(&mut f).len(), 1, "delivered once");
    assert_eq!(f.core(a.node).counters().retransmit_timeouts, 0);
}

/// A fault model with every fault on, for a sanity run of the regressions'
/// mechanisms together.
#[test]
fn all_faults_together_still_deliver() {
    let link = LinkConfig {
        faults: FaultModel {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.1,
            reorder_ns: 50_000,
            corrupt: 0.03,
            spike: 0.01,
            spike_ns: 8_000_000,
        },
        ..LinkConfig::ideal()
    };
    for seed in 0..8 {
        let sc = Scenario {
            link_ab: link,
            link_ba: link,
            ..Scenario::random(seed, &GenLimits::default())
        };
        if let Err(v) = sc.run() {
            panic!("{v}");
        }
    }
}

// ---- found with trains, older than them ---------------------------------

/// completer `ack_up_to`: an ACK covering writes after a read whose
/// responses were partly lost left those writes unfinished, so every
/// re-read (one per lost response) resent them too. Found by the trains
/// property when it drew 1 MiB messages, failing the same way with trains
/// off: a 717 KB read, a 2 MB write and an atomic over links losing ~2 % and
/// ~9 % of packets. The full trace showed the atomic sent at 86.8 ms
/// arriving at 158.1 ms, queued behind ~40 resends of the 2 MB write, and
/// then RETRY_EXC_ERR. The responder executes in order, so an ACK for PSN n
/// means the sends and writes up to n arrived; they are now done, and a
/// rewind re-asks only for the read (and later reads and atomics, which
/// need their responses).
#[test]
fn large_writes_after_a_lossy_read_are_not_resent() {
    let sc = Scenario {
        seed: 18286315348265179599,
        program: Program {
            ops: vec![
                Op {
                    side: Side::A,
                    kind: OpKind::Read,
                    sges: vec![717188],
                    signaled: true,
                    fence: false,
                    from_read: true,
                    recv_sges: 1,
                    recv_slack: 15,
                    counter: 3,
                    operand: 444,
                    cas_hit: true,
                    gap_ns: 0,
                },
                Op {
                    side: Side::A,
                    kind: OpKind::Read,
                    sges: vec![59, 29464],
                    signaled: true,
                    fence: false,
                    from_read: false,
                    recv_sges: 3,
                    recv_slack: 34,
                    counter: 1,
                    operand: 539,
                    cas_hit: false,
                    gap_ns: 0,
                },
                Op {
                    side: Side::A,
                    kind: OpKind::Write,
                    sges: vec![451543, 1030005, 640400],
                    signaled: false,
                    fence: false,
                    from_read: false,
                    recv_sges: 1,
                    recv_slack: 19,
                    counter: 2,
                    operand: 15211860894544439356,
                    cas_hit: true,
                    gap_ns: 0,
                },
                Op {
                    side: Side::B,
                    kind: OpKind::SendImm,
                    sges: vec![0],
                    signaled: false,
                    fence: false,
                    from_read: false,
                    recv_sges: 1,
                    recv_slack: 49,
                    counter: 3,
                    operand: 538351194718785452,
                    cas_hit: true,
                    gap_ns: 4047,
                },
                Op {
                    side: Side::A,
                    kind: OpKind::FetchAdd,
                    sges: vec![3301, 18, 2908],
                    signaled: false,
                    fence: false,
                    from_read: false,
                    recv_sges: 3,
                    recv_slack: 8,
                    counter: 2,
                    operand: 380,
                    cas_hit: true,
                    gap_ns: 0,
                },
                Op {
                    side: Side::A,
                    kind: OpKind::WriteImm,
                    sges: vec![3970, 61],
                    signaled: false,
                    fence: false,
                    from_read: true,
                    recv_sges: 2,
                    recv_slack: 0,
                    counter: 3,
                    operand: 167,
                    cas_hit: true,
                    gap_ns: 0,
                },
                Op {
                    side: Side::B,
                    kind: OpKind::Write,
                    sges: vec![2],
                    signaled: true,
                    fence: false,
                    from_read: false,
                    recv_sges: 3,
                    recv_slack: 0,
                    counter: 3,
                    operand: 974,
                    cas_hit: true,
                    gap_ns: 0,
                },
            ],
            prepost: 4294967295,
            recv_interval_ns: 357665,
            extra_recvs: 2,
        },
        qp: QpOptions {
            qp_type: QpType::Rc,
            path_mtu: Mtu::Mtu1024,
            timeout: 11,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 10,
            max_rd_atomic: 8,
            max_dest_rd_atomic: 16,
            sq_depth: 1024,
            rq_depth: 1024,
            max_sge: 8,
            cq_depth: 8192,
            psn_a: 16777183,
            psn_b: 6633342,
        },
        link_ab: LinkConfig {
            latency_ns: 12864,
            bandwidth_bps: 10000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.006892555164514065,
                duplicate: 0.0,
                reorder: 0.0,
                reorder_ns: 51568,
                corrupt: 0.011944621165252276,
                spike: 0.008972096901728108,
                spike_ns: 12946614,
            },
        },
        link_ba: LinkConfig {
            latency_ns: 13080,
            bandwidth_bps: 25000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.04257332608428934,
                duplicate: 0.049523628116694876,
                reorder: 0.0,
                reorder_ns: 14414,
                corrupt: 0.021713402423587963,
                spike: 0.0,
                spike_ns: 4338509,
            },
        },
        cuts: vec![
            Cut {
                start: 3965519,
                duration: Some(4558675),
            },
            Cut {
                start: 4484221,
                duration: Some(7046962),
            },
        ],
        max_steps: 3000000,
    };
    run_explained(&sc, 120, false);
}

// ---- go-back-N and the window -------------------------------------------

/// One op of a recorded scenario: (side, kind, SGE lengths, signaled,
/// fence, from_read), (recv_sges, recv_slack), (counter, operand, cas_hit),
/// gap_ns.
type RecordedOp = (
    (Side, OpKind, &'static [u32], bool, bool, bool),
    (u8, u16),
    (u8, u64, bool),
    u64,
);

fn recorded(ops: &[RecordedOp]) -> Vec<Op> {
    ops.iter()
        .map(
            |&(
                (side, kind, sges, signaled, fence, from_read),
                (recv_sges, recv_slack),
                (counter, operand, cas_hit),
                gap_ns,
            )| Op {
                side,
                kind,
                sges: sges.to_vec(),
                signaled,
                fence,
                from_read,
                recv_sges,
                recv_slack,
                counter,
                operand,
                cas_hit,
                gap_ns,
            },
        )
        .collect()
}

/// requester window: congestion collapse of go-back-N. Found by
/// `faulty_programs_with_large_messages_match_the_model` (1 MiB messages
/// under faults, dropped from sim_props for it): B sends 811 KB (3,170
/// packets at MTU 256) and then a fetch-and-add over a path that reorders
/// 7 % of packets; the fetch-and-add ended in RETRY_EXC_ERR at 191 ms. The
/// window counted PSNs, once per WQE (`next_psn` moves a message at a
/// time), so a rewind into the long SEND resent all of its rest at once,
/// and each NAK (one per reordered packet) put another such burst on the
/// link behind the copies still queued there: the queue and the round trip
/// grew until the atomic behind them ran out of retries. The window now
/// counts packets by transmission: per packet, and after a rewind the copies
/// sent before it count until an ACK for the resend proves them gone (or a
/// timeout declares them lost), so the link holds at most a window of this
/// QP's packets (proto tests `go_back`).
#[test]
fn go_back_n_does_not_flood_the_link_with_copies() {
    let ops = recorded(&[
        (
            (Side::A, OpKind::SendImm, &[16], false, true, true),
            (2, 39),
            (1, 50, true),
            584647,
        ),
        (
            (Side::A, OpKind::Send, &[3, 54], true, false, false),
            (1, 0),
            (2, 299, false),
            155005,
        ),
        (
            (Side::B, OpKind::Send, &[811465], true, false, false),
            (1, 0),
            (3, 767, true),
            272363,
        ),
        (
            (Side::B, OpKind::FetchAdd, &[3531, 25, 8], true, false, false),
            (1, 0),
            (2, 366, true),
            0,
        ),
        (
            (Side::B, OpKind::WriteImm, &[178, 34, 1], true, false, false),
            (2, 0),
            (3, 526, true),
            0,
        ),
        (
            (Side::A, OpKind::WriteImm, &[46, 6], false, false, true),
            (1, 0),
            (0, 978, false),
            38920,
        ),
    ]);
    let sc = Scenario {
        seed: 1565076209736856748,
        program: Program {
            ops,
            prepost: 4294967295,
            recv_interval_ns: 641189,
            extra_recvs: 0,
        },
        qp: QpOptions {
            qp_type: QpType::Rc,
            path_mtu: Mtu::Mtu256,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 9,
            max_rd_atomic: 15,
            max_dest_rd_atomic: 16,
            sq_depth: 1024,
            rq_depth: 1024,
            max_sge: 8,
            cq_depth: 8192,
            psn_a: 16777184,
            psn_b: 15523123,
        },
        link_ab: LinkConfig {
            latency_ns: 10092,
            bandwidth_bps: 10000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.011600376276790234,
                duplicate: 0.0158847488951663,
                reorder: 0.008016988838463737,
                reorder_ns: 69333,
                corrupt: 0.0,
                spike: 0.006224630450392861,
                spike_ns: 2182472,
            },
        },
        link_ba: LinkConfig {
            latency_ns: 14425,
            bandwidth_bps: 10000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.0,
                duplicate: 0.0063197621936262206,
                reorder: 0.07191397936252829,
                reorder_ns: 18888,
                corrupt: 0.0,
                spike: 0.009959794049432695,
                spike_ns: 5217589,
            },
        },
        cuts: vec![
            Cut {
                start: 1344362,
                duration: Some(4878226),
            },
            Cut {
                start: 1280943,
                duration: Some(2229919),
            },
        ],
        max_steps: 3000000,
    };
    run_explained(&sc, 120, true);
}

/// requester window (found while counting it by packet, never released):
/// a 690 KB read (2,695 packets at MTU 256), resumed after lost responses
/// with 1,027 of them placed, counted its answered PSNs as in flight because
/// `acked_psn` moved only at the read's end: the window stayed shut, nothing
/// was sent, no timer ran, and the read never completed. Answered PSNs are
/// acknowledged now (`handle_read_response`).
#[test]
fn a_resumed_read_longer_than_the_window_is_not_held_back() {
    let ops = recorded(&[
        (
            (Side::A, OpKind::SendImm, &[54, 11], true, false, true),
            (1, 0),
            (0, 350, true),
            0,
        ),
        (
            (Side::B, OpKind::Read, &[689813], false, false, false),
            (2, 0),
            (1, 917, true),
            2896,
        ),
        (
            (Side::B, OpKind::Send, &[143], false, true, true),
            (3, 0),
            (3, 7930906436255743810, false),
            0,
        ),
    ]);
    let sc = Scenario {
        seed: 8779126112478591518,
        program: Program {
            ops,
            prepost: 4294967295,
            recv_interval_ns: 876509,
            extra_recvs: 0,
        },
        qp: QpOptions {
            qp_type: QpType::Rc,
            path_mtu: Mtu::Mtu256,
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 4,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sq_depth: 1024,
            rq_depth: 1024,
            max_sge: 8,
            cq_depth: 8192,
            psn_a: 16777181,
            psn_b: 16777194,
        },
        link_ab: LinkConfig {
            latency_ns: 9003,
            bandwidth_bps: 100000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.0,
                duplicate: 0.022393233414486284,
                reorder: 0.05395252479091229,
                reorder_ns: 38408,
                corrupt: 0.013531437099378596,
                spike: 0.0,
                spike_ns: 15534908,
            },
        },
        link_ba: LinkConfig {
            latency_ns: 12250,
            bandwidth_bps: 10000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.0025822053405219337,
                duplicate: 0.0,
                reorder: 0.005207408995924991,
                reorder_ns: 43384,
                corrupt: 0.010281499554552816,
                spike: 0.003274025424314973,
                spike_ns: 14953129,
            },
        },
        cuts: vec![Cut {
            start: 1813955,
            duration: Some(5980474),
        }],
        max_steps: 3000000,
    };
    run_explained(&sc, 30, true);
}

/// requester window (found while counting it by packet, never released):
/// the ACK of a 972 KB send (a train) arrived, the compare-and-swap before
/// it lacked its response, so `acked_psn` stopped before the atomic; the
/// atomic's response retired both, but `acked_psn` stayed there and the
/// window counted the retired send as in flight: the fetch-and-adds after
/// it never went. The window starts at the first WQE not yet retired if
/// that is further (`requester::window_start`).
#[test]
fn a_send_retired_behind_an_atomic_leaves_the_window() {
    let ops = recorded(&[
        (
            (Side::B, OpKind::CompSwap, &[1548, 6931, 22714], false, false, true),
            (2, 0),
            (2, 414, false),
            0,
        ),
        (
            (Side::B, OpKind::Send, &[972355, 28, 1479], false, false, true),
            (3, 0),
            (1, 373, true),
            0,
        ),
        (
            (Side::B, OpKind::FetchAdd, &[45, 2222, 61], true, false, false),
            (2, 0),
            (2, 80, false),
            48361,
        ),
        (
            (Side::B, OpKind::FetchAdd, &[1487, 1352, 15], false, false, true),
            (1, 32),
            (3, 964, true),
            0,
        ),
        (
            (Side::A, OpKind::Read, &[16, 14], false, false, false),
            (3, 0),
            (3, 1844786894288887885, true),
            45588,
        ),
        (
            (Side::A, OpKind::Write, &[15, 34, 5], false, false, true),
            (2, 0),
            (1, 379, false),
            8478,
        ),
        (
            (Side::A, OpKind::FetchAdd, &[2129, 0, 33], false, false, false),
            (2, 5),
            (0, 681, false),
            0,
        ),
    ]);
    let sc = Scenario {
        seed: 12948312039859624951,
        program: Program {
            ops,
            prepost: 7,
            recv_interval_ns: 778879,
            extra_recvs: 1,
        },
        qp: QpOptions {
            qp_type: QpType::Rc,
            path_mtu: Mtu::Mtu256,
            timeout: 11,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 5,
            max_rd_atomic: 11,
            max_dest_rd_atomic: 16,
            sq_depth: 1024,
            rq_depth: 1024,
            max_sge: 8,
            cq_depth: 8192,
            psn_a: 16777184,
            psn_b: 16777186,
        },
        link_ab: LinkConfig {
            latency_ns: 4201,
            bandwidth_bps: 10000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.0,
                duplicate: 0.007812428096833682,
                reorder: 0.0,
                reorder_ns: 29508,
                corrupt: 0.02378185637978272,
                spike: 0.009321270981069517,
                spike_ns: 15113712,
            },
        },
        link_ba: LinkConfig {
            latency_ns: 14017,
            bandwidth_bps: 100000000000,
            mtu: 4160,
            faults: FaultModel {
                loss: 0.03331895537051182,
                duplicate: 0.010406790787850817,
                reorder: 0.0,
                reorder_ns: 66311,
                corrupt: 0.0,
                spike: 0.0,
                spike_ns: 12592170,
            },
        },
        cuts: vec![],
        max_steps: 3000000,
    };
    run_explained(&sc, 30, true);
}
