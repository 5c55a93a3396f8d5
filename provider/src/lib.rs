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
//!
//! # Getting started
//!
//! Devices live inside the process that creates them: a soft device exists
//! once it is made ([`soft::embedded_default`] makes two joined in this
//! process; [`soft::SoftDeviceConfig::udp`] one that talks to other
//! processes and hosts over UDP), a hardware device once the `hardware`
//! feature finds it. Then it is libibverbs: a context, a protection
//! domain, memory regions, completion queues, queue pairs.
//! [`verbs::Endpoint`] and [`verbs::Qp::connect`] take a QP to RTS in one
//! call, [`verbs::exchange`] swaps endpoints over TCP.
//!
//! The example below (`provider/examples/rdma_ops.rs`, `cargo run -p
//! softverbs --example rdma_ops`) does an RDMA WRITE, a READ, a SEND with
//! immediate data and an atomic fetch-and-add between two devices, waiting
//! on completion channels:
//!
//! ```
#![doc = include_str!("../examples/rdma_ops.rs")]
//! ```

pub mod cm;
#[cfg(feature = "hardware")]
pub mod hw;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod soft;
pub mod subsystem;
// Hidden: system-call helpers; only its netlink framing is public, for the
// emulator's rtnetlink driver.
#[doc(hidden)]
pub mod sys;
pub mod ulp;
pub mod verbs;
