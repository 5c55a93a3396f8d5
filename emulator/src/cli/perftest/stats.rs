//! perftest's arithmetic: bandwidth peak and average from per-WR post and
//! completion times (`print_report_bw`), latency statistics from post
//! times (`print_report_lat`).

/// One row of a bandwidth table.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwResult {
    /// Message size.
    pub size: u64,
    /// Messages measured (iterations × QPs).
    pub iters: u64,
    /// Peak bandwidth, bytes per second (0 when not computed).
    pub peak_bps: f64,
    /// Average bandwidth, bytes per second.
    pub avg_bps: f64,
    /// Average message rate, messages per second.
    pub msg_rate: f64,
}

impl BwResult {
    /// Sum of two ends' results (bidirectional tests report both
    /// directions together, as perftest does).
    pub fn combined(&self, other: &BwResult) -> BwResult {
        BwResult {
            size: self.size,
            iters: self.iters,
            peak_bps: self.peak_bps + other.peak_bps,
            avg_bps: self.avg_bps + other.avg_bps,
            msg_rate: self.msg_rate + other.msg_rate,
        }
    }

    /// Bandwidth in the table's unit: MiB/s, or Gb/s with `gbits`.
    pub fn in_units(bps: f64, gbits: bool) -> f64 {
        if gbits {
            bps * 8.0 / 1e9
        } else {
            bps / 1_048_576.0
        }
    }
}

/// What a bandwidth run recorded, in nanoseconds of one clock.
#[derive(Debug, Clone, Default)]
pub struct BwTimes {
    /// Post time of each WR, in post order over all QPs (empty without
    /// peak).
    pub posted: Vec<u64>,
    /// At index `k-1`, the time `k` WRs were known complete (set where a
    /// moderated completion arrived; 0 elsewhere). Empty without peak.
    pub completed: Vec<u64>,
    /// Time of the first post.
    pub start: u64,
    /// Time the last completion was seen.
    pub end: u64,
    /// Messages counted between `start` and `end`.
    pub count: u64,
}

/// perftest's bandwidth report for `size`-byte messages.
///
/// The average is `count·size / (end − start)`. The peak, when the post and
/// completion times are there, is the best rate over every window from a
/// post (every `post_list`-th WR) to a later moderated completion (every
/// `cq_mod`-th), as perftest's `print_report_bw` computes it.
pub fn bw_result(size: u64, t: &BwTimes, cq_mod: u64, post_list: u64) -> BwResult {
    let secs = (t.end.saturating_sub(t.start)).max(1) as f64 / 1e9;
    let avg_bps = size as f64 * t.count as f64 / secs;
    let msg_rate = t.count as f64 / secs;
    let n = t.posted.len().min(t.completed.len());
    let mut peak_bps = 0.0;
    if n > 0 {
        let cq_mod = cq_mod.max(1) as usize;
        let post_list = post_list.max(1) as usize;
        let mut best = (t.end.saturating_sub(t.start)).max(1) as f64 / n as f64;
        let mut i = 0;
        while i < n {
            let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
            while j < n {
                if t.completed[j] != 0 {
                    let d = t.completed[j].saturating_sub(t.posted[i]) as f64 / (j - i + 1) as f64;
                    if d < best {
                        best = d;
                    }
                }
                j += cq_mod;
            }
            if !n.is_multiple_of(cq_mod) && t.completed[n - 1] != 0 {
                let d = t.completed[n - 1].saturating_sub(t.posted[i]) as f64 / (n - i) as f64;
                if d < best {
                    best = d;
                }
            }
            i += post_list;
        }
        peak_bps = size as f64 / (best.max(1e-3) / 1e9);
    }
    BwResult {
        size,
        iters: t.count,
        peak_bps,
        avg_bps,
        msg_rate,
    }
}

/// One row of an iterations latency table (microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatResult {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Minimum.
    pub t_min: f64,
    /// Maximum (after dropping perftest's two-sample tail).
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
}

/// perftest drops this many of the largest samples (`LAT_MEASURE_TAIL`).
pub const LAT_MEASURE_TAIL: usize = 2;

/// Each iteration's time in µs (`posted[i+1] − posted[i]`, in ns, over
/// `rtt_factor`).
fn one_way_times(posted: &[u64], rtt_factor: f64) -> impl Iterator<Item = f64> + '_ {
    posted
        .windows(2)
        .map(move |w| w[1].saturating_sub(w[0]) as f64 / 1000.0 / rtt_factor)
}

/// The median one-way times (µs, as [`lat_result`]'s) of the round trips
/// in the blocks of `block` iterations that `perf --ab` ran with the
/// switch on (even blocks) and off (odd blocks); `None` until both arms
/// have a sample.
pub fn ab_medians(posted: &[u64], rtt_factor: f64, block: u64) -> Option<(f64, f64)> {
    let mut arms: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for (i, t) in one_way_times(posted, rtt_factor).enumerate() {
        arms[usize::from(!(i as u64 / block.max(1)).is_multiple_of(2))].push(t);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let [mut on, mut off] = arms;
    Some((median(&mut on)?, median(&mut off)?))
}

/// perftest's latency report from the post times of `iters` ping-pongs
/// (`posted[i+1] − posted[i]` is one round trip), divided by `rtt_factor`
/// (2 for send and write: half the round trip; 1 for read and atomic).
///
/// Returns `None` with fewer than 5 samples.
pub fn lat_result(size: u64, posted: &[u64], rtt_factor: f64) -> Option<LatResult> {
    if posted.len() < 5 {
        return None;
    }
    let mut delta: Vec<f64> = one_way_times(posted, rtt_factor).collect();
    delta.sort_by(f64::total_cmp);
    let n = delta.len() - LAT_MEASURE_TAIL;
    let median = if (n - 1) % 2 == 1 {
        (delta[n / 2] + delta[n / 2 - 1]) / 2.0
    } else {
        delta[n / 2]
    };
    let avg = delta[..n].iter().sum::<f64>() / n as f64;
    let var = delta[..n].iter().map(|d| (d - avg) * (d - avg)).sum::<f64>() / n as f64;
    let i99 = ((n as f64) * 0.99).ceil() as usize;
    let i999 = ((n as f64) * 0.999).ceil() as usize;
    Some(LatResult {
        size,
        iters: posted.len() as u64,
        t_min: delta[0],
        t_max: delta[n],
        t_typical: median,
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: delta[i99.min(delta.len() - 1)],
        p99_9: delta[i999.min(delta.len() - 1)],
    })
}

/// One row of a `-D` latency table.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatDurResult {
    /// Message size.
    pub size: u64,
    /// Round trips in the sample window.
    pub iters: u64,
    /// Mean latency in microseconds (half or full round trip as above).
    pub t_avg: f64,
    /// Round trips per second.
    pub tps: f64,
}

/// The `-D` latency row from a count of round trips over `window_ns`.
pub fn lat_dur_result(size: u64, iters: u64, window_ns: u64, rtt_factor: f64) -> LatDurResult {
    let secs = window_ns.max(1) as f64 / 1e9;
    LatDurResult {
        size,
        iters,
        t_avg: if iters == 0 {
            0.0
        } else {
            secs * 1e6 / iters as f64 / rtt_factor
        },
        tps: iters as f64 / secs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ab_medians_split_by_block() {
        // Blocks of 2 round trips: 1,000 ns in the even blocks, 3,000 in
        // the odd ones (post times in ns; one way is half of each).
        let mut posted = vec![0u64];
        for i in 0..12u64 {
            let rtt = if (i / 2) % 2 == 0 { 1000 } else { 3000 };
            posted.push(posted[posted.len() - 1] + rtt);
        }
        assert_eq!(ab_medians(&posted, 2.0, 2), Some((0.5, 1.5)));
        // One block only: no arm to compare with.
        assert_eq!(ab_medians(&posted[..3], 2.0, 2), None);
    }

    #[test]
    fn bw_average_and_peak() {
        // 10 messages of 1 MiB over 10 ms; the first five complete in 1 ms.
        let posted: Vec<u64> = (0..10).map(|i| i * 100_000).collect();
        let mut completed = vec![0; 10];
        completed[4] = 1_000_000;
        completed[9] = 10_000_000;
        let t = BwTimes {
            posted,
            completed,
            start: 0,
            end: 10_000_000,
            count: 10,
        };
        let r = bw_result(1 << 20, &t, 5, 1);
        assert!((BwResult::in_units(r.avg_bps, false) - 1000.0).abs() < 1e-6, "{r:?}");
        assert!((r.msg_rate - 1000.0).abs() < 1e-6);
        // Best window: posted[0] to completed[4] = 1 ms, 5 messages.
        let expect = (1u64 << 20) as f64 / (1_000_000.0 / 5.0 / 1e9);
        assert!(
            (r.peak_bps - expect).abs() / expect < 1e-9,
            "{} vs {expect}",
            r.peak_bps
        );
        assert!((BwResult::in_units(1e9 / 8.0, true) - 1.0).abs() < 1e-12);
        let no_peak = bw_result(
            8,
            &BwTimes {
                count: 4,
                start: 0,
                end: 4000,
                ..BwTimes::default()
            },
            1,
            1,
        );
        assert_eq!(no_peak.peak_bps, 0.0);
        assert!((no_peak.msg_rate - 1e6).abs() < 1e-6);
    }

    #[test]
    fn latency_follows_perftest() {
        // Round trips of 2,4,…,20 µs in shuffled order, then halves.
        let rtts = [8u64, 2, 20, 6, 14, 4, 18, 10, 12, 16];
        let mut posted = vec![0u64];
        for r in rtts {
            posted.push(posted.last().unwrap() + r * 1000);
        }
        let l = lat_result(2, &posted, 2.0).unwrap();
        // 10 deltas (1..10 µs one way); the 2 largest are dropped: n = 8.
        assert_eq!(l.iters, 11);
        assert_eq!(l.t_min, 1.0);
        assert_eq!(l.t_max, 9.0, "perftest's t_max is the first dropped sample");
        // n = 8: (n-1) odd, median = mean of delta[4] and delta[3].
        assert_eq!(l.t_typical, 4.5);
        assert_eq!(l.t_avg, 4.5);
        assert!((l.t_stdev - (5.25f64).sqrt()).abs() < 1e-12);
        assert_eq!(l.p99, 9.0);
        assert!(lat_result(2, &posted[..4], 2.0).is_none());
        let full = lat_result(8, &posted, 1.0).unwrap();
        assert_eq!(full.t_min, 2.0);
        let d = lat_dur_result(2, 1000, 1_000_000, 2.0);
        assert!((d.t_avg - 0.5).abs() < 1e-12 && (d.tps - 1e6).abs() < 1e-6);
    }
}
