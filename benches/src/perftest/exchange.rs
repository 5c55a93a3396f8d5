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

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::args::Params;
use super::resources::{Dest, KEY_MSG_SIZE_GID};
use super::stats::BwResult;
use super::PerfError;

/// The protocol greeting.
pub const GREETING: &str = "SOFTVERBS-PERF 1";

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
    partial: String,
}

impl PeerLink {
    /// Waits on `port` (every address, IPv6 and IPv4) for one client.
    ///
    /// # Errors
    ///
    /// Binding or accepting fails.
    pub fn listen(port: u16) -> Result<PeerLink, PerfError> {
        Self::accept(&listener(port)?)
    }

    /// Accepts one client on `l`.
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
        Ok(PeerLink {
            reader: BufReader::new(s),
            partial: String::new(),
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
        s.write_all(line.as_bytes())?;
        s.write_all(b"\n")?;
        Ok(())
    }

    /// Receives one line (blocking).
    ///
    /// # Errors
    ///
    /// The peer closed the connection or the read failed.
    pub fn recv_line(&mut self) -> Result<String, PerfError> {
        self.reader.get_ref().set_nonblocking(false)?;
        self.reader.get_ref().set_read_timeout(None)?;
        loop {
            if let Some(l) = self.read_some()? {
                return Ok(l);
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

    fn read_some(&mut self) -> Result<Option<String>, PerfError> {
        match self.reader.read_line(&mut self.partial) {
            Ok(0) => Err(failed("the peer closed the connection")),
            Ok(_) if self.partial.ends_with('\n') => {
                let line = self.partial.trim_end().to_string();
                self.partial.clear();
                Ok(Some(line))
            }
            Ok(_) => Ok(None),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e.into()),
        }
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
        for _ in 0..n {
            self.reader.read_exact(&mut buf)?;
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
