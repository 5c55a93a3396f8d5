//! The softverbs emulator: the environment that pretends to be RDMA hardware
//! and network, and the `softverbs` command-line tool.
//!
//! Today this crate holds the CLI ([`cli`]): `softverbs devices` and
//! `softverbs devinfo`, the `ibv_devices` / `ibv_devinfo` of the soft
//! provider and of hardware. The deterministic simulated fabric (virtual
//! time, seeded faults), the namespace and hotplug drivers, and the
//! perf/conformance/pingpong/sim subcommands join it later (DESIGN §2).
//!
//! Run it from the workspace root with `cargo run --release -- <args>`, e.g.
//! `cargo run --release -- devinfo -v`.

pub mod cli;
pub mod netns;
