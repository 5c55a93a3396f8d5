//! An in-run A/B switch for latency experiments.
//!
//! On these shared machines the host moves the two vCPUs of a ping-pong
//! between placements that change its one-way time two- to fourfold, from
//! one run to the next and within runs, so a change worth a few percent
//! hides in the spread of separate runs of two builds. Measured inside one
//! run instead, both variants meet the same placements: wrap the variant in
//! [`on`],
//!
//! ```
//! # fn new_way() {}
//! # fn old_way() {}
//! if softverbs::soft::experiment::on() {
//!     new_way();
//! } else {
//!     old_way();
//! }
//! ```
//!
//! build with the `ab` feature (`cargo build --release --features
//! softverbs-emulator/ab`) and run `softverbs perf send_lat --ab 1024 ...`
//! on both ends: each end switches per block of 1,024 iterations by its
//! receive count, so both switch together, and the client prints the
//! median one-way time of the blocks of either arm. Without the feature
//! [`on`] is `false` and [`set`] does nothing: experiment code left in
//! costs nothing. (Eight runs of `-n 200000` told a 3 % change apart in
//! every run; `benches/ab.sh`, which alternates two builds, needs 60-100
//! rounds for 5 %.)

#[cfg(feature = "ab")]
static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the experimental arm is on (always `false` without the `ab`
/// feature).
#[inline(always)]
pub fn on() -> bool {
    #[cfg(feature = "ab")]
    {
        ON.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "ab"))]
    {
        false
    }
}

/// Switches the arm for what this process does next (no effect without
/// the `ab` feature).
#[inline]
pub fn set(on: bool) {
    #[cfg(feature = "ab")]
    ON.store(on, std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "ab"))]
    let _ = on;
}

#[cfg(all(test, feature = "ab"))]
mod tests {
    #[test]
    fn the_switch_reads_back() {
        super::set(true);
        assert!(super::on());
        super::set(false);
        assert!(!super::on());
    }
}
