//! The verbs conformance suite: cases written once against the
//! backend-neutral API of [`softverbs::verbs`], run on any backend.
//!
//! - [`case`]: the case model ([`Case`], [`Env`], [`Cap`], [`Check`]).
//! - [`cases`]: every case, grouped by area; [`cases::all`] lists them.
//! - [`runner`]: selects and runs cases on a [`Target`] and renders the
//!   report (table, JSON, JUnit).
//! - [`divergence`]: known divergences per backend and device, and known
//!   soft-provider bugs.
//! - [`expectation`]: the committed expectation per backend (every
//!   case's pass, skip reason or known divergence) the suite's own test
//!   compares a run against.
//! - [`harness`]: building blocks the cases share (connected pairs,
//!   completion and event waits).
//!
//! # Examples
//!
//! ```no_run
//! use softverbs_conformance::{cases, runner};
//! let target = runner::Target::soft_default()?;
//! let opts = runner::RunOptions {
//!     filter: runner::Filter::new(Some("err.rc.*")),
//!     ..runner::RunOptions::default()
//! };
//! let report = runner::run(&target, cases::all(), &opts, &mut |r| println!("{} {}", r.id, r.verdict.name()))?;
//! println!("{}", report.summary().line());
//! # Ok::<(), softverbs::verbs::Error>(())
//! ```

pub mod case;
pub mod cases;
pub mod divergence;
pub mod expectation;
pub mod harness;
pub mod runner;

pub use case::{Cap, Case, Check, Env, Stop};
pub use runner::{Report, Target};
