//! softverbs: RDMA verbs in pure Rust, with or without the hardware.

pub mod soft;
