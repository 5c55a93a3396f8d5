//! A small slab: dense ids for objects, reused after removal, oldest
//! first and only once [`REUSE_AFTER`] ids wait: an id (a QP number, a
//! CQ's handle) freed now is not handed out again at once, so a packet or
//! a handle that outlived its object does not reach its successor, as
//! hardware and rxe cycle through their number spaces.

use std::collections::VecDeque;

/// Freed ids wait until this many others are free before reuse.
pub(crate) const REUSE_AFTER: usize = 1024;

#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    free: VecDeque<u32>,
    live: u32,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: VecDeque::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        self.live += 1;
        let reuse = if self.free.len() > REUSE_AFTER {
            self.free.pop_front()
        } else {
            None
        };
        match reuse {
            Some(i) => {
                self.slots[i as usize] = Some(value);
                i
            }
            None => {
                self.slots.push(Some(value));
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub(crate) fn get(&self, id: u32) -> Option<&T> {
        self.slots.get(id as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.slots.get_mut(id as usize)?.as_mut()
    }

    pub(crate) fn remove(&mut self, id: u32) -> Option<T> {
        let v = self.slots.get_mut(id as usize)?.take()?;
        self.live -= 1;
        self.free.push_back(id);
        Some(v)
    }

    /// Frees the id of a value taken with [`Slab::take`] and not put back
    /// (the object is gone): its count and its id, as [`Slab::remove`]
    /// does. Call it once per such take; nothing if the id holds a value
    /// or was never given.
    pub(crate) fn free_taken(&mut self, id: u32) {
        if matches!(self.slots.get(id as usize), Some(None)) {
            self.live -= 1;
            self.free.push_back(id);
        }
    }

    /// Takes the value out while keeping its id reserved (see [`Slab::put`]).
    pub(crate) fn take(&mut self, id: u32) -> Option<T> {
        self.slots.get_mut(id as usize)?.take()
    }

    /// Puts back a value taken with [`Slab::take`].
    pub(crate) fn put(&mut self, id: u32, value: T) {
        self.slots[id as usize] = Some(value);
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|v| (i as u32, v)))
    }

    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|v| (i as u32, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_then_freed_id_is_counted_out_and_reused_late() {
        let mut s: Slab<u32> = Slab::default();
        let a = s.insert(1);
        assert_eq!(s.take(a), Some(1));
        // Taken: still counted, id reserved.
        assert_eq!(s.live(), 1);
        s.free_taken(a);
        assert_eq!(s.live(), 0);
        // Not at once: fresh ids first.
        let b = s.insert(2);
        assert_ne!(b, a);
        s.remove(b);
        // `a` and `b` wait; each round frees one more.
        for i in 0..REUSE_AFTER as u32 - 1 {
            let id = s.insert(i);
            assert!(id != a && id != b, "id {id} reused after {i} inserts");
            s.remove(id);
        }
        // Oldest first, once enough wait.
        assert_eq!(s.insert(7), a);
    }

    #[test]
    fn free_taken_ignores_held_and_unknown_ids() {
        let mut s: Slab<u32> = Slab::default();
        let a = s.insert(1);
        s.free_taken(a);
        s.free_taken(99);
        assert_eq!(s.live(), 1);
        assert_eq!(s.get(a), Some(&1));
    }
}
