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
    /// Connect again through another device when the connection's device
    /// is removed (active side only; `None`: the removal ends the
    /// connection).
    pub reconnect: Option<Reconnect>,
}

impl Default for ConnOptions {
    fn default() -> ConnOptions {
        ConnOptions {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_sge: 1,
            private_data: Vec::new(),
            reconnect: None,
        }
    }
}

/// The reconnection policy of an active [`Connection`]: when its device
/// is removed, once every WR in flight has completed (flushed), it
/// connects to the same peer again, from each of `sources` in turn (the
/// first that connects wins; empty: from the device the CM picks for the
/// peer), each attempt bounded by `timeout`. The peer sees a new
/// connection on its listener.
///
/// A new device means a new protection domain: memory registered with
/// the old [`Connection::pd`] must be registered again with the new one,
/// and remote keys exchanged again. [`Connection::poll`] returns
/// [`ConnectionError::Reconnected`] once to say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconnect {
    /// Local addresses to connect from, in order of preference.
    pub sources: Vec<IpAddr>,
    /// Bound on each attempt's resolution and handshake.
    pub timeout: Duration,
}

impl Default for Reconnect {
    fn default() -> Reconnect {
        Reconnect {
            sources: Vec::new(),
            timeout: Duration::from_secs(5),
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
    /// Not a failure: the device under the connection was removed, every
    /// WR posted before completed (flushed), and the connection was made
    /// again through another device ([`ConnOptions::reconnect`]). Register
    /// memory again with the new [`Connection::pd`]; posting works again.
    Reconnected,
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
            ConnectionError::Reconnected => write!(
                f,
                "the connection's device was removed and the connection made again through another device"
            ),
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
    /// Keeps the CM (and its agent) alive while the listener is.
    _cm: Cm,
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
            _cm: cm.clone(),
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
                    let Ok(session) = Connection::setup(id, chan, opts) else {
                        continue;
                    };
                    session.id.accept(&ConnParam {
                        private_data: opts.private_data.clone(),
                        ..ConnParam::default()
                    })?;
                    match Connection::wait_established(&session.chan, left)? {
                        true => return Ok(Some(Connection::new(session, None))),
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
    /// The id, its channel and the verbs objects: posting and polling use
    /// them inside the cell's gate (no lock); the end of the connection
    /// takes them away, and a reconnection puts new ones in.
    session: Gated<Session>,
    /// WRs posted and not yet returned by `poll`.
    inflight: AtomicU64,
    /// How the connection ended, as far as `poll` has seen; read without
    /// the lock by the fast path through `state`.
    ended: Mutex<Ending>,
    /// `ended`, for the fast path: [`OPEN`], [`PENDING_REMOVED`],
    /// [`PENDING_DISCONNECTED`] or [`RETURNED`].
    state: AtomicU8,
    /// How to connect again after a device removal (active side, with
    /// [`ConnOptions::reconnect`]).
    redial: Option<Redial>,
}

const OPEN: u8 = 0;
const PENDING_REMOVED: u8 = 1;
const PENDING_DISCONNECTED: u8 = 2;
const RETURNED: u8 = 3;

/// How long the end of a connection waits for other threads' posts and
/// polls on it to leave before it releases the verbs objects.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// One incarnation of a connection: its id, event channel and verbs
/// objects. Dropping it destroys the QP, then its CQ and PD, then the id
/// (which disconnects).
#[derive(Debug)]
struct Session {
    res: Res,
    id: CmId,
    chan: EventChannel,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.id.destroy_qp();
    }
}

#[derive(Debug)]
struct Res {
    qp: Arc<Qp>,
    cq: Cq,
    pd: Arc<Pd>,
}

/// What an active connection needs to connect again.
#[derive(Debug)]
struct Redial {
    cm: Cm,
    ns: NamespaceId,
    dst: SocketAddr,
    opts: ConnOptions,
    policy: Reconnect,
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
    /// With [`ConnOptions::reconnect`], the connection will connect again
    /// through another device should this one be removed.
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
        let session = Self::dial(cm, ns, src, dst, opts, timeout)?;
        let redial = opts.reconnect.clone().map(|policy| Redial {
            cm: cm.clone(),
            ns,
            dst,
            opts: opts.clone(),
            policy,
        });
        Ok(Connection::new(session, redial))
    }

    fn new(session: Session, redial: Option<Redial>) -> Connection {
        Connection {
            session: Gated::new(session),
            inflight: AtomicU64::new(0),
            ended: Mutex::new(Ending::Open),
            state: AtomicU8::new(OPEN),
            redial,
        }
    }

    /// Resolves, sets up and connects one session.
    fn dial(
        cm: &Cm,
        ns: NamespaceId,
        src: Option<IpAddr>,
        dst: SocketAddr,
        opts: &ConnOptions,
        timeout: Option<Duration>,
    ) -> std::result::Result<Session, ConnectionError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let left = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let chan = EventChannel::new()?;
        let id = cm.create_id_in(ns, &chan, PortSpace::Tcp, 0)?;
        id.resolve_addr(src, dst)?;
        Self::expect(&chan, CmEventKind::AddrResolved, left())?;
        id.resolve_route()?;
        Self::expect(&chan, CmEventKind::RouteResolved, left())?;
        let session = Self::setup(id, chan, opts)?;
        session.id.connect(&ConnParam {
            private_data: opts.private_data.clone(),
            ..ConnParam::default()
        })?;
        if Self::wait_established(&session.chan, left())? {
            Ok(session)
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

    fn setup(id: CmId, chan: EventChannel, opts: &ConnOptions) -> Result<Session> {
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
        Ok(Session {
            res: Res {
                qp,
                cq,
                pd: Arc::new(pd),
            },
            id,
            chan,
        })
    }

    /// `Ok(true)` once established, `Ok(false)` on timeout.
    fn wait_established(chan: &EventChannel, t: Option<Duration>) -> std::result::Result<bool, ConnectionError> {
        match chan.get_event(t)? {
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
    /// as the connection: a removal waits for it). After
    /// [`ConnectionError::Reconnected`] it is a new one, on the new
    /// device.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Closed`] once the connection ended.
    pub fn pd(&self) -> std::result::Result<Arc<Pd>, ConnectionError> {
        self.session.with(|s| s.res.pd.clone()).ok_or(ConnectionError::Closed)
    }

    /// The local address (`None` once the connection ended).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.session.with(|s| s.id.local_addr()).flatten()
    }

    /// The peer's address (`None` once the connection ended).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.session.with(|s| s.id.peer_addr()).flatten()
    }

    /// The device the connection runs on now, and its generation.
    pub fn device(&self) -> Option<(String, crate::subsystem::Generation)> {
        self.session.with(|s| s.id.device()).flatten()
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
        let r = self.session.with(|s| f(&s.res.qp));
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
    /// [`ConnectionError::Closed`]. With a reconnection policy, a removal
    /// ends instead, once the flushed WRs were returned, in one
    /// [`ConnectionError::Reconnected`] when the connection could be made
    /// again through another device; the connection then goes on.
    ///
    /// # Errors
    ///
    /// As above; [`ConnectionError::Verbs`] if polling itself failed.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> std::result::Result<usize, ConnectionError> {
        let n = match self.session.with(|s| s.res.cq.poll(wc)) {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(ConnectionError::Verbs(e)),
            None => return Err(ConnectionError::Closed),
        };
        if n > 0 {
            self.inflight.fetch_sub(n as u64, Ordering::Relaxed);
            if wc[..n].iter().all(|w| w.status == crate::verbs::WcStatus::Success) {
                return Ok(n);
            }
        }
        self.poll_events(n)
    }

    /// [`Connection::poll`] after no completion, or an error one (`n`
    /// completions were polled): the connection's events, and its end.
    /// Out of line, so that the fast path above stays a small function.
    #[cold]
    #[inline(never)]
    fn poll_events(&self, n: usize) -> std::result::Result<usize, ConnectionError> {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let events: Vec<CmEventKind> = self
            .session
            .with(|s| std::iter::from_fn(|| s.chan.try_get_event()).map(|e| e.kind).collect())
            .unwrap_or_default();
        for kind in events {
            match kind {
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
                // Let go of the device now: the removal need not wait.
                // (Other threads' posts and polls leave first; new ones
                // find the objects gone.)
                drop(self.session.take(RELEASE_WAIT));
                if let Some(session) = removed.then(|| self.redial()).flatten() {
                    let _ = self.session.put(session);
                    *ended = Ending::Open;
                    self.state.store(OPEN, Ordering::Relaxed);
                    return Err(ConnectionError::Reconnected);
                }
                *ended = Ending::Returned;
                self.state.store(RETURNED, Ordering::Relaxed);
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

    /// Connects again as the policy says, if the connection has one: from
    /// each of its sources in turn (or the device the CM picks).
    fn redial(&self) -> Option<Session> {
        let r = self.redial.as_ref()?;
        let sources: Vec<Option<IpAddr>> = match r.policy.sources.is_empty() {
            true => vec![None],
            false => r.policy.sources.iter().copied().map(Some).collect(),
        };
        sources
            .into_iter()
            .find_map(|src| Self::dial(&r.cm, r.ns, src, r.dst, &r.opts, Some(r.policy.timeout)).ok())
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
