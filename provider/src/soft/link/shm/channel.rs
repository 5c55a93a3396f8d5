//! A channel of the shared-memory link (see the parent module): the
//! region with a ring each way to one peer device, each end's side of it
//! (the producer with its backlog and exports, the consumer with the
//! peer's buffers mapped here), its state, the peer as its hello or
//! answer named it, and the push of datagrams into the ring.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use memmap2::MmapRaw;

use super::limits::{Budget, Charge};
use super::ring::{self, Consumer, Producer, PushError, Region, SlotMeta};
use super::stats::{bump, Stats};
use super::sys;
use super::trains::Exports;
use crate::soft::clock::process_now;
use crate::soft::link::iphash::IpHash;
use crate::soft::proto::{Nanos, Transmit};
use crate::sys::lock;

/// Datagrams a channel holds back (full ring, channel being set up).
const BACKLOG_MAX: usize = 8192;

pub(super) const PENDING: u8 = 0;
pub(super) const UP: u8 = 1;
pub(super) const DEAD: u8 = 2;
/// The peer closed: read what it published before, then [`DEAD`].
pub(super) const CLOSING: u8 = 3;

/// What [`Channel::send`] did.
pub(super) struct Sent {
    /// Something was published in the ring.
    pub(super) published: bool,
    /// Datagrams wait in the backlog.
    pub(super) backlogged: bool,
}

#[derive(Debug)]
pub(super) struct TxSide {
    pub(super) prod: Producer,
    pub(super) backlog: VecDeque<Transmit>,
    pub(super) exports: Exports,
}

#[derive(Debug)]
pub(super) struct RxSide {
    pub(super) cons: Consumer,
    pub(super) buf: Vec<u8>,
    /// The peer's buffers mapped here, by the peer's token (a fast hash:
    /// looked up for every train, and never more than [`RX_MAPS_MAX`](super::RX_MAPS_MAX)
    /// entries, so a peer choosing colliding tokens gains nothing).
    pub(super) maps: TokenMaps,
    /// The descriptor of the train being delivered (kept for its vector).
    pub(super) desc: ring::TrainDesc,
    /// Whether the consumer's current slot addresses passed the check of
    /// [`ShmLink::addrs_ok`](super::ShmLink::addrs_ok).
    pub(super) addrs_ok: bool,
}

/// The receiver's table of the peer's mapped buffers.
pub(super) type TokenMaps = HashMap<u64, Mapped, IpHash>;

/// A buffer of the peer mapped here, and its share of the device's
/// [`ShmLimits`](super::ShmLimits) (given back when it is unmapped).
#[derive(Debug)]
pub(super) struct Mapped {
    pub(super) map: MmapRaw,
    pub(super) _charge: Charge,
}

impl std::ops::Deref for Mapped {
    type Target = MmapRaw;
    fn deref(&self) -> &MmapRaw {
        &self.map
    }
}

#[derive(Debug)]
pub(super) struct Peer {
    pub(super) gids: Vec<IpAddr>,
    /// The socket the peer passed to ring it with (`sys::check_bell`).
    pub(super) doorbell: OwnedFd,
    /// Both ends offered trains.
    pub(super) trains: bool,
    /// The peer takes trains of one packet ([`CAP_TRAINS1`](super::wire::CAP_TRAINS1)).
    pub(super) one_packet: bool,
}

/// Metadata of forget slots (the consumer does not look at it).
pub(super) const NO_META: SlotMeta = SlotMeta {
    src: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    dst: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    src_port: 0,
    dst_port: 0,
};

/// One channel: a region with a ring each way, to one peer device.
#[derive(Debug)]
pub(super) struct Channel {
    pub(super) stream: UnixStream,
    pub(super) region: Region,
    pub(super) connector: bool,
    pub(super) pid: u32,
    pub(super) since: Nanos,
    pub(super) state: AtomicU8,
    pub(super) tx: Mutex<TxSide>,
    pub(super) rx: Mutex<RxSide>,
    pub(super) peer: OnceLock<Peer>,
    /// This end offered trains in its hello or answer.
    pub(super) offered: bool,
    /// The peer process, for a liveness check before reading its memory
    /// (`None`: no pidfds here, no process-memory pieces).
    pub(super) pidfd: Option<OwnedFd>,
    /// This end verified it can read the peer's memory: it accepts
    /// process-memory pieces (`shm/hello.rs`, "Probe").
    pub(super) cma_rx: AtomicBool,
    /// The peer verified it can read this process's memory: trains may
    /// carry process-memory pieces.
    pub(super) cma_tx: AtomicBool,
    /// The device's budget, charged for the peer's buffers mapped here.
    pub(super) budget: Arc<Budget>,
    /// The region's share of it.
    pub(super) _region_charge: Charge,
    /// The GID a connector opened the channel to (the answer must name
    /// it, and prove it like every GID it names).
    pub(super) target: Option<IpAddr>,
}

impl Channel {
    pub(super) fn new(
        stream: UnixStream,
        region: Region,
        connector: bool,
        pid: u32,
        offered: bool,
        charge: Charge,
    ) -> Channel {
        let (tx_ring, rx_ring) = Channel::rings(connector);
        Channel {
            budget: charge.budget.clone(),
            _region_charge: charge,
            target: None,
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
                maps: HashMap::default(),
                desc: ring::TrainDesc {
                    npkts: 0,
                    pieces: Vec::with_capacity(ring::TRAIN_MAX_PIECES),
                },
                addrs_ok: false,
            }),
            peer: OnceLock::new(),
            offered,
            pidfd: sys::pidfd_open(pid).ok(),
            cma_rx: AtomicBool::new(false),
            cma_tx: AtomicBool::new(false),
        }
    }

    /// Whether trains go both ways on this channel (once up).
    pub(super) fn trains(&self) -> bool {
        self.peer.get().is_some_and(|p| p.trains)
    }

    pub(super) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub(super) fn kill(&self) {
        if self.state.swap(DEAD, Ordering::AcqRel) != DEAD {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Pushes what it can of the backlog, then `t` (if any); the rest
    /// waits. Says whether something was published and whether datagrams
    /// still wait (read under the same lock: one lock per datagram).
    pub(super) fn send(&self, t: Option<Transmit>, stats: &Stats, spent: &mut dyn FnMut(Vec<u8>)) -> Sent {
        let mut tx = lock(&self.tx);
        let tx = &mut *tx;
        let published = self.send_locked(tx, t, stats, spent);
        Sent {
            published,
            backlogged: !tx.backlog.is_empty(),
        }
    }

    fn send_locked(&self, tx: &mut TxSide, t: Option<Transmit>, stats: &Stats, spent: &mut dyn FnMut(Vec<u8>)) -> bool {
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
                // Copied into the ring: the buffer is free again.
                spent(t.data);
            } else if self.state() == UP {
                Self::hold(tx, t, stats);
            }
        }
        published
    }

    /// The rings an end writes and reads: the connector writes ring 0.
    pub(super) const fn rings(connector: bool) -> (usize, usize) {
        if connector {
            (0, 1)
        } else {
            (1, 0)
        }
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
        self.pushed(prod.push(&self.region, &meta, &t.data), stats)
    }

    /// Counts what a push of a datagram did; `Err`: keep it (full ring, or
    /// the channel just died of a corrupt index).
    pub(super) fn pushed(&self, r: Result<(), PushError>, stats: &Stats) -> Result<(), ()> {
        match r {
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
}

impl Channel {
    pub(super) fn region_wake(&self, rx: &mut RxSide) {
        rx.cons.wake(&self.region);
    }
}
