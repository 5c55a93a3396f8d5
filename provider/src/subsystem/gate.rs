//! The per-call guard of hotplug safety, and the fast-path handles that use
//! it.
//!
//! A [`RemovalGate`] is a read-side critical section in the style of the
//! kernel's SRCU (which uverbs enters on every command so that disassociation
//! can wait for commands in flight): a call *enters* the gate, runs, and
//! leaves; removal *closes* the gate and *synchronizes* — waits until no
//! call is inside — before it makes a consumer's objects inert. After that,
//! guarded calls fail with `ENODEV` without touching the backend.
//!
//! Cost: entering is a plain increment of the calling thread's own counter
//! (its own cache line: threads posting to the same device do not bounce a
//! shared reference count, and no locked instruction is needed because only
//! the owner writes it) and one load of the read-mostly `closed` flag;
//! leaving is a plain decrement. The ordering a locked instruction would
//! give is paid once, by the closer, with an asymmetric fence (Linux
//! `membarrier`, as user-space RCU does). The `guard_cost` benchmark of the
//! emulator crate measures it on a post_send + poll_cq loop.
//!
//! The soft provider does not need the gate for memory safety (its engine
//! lock and the QP error state already make posting after removal complete
//! with a flush); the gate is what makes a straggler's handles inert for
//! every backend, and what a backend whose objects die with the device
//! (hardware) needs before it frees them.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::verbs::{Cq, Error, ErrorKind, PostError, Qp, RecvWr, Result, SendWr, Verb, WorkCompletion};

/// Slots per chunk, and chunks per gate: up to 4096 threads alive at once
/// get a slot of their own; more share one counter (correct, slower).
const CHUNK: usize = 64;
const CHUNKS: usize = 64;

/// One thread's count of calls inside a gate, on its own cache line
/// (128 bytes: adjacent-line prefetch). Written only by its owner thread.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Slot(AtomicUsize);

/// Thread indexes: each live thread owns one; an exiting thread gives it
/// back (its slots are all zero by then: guards cannot leave their thread).
struct ThreadIndex(usize);

fn free_indexes() -> &'static Mutex<(usize, Vec<usize>)> {
    static FREE: OnceLock<Mutex<(usize, Vec<usize>)>> = OnceLock::new();
    FREE.get_or_init(|| Mutex::new((0, Vec::new())))
}

impl ThreadIndex {
    fn take() -> ThreadIndex {
        let mut f = free_indexes().lock().unwrap_or_else(|p| p.into_inner());
        match f.1.pop() {
            Some(i) => ThreadIndex(i),
            None => {
                f.0 += 1;
                ThreadIndex(f.0 - 1)
            }
        }
    }
}

impl Drop for ThreadIndex {
    fn drop(&mut self) {
        // Anything this thread enters from now on (other thread-locals'
        // destructors) uses the shared counter: the index may be reused.
        let _ = MY_INDEX.try_with(|c| c.set(usize::MAX));
        free_indexes().lock().unwrap_or_else(|p| p.into_inner()).1.push(self.0);
    }
}

thread_local! {
    static MY_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    static MY_INDEX_OWNER: ThreadIndex = ThreadIndex::take();
}

/// This thread's index, or `None` while the thread is exiting.
#[inline]
fn my_index() -> Option<usize> {
    let i = MY_INDEX.try_with(Cell::get).ok()?;
    if i != usize::MAX {
        return Some(i);
    }
    let i = MY_INDEX_OWNER.try_with(|o| o.0).ok()?;
    let _ = MY_INDEX.try_with(|c| c.set(i));
    Some(i)
}

/// Whether this process may use `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
/// (registered on first use). With it, the fast path needs no fence; without
/// it, a full fence per entry.
fn membarrier_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;
            // SAFETY: membarrier takes two integers and touches no memory
            // of ours; failure (old kernel, seccomp) is a negative return.
            let r = unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0) };
            r == 0
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    })
}

/// The heavy side of the asymmetric fence: every thread of the process
/// executes a full memory barrier before this returns.
fn heavy_fence(expedited: bool) {
    fence(Ordering::SeqCst);
    #[cfg(target_os = "linux")]
    if expedited {
        const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
        // SAFETY: as in `membarrier_ready`; the process registered for
        // this command before any gate was created.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0) };
        assert_eq!(r, 0, "membarrier(PRIVATE_EXPEDITED) failed after registration");
    }
}

/// A gate calls enter while the device is usable; removal closes it and
/// waits for the calls inside to leave.
///
/// Each thread counts its calls in a slot of its own (no shared reference
/// count, no locked instruction on the fast path). Closing is the
/// expensive side: an asymmetric fence (Linux `membarrier`) makes every
/// thread's count visible, so an entering call either sees the gate closed
/// or is seen inside by [`RemovalGate::synchronize`]. Where `membarrier` is
/// unavailable, entering pays a full fence instead.
///
/// # Examples
///
/// ```
/// use softverbs::subsystem::RemovalGate;
/// use std::time::Duration;
/// let gate = RemovalGate::new();
/// {
///     let _inside = gate.enter().expect("open");
///     gate.close();
///     // A call already inside finishes; synchronize would wait for it.
///     assert!(!gate.synchronize(Duration::ZERO));
/// }
/// assert!(gate.synchronize(Duration::ZERO));
/// assert!(gate.enter().is_none());
/// ```
#[derive(Debug)]
pub struct RemovalGate {
    closed: AtomicBool,
    /// `membarrier` is registered: entering needs only a compiler fence.
    expedited: bool,
    chunks: [OnceLock<Box<[Slot; CHUNK]>>; CHUNKS],
    /// Threads beyond `CHUNK * CHUNKS` (or exiting) share this counter.
    shared: AtomicUsize,
}

impl Default for RemovalGate {
    fn default() -> Self {
        RemovalGate::new()
    }
}

/// Proof of being inside a [`RemovalGate`]; leaving is dropping it. Not
/// `Send`: a call leaves on the thread it entered on.
#[derive(Debug)]
#[must_use = "the call is inside the gate only while the guard lives"]
pub struct GateGuard<'a> {
    slot: &'a AtomicUsize,
    owned: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for GateGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.owned {
            // Only this thread writes its slot: a plain decrement.
            let n = self.slot.load(Ordering::Relaxed);
            self.slot.store(n - 1, Ordering::Release);
        } else {
            self.slot.fetch_sub(1, Ordering::Release);
        }
    }
}

impl RemovalGate {
    /// An open gate.
    pub fn new() -> RemovalGate {
        RemovalGate {
            closed: AtomicBool::new(false),
            expedited: membarrier_ready(),
            chunks: std::array::from_fn(|_| OnceLock::new()),
            shared: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn my_slot(&self) -> Option<&AtomicUsize> {
        let i = my_index()?;
        let chunk = self.chunks.get(i / CHUNK)?;
        let chunk = chunk.get_or_init(|| Box::new(std::array::from_fn(|_| Slot::default())));
        Some(&chunk[i % CHUNK].0)
    }

    /// Enters the gate: `None` once it is closed.
    #[inline]
    pub fn enter(&self) -> Option<GateGuard<'_>> {
        let (slot, owned) = match self.my_slot() {
            Some(s) => {
                let n = s.load(Ordering::Relaxed);
                s.store(n + 1, Ordering::Relaxed);
                (s, true)
            }
            None => {
                self.shared.fetch_add(1, Ordering::SeqCst);
                (&self.shared, false)
            }
        };
        // Dekker with `close`: our count is published before we read the
        // flag. The closer's heavy fence (membarrier) stands in for the
        // full fence this side would otherwise need.
        if self.expedited {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        let guard = GateGuard {
            slot,
            owned,
            _not_send: std::marker::PhantomData,
        };
        if self.closed.load(Ordering::Relaxed) {
            drop(guard);
            return None;
        }
        Some(guard)
    }

    /// Closes the gate: every later [`RemovalGate::enter`] fails.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        heavy_fence(self.expedited);
    }

    /// Whether entering needs no fence (the closer uses Linux `membarrier`);
    /// `false` where `membarrier` is unavailable (entering then pays a full
    /// fence).
    pub fn is_expedited(&self) -> bool {
        self.expedited
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Opens a closed gate again. Whatever the closer changed before this
    /// is visible to a call that enters after it, if that call issues an
    /// acquire fence once inside (as [`Gated::with`] does).
    pub fn reopen(&self) {
        self.closed.store(false, Ordering::Release);
    }

    /// Calls inside the gate now.
    pub fn inside(&self) -> usize {
        let owned: usize = self
            .chunks
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|c| c.iter())
            .map(|s| s.0.load(Ordering::Acquire))
            .sum();
        owned + self.shared.load(Ordering::Acquire)
    }

    /// Waits until no call is inside, up to `timeout`; `true` if none is.
    /// Call after [`RemovalGate::close`] (otherwise new calls keep entering).
    pub fn synchronize(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if self.inside() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// A value that calls use inside a [`RemovalGate`] and that one owner
/// takes away once no call is inside: the read side is the gate's (a
/// plain increment and decrement of the calling thread's own counter, no
/// lock), and [`Gated::take`] closes the gate, waits for the calls inside
/// to leave, and moves the value out; [`Gated::put`] may put a new one
/// in and open the gate again. A hotplug-safe handle keeps its
/// verbs objects in one, so that its fast path takes no lock and its
/// removal path can still release the objects while other threads call.
///
/// # Examples
///
/// ```
/// use softverbs::subsystem::Gated;
/// use std::time::Duration;
/// let g = Gated::new(vec![1, 2, 3]);
/// assert_eq!(g.with(|v| v.len()), Some(3));
/// assert_eq!(g.take(Duration::from_secs(1)), Some(vec![1, 2, 3]));
/// assert_eq!(g.with(|v| v.len()), None);
/// assert_eq!(g.take(Duration::ZERO), None);
/// ```
pub struct Gated<T> {
    gate: RemovalGate,
    /// Serializes takers; `true` once the value was taken.
    taken: Mutex<bool>,
    value: std::cell::UnsafeCell<Option<T>>,
}

// SAFETY: `with` hands out `&T` to any thread (so `T: Sync`), and `take`
// and `put` move values between threads (so `T: Send`). The value is only
// written by `take` and `put`, while the gate is closed and no call is
// inside it, and no call can enter a closed gate; see `with`, `take` and
// `put`.
unsafe impl<T: Send + Sync> Sync for Gated<T> {}

impl<T> std::fmt::Debug for Gated<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gated").field("closed", &self.gate.is_closed()).finish()
    }
}

impl<T> Gated<T> {
    /// Holds `value` behind an open gate.
    pub fn new(value: T) -> Gated<T> {
        Gated {
            gate: RemovalGate::new(),
            taken: Mutex::new(false),
            value: std::cell::UnsafeCell::new(Some(value)),
        }
    }

    /// Runs `f` on the value from inside the gate; `None` once the value
    /// is being taken or was taken. `f` must not call [`Gated::take`] on
    /// the same cell (the take would wait for `f` itself and give up).
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let _inside = self.gate.enter()?;
        // Pairs with the release of `put`'s reopening: a value put back is
        // seen whole (free on x86).
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: we are inside the open gate. `take` writes the cell only
        // after closing the gate and seeing no call inside it; the gate's
        // Dekker protocol (our count published before we read `closed`,
        // the closer's heavy fence before it counts) means either this
        // entry saw the gate closed and returned above, or `take` sees us
        // inside and waits until the guard is dropped at the end of this
        // function. So no write overlaps this shared read.
        let value = unsafe { &*self.value.get() };
        value.as_ref().map(f)
    }

    /// Closes the gate, waits up to `timeout` for the calls inside to
    /// leave, and moves the value out. `None` if it was taken before, or
    /// if calls were still inside at the timeout (the gate stays closed,
    /// the value stays; a later `take` may succeed).
    pub fn take(&self, timeout: Duration) -> Option<T> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if *taken {
            return None;
        }
        self.gate.close();
        if !self.gate.synchronize(timeout) {
            return None;
        }
        *taken = true;
        // SAFETY: the gate is closed and no call is inside it, so no `with`
        // holds a reference and none can start; takers are serialized by
        // `taken`, which we hold. This is the only access.
        unsafe { (*self.value.get()).take() }
    }

    /// Puts a value back after [`Gated::take`] and opens the gate again;
    /// gives `value` back if the cell is not empty.
    ///
    /// # Errors
    ///
    /// `Err(value)` if no value was taken.
    pub fn put(&self, value: T) -> std::result::Result<(), T> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if !*taken {
            return Err(value);
        }
        // SAFETY: a taken value means the gate was closed and seen empty,
        // and a closed gate admits no call, so no `with` holds a reference;
        // takers and putters are serialized by `taken`, which we hold.
        unsafe { *self.value.get() = Some(value) };
        *taken = false;
        self.gate.reopen();
        Ok(())
    }

    /// Whether the value was taken or is being taken.
    pub fn is_closed(&self) -> bool {
        self.gate.is_closed()
    }

    /// The value, through exclusive access (no gate needed).
    pub fn get_mut(&mut self) -> Option<&mut T> {
        self.value.get_mut().as_mut()
    }
}

fn gone(verb: Verb) -> Error {
    Error::new(
        verb,
        ErrorKind::NoDevice,
        "the device was removed and this consumer's objects were made inert",
    )
}

/// A queue pair whose fast-path calls pass its device's [`RemovalGate`]:
/// after removal made the consumer's objects inert, posting fails with
/// `ENODEV` instead of reaching the backend.
///
/// Get one from [`DeviceRef::guard_qp`](super::DeviceRef::guard_qp).
#[derive(Debug)]
pub struct GuardedQp {
    qp: Qp,
    gate: Arc<RemovalGate>,
}

impl GuardedQp {
    /// Wraps `qp` behind `gate`.
    pub fn new(qp: Qp, gate: Arc<RemovalGate>) -> GuardedQp {
        GuardedQp { qp, gate }
    }

    /// `ibv_post_send` through the gate.
    ///
    /// # Errors
    ///
    /// As [`Qp::post_send`]; `ENODEV` for the first WR once the consumer's
    /// objects were made inert.
    #[inline]
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let Some(_inside) = self.gate.enter() else {
            return Err(PostError {
                index: 0,
                error: gone(Verb::PostSend),
            });
        };
        self.qp.post_send(wrs)
    }

    /// `ibv_post_recv` through the gate.
    ///
    /// # Errors
    ///
    /// As [`GuardedQp::post_send`].
    #[inline]
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let Some(_inside) = self.gate.enter() else {
            return Err(PostError {
                index: 0,
                error: gone(Verb::PostRecv),
            });
        };
        self.qp.post_recv(wrs)
    }

    /// The queue pair, for control verbs (which the backend guards itself).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// Unwraps the queue pair.
    pub fn into_inner(self) -> Qp {
        self.qp
    }
}

/// A completion queue whose `poll` passes its device's [`RemovalGate`].
///
/// Get one from [`DeviceRef::guard_cq`](super::DeviceRef::guard_cq).
#[derive(Debug)]
pub struct GuardedCq {
    cq: Cq,
    gate: Arc<RemovalGate>,
}

impl GuardedCq {
    /// Wraps `cq` behind `gate`.
    pub fn new(cq: Cq, gate: Arc<RemovalGate>) -> GuardedCq {
        GuardedCq { cq, gate }
    }

    /// `ibv_poll_cq` through the gate.
    ///
    /// # Errors
    ///
    /// As [`Cq::poll`]; `ENODEV` once the consumer's objects were made inert.
    #[inline]
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let Some(_inside) = self.gate.enter() else {
            return Err(gone(Verb::PollCq));
        };
        self.cq.poll(wc)
    }

    /// The completion queue, for control verbs.
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// Unwraps the completion queue.
    pub fn into_inner(self) -> Cq {
        self.cq
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use super::RemovalGate;

    #[test]
    fn gated_take_waits_for_readers_and_refuses_new_ones() {
        use super::Gated;
        let g = Arc::new(Gated::new(String::from("objects")));
        let reading = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let reader = {
            let (g, reading, release) = (g.clone(), reading.clone(), release.clone());
            std::thread::spawn(move || {
                g.with(|s| {
                    reading.wait();
                    release.wait();
                    s.len()
                })
            })
        };
        reading.wait();
        // A reader is inside: the take gives up, and the value stays.
        assert_eq!(g.take(Duration::from_millis(20)), None);
        assert!(g.is_closed());
        release.wait();
        assert_eq!(reader.join().unwrap(), Some(7));
        // The gate stayed closed: no new reader, and now the take succeeds.
        assert_eq!(g.with(|s| s.len()), None);
        assert_eq!(g.take(Duration::from_secs(10)).as_deref(), Some("objects"));
        assert_eq!(g.take(Duration::from_secs(10)), None);
        // Put back: readers see the new value, and it can be taken again.
        g.put(String::from("new")).unwrap();
        assert_eq!(g.put(String::from("twice")), Err(String::from("twice")));
        assert_eq!(g.with(|s| s.clone()).as_deref(), Some("new"));
        assert_eq!(g.take(Duration::from_secs(10)).as_deref(), Some("new"));
    }

    #[test]
    fn nested_and_out_of_order_guards_count_right() {
        let g = RemovalGate::new();
        let a = g.enter().unwrap();
        let b = g.enter().unwrap();
        assert_eq!(g.inside(), 2);
        drop(a);
        assert_eq!(g.inside(), 1);
        drop(b);
        assert_eq!(g.inside(), 0);
        g.close();
        assert!(g.enter().is_none());
        assert_eq!(g.inside(), 0);
    }

    /// Threads hammer the gate while it closes: once `synchronize` says
    /// nobody is inside, nobody ever is again.
    #[test]
    fn nobody_is_inside_after_synchronize() {
        for _ in 0..10 {
            let gate = Arc::new(RemovalGate::new());
            let inside = Arc::new(AtomicUsize::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let start = Arc::new(Barrier::new(4));
            let workers: Vec<_> = (0..3)
                .map(|_| {
                    let (gate, inside, done, start) = (gate.clone(), inside.clone(), done.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let mut refused = 0u64;
                        while !done.load(Ordering::Relaxed) {
                            match gate.enter() {
                                Some(_g) => {
                                    inside.fetch_add(1, Ordering::SeqCst);
                                    std::hint::spin_loop();
                                    inside.fetch_sub(1, Ordering::SeqCst);
                                }
                                None => refused += 1,
                            }
                        }
                        refused
                    })
                })
                .collect();
            start.wait();
            std::thread::yield_now();
            gate.close();
            assert!(gate.synchronize(Duration::from_secs(10)));
            for _ in 0..1000 {
                assert_eq!(inside.load(Ordering::SeqCst), 0);
            }
            done.store(true, Ordering::Relaxed);
            for w in workers {
                w.join().unwrap();
            }
            assert_eq!(gate.inside(), 0);
        }
    }

    #[test]
    fn thread_indexes_are_reused_without_sharing_a_slot() {
        let gate = Arc::new(RemovalGate::new());
        for _ in 0..8 {
            let g = gate.clone();
            std::thread::spawn(move || {
                let _a = g.enter().unwrap();
                assert_eq!(g.inside(), 1);
            })
            .join()
            .unwrap();
        }
        assert_eq!(gate.inside(), 0);
    }

    /// A call made while its thread exits (from another thread-local's
    /// destructor, after the thread gave its index back) goes through the
    /// shared counter, and is counted inside like any other.
    #[test]
    fn a_call_from_an_exiting_thread_is_counted_inside() {
        use std::cell::RefCell;
        use std::sync::Mutex;

        /// What the exiting thread saw: (took the shared counter, inside).
        type Seen = Arc<Mutex<Option<(bool, usize)>>>;
        struct OnExit(Option<(Arc<RemovalGate>, Seen)>);
        impl Drop for OnExit {
            fn drop(&mut self) {
                if let Some((gate, seen)) = self.0.take() {
                    let guard = gate.enter();
                    *seen.lock().unwrap() = Some((super::my_index().is_none(), gate.inside()));
                    drop(guard);
                }
            }
        }
        thread_local! {
            static ON_EXIT: RefCell<OnExit> = const { RefCell::new(OnExit(None)) };
        }
        let gate = Arc::new(RemovalGate::new());
        let seen = Arc::new(Mutex::new(None));
        let (g, s) = (gate.clone(), seen.clone());
        std::thread::spawn(move || {
            // Registered before the thread takes its index, so destroyed
            // after the index is given back (thread-locals are destroyed
            // in the reverse order of their first use).
            ON_EXIT.with(|o| o.borrow_mut().0 = Some((g.clone(), s)));
            drop(g.enter());
        })
        .join()
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), Some((true, 1)), "(shared counter, inside)");
        assert_eq!(gate.inside(), 0);
    }
}
