//! Property tests: random verbs programs on random fault models, checked
//! against the reference model of `softverbs_emulator::sim::workload` (final
//! memory of both sides, exactly-once completions, statuses, linearizable
//! atomics, placement before completion).
//!
//! Case counts are small by default so the workspace suite stays fast; set
//! `PROPTEST_CASES=N` for a soak run (every property then runs N cases), e.g.
//! `PROPTEST_CASES=20000 cargo test --release -p softverbs-emulator --test sim_props`.
//! A failure shrinks to a minimal scenario, prints it with its seed and the
//! end of its packet log, and is recorded by proptest in
//! `sim_props.proptest-regressions` (replayed first on later runs); copy it
//! into `sim_regressions.rs` to keep it.

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use softverbs::verbs::Mtu;
use softverbs_emulator::sim::workload::{Cut, Op, OpKind, Program, Side};
use softverbs_emulator::sim::{FaultModel, LinkConfig, QpOptions, Scenario};

/// Cases per property: `PROPTEST_CASES` if set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(default_cases: u32) -> Config {
    Config {
        cases: cases(default_cases),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        // Shrinking a 2-node run is cheap; keep the default budget.
        ..Config::default()
    }
}

/// Message and SGE sizes a scenario draws from.
#[derive(Clone, Copy, PartialEq)]
enum Sizes {
    /// Mostly tiny, some multi-packet, up to 32 KiB.
    Small,
    /// As small, but a quarter 16–128 KiB: with trains on, such messages
    /// from the (then shareable) buffers go as trains.
    Trains,
    /// Mostly tiny, some multi-packet, rarely up to 1 MiB.
    Large,
}

/// Message and SGE lengths.
fn len_strategy(sizes: Sizes) -> BoxedStrategy<u32> {
    match sizes {
        Sizes::Large => prop_oneof![
            50 => 0u32..=64,
            30 => 65u32..=4096,
            18 => 4097u32..=65_536,
            2 => 65_537u32..=(1 << 20),
        ]
        .boxed(),
        Sizes::Trains => prop_oneof![45 => 0u32..=64, 30 => 65u32..=4096, 25 => 16_384u32..=131_072].boxed(),
        Sizes::Small => prop_oneof![55 => 0u32..=64, 30 => 65u32..=4096, 15 => 4097u32..=32_768].boxed(),
    }
}

fn op_strategy(both_sides: bool, sizes: Sizes) -> impl Strategy<Value = Op> {
    let side = if both_sides {
        prop_oneof![3 => Just(Side::A), 2 => Just(Side::B)].boxed()
    } else {
        Just(Side::A).boxed()
    };
    let kind = prop::sample::select(OpKind::ALL.to_vec());
    let sges = prop::collection::vec(len_strategy(sizes), 1..=3);
    let gap = prop_oneof![6 => Just(0u64), 3 => 1u64..50_000, 1 => 50_000u64..2_000_000];
    (
        side,
        kind,
        sges,
        prop::bool::weighted(0.7),
        prop::bool::weighted(0.15),
        any::<bool>(),
        (1u8..=3, prop_oneof![3 => Just(0u16), 1 => 1u16..=64]),
        (
            0u8..4,
            prop_oneof![4 => 0u64..1000, 1 => any::<u64>()],
            prop::bool::weighted(0.6),
        ),
        gap,
    )
        .prop_map(
            |(
                side,
                kind,
                sges,
                signaled,
                fence,
                from_read,
                (recv_sges, recv_slack),
                (counter, operand, cas_hit),
                gap_ns,
            )| {
                Op {
                    side,
                    kind,
                    sges,
                    signaled,
                    fence,
                    from_read,
                    recv_sges,
                    recv_slack,
                    counter,
                    operand,
                    cas_hit,
                    gap_ns,
                }
            },
        )
}

fn program_strategy(max_ops: usize, both_sides: bool, sizes: Sizes) -> impl Strategy<Value = Program> {
    (
        prop::collection::vec(op_strategy(both_sides, sizes), 1..=max_ops),
        prop_oneof![3 => Just(u32::MAX), 1 => 0u32..8],
        10_000u64..1_000_000,
        0u8..3,
    )
        .prop_map(|(ops, prepost, recv_interval_ns, extra_recvs)| Program {
            ops,
            prepost,
            recv_interval_ns,
            extra_recvs,
        })
}

fn prob(max: f64) -> BoxedStrategy<f64> {
    prop_oneof![Just(0.0), 0.0..max].boxed()
}

/// Faults on one link direction (`t`: the retransmission timeout, so delay
/// spikes are long enough to fire it).
fn faults_strategy(t: u64) -> impl Strategy<Value = FaultModel> {
    (
        prob(0.05),
        prob(0.05),
        prob(0.1),
        1_000u64..100_000,
        prob(0.03),
        prob(0.01),
        t / 2..2 * t,
    )
        .prop_map(
            |(loss, duplicate, reorder, reorder_ns, corrupt, spike, spike_ns)| FaultModel {
                loss,
                duplicate,
                reorder,
                reorder_ns,
                corrupt,
                spike,
                spike_ns,
            },
        )
}

fn link_strategy(faults: bool, t: u64) -> impl Strategy<Value = LinkConfig> {
    let f = if faults {
        faults_strategy(t).boxed()
    } else {
        Just(FaultModel::NONE).boxed()
    };
    (
        500u64..20_000,
        prop::sample::select(vec![10_000_000_000u64, 25_000_000_000, 100_000_000_000]),
        f,
    )
        .prop_map(|(latency_ns, bandwidth_bps, faults)| LinkConfig {
            latency_ns,
            bandwidth_bps,
            faults,
            ..LinkConfig::ideal()
        })
}

fn psn_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..(1 << 24), (0xff_ffc0u32..=0xff_ffff)]
}

/// What a generated scenario may contain.
#[derive(Clone, Copy)]
struct Shape {
    max_ops: usize,
    both_sides: bool,
    sizes: Sizes,
    faults: bool,
    permanent_cut: bool,
}

fn scenario_strategy(shape: Shape) -> impl Strategy<Value = Scenario> {
    (10u8..=14, 1u8..=16).prop_flat_map(move |(timeout, max_rd_atomic)| {
        let t = 4096u64 << timeout;
        let cuts = if shape.faults {
            prop::collection::vec(
                (0u64..5_000_000, t / 4..2 * t).prop_map(|(start, d)| Cut {
                    start,
                    duration: Some(d),
                }),
                0..=2,
            )
            .boxed()
        } else {
            Just(Vec::new()).boxed()
        };
        let permanent = if shape.permanent_cut {
            (0u64..300_000).prop_map(Some).boxed()
        } else {
            Just(None).boxed()
        };
        (
            any::<u64>(),
            program_strategy(shape.max_ops, shape.both_sides, shape.sizes),
            prop::sample::select(vec![Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]),
            (1u8..=14, max_rd_atomic..=16, psn_strategy(), psn_strategy()),
            link_strategy(shape.faults, t),
            link_strategy(shape.faults, t),
            cuts,
            permanent,
        )
            .prop_map(
                move |(
                    seed,
                    program,
                    path_mtu,
                    (min_rnr_timer, max_dest_rd_atomic, psn_a, psn_b),
                    link_ab,
                    link_ba,
                    mut cuts,
                    permanent,
                )| {
                    if let Some(start) = permanent {
                        cuts.push(Cut { start, duration: None });
                    }
                    Scenario {
                        seed,
                        program,
                        qp: QpOptions {
                            path_mtu,
                            timeout,
                            retry_cnt: 7,
                            rnr_retry: 7,
                            min_rnr_timer,
                            max_rd_atomic,
                            max_dest_rd_atomic,
                            psn_a,
                            psn_b,
                            ..QpOptions::default()
                        },
                        link_ab,
                        link_ba,
                        cuts,
                        max_steps: 3_000_000,
                    }
                },
            )
    })
}

/// `s` without the hexadecimal values of `va=` fields.
fn strip_va(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("va=0x") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 5..];
        rest = rest.trim_start_matches(|c: char| c.is_ascii_hexdigit());
    }
    out.push_str(rest);
    out
}

/// Runs a scenario; on a violation, reruns it with the packet log on and
/// fails with the violation (seed included) and the end of the log.
fn check(sc: &Scenario) -> Result<softverbs_emulator::sim::workload::Report, TestCaseError> {
    match sc.run() {
        Ok(r) => Ok(r),
        Err(_) => {
            let (r, _) = sc.run_traced(Some(200));
            let v = r.expect_err("a replayed run fails the same way");
            Err(TestCaseError::fail(format!(
                "{v}\n(replay: this scenario with the same seed)"
            )))
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// No faults (RNR NAKs only, from late receives), messages up to 1 MiB.
    #[test]
    fn fault_free_programs_match_the_model(sc in scenario_strategy(Shape {
        max_ops: 16, both_sides: true, sizes: Sizes::Large, faults: false, permanent_cut: false,
    })) {
        let r = check(&sc)?;
        prop_assert_eq!(r.failed, [None, None]);
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// ACK coalescing (seed bit 3: both nodes hold the plain ACKs of
    /// outputs in which completions were polled, and let them go at
    /// their bound) over fault-free programs: nothing is lost (no
    /// requester waits for its retransmission timer), nothing is
    /// reordered (each side's responses leave in PSN order, which the
    /// run checks when nothing was resent), and every WR completes
    /// exactly once with the model's memory.
    #[test]
    fn coalesced_acks_are_neither_lost_nor_reordered(mut sc in scenario_strategy(Shape {
        max_ops: 16, both_sides: true, sizes: Sizes::Small, faults: false, permanent_cut: false,
    })) {
        sc.seed |= 8;
        let r = check(&sc)?;
        prop_assert_eq!(r.failed, [None, None]);
        for (side, c) in r.engine.iter().enumerate() {
            prop_assert_eq!(c.retransmit_timeouts, 0, "side {} waited for its timer: an ACK was lost", side);
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Loss, duplication, reordering, corruption, delay spikes and healing
    /// partitions, with retry_cnt 7: everything succeeds, exactly once, in
    /// place, with the model's memory and atomic results.
    #[test]
    fn faulty_programs_match_the_model(sc in scenario_strategy(Shape {
        max_ops: 14, both_sides: true, sizes: Sizes::Small, faults: true, permanent_cut: false,
    })) {
        let r = check(&sc)?;
        prop_assert_eq!(r.failed, [None, None]);
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Messages of up to 128 KiB under every fault, with trains (odd
    /// seeds): a train lost, duplicated, delayed or reordered behaves like
    /// the packets it stands for.
    #[test]
    fn faulty_programs_with_trains_match_the_model(mut sc in scenario_strategy(Shape {
        max_ops: 8, both_sides: true, sizes: Sizes::Trains, faults: true, permanent_cut: false,
    })) {
        sc.seed |= 1;
        let r = check(&sc)?;
        prop_assert_eq!(r.failed, [None, None]);
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Messages of up to 1 MiB under every fault: a lost read response must
    /// not make the requester resend the large writes after it, and
    /// go-back-N must not flood the link with copies of a long message
    /// (sim_regressions, go_back_n_does_not_flood_the_link_with_copies).
    #[test]
    fn faulty_programs_with_large_messages_match_the_model(sc in scenario_strategy(Shape {
        max_ops: 8, both_sides: true, sizes: Sizes::Large, faults: true, permanent_cut: false,
    })) {
        let r = check(&sc)?;
        prop_assert_eq!(r.failed, [None, None]);
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// A partition that never heals: each side's completions are successes,
    /// one RETRY_EXC_ERR, then flushes; a side without an error stays in RTS;
    /// counters hold the result of a prefix of their atomics.
    #[test]
    fn permanent_partition_fails_cleanly(sc in scenario_strategy(Shape {
        max_ops: 10, both_sides: true, sizes: Sizes::Small, faults: true, permanent_cut: true,
    })) {
        check(&sc)?;
    }
}

proptest! {
    #![proptest_config(config(16))]

    /// A run is a function of its scenario: the same seed gives the same
    /// packets, faults, counters and end time.
    #[test]
    fn runs_are_reproducible(sc in scenario_strategy(Shape {
        max_ops: 8, both_sides: true, sizes: Sizes::Small, faults: true, permanent_cut: false,
    })) {
        let (a, ta) = sc.run_traced(None);
        let (b, tb) = sc.run_traced(None);
        let (a, b) = (a.map_err(|v| TestCaseError::fail(v.to_string()))?, b.map_err(|v| TestCaseError::fail(v.to_string()))?);
        prop_assert_eq!(a.end_ns, b.end_ns);
        prop_assert_eq!(&a.stats, &b.stats);
        prop_assert_eq!(&a.engine, &b.engine);
        // Bit for bit, except the virtual addresses of registered memory
        // (RETH and AtomicETH `va`), which the allocator chooses.
        let (ta, tb) = (ta.expect("traced"), tb.expect("traced"));
        let norm = |t: &softverbs_emulator::sim::trace::Trace| -> Vec<String> {
            t.events().map(|e| strip_va(&e.to_string())).collect()
        };
        prop_assert!(norm(&ta) == norm(&tb), "packet logs differ");
    }
}

/// The properties are not vacuous: generated runs do hit every recovery
/// path, and permanent partitions do end in RETRY_EXC_ERR.
#[test]
fn generated_runs_exercise_the_recovery_paths() {
    use softverbs_emulator::sim::workload::GenLimits;
    let mut sum = softverbs::soft::proto::Counters::default();
    let mut fabric = softverbs_emulator::sim::FabricStats::default();
    for seed in 0..24 {
        let r = Scenario::random(seed, &GenLimits::default())
            .run()
            .unwrap_or_else(|v| panic!("{v}"));
        for c in &r.engine {
            sum.retransmits += c.retransmits;
            sum.retransmit_timeouts += c.retransmit_timeouts;
            sum.seq_naks_sent += c.seq_naks_sent;
            sum.rnr_naks_sent += c.rnr_naks_sent;
            sum.rx_duplicates += c.rx_duplicates;
            sum.rx_bad_icrc += c.rx_bad_icrc;
            sum.rx_trains += c.rx_trains;
        }
        fabric.lost += r.stats.lost;
        fabric.duplicated += r.stats.duplicated;
        fabric.reordered += r.stats.reordered;
        fabric.partitioned += r.stats.partitioned;
        fabric.spiked += r.stats.spiked;
    }
    for (name, v) in [
        ("retransmits", sum.retransmits),
        ("retransmit timeouts", sum.retransmit_timeouts),
        ("sequence NAKs", sum.seq_naks_sent),
        ("RNR NAKs", sum.rnr_naks_sent),
        ("duplicates at the responder", sum.rx_duplicates),
        ("ICRC failures", sum.rx_bad_icrc),
        ("trains received (odd seeds)", sum.rx_trains),
        ("losses", fabric.lost),
        ("duplicated packets", fabric.duplicated),
        ("reordered packets", fabric.reordered),
        ("partition drops", fabric.partitioned),
        ("delay spikes", fabric.spiked),
    ] {
        assert!(v > 0, "no {name} in 24 generated runs");
    }
    // ACK coalescing (seed bit 3) did hold ACKs back, and only there.
    let mut held = [0u64; 2];
    for seed in 0..24u64 {
        let r = Scenario::random(seed, &GenLimits::default())
            .run()
            .unwrap_or_else(|v| panic!("{v}"));
        held[usize::from(seed & 8 != 0)] += r.engine.iter().map(|c| c.tx_acks_held).sum::<u64>();
    }
    assert_eq!(held[0], 0, "ACKs held without coalescing");
    assert!(held[1] > 0, "no ACK held in 8 runs with coalescing");
    let limits = GenLimits {
        permanent_cut: true,
        ..GenLimits::default()
    };
    let failures = (0..12)
        .map(|seed| Scenario::random(seed, &limits).run().unwrap_or_else(|v| panic!("{v}")))
        .filter(|r| r.failed.iter().any(Option::is_some))
        .count();
    assert!(
        failures >= 6,
        "only {failures} of 12 permanent partitions ended in RETRY_EXC_ERR"
    );
}

/// One UC message: (is a write, with immediate, length).
type UcMsg = (bool, bool, u32);

proptest! {
    #![proptest_config(config(64))]

    /// UC over loss, reordering and corruption: the requester completes
    /// every WR successfully; each message that consumes a receive either
    /// completes the next receive whole (right length, immediate and data; a
    /// write-with-immediate's data in place) or nothing: never a partial
    /// message. Messages go one at a time, and there is no duplication: UC
    /// has no duplicate detection (a duplicated first/only packet starts a
    /// message again, in IBTA and rxe alike).
    #[test]
    fn uc_delivers_whole_messages_or_nothing(
        seed in any::<u64>(),
        msgs in prop::collection::vec((any::<bool>(), any::<bool>(), prop_oneof![0u32..=64, 65u32..=6000]), 1..=12),
        (loss, reorder, corrupt) in (prob(0.2), prob(0.2), prob(0.05)),
    ) {
        let faults = FaultModel { loss, reorder, reorder_ns: 20_000, corrupt, ..FaultModel::NONE };
        check_uc(seed, &msgs, faults)?;
    }
}

fn check_uc(seed: u64, msgs: &[UcMsg], faults: FaultModel) -> Result<(), TestCaseError> {
    use softverbs::verbs::{QpType, RecvWr, SendFlags, SendOp, SendWr, WcFlags, WcOpcode, WcStatus};
    let link = LinkConfig {
        faults,
        ..LinkConfig::ideal()
    };
    let opts = QpOptions {
        qp_type: QpType::Uc,
        path_mtu: Mtu::Mtu1024,
        ..QpOptions::default()
    };
    let slot = 8192usize;
    let (mut f, a, b) = softverbs_emulator::sim::pair(seed, link, &opts, slot * (msgs.len() + 1)).unwrap();
    let payload = |i: usize, len: u32| -> Vec<u8> {
        (0..len)
            .map(|k| (k as u8) ^ (i as u8).wrapping_mul(37) ^ 0x5a)
            .collect()
    };
    // Receive k uses slot k; writes land in the last slot.
    let write_slot = msgs.len() * slot;
    let rsgls: Vec<_> = (0..msgs.len())
        .map(|k| [b.sge((k * slot) as u64, slot as u32)])
        .collect();
    for (k, s) in rsgls.iter().enumerate() {
        b.post_recv(&mut f, &[RecvWr::new(k as u64, s)]).unwrap();
    }
    let mut next_recv = 0u64;
    for (i, &(write, imm, len)) in msgs.iter().enumerate() {
        a.write(i * slot, &payload(i, len));
        let sgl = [a.sge((i * slot) as u64, len)];
        let remote = b.remote(write_slot as u64);
        let op = match (write, imm) {
            (false, false) => SendOp::Send,
            (false, true) => SendOp::SendWithImm { imm: i as u32 },
            (true, false) => SendOp::Write { remote },
            (true, true) => SendOp::WriteWithImm { remote, imm: i as u32 },
        };
        let wr = SendWr::new(i as u64, op, &sgl).flags(SendFlags::SIGNALED);
        a.post_send(&mut f, &[wr]).unwrap();
        f.run_until_idle(100_000)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let wcs = a.poll_send(&mut f);
        prop_assert_eq!(wcs.len(), 1);
        prop_assert_eq!(wcs[0].status, WcStatus::Success);
        let rcs = b.poll_recv(&mut f);
        prop_assert!(rcs.len() <= 1, "message {} completed {} receives", i, rcs.len());
        prop_assert!(rcs.is_empty() || !write || imm, "a plain write completed a receive");
        for wc in rcs {
            prop_assert_eq!(wc.wr_id, next_recv, "receives complete in order");
            next_recv += 1;
            prop_assert_eq!(wc.status, WcStatus::Success);
            prop_assert_eq!(wc.byte_len, len);
            let with_imm = wc.wc_flags.contains(WcFlags::WITH_IMM);
            prop_assert_eq!(with_imm, imm);
            if imm {
                prop_assert_eq!(wc.imm_data, i as u32);
            }
            let (op, at) = if write {
                (WcOpcode::RecvRdmaWithImm, write_slot)
            } else {
                (WcOpcode::Recv, wc.wr_id as usize * slot)
            };
            prop_assert_eq!(wc.opcode, op);
            prop_assert!(
                b.read(at, len as usize) == payload(i, len),
                "message {} completed with wrong data",
                i
            );
        }
    }
    Ok(())
}
