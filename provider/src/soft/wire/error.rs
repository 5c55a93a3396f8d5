//! The one error type of the wire layer.

/// Why a buffer could not be parsed as (or emitted into) a RoCEv2 packet.
///
/// Small and `Copy`: the receive path drops malformed packets at line rate
/// and only counts the reason, so building an error must cost nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before a header (or the packet's fixed minimum,
    /// BTH plus ICRC) does.
    #[error("buffer too short for the header or packet")]
    Truncated,
    /// The transport packet (BTH through ICRC) is not a whole number of
    /// 4-byte words, so header, payload and pad cannot be consistent.
    #[error("packet length is not a multiple of 4 bytes")]
    BadLength,
    /// The BTH opcode is not one this implementation speaks (RD, XRC,
    /// reserved and manufacturer-specific opcodes land here).
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A RoCEv2 congestion notification packet (opcode 0x81). Well formed,
    /// but not a transport packet: the receive path counts and drops it.
    #[error("congestion notification packet")]
    CongestionNotification,
    /// The BTH transport header version is not 0 (IBTA Vol. 1 §9.2: packets
    /// with an unsupported TVer are silently dropped).
    #[error("unsupported transport header version {0}")]
    BadVersion(u8),
    /// The BTH pad count is larger than the bytes between the last header
    /// and the ICRC, or non-zero on an opcode without payload.
    #[error("pad count does not fit the packet")]
    BadPad,
    /// Bytes follow the headers of an opcode that carries no payload
    /// (an acknowledge or read request with data, for example).
    #[error("payload on an opcode that carries none")]
    UnexpectedPayload,
    /// Emit only: the extension headers supplied are not exactly those the
    /// opcode table lists for the opcode.
    #[error("extension headers do not match the opcode")]
    HeaderMismatch,
    /// Emit only: the output buffer is too small for the packet.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// A soft-device extension (the selective acknowledgement of
    /// `wire::sack`) has a bad magic, version, count or range.
    #[error("malformed soft-device extension")]
    BadExtension,
}
