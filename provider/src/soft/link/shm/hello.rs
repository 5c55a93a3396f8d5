//! Rendezvous (see the parent module): the hello a connector sends with
//! the channel region and its doorbell, the acceptor's answer, the
//! capability word both carry, and the cross-memory-attach probe.
//!
//! # Hello and answer
//!
//! The messages' layout is [`wire::Hello`](super::wire::Hello): magic
//! (`SVSHMHI5` or `SVSHMOK5`, for ring version 3 with socket doorbells; a
//! peer of another version gets no channel), the target GID, up to 16
//! GIDs, the capability word, the probe (address, value), and per GID
//! [`FDS_PER_GID`] descriptor numbers: the sender's descriptors of the UDP
//! sockets bound to that GID, which the receiver checks (the parent
//! module's "Trust"). The hello passes the region's memfd and the
//! doorbell, the answer the doorbell (SCM_RIGHTS). Capabilities:
//!
//! - [`CAP_TRAINS`]: this end sends and receives trains.
//! - [`CAP_CMA`]: this end sends trains of its own process memory, and
//!   the probe is the address and value of a word of its memory.
//! - [`CAP_CMA_READ`]: this end read the peer's probe (below): the peer
//!   may send it trains of the peer's process memory.
//! - [`CAP_TRAINS1`]: this end takes trains of one packet (a message that
//!   fits the MTU). Without it (a build of this ring version from before)
//!   the peer sends only messages of several packets as trains.
//!
//! # Probe (cross-memory attach)
//!
//! A train piece may be a range of the sender's address space, which the
//! receiver copies with `process_vm_readv` straight into the destination
//! (`shm/trains.rs`). Whether the receiver may do that depends on the
//! kernel's ptrace access check (same uid and no privilege gained, not
//! made non-dumpable, Yama `ptrace_scope`: 0 lets any same-uid process
//! read, 1 only an ancestor or a process the target named with
//! `PR_SET_PTRACER`, 2 only `CAP_SYS_PTRACE`, 3 nobody), which can differ
//! between the two directions. So it is verified, never assumed: a side
//! that receives a hello or answer with [`CAP_CMA`] opens a pidfd for the
//! peer (the pid from `SO_PEERCRED`, not from the message) and reads the
//! announced probe word from it; only if that read succeeds and shows the
//! announced value does it accept process-memory pieces on this channel,
//! and it says so: the acceptor in its answer ([`CAP_CMA_READ`]), the
//! connector (which reads the acceptor's probe when the answer arrives) in
//! a caps slot ([`ring::KIND_CAPS`](super::ring::KIND_CAPS)), the first
//! slot it publishes. A side sends process-memory trains only after it got
//! that word; until then its trains carry shareable buffers only, and
//! other messages go as packets. We never loosen this process's ptrace
//! protection ourselves (no `PR_SET_PTRACER`, no `PR_SET_DUMPABLE`): where
//! the system forbids the read, the channel simply carries no
//! process-memory trains that way (`shm_cma_probe_failed`).
//!
//! A lying peer gains nothing: its probe can only make us read its own
//! memory, which the kernel enforces for every later read too.

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::channel::{Peer, NO_META};
use super::limits::Charge;
use super::ring::{self, Region};
use super::wire::{
    Hello, HelloRepr, ANSWER, CAP_CMA, CAP_CMA_READ, CAP_TRAINS, CAP_TRAINS1, FDS_PER_GID, HELLO, MSG_LEN,
};
use super::{
    bump, lock, rendezvous_name, sys, Channel, Route, ShmLink, ANSWER_NS, DEAD, HELLOS_PER_TURN, HELLO_NS, UP,
};
use crate::soft::clock::process_now;
use crate::soft::link::Link;
use crate::soft::proto::Nanos;
use crate::verbs::{Gid, MappedPiece};

/// An accepted rendezvous connection waiting for its hello.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) stream: UnixStream,
    /// The connector's process (`SO_PEERCRED`).
    pid: u32,
    /// When it was accepted.
    since: Nanos,
    /// It had nothing to read at the last look (one just accepted has
    /// not been looked at).
    silent: bool,
}

/// A connector's channel, listed, whose hello is still to be sent
/// ([`ShmLink::send_hello`]).
pub(super) struct Connecting {
    pub(super) chan: Arc<Channel>,
    hello: [u8; MSG_LEN],
    /// The socket the acceptor rings our doorbell with (passed in the
    /// hello).
    bell: std::os::fd::OwnedFd,
}

/// The word of this process's memory peers read to verify that they may
/// read this process's memory; non-zero once set.
static PROBE: AtomicU64 = AtomicU64::new(0);

/// The address and value of this process's probe word.
pub(super) fn probe() -> (u64, u64) {
    let mut v = PROBE.load(Ordering::Relaxed);
    if v == 0 {
        let seed = process_now() ^ (u64::from(std::process::id()) << 32) ^ 0x5356_4d41_5052_4f42;
        let new = seed | 1;
        v = match PROBE.compare_exchange(0, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => new,
            Err(old) => old,
        };
    }
    (&PROBE as *const AtomicU64 as u64, v)
}

/// Whether this process can read the word at `addr` of process `pid` with
/// cross-memory attach, and it holds `value`.
pub(super) fn read_probe(pid: u32, addr: u64, value: u64) -> bool {
    let mut b = [0u8; 8];
    MappedPiece::remote(pid, addr, 8).copy_to(&mut b).is_ok() && u64::from_le_bytes(b) == value
}

/// Names `fds` (at most [`FDS_PER_GID`]) as the sockets of GID number `i`
/// of hello or answer `m`.
#[cfg(test)]
pub(super) fn set_fds(m: &mut [u8; MSG_LEN], i: usize, fds: &[u32]) {
    Hello::of_mut(m).set_fds(i, fds);
}

impl ShmLink {
    /// A hello or answer (`magic`) to `target` with capabilities `caps`
    /// (and the probe if they include [`CAP_CMA`]).
    pub(super) fn hello(&self, magic: &[u8; 8], target: Gid, caps: u32) -> [u8; MSG_LEN] {
        HelloRepr {
            magic: *magic,
            target,
            caps,
            probe: if caps & CAP_CMA != 0 { probe() } else { (0, 0) },
            gids: self.gids.iter().map(|g| (*g, self.udp_fds(*g))).collect(),
        }
        .emit()
    }

    /// This process's descriptors of the UDP sockets bound to `gid`'s
    /// endpoint.
    pub(super) fn udp_fds(&self, gid: Gid) -> Vec<u32> {
        let Some(ep) = self.udp.endpoint_of(gid) else {
            return Vec::new();
        };
        self.udp
            .poll_fds()
            .into_iter()
            .filter(|fd| sys::local_endpoint(*fd) == Some(ep))
            .filter_map(|fd| u32::try_from(fd).ok())
            .collect()
    }

    /// The capabilities this end offers: trains (process-memory trains,
    /// trains of one packet) if [`ShmLink::set_trains`] is on.
    pub(super) fn offer_caps(&self) -> u32 {
        if self.offer_trains.load(Ordering::Relaxed) {
            CAP_TRAINS | CAP_CMA | CAP_TRAINS1
        } else {
            0
        }
    }

    /// Whether this end may read process-memory pieces from the peer
    /// `c` whose hello or answer is `m`: both ends do trains, the peer
    /// offered them, and its probe reads back (see the module docs).
    fn verify_cma(&self, c: &Channel, m: &[u8; MSG_LEN]) -> bool {
        let caps = Self::parse_caps(m);
        if !c.offered || caps & CAP_TRAINS == 0 || caps & CAP_CMA == 0 {
            return false;
        }
        let (addr, value) = Hello::of(m).probe();
        let ok = c.pidfd.is_some() && read_probe(c.pid, addr, value);
        if !ok {
            bump(&self.stats.cma_probe_failed);
        }
        ok
    }

    /// The capabilities of a hello or answer.
    pub(super) fn parse_caps(m: &[u8; MSG_LEN]) -> u32 {
        Hello::of(m).caps()
    }

    /// Parses the GIDs of a hello or answer (untrusted input), each with
    /// the socket descriptors the sender names for it.
    pub(super) fn parse_claims(m: &[u8; MSG_LEN]) -> Vec<(IpAddr, Vec<u32>)> {
        Hello::of(m).claims()
    }

    /// Connects to the device owning `gid` and makes the channel, pending
    /// until the answer, in the list of channels; [`Self::send_hello`]
    /// then sends the hello. Never waits: a listener whose backlog is full
    /// is as good as none.
    ///
    /// The channel is in the list, whose pending channels the slow path
    /// polls for their answer, before the hello leaves: the acceptor
    /// answers and rings our doorbell as soon as it has the hello, and the
    /// receive turn woken by that ring must find the channel to read the
    /// answer. Listed after the hello, a turn that ran in between drained
    /// the ring and found no channel, and the reader slept on with the
    /// answer unread and the channel pending for good; meanwhile the
    /// acceptor, whose end was up, wrote into a ring whose reader had never
    /// armed its sleep flag, so nothing woke the reader again.
    pub(super) fn connect_to(&self, gid: Gid) -> io::Result<Connecting> {
        // Only a device of this host can answer, and its GIDs are
        // addresses of this host: for any other GID, whoever listens on
        // its name here is not the device that owns it.
        if !self.udp.endpoint_of(gid).is_some_and(|ep| sys::is_local(ep.ip())) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "not an address of this host"));
        }
        let limits = self.budget.limits();
        if self.chans_r().len() >= limits.max_channels {
            self.budget.refuse(format!(
                "no channel to {gid}: {} channels open (max_channels)",
                limits.max_channels
            ));
            return Err(io::Error::other("channel limit"));
        }
        let stream = sys::connect_abstract(rendezvous_name(gid).as_bytes())?;
        let (pid, uid) = sys::peer_cred(stream.as_raw_fd())?;
        if uid != sys::euid() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "peer of another user"));
        }
        let charge = self.charge_region(format_args!("GID {gid}"))?;
        let region = Region::create()?;
        let caps = self.offer_caps();
        let hello = self.hello(HELLO, gid, caps);
        let bell = sys::bell_sender(&self.doorbell)?;
        let chan = Arc::new(Channel {
            target: Some(gid.to_ip()),
            ..Channel::new(stream, region, true, pid, caps & CAP_TRAINS != 0, charge)
        });
        self.chans.write().unwrap_or_else(|p| p.into_inner()).push(chan.clone());
        Ok(Connecting { chan, hello, bell })
    }

    /// Sends the hello of a channel [`Self::connect_to`] made. If it cannot
    /// go, the channel ends and leaves the list (the caller routes its
    /// destination by UDP).
    pub(super) fn send_hello(&self, c: Connecting) -> io::Result<Arc<Channel>> {
        let Connecting { chan, hello, bell } = c;
        let sent = sys::send_fds(
            chan.stream.as_raw_fd(),
            &hello,
            &[chan.region.file().as_raw_fd(), bell.as_raw_fd()],
        );
        #[cfg(test)]
        super::tests::after_hello(self);
        if let Err(e) = sent {
            chan.kill();
            self.chans
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|o| !Arc::ptr_eq(o, &chan));
            return Err(e);
        }
        Ok(chan)
    }

    /// A channel region's share of the budget, or the refusal (counted
    /// and logged) of the channel to `peer`.
    fn charge_region(&self, peer: std::fmt::Arguments<'_>) -> io::Result<Charge> {
        self.budget.charge(ring::REGION_LEN as u64, 0).ok_or_else(|| {
            let limit = self.budget.limits().max_mapped_bytes;
            self.budget.refuse(format!(
                "no channel with {peer}: {limit} bytes mapped (max_mapped_bytes)"
            ));
            io::Error::other("mapped-bytes limit")
        })
    }

    /// Whether the list of connections waiting for their hello has room
    /// for one more ([`ShmLimits::max_pending_hellos`](super::ShmLimits)),
    /// made if need be by dropping the oldest one that had nothing to read
    /// at the last look (counted): a silent connection loses its place to
    /// a new one; one whose hello waits (beyond what a turn reads), or
    /// that was not looked at yet, never.
    pub(super) fn make_room(&self, hellos: &mut VecDeque<Pending>) -> bool {
        if hellos.len() < self.budget.limits().max_pending_hellos.max(1) {
            return true;
        }
        match hellos.iter().position(|p| p.silent) {
            Some(i) => {
                // Closing it takes it out of the epoll.
                hellos.remove(i);
                bump(&self.stats.hellos_dropped);
                true
            }
            None => false,
        }
    }

    /// Takes a connection accepted on a rendezvous socket into the list of
    /// those waiting for their hello (which must have room:
    /// [`ShmLink::make_room`]), unless its process runs under another
    /// uid.
    pub(super) fn admit(&self, hellos: &mut VecDeque<Pending>, stream: UnixStream, now: Nanos) {
        match sys::peer_cred(stream.as_raw_fd()) {
            Ok((pid, uid))
                if uid == sys::euid()
                    && stream.set_nonblocking(true).is_ok()
                    && sys::epoll_add(self.rx.rendezvous.as_raw_fd(), stream.as_raw_fd()).is_ok() =>
            {
                hellos.push_back(Pending {
                    stream,
                    pid,
                    since: now,
                    silent: false,
                });
            }
            _ => bump(&self.stats.refused),
        }
    }

    /// Reads the hellos that arrived (`ready`, per entry of `hellos`, from
    /// the slow path's poll), at most [`HELLOS_PER_TURN`], and drops the
    /// connections that stayed silent past [`HELLO_NS`]. Returns the
    /// channels accepted. Nothing here waits.
    pub(super) fn hello_turn(&self, hellos: &mut VecDeque<Pending>, ready: &[bool], now: Nanos) -> Vec<Arc<Channel>> {
        let mut accepted = Vec::new();
        let mut budget = HELLOS_PER_TURN;
        let mut keep = VecDeque::with_capacity(hellos.len());
        for (i, mut p) in std::mem::take(hellos).into_iter().enumerate() {
            let heard = ready.get(i).copied().unwrap_or(false);
            p.silent = !heard;
            if budget > 0 && heard {
                budget -= 1;
                // A channel keeps the stream: it must not wake us any more.
                sys::epoll_del(self.rx.rendezvous.as_raw_fd(), p.stream.as_raw_fd());
                match self.accept_one(p, now, accepted.len()) {
                    Ok(Some(c)) => accepted.push(c),
                    // Closed without a word: nothing was asked.
                    Ok(None) => {}
                    Err(_) => bump(&self.stats.refused),
                }
            } else if p.silent && now.saturating_sub(p.since) > HELLO_NS {
                bump(&self.stats.hello_timeouts);
            } else {
                keep.push_back(p);
            }
        }
        *hellos = keep;
        accepted
    }

    /// Whether the process `pid` owns each GID it claims (`claims`, with
    /// the descriptors it names for them) and no other path reaches it:
    /// see "Trust" in the parent module. Counts a refusal. Costs a bind
    /// per GID, one read of the kernel's socket tables and at most
    /// [`FDS_PER_GID`] `readlink`s per GID, whatever the peer does.
    fn prove_gids(&self, claims: &[(IpAddr, Vec<u32>)], pid: u32, now: Nanos) -> bool {
        let ok = self.owns_gids(claims, pid) && {
            let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
            !claims.iter().any(|(ip, _)| match routes.get(ip) {
                Some(Route::Chan(o)) => o.state() != DEAD && o.pid != pid,
                Some(Route::Udp(until, udp_peer)) => *udp_peer && now < *until,
                Some(Route::Setup(_)) | None => false,
            })
        };
        if !ok {
            bump(&self.stats.refused_gid);
        }
        ok
    }

    /// Whether process `pid` owns every GID of `claims`: each GID's
    /// endpoint is an address of this host, some UDP socket is bound to
    /// it, and every such socket is one of the descriptors of process
    /// `pid` named for it.
    pub(super) fn owns_gids(&self, claims: &[(IpAddr, Vec<u32>)], pid: u32) -> bool {
        let mut eps = Vec::with_capacity(claims.len());
        for (ip, _) in claims {
            match self.udp.endpoint_of(Gid::from_ip(*ip)) {
                Some(ep) if sys::is_local(ep.ip()) => eps.push(ep),
                _ => return false,
            }
        }
        sys::udp_inodes(&eps).iter().zip(claims).all(|(bound, (_, fds))| {
            let held: Vec<u64> = fds
                .iter()
                .take(FDS_PER_GID)
                .filter_map(|fd| sys::socket_inode(pid, *fd))
                .collect();
            !bound.is_empty() && bound.iter().all(|i| held.contains(i))
        })
    }

    /// Finishes an accepted connection whose hello arrived: checks it,
    /// maps the region, answers. `Ok(None)`: the connection closed
    /// without a word. `opened`: channels accepted in this turn so far.
    fn accept_one(&self, p: Pending, now: Nanos, opened: usize) -> io::Result<Option<Arc<Channel>>> {
        let Pending { stream, pid, .. } = p;
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let mut m = [0u8; MSG_LEN];
        let (n, mut fds) = sys::recv_fds(stream.as_raw_fd(), &mut m, 2)?;
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        if n != MSG_LEN || Hello::of(&m).magic() != HELLO || fds.len() != 2 {
            return Err(bad("malformed hello"));
        }
        let target = Hello::of(&m).target();
        if !self.gids.contains(&target) {
            return Err(bad("hello for another device"));
        }
        let claims = Self::parse_claims(&m);
        let gids: Vec<IpAddr> = claims.iter().map(|(ip, _)| *ip).collect();
        if gids.is_empty() || gids.iter().any(|ip| self.ips.contains(ip)) {
            return Err(bad("hello without usable GIDs"));
        }
        // The cheapest check first: beyond the limit, a hello costs no
        // system call more.
        let limits = self.budget.limits();
        if self.chans_r().len() + opened >= limits.max_channels {
            self.budget.refuse(format!(
                "no channel with pid {pid}: {} channels open (max_channels)",
                limits.max_channels
            ));
            return Err(io::Error::other("channel limit"));
        }
        let bell = fds.pop().ok_or_else(|| bad("no doorbell"))?;
        let doorbell = sys::check_bell(bell).inspect_err(|_| bump(&self.stats.refused_doorbell))?;
        if !self.prove_gids(&claims, pid, now) {
            return Err(bad("hello claims GIDs its process does not own"));
        }
        let charge = self.charge_region(format_args!("pid {pid}"))?;
        let file = std::fs::File::from(fds.pop().ok_or_else(|| bad("no region"))?);
        let region = Region::open(file)?;
        let mut caps = self.offer_caps();
        let offer = caps & CAP_TRAINS != 0;
        let c = Channel::new(stream, region, false, pid, offer, charge);
        if self.verify_cma(&c, &m) {
            c.cma_rx.store(true, Ordering::Relaxed);
            caps |= CAP_CMA_READ;
        }
        let answer = self.hello(ANSWER, target, caps);
        sys::send_fds(
            c.stream.as_raw_fd(),
            &answer,
            &[sys::bell_sender(&self.doorbell)?.as_raw_fd()],
        )?;
        let c = Arc::new(c);
        let trains = offer && Self::parse_caps(&m) & CAP_TRAINS != 0;
        let one_packet = trains && Self::parse_caps(&m) & CAP_TRAINS1 != 0;
        let _ = c.peer.set(Peer {
            gids,
            doorbell,
            trains,
            one_packet,
        });
        c.state.store(UP, Ordering::Release);
        // The connector may sleep: wake it to read the answer.
        if let Some(p) = c.peer.get() {
            if !sys::ring(p.doorbell.as_raw_fd()) {
                bump(&self.stats.doorbells_full);
            }
        }
        Ok(Some(c))
    }

    /// Maps the peer GIDs of an up channel to it (unless another up
    /// channel serves them).
    pub(super) fn route_peer(&self, c: &Arc<Channel>) {
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
    pub(super) fn poll_answer(&self, c: &Arc<Channel>, now: Nanos) {
        let mut m = [0u8; MSG_LEN];
        match sys::recv_fds(c.stream.as_raw_fd(), &mut m, 1) {
            Ok((MSG_LEN, mut fds)) if Hello::of(&m).magic() == ANSWER && fds.len() == 1 => {
                let claims = Self::parse_claims(&m);
                let gids: Vec<IpAddr> = claims.iter().map(|(ip, _)| *ip).collect();
                // Anyone of this uid can listen on a free rendezvous name:
                // the acceptor must own the GID we connected to, and every
                // other GID it names. (Nothing was published on the
                // channel before: an impostor got a region and a way to
                // ring us, nothing else.)
                let usable = !gids.is_empty()
                    && !gids.iter().any(|ip| self.ips.contains(ip))
                    && c.target.is_none_or(|t| gids.contains(&t));
                let doorbell = match fds.pop().map(sys::check_bell) {
                    Some(Ok(d)) => Some(d),
                    _ => {
                        bump(&self.stats.refused_doorbell);
                        None
                    }
                };
                let Some(doorbell) = doorbell.filter(|_| usable && self.prove_gids(&claims, c.pid, now)) else {
                    bump(&self.stats.refused);
                    c.kill();
                    return;
                };
                let caps = Self::parse_caps(&m);
                let trains = c.offered && caps & CAP_TRAINS != 0;
                if trains && caps & CAP_CMA_READ != 0 {
                    c.cma_tx.store(true, Ordering::Relaxed);
                }
                if self.verify_cma(c, &m) {
                    c.cma_rx.store(true, Ordering::Relaxed);
                    // The acceptor learns it from the first slot: the ring
                    // is empty, nothing was published before.
                    let mut ext = Vec::with_capacity(4);
                    ext.extend_from_slice(&CAP_CMA_READ.to_le_bytes());
                    let _ = lock(&c.tx)
                        .prod
                        .push_ext(&c.region, &NO_META, ring::KIND_CAPS, &[], &ext);
                }
                let one_packet = trains && caps & CAP_TRAINS1 != 0;
                let _ = c.peer.set(Peer {
                    gids,
                    doorbell,
                    trains,
                    one_packet,
                });
                c.state.store(UP, Ordering::Release);
                self.rx.up.fetch_add(1, Ordering::Relaxed);
                self.route_peer(c);
                // Datagrams held while pending (and the caps slot).
                let sent = c.send(None, &self.stats, &mut drop);
                c.kick(&self.stats);
                if sent.backlogged {
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
}
