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
//! The fast path costs one relaxed atomic add per post and per completion
//! polled (the in-flight count); the event channel is only looked at when
//! a poll finds no completion or an error completion.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Cm, CmEventKind, CmId, ConnParam, Error, EventChannel, PortSpace, Result};
use crate::subsystem::NamespaceId;
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
    res: Mutex<Option<Res>>,
    /// WRs posted and not yet returned by `poll`.
    inflight: AtomicU64,
    /// Set once the end was returned.
    ended: Mutex<Ending>,
}

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
            res: Mutex::new(Some(Res {
                qp,
                cq,
                pd: Arc::new(pd),
            })),
            inflight: AtomicU64::new(0),
            ended: Mutex::new(Ending::Open),
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
        let r = self.res.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().map(|r| r.pd.clone()).ok_or(ConnectionError::Closed)
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
        let qp = self.qp()?;
        match qp.post_send(wrs) {
            Ok(()) => {
                self.inflight.fetch_add(wrs.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.inflight.fetch_add(e.index as u64, Ordering::Relaxed);
                Err(ConnectionError::Post(e))
            }
        }
    }

    /// Posts receives.
    ///
    /// # Errors
    ///
    /// As [`Connection::post_send`].
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), ConnectionError> {
        let qp = self.qp()?;
        match qp.post_recv(wrs) {
            Ok(()) => {
                self.inflight.fetch_add(wrs.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.inflight.fetch_add(e.index as u64, Ordering::Relaxed);
                Err(ConnectionError::Post(e))
            }
        }
    }

    fn qp(&self) -> std::result::Result<Arc<Qp>, ConnectionError> {
        let ended = *self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended != Ending::Open {
            return Err(match ended {
                Ending::Pending(true) => ConnectionError::DeviceRemoved,
                Ending::Pending(false) => ConnectionError::Disconnected,
                _ => ConnectionError::Closed,
            });
        }
        let r = self.res.lock().unwrap_or_else(|p| p.into_inner());
        r.as_ref().map(|r| r.qp.clone()).ok_or(ConnectionError::Closed)
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
        let n = {
            let r = self.res.lock().unwrap_or_else(|p| p.into_inner());
            match r.as_ref() {
                Some(r) => r.cq.poll(wc).unwrap_or(0),
                None => return Err(ConnectionError::Closed),
            }
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
                CmEventKind::DeviceRemoval => *ended = Ending::Pending(true),
                CmEventKind::Disconnected if *ended == Ending::Open => {
                    *ended = Ending::Pending(false);
                }
                _ => {}
            }
        }
        if n > 0 {
            return Ok(n);
        }
        match *ended {
            Ending::Pending(removed) if self.inflight.load(Ordering::Relaxed) == 0 => {
                *ended = Ending::Returned;
                drop(ended);
                // Let go of the device now: the removal need not wait.
                self.id.destroy_qp();
                let res = self.res.lock().unwrap_or_else(|p| p.into_inner()).take();
                drop(res);
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
        let res = self.res.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(res);
    }
}
