//! An in-process ping-pong allocates nothing per message: the engine's
//! packet buffers and transmit lists are recycled. (A transmit list kept
//! in the sending engine but handed on with its datagrams to the receiving
//! one cost two allocations per round trip; see `DeviceShared::drain_locked`.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

#[path = "../examples/inproc_pingpong.rs"]
mod example;

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_of(iters: u64) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    example::run(iters).unwrap();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn round_trips_allocate_nothing() {
    // Both runs set up the same devices and objects; the difference is
    // what 10,000 more round trips allocated.
    let short = allocations_of(1_000);
    let long = allocations_of(11_000);
    let per_round_trip = long.saturating_sub(short) as f64 / 10_000.0;
    assert!(
        per_round_trip < 0.05,
        "{per_round_trip:.3} allocations per round trip ({short} for 1,000, {long} for 11,000)"
    );
}
