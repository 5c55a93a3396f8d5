//! Benchmarks for softverbs: perftest-compatible tools ([`perftest`]), a
//! many-QP scale benchmark ([`scale`]), and (in `benches/`) criterion
//! micro-benchmarks of the soft provider's hot paths.
//!
//! The `softverbs perf <test>` subcommand of the CLI is a thin wrapper over
//! [`perftest::run`](fn@perftest::run), so the tool, the tests and the criterion benches share
//! one implementation.
//!
//! # Examples
//!
//! A tiny RDMA write bandwidth run between the embedded soft devices:
//!
//! ```
//! use clap::Parser;
//! use softverbs_benches::perftest::{self, PerfArgs};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     perf: PerfArgs,
//! }
//!
//! softverbs::soft::embedded_default()?;
//! let cli = Cli::parse_from(["perf", "write_bw", "-s", "4096", "-n", "20"]);
//! let mut out = Vec::new();
//! perftest::run(&cli.perf, softverbs::verbs::BackendKind::Soft, &mut out)?;
//! let text = String::from_utf8(out)?;
//! assert!(text.contains("BW average[MB/sec]"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod perftest;
pub mod scale;
