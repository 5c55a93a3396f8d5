//! What the shared-memory link tells about itself: its counters, one
//! line per known peer, the channels' files, and the [`Diagnostics`] it
//! offers the engine.

use std::sync::atomic::{AtomicU64, Ordering};

use super::channel::{CLOSING, PENDING, UP};
use super::setup::Route;
use super::ShmLink;
use crate::soft::link::Diagnostics;
use crate::soft::proto::Counters;
use crate::verbs::Gid;

#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) tx_datagrams: AtomicU64,
    pub(super) rx_datagrams: AtomicU64,
    pub(super) tx_backlogged: AtomicU64,
    pub(super) tx_drops: AtomicU64,
    pub(super) tx_no_channel: AtomicU64,
    pub(super) doorbells: AtomicU64,
    pub(super) rx_bad_len: AtomicU64,
    pub(super) rx_bad_index: AtomicU64,
    pub(super) rx_bad_addr: AtomicU64,
    pub(super) opened: AtomicU64,
    pub(super) accepted: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) connect_failed: AtomicU64,
    pub(super) peers_lost: AtomicU64,
    pub(super) tx_trains: AtomicU64,
    pub(super) rx_trains: AtomicU64,
    pub(super) tx_train_dropped: AtomicU64,
    pub(super) rx_bad_train: AtomicU64,
    pub(super) tx_exports: AtomicU64,
    pub(super) tx_forgets: AtomicU64,
    pub(super) rx_maps: AtomicU64,
    pub(super) rx_bad_export: AtomicU64,
    pub(super) tx_trains_cma: AtomicU64,
    pub(super) rx_trains_cma: AtomicU64,
    pub(super) cma_probe_failed: AtomicU64,
    /// Accepted connections dropped for sending no hello in [`HELLO_NS`](super::HELLO_NS).
    pub(super) hello_timeouts: AtomicU64,
    /// Accepted connections dropped unheard because
    /// [`ShmLimits::max_pending_hellos`](super::ShmLimits::max_pending_hellos) newer ones waited.
    pub(super) hellos_dropped: AtomicU64,
    /// Hellos and answers refused for a GID the peer could not prove.
    pub(super) refused_gid: AtomicU64,
    /// Hellos and answers refused for a doorbell that is not a unix
    /// datagram socket.
    pub(super) refused_doorbell: AtomicU64,
    /// Doorbell rings that found the peer's doorbell full.
    pub(super) doorbells_full: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl ShmLink {
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
                        let (rx, tx) = (c.cma_rx.load(Ordering::Relaxed), c.cma_tx.load(Ordering::Relaxed));
                        line += match (rx, tx) {
                            (true, true) => " cma rx tx",
                            (true, false) => " cma rx",
                            (false, true) => " cma tx",
                            (false, false) => "",
                        };
                    }
                    line
                }
                Route::Setup(_) => format!("{} shm setup", Gid::from_ip(*ip)),
                Route::Udp(..) => format!("{} udp", Gid::from_ip(*ip)),
            })
            .collect();
        lines.sort();
        lines
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
            ("shm_tx_trains_cma", g(&s.tx_trains_cma)),
            ("shm_rx_trains_cma", g(&s.rx_trains_cma)),
            ("shm_cma_probe_failed", g(&s.cma_probe_failed)),
            ("shm_hello_timeouts", g(&s.hello_timeouts)),
            ("shm_hellos_dropped", g(&s.hellos_dropped)),
            ("shm_refused_gid", g(&s.refused_gid)),
            ("shm_refused_doorbell", g(&s.refused_doorbell)),
            ("shm_refused_limit", g(&self.budget.refused)),
            ("shm_doorbells_full", g(&s.doorbells_full)),
            ("shm_mapped_bytes", g(&self.budget.mapped_bytes)),
            ("shm_mapped_exports", g(&self.budget.mapped_exports)),
        ]
    }
}

impl Diagnostics for ShmLink {
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
}
