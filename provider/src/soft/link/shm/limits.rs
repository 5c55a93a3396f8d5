//! The limits of a device's shared-memory link ([`ShmLimits`], see the
//! parent module's "Limits") and the budget its channels charge for what
//! they map.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::soft::clock::process_now;
use crate::soft::proto::Nanos;
use crate::sys::lock;

/// Limits of one device's shared-memory link: what peers on this host can
/// make it hold. A peer beyond them is refused (counted in
/// `shm_refused_limit`, and a line on standard error at most once a
/// second): a hello beyond [`max_channels`](Self::max_channels) gets no
/// channel, a buffer export beyond [`max_mapped_bytes`](Self::max_mapped_bytes)
/// or [`max_mapped_exports`](Self::max_mapped_exports) ends the channel
/// that sent it (its destinations go back to UDP, or wait for a channel
/// in [`ShmMode::Only`](super::ShmMode::Only)).
///
/// Set with [`ShmLink::set_limits`](super::ShmLink::set_limits), or when a link is made from
/// [`LIMITS_ENV`]. What they bound: each channel holds four descriptors
/// and maps its region ([`ring::REGION_LEN`](super::ring::REGION_LEN), about 4.5 MiB, prefaulted:
/// the ring's first lap would otherwise take a page fault per slot on
/// both sides); a mapped buffer holds address space only (mapped lazily,
/// never prefaulted: the engine touches only the pages it copies) and no
/// descriptor. A device talking to `n` peers on this host holds `n`
/// channels, up to `2n` while pairs connect to each other at once: raise
/// `max_channels` for more than about 32 peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmLimits {
    /// Channels (being set up, up, or closing) at most.
    pub max_channels: usize,
    /// Bytes of address space mapped at most: channel regions and the
    /// buffers peers exported for trains.
    pub max_mapped_bytes: u64,
    /// Buffers exported by peers mapped at most, over all channels (a
    /// channel maps at most twice [`EXPORT_MAX`](super::EXPORT_MAX) anyway).
    pub max_mapped_exports: usize,
    /// Accepted connections that have not sent their hello yet, at most;
    /// a new one takes the place of the oldest that stayed silent
    /// (`shm_hellos_dropped`), or waits in the listener's backlog.
    pub max_pending_hellos: usize,
}

impl Default for ShmLimits {
    /// 64 channels, 1 TiB mapped, 4096 mapped buffers, 32 pending hellos:
    /// room for many busy peers, far from what a process can hold (about
    /// 300 MiB of regions, 300 descriptors).
    fn default() -> ShmLimits {
        ShmLimits {
            max_channels: 64,
            max_mapped_bytes: 1 << 40,
            max_mapped_exports: 4096,
            max_pending_hellos: 32,
        }
    }
}

impl ShmLimits {
    /// Parses `channels=N,mapped=BYTES,exports=N,hellos=N` (any subset,
    /// in any order; `BYTES` may end in `K`, `M`, `G` or `T`, powers of
    /// 1024) over these limits.
    ///
    /// # Errors
    ///
    /// A message naming the item that is not `key=number` with a known
    /// key.
    ///
    /// # Examples
    ///
    /// ```
    /// use softverbs::soft::link::shm::ShmLimits;
    ///
    /// let l = ShmLimits::default().parse("channels=8,mapped=16G")?;
    /// assert_eq!((l.max_channels, l.max_mapped_bytes), (8, 16 << 30));
    /// # Ok::<(), String>(())
    /// ```
    pub fn parse(mut self, spec: &str) -> Result<ShmLimits, String> {
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || format!("shared-memory limit '{item}': expected channels|mapped|exports|hellos=NUMBER");
            let (key, value) = item.split_once('=').ok_or_else(bad)?;
            let value = value.trim();
            let (digits, shift) = match value.char_indices().last() {
                Some((i, 'K' | 'k')) => (&value[..i], 10),
                Some((i, 'M' | 'm')) => (&value[..i], 20),
                Some((i, 'G' | 'g')) => (&value[..i], 30),
                Some((i, 'T' | 't')) => (&value[..i], 40),
                _ => (value, 0),
            };
            let n = digits
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(1u64 << shift))
                .ok_or_else(bad)?;
            let count = || usize::try_from(n).map_err(|_| bad());
            match key.trim() {
                "channels" => self.max_channels = count()?,
                "mapped" => self.max_mapped_bytes = n,
                "exports" => self.max_mapped_exports = count()?,
                "hellos" => self.max_pending_hellos = count()?,
                _ => return Err(bad()),
            }
        }
        Ok(self)
    }
}

/// Environment variable: limits a link made from then on takes
/// ([`ShmLimits::parse`] over the defaults), e.g.
/// `SOFTVERBS_SHM_LIMITS=channels=16,mapped=64G`. Malformed: the
/// defaults, and a line on standard error.
pub const LIMITS_ENV: &str = "SOFTVERBS_SHM_LIMITS";

/// What a device's channels hold against its [`ShmLimits`], shared by the
/// link and its channels (which charge it for what they map).
#[derive(Debug)]
pub(super) struct Budget {
    pub(super) limits: Mutex<ShmLimits>,
    pub(super) mapped_bytes: AtomicU64,
    pub(super) mapped_exports: AtomicU64,
    /// Peers refused for a limit.
    pub(super) refused: AtomicU64,
    /// When the last refusal was logged ([`process_now`]; 0: never).
    pub(super) logged: AtomicU64,
    /// The device, for the log line (its first GID).
    pub(super) label: String,
}

/// How often a [`Budget`] logs a refusal at most.
pub(super) const LOG_EVERY_NS: Nanos = 1_000_000_000;

/// Whether a refusal at `now` is logged, the last one having been logged
/// at `last` (0: none yet).
pub(super) fn log_due(last: Nanos, now: Nanos) -> bool {
    last == 0 || now.saturating_sub(last) >= LOG_EVERY_NS
}

/// A share of a [`Budget`], given back when dropped.
#[derive(Debug)]
pub(super) struct Charge {
    pub(super) budget: Arc<Budget>,
    bytes: u64,
    exports: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.mapped_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        self.budget.mapped_exports.fetch_sub(self.exports, Ordering::Relaxed);
    }
}

impl Budget {
    pub(super) fn limits(&self) -> ShmLimits {
        *lock(&self.limits)
    }

    /// Takes `bytes` of mapped memory and `exports` mapped buffers if the
    /// limits allow both (`None`: they do not; nothing taken).
    pub(super) fn charge(self: &Arc<Self>, bytes: u64, exports: u64) -> Option<Charge> {
        let l = self.limits();
        let b = self.mapped_bytes.fetch_add(bytes, Ordering::Relaxed);
        let e = self.mapped_exports.fetch_add(exports, Ordering::Relaxed);
        let charge = Charge {
            budget: self.clone(),
            bytes,
            exports,
        };
        let fits = b.checked_add(bytes).is_some_and(|t| t <= l.max_mapped_bytes)
            && e.saturating_add(exports) <= l.max_mapped_exports as u64;
        // Dropping the charge gives it back.
        fits.then_some(charge)
    }

    /// Counts a peer refused for a limit and says `what` on standard
    /// error, in one line at most once a second.
    pub(super) fn refuse(&self, what: String) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = process_now().max(1);
        let last = self.logged.load(Ordering::Relaxed);
        if log_due(last, now)
            && self
                .logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            eprintln!(
                "softverbs: shared-memory link of {}: {what} (shm_refused_limit {n}; raise with {LIMITS_ENV} or ShmLink::set_limits)",
                self.label
            );
        }
    }
}
