//! RoCEv2 wire format (placeholder, being written).
