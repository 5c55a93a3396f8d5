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
//! the slow path (about every [`SLOW_NS`], and after every sleep) polls
//! it for a hang-up (`POLLRDHUP`, which shows even while buffer messages
//! wait in it), and a hang-up or an error (the peer process died or
//! closed the device) ends the channel once what the peer published
//! before is read: its destinations go back to UDP, where a vanished
//! host's QPs end with `RETRY_EXC_ERR` after their retries. A peer that
//! publishes an impossible ring index ends the channel the same way; one
//! that writes an impossible length or slot kind loses that slot; both
//! are counted (`shm_rx_bad_index`, `shm_rx_bad_len`). A datagram whose
//! addresses do not belong to the channel's two ends is dropped
//! (`shm_rx_bad_addr`). See [`ring`] for why no value the peer writes can
//! make this process touch memory outside the mapping.
//!
//! # Trains
//!
//! A train ([`crate::soft::proto::train`]) is a multi-packet message sent
//! as its ONLY packet, with the payload left in the sender's
//! [`SharedMemory`] buffers (sealed memfds); the receiver maps those
//! buffers and its engine copies the message once. Both ends announce
//! trains in the capability word of the hello and the answer; a channel
//! carries them only if both did ([`ShmLink::set_trains`] turns the offer
//! off), and [`Link::trains_to`] says yes only for a destination routed to
//! such a channel while it is up.
//!
//! *Export.* The first time a train uses a buffer on a channel, the sender
//! passes the buffer's memfd over the channel's unix socket (SCM_RIGHTS)
//! in a 32-byte message: `SVSHMFD1`, the buffer's token (unique in the
//! sending process, never reused) and its length, then publishes the slot.
//! The message is thus queued in the receiver's socket before the
//! receiver can see the slot, and reading it never blocks. A full socket
//! leaves the train in the channel's backlog, in order. The slot ([`ring`],
//! kind train) holds the ONLY packet and a descriptor: `npkts`, and per
//! piece (at most [`TRAIN_MAX_PIECES`](ring::TRAIN_MAX_PIECES)) token,
//! offset and length.
//!
//! *Mapping table.* A channel keeps at most [`EXPORT_MAX`] buffers exported
//! and mapped. The sender decides: before exporting past the limit, and
//! about every [`PRUNE_NS`] for buffers freed meanwhile, it publishes a
//! forget slot naming tokens the receiver unmaps (freed buffers first,
//! then the least recently used); a buffer forgotten and used again is
//! exported again. Since forget slots travel in the ring, in order with
//! the trains, the receiver never unmaps a buffer a later slot still
//! needs, and it reads buffer messages only up to the one it needs, so
//! its table never outgrows the sender's. A freed buffer's memory stays
//! mapped by the peer until the sender's next prune or export (about
//! [`PRUNE_NS`] while the sender's device runs receive turns) and the
//! peer reads the forget slot; everything is unmapped when the channel
//! ends. With more than [`EXPORT_MAX`] buffers in use in turn, trains
//! keep working but re-export buffers (a system call and an mmap each);
//! a process has at most [`SHARE_MAX_LIVE`](crate::verbs::memory::SHARE_MAX_LIVE)
//! shareable buffers alive, so this takes freed and reallocated ones.
//!
//! *Trust.* The receiver parses the descriptor from its private copy of
//! the slot: the piece count is capped, the lengths must add up to a
//! message (2^31 bytes at most), every token must name a buffer the peer
//! passed (looked up in the socket if it is new), and every piece must
//! lie in its mapping. A passed descriptor is accepted only if it is a
//! memfd sealed against shrinking and growing (`F_GET_SEALS`) of the
//! announced size (`fstat`), so that the read-only mapping can never
//! fault; extra descriptors are closed. A buffer message that is
//! malformed, carries no usable memfd, cannot be mapped, or exceeds twice
//! [`EXPORT_MAX`] mapped buffers ends the channel (`shm_rx_bad_export`):
//! trains from that buffer could never be read, and the sender would not
//! know. Any other fault (descriptor, unknown token, piece out of its
//! buffer) drops the train (`shm_rx_bad_train`). The peer
//! can still change the bytes while they are copied, as any RDMA sender
//! writing its buffer during a transfer can: that garbles the message,
//! never its bounds.
//!
//! A train whose destination has no train-capable channel any more (the
//! channel died, the route changed, UDP) is dropped
//! (`shm_tx_train_dropped`; never sent by UDP): the requester's
//! retransmission sends the message again. Trains and datagrams to one
//! destination share one ring and one backlog, so they stay in the order
//! the engine produced them. `shm_tx_trains` and `shm_rx_trains` count
//! the trains that went through; `shm_tx_exports`, `shm_rx_maps` and
//! `shm_tx_forgets` the buffers passed, mapped and forgotten.

pub mod ring;
mod sys;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};

use memmap2::{MmapOptions, MmapRaw};

use super::udp::UdpLink;
use super::Link;
use crate::soft::engine::{process_now, DeviceShared};
use crate::soft::proto::train::{TrainIn, TrainOut};
use crate::soft::proto::{Counters, Datagram, Nanos, Transmit};
use crate::verbs::{Gid, MappedPiece, SharedMemory};
use ring::{Consumer, DescPiece, Producer, PushError, Region, Slot, SlotMeta, TrainDesc};

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
/// 2: the capability word; ring version 2 (slot kinds).
const HELLO: &[u8; 8] = b"SVSHMHI2";
const ANSWER: &[u8; 8] = b"SVSHMOK2";
/// Offset of the capability word (u32, little-endian) in a hello or an
/// answer, after the GIDs.
const OFF_CAPS: usize = 284;
/// Capability: this end sends and receives trains.
const CAP_TRAINS: u32 = 1;
const _: () = assert!(25 + 16 * MAX_GIDS <= OFF_CAPS && OFF_CAPS + 4 <= MSG_LEN);
/// An exported buffer: this magic, its token (u64 LE), its length (u64
/// LE), 8 zero bytes; the memfd rides along (SCM_RIGHTS).
const EXPORT: &[u8; 8] = b"SVSHMFD1";
const EXPORT_LEN: usize = 32;
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
pub const PRUNE_NS: Nanos = 100_000_000;
const _: () = assert!(EXPORT_MAX >= 4 * ring::TRAIN_MAX_PIECES && EXPORT_MAX <= ring::FORGET_MAX);

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
    tx_trains: AtomicU64,
    rx_trains: AtomicU64,
    tx_train_dropped: AtomicU64,
    rx_bad_train: AtomicU64,
    tx_exports: AtomicU64,
    tx_forgets: AtomicU64,
    rx_maps: AtomicU64,
    rx_bad_export: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug)]
struct TxSide {
    prod: Producer,
    backlog: VecDeque<Transmit>,
    exports: Exports,
}

/// The buffers a channel's sender has passed to the peer, by token.
#[derive(Debug)]
struct Exports {
    map: HashMap<u64, Export>,
    /// Trains sent (the clock of `Export::last`).
    seq: u64,
    /// Most exports kept ([`EXPORT_MAX`]; less in tests).
    cap: usize,
}

impl Default for Exports {
    fn default() -> Exports {
        Exports {
            map: HashMap::new(),
            seq: 0,
            cap: EXPORT_MAX,
        }
    }
}

#[derive(Debug)]
struct Export {
    /// Gone when the buffer is freed: then the peer may unmap it.
    mem: Weak<SharedMemory>,
    /// `seq` of the last train that used it.
    last: u64,
}

impl Exports {
    /// Removes what the peer may forget so that `new` more exports fit:
    /// freed buffers, then the least recently used ones. Returns their
    /// tokens.
    fn make_room(&mut self, new: usize) -> Vec<u64> {
        let mut out: Vec<u64> = self.freed();
        while !self.map.is_empty() && self.map.len() + new > self.cap {
            let Some(t) = self.map.iter().min_by_key(|(_, e)| e.last).map(|(t, _)| *t) else {
                break;
            };
            self.map.remove(&t);
            out.push(t);
        }
        out
    }

    /// Removes the exports whose buffers were freed; returns their tokens.
    fn freed(&mut self) -> Vec<u64> {
        let out: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, e)| e.mem.strong_count() == 0)
            .map(|(t, _)| *t)
            .collect();
        for t in &out {
            self.map.remove(t);
        }
        out
    }
}

#[derive(Debug)]
struct RxSide {
    cons: Consumer,
    buf: Vec<u8>,
    /// The peer's buffers mapped here, by the peer's token.
    maps: HashMap<u64, MmapRaw>,
}

#[derive(Debug)]
struct Peer {
    gids: Vec<IpAddr>,
    doorbell: OwnedFd,
    /// Both ends offered trains.
    trains: bool,
}

/// Metadata of forget slots (the consumer does not look at it).
const NO_META: SlotMeta = SlotMeta {
    src: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    dst: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    src_port: 0,
    dst_port: 0,
};

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
    /// This end offered trains in its hello or answer.
    offered: bool,
}

impl Channel {
    fn new(stream: UnixStream, region: Region, connector: bool, pid: u32, offered: bool) -> Channel {
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
                exports: Exports::default(),
            }),
            rx: Mutex::new(RxSide {
                cons: Consumer::new(rx_ring),
                buf: Vec::with_capacity(ring::MAX_PAYLOAD),
                maps: HashMap::new(),
            }),
            peer: OnceLock::new(),
            offered,
        }
    }

    /// Whether trains go both ways on this channel (once up).
    fn trains(&self) -> bool {
        self.peer.get().is_some_and(|p| p.trains)
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
            match self.push(&mut tx.prod, &mut tx.exports, &b, stats) {
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
            } else if self.push(&mut tx.prod, &mut tx.exports, &t, stats).is_ok() {
                published = true;
            } else if self.state() == UP {
                Self::hold(tx, t, stats);
            }
        }
        published
    }

    fn hold(tx: &mut TxSide, t: Transmit, stats: &Stats) {
        if tx.backlog.len() >= BACKLOG_MAX {
            bump(if t.train.is_some() {
                &stats.tx_train_dropped
            } else {
                &stats.tx_drops
            });
        } else {
            bump(&stats.tx_backlogged);
            tx.backlog.push_back(t);
        }
    }

    /// `Err`: keep the datagram (full ring); a datagram that can never go
    /// is dropped and counted with `Ok`.
    fn push(&self, prod: &mut Producer, exports: &mut Exports, t: &Transmit, stats: &Stats) -> Result<(), ()> {
        let meta = SlotMeta {
            src: t.src,
            dst: t.dst,
            src_port: t.src_port,
            dst_port: t.dst_port,
        };
        if let Some(train) = &t.train {
            return self.push_train(prod, exports, &meta, &t.data, train, stats);
        }
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

    /// Pushes a train: tells the peer to forget buffers if the exports
    /// would exceed [`EXPORT_MAX`], passes the memfds of buffers it does not
    /// have yet over the socket, then publishes the slot (ONLY packet and
    /// descriptor), so that the descriptors wait in the peer's socket
    /// before it can see the slot. `Err` as in [`Channel::push`].
    fn push_train(
        &self,
        prod: &mut Producer,
        exports: &mut Exports,
        meta: &SlotMeta,
        data: &[u8],
        train: &TrainOut,
        stats: &Stats,
    ) -> Result<(), ()> {
        if !self.trains() {
            bump(&stats.tx_train_dropped);
            return Ok(());
        }
        let desc = TrainDesc {
            npkts: train.npkts,
            pieces: train
                .pieces
                .iter()
                .map(|p| DescPiece {
                    token: p.mem.token(),
                    offset: p.offset,
                    len: p.len,
                })
                .collect(),
        };
        let mut ext = Vec::with_capacity(desc.encoded_len());
        if desc.encode(&mut ext).is_none() || data.len() + ext.len() > ring::MAX_PAYLOAD {
            bump(&stats.tx_train_dropped);
            return Ok(());
        }
        exports.seq += 1;
        let seq = exports.seq;
        let mut new: Vec<&Arc<SharedMemory>> = Vec::new();
        for p in &train.pieces {
            match exports.map.get_mut(&p.mem.token()) {
                Some(e) => e.last = seq,
                None if !new.iter().any(|m| Arc::ptr_eq(m, &p.mem)) => new.push(&p.mem),
                None => {}
            }
        }
        // Room for the train's slot, and for a forget slot before it.
        let want = if new.is_empty() { 1 } else { 2 };
        match prod.room(&self.region, want) {
            Ok(n) if n >= want => {}
            Ok(_) => return Err(()),
            Err(_) => {
                bump(&stats.rx_bad_index);
                self.kill();
                return Err(());
            }
        }
        if !new.is_empty() {
            let forget = exports.make_room(new.len());
            if !forget.is_empty() {
                let mut ext = Vec::with_capacity(8 * forget.len());
                ring::encode_forget(&forget, &mut ext);
                if prod
                    .push_ext(&self.region, &NO_META, ring::KIND_FORGET, &[], &ext)
                    .is_ok()
                {
                    stats.tx_forgets.fetch_add(forget.len() as u64, Ordering::Relaxed);
                }
            }
            for mem in new {
                match self.export(mem) {
                    Ok(()) => {
                        bump(&stats.tx_exports);
                        exports.map.insert(
                            mem.token(),
                            Export {
                                mem: Arc::downgrade(mem),
                                last: seq,
                            },
                        );
                    }
                    // The peer's socket is full: later (what was exported
                    // stays exported).
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(()),
                    Err(_) => {
                        bump(&stats.tx_train_dropped);
                        self.kill();
                        return Ok(());
                    }
                }
            }
        }
        match prod.push_ext(&self.region, meta, ring::KIND_TRAIN, data, &ext) {
            Ok(()) => {
                bump(&stats.tx_trains);
                Ok(())
            }
            // Cannot happen (room and length checked above).
            Err(_) => {
                bump(&stats.tx_train_dropped);
                Ok(())
            }
        }
    }

    /// Sends `mem`'s memfd to the peer.
    fn export(&self, mem: &SharedMemory) -> io::Result<()> {
        let mut m = [0u8; EXPORT_LEN];
        m[..8].copy_from_slice(EXPORT);
        m[8..16].copy_from_slice(&mem.token().to_le_bytes());
        m[16..24].copy_from_slice(&(mem.len() as u64).to_le_bytes());
        sys::send_fds(self.stream.as_raw_fd(), &m, &[mem.fd().as_raw_fd()])
    }

    /// Tells the peer to forget the exported buffers that were freed
    /// meanwhile (if the ring has room and nobody is sending).
    fn prune_exports(&self, stats: &Stats) {
        let Ok(mut tx) = self.tx.try_lock() else { return };
        let tx = &mut *tx;
        if tx.exports.map.is_empty() || !matches!(tx.prod.room(&self.region, 1), Ok(n) if n > 0) {
            return;
        }
        let forget = tx.exports.freed();
        if forget.is_empty() {
            return;
        }
        let mut ext = Vec::with_capacity(8 * forget.len());
        ring::encode_forget(&forget, &mut ext);
        if tx
            .prod
            .push_ext(&self.region, &NO_META, ring::KIND_FORGET, &[], &ext)
            .is_ok()
        {
            stats.tx_forgets.fetch_add(forget.len() as u64, Ordering::Relaxed);
        }
    }

    /// Reads exported-buffer messages from the socket (without blocking)
    /// until the one for `want`, mapping each buffer; returns whether
    /// `want` is mapped now. The sender queues a buffer's message before
    /// it publishes the first slot using it, so it is there to read.
    fn import_until(&self, maps: &mut HashMap<u64, MmapRaw>, want: u64, stats: &Stats) -> bool {
        for _ in 0..EXPORT_MAX {
            let mut m = [0u8; EXPORT_LEN];
            let (n, fds) = match sys::recv_fds(self.stream.as_raw_fd(), &mut m, 1) {
                Ok(r) => r,
                Err(_) => return false,
            };
            if n == 0 {
                return false;
            }
            if n != EXPORT_LEN || &m[..8] != EXPORT {
                // The stream is out of step: nothing more can be trusted.
                bump(&stats.rx_bad_export);
                self.kill();
                return false;
            }
            let token = u64::from_le_bytes(m[8..16].try_into().unwrap_or([0; 8]));
            let len = u64::from_le_bytes(m[16..24].try_into().unwrap_or([0; 8]));
            // Descriptors beyond the first are closed here.
            let fd = fds.into_iter().next();
            let full = maps.len() >= RX_MAPS_MAX && !maps.contains_key(&token);
            match fd.filter(|_| !full).map(|fd| map_export(fd, len)) {
                Some(Ok(map)) => {
                    bump(&stats.rx_maps);
                    maps.insert(token, map);
                    if token == want {
                        return true;
                    }
                }
                // A buffer that cannot be mapped here would fail every
                // train from it, and the sender cannot know: end the
                // channel (its destinations go back to UDP or reconnect).
                _ => {
                    bump(&stats.rx_bad_export);
                    self.kill();
                    return false;
                }
            }
        }
        false
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
    /// Offer trains to new channels, and send them (see [`ShmLink::set_trains`]).
    offer_trains: AtomicBool,
    last_prune: AtomicU64,
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
            offer_trains: AtomicBool::new(true),
            last_prune: AtomicU64::new(0),
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

    /// Whether channels opened or accepted from now on offer trains, and
    /// whether trains are sent on those that agreed (default: yes).
    pub fn set_trains(&self, on: bool) {
        self.offer_trains.store(on, Ordering::Relaxed);
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
                    let mut line = format!(
                        "{} shm {st} pid {} tx {}/{} backlog {backlog} rx {}/{}",
                        Gid::from_ip(*ip),
                        c.pid,
                        tx.0,
                        tx.1,
                        rx.0,
                        rx.1
                    );
                    if c.trains() {
                        let exported = c.tx.try_lock().map_or(0, |t| t.exports.map.len());
                        let mapped = c.rx.try_lock().map_or(0, |r| r.maps.len());
                        line += &format!(" trains exported {exported} mapped {mapped}");
                    }
                    line
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

    fn hello(&self, magic: &[u8; 8], target: Gid, offer: bool) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        let caps = if offer { CAP_TRAINS } else { 0 };
        m[OFF_CAPS..OFF_CAPS + 4].copy_from_slice(&caps.to_le_bytes());
        m[..8].copy_from_slice(magic);
        m[8..24].copy_from_slice(&target.0);
        let n = self.gids.len().min(MAX_GIDS);
        m[24] = n as u8;
        for (i, g) in self.gids.iter().take(n).enumerate() {
            m[25 + 16 * i..41 + 16 * i].copy_from_slice(&g.0);
        }
        m
    }

    /// The capabilities of a hello or answer.
    fn parse_caps(m: &[u8; MSG_LEN]) -> u32 {
        u32::from_le_bytes(m[OFF_CAPS..OFF_CAPS + 4].try_into().unwrap_or([0; 4]))
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
        let offer = self.offer_trains.load(Ordering::Relaxed);
        let msg = self.hello(HELLO, gid, offer);
        sys::send_fds(
            stream.as_raw_fd(),
            &msg,
            &[region.file().as_raw_fd(), self.doorbell.as_raw_fd()],
        )?;
        stream.set_nonblocking(true)?;
        Ok(Arc::new(Channel::new(stream, region, true, pid, offer)))
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
        let offer = self.offer_trains.load(Ordering::Relaxed);
        let answer = self.hello(ANSWER, Gid(target), offer);
        sys::send_fds(stream.as_raw_fd(), &answer, &[self.doorbell.as_raw_fd()])?;
        stream.set_nonblocking(true)?;
        let c = Arc::new(Channel::new(stream, region, false, pid, offer));
        let trains = offer && Self::parse_caps(&m) & CAP_TRAINS != 0;
        let _ = c.peer.set(Peer { gids, doorbell, trains });
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
                let trains = c.offered && Self::parse_caps(&m) & CAP_TRAINS != 0;
                let _ = c.peer.set(Peer { gids, doorbell, trains });
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
        let prune = now.saturating_sub(self.last_prune.load(Ordering::Relaxed)) >= PRUNE_NS;
        if prune {
            self.last_prune.store(now, Ordering::Relaxed);
        }
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
                        self.up.fetch_sub(1, Ordering::Relaxed);
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
            match rx.cons.pop_slot(&c.region, &mut rx.buf) {
                Ok(None) => break,
                Err(()) => {
                    bump(&self.stats.rx_bad_index);
                    c.kill();
                    break;
                }
                // Slots that are not datagrams count against the budget too,
                // so that a peer publishing them endlessly cannot keep this
                // loop going.
                Ok(Some(Slot::Bad)) => {
                    n += 1;
                    bump(&self.stats.rx_bad_len);
                }
                Ok(Some(Slot::Forget)) => {
                    n += 1;
                    match ring::decode_forget(&rx.buf) {
                        Some(tokens) => {
                            for t in tokens {
                                rx.maps.remove(&t);
                            }
                        }
                        None => bump(&self.stats.rx_bad_train),
                    }
                }
                Ok(Some(Slot::Train(m, len))) => {
                    n += 1;
                    if !self.ips.contains(&m.dst) || !peer.gids.contains(&m.src) {
                        bump(&self.stats.rx_bad_addr);
                        continue;
                    }
                    if !peer.trains || !self.deliver_train(c, rx, &m, len, f) {
                        bump(&self.stats.rx_bad_train);
                    }
                }
                Ok(Some(Slot::Datagram(m))) => {
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
                        train: None,
                    });
                }
            }
        }
        n
    }

    /// Hands the train in `rx.buf` (ONLY packet of `len` bytes, then the
    /// descriptor) to `f` with its payload in the peer's mapped buffers;
    /// `false` if the descriptor is invalid, names a buffer the peer did
    /// not pass, or reaches outside one.
    fn deliver_train(
        &self,
        c: &Channel,
        rx: &mut RxSide,
        m: &SlotMeta,
        len: usize,
        f: &mut dyn FnMut(Datagram<'_>),
    ) -> bool {
        let Some(desc) = rx.buf.get(len..).and_then(TrainDesc::decode) else {
            return false;
        };
        for p in &desc.pieces {
            if !rx.maps.contains_key(&p.token) && !c.import_until(&mut rx.maps, p.token, &self.stats) {
                return false;
            }
        }
        let mut pieces: Vec<MappedPiece<'_>> = Vec::with_capacity(desc.pieces.len());
        for p in &desc.pieces {
            let Some(map) = rx.maps.get(&p.token) else { return false };
            match p.offset.checked_add(u64::from(p.len)) {
                Some(end) if end <= map.len() as u64 => {}
                _ => return false,
            }
            // SAFETY: `offset..offset + len` lies inside the mapping
            // (checked just above), which stays mapped while `rx` is
            // borrowed: only a forget slot or the channel's end unmaps,
            // both with `rx` borrowed mutably, after `f` returned. The
            // peer cannot shrink the buffer (seals checked in
            // `map_export`), so reading it cannot fault. The mapping is
            // address space of its own, never registered with a device, so
            // it overlaps no memory the engine copies into.
            pieces.push(unsafe { MappedPiece::new(map.as_ptr().add(p.offset as usize), p.len as usize) });
        }
        let Some(train) = TrainIn::new(desc.npkts, &pieces) else {
            return false;
        };
        bump(&self.stats.rx_trains);
        f(Datagram {
            src: m.src,
            dst: m.dst,
            src_port: m.src_port,
            dst_port: m.dst_port,
            data: &rx.buf[..len],
            train: Some(train),
        });
        true
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
            ("shm_tx_trains", g(&s.tx_trains)),
            ("shm_rx_trains", g(&s.rx_trains)),
            ("shm_tx_train_dropped", g(&s.tx_train_dropped)),
            ("shm_rx_bad_train", g(&s.rx_bad_train)),
            ("shm_tx_exports", g(&s.tx_exports)),
            ("shm_tx_forgets", g(&s.tx_forgets)),
            ("shm_rx_maps", g(&s.rx_maps)),
            ("shm_rx_bad_export", g(&s.rx_bad_export)),
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
                    _ => {
                        if t.train.is_some() {
                            bump(&self.stats.tx_train_dropped);
                        }
                        continue;
                    }
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
                // A train never goes by UDP: the receiver could not read
                // its payload. Dropped like a lost packet; the requester's
                // retransmission sends the message again.
                None if t.train.is_some() => bump(&self.stats.tx_train_dropped),
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
        let bad = self.stats.rx_bad_len.load(Ordering::Relaxed)
            + self.stats.rx_bad_addr.load(Ordering::Relaxed)
            + self.stats.rx_bad_train.load(Ordering::Relaxed);
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

    fn trains_to(&self, dst: IpAddr) -> bool {
        if !self.offer_trains.load(Ordering::Relaxed) || self.detached.load(Ordering::Relaxed) {
            return false;
        }
        let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
        matches!(routes.get(&dst), Some(Route::Chan(c)) if c.state() == UP && c.trains())
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

/// Maps a buffer the peer exported, read-only, after checking that it is
/// a sealed memfd (it cannot shrink under the mapping, so reading never
/// faults) of the announced, sane size. The descriptor is closed after.
fn map_export(fd: OwnedFd, len: u64) -> io::Result<MmapRaw> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let file = std::fs::File::from(fd);
    // Only memfds (shmem, hugetlbfs) have seals: anything else fails here.
    let seals = sys::seals(&file)?;
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals & need != need {
        return Err(bad("exported buffer is not sealed"));
    }
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() != len || len == 0 || len > MAP_MAX {
        return Err(bad("exported buffer of another size"));
    }
    let len = usize::try_from(len).map_err(|_| bad("exported buffer too large"))?;
    MmapOptions::new().len(len).map_raw_read_only(&file)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::os::unix::fs::FileExt;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::soft::link::udp::{UdpConfig, UdpPort};
    use crate::soft::proto::train::TrainPiece;
    use crate::verbs::{MemorySource, MrMemory};

    const LO4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn link() -> Arc<ShmLink> {
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
                return ShmLink::new(udp, ShmMode::Only).unwrap();
            }
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

    fn content(mem: &SharedMemory, offset: u64, len: u32) -> Vec<u8> {
        let p = mem.piece(offset, len as usize).unwrap();
        let dst = MemorySource::Owned(MrMemory::new(len as usize).unwrap());
        dst.write_piece(0, p).unwrap();
        let mut v = vec![0; len as usize];
        dst.read_at(0, &mut v).unwrap();
        v
    }

    fn train(npkts: u32, pieces: &[(&Arc<SharedMemory>, u64, u32)]) -> TrainOut {
        TrainOut {
            npkts,
            pieces: pieces
                .iter()
                .map(|(m, offset, len)| TrainPiece {
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
        let (a, b) = (link(), link());
        a.set_trains(offer_a);
        b.set_trains(offer_b);
        a.send(dgram(&a, &b, b"hello", None));
        let got = pump_until(&a, &b, 1);
        assert_eq!(got.len(), 1, "{:?} {:?}", a.shm_stats(), b.shm_stats());
        assert!(a.is_shm_peer(b.gids[0]) && b.is_shm_peer(a.gids[0]));
        (a, b)
    }

    fn channel(l: &ShmLink) -> Arc<Channel> {
        l.chans_r()[0].clone()
    }

    #[test]
    fn trains_carry_the_senders_memory_in_order() {
        let (a, b) = pair(true, true);
        assert!(a.trains_to(ip(&b)) && b.trains_to(ip(&a)));
        assert!(!a.trains_to("127.0.0.9".parse().unwrap()));
        let ((_m1, s1), (_m2, s2)) = (buffer(128 << 10, 1), buffer(64 << 10, 2));
        let t1 = train(18, &[(&s1, 1000, 70_000), (&s2, 5, 3000), (&s1, 0, 10)]);
        let expect: Vec<u8> = [content(&s1, 1000, 70_000), content(&s2, 5, 3000), content(&s1, 0, 10)].concat();
        // Datagrams and trains keep their order.
        let mut txs = vec![
            dgram(&a, &b, b"one", None),
            dgram(&a, &b, b"ONLY", Some(t1)),
            dgram(&a, &b, b"two", None),
            dgram(&a, &b, b"ONLY2", Some(train(1, &[(&s1, 65536, 4096)]))),
        ];
        a.send_batch(&mut txs, &mut Vec::new());
        let got = pump_until(&a, &b, 4);
        assert_eq!(got.len(), 4, "{:?}", b.shm_stats());
        assert_eq!(
            got[0],
            Got {
                data: b"one".to_vec(),
                train: None
            }
        );
        assert_eq!(
            got[1],
            Got {
                data: b"ONLY".to_vec(),
                train: Some((18, expect))
            }
        );
        assert_eq!(
            got[2],
            Got {
                data: b"two".to_vec(),
                train: None
            }
        );
        assert_eq!(got[3].train, Some((1, content(&s1, 65536, 4096))));
        // Each buffer went over once.
        assert_eq!((stat(&a, "shm_tx_trains"), stat(&b, "shm_rx_trains")), (2, 2));
        assert_eq!((stat(&a, "shm_tx_exports"), stat(&b, "shm_rx_maps")), (2, 2));
        assert_eq!(stat(&b, "shm_rx_bad_train") + stat(&b, "shm_rx_bad_export"), 0);
        assert!(
            b.peer_lines()[0].contains(" trains exported 0 mapped 2"),
            "{:?}",
            b.peer_lines()
        );
        assert!(
            a.peer_lines()[0].contains(" trains exported 2 mapped 0"),
            "{:?}",
            a.peer_lines()
        );
        // The other way too.
        let (_m3, s3) = buffer(64 << 10, 3);
        b.send(dgram(&b, &a, b"back", Some(train(16, &[(&s3, 0, 64 << 10)]))));
        let got = pump_until(&b, &a, 1);
        assert_eq!(got[0].train, Some((16, content(&s3, 0, 64 << 10))));
        // Not offered any more: no trains, and one sent anyway is dropped.
        a.set_trains(false);
        assert!(!a.trains_to(ip(&b)));
        // No channel to there (and never UDP).
        let mut lost = dgram(&a, &b, b"x", Some(train(1, &[(&s1, 0, 1)])));
        lost.dst = "127.0.0.9".parse().unwrap();
        a.send(lost);
        assert_eq!(stat(&a, "shm_tx_train_dropped"), 1);
        assert_eq!(
            a.udp
                .stats()
                .iter()
                .find(|(k, _)| *k == "udp_tx_datagrams")
                .map_or(0, |s| s.1),
            0
        );
    }

    #[test]
    fn trains_need_both_ends() {
        for (offer_a, offer_b) in [(true, false), (false, true)] {
            let (a, b) = pair(offer_a, offer_b);
            assert!(!a.trains_to(ip(&b)) && !b.trains_to(ip(&a)));
            let (_m, s) = buffer(64 << 10, 0);
            a.send(dgram(&a, &b, b"ONLY", Some(train(2, &[(&s, 0, 8192)]))));
            a.send(dgram(&a, &b, b"after", None));
            let got = pump_until(&a, &b, 1);
            assert_eq!(
                got,
                vec![Got {
                    data: b"after".to_vec(),
                    train: None
                }]
            );
            assert_eq!(stat(&a, "shm_tx_train_dropped"), 1);
            assert_eq!(stat(&a, "shm_tx_exports"), 0);
        }
    }

    /// More buffers than a channel keeps exported: the least recently used
    /// are forgotten (and exported again when used again), freed ones are
    /// forgotten too, and the receiver never maps more than the sender
    /// keeps exported.
    #[test]
    fn exports_are_bounded_and_freed_buffers_forgotten() {
        // A process has only so many shareable buffers (SHARE_MAX_LIVE):
        // this channel keeps fewer exported.
        const CAP: usize = 16;
        let (a, b) = pair(true, true);
        lock(&channel(&a).tx).exports.cap = CAP;
        let bufs: Vec<_> = (0..CAP + 24).map(|i| buffer(64 << 10, i as u8)).collect();
        let mut sent = 0;
        for chunk in bufs.chunks(7) {
            let mut txs: Vec<Transmit> = chunk
                .iter()
                .map(|(_, s)| dgram(&a, &b, b"T", Some(train(1, &[(s, 8, 100)]))))
                .collect();
            sent += txs.len();
            a.send_batch(&mut txs, &mut Vec::new());
            let got = pump_until(&a, &b, chunk.len());
            assert_eq!(got.len(), chunk.len(), "{:?} {:?}", a.shm_stats(), b.shm_stats());
            for (g, (_, s)) in got.iter().zip(chunk) {
                assert_eq!(g.train, Some((1, content(s, 8, 100))));
            }
            assert!(lock(&channel(&b).rx).maps.len() <= CAP);
            assert!(lock(&channel(&a).tx).exports.map.len() <= CAP);
        }
        assert_eq!(stat(&b, "shm_rx_trains"), sent as u64);
        assert_eq!(stat(&a, "shm_tx_forgets"), 24);
        // The first buffer was forgotten: used again, exported again.
        a.send(dgram(&a, &b, b"T", Some(train(1, &[(&bufs[0].1, 0, 64)]))));
        assert_eq!(pump_until(&a, &b, 1)[0].train, Some((1, content(&bufs[0].1, 0, 64))));
        assert_eq!(stat(&a, "shm_tx_exports"), sent as u64 + 1);
        assert_eq!(stat(&b, "shm_rx_bad_train"), 0);
        // Freed buffers are forgotten by the next prune, and unmapped by
        // the receiver when it reads the forget slot.
        assert_eq!(stat(&a, "shm_tx_forgets"), 25);
        let exported = lock(&channel(&a).tx).exports.map.len();
        assert_eq!(exported, CAP);
        drop(bufs);
        channel(&a).prune_exports(&a.stats);
        assert_eq!(stat(&a, "shm_tx_forgets"), 25 + exported as u64);
        assert!(lock(&channel(&a).tx).exports.map.is_empty());
        a.send(dgram(&a, &b, b"end", None));
        pump_until(&a, &b, 1);
        assert!(lock(&channel(&b).rx).maps.is_empty());
    }

    /// Plays a hostile sender: train slots whose descriptors name unknown
    /// buffers, reach outside them or are garbage are dropped and counted;
    /// the channel stays up and a good train still goes through.
    #[test]
    fn hostile_train_slots_are_dropped_and_counted() {
        let (a, b) = pair(true, true);
        let (_m, s) = buffer(64 << 10, 7);
        a.send(dgram(&a, &b, b"ONLY", Some(train(1, &[(&s, 0, 16)]))));
        assert!(pump_until(&a, &b, 1)[0].train.is_some());
        // From here on the test writes a's ring itself (a must not send).
        let ca = channel(&a);
        let region = Region::open(ca.region.file().try_clone().unwrap()).unwrap();
        let mut p = Producer::resume(&region, 0);
        let meta = SlotMeta {
            src: ip(&a),
            dst: ip(&b),
            src_port: 1,
            dst_port: 4791,
        };
        let piece = |token: u64, offset: u64, len: u32| DescPiece { token, offset, len };
        let desc = |pieces: Vec<DescPiece>| {
            let mut v = Vec::new();
            v.extend_from_slice(&1u32.to_le_bytes());
            v.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
            for p in pieces {
                v.extend_from_slice(&p.token.to_le_bytes());
                v.extend_from_slice(&p.offset.to_le_bytes());
                v.extend_from_slice(&p.len.to_le_bytes());
            }
            v
        };
        let len = s.len() as u64;
        let tok = s.token();
        let hostile: Vec<Vec<u8>> = vec![
            desc(vec![piece(tok + 1000, 0, 16)]),                      // never exported
            desc(vec![piece(tok, len - 8, 16)]),                       // past the end
            desc(vec![piece(tok, u64::MAX - 4, 16)]),                  // wraps
            desc(vec![piece(tok, 0, 16); ring::TRAIN_MAX_PIECES + 1]), // too many
            desc(vec![]),                                              // none
            desc(vec![piece(tok, 0, 1 << 31), piece(tok, 0, 1)]),      // too long
            vec![0xff; 7],                                             // garbage
        ];
        for (i, d) in hostile.iter().enumerate() {
            p.push_ext(&region, &meta, ring::KIND_TRAIN, b"ONLY", d).unwrap();
            let got = pump_nothing(&a, &b);
            assert!(got.is_empty(), "{i}: {got:?}");
            assert_eq!(stat(&b, "shm_rx_bad_train"), i as u64 + 1, "{i}");
        }
        // A forget slot that is not a list of tokens.
        p.push_ext(&region, &NO_META, ring::KIND_FORGET, &[], &[1; 7]).unwrap();
        // A train from a foreign address.
        let foreign = SlotMeta {
            src: "10.9.9.9".parse().unwrap(),
            ..meta
        };
        p.push_ext(
            &region,
            &foreign,
            ring::KIND_TRAIN,
            b"ONLY",
            &desc(vec![piece(tok, 0, 16)]),
        )
        .unwrap();
        // And a good one, over the buffer mapped before.
        p.push_ext(
            &region,
            &meta,
            ring::KIND_TRAIN,
            b"GOOD",
            &desc(vec![piece(tok, len - 16, 16)]),
        )
        .unwrap();
        let got = pump_until(&a, &b, 1);
        assert_eq!(
            got,
            vec![Got {
                data: b"GOOD".to_vec(),
                train: Some((1, content(&s, len - 16, 16)))
            }]
        );
        assert_eq!(stat(&b, "shm_rx_bad_train"), hostile.len() as u64 + 1);
        assert_eq!(stat(&b, "shm_rx_bad_addr"), 1);
        assert_eq!(stat(&b, "shm_rx_bad_export"), 0);
        assert!(b.is_shm_peer(a.gids[0]));
        let mut c = Counters::default();
        b.merge_counters(&mut c);
        assert!(c.rx_malformed >= hostile.len() as u64 + 2, "{c:?}");
    }

    /// A train slot on a channel where the receiver did not offer trains
    /// is dropped.
    #[test]
    fn train_slots_without_the_offer_are_dropped() {
        let (a, b) = pair(true, false);
        let region = Region::open(channel(&a).region.file().try_clone().unwrap()).unwrap();
        let mut p = Producer::resume(&region, 0);
        let meta = SlotMeta {
            src: ip(&a),
            dst: ip(&b),
            src_port: 1,
            dst_port: 4791,
        };
        let mut d = Vec::new();
        TrainDesc {
            npkts: 1,
            pieces: vec![DescPiece {
                token: 1,
                offset: 0,
                len: 1,
            }],
        }
        .encode(&mut d)
        .unwrap();
        p.push_ext(&region, &meta, ring::KIND_TRAIN, b"ONLY", &d).unwrap();
        assert!(pump_nothing(&a, &b).is_empty());
        assert_eq!(stat(&b, "shm_rx_bad_train"), 1);
    }

    /// Buffers a hostile sender passes that could fault the receiver
    /// (not sealed, not a memfd, of another size) are refused, and the
    /// channel ends.
    #[test]
    fn unsafe_exports_are_refused() {
        let sealed = |len: u64, seals: libc::c_int| {
            let f = sys::memfd("test").unwrap();
            f.set_len(len).unwrap();
            // SAFETY: fcntl on a live descriptor with an integer argument.
            assert!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) } >= 0);
            OwnedFd::from(f)
        };
        let both = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        assert_eq!(map_export(sealed(8192, both), 8192).unwrap().len(), 8192);
        assert!(map_export(sealed(8192, both), 4096).is_err());
        assert!(map_export(sealed(8192, both), 1 << 20).is_err());
        assert!(map_export(sealed(0, both), 0).is_err());
        assert!(map_export(sealed(8192, libc::F_SEAL_GROW), 8192).is_err());
        assert!(map_export(sealed(8192, libc::F_SEAL_SHRINK), 8192).is_err());
        assert!(map_export(sealed(8192, 0), 8192).is_err());
        let (sock, _other) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(map_export(OwnedFd::from(sock), 0).is_err());
        let dev_zero = std::fs::File::open("/dev/zero").unwrap();
        assert!(map_export(OwnedFd::from(dev_zero), 4096).is_err());
        // A memfd of the right kind is mapped read-only and shows the
        // sender's bytes, including what it writes later.
        let f = sys::memfd("test").unwrap();
        f.set_len(4096).unwrap();
        f.write_all_at(b"abc", 100).unwrap();
        sys::seal_size(&f).unwrap();
        let map = map_export(OwnedFd::from(f.try_clone().unwrap()), 4096).unwrap();
        f.write_all_at(b"xyz", 200).unwrap();
        let mut v = [0u8; 3];
        // SAFETY: in bounds of the 4096-byte mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(map.as_ptr().add(100), v.as_mut_ptr(), 3);
            assert_eq!(&v, b"abc");
            std::ptr::copy_nonoverlapping(map.as_ptr().add(200), v.as_mut_ptr(), 3);
        }
        assert_eq!(&v, b"xyz");

        // Over a channel: an unsealed memfd, then a train naming it.
        let (a, b) = pair(true, true);
        let ca = channel(&a);
        let bad = sys::memfd("bad").unwrap();
        bad.set_len(65536).unwrap();
        let mut m = [0u8; EXPORT_LEN];
        m[..8].copy_from_slice(EXPORT);
        m[8..16].copy_from_slice(&77u64.to_le_bytes());
        m[16..24].copy_from_slice(&65536u64.to_le_bytes());
        sys::send_fds(ca.stream.as_raw_fd(), &m, &[bad.as_raw_fd()]).unwrap();
        let region = Region::open(ca.region.file().try_clone().unwrap()).unwrap();
        let mut p = Producer::resume(&region, 0);
        let meta = SlotMeta {
            src: ip(&a),
            dst: ip(&b),
            src_port: 1,
            dst_port: 4791,
        };
        let mut d = Vec::new();
        TrainDesc {
            npkts: 1,
            pieces: vec![DescPiece {
                token: 77,
                offset: 0,
                len: 16,
            }],
        }
        .encode(&mut d)
        .unwrap();
        p.push_ext(&region, &meta, ring::KIND_TRAIN, b"ONLY", &d).unwrap();
        assert!(pump_nothing(&a, &b).is_empty());
        assert_eq!(stat(&b, "shm_rx_bad_export"), 1);
        assert_eq!(stat(&b, "shm_rx_bad_train"), 1);
        assert!(!b.is_shm_peer(a.gids[0]));
    }
}
