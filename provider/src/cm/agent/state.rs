//! What the CM knows, under its one lock ([`State`]): every id and its
//! state, the devices it can use and their addresses, comm IDs and ports
//! in use, and the helpers that post an id's events and arm its timer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cm::channel::ChannelInner;
use crate::cm::mad::CmMsg;
use crate::cm::{gid_of, CmCounters, CmEvent, CmEventKind, ConnParam, PortSpace};
use crate::soft::engine::DeviceShared;
use crate::soft::proto::gsi::MAD_LEN;
use crate::subsystem::{DeviceRef, Generation, NamespaceId, WeakNamespace};
use crate::verbs::{Context, Mtu, Qp};

/// First port handed out to ids that bind port 0.
pub(super) const EPHEMERAL_FIRST: u16 = 32768;
/// Last such port.
const EPHEMERAL_LAST: u16 = 60999;

/// An id's state (rdma_cm's and the IBTA CM's, merged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdState {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active: REQ sent (MRA may have extended the wait).
    ReqSent,
    /// Active: REP came to an id without a QP; waiting for `establish`.
    RepRcvd,
    /// Passive: REQ delivered, waiting for accept/reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    TimeWait,
    /// After time-wait, a reject or an error: only destroy is left.
    Done,
    SidrReqSent,
    SidrReqRcvd,
    Removed,
}

impl IdState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            IdState::Idle => "IDLE",
            IdState::AddrBound => "ADDR_BOUND",
            IdState::AddrResolved => "ADDR_RESOLVED",
            IdState::RouteResolved => "ROUTE_RESOLVED",
            IdState::Listen => "LISTEN",
            IdState::ReqSent => "REQ_SENT",
            IdState::RepRcvd => "REP_RCVD",
            IdState::ReqRcvd => "REQ_RCVD",
            IdState::RepSent => "REP_SENT",
            IdState::Established => "ESTABLISHED",
            IdState::DreqSent => "DREQ_SENT",
            IdState::TimeWait => "TIMEWAIT",
            IdState::Done => "DONE",
            IdState::SidrReqSent => "SIDR_REQ_SENT",
            IdState::SidrReqRcvd => "SIDR_REQ_RCVD",
            IdState::Removed => "DEVICE_REMOVED",
        }
    }
}

/// A device this CM can use.
pub(crate) struct Dev {
    pub(crate) dref: DeviceRef,
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) guid: u64,
    pub(crate) mtu: Mtu,
    /// Inline engine on a network link: the agent reads its link.
    pub(crate) drive: bool,
}

impl Dev {
    pub(super) fn sgid_index(&self, ip: IpAddr) -> Option<u8> {
        let g = gid_of(ip);
        let soft = self.dref.soft_device()?;
        soft.gids().iter().position(|x| *x == g).map(|i| i as u8)
    }
}

/// A MAD to send once the state lock is released.
pub(crate) struct Out {
    pub(super) shared: Arc<DeviceShared>,
    pub(super) sgid: u8,
    pub(super) dst: IpAddr,
    pub(super) msg: CmMsg,
    pub(super) mad: [u8; MAD_LEN],
}

/// One id.
pub(crate) struct Id {
    pub(crate) context: u64,
    pub(crate) chan: Arc<ChannelInner>,
    pub(crate) ps: PortSpace,
    pub(crate) ns: WeakNamespace,
    pub(crate) state: IdState,
    /// Local address and port (port 0: none yet).
    pub(crate) src: Option<SocketAddr>,
    /// Remote address and port.
    pub(crate) dst: Option<SocketAddr>,
    /// The device (name, generation) the id is bound to.
    pub(crate) dev: Option<(String, Generation)>,
    /// The listener a passive id came from.
    pub(crate) listener: Option<u64>,
    pub(crate) backlog: u32,
    pub(crate) qp: Option<Arc<Qp>>,
    pub(crate) ctx: Option<Context>,
    pub(crate) local_comm_id: u32,
    pub(crate) remote_comm_id: u32,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_psn: u32,
    pub(crate) local_psn: u32,
    /// The peer's address on the wire (its GID).
    pub(crate) peer: Option<IpAddr>,
    pub(crate) mtu: Mtu,
    /// The parameters of the request (passive) or of `connect` (active).
    pub(crate) param: ConnParam,
    pub(crate) remote_qkey: u32,
    /// Retransmission: when, how many left, what.
    pub(crate) timer: Option<Instant>,
    pub(crate) retries_left: u8,
    pub(crate) last_sent: Option<CmMsg>,
    pub(crate) tid: u64,
    /// DEVICE_REMOVAL was delivered.
    pub(crate) removed: bool,
    /// The application destroyed it; it lingers for time-wait only.
    pub(crate) destroyed: bool,
    /// On a hardware device: the librdmacm id that does the work.
    #[cfg(feature = "hardware")]
    pub(crate) hw: Option<Arc<crate::cm::hw::HwId>>,
}

impl Id {
    pub(crate) fn new(ns: WeakNamespace, chan: Arc<ChannelInner>, ps: PortSpace, context: u64) -> Id {
        Id {
            context,
            chan,
            ps,
            ns,
            state: IdState::Idle,
            src: None,
            dst: None,
            dev: None,
            listener: None,
            backlog: 0,
            qp: None,
            ctx: None,
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: 0,
            remote_psn: 0,
            local_psn: 0,
            peer: None,
            mtu: Mtu::Mtu1024,
            param: ConnParam::default(),
            remote_qkey: 0,
            timer: None,
            retries_left: 0,
            last_sent: None,
            tid: 0,
            removed: false,
            destroyed: false,
            #[cfg(feature = "hardware")]
            hw: None,
        }
    }
}

/// Everything under the state lock.
pub(crate) struct State {
    pub(crate) ids: HashMap<u64, Id>,
    pub(crate) next_key: u64,
    pub(crate) devices: HashMap<String, Dev>,
    pub(crate) by_comm: HashMap<u32, u64>,
    pub(crate) rng: u64,
    pub(crate) next_port: u16,
    pub(crate) counters: CmCounters,
    /// A MAD the fault injector holds back (reordering).
    pub(crate) delayed: Option<Out>,
    /// The subsystem's hardware devices (their ids run on librdmacm).
    #[cfg(feature = "hardware")]
    pub(crate) hw_devices: HashMap<String, DeviceRef>,
    /// Ids forgotten under the lock ([`forget_id`]), dropped after it is
    /// released (the agent's `StateGuard`): an id holds its event
    /// channel, whose last reference drops the events still queued, and
    /// a connect request's event rejects its request when dropped, which
    /// takes this lock again.
    pub(crate) gone: Vec<Id>,
    /// While a received MAD or a due timer is handled, the events it
    /// raises are held here and posted after the MADs that handling owes
    /// the peer were sent ([`Inner::handled`]): an application may exit as
    /// soon as it sees an event (a DISCONNECTED, say), and a reply still
    /// queued in this process (the DREP) would then never leave. Only the
    /// handling thread's events are held: one raised meanwhile by another
    /// thread (a device removal, an address change, a verb's own event)
    /// is posted by that thread before it returns, as it would be at any
    /// other time, after those held for the same id.
    pub(crate) held: Option<(std::thread::ThreadId, Vec<(u64, CmEvent)>)>,
}

impl State {
    pub(crate) fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A fresh, nonzero local communication ID, registered for `key`.
    pub(crate) fn new_comm_id(&mut self, key: u64) -> u32 {
        loop {
            let c = self.random() as u32;
            if c != 0 && !self.by_comm.contains_key(&c) {
                self.by_comm.insert(c, key);
                return c;
            }
        }
    }

    /// Whether `addr` is free in `ns`/`ps` (a wildcard conflicts with
    /// everything on its port).
    pub(crate) fn port_free(&self, ns: NamespaceId, ps: PortSpace, addr: SocketAddr, except: u64) -> bool {
        !self.ids.iter().any(|(k, id)| {
            *k != except
                && !id.destroyed
                && id.ps == ps
                && id.ns.id() == ns
                && id.listener.is_none()
                && id.src.is_some_and(|s| {
                    s.port() == addr.port()
                        && (s.ip() == addr.ip() || s.ip().is_unspecified() || addr.ip().is_unspecified())
                })
        })
    }

    /// An unused ephemeral port in `ns`/`ps` for `ip`.
    pub(crate) fn ephemeral(&mut self, ns: NamespaceId, ps: PortSpace, ip: IpAddr, except: u64) -> Option<u16> {
        for _ in 0..=(EPHEMERAL_LAST - EPHEMERAL_FIRST) {
            let p = self.next_port;
            self.next_port = if p >= EPHEMERAL_LAST { EPHEMERAL_FIRST } else { p + 1 };
            if self.port_free(ns, ps, SocketAddr::new(ip, p), except) {
                return Some(p);
            }
        }
        None
    }

    pub(super) fn dev_of(&self, id: &Id) -> Option<&Dev> {
        let (name, gen) = id.dev.as_ref()?;
        self.devices.get(name).filter(|d| d.dref.generation() == *gen)
    }

    /// Builds a MAD to the id's peer from its device.
    pub(crate) fn out_for(&self, key: u64, msg: CmMsg) -> Option<Out> {
        let id = self.ids.get(&key)?;
        let dev = self.dev_of(id)?;
        let src = id.src?.ip();
        let peer = id.peer?;
        let sgid = dev.sgid_index(src)?;
        Some(Out {
            shared: dev.shared.clone(),
            sgid,
            dst: peer,
            mad: msg.encode(id.tid),
            msg,
        })
    }

    /// An event about id `key`.
    pub(crate) fn event(&self, key: u64, kind: CmEventKind) -> Option<CmEvent> {
        let id = self.ids.get(&key)?;
        Some(CmEvent {
            kind,
            id: key,
            context: id.context,
            listener: if id.state == IdState::Listen {
                Some(key)
            } else {
                id.listener
            },
            status: 0,
            private_data: Vec::new(),
            conn: None,
            ud: None,
            namespace: id.ns.id(),
            device: id.dev.as_ref().map(|d| d.0.clone()),
            generation: id.dev.as_ref().map(|d| d.1),
            peer: id.dst,
            new_id: None,
        })
    }

    pub(crate) fn post(&mut self, key: u64, ev: CmEvent) {
        let mut earlier = Vec::new();
        if let Some((holder, held)) = &mut self.held {
            if *holder == std::thread::current().id() {
                held.push((key, ev));
                return;
            }
            // Another thread's event. What the agent already raised for
            // the same id goes first: an id's events keep their order.
            if held.iter().any(|(k, _)| *k == key) {
                let rest;
                (earlier, rest) = std::mem::take(held).into_iter().partition(|(k, _)| *k == key);
                *held = rest;
            }
        }
        for (_, e) in earlier {
            self.deliver(key, e);
        }
        self.deliver(key, ev);
    }

    /// Puts `ev` on id `key`'s channel, or drops it if nobody is there.
    fn deliver(&mut self, key: u64, ev: CmEvent) {
        if let Some(id) = self.ids.get(&key) {
            if !id.destroyed {
                id.chan.push(ev);
                return;
            }
        }
        // Nobody to tell (a destroyed id). An event carrying a new id
        // would reject it in its drop, which takes the state lock held
        // here: forget the id instead (the listener is gone, so no such
        // event is ever made; this is a guard) and drop the rest.
        let mut ev = ev;
        ev.new_id = None;
        drop(ev);
    }

    pub(crate) fn post_kind(&mut self, key: u64, kind: CmEventKind) {
        if let Some(ev) = self.event(key, kind) {
            self.post(key, ev);
        }
    }

    /// Arms the id's retransmission timer for `msg`, already sent once.
    pub(crate) fn arm(&mut self, key: u64, msg: CmMsg, wait: Duration, retries: u8) {
        if let Some(id) = self.ids.get_mut(&key) {
            id.last_sent = Some(msg);
            id.timer = Some(Instant::now() + wait);
            id.retries_left = retries;
        }
    }
}
pub(crate) fn enter_timewait(st: &mut State, key: u64, wait: Duration) {
    if let Some(id) = st.ids.get_mut(&key) {
        id.state = IdState::TimeWait;
        id.timer = Some(Instant::now() + wait);
        id.retries_left = 0;
    }
}

/// Forgets a destroyed id that has nothing left to wait for; it is
/// dropped once the lock is released ([`State::gone`]).
pub(crate) fn forget_id(st: &mut State, key: u64) {
    if let Some(id) = st.ids.remove(&key) {
        st.by_comm.remove(&id.local_comm_id);
        st.gone.push(id);
    }
}
