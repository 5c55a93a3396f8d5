//! The WRs of one queue posted and not retired, in post order.

use super::Req;

/// One posted WR of a queue, not retired yet.
#[derive(Default)]
pub(super) struct Slot {
    /// The request, in the slot of its last posted WR (none in the slots
    /// of the chain's earlier WRs, nor in a drain marker's).
    pub(super) req: Option<Req>,
    /// Of an earlier WR of a chain: how many slots ahead the slot holding
    /// its request is.
    pub(super) ahead: u32,
    /// Whether the WR holds a READ/atomic credit.
    pub(super) rd: bool,
}

/// The WRs of one queue posted and not retired, in post order: a ring
/// indexed by the sequence number each WR's `wr_id` carries, so a
/// completion finds its WR, and the request in it, without a lookup. The
/// layer never has more WRs posted than the queue holds; the ring grows
/// (by doubling) only up to that.
pub(super) struct Ring {
    pub(super) slots: Box<[Slot]>,
    pub(super) mask: u64,
    /// Sequence number of the oldest WR not retired.
    pub(super) head: u64,
    /// Sequence number of the next WR posted.
    pub(super) next: u64,
    /// Whether a completion of the queue had an error: a later WR without
    /// a completion of its own was flushed.
    pub(super) err: bool,
}

impl Ring {
    /// A ring for a queue of `depth` WRs (it starts smaller and grows).
    pub(super) fn new(depth: u32) -> Ring {
        Ring::with_len(depth.clamp(1, 64).next_power_of_two() as usize)
    }

    fn with_len(len: usize) -> Ring {
        Ring {
            slots: (0..len).map(|_| Slot::default()).collect(),
            mask: len as u64 - 1,
            head: 0,
            next: 0,
            err: false,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.head == self.next
    }

    /// Whether `seq` names a WR posted and not retired.
    pub(super) fn holds(&self, seq: u64) -> bool {
        seq.wrapping_sub(self.head) < self.next - self.head
    }

    pub(super) fn slot(&mut self, seq: u64) -> &mut Slot {
        &mut self.slots[(seq & self.mask) as usize]
    }

    /// Records the next WR as posted (taking the next sequence number).
    #[inline]
    pub(super) fn push(&mut self, req: Option<Req>, ahead: u32, rd: bool) {
        if self.next - self.head == self.slots.len() as u64 {
            self.grow();
        }
        let seq = self.next;
        let s = self.slot(seq);
        // The slot was emptied when its last WR retired (`pop`): nothing
        // to drop there (should it hold a request, it leaks, no worse).
        debug_assert!(s.req.is_none());
        std::mem::forget(std::mem::replace(&mut s.req, req));
        s.ahead = ahead;
        s.rd = rd;
        self.next = seq + 1;
    }

    #[cold]
    fn grow(&mut self) {
        let mut bigger = Ring::with_len(self.slots.len() * 2);
        bigger.head = self.head;
        bigger.next = self.next;
        bigger.err = self.err;
        for seq in self.head..self.next {
            *bigger.slot(seq) = std::mem::take(self.slot(seq));
        }
        *self = bigger;
    }

    /// Takes the oldest WR out.
    #[inline]
    pub(super) fn pop(&mut self) -> Slot {
        let seq = self.head;
        self.head = seq + 1;
        let s = self.slot(seq);
        Slot {
            req: s.req.take(),
            ahead: s.ahead,
            rd: s.rd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `holds` names exactly the WRs posted and not retired: not the next
    /// sequence number, not one retired, not one far ahead; a stray
    /// completion naming any of those must not retire anything.
    #[test]
    fn holds_exactly_the_outstanding_sequence_numbers() {
        let mut r = Ring::new(4);
        assert!(!r.holds(0), "an empty ring holds nothing");
        for _ in 0..3 {
            r.push(None, 0, false);
        }
        assert_eq!(
            (0..6).map(|s| r.holds(s)).collect::<Vec<_>>(),
            [true, true, true, false, false, false]
        );
        r.pop();
        r.pop();
        // Outstanding: 2 only.
        assert_eq!(
            (0..6).map(|s| r.holds(s)).collect::<Vec<_>>(),
            [false, false, true, false, false, false]
        );
        assert!(!r.holds(u64::MAX));
        // Past the ring's first length: it grows, and every outstanding
        // WR keeps its own slot (each is marked with its number).
        for seq in 3..9 {
            r.push(None, seq, seq % 2 == 0);
        }
        assert!((2..9).all(|s| r.holds(s)));
        assert!(!r.holds(1) && !r.holds(9));
        assert!((3..9).all(|s| r.slot(s).ahead == s as u32 && r.slot(s).rd == (s % 2 == 0)));
        // Retired in post order, and the ring keeps working when it wraps.
        r.pop();
        for seq in 3..9 {
            assert_eq!(r.pop().ahead, seq as u32);
        }
        assert!(r.is_empty());
        for round in 0..40u32 {
            r.push(None, round, false);
            r.push(None, round + 1000, false);
            assert_eq!(r.pop().ahead, round);
            assert_eq!(r.pop().ahead, round + 1000);
        }
    }
}
