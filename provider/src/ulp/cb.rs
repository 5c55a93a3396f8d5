//! Completion callbacks kept inline: a closure of up to [`INLINE_WORDS`]
//! machine words (an `Arc` or two, a `Box<dyn FnOnce>`, a few integers) is
//! stored in the request's slot itself, so posting a request allocates
//! nothing for its callback; a larger one is boxed, once.

use std::mem::{align_of, size_of, ManuallyDrop, MaybeUninit};

use super::wr::Callback;
use crate::verbs::WorkCompletion;

/// Words of closure state stored without an allocation.
pub(crate) const INLINE_WORDS: usize = 4;

type Storage = [MaybeUninit<usize>; INLINE_WORDS];

/// Calls (`Some`) or drops (`None`) the closure stored at the pointer,
/// consuming it either way.
type Op = unsafe fn(*mut Storage, Option<&WorkCompletion>);

/// A `FnOnce(&WorkCompletion) + Send + 'static`, stored inline when it is
/// small enough. Called at most once; dropped uncalled otherwise.
pub(crate) struct Cb {
    data: Storage,
    op: Op,
}

// SAFETY: a `Cb` is only built (`Cb::new`) from a closure that is `Send`,
// and it owns that closure (or the box holding it) exclusively.
unsafe impl Send for Cb {}

/// # Safety
///
/// `p` holds a live `F` written by `Cb::new`, never read since.
unsafe fn op_inline<F: FnOnce(&WorkCompletion)>(p: *mut Storage, wc: Option<&WorkCompletion>) {
    // SAFETY: per the contract, `p` holds a live, suitably aligned `F`
    // (checked at construction) that is moved out exactly once, here.
    let f = unsafe { p.cast::<F>().read() };
    match wc {
        Some(wc) => f(wc),
        None => drop(f),
    }
}

/// # Safety
///
/// `p` holds a live `Box<F>` written by `Cb::new`, never read since.
unsafe fn op_boxed<F: FnOnce(&WorkCompletion)>(p: *mut Storage, wc: Option<&WorkCompletion>) {
    // SAFETY: per the contract, `p` holds a live `Box<F>` (one word,
    // always fits and is aligned), moved out exactly once, here.
    let f = unsafe { p.cast::<Box<F>>().read() };
    match wc {
        Some(wc) => f(wc),
        None => drop(f),
    }
}

/// Whether a closure of type `F` is stored inline (it fits the storage
/// in size and alignment) rather than boxed.
const fn fits_inline<F>() -> bool {
    size_of::<F>() <= size_of::<Storage>() && align_of::<F>() <= align_of::<Storage>()
}

impl Cb {
    /// Stores `f` inline if it fits, else in a box.
    #[inline]
    pub(crate) fn new<F: FnOnce(&WorkCompletion) + Send + 'static>(f: F) -> Cb {
        let mut data: Storage = [MaybeUninit::uninit(); INLINE_WORDS];
        let p = data.as_mut_ptr().cast::<u8>();
        if fits_inline::<F>() {
            // SAFETY: `F` fits the storage in size and alignment (checked
            // just above); `op_inline::<F>` reads it back exactly once.
            unsafe { p.cast::<F>().write(f) };
            Cb {
                data,
                op: op_inline::<F>,
            }
        } else {
            // SAFETY: a `Box` is one word: it fits and is aligned;
            // `op_boxed::<F>` reads it back exactly once.
            unsafe { p.cast::<Box<F>>().write(Box::new(f)) };
            Cb {
                data,
                op: op_boxed::<F>,
            }
        }
    }

    /// Calls the closure with `wc`.
    #[inline]
    pub(crate) fn call(self, wc: &WorkCompletion) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `op` matches what `new` stored; `this` is never dropped,
        // so the closure is consumed exactly once, by this call.
        unsafe { (this.op)(&mut this.data, Some(wc)) }
    }

    /// Calls the closure with `wc` where it lies, without moving it
    /// first (the lone completion's path: one copy less per callback).
    ///
    /// # Safety
    ///
    /// The closure is consumed, also if it panics: the caller must never
    /// call, drop or otherwise use this `Cb` again (keep it in a
    /// [`ManuallyDrop`] and forget it).
    #[inline]
    pub(crate) unsafe fn call_in_place(&mut self, wc: &WorkCompletion) {
        // SAFETY: `op` matches what `new` stored and the closure is still
        // there (the caller's contract: never consumed before); the
        // caller never uses it again.
        unsafe { (self.op)(&mut self.data, Some(wc)) }
    }

    /// The closure as a boxed [`Callback`] (what a failed post hands
    /// back to the caller).
    pub(crate) fn into_boxed(self) -> Callback {
        Box::new(move |wc: &WorkCompletion| self.call(wc))
    }
}

impl Drop for Cb {
    fn drop(&mut self) {
        // SAFETY: `op` matches what `new` stored, and the closure is still
        // there: `call` consumes `self` without running this drop.
        unsafe { (self.op)(&mut self.data, None) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// Counts its drops (the layer's unit tests share it).
    pub(crate) struct Probe(pub(crate) Arc<AtomicU32>);
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Runs closures built by `make` (from a drop probe and a call
    /// counter) called, dropped, and through a box: each runs once or
    /// not at all, and its captures are dropped once. Returns whether the
    /// closure was stored inline. (Told by the rule `new` follows, not by
    /// comparing `op` with `op_inline::<F>`: function pointers of one
    /// function need not be equal, and under Miri they are not.)
    fn check<F: FnOnce(&WorkCompletion) + Send + 'static>(make: impl Fn(Probe, Arc<AtomicU32>) -> F) -> bool {
        let calls = Arc::new(AtomicU32::new(0));
        let drops = Arc::new(AtomicU32::new(0));
        let mk = || make(Probe(drops.clone()), calls.clone());
        let counts = || (calls.load(Ordering::SeqCst), drops.load(Ordering::SeqCst));
        let wc = WorkCompletion {
            byte_len: 5,
            ..WorkCompletion::default()
        };
        Cb::new(mk()).call(&wc);
        assert_eq!(counts(), (5, 1));
        drop(Cb::new(mk()));
        assert_eq!(counts(), (5, 2));
        Cb::new(mk()).into_boxed()(&wc);
        drop(Cb::new(mk()).into_boxed());
        assert_eq!(counts(), (10, 4));
        fits_inline::<F>()
    }

    #[test]
    fn a_small_closure_is_stored_inline_and_called_or_dropped_once() {
        let make = |p: Probe, c: Arc<AtomicU32>| {
            move |wc: &WorkCompletion| {
                let _keep = &p;
                c.fetch_add(wc.byte_len, Ordering::SeqCst);
            }
        };
        let f = make(Probe(Arc::default()), Arc::default());
        assert!(size_of_val(&f) <= size_of::<Storage>());
        assert!(check(make));
    }

    #[test]
    fn a_large_closure_is_boxed_and_called_or_dropped_once() {
        let make = |p: Probe, c: Arc<AtomicU32>| {
            let pad = [7u64; 8];
            move |wc: &WorkCompletion| {
                let _keep = &p;
                assert_eq!(pad.iter().sum::<u64>(), 56);
                c.fetch_add(wc.byte_len, Ordering::SeqCst);
            }
        };
        assert!(size_of_val(&make(Probe(Arc::default()), Arc::default())) > size_of::<Storage>());
        assert!(!check(make));
    }

    #[test]
    fn an_overaligned_closure_is_boxed() {
        #[repr(align(64))]
        #[derive(Clone, Copy)]
        struct A(u8);
        let a = A(3);
        let hit = Arc::new(AtomicU32::new(0));
        let h = hit.clone();
        Cb::new(move |_: &WorkCompletion| {
            assert_eq!(std::ptr::addr_of!(a) as usize % 64, 0);
            h.fetch_add(u32::from(a.0), Ordering::SeqCst);
        })
        .call(&WorkCompletion::default());
        assert_eq!(hit.load(Ordering::SeqCst), 3);
    }
}
