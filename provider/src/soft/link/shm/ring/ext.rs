//! The extensions of [`KIND_TRAIN`](super::KIND_TRAIN) and
//! [`KIND_FORGET`](super::KIND_FORGET) slots: a train's descriptor and a
//! list of tokens to forget, their wire form (little-endian) and the
//! checks of what the peer wrote.

use super::{DESC_HDR, DESC_PIECE, FORGET_MAX, TRAIN_MAX_PIECES};

/// One piece of a train descriptor: `len` bytes at `offset` of the
/// buffer the producer calls `token`, or at address `offset` of the
/// producer process if `token` is [`PROCESS_TOKEN`](super::PROCESS_TOKEN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DescPiece {
    /// The producer's name for the buffer (exported to the consumer
    /// beforehand; see the link).
    pub token: u64,
    /// Offset in the buffer.
    pub offset: u64,
    /// Length.
    pub len: u32,
}

/// The extension of a [`KIND_TRAIN`](super::KIND_TRAIN) slot: how many
/// packets the train stands for and where its payload is, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainDesc {
    /// Packets (PSNs) the train stands for.
    pub npkts: u32,
    /// The pieces (1 to [`TRAIN_MAX_PIECES`]).
    pub pieces: Vec<DescPiece>,
}

impl TrainDesc {
    /// Bytes of the wire form.
    pub fn encoded_len(&self) -> usize {
        DESC_HDR + DESC_PIECE * self.pieces.len()
    }

    /// Appends the wire form to `out`. `None` (nothing appended) if the
    /// descriptor is not one [`TrainDesc::decode`] accepts.
    pub fn encode(&self, out: &mut Vec<u8>) -> Option<()> {
        if !self.valid() {
            return None;
        }
        out.reserve(self.encoded_len());
        out.extend_from_slice(&self.npkts.to_le_bytes());
        out.extend_from_slice(&(self.pieces.len() as u32).to_le_bytes());
        for p in &self.pieces {
            out.extend_from_slice(&p.token.to_le_bytes());
            out.extend_from_slice(&p.offset.to_le_bytes());
            out.extend_from_slice(&p.len.to_le_bytes());
        }
        Some(())
    }

    /// Parses a descriptor written by the peer (untrusted): the exact
    /// length for its piece count, 1 to [`TRAIN_MAX_PIECES`] pieces, at
    /// least one packet, no piece whose end overflows, and a total length
    /// of at most 2^31 bytes (a message). Whether the pieces lie in their
    /// buffers is for the caller to check against the mappings.
    pub fn decode(b: &[u8]) -> Option<TrainDesc> {
        let mut d = TrainDesc {
            npkts: 0,
            pieces: Vec::new(),
        };
        d.decode_from(b).then_some(d)
    }

    /// [`TrainDesc::decode`] into `self`, reusing its piece vector (the
    /// receive path parses one descriptor per train); returns whether the
    /// descriptor is acceptable. On `false`, `self` holds garbage.
    pub fn decode_from(&mut self, b: &[u8]) -> bool {
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let piece = |i: usize| {
            let o = DESC_HDR + DESC_PIECE * i;
            Some(DescPiece {
                token: u64_at(o)?,
                offset: u64_at(o + 8)?,
                len: u32_at(o + 16)?,
            })
        };
        self.pieces.clear();
        let (Some(npkts), Some(count)) = (u32_at(0), u32_at(4)) else {
            return false;
        };
        let count = count as usize;
        if count == 0 || count > TRAIN_MAX_PIECES || b.len() != DESC_HDR + DESC_PIECE * count {
            return false;
        }
        self.npkts = npkts;
        for i in 0..count {
            match piece(i) {
                Some(p) => self.pieces.push(p),
                None => return false,
            }
        }
        self.valid()
    }

    fn valid(&self) -> bool {
        let total: u64 = self.pieces.iter().map(|p| u64::from(p.len)).sum();
        self.npkts > 0
            && !self.pieces.is_empty()
            && self.pieces.len() <= TRAIN_MAX_PIECES
            && total <= 1 << 31
            && self
                .pieces
                .iter()
                .all(|p| p.offset.checked_add(u64::from(p.len)).is_some())
    }
}

/// Appends the extension of a [`KIND_FORGET`](super::KIND_FORGET) slot
/// naming `tokens` (at most [`FORGET_MAX`]; the rest is ignored) to
/// `out`.
pub fn encode_forget(tokens: &[u64], out: &mut Vec<u8>) {
    for t in tokens.iter().take(FORGET_MAX) {
        out.extend_from_slice(&t.to_le_bytes());
    }
}

/// The tokens of a [`KIND_FORGET`](super::KIND_FORGET) slot's extension
/// (untrusted); `None` if it is not a whole number of tokens.
pub fn decode_forget(b: &[u8]) -> Option<impl Iterator<Item = u64> + '_> {
    if !b.len().is_multiple_of(8) || b.len() > FORGET_MAX * 8 {
        return None;
    }
    Some(
        b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))),
    )
}
