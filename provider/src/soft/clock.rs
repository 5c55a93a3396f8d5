//! The soft devices' common clock, read by the engine and by the links
//! (a link's timers: hello timeouts, liveness, rate-limited logs).

use super::proto::Nanos;

/// Nanoseconds since the first soft device of the process started: the
/// engines' common clock. TSC-based (quanta): the engine reads it on every
/// verb, and `std::time::Instant` (a vDSO call) was 13 % of an in-process
/// ping-pong profile.
#[cfg(not(miri))]
pub fn process_now() -> Nanos {
    // The raw counter against the first reading, scaled once: going
    // through `quanta::Instant` and `Duration` cost ~40 instructions a
    // call, twice per message.
    static CLOCK: std::sync::OnceLock<(quanta::Clock, u64)> = std::sync::OnceLock::new();
    let (clock, epoch) = CLOCK.get_or_init(|| {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        (clock, epoch)
    });
    clock.delta_as_nanos(*epoch, clock.raw())
}

/// [`process_now`] under Miri, which runs no TSC read (inline assembly):
/// the monotonic clock.
#[cfg(miri)]
pub fn process_now() -> Nanos {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as Nanos
}
