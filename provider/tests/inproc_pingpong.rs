//! An RC ping-pong of 8-byte sends between two in-process soft devices,
//! every WR completed exactly once (the example runs a million; this runs
//! fewer to stay quick).

#[path = "../examples/inproc_pingpong.rs"]
mod example;

#[test]
fn ten_thousand_round_trips_complete_exactly_once() {
    example::run(10_000).unwrap();
}
