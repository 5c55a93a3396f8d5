//! Where the layer's per-QP and per-CQ state is guarded: by the soft
//! provider's engine lock when the QP or CQ is a soft one ([`SoftLock`]:
//! the lock every post and poll of that device takes anyway, so the layer
//! adds no lock per operation), else by a mutex of the layer's own (the
//! hardware backend, whose locks are inside libibverbs).

use std::cell::UnsafeCell;
use std::sync::{Mutex, MutexGuard};

use crate::soft::SoftLock;
use crate::sys::lock;
use crate::verbs::backend::{CqOps, DeviceSection, QpOps};
use crate::verbs::{PostError, RecvWr, Result, SendWr, WorkCompletion};

/// A value guarded by the layer's own mutex or by a soft device's engine
/// lock.
pub(crate) struct Guarded<T> {
    guard: Guard,
    cell: UnsafeCell<T>,
}

/// What guards a [`Guarded`] value.
enum Guard {
    /// The layer's own mutex.
    Own(Mutex<()>),
    /// A soft device's engine lock: the value is only touched inside a
    /// section of it.
    Soft(SoftLock),
}

// SAFETY: the value is only reached through `with_qp`, `with_cq` and
// `with_held`, which hold the guard (the own mutex, or the engine lock
// inside a section) for as long as the reference lives: one thread at a
// time, so sharing the `Guarded` between threads hands out no shared
// mutable access; `T: Send` lets the value be used from whichever thread
// holds the guard.
unsafe impl<T: Send> Sync for Guarded<T> {}

impl<T> Guarded<T> {
    /// `value`, guarded by the engine lock `soft` if there is one, else by
    /// a mutex of its own.
    pub(crate) fn new(value: T, soft: Option<SoftLock>) -> Guarded<T> {
        Guarded {
            guard: soft.map_or_else(|| Guard::Own(Mutex::new(())), Guard::Soft),
            cell: UnsafeCell::new(value),
        }
    }

    /// The engine lock guarding the value, if it is not the own mutex.
    #[inline]
    pub(crate) fn soft(&self) -> Option<&SoftLock> {
        match &self.guard {
            Guard::Own(_) => None,
            Guard::Soft(l) => Some(l),
        }
    }

    /// Takes the own mutex (`None` when the engine lock guards the value).
    #[inline]
    pub(super) fn lock_own(&self) -> Option<MutexGuard<'_, ()>> {
        match &self.guard {
            Guard::Own(m) => Some(lock(m)),
            Guard::Soft(_) => None,
        }
    }

    /// Runs `f` on a QP's value holding its guard, with the section to
    /// post and poll through: the own mutex and [`Direct`], or the engine
    /// lock taken as a post takes it (as `ibv_post_recv` takes it if
    /// `recv`: the lock alone, no turn of the engine) and the section
    /// opened on the QP.
    #[inline(always)]
    pub(crate) fn with_qp<R>(&self, recv: bool, f: impl FnOnce(&mut T, &mut dyn DeviceSection) -> R) -> R {
        match &self.guard {
            Guard::Own(m) => {
                let _own = lock(m);
                // SAFETY: the own mutex is held for the call; no other
                // reference to the value is taken under it.
                f(unsafe { self.get() }, &mut Direct)
            }
            // SAFETY: inside a section of the device whose lock guards the
            // value; the only reference to it taken in the section.
            Guard::Soft(l) => l.enter_qp(recv, |sec| f(unsafe { self.get() }, sec)),
        }
    }

    /// [`Guarded::with_qp`] for a CQ's value: the engine lock is taken as
    /// a poll takes it if `poll` (the link is read first), else as a plain
    /// verb does.
    #[inline(always)]
    pub(crate) fn with_cq<R>(&self, poll: bool, f: impl FnOnce(&mut T, &mut dyn DeviceSection) -> R) -> R {
        match &self.guard {
            Guard::Own(m) => {
                let _own = lock(m);
                // SAFETY: as in `with_qp`.
                f(unsafe { self.get() }, &mut Direct)
            }
            // SAFETY: as in `with_qp`.
            Guard::Soft(l) => l.enter_cq(poll, |sec| f(unsafe { self.get() }, sec)),
        }
    }

    /// Runs `f` on the value from inside a section already open, or under
    /// the own mutex, which it takes.
    ///
    /// # Safety
    ///
    /// If the engine lock guards the value, the caller runs inside a
    /// section of that device and holds no other reference to the value.
    #[inline(always)]
    pub(crate) unsafe fn with_held<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let _own = self.lock_own();
        // SAFETY: the own mutex is held, or (the caller's contract) the
        // engine lock in a section, with no other reference taken.
        f(unsafe { self.get() })
    }

    /// # Safety
    ///
    /// The caller holds the guard for as long as the reference lives, and
    /// no other reference to the value.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self) -> &mut T {
        // SAFETY: exclusive per the contract.
        unsafe { &mut *self.cell.get() }
    }
}

/// The section of a backend without a device lock: each call is the verb
/// itself (the layer holds its own mutex around it).
pub(crate) struct Direct;

impl DeviceSection for Direct {
    #[inline]
    fn post_send(&mut self, qp: &dyn QpOps, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        qp.post_send(wrs)
    }

    #[inline]
    fn post_recv(&mut self, qp: &dyn QpOps, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        qp.post_recv(wrs)
    }

    #[inline]
    fn poll(&mut self, cq: &dyn CqOps, wc: &mut [WorkCompletion]) -> Result<usize> {
        cq.poll(wc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A verb called from inside a section would wait for the engine lock
    /// its own thread holds: debug builds panic instead, before locking,
    /// and the device stays usable.
    #[test]
    #[cfg(debug_assertions)]
    fn a_verb_called_inside_a_section_panics_in_debug_builds() {
        use crate::soft::{SoftDevice, SoftDeviceConfig};
        use crate::ulp::{UlpCq, UlpQp, UlpQpInit};
        // A device of its own: should the check be gone, the thread below
        // waits for ever holding this device's lock, and nothing else.
        let dev = SoftDevice::create(SoftDeviceConfig::new(
            "ulp_section_reentry",
            "127.83.204.1".parse().unwrap(),
        ))
        .unwrap();
        let ctx = dev.open().unwrap();
        let cq = UlpCq::new(&ctx, 256).unwrap();
        let qp = UlpQp::create(&ctx.alloc_pd().unwrap(), &cq, &cq, &UlpQpInit::default()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let qp = Arc::new(qp);
        let q = qp.clone();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let lock = SoftLock::of_qp(&**q.qp().ops()).unwrap();
                lock.enter_qp(false, |_| q.qp().query().map(|a| a.qp_state))
            }));
            let msg = r.err().and_then(|m| m.downcast_ref::<&str>().map(|s| s.to_string()));
            let _ = tx.send(msg);
        });
        let Ok(msg) = rx.recv_timeout(std::time::Duration::from_secs(30)) else {
            // The thread holds the device's lock for ever: leak what would
            // wait for it, so that the test fails instead of hanging.
            std::mem::forget((qp, cq, ctx, dev));
            panic!("a verb called inside a section deadlocked");
        };
        let msg = msg.expect("a panic");
        assert!(msg.contains("inside a device section"), "{msg}");
        assert!(qp.qp().query().is_ok(), "the device is usable after");
        assert_eq!(cq.poll(4).unwrap(), 0);
    }

    /// A soft device's section posts to and polls its own objects, and
    /// refuses another device's with `EINVAL`.
    #[test]
    fn a_soft_section_refuses_another_devices_objects() {
        use crate::ulp::{UlpCq, UlpQp, UlpQpInit};
        use crate::verbs::ErrorKind;
        let devs = crate::soft::embedded_default().unwrap();
        let (c0, c1) = (devs[0].open().unwrap(), devs[1].open().unwrap());
        let cq0 = c0.create_cq(16, 0, None, 0).unwrap();
        let ucq1 = UlpCq::new(&c1, 256).unwrap();
        let uqp1 = UlpQp::create(&c1.alloc_pd().unwrap(), &ucq1, &ucq1, &UlpQpInit::default()).unwrap();
        let (cq1, qp1) = (ucq1.cq(), uqp1.qp());
        let lock0 = SoftLock::of_cq(&**cq0.ops()).unwrap();
        assert!(!SoftLock::alike(Some(&lock0), SoftLock::of_cq(&**cq1.ops()).as_ref()));
        let mut wc = [crate::verbs::WorkCompletion::default(); 4];
        let (own, other_cq, other_qp) = lock0.enter_cq(false, |sec| {
            (
                sec.poll(&**cq0.ops(), &mut wc),
                sec.poll(&**cq1.ops(), &mut wc),
                sec.post_recv(&**qp1.ops(), &[]),
            )
        });
        assert_eq!(own.unwrap(), 0);
        assert_eq!(other_cq.unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(other_qp.unwrap_err().error.kind(), ErrorKind::InvalidArgument);
        // Its own QP, through a section opened on it (in RESET: refused by
        // the QP itself, not for its device).
        let r = SoftLock::of_qp(&**qp1.ops())
            .unwrap()
            .enter_qp(false, |sec| sec.post_recv(&**qp1.ops(), &[]));
        assert!(r.is_ok() || !r.unwrap_err().error.to_string().contains("another device"));
    }
}
