//! The verbs conformance suite.
