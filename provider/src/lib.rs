//! softverbs: RDMA verbs in pure Rust, with or without the hardware.
//!
//! - [`verbs`]: the backend-neutral API (devices, PDs, MRs, CQs, QPs, SRQs,
//!   address handles, work requests and completions, async events), with
//!   libibverbs semantics and typed errors that carry the errno hardware
//!   returns.
//! - [`cm`]: the connection manager (rdma_cm's semantics, IBTA CM MADs on
//!   QP1 between soft devices, hotplug and namespaces handled once).
//! - [`soft`]: the soft provider, a verbs device in pure Rust speaking RoCEv2
//!   (no kernel module, no root, no NIC).
//! - `hw` (feature `hardware`): the same API over real ibverbs via rdma-sys.
//! - [`ulp`]: the layer protocols build on: completion callbacks, poll
//!   contexts, read/write contexts with fast registration, send-queue
//!   budgets, READ depth and MR pools.
//! - [`netns`] (Linux): network-namespace identities and running code inside
//!   another namespace (used by hardware discovery and by the emulator's
//!   Linux namespace driver).
//!
//! See the [`verbs`] module for the memory-safety rule of the API.

pub mod cm;
#[cfg(feature = "hardware")]
pub mod hw;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod soft;
pub mod subsystem;
mod sys;
pub mod ulp;
pub mod verbs;
