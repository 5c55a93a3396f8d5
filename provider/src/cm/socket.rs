//! A sockets-like API over CM ids (to be filled in below).
