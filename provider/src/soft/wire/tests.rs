//! Tests that cross file boundaries: the extension headers on fixed bytes,
//! whole packets for every opcode, the ICRC against independent and
//! captured references, and property tests on untrusted input.

mod ext_headers;
mod icrc_vectors;
mod opcode_table;
mod packet_fuzz;
mod packets;
mod reference;
