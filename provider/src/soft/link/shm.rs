//! The shared-memory link: RDMA between soft devices of different
//! processes on one host, through lock-free rings in shared memory, with
//! the UDP link as the path to everyone else.
//!
//! [`ShmLink`] wraps a device's [`UdpLink`] and routes each datagram by
//! destination: to a shared-memory channel when the destination device is
//! on this host and offers one, else to UDP. The datagrams are exactly the
//! RoCEv2 UDP payloads the UDP link carries, with their addresses and
//! ports; the engine (DESIGN §3) is unchanged and cannot tell the paths
//! apart, except that no ICRC is computed for the shared-memory path
//! (nothing can flip a bit there, and a hostile peer could compute it
//! anyway).
//!
//! # Rendezvous
//!
//! Every device with shared memory listens on one unix stream socket per
//! GID, in the abstract namespace, named `softverbs-shm/<GID as 32 hex
//! digits>`. Abstract names vanish with their process (no stale files
//! after a crash) and are per network namespace, which matches "same
//! host" exactly: devices in other namespaces are reached by UDP.
//!
//! On the first datagram to a destination GID (not its own), a device
//! tries to connect to that name. A refusal means "no shared memory
//! there": the destination is remembered as UDP for [`RETRY_NS`]. On
//! success it checks that the listener runs under its own uid, creates
//! the channel region (a sealed memfd, [`ring`]) and an eventfd doorbell
//! is passed along with it (SCM_RIGHTS) in a hello that names the target
//! GID and its own GIDs. The acceptor (in its next receive turn; the
//! listener is in its poll set) checks the uid, the target GID, the seals
//! and the format, maps the region, answers with its own GIDs and
//! doorbell, and rings the connector's doorbell so that it sees the
//! answer. Until the answer arrives the connector keeps sending by UDP
//! ([`ShmMode::Auto`]) or holds the datagrams ([`ShmMode::Only`]). If two
//! devices connect to each other at once, two channels exist; each side
//! sends on one and reads both.
//!
//! # Doorbell
//!
//! A reader that spins (busy-polling application, spinning progress
//! thread) is never signalled: the writer publishes the slot and checks
//! the reader's sleep flag, which is clear. Before a reader sleeps
//! ([`Link::prepare_sleep`]) it sets the flag in every ring it reads,
//! issues a full fence and looks at the rings once more; the writer
//! publishes, fences and reads the flag, so one of the two sees the
//! other (no lost wake-up), and the writer then writes the reader's
//! eventfd, which is in the reader's [`Link::poll_fds`].
//!
//! # Peer death and misbehaviour
//!
//! Each channel keeps its unix socket open; every receive turn that runs
//! the slow path (about every [`SLOW_NS`], and after every sleep) peeks
//! it, and EOF or an error (the peer process died or closed the device)
//! ends the channel: its destinations go back to UDP, where a vanished
//! host's QPs end with `RETRY_EXC_ERR` after their retries. A peer that
//! publishes an impossible ring index ends the channel the same way; one
//! that writes an impossible length loses that slot; both are counted
//! (`shm_rx_bad_index`, `shm_rx_bad_len`). A datagram whose addresses do
//! not belong to the channel's two ends is dropped (`shm_rx_bad_addr`).
//! See [`ring`] for why no value the peer writes can make this process
//! touch memory outside the mapping.

pub mod ring;
mod sys;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use super::udp::UdpLink;
use super::Link;
use crate::soft::engine::{process_now, DeviceShared};
use crate::soft::proto::{Counters, Datagram, Nanos, Transmit};
use crate::verbs::Gid;
use ring::{Consumer, Popped, Producer, PushError, Region, SlotMeta};

/// How a device uses shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmMode {
    /// Shared memory to peers on this host that offer it, UDP otherwise.
    Auto,
    /// Shared memory only: datagrams to peers without a channel are
    /// dropped (held while a channel is being set up).
    Only,
}

/// How long a destination without shared memory is sent to by UDP before
/// the next attempt to connect.
pub const RETRY_NS: Nanos = 1_000_000_000;
/// Longest interval between two runs of the slow path (accepting
/// channels, answers, peer liveness) while receive turns happen.
pub const SLOW_NS: Nanos = 100_000;
/// How long a connector waits for the acceptor's answer.
const ANSWER_NS: Nanos = 2_000_000_000;
/// Datagrams a channel holds back (full ring, channel being set up).
const BACKLOG_MAX: usize = 8192;
/// Length of the hello and answer messages.
const MSG_LEN: usize = 288;
const MAX_GIDS: usize = 16;
const HELLO: &[u8; 8] = b"SVSHMHI1";
const ANSWER: &[u8; 8] = b"SVSHMOK1";

const PENDING: u8 = 0;
const UP: u8 = 1;
const DEAD: u8 = 2;
/// The peer closed: read what it published before, then [`DEAD`].
const CLOSING: u8 = 3;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The abstract socket name of the device owning `gid`.
pub fn rendezvous_name(gid: Gid) -> String {
    let hex: String = gid.0.iter().map(|b| format!("{b:02x}")).collect();
    format!("softverbs-shm/{hex}")
}

#[derive(Debug, Default)]
struct Stats {
    tx_datagrams: AtomicU64,
    rx_datagrams: AtomicU64,
    tx_backlogged: AtomicU64,
    tx_drops: AtomicU64,
    tx_no_channel: AtomicU64,
    doorbells: AtomicU64,
    rx_bad_len: AtomicU64,
    rx_bad_index: AtomicU64,
    rx_bad_addr: AtomicU64,
    opened: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    connect_failed: AtomicU64,
    peers_lost: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug)]
struct TxSide {
    prod: Producer,
    backlog: VecDeque<Transmit>,
}

#[derive(Debug)]
struct RxSide {
    cons: Consumer,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Peer {
    gids: Vec<IpAddr>,
    doorbell: OwnedFd,
}

/// One channel: a region with a ring each way, to one peer device.
#[derive(Debug)]
struct Channel {
    stream: UnixStream,
    region: Region,
    connector: bool,
    pid: u32,
    since: Nanos,
    state: AtomicU8,
    tx: Mutex<TxSide>,
    rx: Mutex<RxSide>,
    peer: OnceLock<Peer>,
}

impl Channel {
    fn new(stream: UnixStream, region: Region, connector: bool, pid: u32) -> Channel {
        let (tx_ring, rx_ring) = if connector { (0, 1) } else { (1, 0) };
        Channel {
            stream,
            region,
            connector,
            pid,
            since: process_now(),
            state: AtomicU8::new(PENDING),
            tx: Mutex::new(TxSide {
                prod: Producer::new(tx_ring),
                backlog: VecDeque::new(),
            }),
            rx: Mutex::new(RxSide {
                cons: Consumer::new(rx_ring),
                buf: Vec::with_capacity(ring::MAX_PAYLOAD),
            }),
            peer: OnceLock::new(),
        }
    }

    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    fn kill(&self) {
        if self.state.swap(DEAD, Ordering::AcqRel) != DEAD {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Pushes what it can of the backlog, then `t` (if any); the rest
    /// waits. Returns whether something was published.
    fn send(&self, t: Option<Transmit>, stats: &Stats) -> bool {
        let mut tx = lock(&self.tx);
        let tx = &mut *tx;
        if self.state() != UP {
            if let Some(t) = t {
                Self::hold(tx, t, stats);
            }
            return false;
        }
        let mut published = false;
        while let Some(b) = tx.backlog.pop_front() {
            match self.push(&mut tx.prod, &b, stats) {
                Ok(()) => published = true,
                Err(()) => {
                    tx.backlog.push_front(b);
                    break;
                }
            }
        }
        if let Some(t) = t {
            if !tx.backlog.is_empty() {
                Self::hold(tx, t, stats);
            } else if self.push(&mut tx.prod, &t, stats).is_ok() {
                published = true;
            } else if self.state() == UP {
                Self::hold(tx, t, stats);
            }
        }
        published
    }

    fn hold(tx: &mut TxSide, t: Transmit, stats: &Stats) {
        if tx.backlog.len() >= BACKLOG_MAX {
            bump(&stats.tx_drops);
        } else {
            bump(&stats.tx_backlogged);
            tx.backlog.push_back(t);
        }
    }

    /// `Err`: keep the datagram (full ring); a datagram that can never go
    /// is dropped and counted with `Ok`.
    fn push(&self, prod: &mut Producer, t: &Transmit, stats: &Stats) -> Result<(), ()> {
        let meta = SlotMeta {
            src: t.src,
            dst: t.dst,
            src_port: t.src_port,
            dst_port: t.dst_port,
        };
        match prod.push(&self.region, &meta, &t.data) {
            Ok(()) => {
                bump(&stats.tx_datagrams);
                Ok(())
            }
            Err(PushError::Full) => Err(()),
            Err(PushError::TooLong) => {
                bump(&stats.tx_drops);
                Ok(())
            }
            Err(PushError::Corrupt) => {
                bump(&stats.rx_bad_index);
                self.kill();
                Err(())
            }
        }
    }

    /// Rings the peer's doorbell if it sleeps.
    fn kick(&self, stats: &Stats) {
        let Some(peer) = self.peer.get() else { return };
        let sleeping = lock(&self.tx).prod.consumer_sleeping(&self.region);
        if sleeping {
            bump(&stats.doorbells);
            sys::ring(peer.doorbell.as_raw_fd());
        }
    }

    fn backlogged(&self) -> bool {
        !lock(&self.tx).backlog.is_empty()
    }
}

#[derive(Debug)]
enum Route {
    Chan(Arc<Channel>),
    /// No shared memory to this destination until then.
    Udp(Nanos),
}

/// A UDP link with shared-memory channels to devices on this host. See
/// the module docs.
#[derive(Debug)]
pub struct ShmLink {
    udp: Arc<UdpLink>,
    mode: ShmMode,
    gids: Vec<Gid>,
    ips: Vec<IpAddr>,
    listeners: Mutex<Vec<UnixListener>>,
    listener_fds: Vec<RawFd>,
    doorbell: OwnedFd,
    routes: RwLock<HashMap<IpAddr, Route, super::iphash::IpHash>>,
    chans: RwLock<Vec<Arc<Channel>>>,
    /// Channels up (cheap check on the receive path).
    up: AtomicU64,
    calls: AtomicU64,
    last_slow: AtomicU64,
    /// Slept since the last receive: run the slow path, clear the flags.
    armed: AtomicBool,
    backlogged: AtomicBool,
    detached: AtomicBool,
    stats: Stats,
}

impl ShmLink {
    /// Wraps `udp`: listens for channels on the rendezvous name of each of
    /// its GIDs.
    ///
    /// # Errors
    ///
    /// `AddrInUse` if a device with one of these GIDs already listens (in
    /// this network namespace); socket and eventfd errors.
    pub fn new(udp: Arc<UdpLink>, mode: ShmMode) -> io::Result<Arc<ShmLink>> {
        let gids = udp.gids();
        let mut listeners = Vec::new();
        for g in &gids {
            let addr = UnixAddr::from_abstract_name(rendezvous_name(*g).as_bytes())?;
            let l = UnixListener::bind_addr(&addr)?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
        let listener_fds = listeners.iter().map(|l| l.as_raw_fd()).collect();
        Ok(Arc::new(ShmLink {
            ips: gids.iter().map(|g| g.to_ip()).collect(),
            gids,
            udp,
            mode,
            listeners: Mutex::new(listeners),
            listener_fds,
            doorbell: sys::eventfd()?,
            routes: RwLock::new(HashMap::default()),
            chans: RwLock::new(Vec::new()),
            up: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            last_slow: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            backlogged: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            stats: Stats::default(),
        }))
    }

    /// The UDP link underneath.
    pub fn udp(&self) -> &Arc<UdpLink> {
        &self.udp
    }

    /// The mode.
    pub fn mode(&self) -> ShmMode {
        self.mode
    }

    /// Whether a shared-memory channel to `gid` is up.
    pub fn is_shm_peer(&self, gid: Gid) -> bool {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        matches!(routes.get(&gid.to_ip()), Some(Route::Chan(c)) if c.state() == UP)
    }

    /// One line per known peer: `GID shm up pid N`, `GID shm pending`,
    /// `GID udp` (no shared memory there).
    pub fn peer_lines(&self) -> Vec<String> {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        let mut lines: Vec<String> = routes
            .iter()
            .map(|(ip, r)| match r {
                Route::Chan(c) => {
                    let st = match c.state() {
                        PENDING => "pending",
                        UP => "up",
                        CLOSING => "closing",
                        _ => "dead",
                    };
                    let (tx, backlog) =
                        c.tx.try_lock()
                            .map_or(((0, 0), 0), |t| (t.prod.position(), t.backlog.len()));
                    let rx = c.rx.try_lock().map_or((0, 0), |r| r.cons.position());
                    format!(
                        "{} shm {st} pid {} tx {}/{} backlog {backlog} rx {}/{}",
                        Gid::from_ip(*ip),
                        c.pid,
                        tx.0,
                        tx.1,
                        rx.0,
                        rx.1
                    )
                }
                Route::Udp(_) => format!("{} udp", Gid::from_ip(*ip)),
            })
            .collect();
        lines.sort();
        lines
    }

    fn routes_w(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<IpAddr, Route, super::iphash::IpHash>> {
        self.routes.write().unwrap_or_else(|p| p.into_inner())
    }

    fn chans_r(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Channel>>> {
        self.chans.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The channel datagrams to `dst` go on (`None`: UDP, or nothing in
    /// [`ShmMode::Only`]).
    fn channel_for(&self, dst: IpAddr) -> Option<Arc<Channel>> {
        let pick = |c: &Arc<Channel>| match c.state() {
            UP => Some(Some(c.clone())),
            PENDING => Some((self.mode == ShmMode::Only).then(|| c.clone())),
            _ => None,
        };
        let now;
        {
            let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
            match routes.get(&dst) {
                Some(Route::Chan(c)) => {
                    if let Some(r) = pick(c) {
                        return r;
                    }
                    now = process_now();
                }
                Some(Route::Udp(until)) => {
                    now = process_now();
                    if now < *until {
                        return None;
                    }
                }
                None => now = process_now(),
            }
        }
        if self.ips.contains(&dst) {
            self.routes_w().insert(dst, Route::Udp(Nanos::MAX));
            return None;
        }
        let mut routes = self.routes_w();
        match routes.get(&dst) {
            Some(Route::Chan(c)) => {
                if let Some(r) = pick(c) {
                    return r;
                }
            }
            Some(Route::Udp(until)) if now < *until => return None,
            _ => {}
        }
        match self.connect_to(Gid::from_ip(dst)) {
            Ok(c) => {
                bump(&self.stats.opened);
                self.chans.write().unwrap_or_else(|p| p.into_inner()).push(c.clone());
                routes.insert(dst, Route::Chan(c.clone()));
                pick(&c).flatten()
            }
            Err(_) => {
                bump(&self.stats.connect_failed);
                routes.insert(dst, Route::Udp(now.saturating_add(RETRY_NS)));
                None
            }
        }
    }

    fn hello(&self, magic: &[u8; 8], target: Gid) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        m[..8].copy_from_slice(magic);
        m[8..24].copy_from_slice(&target.0);
        let n = self.gids.len().min(MAX_GIDS);
        m[24] = n as u8;
        for (i, g) in self.gids.iter().take(n).enumerate() {
            m[25 + 16 * i..41 + 16 * i].copy_from_slice(&g.0);
        }
        m
    }

    /// Parses the GIDs of a hello or answer (untrusted input).
    fn parse_gids(m: &[u8; MSG_LEN]) -> Vec<IpAddr> {
        let n = usize::from(m[24]).min(MAX_GIDS);
        (0..n)
            .map(|i| {
                let mut g = [0u8; 16];
                g.copy_from_slice(&m[25 + 16 * i..41 + 16 * i]);
                Gid(g).to_ip()
            })
            .filter(|ip| !ip.is_unspecified())
            .collect()
    }

    /// Connects to the device owning `gid` and sends the hello; the
    /// channel is pending until the answer.
    fn connect_to(&self, gid: Gid) -> io::Result<Arc<Channel>> {
        let addr = UnixAddr::from_abstract_name(rendezvous_name(gid).as_bytes())?;
        let stream = UnixStream::connect_addr(&addr)?;
        let (pid, uid) = sys::peer_cred(stream.as_raw_fd())?;
        if uid != sys::euid() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "peer of another user"));
        }
        let region = Region::create()?;
        let msg = self.hello(HELLO, gid);
        sys::send_fds(
            stream.as_raw_fd(),
            &msg,
            &[region.file().as_raw_fd(), self.doorbell.as_raw_fd()],
        )?;
        stream.set_nonblocking(true)?;
        Ok(Arc::new(Channel::new(stream, region, true, pid)))
    }

    /// Accepts one connection: checks and maps the region, answers.
    fn accept_one(&self, stream: UnixStream) -> io::Result<Arc<Channel>> {
        let (pid, uid) = sys::peer_cred(stream.as_raw_fd())?;
        if uid != sys::euid() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "peer of another user"));
        }
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        // The connector sends its hello right after connecting.
        if !sys::wait_readable(stream.as_raw_fd(), 50) {
            return Err(bad("no hello"));
        }
        let mut m = [0u8; MSG_LEN];
        let (n, mut fds) = sys::recv_fds(stream.as_raw_fd(), &mut m, 2)?;
        if n != MSG_LEN || &m[..8] != HELLO || fds.len() != 2 {
            return Err(bad("malformed hello"));
        }
        let mut target = [0u8; 16];
        target.copy_from_slice(&m[8..24]);
        if !self.gids.contains(&Gid(target)) {
            return Err(bad("hello for another device"));
        }
        let gids = Self::parse_gids(&m);
        if gids.is_empty() || gids.iter().any(|ip| self.ips.contains(ip)) {
            return Err(bad("hello without usable GIDs"));
        }
        let doorbell = fds.pop().ok_or_else(|| bad("no doorbell"))?;
        let file = std::fs::File::from(fds.pop().ok_or_else(|| bad("no region"))?);
        let region = Region::open(file)?;
        let answer = self.hello(ANSWER, Gid(target));
        sys::send_fds(stream.as_raw_fd(), &answer, &[self.doorbell.as_raw_fd()])?;
        stream.set_nonblocking(true)?;
        let c = Arc::new(Channel::new(stream, region, false, pid));
        let _ = c.peer.set(Peer { gids, doorbell });
        c.state.store(UP, Ordering::Release);
        // The connector may sleep: wake it to read the answer.
        if let Some(p) = c.peer.get() {
            sys::ring(p.doorbell.as_raw_fd());
        }
        Ok(c)
    }

    /// Maps the peer GIDs of an up channel to it (unless another up
    /// channel serves them).
    fn route_peer(&self, c: &Arc<Channel>) {
        let Some(peer) = c.peer.get() else { return };
        let mut routes = self.routes_w();
        for ip in &peer.gids {
            let keep = matches!(routes.get(ip), Some(Route::Chan(o)) if o.state() == UP && !Arc::ptr_eq(o, c));
            if !keep {
                routes.insert(*ip, Route::Chan(c.clone()));
            }
        }
    }

    /// Checks a connector's channel for the answer.
    fn poll_answer(&self, c: &Arc<Channel>, now: Nanos) {
        let mut m = [0u8; MSG_LEN];
        match sys::recv_fds(c.stream.as_raw_fd(), &mut m, 1) {
            Ok((MSG_LEN, mut fds)) if &m[..8] == ANSWER && fds.len() == 1 => {
                let gids = Self::parse_gids(&m);
                let Some(doorbell) = fds.pop() else { return };
                if gids.is_empty() || gids.iter().any(|ip| self.ips.contains(ip)) {
                    bump(&self.stats.refused);
                    c.kill();
                    return;
                }
                let _ = c.peer.set(Peer { gids, doorbell });
                c.state.store(UP, Ordering::Release);
                self.up.fetch_add(1, Ordering::Relaxed);
                self.route_peer(c);
                // Datagrams held while pending.
                if c.send(None, &self.stats) {
                    c.kick(&self.stats);
                }
                if c.backlogged() {
                    self.backlogged.store(true, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if now.saturating_sub(c.since) > ANSWER_NS {
                    bump(&self.stats.refused);
                    c.kill();
                }
            }
            _ => {
                bump(&self.stats.refused);
                c.kill();
            }
        }
    }

    /// Accepts channels, completes pending ones, checks that peers are
    /// alive, retires dead channels, retries backlogs.
    fn slow_path(&self, now: Nanos) {
        self.last_slow.store(now, Ordering::Relaxed);
        let mut accepted = Vec::new();
        {
            let listeners = lock(&self.listeners);
            for l in listeners.iter() {
                while let Ok((s, _)) = l.accept() {
                    match self.accept_one(s) {
                        Ok(c) => accepted.push(c),
                        Err(_) => bump(&self.stats.refused),
                    }
                }
            }
        }
        for c in accepted {
            bump(&self.stats.accepted);
            self.up.fetch_add(1, Ordering::Relaxed);
            self.chans.write().unwrap_or_else(|p| p.into_inner()).push(c.clone());
            self.route_peer(&c);
        }
        let chans: Vec<Arc<Channel>> = self.chans_r().clone();
        let mut dead = false;
        for c in &chans {
            match c.state() {
                PENDING if c.connector => self.poll_answer(c, now),
                UP if lock(&c.rx).cons.is_broken() => c.kill(),
                UP if sys::peer_closed(c.stream.as_raw_fd()) => {
                    // Everything the peer published before it closed is
                    // visible now: the next receive turn reads it, then
                    // ends the channel.
                    bump(&self.stats.peers_lost);
                    c.state.store(CLOSING, Ordering::Release);
                }
                _ => {}
            }
            if c.state() == DEAD {
                dead = true;
            }
        }
        if dead {
            let mut list = self.chans.write().unwrap_or_else(|p| p.into_inner());
            list.retain(|c| {
                if c.state() == DEAD {
                    if c.peer.get().is_some() {
                        self.up.fetch_sub(1, Ordering::Relaxed);
                    }
                    false
                } else {
                    true
                }
            });
            drop(list);
            let mut routes = self.routes_w();
            for r in routes.values_mut() {
                if matches!(r, Route::Chan(c) if c.state() == DEAD) {
                    *r = Route::Udp(now.saturating_add(RETRY_NS));
                }
            }
        }
        self.flush_backlogs();
    }

    /// Retries the channels' backlogs; returns whether none is left.
    /// The flag is cleared before the scan and set again if something is
    /// left, so a sender that backlogs meanwhile (and sets it after)
    /// cannot be forgotten.
    fn flush_backlogs(&self) -> bool {
        if !self.backlogged.swap(false, Ordering::SeqCst) {
            return true;
        }
        let mut left = false;
        for c in self.chans_r().iter() {
            if c.state() == UP && c.send(None, &self.stats) {
                c.kick(&self.stats);
            }
            if c.state() != DEAD && c.backlogged() {
                left = true;
            }
        }
        if left {
            self.backlogged.store(true, Ordering::SeqCst);
        }
        !left
    }

    fn receive(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        if self.detached.load(Ordering::Relaxed) {
            return 0;
        }
        let calls = self.calls.fetch_add(1, Ordering::Relaxed);
        let woke = self.armed.swap(false, Ordering::AcqRel);
        if woke {
            sys::drain(self.doorbell.as_raw_fd());
            for c in self.chans_r().iter() {
                let mut rx = lock(&c.rx);
                c.region_wake(&mut rx);
            }
        }
        // The clock is read every few calls only: a busy-polling reader
        // calls this millions of times a second.
        if woke || calls.is_multiple_of(16) {
            let now = process_now();
            if woke || now.saturating_sub(self.last_slow.load(Ordering::Relaxed)) >= SLOW_NS {
                self.slow_path(now);
            }
        }
        if self.backlogged.load(Ordering::Relaxed) {
            self.flush_backlogs();
        }
        let mut n = 0;
        let up = self.up.load(Ordering::Relaxed);
        if up > 0 {
            for c in self.chans_r().iter() {
                let st = c.state();
                if (st != UP && st != CLOSING) || n >= budget {
                    continue;
                }
                let left = budget - n;
                let got = self.read_channel(c, left, f);
                n += got;
                if st == CLOSING && got < left {
                    c.kill();
                }
            }
        }
        let udp_every = match self.mode {
            ShmMode::Auto => 8,
            ShmMode::Only => 64,
        };
        if up == 0 || calls.is_multiple_of(udp_every) {
            n += self.udp.recv(budget.saturating_sub(n).max(1), f);
        }
        n
    }

    fn read_channel(&self, c: &Channel, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        let Some(peer) = c.peer.get() else { return 0 };
        let mut rx = lock(&c.rx);
        let rx = &mut *rx;
        let mut n = 0;
        while n < budget {
            match rx.cons.pop(&c.region, &mut rx.buf) {
                Ok(None) => break,
                Err(()) => {
                    bump(&self.stats.rx_bad_index);
                    c.kill();
                    break;
                }
                Ok(Some(Popped::BadLength)) => bump(&self.stats.rx_bad_len),
                Ok(Some(Popped::Datagram(m))) => {
                    n += 1;
                    if !self.ips.contains(&m.dst) || !peer.gids.contains(&m.src) {
                        bump(&self.stats.rx_bad_addr);
                        continue;
                    }
                    bump(&self.stats.rx_datagrams);
                    f(Datagram {
                        src: m.src,
                        dst: m.dst,
                        src_port: m.src_port,
                        dst_port: m.dst_port,
                        data: &rx.buf,
                    });
                }
            }
        }
        n
    }

    /// Duplicates of the memfds of the open channels, with whether this
    /// side connected (then it writes ring 0 and reads ring 1; else the
    /// reverse). For tests that play a broken peer, and for tools that
    /// inspect the rings.
    pub fn channel_files(&self) -> Vec<(std::fs::File, bool)> {
        self.chans_r()
            .iter()
            .filter_map(|c| Some((c.region.file().try_clone().ok()?, c.connector)))
            .collect()
    }

    /// The link's counters.
    pub fn shm_stats(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("shm_tx_datagrams", g(&s.tx_datagrams)),
            ("shm_rx_datagrams", g(&s.rx_datagrams)),
            ("shm_tx_backlogged", g(&s.tx_backlogged)),
            ("shm_tx_drops", g(&s.tx_drops)),
            ("shm_tx_no_channel", g(&s.tx_no_channel)),
            ("shm_doorbells", g(&s.doorbells)),
            ("shm_rx_bad_len", g(&s.rx_bad_len)),
            ("shm_rx_bad_index", g(&s.rx_bad_index)),
            ("shm_rx_bad_addr", g(&s.rx_bad_addr)),
            ("shm_channels_opened", g(&s.opened)),
            ("shm_channels_accepted", g(&s.accepted)),
            ("shm_channels_refused", g(&s.refused)),
            ("shm_connect_failed", g(&s.connect_failed)),
            ("shm_peers_lost", g(&s.peers_lost)),
        ]
    }
}

impl Channel {
    fn region_wake(&self, rx: &mut RxSide) {
        rx.cons.wake(&self.region);
    }
}

impl Link for ShmLink {
    fn send(&self, tx: Transmit) -> Option<Arc<DeviceShared>> {
        let mut v = vec![tx];
        self.send_batch(&mut v, &mut Vec::new());
        None
    }

    fn send_batch(&self, txs: &mut Vec<Transmit>, reached: &mut Vec<Arc<DeviceShared>>) {
        if self.detached.load(Ordering::Relaxed) {
            // What a device sends as it goes (the ACKs it held back) still
            // reaches peers on channels that are up; nothing else.
            for t in txs.drain(..) {
                let c = match self.routes.read().unwrap_or_else(|p| p.into_inner()).get(&t.dst) {
                    Some(Route::Chan(c)) if c.state() == UP => c.clone(),
                    _ => continue,
                };
                c.send(Some(t), &self.stats);
                c.kick(&self.stats);
            }
            return;
        }
        let mut udp_out: Vec<Transmit> = Vec::new();
        // Channels to kick once at the end; the first one without a heap
        // allocation (a batch nearly always goes to one peer).
        let mut kicked_first: Option<Arc<Channel>> = None;
        let mut kicked: Vec<Arc<Channel>> = Vec::new();
        for t in txs.drain(..) {
            match self.channel_for(t.dst) {
                Some(c) => {
                    let up = c.state() == UP;
                    c.send(Some(t), &self.stats);
                    if !up || c.backlogged() {
                        self.backlogged.store(true, Ordering::SeqCst);
                    }
                    let seen = |k: &Arc<Channel>| Arc::ptr_eq(k, &c);
                    if up && !kicked_first.as_ref().is_some_and(seen) && !kicked.iter().any(seen) {
                        if kicked_first.is_none() {
                            kicked_first = Some(c);
                        } else {
                            kicked.push(c);
                        }
                    }
                }
                None if self.mode == ShmMode::Only => bump(&self.stats.tx_no_channel),
                None => udp_out.push(t),
            }
        }
        for c in kicked_first.into_iter().chain(kicked) {
            c.kick(&self.stats);
        }
        if !udp_out.is_empty() {
            self.udp.send_batch(&mut udp_out, reached);
        }
    }

    fn recv(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        self.receive(budget, f)
    }

    fn flush(&self) -> bool {
        let shm = self.flush_backlogs();
        self.udp.flush() && shm
    }

    fn prepare_sleep(&self) -> bool {
        self.armed.store(true, Ordering::Release);
        let mut ok = true;
        for c in self.chans_r().iter() {
            if c.state() == UP && c.peer.get().is_some() {
                let mut rx = lock(&c.rx);
                if !rx.cons.prepare_sleep(&c.region) {
                    ok = false;
                }
            }
        }
        ok && self.udp.prepare_sleep()
    }

    fn poll_fds(&self) -> Vec<RawFd> {
        let mut fds = self.udp.poll_fds();
        fds.extend_from_slice(&self.listener_fds);
        fds.push(self.doorbell.as_raw_fd());
        fds
    }

    fn needs_icrc(&self) -> bool {
        // UDP computes and checks it itself; shared memory needs none.
        false
    }

    fn merge_counters(&self, counters: &mut Counters) {
        self.udp.merge_counters(counters);
        let bad = self.stats.rx_bad_len.load(Ordering::Relaxed) + self.stats.rx_bad_addr.load(Ordering::Relaxed);
        counters.rx_malformed += bad;
        counters.rx_packets += bad;
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.shm_stats();
        v.extend(self.udp.stats().iter());
        v
    }

    fn peers(&self) -> Vec<String> {
        self.peer_lines()
    }

    fn attach(&self, dev: &Arc<DeviceShared>) {
        self.udp.attach(dev);
    }

    fn detach(&self, dev: &DeviceShared) {
        self.detached.store(true, Ordering::Relaxed);
        // Channels stay up until the link is dropped (their sockets close
        // then and the peers see it), so that what the device sends while
        // it goes still arrives.
        lock(&self.listeners).clear();
        self.udp.detach(dev);
    }

    fn name(&self) -> &'static str {
        match self.mode {
            ShmMode::Auto => "shm+udp",
            ShmMode::Only => "shm",
        }
    }
}
