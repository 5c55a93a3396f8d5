//! The softverbs emulator: the environment that pretends to be RDMA hardware
//! and network, and the `softverbs` command-line tool.
//!
//! [`cli`] is the `softverbs` command: `devices` and `devinfo` (the
//! `ibv_devices` / `ibv_devinfo` of the soft provider and of hardware),
//! `perf` (perftest-compatible benchmarks), `pingpong`, `conformance` and
//! `sim`. [`sim`] is the deterministic simulated fabric
//! (virtual time, seeded faults, a reference-model checker and a
//! loss/latency benchmark; `softverbs sim`). [`netns`] holds the namespace
//! drivers that feed the device subsystem: a virtual one and, on Linux, one
//! for real network namespaces. The libibverbs-compatible C library is the
//! crate under `emulator/ibverbs/`.
//!
//! Run it from the workspace root with `cargo run --release -- <args>`, e.g.
//! `cargo run --release -- devinfo -v`.

pub mod cli;
pub mod netns;
pub mod sim;
