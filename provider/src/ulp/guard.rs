//! Where the layer's per-QP and per-CQ state is guarded: by the device's
//! own lock when the backend offers one ([`DeviceSection`]: the soft
//! provider's engine lock, which every post and poll takes anyway, so the
//! layer adds no lock per operation), else by a mutex of the layer's own
//! (the hardware backend, whose locks are inside libibverbs).

use std::cell::UnsafeCell;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::{Mutex, MutexGuard};

use crate::sys::lock;
use crate::verbs::backend::{CqOps, DeviceLockId, DeviceSection, QpOps};
use crate::verbs::{PostError, RecvWr, Result, SendWr, WorkCompletion};

/// A value guarded by the layer's own mutex or by a device's lock.
pub(crate) struct Guarded<T> {
    guard: Guard,
    cell: UnsafeCell<T>,
}

/// What guards a [`Guarded`] value.
enum Guard {
    /// The layer's own mutex.
    Own(Mutex<()>),
    /// A device's lock: the value is only touched inside a section of it.
    Device(DeviceLockId),
}

// SAFETY: the value is only reached through `with` and `with_held`, which
// hold the guard (the own mutex, or the device's lock inside a section)
// for as long as the reference lives: one thread at a time, so sharing
// the `Guarded` between threads hands out no shared mutable access;
// `T: Send` lets the value be used from whichever thread holds the guard.
unsafe impl<T: Send> Sync for Guarded<T> {}

impl<T> Guarded<T> {
    /// `value`, guarded by the lock of `device` if there is one, else by a
    /// mutex of its own.
    pub(crate) fn new(value: T, device: Option<DeviceLockId>) -> Guarded<T> {
        Guarded {
            guard: device.map_or_else(|| Guard::Own(Mutex::new(())), Guard::Device),
            cell: UnsafeCell::new(value),
        }
    }

    /// The device lock guarding the value, if it is not the own mutex.
    #[inline]
    pub(crate) fn device(&self) -> Option<DeviceLockId> {
        match self.guard {
            Guard::Own(_) => None,
            Guard::Device(d) => Some(d),
        }
    }

    /// Takes the own mutex (`None` when the device lock guards the value).
    #[inline]
    pub(super) fn lock_own(&self) -> Option<MutexGuard<'_, ()>> {
        match &self.guard {
            Guard::Own(m) => Some(lock(m)),
            Guard::Device(_) => None,
        }
    }

    /// Runs `f` on the value holding its guard, with the section to post
    /// and poll through: the own mutex and [`Direct`], or the device's
    /// lock and the section `open` opens (it must be one of that device).
    /// `f` runs exactly once; a backend that offered a device lock and ran
    /// no section makes this panic.
    #[inline(always)]
    pub(crate) fn with<R>(
        &self,
        open: impl FnOnce(&mut dyn FnMut(&mut dyn DeviceSection)) -> bool,
        f: impl FnOnce(&mut T, &mut dyn DeviceSection) -> R,
    ) -> R {
        match self.lock_own() {
            // SAFETY: the own mutex is held for the call; no other
            // reference to the value is taken under it.
            Some(_own) => f(unsafe { self.get() }, &mut Direct),
            None => in_section(open, |sec| {
                // SAFETY: inside a section of the device whose lock guards
                // the value (the caller's `open`); the only reference to
                // it taken in the section.
                f(unsafe { self.get() }, sec)
            }),
        }
    }

    /// Runs `f` on the value from inside a section already open, or under
    /// the own mutex, which it takes.
    ///
    /// # Safety
    ///
    /// If the device's lock guards the value, the caller runs inside a
    /// section of that device and holds no other reference to the value.
    #[inline(always)]
    pub(crate) unsafe fn with_held<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let _own = self.lock_own();
        // SAFETY: the own mutex is held, or (the caller's contract) the
        // device's lock in a section, with no other reference taken.
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

/// Runs `f` inside the section `open` opens (`QpOps::locked`,
/// `CqOps::locked`). `f` runs exactly once, or the backend's broken
/// promise (a device lock it then does not offer) panics.
#[inline(always)]
pub(crate) fn in_section<R>(
    open: impl FnOnce(&mut dyn FnMut(&mut dyn DeviceSection)) -> bool,
    f: impl FnOnce(&mut dyn DeviceSection) -> R,
) -> R {
    let mut once = Once::new(f);
    open(&mut |sec| once.run(sec));
    once.result()
}

/// A closure run at most once through a `&mut dyn FnMut`, and its result:
/// kept without `Option`s, so that nothing is moved or dropped but the
/// result, once (this is on every post and poll).
struct Once<F, R> {
    f: ManuallyDrop<F>,
    r: MaybeUninit<R>,
    ran: bool,
}

impl<F: FnOnce(&mut dyn DeviceSection) -> R, R> Once<F, R> {
    #[inline(always)]
    fn new(f: F) -> Self {
        Once {
            f: ManuallyDrop::new(f),
            r: MaybeUninit::uninit(),
            ran: false,
        }
    }

    #[inline(always)]
    fn run(&mut self, sec: &mut dyn DeviceSection) {
        if !self.ran {
            self.ran = true;
            // SAFETY: `ran` was false: the closure is still there, and is
            // taken this once (`Drop` leaves it alone from now on).
            let f = unsafe { ManuallyDrop::take(&mut self.f) };
            self.r.write(f(sec));
        }
    }

    /// The result.
    ///
    /// # Panics
    ///
    /// If the closure never ran (a backend that offered a device lock and
    /// ran no section).
    #[inline(always)]
    fn result(self) -> R {
        if !self.ran {
            drop(self);
            panic!("the backend offered a device lock and ran no section");
        }
        let this = ManuallyDrop::new(self);
        // SAFETY: `ran` is set before the closure is called, and if the
        // closure panicked the panic went through `run` and no `result` is
        // reached: here it returned and `r` holds its result, read once
        // (`this` is never dropped).
        unsafe { this.r.assume_init_read() }
    }
}

impl<F, R> Drop for Once<F, R> {
    fn drop(&mut self) {
        // Reached on a panic (from the closure or the backend) or when
        // `result` panics: the closure if it never ran; the result is
        // leaked if there is one (it cannot be told from a closure that
        // panicked after `ran` was set).
        if !self.ran {
            // SAFETY: never taken (`ran` is false).
            unsafe { ManuallyDrop::drop(&mut self.f) }
        }
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
    use super::super::cb::tests::Probe;
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// The closure runs once however often the section calls back; its
    /// captures are dropped once, whether it ran or not.
    #[test]
    fn a_section_closure_runs_once_and_its_captures_drop_once() {
        let (calls, drops) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let probe = Probe(drops.clone());
        let c = calls.clone();
        let mut once = Once::new(move |_: &mut dyn DeviceSection| {
            let _keep = &probe;
            c.fetch_add(1, Ordering::SeqCst) + 7
        });
        once.run(&mut Direct);
        once.run(&mut Direct);
        assert_eq!(once.result(), 7);
        assert_eq!((calls.load(Ordering::SeqCst), drops.load(Ordering::SeqCst)), (1, 1));

        let probe = Probe(drops.clone());
        let once = Once::new(move |_: &mut dyn DeviceSection| drop(probe));
        drop(once);
        assert_eq!(drops.load(Ordering::SeqCst), 2, "dropped uncalled");

        let probe = Probe(drops.clone());
        let once = Once::new(move |_: &mut dyn DeviceSection| drop(probe));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| once.result()));
        assert!(r.is_err(), "no section ran: a panic, not a read of nothing");
        assert_eq!(drops.load(Ordering::SeqCst), 3, "dropped uncalled");
    }

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
                in_section(|g| q.qp().ops().locked(g), |_| q.qp().query().map(|a| a.qp_state))
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
        assert_ne!(cq0.ops().device_lock(), cq1.ops().device_lock());
        let mut wc = [crate::verbs::WorkCompletion::default(); 4];
        let (own, other_cq, other_qp) = in_section(
            |g| cq0.ops().locked(false, g),
            |sec| {
                (
                    sec.poll(&**cq0.ops(), &mut wc),
                    sec.poll(&**cq1.ops(), &mut wc),
                    sec.post_recv(&**qp1.ops(), &[]),
                )
            },
        );
        assert_eq!(own.unwrap(), 0);
        assert_eq!(other_cq.unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(other_qp.unwrap_err().error.kind(), ErrorKind::InvalidArgument);
        // Its own QP, through a section opened on it (in RESET: refused by
        // the QP itself, not for its device).
        let r = in_section(|g| qp1.ops().locked(g), |sec| sec.post_recv(&**qp1.ops(), &[]));
        assert!(r.is_ok() || !r.unwrap_err().error.to_string().contains("another device"));
    }
}
