//! The connection manager: rdma_cm's semantics in Rust, over the device
//! subsystem, with the IBTA CM protocol on the wire between soft devices.
//!
//! - [`Cm`]: one connection manager per [`Subsystem`]. It hears of every
//!   device through a subsystem client, owns each soft device's QP1 (the
//!   GSI, see [`crate::soft::proto::gsi`]), and runs one agent thread for
//!   received MADs, retransmissions and time-wait.
//! - [`EventChannel`]: where an id's events go; a file descriptor for
//!   `epoll`/`mio` and a blocking [`EventChannel::get_event`].
//! - [`CmId`]: `rdma_cm_id`: [`CmId::bind_addr`], [`CmId::resolve_addr`],
//!   [`CmId::resolve_route`], [`CmId::listen`], [`CmId::connect`],
//!   [`CmId::accept`], [`CmId::reject`], [`CmId::disconnect`],
//!   [`CmId::create_qp`] (the QP follows the connection: INIT at creation,
//!   RTR and RTS at accept or on the REP, ERR at disconnect), in the TCP
//!   port space (RC, REQ/REP/RTU, DREQ/DREP) and the UDP one (UD, SIDR).
//!   [`CmId::init_qp_attr`] gives the attributes for an application
//!   that drives its own QP.
//! - [`mad`]: the CM MADs and rdma_cm's private-data header.
//! - [`socket`]: a sockets-like [`Listener`]/[`Connection`] on top, whose
//!   users can ignore hotplug.
//!
//! Hardware devices (feature `hardware`): there the kernel's rdma_cm owns
//! QP1, so an id whose address no soft device of its namespace has, in a
//! namespace with hardware devices, runs on librdmacm through `rdma-sys`:
//! the same calls and events (with namespace, device, generation and
//! listener), one librdmacm event channel and reader thread per `Cm`, the
//! QP created by the application on [`CmId::verbs`] (the subsystem's
//! device) and moved with `rdma_init_qp_attr`'s attributes. A wildcard
//! listener listens on librdmacm too when the namespace has hardware
//! devices. Without hardware devices the CM is exactly the soft one.
//!
//! Hotplug and namespaces: a listener bound to the wildcard address is not
//! tied to any device: a REQ arriving on any device of its namespace
//! reaches it (the kernel listens on each device for the same effect), so
//! devices can come and go under it unseen. An id bound to a device gets
//! [`CmEventKind::DeviceRemoval`] exactly once when the device goes (the
//! subsystem has then flushed its QP: every posted WR completed once), and
//! destroying it afterwards succeeds. Ids hold their namespace weakly:
//! deleting it gives each id there one `DeviceRemoval`. An id bound (or
//! connected) through an address that is removed from its device or moves
//! to another one gets [`CmEventKind::AddrChange`] once; the CM stops
//! resolving through the address there. Every event says its namespace,
//! device, the device's generation and its listener.
//!
//! # Examples
//!
//! A connection between two in-process soft devices:
//!
//! ```
//! use std::time::Duration;
//! use softverbs::cm::*;
//! use softverbs::soft::{link::inproc::InprocFabric, SoftDeviceConfig};
//! use softverbs::subsystem::{NamespaceId, SoftFactory, Subsystem, SubsystemConfig};
//! use softverbs::verbs::{QpCap, QpInitAttr, QpType};
//!
//! let sub = std::sync::Arc::new(Subsystem::new(SubsystemConfig::default()));
//! let fabric = InprocFabric::new();
//! for (name, ip) in [("doc_cm_a", "10.77.0.1"), ("doc_cm_b", "10.77.0.2")] {
//!     let cfg = SoftDeviceConfig { link: Some(fabric.clone()), ..SoftDeviceConfig::new(name, ip.parse().unwrap()) };
//!     sub.add_device(SoftFactory::new(cfg), NamespaceId::INIT)?;
//! }
//! let cm = Cm::new(sub.clone(), CmConfig::default())?;
//! let t = Some(Duration::from_secs(10));
//!
//! let server_ch = EventChannel::new()?;
//! let listener = cm.create_id(&server_ch, PortSpace::Tcp, 0)?;
//! listener.bind_addr("0.0.0.0:7471".parse().unwrap())?;
//! listener.listen(8)?;
//!
//! let ch = EventChannel::new()?;
//! let client = cm.create_id(&ch, PortSpace::Tcp, 1)?;
//! client.resolve_addr(Some("10.77.0.1".parse().unwrap()), "10.77.0.2:7471".parse().unwrap())?;
//! assert_eq!(ch.get_event(t)?.unwrap().kind, CmEventKind::AddrResolved);
//! client.resolve_route()?;
//! assert_eq!(ch.get_event(t)?.unwrap().kind, CmEventKind::RouteResolved);
//! let ctx = client.verbs()?;
//! let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, 0, None, 0)?);
//! let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
//! client.create_qp(&pd, &QpInitAttr { qp_type: QpType::Rc, send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })?;
//! client.connect(&ConnParam { private_data: b"hi".to_vec(), ..ConnParam::default() })?;
//!
//! let mut req = server_ch.get_event(t)?.unwrap();
//! assert_eq!(req.kind, CmEventKind::ConnectRequest);
//! assert_eq!(&req.private_data[..2], b"hi");
//! let child = req.take_id().unwrap();
//! let sctx = child.verbs()?;
//! let (spd, scq) = (sctx.alloc_pd()?, sctx.create_cq(16, 0, None, 0)?);
//! child.create_qp(&spd, &QpInitAttr { qp_type: QpType::Rc, send_cq: &scq, recv_cq: &scq, srq: None, cap, sq_sig_all: false })?;
//! child.accept(&ConnParam::default())?;
//! assert_eq!(ch.get_event(t)?.unwrap().kind, CmEventKind::Established);
//! assert_eq!(server_ch.get_event(t)?.unwrap().kind, CmEventKind::Established);
//! client.disconnect()?;
//! assert_eq!(ch.get_event(t)?.unwrap().kind, CmEventKind::Disconnected);
//! assert_eq!(server_ch.get_event(t)?.unwrap().kind, CmEventKind::Disconnected);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod agent;
mod channel;
#[cfg(feature = "hardware")]
mod hw;
#[cfg_attr(not(feature = "hardware"), allow(dead_code))]
mod hwmap;
mod id;
pub mod mad;
pub mod socket;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

pub use channel::EventChannel;
pub use id::CmId;
pub use socket::{ConnOptions, Connection, ConnectionError, Listener, Reconnect};

use crate::subsystem::{Generation, NamespaceId, Subsystem};
use crate::verbs::{AhAttr, Gid};

/// Errors of the connection manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The call is not valid in the id's state (`EINVAL`), e.g. `accept`
    /// on an id that got no request.
    InvalidState {
        /// The call.
        op: &'static str,
        /// The id's state.
        state: &'static str,
    },
    /// An argument is invalid (`EINVAL`).
    InvalidArgument(&'static str),
    /// Private data longer than the message carries (`EINVAL`).
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message allows.
        max: usize,
    },
    /// The address and port are taken in this namespace and port space
    /// (`EADDRINUSE`).
    AddrInUse(SocketAddr),
    /// No device in the id's namespace has or reaches that address
    /// (`EADDRNOTAVAIL` / `ENODEV`).
    NoDevice(IpAddr),
    /// The id's device was removed (`ENODEV`); destroying the id still
    /// succeeds.
    DeviceRemoved,
    /// The id's namespace was deleted (`ENODEV`).
    NamespaceGone,
    /// Not possible here (`EOPNOTSUPP`): e.g. a hardware device in a
    /// build without the `hardware` feature, or a librdmacm that lacks a
    /// call the hardware backend needs.
    Unsupported(&'static str),
    /// A verb failed.
    Verbs(crate::verbs::Error),
    /// A system call failed.
    Io(std::io::ErrorKind),
}

impl Error {
    /// The errno rdma_cm would return.
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidState { .. } | Error::InvalidArgument(_) | Error::PrivateDataTooLong { .. } => libc::EINVAL,
            Error::AddrInUse(_) => libc::EADDRINUSE,
            Error::NoDevice(_) => libc::EADDRNOTAVAIL,
            Error::DeviceRemoved | Error::NamespaceGone => libc::ENODEV,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Verbs(e) => e.errno(),
            Error::Io(_) => libc::EIO,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidState { op, state } => write!(f, "{op} is not valid in state {state}"),
            Error::InvalidArgument(a) => write!(f, "invalid argument: {a}"),
            Error::PrivateDataTooLong { len, max } => {
                write!(f, "{len} bytes of private data, the message carries {max}")
            }
            Error::AddrInUse(a) => write!(f, "{a} is in use"),
            Error::NoDevice(ip) => write!(f, "no device has or reaches {ip} in this namespace"),
            Error::DeviceRemoved => write!(f, "the id's device was removed"),
            Error::NamespaceGone => write!(f, "the id's namespace was deleted"),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::Verbs(e) => write!(f, "{e}"),
            Error::Io(k) => write!(f, "I/O error: {k}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::verbs::Error> for Error {
    fn from(e: crate::verbs::Error) -> Error {
        Error::Verbs(e)
    }
}

impl From<crate::subsystem::Error> for Error {
    fn from(e: crate::subsystem::Error) -> Error {
        Error::Verbs(crate::verbs::Error::new(
            crate::verbs::Verb::OpenDevice,
            crate::verbs::ErrorKind::from_errno(e.errno()),
            e.to_string(),
        ))
    }
}

/// Results of the connection manager.
pub type Result<T> = std::result::Result<T, Error>;

/// rdma_cm's port spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC QPs).
    Tcp,
    /// `RDMA_PS_UDP`: datagrams (UD QPs, SIDR).
    Udp,
}

impl PortSpace {
    /// The port space's number in service IDs.
    pub fn number(self) -> u16 {
        match self {
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
        }
    }

    fn from_number(n: u16) -> Option<PortSpace> {
        match n {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            _ => None,
        }
    }
}

/// The Q_Key rdma_cm gives UD QPs of the UDP port space.
pub const UDP_QKEY: u32 = 0x0123_4567;

/// What an event reports (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    /// `resolve_addr` finished.
    AddrResolved,
    /// `resolve_route` finished.
    RouteResolved,
    /// A request reached a listener; [`CmEvent::take_id`] gives the new id.
    ConnectRequest,
    /// The REP arrived on an id without a QP: call [`CmId::establish`].
    ConnectResponse,
    /// The connection could not be set up locally (e.g. the QP refused
    /// its new state); a REJ went to the peer.
    ConnectError,
    /// The peer did not answer (REQ, REP or SIDR_REQ retries ran out;
    /// status `-ETIMEDOUT`), or a SIDR request was refused.
    Unreachable,
    /// The peer rejected; `status` is the IBTA reason (8: nobody listens,
    /// 28: the consumer rejected) and `private_data` what it sent.
    Rejected,
    /// The connection is up (UD: the SIDR reply arrived).
    Established,
    /// The connection is down (DREQ or DREP); time-wait started.
    Disconnected,
    /// The id's device went away or its namespace was deleted: exactly once
    /// per id. Destroy the id.
    DeviceRemoval,
    /// The address the id is bound through moved to another device or was
    /// removed from its device (reported to the subsystem by a namespace
    /// driver, [`Subsystem::address_change`]): once per change and id. The
    /// id keeps its state; resolve again (a new id) to follow the address.
    AddrChange,
    /// Time-wait ended: the QP may be reused.
    TimewaitExit,
}

/// Connection parameters (`struct rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer (REQ 56, REP 196, REJ 148 bytes at most;
    /// UD: SIDR_REQ 180, SIDR_REP 136).
    pub private_data: Vec<u8>,
    /// RDMA READ/atomic requests the local side accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the local side issues at once.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7: forever).
    pub rnr_retry_count: u8,
    /// In events: the peer's QP number.
    pub qp_num: u32,
    /// Whether the QP uses an SRQ.
    pub srq: bool,
}

impl Default for ConnParam {
    fn default() -> ConnParam {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: 0,
            srq: false,
        }
    }
}

/// What a UD id learns from SIDR (`struct rdma_ud_param`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's QP number.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
    /// An address handle to the peer.
    pub ah_attr: AhAttr,
}

/// A connection manager event.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The id it is about (for `ConnectRequest`, the new id's number).
    pub id: u64,
    /// The `context` the id was created with (a new id inherits its
    /// listener's).
    pub context: u64,
    /// The listener the id belongs to (the listener itself for events on
    /// a listener, `None` for ids that never listened or came from one).
    pub listener: Option<u64>,
    /// `Rejected`: the IBTA reject reason; `Unreachable`: `-ETIMEDOUT`, or
    /// the SIDR status; 0 otherwise.
    pub status: i32,
    /// The peer's private data (for `ConnectRequest` without rdma_cm's
    /// header), zero-padded as the MAD carried it.
    pub private_data: Vec<u8>,
    /// `ConnectRequest`, `ConnectResponse`, `Established`: the peer's
    /// parameters.
    pub conn: Option<ConnParam>,
    /// UD `Established`, and `ConnectRequest` on a UDP listener.
    pub ud: Option<UdParam>,
    /// The namespace of the id.
    pub namespace: NamespaceId,
    /// The id's device, if it has one.
    pub device: Option<String>,
    /// That device's generation.
    pub generation: Option<Generation>,
    /// The peer's address and port, when known.
    pub peer: Option<SocketAddr>,
    pub(crate) new_id: Option<(u64, Weak<agent::Shared>)>,
}

impl CmEvent {
    /// `ConnectRequest`: the new id (once). An event dropped without its
    /// id taken rejects the request.
    pub fn take_id(&mut self) -> Option<CmId> {
        let (key, shared) = self.new_id.take()?;
        let shared = shared.upgrade()?;
        Some(CmId::from_parts(shared, key))
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        if let Some(id) = self.take_id() {
            let _ = id.reject(&[]);
        }
    }
}

/// Settings of a connection manager.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// CM response timeout, 4.096 µs × 2^n (rdma_cm: 20, ~4.3 s): how long
    /// a REQ, REP, DREQ or SIDR_REQ waits for its answer before it is sent
    /// again.
    pub response_timeout: u8,
    /// How often a message is sent again before the peer counts as
    /// unreachable (rdma_cm: 15).
    pub max_retries: u8,
    /// How long an id stays in time-wait after a disconnection.
    pub timewait: Duration,
    /// The consumer name under which ids open their devices.
    pub consumer: String,
    /// A fault injector for outgoing MADs (tests of loss, duplication and
    /// reordering); `None` in production.
    pub fault: Option<Arc<dyn MadFault>>,
}

impl Default for CmConfig {
    fn default() -> CmConfig {
        CmConfig {
            response_timeout: 20,
            max_retries: 15,
            timewait: Duration::from_secs(1),
            consumer: "softverbs-cm".into(),
            fault: None,
        }
    }
}

impl CmConfig {
    /// The response timeout as a duration.
    pub fn response_duration(&self) -> Duration {
        timeout_duration(self.response_timeout)
    }
}

/// 4.096 µs × 2^`exp` (IBTA's timeout encoding), capped at 2^31.
pub fn timeout_duration(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(31))
}

/// What a [`MadFault`] does with an outgoing MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Send it.
    Pass,
    /// Lose it.
    Drop,
    /// Send it twice.
    Duplicate,
    /// Hold it and send it after the next MAD this CM sends (reordering).
    Delay,
}

/// Decides the fate of each MAD a CM sends (for tests).
pub trait MadFault: Send + Sync + fmt::Debug {
    /// `msg` is about to go to `dst`.
    fn outgoing(&self, msg: &mad::CmMsg, dst: IpAddr) -> FaultAction;
}

/// Counters of a connection manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs received on QP1.
    pub rx_mads: u64,
    /// Received MADs dropped (not CM, unknown attribute, no matching id).
    pub rx_dropped: u64,
    /// MADs sent.
    pub tx_mads: u64,
    /// MADs sent again after a timeout.
    pub retransmits: u64,
    /// Duplicate REQs seen.
    pub dup_reqs: u64,
    /// REJs sent for stale connections.
    pub stale_rejects: u64,
    /// REQs dropped because the listener's backlog was full.
    pub backlog_drops: u64,
    /// MADs the fault injector dropped.
    pub fault_drops: u64,
}

/// A connection manager over a [`Subsystem`]. Cloning gives another handle.
///
/// # Examples
///
/// See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Cm {
    shared: Arc<agent::Shared>,
}

impl Cm {
    /// Starts a connection manager over `sub`: registers a client for
    /// every namespace (taking each soft device's QP1) and a CM hook, and
    /// starts the agent thread. Stops when the last handle, id and event
    /// are dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the agent's descriptor or thread cannot be made;
    /// a subsystem error if the client cannot register.
    pub fn new(sub: Arc<Subsystem>, config: CmConfig) -> Result<Cm> {
        Ok(Cm {
            shared: agent::Shared::start(sub, config)?,
        })
    }

    /// A new id in the initial namespace (`rdma_create_id`).
    ///
    /// # Errors
    ///
    /// None in practice; see [`Cm::create_id_in`].
    pub fn create_id(&self, channel: &EventChannel, ps: PortSpace, context: u64) -> Result<CmId> {
        self.create_id_in(NamespaceId::INIT, channel, ps, context)
    }

    /// A new id in namespace `ns`: its addresses resolve and its listens
    /// match among the devices of `ns`.
    ///
    /// # Errors
    ///
    /// [`Error::NamespaceGone`] if `ns` does not exist.
    pub fn create_id_in(&self, ns: NamespaceId, channel: &EventChannel, ps: PortSpace, context: u64) -> Result<CmId> {
        let weak = self
            .shared
            .inner
            .sub
            .namespace_ref(ns)
            .map_err(|_| Error::NamespaceGone)?;
        let key = self.shared.inner.create_id(weak, channel, ps, context);
        Ok(CmId::from_parts(self.shared.clone(), key))
    }

    /// Caps the path MTU of connections through device `name` at `mtu`
    /// (for a device whose link carries less than its port reports, such
    /// as a soft device on a 1500-byte Ethernet interface). Returns
    /// whether the CM has that device.
    pub fn limit_mtu(&self, name: &str, mtu: crate::verbs::Mtu) -> bool {
        let mut st = self.shared.inner.lock();
        match st.devices.get_mut(name) {
            Some(d) => {
                if mtu.as_raw() < d.mtu.as_raw() {
                    d.mtu = mtu;
                }
                true
            }
            None => false,
        }
    }

    /// The counters.
    pub fn counters(&self) -> CmCounters {
        self.shared.inner.counters()
    }

    /// How many ids exist (including destroyed ones still in time-wait).
    pub fn id_count(&self) -> usize {
        self.shared.inner.id_count()
    }

    /// Every id's number and state (including destroyed ones still in
    /// time-wait), sorted by number: for diagnostics.
    pub fn id_states(&self) -> Vec<(u64, &'static str)> {
        self.shared.inner.id_states()
    }

    /// The subsystem.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.shared.inner.sub
    }
}

/// The GID of an IP address (RoCEv2: IPv4-mapped IPv6).
pub(crate) fn gid_of(ip: IpAddr) -> Gid {
    Gid::from_ip(ip)
}
