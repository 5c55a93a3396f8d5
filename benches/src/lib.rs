//! Benchmarks for softverbs.
