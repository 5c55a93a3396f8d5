//! The shared-memory link: RDMA between soft devices of different
//! processes on one host, through lock-free rings in shared memory, with
//! the UDP link as the path to everyone else.
//!
//! [`ShmLink`] wraps a device's [`UdpLink`] and routes each datagram by
//! destination: to a shared-memory channel when the destination device is
//! on this host and offers one, else to UDP. The datagrams are exactly the
//! RoCEv2 UDP payloads the UDP link carries, with their addresses and
//! ports; the engine (docs/design.md §3) is unchanged and cannot tell the paths
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
//! tries to connect to that name, without waiting (a listener whose
//! backlog is full counts as none), if the GID's UDP endpoint is an
//! address of this host. In [`ShmMode::Auto`] the link's setup thread
//! does that and what follows, while that datagram and the next go by
//! UDP: creating the region takes milliseconds, which the first datagram
//! to a new peer (a connection manager's REQ or REP) would otherwise wait
//! for; the thread runs while destinations wait and then exits. A
//! refusal means "no shared memory there": the destination is
//! remembered as UDP for [`RETRY_NS`]. On success it checks
//! that the listener runs under its own uid, creates the channel region
//! (a sealed memfd, [`ring`]) and passes it with its doorbell (SCM_RIGHTS)
//! in a hello that names the target GID and its own GIDs. The acceptor
//! never waits for a hello: its slow path accepts at most
//! [`ACCEPTS_PER_TURN`] connections, keeps them (at most
//! [`ShmLimits::max_pending_hellos`]; a new one takes the place of the
//! oldest that stayed silent, `shm_hellos_dropped`) in an epoll that is in
//! the link's [`Link::poll_fds`], so that a hello arriving later wakes a
//! sleeping reader, reads at most [`HELLOS_PER_TURN`] hellos per turn, and
//! drops a connection silent for [`HELLO_NS`] (`shm_hello_timeouts`). It
//! checks the uid, the target GID, the peer's GIDs, the doorbell, its
//! limits, then the seals and the format (nothing is mapped for a peer
//! that fails the earlier checks), maps the region, answers with its own
//! GIDs and doorbell, and rings the connector's doorbell so that it sees
//! the answer, whose GIDs the connector checks in turn. Until the answer
//! arrives the connector keeps sending by UDP ([`ShmMode::Auto`]) or holds
//! the datagrams ([`ShmMode::Only`]). If two devices connect to each other
//! at once, two channels exist; each side sends on one and reads both.
//!
//! # Trust
//!
//! *Who may talk to whom.* Only devices of processes with the same
//! effective uid get a channel (`SO_PEERCRED`, filled in by the kernel, at
//! both ends): a channel lets the peer write a ring this process reads
//! and, with trains, hand it buffers to read, and abstract socket names
//! have no file permissions to stand in for this check. Within the uid a
//! peer is trusted with nothing more: what it writes in the ring is
//! validated ([`ring`], `shm/trains.rs`), it cannot make this process block
//! (doorbells, connects and hellos never wait on it), it cannot make it
//! hold more than the device's [`ShmLimits`], and it carries only the
//! traffic of GIDs it owns.
//!
//! *What a GID is, and who owns it.* A GID names a UDP endpoint (address
//! and port, `udp.rs`); whoever receives that endpoint's datagrams owns
//! the GID, for UDP as for us: it gets the traffic sent to the GID, and it
//! can send from the GID's address. So a channel carries the traffic of a
//! GID only if the peer process (the pid from `SO_PEERCRED`, which the
//! peer cannot choose) holds every UDP socket bound to the GID's endpoint,
//! and the endpoint's address is one of this host's (network namespace).
//! The peer names, per GID, its descriptors of those sockets (a hello or
//! answer has room for four); the kernel's socket table
//! (`/proc/net/udp`, `/proc/net/udp6`) gives the sockets bound to the
//! endpoint, and `/proc/<pid>/fd/<n>` which socket each named descriptor
//! is: a `readlink` per descriptor, whatever the peer does (a scan of the
//! peer's descriptors would let a peer with thousands of them stall us,
//! at ~11 µs per entry). A channel thus gives a peer nothing UDP would
//! not. The acceptor checks every GID of the hello. The connector checks
//! every GID of the answer, which must include the GID it connected to:
//! anyone of the uid can listen on a free rendezvous name, for example
//! that of a UDP-only device or of a remote host's GID; such a listener
//! gets a hello (a region and a doorbell's name; nothing is published on
//! a channel before it is up) and no channel. A GID this device reaches
//! over another path now, a channel to another process or UDP (after a
//! connect that found no device to make a channel with, for
//! [`RETRY_NS`]; not after a channel ended, so that a peer that restarts
//! gets its channel back at once), is not taken over either. A hello or
//! answer with one unproven GID gets no channel (`shm_refused_gid`, and
//! `shm_channels_refused`). The proof is of the moment of the
//! rendezvous: a peer that closes its socket later keeps its channel
//! (and anyone who binds the endpoint then gets its UDP traffic, channel
//! or not). Every datagram read from a channel must then come from one of
//! the peer's GIDs and go to one of ours (`shm_rx_bad_addr`).
//!
//! *What this does not cover.* A process of the same uid that may ptrace
//! this one (Yama `ptrace_scope` 0) can read and write its memory anyway;
//! none of the above stops it, nor needs to. A peer whose descriptors
//! `/proc` does not show (not dumpable, another pid namespace) cannot
//! prove its GIDs, and its traffic goes by UDP. With
//! `net.ipv4.ip_nonlocal_bind` set, every address counts as this host's,
//! and only the socket check remains.
//!
//! # Limits
//!
//! [`ShmLimits`] bounds, per device, the channels, the bytes mapped
//! (regions and peers' buffers) and the peers' buffers mapped; a peer
//! beyond them is refused, counted (`shm_refused_limit`) and named on
//! standard error in one line at most once a second. `shm_mapped_bytes`
//! and `shm_mapped_exports` show what is held.
//!
//! # Doorbell
//!
//! A reader that spins (busy-polling application, spinning progress
//! thread) is never signalled: the writer publishes the slot and checks
//! the reader's sleep flag, which is clear. Before a reader sleeps
//! ([`Wakeups::prepare_sleep`]) it sets the flag in every ring it reads,
//! issues a full fence and looks at the rings once more; the writer
//! publishes, fences and reads the flag, so one of the two sees the
//! other (no lost wake-up), and the writer then rings the reader's
//! doorbell, which is in the reader's [`Link::poll_fds`].
//!
//! A doorbell is a unix datagram socket bound to an automatic abstract
//! name, which only its owner holds. It passes each peer a socket of its
//! own connected to it, and the peer rings by sending one byte on that
//! socket with `MSG_DONTWAIT`: it checks that the descriptor is such a
//! socket, and never writes anything else. Writing a peer's descriptor
//! in the ordinary way could block: its flags (`O_NONBLOCK`) live in a
//! file description the peer shares and can change at any time, and an
//! eventfd (what earlier versions used) or a pipe blocks a writer once
//! its owner has filled it; Linux offers no per-call non-blocking write
//! for those (`pwritev2` with `RWF_NOWAIT` fails with `EOPNOTSUPP` on an
//! eventfd) nor a way to reopen one with a description of our own. The
//! doorbell itself is never passed: a peer holding it could read the
//! rings meant for its owner, or connect it to a socket of its own, after
//! which it would refuse everyone else's. A full doorbell
//! (`shm_doorbells_full`) means its owner has wake-ups waiting, or is
//! dead. Its name can be found and sent to by any local process, like any
//! abstract name: what that buys is a wake-up, whose rings the owner
//! drains a bounded number at a time.
//!
//! # Peer death and misbehaviour
//!
//! Each channel keeps its unix socket open; every receive turn that runs
//! the slow path (about every [`SLOW_NS`], and after every sleep) polls
//! it for a hang-up (`POLLRDHUP`, which shows even while buffer messages
//! wait in it), and a hang-up or an error (the peer process died or
//! closed the device) ends the channel once what the peer published
//! before is read: its destinations go back to UDP, where a vanished
//! host's QPs end with `RETRY_EXC_ERR` after their retries. A peer that
//! publishes an impossible slot sequence word or ring index ends the
//! channel the same way; one that writes an impossible length, slot kind
//! or flag loses that slot; both
//! are counted (`shm_rx_bad_index`, `shm_rx_bad_len`). A datagram whose
//! addresses do not belong to the channel's two ends is dropped
//! (`shm_rx_bad_addr`). See [`ring`] for why no value the peer writes can
//! make this process touch memory outside the mapping.
//!
//! # Trains
//!
//! A train ([`crate::soft::proto::train`]) is a message of 2 KiB or more
//! sent as its ONLY packet, with the payload left in the sender's
//! [`SharedMemory`](crate::verbs::SharedMemory) buffers (sealed memfds:
//! a file per large buffer, shared slabs for small ones); the receiver maps
//! those files and its engine copies the message once. Both ends announce
//! trains in the capability word of the hello and the answer; a channel
//! carries them only if both did ([`ShmLink::set_trains`] turns the offer
//! off), and [`Trains::train_caps`] allows them only for a destination routed to
//! such a channel while it is up; trains of one packet only if the peer
//! said it takes them (`CAP_TRAINS1`).
//!
//! Other registered memory (caller-owned ranges, buffers past the
//! shareable limit [`SHARE_MAX_LIVE`](crate::verbs::memory::SHARE_MAX_LIVE) or
//! where memfds fail) goes in trains too where the receiver
//! verified at the rendezvous that it may read this process's memory
//! (`shm/hello.rs`, "Probe"): such a piece is a range of the sender's
//! address space that the receiver's engine copies with
//! `process_vm_readv` (cross-memory attach) straight into the
//! destination; [`Trains::train_caps`] says which kinds a destination takes.
//! Elsewhere such messages go packet by packet.
//!
//! How buffers are passed and mapped, what the receiver checks, and what
//! happens to a train that cannot go are described in `shm/trains.rs`.
//!
//! # Files
//!
//! This file holds [`ShmLink`] itself: making it, its settings, the slow
//! path of a receive turn (accepting channels, peer liveness, retiring
//! dead channels, backlogs) and the [`Link`] traits. The link's state is
//! split by who writes it: what only the send side writes is a
//! `SendState` (`shm/send.rs`, the link's `tx`), what only the receive
//! side writes (its turns, its sleep flags, the rendezvous its slow path
//! runs) a `ReceiveState` (`shm/receive.rs`, `rx`), and what both write
//! (the route table, the channel list, the backlog flag) or only read
//! (settings, addresses, counters) stays in [`ShmLink`], each field
//! saying why. Beside it, by concern:
//!
//! - `shm/channel.rs`: a channel (its region and rings, each end's side,
//!   its state, the peer) and the push of datagrams into its ring;
//! - `shm/setup.rs`: the route table, the channel a destination's
//!   datagrams go on (`channel_for`), and the setup thread;
//! - `shm/hello.rs`: the rendezvous (hello, answer, the checks of both);
//! - `shm/limits.rs`: [`ShmLimits`] and the budget channels charge;
//! - `shm/send.rs`, `shm/receive.rs`: the data path each way, and the
//!   state each side owns (`SendState`, `ReceiveState`);
//! - `shm/trains.rs`: trains (exports, mappings, delivery);
//! - `shm/stats.rs`: the counters, [`ShmLink::peer_lines`] and the
//!   [`Diagnostics`] the link offers;
//! - `shm/ring.rs`, `shm/wire.rs`, `shm/sys.rs`: the rings in the region,
//!   the rendezvous stream's byte formats, the system calls.

mod channel;
mod hello;
mod limits;
mod receive;
#[doc(hidden)] // the ring's internals; public for benches' ring_pingpong
pub mod ring;
mod send;
mod setup;
mod stats;
mod sys;
#[cfg(test)]
mod tests;
mod trains;
mod wire;

use crate::sys::lock;
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::udp::UdpLink;
use super::{Diagnostics, Endpoint, FastSend, Link, Trains, Wakeups};
use crate::soft::proto::train::TrainCaps;
use crate::soft::proto::{Datagram, LinkHint, Nanos, Outgoing, Transmit};
use crate::verbs::Gid;
use channel::{Channel, CLOSING, DEAD, PENDING, UP};
use limits::Budget;
pub use limits::{ShmLimits, LIMITS_ENV};
use receive::ReceiveState;
use send::SendState;
use setup::Route;
use stats::{bump, Stats};
use wire::EXPORT_LEN;

/// Environment variable: `0` when a link is made turns trains off for it
/// ([`ShmLink::set_trains`]); for measurements.
pub const TRAINS_ENV: &str = "SOFTVERBS_SHM_TRAINS";

/// Environment variable: if set (and not `0`) when a link is made, its
/// trains carry process memory wherever the channel allows it
/// ([`ShmLink::set_force_cma`]); for measurements.
pub const FORCE_CMA_ENV: &str = "SOFTVERBS_SHM_FORCE_CMA";

/// How a device uses shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmMode {
    /// Shared memory to peers on this host that offer it, UDP otherwise.
    Auto,
    /// Shared memory only: datagrams to peers without a channel are
    /// dropped (held while a channel is being set up). The UDP socket only
    /// hears `Auto` peers whose channel is not up yet; once a channel is
    /// up it is read about every [`SLOW_NS`], not on every poll.
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
/// How long an accepted rendezvous connection may take to send its hello
/// (a connector sends it right after connecting) before it is dropped
/// (`shm_hello_timeouts`).
pub const HELLO_NS: Nanos = 1_000_000_000;
/// Connections a slow path accepts at most (the rest wait in the
/// listener's backlog for the next one).
pub const ACCEPTS_PER_TURN: usize = 8;
/// Hellos a slow path reads and checks at most.
pub const HELLOS_PER_TURN: usize = 4;
/// Rings a receive turn takes from the doorbell at most.
const DRAIN_MAX: usize = 64;
/// Buffers a channel keeps exported (sender) and mapped (receiver) at
/// most; the sender makes room by telling the receiver to forget the least
/// recently used ones.
pub const EXPORT_MAX: usize = 256;
/// Buffers a receiver maps at most per channel: twice what a sender keeps
/// exported, as a safety margin.
const RX_MAPS_MAX: usize = 2 * EXPORT_MAX;
/// Largest buffer a receiver maps (1 TiB of address space).
const MAP_MAX: u64 = 1 << 40;
/// How often unused exports (freed buffers) are forgotten without a new
/// export.
pub(crate) const PRUNE_NS: Nanos = 100_000_000;
const _: () = assert!(EXPORT_MAX >= 4 * ring::TRAIN_MAX_PIECES && EXPORT_MAX <= ring::FORGET_MAX);

/// The abstract socket name of the device owning `gid`.
pub(crate) fn rendezvous_name(gid: Gid) -> String {
    let hex: String = gid.0.iter().map(|b| format!("{b:02x}")).collect();
    format!("softverbs-shm/{hex}")
}

/// A UDP link with shared-memory channels to devices on this host. See
/// the module docs.
#[derive(Debug)]
pub struct ShmLink {
    // Fixed when the link is made, read by both sides.
    udp: Arc<UdpLink>,
    mode: ShmMode,
    gids: Vec<Gid>,
    ips: Vec<IpAddr>,
    /// Read by the receive path (drained after a sleep, in the poll set)
    /// and passed to peers by whichever side makes a channel (a sender
    /// to it in every hello and answer).
    doorbell: OwnedFd,
    /// Written by both sides: the send side routes a destination to the
    /// channel it opens (`shm/setup.rs`), the receive side's slow path to
    /// a channel it accepts and back to UDP when a channel ends. Written
    /// only through [`ShmLink::routes_w`], which bumps `route_version`.
    routes: RwLock<HashMap<IpAddr, Route, super::iphash::IpHash>>,
    /// The version of `routes` (bumped by every change): what a QP's
    /// route hint is checked against (`send.rs`). Beside `routes`, which
    /// both sides write.
    route_version: AtomicU64,
    /// Written by both sides: a connector (sending thread or setup
    /// thread) adds the channel it opens, the slow path those it accepts
    /// and retires the dead.
    chans: RwLock<Vec<Arc<Channel>>>,
    /// A channel's backlog holds datagrams: set by the send side, cleared
    /// by the retries of the receive side ([`ShmLink::flush_backlogs`]).
    backlogged: AtomicBool,
    /// Settings and the device's state, read by both sides, written by
    /// the application ([`Link::detach`], [`ShmLink::set_trains`],
    /// [`ShmLink::set_force_cma`]).
    detached: AtomicBool,
    /// Offer trains to new channels, and send them (see [`ShmLink::set_trains`]).
    offer_trains: AtomicBool,
    /// Trains carry process memory even from shareable buffers where the
    /// channel allows it (see [`ShmLink::set_force_cma`]).
    force_cma: AtomicBool,
    /// Charged by whichever side makes a channel (a connector, or the
    /// slow path accepting one) and by the receive side's mappings.
    budget: Arc<Budget>,
    /// Counters bumped by both sides.
    stats: Stats,
    /// What only the send side writes (`shm/send.rs`).
    tx: SendState,
    /// What only the receive side writes (`shm/receive.rs`).
    rx: ReceiveState,
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
        let rendezvous = sys::epoll()?;
        for l in &listeners {
            sys::epoll_add(rendezvous.as_raw_fd(), l.as_raw_fd())?;
        }
        let mut limits = ShmLimits::default();
        if let Some(spec) = std::env::var_os(LIMITS_ENV) {
            match limits.parse(&spec.to_string_lossy()) {
                Ok(l) => limits = l,
                Err(e) => eprintln!("softverbs: {LIMITS_ENV}: {e}; using the defaults"),
            }
        }
        let budget = Arc::new(Budget {
            limits: Mutex::new(limits),
            mapped_bytes: AtomicU64::new(0),
            mapped_exports: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            logged: AtomicU64::new(0),
            label: gids.first().map_or_else(String::new, |g| g.to_string()),
        });
        let doorbell = sys::bell()?;
        Ok(Arc::new_cyclic(|me| ShmLink {
            ips: gids.iter().map(|g| g.to_ip()).collect(),
            gids,
            udp,
            mode,
            doorbell,
            routes: RwLock::new(HashMap::default()),
            route_version: AtomicU64::new(0),
            chans: RwLock::new(Vec::new()),
            backlogged: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            offer_trains: AtomicBool::new(std::env::var_os(TRAINS_ENV).is_none_or(|v| v != "0")),
            force_cma: AtomicBool::new(std::env::var_os(FORCE_CMA_ENV).is_some_and(|v| !v.is_empty() && v != "0")),
            budget,
            stats: Stats::default(),
            tx: SendState::new(me.clone()),
            rx: ReceiveState::new(listeners, rendezvous),
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

    /// Whether channels opened or accepted from now on offer trains, and
    /// whether trains are sent on those that agreed (default: yes, unless
    /// [`TRAINS_ENV`] was `0` when the link was made).
    pub fn set_trains(&self, on: bool) {
        self.offer_trains.store(on, Ordering::Relaxed);
    }

    /// Whether trains carry ranges of this process's memory read by
    /// cross-memory attach even where the pieces lie in shareable buffers
    /// (default: no, or [`FORCE_CMA_ENV`] set to something other than `0`
    /// when the link was made). For measurements and tests: the
    /// shareable-buffer path is preferred otherwise. Only on channels
    /// where the peer verified it can read this process.
    pub fn set_force_cma(&self, on: bool) {
        self.force_cma.store(on, Ordering::Relaxed);
    }

    /// Sets the limits on what peers can make this device hold (see
    /// [`ShmLimits`]); they apply to what is set up or mapped from now on.
    pub fn set_limits(&self, limits: ShmLimits) {
        *lock(&self.budget.limits) = limits;
    }

    /// The limits in force.
    pub fn limits(&self) -> ShmLimits {
        self.budget.limits()
    }

    /// Whether a shared-memory channel to `gid` is up.
    pub fn is_shm_peer(&self, gid: Gid) -> bool {
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        matches!(routes.get(&gid.to_ip()), Some(Route::Chan(c)) if c.state() == UP)
    }

    fn chans_r(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Channel>>> {
        self.chans.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Accepts channels, completes pending ones, checks that peers are
    /// alive, retires dead channels, retries backlogs.
    fn slow_path(&self, now: Nanos) {
        self.rx.last_slow.store(now, Ordering::Relaxed);
        let chans: Vec<Arc<Channel>> = self.chans_r().clone();
        let streams: Vec<RawFd> = chans.iter().map(|c| c.stream.as_raw_fd()).collect();
        let accepted;
        let ready;
        {
            // One `poll` tells which listeners have a connection waiting
            // and which peers hung up: a busy receiver runs this path
            // thousands of times a second, and an `accept` that finds
            // nothing cost as much as the `poll`. Nothing here waits, and
            // the work is bounded ([`ACCEPTS_PER_TURN`],
            // [`HELLOS_PER_TURN`]): the receive turn that runs it is the
            // data path.
            let listeners = lock(&self.rx.listeners);
            let mut hellos = lock(&self.rx.hellos);
            let fds: Vec<RawFd> = listeners.iter().map(|l| l.as_raw_fd()).collect();
            ready = sys::readiness(&fds, &streams, &[]);
            let mut accepts = ACCEPTS_PER_TURN;
            let mut more = false;
            'accept: for (l, _) in listeners.iter().zip(&ready.pending).filter(|(_, p)| **p) {
                loop {
                    if accepts == 0 || !self.make_room(&mut hellos) {
                        more = true;
                        break 'accept;
                    }
                    let Ok((s, _)) = l.accept() else { break };
                    accepts -= 1;
                    self.admit(&mut hellos, s, now);
                }
            }
            // A connector sends its hello right after connecting: it is
            // usually there as soon as the connection is accepted (a
            // second `poll`, only while connections wait for a hello).
            accepted = if hellos.is_empty() {
                Vec::new()
            } else {
                let waiting: Vec<RawFd> = hellos.iter().map(|p| p.stream.as_raw_fd()).collect();
                let heard = sys::readiness(&[], &[], &waiting).hellos;
                more |= heard.iter().filter(|h| **h).count() > HELLOS_PER_TURN;
                self.hello_turn(&mut hellos, &heard, now)
            };
            if self.rx.rendezvous_more.load(Ordering::Relaxed) != more {
                self.rx.rendezvous_more.store(more, Ordering::Relaxed);
            }
        }
        for c in accepted {
            bump(&self.stats.accepted);
            self.rx.up.fetch_add(1, Ordering::Relaxed);
            self.chans.write().unwrap_or_else(|p| p.into_inner()).push(c.clone());
            self.route_peer(&c);
        }
        let prune = now.saturating_sub(self.rx.last_prune.load(Ordering::Relaxed)) >= PRUNE_NS;
        if prune {
            self.rx.last_prune.store(now, Ordering::Relaxed);
        }
        let mut dead = false;
        for (c, closed) in chans.iter().zip(&ready.closed) {
            match c.state() {
                PENDING if c.connector => self.poll_answer(c, now),
                UP if lock(&c.rx).cons.is_broken() => c.kill(),
                UP if *closed => {
                    // Everything the peer published before it closed is
                    // visible now: the next receive turn reads it, then
                    // ends the channel.
                    bump(&self.stats.peers_lost);
                    c.state.store(CLOSING, Ordering::Release);
                }
                UP if prune && c.trains() => c.prune_exports(&self.stats),
                _ => {}
            }
            if c.state() == DEAD {
                dead = true;
            }
        }
        if dead {
            let mut list = self.chans.write().unwrap_or_else(|p| p.into_inner());
            let mut retired = Vec::new();
            list.retain(|c| {
                if c.state() == DEAD {
                    if c.peer.get().is_some() {
                        self.rx.up.fetch_sub(1, Ordering::Relaxed);
                    }
                    retired.push(c.clone());
                    false
                } else {
                    true
                }
            });
            drop(list);
            // The peer's buffers are unmapped now, not when the last
            // reference to the channel goes.
            for c in retired {
                lock(&c.rx).maps.clear();
                lock(&c.tx).exports.map.clear();
            }
            let mut routes = self.routes_w();
            for r in routes.values_mut() {
                if matches!(r, Route::Chan(c) if c.state() == DEAD) {
                    *r = Route::Udp(now.saturating_add(RETRY_NS), false);
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
            if c.state() == DEAD {
                continue;
            }
            // (A channel not up yet only reports its backlog.)
            let sent = c.send(None, &self.stats, &mut drop);
            if sent.published {
                c.kick(&self.stats);
            }
            left |= sent.backlogged;
        }
        if left {
            self.backlogged.store(true, Ordering::SeqCst);
        }
        !left
    }
}

impl Link for ShmLink {
    fn send_batch(&self, txs: &mut Vec<Transmit>, spent: &mut dyn FnMut(Vec<u8>)) {
        self.send_list(txs, spent);
    }

    fn send_one(&self, t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) {
        self.send_single(t, spent);
    }

    fn recv(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        self.receive(budget, f)
    }

    fn flush(&self) -> bool {
        let shm = self.flush_backlogs();
        self.udp.flush() && shm
    }

    fn poll_fds(&self) -> Vec<RawFd> {
        let mut fds = self.udp.poll_fds();
        fds.push(self.rx.rendezvous.as_raw_fd());
        fds.push(self.doorbell.as_raw_fd());
        fds
    }

    fn needs_icrc(&self) -> bool {
        // UDP computes and checks it itself; shared memory needs none.
        false
    }

    fn attach(&self, dev: &Arc<dyn Endpoint>) {
        self.udp.attach(dev);
    }

    fn detach(&self, dev: &dyn Endpoint) {
        self.detached.store(true, Ordering::Relaxed);
        // Channels stay up until the link is dropped (their sockets close
        // then and the peers see it), so that what the device sends while
        // it goes still arrives.
        lock(&self.rx.listeners).clear();
        lock(&self.rx.hellos).clear();
        self.udp.detach(dev);
    }

    fn name(&self) -> &'static str {
        match self.mode {
            ShmMode::Auto => "shm+udp",
            ShmMode::Only => "shm",
        }
    }

    fn fast_send(&self) -> Option<&dyn FastSend> {
        Some(self)
    }

    fn wakeups(&self) -> Option<&dyn Wakeups> {
        Some(self)
    }

    fn trains(&self) -> Option<&dyn Trains> {
        Some(self)
    }

    fn diagnostics(&self) -> Option<&dyn Diagnostics> {
        Some(self)
    }
}

impl FastSend for ShmLink {
    fn send_now(&self, t: &Outgoing<'_>, hint: &mut LinkHint) -> bool {
        self.send_at_once(t, hint)
    }
}

impl Wakeups for ShmLink {
    fn woken(&self) {
        // As after a sleep: the next receive drains the doorbell, runs the
        // slow path (listeners, peers) and reads UDP (every socket).
        self.rx.armed.store(true, Ordering::Release);
        self.udp.woken();
    }

    fn set_watched(&self, watched: bool) {
        if watched && self.rx.self_bell.get().is_none() {
            match sys::bell_sender(&self.doorbell) {
                Ok(b) => {
                    let _ = self.rx.self_bell.set(b);
                }
                // Without it a ring with data left over waits for the
                // next datagram or timer to wake the application.
                Err(e) => eprintln!("softverbs: shm link: no sender to our own doorbell: {e}"),
            }
        }
        // The next receive sets every ring's sleep flag.
        self.rx.armed.store(true, Ordering::Release);
        self.rx.watched.store(watched, Ordering::Release);
        self.udp.set_watched(watched);
    }

    fn prepare_sleep(&self) -> bool {
        // The wake-up that ends the sleep is a `woken`.
        self.woken();
        let mut ok = !self.rx.rendezvous_more.load(Ordering::Relaxed);
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
}

impl Trains for ShmLink {
    fn train_caps(&self, dst: IpAddr) -> TrainCaps {
        if !self.offer_trains.load(Ordering::Relaxed) || self.detached.load(Ordering::Relaxed) {
            return TrainCaps::NONE;
        }
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        match routes.get(&dst) {
            Some(Route::Chan(c)) if c.state() == UP && c.trains() => {
                let process = c.cma_tx.load(Ordering::Relaxed);
                TrainCaps {
                    shared: !(process && self.force_cma.load(Ordering::Relaxed)),
                    process,
                    one_packet: c.peer.get().is_some_and(|p| p.one_packet),
                }
            }
            _ => TrainCaps::NONE,
        }
    }
}
