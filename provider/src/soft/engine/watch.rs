//! What lets an application sleep on its own poller (`epoll`, `mio`) on a
//! completion channel's or a context's descriptor while its device runs
//! in inline mode on a network link, where nothing reads the link or runs
//! timers unless a verb is called.
//!
//! Such a descriptor is an epoll set of the object's eventfd, the link's
//! descriptors and the device's *timer*: a timerfd armed to the engine's
//! next deadline (a retransmission, an RNR retry). It becomes readable
//! when an event is pending, when datagrams arrive for the device to read,
//! or when a timer is due; the application then calls `get_cq_event` /
//! `get_async_event`, which drive the device, and gets the event if one
//! resulted. A link whose peers only signal readers that announced sleep
//! (shared memory) is told to keep them signalling
//! ([`Wakeups::set_watched`](crate::soft::link::Wakeups::set_watched)).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Nanos;

/// `armed` when the timer is off.
const OFF: u64 = u64::MAX;

/// The device's timer for watched descriptors.
#[derive(Debug)]
pub(crate) struct Watch {
    timer: OwnedFd,
    /// Engine time the timer is armed for ([`OFF`]: disarmed).
    armed: AtomicU64,
}

impl Watch {
    pub(crate) fn new() -> io::Result<Watch> {
        // SAFETY: timerfd_create has no memory-safety preconditions; a
        // negative return is an error, checked below.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Watch {
            // SAFETY: a fresh descriptor that nothing else owns.
            timer: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: AtomicU64::new(OFF),
        })
    }

    pub(crate) fn timer_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }

    /// The engine's next deadline is now `deadline` (at engine time
    /// `now`): arms the timer if that is earlier than what it is armed for.
    /// One atomic load when nothing changes.
    #[inline]
    pub(crate) fn note(&self, deadline: Option<Nanos>, now: Nanos) {
        let Some(d) = deadline else { return };
        if d >= self.armed.load(Ordering::Relaxed) {
            return;
        }
        self.armed.store(d, Ordering::Relaxed);
        self.set(d.saturating_sub(now).max(1));
    }

    /// Makes the timer fire at once (work is waiting that no descriptor
    /// will report).
    pub(crate) fn kick(&self) {
        self.armed.store(0, Ordering::Relaxed);
        self.set(1);
    }

    /// Called as the device is driven: consumes an expiry (the descriptor
    /// stops being readable) and disarms, so the next [`Watch::note`] arms
    /// for the next deadline.
    pub(crate) fn reset(&self) {
        if self.armed.load(Ordering::Relaxed) == OFF {
            return;
        }
        self.armed.store(OFF, Ordering::Relaxed);
        self.set(0);
    }

    /// Arms the timer `ns` from now (0: disarms).
    fn set(&self, ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: our own timerfd, a live itimerspec, and no old value
        // asked for. Disarming also clears a pending expiry.
        let _ = unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }
}

/// An epoll set of `fds` (readable while any of them is): the descriptor an
/// application registers with its own poller.
pub(crate) fn epoll_of(fds: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 has no memory-safety preconditions; a negative
    // return is an error, checked below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    for &fd in fds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: our epoll descriptor, an open descriptor `fd` (the
        // caller's, alive as long as the set is used), a live event.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(ep)
}
