//! Latency probes: where the time of a small message goes, stage by stage.
//!
//! Built only with the `probes` feature; otherwise every function here is
//! an empty inline function and the probes cost nothing. With it, each
//! [`mark`] stores the point and a TSC reading (one relaxed atomic add and
//! one store, ~10 ns on our VMs, whose `rdtsc` is slow), once [`start`]
//! allocated the buffer. [`report`] then gives, for every pair of points
//! that followed each other in this process, how often and how long
//! (median, 10th and 90th percentile), e.g. for an shm ping-pong:
//!
//! ```text
//! post_send -> tx_link     199961  310 ns  (p10 300, p90 331)
//! rx_link -> poll_hit      199940  210 ns  (p10 200, p90 240)
//! ```
//!
//! `softverbs perf` starts the probes and prints the report on standard
//! error when built with the feature:
//!
//! ```text
//! cargo build --release --features probes
//! taskset -c 1 target/release/softverbs perf send_lat --link shm -s 8 -n 200000 --server -p 18900 &
//! taskset -c 0 target/release/softverbs perf send_lat --link shm -s 8 -n 200000 -p 18900 127.0.0.1
//! ```
//!
//! What one process cannot see, the time between the sender's `tx_link`
//! and the receiver's `rx_link` (the link's own latency and the reader's
//! poll loop), is the half round trip less the stages of both sides.

/// A point on the path of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Point {
    /// A `post_send` verb starts.
    PostSend = 1,
    /// The link takes a datagram: published in a shared-memory ring, or
    /// about to enter the UDP send system call.
    TxLink = 2,
    /// The UDP send system call returned.
    TxSyscallDone = 3,
    /// A datagram came out of the link (ring slot read, receive call
    /// returned data).
    RxLink = 4,
    /// A CQ poll returned completions.
    PollHit = 5,
    /// A `post_recv` verb starts.
    PostRecv = 6,
}

impl Point {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Point::PostSend => "post_send",
            Point::TxLink => "tx_link",
            Point::TxSyscallDone => "tx_syscall_done",
            Point::RxLink => "rx_link",
            Point::PollHit => "poll_hit",
            Point::PostRecv => "post_recv",
        }
    }
}

#[cfg(feature = "probes")]
mod on {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::OnceLock;

    use super::Point;

    const POINTS: [Point; 6] = [
        Point::PostSend,
        Point::TxLink,
        Point::TxSyscallDone,
        Point::RxLink,
        Point::PollHit,
        Point::PostRecv,
    ];
    /// Low bits of an entry: the TSC; high byte: the point.
    const TSC_MASK: u64 = (1 << 56) - 1;

    struct Probes {
        clock: quanta::Clock,
        next: AtomicUsize,
        entries: Box<[AtomicU64]>,
    }

    static PROBES: OnceLock<Probes> = OnceLock::new();

    pub(super) fn start(capacity: usize) {
        PROBES.get_or_init(|| Probes {
            clock: quanta::Clock::new(),
            next: AtomicUsize::new(0),
            // Written now, so that marks never fault a page in.
            entries: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        });
    }

    #[inline]
    pub(super) fn mark(p: Point) {
        if let Some(pr) = PROBES.get() {
            let i = pr.next.fetch_add(1, Ordering::Relaxed);
            if let Some(e) = pr.entries.get(i) {
                e.store(
                    (u64::from(p as u8) << 56) | (pr.clock.raw() & TSC_MASK),
                    Ordering::Relaxed,
                );
            }
        }
    }

    pub(super) fn report() -> Option<String> {
        let pr = PROBES.get()?;
        let n = pr.next.load(Ordering::Relaxed).min(pr.entries.len());
        let point = |v: u64| POINTS.into_iter().find(|p| *p as u8 == (v >> 56) as u8);
        let mut pairs: HashMap<(Point, Point), Vec<u64>> = HashMap::new();
        let entries: Vec<u64> = pr.entries[..n].iter().map(|e| e.load(Ordering::Relaxed)).collect();
        for w in entries.windows(2) {
            if let (Some(a), Some(b)) = (point(w[0]), point(w[1])) {
                let ns = pr.clock.delta_as_nanos(w[0] & TSC_MASK, w[1] & TSC_MASK);
                pairs.entry((a, b)).or_default().push(ns);
            }
        }
        let mut rows: Vec<((Point, Point), Vec<u64>)> = pairs.into_iter().collect();
        rows.sort_by_key(|(k, v)| (std::cmp::Reverse(v.len()), k.0 as u8, k.1 as u8));
        let mut out = format!(
            "probes: {n} marks{}\n",
            if n == pr.entries.len() { " (buffer full)" } else { "" }
        );
        for ((a, b), mut v) in rows.into_iter().take(16) {
            v.sort_unstable();
            let at = |q: usize| v[(v.len() - 1) * q / 100];
            out.push_str(&format!(
                "{:>15} -> {:<15} {:>9}  {:>6} ns  (p10 {}, p90 {})\n",
                a.name(),
                b.name(),
                v.len(),
                at(50),
                at(10),
                at(90)
            ));
        }
        Some(out)
    }
}

/// Starts recording, with room for `capacity` marks (8 bytes each; marks
/// beyond are dropped). Without the `probes` feature: nothing.
#[inline]
pub fn start(capacity: usize) {
    #[cfg(feature = "probes")]
    on::start(capacity);
    #[cfg(not(feature = "probes"))]
    let _ = capacity;
}

/// Records that the message path passed `p` (nothing before [`start`] or
/// without the `probes` feature).
#[inline(always)]
pub fn mark(p: Point) {
    #[cfg(feature = "probes")]
    on::mark(p);
    #[cfg(not(feature = "probes"))]
    let _ = p;
}

/// The stages seen so far (see the module docs); `None` if the probes
/// never started (always, without the `probes` feature).
pub fn report() -> Option<String> {
    #[cfg(feature = "probes")]
    return on::report();
    #[cfg(not(feature = "probes"))]
    None
}

#[cfg(all(test, feature = "probes"))]
mod tests {
    use super::*;

    #[test]
    fn the_report_shows_each_stage_in_order() {
        start(1000);
        for _ in 0..10 {
            mark(Point::PostSend);
            mark(Point::TxLink);
            mark(Point::RxLink);
            mark(Point::PollHit);
        }
        let r = report().expect("started");
        let line = |a: &str, b: &str| {
            r.lines()
                .find(|l| l.contains(a) && l.contains(&format!("-> {b}")))
                .map(str::to_owned)
        };
        for (a, b, n) in [
            ("post_send", "tx_link", 10),
            ("tx_link", "rx_link", 10),
            ("rx_link", "poll_hit", 10),
            ("poll_hit", "post_send", 9),
        ] {
            let l = line(a, b).unwrap_or_else(|| panic!("{a} -> {b} missing in\n{r}"));
            assert!(l.split_whitespace().any(|w| w == n.to_string()), "{l}");
        }
    }
}
