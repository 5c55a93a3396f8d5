//! Connection setup rate: the soft connection manager (two soft devices in
//! this process, on UDP over loopback or the in-process fabric) against
//! TCP `connect`/`accept` on loopback, in the same run, rounds alternated.
//!
//! A connection counts as set up when both sides hold it: for the CM, the
//! client's id went from `rdma_create_id` through address and route
//! resolution, QP creation and `connect` to ESTABLISHED, and the server
//! took the request, made its QP, accepted and saw ESTABLISHED; for TCP,
//! `connect` returned and the server's `accept` did. Teardown (disconnect,
//! close) happens after each batch, outside the timing.
//!
//! - `seq`: one connection at a time.
//! - `par`: `P` connections at once: every step is issued for all `P`
//!   before the next step waits for all of them (as `cmtime -c P` does);
//!   TCP issues `P` non-blocking `connect`s and waits for all.
//!
//! ```text
//! cm_rate [--conns N (400)] [--parallel P (16)] [--rounds R (3)] [--link udp|inproc (udp)]
//! ```
//!
//! Prints one line per measurement (`RESULT <what> <mode> round=<r>
//! conns=<n> secs=<s> rate=<conn/s>`), then the medians.
//! `benches/run_cm_rate.sh` runs it beside `cmtime` on the
//! librdmacm-compatible library. (provider/tests/cm_rate.rs is the
//! sequential variant, as an ignored test of the library's public API.)

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softverbs::cm::*;
use softverbs::soft::link::inproc::InprocFabric;
use softverbs::soft::link::udp::UdpConfig;
use softverbs::soft::link::Link;
use softverbs::soft::SoftDeviceConfig;
use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
use softverbs::verbs::*;

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

struct Opts {
    conns: usize,
    parallel: usize,
    rounds: usize,
    udp: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        conns: 400,
        parallel: 16,
        rounds: 3,
        udp: true,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--conns" => o.conns = v.parse().expect("--conns N"),
            "--parallel" => o.parallel = v.parse().expect("--parallel P"),
            "--rounds" => o.rounds = v.parse().expect("--rounds R"),
            "--link" => o.udp = v == "udp",
            a => panic!("unknown argument {a} (see the source's docs)"),
        }
        i += 2;
    }
    o.conns = o.conns.div_ceil(o.parallel.max(1)) * o.parallel.max(1);
    o
}

/// A PD, a CQ and the id's RC QP.
fn with_qp(id: &CmId) -> (Pd, Cq) {
    let ctx = id.verbs().expect("verbs");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16, 0, None, 0).expect("cq");
    id.create_qp(
        &pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        },
    )
    .expect("create_qp");
    (pd, cq)
}

/// The soft side: a CM over two soft devices and a server thread that
/// accepts everything and reports each ESTABLISHED.
struct SoftBench {
    cm: Cm,
    src: IpAddr,
    dst: SocketAddr,
    stop: Arc<AtomicBool>,
    established: mpsc::Receiver<()>,
    server: Option<JoinHandle<()>>,
}

impl SoftBench {
    fn new(udp: bool) -> SoftBench {
        let sub = Arc::new(Subsystem::new(SubsystemConfig::default()));
        let pid = std::process::id();
        let ips: [IpAddr; 2] = [IpAddr::from([127, 0, 9, 1]), IpAddr::from([127, 0, 9, 2])];
        let fabric: Arc<dyn Link> = InprocFabric::new();
        for (k, ip) in ips.iter().enumerate() {
            let name = format!("cmrate{pid}_{k}");
            let cfg = if udp {
                SoftDeviceConfig::udp(&name, UdpConfig::new(*ip)).expect("a UDP device on loopback")
            } else {
                SoftDeviceConfig {
                    link: Some(fabric.clone()),
                    ..SoftDeviceConfig::new(&name, *ip)
                }
            };
            sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT)
                .expect("add_device");
        }
        let cm = Cm::new(sub, CmConfig::default()).expect("cm");
        let dst = SocketAddr::new(ips[1], 7471);
        let sch = EventChannel::new().expect("channel");
        let listener = cm.create_id(&sch, PortSpace::Tcp, 0).expect("id");
        listener.bind_addr(dst).expect("bind");
        listener.listen(4096).expect("listen");
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, established) = mpsc::channel();
        let st = stop.clone();
        let server = std::thread::spawn(move || {
            let _listener = listener;
            let mut held: HashMap<u64, (CmId, Pd, Cq)> = HashMap::new();
            while !st.load(Ordering::Relaxed) {
                let Some(mut ev) = sch.get_event(Some(Duration::from_millis(50))).expect("get_event") else {
                    continue;
                };
                match ev.kind {
                    CmEventKind::ConnectRequest => {
                        let id = ev.take_id().expect("new id");
                        let (pd, cq) = with_qp(&id);
                        id.accept(&ConnParam::default()).expect("accept");
                        held.insert(id.id(), (id, pd, cq));
                    }
                    CmEventKind::Established => {
                        let _ = tx.send(());
                    }
                    CmEventKind::Disconnected | CmEventKind::ConnectError | CmEventKind::Rejected => {
                        held.remove(&ev.id);
                    }
                    _ => {}
                }
            }
        });
        SoftBench {
            cm,
            src: ips[0],
            dst,
            stop,
            established,
            server: Some(server),
        }
    }

    /// Sets up `p` connections at once, step by step; returns them.
    fn batch(&self, ch: &EventChannel, p: usize) -> Vec<(CmId, Pd, Cq)> {
        let wait = |kind: CmEventKind, n: usize| {
            for _ in 0..n {
                let ev = ch.get_event(WAIT).expect("get_event").expect("an event in time");
                assert_eq!(ev.kind, kind, "{ev:?}");
            }
        };
        let ids: Vec<CmId> = (0..p)
            .map(|_| {
                let id = self.cm.create_id(ch, PortSpace::Tcp, 0).expect("id");
                id.resolve_addr(Some(self.src), self.dst).expect("resolve_addr");
                id
            })
            .collect();
        wait(CmEventKind::AddrResolved, p);
        for id in &ids {
            id.resolve_route().expect("resolve_route");
        }
        wait(CmEventKind::RouteResolved, p);
        let mut out = Vec::with_capacity(p);
        for id in ids {
            let (pd, cq) = with_qp(&id);
            id.connect(&ConnParam::default()).expect("connect");
            out.push((id, pd, cq));
        }
        wait(CmEventKind::Established, p);
        for _ in 0..p {
            self.established
                .recv_timeout(WAIT.unwrap())
                .expect("server ESTABLISHED");
        }
        out
    }

    /// `n` connections, `p` at a time: seconds spent setting them up.
    fn run(&self, n: usize, p: usize) -> f64 {
        let ch = EventChannel::new().expect("channel");
        let mut secs = 0.0;
        for _ in 0..n / p {
            let t = Instant::now();
            let conns = self.batch(&ch, p);
            secs += t.elapsed().as_secs_f64();
            for (id, _, _) in &conns {
                id.disconnect().expect("disconnect");
            }
            for _ in 0..p {
                let ev = ch.get_event(WAIT).expect("get_event").expect("DISCONNECTED in time");
                assert_eq!(ev.kind, CmEventKind::Disconnected, "{ev:?}");
            }
            drop(conns);
        }
        secs
    }
}

impl Drop for SoftBench {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

/// The TCP side: a listener on loopback and a thread that accepts and
/// reports each connection.
struct TcpBench {
    addr: SocketAddr,
    accepted: mpsc::Receiver<TcpStream>,
    _server: JoinHandle<()>,
}

impl TcpBench {
    fn new() -> TcpBench {
        let l = TcpListener::bind("127.0.0.1:0").expect("tcp listener");
        let addr = l.local_addr().expect("address");
        let (tx, accepted) = mpsc::channel();
        let server = std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                if tx.send(s).is_err() {
                    return;
                }
            }
        });
        TcpBench {
            addr,
            accepted,
            _server: server,
        }
    }

    /// `p` non-blocking connects at once, then waits for all of them and
    /// for the server's accepts.
    fn batch(&self, p: usize) -> (Vec<OwnedFd>, Vec<TcpStream>) {
        let SocketAddr::V4(a) = self.addr else {
            unreachable!("bound to IPv4")
        };
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let mut socks = Vec::with_capacity(p);
        for _ in 0..p {
            // SAFETY: plain socket(2); the descriptor is owned below.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
            assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
            // SAFETY: a descriptor just made and owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: `sa` is a live sockaddr_in of the size given.
            let r = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            let e = io::Error::last_os_error();
            assert!(r == 0 || e.raw_os_error() == Some(libc::EINPROGRESS), "connect: {e}");
            socks.push(fd);
        }
        let mut pending: Vec<libc::pollfd> = socks
            .iter()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        while !pending.is_empty() {
            // SAFETY: a live array of pollfds.
            let n = unsafe { libc::poll(pending.as_mut_ptr(), pending.len() as libc::nfds_t, 30_000) };
            assert!(n > 0, "connects did not finish");
            for q in pending.iter().filter(|q| q.revents != 0) {
                let mut err: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: reads an int option into a live int.
                unsafe {
                    libc::getsockopt(
                        q.fd,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&mut err as *mut libc::c_int).cast(),
                        &mut len,
                    )
                };
                assert_eq!(err, 0, "connect failed: {}", io::Error::from_raw_os_error(err));
            }
            pending.retain(|q| q.revents == 0);
        }
        let accepted = (0..p)
            .map(|_| self.accepted.recv_timeout(WAIT.unwrap()).expect("accept"))
            .collect();
        (socks, accepted)
    }

    fn run(&self, n: usize, p: usize) -> f64 {
        let mut secs = 0.0;
        for _ in 0..n / p {
            let t = Instant::now();
            let conns = self.batch(p);
            secs += t.elapsed().as_secs_f64();
            drop(conns);
        }
        secs
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn main() {
    let o = opts();
    let link = if o.udp { "soft_cm_udp" } else { "soft_cm_inproc" };
    let soft = SoftBench::new(o.udp);
    let tcp = TcpBench::new();
    // Warm-up: first contexts, first ports.
    soft.run(o.parallel, o.parallel);
    tcp.run(o.parallel, o.parallel);
    let modes = [("seq", 1), ("par", o.parallel)];
    let mut rates: HashMap<(&str, &str), Vec<f64>> = HashMap::new();
    for r in 0..o.rounds {
        for (mode, p) in modes {
            // Alternate which side goes first, round by round.
            let order: [&str; 2] = if r % 2 == 0 { [link, "tcp"] } else { ["tcp", link] };
            for what in order {
                let secs = if what == "tcp" {
                    tcp.run(o.conns, p)
                } else {
                    soft.run(o.conns, p)
                };
                let rate = o.conns as f64 / secs;
                println!(
                    "RESULT {what} {mode}{} round={r} conns={} secs={secs:.4} rate={rate:.0}",
                    if p > 1 { p.to_string() } else { String::new() },
                    o.conns
                );
                rates.entry((what, mode)).or_default().push(rate);
            }
        }
    }
    println!(
        "\nmedian connections/s over {} rounds of {} connections",
        o.rounds, o.conns
    );
    println!("{:<16} {:>10} {:>10}", "", "seq", format!("par{}", o.parallel));
    for what in [link, "tcp"] {
        let mut s = rates.remove(&(what, "seq")).unwrap_or_default();
        let mut p = rates.remove(&(what, "par")).unwrap_or_default();
        println!("{what:<16} {:>10.0} {:>10.0}", median(&mut s), median(&mut p));
    }
}
