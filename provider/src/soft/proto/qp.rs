//! Queue pairs: creation and limits, the state machine (check-then-apply,
//! docs/design.md §3.2), posting (docs/design.md §3.3) and flushing (docs/design.md §3.4).

use std::collections::VecDeque;

use crate::soft::wire::Psn;
use crate::verbs::qp_state::{self, ModifyLimits};
use crate::verbs::{
    verr, AccessFlags, Error, ErrorKind, EventType, PostError, QpAttr, QpAttrMask, QpCap, QpState, QpType, RemoteAddr,
    Result, Verb, WcOpcode, WcStatus, WorkCompletion,
};

use super::{Core, CqId, Nanos, PdId, SrqId, QPN_BASE};

/// What `create_qp` needs, in engine ids.
#[derive(Debug, Clone, Copy)]
pub struct QpCreate {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// Send CQ.
    pub send_cq: CqId,
    /// Receive CQ.
    pub recv_cq: CqId,
    /// SRQ, if any.
    pub srq: Option<SrqId>,
    /// Requested capacities.
    pub cap: QpCap,
    /// Signal all send WRs.
    pub sq_sig_all: bool,
    /// Owning context (for async events).
    pub owner: u32,
}

/// A scatter/gather entry as the engine keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SgeRaw {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
}

impl SgeRaw {
    /// The engine's copy of a work request's SGE.
    #[inline]
    pub(crate) fn of(s: &crate::verbs::Sge<'_>) -> SgeRaw {
        SgeRaw {
            addr: s.addr(),
            len: s.length(),
            lkey: s.lkey(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeOp {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    CompSwap,
    FetchAdd,
    LocalInv,
    RegMr,
    BindMw,
}

/// A local memory operation carried by a send-queue WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalOp {
    /// LOCAL_INV of a key.
    Inv { key: u32 },
    /// REG_MR: `mr_key` is the new key (same index as the MR).
    Reg { mr_key: u32, access: AccessFlags },
    /// A window bind (type 1 from the verb, type 2 from BIND_MW).
    Bind {
        mw_key: u32,
        new_key: u32,
        mr_key: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
        type1: bool,
    },
}

impl WqeOp {
    pub(crate) fn wc_opcode(self) -> WcOpcode {
        match self {
            WqeOp::Send | WqeOp::SendImm | WqeOp::SendInv => WcOpcode::Send,
            WqeOp::Write | WqeOp::WriteImm => WcOpcode::RdmaWrite,
            WqeOp::Read => WcOpcode::RdmaRead,
            WqeOp::CompSwap => WcOpcode::CompSwap,
            WqeOp::FetchAdd => WcOpcode::FetchAdd,
            WqeOp::LocalInv => WcOpcode::LocalInv,
            WqeOp::RegMr => WcOpcode::RegMr,
            WqeOp::BindMw => WcOpcode::BindMw,
        }
    }

    pub(crate) fn is_read_or_atomic(self) -> bool {
        matches!(self, WqeOp::Read | WqeOp::CompSwap | WqeOp::FetchAdd)
    }

    pub(crate) fn is_atomic(self) -> bool {
        matches!(self, WqeOp::CompSwap | WqeOp::FetchAdd)
    }

    pub(crate) fn is_local(self) -> bool {
        matches!(self, WqeOp::LocalInv | WqeOp::RegMr | WqeOp::BindMw)
    }
}

/// UD destination resolved at post time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdTarget {
    pub(crate) dst: std::net::IpAddr,
    pub(crate) sgid_index: u8,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Not yet (fully) transmitted.
    Pending,
    /// Every packet transmitted; waiting for acknowledgement/response.
    Sent,
    /// Completed (success); waiting for the WQEs before it to complete.
    Done,
    /// Failed with this status; reported once the WQEs before it completed.
    Failed(WcStatus, u32),
}

#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: WqeOp,
    pub(crate) remote: RemoteAddr,
    /// Immediate data, the rkey to invalidate, or the key of a LOCAL_INV.
    pub(crate) imm: u32,
    pub(crate) compare: u64,
    pub(crate) swap_add: u64,
    pub(crate) sgl: Vec<SgeRaw>,
    /// Inline payload (copied at post time).
    pub(crate) inline: Option<Vec<u8>>,
    pub(crate) length: u32,
    pub(crate) signaled: bool,
    pub(crate) fence: bool,
    pub(crate) solicited: bool,
    pub(crate) ud: Option<UdTarget>,
    /// The operation of a local WQE.
    pub(crate) local: Option<LocalOp>,
    pub(crate) state: WqeState,
    /// PSN of the first packet (valid once transmission started).
    pub(crate) first_psn: Psn,
    /// Packets (PSNs) the WQE spans.
    pub(crate) npkts: u32,
    /// Read responses placed so far (packets).
    pub(crate) resp_pkts: u32,
}

#[derive(Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sgl: Vec<SgeRaw>,
    pub(crate) length: u64,
}

impl RecvWqe {
    /// The engine's copy of a receive WR, its SGEs stored in `sgl` (a
    /// recycled vector on the QP path).
    pub(crate) fn new(wr: &crate::verbs::RecvWr<'_>, mut sgl: Vec<SgeRaw>) -> RecvWqe {
        sgl.extend(wr.sg_list.iter().map(SgeRaw::of));
        let length = sgl.iter().map(|s| u64::from(s.len)).sum();
        RecvWqe {
            wr_id: wr.wr_id,
            sgl,
            length,
        }
    }
}

/// Requester progress (docs/design.md §3.7).
#[derive(Debug, Default)]
pub(crate) struct ReqState {
    /// PSN of the next new packet.
    pub(crate) next_psn: Psn,
    /// Index in `sq` of the WQE being transmitted.
    pub(crate) send_next: usize,
    /// Bytes of that WQE already transmitted.
    pub(crate) send_offset: u32,
    /// Reads and atomics in flight (bounded by `max_rd_atomic`).
    pub(crate) rd_atomic_inflight: u32,
    /// Transport retries left for the current timeout episode.
    pub(crate) retry_left: u8,
    /// RNR retries left.
    pub(crate) rnr_left: u8,
    /// Waiting out an RNR NAK until this time.
    pub(crate) rnr_wait: Option<Nanos>,
    /// Retransmission deadline while requests are unacknowledged.
    pub(crate) retrans_at: Option<Nanos>,
    /// The last PSN acknowledged.
    pub(crate) acked_psn: Psn,
    /// The PSN the last NAK-sequence-error rewound to, and `acked_psn`
    /// then: the same NAK again before any progress is a copy (the
    /// responder NAKs a gap once), and acting on it would put a second
    /// go-back-N burst on the link behind the first.
    pub(crate) last_nak: Option<(Psn, Psn)>,
    /// Packets sent since the last one that asked for an ACK.
    pub(crate) unasked_pkts: u32,
    /// WQEs whose last packet went without asking since the last ask.
    pub(crate) unasked_wqes: u32,
    /// A go-back-N resend under way whose earlier copies may still be on
    /// the link ([`GoBack`]).
    pub(crate) go_back: Option<GoBack>,
    /// The responder announced selective repeat (`recovery`).
    pub(crate) peer_sr: bool,
    /// Round-trip estimate and probe, between soft devices (`recovery`).
    pub(crate) rtt: Option<Box<super::recovery::Rtt>>,
}

/// Go-back-N in flight (docs/design.md §3.7): the requester went back to `from`,
/// and the copies of `from..end` it sent before may still be on the link
/// (the responder drops them after its one NAK). The window
/// (`max_inflight_packets`, `requester::window_room`) counts packets by
/// transmission: those copies as well as the resends, so a rewind resends
/// only what the acknowledgements freed instead of putting another
/// window's worth of packets behind the copies. Counting PSNs from the
/// oldest unacknowledged one let every NAK add up to a window to the link
/// queue, until an atomic queued behind ran out of retries (congestion
/// collapse; sim_regressions, go_back_n_does_not_flood_the_link_with_copies).
/// The packet at `from`, which the responder waits for, always goes. The
/// copies count until `from` is acknowledged (the ACK left the responder
/// after the resent packet arrived, so the copies sent before it are gone
/// from the link) or a retransmission timeout declares them lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GoBack {
    /// The first PSN resent.
    pub(crate) from: Psn,
    /// The PSN after the furthest packet sent before going back.
    pub(crate) end: Psn,
}

/// A saved read or atomic for duplicate replay (responder side).
#[derive(Debug, Clone)]
pub(crate) enum RdAtomicRes {
    Read {
        first_psn: Psn,
        npkts: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A multi-packet message being received.
#[derive(Debug)]
pub(crate) struct RecvProgress {
    pub(crate) wqe: RecvWqe,
    pub(crate) offset: u64,
}

/// A multi-packet write being placed.
#[derive(Debug, Clone)]
pub(crate) struct WriteProgress {
    pub(crate) rkey: u32,
    pub(crate) va: u64,
    pub(crate) remaining: u64,
    /// The message's DMA length (reported by a write with immediate).
    pub(crate) total: u32,
}

#[derive(Debug, Default)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub(crate) epsn: Psn,
    /// Message sequence number (completed messages, 24 bits).
    pub(crate) msn: u32,
    pub(crate) recv: Option<RecvProgress>,
    pub(crate) write: Option<WriteProgress>,
    /// Saved reads/atomics, oldest first, at most `max_dest_rd_atomic`.
    pub(crate) rd_atomic: VecDeque<RdAtomicRes>,
    /// A sequence-error NAK was sent and not yet resolved (send it once).
    pub(crate) nak_sent: bool,
    /// The requester announced selective repeat (`recovery`).
    pub(crate) peer_sr: bool,
    /// When the NAK of the current gap is due (reordering window).
    pub(crate) nak_deadline: Option<Nanos>,
    /// The PSN of the last RNR NAK: while it is the expected PSN, the gap
    /// behind it is no loss (the packet came and waits for a receive; the
    /// requester retries when its RNR timer ends), so no SACK lists it.
    pub(crate) rnr_at: Option<Psn>,
    /// Out-of-order packets held for replay (`recovery`), from the first gap.
    pub(crate) ooo: Option<Box<super::recovery::Reorder>>,
    /// Whether the first packet (COMM_EST) was seen.
    pub(crate) established: bool,
}

#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdId,
    pub(crate) send_cq: CqId,
    pub(crate) recv_cq: CqId,
    pub(crate) srq: Option<SrqId>,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: QpCap,
    pub(crate) owner: u32,
    pub(crate) attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) req: ReqState,
    pub(crate) resp: RespState,
    pub(crate) timer: Option<Nanos>,
    /// Spare SGE vectors, recycled to keep posting allocation-free: as
    /// many as both queues can hold (an application that signals every
    /// 100th send has 100 WQEs retire at once, and a smaller pool freed
    /// most of them only to allocate them again).
    pub(crate) spare: Vec<Vec<SgeRaw>>,
    /// Spare buffers for inline data, likewise (as many as the send queue
    /// holds).
    pub(crate) spare_inline: Vec<Vec<u8>>,
    /// The link's hint for this QP's datagrams ([`super::LinkHint`]).
    pub(crate) link_hint: super::LinkHint,
}

impl Qp {
    pub(crate) fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    pub(crate) fn take_vec(&mut self) -> Vec<SgeRaw> {
        self.spare.pop().unwrap_or_default()
    }

    pub(crate) fn recycle(&mut self, mut v: Vec<SgeRaw>) {
        if self.spare.len() < (self.cap.max_send_wr + self.cap.max_recv_wr) as usize {
            v.clear();
            self.spare.push(v);
        }
    }

    /// An empty buffer for `len` bytes of inline data.
    pub(crate) fn take_inline(&mut self, len: usize) -> Vec<u8> {
        match self.spare_inline.pop() {
            Some(mut b) => {
                b.reserve(len);
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps the inline buffer of a retired WQE for the next inline post.
    pub(crate) fn recycle_inline(&mut self, b: Option<Vec<u8>>) {
        if let Some(mut b) = b {
            if self.spare_inline.len() < self.cap.max_send_wr as usize {
                b.clear();
                self.spare_inline.push(b);
            }
        }
    }
}

#[cold]
pub(crate) fn post_err(
    index: usize,
    verb: Verb,
    kind: ErrorKind,
    detail: impl Into<std::borrow::Cow<'static, str>>,
) -> PostError {
    PostError {
        index,
        error: Error::new(verb, kind, detail),
    }
}

impl Core {
    /// `ibv_create_qp`: returns the QP number and the granted capacities.
    ///
    /// # Errors
    ///
    /// `EINVAL` for unknown PD/CQ/SRQ or capacities above the device limits;
    /// `ENOMEM` at `max_qp`.
    pub fn create_qp(&mut self, c: &QpCreate) -> Result<(u32, QpCap)> {
        self.live(crate::verbs::Verb::CreateQp)?;
        self.check_pd(Verb::CreateQp, c.pd)?;
        if self.cqs.get(c.send_cq.0).is_none() || self.cqs.get(c.recv_cq.0).is_none() {
            return Err(verr!(CreateQp, InvalidArgument, "unknown or destroyed CQ"));
        }
        if let Some(s) = c.srq {
            if self.srqs.get(s.0).is_none() {
                return Err(verr!(CreateQp, InvalidArgument, "unknown or destroyed SRQ"));
            }
        }
        let a = &self.cfg.attr;
        let cap = c.cap;
        if cap.max_send_wr > a.max_qp_wr || cap.max_recv_wr > a.max_qp_wr {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "queue depth above max_qp_wr {}",
                a.max_qp_wr
            ));
        }
        if cap.max_send_sge > a.max_sge || cap.max_recv_sge > a.max_sge {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "SGE count above max_sge {}",
                a.max_sge
            ));
        }
        if cap.max_inline_data > a.max_inline_data {
            return Err(verr!(
                CreateQp,
                InvalidArgument,
                "inline size above {}",
                a.max_inline_data
            ));
        }
        if c.qp_type == QpType::Ud && c.srq.is_none() && cap.max_recv_wr == 0 && cap.max_send_wr == 0 {
            return Err(verr!(CreateQp, InvalidArgument, "a QP needs a send or receive queue"));
        }
        if self.qps.live() >= a.max_qp {
            return Err(verr!(CreateQp, NoMemory, "device limit of {} QPs reached", a.max_qp));
        }
        // Grant at least what was asked (ibv_create_qp(3)); at least one SGE
        // per queue so a granted queue is usable.
        let granted = QpCap {
            max_send_wr: cap.max_send_wr.max(1),
            max_recv_wr: if c.srq.is_some() { 0 } else { cap.max_recv_wr.max(1) },
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: if c.srq.is_some() { 0 } else { cap.max_recv_sge.max(1) },
            max_inline_data: cap.max_inline_data,
        };
        for cq in [c.send_cq, c.recv_cq] {
            if let Some(cq) = self.cqs.get_mut(cq.0) {
                cq.users += 1;
            }
        }
        if let Some(s) = c.srq.and_then(|s| self.srqs.get_mut(s.0)) {
            s.users += 1;
        }
        let attr = QpAttr {
            cap: granted,
            // UD has no path MTU attribute: its messages fit one packet of
            // the port's active MTU, as on hardware and rxe (rxe_req.c
            // get_mtu()). (Conformance: data.ud.send.port_mtu.)
            path_mtu: if c.qp_type == QpType::Ud {
                self.cfg.port.active_mtu
            } else {
                QpAttr::default().path_mtu
            },
            ..QpAttr::default()
        };
        let qp = Box::new(Qp {
            qpn: 0,
            qp_type: c.qp_type,
            pd: c.pd,
            send_cq: c.send_cq,
            recv_cq: c.recv_cq,
            srq: c.srq,
            sq_sig_all: c.sq_sig_all,
            cap: granted,
            owner: c.owner,
            attr,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: ReqState::default(),
            resp: RespState::default(),
            timer: None,
            spare: Vec::new(),
            spare_inline: Vec::new(),
            link_hint: super::LinkHint::default(),
        });
        let id = self.qps.insert(qp);
        let qpn = id + QPN_BASE;
        if let Some(q) = self.qps.get_mut(id) {
            q.qpn = qpn;
        }
        Ok((qpn, granted))
    }

    /// `ibv_destroy_qp`. Outstanding work is discarded without completions,
    /// as hardware does.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an unknown QP.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        if self.revoked && self.qp_info(qpn).is_none() {
            // Destroy after removal always succeeds (docs/design.md §5).
            return Ok(());
        }
        let mut qp = self
            .take_qp(qpn)
            .ok_or_else(|| verr!(DestroyQp, InvalidArgument, "no QP {qpn:#x}"))?;
        self.set_timer(&mut qp, None);
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(cq) = self.cqs.get_mut(cq.0) {
                cq.users = cq.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq.and_then(|s| self.srqs.get_mut(s.0)) {
            s.users = s.users.saturating_sub(1);
        }
        // Taken above: free its number (and its count against max_qp).
        self.qps.free_taken(qpn - QPN_BASE);
        Ok(())
    }

    fn modify_limits(&self, qp: &Qp) -> ModifyLimits {
        let mut populated = [0u64; 4];
        for (i, g) in self.cfg.gids.iter().enumerate().take(256) {
            if !g.is_zero() {
                populated[i / 64] |= 1 << (i % 64);
            }
        }
        ModifyLimits {
            phys_port_cnt: self.cfg.attr.phys_port_cnt,
            link_layer: self.cfg.port.link_layer,
            pkey_tbl_len: self.cfg.port.pkey_tbl_len,
            max_mtu: self.cfg.port.max_mtu,
            max_qp_rd_atom: self.cfg.attr.max_qp_rd_atom,
            max_qp_init_rd_atom: self.cfg.attr.max_qp_init_rd_atom,
            gid_tbl_len: self.cfg.port.gid_tbl_len,
            populated_gids: populated,
            qp_port: (qp.attr.port_num != 0).then_some(qp.attr.port_num),
            // The soft provider has no privilege model; a controlled Q_Key
            // is allowed.
            privileged_qkey: true,
        }
    }

    /// `ibv_modify_qp`: check-then-apply (an invalid modify changes nothing).
    ///
    /// # Errors
    ///
    /// `EINVAL` as [`qp_state::check_modify`] says, or for an unknown QP.
    pub fn modify_qp(&mut self, now: Nanos, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.live(crate::verbs::Verb::ModifyQp)?;
        let mut qp = self
            .take_qp(qpn)
            .ok_or_else(|| verr!(ModifyQp, InvalidArgument, "no QP {qpn:#x}"))?;
        let limits = self.modify_limits(&qp);
        let checked = qp_state::check_modify(qp.qp_type, qp.state(), attr, mask, &limits).and_then(|to| {
            if mask.contains(QpAttrMask::AV) {
                self.check_av(&attr.ah_attr)?;
            }
            Ok(to)
        });
        let to = match checked {
            Ok(to) => to,
            Err(e) => {
                self.put_qp(qp);
                return Err(e);
            }
        };
        let from = qp.state();
        qp_state::apply_modify(&mut qp.attr, attr, mask, to);
        qp.attr.cap = qp.cap;
        if qp.qp_type == QpType::Ud {
            // Keep the UD message limit at the port MTU (see create_qp).
            qp.attr.path_mtu = self.cfg.port.active_mtu;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            qp.resp.epsn = Psn::new(attr.rq_psn);
            Core::reset_reorder(&mut qp);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            qp.req.next_psn = Psn::new(attr.sq_psn);
            qp.req.acked_psn = Psn::new(attr.sq_psn).wrapping_sub(1);
            qp.req.go_back = None;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            qp.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            qp.req.rnr_left = attr.rnr_retry;
        }
        match to {
            QpState::Reset if from != QpState::Reset => self.reset_qp(&mut qp),
            QpState::Err if from != QpState::Err => self.flush_qp(&mut qp),
            QpState::Rts => {
                // Posted sends may be waiting for RTS (or for SQD to end).
                self.put_qp(qp);
                self.run_requester(now, qpn);
                return Ok(());
            }
            QpState::Sqd if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) && attr.en_sqd_async_notify => {
                // The send queue drains: nothing new starts. With nothing in
                // flight the drain is complete at once.
                qp.attr.sq_draining = qp.sq.iter().any(|w| w.state == WqeState::Sent);
                if !qp.attr.sq_draining {
                    self.qp_event(&qp, EventType::SqDrained);
                }
            }
            _ => {}
        }
        self.put_qp(qp);
        Ok(())
    }

    /// `ibv_query_qp`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for an unknown QP.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr> {
        let qp = qpn
            .checked_sub(QPN_BASE)
            .and_then(|id| self.qps.get(id))
            .ok_or_else(|| verr!(QueryQp, InvalidArgument, "no QP {qpn:#x}"))?;
        let mut a = qp.attr;
        a.cur_qp_state = a.qp_state;
        a.sq_psn = qp.req.next_psn.value();
        a.rq_psn = qp.resp.epsn.value();
        Ok(a)
    }

    /// Capacities and type of a QP.
    pub fn qp_info(&self, qpn: u32) -> Option<(QpType, QpCap)> {
        let qp = self.qps.get(qpn.checked_sub(QPN_BASE)?)?;
        Some((qp.qp_type, qp.cap))
    }

    fn reset_qp(&mut self, qp: &mut Qp) {
        // RESET discards outstanding work without completions (IBTA 10.3.1).
        self.set_timer(qp, None);
        let cap = qp.cap;
        qp.sq.clear();
        qp.rq.clear();
        qp.req = ReqState::default();
        qp.resp = RespState::default();
        qp.attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
    }

    /// Moves a QP to ERR and completes everything outstanding with
    /// WR_FLUSH_ERR: send queue first, then receive queue, each in post
    /// order (docs/design.md §3.4).
    pub(crate) fn flush_qp(&mut self, qp: &mut Qp) {
        qp.attr.qp_state = QpState::Err;
        qp.attr.cur_qp_state = QpState::Err;
        self.flush_sq(qp);
        if let Some(p) = qp.resp.recv.take() {
            // A partially received message goes back to the front so it is
            // flushed in post order.
            qp.rq.push_front(p.wqe);
        }
        qp.resp.write = None;
        while let Some(r) = qp.rq.pop_front() {
            let wc = WorkCompletion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: qp.qpn,
                ..WorkCompletion::default()
            };
            self.push_cqe(qp.recv_cq, wc, false);
            qp.recycle(r.sgl);
        }
        if qp.srq.is_some() {
            self.qp_event(qp, EventType::QpLastWqeReached);
        }
    }

    /// Completes every WQE of the send queue with WR_FLUSH_ERR, in post
    /// order, and stops the requester (no timer, nothing in flight). The
    /// receive queue and the QP's state are left alone: ERR flushes the
    /// receive queue after this, SQE keeps receiving.
    pub(crate) fn flush_sq(&mut self, qp: &mut Qp) {
        self.set_timer(qp, None);
        qp.req.rnr_wait = None;
        while let Some(w) = qp.sq.pop_front() {
            let wc = WorkCompletion {
                wr_id: w.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: w.op.wc_opcode(),
                qp_num: qp.qpn,
                ..WorkCompletion::default()
            };
            self.push_cqe(qp.send_cq, wc, false);
            qp.recycle(w.sgl);
        }
        qp.req.send_next = 0;
        qp.req.send_offset = 0;
        qp.req.rd_atomic_inflight = 0;
        qp.req.retrans_at = None;
    }

    /// Completes the WQE at the front of the send queue with an error and
    /// takes the QP where that error leads (IBTA 10.3.1):
    ///
    /// - RC: to ERR, everything outstanding flushing (send queue, then
    ///   receive queue);
    /// - UC and UD: to SQE (Send Queue Error). Only the send queue flushes;
    ///   the receive queue keeps receiving, sends posted while in SQE
    ///   complete with WR_FLUSH_ERR, and a modify SQE→RTS resumes sending.
    ///   The next message takes the PSN after the last packet sent, so a
    ///   UC responder that saw part of the failed message drops that part
    ///   when the next message starts. No async event is raised: the
    ///   error completion is the report (IBTA defines no affiliated event
    ///   for SQE).
    pub(crate) fn complete_send_error(&mut self, qp: &mut Qp, status: WcStatus, vendor_err: u32) {
        let resume_psn = super::requester::next_packet_psn(qp);
        if let Some(w) = qp.sq.pop_front() {
            let wc = WorkCompletion {
                wr_id: w.wr_id,
                status,
                opcode: w.op.wc_opcode(),
                vendor_err,
                qp_num: qp.qpn,
                ..WorkCompletion::default()
            };
            self.push_cqe(qp.send_cq, wc, false);
            qp.recycle(w.sgl);
        }
        match qp.qp_type {
            QpType::Rc => self.flush_qp(qp),
            QpType::Uc | QpType::Ud => {
                qp.attr.qp_state = QpState::Sqe;
                qp.attr.cur_qp_state = QpState::Sqe;
                qp.req.next_psn = resume_psn;
                self.flush_sq(qp);
            }
        }
    }
}

impl Core {
    pub(crate) fn take_qp(&mut self, qpn: u32) -> Option<Box<Qp>> {
        self.qps.take(qpn.checked_sub(QPN_BASE)?)
    }

    pub(crate) fn put_qp(&mut self, qp: Box<Qp>) {
        let id = qp.qpn - QPN_BASE;
        self.qps.put(id, qp);
    }
}
