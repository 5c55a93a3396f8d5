//! A kernel event descriptor (a context's async fd, a completion channel's
//! fd) joined with an eventfd of ours, so that the backend can raise events
//! the kernel does not (a DEVICE_FATAL or a CQ notification synthesized by a
//! removal) and still wake whoever waits.
//!
//! Waiters inside this backend poll(2) both descriptors. What the API hands
//! out as *the* descriptor to poll is an epoll descriptor watching both
//! (an epoll descriptor is itself readable while one of its members is), so
//! an application's poll/epoll loop wakes for either. Once the kernel side
//! is finished (a disassociated device reports `POLLERR` forever), it is
//! detached: only our events remain.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::ffi;

/// What [`WakeFd::wait`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Ready {
    /// The kernel descriptor is readable (or in error).
    pub(crate) kernel: bool,
    /// Our eventfd was signalled.
    pub(crate) woken: bool,
}

/// A kernel descriptor plus an eventfd, behind one epoll descriptor.
#[derive(Debug)]
pub(crate) struct WakeFd {
    epoll: OwnedFd,
    event: OwnedFd,
    kernel: RawFd,
    attached: AtomicBool,
}

/// [`crate::sys::cvt`], with the error as an errno.
fn cvt(rc: libc::c_int) -> Result<libc::c_int, i32> {
    crate::sys::cvt(rc).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

impl WakeFd {
    /// Joins `kernel` (which stays owned by libibverbs) with a new eventfd.
    /// Returns an errno on failure.
    pub(crate) fn new(kernel: RawFd) -> Result<WakeFd, i32> {
        let event = crate::sys::eventfd(libc::EFD_NONBLOCK).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        // SAFETY: as above, for epoll_create1.
        let epoll = unsafe { OwnedFd::from_raw_fd(cvt(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
        let add = |fd: RawFd| -> Result<(), i32> {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: a valid epoll descriptor, a descriptor to watch and a
            // valid event struct.
            cvt(unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
        };
        add(event.as_raw_fd())?;
        let attached = kernel >= 0 && add(kernel).is_ok();
        Ok(WakeFd {
            epoll,
            event,
            kernel,
            attached: AtomicBool::new(attached),
        })
    }

    /// The descriptor applications poll: readable while a kernel event or
    /// one of ours is pending.
    pub(crate) fn poll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Whether the kernel descriptor is still watched.
    pub(crate) fn kernel_attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    /// Stops watching the kernel descriptor (its device is gone). Idempotent.
    pub(crate) fn detach_kernel(&self) {
        if self.attached.swap(false, Ordering::AcqRel) {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: a valid epoll descriptor; removing a member that may
            // already be closed fails harmlessly.
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, self.kernel, &mut ev) };
        }
    }

    /// Signals our side: waiters wake, the poll descriptor becomes readable
    /// until [`WakeFd::drain`].
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd; a full
        // counter (EAGAIN) still leaves it readable.
        unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears our side.
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a valid u64 from our non-blocking
        // eventfd (EAGAIN when not signalled).
        unsafe { libc::read(self.event.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Waits until the kernel descriptor (if attached) is readable or our
    /// side is signalled, or `timeout` passes (`None`: forever). Restarts
    /// after signals. Returns an errno on failure.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<Ready, i32> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ms: libc::c_int = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    libc::c_int::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
                }
            };
            let kernel = if self.kernel_attached() { self.kernel } else { -1 };
            let mut fds = [
                libc::pollfd {
                    fd: self.event.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                // poll(2) ignores entries with a negative descriptor.
                libc::pollfd {
                    fd: kernel,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfd entries on the stack.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if n < 0 {
                match ffi::errno() {
                    libc::EINTR => continue,
                    e => return Err(e),
                }
            }
            return Ok(Ready {
                woken: fds[0].revents != 0,
                kernel: kernel >= 0 && fds[1].revents != 0,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pipe([RawFd; 2]);

    impl Pipe {
        fn new() -> Pipe {
            let mut fds = [0; 2];
            // SAFETY: pipe writes two descriptors into the array.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) }, 0);
            Pipe(fds)
        }

        fn put(&self) {
            // SAFETY: one byte from a valid buffer into our pipe.
            assert_eq!(unsafe { libc::write(self.0[1], b"x".as_ptr().cast(), 1) }, 1);
        }

        fn take(&self) {
            let mut b = [0u8; 8];
            // SAFETY: reading into a valid buffer from our pipe.
            unsafe { libc::read(self.0[0], b.as_mut_ptr().cast(), 8) };
        }
    }

    impl Drop for Pipe {
        fn drop(&mut self) {
            // SAFETY: closing the descriptors we opened.
            unsafe {
                libc::close(self.0[0]);
                libc::close(self.0[1]);
            }
        }
    }

    fn readable(fd: RawFd) -> bool {
        ffi::wait_readable(fd, Some(Duration::ZERO)) == Ok(true)
    }

    #[test]
    fn both_sides_wake_waiters_and_the_poll_fd() {
        let p = Pipe::new();
        let w = WakeFd::new(p.0[0]).unwrap();
        assert!(w.kernel_attached());
        assert_eq!(w.wait(Some(Duration::from_millis(1))), Ok(Ready::default()));
        assert!(!readable(w.poll_fd()));

        p.put();
        let r = w.wait(None).unwrap();
        assert!(r.kernel && !r.woken);
        assert!(readable(w.poll_fd()), "the epoll descriptor follows the kernel one");
        p.take();
        assert!(!readable(w.poll_fd()));

        w.wake();
        w.wake();
        let r = w.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(r.woken && !r.kernel);
        assert!(readable(w.poll_fd()));
        w.drain();
        assert!(!readable(w.poll_fd()));

        // A waiter on another thread is woken.
        let w = std::sync::Arc::new(w);
        let t = {
            let w = w.clone();
            std::thread::spawn(move || w.wait(None))
        };
        std::thread::sleep(Duration::from_millis(10));
        w.wake();
        assert!(t.join().unwrap().unwrap().woken);
        w.drain();
    }

    #[test]
    fn a_detached_kernel_side_is_ignored() {
        let p = Pipe::new();
        let w = WakeFd::new(p.0[0]).unwrap();
        p.put();
        w.detach_kernel();
        w.detach_kernel();
        assert!(!w.kernel_attached());
        assert!(!readable(w.poll_fd()), "no longer watched");
        assert_eq!(w.wait(Some(Duration::ZERO)), Ok(Ready::default()));
        // Without a kernel side at all.
        let w = WakeFd::new(-1).unwrap();
        assert!(!w.kernel_attached());
        w.wake();
        assert!(w.wait(Some(Duration::ZERO)).unwrap().woken);
    }
}
