//! The rendezvous against hostile peers of the same uid: doorbells that
//! could block, connections that never speak, GIDs the peer does not own,
//! floods beyond the device's limits. Peers that must be another process
//! (a GID is proven by the process that holds its UDP socket) are this
//! test binary started again as [`hostile_peer`].

use std::io::{BufRead, BufReader, Read};
use std::os::fd::FromRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use super::super::limits::{log_due, LOG_EVERY_NS};
use super::*;

/// How long a test waits for what must happen (far longer than it takes
/// on a loaded machine; only a stuck or stalled link reaches it).
const BOUND: Duration = Duration::from_secs(60);

/// A hello (or, with `magic` [`ANSWER`], an answer) from `m` to the
/// device owning `target`, claiming `claims` as its GIDs, each with the
/// socket descriptors named as its proof (whether or not `m` owns them).
fn claiming(m: &ShmLink, magic: &[u8; 8], target: Gid, claims: &[(Gid, Vec<u32>)]) -> [u8; MSG_LEN] {
    let mut msg = m.hello(magic, target, 0);
    msg[24] = claims.len() as u8;
    for (i, (g, fds)) in claims.iter().enumerate() {
        msg[25 + 16 * i..41 + 16 * i].copy_from_slice(&g.0);
        super::super::hello::set_fds(&mut msg, i, fds);
    }
    msg
}

/// [`claiming`] a hello with `m`'s own GIDs, and their sockets.
fn hello_claiming_own(m: &ShmLink, target: Gid) -> [u8; MSG_LEN] {
    let own: Vec<(Gid, Vec<u32>)> = m.gids.iter().map(|g| (*g, m.udp_fds(*g))).collect();
    claiming(m, HELLO, target, &own)
}

/// The descriptors of this process's sockets of `udp` bound to `gid`.
fn fds_of(udp: &UdpLink, gid: Gid) -> Vec<u32> {
    let ep = udp.endpoint_of(gid);
    udp.poll_fds()
        .into_iter()
        .filter(|fd| sys::local_endpoint(*fd) == ep)
        .map(|fd| fd as u32)
        .collect()
}

/// Runs `f` on another thread and waits up to [`BOUND`] for its result;
/// `what` names what it means if it never comes.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(BOUND).unwrap_or_else(|_| panic!("{what}"))
}

/// A pipe whose write end is blocking and full: a write to it never
/// returns while nobody reads. Returns (read end, write end).
fn full_blocking_pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two new descriptors into a live array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are new and owned here from now on.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on a live descriptor with integer arguments.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let chunk = [0u8; 4096];
    // SAFETY: writes from a live buffer; stops at EAGAIN (full).
    while unsafe { libc::write(w.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) } > 0 {}
    // SAFETY: as above: blocking again.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, 0) };
    (r, w)
}

/// A blocking eventfd whose counter is full: a write of 1 blocks.
fn full_blocking_eventfd() -> OwnedFd {
    // SAFETY: plain system call; the descriptor is new and owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, 0)) };
    let max: u64 = 0xffff_ffff_ffff_fffe;
    // SAFETY: writes the 8 bytes of a live u64.
    let n = unsafe { libc::write(fd.as_raw_fd(), (&max as *const u64).cast(), 8) };
    assert_eq!(n, 8);
    fd
}

/// A peer's hello whose doorbell is the write end of a full blocking pipe,
/// a blocking eventfd with a full counter, or a datagram socket connected
/// to nothing, is refused without ever writing to it; the device's other
/// channel keeps carrying traffic. A doorbell of the right kind whose
/// queue is full is accepted: ringing it does not block either, and is
/// counted.
#[test]
fn a_doorbell_that_could_block_is_refused_and_traffic_goes_on() {
    let (a, b) = pair(false, false);
    let m = link();
    let region = Region::create().unwrap();
    let (_r, pipe) = full_blocking_pipe();
    let efd = full_blocking_eventfd();
    let hello = hello_claiming_own(&m, b.gids[0]);
    let _c1 = hello_to(&b, &hello, &[region.file().as_raw_fd(), pipe.as_raw_fd()]);
    let _c2 = hello_to(&b, &hello, &[region.file().as_raw_fd(), efd.as_raw_fd()]);
    // A doorbell itself (bound, connected to nothing): a peer passing
    // one would have us send nowhere.
    let _c3 = hello_to(&b, &hello, &[region.file().as_raw_fd(), m.doorbell.as_raw_fd()]);
    // `b`'s receive turns run elsewhere: one that blocked would never end.
    let (a2, b2) = (a.clone(), b.clone());
    let got = within("a receive turn blocked on a peer's doorbell", move || {
        drive_until(&b2, |l| stat(l, "shm_channels_refused") >= 3);
        a2.send(dgram(&a2, &b2, b"still here", None));
        pump_until(&a2, &b2, 1)
    });
    assert_eq!(got.len(), 1, "{:?}", b.shm_stats());
    assert_eq!(stat(&b, "shm_refused_doorbell"), 3);
    assert_eq!(stat(&b, "shm_channels_refused"), 3);
    assert!(!b.is_shm_peer(m.gids[0]));

    // A real doorbell, full: the answer's ring finds it full.
    let bell = sys::bell().unwrap();
    let filler = sys::bell_sender(&bell).unwrap();
    let mut rung = 0;
    while sys::ring(filler.as_raw_fd()) {
        rung += 1;
        assert!(rung < 1_000_000, "the doorbell never filled");
    }
    let sender = sys::bell_sender(&bell).unwrap();
    let _c4 = hello_to(&b, &hello, &[region.file().as_raw_fd(), sender.as_raw_fd()]);
    let b2 = b.clone();
    let m_gid = m.gids[0];
    within("accepting a peer with a full doorbell blocked", move || {
        drive_until(&b2, |l| l.is_shm_peer(m_gid));
    });
    assert!(b.is_shm_peer(m.gids[0]), "{:?}", b.shm_stats());
    assert!(stat(&b, "shm_doorbells_full") >= 1, "{:?}", b.shm_stats());
}

/// The connector checks the acceptor's doorbell too: an answer whose
/// doorbell is the write end of a full blocking pipe gets no channel
/// (which would have rung it, from the receive turn and from every send
/// to a sleeping peer); the same answer with a real doorbell does.
#[test]
fn an_answer_with_a_doorbell_that_could_block_is_refused() {
    let (l, m) = (link(), link());
    let (_r, pipe) = full_blocking_pipe();
    let bad = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 90));
    let _s = answer_ringing(&l, &m, bad, ANSWER, 0, pipe.as_raw_fd());
    let l2 = l.clone();
    within("a receive turn blocked on an acceptor's doorbell", move || {
        drive_until(&l2, |l| {
            stat(l, "shm_channels_refused") > 0 || l.is_shm_peer(Gid::from_ip(bad))
        });
    });
    assert!(!l.is_shm_peer(Gid::from_ip(bad)), "{:?}", l.peer_lines());
    assert_eq!(stat(&l, "shm_refused_doorbell"), 1);
    assert_eq!(stat(&l, "shm_channels_refused"), 1);
    let good = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 91));
    let _s = answer_ringing(&l, &m, good, ANSWER, 0, ringer(&m).as_raw_fd());
    drive_until(&l, |l| l.is_shm_peer(Gid::from_ip(good)));
    assert!(l.is_shm_peer(Gid::from_ip(good)), "{:?}", l.peer_lines());
}

/// Connections to the rendezvous socket that never send a hello, kept
/// up by a process that reconnects as soon as one is dropped, do not slow
/// the receive turns that carry traffic (each turn here runs the slow
/// path): 2,000 datagrams arrive, and the silent connections are dropped
/// and counted.
#[test]
fn silent_connections_do_not_stall_the_receive_turn() {
    let (a, b) = pair(false, false);
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicU64::new(0));
    let name = rendezvous_name(b.gids[0]);
    let attacker = {
        let (stop, open) = (stop.clone(), open.clone());
        std::thread::spawn(move || {
            let mut conns: Vec<Option<UnixStream>> = (0..100).map(|_| None).collect();
            while !stop.load(Ordering::Relaxed) {
                for c in &mut conns {
                    let up = c.as_mut().is_some_and(
                        |s| matches!((&*s).read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                    );
                    if !up {
                        *c = sys::connect_abstract(name.as_bytes()).ok();
                        open.fetch_add(u64::from(c.is_some()), Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let start = Instant::now();
    while open.load(Ordering::Relaxed) < 100 && start.elapsed() < BOUND {
        std::thread::sleep(Duration::from_millis(1));
    }
    const N: usize = 2000;
    let (a2, b2) = (a.clone(), b.clone());
    let got = within("receive turns stalled by silent connections", move || {
        let (a, b) = (a2, b2);
        let (mut got, mut sent) = (0, 0);
        while got < N {
            while sent < N && sent < got + 256 {
                a.send(dgram(&a, &b, b"through", None));
                sent += 1;
            }
            // As after a sleep: this turn runs the slow path.
            b.rx.armed.store(true, Ordering::Release);
            b.recv(64, &mut |d| got += usize::from(d.data == b"through"));
            a.recv(64, &mut |_| {});
            a.flush();
        }
        got
    });
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    assert_eq!(got, N, "{:?}", b.shm_stats());
    let dropped = stat(&b, "shm_hellos_dropped") + stat(&b, "shm_hello_timeouts");
    assert!(dropped > 0, "{:?}", b.shm_stats());
    assert!(lock(&b.rx.hellos).len() <= b.limits().max_pending_hellos);
    assert_eq!(stat(&b, "shm_channels_accepted"), 1);
}

/// A hello that arrives after its connection was accepted wakes a reader
/// that went to sleep meanwhile: the connection waits in an epoll that
/// is in the link's poll set.
#[test]
fn a_late_hello_wakes_the_acceptor() {
    let (l, m) = (link(), link());
    let addr = UnixAddr::from_abstract_name(rendezvous_name(l.gids[0]).as_bytes()).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    drive_until(&l, |l| !lock(&l.rx.hellos).is_empty());
    assert_eq!(lock(&l.rx.hellos).len(), 1);
    assert!(l.prepare_sleep());
    let fds: Vec<libc::pollfd> = l
        .poll_fds()
        .into_iter()
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let readable = |mut fds: Vec<libc::pollfd>| {
        // SAFETY: a live array of pollfds; no waiting.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) }
    };
    assert_eq!(readable(fds.clone()), 0, "nothing to wake for yet");
    let region = Region::create().unwrap();
    let hello = m.hello(HELLO, l.gids[0], 0);
    sys::send_fds(
        s.as_raw_fd(),
        &hello,
        &[region.file().as_raw_fd(), ringer(&m).as_raw_fd()],
    )
    .unwrap();
    assert_eq!(readable(fds), 1, "the hello does not wake the reader");
    drive_until(&l, |l| l.is_shm_peer(m.gids[0]));
    assert!(l.is_shm_peer(m.gids[0]));
}

/// The name of [`hostile_peer`] for the test harness.
const HOSTILE_TEST: &str = "soft::link::shm::tests::rendezvous::hostile_peer";
/// What [`hostile_peer`] does (set by the test that starts it).
const HOSTILE_ENV: &str = "SOFTVERBS_TEST_SHM_HOSTILE";

fn hex(g: Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Gid {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    Gid(g)
}

/// A hostile peer in another process: this test binary, running
/// [`hostile_peer`]. Killed when dropped.
struct Hostile(Child);

impl Hostile {
    /// Starts it with `spec` and waits until it says it is ready.
    fn start(spec: &str) -> Hostile {
        let exe = std::env::current_exe().unwrap();
        let child = Command::new(exe)
            .args([HOSTILE_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(HOSTILE_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Killed when dropped, also if it never gets ready.
        let mut h = Hostile(child);
        let out = h.0.stdout.take().unwrap();
        let ready = within("the hostile peer never got ready", move || {
            BufReader::new(out).lines().map_while(Result::ok).any(|l| l == "READY")
        });
        assert!(ready, "the hostile peer ended before it was ready");
        h
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Not a test: the hostile peer process other tests start (it does
/// nothing unless [`HOSTILE_ENV`] is set). `hello T G...`: sends the
/// device owning GID `T` a hello from a link of its own claiming the GIDs
/// `G`; `own` stands for its own GID. `listen G`: listens on the
/// rendezvous name of `G` and answers the first hello claiming its own
/// GID and `G`. Each claim names its own UDP socket as proof. Then it
/// waits until it is killed.
#[test]
#[ignore = "not a test: the hostile peer process of the rendezvous tests"]
fn hostile_peer() {
    let Ok(spec) = std::env::var(HOSTILE_ENV) else { return };
    let words: Vec<&str> = spec.split(' ').collect();
    let m = link();
    // Every claim names this process's own sockets as its proof: true
    // for `own`, a lie for any other GID.
    let own_fds = m.udp_fds(m.gids[0]);
    let claim = |w: &str| (if w == "own" { m.gids[0] } else { unhex(w) }, own_fds.clone());
    let region = Region::create().unwrap();
    let _keep = match words[0] {
        "hello" => {
            let claims: Vec<(Gid, Vec<u32>)> = words[2..].iter().map(|w| claim(w)).collect();
            let hello = claiming(&m, HELLO, unhex(words[1]), &claims);
            let addr = UnixAddr::from_abstract_name(rendezvous_name(unhex(words[1])).as_bytes()).unwrap();
            let s = UnixStream::connect_addr(&addr).unwrap();
            sys::send_fds(
                s.as_raw_fd(),
                &hello,
                &[region.file().as_raw_fd(), ringer(&m).as_raw_fd()],
            )
            .unwrap();
            // On a line of its own (the harness's "test ... " has none).
            println!("\nREADY");
            s
        }
        "listen" => {
            let target = unhex(words[1]);
            let addr = UnixAddr::from_abstract_name(rendezvous_name(target).as_bytes()).unwrap();
            let listener = UnixListener::bind_addr(&addr).unwrap();
            println!("\nREADY");
            let (s, _) = listener.accept().unwrap();
            // A connector that checks the listener first closes at once.
            s.set_read_timeout(Some(BOUND)).unwrap();
            let mut hello = [0u8; MSG_LEN];
            let _ = (&s).read(&mut hello);
            let answer = claiming(&m, ANSWER, target, &[claim("own"), claim(words[1])]);
            let _ = sys::send_fds(s.as_raw_fd(), &answer, &[ringer(&m).as_raw_fd()]);
            s
        }
        other => panic!("unknown hostile mode {other}"),
    };
    // Until killed (or the parent goes: stdin closes).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// A device on this host that talks UDP only: its GID, and what keeps it
/// (its UDP socket is held by this process).
fn udp_only_device() -> (Gid, Arc<UdpLink>) {
    loop {
        let s = std::net::UdpSocket::bind((LO4, 0)).unwrap();
        let port = s.local_addr().unwrap().port();
        drop(s);
        if !(0x8000..0xc000).contains(&port) {
            continue;
        }
        let mut cfg = UdpConfig::new(LO4);
        cfg.port = UdpPort::Fixed(port);
        if let Ok(udp) = UdpLink::bind(&cfg) {
            return (udp.gids()[0], udp);
        }
    }
}

/// A peer process gets a channel for the GIDs it owns and for none it
/// does not: a hello claiming, besides its own GID, that of a UDP-only
/// device of this process, or of an address of no interface here, is
/// refused (`shm_refused_gid`) and that GID's traffic keeps going by UDP;
/// the same peer claiming only its own GID gets its channel (so the
/// refusals are about the GIDs, and a GID is proven across processes).
#[test]
fn a_peer_gets_no_channel_for_a_gid_it_does_not_own() {
    let l = link_in(ShmMode::Auto);
    let (udp_gid, _udp) = udp_only_device();
    let remote = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    for (k, claim) in [udp_gid, remote].into_iter().enumerate() {
        let _peer = Hostile::start(&format!("hello {} own {}", hex(l.gids[0]), hex(claim)));
        let decided = |l: &ShmLink| stat(l, "shm_refused_gid") > k as u64 || l.is_shm_peer(claim);
        drive_until(&l, decided);
        assert!(
            !l.is_shm_peer(claim),
            "a lying peer got a channel: {:?}",
            l.peer_lines()
        );
        assert_eq!(stat(&l, "shm_refused_gid"), k as u64 + 1);
        assert_eq!(stat(&l, "shm_channels_refused"), k as u64 + 1);
        assert_eq!(stat(&l, "shm_channels_accepted"), 0);
    }
    let _peer = Hostile::start(&format!("hello {} own", hex(l.gids[0])));
    drive_until_stat(&l, "shm_channels_accepted", 1);
    assert_eq!(stat(&l, "shm_refused_gid"), 2);
    assert!(!l.is_shm_peer(udp_gid) && !l.is_shm_peer(remote));
}

/// A process that listens on the rendezvous name of a GID it does not own
/// (a UDP-only device's) gets no channel: the connector refuses its
/// answer, which cannot prove the GID, and keeps sending to that GID by
/// UDP.
#[test]
fn a_listener_that_does_not_own_the_gid_gets_no_channel() {
    let l = link_in(ShmMode::Auto);
    let (udp_gid, _udp) = udp_only_device();
    let _impostor = Hostile::start(&format!("listen {}", hex(udp_gid)));
    let mut t = dgram(&l, &l, b"to the UDP-only device", None);
    t.src = ip(&l);
    t.dst = udp_gid.to_ip();
    l.send(t);
    drive_until(&l, |l| stat(l, "shm_refused_gid") > 0 || l.is_shm_peer(udp_gid));
    assert!(
        !l.is_shm_peer(udp_gid),
        "an impostor got a channel: {:?}",
        l.peer_lines()
    );
    assert_eq!(stat(&l, "shm_refused_gid"), 1);
    assert_eq!(stat(&l, "shm_channels_refused"), 1);
    assert!(
        l.peer_lines().iter().any(|p| p.ends_with(" udp")),
        "{:?}",
        l.peer_lines()
    );
}

/// A GID this device reaches over another path now is not taken over by
/// a channel, even from its owner: here UDP, after a connect that found
/// no listener.
#[test]
fn a_gid_reached_by_udp_is_not_taken_over() {
    let (l, m) = (link_in(ShmMode::Auto), link());
    let (udp_gid, udp) = udp_only_device();
    let mut t = dgram(&l, &m, b"by UDP", None);
    t.dst = udp_gid.to_ip();
    l.send(t);
    assert!(l.setup_settled());
    assert_eq!(stat(&l, "shm_connect_failed"), 1);
    // The next connect attempt is [`RETRY_NS`] away; here, far away (this
    // test must not depend on how fast the machine is).
    match l.routes_w().get_mut(&udp_gid.to_ip()) {
        Some(Route::Udp(until, true)) => *until = Nanos::MAX - 1,
        other => panic!("{other:?}"),
    }
    // This process owns both GIDs: only the route stands in the way.
    let region = Region::create().unwrap();
    let hello = claiming(
        &m,
        HELLO,
        l.gids[0],
        &[(m.gids[0], m.udp_fds(m.gids[0])), (udp_gid, fds_of(&udp, udp_gid))],
    );
    let _s = hello_to(&l, &hello, &[region.file().as_raw_fd(), ringer(&m).as_raw_fd()]);
    drive_until(&l, |l| stat(l, "shm_refused_gid") > 0 || l.is_shm_peer(udp_gid));
    assert_eq!(stat(&l, "shm_refused_gid"), 1, "{:?}", l.peer_lines());
    assert!(
        !l.is_shm_peer(udp_gid) && !l.is_shm_peer(m.gids[0]),
        "{:?}",
        l.peer_lines()
    );
    // Without the claim, the channel comes up.
    let _s = hello_to(
        &l,
        &m.hello(HELLO, l.gids[0], 0),
        &[region.file().as_raw_fd(), ringer(&m).as_raw_fd()],
    );
    drive_until(&l, |l| l.is_shm_peer(m.gids[0]));
    assert!(l.is_shm_peer(m.gids[0]));
}

/// A flood of hellos beyond the channel limit gets no more channels than
/// the limit (default 64), each refusal counted; what is mapped stays at
/// one region per channel.
#[test]
fn a_flood_of_hellos_stops_at_the_channel_limit() {
    let (l, m) = (link(), link());
    let max = l.limits().max_channels;
    assert_eq!(max, 64);
    let region = Region::create().unwrap();
    let hello = m.hello(HELLO, l.gids[0], 0);
    let mut conns = Vec::new();
    for _ in 0..max + 16 {
        conns.push(hello_to(
            &l,
            &hello,
            &[region.file().as_raw_fd(), ringer(&m).as_raw_fd()],
        ));
        pump(&l, &mut Vec::new());
    }
    let total = (max + 16) as u64;
    drive_until(&l, |l| {
        stat(l, "shm_channels_accepted") + stat(l, "shm_channels_refused") >= total
    });
    assert_eq!(stat(&l, "shm_channels_accepted"), max as u64, "{:?}", l.shm_stats());
    assert_eq!(stat(&l, "shm_refused_limit"), 16, "{:?}", l.shm_stats());
    assert_eq!(l.chans_r().len(), max);
    assert_eq!(stat(&l, "shm_mapped_bytes"), (max * ring::REGION_LEN) as u64);
    // A smaller limit applies to what comes next; closed channels give
    // their room back.
    drop(conns);
    drive_until(&l, |l| l.chans_r().is_empty());
    assert_eq!(stat(&l, "shm_mapped_bytes"), 0);
    l.set_limits(ShmLimits {
        max_channels: 2,
        ..l.limits()
    });
    let _conns: Vec<UnixStream> = (0..4)
        .map(|_| hello_to(&l, &hello, &[region.file().as_raw_fd(), ringer(&m).as_raw_fd()]))
        .collect();
    drive_until_stat(&l, "shm_refused_limit", 18);
    assert_eq!(stat(&l, "shm_channels_accepted"), max as u64 + 2);
}

/// Buffers a peer exports for trains count against the device's limits:
/// past the count of mapped buffers, or the mapped bytes, the channel
/// that exported them ends, counted; what it had mapped is given back.
#[test]
fn exports_beyond_the_limits_end_the_channel() {
    for limit in ["exports", "bytes"] {
        let (a, b) = pair(true, true);
        let base = stat(&b, "shm_mapped_bytes");
        let bufs: Vec<_> = (0..3).map(|k| buffer(1 << 20, k as u8)).collect();
        let two = (bufs[0].1.file().len() + bufs[1].1.file().len()) as u64;
        b.set_limits(match limit {
            "exports" => ShmLimits {
                max_mapped_exports: 2,
                ..b.limits()
            },
            _ => ShmLimits {
                max_mapped_bytes: base + two,
                ..b.limits()
            },
        });
        for (k, (_, mem)) in bufs.iter().enumerate() {
            a.send(dgram(&a, &b, b"train", Some(train(1, &[(mem, 0, 4096)]))));
            let got = pump_for(&a, &b, 1, Duration::from_secs(if k < 2 { 10 } else { 1 }));
            if k < 2 {
                assert_eq!(got.len(), 1, "{limit}: {:?}", b.shm_stats());
            }
        }
        drive_until_stat(&b, "shm_refused_limit", 1);
        drive_until(&b, |b| !b.is_shm_peer(a.gids[0]));
        assert!(!b.is_shm_peer(a.gids[0]), "{limit}");
        drive_until(&b, |b| stat(b, "shm_mapped_exports") == 0);
        assert_eq!(stat(&b, "shm_mapped_exports"), 0, "{limit}");
    }
}

/// A refusal is logged at most once a [`LOG_EVERY_NS`]: the first one,
/// then the first one a full interval after the last logged one.
#[test]
fn refusals_are_logged_at_most_once_a_second() {
    assert!(log_due(0, 5));
    assert!(!log_due(5, 5));
    assert!(!log_due(5, 5 + LOG_EVERY_NS - 1));
    assert!(log_due(5, 5 + LOG_EVERY_NS));
    // A clock read on another thread may be behind: not due.
    assert!(!log_due(5 + LOG_EVERY_NS, 5));
}

#[test]
fn limits_parse() {
    let d = ShmLimits::default();
    let l = d.parse("channels=8, mapped=3G,exports=10,hellos=4").unwrap();
    assert_eq!(
        l,
        ShmLimits {
            max_channels: 8,
            max_mapped_bytes: 3 << 30,
            max_mapped_exports: 10,
            max_pending_hellos: 4,
        }
    );
    assert_eq!(d.parse("").unwrap(), d);
    for bad in ["channels", "channels=x", "colour=3", "mapped=99999999T", "channels=-1"] {
        assert!(d.parse(bad).is_err(), "{bad}");
    }
}

/// A doorbell rung until full refuses more rings without blocking, a
/// bounded drain takes no more than it may, a full one empties it, and it
/// rings again after.
#[test]
fn a_doorbell_fills_without_blocking_and_drains_in_bounds() {
    let bell = sys::bell().unwrap();
    let ringer = sys::bell_sender(&bell).unwrap();
    let readable = || {
        let mut p = libc::pollfd {
            fd: bell.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, no waiting.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    };
    assert!(!readable());
    let mut rung = 0;
    while sys::ring(ringer.as_raw_fd()) {
        rung += 1;
        assert!(rung < 1_000_000, "the doorbell never filled");
    }
    assert!(rung >= 2, "{rung}");
    sys::drain(bell.as_raw_fd(), 1);
    assert!(readable(), "a drain of one took everything");
    sys::drain(bell.as_raw_fd(), DRAIN_MAX.max(rung));
    assert!(!readable(), "a full drain left rings");
    assert!(sys::ring(ringer.as_raw_fd()));
    assert!(readable());
}

/// What a peer gets to ring us with is a socket of its own, never our
/// doorbell: whatever it does with it (here: it reads from it, and
/// connects it elsewhere, which on the doorbell itself would refuse every
/// other peer's rings), the other peers still ring us, and it reads none
/// of their rings.
#[test]
fn a_peer_cannot_take_the_doorbell_from_the_others() {
    let (l, m) = (link(), link());
    let dst = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 92));
    let name = UnixAddr::from_abstract_name(rendezvous_name(Gid::from_ip(dst)).as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&name).unwrap();
    let mut t = dgram(&l, &m, b"to a peer", None);
    t.dst = dst;
    l.send_one(t, &mut drop);
    let (s, _) = listener.accept().unwrap();
    let mut hello = [0u8; MSG_LEN];
    let (n, mut fds) = sys::recv_fds(s.as_raw_fd(), &mut hello, 2).unwrap();
    assert_eq!((n, fds.len()), (MSG_LEN, 2));
    let given = sys::check_bell(fds.pop().unwrap()).unwrap();
    // The hostile peer connects what it got to a doorbell of its own.
    let elsewhere = sys::bell().unwrap();
    let mut addr: libc::sockaddr_un = zeroed_sockaddr();
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let at = (&mut addr as *mut libc::sockaddr_un).cast();
    // SAFETY: the kernel writes at most `len` bytes into a live sockaddr_un.
    let r = unsafe { libc::getsockname(elsewhere.as_raw_fd(), at, &mut len) };
    assert_eq!(r, 0);
    // SAFETY: `addr`, `len` as getsockname wrote them.
    let r = unsafe { libc::connect(given.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
    // Another peer rings `l`: it goes through, and only `l` sees it.
    let other = ringer(&l);
    assert!(sys::ring(other.as_raw_fd()));
    let mut b = [0u8; 8];
    // SAFETY: receives at most 8 bytes into a live buffer, no waiting.
    let stolen = unsafe { libc::recv(given.as_raw_fd(), b.as_mut_ptr().cast(), 8, libc::MSG_DONTWAIT) };
    assert!(stolen < 0, "the peer read a ring meant for us");
    let mut p = libc::pollfd {
        fd: l.doorbell.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no waiting.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1, "the ring did not reach us");
}

fn zeroed_sockaddr() -> libc::sockaddr_un {
    // SAFETY: an all-zero sockaddr_un is valid.
    unsafe { std::mem::zeroed() }
}

/// [`ShmMode::Auto`]: the first datagram to a new peer leaves by UDP at
/// once, and the channel (its region: a 4.5 MB mapping populated, ~2 ms)
/// is set up on the link's setup thread, not on the sending one; once up,
/// it carries the next datagram, and a peer seen meanwhile does not make
/// the setup thread open a second channel.
#[test]
fn a_first_datagram_does_not_wait_for_the_channel() {
    let (a, b) = (link_in(ShmMode::Auto), link_in(ShmMode::Auto));
    let (tx, rx) = mpsc::channel();
    set_after_hello(&a, move || tx.send(std::thread::current().id()).unwrap());
    // Handed to the UDP link (which cannot route these test datagrams).
    let by_udp = |l: &ShmLink| {
        let s = l.udp.stats();
        s.tx_datagrams + s.tx_unroutable
    };
    let before = by_udp(&a);
    a.send(dgram(&a, &b, b"first", None));
    assert_eq!(by_udp(&a), before + 1, "the first datagram did not go by UDP");
    let hello_from = rx.recv_timeout(BOUND).expect("no hello");
    assert_ne!(hello_from, std::thread::current().id(), "the sender opened the channel");
    assert!(a.setup_settled());
    assert_eq!(stat(&a, "shm_channels_opened"), 1);
    let start = Instant::now();
    while !a.is_shm_peer(b.gids[0]) && start.elapsed() < BOUND {
        pump_for(&a, &b, 1, Duration::from_millis(1));
    }
    a.send(dgram(&a, &b, b"second", None));
    let got = pump_until(&a, &b, 1);
    assert_eq!(got.first().map(|g| &g.data[..]), Some(&b"second"[..]));
    // `b` answers over the channel `a` opened: no setup of its own.
    b.send(dgram(&b, &a, b"reply", None));
    assert!(b.setup_settled());
    assert_eq!(pump_until(&b, &a, 1).len(), 1);
    assert_eq!(stat(&b, "shm_channels_opened"), 0);
    assert_eq!(a.chans_r().len(), 1);
}

/// [`ShmMode::Auto`]: two devices that send to each other before either
/// has a channel (the first datagram goes by UDP and its answer comes
/// back before the hello) end up with one channel, not one each way: the
/// one with the greater address waits for the other's hello.
#[test]
fn two_devices_that_answer_by_udp_open_one_channel() {
    let (a, b) = (link_in(ShmMode::Auto), link_in(ShmMode::Auto));
    a.send(dgram(&a, &b, b"request", None));
    b.send(dgram(&b, &a, b"reply", None));
    let start = Instant::now();
    while !(a.is_shm_peer(b.gids[0]) && b.is_shm_peer(a.gids[0])) && start.elapsed() < BOUND {
        pump_for(&a, &b, 1, Duration::from_millis(1));
    }
    assert!(a.setup_settled() && b.setup_settled());
    pump_for(&a, &b, 1, Duration::from_millis(10));
    assert_eq!(stat(&a, "shm_channels_opened") + stat(&b, "shm_channels_opened"), 1);
    assert_eq!(
        (a.chans_r().len(), b.chans_r().len()),
        (1, 1),
        "{:?} {:?}",
        a.peer_lines(),
        b.peer_lines()
    );
}

/// [`ShmMode::Auto`] in a child forked while the parent's setup thread
/// ran: the link says a setup thread runs, but in the parent; the child,
/// which has no such thread, starts its own instead of leaving its
/// destinations on UDP for good. Played here by marking the thread as
/// another process's.
#[test]
fn a_forked_child_starts_its_own_setup_thread() {
    let (a, b) = (link_in(ShmMode::Auto), link_in(ShmMode::Auto));
    lock(&a.tx.setup).running = Some(std::process::id().wrapping_add(1));
    a.send(dgram(&a, &b, b"first", None));
    let start = Instant::now();
    while !a.is_shm_peer(b.gids[0]) && start.elapsed() < BOUND {
        pump_for(&a, &b, 1, Duration::from_millis(1));
    }
    assert!(a.is_shm_peer(b.gids[0]), "no channel: {:?}", a.peer_lines());
    assert_eq!(stat(&a, "shm_channels_opened"), 1);
}
