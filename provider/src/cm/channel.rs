//! The event channel: a queue of [`CmEvent`]s with a file descriptor that
//! is readable while the queue is not empty (an `eventfd`), for `epoll`,
//! `mio` or `poll`, and a blocking [`EventChannel::get_event`].

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{CmEvent, Error, Result};

#[derive(Debug)]
pub(crate) struct ChannelInner {
    queue: Mutex<VecDeque<CmEvent>>,
    ready: Condvar,
    fd: OwnedFd,
}

impl ChannelInner {
    /// Queues an event and makes the descriptor readable.
    pub(crate) fn push(&self, ev: CmEvent) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(ev);
        if q.len() == 1 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a
            // full counter (EAGAIN) cannot happen with at most one pending
            // increment, and any error leaves the queue intact.
            unsafe {
                libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
        drop(q);
        self.ready.notify_all();
    }

    fn clear_fd(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking
        // eventfd; EAGAIN (already clear) is fine.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
}

/// Where a CM id's events go (`rdma_event_channel`). Cloning gives another
/// handle to the same channel.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use softverbs::cm::EventChannel;
///
/// let ch = EventChannel::new()?;
/// assert!(ch.try_get_event().is_none());
/// assert!(ch.get_event(Some(Duration::from_millis(1)))?.is_none());
/// # Ok::<(), softverbs::cm::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl EventChannel {
    /// A new channel.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the process cannot create an `eventfd`.
    pub fn new() -> Result<EventChannel> {
        let fd = crate::sys::eventfd(libc::EFD_NONBLOCK).map_err(|e| Error::Io(e.kind()))?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                queue: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                fd,
            }),
        })
    }

    /// The next event if one is queued (`rdma_get_cm_event` on a
    /// non-blocking channel).
    pub fn try_get_event(&self) -> Option<CmEvent> {
        let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
        let ev = q.pop_front();
        if q.is_empty() {
            self.inner.clear_fd();
        }
        ev
    }

    /// Waits up to `timeout` (`None`: forever) for the next event.
    /// `Ok(None)` when the time ran out.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for a channel closed under the
    /// caller.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(ev) = q.pop_front() {
                if q.is_empty() {
                    self.inner.clear_fd();
                }
                return Ok(Some(ev));
            }
            match deadline {
                None => q = self.inner.ready.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    q = self
                        .inner
                        .ready
                        .wait_timeout(q, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// How many events are queued.
    pub fn pending(&self) -> usize {
        self.inner.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The descriptor that is readable while an event is queued (level
    /// triggered; [`EventChannel::try_get_event`] clears it when it takes
    /// the last event). Register it with `epoll`/`mio` for reading.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}
