//! The engine's timer table: one entry per armed QP timer, ordered by
//! deadline, with the earliest deadline kept beside the set.
//!
//! Every verb asks for the earliest deadline ([`super::Core::poll_timeout`]:
//! the inline engine compares it with the clock, and arms its wake-up from
//! it), a busy-polling reader millions of times a second. A B-tree's
//! `first` walks to its leftmost leaf and carries the code of that walk
//! into every caller; the cached value is one load.

use std::collections::BTreeSet;

use super::Nanos;

/// Deadlines of armed QP timers, as `(deadline, qpn)`.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    set: BTreeSet<(Nanos, u32)>,
    /// The set's first deadline, `None` when it is empty.
    first: Option<Nanos>,
}

impl Timers {
    /// The earliest deadline.
    #[inline]
    pub(crate) fn first_deadline(&self) -> Option<Nanos> {
        self.first
    }

    /// The earliest entry.
    pub(crate) fn first(&self) -> Option<(Nanos, u32)> {
        self.set.first().copied()
    }

    pub(crate) fn insert(&mut self, deadline: Nanos, qpn: u32) {
        self.set.insert((deadline, qpn));
        if self.first.is_none_or(|f| deadline < f) {
            self.first = Some(deadline);
        }
    }

    pub(crate) fn remove(&mut self, deadline: Nanos, qpn: u32) {
        if self.set.remove(&(deadline, qpn)) && self.first == Some(deadline) {
            self.refresh();
        }
    }

    pub(crate) fn pop_first(&mut self) -> Option<(Nanos, u32)> {
        let e = self.set.pop_first();
        self.refresh();
        e
    }

    pub(crate) fn clear(&mut self) {
        self.set.clear();
        self.first = None;
    }

    fn refresh(&mut self) {
        self.first = self.set.first().map(|&(t, _)| t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cached deadline follows the set through every operation.
    #[test]
    fn first_deadline_follows_the_set() {
        let mut t = Timers::default();
        assert_eq!(t.first_deadline(), None);
        t.insert(50, 1);
        t.insert(30, 2);
        t.insert(30, 3);
        t.insert(70, 4);
        assert_eq!(t.first_deadline(), Some(30));
        // One of two entries at the first deadline goes: still 30.
        t.remove(30, 2);
        assert_eq!(t.first_deadline(), Some(30));
        t.remove(30, 3);
        assert_eq!(t.first_deadline(), Some(50));
        // Removing an entry that is not there changes nothing.
        t.remove(50, 9);
        assert_eq!(t.first_deadline(), Some(50));
        t.remove(70, 4);
        assert_eq!(t.first_deadline(), Some(50));
        assert_eq!(t.pop_first(), Some((50, 1)));
        assert_eq!(t.first_deadline(), None);
        assert_eq!(t.pop_first(), None);
        t.insert(10, 5);
        t.insert(20, 6);
        assert_eq!(t.first(), Some((10, 5)));
        t.clear();
        assert_eq!(t.first_deadline(), None);
        assert_eq!(t.first(), None);
    }
}
