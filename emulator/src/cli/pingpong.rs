//! `softverbs pingpong`: RC ping-pong between two processes or hosts, like
//! rdma-core's `ibv_rc_pingpong`, over a soft device on the UDP link (or
//! any device named with `-d`, hardware included). Between two processes
//! on one host the soft devices can talk through shared memory: `--link
//! auto` uses it when the peer offers it and UDP otherwise, `--link shm`
//! uses shared memory only, `--link udp` (the default, what captures see)
//! UDP only.
//!
//! ```text
//! server$ softverbs pingpong
//! client$ softverbs pingpong SERVER
//!   local address:  LID 0x0000, QPN 0x000011, PSN 0x1a2b3c, GID fd73:7665:7262:4:0:8a01:7f00:1
//!   remote address: LID 0x0000, QPN 0x000011, PSN 0x4d5e6f, GID fd73:7665:7262:4:0:9c44:7f00:1
//! 8192000 bytes in 0.05 seconds = 1310.72 Mbit/sec
//! 1000 iters in 0.05 seconds = 50.00 usec/iter
//! latency (half round trip, usec): min 20.1 median 24.3 avg 25.0 p99 41.2 max 80.3
//! ```
//!
//! The flags are `ibv_rc_pingpong`'s (`-p -d -i -s -m -r -n -e -g`, GIDs
//! printed as `inet_ntop` writes them; `-c` checks every received
//! message); its `-l -o -O -P -t -j -N` are accepted and said on standard
//! error to have no effect here. A flag given twice takes its last value.
//! softverbs' own options are long only (`--tx-depth`, `--op`, …).
//!
//! The two sides exchange `(QPN, PSN, GID)` (and, for `--op write`, the
//! buffer's address and rkey) over TCP, exactly as with hardware; each
//! creates its UDP device on the address its TCP connection uses (or
//! `--bind`), so the same command works on one host and between hosts.
//!
//! `--op send` (default): the client sends `--size` bytes, the server
//! answers with as many, `--iters` times; both print bandwidth and
//! usec/iter as `ibv_rc_pingpong` does, the client also the distribution
//! of half round trips. `--op write`: the client streams `--iters` RDMA
//! WRITEs of `--size` bytes (`--tx-depth` in flight) into the server's
//! buffer and prints the bandwidth; the server stays passive (with
//! `--engine inline` it polls to make progress; `--engine thread` lets a
//! progress thread answer while it blocks on TCP).
//!
//! The server takes connections side by side until one sends a valid
//! address line: a connection that sends anything else, more than 4096
//! bytes without a newline, or nothing for 10 s is dropped with one line
//! on standard error, and the server goes on waiting (the perf exchange's
//! [`accept_first_line`]). Every line of the exchange is bounded, and
//! reads and writes give up after 60 s; only the passive end of `--op
//! write` waits as long as the client's stream runs, looking at the
//! connection every millisecond.

mod args;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::engine::EngineMode;
use softverbs::soft::link::shm::ShmMode;
use softverbs::soft::link::udp::{GsoMode, InjectedLoss, UdpConfig, UdpPort};
use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::exchange::{accept_first_line, GREETING_TIMEOUT, MAX_LINE, PEER_TIMEOUT};
use softverbs::verbs::{
    AccessFlags, CompChannel, Connect, Context, Cq, Device, Endpoint, Error, Gid, Mr, Mtu, Pd, Qp, QpCap, QpInitAttr,
    QpType, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion,
};

use super::{eprintln_safe, stats, CliError, Env};
pub use args::{Args, Connected, Engine, Gso, LinkKind, NoEffectArgs, Op};

/// A failure: printed here, exit status 3.
fn fail(msg: impl std::fmt::Display) -> CliError {
    eprintln_safe(&format!("softverbs: pingpong: {msg}"));
    CliError::Reported(3)
}

/// A usage error: printed here, exit status 2.
fn usage(msg: impl std::fmt::Display) -> CliError {
    eprintln_safe(&format!("softverbs: pingpong: {msg}"));
    CliError::Reported(2)
}

/// A GID as `ibv_rc_pingpong` prints it (`inet_ntop`): `::ffff:127.0.0.1`,
/// `fe80::1`.
pub fn gid_text(gid: &Gid) -> String {
    std::net::Ipv6Addr::from(gid.0).to_string()
}

/// The byte at offset `i` of a `-c` message: not constant, so that a
/// message landing at the wrong offset or cut short is seen.
fn chk_pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add((i >> 8) as u8)
}

fn verbs_fail(what: &str) -> impl FnOnce(Error) -> CliError + '_ {
    move |e| fail(format!("{what}: {e}"))
}

/// What each side tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    qpn: u32,
    psn: u32,
    gid: Gid,
    addr: u64,
    rkey: u32,
}

impl Dest {
    fn line(&self) -> String {
        let gid: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "SVPP1 {:06x} {:06x} {gid} {:016x} {:08x}\n",
            self.qpn, self.psn, self.addr, self.rkey
        )
    }

    fn parse(line: &str) -> Option<Dest> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 6 || f[0] != "SVPP1" || f[3].len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[3].get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Dest {
            qpn: u32::from_str_radix(f[1], 16).ok()?,
            psn: u32::from_str_radix(f[2], 16).ok()? & 0xff_ffff,
            gid: Gid(gid),
            addr: u64::from_str_radix(f[4], 16).ok()?,
            rkey: u32::from_str_radix(f[5], 16).ok()?,
        })
    }
}

struct Oob {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Oob {
    fn new(s: TcpStream) -> Result<Oob, CliError> {
        let _ = s.set_nodelay(true);
        let tcp = |e: std::io::Error| fail(format!("TCP: {e}"));
        s.set_read_timeout(Some(PEER_TIMEOUT)).map_err(tcp)?;
        s.set_write_timeout(Some(PEER_TIMEOUT)).map_err(tcp)?;
        let writer = s.try_clone().map_err(tcp)?;
        Ok(Oob {
            reader: BufReader::new(s),
            writer,
        })
    }

    fn send(&mut self, line: &str) -> Result<(), CliError> {
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| fail(format!("sending to the peer: {}", timeout_said(&e))))
    }

    /// One line (with its newline), of at most [`MAX_LINE`] bytes, within
    /// [`PEER_TIMEOUT`].
    fn recv(&mut self) -> Result<String, CliError> {
        let mut line = String::new();
        match (&mut self.reader).take(MAX_LINE as u64 + 1).read_line(&mut line) {
            Ok(0) => Err(fail("the peer closed the connection")),
            Ok(_) if line.ends_with('\n') => Ok(line),
            Ok(n) if n > MAX_LINE => Err(fail(format!("the peer sent a line longer than {MAX_LINE} bytes"))),
            Ok(_) => Err(fail("the peer closed the connection within a line")),
            Err(e) => Err(fail(format!("reading from the peer: {}", timeout_said(&e)))),
        }
    }

    /// Whether the peer sent a line (or closed), without blocking.
    fn poll_line(&mut self) -> Result<bool, CliError> {
        if !self.reader.buffer().is_empty() {
            return Ok(true);
        }
        let s = self.reader.get_ref();
        s.set_nonblocking(true).map_err(|e| fail(format!("TCP: {e}")))?;
        let mut b = [0u8; 1];
        let r = s.peek(&mut b);
        s.set_nonblocking(false).map_err(|e| fail(format!("TCP: {e}")))?;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(fail(format!("reading from the peer: {e}"))),
        }
    }
}

/// An I/O error of the connection, said as a timeout when it is one.
fn timeout_said(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no progress for {} s", PEER_TIMEOUT.as_secs())
        }
        _ => e.to_string(),
    }
}

/// Waits on `listener` for a client whose first line is an address line
/// ([`accept_first_line`]); returns its connection and its address.
fn accept_client(listener: &TcpListener) -> Result<(TcpStream, Dest), CliError> {
    let check = |line: &str, _: &mut TcpStream| {
        Dest::parse(line).ok_or_else(|| {
            let shown: String = line.chars().take(80).collect();
            format!("not a pingpong address line: {shown:?}")
        })
    };
    let log = &mut |m: &str| eprintln_safe(&format!("softverbs: pingpong: {m}"));
    accept_first_line(listener, GREETING_TIMEOUT, None, check, log).map_err(|e| fail(format!("accept: {e}")))
}

fn connect(server: &str, port: u16, timeout: Duration) -> Result<TcpStream, CliError> {
    let start = Instant::now();
    let addrs: Vec<SocketAddr> = (server, port)
        .to_socket_addrs()
        .map_err(|e| fail(format!("resolving {server}: {e}")))?
        .collect();
    loop {
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        if start.elapsed() >= timeout {
            let e = last.map_or("no address".to_string(), |e| e.to_string());
            return Err(fail(format!("connecting to {server}:{port}: {e}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port the device may be told to use: the peer takes a datagram from
/// a port in RoCEv2's source-port range (0xC000-0xFFFF) for one from a
/// standard GID, not the private GID such a device announces, and would
/// drop every packet as from the wrong source.
fn check_udp_port(p: u16) -> Result<(), String> {
    match p {
        0xc000..=0xffff => Err(format!(
            "--udp-port {p}: 49152-65535 is RoCEv2's source-port range, where a peer cannot tell our GID; use 4791 or a \
             port below 49152"
        )),
        _ => Ok(()),
    }
}

fn mtu_of(m: u32) -> Result<Mtu, CliError> {
    Ok(match m {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => return Err(usage(format!("MTU {m} is not one of 256, 512, 1024, 2048, 4096"))),
    })
}

/// Runs the server or the client.
///
/// # Errors
///
/// [`CliError::Reported`] (status 3, message already on standard error)
/// when the exchange, the device or a verb fails;
/// [`CliError::NotFound`] for an unknown `-d` device.
pub fn run(env: &Env, args: &Args, out: &mut dyn Write) -> Result<(), CliError> {
    let mtu = mtu_of(args.mtu)?;
    for n in args.no_effect.notes() {
        eprintln_safe(&format!("softverbs: pingpong: {n}"));
    }
    // Before any device (and its threads): SIGUSR1 prints the counters.
    let _usr1 = stats::OnSignal::start("softverbs: pingpong");
    // The parser refuses --iters, --rx-depth and --tx-depth of 0.
    if let Some(p) = args.udp_port {
        check_udp_port(p).map_err(usage)?;
    }
    // A server told its address creates its device first, so that a client
    // on the same host cannot take the port it asked for in the meantime.
    let early = match (&args.server, args.bind) {
        (None, Some(ip)) => Some(open_device(env, args, ip)?),
        _ => None,
    };
    let (stream, first) = match &args.server {
        Some(server) => (
            connect(server, args.port, Duration::from_secs(args.connect_timeout))?,
            None,
        ),
        None => {
            let listen = SocketAddr::new(
                args.bind.unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
                args.port,
            );
            let listener = TcpListener::bind(listen)
                .or_else(|e| {
                    // No IPv6 on this host: the IPv4 wildcard.
                    if args.bind.is_none() {
                        TcpListener::bind(SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), args.port))
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| fail(format!("listening on {listen}: {e}")))?;
            let (stream, remote) = accept_client(&listener)?;
            (stream, Some(remote))
        }
    };
    let local_ip = match args.bind {
        Some(ip) => ip,
        None => {
            let ip = stream.local_addr().map_err(|e| fail(format!("TCP: {e}")))?.ip();
            // An IPv4 client reaching an IPv6 wildcard listener.
            match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            }
        }
    };
    let mut oob = Oob::new(stream)?;
    let (device, soft) = match early {
        Some(d) => d,
        None => open_device(env, args, local_ip)?,
    };
    let res = Resources::new(&device, args, mtu)?;
    let report = res.exchange_and_run(args, mtu, &mut oob, first, out);
    if let Some(d) = &soft {
        if args.stats {
            let mut s = stats::counter_lines(d);
            for p in d.shared().link_peers() {
                s.push_str(&format!("  peer: {p}\n"));
            }
            let _ = write!(out, "counters of {}:\n{s}", d.name());
        }
        // What was dropped is said after every run, asked or not.
        if let Some(l) = stats::drop_line(d) {
            eprintln_safe(&format!("softverbs: pingpong: {l}"));
        }
    }
    drop(res);
    if let Some(d) = soft {
        d.remove();
    }
    report
}

fn open_device(env: &Env, args: &Args, local_ip: IpAddr) -> Result<(Device, Option<Arc<SoftDevice>>), CliError> {
    if let Some(name) = &args.device {
        let d = env.device(Some(env.global.backend()), name)?;
        return Ok((d, None));
    }
    let mut udp = UdpConfig::new(local_ip);
    udp.port = args.udp_port.map_or(UdpPort::Auto, UdpPort::Fixed);
    udp.gso = match args.gso {
        Gso::Auto => GsoMode::Auto,
        Gso::On => GsoMode::On,
        Gso::Off => GsoMode::Off,
    };
    udp.connect = args.connected == Connected::Auto;
    if let Some(p) = args.drop {
        let loss = InjectedLoss::new(p, u64::from(std::process::id())).map_err(|e| usage(format!("--drop: {e}")))?;
        udp.drop = Some(loss);
    }
    let name = format!("softverbs_udp{}", std::process::id());
    let mut cfg = match args.link {
        LinkKind::Udp => SoftDeviceConfig::udp(&name, udp),
        LinkKind::Auto => SoftDeviceConfig::udp_shm(&name, udp, ShmMode::Auto),
        LinkKind::Shm => SoftDeviceConfig::udp_shm(&name, udp, ShmMode::Only),
    }
    .map_err(verbs_fail("creating the UDP device"))?;
    cfg.recovery = args.recovery;
    cfg.engine = match args.engine {
        Engine::Inline => EngineMode::Inline,
        Engine::Thread => EngineMode::ProgressThread {
            spin: Duration::from_micros(args.spin_us),
        },
    };
    let dev = SoftDevice::create(cfg).map_err(verbs_fail("creating the UDP device"))?;
    // The ping-pong loop keeps calling verbs until it is done, so holding
    // ACKs back for coalescing is safe here and saves a datagram per turn.
    dev.shared().set_ack_coalescing(true);
    Ok((dev.device(), Some(dev)))
}

struct Resources {
    _ctx: Context,
    channel: Option<CompChannel>,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    _pd: Pd,
    gid: Gid,
    psn: u32,
}

const RECV_WRID: u64 = 1 << 62;

/// What a ping-pong side waits for: its signaled sends not completed yet,
/// and the peer's messages received but not yet answered or counted.
#[derive(Debug, Default)]
struct Outstanding {
    sends: u32,
    recvs: u32,
}

impl Resources {
    fn new(device: &Device, args: &Args, _mtu: Mtu) -> Result<Resources, CliError> {
        let ctx = device.open().map_err(verbs_fail("opening the device"))?;
        let pd = ctx.alloc_pd().map_err(verbs_fail("ibv_alloc_pd"))?;
        let channel = if args.events {
            Some(
                ctx.create_comp_channel()
                    .map_err(verbs_fail("ibv_create_comp_channel"))?,
            )
        } else {
            None
        };
        let depth = args.rx_depth + args.tx_depth + 1;
        let cq = ctx
            .create_cq(depth, 0, channel.as_ref(), 0)
            .map_err(verbs_fail("ibv_create_cq"))?;
        let attr = ctx.query_device().map_err(verbs_fail("ibv_query_device"))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: args.tx_depth.max(2),
                    max_recv_wr: args.rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: attr.max_inline_data.min(64),
                },
                sq_sig_all: false,
            })
            .map_err(verbs_fail("ibv_create_qp"))?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = pd
            .alloc_mr(args.size.max(1) as usize, access)
            .map_err(verbs_fail("ibv_reg_mr"))?;
        if args.ib_port > attr.phys_port_cnt {
            return Err(CliError::NotFound(format!(
                "{}: port {} does not exist (the device has {} port{})",
                device.name(),
                args.ib_port,
                attr.phys_port_cnt,
                if attr.phys_port_cnt == 1 { "" } else { "s" }
            )));
        }
        let gid = ctx
            .query_gid(args.ib_port, u32::from(args.gid_index))
            .map_err(|e| CliError::NotFound(format!("{}: no GID index {}: {e}", device.name(), args.gid_index)))?;
        // A PSN that differs between runs and processes, as rc_pingpong's
        // lrand48() does.
        let t = std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.subsec_nanos());
        let psn = (t ^ std::process::id().wrapping_mul(0x9e37_79b9)) & 0xff_ffff;
        Ok(Resources {
            _ctx: ctx,
            channel,
            cq,
            qp,
            mr,
            _pd: pd,
            gid,
            psn,
        })
    }

    fn post_recv(&self, size: u32) -> Result<(), CliError> {
        let sge = [self.mr.sge(0, size).map_err(verbs_fail("sge"))?];
        self.qp
            .post_recv(&[RecvWr::new(RECV_WRID, &sge)])
            .map_err(|e| fail(format!("ibv_post_recv: {}", e.error)))
    }

    /// This side as the peer sees it.
    fn endpoint(&self, args: &Args, mtu: Mtu) -> Endpoint {
        Endpoint {
            qpn: self.qp.qp_num(),
            psn: self.psn,
            gid: self.gid,
            gid_index: args.gid_index,
            port: 1,
            lid: 0,
            mtu,
            qkey: 0,
            buffer: None,
        }
    }

    /// ibv_rc_pingpong's attributes: remote write only, one READ each way,
    /// RNR timer 12, `--qp-timeout`.
    fn opts(args: &Args, mtu: Mtu) -> Connect {
        Connect::new()
            .access(AccessFlags::REMOTE_WRITE)
            .mtu(mtu)
            .timeout(args.qp_timeout)
            .max_rd_atomic(1)
            .max_dest_rd_atomic(1)
    }

    /// RESET->INIT, so receives can be posted before the exchange.
    fn to_init(&self, args: &Args, mtu: Mtu) -> Result<(), CliError> {
        Self::opts(args, mtu)
            .init(&self._ctx, &self.qp, &self.endpoint(args, mtu))
            .map_err(verbs_fail("modify QP to INIT"))
    }

    fn connect(&self, args: &Args, mtu: Mtu, remote: &Dest) -> Result<(), CliError> {
        let peer = Endpoint {
            qpn: remote.qpn,
            psn: remote.psn,
            gid: remote.gid,
            ..self.endpoint(args, mtu)
        };
        Self::opts(args, mtu)
            .apply(&self._ctx, &self.qp, &self.endpoint(args, mtu), Some(&peer))
            .map_err(verbs_fail("modify QP to RTS"))
    }

    /// `first`: the client's address, which the server took when it
    /// accepted the connection.
    fn exchange_and_run(
        &self,
        args: &Args,
        mtu: Mtu,
        oob: &mut Oob,
        first: Option<Dest>,
        out: &mut dyn Write,
    ) -> Result<(), CliError> {
        self.to_init(args, mtu)?;
        if args.op == Op::Send {
            for _ in 0..args.rx_depth {
                self.post_recv(args.size)?;
            }
        }
        if let Some(ch) = &self.channel {
            let _ = ch;
            self.cq.req_notify(false).map_err(verbs_fail("ibv_req_notify_cq"))?;
        }
        let local = Dest {
            qpn: self.qp.qp_num(),
            psn: self.psn,
            gid: self.gid,
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
        };
        let client = args.server.is_some();
        // The client speaks first, as rc_pingpong does.
        let remote = if client {
            oob.send(&local.line())?;
            Dest::parse(&oob.recv()?)
        } else {
            let r = match first {
                Some(d) => Some(d),
                None => Dest::parse(&oob.recv()?),
            };
            oob.send(&local.line())?;
            r
        }
        .ok_or_else(|| fail("the peer sent a malformed address line"))?;
        self.connect(args, mtu, &remote)?;
        writeln!(
            out,
            "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            local.qpn,
            local.psn,
            gid_text(&local.gid)
        )?;
        writeln!(
            out,
            "  remote address: LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            remote.qpn,
            remote.psn,
            gid_text(&remote.gid)
        )?;
        // Both QPs are ready (and the server's receives posted) before the
        // first packet.
        oob.send("READY\n")?;
        if oob.recv()?.trim() != "READY" {
            return Err(fail("the peer is not ready"));
        }
        match args.op {
            Op::Send => self.pingpong(args, client, out)?,
            Op::Write => self.write_bw(args, client, &remote, oob, out)?,
        }
        Ok(())
    }

    /// Waits for at least one completion (busy-polling, or sleeping on
    /// the channel with `-e`) and returns them.
    fn next_completions<'w>(&self, wc: &'w mut [WorkCompletion]) -> Result<&'w [WorkCompletion], CliError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = self.cq.poll(wc).map_err(verbs_fail("ibv_poll_cq"))?;
            if n > 0 {
                for w in &wc[..n] {
                    if w.status != WcStatus::Success {
                        return Err(fail(format!(
                            "completion with status {:?} for wr_id {:#x}",
                            w.status, w.wr_id
                        )));
                    }
                }
                return Ok(&wc[..n]);
            }
            if let Some(ch) = &self.channel {
                if ch
                    .get_cq_event(Some(Duration::from_secs(1)))
                    .map_err(verbs_fail("ibv_get_cq_event"))?
                    .is_some()
                {
                    self.cq.ack_events(1);
                    self.cq.req_notify(false).map_err(verbs_fail("ibv_req_notify_cq"))?;
                }
            }
            if Instant::now() > deadline {
                return Err(fail("no completion for 60 seconds"));
            }
        }
    }

    fn post_send(&self, size: u32, inline: bool) -> Result<(), CliError> {
        let sge = [self.mr.sge(0, size).map_err(verbs_fail("sge"))?];
        let mut flags = SendFlags::SIGNALED;
        if inline {
            flags |= SendFlags::INLINE;
        }
        self.qp
            .post_send(&[SendWr::new(0, SendOp::Send, &sge).flags(flags)])
            .map_err(|e| fail(format!("ibv_post_send: {}", e.error)))
    }

    /// Waits for completions and counts them into `q`; every receive that
    /// completed is posted again.
    fn reap(&self, q: &mut Outstanding, wc: &mut [WorkCompletion], size: u32) -> Result<(), CliError> {
        for w in self.next_completions(wc)? {
            if w.wr_id == RECV_WRID {
                q.recvs += 1;
                self.post_recv(size)?;
            } else {
                q.sends = q.sends.saturating_sub(1);
            }
        }
        Ok(())
    }

    fn pingpong(&self, args: &Args, client: bool, out: &mut dyn Write) -> Result<(), CliError> {
        let inline = args.size <= 64;
        let total = args.warmup + args.iters;
        let mut wc = [WorkCompletion::default(); 16];
        let mut rtts = Vec::with_capacity(args.iters as usize);
        let mut start = Instant::now();
        // Completions are counted wherever they turn up: a receive that
        // completes while this side waits for send completions (its send
        // queue full of unacknowledged sends) is the peer's next message,
        // and waiting for it again later would wait forever.
        let mut q = Outstanding::default();
        let len = args.size as usize;
        if args.chk && client {
            // -c: the client sends the pattern, the server echoes what it
            // received (one buffer for both), and each side checks every
            // message it receives.
            let data: Vec<u8> = (0..len).map(chk_pattern).collect();
            self.mr.write(0, &data).map_err(verbs_fail("filling the buffer"))?;
        }
        let mut got = vec![0u8; if args.chk { len } else { 0 }];
        for i in 0..total {
            if i == args.warmup {
                start = Instant::now();
            }
            let t0 = Instant::now();
            if client {
                self.post_send(args.size, inline)?;
                q.sends += 1;
            }
            // Wait for the peer's message.
            while q.recvs == 0 {
                self.reap(&mut q, &mut wc, args.size)?;
            }
            q.recvs -= 1;
            if args.chk {
                self.mr.read(0, &mut got).map_err(verbs_fail("reading the buffer"))?;
                if let Some(at) = got.iter().enumerate().position(|(k, b)| *b != chk_pattern(k)) {
                    return Err(fail(format!("invalid data in message {i} at byte {at}")));
                }
            }
            if client {
                if i >= args.warmup {
                    rtts.push(t0.elapsed());
                }
            } else {
                self.post_send(args.size, inline)?;
                q.sends += 1;
            }
            // Keep the send queue from filling with unreaped completions.
            while q.sends >= args.tx_depth.max(2) {
                self.reap(&mut q, &mut wc, args.size)?;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        // Reap the last send completions so the peer's ACKs are in.
        while q.sends > 0 {
            self.reap(&mut q, &mut wc, args.size)?;
        }
        let bytes = u64::from(args.size) * u64::from(args.iters) * 2;
        writeln!(
            out,
            "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
            bytes as f64 * 8.0 / secs / 1e6
        )?;
        writeln!(
            out,
            "{} iters in {secs:.2} seconds = {:.2} usec/iter",
            args.iters,
            secs * 1e6 / f64::from(args.iters)
        )?;
        if client && !rtts.is_empty() {
            rtts.sort();
            let half = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
            let n = rtts.len();
            let avg = rtts.iter().map(|d| half(*d)).sum::<f64>() / n as f64;
            writeln!(
                out,
                "latency (half round trip, usec): min {:.2} median {:.2} avg {avg:.2} p99 {:.2} max {:.2}",
                half(rtts[0]),
                half(rtts[n / 2]),
                half(rtts[(n * 99 / 100).min(n - 1)]),
                half(rtts[n - 1])
            )?;
        }
        Ok(())
    }

    fn write_bw(
        &self,
        args: &Args,
        client: bool,
        remote: &Dest,
        oob: &mut Oob,
        out: &mut dyn Write,
    ) -> Result<(), CliError> {
        let pattern = |i: usize| (i as u8).wrapping_mul(31).wrapping_add((i >> 12) as u8);
        if !client {
            // Passive: the client writes into our buffer for as long as
            // its stream runs. Inline engines must be polled to make
            // progress; a progress thread (or hardware) answers while we
            // look at the connection every millisecond.
            let drive = !(matches!(args.engine, Engine::Thread) || args.device.is_some());
            let mut wc = [WorkCompletion::default(); 1];
            while !oob.poll_line()? {
                if drive {
                    for _ in 0..64 {
                        let _ = self.cq.poll(&mut wc);
                    }
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let line = oob.recv()?;
            let Some(stats) = line.strip_prefix("DONE ") else {
                return Err(fail("the client did not finish"));
            };
            let len = args.size as usize;
            let ok = (0..len).all(|i| {
                let mut b = [0u8];
                self.mr.read(i as u64, &mut b).is_ok() && b[0] == pattern(i)
            });
            write!(out, "{stats}")?;
            writeln!(out, "data {}", if ok { "verified" } else { "CORRUPT" })?;
            oob.send("BYE\n")?;
            return if ok {
                Ok(())
            } else {
                Err(fail("the written data differs"))
            };
        }
        let len = args.size as usize;
        let data: Vec<u8> = (0..len).map(pattern).collect();
        self.mr.write(0, &data).map_err(verbs_fail("filling the buffer"))?;
        let sge = [self.mr.sge(0, args.size).map_err(verbs_fail("sge"))?];
        let target = RemoteAddr {
            addr: remote.addr,
            rkey: remote.rkey,
        };
        let mut wc = [WorkCompletion::default(); 16];
        let (mut posted, mut done) = (0u32, 0u32);
        let start = Instant::now();
        while done < args.iters {
            while posted < args.iters && posted - done < args.tx_depth {
                self.qp
                    .post_send(&[SendWr::new(u64::from(posted), SendOp::Write { remote: target }, &sge)
                        .flags(SendFlags::SIGNALED)])
                    .map_err(|e| fail(format!("ibv_post_send: {}", e.error)))?;
                posted += 1;
            }
            done += self.next_completions(&mut wc)?.len() as u32;
        }
        let secs = start.elapsed().as_secs_f64();
        let bytes = args.size as f64 * f64::from(args.iters);
        let line = format!(
            "write: {} x {} bytes in {secs:.3} seconds = {:.1} MiB/sec ({:.2} Gbit/sec), {:.3} Mmsg/sec\n",
            args.iters,
            args.size,
            bytes / secs / (1024.0 * 1024.0),
            bytes * 8.0 / secs / 1e9,
            f64::from(args.iters) / secs / 1e6
        );
        write!(out, "{line}")?;
        oob.send(&format!("DONE {line}"))?;
        // The server checks the data, then says goodbye (or closes).
        if !oob.recv().is_ok_and(|l| l.starts_with("BYE")) {
            return Err(fail("the server reported a failure"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_ports_of_the_entropy_range_are_refused() {
        assert!(check_udp_port(4791).is_ok());
        assert!(check_udp_port(40000).is_ok());
        assert!(check_udp_port(49151).is_ok());
        for p in [49152, 50000, 65535] {
            assert!(check_udp_port(p).unwrap_err().contains("use 4791"), "{p}");
        }
    }

    #[test]
    fn address_lines_round_trip() {
        let d = Dest {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid([0xfd, 0x73, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]),
            addr: 0x7f00_1234_5678,
            rkey: 0xdead_beef,
        };
        assert_eq!(Dest::parse(&d.line()), Some(d));
        assert_eq!(Dest::parse("SVPP1 11 22 zz 0 0"), None);
        assert_eq!(Dest::parse(""), None);
    }
}
