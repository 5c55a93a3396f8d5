//! The out-of-band exchange between a `--server` and a `--client` over TCP,
//! as perftest does it ("Data ex. method : Ethernet"): the client connects
//! to the server's port (18515 by default), both check they run the same
//! test, then swap one perftest key message per QP (LID, outstanding
//! reads, QPN, PSN, rkey, address, GID), and synchronise before and after
//! each message size.
//!
//! Lines (each ends with `\n`):
//! - `SOFTVERBS-PERF 1 <signature>`: client to server; the server answers
//!   `OK` or `ERR <why>`;
//! - then the client's key messages, then the server's (108 bytes each,
//!   perftest's `KEY_PRINT_FMT_GID`);
//! - `SYNC <size>` from both before a size, `DONE <peak> <avg> <rate>
//!   <count>` (bytes/s, messages/s; `-` when the end measured nothing) from
//!   both after it, and `BYE` at the end.
//!
//! # A server among strangers
//!
//! Anyone who can reach the port can connect. The server therefore takes
//! connections as they come and keeps each one until it has sent its first
//! line ([`accept_first_line`]): one that sends a line that is not a
//! greeting of ours, more than [`MAX_LINE`] bytes without a newline, or
//! nothing for [`GREETING_TIMEOUT`], is dropped with a one-line message
//! on standard error, and the server goes on waiting for its client; a
//! silent connection never delays another. Lines are bounded at
//! [`MAX_LINE`] bytes everywhere, and once the client is in, every read
//! and write on the connection gives up after [`PEER_TIMEOUT`].

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::args::Params;
use super::resources::{Dest, KEY_MSG_SIZE_GID};
use super::stats::BwResult;
use super::PerfError;

/// The protocol greeting.
pub const GREETING: &str = "SOFTVERBS-PERF 1";

pub use softverbs::verbs::exchange::{accept_first_line, GREETING_TIMEOUT, MAX_LINE, MAX_PENDING, PEER_TIMEOUT};

/// What both ends must agree on.
pub fn signature(p: &Params) -> String {
    let sizes: Vec<String> = p.sizes.iter().map(u64::to_string).collect();
    format!(
        "test={} link={} conn={} qps={} duplex={} sizes={} iters={} duration={} post_list={} atomic={}",
        p.test,
        p.link.name(),
        p.connection.name(),
        p.qps,
        u8::from(p.duplex),
        sizes.join(","),
        p.iters,
        p.duration.map_or_else(|| "-".to_string(), |d| d.to_string()),
        p.post_list,
        p.atomic_type.name()
    )
}

fn failed(msg: impl Into<String>) -> PerfError {
    PerfError::Failed(msg.into())
}

/// An I/O error of the connection, said as a timeout when it is one.
fn timed_out(e: io::Error, what: &str) -> PerfError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            failed(format!("{what}: no progress for {} s", PEER_TIMEOUT.as_secs()))
        }
        _ => e.into(),
    }
}

/// At most 80 characters of a stranger's line, for a message.
fn clip(line: &str) -> String {
    line.chars().take(80).collect()
}

/// A listener on `port` of every address: the IPv6 wildcard (which also
/// takes IPv4 clients), or the IPv4 one on a host without IPv6.
fn listener(port: u16) -> Result<TcpListener, PerfError> {
    TcpListener::bind(("::", port))
        .or_else(|e| match e.kind() {
            // Taken: say so, rather than listen on IPv4 alone.
            std::io::ErrorKind::AddrInUse => Err(e),
            _ => TcpListener::bind(("0.0.0.0", port)),
        })
        .map_err(|e| failed(format!("listening on TCP port {port}: {e}")))
}

/// A TCP connection to the other end.
#[derive(Debug)]
pub struct PeerLink {
    reader: BufReader<TcpStream>,
    /// A line read in part (at most [`MAX_LINE`] + 1 bytes).
    partial: Vec<u8>,
    /// The greeting is done (the server checked it when accepting).
    greeted: bool,
}

impl PeerLink {
    /// Waits on `port` (every address, IPv6 and IPv4) for a client of
    /// this test ([`PeerLink::accept_client`]); what is dropped on the
    /// way is said on standard error.
    ///
    /// # Errors
    ///
    /// Binding or accepting fails.
    pub fn listen(port: u16, p: &Params) -> Result<PeerLink, PerfError> {
        Self::accept_client(&listener(port)?, p, None, &mut |m| {
            eprintln!("softverbs: perf {}: {m}", p.test);
        })
    }

    /// Accepts connections on `l` until a client greets us with our test
    /// ([`accept_first_line`]), answers it `OK`, and returns its link. A
    /// client of another test is answered `ERR <why>` and dropped like a
    /// stranger, with a line to `log`.
    ///
    /// # Errors
    ///
    /// The listener fails, or `overall` passes without a client.
    pub fn accept_client(
        l: &TcpListener,
        p: &Params,
        overall: Option<Duration>,
        log: &mut dyn FnMut(&str),
    ) -> Result<PeerLink, PerfError> {
        let ours = signature(p);
        let check = |line: &str, s: &mut TcpStream| {
            let theirs = line
                .strip_prefix(GREETING)
                .map(str::trim)
                .ok_or_else(|| format!("not a softverbs perf client: {:?}", clip(line)))?;
            if theirs != ours {
                let why = format!("client runs `{theirs}`, server `{ours}`");
                let _ = s.write_all(format!("ERR {why}\n").as_bytes());
                return Err(format!("a client of another test: {why}"));
            }
            s.write_all(b"OK\n").map_err(|e| format!("answering OK: {e}"))
        };
        let (s, ()) = accept_first_line(l, GREETING_TIMEOUT, overall, check, log)?;
        let mut link = Self::from_stream(s)?;
        link.greeted = true;
        Ok(link)
    }

    /// Accepts one client on `l`, as it comes (the greeting is then
    /// [`PeerLink::hello_server`]'s).
    ///
    /// # Errors
    ///
    /// Accepting fails.
    pub fn accept(l: &TcpListener) -> Result<PeerLink, PerfError> {
        let (s, _) = l.accept()?;
        Self::from_stream(s)
    }

    /// Connects to `host:port`, retrying for up to 10 seconds while the
    /// server is not listening yet.
    ///
    /// # Errors
    ///
    /// The address does not resolve, or no connection within 10 s.
    pub fn connect(host: &str, port: u16) -> Result<PeerLink, PerfError> {
        let start = Instant::now();
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()
            .map_err(|e| failed(format!("resolving {host}: {e}")))?
            .collect();
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect(a) {
                    Ok(s) => return Self::from_stream(s),
                    Err(e) => last = Some(e),
                }
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(failed(format!(
                    "couldn't connect to {host}:{port}: {}",
                    last.map_or_else(|| "no address".to_string(), |e| e.to_string())
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn from_stream(s: TcpStream) -> Result<PeerLink, PerfError> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(PEER_TIMEOUT))?;
        s.set_write_timeout(Some(PEER_TIMEOUT))?;
        Ok(PeerLink {
            reader: BufReader::new(s),
            partial: Vec::new(),
            greeted: false,
        })
    }

    /// The local address of the connection: the address a device on this
    /// end binds so the peer reaches it the way it reached us.
    ///
    /// # Errors
    ///
    /// The socket has no local address.
    pub fn local_ip(&self) -> Result<std::net::IpAddr, PerfError> {
        // An IPv4 client of the dual-stack listener shows as ::ffff:a.b.c.d.
        Ok(self.reader.get_ref().local_addr()?.ip().to_canonical())
    }

    /// Sends one line.
    ///
    /// # Errors
    ///
    /// The write fails.
    pub fn send_line(&mut self, line: &str) -> Result<(), PerfError> {
        let s = self.reader.get_mut();
        let r = s.write_all(line.as_bytes()).and_then(|()| s.write_all(b"\n"));
        r.map_err(|e| timed_out(e, "sending to the peer"))
    }

    /// Receives one line (blocking, for at most [`PEER_TIMEOUT`]).
    ///
    /// # Errors
    ///
    /// The peer closed the connection, sent nothing for
    /// [`PEER_TIMEOUT`], sent a line longer than [`MAX_LINE`], or the read
    /// failed.
    pub fn recv_line(&mut self) -> Result<String, PerfError> {
        self.reader.get_ref().set_nonblocking(false)?;
        self.reader.get_ref().set_read_timeout(Some(PEER_TIMEOUT))?;
        let deadline = Instant::now() + PEER_TIMEOUT;
        loop {
            if let Some(l) = self.read_some()? {
                return Ok(l);
            }
            if Instant::now() >= deadline {
                return Err(failed(format!(
                    "the peer sent nothing for {} s",
                    PEER_TIMEOUT.as_secs()
                )));
            }
        }
    }

    /// Receives one line if one is already there, without blocking.
    ///
    /// # Errors
    ///
    /// The peer closed the connection or the read failed.
    pub fn try_recv_line(&mut self) -> Result<Option<String>, PerfError> {
        self.reader.get_ref().set_nonblocking(true)?;
        let r = self.read_some();
        self.reader.get_ref().set_nonblocking(false)?;
        r
    }

    /// Takes what is there of the next line: `Some` once it is whole.
    fn read_some(&mut self) -> Result<Option<String>, PerfError> {
        let avail = match self.reader.fill_buf() {
            Ok([]) => return Err(failed("the peer closed the connection")),
            Ok(b) => b,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        };
        let (take, whole) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        // Bounded: a peer that never sends a newline costs us MAX_LINE
        // bytes, not its whole stream.
        if self.partial.len() + take > MAX_LINE + 1 {
            return Err(failed(format!("the peer sent a line longer than {MAX_LINE} bytes")));
        }
        self.partial.extend_from_slice(&avail[..take]);
        self.reader.consume(take);
        if !whole {
            return Ok(None);
        }
        let line = String::from_utf8(std::mem::take(&mut self.partial))
            .map_err(|_| failed("the peer sent a line that is not text"))?;
        Ok(Some(line.trim_end().to_string()))
    }

    /// Client side of the greeting: sends the signature, waits for `OK`.
    ///
    /// # Errors
    ///
    /// The server runs another test (its `ERR` line), or I/O.
    pub fn hello_client(&mut self, p: &Params) -> Result<(), PerfError> {
        self.send_line(&format!("{GREETING} {}", signature(p)))?;
        let answer = self.recv_line()?;
        match answer.strip_prefix("ERR ") {
            Some(why) => Err(failed(format!("the server refused: {why}"))),
            None if answer == "OK" => Ok(()),
            None => Err(failed(format!("unexpected answer from the server: {answer:?}"))),
        }
    }

    /// Server side of the greeting: checks the client's signature against
    /// ours.
    ///
    /// # Errors
    ///
    /// A different test or flags (the client is told why), or I/O.
    pub fn hello_server(&mut self, p: &Params) -> Result<(), PerfError> {
        if self.greeted {
            return Ok(());
        }
        let line = self.recv_line()?;
        let theirs = line
            .strip_prefix(GREETING)
            .map(str::trim)
            .ok_or_else(|| failed(format!("not a softverbs perf client: {line:?}")))?;
        let ours = signature(p);
        if theirs != ours {
            let why = format!("client runs `{theirs}`, server `{ours}`");
            let _ = self.send_line(&format!("ERR {why}"));
            return Err(failed(format!("the client runs another test: {why}")));
        }
        self.send_line("OK")
    }

    /// Sends our key messages.
    ///
    /// # Errors
    ///
    /// I/O.
    pub fn send_dests(&mut self, dests: &[Dest]) -> Result<(), PerfError> {
        let s = self.reader.get_mut();
        for d in dests {
            s.write_all(&d.to_key_msg())?;
        }
        Ok(())
    }

    /// Receives `n` key messages.
    ///
    /// # Errors
    ///
    /// I/O or a malformed message.
    pub fn recv_dests(&mut self, n: usize) -> Result<Vec<Dest>, PerfError> {
        self.reader.get_ref().set_nonblocking(false)?;
        let mut out = Vec::with_capacity(n);
        let mut buf = [0u8; KEY_MSG_SIZE_GID];
        self.reader.get_ref().set_read_timeout(Some(PEER_TIMEOUT))?;
        for _ in 0..n {
            self.reader
                .read_exact(&mut buf)
                .map_err(|e| timed_out(e, "receiving the peer's key messages"))?;
            out.push(Dest::from_key_msg(&buf)?);
        }
        Ok(out)
    }

    /// Exchanges `SYNC <size>` with the peer.
    ///
    /// # Errors
    ///
    /// The peer is at another size, or I/O.
    pub fn sync(&mut self, size: u64) -> Result<(), PerfError> {
        self.send_line(&format!("SYNC {size}"))?;
        let l = self.recv_line()?;
        if l != format!("SYNC {size}") {
            return Err(failed(format!(
                "out of step with the peer: expected SYNC {size}, got {l:?}"
            )));
        }
        Ok(())
    }
}

/// The `DONE` line for a result (or none).
pub fn done_line(r: Option<&BwResult>) -> String {
    match r {
        Some(r) => format!("DONE {} {} {} {}", r.peak_bps, r.avg_bps, r.msg_rate, r.iters),
        None => "DONE - - - 0".to_string(),
    }
}

/// Parses a `DONE` line; `Ok(None)` when the peer measured nothing.
///
/// # Errors
///
/// Not a `DONE` line.
pub fn parse_done(line: &str, size: u64) -> Result<Option<BwResult>, PerfError> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 5 || f[0] != "DONE" {
        return Err(failed(format!("expected DONE from the peer, got {line:?}")));
    }
    if f[1] == "-" {
        return Ok(None);
    }
    let num = |s: &str| s.parse::<f64>().map_err(|_| failed(format!("bad DONE line {line:?}")));
    Ok(Some(BwResult {
        size,
        peak_bps: num(f[1])?,
        avg_bps: num(f[2])?,
        msg_rate: num(f[3])?,
        iters: f[4].parse().map_err(|_| failed(format!("bad DONE line {line:?}")))?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_lines() {
        let r = BwResult {
            size: 8,
            iters: 10,
            peak_bps: 1.5,
            avg_bps: 1.25,
            msg_rate: 3.0,
        };
        assert_eq!(parse_done(&done_line(Some(&r)), 8).unwrap(), Some(r));
        assert_eq!(parse_done(&done_line(None), 8).unwrap(), None);
        assert!(parse_done("SYNC 8", 8).is_err());
    }

    /// Ends on different links could never reach each other (a
    /// shared-memory-only device sends nothing by UDP): the greeting says
    /// so at once, instead of a failed first send half a second later.
    #[test]
    fn ends_on_different_links_are_refused_at_the_greeting() {
        let params =
            |link: &str| super::super::args::testing::params(&["send_lat", "--link", link, "--server"]).unwrap();
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let client = std::thread::spawn(move || {
            let mut c = PeerLink::connect("127.0.0.1", port).unwrap();
            c.hello_client(&params("shm")).map_err(|e| e.to_string())
        });
        let mut server = PeerLink::accept(&l).unwrap();
        let s = server.hello_server(&params("udp")).unwrap_err().to_string();
        assert!(s.contains("link=shm") && s.contains("link=udp"), "{s}");
        let c = client.join().unwrap().unwrap_err();
        assert!(c.contains("the server refused") && c.contains("link=udp"), "{c}");
    }

    fn send_lat() -> Params {
        super::super::args::testing::params(&["send_lat", "--link", "udp", "--server"]).unwrap()
    }

    /// A client of `send_lat` on `port`, in its own thread: its greeting's
    /// outcome arrives on the channel.
    fn good_client(port: u16) -> std::sync::mpsc::Receiver<Result<(), String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = PeerLink::connect("127.0.0.1", port).and_then(|mut c| c.hello_client(&send_lat()));
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
        rx
    }

    /// The server side in its own thread, bounded: the link's greeting
    /// outcome and every line it logged.
    fn server(l: TcpListener) -> std::thread::JoinHandle<(Result<(), String>, Vec<String>)> {
        std::thread::spawn(move || {
            let mut logged = Vec::new();
            let r = PeerLink::accept_client(&l, &send_lat(), Some(Duration::from_secs(60)), &mut |m| {
                logged.push(m.to_string())
            });
            (r.map(|_| ()).map_err(|e| e.to_string()), logged)
        })
    }

    /// A connection that streams bytes without a newline and stays open
    /// neither grows the server (a line is at most MAX_LINE bytes) nor
    /// keeps it from the real client that comes next (before: `read_line`
    /// without a bound took all of it, and the server never answered
    /// anyone else).
    #[test]
    fn a_garbage_connection_is_dropped_and_the_client_served() {
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let server = server(l);
        let mut garbage = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // Two lines' worth, no newline (it fits the socket buffers), and
        // the connection held open. The client starts only once the
        // server has closed this one: had it started earlier, the server
        // could serve it first and drop this one for that, whatever it
        // had sent, as a loaded machine schedules it.
        garbage.write_all(&[b'x'; 2 * MAX_LINE]).unwrap();
        garbage.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        match garbage.read(&mut [0u8; 1]) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("the server kept the garbage connection: {other:?}"),
        }
        let client = good_client(port);
        let got = client.recv_timeout(Duration::from_secs(30));
        assert_eq!(got, Ok(Ok(())), "the real client was not served");
        let (r, logged) = server.join().unwrap();
        assert_eq!(r, Ok(()));
        assert!(
            logged
                .iter()
                .any(|m| m.contains("more than 4096 bytes without a newline")),
            "{logged:?}"
        );
    }

    /// A connection that says nothing does not keep the server from the
    /// client that comes after it (before: the server read the first
    /// connection's line forever); a stranger's line and a client of
    /// another test are dropped too, each with a line saying so.
    #[test]
    fn silent_and_wrong_connections_do_not_block_the_client() {
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let server = server(l);
        let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut stranger = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stranger.write_all(b"GET / HTTP/1.0\r\n").unwrap();
        let other = std::thread::spawn(move || {
            let p = super::super::args::testing::params(&["send_bw", "--link", "udp", "--server"]).unwrap();
            let mut c = PeerLink::connect("127.0.0.1", port).unwrap();
            c.hello_client(&p).map_err(|e| e.to_string())
        });
        let refused = other.join().unwrap().unwrap_err();
        assert!(refused.contains("the server refused"), "{refused}");
        let client = good_client(port);
        assert_eq!(client.recv_timeout(Duration::from_secs(30)), Ok(Ok(())));
        let (r, logged) = server.join().unwrap();
        assert_eq!(r, Ok(()));
        let all = logged.join("\n");
        assert!(all.contains("not a softverbs perf client: \"GET / HTTP/1.0\""), "{all}");
        assert!(all.contains("a client of another test"), "{all}");
        assert!(all.contains("another client came first"), "{all}: the silent one");
        assert!(logged.iter().all(|m| !m.contains('\n')), "one line each: {logged:?}");
    }

    /// A connection that sends nothing is dropped after the greeting
    /// time, and the server goes on; with an overall bound and no client,
    /// it gives up.
    #[test]
    fn a_silent_connection_times_out() {
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut logged = Vec::new();
        let r = accept_first_line(
            &l,
            Duration::from_millis(200),
            Some(Duration::from_secs(2)),
            |_, _| Ok(()),
            &mut |m| logged.push(m.to_string()),
        );
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(logged[0].contains("no line within 200ms"), "{logged:?}");
    }

    /// After the greeting, a line without an end is refused at MAX_LINE
    /// bytes, not read on for ever.
    #[test]
    fn an_endless_line_after_the_greeting_is_refused() {
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let server = server(l);
        let mut c = PeerLink::connect("127.0.0.1", port).unwrap();
        c.hello_client(&send_lat()).unwrap();
        assert_eq!(server.join().unwrap().0, Ok(()));
        // Our own end reads what the peer sends: a fresh pair.
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let _ = s.write_all(&vec![b'y'; 3 * MAX_LINE]);
            s
        });
        let mut link = PeerLink::accept(&l).unwrap();
        let e = link.recv_line().unwrap_err().to_string();
        assert!(e.contains("longer than 4096 bytes"), "{e}");
        drop(peer.join().unwrap());
    }

    /// The server reaches IPv4 and IPv6 clients alike, and the address its
    /// device binds is the one the client used (IPv4 as such, not mapped).
    #[test]
    fn the_server_takes_ipv4_and_ipv6_clients() {
        let l = listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let v6 = l.local_addr().unwrap().is_ipv6();
        let mut hosts = vec!["127.0.0.1"];
        if v6 {
            hosts.push("::1");
        } else {
            println!("skip: no IPv6 on this host; the IPv4 client only");
        }
        for host in hosts {
            let client = std::thread::spawn(move || PeerLink::connect(host, port).map(|c| c.local_ip().unwrap()));
            let server = PeerLink::accept(&l).unwrap();
            let want: std::net::IpAddr = host.parse().unwrap();
            assert_eq!(server.local_ip().unwrap(), want);
            assert_eq!(client.join().unwrap().unwrap(), want);
        }
    }
}
