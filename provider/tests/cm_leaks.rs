//! Resource leaks of the connection manager: 2,200 connect/accept/
//! disconnect cycles leave no descriptor, thread, id or heap memory
//! behind (a counting allocator), dropping the CM stops its thread and
//! frees the devices' QP1, and a destroyed listener frees the channel
//! that only it still held. One test in its own binary, so that no
//! other test's threads, descriptors or allocations are counted.

mod cm_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use cm_common::*;
use softverbs::cm::*;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn no_leaks() {
    cycles_leak_no_fd_or_thread();
    dropping_the_cm_stops_its_thread_and_frees_qp1();
    a_destroyed_listener_frees_its_channel_and_the_request_left_in_it();
}

/// A listener destroyed after the application dropped its event channel,
/// with a connect request nobody took still queued there: the listener's
/// id holds the channel's last reference, so the destroy drops the
/// channel (its descriptor is closed) and the queued event, which
/// rejects its request. The destroy completes: it used to drop the id
/// under the CM's lock, which that reject takes again (a deadlock); the
/// id is now dropped after the lock, not kept.
fn a_destroyed_listener_frees_its_channel_and_the_request_left_in_it() {
    let w = world(108, 2, fast_config());
    let ch = EventChannel::new().unwrap();
    let c = resolved(&w.cm, &ch, PortSpace::Tcp, ip(108, 1), sa(108, 2, 9000));
    let r = with_qp(&c);
    let fds = fd_count();
    let sch = EventChannel::new().unwrap();
    let l = listener(
        &w.cm,
        &sch,
        PortSpace::Tcp,
        std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 9000),
    );
    c.connect(&ConnParam::default()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sch.pending() == 0 {
        assert!(std::time::Instant::now() < deadline, "no connect request queued");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(sch);
    // The destroy, on a thread of its own: should it deadlock, the test
    // fails here instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(l);
        let _ = tx.send(());
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        // The stuck thread holds the CM's lock: leak what would wait for
        // it on the way out, so that the test fails instead of hanging.
        std::mem::forget((c, r, ch, w));
        panic!("destroying the listener deadlocked");
    }
    expect(&ch, CmEventKind::Rejected);
    assert_eq!(fd_count(), fds, "the listener's channel is still open");
}

fn cycles_leak_no_fd_or_thread() {
    let w = world(106, 2, fast_config());
    let sch = EventChannel::new().unwrap();
    let l = listener(&w.cm, &sch, PortSpace::Tcp, "0.0.0.0:7600".parse().unwrap());
    let ch = EventChannel::new().unwrap();
    let cycle = |w: &World| {
        let (c, cr, s, sr) = connected(w, 106, 7600, &sch, &ch);
        c.disconnect().unwrap();
        expect(&ch, CmEventKind::Disconnected);
        expect(&sch, CmEventKind::Disconnected);
        drop((c, cr, s, sr));
    };
    // Destroyed ids linger only for time-wait.
    let settle = |w: &World| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while w.cm.id_count() > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(w.cm.id_count(), 1, "only the listener is left");
    };
    // The first 1,200 cycles warm every cache and pool up (maps at their
    // working size, per-thread scratch lists, and each device's QP table:
    // a destroyed QP's number is reused only once 1,024 others wait, so
    // the table grows for the first 1,025 QPs of a device, one per cycle
    // here); the next 1,000 must not grow anything. Settling every 50 cycles caps how many destroyed
    // ids linger in time-wait at once, so the CM's id map stops at the
    // same size whatever the machine's speed.
    let run = |w: &World, n: usize| {
        for k in 0..n {
            cycle(w);
            if k % 50 == 49 {
                settle(w);
            }
        }
        settle(w);
    };
    run(&w, 1200);
    let (fds, threads, live) = (fd_count(), thread_count(), LIVE.load(Ordering::Relaxed));
    run(&w, 1000);
    assert_eq!(fd_count(), fds);
    assert_eq!(thread_count_settled(threads), threads);
    // A leak of one object per cycle (an id, an event, a QP, a context:
    // each a few hundred bytes at least) would be 1,000 times its size:
    // well over this slack for the allocations of the moment (the growth
    // measured is 0 bytes).
    let grown = LIVE.load(Ordering::Relaxed) - live;
    assert!(grown < 64 << 10, "{grown} bytes more live after 1,000 more cycles");
    drop(l);
}

fn dropping_the_cm_stops_its_thread_and_frees_qp1() {
    let before = thread_count();
    let w = world(107, 2, fast_config());
    assert_eq!(thread_count(), before + 1);
    let World { sub, cm, names, .. } = w;
    drop(cm);
    assert_eq!(thread_count_settled(before), before);
    // A second CM can take the devices' QP1 now and connect.
    let cm = Cm::new(sub.clone(), fast_config()).unwrap();
    let sch = EventChannel::new().unwrap();
    let _l = listener(&cm, &sch, PortSpace::Tcp, sa(107, 2, 7700));
    let ch = EventChannel::new().unwrap();
    let c = resolved(&cm, &ch, PortSpace::Tcp, ip(107, 1), sa(107, 2, 7700));
    let _cr = with_qp(&c);
    c.connect(&ConnParam::default()).unwrap();
    expect(&sch, CmEventKind::ConnectRequest);
    let _ = names;
}
