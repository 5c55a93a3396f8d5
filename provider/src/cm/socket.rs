//! A sockets-like API over CM ids: [`Listener::bind`] and
//! [`Listener::accept`], [`Connection::connect`], posting and polling
//! work, and [`Connection::close`] — for applications that want a
//! connected RC QP and nothing else to think about.
//!
//! Hotplug is handled here, once, instead of in every application: a
//! listener bound to the wildcard address keeps accepting while devices
//! come and go; a connection whose device goes away (or whose peer
//! disconnects) keeps returning the completions of its work — every WR
//! posted completes exactly once, flushed if it could not run — and then
//! returns one [`ConnectionError::DeviceRemoved`] (or
//! [`ConnectionError::Disconnected`]) from [`Connection::poll`]; it then
//! releases its QP, CQ and PD itself so the removal does not wait for the
//! application. Later calls return [`ConnectionError::Closed`].
//!
//! The fast path takes no lock: a post or a poll enters the connection's
//! removal gate ([`Gated`]: an increment of the calling thread's own
//! counter) and adds to or subtracts from the in-flight count (one relaxed
//! atomic); the event channel is only looked at when a poll finds no
//! completion or an error completion. `benches/benches/cm.rs` measures it
//! against a raw id's QP and CQ.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use softverbs::cm::*;
//! use softverbs::soft::{link::inproc::InprocFabric, SoftDeviceConfig};
//! use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
//!
//! let sub = std::sync::Arc::new(Subsystem::new(SubsystemConfig::default()));
//! let fabric = InprocFabric::new();
//! for (name, ip) in [("doc_sock_a", "10.78.0.1"), ("doc_sock_b", "10.78.0.2")] {
//!     let cfg = SoftDeviceConfig { link: Some(fabric.clone()), ..SoftDeviceConfig::new(name, ip.parse().unwrap()) };
//!     sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT)?;
//! }
//! let cm = Cm::new(sub, CmConfig::default())?;
//! let listener = Listener::bind(&cm, NamespaceId::INIT, "0.0.0.0:9999".parse().unwrap(), 4)?;
//! let t = std::thread::spawn(move || listener.accept(&ConnOptions::default(), Some(Duration::from_secs(10))));
//! let conn = Connection::connect(&cm, NamespaceId::INIT, None, "10.78.0.2:9999".parse().unwrap(), &ConnOptions::default(), Some(Duration::from_secs(10)))?;
//! let server = t.join().unwrap()?.expect("a connection");
//! assert_eq!(server.peer_addr(), conn.local_addr());
//! conn.close();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Cm, CmEventKind, CmId, ConnParam, Error, EventChannel, PortSpace, Result};
use crate::subsystem::{Gated, NamespaceId};
use crate::verbs::{Cq, Pd, PostError, Qp, QpCap, QpInitAttr, QpType, RecvWr, SendWr, WorkCompletion};

/// Sizes of a connection's queues and its private data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnOptions {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// Private data for the peer (connect: 56 bytes, accept: 196).
    pub private_data: Vec<u8>,
}

impl Default for ConnOptions {
    fn default() -> ConnOptions {
        ConnOptions {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_sge: 1,
            private_data: Vec::new(),
        }
    }
}

/// How a connection ended, or why a call on it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionError {
    /// The device under the connection was removed (or its namespace
    /// deleted). Returned once, after every WR posted before it completed.
    DeviceRemoved,
    /// The peer disconnected. Returned once, likewise.
    Disconnected,
    /// The connection ended earlier (the error above was returned).
    Closed,
    /// Setting the connection up failed.
    Setup(Error),
    /// The peer rejected the connection (IBTA reason, private data).
    Rejected(u16, Vec<u8>),
    /// The peer did not answer.
    Unreachable,
    /// Posting failed (full queue, bad WR): nothing was lost, fix and
    /// retry.
    Post(PostError),
    /// Polling failed.
    Verbs(crate::verbs::Error),
}

impl std::fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectionError::DeviceRemoved => write!(f, "the connection's device was removed"),
            ConnectionError::Disconnected => write!(f, "the peer disconnected"),
            ConnectionError::Closed => write!(f, "the connection is closed"),
            ConnectionError::Setup(e) => write!(f, "connection setup failed: {e}"),
            ConnectionError::Rejected(r, _) => write!(f, "rejected by the peer (reason {r})"),
            ConnectionError::Unreachable => write!(f, "the peer did not answer"),
            ConnectionError::Post(e) => write!(f, "post failed: {e:?}"),
            ConnectionError::Verbs(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ConnectionError {}

impl From<Error> for ConnectionError {
    fn from(e: Error) -> ConnectionError {
        ConnectionError::Setup(e)
    }
}

/// A listening endpoint.
#[derive(Debug)]
pub struct Listener {
    cm: Cm,
    chan: EventChannel,
    id: CmId,
}

impl Listener {
    /// Listens on `addr` in namespace `ns` (the unspecified address: on
    /// every device of `ns`, present and future).
    ///
    /// # Errors
    ///
    /// As [`CmId::bind_addr`] and [`CmId::listen`].
    pub fn bind(cm: &Cm, ns: NamespaceId, addr: SocketAddr, backlog: u32) -> Result<Listener> {
        let chan = EventChannel::new()?;
        let id = cm.create_id_in(ns, &chan, PortSpace::Tcp, 0)?;
        id.bind_addr(addr)?;
        id.listen(backlog)?;
        Ok(Listener {
            cm: cm.clone(),
            chan,
            id,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Waits up to `timeout` for a request and accepts it. `Ok(None)` if
    /// the time ran out. A request whose setup fails is rejected and the
    /// wait goes on.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::DeviceRemoved`] if the listener was bound to a
    /// device's address and that device went away.
    pub fn accept(
        &self,
        opts: &ConnOptions,
        timeout: Option<Duration>,
    ) -> std::result::Result<Option<Connection>, ConnectionError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(None);
            }
            let Some(mut ev) = self.chan.get_event(left)? else {
                return Ok(None);
            };
            match ev.kind {
                CmEventKind::ConnectRequest => {
                    let Some(id) = ev.take_id() else { continue };
                    let chan = EventChannel::new()?;
                    id.migrate(&chan)?;
                    let Ok(conn) = Connection::setup(&self.cm, id, chan, opts) else {
                        continue;
                    };
                    conn.id.accept(&ConnParam {
                        private_data: opts.private_data.clone(),
                        ..ConnParam::default()
                    })?;
                    match conn.wait_established(left)? {
                        true => return Ok(Some(conn)),
                        false => continue,
                    }
                }
                CmEventKind::DeviceRemoval if ev.id == self.id.id() => return Err(ConnectionError::DeviceRemoved),
                _ => continue,
            }
        }
    }
}

/// A connected RC QP with its own PD and CQ (one CQ for sends and
/// receives).
#[derive(Debug)]
pub struct Connection {
    id: CmId,
    chan: EventChannel,
    /// The verbs objects: posting and polling use them inside the cell's
    /// gate (no lock); the end of the connection takes them away.
    res: Gated<Res>,
    /// WRs posted and not yet returned by `poll`.
    inflight: AtomicU64,
    /// How the connection ended, as far as `poll` has seen; read without
    /// the lock by the fast path through `state`.
    ended: Mutex<Ending>,
    /// `ended`, for the fast path: [`OPEN`], [`PENDING_REMOVED`],
    /// [`PENDING_DISCONNECTED`] or [`RETURNED`].
    state: AtomicU8,
}

const OPEN: u8 = 0;
const PENDING_REMOVED: u8 = 1;
const PENDING_DISCONNECTED: u8 = 2;
const RETURNED: u8 = 3;

/// How long the end of a connection waits for other threads' posts and
/// polls on it to leave before it releases the verbs objects.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Res {
    qp: Arc<Qp>,
    cq: Cq,
    pd: Arc<Pd>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Open,
    /// Seen, not yet returned.
    Pending(bool),
    Returned,
}

impl Ending {
    fn code(self) -> u8 {
        match self {
            Ending::Open => OPEN,
            Ending::Pending(true) => PENDING_REMOVED,
            Ending::Pending(false) => PENDING_DISCONNECTED,
            Ending::Returned => RETURNED,
        }
    }
}

impl Connection {
    /// Connects to `dst` from namespace `ns` (from `src`'s device, or the
    /// one the CM picks), waiting up to `timeout` for the whole handshake.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Setup`] for resolution or verbs failures,
    /// [`ConnectionError::Rejected`] / [`ConnectionError::Unreachable`] for
    /// the peer's answer; `Setup(Error::InvalidState)` on timeout.
    pub fn connect(
        cm: &Cm,
        ns: NamespaceId,
        src: Option<IpAddr>,
        dst: SocketAddr,
        opts: &ConnOptions,
        timeout: Option<Duration>,
    ) -> std::result::Result<Connection, ConnectionError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let left = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let chan = EventChannel::new()?;
        let id = cm.create_id_in(ns, &chan, PortSpace::Tcp, 0)?;
        id.resolve_addr(src, dst)?;
        Self::expect(&chan, CmEventKind::AddrResolved, left())?;
        id.resolve_route()?;
        Self::expect(&chan, CmEventKind::RouteResolved, left())?;
        let conn = Connection::setup(cm, id, chan, opts)?;
        conn.id.connect(&ConnParam {
            private_data: opts.private_data.clone(),
            ..ConnParam::default()
        })?;
        if conn.wait_established(left())? {
            Ok(conn)
        } else {
            Err(ConnectionError::Setup(Error::InvalidState {
                op: "connect",
                state: "timed out",
            }))
        }
    }

    fn expect(chan: &EventChannel, kind: CmEventKind, t: Option<Duration>) -> std::result::Result<(), ConnectionError> {
        match chan.get_event(t)? {
            Some(ev) if ev.kind == kind => Ok(()),
            Some(ev) if ev.kind == CmEventKind::DeviceRemoval => Err(ConnectionError::DeviceRemoved),
            _ => Err(ConnectionError::Setup(Error::InvalidState {
                op: "resolve",
                state: "no answer",
            })),
        }
    }

    fn setup(_cm: &Cm, id: CmId, chan: EventChannel, opts: &ConnOptions) -> Result<Connection> {
        let ctx = id.verbs()?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(opts.max_send_wr + opts.max_recv_wr, 0, None, 0)?;
        id.create_qp(
            &pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: opts.max_send_wr,
                    max_recv_wr: opts.max_recv_wr,
                    max_send_sge: opts.max_sge,
                    max_recv_sge: opts.max_sge,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            },
        )?;
        let qp = id.qp().ok_or(Error::InvalidArgument("no QP"))?;
        Ok(Connection {
            id,
            chan,
            res: Gated::new(Res {
                qp,
                cq,
                pd: Arc::new(pd),
            }),
            inflight: AtomicU64::new(0),
            ended: Mutex::new(Ending::Open),
            state: AtomicU8::new(OPEN),
        })
    }

    /// `Ok(true)` once established, `Ok(false)` on timeout.
    fn wait_established(&self, t: Option<Duration>) -> std::result::Result<bool, ConnectionError> {
        match self.chan.get_event(t)? {
            None => Ok(false),
            Some(ev) => match ev.kind {
                CmEventKind::Established => Ok(true),
                CmEventKind::Rejected => Err(ConnectionError::Rejected(ev.status as u16, ev.private_data.clone())),
                CmEventKind::Unreachable => Err(ConnectionError::Unreachable),
                CmEventKind::DeviceRemoval => Err(ConnectionError::DeviceRemoved),
                _ => Err(ConnectionError::Setup(Error::InvalidState {
                    op: "connect",
                    state: "unexpected event",
                })),
            },
        }
    }

    /// The protection domain to register memory in (keep it only as long
    /// as the connection: a removal waits for it).
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Closed`] once the connection ended.
    pub fn pd(&self) -> std::result::Result<Arc<Pd>, ConnectionError> {
        self.res.with(|r| r.pd.clone()).ok_or(ConnectionError::Closed)
    }

    /// The local address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.peer_addr()
    }

    /// Posts sends (every one is signaled: each completes exactly once in
    /// [`Connection::poll`]).
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Post`] as `ibv_post_send` (nothing posted from
    /// the failing WR on); the connection's end once it ended.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), ConnectionError> {
        self.post(wrs.len(), |qp| qp.post_send(wrs))
    }

    /// Posts receives.
    ///
    /// # Errors
    ///
    /// As [`Connection::post_send`].
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), ConnectionError> {
        self.post(wrs.len(), |qp| qp.post_recv(wrs))
    }

    /// Posts `n` WRs with `f` on the QP, counting what was posted.
    #[inline]
    fn post(
        &self,
        n: usize,
        f: impl FnOnce(&Qp) -> std::result::Result<(), PostError>,
    ) -> std::result::Result<(), ConnectionError> {
        let state = self.state.load(Ordering::Relaxed);
        if state != OPEN {
            return Err(Self::ended_error(state));
        }
        // Counted before they are posted, so that a poll on another thread
        // never sees their completions before the count (and never finds
        // the count at zero while they are in flight).
        self.inflight.fetch_add(n as u64, Ordering::Relaxed);
        let r = self.res.with(|r| f(&r.qp));
        match r {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => {
                self.inflight.fetch_sub((n - e.index) as u64, Ordering::Relaxed);
                Err(ConnectionError::Post(e))
            }
            None => {
                self.inflight.fetch_sub(n as u64, Ordering::Relaxed);
                Err(ConnectionError::Closed)
            }
        }
    }

    /// What a post returns once the connection is ending or ended.
    fn ended_error(state: u8) -> ConnectionError {
        match state {
            PENDING_REMOVED => ConnectionError::DeviceRemoved,
            PENDING_DISCONNECTED => ConnectionError::Disconnected,
            _ => ConnectionError::Closed,
        }
    }

    /// Polls completions into `wc`. After the device's removal or the
    /// peer's disconnection, completions (flushed ones included) keep
    /// coming until every posted WR has completed; then one
    /// [`ConnectionError::DeviceRemoved`] or
    /// [`ConnectionError::Disconnected`], then
    /// [`ConnectionError::Closed`].
    ///
    /// # Errors
    ///
    /// As above; [`ConnectionError::Verbs`] if polling itself failed.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> std::result::Result<usize, ConnectionError> {
        let n = match self.res.with(|r| r.cq.poll(wc)) {
            Some(n) => n.unwrap_or(0),
            None => return Err(ConnectionError::Closed),
        };
        if n > 0 {
            self.inflight.fetch_sub(n as u64, Ordering::Relaxed);
            if wc[..n].iter().all(|w| w.status == crate::verbs::WcStatus::Success) {
                return Ok(n);
            }
        }
        // No completion, or an error one: look at the connection's events.
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(ev) = self.chan.try_get_event() {
            match ev.kind {
                CmEventKind::DeviceRemoval if *ended != Ending::Returned => *ended = Ending::Pending(true),
                CmEventKind::Disconnected if *ended == Ending::Open => {
                    *ended = Ending::Pending(false);
                }
                _ => {}
            }
            self.state.store(ended.code(), Ordering::Relaxed);
        }
        if n > 0 {
            return Ok(n);
        }
        match *ended {
            Ending::Pending(removed) if self.inflight.load(Ordering::Relaxed) == 0 => {
                *ended = Ending::Returned;
                self.state.store(RETURNED, Ordering::Relaxed);
                drop(ended);
                // Let go of the device now: the removal need not wait.
                // (Other threads' posts and polls leave first; new ones
                // find the objects gone.)
                self.id.destroy_qp();
                drop(self.res.take(RELEASE_WAIT));
                Err(if removed {
                    ConnectionError::DeviceRemoved
                } else {
                    ConnectionError::Disconnected
                })
            }
            Ending::Returned => Err(ConnectionError::Closed),
            _ => Ok(0),
        }
    }

    /// How many posted WRs have not been returned by [`Connection::poll`].
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Closes the connection (DREQ to the peer, then time-wait inside the
    /// CM). Dropping it does the same.
    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The id's drop disconnects; the QP goes before its CQ and PD.
        self.id.destroy_qp();
        drop(self.res.take(Duration::ZERO));
    }
}
