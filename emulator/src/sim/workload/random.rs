//! A seeded generator of scenarios (for `softverbs sim run/fuzz` and soak
//! runs; the property tests have their own shrinkable strategies).

use softverbs::verbs::Mtu;

use super::{Cut, Op, OpKind, Program, Scenario, Side};
use crate::sim::conn::QpOptions;
use crate::sim::link::{FaultModel, LinkConfig};
use crate::sim::rng::SimRng;

/// What [`Scenario::random`] may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenLimits {
    /// Most WRs in a program.
    pub max_ops: usize,
    /// Allow messages up to 1 MiB (rarely); otherwise at most 64 KiB.
    pub large: bool,
    /// Random link faults and healing partitions.
    pub faults: bool,
    /// End with a permanent partition at a random time (errors expected).
    pub permanent_cut: bool,
    /// Let both sides post (otherwise only A).
    pub both_sides: bool,
}

impl Default for GenLimits {
    fn default() -> Self {
        GenLimits {
            max_ops: 24,
            large: false,
            faults: true,
            permanent_cut: false,
            both_sides: true,
        }
    }
}

/// A message length: mostly small, sometimes a few packets, rarely large.
pub(super) fn random_len(rng: &mut SimRng, large: bool) -> u32 {
    let r = rng.below(100);
    (if r < 45 {
        rng.range(0, 64)
    } else if r < 75 {
        rng.range(65, 4096)
    } else if r < 97 || !large {
        rng.range(4097, 65_536)
    } else {
        rng.range(65_537, 1 << 20)
    }) as u32
}

/// Retransmission timeout in nanoseconds for a timeout exponent.
pub(super) fn timeout_ns(exp: u8) -> u64 {
    4096u64 << exp
}

impl Scenario {
    /// A random scenario from `seed` (the same seed gives the same
    /// scenario, and the scenario's run is reproducible from it).
    pub fn random(seed: u64, limits: &GenLimits) -> Scenario {
        let mut rng = SimRng::derive(seed, 0x6e6);
        let n = rng.range(1, limits.max_ops.max(1) as u64) as usize;
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            let side = if limits.both_sides && rng.chance(0.4) {
                Side::B
            } else {
                Side::A
            };
            let kind = OpKind::ALL[rng.below(7) as usize];
            let len = random_len(&mut rng, limits.large);
            let nsge = rng.range(1, 4) as usize;
            let mut sges = Vec::with_capacity(nsge);
            let mut left = len;
            for k in 0..nsge {
                let l = if k + 1 == nsge {
                    left
                } else {
                    rng.below(u64::from(left) + 1) as u32
                };
                sges.push(l);
                left -= l;
            }
            let fence = rng.chance(0.15);
            ops.push(Op {
                side,
                kind,
                sges,
                signaled: rng.chance(0.7),
                fence,
                from_read: fence && rng.chance(0.5),
                recv_sges: rng.range(1, 3) as u8,
                recv_slack: if rng.chance(0.7) { 0 } else { rng.range(1, 64) as u16 },
                counter: rng.below(4) as u8,
                operand: if rng.chance(0.8) {
                    rng.below(1000)
                } else {
                    rng.next_u64()
                },
                cas_hit: rng.chance(0.6),
                gap_ns: if rng.chance(0.6) {
                    0
                } else if rng.chance(0.9) {
                    rng.range(1, 50_000)
                } else {
                    rng.range(50_000, 2_000_000)
                },
            });
        }
        let prepost = if rng.chance(0.7) {
            u32::MAX
        } else {
            rng.below(n as u64 + 1) as u32
        };
        let program = Program {
            ops,
            prepost,
            recv_interval_ns: rng.range(10_000, 1_000_000),
            extra_recvs: rng.below(3) as u8,
        };
        let timeout = rng.range(10, 14) as u8;
        let t = timeout_ns(timeout);
        let max_rd_atomic = rng.range(1, 16) as u8;
        let near_wrap = |rng: &mut SimRng| {
            if rng.chance(0.3) {
                0xff_ffff - rng.below(64) as u32
            } else {
                rng.below(1 << 24) as u32
            }
        };
        let qp = QpOptions {
            path_mtu: [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096][rng.below(3) as usize],
            timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: rng.range(1, 14) as u8,
            max_rd_atomic,
            max_dest_rd_atomic: rng.range(u64::from(max_rd_atomic), 16) as u8,
            psn_a: near_wrap(&mut rng),
            psn_b: near_wrap(&mut rng),
            ..QpOptions::default()
        };
        let link = |rng: &mut SimRng| {
            let mut l = LinkConfig {
                latency_ns: rng.range(500, 20_000),
                bandwidth_bps: [10_000_000_000, 25_000_000_000, 100_000_000_000][rng.below(3) as usize],
                ..LinkConfig::ideal()
            };
            if limits.faults {
                let on = |rng: &mut SimRng, max: f64| if rng.chance(0.5) { rng.unit() * max } else { 0.0 };
                l.faults = FaultModel {
                    loss: on(rng, 0.05),
                    duplicate: on(rng, 0.05),
                    reorder: on(rng, 0.1),
                    reorder_ns: rng.range(1_000, 100_000),
                    corrupt: on(rng, 0.03),
                    spike: on(rng, 0.01),
                    spike_ns: rng.range(t / 2, 2 * t),
                };
            }
            l
        };
        let link_ab = link(&mut rng);
        let link_ba = link(&mut rng);
        let mut cuts = Vec::new();
        if limits.faults {
            for _ in 0..rng.below(3) {
                cuts.push(Cut {
                    start: rng.range(0, 5_000_000),
                    duration: Some(rng.range(t / 4, 2 * t)),
                });
            }
        }
        if limits.permanent_cut {
            // Mostly while the program is still posting, so that most runs
            // have work outstanding when the peer goes away.
            let span: u64 = program.ops.iter().map(|o| o.gap_ns).sum();
            let latest = if rng.chance(0.9) { span } else { span + 200_000 };
            cuts.push(Cut {
                start: rng.range(0, latest),
                duration: None,
            });
        }
        Scenario {
            seed,
            program,
            qp,
            link_ab,
            link_ba,
            cuts,
            max_steps: 3_000_000,
        }
    }
}
