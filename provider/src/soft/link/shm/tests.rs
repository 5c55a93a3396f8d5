//! Unit tests of the shared-memory link: two links in one process, each
//! playing a device (and sometimes a hostile peer writing the rings).
//! This file holds the harness, the rendezvous's version and
//! capability checks and the receive turn's reads of UDP; trains, the
//! send path, the rendezvous against
//! hostile peers and the sleeping reader have files of their own in
//! `tests/`.

use std::io::Read;
use std::net::Ipv4Addr;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::channel::NO_META;
use super::ring::{DescPiece, Producer, Region, SlotMeta, TrainDesc};
use super::trains::map_export;
use super::wire::{ANSWER, CAP_TRAINS, CAP_TRAINS1, EXPORT, HELLO, MSG_LEN};
use super::*;
use crate::soft::clock::process_now;
use crate::soft::link::udp::{UdpConfig, UdpPort};
use crate::soft::proto::train::{TrainCaps, TrainOut, TrainPiece};
use crate::soft::proto::Counters;
use crate::verbs::{MemorySource, MrMemory, SharedMemory};

mod rendezvous;
mod send;
mod sleep;
mod trains;

const LO4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What [`after_hello`] runs once, per link (set by a test).
type AfterHello = Vec<(u64, Box<dyn FnOnce() + Send>)>;
static AFTER_HELLO: std::sync::Mutex<AfterHello> = std::sync::Mutex::new(Vec::new());

/// Called by a connector right after it sent a hello (on the sending
/// thread, or the setup thread in [`ShmMode::Auto`]): runs what the test
/// set with [`set_after_hello`] for that link, to play what other threads
/// and processes may do at that moment.
pub(super) fn after_hello(l: &ShmLink) {
    let f = {
        let mut hooks = AFTER_HELLO.lock().unwrap_or_else(|p| p.into_inner());
        hooks
            .iter()
            .position(|(id, _)| *id == l.tx.link_id)
            .map(|i| hooks.swap_remove(i).1)
    };
    if let Some(f) = f {
        f();
    }
}

/// Sets what the next [`after_hello`] of `l` runs.
fn set_after_hello(l: &ShmLink, f: impl FnOnce() + Send + 'static) {
    let mut hooks = AFTER_HELLO.lock().unwrap_or_else(|p| p.into_inner());
    hooks.push((l.tx.link_id, Box::new(f)));
}

fn link() -> Arc<ShmLink> {
    link_in(ShmMode::Only)
}

fn link_in(mode: ShmMode) -> Arc<ShmLink> {
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
            return ShmLink::new(udp, mode).unwrap();
        }
    }
}

impl ShmLink {
    /// Sends one datagram (what the engine's lists of one do).
    fn send(&self, tx: Transmit) {
        self.send_batch(&mut vec![tx], &mut drop);
    }
}

fn ip(l: &ShmLink) -> IpAddr {
    l.ips[0]
}

fn stat(l: &ShmLink, name: &str) -> u64 {
    l.shm_stats()
        .into_iter()
        .find(|(k, _)| *k == name)
        .map_or(0, |(_, v)| v)
}

/// What a receiver got: the datagram, and for a train its packet count
/// and payload (copied out as an engine would).
#[derive(Debug, PartialEq)]
struct Got {
    data: Vec<u8>,
    train: Option<(u32, Vec<u8>)>,
}

fn pump(l: &ShmLink, got: &mut Vec<Got>) {
    l.recv(64, &mut |d| {
        let train = d.train.map(|t| {
            let dst = MemorySource::Owned(MrMemory::new(t.len() as usize).unwrap());
            let mut off = 0;
            t.for_each_range(0, u64::from(t.len()), |p| {
                dst.write_piece(off, p).map_err(|_| ())?;
                off += p.len();
                Ok(())
            })
            .unwrap();
            let mut v = vec![0; t.len() as usize];
            dst.read_at(0, &mut v).unwrap();
            (t.npkts(), v)
        });
        got.push(Got {
            data: d.data.to_vec(),
            train,
        });
    });
}

/// Pumps both links until `b` got `n` datagrams (or 10 s passed).
fn pump_until(a: &ShmLink, b: &ShmLink, n: usize) -> Vec<Got> {
    pump_for(a, b, n, Duration::from_secs(10))
}

/// Pumps both links for a while, expecting `b` to get nothing.
fn pump_nothing(a: &ShmLink, b: &ShmLink) -> Vec<Got> {
    pump_for(a, b, 1, Duration::from_millis(100))
}

fn pump_for(a: &ShmLink, b: &ShmLink, n: usize, limit: Duration) -> Vec<Got> {
    let mut got = Vec::new();
    let mut other = Vec::new();
    let start = Instant::now();
    while got.len() < n && start.elapsed() < limit {
        pump(b, &mut got);
        pump(a, &mut other);
        a.flush();
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

fn dgram(a: &ShmLink, b: &ShmLink, data: &[u8], train: Option<TrainOut>) -> Transmit {
    Transmit {
        src: ip(a),
        dst: ip(b),
        src_port: 0xc000,
        dst_port: 4791,
        data: data.to_vec(),
        train: train.map(Box::new),
    }
}

fn buffer(len: usize, seed: u8) -> (MrMemory, Arc<SharedMemory>) {
    let m = MrMemory::new(len).unwrap();
    let data: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(31) ^ seed).collect();
    m.write(0, &data).unwrap();
    let shared = m.shared().expect("memfd-backed").clone();
    (m, shared)
}

fn train(npkts: u32, pieces: &[(&Arc<SharedMemory>, u64, u32)]) -> TrainOut {
    TrainOut {
        npkts,
        pieces: pieces
            .iter()
            .map(|(m, offset, len)| TrainPiece::Shared {
                mem: Arc::clone(m),
                offset: *offset,
                len: *len,
            })
            .collect(),
    }
}

/// Two links, `a` connected to `b` (it writes ring 0), trains offered
/// as given.
fn pair(offer_a: bool, offer_b: bool) -> (Arc<ShmLink>, Arc<ShmLink>) {
    pair_in(ShmMode::Only, offer_a, offer_b)
}

fn pair_in(mode: ShmMode, offer_a: bool, offer_b: bool) -> (Arc<ShmLink>, Arc<ShmLink>) {
    let (a, b) = (link_in(mode), link_in(mode));
    a.set_trains(offer_a);
    b.set_trains(offer_b);
    a.send(dgram(&a, &b, b"hello", None));
    if mode == ShmMode::Auto {
        // `Auto` sent that one by UDP, to a port nobody reads; once the
        // channel is up, the ring carries the next.
        let start = Instant::now();
        while !a.is_shm_peer(b.gids[0]) && start.elapsed() < Duration::from_secs(10) {
            pump_for(&a, &b, 1, Duration::from_millis(1));
        }
        a.send(dgram(&a, &b, b"hello", None));
    }
    let got = pump_until(&a, &b, 1);
    assert_eq!(got.len(), 1, "{:?} {:?}", a.shm_stats(), b.shm_stats());
    assert!(a.is_shm_peer(b.gids[0]) && b.is_shm_peer(a.gids[0]));
    (a, b)
}

fn channel(l: &ShmLink) -> Arc<Channel> {
    l.chans_r()[0].clone()
}

/// A socket to ring `l`'s doorbell with, as a hello or answer passes.
fn ringer(l: &ShmLink) -> OwnedFd {
    sys::bell_sender(&l.doorbell).unwrap()
}

/// Sends `msg` with `fds` to `l`'s rendezvous socket, as a connector.
fn hello_to(l: &ShmLink, msg: &[u8; MSG_LEN], fds: &[RawFd]) -> UnixStream {
    let addr = UnixAddr::from_abstract_name(rendezvous_name(l.gids[0]).as_bytes()).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    sys::send_fds(s.as_raw_fd(), msg, fds).unwrap();
    s
}

/// Drives `l` (its slow path accepts connections and reads answers) until
/// `done(l)`, or 10 s passed.
fn drive_until(l: &ShmLink, done: impl Fn(&ShmLink) -> bool) {
    let start = Instant::now();
    while !done(l) && start.elapsed() < Duration::from_secs(10) {
        pump(l, &mut Vec::new());
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// [`drive_until`] the counter `name` of `l` reaches `n`, which it must
/// then be exactly.
fn drive_until_stat(l: &ShmLink, name: &str, n: u64) {
    drive_until(l, |l| stat(l, name) >= n);
    assert_eq!(stat(l, name), n, "{:?}", l.shm_stats());
}

/// Plays the acceptor for `dst` (a standard GID: port 4791): `l` sends
/// it a datagram (and so its hello), which must be this version's; the
/// answer goes back with `magic`. Returns the connection, and the UDP
/// socket that makes this process the owner of `dst`, to keep them open.
fn answer_as(l: &ShmLink, m: &ShmLink, dst: IpAddr, magic: &[u8; 8]) -> (UnixStream, std::net::UdpSocket) {
    answer_with(l, m, dst, magic, 0)
}

/// [`answer_as`] with capabilities `caps` in the answer.
fn answer_with(l: &ShmLink, m: &ShmLink, dst: IpAddr, magic: &[u8; 8], caps: u32) -> (UnixStream, std::net::UdpSocket) {
    answer_ringing(l, m, dst, magic, caps, ringer(m).as_raw_fd())
}

/// [`answer_with`], passing `doorbell` as the acceptor's doorbell.
fn answer_ringing(
    l: &ShmLink,
    m: &ShmLink,
    dst: IpAddr,
    magic: &[u8; 8],
    caps: u32,
    doorbell: RawFd,
) -> (UnixStream, std::net::UdpSocket) {
    let udp = std::net::UdpSocket::bind((dst, 4791)).unwrap();
    let name = UnixAddr::from_abstract_name(rendezvous_name(Gid::from_ip(dst)).as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&name).unwrap();
    let mut t = dgram(l, m, b"to a peer", None);
    t.dst = dst;
    l.send_one(t, &mut drop);
    let (s, _) = listener.accept().unwrap();
    let mut hello = [0u8; MSG_LEN];
    let (n, fds) = sys::recv_fds(s.as_raw_fd(), &mut hello, 2).unwrap();
    assert_eq!((n, &hello[..8], fds.len()), (MSG_LEN, &HELLO[..], 2));
    // The answer names `dst` as the acceptor's GID, and the socket that
    // proves it.
    let mut answer = m.hello(ANSWER, Gid::from_ip(dst), caps);
    answer[..8].copy_from_slice(magic);
    answer[24] = 1;
    answer[25..41].copy_from_slice(&Gid::from_ip(dst).0);
    super::hello::set_fds(&mut answer, 0, &[udp.as_raw_fd() as u32]);
    sys::send_fds(s.as_raw_fd(), &answer, &[doorbell]).unwrap();
    (s, udp)
}

/// A peer of another ring version gets no channel, whichever end it is:
/// its hello and answer carry that version's magic (`SVSHMHI3`,
/// `SVSHMOK3` for ring version 2), which this end refuses and counts,
/// without mapping anything the peer sent. The same messages with this
/// version's magic give a channel, so the magic alone made the difference.
#[test]
fn a_peer_of_another_ring_version_gets_no_channel() {
    let (l, m) = (link(), link());
    let region = Region::create().unwrap();
    let bell = ringer(&m);
    let fds = [region.file().as_raw_fd(), bell.as_raw_fd()];

    // An old connector: `l` closes the connection without an answer.
    let mut old = m.hello(HELLO, l.gids[0], 0);
    old[..8].copy_from_slice(b"SVSHMHI3");
    let s = hello_to(&l, &old, &fds);
    drive_until_stat(&l, "shm_channels_refused", 1);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((&s).read(&mut [0u8; MSG_LEN]).unwrap(), 0);
    assert_eq!(stat(&l, "shm_channels_accepted"), 0);
    assert!(!l.is_shm_peer(m.gids[0]));
    let _s = hello_to(&l, &m.hello(HELLO, l.gids[0], 0), &fds);
    drive_until_stat(&l, "shm_channels_accepted", 1);
    assert!(l.is_shm_peer(m.gids[0]));

    // An old acceptor: `l` gives the channel up when the answer comes.
    let old_peer = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 77));
    let _s = answer_as(&l, &m, old_peer, b"SVSHMOK3");
    drive_until_stat(&l, "shm_channels_refused", 2);
    assert!(!l.is_shm_peer(Gid::from_ip(old_peer)));
    let new_peer = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 78));
    let _s = answer_as(&l, &m, new_peer, ANSWER);
    drive_until(&l, |l| l.is_shm_peer(Gid::from_ip(new_peer)));
    assert!(l.is_shm_peer(Gid::from_ip(new_peer)), "{:?}", l.peer_lines());
    assert_eq!(stat(&l, "shm_channels_refused"), 2);
}

/// A peer that offers trains but not trains of one packet (this ring
/// version before `CAP_TRAINS1`) gets trains of several packets only; one
/// that offers both gets both, and its hello says so.
#[test]
fn trains_of_one_packet_go_only_to_peers_that_take_them() {
    let (l, m) = (link(), link());
    for (k, caps) in [CAP_TRAINS, CAP_TRAINS | CAP_TRAINS1].into_iter().enumerate() {
        let peer = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 80 + k as u8));
        let _s = answer_with(&l, &m, peer, ANSWER, caps);
        drive_until(&l, |l| l.is_shm_peer(Gid::from_ip(peer)));
        assert!(l.is_shm_peer(Gid::from_ip(peer)), "{:?}", l.peer_lines());
        let got = l.train_caps(peer);
        assert!(got.shared && !got.process, "{got:?}");
        assert_eq!(got.one_packet, caps & CAP_TRAINS1 != 0, "caps {caps:#x}");
    }
    // This end offers both.
    let caps = ShmLink::parse_caps(&l.hello(HELLO, m.gids[0], l.offer_caps()));
    assert_eq!(caps & (CAP_TRAINS | CAP_TRAINS1), CAP_TRAINS | CAP_TRAINS1);
}

/// With `Only` and a channel up, the UDP socket is read on the slow
/// path's turns only: an empty receive call costs ~0.4 µs, and a ring
/// datagram arriving meanwhile waited for it. What an `Auto` peer sends by
/// UDP before its channel is up still arrives: on the next slow turn, and
/// what that read left behind (an idle socket is probed for one datagram)
/// on the turns after it.
#[test]
fn only_mode_reads_udp_on_slow_turns() {
    let (a, b) = pair(false, false);
    let udp_reads = |l: &ShmLink| l.udp.stats().rx_syscalls;
    // Four bytes are no RoCEv2 packet: read and counted, not delivered.
    let udp_read = |l: &ShmLink| l.udp.stats().rx_truncated;
    let sock = std::net::UdpSocket::bind((LO4, 0)).unwrap();
    for _ in 0..3 {
        sock.send_to(&[0u8; 4], b.udp.local_addrs()[0]).unwrap();
    }
    let mut got = Vec::new();
    // A receive turn on which the slow path is not due: it last ran "in
    // the future" (so no preemption of this thread can make it due).
    let fast_turn = |got: &mut Vec<Got>| {
        b.rx.last_slow.store(u64::MAX, Ordering::Relaxed);
        pump(&b, got);
    };
    let before = udp_reads(&b);
    for _ in 0..256 {
        fast_turn(&mut got);
    }
    assert_eq!(udp_reads(&b), before, "fast turns read UDP");
    assert_eq!(udp_read(&b), 0);
    let start = Instant::now();
    // The slow path is due (it runs on every 16th call): its turn probes
    // the idle socket and takes one.
    while udp_read(&b) == 0 && start.elapsed() < Duration::from_secs(10) {
        b.rx.last_slow.store(0, Ordering::Relaxed);
        pump(&b, &mut got);
    }
    assert_eq!(udp_read(&b), 1, "{:?}", b.udp.stats());
    // That read found something: the turns after it read on.
    while udp_read(&b) < 3 && start.elapsed() < Duration::from_secs(10) {
        fast_turn(&mut got);
    }
    assert_eq!(udp_read(&b), 3, "{:?}", b.udp.stats());
    // One more read finds the socket empty; after it, fast turns stop.
    fast_turn(&mut got);
    let settled = udp_reads(&b);
    for _ in 0..256 {
        fast_turn(&mut got);
    }
    assert_eq!(udp_reads(&b), settled);
    assert!(got.is_empty());
    drop(a);
}

/// A reader that slept (a progress thread) was woken by its poller, which
/// is edge-triggered: its first receive turn must read the UDP socket in
/// either mode, or a datagram from a UDP-only peer would wait there for
/// the next wake-up.
#[test]
fn a_woken_reader_reads_udp() {
    for mode in [ShmMode::Auto, ShmMode::Only] {
        let (a, b) = pair_in(mode, false, false);
        let sock = std::net::UdpSocket::bind((LO4, 0)).unwrap();
        sock.send_to(&[0u8; 4], b.udp.local_addrs()[0]).unwrap();
        assert!(b.prepare_sleep());
        // Not a call on which `Auto` reads UDP anyway (every 8th).
        b.rx.calls.store(1, Ordering::Relaxed);
        b.recv(64, &mut |_| {});
        assert_eq!(b.udp.stats().rx_truncated, 1, "{mode:?}: {:?}", b.udp.stats());
        drop(a);
    }
}
