//! The CM protocol: the IBTA ch. 12 state machine as rdma_cm drives it.
//! Each received MAD (REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REQ,
//! SIDR_REP) moves an id and says what to send back; the ids' timers
//! resend or time out what got no answer.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::cm::mad::{self, rej, CmMsg, CmaHdr, Ids, MsgRef};
use crate::cm::{gid_of, CmEventKind, ConnParam, PortSpace, UdParam};
use crate::soft::proto::gsi::GsiMad;
use crate::subsystem::{Generation, NamespaceId, NetnsMode};
use crate::verbs::{AhAttr, Mtu};

use super::qp::*;
use super::state::*;
use super::*;

impl Inner {
    pub(super) fn timers(&self) -> Vec<Out> {
        let mut st = self.lock();
        let now = Instant::now();
        let due: Vec<u64> = st
            .ids
            .iter()
            .filter(|(_, id)| id.timer.is_some_and(|t| t <= now))
            .map(|(k, _)| *k)
            .collect();
        let mut outs = Vec::new();
        let wait = self.cfg.response_duration();
        for key in due {
            let Some(id) = st.ids.get_mut(&key) else { continue };
            id.timer = None;
            let state = id.state;
            if state == IdState::TimeWait {
                id.state = IdState::Done;
                if id.destroyed {
                    forget_id(&mut st, key);
                } else {
                    st.post_kind(key, CmEventKind::TimewaitExit);
                }
                continue;
            }
            if id.retries_left > 0 {
                id.retries_left -= 1;
                id.timer = Some(now + wait);
                if let Some(msg) = id.last_sent.clone() {
                    st.counters.retransmits += 1;
                    outs.extend(st.out_for(key, msg));
                }
                continue;
            }
            // Out of retries.
            match state {
                IdState::ReqSent | IdState::RepSent | IdState::SidrReqSent => {
                    if state != IdState::SidrReqSent {
                        let (l, r) = (id.local_comm_id, id.remote_comm_id);
                        let msg = CmMsg::Rej(mad::Rej {
                            local_comm_id: l,
                            remote_comm_id: r,
                            message_rejected: if state == IdState::ReqSent {
                                MsgRef::Req
                            } else {
                                MsgRef::Rep
                            },
                            reason: rej::TIMEOUT,
                            private_data: Vec::new(),
                        });
                        outs.extend(st.out_for(key, msg));
                    }
                    let id = st.ids.get_mut(&key).expect("present");
                    id.state = IdState::Done;
                    qp_to_err(id);
                    if let Some(mut ev) = st.event(key, CmEventKind::Unreachable) {
                        ev.status = -libc::ETIMEDOUT;
                        st.post(key, ev);
                    }
                    if st.ids.get(&key).is_some_and(|i| i.destroyed) {
                        forget_id(&mut st, key);
                    }
                }
                IdState::DreqSent => {
                    // No DREP: the connection is down all the same.
                    enter_timewait(&mut st, key, self.cfg.timewait);
                    st.post_kind(key, CmEventKind::Disconnected);
                }
                _ => {}
            }
        }
        outs
    }

    /// Handles one received MAD; returns what to send.
    pub(super) fn handle_mad(&self, dev: &str, gen: Generation, m: &GsiMad) -> Vec<Out> {
        let mut st = self.lock();
        st.counters.rx_mads += 1;
        let Ok((tid, msg)) = CmMsg::decode(&m.mad) else {
            st.counters.rx_dropped += 1;
            return Vec::new();
        };
        let Some(d) = st.devices.get(dev).filter(|d| d.dref.generation() == gen) else {
            st.counters.rx_dropped += 1;
            return Vec::new();
        };
        let ctx = Rx {
            dev: dev.to_string(),
            gen,
            ns: d.dref.namespace(),
            src: m.src,
            dst: m.dst,
            tid,
        };
        let mut outs = Vec::new();
        match msg {
            CmMsg::Req(r) => self.on_req(&mut st, &ctx, r, &mut outs),
            CmMsg::Rep(r) => self.on_rep(&mut st, &ctx, r, &mut outs),
            CmMsg::Rtu(r) => on_rtu(&mut st, &ctx, r),
            CmMsg::Rej(r) => on_rej(&mut st, &ctx, r),
            CmMsg::Mra(r) => self.on_mra(&mut st, &ctx, r),
            CmMsg::Dreq(r) => self.on_dreq(&mut st, &ctx, r, &mut outs),
            CmMsg::Drep(r) => self.on_drep(&mut st, &ctx, r),
            CmMsg::SidrReq(r) => self.on_sidr_req(&mut st, &ctx, r, &mut outs),
            CmMsg::SidrRep(r) => on_sidr_rep(&mut st, &ctx, r),
        }
        outs
    }

    /// A reply straight to the sender of a received MAD (REJ, DREP, MRA,
    /// SIDR_REP for which no id exists or is needed).
    fn reply(st: &State, rx: &Rx, msg: CmMsg) -> Option<Out> {
        let dev = st.devices.get(&rx.dev)?;
        let sgid = dev.sgid_index(rx.dst)?;
        Some(Out {
            shared: dev.shared.clone(),
            sgid,
            dst: rx.src,
            mad: msg.encode(rx.tid),
            msg,
        })
    }

    fn on_req(&self, st: &mut State, rx: &Rx, r: mad::Req, outs: &mut Vec<Out>) {
        // Duplicate: an id already has this (peer, remote comm ID).
        let dup = st
            .ids
            .iter()
            .find(|(_, id)| id.peer == Some(rx.src) && id.remote_comm_id == r.local_comm_id && id.listener.is_some())
            .map(|(k, id)| (*k, id.state));
        if let Some((key, state)) = dup {
            st.counters.dup_reqs += 1;
            let (l, rc) = {
                let id = &st.ids[&key];
                (id.local_comm_id, id.remote_comm_id)
            };
            match state {
                IdState::ReqRcvd => {
                    // The application has not answered yet: ask the peer
                    // to wait (MRA) instead of letting it give up.
                    let msg = CmMsg::Mra(mad::Mra {
                        local_comm_id: l,
                        remote_comm_id: rc,
                        message_mraed: MsgRef::Req,
                        service_timeout: self.cfg.response_timeout.saturating_add(2).min(31),
                    });
                    outs.extend(st.out_for(key, msg));
                }
                IdState::RepSent => {
                    if let Some(msg) = st.ids[&key].last_sent.clone() {
                        outs.extend(st.out_for(key, msg));
                    }
                }
                IdState::TimeWait => {
                    st.counters.stale_rejects += 1;
                    let msg = stale_rej(l, r.local_comm_id);
                    outs.extend(Self::reply(st, rx, msg));
                }
                _ => {}
            }
            return;
        }
        // Stale: a connection with this peer QP is up or in time-wait.
        let stale = st.ids.values().any(|id| {
            id.peer == Some(rx.src)
                && id.remote_qpn == r.local_qpn
                && matches!(id.state, IdState::Established | IdState::TimeWait | IdState::DreqSent)
        });
        if stale {
            st.counters.stale_rejects += 1;
            outs.extend(Self::reply(st, rx, stale_rej(0, r.local_comm_id)));
            return;
        }
        let Some((ps, port)) = mad::split_service_id(r.service_id) else {
            outs.extend(Self::reply(st, rx, r.rej(rej::INVALID_SERVICE_ID)));
            return;
        };
        if PortSpace::from_number(ps) != Some(PortSpace::Tcp) {
            outs.extend(Self::reply(st, rx, r.rej(rej::INVALID_SERVICE_ID)));
            return;
        }
        let Some((hdr, user)) = CmaHdr::parse(&r.private_data) else {
            outs.extend(Self::reply(st, rx, r.rej(rej::INVALID_SERVICE_ID)));
            return;
        };
        let shared_mode = self.sub.mode() == NetnsMode::Shared;
        let Some(lkey) = find_listener(st, rx, PortSpace::Tcp, port, hdr.dst, shared_mode) else {
            outs.extend(Self::reply(st, rx, r.rej(rej::INVALID_SERVICE_ID)));
            return;
        };
        let pending = st
            .ids
            .values()
            .filter(|i| i.listener == Some(lkey) && i.state == IdState::ReqRcvd && !i.destroyed)
            .count();
        if pending >= st.ids[&lkey].backlog.max(1) as usize {
            // As a full SYN queue: drop; the peer sends the REQ again.
            st.counters.backlog_drops += 1;
            return;
        }
        let l = &st.ids[&lkey];
        let mut child = Id::new(l.ns.clone(), l.chan.clone(), PortSpace::Tcp, l.context);
        let local_mtu = st.devices.get(&rx.dev).map_or(Mtu::Mtu1024, |d| d.mtu);
        child.state = IdState::ReqRcvd;
        child.listener = Some(lkey);
        child.dev = Some((rx.dev.clone(), rx.gen));
        child.src = Some(SocketAddr::new(rx.dst, port));
        child.dst = Some(SocketAddr::new(hdr.src, hdr.src_port));
        child.peer = Some(rx.src);
        child.remote_comm_id = r.local_comm_id;
        child.remote_qpn = r.local_qpn;
        child.remote_psn = r.starting_psn;
        // This side's starting PSN, chosen now (as rdma_cm does at id
        // creation) so that `init_qp_attr` can give RTS before accept.
        child.local_psn = (st.random() as u32) & 0xff_ffff;
        child.tid = rx.tid;
        child.mtu = min_mtu(local_mtu, r.mtu);
        child.param = ConnParam {
            private_data: Vec::new(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            qp_num: r.local_qpn,
            srq: r.srq,
        };
        let key = st.next_key;
        st.next_key += 1;
        st.ids.insert(key, child);
        let c = st.new_comm_id(key);
        st.ids.get_mut(&key).expect("inserted").local_comm_id = c;
        if let Some(mut ev) = st.event(key, CmEventKind::ConnectRequest) {
            ev.listener = Some(lkey);
            ev.private_data = user.to_vec();
            ev.conn = Some(st.ids[&key].param.clone());
            ev.new_id = self.owner.get().map(|o| (key, o.clone()));
            st.post(lkey, ev);
        }
    }

    fn on_sidr_req(&self, st: &mut State, rx: &Rx, r: mad::SidrReq, outs: &mut Vec<Out>) {
        let dup = st
            .ids
            .iter()
            .find(|(_, id)| id.peer == Some(rx.src) && id.remote_comm_id == r.request_id && id.listener.is_some())
            .map(|(k, _)| *k);
        if let Some(key) = dup {
            st.counters.dup_reqs += 1;
            if let Some(msg) = st.ids[&key].last_sent.clone() {
                outs.extend(st.out_for(key, msg));
            }
            return;
        }
        let parsed = mad::split_service_id(r.service_id)
            .filter(|(ps, _)| PortSpace::from_number(*ps) == Some(PortSpace::Udp))
            .zip(CmaHdr::parse(&r.private_data));
        let Some(((_, port), (hdr, user))) = parsed else {
            outs.extend(Self::reply(st, rx, r.refusal(mad::sidr::UNSUPPORTED)));
            return;
        };
        let shared_mode = self.sub.mode() == NetnsMode::Shared;
        let Some(lkey) = find_listener(st, rx, PortSpace::Udp, port, hdr.dst, shared_mode) else {
            outs.extend(Self::reply(st, rx, r.refusal(mad::sidr::UNSUPPORTED)));
            return;
        };
        let l = &st.ids[&lkey];
        let mut child = Id::new(l.ns.clone(), l.chan.clone(), PortSpace::Udp, l.context);
        child.state = IdState::SidrReqRcvd;
        child.listener = Some(lkey);
        child.dev = Some((rx.dev.clone(), rx.gen));
        child.src = Some(SocketAddr::new(rx.dst, port));
        child.dst = Some(SocketAddr::new(hdr.src, hdr.src_port));
        child.peer = Some(rx.src);
        child.remote_comm_id = r.request_id;
        child.tid = rx.tid;
        let key = st.next_key;
        st.next_key += 1;
        st.ids.insert(key, child);
        if let Some(mut ev) = st.event(key, CmEventKind::ConnectRequest) {
            ev.listener = Some(lkey);
            ev.private_data = user.to_vec();
            ev.new_id = self.owner.get().map(|o| (key, o.clone()));
            st.post(lkey, ev);
        }
    }

    fn on_rep(&self, st: &mut State, rx: &Rx, r: mad::Rep, outs: &mut Vec<Out>) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            st.counters.rx_dropped += 1;
            return;
        };
        let state = st.ids[&key].state;
        match state {
            IdState::ReqSent => {}
            IdState::Established => {
                // Our RTU was lost: send it again.
                if let Some(msg) = st.ids[&key].last_sent.clone() {
                    outs.extend(st.out_for(key, msg));
                }
                return;
            }
            _ => return,
        }
        let id = st.ids.get_mut(&key).expect("found");
        id.timer = None;
        id.remote_comm_id = r.local_comm_id;
        id.remote_qpn = r.local_qpn;
        id.remote_psn = r.starting_psn;
        let conn = ConnParam {
            private_data: r.private_data.clone(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: id.param.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            qp_num: r.local_qpn,
            srq: r.srq,
        };
        if id.qp.is_none() {
            id.state = IdState::RepRcvd;
            if let Some(mut ev) = st.event(key, CmEventKind::ConnectResponse) {
                ev.private_data = r.private_data;
                ev.conn = Some(conn);
                st.post(key, ev);
            }
            return;
        }
        match connect_qp(id, st_sgid(&st.devices, id)) {
            Ok(()) => {
                let id = st.ids.get_mut(&key).expect("found");
                id.state = IdState::Established;
                let msg = rtu(id);
                id.last_sent = Some(msg.clone());
                outs.extend(st.out_for(key, msg));
                if let Some(mut ev) = st.event(key, CmEventKind::Established) {
                    ev.private_data = r.private_data;
                    ev.conn = Some(conn);
                    st.post(key, ev);
                }
            }
            Err(_) => {
                let id = st.ids.get_mut(&key).expect("found");
                id.state = IdState::Done;
                qp_to_err(id);
                let msg = CmMsg::Rej(mad::Rej {
                    local_comm_id: id.local_comm_id,
                    remote_comm_id: id.remote_comm_id,
                    message_rejected: MsgRef::Rep,
                    reason: rej::CONSUMER_REJECT,
                    private_data: Vec::new(),
                });
                outs.extend(st.out_for(key, msg));
                st.post_kind(key, CmEventKind::ConnectError);
            }
        }
    }

    fn on_mra(&self, st: &mut State, rx: &Rx, r: mad::Mra) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            return;
        };
        let wait = self.cfg.response_duration() + crate::cm::timeout_duration(r.service_timeout);
        let retries = self.cfg.max_retries;
        let id = st.ids.get_mut(&key).expect("found");
        if matches!(id.state, IdState::ReqSent | IdState::RepSent) {
            id.timer = Some(Instant::now() + wait);
            id.retries_left = retries;
        }
    }

    fn on_dreq(&self, st: &mut State, rx: &Rx, r: Ids, outs: &mut Vec<Out>) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            // No such connection (any more): answer so the peer can finish.
            outs.extend(Self::reply(st, rx, r.drep(r.remote_comm_id)));
            return;
        };
        let (state, l) = {
            let id = &st.ids[&key];
            (id.state, id.local_comm_id)
        };
        match state {
            IdState::Established | IdState::RepSent | IdState::DreqSent | IdState::RepRcvd => {
                let id = st.ids.get_mut(&key).expect("found");
                qp_to_err(id);
                outs.extend(st.out_for(key, r.drep(l)));
                enter_timewait(st, key, self.cfg.timewait);
                st.post_kind(key, CmEventKind::Disconnected);
            }
            IdState::TimeWait | IdState::Done => outs.extend(st.out_for(key, r.drep(l))),
            _ => {}
        }
    }

    fn on_drep(&self, st: &mut State, rx: &Rx, r: Ids) {
        let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
            return;
        };
        if st.ids[&key].state == IdState::DreqSent {
            enter_timewait(st, key, self.cfg.timewait);
            st.post_kind(key, CmEventKind::Disconnected);
        }
    }
}

/// Where a received MAD came from.
struct Rx {
    dev: String,
    gen: Generation,
    ns: NamespaceId,
    src: IpAddr,
    dst: IpAddr,
    tid: u64,
}

fn stale_rej(local: u32, remote: u32) -> CmMsg {
    CmMsg::Rej(mad::Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: MsgRef::Req,
        reason: rej::STALE_CONN,
        private_data: Vec::new(),
    })
}

pub(crate) fn rtu(id: &Id) -> CmMsg {
    CmMsg::Rtu(Ids {
        local_comm_id: id.local_comm_id,
        remote_comm_id: id.remote_comm_id,
        remote_qpn: 0,
        private_data: Vec::new(),
    })
}

/// The id whose local comm ID is `comm`, if its peer is the sender.
fn find_comm(st: &State, rx: &Rx, comm: u32) -> Option<u64> {
    let key = *st.by_comm.get(&comm)?;
    let id = st.ids.get(&key)?;
    (id.peer == Some(rx.src) && !id.removed).then_some(key)
}

fn find_listener(st: &State, rx: &Rx, ps: PortSpace, port: u16, dst: IpAddr, shared_mode: bool) -> Option<u64> {
    st.ids
        .iter()
        .filter(|(_, id)| {
            id.state == IdState::Listen
                && !id.destroyed
                && id.ps == ps
                && (id.ns.id() == rx.ns || shared_mode)
                && id
                    .src
                    .is_some_and(|s| s.port() == port && (s.ip().is_unspecified() || s.ip() == dst || s.ip() == rx.dst))
        })
        // A listener on the exact address wins over a wildcard one.
        .min_by_key(|(_, id)| id.src.is_some_and(|s| s.ip().is_unspecified()))
        .map(|(k, _)| *k)
}

fn min_mtu(local: Mtu, remote: u8) -> Mtu {
    let r = match remote {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    };
    if r.as_raw() < local.as_raw() {
        r
    } else {
        local
    }
}

fn on_rtu(st: &mut State, rx: &Rx, r: Ids) {
    let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
        return;
    };
    let id = st.ids.get_mut(&key).expect("found");
    if id.state == IdState::RepSent {
        id.state = IdState::Established;
        id.timer = None;
        st.post_kind(key, CmEventKind::Established);
    }
}

fn on_rej(st: &mut State, rx: &Rx, r: mad::Rej) {
    let Some(key) = find_comm(st, rx, r.remote_comm_id) else {
        st.counters.rx_dropped += 1;
        return;
    };
    let id = st.ids.get_mut(&key).expect("found");
    if !matches!(id.state, IdState::ReqSent | IdState::RepSent | IdState::RepRcvd) {
        return;
    }
    id.state = IdState::Done;
    id.timer = None;
    qp_to_err(id);
    let destroyed = id.destroyed;
    if let Some(mut ev) = st.event(key, CmEventKind::Rejected) {
        ev.status = i32::from(r.reason);
        ev.private_data = r.private_data;
        st.post(key, ev);
    }
    if destroyed {
        forget_id(st, key);
    }
}

fn on_sidr_rep(st: &mut State, rx: &Rx, r: mad::SidrRep) {
    let Some(key) = find_comm(st, rx, r.request_id) else {
        return;
    };
    let id = st.ids.get_mut(&key).expect("found");
    if id.state != IdState::SidrReqSent {
        return;
    }
    id.timer = None;
    let sgid = st_sgid(&st.devices, &st.ids[&key]);
    let id = st.ids.get_mut(&key).expect("found");
    if r.status == 0 {
        id.state = IdState::Established;
        id.remote_qpn = r.qpn;
        id.remote_qkey = r.qkey;
        let peer = id.peer.unwrap_or(rx.src);
        if let Some(mut ev) = st.event(key, CmEventKind::Established) {
            ev.private_data = r.private_data;
            ev.ud = Some(UdParam {
                qp_num: r.qpn,
                qkey: r.qkey,
                ah_attr: AhAttr::roce(gid_of(peer), sgid, 1),
            });
            st.post(key, ev);
        }
    } else {
        id.state = IdState::Done;
        if let Some(mut ev) = st.event(key, CmEventKind::Unreachable) {
            ev.status = i32::from(r.status);
            ev.private_data = r.private_data;
            st.post(key, ev);
        }
    }
}
