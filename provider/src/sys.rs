//! Small system-call wrappers and helpers shared by the whole crate, so
//! that each exists once: taking a lock whose holder panicked, checking a
//! libc return value, making an eventfd or a memfd, and netlink framing
//! ([`netlink`], shared with the emulator too).

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

pub mod netlink;

/// Locks `m`, taking the data even if a thread panicked while holding it.
///
/// Every structure these locks protect is kept consistent between
/// statements that may panic (a panic in a verb leaves the object as the
/// failed call found it), and refusing all later calls because one call
/// panicked would turn one bug into a dead device: the poison is ignored.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] without waiting: `None` if another thread holds `m`.
#[inline]
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// A libc return value: negative is the calling thread's `errno`.
#[inline]
pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    match r {
        r if r < 0 => Err(io::Error::last_os_error()),
        r => Ok(r),
    }
}

/// A new eventfd with counter 0 and `flags` (`EFD_*`; `EFD_CLOEXEC` is
/// always added).
pub(crate) fn eventfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes two integers and touches no memory of ours; a
    // negative return is an error, checked by `cvt`.
    let fd = cvt(unsafe { libc::eventfd(0, flags | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new anonymous memory file named `name` with `flags` (`MFD_*`;
/// `MFD_CLOEXEC` is always added).
pub(crate) fn memfd(name: &CStr, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a NUL-terminated string that outlives the call; a
    // negative return is an error, checked by `cvt`.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_CLOEXEC) })?;
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn lock_takes_a_poisoned_mutex() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }

    #[test]
    fn cvt_passes_values_and_reads_errno() {
        assert_eq!(cvt(3).unwrap(), 3);
        // SAFETY: closing a descriptor number that is not open fails with
        // EBADF and touches nothing.
        let r = unsafe { libc::close(-1) };
        assert_eq!(cvt(r).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn eventfd_and_memfd_are_close_on_exec() {
        let e = eventfd(libc::EFD_NONBLOCK).unwrap();
        let m = memfd(c"sys-test", 0).unwrap();
        for fd in [e.as_raw_fd(), m.as_raw_fd()] {
            // SAFETY: F_GETFD on our own open descriptor.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
        // Non-blocking: reading the empty counter does not wait.
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own descriptor.
        let r = unsafe { libc::read(e.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        assert_eq!(r, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN));
    }
}
