//! An eventfd-backed event counter: what completion channels and async
//! event queues expose as a pollable file descriptor.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A semaphore-mode eventfd: each `post` makes one `wait` succeed.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // Miri has no semaphore mode: `try_take` gives the rest back.
        let semaphore = if cfg!(miri) { 0 } else { libc::EFD_SEMAPHORE };
        let fd = crate::sys::eventfd(libc::EFD_NONBLOCK | semaphore)?;
        Ok(EventFd { fd })
    }

    /// Adds one to the counter (wakes one waiter / makes the fd readable).
    pub(crate) fn post(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own descriptor.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes one from the counter if it is non-zero.
    pub(crate) fn try_take(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own descriptor
        // (non-blocking; EAGAIN when the counter is zero).
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if cfg!(miri) && n == 8 && v > 1 {
            // Under Miri the read took the whole count (no semaphore
            // mode): all but one go back.
            let rest = v - 1;
            // SAFETY: writes 8 bytes from a live u64 to our own descriptor.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&rest as *const u64).cast(), 8) };
        }
        n == 8
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (`None`:
/// forever). Returns whether any is readable.
pub(crate) fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> bool {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds.len()` valid pollfds and an optional timespec, alive
    // for the call; no signal mask is passed.
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, tsp, std::ptr::null()) };
    r > 0
}
