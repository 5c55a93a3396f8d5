//! A small out-of-band exchange over TCP: what `softverbs pingpong` and
//! `softverbs perf` use to swap [`Endpoint`]s before RDMA traffic can
//! flow, made public.
//!
//! - [`serve`] / [`connect`]: one line each way, `SOFTVERBS-ENDPOINT 1`
//!   followed by the endpoint's text form; each side gets the other's
//!   [`Endpoint`] and the TCP stream (for whatever else the two want to
//!   say, e.g. "done").
//! - [`accept_first_line`]: the server's accept loop for a port anyone can
//!   reach, which the CLIs build their own protocols on.
//!
//! # A server among strangers
//!
//! Anyone who can reach the port can connect. The server therefore takes
//! connections as they come and keeps each one until it has sent its first
//! line ([`accept_first_line`]): one that sends a line that is not a
//! greeting of ours, more than [`MAX_LINE`] bytes without a newline, or
//! nothing for [`GREETING_TIMEOUT`], is dropped with a one-line message
//! to the caller's log, and the server goes on waiting for its client; a
//! silent connection never delays another. Lines are bounded at
//! [`MAX_LINE`] bytes everywhere, and once the client is in, every read
//! and write on the connection gives up after [`PEER_TIMEOUT`].
//!
//! # Examples
//!
//! ```
//! use std::net::TcpListener;
//! use std::time::Duration;
//! use softverbs::verbs::exchange;
//! # use softverbs::verbs::{Endpoint, Gid, Mtu};
//! # let ep = |qpn| Endpoint { qpn, psn: 1, gid: Gid::ZERO, gid_index: 0, port: 1, lid: 0,
//! #     mtu: Mtu::Mtu1024, qkey: 0, buffer: None };
//! let (server_ep, client_ep) = (ep(17), ep(18));
//! let l = TcpListener::bind("127.0.0.1:0")?;
//! let addr = l.local_addr()?;
//! let client = std::thread::spawn(move || exchange::connect(addr, &client_ep, Duration::from_secs(10)));
//! let (_stream, theirs) = exchange::serve(&l, &server_ep, None, &mut |m| eprintln!("{m}"))?;
//! assert_eq!(theirs.qpn, 18);
//! assert_eq!(client.join().unwrap()?.1.qpn, 17);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::connect::Endpoint;

/// The greeting of [`serve`] and [`connect`] (the endpoint's text form
/// follows it on the line).
pub const GREETING: &str = "SOFTVERBS-ENDPOINT 1";

/// Longest line of the exchange, newline excluded (a greeting with every
/// size of `-a` is about 300 bytes).
pub const MAX_LINE: usize = 4096;
/// How long a new connection may take to send its first line.
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read or write on a client's connection may block (no
/// message of the exchange waits longer for a live peer: each end's run
/// of a size stops on its own after 20 s without progress).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// Most connections waiting for their first line at once; beyond, the
/// oldest is dropped.
pub const MAX_PENDING: usize = 64;

/// A connection waiting for its first line.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
}

/// The first line of a connection, if it has arrived whole: read without
/// blocking and without taking anything past its newline (the rest stays
/// in the socket for the protocol). `Err`: why the connection is no good.
fn first_line(s: &TcpStream) -> Result<Option<String>, String> {
    let mut buf = [0u8; MAX_LINE + 2];
    let n = match s.peek(&mut buf) {
        Ok(0) => return Err("closed before its first line".into()),
        Ok(n) => n,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let Some(end) = buf[..n].iter().position(|&b| b == b'\n') else {
        return match n > MAX_LINE {
            true => Err(format!("more than {MAX_LINE} bytes without a newline")),
            false => Ok(None),
        };
    };
    if end > MAX_LINE {
        return Err(format!("more than {MAX_LINE} bytes without a newline"));
    }
    let mut line = vec![0u8; end + 1];
    // The bytes are in the socket (peeked): this read takes them at once.
    (&*s).read_exact(&mut line).map_err(|e| e.to_string())?;
    line.truncate(end);
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line)
        .map_err(|_| "a first line that is not text".to_string())
        .map(Some)
}

/// Accepts connections on `l` until one sends a first line that `check`
/// takes, and returns that connection (blocking again, with nothing read
/// past the line) and what `check` made of the line.
///
/// Connections are served side by side: each has `greeting` (usually
/// [`GREETING_TIMEOUT`]) to send its line, at most [`MAX_PENDING`] wait at once, and a line is
/// at most [`MAX_LINE`] bytes. A connection that fails any of this, or
/// whose line `check` refuses (`Err(why)`; `check` may answer on the
/// stream first), is dropped and `log` gets one line saying who and why.
/// The listener is polled every few milliseconds; it is left blocking.
///
/// # Errors
///
/// The listener fails, or `overall` passes without a client.
pub fn accept_first_line<T>(
    l: &TcpListener,
    greeting: Duration,
    overall: Option<Duration>,
    mut check: impl FnMut(&str, &mut TcpStream) -> Result<T, String>,
    log: &mut dyn FnMut(&str),
) -> io::Result<(TcpStream, T)> {
    l.set_nonblocking(true)?;
    let r = accept_loop(l, greeting, overall, &mut check, log);
    let restored = l.set_nonblocking(false);
    let (s, t) = r?;
    restored?;
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(PEER_TIMEOUT))?;
    s.set_write_timeout(Some(PEER_TIMEOUT))?;
    Ok((s, t))
}

fn accept_loop<T>(
    l: &TcpListener,
    greeting: Duration,
    overall: Option<Duration>,
    check: &mut impl FnMut(&str, &mut TcpStream) -> Result<T, String>,
    log: &mut dyn FnMut(&str),
) -> io::Result<(TcpStream, T)> {
    let start = Instant::now();
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        loop {
            match l.accept() {
                Ok((stream, peer)) => {
                    if pending.len() >= MAX_PENDING {
                        let old = pending.remove(0);
                        log(&format!(
                            "dropped connection from {}: {MAX_PENDING} connections waiting",
                            old.peer
                        ));
                    }
                    stream.set_nonblocking(true)?;
                    pending.push(Pending {
                        stream,
                        peer,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A connection reset before we took it, a signal: go on.
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(e),
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let verdict = match first_line(&pending[i].stream) {
                Ok(Some(line)) => {
                    let mut p = pending.swap_remove(i);
                    // `check` may answer: blocking, with a bound.
                    p.stream.set_nonblocking(false)?;
                    p.stream.set_write_timeout(Some(GREETING_TIMEOUT))?;
                    match check(&line, &mut p.stream) {
                        Ok(t) => {
                            for other in pending {
                                log(&format!(
                                    "dropped connection from {}: another client came first",
                                    other.peer
                                ));
                            }
                            return Ok((p.stream, t));
                        }
                        Err(why) => log(&format!("dropped connection from {}: {why}", p.peer)),
                    }
                    continue;
                }
                Ok(None) if pending[i].since.elapsed() < greeting => None,
                Ok(None) => Some(format!("no line within {greeting:?}")),
                Err(why) => Some(why),
            };
            match verdict {
                Some(why) => {
                    let p = pending.swap_remove(i);
                    log(&format!("dropped connection from {}: {why}", p.peer));
                }
                None => i += 1,
            }
        }
        if overall.is_some_and(|o| start.elapsed() >= o) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no client completed the greeting in time",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// One line of at most [`MAX_LINE`] bytes (newline and a trailing `\r`
/// removed), read a byte at a time so nothing past it is taken from the
/// stream.
///
/// # Errors
///
/// The peer closed the connection, sent a longer line or one that is not
/// text, or the read failed or timed out (the stream's read timeout).
pub fn read_line(s: &mut TcpStream) -> io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8];
    loop {
        match s.read(&mut b) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ))
            }
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) if line.len() == MAX_LINE => {
                return Err(invalid(format!("the peer sent a line longer than {MAX_LINE} bytes")))
            }
            Ok(_) => line.push(b[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| invalid("the peer sent a line that is not text".into()))
}

fn endpoint_of(line: &str) -> Result<Endpoint, String> {
    let text = line
        .strip_prefix(GREETING)
        .and_then(|t| t.strip_prefix(' '))
        .ok_or_else(|| format!("not an endpoint line: {:?}", line.chars().take(80).collect::<String>()))?;
    text.parse().map_err(|e| format!("{e}"))
}

/// Server side: waits on `l` for a client that sends its endpoint
/// ([`accept_first_line`], with [`GREETING_TIMEOUT`] per connection and
/// `overall` for the whole wait, `None`: forever), answers with `local`,
/// and returns the connection and the client's endpoint. Strangers are
/// dropped with a line to `log`.
///
/// # Errors
///
/// The listener fails, `overall` passes without a client, or the answer
/// cannot be sent.
pub fn serve(
    l: &TcpListener,
    local: &Endpoint,
    overall: Option<Duration>,
    log: &mut dyn FnMut(&str),
) -> io::Result<(TcpStream, Endpoint)> {
    let check = |line: &str, s: &mut TcpStream| {
        let theirs = endpoint_of(line)?;
        s.write_all(format!("{GREETING} {local}\n").as_bytes())
            .map_err(|e| format!("answering: {e}"))?;
        Ok(theirs)
    };
    accept_first_line(l, GREETING_TIMEOUT, overall, check, log)
}

/// Client side: connects to `addr` (retrying while nobody listens, for up
/// to `timeout`), sends `local`, and returns the connection (with
/// [`PEER_TIMEOUT`] on reads and writes) and the server's endpoint.
///
/// # Errors
///
/// No connection within `timeout`, I/O errors, or an answer that is not an
/// endpoint line (`InvalidData`).
pub fn connect(addr: impl ToSocketAddrs, local: &Endpoint, timeout: Duration) -> io::Result<(TcpStream, Endpoint)> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let start = Instant::now();
    let mut s = 'retry: loop {
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => break 'retry s,
                Err(e) => last = Some(e),
            }
        }
        if start.elapsed() >= timeout {
            return Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address to connect to")));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(PEER_TIMEOUT))?;
    s.set_write_timeout(Some(PEER_TIMEOUT))?;
    s.write_all(format!("{GREETING} {local}\n").as_bytes())?;
    let line = read_line(&mut s)?;
    let theirs = endpoint_of(&line).map_err(invalid)?;
    Ok((s, theirs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{Gid, Mtu};

    fn ep(qpn: u32) -> Endpoint {
        Endpoint {
            qpn,
            psn: 7,
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            gid_index: 0,
            port: 1,
            lid: 0,
            mtu: Mtu::Mtu4096,
            qkey: 0,
            buffer: None,
        }
    }

    /// A stranger that connects first and says nothing, and one that sends
    /// junk, do not keep the real client out; both are logged.
    #[test]
    fn strangers_are_dropped_and_the_client_gets_through() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        let mut junk = TcpStream::connect(addr).unwrap();
        junk.write_all(b"GET / HTTP/1.0\n").unwrap();
        let client = std::thread::spawn(move || connect(addr, &ep(2), Duration::from_secs(20)).unwrap().1);
        let mut logged = Vec::new();
        let (_s, theirs) = serve(&l, &ep(1), Some(Duration::from_secs(60)), &mut |m| {
            logged.push(m.to_string())
        })
        .unwrap();
        assert_eq!(theirs, ep(2));
        assert_eq!(client.join().unwrap(), ep(1));
        assert!(logged.iter().any(|m| m.contains("not an endpoint line")), "{logged:?}");
    }

    #[test]
    fn a_bad_answer_is_invalid_data() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let _ = read_line(&mut s);
            s.write_all(b"SOFTVERBS-ENDPOINT 1 qpn=1\n").unwrap();
        });
        let e = connect(addr, &ep(2), Duration::from_secs(20)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        server.join().unwrap();
    }
}
