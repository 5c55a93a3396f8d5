//! The registry's topology lock, which serializes the operations that
//! make upcalls: reentrant, so that an upcall can call back into the
//! subsystem on the thread that holds it (see the registry's module docs).

use crate::sys::lock;
use std::sync::{Condvar, Mutex};
use std::thread::{self, ThreadId};

/// A reentrant lock: held by one thread, any number of times.
#[derive(Debug, Default)]
pub(super) struct TopologyLock {
    owner: Mutex<(Option<ThreadId>, u32)>,
    cv: Condvar,
}

pub(super) struct TopologyGuard<'a>(&'a TopologyLock);

impl TopologyLock {
    pub(super) fn acquire(&self) -> TopologyGuard<'_> {
        let me = thread::current().id();
        let mut o = lock(&self.owner);
        loop {
            match o.0 {
                None => {
                    *o = (Some(me), 1);
                    break;
                }
                Some(t) if t == me => {
                    o.1 += 1;
                    break;
                }
                Some(_) => o = self.cv.wait(o).unwrap_or_else(|p| p.into_inner()),
            }
        }
        TopologyGuard(self)
    }
}

impl Drop for TopologyGuard<'_> {
    fn drop(&mut self) {
        let mut o = lock(&self.0.owner);
        o.1 -= 1;
        if o.1 == 0 {
            o.0 = None;
            self.0.cv.notify_all();
        }
    }
}
