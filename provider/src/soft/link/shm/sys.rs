//! System calls of the shared-memory link: memfd and seals, eventfd
//! doorbells, descriptor passing (SCM_RIGHTS), peer credentials, pidfds
//! and hang-up detection.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new memfd that can be sealed.
pub(super) fn memfd(name: &str) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid NUL-terminated name; the returned descriptor is new
    // and owned by the File.
    let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Seals the size (no shrink, no grow) and the seals themselves.
pub(super) fn seal_size(f: &File) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a live descriptor with an integer argument.
    cvt(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// The seals of a memfd.
pub(super) fn seals(f: &File) -> io::Result<libc::c_int> {
    // SAFETY: fcntl on a live descriptor, no argument.
    cvt(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) })
}

/// A non-blocking eventfd.
pub(super) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the descriptor is new and owned here.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd (wakes its reader). Errors (a full counter)
/// are harmless: the reader is awake then anyway.
pub(super) fn ring(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of a live u64.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd (non-blocking).
pub(super) fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Sends `data` and the descriptors `fds` on a unix stream socket.
pub(super) fn send_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds CMSG_SPACE(fd_bytes) bytes, enough
    // for one header and the descriptors; CMSG_FIRSTHDR is then non-null.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
    }
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives one message of up to `buf.len()` bytes and up to `max_fds`
/// descriptors (non-blocking). Returns the byte count (0: the peer
/// closed) and the descriptors, which are owned (closed if unused).
pub(super) fn recv_fds(sock: RawFd, buf: &mut [u8], max_fds: usize) -> io::Result<(usize, Vec<OwnedFd>)> {
    let fd_bytes = max_fds * std::mem::size_of::<RawFd>();
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8) + 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = (cbuf.len() * 8) as _;
    // SAFETY: `msg` points at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walks the control messages the kernel wrote into `cbuf`
    // with the CMSG macros, which stay inside msg_controllen; SCM_RIGHTS
    // data are descriptors the kernel installed for us, each taken into
    // an OwnedFd exactly once.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let len = (*c).cmsg_len as usize - (data as usize - c as usize);
                for k in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(k));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, fds))
}

/// The (pid, uid) of the process at the other end of a unix socket.
pub(super) fn peer_cred(sock: RawFd) -> io::Result<(u32, u32)> {
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into a live ucred.
    cvt(unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok((cred.pid as u32, cred.uid))
}

/// This process's effective uid.
pub(super) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// What one look at the slow path's descriptors found: which listeners
/// have a connection waiting, which streams' peers closed or failed.
pub(super) struct Readiness {
    pub(super) pending: Vec<bool>,
    pub(super) closed: Vec<bool>,
}

/// Polls listeners (for a waiting connection) and streams (for a peer
/// that closed or failed) in one system call, without waiting: the slow
/// path's look at the link's sockets, which used to cost an `accept` per
/// listener and a `poll` per channel. A closed peer shows as
/// `POLLRDHUP`, which the kernel reports even while data (descriptor
/// messages) still waits in the socket, unlike a peek, which would see
/// the data first; nothing is consumed.
pub(super) fn readiness(listeners: &[RawFd], streams: &[RawFd]) -> Readiness {
    let mut fds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .chain(streams.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        }))
        .collect();
    // SAFETY: `fds` is a live array of `fds.len()` pollfds; no waiting.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    if n < 0 {
        // EINTR or ENOMEM: report nothing; the next slow path looks again.
        for p in &mut fds {
            p.revents = 0;
        }
    }
    let (l, s) = fds.split_at(listeners.len());
    let hup = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    Readiness {
        pending: l
            .iter()
            .map(|p| p.revents & (libc::POLLIN | libc::POLLERR) != 0)
            .collect(),
        closed: s.iter().map(|p| p.revents & hup != 0).collect(),
    }
}

/// Waits up to `ms` milliseconds for `fd` to become readable.
pub(super) fn wait_readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// A pidfd for process `pid` (Linux 5.3+): it becomes readable when the
/// process exits, whether or not its pid is reused afterwards.
pub(super) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain system call with integer arguments; the descriptor
    // returned is new and owned here.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process of a pidfd is still running (its pidfd is not
/// readable).
pub(super) fn pid_alive(pidfd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 0 }
}
