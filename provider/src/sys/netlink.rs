//! Netlink framing, once for every netlink protocol this repository speaks
//! (RDMA netlink in the hardware backend, rtnetlink in the emulator's
//! Linux namespace driver): building a message (`nlmsghdr`, a family
//! header, attributes, nested attributes) and splitting a datagram into
//! messages and a payload into attributes, every length checked against
//! what is there; and the socket both talk to the kernel through
//! ([`Socket`]: open, send, receive). What a protocol's messages mean, and
//! which replies end a request, stay with the protocol.
//!
//! Public (hidden from the docs) for the emulator's rtnetlink driver; not a
//! stable API.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Length of `struct nlmsghdr`.
pub const HDR: usize = 16;
/// `NLMSG_ERROR`: an error or, with errno 0, an acknowledgement.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a dump.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_REPLACE`.
pub const NLM_F_REPLACE: u16 = 0x100;
/// `NLM_F_EXCL`.
pub const NLM_F_EXCL: u16 = 0x200;
/// `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLA_F_NESTED`: the attribute holds attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type without its flag bits (`NLA_F_NESTED`,
/// `NLA_F_NET_BYTEORDER`).
pub const NLA_TYPE_MASK: u16 = 0x3fff;

/// `NLMSG_ALIGN`/`NLA_ALIGN`: rounds up to 4 bytes.
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Malformed netlink data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed netlink data: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

impl From<ParseError> for io::Error {
    fn from(e: ParseError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// A [`ParseError`] saying `what`.
pub fn bad(what: impl Into<String>) -> ParseError {
    ParseError(what.into())
}

/// A netlink message under construction.
#[derive(Debug, Clone)]
pub struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    /// A message of type `ty` with exactly `flags`.
    pub fn new(ty: u16, flags: u16) -> Msg {
        let mut buf = vec![0u8; HDR];
        buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        Msg { buf }
    }

    /// A request of type `ty` with `flags` (`NLM_F_REQUEST` is added).
    pub fn request(ty: u16, flags: u16) -> Msg {
        Msg::new(ty, flags | NLM_F_REQUEST)
    }

    /// Appends raw bytes, padded to 4: a family header (`ifinfomsg`,
    /// `ifaddrmsg`) or an error code.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Msg {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    /// Appends an attribute (its length excludes the padding).
    ///
    /// # Panics
    ///
    /// If `payload` is longer than an attribute can be (65,531 bytes).
    pub fn attr(&mut self, ty: u16, payload: &[u8]) -> &mut Msg {
        let len = u16::try_from(4 + payload.len()).expect("netlink attribute longer than 64 KiB");
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    /// Appends a NUL-terminated string attribute.
    pub fn attr_str(&mut self, ty: u16, s: &str) -> &mut Msg {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(ty, &v)
    }

    /// Opens a nested attribute (`NLA_F_NESTED` is added); returns where,
    /// for [`Msg::nest_end`].
    pub fn nest_begin(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.attr(ty | NLA_F_NESTED, &[]);
        at
    }

    /// Closes the nested attribute opened at `at`.
    ///
    /// # Panics
    ///
    /// If the nest grew longer than an attribute can be.
    pub fn nest_end(&mut self, at: usize) {
        let len = u16::try_from(self.buf.len() - at).expect("nested netlink attribute longer than 64 KiB");
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// The message with its length and sequence number filled in.
    pub fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// A message of type `ty` with `flags`, sequence number `seq` and the flat
/// attributes `attrs`, in one call.
pub fn build(ty: u16, flags: u16, seq: u32, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = Msg::new(ty, flags);
    for (t, v) in attrs {
        m.attr(*t, v);
    }
    m.finish(seq)
}

/// One netlink message of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// `nlmsg_type`.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// What follows the header, up to `nlmsg_len`.
    pub payload: &'a [u8],
}

/// Splits a datagram into its messages. Every length must fit in what is
/// left, and nothing may trail the last message.
///
/// # Errors
///
/// [`ParseError`] for a length shorter than a header or past the end, or
/// trailing bytes.
pub fn messages(mut buf: &[u8]) -> Result<Vec<Message<'_>>, ParseError> {
    let mut out = Vec::new();
    while buf.len() >= HDR {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < HDR || len > buf.len() {
            return Err(bad(format!("message length {len} with {} bytes left", buf.len())));
        }
        out.push(Message {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes")),
            payload: &buf[HDR..len],
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    if !buf.is_empty() {
        return Err(bad(format!("{} trailing bytes", buf.len())));
    }
    Ok(out)
}

/// The attributes of a message payload (after its family header, if the
/// protocol has one): (type without flag bits, value).
///
/// # Errors
///
/// [`ParseError`] for a length shorter than an attribute header or past
/// the end, or trailing bytes.
pub fn attrs(mut buf: &[u8]) -> Result<Vec<(u16, &[u8])>, ParseError> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return Err(bad(format!(
                "attribute {ty} length {len} with {} bytes left",
                buf.len()
            )));
        }
        out.push((ty, &buf[4..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    if !buf.is_empty() {
        return Err(bad(format!("{} trailing attribute bytes", buf.len())));
    }
    Ok(out)
}

/// A `u32` attribute value (native byte order) of attribute `ty`.
///
/// # Errors
///
/// [`ParseError`] if `v` is shorter than 4 bytes.
pub fn attr_u32(v: &[u8], ty: u16) -> Result<u32, ParseError> {
    v.get(..4)
        .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| bad(format!("attribute {ty}: {} bytes for a u32", v.len())))
}

/// A `u64` attribute value (native byte order) of attribute `ty`.
///
/// # Errors
///
/// [`ParseError`] if `v` is shorter than 8 bytes.
pub fn attr_u64(v: &[u8], ty: u16) -> Result<u64, ParseError> {
    v.get(..8)
        .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| bad(format!("attribute {ty}: {} bytes for a u64", v.len())))
}

/// A string attribute value: up to its first NUL (or all of it), lossily
/// decoded.
pub fn attr_str(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// The errno of an `NLMSG_ERROR` payload as the kernel puts it: 0 for an
/// acknowledgement, otherwise a negative errno.
///
/// # Errors
///
/// [`ParseError`] if the payload is shorter than the error code.
pub fn error_code(payload: &[u8]) -> Result<i32, ParseError> {
    payload
        .get(..4)
        .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| bad("short NLMSG_ERROR"))
}

/// A netlink socket of protocol `NETLINK_*`, in the network namespace of
/// the thread that opened it, talking to the kernel.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
}

impl Socket {
    /// Opens a socket of `protocol` (`NETLINK_ROUTE`, `NETLINK_RDMA`, …),
    /// bound to a port the kernel picks, whose receives give up after
    /// `reply_timeout` (`EAGAIN`).
    ///
    /// # Errors
    ///
    /// The `socket(2)`, `bind(2)` or `setsockopt(2)` error
    /// (`EPROTONOSUPPORT` where the kernel does not offer `protocol`).
    pub fn open(protocol: libc::c_int, reply_timeout: Duration) -> io::Result<Socket> {
        // SAFETY: socket takes three integers; a non-negative result is a
        // new descriptor that only this OwnedFd closes.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor we just opened and nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sa = kernel();
        // SAFETY: `sa` is a sockaddr_nl of the length passed (port 0: the
        // kernel assigns one; no groups).
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: reply_timeout.as_secs() as libc::time_t,
            tv_usec: reply_timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: SO_RCVTIMEO takes a timeval of the length passed.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Socket { fd })
    }

    /// Sends the message `msg` to the kernel.
    ///
    /// # Errors
    ///
    /// The `sendto(2)` error.
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        let to = kernel();
        // SAFETY: a valid socket, our buffer of the length passed and a
        // sockaddr_nl of its size.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&to as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one datagram into `buf` (again if a signal interrupted the
    /// wait); returns its length.
    ///
    /// # Errors
    ///
    /// The `recv(2)` error: `EAGAIN` once the reply timeout passed.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: receiving into our buffer of the length passed.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// The kernel's netlink address (port 0, no groups).
fn kernel() -> libc::sockaddr_nl {
    // SAFETY: an all-zero sockaddr_nl is valid; we set the family.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_with_nested_attributes() {
        let mut m = Msg::request(16, NLM_F_ACK);
        m.raw(&[1, 2, 3, 4, 5]).attr_str(3, "ab");
        let nest = m.nest_begin(18);
        m.attr(1, &7u32.to_ne_bytes());
        m.nest_end(nest);
        let b = m.finish(42);
        assert_eq!(b.len() % 4, 0);
        let msgs = messages(&b).unwrap();
        assert_eq!(msgs.len(), 1);
        let msg = msgs[0];
        assert_eq!((msg.ty, msg.flags, msg.seq), (16, NLM_F_REQUEST | NLM_F_ACK, 42));
        assert_eq!(&msg.payload[..5], &[1, 2, 3, 4, 5]);
        let a = attrs(&msg.payload[8..]).unwrap();
        assert_eq!(a[0], (3, &b"ab\0"[..]));
        // The nest's flag is on the wire and masked off when parsed.
        assert_eq!(
            u16::from_ne_bytes([msg.payload[8 + 8 + 2], msg.payload[8 + 8 + 3]]),
            18 | NLA_F_NESTED
        );
        assert_eq!(a[1].0, 18);
        let inner = attrs(a[1].1).unwrap();
        assert_eq!(inner, [(1, &7u32.to_ne_bytes()[..])]);
        assert_eq!(attr_u32(inner[0].1, 1).unwrap(), 7);
        // `build` is `Msg` with flat attributes and the flags as given.
        let flat = build(5, 0, 9, &[(3, b"ab\0")]);
        assert_eq!(u16::from_ne_bytes([flat[6], flat[7]]), 0);
        assert_eq!(attrs(messages(&flat).unwrap()[0].payload).unwrap(), [(3, &b"ab\0"[..])]);
    }

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        let b = build(5, 0, 1, &[(3, &[1u8; 9])]);
        // Every cut of a message is refused: a length past the end, or
        // bytes that are not a whole header.
        for cut in 1..b.len() {
            assert!(messages(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert!(messages(&b).is_ok());
        // A length shorter than a header.
        let mut short = b.clone();
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(messages(&short).is_err());
        // Attributes: past the end, shorter than a header, trailing bytes.
        assert!(attrs(&[9, 0, 1, 0, 0]).is_err());
        assert!(attrs(&[3, 0, 1, 0]).is_err());
        assert!(attrs(&[4, 0, 1, 0, 0]).is_err());
        assert_eq!(attrs(&[]).unwrap(), []);
        // Values shorter than their type.
        assert!(attr_u32(&[1, 2, 3], 1).is_err());
        assert!(attr_u64(&[1, 2, 3, 4], 1).is_err());
        assert!(error_code(&[0, 0]).is_err());
        assert_eq!(error_code(&(-17i32).to_ne_bytes()).unwrap(), -17);
        assert_eq!(attr_str(b"abc"), "abc");
        assert_eq!(attr_str(b"ab\0c"), "ab");
    }
}
