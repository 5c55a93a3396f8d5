//! The soft provider: a verbs device implemented in software that speaks
//! RoCEv2 over datagram links.
//!
//! Layers, bottom up (see `docs/design.md` §2; `wire`, `proto`, `experiment` and
//! `probe` are public for the repository's own tools and tests, hidden
//! from these docs, and not a stable API):
//! - `wire`: RoCEv2 headers, opcode table and ICRC. No I/O, no `unsafe`.
//! - `proto`: the sans-IO engine of a device (QPs, MRs, CQs, SRQs, the
//!   RC/UC/UD transport). No I/O, no clock, no threads.
//! - [`link`]: datagram links between devices: in-process, UDP, and shared
//!   memory between processes of one host.
//! - [`engine`]: drives `proto` over a link in real time (inline progress,
//!   or a progress thread).
//! - [`device`]: soft devices, their attributes, and the provider that lists
//!   them; the verbs objects over the engine live in a private module.

mod clock;
pub mod device;
pub mod engine;
// Hidden: a switch for latency experiments, set by the perf tool's `--ab`.
#[doc(hidden)]
pub mod experiment;
pub mod link;
mod notify;
mod objects;
pub(crate) use objects::SoftLock;
// Hidden: latency probes (feature `probes`), started by the perf tool.
#[doc(hidden)]
pub mod probe;
// Hidden: the sans-IO engine; the emulator's simulated fabric drives it.
#[doc(hidden)]
pub mod proto;
// Hidden: packet formats; the simulated fabric, benches and tests build packets.
#[doc(hidden)]
pub mod wire;

pub use device::{embedded_default, provider, SoftDevice, SoftDeviceConfig, DROP_COUNTERS};
pub use engine::DeviceShared;
