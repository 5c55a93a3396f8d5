//! Freeing each ibverbs object exactly once, never while a call uses it.
//!
//! Backend objects are shared (`Arc<dyn QpOps>` may be cloned by anyone),
//! so a QP can be destroyed on one thread while another posts to it. C
//! leaves that undefined; here every call that dereferences the ibverbs
//! pointer first *enters* the object's [`Lifecycle`], and `destroy` waits
//! until nobody is inside, frees the object, and makes later entries fail.
//!
//! Why not a `RwLock`: the fast path enters several objects at once (every
//! address handle of a UD batch, which may repeat), and a reader that
//! re-enters a writer-preferring lock deadlocks as soon as a writer queues.
//! A [`Lifecycle`] admits re-entry: `destroy` can only start when the count
//! of users is zero, so no user ever waits for a destroy it is blocking.
//! Entering costs one compare-and-swap, leaving one atomic subtraction,
//! like an uncontended `RwLock`. A destroy in progress makes new users
//! wait (yielding) for the length of one ibverbs destroy call.

use std::sync::atomic::{AtomicU32, Ordering};

use super::ffi::SendPtr;
use crate::verbs::{Error, ErrorKind, Result, Verb};

/// The object was freed.
const DESTROYED: u32 = 1 << 31;
/// A destroy call is running (only entered with zero users).
const DESTROYING: u32 = 1 << 30;
/// Number of calls inside the object.
const USERS: u32 = DESTROYING - 1;

/// Users-and-state word of one ibverbs object.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    state: AtomicU32,
}

impl Lifecycle {
    /// A live object with no users.
    pub(crate) const fn new() -> Self {
        Lifecycle {
            state: AtomicU32::new(0),
        }
    }

    /// Registers a user. `false` once the object is destroyed; waits while
    /// a destroy is running (it may fail with `EBUSY` and leave the object
    /// live). Every `true` must be paired with one [`Lifecycle::exit`].
    pub(crate) fn enter(&self) -> bool {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            if s & DESTROYED != 0 {
                return false;
            }
            if s & DESTROYING != 0 {
                std::thread::yield_now();
                s = self.state.load(Ordering::Relaxed);
                continue;
            }
            assert!(s & USERS != USERS, "2^30 concurrent calls into one ibverbs object");
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Unregisters a user registered by [`Lifecycle::enter`].
    pub(crate) fn exit(&self) {
        let prev = self.state.fetch_sub(1, Ordering::Release);
        debug_assert!(prev & USERS != 0, "exit without enter");
    }

    /// Runs `free` (returning 0 or an errno) once no user is inside, unless
    /// the object is already destroyed (then `Ok` without calling it). On
    /// success the object is destroyed for good; on failure it stays live.
    pub(crate) fn destroy(&self, free: impl FnOnce() -> i32) -> std::result::Result<(), i32> {
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & DESTROYED != 0 {
                return Ok(());
            }
            if s == 0
                && self
                    .state
                    .compare_exchange_weak(0, DESTROYING, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            std::thread::yield_now();
        }
        let rc = free();
        if rc == 0 {
            self.state.store(DESTROYED, Ordering::Release);
            Ok(())
        } else {
            self.state.store(0, Ordering::Release);
            Err(rc)
        }
    }

    /// Whether the object was destroyed.
    pub(crate) fn is_destroyed(&self) -> bool {
        self.state.load(Ordering::Acquire) & DESTROYED != 0
    }
}

/// An ibverbs object pointer and its [`Lifecycle`].
pub(crate) struct IbvObject<T> {
    ptr: SendPtr<T>,
    life: Lifecycle,
    what: &'static str,
}

impl<T> IbvObject<T> {
    /// Takes charge of a live ibverbs object. `what` names it in errors
    /// ("QP", "CQ", …).
    ///
    /// # Safety
    ///
    /// `ptr` must be a live object that nothing else frees: only
    /// [`IbvObject::destroy`] may free it.
    pub(crate) unsafe fn new(ptr: SendPtr<T>, what: &'static str) -> Self {
        IbvObject {
            ptr,
            life: Lifecycle::new(),
            what,
        }
    }

    /// Enters the object for a call of `verb`: the pointer stays valid
    /// while the returned guard lives.
    ///
    /// # Errors
    ///
    /// `EINVAL` once the object was destroyed.
    #[inline]
    pub(crate) fn enter(&self, verb: Verb) -> Result<Entered<'_, T>> {
        if self.life.enter() {
            Ok(Entered { obj: self })
        } else {
            Err(self.destroyed_error(verb))
        }
    }

    /// The error for a call after destroy.
    pub(crate) fn destroyed_error(&self, verb: Verb) -> Error {
        Error::new(
            verb,
            ErrorKind::InvalidArgument,
            format!("the {} was already destroyed", self.what),
        )
    }

    /// The object's lifecycle (to enter it for longer than one scope, as
    /// the post path does for address handles and windows).
    pub(crate) fn lifecycle(&self) -> &Lifecycle {
        &self.life
    }

    /// The raw pointer, for use only while the lifecycle is entered.
    pub(crate) fn raw(&self) -> *mut T {
        self.ptr.get()
    }

    /// Frees the object with `free` (the ibverbs destroy call, returning 0
    /// or an errno) unless that already succeeded.
    pub(crate) fn destroy(&self, free: impl FnOnce(*mut T) -> i32) -> std::result::Result<(), i32> {
        let ptr = self.ptr.get();
        self.life.destroy(|| free(ptr))
    }

    /// Whether the object was destroyed.
    pub(crate) fn is_destroyed(&self) -> bool {
        self.life.is_destroyed()
    }
}

/// A call inside an [`IbvObject`]: its pointer is valid while this lives.
pub(crate) struct Entered<'a, T> {
    obj: &'a IbvObject<T>,
}

impl<T> Entered<'_, T> {
    /// The live ibverbs pointer.
    #[inline]
    pub(crate) fn ptr(&self) -> *mut T {
        self.obj.ptr.get()
    }
}

impl<T> Drop for Entered<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.obj.life.exit();
    }
}

/// Up to `N` lifecycles entered for the duration of one post call (the
/// address handles, windows and MRs a batch of work requests names).
pub(crate) struct HeldSet<'a, const N: usize> {
    held: [Option<&'a Lifecycle>; N],
    len: usize,
}

impl<'a, const N: usize> HeldSet<'a, N> {
    /// Holds nothing.
    pub(crate) fn new() -> Self {
        HeldSet {
            held: [None; N],
            len: 0,
        }
    }

    /// Room left.
    pub(crate) fn room(&self) -> usize {
        N - self.len
    }

    /// Enters `life` and keeps it entered until [`HeldSet::release`] or
    /// drop. `false` if it was destroyed or the set is full.
    pub(crate) fn hold(&mut self, life: &'a Lifecycle) -> bool {
        if self.len == N || !life.enter() {
            return false;
        }
        self.held[self.len] = Some(life);
        self.len += 1;
        true
    }

    /// Exits everything held.
    pub(crate) fn release(&mut self) {
        for slot in &mut self.held[..self.len] {
            if let Some(life) = slot.take() {
                life.exit();
            }
        }
        self.len = 0;
    }
}

impl<const N: usize> Drop for HeldSet<'_, N> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn destroy_is_once_and_idempotent() {
        let l = Lifecycle::new();
        let calls = AtomicUsize::new(0);
        assert_eq!(
            l.destroy(|| {
                calls.fetch_add(1, Ordering::Relaxed);
                libc::EBUSY
            }),
            Err(libc::EBUSY)
        );
        assert!(!l.is_destroyed());
        assert!(l.enter(), "a failed destroy leaves the object usable");
        l.exit();
        assert_eq!(
            l.destroy(|| {
                calls.fetch_add(1, Ordering::Relaxed);
                0
            }),
            Ok(())
        );
        assert!(l.is_destroyed());
        assert_eq!(l.destroy(|| unreachable!("freed twice")), Ok(()));
        assert!(!l.enter());
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn reentry_and_held_sets() {
        let a = Lifecycle::new();
        let b = Lifecycle::new();
        let mut set = HeldSet::<3>::new();
        assert!(set.hold(&a));
        assert!(set.hold(&a), "the same object twice, as a UD batch does");
        assert!(set.hold(&b));
        assert_eq!(set.room(), 0);
        assert!(!set.hold(&b), "full");
        assert_eq!(a.state.load(Ordering::Relaxed), 2);
        drop(set);
        assert_eq!(a.state.load(Ordering::Relaxed), 0);
        assert_eq!(b.destroy(|| 0), Ok(()));
        let mut set = HeldSet::<2>::new();
        assert!(!set.hold(&b), "destroyed");
        assert_eq!(set.room(), 2);
    }

    #[test]
    fn destroy_waits_for_users_and_new_users_see_it() {
        let l = Arc::new(Lifecycle::new());
        assert!(l.enter());
        let freed = Arc::new(AtomicUsize::new(0));
        let t = {
            let (l, freed) = (l.clone(), freed.clone());
            std::thread::spawn(move || {
                l.destroy(|| {
                    freed.store(1, Ordering::SeqCst);
                    0
                })
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(freed.load(Ordering::SeqCst), 0, "destroy ran while a user was inside");
        l.exit();
        assert_eq!(t.join().unwrap(), Ok(()));
        assert_eq!(freed.load(Ordering::SeqCst), 1);
        assert!(!l.enter());
    }

    #[test]
    fn entered_guard_and_errors() {
        let mut x = 5u32;
        // SAFETY: a stack value standing in for an ibverbs object; the test
        // never frees it through the pointer.
        let obj = unsafe { IbvObject::new(SendPtr::new(&mut x).unwrap(), "thing") };
        {
            let g = obj.enter(Verb::PollCq).unwrap();
            assert_eq!(g.ptr(), obj.raw());
        }
        assert_eq!(obj.destroy(|_| 0), Ok(()));
        let e = obj.enter(Verb::PollCq).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.detail().contains("thing"));
        assert!(obj.is_destroyed());
    }
}
