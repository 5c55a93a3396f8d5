//! System calls of the shared-memory link: memfd and seals, datagram
//! socket doorbells, descriptor passing (SCM_RIGHTS), peer credentials, pidfds
//! and hang-up detection.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sys::cvt;

/// A new memfd that can be sealed.
pub(super) fn memfd(name: &str) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(File::from(crate::sys::memfd(&cname, libc::MFD_ALLOW_SEALING)?))
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

/// A doorbell: a non-blocking unix datagram socket bound to an
/// automatic abstract name (the kernel picks one no other socket has).
/// Its owner polls it; peers ring it through sockets connected to it
/// ([`bell_sender`], [`ring`]).
pub(super) fn bell() -> io::Result<OwnedFd> {
    let fd = unix_socket(libc::SOCK_DGRAM)?;
    // SAFETY: an all-zero sockaddr_un is valid; binding with only the
    // family asks the kernel for an automatic abstract name.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sa_family_t>() as libc::socklen_t;
    // SAFETY: `addr` is a live sockaddr_un and `len` does not exceed it.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(fd)
}

/// A new non-blocking, close-on-exec unix socket of type `ty`.
fn unix_socket(ty: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the descriptor is new and owned here.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sock_opt(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into a live c_int.
    cvt(unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len) })?;
    Ok(v)
}

/// The abstract name a unix socket is bound to (`peer`: the one it is
/// connected to), as a sockaddr and its length; `InvalidData` if it has
/// none.
fn abstract_name(fd: RawFd, peer: bool) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let p = (&mut addr as *mut libc::sockaddr_un).cast();
    // SAFETY: the kernel writes at most `len` bytes into a live sockaddr_un.
    cvt(unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    })?;
    // An abstract name: a NUL, then at least one byte.
    if (len as usize) <= std::mem::size_of::<libc::sa_family_t>() + 1 || addr.sun_path[0] != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "no abstract name"));
    }
    Ok((addr, len))
}

/// A socket of our own connected to our doorbell `bell`: what this end
/// passes a peer to ring it with (one per peer). The doorbell itself is
/// never passed: a peer holding it could read the rings meant for us, or
/// connect it to a socket of its own, after which it would refuse
/// everyone else's rings. With a socket of its own a peer can only ring
/// us, or fail to.
pub(super) fn bell_sender(bell: &OwnedFd) -> io::Result<OwnedFd> {
    let (addr, len) = abstract_name(bell.as_raw_fd(), false)?;
    let ours = unix_socket(libc::SOCK_DGRAM)?;
    // SAFETY: `addr` and `len` are what getsockname wrote (len bounded by
    // the size of `addr`).
    cvt(unsafe { libc::connect(ours.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(ours)
}

/// Checks the descriptor a peer passed to ring it with: a unix datagram
/// socket connected to an abstract name (the peer's [`bell_sender`]).
/// [`ring`] sends on it with `MSG_DONTWAIT`, which cannot block whatever
/// the peer does to the socket (its flags, `O_NONBLOCK` among them, live
/// in a file description the peer shares); anything else is refused, and
/// never written: a pipe or an eventfd (the doorbell of earlier
/// versions) whose owner filled it blocks a writer if the peer made the
/// description blocking, and Linux offers no per-call non-blocking write
/// for them.
///
/// # Errors
///
/// `InvalidData` for anything else (a pipe, an eventfd, a stream socket,
/// an unconnected socket); socket errors.
pub(super) fn check_bell(peer_bell: OwnedFd) -> io::Result<OwnedFd> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "doorbell is not a connected unix datagram socket",
        )
    };
    let fd = peer_bell.as_raw_fd();
    // SO_DOMAIN fails with ENOTSOCK for anything but a socket.
    if sock_opt(fd, libc::SO_DOMAIN).map_err(|_| bad())? != libc::AF_UNIX
        || sock_opt(fd, libc::SO_TYPE).map_err(|_| bad())? != libc::SOCK_DGRAM
    {
        return Err(bad());
    }
    abstract_name(fd, true).map_err(|_| bad())?;
    Ok(peer_bell)
}

/// A new epoll descriptor (close-on-exec).
pub(super) fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the descriptor is new and owned here.
    let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to epoll `ep`, level-triggered, for input and hang-ups: the
/// epoll descriptor is readable while `fd` is.
pub(super) fn epoll_add(ep: RawFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: fd as u64,
    };
    // SAFETY: a live epoll_event; both descriptors are the caller's.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
    Ok(())
}

/// Removes `fd` from epoll `ep` (closing it would too, but a descriptor
/// that lives on must not wake the epoll's owner).
pub(super) fn epoll_del(ep: RawFd, fd: RawFd) {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: a live epoll_event (ignored by DEL on current kernels).
    let _ = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut ev) };
}

/// Connects to the abstract unix stream name `name` without waiting: a
/// listener whose backlog is full (one that never accepts) gives
/// `WouldBlock` instead of holding the caller.
pub(super) fn connect_abstract(name: &[u8]) -> io::Result<std::os::unix::net::UnixStream> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    let fd = unix_socket(libc::SOCK_STREAM)?;
    // SAFETY: `addr` is a live sockaddr_un, `len` within it.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) })?;
    Ok(std::os::unix::net::UnixStream::from(fd))
}

/// Rings a doorbell through a socket connected to it ([`check_bell`]):
/// one byte, `MSG_DONTWAIT`, so it never blocks. Returns whether the byte
/// went; a full doorbell (`EAGAIN`) means its owner has wake-ups waiting
/// (it is awake, or will be when it polls) or is dead.
pub(super) fn ring(fd: RawFd) -> bool {
    let b = [1u8];
    // SAFETY: sends one byte from a live buffer.
    unsafe { libc::send(fd, b.as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) == 1 }
}

/// Empties our doorbell (non-blocking): takes the waiting rings, up to
/// 16 per system call (`recvmmsg`; one call after a single ring, as the
/// eventfd's read was), at most `max` in all (a peer ringing in a loop
/// cannot keep the caller here; a ring left over only makes the next
/// sleep end at once).
pub(super) fn drain(fd: RawFd, max: usize) {
    const BATCH: usize = 16;
    let mut bufs = [[0u8; 8]; BATCH];
    let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|_| libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    });
    for (iov, b) in iovs.iter_mut().zip(bufs.iter_mut()) {
        iov.iov_base = b.as_mut_ptr().cast();
        iov.iov_len = b.len();
    }
    // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths).
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    let mut left = max;
    while left > 0 {
        let want = left.min(BATCH);
        // SAFETY: `want` live mmsghdrs, each pointing at a live iovec over
        // a live 8-byte buffer; no waiting, no timeout.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                want as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < want as libc::c_int {
            break;
        }
        left -= want;
    }
}

/// Whether `ip` is an address of this host (of this network namespace):
/// whether a socket can be bound to it, which is the kernel's own test
/// (all of `127.0.0.0/8` is local, for instance). A host set to bind
/// non-local addresses (`net.ipv4.ip_nonlocal_bind`) passes everything.
pub(super) fn is_local(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
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
/// have a connection waiting, which streams' peers closed or failed,
/// which half-open rendezvous connections have something to read (a
/// hello, or their end).
pub(super) struct Readiness {
    pub(super) pending: Vec<bool>,
    pub(super) closed: Vec<bool>,
    pub(super) hellos: Vec<bool>,
}

/// Polls listeners (for a waiting connection), streams (for a peer that
/// closed or failed) and half-open connections (for their hello) in one
/// system call, without waiting: the slow path's look at the link's
/// sockets, which used to cost an `accept` per listener and a `poll` per
/// channel. A closed peer shows as `POLLRDHUP`, which the kernel reports
/// even while data (descriptor messages) still waits in the socket,
/// unlike a peek, which would see the data first; nothing is consumed.
pub(super) fn readiness(listeners: &[RawFd], streams: &[RawFd], hellos: &[RawFd]) -> Readiness {
    let poll_fd = |events: libc::c_short| move |&fd: &RawFd| libc::pollfd { fd, events, revents: 0 };
    let mut fds: Vec<libc::pollfd> = listeners
        .iter()
        .map(poll_fd(libc::POLLIN))
        .chain(streams.iter().map(poll_fd(libc::POLLRDHUP)))
        .chain(hellos.iter().map(poll_fd(libc::POLLIN)))
        .collect();
    // SAFETY: `fds` is a live array of `fds.len()` pollfds; no waiting.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    if n < 0 {
        // EINTR or ENOMEM: report nothing; the next slow path looks again.
        for p in &mut fds {
            p.revents = 0;
        }
    }
    let (l, rest) = fds.split_at(listeners.len());
    let (s, h) = rest.split_at(streams.len());
    let hup = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    Readiness {
        pending: l
            .iter()
            .map(|p| p.revents & (libc::POLLIN | libc::POLLERR) != 0)
            .collect(),
        closed: s.iter().map(|p| p.revents & hup != 0).collect(),
        hellos: h.iter().map(|p| p.revents != 0).collect(),
    }
}

/// The inode of the socket process `pid` has as descriptor `fd`, from
/// `/proc/<pid>/fd/<fd>` (one `readlink`; needs the access a same-uid,
/// dumpable process grants). `None`: no such descriptor, not a socket, or
/// no access.
pub(super) fn socket_inode(pid: u32, fd: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The local endpoint a socket is bound to.
pub(super) fn local_endpoint(fd: RawFd) -> Option<std::net::SocketAddr> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into a live sockaddr_storage.
    if unsafe { libc::getsockname(fd, (&mut ss as *mut libc::sockaddr_storage).cast(), &mut len) } < 0 {
        return None;
    }
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET).
            let a: libc::sockaddr_in = unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(std::net::SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6).
            let a: libc::sockaddr_in6 = unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(std::net::SocketAddr::from((ip, u16::from_be(a.sin6_port))))
        }
        _ => None,
    }
}

/// For each endpoint of `eps`, the inodes of the UDP sockets bound to it
/// (or to the wildcard address on its port), from `/proc/net/udp` and
/// `/proc/net/udp6`, each read once.
pub(super) fn udp_inodes(eps: &[std::net::SocketAddr]) -> Vec<Vec<u64>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut out = vec![Vec::new(); eps.len()];
    for (path, hex_len) in [("/proc/net/udp", 8), ("/proc/net/udp6", 32)] {
        let Ok(table) = std::fs::read_to_string(path) else {
            continue;
        };
        for line in table.lines().skip(1) {
            let mut f = line.split_whitespace();
            let (Some(local), Some(inode)) = (f.nth(1), f.nth(7)) else {
                continue;
            };
            let Some((addr, port)) = local.split_once(':') else {
                continue;
            };
            let Ok(port) = u16::from_str_radix(port, 16) else {
                continue;
            };
            if addr.len() != hex_len || !eps.iter().any(|ep| ep.port() == port) {
                continue;
            }
            // The kernel prints each 32-bit word of the address as a
            // number in host byte order.
            let mut bytes = Vec::with_capacity(16);
            for w in 0..hex_len / 8 {
                match u32::from_str_radix(&addr[8 * w..8 * w + 8], 16) {
                    Ok(x) => bytes.extend_from_slice(&x.to_ne_bytes()),
                    Err(_) => break,
                }
            }
            // The socket's address, as IPv6 (an IPv4 one mapped).
            let ip = match bytes.len() {
                4 => Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).to_ipv6_mapped(),
                16 => {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(&bytes);
                    Ipv6Addr::from(b)
                }
                _ => continue,
            };
            let wildcard = ip.is_unspecified() || ip == Ipv4Addr::UNSPECIFIED.to_ipv6_mapped();
            let Ok(inode) = inode.parse::<u64>() else { continue };
            for (ep, o) in eps.iter().zip(out.iter_mut()) {
                let want = match ep.ip() {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                if ep.port() == port && (wildcard || ip == want) {
                    o.push(inode);
                }
            }
        }
    }
    out
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
