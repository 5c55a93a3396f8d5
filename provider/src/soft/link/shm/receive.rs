//! The receive path of the shared-memory link: one pass over every
//! channel's ring (bounded by the budget and by [`TURN_TRAIN_BYTES`] of
//! trains), the slow path when due, and
//! handing each slot to the engine (datagrams directly, trains through
//! [`super::trains`]).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::channel::{Channel, Peer, RxSide, CLOSING, UP};
use super::hello;
use super::ring::{self, Slot, SlotMeta};
use super::stats::bump;
use super::wire::CAP_CMA_READ;
use super::{sys, ShmLink, ShmMode, DRAIN_MAX, SLOW_NS};
use crate::soft::clock::process_now;
use crate::soft::link::Link;
use crate::soft::proto::Datagram;
use crate::sys::lock;

/// What only the receive side of a [`ShmLink`] writes: its turns, the
/// sleep and wake-up flags ([`super::Wakeups`]), and the rendezvous that
/// its slow path runs.
///
/// Aligned to a cache line: a busy-polling reader writes `calls` on every
/// receive, and a sender on another thread reads the link's shared
/// fields (`detached`, `route_version`) on every datagram; with this
/// alignment the two never share a line, whatever order the compiler
/// gives the fields.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct ReceiveState {
    /// Receive calls (counted loosely, see [`ShmLink::receive`]).
    pub(super) calls: AtomicU64,
    /// When the slow path last ran.
    pub(super) last_slow: AtomicU64,
    /// Channels up (cheap check on the receive path).
    pub(super) up: AtomicU64,
    /// Slept since the last receive: run the slow path, clear the flags.
    pub(super) armed: AtomicBool,
    /// The last UDP read found datagrams (more may wait; the next
    /// receive turn reads UDP too).
    pub(super) udp_more: AtomicBool,
    /// The last slow path left rendezvous work for the next (its bounds
    /// were reached): do not sleep. The epoll in the poll set would not
    /// wake the reader for what was already there.
    pub(super) rendezvous_more: AtomicBool,
    /// An application sleeps on the link's descriptors at times the engine
    /// does not know ([`super::Wakeups::set_watched`]): every ring keeps its sleep
    /// flag set, so peers ring the doorbell for everything they publish.
    pub(super) watched: AtomicBool,
    /// When the slow path last forgot unused exports.
    pub(super) last_prune: AtomicU64,
    /// A sender to our own doorbell, made when watched: rung when a ring
    /// still holds data as a receive ends, so the sleeping application
    /// wakes for it.
    pub(super) self_bell: OnceLock<OwnedFd>,
    /// The rendezvous sockets, one per GID.
    pub(super) listeners: Mutex<Vec<UnixListener>>,
    /// Accepted connections waiting for their hello (`shm/hello.rs`).
    pub(super) hellos: Mutex<VecDeque<hello::Pending>>,
    /// An epoll descriptor holding the listeners and the connections
    /// waiting for their hello, in the poll set: a hello that arrives
    /// after its connection was accepted wakes a sleeping reader.
    pub(super) rendezvous: OwnedFd,
}

impl ReceiveState {
    pub(super) fn new(listeners: Vec<UnixListener>, rendezvous: OwnedFd) -> ReceiveState {
        ReceiveState {
            calls: AtomicU64::new(0),
            last_slow: AtomicU64::new(0),
            up: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            udp_more: AtomicBool::new(false),
            rendezvous_more: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            last_prune: AtomicU64::new(0),
            self_bell: OnceLock::new(),
            listeners: Mutex::new(listeners),
            hellos: Mutex::new(VecDeque::new()),
            rendezvous,
        }
    }
}

/// Train payload a receive turn copies at most, across channels (it stops
/// after the train that reaches it). The engine sends a turn's ACKs when
/// the turn ends, and a sender whose window or send queue waits for them
/// stops feeding the ring meanwhile: without a bound a turn took up to 32
/// trains (at 64 KiB, ~45 µs of copying before any ACK left) and the ring
/// ran dry after each. Each turn's end costs the reader about as much as
/// a tenth of a 64 KiB train (the ACK, the return to the poller), so the
/// bound is as large as keeps the sender fed: 1 MiB is 16 trains of 64
/// KiB (256 packets), half of a requester's window on a network link
/// (512 packets), so the sender still has the other half to publish
/// while the reader copies these.
pub(super) const TURN_TRAIN_BYTES: u64 = 1024 * 1024;

impl ShmLink {
    pub(super) fn receive(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        if self.detached.load(Ordering::Relaxed) {
            return 0;
        }
        // Plain load and store: a lost count between two threads only
        // shifts the periodic work below (a locked add costs ~20 cycles
        // on every poll of a busy-polling reader).
        let calls = self.rx.calls.load(Ordering::Relaxed);
        self.rx.calls.store(calls.wrapping_add(1), Ordering::Relaxed);
        // Read before swapping: the flag is set only when the reader goes
        // to sleep, and a locked exchange on every poll costs as much.
        let woke = self.rx.armed.load(Ordering::Relaxed) && self.rx.armed.swap(false, Ordering::AcqRel);
        let watched = self.rx.watched.load(Ordering::Relaxed);
        if woke {
            sys::drain(self.doorbell.as_raw_fd(), DRAIN_MAX);
            if !watched {
                for c in self.chans_r().iter() {
                    let mut rx = lock(&c.rx);
                    c.region_wake(&mut rx);
                }
            }
        }
        // The clock is read every few calls only: a busy-polling reader
        // calls this millions of times a second.
        let mut slow = false;
        if woke || calls.is_multiple_of(16) {
            let now = process_now();
            if woke || now.saturating_sub(self.rx.last_slow.load(Ordering::Relaxed)) >= SLOW_NS {
                self.slow_path(now);
                slow = true;
            }
        }
        if self.backlogged.load(Ordering::Relaxed) {
            self.flush_backlogs();
        }
        let mut n = 0;
        let mut train_bytes = 0;
        let up = self.rx.up.load(Ordering::Relaxed);
        if up > 0 {
            for c in self.chans_r().iter() {
                let st = c.state();
                if (st != UP && st != CLOSING) || n >= budget || train_bytes >= TURN_TRAIN_BYTES {
                    continue;
                }
                let (got, drained) = self.read_channel(c, budget - n, &mut train_bytes, f);
                n += got;
                // A closing channel ends once everything the peer
                // published before it closed has been read.
                if st == CLOSING && drained {
                    c.kill();
                }
            }
        }
        if watched {
            // An application may sleep on the doorbell after this call:
            // every ring that is up (a channel may have come up just now)
            // keeps asking its peer to ring it.
            let mut left = false;
            for c in self.chans_r().iter() {
                if c.state() == UP && c.peer.get().is_some() {
                    let mut rx = lock(&c.rx);
                    left |= !rx.cons.prepare_sleep(&c.region);
                }
            }
            if left {
                // Data the budget left, or published before the flag was
                // set (no doorbell for it): ring our own doorbell, so the
                // application's poller reports it, and look again at the
                // next receive.
                self.rx.armed.store(true, Ordering::Release);
                if let Some(b) = self.rx.self_bell.get() {
                    sys::ring(b.as_raw_fd());
                }
            }
        }
        // The UDP socket. An empty receive call costs ~0.4 µs here, and a
        // datagram that reaches a ring while the reader is in one waits for
        // it. It is read when no channel is up; on the slow path's turns,
        // which include the first turn after a sleep (the poller is
        // edge-triggered: a datagram left in the socket would wait for the
        // next wake-up); on the turns after a read that found something
        // (more may wait: an idle socket is probed for one datagram, a busy
        // one read up to the budget); and with `Auto`, whose UDP peers are real peers,
        // every 8th call. With `Only` nothing is sent by UDP: what arrives
        // there comes from `Auto` peers whose channel is not up yet. Read
        // every 64 calls in `Only`, the client of `perf send_lat --link shm
        // -s 8` made 0.11-0.21 UDP receive calls per round trip (perf stat
        // over 100,000); now 0.04.
        let udp_due = up == 0
            || slow
            || self.rx.udp_more.load(Ordering::Relaxed)
            || (self.mode == ShmMode::Auto && calls.is_multiple_of(8));
        if udp_due {
            let ask = budget.saturating_sub(n).max(1);
            let got = self.udp.recv(ask, f);
            n += got;
            let more = got > 0;
            if self.rx.udp_more.load(Ordering::Relaxed) != more {
                self.rx.udp_more.store(more, Ordering::Relaxed);
            }
        }
        // No PAUSE when nothing was found: the caller's next poll is the
        // next look at the ring. A PAUSE costs 25 ns on this project's
        // hosts, half of an idle poll, and a slot published meanwhile waited
        // for it; the reader polls one line per ring, as the raw flag
        // ping-pong (which never pauses) does. Without it the 8-byte
        // one-way trip was 4-13 % shorter (three alternated runs, 56
        // rounds; benches/RESULTS.md).
        n
    }

    /// Reads up to `budget` slots of `c`, and trains until `train_bytes`
    /// (of this turn, across channels) reaches [`TURN_TRAIN_BYTES`];
    /// returns how many slots it read and whether it found the ring empty.
    fn read_channel(
        &self,
        c: &Channel,
        budget: usize,
        train_bytes: &mut u64,
        f: &mut dyn FnMut(Datagram<'_>),
    ) -> (usize, bool) {
        // No peer yet: nothing to read, as from an empty ring.
        let Some(peer) = c.peer.get() else { return (0, true) };
        let mut rx = lock(&c.rx);
        let rx = &mut *rx;
        let mut n = 0;
        while n < budget && *train_bytes < TURN_TRAIN_BYTES {
            match rx.cons.pop_slot(&c.region, &mut rx.buf) {
                Ok(None) => return (n, true),
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
                Ok(Some(Slot::Caps)) => {
                    n += 1;
                    // The connector read our probe (`shm/hello.rs`): only
                    // meaningful if we offered process-memory trains.
                    let caps = rx
                        .buf
                        .get(..4)
                        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
                    if caps & CAP_CMA_READ != 0 && !c.connector && peer.trains {
                        c.cma_tx.store(true, Ordering::Relaxed);
                    }
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
                    if !self.addrs_ok(rx, peer, &m) {
                        bump(&self.stats.rx_bad_addr);
                        continue;
                    }
                    let delivered = if peer.trains {
                        self.deliver_train(c, rx, &m, len, f)
                    } else {
                        None
                    };
                    match delivered {
                        Some(bytes) => *train_bytes += u64::from(bytes),
                        None => bump(&self.stats.rx_bad_train),
                    }
                }
                Ok(Some(Slot::Datagram(m))) => {
                    n += 1;
                    if !self.addrs_ok(rx, peer, &m) {
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
        (n, false)
    }

    /// Whether a slot's addresses are one of this link's and one of the
    /// peer's. Checked when they change: a slot without addresses has
    /// those of the slot before, and both address lists are fixed for the
    /// channel's life (two slice searches of `IpAddr` cost ~45
    /// instructions, on every datagram).
    fn addrs_ok(&self, rx: &mut RxSide, peer: &Peer, m: &SlotMeta) -> bool {
        if rx.cons.take_fresh() {
            rx.addrs_ok = self.ips.contains(&m.dst) && peer.gids.contains(&m.src);
        }
        rx.addrs_ok
    }
}
