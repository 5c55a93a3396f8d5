//! The system calls of the UDP link: socket options, `recvmmsg`, and
//! `sendmmsg` with UDP GSO (`UDP_SEGMENT`), with a plain fallback.
//!
//! Every `unsafe` block of the link lives here. Pointers handed to the
//! kernel are built on the stack for each call from buffers that outlive
//! it, so no structure holding raw pointers is ever stored (the link stays
//! `Send + Sync` without `unsafe impl`).

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{FromRawFd, RawFd};

/// Datagrams one `recvmmsg` call can return.
pub const RX_BATCH: usize = 32;
/// The largest datagram the link accepts: the largest RoCEv2 packet at MTU
/// 4096 (BTH, AtomicETH or RETH, 4096 bytes of payload, pad, ICRC) with
/// room to spare. Longer ones are dropped as oversized.
pub(super) const MAX_DATAGRAM: usize = 4096 + 256;
/// Bytes per receive slot without GRO (longer datagrams arrive truncated,
/// `MSG_TRUNC`).
const RX_SLOT_PLAIN: usize = MAX_DATAGRAM;
/// Bytes per receive slot with GRO: one coalesced run of datagrams.
const RX_SLOT_GRO: usize = 65_536;
/// Messages one `sendmmsg` call carries.
pub(super) const TX_BATCH: usize = 64;
/// Segments one GSO message carries (`UDP_MAX_SEGMENTS` is 64 on older
/// kernels).
pub(super) const GSO_MAX_SEGMENTS: usize = 64;
/// Bytes one GSO message carries (a UDP datagram's limit, with margin).
pub(super) const GSO_MAX_BYTES: usize = 65_000;

/// A socket address in the layout the kernel reads and writes. Writing a
/// union field is safe; reading one is not, and happens only in
/// [`SockAddr::to_std`].
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) union SockAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl SockAddr {
    pub(super) fn empty() -> SockAddr {
        SockAddr {
            v6: libc::sockaddr_in6 {
                sin6_family: 0,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
                sin6_scope_id: 0,
            },
        }
    }

    pub(super) fn from_std(a: SocketAddr) -> (SockAddr, libc::socklen_t) {
        match a {
            SocketAddr::V4(v4) => (
                SockAddr {
                    v4: libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: v4.port().to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from_ne_bytes(v4.ip().octets()),
                        },
                        sin_zero: [0; 8],
                    },
                },
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            SocketAddr::V6(v6) => (
                SockAddr {
                    v6: libc::sockaddr_in6 {
                        sin6_family: libc::AF_INET6 as libc::sa_family_t,
                        sin6_port: v6.port().to_be(),
                        sin6_flowinfo: 0,
                        sin6_addr: libc::in6_addr {
                            s6_addr: v6.ip().octets(),
                        },
                        sin6_scope_id: v6.scope_id(),
                    },
                },
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }

    pub(super) fn to_std(self) -> Option<SocketAddr> {
        // SAFETY: both variants start with the family field at the same
        // offset, and every bit pattern is a valid sockaddr_in/in6 (plain
        // integers and byte arrays); the family says which one the kernel
        // wrote.
        unsafe {
            match i32::from(self.v4.sin_family) {
                libc::AF_INET => Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(self.v4.sin_addr.s_addr.to_ne_bytes())),
                    u16::from_be(self.v4.sin_port),
                )),
                libc::AF_INET6 => Some(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(self.v6.sin6_addr.s6_addr)),
                    u16::from_be(self.v6.sin6_port),
                )),
                _ => None,
            }
        }
    }
}

fn setsockopt<T>(fd: RawFd, level: i32, name: i32, value: T) -> io::Result<()> {
    // SAFETY: passes a pointer to a live `T` and its exact size; the kernel
    // only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into a live i32.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut len) };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the don't-fragment behaviour (`IP_PMTUDISC_DO`): the kernel then
/// sends with DF set and, on an unconnected socket, IP id 0, which is what
/// both ends put into the ICRC.
pub(super) fn set_dont_fragment(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)
    } else {
        setsockopt(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
    }
}

/// Raises a socket buffer to `bytes` (past `rmem_max`/`wmem_max` when
/// allowed: `SO_*BUFFORCE` needs CAP_NET_ADMIN). Returns the size granted.
pub(super) fn set_buffer(fd: RawFd, receive: bool, bytes: i32) -> i32 {
    let (force, plain) = if receive {
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)
    } else {
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)
    };
    if setsockopt(fd, libc::SOL_SOCKET, force, bytes).is_err() {
        let _ = setsockopt(fd, libc::SOL_SOCKET, plain, bytes);
    }
    getsockopt_int(fd, libc::SOL_SOCKET, plain).unwrap_or(0)
}

/// Turns UDP GRO (the kernel hands over runs of equal-size datagrams of
/// one flow as one buffer) on or off. Returns whether the kernel took it.
pub(super) fn set_gro(fd: RawFd, on: bool) -> bool {
    setsockopt(fd, libc::SOL_UDP, libc::UDP_GRO, i32::from(on)).is_ok()
}

/// Sets or clears `SO_REUSEPORT`: while both have it set, another socket
/// of this user may bind the address and port this one is bound to.
pub(super) fn set_reuse_port(fd: RawFd, on: bool) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, i32::from(on))
}

/// A non-blocking UDP socket bound to `local` with `SO_REUSEPORT` set:
/// beside a socket bound there that has it set too.
pub(super) fn bind_beside(local: SocketAddr) -> io::Result<UdpSocket> {
    let family = if local.is_ipv6() { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: creates a descriptor; no pointer is passed.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it; the socket
    // closes it when dropped, on the error paths below too.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    set_reuse_port(fd, true)?;
    let (name, len) = SockAddr::from_std(local);
    // SAFETY: `name` is live for the call and `len` is the size of the
    // address `from_std` wrote.
    let r = unsafe { libc::bind(fd, (&name as *const SockAddr).cast(), len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Whether a datagram waits on `fd` (peeked, not taken).
pub(super) fn has_waiting(fd: RawFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: `b` is live and its length is passed; the call does not
    // block (MSG_DONTWAIT) and only peeks.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n >= 0
}

/// Whether the kernel supports UDP GSO on this socket.
pub(super) fn gso_supported(fd: RawFd) -> bool {
    getsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT).is_ok()
}

/// Receive buffers for one `recvmmsg` batch.
pub(super) struct RxBufs {
    /// When GRO is on and polls may probe with [`recv_one`].
    pub(super) policy: super::rx::GroPolicy,
    /// The ICRC state of the last flow received from.
    pub(super) icrc: crate::soft::wire::IcrcPrefix,
    /// Probes in a row in which the bound sockets beside live twins found
    /// nothing, and probes made (see `UdpLink::receive`).
    pub(super) bound_quiet: u32,
    pub(super) probes: u32,
    data: Vec<u8>,
    names: Vec<SockAddr>,
    cmsgs: Vec<CmsgBuf>,
    slot: usize,
    /// Length of each received buffer.
    pub(super) lens: [usize; RX_BATCH],
    /// Whether each was truncated (longer than a slot).
    pub(super) truncated: [bool; RX_BATCH],
    /// With GRO: the size of the datagrams a buffer holds (0: one
    /// datagram).
    pub(super) segment: [usize; RX_BATCH],
}

impl std::fmt::Debug for RxBufs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBufs").finish_non_exhaustive()
    }
}

impl RxBufs {
    /// Buffers for sockets that may turn GRO on (`gro`) or not.
    pub(super) fn new(gro: bool) -> RxBufs {
        let slot = if gro { RX_SLOT_GRO } else { RX_SLOT_PLAIN };
        RxBufs {
            policy: super::rx::GroPolicy::new(gro),
            icrc: crate::soft::wire::IcrcPrefix::default(),
            bound_quiet: 0,
            probes: 0,
            data: vec![0; RX_BATCH * slot],
            names: vec![SockAddr::empty(); RX_BATCH],
            cmsgs: vec![CmsgBuf([0; 32]); RX_BATCH],
            slot,
            lens: [0; RX_BATCH],
            truncated: [false; RX_BATCH],
            segment: [0; RX_BATCH],
        }
    }

    /// Buffer `i` of the last batch and its source.
    pub(super) fn get(&self, i: usize) -> (&[u8], Option<SocketAddr>) {
        let start = i * self.slot;
        let len = self.lens[i].min(self.slot);
        (&self.data[start..start + len], self.names[i].to_std())
    }
}

/// Datagrams the first `recvmmsg` of a poll asks for: a busy-polling
/// ping-pong finds one or none, and the headers of a call are built (and
/// zeroed) on the stack for every call, empty ones included. A full first
/// batch is followed by a call for up to [`RX_BATCH`].
pub(super) const RX_FIRST: usize = 4;

/// Receives one datagram into buffer 0 without blocking, with `recvfrom`:
/// the cheapest receive call (no message header or iovec to copy in), which
/// makes an idle busy-polling loop (and so the time to notice a datagram)
/// shorter; about 0.35 µs per one-way trip of a loopback ping-pong against
/// `recvmmsg` (measured in C here). Only for sockets without GRO: a GRO
/// buffer's segment size comes in a control message. Returns 0 or 1.
pub(super) fn recv_one(fd: RawFd, rx: &mut RxBufs) -> io::Result<usize> {
    debug_assert!(!rx.policy.on());
    let mut len = size_of::<SockAddr>() as libc::socklen_t;
    // SAFETY: buffer 0 is `rx.slot` bytes of `rx.data`; the name buffer is
    // a SockAddr with its size in `len`; neither is aliased during the
    // call, which does not block (MSG_DONTWAIT). MSG_TRUNC makes the
    // result the datagram's real length.
    let n = unsafe {
        libc::recvfrom(
            fd,
            rx.data.as_mut_ptr().cast(),
            rx.slot,
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            (&mut rx.names[0] as *mut SockAddr).cast(),
            &mut len,
        )
    };
    let Some(n) = received(n as isize)? else { return Ok(0) };
    crate::soft::probe::mark(crate::soft::probe::Point::RxLink);
    rx.lens[0] = n;
    rx.truncated[0] = n > rx.slot;
    rx.segment[0] = 0;
    Ok(1)
}

/// The result of a non-blocking receive call: `Ok(None)` when nothing was
/// waiting (or a signal interrupted it), the count or length otherwise.
fn received(n: isize) -> io::Result<Option<usize>> {
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

/// Receives up to `max` (≤ [`RX_BATCH`]) datagrams without blocking.
/// Returns how many arrived (0 when none is waiting).
pub(super) fn recv_batch(fd: RawFd, rx: &mut RxBufs, max: usize) -> io::Result<usize> {
    if max <= RX_FIRST {
        recv_batch_n::<RX_FIRST>(fd, rx, max)
    } else {
        recv_batch_n::<RX_BATCH>(fd, rx, max)
    }
}

/// [`recv_batch`] with headers for `N` datagrams.
fn recv_batch_n<const N: usize>(fd: RawFd, rx: &mut RxBufs, max: usize) -> io::Result<usize> {
    let max = max.clamp(1, N.min(RX_BATCH));
    let slot = rx.slot;
    let base = rx.data.as_mut_ptr();
    let mut iovs = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; N];
    // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths);
    // every field used is filled in below.
    let mut hdrs: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
    for i in 0..max {
        // SAFETY: slot i lies inside `rx.data` (RX_BATCH * slot bytes).
        iovs[i].iov_base = unsafe { base.add(i * slot) }.cast();
        iovs[i].iov_len = slot;
        hdrs[i].msg_hdr.msg_name = (&mut rx.names[i] as *mut SockAddr).cast();
        hdrs[i].msg_hdr.msg_namelen = size_of::<SockAddr>() as libc::socklen_t;
        hdrs[i].msg_hdr.msg_iov = &mut iovs[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
        hdrs[i].msg_hdr.msg_control = rx.cmsgs[i].0.as_mut_ptr().cast();
        hdrs[i].msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
    }
    // SAFETY: `max` headers, each pointing at a live name buffer and one
    // iovec over its own slot of `rx.data`; all outlive the call, which
    // does not block (MSG_DONTWAIT).
    let n = unsafe {
        libc::recvmmsg(
            fd,
            hdrs.as_mut_ptr(),
            max as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let Some(n) = received(n as isize)? else { return Ok(0) };
    crate::soft::probe::mark(crate::soft::probe::Point::RxLink);
    for (i, h) in hdrs.iter().enumerate().take(n) {
        rx.lens[i] = h.msg_len as usize;
        rx.truncated[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        rx.segment[i] = gro_segment(&h.msg_hdr);
    }
    Ok(n)
}

/// The segment size of a GRO buffer, from its `UDP_GRO` control message
/// (0 when there is none: a single datagram).
fn gro_segment(h: &libc::msghdr) -> usize {
    // SAFETY: the kernel filled `msg_control` (a live CmsgBuf of the
    // batch) up to `msg_controllen`; CMSG_FIRSTHDR/NXTHDR stay within it,
    // and a UDP_GRO message carries an int, read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).unwrap_or(0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// One message of a send batch: `count` datagrams (consecutive in the
/// caller's list, from `first`) to one destination. With `count > 1` they
/// go as one GSO message: all but the last are `seg` bytes long.
#[derive(Debug, Clone, Copy)]
pub(super) struct TxMsg {
    pub(super) dst: SocketAddr,
    pub(super) first: usize,
    pub(super) count: usize,
    pub(super) seg: usize,
}

/// Room for one `UDP_SEGMENT` control message, aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; 32]);

/// How a send batch ended.
#[derive(Debug)]
pub(super) enum SendOutcome {
    /// Messages sent (all of them when equal to the batch length).
    Sent(usize),
    /// The first message failed with this error.
    Failed(io::Error),
}

/// Sends up to [`TX_BATCH`] messages with one `sendmmsg`.
pub(super) fn send_batch<D: AsRef<[u8]>>(fd: RawFd, datagrams: &[D], msgs: &[TxMsg]) -> SendOutcome {
    crate::soft::probe::mark(crate::soft::probe::Point::TxLink);
    // The per-message arrays of a batch live on the stack and are zeroed
    // for every call: ~8 KiB for TX_BATCH messages, while a verb sends one
    // or two.
    let r = match msgs {
        [m] if m.count == 1 => send_one(fd, datagrams[m.first].as_ref(), m.dst),
        _ if msgs.len() <= TX_SMALL => send_batch_n::<TX_SMALL, D>(fd, datagrams, msgs),
        _ => send_batch_n::<TX_BATCH, D>(fd, datagrams, msgs),
    };
    crate::soft::probe::mark(crate::soft::probe::Point::TxSyscallDone);
    r
}

/// One datagram with `sendto` (the batch of one of [`send_batch`], without
/// the batch), or with `send` on a connected socket (`dst` `None`).
pub(super) fn send_single(fd: RawFd, data: &[u8], dst: Option<SocketAddr>) -> SendOutcome {
    crate::soft::probe::mark(crate::soft::probe::Point::TxLink);
    let r = match dst {
        Some(dst) => send_one(fd, data, dst),
        None => send_connected(fd, data),
    };
    crate::soft::probe::mark(crate::soft::probe::Point::TxSyscallDone);
    r
}

/// One datagram with `send` on a connected socket: no address, so the
/// kernel uses the route the socket keeps instead of looking one up.
fn send_connected(fd: RawFd, data: &[u8]) -> SendOutcome {
    // SAFETY: `data` is live for the call; the socket is non-blocking.
    let n = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), 0) };
    sent_one(n)
}

/// The outcome of a call that sends one datagram.
fn sent_one(n: isize) -> SendOutcome {
    if n < 0 {
        SendOutcome::Failed(io::Error::last_os_error())
    } else {
        SendOutcome::Sent(1)
    }
}

/// One datagram with `sendto`, which copies in no message header (the
/// common case of a ping-pong: a verb sends one packet).
fn send_one(fd: RawFd, data: &[u8], dst: SocketAddr) -> SendOutcome {
    let (name, len) = SockAddr::from_std(dst);
    // SAFETY: `data` and `name` are live for the call; `len` is the size
    // of the address `from_std` wrote; the socket is non-blocking.
    let n = unsafe {
        libc::sendto(
            fd,
            data.as_ptr().cast(),
            data.len(),
            0,
            (&name as *const SockAddr).cast(),
            len,
        )
    };
    sent_one(n)
}

/// Messages of a small send batch (see [`send_batch`]).
const TX_SMALL: usize = 4;

/// [`send_batch`] with room for `N` messages (sends the first `N`).
fn send_batch_n<const N: usize, D: AsRef<[u8]>>(fd: RawFd, datagrams: &[D], msgs: &[TxMsg]) -> SendOutcome {
    let msgs = &msgs[..msgs.len().min(N)];
    let total_iovs: usize = msgs.iter().map(|m| m.count).sum();
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(total_iovs);
    for m in msgs {
        for d in datagrams[m.first..m.first + m.count].iter().map(AsRef::as_ref) {
            iovs.push(libc::iovec {
                iov_base: d.as_ptr() as *mut libc::c_void,
                iov_len: d.len(),
            });
        }
    }
    let mut names = [SockAddr::empty(); N];
    let mut name_lens = [0 as libc::socklen_t; N];
    let mut cmsgs = [CmsgBuf([0; 32]); N];
    // SAFETY: an all-zero mmsghdr is valid; fields are filled below.
    let mut hdrs: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
    let mut iov_at = 0usize;
    for (i, m) in msgs.iter().enumerate() {
        let (sa, len) = SockAddr::from_std(m.dst);
        names[i] = sa;
        name_lens[i] = len;
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = (&mut names[i] as *mut SockAddr).cast();
        h.msg_namelen = name_lens[i];
        // SAFETY: `iov_at + m.count <= iovs.len()` by construction above.
        h.msg_iov = unsafe { iovs.as_mut_ptr().add(iov_at) };
        h.msg_iovlen = m.count as _;
        iov_at += m.count;
        if m.count > 1 {
            let space = cmsg_space_u16();
            h.msg_control = cmsgs[i].0.as_mut_ptr().cast();
            h.msg_controllen = space as _;
            // SAFETY: msg_control points at 32 aligned bytes, at least
            // CMSG_SPACE(2); CMSG_FIRSTHDR and CMSG_DATA stay inside them.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), m.seg as u16);
            }
        }
    }
    // SAFETY: `msgs.len()` headers whose names, iovecs (over the caller's
    // live datagrams) and control buffers all outlive the call; the socket
    // is non-blocking.
    let n = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), msgs.len() as libc::c_uint, 0) };
    if n < 0 {
        SendOutcome::Failed(io::Error::last_os_error())
    } else {
        SendOutcome::Sent(n as usize)
    }
}

fn cmsg_space_u16() -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) as usize }
}

/// The addresses of interface `name` (IPv6 link-local ones left out: they
/// need a scope that GIDs cannot carry).
pub(super) fn interface_addrs(name: &str) -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive
        // until freeifaddrs; its name is a NUL-terminated string and its
        // address, when not null, a sockaddr of the family it names.
        unsafe {
            let ifa = &*cur;
            let ifname = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy();
            if ifname == name && !ifa.ifa_addr.is_null() {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes())));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                        if ip.segments()[0] & 0xffc0 != 0xfe80 {
                            out.push(IpAddr::V6(ip));
                        }
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_by_key(|a| a.is_ipv6());
    Ok(out)
}
