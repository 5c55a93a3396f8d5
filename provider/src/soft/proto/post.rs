//! Posting (docs/design.md §3.3): `post_send`, `post_recv` and the type 1
//! window bind, which all queue WQEs after checking them; a bad WR is
//! reported back and nothing after it is posted.

use crate::soft::wire::Psn;
use crate::verbs::{ErrorKind, PostError, QpState, QpType, RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Verb};

use crate::verbs::wr_check::{check_send_wr, SendLimits, SendWrFault};

use super::mr::MrTable;
use super::qp::{post_err, LocalOp, Qp, RecvWqe, SendWqe, SgeRaw, UdTarget, WqeOp, WqeState};
use super::{Core, Egress, Nanos, QPN_BASE};

impl Core {
    /// `ibv_post_send`.
    ///
    /// # Errors
    ///
    /// The first rejected WR: `EINVAL` (state before RTS, opcode not valid
    /// for the QP type, too many SGEs, inline too large or on an opcode
    /// without payload, misaligned atomic, inline-only SGE without INLINE,
    /// missing UD destination), `ENOMEM` (queue full).
    #[inline]
    pub fn post_send(&mut self, now: Nanos, qpn: u32, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.post_send_eager(now, qpn, wrs, None)
    }

    /// [`Core::post_send`], with an [`Egress`]: the packet of a WR that
    /// the send fast path takes goes to `egress`, in pieces, as soon as its
    /// headers are built if nothing waits in the transmit queue before it
    /// (so that datagrams leave in the order the engine made them) and the
    /// engine computes no ICRC; the rest of the verb (for a lone WR even
    /// building its WQE, then the retransmission timer, putting the QP
    /// back) runs after it left. A packet `egress` refuses is built and
    /// queued as without it.
    ///
    /// # Errors
    ///
    /// As [`Core::post_send`].
    pub fn post_send_eager(
        &mut self,
        now: Nanos,
        qpn: u32,
        wrs: &[SendWr<'_>],
        egress: Option<Egress<'_>>,
    ) -> std::result::Result<(), PostError> {
        let Some(mut qp) = self.take_qp(qpn) else {
            return Err(post_err(0, Verb::PostSend, ErrorKind::InvalidArgument, "no such QP"));
        };
        let mut egress = egress;
        // A lone WR the send fast path takes leaves before its WQE is built.
        if let ([wr], Some(send)) = (wrs, egress.as_mut()) {
            if self.cfg.fast_paths && self.fast_post_direct(&mut qp, now, wr, &mut **send) {
                self.put_qp(qp);
                return Ok(());
            }
        }
        let r = self.post_send_inner::<false>(&mut qp, wrs);
        // The requester runs on the QP already taken out (`run_requester`
        // would put it back and take it again); a lone one-packet inline
        // SEND or WRITE goes by the fast path (`fast.rs`).
        if qp.state() == QpState::Rts && !(self.cfg.fast_paths && self.fast_send_wqe(&mut qp, now, egress)) {
            self.requester(&mut qp, now);
        }
        self.put_qp(qp);
        r
    }

    /// `ibv_post_send` of a batch that is posted whole or not at all, as
    /// `ibv_wr_complete` posts what was built since `ibv_wr_start`: every
    /// WR is checked as [`Core::post_send`] checks it (the send queue's
    /// room counting the batch's earlier WRs) before any reaches the
    /// requester, and if one is refused, none does.
    ///
    /// # Errors
    ///
    /// As [`Core::post_send`]: the index of the first refused WR, and why;
    /// nothing was posted.
    pub fn post_send_all(&mut self, now: Nanos, qpn: u32, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let Some(mut qp) = self.take_qp(qpn) else {
            return Err(post_err(0, Verb::PostSend, ErrorKind::InvalidArgument, "no such QP"));
        };
        // Queued, not yet run: nothing of the batch reached the requester,
        // and in ERR or SQE the flush waits for the whole batch, so a
        // refusal takes back exactly what this call queued.
        let before = qp.sq.len();
        let r = self.post_send_inner::<true>(&mut qp, wrs);
        if r.is_err() {
            let undone: Vec<SendWqe> = qp.sq.drain(before..).collect();
            for w in undone {
                qp.recycle(w.sgl);
                qp.recycle_inline(w.inline);
            }
        } else {
            match qp.state() {
                QpState::Err => self.flush_qp(&mut qp),
                QpState::Sqe => self.flush_sq(&mut qp),
                QpState::Rts => self.requester(&mut qp, now),
                _ => {}
            }
        }
        self.put_qp(qp);
        r
    }

    /// Checks and queues `wrs` in order, stopping at the first refused one.
    /// In ERR or SQE each queued WR is flushed at once, unless `BATCH`
    /// ([`Core::post_send_all`] flushes after the whole batch).
    fn post_send_inner<const BATCH: bool>(
        &mut self,
        qp: &mut Qp,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), PostError> {
        for (i, wr) in wrs.iter().enumerate() {
            let f = match self.check_send_wr(qp, wr) {
                Ok(f) => f,
                Err(refusal) => return Err(refusal.post_err(i)),
            };
            let mut sgl = qp.take_vec();
            let inline_bytes = if f.inline {
                let mut data = qp.take_inline(f.length as usize);
                for s in wr.sg_list {
                    if !s.append_direct(&mut data) && !self.append_from_mr(s, &mut data) {
                        qp.recycle(sgl);
                        return Err(post_err(
                            i,
                            Verb::PostSend,
                            ErrorKind::InvalidArgument,
                            "inline SGE names an MR that is not valid",
                        ));
                    }
                }
                Some(data)
            } else {
                sgl.extend(wr.sg_list.iter().map(SgeRaw::of));
                None
            };
            qp.sq.push_back(f.into_wqe(sgl, inline_bytes));
            if !BATCH {
                match qp.state() {
                    // Posting to a QP in ERR succeeds and flushes (docs/design.md §3.3).
                    QpState::Err => self.flush_qp(qp),
                    // In SQE the send queue flushes and nothing is sent until
                    // SQE→RTS; the receive queue is untouched (IBTA 10.3.1).
                    QpState::Sqe => self.flush_sq(qp),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Every check `ibv_post_send` makes of `wr` on `qp` before queueing
    /// it, in the order their failures are reported: the QP's state, the
    /// rules every backend keeps ([`check_send_wr`]), the memory work
    /// requests' own, a UD message's MTU and the send queue's room. The
    /// fields of the WQE it makes, or why it is refused. The general path
    /// and the send fast path both post through it.
    #[inline]
    pub(super) fn check_send_wr<'a>(
        &self,
        qp: &Qp,
        wr: &SendWr<'a>,
    ) -> std::result::Result<WqeFields, SendRefusal<'a>> {
        let state = qp.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(SendRefusal::State(state));
        }
        let limits = SendLimits {
            qp_type: qp.qp_type,
            max_send_sge: qp.cap.max_send_sge,
            max_inline_data: qp.cap.max_inline_data,
            max_msg_sz: Some(self.cfg.port.max_msg_sz),
        };
        let length = check_send_wr(wr, &limits).map_err(SendRefusal::Rule)?;
        let (op, remote, imm, compare, swap_add) = wqe_fields(wr.op);
        let local = match wr.op {
            SendOp::LocalInv { key } => Some(LocalOp::Inv { key }),
            SendOp::RegMr { mr, key, access } => {
                if (key >> 8) != (mr.lkey() >> 8) {
                    return Err(SendRefusal::RegMrKey);
                }
                Some(LocalOp::Reg { mr_key: key, access })
            }
            SendOp::BindMw { mw, rkey, bind } => {
                if mw.mw_type() != crate::verbs::MwType::Type2 {
                    return Err(SendRefusal::BindType1);
                }
                Some(LocalOp::Bind {
                    mw_key: mw.rkey(),
                    new_key: rkey,
                    mr_key: bind.mr.lkey(),
                    addr: bind.addr,
                    len: bind.length,
                    access: bind.access,
                    type1: false,
                })
            }
            _ => None,
        };
        let ud = match wr.ud {
            Some(d) if qp.qp_type == QpType::Ud => {
                if length > qp.mtu() {
                    return Err(SendRefusal::UdOverMtu(length, qp.mtu()));
                }
                let av = d.ah.attr();
                Some(UdTarget {
                    dst: av.grh.dgid.to_ip(),
                    sgid_index: av.grh.sgid_index,
                    qpn: d.remote_qpn & 0x00ff_ffff,
                    // IBTA 10.2.5: a Q_Key with the high bit set means "use
                    // the QP's own".
                    qkey: if d.remote_qkey & 0x8000_0000 != 0 {
                        qp.attr.qkey
                    } else {
                        d.remote_qkey
                    },
                })
            }
            _ => None,
        };
        if qp.sq.len() >= qp.cap.max_send_wr as usize {
            return Err(SendRefusal::Full(qp.cap.max_send_wr));
        }
        let flags = wr.send_flags;
        Ok(WqeFields {
            wr_id: wr.wr_id,
            op,
            remote,
            imm,
            compare,
            swap_add,
            length,
            inline: flags.contains(SendFlags::INLINE),
            signaled: qp.sq_sig_all || flags.contains(SendFlags::SIGNALED),
            fence: flags.contains(SendFlags::FENCE) || op == WqeOp::LocalInv,
            solicited: flags.contains(SendFlags::SOLICITED),
            ud,
            local,
        })
    }

    /// `ibv_post_recv`.
    ///
    /// # Errors
    ///
    /// The first rejected WR: `EINVAL` in RESET, with an SRQ, or with too
    /// many SGEs; `ENOMEM` when the receive queue is full.
    pub fn post_recv(&mut self, qpn: u32, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        // A lone WR that needs nothing but queueing goes in as it is; the
        // rest (and every refusal) by the general path.
        if let [wr] = wrs {
            if self.post_recv_one(qpn, wr) {
                return Ok(());
            }
        }
        self.post_recv_general(qpn, wrs)
    }

    /// [`Core::post_recv`] without the lone WR's short way: for a caller
    /// that tried [`Core::post_recv_one`] already.
    pub fn post_recv_general(&mut self, qpn: u32, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let Some(mut qp) = self.take_qp(qpn) else {
            return Err(post_err(0, Verb::PostRecv, ErrorKind::InvalidArgument, "no such QP"));
        };
        let r = self.post_recv_inner(&mut qp, wrs);
        self.put_qp(qp);
        r
    }

    /// [`Core::post_recv`] of one WR that needs nothing but queueing: a
    /// QP without an SRQ, neither in RESET nor in ERR (where it flushes),
    /// with room, and a WR it takes (SGE count, no inline-only SGE).
    /// `false`: nothing was changed, and [`Core::post_recv`] posts the WR
    /// or reports why not. A ping-pong posts a receive after each poll, on
    /// the way to its answer: without the QP taken out and put back, the
    /// loop and its checks per WR, this is ~40 % fewer instructions.
    #[inline]
    pub fn post_recv_one(&mut self, qpn: u32, wr: &RecvWr<'_>) -> bool {
        let Some(qp) = qpn.checked_sub(QPN_BASE).and_then(|id| self.qps.get_mut(id)) else {
            return false;
        };
        if qp.state() == QpState::Err || recv_refusal(qp, wr).is_some() {
            return false;
        }
        let mut sgl = qp.take_vec();
        let wqe = match wr.sg_list {
            // The usual receive, built in place (`RecvWqe::new` is a call
            // and a loop).
            [s] => {
                sgl.push(SgeRaw::of(s));
                RecvWqe {
                    wr_id: wr.wr_id,
                    sgl,
                    length: u64::from(s.length()),
                }
            }
            _ => RecvWqe::new(wr, sgl),
        };
        qp.rq.push_back(wqe);
        true
    }

    fn post_recv_inner(&mut self, qp: &mut Qp, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        for (i, wr) in wrs.iter().enumerate() {
            if let Some(refusal) = recv_refusal(qp, wr) {
                return Err(refusal.post_err(i, qp, wr));
            }
            let sgl = qp.take_vec();
            qp.rq.push_back(RecvWqe::new(wr, sgl));
            if qp.state() == QpState::Err {
                self.flush_qp(qp);
            }
        }
        Ok(())
    }
}

/// What a send WR that passed [`Core::check_send_wr`] puts in its WQE.
#[derive(Debug)]
pub(super) struct WqeFields {
    pub(super) wr_id: u64,
    pub(super) op: WqeOp,
    pub(super) remote: RemoteAddr,
    /// The immediate data, the rkey to invalidate or the key of a LOCAL_INV.
    pub(super) imm: u32,
    pub(super) compare: u64,
    pub(super) swap_add: u64,
    /// The message's length in bytes.
    pub(super) length: u32,
    /// Posted INLINE: the WQE carries a copy of the bytes.
    pub(super) inline: bool,
    pub(super) signaled: bool,
    pub(super) fence: bool,
    pub(super) solicited: bool,
    pub(super) ud: Option<UdTarget>,
    pub(super) local: Option<LocalOp>,
}

impl WqeFields {
    /// The WQE, waiting for the requester, with its scatter list or inline
    /// bytes.
    #[inline]
    pub(super) fn into_wqe(self, sgl: Vec<SgeRaw>, inline: Option<Vec<u8>>) -> SendWqe {
        SendWqe {
            wr_id: self.wr_id,
            op: self.op,
            remote: self.remote,
            imm: self.imm,
            compare: self.compare,
            swap_add: self.swap_add,
            sgl,
            inline,
            length: self.length,
            signaled: self.signaled,
            fence: self.fence,
            solicited: self.solicited,
            ud: self.ud,
            local: self.local,
            state: WqeState::Pending,
            first_psn: Psn::new(0),
            npkts: 0,
            resp_pkts: 0,
        }
    }
}

/// Why [`Core::check_send_wr`] refuses a send WR.
#[derive(Debug, Clone, Copy)]
pub(super) enum SendRefusal<'a> {
    /// The QP is in RESET, INIT or RTR.
    State(QpState),
    /// A rule every backend keeps.
    Rule(SendWrFault<'a>),
    /// A REG_MR that changes more than the key byte.
    RegMrKey,
    /// A BIND_MW work request for a type 1 window.
    BindType1,
    /// A UD message longer than the path MTU: (length, MTU).
    UdOverMtu(u32, u32),
    /// The send queue holds `max_send_wr` WRs.
    Full(u32),
}

impl SendRefusal<'_> {
    /// The error `ibv_post_send` reports for WR `index`.
    #[cold]
    pub(super) fn post_err(self, index: usize) -> PostError {
        let (kind, detail): (ErrorKind, std::borrow::Cow<'static, str>) = match self {
            SendRefusal::State(state) => (
                ErrorKind::InvalidArgument,
                format!("post_send in {state}: the QP must be in RTS").into(),
            ),
            SendRefusal::Rule(fault) => {
                return PostError {
                    index,
                    error: fault.error(),
                }
            }
            SendRefusal::RegMrKey => (
                ErrorKind::InvalidArgument,
                "REG_MR may change only the key byte of the MR's key".into(),
            ),
            SendRefusal::BindType1 => (
                ErrorKind::InvalidArgument,
                "BIND_MW work requests bind type 2 windows; use Qp::bind_mw for type 1".into(),
            ),
            SendRefusal::UdOverMtu(length, mtu) => (
                ErrorKind::InvalidArgument,
                format!("UD message of {length} bytes exceeds the path MTU {mtu}").into(),
            ),
            SendRefusal::Full(max) => (ErrorKind::NoMemory, format!("send queue full ({max} WRs)").into()),
        };
        post_err(index, Verb::PostSend, kind, detail)
    }
}

/// Why a receive WR cannot be queued on a QP as it stands (the checks of
/// `ibv_post_recv`, in the order they are reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvRefusal {
    Srq,
    Reset,
    TooManySges,
    InlineSge,
    Full,
}

/// The first check `wr` fails on `qp`, if any (a QP in ERR takes the WR,
/// and flushes it).
#[inline]
fn recv_refusal(qp: &Qp, wr: &RecvWr<'_>) -> Option<RecvRefusal> {
    if qp.srq.is_some() {
        Some(RecvRefusal::Srq)
    } else if qp.state() == QpState::Reset {
        Some(RecvRefusal::Reset)
    } else if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
        Some(RecvRefusal::TooManySges)
    } else if wr.sg_list.iter().any(|s| s.is_inline_only()) {
        Some(RecvRefusal::InlineSge)
    } else if qp.rq.len() >= qp.cap.max_recv_wr as usize {
        Some(RecvRefusal::Full)
    } else {
        None
    }
}

impl RecvRefusal {
    /// The error `ibv_post_recv` reports for WR `index`.
    #[cold]
    fn post_err(self, index: usize, qp: &Qp, wr: &RecvWr<'_>) -> PostError {
        let (kind, detail): (ErrorKind, std::borrow::Cow<'static, str>) = match self {
            RecvRefusal::Srq => (ErrorKind::InvalidArgument, "this QP receives through its SRQ".into()),
            RecvRefusal::Reset => (ErrorKind::InvalidArgument, "post_recv in RESET".into()),
            RecvRefusal::TooManySges => (
                ErrorKind::InvalidArgument,
                format!("{} SGEs exceed max_recv_sge {}", wr.sg_list.len(), qp.cap.max_recv_sge).into(),
            ),
            RecvRefusal::InlineSge => (
                ErrorKind::InvalidArgument,
                "a receive cannot use an inline-only SGE".into(),
            ),
            RecvRefusal::Full => (
                ErrorKind::NoMemory,
                format!("receive queue full ({} WRs)", qp.cap.max_recv_wr).into(),
            ),
        };
        post_err(index, Verb::PostRecv, kind, detail)
    }
}

impl Core {
    /// Reads an MR-made SGE's bytes through the MR table (inline sends: the
    /// lkey is not access-checked, as with ibverbs' INLINE).
    pub(super) fn append_from_mr(&self, s: &crate::verbs::Sge<'_>, dst: &mut Vec<u8>) -> bool {
        if s.length() == 0 {
            return true;
        }
        if self
            .mrs
            .read_plain(s.lkey(), s.addr(), u64::from(s.length()), dst)
            .is_some()
        {
            return true;
        }
        let Some(e) = self.mrs.get(s.lkey()) else { return false };
        let Ok(r) = MrTable::resolve(e, s.addr(), u64::from(s.length())) else {
            return false;
        };
        // Appended in place: resizing first zeroed the bytes the copy
        // then overwrote (a `memset` call per inline send).
        r.append_to(s.length() as usize, dst).is_ok()
    }
}

/// The WQE's operation and the operation's fields a send WR carries:
/// `(op, remote, imm, compare, swap_add)`, `imm` being the immediate data,
/// the rkey to invalidate or the key of a LOCAL_INV.
fn wqe_fields(op: SendOp<'_>) -> (WqeOp, RemoteAddr, u32, u64, u64) {
    match op {
        SendOp::Send => (WqeOp::Send, RemoteAddr::default(), 0, 0, 0),
        SendOp::SendWithImm { imm } => (WqeOp::SendImm, RemoteAddr::default(), imm, 0, 0),
        SendOp::SendWithInv { rkey } => (WqeOp::SendInv, RemoteAddr::default(), rkey, 0, 0),
        SendOp::Write { remote } => (WqeOp::Write, remote, 0, 0, 0),
        SendOp::WriteWithImm { remote, imm } => (WqeOp::WriteImm, remote, imm, 0, 0),
        SendOp::Read { remote } => (WqeOp::Read, remote, 0, 0, 0),
        SendOp::CompareSwap { remote, compare, swap } => (WqeOp::CompSwap, remote, 0, compare, swap),
        SendOp::FetchAdd { remote, add } => (WqeOp::FetchAdd, remote, 0, 0, add),
        SendOp::LocalInv { key } => (WqeOp::LocalInv, RemoteAddr::default(), key, 0, 0),
        SendOp::RegMr { .. } => (WqeOp::RegMr, RemoteAddr::default(), 0, 0, 0),
        SendOp::BindMw { .. } => (WqeOp::BindMw, RemoteAddr::default(), 0, 0, 0),
    }
}
