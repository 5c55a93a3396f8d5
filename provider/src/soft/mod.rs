//! The soft provider: a verbs device implemented in software that speaks
//! RoCEv2 over datagram links.
//!
//! Layers, bottom up (see DESIGN §2):
//! - [`wire`]: RoCEv2 headers, opcode table and ICRC. No I/O, no `unsafe`.
//! - [`device`]: soft devices, their attributes, and the provider that lists
//!   them.

pub mod device;
pub mod wire;

pub use device::{provider, SoftDevice, SoftDeviceConfig};
