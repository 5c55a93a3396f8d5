//! [`CmId`]: the application's handle on one communication identifier.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::agent::{self, connect_qp, init_qp, qp_to_err, rtu, st_sgid, IdState, Shared, State};
use super::mad::{self, CmMsg, CmaHdr, Ids, MsgRef};
use super::{gid_of, CmEventKind, ConnParam, Error, PortSpace, Result, UDP_QKEY};
use crate::subsystem::{Generation, NamespaceId};
use crate::verbs::{Context, Pd, Qp, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType};

/// A communication identifier (`struct rdma_cm_id`). Dropping it destroys
/// it (`rdma_destroy_id`): an established connection is disconnected
/// (DREQ) and lingers in time-wait inside the CM; a pending request is
/// rejected.
#[derive(Debug)]
pub struct CmId {
    shared: Arc<Shared>,
    key: u64,
}

fn check_pd(pd: &[u8], max: usize) -> Result<()> {
    if pd.len() > max {
        return Err(Error::PrivateDataTooLong { len: pd.len(), max });
    }
    Ok(())
}

fn bad(op: &'static str, state: IdState) -> Error {
    Error::InvalidState {
        op,
        state: state.name(),
    }
}

impl CmId {
    pub(crate) fn from_parts(shared: Arc<Shared>, key: u64) -> CmId {
        CmId { shared, key }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State, u64) -> Result<R>) -> Result<R> {
        let mut st = self.shared.inner.lock();
        f(&mut st, self.key)
    }

    fn check_alive(st: &State, key: u64) -> Result<()> {
        let id = st.ids.get(&key).ok_or(Error::InvalidArgument("destroyed id"))?;
        if id.removed {
            return Err(if id.ns.is_alive() {
                Error::DeviceRemoved
            } else {
                Error::NamespaceGone
            });
        }
        Ok(())
    }

    /// The id's librdmacm id, if it runs on a hardware device.
    #[cfg(feature = "hardware")]
    fn hw(&self) -> Option<Arc<super::hw::HwId>> {
        self.with(|st, k| Ok(super::hw::hw_of(st, k))).ok().flatten()
    }

    /// Whether address work for `local` (else `dst`) goes to librdmacm: no
    /// soft device of the id's namespace has that address and the
    /// namespace has a hardware device. Soft devices answer first, so a
    /// subsystem without hardware devices behaves as a soft-only CM.
    #[cfg(feature = "hardware")]
    fn goes_to_hw(&self, local: Option<IpAddr>, dst: Option<IpAddr>) -> bool {
        let shared_mode = self.shared.inner.sub.mode() == crate::subsystem::NetnsMode::Shared;
        self.with(|st, k| {
            let ns = st.ids.get(&k).map_or(NamespaceId::INIT, |i| i.ns.id());
            if !super::hw::has_hw(st, ns, shared_mode) {
                return Ok(false);
            }
            Ok(match local.or(dst) {
                Some(ip) => st.device_with(ns, ip, shared_mode).is_none(),
                None => false,
            })
        })
        .unwrap_or(false)
    }

    /// The id's number (what events call `id`).
    pub fn id(&self) -> u64 {
        self.key
    }

    /// The context value given at creation (or the listener's).
    pub fn context(&self) -> u64 {
        self.with(|st, k| Ok(st.ids.get(&k).map_or(0, |i| i.context)))
            .unwrap_or(0)
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.with(|st, k| Ok(st.ids.get(&k).map_or(PortSpace::Tcp, |i| i.ps)))
            .unwrap_or(PortSpace::Tcp)
    }

    /// The id's namespace.
    pub fn namespace(&self) -> NamespaceId {
        self.with(|st, k| Ok(st.ids.get(&k).map_or(NamespaceId::INIT, |i| i.ns.id())))
            .unwrap_or(NamespaceId::INIT)
    }

    /// The device (name and generation) the id is bound to.
    pub fn device(&self) -> Option<(String, Generation)> {
        self.with(|st, k| Ok(st.ids.get(&k).and_then(|i| i.dev.clone())))
            .ok()
            .flatten()
    }

    /// The local address and port.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.with(|st, k| Ok(st.ids.get(&k).and_then(|i| i.src))).ok().flatten()
    }

    /// The remote address and port.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.with(|st, k| Ok(st.ids.get(&k).and_then(|i| i.dst))).ok().flatten()
    }

    /// What a QP of this connection needs for RTR and RTS, once the peer
    /// answered: `(peer QPN, peer's first PSN = our rq_psn, our sq_psn)`.
    /// `None` on ids of hardware devices, where librdmacm keeps the PSNs:
    /// [`CmId::init_qp_attr`] gives the whole attributes on both backends.
    pub fn path(&self) -> Option<(u32, u32, u32)> {
        self.with(|st, k| {
            Ok(st
                .ids
                .get(&k)
                .filter(|i| i.remote_qpn != 0 && !is_hw(i))
                .map(|i| (i.remote_qpn, i.remote_psn, i.local_psn)))
        })
        .ok()
        .flatten()
    }

    /// The id's state, by rdma_cm's name (`ESTABLISHED`, `LISTEN`, …).
    pub fn state(&self) -> &'static str {
        self.with(|st, k| Ok(st.ids.get(&k).map_or("DESTROYED", |i| i.state.name())))
            .unwrap_or("DESTROYED")
    }

    /// Binds a local address and port (`rdma_bind_addr`). Port 0 picks an
    /// ephemeral port; the unspecified address binds no device (a wildcard
    /// listener); a specific address binds the device that has it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the id is idle;
    /// [`Error::AddrInUse`] if the address and port are taken in the
    /// namespace and port space; [`Error::NoDevice`] if no device of the
    /// namespace has the address.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let shared_mode = self.shared.inner.sub.mode() == crate::subsystem::NetnsMode::Shared;
        #[cfg(feature = "hardware")]
        if !addr.ip().is_unspecified() && self.goes_to_hw(Some(addr.ip()), None) {
            self.with(|st, k| {
                Self::check_alive(st, k)?;
                match st.ids[&k].state {
                    IdState::Idle => Ok(()),
                    s => Err(bad("bind_addr", s)),
                }
            })?;
            return super::hw::bind_addr(&self.shared.inner, self.key, addr);
        }
        self.with(|st, k| {
            Self::check_alive(st, k)?;
            let (state, ns, ps) = {
                let id = &st.ids[&k];
                (id.state, id.ns.id(), id.ps)
            };
            if state != IdState::Idle {
                return Err(bad("bind_addr", state));
            }
            let dev = if addr.ip().is_unspecified() {
                None
            } else {
                Some(
                    st.device_with(ns, addr.ip(), shared_mode)
                        .ok_or(Error::NoDevice(addr.ip()))?,
                )
            };
            let port = if addr.port() == 0 {
                st.ephemeral(ns, ps, addr.ip(), k).ok_or(Error::AddrInUse(addr))?
            } else if st.port_free(ns, ps, addr, k) {
                addr.port()
            } else {
                return Err(Error::AddrInUse(addr));
            };
            let id = st.ids.get_mut(&k).expect("alive");
            id.src = Some(SocketAddr::new(addr.ip(), port));
            id.dev = dev;
            id.state = IdState::AddrBound;
            Ok(())
        })
    }

    /// Resolves `dst` to a local device, port and GID in the id's
    /// namespace (`rdma_resolve_addr`): with `src`, the device that has
    /// `src`; else the id's bound device, else the device that has `dst`
    /// (loopback), else the first device of the namespace with an address
    /// of `dst`'s family. Queues [`CmEventKind::AddrResolved`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] after `listen` or `connect`;
    /// [`Error::NoDevice`] if no device fits; [`Error::AddrInUse`] if no
    /// ephemeral port is left.
    pub fn resolve_addr(&self, src: Option<IpAddr>, dst: SocketAddr) -> Result<()> {
        let shared_mode = self.shared.inner.sub.mode() == crate::subsystem::NetnsMode::Shared;
        #[cfg(feature = "hardware")]
        {
            let (state, bound) = self.with(|st, k| {
                Self::check_alive(st, k)?;
                let id = &st.ids[&k];
                Ok((id.state, id.src.map(|b| b.ip()).filter(|ip| !ip.is_unspecified())))
            })?;
            if self.hw().is_some() || self.goes_to_hw(src.or(bound), Some(dst.ip())) {
                if !matches!(
                    state,
                    IdState::Idle | IdState::AddrBound | IdState::AddrResolved | IdState::RouteResolved
                ) {
                    return Err(bad("resolve_addr", state));
                }
                return super::hw::resolve_addr(&self.shared.inner, self.key, src, dst);
            }
        }
        self.with(|st, k| {
            Self::check_alive(st, k)?;
            let (state, ns, ps, bound) = {
                let id = &st.ids[&k];
                (id.state, id.ns.id(), id.ps, id.src)
            };
            if !matches!(
                state,
                IdState::Idle | IdState::AddrBound | IdState::AddrResolved | IdState::RouteResolved
            ) {
                return Err(bad("resolve_addr", state));
            }
            let want = src.or(bound.map(|b| b.ip()).filter(|ip| !ip.is_unspecified()));
            let (name, gen, ip) = match want {
                Some(ip) => {
                    let (n, g) = st.device_with(ns, ip, shared_mode).ok_or(Error::NoDevice(ip))?;
                    (n, g, ip)
                }
                None => st
                    .pick_device(ns, dst.ip(), shared_mode)
                    .ok_or(Error::NoDevice(dst.ip()))?,
            };
            let port = match bound.map(|b| b.port()) {
                Some(p) if p != 0 => p,
                _ => st
                    .ephemeral(ns, ps, ip, k)
                    .ok_or(Error::AddrInUse(SocketAddr::new(ip, 0)))?,
            };
            let id = st.ids.get_mut(&k).expect("alive");
            id.src = Some(SocketAddr::new(ip, port));
            id.dst = Some(dst);
            id.peer = Some(dst.ip());
            id.dev = Some((name, gen));
            id.state = IdState::AddrResolved;
            st.post_kind(k, CmEventKind::AddrResolved);
            Ok(())
        })
    }

    /// Resolves the route to the peer (`rdma_resolve_route`): on RoCEv2
    /// the path is the GIDs, the path MTU is the device's active MTU
    /// (lowered to the peer's in the handshake). Queues
    /// [`CmEventKind::RouteResolved`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the address is resolved;
    /// [`Error::DeviceRemoved`] if the device went away.
    pub fn resolve_route(&self) -> Result<()> {
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            self.with(|st, k| {
                Self::check_alive(st, k)?;
                match st.ids[&k].state {
                    IdState::AddrResolved | IdState::RouteResolved => Ok(()),
                    s => Err(bad("resolve_route", s)),
                }
            })?;
            return super::hw::resolve_route(&h);
        }
        self.with(|st, k| {
            Self::check_alive(st, k)?;
            let state = st.ids[&k].state;
            if !matches!(state, IdState::AddrResolved | IdState::RouteResolved) {
                return Err(bad("resolve_route", state));
            }
            let mtu = {
                let (name, _) = st.ids[&k].dev.clone().ok_or(Error::DeviceRemoved)?;
                st.devices.get(&name).ok_or(Error::DeviceRemoved)?.mtu
            };
            let id = st.ids.get_mut(&k).expect("alive");
            id.mtu = mtu;
            id.state = IdState::RouteResolved;
            st.post_kind(k, CmEventKind::RouteResolved);
            Ok(())
        })
    }

    /// Listens for requests (`rdma_listen`), at most `backlog` of them
    /// unanswered at once (more are dropped; their senders retry). An id
    /// bound to the unspecified address listens on every device of its
    /// namespace, present and future; an unbound id is bound to the
    /// wildcard address and an ephemeral port first.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the id is idle or bound;
    /// [`Error::AddrInUse`] as for [`CmId::bind_addr`].
    pub fn listen(&self, backlog: u32) -> Result<()> {
        let state = self.with(|st, k| {
            Self::check_alive(st, k)?;
            Ok(st.ids[&k].state)
        })?;
        if state == IdState::Idle {
            self.bind_addr(SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0))?;
        }
        self.with(|st, k| {
            let id = st.ids.get_mut(&k).expect("alive");
            if id.state != IdState::AddrBound {
                return Err(bad("listen", id.state));
            }
            id.state = IdState::Listen;
            id.backlog = backlog.max(1);
            Ok(())
        })?;
        // On librdmacm too: an id bound to a hardware device's address, or
        // a wildcard listener in a namespace with hardware devices.
        #[cfg(feature = "hardware")]
        {
            let wildcard = self.local_addr().is_some_and(|a| a.ip().is_unspecified());
            if self.hw().is_some()
                || (wildcard && self.goes_to_hw(None, Some(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))))
            {
                if let Err(e) = super::hw::listen(&self.shared.inner, self.key, backlog.max(1)) {
                    let _ = self.with(|st, k| {
                        if let Some(id) = st.ids.get_mut(&k) {
                            id.state = IdState::AddrBound;
                        }
                        Ok(())
                    });
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The verbs context of the id's device, opened once through the
    /// subsystem (so hotplug removal flushes what is created on it):
    /// allocate the PD and CQs of [`CmId::create_qp`] from it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] before the id has a device;
    /// [`Error::DeviceRemoved`] if it went away.
    pub fn verbs(&self) -> Result<Context> {
        self.context_handle()
    }

    /// Alias of [`CmId::verbs`].
    ///
    /// # Errors
    ///
    /// As [`CmId::verbs`].
    pub fn context_handle(&self) -> Result<Context> {
        let consumer = self.shared.inner.cfg.consumer.clone();
        self.with(|st, k| {
            Self::check_alive(st, k)?;
            let id = &st.ids[&k];
            if let Some(c) = &id.ctx {
                return Ok(Context::from_ops(c.ops().clone()));
            }
            #[cfg(feature = "hardware")]
            if id.dev.is_none() && id.hw.is_some() && matches!(id.state, IdState::AddrResolved | IdState::RouteResolved)
            {
                return Err(Error::Unsupported(
                    "librdmacm resolved to a device that is not under the CM's subsystem",
                ));
            }
            let (name, gen) = id.dev.clone().ok_or_else(|| bad("verbs", id.state))?;
            let dref = st.devices.get(&name).map(|d| &d.dref);
            #[cfg(feature = "hardware")]
            let dref = dref.or_else(|| st.hw_devices.get(&name));
            let dref = dref.filter(|d| d.generation() == gen).ok_or(Error::DeviceRemoved)?;
            let ctx = dref.open(&consumer)?;
            let out = Context::from_ops(ctx.ops().clone());
            st.ids.get_mut(&k).expect("alive").ctx = Some(ctx);
            Ok(out)
        })
    }

    /// Creates the id's QP on `pd` (`rdma_create_qp`) and moves it as
    /// rdma_cm does: an RC QP to INIT (RTR and RTS follow at accept or on
    /// the REP), a UD QP to RTS with rdma_cm's Q_Key ([`UDP_QKEY`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] if the id has a QP or no device; the verbs
    /// error of creation or modification (the QP is then destroyed); a
    /// QP type that does not fit the port space is
    /// [`Error::InvalidArgument`].
    pub fn create_qp(&self, pd: &Pd, init: &QpInitAttr<'_>) -> Result<()> {
        let ps = self.with(|st, k| {
            Self::check_alive(st, k)?;
            let id = &st.ids[&k];
            if id.qp.is_some() || id.dev.is_none() {
                return Err(bad("create_qp", id.state));
            }
            Ok(id.ps)
        })?;
        let fits = matches!(
            (ps, init.qp_type),
            (PortSpace::Tcp, QpType::Rc) | (PortSpace::Tcp, QpType::Uc) | (PortSpace::Udp, QpType::Ud)
        );
        if !fits {
            return Err(Error::InvalidArgument("QP type does not fit the port space"));
        }
        let qp = pd.create_qp(init)?;
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            super::hw::init_qp(&h, &qp)?;
            return self.with(|st, k| {
                let id = st.ids.get_mut(&k).ok_or(Error::InvalidArgument("destroyed id"))?;
                id.qp = Some(Arc::new(qp));
                Ok(())
            });
        }
        init_qp(&qp)?;
        self.with(|st, k| {
            let id = st.ids.get_mut(&k).ok_or(Error::InvalidArgument("destroyed id"))?;
            id.qp = Some(Arc::new(qp));
            Ok(())
        })
    }

    /// The attributes and mask that move a QP of this id to `state`
    /// (`rdma_init_qp_attr`), for an application that drives its own QP
    /// (connected with [`ConnParam::qp_num`]): INIT at any time once the
    /// id has a device; RTR and RTS once the peer answered (the
    /// `ConnectResponse` on the active side, then [`CmId::establish`]) or,
    /// on the passive side, once the request came (before
    /// [`CmId::accept`] with [`ConnParam::qp_num`]). On
    /// hardware devices librdmacm computes them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a state other than INIT, RTR, RTS;
    /// [`Error::InvalidState`] before the id has a device or (RTR, RTS, TCP
    /// port space) before the peer's answer; librdmacm's error.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        if !matches!(state, QpState::Init | QpState::Rtr | QpState::Rts) {
            return Err(Error::InvalidArgument("rdma_init_qp_attr covers INIT, RTR and RTS"));
        }
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            self.with(|st, k| Self::check_alive(st, k))?;
            return super::hw::init_qp_attr(&h, state);
        }
        self.with(|st, k| {
            Self::check_alive(st, k)?;
            let id = &st.ids[&k];
            if id.dev.is_none() {
                return Err(bad("init_qp_attr", id.state));
            }
            let t = match id.ps {
                PortSpace::Tcp => QpType::Rc,
                PortSpace::Udp => QpType::Ud,
            };
            Ok(match (state, id.ps) {
                (QpState::Init, _) => agent::init_attr(t),
                (QpState::Rtr, PortSpace::Udp) => (
                    QpAttr {
                        qp_state: QpState::Rtr,
                        ..QpAttr::default()
                    },
                    QpAttrMask::STATE,
                ),
                (_, PortSpace::Udp) => (
                    QpAttr {
                        qp_state: QpState::Rts,
                        sq_psn: 0,
                        ..QpAttr::default()
                    },
                    QpAttrMask::STATE | QpAttrMask::SQ_PSN,
                ),
                // The PSNs are known once the REP came (active) or the
                // REQ did (passive: its own PSN is chosen then).
                (_, PortSpace::Tcp)
                    if !matches!(
                        id.state,
                        IdState::ReqRcvd | IdState::RepRcvd | IdState::RepSent | IdState::Established
                    ) =>
                {
                    return Err(bad("init_qp_attr before the peer's answer", id.state));
                }
                (QpState::Rtr, PortSpace::Tcp) => agent::rtr_attr(id, st_sgid(&st.devices, id)),
                (_, PortSpace::Tcp) => agent::rts_attr(id),
            })
        })
    }

    /// Gives the id a QP made elsewhere (a C library's `rdma_create_qp`,
    /// which creates the QP with its own objects) and moves it as
    /// [`CmId::create_qp`] does. The id keeps a second handle on that QP,
    /// drives its states, and drops the handle with the id or at
    /// [`CmId::destroy_qp`] (which destroys the QP, if its maker has not;
    /// destroying twice is harmless). On error the QP is left as it was.
    ///
    /// # Errors
    ///
    /// As [`CmId::create_qp`], except creation.
    pub fn attach_qp(&self, qp: &Qp) -> Result<()> {
        let ps = self.with(|st, k| {
            Self::check_alive(st, k)?;
            let id = &st.ids[&k];
            if id.qp.is_some() || id.dev.is_none() {
                return Err(bad("attach_qp", id.state));
            }
            Ok(id.ps)
        })?;
        let fits = matches!(
            (ps, qp.qp_type()),
            (PortSpace::Tcp, QpType::Rc) | (PortSpace::Tcp, QpType::Uc) | (PortSpace::Udp, QpType::Ud)
        );
        if !fits {
            return Err(Error::InvalidArgument("QP type does not fit the port space"));
        }
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            super::hw::init_qp(&h, qp)?;
        } else {
            init_qp(qp)?;
        }
        #[cfg(not(feature = "hardware"))]
        init_qp(qp)?;
        self.with(|st, k| {
            let id = st.ids.get_mut(&k).ok_or(Error::InvalidArgument("destroyed id"))?;
            id.qp = Some(Arc::new(Qp::from_ops(qp.ops().clone())));
            Ok(())
        })
    }

    /// The id's QP.
    pub fn qp(&self) -> Option<Arc<Qp>> {
        self.with(|st, k| Ok(st.ids.get(&k).and_then(|i| i.qp.clone())))
            .ok()
            .flatten()
    }

    /// Destroys the id's QP (`rdma_destroy_qp`).
    pub fn destroy_qp(&self) {
        let qp = self
            .with(|st, k| Ok(st.ids.get_mut(&k).and_then(|i| i.qp.take())))
            .ok()
            .flatten();
        drop(qp);
    }

    /// Connects to the resolved peer (`rdma_connect`): a REQ (TCP port
    /// space) or a SIDR_REQ (UDP port space) with rdma_cm's header and
    /// `param.private_data` (at most 56 / 180 bytes). The answer arrives
    /// as `Established`, `ConnectResponse`, `Rejected` or `Unreachable`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the route is resolved, or (TCP)
    /// with neither a QP nor `param.qp_num`; [`Error::PrivateDataTooLong`].
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let cfg = &self.shared.inner.cfg;
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            let (ps, qpn) = self.with(|st, k| {
                Self::check_alive(st, k)?;
                let id = &st.ids[&k];
                if id.state != IdState::RouteResolved {
                    return Err(bad("connect", id.state));
                }
                let max = match id.ps {
                    PortSpace::Tcp => mad::REQ_PRIVATE - mad::CMA_HDR_LEN,
                    PortSpace::Udp => mad::SIDR_REQ_PRIVATE - mad::CMA_HDR_LEN,
                };
                check_pd(&param.private_data, max)?;
                let qpn = id.qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
                if qpn == 0 && id.ps == PortSpace::Tcp {
                    return Err(bad("connect without a QP or qp_num", id.state));
                }
                Ok((id.ps, qpn))
            })?;
            return super::hw::connect(&self.shared.inner, self.key, &h, param, qpn, ps == PortSpace::Udp);
        }
        let outs = self.with(|st, k| {
            Self::check_alive(st, k)?;
            let (state, ps, src, dst) = {
                let id = &st.ids[&k];
                (id.state, id.ps, id.src, id.dst)
            };
            if state != IdState::RouteResolved {
                return Err(bad("connect", state));
            }
            let (src, dst) = (src.expect("resolved"), dst.expect("resolved"));
            let hdr = CmaHdr {
                src: src.ip(),
                src_port: src.port(),
                dst: dst.ip(),
            };
            let tid = st.random();
            let c = st.new_comm_id(k);
            let psn = (st.random() as u32) & 0xff_ffff;
            let (guid, sgid) = {
                let id = &st.ids[&k];
                let guid = id
                    .dev
                    .as_ref()
                    .and_then(|(n, _)| st.devices.get(n))
                    .map_or(0, |d| d.guid);
                (guid, st_sgid(&st.devices, id))
            };
            let _ = sgid;
            let id = st.ids.get_mut(&k).expect("alive");
            id.tid = tid;
            id.local_comm_id = c;
            id.local_psn = psn;
            id.param = param.clone();
            let msg = match ps {
                PortSpace::Tcp => {
                    check_pd(&param.private_data, mad::REQ_PRIVATE - mad::CMA_HDR_LEN)?;
                    // The id's QP, or (rdma_cm's `qp_num`) one the
                    // application drives itself: the REP then comes as
                    // `ConnectResponse` and `establish` finishes.
                    let qpn = match (&id.qp, param.qp_num) {
                        (Some(qp), _) => qp.qp_num(),
                        (None, n) if n != 0 => n,
                        (None, _) => return Err(bad("connect without a QP or qp_num", state)),
                    };
                    id.state = IdState::ReqSent;
                    CmMsg::Req(mad::Req {
                        local_comm_id: c,
                        service_id: mad::service_id(ps.number(), dst.port()),
                        local_ca_guid: guid,
                        local_qkey: 0,
                        local_qpn: qpn,
                        responder_resources: param.responder_resources,
                        initiator_depth: param.initiator_depth,
                        remote_cm_response_timeout: cfg.response_timeout,
                        transport: 0,
                        starting_psn: psn,
                        local_cm_response_timeout: cfg.response_timeout,
                        retry_count: param.retry_count.min(7),
                        mtu: id.mtu.as_raw() as u8,
                        rnr_retry_count: param.rnr_retry_count.min(7),
                        max_cm_retries: cfg.max_retries.min(15),
                        srq: param.srq,
                        local_gid: gid_of(src.ip()),
                        remote_gid: gid_of(dst.ip()),
                        hop_limit: 64,
                        local_ack_timeout: 14,
                        private_data: hdr.prepend(&param.private_data),
                    })
                }
                PortSpace::Udp => {
                    check_pd(&param.private_data, mad::SIDR_REQ_PRIVATE - mad::CMA_HDR_LEN)?;
                    id.state = IdState::SidrReqSent;
                    CmMsg::SidrReq(mad::SidrReq {
                        request_id: c,
                        pkey: 0xffff,
                        service_id: mad::service_id(ps.number(), dst.port()),
                        private_data: hdr.prepend(&param.private_data),
                    })
                }
            };
            st.arm(k, msg.clone(), cfg.response_duration(), cfg.max_retries);
            Ok(st.out_for(k, msg).into_iter().collect::<Vec<_>>())
        })?;
        self.shared.inner.send(outs);
        Ok(())
    }

    /// Accepts a connection request (`rdma_accept`). TCP: moves the QP to
    /// RTR and RTS and sends a REP with `param.private_data` (at most 196
    /// bytes); `Established` follows on the RTU. UDP: sends a SIDR_REP
    /// with the QP's number and Q_Key (at most 136 bytes of private data).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the id came from a request and has a
    /// QP (or, TCP, `param.qp_num` names the QP the application drives);
    /// [`Error::PrivateDataTooLong`]; the verbs error if the QP
    /// refuses its states (then a REJ goes to the peer).
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let cfg = &self.shared.inner.cfg;
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            let (qp, udp) = self.with(|st, k| {
                Self::check_alive(st, k)?;
                let id = &st.ids[&k];
                let udp = match id.state {
                    IdState::ReqRcvd => false,
                    IdState::SidrReqRcvd => true,
                    s => return Err(bad("accept", s)),
                };
                check_pd(
                    &param.private_data,
                    if udp { mad::SIDR_REP_PRIVATE } else { mad::REP_PRIVATE },
                )?;
                let qp = id.qp.clone().ok_or_else(|| bad("accept without a QP", id.state))?;
                Ok((qp, udp))
            })?;
            return super::hw::accept(&self.shared.inner, self.key, &h, &qp, param, udp);
        }
        let outs = self.with(|st, k| {
            Self::check_alive(st, k)?;
            let state = st.ids[&k].state;
            match state {
                IdState::ReqRcvd => {
                    check_pd(&param.private_data, mad::REP_PRIVATE)?;
                    let sgid = st_sgid(&st.devices, &st.ids[&k]);
                    let guid = st.ids[&k]
                        .dev
                        .as_ref()
                        .and_then(|(n, _)| st.devices.get(n))
                        .map_or(0, |d| d.guid);
                    let id = st.ids.get_mut(&k).expect("alive");
                    // The id's QP, or (rdma_cm's `qp_num`) one the
                    // application drives itself, moved to RTS before this
                    // call with `init_qp_attr`.
                    let qpn = match (&id.qp, param.qp_num) {
                        (Some(qp), _) => qp.qp_num(),
                        (None, n) if n != 0 => n,
                        (None, _) => return Err(bad("accept without a QP or qp_num", state)),
                    };
                    // Chosen when the request came, so that `init_qp_attr`
                    // could give it before this call.
                    let psn = id.local_psn;
                    // The responder's resources answer the requester's
                    // initiator depth and the other way round.
                    let req = id.param.clone();
                    id.param.responder_resources = param.responder_resources.min(req.initiator_depth.max(1));
                    id.param.initiator_depth = param.initiator_depth.min(req.responder_resources.max(1));
                    id.param.retry_count = param.retry_count;
                    id.param.rnr_retry_count = param.rnr_retry_count;
                    if let Err(e) = connect_qp(id, sgid) {
                        qp_to_err(id);
                        id.state = IdState::Done;
                        let msg = CmMsg::Rej(mad::Rej {
                            local_comm_id: id.local_comm_id,
                            remote_comm_id: id.remote_comm_id,
                            message_rejected: MsgRef::Req,
                            reason: mad::rej::CONSUMER_REJECT,
                            private_data: Vec::new(),
                        });
                        let out: Vec<_> = st.out_for(k, msg).into_iter().collect();
                        drop(out);
                        return Err(e.into());
                    }
                    id.state = IdState::RepSent;
                    let msg = CmMsg::Rep(mad::Rep {
                        local_comm_id: id.local_comm_id,
                        remote_comm_id: id.remote_comm_id,
                        local_qkey: 0,
                        local_qpn: qpn,
                        starting_psn: psn,
                        responder_resources: id.param.responder_resources,
                        initiator_depth: id.param.initiator_depth,
                        target_ack_delay: 0,
                        rnr_retry_count: param.rnr_retry_count.min(7),
                        srq: param.srq,
                        local_ca_guid: guid,
                        private_data: param.private_data.clone(),
                    });
                    st.arm(k, msg.clone(), cfg.response_duration(), cfg.max_retries);
                    Ok(st.out_for(k, msg).into_iter().collect::<Vec<_>>())
                }
                IdState::SidrReqRcvd => {
                    check_pd(&param.private_data, mad::SIDR_REP_PRIVATE)?;
                    let id = st.ids.get_mut(&k).expect("alive");
                    let qpn = id
                        .qp
                        .as_ref()
                        .map(|q| q.qp_num())
                        .ok_or_else(|| bad("accept without a QP", state))?;
                    id.state = IdState::Established;
                    let msg = CmMsg::SidrRep(mad::SidrRep {
                        request_id: id.remote_comm_id,
                        status: 0,
                        qpn,
                        service_id: mad::service_id(PortSpace::Udp.number(), id.src.map_or(0, |s| s.port())),
                        qkey: UDP_QKEY,
                        private_data: param.private_data.clone(),
                    });
                    // Kept to answer a duplicate SIDR_REQ; never retried.
                    id.last_sent = Some(msg.clone());
                    Ok(st.out_for(k, msg).into_iter().collect::<Vec<_>>())
                }
                s => Err(bad("accept", s)),
            }
        })?;
        self.shared.inner.send(outs);
        Ok(())
    }

    /// Rejects a connection request (`rdma_reject`) with `private_data`
    /// (at most 148 bytes; UD: 136): a REJ with reason "consumer reject"
    /// (28), or a SIDR_REP with status "rejected" (2).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the id came from a request not yet
    /// answered; [`Error::PrivateDataTooLong`].
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            self.with(|st, k| {
                Self::check_alive(st, k)?;
                match st.ids[&k].state {
                    IdState::ReqRcvd => check_pd(private_data, mad::REJ_PRIVATE),
                    IdState::SidrReqRcvd => check_pd(private_data, mad::SIDR_REP_PRIVATE),
                    s => Err(bad("reject", s)),
                }
            })?;
            return super::hw::reject(&self.shared.inner, self.key, &h, private_data);
        }
        let outs = self.with(|st, k| {
            Self::check_alive(st, k)?;
            let state = st.ids[&k].state;
            let id = st.ids.get_mut(&k).expect("alive");
            let msg = match state {
                IdState::ReqRcvd => {
                    check_pd(private_data, mad::REJ_PRIVATE)?;
                    CmMsg::Rej(mad::Rej {
                        local_comm_id: id.local_comm_id,
                        remote_comm_id: id.remote_comm_id,
                        message_rejected: MsgRef::Req,
                        reason: mad::rej::CONSUMER_REJECT,
                        private_data: private_data.to_vec(),
                    })
                }
                IdState::SidrReqRcvd => {
                    check_pd(private_data, mad::SIDR_REP_PRIVATE)?;
                    CmMsg::SidrRep(mad::SidrRep {
                        request_id: id.remote_comm_id,
                        status: 2,
                        qpn: 0,
                        service_id: mad::service_id(PortSpace::Udp.number(), id.src.map_or(0, |s| s.port())),
                        qkey: 0,
                        private_data: private_data.to_vec(),
                    })
                }
                s => return Err(bad("reject", s)),
            };
            id.state = IdState::Done;
            id.last_sent = Some(msg.clone());
            Ok(st.out_for(k, msg).into_iter().collect::<Vec<_>>())
        })?;
        self.shared.inner.send(outs);
        Ok(())
    }

    /// Completes a connection whose REP came as `ConnectResponse` (the
    /// id had no QP at connect; `rdma_establish`): moves the id's QP, if it
    /// has one now, to RTR and RTS, and sends the RTU. An application that
    /// drives its own QP moves it first ([`CmId::path`] has the peer's
    /// QPN and PSNs).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless a `ConnectResponse` came; the verbs
    /// error if the QP refuses its states.
    pub fn establish(&self) -> Result<()> {
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            let qp = self.with(|st, k| {
                Self::check_alive(st, k)?;
                let id = &st.ids[&k];
                if id.state != IdState::RepRcvd {
                    return Err(bad("establish", id.state));
                }
                Ok(id.qp.clone())
            })?;
            return super::hw::establish(&self.shared.inner, self.key, &h, qp.as_deref());
        }
        let outs = self.with(|st, k| {
            Self::check_alive(st, k)?;
            let sgid = st_sgid(&st.devices, &st.ids[&k]);
            let id = st.ids.get_mut(&k).expect("alive");
            if id.state != IdState::RepRcvd {
                return Err(bad("establish", id.state));
            }
            connect_qp(id, sgid)?;
            id.state = IdState::Established;
            let msg = rtu(id);
            id.last_sent = Some(msg.clone());
            Ok(st.out_for(k, msg).into_iter().collect::<Vec<_>>())
        })?;
        self.shared.inner.send(outs);
        Ok(())
    }

    /// Disconnects (`rdma_disconnect`): moves the QP to ERR (its posted
    /// work completes with a flush) and sends a DREQ; `Disconnected`
    /// follows on the DREP (or when the DREQ's retries run out), then
    /// time-wait and `TimewaitExit`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidState`] unless the id is connected or connecting.
    pub fn disconnect(&self) -> Result<()> {
        let cfg = &self.shared.inner.cfg;
        #[cfg(feature = "hardware")]
        if let Some(h) = self.hw() {
            let tcp = self.with(|st, k| {
                Self::check_alive(st, k)?;
                let id = st.ids.get_mut(&k).expect("alive");
                match id.state {
                    IdState::Established | IdState::RepSent | IdState::RepRcvd => {}
                    s => return Err(bad("disconnect", s)),
                }
                if id.ps == PortSpace::Udp {
                    id.state = IdState::Done;
                    return Ok(false);
                }
                qp_to_err(id);
                id.state = IdState::DreqSent;
                Ok(true)
            })?;
            return if tcp { super::hw::disconnect(&h) } else { Ok(()) };
        }
        let outs = self.with(|st, k| {
            Self::check_alive(st, k)?;
            disconnect_locked(st, k, cfg)
        })?;
        self.shared.inner.send(outs);
        Ok(())
    }

    /// Destroys the id now (what dropping it does). Always succeeds, also
    /// after `DeviceRemoval`.
    pub fn destroy(self) {
        drop(self);
    }

    /// Moves the id's future events to `channel` (`rdma_migrate_id`);
    /// events already queued stay where they are.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a destroyed id.
    pub fn migrate(&self, channel: &super::EventChannel) -> Result<()> {
        self.with(|st, k| {
            let id = st.ids.get_mut(&k).ok_or(Error::InvalidArgument("destroyed id"))?;
            id.chan = channel.inner.clone();
            Ok(())
        })
    }
}

pub(crate) fn disconnect_locked(st: &mut State, k: u64, cfg: &super::CmConfig) -> Result<Vec<agent::Out>> {
    let id = st.ids.get_mut(&k).ok_or(Error::InvalidArgument("destroyed id"))?;
    match id.state {
        IdState::Established | IdState::RepSent | IdState::RepRcvd => {}
        s => return Err(bad("disconnect", s)),
    }
    if id.ps == PortSpace::Udp {
        id.state = IdState::Done;
        return Ok(Vec::new());
    }
    qp_to_err(id);
    id.state = IdState::DreqSent;
    let msg = CmMsg::Dreq(Ids {
        local_comm_id: id.local_comm_id,
        remote_comm_id: id.remote_comm_id,
        remote_qpn: id.remote_qpn,
        private_data: Vec::new(),
    });
    st.arm(k, msg.clone(), cfg.response_duration(), cfg.max_retries);
    Ok(st.out_for(k, msg).into_iter().collect())
}

impl Drop for CmId {
    fn drop(&mut self) {
        let inner = &self.shared.inner;
        let cfg = &inner.cfg;
        let (outs, qp, ctx) = {
            let mut st = inner.lock();
            let k = self.key;
            let Some(id) = st.ids.get_mut(&k) else { return };
            id.destroyed = true;
            // A librdmacm id (not a listener, which also has soft work
            // below): the kernel does the DREQ or REJ and the time-wait
            // when it is destroyed, so nothing lingers here.
            #[cfg(feature = "hardware")]
            if id.hw.is_some() && id.state != IdState::Listen {
                if !id.removed && matches!(id.state, IdState::Established | IdState::RepSent | IdState::RepRcvd) {
                    qp_to_err(id);
                }
                let (h, qp, ctx) = (id.hw.take(), id.qp.take(), id.ctx.take());
                agent::forget_id(&mut st, k);
                drop(st);
                drop(h);
                drop(qp);
                drop(ctx);
                return;
            }
            let state = id.state;
            let removed = id.removed;
            let mut outs = Vec::new();
            let mut linger = false;
            if !removed {
                match state {
                    IdState::Established | IdState::RepSent | IdState::RepRcvd if id.ps == PortSpace::Tcp => {
                        if let Ok(o) = disconnect_locked(&mut st, k, cfg) {
                            outs = o;
                        }
                        linger = true;
                    }
                    IdState::DreqSent | IdState::TimeWait => linger = true,
                    IdState::ReqSent | IdState::ReqRcvd => {
                        let id = &st.ids[&k];
                        let msg = CmMsg::Rej(mad::Rej {
                            local_comm_id: id.local_comm_id,
                            remote_comm_id: id.remote_comm_id,
                            message_rejected: if state == IdState::ReqSent {
                                MsgRef::Other
                            } else {
                                MsgRef::Req
                            },
                            reason: if state == IdState::ReqSent {
                                mad::rej::TIMEOUT
                            } else {
                                mad::rej::CONSUMER_REJECT
                            },
                            private_data: Vec::new(),
                        });
                        outs.extend(st.out_for(k, msg));
                    }
                    IdState::Listen => {
                        // Requests nobody took from this listener are
                        // refused now, not left for ever.
                        let pending: Vec<u64> = st
                            .ids
                            .iter()
                            .filter(|(_, c)| {
                                c.listener == Some(k) && matches!(c.state, IdState::ReqRcvd | IdState::SidrReqRcvd)
                            })
                            .map(|(ck, _)| *ck)
                            .collect();
                        for ck in pending {
                            let c = &st.ids[&ck];
                            let msg = if c.state == IdState::ReqRcvd {
                                CmMsg::Rej(mad::Rej {
                                    local_comm_id: c.local_comm_id,
                                    remote_comm_id: c.remote_comm_id,
                                    message_rejected: MsgRef::Req,
                                    reason: mad::rej::CONSUMER_REJECT,
                                    private_data: Vec::new(),
                                })
                            } else {
                                CmMsg::SidrRep(mad::SidrRep {
                                    request_id: c.remote_comm_id,
                                    status: 2,
                                    qpn: 0,
                                    service_id: 0,
                                    qkey: 0,
                                    private_data: Vec::new(),
                                })
                            };
                            outs.extend(st.out_for(ck, msg));
                            agent::forget_id(&mut st, ck);
                        }
                    }
                    IdState::SidrReqRcvd => {
                        let id = &st.ids[&k];
                        let msg = CmMsg::SidrRep(mad::SidrRep {
                            request_id: id.remote_comm_id,
                            status: 2,
                            qpn: 0,
                            service_id: 0,
                            qkey: 0,
                            private_data: Vec::new(),
                        });
                        outs.extend(st.out_for(k, msg));
                    }
                    _ => {}
                }
            }
            // The QP and context go now; a lingering id keeps only what
            // time-wait needs (comm IDs, peer QPN) to answer duplicates and
            // refuse stale requests.
            let id = st.ids.get_mut(&k).expect("present");
            let qp = id.qp.take();
            let ctx = id.ctx.take();
            #[cfg(feature = "hardware")]
            let hw = id.hw.take();
            if !linger {
                agent::forget_id(&mut st, k);
            }
            #[cfg(feature = "hardware")]
            drop(st);
            #[cfg(feature = "hardware")]
            drop(hw);
            (outs, qp, ctx)
        };
        drop(qp);
        drop(ctx);
        inner.send(outs);
    }
}

/// Whether the id runs on librdmacm.
fn is_hw(id: &agent::Id) -> bool {
    #[cfg(feature = "hardware")]
    return id.hw.is_some();
    #[cfg(not(feature = "hardware"))]
    {
        let _ = id;
        false
    }
}

#[cfg(test)]
mod tests;
