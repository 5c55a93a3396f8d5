//! The verbs conformance suite: cases written once against the
//! backend-neutral API of [`softverbs::verbs`], run on any backend.

pub mod harness;
